/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device.c: CUDA destinations and outputs without a CUDA build or run
 * dependency (docs/engine.md, "Device outputs").
 *
 * The runtime: libcudart is dlopen()ed once per process (pthread_once):
 * $ENCACHE_CUDA_LIBRARY, else one already loaded in the process (as
 * "libcudart.so.13", ".so.12", ".so.11.0", "libcudart.so": torch's), else
 * "libcudart.so" then those versioned sonames; only
 * the functions below are resolved, declared here with the C types of
 * their ABI (cudaError_t is an int, streams and events are pointers), so
 * that no CUDA header is needed.  A missing library, symbol or device
 * leaves a static reason that every CUDA candidate's why carries.
 *
 * Lookups: the staging buffer is page-locked (cudaHostRegister) on the
 * first lookup with a CUDA hit; each hit is copied from it with
 * cudaMemcpyAsync on the step's stream (encache_step_set_stream()) or on
 * a blocking stream the handle owns per device (STREAM_FLAGS), each with
 * the item's device current (then the caller's is restored); after each
 * chunk an event is recorded on every stream used and waited for
 * (polled, at most device_sync_timeout_ms) before the next chunk's read
 * may overwrite the staging buffer.  So chunks do not overlap: the chunk's
 * copies overlap each other only.  A copy or a wait that fails poisons
 * the handle.
 *
 * Publication: a bounded pool of page-locked buffers (cudaHostAlloc, at
 * most device_pinned_pool_bytes in all).  The caller's thread queues the
 * device-to-host copy on the output's stream and records the buffer's
 * event after it; the worker polls the event before writing the buffer.
 * A buffer given back goes to a "busy" list until its event is seen
 * complete, then to the free list.
 *
 * Threads: everything here runs on the handle's caller thread, except
 * encache__pinned_wait() (the worker, which touches only its job's
 * buffer) and the runtime's one-time load.  The current device of the
 * caller's thread is restored after every call that must change it.
 */
#include "device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ the runtime */

enum { CUDA_OK = 0, CUDA_NOT_READY = 600 };
enum { H2D = 1, D2H = 2 };        /* cudaMemcpyKind */
/* The handle's own streams are blocking (cudaStreamDefault): ordered
 * after the legacy default stream's work, so that a destination allocated
 * there (torch's default stream) is not written before its previous
 * user's kernels ran; other streams need encache_step_set_stream()
 * (docs/engine.md, "Device outputs"). */
#define STREAM_FLAGS 0u
#define EVENT_DISABLE_TIMING 2u   /* cudaEventDisableTiming */

/* X(field, symbol, type): the functions used, resolved in this order. */
#define CUDA_FNS(X)                                                          \
  X(get_error_string, cudaGetErrorString, const char *(*)(int))              \
  X(get_device_count, cudaGetDeviceCount, int (*)(int *))                    \
  X(get_device, cudaGetDevice, int (*)(int *))                               \
  X(set_device, cudaSetDevice, int (*)(int))                                 \
  X(stream_create, cudaStreamCreateWithFlags, int (*)(void **, unsigned))    \
  X(stream_destroy, cudaStreamDestroy, int (*)(void *))                      \
  X(event_create, cudaEventCreateWithFlags, int (*)(void **, unsigned))      \
  X(event_record, cudaEventRecord, int (*)(void *, void *))                  \
  X(event_query, cudaEventQuery, int (*)(void *))                            \
  X(event_destroy, cudaEventDestroy, int (*)(void *))                        \
  X(memcpy_async, cudaMemcpyAsync,                                           \
    int (*)(void *, const void *, size_t, int, void *))                      \
  X(host_register, cudaHostRegister, int (*)(void *, size_t, unsigned))      \
  X(host_unregister, cudaHostUnregister, int (*)(void *))                    \
  X(host_alloc, cudaHostAlloc, int (*)(void **, size_t, unsigned))           \
  X(free_host, cudaFreeHost, int (*)(void *))

