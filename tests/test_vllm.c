/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vLLM's own vectors, as data (tests/vllm_vectors.json): keys, encoder
 * fields, Python's str() of floats, Mooncake sizes, option errors,
 * object headers and the result codes vLLM treats as safe.  The values
 * were computed with Python 3 from vLLM's definitions
 * (docs/compatibility.md names the files and commits).
 */
#include "runner.h"

#include "encache.h"
#include "config/python.h"
#include "mooncake_codes.h"
#include "mooncake_testing.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static json_t *vectors(const char *section) {
  static json_t *root;
  if (root == NULL) {
    char path[1024];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof(path), "%.*svllm_vectors.json",
             slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
    json_error_t err;
    root = json_load_file(path, 0, &err);
    if (root == NULL)
      test__fail(__FILE__, __LINE__, "%s: %s (line %d)", path, err.text,
                 err.line);
  }
  json_t *s = json_object_get(root, section);
  if (s == NULL)
    test__fail(__FILE__, __LINE__, "vllm_vectors.json has no %s", section);
  return s;
}

static const char *str_or_null(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static int dtype_of(const char *torch) {
  int d = encache_dtype_parse(torch);
  ASSERT(d >= 0);
  return d;
}

TEST(vllm_vectors_keys) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("namespace"), i, c) {
    json_t *ec = json_pack("{s:O}", "ec_connector_extra_config",
                           json_object_get(c, "extra"));
    char *text = json_dumps(ec, 0);
    encache_config *cfg = NULL;
    ASSERT_EQ_INT(encache_config_new(&cfg), 0);
    ASSERT_EQ_INT(encache_config_load_ec(cfg, text, strlen(text)), 0);
    char enc[40];
    const char *tp = str_or_null(c, "tp_mode");
    if (tp != NULL)
      ASSERT_EQ_INT(encache_vllm_encoder_hash(tp, str_or_null(c, "attn_backend"),
                                              enc, sizeof(enc)), 32);
    char ns[1024], key[1200];
    ASSERT(encache_config_namespace(cfg, str_or_null(c, "model"),
                                    str_or_null(c, "revision"),
                                    tp ? enc : NULL,
                                    dtype_of(str_or_null(c, "dtype")), ns,
                                    sizeof(ns)) > 0);
    ASSERT(encache_key(ns, str_or_null(c, "id"), key, sizeof(key)) > 0);
    ASSERT_EQ_STR(key, str_or_null(c, "key"));
    ASSERT_EQ_INT(encache_config_warning_count(cfg),
                  json_integer_value(json_object_get(c, "warnings")));
    encache_config_free(cfg);
    free(text);
    json_decref(ec);
  }
  /* vLLM's unit test constant: the namespace is used as given. */
  json_t *t = vectors("namespace_vllm_test");
  char key[512];
  ASSERT(encache_key(str_or_null(t, "namespace"), str_or_null(t, "id"), key,
                     sizeof(key)) > 0);
  ASSERT_EQ_STR(key, str_or_null(t, "key"));
}

TEST(vllm_vectors_encoder_hash) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("encoder_hash"), i, c) {
    char h[33];
    ASSERT_EQ_INT(encache_vllm_encoder_hash(str_or_null(c, "tp_mode"),
                                            str_or_null(c, "attn_backend"), h,
                                            sizeof(h)), 32);
    ASSERT_EQ_STR(h, str_or_null(c, "hash"));
  }
  char h[33];
  ASSERT_EQ_INT(encache_vllm_encoder_hash("tensor", NULL, h, sizeof(h)),
                ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_vllm_encoder_hash(NULL, NULL, h, sizeof(h)),
                ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_vllm_encoder_hash("weights", "x'y", h, sizeof(h)),
                ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_vllm_encoder_hash("weights", NULL, h, 32),
                ENCACHE_ENOBUFS);
}

TEST(vllm_vectors_python_float_str) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("float_str"), i, c) {
    char buf[64];
    ASSERT_EQ_INT(encache__py_float_str(json_number_value(json_array_get(c, 0)),
                                        buf, sizeof(buf)), 0);
    ASSERT_EQ_STR(buf, json_string_value(json_array_get(c, 1)));
  }
}

static const char mc_base[] =
    "\"metadata_server\": \"x\", \"master_server_address\": \"h:1\"";

