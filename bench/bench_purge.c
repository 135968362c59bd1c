/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_purge: purging a namespace of a Redis Store, three ways, in one
 * run.
 *
 *   bench_purge redis://HOST:PORT [--iterations N] [--keys K]
 *
 * The database holds K objects of another namespace that stay (the purge
 * scans them too), besides what it held before and, before each purge, K objects of the namespace to
 * purge (64 bytes each, written by raw hiredis, untimed).  Each round
 * times, in rotating order:
 *   list + remove  encache_store_list() of the escaped prefix, then one
 *                  encache_store_remove() per key: the public Store API,
 *                  what encache_store_remove_prefix() does on a Store
 *                  without a remove_prefix of its own;
 *   remove_prefix  encache_store_remove_prefix(): the Redis backend's SCAN
 *                  MATCH + pipelined UNLINK;
 *   redis-cli      `redis-cli --scan --pattern 'NS@id:*' | xargs redis-cli
 *                  unlink`, the operator's shell baseline.
 * After each purge the database must hold exactly the objects that stay.
 * Prints the p50 seconds and keys per second of each, and each against the
 * baseline.
 */
#include "measure.h"

#include "encache.h"

#include <hiredis/hiredis.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: bench_purge redis://HOST:PORT [--iterations N] [--keys K]\n";

static redisContext *raw;
static char host[256], ns[128], keep_ns[128];
static int port;
static long nkeys = 100000;
static long long others; /* keys there before the run */

/* Writes n objects of 64 bytes under namespace ns, pipelined. */
static int fill(const char *space, long n) {
  char val[64];
  memset(val, 7, sizeof(val));
  for (long i = 0; i < n; i++) {
    redisAppendCommand(raw, "SET %s@id:image-%ld %b", space, i, val,
                       sizeof(val));
    if (i % 1000 == 999 || i == n - 1)
      for (long k = i - i % 1000; k <= i; k++) {
        redisReply *r;
        if (redisGetReply(raw, (void **)&r) != REDIS_OK)
          return -1;
        freeReplyObject(r);
      }
  }
  return 0;
}

static long long dbsize(void) {
  redisReply *r = redisCommand(raw, "DBSIZE");
  long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  freeReplyObject(r);
  return n;
}

typedef struct keys {
  char **k;
  size_t n, cap;
} keys;

static int collect(const char *key, uint64_t len, void *arg) {
  (void)len;
  keys *ks = arg;
  if (ks->n == ks->cap) {
    ks->cap = ks->cap ? 2 * ks->cap : 1024;
    char **k = realloc(ks->k, ks->cap * sizeof(*k));
    if (k == NULL)
      return 1;
    ks->k = k;
  }
  return (ks->k[ks->n++] = strdup(key)) == NULL;
}

/* The three ways; each returns the objects it removed, or -1. */
static long long list_remove(encache_store *st, const char *prefix) {
  char pattern[160];
  snprintf(pattern, sizeof(pattern), "%s*", prefix); /* nothing to escape */
  keys ks = {NULL, 0, 0};
  long long done = encache_store_list(st, pattern, collect, &ks) == 0 ? 0 : -1;
  for (size_t i = 0; i < ks.n; i++) {
    if (done >= 0 && encache_store_remove(st, ks.k[i]) == 0)
      done++;
    free(ks.k[i]);
  }
  free(ks.k);
  return done;
}

static long long remove_prefix(encache_store *st, const char *prefix) {
  uint64_t n = 0;
  return encache_store_remove_prefix(st, prefix, &n) == 0 ? (long long)n : -1;
}

static long long redis_cli(encache_store *st, const char *prefix) {
  (void)st;
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "redis-cli -h %s -p %d --scan --pattern '%s*' | "
           "xargs -r redis-cli -h %s -p %d unlink >/dev/null",
           host, port, prefix, host, port);
  return system(cmd) == 0 ? nkeys : -1;
}

typedef long long (*way_fn)(encache_store *st, const char *prefix);
static const struct {
  const char *name;
  way_fn fn;
} ways[] = {{"redis-cli", redis_cli},
            {"list + remove", list_remove},
            {"remove_prefix", remove_prefix}};
