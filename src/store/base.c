/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base.c: what every backend and the front share (base.h): the calling
 * thread's messages, the query-string parser, the one check of a backend
 * table, its control requests, the profile a handle gets at open, and
 * the one classification of answers.  It calls no backend and no front.
 */
#include "base.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Messages are per thread, so that threads sharing a handle never see or
 * clobber each other's, and scoped to the handle they are about. */
static _Thread_local struct {
  const encache_store *st; /* NULL: an open */
  char msg[ENCACHE__STORE_MSG_MAX];
} last;

int encache_store_fail(encache_store *st, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last.msg, sizeof(last.msg), fmt, ap);
  va_end(ap);
  last.st = st;
  return rc;
}

const char *encache_store_errmsg(const encache_store *st) {
  return last.st == st ? last.msg : "";
}

void encache__store_msg_unscope(void) {
  last.st = NULL;
}

int encache__query_next(encache__query *q, char *key, size_t ksize, char *val,
                        size_t vsize) {
  if (q->p == NULL || *q->p == '\0')
    return 0;
  const char *amp = strchr(q->p, '&');
  size_t len = amp ? (size_t)(amp - q->p) : strlen(q->p);
  const char *eq = memchr(q->p, '=', len);
  if (eq == NULL || eq == q->p)
    return ENCACHE_EURL;
  size_t kl = (size_t)(eq - q->p), vl = len - kl - 1;
  if (kl >= ksize || vl >= vsize)
    return ENCACHE_EURL;
  memcpy(key, q->p, kl);
  key[kl] = '\0';
  memcpy(val, eq + 1, vl);
  val[vl] = '\0';
  q->p = amp ? amp + 1 : q->p + len;
  return 1;
}

int encache__backend_check(const encache_store_backend *b) {
  static const struct {
    unsigned cap;
    size_t off;
    const char *name;
  } optional[] = {
      {ENCACHE_STORE_CAP_READ_SPLIT, offsetof(encache_store_backend, read_split), "read_split"},
      {ENCACHE_STORE_CAP_REGISTER, offsetof(encache_store_backend, register_buffer), "register_buffer"},
      {ENCACHE_STORE_CAP_REGISTER, offsetof(encache_store_backend, unregister_buffer), "unregister_buffer"},
      {ENCACHE_STORE_CAP_LIST, offsetof(encache_store_backend, list), "list"},
      {ENCACHE_STORE_CAP_REMOVE_PREFIX, offsetof(encache_store_backend, remove_prefix), "remove_prefix"},
      {ENCACHE_STORE_CAP_LEASE, offsetof(encache_store_backend, lease_take), "lease_take"},
      {ENCACHE_STORE_CAP_LEASE, offsetof(encache_store_backend, lease_drop), "lease_drop"}};
  if (b == NULL || b->size < ENCACHE__BACKEND_SIZE_1_0 ||
      b->version != ENCACHE_STORE_BACKEND_VERSION)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "Store backend: size %zu or version %u is not "
                              "this library's (at least %zu, %u)",
                              b ? b->size : 0, b ? b->version : 0,
                              (size_t)ENCACHE__BACKEND_SIZE_1_0,
                              ENCACHE_STORE_BACKEND_VERSION);
  if (b->kind == NULL || b->exists == NULL || b->read == NULL ||
      b->object_size == NULL || b->write == NULL || b->remove == NULL ||
      b->stats == NULL || b->close == NULL)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "Store backend %s: kind, exists, read, "
                              "object_size, write, remove, stats and close "
                              "are required", b->kind ? b->kind : "(no kind)");
  for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++) {
    /* A smaller (older) table ends before the operation: not given. */
    int given = b->size >= optional[i].off + sizeof(void *) &&
                *(void *const *)((const char *)b + optional[i].off) != NULL;
    if (given != ((b->caps & optional[i].cap) != 0))
      return encache_store_fail(NULL, ENCACHE_EINVAL,
                                "Store backend %s: %s is %s but its capability "
                                "flag is %s", b->kind, optional[i].name,
                                given ? "given" : "NULL", given ? "off" : "on");
  }
  return 0;
}

uint64_t encache__store_list_deadline(const encache_store *st) {
  uint32_t ms = __atomic_load_n(&st->list_timeout_ms, __ATOMIC_RELAXED);
  if (ms == 0)
    return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 + ms;
}

int encache__store_control(encache_store *st, int op, void *arg) {
  if (!ENCACHE__BACKEND_HAS(st->ops, control))
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  return st->ops->control(st, op, arg);
}

void encache__store_profile_set(encache_store *st) {
  unsigned caps = st->ops->caps;
  encache__store_profile *p = &st->profile;
  p->registered = (caps & ENCACHE_STORE_CAP_REGISTER) != 0;
  p->read_direct = (caps & ENCACHE_STORE_CAP_READ_SPLIT) && !p->registered;
  p->read_whole = !(caps & (ENCACHE_STORE_CAP_REGISTER |
                            ENCACHE_STORE_CAP_READ_SPLIT));
  p->read_absent = (caps & ENCACHE_STORE_CAP_READ_ABSENT) != 0;
  p->put_if_absent = (caps & ENCACHE_STORE_CAP_PUT_IF_ABSENT) != 0;
  p->lease = (caps & ENCACHE_STORE_CAP_LEASE) != 0;
  /* A NULL argument asks whether the request is known, doing nothing. */
  p->ask_ahead =
      encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN, NULL) == 0;
  p->unchecked =
      encache__store_control(st, ENCACHE__CONTROL_UNCHECKED, NULL) == 0;
  /* On a Store shared with other processes (a service or a segment: a
   * write waits on more than this CPU) two writes in flight; but one
   * whose calls wait by polling spends a CPU per write in flight, taken
   * from the transfers themselves: one (docs/performance.md, "Against
   * Mooncake's own client, second round"). */
  p->writes_in_flight = (caps & ENCACHE_STORE_CAP_SHARED) &&
                                !(caps & ENCACHE_STORE_CAP_BUSY_WAIT)
                            ? ENCACHE__WRITERS
                            : 1;
  p->reads_in_flight = p->writes_in_flight; /* a read waits the same way */
}

int encache_store_classify(int64_t rc) {
  if (rc >= 0)
    return ENCACHE_ANSWER_OK;
  switch (rc) {
  case ENCACHE_ENOENT:
    return ENCACHE_ANSWER_ABSENT;
  case ENCACHE_EEXIST:
    return ENCACHE_ANSWER_EXISTS;
  case ENCACHE_ETOOLARGE:
    return ENCACHE_ANSWER_TOO_LARGE;
  case ENCACHE_EUNAVAIL:
  case ENCACHE_EINVAL:
  case ENCACHE_ENOMEM:
    return ENCACHE_ANSWER_RECOVERABLE;
  default:
    return ENCACHE_ANSWER_UNCONFIRMED;
  }
}
