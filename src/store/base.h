/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base.h: the bottom of the Store layer, what every backend and the front
 * share: the common head of a handle, the check of a backend table, the
 * calling thread's messages and the one classification of answers
 * (base.c), the control requests the built-in backends answer, a
 * handle's profile, the query-string parser and the URL helpers
 * (url.c).  It includes no backend and no front: the backends stand on
 * it, and the front (front.c: the scheme table and the public
 * encache_store_* calls) stands on them.
 *
 * Results are classified once, in the backend, into the codes listed at
 * encache_store in encache.h; nobody above a backend interprets a
 * backend's native codes, and the engine reads those codes only through
 * encache_store_classify().  A per-item ENCACHE_EINVAL means the backend
 * refused that item (a key it cannot hold): certainly not done, so the
 * engine treats it as recoverable.  A backend that wraps another (the
 * fault-injecting wrapper of the tests) holds the inner handle and
 * forwards.
 *
 * Thread safety: every backend's operations may be called from several
 * threads at once on one handle.
 */
#ifndef ENCACHE_STORE_BASE_H
#define ENCACHE_STORE_BASE_H

#include "internal.h"

#include <stdarg.h>

/* The built-in backends fill the public encache_store_backend
 * (include/encache.h) as a user's backend does. */
typedef encache_store_backend encache__store_ops;

/*
 * A handle's profile: the paths the engine takes with it, decided once
 * from the backend's capability flags and control answers when the
 * handle is made (encache__store_profile_set()), so that no flag test is
 * scattered over the engine.
 */
typedef struct encache__store_profile {
  /* Reads split straight into host destinations (read_split without
   * registered memory): no staging buffer for host destinations. */
  unsigned read_direct : 1;
  /* Reads need the staging buffer registered (ENCACHE_STORE_CAP_REGISTER),
   * and so do the publisher's write buffers. */
  unsigned registered : 1;
  /* Whole objects may be read into a destination's headroom (neither
   * registered memory nor split reads). */
  unsigned read_whole : 1;
  /* A read answers "absent" as cheaply as an existence check. */
  unsigned read_absent : 1;
  /* write() never replaces: no existence check before writing. */
  unsigned put_if_absent : 1;
  /* The control request ENCACHE_STORE_CONTROL_WRITE_KNOWN is answered:
   * the publisher asks existence ahead for several queued jobs. */
  unsigned ask_ahead : 1;
  /* Leases are given (single flight). */
  unsigned lease : 1;
  /* The Store counts the objects it served without a check
   * (ENCACHE__CONTROL_UNCHECKED): the engine reads the count after its
   * reads. */
  unsigned unchecked : 1;
  /* How many writes the publisher keeps in flight when
   * store_writes_in_flight does not say: ENCACHE__WRITERS on a Store
   * shared with other processes whose calls do not poll, else 1. */
  unsigned writes_in_flight;
  /* How many started lookups read at once when store_reads_in_flight
   * does not say (the handle's lookup threads): as many, for the same
   * reason. */
  unsigned reads_in_flight;
} encache__store_profile;

/* The common head of every handle: a built-in backend's handle starts
 * with it; a user's backend gets a bare one from encache_store_new(). */
struct encache_store {
  const encache_store_backend *ops;
  char *url;  /* as shown: never holds a password */
  void *data; /* encache_store_new()'s data */
  encache__store_profile profile; /* set once at open, read-only after */
  /* encache_store_set_list_timeout()'s bound on a walk of the keys, in
   * ms (0: none); atomic, read at the start of each walk
   * (encache__store_list_deadline()). */
  uint32_t list_timeout_ms;
};

/* The most writes a publisher keeps in flight (store_writes_in_flight):
 * a backend that serves writes at once has room for this many. */
#define ENCACHE__WRITES_MAX 8
/* The writes a publisher keeps in flight on a shared Store whose calls
 * do not poll (the profile's default, when store_writes_in_flight does
 * not say). */
#define ENCACHE__WRITERS 2

