/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Redis Store against real servers that each test starts itself (so that
 * it can kill, stop and restart them): a killed and restarted server, a
 * stopped one, a cluster node killed, MOVED and ASK redirections, and
 * large objects in windows (issue 14: an object rewritten, a writer or a
 * server killed, a slot moved, between two windows, through the Store's
 * test hook), and leases (issue 16: taken, renewed, held, dropped, expired,
 * a killed holder, 8 processes racing, a cluster's slots and redirections,
 * a dead server).  Tests
 * say "skipped" and pass when redis-server is not installed; CI installs
 * it.  The misbehaving servers of tests/resp_fake.c (trickling, endless,
 * oversized, malformed, closing) need no redis-server: each of those tests
 * asserts a bounded outcome (time derived from timeout_ms, memory, a
 * clean code, no crash, no SIGPIPE).  The file is long (over 600 lines)
 * because its tests share the helpers that start, kill and
 * inspect servers and clusters.
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

/* --------------------------------------------------------- engine helpers */

static void free_ctx(void *p) { free(p); }

static encache *open_engine(const char *url) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = "redis/test";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  if (encache_open(&o, &ec) != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  return ec;
}

/* Looks ids up (2x4 float32); returns hits and fills outcomes. */
static int look(encache_step *step, const char *const *ids, int n,
                int *outcome) {
  encache_candidate c[8];
  encache_result r[8];
  for (int i = 0; i < n; i++) {
    encache_candidate cc = {sizeof(cc), ids[i], ENCACHE_MODALITY_IMAGE,
                            ENCACHE_FLOAT32, 2, 4, ENCACHE_DEVICE_HOST, 0};
    c[i] = cc;
  }
  encache_allocator a = ts_host_allocator();
  r[0].size = sizeof(r[0]);
  int hits = encache_lookup(step, c, (size_t)n, &a, r);
  ASSERT(hits >= 0);
  for (int i = 0; i < n; i++) {
    outcome[i] = r[i].outcome;
    if (r[i].outcome == ENCACHE_HIT) {
      float *f = r[i].data;
      ASSERT(f[0] == (float)strlen(ids[i]) && f[7] == 7.0f);
      free(r[i].data);
    }
  }
  return hits;
}

static int publish(encache_step *step, const char *id) {
  float *f = malloc(8 * sizeof(float));
  for (int i = 0; i < 8; i++)
    f[i] = (float)i;
  f[0] = (float)strlen(id);
  encache_storage *s = NULL;
  encache_storage_new(f, 8 * sizeof(float), free_ctx, f, &s);
  int64_t shape[2] = {2, 4};
  encache_tensor v = {sizeof v, f, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  int q = encache_publish(step, id, &v, s);
  encache_storage_unref(s);
  return q;
}

/* ------------------------------------------------------------- the tests */

TEST(redis_server_killed_then_restarted) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[128];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?timeout_ms=300&connect_timeout_ms=300", port);
  encache *ec = open_engine(url);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"k1", "k22", "k333"};
  int out[3];
  ASSERT_EQ_INT(look(step, ids, 3, out), 0);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(publish(step, ids[i]), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(look(step, ids, 3, out), 3);

  kill_wait(pid, SIGKILL);
  /* No crash, nothing poisoned: lookups are UNAVAILABLE, writes skipped. */
  static const char *const more[] = {"k1", "fresh"};
  ASSERT_EQ_INT(look(step, more, 2, out), 0);
  ASSERT_EQ_INT(out[0], ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(out[1], ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(publish(step, "fresh"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_failed, 1);
  ASSERT_EQ_INT(st.poisoned, 0);

  /* Restarted (empty): after the backoff, the handle works again. */
  pid = spawn_redis(port, NULL);
  int recovered = 0;
  for (int i = 0; i < 300 && !recovered; i++) { /* up to 30 s */
    look(step, more, 2, out);
    recovered = out[1] == ENCACHE_MISS;
    if (!recovered)
      usleep(100000);
  }
  ASSERT(recovered);
  ASSERT_EQ_INT(publish(step, "fresh"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(look(step, more, 2, out), 1);
  ASSERT_EQ_INT(out[1], ENCACHE_HIT);
  ASSERT_EQ_INT(encache_close(ec), 0);
  kill_wait(pid, SIGKILL);
}

TEST(redis_stopped_server_lookups_bounded_by_timeout) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[128];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?timeout_ms=200&connect_timeout_ms=200", port);
  encache *ec = open_engine(url);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"s1", "s22"};
  int out[2];
  ASSERT_EQ_INT(look(step, ids, 2, out), 0); /* connected, misses */
  kill(pid, SIGSTOP);
  double t0 = now_s();
  look(step, ids, 2, out);
  double took = now_s() - t0;
  ASSERT_EQ_INT(out[0], ENCACHE_UNAVAILABLE);
  /* One 200 ms timeout, not a hang (generous bound for a loaded machine). */
  if (took > 2.0)
    test__fail(__FILE__, __LINE__, "lookup took %.3f s with a 0.2 s timeout",
               took);
  t0 = now_s();
  look(step, ids, 2, out); /* within the backoff: at once */
  ASSERT(now_s() - t0 < 1.0);
  kill(pid, SIGCONT);
  int recovered = 0;
  for (int i = 0; i < 300 && !recovered; i++) { /* up to 30 s */
    look(step, ids, 2, out);
    recovered = out[0] == ENCACHE_MISS;
    if (!recovered)
      usleep(100000);
  }
  ASSERT(recovered);
  ASSERT_EQ_INT(encache_close(ec), 0);
  kill_wait(pid, SIGKILL);
}

/* A three-master cluster in a fresh directory. */
typedef struct cluster {
  char dir[64];
  int port[3];
  pid_t pid[3];
  char url[256];
} cluster;

static void cluster_start(cluster *cl) {
  snprintf(cl->dir, sizeof(cl->dir), "/tmp/encache-cluster-%d", (int)getpid());
  mkdir(cl->dir, 0700);
  char cmd[512];
  int n = snprintf(cmd, sizeof(cmd), "redis-cli --cluster create");
  for (int i = 0; i < 3; i++) {
    cl->port[i] = free_port();
    cl->pid[i] = spawn_redis(cl->port[i], cl->dir);
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " 127.0.0.1:%d", cl->port[i]);
  }
  snprintf(cmd + n, sizeof(cmd) - (size_t)n,
           " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
  ASSERT_EQ_INT(system(cmd), 0);
  for (int i = 0; i < 3; i++) {
    int ok = 0;
    for (int k = 0; k < 200 && !ok; k++) {
      redisContext *c = connect_to(cl->port[i]);
      redisReply *r = redisCommand(c, "CLUSTER INFO");
      ok = r && r->str && strstr(r->str, "cluster_state:ok") != NULL;
      if (r)
        freeReplyObject(r);
      redisFree(c);
      if (!ok)
        usleep(50000);
    }
    ASSERT(ok);
  }
  snprintf(cl->url, sizeof(cl->url),
           "redis-cluster://127.0.0.1:%d,127.0.0.1:%d?timeout_ms=300&"
           "connect_timeout_ms=300", cl->port[0], cl->port[1]);
}

static void cluster_stop(cluster *cl) {
  for (int i = 0; i < 3; i++)
    if (cl->pid[i] > 0)
      kill_wait(cl->pid[i], SIGKILL);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", cl->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "# could not remove %s\n", cl->dir);
}

/* Which of the cluster's nodes owns key (index into cl->port). */
static int owner(cluster *cl, const char *key) {
  return slot_owner(cl->port, 3, cl->port[0], key);
}

TEST(redis_cluster_node_killed_others_still_hit) {
  if (!redis_have())
    return;
  cluster cl;
  cluster_start(&cl);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(cl.url, &st), 0);
  int per_node[3] = {0};
  char keys[60][32];
  for (int i = 0; i < 60; i++) {
    snprintf(keys[i], sizeof(keys[i]), "node-test-%d", i);
    ASSERT_EQ_INT(encache_store_write(st, keys[i], NULL, 0, keys[i],
                                      strlen(keys[i])), 0);
    per_node[owner(&cl, keys[i])]++;
  }
  ASSERT(per_node[0] > 0 && per_node[1] > 0 && per_node[2] > 0);
  kill_wait(cl.pid[2], SIGKILL);
  cl.pid[2] = 0;
  const char *kp[60];
  char bufs_mem[60][32];
  void *bufs[60];
  size_t caps[60];
  int64_t res[60];
  for (int i = 0; i < 60; i++) {
    kp[i] = keys[i];
    bufs[i] = bufs_mem[i];
    caps[i] = sizeof(bufs_mem[i]);
  }
  ASSERT_EQ_INT(encache_store_read(st, kp, 60, bufs, caps, res), 0);
  int hits = 0, unavailable = 0;
  for (int i = 0; i < 60; i++) {
    if (owner(&cl, keys[i]) == 2) {
      ASSERT_EQ_INT(res[i], ENCACHE_EUNAVAIL);
      unavailable++;
    } else {
      ASSERT_EQ_INT(res[i], (int64_t)strlen(keys[i]));
      ASSERT_EQ_MEM(bufs_mem[i], keys[i], strlen(keys[i]));
      hits++;
    }
  }
  ASSERT_EQ_INT(hits, per_node[0] + per_node[1]);
  ASSERT_EQ_INT(unavailable, per_node[2]);
  encache_store_close(st);
  cluster_stop(&cl);
}

static char *node_id(int port) {
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "CLUSTER MYID");
  char *id = strdup(r->str);
  freeReplyObject(r);
  redisFree(c);
  return id;
}

static void on_node(int port, const char *fmt, const char *a, const char *b) {
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, fmt, a, b);
  if (r == NULL || r->type == REDIS_REPLY_ERROR)
    test__fail(__FILE__, __LINE__, "%s on %d: %s", fmt, port,
               r && r->str ? r->str : c->errstr);
  freeReplyObject(r);
  redisFree(c);
}

