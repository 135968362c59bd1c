/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.c: the tiered Store: a host-local shm tier in front of a
 * distributed one (the "remote" tier: Redis, Redis Cluster, Mooncake, any
 * Store the library opens).  docs/stores.md, "Two tiers", is the user's
 * view; the rules:
 *
 *   - Lookups (exists, read, read_split, object_size) ask the local tier
 *     first and the remote tier, in one batch, only for the items the
 *     local one did not have (absent, or a recoverable local error; an
 *     empty object, a length of 0, is a local hit).  A
 *     remote failure touches only those items: local hits stay hits.
 *   - A remote hit is delivered, and a copy is queued for promotion into
 *     the local tier (tier_promote.c: bounded, best-effort, counted).
 *   - A write goes to the remote tier, then to the local one only when
 *     the remote wrote it or failed recoverably (never when the remote
 *     had the key: this host then serves the remote's object, promoted on
 *     its next remote hit), each never replacing an object.  Its answer
 *     is the remote's (the tier shared by the fleet): written when the
 *     remote wrote it, ENCACHE_EEXIST when the remote had it, the remote's
 *     error otherwise, whatever the local tier said (a local copy is a
 *     cache), except an unconfirmed local answer, which is returned as it
 *     is.
 *   - remove and remove_prefix act on the remote tier first, then bump
 *     the local segment's purge epoch (kept in the segment, shared by
 *     every process of the host), then act on the local tier.  Every
 *     promotion and every local copy of a publication is written at the
 *     epoch noted before the remote was asked, and the segment refuses it
 *     once the epoch moved (tier_promote.c): so an object removed through
 *     any tier of the host never comes back into its local tier from a
 *     read made before the removal, in any process.  list lists both,
 *     each key once; leases are the remote's (the tier every host
 *     shares).
 *
 * Every error returned carries a message naming the tier it came from.
 * Counters (tier_counts) are this handle's, read through stats.
 *
 * About 600 lines, on purpose: every operation of the composite, each
 * read against the rules above; its URL (tier_open.c) and its promotion
 * queue (tier_promote.c) are apart.
 */
#include "tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TIER(st) ((tier_store *)(st))

static void count(uint64_t *c, uint64_t k) {
  __atomic_add_fetch(c, k, __ATOMIC_RELAXED);
}

/* Returns rc with message m of the inner Store that answered it. */
static int relay_msg(tier_store *t, encache_store *inner, int rc,
                     const char *m) {
  char msg[512];
  snprintf(msg, sizeof(msg), "%s", m[0] ? m : encache_strerror(rc));
  return encache_store_fail(&t->base, rc, "%s tier: %s",
                            inner == t->local ? "local" : "remote", msg);
}

/* The same with the inner Store's latest message.  It lives in the
 * thread's message buffer, which encache_store_fail() writes (relay_msg
 * copies it out first), and which a later call on the other tier
 * replaces: a caller that asks that tier first keeps it (kept_msg). */
static int relay(tier_store *t, encache_store *inner, int rc) {
  return relay_msg(t, inner, rc, encache_store_errmsg(inner));
}

static void kept_msg(encache_store *inner, char *buf, size_t size) {
  snprintf(buf, size, "%s", encache_store_errmsg(inner));
}

/* Whether a local read or object_size answer leaves the item to the
 * remote tier: absent, or a recoverable local failure (a length of 0 is
 * an empty object: a hit). */
static int ask_remote(int64_t r) {
  int cls = encache_store_classify(r);
  return cls == ENCACHE_ANSWER_ABSENT || cls == ENCACHE_ANSWER_RECOVERABLE;
}

/* The same for a local exists answer, where 0 means absent. */
static int exists_ask_remote(int r) { return r == 0 || ask_remote(r); }

/* ------------------------------------------------------------- lookups */

