/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_codes.h: Mooncake's result codes (mooncake_codes.c holds the
 * one table; its classification per operation is in internal.h, which
 * the tests reach).
 */
#ifndef ENCACHE_STORE_MOONCAKE_CODES_H
#define ENCACHE_STORE_MOONCAKE_CODES_H

#include <stdint.h>

/* The ErrorCode name of code ("unknown" when not in the table). */
const char *encache__mooncake_code_name(int64_t code);
/* Whether code is one of the table's (not the "unknown" row). */
int encache__mooncake_code_known(int64_t code);

#endif
