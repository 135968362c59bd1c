/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lookups that do not wait (encache_lookup_start, encache_step_wait,
 * encache_step_fd; docs/engine.md), on the real shm Store behind the
 * fault-injecting wrapper, which holds the lookup's reads where a test
 * needs a lookup in flight (no test waits for a fixed time to get one):
 * their results, the fd and the waits, cancellation, poison and order.
 * Several lookups at once, a Store that stops and a process killed are
 * in test_lookup_async_load.c; the fixtures in lookup_async_util.c.
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

/* -------------------------------------------------------------- property */

/* What an id of the pool is in the Store. */
enum { ABSENT, PRESENT, WRONG_DTYPE, SHORT_OBJECT, OVERSIZE, STATES };

/* `iters` random candidate sets over random Store contents, each looked
 * up blocking and started then waited, on e's handle. */
static void property_run(aenv *e, int iters) {
  encache *ec = e->ec;
  unsigned seed_ = 20261202u;
  static const uint64_t rows_of[] = {1, 2, 8, 64};
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  int hits_total = 0, kinds[STATES + 1] = {0};
  for (int iter = 0; iter < iters; iter++) {
    char ids[6][32];
    uint64_t rows[6];
    for (int k = 0; k < 6; k++) {
      snprintf(ids[k], sizeof(ids[k]), "it%d-%d", iter, k);
      int state = (int)(rand_r(&seed_) % STATES);
      kinds[state]++;
      rows[k] = state == OVERSIZE ? 300 : rows_of[rand_r(&seed_) % 4];
      switch (state) {
      case PRESENT: case OVERSIZE:
        la_put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows[k], COLS, rows[k]);
        break;
      case WRONG_DTYPE: /* the same byte count, another contract */
        la_put(e, ids[k], ENCACHE_BFLOAT16, (int64_t)rows[k], 2 * COLS,
               rows[k]);
        break;
      case SHORT_OBJECT: /* a header that says more than there is */
        la_put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows[k] + 1, COLS, rows[k]);
        break;
      default: break;
      }
    }
    size_t n = 1 + rand_r(&seed_) % 10;
    encache_candidate c[10];
    for (size_t i = 0; i < n; i++) {
      int k = (int)(rand_r(&seed_) % 6); /* duplicates too */
      c[i] = la_cand(ids[k], rows[k]);
      if (rand_r(&seed_) % 12 == 0) {
        c[i].modality = ENCACHE_MODALITY_AUDIO; /* SKIPPED */
        kinds[STATES]++;
      }
    }
    encache_result x[10], y[10], z[10];
    memset(x, 0, sizeof(x));
    memset(y, 0xa5, sizeof(y)); /* what the lookup does not write shows */
    memset(z, 0xa5, sizeof(z));
    x[0].size = y[0].size = z[0].size = sizeof(encache_result);
    encache_step *sx = la_step(ec), *sy = la_step(ec), *sz = la_step(ec);
    int want = encache_lookup(sx, c, n, &a, x);
    ASSERT(want >= 0);
    /* Two started at once (in flight together, with two lookup threads),
     * the later waited for first. */
    ASSERT_EQ_INT(encache_lookup_start(sy, c, n, &a, y), 0);
    ASSERT_EQ_INT(encache_lookup_start(sz, c, n, &a, z), 0);
    ASSERT_EQ_INT(encache_step_wait(sz, -1), want);
    ASSERT_EQ_INT(encache_step_wait(sy, -1), want);
    la_same_results(c, x, y, n);
    la_same_results(c, x, z, n);
    hits_total += want;
    la_free_hits(x, n);
    la_free_hits(y, n);
    la_free_hits(z, n);
    encache_step_close(sx);
    encache_step_close(sy);
    encache_step_close(sz);
  }
  ASSERT(hits_total > 0);
  for (int s = 0; s <= STATES; s++)
    ASSERT(kinds[s] > 0); /* every kind of object (and SKIPPED) was seen */
  encache_stats st = {.size = sizeof(st)};
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT(st.incompatible > 0 && st.oversize > 0 && st.misses > 0);
  ASSERT_EQ_INT(t.allocs - t.releases, 3 * hits_total);
}

