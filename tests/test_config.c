/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration: docs/behaviour.md's options and rules (acceptance case 2),
 * the Mooncake client JSON, and every refusal naming its field. */
#include "runner.h"

#include "encache.h"
#include "internal.h"

#include <unistd.h>

static encache_config *new_cfg(void) {
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  ASSERT(cfg != NULL);
  return cfg;
}

static int load_ec(encache_config *cfg, const char *json) {
  return encache_config_load_ec(cfg, json, strlen(json));
}

static int load_mc(encache_config *cfg, const char *json) {
  return encache_config_load_mooncake(cfg, json, strlen(json), "test.json");
}

/* Loads `json` (an ec-transfer-config, or with mooncake set a Mooncake
 * JSON) expecting `rc`, with a message containing `needle`. */
static void expect_error(int mooncake, const char *json, int rc,
                         const char *needle) {
  encache_config *cfg = new_cfg();
  int got = mooncake ? load_mc(cfg, json) : load_ec(cfg, json);
  if (got != rc)
    test__fail(__FILE__, __LINE__, "load_%s(%s) = %d (%s), expected %d: %s",
               mooncake ? "mc" : "ec", json, got, encache_err_name(got), rc,
               encache_config_errmsg(cfg));
  ASSERT_CONTAINS(encache_config_errmsg(cfg), needle);
  encache_config_free(cfg);
}

static void expect_ec_error(const char *json, int rc, const char *needle) {
  expect_error(0, json, rc, needle);
}

static void expect_mc_error(const char *json, int rc, const char *needle) {
  expect_error(1, json, rc, needle);
}

TEST(config_defaults) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(load_ec(cfg, "{}"), 0);
  int b = -1;
  uint64_t u = 0;
  const char *s = "x";
  ASSERT_EQ_INT(encache_config_get_bool(cfg, "cross_encoder_cache", &b), 0);
  ASSERT_EQ_INT(b, 0);
  ASSERT_EQ_INT(encache_config_get_u64(cfg, "store_max_pending_items", &u), 0);
  ASSERT_EQ_U64(u, 32);
  ASSERT_EQ_INT(encache_config_get_u64(cfg, "store_max_pending_bytes", &u), 0);
  ASSERT_EQ_U64(u, 2147483648ull);
  ASSERT_EQ_INT(encache_config_get_u64(cfg, "store_read_buffer_bytes", &u), 0);
  ASSERT_EQ_U64(u, 134217728ull);
  ASSERT_EQ_INT(encache_config_get_string(cfg, "embedding_cache_prefix", &s), 0);
  ASSERT_EQ_STR(s, "");
  ASSERT_EQ_INT(encache_config_get_string(cfg, "embedding_model_identity", &s), 0);
  ASSERT(s == NULL);
  /* Every item is a default, and the mooncake section is not listed. */
  int n = encache_config_item_count(cfg);
  ASSERT(n >= 6);
  for (int i = 0; i < n; i++) {
    encache_config_item it = {.size = sizeof(it)};
    ASSERT_EQ_INT(encache_config_item_at(cfg, i, &it), 0);
    ASSERT_EQ_INT(it.is_default, 1);
    ASSERT(strcmp(it.section, "mooncake") != 0);
  }
  encache_config_item it = {.size = sizeof(it)};
  ASSERT_EQ_INT(encache_config_item_at(cfg, n, &it), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_config_unknown_count(cfg), 0);
  /* Typed access refuses unknown names and wrong types. */
  ASSERT_EQ_INT(encache_config_get_u64(cfg, "nope", &u), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_config_get_u64(cfg, "cross_encoder_cache", &u),
                ENCACHE_EINVAL);
  encache_config_free(cfg);
  encache_config_free(NULL);
}

