/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_store.c: a Store for the Python tests (tests/python), built as a
 * small shared library that Python loads with ctypes.  It wraps a real
 * shm Store through the public backend interface only (include/encache.h)
 * under the scheme "pyfault": pyfault://NAME?size=SIZE opens
 * shm://NAME?size=SIZE and forwards every operation to it, except where a
 * fault is switched on:
 *   - reads or writes answer a chosen code (ENCACHE_EUNCONFIRMED poisons
 *     the engine, ENCACHE_EUNAVAIL is recoverable);
 *   - reads or writes are held (the calling thread waits) until released,
 *     or until a bound passes (then the hold counts as timed out), so that
 *     a test can see what other threads do while the library is inside a
 *     Store call, and what stays pending while a write is held.
 * The switches are process-wide (one Python test at a time uses them);
 * pyfault_reset() turns every one off and releases what is held.
 */
#include <encache.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOLD_BOUND_MS 10000

/* One held operation kind: reads or writes. */
typedef struct gate {
  int hold;      /* 1: operations wait until released */
  int rc;        /* non-zero: operations answer it (nothing forwarded) */
  int waiting;   /* operations waiting now */
  int calls;     /* operations seen */
  int finished;  /* operations returned */
  int timed_out; /* holds that ended by the bound, not by a release */
} gate;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static gate reads, writes;

