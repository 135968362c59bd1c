/* SPDX-License-Identifier: Apache-2.0 */
/*
 * testing.h: what the tests, the fuzzer and the damage campaign reach in
 * the shm Store (src/store/shm/) beyond the door: opening over a plain
 * file, hooks inside reads and writes, the segment lock, the layout of
 * the shared structures, and the repair.  Nothing of the library calls
 * these.
 */
#ifndef ENCACHE_STORE_SHM_TESTING_H
#define ENCACHE_STORE_SHM_TESTING_H

#include "../base.h"

/* Opens a shared-memory Store from an already open file descriptor (the
 * fuzzer and tests use this with a plain file).  The fd is duplicated. */
int encache__shm_open_fd(int fd, const char *label, uint64_t create_size,
                         encache_store **out);

/* Called inside each read (after the index lookup, outside the lock) and
 * each write (after the reservation, before the copy). */
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
