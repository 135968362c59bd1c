/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA destinations and outputs (src/device.c) on a real shm Store, with
 * the fake CUDA runtime (tests/fake_cudart.c: a thread per stream, a delay
 * per operation so that a missing wait reads stale bytes, and failure
 * injection).  With ENCACHE_TEST_CUDA_REAL=1 (scripts/gpu-check.sh) the
 * same tests run on the real runtime (ENCACHE_CUDA_LIBRARY as the caller
 * set it, else libcudart.so); those that need the fake's injection say
 * "skipped" and pass.  Past 600 lines: the tests share this file's
 * environment (the runtime, the Store, the allocators), which a second
 * file would have to repeat.
 */
#include "runner.h"

#include "cuda_rt.h"
#include "encache.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#define COLS 1024 /* float32: 4 KiB a row */

typedef struct dev_env {
  char seg[64];
  cuda_rt rt;
  void *fake; /* the fake's handle, NULL on the real runtime */
  encache *ec;
  encache_step *step;
} dev_env;

static char seg_at_exit[64];
static void seg_destroy(void) {
  if (seg_at_exit[0])
    encache_shm_destroy(seg_at_exit);
}

static int real_runtime(void) {
  const char *r = getenv("ENCACHE_TEST_CUDA_REAL");
  return r != NULL && strcmp(r, "1") == 0;
}

/* A control of the fake (NULL on the real runtime). */
static void *fake_fn(const dev_env *e, const char *name) {
  if (e->fake == NULL)
    return NULL;
  void *f = dlsym(e->fake, name);
  if (f == NULL)
    test__fail(__FILE__, __LINE__, "the fake runtime has no %s", name);
  return f;
}

static void fake_set_long(const dev_env *e, const char *name, long v) {
  void (*f)(long);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  if (p != NULL)
    f(v);
}

static void fake_set_int(const dev_env *e, const char *name, int v) {
  void (*f)(int);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  if (p != NULL)
    f(v);
}

static long fake_get(const dev_env *e, const char *name, int arg) {
  long (*f)(int);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  return p != NULL ? f(arg) : 0;
}

/* Points libencache at the fake (unless on the real runtime), loads the
 * runtime for the test's own device memory; 0, or -1 (no runtime: the
 * caller skips). */
static int runtime_init(dev_env *e) {
  memset(e, 0, sizeof(*e));
  if (!real_runtime()) {
    setenv("ENCACHE_CUDA_LIBRARY", FAKE_CUDART, 1);
    e->fake = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    ASSERT(e->fake != NULL);
    fake_set_long(e, "fake_cudart_delay_us", 300);
  }
  char why[256];
  if (cuda_rt_load(&e->rt, why, sizeof(why)) != 0) {
    ASSERT(real_runtime()); /* the fake always loads */
    printf("# skipped: %s\n", why);
    return -1;
  }
  return 0;
}

/* Opens a handle with these extra options on $ENCACHE_TEST_STORE (the
 * Redis suites), else on a fresh shm segment; in a namespace of its own
 * (the revision), so that runs on a shared Store never meet. */
