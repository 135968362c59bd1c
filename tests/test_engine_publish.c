/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's publication: end-to-end scenarios (case 9), a fatal error
 * after the reaper looked (case 15), steps that publish independently.
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* One encoder step over ids: lookup, encode the non-hits (counted), check
 * every output bit-exact, publish what was encoded. */
static void encoder_step(encache *ec, const char *const *ids, int n,
                         int *encoded) {
  encache_result r[16];
  talloc t = {0};
  encache_step *step = step_of(ec);
  int hits = lookup_ids(step, ids, n, r, &t);
  ASSERT(hits >= 0);
  for (int i = 0; i < n; i++) {
    float want[ROWS * COLS];
    encode(ids[i], want);
    if (r[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
      free(r[i].data);
      continue;
    }
    (*encoded)++;
    int q = publish_ref(step, ids[i]);
    ASSERT(q == ENCACHE_QUEUED);
  }
  encache_step_close(step);
  ASSERT_EQ_INT(encache_flush(ec), 0);
}

TEST(engine_case09_end_to_end_scenarios) {
  static const char *const ids[] = {"e1", "e2", "e3", "e4"};
  enum { ALL_MISS, OLD_PROTOCOL, ALL_HIT, PARTIAL, NOT_FOUND, SHORT, LEASE,
         REGISTRATION, NSCEN };
  for (int run = 0; run < 2 * NSCEN; run++) { /* staged, then direct */
    int sc = run % NSCEN;
    if (run >= NSCEN && sc == REGISTRATION)
      continue; /* direct reads register nothing */
    env e;
    env_init(&e, run < NSCEN);
    encache *ec = open_default(&e);
    const char *ns = encache_namespace_of(ec);
    int seeded = 0;
    if (sc == OLD_PROTOCOL) {
      char old[512];
      snprintf(old, sizeof(old), "%.*sprotocol:v2", (int)(strlen(ns) - 11), ns);
      seed(&e, old, ids, 4);
    } else if (sc == ALL_HIT || sc == NOT_FOUND || sc == SHORT ||
               sc == LEASE || sc == REGISTRATION) {
      seed(&e, ns, ids, 4);
      seeded = 4;
    } else if (sc == PARTIAL) {
      seed(&e, ns, ids, 2);
      seeded = 2;
    }
    if (sc == NOT_FOUND) {
      e.ctl.read_mode = READ_ITEM_CODE;
      e.ctl.read_item_code = ENCACHE_ENOENT;
    } else if (sc == SHORT) {
      e.ctl.read_mode = READ_SHORT;
    } else if (sc == LEASE) {
      e.ctl.read_mode = READ_ITEM_CODE;
      e.ctl.read_item_code = ENCACHE_EUNAVAIL; /* lease expired */
    } else if (sc == REGISTRATION) {
      e.ctl.fail_register_from = 1;
    }
    int encoded = 0;
    encoder_step(ec, ids, 4, &encoded);
    int expect_encoded =
        sc == ALL_HIT ? 0 : sc == PARTIAL ? 2 : (seeded && sc != NOT_FOUND &&
                                                 sc != SHORT && sc != LEASE &&
                                                 sc != REGISTRATION) ? 0 : 4;
    if (encoded != expect_encoded)
      test__fail(__FILE__, __LINE__, "scenario %d: encoded %d, expected %d",
                 sc, encoded, expect_encoded);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.registered, 0); /* nothing stays registered */
    if (sc == ALL_MISS) {
      /* A fresh handle loads everything the first one published. */
      fault_ctl_init(&e.ctl);
      encache *ec2 = open_default(&e);
      encoded = 0;
      encoder_step(ec2, ids, 4, &encoded);
      ASSERT_EQ_INT(encoded, 0);
      ASSERT_EQ_INT(encache_close(ec2), 0);
    }
    encache_shm_destroy(e.seg);
  }
}

TEST(engine_case15_fatal_after_reaper_looked) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"f1", "f2", "f3"};
  encache_result r[3];
  talloc t = {0};
  lookup_ids(step, ids, 3, r, &t);
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "f1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0); /* f1 written and released */
  ASSERT_EQ_INT(storage_releases, 1);
  e.ctl.hold_writes = 1;
  ASSERT_EQ_INT(publish_ref(step, "f2"), ENCACHE_QUEUED);
  fault_wait_held(&e.ctl, 1);
  /* The reaper looks while f2 is in flight: nothing to report yet. */
  ASSERT_EQ_INT(lookup_ids(step, ids + 2, 1, r, &t), 0);
  e.ctl.write_rc = ENCACHE_EUNCONFIRMED;
  fault_release_writes(&e.ctl);
  wait_worker_idle(ec);
  /* Caught by the next reap; later publications fail. */
  ASSERT_EQ_INT(publish_ref(step, "f3"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(publish_ref(step, "f3"), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), ENCACHE_EPOISONED);
  /* f1's, and the two refused f3's (never retained); f2's is kept. */
  ASSERT_EQ_INT(storage_releases, 3);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(storage_releases, 3);
}

/* A pipelined server: step B is looked up before step A publishes; each
 * publishes its own candidates, and only those. */
TEST(engine_steps_publish_independently) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *a = step_of(ec), *b = step_of(ec);
  static const char *const ida[] = {"pa1", "pa2"};
  static const char *const idb[] = {"pb1", "pb2"};
  encache_result r[6];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(a, ida, 2, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(b, idb, 2, r, &t), 0);
  for (int i = 0; i < 2; i++)
    ASSERT_EQ_INT(publish_ref(a, ida[i]), ENCACHE_QUEUED);
  /* An id of A published on B is not B's candidate, nor the reverse. */
  ASSERT_EQ_INT(publish_ref(b, "pa1"), ENCACHE_SKIP_NOT_CANDIDATE);
  ASSERT_EQ_INT(publish_ref(a, "pb1"), ENCACHE_SKIP_NOT_CANDIDATE);
  encache_step_close(a); /* its queued publications are not affected */
  for (int i = 0; i < 2; i++)
    ASSERT_EQ_INT(publish_ref(b, idb[i]), ENCACHE_QUEUED);
  /* Several lookups on one step add to it. */
  encache_step *c = step_of(ec);
  static const char *const idc[] = {"pc1", "pc2"};
  ASSERT_EQ_INT(lookup_ids(c, idc, 1, r, &t), 0);
  ASSERT_EQ_INT(lookup_ids(c, idc + 1, 1, r, &t), 0);
  ASSERT_EQ_INT(publish_ref(c, "pc1"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(c, "pc2"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats s = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &s), 0);
  ASSERT_EQ_U64(s.published_written, 6);
  ASSERT_EQ_U64(s.published_skipped[ENCACHE_SKIP_NOT_CANDIDATE], 2);
  ASSERT_EQ_U64(s.steps_open, 2);
  /* Everything published loads, bit-exact. */
  static const char *const all[] = {"pa1", "pa2", "pb1", "pb2", "pc1", "pc2"};
  encache_step *d = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(d, all, 6, r, &t), 6);
  for (int i = 0; i < 6; i++) {
    float want[ROWS * COLS];
    encode(all[i], want);
    ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
  }
  free_hits(r, 6);
  encache_step_close(b);
  encache_step_close(c);
  encache_step_close(d);
  encache_step_close(NULL);
  ASSERT_EQ_INT(encache_stats_get(ec, &s), 0);
  ASSERT_EQ_U64(s.steps_open, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}
