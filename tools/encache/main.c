/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c: the encache command-line tool: the table of commands, the
 * option parsing every command shares, dispatch and help.
 *
 *   encache [--store URL] COMMAND [OPTIONS]
 *
 * --store may also follow the command name (for the commands that use a
 * Store); every command has --help.
 */
#include "man.h"
#include "tool.h"

#include "encache.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
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
  return read_file_max(path, SIZE_MAX - 1, len);
}

char *read_file_max(const char *path, size_t max, size_t *len) {
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
    size_t want = cap - n - 1;
    if (want > max + 1 - n)
      want = max + 1 - n; /* one byte past max tells "longer" */
    size_t got = fread(buf + n, 1, want, f);
    n += got;
    if (got == 0 || n > max)
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

int tool_int(const char *cmd, const char *opt, const char *text, long long lo,
             long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno == 0 && end != text && *end == '\0' && v >= lo && v <= hi) {
    *out = v;
    return 0;
  }
  if (hi == LLONG_MAX && (lo == 0 || lo == 1))
    usage_error(cmd, "%s: must be a %s integer, got \"%s\"", opt,
                lo == 0 ? "non-negative" : "positive", text);
  else
    usage_error(cmd, "%s: must be an integer from %lld to %lld, got \"%s\"",
                opt, lo, hi, text);
  return -1;
}

int tool_int32(const char *cmd, const char *opt, const char *text, int lo,
               int hi, int *out) {
  long long v;
  if (tool_int(cmd, opt, text, lo, hi, &v) < 0)
    return -1;
  *out = (int)v;
  return 0;
}

/* Adds one --store URL to g (a global one or one after the command). */
static int add_store(tool_globals *g, const char *cmd, const char *url) {
  /* Refused here too, with the tool's usage exit code. */
  if (url[0] == '\0')
    return usage_error(cmd, "--store: the URL is empty");
  if (g->nstores == TOOL_MAX_STORES)
    return usage_error(cmd, "--store: at most %d", TOOL_MAX_STORES);
  if (g->nstores == 0)
    g->store_url = url;
  g->stores[g->nstores++] = url;
  return 0;
}

enum { OPT_HELP = 'h', OPT_STORE = 's', OPT_JSON = 'j', OPT_OWN = 1000 };

int tool_parse(const tool_command *cmd, int argc, char **argv, tool_globals *g,
               tool_args *a) {
  struct option longopts[TOOL_MAX_OPTS + 4];
  int n = 0, c;
  /* The command's own options (at most TOOL_MAX_OPTS), then the shared. */
  for (; cmd->opts != NULL && cmd->opts[n].name != NULL && n < TOOL_MAX_OPTS;
       n++) {
    struct option o = {cmd->opts[n].name,
                       cmd->opts[n].has_value ? required_argument : no_argument,
                       NULL, OPT_OWN + n};
    longopts[n] = o;
  }
  struct option help = {"help", no_argument, NULL, OPT_HELP},
                store = {"store", required_argument, NULL, OPT_STORE},
                json = {"json", no_argument, NULL, OPT_JSON},
                end = {NULL, 0, NULL, 0};
  longopts[n++] = help;
  if (cmd->flags & (TOOL_STORE | TOOL_STORES))
    longopts[n++] = store;
  if (cmd->flags & TOOL_JSON)
    longopts[n++] = json;
  longopts[n] = end;
  memset(a, 0, sizeof(*a));
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (c >= OPT_OWN) {
      a->val[c - OPT_OWN] = optarg ? optarg : "";
    } else if (c == OPT_HELP) {
      fputs(cmd->usage, stdout);
      return EXIT_OK;
    } else if (c == OPT_STORE) {
      if (add_store(g, cmd->name, optarg) != 0)
        return EXIT_USAGE;
    } else if (c == OPT_JSON) {
      g->json = 1;
    } else if (c == ':') {
      return usage_error(cmd->name, "%s needs a value", argv[optind - 1]);
    } else {
      return usage_error(cmd->name, "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  if (g->nstores > 1 && !(cmd->flags & TOOL_STORES))
    return usage_error(cmd->name, "--store: given %d times, but only bench "
                       "takes several Stores", g->nstores);
  a->argc = argc - optind;
  a->argv = argv + optind;
  if (a->argc > cmd->max_args && cmd->max_args == 0)
    return usage_error(cmd->name, "unexpected argument '%s'", a->argv[0]);
  if (a->argc < cmd->min_args ||
      (cmd->max_args >= 0 && a->argc > cmd->max_args))
    return usage_error(cmd->name, "expects %s, got %d argument%s (see --help)",
                       cmd->args, a->argc, a->argc == 1 ? "" : "s");
  return -1;
}

static const tool_command *find(const char *name) {
  for (size_t k = 0; k < NCOMMANDS; k++)
    if (strcmp(name, commands[k]->name) == 0)
      return commands[k];
  return NULL;
}

encache_store *tool_open_store(const char *cmd, const tool_globals *g,
                               int existing) {
  encache_store *st = NULL;
  char buf[4096];
  const char *url = existing ? tool_existing_url(g, buf, sizeof(buf))
                             : g->store_url;
  int rc = encache_store_open(url, &st);
  if (rc != 0) {
    const char *why = encache_store_errmsg(NULL); /* no handle on failure */
    fprintf(stderr, "encache %s: cannot open the Store: %s\n", cmd,
            why[0] ? why : encache_strerror(rc));
    return NULL;
  }
  return st;
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
      if (add_store(&g, NULL, url) != 0)
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
