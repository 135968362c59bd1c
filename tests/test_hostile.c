/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A careless caller never stores or serves a wrong embedding (issue 26):
 * a publication that is not the candidate's output is refused
 * (ENCACHE_SKIP_MISMATCH), so the right one can still be written; an id
 * too long for any key is SKIPPED with the reason, not UNAVAILABLE; a NUL
 * inside a JSON string that reaches a key is refused by name.
 */
#include "runner.h"
#include "store_util.h"

#include <encache.h>
#include <unistd.h>

static char seg[64];
static void seg_gone(void) { encache_shm_destroy(seg); }

static const char ec_json[] =
    "{\"ec_connector\": \"ECMooncakeConnector\", \"ec_role\": "
    "\"ec_producer\", \"ec_connector_extra_config\": "
    "{\"cross_encoder_cache\": true}}";

static encache *open_private(void) {
  static char url[128];
  snprintf(seg, sizeof(seg), "encache-hostile-%d", (int)getpid());
  encache_shm_destroy(seg);
  atexit(seg_gone);
  snprintf(url, sizeof(url), "shm://%s?size=4MiB", seg);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = ec_json;
  o.model = "org/vit";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  if (encache_open(&o, &ec) != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  return ec;
}

/* Looks up one float32 candidate; its result in *r (a hit's data is the
 * caller's to free). */
static void lookup_one(encache_step *st, const char *id, uint64_t rows,
                       uint64_t cols, encache_result *r) {
  encache_candidate c = ENCACHE_CANDIDATE_INIT;
  c.id = id;
  c.dtype = ENCACHE_FLOAT32;
  c.rows = rows;
  c.cols = cols;
  encache_allocator a = ts_host_allocator();
  *r = (encache_result)ENCACHE_RESULT_INIT;
  ASSERT(encache_lookup(st, &c, 1, &a, r) >= 0);
}

static float buf[64]; /* every publication's memory */

static int publish(encache_step *st, encache_storage *s, const char *id,
                   int dtype, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  encache_tensor v = {.size = sizeof(v), .data = buf,
                      .dtype = dtype, .ndim = 2, .shape = shape};
  return encache_publish(st, id, &v, s);
}

TEST(publish_refuses_an_output_that_is_not_the_candidates) {
  encache *ec = open_private();
  encache_step *st = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &st), 0);
  encache_result r;
  lookup_one(st, "x", 4, 8, &r);
  ASSERT_EQ_INT(r.outcome, ENCACHE_MISS);
  for (int i = 0; i < 64; i++)
    buf[i] = (float)i;
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(buf, sizeof(buf), NULL, NULL, &s), 0);
  ASSERT_EQ_INT(publish(st, s, "x", ENCACHE_FLOAT32, 8, 4),
                ENCACHE_SKIP_MISMATCH);
  ASSERT_EQ_INT(publish(st, s, "x", ENCACHE_FLOAT16, 4, 8),
                ENCACHE_SKIP_MISMATCH);
  ASSERT_EQ_INT(publish(st, s, "x", ENCACHE_FLOAT32, 0, 8),
                ENCACHE_SKIP_MISMATCH);
  ASSERT_EQ_INT(publish(st, s, "x", ENCACHE_FLOAT32, 2, 16),
                ENCACHE_SKIP_MISMATCH);
  ASSERT_EQ_STR(encache_skip_name(ENCACHE_SKIP_MISMATCH),
                "not the candidate's dtype and shape");
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats stats = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &stats), 0);
  ASSERT_EQ_U64(stats.published_mismatch, 4);
  ASSERT_EQ_U64(encache_stats_skipped(&stats, ENCACHE_SKIP_MISMATCH), 4);
  ASSERT_EQ_U64(stats.published_written, 0);
  /* The right output is still written, and served. */
  ASSERT_EQ_INT(publish(st, s, "x", ENCACHE_FLOAT32, 4, 8), ENCACHE_QUEUED);
  encache_storage_unref(s);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_step_close(st);
  ASSERT_EQ_INT(encache_step_open(ec, &st), 0);
  lookup_one(st, "x", 4, 8, &r);
  ASSERT_EQ_INT(r.outcome, ENCACHE_HIT);
  ASSERT_EQ_MEM(r.data, buf, 32 * sizeof(float));
  free(r.data);
  encache_step_close(st);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(publish_accepts_either_contract_of_an_id_asked_twice) {
  encache *ec = open_private();
  encache_step *st = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &st), 0);
  encache_result r;
  lookup_one(st, "y", 4, 8, &r);
  lookup_one(st, "y", 2, 16, &r);
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(buf, sizeof(buf), NULL, NULL, &s), 0);
  ASSERT_EQ_INT(publish(st, s, "y", ENCACHE_FLOAT32, 8, 4),
                ENCACHE_SKIP_MISMATCH);
  ASSERT_EQ_INT(publish(st, s, "y", ENCACHE_FLOAT32, 2, 16), ENCACHE_QUEUED);
  encache_storage_unref(s);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_step_close(st);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(lookup_skips_an_id_too_long_for_a_key) {
  encache *ec = open_private();
  encache_step *st = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &st), 0);
  size_t n = (size_t)1 << 20;
  char *id = malloc(n + 1);
  ASSERT(id != NULL);
  memset(id, 'i', n);
  id[n] = '\0';
  encache_result r;
  lookup_one(st, id, 2, 2, &r);
  ASSERT_EQ_INT(r.outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r.why, "id of 1048576 bytes");
  ASSERT_CONTAINS(r.why, "at most 8192");
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(buf, sizeof(buf), NULL, NULL, &s), 0);
  ASSERT_EQ_INT(publish(st, s, id, ENCACHE_FLOAT32, 2, 2),
                ENCACHE_SKIP_NOT_CANDIDATE);
  encache_storage_unref(s);
  /* The longest id allowed is looked up. */
  id[ENCACHE_MAX_ID_LEN] = '\0';
  lookup_one(st, id, 2, 2, &r);
  ASSERT_EQ_INT(r.outcome, ENCACHE_MISS);
  free(id);
  encache_step_close(st);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* load_ec (or, for the Mooncake JSON, load_mooncake) of a JSON with
 * `field` set to the 7 bytes "abc\0def". */
