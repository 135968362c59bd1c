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
#include <time.h>
#include <unistd.h>

#define NOBJ 4

int main(int argc, char **argv) {
  if (argc < 2 || strncmp(argv[1], "redis://", 8) != 0) {
    fprintf(stderr, "usage: bench_redis redis://HOST:PORT [--iterations N]\n");
    return 2;
  }
  const char *url = argv[1];
  int iters = argc > 3 && strcmp(argv[2], "--iterations") == 0 ? atoi(argv[3]) : 20;
  if (iters < 5)
    iters = 5;
  char host[256];
  int port;
  if (sscanf(url + 8, "%255[^:]:%d", host, &port) != 2) {
    fprintf(stderr, "bench_redis: expected redis://HOST:PORT\n");
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
  encache_options o;
  memset(&o, 0, sizeof(o));
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  encache_store *st = NULL;
  if (encache_open(&o, &ec) != 0 || encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_redis: %s\n", encache_errmsg(ec));
    return 1;
  }
  double *t = malloc(sizeof(double) * (size_t)iters);
  double *u = malloc(sizeof(double) * (size_t)iters);
  printf("store: %s\n\n(a) 4 hits: raw hiredis pipelined GETs vs encache lookup\n",
         url);
  printf("%-8s %10s %10s %12s %12s %8s\n", "object", "raw p50", "raw p99",
         "lookup p50", "lookup p99", "ratio");
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  for (size_t s = 0; s < 3; s++) {
    size_t nbytes = sizes[s], cols = 1024, rows = nbytes / 4 / cols;
    void *pbuf[NOBJ];
    bench_pool p = {pbuf};
    char ids[NOBJ][32], keys[NOBJ][256];
    encache_candidate c[NOBJ];
    encache_result r[NOBJ];
    for (int k = 0; k < NOBJ; k++) {
      pbuf[k] = malloc(nbytes);
      memset(pbuf[k], k + 1, nbytes);
      snprintf(ids[k], sizeof(ids[k]), "r-%zu-%d", nbytes, k);
      encache_key(encache_namespace_of(ec), ids[k], keys[k], sizeof(keys[k]));
      encache_candidate cc = {ids[k], ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                              rows, cols, ENCACHE_DEVICE_HOST, 0};
      c[k] = cc;
      int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
      encache_tensor v = {pbuf[k], ENCACHE_FLOAT32, 2, shape, NULL};
      unsigned char hdr[24];
      encache_header_encode(&v, hdr);
      encache_store_write(st, keys[k], hdr, 24, pbuf[k], nbytes);
    }
    encache_allocator a = {&p, bench_pool_alloc, NULL};
    for (int i = -1; i < iters; i++) { /* i = -1 warms up */
      double t0 = bench_now();
      for (int k = 0; k < NOBJ; k++)
        redisAppendCommand(raw, "GET %s", keys[k]);
      for (int k = 0; k < NOBJ; k++) {
        redisReply *rep;
        if (redisGetReply(raw, (void **)&rep) != REDIS_OK ||
            rep->type != REDIS_REPLY_STRING) {
          fprintf(stderr, "bench_redis: raw GET failed\n");
          return 1;
        }
        freeReplyObject(rep);
      }
      double t1 = bench_now();
      int hits = encache_lookup(ec, c, NOBJ, &a, r);
      double t2 = bench_now();
      if (hits != NOBJ) {
        fprintf(stderr, "bench_redis: %d hits: %s\n", hits, encache_errmsg(ec));
        return 1;
      }
      if (i >= 0) {
        t[i] = t1 - t0;
        u[i] = t2 - t1;
      }
    }
    double r50 = bench_pct(t, iters, 50), r99 = bench_pct(t, iters, 99);
    double l50 = bench_pct(u, iters, 50), l99 = bench_pct(u, iters, 99);
    printf("%-3zu MiB  %8.2fms %8.2fms %10.2fms %10.2fms %8.2f\n", nbytes >> 20,
           r50 * 1e3, r99 * 1e3, l50 * 1e3, l99 * 1e3, r50 / l50);
    for (int k = 0; k < NOBJ; k++) {
      encache_store_remove(st, keys[k]);
      free(pbuf[k]);
    }
  }

  printf("\n(b) writes of 1 MiB objects\n");
  size_t nbytes = 1u << 20;
  int total = iters * 4;
  char *val = malloc(nbytes + 24);
  memset(val, 3, nbytes + 24);
  double t0 = bench_now();
  for (int i = 0; i < total; i++) {
    redisReply *rep = redisCommand(raw, "SET bench-raw-%d-%d %b", (int)getpid(),
                                   i, val, nbytes + 24);
    if (rep)
      freeReplyObject(rep);
  }
  double traw = bench_now() - t0;
  t0 = bench_now();
  for (int i = 0; i < total; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench-enc-%d-%d", (int)getpid(), i);
    encache_store_write(st, key, val, 24, val + 24, nbytes);
  }
  double tenc = bench_now() - t0;
  printf("raw SET: %.0f objects/s; encache write (SET NX, writev): %.0f "
         "objects/s; ratio %.2f\n", total / traw, total / tenc, traw / tenc);
  for (int i = 0; i < total; i++) {
    redisReply *rep = redisCommand(raw, "DEL bench-raw-%d-%d bench-enc-%d-%d",
                                   (int)getpid(), i, (int)getpid(), i);
    if (rep)
      freeReplyObject(rep);
  }
  free(val);
  free(t);
  free(u);
  encache_close(ec);
  encache_store_close(st);
  redisFree(raw);
  return 0;
}
