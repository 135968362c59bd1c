/* SPDX-License-Identifier: Apache-2.0 */
/* Keys: the vectors of docs/format.md (acceptance case 1 of behaviour.md). */
#include "runner.h"

#include "encache.h"

static const char vector_ns_prefixed[] =
    "team@cache@embedding@model:shared/model@revision:rev:1"
    "@encoder:encoder:default@dtype:torch.float32@protocol:v3";
static const char vector_key_prefixed[] =
    "team@cache@embedding@model:shared/model@revision:rev:1"
    "@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1";
static const char vector_key_plain[] =
    "embedding@model:shared/model@revision:default@encoder:encoder:default"
    "@dtype:torch.float32@protocol:v3@id:image@1";

TEST(keys_vector_prefixed) {
  encache_namespace_params p = {sizeof p, "team@cache", "shared/model",
                                "rev:1",  NULL,         ENCACHE_FLOAT32};
  char ns[512], key[512];
  int n = encache_namespace(&p, ns, sizeof(ns));
  ASSERT_EQ_INT(n, strlen(vector_ns_prefixed));
  ASSERT_EQ_STR(ns, vector_ns_prefixed);
  n = encache_key(ns, "image@1", key, sizeof(key));
  ASSERT_EQ_INT(n, strlen(vector_key_prefixed));
  ASSERT_EQ_STR(key, vector_key_prefixed);
}

TEST(keys_vector_plain) {
  /* No prefix and revision unset: NULL and "" mean the same. */
  const char *unset[] = {NULL, ""};
  for (int i = 0; i < 2; i++) {
    encache_namespace_params p = {sizeof p, unset[i], "shared/model",
                                  unset[i], unset[i], ENCACHE_FLOAT32};
    char ns[512], key[512];
    ASSERT(encache_namespace(&p, ns, sizeof(ns)) > 0);
    ASSERT(encache_key(ns, "image@1", key, sizeof(key)) > 0);
    ASSERT_EQ_STR(key, vector_key_plain);
  }
}

TEST(keys_encoder_hash_and_dtypes) {
  encache_namespace_params p = {sizeof p, NULL,   "m",
                                NULL,     "3f2a", ENCACHE_BFLOAT16};
  char ns[256];
  ASSERT(encache_namespace(&p, ns, sizeof(ns)) > 0);
  ASSERT_EQ_STR(ns, "embedding@model:m@revision:default@encoder:3f2a"
                    "@dtype:torch.bfloat16@protocol:v3");
  p.dtype = ENCACHE_FLOAT16;
  ASSERT(encache_namespace(&p, ns, sizeof(ns)) > 0);
  ASSERT_CONTAINS(ns, "@dtype:torch.float16@protocol:v3");
}

TEST(keys_size_query_and_short_buffer) {
  encache_namespace_params p = {sizeof p, "team@cache", "shared/model",
                                "rev:1",  NULL,         ENCACHE_FLOAT32};
  int need = encache_namespace(&p, NULL, 0);
  ASSERT_EQ_INT(need, strlen(vector_ns_prefixed));
  char buf[256];
  memset(buf, 'x', sizeof(buf));
  /* Exactly the length is one byte short: the NUL must fit too. */
  ASSERT_EQ_INT(encache_namespace(&p, buf, (size_t)need), ENCACHE_ENOBUFS);
  ASSERT_EQ_INT(buf[0], '\0');
  ASSERT_EQ_INT(buf[need], 'x'); /* nothing written past the given size */
  ASSERT_EQ_INT(encache_namespace(&p, buf, (size_t)need + 1), need);
  ASSERT_EQ_INT(encache_key(buf, "id", NULL, 0), need + 6);
  char small[8];
  ASSERT_EQ_INT(encache_key(buf, "id", small, sizeof(small)),
                ENCACHE_ENOBUFS);
}

