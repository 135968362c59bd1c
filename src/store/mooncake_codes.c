/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_codes.c: Mooncake's result codes, classified per operation by
 * one table (mooncake.c's answers go through it; docs/compatibility.md).
 */
#include "internal.h"
#include "mooncake_codes.h"
#include "mooncake_testing.h"

/*
 * The one table of Mooncake answers (docs/compatibility.md), taken from
 * vLLM's embedding Store client (mooncake_store_embedding/store_client.py
 * and backend.py): per operation, what each code means to an encoder.
 *
 *   exists: vLLM counts an object present only on the answer 1; every
 *           other answer is "not present, encode instead".  No memory is
 *           lent to the Store, so nothing is ever unconfirmed here.
 *   read:   vLLM's _SAFE_GET_REJECTIONS are safe (encode instead); any
 *           other negative answer leaves the read unconfirmed (poison).
 *   write:  vLLM's _SAFE_PUT_REJECTIONS are safe (skip the write); any
 *           other negative answer leaves the write unconfirmed (poison).
 *
 * Codes not in the table take the last row (unknown).  The names are those
 * of Mooncake's ErrorCode enum (types.h, v0.3.12 / v0.3.12.post1).
 */
enum {
  K_ABSENT = 1, /* not found: MISS */
  K_EXISTS,     /* already there: nothing written */
  K_SAFE,       /* certainly not done / done: recoverable */
  K_UNSAFE      /* completion unconfirmed: poison */
};

static const struct mc_code {
  int code;
  const char *name;
  unsigned char op[ENCACHE__MC_OPS]; /* exists, read, write */
} mc_codes[] = {
    {-200, "NO_AVAILABLE_HANDLE", {K_SAFE, K_SAFE, K_SAFE}},
    {-400, "INVALID_KEY", {K_SAFE, K_UNSAFE, K_UNSAFE}},
    {-600, "INVALID_PARAMS", {K_SAFE, K_SAFE, K_UNSAFE}},
    {-702, "INVALID_REPLICA", {K_SAFE, K_SAFE, K_UNSAFE}},
    {-703, "REPLICA_IS_NOT_READY", {K_SAFE, K_SAFE, K_SAFE}},
    {-704, "OBJECT_NOT_FOUND", {K_ABSENT, K_ABSENT, K_SAFE}},
    {-705, "OBJECT_ALREADY_EXISTS", {K_SAFE, K_SAFE, K_EXISTS}},
    {-706, "OBJECT_HAS_LEASE", {K_SAFE, K_UNSAFE, K_UNSAFE}},
    {-707, "LEASE_EXPIRED", {K_SAFE, K_SAFE, K_UNSAFE}},
    {-800, "TRANSFER_FAIL", {K_SAFE, K_UNSAFE, K_UNSAFE}},
    {-900, "RPC_FAIL", {K_SAFE, K_SAFE, K_SAFE}},
    {-901, "RPC_TIMEOUT", {K_SAFE, K_SAFE, K_SAFE}},
    {-1700, "TENANT_QUOTA_EXCEEDED", {K_SAFE, K_UNSAFE, K_SAFE}},
    {0, "unknown", {K_SAFE, K_UNSAFE, K_UNSAFE}}, /* every other code */
};

#define MC_NCODES (sizeof(mc_codes) / sizeof(mc_codes[0]))

static const struct mc_code *mc_row(int64_t code) {
  for (size_t i = 0; i + 1 < MC_NCODES; i++)
    if (mc_codes[i].code == code)
      return &mc_codes[i];
  return &mc_codes[MC_NCODES - 1];
}

const char *encache__mooncake_code_name(int64_t code) {
  return code >= 0 ? "OK" : mc_row(code)->name;
}

int encache__mooncake_classify_op(int op, int64_t code) {
  if (op < 0 || op >= ENCACHE__MC_OPS)
    return ENCACHE_EINVAL;
  if (code >= 0)
    return 0;
  switch (mc_row(code)->op[op]) {
  case K_ABSENT:
    return ENCACHE_ENOENT;
  case K_EXISTS:
    return ENCACHE_EEXIST;
  case K_SAFE:
    return ENCACHE_EUNAVAIL;
  default:
    return ENCACHE_EUNCONFIRMED;
  }
}

int encache__mooncake_code_count(void) { return (int)MC_NCODES - 1; }

int64_t encache__mooncake_code_at(int i) {
  return i >= 0 && i < (int)MC_NCODES - 1 ? mc_codes[i].code : 0;
}

int encache__mooncake_code_known(int64_t code) {
  return mc_row(code)->code != 0;
}
