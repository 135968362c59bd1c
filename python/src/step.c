/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.c: Step, an open encache_step with the results of its lookups,
 * and its publications.
 *
 * A host publication is a snapshot: its bytes are copied at the call into
 * a block of the binding's (buffer.c), whose storage the queued write
 * holds, so nothing the caller does to the tensor afterwards can change
 * what is written.  A CUDA publication's bytes are copied on its stream
 * by the library at the call; its storage (storage.c: one per backing
 * storage, views charged once) keeps the device memory until the write
 * is reaped.  A storage's release drops the Python reference that kept
 * the memory alive; the library runs it on the thread that reaps
 * (lookup, publish, flush, close), never on its worker.
 */
#include "ext.h"

/* ------------------------------------------------------------------ Step */

PyObject *ec_step_new(handle *h) {
  if (ec_handle_usable(h) < 0)
    return NULL;
  step *s = PyObject_GC_New(step, &ec_step_type);
  if (s == NULL)
    return NULL;
  s->owner = NULL;
  s->st = NULL;
  s->results = PyList_New(0);
  if (s->results == NULL) {
    Py_DECREF(s);
    return NULL;
  }
  char msg[512] = "";
  int rc = 0;
  encache_step *st = NULL;
  EC_LOCKED(h, rc, rc = encache_step_open(h->ec, &st);
            if (rc < 0) PyOS_snprintf(msg, sizeof(msg), "%s",
                                      encache_errmsg(h->ec)));
  if (rc < 0) {
    Py_DECREF(s);
    return ec_raise(rc, msg);
  }
  s->owner = (handle *)Py_NewRef(h);
  s->st = st;
  PyObject_GC_Track(s);
  return (PyObject *)s;
}

int ec_step_usable(step *s) {
  if (s->owner == NULL) {
    ec_raise(ENCACHE_ECLOSED, "the step is closed");
    return -1;
  }
  return ec_handle_usable(s->owner);
}

static void step_close_now(step *s) {
  handle *h = s->owner;
  if (h == NULL)
    return;
  s->owner = NULL;
  int rc = 0;
  /* A closed handle closed its steps; a handle of the parent process is
   * left alone in a child; a step freed by code the handle runs (a
   * collection inside its log callable) is left to the handle's close,
   * since its lock is held. */
  if (h->fork_gen == ec_fork_gen &&
      h->locked_by != PyThread_get_thread_ident())
    EC_LOCKED(h, rc, encache_step_close(s->st); s->st = NULL);
  (void)rc;
  s->st = NULL;
  Py_DECREF(h);
}

static int step_traverse(PyObject *self, visitproc visit, void *arg) {
  step *s = (step *)self;
  Py_VISIT(s->owner);
  Py_VISIT(s->results);
  return 0;
}

/* A step in a reference cycle (a result's tensor referring to it) is
 * closed when the cycle is collected; the results' own clear breaks the
 * cycle, so the step keeps its list (its methods still work). */
static int step_clear(PyObject *self) {
  step_close_now((step *)self);
  return 0;
}

static void step_dealloc(PyObject *self) {
  PyObject_GC_UnTrack(self);
  step_close_now((step *)self);
  Py_XDECREF(((step *)self)->results);
  PyObject_GC_Del(self);
}

static PyObject *step_close(PyObject *self, PyObject *args) {
  (void)args;
  step_close_now((step *)self);
  Py_RETURN_NONE;
}

static PyObject *step_enter(PyObject *self, PyObject *args) {
  (void)args;
  return Py_NewRef(self);
}

static PyObject *step_exit(PyObject *self, PyObject *args) {
  (void)args;
  step_close_now((step *)self);
  Py_RETURN_FALSE;
}

/* ------------------------------------------------------------ publication */

/* Publishes view under id on s (of h), with the storage `snap` (a host
 * snapshot: its reference is taken over) or else that of prep's memory;
 * the library's answer, or raised. */
