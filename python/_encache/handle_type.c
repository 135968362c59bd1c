/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handle_type.c: Handle (handle_type.h), an open engine handle
 * (encache.Cache subclasses it).
 * Invariants: ec is NULL once closed; lock serialises the library calls
 * on ec and its steps; fork_gen is the generation ec was opened in.
 */
#include "handle_type.h"

#include "buffer.h"
#include "lookup.h"
#include "step_type.h"

#include <stdlib.h>
#include <string.h>

/* Sets option `name` of cfg from a Python value by its type; 0 or -1. */
static int set_option(encache_config *cfg, const char *name,
                      PyObject *value) {
  int id = 0;
  while (id < ENCACHE_OPT_COUNT && strcmp(encache_option_name(id), name) != 0)
    id++;
  char msg[256];
  if (id == ENCACHE_OPT_COUNT) {
    PyOS_snprintf(msg, sizeof(msg),
                  "%s: no such option (docs/configuration.md lists them)",
                  name);
    ec_raise(ENCACHE_ECONFIG, msg);
    return -1;
  }
  int rc;
  if (value == Py_None)
    rc = encache_config_reset(cfg, id);
  else if (PyBool_Check(value))
    rc = encache_config_set_bool(cfg, id, value == Py_True);
  else if (PyLong_Check(value)) {
    unsigned long long u = PyLong_AsUnsignedLongLong(value);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      rc = ENCACHE_EINVAL;
    } else if ((rc = encache_config_set_u64(cfg, id, u)) == ENCACHE_EINVAL)
      rc = encache_config_set_double(cfg, id, (double)u);
  } else if (PyFloat_Check(value))
    rc = encache_config_set_double(cfg, id, PyFloat_AS_DOUBLE(value));
  else if (PyUnicode_Check(value)) {
    Py_ssize_t n = 0;
    const char *text = PyUnicode_AsUTF8AndSize(value, &n);
    if (text == NULL) { /* NULL would mean "reset" to the setter */
      PyErr_Clear();
      PyOS_snprintf(msg, sizeof(msg), "%s: not valid UTF-8 text", name);
      ec_raise(ENCACHE_ECONFIG, msg);
      return -1;
    }
    if (memchr(text, '\0', (size_t)n) != NULL) {
      PyOS_snprintf(msg, sizeof(msg), "%s: the string holds a NUL character "
                    "('\\0'): refused, no key or option may hold one", name);
      ec_raise(ENCACHE_ECONFIG, msg);
      return -1;
    }
    rc = encache_config_set_string(cfg, id, text);
  }
  else
    rc = ENCACHE_EINVAL;
  if (rc == ENCACHE_EINVAL) {
    PyOS_snprintf(msg, sizeof(msg), "%s: expects a %s (got %s)", name,
                  encache_option_type(id), Py_TYPE(value)->tp_name);
    ec_raise(ENCACHE_ECONFIG, msg);
    return -1;
  }
  if (rc < 0) {
    ec_raise(rc, encache_config_errmsg(cfg));
    return -1;
  }
  return 0;
}

/* A configuration built from a dict of typed options; NULL on error. */
static encache_config *config_of(PyObject *options) {
  encache_config *cfg = NULL;
  int rc = encache_config_new(&cfg);
  if (rc < 0)
    return ec_raise(rc, NULL), NULL;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(options, &pos, &key, &value)) {
    const char *name = ec_key_text(key, "an option name");
    if (name == NULL) {
      PyErr_Clear();
      ec_raise(ENCACHE_ECONFIG, "option names are strings of text without "
                                "NUL characters");
      goto fail;
    }
    if (set_option(cfg, name, value) < 0)
      goto fail;
  }
  if ((rc = encache_config_validate(cfg)) < 0) {
    ec_raise(rc, encache_config_errmsg(cfg));
    goto fail;
  }
  return cfg;
fail:
  encache_config_free(cfg);
  return NULL;
}

