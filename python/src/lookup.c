/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.c: Step.lookup(items): items to candidates, the library's lookup
 * with the GIL released, results to Result objects.
 *
 * An item is a tuple (encache.Item, or a plain one): id, dtype, shape
 * (rows, cols) and, optionally, device.  dtype and device objects (torch,
 * numpy, strings) are resolved once by the package's functions and cached
 * here by identity of value (dicts), so the common case costs two dict
 * lookups.  Host destinations come from buffer.c's allocator, which
 * needs no GIL; the destinations of CUDA items are made before the lookup
 * (with the GIL, by the package's device_empty: torch tensors from torch's
 * own allocator) and handed out by the allocator, so a miss costs a
 * tensor that is dropped.
 */
#include "ext.h"

#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#define STACK_ITEMS 16

/* ---------------------------------------------------------------- Result */

typedef struct {
  PyObject_HEAD
  PyObject *id;
  PyObject *tensor; /* HIT: the output; else None */
  PyObject *why;    /* str, or None for a HIT */
  int outcome;
  int verdict;
  encache_header found;
  void *address;    /* HIT: the destination the library filled */
} result;

static int result_traverse(PyObject *self, visitproc visit, void *arg) {
  result *r = (result *)self;
  Py_VISIT(r->id);
  Py_VISIT(r->tensor);
  Py_VISIT(r->why);
  return 0;
}

static int result_clear(PyObject *self) {
  result *r = (result *)self;
  Py_CLEAR(r->id);
  Py_CLEAR(r->tensor);
  Py_CLEAR(r->why);
  return 0;
}

static void result_dealloc(PyObject *self) {
  PyObject_GC_UnTrack(self);
  result_clear(self);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *result_outcome(PyObject *self, void *c) {
  (void)c;
  return Py_NewRef(PyTuple_GET_ITEM(ec_outcomes, ((result *)self)->outcome));
}

static PyObject *result_hit(PyObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(((result *)self)->outcome == ENCACHE_HIT);
}

static PyObject *result_verdict(PyObject *self, void *c) {
  (void)c;
  result *r = (result *)self;
  if (r->outcome != ENCACHE_INCOMPATIBLE)
    Py_RETURN_NONE;
  return PyUnicode_FromString(encache_verdict_name(r->verdict));
}

static PyObject *result_found(PyObject *self, void *c) {
  (void)c;
  result *r = (result *)self;
  if (r->outcome != ENCACHE_INCOMPATIBLE)
    Py_RETURN_NONE;
  return Py_BuildValue("(IKK)", r->found.dtype,
                       (unsigned long long)r->found.rows,
                       (unsigned long long)r->found.cols);
}

static PyObject *result_address(PyObject *self, void *c) {
  (void)c;
  result *r = (result *)self;
  if (r->address == NULL)
    Py_RETURN_NONE;
  return PyLong_FromVoidPtr(r->address);
}

static PyObject *result_repr(PyObject *self) {
  result *r = (result *)self;
  if (r->why == Py_None)
    return PyUnicode_FromFormat("<encache.Result %R %s>", r->id,
                                encache_outcome_name(r->outcome));
  return PyUnicode_FromFormat("<encache.Result %R %s: %S>", r->id,
                              encache_outcome_name(r->outcome), r->why);
}

static PyMemberDef result_members[] = {
    {"id", T_OBJECT, offsetof(result, id), READONLY, "the item's id"},
    {"tensor", T_OBJECT, offsetof(result, tensor), READONLY,
     "HIT: the output (a tensor, array or Buffer); else None"},
    {"why", T_OBJECT, offsetof(result, why), READONLY,
     "why it is not a HIT, in words; None for a HIT"},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef result_getset[] = {
    {"outcome", result_outcome, NULL, "an encache.Outcome", NULL},
    {"hit", result_hit, NULL, "True for a HIT", NULL},
    {"verdict", result_verdict, NULL,
     "INCOMPATIBLE: what differed (length, magic, dtype, shape)", NULL},
    {"found", result_found, NULL,
     "INCOMPATIBLE: (dtype code, rows, cols) of the header found", NULL},
    {"address", result_address, NULL,
     "HIT: the address the library filled (the output's own memory)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ec_result_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache.Result",
    .tp_basicsize = sizeof(result),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = result_traverse,
    .tp_clear = result_clear,
    .tp_doc = "The outcome of one item of a lookup.",
    .tp_dealloc = result_dealloc,
    .tp_repr = result_repr,
    .tp_members = result_members,
    .tp_getset = result_getset,
};

static PyObject *dtype_cache, *device_cache;

/* *out = the cached fn(key), calling fn on a miss (and every time for an
 * unhashable key); 0 or -1. */
static int cached(PyObject **cache, PyObject *fn, PyObject *key,
                  PyObject **out) {
  if (*cache == NULL && (*cache = PyDict_New()) == NULL)
    return -1;
  PyObject *v = PyDict_GetItemWithError(*cache, key);
  if (v != NULL) {
    *out = Py_NewRef(v);
    return 0;
  }
  int hashable = !PyErr_Occurred();
  if (!hashable) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError))
      return -1; /* an error of the key's own __eq__, not unhashability */
    PyErr_Clear();
  }
  if ((v = PyObject_CallOneArg(fn, key)) == NULL)
    return -1;
  if (hashable && PyDict_Size(*cache) < 256 &&
      PyDict_SetItem(*cache, key, v) < 0)
    PyErr_Clear();
  *out = v;
  return 0;
}