TEST(config_reference_options_accepted) {
  const char *json =
      "{\"ec_connector\": \"ECMooncakeStorageConnector\",\n"
      " \"ec_role\": \"ec_producer\",\n"
      " \"ec_connector_extra_config\": {\n"
      "   \"cross_encoder_cache\": true,\n"
      "   \"embedding_cache_prefix\": \"team@cache\",\n"
      "   \"embedding_model_identity\": \"shared/model\",\n"
      "   \"store_max_pending_items\": 8,\n"
      "   \"store_max_pending_bytes\": 1073741824,\n"
      "   \"store_read_buffer_bytes\": 67108864,\n"
      "   \"some_future_option\": [1, 2]\n"
      " },\n"
      " \"kv_whatever\": 1}";
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(load_ec(cfg, json), 0);
  ASSERT_EQ_STR(encache_config_errmsg(cfg), "");
  int b;
  uint64_t u;
  const char *s;
  encache_config_get_bool(cfg, "cross_encoder_cache", &b);
  ASSERT_EQ_INT(b, 1);
  encache_config_get_u64(cfg, "store_max_pending_items", &u);
  ASSERT_EQ_U64(u, 8);
  encache_config_get_u64(cfg, "store_read_buffer_bytes", &u);
  ASSERT_EQ_U64(u, 67108864);
  encache_config_get_string(cfg, "embedding_model_identity", &s);
  ASSERT_EQ_STR(s, "shared/model");
  encache_config_get_string(cfg, "ec_role", &s);
  ASSERT_EQ_STR(s, "ec_producer");
  /* Given options are not defaults; values render as JSON. */
  int found = 0;
  for (int i = 0; i < encache_config_item_count(cfg); i++) {
    encache_config_item it = {.size = sizeof(it)};
    encache_config_item_at(cfg, i, &it);
    if (strcmp(it.name, "embedding_cache_prefix") == 0) {
      ASSERT_EQ_STR(it.section, "ec_connector_extra_config");
      ASSERT_EQ_STR(it.value, "\"team@cache\"");
      ASSERT_EQ_INT(it.is_default, 0);
      found++;
    }
    if (strcmp(it.name, "store_max_pending_bytes") == 0) {
      ASSERT_EQ_STR(it.value, "1073741824");
      found++;
    }
  }
  ASSERT_EQ_INT(found, 2);
  /* Unknown options are reported, not refused. */
  ASSERT_EQ_INT(encache_config_unknown_count(cfg), 2);
  ASSERT_EQ_STR(encache_config_unknown_at(cfg, 0), "ec_transfer_config.kv_whatever");
  ASSERT_EQ_STR(encache_config_unknown_at(cfg, 1),
                "ec_connector_extra_config.some_future_option");
  ASSERT(encache_config_unknown_at(cfg, 2) == NULL);
  encache_config_free(cfg);
}

TEST(config_bad_limits_name_the_option) {
  /* Acceptance case 2: zero, negative, fractional, non-numeric string and
   * boolean limits are refused, each naming the option (vLLM's
   * _positive_int refuses them too; it accepts 1.0 and "32":
   * config_limits_read_as_vllm_reads_them). */
  static const char *const limits[] = {"store_max_pending_items",
                                       "store_max_pending_bytes",
                                       "store_read_buffer_bytes"};
  static const char *const bad[] = {"0",       "-1",     "1.5",  "\"0\"",
                                    "\"x\"",   "\"1.0\"", "true", "false",
                                    "null",    "[]",     "{}",   "\"3__2\"",
                                    "\"-4\"",  "-2.0",   "\"\""};
  for (size_t i = 0; i < 3; i++) {
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
      char json[256], needle[128];
      snprintf(json, sizeof(json),
               "{\"ec_connector_extra_config\": {\"%s\": %s}}", limits[i],
               bad[k]);
      snprintf(needle, sizeof(needle),
               "ec_connector_extra_config.%s: must be a positive integer",
               limits[i]);
      expect_ec_error(json, ENCACHE_ECONFIG, needle);
    }
  }
}

/* The store_* limits as vLLM's _positive_int reads them
 * (vllm/distributed/ec_transfer/ec_connector/mooncake/config.py at
 * e4bf5fb63fa46dc17924014d1379846afc9102f0): an integer, an integral
 * float, a string Python's int() reads; its message quoted (issue 27). */
