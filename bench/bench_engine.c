/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_engine: the engine against the raw Store, in one run.
 *
 *   bench_engine [--store URL] [--iterations N] [--overlap] [--sleep] [--pin]
 *
 * (a) lookup of 4 hits vs the raw Store's batched read of the same 4
 *     objects into caller buffers, for 16 KiB, 1 MiB, 8 MiB and 30 MiB
 *     objects: p50, p99 and the ratio raw/lookup (target >= 0.9);
 * (b) encache_publish() on the caller's thread: p50/p99 per call for small
 *     and large payloads (target < 5 us, independent of size);
 * (c) sustained publication (publish + background write) vs raw Store
 *     writes of the same objects;
 * (d) single flight: the miss path (lookup, publish, write) with and
 *     without leases, on a Store that has them;
 * (e) fleet statistics (added in 1.3): a lookup of one 16 KiB hit by a
 *     handle that publishes into a statistics registry vs one with
 *     stats_segment off (its counters in its own memory, no clock read);
 * (f) lookups that do not wait (issue 29): 4 hits of 1 MiB and 8 MiB, the
 *     step loop with encache_lookup_start() overlapping a compute of C =
 *     0.5, 1 and 2 x the read time R against the blocking loop, and a
 *     lookup started and waited at once against encache_lookup()
 *     (bench_overlap_table(), overlap.h; goals <= 1.1 x max(C, R) and
 *     <= 1.05).  --overlap runs only (f); --sleep: the compute sleeps
 *     instead of spinning (its core left free); --pin: this thread on
 *     one CPU, the handle's threads on the others (measure_pin_threads()).
 * Without --store a private shm segment is created and destroyed.
 */
#include "hits.h"
#include "overlap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NOBJ 4

static const char usage[] =
    "usage: bench_engine [--store URL] [--iterations N] [--overlap] "
    "[--sleep] [--pin]\n";

static void no_release(void *ctx) { (void)ctx; }

static const char json[] =
    "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
    "\"store_max_pending_items\": 64, \"store_max_pending_bytes\": 4294967296}}";

/* (a): NOBJ objects of each size, read raw and looked up. */
static int bench_reads(encache *ec, encache_store *st, int iters) {
  static const size_t sizes[] = {16u << 10, 1u << 20, 8u << 20, 30u << 20};
  printf("(a) 4 hits: raw batched read vs encache lookup\n");
  return bench_hits_table(ec, st, "a", NOBJ, sizes,
                          (int)(sizeof(sizes) / sizeof(sizes[0])), bench_hits_read, iters);
}

/* Looks up n fresh ids (all miss) in a new step, so that they may be
 * published on it; the caller closes the step. */
static encache_step *make_candidates(encache *ec, const char *prefix,
                                     int first, int n, char (*ids)[32],
                                     encache_candidate *c, encache_result *r,
                                     uint64_t rows, uint64_t cols) {
  bench_pool dummy = {NULL};
  encache_allocator a = {sizeof(a), &dummy, bench_pool_alloc, NULL, 0};
  for (int k = 0; k < n; k++) {
    snprintf(ids[k], 32, "%s-%d", prefix, first + k);
    c[k] = bench_candidate(ids[k], rows, cols);
  }
  encache_step *step = NULL;
  bench_lookup(ec, &step, c, (size_t)n, &a, r);
  return step;
}

