/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_codes.h: Mooncake's result codes (mooncake_codes.c holds the
 * one table), which the Mooncake backend (mooncake.c) reads its answers
 * with.  The tests reach the table's rows through mooncake_testing.h.
 */
#ifndef ENCACHE_STORE_MOONCAKE_CODES_H
#define ENCACHE_STORE_MOONCAKE_CODES_H

#include <stdint.h>

/* The encache code a Mooncake answer means for an existence check, a read
 * or a write (0 for counts; ENCACHE_ENOENT, ENCACHE_EEXIST,
 * ENCACHE_EUNAVAIL for recoverable, ENCACHE_EUNCONFIRMED for poison;
 * ENCACHE_EINVAL for an op out of range). */
enum { ENCACHE__MC_EXISTS, ENCACHE__MC_READ, ENCACHE__MC_WRITE, ENCACHE__MC_OPS };
int encache__mooncake_classify_op(int op, int64_t code);

/* The ErrorCode name of code ("unknown" when not in the table). */
const char *encache__mooncake_code_name(int64_t code);
/* Whether code is one of the table's (not the "unknown" row). */
int encache__mooncake_code_known(int64_t code);

#endif
