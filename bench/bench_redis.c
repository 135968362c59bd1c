/*
 * bench_redis: the Redis Store against raw hiredis, in one run.
 *
 *   bench_redis redis://HOST:PORT [--iterations N]
 *
 * (a) 4 objects of 1, 8 and 30 MiB: raw hiredis pipelined GETs (reply
 *     objects, as any hiredis program gets them) vs an encache lookup of
 *     the same 4 hits through the Redis Store; p50, p99 and the ratio
 *     raw/lookup (target >= 0.9);
 * (b) writes of 1 MiB objects: raw hiredis SET vs the Store's write (SET NX
 *     with writev from the caller's buffers).
 */
#include "bench_common.h"

#include <hiredis/hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4

static const char usage[] =
    "usage: bench_redis redis://HOST:PORT [--iterations N]\n";

/* (a): NOBJ objects of one size, fetched by raw GETs and looked up. */
typedef struct hits {
  redisContext *raw;
  encache *ec;
  char ids[NOBJ][32], keys[NOBJ][256];
  void *pbuf[NOBJ];
  encache_candidate c[NOBJ];
  encache_result r[NOBJ];
  bench_pool pool;
  encache_allocator a;
} hits;

static int raw_gets(void *ctx) {
  hits *h = ctx;
  for (int k = 0; k < NOBJ; k++)
    redisAppendCommand(h->raw, "GET %s", h->keys[k]);
  for (int k = 0; k < NOBJ; k++) {
    redisReply *rep;
    if (redisGetReply(h->raw, (void **)&rep) != REDIS_OK ||
        rep->type != REDIS_REPLY_STRING) {
      fprintf(stderr, "bench_redis: raw GET failed\n");
      return 1;
    }
    freeReplyObject(rep);
  }
  return 0;
}

static int lookup(void *ctx) {
  hits *h = ctx;
  int n = bench_lookup(h->ec, h->c, NOBJ, &h->a, h->r);
  if (n != NOBJ)
    fprintf(stderr, "bench_redis: %d hits: %s\n", n, encache_errmsg(h->ec));
  return n != NOBJ;
}

static int bench_hits(redisContext *raw, encache *ec, encache_store *st,
                      int iters) {
  measure t, u;
  measure_init(&t, iters);
  measure_init(&u, iters);
  printf("(a) 4 hits: raw hiredis pipelined GETs vs encache lookup\n");
  measure_print_header("object", "raw", "lookup", 0);
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  int rc = 0;
  for (size_t s = 0; s < 3 && rc == 0; s++) {
    size_t nbytes = sizes[s], cols = 1024, rows = nbytes / 4 / cols;
    static hits h;
    memset(&h, 0, sizeof(h));
    h.raw = raw, h.ec = ec;
    for (int k = 0; k < NOBJ; k++) {
      h.pbuf[k] = malloc(nbytes);
      memset(h.pbuf[k], k + 1, nbytes);
      snprintf(h.ids[k], sizeof(h.ids[k]), "r-%zu-%d", nbytes, k);
      encache_key(encache_namespace_of(ec), h.ids[k], h.keys[k],
                  sizeof(h.keys[k]));
      h.c[k] = bench_candidate(h.ids[k], rows, cols);
      bench_write_object(st, h.keys[k], h.pbuf[k], rows, cols);
    }
    h.pool.buf = h.pbuf;
    encache_allocator a = {&h.pool, bench_pool_alloc, NULL};
    h.a = a;
    measure_clear(&t);
    measure_clear(&u);
    rc = measure_pair(&t, raw_gets, &u, lookup, &h, 1, iters);
    char label[16];
    measure_size_label(label, sizeof(label), nbytes);
    if (rc == 0)
      measure_print_row(label, &t, &u, 0);
    for (int k = 0; k < NOBJ; k++) {
      encache_store_remove(st, h.keys[k]);
      free(h.pbuf[k]);
    }
  }
  measure_free(&t);
  measure_free(&u);
  return rc;
}

static void bench_writes(redisContext *raw, encache_store *st, int iters) {
  printf("\n(b) writes of 1 MiB objects\n");
  size_t nbytes = 1u << 20;
  int total = iters * 4;
  char *val = malloc(nbytes + 24);
  memset(val, 3, nbytes + 24);
  double t0 = measure_now();
  for (int i = 0; i < total; i++) {
    redisReply *rep = redisCommand(raw, "SET bench-raw-%d-%d %b", (int)getpid(),
                                   i, val, nbytes + 24);
    if (rep)
      freeReplyObject(rep);
  }
  double traw = measure_now() - t0;
  t0 = measure_now();
  for (int i = 0; i < total; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench-enc-%d-%d", (int)getpid(), i);
    encache_store_write(st, key, val, 24, val + 24, nbytes);
  }
  double tenc = measure_now() - t0;
  printf("raw SET: %.0f objects/s; encache write (SET NX, writev): %.0f "
         "objects/s; ratio %.2f\n", total / traw, total / tenc, traw / tenc);
  for (int i = 0; i < total; i++) {
    redisReply *rep = redisCommand(raw, "DEL bench-raw-%d-%d bench-enc-%d-%d",
                                   (int)getpid(), i, (int)getpid(), i);
    if (rep)
      freeReplyObject(rep);
  }
  free(val);
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 20;
  int rc = measure_options(argc, argv, usage, 1, &url, &iters, 5);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  char host[256];
  int port;
  if (url == NULL || strncmp(url, "redis://", 8) != 0 ||
      sscanf(url + 8, "%255[^:]:%d", host, &port) != 2) {
    fprintf(stderr, "bench_redis: expected redis://HOST:PORT\n%s", usage);
    return 2;
  }
  struct timeval tv = {5, 0};
  redisContext *raw = redisConnectWithTimeout(host, port, tv);
  if (raw == NULL || raw->err) {
    fprintf(stderr, "bench_redis: %s\n", raw ? raw->errstr : "connect");
    return 1;
  }
  char model[64];
  snprintf(model, sizeof(model), "bench/%d", (int)getpid());
  encache *ec = NULL;
  encache_store *st = NULL;
  if (bench_open(url, model,
                 "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                 "true}}", &ec) != 0 ||
      encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_redis: %s\n", encache_errmsg(ec));
    return 1;
  }
  printf("store: %s\n\n", url);
  rc = bench_hits(raw, ec, st, iters);
  if (rc == 0)
    bench_writes(raw, st, iters);
  encache_close(ec);
  encache_store_close(st);
  redisFree(raw);
  return rc != 0;
}
