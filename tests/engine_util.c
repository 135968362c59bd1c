/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine_util.c: the fixtures of the engine tests (tests/test_engine_*.c):
 * an env on the Store under test behind the fault wrapper, the host
 * allocator, the reference encoder and objects written straight to the
 * Store.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

static char seg_at_exit[64]; /* not a pointer into a test's stack frame */
static void env_destroy(void) {
  if (seg_at_exit[0])
    encache_shm_destroy(seg_at_exit);
}

/* Each env works in a namespace of its own (its revision), so that tests
 * on a shared Store never see each other's objects, nor an earlier run's. */
char revision[64];
const char *test_revision(void) { return revision; }

/* The Store under test: $ENCACHE_TEST_STORE (shared), or a fresh private
 * shm segment. */
void env_init(env *e, int registration) {
  static int count;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(revision, sizeof(revision), "t%d-%lld%09ld-%d", (int)getpid(),
           (long long)ts.tv_sec, ts.tv_nsec, count++);
  memset(e, 0, sizeof(*e));
  const char *url = getenv("ENCACHE_TEST_STORE");
  if (url != NULL && url[0] != '\0') {
    snprintf(e->url, sizeof(e->url), "%s", url);
  } else {
    snprintf(e->seg, sizeof(e->seg), "encache-engtest-%d", (int)getpid());
    snprintf(e->url, sizeof(e->url), "shm://%s?size=8MiB", e->seg);
    encache_shm_destroy(e->seg);
  }
  fault_ctl_init(&e->ctl);
  e->ctl.registration = registration;
  if (e->seg[0] && !seg_at_exit[0])
    atexit(env_destroy);
  if (e->seg[0])
    snprintf(seg_at_exit, sizeof(seg_at_exit), "%s", e->seg);
}

void json_for(char *buf, size_t size, uint64_t read_buf, uint64_t items,
              uint64_t bytes) {
  snprintf(buf, size,
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", "
           "\"ec_role\": \"ec_producer\", \"ec_connector_extra_config\": {"
           "\"cross_encoder_cache\": true, \"store_read_buffer_bytes\": %llu, "
           "\"store_max_pending_items\": %llu, \"store_max_pending_bytes\": "
           "%llu}}",
           (unsigned long long)read_buf, (unsigned long long)items,
           (unsigned long long)bytes);
}

encache_options options(const char *json) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "shared/model";
  o.revision = test_revision();
  o.model_dtype = ENCACHE_FLOAT32;
  return o;
}

/* Opens an engine over the fault wrapper around the env's shm Store. */
encache *open_on(env *e, uint64_t read_buf, uint64_t items,
                 uint64_t bytes) {
  char json[512];
  json_for(json, sizeof(json), read_buf, items, bytes);
  encache_options o = options(json);
  encache_store *inner = NULL;
  if (encache_store_open(e->url, &inner) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", e->url,
               encache_store_errmsg(inner));
  encache *ec = NULL;
  int rc = encache__open_with_store(&o, fault_store_wrap(inner, &e->ctl), &ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "encache open: %s", encache_errmsg(ec));
  e->ec = ec;
  return ec;
}

encache *open_default(env *e) {
  return open_on(e, 1 << 20, 32, 1 << 30);
}

/* Opens a step of ec (it dies with the handle if the test leaves it). */
encache_step *step_of(encache *ec) {
  encache_step *step = NULL;
  int rc = encache_step_open(ec, &step);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "step open: %s", encache_errmsg(ec));
  return step;
}

int ta_alloc(void *ctx, size_t i, const encache_candidate *c,
             uint64_t nbytes, void **data, void **handle) {
  (void)c;
  talloc *t = ctx;
  if (t->fail_at && ++t->allocs == t->fail_at)
    return ENCACHE_ENOMEM;
  if (!t->fail_at)
    t->allocs++;
  *data = malloc(nbytes ? nbytes : 1);
  *handle = (void *)(uintptr_t)(i + 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

void ta_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  ((talloc *)ctx)->releases++;
  free(data);
}

encache_allocator allocator(talloc *t) {
  encache_allocator a = {sizeof(a), t, ta_alloc, ta_release, 0};
  return a;
}

encache_candidate cand(const char *id) {
  encache_candidate c = {sizeof(c), id, ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, ROWS, COLS, ENCACHE_DEVICE_HOST, 0};
  return c;
}

/* The reference encoder: a deterministic output per id. */
void encode(const char *id, float *out) {
  uint64_t h = encache__hash_id(id);
  for (int i = 0; i < ROWS * COLS; i++)
    out[i] = (float)((h >> (i * 8)) & 0xffff) / 7.0f - 3.0f;
}

/* Storages of the tests: heap buffers whose release is counted. */
int storage_releases;
void storage_release(void *ctx) {
  storage_releases++;
  free(ctx);
}

encache_storage *storage_of(float **data, size_t floats) {
  *data = calloc(floats, sizeof(float));
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(*data, floats * sizeof(float),
                                    storage_release, *data, &s),
                0);
  return s;
}

/* Publishes the reference output for id; returns publish()'s answer. */
int publish_ref(encache_step *step, const char *id) {
  float *data;
  encache_storage *s = storage_of(&data, ROWS * COLS);
  encode(id, data);
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  int rc = encache_publish(step, id, &v, s);
  encache_storage_unref(s);
  return rc;
}

/* Writes raw bytes under the handle's key for id, straight to the Store. */
void store_raw(env *e, const char *key_ns, const char *id,
               const void *obj, size_t len) {
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(e->url, &st), 0);
  char key[512];
  ASSERT(encache_key(key_ns, id, key, sizeof(key)) > 0);
  int rc = encache_store_write(st, key, NULL, 0, obj, len);
  /* EEXIST: a fixed key written by an earlier run on a shared Store. */
  if (rc != 0 && rc != ENCACHE_EEXIST)
    test__fail(__FILE__, __LINE__, "write %s: %s", key,
               encache_store_errmsg(st));
  encache_store_close(st);
}

/* A valid v3 object for id, as the reference encoder makes it. */
size_t ref_object(const char *id, unsigned char *obj) {
  float out[ROWS * COLS];
  encode(id, out);
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor t = {sizeof t, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  memcpy(obj + 24, out, sizeof(out));
  return 24 + sizeof(out);
}

/* Waits until the worker has finished every job (without reaping). */
void wait_worker_idle(encache *ec) {
  pthread_mutex_lock(&ec->pub->mu);
  while (ec->pub->queue_head != NULL || ec->pub->running != NULL)
    pthread_cond_wait(&ec->pub->idle, &ec->pub->mu);
  pthread_mutex_unlock(&ec->pub->mu);
}

/* Stores valid objects for ids through a first handle's namespace. */
void seed(env *e, const char *ns, const char *const *ids, int n) {
  for (int i = 0; i < n; i++) {
    unsigned char obj[64];
    size_t len = ref_object(ids[i], obj);
    store_raw(e, ns, ids[i], obj, len);
  }
}

int lookup_ids(encache_step *step, const char *const *ids, int n,
               encache_result *r, talloc *t) {
  encache_candidate c[16];
  for (int i = 0; i < n; i++)
    c[i] = cand(ids[i]);
  encache_allocator a = allocator(t);
  r[0].size = sizeof(r[0]);
  return encache_lookup(step, c, (size_t)n, &a, r);
}

void free_hits(encache_result *r, int n) {
  for (int i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT)
      free(r[i].data);
}
