/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine against the 16 acceptance cases of docs/behaviour.md, on the
 * real shm Store, with a fault-injecting wrapper for the error cases.
 * Case 1 (keys), 2 (configuration), 3 (codec), 8 and 10 (header
 * validation) also have unit tests of their own parts; here they run
 * through the engine.
 */
#include "runner.h"
#include "store_util.h"

#include "engine.h"
#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"
#include "fault_store.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define ROWS 2
#define COLS 2 /* float32 2x2: 16 payload bytes, 40-byte objects */

/* ------------------------------------------------------------- fixtures */

typedef struct env {
  char url[128];
  char seg[64];
  fault_ctl ctl;
  encache *ec;
} env;

static char seg_at_exit[64]; /* not a pointer into a test's stack frame */
static void env_destroy(void) {
  if (seg_at_exit[0])
    encache_shm_destroy(seg_at_exit);
}

/* Each env works in a namespace of its own (its revision), so that tests
 * on a shared Store never see each other's objects, nor an earlier run's. */
static char revision[64];
static const char *test_revision(void) { return revision; }

/* The Store under test: $ENCACHE_TEST_STORE (shared), or a fresh private
 * shm segment. */
static void env_init(env *e, int registration) {
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

static void json_for(char *buf, size_t size, uint64_t read_buf, uint64_t items,
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


static encache_options options(const char *json) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "shared/model";
  o.revision = test_revision();
  o.model_dtype = ENCACHE_FLOAT32;
  return o;
}

/* Opens an engine over the fault wrapper around the env's shm Store. */
static encache *open_on(env *e, uint64_t read_buf, uint64_t items,
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

static encache *open_default(env *e) {
  return open_on(e, 1 << 20, 32, 1 << 30);
}

/* Opens a step of ec (it dies with the handle if the test leaves it). */
static encache_step *step_of(encache *ec) {
  encache_step *step = NULL;
  int rc = encache_step_open(ec, &step);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "step open: %s", encache_errmsg(ec));
  return step;
}

/* The host allocator of the tests: counts, can fail the n-th call. */
typedef struct talloc {
  int allocs, releases, fail_at;
} talloc;

static int ta_alloc(void *ctx, size_t i, const encache_candidate *c,
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

static void ta_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  ((talloc *)ctx)->releases++;
  free(data);
}

static encache_allocator allocator(talloc *t) {
  encache_allocator a = {sizeof(a), t, ta_alloc, ta_release, 0};
  return a;
}

static encache_candidate cand(const char *id) {
  encache_candidate c = {sizeof(c), id, ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, ROWS, COLS, ENCACHE_DEVICE_HOST, 0};
  return c;
}

/* The reference encoder: a deterministic output per id. */
static void encode(const char *id, float *out) {
  uint64_t h = encache__hash_id(id);
  for (int i = 0; i < ROWS * COLS; i++)
    out[i] = (float)((h >> (i * 8)) & 0xffff) / 7.0f - 3.0f;
}

/* Storages of the tests: heap buffers whose release is counted. */
static int storage_releases;
static void storage_release(void *ctx) {
  storage_releases++;
  free(ctx);
}

static encache_storage *storage_of(float **data, size_t floats) {
  *data = calloc(floats, sizeof(float));
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(*data, floats * sizeof(float),
                                    storage_release, *data, &s),
                0);
  return s;
}

