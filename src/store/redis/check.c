/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.c: the key-bound check of Redis objects (docs/format.md, "Redis
 * objects: the check").
 *
 * A value at a key is a v3 object (header + payload) followed, when it
 * carries a check, by 16 bytes: the tag "ECK1", four zero bytes, and the
 * XXH3-64 digest (little-endian) of the object's bytes with the seed
 * XXH3-64(key).  So a byte changed anywhere in the value, or the value
 * copied under another key, fails the check.  A value carries one exactly
 * when its first 24 bytes are a v3 header (magic, a known dtype) whose
 * object is 16 bytes shorter than the value: the length the header
 * implies decides, never a flag byte that damage could clear, and every
 * other value (an object written without a check, by encache 1.3 or with
 * checksum=off, or bytes that are no v3 object) is read as it is.  A
 * reader verifies the digest as it copies the bytes (in pieces of any
 * length: a GET, or the windows of a large object) and returns the v3
 * object alone; a value whose check fails is a miss.
 *
 * Writers compute the digest before they send (they send from the
 * caller's buffers, with no copy to compute it in); only well-formed v3
 * objects get one, so other bytes written through the Store read back as
 * they were written.
 */
#include "redis.h"

#define CHECK_COPY_PIECE (16u << 10) /* copied, then hashed while in L1 */

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
  memcpy(head, hdr, h);
  memcpy(head + h, payload, sizeof(head) - h);
  if (encache__redis_check_objlen(head, sizeof(head), total + CHECK_BYTES) ==
      total + CHECK_BYTES)
    return 0; /* not a v3 object: written as given */
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, encache__redis_check_seed(key));
  XXH3_64bits_update(&st, hdr, hl);
  XXH3_64bits_update(&st, payload, len);
  encache__redis_check_seal(out, XXH3_64bits_digest(&st));
  return 1;
}

void encache__redis_check_copy(XXH3_state_t *st, void *dst, const void *src,
                               size_t n) {
  if (n == 0)
    return; /* src and dst may be NULL */
  if (st == NULL) {
    memcpy(dst, src, n);
    return;
  }
  unsigned char *d = dst;
  const unsigned char *p = src;
  while (n > 0) {
    size_t k = n < CHECK_COPY_PIECE ? n : CHECK_COPY_PIECE;
    memcpy(d, p, k);
    XXH3_64bits_update(st, d, k); /* what the reader returns */
    d += k, p += k, n -= k;
  }
}

int64_t encache__redis_check_value(const unsigned char *v, size_t len,
                                   size_t split, void *head, void *buf,
                                   size_t cap, uint64_t seed, int *check) {
  uint64_t obj = encache__redis_check_objlen(v, len, len);
  *check = CHECK_NONE;
  if (obj > split && obj - split > cap)
    return -1;
  XXH3_state_t st;
  if (obj != len)
    XXH3_64bits_reset_withSeed(&st, seed);
  size_t h = obj < split ? (size_t)obj : split;
  encache__redis_check_copy(obj != len ? &st : NULL, head, v, h);
  encache__redis_check_copy(obj != len ? &st : NULL, buf, v + h,
                            (size_t)obj - h);
  if (obj != len)
    *check = encache__redis_check_holds(v + obj, XXH3_64bits_digest(&st))
                 ? CHECK_OK
                 : CHECK_BAD;
  return (int64_t)obj;
}
