/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checksum.c: the shm Store's object checksums.
 *
 * The sum: 4 lanes of 64-bit words over 32-byte blocks; per lane a += w
 * and b += a (Fletcher: position-sensitive) and c += lo32(w ^ k) *
 * hi32(w ^ k) (the XXH3 accumulator: not linear, so that changes which
 * cancel in the sums, such as bit 63 flipped in two words of one lane,
 * still change c), all modulo 2^64, finished by a mix of the lanes and the
 * length.  It is computed inside the copy, on the words as they pass
 * through registers (each loaded once, then stored and summed), so it
 * costs little beyond the copy itself (docs/stores.md has the figures) and
 * it is end to end: it is the sum of what the writer was given and of what
 * the reader returns, so whatever changes the bytes in the segment during
 * or after either copy (a stray write, a writer whose record was reclaimed
 * under it) makes the reader's sum differ.  It guards against damage, not
 * against an adversary.  Streaming: an object may be copied in pieces of
 * any length.  The Redis Store's check uses it too (sum.h).
 */
#include "shm.h"

#include <string.h>

#define SUM_K0 0x9e3779b97f4a7c15ull
#define SUM_K1 0xc2b2ae3d27d4eb4full
#define SUM_K2 0x165667b19e3779f9ull
#define SUM_K3 0xd6e8feb86659fd93ull

/* sum_blocks(st, dst, p, n): copies n 32-byte blocks from p to dst (dst
 * NULL: sums only) and sums them.  Each word is loaded once: the empty asm
 * pins the loaded value in a register, so the compiler cannot load it a
 * second time for the sum (the source may be shared memory that a damaged
 * peer changes in between). */
#if defined(__x86_64__)
#include <immintrin.h>

static void sum_blocks_sse2(sum_state *st, unsigned char *dst,
                            const unsigned char *p, size_t nblocks) {
  const __m128i k01 = _mm_set_epi64x((long long)SUM_K1, (long long)SUM_K0);
  const __m128i k23 = _mm_set_epi64x((long long)SUM_K3, (long long)SUM_K2);
  __m128i a01 = _mm_loadu_si128((const __m128i *)st->a);
  __m128i a23 = _mm_loadu_si128((const __m128i *)(st->a + 2));
  __m128i b01 = _mm_loadu_si128((const __m128i *)st->b);
  __m128i b23 = _mm_loadu_si128((const __m128i *)(st->b + 2));
  __m128i c01 = _mm_loadu_si128((const __m128i *)st->c);
  __m128i c23 = _mm_loadu_si128((const __m128i *)(st->c + 2));
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i y = _mm_loadu_si128((const __m128i *)(p + 16));
    __asm__ volatile("" : "+x"(x), "+x"(y));
    if (dst != NULL) {
      _mm_storeu_si128((__m128i *)dst, x);
      _mm_storeu_si128((__m128i *)(dst + 16), y);
      dst += 32;
    }
    a01 = _mm_add_epi64(a01, x);
    a23 = _mm_add_epi64(a23, y);
    b01 = _mm_add_epi64(b01, a01);
    b23 = _mm_add_epi64(b23, a23);
    x = _mm_xor_si128(x, k01);
    y = _mm_xor_si128(y, k23);
    c01 = _mm_add_epi64(c01, _mm_mul_epu32(x, _mm_srli_epi64(x, 32)));
    c23 = _mm_add_epi64(c23, _mm_mul_epu32(y, _mm_srli_epi64(y, 32)));
  }
  _mm_storeu_si128((__m128i *)st->a, a01);
  _mm_storeu_si128((__m128i *)(st->a + 2), a23);
  _mm_storeu_si128((__m128i *)st->b, b01);
  _mm_storeu_si128((__m128i *)(st->b + 2), b23);
  _mm_storeu_si128((__m128i *)st->c, c01);
  _mm_storeu_si128((__m128i *)(st->c + 2), c23);
}

