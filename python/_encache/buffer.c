/* SPDX-License-Identifier: Apache-2.0 */
/*
 * buffer.c: the memory that hits land in (buffer.h).
 *
 * A block is one allocation: a header (a DLPack managed tensor and its
 * shape and strides) followed, at a 64-byte boundary, by the matrix the
 * library fills.  The lookup's allocator hands out blocks without the GIL;
 * afterwards each hit's block is given to its Python owner, with no copy:
 * a torch tensor (through DLPack: the tensor's storage is the block's
 * matrix, and freeing the tensor calls the block's deleter), or a Buffer
 * (buffer protocol; numpy.asarray() of it is the NumPy output).
 *
 * Freed blocks go back to a small cache (at most BLOCK_CACHE_SLOTS blocks
 * and block_cache_max bytes, 64 MiB by default, set_block_cache() to
 * change) that later lookups take from: without it, glibc returns a freed
 * multi-megabyte block to the kernel and the next hit of that size pays a
 * page fault per 4 KiB.  Any thread may free a block (a tensor dies
 * anywhere), so the cache has its own mutex.
 *
 * A host publication's bytes are copied into a block at the call (a
 * snapshot, ec_snapshot()): the caller may then change, resize or free
 * the tensor, and what is written is still its value at the call.  The
 * block goes back to the cache once the write is reaped.
 *
 * The DLPack structures are declared here as the DLPack ABI (v0.x) lays
 * them out; no header of DLPack or of PyTorch is needed to build.
 */
#include "buffer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int32_t device_type; /* kDLCPU = 1 */
  int32_t device_id;
} dl_device;

typedef struct {
  uint8_t code; /* kDLFloat = 2, kDLBfloat = 4, kDLUInt = 1 */
  uint8_t bits;
  uint16_t lanes;
} dl_dtype;

typedef struct {
  void *data;
  dl_device device;
  int32_t ndim;
  dl_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
  dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct block {
  dl_managed mt;
  int64_t shape[2];
  int64_t strides[2];
  size_t cap; /* bytes of matrix the block can hold */
} block;

/* Where the matrix starts: the header and the lookup's headroom (the
 * object header a whole-object read puts in front of the matrix,
 * encache_allocator.headroom) rounded up to 64 bytes. */
#define BLOCK_DATA                                                            \
  ((sizeof(block) + ENCACHE_HEADER_SIZE + 63) & ~(size_t)63)

static void *block_data(block *b) { return (char *)b + BLOCK_DATA; }

#define BLOCK_CACHE_SLOTS 16

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static block *cached[BLOCK_CACHE_SLOTS];
static size_t cached_n, cached_bytes, block_cache_max = (size_t)64 << 20;

/* The smallest cached block that holds nbytes without wasting more than
 * half of itself, taken out of the cache; NULL if none. */
static block *cache_take(size_t nbytes) {
  block *b = NULL;
  size_t at = 0;
  pthread_mutex_lock(&cache_mu);
  for (size_t k = 0; k < cached_n; k++)
    if (cached[k]->cap >= nbytes && cached[k]->cap / 2 <= nbytes &&
        (b == NULL || cached[k]->cap < b->cap)) {
      b = cached[k];
      at = k;
    }
  if (b != NULL) {
    cached[at] = cached[--cached_n];
    cached_bytes -= b->cap;
  }
  pthread_mutex_unlock(&cache_mu);
  return b;
}

static void block_free(block *b) {
  pthread_mutex_lock(&cache_mu);
  int keep = cached_n < BLOCK_CACHE_SLOTS &&
             b->cap <= block_cache_max - cached_bytes &&
             cached_bytes <= block_cache_max;
  if (keep) {
    cached[cached_n++] = b;
    cached_bytes += b->cap;
  }
  pthread_mutex_unlock(&cache_mu);
  if (!keep)
    free(b);
}

/* fork(): the child must not inherit the mutex held by another thread. */
static void cache_lock(void) { pthread_mutex_lock(&cache_mu); }
static void cache_unlock(void) { pthread_mutex_unlock(&cache_mu); }

int ec_block_cache_init(void) {
  return pthread_atfork(cache_lock, cache_unlock, cache_unlock);
}

size_t ec_block_cache_set(size_t max_bytes) {
  pthread_mutex_lock(&cache_mu);
  size_t old = block_cache_max;
  block_cache_max = max_bytes;
  block *evicted[BLOCK_CACHE_SLOTS];
  size_t n = 0;
  while (cached_n > 0 && cached_bytes > max_bytes) {
    evicted[n] = cached[--cached_n];
    cached_bytes -= evicted[n++]->cap;
  }
  pthread_mutex_unlock(&cache_mu);
  while (n > 0)
    free(evicted[--n]);
  return old;
}

int ec_block_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **blk) {
  (void)ctx;
  (void)i;
  (void)c;
  if (nbytes > SIZE_MAX - BLOCK_DATA - 4096)
    return ENCACHE_ENOMEM;
  block *b = cache_take((size_t)nbytes);
  if (b == NULL) {
    size_t cap = ((size_t)nbytes + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 64, BLOCK_DATA + cap) != 0)
      return ENCACHE_ENOMEM;
    b = p;
    b->cap = cap;
  }
  size_t cap = b->cap;
  memset(b, 0, sizeof(block));
  b->cap = cap;
  *blk = b;
  *data = block_data(b);
  return 0;
}