TEST(config_limits_read_as_vllm_reads_them) {
  static const struct {
    const char *json;
    uint64_t want;
  } ok[] = {{"32", 32},          {"32.0", 32},        {"\"32\"", 32},
            {"\" 32 \"", 32},    {"\"+7\"", 7},       {"\"1_000\"", 1000},
            {"\"007\"", 7},      {"1e3", 1000},       {"\"\\t9\\n\"", 9},
            {"\"18446744073709551615\"", UINT64_MAX}};
  for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
    char json[256];
    snprintf(json, sizeof(json),
             "{\"ec_connector_extra_config\": {\"store_max_pending_items\": "
             "%s}}", ok[k].json);
    encache_config *cfg = new_cfg();
    ASSERT_EQ_INT(load_ec(cfg, json), 0);
    uint64_t u = 0;
    ASSERT_EQ_INT(encache_config_get_u64(cfg, "store_max_pending_items", &u),
                  0);
    ASSERT_EQ_U64(u, ok[k].want);
    encache_config_free(cfg);
  }
  expect_ec_error("{\"ec_connector_extra_config\": {\"store_read_buffer_bytes\": "
                  "\"abc\"}}", ENCACHE_ECONFIG,
                  "(vLLM: ECMooncakeConnector requires store_read_buffer_bytes "
                  "to be a positive integer.)");
  expect_ec_error("{\"ec_connector_extra_config\": {\"store_max_pending_bytes\": "
                  "0}}", ENCACHE_ECONFIG,
                  "(vLLM: ECMooncakeConnector requires store_max_pending_bytes "
                  "> 0.)");
  expect_ec_error("{\"ec_connector_extra_config\": {\"store_max_pending_bytes\": "
                  "\"18446744073709551616\"}}", ENCACHE_ECONFIG,
                  "is 2^64 or more: vLLM reads it");
  /* encache's own positive integers stay strict. */
  expect_ec_error("{\"ec_connector_extra_config\": {\"single_flight_ttl_ms\": "
                  "\"5\"}}", ENCACHE_ECONFIG,
                  "single_flight_ttl_ms: must be a positive integer");
}

TEST(config_bad_types_name_the_option) {
  expect_ec_error("{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                  "\"true\"}}",
                  ENCACHE_ECONFIG,
                  "ec_connector_extra_config.cross_encoder_cache: must be a "
                  "boolean (true or false), got a string \"true\"");
  expect_ec_error("{\"ec_connector_extra_config\": {\"cross_encoder_cache\": 1}}",
                  ENCACHE_ECONFIG, "cross_encoder_cache: must be a boolean");
  /* Key fields: what Python would print in ways no one intends. */
  expect_ec_error("{\"ec_connector_extra_config\": {\"embedding_cache_prefix\": "
                  "{\"a\": 1}}}",
                  ENCACHE_ECONFIG,
                  "ec_connector_extra_config.embedding_cache_prefix: must be a "
                  "string, got an object {\"a\":1} (vLLM would write "
                  "Python's str() of it into every key");
  expect_ec_error("{\"ec_connector_extra_config\": "
                  "{\"embedding_model_identity\": [1]}}",
                  ENCACHE_ECONFIG, "embedding_model_identity: must be a string, "
                                   "got an array [1]");
  expect_ec_error("{\"ec_connector_extra_config\": [1]}", ENCACHE_ECONFIG,
                  "ec_transfer_config.ec_connector_extra_config: must be an "
                  "object, got an array");
  expect_ec_error("{\"ec_role\": \"ec_encoder\"}", ENCACHE_ECONFIG,
                  "ec_transfer_config.ec_role: must be one of "
                  "ec_producer|ec_consumer|ec_both, got \"ec_encoder\"");
  expect_ec_error("[1, 2]", ENCACHE_ECONFIG,
                  "ec_transfer_config: must be a JSON object, got an array");
}

TEST(config_malformed_json_line_and_column) {
  expect_ec_error("{\n  \"ec_role\": \"ec_producer\",\n  \"x\": ,\n}",
                  ENCACHE_EJSON,
                  "ec_transfer_config: malformed JSON at line 3, column 8");
  expect_ec_error("", ENCACHE_EJSON, "line 1");
  expect_ec_error("{\"a\": 1} trailing", ENCACHE_EJSON, "column");
}

/* Valid JSON is read as vLLM reads it (Python's json.loads), never called
 * malformed (issue 27): a key given twice keeps its last value, with a
 * warning saying where; an integer beyond 64 bits, which Python reads, is
 * refused saying so. */
