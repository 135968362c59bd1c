/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm_util.h: what the shm Store tests (tests/test_shm_*.c) share
 * (tests/shm_util.c).
 */
#ifndef ENCACHE_TEST_SHM_UTIL_H
#define ENCACHE_TEST_SHM_UTIL_H

#include "runner.h"
#include "store_util.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The name of the segment of the last seg_open(). */
extern char seg_name[64];
/* Opens a fresh private segment "NAME-<pid>" of the given size (its URL in
 * url); destroyed at exit by the process that made it. */
encache_store *seg_open(const char *size, char *url, size_t ulen);
/* Opens url again (a second handle); fails the test on error. */
encache_store *reopen(const char *url);
/* key reads back whole and byte for byte as written. */
void assert_hit(encache_store *st, const char *key, size_t len);
/* Writes key's object of len bytes for version; fails the test on error. */
void put(encache_store *st, const char *key, size_t len, uint64_t version);
/* Opens url: the code, and the message in msg. */
int open_err(const char *url, char *msg, size_t size);
/* Overwrites `len` bytes at `off` of the segment file. */
void poke(const char *name, off_t off, const void *bytes, size_t len);
/* The Store's test hook for a write: tells hook_fd, then waits to be
 * killed mid-write. */
extern int hook_fd;
void stall_writer(void);

#endif
