/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster.c: Redis Cluster's key slots, the slot map read from CLUSTER
 * SLOTS, the MOVED / ASK redirections that update it, and one command for
 * a key with its redirections followed (see redis.h).
 * The map and the node table are guarded by the handle's mutex.
 */
#include "redis.h"

#include <stdio.h>
#include <stdlib.h>

static uint16_t crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((unsigned char)buf[i] << 8);
    for (int b = 0; b < 8; b++)
      crc =
          crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

/* Redis Cluster's key slot, hash tags included. */
unsigned encache__redis_key_slot(const char *key) {
  size_t len = strlen(key);
  const char *open = memchr(key, '{', len);
  if (open != NULL) {
    const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
    if (close != NULL && close > open + 1)
      return crc16(open + 1, (size_t)(close - open - 1)) % NSLOTS;
  }
  return crc16(key, len) % NSLOTS;
}

size_t encache__redis_node_index(redis_store *s, const char *host, int port) {
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

/* Replaces the slot map by CLUSTER SLOTS's answer r, read from node
 * `from` (whose host stands for an empty one).  Caller holds mu. */
static void apply_slots(redis_store *s, const redisReply *r, size_t from) {
  for (size_t k = 0; k < NSLOTS; k++)
    s->slots[k] = NO_NODE;
  for (size_t e = 0; e < r->elements; e++) {
    const redisReply *range = r->element[e];
    /* [first slot, last slot, [host, port, ...], replicas...] */
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY ||
        range->element[2]->elements < 2)
      continue;
    const redisReply *m = range->element[2];
    if (m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER ||
        m->element[1]->integer <= 0 || m->element[1]->integer > 65535)
      continue;
    const char *host =
        m->element[0]->len > 0 ? m->element[0]->str : s->nodes[from].host;
    size_t idx =
        encache__redis_node_index(s, host, (int)m->element[1]->integer);
    long long lo = range->element[0]->integer, hi = range->element[1]->integer;
    for (long long k = lo < 0 ? 0 : lo; idx != NO_NODE && k <= hi && k < NSLOTS;
         k++)
      s->slots[k] = (uint16_t)idx;
  }
  s->need_refresh = 0;
}

/* Reads CLUSTER SLOTS from the first node that answers (known masters,
 * then the seeds).  Returns 0 or ENCACHE_EUNAVAIL. */
int encache__redis_refresh_slots(redis_store *s) {
  char why[512] = "no node answered";
  pthread_mutex_lock(&s->mu);
  size_t n = s->nnodes;
  pthread_mutex_unlock(&s->mu);
  static const char *const cmd[2] = {"CLUSTER", "SLOTS"};
  for (size_t i = 0; i < n; i++) {
    redisContext *c = encache__redis_dial(s, i, 1, why, sizeof(why));
    if (c == NULL)
      continue;
    void *out[1];
    char xwhy[256];
    int x = encache__redis_plain1(s, c, 2, cmd, out, xwhy, sizeof(xwhy));
    redisReply *r = out[0];
    if (x != XR_OK || r->type != REDIS_REPLY_ARRAY) {
      snprintf(why, sizeof(why), "CLUSTER SLOTS: %s",
               x != XR_OK                     ? xwhy
               : r->type == REDIS_REPLY_ERROR ? r->str
                                              : "not an array");
      if (r != NULL)
        freeReplyObject(r);
      redisFree(c);
      if (x != XR_OK)
        encache__redis_node_failed(s, i);
      continue;
    }
    pthread_mutex_lock(&s->mu);
    apply_slots(s, r, i);
    pthread_mutex_unlock(&s->mu);
    freeReplyObject(r);
    redisFree(c);
    return 0;
  }
  return encache_store_fail(&s->base, ENCACHE_EUNAVAIL, "%s: %s", s->base.url,
                            why);
}

/* The node that owns key (single node: 0); NO_NODE when unknown. */
size_t encache__redis_route(redis_store *s, const char *key) {
  if (!s->cluster)
    return 0;
  pthread_mutex_lock(&s->mu);
  size_t node = s->slots[encache__redis_key_slot(key)];
  pthread_mutex_unlock(&s->mu);
  return node;
}

int encache__redis_ensure_slots(redis_store *s) {
  if (!s->cluster)
    return 0;
  pthread_mutex_lock(&s->mu);
  int need = s->need_refresh;
  pthread_mutex_unlock(&s->mu);
  return need ? encache__redis_refresh_slots(s) : 0;
}