TEST(redis_cluster_follows_moved_and_ask) {
  if (!redis_have())
    return;
  cluster cl;
  cluster_start(&cl);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(cl.url, &st), 0);
  char buf[64];
  /* The Store learns the slot map. */
  ASSERT_EQ_INT(ts_read_one(st, "warm-up", buf, sizeof(buf)), ENCACHE_ENOENT);

  /* MOVED: an empty slot handed from its owner A to B behind our back. */
  const char *key = "moved-key";
  int a = owner(&cl, key), b = (a + 1) % 3;
  char *bid = node_id(cl.port[b]);
  char slot[16];
  redisContext *c = connect_to(cl.port[0]);
  redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", key);
  snprintf(slot, sizeof(slot), "%lld", r->integer);
  freeReplyObject(r);
  redisFree(c);
  for (int i = 0; i < 3; i++)
    on_node(cl.port[i], "CLUSTER SETSLOT %s NODE %s", slot, bid);
  ASSERT_EQ_INT(encache_store_write(st, key, NULL, 0, "moved", 5), 0);
  ASSERT_EQ_INT(ts_read_one(st, key, buf, sizeof(buf)), 5);
  ASSERT_EQ_MEM(buf, "moved", 5);
  ASSERT_EQ_INT(owner(&cl, key), b);

  /* ASK: a slot migrating from A to B; a new key goes to B. */
  const char *key2 = "ask-key-7";
  a = owner(&cl, key2);
  b = (a + 1) % 3;
  char *aid = node_id(cl.port[a]);
  free(bid);
  bid = node_id(cl.port[b]);
  c = connect_to(cl.port[0]);
  r = redisCommand(c, "CLUSTER KEYSLOT %s", key2);
  snprintf(slot, sizeof(slot), "%lld", r->integer);
  freeReplyObject(r);
  redisFree(c);
  on_node(cl.port[b], "CLUSTER SETSLOT %s IMPORTING %s", slot, aid);
  on_node(cl.port[a], "CLUSTER SETSLOT %s MIGRATING %s", slot, bid);
  ASSERT_EQ_INT(encache_store_write(st, key2, NULL, 0, "asked", 5), 0);
  ASSERT_EQ_INT(ts_read_one(st, key2, buf, sizeof(buf)), 5);
  ASSERT_EQ_MEM(buf, "asked", 5);
  /* It really is on B. */
  c = connect_to(cl.port[b]);
  redisReply *ok = redisCommand(c, "ASKING");
  freeReplyObject(ok);
  r = redisCommand(c, "GET %s", key2);
  ASSERT(r != NULL && r->type == REDIS_REPLY_STRING && r->len == 5);
  freeReplyObject(r);
  redisFree(c);
  free(aid);
  free(bid);
  encache_store_close(st);
  cluster_stop(&cl);
}

TEST(redis_url_errors) {
  static const struct {
    const char *url, *needle;
  } bad[] = {
      {"redis://127.0.0.1", "expected redis://[user:password@]host:port[/db]"},
      {"redis://127.0.0.1:99999", "expected redis://"},
      {"redis://127.0.0.1:6379/x", "the database must be a number"},
      {"redis://127.0.0.1:6379?timeout_ms=0", "timeout_ms=0: must be a positive"},
      {"redis://127.0.0.1:6379?colour=red", "unknown option 'colour'"},
      {"redis://127.0.0.1:6379?window=10", "window=10: must be at least 64"},
      {"redis://127.0.0.1:6379?window_depth=0", "window_depth=0: must be 1 to"},
      {"redis://127.0.0.1:6379?window_threshold=1GiB", "must be a size"},
      {"redis://127.0.0.1:6379?window=1MB", "window=1MB: must be a size"},
      {"redis-cluster://", "expected host:port[,host:port...]"},
      {"redis-cluster://a:1,b", "seed 'b' is not host:port"},
      {"unix://relative", "expected unix:///path/to/socket"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(bad[i].url, &st), ENCACHE_EURL);
    ASSERT_CONTAINS(encache_store_errmsg(st), bad[i].needle);
    encache_store_close(st);
  }
  /* A refused connection is recoverable, with a message. */
  encache_store *st = NULL;
  char url[64];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", free_port());
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  const char *keys[1] = {"x"};
  int pr[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, pr), 0);
  ASSERT_EQ_INT(pr[0], ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "Connection refused");
  ASSERT_EQ_INT(encache_store_write(st, "x", NULL, 0, "y", 1), ENCACHE_EUNAVAIL);
  encache_store_close(st);
}