/* The same, four lanes per 32-byte vector, where the CPU has AVX2. */
__attribute__((target("avx2"))) static void
sum_blocks_avx2(sum_state *st, unsigned char *dst, const unsigned char *p,
                size_t nblocks) {
  const __m256i k = _mm256_set_epi64x((long long)SUM_K3, (long long)SUM_K2,
                                      (long long)SUM_K1, (long long)SUM_K0);
  __m256i a = _mm256_loadu_si256((const __m256i *)st->a);
  __m256i b = _mm256_loadu_si256((const __m256i *)st->b);
  __m256i c = _mm256_loadu_si256((const __m256i *)st->c);
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p);
    __asm__ volatile("" : "+x"(x));
    if (dst != NULL) {
      _mm256_storeu_si256((__m256i *)dst, x);
      dst += 32;
    }
    a = _mm256_add_epi64(a, x);
    b = _mm256_add_epi64(b, a);
    x = _mm256_xor_si256(x, k);
    c = _mm256_add_epi64(c, _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32)));
  }
  _mm256_storeu_si256((__m256i *)st->a, a);
  _mm256_storeu_si256((__m256i *)st->b, b);
  _mm256_storeu_si256((__m256i *)st->c, c);
}

static void sum_blocks(sum_state *st, unsigned char *dst,
                       const unsigned char *p, size_t nblocks) {
  if (__builtin_cpu_supports("avx2"))
    sum_blocks_avx2(st, dst, p, nblocks);
  else
    sum_blocks_sse2(st, dst, p, nblocks);
}
#else
static void sum_blocks(sum_state *st, unsigned char *dst,
                       const unsigned char *p, size_t nblocks) {
  static const uint64_t k[4] = {SUM_K0, SUM_K1, SUM_K2, SUM_K3};
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    for (int l = 0; l < 4; l++) {
      unsigned char t[8];
      for (int j = 0; j < 8; j++) /* one load of each byte */
        t[j] = ((const volatile unsigned char *)p)[8 * l + j];
      if (dst != NULL)
        memcpy(dst + 8 * l, t, 8);
      uint64_t w = encache__get_le64(t);
      st->a[l] += w;
      st->b[l] += st->a[l];
      w ^= k[l];
      st->c[l] += (w & 0xffffffffu) * (w >> 32);
    }
    if (dst != NULL)
      dst += 32;
  }
}
#endif

/* Sums n bytes (already copied, or private) in pieces of any length. */
void encache__shm_sum_update(sum_state *st, const unsigned char *p, size_t n) {
  if (n == 0)
    return; /* p may be NULL */
  st->len += n;
  if (st->npart > 0) {
    size_t take = 32 - st->npart < n ? 32 - st->npart : n;
    memcpy(st->part + st->npart, p, take);
    st->npart += take;
    p += take;
    n -= take;
    if (st->npart < 32)
      return;
    sum_blocks(st, NULL, st->part, 1);
    st->npart = 0;
  }
  sum_blocks(st, NULL, p, n / 32);
  st->npart = n % 32;
  memcpy(st->part, p + n - st->npart, st->npart);
}

/* The checksum of all that was summed; st is spent. */
uint64_t encache__shm_sum_final(sum_state *st) {
  if (st->npart > 0) {
    memset(st->part + st->npart, 0, 32 - st->npart);
    sum_blocks(st, NULL, st->part, 1);
    st->npart = 0;
  }
  uint64_t h = mix64(st->len ^ 0x5bd1e9955bd1e995ull);
  for (int i = 0; i < 4; i++)
    h = mix64(mix64(mix64(h ^ st->a[i]) ^ st->b[i]) ^ st->c[i]);
  return h;
}

/* Copies a few bytes through a private buffer and sums that buffer: the
 * sum is of exactly the bytes written. */
static void copy_sum_small(unsigned char *dst, const unsigned char *src,
                           size_t n, sum_state *st) {
  unsigned char tmp[32];
  for (size_t i = 0; i < n; i++) /* one load each, as above */
    tmp[i] = ((const volatile unsigned char *)src)[i];
  memcpy(dst, tmp, n);
  encache__shm_sum_update(st, tmp, n);
}

/* memcpy, and (when st) the sum of the bytes copied.  Pieces of one
 * object may be copied in any lengths, in order. */
void encache__shm_copy_sum(unsigned char *dst, const unsigned char *src,
                           size_t n, sum_state *st) {
  if (n == 0)
    return; /* src may be NULL */
  if (st == NULL) {
    memcpy(dst, src, n);
    return;
  }
  if (st->npart > 0) { /* complete the pending block first */
    size_t take = 32 - st->npart < n ? 32 - st->npart : n;
    copy_sum_small(dst, src, take, st);
    dst += take, src += take, n -= take;
  }
  size_t nb = n / 32;
  sum_blocks(st, dst, src, nb);
  st->len += nb * 32;
  if (n % 32 > 0)
    copy_sum_small(dst + nb * 32, src + nb * 32, n % 32, st);
}

