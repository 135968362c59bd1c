/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Redis Cluster with replicas whose master fails over, for single
 * flight's leases (src/store/redis/lease.c): a lease the replica had is
 * still held after the failover, through the promoted replica, and ends
 * as before; the calls made during the failover answer in bounded time,
 * never a lease that is not there.  (A lease the replica did not have yet
 * is lost: a second encoder then takes it and encodes too, which
 * docs/stores.md says; a test cannot make that window on purpose.)
 */
#include "redis_util.h"
#include "runner.h"

#include "encache.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NODES 6 /* 3 masters, a replica each */

typedef struct replicated {
  char dir[64];
  int port[NODES];
  pid_t pid[NODES];
  char url[512];
} replicated;

static int cluster_ok(int port) {
  redisContext *c = connect_to(port);
  redisReply *r = c && !c->err ? redisCommand(c, "CLUSTER INFO") : NULL;
  int ok = r && r->str && strstr(r->str, "cluster_state:ok") != NULL;
  if (r)
    freeReplyObject(r);
  if (c)
    redisFree(c);
  return ok;
}

static void replicated_start(replicated *rc) {
  snprintf(rc->dir, sizeof(rc->dir), "/tmp/encache-failover-%d",
           (int)getpid());
  mkdir(rc->dir, 0700);
  char cmd[1024];
  int n = snprintf(cmd, sizeof(cmd), "redis-cli --cluster create");
  for (int i = 0; i < NODES; i++) {
    rc->port[i] = free_port();
    rc->pid[i] = spawn_redis(rc->port[i], rc->dir);
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " 127.0.0.1:%d",
                  rc->port[i]);
  }
  snprintf(cmd + n, sizeof(cmd) - (size_t)n,
           " --cluster-replicas 1 --cluster-yes >/dev/null 2>&1");
  ASSERT_EQ_INT(system(cmd), 0);
  for (int i = 0; i < NODES; i++) {
    int ok = 0;
    for (int k = 0; k < 400 && !ok; k++) { /* up to 20 s */
      ok = cluster_ok(rc->port[i]);
      if (!ok)
        usleep(50000);
    }
    ASSERT(ok);
  }
  n = snprintf(rc->url, sizeof(rc->url), "redis-cluster://");
  for (int i = 0; i < NODES; i++)
    n += snprintf(rc->url + n, sizeof(rc->url) - (size_t)n, "%s127.0.0.1:%d",
                  i ? "," : "", rc->port[i]);
  snprintf(rc->url + n, sizeof(rc->url) - (size_t)n,
           "?timeout_ms=300&connect_timeout_ms=300");
}

static void replicated_stop(replicated *rc) {
  for (int i = 0; i < NODES; i++)
    if (rc->pid[i] > 0)
      kill_wait(rc->pid[i], SIGKILL);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", rc->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "# could not remove %s\n", rc->dir);
}

/* The index of the master serving key's slot, asked of node `from`. */
static int master_of(replicated *rc, int from, const char *key) {
  return slot_owner(rc->port, NODES, rc->port[from], key);
}

/* Waits (WAIT 1) until the master at port has given its writes to its
 * replica, at most 30 s (a replica may still be in its first full sync
 * after the cluster is created); 1 when it has. */
static int replicated_to_one(int port, const char *key) {
  redisContext *c = connect_to(port);
  /* WAIT counts the replicas that acknowledged this connection's own last
   * write: a write of a key in the lease's slot (its hash tag), after the
   * lease in the replication stream, so that WAIT covers the lease. */
  redisReply *w = redisCommand(c, "SET {%s}.probe 1", key);
  int ok = 0, wrote = w && w->type == REDIS_REPLY_STATUS;
  if (w)
    freeReplyObject(w);
  for (int k = 0; k < 30 && wrote && !ok; k++) {
    redisReply *r = redisCommand(c, "WAIT 1 1000");
    ok = r && r->type == REDIS_REPLY_INTEGER && r->integer >= 1;
    if (r)
      freeReplyObject(r);
  }
  redisFree(c);
  return ok;
}

/* take(token) until it answers something other than EUNAVAIL (the
 * failover under way), at most 30 s; its last answer. */
static int take_settled(encache_store *st, const char *key, uint64_t token) {
  int rc = ENCACHE_EUNAVAIL;
  double until = now_s() + 30;
  while (rc == ENCACHE_EUNAVAIL && now_s() < until) {
    double t0 = now_s();
    rc = encache_store_lease_take(st, key, token, 60000);
    /* Each call is bounded by the Store's timeouts, not by the failover. */
    ASSERT(now_s() - t0 < 5.0);
    if (rc == ENCACHE_EUNAVAIL)
      usleep(100000);
  }
  return rc;
}

TEST(redis_lease_survives_a_failover_of_its_master) {
  if (!redis_have())
    return;
  replicated rc;
  memset(&rc, 0, sizeof(rc));
  replicated_start(&rc);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(rc.url, &st), 0);
  const char *key = "failover@id:img";
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 111, 60000), 0);
  char lease_key[128];
  snprintf(lease_key, sizeof(lease_key), "encache-lease:%s", key);
  int m = master_of(&rc, 0, lease_key);
  ASSERT(m >= 0);
  ASSERT(replicated_to_one(rc.port[m], lease_key));
  kill_wait(rc.pid[m], SIGKILL);
  rc.pid[m] = 0;
  int other = m == 0 ? 1 : 0, moved = 0;
  for (int k = 0; k < 600 && !moved; k++) { /* the failover: up to 30 s */
    int now = master_of(&rc, other, lease_key);
    moved = now >= 0 && now != m && cluster_ok(rc.port[other]);
    if (!moved)
      usleep(50000);
  }
  ASSERT(moved);
  /* The promoted replica holds the lease: another token is refused, the
   * holder's drop ends it, then it is free. */
  ASSERT_EQ_INT(take_settled(st, key, 222), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 222), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 111), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 222, 60000), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 222), 0);
  encache_store_close(st);
  replicated_stop(&rc);
}
