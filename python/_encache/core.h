/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core.h: the module core of encache._encache (docs/python.md), the room
 * every other room of the extension stands on: the module-wide state the
 * package sets through _init() and _set_outputs(), the errors, the text
 * of keys and of the library's messages, and the fork generation.  It
 * names no type of the rooms above it.
 *
 * The extension binds libencache's engine for the Python package, in
 * rooms (docs/development.md has their floors), bottom up: this core;
 * buffer (the memory of hits, Buffer), handle (an open handle's state and
 * its lock), items (a lookup's items read into candidates) and result
 * (Result); storage (a publication's storage) and
 * step (a step's state); lookup (a step's lookups); step_type (Step);
 * handle_type (Handle, subclassed by encache.Cache); bench and vllm_hooks
 * (the vLLM connector's WorkerStep and ConnectorHooks); on top module (the
 * module's functions and PyInit__encache, which registers each type).
 *
 * Fork: a handle remembers the fork generation it was opened in (handle.h);
 * in a child every use raises ForkError, and the child never closes it
 * (the parent's worker thread does not exist there).
 */
#ifndef ENCACHE_PY_CORE_H
#define ENCACHE_PY_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <encache.h>

/* Set by encache._encache._init() (ec_core_init). */
extern PyObject *ec_outcomes;  /* tuple: Outcome members by code */
extern PyObject *ec_skips;     /* tuple: Skip members by code */
extern PyObject *ec_describe;  /* callable(tensor) -> publish description */
extern PyObject *ec_dtype_of;  /* callable(obj) -> dtype code (cached) */
extern PyObject *ec_device_of; /* callable(obj) -> (kind, index) (cached) */
/* callable(dtype code, rows, cols, index) -> (object, address, stream) of
 * a new matrix on CUDA device index, or None when nothing can allocate
 * there (the destinations of a lookup's CUDA items). */
extern PyObject *ec_device_empty;
/* Set by _set_outputs() (module.c). */
extern PyObject *ec_from_dlpack; /* torch's from_dlpack, or NULL */
extern PyObject *ec_as_array;    /* numpy.asarray, or NULL */

/* The fork generation: incremented in a child after fork(). */
extern unsigned long ec_fork_gen;
/* Registers the fork handler that counts ec_fork_gen; 0 or an errno. */
int ec_core_fork_init(void);

/* The work of _init(errors, error_base, invalid_error, closed_error,
 * fork_error, outcomes, skips, describe, dtype_of, device_of,
 * device_empty, step_type=None): sets the state above and the error
 * classes, and gives *step_type the package's subclass of step_base (the
 * Step type, which this room does not know), borrowed, or NULL when none
 * was given.  0, or -1 raised (nothing set). */
int ec_core_init(PyObject *args, PyObject *kw, PyTypeObject *step_base,
                 PyTypeObject **step_type);

/* The UTF-8 text of str s, which reaches a Store key or an option: NULL
 * with InvalidError ("WHAT: ...") when s is not a str, holds a NUL (a C
 * string would end there: "a\0b" would be the key of "a") or is not valid
 * UTF-8.  The text lives as long as s. */
const char *ec_key_text(PyObject *s, const char *what);
/* A str of the library's text, which may quote bytes that are not UTF-8
 * (keys, Store replies): those are replaced, never an error. */
PyObject *ec_text(const char *s);
/* The exception class of library code `code` (encache.Error for 0 or a
 * code without a class of its own); borrowed. */
PyObject *ec_error_class(int code);
/* Raises the exception of library code `code` with `detail` (may be NULL
 * or ""); returns NULL. */
PyObject *ec_raise(int code, const char *detail);
/* Raises InvalidError with a formatted message; returns NULL. */
PyObject *ec_invalid(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* Raises ClosedError (ENCACHE_ECLOSED) or ForkError with message msg;
 * returns NULL.  For handle.c's checks of a handle. */
PyObject *ec_raise_closed(const char *msg);
PyObject *ec_raise_fork(const char *msg);

#endif
