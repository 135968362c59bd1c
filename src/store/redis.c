/*
 * redis.c: Redis / Valkey as a Store, single node or Redis Cluster, on
 * hiredis.
 *
 * URLs (docs/stores.md):
 *   redis://[user:password@]host:port[/db][?options]
 *   unix:///path/to/socket[?db=N&options]
 *   redis-cluster://[user:password@]host:port[,host:port...][?options]
 * options: connect_timeout_ms, timeout_ms (each command's socket timeout),
 * ttl_s (expiry of written objects; 0 = none).
 *
 * Connections.  hiredis contexts are not thread-safe and the engine uses
 * its Store from two threads, so a handle keeps a pool of connection sets
 * (one context per node in each set); an operation borrows a set, uses it
 * and gives it back.  Contexts are made lazily.  A node that fails (refused,
 * reset, timeout, protocol error) has its contexts dropped and is left
 * alone for a backoff (100 ms doubling to 2 s), during which its keys
 * answer "unavailable" at once rather than wait on a connect timeout.
 *
 * Replies.  Every pooled context reads with our own hiredis reply
 * functions: a bulk string is copied from hiredis's read buffer straight
 * into the caller's buffer (header and payload split when asked), or
 * refused as too large, with no reply object and no other copy.  Writes
 * send SET key value NX [EX ttl] with writev() from the caller's header
 * and payload, so the value is not copied either.  Commands that answer
 * arrays (CLUSTER SLOTS, SCAN) use a short-lived context with hiredis's
 * ordinary replies.
 *
 * Cluster.  The slot map comes from CLUSTER SLOTS (seeds first); keys are
 * grouped per node and pipelined; MOVED updates the map (and a full
 * refresh follows), ASK is followed for that key with ASKING; up to three
 * rounds, then the key is unavailable.
 *
 * Nothing here poisons: Redis never writes into our memory after a call
 * returns.  Every failure is recoverable (EUNAVAIL) or a plain answer.
 */
#include "store.h"

#include <hiredis/hiredis.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NSLOTS 16384
#define NO_NODE 0xffffu
#define MAX_NODES 1024
#define ROUNDS 3

typedef struct rnode {
  char host[256]; /* or the socket path */
  int port;       /* 0 = unix socket */
  uint64_t down_until_ms;
  unsigned backoff_ms;
} rnode;

typedef struct rset {
  struct rset *next;
  redisContext *conns[MAX_NODES];
} rset;

typedef struct redis_store {
  encache_store base;
  int cluster;
  char *user, *password;
  int db;
  unsigned connect_timeout_ms, timeout_ms, ttl_s;
  pthread_mutex_t mu; /* guards everything below */
  rnode nodes[MAX_NODES];
  size_t nnodes;
  size_t nseeds;      /* cluster: nodes[0..nseeds) came from the URL */
  uint16_t *slots;    /* cluster: node per slot */
  int need_refresh;
  rset *free_sets;
} redis_store;