TEST(config_json_read_as_python_reads_it) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_connector_extra_config\": "
                             "{\"cross_encoder_cache\": false, "
                             "\"store_max_pending_items\": 3, "
                             "\"cross_encoder_cache\": true}}"),
                0);
  int on = 0;
  ASSERT_EQ_INT(encache_config_get_bool(cfg, "cross_encoder_cache", &on), 0);
  ASSERT_EQ_INT(on, 1); /* json.loads: the last one wins */
  ASSERT_EQ_INT(encache_config_warning_count(cfg), 1);
  ASSERT_CONTAINS(encache_config_warning_at(cfg, 0),
                  "ec_transfer_config: a key is given twice in one object "
                  "(first at line 1, column");
  ASSERT_CONTAINS(encache_config_warning_at(cfg, 0),
                  "the last value is used, as vLLM (Python's json.loads)");
  /* A later load without duplicates has no such warning. */
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_connector_extra_config\": {}}"), 0);
  ASSERT_EQ_INT(encache_config_warning_count(cfg), 0);
  /* At the top level too, and in the Mooncake JSON. */
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_role\": \"ec_consumer\", "
                             "\"ec_role\": \"ec_producer\"}"),
                0);
  ASSERT_EQ_INT(encache_config_warning_count(cfg), 1);
  encache_config_free(cfg);
  expect_ec_error("{\"ec_connector_extra_config\": {\"store_max_pending_bytes\": "
                  "99999999999999999999999}}",
                  ENCACHE_ECONFIG,
                  "ec_transfer_config: the integer at line 1, column");
  expect_ec_error("{\"x\": 9223372036854775808}", ENCACHE_ECONFIG,
                  "vLLM (Python's json.loads) reads integers of any size");
  expect_ec_error("{\"x\": -9223372036854775809}", ENCACHE_ECONFIG,
                  "outside -2^63 .. 2^63-1");
  /* \\u0000 is read, then refused by name (deliberately). */
  expect_ec_error("{\"ec_connector_extra_config\": "
                  "{\"embedding_cache_prefix\": \"a\\u0000b\"}}",
                  ENCACHE_ECONFIG, "holds a NUL character");
}

TEST(config_failed_load_keeps_previous_values) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_connector_extra_config\": "
                             "{\"store_max_pending_items\": 5, \"zz\": 1}}"),
                0);
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_connector_extra_config\": "
                             "{\"store_max_pending_items\": 9, "
                             "\"store_read_buffer_bytes\": 0}}"),
                ENCACHE_ECONFIG);
  uint64_t u;
  encache_config_get_u64(cfg, "store_max_pending_items", &u);
  ASSERT_EQ_U64(u, 5);
  ASSERT_EQ_INT(encache_config_unknown_count(cfg), 1);
  /* A later success clears the message. */
  ASSERT_EQ_INT(load_ec(cfg, "{}"), 0);
  ASSERT_EQ_STR(encache_config_errmsg(cfg), "");
  encache_config_get_u64(cfg, "store_max_pending_items", &u);
  ASSERT_EQ_U64(u, 32);
  encache_config_free(cfg);
}

TEST(config_deployment_rules) {
  /* Acceptance case 2: unstable identifiers refuse start-up. */
  encache_config *cfg = new_cfg();
  encache_deployment d;
  encache_deployment_defaults(&d);
  d.mm_processor_cache_gb = 0;
  /* Reuse off: nothing to check. */
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), 0);
  ASSERT_EQ_INT(load_ec(cfg, "{\"ec_connector_extra_config\": "
                             "{\"cross_encoder_cache\": true}}"),
                0);
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, NULL), 0);
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "mm_processor_cache_gb");
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "stable");
  encache_deployment_defaults(&d);
  d.tensor_parallel_size = 2;
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "tensor_parallel_size: is 2");
  encache_deployment_defaults(&d);
  d.pipeline_parallel_size = 4;
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "pipeline_parallel_size");
  encache_deployment_defaults(&d);
  d.data_parallel_size = 2;
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "data_parallel_size");
  encache_deployment_defaults(&d);
  d.dynamic_lora = 1;
  ASSERT_EQ_INT(encache_config_check_deployment(cfg, &d), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "dynamic_lora");
  encache_config_free(cfg);
}

static const char mooncake_ok[] =
    "{\"local_hostname\": \"127.0.0.1\",\n"
    " \"metadata_server\": \"P2PHANDSHAKE\",\n"
    " \"master_server_address\": \"127.0.0.1:50051\",\n"
    " \"protocol\": \"tcp\", \"device_name\": \"\",\n"
    " \"global_segment_size\": \"4GB\",\n"
    " \"local_buffer_size\": \"512MB\"}";

