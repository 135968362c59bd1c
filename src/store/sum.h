/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sum.h: the object checksum of src/store/shm/checksum.c, shared by the
 * shm Store (its index holds each object's sum) and the Redis Store (the
 * check after each object: src/store/redis/check.c).  It is computed
 * inside a copy, on each word as it passes through a register, so that
 * it costs little beyond the copy; it may be fed in pieces of any length.
 */
#ifndef ENCACHE_STORE_SUM_H
#define ENCACHE_STORE_SUM_H

#include <stddef.h>
#include <stdint.h>

/* The murmur3 finalizer: a bijection of 64-bit words that mixes well. */
static inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* A streaming object checksum; zero it to start. */
typedef struct sum_state {
  uint64_t a[4], b[4], c[4];
  uint64_t len;
  unsigned char part[32];
  size_t npart;
} sum_state;

/* The checksum of what st summed; st is spent. */
uint64_t encache__shm_sum_final(sum_state *st);
/* memcpy, and (when st) the sum of the bytes copied. */
void encache__shm_copy_sum(unsigned char *dst, const unsigned char *src,
                           size_t n, sum_state *st);
/* Sums n bytes without copying them. */
void encache__shm_sum_update(sum_state *st, const unsigned char *p, size_t n);

#endif
