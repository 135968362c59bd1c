/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's pending budget: unregistration, unconfirmed work and quota
 * (case 12), views and shared storages charged once (cases 13 and 14).
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* Case 12's faults of one write, each a row: the Store's fault, and what
 * the flush, the storage's release, the charge and the close come to. */
static const struct {
  const char *what;
  int registered;        /* a Store that registers memory (env_init) */
  int fail_unregister;   /* its unregistration fails */
  int write_rc;          /* the write's answer (0: written) */
  int flush_rc;          /* encache_flush() and encache_close() */
  int releases;          /* storage releases after the flush */
  uint64_t pending_bytes; /* still charged after the flush */
} case12[] = {
    {"a failed unregistration poisons and keeps the buffers", 1, 1, 0,
     ENCACHE_EPOISONED, 0, 16},
    {"an unconfirmed write result poisons and keeps the tensor", 0, 0,
     ENCACHE_EUNCONFIRMED, ENCACHE_EPOISONED, 0, 16},
    {"a quota-exceeded write is recoverable and releases the tensor", 0, 0,
     ENCACHE_EUNAVAIL, 0, 1, 0},
};

TEST(engine_case12_unregistration_unconfirmed_quota_budget) {
  static const char *const ids[] = {"u"};
  encache_result r[1];
  talloc t = {0};
  for (size_t k = 0; k < sizeof(case12) / sizeof(case12[0]); k++) {
    printf("# %s\n", case12[k].what);
    env e;
    env_init(&e, case12[k].registered);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    e.ctl.fail_unregister = case12[k].fail_unregister;
    e.ctl.write_rc = case12[k].write_rc;
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_flush(ec), case12[k].flush_rc);
    ASSERT_EQ_INT(storage_releases, case12[k].releases);
    encache_stats s = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &s);
    ASSERT_EQ_U64(s.pending_bytes, case12[k].pending_bytes);
    ASSERT_EQ_INT(encache_close(ec), case12[k].flush_rc);
    encache_shm_destroy(e.seg);
  }
  /* Over budget: skipped, the caller's tensor is not retained. */
  {
    env e;
    env_init(&e, 0);
    encache *ec = open_on(&e, 1 << 20, 32, 8); /* 8 bytes < 16 */
    encache_step *step = step_of(ec);
    lookup_ids(step, ids, 1, r, &t);
    storage_releases = 0;
    ASSERT_EQ_INT(publish_ref(step, "u"), ENCACHE_SKIP_OVER_BYTES);
    ASSERT_EQ_INT(storage_releases, 1); /* released at the caller's unref */
    ASSERT_EQ_INT(e.ctl.write_calls, 0);
    ASSERT_EQ_INT(encache_close(ec), 0);
  }
}