static int parse_dtype(PyObject *o, int *dtype) {
  PyObject *v = NULL;
  if (PyLong_CheckExact(o))
    v = Py_NewRef(o);
  else if (cached(&dtype_cache, ec_dtype_of, o, &v) < 0)
    return -1;
  long code = PyLong_AsLong(v);
  Py_DECREF(v);
  if (code == -1 && PyErr_Occurred())
    return -1;
  *dtype = code >= 0 && code <= 255 ? (int)code : -1;
  if (encache_dtype_size(*dtype) == 0) {
    PyErr_Format(PyExc_ValueError, "dtype %R is not a dtype code", o);
    return -1;
  }
  return 0;
}

static int parse_shape(PyObject *o, encache_candidate *c) {
  PyObject *seq = PySequence_Fast(o, "shape must be (rows, cols)");
  if (seq == NULL)
    return -1;
  int rc = -1;
  if (PySequence_Fast_GET_SIZE(seq) != 2)
    PyErr_Format(PyExc_ValueError, "shape %R is not (rows, cols)", o);
  else {
    PyObject **v = PySequence_Fast_ITEMS(seq);
    c->rows = PyLong_AsUnsignedLongLong(v[0]);
    c->cols = PyErr_Occurred() ? 0 : PyLong_AsUnsignedLongLong(v[1]);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError,
                   "shape %R is not two non-negative integers", o);
    } else
      rc = 0;
  }
  Py_DECREF(seq);
  return rc;
}

static int parse_device(PyObject *o, encache_candidate *c) {
  c->device = ENCACHE_DEVICE_HOST;
  c->device_index = 0;
  if (o == Py_None)
    return 0;
  PyObject *v = NULL;
  if (cached(&device_cache, ec_device_of, o, &v) < 0)
    return -1;
  int ok = PyArg_ParseTuple(v, "ii", &c->device, &c->device_index);
  Py_DECREF(v);
  return ok ? 0 : -1;
}

/* Fills c from item and sets *id to a new reference to its id (c->id
 * points into it); -1 with an exception set.  The item is copied into a
 * tuple and its id held before any Python code runs (the dtype and device
 * resolution may run the caller's code, which could change the item). */
