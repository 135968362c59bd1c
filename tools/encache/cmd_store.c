/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Store commands: put, get, inspect, ls, namespaces, stats, rm, shm
 * destroy.  They work on any Store URL (--store, $ENCACHE_STORE, else the
 * default shm Store).
 */
#include "commands.h"
#include "fleet_out.h"

#include "encache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int store_error(encache_store *st, const char *cmd, const char *key,
                       int rc) {
  if (rc == ENCACHE_ENOENT)
    fprintf(stderr, "encache %s: %s: not found\n", cmd, key);
  else
    fprintf(stderr, "encache %s: %s: %s (%s)\n", cmd, key, encache_strerror(rc),
            encache_store_errmsg(st));
  return EXIT_FAIL;
}

/* Reads the whole object at key into a fresh buffer. */
static int fetch(encache_store *st, const char *cmd, const char *key,
                 unsigned char **out, uint64_t *len) {
  for (int attempt = 0; attempt < 3; attempt++) {
    int rc = encache_store_object_size(st, key, len);
    if (rc < 0)
      return store_error(st, cmd, key, rc);
    if (*len > SIZE_MAX - 1) {
      fprintf(stderr, "encache %s: %s: too large\n", cmd, key);
      return EXIT_FAIL;
    }
    unsigned char *buf = malloc((size_t)*len + 1);
    if (buf == NULL) {
      fprintf(stderr, "encache %s: out of memory\n", cmd);
      return EXIT_FAIL;
    }
    const char *keys[1] = {key};
    void *bufs[1] = {buf};
    size_t caps[1] = {(size_t)*len};
    int64_t res[1];
    rc = encache_store_read(st, keys, 1, bufs, caps, res);
    if (rc == 0 && res[0] >= 0) {
      *len = (uint64_t)res[0];
      *out = buf;
      return EXIT_OK;
    }
    free(buf);
    if (rc == 0)
      rc = (int)res[0];
    if (rc != ENCACHE_ETOOLARGE) /* replaced in between: try again */
      return store_error(st, cmd, key, rc);
  }
  fprintf(stderr, "encache %s: %s: keeps changing size\n", cmd, key);
  return EXIT_FAIL;
}

static const char put_usage[] =
    "usage: encache [--store URL] put KEY FILE\n"
    "\n"
    "Stores the bytes of FILE (- = standard input) as the object KEY.  An\n"
    "existing object is never replaced: then it says so and exits 1.\n";

static int run_put(const tool_globals *g, const tool_args *a) {
  (void)g;
  size_t len;
  char *data = read_file(a->argv[1], &len);
  if (data == NULL)
    return EXIT_USAGE;
  int rc = EXIT_FAIL;
  int r = encache_store_write(a->st, a->argv[0], NULL, 0, data, len);
  if (r == 0) {
    printf("written %zu bytes\n", len);
    rc = EXIT_OK;
  } else if (r == ENCACHE_EEXIST) {
    fprintf(stderr, "encache put: %s: exists (objects are never replaced; "
                    "rm it first)\n", a->argv[0]);
  } else {
    store_error(a->st, "put", a->argv[0], r);
  }
  free(data);
  return rc;
}

static const char get_usage[] =
    "usage: encache [--store URL] get KEY > FILE\n"
    "\n"
    "Writes the object KEY, byte for byte, to standard output.\n";

/* Opens the Store and reads the object KEY (a->argv[0]) whole. */
static int fetch_arg(const char *cmd, const tool_globals *g, const tool_args *a,
                     unsigned char **buf, uint64_t *len) {
  (void)g;
  *buf = NULL;
  return fetch(a->st, cmd, a->argv[0], buf, len);
}

static int run_get(const tool_globals *g, const tool_args *a) {
  unsigned char *buf = NULL;
  uint64_t len = 0;
  int rc = fetch_arg("get", g, a, &buf, &len);
  if (rc == EXIT_OK && (fwrite(buf, 1, (size_t)len, stdout) != len ||
                        fflush(stdout) != 0)) {
    perror("encache get: write");
    rc = EXIT_FAIL;
  }
  free(buf);
  return rc;
}

static const char inspect_usage[] =
    "usage: encache [--store URL] inspect KEY\n"
    "\n"
    "Decodes the v3 header of the object KEY: dtype, rows, cols and payload\n"
    "bytes, or says why it is not a v3 object.\n";

