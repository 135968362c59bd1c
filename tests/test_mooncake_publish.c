/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's publications on the stand-in Mooncake library: round
 * trips, writes in flight, existence asked ahead.
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
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

/* Publishes the 2x2 float32 output {5, 6, 7, 8} for each of ids[0..n)
 * on step: every one queued. */
static void publish_all(encache_step *step, const char *const *ids, int n) {
  static float out[4] = {5, 6, 7, 8};
  int64_t shape[2] = {2, 2};
  encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(out, sizeof(out), NULL, NULL, &s), 0);
  for (int i = 0; i < n; i++)
    ASSERT_EQ_INT(encache_publish(step, ids[i], &v, s), ENCACHE_QUEUED);
  encache_storage_unref(s);
}

/* A publication is the backend's check and one put: the engine checks
 * nothing itself (the write answers "exists"), so written and present
 * are counted as before; a failed check goes on to the put as vLLM's
 * publisher does; a failed put is skipped or poisons as its code says. */
TEST(mooncake_publication_round_trips) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[4];
  static const char *const ids[] = {"a", "n1", "n2", "n3"};
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 1);
  free_results(r, 4);
  fake_reset(&f);
  publish_all(step, ids, 2); /* "a", "n1" */
  ASSERT_EQ_INT(encache_flush(ec), 0);
  /* One check each, or one for both when the second was queued before
   * the first was taken (asked ahead: mooncake_existence_asked_ahead). */
  ASSERT(f.calls[F_EXIST] == 1 || f.calls[F_EXIST] == 2);
  ASSERT_EQ_INT(f.calls[F_PUT], 1);
  /* The write buffer was registered by the seeding writes; a tensor
   * never is over TCP. */
  ASSERT_EQ_INT(f.calls[F_REGISTER], 0);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 1);
  ASSERT_EQ_U64(st.published_present, 1);
  f.inject[F_EXIST] = -900; /* the check fails: put anyway */
  publish_all(step, ids + 2, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  f.inject[F_EXIST] = 0;
  f.inject[F_PUT] = -200; /* no handle: skipped */
  publish_all(step, ids + 3, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 2);
  ASSERT_EQ_U64(st.published_failed, 1);
  ASSERT_EQ_INT(lookup_fake(step, ids + 2, 1, r), 1); /* n2 is there */
  free_results(r, 1);
  f.inject[F_PUT] = -800; /* a transfer failure: unconfirmed */
  publish_all(step, ids + 3, 1);
  ASSERT_EQ_INT(encache_flush(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  unlink(cfg_path);
}

/* Publishes 4 outputs on an engine on the stand-in whose puts take
 * 50 ms, and returns how many were in flight at most; every publication
 * is written once, each from a write buffer of its own. */
static int puts_in_flight(const char *extra) {
  fake_ctl f;
  fake_extra = extra;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  fake_extra = "";
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  int *delay = dlsym(lib, "fake_mooncake_put_delay_us");
  int *most = dlsym(lib, "fake_mooncake_puts_in_flight_max");
  dlclose(lib);
  ASSERT(delay != NULL && most != NULL);
  *delay = 50000;
  *most = 0;
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"w1", "w2", "w3", "w4"};
  encache_result r[4];
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 0);
  publish_all(step, ids, 4);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  *delay = 0;
  ASSERT_EQ_INT(f.calls[F_PUT], 4);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 4);
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 4);
  free_results(r, 4);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
  return *most;
}

/* Mooncake's client waits by polling (ENCACHE_STORE_CAP_BUSY_WAIT): one
 * write in flight by default, as many as store_writes_in_flight says
 * otherwise, and more than 8 is refused by name. */
TEST(mooncake_writes_in_flight) {
  ASSERT_EQ_INT(puts_in_flight(""), 1);
  ASSERT_EQ_INT(puts_in_flight(", \"store_writes_in_flight\": 3"), 3);
  write_config_for("tcp");
  char url[128];
  snprintf(url, sizeof(url), "mooncake:%s", cfg_path);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = "{\"ec_connector_extra_config\": {"
                         "\"cross_encoder_cache\": true, "
                         "\"store_writes_in_flight\": 9}}";
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_errmsg(NULL), "store_writes_in_flight: 9 is too many");
  unlink(cfg_path);
}

/* Publishes "a" (there already) and p0..p6 while each put takes 20 ms, so
 * that they queue, and flushes. */
static void publish_queued(encache *ec, int round) {
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  int *delay = dlsym(lib, "fake_mooncake_put_delay_us");
  dlclose(lib);
  ASSERT(delay != NULL);
  *delay = 20000;
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  char ids[8][16];
  const char *idp[8];
  encache_result r[8];
  for (int i = 0; i < 8; i++) {
    snprintf(ids[i], sizeof(ids[i]), i == 0 ? "a" : "p%d-%d", round, i);
    idp[i] = ids[i];
  }
  ASSERT_EQ_INT(lookup_fake(step, idp, 4, r), 1);
  free_results(r, 4);
  ASSERT_EQ_INT(lookup_fake(step, idp + 4, 4, r), 0);
  publish_all(step, idp, 8);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  *delay = 0;
  encache_step_close(step);
}

/* Publications queued behind a slow put have their existence asked in
 * one batch_is_exist (the writer asks ahead for the queued jobs), not one
 * each, with the same counters: the object already there is not put.  An
 * answer lives in its job: a later publication of a key that was removed
 * meanwhile asks again and is written.  Several writers give the same
 * counts.  A batch that fails sends each of its writes on to the put, as
 * vLLM's publisher does after a failed check, without asking again. */
TEST(mooncake_existence_asked_ahead) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  f.calls[F_EXIST] = f.calls[F_PUT] = 0;
  publish_queued(ec, 1);
  /* Usually 1 or 2 (the first job may be taken alone); fewer than 8 in
   * any case. */
  ASSERT(f.calls[F_EXIST] >= 1 && f.calls[F_EXIST] < 8);
  ASSERT_EQ_INT(f.calls[F_PUT], 7);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 7);
  ASSERT_EQ_U64(st.published_present, 1);
  char key[256];
  encache_key(encache_namespace_of(ec), "a", key, sizeof(key));
  ASSERT_EQ_INT(encache_store_remove(ec->store, key), 0);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const a[] = {"a"};
  encache_result r[1];
  ASSERT_EQ_INT(lookup_fake(step, a, 1, r), 0);
  publish_all(step, a, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_step_close(step);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 8);
  ASSERT_EQ_U64(st.published_present, 1);
  f.calls[F_EXIST] = f.calls[F_PUT] = 0;
  f.inject_batch[F_EXIST] = -1; /* every batch_is_exist fails */
  publish_queued(ec, 2);
  f.inject_batch[F_EXIST] = 0;
  /* The failed batch answered for its jobs: none asks again. */
  ASSERT(f.calls[F_EXIST] >= 1 && f.calls[F_EXIST] < 8);
  ASSERT_EQ_INT(f.calls[F_PUT], 8);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 16); /* "a" was put again: "written" */
  ASSERT_EQ_U64(st.published_present, 1);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
  fake_extra = ", \"store_writes_in_flight\": 3";
  ec = engine_on_fake("tcp", 4096, &f);
  fake_extra = "";
  publish_queued(ec, 3);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 7);
  ASSERT_EQ_U64(st.published_present, 1);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}
