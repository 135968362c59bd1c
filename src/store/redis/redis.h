/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis.h: the private header of the Redis / Valkey Store, single node or
 * Redis Cluster, on hiredis.  The backend lives in this folder, one file
 * per concern:
 *   url.c      the URL, its options and the credentials (AUTH)
 *   conn.c     dialling (AUTH, SELECT, timeouts), the connection pool,
 *              node backoff, one exchange on a node with one redial
 *   io.c       our own I/O around the hiredis reader: deadlines, bounds,
 *              the reply functions that copy values into caller buffers
 *   cluster.c  key slots, the slot map (CLUSTER SLOTS), MOVED and ASK,
 *              one command for a key with its redirections followed
 *   ops.c      the Store operations (exists, read, write, remove, stats)
 *              and the ops table
 *   lease.c    single-flight leases: a key of their own, taken and
 *              renewed, dropped, by one script each (EVALSHA / EVAL)
 *   list.c     listing a node's keys (SCAN, STRLEN) and removing those
 *              under a prefix (SCAN, UNLINK), bounded
 *   wread.c    windowed reads of large objects (GETRANGE windows)
 *   wwrite.c   windowed writes of large objects (SETRANGE windows into
 *              a temporary key, RENAMENX into place)
 *   check.c    the key-bound check after each object (since 1.3): made
 *              by writers, verified by readers as they copy
 *
 * URLs (docs/stores.md):
 *   redis://[user:password@]host:port[/db][?options]
 *   unix:///path/to/socket[?db=N&options]
 *   redis-cluster://[user:password@]host:port[,host:port...][?options]
 * options: connect_timeout_ms, timeout_ms (the deadline of each exchange
 * with a node), ttl_s (expiry of written objects; 0 = none),
 * password_file (a file whose first line is the password), checksum
 * (on, off, required: see "Integrity" below).  The password
 * is the URL's, else password_file's, else $ENCACHE_REDIS_PASSWORD.  A
 * handle keeps the URL with its password redacted
 * (encache_store_url_redact()): no message ever shows the password.
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
 * cannot stretch a command and one that stops fails in timeout_ms.
 * Before each read the reply being parsed is checked against its bound
 * (check_bounds()): a value larger than the caller's buffer (beyond a small
 * slack) is refused from its "$<length>" header, before its body is read; any
 * other line is at most 64 KiB; ordinary replies (CLUSTER SLOTS, SCAN, INFO)
 * are bounded in strings, elements and total bytes.  A refusal drops the
 * connection: a context is never reused mid-reply.
 *
 * Replies.  Every pooled context reads with our own hiredis reply
 * functions: a bulk string is copied from hiredis's read buffer straight
 * into the caller's buffer (header and payload split when asked), or
 * refused as too large, with no reply object and no other copy; a GET's
 * value or a window longer than what the reader has buffered is received
 * by recv() straight into place instead (io.c, recv_direct).  Writes
 * send SET key value NX [EX ttl] from the caller's header and payload, so
 * the value is not copied either.  Commands that answer arrays (CLUSTER
 * SLOTS, SCAN) use a short-lived context with hiredis's ordinary replies.
 *
 * Cluster.  The slot map comes from CLUSTER SLOTS (seeds first); keys are
 * grouped per node and pipelined; MOVED updates the map (and a full
 * refresh follows), ASK is followed for that key with ASKING; up to three
 * rounds, then the key is unavailable.
 *
 * Windows.  A read whose destination (split + buffer) is larger than
 * window_threshold, and a write of more than window_threshold bytes, move
 * the object as a pipeline of windows of `window` bytes rather than one
 * GET or SET: large single replies and requests are slow on some machines
 * (docs/performance.md, "Redis Store vs raw hiredis"), and a window lands
 * straight in the caller's buffer (received there by recv(), io.c's
 * recv_direct, not through the hiredis reader).  The windowed keys of a
 * read on one node go as one stream, window_depth windows in flight, a
 * new one asked as each comes in: a key
 * asks EXISTS, STRLEN and its first window, then its other windows with
 * GETRANGE.  A value with a check (Integrity, below) needs nothing more:
 * its windows are summed as they land and its last GETRANGE reads the
 * check, which windows of two objects fail (a miss).  A value without
 * one (an older writer's, or checksum=off) has no such guard: its other
 * windows go window_depth per exchange, each exchange ends with
 * STRLEN, the last one reads the head and the tails of up to 64 windows
 * again, and any difference (length, head, tails, a short window) makes
 * the key a miss, never a hit of mixed bytes: objects are never changed
 * in place, only deleted and written again.  A write SETs the first window under a
 * temporary key in the final key's slot (a hash tag chosen for the slot),
 * with an expiry renewed at each exchange, SETRANGEs the others (the last
 * first: the string gets its length at once; every answer and the expiry
 * checked), then RENAMENX into place: the final key never holds a
 * partial object, an existing key is never replaced, a writer that dies
 * leaves a temporary that expires.  A redirection restarts the object on
 * the node it names.
 *
 * Integrity.  A v3 object is written with a 16-byte check after it (the
 * tag "ECK1", four zero bytes, and a digest of the key and the object:
 * the shm Store's sum of header and payload (sum.h), mixed with XXH3-64
 * of the key: docs/format.md); a value carries one exactly when
 * its header implies an object 16 bytes shorter than the value.  Readers
 * verify it while they copy (io.c's reply functions: a GET whole; the
 * windows of wread.c as they arrive) and return the object without it;
 * a value whose check fails is a miss (ENCACHE_ENOENT, the message says
 * why), so a tier never promotes it.  Values without a check (written by
 * an older encache, or with checksum=off) are served as they are, unless
 * checksum=required; the handle counts them (`unchecked`), so that an
 * operator sees how many hits nothing vouched for.
 *
 * Nothing here poisons: Redis never writes into our memory after a call
 * returns.  Every failure is recoverable (EUNAVAIL) or a plain answer.
 */
#ifndef ENCACHE_STORE_REDIS_H
#define ENCACHE_STORE_REDIS_H

#include "../base.h"

#include <hiredis/hiredis.h>
#include "sum.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define NSLOTS 16384
#define NO_NODE 0xffffu
#define MAX_NODES 1024
#define ROUNDS 3

/* What a server may send (docs/stores.md, "Misbehaving servers"). */
#define LINE_MAX_BYTES (64u << 10) /* a status, error or integer line */
#define SLACK_BYTES                                                            \
  (64u << 10)                        /* a value at most this much larger than  \
                                        its buffer is read and discarded; a    \
                                        larger one is refused unread */
/* Window defaults, measured (docs/performance.md, bench_redis). */
#define WINDOW_DEFAULT (1u << 20)
#define WINDOW_THRESHOLD_DEFAULT (4u << 20)
#define WINDOW_DEPTH_DEFAULT 8
#define WINDOW_MIN 64        /* the smallest window= */
#define WINDOW_DEPTH_MAX 16  /* the largest window_depth= */
#define RUN_IOV_MAX 64       /* iovecs of one exchange (3 per window + 2) */
#define PLAIN_BULK_MAX (4u << 20)    /* one string of an ordinary reply */
#define PLAIN_ELEMENTS_MAX (1 << 20) /* one array of an ordinary reply */
#define PLAIN_TOTAL_MAX (64u << 20)  /* the ordinary replies of an exchange */
#define MS_PER_MIB                                                             \
  250 /* deadline allowance per MiB moved: 4 MB/s at least                     \
         (a stall fails sooner: timeout_ms with no byte) */
/* A listing stops with an error after 64 + DBSIZE/100 SCAN calls or
 * 2 x DBSIZE + 100000 keys on a node (DBSIZE taken as at most 16 Mi), or
 * at the handle's list timeout (list.c). */
#define LIST_CALLS_MIN 64
#define LIST_KEYS_SLACK 100000
#define LIST_DBSIZE_MAX (16u << 20)
#define CHECK_BYTES 16 /* the check after an object (check.c) */

/* checksum= (docs/stores.md): what writers add, what readers accept. */
enum {
  CHECKSUM_ON,      /* write checks; verify them; serve values without one */
  CHECKSUM_OFF,     /* write none (older readers read them); verify, serve */
  CHECKSUM_REQUIRED /* write checks; a value without one is a miss */
};

typedef struct rnode {
  char host[256]; /* or the socket path */
  int port;       /* 0 = unix socket */
  uint64_t down_until_ms;
  unsigned backoff_ms;
} rnode;

/* One context per node; a set is used by one thread at a time. */
typedef struct rset {
  struct rset *next;
  redisContext *conns[MAX_NODES];
} rset;

typedef struct redis_store {
  encache_store base; /* base.url: the URL with its password redacted */
  int cluster;
  char *user, *password; /* AUTH [user] password; NULL = none */
  int db;
  unsigned connect_timeout_ms, timeout_ms, ttl_s;
  uint64_t window;           /* bytes of a window */
  uint64_t window_threshold; /* larger objects go in windows (0: all) */
  unsigned window_depth;     /* windows per exchange */
  int checksum;              /* CHECKSUM_* */
  /* Values this handle served without a check (not under
   * checksum=required), for the engine's hits_unchecked (atomic;
   * ENCACHE__CONTROL_UNCHECKED, base.h). */
  uint64_t unchecked;
  pthread_mutex_t mu; /* guards everything below */
  rnode nodes[MAX_NODES];
  size_t nnodes;
  size_t nseeds;   /* cluster: nodes[0..nseeds) came from the URL */
  uint16_t *slots; /* cluster: node per slot */
  int need_refresh;
  rset *free_sets;
} redis_store;

/* One reply of a pipeline, filled by the reply functions of io.c. */
typedef struct rreply {
  int type;
  long long integer;
  int64_t len;
  int too_large;
  int check;      /* a value read with its key's seed: CHECK_* */
  char text[200]; /* error or status text, truncated */
} rreply;

/* rreply.check */
enum { CHECK_NONE, CHECK_OK, CHECK_BAD, CHECK_SUMMED };

/* A growing buffer of RESP commands; oom is sticky. */
typedef struct obuf {
  char *p;
  size_t len, cap;
  int oom;
} obuf;

/* The pipeline being read: where each string reply goes. */
typedef struct rpipe {
  rreply *replies;
  size_t next, cap;
  const size_t *item; /* reply index -> item index (SIZE_MAX: none) */
  size_t split;
  void *const *heads; /* NULL: no copy */
  void *const *bufs;
  const size_t *caps;
  const char *bad; /* why a reply function stopped the reader */
  /* Integrity (check.c).  seeds (NULL: none): per item, the seed of its
   * key: a whole value (GET) that carries a check is verified as it is
   * copied, its len is the object's, and its check is not copied.  sums
   * (NULL: none): per item, the sum its bytes are fed to as they are
   * copied (NULL: none; the windows of a read, in order). */
  const uint64_t *seeds;
  sum_state *const *sums;
  /* Per item (NULL: none), for the first window of a value, the value's
   * length (its STRLEN; 0: not a first window, or not known): such an
   * item is fed to its sum only when its header says the value carries a
   * check and the window ends within the object (its reply's check is
   * then CHECK_SUMMED). */
  const uint64_t *vlens;
  /* Per item (NULL: split for every item), the bytes of its value that go
   * to its head; the rest go to its buf, at most caps[item] bytes. */
  const size_t *splits;
  /* The string replies of items are received straight into their buffers
   * (io.c, recv_direct), not through the hiredis reader. */
  int direct;
  /* A stream (NULL: none): called once before anything is sent (with
   * restart set: a start, or a start again on a new connection) and after
   * each reply, more() may append commands to *out (their replies and
   * items described in the pipe, whose arrays it may move, grow, and
   * shift down, next and cap with them, once their first replies are
   * taken) and returns how many replies have been asked in all; the
   * exchange ends when all of them are in.  out is sent as it grows (and
   * may be emptied once sent: out_sent with it). */
  size_t (*more)(struct rpipe *p);
  obuf *out;
  size_t out_sent;
  int restart;
  void *ctx;
} rpipe;

/* The outcome of an exchange. */
enum {
  XR_OK,
  XR_STALE, /* closed or reset before any byte of reply: nothing answered */
  XR_FAIL,  /* deadline, reset mid-reply, protocol error, a bound */
  XR_TOOBIG /* a value over what its item's buffer takes: refused unread */
};

/* The time bounds of an exchange: its deadline, and how long it may wait
 * with no byte moving either way (a stopped server fails in idle_ms even
 * when a large transfer has a later deadline). */
typedef struct xtime {
  uint64_t deadline;
  unsigned idle_ms;
} xtime;

static inline uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* a + b, or UINT64_MAX (sizes come from the caller). */
static inline uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline int is_redirect(const rreply *r) {
  return r->type == REDIS_REPLY_ERROR && (strncmp(r->text, "MOVED ", 6) == 0 ||
                                          strncmp(r->text, "ASK ", 4) == 0);
}

/* ------------------------------------------------------------- url.c */

/* Parses url into s (nodes, db, options, credentials); s->base.url must
 * already hold the redacted URL, which every message uses.  Returns 0 or
 * ENCACHE_EURL / ENCACHE_ENOMEM / -errno (password_file) with a message. */
int encache__redis_parse_url(redis_store *s, const char *url);

/* ------------------------------------------------------------- io.c */

/* hiredis reply functions: ours (values straight into caller buffers) or,
 * when plain, hiredis's own with arrays bounded.  NULL: out of memory. */
redisReplyObjectFunctions *encache__redis_replies(int plain);
/* The bounds of an exchange that may move `bytes` bytes. */
xtime encache__redis_deadline(const redis_store *s, uint64_t bytes);
/* Sends iov (modified) on c and reads nrep replies: ours into p, or
 * ordinary ones into out (NULLs on failure); a stream's (p->more) come
 * from more() instead.  Returns an XR_ code; why says what failed. */
int encache__redis_exchange(redisContext *c, struct iovec *iov, int cnt,
                            size_t nrep, rpipe *p, void **out, xtime deadline,
                            char *why, size_t whysize);
/* Appends n bytes to b. */
void encache__redis_put(obuf *b, const void *d, size_t n);
/* Appends a command to b; lens NULL = C strings. */
void encache__redis_cmd(obuf *b, int argc, const char *const *argv,
                        const size_t *lens);

/* ------------------------------------------------------------- conn.c */

void encache__redis_node_failed(redis_store *s, size_t node);
/* Opens a context to node, with AUTH and SELECT; it reads with our reply
 * functions, or with ordinary (bounded) ones when plain_replies.  Sets
 * why on failure. */
redisContext *encache__redis_dial(redis_store *s, size_t node,
                                  int plain_replies, char *why, size_t whysize);
rset *encache__redis_borrow(redis_store *s);
void encache__redis_give_back(redis_store *s, rset *set);
/* Closes every pooled context and frees the sets. */
void encache__redis_free_pool(redis_store *s);
/* One exchange on the set's context to node, redialled once if the
 * server closed it unanswered.  Returns XR_OK, XR_TOOBIG or XR_FAIL. */
int encache__redis_run_on(redis_store *s, rset *set, size_t node,
                          const struct iovec *iov, int cnt, size_t nrep,
                          rpipe *p, xtime deadline, char *why, size_t whysize);
/* Sends b to a context of ordinary replies and reads nrep of them into
 * out.  Returns an XR_ code. */
int encache__redis_plain(redis_store *s, redisContext *c, const obuf *b,
                         size_t nrep, void **out, char *why, size_t whysize);
/* One command (C-string arguments) on a context of ordinary replies; its
 * reply in *out (free it) on XR_OK. */
int encache__redis_plain1(redis_store *s, redisContext *c, int argc,
                          const char *const *argv, void **out, char *why,
                          size_t whysize);

/* ------------------------------------------------------------- cluster.c */

/* The node host:port, added if new (caller holds mu, or is opening);
 * NO_NODE when the table is full. */
size_t encache__redis_node_index(redis_store *s, const char *host, int port);
/* Reads CLUSTER SLOTS; returns 0 or ENCACHE_EUNAVAIL. */
int encache__redis_refresh_slots(redis_store *s);
/* The node that owns key (single node: 0); NO_NODE when unknown. */
size_t encache__redis_route(redis_store *s, const char *key);
/* The node of key, refreshing the slot map first if it is stale or the
 * key's slot has no node. */
size_t encache__redis_locate(redis_store *s, const char *key);
int encache__redis_ensure_slots(redis_store *s);
/* Redis Cluster's slot of key, hash tags included. */
unsigned encache__redis_key_slot(const char *key);
/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK ..."; returns the node, or
 * NO_NODE (unparsable, or a single-node Store: it follows none). */
size_t encache__redis_redirect(redis_store *s, const char *text, int *ask);
/* The distinct nodes that own slots (single node: node 0) into out. */
int encache__redis_masters(redis_store *s, size_t *out, size_t *m);
/* One command for key on its node, MOVED and ASK followed; its reply (never
 * a redirection) in *out.  Returns 0, or ENCACHE_EUNAVAIL / ENCACHE_ENOMEM
 * with why set. */
int encache__redis_command(redis_store *s, const char *key, int argc,
                           const char *const *argv, const size_t *lens,
                           rreply *out, char *why, size_t whysize);

/* ------------------------------------------------------------- lease.c */

/* The prefix of a lease's key: the lease of object K is LEASE_PREFIX K. */
#define LEASE_PREFIX "encache-lease:"
/* As encache_store_lease_take() and encache_store_lease_drop(). */
int encache__redis_lease_take(encache_store *st, const char *key,
                              uint64_t token, uint32_t ttl_ms);
int encache__redis_lease_drop(encache_store *st, const char *key,
                              uint64_t token);

/* ------------------------------------------------------------- list.c */

/* Both walk the node with SCAN until deadline at most (now_ms()'s
 * clock; 0: none; encache__store_list_deadline()). */
int encache__redis_list_node(
    redis_store *s, redisContext *c, const char *pattern, uint64_t deadline,
    int (*cb)(const char *key, uint64_t len, void *arg), void *arg);
/* UNLINKs the node's keys that start with prefix (SCAN MATCH with the
 * prefix escaped, each key compared again); adds their count to
 * *removed.  Returns 0 or ENCACHE_EUNAVAIL / ENCACHE_ENOMEM. */
int encache__redis_unlink_node(redis_store *s, redisContext *c,
                               const char *prefix, uint64_t deadline,
                               uint64_t *removed);

/* ------------------------------------------------------------- check.c */

/* XXH3-64 of the key: the seed of its objects' checks. */
uint64_t encache__redis_check_seed(const char *key);
/* The length of the v3 object a value of vlen bytes holds, from its
 * first n bytes: vlen - CHECK_BYTES when they start a v3 header whose
 * object is exactly that long (the value carries a check), else vlen. */
uint64_t encache__redis_check_objlen(const unsigned char *head, size_t n,
                                     uint64_t vlen);
/* The check of an object whose digest is `digest`, into out. */
void encache__redis_check_seal(unsigned char out[CHECK_BYTES],
                               uint64_t digest);
/* Whether the CHECK_BYTES at t are the check of digest. */
int encache__redis_check_holds(const unsigned char t[CHECK_BYTES],
                               uint64_t digest);
/* Writes: 1 with the check of hdr + payload under key in out when that
 * is a v3 object and checksum (CHECKSUM_*) writes checks, else 0 (the
 * value is written as given). */
int encache__redis_check_make(int checksum, const char *key, const void *hdr,
                              size_t hl, const void *payload, size_t len,
                              unsigned char out[CHECK_BYTES]);
/* Reads a whole value (len bytes at v) for a destination of head (its
 * first split bytes) and buf (cap bytes), with the seed of its key:
 * copies the object, without its check, verified while it is copied
 * when the value carries one (*check: CHECK_*).  Returns the object's
 * length, or ENCACHE_ETOOLARGE when it does not fit (nothing copied). */
int64_t encache__redis_check_value(const unsigned char *v, size_t len,
                                   size_t split, void *head, void *buf,
                                   size_t cap, uint64_t seed, int *check);
/* The digest of an object whose bytes st summed, for the key whose seed
 * is seed; st is spent. */
uint64_t encache__redis_check_digest(sum_state *st, uint64_t seed);

/* ------------------------------------------------------ wread.c, wwrite.c */

/* Reads the n keys in windows, key i into heads[i] (its first split
 * bytes) and bufs[i] (caps[i] bytes), those of one node as one stream,
 * each check verified as the windows arrive; results[i] gets the object's
 * length (without its check) or ENCACHE_ENOENT (also: a check that
 * fails) / ENCACHE_ETOOLARGE / ENCACHE_EUNAVAIL / ENCACHE_ENOMEM; why says
 * what failed (the last key that says something; a plain miss does not). */
void encache__redis_wread(redis_store *s, rset *set, size_t n,
                          const char *const *keys, size_t split,
                          void *const *heads, void *const *bufs,
                          const size_t *caps, int64_t *results, char *why,
                          size_t whysize);
/* Writes hdr + payload (+ the check ck, ckl bytes: 0 or CHECK_BYTES)
 * under key in windows (a temporary, RENAMENX); returns 0,
 * ENCACHE_EEXIST or ENCACHE_EUNAVAIL with the message set. */
int encache__redis_wwrite(redis_store *s, rset *set, const char *key,
                          const void *hdr, size_t hl, const void *payload,
                          size_t len, const unsigned char *ck, size_t ckl);
/* Tests only: called between the exchanges of a windowed read or write
 * with the bytes moved so far (NULL: none). */
extern void (*encache__redis_window_hook)(const char *key, uint64_t done);

#endif