/* (b) for one payload size; returns 0 or 1. */
static int bench_publish_calls(encache *ec, size_t nbytes, int iters,
                               int *serial, measure *t, measure *wake) {
  enum { B = 32 };
  size_t cols = 1024, rows = nbytes / 4 / cols;
  void *data = calloc(1, nbytes);
  measure_clear(t);
  measure_clear(wake);
  for (int round = 0; round < iters; round++) {
    char ids[B][32];
    encache_candidate c[B];
    encache_result r[B];
    encache_step *step = make_candidates(ec, "b", *serial, B, ids, c, r, rows,
                                         cols);
    *serial += B;
    encache_storage *stg = NULL;
    encache_storage_new(data, nbytes, no_release, NULL, &stg);
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    for (int k = 0; k < B; k++) {
      /* Views of one storage: the budget charges it once. */
      encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
      double t0 = measure_now();
      int q = bench_publish(step, ids[k], &v, stg);
      double dt = measure_now() - t0;
      measure_add(t, dt);
      if (k == 0)
        measure_add(wake, dt); /* the call that wakes the idle worker */
      if (q != ENCACHE_QUEUED) {
        fprintf(stderr, "bench_engine: publish: %s\n", encache_skip_name(q));
        encache_step_close(step);
        free(data);
        return 1;
      }
    }
    encache_storage_unref(stg);
    encache_step_close(step);
    encache_flush(ec);
    if (round >= 9 && nbytes > (1u << 20))
      break; /* 30 MiB objects: enough calls, spare the segment */
  }
  char label[16];
  measure_size_label(label, sizeof(label), nbytes);
  int calls = t->n;
  printf("%-10s %8.2fus %8.2fus %8.2fus  (%d calls; first of each burst, "
         "which wakes the idle worker: p50 %.2fus)\n", label,
         measure_pct(t, 50) * 1e6, measure_pct(t, 90) * 1e6,
         measure_pct(t, 99) * 1e6, calls, measure_pct(wake, 50) * 1e6);
  free(data);
  return 0;
}

static int bench_publish_per_call(encache *ec, int iters) {
  measure t, wake;
  measure_init(&t, iters * 32);
  measure_init(&wake, iters);
  printf("\n(b) encache_publish() on the caller's thread, per call\n");
  printf("%-10s %10s %10s %10s\n", "payload", "p50", "p90", "p99");
  int serial = 0, rc = bench_publish_calls(ec, 16u << 10, iters, &serial, &t,
                                           &wake);
  if (rc == 0)
    rc = bench_publish_calls(ec, 30u << 20, iters, &serial, &t, &wake);
  measure_free(&t);
  measure_free(&wake);
  return rc;
}

/* (c): raw Store writes, then the engine's publication of as many. */
static void bench_sustained(encache *ec, encache_store *st, int iters) {
  printf("\n(c) sustained publication of 1 MiB objects\n");
  size_t nbytes = 1u << 20, rows = 256, cols = 1024;
  int total = iters * 16;
  void *data = calloc(1, nbytes);
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  double t0 = measure_now();
  for (int i = 0; i < total; i++) {
    char key[256], id[32];
    snprintf(id, sizeof(id), "c-raw-%d", i);
    encache_key(encache_namespace_of(ec), id, key, sizeof(key));
    bench_write_object(st, key, data, rows, cols);
  }
  double raw = measure_now() - t0;
  encache_stats s0, s1;
  bench_stats(ec, &s0);
  uint64_t written;
  double eng = bench_publish_sustained(ec, "c-eng", 0, total, &v, data,
                                       nbytes, &written);
  bench_stats(ec, &s1);
  uint64_t skipped = 0;
  for (int k = 0; k < ENCACHE_SKIP_COUNT_; k++)
    skipped += s1.published_skipped[k] - s0.published_skipped[k];
  printf("raw Store writes: %.0f objects/s (%.2f GB/s)\n", total / raw,
         measure_gbs((double)total * nbytes, raw));
  printf("engine (lookup + publish + background write): %.0f objects/s "
         "(%.2f GB/s), ratio %.2f; %llu written, %llu skipped\n",
         written / eng, measure_gbs((double)written * nbytes, eng),
         (written / eng) / (total / raw), (unsigned long long)written,
         (unsigned long long)skipped);
  free(data);
}

/* One miss path on ec: a step, a lookup of 4 new ids (misses), their 4
 * publications, the step closed, the writes flushed.  Adds the lookup's
 * time to look and the whole path's to path. */
