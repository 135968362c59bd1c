/* encache key: prints the protocol:v3 Store key of an identifier. */
#include "tool.h"

#include "encache.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char key_usage[] =
    "usage: encache key --model M [--prefix P | --config JSON|@FILE]\n"
    "                   [--revision R] [--encoder-hash H |\n"
    "                    --vllm-mm-encoder-tp-mode MODE\n"
    "                    [--vllm-mm-encoder-attn-backend NAME]]\n"
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
    "  --vllm-mm-encoder-tp-mode MODE  compute the encoder field as vLLM's\n"
    "                    MultiModalConfig.compute_hash() does: MODE is\n"
    "                    mm_encoder_tp_mode, \"weights\" (vLLM's default) or \"data\"\n"
    "  --vllm-mm-encoder-attn-backend NAME  mm_encoder_attn_backend\n"
    "                    (default: none, vLLM's default)\n"
    "  --dtype DTYPE     model dtype: float32, float16 or bfloat16 (required)\n"
    "  --id ID           the multimodal identifier (mm_hash or UUID) (required)\n"
    "  --namespace       print the namespace only (then --id is not needed)\n";

int cmd_key(const tool_globals *g, int argc, char **argv) {
  (void)g;
  static const struct option longopts[] = {
      {"model", required_argument, NULL, 'm'},
      {"prefix", required_argument, NULL, 'p'},
      {"config", required_argument, NULL, 'C'},
      {"revision", required_argument, NULL, 'r'},
      {"encoder-hash", required_argument, NULL, 'e'},
      {"vllm-mm-encoder-tp-mode", required_argument, NULL, 'T'},
      {"vllm-mm-encoder-attn-backend", required_argument, NULL, 'A'},
      {"dtype", required_argument, NULL, 'd'},
      {"id", required_argument, NULL, 'i'},
      {"namespace", no_argument, NULL, 'n'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *model = NULL, *prefix = NULL, *config = NULL, *revision = NULL;
  const char *encoder = NULL, *tp_mode = NULL, *backend = NULL;
  const char *id = NULL, *dtype_s = NULL;
  int ns_only = 0, c, dtype;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'p': prefix = optarg; break;
    case 'C': config = optarg; break;
    case 'r': revision = optarg; break;
    case 'e': encoder = optarg; break;
    case 'T': tp_mode = optarg; break;
    case 'A': backend = optarg; break;
    case 'd': dtype_s = optarg; break;
    case 'i': id = optarg; break;
    case 'n': ns_only = 1; break;
    case 'h': fputs(key_usage, stdout); return EXIT_OK;
    case ':': return usage_error("key", "%s needs a value", argv[optind - 1]);
    default: return usage_error("key", "unknown option '%s' (see --help)",
                                argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("key", "unexpected argument '%s'", argv[optind]);
  if (prefix != NULL && config != NULL)
    return usage_error("key", "--prefix and --config both set the prefix: "
                              "give embedding_cache_prefix in --config instead");
  if (encoder != NULL && (tp_mode != NULL || backend != NULL))
    return usage_error("key", "--encoder-hash and --vllm-mm-encoder-* both set "
                              "the encoder field: give one");
  if (backend != NULL && tp_mode == NULL)
    return usage_error("key", "--vllm-mm-encoder-attn-backend needs "
                              "--vllm-mm-encoder-tp-mode (vLLM's default is "
                              "\"weights\")");
  char hash[40];
  if (tp_mode != NULL) {
    if (encache_vllm_encoder_hash(tp_mode, backend, hash, sizeof(hash)) < 0)
      return usage_error("key", "--vllm-mm-encoder-tp-mode must be \"weights\" "
                                "or \"data\" and --vllm-mm-encoder-attn-backend "
                                "a backend name (letters, digits, '_'), got "
                                "\"%s\" and \"%s\"", tp_mode,
                                backend ? backend : "");
    encoder = hash;
  }
  if (dtype_s == NULL)
    return usage_error("key", "--dtype is required (float32, float16 or "
                              "bfloat16)");
  if ((dtype = encache_dtype_parse(dtype_s)) < 0)
    return usage_error("key", "--dtype: unknown dtype \"%s\" (use float32, "
                              "float16 or bfloat16)", dtype_s);
  if (!ns_only && (id == NULL || id[0] == '\0'))
    return usage_error("key", "--id is required and must not be empty");

  /* The vLLM configuration, or one holding --prefix. */
  encache_config *cfg = NULL;
  if (encache_config_new(&cfg) < 0) {
    fprintf(stderr, "encache key: out of memory\n");
    return EXIT_FAIL;
  }
  int rc = 0;
  if (config != NULL) {
    size_t len;
    char *json = arg_or_file(config, &len);
    if (json == NULL) {
      encache_config_free(cfg);
      return EXIT_USAGE;
    }
    rc = encache_config_load_ec(cfg, json, len);
    free(json);
  } else if (prefix != NULL) {
    /* {"ec_connector_extra_config": {"embedding_cache_prefix": P}} */
    size_t n = strlen(prefix), w = 0;
    char *text = malloc(6 * n + 80);
    if (text == NULL) {
      rc = ENCACHE_ENOMEM;
    } else {
      w = (size_t)sprintf(text, "{\"ec_connector_extra_config\": "
                                "{\"embedding_cache_prefix\": \"");
      for (size_t k = 0; k < n; k++) {
        unsigned char ch = (unsigned char)prefix[k];
        if (ch == '"' || ch == '\\')
          w += (size_t)sprintf(text + w, "\\%c", ch);
        else if (ch < 0x20)
          w += (size_t)sprintf(text + w, "\\u%04x", ch);
        else
          text[w++] = (char)ch;
      }
      w += (size_t)sprintf(text + w, "\"}}");
      rc = encache_config_load_ec(cfg, text, w);
      free(text);
    }
  }
  if (rc < 0) {
    fprintf(stderr, "encache key: --config: %s\n", encache_config_errmsg(cfg));
    encache_config_free(cfg);
    return rc == ENCACHE_ENOMEM ? EXIT_FAIL : EXIT_USAGE;
  }
  for (int i = 0; i < encache_config_warning_count(cfg); i++)
    fprintf(stderr, "encache key: warning: %s\n",
            encache_config_warning_at(cfg, i));

  int need = encache_config_namespace(cfg, model, revision, encoder, dtype,
                                      NULL, 0);
  if (need == ENCACHE_EINVAL) {
    encache_config_free(cfg);
    return usage_error("key", "--model is required and must not be empty "
                              "(unless --config sets embedding_model_identity)");
  }
  if (need < 0) {
    encache_config_free(cfg);
    return usage_error("key", "%s", encache_strerror(need));
  }
  size_t size = (size_t)need + (id ? strlen(id) : 0) + 8;
  char *ns = malloc((size_t)need + 1), *key = malloc(size);
  rc = EXIT_FAIL;
  if (ns != NULL && key != NULL &&
      encache_config_namespace(cfg, model, revision, encoder, dtype, ns,
                               (size_t)need + 1) >= 0) {
    if (ns_only) {
      puts(ns);
      rc = EXIT_OK;
    } else if (encache_key(ns, id, key, size) >= 0) {
      puts(key);
      rc = EXIT_OK;
    }
  }
  if (rc != EXIT_OK)
    fprintf(stderr, "encache key: out of memory\n");
  encache_config_free(cfg);
  free(ns);
  free(key);
  return rc;
}