/* A batch read, plain (heads NULL) or split. */
typedef struct rd {
  const char *const *keys;
  size_t n, split;
  void *const *heads, *const *bufs;
  const size_t *caps;
  int64_t *res;
} rd;

static int rd_call(encache_store *s, const rd *r) {
  return r->heads != NULL
             ? s->ops->read_split(s, r->keys, r->n, r->split, r->heads,
                                  r->bufs, r->caps, r->res)
             : s->ops->read(s, r->keys, r->n, r->bufs, r->caps, r->res);
}

/* The remote's answers to r: hits counted and promoted (unless
 * `unchecked`: the read served an object without its check), errors
 * counted (and their message made the tier's). */
static void remote_answered(tier_store *t, const rd *r, uint64_t gen,
                            int unchecked) {
  uint64_t hits = 0, errors = 0;
  for (size_t i = 0; i < r->n; i++) {
    int64_t v = r->res[i];
    int cls = encache_store_classify(v);
    if (cls == ENCACHE_ANSWER_OK) {
      hits++;
      size_t len = (size_t)v, h = r->heads ? (len < r->split ? len : r->split)
                                           : len;
      if (unchecked)
        count(&t->n.promo_dropped, 1);
      else
        encache__tier_promote(t, gen, r->keys[i],
                              r->heads ? r->heads[i] : r->bufs[i], h,
                              r->bufs[i], len - h);
    } else if (cls == ENCACHE_ANSWER_RECOVERABLE ||
               cls == ENCACHE_ANSWER_UNCONFIRMED) {
      errors++;
    }
  }
  count(&t->n.remote_hits, hits);
  if (hits > 0)
    encache__tier_promote_kick(t);
  if (errors > 0) {
    count(&t->n.remote_errors, errors);
    relay(t, t->remote, ENCACHE_EUNAVAIL);
  }
}

/* The items of a batch the local tier left to the remote one, as a
 * sub-batch of their own (one allocation, freed with encache__free(idx)). */
typedef struct sub {
  size_t *idx;
  rd r;
} sub;

static int sub_make(const rd *r, size_t m, sub *s) {
  size_t per = sizeof(size_t) + sizeof(char *) + 2 * sizeof(void *) +
               sizeof(size_t) + sizeof(int64_t);
  unsigned char *blk = encache__calloc(m, per);
  if (blk == NULL)
    return ENCACHE_ENOMEM;
  s->idx = (size_t *)(void *)blk;
  int64_t *res = (int64_t *)(void *)(s->idx + m);
  size_t *caps = (size_t *)(void *)(res + m);
  const char **keys = (const char **)(void *)(caps + m);
  void **heads = (void **)(keys + m), **bufs = heads + m;
  size_t j = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (!ask_remote(r->res[i]))
      continue;
    s->idx[j] = i;
    keys[j] = r->keys[i];
    heads[j] = r->heads ? r->heads[i] : NULL;
    bufs[j] = r->bufs[i];
    caps[j] = r->caps[i];
    j++;
  }
  s->r = (rd){keys, m, r->split, r->heads ? heads : NULL, bufs, caps, res};
  return 0;
}

uint64_t encache__tier_remote_unchecked(tier_store *t) {
  uint64_t n = 0;
  if (encache__store_control(t->remote, ENCACHE__CONTROL_UNCHECKED, &n) != 0)
    return 0;
  return n;
}

/* A remote read that served an object without its check (the remote's
 * count moved: this read's, or another thread's at the same time) promotes
 * none of its hits: in the local segment such an object would get a sum
 * of its own and be served as checked, on this host, by every process.
 * It stays a remote hit, counted as one without a check each time
 * (hits_unchecked), until it is written again with its check. */
static int rd_remote(tier_store *t, const rd *r, int *unchecked) {
  uint64_t before = encache__tier_remote_unchecked(t);
  int rc = rd_call(t->remote, r);
  *unchecked = encache__tier_remote_unchecked(t) != before;
  return rc;
}

