/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Typed options: the setters and getters by id, the metadata of
 * ENCACHE_OPTION_MAP, the typed view the library reads, and the options
 * tables of docs/configuration.md, which must be what the map generates.
 *
 * ENCACHE_UPDATE_DOCS=1 build/encache_tests config_docs_table rewrites
 * those tables from the map instead of comparing them.
 */
#include "runner.h"

#include "encache.h"
#include "internal.h"

#include "config/opts.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>

static encache_config *new_cfg(void) {
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  return cfg;
}

/* The call `rc` was expected to fail with `want` and a message holding
 * `needle`. */
static void expect_fail(encache_config *cfg, int rc, int want,
                        const char *needle, int line) {
  if (rc != want)
    test__fail(__FILE__, line, "rc %d (%s), expected %d (%s): %s", rc,
               encache_err_name(rc), want, encache_err_name(want),
               encache_config_errmsg(cfg));
  if (strstr(encache_config_errmsg(cfg), needle) == NULL)
    test__fail(__FILE__, line, "message \"%s\" lacks \"%s\"",
               encache_config_errmsg(cfg), needle);
}
#define EXPECT_FAIL(cfg, call, want, needle)                                   \
  expect_fail((cfg), (call), (want), (needle), __LINE__)

TEST(config_setters_refuse_bad_values_naming_the_option) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(
      encache_config_set_u64(cfg, ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, 7), 0);
  EXPECT_FAIL(
      cfg, encache_config_set_u64(cfg, ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, 0),
      ENCACHE_ECONFIG,
      "ec_connector_extra_config.store_max_pending_items: "
      "must be a positive integer, got 0");
  uint64_t u = 0;
  ASSERT_EQ_INT(
      encache_config_u64(cfg, ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, &u), 0);
  ASSERT_EQ_U64(u, 7); /* a refused value leaves the option as it was */
  EXPECT_FAIL(cfg,
              encache_config_set_string(cfg, ENCACHE_OPT_EC_ROLE, "ec_encoder"),
              ENCACHE_ECONFIG,
              "ec_transfer_config.ec_role: must be one of "
              "ec_producer|ec_consumer|ec_both, got \"ec_encoder\"");
  EXPECT_FAIL(cfg,
              encache_config_set_double(cfg, ENCACHE_OPT_EC_BUFFER_SIZE, -1),
              ENCACHE_ECONFIG,
              "ec_transfer_config.ec_buffer_size: must be a "
              "non-negative number, got -1");
  EXPECT_FAIL(cfg,
              encache_config_set_double(cfg, ENCACHE_OPT_EC_BUFFER_SIZE, NAN),
              ENCACHE_ECONFIG, "ec_buffer_size: must be a non-negative number");
  EXPECT_FAIL(cfg,
              encache_config_set_u64(cfg, ENCACHE_OPT_LOCAL_BUFFER_SIZE, 0),
              ENCACHE_ECONFIG,
              "mooncake.local_buffer_size: must be > 0, got 0 "
              "(vLLM refuses it too)");
  EXPECT_FAIL(cfg, encache_config_set_string(cfg, ENCACHE_OPT_MODE, "local"),
              ENCACHE_ECONFIG,
              "mooncake.mode: must be one of "
              "embedded|standalone-store, got \"local\" (vLLM "
              "refuses it too)");
  EXPECT_FAIL(cfg, encache_config_set_bool(cfg, ENCACHE_OPT_ENABLE_OFFLOAD, 2),
              ENCACHE_ECONFIG,
              "mooncake.enable_offload: must not be true (got "
              "true): encache requires a RAM Store");
  EXPECT_FAIL(
      cfg, encache_config_set_string(cfg, ENCACHE_OPT_TENANT_ID, " team "),
      ENCACHE_ECONFIG, "mooncake.tenant_id: \"team\" cannot be honoured");
  /* The wrong setter, a derived option, an id out of range. */
  EXPECT_FAIL(
      cfg, encache_config_set_bool(cfg, ENCACHE_OPT_STORE_READ_BUFFER_BYTES, 1),
      ENCACHE_EINVAL,
      "ec_connector_extra_config.store_read_buffer_bytes: "
      "a vLLM positive integer option: set it with "
      "encache_config_set_u64");
  EXPECT_FAIL(
      cfg,
      encache_config_set_string(cfg, ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, "4GB"),
      ENCACHE_EINVAL, "mooncake.global_segment_size: a size option");
  EXPECT_FAIL(cfg,
              encache_config_set_string(cfg, ENCACHE_OPT_LOCAL_HOSTNAME, "h"),
              ENCACHE_EINVAL, "mooncake.local_hostname: derived, not set");
  EXPECT_FAIL(cfg, encache_config_set_u64(cfg, ENCACHE_OPT_COUNT, 1),
              ENCACHE_EINVAL, "no such option");
  EXPECT_FAIL(cfg, encache_config_set_u64(cfg, (encache_option)-1, 1),
              ENCACHE_EINVAL, "no such option");
  ASSERT_EQ_INT(
      encache_config_set_bool(NULL, ENCACHE_OPT_CROSS_ENCODER_CACHE, 1),
      ENCACHE_EINVAL);
  /* None of those put the mooncake section in use. */
  for (int i = 0; i < encache_config_item_count(cfg); i++) {
    encache_config_item it = {.size = sizeof(it)};
    ASSERT_EQ_INT(encache_config_item_at(cfg, i, &it), 0);
    ASSERT(strcmp(it.section, "mooncake") != 0);
  }
  /* Getters of another kind refuse. */
  int b;
  ASSERT_EQ_INT(
      encache_config_bool(cfg, ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, &b),
      ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_config_u64(cfg, ENCACHE_OPT_COUNT, &u), ENCACHE_EINVAL);
  encache_config_free(cfg);
}