static void deadline_in(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Enters gate g: counts the call, waits while it is held (at most
 * HOLD_BOUND_MS), returns the code to answer (0 = forward). */
static int gate_enter(gate *g) {
  struct timespec until;
  deadline_in(&until, HOLD_BOUND_MS);
  pthread_mutex_lock(&mu);
  g->calls++;
  if (g->hold) {
    g->waiting++;
    pthread_cond_broadcast(&cv);
    int rc = 0;
    while (g->hold && rc != ETIMEDOUT)
      rc = pthread_cond_timedwait(&cv, &mu, &until);
    if (g->hold)
      g->timed_out++;
    g->waiting--;
  }
  int forced = g->rc;
  pthread_mutex_unlock(&mu);
  return forced;
}

static void gate_leave(gate *g) {
  pthread_mutex_lock(&mu);
  g->finished++;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

/* Waits until *field reaches n, at most ms; 0, or -1 on timeout. */
static int wait_for(const int *field, int n, int ms) {
  struct timespec until;
  deadline_in(&until, ms);
  int rc = 0;
  pthread_mutex_lock(&mu);
  while (*field < n && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&cv, &mu, &until);
  int ok = *field >= n;
  pthread_mutex_unlock(&mu);
  return ok ? 0 : -1;
}

static encache_store *inner_of(encache_store *st) {
  return (encache_store *)encache_store_data(st);
}

/* The inner Store's message becomes the wrapper's. */
static int fwd(encache_store *st, int rc) {
  char msg[512];
  if (rc >= 0)
    return rc;
  snprintf(msg, sizeof(msg), "%s", encache_store_errmsg(inner_of(st)));
  return encache_store_fail(st, rc, "%s", msg[0] ? msg : encache_strerror(rc));
}

static int p_exists(encache_store *st, const char *const *keys, size_t n,
                    int *results) {
  return fwd(st, encache_store_exists(inner_of(st), keys, n, results));
}

static int p_read(encache_store *st, const char *const *keys, size_t n,
                  void *const *bufs, const size_t *caps, int64_t *results) {
  int forced = gate_enter(&reads);
  int rc = forced ? encache_store_fail(st, forced, "pyfault: injected read "
                                                   "answer")
                  : fwd(st, encache_store_read(inner_of(st), keys, n, bufs,
                                               caps, results));
  gate_leave(&reads);
  return rc;
}

static int p_size(encache_store *st, const char *key, uint64_t *len) {
  return fwd(st, encache_store_object_size(inner_of(st), key, len));
}

static int p_write(encache_store *st, const char *key, const void *hdr,
                   size_t hl, const void *p, size_t n) {
  int forced = gate_enter(&writes);
  int rc = forced ? encache_store_fail(st, forced, "pyfault: injected write "
                                                   "answer")
                  : fwd(st, encache_store_write(inner_of(st), key, hdr, hl, p,
                                                n));
  gate_leave(&writes);
  return rc;
}

static int p_remove(encache_store *st, const char *key) {
  return fwd(st, encache_store_remove(inner_of(st), key));
}

static int p_list(encache_store *st, const char *pattern,
                  int (*cb)(const char *key, uint64_t len, void *arg),
                  void *arg) {
  return fwd(st, encache_store_list(inner_of(st), pattern, cb, arg));
}

static int p_stats(encache_store *st, encache_store_stats *s) {
  return fwd(st, encache_store_stats_get(inner_of(st), s));
}

static void p_close(encache_store *st) {
  encache_store_close(inner_of(st));
  encache_store_free(st);
}

/* No split reads: the public interface has no call that forwards one. */
static encache_store_backend backend = {
    .size = sizeof(encache_store_backend),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "pyfault", .exists = p_exists, .read = p_read,
    .object_size = p_size, .write = p_write, .remove = p_remove,
    .list = p_list, .stats = p_stats, .close = p_close};

static int p_open(const char *url, void *arg, encache_store **out) {
  (void)arg;
  char inner_url[1024];
  const char *rest = strncmp(url, "pyfault://", 10) == 0 ? url + 10 : NULL;
  *out = NULL;
  if (rest == NULL || (size_t)snprintf(inner_url, sizeof(inner_url),
                                       "shm://%s", rest) >= sizeof(inner_url))
    return encache_store_fail(NULL, ENCACHE_EURL,
                              "pyfault: expected pyfault://NAME?size=SIZE");
  encache_store *inner = NULL;
  int rc = encache_store_open(inner_url, &inner);
  if (rc != 0)
    return encache_store_fail(NULL, rc, "pyfault: %s",
                              encache_store_errmsg(NULL));
  /* Every caller sees one backend: the caps are set once, from the first
   * inner Store (all are shm). */
  backend.caps = encache_store_caps_of(inner) &
                 (ENCACHE_STORE_CAP_LIST | ENCACHE_STORE_CAP_PUT_IF_ABSENT |
                  ENCACHE_STORE_CAP_SHARED);
  if (!(backend.caps & ENCACHE_STORE_CAP_LIST))
    backend.list = NULL;
  rc = encache_store_new(&backend, inner, url, out);
  if (rc != 0) {
    encache_store_close(inner);
    return encache_store_fail(NULL, rc, "pyfault: %s",
                              encache_store_errmsg(NULL));
  }
  return 0;
}

/* ------------------------------------------------ what Python calls */

/* Registers the scheme "pyfault"; 0, also when already registered. */
int pyfault_register(void) {
  int rc = encache_store_register("pyfault", p_open, NULL);
  return rc == ENCACHE_EEXIST ? 0 : rc;
}

/* The codes a test makes operations answer. */
int pyfault_code_unconfirmed(void) { return ENCACHE_EUNCONFIRMED; }
int pyfault_code_unavailable(void) { return ENCACHE_EUNAVAIL; }

static gate *gate_of(int which) { return which ? &writes : &reads; }

/* which: 0 reads, 1 writes.  rc 0 forwards again. */
void pyfault_set_rc(int which, int rc) {
  pthread_mutex_lock(&mu);
  gate_of(which)->rc = rc;
  pthread_mutex_unlock(&mu);
}

void pyfault_hold(int which, int on) {
  pthread_mutex_lock(&mu);
  gate_of(which)->hold = on;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

/* Waits (at most ms) until n operations are held; 0 or -1. */
int pyfault_wait_held(int which, int n, int ms) {
  return wait_for(&gate_of(which)->waiting, n, ms);
}

/* Waits (at most ms) until n operations have returned in all; 0 or -1. */
int pyfault_wait_finished(int which, int n, int ms) {
  return wait_for(&gate_of(which)->finished, n, ms);
}

/* Counters: what = 0 calls, 1 finished, 2 timed-out holds, 3 waiting. */
int pyfault_count(int which, int what) {
  pthread_mutex_lock(&mu);
  gate *g = gate_of(which);
  int v = what == 0 ? g->calls : what == 1 ? g->finished
        : what == 2 ? g->timed_out : g->waiting;
  pthread_mutex_unlock(&mu);
  return v;
}

/* Every fault off, everything held released, counters zeroed (operations
 * still running keep their place in `finished`). */
void pyfault_reset(void) {
  pthread_mutex_lock(&mu);
  gate *all[2] = {&reads, &writes};
  for (int i = 0; i < 2; i++) {
    all[i]->hold = 0;
    all[i]->rc = 0;
    all[i]->calls = all[i]->finished = all[i]->timed_out = 0;
  }
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}
