/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_store: a batched Store read against a plain memcpy of the same
 * bytes, measured in one run, and put throughput.
 *
 *   bench_store [--store URL] [--iterations N]
 *
 * Without --store, a private shm segment is created and destroyed.  For
 * each object size (1, 8, 30 MiB) it writes 4 objects, then times N
 * batched reads of the 4 into warm caller buffers, and N memcpy of the
 * same 4 x size bytes from warm private buffers into the same
 * destinations.  It prints p50 and p99 of each, their GB/s and the ratio
 * memcpy/store (target: >= 0.8 for the shm Store), then the put rate.
 *
 * Without --store it runs twice, on segments with object checksums on
 * (the default) and off, and prints what the checksums cost: each
 * figure with them over the same figure without them.
 */
#include "measure.h"

#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4

static const char usage[] =
    "usage: bench_store [--store URL] [--iterations N]\n";

/* NOBJ objects of one size: copied from src, or read from the Store. */
typedef struct batch {
  encache_store *st;
  size_t n;
  void *src[NOBJ], *dst[NOBJ];
  char keys_buf[NOBJ][64];
  const char *keys[NOBJ];
  size_t caps[NOBJ];
  int64_t res[NOBJ];
} batch;

static int copy(void *ctx) {
  batch *b = ctx;
  for (int k = 0; k < NOBJ; k++)
    memcpy(b->dst[k], b->src[k], b->n);
  return 0;
}

static int read_batch(void *ctx) {
  batch *b = ctx;
  int rc = encache_store_read(b->st, b->keys, NOBJ, b->dst, b->caps, b->res);
  for (int k = 0; k < NOBJ; k++)
    if (rc != 0 || b->res[k] != (int64_t)b->n) {
      fprintf(stderr, "bench_store: read %s: %lld\n", b->keys[k],
              (long long)b->res[k]);
      return 1;
    }
  return 0;
}

/* Writes the batch's objects; 0 or 1. */
static int batch_fill(batch *b, encache_store *st, size_t n) {
  memset(b, 0, sizeof(*b));
  b->st = st;
  b->n = n;
  for (int k = 0; k < NOBJ; k++) {
    b->src[k] = malloc(n);
    b->dst[k] = malloc(n);
    memset(b->src[k], k + 1, n);
    memset(b->dst[k], 0, n);
    snprintf(b->keys_buf[k], sizeof(b->keys_buf[k]), "bench/%d/%zu/%d",
             (int)getpid(), n, k);
    b->keys[k] = b->keys_buf[k];
    b->caps[k] = n;
    int rc = encache_store_write(st, b->keys[k], NULL, 0, b->src[k], n);
    if (rc != 0 && rc != ENCACHE_EEXIST) {
      fprintf(stderr, "bench_store: write: %s\n", encache_store_errmsg(st));
      return 1;
    }
  }
  return 0;
}

static void batch_drop(batch *b) {
  for (int k = 0; k < NOBJ; k++) {
    encache_store_remove(b->st, b->keys[k]);
    free(b->src[k]);
    free(b->dst[k]);
  }
}

/* Put throughput: 1 MiB objects under fresh keys; returns GB/s. */
static double bench_puts(encache_store *st, int iters) {
  size_t n = 1u << 20;
  void *buf = malloc(n);
  memset(buf, 7, n);
  int puts_n = iters * 8;
  double t0 = measure_now();
  for (int i = 0; i < puts_n; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench/put/%d/%d", (int)getpid(), i);
    encache_store_write(st, key, NULL, 0, buf, n);
  }
  double el = measure_now() - t0;
  double gbs = measure_gbs((double)n * puts_n, el);
  /* The baseline: as many 1 MiB copies into a 64 MiB region in turn (a
   * put copies into a ring much larger than the caches). */
  enum { RING = 64 };
  unsigned char *ring = malloc((size_t)RING * n);
  double mem_gbs = 0;
  if (ring != NULL) {
    memset(ring, 1, (size_t)RING * n);
    double m0 = measure_now();
    for (int i = 0; i < puts_n; i++)
      memcpy(ring + (size_t)(i % RING) * n, buf, n);
    mem_gbs = measure_gbs((double)n * puts_n, measure_now() - m0);
    free(ring);
  }
  printf("put 1 MiB: %.0f objects/s, %.2f GB/s; memcpy of as many 1 MiB "
         "blocks: %.2f GB/s; ratio %.2f\n", puts_n / el, gbs, mem_gbs,
         mem_gbs > 0 ? gbs / mem_gbs : 0);
  for (int i = 0; i < puts_n; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench/put/%d/%d", (int)getpid(), i);
    encache_store_remove(st, key);
  }
  free(buf);
  return gbs;
}

/* Times reads of each size and puts on the Store at url: read GB/s in
 * rd_gbs[3], puts in *put_gbs.  Returns 0, or 1 on a Store error. */
static int bench(const char *url, int iters, double rd_gbs[3],
                 double *put_gbs) {
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_store: %s\n", encache_store_errmsg(NULL));
    return 1;
  }
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  measure mem, rd;
  measure_init(&mem, iters);
  measure_init(&rd, iters);
  printf("store: %s\n", encache_store_url(st));
  measure_print_header("batch", "memcpy", "store", 1);
  int rc = 0;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]) && rc == 0; s++) {
    static batch b;
    rc = batch_fill(&b, st, sizes[s]);
    /* memcpy, then the batched read of the same bytes (one warm-up). */
    measure_clear(&mem);
    measure_clear(&rd);
    if (rc == 0)
      rc = measure_pair(&mem, copy, NULL, NULL, &b, 1, iters);
    if (rc == 0)
      rc = measure_pair(&rd, read_batch, NULL, NULL, &b, 1, iters);
    if (rc == 0) {
      char label[32];
      snprintf(label, sizeof(label), "%d x %zu MiB", NOBJ, sizes[s] >> 20);
      measure_print_row(label, &mem, &rd, (double)sizes[s] * NOBJ);
      rd_gbs[s] = measure_gbs((double)sizes[s] * NOBJ, measure_pct(&rd, 50));
    }
    batch_drop(&b);
  }
  if (rc == 0)
    *put_gbs = bench_puts(st, iters);
  measure_free(&mem);
  measure_free(&rd);
  encache_store_close(st);
  return rc;
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 30;
  int rc = measure_options(argc, argv, usage, 0, &url, &iters, 3);
  if (rc >= 0)
    return rc;
  double rd[2][3], put[2];
  if (url != NULL)
    return bench(url, iters, rd[0], &put[0]);
  for (int off = 0; off < 2; off++) {
    char name[64], own[128];
    snprintf(name, sizeof(name), "encache-bench-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=512MiB%s", name,
             off ? "&checksum=off" : "");
    rc = bench(own, iters, rd[off], &put[off]);
    encache_shm_destroy(name);
    if (rc != 0)
      return rc;
  }
  printf("checksums on / off: reads %.2f (1 MiB) %.2f (8 MiB) %.2f (30 MiB), "
         "puts %.2f\n", rd[0][0] / rd[1][0], rd[0][1] / rd[1][1],
         rd[0][2] / rd[1][2], put[0] / put[1]);
  return 0;
}