static int run_inspect(const tool_globals *g, const tool_args *a) {
  unsigned char *buf = NULL;
  uint64_t len = 0;
  int rc = fetch_arg("inspect", g, a, &buf, &len);
  if (rc == EXIT_OK) {
    char desc[256];
    encache_object_describe(buf, (size_t)len, desc, sizeof(desc));
    printf("key:    %s\nbytes:  %" PRIu64 "\nobject: %s\n", a->argv[0], len,
           desc);
  }
  free(buf);
  return rc;
}

typedef struct ls_item {
  char *key;
  uint64_t len;
} ls_item;

typedef struct ls_acc {
  ls_item *items;
  size_t n, cap;
  int oom;
} ls_acc;

static int ls_collect(const char *key, uint64_t len, void *arg) {
  ls_acc *a = arg;
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    ls_item *it = realloc(a->items, cap * sizeof(*it));
    if (it == NULL)
      return a->oom = 1;
    a->items = it;
    a->cap = cap;
  }
  if ((a->items[a->n].key = strdup(key)) == NULL)
    return a->oom = 1;
  a->items[a->n++].len = len;
  return 0;
}

static int ls_cmp(const void *x, const void *y) {
  return strcmp(((const ls_item *)x)->key, ((const ls_item *)y)->key);
}

/* The own options of ls and namespaces: --timeout. */
static const tool_opt walk_opts[] = {{"timeout", 1}, {NULL, 0}};

/* The existing Store of g for cmd, its walks bounded by --timeout (a's
 * first own option); NULL after a message, *rc the exit status. */
static encache_store *walk_store(const char *cmd, const tool_globals *g,
                                 const tool_args *a, int *rc) {
  uint32_t ms;
  *rc = EXIT_USAGE;
  if (tool_timeout(cmd, a->val[0], &ms) < 0)
    return NULL;
  *rc = EXIT_FAIL;
  encache_store *st = tool_open_store(cmd, g, 1);
  if (st != NULL)
    encache_store_set_list_timeout(st, ms);
  return st;
}

static const char ls_usage[] =
    "usage: encache [--store URL] ls [PATTERN] [--timeout SECONDS]\n"
    "\n"
    "Lists the objects whose keys match the shell PATTERN (default: all),\n"
    "sorted, one per line: BYTES <tab> KEY.\n"
    "\n" TOOL_TIMEOUT_HELP;

static int run_ls(const tool_globals *g, const tool_args *a) {
  int rc;
  encache_store *st = walk_store("ls", g, a, &rc);
  if (st == NULL)
    return rc;
  ls_acc acc = {NULL, 0, 0, 0};
  int r = encache_store_list(st, a->argc == 1 ? a->argv[0] : NULL, ls_collect, &acc);
  rc = EXIT_OK;
  if (acc.oom) {
    fprintf(stderr, "encache ls: out of memory\n");
    rc = EXIT_FAIL;
  } else if (r < 0) {
    fprintf(stderr, "encache ls: %s\n", encache_store_errmsg(st));
    rc = EXIT_FAIL;
  } else {
    if (acc.n > 1) /* qsort(NULL, 0, ...) is undefined */
      qsort(acc.items, acc.n, sizeof(ls_item), ls_cmp);
    for (size_t i = 0; i < acc.n; i++)
      printf("%" PRIu64 "\t%s\n", acc.items[i].len, acc.items[i].key);
  }
  for (size_t i = 0; i < acc.n; i++)
    free(acc.items[i].key);
  free(acc.items);
  encache_store_close(st);
  return rc;
}

static const char namespaces_usage[] =
    "usage: encache [--store URL] namespaces [--timeout SECONDS]\n"
    "\n"
    "Lists the namespaces present in the Store, sorted, one per line:\n"
    "OBJECTS <tab> BYTES <tab> NAMESPACE.  A key's namespace is everything\n"
    "before its \"@id:\" (docs/format.md): the vLLM encoders' and encache's\n"
    "alike, so that the namespace an encoder is configured with can be\n"
    "compared with what is there (encache key --namespace prints it).\n"
    "Keys with no \"@id:\" are counted on a line of their own, NAMESPACE\n"
    "empty.  It lists every key: shm, Redis, Redis Cluster and tier Stores\n"
    "can; a Mooncake Store cannot (its C ABI lists nothing: exit 1, saying\n"
    "so).\n"
    "\n" TOOL_TIMEOUT_HELP;

