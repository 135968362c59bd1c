/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_hooks.c: the vLLM connector's hooks (vllm_hooks.h).  WorkerStep,
 * the step state of encache.vllm's worker half (python/encache/vllm/
 * _core.py, WorkerCore), with the three calls of a step that vLLM's model
 * runner makes through the connector's hooks: bind
 * (bind_connector_metadata), begin (start_save_caches or
 * start_load_caches) and end or clear (clear_connector_metadata); and
 * ConnectorHooks, the C base class whose methods those hooks are.
 *
 * They are here, not in Python, because they run on every encoder step
 * and a step of small hits costs about 10 us: in Python the connector's
 * bookkeeping (its open step, what save_caches needs, its counters) added
 * 10 to 16 % to it (docs/vllm.md, Cost).  What is rare stays in Python:
 * begin calls `other(plan, items, encoder_cache)` when an item is already
 * in the encoder cache, prefetched hits may wait in `handoffs`, hits go to
 * a device, or the step is open already; and `failed(exc)` when the lookup
 * raises an encache.Error other than PoisonedError (bad input, memory:
 * the runner encodes instead).  PoisonedError and any other exception
 * propagate.  WorkerCore reads and writes the state through the members.
 *
 * Like WorkerCore, a WorkerStep belongs to the worker's thread; its calls
 * hold the GIL throughout except inside the library's (the Handle's lock).
 *
 * (Over 600 lines: ConnectorHooks' methods are WorkerStep's step calls
 * (ws_bind, ws_begin, ws_end) with vLLM's arguments; two files would share
 * those statics through a header made for one caller.)
 */
#include "vllm_hooks.h"

#include "handle_type.h"
#include "lookup.h"
#include "result.h"
#include "step_type.h"

#include <structmember.h>

typedef struct wstep {
  PyObject_HEAD
  PyObject *cache;    /* a Handle, or None (reuse off) */
  PyObject *step;     /* the step open, or None */
  PyObject *plan;     /* the plan bound (its .plan), or None */
  PyObject *looked;   /* list of (plan, items) looked up this step */
  PyObject *planned;  /* dict: identifier -> Candidate or None (Python's) */
  PyObject *other;    /* callable(plan, items, encoder_cache) -> int */
  PyObject *failed;   /* callable(exc) -> int */
  PyObject *handoffs; /* dict: while it holds anything, begin calls other */
  char device;        /* hits go to a device: begin calls other */
  char begun, open;   /* begun this step; a step is begun or open */
  char ready;         /* initialised, and not cleared by the GC */
  Py_ssize_t steps, looked_up, loaded;
} wstep;

static PyObject *str_plan, *str_items, *str_inner, *str_metadata,
    *str_encoder_cache, *str_bind, *str_save, *str_clear, *str_metadata_attr;

static int ws_traverse(PyObject *self, visitproc visit, void *arg) {
  wstep *w = (wstep *)self;
  Py_VISIT(w->cache);
  Py_VISIT(w->step);
  Py_VISIT(w->plan);
  Py_VISIT(w->looked);
  Py_VISIT(w->planned);
  Py_VISIT(w->other);
  Py_VISIT(w->failed);
  Py_VISIT(w->handoffs);
  return 0;
}

static int ws_clear(PyObject *self) {
  wstep *w = (wstep *)self;
  w->ready = 0;
  Py_CLEAR(w->cache);
  Py_CLEAR(w->step);
  Py_CLEAR(w->plan);
  Py_CLEAR(w->looked);
  Py_CLEAR(w->planned);
  Py_CLEAR(w->other);
  Py_CLEAR(w->failed);
  Py_CLEAR(w->handoffs);
  return 0;
}

static void ws_dealloc(PyObject *self) {
  PyObject_GC_UnTrack(self);
  ws_clear(self);
  Py_TYPE(self)->tp_free(self);
}

static int is_cache(PyObject *o) {
  return o == Py_None || PyObject_TypeCheck(o, &ec_handle_type);
}

