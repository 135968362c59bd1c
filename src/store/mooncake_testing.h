/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_testing.h: what the tests reach of Mooncake's result-code
 * table (mooncake_codes.c) beyond its classification (mooncake_codes.h):
 * the table's rows, to check every code's meaning per operation.  Nothing
 * of the library calls these.
 */
#ifndef ENCACHE_STORE_MOONCAKE_TESTING_H
#define ENCACHE_STORE_MOONCAKE_TESTING_H

#include <stdint.h>

/* The table's rows: encache__mooncake_code_at(i) for
 * 0 <= i < encache__mooncake_code_count() (0 out of range). */
int encache__mooncake_code_count(void);
int64_t encache__mooncake_code_at(int i);

#endif
