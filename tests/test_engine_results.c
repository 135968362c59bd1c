/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's caller structs and results: candidates and results strided
 * by their size, the reason of each result, null arguments named.
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

typedef struct wide_cand {
  encache_candidate c;
  uint64_t newer; /* a field of a newer header */
} wide_cand;

typedef struct wide_result {
  encache_result r;
  uint64_t newer;
} wide_result;

/* The allocator is handed the caller's own candidate. */
static int wide_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **handle) {
  ASSERT_EQ_U64(c->size, sizeof(wide_cand));
  return ta_alloc(ctx, i, c, nbytes, data, handle);
}

TEST(engine_candidates_and_results_strided_by_size) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"w0", "w1", "w2"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  wide_cand wc[3];
  wide_result wr[3];
  memset(wr, 0xab, sizeof(wr));
  for (int i = 0; i < 3; i++) {
    wc[i].c = cand(ids[i]);
    wc[i].c.size = sizeof(wide_cand);
    wc[i].newer = 0;
  }
  wr[0].r.size = sizeof(wide_result);
  talloc t = {0};
  encache_allocator a = {sizeof(a), &t, wide_alloc, ta_release, 0};
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r), 2);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ_U64(wr[i].r.size, sizeof(wide_result));
    ASSERT_EQ_U64(wr[i].newer, 0); /* a field this library does not know */
    ASSERT_EQ_INT(wr[i].r.outcome, i < 2 ? ENCACHE_HIT : ENCACHE_MISS);
  }
  float want[ROWS * COLS];
  encode("w1", want);
  ASSERT_EQ_MEM(wr[1].r.data, want, sizeof(want));
  free(wr[0].r.data);
  free(wr[1].r.data);
  ASSERT_EQ_INT(publish_ref(step, "w2"), ENCACHE_QUEUED);
  /* A newer field set is refused, naming the candidate. */
  wc[1].newer = 1;
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "candidate 1");
  wc[1].newer = 0;
  /* Sizes that differ within the array, or an older one. */
  wc[2].c.size = sizeof(encache_candidate);
  ASSERT_EQ_INT(encache_lookup(step, &wc[0].c, 3, &a, &wr[0].r),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "candidate 2");
  encache_candidate old = cand("w0");
  old.size = sizeof(old) - sizeof(int);
  encache_result r1 = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &a, &r1), ENCACHE_EINVAL);
  old.size = sizeof(old);
  r1.size = offsetof(encache_result, nbytes);
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &a, &r1), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size");
  r1.size = sizeof(r1);
  encache_allocator olda = a;
  olda.size = offsetof(encache_allocator, release); /* older than 1.0 */
  ASSERT_EQ_INT(encache_lookup(step, &old, 1, &olda, &r1), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "allocator");
  ASSERT_EQ_INT(t.allocs, t.releases + 2); /* no refused lookup allocated */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* Every outcome that is not a HIT carries its cause (result.why), kept by
 * the step until it closes; a HIT's is NULL. */