static const encache__store_ops redis_ops;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct timeval tv_ms(unsigned ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* ------------------------------------------------------------ key slots */

static uint16_t crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((unsigned char)buf[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

/* Redis Cluster's key slot, hash tags included. */
static unsigned key_slot(const char *key) {
  size_t len = strlen(key);
  const char *open = memchr(key, '{', len);
  if (open != NULL) {
    const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
    if (close != NULL && close > open + 1)
      return crc16(open + 1, (size_t)(close - open - 1)) % NSLOTS;
  }
  return crc16(key, len) % NSLOTS;
}

/* ------------------------------------------------------- reply functions */

/* One reply of a pipeline, filled by the reply functions below. */
typedef struct rreply {
  int type;
  long long integer;
  int64_t len;
  int too_large;
  char text[200]; /* error or status text, truncated */
} rreply;

/* The pipeline being read: where each string reply goes. */
typedef struct rpipe {
  rreply *replies;
  size_t next, cap;
  const size_t *item;   /* reply index -> item index (SIZE_MAX: none) */
  size_t split;
  void *const *heads;   /* NULL: no copy */
  void *const *bufs;
  const size_t *caps;
} rpipe;

static rreply dummy_reply; /* for nested elements and stray replies */

static rreply *next_reply(const redisReadTask *task) {
  rpipe *p = task->privdata;
  if (p == NULL || task->parent != NULL || p->next >= p->cap)
    return &dummy_reply;
  rreply *r = &p->replies[p->next++];
  memset(r, 0, sizeof(*r));
  r->type = task->type;
  return r;
}

static void *rf_string(const redisReadTask *task, char *str, size_t len) {
  rreply *r = next_reply(task);
  rpipe *p = task->privdata;
  if (r == &dummy_reply)
    return r;
  r->len = (int64_t)len;
  if (task->type == REDIS_REPLY_STRING) {
    size_t item = p->item ? p->item[p->next - 1] : SIZE_MAX;
    if (p->bufs != NULL && item != SIZE_MAX) {
      if (len > p->split && len - p->split > p->caps[item]) {
        r->too_large = 1;
      } else {
        size_t h = len < p->split ? len : p->split;
        if (h > 0)
          memcpy(p->heads[item], str, h);
        if (len > h)
          memcpy(p->bufs[item], str + h, len - h);
      }
    } else {
      snprintf(r->text, sizeof(r->text), "%.*s", (int)(len < 199 ? len : 199),
               str);
    }
  } else {
    snprintf(r->text, sizeof(r->text), "%.*s", (int)(len < 199 ? len : 199),
             str);
  }
  return r;
}

static void *rf_array(const redisReadTask *task, int n) {
  (void)n;
  return next_reply(task);
}

static void *rf_integer(const redisReadTask *task, long long v) {
  rreply *r = next_reply(task);
  if (r != &dummy_reply) /* shared by every thread: never written */
    r->integer = v;
  return r;
}

static void *rf_nil(const redisReadTask *task) {
  rreply *r = next_reply(task);
  if (r != &dummy_reply)
    r->type = REDIS_REPLY_NIL; /* the task says STRING for a nil bulk */
  return r;
}

static void rf_free(void *obj) { (void)obj; }

static redisReplyObjectFunctions reply_fns = {rf_string, rf_array, rf_integer,
                                              rf_nil, rf_free};

/* ----------------------------------------------------------- connections */

static void node_failed(redis_store *s, size_t node) {
  pthread_mutex_lock(&s->mu);
  rnode *n = &s->nodes[node];
  n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : 100;
  if (n->backoff_ms > 2000)
    n->backoff_ms = 2000;
  n->down_until_ms = now_ms() + n->backoff_ms;
  if (s->cluster)
    s->need_refresh = 1;
  pthread_mutex_unlock(&s->mu);
}

static void node_ok(redis_store *s, size_t node) {
  pthread_mutex_lock(&s->mu);
  s->nodes[node].backoff_ms = 0;
  s->nodes[node].down_until_ms = 0;
  pthread_mutex_unlock(&s->mu);
}

static void drop(rset *set, size_t node) {
  if (set->conns[node] != NULL) {
    redisFree(set->conns[node]);
    set->conns[node] = NULL;
  }
}

/* Sends a command with our reply functions and reads one reply into *r.
 * Returns 0, or -1 on an I/O or protocol error. */
static int simple_command(redisContext *c, int argc, const char **argv,
                          rreply *r) {
  size_t lens[8];
  for (int i = 0; i < argc; i++)
    lens[i] = strlen(argv[i]);
  rpipe p = {r, 0, 1, NULL, 0, NULL, NULL, NULL};
  c->reader->privdata = &p;
  void *reply;
  int rc = redisAppendCommandArgv(c, argc, argv, lens) == REDIS_OK &&
                   redisGetReply(c, &reply) == REDIS_OK && p.next == 1
               ? 0
               : -1;
  c->reader->privdata = NULL;
  return rc;
}

/* Opens a context to node, with AUTH and SELECT; sets *why on failure. */
static redisContext *dial(redis_store *s, size_t node, int plain_replies,
                          char *why, size_t whysize) {
  rnode n;
  pthread_mutex_lock(&s->mu);
  n = s->nodes[node];
  pthread_mutex_unlock(&s->mu);
  if (n.down_until_ms > now_ms()) {
    snprintf(why, whysize, "%.200s:%d is down (retrying in %" PRIu64 " ms)",
             n.host, n.port, n.down_until_ms - now_ms());
    return NULL;
  }
  struct timeval ctv = tv_ms(s->connect_timeout_ms);
  redisContext *c = n.port ? redisConnectWithTimeout(n.host, n.port, ctv)
                           : redisConnectUnixWithTimeout(n.host, ctv);
  if (c == NULL || c->err) {
    if (n.port)
      snprintf(why, whysize, "%.200s:%d: %.200s", n.host, n.port,
               c ? c->errstr : "out of memory");
    else
      snprintf(why, whysize, "%.200s: %.200s", n.host,
               c ? c->errstr : "out of memory");
    if (c != NULL)
      redisFree(c);
    node_failed(s, node);
    return NULL;
  }
  redisSetTimeout(c, tv_ms(s->timeout_ms));
  redisEnableKeepAlive(c);
  /* AUTH and SELECT with hiredis's own replies; ours come after. */
  char db[16];
  snprintf(db, sizeof(db), "%d", s->db);
  const char *auth[3] = {"AUTH", s->user ? s->user : s->password, s->password};
  const char *sel[2] = {"SELECT", db};
  int bad = 0;
  for (int k = 0; k < 2 && !bad; k++) {
    if (k == 0 ? s->password == NULL : s->db == 0)
      continue;
    redisReply *rep = k == 0 ? redisCommandArgv(c, s->user ? 3 : 2, auth, NULL)
                             : redisCommandArgv(c, 2, sel, NULL);
    bad = rep == NULL || rep->type == REDIS_REPLY_ERROR;
    if (bad)
      snprintf(why, whysize, "%s: %.200s", k == 0 ? "AUTH" : "SELECT",
               rep && rep->str ? rep->str : c->errstr);
    if (rep)
      freeReplyObject(rep);
  }
  if (!plain_replies)
    c->reader->fn = &reply_fns;
  if (bad) {
    redisFree(c);
    node_failed(s, node);
    return NULL;
  }
  node_ok(s, node);
  return c;
}

static rset *borrow(redis_store *s) {
  pthread_mutex_lock(&s->mu);
  rset *set = s->free_sets;
  if (set != NULL)
    s->free_sets = set->next;
  pthread_mutex_unlock(&s->mu);
  if (set == NULL)
    set = encache__calloc(1, sizeof(*set));
  return set;
}

static void give_back(redis_store *s, rset *set) {
  pthread_mutex_lock(&s->mu);
  set->next = s->free_sets;
  s->free_sets = set;
  pthread_mutex_unlock(&s->mu);
}

static redisContext *conn(redis_store *s, rset *set, size_t node, char *why,
                          size_t whysize) {
  ENCACHE_ASSERT(node < MAX_NODES);
  if (set->conns[node] == NULL)
    set->conns[node] = dial(s, node, 0, why, whysize);
  return set->conns[node];
}

/* ------------------------------------------------------------ slot map */

static size_t node_index(redis_store *s, const char *host, int port) {
  for (size_t i = 0; i < s->nnodes; i++)
    if (s->nodes[i].port == port && strcmp(s->nodes[i].host, host) == 0)
      return i;
  if (s->nnodes == MAX_NODES)
    return NO_NODE;
  rnode *n = &s->nodes[s->nnodes];
  memset(n, 0, sizeof(*n));
  snprintf(n->host, sizeof(n->host), "%s", host);
  n->port = port;
  return s->nnodes++;
}

/* Reads CLUSTER SLOTS from the first node that answers (known masters,
 * then the seeds).  Returns 0 or ENCACHE_EUNAVAIL. */
static int refresh_slots(redis_store *s) {
  char why[512] = "no node answered";
  pthread_mutex_lock(&s->mu);
  size_t n = s->nnodes;
  pthread_mutex_unlock(&s->mu);
  for (size_t i = 0; i < n; i++) {
    redisContext *c = dial(s, i, 1, why, sizeof(why));
    if (c == NULL)
      continue;
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
      snprintf(why, sizeof(why), "CLUSTER SLOTS: %s",
               r && r->str ? r->str : c->errstr);
      if (r)
        freeReplyObject(r);
      redisFree(c);
      continue;
    }
    pthread_mutex_lock(&s->mu);
    for (size_t k = 0; k < NSLOTS; k++)
      s->slots[k] = NO_NODE;
    for (size_t e = 0; e < r->elements; e++) {
      redisReply *range = r->element[e];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
          range->element[2]->type != REDIS_REPLY_ARRAY ||
          range->element[2]->elements < 2)
        continue;
      redisReply *m = range->element[2];
      const char *host = m->element[0]->str && m->element[0]->str[0]
                             ? m->element[0]->str
                             : s->nodes[i].host;
      size_t idx = node_index(s, host, (int)m->element[1]->integer);
      long long lo = range->element[0]->integer, hi = range->element[1]->integer;
      for (long long k = lo; idx != NO_NODE && k <= hi && k < NSLOTS; k++)
        if (k >= 0)
          s->slots[k] = (uint16_t)idx;
    }
    s->need_refresh = 0;
    pthread_mutex_unlock(&s->mu);
    freeReplyObject(r);
    redisFree(c);
    return 0;
  }
  return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s",
                             s->base.url, why);
}

