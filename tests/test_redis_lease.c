/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store's leases (issue 16): taken, renewed, held, dropped,
 * expired, a killed holder, 8 processes racing, a cluster's slots and
 * redirections, a dead server, a failover, the URL under test.
 * Tests say "skipped" and pass when redis-server is not installed; the
 * servers, clusters and shared helpers are in tests/redis_util.c.
 */
#include "runner.h"

#include "encache.h"
#include "redis_util.h"
#include "store_util.h"
#include "resp_fake.h"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Single-flight leases (issue 16) on real servers: src/store/redis/lease.c.
 * The lease of K is the key "encache-lease:K". */

static redisReply *cmd_on(int port, const char *fmt, const char *a,
                          const char *b) {
  redisContext *c = connect_to(port);
  ASSERT(c != NULL && !c->err);
  redisReply *r = redisCommand(c, fmt, a, b);
  ASSERT(r != NULL);
  redisFree(c);
  return r;
}

static long long int_on(int port, const char *fmt, const char *a) {
  redisReply *r = cmd_on(port, fmt, a, NULL);
  ASSERT_EQ_INT(r->type, REDIS_REPLY_INTEGER);
  long long v = r->integer;
  freeReplyObject(r);
  return v;
}

/* Calls of a command since the server started (INFO commandstats). */
static long long calls_of(int port, const char *command) {
  redisReply *r = cmd_on(port, "INFO commandstats", NULL, NULL);
  char field[64];
  snprintf(field, sizeof(field), "cmdstat_%s:calls=", command);
  const char *p = r->str ? strstr(r->str, field) : NULL;
  long long n = p ? atoll(p + strlen(field)) : 0;
  freeReplyObject(r);
  return n;
}

/* Opens redis://127.0.0.1:port?query. */
static encache_store *open_url(int port, const char *query) {
  char url[160];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s", port, query);
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url,
               encache_store_errmsg(NULL));
  return st;
}

TEST(redis_lease_take_renew_held_drop) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  encache_store *st = open_url(rs.port, "");
  ASSERT(encache_store_caps_of(st) & ENCACHE_STORE_CAP_LEASE);
  const char *lk = "encache-lease:img-1";
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 41, 5000), 0);
  redisReply *v = cmd_on(rs.port, "GET %s", lk, NULL);
  ASSERT_EQ_STR(v->str, "41"); /* the token, in decimal */
  freeReplyObject(v);
  long long ttl = int_on(rs.port, "PTTL %s", lk);
  ASSERT(ttl > 0 && ttl <= 5000);
  /* Held by another: EEXIST, the lease untouched. */
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 42, 60000),
                ENCACHE_EEXIST);
  ASSERT_CONTAINS(encache_store_errmsg(st), "held by another");
  ASSERT(int_on(rs.port, "PTTL %s", lk) <= 5000);
  /* Renewed by its holder: the new deadline. */
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 41, 60000), 0);
  ASSERT(int_on(rs.port, "PTTL %s", lk) > 5000);
  /* Only the holder drops it. */
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 42), ENCACHE_ENOENT);
  ASSERT_EQ_INT(int_on(rs.port, "EXISTS %s", lk), 1);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 41), 0);
  ASSERT_EQ_INT(int_on(rs.port, "EXISTS %s", lk), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 41), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 42, 5000), 0);
  /* A lease is not an object, and an object's key is not a lease. */
  const char *keys[1] = {"img-1"};
  int exists[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, exists), 0);
  ASSERT_EQ_INT(exists[0], 0);
  ASSERT_EQ_INT(encache_store_write(st, "img-1", NULL, 0, "obj", 3), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 42), 0);
  char buf[8];
  ASSERT_EQ_INT(ts_read_one(st, "img-1", buf, sizeof(buf)), 3);
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 43, 5000), 0);
  /* Each script went whole (EVAL) once, then by its SHA-1 (EVALSHA). */
  ASSERT_EQ_INT(calls_of(rs.port, "eval"), 2);
  ASSERT(calls_of(rs.port, "evalsha") >= 9);
  /* After SCRIPT FLUSH, NOSCRIPT: sent whole again. */
  freeReplyObject(cmd_on(rs.port, "SCRIPT FLUSH", NULL, NULL));
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 43, 5000), 0);
  ASSERT_EQ_INT(calls_of(rs.port, "eval"), 3);
  /* The server refuses (the lease key is a list): unavailable, said. */
  freeReplyObject(cmd_on(rs.port, "RPUSH %s %s", "encache-lease:odd", "x"));
  int rc = encache_store_lease_take(st, "odd", 1, 5000);
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache_store_classify(rc), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(st), "WRONGTYPE");
  ASSERT_EQ_INT(encache_store_lease_drop(st, "odd", 1), ENCACHE_EUNAVAIL);
  encache_store_close(st);
  redis_server_stop(&rs);
}

