/* SPDX-License-Identifier: Apache-2.0 */
/* encache config check: validates and prints the effective configuration. */
#include "cmd_config_ns.h"
#include "commands.h"
#include "ns.h"

#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char config_usage[] =
    "usage: encache config check --ec-transfer-config JSON|@FILE\n"
    "                            [--mooncake-config FILE] [deployment options]\n"
    "\n"
    "Parses the producer's vLLM --ec-transfer-config (the whole object, with\n"
    "encache's options under ec_connector_extra_config) and, when given, the\n"
    "Mooncake client JSON; prints every option with its value and whether it\n"
    "is a default, and the options encache does not know (ignored).\n"
    "Exit status: 0 when the configuration is accepted, 2 when it is refused\n"
    "(the message names the field; malformed JSON gives line and column).\n"
    "\n"
    "  --ec-transfer-config JSON|@FILE  the JSON itself, or @FILE (@- = stdin)\n"
    "  --mooncake-config FILE           the Mooncake client JSON (default:\n"
    "                                   $MOONCAKE_CONFIG_PATH when it is set)\n"
    "\n"
    "Deployment options (start-up is refused when reuse cannot be correct):\n"
    "  --mm-processor-cache-gb GB       vLLM's processor cache (default 4;\n"
    "                                   0 means identifiers are not stable)\n"
    "  --tensor-parallel-size N         (default 1)\n"
    "  --pipeline-parallel-size N       (default 1)\n"
    "  --data-parallel-size N           (default 1)\n"
    "  --dynamic-lora                   dynamic LoRA adapters are enabled\n"
    "\n"
    "Namespace options (those of encache key but --config and --prefix):\n"
    "with --dtype, prints the namespace this configuration gives and, when\n"
    "a Store is named (--store or $ENCACHE_STORE), its objects there, with a\n"
    "warning when it has none while namespaces of the same model do (they\n"
    "differ in a field: encache namespaces lists them all).\n"
    "  --model M --dtype DTYPE [--revision R]\n"
    "  [--encoder-hash H | --vllm-mm-* ...]   as for encache key\n";

enum {
  CC_EC = NS_COUNT_,
  CC_MOONCAKE,
  CC_CACHE_GB,
  CC_TP,
  CC_PP,
  CC_DP,
  CC_LORA
};

static const tool_opt config_opts[] = {
    TOOL_NS_OPTS,
    [CC_EC] = {"ec-transfer-config", 1},
    [CC_MOONCAKE] = {"mooncake-config", 1},
    [CC_CACHE_GB] = {"mm-processor-cache-gb", 1},
    [CC_TP] = {"tensor-parallel-size", 1},
    [CC_PP] = {"pipeline-parallel-size", 1},
    [CC_DP] = {"data-parallel-size", 1},
    [CC_LORA] = {"dynamic-lora", 0},
    {NULL, 0}};

/* The deployment options into dep; -1 after a message on bad input. */
static int deployment(const tool_args *a, encache_deployment *dep) {
  static const char *const names[] = {"--tensor-parallel-size",
                                      "--pipeline-parallel-size",
                                      "--data-parallel-size"};
  int *sizes[] = {&dep->tensor_parallel_size, &dep->pipeline_parallel_size,
                  &dep->data_parallel_size};
  encache_deployment_defaults(dep);
  const char *gb = a->val[CC_CACHE_GB];
  if (gb != NULL) {
    char *end;
    dep->mm_processor_cache_gb = strtod(gb, &end);
    if (end == gb || *end != '\0' || !(dep->mm_processor_cache_gb >= 0))
      return usage_error("config check", "--mm-processor-cache-gb: must be "
                         "a non-negative number, got \"%s\"", gb), -1;
  }
  for (int k = 0; k < 3; k++)
    if (a->val[CC_TP + k] != NULL &&
        tool_int32("config check", names[k], a->val[CC_TP + k], 1, 1 << 20,
                   sizes[k]) < 0)
      return -1;
  dep->dynamic_lora = a->val[CC_LORA] != NULL;
  return 0;
}