void ec_block_release(void *ctx, size_t i, void *data, void *blk) {
  (void)ctx;
  (void)i;
  (void)data;
  block_free(blk);
}

/* A snapshot's storage release: its block goes back (any thread). */
static void snapshot_release(void *blk) { block_free(blk); }

int ec_snapshot(const void *src, uint64_t nbytes, encache_storage **out,
                const void **copy) {
  void *data, *blk;
  int rc = ec_block_alloc(NULL, 0, NULL, nbytes, &data, &blk);
  if (rc < 0)
    return rc;
  memcpy(data, src, (size_t)nbytes);
  if ((rc = encache_storage_new(data, nbytes, snapshot_release, blk, out)) < 0)
    block_free(blk);
  *copy = data;
  return rc;
}

static void block_deleter(dl_managed *mt) { block_free((block *)mt); }

/* "dltensor" capsules not consumed by a framework free their block. */
static void capsule_destructor(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor"))
    return; /* consumed ("used_dltensor"): the framework owns the block */
  dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
  if (mt != NULL)
    mt->deleter(mt);
}

static dl_dtype dl_dtype_of(int dtype) {
  switch (dtype) {
  case ENCACHE_FLOAT16:
    return (dl_dtype){2, 16, 1};
  case ENCACHE_BFLOAT16:
    return (dl_dtype){4, 16, 1};
  default:
    return (dl_dtype){2, 32, 1};
  }
}

static PyObject *wrap_torch(block *b, int dtype, uint64_t rows,
                            uint64_t cols) {
  b->shape[0] = (int64_t)rows;
  b->shape[1] = (int64_t)cols;
  b->strides[0] = (int64_t)cols;
  b->strides[1] = 1;
  b->mt.dl_tensor = (dl_tensor){.data = block_data(b),
                                .device = {1, 0},
                                .ndim = 2,
                                .dtype = dl_dtype_of(dtype),
                                .shape = b->shape,
                                .strides = b->strides};
  b->mt.deleter = block_deleter;
  PyObject *cap = PyCapsule_New(&b->mt, "dltensor", capsule_destructor);
  if (cap == NULL) {
    block_free(b);
    return NULL;
  }
  PyObject *t = PyObject_CallOneArg(ec_from_dlpack, cap);
  Py_DECREF(cap); /* consumed: the tensor owns the block; else freed here */
  return t;
}

/* ----------------------------------------------------------------- Buffer */

typedef struct {
  PyObject_HEAD
  block *blk;
  int dtype;
  Py_ssize_t shape[2];
  Py_ssize_t strides[2];
} buffer;

