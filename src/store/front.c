/* SPDX-License-Identifier: Apache-2.0 */
/*
 * front.c: the one door to every Store: the scheme table (built-in and
 * registered backends), handles of users' backends, and the public
 * encache_store_* functions, which check arguments once and forward to
 * the backend.  It stands on the backends (backends.h: their open
 * functions, nothing else) and on the core (base.h: messages, checks,
 * profiles), which no backend sees past.
 */
#include "backends.h"
#include "base.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A copy of url as shown: user kept, password never. */
static char *redact_url(const char *url) {
  int len = encache_store_url_redact(url, NULL, 0);
  char *s = len < 0 ? NULL : encache__malloc((size_t)len + 1);
  if (s != NULL && encache_store_url_redact(url, s, (size_t)len + 1) != len) {
    encache__free(s);
    s = NULL;
  }
  return s;
}

/* ---------------------------------------------------------------- schemes */

/* The built-in schemes, then the registered ones: one table that every
 * open goes through. */
typedef struct scheme {
  char name[32];
  encache_store_open_fn open;
  void *arg;
} scheme;

static int open_shm(const char *url, void *arg, encache_store **out) {
  (void)arg;
  return encache__shm_open(url, out);
}
static int open_redis(const char *url, void *arg, encache_store **out) {
  (void)arg;
  return encache__redis_open(url, out);
}
static int open_mooncake(const char *url, void *arg, encache_store **out) {
  (void)arg;
  return encache__mooncake_open(url, out);
}
static int open_tier(const char *url, void *arg, encache_store **out) {
  (void)arg;
  return encache__tier_open(url, out);
}

enum { BUILTIN_SCHEMES = 6, MAX_SCHEMES = BUILTIN_SCHEMES + 16 };
static scheme schemes[MAX_SCHEMES] = {
    {"shm", open_shm, NULL},
    {"redis", open_redis, NULL},
    {"redis-cluster", open_redis, NULL},
    {"unix", open_redis, NULL},
    {"mooncake", open_mooncake, NULL},
    {"tier", open_tier, NULL}};
static size_t nschemes = BUILTIN_SCHEMES; /* atomic: read without mu */
static pthread_mutex_t schemes_mu = PTHREAD_MUTEX_INITIALIZER;

/* The entry whose name is the URL's scheme (before "://" or ":"). */
static const scheme *find_scheme(const char *url) {
  size_t n = __atomic_load_n(&nschemes, __ATOMIC_ACQUIRE);
  size_t len = strcspn(url, ":");
  if (url[len] != ':')
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (strlen(schemes[i].name) == len &&
        strncmp(schemes[i].name, url, len) == 0)
      return &schemes[i];
  return NULL;
}

int encache_store_register(const char *name, encache_store_open_fn open,
                           void *arg) {
  if (name == NULL || open == NULL)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "encache_store_register: NULL scheme or open");
  size_t len = strlen(name);
  if (len == 0 || len >= sizeof(schemes[0].name) ||
      strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   "0123456789+-.") != len)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "\"%.40s\": not a URL scheme (1 to 31 letters, "
                              "digits, '+', '-', '.')", name);
  pthread_mutex_lock(&schemes_mu);
  char probe[40];
  snprintf(probe, sizeof(probe), "%s:", name);
  int rc = 0;
  if (find_scheme(probe) != NULL) {
    rc = encache_store_fail(NULL, ENCACHE_EEXIST,
                            "the Store scheme %s: is already taken", name);
  } else if (nschemes == MAX_SCHEMES) {
    rc = encache_store_fail(NULL, ENCACHE_ENOBUFS,
                            "cannot register %s: %d schemes at most", name,
                            MAX_SCHEMES - BUILTIN_SCHEMES);
  } else {
    scheme *e = &schemes[nschemes];
    memcpy(e->name, name, len + 1);
    e->open = open;
    e->arg = arg;
    __atomic_store_n(&nschemes, nschemes + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&schemes_mu);
  return rc;
}

