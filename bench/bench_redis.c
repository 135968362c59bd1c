/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_redis: the Redis Store against raw hiredis, in one run.
 *
 *   bench_redis redis://HOST:PORT[?options] [--iterations N]
 *               [--ab | --reads | --overlap] [--sleep] [--pin]
 *
 * (a) reads of 4 objects of 16 KiB, 1, 8 and 30 MiB, interleaved (A/B/C/D,
 *     A/B/C/D, ...) so that all see the same machine: raw hiredis
 *     pipelined GETs (reply objects, as any hiredis program gets them),
 *     raw hiredis pipelined GETRANGE windows of 1 MiB (every window of the
 *     4 objects in one pipeline, each copied into its place in a
 *     destination), the naive client of issue 30 (naive_redis.h: each
 *     object in 1 MiB windows, 8 at a time, no checks), the server's
 *     ceiling (direct_redis.h: GETs, then the naive client's windows, on
 *     a socket read without hiredis, received in place), and an encache
 *     lookup of the same 4 hits through the Redis Store (its URL options
 *     apply: window, window_threshold, window_depth); p50 throughput and
 *     the ratios of issue 30: lookup / naive (goal >= 1.0 at 8 and
 *     30 MiB) and lookup / plain GET (goal >= 3 where plain GET falls off
 *     a cliff), and lookup / the direct windows (what share of the most
 *     any windowed client gets from this server);
 * (b) writes of one object of 1, 8 and 30 MiB: raw hiredis SET against the
 *     Store's write (SET NX from the caller's buffers, or windows above
 *     window_threshold); ratio write / SET (target >= 3 where SET falls
 *     off a cliff);
 * (c) the key-bound check of Redis objects (issue 26): lookups of 4 hits
 *     of 16 KiB, 1 MiB and 8 MiB through two Stores on the same server,
 *     one with checksum=on (objects written with their check, verified
 *     as read) and one with checksum=off (objects written without, read
 *     as they are), in alternating rounds (A/B, then B/A, ...) so that a
 *     noisy neighbour hits both alike; p50 GB/s of each and the ratio
 *     on / off (goal: >= 0.95 at 1 MiB and 8 MiB);
 * (d) lookups that do not wait (issue 29): 4 hits of 1 MiB and 8 MiB, the
 *     step loop with encache_lookup_start() overlapping a compute of C =
 *     0.5, 1 and 2 x the read time R against the blocking loop, and a
 *     lookup started and waited at once against encache_lookup()
 *     (bench_overlap_table(), overlap.h; goals <= 1.1 x max(C, R) and
 *     <= 1.05).
 * --ab runs only (c), --reads only (a), --overlap only (d); --sleep: (d)'s
 * compute sleeps instead of spinning (its core left free); --pin: this
 * thread on one CPU, the handle's threads on the others
 * (measure_pin_threads()).
 */
#include "hits.h"
#include "overlap.h"
#include "direct_redis.h"
#include "naive_redis.h"

#include <hiredis/hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4
#define RAW_WINDOW (1u << 20)

/* The raw hiredis connection, the baseline; a second connection whose
 * socket direct_redis.h reads without hiredis. */
static redisContext *raw_redis;
static direct_conn direct;

static const char usage[] =
    "usage: bench_redis redis://HOST:PORT[?options] [--iterations N] "
    "[--ab | --reads | --overlap] [--sleep] [--pin]\n";

static const size_t sizes[] = {16u << 10, 1u << 20, 8u << 20, 30u << 20};
#define NSIZES ((int)(sizeof(sizes) / sizeof(sizes[0])))

/* measure_fn: raw hiredis pipelined GETs of the objects. */
static int raw_gets(void *ctx) {
  bench_hits *h = ctx;
  for (int k = 0; k < h->n; k++)
    redisAppendCommand(raw_redis, "GET %s", h->keys[k]);
  for (int k = 0; k < h->n; k++) {
    redisReply *rep;
    if (redisGetReply(raw_redis, (void **)&rep) != REDIS_OK ||
        rep->type != REDIS_REPLY_STRING) {
      fprintf(stderr, "bench_redis: raw GET failed\n");
      return 1;
    }
    freeReplyObject(rep);
  }
  return 0;
}

