/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_device: CUDA destinations and outputs against plain CUDA copies,
 * in one run, on whatever CUDA runtime ENCACHE_CUDA_LIBRARY (else
 * libcudart.so) gives; without one it says "skipped: no CUDA runtime" and
 * exits 0.  On the fake runtime (tests/fake_cudart.c) the figures time
 * host memcpy and threads: meaningless for a GPU.
 *
 *   bench_device [--store URL] [--iterations N]
 *
 * (a) 4 hits of 1, 8 and 30 MiB looked up into device memory vs a plain
 *     page-locked host-to-device copy of the same bytes (4 cudaMemcpyAsync
 *     and a stream synchronisation): p50, p99 and the ratio plain/lookup
 *     (target >= 0.8 from 8 MiB on shm);
 * (b) encache_publish() of a device output on the caller's thread: p50
 *     and p99 per call (target < 10 us);
 * (c) sustained publication of 1 MiB device outputs vs a plain
 *     device-to-host copy (synchronised) plus a raw Store write.
 * Without --store a private shm segment is created and destroyed.
 */
#include "hits.h"
#include "cuda_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4
#define COLS 1024

static const char usage[] =
    "usage: bench_device [--store URL] [--iterations N]\n";

static const char json[] =
    "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
    "\"store_max_pending_items\": 64, \"store_max_pending_bytes\": "
    "4294967296, \"device_pinned_pool_bytes\": 134217728}}";

static cuda_rt rt;
static void *stream;

static int cuda_ok(int e, const char *what) {
  if (e == 0)
    return 0;
  fprintf(stderr, "bench_device: %s: %s\n", what, rt.error_string(e));
  return -1;
}

/* (a) one size: NOBJ objects in the Store, device destinations. */
typedef struct hits {
  encache *ec;
  size_t nbytes;
  char ids[NOBJ][48];
  void *dev[NOBJ];
  void *pinned;
  encache_candidate c[NOBJ];
  encache_result r[NOBJ];
  bench_pool pool;
  encache_allocator a;
} hits;

static int plain_h2d(void *ctx) {
  hits *h = ctx;
  for (int k = 0; k < NOBJ; k++)
    if (rt.memcpy_async(h->dev[k], (char *)h->pinned + (size_t)k * h->nbytes,
                        h->nbytes, CUDA_RT_H2D, stream) != 0)
      return -1;
  return rt.stream_sync(stream);
}

static int lookup_dev(void *ctx) {
  hits *h = ctx;
  encache_step *step = NULL;
  int rc = bench_lookup(h->ec, &step, h->c, NOBJ, &h->a, h->r);
  encache_step_close(step);
  return rc == NOBJ ? 0 : -1;
}

static int bench_size(encache *ec, encache_store *st, size_t nbytes,
                      int iters) {
  hits h;
  memset(&h, 0, sizeof(h));
  h.ec = ec;
  h.nbytes = nbytes;
  uint64_t rows = nbytes / (COLS * 4);
  int rc = cuda_ok(rt.host_alloc(&h.pinned, NOBJ * nbytes, 0), "cudaHostAlloc");
  for (int k = 0; rc == 0 && k < NOBJ; k++) {
    char key[512];
    snprintf(h.ids[k], sizeof(h.ids[k]), "dev-%zu-%d", nbytes, k);
    encache_key(encache_namespace_of(ec), h.ids[k], key, sizeof(key));
    char *src = (char *)h.pinned + (size_t)k * nbytes;
    memset(src, k + 1, nbytes);
    int w = bench_write_object(st, key, src, rows, COLS);
    rc = (w == 0 || w == ENCACHE_EEXIST) ? 0 : -1;
    if (rc == 0)
      rc = cuda_ok(rt.malloc_(&h.dev[k], nbytes), "cudaMalloc");
    h.c[k] = bench_candidate(h.ids[k], rows, COLS);
    h.c[k].device = ENCACHE_DEVICE_CUDA;
  }
  h.pool.buf = h.dev;
  h.a = (encache_allocator){sizeof(h.a), &h.pool, bench_pool_alloc, NULL, 0};
  measure base, subject;
  if (rc == 0 && (measure_init(&base, iters) < 0 ||
                  measure_init(&subject, iters) < 0))
    rc = -1;
  if (rc == 0 &&
      (rc = measure_pair(&base, plain_h2d, &subject, lookup_dev, &h, 2,
                         iters)) == 0) {
    char label[32];
    measure_size_label(label, sizeof(label), nbytes);
    measure_print_row(label, &base, &subject, (double)NOBJ * nbytes);
  }
  if (rc != 0)
    fprintf(stderr, "bench_device: (a) %zu bytes failed: %s\n", nbytes,
            encache_errmsg(ec));
  measure_free(&base);
  measure_free(&subject);
  for (int k = 0; k < NOBJ; k++)
    if (h.dev[k] != NULL)
      rt.free_(h.dev[k]);
  if (h.pinned != NULL)
    rt.free_host(h.pinned);
  return rc;
}