TEST(redis_ttl_and_auth) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "CONFIG SET requirepass s3cret");
  freeReplyObject(r);
  redisFree(c);
  char url[160];
  encache_store *st = NULL;
  snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d", port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  encache_store_close(st);
  snprintf(url, sizeof(url), "redis://:s3cret@127.0.0.1:%d/3?ttl_s=100", port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1), 0);
  encache_store_close(st);
  c = connect_to(port);
  r = redisCommand(c, "AUTH s3cret");
  freeReplyObject(r);
  r = redisCommand(c, "SELECT 3");
  freeReplyObject(r);
  r = redisCommand(c, "TTL t");
  ASSERT(r->type == REDIS_REPLY_INTEGER && r->integer > 90 && r->integer <= 100);
  freeReplyObject(r);
  redisFree(c);
  kill_wait(pid, SIGKILL);
}

/* ------------------------------------------- connections the server closed */

/* The peak resident set of this process, in KiB. */
static long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* Waits until the server has no client but the one asking. */
static void wait_alone(int port) {
  for (int i = 0; i < 100; i++) {
    redisContext *c = connect_to(port);
    redisReply *r = redisCommand(c, "INFO clients");
    int alone = r && r->str && strstr(r->str, "connected_clients:1\r") != NULL;
    if (r)
      freeReplyObject(r);
    redisFree(c);
    if (alone)
      return;
    usleep(100000);
  }
  test__fail(__FILE__, __LINE__, "the server kept its idle clients for 10 s");
}

static void run_child_expect_exit0(pid_t child, const char *what) {
  int status;
  ASSERT(waitpid(child, &status, 0) == child);
  if (WIFSIGNALED(status))
    test__fail(__FILE__, __LINE__, "%s: the process was killed by signal %d",
               what, WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    test__fail(__FILE__, __LINE__, "%s: exit %d", what, WEXITSTATUS(status));
}

/* The application's SIGPIPE is at its default (terminate); the library
 * must never die of it. */
static void sigpipe_default(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  signal(SIGPIPE, SIG_DFL);
}

TEST(redis_killed_connections_never_raise_sigpipe) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  int ready[2], go[2];
  ASSERT(pipe(ready) == 0 && pipe(go) == 0);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    sigpipe_default();
    char url[128], b = 0;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    encache_store *st = NULL;
    size_t big = 1u << 20;
    char *value = calloc(1, big);
    int ok = encache_store_open(url, &st) == 0 &&
             encache_store_write(st, "before-kill", NULL, 0, "v", 1) == 0;
    ok = ok && write(ready[1], "r", 1) == 1 && read(go[0], &b, 1) == 1;
    /* Every connection of the pool was killed: the 1 MiB write fails
     * recoverably or succeeds on a new connection; then all works. */
    int w = encache_store_write(st, "big-after-kill", NULL, 0, value, big);
    ok = ok && (w == 0 || w == ENCACHE_EUNAVAIL);
    char buf[8];
    ok = ok && ts_read_one(st, "before-kill", buf, sizeof(buf)) == 1;
    ok = ok && encache_store_write(st, "big-2", NULL, 0, value, big) == 0;
    encache_store_close(st);
    free(value);
    _exit(ok ? 0 : 3);
  }
  char b;
  ASSERT_EQ_INT(read(ready[0], &b, 1), 1);
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "CLIENT KILL TYPE normal SKIPME yes");
  ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
  freeReplyObject(r);
  redisFree(c);
  ASSERT_EQ_INT(write(go[1], "g", 1), 1);
  run_child_expect_exit0(child, "writes after CLIENT KILL");
  kill_wait(pid, SIGKILL);
}

TEST(redis_fake_send_to_a_closing_server_never_raises_sigpipe) {
  int port;
  pid_t srv = resp_fake_start(RESP_EPIPE, &port);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    sigpipe_default();
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=3000", port);
    encache_store *st = NULL;
    size_t big = 8u << 20; /* more than the socket buffers hold */
    char *value = calloc(1, big);
    int ok = encache_store_open(url, &st) == 0 &&
             encache_store_write(st, "k", NULL, 0, value, big) ==
                 ENCACHE_EUNAVAIL;
    encache_store_close(st);
    free(value);
    _exit(ok ? 0 : 3);
  }
  run_child_expect_exit0(child, "a write to a server that resets");
  resp_fake_stop(srv);
}

TEST(redis_idle_connections_closed_by_the_server_are_redialled) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "CONFIG SET timeout 1");
  ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
  redisFree(c);
  char url[128];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  encache *ec = open_engine(url);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  int out[3];
  for (int round = 0; round < 3; round++) {
    char id[3][16];
    const char *ids[3];
    for (int i = 0; i < 3; i++) {
      snprintf(id[i], sizeof(id[i]), "idle-%d-%d", round, i);
      ids[i] = id[i];
    }
    /* The server closed every pooled connection while they were idle. */
    wait_alone(port);
    ASSERT_EQ_INT(look(step, ids, 3, out), 0);
    ASSERT_EQ_INT(out[0], ENCACHE_MISS);
    wait_alone(port);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ_INT(publish(step, ids[i]), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    wait_alone(port);
    ASSERT_EQ_INT(look(step, ids, 3, out), 3);
  }
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_failed, 0);
  ASSERT_EQ_U64(st.published_written, 9);
  ASSERT_EQ_INT(encache_close(ec), 0);
  kill_wait(pid, SIGKILL);
}

/* Opens a Store on a fake server with both timeouts at timeout_ms. */
static encache_store *open_fake(int port, unsigned timeout_ms) {
  char url[128];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?timeout_ms=%u&connect_timeout_ms=%u", port,
           timeout_ms, timeout_ms);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  return st;
}

TEST(redis_fake_connection_closed_unanswered_is_retried_once) {
  int port;
  pid_t srv = resp_fake_start(RESP_STALE, &port);
  encache_store *st = open_fake(port, 1000);
  char buf[16];
  /* Each connection answers one command and closes at the next: every
   * operation after the first finds its pooled connection closed before
   * any byte of reply, redials at once and succeeds. */
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), 5);
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), 5);
  ASSERT_EQ_MEM(buf, "hello", 5);
  const char *keys[1] = {"k"};
  int present[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, present), 0);
  ASSERT_EQ_INT(present[0], 1);
  ASSERT_EQ_INT(encache_store_write(st, "w", NULL, 0, "v", 1), 0);
  encache_store_close(st);
  ASSERT_EQ_INT(resp_fake_stop(srv), 4);
}

/* ----------------------------------------------------- misbehaving servers */

/* Reads one key (into cap bytes) from a fake server in mode with
 * timeout_ms; asserts the result and bounds on time and peak memory.
 * Returns the open Store for more checks; *srv is the server. */
static encache_store *bounded_read(resp_mode mode, unsigned timeout_ms,
                                   size_t cap, int64_t expect, double max_s,
                                   long max_kib, pid_t *srv) {
  int port;
  *srv = resp_fake_start(mode, &port);
  encache_store *st = open_fake(port, timeout_ms);
  char *buf = malloc(cap);
  long rss0 = maxrss_kib();
  double t0 = now_s();
  int64_t r = ts_read_one(st, "k", buf, cap);
  double took = now_s() - t0;
  long grew = maxrss_kib() - rss0;
  free(buf);
  ASSERT_EQ_INT(r, expect);
  if (took > max_s || grew > max_kib)
    test__fail(__FILE__, __LINE__, "fake server mode %d, timeout_ms=%u: "
               "%.1f s (at most %.1f), +%ld KiB (at most %ld)", (int)mode,
               timeout_ms, took, max_s, grew, max_kib);
  return st;
}

