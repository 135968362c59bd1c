/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's open, configuration and out-of-memory behaviour: keys
 * through the handle (case 1), start-up refusals (case 2), option and
 * stats sizes, typed configuration, every allocation failing.
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

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