static int parse_item(PyObject *item, encache_candidate *c, PyObject **id) {
  PyObject *f = PyTuple_Check(item) ? Py_NewRef(item) : PySequence_Tuple(item);
  if (f == NULL)
    return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(f);
  int rc = -1;
  *c = (encache_candidate)ENCACHE_CANDIDATE_INIT;
  c->modality = ENCACHE_MODALITY_IMAGE;
  *id = n > 0 ? Py_NewRef(PyTuple_GET_ITEM(f, 0)) : NULL;
  if (n != 3 && n != 4)
    PyErr_Format(PyExc_ValueError, "%R is not (id, dtype, shape[, device])",
                 item);
  else if (!PyUnicode_Check(*id))
    PyErr_Format(PyExc_TypeError, "the id %R is not a str", *id);
  else if ((c->id = ec_key_text(*id, "the id")) != NULL &&
           parse_dtype(PyTuple_GET_ITEM(f, 1), &c->dtype) == 0 &&
           parse_shape(PyTuple_GET_ITEM(f, 2), c) == 0 &&
           parse_device(n == 4 ? PyTuple_GET_ITEM(f, 3) : Py_None, c) == 0)
    rc = 0;
  if (rc < 0)
    Py_CLEAR(*id);
  Py_DECREF(f);
  return rc;
}

/* Replaces a pending ValueError or TypeError (InvalidError is one) with
 * InvalidError naming item i; other exceptions (KeyboardInterrupt,
 * MemoryError) go on as they are. */
static void invalid_item(Py_ssize_t i) {
  if (!PyErr_ExceptionMatches(PyExc_ValueError) &&
      !PyErr_ExceptionMatches(PyExc_TypeError))
    return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *s = value != NULL ? PyObject_Str(value) : NULL;
  const char *m = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
  PyErr_Clear();
  ec_invalid("item %zd: %s", i, m != NULL ? m : "invalid");
  Py_XDECREF(s);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* ------------------------------------------------------ CUDA destinations */

/* cudaStreamLegacy, as cuda_runtime_api.h defines it. */
#define CUDA_STREAM_LEGACY ((uintptr_t)0x1)

typedef struct dests {
  const encache_candidate *c;
  Py_ssize_t n;
  PyObject **obj;    /* per candidate: its CUDA destination, or NULL */
  uintptr_t *addr;   /* ... its address */
  uint64_t *cap;     /* ... its bytes */
  uintptr_t stream;  /* the stream current on their device */
  int device_index;  /* -1 until a CUDA item is seen */
  Py_ssize_t failed; /* the CUDA candidate alloc had nothing for, or -1 */
  int poisoned;      /* the lookup poisoned the handle: keep them all */
} dests;

static int dest_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **blk) {
  dests *d = ctx;
  if (c->device != ENCACHE_DEVICE_CUDA)
    return ec_block_alloc(NULL, i, c, nbytes, data, blk);
  if (d->obj == NULL || d->obj[i] == NULL || nbytes > d->cap[i]) {
    d->failed = (Py_ssize_t)i;
    return -ENODEV;
  }
  *data = (void *)d->addr[i];
  *blk = NULL;
  return 0;
}

static void dest_release(void *ctx, size_t i, void *data, void *blk) {
  const dests *d = ctx;
  if (d->c[i].device != ENCACHE_DEVICE_CUDA)
    ec_block_release(NULL, i, data, blk);
}

/* Drops the destinations, except after a poisoning lookup: a copy may
 * still write into them, so they are never freed (as the library keeps
 * its own buffers then). */
static void dests_free(dests *d) {
  for (Py_ssize_t i = 0; d->obj != NULL && !d->poisoned && i < d->n; i++)
    Py_XDECREF(d->obj[i]);
  PyMem_Free(d->obj);
  PyMem_Free(d->addr);
  PyMem_Free(d->cap);
}

/* Makes the destination of CUDA candidate i (none when the package cannot
 * allocate there: the lookup then fails only if the library has a hit for
 * it); 0 or -1 raised. */