TEST(redis_fake_trickling_reply_is_bounded_by_timeout) {
  pid_t srv;
  /* A byte every 0.1 s: a per-system-call timeout would never fire.  The
   * bound is 0.5 s, generous for a loaded machine. */
  encache_store *st = bounded_read(RESP_TRICKLE, 500, 256 * 1024,
                                   ENCACHE_EUNAVAIL, 4.0, 64 * 1024, &srv);
  ASSERT_CONTAINS(encache_store_errmsg(st), "timed out");
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_endless_reply_is_refused) {
  pid_t srv;
  encache_store *st = bounded_read(RESP_ENDLESS_LINE, 2000, 4096,
                                   ENCACHE_EUNAVAIL, 5.0, 64 * 1024, &srv);
  ASSERT_CONTAINS(encache_store_errmsg(st), "line longer than");
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_oversized_bulk_is_refused_unread) {
  pid_t srv;
  /* $2000000000 into 4 KiB: too large, known from the header alone. */
  encache_store *st = bounded_read(RESP_OVERSIZED, 2000, 4096,
                                   ENCACHE_ETOOLARGE, 5.0, 32 * 1024, &srv);
  /* The connection was dropped, not reused mid-reply: the next read asks
   * again on a new one. */
  char buf[4096];
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_ETOOLARGE);
  encache_store_close(st);
  ASSERT_EQ_INT(resp_fake_stop(srv), 2);
}

TEST(redis_fake_malformed_and_cut_replies_are_unavailable) {
  static const resp_mode modes[] = {RESP_MALFORMED, RESP_CLOSE_MID};
  for (size_t m = 0; m < 2; m++) {
    int port;
    pid_t srv = resp_fake_start(modes[m], &port);
    encache_store *st = open_fake(port, 1000);
    char buf[4096];
    double t0 = now_s();
    ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_EUNAVAIL);
    const char *keys[1] = {"k"};
    int present[1];
    ASSERT_EQ_INT(encache_store_exists(st, keys, 1, present), 0);
    ASSERT_EQ_INT(present[0], ENCACHE_EUNAVAIL);
    ASSERT_EQ_INT(encache_store_write(st, "k", NULL, 0, "v", 1),
                  ENCACHE_EUNAVAIL);
    ASSERT(now_s() - t0 < 5.0);
    encache_store_close(st);
    resp_fake_stop(srv);
  }
}

static int count_keys(const char *key, uint64_t len, void *arg) {
  ASSERT(key != NULL);
  (void)len;
  ++*(long *)arg;
  return 0;
}

TEST(redis_fake_scan_that_never_ends_is_bounded) {
  int port;
  pid_t srv = resp_fake_start(RESP_SCAN_ENDLESS, &port);
  encache_store *st = open_fake(port, 1000);
  long n = 0;
  double t0 = now_s();
  ASSERT_EQ_INT(encache_store_list(st, NULL, count_keys, &n),
                ENCACHE_EUNAVAIL);
  double took = now_s() - t0;
  ASSERT_CONTAINS(encache_store_errmsg(st), "SCAN");
  if (took > 20.0 || n > 200000)
    test__fail(__FILE__, __LINE__, "a SCAN without end: %.1f s, %ld keys",
               took, n);
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_scan_with_non_string_keys_is_refused) {
  int port;
  pid_t srv = resp_fake_start(RESP_SCAN_BADKEYS, &port);
  encache_store *st = open_fake(port, 1000);
  long n = 0;
  ASSERT_EQ_INT(encache_store_list(st, NULL, count_keys, &n),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "SCAN");
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_large_value_into_small_buffer_is_refused_unread) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  redisContext *c = connect_to(port);
  /* 64 MiB made on the server: this process never holds it. */
  redisReply *r = redisCommand(c, "SETRANGE big 67108863 x");
  ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER);
  freeReplyObject(r);
  r = redisCommand(c, "SET small1 0123456789");
  freeReplyObject(r);
  r = redisCommand(c, "SET small2 abcdefghij");
  freeReplyObject(r);
  char near[4200];
  memset(near, 'n', sizeof(near));
  r = redisCommand(c, "SET near %b", near, sizeof(near));
  freeReplyObject(r);
  redisFree(c);
  char url[128];
  /* The server copies the 64 MiB into its output buffer before it sends
   * the header: a generous deadline, for a loaded machine. */
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=10000", port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  static char mem[4][4096];
  const char *keys[4] = {"small1", "big", "near", "small2"};
  void *bufs[4] = {mem[0], mem[1], mem[2], mem[3]};
  size_t caps[4] = {4096, 4096, 4096, 4096};
  int64_t res[4];
  long rss0 = maxrss_kib();
  ASSERT_EQ_INT(encache_store_read(st, keys, 4, bufs, caps, res), 0);
  long grew = maxrss_kib() - rss0;
  ASSERT_EQ_INT(res[0], 10);
  ASSERT_EQ_INT(res[1], ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(res[2], ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(res[3], 10);
  ASSERT_EQ_MEM(mem[0], "0123456789", 10);
  ASSERT_EQ_MEM(mem[3], "abcdefghij", 10);
  if (grew > 32 * 1024)
    test__fail(__FILE__, __LINE__, "reading 64 MiB into 4 KiB: +%ld KiB",
               grew);
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
}

TEST(redis_stats_of_an_unreachable_cluster_fail) {
  char url[128];
  snprintf(url, sizeof(url),
           "redis-cluster://127.0.0.1:%d?connect_timeout_ms=300", free_port());
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "Connection refused");
  encache_store_close(st);
}

/* ------------------------------------------------------------ secrets */

TEST(redis_url_redact) {
  static const struct {
    const char *url, *shown;
  } cases[] = {
      {"redis://user:pass@host:6379", "redis://user:***@host:6379"},
      {"redis://:pass@host:6379/2?timeout_ms=5",
       "redis://:***@host:6379/2?timeout_ms=5"},
      {"redis://u:@h:1", "redis://u:***@h:1"},
      {"redis://host:6379", "redis://host:6379"},
      {"redis://admin@h:1", "redis://admin@h:1"}, /* a user, no password */
      {"redis://u:p@ss@h:1", "redis://u:***@h:1"}, /* '@' in the password */
      {"redis://u:p:a/s@h:1/3", "redis://u:***@h:1/3"},
      {"redis://u:p%40ss%3Aw@h:1", "redis://u:***@h:1"},
      {"redis://u:pa?ss@h:1?ttl_s=1", "redis://u:***@h:1?ttl_s=1"},
      {"redis://u:pw@h:1?password_file=/x@y&ttl_s=3",
       "redis://u:***@h:1?password_file=/x@y&ttl_s=3"},
      {"redis://h:1?password_file=/x@y", "redis://h:1?password_file=/x@y"},
      {"redis-cluster://u:pw@a:1,b:2,c:3?timeout_ms=9",
       "redis-cluster://u:***@a:1,b:2,c:3?timeout_ms=9"},
      {"redis-cluster://a:1,b:2", "redis-cluster://a:1,b:2"},
      {"unix:///run/a@b.sock?db=2", "unix:///run/a@b.sock?db=2"},
      {"postgres://u:pw@db/x", "postgres://u:***@db/x"},
      {"shm://encache?size=1GiB", "shm://encache?size=1GiB"},
      {"mooncake:", "mooncake:"},
      /* A tier, part by part: the remote's password too. */
      {"tier:shm://e?size=8GiB&create=no+redis://u:p+w@h:1?db=2",
       "tier:shm://e?size=8GiB&create=no+redis://u:***@h:1?db=2"},
      {"tier:redis://u:pw@a:1+redis://v:pw@b:2",
       "tier:redis://u:***@a:1+redis://v:***@b:2"},
      {"tier:shm://e+tier:shm://f+redis://u:pw@h:1",
       "tier:shm://e+tier:shm://f+redis://u:***@h:1"},
      {"tier:shm://e?size=1MiB", "tier:shm://e?size=1MiB"}, /* no '+' */
      {"", ""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char buf[128];
    int len = (int)strlen(cases[i].shown);
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, NULL, 0), len);
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, sizeof(buf)),
                  len);
    ASSERT_EQ_STR(buf, cases[i].shown);
    /* Exactly long enough, and one byte short. */
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, (size_t)len + 1),
                  len);
    ASSERT_EQ_STR(buf, cases[i].shown);
    if (len > 0) {
      memset(buf, 'x', sizeof(buf));
      ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, (size_t)len),
                    ENCACHE_ENOBUFS);
      ASSERT_EQ_INT(buf[0], 0);
    }
  }
  char one[1] = {'x'};
  ASSERT_EQ_INT(encache_store_url_redact("redis://h:1", one, 1),
                ENCACHE_ENOBUFS);
  ASSERT_EQ_INT(one[0], 0);
  ASSERT_EQ_INT(encache_store_url_redact(NULL, NULL, 0), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_url_redact("redis://h:1", NULL, 5),
                ENCACHE_EINVAL);
}

