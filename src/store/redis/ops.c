/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ops.c: the Store operations of the Redis backend (see redis.h): batched
 * EXISTS / GET / STRLEN pipelined per node with redirections followed,
 * SET NX straight from the caller's buffers, DEL, listings, removal by
 * prefix and counters (leases: lease.c);
 * the ops table and encache__redis_open().  Objects larger than
 * window_threshold go in windows (wread.c, wwrite.c).
 *
 * (Over 700 lines, on purpose: the backend's operations and its table
 * read together, as mooncake.c's and tier.c's do; what each operation
 * stands on has a file of its own: connections conn.c, replies io.c,
 * listings list.c, windows wread.c and wwrite.c, leases lease.c.)
 */
#include "redis.h"
#include "../backends.h"

#include <stdio.h>
#include <stdlib.h>

enum op { OP_EXISTS, OP_GET, OP_STRLEN, OP_HEAD };

/* OP_HEAD: GETRANGE key 0 23, the header (object_size()). */
static const char *const verbs[] = {"EXISTS", "GET", "STRLEN", "GETRANGE"};

/* A batch in progress: one command per key, pipelined per node, over
 * rounds that follow redirections.  results[i] is INT64_MIN while key i
 * is pending. */
typedef struct batch_run {
  redis_store *s;
  enum op op;
  const char *const *keys;
  size_t n, split;
  void *const *heads, *const *bufs;
  const size_t *caps;
  int64_t *results;
  uint64_t *seeds;    /* OP_GET: the seed of each key's check */
  size_t *target;     /* node of each key (NO_NODE: none serves it) */
  unsigned char *ask; /* send ASKING before the key's command */
  size_t *order;      /* the keys of one node's pipeline */
  size_t *item_of;    /* reply index -> key (SIZE_MAX: ASKING) */
  rreply *replies;
  rset *set;
  int extra;     /* extra rounds, one per value refused unread */
  char why[512]; /* the last failure, for the message */
} batch_run;

static void batch_free(batch_run *b) {
  if (b->set != NULL)
    encache__redis_give_back(b->s, b->set);
  encache__free(b->seeds);
  encache__free(b->target);
  encache__free(b->ask);
  encache__free(b->order);
  encache__free(b->item_of);
  encache__free(b->replies);
}

/* Allocates b's scratch and borrows a connection set; routes every key. */
static int batch_start(batch_run *b) {
  size_t n = b->n;
  b->target = encache__calloc(n, sizeof(size_t));
  b->ask = encache__calloc(n, 1);
  b->order = encache__calloc(n, sizeof(size_t));
  b->item_of = encache__calloc(2 * n, sizeof(size_t));
  b->replies = encache__calloc(2 * n, sizeof(rreply));
  b->seeds = b->op == OP_GET ? encache__calloc(n, sizeof(uint64_t)) : NULL;
  b->set = encache__redis_borrow(b->s);
  if (!b->target || !b->ask || !b->order || !b->item_of || !b->replies ||
      !b->set || (b->op == OP_GET && !b->seeds)) {
    batch_free(b);
    return encache_store_fail(&b->s->base, ENCACHE_ENOMEM, "out of memory");
  }
  encache__redis_ensure_slots(b->s);
  for (size_t i = 0; i < n; i++) {
    b->results[i] = INT64_MIN; /* pending */
    b->target[i] = encache__redis_locate(b->s, b->keys[i]);
    if (b->seeds != NULL)
      b->seeds[i] = encache__redis_check_seed(b->keys[i]);
  }
  return 0;
}

/* Settles the pending keys no node serves; says whether any is left. */
static int batch_pending(batch_run *b) {
  int pending = 0;
  for (size_t i = 0; i < b->n; i++) {
    if (b->results[i] != INT64_MIN)
      continue;
    if (b->target[i] == NO_NODE) {
      b->results[i] = ENCACHE_EUNAVAIL;
      snprintf(b->why, sizeof(b->why), "no node serves the slot of %s",
               b->keys[i]);
      continue;
    }
    pending = 1;
  }
  return pending;
}

