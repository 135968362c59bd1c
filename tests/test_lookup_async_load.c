/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lookups that do not wait under load (see test_lookup_async.c): the
 * lookup threads' reads in flight against store_reads_in_flight, a Store
 * that stops under a started lookup, a process killed while its lookup
 * threads read.  The fixtures are in lookup_async_util.c.
 */
#include "lookup_async_util.h"
#include "store_util.h"

#include "engine.h"
#include "fault_store.h"
#include "redis_util.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --------------------------------------------------------------- budgets */

/* Whether n reads (or existence checks) are held within ms. */
static int reads_held_within(fault_ctl *ctl, int n, int ms) {
  struct timespec d = {0, 1000000L};
  for (int k = 0; k < ms; k++) {
    pthread_mutex_lock(&ctl->mu);
    int waiting = ctl->reads_waiting;
    pthread_mutex_unlock(&ctl->mu);
    if (waiting >= n)
      return 1;
    nanosleep(&d, NULL);
  }
  return 0;
}

static int reads_held_now(fault_ctl *ctl) {
  pthread_mutex_lock(&ctl->mu);
  int waiting = ctl->reads_waiting;
  pthread_mutex_unlock(&ctl->mu);
  return waiting;
}

/* However many steps have a lookup started, store_reads_in_flight of them
 * read the Store at once, each into its own lane (at most that many
 * staging buffers of store_read_buffer_bytes, registered with a Store that
 * needs it and unregistered at close); those queued hold nothing. */
TEST(lookup_async_many_steps_read_as_many_at_a_time_as_configured) {
  static const int readers[] = {1, 3, 1, 3};
  for (int rk = 0; rk < 4; rk++) {
    aenv e;
    aenv_readers = readers[rk];
    aenv_registration = rk >= 2; /* reads into registered staging buffers */
    encache *ec = aenv_open(&e);
    aenv_readers = aenv_registration = 0;
    char ids[4][32];
    la_seed(&e, "bu", 4, 32, ids); /* 512 bytes each: one chunk of 4 */
    encache_candidate c[4] = {la_cand(ids[0], 32), la_cand(ids[1], 32),
                              la_cand(ids[2], 32), la_cand(ids[3], 32)};
    enum { STEPS = ENCACHE_MAX_STEPS };
    static encache_result r[STEPS][4];
    static encache_step *steps[STEPS];
    la_talloc t = {0};
    encache_allocator a = la_allocator(&t);
    for (int k = 0; k < STEPS; k++)
      steps[k] = la_step(ec);
    e.ctl.hold_reads = 1;
    for (int k = 0; k < STEPS; k++) {
      r[k][0].size = sizeof(r[k][0]);
      ASSERT_EQ_INT(encache_lookup_start(steps[k], c, 4, &a, r[k]), 0);
    }
    ASSERT(reads_held_within(&e.ctl, readers[rk], 10000));
    /* Time for one more lookup to reach the Store, were one to run. */
    struct timespec d = {0, 50 * 1000000L};
    nanosleep(&d, NULL);
    ASSERT_EQ_INT(reads_held_now(&e.ctl), readers[rk]);
    ASSERT(__atomic_load_n(&t.allocs, __ATOMIC_RELAXED) <= 4 * readers[rk]);
    fault_release_reads(&e.ctl);
    for (int k = 0; k < STEPS; k++) {
      ASSERT_EQ_INT(encache_step_wait(steps[k], -1), 4);
      la_same_results(c, r[0], r[k], 4);
    }
    encache_stats st = {.size = sizeof(st)};
    ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
    ASSERT(st.staging_allocations <= (uint64_t)readers[rk]);
    ASSERT(st.staging_bytes <= (uint64_t)readers[rk] * READ_BUF);
    if (rk >= 2) { /* every lane read while the others did: one each */
      ASSERT_EQ_U64(st.staging_allocations, (uint64_t)readers[rk]);
      ASSERT_EQ_INT(e.ctl.registered, readers[rk]);
    }
    ASSERT_EQ_U64(st.lookups, STEPS);
    ASSERT_EQ_U64(st.hits, 4 * STEPS);
    for (int k = 0; k < STEPS; k++) {
      la_free_hits(r[k], 4);
      encache_step_close(steps[k]);
    }
    ASSERT_EQ_INT(t.allocs, 4 * STEPS);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.registered, 0); /* each unregistered at close */
    aenv_done(&e);
  }
}

/* store_reads_in_flight: 1 to 8, or 0 (the Store's choice). */
TEST(lookup_async_reads_in_flight_is_checked_at_open) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = "{\"ec_connector_extra_config\": {"
                         "\"cross_encoder_cache\": true, "
                         "\"store_reads_in_flight\": 9}}";
  o.model = "async/option";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = "shm://never-opened"; /* refused before the Store opens */
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL),
                  "store_reads_in_flight: 9 is too many (at most 8");
}