static int ws_init(PyObject *self, PyObject *args, PyObject *kw) {
  static const char *names[] = {"cache",    "other",  "failed",
                                "handoffs", "device", NULL};
  wstep *w = (wstep *)self;
  PyObject *cache, *other = Py_None, *failed = Py_None, *handoffs = Py_None;
  int device = 0;
  if (w->looked != NULL)
    return ec_invalid("WorkerStep is initialised once"), -1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOp:WorkerStep",
                                   (char **)names, &cache, &other, &failed,
                                   &handoffs, &device))
    return -1;
  if (handoffs != Py_None && !PyDict_Check(handoffs))
    return ec_invalid("WorkerStep: handoffs must be a dict or None"), -1;
  if (!is_cache(cache))
    return ec_invalid("WorkerStep: cache must be a Cache or None"), -1;
  if (cache != Py_None && (!PyCallable_Check(other) ||
                           !PyCallable_Check(failed)))
    return ec_invalid("WorkerStep: other and failed must be callables"), -1;
  w->looked = PyList_New(0);
  w->planned = PyDict_New();
  if (w->looked == NULL || w->planned == NULL)
    return -1;
  w->cache = Py_NewRef(cache);
  w->step = Py_NewRef(Py_None);
  w->plan = Py_NewRef(Py_None);
  w->other = Py_NewRef(other);
  w->failed = Py_NewRef(failed);
  w->handoffs = handoffs != Py_None ? Py_NewRef(handoffs) : NULL;
  w->device = (char)device;
  w->ready = 1;
  return 0;
}

/* 0, or -1 raised: a WorkerStep not initialised (WorkerStep.__new__) or
 * cleared by the GC has no state to work on. */
static int ws_ready(wstep *w) {
  if (w->ready)
    return 0;
  PyErr_SetString(PyExc_RuntimeError, "WorkerStep: not initialised");
  return -1;
}

/* Closes the open step, if any, and forgets what it looked up. */
static int ws_end_now(wstep *w) {
  if (ws_ready(w) < 0)
    return -1;
  w->begun = w->open = 0;
  int rc = 0;
  if (w->step != Py_None) { /* the step first: nothing below stops it */
    PyObject *s = w->step;
    w->step = Py_NewRef(Py_None);
    if (Py_IS_TYPE(s, &ec_step_type) || Py_TYPE(s) == ec_step_class)
      ec_step_close((step *)s);
    else { /* something else Python set: its own close */
      PyObject *r = PyObject_CallMethod(s, "close", NULL);
      rc = r != NULL ? 0 : -1;
      Py_XDECREF(r);
    }
    Py_DECREF(s);
  }
  if (PyDict_GET_SIZE(w->planned) > 0)
    PyDict_Clear(w->planned);
  if (PyList_GET_SIZE(w->looked) > 0 &&
      PyList_SetSlice(w->looked, 0, PY_SSIZE_T_MAX, NULL) < 0)
    rc = -1;
  return rc;
}

static PyObject *ws_end(PyObject *self, PyObject *args) {
  (void)args;
  return ws_end_now((wstep *)self) < 0 ? NULL : Py_NewRef(Py_None);
}

/* The plan of vLLM's bound metadata: its .plan (ours, made by the
 * scheduler half), or None (none bound, or not ours). */
static PyObject *plan_of(PyObject *meta) {
  if (meta == Py_None)
    return Py_NewRef(Py_None);
  PyObject *plan = PyObject_GetAttr(meta, str_plan);
  if (plan == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    plan = Py_NewRef(Py_None);
  }
  return plan;
}

static PyObject *ws_bind(PyObject *self, PyObject *meta) {
  wstep *w = (wstep *)self;
  if (ws_ready(w) < 0 ||
      (w->open && ws_end_now(w) < 0)) /* a step the runner left open */
    return NULL;
  PyObject *plan = plan_of(meta);
  if (plan == NULL)
    return NULL;
  Py_SETREF(w->plan, plan);
  Py_RETURN_NONE;
}