TEST(config_validate_rules_between_options) {
  encache_config *cfg = new_cfg();
  ASSERT_EQ_INT(encache_config_validate(cfg), 0);
  ASSERT_EQ_INT(encache_config_set_string(cfg, ENCACHE_OPT_EC_CONNECTOR, "X"),
                0);
  EXPECT_FAIL(cfg, encache_config_validate(cfg), ENCACHE_ECONFIG,
              "ec_transfer_config.ec_role: required when ec_connector is set");
  ASSERT_EQ_INT(encache_config_set_string(cfg, ENCACHE_OPT_EC_ROLE, "ec_both"),
                0);
  ASSERT_EQ_INT(encache_config_validate(cfg), 0);
  /* A mooncake option puts the section in use: its rules apply. */
  ASSERT_EQ_INT(
      encache_config_set_string(cfg, ENCACHE_OPT_MODE, "standalone-store"), 0);
  EXPECT_FAIL(cfg, encache_config_validate(cfg), ENCACHE_ECONFIG,
              "mooncake.metadata_server: required, but missing");
  ASSERT_EQ_INT(encache_config_set_string(cfg, ENCACHE_OPT_METADATA_SERVER,
                                          "P2PHANDSHAKE"),
                0);
  ASSERT_EQ_INT(
      encache_config_set_string(cfg, ENCACHE_OPT_MASTER_SERVER_ADDRESS, "h:1"),
      0);
  EXPECT_FAIL(
      cfg, encache_config_validate(cfg), ENCACHE_ECONFIG,
      "mooncake.global_segment_size: mode \"standalone-store\" needs an "
      "explicit global_segment_size of 0, got none (default 4294967296)");
  ASSERT_EQ_INT(encache_config_set_u64(cfg, ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, 0),
                0);
  setenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", " 10.1.2.3 ", 1);
  ASSERT_EQ_INT(encache_config_validate(cfg), 0);
  ASSERT_EQ_STR(encache_config_errmsg(cfg), "");
  const encache__opts *op = encache__config_opts(cfg);
  ASSERT_EQ_STR(op->local_hostname, "10.1.2.3");
  ASSERT_EQ_STR(op->mode, "standalone-store");
  ASSERT_EQ_U64(op->global_segment_size, 0);
  /* Reset: back to the default, as if never given. */
  ASSERT_EQ_INT(encache_config_reset(cfg, ENCACHE_OPT_MODE), 0);
  ASSERT_EQ_STR(op->mode, "embedded");
  EXPECT_FAIL(
      cfg, encache_config_validate(cfg), ENCACHE_ECONFIG,
      "mode \"embedded\" (the default mode) needs a global_segment_size > 0");
  ASSERT_EQ_INT(encache_config_is_set(cfg, ENCACHE_OPT_EC_CONNECTOR), 1);
  ASSERT_EQ_INT(encache_config_set_string(cfg, ENCACHE_OPT_EC_CONNECTOR, NULL),
                0);
  ASSERT(op->ec_connector == NULL);
  ASSERT_EQ_INT(encache_config_is_set(cfg, ENCACHE_OPT_EC_CONNECTOR), 0);
  ASSERT_EQ_INT(encache_config_is_set(cfg, ENCACHE_OPT_EC_PARALLEL_SIZE), 0);
  ASSERT_EQ_INT(encache_config_is_set(cfg, ENCACHE_OPT_PROTOCOL), 1);
  ASSERT_EQ_INT(encache_config_is_set(cfg, ENCACHE_OPT_COUNT), ENCACHE_EINVAL);
  encache_config_free(cfg);
}

