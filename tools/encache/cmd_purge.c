/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encache purge: removes every object of an old namespace (or under a key
 * prefix) from a Store, or counts them first (--dry-run).  The namespace
 * comes from the options of `encache key` (ns.c); the removal and the
 * count from encache_store_remove_prefix() / encache_store_count_prefix().
 */
#include "commands.h"
#include "ns.h"

#include "encache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char purge_usage[] =
    "usage: encache [--store URL] purge --namespace-of --model M\n"
    "                   [--prefix P | --config JSON|@FILE] [--revision R]\n"
    "                   [--encoder-hash H | --vllm-mm-* ...]\n"
    "                   --dtype DTYPE [--dry-run] [--timeout SECONDS]\n"
    "       encache [--store URL] purge --key-prefix KP [--dry-run]\n"
    "                   [--timeout SECONDS]\n"
    "\n"
    "Removes every object of a namespace from the Store: the objects whose\n"
    "keys start with NAMESPACE \"@id:\", NAMESPACE being what 'encache key\n"
    "--namespace' prints for the same options (old weights, an old\n"
    "revision, another dtype).  No other object is removed, not even one of\n"
    "a namespace that starts with the same characters.\n"
    "\n"
    "  --namespace-of    purge the namespace named by the options of\n"
    "                    'encache key' (--model, --prefix or --config,\n"
    "                    --revision, --encoder-hash or --vllm-mm-*,\n"
    "                    --dtype; see 'encache help key')\n"
    "  --key-prefix KP   purge every object whose key starts with KP (bytes,\n"
    "                    not a pattern; not empty) instead\n"
    "  --dry-run         remove nothing: count the objects and their bytes\n"
    "                    (a Store that cannot list its keys, Mooncake, cannot\n"
    "                    count them: it says so)\n"
    TOOL_TIMEOUT_HELP
    "\n"
    "Prints the key prefix, then \"would remove N objects (B bytes)\" or\n"
    "\"removed N objects\".  Redis and Redis Cluster: SCAN and UNLINK on\n"
    "every master; Mooncake: remove by regex, which skips objects read in\n"
    "the last seconds (Mooncake's read lease): run it again for those.\n"
    "Objects written while it runs may stay.  Stopped by --timeout, it\n"
    "prints what it removed until then: run it again for the rest.\n";

enum {
  PURGE_NS_OF = NS_COUNT_,
  PURGE_KEY_PREFIX,
  PURGE_DRY_RUN,
  PURGE_TIMEOUT
};

static const tool_opt purge_opts[] = {
    TOOL_NS_OPTS, [PURGE_NS_OF] = {"namespace-of", 0},
    [PURGE_KEY_PREFIX] = {"key-prefix", 1}, [PURGE_DRY_RUN] = {"dry-run", 0},
    [PURGE_TIMEOUT] = {"timeout", 1}, {NULL, 0}};

/* The key prefix the arguments name, from malloc; NULL after a message
 * with *exit_code set. */
static char *purge_prefix(const tool_args *a, int *exit_code) {
  const char *kp = a->val[PURGE_KEY_PREFIX];
  int ns_of = a->val[PURGE_NS_OF] != NULL;
  *exit_code = EXIT_USAGE;
  if (ns_of == (kp != NULL)) {
    usage_error("purge", "give either --namespace-of (with the options of "
                         "'encache key') or --key-prefix KP");
    return NULL;
  }
  if (kp != NULL) {
    for (int i = 0; i < NS_COUNT_; i++)
      if (a->val[i] != NULL) {
        usage_error("purge", "--%s names a namespace: give it with "
                             "--namespace-of, not --key-prefix",
                    purge_opts[i].name);
        return NULL;
      }
    if (kp[0] == '\0') {
      usage_error("purge", "--key-prefix must not be empty (it would "
                           "name every key)");
      return NULL;
    }
    char *p = strdup(kp);
    if (p == NULL)
      fprintf(stderr, "encache purge: out of memory\n");
    *exit_code = p ? EXIT_OK : EXIT_FAIL;
    return p;
  }
  ns_opts o;
  if (ns_from_args("purge", a, &o) < 0)
    return NULL;
  char *ns = ns_string("purge", &o, exit_code);
  char *p = ns ? malloc(strlen(ns) + 5) : NULL;
  if (p != NULL)
    sprintf(p, "%s@id:", ns); /* a key is NAMESPACE "@id:" ID */
  else if (ns != NULL) {
    fprintf(stderr, "encache purge: out of memory\n");
    *exit_code = EXIT_FAIL;
  }
  free(ns);
  return p;
}

static int run_purge(const tool_globals *g, const tool_args *a) {
  int rc;
  uint32_t ms;
  if (tool_timeout("purge", a->val[PURGE_TIMEOUT], &ms) < 0)
    return EXIT_USAGE;
  char *prefix = purge_prefix(a, &rc);
  if (prefix == NULL)
    return rc;
  encache_store *st = tool_open_store("purge", g, 1);
  if (st == NULL) {
    free(prefix);
    return EXIT_FAIL;
  }
  encache_store_set_list_timeout(st, ms);
  printf("prefix: %s\n", prefix);
  uint64_t n = 0, bytes = 0;
  int r;
  if (a->val[PURGE_DRY_RUN] != NULL) {
    r = encache_store_count_prefix(st, prefix, &n, &bytes);
    if (r == 0)
      printf("would remove %" PRIu64 " object%s (%" PRIu64 " bytes)\n", n,
             n == 1 ? "" : "s", bytes);
  } else {
    r = encache_store_remove_prefix(st, prefix, &n);
    if (r == 0 || n > 0)
      printf("removed %" PRIu64 " object%s%s\n", n, n == 1 ? "" : "s",
             r == 0 ? "" : " before the failure");
  }
  if (r < 0)
    fprintf(stderr, "encache purge: %s (%s)\n", encache_store_errmsg(st),
            encache_strerror(r));
  encache_store_close(st);
  free(prefix);
  return r < 0 ? EXIT_FAIL : EXIT_OK;
}

const tool_command cmd_purge = {
    "purge", "remove every object of an old namespace", purge_usage,
    purge_opts, TOOL_STORE, 0, 0, "no argument", run_purge};