int encache_store_open(const char *url, encache_store **out) {
  if (out == NULL)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "encache_store_open: out is NULL");
  *out = NULL;
  if (url == NULL) {
    url = getenv("ENCACHE_STORE");
    if (url == NULL || url[0] == '\0')
      url = ENCACHE_DEFAULT_STORE;
  } else if (url[0] == '\0') {
    /* Never the default in disguise: it would create a 1 GiB segment. */
    return encache_store_fail(NULL, ENCACHE_EURL,
                              "empty Store URL: give one (shm://NAME?size=..., "
                              "redis://host:port, redis-cluster://..., "
                              "unix:///path, mooncake:) or none for the "
                              "default (%s)", ENCACHE_DEFAULT_STORE);
  }
  const scheme *e = find_scheme(url);
  if (e == NULL) {
    char shown[256];
    if (encache_store_url_redact(url, shown, sizeof(shown)) < 0)
      snprintf(shown, sizeof(shown), "%.*s...", (int)strcspn(url, ":"), url);
    return encache_store_fail(NULL, ENCACHE_EURL,
                              "%s: unknown Store URL scheme (known: shm://, "
                              "redis://, redis-cluster://, unix://, mooncake:, "
                              "and those registered)", shown);
  }
  encache_store *st = NULL;
  int rc = e->open(url, e->arg, &st);
  if (rc < 0 && st != NULL) {
    /* No handle on failure: its message becomes the open's. */
    char msg[ENCACHE__STORE_MSG_MAX];
    snprintf(msg, sizeof(msg), "%s", encache_store_errmsg(st));
    encache_store_close(st);
    encache_store_fail(NULL, rc, "%s", msg);
    st = NULL;
  } else if (rc < 0) {
    encache__store_msg_unscope();
  } else if (rc >= 0) {
    ENCACHE_ASSERT(st != NULL && encache__backend_check(st->ops) == 0);
  }
  *out = st;
  return rc < 0 ? rc : 0;
}

void encache_store_close(encache_store *st) {
  if (st != NULL)
    st->ops->close(st);
}

/* ---------------------------------------------------------------- leases */

static int lease_args(encache_store *st, const char *key, uint64_t token) {
  if (st == NULL || key == NULL || key[0] == '\0' || token == 0)
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "a lease needs a Store, a key and a token");
  if (!ENCACHE__BACKEND_HAS(st->ops, lease_take) ||
      !ENCACHE__BACKEND_HAS(st->ops, lease_drop))
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "the %s Store has no leases", st->ops->kind);
  return 0;
}

int encache_store_lease_take(encache_store *st, const char *key,
                             uint64_t token, uint32_t ttl_ms) {
  int rc = lease_args(st, key, token);
  if (rc == 0 && ttl_ms == 0)
    rc = encache_store_fail(st, ENCACHE_EINVAL, "a lease's ttl is 0 ms");
  return rc < 0 ? rc : st->ops->lease_take(st, key, token, ttl_ms);
}

int encache_store_lease_drop(encache_store *st, const char *key,
                             uint64_t token) {
  int rc = lease_args(st, key, token);
  return rc < 0 ? rc : st->ops->lease_drop(st, key, token);
}

/* --------------------------------------------------------- your own Store */

int encache_store_new(const encache_store_backend *b, void *data,
                      const char *url, encache_store **out) {
  if (out == NULL)
    return encache_store_fail(NULL, ENCACHE_EINVAL,
                              "encache_store_new: out is NULL");
  *out = NULL;
  int rc = encache__backend_check(b);
  if (rc < 0)
    return rc;
  encache_store *st = encache__calloc(1, sizeof(*st));
  if (st != NULL)
    st->url = redact_url(url ? url : b->kind);
  if (st == NULL || st->url == NULL) {
    encache__free(st);
    return encache_store_fail(NULL, ENCACHE_ENOMEM,
                              "out of memory making a %s Store handle",
                              b->kind);
  }
  st->ops = b;
  st->data = data;
  encache__store_profile_set(st);
  *out = st;
  return 0;
}

void encache_store_free(encache_store *st) {
  if (st != NULL) {
    encache__free(st->url);
    encache__free(st);
  }
}