static PyObject *publish_locked(step *s, handle *h, const char *id,
                                const encache_tensor *view, ec_pub *prep,
                                encache_storage *snap) {
  char msg[1024] = "";
  int rc = 0;
  EC_LOCKED(h, rc, encache_storage *st = snap;
            snap = NULL; /* st's now */
            rc = s->st == NULL ? ENCACHE_ECLOSED
                 : st != NULL  ? 0
                               : ec_pub_acquire(h, &prep, &st);
            if (rc < 0) encache_storage_unref(st); /* NULL: a no-op */
            if (rc == 0) {
              rc = encache_publish(s->st, id, view, st);
              /* A queued write holds its own reference. */
              encache_storage_unref(st);
            }
            if (rc < 0 && rc != ENCACHE_ECLOSED)
              PyOS_snprintf(msg, sizeof(msg), "%s", encache_errmsg(h->ec)));
  ec_pub_discard(prep);
  encache_storage_unref(snap); /* the handle closed meanwhile: not taken */
  if (rc < 0)
    return ec_raise(rc, rc == ENCACHE_ECLOSED
                            ? "the step or its Cache is closed"
                            : msg);
  if (rc > 0 && rc < 32 && !(h->skips_logged & (1u << rc))) {
    /* A skipped publication is counted (stats().published_skipped) and,
     * the first time for each reason, logged: a tensor the encoder makes
     * the same way every time is otherwise skipped silently forever. */
    h->skips_logged |= 1u << rc;
    PyOS_snprintf(msg, sizeof(msg),
                  "publication of \"%s\" skipped: %s; later publications "
                  "skipped for this reason are counted in "
                  "stats().published_skipped, not logged",
                  id, encache_skip_name(rc));
    ec_log(h, msg);
  }
  if (rc >= PyTuple_GET_SIZE(ec_skips))
    return PyLong_FromLong(rc);
  return Py_NewRef(PyTuple_GET_ITEM(ec_skips, rc));
}

/* int64 values of a tuple of ints into out[0..cap); its length or -1. */
static Py_ssize_t int64s(PyObject *t, int64_t *out, Py_ssize_t cap) {
  if (!PyTuple_Check(t))
    return ec_invalid("expected a tuple of ints"), -1;
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  for (Py_ssize_t i = 0; i < n && i < cap; i++) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    if (out[i] == -1 && PyErr_Occurred())
      return -1;
  }
  return n;
}

/* publish(id, tensor): the package's describe(tensor) gives (data, dtype
 * code or -1, shape, strides, storage base, storage bytes, the object
 * that keeps the storage alive, device kind, device index, stream). */
static PyObject *step_publish(PyObject *self, PyObject *args) {
  step *s = (step *)self;
  PyObject *id, *tensor, *shape, *strides, *keep;
  unsigned long long data, base, nbytes, stream;
  int dtype, device, device_index;
  if (!PyArg_ParseTuple(args, "UO:publish", &id, &tensor) ||
      ec_step_usable(s) < 0)
    return NULL;
  handle *h = (handle *)Py_NewRef(s->owner);
  PyObject *d = PyObject_CallOneArg(ec_describe, tensor), *out = NULL;
  int64_t dims[8], steps[8];
  Py_ssize_t ndim = 0, nstrides = 0;
  ec_pub *prep = NULL;
  const char *key = NULL;
  if (d == NULL ||
      !PyArg_ParseTuple(d, "KiO!OKKOiiK", &data, &dtype, &PyTuple_Type,
                        &shape, &strides, &base, &nbytes, &keep, &device,
                        &device_index, &stream) ||
      (ndim = int64s(shape, dims, 8)) < 0 ||
      (strides != Py_None && (nstrides = int64s(strides, steps, 8)) < 0) ||
      (key = ec_key_text(id, "the id")) == NULL)
    goto done;
  if (strides != Py_None && nstrides != ndim) {
    ec_invalid("%zd strides for %zd dimensions", nstrides, ndim);
    goto done;
  }
  /* describe() ran Python code, which may have closed the step. */
  if (s->owner != h) {
    ec_raise(ENCACHE_ECLOSED, "the step was closed during publish");
    goto done;
  }
  encache_tensor view = {.size = sizeof(view),
                         .data = (const void *)(uintptr_t)data,
                         .dtype = dtype,
                         .ndim = ndim > 8 ? 9 : (int)ndim,
                         .shape = dims,
                         .strides = strides == Py_None ? NULL : steps,
                         .device = device,
                         .device_index = device_index,
                         .stream = (void *)(uintptr_t)stream};
  /* Host memory is copied now: whatever the caller does to the tensor
   * afterwards (resize_, set_, in-place writes, even freeing it), the
   * bytes written are those of the call.  A view the library will refuse
   * (not a contiguous matrix of a known dtype) is passed as it is: it is
   * never read.  CUDA memory is copied on its stream at the call, by the
   * library. */
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  uint64_t size = 0;
  encache_storage *snap = NULL;
  if (device == ENCACHE_DEVICE_HOST && encache_header_encode(&view, hdr) == 0 &&
      encache_payload_size(dtype, (uint64_t)dims[0], (uint64_t)dims[1],
                           &size) == 0 && size > 0) {
    int rc = ec_snapshot(view.data, size, &snap, &view.data);
    if (rc < 0) {
      ec_raise(rc, "publish: no memory for the copy of the output");
      goto done;
    }
    out = publish_locked(s, h, key, &view, NULL, snap);
  } else if ((prep = ec_pub_prepare(h, keep, (uintptr_t)base, nbytes)) != NULL)
    out = publish_locked(s, h, key, &view, prep, NULL);
done:
  Py_XDECREF(d);
  Py_DECREF(h);
  return out;
}

