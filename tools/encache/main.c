/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c: the encache command-line tool, the top of tools/encache/: the
 * table of commands, dispatch and help.  The option parsing every command
 * shares is tool.c's, which knows no command.
 *
 *   encache [--store URL] COMMAND [OPTIONS]
 *
 * --store may also follow the command name (for the commands that use a
 * Store); every command has --help.
 */
#include "commands.h"
#include "man.h"

#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In the order of `encache --help`. */
static const tool_command *const commands[] = {
    &cmd_demo, &cmd_key,     &cmd_identity, &cmd_config, &cmd_lookup,
    &cmd_publish, &cmd_bench, &cmd_put,     &cmd_get,    &cmd_inspect,
    &cmd_ls,   &cmd_namespaces, &cmd_stats, &cmd_rm,       &cmd_purge,  &cmd_shm,
    &cmd_exporter, &cmd_top,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void help(FILE *out) {
  fprintf(out,
          "usage: encache [--store URL] COMMAND [OPTIONS]\n"
          "\n"
          "encache lets the encoders of a multimodal serving fleet reuse each\n"
          "other's outputs through a shared Store, wire compatible with vLLM's\n"
          "cross-encoder output reuse (protocol:v3).\n"
          "\n"
          "Commands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
  fprintf(out,
          "\n"
          "Global options (--store may also follow a command that uses a\n"
          "Store):\n"
          "  --store URL   the Store to use (default: $ENCACHE_STORE, then\n"
          "                " ENCACHE_DEFAULT_STORE ")\n"
          "                URLs: shm://NAME?size=SIZE, redis://HOST:PORT,\n"
          "                redis-cluster://HOST:PORT,..., unix:///PATH,\n"
          "                mooncake:, tier:shm://NAME?size=SIZE+URL\n"
          "                (see docs/stores.md)\n"
          "  --help        show this help\n"
          "  --version     show the version\n"
          "\n"
          "Run 'encache help COMMAND' (or 'encache COMMAND --help') for a\n"
          "command's options; 'encache help' prints this help.\n"
          "Exit status: 0 success; 1 the operation failed (a Store that\n"
          "cannot be opened or answers an error, a lookup with an UNAVAILABLE\n"
          "outcome, a publication not written); 2 bad usage or input.\n");
}

static const tool_command *find(const char *name) {
  for (size_t k = 0; k < NCOMMANDS; k++)
    if (strcmp(name, commands[k]->name) == 0)
      return commands[k];
  return NULL;
}

/* Runs cmd on argv (argv[0] is its name). */
static int dispatch(const tool_command *cmd, tool_globals *g, int argc,
                    char **argv) {
  tool_args a;
  int rc = tool_parse(cmd, argc, argv, g, &a);
  if (rc >= 0)
    return rc;
  if ((cmd->flags & TOOL_OPEN) &&
      (a.st = tool_open_store(cmd->name, g, cmd->flags & TOOL_EXISTING)) ==
          NULL)
    return EXIT_FAIL;
  rc = cmd->run(g, &a);
  encache_store_close(a.st);
  return rc;
}

int main(int argc, char **argv) {
  const char *env = getenv("ENCACHE_STORE");
  tool_globals g;
  memset(&g, 0, sizeof(g));
  g.store_url = env != NULL && env[0] != '\0' ? env : NULL;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      help(stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
      printf("encache %s (protocol:v3)\n", encache_version());
      return EXIT_OK;
    } else if (strcmp(a, "--man") == 0) { /* hidden: the build's encache.1 */
      return tool_man(stdout, help, commands, NCOMMANDS);
    } else if (strcmp(a, "--store") == 0 || strncmp(a, "--store=", 8) == 0) {
      const char *url = a[7] == '=' ? a + 8 : i + 1 < argc ? argv[++i] : NULL;
      if (url == NULL)
        return usage_error(NULL, "--store needs a URL");
      if (tool_add_store(&g, NULL, url) != 0)
        return EXIT_USAGE;
    } else {
      usage_error(NULL, "unknown global option '%s'", a);
      fprintf(stderr, "Run 'encache --help' for usage.\n");
      return EXIT_USAGE;
    }
  }
  if (i >= argc) {
    help(stderr);
    return EXIT_USAGE;
  }
  const tool_command *cmd = find(argv[i]);
  if (cmd != NULL)
    return dispatch(cmd, &g, argc - i, argv + i);
  if (strcmp(argv[i], "help") == 0) {
    if (i + 1 < argc && (cmd = find(argv[i + 1])) != NULL) {
      fputs(cmd->usage, stdout);
      return EXIT_OK;
    }
    help(stdout);
    return EXIT_OK;
  }
  usage_error(NULL, "unknown command '%s'", argv[i]);
  fprintf(stderr, "Run 'encache --help' for the list of commands.\n");
  return EXIT_USAGE;
}
