/*
 * engine.h: the engine handle shared by engine.c (open, close, stats),
 * lookup.c (the read path) and publish.c (the bounded publisher).
 *
 * Locking: `mu` guards the publisher's queue, lists, budgets and closing
 * flag, shared with the worker thread.  Everything else belongs to the
 * caller's thread (lookup/publish/close are not concurrent by contract).
 * `poisoned` and the counters are atomics, readable from any thread.
 */
#ifndef ENCACHE_ENGINE_H
#define ENCACHE_ENGINE_H

#include "internal.h"
#include "store.h"

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
  int done;
  int result; /* enum job_result */
  char why[160];
} job;

struct encache {
  int enabled;
  encache_store *store;
  char *ns;
  uint64_t max_items, max_bytes, read_buf_bytes;
  void (*log)(void *ctx, const char *message);
  void *log_ctx;
  char errmsg[512];
  int poisoned; /* atomic */

  /* Read path (caller's thread). */
  unsigned char *staging;
  int staging_registered;
  char **cand_ids; /* ids of the last lookup's eligible candidates, */
  uint64_t *cand_hash; /* their hashes, */
  char *cand_text;     /* and their text; buffers reused step to step */
  size_t ncand, cand_ids_cap, cand_hash_cap, cand_text_cap; /* caps: bytes */
  unsigned char *scratch; /* the per-lookup arrays, reused */
  size_t scratch_cap;

  /* Publisher. */
  pthread_mutex_t mu;
  pthread_cond_t work; /* worker waits: queue non-empty or closing */
  pthread_cond_t idle; /* flush waits: queue empty and nothing running */
  job *queue_head, *queue_tail; /* queued, not started */
  job *running;
  job *done_head; /* finished, not reaped */
  job *fatal_jobs; /* kept forever once poisoned */
  uint64_t pending_items, pending_bytes;
  int closing;
  int worker_waiting; /* the worker sleeps on `work` */
  int worker_started;
  pthread_t worker;

  encache_stats stats; /* fields updated atomically */
  encache *next_buried; /* see bury() in engine.c */
};

/* Atomic counter helpers. */
#define STAT_ADD(ec, field, v) __atomic_add_fetch(&(ec)->stats.field, (v), __ATOMIC_RELAXED)

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

/* Test hook: replaces the copy of a payload into a destination (a device
 * copy may fail; a host copy cannot).  Non-zero return = failed copy. */
extern int (*encache__copy_hook)(void *dst, const void *src, size_t n);

/* Opens a handle on a given Store (ownership passes to the handle, also
 * on failure); tests wrap a real Store with fault injection this way. */
int encache__open_with_store(const encache_options *o, encache_store *st,
                             encache **out);

#endif