/* The node that owns key (single node: 0); NO_NODE when unknown. */
static size_t route(redis_store *s, const char *key) {
  if (!s->cluster)
    return 0;
  pthread_mutex_lock(&s->mu);
  size_t node = s->slots[key_slot(key)];
  pthread_mutex_unlock(&s->mu);
  return node;
}

static int ensure_slots(redis_store *s) {
  if (!s->cluster)
    return 0;
  pthread_mutex_lock(&s->mu);
  int need = s->need_refresh;
  pthread_mutex_unlock(&s->mu);
  return need ? refresh_slots(s) : 0;
}

/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK ..."; returns the node. */
static size_t redirect(redis_store *s, const char *text, int *ask) {
  unsigned slot;
  char host[256];
  int port;
  *ask = strncmp(text, "ASK ", 4) == 0;
  const char *p = strchr(text, ' ');
  if (p == NULL || sscanf(p + 1, "%u %255[^ ]", &slot, host) != 2)
    return NO_NODE;
  char *colon = strrchr(host, ':');
  if (colon == NULL || slot >= NSLOTS)
    return NO_NODE;
  *colon = '\0';
  port = atoi(colon + 1);
  pthread_mutex_lock(&s->mu);
  size_t node = node_index(s, host, port);
  if (!*ask && node != NO_NODE) {
    s->slots[slot] = (uint16_t)node;
    s->need_refresh = 1;
  }
  pthread_mutex_unlock(&s->mu);
  return node;
}