TEST(lookup_async_results_equal_blocking_lookups) {
  aenv e;
  aenv_readers = 2;
  aenv_open(&e);
  aenv_readers = 0;
  property_run(&e, 200);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
}

/* The same over a real redis-server (skipped without one). */
TEST(lookup_async_results_equal_blocking_lookups_redis) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char extra[64];
  snprintf(extra, sizeof(extra), ", \"store_read_buffer_bytes\": %d",
           READ_BUF);
  aenv e;
  aenv_open_url(&e, rs.url, "async/redis", extra);
  property_run(&e, 60);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
  kill_wait(rs.pid, SIGTERM);
}

/* ---------------------------------------------------- the fd, the waits */

TEST(lookup_async_fd_readable_once_per_lookup) {
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[3][32];
  la_seed(&e, "fd", 3, 2, ids);
  encache_step *step = la_step(ec);
  int fd = encache_step_fd(step);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(encache_step_fd(step), fd); /* the same one */
  ASSERT_EQ_INT(la_readable(fd, 0), 0);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL); /* none started */
  encache_candidate c[3] = {la_cand(ids[0], 2), la_cand(ids[1], 2),
                            la_cand(ids[2], 2)};
  encache_result r[3] = {ENCACHE_RESULT_INIT};
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  for (int round = 0; round < 3; round++) {
    e.ctl.hold_reads = round < 2; /* the last round runs free */
    ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), 0);
    if (round < 2) {
      fault_wait_reads_held(&e.ctl, 1);
      ASSERT_EQ_INT(la_readable(fd, 0), 0);
      ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
      ASSERT_EQ_INT(encache_step_wait(step, 30), ENCACHE_EPENDING);
      /* One lookup at a time on a step. */
      ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), ENCACHE_EINVAL);
      fault_release_reads(&e.ctl);
    }
    ASSERT_EQ_INT(la_readable(fd, 60000), 1);
    ASSERT_EQ_INT(la_readable(fd, 0), 1); /* stays readable until the wait */
    if (round == 1) /* the answer is kept until a wait takes it */
      ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), ENCACHE_EINVAL);
    ASSERT_EQ_INT(encache_step_wait(step, round == 2 ? -1 : 0), 3);
    ASSERT_EQ_INT(la_readable(fd, 0), 0); /* consumed */
    ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL); /* done */
    ASSERT_EQ_INT(la_readable(fd, 0), 0);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    la_free_hits(r, 3);
  }
  /* A step whose fd is asked for after its lookup completed. */
  encache_step *late = la_step(ec);
  ASSERT_EQ_INT(encache_lookup_start(late, c, 3, &a, r), 0);
  /* The handle's turn: a blocking call waits for the started lookup. */
  encache_step *other = la_step(ec);
  encache_step_close(other);
  int lfd = encache_step_fd(late);
  ASSERT(lfd >= 0 && lfd != fd);
  ASSERT_EQ_INT(la_readable(lfd, 60000), 1);
  ASSERT_EQ_INT(encache_step_wait(late, 0), 3);
  ASSERT_EQ_INT(la_readable(lfd, 0), 0);
  la_free_hits(r, 3);
  ASSERT_EQ_INT(t.allocs, 12);
  ASSERT_EQ_INT(t.releases, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* The first encache_step_fd() (an event loop's thread) and the first
 * encache_lookup_start() (the encoder's) race to start the lookup
 * threads: they are started once.  Before the fix both started a set;
 * the first was never joined: its lookup never ran (the bounded wait
 * answered ENCACHE_EPENDING) and its threads read the handle after
 * encache_close() (a crash, a use-after-free under ASan). */
typedef struct fd_racer {
  encache_step *step;
  int ready, go, fd;
  unsigned delay; /* spins after the go: the rounds sweep the offset */
} fd_racer;

static void spin(unsigned n) {
  for (volatile unsigned k = 0; k < n; k++)
    ;
}

static void *fd_racer_main(void *arg) {
  fd_racer *r = arg;
  __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&r->go, __ATOMIC_ACQUIRE))
    ;
  spin(r->delay);
  r->fd = encache_step_fd(r->step);
  return NULL;
}

TEST(lookup_async_first_fd_and_first_start_race_start_once) {
  for (int round = 0; round < 300; round++) {
    aenv e;
    aenv_readers = 2;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[1][32];
    la_seed(&e, "race", 1, 2, ids);
    encache_step *evloop = la_step(ec), *encoder = la_step(ec);
    fd_racer r = {evloop, 0, 0, -1, round % 2 ? (unsigned)(round * 7 % 300) : 0};
    pthread_t t;
    ASSERT_EQ_INT(pthread_create(&t, NULL, fd_racer_main, &r), 0);
    encache_candidate c[1] = {la_cand(ids[0], 2)};
    encache_result res[1] = {ENCACHE_RESULT_INIT};
    la_talloc ta = {0};
    encache_allocator a = la_allocator(&ta);
    while (!__atomic_load_n(&r.ready, __ATOMIC_ACQUIRE))
      ;
    __atomic_store_n(&r.go, 1, __ATOMIC_RELEASE);
    spin(round % 2 ? 0 : (unsigned)(round * 7 % 300));
    ASSERT_EQ_INT(encache_lookup_start(encoder, c, 1, &a, res), 0);
    pthread_join(t, NULL);
    ASSERT(r.fd >= 0);
    ASSERT_EQ_INT(encache_step_wait(encoder, 20000), 1); /* not lost */
    ASSERT_EQ_INT(res[0].outcome, ENCACHE_HIT);
    la_free_hits(res, 1);
    encache_step_close(evloop);
    encache_step_close(encoder);
    ASSERT_EQ_INT(encache_close(ec), 0);
    aenv_done(&e);
  }
}

TEST(lookup_async_refuses_bad_arguments_at_once) {
  aenv e;
  encache *ec = aenv_open(&e);
  encache_step *step = la_step(ec);
  encache_candidate c[1] = {la_cand("x", 2)};
  encache_result r[1] = {ENCACHE_RESULT_INIT};
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  ASSERT_EQ_INT(encache_lookup_start(NULL, c, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &a, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results is NULL");
  ASSERT_EQ_INT(encache_lookup_start(step, NULL, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, NULL, r), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "allocator is required");
  r[0].size = 3;
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &a, r), ENCACHE_EINVAL);
  r[0].size = sizeof(r[0]);
  ASSERT_EQ_INT(encache_step_wait(NULL, 0), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_step_fd(NULL), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL);
  ASSERT_EQ_STR(encache_err_name(ENCACHE_EPENDING), "EPENDING");
  ASSERT_CONTAINS(encache_strerror(ENCACHE_EPENDING), "not complete");
  /* A miss, through the thread; an allocator copied (a is gone by then). */
  {
    encache_allocator gone = la_allocator(&t);
    ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &gone, r), 0);
    memset(&gone, 0, sizeof(gone));
  }
  ASSERT_EQ_INT(encache_step_wait(step, -1), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[0].why, "not in the Store");
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* ------------------------------------------------------- cancellation */

