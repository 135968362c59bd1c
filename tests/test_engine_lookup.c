/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's lookup against the acceptance cases of docs/behaviour.md
 * (cases 3 to 8, 10 and 11): reads, registration, malformed or
 * incompatible objects, duplicates, skipped and ineligible candidates.
 * The fixtures are in tests/engine_util.c.
 */
#include "engine_util.h"

#include "lookup_read.h"
#include "publish_job.h"
#include "publisher.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

TEST(engine_case03_roundtrip_every_dtype) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const int dtypes[] = {ENCACHE_FLOAT32, ENCACHE_FLOAT16,
                               ENCACHE_BFLOAT16};
  static const char *const ids[] = {"f32", "f16", "bf16"};
  unsigned char payload[3][2 * 3 * 4];
  for (int k = 0; k < 3; k++) {
    for (size_t b = 0; b < sizeof(payload[k]); b++)
      payload[k][b] = (unsigned char)(b * 37 + (size_t)k * 101 + 0x80);
    encache_candidate c = cand(ids[k]);
    c.dtype = dtypes[k];
    c.rows = 2;
    c.cols = 3;
    encache_result r = ENCACHE_RESULT_INIT;
    talloc t = {0};
    encache_allocator a = allocator(&t);
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 0);
    ASSERT_EQ_INT(r.outcome, ENCACHE_MISS);
    size_t nbytes = 6 * encache_dtype_size(dtypes[k]);
    unsigned char *copy = malloc(nbytes);
    memcpy(copy, payload[k], nbytes);
    encache_storage *s = NULL;
    encache_storage_new(copy, nbytes, storage_release, copy, &s);
    int64_t shape[2] = {2, 3};
    encache_tensor v = {sizeof v, copy, dtypes[k], 2, shape, NULL, 0, 0, NULL};
    ASSERT_EQ_INT(encache_publish(step, ids[k], &v, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    ASSERT_EQ_INT(encache_flush(ec), 0);
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 1);
    ASSERT_EQ_INT(r.outcome, ENCACHE_HIT);
    ASSERT_EQ_U64(r.nbytes, nbytes);
    ASSERT_EQ_MEM(r.data, payload[k], nbytes);
    free(r.data);
    /* The object is 24 + nbytes long. */
    encache_store *st = NULL;
    encache_store_open(e.url, &st);
    char key[512];
    encache_key(encache_namespace_of(ec), ids[k], key, sizeof(key));
    uint64_t len;
    ASSERT_EQ_INT(encache_store_object_size(st, key, &len), 0);
    ASSERT_EQ_U64(len, 24 + nbytes);
    encache_store_close(st);
  }
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case04_chunking_and_one_registration) {
  static const char *const ids[] = {"a", "b", "c"};
  for (int pass = 0; pass < 2; pass++) {
    env e;
    env_init(&e, 1);
    encache *ec = open_on(&e, pass == 0 ? 80 : 120, 32, 1 << 20);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 3);
    encache_result r[3];
    talloc t = {0};
    for (int round = 0; round < 5; round++) {
      ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), 3);
      for (int i = 0; i < 3; i++) {
        float want[ROWS * COLS];
        encode(ids[i], want);
        ASSERT_EQ_MEM(r[i].data, want, sizeof(want));
      }
      if (round < 4)
        free_hits(r, 3);
    }
    /* 80 bytes: two 40-byte objects per read, so two reads per lookup;
     * 120 bytes: one. */
    ASSERT_EQ_INT(e.ctl.read_calls, pass == 0 ? 10 : 5);
    ASSERT_EQ_INT(e.ctl.exists_calls, 5);
    ASSERT_EQ_INT(e.ctl.register_calls, 1);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
    encache_stats s = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &s);
    ASSERT_EQ_U64(s.staging_allocations, 1);
    ASSERT_EQ_U64(s.staging_bytes, pass == 0 ? 80 : 120);
    /* Outputs are independent of the Store: change it, they stay. */
    unsigned char junk[40];
    memset(junk, 0x77, sizeof(junk));
    encache_store *st = NULL;
    encache_store_open(e.url, &st);
    char key[512];
    encache_key(encache_namespace_of(ec), "a", key, sizeof(key));
    encache_store_remove(st, key);
    encache_store_write(st, key, NULL, 0, junk, sizeof(junk));
    encache_store_close(st);
    float want[ROWS * COLS];
    encode("a", want);
    ASSERT_EQ_MEM(r[0].data, want, sizeof(want));
    free_hits(r, 3);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 1);
    ASSERT_EQ_INT(e.ctl.registered, 0);
    ASSERT_EQ_INT(e.ctl.close_calls, 1);
    encache_shm_destroy(e.seg);
  }
}