static int is_redirect(const rreply *r) {
  return r->type == REDIS_REPLY_ERROR &&
         (strncmp(r->text, "MOVED ", 6) == 0 || strncmp(r->text, "ASK ", 4) == 0);
}

/* --------------------------------------------------------------- batches */

enum op { OP_EXISTS, OP_GET, OP_STRLEN };

/*
 * Runs one command per key, pipelined per node, following redirections.
 * OP_GET copies values into heads/bufs (split at `split`); results[i] gets
 * the byte count, 1/0 (exists), or a classified code.
 */
static int batch(redis_store *s, enum op op, const char *const *keys,
                 size_t n, size_t split, void *const *heads,
                 void *const *bufs, const size_t *caps, int64_t *results) {
  static const char *const verbs[] = {"EXISTS", "GET", "STRLEN"};
  char why[512] = "";
  size_t *target = encache__calloc(n, sizeof(size_t));
  unsigned char *ask = encache__calloc(n, 1);
  size_t *order = encache__calloc(n, sizeof(size_t));
  size_t *item_of = encache__calloc(2 * n, sizeof(size_t));
  rreply *replies = encache__calloc(2 * n, sizeof(rreply));
  rset *set = borrow(s);
  if (!target || !ask || !order || !item_of || !replies || !set) {
    encache__free(target);
    encache__free(ask);
    encache__free(order);
    encache__free(item_of);
    encache__free(replies);
    if (set)
      give_back(s, set);
    return encache__store_fail(&s->base, ENCACHE_ENOMEM, "out of memory");
  }
  ensure_slots(s);
  for (size_t i = 0; i < n; i++) {
    results[i] = INT64_MIN; /* pending */
    target[i] = route(s, keys[i]);
    if (target[i] == NO_NODE && refresh_slots(s) == 0)
      target[i] = route(s, keys[i]);
  }
  for (int round = 0; round < ROUNDS; round++) {
    int pending = 0;
    for (size_t i = 0; i < n; i++) {
      if (results[i] != INT64_MIN)
        continue;
      if (target[i] == NO_NODE) {
        results[i] = ENCACHE_EUNAVAIL;
        snprintf(why, sizeof(why), "no node serves the slot of %s", keys[i]);
        continue;
      }
      pending = 1;
    }
    if (!pending)
      break;
    /* One pipeline per node that has pending keys. */
    for (size_t first = 0; first < n; first++) {
      if (results[first] != INT64_MIN)
        continue;
      size_t node = target[first], m = 0;
      for (size_t i = first; i < n; i++)
        if (results[i] == INT64_MIN && target[i] == node)
          order[m++] = i;
      if (node >= MAX_NODES) { /* a redirection we could not follow */
        for (size_t k = 0; k < m; k++)
          results[order[k]] = ENCACHE_EUNAVAIL;
        snprintf(why, sizeof(why), "%s: unusable redirection", keys[first]);
        continue;
      }
      redisContext *c = conn(s, set, node, why, sizeof(why));
      if (c == NULL) {
        for (size_t k = 0; k < m; k++)
          results[order[k]] = ENCACHE_EUNAVAIL;
        continue;
      }
      size_t nrep = 0;
      int io = 0;
      for (size_t k = 0; k < m && !io; k++) {
        size_t i = order[k];
        if (ask[i]) {
          const char *a[1] = {"ASKING"};
          size_t al[1] = {6};
          io |= redisAppendCommandArgv(c, 1, a, al) != REDIS_OK;
          item_of[nrep++] = SIZE_MAX;
        }
        const char *argv[2] = {verbs[op], keys[i]};
        size_t lens[2] = {strlen(verbs[op]), strlen(keys[i])};
        io |= redisAppendCommandArgv(c, 2, argv, lens) != REDIS_OK;
        item_of[nrep++] = i;
      }
      rpipe p = {replies, 0, nrep, item_of, split, op == OP_GET ? heads : NULL,
                 bufs, caps};
      c->reader->privdata = &p;
      for (size_t k = 0; k < nrep && !io; k++) {
        void *reply;
        io = redisGetReply(c, &reply) != REDIS_OK;
      }
      c->reader->privdata = NULL;
      if (io || p.next != nrep) {
        snprintf(why, sizeof(why), "%s: %s", verbs[op],
                 c->err ? c->errstr : "protocol error");
        drop(set, node);
        node_failed(s, node);
        for (size_t k = 0; k < m; k++)
          if (results[order[k]] == INT64_MIN)
            results[order[k]] = ENCACHE_EUNAVAIL;
        continue;
      }
      for (size_t k = 0; k < nrep; k++) {
        size_t i = item_of[k];
        rreply *r = &replies[k];
        if (i == SIZE_MAX)
          continue; /* ASKING's +OK */
        ask[i] = 0;
        if (is_redirect(r)) {
          int is_ask;
          target[i] = redirect(s, r->text, &is_ask);
          ask[i] = (unsigned char)is_ask;
          continue; /* next round */
        }
        if (r->type == REDIS_REPLY_ERROR) {
          snprintf(why, sizeof(why), "%s %s: %s", verbs[op], keys[i], r->text);
          results[i] = ENCACHE_EUNAVAIL;
        } else if (op == OP_GET) {
          results[i] = r->type == REDIS_REPLY_NIL ? ENCACHE_ENOENT
                       : r->type != REDIS_REPLY_STRING ? ENCACHE_EUNAVAIL
                       : r->too_large ? ENCACHE_ETOOLARGE
                                      : r->len;
        } else if (r->type == REDIS_REPLY_INTEGER) {
          results[i] = op == OP_EXISTS ? r->integer > 0 : r->integer;
        } else {
          results[i] = ENCACHE_EUNAVAIL;
        }
      }
    }
  }
  for (size_t i = 0; i < n; i++)
    if (results[i] == INT64_MIN) {
      results[i] = ENCACHE_EUNAVAIL;
      snprintf(why, sizeof(why), "%s: still redirected after %d rounds",
               keys[i], ROUNDS);
    }
  give_back(s, set);
  encache__free(target);
  encache__free(ask);
  encache__free(order);
  encache__free(item_of);
  encache__free(replies);
  if (why[0])
    encache__store_fail(&s->base, 0, "%s: %s", s->base.url, why);
  return 0;
}

