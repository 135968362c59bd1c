/*
 * store.h: the interface every Store backend implements (one file per
 * backend in src/store/), and the only way the engine and the public
 * encache_store_* functions reach a Store.
 *
 * Results are classified once, here in the backend, into the codes listed
 * at encache_store in encache.h; nobody above a backend interprets a
 * backend's native codes.  A per-item ENCACHE_EINVAL means the backend
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

typedef struct encache__store_ops {
  const char *kind;
  int (*exists)(encache_store *st, const char *const *keys, size_t n,
                int *results);
  int (*read)(encache_store *st, const char *const *keys, size_t n,
              void *const *bufs, const size_t *caps, int64_t *results);
  /* Optional (NULL = not offered): read() that splits each object, its
   * first `split` bytes to heads[i] and the rest to bufs[i] (capacity
   * caps[i]); results[i] counts the whole object, and one longer than
   * split + caps[i] is ENCACHE_ETOOLARGE.  Lets the engine read payloads
   * straight into their destinations, with no staging copy. */
  int (*read_split)(encache_store *st, const char *const *keys, size_t n,
                    size_t split, void *const *heads, void *const *bufs,
                    const size_t *caps, int64_t *results);
  int (*object_size)(encache_store *st, const char *key, uint64_t *len);
  int (*write)(encache_store *st, const char *key, const void *hdr,
               size_t hdr_len, const void *payload, size_t len);
  int (*remove)(encache_store *st, const char *key);
  /* Optional (NULL = not needed): make [buf, buf+len) usable as a read
   * destination / write source; undo it. */
  int (*register_buffer)(encache_store *st, void *buf, size_t len);
  int (*unregister_buffer)(encache_store *st, void *buf);
  /* Optional (NULL = ENCACHE_EINVAL). */
  int (*list)(encache_store *st, const char *pattern,
              int (*cb)(const char *key, uint64_t len, void *arg), void *arg);
  int (*stats)(encache_store *st, encache_store_stats *stats);
  void (*close)(encache_store *st);
} encache__store_ops;

/* The common head of every backend's handle. */
struct encache_store {
  const encache__store_ops *ops;
  char *url;
};

/* Records the calling thread's Store error message and returns rc. */
int encache__store_fail(encache_store *st, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

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
/* Opens a shared-memory Store from an already open file descriptor (the
 * fuzzer and tests use this with a plain file).  The fd is duplicated. */
int encache__shm_open_fd(int fd, const char *label, uint64_t create_size,
                         encache_store **out);

/* Test hooks of the shm backend (see shm.c). */
extern void (*encache__shm_read_hook)(void);
extern void (*encache__shm_write_hook)(void);
/* Takes the segment lock and returns holding it (to test a holder's death). */
int encache__shm_test_lock(encache_store *st);
/* Where the shared structures of an shm handle's segment lie, as offsets
 * into the segment file, for the tests and the campaign that damage them. */
typedef struct encache__shm_layout {
  uint64_t total_size;
  uint64_t lock_off, lock_kind_off; /* the mutex; its kind word */
  uint64_t head_off, fifo_first_off, fifo_last_off, free_first_off;
  uint64_t entries_off, entry_size, entry_pos_off;
  uint32_t nentries, nbuckets;
  uint64_t buckets_off, data_off, data_size;
} encache__shm_layout;
int encache__shm_test_layout(encache_store *st, encache__shm_layout *out);
/* Runs the structure check and, when it fails (or always), a repair. */
int encache__shm_test_repair(encache_store *st, int always);

#endif