static int load_with_nul(const char *field, int mooncake, char *msg,
                         size_t size) {
  char json[512];
  int len = mooncake ? snprintf(json, sizeof(json),
                                "{\"master_server_address\": \"h:1\", "
                                "\"%s\": \"abc\\u0000def\"}", field)
                     : snprintf(json, sizeof(json),
                                "{\"ec_connector\": \"ECMooncakeConnector\","
                                " \"ec_role\": \"ec_producer\", "
                                "\"ec_connector_extra_config\": "
                                "{\"cross_encoder_cache\": true, \"%s\": "
                                "\"abc\\u0000def\"}}", field);
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  int rc = mooncake ? encache_config_load_mooncake(cfg, json, (size_t)len,
                                                   NULL)
                    : encache_config_load_ec(cfg, json, (size_t)len);
  snprintf(msg, size, "%s", encache_config_errmsg(cfg));
  encache_config_free(cfg);
  return rc;
}

TEST(config_refuses_nul_in_a_string_that_reaches_a_key) {
  const char *fields[] = {"embedding_model_identity", "embedding_cache_prefix",
                          "tenant_id"};
  char msg[512];
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    ASSERT_EQ_INT(load_with_nul(fields[i], i == 2, msg, sizeof(msg)),
                  ENCACHE_ECONFIG);
    ASSERT_CONTAINS(msg, fields[i]);
    ASSERT_CONTAINS(msg, "NUL");
  }
  /* A raw NUL byte inside the given length: malformed, and said where. */
  static const char raw[] = "{\"ec_role\": \"ec_pro\0ducer\"}";
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  ASSERT_EQ_INT(encache_config_load_ec(cfg, raw, sizeof(raw) - 1),
                ENCACHE_EJSON);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "column");
  encache_config_free(cfg);
}
