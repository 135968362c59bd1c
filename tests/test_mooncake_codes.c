/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Mooncake result-code table, and the engine's reaction to each
 * class through the fault-injecting wrapper (registration on, as with
 * Mooncake).
 * The stand-in library is tests/fake_mooncake.c; the helpers several of
 * these files share are in tests/mooncake_util.c.  With a real Mooncake
 * Store (ENCACHE_TEST_MOONCAKE=1), tests/on_mooncake.sh runs the
 * conformance and acceptance suites on it.
 */
#include "mooncake_util.h"

#include "engine.h"
#include "lookup_read.h"
#include "fault_store.h"
#include "mooncake_codes.h"
#include "mooncake_testing.h"
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

/* vLLM's sets, written out again from its store_client.py (commit
 * 007aedc9630406af59037e7d3b1480f6d13f3228): the table must agree. */
static const int64_t vllm_safe_io[] = {-200, -703, -704, -705, -900, -901};
static const int64_t vllm_safe_get_extra[] = {-600, -702, -707};
static const int64_t vllm_safe_put_extra[] = {-1700};

static int in_set(int64_t code, const int64_t *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == code)
      return 1;
  return 0;
}
#define IN(code, set) in_set(code, set, sizeof(set) / sizeof(set[0]))

/* What vLLM does with `code` for operation op: 0 safe, 1 poison. */
static int vllm_poisons(int op, int64_t code) {
  if (op == ENCACHE__MC_EXISTS)
    return 0; /* batch_exists: only 1 is present; no memory lent */
  if (IN(code, vllm_safe_io))
    return 0;
  if (op == ENCACHE__MC_READ)
    return !IN(code, vllm_safe_get_extra);
  return !IN(code, vllm_safe_put_extra);
}

TEST(mooncake_result_code_table) {
  /* Every row, and codes the table does not name. */
  int64_t codes[64];
  size_t n = 0;
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    codes[n++] = encache__mooncake_code_at(i);
  ASSERT(n >= 13);
  codes[n++] = -1;
  codes[n++] = -12345;
  codes[n++] = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    for (int op = 0; op < ENCACHE__MC_OPS; op++) {
      int got = encache__mooncake_classify_op(op, codes[i]);
      if (vllm_poisons(op, codes[i])) {
        if (got != ENCACHE_EUNCONFIRMED)
          test__fail(__FILE__, __LINE__, "code %lld op %d: vLLM poisons, "
                     "encache answers %s", (long long)codes[i], op,
                     encache_err_name(got));
      } else if (got == ENCACHE_EUNCONFIRMED) {
        test__fail(__FILE__, __LINE__, "code %lld op %d: vLLM carries on, "
                   "encache poisons", (long long)codes[i], op);
      }
    }
  }
  /* The particular answers. */
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_EXISTS, -704), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -704), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -704), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -705), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -901), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -702), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -1700), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -400), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -600), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -706), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -707), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -1700), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, 4096), 0);
  ASSERT_EQ_INT(encache__mooncake_classify_op(99, -704), ENCACHE_EINVAL);
  ASSERT_EQ_STR(encache__mooncake_code_name(-901), "RPC_TIMEOUT");
  ASSERT_EQ_STR(encache__mooncake_code_name(-702), "INVALID_REPLICA");
  ASSERT_EQ_STR(encache__mooncake_code_name(-12345), "unknown");
  ASSERT_EQ_STR(encache__mooncake_code_name(0), "OK");
  /* The names are unique, and no row repeats a code. */
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    for (int j = i + 1; j < encache__mooncake_code_count(); j++)
      ASSERT(encache__mooncake_code_at(i) != encache__mooncake_code_at(j));
}

/* The engine's reaction to each class, on the shm Store wrapped with
 * registration on (as Mooncake needs it) and the classified answers
 * injected. */