/* Publishes the reference output for id; returns publish()'s answer. */
static int publish_ref(encache_step *step, const char *id) {
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
static void store_raw(env *e, const char *key_ns, const char *id,
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
static size_t ref_object(const char *id, unsigned char *obj) {
  float out[ROWS * COLS];
  encode(id, out);
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor t = {sizeof t, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  memcpy(obj + 24, out, sizeof(out));
  return 24 + sizeof(out);
}

/* Waits until the worker has finished every job (without reaping). */
static void wait_worker_idle(encache *ec) {
  pthread_mutex_lock(&ec->pub->mu);
  while (ec->pub->queue_head != NULL || ec->pub->running != NULL)
    pthread_cond_wait(&ec->pub->idle, &ec->pub->mu);
  pthread_mutex_unlock(&ec->pub->mu);
}

/* ------------------------------------------------------------ the cases */

TEST(engine_case01_keys_through_the_handle) {
  env e;
  env_init(&e, 0);
  char json[] = "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                "true, \"embedding_cache_prefix\": \"team@cache\", "
                "\"embedding_model_identity\": \"shared/model\"}}";
  encache_options o = options(json);
  o.model = "/models/some/path"; /* replaced by the identity */
  o.revision = "rev:1";
  o.store_url = e.url;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  encache_step *step = step_of(ec);
  ASSERT_EQ_STR(encache_namespace_of(ec),
                "team@cache@embedding@model:shared/model@revision:rev:1"
                "@encoder:encoder:default@dtype:torch.float32@protocol:v3");
  /* A published output lands under exactly the vector's key. */
  encache_candidate c = cand("image@1");
  encache_result r = ENCACHE_RESULT_INIT;
  talloc t = {0};
  encache_allocator a = allocator(&t);
  /* A shared Store may hold it from an earlier run: the vector's key is
   * fixed, and objects are never replaced. */
  int h = encache_lookup(step, &c, 1, &a, &r);
  ASSERT(h == 0 || h == 1);
  if (h == 1)
    free(r.data);
  ASSERT_EQ_INT(publish_ref(step, "image@1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_close(ec), 0);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(e.url, &st), 0);
  uint64_t len;
  ASSERT_EQ_INT(encache_store_object_size(
                    st,
                    "team@cache@embedding@model:shared/model@revision:rev:1"
                    "@encoder:encoder:default@dtype:torch.float32@protocol:v3"
                    "@id:image@1",
                    &len),
                0);
  ASSERT_EQ_U64(len, 40);
  encache_store_close(st);
}

TEST(engine_case02_startup_refusals) {
  static const char *const limits[] = {"store_max_pending_items",
                                       "store_max_pending_bytes",
                                       "store_read_buffer_bytes"};
  static const char *const bad[] = {"0", "-3", "2.5", "\"eight\"", "true"};
  for (size_t i = 0; i < 3; i++)
    for (size_t k = 0; k < 5; k++) {
      char json[256];
      snprintf(json, sizeof(json),
               "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
               "true, \"%s\": %s}}", limits[i], bad[k]);
      encache_options o = options(json);
      o.store_url = "shm://never-opened";
      encache *ec = NULL;
      ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
      ASSERT_CONTAINS(encache_errmsg(ec), limits[i]);
      ASSERT_EQ_INT(encache_close(ec), 0);
    }
  /* Unstable identifiers: the processor cache is off. */
  encache_deployment d;
  encache_deployment_defaults(&d);
  d.mm_processor_cache_gb = 0;
  encache_options o = options("{\"ec_connector_extra_config\": "
                              "{\"cross_encoder_cache\": true}}");
  o.deployment = &d;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_errmsg(ec), "stable content hashes");
  encache_close(ec);
  /* With reuse off nothing is created: not even a Store. */
  o = options("{\"ec_connector_extra_config\": {}}");
  o.store_url = "nosuch://store";
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  encache_step *step = step_of(ec);
  ASSERT_EQ_INT(encache_enabled(ec), 0);
  encache_candidate c = cand("x");
  encache_result r = ENCACHE_RESULT_INIT;
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 0);
  ASSERT_EQ_INT(r.outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(publish_ref(step, "x"), ENCACHE_SKIP_DISABLED);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case03_roundtrip_every_dtype) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const int dtypes[] = {ENCACHE_FLOAT32, ENCACHE_FLOAT16,
                               ENCACHE_BFLOAT16};
  static const char *const ids[] = {"f32", "f16", "bf16"};
  unsigned char payload[3][2 * 3 * 4];
  for (int k = 0; k < 3; k++) {
    for (size_t b = 0; b < sizeof(payload[k]); b++)
      payload[k][b] = (unsigned char)(b * 37 + (size_t)k * 101 + 0x80);
    encache_candidate c = cand(ids[k]);
    c.dtype = dtypes[k];
    c.rows = 2;
    c.cols = 3;
    encache_result r = ENCACHE_RESULT_INIT;
    talloc t = {0};
    encache_allocator a = allocator(&t);
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 0);
    ASSERT_EQ_INT(r.outcome, ENCACHE_MISS);
    size_t nbytes = 6 * encache_dtype_size(dtypes[k]);
    unsigned char *copy = malloc(nbytes);
    memcpy(copy, payload[k], nbytes);
    encache_storage *s = NULL;
    encache_storage_new(copy, nbytes, storage_release, copy, &s);
    int64_t shape[2] = {2, 3};
    encache_tensor v = {sizeof v, copy, dtypes[k], 2, shape, NULL, 0, 0, NULL};
    ASSERT_EQ_INT(encache_publish(step, ids[k], &v, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 1);
    ASSERT_EQ_INT(r.outcome, ENCACHE_HIT);
    ASSERT_EQ_U64(r.nbytes, nbytes);
    ASSERT_EQ_MEM(r.data, payload[k], nbytes);
    free(r.data);
    /* The object is 24 + nbytes long. */
    encache_store *st = NULL;
    encache_store_open(e.url, &st);
    char key[512];
    encache_key(encache_namespace_of(ec), ids[k], key, sizeof(key));
    uint64_t len;
    ASSERT_EQ_INT(encache_store_object_size(st, key, &len), 0);
    ASSERT_EQ_U64(len, 24 + nbytes);
    encache_store_close(st);
  }
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* Stores valid objects for ids through a first handle's namespace. */
static void seed(env *e, const char *ns, const char *const *ids, int n) {
  for (int i = 0; i < n; i++) {
    unsigned char obj[64];
    size_t len = ref_object(ids[i], obj);
    store_raw(e, ns, ids[i], obj, len);
  }
}

static int lookup_ids(encache_step *step, const char *const *ids, int n,
                      encache_result *r, talloc *t) {
  encache_candidate c[16];
  for (int i = 0; i < n; i++)
    c[i] = cand(ids[i]);
  encache_allocator a = allocator(t);
  r[0].size = sizeof(r[0]);
  return encache_lookup(step, c, (size_t)n, &a, r);
}

static void free_hits(encache_result *r, int n) {
  for (int i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT)
      free(r[i].data);
}

TEST(engine_case04_chunking_and_one_registration) {
  static const char *const ids[] = {"a", "b", "c"};
  for (int pass = 0; pass < 2; pass++) {
    env e;
    env_init(&e, 1);
    encache *ec = open_on(&e, pass == 0 ? 80 : 120, 32, 1 << 20);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 3);
    encache_result r[3];
    talloc t = {0};
    for (int round = 0; round < 5; round++) {
      ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), 3);
      for (int i = 0; i < 3; i++) {
        float want[ROWS * COLS];
        encode(ids[i], want);
        ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
      }
      if (round < 4)
        free_hits(r, 3);
    }
    /* 80 bytes: two 40-byte objects per read, so two reads per lookup;
     * 120 bytes: one. */
    ASSERT_EQ_INT(e.ctl.read_calls, pass == 0 ? 10 : 5);
    ASSERT_EQ_INT(e.ctl.exists_calls, 5);
    ASSERT_EQ_INT(e.ctl.register_calls, 1);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
    encache_stats s = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &s);
    ASSERT_EQ_U64(s.staging_allocations, 1);
    ASSERT_EQ_U64(s.staging_bytes, pass == 0 ? 80 : 120);
    /* Outputs are independent of the Store: change it, they stay. */
    unsigned char junk[40];
    memset(junk, 0x77, sizeof(junk));
    encache_store *st = NULL;
    encache_store_open(e.url, &st);
    char key[512];
    encache_key(encache_namespace_of(ec), "a", key, sizeof(key));
    encache_store_remove(st, key);
    encache_store_write(st, key, NULL, 0, junk, sizeof(junk));
    encache_store_close(st);
    float want[ROWS * COLS];
    encode("a", want);
    ASSERT_EQ_MEM(r[0].data, want, sizeof(want));
    free_hits(r, 3);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 1);
    ASSERT_EQ_INT(e.ctl.registered, 0);
    ASSERT_EQ_INT(e.ctl.close_calls, 1);
    encache_shm_destroy(e.seg);
  }
}

TEST(engine_case05_nothing_allocated_without_hits) {
  env e;
  env_init(&e, 1);
  encache *ec = open_on(&e, 30, 32, 1 << 20); /* every object is oversize */
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"p", "q"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0); /* all miss */
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  seed(&e, encache_namespace_of(ec), ids, 2);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0); /* all oversize */
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_INT(e.ctl.read_calls, 0);
  ASSERT_EQ_INT(e.ctl.register_calls, 0);
  ASSERT_EQ_INT(t.allocs, 0);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.staging_allocations, 0);
  ASSERT_EQ_U64(s.oversize, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}

TEST(engine_case06_malformed_read_answers_poison) {
  static const int modes[] = {READ_ITEM_CODE, READ_COUNT_ABOVE, -1};
  static const char *const ids[] = {"m1", "m2"};
  for (int k = 0; k < 6; k++) { /* each answer, staged then direct reads */
    env e;
    env_init(&e, k < 3);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 2);
    if (modes[k % 3] == -1) {
      e.ctl.read_rc = ENCACHE_EUNCONFIRMED; /* a wrong-length answer */
    } else {
      e.ctl.read_mode = modes[k % 3];
      e.ctl.read_item_code = -12345; /* an unknown code */
    }
    static encache_result r[6][2]; /* kept destinations stay reachable */
    talloc t = {0};
    ASSERT_EQ_INT(lookup_ids(step, ids, 2, r[k], &t), ENCACHE_EPOISONED);
    ASSERT_CONTAINS(encache_errmsg(ec), "poisoned");
    int reads = e.ctl.read_calls, exists = e.ctl.exists_calls;
    /* Fails fast, without calling the Store. */
    encache_result again[2];
    ASSERT_EQ_INT(lookup_ids(step, ids, 2, again, &t), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(e.ctl.read_calls, reads);
    ASSERT_EQ_INT(e.ctl.exists_calls, exists);
    ASSERT_EQ_INT(publish_ref(step, "m1"), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 0); /* nothing unregistered */
    ASSERT_EQ_INT(e.ctl.registered, k < 3);
    ASSERT_EQ_INT(t.releases, 0); /* destinations the Store wrote are kept */
    encache_shm_destroy(e.seg);
  }
}

static int fail_copy(void *dst, const void *src, size_t n) {
  (void)dst;
  (void)src;
  (void)n;
  return -1;
}