TEST(engine_case13_view_charges_its_whole_storage) {
  env e;
  env_init(&e, 0);
  encache *ec = open_on(&e, 1 << 20, 1, 1 << 20); /* one item at most */
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"v1", "v2"};
  encache_result r[2];
  talloc t = {0};
  lookup_ids(step, ids, 2, r, &t);
  e.ctl.hold_writes = 1;
  float *data;
  encache_storage *s = storage_of(&data, 16); /* 64 bytes */
  int64_t shape[2] = {2, 2};
  encache_tensor v = {sizeof v, data + 4, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  storage_releases = 0;
  ASSERT_EQ_INT(encache_publish(step, "v1", &v, s), ENCACHE_QUEUED);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 64);
  ASSERT_EQ_U64(st.pending_items, 1);
  /* The item limit. */
  encache_tensor v2 = {sizeof v2, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "v2", &v2, s), ENCACHE_SKIP_OVER_ITEMS);
  encache_storage_unref(s);
  ASSERT_EQ_INT(storage_releases, 0);
  fault_wait_held(&e.ctl, 1);
  fault_release_writes(&e.ctl);
  fault_wait_finished(&e.ctl, 1);
  /* Written, but released only at reap. */
  ASSERT_EQ_INT(storage_releases, 0);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(storage_releases, 1);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 0);
  ASSERT_EQ_U64(st.pending_items, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case14_two_views_charged_once) {
  for (int rejected = 0; rejected < 2; rejected++) {
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    static const char *const ids[] = {"w1", "w2"};
    encache_result r[2];
    talloc t = {0};
    lookup_ids(step, ids, 2, r, &t);
    if (rejected)
      e.ctl.write_rc = ENCACHE_EUNAVAIL;
    e.ctl.hold_writes = 1;
    float *data;
    encache_storage *s = storage_of(&data, 16); /* 64 bytes */
    int64_t shape[2] = {ROWS, COLS};
    encache_tensor a = {sizeof a, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    encache_tensor b = {sizeof b, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    storage_releases = 0;
    ASSERT_EQ_INT(encache_publish(step, "w1", &a, s), ENCACHE_QUEUED);
    ASSERT_EQ_INT(encache_publish(step, "w2", &b, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    encache_stats st = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 64);
    ASSERT_EQ_U64(st.pending_items, 2);
    /* Let w1's write through and hold w2's at the gate: once w1's write
     * has finished and w2's is held, the worker has put w1 on the done
     * list and runs w2, which cannot finish before it is released. */
    fault_pass_writes(&e.ctl, 1);
    fault_wait_finished(&e.ctl, 1);
    fault_wait_held(&e.ctl, 1);
    pthread_mutex_lock(&ec->pub->mu);
    int w1_done = ec->pub->done_head != NULL && ec->pub->done_head->next == NULL &&
                  strcmp(ec->pub->done_head->key + strlen(ec->pub->done_head->key) - 2,
                         "w1") == 0;
    int w2_running = ec->pub->running != NULL && ec->pub->queue_head == NULL;
    pthread_mutex_unlock(&ec->pub->mu);
    ASSERT(w1_done);
    ASSERT(w2_running);
    /* Reap the first only: the storage stays charged and retained. */
    ASSERT_EQ_INT(encache__reap(ec), 0);
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 64);
    ASSERT_EQ_U64(st.pending_items, 1);
    ASSERT_EQ_INT(storage_releases, 0);
    fault_release_writes(&e.ctl);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    encache_stats_get(ec, &st);
    ASSERT_EQ_U64(st.pending_bytes, 0);
    ASSERT_EQ_INT(storage_releases, 1);
    ASSERT_EQ_INT(encache_close(ec), 0);
    encache_shm_destroy(e.seg);
  }
}

/* encache_storage_ref(): a caller that dropped its reference takes another
 * from a queued write's, publishes a second view, and the storage is
 * charged once and released once. */
TEST(engine_storage_ref_shares_the_charge) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"r1", "r2"};
  encache_result r[2];
  talloc t = {0};
  lookup_ids(step, ids, 2, r, &t);
  e.ctl.hold_writes = 1;
  float *data;
  encache_storage *s = storage_of(&data, 16); /* 64 bytes */
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor a = {sizeof a, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  encache_tensor b = {sizeof b, data + 8, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  storage_releases = 0;
  ASSERT_EQ_INT(encache_publish(step, "r1", &a, s), ENCACHE_QUEUED);
  encache_storage_unref(s); /* only the queued write holds it now */
  encache_storage_ref(s);   /* no reap can run meanwhile: safe */
  ASSERT_EQ_INT(encache_publish(step, "r2", &b, s), ENCACHE_QUEUED);
  encache_storage_unref(s);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.pending_bytes, 64);
  ASSERT_EQ_U64(st.pending_items, 2);
  ASSERT_EQ_INT(storage_releases, 0);
  fault_release_writes(&e.ctl);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(storage_releases, 1);
  encache_storage_ref(NULL); /* a no-op */
  ASSERT_EQ_INT(encache_close(ec), 0);
  encache_shm_destroy(e.seg);
}
