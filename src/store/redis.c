/*
 * redis.c: Redis / Valkey as a Store, single node or Redis Cluster, on
 * hiredis.
 *
 * URLs (docs/stores.md):
 *   redis://[user:password@]host:port[/db][?options]
 *   unix:///path/to/socket[?db=N&options]
 *   redis-cluster://[user:password@]host:port[,host:port...][?options]
 * options: connect_timeout_ms, timeout_ms (the deadline of each exchange
 * with a node), ttl_s (expiry of written objects; 0 = none).
 *
 * Connections.  hiredis contexts are not thread-safe and the engine uses
 * its Store from two threads, so a handle keeps a pool of connection sets
 * (one context per node in each set); an operation borrows a set, uses it
 * and gives it back.  Contexts are made lazily.  A pooled context is
 * reused only if it is idle and clean (nothing readable: a server that
 * closed it while idle is noticed before we send); one that the server
 * closed unanswered anyway (EOF or reset before any byte of reply) is
 * redialled once, at once, and the exchange sent again.  A node that fails
 * otherwise (refused, reset mid-reply, deadline, protocol error) has its
 * contexts dropped and is left alone for a backoff (100 ms doubling to
 * 2 s), during which its keys answer "unavailable" at once rather than
 * wait on a connect timeout.
 *
 * I/O.  hiredis only connects and parses: we send (sendmsg() with
 * MSG_NOSIGNAL, so a closed connection is an error and never a SIGPIPE,
 * whatever the application's signal settings) and we receive and feed its
 * reader.  Every exchange (one pipeline, or one write) has one deadline,
 * computed before its first byte is sent: timeout_ms, plus 250 ms per MiB
 * that the exchange may move; every wait polls with the time left, and
 * for at most timeout_ms with no byte moving, so a server that trickles
 * cannot stretch a command and one that stops fails in timeout_ms.  Before each read the
 * reply being parsed is checked against its bound (check_bounds()): a
 * value larger than the caller's buffer (beyond a small slack) is refused
 * from its "$<length>" header, before its body is read; any other line is
 * at most 64 KiB; ordinary replies (CLUSTER SLOTS, SCAN, INFO) are bounded
 * in strings, elements and total bytes.  A refusal drops the connection:
 * a context is never reused mid-reply.
 *
 * Replies.  Every pooled context reads with our own hiredis reply
 * functions: a bulk string is copied from hiredis's read buffer straight
 * into the caller's buffer (header and payload split when asked), or
 * refused as too large, with no reply object and no other copy.  Writes
 * send SET key value NX [EX ttl] from the caller's header and payload, so
 * the value is not copied either.  Commands that answer arrays (CLUSTER
 * SLOTS, SCAN) use a short-lived context with hiredis's ordinary replies.
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
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NSLOTS 16384
#define NO_NODE 0xffffu
#define MAX_NODES 1024
#define ROUNDS 3

/* What a server may send (docs/stores.md, "Misbehaving servers"). */
#define LINE_MAX_BYTES (64u << 10)  /* a status, error or integer line */
#define SLACK_BYTES (64u << 10)     /* a value at most this much larger than
                                       its buffer is read and discarded; a
                                       larger one is refused unread */
#define PLAIN_BULK_MAX (4u << 20)   /* one string of an ordinary reply */
#define PLAIN_ELEMENTS_MAX (1 << 20) /* one array of an ordinary reply */
#define PLAIN_TOTAL_MAX (64u << 20) /* the ordinary replies of an exchange */
#define MS_PER_MIB 250 /* deadline allowance per MiB moved: 4 MB/s at least
                          (a stall fails sooner: timeout_ms with no byte) */
/* A listing stops with an error after 64 + DBSIZE/100 SCAN calls or
 * 2 x DBSIZE + 100000 keys on a node (DBSIZE taken as at most 16 Mi). */
#define LIST_CALLS_MIN 64
#define LIST_KEYS_SLACK 100000
#define LIST_DBSIZE_MAX (16u << 20)

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
  const char *bad;      /* why a reply function stopped the reader */
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