TEST(engine_case07_allocation_failure_and_failed_copy) {
  static const char *const ids[] = {"x1", "x2", "x3"};
  encache_result r[3];
  { /* Direct reads: the allocation fails before the read. */
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 3);
    talloc t = {0, 0, 2};
    ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), ENCACHE_ENOMEM);
    ASSERT_EQ_INT(t.releases, 1);
    talloc ok = {0};
    ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &ok), 3);
    free_hits(r, 3);
    ASSERT_EQ_INT(encache_close(ec), 0);
    encache_shm_destroy(e.seg);
  }
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  seed(&e, encache_namespace_of(ec), ids, 3);
  talloc t = {0, 0, 2}; /* the second destination fails */
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), ENCACHE_ENOMEM);
  ASSERT_EQ_INT(t.releases, 1); /* the first was handed back */
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_INT(st.poisoned, 0);
  /* Healthy: the next lookup works. */
  talloc ok = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &ok), 3);
  free_hits(r, 3);
  /* A failed (device) copy poisons and keeps staging and destinations. */
  encache__copy_hook = fail_copy;
  talloc t2 = {0};
  static encache_result kept[3]; /* destinations stay alive, reachable */
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, kept, &t2), ENCACHE_EPOISONED);
  encache__copy_hook = NULL;
  ASSERT(t2.allocs == 3);
  ASSERT_EQ_INT(t2.releases, 0);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}

TEST(engine_case08_3d_output_refused_before_registration) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"three"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  float *data;
  encache_storage *s = storage_of(&data, 8);
  int64_t shape[3] = {2, 2, 2};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 3, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &v, s), ENCACHE_SKIP_NOT_MATRIX);
  int64_t strides[2] = {1, 2};
  int64_t shape2[2] = {2, 2};
  encache_tensor tv = {sizeof tv, data, ENCACHE_FLOAT32, 2, shape2, strides, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &tv, s),
                ENCACHE_SKIP_NOT_CONTIGUOUS);
  encache_tensor iv = {sizeof iv, data, 7, 2, shape2, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &iv, s), ENCACHE_SKIP_DTYPE);
  encache_storage_unref(s);
  ASSERT_EQ_INT(storage_releases, 1); /* not retained */
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(e.ctl.register_calls, 0);
  ASSERT_EQ_INT(e.ctl.write_calls, 0);
  ASSERT_EQ_INT(e.ctl.exists_calls, 1); /* the lookup's only */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* One encoder step over ids: lookup, encode the non-hits (counted), check
 * every output bit-exact, publish what was encoded. */
static void encoder_step(encache *ec, const char *const *ids, int n,
                         int *encoded) {
  encache_result r[16];
  talloc t = {0};
  encache_step *step = step_of(ec);
  int hits = lookup_ids(step, ids, n, r, &t);
  ASSERT(hits >= 0);
  for (int i = 0; i < n; i++) {
    float want[ROWS * COLS];
    encode(ids[i], want);
    if (r[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
      free(r[i].data);
      continue;
    }
    (*encoded)++;
    int q = publish_ref(step, ids[i]);
    ASSERT(q == ENCACHE_QUEUED);
  }
  encache_step_close(step);
  ASSERT_EQ_INT(encache_flush(ec), 0);
}

TEST(engine_case09_end_to_end_scenarios) {
  static const char *const ids[] = {"e1", "e2", "e3", "e4"};
  enum { ALL_MISS, OLD_PROTOCOL, ALL_HIT, PARTIAL, NOT_FOUND, SHORT, LEASE,
         REGISTRATION, NSCEN };
  for (int run = 0; run < 2 * NSCEN; run++) { /* staged, then direct */
    int sc = run % NSCEN;
    if (run >= NSCEN && sc == REGISTRATION)
      continue; /* direct reads register nothing */
    env e;
    env_init(&e, run < NSCEN);
    encache *ec = open_default(&e);
    const char *ns = encache_namespace_of(ec);
    int seeded = 0;
    if (sc == OLD_PROTOCOL) {
      char old[512];
      snprintf(old, sizeof(old), "%.*sprotocol:v2", (int)(strlen(ns) - 11), ns);
      seed(&e, old, ids, 4);
    } else if (sc == ALL_HIT || sc == NOT_FOUND || sc == SHORT ||
               sc == LEASE || sc == REGISTRATION) {
      seed(&e, ns, ids, 4);
      seeded = 4;
    } else if (sc == PARTIAL) {
      seed(&e, ns, ids, 2);
      seeded = 2;
    }
    if (sc == NOT_FOUND) {
      e.ctl.read_mode = READ_ITEM_CODE;
      e.ctl.read_item_code = ENCACHE_ENOENT;
    } else if (sc == SHORT) {
      e.ctl.read_mode = READ_SHORT;
    } else if (sc == LEASE) {
      e.ctl.read_mode = READ_ITEM_CODE;
      e.ctl.read_item_code = ENCACHE_EUNAVAIL; /* lease expired */
    } else if (sc == REGISTRATION) {
      e.ctl.fail_register_from = 1;
    }
    int encoded = 0;
    encoder_step(ec, ids, 4, &encoded);
    int expect_encoded =
        sc == ALL_HIT ? 0 : sc == PARTIAL ? 2 : (seeded && sc != NOT_FOUND &&
                                                 sc != SHORT && sc != LEASE &&
                                                 sc != REGISTRATION) ? 0 : 4;
    if (encoded != expect_encoded)
      test__fail(__FILE__, __LINE__, "scenario %d: encoded %d, expected %d",
                 sc, encoded, expect_encoded);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.registered, 0); /* nothing stays registered */
    if (sc == ALL_MISS) {
      /* A fresh handle loads everything the first one published. */
      fault_ctl_init(&e.ctl);
      encache *ec2 = open_default(&e);
      encoded = 0;
      encoder_step(ec2, ids, 4, &encoded);
      ASSERT_EQ_INT(encoded, 0);
      ASSERT_EQ_INT(encache_close(ec2), 0);
    }
    encache_shm_destroy(e.seg);
  }
}