static PyObject *ws_clear_plan(PyObject *self, PyObject *args) {
  (void)args;
  wstep *w = (wstep *)self;
  if (ws_ready(w) < 0)
    return NULL;
  Py_SETREF(w->plan, Py_NewRef(Py_None));
  return ws_end(self, NULL);
}

/* Whether begin's common path applies to items (a non-empty tuple of
 * (id, dtype, shape) tuples, as StepPlan makes them) and encoder_cache:
 * 1, 0 (call `other`), -1 raised. */
static int common_step(wstep *w, PyObject *items, PyObject *encoder_cache) {
  if (w->step != Py_None || w->device ||
      (w->handoffs != NULL && PyDict_GET_SIZE(w->handoffs) > 0) ||
      !PyDict_CheckExact(encoder_cache))
    return 0;
  Py_ssize_t n = PyTuple_GET_SIZE(items);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *it = PyTuple_GET_ITEM(items, i);
    if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) < 1)
      return 0;
    if (PyDict_GET_SIZE(encoder_cache) > 0) {
      int in = PyDict_Contains(encoder_cache, PyTuple_GET_ITEM(it, 0));
      if (in != 0)
        return in < 0 ? -1 : 0;
    }
  }
  return 1;
}

/* After a failed lookup: `failed(exc)` for an encache.Error that is not
 * PoisonedError (its result returned), else the exception propagates. */
static PyObject *lookup_failed(wstep *w) {
  PyObject *poisoned = ec_error_class(ENCACHE_EPOISONED);
  if (PyErr_ExceptionMatches(poisoned) ||
      !PyErr_ExceptionMatches(ec_error_class(0)))
    return NULL;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL)
    PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  PyObject *r = PyObject_CallOneArg(w->failed, value);
  Py_XDECREF(value);
  return r;
}

/* begin(encoder_cache[, plan: the plan bound]) -> int: looks the plan's
 * items up and puts each hit in encoder_cache under its identifier; the
 * number loaded.  Once per step (a second call, or one with no encoder
 * cache, does nothing). */
static PyObject *ws_begin(PyObject *self, PyObject *const *args,
                          Py_ssize_t nargs) {
  wstep *w = (wstep *)self;
  if (nargs < 1 || nargs > 2)
    return PyErr_Format(PyExc_TypeError,
                        "begin() takes 1 or 2 arguments (%zd given)", nargs);
  if (ws_ready(w) < 0)
    return NULL;
  PyObject *encoder_cache = args[0], *plan = nargs > 1 ? args[1] : w->plan;
  if (w->begun || encoder_cache == Py_None)
    return PyLong_FromLong(0);
  w->begun = w->open = 1;
  w->steps++;
  if (w->cache == Py_None || plan == Py_None)
    return PyLong_FromLong(0);
  /* Held: the lookup releases the GIL, and `other` and plan.items run
   * Python, which may drop or replace them (WorkerCore.close()). */
  Py_INCREF(plan);
  PyObject *cache = Py_NewRef(w->cache);
  PyObject *out = NULL, *items = PyObject_GetAttr(plan, str_items);
  if (items == NULL) {
    Py_DECREF(cache);
    Py_DECREF(plan);
    return NULL;
  }
  int common;
  if (PyTuple_Check(items) && PyTuple_GET_SIZE(items) == 0) {
    out = PyLong_FromLong(0);
    goto done;
  }
  common = PyTuple_Check(items) ? common_step(w, items, encoder_cache) : 0;
  if (common < 0)
    goto done;
  if (common == 0) {
    out = PyObject_CallFunctionObjArgs(w->other, plan, items, encoder_cache,
                                       NULL);
    goto done;
  }
  /* The common step: one call opens it and looks the items up. */
  PyObject *s = ec_step_new((handle *)cache);
  PyObject *results = s != NULL ? ec_step_lookup((step *)s, items, 1) : NULL;
  if (results == NULL) {
    Py_XDECREF(s);
    out = lookup_failed(w);
    goto done;
  }
  Py_SETREF(w->step, s);
  Py_ssize_t hits = 0, n = PyList_GET_SIZE(results);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *id, *t = ec_result_hit(PyList_GET_ITEM(results, i), &id);
    if (t == NULL)
      continue;
    if (PyDict_SetItem(encoder_cache, id, t) < 0) {
      Py_DECREF(results);
      goto done;
    }
    hits++;
  }
  Py_DECREF(results);
  PyObject *entry = PyTuple_Pack(2, plan, items);
  if (entry == NULL || PyList_Append(w->looked, entry) < 0) {
    Py_XDECREF(entry);
    goto done;
  }
  Py_DECREF(entry);
  w->looked_up += PyTuple_GET_SIZE(items);
  w->loaded += hits;
  out = PyLong_FromSsize_t(hits);