/* The commands for the m keys of order[] into o (ASKING first where
 * asked); item_of maps each reply to its key.  Returns the reply count;
 * *want gets the bytes the values may take. */
static size_t batch_commands(batch_run *b, size_t m, obuf *o, uint64_t *want) {
  size_t nrep = 0;
  *want = 0;
  for (size_t k = 0; k < m; k++) {
    size_t i = b->order[k];
    if (b->ask[i]) {
      const char *a[1] = {"ASKING"};
      encache__redis_cmd(o, 1, a, NULL);
      b->item_of[nrep++] = SIZE_MAX;
    }
    const char *argv[4] = {verbs[b->op], b->keys[i], "0", "23"};
    encache__redis_cmd(o, b->op == OP_HEAD ? 4 : 2, argv, NULL);
    b->item_of[nrep++] = i;
    if (b->op == OP_GET || b->op == OP_HEAD)
      *want = sat_add(*want, sat_add(b->split, b->caps[i]));
  }
  return nrep;
}

/* The answer of a value read whole for key i (r: its reply): its length,
 * or a miss when its check fails, or when it has none and the handle
 * requires one. */
static int64_t value_answer(batch_run *b, size_t i, const rreply *r) {
  if (r->check == CHECK_BAD) {
    snprintf(b->why, sizeof(b->why),
             "%s: the object fails its check (damaged, or copied from "
             "another key): a miss",
             b->keys[i]);
    return ENCACHE_ENOENT;
  }
  if (r->check == CHECK_NONE && b->op == OP_GET &&
      b->s->checksum == CHECKSUM_REQUIRED) {
    snprintf(b->why, sizeof(b->why),
             "%s: the object has no check (checksum=required): a miss",
             b->keys[i]);
    return ENCACHE_ENOENT;
  }
  if (r->check == CHECK_NONE && b->op == OP_GET && r->len > 0)
    __atomic_add_fetch(&b->s->unchecked, 1, __ATOMIC_RELAXED);
  return r->len;
}

/* The result of key i from its reply r; a redirection sends it to
 * another node for the next round. */
static void batch_take(batch_run *b, size_t i, const rreply *r) {
  b->ask[i] = 0;
  if (is_redirect(r)) {
    int is_ask;
    b->target[i] = encache__redis_redirect(b->s, r->text, &is_ask);
    b->ask[i] = (unsigned char)is_ask;
    return; /* next round */
  }
  int64_t *res = &b->results[i];
  if (r->type == REDIS_REPLY_ERROR) {
    snprintf(b->why, sizeof(b->why), "%s %s: %s", verbs[b->op], b->keys[i],
             r->text);
    *res = ENCACHE_EUNAVAIL;
  } else if (b->op == OP_GET || b->op == OP_HEAD) {
    *res = r->type == REDIS_REPLY_NIL      ? ENCACHE_ENOENT
           : r->type != REDIS_REPLY_STRING ? ENCACHE_EUNAVAIL
           : r->too_large                  ? ENCACHE_ETOOLARGE
                                           : value_answer(b, i, r);
  } else if (r->type == REDIS_REPLY_INTEGER) {
    *res = b->op == OP_EXISTS ? r->integer > 0 : r->integer;
  } else {
    *res = ENCACHE_EUNAVAIL;
  }
}

