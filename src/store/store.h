/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store.h: the interface every Store backend implements (one file per
 * backend in src/store/), and the only way the engine and the public
 * encache_store_* functions reach a Store.
 *
 * Results are classified once, here in the backend, into the codes listed
 * at encache_store in encache.h; nobody above a backend interprets a
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
#ifndef ENCACHE_STORE_H
#define ENCACHE_STORE_H

#include "internal.h"

#include <stdarg.h>

/* The built-in backends fill the public encache_store_backend
 * (include/encache.h) as a user's backend does. */
typedef encache_store_backend encache__store_ops;

/* The common head of every handle: a built-in backend's handle starts
 * with it; a user's backend gets a bare one from encache_store_new(). */
struct encache_store {
  const encache_store_backend *ops;
  char *url;  /* as shown: never holds a password */
  void *data; /* encache_store_new()'s data */
  /* Optional, internal (NULL: none), for a backend whose write asks
   * existence first (Mooncake): write() with that answer already known
   * (`present`: this Store's exists() answer for the key, asked by the
   * publisher for several queued jobs at once), so that it does not ask
   * again.  The publisher asks ahead only when it is set. */
  int (*write_known)(encache_store *st, const char *key, int present,
                     const void *hdr, size_t hl, const void *payload,
                     size_t len);
};

/* The most writes a publisher keeps in flight (store_writes_in_flight):
 * a backend that serves writes at once has room for this many. */
#define ENCACHE__WRITES_MAX 8

/* The size of a backend table of API 1.0, which ends with close: the
 * smallest accepted.  A later operation is read only from a table whose
 * size covers it. */
#define ENCACHE__BACKEND_SIZE_1_0 offsetof(encache_store_backend, remove_prefix)
#define ENCACHE__BACKEND_HAS(b, field)                                         \
  ((b)->size >= offsetof(encache_store_backend, field) + sizeof((b)->field) && \
   (b)->field != NULL)

/* Records the calling thread's Store error message and returns rc. */
#define encache__store_fail encache_store_fail

/* The one check of a backend table, for encache_store_new() and for the
 * built-in backends (asserted at open): 0, or ENCACHE_EINVAL with the
 * calling thread's message naming what is wrong. */
int encache__backend_check(const encache_store_backend *b);

/* prefix.c: every key that starts with prefix, as a shell pattern (for
 * fnmatch(3) and Redis's MATCH: "*?[]\\" escaped, "*" appended) and as an
 * ECMAScript regex ("^" and every syntax character escaped: Mooncake's
 * remove by regex).  Fresh allocations; NULL when out of memory. */
char *encache__prefix_glob(const char *prefix);
char *encache__prefix_regex(const char *prefix);

/* Query-string helpers for URL parsing: iterates "k=v&k=v". */
typedef struct encache__query {
  const char *p;
} encache__query;
/* Next pair into key/val buffers; returns 1 with a pair, 0 at the end,
 * ENCACHE_EURL for a malformed pair or one too long. */
int encache__query_next(encache__query *q, char *key, size_t ksize, char *val,
                        size_t vsize);

/* Backends.  Each opens from its URL and, on failure, may still return a
 * handle in *out whose errmsg says why (the caller closes it). */
int encache__shm_open(const char *url, encache_store **out);
/* redis://, redis-cluster:// and unix:// URLs. */
int encache__redis_open(const char *url, encache_store **out);
/* mooncake: and mooncake:PATH URLs. */
int encache__mooncake_open(const char *url, encache_store **out);
/* Mooncake's result codes: encache's classification (0 for counts), and
 * the ErrorCode name ("unknown" when not in the table). */
int encache__mooncake_classify(int64_t code);
const char *encache__mooncake_code_name(int64_t code);
/* Whether code is one of the table's (not the "unknown" row). */
int encache__mooncake_code_known(int64_t code);
/* Opens a shared-memory Store from an already open file descriptor (the
 * fuzzer and tests use this with a plain file).  The fd is duplicated. */
int encache__shm_open_fd(int fd, const char *label, uint64_t create_size,
                         encache_store **out);

/* The shm Store's purge epoch (src/store/shm/ops.c, the tier's side of
 * removals: tier.c): a count of the removals made through a tier on the
 * segment, kept in it.  purge_epoch reads it; purge_epoch_bump adds one
 * and gives the new value; write_at_epoch is write() that publishes the
 * object only while the epoch is still `epoch` (else ENCACHE_EUNAVAIL:
 * not written).  ENCACHE_EINVAL on a Store that is not shm. */
int encache__shm_purge_epoch(encache_store *st, uint64_t *epoch);
int encache__shm_purge_epoch_bump(encache_store *st, uint64_t *epoch);
int encache__shm_write_at_epoch(encache_store *st, uint64_t epoch,
                                const char *key, const void *hdr,
                                size_t hdr_len, const void *payload,
                                size_t len);

/* Test hooks of the shm backend (src/store/shm/). */
extern void (*encache__shm_read_hook)(void);
extern void (*encache__shm_write_hook)(void);
/* Takes the segment lock and returns holding it (to test a holder's death,
 * or a held lock); test_unlock lets it go. */
int encache__shm_test_lock(encache_store *st);
void encache__shm_test_unlock(encache_store *st);
/* Where the shared structures of an shm handle's segment lie, as offsets
 * into the segment file, for the tests and the campaign that damage them. */
typedef struct encache__shm_layout {
  uint64_t total_size;
  uint64_t lock_off, lock_kind_off; /* the mutex; its kind word */
  uint64_t head_off, fifo_first_off, fifo_last_off, free_first_off;
  uint64_t entries_off, entry_size, entry_pos_off;
  uint32_t nentries, nbuckets;
  uint64_t buckets_off, data_off, data_size;
  uint64_t leases_off, lease_size; /* the lease table */
  uint32_t nleases;
} encache__shm_layout;
int encache__shm_test_layout(encache_store *st, encache__shm_layout *out);
/* Runs the structure check and, when it fails (or always), a repair. */
int encache__shm_test_repair(encache_store *st, int always);

#endif