TEST(engine_case05_nothing_allocated_without_hits) {
  env e;
  env_init(&e, 1);
  encache *ec = open_on(&e, 30, 32, 1 << 20); /* every object is oversize */
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"p", "q"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0); /* all miss */
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  seed(&e, encache_namespace_of(ec), ids, 2);
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0); /* all oversize */
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_OVERSIZE);
  ASSERT_EQ_INT(e.ctl.read_calls, 0);
  ASSERT_EQ_INT(e.ctl.register_calls, 0);
  ASSERT_EQ_INT(t.allocs, 0);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.staging_allocations, 0);
  ASSERT_EQ_U64(s.oversize, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}

TEST(engine_case06_malformed_read_answers_poison) {
  static const int modes[] = {READ_ITEM_CODE, READ_COUNT_ABOVE, -1};
  static const char *const ids[] = {"m1", "m2"};
  for (int k = 0; k < 6; k++) { /* each answer, staged then direct reads */
    env e;
    env_init(&e, k < 3);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 2);
    if (modes[k % 3] == -1) {
      e.ctl.read_rc = ENCACHE_EUNCONFIRMED; /* a wrong-length answer */
    } else {
      e.ctl.read_mode = modes[k % 3];
      e.ctl.read_item_code = -12345; /* an unknown code */
    }
    static encache_result r[6][2]; /* kept destinations stay reachable */
    talloc t = {0};
    ASSERT_EQ_INT(lookup_ids(step, ids, 2, r[k], &t), ENCACHE_EPOISONED);
    ASSERT_CONTAINS(encache_errmsg(ec), "poisoned");
    int reads = e.ctl.read_calls, exists = e.ctl.exists_calls;
    /* Fails fast, without calling the Store. */
    encache_result again[2];
    ASSERT_EQ_INT(lookup_ids(step, ids, 2, again, &t), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(e.ctl.read_calls, reads);
    ASSERT_EQ_INT(e.ctl.exists_calls, exists);
    ASSERT_EQ_INT(publish_ref(step, "m1"), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
    ASSERT_EQ_INT(e.ctl.unregister_calls, 0); /* nothing unregistered */
    ASSERT_EQ_INT(e.ctl.registered, k < 3);
    ASSERT_EQ_INT(t.releases, 0); /* destinations the Store wrote are kept */
    encache_shm_destroy(e.seg);
  }
}

static int fail_copy(void *dst, const void *src, size_t n) {
  (void)dst;
  (void)src;
  (void)n;
  return -1;
}

TEST(engine_case07_allocation_failure_and_failed_copy) {
  static const char *const ids[] = {"x1", "x2", "x3"};
  encache_result r[3];
  { /* Direct reads: the allocation fails before the read. */
    env e;
    env_init(&e, 0);
    encache *ec = open_default(&e);
    encache_step *step = step_of(ec);
    seed(&e, encache_namespace_of(ec), ids, 3);
    talloc t = {0, 0, 2};
    ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), ENCACHE_ENOMEM);
    ASSERT_EQ_INT(t.releases, 1);
    talloc ok = {0};
    ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &ok), 3);
    free_hits(r, 3);
    ASSERT_EQ_INT(encache_close(ec), 0);
    encache_shm_destroy(e.seg);
  }
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  seed(&e, encache_namespace_of(ec), ids, 3);
  talloc t = {0, 0, 2}; /* the second destination fails */
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &t), ENCACHE_ENOMEM);
  ASSERT_EQ_INT(t.releases, 1); /* the first was handed back */
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_INT(st.poisoned, 0);
  /* Healthy: the next lookup works. */
  talloc ok = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, r, &ok), 3);
  free_hits(r, 3);
  /* A failed (device) copy poisons and keeps staging and destinations. */
  encache__copy_hook = fail_copy;
  talloc t2 = {0};
  static encache_result kept[3]; /* destinations stay alive, reachable */
  ASSERT_EQ_INT(lookup_ids(step, ids, 3, kept, &t2), ENCACHE_EPOISONED);
  encache__copy_hook = NULL;
  ASSERT(t2.allocs == 3);
  ASSERT_EQ_INT(t2.releases, 0);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(e.ctl.unregister_calls, 0);
}