/* ------------------------------------------------------------ the type */

static PyObject *step_lookup(PyObject *self, PyObject *items) {
  return ec_step_lookup((step *)self, items);
}

static PyObject *step_results(PyObject *self, void *c) {
  (void)c;
  return PyList_GetSlice(((step *)self)->results, 0, PY_SSIZE_T_MAX);
}

static PyObject *step_hits(PyObject *self, void *c) {
  (void)c;
  PyObject *l = ((step *)self)->results, *d = PyDict_New();
  for (Py_ssize_t i = 0; d != NULL && i < PyList_GET_SIZE(l); i++) {
    PyObject *r = PyList_GET_ITEM(l, i);
    PyObject *t = PyObject_GetAttrString(r, "tensor");
    PyObject *id = PyObject_GetAttrString(r, "id");
    if (t == NULL || id == NULL ||
        (t != Py_None && PyDict_SetItem(d, id, t) < 0))
      Py_CLEAR(d);
    Py_XDECREF(t);
    Py_XDECREF(id);
  }
  return d;
}

static PyObject *step_misses(PyObject *self, void *c) {
  (void)c;
  PyObject *l = ((step *)self)->results, *out = PyList_New(0);
  for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(l); i++) {
    PyObject *r = PyList_GET_ITEM(l, i);
    PyObject *t = PyObject_GetAttrString(r, "tensor");
    if (t == NULL || (t == Py_None && PyList_Append(out, r) < 0))
      Py_CLEAR(out);
    Py_XDECREF(t);
  }
  return out;
}

static PyObject *step_closed(PyObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(((step *)self)->owner == NULL);
}

static Py_ssize_t step_len(PyObject *self) {
  return PyList_GET_SIZE(((step *)self)->results);
}

static PyObject *step_item(PyObject *self, Py_ssize_t i) {
  return PySequence_GetItem(((step *)self)->results, i);
}

static PyObject *step_iter(PyObject *self) {
  return PyObject_GetIter(((step *)self)->results);
}

static PySequenceMethods step_seq = {.sq_length = step_len,
                                     .sq_item = step_item};

static PyMethodDef step_methods[] = {
    {"lookup", step_lookup, METH_O,
     "lookup(items) -> list[Result]: looks more items up on this step."},
    {"publish", step_publish, METH_VARARGS,
     "publish(id, tensor) -> Skip: queues tensor for publication under id "
     "(no copy; returns Skip.QUEUED or why it was skipped)."},
    {"close", step_close, METH_NOARGS, "Closes the step; idempotent."},
    {"__enter__", step_enter, METH_NOARGS, NULL},
    {"__exit__", step_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef step_getset[] = {
    {"results", step_results, NULL, "list[Result], in item order", NULL},
    {"hits", step_hits, NULL, "dict: id -> output, for the hits", NULL},
    {"misses", step_misses, NULL, "list[Result] that are not hits", NULL},
    {"closed", step_closed, NULL, "True once closed", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ec_step_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache.Step",
    .tp_basicsize = sizeof(step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = step_traverse,
    .tp_clear = step_clear,
    .tp_doc = "A step: the items of one encoder step, their results and "
              "their publications (Cache.lookup() opens one).",
    .tp_dealloc = step_dealloc,
    .tp_as_sequence = &step_seq,
    .tp_iter = step_iter,
    .tp_methods = step_methods,
    .tp_getset = step_getset,
};
