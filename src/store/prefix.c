/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prefix.c: counting and removing every object under a key prefix (the
 * purge of an old namespace), through the one door.  A backend with its
 * own remove_prefix (Redis, Mooncake) does the removal its way; any other
 * is listed and each object removed.
 *
 * Invariant: nothing outside the prefix is ever removed or counted.  The
 * listing is asked with the prefix as a shell pattern whose special
 * characters are escaped, and every key it answers is compared with the
 * prefix again, byte for byte: no backend's matcher decides alone what is
 * removed.  Keys are collected first and removed after the listing (a
 * backend need not support removals from inside its own listing), sorted
 * so that a key listed twice (Redis's SCAN may) counts once.
 *
 * The same listing, of every key, tallies the namespaces a Store holds
 * (encache_store_namespaces(): everything before a key's "@id:").
 */
#include "base.h"
#include "prefix.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* lead, then prefix with '\\' before each of the characters in special,
 * then tail: a fresh allocation, or NULL. */
static char *escaped(const char *lead, const char *prefix, const char *special,
                     const char *tail) {
  size_t n = strlen(prefix);
  char *out = encache__malloc(2 * n + strlen(lead) + strlen(tail) + 1);
  if (out == NULL)
    return NULL;
  char *w = out + strlen(strcpy(out, lead));
  for (const char *p = prefix; *p; p++) {
    if (strchr(special, *p) != NULL)
      *w++ = '\\';
    *w++ = *p;
  }
  strcpy(w, tail);
  return out;
}

/* The characters of a shell pattern (fnmatch(3), Redis's MATCH) escaped,
 * "*" appended. */
char *encache__prefix_glob(const char *prefix) {
  return escaped("", prefix, "*?[]\\", "*");
}

/* "^" and every ECMAScript regex syntax character escaped:
 * std::regex_search (Mooncake) then matches exactly the keys that start
 * with prefix. */
char *encache__prefix_regex(const char *prefix) {
  return escaped("^", prefix, "^$\\.*+?()[]{}|", "");
}

typedef struct prefix_item {
  char *key;
  uint64_t len;
} prefix_item;

/* The keys under a prefix, collected from a listing. */
typedef struct prefix_acc {
  const char *prefix;
  size_t plen;
  prefix_item *items;
  size_t n, cap;
  int oom;
} prefix_acc;

static int collect(const char *key, uint64_t len, void *arg) {
  prefix_acc *a = arg;
  if (strncmp(key, a->prefix, a->plen) != 0)
    return 0; /* the backend's matcher said yes: we say no */
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 256;
    prefix_item *it = cap > SIZE_MAX / sizeof(*it)
                          ? NULL
                          : encache__realloc(a->items, cap * sizeof(*it));
    if (it == NULL)
      return a->oom = 1;
    a->items = it;
    a->cap = cap;
  }
  if ((a->items[a->n].key = encache__strdup(key)) == NULL)
    return a->oom = 1;
  a->items[a->n++].len = len;
  return 0;
}

static int item_cmp(const void *x, const void *y) {
  return strcmp(((const prefix_item *)x)->key, ((const prefix_item *)y)->key);
}

static void acc_free(prefix_acc *a) {
  for (size_t i = 0; i < a->n; i++)
    encache__free(a->items[i].key);
  encache__free(a->items);
}

/* Lists the keys under prefix into a, sorted, each once.  Returns 0 or a
 * negative code with st's message set. */
static int list_prefix(encache_store *st, const char *prefix, prefix_acc *a) {
  memset(a, 0, sizeof(*a));
  a->prefix = prefix;
  a->plen = strlen(prefix);
  if (!(st->ops->caps & ENCACHE_STORE_CAP_LIST))
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "the %s Store cannot list its keys, so it "
                              "cannot count them", st->ops->kind);
  char *pattern = encache__prefix_glob(prefix);
  if (pattern == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = st->ops->list(st, pattern, collect, a);
  encache__free(pattern);
  if (a->oom)
    return encache_store_fail(st, ENCACHE_ENOMEM,
                              "out of memory listing %zu keys", a->n);
  if (rc != 0)
    return rc < 0 ? rc : ENCACHE_EINVAL;
  if (a->n > 1) { /* qsort(NULL, 0, ...) is undefined */
    qsort(a->items, a->n, sizeof(*a->items), item_cmp);
    size_t w = 1;
    for (size_t i = 1; i < a->n; i++) {
      if (strcmp(a->items[i].key, a->items[w - 1].key) == 0)
        encache__free(a->items[i].key);
      else
        a->items[w++] = a->items[i];
    }
    a->n = w;
  }
  return 0;
}

static int prefix_args(encache_store *st, const char *prefix) {
  if (st == NULL || prefix == NULL)
    return ENCACHE_EINVAL;
  if (prefix[0] == '\0')
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "an empty prefix would name every key");
  return 0;
}

int encache_store_count_prefix(encache_store *st, const char *prefix,
                               uint64_t *objects, uint64_t *bytes) {
  int rc = prefix_args(st, prefix);
  if (rc < 0)
    return rc;
  prefix_acc a;
  rc = list_prefix(st, prefix, &a);
  uint64_t sum = 0;
  for (size_t i = 0; rc == 0 && i < a.n; i++)
    sum += a.items[i].len;
  if (rc == 0 && objects != NULL)
    *objects = a.n;
  if (rc == 0 && bytes != NULL)
    *bytes = sum;
  acc_free(&a);
  return rc;
}

