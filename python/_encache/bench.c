/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench.c: the benchmark's baseline (bench.h), the same lookup made from
 * C alone (python/encache/bench.py): on a Cache's own handle, for the same
 * ids, each iteration opens a step, looks the ids up into destinations from
 * the binding's own allocator (buffer.c, so that both sides get memory
 * the same way and the difference is the binding's work), frees them,
 * closes the step.  Measured in the same process and run as the Python
 * lookups.
 */
#include "bench.h"

#include "buffer.h"
#include "handle_type.h"

#include <stdlib.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One iteration; the number of hits or a negative code. */
static int one(encache *ec, const encache_candidate *c, size_t n,
               encache_result *res) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.alloc = ec_block_alloc;
  a.release = ec_block_release;
  encache_step *st = NULL;
  int rc = encache_step_open(ec, &st);
  if (rc < 0)
    return rc;
  res[0].size = sizeof(encache_result);
  rc = encache_lookup(st, c, n, &a, res);
  for (int i = 0; rc > 0 && i < (int)n; i++)
    if (res[i].outcome == ENCACHE_HIT)
      ec_block_release(NULL, (size_t)i, res[i].data, res[i].handle);
  encache_step_close(st);
  return rc;
}

/* _bench_c_lookup(cache, ids, dtype, rows, cols, iterations) -> list of
 * seconds per iteration. */
PyObject *ec_bench_c_lookup(PyObject *self, PyObject *args) {
  (void)self;
  handle *h;
  PyObject *ids;
  int dtype, iterations;
  unsigned long long rows, cols;
  if (!PyArg_ParseTuple(args, "O!O!iKKi", &ec_handle_type, &h, &PyList_Type,
                        &ids, &dtype, &rows, &cols, &iterations) ||
      ec_handle_usable(h) < 0)
    return NULL;
  size_t n = (size_t)PyList_GET_SIZE(ids);
  if (n == 0 || n > 64 || iterations < 1)
    return ec_invalid("1 to 64 ids and at least one iteration");
  encache_candidate c[64];
  encache_result res[64];
  for (size_t i = 0; i < n; i++) {
    c[i] = (encache_candidate)ENCACHE_CANDIDATE_INIT;
    c[i].id = ec_key_text(PyList_GET_ITEM(ids, i), "an id");
    if (c[i].id == NULL)
      return NULL;
    c[i].dtype = dtype;
    c[i].rows = rows;
    c[i].cols = cols;
  }
  double *t = PyMem_Malloc(sizeof(double) * (size_t)iterations);
  if (t == NULL)
    return PyErr_NoMemory();
  int rc = 0;
  EC_LOCKED(h, rc, for (int k = 0; k < iterations && rc >= 0; k++) {
    double t0 = now();
    rc = one(h->ec, c, n, res);
    t[k] = now() - t0;
  });
  PyObject *out = rc < 0 ? ec_raise(rc, NULL) : PyList_New(iterations);
  for (int k = 0; out != NULL && k < iterations; k++)
    PyList_SET_ITEM(out, k, PyFloat_FromDouble(t[k]));
  PyMem_Free(t);
  return out;
}

static void no_release(void *ctx) { (void)ctx; }

/* _bench_c_publish(cache, prefix, count, rows, cols, batch) -> list of
 * seconds per encache_publish() call: `count` outputs (float32 rows x cols,
 * ids PREFIX0, PREFIX1, ...) in batches of `batch`, each batch looked up
 * first (misses) and flushed after, untimed. */
PyObject *ec_bench_c_publish(PyObject *self, PyObject *args) {
  (void)self;
  handle *h;
  const char *prefix;
  int count, batch;
  unsigned long long rows, cols;
  if (!PyArg_ParseTuple(args, "O!siKKi", &ec_handle_type, &h, &prefix,
                        &count, &rows, &cols, &batch) ||
      ec_handle_usable(h) < 0)
    return NULL;
  if (count < 1 || batch < 1 || batch > 64 || rows == 0 || cols == 0 ||
      rows > (1u << 20) || cols > (1u << 20) || rows * cols > (1u << 28))
    return ec_invalid("count >= 1, 1 <= batch <= 64, a matrix of at most "
                      "2^28 elements");
  size_t nbytes = (size_t)(rows * cols * 4);
  double *t = PyMem_Malloc(sizeof(double) * (size_t)count);
  void *data = calloc(1, nbytes);
  encache_storage *storage = NULL;
  if (t == NULL || data == NULL ||
      encache_storage_new(data, nbytes, no_release, NULL, &storage) < 0) {
    PyMem_Free(t);
    free(data);
    return PyErr_NoMemory();
  }
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor view = {.size = sizeof(view), .data = data,
                         .dtype = ENCACHE_FLOAT32, .ndim = 2, .shape = shape};
  int rc = 0, flushed = -1;
  EC_LOCKED(h, rc, for (int k = 0; k < count && rc >= 0; k += batch) {
    char ids[64][64];
    encache_candidate c[64];
    encache_result res[64];
    int n = count - k < batch ? count - k : batch;
    for (int i = 0; i < n; i++) {
      snprintf(ids[i], sizeof(ids[i]), "%s%d", prefix, k + i);
      c[i] = (encache_candidate)ENCACHE_CANDIDATE_INIT;
      c[i].id = ids[i];
      c[i].dtype = ENCACHE_FLOAT32;
      c[i].rows = rows;
      c[i].cols = cols;
    }
    encache_step *st = NULL;
    if ((rc = encache_step_open(h->ec, &st)) < 0)
      break;
    res[0].size = sizeof(encache_result);
    encache_allocator a = ENCACHE_ALLOCATOR_INIT;
    a.alloc = ec_block_alloc;
    a.release = ec_block_release;
    rc = encache_lookup(st, c, (size_t)n, &a, res);
    for (int i = 0; rc >= 0 && i < n; i++) {
      if (res[i].outcome == ENCACHE_HIT)
        ec_block_release(NULL, (size_t)i, res[i].data, res[i].handle);
      double t0 = now();
      rc = encache_publish(st, ids[i], &view, storage);
      t[k + i] = now() - t0;
    }
    encache_step_close(st);
    if (rc >= 0)
      rc = encache_flush(h->ec);
  }
            /* Whatever happened, nothing may read data once it is freed. */
            flushed = encache_flush(h->ec));
  encache_storage_unref(storage);
  if (flushed == 0 || rc == ENCACHE_ECLOSED) /* closed: nothing queued */
    free(data); /* else (poisoned) a write may still read it: kept */
  PyObject *out = rc < 0 ? ec_raise(rc, NULL) : PyList_New(count);
  for (int k = 0; out != NULL && k < count; k++)
    PyList_SET_ITEM(out, k, PyFloat_FromDouble(t[k]));
  PyMem_Free(t);
  return out;
}