TEST(keys_refuse_bad_input) {
  encache_namespace_params p = {sizeof p, NULL, "m", NULL, NULL, 99};
  char buf[256];
  ASSERT_EQ_INT(encache_namespace(&p, buf, sizeof(buf)), ENCACHE_EDTYPE);
  p.dtype = ENCACHE_FLOAT32;
  /* An empty model is written as vLLM writes an empty identity. */
  p.model = "";
  ASSERT(encache_namespace(&p, buf, sizeof(buf)) > 0);
  ASSERT_CONTAINS(buf, "embedding@model:@revision:default@");
  p.model = NULL;
  ASSERT_EQ_INT(encache_namespace(&p, buf, sizeof(buf)), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_namespace(NULL, buf, sizeof(buf)), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_key("ns", "", buf, sizeof(buf)), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_key("ns", NULL, buf, sizeof(buf)), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_key(NULL, "id", buf, sizeof(buf)), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_key("ns", "id", NULL, 5), ENCACHE_EINVAL);
}

TEST(keys_long_components_verbatim) {
  /* Components are used as given: no escaping, no hashing, any length. */
  static char id[8192];
  memset(id, 'a', sizeof(id) - 1);
  id[100] = '@';
  id[200] = ':';
  static char key[9000];
  int n = encache_key("ns", id, key, sizeof(key));
  ASSERT_EQ_INT(n, 2 + 4 + (int)sizeof(id) - 1);
  ASSERT_EQ_MEM(key + 6, id, sizeof(id) - 1);
}

/* docs/format.md, "Fields as vLLM writes them": an option that is present is
 * written as Python's str() writes its JSON value. */
TEST(keys_vector_python_str_fields) {
  static const struct {
    const char *extra, *key;
  } v[] = {
      {"{\"embedding_model_identity\": null}",
       "embedding@model:None@revision:default@encoder:encoder:default"
       "@dtype:torch.float32@protocol:v3@id:x"},
      {"{\"embedding_model_identity\": \"\"}",
       "embedding@model:@revision:default@encoder:encoder:default"
       "@dtype:torch.float32@protocol:v3@id:x"},
      {"{\"embedding_cache_prefix\": null}",
       "None@embedding@model:org/model@revision:default@encoder:encoder:"
       "default@dtype:torch.float32@protocol:v3@id:x"},
      {"{\"embedding_cache_prefix\": true, \"embedding_model_identity\": 123}",
       "True@embedding@model:123@revision:default@encoder:encoder:default"
       "@dtype:torch.float32@protocol:v3@id:x"},
      {"{}", /* absent: the model path exactly as given */
       "embedding@model:org/model@revision:default@encoder:encoder:default"
       "@dtype:torch.float32@protocol:v3@id:x"},
  };
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
    char json[256], ns[512], key[512];
    snprintf(json, sizeof(json), "{\"ec_connector_extra_config\": %s}",
             v[i].extra);
    encache_config *cfg = NULL;
    ASSERT_EQ_INT(encache_config_new(&cfg), 0);
    ASSERT_EQ_INT(encache_config_load_ec(cfg, json, strlen(json)), 0);
    ASSERT(encache_config_namespace(cfg, "org/model", NULL, NULL,
                                    ENCACHE_FLOAT32, ns, sizeof(ns)) > 0);
    ASSERT(encache_key(ns, "x", key, sizeof(key)) > 0);
    ASSERT_EQ_STR(key, v[i].key);
    encache_config_free(cfg);
  }
}

/* docs/format.md: a default multimodal config ([None, 'weights']) hashes to
 * this encoder field. */
TEST(keys_vector_default_encoder_hash) {
  char h[33], ns[256];
  /* The older two-factor list, [None, 'weights'] (vLLM 55e847c0). */
  ASSERT_EQ_INT(encache_vllm_encoder_hash("weights", NULL, h, sizeof(h)), 32);
  ASSERT_EQ_STR(h, "37a439e484856856b929daf9ace244bc");
  /* The newest, [None, 'weights', None, None]: the default (issue 27). */
  ASSERT_EQ_INT(encache_vllm_mm_hash(NULL, h, sizeof(h)), 32);
  ASSERT_EQ_STR(h, "dd7a6ff1cee4ccb4a87001c107039398");
  encache_namespace_params p = {sizeof p, NULL, "org/model",
                                NULL,     h,    ENCACHE_BFLOAT16};
  ASSERT(encache_namespace(&p, ns, sizeof(ns)) > 0);
  ASSERT_EQ_STR(ns, "embedding@model:org/model@revision:default"
                    "@encoder:dd7a6ff1cee4ccb4a87001c107039398"
                    "@dtype:torch.bfloat16@protocol:v3");
}
