/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine.h: the engine handle shared by engine.c (open, close, stats),
 * lookup.c (the read path) and publish.c (the bounded publisher).
 *
 * Locking: `mu` guards the publisher's queue, lists, budgets and closing
 * flag, shared with the worker thread.  Everything else belongs to the
 * caller's thread (steps, lookup, publish, close are not concurrent by
 * contract).
 * `poisoned` and the counters are atomics, readable from any thread.
 */
#ifndef ENCACHE_ENGINE_H
#define ENCACHE_ENGINE_H

#include "core.h"
#include "fleet.h" /* added in 1.3 */
#include "internal.h"

#include <pthread.h>

struct encache_storage {
  uint64_t refs;          /* atomic */
  uint64_t views_pending; /* under the handle's mu: jobs holding it */
  const unsigned char *base;
  uint64_t nbytes;
  void (*release)(void *ctx);
  void *ctx;
};

enum job_result {
  JOB_WRITTEN = 0,
  JOB_PRESENT = 1, /* the key existed: nothing written */
  JOB_FAILED = 2,  /* recoverable: not written */
  JOB_FATAL = 3    /* completion unconfirmed: poison, keep everything */
};

typedef struct job {
  struct job *next;
  char *key;
  encache_storage *storage;
  const unsigned char *data;
  uint64_t nbytes;
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  uint64_t lease; /* the token of the key's lease it ends, 0 = none */
  /* Its existence, asked ahead with other queued jobs' (publish_ask.c,
   * for a Store whose profile says ask_ahead): asked = 1 once `present` holds
   * the answer; asking = 1 while a writer asks (no other asks for it).  seq:
   * the handle's count of queued jobs when it was queued (under mu), so
   * that an answer never goes to another job at a reused address. */
  int asking, asked, present;
  uint64_t seq;
  int done;
  int result; /* enum job_result */
  char why[384]; /* JOB_FAILED, JOB_FATAL: the Store's reason */
  /* A CUDA output (device.c): its page-locked copy, which `data` points
   * into; NULL for a host output. */
  struct encache__pinned *pinned;
} job;

struct encache {
  int enabled;
  encache_store *store;
  char *ns;
  uint64_t max_items, max_bytes, read_buf_bytes;
  /* Single flight (lease.c): on when the option is and the Store has
   * leases (ENCACHE_STORE_CAP_LEASE). */
  int single_flight;
  uint32_t lease_ttl_ms;
  uint64_t lease_wait_ms;
  /* Leases its steps hold, not yet handed to a publication (the step
   * slots that are not 0; caller's thread).  While there are any, a lookup
   * does not wait for other encoders: they may be waiting for these. */
  uint64_t leases_held;
  void (*log)(void *ctx, const char *message);
  void *log_ctx;
  char errmsg[512];
  int poisoned; /* atomic */

  /* Read path (caller's thread). */
  unsigned char *staging;
  int staging_registered;
  unsigned char *scratch; /* the lookup plan's arrays, reused */
  size_t scratch_cap;
  /* Open steps: slots of steps[], nsteps of them in use (NULL = free). */
  encache_step *steps[ENCACHE_MAX_STEPS];
  size_t nsteps;

  /* Publisher. */
  pthread_mutex_t mu;
  pthread_cond_t work; /* worker waits: queue non-empty or closing */
  pthread_cond_t idle; /* flush waits: queue empty and nothing running */
  job *queue_head, *queue_tail; /* queued, not started */
  uint64_t job_seq;              /* jobs queued so far (job.seq) */
  job *running;
  job *done_head; /* finished, not reaped */
  job *fatal_jobs; /* kept forever once poisoned */
  uint64_t pending_items, pending_bytes;
  int closing;
  int worker_waiting; /* the worker sleeps on `work` */
  int worker_started;
  pthread_t worker;
  /* Writes in flight (publish.c): `worker` and writers[0..nwriters)
   * take jobs, each one at a time, and `running` lists theirs (by next);
   * a fatal result stops them all (writers_fatal).  Under mu.  How many:
   * writes_in_flight (store_writes_in_flight; 0: the Store's choice). */
  unsigned writes_in_flight;
  pthread_t writers[ENCACHE__WRITES_MAX - 1];
  int nwriters;
  int writers_fatal;

  /* CUDA devices (device.c): the options, and the state (streams,
   * events, the pinned pool; caller's thread), NULL until first used. */
  uint64_t pinned_pool_max, device_timeout_ms;
  struct encache__device *dev;

  encache_stats stats; /* fields updated atomically */
  encache *next_buried; /* see bury() in engine.c */

  /* Added in 1.3 (fleet.c): the handle's slot of the statistics registry
   * (NULL: none), and where the handle counts: its slot's counters, else
   * `stats` (set at open, back to `stats` before the slot is freed). */
  struct encache__fleet *fleet;
  encache_stats *live;
  char *fleet_segment, *fleet_encoder; /* stats_segment, encoder_name */
};