/* Every option with its value, the warnings and the unknown options. */
static void print_config(encache_config *cfg) {
  int n = encache_config_item_count(cfg);
  int width = 0;
  for (int i = 0; i < n; i++) {
    encache_config_item it = {.size = sizeof(it)};
    encache_config_item_at(cfg, i, &it);
    int w = (int)(strlen(it.section) + 1 + strlen(it.name));
    if (w > width)
      width = w;
  }
  for (int i = 0; i < n; i++) {
    encache_config_item it = {.size = sizeof(it)};
    char name[256];
    encache_config_item_at(cfg, i, &it);
    snprintf(name, sizeof(name), "%s.%s", it.section, it.name);
    printf("%-*s = %s%s\n", width, name, it.value,
           it.is_default ? "  (default)" : "");
  }
  for (int i = 0; i < encache_config_warning_count(cfg); i++)
    printf("warning: %s\n", encache_config_warning_at(cfg, i));
  int nu = encache_config_unknown_count(cfg);
  if (nu > 0) {
    printf("unknown options (ignored by encache):\n");
    for (int i = 0; i < nu; i++)
      printf("  %s\n", encache_config_unknown_at(cfg, i));
  }
  int enabled = 0;
  encache_config_get_bool(cfg, "cross_encoder_cache", &enabled);
  printf("configuration OK%s\n",
         enabled ? "" : " (cross_encoder_cache is false: reuse is off)");
}

static int config_check(const tool_globals *g, const tool_args *a) {
  const char *ec_arg = a->val[CC_EC], *mc_path = a->val[CC_MOONCAKE];
  encache_deployment dep;
  if (deployment(a, &dep) < 0)
    return EXIT_USAGE;
  if (ec_arg == NULL)
    return usage_error("config check", "--ec-transfer-config is required");
  if (mc_path == NULL) {
    const char *env = getenv("MOONCAKE_CONFIG_PATH");
    if (env != NULL && env[0] != '\0')
      mc_path = env;
  }

  size_t len;
  char *json = arg_or_file(ec_arg, &len);
  if (json == NULL)
    return EXIT_USAGE;
  encache_config *cfg = NULL;
  int rc = encache_config_new(&cfg);
  if (rc == 0)
    rc = encache_config_load_ec(cfg, json, len);
  if (rc == 0 && mc_path != NULL)
    rc = encache_config_load_mooncake_file(cfg, mc_path);
  if (rc == 0)
    rc = encache_config_check_deployment(cfg, &dep);
  free(json);
  if (rc < 0) {
    const char *msg = cfg ? encache_config_errmsg(cfg) : "";
    fprintf(stderr, "encache config check: %s\n",
            msg[0] ? msg : encache_strerror(rc));
    encache_config_free(cfg);
    return rc == ENCACHE_ENOMEM ? EXIT_FAIL : EXIT_USAGE;
  }

  print_config(cfg);
  encache_config_free(cfg);
  return a->val[NS_DTYPE] != NULL ? config_check_namespace(g, a, ec_arg)
                                  : EXIT_OK;
}

static int run_config(const tool_globals *g, const tool_args *a) {
  if (a->argc == 0)
    return usage_error("config", "missing subcommand (try 'encache config "
                                 "check --help')");
  if (strcmp(a->argv[0], "check") != 0)
    return usage_error("config", "unknown subcommand '%s' (try 'encache "
                                 "config check --help')", a->argv[0]);
  if (a->argc > 1)
    return usage_error("config check", "unexpected argument '%s'",
                       a->argv[1]);
  return config_check(g, a);
}

const tool_command cmd_config = {
    "config", "check a vLLM ec-transfer-config and a Mooncake config",
    config_usage, config_opts, 0, 0, -1, "check [OPTIONS]", run_config};