/* measure_fn: raw hiredis pipelined GETRANGE windows of the objects, each
 * copied into its place in the object's raw buffer.  A value written with
 * the key-bound check holds 16 bytes after the object: the last window may
 * bring them, and they are not kept (the baseline checks nothing). */
static int raw_windows(void *ctx) {
  bench_hits *h = ctx;
  uint64_t len = h->nbytes + 24;
  for (int k = 0; k < h->n; k++)
    for (uint64_t off = 0; off < len; off += RAW_WINDOW)
      redisAppendCommand(raw_redis, "GETRANGE %s %llu %llu", h->keys[k],
                         (unsigned long long)off,
                         (unsigned long long)(off + RAW_WINDOW - 1));
  for (int k = 0; k < h->n; k++)
    for (uint64_t off = 0; off < len; off += RAW_WINDOW) {
      redisReply *rep;
      if (redisGetReply(raw_redis, (void **)&rep) != REDIS_OK ||
          rep->type != REDIS_REPLY_STRING || rep->len > RAW_WINDOW) {
        fprintf(stderr, "bench_redis: raw GETRANGE failed\n");
        return 1;
      }
      size_t n = (uint64_t)rep->len < len - off ? rep->len : len - off;
      memcpy((char *)h->raw[k] + off, rep->str, n);
      freeReplyObject(rep);
    }
  return 0;
}

/* measure_fn: the naive client (naive_redis.h) reads each object, its
 * windows NAIVE_DEPTH at a time, into the object's raw buffer. */
static int naive_windows(void *ctx) {
  bench_hits *h = ctx;
  for (int k = 0; k < h->n; k++)
    if (naive_read(raw_redis, h->keys[k], h->raw[k], h->nbytes + 24) != 0) {
      fprintf(stderr, "bench_redis: naive GETRANGE failed\n");
      return 1;
    }
  return 0;
}

/* measure_fn: direct_redis.h's GETs, and its windows. */
static int direct_gets(void *ctx) {
  bench_hits *h = ctx;
  if (direct_get(&direct, h->keys, h->raw, h->n, h->nbytes + 24) != 0) {
    fprintf(stderr, "bench_redis: direct GET failed\n");
    return 1;
  }
  return 0;
}

static int direct_wins(void *ctx) {
  bench_hits *h = ctx;
  if (direct_windows(&direct, h->keys, h->raw, h->n, h->nbytes + 24) != 0) {
    fprintf(stderr, "bench_redis: direct GETRANGE failed\n");
    return 1;
  }
  return 0;
}

typedef int (*bench_fn)(void *ctx);

/* Times the functions in turn, iters times after one warm-up. */
static int time_all(bench_fn *fns, measure *m, int nfns, void *ctx,
                    int iters) {
  for (int it = -1; it < iters; it++)
    for (int f = 0; f < nfns; f++) {
      double t0 = measure_now();
      if (fns[f](ctx) != 0)
        return 1;
      if (it >= 0)
        measure_add(&m[f], measure_now() - t0);
    }
  return 0;
}

#define NREADERS 6

static int bench_reads(encache *ec, encache_store *st, int iters) {
  bench_fn fns[NREADERS] = {raw_gets,      direct_gets, raw_windows,
                            naive_windows, direct_wins, bench_hits_lookup};
  measure m[NREADERS];
  for (int f = 0; f < NREADERS; f++)
    if (measure_init(&m[f], iters) < 0)
      return 1;
  printf("(a) reads of 4 objects, rounds alternating, p50 of %d (GB/s)\n",
         iters);
  printf("%-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "object", "plain GET",
         "GET dir", "raw win", "naive", "win dir", "encache", "enc/naive",
         "enc/GET", "enc/windir");
  int rc = 0;
  for (int s = 0; s < NSIZES && rc == 0; s++) {
    bench_hits h;
    if ((rc = bench_hits_make(&h, ec, st, "r", NOBJ, sizes[s])) != 0)
      break;
    for (int f = 0; f < NREADERS; f++)
      measure_clear(&m[f]);
    rc = time_all(fns, m, NREADERS, &h, iters);
    double bytes = (double)NOBJ * (double)h.nbytes, g[NREADERS];
    for (int f = 0; f < NREADERS; f++)
      g[f] = measure_gbs(bytes, measure_pct(&m[f], 50));
    char label[16];
    measure_size_label(label, sizeof(label), sizes[s]);
    if (rc == 0)
      printf("%-8s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n",
             label, g[0], g[1], g[2], g[3], g[4], g[5], g[5] / g[3],
             g[5] / g[0], g[5] / g[4]);
    bench_hits_drop(&h);
  }
  printf("    GET dir, win dir: direct_redis.h, the server's ceiling (no "
         "hiredis, received in place, nothing checked)\n");
  for (int f = 0; f < NREADERS; f++)
    measure_free(&m[f]);
  return rc;
}

