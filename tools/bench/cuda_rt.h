/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_rt.h: the few CUDA runtime functions the tool (lookup --device),
 * the device tests and bench_device call themselves (device memory, plain
 * copies), loaded at run time as libencache loads them: from
 * $ENCACHE_CUDA_LIBRARY, else libcudart.so (then .so.13, .so.12), so that
 * nothing links CUDA.  Types are those of the ABI: an int error code,
 * pointers for streams.
 */
#ifndef ENCACHE_CUDA_RT_H
#define ENCACHE_CUDA_RT_H

#include <stddef.h>

enum { CUDA_RT_H2D = 1, CUDA_RT_D2H = 2 };

typedef struct cuda_rt {
  void *lib;
  const char *(*error_string)(int);
  int (*get_device_count)(int *);
  int (*set_device)(int);
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
  int (*memcpy_async)(void *, const void *, size_t, int, void *);
  int (*stream_create)(void **, unsigned);
  int (*stream_sync)(void *);
  int (*stream_destroy)(void *);
  int (*host_alloc)(void **, size_t, unsigned);
  int (*free_host)(void *);
  int devices;
} cuda_rt;

/* Loads the runtime into *rt (once per call; the library stays loaded).
 * 0, or -1 with why[0..size) saying what failed (no library, a missing
 * symbol, no device). */
int cuda_rt_load(cuda_rt *rt, char *why, size_t size);

#endif
