/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_rt.c: see cuda_rt.h. */
#include "cuda_rt.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_rt_load(cuda_rt *rt, char *why, size_t size) {
  memset(rt, 0, sizeof(*rt));
  const char *env = getenv("ENCACHE_CUDA_LIBRARY");
  static const char *const names[] = {"libcudart.so", "libcudart.so.13",
                                      "libcudart.so.12"};
  if (env != NULL && env[0] != '\0')
    rt->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; rt->lib == NULL && (env == NULL || env[0] == '\0') &&
                     i < sizeof(names) / sizeof(names[0]); i++)
    rt->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (rt->lib == NULL) {
    snprintf(why, size, "cannot load %s: %s",
             env != NULL && env[0] != '\0' ? env : "libcudart.so", dlerror());
    return -1;
  }
  static const char *const syms[] = {
      "cudaGetErrorString", "cudaGetDeviceCount", "cudaSetDevice",
      "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
      "cudaStreamCreateWithFlags", "cudaStreamSynchronize",
      "cudaStreamDestroy", "cudaHostAlloc", "cudaFreeHost"};
  void *fns[sizeof(syms) / sizeof(syms[0])];
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
    if ((fns[i] = dlsym(rt->lib, syms[i])) == NULL) {
      snprintf(why, size, "the CUDA runtime has no symbol %s", syms[i]);
      return -1;
    }
  memcpy(&rt->error_string, &fns[0], sizeof(void *));
  memcpy(&rt->get_device_count, &fns[1], sizeof(void *));
  memcpy(&rt->set_device, &fns[2], sizeof(void *));
  memcpy(&rt->malloc_, &fns[3], sizeof(void *));
  memcpy(&rt->free_, &fns[4], sizeof(void *));
  memcpy(&rt->memcpy_, &fns[5], sizeof(void *));
  memcpy(&rt->memcpy_async, &fns[6], sizeof(void *));
  memcpy(&rt->stream_create, &fns[7], sizeof(void *));
  memcpy(&rt->stream_sync, &fns[8], sizeof(void *));
  memcpy(&rt->stream_destroy, &fns[9], sizeof(void *));
  memcpy(&rt->host_alloc, &fns[10], sizeof(void *));
  memcpy(&rt->free_host, &fns[11], sizeof(void *));
  int e = rt->get_device_count(&rt->devices);
  if (e != 0 || rt->devices <= 0) {
    snprintf(why, size, "no CUDA device (cudaGetDeviceCount: %s)",
             e != 0 ? rt->error_string(e) : "0 devices");
    return -1;
  }
  return 0;
}