/* One pipeline: the pending keys of the node of key `first`. */
static void batch_node(batch_run *b, size_t first) {
  size_t node = b->target[first], m = 0;
  for (size_t i = first; i < b->n; i++)
    if (b->results[i] == INT64_MIN && b->target[i] == node)
      b->order[m++] = i;
  if (node >= MAX_NODES) { /* a redirection we could not follow */
    for (size_t k = 0; k < m; k++)
      b->results[b->order[k]] = ENCACHE_EUNAVAIL;
    snprintf(b->why, sizeof(b->why), "%s: unusable redirection",
             b->keys[first]);
    return;
  }
  obuf o = {NULL, 0, 0, 0};
  uint64_t want;
  size_t nrep = batch_commands(b, m, &o, &want);
  int values = b->op == OP_GET || b->op == OP_HEAD;
  rpipe p = {.replies = b->replies, .cap = nrep, .item = b->item_of,
             .split = b->split, .heads = values ? b->heads : NULL,
             .bufs = b->bufs, .caps = b->caps, .seeds = b->seeds,
             .direct = b->op == OP_GET}; /* GETs received in place */
  char xwhy[256];
  struct iovec iov = {o.p, o.len};
  int x = o.oom ? XR_FAIL
                : encache__redis_run_on(b->s, b->set, node, &iov, 1, nrep, &p,
                                        encache__redis_deadline(b->s, want),
                                        xwhy, sizeof(xwhy));
  encache__free(o.p);
  if (x != XR_OK) {
    snprintf(b->why, sizeof(b->why), "%s: %s", verbs[b->op],
             o.oom ? "out of memory" : xwhy);
    if (x == XR_TOOBIG && b->item_of[p.next] != SIZE_MAX) {
      b->results[b->item_of[p.next]] = ENCACHE_ETOOLARGE;
      b->extra++;
    } else {
      for (size_t k = p.next; k < nrep; k++)
        if (b->item_of[k] != SIZE_MAX)
          b->results[b->item_of[k]] = ENCACHE_EUNAVAIL;
    }
  }
  /* The replies that came, whatever happened after them. */
  for (size_t k = 0; k < p.next; k++)
    if (b->item_of[k] != SIZE_MAX) /* else ASKING's +OK */
      batch_take(b, b->item_of[k], &b->replies[k]);
}

/* The keys of a batch read in windows from one node (a Redis Cluster's
 * batch with such keys on several nodes reads each node's at the same
 * time, one thread per node, each with its own connections). */
#define WGROUPS_MAX 16
typedef struct wgroup {
  batch_run *b;
  size_t node; /* group 0: none (it reads what no other group reads) */
  rset *set;
  int started; /* a thread reads this group (groups 1 and after) */
  char why[256];
} wgroup;

static int windowed(const batch_run *b, size_t i) {
  return b->op == OP_GET &&
         sat_add(b->split, b->caps[i]) > b->s->window_threshold;
}

/* Whether key i is group k's: its node's, or for group 0 a node whose
 * group has no thread. */
static int wgroup_has(const wgroup *g, size_t ng, size_t k, size_t i) {
  size_t node = g[k].b->target[i];
  if (k > 0)
    return node == g[k].node;
  for (size_t j = 1; j < ng; j++)
    if (g[j].started && g[j].node == node)
      return 0;
  return 1;
}

/* Reads group k's keys in windows (wread.c): one stream per node. */
static void wgroup_read(wgroup *g, size_t ng, size_t k) {
  batch_run *b = g[k].b;
  size_t m = 0;
  for (size_t i = 0; i < b->n; i++)
    m += windowed(b, i) && wgroup_has(g, ng, k, i);
  if (m == 0)
    return;
  const char **keys = encache__calloc(m, sizeof(*keys));
  void **heads = encache__calloc(m, sizeof(*heads));
  void **bufs = encache__calloc(m, sizeof(*bufs));
  size_t *caps = encache__calloc(m, sizeof(*caps)),
         *idx = encache__calloc(m, sizeof(*idx));
  int64_t *res = encache__calloc(m, sizeof(*res));
  if (keys && heads && bufs && caps && idx && res) {
    m = 0;
    for (size_t i = 0; i < b->n; i++)
      if (windowed(b, i) && wgroup_has(g, ng, k, i)) {
        keys[m] = b->keys[i], heads[m] = b->heads[i], bufs[m] = b->bufs[i];
        caps[m] = b->caps[i], idx[m++] = i;
      }
    encache__redis_wread(b->s, g[k].set, m, keys, b->split, heads, bufs, caps,
                         res, g[k].why, sizeof(g[k].why));
    for (size_t j = 0; j < m; j++)
      b->results[idx[j]] = res[j];
  } else {
    for (size_t i = 0; i < b->n; i++)
      if (windowed(b, i) && wgroup_has(g, ng, k, i))
        b->results[i] = ENCACHE_ENOMEM;
    snprintf(g[k].why, sizeof(g[k].why), "windowed reads: out of memory");
  }
  encache__free(keys);
  encache__free(heads);
  encache__free(bufs);
  encache__free(caps);
  encache__free(idx);
  encache__free(res);
}

