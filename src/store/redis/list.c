/* SPDX-License-Identifier: Apache-2.0 */
/*
 * list.c: listing a node's keys with SCAN and their sizes with pipelined
 * STRLEN and GETRANGE of the header (an object's size is without its
 * check: check.c), and removing the keys under a prefix with SCAN and pipelined
 * UNLINK, on a short-lived context of ordinary (bounded) replies.  A
 * server whose cursor never comes back to 0 is stopped by a bound on
 * calls and keys derived from its DBSIZE (LIST_* in redis.h), and by the
 * walk's deadline when the handle has a list timeout
 * (encache_store_set_list_timeout(): a DBSIZE that is no count leaves a
 * bound of some 168 000 calls, minutes over a network); an answer that is
 * not [cursor, [key strings...]] is refused.
 */
#include "redis.h"
#include "../prefix.h"

#include <inttypes.h>
#include <stdio.h>

/* The node's DBSIZE, at most LIST_DBSIZE_MAX (also when it answers
 * something else).  Returns 0, or ENCACHE_EUNAVAIL. */
static int dbsize_of(redis_store *s, redisContext *c, uint64_t *dbsize) {
  static const char *const cmd[1] = {"DBSIZE"};
  char xwhy[256];
  void *one[1];
  if (encache__redis_plain1(s, c, 1, cmd, one, xwhy, sizeof(xwhy)) != XR_OK)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: DBSIZE: %s",
                              s->base.url, xwhy);
  redisReply *r = one[0];
  *dbsize = r->type == REDIS_REPLY_INTEGER && r->integer >= 0 &&
                    (uint64_t)r->integer < LIST_DBSIZE_MAX
                ? (uint64_t)r->integer
                : LIST_DBSIZE_MAX;
  freeReplyObject(r);
  return 0;
}

/* One SCAN from cursor (updated): its reply in *out and its key strings
 * in *keys.  Returns 0, or ENCACHE_EUNAVAIL with why set. */
static int scan_once(redis_store *s, redisContext *c, const char *pattern,
                     char cursor[32], redisReply **out, redisReply **keys,
                     char *why, size_t whysize) {
  const char *scan[6] = {"SCAN",  cursor, "MATCH", pattern ? pattern : "*",
                         "COUNT", "1000"};
  char xwhy[256];
  void *one[1];
  if (encache__redis_plain1(s, c, 6, scan, one, xwhy, sizeof(xwhy)) != XR_OK) {
    snprintf(why, whysize, "SCAN: %s", xwhy);
    return ENCACHE_EUNAVAIL;
  }
  redisReply *r = one[0], *k = NULL;
  if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
      r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len < 32 &&
      r->element[1]->type == REDIS_REPLY_ARRAY)
    k = r->element[1];
  for (size_t i = 0; k != NULL && i < k->elements; i++)
    if (k->element[i]->type != REDIS_REPLY_STRING)
      k = NULL;
  if (k == NULL) {
    snprintf(why, whysize, "SCAN: %s",
             r->type == REDIS_REPLY_ERROR
                 ? r->str
                 : "the answer is not a cursor and a list of key strings");
    freeReplyObject(r);
    return ENCACHE_EUNAVAIL;
  }
  memcpy(cursor, r->element[0]->str, r->element[0]->len);
  cursor[r->element[0]->len] = '\0';
  *out = r;
  *keys = k;
  return 0;
}

/* What to do with each page of keys of a scan; returns 0, or
 * ENCACHE_EUNAVAIL with why set; sets *stop to end the scan early. */
typedef int (*page_fn)(redis_store *s, redisContext *c, const redisReply *keys,
                       void *ctx, int *stop, char *why, size_t whysize);

/* A listing: the caller's callback. */
typedef struct list_ctx {
  int (*cb)(const char *key, uint64_t len, void *arg);
  void *arg;
} list_ctx;

/* The length of the object the value of STRLEN len and head h holds
 * (without its check, check.c), or -1 when they are not a length and a
 * string. */