TEST(engine_case10_incompatible_objects_are_misses) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  const char *ns = encache_namespace_of(ec);
  unsigned char good[64], obj[64];
  size_t len = ref_object("valid", good);
  store_raw(&e, ns, "valid", good, len);
  /* Another revision's namespace: never seen. */
  store_raw(&e, "embedding@model:shared/model@revision:other@encoder:encoder:"
                "default@dtype:torch.float32@protocol:v3", "rev", good, len);
  /* Shape 4x1 (same size), dtype float16 2x4 (same size), bad magic. */
  memcpy(obj, good, len);
  obj[8] = 4;
  obj[16] = 1;
  store_raw(&e, ns, "shape", obj, len);
  memcpy(obj, good, len);
  obj[4] = 11;
  obj[16] = 4;
  store_raw(&e, ns, "dtype", obj, len);
  memcpy(obj, good, len);
  obj[0] ^= 0xff;
  store_raw(&e, ns, "magic", obj, len);
  store_raw(&e, ns, "shorthdr", good, 20);
  store_raw(&e, ns, "shortdata", good, len - 4);
  memcpy(obj, good, len);
  store_raw(&e, ns, "longdata", obj, len + 8);
  static const char *const ids[] = {"rev",   "shape",     "dtype",
                                    "magic", "shorthdr", "shortdata",
                                    "longdata", "valid"};
  static const int want[] = {ENCACHE_MISS,         ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_HIT};
  static const int verdict[] = {0, ENCACHE_BAD_SHAPE, ENCACHE_BAD_DTYPE,
                                ENCACHE_BAD_MAGIC, ENCACHE_BAD_LENGTH,
                                ENCACHE_BAD_LENGTH, ENCACHE_BAD_LENGTH, 0};
  encache_result r[8];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 8, r, &t), 1);
  for (int i = 0; i < 8; i++) {
    if (r[i].outcome != want[i] ||
        (want[i] == ENCACHE_INCOMPATIBLE && r[i].verdict != verdict[i]))
      test__fail(__FILE__, __LINE__, "%s: %s/%s, expected %s/%s", ids[i],
                 encache_outcome_name(r[i].outcome),
                 encache_verdict_name(r[i].verdict),
                 encache_outcome_name(want[i]), encache_verdict_name(verdict[i]));
  }
  ASSERT_EQ_U64(r[1].found.rows, 4); /* what was found is reported */
  free_hits(r, 8);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_INT(s.poisoned, 0);
  ASSERT_EQ_U64(s.incompatible, 6);
  /* Incompatible objects are never overwritten by a publication. */
  ASSERT_EQ_INT(publish_ref(step, "shape"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.published_present, 1);
  ASSERT_EQ_U64(s.published_written, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case11_rejected_header_registration_is_recoverable) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"h"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  e.ctl.fail_register_from = 1; /* the header's registration */
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "h"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(e.ctl.write_calls, 0); /* not issued */
  ASSERT_EQ_INT(storage_releases, 1); /* released at reap */
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.published_failed, 1);
  ASSERT_EQ_U64(s.pending_bytes, 0);
  ASSERT_EQ_INT(s.poisoned, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case12_unregistration_unconfirmed_quota_budget) {
  static const char *const ids[] = {"u"};
  encache_result r[1];
  talloc t = {0};
  /* A failed unregistration poisons and keeps the buffers. */
  {
    env e;
    env_init(&e, 1);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    e.ctl.fail_unregister = 1;
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(storage_releases, 0);
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
    encache_shm_destroy(e.seg);
  }
  /* An unconfirmed write result poisons and keeps the tensor. */
  {
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    e.ctl.write_rc = ENCACHE_EUNCONFIRMED;
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(storage_releases, 0);
    encache_stats s = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &s);
    ASSERT_EQ_U64(s.pending_bytes, 16); /* the charge is kept */
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
    encache_shm_destroy(e.seg);
  }
  /* A quota-exceeded write is recoverable and releases the tensor. */
  {
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    e.ctl.write_rc = ENCACHE_EUNAVAIL;
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    ASSERT_EQ_INT(storage_releases, 1);
    ASSERT_EQ_INT(encache_close(ec), 0);
    encache_shm_destroy(e.seg);
  }
  /* Over budget: skipped, the caller's tensor is not retained. */
  {
    env e;
    env_init(&e, 0);
    encache *ec = open_on(&e, 1 << 20, 32, 8); /* 8 bytes < 16 */
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_SKIP_OVER_BYTES);
    ASSERT_EQ_INT(storage_releases, 1); /* released at the caller's unref */
    ASSERT_EQ_INT(e.ctl.write_calls, 0);
    ASSERT_EQ_INT(encache_close(ec), 0);
  }
}

TEST(engine_case13_view_charges_its_whole_storage) {
  env e;
  env_init(&e, 0);
  encache *ec = open_on(&e, 1 << 20, 1, 1 << 20); /* one item at most */
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"v1", "v2"};
  encache_result r[2];
  talloc t = {0};
  lookup_ids(step, ids, 2, r, &t);
  e.ctl.hold_writes = 1;
  float *data;
  encache_storage *s = storage_of(&data, 16); /* 64 bytes */
  int64_t shape[2] = {2, 2};
  encache_tensor v = {sizeof v, data + 4, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  storage_releases = 0;
  ASSERT_EQ_INT(encache_publish(step, "v1", &v, s), ENCACHE_QUEUED);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 64);
  ASSERT_EQ_U64(st.pending_items, 1);
  /* The item limit. */
  encache_tensor v2 = {sizeof v2, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "v2", &v2, s), ENCACHE_SKIP_OVER_ITEMS);
  encache_storage_unref(s);
  ASSERT_EQ_INT(storage_releases, 0);
  fault_wait_held(&e.ctl, 1);
  fault_release_writes(&e.ctl);
  fault_wait_finished(&e.ctl, 1);
  /* Written, but released only at reap. */
  ASSERT_EQ_INT(storage_releases, 0);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(storage_releases, 1);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 0);
  ASSERT_EQ_U64(st.pending_items, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case14_two_views_charged_once) {
  for (int rejected = 0; rejected < 2; rejected++) {
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    static const char *const ids[] = {"w1", "w2"};
    encache_result r[2];
    talloc t = {0};
    lookup_ids(step, ids, 2, r, &t);
    if (rejected)
      e.ctl.write_rc = ENCACHE_EUNAVAIL;
    e.ctl.hold_writes = 1;
    float *data;
    encache_storage *s = storage_of(&data, 16); /* 64 bytes */
    int64_t shape[2] = {ROWS, COLS};
    encache_tensor a = {sizeof a, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    encache_tensor b = {sizeof b, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    storage_releases = 0;
    ASSERT_EQ_INT(encache_publish(step, "w1", &a, s), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_publish(step, "w2", &b, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    encache_stats st = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 64);
    ASSERT_EQ_U64(st.pending_items, 2);
    /* Let w1's write through and hold w2's at the gate: once w1's write
     * has finished and w2's is held, the worker has put w1 on the done
     * list and runs w2, which cannot finish before it is released. */
    fault_pass_writes(&e.ctl, 1);
    fault_wait_finished(&e.ctl, 1);
    fault_wait_held(&e.ctl, 1);
    pthread_mutex_lock(&ec->pub->mu);
    int w1_done = ec->pub->done_head != NULL && ec->pub->done_head->next == NULL &&
                  strcmp(ec->pub->done_head->key + strlen(ec->pub->done_head->key) - 2,
                         "w1") == 0;
    int w2_running = ec->pub->running != NULL && ec->pub->queue_head == NULL;
    pthread_mutex_unlock(&ec->pub->mu);
    ASSERT(w1_done);
    ASSERT(w2_running);
    /* Reap the first only: the storage stays charged and retained. */
    ASSERT_EQ_INT(encache__reap(ec), 0);
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 64);
    ASSERT_EQ_U64(st.pending_items, 1);
    ASSERT_EQ_INT(storage_releases, 0);
    fault_release_writes(&e.ctl);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 0);
    ASSERT_EQ_INT(storage_releases, 1);
    ASSERT_EQ_INT(encache_close(ec), 0);
    encache_shm_destroy(e.seg);
  }
}

/* encache_storage_ref(): a caller that dropped its reference takes another
 * from a queued write's, publishes a second view, and the storage is
 * charged once and released once. */
TEST(engine_storage_ref_shares_the_charge) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"r1", "r2"};
  encache_result r[2];
  talloc t = {0};
  lookup_ids(step, ids, 2, r, &t);
  e.ctl.hold_writes = 1;
  float *data;
  encache_storage *s = storage_of(&data, 16); /* 64 bytes */
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor a = {sizeof a, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  encache_tensor b = {sizeof b, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  storage_releases = 0;
  ASSERT_EQ_INT(encache_publish(step, "r1", &a, s), ENCACHE_QUEUED);
  encache_storage_unref(s); /* only the queued write holds it now */
  encache_storage_ref(s);   /* no reap can run meanwhile: safe */
  ASSERT_EQ_INT(encache_publish(step, "r2", &b, s), ENCACHE_QUEUED);
  encache_storage_unref(s);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 64);
  ASSERT_EQ_U64(st.pending_items, 2);
  ASSERT_EQ_INT(storage_releases, 0);
  fault_release_writes(&e.ctl);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(storage_releases, 1);
  encache_storage_ref(NULL); /* a no-op */
  ASSERT_EQ_INT(encache_close(ec), 0);
  encache_shm_destroy(e.seg);
}

