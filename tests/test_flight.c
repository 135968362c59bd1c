/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single flight (src/lease.c, docs/engine.md): the engine's leases on the
 * Store under test ($ENCACHE_TEST_STORE, else a private shm segment; ctest
 * conformance-dir runs them on tests/dir_store.c, a user's Store with
 * leases).  A Store without leases passes them with a note: there the
 * option does nothing, which the last test checks on one.
 */
#include "dir_store.h"
#include "engine.h"
#include "fault_store.h"
#include "runner.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char url[160], seg[64], rev[64];

/* The Store of these tests, in a namespace (revision) of the test's own;
 * 1 when it has leases. */
static int flight_env(void) {
  static int count;
  snprintf(rev, sizeof(rev), "flight-%d-%ld-%d", (int)getpid(),
           (long)time(NULL), count++);
  const char *given = getenv("ENCACHE_TEST_STORE");
  if (given != NULL && given[0] != '\0') {
    snprintf(url, sizeof(url), "%s", given);
  } else {
    snprintf(seg, sizeof(seg), "encache-flighttest-%d", (int)getpid());
    snprintf(url, sizeof(url), "shm://%s?size=8MiB", seg);
  }
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url,
               encache_store_errmsg(NULL));
  int leases = (encache_store_caps_of(st) & ENCACHE_STORE_CAP_LEASE) != 0;
  encache_store_close(st);
  if (!leases)
    printf("# %s has no leases: nothing to check\n", url);
  return leases;
}

static void flight_done(void) {
  if (seg[0])
    encache_shm_destroy(seg);
}

static encache *flight_open_on(int on, uint64_t ttl_ms, uint64_t wait_ms,
                               fault_ctl *ctl) {
  char json[512];
  snprintf(json, sizeof(json),
           "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
           "\"single_flight\": %s, \"single_flight_ttl_ms\": %llu, "
           "\"single_flight_wait_ms\": %llu}}",
           on ? "true" : "false", (unsigned long long)ttl_ms,
           (unsigned long long)wait_ms);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "flight/model";
  o.revision = rev;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  encache_store *st = NULL;
  int rc;
  if (ctl == NULL)
    rc = encache_open(&o, &ec);
  else if ((rc = encache_store_open(url, &st)) == 0)
    rc = encache__open_with_store(&o, fault_store_wrap(st, ctl), &ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  return ec;
}

/* A handle on the Store under test, single flight on or off. */
static encache *flight_open(int on, uint64_t ttl_ms, uint64_t wait_ms) {
  return flight_open_on(on, ttl_ms, wait_ms, NULL);
}

static int m_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *data = *handle = malloc(nbytes);
  return *data != NULL ? 0 : ENCACHE_ENOMEM;
}

static void m_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)data;
  free(handle);
}

/* Looks id (float32 2x2) up on step: its outcome; *why its cause. */
static int look(encache_step *step, const char *id, char *why, size_t cap) {
  encache_candidate c = ENCACHE_CANDIDATE_INIT;
  c.id = id;
  c.dtype = ENCACHE_FLOAT32;
  c.rows = c.cols = 2;
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.alloc = m_alloc;
  a.release = m_release;
  encache_result r = ENCACHE_RESULT_INIT;
  int rc = encache_lookup(step, &c, 1, &a, &r);
  if (rc < 0)
    test__fail(__FILE__, __LINE__, "lookup: %s", encache_strerror(rc));
  if (r.outcome == ENCACHE_HIT)
    free(r.handle);
  if (why != NULL)
    snprintf(why, cap, "%s", r.why ? r.why : "");
  return r.outcome;
}

static float out[4] = {1, 2, 3, 4};

static int publish(encache_step *step, const char *id, int contiguous) {
  int64_t shape[2] = {2, 2}, strides[2] = {1, 2};
  encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape,
                      contiguous ? NULL : strides, 0, 0, NULL};
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(out, sizeof(out), NULL, NULL, &s), 0);
  int rc = encache_publish(step, id, &v, s);
  encache_storage_unref(s);
  return rc;
}