int encache_store_remove_prefix(encache_store *st, const char *prefix,
                                uint64_t *removed) {
  uint64_t done = 0;
  if (removed != NULL)
    *removed = 0;
  int rc = prefix_args(st, prefix);
  if (rc < 0)
    return rc;
  if (ENCACHE__BACKEND_HAS(st->ops, remove_prefix)) {
    rc = st->ops->remove_prefix(st, prefix, &done);
  } else {
    prefix_acc a;
    rc = list_prefix(st, prefix, &a);
    if (rc < 0 && !(st->ops->caps & ENCACHE_STORE_CAP_LIST))
      rc = encache_store_fail(st, ENCACHE_EINVAL,
                              "the %s Store can neither list its keys nor "
                              "remove them by prefix", st->ops->kind);
    for (size_t i = 0; rc == 0 && i < a.n; i++) {
      int r = st->ops->remove(st, a.items[i].key);
      if (r == 0)
        done++;
      else if (encache_store_classify(r) != ENCACHE_ANSWER_ABSENT)
        rc = r; /* absent: gone meanwhile, not an error */
    }
    acc_free(&a);
  }
  if (removed != NULL)
    *removed = done;
  return rc;
}

/* ------------------------------------------------------------ namespaces */

/* At most this many distinct namespaces are reported: a Store holding more
 * is not one a fleet of encoders writes, and the tally below searches its
 * table linearly. */
#define NAMESPACES_MAX 4096

/* The length of key's namespace: everything before the "@id:" that ends a
 * protocol:v3 namespace (the first "@protocol:v3@id:", so that neither a
 * field nor an identifier holding "@id:" moves the cut), else before the
 * first "@id:"; 0 for a key with neither. */
static size_t namespace_len(const char *key) {
  static const char v3[] = "@protocol:v3@id:";
  const char *p = strstr(key, v3);
  if (p != NULL)
    return (size_t)(p - key) + sizeof(v3) - 1 - 4;
  p = strstr(key, "@id:");
  return p != NULL ? (size_t)(p - key) : 0;
}

/* Adds one key of len bytes to the tally t[0..*n) (its namespace is the
 * first nslen bytes of key).  Returns 0, or a negative code. */
static int tally(encache_store *st, encache_namespace_count *t, size_t *n,
                 const char *key, size_t nslen, uint64_t len) {
  size_t i = *n;
  if (i > 0 && strlen(t[i - 1].ns) == nslen &&
      memcmp(t[i - 1].ns, key, nslen) == 0)
    i--; /* listed sorted: most keys are the previous key's namespace's */
  else
    for (i = 0; i < *n; i++)
      if (strlen(t[i].ns) == nslen && memcmp(t[i].ns, key, nslen) == 0)
        break;
  if (i == *n) {
    if (*n == NAMESPACES_MAX)
      return encache_store_fail(st, ENCACHE_ETOOLARGE,
                                "more than %d namespaces in the Store",
                                NAMESPACES_MAX);
    char *ns = encache__malloc(nslen + 1);
    if (ns == NULL)
      return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
    memcpy(ns, key, nslen);
    ns[nslen] = '\0';
    t[i] = (encache_namespace_count){sizeof(*t), ns, 0, 0};
    (*n)++;
  }
  t[i].objects++;
  t[i].bytes += len;
  return 0;
}

static int count_cmp(const void *x, const void *y) {
  return strcmp(((const encache_namespace_count *)x)->ns,
                ((const encache_namespace_count *)y)->ns);
}

int encache_store_namespaces(encache_store *st,
                             int (*cb)(const encache_namespace_count *c,
                                       void *arg),
                             void *arg) {
  if (st == NULL || cb == NULL)
    return ENCACHE_EINVAL;
  if (!(st->ops->caps & ENCACHE_STORE_CAP_LIST) &&
      strcmp(st->ops->kind, "mooncake") == 0)
    return encache_store_fail(
        st, ENCACHE_EINVAL,
        "Mooncake's C ABI (store_c.h) has no call that lists or counts "
        "keys, so a Mooncake Store's namespaces cannot be listed "
        "(docs/compatibility.md)");
  if (!(st->ops->caps & ENCACHE_STORE_CAP_LIST))
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "the %s Store cannot list its keys, so it "
                              "cannot list its namespaces", st->ops->kind);
  prefix_acc a;
  int rc = list_prefix(st, "", &a);
  encache_namespace_count *t =
      rc == 0 ? encache__malloc(NAMESPACES_MAX * sizeof(*t)) : NULL;
  if (rc == 0 && t == NULL)
    rc = encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  size_t n = 0;
  for (size_t i = 0; rc == 0 && i < a.n; i++)
    rc = tally(st, t, &n, a.items[i].key, namespace_len(a.items[i].key),
               a.items[i].len);
  acc_free(&a);
  if (rc == 0 && n > 1)
    qsort(t, n, sizeof(*t), count_cmp);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    int stop = cb(&t[i], arg);
    if (stop != 0)
      rc = stop;
  }
  for (size_t i = 0; i < n; i++)
    encache__free((char *)t[i].ns);
  encache__free(t);
  return rc == 0 ? (int)n : rc;
}
