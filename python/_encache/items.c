/* SPDX-License-Identifier: Apache-2.0 */
/*
 * items.c: a lookup's items to the library's candidates (items.h).
 *
 * An item is a tuple (encache.Item, or a plain one): id, dtype, shape
 * (rows, cols) and, optionally, device.  dtype and device objects (torch,
 * numpy, strings) are resolved once by the package's functions
 * (ec_dtype_of, ec_device_of: core.h) and cached here by identity of
 * value (dicts of at most 256 entries), so the common case costs two dict
 * lookups.
 */
#include "items.h"

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

/* The item is copied into a tuple and its id held before any Python code
 * runs (the dtype and device resolution may run the caller's code, which
 * could change the item). */
int ec_item_parse(PyObject *item, encache_candidate *c, PyObject **id) {
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

void ec_item_invalid(Py_ssize_t i) {
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
