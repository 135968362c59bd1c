/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_store.h: a Store that wraps a real one and injects faults: chosen
 * result codes, malformed batch answers, failed (un)registrations, writes
 * held until released.  It counts every call, and keeps its counters in a
 * control block that outlives the Store (the engine closes the Store).
 */
#ifndef ENCACHE_TEST_FAULT_STORE_H
#define ENCACHE_TEST_FAULT_STORE_H

#include "base.h"

#include <pthread.h>

enum fault_read_mode {
  READ_PASS = 0,     /* forward */
  READ_ITEM_CODE,    /* every item answers read_item_code */
  READ_COUNT_ABOVE,  /* every item answers its slot size + 1 */
  READ_SHORT         /* every found item answers one byte less */
};

typedef struct fault_ctl {
  /* counters */
  int exists_calls, read_calls, write_calls, register_calls,
      unregister_calls, close_calls;
  int registered; /* currently registered buffers */
  /* injection */
  int registration;         /* 1: the Store needs registration */
  int fail_register_from;   /* fail registrations number >= this (1-based; 0 = never) */
  int fail_unregister;      /* 1: every unregistration fails */
  int exists_rc;            /* non-zero: the whole check fails with it */
  int exists_item;          /* non-zero: every item answers this */
  int exists_absent;        /* the next N existence checks answer "absent" */
  int lease_calls;          /* leases: forwarded when the Store has them */
  int read_rc;              /* non-zero: the whole read fails with it */
  int read_mode;
  int64_t read_item_code;
  int write_rc;             /* non-zero: writes answer it (nothing written) */
  /* held writes: while hold_writes, a write waits until released, or
   * until fault_pass_writes() lets it through (one permit per write) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int hold_writes;
  int write_permits;
  int writes_waiting;
  int writes_finished;
  /* held reads: while hold_reads, an existence check or a read (the
   * lookup's Store calls) waits until fault_release_reads() */
  int hold_reads;
  int reads_waiting;
} fault_ctl;

void fault_ctl_init(fault_ctl *ctl);
/* Wraps inner (ownership passes to the wrapper). */
encache_store *fault_store_wrap(encache_store *inner, fault_ctl *ctl);
/* Releases held writes; the next ones pass (or answer write_rc). */
void fault_release_writes(fault_ctl *ctl);
/* While writes are held, lets `n` more writes through (held or to come),
 * in the order the writer reaches the gate; the others stay held. */
void fault_pass_writes(fault_ctl *ctl, int n);
/* Waits until `n` writes are waiting (held). */
void fault_wait_held(fault_ctl *ctl, int n);
/* Releases held reads (existence checks and reads); the next ones pass. */
void fault_release_reads(fault_ctl *ctl);
/* Waits until `n` reads (or existence checks) are waiting (held). */
void fault_wait_reads_held(fault_ctl *ctl, int n);
/* Waits until `n` writes have finished. */
void fault_wait_finished(fault_ctl *ctl, int n);

#endif