static struct {
#define CUDA_FIELD_(field, sym, type) __typeof__(type) field;
  CUDA_FNS(CUDA_FIELD_)
#undef CUDA_FIELD_
  int devices;     /* how many, once loaded */
  char why[512];   /* "" when loaded, else why not */
} rt;

static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static const char *err_str(int e) {
  const char *s = rt.get_error_string != NULL ? rt.get_error_string(e) : NULL;
  return s != NULL ? s : "unknown CUDA error";
}

static void *open_runtime(void) {
  const char *env = getenv("ENCACHE_CUDA_LIBRARY");
  if (env != NULL && env[0] != '\0') {
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
      snprintf(rt.why, sizeof(rt.why), "CUDA runtime not available: cannot "
               "load %s (ENCACHE_CUDA_LIBRARY): %s", env, dlerror());
    return h;
  }
  /* A runtime already in the process (torch's) first: one copy of the
   * runtime, one set of contexts and handles; then one to load. */
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
                                      "libcudart.so.11.0", "libcudart.so"};
  size_t count = sizeof(names) / sizeof(names[0]);
  for (size_t i = 0; i < count; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h != NULL)
      return h;
  }
  static const char *const load[] = {"libcudart.so", "libcudart.so.13",
                                     "libcudart.so.12", "libcudart.so.11.0"};
  for (size_t i = 0; i < count; i++) {
    void *h = dlopen(load[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL)
      return h;
  }
  snprintf(rt.why, sizeof(rt.why), "CUDA runtime not available: cannot load "
           "libcudart.so (nor .so.13, .so.12, .so.11.0): %s; set "
           "ENCACHE_CUDA_LIBRARY to its path", dlerror());
  return NULL;
}

