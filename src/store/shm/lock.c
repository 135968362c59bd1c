/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.c: the shm Store's segment lock: taking it (with a timeout, and
 * brief waits after a stall), what every lock does first (refuse a
 * damaged header or lock, recover from a dead holder, validate, publish
 * what a timeout left pending), and the test hooks that take it.
 *
 * Stalls.  The lock is taken with a timeout (lock_timeout_ms, default
 * 500); after a timeout the handle waits only briefly for the next second
 * (doubling to 32 s while timeouts go on), so a stopped lock holder costs
 * an encoder one timeout, not one per operation.  A writer stalled
 * mid-copy (stopped, or slow) does not stop the ring: when its record is
 * the oldest, it is relabelled one lap on, in place (its bytes do not
 * move), and allocation goes around it (ring.c).  Opening never waits on
 * the segment lock: the open-time validation runs at the handle's first
 * lock instead.
 */
#include "shm.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#define SHM_STALL_BACKOFF_MS 1000u /* after a lock timeout: brief waits */
#define SHM_STALL_WAIT_MS 2u

/* A monotonic deadline where glibc has one: a step of the wall clock must
 * not stretch the wait.  (Not under ThreadSanitizer, which does not
 * intercept pthread_mutex_clocklock.) */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 30) && \
    !defined(ENCACHE_TSAN)
#define SHM_CLOCKLOCK 1
#endif

/* Publishes a record this handle finished copying, if it is still ours;
 * one written for a purge epoch that has passed is freed instead.  The
 * epoch is compared under the lock, and a tier's removal takes the lock
 * after it bumps the epoch: either it finds the object published, or the
 * publication finds the epoch moved (tier.c, "Removals"). */
int encache__shm_publish(shm_store *s, const shm_pending *p) {
  shm_entry c;
  if (!encache__shm_load_entry(s, ent_id(s, p->e), &c, 0) ||
      c.state != E_WRITING || c.gen != p->gen ||
      c.owner_slot != (uint32_t)s->slot || c.owner_token != s->token)
    return ENCACHE_ENOENT;
  if (p->at_epoch &&
      __atomic_load_n(&s->h->purge_epoch, __ATOMIC_ACQUIRE) != p->epoch) {
    encache__shm_entry_free(s, p->e);
    return 1;
  }
  c.state = E_READY;
  c.owner_slot = UINT32_MAX;
  c.sum = p->sum;
  c.flags = p->flags;
  encache__shm_store_entry(s, p->e, &c);
  return 0;
}

/* Under the lock: publishes what an earlier timeout left pending. */
static void publish_pending(shm_store *s) {
  pthread_mutex_lock(&s->pmu);
  for (int i = 0; i < s->npending; i++)
    encache__shm_publish(s, &s->pending[i]);
  __atomic_store_n(&s->npending, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&s->pmu);
}

/* Whether the lock looks like the robust process-shared mutex that
 * segment_init() made.  glibc aborts inside pthread_mutex_timedlock() on
 * some damaged kind words, so the kind is compared with a fresh mutex's
 * before every lock (a damaged lock cannot be repaired while other
 * processes may be waiting on it). */
#ifdef __GLIBC__
static int good_kind;
static pthread_once_t good_kind_once = PTHREAD_ONCE_INIT;
static void good_kind_init(void) {
  pthread_mutex_t m;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&m, &a);
  good_kind = m.__data.__kind;
  pthread_mutex_destroy(&m);
  pthread_mutexattr_destroy(&a);
}
int encache__shm_lock_damaged(pthread_mutex_t *m) {
  pthread_once(&good_kind_once, good_kind_init);
  return __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) != good_kind;
}
#else
int encache__shm_lock_damaged(pthread_mutex_t *m) {
  (void)m;
  return 0;
}
#endif

/* What refuses a lock before any wait: a handle in a child after fork(),
 * a header or a lock that is damaged.  0 when none does. */
static int lock_refused(shm_store *s) {
  if (s->h == NULL)
    return encache_store_fail(&s->base, ENCACHE_EINVAL,
                              "%s: handle used in a child after fork(): "
                              "open a new one", s->base.url);
  if (!identity_ok(s))
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: the segment header is damaged (magic, "
                              "format or geometry changed): " DESTROY_HINT,
                              s->base.url, s->name);
  if (encache__shm_lock_damaged(&s->h->lock))
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: the segment lock is damaged: " DESTROY_HINT,
                              s->base.url, s->name);
  return 0;
}