TEST(engine_case15_fatal_after_reaper_looked) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"f1", "f2", "f3"};
  encache_result r[3];
  talloc t = {0};
  lookup_ids(step, ids, 3, r, &t);
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "f1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0); /* f1 written and released */
  ASSERT_EQ_INT(storage_releases, 1);
  e.ctl.hold_writes = 1;
  ASSERT_EQ_INT(publish_ref(step, "f2"), ENCACHE_QUEUED);
  fault_wait_held(&e.ctl, 1);
  /* The reaper looks while f2 is in flight: nothing to report yet. */
  ASSERT_EQ_INT(lookup_ids(step, ids + 2, 1, r, &t), 0);
  e.ctl.write_rc = ENCACHE_EUNCONFIRMED;
  fault_release_writes(&e.ctl);
  wait_worker_idle(ec);
  /* Caught by the next reap; later publications fail. */
  ASSERT_EQ_INT(publish_ref(step, "f3"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(publish_ref(step, "f3"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), ENCACHE_EPOISONED);
  /* f1's, and the two refused f3's (never retained); f2's is kept. */
  ASSERT_EQ_INT(storage_releases, 3);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(storage_releases, 3);
}

typedef struct closer {
  encache *ec;
  int rc;
} closer;

static void *close_thread(void *p) {
  closer *c = p;
  c->rc = encache_close(c->ec);
  return NULL;
}

TEST(engine_case16_shutdown_drains) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"s1", "s2"};
  encache_result r[2];
  talloc t = {0};
  /* A hit first, so that the staging buffer is registered. */
  seed(&e, encache_namespace_of(ec), ids + 1, 1);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 1);
  free_hits(r, 2);
  e.ctl.hold_writes = 1;
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "s1"), ENCACHE_QUEUED);
  fault_wait_held(&e.ctl, 1);
  closer c = {ec, -1};
  pthread_t th;
  pthread_create(&th, NULL, close_thread, &c);
  /* Once closing, later publications are refused. */
  for (;;) {
    pthread_mutex_lock(&ec->pub->mu);
    int closing = ec->pub->closing;
    pthread_mutex_unlock(&ec->pub->mu);
    if (closing)
      break;
    usleep(1000);
  }
  ASSERT_EQ_INT(publish_ref(step, "s2"), ENCACHE_SKIP_CLOSED);
  /* The write is held, so close cannot return however long this waits:
   * the sleep only gives a close that wrongly returns early the time to
   * do so; it cannot fail a correct one. */
  usleep(20000);
  ASSERT_EQ_INT(c.rc, -1); /* still waiting for the write */
  ASSERT_EQ_INT(e.ctl.close_calls, 0);
  fault_release_writes(&e.ctl);
  pthread_join(th, NULL);
  ASSERT_EQ_INT(c.rc, 0);
  ASSERT_EQ_INT(e.ctl.close_calls, 1);
  ASSERT_EQ_INT(e.ctl.registered, 0);
  ASSERT_EQ_INT(storage_releases, 2); /* s1 after its write, s2 at once */
  /* The written payload is correct. */
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(e.url, &st), 0);
  char ns[512], key[600];
  encache_namespace_params p = {sizeof p,        NULL, "shared/model",
                                test_revision(), NULL, ENCACHE_FLOAT32};
  encache_namespace(&p, ns, sizeof(ns));
  encache_key(ns, "s1", key, sizeof(key));
  unsigned char got[64], want[64];
  size_t len = ref_object("s1", want);
  const char *keys[1] = {key};
  void *bufs[1] = {got};
  size_t caps[1] = {sizeof(got)};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[0], (int64_t)len);
  ASSERT_EQ_MEM(got, want, len);
  encache_store_close(st);
}

/* ------------------------------------------------------- beyond the cases */

TEST(engine_duplicates_read_once_each_own_output) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const one[] = {"d"};
  seed(&e, encache_namespace_of(ec), one, 1);
  static const char *const ids[] = {"d", "zz", "d", "d"};
  encache_result r[4];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 4, r, &t), 3);
  ASSERT_EQ_INT(e.ctl.read_calls, 1);
  ASSERT(r[0].data != r[2].data && r[2].data != r[3].data);
  ASSERT_EQ_MEM(r[0].data, r[3].data, 16);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  free_hits(r, 4);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_skips_ineligible_and_non_candidates) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  encache_candidate c[4] = {cand("img"), cand("vid"), cand("gpu"), cand("")};
  c[1].modality = ENCACHE_MODALITY_VIDEO;
  c[2].device = ENCACHE_DEVICE_CUDA;
  encache_result r[4];
  talloc t = {0};
  encache_allocator a = allocator(&t);
  r[0].size = sizeof(r[0]);
  ASSERT_EQ_INT(encache_lookup(step, c, 4, &a, r), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(r[3].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(publish_ref(step, "vid"), ENCACHE_SKIP_NOT_CANDIDATE);
  e.ctl.hold_writes = 1; /* keep the first one pending */
  ASSERT_EQ_INT(publish_ref(step, "img"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(step, "img"), ENCACHE_SKIP_PENDING);
  fault_release_writes(&e.ctl);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_unavailable_store_means_encode) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"n1", "n2"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  e.ctl.exists_rc = ENCACHE_EUNAVAIL;
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  e.ctl.exists_rc = 0;
  e.ctl.read_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_UNAVAILABLE);
  e.ctl.read_rc = 0;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 2);
  free_hits(r, 2);
  /* An unknown per-item existence answer is unconfirmed: poison. */
  e.ctl.exists_item = 77;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
}

/* Lookups and publications from the step thread while the worker writes
 * (ThreadSanitizer runs this one).  A flush every few steps lets the
 * worker catch up however the threads are scheduled. */
TEST(engine_threads_step_and_worker) {
  env e;
  env_init(&e, 1);
  encache *ec = open_on(&e, 4096, 8, 1 << 20);
  char idbuf[64][16];
  const char *ids[8];
  int encoded = 0;
  for (int round = 0; round < 200; round++) {
    for (int k = 0; k < 8; k++) {
      snprintf(idbuf[k], sizeof(idbuf[k]), "t%d", (round * 3 + k) % 40);
      ids[k] = idbuf[k];
    }
    encache_result r[8];
    talloc t = {0};
    encache_candidate c[8];
    for (int k = 0; k < 8; k++)
      c[k] = cand(ids[k]);
    encache_allocator a = allocator(&t);
    encache_step *step = step_of(ec);
    r[0].size = sizeof(r[0]);
    int hits = encache_lookup(step, c, 8, &a, r);
    ASSERT(hits >= 0);
    for (int k = 0; k < 8; k++) {
      float want[ROWS * COLS];
      encode(ids[k], want);
      if (r[k].outcome == ENCACHE_HIT) {
        ASSERT_EQ_MEM(r[k].data, want, sizeof(want));
        free(r[k].data);
      } else {
        encoded++;
        int q = publish_ref(step, ids[k]);
        ASSERT(q >= 0);
      }
    }
    encache_step_close(step);
    if (round % 10 == 9)
      ASSERT_EQ_INT(encache_flush(ec), 0);
  }
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &s);
  if (!(s.hits > 0 && s.published_written > 0))
    test__fail(__FILE__, __LINE__, "hits %llu written %llu queued %llu "
               "failed %llu items-skipped %llu", (unsigned long long)s.hits,
               (unsigned long long)s.published_written,
               (unsigned long long)s.published_queued,
               (unsigned long long)s.published_failed,
               (unsigned long long)s.published_skipped[ENCACHE_SKIP_OVER_ITEMS]);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.registered, 0);
}

