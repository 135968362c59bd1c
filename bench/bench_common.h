/*
 * bench_common.h: what the benchmark programs and `encache bench` share:
 * a clock, percentiles, and destinations from a fixed pool (as a serving
 * stack's allocator would reuse memory, so that a benchmark times encache,
 * not malloc).  Public API only.
 */
#ifndef ENCACHE_BENCH_COMMON_H
#define ENCACHE_BENCH_COMMON_H

#include "encache.h"

#include <stdlib.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The p-th percentile of v[0..n) (sorts v). */
static inline double bench_pct(double *v, int n, int p) {
  qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
  int i = (n * p) / 100;
  return v[i < n ? i : n - 1];
}

/* Candidate i's destination is buf[i]. */
typedef struct bench_pool {
  void **buf;
} bench_pool;

static inline int bench_pool_alloc(void *ctx, size_t i,
                                   const encache_candidate *c, uint64_t nbytes,
                                   void **data, void **handle) {
  (void)c, (void)nbytes;
  *data = ((bench_pool *)ctx)->buf[i];
  *handle = NULL;
  return 0;
}

#endif
