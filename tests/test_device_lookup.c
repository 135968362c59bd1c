/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA destinations of lookups (src/device.c): bit for bit, on the
 * caller's stream, on another device than the current one, copy and
 * event failures that poison.
 * On a real shm Store with the fake CUDA runtime (tests/fake_cudart.c),
 * or the real one with ENCACHE_TEST_CUDA_REAL=1 (scripts/gpu-check.sh),
 * where the tests that need the fake's injection say "skipped" and pass.
 * The environment they share is in tests/device_util.c.
 */
#include "device_util.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

TEST(device_lookup_bit_for_bit_chunks_duplicates_oversize) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  /* 16 KiB payloads in a 40 KiB staging buffer: two a chunk. */
  env_open(&e, 40 << 10, "");
  static const char *const ids[] = {"i0", "i1", "i2", "i3", "i4"};
  dev_seed(&e, ids, 5, 4);
  static const char *const big[] = {"big"};
  dev_seed(&e, big, 1, 16); /* 64 KiB: oversize */
  encache_candidate c[9] = {
      dev_cand("i0", 4, ENCACHE_DEVICE_CUDA),
      dev_cand("i1", 4, ENCACHE_DEVICE_CUDA),
      dev_cand("i2", 4, ENCACHE_DEVICE_HOST),
      dev_cand("i3", 4, ENCACHE_DEVICE_CUDA),
      dev_cand("i4", 4, ENCACHE_DEVICE_CUDA),
      dev_cand("i1", 4, ENCACHE_DEVICE_HOST),
      dev_cand("i3", 4, ENCACHE_DEVICE_CUDA),
      dev_cand("big", 16, ENCACHE_DEVICE_CUDA),
      dev_cand("none", 4, ENCACHE_DEVICE_CUDA)};
  c[1].device_index = c[3].device_index = e.rt.devices > 1 ? 1 : 0;
  encache_result r[9] = {ENCACHE_RESULT_INIT};
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, c, 9, &a, r), 7);
  for (int i = 0; i < 7; i++)
    check_hit(&e, &r[i], c[i].id, 4, c[i].device, 0);
  ASSERT_EQ_INT(r[7].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_INT(r[8].outcome, ENCACHE_MISS);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.device_bytes_copied, 5 * 4 * COLS * 4);
  ASSERT(s.batched_reads >= 3); /* five objects, two a chunk */
  /* Every asynchronous copy was from page-locked memory. */
  ASSERT_EQ_INT(fake_get(&e, "fake_cudart_pageable_copies", 0), 0);
  for (int i = 0; i < 7; i++)
    dev_release(&e, (size_t)i, r[i].data, r[i].handle);
  env_close(&e, 0);
}

TEST(device_lookup_on_the_callers_stream) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"s0", "s1"};
  dev_seed(&e, ids, 2, 8);
  void *stream = NULL;
  ASSERT_EQ_INT(e.rt.stream_create(&stream, 1), 0);
  ASSERT_EQ_INT(encache_step_set_stream(e.step, stream), 0);
  ASSERT_EQ_INT(encache_step_set_stream(NULL, stream), ENCACHE_EINVAL);
  encache_candidate c[2] = {dev_cand("s0", 8, ENCACHE_DEVICE_CUDA),
                            dev_cand("s1", 8, ENCACHE_DEVICE_CUDA)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, c, 2, &a, r), 2);
  /* Complete on return: read without synchronising the stream. */
  for (int i = 0; i < 2; i++) {
    check_hit(&e, &r[i], c[i].id, 8, ENCACHE_DEVICE_CUDA, 0);
    dev_release(&e, 0, r[i].data, r[i].handle);
  }
  encache_step_close(e.step);
  ASSERT_EQ_INT(e.rt.stream_destroy(stream), 0);
  env_close(&e, 0);
}

/* A started lookup (encache_lookup_start) with CUDA destinations: its
 * copies are made on the lookup thread, on the step's stream, and are
 * complete when the wait returns, as encache_lookup()'s are on return. */