/* None of the commands we pipeline answers an array: refuse it (hiredis
 * stops with an error and the connection is dropped) rather than read an
 * array of any size into the dummy. */
static void *rf_array(const redisReadTask *task, int n) {
  (void)n;
  rpipe *p = task->privdata;
  if (p != NULL)
    p->bad = "an array where a value was expected";
  return NULL;
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

/* Ordinary replies: hiredis's own functions (taken from a reader it made),
 * with arrays bounded in elements. */
static redisReplyObjectFunctions hiredis_fns, plain_fns;
static pthread_once_t plain_once = PTHREAD_ONCE_INIT;

static void *pl_array(const redisReadTask *task, int n) {
  if (n > PLAIN_ELEMENTS_MAX) {
    rpipe *p = task->privdata;
    if (p != NULL)
      p->bad = "an array of more than 1048576 elements";
    return NULL;
  }
  return hiredis_fns.createArray(task, n);
}

static void plain_init(void) {
  redisReader *r = redisReaderCreate();
  if (r == NULL)
    return; /* plain_fns stays empty: dial() says out of memory */
  hiredis_fns = *r->fn;
  redisReaderFree(r);
  plain_fns = hiredis_fns;
  plain_fns.createArray = pl_array;
}

/* ------------------------------------------------------------------- I/O */

enum {
  XR_OK,
  XR_STALE,  /* closed or reset before any byte of reply: nothing answered */
  XR_FAIL,   /* deadline, reset mid-reply, protocol error, a bound */
  XR_TOOBIG  /* a value over what its item's buffer takes: refused unread */
};

/* a + b, or UINT64_MAX (sizes come from the caller). */
static uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The time bounds of an exchange: its deadline, and how long it may wait
 * with no byte moving either way (a stopped server fails in idle_ms even
 * when a large transfer has a later deadline). */
typedef struct xtime {
  uint64_t deadline;
  unsigned idle_ms;
} xtime;

/* The bounds of an exchange that may move `bytes` bytes. */
static xtime deadline_after(const redis_store *s, uint64_t bytes) {
  xtime t = {now_ms() + s->timeout_ms + (bytes >> 20) * MS_PER_MIB, /* < 2^48 */
             s->timeout_ms};
  return t;
}

/* Waits until fd is ready for events, at most until the deadline and for
 * idle_ms.  Returns 0, or -1 with errno (ETIMEDOUT). */
static int wait_fd(int fd, short events, xtime t) {
  uint64_t end = now_ms() + t.idle_ms;
  if (end > t.deadline)
    end = t.deadline;
  for (;;) {
    uint64_t now = now_ms();
    if (now >= end) {
      errno = ETIMEDOUT;
      return -1;
    }
    uint64_t left = end - now;
    struct pollfd pfd = {fd, events, 0};
    int r = poll(&pfd, 1, left > INT_MAX ? INT_MAX : (int)left);
    if (r > 0)
      return 0; /* ready, or an error the next call reports */
    if (r < 0 && errno != EINTR)
      return -1;
  }
}

/* Sends all of iov (modified) before the deadline. */
static int send_all(int fd, struct iovec *iov, int cnt, xtime deadline) {
  while (cnt > 0) {
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)(cnt > IOV_MAX ? IOV_MAX : cnt);
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if ((errno != EAGAIN && errno != EWOULDBLOCK) ||
          wait_fd(fd, POLLOUT, deadline) < 0)
        return -1;
      continue;
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

/*
 * Called when the reader needs more bytes: refuses the reply being parsed
 * if it already exceeds its bound, before its body is read.  hiredis has
 * consumed the type byte of the item it is parsing, so a bulk string's
 * length is at the read position; a value for an item with a buffer may
 * be split + cap + SLACK_BYTES long (XR_TOOBIG beyond), anything else has
 * the bounds of its kind.
 */
static int check_bounds(redisReader *rd, const rpipe *p, int plain, char *why,
                        size_t whysize) {
  size_t buffered = rd->len - rd->pos;
  if (rd->ridx >= 0 && rd->rstack[rd->ridx].type == REDIS_REPLY_STRING) {
    const char *h = rd->buf + rd->pos;
    const char *cr = memchr(h, '\r', buffered);
    if (cr != NULL) {
      uint64_t len = 0;
      int digits = 0;
      for (const char *d = h; d < cr && *d >= '0' && *d <= '9' && digits < 19;
           d++, digits++)
        len = len * 10 + (uint64_t)(*d - '0');
      size_t item = SIZE_MAX;
      uint64_t limit = plain ? PLAIN_BULK_MAX : LINE_MAX_BYTES;
      if (!plain && rd->rstack[rd->ridx].parent == NULL && p->bufs != NULL &&
          p->item != NULL && p->next < p->cap &&
          (item = p->item[p->next]) != SIZE_MAX)
        limit = sat_add(sat_add(p->split, p->caps[item]), SLACK_BYTES);
      if (digits > 0 && len > limit) {
        snprintf(why, whysize, "a %" PRIu64 "-byte value where at most %"
                 PRIu64 " fit: refused unread", len, limit);
        return item != SIZE_MAX ? XR_TOOBIG : XR_FAIL;
      }
      return XR_OK; /* its body is coming, within bounds */
    }
  }
  if (buffered > LINE_MAX_BYTES) {
    snprintf(why, whysize, "a reply line longer than %u bytes",
             LINE_MAX_BYTES);
    return XR_FAIL;
  }
  return XR_OK;
}

/* Reads nrep replies (ordinary ones into out when out is not NULL) before
 * the deadline. */
static int recv_replies(redisContext *c, const rpipe *p, void **out,
                        size_t nrep, xtime deadline, char *why,
                        size_t whysize) {
  redisReader *rd = c->reader;
  char chunk[16384];
  uint64_t received = 0;
  for (size_t got = 0; got < nrep;) {
    void *reply = NULL;
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
      snprintf(why, whysize, "protocol error: %s",
               p->bad ? p->bad : rd->errstr);
      return XR_FAIL;
    }
    if (reply != NULL) {
      if (out != NULL)
        out[got] = reply;
      got++;
      continue;
    }
    int b = check_bounds(rd, p, out != NULL, why, whysize);
    if (b != XR_OK)
      return b;
    ssize_t r = recv(c->fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (r > 0) {
      received += (uint64_t)r;
      if (out != NULL && received > PLAIN_TOTAL_MAX) {
        snprintf(why, whysize, "replies longer than %u bytes",
                 PLAIN_TOTAL_MAX);
        return XR_FAIL;
      }
      if (redisReaderFeed(rd, chunk, (size_t)r) != REDIS_OK) {
        snprintf(why, whysize, "out of memory");
        return XR_FAIL;
      }
      continue;
    }
    if (r == 0) {
      snprintf(why, whysize, "connection closed by the server%s",
               received ? " mid-reply" : "");
      return received ? XR_FAIL : XR_STALE;
    }
    if (errno == EINTR)
      continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) &&
        wait_fd(c->fd, POLLIN, deadline) == 0)
      continue;
    int e = errno;
    if (e == ETIMEDOUT)
      snprintf(why, whysize, "timed out (%" PRIu64 " bytes of reply in time)",
               received);
    else
      snprintf(why, whysize, "%s", strerror(e));
    return received == 0 && (e == ECONNRESET || e == EPIPE) ? XR_STALE
                                                             : XR_FAIL;
  }
  return XR_OK;
}