static int64_t object_len(const redisReply *len, const redisReply *h) {
  if (len->type != REDIS_REPLY_INTEGER || len->integer < 0 ||
      h->type != REDIS_REPLY_STRING)
    return -1;
  return (int64_t)encache__redis_check_objlen((const unsigned char *)h->str,
                                              h->len, (uint64_t)len->integer);
}

/* page_fn of a listing: STRLEN and the header (GETRANGE 0 23) of each of
 * keys, pipelined, then cb on each key that has one until cb answers
 * non-zero (*stop). */
static int sizes_of(redis_store *s, redisContext *c, const redisReply *keys,
                    void *ctx, int *stop, char *why, size_t whysize) {
  const list_ctx *l = ctx;
  size_t n = keys->elements;
  if (n == 0)
    return 0;
  void **lens = encache__calloc(2 * n, sizeof(void *));
  obuf b = {NULL, 0, 0, lens == NULL};
  for (size_t i = 0; i < n; i++) {
    const char *argv[4] = {"STRLEN", keys->element[i]->str, "0", "23"};
    size_t argl[4] = {6, keys->element[i]->len, 1, 2};
    encache__redis_cmd(&b, 2, argv, argl);
    argv[0] = "GETRANGE";
    argl[0] = 8;
    encache__redis_cmd(&b, 4, argv, argl);
  }
  char xwhy[256];
  int x = lens == NULL ? XR_FAIL
                       : encache__redis_plain(s, c, &b, 2 * n, lens, xwhy,
                                              sizeof(xwhy));
  encache__free(b.p);
  if (x != XR_OK) {
    snprintf(why, whysize, "STRLEN: %s", lens ? xwhy : "out of memory");
    encache__free(lens);
    return ENCACHE_EUNAVAIL;
  }
  for (size_t i = 0; i < n; i++) {
    int64_t len = object_len(lens[2 * i], lens[2 * i + 1]);
    if (!*stop && len >= 0)
      *stop = l->cb(keys->element[i]->str, (uint64_t)len, l->arg);
    freeReplyObject(lens[2 * i]);
    freeReplyObject(lens[2 * i + 1]);
  }
  encache__free(lens);
  return 0;
}

/* SCANs the node from cursor 0 to 0 for pattern, page by page, bounded
 * (and by deadline, now_ms()'s clock; 0: none).  Returns 0, *stop's
 * value, or ENCACHE_EUNAVAIL with the message set. */
static int scan_node(redis_store *s, redisContext *c, const char *pattern,
                     uint64_t deadline, page_fn page, void *ctx) {
  char why[512] = "";
  uint64_t dbsize = 0;
  if (dbsize_of(s, c, &dbsize) < 0)
    return ENCACHE_EUNAVAIL;
  uint64_t max_calls = LIST_CALLS_MIN + dbsize / 100;
  uint64_t max_keys = 2 * dbsize + LIST_KEYS_SLACK, calls = 0, seen = 0;
  char cursor[32] = "0";
  int stop = 0;
  do {
    int late = deadline != 0 && now_ms() >= deadline;
    if (++calls > max_calls || seen > max_keys || late) {
      char in[64] = "";
      if (late)
        snprintf(in, sizeof(in), " in the list timeout of %" PRIu32 " ms",
                 __atomic_load_n(&s->base.list_timeout_ms, __ATOMIC_RELAXED));
      snprintf(why, sizeof(why),
               "SCAN did not finish after %" PRIu64 " calls and %" PRIu64
               " keys (DBSIZE %" PRIu64 ")%s: the "
               "server's cursor never comes back to 0",
               calls - 1, seen, dbsize, in);
      break;
    }
    redisReply *r, *keys;
    if (scan_once(s, c, pattern, cursor, &r, &keys, why, sizeof(why)) < 0)
      break;
    seen += keys->elements;
    int bad = page(s, c, keys, ctx, &stop, why, sizeof(why));
    freeReplyObject(r);
    if (bad < 0)
      break;
  } while (!stop && strcmp(cursor, "0") != 0);
  if (why[0])
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s",
                              s->base.url, why);
  return stop;
}

