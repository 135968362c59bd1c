/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ns.h: the namespace options shared by the commands that name a
 * namespace (ns.c): model, prefix or vLLM config, revision, encoder
 * field, dtype; the namespace they name, and the engine handle they
 * open.  It stands on tool.h only.
 */
#ifndef ENCACHE_TOOL_NS_H
#define ENCACHE_TOOL_NS_H

#include "tool.h"

/* The namespace options shared by key, purge, lookup, publish and config
 * check: the first
 * NS_COUNT_ entries of their option tables are TOOL_NS_OPTS. */
enum {
  NS_MODEL,
  NS_PREFIX,
  NS_CONFIG,
  NS_REVISION,
  NS_ENCODER_HASH,
  NS_TP_MODE,
  NS_ATTN_BACKEND,
  NS_ATTN_DTYPE,
  NS_FP8_SCALE_PATH,
  NS_MM_FACTORS,
  NS_DTYPE,
  NS_COUNT_
};

#define TOOL_NS_OPTS                                                         \
  {"model", 1}, {"prefix", 1}, {"config", 1}, {"revision", 1},               \
      {"encoder-hash", 1}, {"vllm-mm-encoder-tp-mode", 1},                   \
      {"vllm-mm-encoder-attn-backend", 1},                                   \
      {"vllm-mm-encoder-attn-dtype", 1},                                     \
      {"vllm-mm-encoder-fp8-scale-path", 1}, {"vllm-mm-factors", 1},         \
      {"dtype", 1}

typedef struct ns_opts {
  const char *model, *prefix, *revision, *encoder_hash, *config;
  int dtype;
  char hash[40]; /* the encoder field computed from --vllm-mm-encoder-* */
} ns_opts;

/* Reads and checks the namespace options of a into o (the dtype is
 * required; the encoder field from --vllm-mm-encoder-* is computed).
 * Prints why and returns -1 on bad input. */
int ns_from_args(const char *cmd, const tool_args *a, ns_opts *o);

/* The vLLM ec-transfer-config of o: --config's JSON, or one with
 * cross_encoder_cache on and --prefix, in *json (which the caller frees)
 * and loaded into the configuration returned (which the caller frees with
 * encache_config_free), its warnings printed.  Prints why and returns
 * NULL on failure. */
encache_config *ns_config(const char *cmd, const ns_opts *o, char **json,
                          size_t *len);

/* The namespace of o (as `encache key --namespace` prints it), from
 * malloc.  Prints why and returns NULL on failure, with *exit_code
 * EXIT_USAGE (bad options or configuration) or EXIT_FAIL (memory). */
char *ns_string(const char *cmd, const ns_opts *o, int *exit_code);

/* Opens an engine handle for the namespace options on the global Store
 * (an existing one only when existing is set: tool_existing_url()).
 * Prints why and returns NULL on failure, with *exit_code EXIT_USAGE (bad
 * options or configuration) or EXIT_FAIL (the Store cannot be opened). */
encache *open_engine(const char *cmd, const tool_globals *g, const ns_opts *o,
                     int existing, int *exit_code);
/* The latest message the engine of open_engine() logged ("" if none). */
const char *engine_last_log(void);

#endif
