/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiered Store without its remote tier (src/store/tier*.c): local
 * hits kept through an outage, and the outage as an engine sees it.
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

TEST(tier_remote_outage_keeps_local_hits) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  key_of(keys[0], "here");
  key_of(keys[1], "there");
  key_of(keys[2], "nowhere");
  tier_put(w.tier, keys[0], 1);
  tier_put(w.remote, keys[1], 2);
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  const char *k[3] = {keys[0], keys[1], keys[2]};
  int present[3];
  ASSERT_EQ_INT(encache_store_exists(w.tier, k, 3, present), 0);
  ASSERT_EQ_INT(present[0], 1);
  ASSERT_EQ_INT(encache_store_classify(present[1]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_EQ_INT(encache_store_classify(present[2]), ENCACHE_ANSWER_RECOVERABLE);
  int64_t res[3];
  unsigned seeds[3] = {1, 0, 0};
  read_n(w.tier, keys, 3, res, seeds);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(encache_store_classify(res[1]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_EQ_INT(encache_store_classify(res[2]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(w.tier), "remote tier");
  encache_store_stats s = stats_of(w.tier);
  ASSERT(s.tier_remote_errors >= 4);
  /* Writes: the local tier gets the object, the answer is the remote's. */
  char nk[64];
  key_of(nk, "new");
  unsigned char obj[OBJ_LEN];
  make_obj(obj, 5);
  int rc = encache_store_write(w.tier, nk, NULL, 0, obj, OBJ_LEN);
  ASSERT_EQ_INT(encache_store_classify(rc), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(w.tier), "remote tier");
  ASSERT_EQ_INT(has(w.local, nk), 1);
  world_stop(&w);
}

static int t_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *data = malloc(nbytes ? nbytes : 1);
  *handle = NULL;
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void t_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

/* Looks ids up through ec (every outcome into r; hits freed). */
static void engine_lookup(encache *ec, const char *const *ids, int n,
                          encache_result *r, const unsigned char *want) {
  encache_candidate c[4];
  for (int i = 0; i < n; i++)
    c[i] = (encache_candidate){sizeof(c[i]), ids[i], ENCACHE_MODALITY_IMAGE,
                               ENCACHE_FLOAT32, ROWS, COLS,
                               ENCACHE_DEVICE_HOST, 0};
  r[0].size = sizeof(r[0]);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_allocator a = {sizeof(a), NULL, t_alloc, t_release, 0};
  ASSERT(encache_lookup(step, c, (size_t)n, &a, r) >= 0);
  for (int i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(r[i].data, want + ENCACHE_HEADER_SIZE,
                    OBJ_LEN - ENCACHE_HEADER_SIZE);
      free(r[i].data);
    }
  encache_step_close(step);
}

/* The engine over the tier: an object malformed in the remote tier is
 * INCOMPATIBLE and never promoted; with the remote gone, a local object
 * is a HIT, the others UNAVAILABLE (encoded), as over any failing Store,
 * and a local incompatible object stays INCOMPATIBLE. */
TEST(tier_remote_outage_seen_by_an_engine) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  const char *json =
      "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
      "\"ec_producer\", \"ec_connector_extra_config\": "
      "{\"cross_encoder_cache\": true}}";
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "tier/model";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  encache_store *tier = w.tier;
  ASSERT_EQ_INT(encache__open_with_store(&o, w.tier, &ec), 0);
  w.tier = NULL; /* the engine closes it */
  char key[512], fresh[512];
  unsigned char obj[OBJ_LEN], bad[OBJ_LEN];
  make_obj(obj, 3);
  memcpy(bad, obj, OBJ_LEN);
  bad[0] ^= 0xff;
  ASSERT(encache_key(encache_namespace_of(ec), "remote-bad", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, key, NULL, 0, bad, OBJ_LEN), 0);
  ASSERT(encache_key(encache_namespace_of(ec), "fresh", fresh, sizeof(fresh)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, fresh, NULL, 0, obj, OBJ_LEN), 0);
  static const char *const first[2] = {"remote-bad", "fresh"};
  encache_result r[3];
  engine_lookup(ec, first, 2, r, obj);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_HIT);
  encache__tier_drain(tier);
  ASSERT_EQ_INT(has(w.local, key), 0);
  ASSERT_EQ_INT(has(w.local, fresh), 1);
  ASSERT(encache_key(encache_namespace_of(ec), "local", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.local, key, NULL, 0, obj, OBJ_LEN), 0);
  /* An incompatible object (bad magic) in the local tier: INCOMPATIBLE,
   * never replaced by the remote's good one. */
  ASSERT(encache_key(encache_namespace_of(ec), "broken", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.local, key, NULL, 0, bad, OBJ_LEN), 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, key, NULL, 0, obj, OBJ_LEN), 0);
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  static const char *const ids[3] = {"local", "broken", "remote"};
  engine_lookup(ec, ids, 3, r, obj);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(encache_close(ec), 0);
  world_stop(&w);
}