TEST(vllm_vectors_mooncake_sizes) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("size"), i, c) {
    char *v = json_dumps(json_object_get(c, "value"), JSON_ENCODE_ANY);
    char json[512];
    snprintf(json, sizeof(json), "{%s, \"local_buffer_size\": %s}", mc_base, v);
    encache_config *cfg = NULL;
    ASSERT_EQ_INT(encache_config_new(&cfg), 0);
    int rc = encache_config_load_mooncake(cfg, json, strlen(json), NULL);
    json_t *want = json_object_get(c, "bytes");
    if (json_is_null(want)) {
      if (rc != ENCACHE_ECONFIG)
        test__fail(__FILE__, __LINE__, "size %s: accepted, vLLM refuses it", v);
      ASSERT_CONTAINS(encache_config_errmsg(cfg), "mooncake.local_buffer_size:");
    } else if (json_integer_value(want) == 0) {
      ASSERT_EQ_INT(rc, ENCACHE_ECONFIG); /* vLLM: must be > 0 */
    } else {
      if (rc != 0)
        test__fail(__FILE__, __LINE__, "size %s: %s", v,
                   encache_config_errmsg(cfg));
      uint64_t u;
      encache_config_get_u64(cfg, "local_buffer_size", &u);
      ASSERT_EQ_U64(u, json_integer_value(want));
    }
    encache_config_free(cfg);
    free(v);
  }
  /* vLLM's defaults. */
  json_t *d = vectors("mooncake_defaults");
  char json[256];
  snprintf(json, sizeof(json), "{%s}", mc_base);
  encache_config *cfg = NULL;
  ASSERT_EQ_INT(encache_config_new(&cfg), 0);
  ASSERT_EQ_INT(encache_config_load_mooncake(cfg, json, strlen(json), NULL), 0);
  const char *s;
  uint64_t u;
  static const char *const strs[] = {"protocol", "device_name", "mode",
                                     "tenant_id"};
  for (size_t k = 0; k < 4; k++) {
    ASSERT_EQ_INT(encache_config_get_string(cfg, strs[k], &s), 0);
    ASSERT_EQ_STR(s, str_or_null(d, strs[k]));
  }
  encache_config_get_u64(cfg, "global_segment_size", &u);
  ASSERT_EQ_U64(u, json_integer_value(json_object_get(d, "global_segment_size")));
  encache_config_get_u64(cfg, "local_buffer_size", &u);
  ASSERT_EQ_U64(u, json_integer_value(json_object_get(d, "local_buffer_size")));
  encache_config_free(cfg);
}

TEST(vllm_vectors_option_errors) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("option_errors"), i, c) {
    char *text = json_dumps(json_object_get(c, "json"), 0);
    encache_config *cfg = NULL;
    ASSERT_EQ_INT(encache_config_new(&cfg), 0);
    int ec = strcmp(str_or_null(c, "section"), "ec") == 0;
    int rc = ec ? encache_config_load_ec(cfg, text, strlen(text))
                : encache_config_load_mooncake(cfg, text, strlen(text), NULL);
    if (rc != ENCACHE_ECONFIG)
      test__fail(__FILE__, __LINE__, "%s: accepted (%d), vLLM refuses it: %s",
                 text, rc, str_or_null(c, "vllm"));
    ASSERT_CONTAINS(encache_config_errmsg(cfg), str_or_null(c, "error"));
    encache_config_free(cfg);
    free(text);
  }
}

TEST(vllm_vectors_headers) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("header"), i, c) {
    int dtype = encache_dtype_parse(str_or_null(c, "dtype"));
    int64_t shape[2] = {json_integer_value(json_object_get(c, "rows")),
                        json_integer_value(json_object_get(c, "cols"))};
    unsigned char payload[64];
    size_t n = (size_t)(shape[0] * shape[1]);
    json_t *vals = json_object_get(c, "values");
    for (size_t k = 0; k < n; k++) {
      double x = json_number_value(json_array_get(vals, k));
      if (dtype == ENCACHE_FLOAT32) {
        float f = (float)x;
        memcpy(payload + 4 * k, &f, 4);
      } else { /* small integers in float16: exact */
        static const uint16_t h[] = {0x0000, 0x3c00, 0x4000};
        ASSERT(x >= 0 && x <= 2);
        payload[2 * k] = (unsigned char)h[(int)x];
        payload[2 * k + 1] = (unsigned char)(h[(int)x] >> 8);
      }
    }
    encache_tensor t = {sizeof t, payload, dtype, 2, shape, NULL, 0, 0, NULL};
    unsigned char obj[128];
    ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
    size_t nb = n * encache_dtype_size(dtype);
    memcpy(obj + 24, payload, nb);
    char hex[300];
    for (size_t k = 0; k < 24 + nb; k++)
      snprintf(hex + 2 * k, 3, "%02x", obj[k]);
    ASSERT_EQ_STR(hex, str_or_null(c, "hex"));
  }
}

