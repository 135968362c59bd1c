/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA outputs published (src/device.c): snapshots in stream order, the
 * bounded pool, events that never complete or were never recorded, the
 * worker on the events' device, budgets checked before the copy.
 * On a real shm Store with the fake CUDA runtime (tests/fake_cudart.c),
 * or the real one with ENCACHE_TEST_CUDA_REAL=1 (scripts/gpu-check.sh),
 * where the tests that need the fake's injection say "skipped" and pass.
 * The environment they share is in tests/device_util.c.
 */
#include "device_util.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

TEST(device_publish_snapshot_in_stream_order) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  env_open(&e, 1 << 20, "\"store_max_pending_bytes\": 1048576");
  candidate(&e, "p0", 8);
  void *stream = NULL;
  ASSERT_EQ_INT(e.rt.stream_create(&stream, 1), 0);
  dev_out o;
  dev_out_make(&e, &o, "p0", 8, 0);
  o.v.stream = stream;
  ASSERT_EQ_INT(encache_publish(e.step, "p0", &o.v, o.st), ENCACHE_QUEUED);
  /* The caller goes on writing the output on its stream at once. */
  float *next = malloc(o.n);
  ASSERT(next != NULL);
  fill(next, "p0", 8, 1);
  ASSERT_EQ_INT(e.rt.memcpy_async(o.ptr, next, o.n, CUDA_RT_H2D, stream), 0);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.pending_bytes, o.n); /* the device storage is charged */
  ASSERT_EQ_U64(s.device_published, 1);
  ASSERT(s.device_pool_bytes >= o.n);
  ASSERT_EQ_INT(encache_flush(e.ec), 0);
  ASSERT_EQ_INT(e.rt.stream_sync(stream), 0);
  free(next);
  check_stored(&e, "p0", 8, 0); /* the bytes as of the publish call */
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.pending_bytes, 0);
  ASSERT_EQ_U64(s.published_written, 1);
  encache_storage_unref(o.st);
  ASSERT_EQ_INT(e.rt.free_(o.ptr), 0);
  ASSERT_EQ_INT(e.rt.stream_destroy(stream), 0);
  env_close(&e, 0);
  ASSERT_EQ_INT(fake_get(&e, "fake_cudart_live", 2), 0); /* pool freed */
}

TEST(device_publish_pool_is_bounded) {
  dev_env e; /* the fake's delay keeps the copies busy: no race to reap */
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  fake_set_long(&e, "fake_cudart_delay_us", 100000); /* copies stay busy */
  env_open(&e, 1 << 20, "\"device_pinned_pool_bytes\": 65536");
  static const char *const ids[] = {"q0", "q1", "q2"};
  dev_out o[3];
  for (int i = 0; i < 3; i++) {
    candidate(&e, ids[i], 8); /* 32 KiB each: two fit the pool */
    dev_out_make(&e, &o[i], ids[i], 8, 0);
  }
  ASSERT_EQ_INT(encache_publish(e.step, "q0", &o[0].v, o[0].st), 0);
  ASSERT_EQ_INT(encache_publish(e.step, "q1", &o[1].v, o[1].st), 0);
  ASSERT_EQ_INT(encache_publish(e.step, "q2", &o[2].v, o[2].st),
                ENCACHE_SKIP_OVER_BYTES);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.device_pool_full, 1);
  ASSERT(s.device_pool_bytes <= 65536);
  ASSERT_EQ_INT(encache_flush(e.ec), 0);
  /* Room again once the copies are written: the buffers are reused. */
  ASSERT_EQ_INT(encache_publish(e.step, "q2", &o[2].v, o[2].st), 0);
  ASSERT_EQ_INT(encache_flush(e.ec), 0);
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT(s.device_pool_bytes <= 65536);
  /* An output larger than the whole pool never fits. */
  dev_out big;
  candidate(&e, "q3", 32);
  dev_out_make(&e, &big, "q3", 32, 0); /* 128 KiB */
  ASSERT_EQ_INT(encache_publish(e.step, "q3", &big.v, big.st),
                ENCACHE_SKIP_OVER_BYTES);
  encache_storage_unref(big.st);
  ASSERT_EQ_INT(e.rt.free_(big.ptr), 0);
  for (int i = 0; i < 3; i++) {
    check_stored(&e, ids[i], 8, 0);
    encache_storage_unref(o[i].st);
    ASSERT_EQ_INT(e.rt.free_(o[i].ptr), 0);
  }
  env_close(&e, 0);
}

TEST(device_publish_event_never_completing_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "\"device_sync_timeout_ms\": 200");
  candidate(&e, "w0", 2);
  fake_set_int(&e, "fake_cudart_hang_events", 1);
  dev_out o;
  dev_out_make(&e, &o, "w0", 2, 0);
  ASSERT_EQ_INT(encache_publish(e.step, "w0", &o.v, o.st), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(e.ec), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "did not complete within 200 ms");
  /* The output is kept (the copy may still write its buffer). */
  encache_storage_unref(o.st);
  env_close(&e, ENCACHE_EPOISONED);
}

TEST(device_unrecorded_event_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"e0"};
  dev_seed(&e, ids, 1, 2);
  candidate(&e, "e1", 2);
  fake_set_int(&e, "fake_cudart_fail_records", 1);
  /* A publication: the copy is queued, no event can follow it. */
  dev_out o;
  dev_out_make(&e, &o, "e1", 2, 0);
  ASSERT_EQ_INT(encache_publish(e.step, "e1", &o.v, o.st), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cudaEventRecord");
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_INT(s.poisoned, 1);
  encache_storage_unref(o.st);
  /* The queued copy may still read the output: it is kept, as the
   * handle keeps what the device may still touch. */
  kept_for_the_device = o.ptr;
  env_close(&e, ENCACHE_EPOISONED);
}