TEST(engine_case08_3d_output_refused_before_registration) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"three"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  float *data;
  encache_storage *s = storage_of(&data, 8);
  int64_t shape[3] = {2, 2, 2};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 3, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &v, s), ENCACHE_SKIP_NOT_MATRIX);
  int64_t strides[2] = {1, 2};
  int64_t shape2[2] = {2, 2};
  encache_tensor tv = {sizeof tv, data, ENCACHE_FLOAT32, 2, shape2, strides, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &tv, s),
                ENCACHE_SKIP_NOT_CONTIGUOUS);
  encache_tensor iv = {sizeof iv, data, 7, 2, shape2, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_publish(step, "three", &iv, s), ENCACHE_SKIP_DTYPE);
  encache_storage_unref(s);
  ASSERT_EQ_INT(storage_releases, 1); /* not retained */
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(e.ctl.register_calls, 0);
  ASSERT_EQ_INT(e.ctl.write_calls, 0);
  ASSERT_EQ_INT(e.ctl.exists_calls, 1); /* the lookup's only */
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case10_incompatible_objects_are_misses) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  const char *ns = encache_namespace_of(ec);
  unsigned char good[64], obj[64];
  size_t len = ref_object("valid", good);
  store_raw(&e, ns, "valid", good, len);
  /* Another revision's namespace: never seen. */
  store_raw(&e, "embedding@model:shared/model@revision:other@encoder:encoder:"
                "default@dtype:torch.float32@protocol:v3", "rev", good, len);
  /* Shape 4x1 (same size), dtype float16 2x4 (same size), bad magic. */
  memcpy(obj, good, len);
  obj[8] = 4;
  obj[16] = 1;
  store_raw(&e, ns, "shape", obj, len);
  memcpy(obj, good, len);
  obj[4] = 11;
  obj[16] = 4;
  store_raw(&e, ns, "dtype", obj, len);
  memcpy(obj, good, len);
  obj[0] ^= 0xff;
  store_raw(&e, ns, "magic", obj, len);
  store_raw(&e, ns, "shorthdr", good, 20);
  store_raw(&e, ns, "shortdata", good, len - 4);
  memcpy(obj, good, len);
  store_raw(&e, ns, "longdata", obj, len + 8);
  static const char *const ids[] = {"rev",   "shape",     "dtype",
                                    "magic", "shorthdr", "shortdata",
                                    "longdata", "valid"};
  static const int want[] = {ENCACHE_MISS,         ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_INCOMPATIBLE,
                             ENCACHE_INCOMPATIBLE, ENCACHE_HIT};
  static const int verdict[] = {0, ENCACHE_BAD_SHAPE, ENCACHE_BAD_DTYPE,
                                ENCACHE_BAD_MAGIC, ENCACHE_BAD_LENGTH,
                                ENCACHE_BAD_LENGTH, ENCACHE_BAD_LENGTH, 0};
  encache_result r[8];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 8, r, &t), 1);
  for (int i = 0; i < 8; i++) {
    if (r[i].outcome != want[i] ||
        (want[i] == ENCACHE_INCOMPATIBLE && r[i].verdict != verdict[i]))
      test__fail(__FILE__, __LINE__, "%s: %s/%s, expected %s/%s", ids[i],
                 encache_outcome_name(r[i].outcome),
                 encache_verdict_name(r[i].verdict),
                 encache_outcome_name(want[i]), encache_verdict_name(verdict[i]));
  }
  ASSERT_EQ_U64(r[1].found.rows, 4); /* what was found is reported */
  free_hits(r, 8);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_INT(s.poisoned, 0);
  ASSERT_EQ_U64(s.incompatible, 6);
  /* Incompatible objects are never overwritten by a publication. */
  ASSERT_EQ_INT(publish_ref(step, "shape"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.published_present, 1);
  ASSERT_EQ_U64(s.published_written, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_case11_rejected_header_registration_is_recoverable) {
  env e;
  env_init(&e, 1);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"h"};
  encache_result r[1];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 1, r, &t), 0);
  e.ctl.fail_register_from = 1; /* the header's registration */
  storage_releases = 0;
  ASSERT_EQ_INT(publish_ref(step, "h"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  ASSERT_EQ_INT(e.ctl.write_calls, 0); /* not issued */
  ASSERT_EQ_INT(storage_releases, 1); /* released at reap */
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.published_failed, 1);
  ASSERT_EQ_U64(s.pending_bytes, 0);
  ASSERT_EQ_INT(s.poisoned, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_duplicates_read_once_each_own_output) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const one[] = {"d"};
  seed(&e, encache_namespace_of(ec), one, 1);
  static const char *const ids[] = {"d", "zz", "d", "d"};
  encache_result r[4];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 4, r, &t), 3);
  ASSERT_EQ_INT(e.ctl.read_calls, 1);
  ASSERT(r[0].data != r[2].data && r[2].data != r[3].data);
  ASSERT_EQ_MEM(r[0].data, r[3].data, 16);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  free_hits(r, 4);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_skips_ineligible_and_non_candidates) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  encache_candidate c[4] = {cand("img"), cand("vid"), cand("gpu"), cand("")};
  c[1].modality = ENCACHE_MODALITY_VIDEO;
  c[2].device = ENCACHE_DEVICE_CUDA;
  encache_result r[4];
  talloc t = {0};
  encache_allocator a = allocator(&t);
  r[0].size = sizeof(r[0]);
  ASSERT_EQ_INT(encache_lookup(step, c, 4, &a, r), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(r[3].outcome, ENCACHE_SKIPPED);
  ASSERT_EQ_INT(publish_ref(step, "vid"), ENCACHE_SKIP_NOT_CANDIDATE);
  e.ctl.hold_writes = 1; /* keep the first one pending */
  ASSERT_EQ_INT(publish_ref(step, "img"), ENCACHE_QUEUED);
  ASSERT_EQ_INT(publish_ref(step, "img"), ENCACHE_SKIP_PENDING);
  fault_release_writes(&e.ctl);
  ASSERT_EQ_INT(encache_close(ec), 0);
}

