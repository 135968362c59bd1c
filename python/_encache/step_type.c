/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step_type.c: Step (step_type.h), an open encache_step with the results
 * of its lookups, and its publications.
 *
 * A host publication is a snapshot: its bytes are copied at the call into
 * a block of the binding's (buffer.c), whose storage the queued write
 * holds, so nothing the caller does to the tensor afterwards can change
 * what is written.  A CUDA publication's bytes are copied on its stream
 * by the library at the call; its storage (storage.c: one per backing
 * storage, views charged once) keeps the device memory until the write
 * is reaped.  A storage's release drops the Python reference that kept
 * the memory alive; the library runs it on the thread that reaps
 * (lookup, publish, flush, close, or the lookup thread for a lookup
 * started with wait=False), never on its worker.
 *
 * A step's lookup started with wait=False (lookup.c) is pending until
 * wait() collects it; whatever reads the results (results, hits, misses,
 * len, iteration) and publish() collect it first, and closing the step
 * gives it up.
 */
#include "step_type.h"

#include "buffer.h"
#include "lookup.h"
#include "result.h"
#include "storage.h"

#include <poll.h>

/* ------------------------------------------------------------------ Step */

PyTypeObject *ec_step_class;

void ec_step_set_class(PyTypeObject *cls) {
  Py_INCREF(cls);
  Py_XSETREF(ec_step_class, cls);
}

PyObject *ec_step_new(handle *h) {
  if (ec_handle_usable(h) < 0)
    return NULL;
  /* The package's subclass (encache.Step: its asyncio part), once set. */
  PyTypeObject *type = ec_step_class != NULL ? ec_step_class : &ec_step_type;
  step *s = (step *)type->tp_alloc(type, 0); /* zeroed, tracked */
  if (s == NULL)
    return NULL;
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
  return (PyObject *)s;
}

/* Closes s.  A pending lookup (wait=False) is given up: the library's
 * close waits for it when it runs (with the GIL released) and drops it
 * when it is queued; its hits are then released.  The lookup has one
 * owner, decided here before the GIL is let go: a wait() running on
 * another thread (k->waiting) keeps it and frees it once it sees the
 * step closed; else the close does. */
void ec_step_close(step *s) {
  handle *h = s->owner;
  if (h == NULL)
    return;
  s->owner = NULL;
  ec_lookup *k = s->pending;
  s->pending = NULL;
  if (k != NULL && ec_lookup_hand_to_waiter(k))
    k = NULL;
  int rc = 0, poisoned = 1, closed = 0;
  /* A closed handle closed its steps; a handle of the parent process is
   * left alone in a child; a step freed by code the handle runs (a
   * collection inside its log callable) is left to the handle's close,
   * since its lock is held, or, on the lookup thread, its turn. */
  if (h->fork_gen == ec_fork_gen &&
      h->locked_by != PyThread_get_thread_ident() && ec_calling_back != h) {
    EC_LOCKED(h, rc, encache_step_close(s->st); s->st = NULL;
              if (k != NULL) {
                ec_lookup_collected_locked(h, k);
                poisoned = ec_handle_poisoned_locked(h);
              });
    closed = 1;
    if (rc == ENCACHE_ECLOSED)
      poisoned = h->closed_poisoned;
  }
  s->st = NULL;
  /* Not closed here (a child, or the handle's own code runs): the lookup
   * may still write into k until the handle's close, so k is left as it
   * is (a leak, in that rare case), never freed under it. */
  if (k != NULL && closed)
    ec_step_drop_pending(k, poisoned);
  else if (k != NULL && h->fork_gen != ec_fork_gen)
    ec_step_drop_pending(k, 1); /* no lookup thread in a child */
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
  ec_step_close((step *)self);
  return 0;
}