typedef struct wthread {
  wgroup *g;
  size_t ng, k;
} wthread;

static void *wgroup_main(void *arg) {
  wthread *t = arg;
  wgroup_read(t->g, t->ng, t->k);
  return NULL;
}

/* Reads the keys whose destination is larger than window_threshold in
 * windows (wread.c), before the others go in one pipeline: in a Redis
 * Cluster, those of up to WGROUPS_MAX nodes at the same time, a thread
 * (and a borrowed set of connections) for each node but one; this thread
 * reads the first node's keys, and those of any node beyond. */
static void batch_windows(batch_run *b) {
  wgroup g[WGROUPS_MAX];
  size_t ng = 1;
  g[0] = (wgroup){b, NO_NODE, b->set, 0, ""};
  for (size_t i = 0, first = NO_NODE; b->s->cluster && i < b->n; i++) {
    size_t k = 1, node = b->target[i];
    while (k < ng && g[k].node != node)
      k++;
    if (!windowed(b, i) || node == NO_NODE || k < ng || node == first)
      continue;
    if (first == NO_NODE)
      first = node; /* group 0's */
    else if (ng < WGROUPS_MAX)
      g[ng++] = (wgroup){b, node, NULL, 0, ""};
  }
  pthread_t tid[WGROUPS_MAX];
  wthread t[WGROUPS_MAX];
  for (size_t k = 1; k < ng; k++) {
    g[k].set = encache__redis_borrow(b->s);
    t[k] = (wthread){g, ng, k};
    g[k].started = g[k].set != NULL &&
                   pthread_create(&tid[k], NULL, wgroup_main, &t[k]) == 0;
  }
  wgroup_read(g, ng, 0);
  for (size_t k = 1; k < ng; k++) {
    if (g[k].started)
      pthread_join(tid[k], NULL);
    if (g[k].set != NULL)
      encache__redis_give_back(b->s, g[k].set);
  }
  for (size_t k = 0; k < ng; k++)
    if (g[k].why[0] != '\0')
      snprintf(b->why, sizeof(b->why), "%s", g[k].why);
}

/*
 * Runs one command per key, pipelined per node, following redirections.
 * OP_GET copies values into heads/bufs (split at `split`); results[i] gets
 * the byte count, 1/0 (exists), or a classified code.
 */
static int batch(redis_store *s, enum op op, const char *const *keys, size_t n,
                 size_t split, void *const *heads, void *const *bufs,
                 const size_t *caps, int64_t *results) {
  batch_run b = {.s = s, .op = op, .keys = keys, .n = n, .split = split,
                 .heads = heads, .bufs = bufs, .caps = caps,
                 .results = results};
  int rc = batch_start(&b);
  if (rc < 0)
    return rc;
  batch_windows(&b);
  /* A value refused unread drops its connection: the keys behind it in the
   * pipeline go again, in an extra round (each refusal settles one key). */
  for (int round = 0; round < ROUNDS + b.extra && batch_pending(&b); round++)
    for (size_t first = 0; first < n; first++) /* one pipeline per node */
      if (results[first] == INT64_MIN)
        batch_node(&b, first);
  for (size_t i = 0; i < n; i++)
    if (results[i] == INT64_MIN) {
      results[i] = ENCACHE_EUNAVAIL;
      snprintf(b.why, sizeof(b.why), "%s: still redirected after %d rounds",
               keys[i], ROUNDS);
    }
  batch_free(&b);
  if (b.why[0])
    encache_store_fail(&s->base, 0, "%s: %s", s->base.url, b.why);
  return 0;
}