TEST(redis_lease_expires_at_its_ttl) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  encache_store *st = open_url(rs.port, "");
  ASSERT_EQ_INT(encache_store_lease_take(st, "short", 1, 50), 0);
  double t0 = now_s();
  ASSERT_EQ_INT(encache_store_lease_take(st, "short", 2, 50), ENCACHE_EEXIST);
  int rc = ENCACHE_EEXIST;
  while (rc == ENCACHE_EEXIST && now_s() - t0 < 2.0)
    rc = encache_store_lease_take(st, "short", 2, 5000);
  double took = now_s() - t0;
  ASSERT_EQ_INT(rc, 0);
  /* Not before its deadline (less the time its answer took to come back). */
  if (took < 0.030 || took > 1.0)
    test__fail(__FILE__, __LINE__, "a 50 ms lease ended after %.3f s", took);
  /* The first holder's lease is gone: its drop says so. */
  ASSERT_EQ_INT(encache_store_lease_drop(st, "short", 1), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "short", 2), 0);
  encache_store_close(st);
  redis_server_stop(&rs);
}

TEST(redis_lease_holder_killed_holds_until_its_ttl) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  int ready[2];
  ASSERT(pipe(ready) == 0);
  pid_t holder = fork();
  ASSERT(holder >= 0);
  if (holder == 0) {
    encache_store *mine = NULL;
    if (encache_store_open(rs.url, &mine) != 0 ||
        encache_store_lease_take(mine, "victim", 7, 1500) != 0)
      _exit(1);
    if (write(ready[1], "x", 1) != 1)
      _exit(1);
    for (;;)
      pause(); /* holding it, until SIGKILL */
  }
  close(ready[1]);
  char c;
  ASSERT_EQ_INT(read(ready[0], &c, 1), 1); /* it holds the lease */
  double t0 = now_s();
  kill_wait(holder, SIGKILL);
  close(ready[0]);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(rs.url, &st), 0);
  /* Its death does not end the lease on Redis ... */
  ASSERT_EQ_INT(encache_store_lease_take(st, "victim", 8, 5000),
                ENCACHE_EEXIST);
  /* ... its deadline does. */
  int rc = ENCACHE_EEXIST;
  while (rc == ENCACHE_EEXIST && now_s() - t0 < 6.0)
    rc = encache_store_lease_take(st, "victim", 8, 5000);
  double took = now_s() - t0;
  ASSERT_EQ_INT(rc, 0);
  if (took < 1.3 || took > 4.0)
    test__fail(__FILE__, __LINE__, "a 1500 ms lease of a killed holder "
               "ended after %.3f s", took);
  encache_store_close(st);
  redis_server_stop(&rs);
}

#define RACE_PROCS 8
#define RACE_KEYS 24

/* RACE_PROCS processes open url and, released together, take the lease of
 * the same RACE_KEYS keys: exactly one wins each key, the others are told
 * EEXIST. */
static void lease_race(const char *url, const char *tag) {
  int ready[2], go[2], report[2];
  ASSERT(pipe(ready) == 0 && pipe(go) == 0 && pipe(report) == 0);
  pid_t kids[RACE_PROCS];
  for (int p = 0; p < RACE_PROCS; p++) {
    kids[p] = fork();
    ASSERT(kids[p] >= 0);
    if (kids[p] != 0)
      continue;
    close(go[1]);
    encache_store *st = NULL;
    int opened = encache_store_open(url, &st) == 0;
    char out[RACE_KEYS + 1], key[64], c;
    out[0] = (char)p;
    /* read() returns 0 when the parent closes go[1] */
    if (write(ready[1], opened ? "r" : "f", 1) != 1 || read(go[0], &c, 1) != 0 ||
        !opened)
      _exit(1);
    for (int k = 0; k < RACE_KEYS; k++) {
      snprintf(key, sizeof(key), "%s-race-%d", tag, k);
      int rc = encache_store_lease_take(st, key, 100 + (uint64_t)p, 30000);
      out[k + 1] = rc == 0 ? 'W' : rc == ENCACHE_EEXIST ? 'E' : '?';
    }
    encache_store_close(st);
    _exit(write(report[1], out, sizeof(out)) == (ssize_t)sizeof(out) ? 0 : 1);
  }
  close(ready[1]);
  close(go[0]);
  close(report[1]);
  char c;
  for (int p = 0; p < RACE_PROCS; p++) {
    ASSERT_EQ_INT(read(ready[0], &c, 1), 1);
    ASSERT_EQ_INT(c, 'r'); /* it opened the Store */
  }
  close(go[1]); /* every process is ready: go */
  int wins[RACE_KEYS] = {0};
  char out[RACE_KEYS + 1];
  for (int p = 0; p < RACE_PROCS; p++) {
    ASSERT_EQ_INT(read(report[0], out, sizeof(out)), sizeof(out));
    for (int k = 0; k < RACE_KEYS; k++) {
      if (out[k + 1] == '?')
        test__fail(__FILE__, __LINE__, "process %d, key %d: not W or E",
                   out[0], k);
      wins[k] += out[k + 1] == 'W';
    }
  }
  for (int p = 0; p < RACE_PROCS; p++)
    run_child_expect_exit0(kids[p], "a racer");
  close(ready[0]);
  close(report[0]);
  for (int k = 0; k < RACE_KEYS; k++)
    if (wins[k] != 1)
      test__fail(__FILE__, __LINE__, "%s: key %d has %d winners", url, k,
                 wins[k]);
}

