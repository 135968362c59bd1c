/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_cudart.c: a stand-in for the CUDA runtime (libcudart) over host
 * memory, so that the device paths of libencache run, with real
 * asynchrony, on a machine without a GPU (tests/test_device_*.c, the tool's
 * test, bench_device).  Only the functions encache, its tests, the tool
 * and the benchmark call are exported, with the C types of their ABI
 * (cudaError_t is an int; streams and events are pointers).
 *
 * Each stream is a thread executing its queued copies and event records
 * in order, after an optional delay per operation (fake_cudart_delay_us),
 * so that a caller that does not wait for an event reads stale bytes and
 * a race shows under the sanitizers.  "Device memory" is malloc()ed.
 *
 * Devices, as CUDA has them: each thread has a current device (0 until it
 * calls cudaSetDevice); a stream and an event belong to the device current
 * when they were created; each device has its default stream (one more
 * thread), and the handles NULL, cudaStreamLegacy (0x1) and
 * cudaStreamPerThread (0x2) name the default stream of the calling
 * thread's current device.  cudaEventRecord of an event on a stream of
 * another device fails with cudaErrorInvalidResourceHandle (400), as
 * CUDA's does; a copy may be queued on a stream of any device, as CUDA
 * allows.  A blocking stream (created without cudaStreamNonBlocking) is
 * ordered after its device's legacy default stream: here an operation
 * queued on it first waits, on the caller's thread, for the default
 * stream's queued work (the other direction is not modelled).
 *
 * Failure injection, through exported controls the tests reach with
 * dlsym() (or FAKE_CUDART_DEVICES for the device count):
 *   fake_cudart_fail_copy_after(n)  the copies after the next n fail
 *                                   (cudaErrorIllegalAddress); -1: none
 *   fake_cudart_hang_events(on)     recorded events never complete
 *   fake_cudart_fail_records(on)    cudaEventRecord fails
 *   fake_cudart_fail_host_memory(on) cudaHostRegister/cudaHostAlloc fail
 *   fake_cudart_set_devices(n)      the device count (0: no device)
 *   fake_cudart_fail_queries(on)    cudaEventQuery fails
 *   fake_cudart_strict_queries(on)  cudaEventQuery fails (400) unless the
 *                                   calling thread's current device is the
 *                                   event's: a thread that queries without
 *                                   choosing its device would, on CUDA,
 *                                   create a context on device 0
 * and observations: fake_cudart_pageable_copies() (async copies whose
 * host side was not page-locked), fake_cudart_live() (streams, events,
 * host and device allocations alive).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

enum {
  OK = 0,
  E_INVALID_VALUE = 1,
  E_MEMORY = 2,
  E_INVALID_DEVICE = 101,
  E_NO_DEVICE = 100,
  E_INVALID_HANDLE = 400,
  E_NOT_READY = 600,
  E_ILLEGAL_ADDRESS = 700
};

static long fail_copy_after = -1; /* atomics */
static int hang_events, fail_records, fail_host, devices = 2, devices_set;
static int fail_queries, strict_queries;
static long delay_us, pageable, live[4]; /* streams, events, host, device */
static _Thread_local int current_device;

/* ------------------------------------------------------- page-locked */

#define MAX_PINNED 256
static struct { const char *p; size_t n; } pinned[MAX_PINNED];
static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;

static int pin_add(const void *p, size_t n) {
  pthread_mutex_lock(&pinned_mu);
  int rc = E_MEMORY;
  for (int i = 0; i < MAX_PINNED; i++)
    if (pinned[i].p == NULL) {
      pinned[i].p = p;
      pinned[i].n = n;
      rc = OK;
      break;
    }
  pthread_mutex_unlock(&pinned_mu);
  return rc;
}

