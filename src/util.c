/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.c: version, error names, dtypes, the allocation wrapper.
 *
 * The allocation wrapper keeps one process-wide countdown (atomic, so
 * that the handles' threads can allocate too); when it reaches zero
 * every allocation fails until it is disarmed.
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

/* The process's allocator (encache_set_allocators); NULL members are the
 * C library's.  Read without a lock: set it before any handle exists. */
static encache_allocfuncs allocfuncs;

int encache_set_allocators(const encache_allocfuncs *fns,
                           encache_allocfuncs *old) {
  encache_allocfuncs f = {0};
  if (fns != NULL) {
    int rc = encache__struct_in(&f, sizeof(f), fns, sizeof(f));
    if (rc < 0)
      return rc;
    /* All four of malloc, calloc, realloc, free, or none: memory from one
     * allocator must never reach another's free. */
    int given = (f.malloc_fn != NULL) + (f.calloc_fn != NULL) +
                (f.realloc_fn != NULL) + (f.free_fn != NULL);
    if (given != 0 && given != 4)
      return ENCACHE_EINVAL;
  }
  if (old != NULL) {
    int rc = encache__struct_out(old, &allocfuncs, sizeof(allocfuncs),
                                 sizeof(allocfuncs));
    if (rc < 0)
      return rc;
  }
  f.size = sizeof(f);
  allocfuncs = f;
  return 0;
}

void *encache__malloc(size_t size) {
  size = size ? size : 1;
  return allocfuncs.malloc_fn ? allocfuncs.malloc_fn(size) : malloc(size);
}

void *encache__calloc(size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  n = n ? n : 1;
  size = size ? size : 1;
  return allocfuncs.calloc_fn ? allocfuncs.calloc_fn(n, size)
                              : calloc(n, size);
}

void *encache__realloc(void *p, size_t size) {
  size = size ? size : 1;
  return allocfuncs.realloc_fn ? allocfuncs.realloc_fn(p, size)
                               : realloc(p, size);
}

void encache__free(void *p) {
  if (p == NULL)
    return;
  if (allocfuncs.free_fn)
    allocfuncs.free_fn(p);
  else
    free(p);
}

void *encache__aligned_alloc(size_t alignment, size_t size) {
  size = size ? size : 1;
  if (allocfuncs.aligned_alloc_fn != NULL)
    return allocfuncs.aligned_alloc_fn(alignment, size);
  if (allocfuncs.malloc_fn != NULL) {
    /* The caller's malloc, over-allocated: the block's start is kept just
     * below the aligned pointer, for encache__aligned_free(). */
    if (size > SIZE_MAX - alignment - sizeof(void *))
      return NULL;
    unsigned char *raw = allocfuncs.malloc_fn(size + alignment + sizeof(void *));
    if (raw == NULL)
      return NULL;
    uintptr_t a = ((uintptr_t)raw + sizeof(void *) + alignment - 1) &
                  ~(uintptr_t)(alignment - 1);
    ((void **)a)[-1] = raw;
    return (void *)a;
  }
  void *p = NULL;
  return posix_memalign(&p, alignment, size) == 0 ? p : NULL;
}

void encache__aligned_free(void *p) {
  if (p == NULL)
    return;
  if (allocfuncs.aligned_alloc_fn != NULL)
    allocfuncs.free_fn(p);
  else if (allocfuncs.malloc_fn != NULL)
    allocfuncs.free_fn(((void **)p)[-1]);
  else
    free(p);
}

/* ------------------------------------------------------ caller's structs */

int encache__struct_check(const void *in, size_t full_size, size_t min_size) {
  size_t size;
  memcpy(&size, in, sizeof(size));
  if (!encache__struct_size_ok(size, min_size))
    return ENCACHE_EINVAL;
  /* A newer caller's struct: the fields this library does not know must
   * be zero (unset), else the caller asks for something it cannot do. */
  for (size_t i = full_size; i < size; i++)
    if (((const unsigned char *)in)[i] != 0)
      return ENCACHE_EINVAL;
  return 0;
}

int encache__struct_in(void *full, size_t full_size, const void *in,
                       size_t min_size) {
  int rc = encache__struct_check(in, full_size, min_size);
  if (rc < 0)
    return rc;
  size_t size;
  memcpy(&size, in, sizeof(size));
  memset(full, 0, full_size);
  memcpy(full, in, size < full_size ? size : full_size);
  return 0;
}

int encache__struct_out(void *out, const void *full, size_t full_size,
                        size_t min_size) {
  size_t size;
  memcpy(&size, out, sizeof(size));
  if (!encache__struct_size_ok(size, min_size))
    return ENCACHE_EINVAL;
  size_t n = size < full_size ? size : full_size;
  memcpy((unsigned char *)out + sizeof(size_t),
         (const unsigned char *)full + sizeof(size_t), n - sizeof(size_t));
  if (size > full_size)
    memset((unsigned char *)out + full_size, 0, size - full_size);
  return 0;
}

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

struct timespec encache__deadline(clockid_t clock, unsigned ms) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}