TEST(engine_unavailable_store_means_encode) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static const char *const ids[] = {"n1", "n2"};
  seed(&e, encache_namespace_of(ec), ids, 2);
  e.ctl.exists_rc = ENCACHE_EUNAVAIL;
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  e.ctl.exists_rc = 0;
  e.ctl.read_rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_UNAVAILABLE);
  e.ctl.read_rc = 0;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 2);
  free_hits(r, 2);
  /* An unknown per-item existence answer is unconfirmed: poison. */
  e.ctl.exists_item = 77;
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
}

/* An identifier longer than ENCACHE_MAX_ID_LEN (shm would refuse its key,
 * and answer UNAVAILABLE) is SKIPPED with the reason before any Store
 * call; its publication is not a candidate's; the handle stays healthy. */
TEST(engine_overlong_identifier_is_skipped) {
  env e;
  env_init(&e, 0);
  encache *ec = open_default(&e);
  encache_step *step = step_of(ec);
  static char id[70000];
  memset(id, 'i', sizeof(id) - 1);
  const char *ids[2] = {id, "short"};
  encache_result r[2];
  talloc t = {0};
  ASSERT_EQ_INT(lookup_ids(step, ids, 2, r, &t), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_SKIPPED);
  ASSERT_CONTAINS(r[0].why, "the id of 69999 bytes is too long");
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(publish_ref(step, id), ENCACHE_SKIP_NOT_CANDIDATE);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_failed, 0);
  ASSERT_EQ_INT(st.poisoned, 0);
  ASSERT_EQ_INT(lookup_ids(step, ids + 1, 1, r, &t), 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
}