static int redis_exists(encache_store *st, const char *const *keys, size_t n,
                        int *results) {
  int64_t local[32];
  int64_t *r = n <= 32 ? local : encache__calloc(n, sizeof(int64_t));
  if (r == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = batch((redis_store *)st, OP_EXISTS, keys, n, 0, NULL, NULL, NULL, r);
  for (size_t i = 0; rc == 0 && i < n; i++)
    results[i] = (int)r[i];
  if (r != local)
    encache__free(r);
  return rc;
}

static int redis_read(encache_store *st, const char *const *keys, size_t n,
                      void *const *bufs, const size_t *caps, int64_t *results) {
  return batch((redis_store *)st, OP_GET, keys, n, 0, bufs, bufs, caps,
               results);
}

static int redis_read_split(encache_store *st, const char *const *keys,
                            size_t n, size_t split, void *const *heads,
                            void *const *bufs, const size_t *caps,
                            int64_t *results) {
  return batch((redis_store *)st, OP_GET, keys, n, split, heads, bufs, caps,
               results);
}

static int redis_object_size(encache_store *st, const char *key,
                             uint64_t *len) {
  const char *keys[1] = {key};
  int64_t r[1], e[1];
  int rc = batch((redis_store *)st, OP_STRLEN, keys, 1, 0, NULL, NULL, NULL, r);
  if (rc < 0 || r[0] < 0)
    return rc < 0 ? rc : (int)r[0];
  if (r[0] == 0) { /* STRLEN says 0 for a missing key too */
    rc = batch((redis_store *)st, OP_EXISTS, keys, 1, 0, NULL, NULL, NULL, e);
    if (rc < 0 || e[0] < 0)
      return rc < 0 ? rc : (int)e[0];
    if (e[0] == 0)
      return ENCACHE_ENOENT;
  }
  *len = (uint64_t)r[0];
  if (*len < ENCACHE_HEADER_SIZE + CHECK_BYTES)
    return 0;
  /* The object's length, without its check: the header says. */
  unsigned char head[ENCACHE_HEADER_SIZE];
  void *bufs[1] = {head};
  size_t caps[1] = {sizeof(head)};
  rc = batch((redis_store *)st, OP_HEAD, keys, 1, 0, bufs, bufs, caps, e);
  if (rc < 0 || e[0] < 0)
    return rc < 0 ? rc : (int)e[0];
  *len = encache__redis_check_objlen(head, (size_t)e[0], *len);
  return 0;
}

/* ----------------------------------------------------------------- writes */

/*
 * SET key hdr+payload NX [EX ttl], straight from the caller's buffers.
 * Returns 0, ENCACHE_EEXIST, ENCACHE_EUNAVAIL, or 1 with *moved_to set
 * (and *ask) when redirected.
 *
 * A SET sent again on a redialled connection (encache__redis_run_on()) follows
 * one that got no byte of answer.  A server that closes an idle connection
 * never read that SET, but one killed or reset just after executing it may have
 * written the key: then the second SET NX finds it and we answer EEXIST
 * ("already there"), which is true: the object under the key is complete
 * and is the one we sent, or another writer's for the same key.
 */
static int set_once(redis_store *s, rset *set, size_t node, int ask_first,
                    const char *key, const void *hdr, size_t hl,
                    const void *payload, size_t len, const unsigned char *ck,
                    size_t ckl, size_t *moved_to, int *ask) {
  char why[512] = "";
  char pre[512], ttl[32], post[96];
  size_t klen = strlen(key);
  int nargs = s->ttl_s ? 6 : 4;
  snprintf(ttl, sizeof(ttl), "%u", s->ttl_s);
  int pl = snprintf(pre, sizeof(pre), "%s*%d\r\n$3\r\nSET\r\n$%zu\r\n",
                    ask_first ? "*1\r\n$6\r\nASKING\r\n" : "", nargs, klen);
  int ql =
      snprintf(pre + pl, sizeof(pre) - (size_t)pl, "\r\n$%zu\r\n",
               hl + len + ckl);
  int tl = s->ttl_s ? snprintf(post, sizeof(post),
                               "\r\n$2\r\nNX\r\n$2\r\nEX\r\n$%zu\r\n%s\r\n",
                               strlen(ttl), ttl)
                    : snprintf(post, sizeof(post), "\r\n$2\r\nNX\r\n");
  struct iovec iov[7] = {{pre, (size_t)pl},      {(void *)key, klen},
                         {pre + pl, (size_t)ql}, {(void *)hdr, hl},
                         {(void *)payload, len}, {(void *)ck, ckl},
                         {post, (size_t)tl}};
  rreply r[2];
  size_t nrep = ask_first ? 2 : 1;
  rpipe p = {.replies = r, .cap = nrep};
  if (encache__redis_run_on(s, set, node, iov, 7, nrep, &p,
                            encache__redis_deadline(s, hl + len), why,
                            sizeof(why)) != XR_OK)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: SET %s: %s",
                              s->base.url, key, why);
  rreply *res = &r[nrep - 1];
  if (is_redirect(res)) {
    *moved_to = encache__redis_redirect(s, res->text, ask);
    return 1;
  }
  if (res->type == REDIS_REPLY_NIL)
    return encache_store_fail(&s->base, ENCACHE_EEXIST, "%s: key exists",
                              s->base.url);
  if (res->type == REDIS_REPLY_STATUS)
    return 0;
  /* OOM, READONLY, ...: the write did not happen. */
  return encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: SET %s: %s",
                            s->base.url, key, res->text);
}

