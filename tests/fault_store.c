/* SPDX-License-Identifier: Apache-2.0 */
#include "fault_store.h"

#include "runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A user's Store, made through the public backend interface; its data. */
typedef struct fault_store {
  encache_store_backend ops;
  encache_store *inner;
  fault_ctl *ctl;
} fault_store;

void fault_ctl_init(fault_ctl *ctl) {
  memset(ctl, 0, sizeof(*ctl));
  pthread_mutex_init(&ctl->mu, NULL);
  pthread_cond_init(&ctl->cv, NULL);
}

static fault_ctl *ctl_of(encache_store *st) {
  return ((fault_store *)encache_store_data(st))->ctl;
}
static encache_store *inner_of(encache_store *st) {
  return ((fault_store *)encache_store_data(st))->inner;
}

/* The inner Store's message becomes the wrapper's (messages are scoped to
 * the handle they are about). */
static int fwd(encache_store *st, int rc) {
  char msg[512];
  snprintf(msg, sizeof(msg), "%s", encache_store_errmsg(inner_of(st)));
  if (msg[0] != '\0')
    encache_store_fail(st, rc, "%s", msg);
  return rc;
}

static void count(fault_ctl *c, int *field) {
  pthread_mutex_lock(&c->mu);
  (*field)++;
  pthread_mutex_unlock(&c->mu);
}

/* Holds the calling read while c->hold_reads (fault_release_reads()). */
static void read_gate(fault_ctl *c) {
  pthread_mutex_lock(&c->mu);
  if (c->hold_reads) {
    c->reads_waiting++;
    pthread_cond_broadcast(&c->cv);
    while (c->hold_reads)
      pthread_cond_wait(&c->cv, &c->mu);
    c->reads_waiting--;
  }
  pthread_mutex_unlock(&c->mu);
}

static int f_exists(encache_store *st, const char *const *keys, size_t n,
                    int *results) {
  fault_ctl *c = ctl_of(st);
  count(c, &c->exists_calls);
  read_gate(c);
  if (c->exists_rc)
    return c->exists_rc;
  int rc = fwd(st, inner_of(st)->ops->exists(inner_of(st), keys, n, results));
  if (rc == 0 && c->exists_item)
    for (size_t i = 0; i < n; i++)
      results[i] = c->exists_item;
  pthread_mutex_lock(&c->mu);
  int absent = rc == 0 && c->exists_absent > 0;
  c->exists_absent -= absent;
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; absent && i < n; i++)
    results[i] = 0;
  return rc;
}

static int f_read(encache_store *st, const char *const *keys, size_t n,
                  void *const *bufs, const size_t *caps, int64_t *results) {
  fault_ctl *c = ctl_of(st);
  count(c, &c->read_calls);
  read_gate(c);
  if (c->read_rc)
    return c->read_rc;
  int rc = fwd(st, inner_of(st)->ops->read(inner_of(st), keys, n, bufs, caps,
                                           results));
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    switch (c->read_mode) {
    case READ_ITEM_CODE: results[i] = c->read_item_code; break;
    case READ_COUNT_ABOVE: results[i] = (int64_t)caps[i] + 1; break;
    case READ_SHORT: if (results[i] > 0) results[i]--; break;
    default: break;
    }
  }
  return 0;
}

static int f_read_split(encache_store *st, const char *const *keys, size_t n,
                        size_t split, void *const *heads, void *const *bufs,
                        const size_t *caps, int64_t *results) {
  fault_ctl *c = ctl_of(st);
  count(c, &c->read_calls);
  read_gate(c);
  if (c->read_rc)
    return c->read_rc;
  int rc = fwd(st, inner_of(st)->ops->read_split(inner_of(st), keys, n, split,
                                                 heads, bufs, caps, results));
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    switch (c->read_mode) {
    case READ_ITEM_CODE: results[i] = c->read_item_code; break;
    case READ_COUNT_ABOVE: results[i] = (int64_t)(split + caps[i]) + 1; break;
    case READ_SHORT: if (results[i] > 0) results[i]--; break;
    default: break;
    }
  }
  return 0;
}

static int f_size(encache_store *st, const char *key, uint64_t *len) {
  return fwd(st, inner_of(st)->ops->object_size(inner_of(st), key, len));
}