TEST(device_lookup_started_on_the_steps_stream) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  fake_set_long(&e, "fake_cudart_delay_us", 2000);
  env_open(&e, 40 << 10, "");
  static const char *const ids[] = {"a0", "a1", "a2"};
  dev_seed(&e, ids, 3, 4);
  void *stream = NULL;
  ASSERT_EQ_INT(e.rt.stream_create(&stream, 1), 0);
  ASSERT_EQ_INT(encache_step_set_stream(e.step, stream), 0);
  encache_candidate c[5] = {dev_cand("a0", 4, ENCACHE_DEVICE_CUDA),
                            dev_cand("a1", 4, ENCACHE_DEVICE_HOST),
                            dev_cand("a2", 4, ENCACHE_DEVICE_CUDA),
                            dev_cand("a0", 4, ENCACHE_DEVICE_CUDA),
                            dev_cand("none", 4, ENCACHE_DEVICE_CUDA)};
  encache_result r[5] = {ENCACHE_RESULT_INIT};
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup_start(e.step, c, 5, &a, r), 0);
  ASSERT_EQ_INT(encache_step_wait(e.step, -1), 4);
  for (int i = 0; i < 4; i++) /* read without synchronising the stream */
    check_hit(&e, &r[i], c[i].id, 4, c[i].device, 0);
  ASSERT_EQ_INT(r[4].outcome, ENCACHE_MISS);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.device_bytes_copied, 3 * 4 * COLS * 4);
  ASSERT_EQ_INT(fake_get(&e, "fake_cudart_pageable_copies", 0), 0);
  for (int i = 0; i < 4; i++)
    dev_release(&e, (size_t)i, r[i].data, r[i].handle);
  encache_step_close(e.step);
  ASSERT_EQ_INT(e.rt.stream_destroy(stream), 0);
  env_close(&e, 0);
}

/* A copy that fails in a started lookup poisons the handle, reported at
 * the wait. */
TEST(device_copy_error_in_a_started_lookup_poisons_at_the_wait) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"w0", "w1"};
  dev_seed(&e, ids, 2, 2);
  fake_set_long(&e, "fake_cudart_fail_copy_after", 1); /* the second fails */
  encache_candidate c[2] = {dev_cand("w0", 2, ENCACHE_DEVICE_CUDA),
                            dev_cand("w1", 2, ENCACHE_DEVICE_CUDA)};
  static encache_result r[2] = {ENCACHE_RESULT_INIT}; /* the device's */
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup_start(e.step, c, 2, &a, r), 0);
  ASSERT_EQ_INT(encache_step_wait(e.step, -1), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cudaMemcpyAsync");
  ASSERT_EQ_INT(encache_lookup_start(e.step, c, 2, &a, r), ENCACHE_EPOISONED);
  env_close(&e, ENCACHE_EPOISONED);
}

TEST(device_copy_error_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"c0", "c1"};
  dev_seed(&e, ids, 2, 2);
  fake_set_long(&e, "fake_cudart_fail_copy_after", 1); /* the second fails */
  encache_candidate c[2] = {dev_cand("c0", 2, ENCACHE_DEVICE_CUDA),
                            dev_cand("c1", 2, ENCACHE_DEVICE_CUDA)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, c, 2, &a, r), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cudaMemcpyAsync");
  ASSERT_CONTAINS(encache_errmsg(e.ec), "illegal memory access");
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(encache_lookup(e.step, c, 2, &a, r), ENCACHE_EPOISONED);
  env_close(&e, ENCACHE_EPOISONED);
}

TEST(device_event_never_completing_poisons_after_the_timeout) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "\"device_sync_timeout_ms\": 200");
  static const char *const ids[] = {"h0"};
  dev_seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_hang_events", 1);
  encache_candidate c = dev_cand("h0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(&e);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), ENCACHE_EPOISONED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ASSERT(t1.tv_sec - t0.tv_sec < 10); /* bounded, not stuck */
  ASSERT_CONTAINS(encache_errmsg(e.ec), "did not complete within 200 ms");
  env_close(&e, ENCACHE_EPOISONED);
}

TEST(device_unrecorded_lookup_event_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"u0"};
  dev_seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_fail_records", 1);
  encache_candidate c = dev_cand("u0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cannot be confirmed (cudaEventRecord");
  env_close(&e, ENCACHE_EPOISONED);
}

/* The runtime's cudaGetDevice / cudaSetDevice, for the test's own use. */
static int current_device(const dev_env *e) {
  int (*get)(int *);
  void *p = dlsym(e->rt.lib, "cudaGetDevice");
  ASSERT(p != NULL);
  memcpy(&get, &p, sizeof(get));
  int d = -1;
  ASSERT_EQ_INT(get(&d), 0);
  return d;
}

/* An allocator as torch's: allocates on the candidate's device and gives
 * the caller's current device back (a device guard). */
static int guarded_alloc(void *ctx, size_t i, const encache_candidate *c,
                         uint64_t nbytes, void **data, void **handle) {
  dev_env *e = ctx;
  int prev = current_device(e);
  int rc = dev_alloc(ctx, i, c, nbytes, data, handle);
  if (e->rt.set_device(prev) != 0)
    rc = ENCACHE_EIO;
  return rc;
}