static int redis_exists(encache_store *st, const char *const *keys, size_t n,
                        int *results) {
  int64_t local[32];
  int64_t *r = n <= 32 ? local : encache__calloc(n, sizeof(int64_t));
  if (r == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = batch((redis_store *)st, OP_EXISTS, keys, n, 0, NULL, NULL, NULL, r);
  for (size_t i = 0; rc == 0 && i < n; i++)
    results[i] = (int)r[i];
  if (r != local)
    encache__free(r);
  return rc;
}

static int redis_read(encache_store *st, const char *const *keys, size_t n,
                      void *const *bufs, const size_t *caps,
                      int64_t *results) {
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
  return 0;
}

/* ----------------------------------------------------------------- writes */

/* Writes all of iov to fd within the socket's send timeout. */
static int write_all(int fd, struct iovec *iov, int cnt) {
  while (cnt > 0) {
    ssize_t w = writev(fd, iov, cnt > IOV_MAX ? IOV_MAX : cnt);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    while (cnt > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      cnt--;
    }
    if (cnt > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

/* SET key hdr+payload NX [EX ttl], straight from the caller's buffers.
 * Returns 0, ENCACHE_EEXIST, ENCACHE_EUNAVAIL, or 1 with *moved_to set
 * (and *ask) when redirected. */
static int set_once(redis_store *s, rset *set, size_t node, int ask_first,
                    const char *key, const void *hdr, size_t hl,
                    const void *payload, size_t len, size_t *moved_to,
                    int *ask) {
  char why[512] = "";
  redisContext *c = conn(s, set, node, why, sizeof(why));
  if (c == NULL)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s",
                               s->base.url, why);
  char pre[512], ttl[32], post[96];
  size_t klen = strlen(key);
  int nargs = s->ttl_s ? 6 : 4;
  snprintf(ttl, sizeof(ttl), "%u", s->ttl_s);
  int pl = snprintf(pre, sizeof(pre), "%s*%d\r\n$3\r\nSET\r\n$%zu\r\n",
                    ask_first ? "*1\r\n$6\r\nASKING\r\n" : "", nargs, klen);
  int ql = snprintf(pre + pl, sizeof(pre) - (size_t)pl, "\r\n$%zu\r\n",
                    hl + len);
  int tl = s->ttl_s ? snprintf(post, sizeof(post),
                               "\r\n$2\r\nNX\r\n$2\r\nEX\r\n$%zu\r\n%s\r\n",
                               strlen(ttl), ttl)
                    : snprintf(post, sizeof(post), "\r\n$2\r\nNX\r\n");
  struct iovec iov[6] = {{pre, (size_t)pl},
                         {(void *)key, klen},
                         {pre + pl, (size_t)ql},
                         {(void *)hdr, hl},
                         {(void *)payload, len},
                         {post, (size_t)tl}};
  rreply r[2];
  rpipe p = {r, 0, 2, NULL, 0, NULL, NULL, NULL};
  int nrep = ask_first ? 2 : 1, io = write_all(c->fd, iov, 6) < 0;
  c->reader->privdata = &p;
  for (int k = 0; k < nrep && !io; k++) {
    void *reply;
    io = redisGetReply(c, &reply) != REDIS_OK;
  }
  c->reader->privdata = NULL;
  if (io) {
    snprintf(why, sizeof(why), "%s", c->err ? c->errstr : strerror(errno));
    drop(set, node);
    node_failed(s, node);
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: SET %s: %s",
                               s->base.url, key, why);
  }
  rreply *res = &r[nrep - 1];
  if (is_redirect(res)) {
    *moved_to = redirect(s, res->text, ask);
    return 1;
  }
  if (res->type == REDIS_REPLY_NIL)
    return encache__store_fail(&s->base, ENCACHE_EEXIST, "%s: key exists",
                               s->base.url);
  if (res->type == REDIS_REPLY_STATUS)
    return 0;
  /* OOM, READONLY, ...: the write did not happen. */
  return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: SET %s: %s",
                             s->base.url, key, res->text);
}

static int redis_write(encache_store *st, const char *key, const void *hdr,
                       size_t hl, const void *payload, size_t len) {
  redis_store *s = (redis_store *)st;
  if (hl + len > 512ull << 20)
    return encache__store_fail(st, ENCACHE_ETOOLARGE,
                               "%s: %zu bytes: Redis values are at most "
                               "512 MiB", s->base.url, hl + len);
  rset *set = borrow(s);
  if (set == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  ensure_slots(s);
  size_t node = route(s, key);
  if (node == NO_NODE && refresh_slots(s) == 0)
    node = route(s, key);
  int rc = ENCACHE_EUNAVAIL, ask = 0;
  for (int round = 0; round < ROUNDS && node != NO_NODE; round++) {
    size_t moved = NO_NODE;
    rc = set_once(s, set, node, ask, key, hdr, hl, payload, len, &moved, &ask);
    if (rc != 1)
      break;
    node = moved;
    rc = encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: %s still redirected",
                             s->base.url, key);
  }
  if (node == NO_NODE)
    rc = encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: no node serves %s",
                             s->base.url, key);
  give_back(s, set);
  return rc;
}

