/*
 * util.c: version, error names, dtypes, the allocation wrapper.
 *
 * The allocation wrapper keeps one process-wide countdown (atomic, so
 * that the publisher thread of a later issue can allocate too); when it
 * reaches zero every allocation fails until it is disarmed.
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *encache_version(void) { return ENCACHE_VERSION_STRING; }

unsigned encache_version_number(void) { return ENCACHE_VERSION_HEX; }

const char *encache_strerror(int err) {
  switch (err) {
#define ENCACHE_STRERROR_CASE_(name, value, msg)                             \
  case ENCACHE_##name:                                                       \
    return msg;
    ENCACHE_ERRNO_MAP(ENCACHE_STRERROR_CASE_)
#undef ENCACHE_STRERROR_CASE_
  case 0:
    return "success";
  default:
    /* Any other -errno: the C library knows it.  strerror() is not
     * thread-safe in general, but glibc's returns static strings for
     * valid codes; unknown codes fall back to a fixed message. */
    if (err < 0 && err > -4096)
      return strerror(-err);
    return "unknown error";
  }
}

const char *encache_err_name(int err) {
  switch (err) {
#define ENCACHE_ERRNAME_CASE_(name, value, msg)                              \
  case ENCACHE_##name:                                                       \
    return #name;
    ENCACHE_ERRNO_MAP(ENCACHE_ERRNAME_CASE_)
#undef ENCACHE_ERRNAME_CASE_
  case 0:
    return "OK";
  default:
    return "UNKNOWN";
  }
}

/* ------------------------------------------------------------------ dtypes */

static const struct {
  int dtype;
  size_t size;
  const char *name;
  const char *torch;
} dtypes[] = {
    {ENCACHE_FLOAT32, 4, "float32", "torch.float32"},
    {ENCACHE_FLOAT16, 2, "float16", "torch.float16"},
    {ENCACHE_BFLOAT16, 2, "bfloat16", "torch.bfloat16"},
};

#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static int dtype_index(int dtype) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dtype == dtype)
      return (int)i;
  return -1;
}

size_t encache_dtype_size(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? 0 : dtypes[i].size;
}

const char *encache_dtype_name(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? NULL : dtypes[i].name;
}

const char *encache_dtype_torch_name(int dtype) {
  int i = dtype_index(dtype);
  return i < 0 ? NULL : dtypes[i].torch;
}

int encache_dtype_parse(const char *name) {
  static const struct {
    const char *alias;
    int dtype;
  } aliases[] = {{"fp32", ENCACHE_FLOAT32}, {"float", ENCACHE_FLOAT32},
                 {"fp16", ENCACHE_FLOAT16}, {"half", ENCACHE_FLOAT16},
                 {"bf16", ENCACHE_BFLOAT16}};
  if (name == NULL)
    return ENCACHE_EDTYPE;
  if (strncmp(name, "torch.", 6) == 0)
    name += 6;
  for (size_t i = 0; i < NDTYPES; i++)
    if (strcasecmp(name, dtypes[i].name) == 0)
      return dtypes[i].dtype;
  for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
    if (strcasecmp(name, aliases[i].alias) == 0)
      return aliases[i].dtype;
  return ENCACHE_EDTYPE;
}

/* -------------------------------------------------------------- allocation */

static atomic_long alloc_countdown; /* 0 = disarmed */
static atomic_long alloc_count;

static int alloc_should_fail(void) {
  atomic_fetch_add(&alloc_count, 1);
  long c = atomic_load(&alloc_countdown);
  while (c > 0) {
    if (c == 1)
      return 1; /* stays at 1: every later allocation fails too */
    if (atomic_compare_exchange_weak(&alloc_countdown, &c, c - 1))
      return 0;
  }
  return 0;
}

long encache__alloc_fail_after(long n) {
  atomic_store(&alloc_countdown, n > 0 ? n : 0);
  return atomic_exchange(&alloc_count, 0);
}

void *encache__malloc(size_t size) {
  if (alloc_should_fail())
    return NULL;
  return malloc(size ? size : 1);
}

void *encache__calloc(size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  if (alloc_should_fail())
    return NULL;
  return calloc(n ? n : 1, size ? size : 1);
}

void *encache__realloc(void *p, size_t size) {
  if (alloc_should_fail())
    return NULL;
  return realloc(p, size ? size : 1);
}

void encache__free(void *p) { free(p); }

char *encache__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = encache__malloc(n);
  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

char *encache__asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0)
    return NULL;
  char *s = encache__malloc((size_t)n + 1);
  if (s == NULL)
    return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

void encache__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "encache: assertion failed: %s (%s:%d)\n", expr, file, line);
  abort();
}