/* Reads the items of r the local tier did not have (m of them) from the
 * remote tier, in one batch. */
static int read_remote(tier_store *t, const rd *r, size_t m) {
  int rc, unchecked;
  /* A removal after this point (in any process of the host) makes what
   * the remote answers stale for promotion (tier_promote.c). */
  uint64_t gen = encache__tier_epoch(t);
  if (m == r->n) { /* nothing local: the remote answers as it would alone */
    if ((rc = rd_remote(t, r, &unchecked)) < 0) {
      count(&t->n.remote_errors, r->n);
      return relay(t, t->remote, rc);
    }
    remote_answered(t, r, gen, unchecked);
    return 0;
  }
  sub s;
  if ((rc = sub_make(r, m, &s)) < 0) {
    for (size_t i = 0; i < r->n; i++)
      if (ask_remote(r->res[i]))
        r->res[i] = rc;
    encache_store_fail(&t->base, rc, "tier: out of memory asking the remote "
                       "tier for %zu items", m);
    return 0;
  }
  rc = rd_remote(t, &s.r, &unchecked);
  for (size_t j = 0; j < m; j++)
    r->res[s.idx[j]] = rc < 0 ? rc : s.r.res[j];
  if (rc < 0) {
    /* Only the items the local tier lacked fail; its hits stand. */
    count(&t->n.remote_errors, m);
    relay(t, t->remote, rc);
  } else {
    remote_answered(t, &s.r, gen, unchecked);
  }
  encache__free(s.idx);
  return 0;
}

static int lookup(tier_store *t, const rd *r) {
  int rc = rd_call(t->local, r);
  if (rc < 0 && encache_store_classify(rc) == ENCACHE_ANSWER_UNCONFIRMED)
    return relay(t, t->local, rc);
  size_t m = 0, hits = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (rc < 0) /* the whole local batch failed: all to the remote */
      r->res[i] = rc;
    m += ask_remote(r->res[i]) != 0;
    hits += r->res[i] >= 0;
  }
  count(&t->n.local_hits, hits);
  return m == 0 ? 0 : read_remote(t, r, m);
}

static int tier_read(encache_store *st, const char *const *keys, size_t n,
                     void *const *bufs, const size_t *caps, int64_t *results) {
  rd r = {keys, n, 0, NULL, bufs, caps, results};
  return lookup(TIER(st), &r);
}

static int tier_read_split(encache_store *st, const char *const *keys,
                           size_t n, size_t split, void *const *heads,
                           void *const *bufs, const size_t *caps,
                           int64_t *results) {
  rd r = {keys, n, split, heads, bufs, caps, results};
  return lookup(TIER(st), &r);
}

static int tier_exists(encache_store *st, const char *const *keys, size_t n,
                       int *results) {
  tier_store *t = TIER(st);
  int rc = t->local->ops->exists(t->local, keys, n, results);
  if (rc < 0 && encache_store_classify(rc) == ENCACHE_ANSWER_UNCONFIRMED)
    return relay(t, t->local, rc);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (rc < 0)
      results[i] = rc;
    m += exists_ask_remote(results[i]) != 0;
  }
  if (m == 0)
    return 0;
  size_t *idx = encache__calloc(m, sizeof(size_t) + sizeof(char *) + sizeof(int));
  if (idx == NULL) {
    for (size_t i = 0; i < n; i++)
      if (exists_ask_remote(results[i]))
        results[i] = ENCACHE_ENOMEM;
    return m == n ? encache_store_fail(st, ENCACHE_ENOMEM, "tier: out of "
                                       "memory asking the remote tier")
                  : 0;
  }
  const char **sk = (const char **)(void *)(idx + m);
  int *sr = (int *)(void *)(sk + m);
  for (size_t i = 0, j = 0; i < n; i++)
    if (exists_ask_remote(results[i])) {
      idx[j] = i;
      sk[j++] = keys[i];
    }
  rc = t->remote->ops->exists(t->remote, sk, m, sr);
  uint64_t errors = 0;
  for (size_t j = 0; j < m; j++) {
    results[idx[j]] = rc < 0 ? rc : sr[j];
    int cls = encache_store_classify(results[idx[j]]);
    errors += cls == ENCACHE_ANSWER_RECOVERABLE ||
              cls == ENCACHE_ANSWER_UNCONFIRMED;
  }
  encache__free(idx);
  if (errors > 0) {
    count(&t->n.remote_errors, errors);
    relay(t, t->remote, rc < 0 ? rc : ENCACHE_EUNAVAIL);
  }
  /* A failed batch fails the call only when no item was answered here. */
  return rc < 0 && m == n ? rc : 0;
}