/* The size of a backend table of API 1.0, which ends with close: the
 * smallest accepted.  A later operation is read only from a table whose
 * size covers it. */
#define ENCACHE__BACKEND_SIZE_1_0 offsetof(encache_store_backend, remove_prefix)
#define ENCACHE__BACKEND_HAS(b, field)                                         \
  ((b)->size >= offsetof(encache_store_backend, field) + sizeof((b)->field) && \
   (b)->field != NULL)

/* The longest message kept (encache_store_fail()). */
#define ENCACHE__STORE_MSG_MAX 512
/* Makes the calling thread's last message, whatever handle it was about,
 * the message of calls without a handle (encache_store_errmsg(NULL)):
 * a failed open's, when its backend recorded it on the handle it then
 * freed. */
void encache__store_msg_unscope(void);

/* The one check of a backend table, for encache_store_new() and for the
 * built-in backends (asserted at open): 0, or ENCACHE_EINVAL with the
 * calling thread's message naming what is wrong. */
int encache__backend_check(const encache_store_backend *b);

/* Asks st's backend the control request op with arg: its answer, or
 * ENCACHE_STORE_CONTROL_UNKNOWN when the backend has no control or does
 * not know op (docs/stores.md). */
int encache__store_control(encache_store *st, int op, void *arg);

/* The monotonic time in ms (CLOCK_MONOTONIC) by which a walk of st's
 * keys that starts now must end, or 0 when st has no list timeout. */
uint64_t encache__store_list_deadline(const encache_store *st);

/* Decides st's profile from its backend (at open, once st->ops is set). */
void encache__store_profile_set(encache_store *st);
/* The profile of an open handle (never NULL). */
static inline const encache__store_profile *
encache__store_profile_of(const encache_store *st) {
  return &st->profile;
}

/* The built-in backends' own control requests (from 65536: never a
 * user's, docs/stores.md).  The shm Store's purge epoch (src/store/shm,
 * the tier's side of removals: tier.c): a count of the removals made
 * through a tier on the segment, kept in it.  PURGE_EPOCH reads it into
 * the uint64_t at arg; PURGE_EPOCH_BUMP adds one and gives the new value
 * there; WRITE_AT_EPOCH (arg: an encache__epoch_write) is write() that
 * publishes the object only while the epoch is still `epoch` (else
 * ENCACHE_EUNAVAIL: not written).  Any other Store does not know them. */
enum {
  ENCACHE__CONTROL_PURGE_EPOCH = 65536,
  ENCACHE__CONTROL_PURGE_EPOCH_BUMP,
  ENCACHE__CONTROL_WRITE_AT_EPOCH,
  /* A Store that wraps others (the tier) passes a list timeout on to
   * them: arg, the uint32_t of encache_store_set_list_timeout(). */
  ENCACHE__CONTROL_LIST_TIMEOUT,
  /* The count of objects the handle served without a check (Redis under
   * checksum=on or off: docs/stores.md, "Integrity") into the uint64_t
   * at arg: the engine's hits_unchecked.  A tier answers its remote's. */
  ENCACHE__CONTROL_UNCHECKED
};
typedef struct encache__epoch_write {
  uint64_t epoch;
  const char *key;
  const void *hdr;
  size_t hdr_len;
  const void *payload;
  size_t len;
} encache__epoch_write;

/* Query-string helpers for URL parsing: iterates "k=v&k=v". */
typedef struct encache__query {
  const char *p;
} encache__query;
/* Next pair into key/val buffers; returns 1 with a pair, 0 at the end,
 * ENCACHE_EURL for a malformed pair or one too long. */
int encache__query_next(encache__query *q, char *key, size_t ksize, char *val,
                        size_t vsize);

/* url.c: where the credentials of url lie: [*start, *end) is
 * "user:password" (or ":password", or "user"), *end the offset of the '@'
 * after them.  Returns 1, or 0 when url has none.  The rule that
 * encache_store_url_redact() applies, so the password the Redis URL
 * parser reads is the text the redacted form hides. */
int encache__url_userinfo(const char *url, size_t *start, size_t *end);

#endif