TEST(redis_lease_race_one_winner_per_key) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  for (int round = 0; round < 3; round++) {
    char tag[16];
    snprintf(tag, sizeof(tag), "r%d", round);
    lease_race(rs.url, tag);
  }
  redis_server_stop(&rs);
}

/* An object of a namespace and the lease on it: listing, counting and
 * purging the namespace see the object only. */
static void lease_not_an_object(encache_store *st, const char *ns) {
  char key[128], pattern[160];
  snprintf(key, sizeof(key), "%s@id:leased", ns);
  snprintf(pattern, sizeof(pattern), "%s*", ns);
  ASSERT_EQ_INT(encache_store_write(st, key, NULL, 0, "obj", 3), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 5, 60000), 0);
  long n = 0;
  ASSERT_EQ_INT(encache_store_list(st, pattern, count_keys, &n), 0);
  ASSERT_EQ_INT(n, 1);
  uint64_t objects = 0, bytes = 0, removed = 0;
  ASSERT_EQ_INT(encache_store_count_prefix(st, ns, &objects, &bytes), 0);
  ASSERT_EQ_U64(objects, 1);
  ASSERT_EQ_U64(bytes, 3);
  ASSERT_EQ_INT(encache_store_remove_prefix(st, ns, &removed), 0);
  ASSERT_EQ_U64(removed, 1);
  /* The lease outlived the purge: still held, still its holder's. */
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 6, 60000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 5), 0);
}

TEST(redis_lease_is_never_listed_counted_or_purged) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  encache_store *st = open_url(rs.port, "");
  lease_not_an_object(st, "embedding@model:lease-test");
  encache_store_close(st);
  redis_server_stop(&rs);
}

/* The slot of key, as a string. */
static void slot_of(int port, const char *key, char *slot, size_t size) {
  snprintf(slot, size, "%lld", int_on(port, "CLUSTER KEYSLOT %s", key));
}