/* Hits on device 1 while the caller's current device is 0: on the
 * handle's own stream, on the default stream's handles (NULL names the
 * handle's own; 0x1 and 0x2 the current device's default stream), on a
 * stream of device 1; the caller's device is 0 again after each. */
TEST(device_lookup_on_another_device_than_the_current_one) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  if (e.rt.devices < 2) {
    printf("# skipped: needs two CUDA devices\n");
    return;
  }
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"x0"};
  dev_seed(&e, ids, 1, 4);
  void *mine = NULL;
  ASSERT_EQ_INT(e.rt.set_device(1), 0);
  ASSERT_EQ_INT(e.rt.stream_create(&mine, 1), 0);
  ASSERT_EQ_INT(e.rt.set_device(0), 0);
  void *const streams[] = {NULL, (void *)1, (void *)2, mine};
  encache_allocator a = dev_allocator(&e);
  a.alloc = guarded_alloc;
  for (int k = 0; k < 4; k++) {
    ASSERT_EQ_INT(encache_step_set_stream(e.step, streams[k]), 0);
    encache_candidate c = dev_cand("x0", 4, ENCACHE_DEVICE_CUDA);
    c.device_index = 1;
    encache_result r = ENCACHE_RESULT_INIT;
    if (encache_lookup(e.step, &c, 1, &a, &r) != 1)
      test__fail(__FILE__, __LINE__, "stream %d: %s", k,
                 encache_errmsg(e.ec));
    ASSERT_EQ_INT(current_device(&e), 0); /* the caller's, restored */
    check_hit(&e, &r, "x0", 4, ENCACHE_DEVICE_CUDA, 0);
    dev_release(&e, 0, r.data, r.handle);
  }
  /* And from device 1 to device 0. */
  ASSERT_EQ_INT(e.rt.set_device(1), 0);
  ASSERT_EQ_INT(encache_step_set_stream(e.step, (void *)1), 0);
  encache_candidate c = dev_cand("x0", 4, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 1);
  ASSERT_EQ_INT(current_device(&e), 1);
  ASSERT_EQ_INT(e.rt.set_device(0), 0);
  check_hit(&e, &r, "x0", 4, ENCACHE_DEVICE_CUDA, 0);
  dev_release(&e, 0, r.data, r.handle);
  encache_step_close(e.step);
  ASSERT_EQ_INT(e.rt.stream_destroy(mine), 0);
  env_close(&e, 0);
}

static void *stale_work; /* device bytes a previous user's work writes */

/* An allocator as a stream-ordered one whose block's previous user still
 * has work queued on the legacy default stream: three copies of garbage
 * into the block, queued before the block is handed out. */
static int stream_ordered_alloc(void *ctx, size_t i,
                                const encache_candidate *c, uint64_t nbytes,
                                void **data, void **handle) {
  dev_env *e = ctx;
  int rc = dev_alloc(ctx, i, c, nbytes, data, handle);
  for (int k = 0; rc == 0 && k < 3; k++)
    if (e->rt.memcpy_async(*data, stale_work, (size_t)nbytes, 3, NULL) != 0)
      rc = ENCACHE_EIO;
  return rc;
}

/* Without encache_step_set_stream(), the handle's own stream is ordered
 * after the legacy default stream's work (a blocking stream): the hit is
 * not overwritten by work queued there before the lookup. */
TEST(device_lookup_own_stream_after_the_default_streams_work) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  fake_set_long(&e, "fake_cudart_delay_us", 20000);
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"o0"};
  dev_seed(&e, ids, 1, 4);
  size_t n = 4 * COLS * 4;
  ASSERT_EQ_INT(e.rt.malloc_(&stale_work, n), 0);
  void *zeros = calloc(1, n);
  ASSERT(zeros != NULL);
  ASSERT_EQ_INT(e.rt.memcpy_(stale_work, zeros, n, CUDA_RT_H2D), 0);
  free(zeros);
  encache_allocator a = dev_allocator(&e);
  a.alloc = stream_ordered_alloc;
  encache_candidate c = dev_cand("o0", 4, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 1);
  check_hit(&e, &r, "o0", 4, ENCACHE_DEVICE_CUDA, 0); /* after the stale */
  dev_release(&e, 0, r.data, r.handle);
  ASSERT_EQ_INT(e.rt.free_(stale_work), 0);
  env_close(&e, 0);
}
