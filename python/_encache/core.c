/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core.c: the module core (core.h): the state the package sets, the
 * errors, text, and the fork generation.  The package (encache/__init__.py)
 * calls _init() once with what only Python knows: the exception classes,
 * the Outcome and Skip enumerations, and how to describe tensors.
 */
#include "core.h"

#include <pthread.h>
#include <stdarg.h>
#include <string.h>

PyObject *ec_outcomes, *ec_skips, *ec_describe, *ec_dtype_of, *ec_device_of,
    *ec_device_empty,
    *ec_from_dlpack, *ec_as_array;
static PyObject *errors;      /* dict: library code -> exception class */
static PyObject *error_base;  /* encache.Error */
static PyObject *invalid_error, *closed_error, *fork_error;
unsigned long ec_fork_gen;

static void after_fork_in_child(void) { ec_fork_gen++; }

int ec_core_fork_init(void) {
  return pthread_atfork(NULL, NULL, after_fork_in_child);
}

PyObject *ec_text(const char *s) {
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *raise_as(PyObject *cls, int code, const char *msg) {
  PyObject *text = ec_text(msg);
  if (text == NULL)
    return NULL;
  PyObject *exc = PyObject_CallFunction(cls, "Ois", text, code,
                                        encache_err_name(code));
  Py_DECREF(text);
  if (exc != NULL) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

PyObject *ec_raise_closed(const char *msg) {
  return raise_as(closed_error, ENCACHE_ECLOSED, msg);
}

PyObject *ec_raise_fork(const char *msg) {
  return raise_as(fork_error, ENCACHE_EINVAL, msg);
}

PyObject *ec_error_class(int code) {
  PyObject *key = code != 0 ? PyLong_FromLong(code) : NULL;
  PyObject *cls = key != NULL ? PyDict_GetItem(errors, key) : NULL;
  Py_XDECREF(key);
  return cls != NULL ? cls : error_base;
}

PyObject *ec_raise(int code, const char *detail) {
  if (code == ENCACHE_ENOMEM && (detail == NULL || detail[0] == '\0'))
    return PyErr_NoMemory();
  PyObject *key = PyLong_FromLong(code);
  if (key == NULL)
    return NULL;
  PyObject *cls = PyDict_GetItemWithError(errors, key);
  Py_DECREF(key);
  if (cls == NULL && PyErr_Occurred())
    return NULL;
  const char *msg =
      detail != NULL && detail[0] != '\0' ? detail : encache_strerror(code);
  return raise_as(cls != NULL ? cls : error_base, code, msg);
}

const char *ec_key_text(PyObject *s, const char *what) {
  if (!PyUnicode_Check(s))
    return ec_invalid("%s must be a str, not %s", what, Py_TYPE(s)->tp_name),
           NULL;
  Py_ssize_t n = 0;
  const char *text = PyUnicode_AsUTF8AndSize(s, &n);
  if (text == NULL) {
    PyErr_Clear();
    return ec_invalid("%s is not valid UTF-8 text", what), NULL;
  }
  const char *nul = memchr(text, '\0', (size_t)n);
  if (nul != NULL)
    return ec_invalid("%s holds a NUL character ('\\0', at byte %zd): "
                      "refused, since a key or option would end there",
                      what, (Py_ssize_t)(nul - text)),
           NULL;
  return text;
}

PyObject *ec_invalid(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  PyOS_vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return raise_as(invalid_error, ENCACHE_EINVAL, msg);
}

int ec_core_init(PyObject *args, PyObject *kw, PyTypeObject *step_base,
                 PyTypeObject **step_type) {
  static const char *names[] = {"errors", "error_base", "invalid_error",
                          "closed_error", "fork_error", "outcomes", "skips",
                          "describe", "dtype_of", "device_of", "device_empty",
                          "step_type", NULL};
  PyObject *v[11];
  *step_type = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOOO!O!OOOO|O!:_init",
                                   (char **)names, &PyDict_Type, &v[0], &v[1],
                                   &v[2], &v[3], &v[4], &PyTuple_Type, &v[5],
                                   &PyTuple_Type, &v[6], &v[7], &v[8], &v[9],
                                   &v[10], &PyType_Type, step_type))
    return -1;
  if (*step_type != NULL && !PyType_IsSubtype(*step_type, step_base)) {
    *step_type = NULL;
    return ec_invalid("step_type must be a subclass of Step"), -1;
  }
  PyObject **slots[] = {&errors,       &error_base,  &invalid_error,
                        &closed_error, &fork_error,  &ec_outcomes,
                        &ec_skips,     &ec_describe, &ec_dtype_of,
                        &ec_device_of, &ec_device_empty};
  for (int i = 0; i < 11; i++)
    Py_XSETREF(*slots[i], Py_NewRef(v[i]));
  return 0;
}