static int pin_remove(const void *p) {
  pthread_mutex_lock(&pinned_mu);
  int rc = E_INVALID_VALUE;
  for (int i = 0; i < MAX_PINNED; i++)
    if (pinned[i].p == p) {
      pinned[i].p = NULL;
      rc = OK;
      break;
    }
  pthread_mutex_unlock(&pinned_mu);
  return rc;
}

static int is_pinned(const void *p, size_t n) {
  const char *c = p;
  int yes = 0;
  pthread_mutex_lock(&pinned_mu);
  for (int i = 0; i < MAX_PINNED && !yes; i++)
    yes = pinned[i].p != NULL && c >= pinned[i].p &&
          c + n <= pinned[i].p + pinned[i].n;
  pthread_mutex_unlock(&pinned_mu);
  return yes;
}

/* ------------------------------------------------------ streams, events */

typedef struct event {
  int dev;            /* the device current at its creation */
  uint64_t recorded;  /* atomic: the latest record's number */
  uint64_t completed; /* atomic: the latest executed */
} event;

typedef struct op {
  struct op *next;
  void *dst;
  const void *src;
  size_t n;
  event *ev; /* a record, else a copy */
  uint64_t seq;
} op;

typedef struct stream {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op *head, *tail;
  int busy, stop;
  int dev;      /* the device current at its creation */
  int blocking; /* ordered after dev's legacy default stream */
  pthread_t thread;
} stream;