/* The worker polls a publication's event with the event's device current
 * (the fake's strict mode refuses a query made from another device: on
 * CUDA, a thread that chose none would create a context on device 0). */
TEST(device_publish_worker_uses_the_events_device) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  candidate(&e, "v0", 4);
  ASSERT_EQ_INT(e.rt.set_device(1), 0);
  dev_out o;
  dev_out_make(&e, &o, "v0", 4, 0);
  o.v.device_index = 1;
  fake_set_int(&e, "fake_cudart_strict_queries", 1);
  ASSERT_EQ_INT(encache_publish(e.step, "v0", &o.v, o.st), ENCACHE_QUEUED);
  if (encache_flush(e.ec) != 0)
    test__fail(__FILE__, __LINE__, "flush: %s", encache_errmsg(e.ec));
  fake_set_int(&e, "fake_cudart_strict_queries", 0);
  ASSERT_EQ_INT(e.rt.set_device(0), 0);
  check_stored(&e, "v0", 4, 0);
  encache_storage_unref(o.st);
  ASSERT_EQ_INT(e.rt.free_(o.ptr), 0);
  env_close(&e, 0);
}

/* A pool buffer whose event cannot be queried poisons the handle at once
 * (its buffer is kept: the copy may still write it). */
TEST(device_pool_event_query_error_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  candidate(&e, "g0", 2);
  candidate(&e, "g1", 2);
  dev_out o[2];
  dev_out_make(&e, &o[0], "g0", 2, 0);
  dev_out_make(&e, &o[1], "g1", 2, 0);
  ASSERT_EQ_INT(encache_publish(e.step, "g0", &o[0].v, o[0].st),
                ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(e.ec), 0); /* g0's buffer given back */
  fake_set_int(&e, "fake_cudart_fail_queries", 1);
  ASSERT_EQ_INT(encache_publish(e.step, "g1", &o[1].v, o[1].st),
                ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cudaEventQuery");
  ASSERT_CONTAINS(encache_errmsg(e.ec), "illegal memory access");
  encache_storage_unref(o[0].st);
  encache_storage_unref(o[1].st);
  kept_for_the_device = o[1].ptr; /* o[0]'s copy completed */
  ASSERT_EQ_INT(e.rt.free_(o[0].ptr), 0);
  env_close(&e, ENCACHE_EPOISONED);
}

/* A device_index the runtime does not have: EINVAL naming the index and
 * the device count; a full pool: its own message. */
TEST(device_publish_messages_name_the_bound) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  env_open(&e, 1 << 20, "\"device_pinned_pool_bytes\": 16384");
  candidate(&e, "m0", 8); /* 32 KiB: more than the pool */
  dev_out o;
  dev_out_make(&e, &o, "m0", 8, 0);
  o.v.device_index = 7 + e.rt.devices;
  char want[96];
  snprintf(want, sizeof(want), "cuda:%d: the CUDA runtime has %d device",
           o.v.device_index, e.rt.devices);
  ASSERT_EQ_INT(encache_publish(e.step, "m0", &o.v, o.st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(e.ec), want);
  o.v.device_index = 0;
  ASSERT_EQ_INT(encache_publish(e.step, "m0", &o.v, o.st),
                ENCACHE_SKIP_OVER_BYTES);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "device_pinned_pool_bytes 16384");
  ASSERT_CONTAINS(encache_errmsg(e.ec), "device_pool_full");
  encache_storage_unref(o.st);
  ASSERT_EQ_INT(e.rt.free_(o.ptr), 0);
  env_close(&e, 0);
}

/* A CUDA publication the budgets skip (PENDING, OVER_ITEMS) is skipped
 * before its copy: no pool buffer is taken for it. */
TEST(device_publish_budgets_checked_before_the_copy) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  fake_set_long(&e, "fake_cudart_delay_us", 100000); /* p0 stays pending */
  env_open(&e, 1 << 20, "\"store_max_pending_items\": 1");
  candidate(&e, "k0", 8);
  candidate(&e, "k1", 8);
  dev_out o[2];
  dev_out_make(&e, &o[0], "k0", 8, 0);
  dev_out_make(&e, &o[1], "k1", 8, 0);
  ASSERT_EQ_INT(encache_publish(e.step, "k0", &o[0].v, o[0].st),
                ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_publish(e.step, "k0", &o[0].v, o[0].st),
                ENCACHE_SKIP_PENDING);
  ASSERT_EQ_INT(encache_publish(e.step, "k1", &o[1].v, o[1].st),
                ENCACHE_SKIP_OVER_ITEMS);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(e.ec, &s), 0);
  ASSERT_EQ_U64(s.device_pool_bytes, o[0].n); /* k0's buffer only */
  ASSERT_EQ_U64(s.device_published, 1);
  ASSERT_EQ_INT(encache_flush(e.ec), 0);
  check_stored(&e, "k0", 8, 0);
  for (int i = 0; i < 2; i++) {
    encache_storage_unref(o[i].st);
    ASSERT_EQ_INT(e.rt.free_(o[i].ptr), 0);
  }
  env_close(&e, 0);
}