static int dest_make(dests *d, Py_ssize_t i) {
  const encache_candidate *c = &d->c[i];
  if (d->device_index >= 0 && c->device_index != d->device_index)
    return ec_invalid("on cuda:%d, another item on cuda:%d: one CUDA "
                      "device per lookup", c->device_index, d->device_index),
           -1;
  d->device_index = c->device_index;
  if (d->obj == NULL &&
      ((d->obj = PyMem_Calloc((size_t)d->n, sizeof(*d->obj))) == NULL ||
       (d->addr = PyMem_Calloc((size_t)d->n, sizeof(*d->addr))) == NULL ||
       (d->cap = PyMem_Calloc((size_t)d->n, sizeof(*d->cap))) == NULL))
    return PyErr_NoMemory(), -1;
  PyObject *r = PyObject_CallFunction(
      ec_device_empty, "iKKi", c->dtype, (unsigned long long)c->rows,
      (unsigned long long)c->cols, c->device_index);
  PyObject *t;
  unsigned long long addr, stream;
  int rc = r == NULL ? -1 : 0;
  if (r != NULL && r != Py_None) {
    if (!PyArg_ParseTuple(r, "OKK", &t, &addr, &stream))
      rc = -1;
    else {
      d->obj[i] = Py_NewRef(t);
      d->addr[i] = (uintptr_t)addr;
      d->cap[i] = c->rows * c->cols * encache_dtype_size(c->dtype);
      d->stream = (uintptr_t)stream;
    }
  }
  Py_XDECREF(r);
  return rc;
}

/* The destinations of the CUDA candidates among c[0..n); 0 or -1. */
static int dests_make(dests *d, const encache_candidate *c, Py_ssize_t n) {
  *d = (dests){.c = c, .n = n, .device_index = -1, .failed = -1};
  for (Py_ssize_t i = 0; i < n; i++)
    if (c[i].device == ENCACHE_DEVICE_CUDA && dest_make(d, i) < 0) {
      invalid_item(i);
      return -1;
    }
  return 0;
}

/* The Result of r (for candidate c); its hit's block is taken over, or
 * freed on failure. */
static PyObject *result_of(int output, PyObject *id, const dests *d,
                           Py_ssize_t i, const encache_result *r) {
  const encache_candidate *c = &d->c[i];
  PyObject *o = ec_result_type.tp_alloc(&ec_result_type, 0);
  PyObject *tensor = r->outcome != ENCACHE_HIT ? Py_NewRef(Py_None)
                     : c->device == ENCACHE_DEVICE_CUDA
                         ? Py_NewRef(d->obj[i])
                         : ec_block_wrap(r->handle, output, c->dtype,
                                         c->rows, c->cols);
  PyObject *why = r->why != NULL ? ec_text(r->why) : Py_NewRef(Py_None);
  if (o == NULL || tensor == NULL || why == NULL) {
    Py_XDECREF(o);
    Py_XDECREF(tensor);
    Py_XDECREF(why);
    return NULL;
  }
  result *res = (result *)o;
  res->id = Py_NewRef(id);
  res->tensor = tensor;
  res->why = why;
  res->outcome = r->outcome;
  res->verdict = r->verdict;
  res->found = r->found;
  res->address = r->outcome == ENCACHE_HIT ? r->data : NULL;
  return o;
}

/* Copies the results' reasons (owned by the library's step, which another
 * thread may close once the lock is released); NULL when out of memory. */
static void copy_whys(encache_result *res, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++)
    if (res[i].why != NULL)
      res[i].why = strdup(res[i].why);
}

/* Looks d's candidates up on s; the results in res (their reasons
 * copied: free them), or -1 raised.  CUDA hits are copied on the stream
 * current on their device (torch's allocator orders its memory there). */
