/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiered Store's hits (src/store/tier*.c): a local hit never asks the
 * remote, a remote hit is promoted, an incompatible remote object never
 * is, a local eviction is refilled from the remote, object sizes and
 * empty objects are local hits.
 * On a real shm segment in front of a real redis-server that each test
 * starts on a free port; tests say "skipped" and pass without
 * redis-server.  The world they share is in tests/tier_util.c.
 */
#include "tier_util.h"

#include "fault_store.h"
#include "redis_util.h"
#include "runner.h"
#include "engine.h"
#include "shm/testing.h"
#include "tier.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(tier_local_hit_never_asks_the_remote) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  unsigned seeds[3] = {1, 2, 3};
  for (int i = 0; i < 3; i++) {
    key_of(keys[i], i == 0 ? "a" : i == 1 ? "b" : "c");
    tier_put(w.tier, keys[i], seeds[i]);
    ASSERT_EQ_INT(has(w.local, keys[i]), 1); /* written to both */
    ASSERT_EQ_INT(has(w.remote, keys[i]), 1);
  }
  int exists0 = w.ctl.exists_calls, read0 = w.ctl.read_calls;
  int64_t res[3];
  const char *k[3] = {keys[0], keys[1], keys[2]};
  int present[3];
  ASSERT_EQ_INT(encache_store_exists(w.tier, k, 3, present), 0);
  ASSERT(present[0] == 1 && present[1] == 1 && present[2] == 1);
  read_n(w.tier, keys, 3, res, seeds);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  ASSERT_EQ_INT(w.ctl.exists_calls, exists0); /* the remote never asked */
  ASSERT_EQ_INT(w.ctl.read_calls, read0);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 3);
  ASSERT_EQ_U64(s.tier_remote_hits, 0);
  /* With the remote server gone, local hits are still hits. */
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  read_n(w.tier, keys, 3, res, seeds);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  world_stop(&w);
}

TEST(tier_remote_hit_is_promoted_then_local) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  unsigned seeds[3] = {7, 8, 0};
  key_of(keys[0], "local");
  key_of(keys[1], "remote");
  key_of(keys[2], "absent");
  tier_put(w.tier, keys[0], 7);
  tier_put(w.remote, keys[1], 8); /* another host published it */
  int read0 = w.ctl.read_calls;
  int64_t res[3];
  read_n(w.tier, keys, 3, res, seeds);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  ASSERT_EQ_INT(res[2], ENCACHE_ENOENT);
  ASSERT_EQ_INT(w.ctl.read_calls, read0 + 1); /* one batch for both */
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, keys[1]), 1); /* promoted */
  ASSERT_EQ_INT(has(w.local, keys[2]), 0);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 1);
  ASSERT_EQ_U64(s.tier_remote_hits, 1);
  ASSERT_EQ_U64(s.tier_promotions_queued, 1);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 0);
  /* The next lookup of it is a local hit: the remote is not asked. */
  read_n(w.tier, keys, 2, res, seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  ASSERT_EQ_INT(w.ctl.read_calls, read0 + 1);
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 3);
  /* Split reads (the engine's) promote the whole object too. */
  char k2[64];
  key_of(k2, "split");
  tier_put(w.remote, k2, 9);
  unsigned char head[ENCACHE_HEADER_SIZE], body[OBJ_LEN], want[OBJ_LEN];
  const char *kk = k2;
  void *heads[1] = {head}, *bufs[1] = {body};
  size_t caps[1] = {OBJ_LEN - ENCACHE_HEADER_SIZE};
  ASSERT_EQ_INT(w.tier->ops->read_split(w.tier, &kk, 1, ENCACHE_HEADER_SIZE,
                                        heads, bufs, caps, res),
                0);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  encache__tier_drain(w.tier);
  unsigned char got[OBJ_LEN];
  void *gb[1] = {got};
  size_t gc[1] = {OBJ_LEN};
  ASSERT_EQ_INT(encache_store_read(w.local, &kk, 1, gb, gc, res), 0);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  make_obj(want, 9);
  ASSERT_EQ_MEM(got, want, OBJ_LEN);
  /* A large object (above TIER_COPY_MAX) is read again from the remote
   * by the promotion thread, not copied by the lookup. */
  enum { BIG = ENCACHE_HEADER_SIZE + 4 * 100000 };
  static unsigned char big[BIG], back[BIG];
  int64_t shape[2] = {1, 100000};
  encache_tensor tb = {sizeof tb, big + ENCACHE_HEADER_SIZE, ENCACHE_FLOAT32, 2,
                       shape, NULL, 0, 0, NULL};
  for (size_t i = ENCACHE_HEADER_SIZE; i < BIG; i++)
    big[i] = (unsigned char)(i * 7);
  ASSERT_EQ_INT(encache_header_encode(&tb, big), 0);
  key_of(k2, "big");
  ASSERT_EQ_INT(encache_store_write(w.remote, k2, NULL, 0, big, BIG), 0);
  void *bb[1] = {back};
  size_t bc[1] = {BIG};
  int r0 = w.ctl.read_calls;
  ASSERT_EQ_INT(encache_store_read(w.tier, &kk, 1, bb, bc, res), 0);
  ASSERT_EQ_INT(res[0], BIG);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(w.ctl.read_calls, r0 + 2); /* the lookup's, the thread's */
  memset(back, 0, BIG);
  ASSERT_EQ_INT(encache_store_read(w.local, &kk, 1, bb, bc, res), 0);
  ASSERT_EQ_INT(res[0], BIG);
  ASSERT_EQ_MEM(back, big, BIG);
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_done, 3);
  world_stop(&w);
}

