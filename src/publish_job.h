/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publish_job.h: the publisher's own types, private to its files
 * (publisher.c, publish_ask.c), as Redis's bio.c keeps its job: the
 * state behind ec->pub, a queued job, and a storage's fields.
 *
 * Locking: `mu` guards the queue, the lists, the budgets and the closing
 * flag, shared by the caller's thread and the writer threads.
 */
#ifndef ENCACHE_PUBLISH_JOB_H
#define ENCACHE_PUBLISH_JOB_H

#include "core.h"

#include <pthread.h>

struct encache_storage {
  uint64_t refs;          /* atomic */
  uint64_t views_pending; /* under the publisher's mu: jobs holding it */
  const unsigned char *base;
  uint64_t nbytes;
  void (*release)(void *ctx);
  void *ctx;
};

/* What became of a job: its result, kept in the job (not a return code
 * of any function). */
enum encache__job_result {
  ENCACHE__JOB_WRITTEN = 0,
  ENCACHE__JOB_PRESENT = 1, /* the key existed: nothing written */
  ENCACHE__JOB_FAILED = 2,  /* recoverable: not written */
  ENCACHE__JOB_FATAL = 3    /* completion unconfirmed: poison, keep all */
};

typedef struct encache__job {
  struct encache__job *next;
  char *key;
  encache_storage *storage;
  const unsigned char *data;
  uint64_t nbytes;
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  uint64_t lease; /* the token of the key's lease it ends, 0 = none */
  /* Its existence, asked ahead with other queued jobs' (publish_ask.c,
   * for a Store whose profile says ask_ahead): asked = 1 once
   * `present` holds the answer; asking = 1 while a writer asks (no other
   * asks for it).  seq: the publisher's count of queued jobs when it was
   * queued (under mu), so that an answer never goes to another job at a
   * reused address. */
  int asking, asked, present;
  uint64_t seq;
  int done;
  int result; /* enum encache__job_result */
  char why[384]; /* FAILED, FATAL: the Store's reason */
  /* A CUDA output (device.c): its page-locked copy, which `data` points
   * into; NULL for a host output. */
  struct encache__pinned *pinned;
} encache__job;

struct encache__publisher {
  pthread_mutex_t mu;
  pthread_cond_t work; /* writers wait: queue non-empty or closing */
  pthread_cond_t idle; /* flush waits: queue empty and nothing running */
  encache__job *queue_head, *queue_tail; /* queued, not started */
  uint64_t job_seq;                      /* jobs queued so far (job.seq) */
  encache__job *running;   /* by next: the writers' jobs */
  encache__job *done_head; /* finished, not reaped */
  encache__job *fatal_jobs; /* kept forever once poisoned */
  uint64_t pending_items, pending_bytes;
  int closing;
  int worker_waiting; /* writers sleeping on `work` (a count) */
  /* The writer threads: each takes jobs, one at a time; a fatal result
   * stops them all (writers_fatal). */
  pthread_t writers[ENCACHE__WRITES_MAX];
  int nwriters;
  int writers_fatal;
};

#endif
