/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device_util.h: what the CUDA tests (tests/test_device_*.c) share
 * (tests/device_util.c): an env of a runtime, a Store, a handle and its
 * step; candidates, payloads, allocators and device outputs.
 */
#ifndef ENCACHE_TEST_DEVICE_UTIL_H
#define ENCACHE_TEST_DEVICE_UTIL_H

#include "runner.h"

#include "cuda_rt.h"
#include "encache.h"

#include <stddef.h>
#include <stdint.h>

#define COLS 1024 /* float32: 4 KiB a row */

typedef struct dev_env {
  char seg[64];
  cuda_rt rt;
  void *fake; /* the fake's handle, NULL on the real runtime */
  encache *ec;
  encache_step *step;
} dev_env;

/* 1 when ENCACHE_TEST_CUDA_REAL=1 (the real runtime). */
int real_runtime(void);
/* Controls of the fake (no-ops, or 0, on the real runtime). */
void fake_set_long(const dev_env *e, const char *name, long v);
void fake_set_int(const dev_env *e, const char *name, int v);
long fake_get(const dev_env *e, const char *name, int arg);
/* Loads the runtime (the fake unless on the real one); 0, or -1 (no
 * runtime: the caller skips). */
int runtime_init(dev_env *e);
/* Opens a handle with these extra options, and its step. */
void env_open(dev_env *e, uint64_t read_buf, const char *extra);
encache_candidate dev_cand(const char *id, uint64_t rows, int device);
/* The test's payload for id: floats derived from the id and a version. */
void fill(float *out, const char *id, uint64_t rows, int version);
/* Destinations: device memory for CUDA candidates, else malloc. */
int dev_alloc(void *ctx, size_t i, const encache_candidate *c,
              uint64_t nbytes, void **data, void **handle);
void dev_release(void *ctx, size_t i, void *data, void *handle);
encache_allocator dev_allocator(dev_env *e);
/* Publishes host outputs for ids (rows each) and waits for them. */
void dev_seed(dev_env *e, const char *const *ids, size_t n, uint64_t rows);
/* Checks that result r (a HIT of id) holds id's payload, on its device. */
void check_hit(dev_env *e, const encache_result *r, const char *id,
               uint64_t rows, int device, int version);
/* Closes the handle (expecting that code) and checks the fake let go of
 * every stream and event. */
void env_close(dev_env *e, int expect);

/* A device output of rows x COLS floats: the version's payload, copied to
 * device memory; its storage releases it. */
typedef struct dev_out {
  void *ptr;
  size_t n;
  encache_storage *st;
  encache_tensor v;
  int64_t shape[2];
} dev_out;

void dev_out_make(dev_env *e, dev_out *o, const char *id, uint64_t rows,
                  int version);
/* Looks id up into host memory and checks it is the version's payload. */
void check_stored(dev_env *e, const char *id, uint64_t rows, int version);
/* Makes id a candidate of the env's step. */
void candidate(dev_env *e, const char *id, uint64_t rows);
/* 1 on the fake runtime; else says "skipped" and returns 0. */
int need_fake(const dev_env *e);
/* What a poisoned handle's device work may still read (never freed). */
extern void *kept_for_the_device;

#endif