TEST(redis_lease_cluster_slots_and_redirections) {
  if (!redis_have())
    return;
  cluster cl;
  cluster_start(&cl);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(cl.url, &st), 0);
  /* Keys in many slots: the lease keys land on every node. */
  int on_node_count[3] = {0, 0, 0};
  for (int k = 0; k < 30; k++) {
    char key[32], lk[64];
    snprintf(key, sizeof(key), "spread-%d", k);
    snprintf(lk, sizeof(lk), "encache-lease:%s", key);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 9, 60000), 0);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 9, 60000), 0);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 10, 60000),
                  ENCACHE_EEXIST);
    int o = owner(&cl, lk);
    ASSERT(o >= 0);
    ASSERT_EQ_INT(int_on(cl.port[o], "EXISTS %s", lk), 1);
    on_node_count[o]++;
    ASSERT_EQ_INT(encache_store_lease_drop(st, key, 10), ENCACHE_ENOENT);
    ASSERT_EQ_INT(encache_store_lease_drop(st, key, 9), 0);
  }
  ASSERT(on_node_count[0] > 0 && on_node_count[1] > 0 && on_node_count[2] > 0);

  /* MOVED: the lease key's (empty) slot handed to another node behind the
   * Store's back. */
  char slot[16];
  const char *lk = "encache-lease:moved-lease";
  int a = owner(&cl, lk), b = (a + 1) % 3;
  char *bid = node_id(cl.port[b]);
  slot_of(cl.port[0], lk, slot, sizeof(slot));
  for (int i = 0; i < 3; i++)
    on_node(cl.port[i], "CLUSTER SETSLOT %s NODE %s", slot, bid);
  ASSERT_EQ_INT(encache_store_lease_take(st, "moved-lease", 3, 60000), 0);
  ASSERT_EQ_INT(owner(&cl, lk), b);
  ASSERT_EQ_INT(int_on(cl.port[b], "EXISTS %s", lk), 1);
  ASSERT_EQ_INT(encache_store_lease_take(st, "moved-lease", 4, 60000),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "moved-lease", 3), 0);
  free(bid);

  /* ASK: the lease key's slot migrating from A to B; a new lease goes to
   * B (ASKING), and is found and dropped there. */
  lk = "encache-lease:asked-lease";
  a = owner(&cl, lk);
  b = (a + 1) % 3;
  char *aid = node_id(cl.port[a]);
  bid = node_id(cl.port[b]);
  slot_of(cl.port[0], lk, slot, sizeof(slot));
  on_node(cl.port[b], "CLUSTER SETSLOT %s IMPORTING %s", slot, aid);
  on_node(cl.port[a], "CLUSTER SETSLOT %s MIGRATING %s", slot, bid);
  ASSERT_EQ_INT(encache_store_lease_take(st, "asked-lease", 5, 60000), 0);
  redisContext *c = connect_to(cl.port[b]);
  freeReplyObject(redisCommand(c, "ASKING"));
  redisReply *r = redisCommand(c, "GET %s", lk);
  ASSERT(r != NULL && r->type == REDIS_REPLY_STRING);
  ASSERT_EQ_STR(r->str, "5");
  freeReplyObject(r);
  redisFree(c);
  ASSERT_EQ_INT(encache_store_lease_take(st, "asked-lease", 6, 60000),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "asked-lease", 5), 0);
  free(aid);
  free(bid);

  lease_not_an_object(st, "embedding@model:lease-cluster");
  encache_store_close(st);
  lease_race(cl.url, "cluster");
  cluster_stop(&cl);
}

TEST(redis_lease_dead_server_is_unavailable_promptly) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  encache_store *st =
      open_url(rs.port, "?timeout_ms=200&connect_timeout_ms=200");
  ASSERT_EQ_INT(encache_store_lease_take(st, "gone", 1, 60000), 0);
  /* A server that stops answering: one 200 ms timeout, not a hang. */
  kill(rs.pid, SIGSTOP);
  double t0 = now_s();
  int rc = encache_store_lease_take(st, "gone", 1, 60000);
  double took = now_s() - t0;
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "lease take of gone");
  if (took > 2.0)
    test__fail(__FILE__, __LINE__, "take took %.3f s, timeout 0.2 s", took);
  t0 = now_s();
  ASSERT_EQ_INT(encache_store_lease_drop(st, "gone", 1), ENCACHE_EUNAVAIL);
  ASSERT(now_s() - t0 < 2.0);
  /* A killed one: refused, at once. */
  kill_wait(rs.pid, SIGKILL);
  t0 = now_s();
  ASSERT_EQ_INT(encache_store_lease_take(st, "gone", 2, 60000),
                ENCACHE_EUNAVAIL);
  ASSERT(now_s() - t0 < 2.0);
  encache_store_close(st);
  /* A cluster no node of which answers. */
  st = NULL;
  ASSERT_EQ_INT(encache_store_open("redis-cluster://127.0.0.1:1?"
                                   "connect_timeout_ms=200&timeout_ms=200",
                                   &st),
                0);
  t0 = now_s();
  rc = encache_store_lease_take(st, "gone", 3, 60000);
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache_store_classify(rc), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT(now_s() - t0 < 2.0);
  encache_store_close(st);
}

/* The race and the listings again on the Store under test, when
 * tests/on_redis.sh names one ($ENCACHE_TEST_STORE: TCP, a Unix socket,
 * the cluster, a server with a password). */
TEST(redis_lease_on_the_url_under_test) {
  const char *url = getenv("ENCACHE_TEST_STORE");
  if (url == NULL || (strncmp(url, "redis://", 8) != 0 &&
                      strncmp(url, "unix://", 7) != 0 &&
                      strncmp(url, "redis-cluster://", 16) != 0)) {
    printf("# skipped: ENCACHE_TEST_STORE is not a Redis URL\n");
    return;
  }
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  char ns[64], tag[32];
  snprintf(ns, sizeof(ns), "embedding@model:lease-%d", (int)getpid());
  snprintf(tag, sizeof(tag), "lease-%d", (int)getpid());
  lease_not_an_object(st, ns);
  encache_store_close(st);
  lease_race(url, tag);
}