static void miss_path(encache *ec, const char *prefix, int round, void *data,
                      measure *look, measure *path) {
  enum { N = 4 };
  char ids[N][32];
  encache_candidate c[N];
  encache_result r[N];
  int64_t shape[2] = {4, 1024};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  double t0 = measure_now();
  encache_step *step = make_candidates(ec, prefix, round * N, N, ids, c, r,
                                       4, 1024);
  measure_add(look, measure_now() - t0);
  encache_storage *stg = NULL;
  encache_storage_new(data, 16u << 10, no_release, NULL, &stg);
  for (int k = 0; k < N; k++)
    bench_publish(step, ids[k], &v, stg);
  encache_storage_unref(stg);
  encache_step_close(step);
  encache_flush(ec);
  measure_add(path, measure_now() - t0);
}

/* (d): the miss path without and with single flight, rounds alternating
 * on two handles of the same Store. */
static void bench_flight(const char *url, encache *off, encache_store *st,
                         int iters) {
  printf("\n(d) single flight: a step of 4 misses of 16 KiB (lookup, "
         "publish, write)\n");
  if (!(encache_store_caps_of(st) & ENCACHE_STORE_CAP_LEASE)) {
    printf("skipped: this Store has no leases\n");
    return;
  }
  static const char flight_json[] =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
      "\"single_flight\": true}}";
  encache *on;
  encache_store *st2;
  if (bench_open("bench_engine", url, flight_json, &on, &st2) != 0)
    return;
  encache_store_close(st2);
  int rounds = iters * 10;
  measure look[2], path[2];
  for (int k = 0; k < 2; k++) {
    measure_init(&look[k], rounds);
    measure_init(&path[k], rounds);
  }
  void *data = calloc(1, 16u << 10);
  for (int i = 0; i < rounds; i++) {
    miss_path(off, "d-off", i, data, &look[0], &path[0]);
    miss_path(on, "d-on", i, data, &look[1], &path[1]);
  }
  double l0 = measure_pct(&look[0], 50), l1 = measure_pct(&look[1], 50);
  double p0 = measure_pct(&path[0], 50), p1 = measure_pct(&path[1], 50);
  printf("%-22s %12s %12s\n", "p50", "off", "on");
  printf("%-22s %10.1fus %10.1fus  (x%.2f)\n", "lookup of 4 misses",
         l0 * 1e6, l1 * 1e6, l1 / l0);
  printf("%-22s %10.1fus %10.1fus  (x%.2f)\n", "whole miss path", p0 * 1e6,
         p1 * 1e6, p1 / p0);
  /* The lookup's difference is the stable figure; the whole path's also
   * holds the worker's wake-ups and the flush, which vary more than the
   * drop it adds. */
  printf("lease cost at the lookup: %.1fus per miss (the take and the "
         "re-check), %.2f%% of a miss path with a 10 ms encode per image\n",
         (l1 - l0) / 4 * 1e6, 100.0 * (l1 - l0) / (p0 + 4 * 0.010));
  printf("whole path: %+.1fus per miss (with the drop after the write; "
         "noisy: it holds the worker's wake-ups)\n", (p1 - p0) / 4 * 1e6);
  free(data);
  for (int k = 0; k < 2; k++) {
    measure_free(&look[k]);
    measure_free(&path[k]);
  }
  encache_close(on);
}

/* One lookup of id (a hit) in a new step: its time. */
static double one_hit(encache *ec, const char *id, void *buf) {
  encache_candidate c = bench_candidate(id, 4, 1024);
  encache_result r;
  void *bufs[1] = {buf};
  bench_pool pool = {bufs};
  encache_allocator a = {sizeof(a), &pool, bench_pool_alloc, NULL, 0};
  encache_step *step = NULL;
  double t0 = measure_now();
  bench_lookup(ec, &step, &c, 1, &a, &r);
  double t = measure_now() - t0;
  encache_step_close(step);
  return t;
}

