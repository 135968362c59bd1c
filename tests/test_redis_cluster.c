/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store on a three-master Redis Cluster: a node killed, MOVED
 * and ASK redirections, an unreachable cluster.
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