done:
  Py_DECREF(items);
  Py_DECREF(cache);
  Py_DECREF(plan);
  return out;
}

static PyObject *ws_get_cache(PyObject *self, void *c) {
  (void)c;
  return ws_ready((wstep *)self) < 0 ? NULL
                                     : Py_NewRef(((wstep *)self)->cache);
}

static int ws_set_cache(PyObject *self, PyObject *v, void *c) {
  (void)c;
  if (ws_ready((wstep *)self) < 0)
    return -1;
  if (v == NULL || !is_cache(v))
    return ec_invalid("WorkerStep.cache must be a Cache or None"), -1;
  Py_SETREF(((wstep *)self)->cache, Py_NewRef(v));
  return 0;
}

static PyObject *ws_get_step(PyObject *self, void *c) {
  (void)c;
  return ws_ready((wstep *)self) < 0 ? NULL
                                     : Py_NewRef(((wstep *)self)->step);
}

static int ws_set_step(PyObject *self, PyObject *v, void *c) {
  (void)c;
  if (ws_ready((wstep *)self) < 0)
    return -1;
  if (v == NULL || (v != Py_None && !PyObject_TypeCheck(v, &ec_step_type)))
    return ec_invalid("WorkerStep.step must be a Step or None"), -1;
  Py_SETREF(((wstep *)self)->step, Py_NewRef(v));
  return 0;
}