static int tier_object_size(encache_store *st, const char *key, uint64_t *len) {
  tier_store *t = TIER(st);
  int rc = t->local->ops->object_size(t->local, key, len);
  if (!ask_remote(rc))
    return rc < 0 ? relay(t, t->local, rc) : rc;
  rc = t->remote->ops->object_size(t->remote, key, len);
  return rc < 0 ? relay(t, t->remote, rc) : rc;
}

/* ------------------------------------------------------ writes, removal */

/* The remote first: the local tier gets the object only when the remote
 * wrote it, or failed recoverably (certainly not written: this host's
 * copy serves this host meanwhile).  When the remote already had the key
 * (EEXIST) the local tier is left alone: the remote's object, the one the
 * fleet serves, is promoted on this host's next remote hit, so the two
 * tiers never hold different objects for a key written through here.  The
 * local copy is written at the purge epoch of before the remote write: a
 * removal in between (which may have removed the remote's) refuses it. */
static int tier_write(encache_store *st, const char *key, const void *hdr,
                      size_t hdr_len, const void *payload, size_t len) {
  tier_store *t = TIER(st);
  uint64_t epoch = encache__tier_epoch(t);
  int rc = t->remote->ops->write(t->remote, key, hdr, hdr_len, payload, len);
  int cls = encache_store_classify(rc);
  if (cls == ENCACHE_ANSWER_RECOVERABLE || cls == ENCACHE_ANSWER_UNCONFIRMED)
    count(&t->n.remote_errors, 1);
  if (cls == ENCACHE_ANSWER_OK || cls == ENCACHE_ANSWER_RECOVERABLE) {
    encache__epoch_write w = {epoch, key, hdr, hdr_len, payload, len};
    int lrc =
        encache__store_control(t->local, ENCACHE__CONTROL_WRITE_AT_EPOCH, &w);
    if (encache_store_classify(lrc) == ENCACHE_ANSWER_UNCONFIRMED)
      return relay(t, t->local, lrc); /* the caller's buffer may be in use */
  }
  return rc < 0 ? relay(t, t->remote, rc) : rc;
}

/* Between a removal from the remote tier and the one from the local tier:
 * bumps the segment's purge epoch (refusing, in every process of the
 * host, the promotions read before it: tier_promote.c) and drops this
 * handle's queued promotions of what is removed.  0, or the local tier's
 * error with its message (its removal cannot succeed either). */
static int purge_epoch_bump(tier_store *t, const char *what, int prefix) {
  uint64_t epoch;
  int rc = encache__store_control(t->local, ENCACHE__CONTROL_PURGE_EPOCH_BUMP,
                                  &epoch);
  if (rc == 0)
    encache__tier_promote_forget(t, what, prefix, epoch);
  return rc;
}

