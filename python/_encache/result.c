/* SPDX-License-Identifier: Apache-2.0 */
/*
 * result.c: Result (result.h), the outcome of one item of a lookup: its
 * fields read by attribute, the hits' fields read in C by the steps and
 * the vLLM hooks (ec_result_hit).
 */
#include "result.h"

#include <structmember.h>

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

PyObject *ec_result_hit(PyObject *r, PyObject **id) {
  result *res = (result *)r;
  *id = res->id;
  return res->outcome == ENCACHE_HIT && res->id != NULL &&
                 res->tensor != NULL && res->tensor != Py_None
             ? res->tensor
             : NULL;
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

static PyTypeObject result_type = {
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

int ec_result_register(PyObject *m) {
  return PyType_Ready(&result_type) < 0 ||
                 PyModule_AddObjectRef(m, "Result",
                                       (PyObject *)&result_type) < 0
             ? -1
             : 0;
}

PyObject *ec_result_alloc(void) {
  return result_type.tp_alloc(&result_type, 0);
}

void ec_result_set(PyObject *o, PyObject *id, PyObject *tensor,
                   PyObject *why, const encache_result *r) {
  result *res = (result *)o;
  res->id = Py_NewRef(id);
  res->tensor = tensor;
  res->why = why;
  res->outcome = r->outcome;
  res->verdict = r->verdict;
  res->found = r->found;
  res->address = r->outcome == ENCACHE_HIT ? r->data : NULL;
}