static encache_stats stats_of(encache *ec) {
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  return st;
}

static long ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

TEST(engine_flight_a_miss_takes_the_lease_and_its_publication_ends_it) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 30000, 0), *b = flight_open(1, 30000, 0);
  encache_step *sa, *sb;
  char why[256];
  ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  ASSERT_EQ_INT(look(sa, "img", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_U64(stats_of(a).leases_taken, 1);
  ASSERT_EQ_INT(look(sb, "img", why, sizeof(why)), ENCACHE_IN_FLIGHT);
  ASSERT_CONTAINS(why, "another encoder holds its lease");
  ASSERT_EQ_U64(stats_of(b).in_flight, 1);
  ASSERT_EQ_INT(look(sa, "img", NULL, 0), ENCACHE_MISS); /* its own: renewed */
  ASSERT_EQ_INT(publish(sa, "img", 1), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(a), 0);
  ASSERT_EQ_INT(look(sb, "img", NULL, 0), ENCACHE_HIT);
  encache_step_close(sa);
  encache_step_close(sb);
  /* A lease ended by the write: a new key is free for b. */
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  ASSERT_EQ_INT(look(sb, "other", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

TEST(engine_flight_unpublished_leases_end_with_their_step_or_a_skip) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 30000, 0), *b = flight_open(1, 30000, 0);
  encache_step *sa, *sb;
  ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
  ASSERT_EQ_INT(look(sa, "x", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(look(sa, "y", NULL, 0), ENCACHE_MISS);
  /* A skipped publication (not contiguous) ends x's lease at once. */
  ASSERT_EQ_INT(publish(sa, "x", 0), ENCACHE_SKIP_NOT_CONTIGUOUS);
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  ASSERT_EQ_INT(look(sb, "x", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(look(sb, "y", NULL, 0), ENCACHE_IN_FLIGHT);
  encache_step_close(sa); /* y never published: its lease ends here */
  ASSERT_EQ_INT(look(sb, "y", NULL, 0), ENCACHE_MISS);
  encache_step_close(sb);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

typedef struct holder {
  encache *ec;
  encache_step *step;
  int delay_ms;
} holder;

static void *publish_later(void *arg) {
  holder *h = arg;
  struct timespec ts = {0, (long)h->delay_ms * 1000000L};
  nanosleep(&ts, NULL);
  publish(h->step, "hot", 1);
  encache_flush(h->ec);
  return NULL;
}

TEST(engine_flight_a_waiter_gets_the_holders_output) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 30000, 0), *b = flight_open(1, 30000, 20000);
  holder h = {a, NULL, 500};
  encache_step *sb;
  ASSERT_EQ_INT(encache_step_open(a, &h.step), 0);
  ASSERT_EQ_INT(look(h.step, "hot", NULL, 0), ENCACHE_MISS);
  pthread_t t;
  pthread_create(&t, NULL, publish_later, &h);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  ASSERT_EQ_INT(look(sb, "hot", NULL, 0), ENCACHE_HIT);
  long waited = ms_since(&t0);
  pthread_join(t, NULL);
  ASSERT(waited < 20000); /* the output came, not the bound */
  encache_stats st = stats_of(b);
  ASSERT_EQ_U64(st.waited, 1);
  ASSERT_EQ_U64(st.waited_hits, 1);
  ASSERT(st.wait_us > 0);
  encache_step_close(sb);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

TEST(engine_flight_a_waiter_never_waits_past_its_bound) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 60000, 0), *b = flight_open(1, 60000, 150);
  encache_step *sa, *sb;
  char why[256];
  ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
  ASSERT_EQ_INT(look(sa, "slow", NULL, 0), ENCACHE_MISS); /* never published */
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(look(sb, "slow", why, sizeof(why)), ENCACHE_IN_FLIGHT);
  long waited = ms_since(&t0);
  ASSERT(waited >= 150);
  ASSERT(waited < 150 + 5000); /* generous: a loaded machine */
  ASSERT_CONTAINS(why, "within 150 ms");
  encache_step_close(sa);
  encache_step_close(sb);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

/* A holder that dies: on shm its lease ends at once, on other Stores at
 * its deadline (single_flight_ttl_ms); either way the waiter takes it
 * and encodes (MISS), long before its own bound. */
TEST(engine_flight_a_killed_holder_never_stalls_the_others) {
  if (!flight_env())
    return;
  int on_shm = strncmp(url, "shm://", 6) == 0;
  uint64_t ttl = on_shm ? 60000 : 300;
  int ready[2];
  ASSERT_EQ_INT(pipe(ready), 0);
  pid_t pid = fork();
  if (pid == 0) {
    encache *a = flight_open(1, ttl, 0);
    encache_step *sa;
    encache_step_open(a, &sa);
    int o = look(sa, "doomed", NULL, 0);
    ssize_t w = write(ready[1], &o, sizeof(o));
    (void)w;
    pause(); /* killed holding the lease */
    _exit(0);
  }
  int o = -1;
  ASSERT_EQ_INT((int)read(ready[0], &o, sizeof(o)), (int)sizeof(o));
  ASSERT_EQ_INT(o, ENCACHE_MISS);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  encache *b = flight_open(1, ttl, 20000);
  encache_step *sb;
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(look(sb, "doomed", NULL, 0), ENCACHE_MISS);
  ASSERT(ms_since(&t0) < 10000);
  encache_step_close(sb);
  ASSERT_EQ_INT(encache_close(b), 0);
  close(ready[0]);
  close(ready[1]);
  flight_done();
}

static char logged[512];
static void keep_log(void *ctx, const char *m) {
  (void)ctx;
  snprintf(logged, sizeof(logged), "%s", m);
}

/* With the option off nothing changes; on a Store without leases it is
 * off, and the log says so. */
TEST(engine_flight_off_without_the_option_or_leases) {
  if (flight_env()) {
    encache *a = flight_open(0, 1000, 0), *b = flight_open(0, 1000, 0);
    encache_step *sa, *sb;
    ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
    ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
    ASSERT_EQ_INT(look(sa, "plain", NULL, 0), ENCACHE_MISS);
    ASSERT_EQ_INT(look(sb, "plain", NULL, 0), ENCACHE_MISS);
    ASSERT_EQ_U64(stats_of(a).leases_taken, 0);
    encache_close(a);
    encache_close(b);
    flight_done();
  }
  /* A user's Store (tests/dir_store.c) without its leases. */
  char dir[] = "/tmp/encache-flight-XXXXXX";
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(url, sizeof(url), "testdir://%s", dir);
  encache_store_backend b = *dir_store_backend();
  b.caps &= ~(unsigned)ENCACHE_STORE_CAP_LEASE;
  b.lease_take = NULL;
  b.lease_drop = NULL;
  encache_store *st = NULL;
  ASSERT_EQ_INT(dir_store_open_as(&b, url, &st), 0);
  const char *json = "{\"ec_connector_extra_config\": {\"cross_encoder_cache\""
                     ": true, \"single_flight\": true}}";
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "flight/model";
  o.model_dtype = ENCACHE_FLOAT32;
  o.log = keep_log;
  encache *ec = NULL;
  logged[0] = 0;
  ASSERT_EQ_INT(encache__open_with_store(&o, st, &ec), 0);
  ASSERT_CONTAINS(logged, "no leases");
  encache_step *s;
  ASSERT_EQ_INT(encache_step_open(ec, &s), 0);
  ASSERT_EQ_INT(look(s, "dir", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(encache_close(ec), 0);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  ASSERT_EQ_INT(system(cmd), 0);
}

/* A handle whose steps hold leases not yet published never waits: the
 * encoder it would wait for may be waiting for those.  Once it published
 * them, it waits. */
TEST(engine_flight_an_encoder_holding_leases_does_not_wait) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 30000, 0), *b = flight_open(1, 30000, 5000);
  holder h = {a, NULL, 300};
  encache_step *sb1, *sb2;
  char why[256];
  ASSERT_EQ_INT(encache_step_open(a, &h.step), 0);
  ASSERT_EQ_INT(look(h.step, "hot", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(encache_step_open(b, &sb1), 0);
  ASSERT_EQ_INT(look(sb1, "mine", NULL, 0), ENCACHE_MISS); /* b holds one */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(look(sb1, "hot", why, sizeof(why)), ENCACHE_IN_FLIGHT);
  ASSERT(ms_since(&t0) < 2500); /* not the 5 s bound */
  ASSERT_CONTAINS(why, "this encoder holds leases too");
  /* b's own step, pipelined: its lease is b's, never waited for. */
  ASSERT_EQ_INT(encache_step_open(b, &sb2), 0);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(look(sb2, "mine", why, sizeof(why)), ENCACHE_IN_FLIGHT);
  ASSERT(ms_since(&t0) < 2500);
  ASSERT_CONTAINS(why, "holds its lease in another step");
  /* Published: b holds nothing, and now waits for a's output. */
  ASSERT_EQ_INT(publish(sb1, "mine", 1), ENCACHE_QUEUED);
  pthread_t t;
  pthread_create(&t, NULL, publish_later, &h);
  ASSERT_EQ_INT(look(sb2, "hot", NULL, 0), ENCACHE_HIT);
  pthread_join(t, NULL);
  encache_step_close(sb1);
  encache_step_close(sb2);
  encache_step_close(h.step);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

/* The holder wrote its output and ended its lease between a lookup's
 * existence check and its take: the lease is taken, but the object is
 * read (a hit), not encoded again, and the lease ends at once. */
TEST(engine_flight_a_lease_taken_as_its_holder_finished_is_a_hit) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 30000, 0);
  encache_step *sa, *sb;
  ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
  ASSERT_EQ_INT(look(sa, "done", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(publish(sa, "done", 1), ENCACHE_QUEUED);
  ASSERT_EQ_INT(encache_flush(a), 0); /* written, lease ended */
  static fault_ctl ctl;
  fault_ctl_init(&ctl);
  ctl.exists_absent = 1; /* the first check misses it: the race */
  encache *b = flight_open_on(1, 30000, 5000, &ctl);
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  ASSERT_EQ_INT(look(sb, "done", NULL, 0), ENCACHE_HIT);
  encache_stats st = stats_of(b);
  ASSERT_EQ_U64(st.hits, 1);
  ASSERT_EQ_U64(b->leases_held, 0); /* ended at once */
  encache_step_close(sb);
  encache_step_close(sa);
  /* Nobody holds it: a new step of a takes it. */
  ASSERT_EQ_INT(encache_close(b), 0);
  ASSERT_EQ_INT(encache_close(a), 0);
  flight_done();
}

/* A holder that lives but never publishes: the waiter takes the lease
 * when it expires, well before its own bound, and encodes (MISS). */
TEST(engine_flight_a_waiter_takes_an_expired_lease) {
  if (!flight_env())
    return;
  encache *a = flight_open(1, 300, 0), *b = flight_open(1, 300, 20000);
  encache_step *sa, *sb;
  ASSERT_EQ_INT(encache_step_open(a, &sa), 0);
  ASSERT_EQ_INT(look(sa, "stuck", NULL, 0), ENCACHE_MISS);
  ASSERT_EQ_INT(encache_step_open(b, &sb), 0);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(look(sb, "stuck", NULL, 0), ENCACHE_MISS);
  long waited = ms_since(&t0);
  ASSERT(waited >= 250 && waited < 10000);
  ASSERT_EQ_U64(stats_of(b).leases_taken, 1);
  encache_step_close(sb);
  encache_step_close(sa);
  ASSERT_EQ_INT(encache_close(a), 0);
  ASSERT_EQ_INT(encache_close(b), 0);
  flight_done();
}

/* Bounds of the options: at most an hour. */
TEST(engine_flight_options_bounded) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = "{\"ec_connector_extra_config\": {"
                         "\"cross_encoder_cache\": true, \"single_flight\": "
                         "true, \"single_flight_wait_ms\": 18446744073709552}}";
  o.model = "m";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = "shm://encache-flight-bounds?size=1MiB";
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_errmsg(NULL), "single_flight_wait_ms");
}