static int tier_remove(encache_store *st, const char *key) {
  tier_store *t = TIER(st);
  char rmsg[512];
  int rrc = t->remote->ops->remove(t->remote, key); /* the remote first */
  kept_msg(t->remote, rmsg, sizeof(rmsg));
  int lrc = purge_epoch_bump(t, key, 0);
  if (lrc == 0)
    lrc = t->local->ops->remove(t->local, key);
  int la = encache_store_classify(lrc), ra = encache_store_classify(rrc);
  if (ra != ENCACHE_ANSWER_OK && ra != ENCACHE_ANSWER_ABSENT)
    return relay_msg(t, t->remote, rrc, rmsg);
  if (la != ENCACHE_ANSWER_OK && la != ENCACHE_ANSWER_ABSENT)
    return relay(t, t->local, lrc);
  if (la == ENCACHE_ANSWER_ABSENT && ra == ENCACHE_ANSWER_ABSENT)
    return encache_store_fail(st, ENCACHE_ENOENT, "%s: no such key in either "
                              "tier", t->base.url);
  return 0;
}

static int tier_remove_prefix(encache_store *st, const char *prefix,
                              uint64_t *removed) {
  tier_store *t = TIER(st);
  uint64_t l = 0, r = 0;
  char rmsg[512];
  int rrc = encache_store_remove_prefix(t->remote, prefix, &r); /* first */
  kept_msg(t->remote, rmsg, sizeof(rmsg));
  int lrc = purge_epoch_bump(t, prefix, 1);
  if (lrc == 0)
    lrc = encache_store_remove_prefix(t->local, prefix, &l);
  /* Every object is in the remote tier, and in the local one when cached
   * there: the larger count is the number of distinct objects removed. */
  *removed = l > r ? l : r;
  if (rrc < 0)
    return relay_msg(t, t->remote, rrc, rmsg);
  return lrc < 0 ? relay(t, t->local, lrc) : 0;
}

/* --------------------------------------------------------------- list */

/* The remote's keys, as listed, so that the local tier's copies of them
 * are not listed twice (a copy of every key that matches: listing is an
 * operator's tool, not an encoder's path). */
typedef struct seen {
  char **keys;
  size_t n, cap;
  int (*cb)(const char *key, uint64_t len, void *arg);
  void *arg;
  int oom;
} seen;

static int seen_remote(const char *key, uint64_t len, void *arg) {
  seen *s = arg;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    char **k = encache__realloc(s->keys, cap * sizeof(*k));
    if (k == NULL)
      return s->oom = ENCACHE_ENOMEM;
    s->keys = k;
    s->cap = cap;
  }
  if ((s->keys[s->n] = encache__strdup(key)) == NULL)
    return s->oom = ENCACHE_ENOMEM;
  s->n++;
  return s->cb(key, len, s->arg);
}

static int key_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int seen_local(const char *key, uint64_t len, void *arg) {
  seen *s = arg;
  if (s->n > 0 && bsearch(&key, s->keys, s->n, sizeof(char *), key_cmp))
    return 0;
  return s->cb(key, len, s->arg);
}

static int tier_list(encache_store *st, const char *pattern,
                     int (*cb)(const char *key, uint64_t len, void *arg),
                     void *arg) {
  tier_store *t = TIER(st);
  seen s = {NULL, 0, 0, cb, arg, 0};
  int rc = t->remote->ops->list(t->remote, pattern, seen_remote, &s);
  if (s.oom)
    rc = encache_store_fail(st, s.oom, "tier: out of memory listing");
  else if (rc < 0)
    rc = relay(t, t->remote, rc);
  if (rc == 0) {
    if (s.n > 0)
      qsort(s.keys, s.n, sizeof(char *), key_cmp);
    rc = t->local->ops->list(t->local, pattern, seen_local, &s);
    if (rc < 0)
      rc = relay(t, t->local, rc);
  }
  for (size_t i = 0; i < s.n; i++)
    encache__free(s.keys[i]);
  encache__free(s.keys);
  return rc;
}

/* ----------------------------------------- registration, leases, stats */