typedef struct releaser {
  fault_ctl *ctl;
  int held;
  pthread_t thread;
} releaser;

/* Waits for the held reads, then gives the main thread time to block in
 * the call under test before releasing them (either order is safe: the
 * test asserts safety, not the interleaving). */
static void *release_main(void *arg) {
  releaser *r = arg;
  fault_wait_reads_held(r->ctl, r->held);
  struct timespec d = {0, 20 * 1000000L};
  nanosleep(&d, NULL);
  fault_release_reads(r->ctl);
  return NULL;
}

static void releaser_start(releaser *r, fault_ctl *ctl) {
  r->ctl = ctl;
  r->held = 1;
  ASSERT_EQ_INT(pthread_create(&r->thread, NULL, release_main, r), 0);
}

TEST(lookup_async_step_close_in_flight_is_safe) {
  /* One lookup thread (the second lookup queued), then two (both read). */
  for (int readers = 1; readers <= 2; readers++) {
    aenv e;
    aenv_readers = readers;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[4][32];
    la_seed(&e, "sc", 4, 8, ids);
    encache_candidate c[5] = {la_cand(ids[0], 8), la_cand(ids[1], 8),
                              la_cand(ids[2], 8), la_cand(ids[3], 8),
                              la_cand("sc-absent", 8)};
    static encache_result r[5] = {ENCACHE_RESULT_INIT};
    static encache_result q[5];
    for (int i = 0; i < 5; i++)
      q[i] = (encache_result){.size = sizeof(q[i]), .outcome = -1};
    la_talloc t = {0};
    encache_allocator a = la_allocator(&t);
    encache_step *step = la_step(ec), *queued = la_step(ec);
    (void)encache_step_fd(step); /* its fd is closed with it */
    e.ctl.hold_reads = 1;
    ASSERT_EQ_INT(encache_lookup_start(step, c, 5, &a, r), 0);
    ASSERT_EQ_INT(encache_lookup_start(queued, c, 5, &a, q), 0);
    fault_wait_reads_held(&e.ctl, 1);
    /* A wait with a bound returns while the Store is held. */
    ASSERT_EQ_INT(encache_step_wait(step, 50), ENCACHE_EPENDING);
    ASSERT_EQ_INT(encache_step_wait(queued, 10), ENCACHE_EPENDING);
    releaser rel;
    releaser_start(&rel, &e.ctl);
    encache_step_close(step); /* waits for its lookup, then closes */
    ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
    /* Completed: its hits are the caller's, as encache_lookup()'s are. */
    for (int i = 0; i < 4; i++)
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    ASSERT_EQ_INT(r[4].outcome, ENCACHE_MISS);
    la_free_hits(r, 5);
    /* The queued one either ran (then its answer waits) or is dropped with
     * its step, unrun: both are safe. */
    encache_step_close(queued);
    int ran = q[0].outcome == ENCACHE_HIT;
    if (ran)
      la_free_hits(q, 5);
    ASSERT_EQ_INT(t.allocs, 4 + 4 * ran);
    ASSERT_EQ_INT(t.releases, 0);
    ASSERT_EQ_INT(encache_close(ec), 0);
    aenv_done(&e);
  }
}