/* Sends iov (modified) on c and reads nrep replies: ours into p, or
 * ordinary ones into out (NULLs on failure).  Returns an XR_ code; why
 * says what failed. */
static int exchange(redisContext *c, struct iovec *iov, int cnt, size_t nrep,
                    rpipe *p, void **out, xtime deadline, char *why,
                    size_t whysize) {
  int x;
  if (send_all(c->fd, iov, cnt, deadline) < 0) {
    int e = errno;
    snprintf(why, whysize, "%s",
             e == ETIMEDOUT ? "timed out sending" : strerror(e));
    x = e == EPIPE || e == ECONNRESET ? XR_STALE : XR_FAIL;
  } else {
    c->reader->privdata = p;
    x = recv_replies(c, p, out, nrep, deadline, why, whysize);
    c->reader->privdata = NULL;
  }
  for (size_t k = 0; x != XR_OK && out != NULL && k < nrep; k++)
    if (out[k] != NULL) {
      freeReplyObject(out[k]);
      out[k] = NULL;
    }
  return x;
}

/* A growing buffer of RESP commands. */
typedef struct obuf {
  char *p;
  size_t len, cap;
  int oom;
} obuf;

static void ob_put(obuf *b, const void *d, size_t n) {
  if (b->oom)
    return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n && cap < SIZE_MAX / 2)
      cap *= 2;
    char *np = cap - b->len < n ? NULL : encache__realloc(b->p, cap);
    if (np == NULL) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}