static int ns_line(const encache_namespace_count *c, void *arg) {
  (void)arg;
  /* Keys are bytes anyone who can write the Store chose: printed as
   * labels are, with no control character raw. */
  printf("%" PRIu64 "\t%" PRIu64 "\t", c->objects, c->bytes);
  fleet_label(stdout, c->ns, LABEL_TEXT, 0, 0);
  putchar('\n');
  return 0;
}

static int run_namespaces(const tool_globals *g, const tool_args *a) {
  int rc;
  encache_store *st = walk_store("namespaces", g, a, &rc);
  if (st == NULL)
    return rc;
  int n = encache_store_namespaces(st, ns_line, NULL);
  if (n < 0)
    fprintf(stderr, "encache namespaces: %s\n", encache_store_errmsg(st));
  encache_store_close(st);
  return n < 0 ? EXIT_FAIL : EXIT_OK;
}

static const char stats_usage[] =
    "usage: encache [--store URL] stats [--format text|json|prometheus]\n"
    "                                   [--segment NAME]\n"
    "\n"
    "Prints the Store's counters: objects, bytes used, capacity, evictions,\n"
    "second chances given at eviction, repairs (after a crashed process or\n"
    "damage found in a shared segment, and objects dropped because their\n"
    "checksum failed); then every counter and latency histogram of the\n"
    "engine handles open on this host (the statistics registry), printed\n"
    "even when the Store cannot be opened (exit 1 then if --store or\n"
    "$ENCACHE_STORE named it, else 0).\n"
    "\n"
    "  --format F     text (default: the Store's counters, then a table of\n"
    "                 the handles), json, or prometheus (the Prometheus text\n"
    "                 format, what `encache exporter` serves)\n"
    "  --segment NAME the registry (default: $ENCACHE_STATS_SEGMENT, else\n"
    "                 encache.fleet.<uid>; the engine's stats_segment option)\n";

static void stat_line(const char *name, uint64_t v) {
  if (v == UINT64_MAX)
    printf("%-13s -\n", name);
  else
    printf("%-13s %" PRIu64 "\n", name, v);
}

/* `encache stats` on an open Store; one that does not answer (a Redis
 * server down: opened lazily) does not hide the fleet either (exit 1). */
static int stats_store(const tool_args *a, encache_store *st) {
  const char *format = a->val[0] != NULL ? a->val[0] : "text";
  int text = strcmp(format, "text") == 0;
  encache_store_stats s = {.size = sizeof(s)};
  if (encache_store_stats_get(st, &s) < 0) {
    fprintf(stderr, "encache stats: %s\n", encache_store_errmsg(st));
    if (text)
      printf("%-13s %s (does not answer)\n", "store", encache_store_url(st));
    int rc = stats_fleet(format, a->val[1], NULL, encache_store_url(st));
    return rc == EXIT_OK ? EXIT_FAIL : rc;
  }
  if (!text)
    return stats_fleet(format, a->val[1], st, NULL);
  printf("%-13s %s\n%-13s %s\n", "store", encache_store_url(st), "kind", s.kind);
  stat_line("objects", s.objects);
  stat_line("bytes_used", s.bytes_used);
  stat_line("capacity", s.capacity);
  stat_line("evictions", s.evictions);
  stat_line("reinsertions", s.reinsertions);
  stat_line("repairs", s.repairs);
  if (s.tier_local_hits != UINT64_MAX) { /* a tier: Store (since 1.3) */
    stat_line("local_hits", s.tier_local_hits);
    stat_line("remote_hits", s.tier_remote_hits);
    stat_line("remote_errors", s.tier_remote_errors);
    stat_line("promo_queued", s.tier_promotions_queued);
    stat_line("promo_done", s.tier_promotions_done);
    stat_line("promo_dropped", s.tier_promotions_dropped);
  }
  return stats_fleet("text", a->val[1], st, NULL);
}

/* The fleet of the host when the Store cannot be opened (its reason is
 * printed): exit 1 when a Store was named (--store, $ENCACHE_STORE), 0
 * when none was (the default shm segment may simply not exist).  The URL
 * shown is the one given (not the create=no form the read-only open
 * used), its password redacted as every message has it. */
static int stats_without_store(const tool_globals *g, const tool_args *a) {
  const char *format = a->val[0] != NULL ? a->val[0] : "text";
  const char *given = g->store_url ? g->store_url : ENCACHE_DEFAULT_STORE;
  char url[4096];
  /* Shown, never with a password (a tier's remote may hold one). */
  if (encache_store_url_redact(given, url, sizeof(url)) < 0)
    snprintf(url, sizeof(url), "(a Store URL too long to show)");
  if (strcmp(format, "text") == 0)
    printf("%-13s %s (cannot be opened)\n", "store", url);
  int rc = stats_fleet(format, a->val[1], NULL, url);
  return rc == EXIT_OK && g->store_url != NULL ? EXIT_FAIL : rc;
}

