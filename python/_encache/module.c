/* SPDX-License-Identifier: Apache-2.0 */
/*
 * module.c: encache._encache, the top room: the module's functions and
 * PyInit__encache, which registers each room's types (from above: no
 * room below knows the types above it).  _init() hands the package's
 * objects to the core (core.h) and its Step subclass to step_type.c.
 */
#include "core.h"

#include "bench.h"
#include "buffer.h"
#include "handle_type.h"
#include "result.h"
#include "step_type.h"
#include "vllm_hooks.h"

#include <errno.h>

static PyObject *mod_init(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  PyTypeObject *step_type;
  if (ec_core_init(args, kw, &ec_step_type, &step_type) < 0)
    return NULL;
  if (step_type != NULL)
    ec_step_set_class(step_type);
  Py_RETURN_NONE;
}

static PyObject *mod_outputs(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *from_dlpack, *as_array;
  if (!PyArg_ParseTuple(args, "OO:_set_outputs", &from_dlpack, &as_array))
    return NULL;
  /* None keeps the converter already set (by another Cache). */
  if (from_dlpack != Py_None)
    Py_XSETREF(ec_from_dlpack, Py_NewRef(from_dlpack));
  if (as_array != Py_None)
    Py_XSETREF(ec_as_array, Py_NewRef(as_array));
  Py_RETURN_NONE;
}

static PyObject *mod_version(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return PyUnicode_FromString(encache_version());
}

static PyObject *mod_shm_destroy(PyObject *self, PyObject *args) {
  (void)self;
  const char *name;
  if (!PyArg_ParseTuple(args, "s:shm_destroy", &name))
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = encache_shm_destroy(name);
  Py_END_ALLOW_THREADS
  if (rc == -ENOENT)
    Py_RETURN_FALSE;
  if (rc < 0)
    return ec_raise(rc, NULL);
  Py_RETURN_TRUE;
}

static PyObject *mod_block_cache(PyObject *self, PyObject *args) {
  (void)self;
  long long max_bytes;
  if (!PyArg_ParseTuple(args, "L:set_block_cache", &max_bytes))
    return NULL;
  if (max_bytes < 0)
    return ec_invalid("set_block_cache takes a number of bytes >= 0");
  return PyLong_FromSize_t(ec_block_cache_set((size_t)max_bytes));
}

static PyObject *mod_url_redact(PyObject *self, PyObject *args) {
  (void)self;
  const char *url;
  if (!PyArg_ParseTuple(args, "s:url_redact", &url))
    return NULL;
  int n = encache_store_url_redact(url, NULL, 0);
  if (n < 0)
    return ec_raise(n, NULL);
  char *buf = PyMem_Malloc((size_t)n + 1);
  if (buf == NULL)
    return PyErr_NoMemory();
  int rc = encache_store_url_redact(url, buf, (size_t)n + 1);
  PyObject *out = rc < 0 ? ec_raise(rc, NULL) : PyUnicode_FromString(buf);
  PyMem_Free(buf);
  return out;
}

static PyObject *mod_identity(PyObject *self, PyObject *args) {
  (void)self;
  const char *dir, *label = NULL;
  PyObject *label_o = Py_None;
  if (!PyArg_ParseTuple(args, "s|O:model_identity", &dir, &label_o) ||
      (label_o != Py_None &&
       (label = ec_key_text(label_o, "the label")) == NULL))
    return NULL;
  char out[ENCACHE_MODEL_IDENTITY_MAX], msg[1024] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS /* reads every weight file */
  rc = encache_model_identity(dir, label, out, sizeof(out), NULL);
  if (rc < 0)
    PyOS_snprintf(msg, sizeof(msg), "%s", encache_errmsg(NULL));
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return ec_raise(rc, msg);
  return PyUnicode_FromString(out);
}

/* purge(url, prefix, dry_run) -> (objects, bytes or None) */
static PyObject *mod_purge(PyObject *self, PyObject *args) {
  (void)self;
  const char *url, *prefix;
  PyObject *url_o, *prefix_o;
  int dry = 0;
  if (!PyArg_ParseTuple(args, "OO|p:purge", &url_o, &prefix_o, &dry) ||
      (url = ec_key_text(url_o, "the Store URL")) == NULL ||
      (prefix = ec_key_text(prefix_o, "the namespace")) == NULL)
    return NULL;
  encache_store *st = NULL;
  uint64_t objects = 0, bytes = 0;
  char msg[1024] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = encache_store_open(url, &st);
  if (rc == 0)
    rc = dry ? encache_store_count_prefix(st, prefix, &objects, &bytes)
             : encache_store_remove_prefix(st, prefix, &objects);
  if (rc < 0)
    PyOS_snprintf(msg, sizeof(msg), "%s", encache_store_errmsg(st));
  encache_store_close(st);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return ec_raise(rc, msg);
  if (dry)
    return Py_BuildValue("(KK)", (unsigned long long)objects,
                         (unsigned long long)bytes);
  return Py_BuildValue("(KO)", (unsigned long long)objects, Py_None);
}

static PyObject *mod_dtype_parse(PyObject *self, PyObject *args) {
  (void)self;
  const char *name;
  if (!PyArg_ParseTuple(args, "s:dtype_parse", &name))
    return NULL;
  int code = encache_dtype_parse(name);
  return PyLong_FromLong(code < 0 ? -1 : code);
}

