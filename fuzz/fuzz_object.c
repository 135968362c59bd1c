/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the v3 object decoder: header decode, contract check, describe.
 * The contract comes from the first bytes so that every verdict is
 * reachable. */
#include "encache.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const int dtypes[] = {ENCACHE_FLOAT32, ENCACHE_FLOAT16,
                               ENCACHE_BFLOAT16};
  encache_contract c = {ENCACHE_FLOAT32, 2, 2};
  if (size >= 3) {
    c.dtype = dtypes[data[0] % 3];
    c.rows = data[1];
    c.cols = data[2];
    data += 3;
    size -= 3;
  }
  encache_header h;
  int v = encache_object_check(data, size, &c, &h);
  if (v < 0 || v > ENCACHE_BAD_SHAPE)
    __builtin_trap();
  char msg[160];
  int d = encache_object_describe(data, size, msg, sizeof(msg));
  if (v == ENCACHE_COMPATIBLE && d != 0)
    __builtin_trap(); /* a hit for some contract is a valid v3 object */
  if (strlen(msg) >= sizeof(msg))
    __builtin_trap();
  encache_verdict_name(v);
  return 0;
}