/* Appends a command; lens NULL = C strings. */
static void ob_cmd(obuf *b, int argc, const char *const *argv,
                   const size_t *lens) {
  char num[32];
  ob_put(b, num, (size_t)snprintf(num, sizeof(num), "*%d\r\n", argc));
  for (int i = 0; i < argc; i++) {
    size_t n = lens ? lens[i] : strlen(argv[i]);
    ob_put(b, num, (size_t)snprintf(num, sizeof(num), "$%zu\r\n", n));
    ob_put(b, argv[i], n);
    ob_put(b, "\r\n", 2);
  }
}

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

/* Opens a context to node, with AUTH and SELECT; it reads with our reply
 * functions, or with ordinary (bounded) ones when plain_replies.  Sets
 * *why on failure. */
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
  pthread_once(&plain_once, plain_init);
  if (plain_fns.createString == NULL) {
    snprintf(why, whysize, "out of memory");
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
  /* TCP only: on a Unix socket hiredis fails to set it (TCP_KEEPIDLE) and
   * marks the context as failed. */
  if (n.port != 0)
    redisEnableKeepAlive(c);
  c->reader->fn = &reply_fns;
  /* AUTH and SELECT, pipelined, before anything else. */
  char db[16];
  snprintf(db, sizeof(db), "%d", s->db);
  const char *auth[3] = {"AUTH", s->user ? s->user : s->password, s->password};
  const char *sel[2] = {"SELECT", db};
  const char *what[2];
  size_t nrep = 0;
  obuf b = {NULL, 0, 0, 0};
  if (s->password != NULL) {
    ob_cmd(&b, s->user ? 3 : 2, auth, NULL);
    what[nrep++] = "AUTH";
  }
  if (s->db != 0) {
    ob_cmd(&b, 2, sel, NULL);
    what[nrep++] = "SELECT";
  }
  int bad = b.oom;
  if (bad)
    snprintf(why, whysize, "out of memory");
  if (nrep > 0 && !bad) {
    rreply r[2];
    rpipe p = {r, 0, nrep, NULL, 0, NULL, NULL, NULL, NULL};
    struct iovec iov = {b.p, b.len};
    char xwhy[256];
    if (exchange(c, &iov, 1, nrep, &p, NULL, deadline_after(s, 0), xwhy,
                 sizeof(xwhy)) != XR_OK) {
      bad = 1;
      snprintf(why, whysize, "%s: %s", what[p.next < nrep ? p.next : 0],
               xwhy);
    }
    for (size_t k = 0; k < nrep && !bad; k++)
      if (r[k].type == REDIS_REPLY_ERROR) {
        bad = 1;
        snprintf(why, whysize, "%s: %.200s", what[k], r[k].text);
      }
  }
  encache__free(b.p);
  if (plain_replies)
    c->reader->fn = &plain_fns;
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

/* A pooled context is reused only when idle and clean: nothing readable
 * (a server that closed it shows as readable: EOF; stray bytes of an
 * earlier reply too) and nothing left in its reader. */
static int still_idle(redisContext *c) {
  if (c->err || c->reader->err || c->reader->len > c->reader->pos)
    return 0;
  struct pollfd pfd = {c->fd, POLLIN, 0};
  return poll(&pfd, 1, 0) == 0;
}

/* The set's context to node, dialled when needed; *reused says whether it
 * is a pooled one (which the server may have closed since). */
static redisContext *conn(redis_store *s, rset *set, size_t node, int *reused,
                          char *why, size_t whysize) {
  ENCACHE_ASSERT(node < MAX_NODES);
  if (set->conns[node] != NULL && !still_idle(set->conns[node]))
    drop(set, node);
  *reused = set->conns[node] != NULL;
  if (set->conns[node] == NULL)
    set->conns[node] = dial(s, node, 0, why, whysize);
  return set->conns[node];
}

/*
 * Runs one exchange (iov, answered by nrep replies into p) on the set's
 * context to node.  A pooled context that the server closed without
 * answering anything (an idle timeout, CLIENT KILL, a restart, a proxy)
 * is redialled once, at once, and the exchange sent again: safe, because
 * nothing was answered and what we pipeline is idempotent (reads) or
 * SET NX (see set_once()).  On failure the context is dropped, and the
 * node backs off unless the failure was a value refused as too large.
 * Returns XR_OK, XR_TOOBIG or XR_FAIL; why says what failed.
 */
static int run_on(redis_store *s, rset *set, size_t node,
                  const struct iovec *iov, int cnt, size_t nrep, rpipe *p,
                  xtime deadline, char *why, size_t whysize) {
  int x = XR_FAIL;
  p->next = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    int reused;
    redisContext *c = conn(s, set, node, &reused, why, whysize);
    if (c == NULL)
      return XR_FAIL; /* dial() started the backoff */
    struct iovec v[8];
    ENCACHE_ASSERT(cnt <= 8);
    memcpy(v, iov, (size_t)cnt * sizeof(*v));
    p->next = 0;
    p->bad = NULL;
    x = exchange(c, v, cnt, nrep, p, NULL, deadline, why, whysize);
    if (x == XR_OK)
      return XR_OK;
    drop(set, node);
    if (x != XR_STALE || !reused)
      break;
  }
  if (x == XR_TOOBIG)
    return XR_TOOBIG;
  node_failed(s, node);
  return XR_FAIL;
}