TEST(config_mooncake_accepted) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(load_mc(cfg, mooncake_ok), 0);
  uint64_t u;
  const char *s;
  encache_config_get_u64(cfg, "global_segment_size", &u);
  ASSERT_EQ_U64(u, 4ull << 30);
  encache_config_get_u64(cfg, "local_buffer_size", &u);
  ASSERT_EQ_U64(u, 512ull << 20);
  encache_config_get_string(cfg, "master_server_address", &s);
  ASSERT_EQ_STR(s, "127.0.0.1:50051");
  /* Listed once loaded. */
  int mooncake_items = 0;
  for (int i = 0; i < encache_config_item_count(cfg); i++) {
    encache_config_item it = {.size = sizeof(it)};
    encache_config_item_at(cfg, i, &it);
    mooncake_items += strcmp(it.section, "mooncake") == 0;
  }
  ASSERT(mooncake_items >= 8);
  /* Standalone store with an explicit 0, as integer or string. */
  ASSERT_EQ_INT(load_mc(cfg, "{\"metadata_server\": \"P2PHANDSHAKE\", "
                             "\"master_server_address\": \"h:1\", \"mode\": "
                             "\"standalone-store\", \"global_segment_size\": 0, "
                             "\"local_buffer_size\": 1073741824}"),
                0);
  ASSERT_EQ_INT(load_mc(cfg, "{\"metadata_server\": \"P2PHANDSHAKE\", "
                             "\"master_server_address\": \"h:1\", \"mode\": "
                             "\"standalone-store\", \"global_segment_size\": "
                             "\"0\", \"local_buffer_size\": \"1GB\"}"),
                0);
  encache_config_get_u64(cfg, "local_buffer_size", &u);
  ASSERT_EQ_U64(u, 1ull << 30);
  encache_config_free(cfg);
}

TEST(config_mooncake_refusals_name_the_field) {
  /* Required means not empty either (issue 27: "" was accepted). */
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"\"}",
                  ENCACHE_ECONFIG,
                  "mooncake.master_server_address: must not be empty");
  expect_mc_error("{\"metadata_server\": \"\", \"master_server_address\": "
                  "\"h:1\"}",
                  ENCACHE_ECONFIG, "mooncake.metadata_server: must not be empty");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"mode\": \"standalone-store\"}",
                  ENCACHE_ECONFIG,
                  "mooncake.global_segment_size: mode \"standalone-store\" "
                  "needs an explicit global_segment_size of 0, got none "
                  "(default 4294967296)");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"mode\": \"standalone-store\", "
                  "\"global_segment_size\": \"1GB\"}",
                  ENCACHE_ECONFIG, "got 1073741824");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"enable_offload\": true}",
                  ENCACHE_ECONFIG,
                  "mooncake.enable_offload: must not be true (got true): "
                  "encache requires a RAM Store");
  /* vLLM takes enable_offload as Python's bool() does. */
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"enable_offload\": \"no\"}",
                  ENCACHE_ECONFIG, "must not be true (got \"no\")");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"mode\": \"local\"}",
                  ENCACHE_ECONFIG, "mooncake.mode: must be one of "
                                   "embedded|standalone-store, got \"local\" "
                                   "(vLLM refuses it too)");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"local_buffer_size\": 0}",
                  ENCACHE_ECONFIG, "mooncake.local_buffer_size: must be > 0");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"global_segment_size\": \"0GB\"}",
                  ENCACHE_ECONFIG, "mooncake.global_segment_size: mode "
                                   "\"embedded\" (the default mode) needs a "
                                   "global_segment_size > 0");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"tenant_id\": \" team \"}",
                  ENCACHE_ECONFIG, "mooncake.tenant_id: \"team\" cannot be "
                                   "honoured: the Mooncake C ABI");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"tenant_id\": 5}",
                  ENCACHE_ECONFIG, "mooncake.tenant_id: must be a string or "
                                   "null");
  expect_mc_error("{\"metadata_server\": \"x\"}", ENCACHE_ECONFIG,
                  "mooncake.master_server_address: required, but missing");
  expect_mc_error("{\"master_server_address\": \"h:1\"}", ENCACHE_ECONFIG,
                  "mooncake.metadata_server: required");
  expect_mc_error("{\"metadata_server\": \"x\", \"master_server_address\": "
                  "\"h:1\", \"protocol\": 5}",
                  ENCACHE_ECONFIG, "mooncake.protocol: must be a string");
  static const char *const bad_sizes[] = {
      "\"4XB\"", "\"GB\"",   "\"-1GB\"", "-5",   "true", "\"1GiB\"",
      "\"1e3\"", "\"1.2.3\"", "\".\"",    "\"\"",   "null", "[1]",
      "\"4 T\"", "\"99999999999999GB\""};
  for (size_t i = 0; i < sizeof(bad_sizes) / sizeof(bad_sizes[0]); i++) {
    char json[256];
    snprintf(json, sizeof(json),
             "{\"metadata_server\": \"x\", \"master_server_address\": \"h:1\", "
             "\"local_buffer_size\": %s}",
             bad_sizes[i]);
    expect_mc_error(json, ENCACHE_ECONFIG, "mooncake.local_buffer_size:");
  }
  expect_mc_error("{\"metadata_server\": \"x\",\n\"protocol\" \"tcp\"}",
                  ENCACHE_EJSON, "mooncake config test.json: malformed JSON "
                                 "at line 2, column");
}

