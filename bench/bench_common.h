/*
 * bench_common.h: what the benchmark programs and `encache bench` share
 * besides the measuring core (measure.h): destinations from a fixed pool
 * (as a serving stack's allocator would reuse memory, so that a benchmark
 * times encache, not malloc), and the one place where they call the
 * engine's lookup, publication, open and counters.  Public API only.
 */
#ifndef ENCACHE_BENCH_COMMON_H
#define ENCACHE_BENCH_COMMON_H

#include "encache.h"
#include "measure.h"

#include <string.h>

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

/* The engine calls of the benchmarks, each in one place. */
static inline int bench_open(const char *url, const char *model,
                             const char *json, encache **ec) {
  encache_options o;
  memset(&o, 0, sizeof(o));
  o.ec_transfer_config = json;
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  return encache_open(&o, ec);
}

static inline int bench_lookup(encache *ec, const encache_candidate *c,
                               size_t n, const encache_allocator *a,
                               encache_result *r) {
  return encache_lookup(ec, c, n, a, r);
}

static inline int bench_publish(encache *ec, const char *id,
                                const encache_tensor *v, encache_storage *s) {
  return encache_publish(ec, id, v, s);
}

static inline void bench_stats(encache *ec, encache_stats *s) {
  encache_stats_get(ec, s);
}

/* A float32 candidate of rows x cols on the host. */
static inline encache_candidate bench_candidate(const char *id, uint64_t rows,
                                                uint64_t cols) {
  encache_candidate c = {id,   ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                         rows, cols, ENCACHE_DEVICE_HOST, 0};
  return c;
}

/* Writes data (rows x cols float32) at key with its v3 header, as the
 * engine would.  Returns the Store's answer (0, ENCACHE_EEXIST, ...). */
static inline int bench_write_object(encache_store *st, const char *key,
                                     void *data, uint64_t rows,
                                     uint64_t cols) {
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor v = {data, ENCACHE_FLOAT32, 2, shape, NULL};
  unsigned char hdr[24];
  encache_header_encode(&v, hdr);
  return encache_store_write(st, key, hdr, 24, data, rows * cols * 4);
}

#endif