#define NWAYS 3

static int round_of(encache_store *st, int r, measure *m) {
  char prefix[160];
  snprintf(prefix, sizeof(prefix), "%s@id:", ns);
  for (int w0 = 0; w0 < NWAYS; w0++) {
    int w = (w0 + r) % NWAYS;
    if (fill(ns, nkeys) != 0 || dbsize() != others + 2 * nkeys) {
      fprintf(stderr, "bench_purge: fill failed\n");
      return 1;
    }
    double t0 = measure_now();
    long long n = ways[w].fn(st, prefix);
    double t = measure_now() - t0;
    if (n != nkeys || dbsize() != others + nkeys) {
      fprintf(stderr, "bench_purge: %s removed %lld of %ld, %lld keys left "
              "(want %lld): %s\n", ways[w].name, n, nkeys, dbsize(),
              others + nkeys, encache_store_errmsg(st));
      return 1;
    }
    measure_add(&m[w], t);
  }
  return 0;
}

static int parse(int argc, char **argv, const char **url, int *iters) {
  /* --keys K is ours; the rest is the benchmarks' common options. */
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--keys") == 0) {
      nkeys = strtol(argv[i + 1], NULL, 10);
      if (nkeys < 1 || nkeys > 10000000) {
        fprintf(stderr, "bench_purge: --keys must be 1..10000000\n%s", usage);
        return 2;
      }
      memmove(argv + i, argv + i + 2, (size_t)(argc - i - 1) * sizeof(char *));
      argc -= 2;
      break;
    }
  int rc = measure_options(argc, argv, usage, 1, url, iters, 1);
  if (rc >= 0)
    return rc;
  if (*url == NULL || strncmp(*url, "redis://", 8) != 0 ||
      sscanf(*url + 8, "%255[^:]:%d", host, &port) != 2) {
    fprintf(stderr, "bench_purge: expected redis://HOST:PORT\n%s", usage);
    return 2;
  }
  return -1;
}

static void report(measure *m, int iters) {
  double base = measure_pct(&m[0], 50);
  printf("purge of %ld keys beside %lld that stay, p50 of %d rounds\n", nkeys,
         nkeys + others, iters);
  printf("%-15s %10s %12s %12s\n", "way", "seconds", "keys/s", "vs redis-cli");
  for (int w = 0; w < NWAYS; w++) {
    double t = measure_pct(&m[w], 50);
    printf("%-15s %10.3f %12.0f %12.2f\n", ways[w].name, t, (double)nkeys / t,
           base / t);
  }
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 3;
  int rc = parse(argc, argv, &url, &iters);
  if (rc >= 0)
    return rc;
  struct timeval tv = {30, 0};
  raw = redisConnectWithTimeout(host, port, tv);
  encache_store *st = NULL;
  if (raw == NULL || raw->err || encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_purge: %s\n",
                raw && !raw->err ? encache_store_errmsg(NULL)
                : raw           ? raw->errstr
                                : "connect");
    return 1;
  }
  snprintf(ns, sizeof(ns), "bench-purge-%d@embedding@model:old", (int)getpid());
  snprintf(keep_ns, sizeof(keep_ns), "bench-purge-%d@embedding@model:new",
           (int)getpid());
  measure m[NWAYS];
  for (int w = 0; w < NWAYS; w++)
    measure_init(&m[w], iters);
  printf("store: %s, %s\n", encache_store_url(st), "redis-cli from PATH");
  others = dbsize();
  rc = others < 0 || fill(keep_ns, nkeys) != 0;
  for (int r = 0; rc == 0 && r < iters; r++)
    rc = round_of(st, r, m);
  if (rc == 0)
    report(m, iters);
  char keep[160];
  snprintf(keep, sizeof(keep), "%s@id:", keep_ns);
  encache_store_remove_prefix(st, keep, NULL);
  for (int w = 0; w < NWAYS; w++)
    measure_free(&m[w]);
  encache_store_close(st);
  redisFree(raw);
  return rc;
}