TEST(config_mooncake_file_and_env) {
  encache_config *cfg = new_cfg();
  unsetenv("MOONCAKE_CONFIG_PATH");
  ASSERT_EQ_INT(encache_config_load_mooncake_file(cfg, NULL), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "MOONCAKE_CONFIG_PATH: not set");
  ASSERT_EQ_INT(encache_config_load_mooncake_file(cfg, "/nonexistent/x.json"),
                -ENOENT);
  ASSERT_CONTAINS(encache_config_errmsg(cfg), "/nonexistent/x.json");
  char path[] = "/tmp/encache-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(write(fd, mooncake_ok, strlen(mooncake_ok)),
                strlen(mooncake_ok));
  close(fd);
  setenv("MOONCAKE_CONFIG_PATH", path, 1);
  ASSERT_EQ_INT(encache_config_load_mooncake_file(cfg, NULL), 0);
  unlink(path);
  const char *s;
  encache_config_get_string(cfg, "metadata_server", &s);
  ASSERT_EQ_STR(s, "P2PHANDSHAKE");
  encache_config_free(cfg);
}

TEST(config_parse_size) {
  static const struct {
    const char *text;
    uint64_t want;
  } good[] = {{"0", 0},           {"4096", 4096},        {"4GB", 4ull << 30},
              {"4gb", 4ull << 30}, {"512MB", 512ull << 20}, {"1GiB", 1ull << 30},
              {"2 MiB", 2ull << 20}, {" 8kb ", 8192},     {"3TB", 3ull << 40},
              {"7B", 7},          {"16M", 16ull << 20}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    uint64_t v = 1;
    int rc = encache_parse_size(good[i].text, &v);
    if (rc != 0 || v != good[i].want)
      test__fail(__FILE__, __LINE__, "parse_size(\"%s\") = %d, %" PRIu64
                 ", expected %" PRIu64, good[i].text, rc, v, good[i].want);
  }
  static const char *const bad[] = {"", "GB", "-1", "1.5GB", "4 G B", "4PB",
                                    "0x10", "12 34"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint64_t v;
    if (encache_parse_size(bad[i], &v) != ENCACHE_EINVAL)
      test__fail(__FILE__, __LINE__, "parse_size(\"%s\") accepted", bad[i]);
  }
  uint64_t v;
  ASSERT_EQ_INT(encache_parse_size("18446744073709551616", &v),
                ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(encache_parse_size("17179869184GB", &v), ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(encache_parse_size("18446744073709551615", &v), 0);
  ASSERT_EQ_U64(v, UINT64_MAX);
}

TEST(config_out_of_memory_every_allocation) {
  /* Fail each allocation in turn: every load either succeeds or reports
   * ENOMEM, and nothing leaks (the sanitizer build checks that). */
  const char *ec = "{\"ec_role\": \"ec_producer\", \"ec_connector_extra_config\": "
                   "{\"cross_encoder_cache\": true, \"x\": 1, "
                   "\"embedding_cache_prefix\": \"p\"}}";
  int saw_success = 0;
  for (long n = 1; n < 400 && !saw_success; n++) {
    test_alloc_fail_after(n);
    encache_config *cfg = NULL;
    int rc = encache_config_new(&cfg);
    if (rc == 0) {
      rc = load_ec(cfg, ec);
      if (rc == 0)
        rc = load_mc(cfg, mooncake_ok);
    }
    test_alloc_fail_after(0);
    ASSERT(rc == 0 || rc == ENCACHE_ENOMEM);
    if (rc == ENCACHE_ENOMEM && cfg != NULL) /* the reason is never lost */
      ASSERT_CONTAINS(encache_config_errmsg(cfg), "out of memory");
    saw_success = rc == 0;
    encache_config_free(cfg);
  }
  ASSERT(saw_success);
}