TEST(tier_incompatible_remote_object_never_promoted) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  key_of(keys[0], "bad-magic");
  key_of(keys[1], "bad-length");
  key_of(keys[2], "good");
  unsigned char obj[OBJ_LEN + 4];
  make_obj(obj, 4);
  obj[0] ^= 0xff;
  ASSERT_EQ_INT(encache_store_write(w.remote, keys[0], NULL, 0, obj, OBJ_LEN), 0);
  make_obj(obj, 4);
  memset(obj + OBJ_LEN, 0, 4);
  ASSERT_EQ_INT(encache_store_write(w.remote, keys[1], NULL, 0, obj, OBJ_LEN - 4), 0);
  tier_put(w.remote, keys[2], 5);
  int64_t res[3];
  read_n(w.tier, keys, 3, res, NULL);
  ASSERT_EQ_INT(res[0], OBJ_LEN); /* delivered as read: the engine judges */
  ASSERT_EQ_INT(res[1], OBJ_LEN - 4);
  ASSERT_EQ_INT(res[2], OBJ_LEN);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, keys[0]), 0);
  ASSERT_EQ_INT(has(w.local, keys[1]), 0);
  ASSERT_EQ_INT(has(w.local, keys[2]), 1);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_remote_hits, 3);
  ASSERT_EQ_U64(s.tier_promotions_queued, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 2);
  world_stop(&w);
}

/* A remote hit served without its check (Redis, checksum=on: an object an
 * older writer SET raw) is not promoted: in the local segment it would get
 * a sum of its own and be served as checked.  It stays a remote hit,
 * counted as one without a check each time; an object with its check in
 * the same read is promoted as ever (a read that served one check-less
 * object promotes none of its hits, so they go in two reads here). */
TEST(tier_remote_object_without_its_check_is_not_promoted) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char url[300], keys[2][64];
  snprintf(url, sizeof(url), "tier:%s+%s", w.local_url, w.remote_url);
  encache_store *tier = open_url(url);
  key_of(keys[0], "checked");
  key_of(keys[1], "bare");
  tier_put(w.remote, keys[0], 3); /* with its check (checksum=on) */
  unsigned char obj[OBJ_LEN];
  make_obj(obj, 4);
  redis_raw raw;
  raw_open(&raw, w.remote_url);
  raw_set(&raw, keys[1], obj, OBJ_LEN); /* without one */
  raw_close(&raw);
  unsigned seeds[2] = {3, 4};
  int64_t res[2];
  uint64_t served = 0;
  for (int round = 0; round < 2; round++) {
    read_n(tier, &keys[0], 1, res, &seeds[0]);
    ASSERT_EQ_INT(res[0], OBJ_LEN);
    read_n(tier, &keys[1], 1, res, &seeds[1]);
    ASSERT_EQ_INT(res[0], OBJ_LEN); /* served, as checksum=on says */
    encache__tier_drain(tier);
    ASSERT_EQ_INT(has(w.local, keys[0]), 1);
    ASSERT_EQ_INT(has(w.local, keys[1]), 0);
    ASSERT_EQ_INT(encache__store_control(tier, ENCACHE__CONTROL_UNCHECKED,
                                         &served), 0);
    ASSERT_EQ_U64(served, (uint64_t)round + 1);
  }
  encache_store_stats s = stats_of(tier);
  ASSERT_EQ_U64(s.tier_local_hits, 1);  /* "checked", the second time */
  ASSERT_EQ_U64(s.tier_remote_hits, 3); /* "bare" both times */
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 2);
  encache_store_close(tier);
  world_stop(&w);
}

