/*
 * bench_engine: the engine against the raw Store, in one run.
 *
 *   bench_engine [--store URL] [--iterations N]
 *
 * (a) lookup of 4 hits vs the raw Store's batched read of the same 4
 *     objects into caller buffers, for 16 KiB, 1 MiB, 8 MiB and 30 MiB
 *     objects: p50, p99 and the ratio raw/lookup (target >= 0.9);
 * (b) encache_publish() on the caller's thread: p50/p99 per call for small
 *     and large payloads (target < 5 us, independent of size);
 * (c) sustained publication (publish + background write) vs raw Store
 *     writes of the same objects.
 * Without --store a private shm segment is created and destroyed.
 */
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOBJ 4

static void no_release(void *ctx) { (void)ctx; }

static const char json[] =
    "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
    "\"store_max_pending_items\": 64, \"store_max_pending_bytes\": 4294967296}}";

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 30;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
      url = argv[++i];
    else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_engine [--store URL] [--iterations N]\n");
      return 2;
    }
  }
  if (iters < 5)
    iters = 5;
  char own[128] = "", name[64];
  if (url == NULL) {
    snprintf(name, sizeof(name), "encache-benche-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=768MiB", name);
    url = own;
  }
  char model[64];
  snprintf(model, sizeof(model), "bench/%d", (int)getpid());
  encache_options o;
  memset(&o, 0, sizeof(o));
  o.ec_transfer_config = json;
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  encache_store *st = NULL;
  if (encache_open(&o, &ec) != 0 || encache_store_open(url, &st) != 0) {
    fprintf(stderr, "bench_engine: %s %s\n", encache_errmsg(ec),
            encache_store_errmsg(st));
    return 1;
  }
  double *t = malloc(sizeof(double) * (size_t)iters * 64);
  double *u = malloc(sizeof(double) * (size_t)iters * 64);
  double *wake = malloc(sizeof(double) * (size_t)iters * 2);
  printf("store: %s\n\n(a) 4 hits: raw batched read vs encache lookup\n", url);
  printf("%-10s %10s %10s %12s %12s %8s\n", "object", "raw p50", "raw p99",
         "lookup p50", "lookup p99", "ratio");
  static const size_t sizes[] = {16u << 10, 1u << 20, 8u << 20, 30u << 20};
  for (size_t s = 0; s < 4; s++) {
    size_t nbytes = sizes[s], cols = 1024, rows = nbytes / 4 / cols;
    if (rows == 0)
      rows = 1, cols = nbytes / 4;
    void *pbuf[NOBJ];
    bench_pool p = {pbuf};
    char ids[NOBJ][32], keys[NOBJ][256];
    const char *kp[NOBJ];
    void *raw[NOBJ];
    size_t caps[NOBJ];
    int64_t res[NOBJ];
    encache_candidate c[NOBJ];
    encache_result r[NOBJ];
    for (int k = 0; k < NOBJ; k++) {
      pbuf[k] = malloc(nbytes);
      raw[k] = malloc(nbytes + 24);
      memset(pbuf[k], 1, nbytes);
      memset(raw[k], 1, nbytes + 24);
      snprintf(ids[k], sizeof(ids[k]), "a-%zu-%d", nbytes, k);
      encache_key(encache_namespace_of(ec), ids[k], keys[k], sizeof(keys[k]));
      kp[k] = keys[k];
      caps[k] = nbytes + 24;
      encache_candidate cc = {ids[k], ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                              rows, cols, ENCACHE_DEVICE_HOST, 0};
      c[k] = cc;
      /* The object, written as the engine would. */
      int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
      encache_tensor v = {pbuf[k], ENCACHE_FLOAT32, 2, shape, NULL};
      unsigned char hdr[24];
      encache_header_encode(&v, hdr);
      encache_store_write(st, keys[k], hdr, 24, pbuf[k], nbytes);
    }
    encache_allocator a = {&p, bench_pool_alloc, NULL};
    encache_store_read(st, kp, NOBJ, raw, caps, res);
    encache_lookup(ec, c, NOBJ, &a, r);
    for (int i = 0; i < iters; i++) {
      double t0 = bench_now();
      int rc = encache_store_read(st, kp, NOBJ, raw, caps, res);
      t[i] = bench_now() - t0;
      t0 = bench_now();
      int hits = encache_lookup(ec, c, NOBJ, &a, r);
      u[i] = bench_now() - t0;
      if (rc != 0 || hits != NOBJ) {
        fprintf(stderr, "bench_engine: read %d, hits %d: %s\n", rc, hits,
                encache_errmsg(ec));
        return 1;
      }
    }
    double raw50 = bench_pct(t, iters, 50), raw99 = bench_pct(t, iters, 99);
    double lk50 = bench_pct(u, iters, 50), lk99 = bench_pct(u, iters, 99);
    char label[16];
    snprintf(label, sizeof(label), nbytes < (1u << 20) ? "%zu KiB" : "%zu MiB",
             nbytes < (1u << 20) ? nbytes >> 10 : nbytes >> 20);
    printf("%-10s %8.3fms %8.3fms %10.3fms %10.3fms %8.2f\n", label,
           raw50 * 1e3, raw99 * 1e3, lk50 * 1e3, lk99 * 1e3, raw50 / lk50);
    for (int k = 0; k < NOBJ; k++) {
      encache_store_remove(st, keys[k]);
      free(pbuf[k]);
      free(raw[k]);
    }
  }

  printf("\n(b) encache_publish() on the caller's thread, per call\n");
  printf("%-10s %10s %10s %10s\n", "payload", "p50", "p90", "p99");
  static const size_t psizes[] = {16u << 10, 30u << 20};
  int serial = 0;
  for (size_t s = 0; s < 2; s++) {
    size_t nbytes = psizes[s], cols = 1024, rows = nbytes / 4 / cols;
    void *data = calloc(1, nbytes);
    int calls = 0, wakes = 0;
    for (int round = 0; round < iters; round++) {
      enum { B = 32 };
      char ids[B][32];
      encache_candidate c[B];
      encache_result r[B];
      bench_pool dummy = {NULL};
      encache_allocator a = {&dummy, bench_pool_alloc, NULL};
      for (int k = 0; k < B; k++) {
        snprintf(ids[k], sizeof(ids[k]), "b-%d", serial++);
        encache_candidate cc = {ids[k], ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                                rows, cols, ENCACHE_DEVICE_HOST, 0};
        c[k] = cc;
      }
      encache_lookup(ec, c, B, &a, r); /* all miss: they become candidates */
      encache_storage *stg = NULL;
      encache_storage_new(data, nbytes, no_release, NULL, &stg);
      int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
      for (int k = 0; k < B; k++) {
        /* Views of one storage: the budget charges it once. */
        encache_tensor v = {data, ENCACHE_FLOAT32, 2, shape, NULL};
        double t0 = bench_now();
        int q = encache_publish(ec, ids[k], &v, stg);
        double dt = bench_now() - t0;
        t[calls++] = dt;
        if (k == 0)
          wake[wakes++] = dt; /* the call that wakes the idle worker */
        if (q != ENCACHE_QUEUED) {
          fprintf(stderr, "bench_engine: publish: %s\n", encache_skip_name(q));
          return 1;
        }
      }
      encache_storage_unref(stg);
      encache_flush(ec);
      if (round >= 9 && nbytes > (1u << 20))
        break; /* 30 MiB objects: enough calls, spare the segment */
    }
    char label[16];
    snprintf(label, sizeof(label), nbytes < (1u << 20) ? "%zu KiB" : "%zu MiB",
             nbytes < (1u << 20) ? nbytes >> 10 : nbytes >> 20);
    printf("%-10s %8.2fus %8.2fus %8.2fus  (%d calls; first of each burst, "
           "which wakes the idle worker: p50 %.2fus)\n", label,
           bench_pct(t, calls, 50) * 1e6, bench_pct(t, calls, 90) * 1e6,
           bench_pct(t, calls, 99) * 1e6, calls, bench_pct(wake, wakes, 50) * 1e6);
    free(data);
  }

  printf("\n(c) sustained publication of 1 MiB objects\n");
  {
    size_t nbytes = 1u << 20, rows = 256, cols = 1024;
    int total = iters * 16;
    void *data = calloc(1, nbytes);
    unsigned char hdr[24];
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    encache_tensor v = {data, ENCACHE_FLOAT32, 2, shape, NULL};
    encache_header_encode(&v, hdr);
    double t0 = bench_now();
    for (int i = 0; i < total; i++) {
      char key[256], id[32];
      snprintf(id, sizeof(id), "c-raw-%d", i);
      encache_key(encache_namespace_of(ec), id, key, sizeof(key));
      encache_store_write(st, key, hdr, 24, data, nbytes);
    }
    double raw = bench_now() - t0;
    encache_stats s0, s1;
    encache_stats_get(ec, &s0);
    /* Steps of 16 new outputs; when the queue nears the item budget the
     * step waits for the worker, so that the figure is what the worker
     * sustains, not what the budget sheds. */
    t0 = bench_now();
    for (int i = 0; i < total; i += 16) {
      enum { B = 16 };
      char ids[B][32];
      encache_candidate c[B];
      encache_result r[B];
      bench_pool dummy = {NULL};
      encache_allocator a = {&dummy, bench_pool_alloc, NULL};
      for (int k = 0; k < B; k++) {
        snprintf(ids[k], sizeof(ids[k]), "c-eng-%d", i + k);
        encache_candidate cc = {ids[k], ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                                rows, cols, ENCACHE_DEVICE_HOST, 0};
        c[k] = cc;
      }
      encache_lookup(ec, c, B, &a, r);
      for (int k = 0; k < B; k++) {
        encache_storage *stg = NULL;
        encache_storage_new(data, nbytes, no_release, NULL, &stg);
        encache_publish(ec, ids[k], &v, stg);
        encache_storage_unref(stg);
      }
      encache_stats now_s;
      encache_stats_get(ec, &now_s);
      if (now_s.pending_items > 40)
        encache_flush(ec);
    }
    encache_flush(ec);
    double eng = bench_now() - t0;
    encache_stats_get(ec, &s1);
    uint64_t written = s1.published_written - s0.published_written;
    uint64_t skipped = 0;
    for (int k = 0; k < ENCACHE_SKIP_COUNT_; k++)
      skipped += s1.published_skipped[k] - s0.published_skipped[k];
    printf("raw Store writes: %.0f objects/s (%.2f GB/s)\n", total / raw,
           (double)total * nbytes / raw / 1e9);
    printf("engine (lookup + publish + background write): %.0f objects/s "
           "(%.2f GB/s), ratio %.2f; %llu written, %llu skipped\n",
           written / eng, (double)written * nbytes / eng / 1e9,
           (written / eng) / (total / raw), (unsigned long long)written,
           (unsigned long long)skipped);
    free(data);
  }
  free(t);
  free(u);
  free(wake);
  encache_close(ec);
  encache_store_close(st);
  if (own[0])
    encache_shm_destroy(name);
  return 0;
}