static void env_open(dev_env *e, uint64_t read_buf, const char *extra) {
  char url[512], json[1024], revision[64];
  const char *given = getenv("ENCACHE_TEST_STORE");
  if (given != NULL && given[0] != '\0') {
    snprintf(url, sizeof(url), "%s", given);
  } else {
    snprintf(e->seg, sizeof(e->seg), "encache-devtest-%d", (int)getpid());
    encache_shm_destroy(e->seg);
    if (!seg_at_exit[0])
      atexit(seg_destroy);
    snprintf(seg_at_exit, sizeof(seg_at_exit), "%s", e->seg);
    snprintf(url, sizeof(url), "shm://%s?size=16MiB", e->seg);
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(revision, sizeof(revision), "d%d-%lld%09ld", (int)getpid(),
           (long long)ts.tv_sec, ts.tv_nsec);
  snprintf(json, sizeof(json),
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
           "\"ec_both\", \"ec_connector_extra_config\": {"
           "\"cross_encoder_cache\": true, \"store_read_buffer_bytes\": %llu"
           "%s%s}}", (unsigned long long)read_buf, extra[0] ? ", " : "",
           extra);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "device/model";
  o.revision = revision;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  int rc = encache_open(&o, &e->ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  ASSERT_EQ_INT(encache_step_open(e->ec, &e->step), 0);
}

static encache_candidate cand(const char *id, uint64_t rows, int device) {
  encache_candidate c = ENCACHE_CANDIDATE_INIT;
  c.id = id;
  c.modality = ENCACHE_MODALITY_IMAGE;
  c.dtype = ENCACHE_FLOAT32;
  c.rows = rows;
  c.cols = COLS;
  c.device = device;
  return c;
}

/* The test's payload for id: floats derived from the id and a version. */
static void fill(float *out, const char *id, uint64_t rows, int version) {
  uint32_t h = 2166136261u;
  for (const char *s = id; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  for (uint64_t k = 0; k < rows * COLS; k++)
    out[k] = (float)((h + k * 7u + (uint64_t)version * 1000003u) % 65521u);
}

/* Destinations: device memory for CUDA candidates, else malloc. */
static int dev_alloc(void *ctx, size_t i, const encache_candidate *c,
                     uint64_t nbytes, void **data, void **handle) {
  (void)i;
  dev_env *e = ctx;
  *handle = (void *)(uintptr_t)(c->device == ENCACHE_DEVICE_CUDA);
  if (c->device == ENCACHE_DEVICE_CUDA)
    return e->rt.set_device(c->device_index) == 0 &&
                   e->rt.malloc_(data, (size_t)nbytes) == 0
               ? 0
               : ENCACHE_ENOMEM;
  *data = malloc((size_t)nbytes);
  return *data != NULL ? 0 : ENCACHE_ENOMEM;
}

static void dev_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  dev_env *e = ctx;
  if (handle != NULL) /* device memory */
    e->rt.free_(data);
  else
    free(data);
}

static encache_allocator allocator(dev_env *e) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.ctx = e;
  a.alloc = dev_alloc;
  a.release = dev_release;
  return a;
}

/* Publishes host outputs for ids (rows each) and waits for them. */
static void seed(dev_env *e, const char *const *ids, size_t n, uint64_t rows) {
  encache_step *s;
  ASSERT_EQ_INT(encache_step_open(e->ec, &s), 0);
  encache_allocator a = allocator(e);
  for (size_t k = 0; k < n; k++) {
    encache_candidate c = cand(ids[k], rows, ENCACHE_DEVICE_HOST);
    encache_result r = ENCACHE_RESULT_INIT;
    ASSERT_EQ_INT(encache_lookup(s, &c, 1, &a, &r), 0);
    float *out = malloc((size_t)rows * COLS * sizeof(float));
    ASSERT(out != NULL);
    fill(out, ids[k], rows, 0);
    int64_t shape[2] = {(int64_t)rows, COLS};
    encache_tensor v = {.size = sizeof(v), .data = out,
                        .dtype = ENCACHE_FLOAT32, .ndim = 2, .shape = shape};
    encache_storage *st;
    ASSERT_EQ_INT(encache_storage_new(out, rows * COLS * 4, free, out, &st), 0);
    ASSERT_EQ_INT(encache_publish(s, ids[k], &v, st), ENCACHE_QUEUED);
    encache_storage_unref(st);
  }
  ASSERT_EQ_INT(encache_flush(e->ec), 0);
  encache_step_close(s);
}

/* Checks that result r (a HIT of id) holds id's payload, on its device. */
static void check_hit(dev_env *e, const encache_result *r, const char *id,
                      uint64_t rows, int device, int version) {
  ASSERT_EQ_INT(r->outcome, ENCACHE_HIT);
  size_t n = (size_t)rows * COLS * sizeof(float);
  ASSERT_EQ_U64(r->nbytes, n);
  float *want = malloc(n), *got = malloc(n);
  ASSERT(want != NULL && got != NULL);
  fill(want, id, rows, version);
  if (device == ENCACHE_DEVICE_CUDA)
    ASSERT_EQ_INT(e->rt.memcpy_(got, r->data, n, CUDA_RT_D2H), 0);
  else
    memcpy(got, r->data, n);
  ASSERT_EQ_MEM(got, want, n);
  free(want);
  free(got);
}

static void env_close(dev_env *e, int expect) {
  ASSERT_EQ_INT(encache_close(e->ec), expect);
  if (e->fake != NULL && expect == 0) /* the handle's streams and events */
    ASSERT_EQ_INT(fake_get(e, "fake_cudart_live", 0), 0);
}

/* ------------------------------------------------------------- lookups */

TEST(device_no_runtime_is_skipped_with_why) {
  dev_env e;
  memset(&e, 0, sizeof(e));
  setenv("ENCACHE_CUDA_LIBRARY", "/nonexistent/libcudart.so", 1);
  env_open(&e, 1 << 20, "");
  encache_candidate c[2] = {cand("a", 2, ENCACHE_DEVICE_CUDA),
                            cand("b", 2, ENCACHE_DEVICE_HOST)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = allocator(&e);
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
  encache_candidate c = cand("a", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 0);
  ASSERT_EQ_INT(r.outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r.why, "CUDA runtime not available: no CUDA device");
  ASSERT_EQ_INT(encache_close(e.ec), 0);
}

TEST(device_lookup_bit_for_bit_chunks_duplicates_oversize) {
  dev_env e;
  if (runtime_init(&e) < 0)
    return;
  /* 16 KiB payloads in a 40 KiB staging buffer: two a chunk. */
  env_open(&e, 40 << 10, "");
  static const char *const ids[] = {"i0", "i1", "i2", "i3", "i4"};
  seed(&e, ids, 5, 4);
  static const char *const big[] = {"big"};
  seed(&e, big, 1, 16); /* 64 KiB: oversize */
  encache_candidate c[9] = {
      cand("i0", 4, ENCACHE_DEVICE_CUDA), cand("i1", 4, ENCACHE_DEVICE_CUDA),
      cand("i2", 4, ENCACHE_DEVICE_HOST), cand("i3", 4, ENCACHE_DEVICE_CUDA),
      cand("i4", 4, ENCACHE_DEVICE_CUDA), cand("i1", 4, ENCACHE_DEVICE_HOST),
      cand("i3", 4, ENCACHE_DEVICE_CUDA), cand("big", 16, ENCACHE_DEVICE_CUDA),
      cand("none", 4, ENCACHE_DEVICE_CUDA)};
  c[1].device_index = c[3].device_index = e.rt.devices > 1 ? 1 : 0;
  encache_result r[9] = {ENCACHE_RESULT_INIT};
  encache_allocator a = allocator(&e);
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
  seed(&e, ids, 2, 8);
  void *stream = NULL;
  ASSERT_EQ_INT(e.rt.stream_create(&stream, 1), 0);
  ASSERT_EQ_INT(encache_step_set_stream(e.step, stream), 0);
  ASSERT_EQ_INT(encache_step_set_stream(NULL, stream), ENCACHE_EINVAL);
  encache_candidate c[2] = {cand("s0", 8, ENCACHE_DEVICE_CUDA),
                            cand("s1", 8, ENCACHE_DEVICE_CUDA)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = allocator(&e);
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

/* --------------------------------------------------------- publication */

/* A device output of rows x COLS floats: the version's payload, copied to
 * device memory; its storage releases it. */
typedef struct dev_out {
  void *ptr;
  size_t n;
  encache_storage *st;
  encache_tensor v;
  int64_t shape[2];
} dev_out;

static void dev_out_make(dev_env *e, dev_out *o, const char *id,
                         uint64_t rows, int version) {
  memset(o, 0, sizeof(*o));
  o->n = (size_t)rows * COLS * 4;
  ASSERT_EQ_INT(e->rt.malloc_(&o->ptr, o->n), 0);
  float *host = malloc(o->n);
  ASSERT(host != NULL);
  fill(host, id, rows, version);
  ASSERT_EQ_INT(e->rt.memcpy_(o->ptr, host, o->n, CUDA_RT_H2D), 0);
  free(host);
  o->shape[0] = (int64_t)rows;
  o->shape[1] = COLS;
  o->v = (encache_tensor){.size = sizeof(o->v), .data = o->ptr,
                          .dtype = ENCACHE_FLOAT32, .ndim = 2,
                          .shape = o->shape, .device = ENCACHE_DEVICE_CUDA};
  ASSERT_EQ_INT(encache_storage_new(o->ptr, o->n, NULL, NULL, &o->st), 0);
}

/* Looks id up into host memory and checks it is the version's payload. */
static void check_stored(dev_env *e, const char *id, uint64_t rows,
                         int version) {
  encache_step *s;
  ASSERT_EQ_INT(encache_step_open(e->ec, &s), 0);
  encache_candidate c = cand(id, rows, ENCACHE_DEVICE_HOST);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(e);
  ASSERT_EQ_INT(encache_lookup(s, &c, 1, &a, &r), 1);
  check_hit(e, &r, id, rows, ENCACHE_DEVICE_HOST, version);
  free(r.data);
  encache_step_close(s);
}

/* Makes id a candidate of the env's step. */
static void candidate(dev_env *e, const char *id, uint64_t rows) {
  encache_candidate c = cand(id, rows, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(e);
  ASSERT_EQ_INT(encache_lookup(e->step, &c, 1, &a, &r), 0);
}

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

static int need_fake(const dev_env *e);

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

/* ---------------------------------------------------- injected failures */

static int need_fake(const dev_env *e) {
  if (e->fake != NULL)
    return 1;
  printf("# skipped: needs the fake runtime's failure injection\n");
  return 0;
}

TEST(device_copy_error_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"c0", "c1"};
  seed(&e, ids, 2, 2);
  fake_set_long(&e, "fake_cudart_fail_copy_after", 1); /* the second fails */
  encache_candidate c[2] = {cand("c0", 2, ENCACHE_DEVICE_CUDA),
                            cand("c1", 2, ENCACHE_DEVICE_CUDA)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  encache_allocator a = allocator(&e);
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
  seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_hang_events", 1);
  encache_candidate c = cand("h0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(&e);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), ENCACHE_EPOISONED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ASSERT(t1.tv_sec - t0.tv_sec < 10); /* bounded, not stuck */
  ASSERT_CONTAINS(encache_errmsg(e.ec), "did not complete within 200 ms");
  env_close(&e, ENCACHE_EPOISONED);
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

TEST(device_registration_failure_is_clear) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"r0"};
  seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_fail_host_memory", 1);
  encache_candidate c = cand("r0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(&e);
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

/* What a poisoned handle's device work may still read (never freed). */
void *kept_for_the_device;

TEST(device_unrecorded_event_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"e0"};
  seed(&e, ids, 1, 2);
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

TEST(device_unrecorded_lookup_event_poisons) {
  dev_env e;
  if (runtime_init(&e) < 0 || !need_fake(&e))
    return;
  env_open(&e, 1 << 20, "");
  static const char *const ids[] = {"u0"};
  seed(&e, ids, 1, 2);
  fake_set_int(&e, "fake_cudart_fail_records", 1);
  encache_candidate c = cand("u0", 2, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = allocator(&e);
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(e.ec), "cannot be confirmed (cudaEventRecord");
  env_close(&e, ENCACHE_EPOISONED);
}

/* ------------------------------------- devices other than the current one */

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
  seed(&e, ids, 1, 4);
  void *mine = NULL;
  ASSERT_EQ_INT(e.rt.set_device(1), 0);
  ASSERT_EQ_INT(e.rt.stream_create(&mine, 1), 0);
  ASSERT_EQ_INT(e.rt.set_device(0), 0);
  void *const streams[] = {NULL, (void *)1, (void *)2, mine};
  encache_allocator a = allocator(&e);
  a.alloc = guarded_alloc;
  for (int k = 0; k < 4; k++) {
    ASSERT_EQ_INT(encache_step_set_stream(e.step, streams[k]), 0);
    encache_candidate c = cand("x0", 4, ENCACHE_DEVICE_CUDA);
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
  encache_candidate c = cand("x0", 4, ENCACHE_DEVICE_CUDA);
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

/* ------------------------------------------ stream-ordered destinations */

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
  seed(&e, ids, 1, 4);
  size_t n = 4 * COLS * 4;
  ASSERT_EQ_INT(e.rt.malloc_(&stale_work, n), 0);
  void *zeros = calloc(1, n);
  ASSERT(zeros != NULL);
  ASSERT_EQ_INT(e.rt.memcpy_(stale_work, zeros, n, CUDA_RT_H2D), 0);
  free(zeros);
  encache_allocator a = allocator(&e);
  a.alloc = stream_ordered_alloc;
  encache_candidate c = cand("o0", 4, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(e.step, &c, 1, &a, &r), 1);
  check_hit(&e, &r, "o0", 4, ENCACHE_DEVICE_CUDA, 0); /* after the stale */
  dev_release(&e, 0, r.data, r.handle);
  ASSERT_EQ_INT(e.rt.free_(stale_work), 0);
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