/* One object of nbytes + 24 written iters times each way (fresh keys,
 * removed after each write); p50 GB/s of each, the ratio. */
static int bench_write_size(encache_store *st, size_t nbytes, int iters,
                            const char *val) {
  measure m[2];
  if (measure_init(&m[0], iters) < 0 || measure_init(&m[1], iters) < 0)
    return 1;
  int rc = 0;
  for (int it = -1; it < iters && rc == 0; it++) {
    char key[64];
    snprintf(key, sizeof(key), "bench-w-%d-%d", (int)getpid(), it);
    double t0 = measure_now();
    redisReply *rep =
        redisCommand(raw_redis, "SET %s %b", key, val, nbytes + 24);
    double t1 = measure_now();
    rc = rep == NULL || rep->type != REDIS_REPLY_STATUS;
    freeReplyObject(rep);
    freeReplyObject(redisCommand(raw_redis, "DEL %s", key));
    double t2 = measure_now();
    rc = rc || encache_store_write(st, key, val, 24, val + 24, nbytes) != 0;
    double t3 = measure_now();
    encache_store_remove(st, key);
    if (it >= 0)
      measure_add(&m[0], t1 - t0), measure_add(&m[1], t3 - t2);
  }
  char label[16];
  measure_size_label(label, sizeof(label), nbytes);
  double g0 = measure_gbs((double)nbytes + 24, measure_pct(&m[0], 50));
  double g1 = measure_gbs((double)nbytes + 24, measure_pct(&m[1], 50));
  if (rc == 0)
    printf("%-8s %12.2f %12.2f %14.2f\n", label, g0, g1, g1 / g0);
  else
    fprintf(stderr, "bench_redis: write: %s\n", encache_store_errmsg(st));
  measure_free(&m[0]);
  measure_free(&m[1]);
  return rc;
}

static int bench_writes(encache_store *st, int iters) {
  char *val = malloc(sizes[NSIZES - 1] + 24);
  if (val == NULL)
    return 1;
  memset(val, 3, sizes[NSIZES - 1] + 24);
  printf("\n(b) writes of 1 object, p50 of %d (GB/s)\n", iters);
  printf("%-8s %12s %12s %14s\n", "object", "plain SET", "encache",
         "enc/plain SET");
  int rc = 0;
  for (int s = 0; s < NSIZES && rc == 0; s++)
    rc = bench_write_size(st, sizes[s], iters, val);
  free(val);
  return rc;
}

/* (c): the lookups of ab[0] (checksum=on) and ab[1] (off), in
 * alternating order, p50 of each, for each size. */
static int bench_check_rows(bench_hits *ab, int iters) {
  measure m[2];
  if (measure_init(&m[0], iters) < 0 || measure_init(&m[1], iters) < 0)
    return 1;
  int rc = 0;
  for (int it = -2; it < iters && rc == 0; it++)
    for (int k = 0; k < 2 && rc == 0; k++) {
      int side = (it & 1) ? 1 - k : k; /* A/B, then B/A */
      double t0 = measure_now();
      rc = bench_hits_lookup(&ab[side]);
      if (it >= 0)
        measure_add(&m[side], measure_now() - t0);
    }
  double bytes = (double)NOBJ * (double)ab[0].nbytes;
  double on = measure_gbs(bytes, measure_pct(&m[0], 50));
  double off = measure_gbs(bytes, measure_pct(&m[1], 50));
  char label[16];
  measure_size_label(label, sizeof(label), ab[0].nbytes);
  if (rc == 0)
    printf("%-8s %12.2f %12.2f %10.3f\n", label, on, off, on / off);
  measure_free(&m[0]);
  measure_free(&m[1]);
  return rc;
}

