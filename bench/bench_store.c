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
 * destinations.  It prints p50 GB/s of each and the ratio store/memcpy
 * (target: >= 0.8 for the shm Store), then the put rate.
 *
 * Without --store it runs twice, on segments with object checksums on
 * (the default) and off, and prints what the checksums cost: each
 * figure with them over the same figure without them.
 */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOBJ 4

/* Times reads of each size and puts on the Store at url: read GB/s in
 * rd_gbs[3], puts in *put_gbs.  Returns 0, or 1 on a Store error. */
static int bench(const char *url, int iters, double rd_gbs[3],
                 double *put_gbs) {
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_store: %s\n", encache_store_errmsg(st));
    return 1;
  }
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  double *t = malloc(sizeof(double) * (size_t)iters);
  printf("store: %s\n", url);
  printf("%-14s %12s %12s %8s %10s %10s\n", "batch", "memcpy GB/s",
         "store GB/s", "ratio", "p50 ms", "p99 ms");
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    void *src[NOBJ], *dst[NOBJ];
    char keys_buf[NOBJ][64];
    const char *keys[NOBJ];
    size_t caps[NOBJ];
    int64_t res[NOBJ];
    for (int k = 0; k < NOBJ; k++) {
      src[k] = malloc(n);
      dst[k] = malloc(n);
      memset(src[k], k + 1, n);
      memset(dst[k], 0, n);
      snprintf(keys_buf[k], sizeof(keys_buf[k]), "bench/%d/%zu/%d",
               (int)getpid(), n, k);
      keys[k] = keys_buf[k];
      caps[k] = n;
      int rc = encache_store_write(st, keys[k], NULL, 0, src[k], n);
      if (rc != 0 && rc != ENCACHE_EEXIST) {
        fprintf(stderr, "bench_store: write: %s\n", encache_store_errmsg(st));
        return 1;
      }
    }
    /* memcpy baseline (warm-up, then timed). */
    for (int k = 0; k < NOBJ; k++)
      memcpy(dst[k], src[k], n);
    for (int i = 0; i < iters; i++) {
      double t0 = bench_now();
      for (int k = 0; k < NOBJ; k++)
        memcpy(dst[k], src[k], n);
      t[i] = bench_now() - t0;
    }
    double mem = bench_pct(t, iters, 50);
    /* Batched store read. */
    encache_store_read(st, keys, NOBJ, dst, caps, res);
    for (int i = 0; i < iters; i++) {
      double t0 = bench_now();
      int rc = encache_store_read(st, keys, NOBJ, dst, caps, res);
      t[i] = bench_now() - t0;
      for (int k = 0; k < NOBJ; k++)
        if (rc != 0 || res[k] != (int64_t)n) {
          fprintf(stderr, "bench_store: read %s: %lld\n", keys[k],
                  (long long)res[k]);
          return 1;
        }
    }
    double rd = bench_pct(t, iters, 50);
    double p99 = bench_pct(t, iters, 99);
    double bytes = (double)n * NOBJ;
    char label[32];
    snprintf(label, sizeof(label), "%d x %zu MiB", NOBJ, n >> 20);
    rd_gbs[s] = bytes / rd / 1e9;
    printf("%-14s %12.2f %12.2f %8.2f %10.3f %10.3f\n", label,
           bytes / mem / 1e9, bytes / rd / 1e9, mem / rd, rd * 1e3,
           p99 * 1e3);
    for (int k = 0; k < NOBJ; k++) {
      encache_store_remove(st, keys[k]);
      free(src[k]);
      free(dst[k]);
    }
  }
  /* Put throughput: 1 MiB objects under fresh keys. */
  size_t n = 1u << 20;
  void *buf = malloc(n);
  memset(buf, 7, n);
  int puts_n = iters * 8;
  double t0 = bench_now();
  for (int i = 0; i < puts_n; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench/put/%d/%d", (int)getpid(), i);
    encache_store_write(st, key, NULL, 0, buf, n);
  }
  double el = bench_now() - t0;
  *put_gbs = (double)n * puts_n / el / 1e9;
  printf("put 1 MiB: %.0f objects/s, %.2f GB/s (memcpy above: the limit)\n",
         puts_n / el, (double)n * puts_n / el / 1e9);
  for (int i = 0; i < puts_n; i++) {
    char key[64];
    snprintf(key, sizeof(key), "bench/put/%d/%d", (int)getpid(), i);
    encache_store_remove(st, key);
  }
  free(buf);
  free(t);
  encache_store_close(st);
  return 0;
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 30;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
      url = argv[++i];
    else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_store [--store URL] [--iterations N]\n");
      return 2;
    }
  }
  if (iters < 3)
    iters = 3;
  double rd[2][3], put[2];
  if (url != NULL)
    return bench(url, iters, rd[0], &put[0]);
  for (int off = 0; off < 2; off++) {
    char name[64], own[128];
    snprintf(name, sizeof(name), "encache-bench-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=512MiB%s", name,
             off ? "&checksum=off" : "");
    int rc = bench(own, iters, rd[off], &put[off]);
    encache_shm_destroy(name);
    if (rc != 0)
      return rc;
  }
  printf("checksums on / off: reads %.2f (1 MiB) %.2f (8 MiB) %.2f (30 MiB), "
         "puts %.2f\n", rd[0][0] / rd[1][0], rd[0][1] / rd[1][1],
         rd[0][2] / rd[1][2], put[0] / put[1]);
  return 0;
}

