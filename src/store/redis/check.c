/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.c: the key-bound check of Redis objects (docs/format.md, "Redis
 * values: the object and its check").
 *
 * A value at a key is a v3 object (header + payload) followed, when it
 * carries a check, by 16 bytes: the tag "ECK1", four zero bytes, and the
 * digest (little-endian) mix64(sum(object) ^ XXH3-64(key)), where sum is
 * the shm Store's object checksum (src/store/shm/checksum.c, sum.h).  So
 * a byte changed anywhere in the value, or the value copied under
 * another key, fails the check.  The sum is the shm Store's because it
 * is computed inside the copy, each word summed as it passes through a
 * register: XXH3 over each piece after copying it cost a large share of a
 * lookup, the sum a small one (docs/performance.md, "The objects'
 * check").
 *
 * A value carries one exactly when its first 24 bytes are a v3 header
 * (magic, a known dtype) whose object is 16 bytes shorter than the value:
 * the length the header implies decides, never a flag byte that damage
 * could clear, and every other value (an object written without a check,
 * by an older encache or with checksum=off, or bytes that are no v3
 * object) is read as it is.  A reader verifies the digest as it copies
 * the bytes (in pieces of any length: a GET, or the windows of a large
 * object) and returns the v3 object alone; a value whose check fails is
 * a miss.
 *
 * Writers compute the sum before they send (they send from the caller's
 * buffers, with no copy to compute it in); only well-formed v3 objects
 * get one, so other bytes written through the Store read back as they
 * were written.
 */
#include "redis.h"

#include <xxhash.h>

static const unsigned char check_tag[8] = {'E', 'C', 'K', '1', 0, 0, 0, 0};

uint64_t encache__redis_check_seed(const char *key) {
  return XXH3_64bits(key, strlen(key));
}

uint64_t encache__redis_check_objlen(const unsigned char *head, size_t n,
                                     uint64_t vlen) {
  encache_header h;
  uint64_t nbytes;
  if (n < ENCACHE_HEADER_SIZE || vlen < ENCACHE_HEADER_SIZE + CHECK_BYTES ||
      encache_header_decode(head, n, &h) != 0 || h.magic != ENCACHE_MAGIC ||
      encache_payload_size((int)h.dtype, h.rows, h.cols, &nbytes) != 0 ||
      nbytes != vlen - ENCACHE_HEADER_SIZE - CHECK_BYTES)
    return vlen;
  return vlen - CHECK_BYTES;
}

void encache__redis_check_seal(unsigned char out[CHECK_BYTES],
                               uint64_t digest) {
  memcpy(out, check_tag, sizeof(check_tag));
  for (int i = 0; i < 8; i++)
    out[8 + i] = (unsigned char)(digest >> (8 * i));
}

int encache__redis_check_holds(const unsigned char t[CHECK_BYTES],
                               uint64_t digest) {
  unsigned char want[CHECK_BYTES];
  encache__redis_check_seal(want, digest);
  return memcmp(t, want, CHECK_BYTES) == 0;
}

int encache__redis_check_make(int checksum, const char *key, const void *hdr,
                              size_t hl, const void *payload, size_t len,
                              unsigned char out[CHECK_BYTES]) {
  unsigned char head[ENCACHE_HEADER_SIZE];
  uint64_t total = (uint64_t)hl + len;
  if (checksum == CHECKSUM_OFF || total < ENCACHE_HEADER_SIZE)
    return 0;
  size_t h = hl < sizeof(head) ? hl : sizeof(head);
  if (h > 0) /* hdr may be NULL when hl is 0 */
    memcpy(head, hdr, h);
  if (h < sizeof(head)) /* payload may be NULL otherwise */
    memcpy(head + h, payload, sizeof(head) - h);
  if (encache__redis_check_objlen(head, sizeof(head), total + CHECK_BYTES) ==
      total + CHECK_BYTES)
    return 0; /* not a v3 object: written as given */
  sum_state st = {0};
  encache__shm_sum_update(&st, hdr, hl);
  encache__shm_sum_update(&st, payload, len);
  encache__redis_check_seal(
      out, encache__redis_check_digest(&st, encache__redis_check_seed(key)));
  return 1;
}

uint64_t encache__redis_check_digest(sum_state *st, uint64_t seed) {
  return mix64(encache__shm_sum_final(st) ^ seed);
}

int64_t encache__redis_check_value(const unsigned char *v, size_t len,
                                   size_t split, void *head, void *buf,
                                   size_t cap, uint64_t seed, int *check) {
  uint64_t obj = encache__redis_check_objlen(v, len, len);
  *check = CHECK_NONE;
  if (obj > split && obj - split > cap)
    return ENCACHE_ETOOLARGE;
  sum_state st = {0};
  size_t h = obj < split ? (size_t)obj : split;
  encache__shm_copy_sum(head, v, h, obj != len ? &st : NULL);
  encache__shm_copy_sum(buf, v + h, (size_t)obj - h, obj != len ? &st : NULL);
  if (obj != len)
    *check = encache__redis_check_holds(
                 v + obj, encache__redis_check_digest(&st, seed))
                 ? CHECK_OK
                 : CHECK_BAD;
  return (int64_t)obj;
}
