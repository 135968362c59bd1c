/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prefix.h: a key prefix as the backends' matchers take it (prefix.c,
 * which also counts and removes by prefix through the door).
 */
#ifndef ENCACHE_STORE_PREFIX_H
#define ENCACHE_STORE_PREFIX_H

/* Every key that starts with prefix, as a shell pattern (for fnmatch(3)
 * and Redis's MATCH: "*?[]\\" escaped, "*" appended) and as an ECMAScript
 * regex ("^" and every syntax character escaped: Mooncake's remove by
 * regex).  Fresh allocations; NULL when out of memory. */
char *encache__prefix_glob(const char *prefix);
char *encache__prefix_regex(const char *prefix);

#endif