static int run_stats(const tool_globals *g, const tool_args *a) {
  const char *f = a->val[0];
  if (f != NULL && strcmp(f, "text") != 0 && strcmp(f, "json") != 0 &&
      strcmp(f, "prometheus") != 0)
    return stats_fleet(f, a->val[1], NULL, NULL); /* the usage error */
  encache_store *st = tool_open_store("stats", g, 1);
  if (st == NULL)
    return stats_without_store(g, a);
  int rc = stats_store(a, st);
  encache_store_close(st);
  return rc;
}

static const char rm_usage[] =
    "usage: encache [--store URL] rm KEY...\n"
    "\n"
    "Removes the objects KEY...; exits 1 if any was not found.\n";

static int run_rm(const tool_globals *g, const tool_args *a) {
  (void)g;
  encache_store *st = a->st;
  int rc = EXIT_OK;
  for (int i = 0; i < a->argc; i++) {
    int r = encache_store_remove(st, a->argv[i]);
    if (r < 0)
      rc = store_error(st, "rm", a->argv[i], r);
  }
  return rc;
}

static const char shm_usage[] =
    "usage: encache shm destroy NAME\n"
    "\n"
    "Removes the shared-memory segment NAME (as in shm://NAME).  Processes\n"
    "that have it open keep using it until they close it; the next opener\n"
    "creates a fresh, empty one.\n";

static int run_shm(const tool_globals *g, const tool_args *a) {
  (void)g;
  if (strcmp(a->argv[0], "destroy") != 0)
    return usage_error("shm", "expects 'destroy NAME' (see --help)");
  int r = encache_shm_destroy(a->argv[1]);
  if (r == ENCACHE_EURL)
    return usage_error("shm destroy", "'%s' is not a segment name "
                       "(A-Z a-z 0-9 . _ -)", a->argv[1]);
  if (r == ENCACHE_ENOENT) {
    fprintf(stderr, "encache shm destroy: %s: no such segment\n", a->argv[1]);
    return EXIT_FAIL;
  }
  if (r < 0) {
    fprintf(stderr, "encache shm destroy: %s: %s\n", a->argv[1],
            encache_strerror(r));
    return EXIT_FAIL;
  }
  printf("destroyed %s\n", a->argv[1]);
  return EXIT_OK;
}

/* The commands that only read (and rm) never create an shm segment. */
#define OPEN_EXISTING_ (TOOL_STORE | TOOL_OPEN | TOOL_EXISTING)

const tool_command cmd_put = {"put", "store a file as an object", put_usage,
                              NULL, TOOL_STORE | TOOL_OPEN, 2, 2, "KEY FILE", run_put};
const tool_command cmd_get = {"get", "write an object to standard output",
                              get_usage, NULL, OPEN_EXISTING_, 1, 1, "KEY",
                              run_get};
const tool_command cmd_inspect = {"inspect", "decode an object's v3 header",
                                  inspect_usage, NULL, OPEN_EXISTING_, 1, 1,
                                  "KEY", run_inspect};
/* ls and namespaces open their Store once --timeout is read. */
const tool_command cmd_ls = {"ls", "list objects whose keys match a pattern",
                             ls_usage, walk_opts, TOOL_STORE, 0, 1,
                             "at most one PATTERN (quote it)", run_ls};
static const tool_opt stats_opts[] = {{"format", 1}, {"segment", 1},
                                      {NULL, 0}};
const tool_command cmd_stats = {"stats", "show the Store's and this host's encoders' counters",
                                stats_usage, stats_opts,
                                TOOL_STORE | TOOL_EXISTING, 0, 0, "",
                                run_stats};
const tool_command cmd_namespaces = {
    "namespaces", "list the namespaces in the Store, with objects and bytes",
    namespaces_usage, walk_opts, TOOL_STORE, 0, 0, "no argument",
    run_namespaces};
const tool_command cmd_rm = {"rm", "remove objects", rm_usage, NULL,
                             OPEN_EXISTING_, 1, -1, "KEY...", run_rm};
const tool_command cmd_shm = {"shm", "manage shared-memory segments (destroy)",
                              shm_usage, NULL, 0, 2, 2, "'destroy NAME'",
                              run_shm};