static void buffer_dealloc(PyObject *self) {
  block_free(((buffer *)self)->blk);
  Py_TYPE(self)->tp_free(self);
}

static int buffer_get(PyObject *self, Py_buffer *view, int flags) {
  buffer *b = (buffer *)self;
  Py_ssize_t item = (Py_ssize_t)encache_dtype_size(b->dtype);
  view->obj = Py_NewRef(self);
  view->buf = block_data(b->blk);
  view->len = b->shape[0] * b->shape[1] * item;
  view->readonly = 0;
  view->itemsize = item;
  /* NumPy has no bfloat16: its elements are shown as raw 16-bit words. */
  static char formats[][2] = {"f", "e", "H"};
  view->format = !(flags & PyBUF_FORMAT)            ? NULL
                 : b->dtype == ENCACHE_FLOAT32 ? formats[0]
                 : b->dtype == ENCACHE_FLOAT16 ? formats[1]
                                               : formats[2];
  view->ndim = 2;
  view->shape = (flags & PyBUF_ND) ? b->shape : NULL;
  view->strides = (flags & PyBUF_STRIDES) ? b->strides : NULL;
  view->suboffsets = NULL;
  view->internal = NULL;
  return 0;
}

static PyBufferProcs buffer_procs = {.bf_getbuffer = buffer_get};

static PyObject *buffer_repr(PyObject *self) {
  buffer *b = (buffer *)self;
  return PyUnicode_FromFormat("<encache.Buffer %s %zdx%zd>",
                              encache_dtype_name(b->dtype), b->shape[0],
                              b->shape[1]);
}

static PyObject *buffer_dtype(PyObject *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(encache_dtype_name(((buffer *)self)->dtype));
}

static PyObject *buffer_shape(PyObject *self, void *closure) {
  (void)closure;
  buffer *b = (buffer *)self;
  return Py_BuildValue("(nn)", b->shape[0], b->shape[1]);
}

static PyObject *buffer_address(PyObject *self, void *closure) {
  (void)closure;
  return PyLong_FromVoidPtr(block_data(((buffer *)self)->blk));
}

static PyGetSetDef buffer_getset[] = {
    {"dtype", buffer_dtype, NULL, "the element type's name", NULL},
    {"shape", buffer_shape, NULL, "(rows, cols)", NULL},
    {"address", buffer_address, NULL, "where the matrix lies in memory",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject buffer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache.Buffer",
    .tp_basicsize = sizeof(buffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A hit's matrix in memory the binding allocated (buffer "
              "protocol: memoryview(b), numpy.asarray(b)).",
    .tp_dealloc = buffer_dealloc,
    .tp_as_buffer = &buffer_procs,
    .tp_repr = buffer_repr,
    .tp_getset = buffer_getset,
};

int ec_buffer_register(PyObject *m) {
  return PyType_Ready(&buffer_type) < 0 ||
                 PyModule_AddObjectRef(m, "Buffer",
                                       (PyObject *)&buffer_type) < 0
             ? -1
             : 0;
}

PyObject *ec_block_wrap(void *blk, int output, int dtype, uint64_t rows,
                        uint64_t cols) {
  if (output == OUT_TORCH)
    return wrap_torch(blk, dtype, rows, cols);
  buffer *b = PyObject_New(buffer, &buffer_type);
  if (b == NULL) {
    block_free(blk);
    return NULL;
  }
  Py_ssize_t item = (Py_ssize_t)encache_dtype_size(dtype);
  b->blk = blk;
  b->dtype = dtype;
  b->shape[0] = (Py_ssize_t)rows;
  b->shape[1] = (Py_ssize_t)cols;
  b->strides[0] = (Py_ssize_t)cols * item;
  b->strides[1] = item;
  if (output == OUT_BUFFER)
    return (PyObject *)b;
  PyObject *arr = PyObject_CallOneArg(ec_as_array, (PyObject *)b);
  Py_DECREF(b);
  return arr;
}