static int handle_init(PyObject *self, PyObject *args, PyObject *kw) {
  handle *h = (handle *)self;
  static const char *names[] = {"ec_transfer_config", "model", "revision",
                          "encoder_hash", "dtype", "store", "options",
                          "output", "log", NULL};
  const char *ec_json = NULL, *text[4] = {NULL, NULL, NULL, NULL};
  static const char *const what[4] = {"model", "revision", "encoder_hash",
                                      "store"};
  PyObject *given[4] = {NULL, NULL, NULL, NULL};
  Py_ssize_t ec_len = 0;
  int dtype = ENCACHE_BFLOAT16, output = OUT_BUFFER;
  PyObject *options = NULL, *log = NULL;
  if (ec_outcomes == NULL)
    return ec_invalid("import the encache package, not encache._encache"), -1;
  if (h->opened)
    return ec_invalid("a Cache is opened once: make a new one"), -1;
  if (!PyArg_ParseTupleAndKeywords(
          args, kw, "|z#$OOOiOOiO:Handle", (char **)names, &ec_json,
          &ec_len, &given[0], &given[1], &given[2], &dtype, &given[3],
          &options, &output, &log))
    return -1;
  /* These reach the namespace (and the Store URL names the Store). */
  for (int k = 0; k < 4; k++)
    if (given[k] != NULL && given[k] != Py_None &&
        (text[k] = ec_key_text(given[k], what[k])) == NULL)
      return -1;
  if (output < OUT_BUFFER || output > OUT_TORCH)
    return ec_invalid("output %d is not a known output", output), -1;
  if (output == OUT_TORCH && ec_from_dlpack == NULL)
    return ec_invalid("output 'torch' needs torch"), -1;
  if (output == OUT_NUMPY && ec_as_array == NULL)
    return ec_invalid("output 'numpy' needs numpy"), -1;
  if (options == Py_None)
    options = NULL;
  if (options != NULL && !PyDict_Check(options))
    return ec_invalid("options must be a dict of option names to values"), -1;
  encache_config *cfg = NULL;
  if (options != NULL && (cfg = config_of(options)) == NULL)
    return -1;
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = ec_json;
  o.ec_transfer_config_len = (size_t)ec_len;
  o.config = cfg;
  o.model = text[0];
  o.revision = text[1];
  o.encoder_hash = text[2];
  o.model_dtype = dtype;
  o.store_url = text[3];
  o.log = ec_log;
  o.log_ctx = h;
  Py_XSETREF(h->log, log == NULL || log == Py_None ? NULL : Py_NewRef(log));
  encache *ec = NULL;
  int rc;
  char msg[1024];
  h->opened = 1; /* before the GIL goes: another thread's __init__ fails */
  Py_BEGIN_ALLOW_THREADS
  rc = encache_open(&o, &ec);
  if (rc < 0)
    PyOS_snprintf(msg, sizeof(msg), "%s", encache_errmsg(NULL));
  Py_END_ALLOW_THREADS
  encache_config_free(cfg);
  if (rc < 0)
    return ec_raise(rc, msg), -1;
  h->ec = ec;
  h->output = output;
  h->fork_gen = ec_fork_gen;
  return 0;
}

static PyObject *handle_new(PyTypeObject *type, PyObject *args,
                            PyObject *kw) {
  (void)args;
  (void)kw;
  handle *h = (handle *)type->tp_alloc(type, 0);
  if (h == NULL)
    return NULL;
  h->lock = PyThread_allocate_lock();
  h->live_lock = PyThread_allocate_lock();
  if (h->lock == NULL || h->live_lock == NULL) {
    Py_DECREF(h);
    return PyErr_NoMemory();
  }
  return (PyObject *)h;
}

/* Closes ec (held lock: the caller's); 0 or a library code. */
static int close_ec(handle *h, char *msg, size_t cap) {
  encache *ec = h->ec;
  h->ec = NULL;
  /* Waits for a started lookup that runs (those queued never run). */
  int rc = encache_close(ec);
  h->closed_poisoned = rc == ENCACHE_EPOISONED;
  if (rc < 0)
    PyOS_snprintf(msg, cap, "%s", encache_strerror(rc));
  return rc;
}

