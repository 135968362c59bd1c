/* encache config check: validates and prints the effective configuration. */
#include "tool.h"

#include "encache.h"

#include <getopt.h>
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
    "  --dynamic-lora                   dynamic LoRA adapters are enabled\n";

static int config_check(int argc, char **argv) {
  static const struct option longopts[] = {
      {"ec-transfer-config", required_argument, NULL, 'c'},
      {"mooncake-config", required_argument, NULL, 'm'},
      {"mm-processor-cache-gb", required_argument, NULL, 'g'},
      {"tensor-parallel-size", required_argument, NULL, 't'},
      {"pipeline-parallel-size", required_argument, NULL, 'p'},
      {"data-parallel-size", required_argument, NULL, 'd'},
      {"dynamic-lora", no_argument, NULL, 'l'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *ec_arg = NULL, *mc_path = NULL;
  encache_deployment dep;
  encache_deployment_defaults(&dep);
  int c;
  long long v;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': ec_arg = optarg; break;
    case 'm': mc_path = optarg; break;
    case 'g': {
      char *end;
      dep.mm_processor_cache_gb = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || dep.mm_processor_cache_gb < 0)
        return usage_error("config check", "--mm-processor-cache-gb: must be "
                           "a non-negative number, got \"%s\"", optarg);
      break;
    }
    case 't':
    case 'p':
    case 'd':
      if (parse_int_option("config check", argv[optind - 1], optarg, 0, &v) < 0)
        return EXIT_USAGE;
      if (v > 1 << 20)
        v = 1 << 20;
      *(c == 't' ? &dep.tensor_parallel_size
                 : c == 'p' ? &dep.pipeline_parallel_size
                            : &dep.data_parallel_size) = (int)v;
      break;
    case 'l': dep.dynamic_lora = 1; break;
    case 'h': fputs(config_usage, stdout); return EXIT_OK;
    case ':':
      return usage_error("config check", "%s needs a value", argv[optind - 1]);
    default:
      return usage_error("config check", "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("config check", "unexpected argument '%s'",
                       argv[optind]);
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
  encache_config_free(cfg);
  return EXIT_OK;
}

int cmd_config(const tool_globals *g, int argc, char **argv) {
  (void)g;
  if (argc >= 2 && strcmp(argv[1], "check") == 0)
    return config_check(argc - 1, argv + 1);
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 ||
                    strcmp(argv[1], "-h") == 0)) {
    fputs(config_usage, stdout);
    return EXIT_OK;
  }
  if (argc < 2)
    return usage_error("config", "missing subcommand (try 'encache config "
                                 "check --help')");
  return usage_error("config", "unknown subcommand '%s' (try 'encache config "
                               "check --help')", argv[1]);
}
