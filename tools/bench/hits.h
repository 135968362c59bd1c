/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hits.h: what `encache bench` and the benchmark programs (bench/) share
 * besides the measuring core (measure.h): destinations from a fixed pool
 * (as a serving stack's allocator would reuse memory, so that a benchmark
 * times encache, not malloc), the one place where they call the engine's
 * lookup, publication, open and counters, and a set of objects written
 * to a Store to be read raw and looked up (bench_hits).  Public API only.
 */
#ifndef ENCACHE_BENCH_HITS_H
#define ENCACHE_BENCH_HITS_H

#include "encache.h"
#include "measure.h"

#include <stddef.h>
#include <stdint.h>

/* Candidate i's destination is buf[i]. */
typedef struct bench_pool {
  void **buf;
} bench_pool;

/* The allocator's alloc over a bench_pool (ctx). */
int bench_pool_alloc(void *ctx, size_t i, const encache_candidate *c,
                     uint64_t nbytes, void **data, void **handle);

/* The engine calls of the benchmarks, each in one place. */

/* Opens an engine handle (model "bench/PID", float32, the vLLM JSON) and
 * the Store at url.  Returns 0, or -1 after a message (nothing open). */
int bench_open(const char *prog, const char *url, const char *json,
               encache **ec, encache_store **st);

/* Opens a step on *step (the caller closes it) and looks up c[0..n). */
int bench_lookup(encache *ec, encache_step **step, const encache_candidate *c,
                 size_t n, const encache_allocator *a, encache_result *r);

int bench_publish(encache_step *step, const char *id, const encache_tensor *v,
                  encache_storage *s);

void bench_stats(encache *ec, encache_stats *s);

/* A float32 candidate of rows x cols on the host. */
encache_candidate bench_candidate(const char *id, uint64_t rows,
                                  uint64_t cols);

/* The sustained benchmarks' pace: after a step, wait for the worker when
 * the queue nears the item budget (more than 40 pending), so that the
 * figure is what the worker sustains, not what the budget sheds. */
void bench_flush_if_full(encache *ec);

/* Sustained publication: `total` new ids PREFIX-FIRST, PREFIX-FIRST+1, ...
 * looked up (all miss) in steps of 16 and each published from view v over
 * the storage [data, data + nbytes), paced by bench_flush_if_full().
 * Seconds, with the objects written meanwhile in *written. */
double bench_publish_sustained(encache *ec, const char *prefix, int first,
                               int total, const encache_tensor *v,
                               const void *data, size_t nbytes,
                               uint64_t *written);

/* Writes data (rows x cols float32) at key with its v3 header, as the
 * engine would.  Returns the Store's answer (0, ENCACHE_EEXIST, ...). */
int bench_write_object(encache_store *st, const char *key, void *data,
                       uint64_t rows, uint64_t cols);

/* n float32 objects of nbytes each in the Store under ids PREFIX-SIZE-K
 * of the engine's namespace, as the engine would write them: with their
 * candidates, warm destinations (the pool, each with BENCH_HEADROOM bytes
 * in front that the allocator lends: encache_allocator.headroom) and raw
 * read buffers, page-aligned: Mooncake's TCP reads into memory at some
 * offsets (malloc's, 16 bytes past a page) were up to a third slower. */
#define BENCH_HEADROOM 4096

typedef struct bench_hits {
  encache *ec;
  encache_store *st;
  int n;
  uint64_t rows, cols, nbytes;
  char (*ids)[48];
  char **keys;
  void **dst, **raw;
  size_t *caps;
  int64_t *res;
  encache_candidate *c;
  encache_result *r;
  bench_pool pool;
  encache_allocator a;
} bench_hits;

/* Writes n objects of about size bytes (ids PREFIX-SIZE-K) and makes h
 * hold them.  Returns 0, or -1 after a message (then h holds nothing). */
int bench_hits_make(bench_hits *h, encache *ec, encache_store *st,
                    const char *prefix, int n, uint64_t size);

/* Removes the objects and frees what h holds (also a half-made h). */
void bench_hits_drop(bench_hits *h);

/* measure_fn: the raw Store's batched read of the objects. */
int bench_hits_read(void *ctx);

/* 0 when a lookup's answer is h's n hits, else 1 after a message. */
int bench_hits_check(bench_hits *h, int hits);

/* measure_fn: an encache lookup of the objects, all hits. */
int bench_hits_lookup(void *ctx);

/* For each size, n objects read by the baseline `raw` and looked up, in
 * the measuring core's table.  Returns 0, or nonzero on a failure. */
int bench_hits_table(encache *ec, encache_store *st, const char *prefix, int n,
                     const size_t *sizes, int nsizes, measure_fn raw,
                     int iters);

#endif