/* An identifier longer than ENCACHE_MAX_ID_LEN (shm would refuse its key,
 * and answer UNAVAILABLE) is SKIPPED with the reason before any Store
 * call; its publication is not a candidate's; the handle stays healthy. */
TEST(engine_overlong_identifier_is_skipped) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static char id[70000];
  memset(id, 'i', sizeof(id) - 1);
  const char *ids[2] = {id, "short"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[0].why, "the id of 69999 bytes is too long");
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(publish_ref(step, id), ENCACHE_SKIP_NOT_CANDIDATE);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_failed, 0);
  ASSERT_EQ_INT(st.poisoned, 0);
  ASSERT_EQ_INT(lookup_ids(step, ids + 1, 1, r, &t), 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* ---------------------------------------------------------------- steps */

/* A pipelined server: step B is looked up before step A publishes; each
 * publishes its own candidates, and only those. */
TEST(engine_steps_publish_independently) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ida[] = {"pa1", "pa2"};
  static const char *const idb[] = {"pb1", "pb2"};
  encache_result r[6];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(a, ida, 2, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(b, idb, 2, r, &t), 0);
  for (int i = 0; i < 2; i++)
    ASSERT_EQ_INT(publish_ref(a, ida[i]), ENCACHE_QUEUED);
  /* An id of A published on B is not B's candidate, nor the reverse. */
  ASSERT_EQ_INT(publish_ref(b, "pa1"), ENCACHE_SKIP_NOT_CANDIDATE);
  ASSERT_EQ_INT(publish_ref(a, "pb1"), ENCACHE_SKIP_NOT_CANDIDATE);
  encache_step_close(a); /* its queued publications are not affected */
  for (int i = 0; i < 2; i++)
    ASSERT_EQ_INT(publish_ref(b, idb[i]), ENCACHE_QUEUED);
  /* Several lookups on one step add to it. */
  encache_step *c = step_of(ec);
  static const char *const idc[] = {"pc1", "pc2"};
  ASSERT_EQ_INT(lookup_ids(c, idc, 1, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(c, idc + 1, 1, r, &t), 0);
  ASSERT_EQ_INT(publish_ref(c, "pc1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(c, "pc2"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &s), 0);
  ASSERT_EQ_U64(s.published_written, 6);
  ASSERT_EQ_U64(s.published_skipped[ENCACHE_SKIP_NOT_CANDIDATE], 2);
  ASSERT_EQ_U64(s.steps_open, 2);
  /* Everything published loads, bit-exact. */
  static const char *const all[] = {"pa1", "pa2", "pb1", "pb2", "pc1", "pc2"};
  encache_step *d = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(d, all, 6, r, &t), 6);
  for (int i = 0; i < 6; i++) {
    float want[ROWS * COLS];
    encode(all[i], want);
    ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
  }
  free_hits(r, 6);
  encache_step_close(b);
  encache_step_close(c);
  encache_step_close(d);
  encache_step_close(NULL);
  ASSERT_EQ_INT(encache_stats_get(ec, &s), 0);
  ASSERT_EQ_U64(s.steps_open, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_steps_bounded) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *s[ENCACHE_MAX_STEPS + 1];
  for (int i = 0; i < ENCACHE_MAX_STEPS; i++)
    ASSERT_EQ_INT(encache_step_open(ec, &s[i]), 0);
  s[ENCACHE_MAX_STEPS] = (encache_step *)ec; /* must be reset */
  ASSERT_EQ_INT(encache_step_open(ec, &s[ENCACHE_MAX_STEPS]), ENCACHE_ESTEPS);
  ASSERT(s[ENCACHE_MAX_STEPS] == NULL);
  ASSERT_CONTAINS(encache_errmsg(ec), "ENCACHE_MAX_STEPS");
  ASSERT_EQ_STR(encache_err_name(ENCACHE_ESTEPS), "ESTEPS");
  ASSERT_CONTAINS(encache_strerror(ENCACHE_ESTEPS), "too many steps");
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.steps_open, ENCACHE_MAX_STEPS);
  /* Closing one makes room; the new step works. */
  encache_step_close(s[10]);
  ASSERT_EQ_INT(encache_step_open(ec, &s[10]), 0);
  static const char *const ids[] = {"bound"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(s[10], ids, 1, r, &t), 0);
  ASSERT_EQ_INT(publish_ref(s[10], "bound"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(s[11], "bound"), ENCACHE_SKIP_NOT_CANDIDATE);
  /* Closing the handle closes the 64 steps still open. */
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* Disabled: steps open (within the same bound), everything is skipped. */
  encache_options o = options("{\"ec_connector_extra_config\": {}}");
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  encache_step *step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(publish_ref(step, "bound"), ENCACHE_SKIP_DISABLED);
  for (int i = 1; i < ENCACHE_MAX_STEPS; i++)
    ASSERT_EQ_INT(encache_step_open(ec, &s[i]), 0);
  ASSERT_EQ_INT(encache_step_open(ec, &s[0]), ENCACHE_ESTEPS);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* Close with steps open: the queued writes of every step are drained and
 * the steps die with the handle (the sanitizer build checks no leak). */
TEST(engine_close_with_open_steps) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ids[] = {"co1", "co2"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(a, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r, &t), 0);
  e.ctl.hold_writes = 1;
  ASSERT_EQ_INT(publish_ref(a, "co1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(b, "co2"), ENCACHE_QUEUED);
  fault_pass_writes(&e.ctl, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.close_calls, 1);
  fault_ctl_init(&e.ctl);
  ec = open_default(&e);
  encache_step *step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 2);
  free_hits(r, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_poison_with_open_steps) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ids[] = {"pz1", "pz2"};
  seed(&e, encache_namespace_of(ec), ids, 1);
  static encache_result r[2]; /* kept destinations stay reachable */
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r, &t), 0);
  e.ctl.read_mode = READ_ITEM_CODE;
  e.ctl.read_item_code = -12345; /* an unknown code: unconfirmed */
  ASSERT_EQ_INT(lookup_ids(a, ids, 1, r, &t), ENCACHE_EPOISONED);
  /* Every step of the handle fails fast now. */
  ASSERT_EQ_INT(publish_ref(b, "pz2"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r + 1, &t), ENCACHE_EPOISONED);
  encache_step *c = (encache_step *)ec;
  ASSERT_EQ_INT(encache_step_open(ec, &c), ENCACHE_EPOISONED);
  ASSERT(c == NULL);
  encache_step_close(b); /* safe: the Store never holds a step's memory */
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED); /* a dies with it */
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}

/* ------------------------------------------------------ caller structs */

typedef struct wide_cand {
  encache_candidate c;
  uint64_t newer; /* a field of a newer header */
} wide_cand;

typedef struct wide_result {
  encache_result r;
  uint64_t newer;
} wide_result;

/* The allocator is handed the caller's own candidate. */
static int wide_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **handle) {
  ASSERT_EQ_U64(c->size, sizeof(wide_cand));
  return ta_alloc(ctx, i, c, nbytes, data, handle);
}

