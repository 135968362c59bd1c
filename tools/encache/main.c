/*
 * main.c: the encache command-line tool: global options, dispatch, help.
 *
 *   encache [--store URL] COMMAND [OPTIONS]
 *
 * Global options come before the command; every command has --help.
 */
#include "tool.h"

#include "encache.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tool_command commands[] = {
    {"demo", "run a fleet of encoders sharing one Store (the main job)",
     cmd_demo},
    {"key", "print the Store key of an identifier", cmd_key},
    {"config", "check a vLLM ec-transfer-config and a Mooncake config",
     cmd_config},
    {"lookup", "look identifiers up as an encoder would", cmd_lookup},
    {"publish", "publish a payload as an encoder's output", cmd_publish},
    {"bench", "measure Stores against memcpy and their raw reads", cmd_bench},
    {"put", "store a file as an object", cmd_put},
    {"get", "write an object to standard output", cmd_get},
    {"inspect", "decode an object's v3 header", cmd_inspect},
    {"ls", "list objects whose keys match a pattern", cmd_ls},
    {"stats", "show the Store's counters", cmd_stats},
    {"rm", "remove objects", cmd_rm},
    {"shm", "manage shared-memory segments (destroy)", cmd_shm},
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
    fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(out,
          "\n"
          "Global options:\n"
          "  --store URL   the Store to use (default: $ENCACHE_STORE, then\n"
          "                " ENCACHE_DEFAULT_STORE ")\n"
          "                URLs: shm://NAME?size=SIZE, redis://HOST:PORT,\n"
          "                redis-cluster://HOST:PORT,..., unix:///PATH\n"
          "                (see docs/stores.md)\n"
          "  --help        show this help\n"
          "  --version     show the version\n"
          "\n"
          "Run 'encache COMMAND --help' for a command's options.\n"
          "Exit status: 0 success, 1 the operation failed, 2 bad usage or "
          "input.\n");
}

int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "encache%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_USAGE;
}

char *read_file(const char *path, size_t *len) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "encache: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    if (n + 1 >= cap) {
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0)
      break;
  }
  int err = ferror(f);
  if (f != stdin)
    fclose(f);
  if (buf == NULL || err) {
    fprintf(stderr, "encache: cannot read %s: %s\n", path,
            buf == NULL ? "out of memory" : "read error");
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

char *arg_or_file(const char *arg, size_t *len) {
  if (arg[0] == '@')
    return read_file(arg + 1, len);
  char *s = strdup(arg);
  if (s == NULL)
    fprintf(stderr, "encache: out of memory\n");
  else
    *len = strlen(s);
  return s;
}

int parse_int_option(const char *cmd, const char *opt, const char *text,
                     int allow_zero, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 ||
      (v == 0 && !allow_zero)) {
    usage_error(cmd, "%s: must be a %s integer, got \"%s\"", opt,
                allow_zero ? "non-negative" : "positive", text);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  const char *env = getenv("ENCACHE_STORE");
  tool_globals g = {env != NULL && env[0] != '\0' ? env : NULL, {NULL}, 0};
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      help(stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
      printf("encache %s (protocol:v3)\n", encache_version());
      return EXIT_OK;
    } else if (strcmp(a, "--store") == 0 || strncmp(a, "--store=", 8) == 0) {
      const char *url = a[7] == '=' ? a + 8 : i + 1 < argc ? argv[++i] : NULL;
      if (url == NULL)
        return usage_error(NULL, "--store needs a URL");
      /* Refused here too, with the tool's usage exit code. */
      if (url[0] == '\0')
        return usage_error(NULL, "--store: the URL is empty");
      if (g.nstores == 8)
        return usage_error(NULL, "--store: at most 8");
      if (g.nstores == 0)
        g.store_url = url;
      g.stores[g.nstores++] = url;
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
  for (size_t k = 0; k < NCOMMANDS; k++)
    if (strcmp(argv[i], commands[k].name) == 0)
      return commands[k].run(&g, argc - i, argv + i);
  if (strcmp(argv[i], "help") == 0) {
    if (i + 1 < argc)
      for (size_t k = 0; k < NCOMMANDS; k++)
        if (strcmp(argv[i + 1], commands[k].name) == 0) {
          char *hargv[] = {argv[i + 1], (char *)"--help", NULL};
          return commands[k].run(&g, 2, hargv);
        }
    help(stdout);
    return EXIT_OK;
  }
  usage_error(NULL, "unknown command '%s'", argv[i]);
  fprintf(stderr, "Run 'encache --help' for the list of commands.\n");
  return EXIT_USAGE;
}