/* ------------------------------------------------ JSON against setters */

/* One value of one option: the JSON member, and the setter call that must
 * give the same typed value. */
typedef struct typed_case {
  encache_option id;
  const char *json;
  enum { B, U, D, S } setter;
  int b;
  uint64_t u;
  double d;
  const char *s;
} typed_case;

static int set_case(encache_config *cfg, const typed_case *c) {
  switch (c->setter) {
  case B:
    return encache_config_set_bool(cfg, c->id, c->b);
  case U:
    return encache_config_set_u64(cfg, c->id, c->u);
  case D:
    return encache_config_set_double(cfg, c->id, c->d);
  default:
    return encache_config_set_string(cfg, c->id, c->s);
  }
}

/* Every option's typed value in a and b is the same. */
static void expect_same_values(const encache_config *a,
                               const encache_config *b) {
  for (int i = 0; i < ENCACHE_OPT_COUNT; i++) {
    encache_option id = (encache_option)i;
    int ba, bb;
    uint64_t ua, ub;
    double da, db;
    const char *sa, *sb;
    const char *name = encache_option_name(id);
    if (encache_config_bool(a, id, &ba) == 0) {
      encache_config_bool(b, id, &bb);
      if (ba != bb)
        test__fail(__FILE__, __LINE__, "%s: %d != %d", name, ba, bb);
    } else if (encache_config_u64(a, id, &ua) == 0) {
      encache_config_u64(b, id, &ub);
      if (ua != ub)
        test__fail(__FILE__, __LINE__, "%s: %" PRIu64 " != %" PRIu64, name, ua,
                   ub);
    } else if (encache_config_double(a, id, &da) == 0) {
      encache_config_double(b, id, &db);
      if (da != db)
        test__fail(__FILE__, __LINE__, "%s: %g != %g", name, da, db);
    } else {
      ASSERT_EQ_INT(encache_config_string(a, id, &sa), 0);
      ASSERT_EQ_INT(encache_config_string(b, id, &sb), 0);
      if ((sa == NULL) != (sb == NULL) || (sa && strcmp(sa, sb) != 0))
        test__fail(__FILE__, __LINE__, "%s: \"%s\" != \"%s\"", name,
                   sa ? sa : "(null)", sb ? sb : "(null)");
    }
  }
}

/* Loads the cases as JSON into one handle and through the setters into
 * another, and compares every option. */