TEST(lookup_async_handle_close_in_flight_is_safe) {
  /* With one lookup thread, then two (both lookups read at the close). */
  for (int run = 0; run < 4; run++) {
    int with_step_open = run & 1;
    aenv e;
    aenv_readers = 1 + run / 2;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[3][32];
    la_seed(&e, "hc", 3, 64, ids);
    encache_candidate c[3] = {la_cand(ids[0], 64), la_cand(ids[1], 64),
                              la_cand(ids[2], 64)};
    static encache_result r[3] = {ENCACHE_RESULT_INIT};
    static encache_result q[3];
    for (int i = 0; i < 3; i++) /* not an outcome: one that never ran */
      q[i] = (encache_result){.size = sizeof(q[i]), .outcome = -1};
    la_talloc t = {0};
    encache_allocator a = la_allocator(&t);
    encache_step *step = la_step(ec), *queued = la_step(ec);
    (void)encache_step_fd(queued);
    e.ctl.hold_reads = 1;
    ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), 0);
    ASSERT_EQ_INT(encache_lookup_start(queued, c, 3, &a, q), 0);
    fault_wait_reads_held(&e.ctl, 1);
    ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
    releaser rel;
    releaser_start(&rel, &e.ctl);
    if (with_step_open) { /* the step closes with the handle */
      ASSERT_EQ_INT(encache_close(ec), 0);
    } else {
      encache_step_close(step);
      ASSERT_EQ_INT(encache_close(ec), 0);
    }
    ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
    ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT); /* the running one completed */
    la_free_hits(r, 3);
    int ran = q[0].outcome == ENCACHE_HIT;
    if (ran)
      la_free_hits(q, 3);
    ASSERT_EQ_INT(t.allocs, 3 + 3 * ran);
    ASSERT_EQ_INT(t.releases, 0);
    aenv_done(&e);
  }
}

/* ----------------------------------------------------------------- poison */