TEST(vllm_vectors_result_codes) {
  json_t *v = vectors("vllm_safe_codes");
  static const struct {
    const char *set;
    int read, write;
  } sets[] = {{"io", 1, 1}, {"get_extra", 1, 0}, {"put_extra", 0, 1}};
  int64_t seen[64];
  size_t nseen = 0;
  for (size_t k = 0; k < 3; k++) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, sets[k].set), i, c) {
      int64_t code = json_integer_value(c);
      seen[nseen++] = code;
      int r = encache__mooncake_classify_op(ENCACHE__MC_READ, code);
      int w = encache__mooncake_classify_op(ENCACHE__MC_WRITE, code);
      if (sets[k].read)
        ASSERT(r != ENCACHE_EUNCONFIRMED);
      else
        ASSERT_EQ_INT(r, ENCACHE_EUNCONFIRMED);
      if (sets[k].write)
        ASSERT(w != ENCACHE_EUNCONFIRMED);
      else
        ASSERT_EQ_INT(w, ENCACHE_EUNCONFIRMED);
    }
  }
  /* Every other row of the table poisons reads and writes, as in vLLM. */
  for (int i = 0; i < encache__mooncake_code_count(); i++) {
    int64_t code = encache__mooncake_code_at(i);
    int named = 0;
    for (size_t k = 0; k < nseen; k++)
      named |= seen[k] == code;
    if (!named) {
      ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, code),
                    ENCACHE_EUNCONFIRMED);
      ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, code),
                    ENCACHE_EUNCONFIRMED);
    }
    ASSERT(encache__mooncake_classify_op(ENCACHE__MC_EXISTS, code) !=
           ENCACHE_EUNCONFIRMED);
  }
}

/* The engine's namespace is the configuration's, warnings go to the log. */
static void count_log(void *ctx, const char *msg) {
  (void)msg;
  ++*(int *)ctx;
}

static void engine_namespace_is(const char *identity_json, const char *want) {
  char json[256], url[96];
  snprintf(json, sizeof(json),
           "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
           "\"embedding_model_identity\": %s}}", identity_json);
  snprintf(url, sizeof(url), "shm://encache-vllmtest-%d?size=1MiB",
           (int)getpid());
  int logged = 0;
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "/models/some/path";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  o.log = count_log;
  o.log_ctx = &logged;
  encache *ec = NULL;
  int rc = encache_open(&o, &ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  ASSERT_EQ_STR(encache_namespace_of(ec), want);
  ASSERT_EQ_INT(logged, 1);
  encache_close(ec);
  snprintf(url, sizeof(url), "encache-vllmtest-%d", (int)getpid());
  encache_shm_destroy(url);
}

TEST(vllm_engine_namespace_as_vllm_writes_it) {
  engine_namespace_is("\"\"", "embedding@model:@revision:default"
                      "@encoder:encoder:default@dtype:torch.float32@protocol:v3");
  engine_namespace_is("null", "embedding@model:None@revision:default"
                      "@encoder:encoder:default@dtype:torch.float32@protocol:v3");
}

/* Each factor list vLLM's compute_hash() has hashed, through
 * encache_vllm_mm_hash() (vectors written by Python's str() and MD5 of
 * the lists: tests/vllm_vectors.json, encoder_hash_factors). */
TEST(vllm_vectors_encoder_hash_factors) {
  size_t i;
  json_t *c;
  json_array_foreach(vectors("encoder_hash_factors"), i, c) {
    encache_vllm_mm_config m = {sizeof(m), 0, NULL, NULL, NULL, NULL};
    m.factors = (int)json_integer_value(json_object_get(c, "factors"));
    m.tp_mode = str_or_null(c, "tp_mode");
    m.attn_backend = str_or_null(c, "attn_backend");
    m.attn_dtype = str_or_null(c, "attn_dtype");
    m.fp8_scale_path = str_or_null(c, "fp8_scale_path");
    char h[33];
    ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), 32);
    ASSERT_EQ_STR(h, str_or_null(c, "hash"));
  }
}

/* The default is the newest list, vLLM's defaults hashed:
 * [None, 'weights', None, None]; refusals name no partial digest. */
TEST(vllm_mm_hash_defaults_and_refusals) {
  char h[33];
  ASSERT_EQ_INT(encache_vllm_mm_hash(NULL, h, sizeof(h)), 32);
  ASSERT_EQ_STR(h, "dd7a6ff1cee4ccb4a87001c107039398");
  encache_vllm_mm_config m = {sizeof(m), 0, NULL, NULL, NULL, NULL};
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), 32);
  ASSERT_EQ_STR(h, "dd7a6ff1cee4ccb4a87001c107039398");
  m.factors = 3;
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), ENCACHE_EINVAL);
  m.factors = 4;
  m.tp_mode = "tensor";
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), ENCACHE_EINVAL);
  m.tp_mode = NULL;
  m.fp8_scale_path = "/m/\xc3\xa9.json"; /* non-ASCII: repr() not spelt */
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), ENCACHE_EINVAL);
  m.fp8_scale_path = "/m/a\tb"; /* Python writes \t: refused */
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), ENCACHE_EINVAL);
  m.fp8_scale_path = NULL;
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, 32), ENCACHE_ENOBUFS);
  m.size = 4; /* smaller than any struct this library knows */
  ASSERT_EQ_INT(encache_vllm_mm_hash(&m, h, sizeof(h)), ENCACHE_EINVAL);
}