/* While started lookups read the Store (held there), the caller's calls
 * go on: a publish, a step opened and closed, a poll; the reads of two
 * steps are in flight at once, a third waits its turn; then all three
 * give the blocking lookup's results. */
TEST(lookup_async_reads_of_several_steps_in_flight_at_once) {
  aenv e;
  aenv_readers = 2;
  encache *ec = aenv_open(&e);
  aenv_readers = 0;
  char ids[3][32];
  la_seed(&e, "fl", 3, 16, ids);
  encache_candidate c[4] = {la_cand(ids[0], 16), la_cand(ids[1], 16),
                            la_cand(ids[2], 16), la_cand("fl-absent", 16)};
  static encache_result want[4], r[3][4];
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  encache_step *sp = la_step(ec), *s[3] = {la_step(ec), la_step(ec),
                                           la_step(ec)};
  /* sp's candidate, a miss, is published while the reads are held. */
  encache_candidate pc = la_cand("fl-published", 2);
  static encache_result pr = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(sp, &pc, 1, &a, &pr), 0);
  want[0].size = sizeof(want[0]);
  ASSERT_EQ_INT(encache_lookup(sp, c, 4, &a, want), 3);
  e.ctl.hold_reads = 1;
  for (int k = 0; k < 3; k++) {
    r[k][0].size = sizeof(r[k][0]);
    ASSERT_EQ_INT(encache_lookup_start(s[k], c, 4, &a, r[k]), 0);
  }
  ASSERT(reads_held_within(&e.ctl, 2, 10000));
  struct timespec d = {0, 50 * 1000000L};
  nanosleep(&d, NULL);
  ASSERT_EQ_INT(reads_held_now(&e.ctl), 2); /* the third is queued */
  float out[2 * COLS];
  la_payload_of("fl-published", 2, out);
  int64_t shape[2] = {2, COLS};
  encache_tensor view = {sizeof view, out, ENCACHE_FLOAT32, 2, shape, NULL,
                         ENCACHE_DEVICE_HOST, 0, NULL};
  encache_storage *storage = NULL;
  ASSERT_EQ_INT(encache_storage_new(out, sizeof(out), NULL, NULL, &storage),
                0);
  ASSERT_EQ_INT(encache_publish(sp, "fl-published", &view, storage),
                ENCACHE_QUEUED);
  encache_storage_unref(storage);
  encache_step *extra = la_step(ec);
  encache_step_close(extra);
  ASSERT_EQ_INT(encache_step_wait(s[2], 0), ENCACHE_EPENDING);
  fault_release_reads(&e.ctl); /* (the publisher's existence check too) */
  for (int k = 2; k >= 0; k--) {
    ASSERT_EQ_INT(encache_step_wait(s[k], -1), 3);
    la_same_results(c, want, r[k], 4);
    la_free_hits(r[k], 4);
  }
  la_free_hits(want, 4);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  static encache_result back = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(s[0], &pc, 1, &a, &back), 1);
  la_same_results(&pc, &back, &back, 1); /* the bytes published */
  la_free_hits(&back, 1);
  encache_step_close(sp);
  for (int k = 0; k < 3; k++)
    encache_step_close(s[k]);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* ------------------------------------------------- a Store that stops */

/* A Redis server stopped (SIGSTOP) under a started lookup: the waits with
 * a bound return while it hangs, the lookup ends at the Store's timeout
 * with UNAVAILABLE (never a hang, never a poisoned handle), and lookups
 * hit again once the server is back. */