/* Asserts that msg names the URL redacted and never shows secret. */
static void assert_redacted(const char *msg, const char *shown,
                            const char *secret) {
  ASSERT_CONTAINS(msg, shown);
  if (strstr(msg, secret) != NULL)
    test__fail(__FILE__, __LINE__, "the message shows the password: %s", msg);
}

TEST(redis_url_errors_never_show_the_password) {
  static const struct {
    const char *url, *shown, *needle;
  } bad[] = {
      {"redis://u:hunter2@127.0.0.1:1/x", "redis://u:***@127.0.0.1:1/x",
       "the database must be a number"},
      {"redis://:hunter2@127.0.0.1", "redis://:***@127.0.0.1",
       "expected redis://"},
      {"redis://u:hun@ter2@127.0.0.1:1?colour=red",
       "redis://u:***@127.0.0.1:1?colour=red", "unknown option 'colour'"},
      {"redis-cluster://u:hunter2@a:1,b", "redis-cluster://u:***@a:1,b",
       "seed 'b' is not host:port"},
      {"redis://u:hunter2@127.0.0.1:1?timeout_ms=0",
       "redis://u:***@127.0.0.1:1?timeout_ms=0", "must be a positive"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(bad[i].url, &st), ENCACHE_EURL);
    ASSERT_CONTAINS(encache_store_errmsg(st), bad[i].needle);
    assert_redacted(encache_store_errmsg(st), bad[i].shown, "hunter2");
    encache_store_close(st);
  }
  /* An operation's failure, and the handle's URL. */
  char url[96], shown[96];
  int port = free_port();
  snprintf(url, sizeof(url), "redis-cluster://u:hunter2@127.0.0.1:%d", port);
  snprintf(shown, sizeof(shown), "redis-cluster://u:***@127.0.0.1:%d", port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_STR(encache_store_url(st), shown);
  ASSERT_EQ_INT(encache_store_write(st, "x", NULL, 0, "y", 1),
                ENCACHE_EUNAVAIL);
  assert_redacted(encache_store_errmsg(st), shown, "hunter2");
  encache_store_stats stats = {.size = sizeof(stats)};
  ASSERT(encache_store_stats_get(st, &stats) < 0);
  assert_redacted(encache_store_errmsg(st), shown, "hunter2");
  encache_store_close(st);
}

/* Writes and reads back a key on the Store at url; returns 0 or the
 * first failure's code, whose message goes to write_read_why. */
static char write_read_why[512];

static int write_read(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  char key[32], got[8];
  snprintf(key, sizeof(key), "auth-%d", (int)getpid());
  const char *keys[1] = {key};
  void *bufs[1] = {got};
  size_t caps[1] = {sizeof(got)};
  int64_t res[1] = {0};
  if (rc == 0) {
    encache_store_remove(st, key);
    rc = encache_store_write(st, key, NULL, 0, "v", 1);
  }
  if (rc == 0)
    rc = encache_store_read(st, keys, 1, bufs, caps, res);
  if (rc == 0 && res[0] != 1)
    rc = res[0] < 0 ? (int)res[0] : ENCACHE_EINVAL;
  /* The message of the failed call, before the handle goes. */
  snprintf(write_read_why, sizeof(write_read_why), "%s",
           encache_store_errmsg(st));
  encache_store_close(st);
  return rc;
}

static char pw_dir[64];

/* A new password file, holding text, in a fresh directory
 * (password_files_remove() removes them). */
static void password_file(char *path, size_t size, const char *text) {
  if (pw_dir[0] == '\0') {
    snprintf(pw_dir, sizeof(pw_dir), "/tmp/encache-pw-XXXXXX");
    ASSERT(mkdtemp(pw_dir) != NULL);
  }
  static int n;
  snprintf(path, size, "%s/pw%d", pw_dir, n++);
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL);
  fputs(text, f);
  fclose(f);
}

static void password_files_remove(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", pw_dir);
  ASSERT(pw_dir[0] != '\0' && system(cmd) == 0);
}

TEST(redis_auth_password_from_url_file_and_environment) {
  if (!redis_have())
    return;
  const char *pw = "s3cr3t:p@ss/w0rd"; /* ':', '@' and '/' raw in URLs */
  int port = free_port();
  pid_t pid = spawn_redis_auth(port, NULL, pw);
  char url[512], shown[128], file[128], bad[128], missing[160];
  unsetenv("ENCACHE_REDIS_PASSWORD");
  /* In the URL: raw, percent-encoded, with the default user. */
  snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", pw, port);
  ASSERT_EQ_INT(write_read(url), 0);
  snprintf(url, sizeof(url),
           "redis://default:s3cr3t%%3Ap%%40ss%%2Fw0rd@127.0.0.1:%d", port);
  ASSERT_EQ_INT(write_read(url), 0);
  /* In a file (newline stripped; CRLF too), and in the environment. */
  password_file(file, sizeof(file), "s3cr3t:p@ss/w0rd\r\nnext line\n");
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", port,
           file);
  ASSERT_EQ_INT(write_read(url), 0);
  setenv("ENCACHE_REDIS_PASSWORD", pw, 1);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  ASSERT_EQ_INT(write_read(url), 0);
  /* Precedence: the URL's, then the file's, then the environment's. */
  setenv("ENCACHE_REDIS_PASSWORD", "wrong-env", 1);
  ASSERT_EQ_INT(write_read(url), ENCACHE_EUNAVAIL);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", port,
           file);
  ASSERT_EQ_INT(write_read(url), 0);
  password_file(bad, sizeof(bad), "wrong-file\n");
  snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d?password_file=%s", pw,
           port, bad);
  ASSERT_EQ_INT(write_read(url), 0);
  unsetenv("ENCACHE_REDIS_PASSWORD");

  /* Refused: the message says AUTH and shows no password. */
  encache_store *st = NULL;
  snprintf(url, sizeof(url), "redis://u:wrong-url@127.0.0.1:%d", port);
  snprintf(shown, sizeof(shown), "redis://u:***@127.0.0.1:%d", port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  assert_redacted(encache_store_errmsg(st), shown, "wrong-url");
  encache_store_close(st);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", port,
           bad);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  assert_redacted(encache_store_errmsg(st), "redis://127.0.0.1", "wrong-file");
  encache_store_close(st);
  /* No password at all: the server's NOAUTH, named. */
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  ASSERT_EQ_INT(write_read(url), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(write_read_why, "NOAUTH");

  /* A password file that cannot be used: the open fails, naming the file
   * and never its content. */
  snprintf(missing, sizeof(missing), "%s.missing", file);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", port,
           missing);
  ASSERT_EQ_INT(encache_store_open(url, &st), -ENOENT);
  ASSERT_CONTAINS(encache_store_errmsg(st), missing);
  encache_store_close(st);
  password_file(bad, sizeof(bad), "\nwrong-file\n");
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", port,
           bad);
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_EURL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "the first line is empty");
  assert_redacted(encache_store_errmsg(st), bad, "wrong-file");
  encache_store_close(st);
  password_files_remove();
  kill_wait(pid, SIGKILL);
}

