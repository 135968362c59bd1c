/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA destinations (src/device.c) without a runtime or a device, and a
 * registration that fails.
 * On a real shm Store with the fake CUDA runtime (tests/fake_cudart.c),
 * or the real one with ENCACHE_TEST_CUDA_REAL=1 (scripts/gpu-check.sh),
 * where the tests that need the fake's injection say "skipped" and pass.
 * The environment they share is in tests/device_util.c.
 */
#include "device_util.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

TEST(device_no_runtime_is_skipped_with_why) {
  dev_env e;
  memset(&e, 0, sizeof(e));
  setenv("ENCACHE_CUDA_LIBRARY", "/nonexistent/libcudart.so", 1);
  env_open(&e, 1 << 20, "");
  encache_candidate c[2] = {dev_cand("a", 2, ENCACHE_DEVICE_CUDA),
                            dev_cand("b", 2, ENCACHE_DEVICE_HOST)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, c, 2, &a, r), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[0].why, "CUDA runtime not available: cannot load "
                            "/nonexistent/libcudart.so");
  ASSERT_CONTAINS(r[0].why, "ENCACHE_CUDA_LIBRARY");
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS); /* the host one is served */
  /* A CUDA output cannot be published: a clear error, nothing queued. */
  static char dummy[8 * COLS];
  int64_t shape[2] = {2, COLS};
  encache_tensor v = {.size = sizeof(v), .data = dummy,
                      .dtype = ENCACHE_FLOAT32, .ndim = 2, .shape = shape,
                      .device = ENCACHE_DEVICE_CUDA};
  encache_storage *st;
  ASSERT_EQ_INT(encache_storage_new(dummy, sizeof(dummy), NULL, NULL, &st), 0);
  ASSERT_EQ_INT(encache_publish(e.step, "b", &v, st), ENCACHE_ENOLIB);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "CUDA runtime not available");
  v.device = 7; /* not a kind */
  ASSERT_EQ_INT(encache_publish(e.step, "b", &v, st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "device 7");
  encache_storage_unref(st);
  env_close(&e, 0);
}

TEST(device_no_device_is_skipped_with_why) {
  if (real_runtime()) {
    printf("# skipped: needs the fake runtime\n");
    return;
  }
  setenv("FAKE_CUDART_DEVICES", "0", 1);
  setenv("ENCACHE_CUDA_LIBRARY", FAKE_CUDART, 1);
  dev_env e;
  memset(&e, 0, sizeof(e));
  env_open(&e, 1 << 20, "");
  encache_candidate c = dev_cand("a", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 0);
  ASSERT_EQ_INT(r.outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r.why, "CUDA runtime not available: no CUDA device");
  ASSERT_EQ_INT(encache_close(e.ec), 0);
}

TEST(device_registration_failure_is_clear) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"r0"};
  dev_seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_fail_host_memory", 1);
  encache_candidate c = dev_cand("r0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 0);
  ASSERT_EQ_INT(r.outcome, ENCACHE_UNAVAILABLE);
  ASSERT_CONTAINS(r.why, "cudaHostRegister");
  /* A publication: a clear error, nothing queued, the handle healthy. */
  dev_out o;
  dev_out_make(&e, &o, "r0", 2, 0);
  ASSERT_EQ_INT(encache_publish(e.step, "r0", &o.v, o.st), ENCACHE_EIO);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cudaHostAlloc");
  /* A copy the runtime refuses at publish: the same. */
  fake_set_int(&e, "fake_cudart_fail_host_memory", 0);
  fake_set_long(&e, "fake_cudart_fail_copy_after", 0);
  ASSERT_EQ_INT(encache_publish(e.step, "r0", &o.v, o.st), ENCACHE_EIO);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "nothing queued");
  fake_set_long(&e, "fake_cudart_fail_copy_after", -1);
  /* Healthy: the next lookup pins the staging buffer and hits. */
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 1);
  check_hit(&e, &r, "r0", 2, ENCACHE_DEVICE_CUDA, 0);
  dev_release(&e, 0, r.data, r.handle);
  encache_storage_unref(o.st);
  ASSERT_EQ_INT(e.rt.free_(o.ptr), 0);
  env_close(&e, 0);
}