static encache *open_wrapped(fault_ctl *ctl, char *seg, size_t seglen) {
  snprintf(seg, seglen, "encache-mctest-%d", (int)getpid());
  encache_shm_destroy(seg);
  char url[128];
  snprintf(url, sizeof(url), "shm://%s?size=4MiB", seg);
  encache_store *inner = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &inner), 0);
  fault_ctl_init(ctl);
  ctl->registration = 1;
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache__open_with_store(&o, fault_store_wrap(inner, ctl), &ec), 0);
  /* One object to hit. */
  float v[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[24];
  encache_header_encode(&t, hdr);
  char key[256];
  encache_key(encache_namespace_of(ec), "obj", key, sizeof(key));
  encache_store *st = NULL;
  encache_store_open(url, &st);
  encache_store_write(st, key, hdr, 24, v, sizeof(v));
  encache_store_close(st);
  return ec;
}

/* One candidate looked up (op EXISTS or READ) or published (op WRITE) with
 * the Mooncake answer `code` injected through the fault wrapper, as the
 * backend classifies it.  Returns the lookup outcome (MISS, UNAVAILABLE,
 * ...), ENCACHE_EPOISONED, or for writes 0 / the counter that moved
 * (100 + published_failed, 200 + published_present). */
static int run_code(int op, int64_t code) {
  fault_ctl ctl;
  char seg[64];
  encache *ec = open_wrapped(&ctl, seg, sizeof(seg));
  int cls = encache__mooncake_classify_op(op, code);
  int ret;
  encache_allocator a = {sizeof(a), NULL, alloc_fn, release_fn, 0};
  static encache_result r; /* a poisoned lookup keeps its destination */
  r.size = sizeof(r);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  if (op != ENCACHE__MC_WRITE) {
    if (op == ENCACHE__MC_EXISTS) {
      ctl.exists_item = cls;
    } else {
      ctl.read_mode = READ_ITEM_CODE;
      ctl.read_item_code = cls;
    }
    encache_candidate c = {sizeof(c), "obj", ENCACHE_MODALITY_IMAGE,
                           ENCACHE_FLOAT32, 2, 2, ENCACHE_DEVICE_HOST, 0};
    int hits = encache_lookup(step, &c, 1, &a, &r);
    ret = hits < 0 ? hits : r.outcome;
  } else {
    encache_candidate c = {sizeof(c), "new", ENCACHE_MODALITY_IMAGE,
                           ENCACHE_FLOAT32, 2, 2, ENCACHE_DEVICE_HOST, 0};
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 0);
    ctl.write_rc = cls;
    static float out[4] = {5, 6, 7, 8}; /* a kept storage stays reachable */
    encache_storage *s = NULL;
    encache_storage_new(out, sizeof(out), NULL, NULL, &s);
    int64_t shape[2] = {2, 2};
    encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    ASSERT_EQ_INT(encache_publish(step, "new", &v, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    ret = encache_flush(ec);
    encache_stats stt = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &stt);
    if (ret == 0)
      ret = stt.published_failed ? 100 : stt.published_present ? 200 : 0;
  }
  int closed = encache_close(ec);
  ASSERT_EQ_INT(closed, ret == ENCACHE_EPOISONED ? ENCACHE_EPOISONED : 0);
  encache_shm_destroy(seg);
  return ret;
}

TEST(mooncake_codes_through_the_engine) {
  int64_t codes[64];
  size_t n = 0;
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    codes[n++] = encache__mooncake_code_at(i);
  codes[n++] = -1; /* not in the table */
  codes[n++] = -31337;
  for (size_t i = 0; i < n; i++) {
    int64_t code = codes[i];
    /* Existence checks: -704 is a miss, anything else "encode instead";
     * never poisoned. */
    int got = run_code(ENCACHE__MC_EXISTS, code);
    ASSERT_EQ_INT(got, code == -704 ? ENCACHE_MISS : ENCACHE_UNAVAILABLE);
    /* Reads: vLLM's safe set means encode instead; the rest poisons. */
    got = run_code(ENCACHE__MC_READ, code);
    if (vllm_poisons(ENCACHE__MC_READ, code))
      ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    else
      ASSERT_EQ_INT(got, code == -704 ? ENCACHE_MISS : ENCACHE_UNAVAILABLE);
    /* Writes: vLLM's safe set skips the write; the rest poisons. */
    got = run_code(ENCACHE__MC_WRITE, code);
    if (vllm_poisons(ENCACHE__MC_WRITE, code))
      ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    else
      ASSERT_EQ_INT(got, code == -705 ? 200 : 100);
  }
}
