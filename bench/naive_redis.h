/* SPDX-License-Identifier: Apache-2.0 */
/*
 * naive_redis.h: the naive pipelined GETRANGE client of issue 30, the
 * baseline a windowed read must match: each object read in windows of
 * NAIVE_WINDOW bytes, NAIVE_DEPTH GETRANGEs sent at a time through
 * hiredis and their replies copied into place, with no check of any kind
 * (no STRLEN, nothing read twice, windows of two objects served as one).
 * It is what a user would write in an afternoon; bench_redis times it
 * beside encache's lookup and plain GET.
 */
#ifndef ENCACHE_BENCH_NAIVE_REDIS_H
#define ENCACHE_BENCH_NAIVE_REDIS_H

#include <hiredis/hiredis.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NAIVE_WINDOW (1u << 20)
#define NAIVE_DEPTH 8

/* Reads the first len bytes of key into dst (a value that carries
 * encache's check is 16 bytes longer: the last window brings them too, not
 * copied); returns 0, or -1 on any error or a short window. */
static inline int naive_read(redisContext *c, const char *key, void *dst,
                             uint64_t len) {
  for (uint64_t off = 0; off < len;) {
    uint64_t start = off;
    int n = 0;
    for (; n < NAIVE_DEPTH && off < len; n++, off += NAIVE_WINDOW)
      redisAppendCommand(c, "GETRANGE %s %llu %llu", key,
                         (unsigned long long)off,
                         (unsigned long long)(off + NAIVE_WINDOW - 1));
    for (int k = 0; k < n; k++) {
      redisReply *rep;
      uint64_t at = start + (uint64_t)k * NAIVE_WINDOW;
      uint64_t want = len - at < NAIVE_WINDOW ? len - at : NAIVE_WINDOW;
      if (redisGetReply(c, (void **)&rep) != REDIS_OK)
        return -1;
      int bad = rep->type != REDIS_REPLY_STRING || (uint64_t)rep->len < want;
      if (!bad)
        memcpy((char *)dst + at, rep->str, (size_t)want);
      freeReplyObject(rep);
      if (bad)
        return -1;
    }
  }
  return 0;
}

#endif