/* Sends argv to a context of ordinary replies and reads nrep of them into
 * out.  Returns an XR_ code. */
static int plain_command(redis_store *s, redisContext *c, const obuf *b,
                         size_t nrep, void **out, char *why, size_t whysize) {
  for (size_t k = 0; k < nrep; k++)
    out[k] = NULL;
  if (b->oom) {
    snprintf(why, whysize, "out of memory");
    return XR_FAIL;
  }
  struct iovec iov = {b->p, b->len};
  rpipe p;
  memset(&p, 0, sizeof(p));
  return exchange(c, &iov, 1, nrep, &p, out, deadline_after(s, 0), why,
                  whysize);
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
  static const char *const cmd[2] = {"CLUSTER", "SLOTS"};
  for (size_t i = 0; i < n; i++) {
    redisContext *c = dial(s, i, 1, why, sizeof(why));
    if (c == NULL)
      continue;
    obuf b = {NULL, 0, 0, 0};
    ob_cmd(&b, 2, cmd, NULL);
    void *out[1];
    char xwhy[256];
    int x = plain_command(s, c, &b, 1, out, xwhy, sizeof(xwhy));
    encache__free(b.p);
    redisReply *r = out[0];
    if (x != XR_OK || r->type != REDIS_REPLY_ARRAY) {
      snprintf(why, sizeof(why), "CLUSTER SLOTS: %s",
               x != XR_OK ? xwhy
               : r->type == REDIS_REPLY_ERROR ? r->str
                                              : "not an array");
      if (r != NULL)
        freeReplyObject(r);
      redisFree(c);
      if (x != XR_OK)
        node_failed(s, i);
      continue;
    }
    pthread_mutex_lock(&s->mu);
    for (size_t k = 0; k < NSLOTS; k++)
      s->slots[k] = NO_NODE;
    for (size_t e = 0; e < r->elements; e++) {
      redisReply *range = r->element[e];
      /* [first slot, last slot, [host, port, ...], replicas...] */
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
          range->element[0]->type != REDIS_REPLY_INTEGER ||
          range->element[1]->type != REDIS_REPLY_INTEGER ||
          range->element[2]->type != REDIS_REPLY_ARRAY ||
          range->element[2]->elements < 2)
        continue;
      redisReply *m = range->element[2];
      if (m->element[0]->type != REDIS_REPLY_STRING ||
          m->element[1]->type != REDIS_REPLY_INTEGER ||
          m->element[1]->integer <= 0 || m->element[1]->integer > 65535)
        continue;
      const char *host = m->element[0]->len > 0 ? m->element[0]->str
                                                : s->nodes[i].host;
      size_t idx = node_index(s, host, (int)m->element[1]->integer);
      long long lo = range->element[0]->integer, hi = range->element[1]->integer;
      for (long long k = lo < 0 ? 0 : lo; idx != NO_NODE && k <= hi && k < NSLOTS;
           k++)
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
  /* A value refused unread drops its connection: the keys behind it in the
   * pipeline go again, in an extra round (each refusal settles one key). */
  int extra = 0;
  for (int round = 0; round < ROUNDS + extra; round++) {
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
      obuf b = {NULL, 0, 0, 0};
      size_t nrep = 0;
      uint64_t want = 0;
      for (size_t k = 0; k < m; k++) {
        size_t i = order[k];
        if (ask[i]) {
          const char *a[1] = {"ASKING"};
          ob_cmd(&b, 1, a, NULL);
          item_of[nrep++] = SIZE_MAX;
        }
        const char *argv[2] = {verbs[op], keys[i]};
        ob_cmd(&b, 2, argv, NULL);
        item_of[nrep++] = i;
        if (op == OP_GET)
          want = sat_add(want, sat_add(split, caps[i]));
      }
      rpipe p = {replies, 0, nrep, item_of, split, op == OP_GET ? heads : NULL,
                 bufs, caps, NULL};
      char xwhy[256];
      struct iovec iov = {b.p, b.len};
      int x = b.oom ? XR_FAIL
                    : run_on(s, set, node, &iov, 1, nrep, &p,
                             deadline_after(s, want), xwhy, sizeof(xwhy));
      encache__free(b.p);
      if (x != XR_OK) {
        snprintf(why, sizeof(why), "%s: %s", verbs[op],
                 b.oom ? "out of memory" : xwhy);
        if (x == XR_TOOBIG && item_of[p.next] != SIZE_MAX) {
          results[item_of[p.next]] = ENCACHE_ETOOLARGE;
          extra++;
        } else {
          for (size_t k = p.next; k < nrep; k++)
            if (item_of[k] != SIZE_MAX)
              results[item_of[k]] = ENCACHE_EUNAVAIL;
        }
      }
      /* The replies that came, whatever happened after them. */
      for (size_t k = 0; k < p.next; k++) {
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

/*
 * SET key hdr+payload NX [EX ttl], straight from the caller's buffers.
 * Returns 0, ENCACHE_EEXIST, ENCACHE_EUNAVAIL, or 1 with *moved_to set
 * (and *ask) when redirected.
 *
 * A SET sent again on a redialled connection (run_on()) follows one that
 * got no byte of answer.  A server that closes an idle connection never
 * read that SET, but one killed or reset just after executing it may have
 * written the key: then the second SET NX finds it and we answer EEXIST
 * ("already there"), which is true: the object under the key is complete
 * and is the one we sent, or another writer's for the same key.
 */
static int set_once(redis_store *s, rset *set, size_t node, int ask_first,
                    const char *key, const void *hdr, size_t hl,
                    const void *payload, size_t len, size_t *moved_to,
                    int *ask) {
  char why[512] = "";
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
  size_t nrep = ask_first ? 2 : 1;
  rpipe p = {r, 0, nrep, NULL, 0, NULL, NULL, NULL, NULL};
  if (run_on(s, set, node, iov, 6, nrep, &p, deadline_after(s, hl + len), why,
             sizeof(why)) != XR_OK)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: SET %s: %s",
                               s->base.url, key, why);
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
    rreply r;
    const char *argv[2] = {"DEL", key};
    obuf b = {NULL, 0, 0, 0};
    ob_cmd(&b, 2, argv, NULL);
    rpipe p = {&r, 0, 1, NULL, 0, NULL, NULL, NULL, NULL};
    struct iovec iov = {b.p, b.len};
    int x = b.oom ? XR_FAIL
                  : run_on(s, set, node, &iov, 1, 1, &p, deadline_after(s, 0),
                           why, sizeof(why));
    encache__free(b.p);
    if (x != XR_OK) {
      if (b.oom)
        snprintf(why, sizeof(why), "out of memory");
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

/* The distinct nodes that own slots (single node: node 0) into out; *m
 * gets their count.  Returns 0 or ENCACHE_EUNAVAIL (no node known). */
static int masters(redis_store *s, size_t *out, size_t *m) {
  *m = 0;
  if (!s->cluster) {
    out[0] = 0;
    *m = 1;
    return 0;
  }
  int rc = ensure_slots(s);
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&s->mu);
  for (size_t k = 0; k < NSLOTS; k++) {
    size_t node = s->slots[k], j;
    if (node == NO_NODE)
      continue;
    for (j = 0; j < *m && out[j] != node; j++)
      ;
    if (j == *m)
      out[(*m)++] = node;
  }
  pthread_mutex_unlock(&s->mu);
  return *m > 0 ? 0
                : encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                      "%s: no node serves any slot",
                                      s->base.url);
}

/*
 * Lists one node's keys with SCAN and their sizes with pipelined STRLEN.
 * A server whose cursor never comes back to 0 is stopped by a bound on
 * calls and keys derived from its DBSIZE (see LIST_* above); an answer
 * that is not [cursor, [key strings...]] is refused.  Returns 0, the
 * callback's non-zero value, or ENCACHE_EUNAVAIL.
 */
static int list_node(redis_store *s, redisContext *c, const char *pattern,
                     int (*cb)(const char *key, uint64_t len, void *arg),
                     void *arg) {
  char why[512] = "", xwhy[256];
  void *one[2];
  obuf b = {NULL, 0, 0, 0};
  static const char *const dbsize_cmd[1] = {"DBSIZE"};
  ob_cmd(&b, 1, dbsize_cmd, NULL);
  int x = plain_command(s, c, &b, 1, one, xwhy, sizeof(xwhy));
  encache__free(b.p);
  if (x != XR_OK)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: DBSIZE: %s",
                               s->base.url, xwhy);
  redisReply *r = one[0];
  uint64_t dbsize = r->type == REDIS_REPLY_INTEGER && r->integer >= 0 &&
                            (uint64_t)r->integer < LIST_DBSIZE_MAX
                        ? (uint64_t)r->integer
                        : LIST_DBSIZE_MAX;
  freeReplyObject(r);
  uint64_t max_calls = LIST_CALLS_MIN + dbsize / 100;
  uint64_t max_keys = 2 * dbsize + LIST_KEYS_SLACK, calls = 0, seen = 0;
  char cursor[32] = "0";
  int stop = 0;
  do {
    if (++calls > max_calls || seen > max_keys) {
      snprintf(why, sizeof(why), "SCAN did not finish after %" PRIu64
               " calls and %" PRIu64 " keys (DBSIZE %" PRIu64 "): the "
               "server's cursor never comes back to 0", calls - 1, seen,
               dbsize);
      break;
    }
    const char *scan[6] = {"SCAN", cursor, "MATCH", pattern ? pattern : "*",
                           "COUNT", "1000"};
    b.len = 0;
    b.p = NULL;
    b.cap = 0;
    ob_cmd(&b, 6, scan, NULL);
    x = plain_command(s, c, &b, 1, one, xwhy, sizeof(xwhy));
    encache__free(b.p);
    r = one[0];
    if (x != XR_OK) {
      snprintf(why, sizeof(why), "SCAN: %s", xwhy);
      break;
    }
    redisReply *keys = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                               r->element[0]->type == REDIS_REPLY_STRING &&
                               r->element[0]->len < sizeof(cursor) &&
                               r->element[1]->type == REDIS_REPLY_ARRAY
                           ? r->element[1]
                           : NULL;
    for (size_t i = 0; keys != NULL && i < keys->elements; i++)
      if (keys->element[i]->type != REDIS_REPLY_STRING)
        keys = NULL;
    if (keys == NULL) {
      snprintf(why, sizeof(why), "SCAN: %s",
               r->type == REDIS_REPLY_ERROR
                   ? r->str
                   : "the answer is not a cursor and a list of key strings");
      freeReplyObject(r);
      break;
    }
    memcpy(cursor, r->element[0]->str, r->element[0]->len);
    cursor[r->element[0]->len] = '\0';
    seen += keys->elements;
    void **lens = keys->elements > 0
                      ? encache__calloc(keys->elements, sizeof(void *))
                      : NULL;
    b.len = 0;
    b.p = NULL;
    b.cap = 0;
    b.oom = keys->elements > 0 && lens == NULL;
    for (size_t i = 0; i < keys->elements; i++) {
      const char *argv[2] = {"STRLEN", keys->element[i]->str};
      size_t argl[2] = {6, keys->element[i]->len};
      ob_cmd(&b, 2, argv, argl);
    }
    if (keys->elements > 0 && lens == NULL) {
      x = XR_FAIL;
      snprintf(xwhy, sizeof(xwhy), "out of memory");
    } else {
      x = keys->elements == 0 ? XR_OK
                              : plain_command(s, c, &b, keys->elements, lens,
                                              xwhy, sizeof(xwhy));
    }
    encache__free(b.p);
    if (x != XR_OK)
      snprintf(why, sizeof(why), "STRLEN: %s", xwhy);
    for (size_t i = 0; x == XR_OK && i < keys->elements; i++) {
      redisReply *len = lens[i];
      if (!stop && len->type == REDIS_REPLY_INTEGER && len->integer >= 0)
        stop = cb(keys->element[i]->str, (uint64_t)len->integer, arg);
    }
    for (size_t i = 0; x == XR_OK && i < keys->elements; i++)
      freeReplyObject(lens[i]);
    encache__free(lens);
    freeReplyObject(r);
    if (x != XR_OK)
      break;
  } while (!stop && strcmp(cursor, "0") != 0);
  if (why[0])
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s",
                               s->base.url, why);
  return stop;
}

static int redis_list(encache_store *st, const char *pattern,
                      int (*cb)(const char *key, uint64_t len, void *arg),
                      void *arg) {
  redis_store *s = (redis_store *)st;
  size_t nodes[MAX_NODES], m;
  int rc = masters(s, nodes, &m);
  for (size_t k = 0; rc == 0 && k < m; k++) {
    char why[512];
    redisContext *c = dial(s, nodes[k], 1, why, sizeof(why));
    if (c == NULL)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: %s", s->base.url,
                                 why);
    rc = list_node(s, c, pattern, cb, arg);
    redisFree(c);
  }
  return rc;
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
  int rc = masters(s, nodes, &m);
  if (rc < 0)
    return rc;
  static const char *const info_cmd[1] = {"INFO"}, *const size_cmd[1] = {
                                                       "DBSIZE"};
  for (size_t k = 0; k < m; k++) {
    char why[512];
    redisContext *c = dial(s, nodes[k], 1, why, sizeof(why));
    if (c == NULL)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: %s", s->base.url,
                                 why);
    obuf b = {NULL, 0, 0, 0};
    ob_cmd(&b, 1, info_cmd, NULL);
    ob_cmd(&b, 1, size_cmd, NULL);
    void *rep[2];
    int x = plain_command(s, c, &b, 2, rep, why, sizeof(why));
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
               info->type == REDIS_REPLY_ERROR ? info->str
               : size->type == REDIS_REPLY_ERROR ? size->str
                                                 : "unexpected answer");
    }
    if (x == XR_OK) {
      freeReplyObject(info);
      freeReplyObject(size);
    }
    if (!ok)
      return encache__store_fail(st, ENCACHE_EUNAVAIL, "%s: INFO: %s",
                                 s->base.url, why);
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
    .size = sizeof(encache__store_ops),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "redis",
    .caps = ENCACHE_STORE_CAP_READ_SPLIT | ENCACHE_STORE_CAP_LIST |
            ENCACHE_STORE_CAP_PUT_IF_ABSENT | ENCACHE_STORE_CAP_SHARED,
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
