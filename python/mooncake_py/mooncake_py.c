/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_py.c: libencache_mooncake_py.so, Mooncake's store C ABI
 * (store_c.h: the mooncake_store_* functions src/store/mooncake.c loads)
 * over Mooncake's Python client, mooncake.store.MooncakeDistributedStore,
 * for a Mooncake installed from pip: its wheels hold the Python client
 * but not the C ABI (docs/stores.md, "Mooncake from pip").
 *
 * Why a C ABI and not a Store backend of its own: the Mooncake backend is
 * then the same code whatever the route (its code table, the read rounds,
 * the direct reads with headroom, the existence checks asked ahead for
 * queued writes, the write buffers), so the two routes cannot classify an
 * answer differently; and it runs wherever libencache runs, in a C program
 * (the tool, the test suites) as in a Python process.  The encache Python
 * package points ENCACHE_MOONCAKE_LIBRARY here when no libmooncake_store.so
 * loads (encache/_mooncake.py).
 *
 * Python: in a process that runs Python already (the package's), the
 * functions are found in the process (dlsym RTLD_DEFAULT).  Otherwise the
 * first create starts an interpreter: it asks $ENCACHE_MOONCAKE_PYTHON
 * (else `python3` on PATH), in a child process, for its shared libpython,
 * its sys.path and whether it has the package `mooncake`; loads that
 * libpython, initialises it without signal handlers, gives it that
 * sys.path and releases the GIL.  The interpreter is never finalised: a
 * Mooncake client's threads may outlive destroy.  Only functions of
 * CPython's stable ABI are used, through pointers, so the library needs no
 * Python headers and serves any CPython 3.
 *
 * Threads: every function takes the GIL (PyGILState_Ensure) around its
 * calls into Python; the client's methods release it while they transfer
 * (pybind11's gil_scoped_release), so Python threads and the engine's
 * other Store calls run meanwhile.  Nothing is called once the interpreter
 * is finalising: an operation then answers RPC_FAIL (-900), "not done".
 *
 * Answers: the client's own, unchanged (the backend's table classifies
 * them).  What the client cannot answer: an exception raised by a call
 * (its completion unknown) answers -1, a code outside the table, which
 * the backend takes as unknown (a read or write unconfirmed, an existence
 * check failed); a key that is not UTF-8 (no Python str carries it, so
 * vLLM's client cannot name it either) answers INVALID_PARAMS (-600)
 * before any call; so does a call before setup succeeded, without
 * reaching the client (whose existence check crashes on a client never
 * set up).  put_from's replicate_config is ignored: the client's default,
 * one replica (the backend passes NULL, the C ABI's default).
 *
 * Somewhat over 600 lines, on purpose: the binding of CPython, the
 * interpreter's start and the functions of one ABI read together.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MCPY_API __attribute__((visibility("default")))

extern char **environ;

/* CPython's objects, opaque here. */
typedef struct mcpy_object PyObject;

/* The functions of CPython's stable ABI that are used, named in
 * py_names in the same order. */
static struct {
  int (*IsInitialized)(void);
  int (*IsFinalizing)(void); /* NULL: a CPython without it */
  void (*InitializeEx)(int);
  void *(*SaveThread)(void);
  int (*GILEnsure)(void);
  void (*GILRelease)(int);
  PyObject *(*Import)(const char *);
  PyObject *(*GetAttr)(PyObject *, const char *);
  PyObject *(*Call)(PyObject *, PyObject *);
  PyObject *(*TupleNew)(ptrdiff_t);
  int (*TupleSet)(PyObject *, ptrdiff_t, PyObject *);
  PyObject *(*ListNew)(ptrdiff_t);
  int (*ListSet)(PyObject *, ptrdiff_t, PyObject *);
  int (*ListAppend)(PyObject *, PyObject *);
  ptrdiff_t (*ListSize)(PyObject *);
  PyObject *(*ListGet)(PyObject *, ptrdiff_t);
  PyObject *(*Str)(const char *, ptrdiff_t, const char *);
  PyObject *(*FromU64)(unsigned long long);
  long long (*AsI64)(PyObject *);
  PyObject *(*Bool)(long);
  void (*DecRef)(PyObject *);
  PyObject *(*ErrOccurred)(void);
  void (*ErrUnraisable)(PyObject *);
  void (*ErrClear)(void);
  int (*SysSet)(const char *, PyObject *);
} py;

static const char *const py_names[] = {
    "Py_IsInitialized",       "Py_IsFinalizing",
    "Py_InitializeEx",        "PyEval_SaveThread",
    "PyGILState_Ensure",      "PyGILState_Release",
    "PyImport_ImportModule",  "PyObject_GetAttrString",
    "PyObject_CallObject",    "PyTuple_New",
    "PyTuple_SetItem",        "PyList_New",
    "PyList_SetItem",         "PyList_Append",          "PyList_Size",
    "PyList_GetItem",         "PyUnicode_DecodeUTF8",
    "PyLong_FromUnsignedLongLong", "PyLong_AsLongLong",
    "PyBool_FromLong",        "Py_DecRef",
    "PyErr_Occurred",         "PyErr_WriteUnraisable",
    "PyErr_Clear",            "PySys_SetObject"};

_Static_assert(sizeof(py) == sizeof(py_names) / sizeof(py_names[0]) *
                                 sizeof(void (*)(void)),
               "one name per function of py");

#define MC_INVALID_PARAMS (-600)
#define MC_RPC_FAIL (-900)
#define MC_UNKNOWN (-1)

/* -------------------------------------------------------- the interpreter */

static pthread_once_t py_once = PTHREAD_ONCE_INIT;
static int py_ready; /* py is filled and an interpreter runs */

static void say(const char *what, const char *a, const char *b) {
  fprintf(stderr, "encache: Mooncake through its Python client: %s%s%s\n",
          what, a, b);
}

/* Fills py from lib (RTLD_DEFAULT: this process); 0, or -1 when a
 * function is missing. */
static int py_bind(void *lib) {
  for (size_t i = 0; i < sizeof(py_names) / sizeof(py_names[0]); i++) {
    void *f = dlsym(lib, py_names[i]);
    if (f == NULL && i == 1) /* public from CPython 3.13 on */
      f = dlsym(lib, "_Py_IsFinalizing");
    if (f == NULL && i != 1) {
      say("this Python has no ", py_names[i], "");
      return -1;
    }
    memcpy((char *)&py + i * sizeof(void (*)(void)), &f, sizeof(f));
  }
  return 0;
}

/* What the interpreter that has Mooncake says of itself, one item a line:
 * its shared libpython (empty: none), 1 when it has the package mooncake,
 * then its sys.path. */
static const char probe_code[] =
    "import importlib.util, os, sys, sysconfig\n"
    "v = sysconfig.get_config_var\n"
    "lib = os.path.join(v('LIBDIR') or '', v('INSTSONAME') or '')\n"
    "print(lib if v('Py_ENABLE_SHARED') and os.path.exists(lib) else '')\n"
    "print(1 if importlib.util.find_spec('mooncake') else 0)\n"
    "for p in sys.path: print(p)\n";

/* Runs the probe with python (a name on PATH, or a path: a relative one
 * is taken from the current directory, its links kept, since a virtual
 * environment is known by the path of its bin/python): its output
 * (malloc'd), or NULL. */
static char *probe(const char *python) {
  char abs[4096];
  if (strchr(python, '/') != NULL && python[0] != '/') {
    char cwd[2048];
    if (getcwd(cwd, sizeof(cwd)) == NULL ||
        snprintf(abs, sizeof(abs), "%s/%s", cwd, python) >= (int)sizeof(abs))
      return NULL;
    python = abs;
  }
  int fd[2];
  if (pipe(fd) != 0)
    return NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
  posix_spawn_file_actions_addclose(&fa, fd[0]);
  /* Not the program's directory: nothing there may shadow a module. */
  posix_spawn_file_actions_addchdir_np(&fa, "/");
  char *argv[] = {(char *)python, (char *)"-c", (char *)probe_code, NULL};
  pid_t pid;
  int rc = posix_spawnp(&pid, python, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd[1]);
  char *out = NULL;
  size_t len = 0, cap = 0;
  while (rc == 0) {
    if (len + 4096 > cap) {
      char *p = realloc(out, cap = len + 65536);
      if (p == NULL)
        break;
      out = p;
    }
    ssize_t r = read(fd[0], out + len, cap - len - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
  }
  close(fd[0]);
  int status = 1;
  while (rc == 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (rc != 0 || out == NULL || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    say("cannot ask ", python,
        " about itself (set ENCACHE_MOONCAKE_PYTHON to the Python that "
        "has Mooncake's package)");
    free(out);
    return NULL;
  }
  out[len] = '\0';
  return out;
}

/* The next line of *p (cut in place), or NULL at the end. */
static char *line(char **p) {
  char *l = *p;
  if (l == NULL || *l == '\0')
    return NULL;
  char *end = strchr(l, '\n');
  if (end != NULL)
    *end++ = '\0';
  *p = end;
  return l;
}

/* Sets sys.path to the rest of the probe's lines but the empty one (the
 * probe's current directory: a program's own is not a place to import
 * from), and sys.argv; under the GIL of the interpreter just started. */
static int set_sys(char *rest) {
  PyObject *path = py.ListNew(0), *argv = py.ListNew(1);
  int rc = path != NULL && argv != NULL ? 0 : -1;
  for (const char *l; rc == 0 && (l = line(&rest)) != NULL;) {
    if (l[0] == '\0')
      continue;
    PyObject *s = py.Str(l, (ptrdiff_t)strlen(l), "surrogateescape");
    rc = s != NULL ? py.ListAppend(path, s) : -1;
    if (s != NULL)
      py.DecRef(s);
  }
  if (rc == 0) {
    PyObject *s = py.Str("encache", 7, NULL);
    rc = s != NULL ? py.ListSet(argv, 0, s) : -1;
  }
  if (rc == 0)
    rc = py.SysSet("path", path) == 0 && py.SysSet("argv", argv) == 0 ? 0
                                                                      : -1;
  if (path != NULL)
    py.DecRef(path);
  if (argv != NULL)
    py.DecRef(argv);
  return rc;
}

/* Starts an interpreter in a process that runs none (see the top). */
static int py_embed(void) {
  const char *python = getenv("ENCACHE_MOONCAKE_PYTHON");
  if (python == NULL || python[0] == '\0')
    python = "python3";
  char *out = probe(python);
  if (out == NULL)
    return -1;
  char *rest = out, *lib = line(&rest), *has = line(&rest);
  int rc = -1;
  if (lib == NULL || lib[0] == '\0')
    say(python, " has no shared libpython to run in this process (a "
                "Python built with --enable-shared has one)", "");
  else if (has == NULL || strcmp(has, "1") != 0)
    say(python, " has no package mooncake: pip install "
                "mooncake-transfer-engine (or -non-cuda) for it, or set "
                "ENCACHE_MOONCAKE_PYTHON to the Python that has it", "");
  else if (dlopen(lib, RTLD_NOW | RTLD_GLOBAL) == NULL)
    say("cannot load ", lib, "");
  else if (py_bind(RTLD_DEFAULT) == 0) {
    rc = 0;
    if (!py.IsInitialized()) {
      py.InitializeEx(0); /* no signal handlers: the program's stay */
      rc = set_sys(rest);
      if (rc != 0)
        say("cannot set sys.path in ", lib, "");
      py.SaveThread(); /* the GIL goes; this thread's state stays */
    }
  }
  free(out);
  return rc;
}

static void py_start(void) {
  void *f = dlsym(RTLD_DEFAULT, "Py_IsInitialized");
  int (*is_init)(void) = NULL;
  memcpy(&is_init, &f, sizeof(f));
  if (is_init != NULL && is_init())
    py_ready = py_bind(RTLD_DEFAULT) == 0;
  else
    py_ready = py_embed() == 0;
}

/* Takes the GIL into *st: 0, or -1 when Python cannot be called. */
static int gil_take(int *st) {
  if (!py_ready || (py.IsFinalizing != NULL && py.IsFinalizing()))
    return -1;
  *st = py.GILEnsure();
  return 0;
}

/* ------------------------------------------------------------- the client */

enum {
  M_SETUP, M_HEALTH, M_PUT_FROM, M_GET_INTO, M_EXISTS, M_SIZE, M_REMOVE,
  M_REGEX, M_REGISTER, M_UNREGISTER, M_CLOSE, M_N
};
static const char *const m_names[M_N] = {
    "setup",    "health_check",    "put_from",        "batch_get_into",
    "batch_is_exist", "get_size",  "remove",          "remove_by_regex",
    "register_buffer", "unregister_buffer", "close"};

/* A handle: the client and its bound methods (NULL: the client has none);
 * ready once setup answered 0. */
typedef struct mcpy {
  PyObject *store;
  PyObject *m[M_N];
  int ready;
} mcpy;

/* Calls method m of s with args (a tuple, taken; NULL: a conversion
 * failed, nothing is called); with the GIL.  The answer (a new reference),
 * or NULL after an exception, which is printed as unraisable. */
static PyObject *call(mcpy *s, int m, PyObject *args) {
  if (args == NULL || s->m[m] == NULL) {
    if (args != NULL)
      py.DecRef(args);
    py.ErrClear();
    return NULL;
  }
  PyObject *r = py.Call(s->m[m], args);
  py.DecRef(args);
  if (r == NULL && py.ErrOccurred() != NULL)
    py.ErrUnraisable(s->m[m]);
  return r;
}

/* A tuple of the n objects of v (taken); NULL when one is NULL. */
static PyObject *tuple(PyObject **v, int n) {
  PyObject *t = NULL;
  int ok = 1;
  for (int i = 0; i < n; i++)
    ok &= v[i] != NULL;
  if (ok)
    t = py.TupleNew(n);
  for (int i = 0; i < n; i++)
    if (v[i] != NULL) {
      if (t != NULL)
        py.TupleSet(t, i, v[i]); /* (takes v[i]) */
      else
        py.DecRef(v[i]);
    }
  return t;
}

static PyObject *str(const char *s) {
  return py.Str(s != NULL ? s : "", (ptrdiff_t)strlen(s != NULL ? s : ""),
                NULL);
}

static PyObject *u64(uint64_t v) { return py.FromU64(v); }

/* A list of n objects made by one of the makers below from v; NULL when
 * one cannot be made. */
static PyObject *list(size_t n, PyObject *(*make)(const void *, size_t),
                      const void *v) {
  PyObject *l = py.ListNew((ptrdiff_t)n);
  for (size_t i = 0; l != NULL && i < n; i++) {
    PyObject *o = make(v, i);
    if (o == NULL || py.ListSet(l, (ptrdiff_t)i, o) != 0) {
      py.DecRef(l);
      l = NULL;
    }
  }
  return l;
}

static PyObject *key_at(const void *v, size_t i) {
  return str(((const char *const *)v)[i]);
}
static PyObject *buf_at(const void *v, size_t i) {
  return u64((uintptr_t)((void *const *)v)[i]);
}
static PyObject *size_at(const void *v, size_t i) {
  return u64(((const size_t *)v)[i]);
}

/* An integer answer r (taken), or MC_UNKNOWN when r is not one. */
static int64_t answer(PyObject *r) {
  if (r == NULL)
    return MC_UNKNOWN;
  long long v = py.AsI64(r);
  py.DecRef(r);
  if (v == -1 && py.ErrOccurred() != NULL) {
    py.ErrClear();
    return MC_UNKNOWN;
  }
  return v;
}

/* Takes the GIL for a call on handle h into *st: 1, or 0 (no GIL
 * taken) when Python cannot be called or, with need_ready, the client is
 * not set up. */
static int enter(mcpy *s, int need_ready, int *st) {
  return s != NULL && (s->ready || !need_ready) && gil_take(st) == 0;
}

/* The answer of a call enter() refused: not set up, or no Python. */
static int refused(const mcpy *s) {
  return s != NULL && s->ready ? MC_RPC_FAIL : MC_INVALID_PARAMS;
}

/* Calls method m of s with the n arguments of v (taken), under the GIL:
 * its integer answer, MC_INVALID_PARAMS when an argument could not be
 * made (nothing called), MC_UNKNOWN after an exception. */
static int64_t invoke(mcpy *s, int m, PyObject **v, int n) {
  PyObject *args = tuple(v, n);
  int64_t r = args == NULL ? MC_INVALID_PARAMS : answer(call(s, m, args));
  py.ErrClear();
  return r;
}

MCPY_API void *mooncake_store_create(void) {
  pthread_once(&py_once, py_start);
  int st;
  mcpy *s = calloc(1, sizeof(*s));
  if (s == NULL || gil_take(&st) != 0) {
    free(s);
    return NULL;
  }
  PyObject *mod = py.Import("mooncake.store");
  PyObject *cls = mod != NULL ? py.GetAttr(mod, "MooncakeDistributedStore")
                              : NULL;
  s->store = cls != NULL ? py.Call(cls, NULL) : NULL;
  if (s->store == NULL) {
    if (py.ErrOccurred() != NULL)
      py.ErrUnraisable(mod);
    say("cannot make a mooncake.store.MooncakeDistributedStore", "", "");
  }
  for (int i = 0; s->store != NULL && i < M_N; i++)
    s->m[i] = py.GetAttr(s->store, m_names[i]);
  py.ErrClear(); /* a method the client lacks answers MC_UNKNOWN */
  if (cls != NULL)
    py.DecRef(cls);
  if (mod != NULL)
    py.DecRef(mod);
  mcpy *out = s->store != NULL ? s : NULL;
  if (out == NULL)
    free(s);
  py.GILRelease(st);
  return out;
}

MCPY_API void mooncake_store_destroy(void *h) {
  mcpy *s = h;
  int st;
  if (!enter(s, 0, &st))
    return; /* (a finalising interpreter: left as it is) */
  if (s->ready)
    invoke(s, M_CLOSE, NULL, 0);
  for (int i = 0; i < M_N; i++)
    if (s->m[i] != NULL)
      py.DecRef(s->m[i]);
  py.DecRef(s->store);
  py.GILRelease(st);
  free(s);
}

MCPY_API int mooncake_store_setup(void *h, const char *local_hostname,
                                  const char *metadata_server,
                                  uint64_t global_segment_size,
                                  uint64_t local_buffer_size,
                                  const char *protocol,
                                  const char *device_name,
                                  const char *master_server_addr) {
  mcpy *s = h;
  int st;
  if (!enter(s, 0, &st) || s->ready)
    return s != NULL && s->ready ? MC_INVALID_PARAMS : MC_UNKNOWN;
  PyObject *v[] = {str(local_hostname), str(metadata_server),
                   u64(global_segment_size), u64(local_buffer_size),
                   str(protocol), str(device_name), str(master_server_addr)};
  int r = (int)invoke(s, M_SETUP, v, 7);
  s->ready = r == 0;
  py.GILRelease(st);
  return r;
}

MCPY_API int mooncake_store_health_check(void *h) {
  mcpy *s = h;
  int st;
  if (s == NULL || !s->ready)
    return 1; /* the client's own answer when not set up */
  if (!enter(s, 1, &st))
    return MC_RPC_FAIL;
  int r = (int)invoke(s, M_HEALTH, NULL, 0);
  py.GILRelease(st);
  return r;
}

MCPY_API int mooncake_store_put_from(void *h, const char *key, void *buffer,
                                     size_t size,
                                     const void *replicate_config) {
  mcpy *s = h;
  int st;
  (void)replicate_config; /* the client's default (see the top) */
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {str(key), u64((uintptr_t)buffer), u64(size)};
  int r = (int)invoke(s, M_PUT_FROM, v, 3);
  py.GILRelease(st);
  return r;
}

/*
 * Calls batch method m with the lists made of a (keys), b and c (NULL:
 * not passed), and puts its n answers in out64 or out32.  0, or the
 * batch's failure: MC_UNKNOWN after an exception or for an answer that is
 * not a list of n integers.  A key that cannot be made answers
 * MC_INVALID_PARAMS for every key, nothing called.
 */
static int batch(mcpy *s, int m, const char **keys, void **bufs,
                 const size_t *sizes, size_t n, int64_t *out64, int *out32) {
  PyObject *v[3] = {list(n, key_at, keys), NULL, NULL};
  int argc = 1;
  if (bufs != NULL) {
    v[1] = list(n, buf_at, bufs);
    v[2] = list(n, size_at, sizes);
    argc = 3;
  }
  int keys_ok = v[0] != NULL;
  PyObject *args = tuple(v, argc);
  PyObject *r = args != NULL ? call(s, m, args) : NULL;
  int rc = 0;
  if (args == NULL && !keys_ok)
    for (size_t i = 0; i < n; i++) {
      if (out64 != NULL)
        out64[i] = MC_INVALID_PARAMS;
      else
        out32[i] = MC_INVALID_PARAMS;
    }
  else if (r == NULL || py.ListSize(r) != (ptrdiff_t)n)
    rc = MC_UNKNOWN;
  for (size_t i = 0; rc == 0 && r != NULL && i < n; i++) {
    long long a = py.AsI64(py.ListGet(r, (ptrdiff_t)i));
    if (a == -1 && py.ErrOccurred() != NULL)
      rc = MC_UNKNOWN;
    else if (out64 != NULL)
      out64[i] = a;
    else
      out32[i] = a < INT32_MIN || a > INT32_MAX ? MC_UNKNOWN : (int)a;
  }
  if (r != NULL)
    py.DecRef(r);
  py.ErrClear();
  return rc;
}

MCPY_API int mooncake_store_batch_get_into(void *h, const char **keys,
                                           void **buffers, const size_t *sizes,
                                           size_t count, int64_t *results) {
  mcpy *s = h;
  int st;
  if (count == 0)
    return 0;
  if (!enter(s, 1, &st))
    return refused(s);
  int rc = batch(s, M_GET_INTO, keys, buffers, sizes, count, results, NULL);
  py.GILRelease(st);
  return rc;
}

MCPY_API int mooncake_store_batch_is_exist(void *h, const char **keys,
                                           size_t count, int *results) {
  mcpy *s = h;
  int st;
  if (count == 0)
    return 0;
  if (!enter(s, 1, &st))
    return refused(s);
  int rc = batch(s, M_EXISTS, keys, NULL, NULL, count, NULL, results);
  py.GILRelease(st);
  return rc;
}

MCPY_API int64_t mooncake_store_get_size(void *h, const char *key) {
  mcpy *s = h;
  int st;
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {str(key)};
  int64_t r = invoke(s, M_SIZE, v, 1);
  py.GILRelease(st);
  return r;
}

MCPY_API int mooncake_store_remove(void *h, const char *key, int force) {
  mcpy *s = h;
  int st;
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {str(key), py.Bool(force)};
  int r = (int)invoke(s, M_REMOVE, v, 2);
  py.GILRelease(st);
  return r;
}

MCPY_API int64_t mooncake_store_remove_by_regex(void *h, const char *pattern,
                                                int force) {
  mcpy *s = h;
  int st;
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {str(pattern), py.Bool(force)};
  int64_t r = invoke(s, M_REGEX, v, 2);
  py.GILRelease(st);
  return r;
}

MCPY_API int mooncake_store_register_buffer(void *h, void *buffer,
                                            size_t size) {
  mcpy *s = h;
  int st;
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {u64((uintptr_t)buffer), u64(size)};
  int r = (int)invoke(s, M_REGISTER, v, 2);
  py.GILRelease(st);
  return r;
}

MCPY_API int mooncake_store_unregister_buffer(void *h, void *buffer) {
  mcpy *s = h;
  int st;
  if (!enter(s, 1, &st))
    return refused(s);
  PyObject *v[] = {u64((uintptr_t)buffer)};
  int r = (int)invoke(s, M_UNREGISTER, v, 1);
  py.GILRelease(st);
  return r;
}
