/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's steps and shutdown: draining at close (case 16), threads,
 * the bound on open steps, close and poison with steps open.
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

typedef struct closer {
  encache *ec;
  int rc;
} closer;

static void *close_thread(void *p) {
  closer *c = p;
  c->rc = encache_close(c->ec);
  return NULL;
}

TEST(engine_case16_shutdown_drains) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"s1", "s2"};
  encache_result r[2];
  talloc t = {0};
  /* A hit first, so that the staging buffer is registered. */
  seed(&e, encache_namespace_of(ec), ids + 1, 1);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 1);
  free_hits(r, 2);
  e.ctl.hold_writes = 1;
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "s1"), ENCACHE_QUEUED);
  fault_wait_held(&e.ctl, 1);
  closer c = {ec, -1};
  pthread_t th;
  pthread_create(&th, NULL, close_thread, &c);
  /* Once closing, later publications are refused. */
  for (;;) {
    pthread_mutex_lock(&ec->pub->mu);
    int closing = ec->pub->closing;
    pthread_mutex_unlock(&ec->pub->mu);
    if (closing)
      break;
    usleep(1000);
  }
  ASSERT_EQ_INT(publish_ref(step, "s2"), ENCACHE_SKIP_CLOSED);
  /* The write is held, so close cannot return however long this waits:
   * the sleep only gives a close that wrongly returns early the time to
   * do so; it cannot fail a correct one. */
  usleep(20000);
  ASSERT_EQ_INT(c.rc, -1); /* still waiting for the write */
  ASSERT_EQ_INT(e.ctl.close_calls, 0);
  fault_release_writes(&e.ctl);
  pthread_join(th, NULL);
  ASSERT_EQ_INT(c.rc, 0);
  ASSERT_EQ_INT(e.ctl.close_calls, 1);
  ASSERT_EQ_INT(e.ctl.registered, 0);
  ASSERT_EQ_INT(storage_releases, 2); /* s1 after its write, s2 at once */
  /* The written payload is correct. */
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(e.url, &st), 0);
  char ns[512], key[600];
  encache_namespace_params p = {sizeof p,        NULL, "shared/model",
                                test_revision(), NULL, ENCACHE_FLOAT32};
  encache_namespace(&p, ns, sizeof(ns));
  encache_key(ns, "s1", key, sizeof(key));
  unsigned char got[64], want[64];
  size_t len = ref_object("s1", want);
  const char *keys[1] = {key};
  void *bufs[1] = {got};
  size_t caps[1] = {sizeof(got)};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[0], (int64_t)len);
  ASSERT_EQ_MEM(got, want, len);
  encache_store_close(st);
}

/* Lookups and publications from the step thread while the worker writes
 * (ThreadSanitizer runs this one).  A flush every few steps lets the
 * worker catch up however the threads are scheduled. */
TEST(engine_threads_step_and_worker) {
  env e;
  env_init(&e, 1);
  encache *ec = open_on(&e, 4096, 8, 1 << 20);
  char idbuf[64][16];
  const char *ids[8];
  int encoded = 0;
  for (int round = 0; round < 200; round++) {
    for (int k = 0; k < 8; k++) {
      snprintf(idbuf[k], sizeof(idbuf[k]), "t%d", (round * 3 + k) % 40);
      ids[k] = idbuf[k];
    }
    encache_result r[8];
    talloc t = {0};
    encache_candidate c[8];
    for (int k = 0; k < 8; k++)
      c[k] = cand(ids[k]);
    encache_allocator a = allocator(&t);
    encache_step *step = step_of(ec);
    r[0].size = sizeof(r[0]);
    int hits = encache_lookup(step, c, 8, &a, r);
    ASSERT(hits >= 0);
    for (int k = 0; k < 8; k++) {
      float want[ROWS * COLS];
      encode(ids[k], want);
      if (r[k].outcome == ENCACHE_HIT) {
        ASSERT_EQ_MEM(r[k].data, want, sizeof(want));
        free(r[k].data);
      } else {
        encoded++;
        int q = publish_ref(step, ids[k]);
        ASSERT(q >= 0);
      }
    }
    encache_step_close(step);
    if (round % 10 == 9)
      ASSERT_EQ_INT(encache_flush(ec), 0);
  }
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &s);
  if (!(s.hits > 0 && s.published_written > 0))
    test__fail(__FILE__, __LINE__, "hits %llu written %llu queued %llu "
               "failed %llu items-skipped %llu", (unsigned long long)s.hits,
               (unsigned long long)s.published_written,
               (unsigned long long)s.published_queued,
               (unsigned long long)s.published_failed,
               (unsigned long long)s.published_skipped[ENCACHE_SKIP_OVER_ITEMS]);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.registered, 0);
}