static void json_against_setters(const typed_case *cases, size_t n) {
  char ec[2048] = "{", extra[2048] = "", mc[2048] = "";
  encache_config *byset = new_cfg();
  for (size_t i = 0; i < n; i++) {
    const char *sec = encache_option_section(cases[i].id);
    char *dst = strcmp(sec, "mooncake") == 0             ? mc
                : strcmp(sec, "ec_transfer_config") == 0 ? ec
                                                         : extra;
    snprintf(dst + strlen(dst), 2048 - strlen(dst), "%s\"%s\": %s",
             dst[0] && strcmp(dst, "{") != 0 ? ", " : "",
             encache_option_name(cases[i].id), cases[i].json);
    int rc = set_case(byset, &cases[i]);
    if (rc != 0)
      test__fail(__FILE__, __LINE__, "%s: %s", encache_option_name(cases[i].id),
                 encache_config_errmsg(byset));
  }
  snprintf(ec + strlen(ec), sizeof(ec) - strlen(ec),
           "%s\"ec_connector_extra_config\": {%s}}", strlen(ec) > 1 ? ", " : "",
           extra);
  encache_config *byjson = new_cfg();
  if (encache_config_load_ec(byjson, ec, strlen(ec)) != 0)
    test__fail(__FILE__, __LINE__, "%s: %s", ec, encache_config_errmsg(byjson));
  if (mc[0] != '\0') {
    char text[2100];
    snprintf(text, sizeof(text), "{%s}", mc);
    if (encache_config_load_mooncake(byjson, text, strlen(text), NULL) != 0)
      test__fail(__FILE__, __LINE__, "%s: %s", text,
                 encache_config_errmsg(byjson));
  }
  ASSERT_EQ_INT(encache_config_validate(byset), 0);
  expect_same_values(byjson, byset);
  encache_config_free(byjson);
  encache_config_free(byset);
}

TEST(config_json_and_setters_give_the_same_values) {
  setenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", "10.0.0.7", 1);
  static const typed_case plain[] = {
      {ENCACHE_OPT_EC_CONNECTOR, "\"ECMooncakeStorageConnector\"", S,
       .s = "ECMooncakeStorageConnector"},
      {ENCACHE_OPT_EC_ROLE, "\"ec_producer\"", S, .s = "ec_producer"},
      {ENCACHE_OPT_ENGINE_ID, "\"e1\"", S, .s = "e1"},
      {ENCACHE_OPT_EC_CONNECTOR_MODULE_PATH, "\"m.p\"", S, .s = "m.p"},
      {ENCACHE_OPT_EC_BUFFER_DEVICE, "\"cuda\"", S, .s = "cuda"},
      {ENCACHE_OPT_EC_BUFFER_SIZE, "1.5e9", D, .d = 1.5e9},
      {ENCACHE_OPT_EC_IP, "\"10.0.0.1\"", S, .s = "10.0.0.1"},
      {ENCACHE_OPT_EC_PORT, "0", U, .u = 0},
      {ENCACHE_OPT_EC_RANK, "3", U, .u = 3},
      {ENCACHE_OPT_EC_PARALLEL_SIZE, "2", U, .u = 2},
      {ENCACHE_OPT_CROSS_ENCODER_CACHE, "true", B, .b = 1},
      {ENCACHE_OPT_EMBEDDING_CACHE_PREFIX, "\"team\"", S, .s = "team"},
      {ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY, "\"org/m\"", S, .s = "org/m"},
      {ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, "9", U, .u = 9},
      {ENCACHE_OPT_STORE_MAX_PENDING_BYTES, "1048576", U, .u = 1048576},
      {ENCACHE_OPT_STORE_READ_BUFFER_BYTES, "4096", U, .u = 4096},
      {ENCACHE_OPT_METADATA_SERVER, "\"P2PHANDSHAKE\"", S, .s = "P2PHANDSHAKE"},
      {ENCACHE_OPT_MASTER_SERVER_ADDRESS, "\"h:50051\"", S, .s = "h:50051"},
      {ENCACHE_OPT_PROTOCOL, "\"tcp\"", S, .s = "tcp"},
      {ENCACHE_OPT_DEVICE_NAME, "\"mlx5_0\"", S, .s = "mlx5_0"},
      {ENCACHE_OPT_MODE, "\"standalone-store\"", S, .s = "standalone-store"},
      {ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, "0", U, .u = 0},
      {ENCACHE_OPT_LOCAL_BUFFER_SIZE, "\"512MB\"", U, .u = 512ull << 20},
      {ENCACHE_OPT_ENABLE_OFFLOAD, "false", B, .b = 0},
      {ENCACHE_OPT_TENANT_ID, "\"default\"", S, .s = "default"},
      {ENCACHE_OPT_SINGLE_FLIGHT, "true", B, .b = 1},
      {ENCACHE_OPT_SINGLE_FLIGHT_TTL_MS, "2500", U, .u = 2500},
      {ENCACHE_OPT_SINGLE_FLIGHT_WAIT_MS, "0", U, .u = 0},
      {ENCACHE_OPT_DEVICE_PINNED_POOL_BYTES, "65536", U, .u = 65536},
      {ENCACHE_OPT_DEVICE_SYNC_TIMEOUT_MS, "250", U, .u = 250},
      {ENCACHE_OPT_STATS_SEGMENT, "\"off\"", S, .s = "off"},
      {ENCACHE_OPT_ENCODER_NAME, "\"enc-1\"", S, .s = "enc-1"},
      {ENCACHE_OPT_STORE_WRITES_IN_FLIGHT, "3", U, .u = 3},
      {ENCACHE_OPT_STORE_READS_IN_FLIGHT, "2", U, .u = 2},
  };
  /* Every option but the derived hostname has a case. */
  int covered[ENCACHE_OPT_COUNT] = {0};
  for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
    covered[plain[i].id] = 1;
  for (int i = 0; i < ENCACHE_OPT_COUNT; i++)
    if (!covered[i] && i != ENCACHE_OPT_LOCAL_HOSTNAME)
      test__fail(__FILE__, __LINE__, "option %s has no case",
                 encache_option_name((encache_option)i));
  json_against_setters(plain, sizeof(plain) / sizeof(plain[0]));
  /* What vLLM's Python makes of values that are not of the plain type. */
  static const typed_case python[] = {
      {ENCACHE_OPT_EMBEDDING_CACHE_PREFIX, "null", S, .s = "None"},
      {ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY, "1.5", S, .s = "1.5"},
      {ENCACHE_OPT_METADATA_SERVER, "\"x\"", S, .s = "x"},
      {ENCACHE_OPT_MASTER_SERVER_ADDRESS, "\"h:1\"", S, .s = "h:1"},
      {ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, "\"1.5GB\"", U, .u = 1610612736},
      {ENCACHE_OPT_LOCAL_BUFFER_SIZE, "2048.9", U, .u = 2048},
      {ENCACHE_OPT_ENABLE_OFFLOAD, "\"\"", B, .b = 0},
      {ENCACHE_OPT_TENANT_ID, "\"  \"", S, .s = " default "},
  };
  json_against_setters(python, sizeof(python) / sizeof(python[0]));
  static const typed_case truthy[] = {
      {ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY, "true", S, .s = "True"},
      {ENCACHE_OPT_METADATA_SERVER, "\"x\"", S, .s = "x"},
      {ENCACHE_OPT_MASTER_SERVER_ADDRESS, "\"h:1\"", S, .s = "h:1"},
      {ENCACHE_OPT_ENABLE_OFFLOAD, "[]", B, .b = 0},
      {ENCACHE_OPT_TENANT_ID, "null", S, .s = "default"},
  };
  json_against_setters(truthy, sizeof(truthy) / sizeof(truthy[0]));
}