TEST(engine_candidates_and_results_strided_by_size) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"w0", "w1", "w2"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  wide_cand wc[3];
  wide_result wr[3];
  memset(wr, 0xab, sizeof(wr));
  for (int i = 0; i < 3; i++) {
    wc[i].c = cand(ids[i]);
    wc[i].c.size = sizeof(wide_cand);
    wc[i].newer = 0;
  }
  wr[0].r.size = sizeof(wide_result);
  talloc t = {0};
  encache_allocator a = {sizeof(a), &t, wide_alloc, ta_release, 0};
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r), 2);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ_U64(wr[i].r.size, sizeof(wide_result));
    ASSERT_EQ_U64(wr[i].newer, 0); /* a field this library does not know */
    ASSERT_EQ_INT(wr[i].r.outcome, i < 2 ? ENCACHE_HIT : ENCACHE_MISS);
  }
  float want[ROWS * COLS];
  encode("w1", want);
  ASSERT_EQ_MEM(wr[1].r.data, want, sizeof(want));
  free(wr[0].r.data);
  free(wr[1].r.data);
  ASSERT_EQ_INT(publish_ref(step, "w2"), ENCACHE_QUEUED);
  /* A newer field set is refused, naming the candidate. */
  wc[1].newer = 1;
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "candidate 1");
  wc[1].newer = 0;
  /* Sizes that differ within the array, or an older one. */
  wc[2].c.size = sizeof(encache_candidate);
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "candidate 2");
  encache_candidate old = cand("w0");
  old.size = sizeof(old) - sizeof(int);
  encache_result r1 = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &a, &r1), ENCACHE_EINVAL);
  old.size = sizeof(old);
  r1.size = offsetof(encache_result, nbytes);
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &a, &r1), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size");
  r1.size = sizeof(r1);
  encache_allocator olda = a;
  olda.size = offsetof(encache_allocator, release); /* older than 1.0 */
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &olda, &r1), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "allocator");
  ASSERT_EQ_INT(t.allocs, t.releases + 2); /* no refused lookup allocated */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_options_and_stats_sizes) {
  env e;
  env_init(&e, 0);
  static const char json[] =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  struct {
    encache_options o;
    uint64_t newer;
  } big;
  memset(&big, 0, sizeof(big));
  big.o = options(json);
  big.o.store_url = e.url;
  encache *ec = (encache *)&big; /* must be reset */
  /* Older: refused, no handle, the reason on this thread. */
  big.o.size = offsetof(encache_options, log_ctx);
  ASSERT_EQ_INT(encache_open(&big.o, &ec), ENCACHE_EINVAL);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "options.size");
  /* Newer with the unknown field set: refused. */
  big.o.size = sizeof(big);
  big.newer = 7;
  ASSERT_EQ_INT(encache_open(&big.o, &ec), ENCACHE_EINVAL);
  /* Newer with it zero: accepted. */
  big.newer = 0;
  ASSERT_EQ_INT(encache_open(&big.o, &ec), 0);
  /* Stats: an older size is refused, a newer one's tail is zeroed. */
  encache_stats old = ENCACHE_STATS_INIT;
  old.size = offsetof(encache_stats, poisoned);
  ASSERT_EQ_INT(encache_stats_get(ec, &old), ENCACHE_EINVAL);
  struct {
    encache_stats s;
    uint64_t newer;
  } bigs;
  memset(&bigs, 0xee, sizeof(bigs));
  bigs.s.size = sizeof(bigs);
  ASSERT_EQ_INT(encache_stats_get(ec, &bigs.s), 0);
  ASSERT_EQ_U64(bigs.newer, 0);
  ASSERT_EQ_U64(bigs.s.lookups, 0);
  ASSERT_EQ_INT(bigs.s.poisoned, 0);
  ASSERT_EQ_U64(bigs.s.size, sizeof(bigs));
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* ------------------------------------------------------ the error model */

static void *read_errmsg(void *out) {
  snprintf(out, 64, "%s", encache_errmsg(NULL));
  return NULL;
}

TEST(engine_failed_open_returns_no_handle) {
  encache_options o = options("{\"ec_connector_extra_config\": {");
  encache *ec = (encache *)&o; /* must be reset */
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_EJSON);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "line 1");
  encache_close(ec); /* NULL: a no-op */
  /* The message is the calling thread's own. */
  char other[64] = "x";
  pthread_t th;
  pthread_create(&th, NULL, read_errmsg, other);
  pthread_join(th, NULL);
  ASSERT_EQ_STR(other, "");
  ASSERT_CONTAINS(encache_errmsg(NULL), "line 1");
  /* A Store that cannot open: the Store's reason, no handle. */
  o = options("{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
              "true}}");
  o.store_url = "nosuch://x";
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_EURL);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "nosuch://x");
  ASSERT_EQ_INT(encache_open(&o, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "out is NULL");
  ASSERT_EQ_INT(encache_open(NULL, &ec), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "options are NULL");
}

/* Typed options: a configuration the caller filled replaces the JSON. */
TEST(engine_typed_config) {
  env e;
  env_init(&e, 0);
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  static const char json[] =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
      "\"embedding_cache_prefix\": \"typed\", "
      "\"store_read_buffer_bytes\": 4096}}";
  ASSERT_EQ_INT(encache_config_load_ec(cfg, json, sizeof(json) - 1), 0);
  encache_options o = options(json);
  o.store_url = e.url;
  o.config = cfg;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_EINVAL); /* both given */
  ASSERT_CONTAINS(encache_errmsg(NULL), "exactly one");
  o.ec_transfer_config = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  ASSERT_EQ_INT(encache_enabled(ec), 1);
  ASSERT_EQ_INT(strncmp(encache_namespace_of(ec), "typed@", 6), 0);
  ASSERT_EQ_U64(ec->read_buf_bytes, 4096);
  encache_config_free(cfg); /* read during open only */
  ASSERT_EQ_INT(encache_close(ec), 0);
  o.config = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_EINVAL); /* neither */
  ASSERT_CONTAINS(encache_errmsg(NULL), "neither");
  /* The deployment check applies to a typed configuration too. */
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  ASSERT_EQ_INT(encache_config_load_ec(cfg, json, sizeof(json) - 1), 0);
  encache_deployment d;
  encache_deployment_defaults(&d);
  d.tensor_parallel_size = 2;
  o.config = cfg;
  o.deployment = &d;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "tensor_parallel_size");
  encache_config_free(cfg);
}

/* Fail each allocation of a whole step in turn (open, step, lookup,
 * publish): each call either works or fails with ENCACHE_ENOMEM and a
 * message saying so (never an empty one), no handle is left behind by a
 * failed open, and nothing leaks (the sanitizer build checks that). */