/* A step with n fresh candidates (misses) named PREFIX-FIRST+K. */
static encache_step *fresh(encache *ec, const char *prefix, int first, int n,
                           char (*ids)[32], uint64_t rows) {
  enum { MAXN = 16 };
  encache_candidate c[MAXN];
  encache_result r[MAXN];
  void *none[MAXN] = {NULL};
  bench_pool pool = {none};
  encache_allocator a = {sizeof(a), &pool, bench_pool_alloc, NULL, 0};
  for (int k = 0; k < n && k < MAXN; k++) {
    snprintf(ids[k], 32, "%s-%d", prefix, first + k);
    c[k] = bench_candidate(ids[k], rows, COLS);
    c[k].device = ENCACHE_DEVICE_CUDA;
  }
  encache_step *step = NULL;
  bench_lookup(ec, &step, c, (size_t)n, &a, r);
  return step;
}

static void no_release(void *ctx) { (void)ctx; }

/* Publishes n outputs of dev (rows x COLS) under fresh ids; adds each
 * call's time to m (when not NULL).  Returns how many were queued. */
static int publish_batch(encache *ec, const char *prefix, int first, int n,
                         void *dev, uint64_t rows, measure *m) {
  char ids[16][32];
  encache_step *step = fresh(ec, prefix, first, n, ids, rows);
  int64_t shape[2] = {(int64_t)rows, COLS};
  encache_tensor v = {.size = sizeof(v), .data = dev,
                      .dtype = ENCACHE_FLOAT32, .ndim = 2, .shape = shape,
                      .device = ENCACHE_DEVICE_CUDA, .stream = stream};
  int queued = 0;
  for (int k = 0; k < n; k++) {
    encache_storage *s = NULL;
    encache_storage_new(dev, rows * COLS * 4, no_release, NULL, &s);
    double t0 = measure_now();
    int rc = bench_publish(step, ids[k], &v, s);
    if (m != NULL)
      measure_add(m, measure_now() - t0);
    queued += rc == ENCACHE_QUEUED;
    encache_storage_unref(s);
  }
  encache_step_close(step);
  return queued;
}

/* (b) the caller's cost per publish call, 1 MiB and 8 MiB outputs. */
static void bench_publish_calls(encache *ec, void *dev, int iters) {
  printf("\n(b) encache_publish() of a device output, caller's thread\n");
  static const uint64_t rows_of[] = {256, 2048};
  for (int s = 0; s < 2; s++) {
    measure m;
    if (measure_init(&m, iters * 8) < 0)
      return;
    int queued = 0;
    for (int i = 0; i < iters; i++) {
      char prefix[32];
      snprintf(prefix, sizeof(prefix), "b%d", s);
      queued += publish_batch(ec, prefix, i * 8, 8, dev, rows_of[s], &m);
      encache_flush(ec);
    }
    char label[32];
    measure_size_label(label, sizeof(label), rows_of[s] * COLS * 4);
    printf("%-8s p50 %.2f us  p99 %.2f us  (%d queued of %d)\n", label,
           measure_pct(&m, 50) * 1e6, measure_pct(&m, 99) * 1e6, queued,
           iters * 8);
    measure_free(&m);
  }
}