/* (e): rounds alternating on two handles of the same Store and namespace,
 * one publishing into a private registry, one with stats_segment off. */
static void bench_fleet(const char *url, int iters) {
  char js[2][256], reg[64];
  snprintf(reg, sizeof(reg), "encache.bench-%d", (int)getpid());
  encache *h[2] = {NULL, NULL};
  encache_store *st[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    snprintf(js[k], sizeof(js[k]), "{\"ec_connector_extra_config\": {"
             "\"cross_encoder_cache\": true, \"stats_segment\": \"%s\"}}",
             k ? reg : "off");
    if (bench_open("bench_engine", url, js[k], &h[k], &st[k]) != 0)
      break;
  }
  printf("\n(e) fleet statistics: a lookup of one 16 KiB hit (step open, "
         "lookup, close)\n");
  void *data = calloc(1, 16u << 10), *buf = malloc(16u << 10);
  if (h[0] != NULL && h[1] != NULL && data != NULL && buf != NULL) {
    char ids[1][32];
    encache_candidate c[1];
    encache_result r[1];
    encache_step *step = make_candidates(h[0], "e", 0, 1, ids, c, r, 4, 1024);
    int64_t shape[2] = {4, 1024};
    encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    encache_storage *stg = NULL;
    encache_storage_new(data, 16u << 10, no_release, NULL, &stg);
    bench_publish(step, ids[0], &v, stg);
    encache_storage_unref(stg);
    encache_step_close(step);
    encache_flush(h[0]);
    int rounds = iters * 100;
    measure m[2];
    measure_init(&m[0], rounds);
    measure_init(&m[1], rounds);
    for (int i = 0; i < rounds; i++)
      for (int k = 0; k < 2; k++)
        measure_add(&m[k], one_hit(h[k], ids[0], buf));
    double p0 = measure_pct(&m[0], 50), p1 = measure_pct(&m[1], 50);
    printf("%-22s %12s %12s\n", "p50", "off", "registry");
    printf("%-22s %10.2fus %10.2fus  (x%.3f, %+.0f ns; %d lookups each)\n",
           "lookup of 1 hit", p0 * 1e6, p1 * 1e6, p1 / p0, (p1 - p0) * 1e9,
           rounds);
    measure_free(&m[0]);
    measure_free(&m[1]);
  }
  free(data);
  free(buf);
  for (int k = 0; k < 2; k++) {
    encache_close(h[k]);
    encache_store_close(st[k]);
  }
  char path[80];
  snprintf(path, sizeof(path), "/%s", reg);
  shm_unlink(path);
}

int main(int argc, char **argv) {
  const char *url = NULL;
  int iters = 30;
  int only_overlap = measure_take_flag(&argc, argv, "--overlap");
  int flags = bench_overlap_flags(&argc, argv);
  int rc = measure_options(argc, argv, usage, 0, &url, &iters, 5);
  if (rc >= 0)
    return rc;
  char own[128] = "", name[64];
  if (url == NULL) {
    snprintf(name, sizeof(name), "encache-benche-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=768MiB", name);
    url = own;
  }
  encache *ec;
  encache_store *st;
  if (bench_open("bench_engine", url, json, &ec, &st) != 0) {
    if (own[0])
      encache_shm_destroy(name);
    return 1;
  }
  printf("store: %s\n\n", encache_store_url(st));
  rc = only_overlap ? 0 : bench_reads(ec, st, iters);
  if (rc == 0 && !only_overlap)
    rc = bench_publish_per_call(ec, iters);
  if (rc == 0 && !only_overlap) {
    bench_sustained(ec, st, iters);
    bench_flight(url, ec, st, iters);
    bench_fleet(url, iters);
  }
  if (rc == 0)
    rc = bench_overlap_table(ec, st, "(f)", "f", iters, flags);
  encache_close(ec);
  encache_store_close(st);
  if (own[0])
    encache_shm_destroy(name);
  return rc != 0;
}