static int tier_register(encache_store *st, void *buf, size_t len) {
  tier_store *t = TIER(st);
  encache_store *s[2] = {t->local, t->remote};
  for (int i = 0; i < 2; i++) {
    if (!encache__store_profile_of(s[i])->registered)
      continue;
    int rc = s[i]->ops->register_buffer(s[i], buf, len);
    if (rc < 0) {
      rc = relay(t, s[i], rc);
      if (i == 1 && encache__store_profile_of(s[0])->registered &&
          s[0]->ops->unregister_buffer(s[0], buf) < 0)
        return encache_store_fail(st, ENCACHE_EUNCONFIRMED, "tier: the "
                                  "local tier kept a registration");
      return rc;
    }
  }
  return 0;
}

static int tier_unregister(encache_store *st, void *buf) {
  tier_store *t = TIER(st);
  encache_store *s[2] = {t->local, t->remote};
  int rc = 0;
  for (int i = 0; i < 2; i++)
    if (encache__store_profile_of(s[i])->registered) {
      int r = s[i]->ops->unregister_buffer(s[i], buf);
      if (r < 0 && rc == 0)
        rc = relay(t, s[i], r);
    }
  return rc;
}

static int tier_lease_take(encache_store *st, const char *key, uint64_t token,
                           uint32_t ttl_ms) {
  tier_store *t = TIER(st);
  int rc = t->remote->ops->lease_take(t->remote, key, token, ttl_ms);
  return rc < 0 ? relay(t, t->remote, rc) : rc;
}

static int tier_lease_drop(encache_store *st, const char *key,
                           uint64_t token) {
  tier_store *t = TIER(st);
  int rc = t->remote->ops->lease_drop(t->remote, key, token);
  return rc < 0 ? relay(t, t->remote, rc) : rc;
}

/* The local tier's counters (this host's), and the tier's own. */
static int tier_stats(encache_store *st, encache_store_stats *out) {
  tier_store *t = TIER(st);
  int rc = t->local->ops->stats(t->local, out);
  if (rc < 0)
    return relay(t, t->local, rc);
  out->kind = "tier";
#define LOAD(f) __atomic_load_n(&t->n.f, __ATOMIC_RELAXED)
  out->tier_local_hits = LOAD(local_hits);
  out->tier_remote_hits = LOAD(remote_hits);
  out->tier_remote_errors = LOAD(remote_errors);
  out->tier_promotions_queued = LOAD(promo_queued);
  out->tier_promotions_done = LOAD(promo_done);
  out->tier_promotions_dropped = LOAD(promo_dropped);
#undef LOAD
  return 0;
}

/* The built-in requests a tier passes on to its tiers (base.h): a list
 * timeout, to both (a listing walks both; a removal by prefix too); the
 * count of objects served without a check, the remote's (the local
 * segment's objects have their sums). */
static int tier_control(encache_store *st, int op, void *arg) {
  tier_store *t = TIER(st);
  if (op == ENCACHE__CONTROL_UNCHECKED)
    return encache__store_control(t->remote, op, arg);
  if (op != ENCACHE__CONTROL_LIST_TIMEOUT)
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  if (arg != NULL) {
    encache_store_set_list_timeout(t->local, *(const uint32_t *)arg);
    encache_store_set_list_timeout(t->remote, *(const uint32_t *)arg);
  }
  return 0;
}

/* ------------------------------------------------------------ the handle */

static void tier_close(encache_store *st) {
  tier_store *t = TIER(st);
  encache__tier_promote_stop(t); /* writes what was queued */
  encache_store_close(t->local);
  encache_store_close(t->remote);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  pthread_cond_destroy(&t->idle);
  encache__free(t->fbuf);
  encache__free(t->base.url);
  encache__free(t);
}