/* (c) sustained: plain copy + raw write vs publication, 1 MiB outputs. */
static void bench_sustained(encache *ec, encache_store *st, void *dev,
                            int iters) {
  printf("\n(c) sustained publication of 1 MiB device outputs\n");
  size_t nbytes = 1u << 20;
  uint64_t rows = nbytes / (COLS * 4);
  int total = iters * 8;
  void *host = NULL;
  if (cuda_ok(rt.host_alloc(&host, nbytes, 0), "cudaHostAlloc") < 0)
    return;
  double t0 = measure_now();
  for (int i = 0; i < total; i++) {
    char key[512], id[32];
    snprintf(id, sizeof(id), "c-raw-%d", i);
    encache_key(encache_namespace_of(ec), id, key, sizeof(key));
    rt.memcpy_async(host, dev, nbytes, CUDA_RT_D2H, stream);
    rt.stream_sync(stream);
    bench_write_object(st, key, host, rows, COLS);
  }
  double raw = measure_now() - t0;
  encache_stats s0, s1;
  bench_stats(ec, &s0);
  t0 = measure_now();
  for (int i = 0; i < total; i += 8) {
    publish_batch(ec, "c-eng", i, 8, dev, rows, NULL);
    bench_flush_if_full(ec);
  }
  encache_flush(ec);
  double eng = measure_now() - t0;
  bench_stats(ec, &s1);
  uint64_t written = s1.published_written - s0.published_written;
  printf("plain D2H copy + raw Store write: %.0f objects/s (%.2f GB/s)\n",
         total / raw, measure_gbs((double)total * nbytes, raw));
  printf("engine (lookup + publish + background copy wait and write): %.0f "
         "objects/s (%.2f GB/s), ratio %.2f; %llu written, %llu skipped "
         "for the pool\n", written / eng,
         measure_gbs((double)written * nbytes, eng),
         (written / eng) / (total / raw), (unsigned long long)written,
         (unsigned long long)(s1.device_pool_full - s0.device_pool_full));
  rt.free_host(host);
}

static int run(encache *ec, encache_store *st, int iters) {
  printf("(a) 4 hits into device memory: plain pinned H2D copy vs lookup\n");
  measure_print_header("size", "plain H2D", "lookup", 1);
  static const size_t sizes[] = {1u << 20, 8u << 20, 30u << 20};
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < sizeof(sizes) / sizeof(sizes[0]); i++)
    rc = bench_size(ec, st, sizes[i], iters);
  void *dev = NULL;
  if (rc == 0 &&
      (rc = cuda_ok(rt.malloc_(&dev, 8u << 20), "cudaMalloc")) == 0) {
    void *host = malloc(8u << 20);
    if (host != NULL) { /* outputs of some value */
      memset(host, 7, 8u << 20);
      rt.memcpy_(dev, host, 8u << 20, CUDA_RT_H2D);
      free(host);
    }
    bench_publish_calls(ec, dev, iters);
    bench_sustained(ec, st, dev, iters);
    rt.free_(dev);
  }
  return rc;
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 20;
  int rc = measure_options(argc, argv, usage, 0, &url, &iters, 3);
  if (rc >= 0)
    return rc;
  char why[256];
  if (cuda_rt_load(&rt, why, sizeof(why)) != 0) {
    printf("skipped: no CUDA runtime (%s)\n", why);
    return 0;
  }
  const char *lib = getenv("ENCACHE_CUDA_LIBRARY");
  printf("CUDA runtime: %s, %d device(s)%s\n",
         lib != NULL && lib[0] ? lib : "libcudart.so", rt.devices,
         lib != NULL && strstr(lib, "fakecudart") != NULL
             ? " (the FAKE runtime: host memcpy, figures meaningless for a GPU)"
             : "");
  char own[128] = "", name[64];
  if (url == NULL) {
    snprintf(name, sizeof(name), "encache-benchd-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=640MiB", name);
    url = own;
  }
  encache *ec;
  encache_store *st;
  if (cuda_ok(rt.set_device(0), "cudaSetDevice") < 0 ||
      cuda_ok(rt.stream_create(&stream, 1), "cudaStreamCreateWithFlags") < 0)
    return 1;
  if (bench_open("bench_device", url, json, &ec, &st) != 0) {
    if (own[0])
      encache_shm_destroy(name);
    return 1;
  }
  printf("store: %s\n\n", encache_store_url(st));
  rc = run(ec, st, iters);
  if (encache_close(ec) != 0) {
    fprintf(stderr, "bench_device: close: %s\n", encache_errmsg(ec));
    rc = 1;
  }
  encache_store_close(st);
  rt.stream_destroy(stream);
  if (own[0])
    encache_shm_destroy(name);
  return rc != 0;
}