TEST(config_setter_warns_as_json_does) {
  /* An empty identity gives the key field "model:" either way. */
  encache_config *a = new_cfg(), *b = new_cfg();
  const char *json = "{\"ec_connector_extra_config\": "
                     "{\"embedding_model_identity\": \"\"}}";
  ASSERT_EQ_INT(encache_config_load_ec(a, json, strlen(json)), 0);
  ASSERT_EQ_INT(
      encache_config_set_string(b, ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY, ""),
      0);
  ASSERT_EQ_INT(encache_config_warning_count(a), 1);
  ASSERT_EQ_INT(encache_config_warning_count(b), 1);
  ASSERT_EQ_STR(encache_config_warning_at(a, 0),
                encache_config_warning_at(b, 0));
  ASSERT_CONTAINS(encache_config_warning_at(b, 0),
                  "gives the key field model:,");
  char na[256], nb[256];
  ASSERT(encache_config_namespace(a, "m", NULL, NULL, ENCACHE_FLOAT16, na,
                                  sizeof(na)) > 0);
  ASSERT(encache_config_namespace(b, "m", NULL, NULL, ENCACHE_FLOAT16, nb,
                                  sizeof(nb)) > 0);
  ASSERT_EQ_STR(na, nb);
  encache_config_free(a);
  encache_config_free(b);
}