static int bench_check(const char *url, int iters) {
  static const size_t ab_sizes[] = {16u << 10, 1u << 20, 8u << 20};
  static const char *const modes[2] = {"on", "off"};
  encache *ec[2] = {NULL, NULL};
  encache_store *st[2] = {NULL, NULL};
  int rc = 0;
  for (int k = 0; k < 2 && rc == 0; k++) {
    char u[1024];
    snprintf(u, sizeof(u), "%s%cchecksum=%s", url,
             strchr(url, '?') ? '&' : '?', modes[k]);
    rc = bench_open("bench_redis", u,
                    "{\"ec_connector_extra_config\": "
                    "{\"cross_encoder_cache\": true}}",
                    &ec[k], &st[k]);
  }
  printf("\n(c) lookups of 4 objects, checksum=on against off, alternating, "
         "p50 of %d (GB/s)\n", iters);
  printf("%-8s %12s %12s %10s\n", "object", "check on", "check off", "on/off");
  for (size_t s = 0; rc == 0 && s < sizeof(ab_sizes) / sizeof(*ab_sizes);
       s++) {
    bench_hits ab[2];
    if (bench_hits_make(&ab[0], ec[0], st[0], "ab-on", NOBJ, ab_sizes[s]) ||
        bench_hits_make(&ab[1], ec[1], st[1], "ab-off", NOBJ, ab_sizes[s])) {
      bench_hits_drop(&ab[0]); /* a failed make left nothing to drop */
      rc = 1;
      break;
    }
    rc = bench_check_rows(ab, iters);
    bench_hits_drop(&ab[0]);
    bench_hits_drop(&ab[1]);
  }
  for (int k = 0; k < 2; k++) {
    encache_close(ec[k]);
    encache_store_close(st[k]);
  }
  return rc;
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 20;
  /* The sections to run: (a), (b), (c), (d); a flag keeps only its own. */
  int run[4] = {1, 1, 1, 1};
  static const char *const only[4] = {"--reads", NULL, "--ab", "--overlap"};
  for (int k = 0; k < 4; k++)
    if (only[k] != NULL && measure_take_flag(&argc, argv, only[k]))
      for (int j = 0; j < 4; j++)
        run[j] = j == k;
  int flags = bench_overlap_flags(&argc, argv);
  int rc = measure_options(argc, argv, usage, 1, &url, &iters, 5);
  if (rc >= 0)
    return rc;
  char host[256];
  int port;
  if (url == NULL || strncmp(url, "redis://", 8) != 0 ||
      sscanf(url + 8, "%255[^:]:%d", host, &port) != 2) {
    fprintf(stderr, "bench_redis: expected redis://HOST:PORT\n%s", usage);
    return 2;
  }
  struct timeval tv = {5, 0};
  redisContext *raw = raw_redis = redisConnectWithTimeout(host, port, tv);
  redisContext *dc = redisConnectWithTimeout(host, port, tv);
  if (raw == NULL || raw->err || dc == NULL || dc->err) {
    redisContext *bad = raw == NULL || raw->err ? raw : dc;
    fprintf(stderr, "bench_redis: %s\n", bad ? bad->errstr : "connect");
    redisFree(raw);
    redisFree(dc);
    return 1;
  }
  direct.fd = dc->fd; /* hiredis never reads this one */
  encache *ec;
  encache_store *st;
  if (bench_open("bench_redis", url,
                 "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                 "true}}", &ec, &st) != 0) {
    redisFree(raw);
    redisFree(dc);
    return 1;
  }
  printf("store: %s\n\n", encache_store_url(st));
  rc = run[0] ? bench_reads(ec, st, iters) : 0;
  if (rc == 0 && run[1])
    rc = bench_writes(st, iters);
  if (rc == 0 && run[2])
    rc = bench_check(url, iters);
  if (rc == 0 && run[3])
    rc = bench_overlap_table(ec, st, "(d)", "ov", iters, flags);
  encache_close(ec);
  encache_store_close(st);
  redisFree(raw);
  redisFree(dc);
  return rc != 0;
}