/* Takes the mutex, waiting at most wait ms; returns pthread's code. */
static int timed_lock(pthread_mutex_t *m, unsigned wait) {
#ifdef SHM_CLOCKLOCK
  const clockid_t clock = CLOCK_MONOTONIC;
#else
  const clockid_t clock = CLOCK_REALTIME;
#endif
  struct timespec ts = encache__deadline(clock, wait);
#ifdef SHM_CLOCKLOCK
  return pthread_mutex_clocklock(m, clock, &ts);
#else
  return pthread_mutex_timedlock(m, &ts);
#endif
}

/* A full timeout: the brief waits last 1 s, doubling with each further
 * full timeout up to 32 s (a holder that never resumes). */
static int lock_timed_out(shm_store *s, unsigned wait) {
  unsigned n = __atomic_load_n(&s->stalls, __ATOMIC_RELAXED);
  if (n < 6)
    __atomic_store_n(&s->stalls, ++n, __ATOMIC_RELAXED);
  uint64_t backoff = (uint64_t)SHM_STALL_BACKOFF_MS << (n - 1);
  __atomic_store_n(&s->stalled_until_ms, mono_ms() + backoff,
                   __ATOMIC_RELAXED);
  return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                            "%s: lock not acquired within %u ms (its "
                            "holder may be stopped; for the next %" PRIu64
                            " ms operations wait at most %u ms)",
                            s->base.url, wait, backoff, SHM_STALL_WAIT_MS);
}

/* Takes the segment lock, recovering it from a dead holder. */
static int lock_raw(shm_store *s) {
  int rc = lock_refused(s);
  if (rc < 0)
    return rc;
  /* After a timeout, wait only briefly for a while: a stopped holder must
   * cost an encoder one timeout, not one per operation. */
  unsigned wait = s->lock_timeout_ms;
  if (mono_ms() < __atomic_load_n(&s->stalled_until_ms, __ATOMIC_RELAXED) &&
      wait > SHM_STALL_WAIT_MS)
    wait = SHM_STALL_WAIT_MS;
  rc = timed_lock(&s->h->lock, wait);
  if (rc == 0 || rc == EOWNERDEAD) {
    __atomic_store_n(&s->stalled_until_ms, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stalls, 0, __ATOMIC_RELAXED);
    if (rc == EOWNERDEAD) {
      /* The previous holder died mid-update: rebuild, then vouch for it
       * (a repair that cannot finish leaves `dirty` for the next one). */
      encache__shm_repair(s);
      pthread_mutex_consistent(&s->h->lock);
    }
    return 0;
  }
  if (rc == ETIMEDOUT && wait < s->lock_timeout_ms)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: lock busy (its holder was stalled for %u "
                              "ms earlier: waits are brief for a while)",
                              s->base.url, s->lock_timeout_ms);
  if (rc == ETIMEDOUT)
    return lock_timed_out(s, wait);
  if (rc == EINVAL || rc == ENOTRECOVERABLE)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: the segment lock is %s (%s): " DESTROY_HINT,
                              s->base.url,
                              rc == EINVAL ? "damaged" : "unrecoverable",
                              strerror(rc), s->name);
  return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                            "%s: lock failed: %s", s->base.url, strerror(rc));
}

/* Takes the segment lock; then checks the structure when a check is owed
 * (repairing what fails it), and publishes what a timeout left pending. */
int encache__shm_lock(shm_store *s) {
  int rc = lock_raw(s);
  if (rc < 0)
    return rc;
  if (s->h->dirty || __atomic_exchange_n(&s->validate_pending, 0,
                                         __ATOMIC_RELAXED)) {
    if (!encache__shm_structure_ok(s))
      encache__shm_repair(s); /* on failure `dirty` stays: the next lock
                                 tries again */
  }
  if (__atomic_load_n(&s->npending, __ATOMIC_RELAXED) > 0)
    publish_pending(s);
  return 0;
}

void encache__shm_unlock(shm_store *s) { pthread_mutex_unlock(&s->h->lock); }

int encache__shm_test_lock(encache_store *st) {
  return encache__shm_lock((shm_store *)st);
}

void encache__shm_test_unlock(encache_store *st) {
  encache__shm_unlock((shm_store *)st);
}

int encache__shm_test_repair(encache_store *st, int always) {
  shm_store *s = (shm_store *)st;
  int rc = encache__shm_lock(s);
  if (rc < 0)
    return rc;
  if (always || !encache__shm_structure_ok(s))
    rc = encache__shm_repair(s);
  encache__shm_unlock(s);
  return rc;
}