void *encache_store_data(const encache_store *st) {
  return st != NULL ? st->data : NULL;
}

unsigned encache_store_caps_of(const encache_store *st) {
  return st != NULL ? st->ops->caps : 0;
}

/* ------------------------------------------------------------- operations */

const char *encache_store_url(const encache_store *st) {
  return st != NULL && st->url != NULL ? st->url : "";
}

int encache_store_exists(encache_store *st, const char *const *keys, size_t n,
                         int *results) {
  if (st == NULL || (n > 0 && (keys == NULL || results == NULL)))
    return ENCACHE_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (keys[i] == NULL)
      return encache_store_fail(st, ENCACHE_EINVAL, "key %zu is NULL", i);
  return n == 0 ? 0 : st->ops->exists(st, keys, n, results);
}

int encache_store_read(encache_store *st, const char *const *keys, size_t n,
                       void *const *bufs, const size_t *caps,
                       int64_t *results) {
  if (st == NULL ||
      (n > 0 && (keys == NULL || bufs == NULL || caps == NULL ||
                 results == NULL)))
    return ENCACHE_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (keys[i] == NULL || (bufs[i] == NULL && caps[i] != 0))
      return encache_store_fail(st, ENCACHE_EINVAL,
                                "item %zu: NULL key or buffer", i);
  return n == 0 ? 0 : st->ops->read(st, keys, n, bufs, caps, results);
}

int encache_store_object_size(encache_store *st, const char *key,
                              uint64_t *len) {
  if (st == NULL || key == NULL || len == NULL)
    return ENCACHE_EINVAL;
  return st->ops->object_size(st, key, len);
}

int encache_store_write(encache_store *st, const char *key, const void *hdr,
                        size_t hdr_len, const void *payload, size_t len) {
  if (st == NULL || key == NULL || (hdr == NULL && hdr_len != 0) ||
      (payload == NULL && len != 0))
    return ENCACHE_EINVAL;
  if (hdr_len > SIZE_MAX - len)
    return ENCACHE_ETOOLARGE;
  return st->ops->write(st, key, hdr, hdr_len, payload, len);
}

int encache_store_remove(encache_store *st, const char *key) {
  if (st == NULL || key == NULL)
    return ENCACHE_EINVAL;
  return st->ops->remove(st, key);
}

int encache_store_list(encache_store *st, const char *pattern,
                       int (*cb)(const char *key, uint64_t len, void *arg),
                       void *arg) {
  if (st == NULL || cb == NULL)
    return ENCACHE_EINVAL;
  if (!(st->ops->caps & ENCACHE_STORE_CAP_LIST))
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "the %s Store cannot list its keys",
                              st->ops->kind);
  return st->ops->list(st, pattern, cb, arg);
}

int encache_store_set_list_timeout(encache_store *st, uint32_t timeout_ms) {
  if (st == NULL)
    return ENCACHE_EINVAL;
  __atomic_store_n(&st->list_timeout_ms, timeout_ms, __ATOMIC_RELAXED);
  /* A Store of Stores (the tier) walks its tiers' handles. */
  encache__store_control(st, ENCACHE__CONTROL_LIST_TIMEOUT, &timeout_ms);
  return 0;
}

int encache_store_stats_get(encache_store *st, encache_store_stats *stats) {
  if (st == NULL || stats == NULL)
    return ENCACHE_EINVAL;
  encache_store_stats full;
  memset(&full, 0xff, sizeof(full));
  full.size = sizeof(full);
  full.kind = st->ops->kind;
  int rc = st->ops->stats(st, &full);
  if (rc < 0)
    return rc;
  rc = encache__struct_out(stats, &full, sizeof(full),
                           offsetof(encache_store_stats, tier_local_hits));
  return rc < 0 ? encache_store_fail(st, rc, "encache_store_stats: size %zu "
                                     "is not a struct's size (API 1.0's is "
                                     "%zu; set it)", stats->size,
                                     offsetof(encache_store_stats,
                                              tier_local_hits))
                : 0;
}