TEST(tier_local_eviction_refilled_from_the_remote) {
  world w;
  if (world_start(&w, "1MiB", 0, 0) < 0)
    return;
  /* 64 objects of 32 KiB: twice the segment.  The first ones are evicted
   * locally, stay in the remote, and come back from it. */
  enum { N = 64, LEN = 32 << 10 };
  static unsigned char obj[LEN], got[LEN];
  char key[N][64];
  for (int i = 0; i < N; i++) {
    char name[16];
    snprintf(name, sizeof(name), "big-%d", i);
    key_of(key[i], name);
    /* A v3 header of a 1 x (LEN-24)/4 float32 matrix, payload of seed i. */
    int64_t shape[2] = {1, (LEN - ENCACHE_HEADER_SIZE) / 4};
    encache_tensor t = {sizeof t, obj + ENCACHE_HEADER_SIZE, ENCACHE_FLOAT32, 2,
                        shape, NULL, 0, 0, NULL};
    memset(obj + ENCACHE_HEADER_SIZE, i + 1, LEN - ENCACHE_HEADER_SIZE);
    ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
    ASSERT_EQ_INT(encache_store_write(w.tier, key[i], NULL, 0, obj, LEN), 0);
  }
  ASSERT_EQ_INT(has(w.local, key[0]), 0); /* evicted here */
  ASSERT_EQ_INT(has(w.remote, key[0]), 1);
  ASSERT(stats_of(w.local).evictions > 0);
  const char *k = key[0];
  void *b[1] = {got};
  size_t caps[1] = {LEN};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
  ASSERT_EQ_INT(res[0], LEN);
  ASSERT_EQ_INT(got[LEN - 1], 1);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, key[0]), 1); /* promoted again */
  int read0 = w.ctl.read_calls;
  ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
  ASSERT_EQ_INT(res[0], LEN);
  ASSERT_EQ_INT(w.ctl.read_calls, read0); /* a local hit now */
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_remote_hits, 1);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  world_stop(&w);
}

/* object_size and reads answer from the local tier when it has the
 * object, an empty object included, whatever the remote says or whether
 * it is up. */
TEST(tier_object_size_and_empty_objects_are_local_hits) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char lonly[64], empty[64];
  key_of(lonly, "lonly");
  key_of(empty, "empty");
  tier_put(w.local, lonly, 1);
  ASSERT_EQ_INT(encache_store_write(w.local, empty, NULL, 0, "", 0), 0);
  for (int down = 0; down < 2; down++) {
    uint64_t len = 0;
    ASSERT_EQ_INT(encache_store_object_size(w.tier, lonly, &len), 0);
    ASSERT_EQ_U64(len, OBJ_LEN);
    len = 7;
    ASSERT_EQ_INT(encache_store_object_size(w.tier, empty, &len), 0);
    ASSERT_EQ_U64(len, 0);
    int read0 = w.ctl.read_calls;
    uint64_t hits0 = stats_of(w.tier).tier_local_hits;
    const char *k = empty;
    unsigned char buf[8];
    void *b[1] = {buf};
    size_t caps[1] = {sizeof(buf)};
    int64_t res[1] = {-1};
    ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(w.ctl.read_calls, read0); /* the remote not asked */
    ASSERT_EQ_U64(stats_of(w.tier).tier_local_hits, hits0 + 1);
    if (!down) {
      kill_wait(w.redis, SIGKILL);
      w.redis = exit_redis = 0;
    }
  }
  world_stop(&w);
}
