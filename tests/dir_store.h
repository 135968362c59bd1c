/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dir_store.h: a Store of a user's own in a directory (tests/dir_store.c),
 * made with the public backend interface only.
 */
#ifndef ENCACHE_TEST_DIR_STORE_H
#define ENCACHE_TEST_DIR_STORE_H

#include "encache.h"

/* Registers the scheme testdir:// (testdir:///absolute/directory). */
int dir_store_register(void);
/* Its backend table, for tests of encache_store_new()'s checks. */
const encache_store_backend *dir_store_backend(void);
/* Opens testdir:///absolute/directory with table b (a copy of its own,
 * changed; b must outlive the handle). */
int dir_store_open_as(const encache_store_backend *b, const char *url,
                      encache_store **out);

#endif
