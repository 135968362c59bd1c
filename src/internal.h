/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h: what the parts of libencache share and nobody else sees.
 *
 * Allocation goes through encache__malloc() and friends, which check size
 * overflow and call the process's allocator (encache_set_allocators();
 * the tests install one that fails the N-th call, to walk every allocation
 * failure path, as libuv's loop_init_oom does).
 *
 * Two assert levels, as in Redis: ENCACHE_ASSERT is always on and guards
 * invariants whose breach would corrupt data; ENCACHE_DEBUG_ASSERT is for
 * expensive checks and compiled only in debug builds.
 */
#ifndef ENCACHE_INTERNAL_H
#define ENCACHE_INTERNAL_H

#include "encache.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

void encache__assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));

#define ENCACHE_ASSERT(e)                                                    \
  ((e) ? (void)0 : encache__assert_fail(#e, __FILE__, __LINE__))
#ifndef NDEBUG
#define ENCACHE_DEBUG_ASSERT(e) ENCACHE_ASSERT(e)
#else
#define ENCACHE_DEBUG_ASSERT(e) ((void)0)
#endif

void *encache__malloc(size_t size);
void *encache__calloc(size_t n, size_t size);
void *encache__realloc(void *p, size_t size);
void encache__free(void *p);
char *encache__strdup(const char *s);
/* printf into a fresh allocation; NULL on failure. */
char *encache__asprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* The time on clock `clock` ms milliseconds from now (a timed wait's
 * deadline). */
struct timespec encache__deadline(clockid_t clock, unsigned ms);

/* Aligned blocks (the staging buffer, Mooncake's registered buffers);
 * freed only with encache__aligned_free(). */
void *encache__aligned_alloc(size_t alignment, size_t size);
void encache__aligned_free(void *p);

/*
 * Caller-allocated structs start with `size_t size`, the sizeof() the
 * caller was compiled with.  struct_in copies a caller's struct into the
 * library's full one (fields the caller does not know are zero);
 * struct_out copies the library's answer out, as much as the caller's
 * struct holds.  Both refuse (ENCACHE_EINVAL) a size below min_size (the
 * size at API 1.0), and struct_in refuses a newer caller's struct whose
 * fields unknown here are not all zero.  ENCACHE__AT(base, i) is element
 * i of a caller's array: its stride is the first element's size.
 */
int encache__struct_in(void *full, size_t full_size, const void *in,
                       size_t min_size);
/* struct_in's checks without the copy: 0 or ENCACHE_EINVAL. */
int encache__struct_check(const void *in, size_t full_size, size_t min_size);
/* No public struct will ever be this large: a size above it is a caller
 * that did not set it (stack garbage), refused rather than trusted. */
#define ENCACHE__STRUCT_MAX 4096
/* Whether a caller's struct size is one to trust: at least the 1.0 size,
 * at most ENCACHE__STRUCT_MAX. */
static inline int encache__struct_size_ok(size_t size, size_t min_size) {
  return size >= min_size && size <= ENCACHE__STRUCT_MAX;
}
int encache__struct_out(void *out, const void *full, size_t full_size,
                        size_t min_size);
#define ENCACHE__AT(type, base, i)                                           \
  ((type *)(void *)((char *)(base) + (i) * (base)->size))

/* The minimum accepted size of an encache_tensor: its size at API 1.0
 * (the device fields were added in 1.3). */
#define ENCACHE__TENSOR_MIN offsetof(encache_tensor, device)

/* Records the message of a failed call that has no handle
 * (encache_open(), encache_model_identity()) for the calling thread's
 * encache_errmsg(NULL); returns rc. */
int encache__thread_failed(int rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* FNV-1a (64 bits) of p[0..len): the one string hash of the library (the
 * shm index finalizes it; the engine's steps use it as is).  The shm
 * index's buckets depend on it: never change it. */
static inline uint64_t encache__fnv1a(const void *p, size_t len) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* Little-endian loads and stores, correct on any host. */
static inline void encache__put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}
static inline void encache__put_le64(unsigned char *p, uint64_t v) {
  encache__put_le32(p, (uint32_t)v);
  encache__put_le32(p + 4, (uint32_t)(v >> 32));
}
static inline uint32_t encache__get_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static inline uint64_t encache__get_le64(const unsigned char *p) {
  return (uint64_t)encache__get_le32(p) |
         (uint64_t)encache__get_le32(p + 4) << 32;
}

#endif