TEST(redis_auth_out_of_memory_is_an_error_never_a_connection_without_auth) {
  if (!redis_have())
    return;
  const char *pw = "oom-s3cret";
  int port = free_port();
  pid_t pid = spawn_redis_auth(port, NULL, pw);
  char url[512], file[128];
  password_file(file, sizeof(file), "oom-s3cret\n");
  for (int variant = 0; variant < 3; variant++) {
    if (variant == 0)
      snprintf(url, sizeof(url), "redis://default:%s@127.0.0.1:%d", pw, port);
    else
      snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s%s", port,
               variant == 1 ? "?password_file=" : "", variant == 1 ? file : "");
    if (variant == 2)
      setenv("ENCACHE_REDIS_PASSWORD", pw, 1);
    int opened = 0;
    for (long n = 1; !opened; n++) {
      ASSERT(n < 100);
      encache_store *st = NULL;
      test_alloc_fail_after(n);
      int rc = encache_store_open(url, &st);
      test_alloc_fail_after(0);
      if (rc == 0) {
        /* Opened: it authenticates (the server refuses anything else). */
        int w = encache_store_write(st, "oom", NULL, 0, "v", 1);
        if (w != 0 && w != ENCACHE_EEXIST)
          test__fail(__FILE__, __LINE__, "variant %d, allocation %ld: "
                     "write: %d: %s", variant, n, w, encache_store_errmsg(st));
        opened = 1;
      } else {
        ASSERT_EQ_INT(rc, ENCACHE_ENOMEM);
        ASSERT_CONTAINS(encache_store_errmsg(st), "out of memory");
        if (strstr(encache_store_errmsg(st), pw) != NULL)
          test__fail(__FILE__, __LINE__, "shows the password: %s",
                     encache_store_errmsg(st));
      }
      encache_store_close(st);
    }
    unsetenv("ENCACHE_REDIS_PASSWORD");
  }
  password_files_remove();
  kill_wait(pid, SIGKILL);
}

/* ------------------------------------------------ windows (issue 14) */

/* The Redis Store's test hook, called between the exchanges of a windowed
 * read or write (src/store/redis/redis.h). */
extern void (*encache__redis_window_hook)(const char *key, uint64_t done);

#define WOBJ (64u << 10) /* 16 windows of 4 KiB */
#define WOPTS "window=4096&window_depth=2&window_threshold=0"

static void wfill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

/* What the hook does, once, at its first call. */
static struct {
  int port, calls;
  pid_t server;
  const unsigned char *value; /* rewrite: DEL, then SET this */
  size_t len;
  void (*action)(void);
} wh;

static void wh_rewrite(void) {
  redisContext *c = connect_to(wh.port);
  freeReplyObject(redisCommand(c, "DEL wkey"));
  if (wh.value != NULL)
    freeReplyObject(redisCommand(c, "SET wkey %b", wh.value, wh.len));
  redisFree(c);
}

static void wh_kill_server(void) { kill_wait(wh.server, SIGKILL); }

static void wh_hook(const char *key, uint64_t done) {
  (void)key;
  if (done > 0 && wh.action != NULL && wh.calls++ == 0)
    wh.action(); /* once */
}

static void wh_arm(void (*action)(void)) {
  wh.calls = 0;
  wh.action = action;
  encache__redis_window_hook = wh_hook;
}

TEST(redis_window_object_rewritten_between_windows_is_a_miss) {
  if (!redis_have())
    return;
  wh.port = free_port();
  pid_t pid = spawn_redis(wh.port, NULL);
  char url[160];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?" WOPTS, wh.port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  static unsigned char a[WOBJ], b[WOBJ], out[WOBJ];
  wfill(a, WOBJ, 1);
  memcpy(b, a, WOBJ);
  wfill(b + 256, WOBJ - 256, 2); /* same length and head, other payload */
  /* Rewritten with the same length and head; shorter; deleted. */
  size_t lens[3] = {WOBJ, WOBJ / 2, 0};
  for (int v = 0; v < 3; v++) {
    encache_store_remove(st, "wkey");
    ASSERT_EQ_INT(encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24), 0);
    wh.value = lens[v] ? b : NULL;
    wh.len = lens[v];
    wh_arm(wh_rewrite);
    ASSERT_EQ_INT(ts_read_one(st, "wkey", out, sizeof(out)), ENCACHE_ENOENT);
    ASSERT(wh.calls >= 1);
    ASSERT_CONTAINS(encache_store_errmsg(st), "changed while it was read");
  }
  /* Undisturbed, the object now there is read whole. */
  wh_arm(NULL);
  wh.value = b, wh.len = WOBJ;
  wh_rewrite();
  ASSERT_EQ_INT(ts_read_one(st, "wkey", out, sizeof(out)), WOBJ);
  ASSERT_EQ_MEM(out, b, WOBJ);
  encache__redis_window_hook = NULL;
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
}

/* A key that expires under a windowed read (between EXISTS and STRLEN in
 * its first exchange) is a miss, never "an empty object": thousands of
 * reads race a 1 ms expiry (before the fix about 1 in 90 answered 0). */
TEST(redis_window_key_expiring_mid_read_is_a_miss) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[160];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?window=64&window_threshold=0", port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  redisContext *c = connect_to(port);
  static unsigned char val[200], out[4096];
  memset(val, 'x', sizeof(val));
  long empty = 0, misses = 0;
  for (int it = 0; it < 3000; it++) {
    freeReplyObject(redisCommand(c, "SET rkey %b PX 1", val, sizeof(val)));
    for (;;) {
      int64_t r = ts_read_one(st, "rkey", out, sizeof(out));
      if (r == (int64_t)sizeof(val))
        continue;
      empty += r == 0;
      misses += r == ENCACHE_ENOENT;
      ASSERT(r == 0 || r == ENCACHE_ENOENT);
      break;
    }
  }
  ASSERT_EQ_INT(empty, 0);
  ASSERT_EQ_INT(misses, 3000);
  /* A real empty object is still read as one. */
  freeReplyObject(redisCommand(c, "SET ekey %b", "", (size_t)0));
  ASSERT_EQ_INT(ts_read_one(st, "ekey", out, sizeof(out)), 0);
  redisFree(c);
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
}