static void handle_dealloc(PyObject *self) {
  handle *h = (handle *)self;
  PyObject_GC_UnTrack(self);
  if (h->weakrefs != NULL)
    PyObject_ClearWeakRefs(self);
  /* A handle whose last reference goes in code it runs on its lookup
   * thread (a log callable that drops it and the step being looked up) is
   * left open, and its memory alive: its close would wait for that very
   * lookup, which may still log through it. */
  if (h->ec != NULL && h->fork_gen == ec_fork_gen && ec_calling_back == h)
    return;
  /* In a child after fork() the parent's handle is left alone: its worker
   * thread is not there to drain it. */
  if (h->ec != NULL && h->fork_gen == ec_fork_gen) {
    /* Waits for queued writes: without the GIL, and keeping an exception
     * that may be propagating (the log callable may run meanwhile). */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    char msg[256];
    Py_BEGIN_ALLOW_THREADS
    close_ec(h, msg, sizeof(msg));
    Py_END_ALLOW_THREADS
    PyErr_Restore(type, value, tb);
  }
  free(h->live); /* what is left is a poisoned handle's: kept alive */
  if (h->lock != NULL)
    PyThread_free_lock(h->lock);
  if (h->live_lock != NULL)
    PyThread_free_lock(h->live_lock);
  Py_CLEAR(h->log);
  Py_TYPE(self)->tp_free(self);
}

static int handle_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(((handle *)self)->log);
  return 0;
}

static int handle_clear(PyObject *self) {
  Py_CLEAR(((handle *)self)->log);
  return 0;
}

static PyObject *handle_close(PyObject *self, PyObject *args) {
  (void)args;
  handle *h = (handle *)self;
  /* Closed already, or the parent's handle in a forked child: nothing to
   * do (the child must not touch the parent's handle). */
  if (h->ec == NULL || h->fork_gen != ec_fork_gen)
    Py_RETURN_NONE;
  if (ec_handle_usable(h) < 0)
    return NULL;
  char msg[256];
  int rc;
  rc = 0;
  EC_LOCKED(h, rc, rc = close_ec(h, msg, sizeof(msg)));
  if (rc == ENCACHE_ECLOSED)
    Py_RETURN_NONE; /* another thread closed it first */
  if (rc < 0)
    return ec_raise(rc, msg);
  Py_RETURN_NONE;
}

static PyObject *handle_flush(PyObject *self, PyObject *args) {
  (void)args;
  handle *h = (handle *)self;
  if (ec_handle_usable(h) < 0)
    return NULL;
  char msg[1024] = "";
  int rc;
  EC_LOCKED(h, rc, rc = encache_flush(h->ec);
            if (rc < 0) PyOS_snprintf(msg, sizeof(msg), "%s",
                                      encache_errmsg(h->ec)));
  if (rc < 0)
    return ec_raise(rc, msg);
  Py_RETURN_NONE;
}

static PyObject *handle_step(PyObject *self, PyObject *args) {
  (void)args;
  return ec_step_new((handle *)self);
}

static PyObject *handle_lookup(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *items;
  int wait;
  if (ec_lookup_args(args, nargs, kwnames, &items, &wait) < 0)
    return NULL;
  PyObject *s = ec_step_new((handle *)self);
  if (s == NULL)
    return NULL;
  PyObject *r = ec_step_lookup((step *)s, items, wait);
  if (r == NULL) {
    Py_DECREF(s);
    return NULL;
  }
  Py_DECREF(r);
  return s;
}

static int put_u64(PyObject *d, const char *name, uint64_t v) {
  PyObject *o = PyLong_FromUnsignedLongLong(v);
  int rc = o == NULL ? -1 : PyDict_SetItemString(d, name, o);
  Py_XDECREF(o);
  return rc;
}

