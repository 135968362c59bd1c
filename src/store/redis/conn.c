/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conn.c: connections to Redis nodes (see redis.h): dialling with AUTH
 * and SELECT, node backoff, the pool of connection sets, and one exchange
 * on a node's pooled context with at most one redial.
 */
#include "redis.h"

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>

void encache__redis_node_failed(redis_store *s, size_t node) {
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

static struct timeval tv_ms(unsigned ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* Connects to n (TCP or Unix socket) within connect_timeout_ms. */
static redisContext *connect_node(const redis_store *s, const rnode *n,
                                  char *why, size_t whysize) {
  struct timeval ctv = tv_ms(s->connect_timeout_ms);
  redisContext *c = n->port ? redisConnectWithTimeout(n->host, n->port, ctv)
                            : redisConnectUnixWithTimeout(n->host, ctv);
  if (c == NULL || c->err) {
    if (n->port)
      snprintf(why, whysize, "%.200s:%d: %.200s", n->host, n->port,
               c ? c->errstr : "out of memory");
    else
      snprintf(why, whysize, "%.200s: %.200s", n->host,
               c ? c->errstr : "out of memory");
    if (c != NULL)
      redisFree(c);
    return NULL;
  }
  /* TCP only: on a Unix socket hiredis fails to set it (TCP_KEEPIDLE) and
   * marks the context as failed. */
  if (n->port != 0)
    redisEnableKeepAlive(c);
  return c;
}

/* AUTH and SELECT, pipelined, before anything else (c reads with our
 * reply functions).  Returns 0, or ENCACHE_EUNAVAIL with why set.  A
 * server's error
 * names the command, never the password. */
static int handshake(const redis_store *s, redisContext *c, char *why,
                     size_t whysize) {
  char db[16];
  snprintf(db, sizeof(db), "%d", s->db);
  const char *auth[3] = {"AUTH", s->user ? s->user : s->password, s->password};
  const char *sel[2] = {"SELECT", db};
  const char *what[2];
  size_t nrep = 0;
  obuf b = {NULL, 0, 0, 0};
  if (s->password != NULL) {
    encache__redis_cmd(&b, s->user ? 3 : 2, auth, NULL);
    what[nrep++] = "AUTH";
  }
  if (s->db != 0) {
    encache__redis_cmd(&b, 2, sel, NULL);
    what[nrep++] = "SELECT";
  }
  int bad = b.oom;
  if (bad)
    snprintf(why, whysize, "out of memory");
  if (nrep > 0 && !bad) {
    rreply r[2];
    rpipe p = {.replies = r, .cap = nrep};
    struct iovec iov = {b.p, b.len};
    char xwhy[256];
    if (encache__redis_exchange(c, &iov, 1, nrep, &p, NULL,
                                encache__redis_deadline(s, 0), xwhy,
                                sizeof(xwhy)) != XR_OK) {
      bad = 1;
      snprintf(why, whysize, "%s: %s", what[p.next < nrep ? p.next : 0], xwhy);
    }
    for (size_t k = 0; k < nrep && !bad; k++)
      if (r[k].type == REDIS_REPLY_ERROR) {
        bad = 1;
        snprintf(why, whysize, "%s: %.200s", what[k], r[k].text);
      }
  }
  encache__free(b.p);
  return bad ? ENCACHE_EUNAVAIL : 0;
}

redisContext *encache__redis_dial(redis_store *s, size_t node,
                                  int plain_replies, char *why,
                                  size_t whysize) {
  rnode n;
  pthread_mutex_lock(&s->mu);
  n = s->nodes[node];
  pthread_mutex_unlock(&s->mu);
  if (n.down_until_ms > now_ms()) {
    snprintf(why, whysize, "%.200s:%d is down (retrying in %" PRIu64 " ms)",
             n.host, n.port, n.down_until_ms - now_ms());
    return NULL;
  }
  redisReplyObjectFunctions *ours = encache__redis_replies(0);
  redisReplyObjectFunctions *plain = encache__redis_replies(1);
  if (ours == NULL || plain == NULL) {
    snprintf(why, whysize, "out of memory");
    return NULL;
  }
  redisContext *c = connect_node(s, &n, why, whysize);
  if (c != NULL) {
    c->reader->fn = ours;
    if (handshake(s, c, why, whysize) < 0) {
      redisFree(c);
      c = NULL;
    } else if (plain_replies) {
      c->reader->fn = plain;
    }
  }
  if (c == NULL)
    encache__redis_node_failed(s, node);
  else
    node_ok(s, node);
  return c;
}

rset *encache__redis_borrow(redis_store *s) {
  pthread_mutex_lock(&s->mu);
  rset *set = s->free_sets;
  if (set != NULL)
    s->free_sets = set->next;
  pthread_mutex_unlock(&s->mu);
  if (set == NULL)
    set = encache__calloc(1, sizeof(*set));
  return set;
}

void encache__redis_give_back(redis_store *s, rset *set) {
  pthread_mutex_lock(&s->mu);
  set->next = s->free_sets;
  s->free_sets = set;
  pthread_mutex_unlock(&s->mu);
}

void encache__redis_free_pool(redis_store *s) {
  while (s->free_sets != NULL) {
    rset *set = s->free_sets;
    s->free_sets = set->next;
    for (size_t i = 0; i < MAX_NODES; i++)
      drop(set, i);
    encache__free(set);
  }
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
    set->conns[node] = encache__redis_dial(s, node, 0, why, whysize);
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
int encache__redis_run_on(redis_store *s, rset *set, size_t node,
                          const struct iovec *iov, int cnt, size_t nrep,
                          rpipe *p, xtime deadline, char *why, size_t whysize) {
  int x = XR_FAIL;
  p->next = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    int reused;
    redisContext *c = conn(s, set, node, &reused, why, whysize);
    if (c == NULL)
      return XR_FAIL; /* encache__redis_dial() started the backoff */
    struct iovec v[RUN_IOV_MAX];
    ENCACHE_ASSERT(cnt <= RUN_IOV_MAX);
    memcpy(v, iov, (size_t)cnt * sizeof(*v));
    p->next = 0;
    p->bad = NULL;
    x = encache__redis_exchange(c, v, cnt, nrep, p, NULL, deadline, why,
                                whysize);
    if (x == XR_OK)
      return XR_OK;
    drop(set, node);
    if (x != XR_STALE || !reused)
      break;
  }
  if (x == XR_TOOBIG)
    return XR_TOOBIG;
  encache__redis_node_failed(s, node);
  return XR_FAIL;
}

/* Sends argv to a context of ordinary replies and reads nrep of them into
 * out.  Returns an XR_ code. */
int encache__redis_plain(redis_store *s, redisContext *c, const obuf *b,
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
  return encache__redis_exchange(c, &iov, 1, nrep, &p, out,
                                 encache__redis_deadline(s, 0), why, whysize);
}

int encache__redis_plain1(redis_store *s, redisContext *c, int argc,
                          const char *const *argv, void **out, char *why,
                          size_t whysize) {
  obuf b = {NULL, 0, 0, 0};
  encache__redis_cmd(&b, argc, argv, NULL);
  int x = encache__redis_plain(s, c, &b, 1, out, why, whysize);
  encache__free(b.p);
  return x;
}
