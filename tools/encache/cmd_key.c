/* SPDX-License-Identifier: Apache-2.0 */
/* encache key: prints the protocol:v3 Store key of an identifier. */
#include "commands.h"
#include "ns.h"

#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char key_usage[] =
    "usage: encache key --model M [--prefix P | --config JSON|@FILE]\n"
    "                   [--revision R] [--encoder-hash H | --vllm-mm-* ...]\n"
    "                   --dtype DTYPE --id ID\n"
    "\n"
    "Prints the Store key under which an encoder stores the output for ID,\n"
    "byte for byte as vLLM's cross-encoder output reuse computes it.\n"
    "\n"
    "  --model M         the model path as given to the encoder (required\n"
    "                    unless --config sets embedding_model_identity)\n"
    "  --prefix P        embedding_cache_prefix (default: none)\n"
    "  --config JSON|@FILE  the vLLM --ec-transfer-config: its\n"
    "                    embedding_cache_prefix and embedding_model_identity\n"
    "                    are written as vLLM writes them (str() of the JSON\n"
    "                    value: null is None); surprising ones are warned of\n"
    "  --revision R      model revision (default: \"default\")\n"
    "  --encoder-hash H  the encoder field as given (default: none, i.e.\n"
    "                    \"encoder:default\", a model without multimodal config)\n"
    "  --vllm-mm-encoder-tp-mode MODE  mm_encoder_tp_mode, \"weights\"\n"
    "                    (vLLM's default) or \"data\"\n"
    "  --vllm-mm-encoder-attn-backend NAME  mm_encoder_attn_backend\n"
    "  --vllm-mm-encoder-attn-dtype D  mm_encoder_attn_dtype (e.g. fp8)\n"
    "  --vllm-mm-encoder-fp8-scale-path P  mm_encoder_fp8_scale_path\n"
    "  --vllm-mm-factors N  the factor list of your vLLM's\n"
    "                    MultiModalConfig.compute_hash(): 4 or newest\n"
    "                    ([backend, tp_mode, attn_dtype, fp8_scale_path], the\n"
    "                    default), 2 ([backend, tp_mode]) or 1 ([backend])\n"
    "                    Any --vllm-mm-* option computes the encoder field\n"
    "                    as that compute_hash() does, an unset one being\n"
    "                    vLLM's default (docs/compatibility.md)\n"
    "  --dtype DTYPE     model dtype: float32, float16 or bfloat16 (required)\n"
    "  --id ID           the multimodal identifier (mm_hash or UUID) (required)\n"
    "  --namespace       print the namespace only (then --id is not needed)\n";

enum { KEY_ID = NS_COUNT_, KEY_NAMESPACE };

static const tool_opt key_opts[] = {
    TOOL_NS_OPTS, [KEY_ID] = {"id", 1}, [KEY_NAMESPACE] = {"namespace", 0},
    {NULL, 0}};

static int run_key(const tool_globals *g, const tool_args *a) {
  (void)g;
  ns_opts o;
  if (ns_from_args("key", a, &o) < 0)
    return EXIT_USAGE;
  const char *id = a->val[KEY_ID];
  int ns_only = a->val[KEY_NAMESPACE] != NULL;
  if (!ns_only && (id == NULL || id[0] == '\0'))
    return usage_error("key", "--id is required and must not be empty");
  int rc;
  char *ns = ns_string("key", &o, &rc);
  if (ns == NULL)
    return rc;
  if (ns_only) {
    puts(ns);
  } else {
    size_t size = strlen(ns) + strlen(id) + 8;
    char *key = malloc(size);
    if (key == NULL || encache_key(ns, id, key, size) < 0) {
      fprintf(stderr, "encache key: out of memory\n");
      rc = EXIT_FAIL;
    } else {
      puts(key);
    }
    free(key);
  }
  free(ns);
  return rc;
}

const tool_command cmd_key = {
    "key", "print the Store key of an identifier", key_usage, key_opts, 0, 0,
    0, "no argument", run_key};