static PyObject *handle_stats(PyObject *self, PyObject *args) {
  (void)args;
  handle *h = (handle *)self;
  if (ec_handle_usable(h) < 0)
    return NULL;
  encache_stats st = ENCACHE_STATS_INIT;
  int rc = 0;
  EC_LOCKED(h, rc, rc = encache_stats_get(h->ec, &st));
  if (rc < 0)
    return ec_raise(rc, NULL);
  PyObject *d = PyDict_New(), *skipped = PyList_New(0);
  if (d == NULL || skipped == NULL)
    goto fail;
#define PUT(f)                                                               \
  if (put_u64(d, #f, st.f) < 0)                                              \
    goto fail;
  PUT(lookups) PUT(candidates) PUT(hits) PUT(misses) PUT(incompatible)
  PUT(oversize) PUT(unavailable) PUT(skipped) PUT(bytes_read)
  PUT(batched_reads) PUT(published_queued) PUT(published_written)
  PUT(published_present) PUT(published_failed) PUT(pending_items)
  PUT(pending_bytes) PUT(staging_allocations) PUT(staging_bytes)
  PUT(steps_open) PUT(in_flight) PUT(leases_taken) PUT(leases_failed)
  PUT(waited) PUT(waited_hits) PUT(wait_us) PUT(device_bytes_copied)
  PUT(device_published) PUT(device_pool_bytes) PUT(device_pool_full)
  PUT(hits_unchecked)
#undef PUT
  /* By reason code; the package names them. */
  for (int r = 0; r < ENCACHE_SKIP_REASONS_; r++) {
    PyObject *n = PyLong_FromUnsignedLongLong(encache_stats_skipped(&st, r));
    if (n == NULL || PyList_Append(skipped, n) < 0) {
      Py_XDECREF(n);
      goto fail;
    }
    Py_DECREF(n);
  }
  if (PyDict_SetItemString(d, "published_skipped", skipped) < 0 ||
      PyDict_SetItemString(d, "poisoned", st.poisoned ? Py_True : Py_False) < 0)
    goto fail;
  Py_DECREF(skipped);
  return d;
fail:
  Py_XDECREF(d);
  Py_XDECREF(skipped);
  return NULL;
}

static PyObject *handle_namespace(PyObject *self, void *closure) {
  (void)closure;
  handle *h = (handle *)self;
  if (ec_handle_usable(h) < 0)
    return NULL;
  char ns[4096];
  int rc = 0;
  EC_LOCKED(h, rc, PyOS_snprintf(ns, sizeof(ns), "%s",
                                 encache_namespace_of(h->ec)));
  if (rc < 0)
    return ec_raise(rc, NULL);
  return PyUnicode_FromString(ns);
}

static PyObject *handle_enabled(PyObject *self, void *closure) {
  (void)closure;
  handle *h = (handle *)self;
  if (ec_handle_usable(h) < 0)
    return NULL;
  int rc = 0, on = 0;
  EC_LOCKED(h, rc, on = encache_enabled(h->ec));
  if (rc < 0)
    return ec_raise(rc, NULL);
  return PyBool_FromLong(on);
}

static PyObject *handle_closed(PyObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(((handle *)self)->ec == NULL);
}

static PyMethodDef handle_methods[] = {
    {"lookup", (PyCFunction)(void (*)(void))handle_lookup,
     METH_FASTCALL | METH_KEYWORDS,
     "lookup(items, wait=True) -> Step: opens a step and looks the items "
     "up (wait=False: starts the lookup; Step.wait() collects it)."},
    {"step", handle_step, METH_NOARGS, "step() -> Step: an empty step."},
    {"flush", handle_flush, METH_NOARGS,
     "Waits until every queued publication is written or skipped."},
    {"close", handle_close, METH_NOARGS,
     "Closes the handle (waits for queued publications); idempotent."},
    {"_stats", handle_stats, METH_NOARGS, "The counters, as a dict."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef handle_getset[] = {
    {"namespace", handle_namespace, NULL,
     "The key namespace: keys are NAMESPACE '@id:' ID.", NULL},
    {"enabled", handle_enabled, NULL, "True when cross_encoder_cache is on.",
     NULL},
    {"closed", handle_closed, NULL, "True once closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject ec_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "encache._encache.Handle",
    .tp_basicsize = sizeof(handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An open engine handle (use encache.Cache).",
    .tp_new = handle_new,
    .tp_init = handle_init,
    .tp_dealloc = handle_dealloc,
    .tp_traverse = handle_traverse,
    .tp_clear = handle_clear,
    .tp_weaklistoffset = offsetof(handle, weakrefs),
    .tp_methods = handle_methods,
    .tp_getset = handle_getset,
};

int ec_handle_register(PyObject *m) {
  return PyType_Ready(&ec_handle_type) < 0 ||
                 PyModule_AddObjectRef(m, "Handle",
                                       (PyObject *)&ec_handle_type) < 0
             ? -1
             : 0;
}
