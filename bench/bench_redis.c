/* SPDX-License-Identifier: Apache-2.0 */
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

/* The raw hiredis connection, the baseline. */
static redisContext *raw_redis;

static const char usage[] =
    "usage: bench_redis redis://HOST:PORT [--iterations N]\n";

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

static int bench_reads(encache *ec, encache_store *st, int iters) {
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  printf("(a) 4 hits: raw hiredis pipelined GETs vs encache lookup\n");
  return bench_hits_table(ec, st, "r", NOBJ, sizes,
                          (int)(sizeof(sizes) / sizeof(sizes[0])), raw_gets, iters);
}

static void bench_writes(encache_store *st, int iters) {
  redisContext *raw = raw_redis;
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
  if (raw == NULL || raw->err) {
    fprintf(stderr, "bench_redis: %s\n", raw ? raw->errstr : "connect");
    return 1;
  }
  encache *ec;
  encache_store *st;
  if (bench_open("bench_redis", url,
                 "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                 "true}}", &ec, &st) != 0) {
    redisFree(raw);
    return 1;
  }
  printf("store: %s\n\n", encache_store_url(st));
  rc = bench_reads(ec, st, iters);
  if (rc == 0)
    bench_writes(st, iters);
  encache_close(ec);
  encache_store_close(st);
  redisFree(raw);
  return rc != 0;
}