static int lookup_locked(step *s, handle *h, dests *d, encache_result *res) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.ctx = d;
  a.alloc = dest_alloc;
  a.release = dest_release;
  a.headroom = ENCACHE_HEADER_SIZE; /* host blocks have it (buffer.c) */
  res[0].size = sizeof(encache_result);
  char msg[1024] = "";
  int rc = 0;
  EC_LOCKED(h, rc,
            rc = s->st == NULL ? ENCACHE_ECLOSED : 0;
            /* torch's 0 is the legacy default stream (NULL would be the
             * handle's own). */
            if (rc == 0 && d->obj != NULL)
              rc = encache_step_set_stream(
                  s->st, (void *)(d->stream ? d->stream : CUDA_STREAM_LEGACY));
            if (rc == 0)
              rc = encache_lookup(s->st, d->c, (size_t)d->n, &a, res);
            if (rc >= 0) copy_whys(res, d->n);
            if (rc < 0 && rc != ENCACHE_ECLOSED)
              PyOS_snprintf(msg, sizeof(msg), "%s", encache_errmsg(h->ec)));
  d->poisoned = rc == ENCACHE_EPOISONED;
  if (rc == -ENODEV && d->failed >= 0) {
    ec_invalid("item %zd: a hit on cuda:%d, but no CUDA tensor could be "
               "made for it (torch is not imported, or "
               "torch.cuda.is_available() is False)", d->failed,
               d->c[d->failed].device_index);
    return -1;
  }
  if (rc < 0) {
    ec_raise(rc, rc == ENCACHE_ECLOSED ? "the step or its Cache is closed"
                                       : msg);
    return -1;
  }
  return 0;
}

/* The Results of res[0..n) as a new list; every hit's block is taken
 * over (or freed) whatever happens. */
static PyObject *results_of(int output, PyObject **ids, const dests *d,
                            encache_result *res) {
  Py_ssize_t n = d->n;
  PyObject *out = PyList_New(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *r = out != NULL ? result_of(output, ids[i], d, i, &res[i])
                              : NULL;
    if (r == NULL) {
      if (res[i].outcome == ENCACHE_HIT && out == NULL)
        dest_release((void *)d, (size_t)i, res[i].data, res[i].handle);
      Py_CLEAR(out);
      continue; /* the remaining hits' blocks are freed */
    }
    PyList_SET_ITEM(out, i, r);
  }
  return out;
}

PyObject *ec_step_lookup(step *s, PyObject *items) {
  if (ec_step_usable(s) < 0)
    return NULL;
  handle *h = (handle *)Py_NewRef(s->owner);
  /* A copy: the caller's code, run while items are parsed, cannot change
   * what is being parsed. */
  PyObject *seq = PyTuple_Check(items) ? Py_NewRef(items)
                                       : PySequence_Tuple(items);
  if (seq == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    ec_invalid("items must be a sequence of Item (or of tuples)");
  }
  PyObject *out = NULL, *ids_stack[STACK_ITEMS], **ids = ids_stack;
  encache_candidate c_stack[STACK_ITEMS], *c = c_stack;
  encache_result r_stack[STACK_ITEMS], *res = r_stack;
  Py_ssize_t n = seq != NULL ? PySequence_Fast_GET_SIZE(seq) : 0;
  Py_ssize_t parsed = 0;
  if (seq == NULL)
    goto done;
  if (n > STACK_ITEMS) {
    ids = PyMem_Malloc(sizeof(*ids) * (size_t)n);
    c = PyMem_Malloc(sizeof(*c) * (size_t)n);
    res = PyMem_Malloc(sizeof(*res) * (size_t)n);
    if (ids == NULL || c == NULL || res == NULL) {
      PyErr_NoMemory();
      goto done;
    }
  }
  for (; parsed < n; parsed++)
    if (parse_item(PySequence_Fast_GET_ITEM(seq, parsed), &c[parsed],
                   &ids[parsed]) < 0) {
      invalid_item(parsed);
      goto done;
    }
  dests d;
  if (dests_make(&d, c, n) < 0 || lookup_locked(s, h, &d, res) < 0) {
    dests_free(&d);
    goto done;
  }
  out = results_of(h->output, ids, &d, res);
  dests_free(&d);
  for (Py_ssize_t i = 0; i < n; i++)
    free((char *)res[i].why);
  if (out != NULL) {
    Py_ssize_t at = PyList_GET_SIZE(s->results);
    if (PyList_SetSlice(s->results, at, at, out) < 0)
      Py_CLEAR(out);
  }
done:
  for (Py_ssize_t i = 0; i < parsed; i++)
    Py_DECREF(ids[i]);
  if (n > STACK_ITEMS) {
    PyMem_Free(ids);
    PyMem_Free(c);
    PyMem_Free(res);
  }
  Py_XDECREF(seq);
  Py_DECREF(h);
  return out;
}
