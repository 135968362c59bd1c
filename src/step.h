/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.h: a step's candidate set (step.c).  Ids are kept as offsets into
 * one text buffer (it grows by realloc), with their hashes; caps count
 * elements (bytes for text).  Owned by the handle's caller thread.
 */
#ifndef ENCACHE_STEP_H
#define ENCACHE_STEP_H

#include "core.h"

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
  /* Its started lookup (lookup_async.c, under the lookup thread's mutex;
   * the thread also holds the handle's `run` when it changes them). */
  struct step_async {
    int state;  /* ENCACHE__ASYNC_*: none, queued, running, done */
    int rc;     /* done: what encache_lookup() returned */
    int fd;     /* encache_step_fd()'s eventfd, or -1 (none yet: 0) */
    int has_fd; /* whether fd is made */
    uint64_t seq; /* the order of starts */
    const encache_candidate *c;
    size_t n;
    encache_allocator a; /* the caller's, copied */
    encache_result *results;
  } async;
};

enum { ENCACHE__ASYNC_NONE = 0, ENCACHE__ASYNC_QUEUED, ENCACHE__ASYNC_RUNNING,
       ENCACHE__ASYNC_DONE };

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
/* The token with which another open step of ec than `except` holds id's
 * lease, or 0. */
uint64_t encache__steps_lease_of(const encache *ec, const encache_step *except,
                                 const char *id);
/* Ends every lease step still holds (it closes). */
void encache__leases_end(encache_step *step);
/* Keeps the text fmt formats in the step until it closes (one copy per
 * distinct text among the latest few) and returns it: an
 * encache_result.why.  Out of memory, returns fallback (a literal). */
const char *encache__step_note(encache_step *s, const char *fallback,
                               const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Closes every step still open (encache_close()). */
void encache__steps_close_all(encache *ec);

#endif
