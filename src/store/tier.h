/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.h: the tiered Store (src/store/tier.c, tier_promote.c): a
 * host-local shm tier in front of a distributed Store, opened from
 *
 *   tier:shm://NAME?size=SIZE[&promote_queue_items=N&promote_queue_bytes=SIZE]+REMOTE_URL
 *
 * The local part ends at the first '+' of the URL: an shm URL never holds
 * one (its names are A-Z a-z 0-9 . _ -, its option values numbers, sizes
 * and words), so the remote URL after it may hold anything, '+' in a
 * password included.  docs/stores.md has the semantics.
 */
#ifndef ENCACHE_TIER_H
#define ENCACHE_TIER_H

#include "base.h"

#include <pthread.h>

/* The promotion queue's default bounds. */
#define TIER_QUEUE_ITEMS 1024
#define TIER_QUEUE_BYTES (64ull << 20)
/* The least promote_queue_bytes accepted: below it, most objects would
 * never fit the queue. */
#define TIER_QUEUE_BYTES_MIN (64ull << 10)

/* Objects up to this size are copied by the lookup that found them; a
 * larger one is read again from the remote tier by the promotion thread,
 * so that the lookup never pays for copying it (tier_promote.c). */
#define TIER_COPY_MAX (256u << 10)

/* One remote hit waiting to be written into the local tier. */
typedef struct tier_promo {
  struct tier_promo *next;
  char *key;
  size_t len;   /* the object's length */
  int fetch;    /* 1: data is empty, read the object from the remote */
  uint64_t gen; /* the local segment's purge epoch it was read under */
  unsigned char data[]; /* the whole object, header first (or nothing) */
} tier_promo;

/* Counters, updated with atomics (any thread). */
typedef struct tier_counts {
  uint64_t local_hits, remote_hits, remote_errors;
  uint64_t promo_queued, promo_done, promo_dropped;
} tier_counts;

/*
 * The handle.  Invariants: local and remote are open for the handle's
 * life; ops is this handle's table (its caps depend on the remote's);
 * qitems/qbytes count what the queue holds plus what is reserved for
 * items being copied, and never exceed max_items/max_bytes.  mu guards
 * the queue and stop; the promotion thread is the only writer of
 * promotions into local.
 */
typedef struct tier_store {
  encache_store base;
  encache_store_backend ops;
  encache_store *local, *remote;
  pthread_mutex_t mu;
  pthread_cond_t cv, idle;
  tier_promo *head, *tail;
  tier_promo *cur; /* the promotion being written (the thread's) */
  size_t qitems, max_items;
  uint64_t qbytes, max_bytes;
  int stop, thread_started, busy;
  pthread_t thread;
  /* The promotion thread's own: the buffer objects are read again into;
   * fetch_off after an unconfirmed read (the buffer is then abandoned). */
  unsigned char *fbuf;
  size_t fcap;
  int fetch_off;
  tier_counts n;
} tier_store;

/* Makes a tier of two open Stores (ownership passes to it, also on
 * failure), showing `shown` as its URL (the tests wrap the remote in the
 * fault Store).  max_items/max_bytes 0 take the defaults. */
int encache__tier_wrap(encache_store *local, encache_store *remote,
                       const char *shown, size_t max_items,
                       uint64_t max_bytes, encache_store **out);
/* Waits until the promotion queue is empty and no promotion runs (tests,
 * the benchmark). */
void encache__tier_drain(encache_store *st);

/* tier_promote.c: the promotion queue and its thread. */
int encache__tier_promote_start(tier_store *t);
void encache__tier_promote_stop(tier_store *t);
/* The local segment's purge epoch now (shm's purge_epoch, kept in the
 * segment: bumped by every removal through a tier of the host, after its
 * remote removal).  A lookup or write notes it before asking the remote;
 * what it promotes is written only while the epoch has not moved. */
uint64_t encache__tier_epoch(tier_store *t);
/* The remote's count of objects it served without their check (Redis
 * with checksum=on: objects an older writer left), or 0 when it keeps
 * none.  A read during which it moves promotes nothing (tier.c). */
uint64_t encache__tier_remote_unchecked(tier_store *t);
/* Queues a copy of the object key = head[0..hlen) + body[0..blen) when it
 * is a well-formed v3 object and the queue has room and no removal
 * happened since the remote was asked (gen: the epoch then); else counts
 * it dropped.  Never blocks on the local tier. */
void encache__tier_promote(tier_store *t, uint64_t gen, const char *key,
                           const void *head, size_t hlen, const void *body,
                           size_t blen);
/* Called by remove (prefix 0) and remove_prefix (prefix 1) once they
 * bumped the purge epoch to `epoch` (after the remote removal, before the
 * local one): drops the queued promotions of what they remove, and makes
 * the others current when that bump was the only one since they were
 * read (the one being written is refused by the local tier if its key,
 * or any, was removed). */
void encache__tier_promote_forget(tier_store *t, const char *key, int prefix,
                                  uint64_t epoch);
/* Wakes the promotion thread for what encache__tier_promote() queued. */
void encache__tier_promote_kick(tier_store *t);

#endif