TEST(engine_out_of_memory_every_allocation) {
  env e;
  env_init(&e, 0);
  static const char *const ids[] = {"oom1", "oom2"};
  {
    encache *ec = open_default(&e);
    seed(&e, encache_namespace_of(ec), ids, 1);
    encache_close(ec);
  }
  char json[512];
  json_for(json, sizeof(json), 1 << 20, 32, 1 << 30);
  int saw_success = 0;
  for (long n = 1; n < 2000 && !saw_success; n++) {
    encache_options o = options(json);
    o.store_url = e.url;
    encache *ec = NULL;
    encache_step *step = NULL;
    encache_result r[2];
    talloc t = {0};
    test_alloc_fail_after(n);
    int rc = encache_open(&o, &ec), q = 0;
    if (rc < 0) {
      test_alloc_fail_after(0);
      ASSERT(ec == NULL);
      if (strstr(encache_errmsg(NULL), "out of memory") == NULL)
        test__fail(__FILE__, __LINE__, "allocation %ld: open: %s: \"%s\"", n,
                   encache_err_name(rc), encache_errmsg(NULL));
      continue;
    }
    static float out[ROWS * COLS]; /* a storage of the caller's own */
    int64_t shape[2] = {ROWS, COLS};
    encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    encache_storage *s = NULL;
    if ((rc = encache_step_open(ec, &step)) == 0 &&
        (rc = lookup_ids(step, ids, 2, r, &t)) >= 0) {
      free_hits(r, 2);
      /* A storage that cannot be made (no handle, no message): nothing
       * to publish this time. */
      q = encache_storage_new(out, sizeof(out), NULL, NULL, &s);
      if (q == 0)
        q = encache_publish(step, "oom2", &v, s);
      encache_storage_unref(s);
      rc = s != NULL && q < 0 ? q : 0;
    }
    test_alloc_fail_after(0);
    if (rc < 0) {
      ASSERT_EQ_INT(rc, ENCACHE_ENOMEM);
      ASSERT_CONTAINS(encache_errmsg(ec), "out of memory");
    }
    ASSERT_EQ_INT(encache_flush(ec), 0);
    saw_success = rc >= 0 && q == ENCACHE_QUEUED;
    ASSERT_EQ_INT(encache_close(ec), 0);
  }
  ASSERT(saw_success);
}

/* ------------------------------------------------ results say why (issue 18) */

/* Every outcome that is not a HIT carries its cause (result.why), kept by
 * the step until it closes; a HIT's is NULL. */
TEST(engine_results_say_why) {
  env e;
  env_init(&e, 0);
  encache *ec = open_on(&e, 1 << 20, 32, 1 << 30);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"y0", "y1"};
  seed(&e, encache_namespace_of(ec), ids, 1);
  encache_candidate c[5] = {cand("y0"), cand("y1"), cand("vid"), cand("gpu"),
                            cand("y0")};
  c[2].modality = ENCACHE_MODALITY_VIDEO;
  c[3].device = ENCACHE_DEVICE_CUDA; /* no CUDA runtime (test_device.c) */
  setenv("ENCACHE_CUDA_LIBRARY", "/nonexistent/libcudart.so", 1);
  c[4].rows = ROWS * COLS; /* same bytes, another shape */
  c[4].cols = 1;
  encache_result r[5];
  memset(r, 0x5a, sizeof(r)); /* every why must be written */
  r[0].size = sizeof(r[0]);
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 5, &a, r), 1);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT(r[0].why == NULL);
  free(r[0].data);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[2].why, "not an image");
  ASSERT_EQ_INT(r[3].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[3].why, "CUDA runtime not available");
  ASSERT_EQ_INT(r[4].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_STR(r[4].why, "shape 2x2 (expected 4x1)");
  const char *kept = r[4].why;
  /* UNAVAILABLE: the failed call and its code, batch by batch. */
  e.ctl.exists_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_CONTAINS(r[0].why, "the existence check failed (EUNAVAIL)");
  ASSERT(r[1].why == r[0].why); /* one copy per distinct cause */
  e.ctl.exists_rc = 0;
  e.ctl.read_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_CONTAINS(r[0].why, "the read failed (EUNAVAIL)");
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  e.ctl.read_rc = 0;
  /* An earlier lookup's causes stay valid until the step closes. */
  ASSERT_EQ_STR(kept, "shape 2x2 (expected 4x1)");
  encache_step_close(step);
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* OVERSIZE: both sizes and the option to raise. */
  env_init(&e, 0);
  ec = open_on(&e, 30, 32, 1 << 20);
  step = step_of(ec);
  seed(&e, encache_namespace_of(ec), ids, 1);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_STR(r[0].why, "the object is 40 bytes, larger than the 30-byte "
                          "staging buffer: raise store_read_buffer_bytes to "
                          "at least 40");
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* Off: every candidate SKIPPED, and the rule says so. */
  encache_options off = options("{\"ec_connector_extra_config\": "
                                "{\"cross_encoder_cache\": false}}");
  ASSERT_EQ_INT(encache_open(&off, &ec), 0);
  step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_STR(r[0].why, "cross_encoder_cache is off");
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A caller compiled against 1.0 (no why) gets its results written as far
 * as its size holds, never beyond. */
TEST(engine_results_why_not_written_for_10_callers) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  size_t old = offsetof(encache_result, why);
  unsigned char buf[2 * sizeof(encache_result)];
  memset(buf, 0x77, sizeof(buf));
  encache_result *r0 = (encache_result *)(void *)buf;
  r0->size = old;
  encache_candidate c[2] = {cand("o0"), cand("o1")};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), 0);
  encache_result *r1 = (encache_result *)(void *)(buf + old);
  ASSERT_EQ_INT(r1->outcome, ENCACHE_MISS);
  ASSERT_EQ_U64(r1->size, old);
  for (size_t k = 2 * old; k < sizeof(buf); k++)
    ASSERT_EQ_INT(buf[k], 0x77);
  r0->size = old - 1; /* below 1.0: refused */
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size");
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A results array whose size nobody set (stack garbage, here above
 * ENCACHE__STRUCT_MAX) is refused before anything is allocated or written,
 * even past the first element. */
TEST(engine_results_size_unset_refused) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"u0", "u1"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  static unsigned char buf[3 * 8192];
  memset(buf, 0x55, sizeof(buf));
  encache_result *r0 = (encache_result *)(void *)buf;
  r0->size = 8192;
  encache_candidate c[2] = {cand("u0"), cand("u1")};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size 8192");
  ASSERT_EQ_INT(t.allocs, 0);
  for (size_t i = sizeof(size_t); i < sizeof(buf); i++)
    ASSERT_EQ_INT(buf[i], 0x55); /* nothing written */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A lookup that fails as a whole (the allocator refuses the second
 * destination) delivers nothing: every candidate is UNAVAILABLE with the
 * failure as its cause, on the staged and the direct read paths. */
TEST(engine_failed_lookup_all_unavailable) {
  for (int reg = 0; reg < 2; reg++) {
    env e;
    env_init(&e, reg);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    static const char *const ids[] = {"f0", "f1"};
    seed(&e, encache_namespace_of(ec), ids, 2);
    static const char *const ids3[] = {"f0", "f1", "f-absent"};
    encache_result r[3];
    talloc t = {0};
    t.fail_at = 2;
    ASSERT(lookup_ids(step, ids3, 3, r, &t) < 0);
    for (int i = 0; i < 3; i++) {
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_UNAVAILABLE);
      ASSERT_CONTAINS(r[i].why, "the lookup failed");
    }
    /* The second call failed; the first destination came back. */
    ASSERT_EQ_INT(t.allocs, 2);
    ASSERT_EQ_INT(t.releases, 1);
    ASSERT_EQ_INT(encache_close(ec), 0);
  }
}

/* NULL candidates or results: EINVAL, and the message names which. */
TEST(engine_lookup_null_arguments_named) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  encache_candidate c[1] = {cand("m0")};
  encache_result r[1] = {ENCACHE_RESULT_INIT};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 1, &a, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results is NULL");
  ASSERT_EQ_INT(encache_lookup(step, NULL, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "c is NULL");
  ASSERT_EQ_INT(encache_close(ec), 0);
}
