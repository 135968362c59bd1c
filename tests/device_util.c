/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device_util.c: what the CUDA tests (tests/test_device_*.c) share: the
 * runtime (the fake of tests/fake_cudart.c: a thread per stream, a delay
 * per operation so that a missing wait reads stale bytes, and failure
 * injection; or the real one), the shm Store, the allocators, and device
 * outputs to publish.
 */
#include "device_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

static char seg_at_exit[64];
static void seg_destroy(void) {
  if (seg_at_exit[0])
    encache_shm_destroy(seg_at_exit);
}

int real_runtime(void) {
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

void fake_set_long(const dev_env *e, const char *name, long v) {
  void (*f)(long);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  if (p != NULL)
    f(v);
}

void fake_set_int(const dev_env *e, const char *name, int v) {
  void (*f)(int);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  if (p != NULL)
    f(v);
}

long fake_get(const dev_env *e, const char *name, int arg) {
  long (*f)(int);
  void *p = fake_fn(e, name);
  memcpy(&f, &p, sizeof(f));
  return p != NULL ? f(arg) : 0;
}

/* Points libencache at the fake (unless on the real runtime), loads the
 * runtime for the test's own device memory; 0, or -1 (no runtime: the
 * caller skips). */
int runtime_init(dev_env *e) {
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
void env_open(dev_env *e, uint64_t read_buf, const char *extra) {
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

encache_candidate dev_cand(const char *id, uint64_t rows, int device) {
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
void fill(float *out, const char *id, uint64_t rows, int version) {
  uint32_t h = 2166136261u;
  for (const char *s = id; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  for (uint64_t k = 0; k < rows * COLS; k++)
    out[k] = (float)((h + k * 7u + (uint64_t)version * 1000003u) % 65521u);
}

/* Destinations: device memory for CUDA candidates, else malloc. */
int dev_alloc(void *ctx, size_t i, const encache_candidate *c,
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

void dev_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  dev_env *e = ctx;
  if (handle != NULL) /* device memory */
    e->rt.free_(data);
  else
    free(data);
}

encache_allocator dev_allocator(dev_env *e) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.ctx = e;
  a.alloc = dev_alloc;
  a.release = dev_release;
  return a;
}

/* Publishes host outputs for ids (rows each) and waits for them. */
void dev_seed(dev_env *e, const char *const *ids, size_t n, uint64_t rows) {
  encache_step *s;
  ASSERT_EQ_INT(encache_step_open(e->ec, &s), 0);
  encache_allocator a = dev_allocator(e);
  for (size_t k = 0; k < n; k++) {
    encache_candidate c = dev_cand(ids[k], rows, ENCACHE_DEVICE_HOST);
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
void check_hit(dev_env *e, const encache_result *r, const char *id,
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

void env_close(dev_env *e, int expect) {
  ASSERT_EQ_INT(encache_close(e->ec), expect);
  if (e->fake != NULL && expect == 0) /* the handle's streams and events */
    ASSERT_EQ_INT(fake_get(e, "fake_cudart_live", 0), 0);
}

/* A device output of rows x COLS floats: the version's payload, copied to
 * device memory; its storage releases it. */
void dev_out_make(dev_env *e, dev_out *o, const char *id,
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
void check_stored(dev_env *e, const char *id, uint64_t rows,
                  int version) {
  encache_step *s;
  ASSERT_EQ_INT(encache_step_open(e->ec, &s), 0);
  encache_candidate c = dev_cand(id, rows, ENCACHE_DEVICE_HOST);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(e);
  ASSERT_EQ_INT(encache_lookup(s, &c, 1, &a, &r), 1);
  check_hit(e, &r, id, rows, ENCACHE_DEVICE_HOST, version);
  free(r.data);
  encache_step_close(s);
}

/* Makes id a candidate of the env's step. */
void candidate(dev_env *e, const char *id, uint64_t rows) {
  encache_candidate c = dev_cand(id, rows, ENCACHE_DEVICE_CUDA);
  encache_result r = ENCACHE_RESULT_INIT;
  encache_allocator a = dev_allocator(e);
  ASSERT_EQ_INT(encache_lookup(e->step, &c, 1, &a, &r), 0);
}

/* 1 on the fake runtime; else says "skipped" and returns 0. */
int need_fake(const dev_env *e) {
  if (e->fake != NULL)
    return 1;
  printf("# skipped: needs the fake runtime's failure injection\n");
  return 0;
}

/* What a poisoned handle's device work may still read (never freed). */
void *kept_for_the_device;