/* ------------------------------------------------------ the typed view */

static void view_bool(const encache_config *cfg, encache_option id,
                      const void *f) {
  int v = -1;
  ASSERT_EQ_INT(encache_config_bool(cfg, id, &v), 0);
  ASSERT_EQ_INT(*(const int *)f, v);
}
static void view_u64(const encache_config *cfg, encache_option id,
                     const void *f) {
  uint64_t v = 1;
  ASSERT_EQ_INT(encache_config_u64(cfg, id, &v), 0);
  ASSERT_EQ_U64(*(const uint64_t *)f, v);
}
static void view_double(const encache_config *cfg, encache_option id,
                        const void *f) {
  double v = -1;
  ASSERT_EQ_INT(encache_config_double(cfg, id, &v), 0);
  ASSERT(*(const double *)f == v);
}
static void view_string(const encache_config *cfg, encache_option id,
                        const void *f) {
  const char *v = "?";
  ASSERT_EQ_INT(encache_config_string(cfg, id, &v), 0);
  ASSERT(*(const char *const *)f == v);
}

/* Every field of the typed view is what the getter by id says. */
static void expect_view(const encache_config *cfg) {
  const encache__opts *op = encache__config_opts(cfg);
#define VIEW_(id, sec, name, ...)                                              \
  _Generic(op->name, int: view_bool, uint64_t: view_u64, double: view_double, \
           const char *: view_string)(cfg, ENCACHE_OPT_##id, &op->name);
  ENCACHE_OPTION_MAP(VIEW_)
#undef VIEW_
}

TEST(config_typed_view_follows_every_change) {
  encache_config *cfg = new_cfg();
  expect_view(cfg);
  const encache__opts *op = encache__config_opts(cfg);
  ASSERT_EQ_U64(op->store_read_buffer_bytes, 134217728);
  ASSERT_EQ_STR(op->protocol, "rdma");
  ASSERT(op->embedding_model_identity == NULL);
  const char *json =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
      "true, \"store_read_buffer_bytes\": 65536}}";
  ASSERT_EQ_INT(encache_config_load_ec(cfg, json, strlen(json)), 0);
  expect_view(cfg);
  ASSERT_EQ_INT(op->cross_encoder_cache, 1);
  ASSERT_EQ_U64(op->store_read_buffer_bytes, 65536);
  ASSERT_EQ_INT(
      encache_config_set_u64(cfg, ENCACHE_OPT_STORE_READ_BUFFER_BYTES, 1 << 20),
      0);
  ASSERT_EQ_U64(op->store_read_buffer_bytes, 1 << 20);
  ASSERT_EQ_INT(encache_config_set_string(cfg, ENCACHE_OPT_DEVICE_NAME, "d0"),
                0);
  expect_view(cfg);
  ASSERT_EQ_STR(op->device_name, "d0");
  encache_config_free(cfg);
}

/* ------------------------------------------------------------- metadata */

TEST(config_option_metadata) {
  encache_option id = ENCACHE_OPT_STORE_READ_BUFFER_BYTES;
  ASSERT_EQ_STR(encache_option_name(id), "store_read_buffer_bytes");
  ASSERT_EQ_STR(encache_option_section(id), "ec_connector_extra_config");
  ASSERT_EQ_STR(encache_option_type(id), "vLLM positive integer");
  ASSERT_EQ_STR(encache_option_default(id), "134217728");
  ASSERT_EQ_STR(encache_option_rule(id), "");
  ASSERT(encache_option_doc(id)[0] != '\0');
  ASSERT_EQ_STR(encache_option_default(ENCACHE_OPT_PROTOCOL), "\"rdma\"");
  ASSERT_EQ_STR(encache_option_rule(ENCACHE_OPT_MODE),
                "one of embedded|standalone-store");
  ASSERT(encache_option_default(ENCACHE_OPT_METADATA_SERVER) == NULL);
  ASSERT(encache_option_name(ENCACHE_OPT_COUNT) == NULL);
  ASSERT(encache_option_doc((encache_option)-1) == NULL);
  ASSERT_EQ_INT(encache_option_find("protocol"), ENCACHE_OPT_PROTOCOL);
  ASSERT_EQ_INT(encache_option_find("mooncake.protocol"), ENCACHE_OPT_PROTOCOL);
  ASSERT_EQ_INT(encache_option_find("ec_transfer_config.protocol"),
                ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_option_find("nope"), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_option_find(NULL), ENCACHE_ENOENT);
  /* Each id is its name in capitals, and each default obeys its own rule:
   * given as a JSON member, it loads. */
#define ID_NAME_(id, ...) #id,
  static const char *const ids[] = {ENCACHE_OPTION_MAP(ID_NAME_)};
#undef ID_NAME_
  for (int i = 0; i < ENCACHE_OPT_COUNT; i++) {
    const char *name = encache_option_name((encache_option)i);
    char upper[64];
    size_t k = 0;
    for (; name[k] && k + 1 < sizeof(upper); k++)
      upper[k] = (char)toupper((unsigned char)name[k]);
    upper[k] = '\0';
    ASSERT_EQ_STR(ids[i], upper);
    ASSERT_EQ_INT(encache_option_find(name), i);
    const char *def = encache_option_default((encache_option)i);
    if (def == NULL)
      continue;
    char json[512];
    encache_config *cfg = new_cfg();
    int rc;
    if (strcmp(encache_option_section((encache_option)i), "mooncake") == 0) {
      snprintf(json, sizeof(json),
               "{\"metadata_server\": \"x\", "
               "\"master_server_address\": \"h:1\", \"%s\": %s}",
               name, def);
      rc = encache_config_load_mooncake(cfg, json, strlen(json), NULL);
    } else {
      snprintf(json, sizeof(json),
               "{\"ec_connector_extra_config\": "
               "{\"%s\": %s}}",
               name, def);
      rc = encache_config_load_ec(cfg, json, strlen(json));
    }
    if (rc != 0)
      test__fail(__FILE__, __LINE__, "default of %s: %s", name,
                 encache_config_errmsg(cfg));
    encache_config_free(cfg);
  }
}

/* ------------------------------------------------------- out of memory */

static int set_everything(encache_config *cfg) {
  int rc = 0;
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_EC_CONNECTOR, "C");
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_EC_ROLE, "ec_producer");
  if (rc == 0)
    rc = encache_config_set_double(cfg, ENCACHE_OPT_EC_BUFFER_SIZE, 1e9);
  if (rc == 0)
    rc = encache_config_set_u64(cfg, ENCACHE_OPT_EC_PORT, 1);
  if (rc == 0)
    rc = encache_config_set_bool(cfg, ENCACHE_OPT_CROSS_ENCODER_CACHE, 1);
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY,
                                   "");
  if (rc == 0)
    rc = encache_config_set_u64(cfg, ENCACHE_OPT_STORE_MAX_PENDING_ITEMS, 4);
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_METADATA_SERVER, "m");
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_MASTER_SERVER_ADDRESS,
                                   "h:1");
  if (rc == 0)
    rc = encache_config_set_string(cfg, ENCACHE_OPT_TENANT_ID, "");
  if (rc == 0)
    rc = encache_config_set_u64(cfg, ENCACHE_OPT_LOCAL_BUFFER_SIZE, 1 << 20);
  if (rc == 0)
    rc = encache_config_reset(cfg, ENCACHE_OPT_EC_PORT);
  if (rc == 0)
    rc = encache_config_validate(cfg);
  return rc;
}

