/*
 * store.c: opening a Store from its URL, and the public encache_store_*
 * functions, which check arguments once and forward to the backend.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages are per thread, so that threads sharing a handle never see or
 * clobber each other's. */
static _Thread_local char last_msg[512];

int encache__store_fail(encache_store *st, int rc, const char *fmt, ...) {
  (void)st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
  va_end(ap);
  return rc;
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

int encache_store_open(const char *url, encache_store **out) {
  if (out == NULL)
    return ENCACHE_EINVAL;
  *out = NULL;
  if (url == NULL) {
    url = getenv("ENCACHE_STORE");
    if (url == NULL || url[0] == '\0')
      url = ENCACHE_DEFAULT_STORE;
  } else if (url[0] == '\0') {
    /* Never the default in disguise: it would create a 1 GiB segment. */
    return encache__store_fail(NULL, ENCACHE_EURL,
                               "empty Store URL: give one (shm://NAME?size=..., "
                               "redis://host:port, redis-cluster://..., "
                               "unix:///path, mooncake:) or none for the "
                               "default (%s)", ENCACHE_DEFAULT_STORE);
  }
  if (strncmp(url, "shm://", 6) == 0)
    return encache__shm_open(url, out);
  if (strncmp(url, "redis://", 8) == 0 ||
      strncmp(url, "redis-cluster://", 16) == 0 ||
      strncmp(url, "unix://", 7) == 0)
    return encache__redis_open(url, out);
  if (strncmp(url, "mooncake:", 9) == 0)
    return encache__mooncake_open(url, out);
  return encache__store_fail(NULL, ENCACHE_EURL,
                             "%.200s: unknown Store URL scheme (known: shm://, "
                             "redis://, redis-cluster://, unix://, mooncake:)",
                             url);
}

void encache_store_close(encache_store *st) {
  if (st != NULL)
    st->ops->close(st);
}

const char *encache_store_errmsg(const encache_store *st) {
  (void)st;
  return last_msg;
}

const char *encache_store_url(const encache_store *st) {
  return st != NULL && st->url != NULL ? st->url : "";
}

int encache_store_exists(encache_store *st, const char *const *keys, size_t n,
                         int *results) {
  if (st == NULL || (n > 0 && (keys == NULL || results == NULL)))
    return ENCACHE_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (keys[i] == NULL)
      return encache__store_fail(st, ENCACHE_EINVAL, "key %zu is NULL", i);
  return n == 0 ? 0 : st->ops->exists(st, keys, n, results);
}

int encache_store_read(encache_store *st, const char *const *keys, size_t n,
                       void *const *bufs, const size_t *caps,
                       int64_t *results) {
  if (st == NULL ||
      (n > 0 && (keys == NULL || bufs == NULL || caps == NULL ||
                 results == NULL)))
    return ENCACHE_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (keys[i] == NULL || (bufs[i] == NULL && caps[i] != 0))
      return encache__store_fail(st, ENCACHE_EINVAL,
                                 "item %zu: NULL key or buffer", i);
  return n == 0 ? 0 : st->ops->read(st, keys, n, bufs, caps, results);
}

int encache_store_object_size(encache_store *st, const char *key,
                              uint64_t *len) {
  if (st == NULL || key == NULL || len == NULL)
    return ENCACHE_EINVAL;
  return st->ops->object_size(st, key, len);
}

int encache_store_write(encache_store *st, const char *key, const void *hdr,
                        size_t hdr_len, const void *payload, size_t len) {
  if (st == NULL || key == NULL || (hdr == NULL && hdr_len != 0) ||
      (payload == NULL && len != 0))
    return ENCACHE_EINVAL;
  if (hdr_len > SIZE_MAX - len)
    return ENCACHE_ETOOLARGE;
  return st->ops->write(st, key, hdr, hdr_len, payload, len);
}

int encache_store_remove(encache_store *st, const char *key) {
  if (st == NULL || key == NULL)
    return ENCACHE_EINVAL;
  return st->ops->remove(st, key);
}

int encache_store_list(encache_store *st, const char *pattern,
                       int (*cb)(const char *key, uint64_t len, void *arg),
                       void *arg) {
  if (st == NULL || cb == NULL)
    return ENCACHE_EINVAL;
  if (st->ops->list == NULL)
    return encache__store_fail(st, ENCACHE_EINVAL,
                               "the %s Store cannot list its keys",
                               st->ops->kind);
  return st->ops->list(st, pattern, cb, arg);
}

int encache_store_stats_get(encache_store *st, encache_store_stats *stats) {
  if (st == NULL || stats == NULL)
    return ENCACHE_EINVAL;
  memset(stats, 0xff, sizeof(*stats));
  stats->kind = st->ops->kind;
  return st->ops->stats(st, stats);
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
