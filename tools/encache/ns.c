/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ns.c: the namespace options shared by key, purge, lookup, publish and
 * config check (model, prefix or vLLM config, revision, encoder field,
 * dtype), the namespace they name, and the engine handle they open
 * (ns.h).
 */
#include "ns.h"

#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The encoder field from --vllm-mm-*: vLLM's MultiModalConfig
 * compute_hash() over the factor list --vllm-mm-factors names (default:
 * the newest, encache_vllm_mm_hash()).  Any of them computes it. */
static int ns_encoder_field(const char *cmd, const tool_args *a, ns_opts *o) {
  encache_vllm_mm_config m = {sizeof(m), 0, a->val[NS_TP_MODE],
                              a->val[NS_ATTN_BACKEND], a->val[NS_ATTN_DTYPE],
                              a->val[NS_FP8_SCALE_PATH]};
  const char *factors = a->val[NS_MM_FACTORS];
  int any = m.tp_mode || m.attn_backend || m.attn_dtype || m.fp8_scale_path ||
            factors;
  if (!any)
    return 0;
  if (o->encoder_hash != NULL)
    return usage_error(cmd, "--encoder-hash and --vllm-mm-* both set the "
                            "encoder field: give one"), -1;
  if (factors != NULL && strcmp(factors, "newest") != 0 &&
      tool_int32(cmd, "--vllm-mm-factors", factors, 1, 4, &m.factors) < 0)
    return -1;
  if (encache_vllm_mm_hash(&m, o->hash, sizeof(o->hash)) < 0)
    return usage_error(cmd, "the --vllm-mm-* options do not make a factor "
                            "list vLLM hashes: --vllm-mm-factors is 1, 2, 4 "
                            "or newest, --vllm-mm-encoder-tp-mode \"weights\" "
                            "or \"data\", --vllm-mm-encoder-attn-backend a "
                            "backend name (letters, digits, '_'), the dtype "
                            "and scale path printable ASCII"), -1;
  o->encoder_hash = o->hash;
  return 0;
}

int ns_from_args(const char *cmd, const tool_args *a, ns_opts *o) {
  memset(o, 0, sizeof(*o));
  o->model = a->val[NS_MODEL];
  o->prefix = a->val[NS_PREFIX];
  o->config = a->val[NS_CONFIG];
  o->revision = a->val[NS_REVISION];
  o->encoder_hash = a->val[NS_ENCODER_HASH];
  const char *dtype = a->val[NS_DTYPE];
  if (o->prefix != NULL && o->config != NULL)
    return usage_error(cmd, "--prefix and --config both set the prefix: give "
                            "embedding_cache_prefix in --config instead"), -1;
  if (ns_encoder_field(cmd, a, o) < 0)
    return -1;
  if (dtype == NULL)
    return usage_error(cmd, "--dtype is required (float32, float16 or "
                            "bfloat16)"), -1;
  if ((o->dtype = encache_dtype_parse(dtype)) < 0)
    return usage_error(cmd, "--dtype: unknown dtype \"%s\" (use float32, "
                            "float16 or bfloat16)", dtype), -1;
  return 0;
}

/* {"ec_connector_extra_config": {"cross_encoder_cache": true,
 *  "embedding_cache_prefix": PREFIX}}, PREFIX escaped as a JSON string. */
static char *prefix_json(const char *prefix) {
  size_t n = strlen(prefix), w = 0;
  char *text = malloc(6 * n + 100);
  if (text == NULL)
    return NULL;
  w = (size_t)sprintf(text, "{\"ec_connector_extra_config\": "
                            "{\"cross_encoder_cache\": true, "
                            "\"embedding_cache_prefix\": \"");
  for (size_t k = 0; k < n; k++) {
    unsigned char ch = (unsigned char)prefix[k];
    if (ch == '"' || ch == '\\')
      w += (size_t)sprintf(text + w, "\\%c", ch);
    else if (ch < 0x20)
      w += (size_t)sprintf(text + w, "\\u%04x", ch);
    else
      text[w++] = (char)ch;
  }
  sprintf(text + w, "\"}}");
  return text;
}