TEST(config_setters_out_of_memory_every_allocation) {
  /* Fail each allocation in turn: every call succeeds or reports ENOMEM,
   * the handle stays whole (every item renders), nothing leaks. */
  setenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", "10.0.0.7", 1);
  int saw_success = 0;
  for (long n = 1; n < 1000 && !saw_success; n++) {
    test_alloc_fail_after(n);
    encache_config *cfg = NULL;
    int rc = encache_config_new(&cfg);
    if (rc == 0)
      rc = set_everything(cfg);
    test_alloc_fail_after(0);
    if (rc != 0 && rc != ENCACHE_ENOMEM)
      test__fail(__FILE__, __LINE__, "allocation %ld: %d %s", n, rc,
                 cfg ? encache_config_errmsg(cfg) : "");
    saw_success = rc == 0;
    for (int i = 0; cfg != NULL && i < encache_config_item_count(cfg); i++) {
      encache_config_item it = {.size = sizeof(it)};
      ASSERT_EQ_INT(encache_config_item_at(cfg, i, &it), 0);
      ASSERT(it.value != NULL);
    }
    if (cfg != NULL)
      expect_view(cfg);
    encache_config_free(cfg);
  }
  ASSERT(saw_success);
}

/* --------------------------------------------------- the docs' tables */