static PyGetSetDef ws_getset[] = {
    {"cache", ws_get_cache, ws_set_cache, "the Cache, or None", NULL},
    {"step", ws_get_step, ws_set_step, "the step open, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef ws_members[] = {
    {"plan", T_OBJECT, offsetof(wstep, plan), READONLY,
     "the plan bound, or None"},
    {"looked", T_OBJECT, offsetof(wstep, looked), READONLY,
     "list of (plan, items) looked up this step"},
    {"planned", T_OBJECT, offsetof(wstep, planned), READONLY,
     "dict: the candidates publish() found this step"},
    {"begun", T_BOOL, offsetof(wstep, begun), 0, "begin ran this step"},
    {"open", T_BOOL, offsetof(wstep, open), 0,
     "a step is begun or open (end() has something to do)"},
    {"steps", T_PYSSIZET, offsetof(wstep, steps), 0, "steps begun"},
    {"looked_up", T_PYSSIZET, offsetof(wstep, looked_up), 0,
     "items looked up"},
    {"loaded", T_PYSSIZET, offsetof(wstep, loaded), 0,
     "hits put in an encoder cache"},
    {NULL, 0, 0, 0, NULL}};

static PyMethodDef ws_methods[] = {
    {"bind", ws_bind, METH_O,
     "bind(metadata): ends a step left open; the plan is metadata.plan "
     "(None when it has none)."},
    {"begin", (PyCFunction)(void (*)(void))ws_begin, METH_FASTCALL,
     "begin(encoder_cache[, plan]) -> int: looks the plan's (default: the "
     "bound plan's) items "
     "up, each hit put in encoder_cache; once per step."},
    {"end", ws_end, METH_NOARGS, "end(): closes the step (idempotent)."},
    {"clear", ws_clear_plan, METH_NOARGS,
     "clear(): end(), and the plan unbound."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject worker_step_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache._encache.WorkerStep",
    .tp_basicsize = sizeof(wstep),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "WorkerStep(cache, other, failed, handoffs=None, device=False):"
              " the step state of encache.vllm's worker half (internal).",
    .tp_traverse = ws_traverse,
    .tp_clear = ws_clear,
    .tp_dealloc = ws_dealloc,
    .tp_init = ws_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = ws_methods,
    .tp_members = ws_members,
    .tp_getset = ws_getset,
};

/* ------------------------------------------------------- ConnectorHooks */

/* The connector's three per-step hooks as methods of a C base class
 * (encache.vllm.connector.EncacheECConnector derives from it and from
 * vLLM's ECConnectorBase): called by vLLM's model runner, they run no
 * Python frame.  Each does what ECConnectorBase's does with the bound
 * metadata (bind and clear set _connector_metadata, and nothing else:
 * vllm/distributed/ec_transfer/ec_connector/base.py, vLLM 0.32.0), then
 * the producer's WorkerStep's call, then the inner connector's hook of the
 * same name, when there is one and it has that hook.  The connector's
 * other hooks, each of vLLM's base class among them, are Python methods
 * of EncacheECConnector that pass the call on by name; the attribute
 * lookup below reaches only what neither class has. */
typedef struct hooks {
  PyObject_HEAD
  PyObject *state; /* the producer's WorkerStep, or NULL */
  PyObject *inner; /* the inner connector, or NULL */
} hooks;

static int hk_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(((hooks *)self)->state);
  Py_VISIT(((hooks *)self)->inner);
  return 0;
}

static int hk_clear(PyObject *self) {
  Py_CLEAR(((hooks *)self)->state);
  Py_CLEAR(((hooks *)self)->inner);
  return 0;
}

static void hk_dealloc(PyObject *self) {
  PyObject_GC_UnTrack(self);
  hk_clear(self);
  Py_TYPE(self)->tp_free(self);
}

/* The one argument `name` of a hook, passed by position or by name. */
static int one_arg(PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames, PyObject *name, const char *hook,
                   PyObject **out) {
  Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs == 1 && nk == 0) {
    *out = args[0];
    return 0;
  }
  if (nargs == 0 && nk == 1 &&
      PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), name) == 0) {
    *out = args[0];
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "%s() takes one argument, %U", hook, name);
  return -1;
}

/* inner.name(*args, **kw) when inner has it; 0, or -1 raised. */
static int forward(PyObject *inner, PyObject *name, PyObject *args,
                   PyObject *kw) {
  PyObject *f = PyObject_GetAttr(inner, name);
  if (f == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
      return -1;
    PyErr_Clear();
    return 0;
  }
  PyObject *r = PyObject_Call(f, args, kw);
  Py_DECREF(f);
  Py_XDECREF(r);
  return r != NULL ? 0 : -1;
}

/* A hook's own references to what it calls: Python it runs (the inner
 * connector's hook, plan.items, a finalizer) may call _set_hooks. */
typedef struct held {
  PyObject *state, *inner;
} held;

static held hold(hooks *h) {
  return (held){Py_XNewRef(h->state), Py_XNewRef(h->inner)};
}

static PyObject *unhold(held *k, PyObject *r) {
  Py_XDECREF(k->state);
  Py_XDECREF(k->inner);
  return r;
}

