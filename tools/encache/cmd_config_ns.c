/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config check's namespace part: with --dtype (and the other namespace
 * options of `encache key`), the namespace the configuration gives is
 * printed and, when a Store is named (--store or $ENCACHE_STORE), looked
 * for in it: a warning when it holds no object there while namespaces of
 * the same model field do (an encache encoder beside vLLM ones that
 * shares nothing because a field differs).
 */
#include "cmd_config_ns.h"
#include "ns.h"

#include "encache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the listing found: the configured namespace's objects, and the
 * others whose model field (model_tag, "@model:M@revision:") is ours. */
typedef struct ns_look {
  const char *ns, *model_tag;
  uint64_t mine;
  int others;
} ns_look;

static int ns_look_cb(const encache_namespace_count *c, void *arg) {
  ns_look *l = arg;
  if (strcmp(c->ns, l->ns) == 0)
    l->mine = c->objects;
  else if (strstr(c->ns, l->model_tag) != NULL && c->objects > 0) {
    if (l->others++ == 0)
      printf("namespaces of the same model in the Store:\n");
    printf("  %" PRIu64 " objects  %s\n", c->objects, c->ns);
  }
  return 0;
}

/* "@model:M@revision:" of namespace ns into tag, or "" when ns has none. */
static void model_tag(const char *ns, char *tag, size_t size) {
  const char *m = strstr(ns, "@model:");
  const char *r = m ? strstr(m + 1, "@revision:") : NULL;
  if (m == NULL || r == NULL || (size_t)(r - m) + 11 > size) {
    tag[0] = '\0';
    return;
  }
  snprintf(tag, size, "%.*s@revision:", (int)(r - m), m);
}

/* Looks ns up in the Store of g; 0, or an exit code after a message. */
static int ns_in_store(const tool_globals *g, const char *ns) {
  encache_store *st = tool_open_store("config check", g, 1);
  if (st == NULL)
    return EXIT_FAIL;
  char tag[4096];
  model_tag(ns, tag, sizeof(tag));
  ns_look l = {ns, tag[0] ? tag : ns, 0, 0};
  int rc = encache_store_namespaces(st, ns_look_cb, &l);
  if (rc < 0) {
    printf("warning: the Store's namespaces cannot be listed: %s\n",
           encache_store_errmsg(st));
  } else {
    printf("objects under this namespace in the Store: %" PRIu64 "\n",
           l.mine);
    if (l.mine == 0 && l.others > 0)
      printf("warning: no object under the configured namespace, while %d "
             "other namespace%s of the same model %s: an encoder with this "
             "configuration shares nothing with theirs; compare the fields "
             "(prefix, revision, encoder, dtype: docs/format.md) and set "
             "the ones that differ (encache key --vllm-mm-* or "
             "--encoder-hash for the encoder field)\n",
             l.others, l.others == 1 ? "" : "s",
             l.others == 1 ? "has some" : "have some");
  }
  encache_store_close(st);
  return EXIT_OK;
}

int config_check_namespace(const tool_globals *g, const tool_args *a,
                           const char *ec_arg) {
  if (a->val[NS_CONFIG] != NULL || a->val[NS_PREFIX] != NULL)
    return usage_error("config check", "--config and --prefix are not for "
                       "config check: the prefix and identity come from "
                       "--ec-transfer-config");
  tool_args na = *a;
  na.val[NS_CONFIG] = ec_arg;
  ns_opts o;
  if (ns_from_args("config check", &na, &o) < 0)
    return EXIT_USAGE;
  int rc;
  char *ns = ns_string("config check", &o, &rc);
  if (ns == NULL)
    return rc;
  printf("namespace: %s\n", ns);
  rc = g->store_url != NULL ? ns_in_store(g, ns) : EXIT_OK;
  free(ns);
  return rc;
}