/* Appends printf output to *buf (grown with realloc). */
static void append(char **buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void append(char **buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  size_t len = *buf ? strlen(*buf) : 0;
  *buf = realloc(*buf, len + (size_t)n + 1);
  ASSERT(*buf != NULL);
  va_start(ap, fmt);
  vsnprintf(*buf + len, (size_t)n + 1, fmt, ap);
  va_end(ap);
}

/* s with '|' escaped for a Markdown table cell. */
static void append_cell(char **buf, const char *s) {
  for (; *s; s++)
    append(buf, *s == '|' ? "\\|" : "%c", *s);
}

/* The table of a section's options, as the map generates it. */
static char *options_table(const char *section) {
  char *t = NULL;
  append(&t, "| option | type | default | rule | description |\n"
             "|--------|------|---------|------|-------------|\n");
  for (int i = 0; i < ENCACHE_OPT_COUNT; i++) {
    encache_option id = (encache_option)i;
    if (strcmp(encache_option_section(id), section) != 0)
      continue;
    const char *def = encache_option_default(id);
    append(&t, "| `%s` | %s | ", encache_option_name(id),
           encache_option_type(id));
    if (def != NULL)
      append(&t, "`%s`", def);
    else
      append(&t, "unset");
    append(&t, " | ");
    append_cell(&t, encache_option_rule(id));
    append(&t, " | ");
    append_cell(&t, encache_option_doc(id));
    append(&t, " |\n");
  }
  return t;
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    test__fail(__FILE__, __LINE__, "cannot open %s", path);
  char *buf = NULL;
  size_t len = 0, n;
  char chunk[4096];
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
    buf = realloc(buf, len + n + 1);
    ASSERT(buf != NULL);
    memcpy(buf + len, chunk, n);
    len += n;
  }
  fclose(f);
  if (buf == NULL)
    buf = calloc(1, 1);
  buf[len] = '\0';
  return buf;
}

TEST(config_docs_table_matches_the_table) {
  static const char *const sections[] = {
      "ec_transfer_config", "ec_connector_extra_config", "mooncake"};
  char path[1024];
  const char *slash = strrchr(__FILE__, '/');
  snprintf(path, sizeof(path), "%.*s../docs/configuration.md",
           slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
  char *doc = read_all(path);
  int update = getenv("ENCACHE_UPDATE_DOCS") != NULL;
  for (size_t k = 0; k < sizeof(sections) / sizeof(sections[0]); k++) {
    char begin[128], end[128];
    snprintf(begin, sizeof(begin), "<!-- options:%s:begin -->\n", sections[k]);
    snprintf(end, sizeof(end), "<!-- options:%s:end -->", sections[k]);
    char *b = strstr(doc, begin), *e = b ? strstr(b, end) : NULL;
    if (b == NULL || e == NULL)
      test__fail(__FILE__, __LINE__, "%s: no region %s ... %s", path, begin,
                 end);
    b += strlen(begin);
    char *want = options_table(sections[k]);
    if (update) {
      char *next = NULL;
      append(&next, "%.*s%s%s", (int)(b - doc), doc, want, e);
      free(doc);
      doc = next;
    } else if (strlen(want) != (size_t)(e - b) ||
               memcmp(want, b, (size_t)(e - b)) != 0) {
      test__fail(__FILE__, __LINE__,
                 "%s: the %s table differs from "
                 "ENCACHE_OPTION_MAP; regenerate it (docs/development.md):"
                 "\n%s",
                 path, sections[k], want);
    }
    free(want);
  }
  if (update) {
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ_INT(fwrite(doc, 1, strlen(doc), f), strlen(doc));
    ASSERT_EQ_INT(fclose(f), 0);
  }
  free(doc);
}
