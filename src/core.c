/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core.c: the engine handle's core (core.h): its message, poison, keys,
 * names, and the lease calls of the lookup and the publisher.
 *
 * Messages: a handle records its last failure in its own fixed buffer
 * (encache__fail never allocates, so no message is lost to an
 * out-of-memory condition).  A call without a handle (encache_open(),
 * encache_model_identity(), the fleet calls) records it in a thread-local
 * buffer, encache_errmsg(NULL).  These are the engine's two message
 * stores (docs/development.md, "Errors inside the library").
 */
#include "core.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int encache__fail(encache *ec, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ec->errmsg, sizeof(ec->errmsg), fmt, ap);
  va_end(ap);
  return rc;
}

int encache__poison(encache *ec, const char *fmt, ...) {
  if (!encache__is_poisoned(ec)) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(ec->errmsg, sizeof(ec->errmsg),
             "poisoned: %s; buffers the Store may still touch are kept, "
             "every call now fails: exit the process", msg);
    __atomic_store_n(&ec->poisoned, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&ec->live->poisoned, 1, __ATOMIC_RELAXED);
  }
  return ENCACHE_EPOISONED;
}

int encache__is_poisoned(const encache *ec) {
  return __atomic_load_n(&ec->poisoned, __ATOMIC_ACQUIRE);
}

/* The message of the calling thread's last failed encache_open() or
 * encache_model_identity() (the calls that have no handle). */
static _Thread_local char open_msg[512];

int encache__thread_failed(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(open_msg, sizeof(open_msg), fmt, ap);
  va_end(ap);
  return rc;
}

const char *encache_errmsg(const encache *ec) {
  return ec != NULL ? ec->errmsg : open_msg;
}

int encache_enabled(const encache *ec) { return ec != NULL && ec->enabled; }

const char *encache_namespace_of(const encache *ec) {
  return ec != NULL && ec->ns != NULL ? ec->ns : "";
}

uint64_t encache__hash_id(const char *id) {
  return encache__fnv1a(id, strlen(id));
}

char *encache__make_key(const encache *ec, const char *id) {
  int n = encache_key(ec->ns, id, NULL, 0);
  if (n < 0)
    return NULL;
  char *k = encache__malloc((size_t)n + 1);
  if (k != NULL && encache_key(ec->ns, id, k, (size_t)n + 1) < 0) {
    encache__free(k);
    return NULL;
  }
  return k;
}

const char *encache_outcome_name(int outcome) {
  static const char *const names[] = {"HIT",      "MISS",        "INCOMPATIBLE",
                                      "OVERSIZE", "UNAVAILABLE", "SKIPPED",
                                      "IN_FLIGHT"};
  return outcome >= 0 && outcome <= ENCACHE_IN_FLIGHT ? names[outcome]
                                                       : "UNKNOWN";
}

const char *encache_skip_name(int reason) {
  switch (reason) {
  case ENCACHE_QUEUED:
    return "queued";
#define ENCACHE_SKIP_CASE_(name, value, msg)                                 \
  case ENCACHE_SKIP_##name:                                                  \
    return msg;
    ENCACHE_SKIP_MAP(ENCACHE_SKIP_CASE_)
#undef ENCACHE_SKIP_CASE_
  default:
    return "unknown";
  }
}

void encache__count_unchecked(encache *ec) {
  uint64_t n, *c = &ec->live->hits_unchecked;
  if (!encache__store_profile_of(ec->store)->unchecked ||
      encache__store_control(ec->store, ENCACHE__CONTROL_UNCHECKED, &n) != 0)
    return;
  uint64_t was = __atomic_load_n(c, __ATOMIC_RELAXED);
  while (was < n && !__atomic_compare_exchange_n(c, &was, n, 1,
                                                 __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED))
    ;
}

uint64_t encache__lease_token(void) {
  static uint64_t counter; /* only when getrandom fails */
  uint64_t t = 0;
  while (t == 0) {
    if (getrandom(&t, sizeof(t), GRND_NONBLOCK) != (ssize_t)sizeof(t)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      t = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
          ((uint64_t)ts.tv_sec << 20) ^
          __atomic_add_fetch(&counter, 0x9E3779B97F4A7C15ull, __ATOMIC_RELAXED);
    }
  }
  return t;
}

void encache__lease_end(encache *ec, const char *key, uint64_t token) {
  if (token == 0 || ec->store == NULL || encache__is_poisoned(ec))
    return;
  int cls = encache_store_classify(
      encache_store_lease_drop(ec->store, key, token));
  if (cls != ENCACHE_ANSWER_OK && cls != ENCACHE_ANSWER_ABSENT)
    ENCACHE__COUNT(ec, leases_failed, 1); /* it ends at its deadline */
}

uint64_t encache__lease_slot_set(encache *ec, uint64_t *slot, uint64_t token) {
  uint64_t old = *slot;
  ec->leases_held += (token != 0) - (old != 0);
  *slot = token;
  return old;
}