/* The temporary keys on the server at port. */
static size_t tmp_keys(int port, long long *pttl) {
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "KEYS *encache-tmp:*");
  size_t n = r ? r->elements : 0;
  if (n > 0 && pttl != NULL) {
    redisReply *t = redisCommand(c, "PTTL %s", r->element[0]->str);
    *pttl = t ? t->integer : -3;
    freeReplyObject(t);
  }
  freeReplyObject(r);
  redisFree(c);
  return n;
}

static void wh_die(void) { raise(SIGKILL); }

/* As an eviction would: the temporary deleted mid-write. */
static void wh_evict_tmp(void) {
  redisContext *c = connect_to(wh.port);
  redisReply *r = redisCommand(c, "KEYS *encache-tmp:*");
  for (size_t i = 0; r != NULL && i < r->elements; i++)
    freeReplyObject(redisCommand(c, "DEL %s", r->element[i]->str));
  freeReplyObject(r);
  redisFree(c);
}

TEST(redis_window_writer_killed_leaves_no_object_and_its_temporary_expires) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[160];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=200&" WOPTS,
           port);
  static unsigned char a[WOBJ];
  wfill(a, WOBJ, 3);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    encache_store *st = NULL;
    if (encache_store_open(url, &st) != 0)
      _exit(2);
    wh_arm(wh_die); /* killed between windows */
    encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24);
    _exit(3);
  }
  int status;
  waitpid(child, &status, 0);
  ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  unsigned char out[64];
  ASSERT_EQ_INT(ts_read_one(st, "wkey", out, sizeof(out)), ENCACHE_ENOENT);
  /* Its temporary is there, with an expiry (2 x (200 ms + 250 ms)). */
  long long pttl = 0;
  ASSERT_EQ_INT((int)tmp_keys(port, &pttl), 1);
  ASSERT(pttl > 0 && pttl <= 900);
  double t0 = now_s();
  while (tmp_keys(port, NULL) > 0 && now_s() - t0 < 3)
    usleep(50000);
  ASSERT_EQ_INT((int)tmp_keys(port, NULL), 0);
  /* A write that fails mid-way (the key exists) leaves nothing either. */
  ASSERT_EQ_INT(encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24), 0);
  ASSERT_EQ_INT(encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT((int)tmp_keys(port, NULL), 0);
  /* A temporary evicted mid-write (and made again by the next window) is
   * noticed: the write fails, nothing is left. */
  wh.port = port;
  wh_arm(wh_evict_tmp);
  ASSERT_EQ_INT(encache_store_write(st, "wkey3", a, 24, a + 24, WOBJ - 24),
                ENCACHE_EUNAVAIL);
  encache__redis_window_hook = NULL;
  ASSERT_CONTAINS(encache_store_errmsg(st), "temporary");
  ASSERT_EQ_INT(ts_read_one(st, "wkey3", out, sizeof(out)), ENCACHE_ENOENT);
  ASSERT_EQ_INT((int)tmp_keys(port, NULL), 0);
  /* The final key has the objects' expiry, not the temporary's: none, or
   * ttl_s. */
  encache_store_close(st);
  char ttl_url[192];
  snprintf(ttl_url, sizeof(ttl_url), "%s&ttl_s=100", url);
  ASSERT_EQ_INT(encache_store_open(ttl_url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "wkey2", a, 24, a + 24, WOBJ - 24), 0);
  redisContext *c = connect_to(port);
  redisReply *r1 = redisCommand(c, "PTTL wkey"), *r2 = redisCommand(c, "PTTL wkey2");
  ASSERT_EQ_INT((int)r1->integer, -1);
  ASSERT(r2->integer > 90000 && r2->integer <= 100000);
  freeReplyObject(r1);
  freeReplyObject(r2);
  redisFree(c);
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
}

TEST(redis_window_server_killed_mid_window_is_unavailable) {
  if (!redis_have())
    return;
  wh.port = free_port();
  wh.server = spawn_redis(wh.port, NULL);
  char url[192];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?timeout_ms=300&connect_timeout_ms=300&" WOPTS,
           wh.port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  static unsigned char a[WOBJ], out[WOBJ];
  wfill(a, WOBJ, 4);
  ASSERT_EQ_INT(encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24), 0);
  wh_arm(wh_kill_server);
  double t0 = now_s();
  ASSERT_EQ_INT(ts_read_one(st, "wkey", out, sizeof(out)), ENCACHE_EUNAVAIL);
  ASSERT(now_s() - t0 < 2);
  ASSERT(wh.calls >= 1);
  /* Restarted: a write killed mid-way is unavailable too. */
  wh.server = spawn_redis(wh.port, NULL);
  usleep(2100 * 1000); /* past the node's backoff */
  wh_arm(wh_kill_server);
  t0 = now_s();
  ASSERT_EQ_INT(encache_store_write(st, "wkey", a, 24, a + 24, WOBJ - 24),
                ENCACHE_EUNAVAIL);
  ASSERT(now_s() - t0 < 2);
  ASSERT(wh.calls >= 1);
  encache__redis_window_hook = NULL;
  encache_store_close(st);
}

/* Moves the slot of key, with its keys, from node a to node b; without
 * wh_finish the slot stays migrating (the keys answer ASK on a). */
static cluster *wh_cl;
static const char *wh_key;
static int wh_finish;

static void wh_migrate(void) {
  int a = owner(wh_cl, wh_key), b = (a + 1) % 3;
  char *aid = node_id(wh_cl->port[a]), *bid = node_id(wh_cl->port[b]);
  char slot[16], port_b[16];
  redisContext *c = connect_to(wh_cl->port[a]);
  redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", wh_key);
  snprintf(slot, sizeof(slot), "%lld", r->integer);
  snprintf(port_b, sizeof(port_b), "%d", wh_cl->port[b]);
  freeReplyObject(r);
  on_node(wh_cl->port[b], "CLUSTER SETSLOT %s IMPORTING %s", slot, aid);
  on_node(wh_cl->port[a], "CLUSTER SETSLOT %s MIGRATING %s", slot, bid);
  r = redisCommand(c, "CLUSTER GETKEYSINSLOT %s 100", slot);
  for (size_t i = 0; r != NULL && i < r->elements; i++)
    freeReplyObject(redisCommand(c, "MIGRATE 127.0.0.1 %s %s 0 5000", port_b,
                                 r->element[i]->str));
  freeReplyObject(r);
  redisFree(c);
  for (int i = 0; wh_finish && i < 3; i++)
    on_node(wh_cl->port[i], "CLUSTER SETSLOT %s NODE %s", slot, bid);
  free(aid);
  free(bid);
}

