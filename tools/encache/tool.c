/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tool.c: what every command of the encache tool stands on (tool.h):
 * usage errors, files and integers read from arguments, the option
 * parsing shared by all commands, and the Store they open.  It knows no
 * command: the table of them is main.c's, on top.
 */
#include "tool.h"

#include "encache.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int tool_timeout(const char *cmd, const char *text, uint32_t *ms) {
  long long s = TOOL_TIMEOUT_S;
  if (text != NULL &&
      tool_int(cmd, "--timeout", text, 1, TOOL_TIMEOUT_MAX_S, &s) < 0)
    return -1;
  *ms = (uint32_t)s * 1000u;
  return 0;
}

int tool_add_store(tool_globals *g, const char *cmd, const char *url) {
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
      if (tool_add_store(g, cmd->name, optarg) != 0)
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

/* Whether the query q[0..n) (after '?') names create= itself. */
static int says_create(const char *q, size_t n) {
  for (size_t i = 0; i + 7 <= n; i++)
    if ((i == 0 || q[i - 1] == '&') && strncmp(q + i, "create=", 7) == 0)
      return 1;
  return 0;
}

const char *tool_existing_url(const tool_globals *g, char *buf, size_t size) {
  const char *url = g->store_url ? g->store_url : ENCACHE_DEFAULT_STORE;
  /* A tier's local segment is its shm URL, up to the first '+' (an shm URL
   * never holds one): create=no goes there, never into the remote's. */
  size_t pre = strncmp(url, "tier:", 5) == 0 ? 5 : 0;
  const char *shm = url + pre;
  size_t end = pre ? strcspn(shm, "+") : strlen(shm);
  if (strncmp(shm, "shm://", 6) != 0 || (pre && shm[end] == '\0'))
    return url; /* not shm, or a malformed tier: its open says why */
  const char *q = memchr(shm, '?', end);
  if (q != NULL && says_create(q + 1, end - (size_t)(q + 1 - shm)))
    return url;
  snprintf(buf, size, "%.*s%screate=no%s", (int)(pre + end), url,
           q ? "&" : "?", shm + end);
  return buf;
}
