/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_async.c: lookups that do not wait (docs/engine.md, "Lookups that
 * do not wait").  encache_lookup_start() checks the arguments as
 * encache_lookup() does, copies the allocator into the step and queues
 * the step; the handle's lookup threads (store_reads_in_flight of them,
 * started by the first start) take the queued lookups in the order they
 * were started (a wait without a bound may run its own, when it is next:
 * run_here), with the very function encache_lookup() runs
 * (encache__lookup_timed), so that the results are the same for the same
 * Store state.
 *
 * Locking.  The lookup uses the handle's caller-thread state (steps,
 * leases, message, device state): a thread holds the handle's turn
 * (`ec->run`, core.h) while it runs one, as every caller's call does, so
 * that they take turns, but gives it up around its Store calls (plan.h),
 * where it touches only its plan, in its own lane (scratch and staging
 * buffer), and the Store: so the reads of several steps' lookups are in
 * flight at once, and the caller's calls go on meanwhile.  A call on the
 * step of such a lookup (encache__enter_step: lookup, publish, stream,
 * close) waits for it to complete (hold()).  The queue and each step's
 * `async` fields (step.h) are under `mu`; a thread changes a step's state
 * only while it also has the turn, so that a caller with the turn that
 * sees a lookup running knows it is in a Store call.  `done` is
 * signalled at each completion, `work` at each start and at stop.  Lock
 * order: run, then mu.  encache_step_wait() with a bound takes mu only:
 * it never waits for the turn; one without a bound takes the turn to run
 * its lookup itself when it has not begun and no other is started
 * (run_here, in the first thread's lane, the turn kept throughout).
 *
 * A step's fd is an eventfd written once per completion and drained by
 * the wait that returns that completion's answer.
 */
#include "lookup_async.h"
#include "lookup.h"
#include "lookup_read.h"
#include "step.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* The most lookup threads a handle has (store_reads_in_flight). */
#define READERS_MAX ENCACHE__WRITES_MAX

struct lookup_thread {
  encache *ec;
  struct encache__async *as;
  pthread_t thread;
  encache__lane lane;
};

struct encache__async {
  pthread_mutex_t mu;
  pthread_cond_t work, done; /* done: CLOCK_MONOTONIC (the waits' bound) */
  int stopping;
  size_t queued;    /* steps of the handle in state QUEUED */
  size_t running;   /* ... in state RUNNING */
  uint64_t next_seq;
  unsigned nthreads; /* started */
  struct lookup_thread threads[READERS_MAX];
};

/* The oldest queued step of ec, or NULL (the caller has run and mu). */
static encache_step *oldest_queued(encache *ec) {
  encache_step *best = NULL;
  for (size_t k = 0; k < ENCACHE_MAX_STEPS; k++) {
    encache_step *s = ec->steps[k];
    if (s != NULL && s->async.state == ENCACHE__ASYNC_QUEUED &&
        (best == NULL || s->async.seq < best->async.seq))
      best = s;
  }
  return best;
}

static void fd_signal(encache_step *s) {
  if (s->async.has_fd) {
    uint64_t one = 1;
    /* Non-blocking: a counter already set stays readable (EAGAIN). */
    ssize_t w = write(s->async.fd, &one, sizeof(one));
    (void)w;
  }
}

static void fd_drain(encache_step *s) {
  if (s->async.has_fd) {
    uint64_t v;
    ssize_t r = read(s->async.fd, &v, sizeof(v));
    (void)r;
  }
}

/* Runs s's lookup in lane (the caller has the turn and took s off the
 * queue), giving the turn up around its Store calls when yield, then
 * makes its answer the wait's. */
static void run_one(encache *ec, encache_step *s, encache__lane *lane,
                    int yield) {
  struct encache__async *as = ec->async;
  int rc = encache__lookup_timed(s, s->async.c, s->async.n, &s->async.a,
                                 s->async.results, lane, yield);
  pthread_mutex_lock(&as->mu);
  s->async.rc = rc;
  s->async.state = ENCACHE__ASYNC_DONE;
  as->running--;
  fd_signal(s);
  pthread_cond_broadcast(&as->done);
  pthread_mutex_unlock(&as->mu);
}

/* Takes s off the queue when it is the oldest there, or any (s NULL):
 * the step taken, or NULL (the caller has the turn). */
static encache_step *take(encache *ec, encache_step *s) {
  struct encache__async *as = ec->async;
  pthread_mutex_lock(&as->mu);
  encache_step *oldest = oldest_queued(ec); /* NULL: closed, or taken */
  if (s != NULL && oldest != s)
    oldest = NULL;
  if (oldest != NULL) {
    oldest->async.state = ENCACHE__ASYNC_RUNNING;
    as->queued--;
    as->running++;
  }
  pthread_mutex_unlock(&as->mu);
  return oldest;
}

static void *thread_main(void *arg) {
  struct lookup_thread *me = arg;
  encache *ec = me->ec;
  struct encache__async *as = me->as; /* ec->async is set once all run */
  for (;;) {
    pthread_mutex_lock(&as->mu);
    while (!as->stopping && as->queued == 0)
      pthread_cond_wait(&as->work, &as->mu);
    int stop = as->stopping;
    pthread_mutex_unlock(&as->mu);
    if (stop)
      return NULL;
    encache__enter(ec);
    encache_step *s = take(ec, NULL);
    if (s != NULL)
      run_one(ec, s, &me->lane, 1);
    encache__leave(ec);
  }
}

/* A wait without a bound on a lookup that has not begun, with no other
 * lookup of the handle started (queued or running), runs it on the
 * waiting thread: a lookup started and waited for at once costs what
 * encache_lookup() does, with no hand-over to a lookup thread and back.
 * With others started it is left to the lookup threads, whose reads are
 * in flight together (this one would keep the turn throughout).  The
 * order of the lookups is kept. */
static void run_here(encache_step *step) {
  encache *ec = step->ec;
  struct encache__async *as = ec->async;
  pthread_mutex_lock(&as->mu);
  int alone = step->async.state == ENCACHE__ASYNC_QUEUED && as->queued == 1 &&
              as->running == 0;
  pthread_mutex_unlock(&as->mu);
  if (!alone)
    return;
  encache__enter(ec);
  if (take(ec, step) != NULL) {
    /* No other lookup runs (the threads' take the turn first, and would
     * have taken this one, the oldest), nor can one begin while this
     * keeps the turn: the first thread's lane is free, and its staging
     * buffer serves (no second one for the same reads). */
    pthread_mutex_lock(&as->mu);
    int only = as->running == 1;
    pthread_mutex_unlock(&as->mu);
    run_one(ec, step, only ? &as->threads[0].lane : NULL, 0);
  }
  encache__leave(ec);
}

/* core.h's async_hold: returns once s has no lookup running.  The caller
 * has the turn, so one running is in a Store call, without the turn: the
 * turn is given up while it completes. */
static void hold(encache_step *s) {
  encache *ec = s->ec;
  struct encache__async *as = ec->async;
  pthread_mutex_lock(&as->mu);
  while (s->async.state == ENCACHE__ASYNC_RUNNING) {
    pthread_mutex_unlock(&as->mu); /* the lock order: run, then mu */
    encache__leave(ec);
    pthread_mutex_lock(&as->mu);
    while (s->async.state == ENCACHE__ASYNC_RUNNING)
      pthread_cond_wait(&as->done, &as->mu);
    pthread_mutex_unlock(&as->mu);
    encache__enter(ec);
    pthread_mutex_lock(&as->mu);
  }
  pthread_mutex_unlock(&as->mu);
}

/* step.c's hook: s closes (the caller has the turn and held s: no
 * lookup of it is running). */
static void forget(encache_step *s) {
  struct encache__async *as = s->ec->async;
  pthread_mutex_lock(&as->mu);
  ENCACHE_ASSERT(s->async.state != ENCACHE__ASYNC_RUNNING);
  if (s->async.state == ENCACHE__ASYNC_QUEUED)
    as->queued--;
  s->async.state = ENCACHE__ASYNC_NONE;
  pthread_mutex_unlock(&as->mu);
  if (s->async.has_fd)
    close(s->async.fd);
  s->async.has_fd = 0;
}

/* How many lookup threads: store_reads_in_flight, else the Store's
 * choice (its profile's: src/store/base.c). */
static unsigned readers(const encache *ec) {
  if (ec->reads_in_flight > 0)
    return ec->reads_in_flight;
  return encache__store_profile_of(ec->store)->reads_in_flight;
}

/* Starts the lookup threads (the caller has the turn).  One that cannot
 * start leaves fewer reads in flight, nothing else; none at all fails
 * the start. */
static int async_start(encache *ec) {
  struct encache__async *as = encache__calloc(1, sizeof(*as));
  if (as == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM,
                         "encache_lookup_start: out of memory");
  pthread_mutex_init(&as->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the waits' bound */
  pthread_cond_init(&as->done, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&as->work, NULL);
  unsigned want = readers(ec);
  int rc = 0;
  while (as->nthreads < want && as->nthreads < READERS_MAX) {
    struct lookup_thread *t = &as->threads[as->nthreads];
    t->ec = ec;
    t->as = as;
    if ((rc = pthread_create(&t->thread, NULL, thread_main, t)) != 0)
      break;
    as->nthreads++;
  }
  if (as->nthreads == 0) {
    pthread_mutex_destroy(&as->mu);
    pthread_cond_destroy(&as->work);
    pthread_cond_destroy(&as->done);
    encache__free(as);
    return encache__fail(ec, -rc, "encache_lookup_start: cannot start the "
                         "lookup thread: %s", encache_strerror(-rc));
  }
  ec->async_forget = forget;
  ec->async_hold = hold;
  /* Published last, whole: a start or an fd on another thread that sees
   * it uses it without the turn. */
  __atomic_store_n(&ec->async, as, __ATOMIC_RELEASE);
  return 0;
}

/* The handle's lookup threads, or NULL before the first start (read
 * without the turn: async_start publishes them). */
static struct encache__async *async_of(const encache *ec) {
  return __atomic_load_n(&ec->async, __ATOMIC_ACQUIRE);
}

/* Starts the lookup threads of step's handle unless they run: 0, or a
 * negative code (ENCACHE_EINVAL: step is NULL).  Decided once, under the
 * turn: the first start and the first fd may come at once from two
 * threads (an encoder's, an event loop's), and only one may start them.
 * When they do not run, no lookup does: the turn is free (a short wait). */
static int started(encache_step *step) {
  if (step == NULL)
    return ENCACHE_EINVAL;
  encache *ec = step->ec;
  int rc = 0;
  if (async_of(ec) == NULL) {
    encache__enter(ec);
    if (ec->async == NULL)
      rc = async_start(ec);
    encache__leave(ec);
  }
  return rc;
}

/* Queues step's lookup; ENCACHE_EINVAL when one is started and not yet
 * waited for.  Under mu only: a start never waits for the turn. */
static int enqueue(encache_step *step, const encache_candidate *c, size_t n,
                   const encache_allocator *a, encache_result *results) {
  struct encache__async *as = async_of(step->ec);
  pthread_mutex_lock(&as->mu);
  if (step->async.state != ENCACHE__ASYNC_NONE) {
    pthread_mutex_unlock(&as->mu);
    return ENCACHE_EINVAL;
  }
  step->async.c = c;
  step->async.n = n;
  step->async.results = results;
  /* The checks made sure that a is complete wherever the lookup reads
   * it; NULL (nothing to allocate) stays NULL, as the lookup expects. */
  memset(&step->async.a, 0, sizeof(step->async.a));
  if (a != NULL)
    encache__struct_in(&step->async.a, sizeof(step->async.a), a,
                       ENCACHE__ALLOCATOR_MIN);
  step->async.seq = as->next_seq++;
  step->async.rc = 0;
  step->async.state = ENCACHE__ASYNC_QUEUED;
  as->queued++;
  pthread_cond_signal(&as->work);
  pthread_mutex_unlock(&as->mu);
  return 0;
}

/* Whether step has a started lookup not yet waited for. */
static int busy(encache_step *step) {
  struct encache__async *as = async_of(step->ec);
  pthread_mutex_lock(&as->mu);
  int state = step->async.state;
  pthread_mutex_unlock(&as->mu);
  return state != ENCACHE__ASYNC_NONE;
}

/* A start with good arguments does not wait for the turn (the lookup the
 * thread runs may be another step's): its checks read only what no
 * lookup changes but the poison, an atomic.  A failing one takes the turn
 * to record its message.  ec->async is made (once: started()) and freed
 * only with the turn, before any lookup runs and after the last. */
int encache_lookup_start(encache_step *step, const encache_candidate *c,
                         size_t n, const encache_allocator *a,
                         encache_result *results) {
  int rc = started(step);
  if (rc < 0)
    return rc;
  encache *ec = step->ec;
  /* Refused before its arguments are read: they may be the arrays the
   * step's lookup is still writing. */
  if (busy(step))
    return ENCACHE_EINVAL;
  if (encache__lookup_check(step, c, n, a, results, 1) < 0) {
    encache__enter(ec);
    rc = encache__lookup_check(step, c, n, a, results, 0);
    encache__leave(ec);
    return rc < 0 ? rc : ENCACHE_EINVAL;
  }
  return enqueue(step, c, n, a, results);
}

int encache_step_wait(encache_step *step, int timeout_ms) {
  if (step == NULL)
    return ENCACHE_EINVAL;
  struct encache__async *as = async_of(step->ec);
  if (as == NULL) /* nothing was ever started on the handle */
    return ENCACHE_EINVAL;
  if (timeout_ms < 0)
    run_here(step);
  struct timespec until =
      encache__deadline(CLOCK_MONOTONIC, timeout_ms > 0 ? (unsigned)timeout_ms : 0);
  int rc = 0;
  pthread_mutex_lock(&as->mu);
  while ((step->async.state == ENCACHE__ASYNC_QUEUED ||
          step->async.state == ENCACHE__ASYNC_RUNNING) &&
         timeout_ms != 0 && rc != ETIMEDOUT) {
    if (timeout_ms < 0)
      pthread_cond_wait(&as->done, &as->mu);
    else
      rc = pthread_cond_timedwait(&as->done, &as->mu, &until);
  }
  int answer;
  switch (step->async.state) {
  case ENCACHE__ASYNC_DONE:
    answer = step->async.rc;
    step->async.state = ENCACHE__ASYNC_NONE;
    fd_drain(step);
    break;
  case ENCACHE__ASYNC_NONE: answer = ENCACHE_EINVAL; break;
  default: answer = ENCACHE_EPENDING; break;
  }
  pthread_mutex_unlock(&as->mu);
  return answer;
}

int encache_step_fd(encache_step *step) {
  /* The thread starts here too, so that the fd is made under its mutex. */
  int rc = started(step);
  if (rc < 0)
    return rc;
  struct encache__async *as = async_of(step->ec);
  pthread_mutex_lock(&as->mu);
  if (!step->async.has_fd) {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) {
      rc = -errno;
    } else {
      step->async.fd = fd;
      step->async.has_fd = 1;
      if (step->async.state == ENCACHE__ASYNC_DONE)
        fd_signal(step); /* completed before its fd was asked for */
    }
  }
  if (rc == 0)
    rc = step->async.fd;
  pthread_mutex_unlock(&as->mu);
  return rc;
}

void encache__async_stop(encache *ec) {
  struct encache__async *as = ec->async;
  if (as == NULL || as->stopping)
    return;
  pthread_mutex_lock(&as->mu);
  as->stopping = 1;
  pthread_cond_broadcast(&as->work);
  pthread_mutex_unlock(&as->mu);
  for (unsigned k = 0; k < as->nthreads; k++)
    pthread_join(as->threads[k].thread, NULL);
}

int encache__async_unregister(encache *ec) {
  struct encache__async *as = ec->async;
  int rc = 0;
  for (unsigned k = 0; as != NULL && k < as->nthreads && rc == 0; k++)
    rc = encache__staging_unregister(ec, &as->threads[k].lane);
  return rc;
}

void encache__async_free(encache *ec) {
  struct encache__async *as = ec->async;
  if (as == NULL)
    return;
  ENCACHE_ASSERT(as->stopping);
  ec->async_forget = NULL;
  ec->async_hold = NULL;
  ec->async = NULL;
  for (unsigned k = 0; k < as->nthreads; k++) {
    encache__lookup_free(&as->threads[k].lane);
    encache__aligned_free(as->threads[k].lane.staging);
  }
  pthread_mutex_destroy(&as->mu);
  pthread_cond_destroy(&as->work);
  pthread_cond_destroy(&as->done);
  encache__free(as);
}
