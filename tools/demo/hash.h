/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash.h: the demo's one hash function, for its seeded generators and its
 * content identifiers.  The library has its own copy inside (the demo
 * uses only the public header).
 */
#ifndef ENCACHE_DEMO_HASH_H
#define ENCACHE_DEMO_HASH_H

#include <stddef.h>
#include <stdint.h>

/* SplitMix64's finalizer: a bijective mix of 64 bits. */
static inline uint64_t demo_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A 64-bit hash of n bytes, seeded: FNV-1a, then mixed. */
static inline uint64_t demo_hash(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull ^ demo_mix64(seed);
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return demo_mix64(h);
}

#endif