static void *stream_main(void *arg) {
  stream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == NULL && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    op *o = s->head;
    if (o == NULL)
      break;
    s->head = o->next;
    if (s->head == NULL)
      s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    long d = __atomic_load_n(&delay_us, __ATOMIC_RELAXED);
    if (d > 0) {
      struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
      nanosleep(&ts, NULL);
    }
    if (o->ev == NULL)
      memcpy(o->dst, o->src, o->n);
    else if (!__atomic_load_n(&hang_events, __ATOMIC_RELAXED))
      __atomic_store_n(&o->ev->completed, o->seq, __ATOMIC_RELEASE);
    free(o);
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static stream *stream_new(int dev) {
  stream *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return NULL;
  s->dev = dev;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

#define MAX_DEVICES 16
static stream *legacy[MAX_DEVICES]; /* per device, made on first use */
static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;

/* NULL, cudaStreamLegacy (0x1) and cudaStreamPerThread (0x2): the default
 * stream of the calling thread's current device (one stream here). */
static stream *stream_of(void *handle) {
  if ((uintptr_t)handle > 2)
    return handle;
  int dev = current_device;
  if (dev < 0 || dev >= MAX_DEVICES)
    return NULL;
  pthread_mutex_lock(&legacy_mu);
  if (legacy[dev] == NULL)
    legacy[dev] = stream_new(dev);
  stream *s = legacy[dev];
  pthread_mutex_unlock(&legacy_mu);
  return s;
}

static void drain(stream *s) {
  pthread_mutex_lock(&s->mu);
  while (s->head != NULL || s->busy)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static int push(void *handle, op *o) {
  stream *s = stream_of(handle);
  if (s == NULL) {
    free(o);
    return E_MEMORY;
  }
  if (s->blocking) {
    pthread_mutex_lock(&legacy_mu);
    stream *l = legacy[s->dev];
    pthread_mutex_unlock(&legacy_mu);
    if (l != NULL)
      drain(l);
  }
  pthread_mutex_lock(&s->mu);
  if (s->tail != NULL)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return OK;
}


/* --------------------------------------------------------- the runtime */

EXPORT const char *cudaGetErrorString(int e) {
  switch (e) {
  case OK: return "no error";
  case E_INVALID_VALUE: return "invalid argument (fake)";
  case E_MEMORY: return "out of memory (fake: injected)";
  case E_NO_DEVICE: return "no CUDA-capable device is detected (fake)";
  case E_INVALID_DEVICE: return "invalid device ordinal (fake)";
  case E_INVALID_HANDLE: return "invalid resource handle (fake)";
  case E_ILLEGAL_ADDRESS: return "an illegal memory access was encountered "
                                 "(fake: injected)";
  default: return "unknown error (fake)";
  }
}

EXPORT int cudaGetDeviceCount(int *n) {
  if (!__atomic_load_n(&devices_set, __ATOMIC_RELAXED)) {
    const char *e = getenv("FAKE_CUDART_DEVICES");
    if (e != NULL)
      devices = atoi(e);
  }
  *n = 0;
  if (devices <= 0)
    return E_NO_DEVICE;
  *n = devices;
  return OK;
}

EXPORT int cudaGetDevice(int *d) {
  *d = current_device;
  return OK;
}

EXPORT int cudaSetDevice(int d) {
  if (d < 0 || d >= devices || d >= MAX_DEVICES)
    return E_INVALID_DEVICE;
  current_device = d;
  return OK;
}

EXPORT int cudaStreamCreateWithFlags(void **out, unsigned flags) {
  stream *s = stream_new(current_device);
  if (s == NULL)
    return E_MEMORY;
  s->blocking = !(flags & 1u); /* cudaStreamNonBlocking */
  __atomic_add_fetch(&live[0], 1, __ATOMIC_RELAXED);
  *out = s;
  return OK;
}

EXPORT int cudaStreamCreate(void **out) {
  return cudaStreamCreateWithFlags(out, 0);
}

EXPORT int cudaStreamSynchronize(void *handle) {
  stream *s = stream_of(handle);
  if (s == NULL)
    return E_MEMORY;
  drain(s);
  return OK;
}

EXPORT int cudaStreamDestroy(void *handle) {
  stream *s = handle;
  if ((uintptr_t)handle <= 2) /* a default stream */
    return E_INVALID_VALUE;
  pthread_mutex_lock(&s->mu);
  s->stop = 1; /* its queued work completes first, as CUDA's does */
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  __atomic_sub_fetch(&live[0], 1, __ATOMIC_RELAXED);
  return OK;
}

EXPORT int cudaDeviceSynchronize(void) {
  return cudaStreamSynchronize(NULL);
}

EXPORT int cudaEventCreateWithFlags(void **out, unsigned flags) {
  (void)flags;
  event *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return E_MEMORY;
  e->dev = current_device;
  __atomic_add_fetch(&live[1], 1, __ATOMIC_RELAXED);
  *out = e;
  return OK;
}

EXPORT int cudaEventDestroy(void *handle) {
  if (handle == NULL)
    return E_INVALID_VALUE;
  free(handle); /* the tests destroy events only once they completed */
  __atomic_sub_fetch(&live[1], 1, __ATOMIC_RELAXED);
  return OK;
}

/* Records are numbered per event: a query compares the latest record with
 * the latest executed, as CUDA does (an event never recorded is done).
 * The event and the stream must be of one device, as CUDA's must. */
EXPORT int cudaEventRecord(void *handle, void *strm) {
  event *e = handle;
  if (__atomic_load_n(&fail_records, __ATOMIC_RELAXED))
    return E_ILLEGAL_ADDRESS;
  stream *s = stream_of(strm);
  if (e != NULL && s != NULL && s->dev != e->dev)
    return E_INVALID_HANDLE;
  op *o = calloc(1, sizeof(*o));
  if (e == NULL || o == NULL) {
    free(o);
    return e == NULL ? E_INVALID_VALUE : E_MEMORY;
  }
  o->ev = e;
  o->seq = __atomic_add_fetch(&e->recorded, 1, __ATOMIC_RELEASE);
  return push(strm, o);
}

EXPORT int cudaEventQuery(void *handle) {
  event *e = handle;
  if (__atomic_load_n(&fail_queries, __ATOMIC_RELAXED))
    return E_ILLEGAL_ADDRESS;
  if (__atomic_load_n(&strict_queries, __ATOMIC_RELAXED) &&
      current_device != e->dev)
    return E_INVALID_HANDLE;
  uint64_t recorded = __atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE);
  return __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= recorded
             ? OK
             : E_NOT_READY;
}

EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                           void *strm) {
  long left = __atomic_load_n(&fail_copy_after, __ATOMIC_RELAXED);
  if (left == 0)
    return E_ILLEGAL_ADDRESS;
  if (left > 0)
    __atomic_sub_fetch(&fail_copy_after, 1, __ATOMIC_RELAXED);
  if ((kind == 1 && !is_pinned(src, n)) || (kind == 2 && !is_pinned(dst, n)))
    __atomic_add_fetch(&pageable, 1, __ATOMIC_RELAXED);
  op *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return E_MEMORY;
  o->dst = dst;
  o->src = src;
  o->n = n;
  return push(strm, o);
}

/* Synchronous: after the legacy stream's work, as CUDA's is. */
EXPORT int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  (void)kind;
  int rc = cudaStreamSynchronize(NULL);
  if (rc == OK)
    memcpy(dst, src, n);
  return rc;
}

