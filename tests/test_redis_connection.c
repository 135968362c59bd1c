/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store's connections against real servers that each test
 * starts itself (so that it can kill, stop and restart them): a killed
 * and restarted server, a stopped one, killed connections and SIGPIPE,
 * idle connections the server closed.
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

TEST(redis_server_killed_then_restarted) {
  redis_server rs;
  if (!redis_server_start(&rs, "?timeout_ms=300&connect_timeout_ms=300"))
    return;
  encache *ec = open_engine(rs.url);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"k1", "k22", "k333"};
  int out[3];
  ASSERT_EQ_INT(look(step, ids, 3, out), 0);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(publish(step, ids[i]), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(look(step, ids, 3, out), 3);

  kill_wait(rs.pid, SIGKILL);
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
  rs.pid = spawn_redis(rs.port, NULL);
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
  redis_server_stop(&rs);
}

TEST(redis_stopped_server_lookups_bounded_by_timeout) {
  redis_server rs;
  if (!redis_server_start(&rs, "?timeout_ms=200&connect_timeout_ms=200"))
    return;
  encache *ec = open_engine(rs.url);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"s1", "s22"};
  int out[2];
  ASSERT_EQ_INT(look(step, ids, 2, out), 0); /* connected, misses */
  kill(rs.pid, SIGSTOP);
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
  kill(rs.pid, SIGCONT);
  int recovered = 0;
  for (int i = 0; i < 300 && !recovered; i++) { /* up to 30 s */
    look(step, ids, 2, out);
    recovered = out[0] == ENCACHE_MISS;
    if (!recovered)
      usleep(100000);
  }
  ASSERT(recovered);
  ASSERT_EQ_INT(encache_close(ec), 0);
  redis_server_stop(&rs);
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
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  int ready[2], go[2];
  ASSERT(pipe(ready) == 0 && pipe(go) == 0);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    sigpipe_default();
    char url[128], b = 0;
    redis_server_url(&rs, NULL, url, sizeof(url));
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
  redisContext *c = connect_to(rs.port);
  redisReply *r = redisCommand(c, "CLIENT KILL TYPE normal SKIPME yes");
  ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
  freeReplyObject(r);
  redisFree(c);
  ASSERT_EQ_INT(write(go[1], "g", 1), 1);
  run_child_expect_exit0(child, "writes after CLIENT KILL");
  redis_server_stop(&rs);
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
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  redisContext *c = connect_to(rs.port);
  redisReply *r = redisCommand(c, "CONFIG SET timeout 1");
  ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
  redisFree(c);
  char url[128];
  redis_server_url(&rs, NULL, url, sizeof(url));
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
    wait_alone(rs.port);
    ASSERT_EQ_INT(look(step, ids, 3, out), 0);
    ASSERT_EQ_INT(out[0], ENCACHE_MISS);
    wait_alone(rs.port);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ_INT(publish(step, ids[i]), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    wait_alone(rs.port);
    ASSERT_EQ_INT(look(step, ids, 3, out), 3);
  }
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_failed, 0);
  ASSERT_EQ_U64(st.published_written, 9);
  ASSERT_EQ_INT(encache_close(ec), 0);
  redis_server_stop(&rs);
}