static const encache_store_backend tier_template = {
    .size = sizeof(encache_store_backend),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "tier",
    .exists = tier_exists,
    .read = tier_read,
    .read_split = tier_read_split,
    .object_size = tier_object_size,
    .write = tier_write,
    .remove = tier_remove,
    .register_buffer = tier_register,
    .unregister_buffer = tier_unregister,
    .list = tier_list,
    .stats = tier_stats,
    .close = tier_close,
    .remove_prefix = tier_remove_prefix,
    .lease_take = tier_lease_take,
    .lease_drop = tier_lease_drop,
    .control = tier_control};

/* This handle's table: what both tiers allow (docs/stores.md). */
static void make_ops(tier_store *t) {
  unsigned l = t->local->ops->caps, r = t->remote->ops->caps;
  encache_store_backend *o = &t->ops;
  *o = tier_template;
  o->caps = ENCACHE_STORE_CAP_SHARED | ((l & r) & (ENCACHE_STORE_CAP_READ_SPLIT |
                                                   ENCACHE_STORE_CAP_LIST |
                                                   ENCACHE_STORE_CAP_PUT_IF_ABSENT));
  o->caps |= (l | r) & ENCACHE_STORE_CAP_REGISTER;
  o->caps |= r & ENCACHE_STORE_CAP_BUSY_WAIT; /* its writes are the remote's */
  o->caps |= r & ENCACHE_STORE_CAP_LEASE;
  if ((l & ENCACHE_STORE_CAP_LIST) &&
      (r & (ENCACHE_STORE_CAP_LIST | ENCACHE_STORE_CAP_REMOVE_PREFIX)))
    o->caps |= ENCACHE_STORE_CAP_REMOVE_PREFIX;
  if (!(o->caps & ENCACHE_STORE_CAP_READ_SPLIT))
    o->read_split = NULL;
  if (!(o->caps & ENCACHE_STORE_CAP_REGISTER))
    o->register_buffer = NULL, o->unregister_buffer = NULL;
  if (!(o->caps & ENCACHE_STORE_CAP_LIST))
    o->list = NULL;
  if (!(o->caps & ENCACHE_STORE_CAP_REMOVE_PREFIX))
    o->remove_prefix = NULL;
  if (!(o->caps & ENCACHE_STORE_CAP_LEASE))
    o->lease_take = NULL, o->lease_drop = NULL;
}

int encache__tier_wrap(encache_store *local, encache_store *remote,
                       const char *shown, size_t max_items,
                       uint64_t max_bytes, encache_store **out) {
  *out = NULL;
  tier_store *t = encache__calloc(1, sizeof(*t));
  char *url = encache__strdup(shown);
  if (t == NULL || url == NULL) {
    encache__free(t);
    encache__free(url);
    encache_store_close(local);
    encache_store_close(remote);
    return encache_store_fail(NULL, ENCACHE_ENOMEM, "tier: out of memory "
                              "making the handle");
  }
  /* The purge epoch that keeps removals removed lives in the local
   * segment (tier_promote.c): the local tier is shm. */
  if (encache__store_control(local, ENCACHE__CONTROL_PURGE_EPOCH,
                             &(uint64_t){0}) != 0) {
    encache__free(t);
    encache__free(url);
    encache_store_close(local);
    encache_store_close(remote);
    return encache_store_fail(NULL, ENCACHE_EINVAL, "tier: the local tier "
                              "must be an shm Store");
  }
  t->base.url = url;
  t->base.ops = &t->ops;
  t->local = local;
  t->remote = remote;
  t->max_items = max_items ? max_items : TIER_QUEUE_ITEMS;
  t->max_bytes = max_bytes ? max_bytes : TIER_QUEUE_BYTES;
  make_ops(t);
  encache__store_profile_set(&t->base);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  pthread_cond_init(&t->idle, NULL);
  int rc = encache__tier_promote_start(t);
  if (rc < 0) {
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", encache_store_errmsg(NULL));
    tier_close(&t->base);
    return encache_store_fail(NULL, rc, "%s", msg);
  }
  ENCACHE_ASSERT(encache__backend_check(&t->ops) == 0);
  *out = &t->base;
  return 0;
}
