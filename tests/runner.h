/* SPDX-License-Identifier: Apache-2.0 */
/*
 * runner.h: a small test runner in the manner of libuv's: a declared list
 * of tests (tests/list.h), each run in its own forked process so that a
 * crash or an abort fails that test only; assertions print both sides.
 */
#ifndef ENCACHE_TEST_RUNNER_H
#define ENCACHE_TEST_RUNNER_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST(name) void test_##name(void)

void test__fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

#define ASSERT(cond)                                                         \
  do {                                                                       \
    if (!(cond))                                                             \
      test__fail(__FILE__, __LINE__, "assertion failed: %s", #cond);         \
  } while (0)

#define ASSERT_EQ_INT(a, b)                                                  \
  do {                                                                       \
    long long a_ = (long long)(a), b_ = (long long)(b);                      \
    if (a_ != b_)                                                            \
      test__fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_,   \
                 b_);                                                        \
  } while (0)

#define ASSERT_EQ_U64(a, b)                                                  \
  do {                                                                       \
    uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                         \
    if (a_ != b_)                                                            \
      test__fail(__FILE__, __LINE__, "%s == %s: %" PRIu64 " != %" PRIu64,    \
                 #a, #b, a_, b_);                                            \
  } while (0)

#define ASSERT_EQ_STR(a, b)                                                  \
  do {                                                                       \
    const char *a_ = (a), *b_ = (b);                                         \
    if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                     \
      test__fail(__FILE__, __LINE__, "%s == %s:\n  \"%s\"\n  \"%s\"", #a,    \
                 #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                \
  } while (0)

#define ASSERT_CONTAINS(hay, needle)                                         \
  do {                                                                       \
    const char *h_ = (hay), *n_ = (needle);                                  \
    if (h_ == NULL || strstr(h_, n_) == NULL)                                \
      test__fail(__FILE__, __LINE__, "%s contains \"%s\": got \"%s\"", #hay, \
                 n_, h_ ? h_ : "(null)");                                    \
  } while (0)

#define ASSERT_EQ_MEM(a, b, n)                                               \
  do {                                                                       \
    size_t n_ = (n);                                                         \
    if (memcmp((a), (b), n_) != 0)                                           \
      test__fail(__FILE__, __LINE__, "%s == %s over %zu bytes: differ at "   \
                 "byte %zu", #a, #b, n_, test__first_diff((a), (b), n_));    \
  } while (0)

size_t test__first_diff(const void *a, const void *b, size_t n);

/* Installs, through the public encache_set_allocators(), an allocator
 * under which the n-th allocation from now (1-based) and every one after
 * it fails; 0 restores the C library's.  Returns the number of
 * allocations made since the last call. */
long test_alloc_fail_after(long n);

#endif