static int redis_write(encache_store *st, const char *key, const void *hdr,
                       size_t hl, const void *payload, size_t len) {
  redis_store *s = (redis_store *)st;
  unsigned char ck[CHECK_BYTES];
  size_t ckl = encache__redis_check_make(s->checksum, key, hdr, hl, payload,
                                          len, ck)
                   ? CHECK_BYTES
                   : 0;
  if ((uint64_t)hl + len + ckl > 512ull << 20)
    return encache_store_fail(st, ENCACHE_ETOOLARGE,
                              "%s: %zu bytes: Redis values are at most "
                              "512 MiB",
                              s->base.url, hl + len + ckl);
  rset *set = encache__redis_borrow(s);
  if (set == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  encache__redis_ensure_slots(s);
  if ((uint64_t)hl + len + ckl > s->window_threshold) {
    int rc =
        encache__redis_wwrite(s, set, key, hdr, hl, payload, len, ck, ckl);
    encache__redis_give_back(s, set);
    return rc;
  }
  size_t node = encache__redis_locate(s, key);
  int rc = ENCACHE_EUNAVAIL, ask = 0;
  for (int round = 0; round < ROUNDS && node != NO_NODE; round++) {
    size_t moved = NO_NODE;
    rc = set_once(s, set, node, ask, key, hdr, hl, payload, len, ck, ckl,
                  &moved, &ask);
    if (rc != 1)
      break;
    node = moved;
    rc = encache_store_fail(st, ENCACHE_EUNAVAIL, "%s: %s still redirected",
                            s->base.url, key);
  }
  if (node == NO_NODE)
    rc = encache_store_fail(st, ENCACHE_EUNAVAIL, "%s: no node serves %s",
                            s->base.url, key);
  encache__redis_give_back(s, set);
  return rc;
}

static int redis_remove(encache_store *st, const char *key) {
  redis_store *s = (redis_store *)st;
  const char *argv[2] = {"DEL", key};
  char why[512];
  rreply r;
  int rc = encache__redis_command(s, key, 2, argv, NULL, &r, why, sizeof(why));
  if (rc == 0 && r.type == REDIS_REPLY_INTEGER && r.integer > 0)
    return 0;
  if (rc == 0) {
    rc = r.type == REDIS_REPLY_INTEGER ? ENCACHE_ENOENT : ENCACHE_EUNAVAIL;
    snprintf(why, sizeof(why), "%s",
             r.type == REDIS_REPLY_INTEGER ? "no such key"
             : r.type == REDIS_REPLY_ERROR ? r.text
                                           : "an unexpected answer");
  }
  return encache_store_fail(st, rc, "%s: DEL %s: %s", s->base.url, key, why);
}

/* A short-lived context of ordinary replies to node, for listings and
 * counters; NULL with the handle's message set. */
static redisContext *admin_dial(redis_store *s, size_t node) {
  char why[512];
  redisContext *c = encache__redis_dial(s, node, 1, why, sizeof(why));
  if (c == NULL)
    encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s", s->base.url, why);
  return c;
}

/* What to do on each master: list or remove by prefix. */
typedef struct on_master {
  const char *pattern; /* list: the pattern; remove: the prefix */
  int (*cb)(const char *key, uint64_t len, void *arg);
  void *arg;
  uint64_t removed;
} on_master;

/* Runs what on every master in turn, on a short-lived context each,
 * all of them by one deadline (the handle's list timeout). */
static int each_master(redis_store *s, on_master *what) {
  uint64_t deadline = encache__store_list_deadline(&s->base);
  size_t nodes[MAX_NODES], m;
  int rc = encache__redis_masters(s, nodes, &m);
  for (size_t k = 0; rc == 0 && k < m; k++) {
    redisContext *c = admin_dial(s, nodes[k]);
    if (c == NULL)
      return ENCACHE_EUNAVAIL;
    rc = what->cb != NULL
             ? encache__redis_list_node(s, c, what->pattern, deadline,
                                        what->cb, what->arg)
             : encache__redis_unlink_node(s, c, what->pattern, deadline,
                                          &what->removed);
    redisFree(c);
  }
  return rc;
}

static int redis_list(encache_store *st, const char *pattern,
                      int (*cb)(const char *key, uint64_t len, void *arg),
                      void *arg) {
  on_master what = {pattern, cb, arg, 0};
  return each_master((redis_store *)st, &what);
}

static int redis_remove_prefix(encache_store *st, const char *prefix,
                               uint64_t *removed) {
  on_master what = {prefix, NULL, NULL, 0};
  int rc = each_master((redis_store *)st, &what);
  *removed = what.removed;
  return rc;
}

/* The built-in requests Redis answers (base.h): the count of values
 * served without a check. */
static int redis_control(encache_store *st, int op, void *arg) {
  if (op != ENCACHE__CONTROL_UNCHECKED)
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  if (arg != NULL)
    *(uint64_t *)arg =
        __atomic_load_n(&((redis_store *)st)->unchecked, __ATOMIC_RELAXED);
  return 0;
}

static uint64_t info_field(const char *info, const char *name) {
  const char *p = strstr(info, name);
  return p ? strtoull(p + strlen(name), NULL, 10) : 0;
}

static int redis_stats(encache_store *st, encache_store_stats *out) {
  redis_store *s = (redis_store *)st;
  size_t nodes[MAX_NODES], m;
  out->objects = out->bytes_used = out->evictions = 0;
  out->capacity = 0;
  int rc = encache__redis_masters(s, nodes, &m);
  if (rc < 0)
    return rc;
  static const char *const info_cmd[1] = {"INFO"}, *const size_cmd[1] = {
                                                       "DBSIZE"};
  for (size_t k = 0; k < m; k++) {
    char why[512];
    redisContext *c = admin_dial(s, nodes[k]);
    if (c == NULL)
      return ENCACHE_EUNAVAIL;
    obuf b = {NULL, 0, 0, 0};
    encache__redis_cmd(&b, 1, info_cmd, NULL);
    encache__redis_cmd(&b, 1, size_cmd, NULL);
    void *rep[2];
    int x = encache__redis_plain(s, c, &b, 2, rep, why, sizeof(why));
    encache__free(b.p);
    redisFree(c);
    redisReply *info = rep[0], *size = rep[1];
    int ok = x == XR_OK && info->type == REDIS_REPLY_STRING &&
             size->type == REDIS_REPLY_INTEGER;
    if (ok) {
      out->bytes_used += info_field(info->str, "\nused_memory:");
      out->evictions += info_field(info->str, "\nevicted_keys:");
      uint64_t max = info_field(info->str, "\nmaxmemory:");
      out->capacity = max == 0 || out->capacity == UINT64_MAX
                          ? UINT64_MAX
                          : out->capacity + max;
      out->objects += (uint64_t)size->integer;
    } else if (x == XR_OK) {
      snprintf(why, sizeof(why), "%s",
               info->type == REDIS_REPLY_ERROR   ? info->str
               : size->type == REDIS_REPLY_ERROR ? size->str
                                                 : "unexpected answer");
    }
    if (x == XR_OK) {
      freeReplyObject(info);
      freeReplyObject(size);
    }
    if (!ok)
      return encache_store_fail(st, ENCACHE_EUNAVAIL, "%s: INFO: %s",
                                s->base.url, why);
  }
  out->reinsertions = out->repairs = UINT64_MAX;
  return 0;
}

static void redis_close(encache_store *st) {
  redis_store *s = (redis_store *)st;
  encache__redis_free_pool(s);
  pthread_mutex_destroy(&s->mu);
  encache__free(s->slots);
  encache__free(s->user);
  encache__free(s->password);
  encache__free(s->base.url);
  encache__free(s);
}

static const encache__store_ops redis_ops = {
    .size = sizeof(encache__store_ops),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "redis",
    .caps = ENCACHE_STORE_CAP_READ_SPLIT | ENCACHE_STORE_CAP_LIST |
            ENCACHE_STORE_CAP_PUT_IF_ABSENT | ENCACHE_STORE_CAP_SHARED |
            ENCACHE_STORE_CAP_REMOVE_PREFIX | ENCACHE_STORE_CAP_LEASE,
    .exists = redis_exists,
    .read = redis_read,
    .read_split = redis_read_split,
    .object_size = redis_object_size,
    .write = redis_write,
    .remove = redis_remove,
    .list = redis_list,
    .stats = redis_stats,
    .close = redis_close,
    .remove_prefix = redis_remove_prefix,
    .lease_take = encache__redis_lease_take,
    .lease_drop = encache__redis_lease_drop,
    .control = redis_control};

int encache__redis_open(const char *url, encache_store **out) {
  *out = NULL;
  char *shown = NULL;
  int len = encache_store_url_redact(url, NULL, 0);
  redis_store *s = len < 0 ? NULL : encache__calloc(1, sizeof(*s));
  if (s == NULL || (shown = encache__malloc((size_t)len + 1)) == NULL) {
    encache__free(s);
    return encache_store_fail(NULL, ENCACHE_ENOMEM,
                              "out of memory opening a Redis Store");
  }
  encache_store_url_redact(url, shown, (size_t)len + 1);
  s->base.url = shown;
  s->base.ops = &redis_ops;
  encache__store_profile_set(&s->base);
  pthread_mutex_init(&s->mu, NULL);
  s->connect_timeout_ms = 1000;
  s->timeout_ms = 1000;
  s->window = WINDOW_DEFAULT;
  s->window_threshold = WINDOW_THRESHOLD_DEFAULT;
  s->window_depth = WINDOW_DEPTH_DEFAULT;
  *out = &s->base;
  return encache__redis_parse_url(s, url);
}
