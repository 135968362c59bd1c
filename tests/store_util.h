/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_util.h: what the Store tests share: opening the Store under test,
 * and payloads derived from (key, version) so that any byte out of place
 * (a torn read, another object's bytes, an overflow) is detected.
 */
#ifndef ENCACHE_TEST_STORE_UTIL_H
#define ENCACHE_TEST_STORE_UTIL_H

#include "encache.h"

#include <stddef.h>
#include <stdint.h>

/* Opens the Store under test: $ENCACHE_TEST_STORE, or a fresh shm segment
 * private to this test process (of `size` bytes), destroyed at exit.
 * Fails the test on error. */
encache_store *ts_open(const char *size);
/* Names the Store under test without opening it (for tests that fork:
 * a client such as Mooncake's must not be created before fork()). */
void ts_prepare(const char *size);
/* Reopens the same Store (a second handle). */
encache_store *ts_reopen(void);
/* A key unique to this test process: "t<pid>/<name>". */
void ts_key(char *buf, size_t size, const char *name);

/* Fills buf[0..len) with the object for (key, version): the version in
 * the first 8 bytes (when len >= 8), then bytes derived from both. */
void ts_fill(const char *key, uint64_t version, unsigned char *buf, size_t len);
/* Returns 1 when buf[0..len) is exactly some version's object for key. */
int ts_verify(const char *key, const unsigned char *buf, size_t len);

/* Reads key alone into buf[0..cap): its length, or the call's (negative)
 * code or the key's own. */
int64_t ts_read_one(encache_store *st, const char *key, void *buf, size_t cap);
/* An engine allocator of malloc'd host destinations (each hit's data is
 * the caller's to free). */
encache_allocator ts_host_allocator(void);

/* Checks that st's profile (src/store/base.h) is what the engine's flag
 * tests chose before there was one: the same read path, existence check,
 * leases and writes in flight; ask_ahead: whether the handle had
 * Mooncake's write_known then. */
void ts_check_profile(encache_store *st, int ask_ahead);

#endif
