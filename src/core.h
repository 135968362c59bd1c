/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core.h: the engine handle's core (core.c), the bottom floor of the
 * engine: the handle's fields, its message and poison, keys, counters and
 * the lease calls the lookup and the publisher both make.  It stands on
 * the Store layer and nothing of the engine; every other engine file
 * stands on it (docs/development.md, "Where things live").
 *
 * Ownership: the publisher's state is its own (publisher.c, behind
 * `pub`), as are the device state (device.c, `dev`) and the registry slot
 * (fleet.c, `fleet`).  Every other field belongs to the caller's thread
 * (steps, lookup, publish and close are not concurrent by contract),
 * except `poisoned` and the counters, atomics readable from any thread.
 * Since 1.3 a started lookup (lookup_async.c) runs on one of the handle's
 * lookup threads with that state: `run` is held by whoever uses it, the
 * caller's calls (encache__enter) and the lookup threads alike, so that
 * they take turns; a lookup thread gives the turn up only around its
 * Store calls, while it touches nothing but its own plan and lane (so
 * that several lookups read the Store at once, and the caller's calls go
 * on meanwhile).  The lookup threads' own state is behind `async`.
 */
#ifndef ENCACHE_CORE_H
#define ENCACHE_CORE_H

#include "internal.h"
#include "store/base.h"

#include <pthread.h>

struct encache__publisher;
struct encache__device;
struct encache__fleet;
struct encache__async;

/* The memory one lookup runs in, reused lookup to lookup: the plan's
 * arrays, and the staging buffer (store_read_buffer_bytes, allocated at
 * the first read that needs it, registered with the Store when it
 * requires registered memory). */
typedef struct encache__lane {
  unsigned char *scratch;
  size_t scratch_cap;
  unsigned char *staging;
  int staging_registered;
} encache__lane;

struct encache {
  int enabled;
  encache_store *store;
  char *ns;
  /* The publisher's options (publisher.c reads them at start). */
  uint64_t max_items, max_bytes;
  unsigned writes_in_flight; /* store_writes_in_flight; 0: the Store's */
  /* Single flight (lease.c): on when the option is and the Store has
   * leases (ENCACHE_STORE_CAP_LEASE). */
  int single_flight;
  uint32_t lease_ttl_ms;
  uint64_t lease_wait_ms;
  /* Leases its steps hold, not yet handed to a publication (the step
   * slots that are not 0).  While there are any, a lookup does not wait
   * for other encoders: they may be waiting for these. */
  uint64_t leases_held;
  void (*log)(void *ctx, const char *message);
  void *log_ctx;
  char errmsg[512]; /* the handle's one message (encache__fail) */
  int poisoned;     /* atomic */

  /* Read path (lookup.c, lookup_read.c).  `lane` is the memory of the
   * lookups that keep the turn from start to end: the caller's
   * encache_lookup(), a wait that runs its own (lookup_async.c), and
   * every lookup into CUDA destinations (the device state pins its
   * staging buffer); each lookup thread has a lane of its own. */
  uint64_t read_buf_bytes;
  unsigned reads_in_flight; /* store_reads_in_flight; 0: the Store's */
  encache__lane lane;
  /* Open steps (step.c): slots of steps[], nsteps in use (NULL = free). */
  struct encache_step *steps[ENCACHE_MAX_STEPS];
  size_t nsteps;

  struct encache__publisher *pub; /* NULL until started */

  /* CUDA devices (device.c): the options, and the state (streams,
   * events, the pinned pool), NULL until first used. */
  uint64_t pinned_pool_max, device_timeout_ms;
  struct encache__device *dev;

  encache_stats stats; /* fields updated atomically */
  encache *next_buried; /* see bury() in engine.c */

  /* The handle's slot of the statistics registry (fleet.c; NULL: none),
   * and where the handle counts: its slot's counters, else `stats` (set
   * at open, back to `stats` before the slot is freed). */
  struct encache__fleet *fleet;
  encache_stats *live;
  char *fleet_segment, *fleet_encoder; /* stats_segment, encoder_name */