encache_config *ns_config(const char *cmd, const ns_opts *o, char **json,
                          size_t *len) {
  *json = o->config != NULL ? arg_or_file(o->config, len)
                            : prefix_json(o->prefix ? o->prefix : "");
  if (*json == NULL)
    return NULL;
  if (o->config == NULL)
    *len = strlen(*json);
  encache_config *cfg = NULL;
  int rc = encache_config_new(&cfg);
  if (rc == 0)
    rc = encache_config_load_ec(cfg, *json, *len);
  if (rc < 0) {
    fprintf(stderr, "encache %s: --config: %s\n", cmd,
            cfg ? encache_config_errmsg(cfg) : encache_strerror(rc));
    encache_config_free(cfg);
    free(*json);
    *json = NULL;
    return NULL;
  }
  /* The engine refuses what is wrong; say what is surprising. */
  for (int i = 0; i < encache_config_warning_count(cfg); i++)
    fprintf(stderr, "encache %s: warning: %s\n", cmd,
            encache_config_warning_at(cfg, i));
  return cfg;
}

/* The namespace of o under cfg, from malloc; NULL after a message. */
static char *namespace_of(const char *cmd, encache_config *cfg,
                          const ns_opts *o, int *exit_code) {
  int need = encache_config_namespace(cfg, o->model, o->revision,
                                      o->encoder_hash, o->dtype, NULL, 0);
  if (need == ENCACHE_EINVAL) {
    usage_error(cmd, "--model is required and must not be empty (unless "
                     "--config sets embedding_model_identity)");
    return NULL;
  }
  if (need < 0) {
    usage_error(cmd, "%s", encache_strerror(need));
    return NULL;
  }
  char *ns = malloc((size_t)need + 1);
  if (ns == NULL ||
      encache_config_namespace(cfg, o->model, o->revision, o->encoder_hash,
                               o->dtype, ns, (size_t)need + 1) < 0) {
    fprintf(stderr, "encache %s: out of memory\n", cmd);
    *exit_code = EXIT_FAIL;
    free(ns);
    return NULL;
  }
  *exit_code = EXIT_OK;
  return ns;
}

char *ns_string(const char *cmd, const ns_opts *o, int *exit_code) {
  char *json, *ns = NULL;
  size_t len;
  encache_config *cfg = ns_config(cmd, o, &json, &len);
  *exit_code = EXIT_USAGE;
  if (cfg != NULL) {
    free(json);
    ns = namespace_of(cmd, cfg, o, exit_code);
    encache_config_free(cfg);
  }
  return ns;
}

/* The one place where the tool opens an engine handle. */
/* The engine's latest log message (a publication's failure, an oversize
 * object): the tool is single-threaded and the log runs on its thread. */
static char engine_log[512];

static void keep_log(void *ctx, const char *message) {
  (void)ctx;
  snprintf(engine_log, sizeof(engine_log), "%s", message);
}

const char *engine_last_log(void) { return engine_log; }

encache *open_engine(const char *cmd, const tool_globals *g, const ns_opts *o,
                     int existing, int *exit_code) {
  char *json;
  size_t len;
  *exit_code = EXIT_USAGE;
  encache_config *cfg = ns_config(cmd, o, &json, &len);
  if (cfg == NULL)
    return NULL;
  encache_config_free(cfg);
  encache_options opts = ENCACHE_OPTIONS_INIT;
  opts.ec_transfer_config = json;
  opts.ec_transfer_config_len = len;
  opts.model = o->model;
  opts.revision = o->revision;
  opts.encoder_hash = o->encoder_hash;
  opts.model_dtype = o->dtype;
  char url[4096];
  opts.store_url = existing ? tool_existing_url(g, url, sizeof(url))
                            : g->store_url;
  opts.log = keep_log;
  encache *ec = NULL;
  int rc = encache_open(&opts, &ec);
  free(json);
  if (rc != 0) {
    /* A refused configuration is bad input; a Store that cannot be opened
     * fails the operation, as it does for every other command. */
    const char *why = encache_errmsg(NULL);
    fprintf(stderr, "encache %s: %s\n", cmd,
            why[0] ? why : encache_strerror(rc));
    if (rc != ENCACHE_ECONFIG && rc != ENCACHE_EINVAL)
      *exit_code = EXIT_FAIL;
    return NULL;
  }
  if (!encache_enabled(ec)) {
    fprintf(stderr, "encache %s: cross_encoder_cache is false in --config: "
                    "nothing would be looked up or published\n", cmd);
    encache_close(ec);
    return NULL;
  }
  *exit_code = EXIT_OK;
  return ec;
}