/* Atomic counter helpers: the counters are ec->live's. */
#define STAT_ADD(ec, field, v) __atomic_add_fetch(&(ec)->live->field, (v), __ATOMIC_RELAXED)

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

/* publish.c */
int encache__publisher_start(encache *ec);
/* Marks closing, waits for the worker to drain the queue, joins it. */
void encache__publisher_stop(encache *ec);
/* Releases finished jobs; returns 0 or ENCACHE_EPOISONED. */
int encache__reap(encache *ec);

/* lookup.c */
void encache__lookup_free(encache *ec);

/*
 * step.c: a step's candidate set.  Ids are kept as offsets into one text
 * buffer (it grows by realloc), with their hashes; caps count elements
 * (bytes for text).  Owned by the handle's caller thread.
 */
struct encache_step {
  encache *ec;
  size_t slot;     /* its index in ec->steps */
  uint64_t *hash;  /* n of them */
  size_t *off;     /* id k is text + off[k] */
  uint64_t *lease; /* id k's lease token while this step holds it, or 0 */
  /* Entry k's contract, what a publication of it must be.  An id asked
   * under two contracts has an entry for each; the first holds the lease. */
  struct step_contract {
    int dtype;
    uint64_t rows, cols;
  } *contract;
  char *text;
  size_t n, cap, text_len, text_cap;
  struct step_note *notes; /* the causes its lookups gave (result.why) */
  void *stream; /* encache_step_set_stream(): a cudaStream_t, or NULL */
};

/* Makes room for `more` ids totalling `bytes` bytes (NULs included), so
 * that the next step_add calls cannot fail.  ENCACHE_ENOMEM otherwise
 * (the set is unchanged). */
int encache__step_reserve(encache_step *s, size_t more, size_t bytes);
/* Adds candidate c (room reserved; hash: of its id) unless the set holds
 * its id under its contract. */
void encache__step_add(encache_step *s, const encache_candidate *c,
                       uint64_t hash);
/* Whether id is in the set under the contract (dtype, rows, cols). */
int encache__step_contract_ok(const encache_step *s, const char *id,
                              int dtype, uint64_t rows, uint64_t cols);
/* Where the step keeps id's lease token (0: none), or NULL when id is not
 * a candidate of the step. */
uint64_t *encache__step_lease(encache_step *s, const char *id);

/* lease.c: single flight (docs/engine.md).  A random token, never 0. */
uint64_t encache__lease_token(void);
/* Ends the lease of key held by token (0: none) on ec's Store; a failure
 * is counted and left to the lease's deadline.  Any thread. */
void encache__lease_end(encache *ec, const char *key, uint64_t token);
/* Ends every lease step still holds (it closes). */
void encache__leases_end(encache_step *step);
/* Sets a step's lease slot (0 ends nothing: it forgets), keeping
 * ec->leases_held right; returns the token it held. */
uint64_t encache__lease_slot_set(encache *ec, uint64_t *slot, uint64_t token);
/* The token with which another open step of ec than `except` holds id's
 * lease, or 0. */
uint64_t encache__steps_lease_of(const encache *ec, const encache_step *except,
                                 const char *id);
/* Keeps the text fmt formats in the step until it closes (one copy per
 * distinct text among the latest few) and returns it: an
 * encache_result.why.  Out of memory, returns fallback (a literal). */
const char *encache__step_note(encache_step *s, const char *fallback,
                               const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Asks existence ahead for job j (just taken by this writer) and the
 * jobs queued behind it, when the Store's profile says ask_ahead
 * (publish_ask.c).
 * Called and returns with ec->mu held; releases it meanwhile. */
void encache__ask_ahead(encache *ec, job *j);

/* Closes every step still open (encache_close()). */
void encache__steps_close_all(encache *ec);

/* The minimum accepted sizes of the caller's structs: their size at API
 * 1.0 (see encache__struct_in()). */
#define ENCACHE__OPTIONS_MIN sizeof(encache_options)
#define ENCACHE__CANDIDATE_MIN sizeof(encache_candidate)
#define ENCACHE__RESULT_MIN offsetof(encache_result, why) /* 1.0 had no why */
#define ENCACHE__ALLOCATOR_MIN offsetof(encache_allocator, headroom)
#define ENCACHE__STATS_MIN offsetof(encache_stats, in_flight) /* 1.0's */

/* Test hook: replaces the copy of a payload into a destination (a device
 * copy may fail; a host copy cannot).  Non-zero return = failed copy. */
extern int (*encache__copy_hook)(void *dst, const void *src, size_t n);

/* Opens a handle on a given Store (ownership passes to the handle, also
 * on failure); tests wrap a real Store with fault injection this way. */
int encache__open_with_store(const encache_options *o, encache_store *st,
                             encache **out);

#endif