EXPORT int cudaMalloc(void **p, size_t n) {
  *p = malloc(n != 0 ? n : 1);
  if (*p == NULL)
    return E_MEMORY;
  __atomic_add_fetch(&live[3], 1, __ATOMIC_RELAXED);
  return OK;
}

EXPORT int cudaFree(void *p) {
  if (p != NULL) {
    free(p);
    __atomic_sub_fetch(&live[3], 1, __ATOMIC_RELAXED);
  }
  return OK;
}

EXPORT int cudaHostRegister(void *p, size_t n, unsigned flags) {
  (void)flags;
  if (__atomic_load_n(&fail_host, __ATOMIC_RELAXED))
    return E_MEMORY;
  return pin_add(p, n);
}

EXPORT int cudaHostUnregister(void *p) { return pin_remove(p); }

EXPORT int cudaHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  *p = NULL;
  if (__atomic_load_n(&fail_host, __ATOMIC_RELAXED))
    return E_MEMORY;
  void *q = malloc(n != 0 ? n : 1);
  if (q == NULL || pin_add(q, n) != OK) {
    free(q);
    return E_MEMORY;
  }
  __atomic_add_fetch(&live[2], 1, __ATOMIC_RELAXED);
  *p = q;
  return OK;
}

EXPORT int cudaFreeHost(void *p) {
  if (pin_remove(p) != OK)
    return E_INVALID_VALUE;
  free(p);
  __atomic_sub_fetch(&live[2], 1, __ATOMIC_RELAXED);
  return OK;
}

/* ------------------------------------------------------------ controls */

EXPORT void fake_cudart_fail_copy_after(long n) {
  __atomic_store_n(&fail_copy_after, n, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_hang_events(int on) {
  __atomic_store_n(&hang_events, on, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_fail_records(int on) {
  __atomic_store_n(&fail_records, on, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_fail_host_memory(int on) {
  __atomic_store_n(&fail_host, on, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_fail_queries(int on) {
  __atomic_store_n(&fail_queries, on, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_strict_queries(int on) {
  __atomic_store_n(&strict_queries, on, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_set_devices(int n) {
  devices = n;
  __atomic_store_n(&devices_set, 1, __ATOMIC_RELAXED);
}
EXPORT void fake_cudart_delay_us(long us) {
  __atomic_store_n(&delay_us, us, __ATOMIC_RELAXED);
}
EXPORT long fake_cudart_pageable_copies(void) {
  return __atomic_load_n(&pageable, __ATOMIC_RELAXED);
}
/* what: 0 streams, 1 events, 2 page-locked allocations, 3 device ones. */
EXPORT long fake_cudart_live(int what) {
  return what >= 0 && what < 4 ? __atomic_load_n(&live[what], __ATOMIC_RELAXED)
                               : -1;
}
