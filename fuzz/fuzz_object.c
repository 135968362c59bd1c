/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the v3 object decoder: header decode, contract check, describe.
 * The contract comes from the first bytes so that every verdict is
 * reachable.  Then the Redis Store's reader of values with a check
 * (src/store/redis/check.c): the input as a value read into a
 * destination split and sized by those bytes must stay in bounds; and,
 * sealed with its check, read back as checked, and never again once one
 * of its bytes is changed. */
#include "encache.h"
#include "redis/redis.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a Redis value read whole for a destination of split +
 * cap bytes. */
static void read_value(const uint8_t *v, size_t len, size_t split, size_t cap,
                       uint64_t seed) {
  unsigned char *head = malloc(split + 1), *buf = malloc(cap + 1);
  int check;
  int64_t r =
      encache__redis_check_value(v, len, split, head, buf, cap, seed, &check);
  if (r > (int64_t)(split + cap) || (r >= 0 && r != (int64_t)len &&
                                     r != (int64_t)len - CHECK_BYTES))
    __builtin_trap();
  if (check != CHECK_NONE && r >= 0 && r != (int64_t)len - CHECK_BYTES)
    __builtin_trap();
  free(head);
  free(buf);
}

/* The input as an object sealed under key "k": read back checked; with
 * one byte changed (at where), never checked and holding. */
static void seal_and_damage(const uint8_t *obj, size_t len, size_t where) {
  unsigned char ck[CHECK_BYTES];
  if (len < ENCACHE_HEADER_SIZE ||
      !encache__redis_check_make(CHECKSUM_ON, "k", obj, ENCACHE_HEADER_SIZE,
                                 obj + ENCACHE_HEADER_SIZE,
                                 len - ENCACHE_HEADER_SIZE, ck))
    return;
  unsigned char *v = malloc(len + CHECK_BYTES), *out = malloc(len);
  memcpy(v, obj, len);
  memcpy(v + len, ck, CHECK_BYTES);
  uint64_t seed = encache__redis_check_seed("k");
  int check;
  if (encache__redis_check_value(v, len + CHECK_BYTES, 0, out, out, len, seed,
                                 &check) != (int64_t)len ||
      check != CHECK_OK || memcmp(out, obj, len) != 0)
    __builtin_trap();
  if (encache__redis_check_seed("k2") != seed &&
      (encache__redis_check_value(v, len + CHECK_BYTES, 0, out, out, len,
                                  encache__redis_check_seed("k2"), &check),
       check == CHECK_OK))
    __builtin_trap(); /* another key's copy */
  v[where % (len + CHECK_BYTES)] ^= 0x5a;
  encache__redis_check_value(v, len + CHECK_BYTES, 0, out, out, len, seed,
                             &check);
  if (check == CHECK_OK)
    __builtin_trap();
  free(v);
  free(out);
}

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
  /* The Redis reader, split and cap from the contract bytes. */
  read_value(data, size, c.rows % 32, (size_t)c.cols * 8, c.rows * 31 + c.cols);
  seal_and_damage(data, size, (size_t)c.rows * 256 + c.cols);
  return 0;
}