TEST(engine_results_say_why) {
  env e;
  env_init(&e, 0);
  encache *ec = open_on(&e, 1 << 20, 32, 1 << 30);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"y0", "y1"};
  seed(&e, encache_namespace_of(ec), ids, 1);
  encache_candidate c[5] = {cand("y0"), cand("y1"), cand("vid"), cand("gpu"),
                            cand("y0")};
  c[2].modality = ENCACHE_MODALITY_VIDEO;
  c[3].device = ENCACHE_DEVICE_CUDA; /* no CUDA runtime (test_device_*.c) */
  setenv("ENCACHE_CUDA_LIBRARY", "/nonexistent/libcudart.so", 1);
  c[4].rows = ROWS * COLS; /* same bytes, another shape */
  c[4].cols = 1;
  encache_result r[5];
  memset(r, 0x5a, sizeof(r)); /* every why must be written */
  r[0].size = sizeof(r[0]);
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 5, &a, r), 1);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT(r[0].why == NULL);
  free(r[0].data);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[2].why, "not an image");
  ASSERT_EQ_INT(r[3].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[3].why, "CUDA runtime not available");
  ASSERT_EQ_INT(r[4].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_STR(r[4].why, "shape 2x2 (expected 4x1)");
  const char *kept = r[4].why;
  /* UNAVAILABLE: the failed call and its code, batch by batch. */
  e.ctl.exists_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_CONTAINS(r[0].why, "the existence check failed (EUNAVAIL)");
  ASSERT(r[1].why == r[0].why); /* one copy per distinct cause */
  e.ctl.exists_rc = 0;
  e.ctl.read_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_CONTAINS(r[0].why, "the read failed (EUNAVAIL)");
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  e.ctl.read_rc = 0;
  /* An earlier lookup's causes stay valid until the step closes. */
  ASSERT_EQ_STR(kept, "shape 2x2 (expected 4x1)");
  encache_step_close(step);
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* OVERSIZE: both sizes and the option to raise. */
  env_init(&e, 0);
  ec = open_on(&e, 30, 32, 1 << 20);
  step = step_of(ec);
  seed(&e, encache_namespace_of(ec), ids, 1);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_STR(r[0].why, "the object is 40 bytes, larger than the 30-byte "
                          "staging buffer: raise store_read_buffer_bytes to "
                          "at least 40");
  ASSERT_EQ_INT(encache_close(ec), 0);

  /* Off: every candidate SKIPPED, and the rule says so. */
  encache_options off = options("{\"ec_connector_extra_config\": "
                                "{\"cross_encoder_cache\": false}}");
  ASSERT_EQ_INT(encache_open(&off, &ec), 0);
  step = step_of(ec);
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_STR(r[0].why, "cross_encoder_cache is off");
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A caller compiled against 1.0 (no why) gets its results written as far
 * as its size holds, never beyond. */
TEST(engine_results_why_not_written_for_10_callers) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  size_t old = offsetof(encache_result, why);
  unsigned char buf[2 * sizeof(encache_result)];
  memset(buf, 0x77, sizeof(buf));
  encache_result *r0 = (encache_result *)(void *)buf;
  r0->size = old;
  encache_candidate c[2] = {cand("o0"), cand("o1")};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), 0);
  encache_result *r1 = (encache_result *)(void *)(buf + old);
  ASSERT_EQ_INT(r1->outcome, ENCACHE_MISS);
  ASSERT_EQ_U64(r1->size, old);
  for (size_t k = 2 * old; k < sizeof(buf); k++)
    ASSERT_EQ_INT(buf[k], 0x77);
  r0->size = old - 1; /* below 1.0: refused */
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size");
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A results array whose size nobody set (stack garbage, here above
 * ENCACHE__STRUCT_MAX) is refused before anything is allocated or written,
 * even past the first element. */
TEST(engine_results_size_unset_refused) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"u0", "u1"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  static unsigned char buf[3 * 8192];
  memset(buf, 0x55, sizeof(buf));
  encache_result *r0 = (encache_result *)(void *)buf;
  r0->size = 8192;
  encache_candidate c[2] = {cand("u0"), cand("u1")};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r0), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results[0].size 8192");
  ASSERT_EQ_INT(t.allocs, 0);
  for (size_t i = sizeof(size_t); i < sizeof(buf); i++)
    ASSERT_EQ_INT(buf[i], 0x55); /* nothing written */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

/* A lookup that fails as a whole (the allocator refuses the second
 * destination) delivers nothing: every candidate is UNAVAILABLE with the
 * failure as its cause, on the staged and the direct read paths. */
TEST(engine_failed_lookup_all_unavailable) {
  for (int reg = 0; reg < 2; reg++) {
    env e;
    env_init(&e, reg);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    static const char *const ids[] = {"f0", "f1"};
    seed(&e, encache_namespace_of(ec), ids, 2);
    static const char *const ids3[] = {"f0", "f1", "f-absent"};
    encache_result r[3];
    talloc t = {0};
    t.fail_at = 2;
    ASSERT(lookup_ids(step, ids3, 3, r, &t) < 0);
    for (int i = 0; i < 3; i++) {
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_UNAVAILABLE);
      ASSERT_CONTAINS(r[i].why, "the lookup failed");
    }
    /* The second call failed; the first destination came back. */
    ASSERT_EQ_INT(t.allocs, 2);
    ASSERT_EQ_INT(t.releases, 1);
    ASSERT_EQ_INT(encache_close(ec), 0);
  }
}

/* NULL candidates or results: EINVAL, and the message names which. */
TEST(engine_lookup_null_arguments_named) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  encache_candidate c[1] = {cand("m0")};
  encache_result r[1] = {ENCACHE_RESULT_INIT};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup(step, c, 1, &a, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results is NULL");
  ASSERT_EQ_INT(encache_lookup(step, NULL, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "c is NULL");
  ASSERT_EQ_INT(encache_close(ec), 0);
}