static void load_runtime(void) {
  void *h = open_runtime();
  if (h == NULL)
    return;
  void *sym;
#define CUDA_LOAD_(field, name, type)                                        \
  if ((sym = dlsym(h, #name)) == NULL) {                                     \
    snprintf(rt.why, sizeof(rt.why), "CUDA runtime not available: the "     \
             "library has no symbol " #name);                                \
    return;                                                                  \
  }                                                                          \
  memcpy(&rt.field, &sym, sizeof(rt.field));
  CUDA_FNS(CUDA_LOAD_)
#undef CUDA_LOAD_
  int n = 0, e = rt.get_device_count(&n);
  if (e != CUDA_OK || n <= 0) {
    snprintf(rt.why, sizeof(rt.why), "CUDA runtime not available: no CUDA "
             "device (cudaGetDeviceCount: %s)",
             e != CUDA_OK ? err_str(e) : "0 devices");
    return;
  }
  rt.devices = n;
}

/* NULL when the runtime is loaded and has a device, else why not. */
static const char *runtime_why(void) {
  pthread_once(&rt_once, load_runtime);
  return rt.devices > 0 ? NULL : rt.why;
}

const char *encache__device_ineligible(const encache_candidate *c) {
  if (c->device != ENCACHE_DEVICE_CUDA)
    return "the destination is neither host memory nor a CUDA device";
  const char *why = runtime_why();
  if (why != NULL)
    return why;
  if (c->device_index < 0 || c->device_index >= rt.devices ||
      c->device_index >= ENCACHE__MAX_DEVICES)
    return "device_index is not a CUDA device of this process (0 .. the "
           "device count - 1, at most 15)";
  return NULL;
}

/* Makes dev the calling thread's device; *prev is the one to restore. */
static int device_enter(int dev, int *prev) {
  *prev = dev;
  int e = rt.get_device(prev);
  if (e == CUDA_OK && *prev != dev)
    e = rt.set_device(dev);
  return e;
}

static void device_leave(int dev, int prev) {
  if (prev != dev)
    rt.set_device(prev);
}

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* How long a wait yields the processor between polls before it sleeps
 * between them: a copy of a few MiB completes within it, and a sleep's
 * timer slack (about 50 us) would add to every such lookup. */
#define SPIN_US 500

/* Polls ev until it completes (0) or fails or times out (-1, why set). */
static int wait_event(void *ev, uint64_t timeout_ms, const char *what,
                      char *why, size_t size) {
  /* Any timeout beyond a day waits a day: no overflow of the deadline. */
  uint64_t bound = timeout_ms < 86400000u ? timeout_ms : 86400000u;
  uint64_t start = now_us(), deadline = start + bound * 1000u;
  for (;;) {
    int e = rt.event_query(ev);
    if (e == CUDA_OK)
      return 0;
    if (e != CUDA_NOT_READY) {
      snprintf(why, size, "%s: its completion cannot be confirmed "
               "(cudaEventQuery: %s)", what, err_str(e));
      return ENCACHE_EUNCONFIRMED;
    }
    uint64_t now = now_us();
    if (now >= deadline) {
      snprintf(why, size, "%s did not complete within %llu ms "
               "(device_sync_timeout_ms)", what,
               (unsigned long long)timeout_ms);
      return ENCACHE_EUNCONFIRMED;
    }
    if (now - start < SPIN_US) {
      sched_yield();
    } else {
      struct timespec ts = {0, 10000};
      nanosleep(&ts, NULL);
    }
  }
}

/* ---------------------------------------------------- the handle's state */

struct encache__pinned {
  encache__pinned *next;
  void *p;
  size_t cap;
  void *event;   /* created on event_dev, recorded after the copy */
  int event_dev;
};

typedef struct encache__device {
  void *stream[ENCACHE__MAX_DEVICES]; /* owned, created on first use */
  void *event[ENCACHE__MAX_DEVICES];  /* a lookup chunk's end, per device */
  void *queued[ENCACHE__MAX_DEVICES]; /* the stream copies went on, or NULL */
  int queued_any;
  int staging_pinned;
  encache__pinned *free_list; /* completed, reusable */
  encache__pinned *busy;      /* given back, copy maybe still running */
  encache__pinned *kept;      /* unconfirmed: never reused nor freed */
  /* The pool's bytes, decided on here and mirrored into the stats (which
   * may live in the host's registry, writable by other processes). */
  uint64_t pool_bytes;
} encache__device;

static encache__device *state(encache *ec) {
  if (ec->dev == NULL)
    ec->dev = encache__calloc(1, sizeof(encache__device));
  return ec->dev;
}

/* ------------------------------------------------------------- lookups */

int encache__device_pin_staging(encache *ec) {
  encache__device *d = state(ec);
  if (d == NULL)
    return encache__fail(ec, ENCACHE_EUNAVAIL, "out of memory (the CUDA "
                         "state)");
  if (d->staging_pinned)
    return 0;
  int e = rt.host_register(ec->lane.staging, (size_t)ec->read_buf_bytes, 0);
  if (e != CUDA_OK)
    return encache__fail(ec, ENCACHE_EUNAVAIL, "page-locking the %llu-byte "
                         "staging buffer for CUDA copies failed "
                         "(cudaHostRegister: %s)",
                         (unsigned long long)ec->read_buf_bytes, err_str(e));
  d->staging_pinned = 1;
  return 0;
}

/* The handle's event of device dev (and its stream, unless the caller
 * gave one), created on first use; dev is the thread's current device. */
static int own_stream(encache__device *d, int dev, int need_stream) {
  int e = CUDA_OK;
  if (need_stream && d->stream[dev] == NULL)
    e = rt.stream_create(&d->stream[dev], STREAM_FLAGS);
  if (e == CUDA_OK && d->event[dev] == NULL)
    e = rt.event_create(&d->event[dev], EVENT_DISABLE_TIMING);
  return e;
}

/* The copy is queued with dev current, and its event is recorded so
 * (device_sync): the default stream handles (NULL, cudaStreamLegacy,
 * cudaStreamPerThread) name the current device's stream, and CUDA refuses
 * to record an event on a stream of another device than the event's. */
int encache__device_copy_in(encache *ec, void *given, int dev, void *dst,
                            const void *src, size_t n) {
  encache__device *d = ec->dev; /* pin_staging made it */
  int prev, e = device_enter(dev, &prev);
  const char *what = "cudaGetDevice/cudaSetDevice";
  if (e == CUDA_OK) {
    what = "creating a CUDA stream and event";
    e = own_stream(d, dev, given == NULL);
  }
  void *stream = given != NULL ? given : d->stream[dev];
  if (e == CUDA_OK) {
    what = "cudaMemcpyAsync";
    /* Queued before it is known to be refused: a refused copy may be a
     * sticky error of earlier work still reading the staging buffer. */
    d->queued[dev] = stream;
    d->queued_any = 1;
    e = rt.memcpy_async(dst, src, n, H2D, stream);
  }
  device_leave(dev, prev);
  if (e != CUDA_OK)
    return encache__poison(ec, "copying %zu bytes to CUDA device %d failed "
                           "(%s: %s)", n, dev, what, err_str(e));
  ENCACHE__COUNT(ec, device_bytes_copied, n);
  return 0;
}

int encache__device_sync(encache *ec) {
  encache__device *d = ec->dev;
  if (d == NULL || !d->queued_any)
    return 0;
  char what[64], why[400];
  for (int dev = 0; dev < ENCACHE__MAX_DEVICES; dev++) {
    if (d->queued[dev] == NULL)
      continue;
    int prev, e = device_enter(dev, &prev);
    const char *fn = "cudaGetDevice/cudaSetDevice";
    if (e == CUDA_OK) {
      fn = "cudaEventRecord";
      e = rt.event_record(d->event[dev], d->queued[dev]);
    }
    device_leave(dev, prev);
    if (e != CUDA_OK)
      return encache__poison(ec, "the copies to CUDA device %d cannot be "
                             "confirmed (%s: %s)", dev, fn, err_str(e));
    snprintf(what, sizeof(what), "the copies to CUDA device %d", dev);
    if (wait_event(d->event[dev], ec->device_timeout_ms, what, why,
                   sizeof(why)) < 0)
      return encache__poison(ec, "%s", why);
    d->queued[dev] = NULL;
  }
  d->queued_any = 0;
  return 0;
}

/* --------------------------------------------------------- publication */

static void pinned_destroy(encache__pinned *b) {
  if (b->event != NULL)
    rt.event_destroy(b->event);
  rt.free_host(b->p);
  encache__free(b);
}

/* Moves the busy buffers whose copy completed to the free list: 0, or a
 * poison (an event that cannot be queried: its buffer is kept). */
static int reclaim(encache *ec, encache__device *d) {
  for (encache__pinned **pp = &d->busy; *pp != NULL;) {
    encache__pinned *b = *pp;
    int e = rt.event_query(b->event);
    if (e == CUDA_NOT_READY) {
      pp = &b->next;
      continue;
    }
    *pp = b->next;
    encache__pinned **to = e == CUDA_OK ? &d->free_list : &d->kept;
    b->next = *to;
    *to = b;
    if (e != CUDA_OK)
      return encache__poison(ec, "publish: a copy from CUDA device %d "
                             "cannot be confirmed (cudaEventQuery: %s): its "
                             "page-locked buffer is kept", b->event_dev,
                             err_str(e));
  }
  return 0;
}

/* A free buffer of at least n bytes (removed from the list), or NULL. */
static encache__pinned *best_fit(encache__device *d, size_t n) {
  encache__pinned **best = NULL;
  for (encache__pinned **pp = &d->free_list; *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->cap >= n && (best == NULL || (*pp)->cap < (*best)->cap))
      best = pp;
  if (best == NULL)
    return NULL;
  encache__pinned *b = *best;
  *best = b->next;
  return b;
}

static void pool_gauge(encache *ec, int64_t delta) {
  encache__device *d = ec->dev; /* set: the pool lives in it */
  d->pool_bytes += (uint64_t)delta;
  __atomic_store_n(&ec->live->device_pool_bytes, d->pool_bytes,
                   __ATOMIC_RELAXED);
}

/* A buffer of n bytes from the pool: 0 (*out set), 1 (full), or a negative
 * code with the handle's message. */
static int pool_take(encache *ec, encache__device *d, size_t n,
                     encache__pinned **out) {
  int rc = reclaim(ec, d);
  if (rc < 0)
    return rc;
  if ((*out = best_fit(d, n)) != NULL)
    return 0;
  if (n > ec->pinned_pool_max) /* never fits (and no overflow below) */
    return 1;
  size_t cap = (n + 4095) & ~(size_t)4095;
  if (cap == 0)
    cap = 4096;
  uint64_t used = d->pool_bytes;
  while (used + cap > ec->pinned_pool_max && d->free_list != NULL) {
    encache__pinned *b = d->free_list; /* too small: make room */
    d->free_list = b->next;
    used -= b->cap;
    pool_gauge(ec, -(int64_t)b->cap);
    pinned_destroy(b);
  }
  if (used + cap > ec->pinned_pool_max)
    return 1;
  encache__pinned *b = encache__calloc(1, sizeof(*b));
  if (b == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM, "publish: out of memory");
  int e = rt.host_alloc(&b->p, cap, 0);
  if (e != CUDA_OK) {
    encache__free(b);
    return encache__fail(ec, ENCACHE_EIO, "publish: allocating %zu bytes of "
                         "page-locked memory failed (cudaHostAlloc: %s)",
                         cap, err_str(e));
  }
  b->cap = cap;
  b->event_dev = -1;
  pool_gauge(ec, (int64_t)cap);
  *out = b;
  return 0;
}

/* Queues view's copy into b and records b's event after it, on the
 * calling thread's device dev: 0, or a negative code (message set). */
static int copy_out_of(encache *ec, encache__device *d, encache__pinned *b,
                       const encache_tensor *view, size_t n) {
  int dev = view->device_index;
  if (b->event != NULL && b->event_dev != dev) {
    rt.event_destroy(b->event);
    b->event = NULL;
  }
  int e = CUDA_OK;
  const char *what = "cudaEventCreateWithFlags";
  if (b->event == NULL &&
      (e = rt.event_create(&b->event, EVENT_DISABLE_TIMING)) == CUDA_OK)
    b->event_dev = dev;
  if (e == CUDA_OK) {
    what = "cudaMemcpyAsync";
    e = rt.memcpy_async(b->p, view->data, n, D2H, view->stream);
  }
  if (e != CUDA_OK) {
    b->next = d->free_list; /* nothing was queued into it */
    d->free_list = b;
    return encache__fail(ec, ENCACHE_EIO, "publish: copying %zu bytes from "
                         "CUDA device %d failed (%s: %s); nothing queued",
                         n, dev, what, err_str(e));
  }
  if ((e = rt.event_record(b->event, view->stream)) != CUDA_OK) {
    b->next = d->kept; /* the copy may write into it at any time */
    d->kept = b;
    return encache__poison(ec, "publish: the copy from CUDA device %d "
                           "cannot be confirmed (cudaEventRecord: %s)", dev,
                           err_str(e));
  }
  return 0;
}

int encache__device_publish_begin(encache *ec, const encache_tensor *view,
                                  uint64_t nbytes, encache__pinned **out) {
  const char *why = runtime_why();
  if (why != NULL)
    return encache__fail(ec, ENCACHE_ENOLIB, "publish: %s", why);
  if (view->device_index < 0 || view->device_index >= rt.devices ||
      view->device_index >= ENCACHE__MAX_DEVICES)
    return encache__fail(ec, ENCACHE_EINVAL, "publish: cuda:%d: the CUDA "
                         "runtime has %d device%s (encache serves at most "
                         "%d)", view->device_index, rt.devices,
                         rt.devices == 1 ? "" : "s", ENCACHE__MAX_DEVICES);
  encache__device *d = state(ec);
  if (d == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM, "publish: out of memory");
  encache__pinned *b;
  int rc = pool_take(ec, d, (size_t)nbytes, &b);
  if (rc == 1) { /* a bound of its own, reported as the bytes budget */
    ENCACHE__COUNT(ec, device_pool_full, 1);
    return encache__fail(ec, ENCACHE_SKIP_OVER_BYTES, "publish: no room "
                         "for %llu bytes in the page-locked pool of CUDA "
                         "outputs (device_pinned_pool_bytes %llu): skipped "
                         "as OVER_BYTES, counted in device_pool_full",
                         (unsigned long long)nbytes,
                         (unsigned long long)ec->pinned_pool_max);
  }
  if (rc != 0)
    return rc;
  int prev, e = device_enter(view->device_index, &prev);
  if (e != CUDA_OK) {
    device_leave(view->device_index, prev);
    b->next = d->free_list;
    d->free_list = b;
    return encache__fail(ec, ENCACHE_EIO, "publish: cudaSetDevice(%d): %s",
                         view->device_index, err_str(e));
  }
  rc = copy_out_of(ec, d, b, view, (size_t)nbytes);
  device_leave(view->device_index, prev);
  if (rc == 0)
    *out = b;
  return rc;
}

const void *encache__pinned_data(const encache__pinned *b) { return b->p; }

int encache__pinned_wait(encache *ec, encache__pinned *b, char *why,
                         size_t size) {
  /* The worker's own thread: its device is the event's, chosen before any
   * runtime call (a thread without one would have device 0's primary
   * context made current: memory on a GPU the process may not use).  Not
   * restored: nothing else runs CUDA on this thread. */
  int e = rt.set_device(b->event_dev);
  if (e != CUDA_OK) {
    snprintf(why, size, "the copy of the output from CUDA device %d cannot "
             "be confirmed (cudaSetDevice: %s)", b->event_dev, err_str(e));
    return ENCACHE_EUNCONFIRMED;
  }
  return wait_event(b->event, ec->device_timeout_ms,
                    "the copy of the output from its CUDA device", why, size);
}

void encache__pinned_release(encache *ec, encache__pinned *b) {
  encache__device *d = ec->dev;
  b->next = d->busy;
  d->busy = b;
}

/* --------------------------------------------------------------- close */

static void destroy_list(encache *ec, encache__pinned *b) {
  while (b != NULL) {
    encache__pinned *next = b->next;
    pool_gauge(ec, -(int64_t)b->cap);
    pinned_destroy(b);
    b = next;
  }
}

int encache__device_free(encache *ec) {
  encache__device *d = ec->dev;
  if (d == NULL)
    return 0;
  char why[400];
  for (encache__pinned *b = d->busy; b != NULL; b = b->next)
    if (wait_event(b->event, ec->device_timeout_ms, "a publication's copy",
                   why, sizeof(why)) < 0)
      return encache__poison(ec, "%s", why);
  if (d->kept != NULL)
    return encache__poison(ec, "a copy from a CUDA device was never "
                           "confirmed: its page-locked buffer is kept");
  if (d->staging_pinned) {
    int e = rt.host_unregister(ec->lane.staging);
    if (e != CUDA_OK)
      return encache__poison(ec, "unpinning the staging buffer failed "
                             "(cudaHostUnregister: %s)", err_str(e));
    d->staging_pinned = 0;
  }
  destroy_list(ec, d->busy);
  destroy_list(ec, d->free_list);
  for (int i = 0; i < ENCACHE__MAX_DEVICES; i++) {
    if (d->event[i] != NULL)
      rt.event_destroy(d->event[i]);
    if (d->stream[i] != NULL)
      rt.stream_destroy(d->stream[i]);
  }
  encache__free(d);
  ec->dev = NULL;
  return 0;
}