static PyMethodDef methods[] = {
    {"dtype_parse", mod_dtype_parse, METH_VARARGS,
     "dtype_parse(name) -> int: the library's code of a dtype name "
     "(encache_dtype_parse: \"bfloat16\", \"torch.float16\", \"fp32\", "
     "...), or -1."},
    {"purge", mod_purge, METH_VARARGS,
     "purge(url, prefix, dry_run=False) -> (objects, bytes or None): "
     "removes (or counts) the objects whose keys start with prefix."},
    {"model_identity", mod_identity, METH_VARARGS,
     "model_identity(model_dir, label=None) -> str: an identity derived "
     "from the digest of the model's weight files, for "
     "embedding_model_identity (as `encache identity`)."},
    {"url_redact", mod_url_redact, METH_VARARGS,
     "url_redact(url) -> str: the Store URL with its password hidden, as "
     "every message of the library shows it."},
    {"set_block_cache", mod_block_cache, METH_VARARGS,
     "set_block_cache(max_bytes) -> int: the most bytes of freed hit "
     "memory kept for reuse by later lookups (default 64 MiB; 0 keeps "
     "none); returns the previous value."},
    {"shm_destroy", mod_shm_destroy, METH_VARARGS,
     "shm_destroy(name) -> bool: removes the shared-memory segment `name` "
     "(processes attached keep their mapping); False if there is none."},
    {"_init", (PyCFunction)(void (*)(void))mod_init,
     METH_VARARGS | METH_KEYWORDS, "Set the package's classes (internal)."},
    {"_set_outputs", mod_outputs, METH_VARARGS,
     "Set torch's from_dlpack and numpy.asarray (internal)."},
    {"library_version", mod_version, METH_NOARGS,
     "The version of the libencache this module runs on."},
    {"_bench_c_lookup", ec_bench_c_lookup, METH_VARARGS,
     "Times the C lookup loop alone (the benchmark's baseline)."},
    {"_bench_c_publish", ec_bench_c_publish, METH_VARARGS,
     "Times encache_publish() from C alone (the benchmark's baseline)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "encache._encache",
    "The C half of the encache package (use the package, not this).", -1,
    methods, NULL, NULL, NULL, NULL};

/* The library's tables, for the package's enumerations and errors. */
static int add_tables(PyObject *m) {
  PyObject *codes = PyDict_New(), *skips = PyList_New(0),
           *outcomes = PyList_New(0);
  int rc = codes != NULL && skips != NULL && outcomes != NULL ? 0 : -1;
#define CODE_(name, value, msg)                                              \
  if (rc == 0) {                                                             \
    PyObject *v = PyLong_FromLong(value);                                    \
    rc = v == NULL ? -1 : PyDict_SetItemString(codes, #name, v);             \
    Py_XDECREF(v);                                                           \
  }
  ENCACHE_ERRNO_MAP(CODE_)
#undef CODE_
#define SKIP_(name, value, msg)                                              \
  if (rc == 0) {                                                             \
    PyObject *v = Py_BuildValue("(sis)", #name, value, msg);                 \
    rc = v == NULL ? -1 : PyList_Append(skips, v);                           \
    Py_XDECREF(v);                                                           \
  }
  ENCACHE_SKIP_MAP(SKIP_)
#undef SKIP_
  for (int o = ENCACHE_HIT; rc == 0 && o <= ENCACHE_IN_FLIGHT; o++) {
    PyObject *v = PyUnicode_FromString(encache_outcome_name(o));
    rc = v == NULL ? -1 : PyList_Append(outcomes, v);
    Py_XDECREF(v);
  }
  if (rc == 0)
    rc = PyModule_AddObjectRef(m, "CODES", codes) < 0 ||
                 PyModule_AddObjectRef(m, "SKIPS", skips) < 0 ||
                 PyModule_AddObjectRef(m, "OUTCOMES", outcomes) < 0
             ? -1
             : 0;
  Py_XDECREF(codes);
  Py_XDECREF(skips);
  Py_XDECREF(outcomes);
  return rc;
}

PyMODINIT_FUNC PyInit__encache(void) {
  if (ec_core_fork_init() != 0 || ec_block_cache_init() != 0)
    return PyErr_Format(PyExc_ImportError, "pthread_atfork failed");
  PyObject *m = PyModule_Create(&moduledef);
  if (m == NULL)
    return NULL;
  if (ec_handle_register(m) < 0 || ec_step_register(m) < 0 ||
      ec_result_register(m) < 0 || ec_buffer_register(m) < 0 ||
      ec_vllm_hooks_register(m) < 0 ||
      PyModule_AddIntConstant(m, "MAX_STEPS", ENCACHE_MAX_STEPS) < 0 ||
      PyModule_AddStringConstant(m, "VERSION", ENCACHE_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "FLOAT32", ENCACHE_FLOAT32) < 0 ||
      PyModule_AddIntConstant(m, "FLOAT16", ENCACHE_FLOAT16) < 0 ||
      PyModule_AddIntConstant(m, "BFLOAT16", ENCACHE_BFLOAT16) < 0 ||
      PyModule_AddIntConstant(m, "DEVICE_HOST", ENCACHE_DEVICE_HOST) < 0 ||
      PyModule_AddIntConstant(m, "DEVICE_CUDA", ENCACHE_DEVICE_CUDA) < 0 ||
      add_tables(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