int encache__redis_list_node(
    redis_store *s, redisContext *c, const char *pattern, uint64_t deadline,
    int (*cb)(const char *key, uint64_t len, void *arg), void *arg) {
  list_ctx l = {cb, arg};
  return scan_node(s, c, pattern, deadline, sizes_of, &l);
}

/* A removal by prefix on one node. */
typedef struct unlink_ctx {
  const char *prefix;
  size_t plen;
  uint64_t removed;
} unlink_ctx;

/* The keys of a page that start with the prefix (compared again, byte for
 * byte, whatever MATCH said) into keys[], their count. */
static size_t under_prefix(const unlink_ctx *u, const redisReply *page,
                           const redisReply **keys) {
  size_t m = 0;
  for (size_t i = 0; i < page->elements; i++) {
    const redisReply *k = page->element[i];
    if (k->len >= u->plen && memcmp(k->str, u->prefix, u->plen) == 0)
      keys[m++] = k;
  }
  return m;
}

/* page_fn of a removal: one UNLINK per key under the prefix, pipelined in
 * one exchange (a single UNLINK of many keys would be refused by a
 * cluster for keys of different slots).  A key the cluster has moved
 * meanwhile (MOVED, ASK) is removed through the Store's own DEL, which
 * follows redirections. */
static int unlink_page(redis_store *s, redisContext *c, const redisReply *page,
                       void *ctx, int *stop, char *why, size_t whysize) {
  unlink_ctx *u = ctx;
  (void)stop;
  const redisReply **keys = encache__calloc(page->elements + 1, sizeof(*keys));
  void **rep = encache__calloc(page->elements + 1, sizeof(void *));
  size_t m = keys && rep ? under_prefix(u, page, keys) : 0;
  obuf b = {NULL, 0, 0, keys == NULL || rep == NULL};
  for (size_t i = 0; i < m; i++) {
    const char *argv[2] = {"UNLINK", keys[i]->str};
    size_t argl[2] = {6, keys[i]->len};
    encache__redis_cmd(&b, 2, argv, argl);
  }
  char xwhy[256] = "out of memory";
  int x = b.oom ? XR_FAIL
          : m == 0 ? XR_OK
                   : encache__redis_plain(s, c, &b, m, rep, xwhy, sizeof(xwhy));
  encache__free(b.p);
  int rc = x == XR_OK ? 0 : ENCACHE_EUNAVAIL;
  for (size_t i = 0; x == XR_OK && i < m; i++) {
    redisReply *r = rep[i];
    if (r->type == REDIS_REPLY_INTEGER) {
      u->removed += r->integer > 0;
    } else if (r->type == REDIS_REPLY_ERROR &&
               (strncmp(r->str, "MOVED ", 6) == 0 ||
                strncmp(r->str, "ASK ", 4) == 0)) {
      int d = s->base.ops->remove(&s->base, keys[i]->str);
      u->removed += d == 0;
      if (d < 0 && d != ENCACHE_ENOENT && rc == 0) {
        snprintf(xwhy, sizeof(xwhy), "%s", encache_store_errmsg(&s->base));
        rc = ENCACHE_EUNAVAIL;
      }
    } else if (rc == 0) {
      snprintf(xwhy, sizeof(xwhy), "%s",
               r->type == REDIS_REPLY_ERROR ? r->str : "unexpected answer");
      rc = ENCACHE_EUNAVAIL;
    }
    freeReplyObject(r);
  }
  if (rc < 0)
    snprintf(why, whysize, "UNLINK: %s", xwhy);
  encache__free(keys);
  encache__free(rep);
  return rc;
}

int encache__redis_unlink_node(redis_store *s, redisContext *c,
                               const char *prefix, uint64_t deadline,
                               uint64_t *removed) {
  char *pattern = encache__prefix_glob(prefix);
  if (pattern == NULL)
    return encache_store_fail(&s->base, ENCACHE_ENOMEM, "out of memory");
  unlink_ctx u = {prefix, strlen(prefix), 0};
  int rc = scan_node(s, c, pattern, deadline, unlink_page, &u);
  encache__free(pattern);
  *removed += u.removed;
  return rc;
}
