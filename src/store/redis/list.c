/* SPDX-License-Identifier: Apache-2.0 */
/*
 * list.c: listing a node's keys with SCAN and their sizes with pipelined
 * STRLEN, on a short-lived context of ordinary (bounded) replies.  A
 * server whose cursor never comes back to 0 is stopped by a bound on
 * calls and keys derived from its DBSIZE (LIST_* in redis.h); an answer
 * that is not [cursor, [key strings...]] is refused.
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>

/* The node's DBSIZE, at most LIST_DBSIZE_MAX (also when it answers
 * something else).  Returns 0, or ENCACHE_EUNAVAIL. */
static int dbsize_of(redis_store *s, redisContext *c, uint64_t *dbsize) {
  static const char *const cmd[1] = {"DBSIZE"};
  char xwhy[256];
  void *one[1];
  if (encache__redis_plain1(s, c, 1, cmd, one, xwhy, sizeof(xwhy)) != XR_OK)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: DBSIZE: %s",
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
 * in *keys.  Returns 0, or -1 with why set. */
static int scan_once(redis_store *s, redisContext *c, const char *pattern,
                     char cursor[32], redisReply **out, redisReply **keys,
                     char *why, size_t whysize) {
  const char *scan[6] = {"SCAN",  cursor, "MATCH", pattern ? pattern : "*",
                         "COUNT", "1000"};
  char xwhy[256];
  void *one[1];
  if (encache__redis_plain1(s, c, 6, scan, one, xwhy, sizeof(xwhy)) != XR_OK) {
    snprintf(why, whysize, "SCAN: %s", xwhy);
    return -1;
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
    return -1;
  }
  memcpy(cursor, r->element[0]->str, r->element[0]->len);
  cursor[r->element[0]->len] = '\0';
  *out = r;
  *keys = k;
  return 0;
}

/* STRLEN of each of keys, pipelined, then cb on each key that has one
 * until cb answers non-zero (*stop).  Returns 0, or -1 with why set. */
static int sizes_of(redis_store *s, redisContext *c, const redisReply *keys,
                    int (*cb)(const char *key, uint64_t len, void *arg),
                    void *arg, int *stop, char *why, size_t whysize) {
  size_t n = keys->elements;
  if (n == 0)
    return 0;
  void **lens = encache__calloc(n, sizeof(void *));
  obuf b = {NULL, 0, 0, lens == NULL};
  for (size_t i = 0; i < n; i++) {
    const char *argv[2] = {"STRLEN", keys->element[i]->str};
    size_t argl[2] = {6, keys->element[i]->len};
    encache__redis_cmd(&b, 2, argv, argl);
  }
  char xwhy[256];
  int x = lens == NULL
              ? XR_FAIL
              : encache__redis_plain(s, c, &b, n, lens, xwhy, sizeof(xwhy));
  encache__free(b.p);
  if (x != XR_OK) {
    snprintf(why, whysize, "STRLEN: %s", lens ? xwhy : "out of memory");
    encache__free(lens);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    redisReply *len = lens[i];
    if (!*stop && len->type == REDIS_REPLY_INTEGER && len->integer >= 0)
      *stop = cb(keys->element[i]->str, (uint64_t)len->integer, arg);
    freeReplyObject(len);
  }
  encache__free(lens);
  return 0;
}

/* Returns 0, the callback's non-zero value, or ENCACHE_EUNAVAIL. */
int encache__redis_list_node(
    redis_store *s, redisContext *c, const char *pattern,
    int (*cb)(const char *key, uint64_t len, void *arg), void *arg) {
  char why[512] = "";
  uint64_t dbsize = 0;
  if (dbsize_of(s, c, &dbsize) < 0)
    return ENCACHE_EUNAVAIL;
  uint64_t max_calls = LIST_CALLS_MIN + dbsize / 100;
  uint64_t max_keys = 2 * dbsize + LIST_KEYS_SLACK, calls = 0, seen = 0;
  char cursor[32] = "0";
  int stop = 0;
  do {
    if (++calls > max_calls || seen > max_keys) {
      snprintf(why, sizeof(why),
               "SCAN did not finish after %" PRIu64 " calls and %" PRIu64
               " keys (DBSIZE %" PRIu64 "): the "
               "server's cursor never comes back to 0",
               calls - 1, seen, dbsize);
      break;
    }
    redisReply *r, *keys;
    if (scan_once(s, c, pattern, cursor, &r, &keys, why, sizeof(why)) < 0)
      break;
    seen += keys->elements;
    int bad = sizes_of(s, c, keys, cb, arg, &stop, why, sizeof(why));
    freeReplyObject(r);
    if (bad < 0)
      break;
  } while (!stop && strcmp(cursor, "0") != 0);
  if (why[0])
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s",
                               s->base.url, why);
  return stop;
}
