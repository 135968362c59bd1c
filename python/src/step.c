/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.c: Step, an open encache_step with the results of its lookups,
 * and its publications.
 *
 * A step keeps, per backing storage it published from, one
 * encache_storage (key: the storage's address and size), so that views of
 * one storage published on the step share one budget charge.  The step
 * holds one reference to each until it closes; every queued publication
 * holds another.  The storage's release drops the Python reference that
 * kept the memory alive; the library runs it on the thread that reaps
 * (lookup, publish, flush, close), never on its worker.
 */
#include "ext.h"

/* ------------------------------------------------------------------ Step */

PyObject *ec_step_new(handle *h) {
  if (ec_handle_usable(h) < 0)
    return NULL;
  step *s = PyObject_New(step, &ec_step_type);
  if (s == NULL)
    return NULL;
  s->owner = NULL;
  s->st = NULL;
  s->results = PyList_New(0);
  s->storages = PyDict_New();
  if (s->results == NULL || s->storages == NULL) {
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
  PyDict_Clear(s->storages); /* drops the step's storage references */
  Py_DECREF(h);
}

static void step_dealloc(PyObject *self) {
  step *s = (step *)self;
  if (s->storages != NULL)
    step_close_now(s);
  Py_XDECREF(s->results);
  Py_XDECREF(s->storages);
  PyObject_Free(self);
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

static void release_object(void *ctx) {
  PyGILState_STATE g = PyGILState_Ensure();
  Py_DECREF((PyObject *)ctx);
  PyGILState_Release(g);
}

static void storage_capsule_free(PyObject *cap) {
  encache_storage_unref(PyCapsule_GetPointer(cap, "encache.storage"));
}

/* The step's encache_storage of [base, base + nbytes), made on first use
 * with a reference to `keep`, which holds that memory; NULL if raised. */
static encache_storage *storage_of(step *s, unsigned long long base,
                                   unsigned long long nbytes,
                                   PyObject *keep) {
  PyObject *key = Py_BuildValue("(KK)", base, nbytes);
  if (key == NULL)
    return NULL;
  PyObject *cap = PyDict_GetItemWithError(s->storages, key);
  if (cap != NULL) {
    Py_DECREF(key);
    return PyCapsule_GetPointer(cap, "encache.storage");
  }
  encache_storage *st = NULL;
  int rc = PyErr_Occurred()
               ? -1
               : encache_storage_new((const void *)(uintptr_t)base, nbytes,
                                     release_object, keep, &st);
  if (rc == 0) {
    Py_INCREF(keep); /* released by the storage's last reference */
    cap = PyCapsule_New(st, "encache.storage", storage_capsule_free);
    if (cap == NULL)
      encache_storage_unref(st);
    else if (PyDict_SetItem(s->storages, key, cap) < 0)
      st = NULL; /* the capsule below drops the reference */
    Py_XDECREF(cap);
  } else if (rc < 0 && !PyErr_Occurred())
    ec_raise(rc, "a publication's storage");
  Py_DECREF(key);
  return rc == 0 ? st : NULL;
}

/* Publishes view on s under id; the library's answer, or raised. */
static PyObject *publish_locked(step *s, handle *h, const char *id,
                                const encache_tensor *view,
                                encache_storage *storage) {
  char msg[1024] = "";
  int rc = 0;
  EC_LOCKED(h, rc,
            rc = s->st == NULL ? ENCACHE_ECLOSED
                               : encache_publish(s->st, id, view, storage);
            if (rc < 0 && rc != ENCACHE_ECLOSED)
              PyOS_snprintf(msg, sizeof(msg), "%s", encache_errmsg(h->ec)));
  if (rc < 0)
    return ec_raise(rc, rc == ENCACHE_ECLOSED
                            ? "the step or its Cache is closed"
                            : msg);
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

static PyObject *step_publish(PyObject *self, PyObject *args) {
  step *s = (step *)self;
  PyObject *id, *tensor, *shape, *strides;
  unsigned long long data, base, nbytes;
  int dtype;
  if (!PyArg_ParseTuple(args, "UO:publish", &id, &tensor) ||
      ec_step_usable(s) < 0)
    return NULL;
  PyObject *d = PyObject_CallOneArg(ec_describe, tensor);
  if (d == NULL)
    return NULL;
  PyObject *out = NULL;
  int64_t dims[8], steps[8];
  Py_ssize_t ndim, nstrides = 0;
  if (!PyArg_ParseTuple(d, "KiO!OKK", &data, &dtype, &PyTuple_Type, &shape,
                        &strides, &base, &nbytes) ||
      (ndim = int64s(shape, dims, 8)) < 0 ||
      (strides != Py_None && (nstrides = int64s(strides, steps, 8)) < 0))
    goto done;
  encache_tensor view = {.size = sizeof(view),
                         .data = (const void *)(uintptr_t)data,
                         .dtype = dtype,
                         .ndim = ndim > 8 ? 9 : (int)ndim,
                         .shape = dims,
                         .strides = strides == Py_None ? NULL : steps};
  if (strides != Py_None && nstrides != ndim) {
    ec_invalid("strides %R do not match shape %R", strides, shape);
    goto done;
  }
  encache_storage *st = storage_of(s, base, nbytes, tensor);
  const char *key = st != NULL ? PyUnicode_AsUTF8(id) : NULL;
  if (key != NULL) {
    handle *h = (handle *)Py_NewRef(s->owner);
    out = publish_locked(s, h, key, &view, st);
    Py_DECREF(h);
  }
done:
  Py_DECREF(d);
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
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A step: the items of one encoder step, their results and "
              "their publications (Cache.lookup() opens one).",
    .tp_dealloc = step_dealloc,
    .tp_as_sequence = &step_seq,
    .tp_iter = step_iter,
    .tp_methods = step_methods,
    .tp_getset = step_getset,
};