TEST(redis_window_cluster_moved_and_asked_mid_read_and_mid_write) {
  if (!redis_have())
    return;
  cluster cl;
  cluster_start(&cl);
  wh_cl = &cl;
  char url[320];
  snprintf(url, sizeof(url), "%s&" WOPTS, cl.url);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  static unsigned char a[WOBJ], out[WOBJ];
  wfill(a, WOBJ, 5);
  /* A read whose slot moves between two windows: a hit, whole. */
  wh_finish = 1;
  wh_key = "wmoved-read";
  ASSERT_EQ_INT(encache_store_write(st, wh_key, a, 24, a + 24, WOBJ - 24), 0);
  int before = owner(&cl, wh_key);
  wh_arm(wh_migrate);
  ASSERT_EQ_INT(ts_read_one(st, wh_key, out, sizeof(out)), WOBJ);
  ASSERT(wh.calls >= 1);
  ASSERT_EQ_MEM(out, a, WOBJ);
  ASSERT_EQ_INT(owner(&cl, wh_key), (before + 1) % 3);
  /* A write whose slot moves (its temporary with it) between windows. */
  wh_key = "wmoved-write{tag}";
  before = owner(&cl, wh_key);
  wh_arm(wh_migrate);
  ASSERT_EQ_INT(encache_store_write(st, wh_key, a, 24, a + 24, WOBJ - 24), 0);
  ASSERT(wh.calls >= 1);
  encache__redis_window_hook = NULL;
  ASSERT_EQ_INT(owner(&cl, wh_key), (before + 1) % 3);
  memset(out, 0, sizeof(out));
  ASSERT_EQ_INT(ts_read_one(st, wh_key, out, sizeof(out)), WOBJ);
  ASSERT_EQ_MEM(out, a, WOBJ);
  /* A read whose key migrates between two windows, the slot still
   * migrating: ASK, and the object read whole from the importing node. */
  wh_finish = 0;
  wh_key = "wasked-read";
  ASSERT_EQ_INT(encache_store_write(st, wh_key, a, 24, a + 24, WOBJ - 24), 0);
  wh_arm(wh_migrate);
  memset(out, 0, sizeof(out));
  ASSERT_EQ_INT(ts_read_one(st, wh_key, out, sizeof(out)), WOBJ);
  ASSERT(wh.calls >= 1);
  encache__redis_window_hook = NULL;
  ASSERT_EQ_MEM(out, a, WOBJ);
  encache_store_close(st);
  cluster_stop(&cl);
}

/* One read of objects in windows on the three masters of a cluster (their
 * nodes read at the same time, issue 30), with a missing key and a small
 * object among them: every object whole, the missing one a miss. */
TEST(redis_window_cluster_objects_on_several_nodes_in_one_read) {
  if (!redis_have())
    return;
  cluster cl;
  cluster_start(&cl);
  char url[320];
  snprintf(url, sizeof(url), "%s&" WOPTS, cl.url);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  enum { NK = 9 };
  static unsigned char obj[NK][WOBJ], out[NK][WOBJ];
  char names[NK][32];
  const char *keys[NK];
  void *bufs[NK];
  size_t caps[NK];
  int64_t res[NK];
  int seen[3] = {0, 0, 0};
  for (int k = 0; k < NK; k++) {
    snprintf(names[k], sizeof(names[k]), "wpar-%d", k);
    keys[k] = names[k];
    bufs[k] = out[k];
    caps[k] = WOBJ;
    wfill(obj[k], WOBJ, 10u + (unsigned)k);
    size_t len = k == 4 ? 100 : WOBJ; /* one small object */
    if (k != 7) /* one missing key */
      ASSERT_EQ_INT(
          encache_store_write(st, keys[k], obj[k], 24, obj[k] + 24, len - 24),
          0);
    seen[owner(&cl, keys[k])]++;
  }
  ASSERT(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
  for (int round = 0; round < 3; round++) {
    memset(out, 0, sizeof(out));
    ASSERT_EQ_INT(encache_store_read(st, keys, NK, bufs, caps, res), 0);
    for (int k = 0; k < NK; k++) {
      int64_t want = k == 7 ? ENCACHE_ENOENT : k == 4 ? 100 : (int64_t)WOBJ;
      ASSERT_EQ_INT(res[k], want);
      if (want > 0)
        ASSERT_EQ_MEM(out[k], obj[k], (size_t)want);
    }
  }
  encache_store_close(st);
  cluster_stop(&cl);
}

/* ------------------------------------------------------------------ leases */

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
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  encache_store *st = open_url(port, "");
  ASSERT(encache_store_caps_of(st) & ENCACHE_STORE_CAP_LEASE);
  const char *lk = "encache-lease:img-1";
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 41, 5000), 0);
  redisReply *v = cmd_on(port, "GET %s", lk, NULL);
  ASSERT_EQ_STR(v->str, "41"); /* the token, in decimal */
  freeReplyObject(v);
  long long ttl = int_on(port, "PTTL %s", lk);
  ASSERT(ttl > 0 && ttl <= 5000);
  /* Held by another: EEXIST, the lease untouched. */
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 42, 60000),
                ENCACHE_EEXIST);
  ASSERT_CONTAINS(encache_store_errmsg(st), "held by another");
  ASSERT(int_on(port, "PTTL %s", lk) <= 5000);
  /* Renewed by its holder: the new deadline. */
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 41, 60000), 0);
  ASSERT(int_on(port, "PTTL %s", lk) > 5000);
  /* Only the holder drops it. */
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 42), ENCACHE_ENOENT);
  ASSERT_EQ_INT(int_on(port, "EXISTS %s", lk), 1);
  ASSERT_EQ_INT(encache_store_lease_drop(st, "img-1", 41), 0);
  ASSERT_EQ_INT(int_on(port, "EXISTS %s", lk), 0);
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
  ASSERT_EQ_INT(calls_of(port, "eval"), 2);
  ASSERT(calls_of(port, "evalsha") >= 9);
  /* After SCRIPT FLUSH, NOSCRIPT: sent whole again. */
  freeReplyObject(cmd_on(port, "SCRIPT FLUSH", NULL, NULL));
  ASSERT_EQ_INT(encache_store_lease_take(st, "img-1", 43, 5000), 0);
  ASSERT_EQ_INT(calls_of(port, "eval"), 3);
  /* The server refuses (the lease key is a list): unavailable, said. */
  freeReplyObject(cmd_on(port, "RPUSH %s %s", "encache-lease:odd", "x"));
  int rc = encache_store_lease_take(st, "odd", 1, 5000);
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache_store_classify(rc), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(st), "WRONGTYPE");
  ASSERT_EQ_INT(encache_store_lease_drop(st, "odd", 1), ENCACHE_EUNAVAIL);
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
}

TEST(redis_lease_expires_at_its_ttl) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  encache_store *st = open_url(port, "");
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
  kill_wait(pid, SIGKILL);
}

TEST(redis_lease_holder_killed_holds_until_its_ttl) {
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[96];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  int ready[2];
  ASSERT(pipe(ready) == 0);
  pid_t holder = fork();
  ASSERT(holder >= 0);
  if (holder == 0) {
    encache_store *mine = NULL;
    if (encache_store_open(url, &mine) != 0 ||
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
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
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
  kill_wait(pid, SIGKILL);
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
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  char url[96];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  for (int round = 0; round < 3; round++) {
    char tag[16];
    snprintf(tag, sizeof(tag), "r%d", round);
    lease_race(url, tag);
  }
  kill_wait(pid, SIGKILL);
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
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  encache_store *st = open_url(port, "");
  lease_not_an_object(st, "embedding@model:lease-test");
  encache_store_close(st);
  kill_wait(pid, SIGKILL);
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
  if (!redis_have())
    return;
  int port = free_port();
  pid_t pid = spawn_redis(port, NULL);
  encache_store *st = open_url(port, "?timeout_ms=200&connect_timeout_ms=200");
  ASSERT_EQ_INT(encache_store_lease_take(st, "gone", 1, 60000), 0);
  /* A server that stops answering: one 200 ms timeout, not a hang. */
  kill(pid, SIGSTOP);
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
  kill_wait(pid, SIGKILL);
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