static int redis_remove(encache_store *st, const char *key) {
  redis_store *s = (redis_store *)st;
  rset *set = borrow(s);
  if (set == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  ensure_slots(s);
  size_t node = route(s, key);
  int rc = ENCACHE_EUNAVAIL;
  char why[512] = "no node serves the key";
  for (int round = 0; round < ROUNDS && node != NO_NODE; round++) {
    redisContext *c = conn(s, set, node, why, sizeof(why));
    if (c == NULL)
      break;
    rreply r;
    const char *argv[2] = {"DEL", key};
    if (simple_command(c, 2, argv, &r) < 0) {
      snprintf(why, sizeof(why), "%s", c->errstr);
      drop(set, node);
      node_failed(s, node);
      break;
    }
    if (is_redirect(&r)) {
      int ask;
      node = redirect(s, r.text, &ask);
      continue;
    }
    rc = r.type == REDIS_REPLY_INTEGER ? (r.integer > 0 ? 0 : ENCACHE_ENOENT)
                                       : ENCACHE_EUNAVAIL;
    snprintf(why, sizeof(why), "%s", r.type == REDIS_REPLY_INTEGER
                                         ? "no such key" : r.text);
    break;
  }
  give_back(s, set);
  return rc == 0 ? 0 : encache__store_fail(st, rc, "%s: DEL %s: %s",
                                           s->base.url, key, why);
}

/* ------------------------------------------------------- list and stats */

/* The distinct nodes that own slots (single node: node 0). */
static size_t masters(redis_store *s, size_t *out) {
  if (!s->cluster) {
    out[0] = 0;
    return 1;
  }
  ensure_slots(s);
  size_t m = 0;
  pthread_mutex_lock(&s->mu);
  for (size_t k = 0; k < NSLOTS; k++) {
    size_t node = s->slots[k], j;
    if (node == NO_NODE)
      continue;
    for (j = 0; j < m && out[j] != node; j++)
      ;
    if (j == m)
      out[m++] = node;
  }
  pthread_mutex_unlock(&s->mu);
  return m;
}

static int redis_list(encache_store *st, const char *pattern,
                      int (*cb)(const char *key, uint64_t len, void *arg),
                      void *arg) {
  redis_store *s = (redis_store *)st;
  size_t nodes[MAX_NODES];
  size_t m = masters(s, nodes);
  if (m == 0)
    return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: no node known",
                               s->base.url);
  for (size_t k = 0; k < m; k++) {
    char why[512];
    redisContext *c = dial(s, nodes[k], 1, why, sizeof(why));
    if (c == NULL)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: %s", s->base.url,
                                 why);
    char cursor[32] = "0";
    int stop = 0;
    do {
      redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor,
                                   pattern ? pattern : "*");
      if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        if (r)
          freeReplyObject(r);
        redisFree(c);
        return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: SCAN failed",
                                   s->base.url);
      }
      snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
      redisReply *keys = r->element[1];
      for (size_t i = 0; i < keys->elements; i++)
        redisAppendCommand(c, "STRLEN %b", keys->element[i]->str,
                           (size_t)keys->element[i]->len);
      for (size_t i = 0; i < keys->elements; i++) {
        redisReply *len = NULL;
        if (redisGetReply(c, (void **)&len) != REDIS_OK) {
          freeReplyObject(r);
          redisFree(c);
          return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: STRLEN failed",
                                     s->base.url);
        }
        if (!stop && len->type == REDIS_REPLY_INTEGER)
          stop = cb(keys->element[i]->str, (uint64_t)len->integer, arg);
        freeReplyObject(len);
      }
      freeReplyObject(r);
    } while (!stop && strcmp(cursor, "0") != 0);
    redisFree(c);
    if (stop)
      return stop;
  }
  return 0;
}

