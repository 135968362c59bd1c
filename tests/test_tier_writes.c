/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiered Store's writes and promotion queue (src/store/tier*.c): a
 * full queue drops without waiting, writes answer as the shared tier, a
 * removal beats a pending promotion.
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

/* The promotion thread, held in its local write; the queue fills. */
static int hold_fd[2];
static void hold_promotion(void) {
  char c;
  while (read(hold_fd[0], &c, 1) < 0) {
  }
}

TEST(tier_full_promotion_queue_drops_without_waiting) {
  world w;
  if (world_start(&w, "4MiB", 2, 0) < 0)
    return;
  enum { N = 12 };
  char keys[N][64];
  for (int i = 0; i < N; i++) {
    char name[16];
    snprintf(name, sizeof(name), "q-%d", i);
    key_of(keys[i], name);
    tier_put(w.remote, keys[i], (unsigned)i + 1);
  }
  ASSERT_EQ_INT(pipe(hold_fd), 0);
  encache__shm_write_hook = hold_promotion;
  int64_t res[N];
  unsigned seeds[N];
  for (int i = 0; i < N; i++)
    seeds[i] = (unsigned)i + 1;
  /* Returns with every hit while the promotion thread is held. */
  read_n(w.tier, keys, N, res, seeds);
  for (int i = 0; i < N; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_queued + s.tier_promotions_dropped, N);
  /* At most the two queued and the one being written. */
  ASSERT(s.tier_promotions_queued <= 3);
  ASSERT(s.tier_promotions_dropped >= N - 3);
  ASSERT_EQ_U64(s.tier_promotions_done, 0);
  ASSERT_EQ_INT((int)write(hold_fd[1], "xxxxxxxxxxxx", N), N);
  encache__tier_drain(w.tier);
  encache__shm_write_hook = NULL;
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_done, s.tier_promotions_queued);
  close(hold_fd[0]), close(hold_fd[1]);
  world_stop(&w);
}

TEST(tier_writes_answer_as_the_shared_tier) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char a[64], b[64];
  key_of(a, "only-local");
  key_of(b, "only-remote");
  tier_put(w.local, a, 1);
  tier_put(w.remote, b, 2);
  unsigned char obj[OBJ_LEN];
  make_obj(obj, 3);
  /* New to the shared tier: written (the local copy stays as it was). */
  ASSERT_EQ_INT(encache_store_write(w.tier, a, NULL, 0, obj, OBJ_LEN), 0);
  ASSERT_EQ_INT(has(w.remote, a), 1);
  /* The shared tier has it: present (EEXIST), and not written locally:
   * this host serves the fleet's object (seed 2), never its own. */
  ASSERT_EQ_INT(encache_store_write(w.tier, b, NULL, 0, obj, OBJ_LEN),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT(has(w.local, b), 0);
  /* Never replaced in either tier. */
  char keys[2][64];
  memcpy(keys[0], a, 64);
  memcpy(keys[1], b, 64);
  int64_t res[2];
  unsigned local_seeds[2] = {1, 0};
  read_n(w.local, keys, 2, res, local_seeds);
  unsigned remote_seeds[2] = {3, 2};
  read_n(w.remote, keys, 2, res, remote_seeds);
  /* Through the tier, b is the remote's, and so is its promoted copy. */
  unsigned tier_seeds[2] = {1, 2};
  read_n(w.tier, keys, 2, res, tier_seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  encache__tier_drain(w.tier);
  read_n(w.local, keys, 2, res, tier_seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  /* Removal: both tiers; ENOENT once neither has it. */
  ASSERT_EQ_INT(encache_store_remove(w.tier, a), 0);
  ASSERT_EQ_INT(has(w.local, a), 0);
  ASSERT_EQ_INT(has(w.remote, a), 0);
  ASSERT_EQ_INT(encache_store_remove(w.tier, a), ENCACHE_ENOENT);
  /* Leases are the shared tier's. */
  ASSERT_EQ_INT(encache_store_lease_take(w.tier, b, 11, 5000), 0);
  ASSERT_EQ_INT(encache_store_lease_take(w.remote, b, 12, 5000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_take(w.local, b, 12, 5000), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(w.tier, b, 11), 0);
  world_stop(&w);
}

/* A removal (remove, remove_prefix) while the promotion of the object is
 * being written, or queued: the object does not come back in the local
 * tier. */
static int entered_fd[2];
static void enter_and_hold(void) {
  ASSERT_EQ_INT((int)write(entered_fd[1], "e", 1), 1);
  hold_promotion();
}

TEST(tier_removal_beats_a_pending_promotion) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  /* A tier without the fault Store (which cannot list: no purge). */
  encache_store *tier = NULL;
  ASSERT_EQ_INT(encache__tier_wrap(open_url(w.local_url),
                                   open_url(w.remote_url), "tier:test", 0, 0,
                                   &tier),
                0);
  char keys[3][64], prefix[64];
  key_of(keys[0], "being-written");
  key_of(keys[1], "pre/queued");
  key_of(keys[2], "kept");
  key_of(prefix, "pre/");
  for (int i = 0; i < 3; i++)
    tier_put(w.remote, keys[i], (unsigned)i + 1);
  ASSERT_EQ_INT(pipe(hold_fd), 0);
  ASSERT_EQ_INT(pipe(entered_fd), 0);
  encache__shm_write_hook = enter_and_hold;
  int64_t res[3];
  read_n(tier, keys, 1, res, NULL); /* keys[0]: its write is held */
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  char c;
  ASSERT_EQ_INT((int)read(entered_fd[0], &c, 1), 1);
  read_n(tier, keys + 1, 2, res, NULL); /* queued behind it */
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(stats_of(tier).tier_promotions_queued, 3);
  ASSERT_EQ_INT(encache_store_remove(tier, keys[0]), 0);
  uint64_t removed = 0;
  ASSERT_EQ_INT(encache_store_remove_prefix(tier, prefix, &removed), 0);
  ASSERT_EQ_U64(removed, 1);
  ASSERT_EQ_INT((int)write(hold_fd[1], "xxx", 3), 3);
  encache__tier_drain(tier);
  encache__shm_write_hook = NULL;
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ_INT(has(w.remote, keys[i]), 0);
    ASSERT_EQ_INT(has(w.local, keys[i]), 0); /* not put back */
    ASSERT_EQ_INT(has(tier, keys[i]), 0);
  }
  ASSERT_EQ_INT(has(w.local, keys[2]), 1); /* another key: promoted */
  encache_store_stats s = stats_of(tier);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 2);
  close(hold_fd[0]), close(hold_fd[1]);
  close(entered_fd[0]), close(entered_fd[1]);
  encache_store_close(tier);
  world_stop(&w);
}