static void step_dealloc(PyObject *self) {
  PyObject_GC_UnTrack(self);
  ec_step_close((step *)self);
  Py_XDECREF(((step *)self)->results);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *step_close(PyObject *self, PyObject *args) {
  (void)args;
  ec_step_close((step *)self);
  Py_RETURN_NONE;
}

static PyObject *step_enter(PyObject *self, PyObject *args) {
  (void)args;
  return Py_NewRef(self);
}

static PyObject *step_exit(PyObject *self, PyObject *args) {
  (void)args;
  ec_step_close((step *)self);
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
      ec_step_usable(s) < 0 || ec_step_complete(s, -1) < 0)
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
   * (not a contiguous matrix of a known dtype, or not inside its storage:
   * one shrunk before the call) is passed as it is, with its storage: the
   * library checks it (encache_publish: Skip.OUTSIDE_STORAGE) and never
   * reads it.  CUDA memory is copied on its stream at the call, by the
   * library, after the same check. */
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  uint64_t size = 0;
  encache_storage *snap = NULL;
  if (device == ENCACHE_DEVICE_HOST && encache_header_encode(&view, hdr) == 0 &&
      encache_payload_size(dtype, (uint64_t)dims[0], (uint64_t)dims[1],
                           &size) == 0 && size > 0 &&
      data >= base && data - base <= nbytes && size <= nbytes - (data - base)) {
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

static PyObject *step_lookup(PyObject *self, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *items;
  int wait;
  if (ec_lookup_args(args, nargs, kwnames, &items, &wait) < 0)
    return NULL;
  return ec_step_lookup((step *)self, items, wait);
}

/* wait(timeout=None) -> bool */
static PyObject *step_wait(PyObject *self, PyObject *args, PyObject *kw) {
  static const char *names[] = {"timeout", NULL};
  PyObject *t = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", (char **)names, &t))
    return NULL;
  double timeout = -1;
  if (t != Py_None) {
    timeout = PyFloat_AsDouble(t);
    if (timeout == -1 && PyErr_Occurred())
      return NULL;
    if (!(timeout >= 0)) /* NaN too */
      return ec_invalid("wait: timeout %g is not None or a number of "
                        "seconds >= 0", timeout);
  }
  /* A closed step has nothing to wait for, but its lookup was given up:
   * say so, rather than "complete". */
  if (((step *)self)->owner == NULL)
    return ec_raise(ENCACHE_ECLOSED, "the step is closed");
  int rc = ec_step_complete((step *)self, timeout);
  if (rc < 0)
    return NULL;
  return PyBool_FromLong(rc);
}

/* Under h's lock: the step's fd, or a negative code. */
static int fd_locked(step *s) {
  return s->st == NULL ? ENCACHE_ECLOSED : encache_step_fd(s->st);
}

static PyObject *step_fileno(PyObject *self, PyObject *args) {
  (void)args;
  step *s = (step *)self;
  if (ec_step_usable(s) < 0)
    return NULL;
  int fd = 0;
  EC_LOCKED(s->owner, fd, fd = fd_locked(s));
  if (fd < 0)
    return ec_raise(fd, "the step's file descriptor");
  return PyLong_FromLong(fd);
}

/* Whether fd is readable now (a poll that waits for nothing). */
static int readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

/* True when no lookup is pending or the pending one has completed (its
 * fd is readable: a poll that consumes nothing). */
static PyObject *step_done(PyObject *self, void *c) {
  (void)c;
  step *s = (step *)self;
  if (s->pending == NULL)
    Py_RETURN_TRUE;
  if (ec_step_usable(s) < 0)
    return NULL;
  int rc = 0, ready = 0;
  EC_LOCKED(s->owner, rc, rc = fd_locked(s);
            if (rc >= 0) ready = readable(rc));
  if (rc < 0)
    return ec_raise(rc, "the step's file descriptor");
  return PyBool_FromLong(ready);
}

/* The Results, once a pending lookup is complete (waited for here). */
static PyObject *results_now(PyObject *self) {
  if (ec_step_complete((step *)self, -1) < 0)
    return NULL;
  return ((step *)self)->results;
}

static PyObject *step_results(PyObject *self, void *c) {
  (void)c;
  PyObject *l = results_now(self);
  return l != NULL ? PyList_GetSlice(l, 0, PY_SSIZE_T_MAX) : NULL;
}

/* The hits of the step's results (their fields read as they are, not
 * through attribute lookups: a step's hits are on the encoder's path). */
static PyObject *step_hits(PyObject *self, void *c) {
  (void)c;
  PyObject *l = results_now(self), *d = l != NULL ? PyDict_New() : NULL;
  for (Py_ssize_t i = 0; d != NULL && i < PyList_GET_SIZE(l); i++) {
    PyObject *id, *t = ec_result_hit(PyList_GET_ITEM(l, i), &id);
    if (t != NULL && PyDict_SetItem(d, id, t) < 0)
      Py_CLEAR(d);
  }
  return d;
}

static PyObject *step_misses(PyObject *self, void *c) {
  (void)c;
  PyObject *l = results_now(self), *out = l != NULL ? PyList_New(0) : NULL;
  for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(l); i++) {
    PyObject *id, *r = PyList_GET_ITEM(l, i);
    if (ec_result_hit(r, &id) == NULL && PyList_Append(out, r) < 0)
      Py_CLEAR(out);
  }
  return out;
}

static PyObject *step_closed(PyObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(((step *)self)->owner == NULL);
}

static Py_ssize_t step_len(PyObject *self) {
  PyObject *l = results_now(self);
  return l != NULL ? PyList_GET_SIZE(l) : -1;
}

static PyObject *step_item(PyObject *self, Py_ssize_t i) {
  PyObject *l = results_now(self);
  return l != NULL ? PySequence_GetItem(l, i) : NULL;
}

static PyObject *step_iter(PyObject *self) {
  PyObject *l = results_now(self);
  return l != NULL ? PyObject_GetIter(l) : NULL;
}

static PySequenceMethods step_seq = {.sq_length = step_len,
                                     .sq_item = step_item};

static PyMethodDef step_methods[] = {
    {"lookup", (PyCFunction)(void (*)(void))step_lookup,
     METH_FASTCALL | METH_KEYWORDS,
     "lookup(items, wait=True) -> list[Result]: looks more items up on "
     "this step; with wait=False, starts the lookup and returns the step "
     "(wait() collects it)."},
    {"wait", (PyCFunction)(void (*)(void))step_wait,
     METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> bool: completes the pending lookup (waits at "
     "most timeout seconds; None: without a bound, 0: a poll); False when "
     "it is still pending."},
    {"fileno", step_fileno, METH_NOARGS,
     "fileno() -> int: a descriptor readable once the pending lookup is "
     "complete (owned by the step)."},
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
    {"done", step_done, NULL,
     "True when no lookup is pending, or the pending one is complete "
     "(wait() then returns at once)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ec_step_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache.Step",
    .tp_basicsize = sizeof(step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
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

int ec_step_register(PyObject *m) {
  return PyType_Ready(&ec_step_type) < 0 ||
                 PyModule_AddObjectRef(m, "Step",
                                       (PyObject *)&ec_step_type) < 0
             ? -1
             : 0;
}