TEST(engine_steps_bounded) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *s[ENCACHE_MAX_STEPS + 1];
  for (int i = 0; i < ENCACHE_MAX_STEPS; i++)
    ASSERT_EQ_INT(encache_step_open(ec, &s[i]), 0);
  s[ENCACHE_MAX_STEPS] = (encache_step *)ec; /* must be reset */
  ASSERT_EQ_INT(encache_step_open(ec, &s[ENCACHE_MAX_STEPS]), ENCACHE_ESTEPS);
  ASSERT(s[ENCACHE_MAX_STEPS] == NULL);
  ASSERT_CONTAINS(encache_errmsg(ec), "ENCACHE_MAX_STEPS");
  ASSERT_EQ_STR(encache_err_name(ENCACHE_ESTEPS), "ESTEPS");
  ASSERT_CONTAINS(encache_strerror(ENCACHE_ESTEPS), "too many steps");
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.steps_open, ENCACHE_MAX_STEPS);
  /* Closing one makes room; the new step works. */
  encache_step_close(s[10]);
  ASSERT_EQ_INT(encache_step_open(ec, &s[10]), 0);
  static const char *const ids[] = {"bound"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(s[10], ids, 1, r, &t), 0);
  ASSERT_EQ_INT(publish_ref(s[10], "bound"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(s[11], "bound"), ENCACHE_SKIP_NOT_CANDIDATE);
  /* Closing the handle closes the 64 steps still open. */
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* Disabled: steps open (within the same bound), everything is skipped. */
  encache_options o = options("{\"ec_connector_extra_config\": {}}");
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  encache_step *step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(publish_ref(step, "bound"), ENCACHE_SKIP_DISABLED);
  for (int i = 1; i < ENCACHE_MAX_STEPS; i++)
    ASSERT_EQ_INT(encache_step_open(ec, &s[i]), 0);
  ASSERT_EQ_INT(encache_step_open(ec, &s[0]), ENCACHE_ESTEPS);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* Close with steps open: the queued writes of every step are drained and
 * the steps die with the handle (the sanitizer build checks no leak). */
TEST(engine_close_with_open_steps) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ids[] = {"co1", "co2"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(a, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r, &t), 0);
  e.ctl.hold_writes = 1;
  ASSERT_EQ_INT(publish_ref(a, "co1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(b, "co2"), ENCACHE_QUEUED);
  fault_pass_writes(&e.ctl, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.close_calls, 1);
  fault_ctl_init(&e.ctl);
  ec = open_default(&e);
  encache_step *step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 2);
  free_hits(r, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_poison_with_open_steps) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ids[] = {"pz1", "pz2"};
  seed(&e, encache_namespace_of(ec), ids, 1);
  static encache_result r[2]; /* kept destinations stay reachable */
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r, &t), 0);
  e.ctl.read_mode = READ_ITEM_CODE;
  e.ctl.read_item_code = -12345; /* an unknown code: unconfirmed */
  ASSERT_EQ_INT(lookup_ids(a, ids, 1, r, &t), ENCACHE_EPOISONED);
  /* Every step of the handle fails fast now. */
  ASSERT_EQ_INT(publish_ref(b, "pz2"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(lookup_ids(b, ids + 1, 1, r + 1, &t), ENCACHE_EPOISONED);
  encache_step *c = (encache_step *)ec;
  ASSERT_EQ_INT(encache_step_open(ec, &c), ENCACHE_EPOISONED);
  ASSERT(c == NULL);
  encache_step_close(b); /* safe: the Store never holds a step's memory */
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED); /* a dies with it */
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}