TEST(lookup_async_stopped_store_waits_are_bounded) {
  redis_server rs;
  if (!redis_server_start(&rs, "?timeout_ms=300&connect_timeout_ms=300"))
    return;
  aenv e;
  aenv_open_url(&e, rs.url, "async/stopped", "");
  char ids[2][32];
  la_seed(&e, "st", 2, 8, ids);
  encache_candidate c[2] = {la_cand(ids[0], 8), la_cand(ids[1], 8)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  encache_step *step = la_step(e.ec);
  int fd = encache_step_fd(step);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  ASSERT_EQ_INT(encache_step_wait(step, -1), 2); /* connected: hits */
  la_free_hits(r, 2);
  ASSERT_EQ_INT(kill(rs.pid, SIGSTOP), 0);
  double t0 = now_s();
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  ASSERT(now_s() - t0 < 0.25); /* a start never waits for the Store */
  ASSERT_EQ_INT(encache_step_wait(step, 20), ENCACHE_EPENDING);
  ASSERT_EQ_INT(la_readable(fd, 10000), 1); /* ended by the Store's timeout */
  ASSERT_EQ_INT(encache_step_wait(step, 0), 0);
  if (now_s() - t0 > 5.0) /* one 0.3 s timeout, generous on a busy machine */
    test__fail(__FILE__, __LINE__, "the lookup took %.3f s", now_s() - t0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(kill(rs.pid, SIGCONT), 0);
  int hits = 0;
  for (int i = 0; i < 300 && hits != 2; i++) { /* past the backoff */
    ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
    hits = encache_step_wait(step, -1);
    ASSERT(hits >= 0);
    la_free_hits(r, 2);
    if (hits != 2)
      usleep(100000);
  }
  ASSERT_EQ_INT(hits, 2);
  encache_step_close(step);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
  redis_server_stop(&rs);
}

/* ------------------------------------------------ a process killed */

/* The child: lookups started and waited on two steps, without end, on
 * the Store under test (one byte on `ready` after the first). */
static void killed_child(aenv *e, const encache_candidate *c, int ready) {
  char json[512];
  encache_options o = aenv_options(e, json, sizeof(json));
  encache *ec = NULL;
  if (encache__open_with_store(&o, ts_reopen(), &ec) != 0)
    _exit(2);
  encache_step *s[2] = {NULL, NULL};
  if (encache_step_open(ec, &s[0]) < 0 || encache_step_open(ec, &s[1]) < 0)
    _exit(3);
  encache_allocator a = ts_host_allocator();
  static encache_result r[2][4];
  for (unsigned k = 0;; k++) {
    encache_result *q = r[k % 2];
    q[0].size = sizeof(q[0]);
    if (encache_lookup_start(s[k % 2], c, 4, &a, q) < 0)
      _exit(4);
    if (k > 0) {
      encache_result *p = r[(k + 1) % 2];
      if (encache_step_wait(s[(k + 1) % 2], -1) != 4)
        _exit(5);
      for (int i = 0; i < 4; i++)
        free(p[i].data);
    }
    if (k == 1 && write(ready, "r", 1) != 1)
      _exit(6);
  }
}

/* Processes killed (SIGKILL) while their lookup threads read: the Store
 * and every other encoder go on, hits bit for bit. */
TEST(lookup_async_process_killed_mid_lookup) {
  const char *store = getenv("ENCACHE_TEST_STORE");
  if (store != NULL && strncmp(store, "shm://", 6) != 0) {
    printf("# skipped: the shm Store's test (%s is another)\n", store);
    return;
  }
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[4][32];
  la_seed(&e, "ki", 4, 64, ids);
  encache_candidate c[4] = {la_cand(ids[0], 64), la_cand(ids[1], 64),
                            la_cand(ids[2], 64), la_cand(ids[3], 64)};
  unsigned seed_ = 29;
  for (int round = 0; round < 8; round++) {
    int p[2];
    ASSERT_EQ_INT(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      killed_child(&e, c, p[1]);
    }
    close(p[1]);
    char b;
    ASSERT_EQ_INT((int)read(p[0], &b, 1), 1); /* its lookups run */
    close(p[0]);
    usleep(rand_r(&seed_) % 3000);
    ASSERT_EQ_INT(kill(pid, SIGKILL), 0);
    int status;
    ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* This process's lookups: every one a hit, bit for bit. */
    encache_result x[4] = {ENCACHE_RESULT_INIT}, y[4] = {ENCACHE_RESULT_INIT};
    la_talloc t = {0};
    encache_allocator a = la_allocator(&t);
    encache_step *sx = la_step(ec), *sy = la_step(ec);
    ASSERT_EQ_INT(encache_lookup(sx, c, 4, &a, x), 4);
    ASSERT_EQ_INT(encache_lookup_start(sy, c, 4, &a, y), 0);
    ASSERT_EQ_INT(encache_step_wait(sy, -1), 4);
    la_same_results(c, x, y, 4);
    la_free_hits(x, 4);
    la_free_hits(y, 4);
    encache_step_close(sx);
    encache_step_close(sy);
  }
  /* The Store still takes writes and reads them back. */
  la_put(&e, "ki-after", ENCACHE_FLOAT32, 8, COLS, 8);
  encache_candidate c1 = la_cand("ki-after", 8);
  encache_result r1 = ENCACHE_RESULT_INIT;
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  encache_step *s = la_step(ec);
  ASSERT_EQ_INT(encache_lookup_start(s, &c1, 1, &a, &r1), 0);
  ASSERT_EQ_INT(encache_step_wait(s, -1), 1);
  la_same_results(&c1, &r1, &r1, 1);
  la_free_hits(&r1, 1);
  encache_step_close(s);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}