  /* The caller-thread state's turn (see above): held by every engine call
   * of the caller and by the lookup thread while it runs a lookup. */
  pthread_mutex_t run;
  /* The lookup threads (lookup_async.c), NULL until the first
   * encache_lookup_start() or encache_step_fd(). */
  struct encache__async *async;
  /* The lookup threads' two hooks, for the calls below them: async_hold
   * waits until a step's started lookup, which may be reading the Store
   * without the turn, is done (encache__enter_step, before every call on
   * a step); async_forget takes a closing step out of their queue and
   * closes its fd (step.c).  Who sets them: lookup_async.c, when it starts
   * the threads (with the turn, before it publishes `async`), and clears
   * them when it frees them at close; NULL until then: no lookup was
   * ever started, there is nothing to wait for or forget, and a handle
   * that never starts one pays nothing.  Why not calls: the queue is
   * lookup_async.c's own (struct encache__async), and lookup_async.c
   * stands on step.c and the lookup (it runs encache__lookup_timed); a
   * call from core.h or step.c up to it would make them one circle.  The
   * structure view (scripts/rooms.py) does not see these two edges: they
   * are the engine's only calls upward. */
  void (*async_forget)(encache_step *step);
  void (*async_hold)(encache_step *step);
};

/* Takes and gives back the handle's turn (`run`): every public call that
 * uses the caller-thread state does, so that it waits for a started
 * lookup the lookup thread is running. */
static inline void encache__enter(encache *ec) {
  pthread_mutex_lock(&ec->run);
}
static inline void encache__leave(encache *ec) {
  pthread_mutex_unlock(&ec->run);
}

/* Takes the turn for a call on step: once it returns, no started lookup
 * of step is running (one reading the Store without the turn completes
 * first; lookup_async.c gives the turn up while it waits). */
static inline void encache__enter_step(encache *ec, encache_step *step) {
  encache__enter(ec);
  if (ec->async_hold != NULL)
    ec->async_hold(step);
}

/* Adds v to counter `field` of the handle (ec->live's). */
#define ENCACHE__COUNT(ec, field, v)                                         \
  __atomic_add_fetch(&(ec)->live->field, (v), __ATOMIC_RELAXED)

/* After a read: hits_unchecked follows the count of objects the handle's
 * Store served without a check, when it keeps one (its profile).  The
 * Store is the handle's own, so its count is the handle's; several
 * threads may read it at once: the counter only grows. */
void encache__count_unchecked(encache *ec);

/* Records the handle's message and returns rc. */
int encache__fail(encache *ec, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Poisons the handle (sticky) with a message; returns ENCACHE_EPOISONED. */
int encache__poison(encache *ec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int encache__is_poisoned(const encache *ec);

/* Builds NAMESPACE "@id:" id in a fresh allocation; NULL on OOM. */
char *encache__make_key(const encache *ec, const char *id);
uint64_t encache__hash_id(const char *id);

/* Leases (single flight, docs/engine.md): a random token, never 0. */
uint64_t encache__lease_token(void);
/* Ends the lease of key held by token (0: none) on ec's Store; a failure
 * is counted and left to the lease's deadline.  Any thread. */
void encache__lease_end(encache *ec, const char *key, uint64_t token);
/* Sets a step's lease slot (0 ends nothing: it forgets), keeping
 * ec->leases_held right; returns the token it held. */
uint64_t encache__lease_slot_set(encache *ec, uint64_t *slot, uint64_t token);

/* The minimum accepted sizes of the caller's structs: their size at API
 * 1.0 (see encache__struct_in()). */
#define ENCACHE__OPTIONS_MIN sizeof(encache_options)
#define ENCACHE__CANDIDATE_MIN sizeof(encache_candidate)
#define ENCACHE__RESULT_MIN offsetof(encache_result, why) /* 1.0 had no why */
#define ENCACHE__ALLOCATOR_MIN offsetof(encache_allocator, headroom)
#define ENCACHE__STATS_MIN offsetof(encache_stats, in_flight) /* 1.0's */

#endif