static uint64_t info_field(const char *info, const char *name) {
  const char *p = strstr(info, name);
  return p ? strtoull(p + strlen(name), NULL, 10) : 0;
}

static int redis_stats(encache_store *st, encache_store_stats *out) {
  redis_store *s = (redis_store *)st;
  size_t nodes[MAX_NODES];
  size_t m = masters(s, nodes);
  out->objects = out->bytes_used = out->evictions = 0;
  out->capacity = 0;
  for (size_t k = 0; k < m; k++) {
    char why[512];
    redisContext *c = dial(s, nodes[k], 1, why, sizeof(why));
    if (c == NULL)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: %s", s->base.url,
                                 why);
    redisReply *info = redisCommand(c, "INFO");
    redisReply *size = redisCommand(c, "DBSIZE");
    if (info && info->type == REDIS_REPLY_STRING) {
      out->bytes_used += info_field(info->str, "\nused_memory:");
      out->evictions += info_field(info->str, "\nevicted_keys:");
      uint64_t max = info_field(info->str, "\nmaxmemory:");
      out->capacity = max == 0 || out->capacity == UINT64_MAX
                          ? UINT64_MAX
                          : out->capacity + max;
    }
    if (size && size->type == REDIS_REPLY_INTEGER)
      out->objects += (uint64_t)size->integer;
    int ok = info && size && info->type == REDIS_REPLY_STRING;
    if (info)
      freeReplyObject(info);
    if (size)
      freeReplyObject(size);
    redisFree(c);
    if (!ok)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: INFO failed",
                                 s->base.url);
  }
  out->reinsertions = out->repairs = UINT64_MAX;
  return 0;
}

static void redis_close(encache_store *st) {
  redis_store *s = (redis_store *)st;
  while (s->free_sets != NULL) {
    rset *set = s->free_sets;
    s->free_sets = set->next;
    for (size_t i = 0; i < MAX_NODES; i++)
      drop(set, i);
    encache__free(set);
  }
  pthread_mutex_destroy(&s->mu);
  encache__free(s->slots);
  encache__free(s->user);
  encache__free(s->password);
  encache__free(s->base.url);
  encache__free(s);
}

static const encache__store_ops redis_ops = {
    .kind = "redis",
    .exists = redis_exists,
    .read = redis_read,
    .read_split = redis_read_split,
    .object_size = redis_object_size,
    .write = redis_write,
    .remove = redis_remove,
    .list = redis_list,
    .stats = redis_stats,
    .close = redis_close};

/* ------------------------------------------------------------------ open */

/* Adds "host:port" as a node; returns 0 or -1. */
static int add_hostport(redis_store *s, const char *hp, size_t len) {
  char buf[300];
  if (len == 0 || len >= sizeof(buf))
    return -1;
  memcpy(buf, hp, len);
  buf[len] = '\0';
  char *colon = strrchr(buf, ':');
  if (colon == NULL || colon == buf)
    return -1;
  *colon = '\0';
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    return -1;
  return node_index(s, buf, (int)port) == NO_NODE ? -1 : 0;
}

