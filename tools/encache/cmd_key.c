/* encache key: prints the protocol:v3 Store key of an identifier. */
#include "tool.h"

#include "encache.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char key_usage[] =
    "usage: encache key --model M [--prefix P] [--revision R]\n"
    "                   [--encoder-hash H] --dtype DTYPE --id ID\n"
    "\n"
    "Prints the Store key under which an encoder stores the output for ID,\n"
    "byte for byte as vLLM's cross-encoder output reuse computes it.\n"
    "\n"
    "  --model M         embedding_model_identity, or the model path as\n"
    "                    given to the encoder (required)\n"
    "  --prefix P        embedding_cache_prefix (default: none)\n"
    "  --revision R      model revision (default: \"default\")\n"
    "  --encoder-hash H  multimodal-config hash (default: none)\n"
    "  --dtype DTYPE     model dtype: float32, float16 or bfloat16 (required)\n"
    "  --id ID           the multimodal identifier (mm_hash or UUID) (required)\n"
    "  --namespace       print the namespace only (then --id is not needed)\n";

int cmd_key(const tool_globals *g, int argc, char **argv) {
  (void)g;
  static const struct option longopts[] = {
      {"model", required_argument, NULL, 'm'},
      {"prefix", required_argument, NULL, 'p'},
      {"revision", required_argument, NULL, 'r'},
      {"encoder-hash", required_argument, NULL, 'e'},
      {"dtype", required_argument, NULL, 'd'},
      {"id", required_argument, NULL, 'i'},
      {"namespace", no_argument, NULL, 'n'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  encache_namespace_params p = {NULL, NULL, NULL, NULL, -1};
  const char *id = NULL, *dtype = NULL;
  int ns_only = 0, c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': p.model = optarg; break;
    case 'p': p.prefix = optarg; break;
    case 'r': p.revision = optarg; break;
    case 'e': p.encoder_hash = optarg; break;
    case 'd': dtype = optarg; break;
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
  if (p.model == NULL || p.model[0] == '\0')
    return usage_error("key", "--model is required and must not be empty");
  if (dtype == NULL)
    return usage_error("key", "--dtype is required (float32, float16 or "
                              "bfloat16)");
  if ((p.dtype = encache_dtype_parse(dtype)) < 0)
    return usage_error("key", "--dtype: unknown dtype \"%s\" (use float32, "
                              "float16 or bfloat16)", dtype);
  if (!ns_only && (id == NULL || id[0] == '\0'))
    return usage_error("key", "--id is required and must not be empty");

  int need = encache_namespace(&p, NULL, 0);
  if (need < 0)
    return usage_error("key", "%s", encache_strerror(need));
  size_t size = (size_t)need + (id ? strlen(id) : 0) + 8;
  char *ns = malloc((size_t)need + 1), *key = malloc(size);
  int rc = EXIT_FAIL;
  if (ns != NULL && key != NULL &&
      encache_namespace(&p, ns, (size_t)need + 1) >= 0) {
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
  free(ns);
  free(key);
  return rc;
}