static PyObject *hk_bind_held(PyObject *self, held *h, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *meta;
  if (one_arg(args, nargs, kwnames, str_metadata, "bind_connector_metadata",
              &meta) < 0 ||
      PyObject_SetAttr(self, str_metadata_attr, meta) < 0)
    return NULL;
  if (h->state != NULL) {
    PyObject *r = ws_bind(h->state, meta);
    if (r == NULL)
      return NULL;
    Py_DECREF(r);
  }
  if (h->inner != NULL) { /* ours holds the inner connector's */
    PyObject *m = PyObject_GetAttr(meta, str_inner);
    if (m == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      m = Py_NewRef(meta);
    }
    if (m == NULL)
      return NULL;
    PyObject *a = m != Py_None ? PyTuple_Pack(1, m) : NULL;
    int rc = m == Py_None ? 0 : a != NULL ? forward(h->inner, str_bind, a, NULL)
                                          : -1;
    Py_XDECREF(a);
    Py_DECREF(m);
    if (rc < 0)
      return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *hk_bind(PyObject *self, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames) {
  held k = hold((hooks *)self);
  return unhold(&k, hk_bind_held(self, &k, args, nargs, kwnames));
}

static PyObject *hk_start_save_held(PyObject *self, held *h,
                                    PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
  (void)self;
  Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > 1)
    return PyErr_Format(PyExc_TypeError,
                        "start_save_caches() takes at most one positional "
                        "argument (%zd given)", nargs);
  PyObject *encoder_cache = nargs == 1 ? args[0] : Py_None;
  for (Py_ssize_t i = 0; i < nk; i++)
    if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), str_encoder_cache) ==
        0) {
      if (nargs == 1)
        return PyErr_Format(PyExc_TypeError, "start_save_caches() got "
                            "multiple values for argument 'encoder_cache'");
      encoder_cache = args[nargs + i];
    }
  if (h->state != NULL && encoder_cache != Py_None) {
    PyObject *r = ws_begin(h->state, &encoder_cache, 1);
    if (r == NULL)
      return NULL;
    Py_DECREF(r);
  }
  if (h->inner != NULL) { /* inner.start_save_caches(encoder_cache=, **kw) */
    PyObject *kw = PyDict_New(), *a = PyTuple_New(0);
    int rc = kw != NULL && a != NULL
                 ? PyDict_SetItem(kw, str_encoder_cache, encoder_cache)
                 : -1;
    for (Py_ssize_t i = 0; rc == 0 && i < nk; i++)
      rc = PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
    if (rc == 0)
      rc = forward(h->inner, str_save, a, kw);
    Py_XDECREF(kw);
    Py_XDECREF(a);
    if (rc < 0)
      return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *hk_start_save(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames) {
  held k = hold((hooks *)self);
  return unhold(&k, hk_start_save_held(self, &k, args, nargs, kwnames));
}

static PyObject *hk_clear_meta_held(PyObject *self, held *h) {
  if (PyObject_SetAttr(self, str_metadata_attr, Py_None) < 0)
    return NULL;
  if (h->state != NULL) {
    PyObject *r = ws_clear_plan(h->state, NULL);
    if (r == NULL)
      return NULL;
    Py_DECREF(r);
  }
  if (h->inner != NULL) {
    PyObject *a = PyTuple_New(0);
    int rc = a != NULL ? forward(h->inner, str_clear, a, NULL) : -1;
    Py_XDECREF(a);
    if (rc < 0)
      return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *hk_clear_meta(PyObject *self, PyObject *args) {
  (void)args;
  held k = hold((hooks *)self);
  return unhold(&k, hk_clear_meta_held(self, &k));
}

/* _set_hooks(state, inner): what the hooks call (None: nothing). */
static PyObject *hk_set(PyObject *self, PyObject *args) {
  hooks *h = (hooks *)self;
  PyObject *state, *inner;
  if (!PyArg_ParseTuple(args, "OO:_set_hooks", &state, &inner))
    return NULL;
  if (state != Py_None && !Py_IS_TYPE(state, &worker_step_type))
    return ec_invalid("_set_hooks: state must be a WorkerStep or None");
  if (inner == self)
    return ec_invalid("_set_hooks: a connector cannot be its own inner");
  Py_XSETREF(h->state, state != Py_None ? Py_NewRef(state) : NULL);
  Py_XSETREF(h->inner, inner != Py_None ? Py_NewRef(inner) : NULL);
  Py_RETURN_NONE;
}

/* An attribute the connector lacks is its inner connector's (dunders
 * excepted): the inner connector's hooks this class does not define. */
static PyObject *hk_getattro(PyObject *self, PyObject *name) {
  PyObject *r = PyObject_GenericGetAttr(self, name);
  hooks *h = (hooks *)self;
  if (r != NULL || h->inner == NULL ||
      !PyErr_ExceptionMatches(PyExc_AttributeError))
    return r;
  Py_ssize_t n = PyUnicode_GetLength(name);
  if (n >= 2 && PyUnicode_READ_CHAR(name, 0) == '_' &&
      PyUnicode_READ_CHAR(name, 1) == '_')
    return NULL;
  PyErr_Clear();
  /* Bounded: inner connectors that delegate to each other in a ring
   * raise RecursionError instead of exhausting the C stack. */
  if (Py_EnterRecursiveCall(" in the inner connector's attribute lookup"))
    return NULL;
  PyObject *inner = Py_NewRef(h->inner);
  r = PyObject_GetAttr(inner, name);
  Py_DECREF(inner);
  Py_LeaveRecursiveCall();
  return r;
}

static PyMethodDef hk_methods[] = {
    {"bind_connector_metadata", (PyCFunction)(void (*)(void))hk_bind,
     METH_FASTCALL | METH_KEYWORDS,
     "bind_connector_metadata($self, /, connector_metadata)\n--\n\n"
     "Sets _connector_metadata (as ECConnectorBase does), ends a step left "
     "open, binds the step's plan, then the inner connector's metadata."},
    {"start_save_caches", (PyCFunction)(void (*)(void))hk_start_save,
     METH_FASTCALL | METH_KEYWORDS,
     "start_save_caches($self, /, encoder_cache=None, **kwargs)\n--\n\n"
     "A producer's step begins (ActiveECConnector.maybe_get_output): the "
     "plan's hits land in encoder_cache, then the inner connector starts "
     "delivering what is there."},
    {"clear_connector_metadata", hk_clear_meta, METH_NOARGS,
     "clear_connector_metadata($self, /)\n--\n\n"
     "Clears _connector_metadata (as ECConnectorBase does), closes the "
     "step, then the inner connector's."},
    {"_set_hooks", hk_set, METH_VARARGS,
     "_set_hooks(state, inner): the WorkerStep and inner connector the "
     "hooks call (None: none)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject connector_hooks_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache._encache.ConnectorHooks",
    .tp_basicsize = sizeof(hooks),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The per-step hooks of encache.vllm's connector, in C "
              "(internal: a base of EncacheECConnector).",
    .tp_traverse = hk_traverse,
    .tp_clear = hk_clear,
    .tp_dealloc = hk_dealloc,
    /* object's (set at init): with a Python ABC among the subclass's
     * bases, an abstract method left undefined still refuses the class. */
    .tp_getattro = hk_getattro,
    .tp_methods = hk_methods,
};

int ec_vllm_hooks_register(PyObject *m) {
  const char *names[] = {"plan",       "items",
                         "inner",      "connector_metadata",
                         "encoder_cache", "bind_connector_metadata",
                         "start_save_caches", "clear_connector_metadata",
                         "_connector_metadata"};
  PyObject **slots[] = {&str_plan,     &str_items, &str_inner,
                        &str_metadata, &str_encoder_cache, &str_bind,
                        &str_save,     &str_clear, &str_metadata_attr};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL)
      return -1;
  connector_hooks_type.tp_new = PyBaseObject_Type.tp_new;
  return PyType_Ready(&worker_step_type) < 0 ||
                 PyType_Ready(&connector_hooks_type) < 0 ||
                 PyModule_AddObjectRef(m, "WorkerStep",
                                       (PyObject *)&worker_step_type) < 0 ||
                 PyModule_AddObjectRef(m, "ConnectorHooks",
                                       (PyObject *)&connector_hooks_type) < 0
             ? -1
             : 0;
}