int encache__redis_open(const char *url, encache_store **out) {
  *out = NULL;
  redis_store *s = encache__calloc(1, sizeof(*s));
  if (s == NULL || (s->base.url = encache__strdup(url)) == NULL) {
    encache__free(s);
    return ENCACHE_ENOMEM;
  }
  s->base.ops = &redis_ops;
  pthread_mutex_init(&s->mu, NULL);
  s->connect_timeout_ms = 1000;
  s->timeout_ms = 1000;
  *out = &s->base;

  const char *rest;
  int unix_sock = 0;
  if (strncmp(url, "redis-cluster://", 16) == 0) {
    s->cluster = 1;
    rest = url + 16;
  } else if (strncmp(url, "redis://", 8) == 0) {
    rest = url + 8;
  } else {
    unix_sock = 1;
    rest = url + 7; /* unix:// */
  }
  const char *q = strchr(rest, '?');
  size_t hlen = q ? (size_t)(q - rest) : strlen(rest);
  const char *at = memchr(rest, '@', hlen);
  if (at != NULL && !unix_sock) {
    const char *colon = memchr(rest, ':', (size_t)(at - rest));
    const char *pw = colon ? colon + 1 : rest;
    size_t pwlen = (size_t)(at - pw);
    if (colon != NULL && colon > rest) {
      s->user = encache__malloc((size_t)(colon - rest) + 1);
      if (s->user) {
        memcpy(s->user, rest, (size_t)(colon - rest));
        s->user[colon - rest] = '\0';
      }
    }
    s->password = encache__malloc(pwlen + 1);
    if (s->password) {
      memcpy(s->password, pw, pwlen);
      s->password[pwlen] = '\0';
    }
    hlen -= (size_t)(at + 1 - rest);
    rest = at + 1;
  }
  if (unix_sock) {
    if (hlen == 0 || rest[0] != '/' || hlen >= sizeof(s->nodes[0].host))
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: expected unix:///path/to/socket", url);
    memcpy(s->nodes[0].host, rest, hlen);
    s->nodes[0].host[hlen] = '\0';
    s->nnodes = 1;
  } else if (s->cluster) {
    for (const char *p = rest; p < rest + hlen;) {
      const char *comma = memchr(p, ',', (size_t)(rest + hlen - p));
      size_t l = comma ? (size_t)(comma - p) : (size_t)(rest + hlen - p);
      if (add_hostport(s, p, l) < 0)
        return encache__store_fail(&s->base, ENCACHE_EURL,
                                   "%s: seed '%.*s' is not host:port", url,
                                   (int)l, p);
      p += l + (comma ? 1 : 0);
    }
    s->nseeds = s->nnodes;
    if (s->nseeds == 0)
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: expected host:port[,host:port...]", url);
    if ((s->slots = encache__malloc(NSLOTS * sizeof(uint16_t))) == NULL)
      return ENCACHE_ENOMEM;
    for (size_t k = 0; k < NSLOTS; k++)
      s->slots[k] = NO_NODE;
    s->need_refresh = 1;
  } else {
    const char *slash = memchr(rest, '/', hlen);
    size_t hp = slash ? (size_t)(slash - rest) : hlen;
    if (add_hostport(s, rest, hp) < 0)
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: expected redis://[user:password@]host:"
                                 "port[/db]", url);
    if (slash != NULL) {
      char *end;
      long db = strtol(slash + 1, &end, 10);
      if (end != rest + hlen || end == slash + 1 || db < 0 || db > 65535)
        return encache__store_fail(&s->base, ENCACHE_EURL,
                                   "%s: the database must be a number", url);
      s->db = (int)db;
    }
  }
  encache__query qs = {q ? q + 1 : NULL};
  char k[64], v[64];
  int rc;
  while ((rc = encache__query_next(&qs, k, sizeof(k), v, sizeof(v))) > 0) {
    char *end;
    unsigned long val = strtoul(v, &end, 10);
    int number = end != v && *end == '\0' && val <= 86400000ul;
    unsigned *field = strcmp(k, "connect_timeout_ms") == 0 ? &s->connect_timeout_ms
                      : strcmp(k, "timeout_ms") == 0      ? &s->timeout_ms
                      : strcmp(k, "ttl_s") == 0           ? &s->ttl_s
                                                          : NULL;
    if (field == NULL && !(unix_sock && strcmp(k, "db") == 0))
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: unknown option '%s' (known: "
                                 "connect_timeout_ms, timeout_ms, ttl_s%s)",
                                 url, k, unix_sock ? ", db" : "");
    if (!number || (field != &s->ttl_s && val == 0) ||
        (field == NULL && val > 65535))
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: %s=%s: must be a %s number", url, k, v,
                                 field == &s->ttl_s ? "non-negative"
                                                    : "positive");
    if (field != NULL)
      *field = (unsigned)val;
    else
      s->db = (int)val;
  }
  if (rc < 0)
    return encache__store_fail(&s->base, ENCACHE_EURL,
                               "%s: malformed query (use ?key=value&...)", url);
  return 0;
}