TEST(lookup_async_unconfirmed_read_poisons_at_the_wait) {
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[2][32];
  la_seed(&e, "po", 2, 2, ids);
  encache_candidate c[2] = {la_cand(ids[0], 2), la_cand(ids[1], 2)};
  static encache_result r[2] = {ENCACHE_RESULT_INIT}; /* kept: reachable */
  la_talloc t = {0};
  encache_allocator a = la_allocator(&t);
  encache_step *step = la_step(ec);
  int fd = encache_step_fd(step);
  e.ctl.read_rc = ENCACHE_EUNCONFIRMED;
  e.ctl.hold_reads = 1;
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  fault_wait_reads_held(&e.ctl, 1);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
  fault_release_reads(&e.ctl);
  ASSERT_EQ_INT(la_readable(fd, 60000), 1);
  ASSERT_EQ_INT(encache_step_wait(step, -1), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(ec), "poisoned");
  encache_stats st = {.size = sizeof(st)};
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_INT(st.poisoned, 1);
  /* Later starts fail fast, as lookups do. */
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(t.releases, 0); /* destinations the Store wrote are kept */
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  aenv_done(&e);
}

/* ------------------------------------------------------ run in order */

/* Records, per allocation, which lookup (its candidate's id's first
 * letter). */
typedef struct order_log {
  char seq[64];
  int n;
} order_log;

static int order_alloc(void *ctx, size_t i, const encache_candidate *c,
                       uint64_t nbytes, void **data, void **handle) {
  order_log *l = ctx;
  (void)i;
  if (l->n < 63)
    l->seq[l->n++] = c->id[0];
  *handle = NULL;
  *data = malloc(nbytes ? nbytes : 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void order_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

/* A wait without a bound may run its lookup on the waiting thread (when
 * it has not begun and is the next to run), never before an older one:
 * lookups run in the order they were started, whoever waits. */
TEST(lookup_async_waits_keep_the_order_of_starts) {
  aenv e;
  encache *ec = aenv_open(&e);
  la_put(&e, "a1", ENCACHE_FLOAT32, 2, COLS, 2);
  la_put(&e, "b1", ENCACHE_FLOAT32, 2, COLS, 2);
  la_put(&e, "c1", ENCACHE_FLOAT32, 2, COLS, 2);
  encache_candidate ca = la_cand("a1", 2), cb = la_cand("b1", 2),
                    cc = la_cand("c1", 2);
  static encache_result ra = ENCACHE_RESULT_INIT, rb = ENCACHE_RESULT_INIT,
                        rc_ = ENCACHE_RESULT_INIT;
  static order_log log;
  memset(&log, 0, sizeof(log));
  encache_allocator a = {sizeof(a), &log, order_alloc, order_release, 0};
  encache_step *sa = la_step(ec), *sb = la_step(ec), *sc = la_step(ec);
  e.ctl.hold_reads = 1;
  ASSERT_EQ_INT(encache_lookup_start(sa, &ca, 1, &a, &ra), 0);
  fault_wait_reads_held(&e.ctl, 1); /* a runs on the lookup thread */
  ASSERT_EQ_INT(encache_lookup_start(sb, &cb, 1, &a, &rb), 0);
  ASSERT_EQ_INT(encache_lookup_start(sc, &cc, 1, &a, &rc_), 0);
  releaser rel;
  releaser_start(&rel, &e.ctl);
  ASSERT_EQ_INT(encache_step_wait(sc, -1), 1); /* c is not the next: b is */
  ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
  ASSERT_EQ_INT(encache_step_wait(sa, -1), 1);
  ASSERT_EQ_INT(encache_step_wait(sb, -1), 1);
  ASSERT_EQ_INT(log.n, 3);
  ASSERT_EQ_MEM(log.seq, "abc", 3);
  /* Started and waited at once, with nothing before it: it may run here
   * or on the lookup thread, and gives the same answer. */
  log.n = 0;
  free(ra.data);
  ra.data = NULL;
  ASSERT_EQ_INT(encache_lookup_start(sa, &ca, 1, &a, &ra), 0);
  ASSERT_EQ_INT(encache_step_wait(sa, -1), 1);
  ASSERT_EQ_INT(log.n, 1);
  la_same_results(&ca, &ra, &ra, 1);
  free(ra.data);
  free(rb.data);
  free(rc_.data);
  encache_step_close(sa);
  encache_step_close(sb);
  encache_step_close(sc);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}