size_t encache__redis_locate(redis_store *s, const char *key) {
  size_t node = encache__redis_route(s, key);
  if (node == NO_NODE && encache__redis_refresh_slots(s) == 0)
    node = encache__redis_route(s, key);
  return node;
}

/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK ..."; returns the node.  A
 * single-node Store follows none (NO_NODE): it has no slot table, and a
 * server it was not told is a cluster's does not choose its nodes. */
size_t encache__redis_redirect(redis_store *s, const char *text, int *ask) {
  unsigned slot;
  char host[256];
  int port;
  *ask = strncmp(text, "ASK ", 4) == 0;
  if (!s->cluster || s->slots == NULL)
    return NO_NODE;
  const char *p = strchr(text, ' ');
  if (p == NULL || sscanf(p + 1, "%u %255[^ ]", &slot, host) != 2)
    return NO_NODE;
  char *colon = strrchr(host, ':');
  if (colon == NULL || slot >= NSLOTS)
    return NO_NODE;
  *colon = '\0';
  port = atoi(colon + 1);
  pthread_mutex_lock(&s->mu);
  size_t node = encache__redis_node_index(s, host, port);
  if (!*ask && node != NO_NODE) {
    s->slots[slot] = (uint16_t)node;
    s->need_refresh = 1;
  }
  pthread_mutex_unlock(&s->mu);
  return node;
}

/* The distinct nodes that own slots (single node: node 0) into out; *m
 * gets their count.  Returns 0 or ENCACHE_EUNAVAIL (no node known). */
int encache__redis_masters(redis_store *s, size_t *out, size_t *m) {
  *m = 0;
  if (!s->cluster) {
    out[0] = 0;
    *m = 1;
    return 0;
  }
  int rc = encache__redis_ensure_slots(s);
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
  return *m > 0
             ? 0
             : encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                                  "%s: no node serves any slot", s->base.url);
}

/*
 * Lists one node's keys with SCAN and their sizes with pipelined STRLEN.
 * A server whose cursor never comes back to 0 is stopped by a bound on
 * calls and keys derived from its DBSIZE (see LIST_* above); an answer
 * that is not [cursor, [key strings...]] is refused.  Returns 0, the
 * callback's non-zero value, or ENCACHE_EUNAVAIL.
 */

/*
 * One command for key (argv, lens NULL = C strings) on the key's node,
 * following MOVED and ASK (ASKING first) for up to ROUNDS rounds; its
 * reply, never a redirection, in *out.  Returns 0, or ENCACHE_EUNAVAIL /
 * ENCACHE_ENOMEM with why set (the caller makes the message).
 */
int encache__redis_command(redis_store *s, const char *key, int argc,
                           const char *const *argv, const size_t *lens,
                           rreply *out, char *why, size_t whysize) {
  rset *set = encache__redis_borrow(s);
  if (set == NULL) {
    snprintf(why, whysize, "out of memory");
    return ENCACHE_ENOMEM;
  }
  encache__redis_ensure_slots(s);
  size_t node = encache__redis_locate(s, key);
  int rc = ENCACHE_EUNAVAIL, ask = 0;
  snprintf(why, whysize, "no node serves the slot of %s", key);
  static const char *const asking[1] = {"ASKING"};
  for (int round = 0; round < ROUNDS && node < MAX_NODES; round++) {
    obuf b = {NULL, 0, 0, 0};
    if (ask)
      encache__redis_cmd(&b, 1, asking, NULL);
    encache__redis_cmd(&b, argc, argv, lens);
    rreply r[2];
    size_t nrep = ask ? 2 : 1;
    rpipe p = {.replies = r, .cap = nrep};
    struct iovec iov = {b.p, b.len};
    int x = b.oom ? XR_FAIL
                  : encache__redis_run_on(s, set, node, &iov, 1, nrep, &p,
                                          encache__redis_deadline(s, 0), why,
                                          whysize);
    encache__free(b.p);
    if (b.oom) {
      snprintf(why, whysize, "out of memory");
      rc = ENCACHE_ENOMEM;
    }
    if (x != XR_OK)
      break;
    *out = r[nrep - 1];
    if (!is_redirect(out)) {
      rc = 0;
      break;
    }
    node = encache__redis_redirect(s, out->text, &ask);
    snprintf(why, whysize, "%s: %s", key,
             node < MAX_NODES ? "still redirected after 3 rounds"
                              : "unusable redirection");
  }
  encache__redis_give_back(s, set);
  return rc;
}