static int f_write(encache_store *st, const char *key, const void *hdr,
                   size_t hl, const void *p, size_t n) {
  fault_ctl *c = ctl_of(st);
  pthread_mutex_lock(&c->mu);
  c->write_calls++;
  if (c->hold_writes) {
    c->writes_waiting++;
    pthread_cond_broadcast(&c->cv);
    while (c->hold_writes && c->write_permits == 0)
      pthread_cond_wait(&c->cv, &c->mu);
    if (c->hold_writes)
      c->write_permits--;
    c->writes_waiting--;
  }
  int forced = c->write_rc;
  pthread_mutex_unlock(&c->mu);
  int rc = forced ? encache_store_fail(st, forced, "injected write failure")
                  : fwd(st, inner_of(st)->ops->write(inner_of(st), key, hdr,
                                                     hl, p, n));
  pthread_mutex_lock(&c->mu);
  c->writes_finished++;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static int f_remove(encache_store *st, const char *key) {
  return fwd(st, inner_of(st)->ops->remove(inner_of(st), key));
}

static int f_register(encache_store *st, void *buf, size_t len) {
  (void)buf;
  (void)len;
  fault_ctl *c = ctl_of(st);
  pthread_mutex_lock(&c->mu);
  int nth = ++c->register_calls;
  int fail = c->fail_register_from && nth >= c->fail_register_from;
  if (!fail)
    c->registered++;
  pthread_mutex_unlock(&c->mu);
  return fail ? encache_store_fail(st, ENCACHE_EUNAVAIL,
                                   "injected registration failure")
              : 0;
}

static int f_unregister(encache_store *st, void *buf) {
  (void)buf;
  fault_ctl *c = ctl_of(st);
  pthread_mutex_lock(&c->mu);
  c->unregister_calls++;
  int fail = c->fail_unregister;
  if (!fail)
    c->registered--;
  pthread_mutex_unlock(&c->mu);
  return fail ? encache_store_fail(st, ENCACHE_EUNCONFIRMED,
                                   "injected unregistration failure")
              : 0;
}

static int f_stats(encache_store *st, encache_store_stats *s) {
  return fwd(st, inner_of(st)->ops->stats(inner_of(st), s));
}

static void f_close(encache_store *st) {
  fault_ctl *c = ctl_of(st);
  count(c, &c->close_calls);
  encache_store_close(inner_of(st));
  free(encache_store_data(st));
  encache_store_free(st);
}

static int f_lease_take(encache_store *st, const char *key, uint64_t token,
                        uint32_t ttl_ms) {
  count(ctl_of(st), &ctl_of(st)->lease_calls);
  return fwd(st, encache_store_lease_take(inner_of(st), key, token, ttl_ms));
}

static int f_lease_drop(encache_store *st, const char *key, uint64_t token) {
  count(ctl_of(st), &ctl_of(st)->lease_calls);
  return fwd(st, encache_store_lease_drop(inner_of(st), key, token));
}

/* With registration on, the wrapper offers no split reads, as a Store that
 * reads into registered memory would not; without it, it offers them when
 * the Store it wraps does. */
static const encache_store_backend base_ops = {
    .size = sizeof(encache_store_backend),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "fault", .exists = f_exists, .read = f_read,
    .object_size = f_size, .write = f_write, .remove = f_remove,
    .stats = f_stats, .close = f_close};

encache_store *fault_store_wrap(encache_store *inner, fault_ctl *ctl) {
  fault_store *s = calloc(1, sizeof(*s));
  ASSERT(s != NULL);
  s->ops = base_ops;
  if (ctl->registration) {
    s->ops.caps |= ENCACHE_STORE_CAP_REGISTER;
    s->ops.register_buffer = f_register;
    s->ops.unregister_buffer = f_unregister;
  } else if (encache_store_caps_of(inner) & ENCACHE_STORE_CAP_READ_SPLIT) {
    s->ops.caps |= ENCACHE_STORE_CAP_READ_SPLIT;
    s->ops.read_split = f_read_split;
  }
  if (encache_store_caps_of(inner) & ENCACHE_STORE_CAP_LEASE) {
    s->ops.caps |= ENCACHE_STORE_CAP_LEASE;
    s->ops.lease_take = f_lease_take;
    s->ops.lease_drop = f_lease_drop;
  }
  s->inner = inner;
  s->ctl = ctl;
  encache_store *st = NULL;
  int rc = encache_store_new(&s->ops, s, "fault:", &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "encache_store_new: %s: %s",
               encache_err_name(rc), encache_store_errmsg(NULL));
  return st;
}

void fault_release_writes(fault_ctl *ctl) {
  pthread_mutex_lock(&ctl->mu);
  ctl->hold_writes = 0;
  pthread_cond_broadcast(&ctl->cv);
  pthread_mutex_unlock(&ctl->mu);
}

void fault_pass_writes(fault_ctl *ctl, int n) {
  pthread_mutex_lock(&ctl->mu);
  ctl->write_permits += n;
  pthread_cond_broadcast(&ctl->cv);
  pthread_mutex_unlock(&ctl->mu);
}

void fault_wait_held(fault_ctl *ctl, int n) {
  pthread_mutex_lock(&ctl->mu);
  while (ctl->writes_waiting < n)
    pthread_cond_wait(&ctl->cv, &ctl->mu);
  pthread_mutex_unlock(&ctl->mu);
}

void fault_wait_finished(fault_ctl *ctl, int n) {
  pthread_mutex_lock(&ctl->mu);
  while (ctl->writes_finished < n)
    pthread_cond_wait(&ctl->cv, &ctl->mu);
  pthread_mutex_unlock(&ctl->mu);
}

void fault_release_reads(fault_ctl *ctl) {
  pthread_mutex_lock(&ctl->mu);
  ctl->hold_reads = 0;
  pthread_cond_broadcast(&ctl->cv);
  pthread_mutex_unlock(&ctl->mu);
}

void fault_wait_reads_held(fault_ctl *ctl, int n) {
  pthread_mutex_lock(&ctl->mu);
  while (ctl->reads_waiting < n)
    pthread_cond_wait(&ctl->cv, &ctl->mu);
  pthread_mutex_unlock(&ctl->mu);
}
