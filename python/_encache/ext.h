/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ext.h: the CPython extension module encache._encache (docs/python.md).
 *
 * The module binds libencache's engine for the Python package: a handle
 * (Handle, subclassed by encache.Cache), its steps (Step) and their
 * results (Result), and the memory that hits land in (blocks, shown to
 * Python as torch tensors through DLPack, or as Buffer objects that NumPy
 * reads through the buffer protocol).
 *
 * Threads: the GIL is released around every library call that may touch
 * the Store or wait.  The library wants the calls on one handle serialised, so
 * each handle has a lock, always taken with the GIL released (a thread
 * holding the lock may need the GIL: the library reaps publications, and
 * so drops references to Python objects, inside those calls).  The
 * library never calls back into Python from its worker thread.  Storage
 * releases and log messages come on the thread that called it, or, for a
 * lookup started with wait=False, on the handle's lookup thread, which
 * takes the GIL for them (never `lock`: the caller holding it may be
 * waiting for that lookup); the allocator of hits needs no GIL.
 *
 * Fork: a handle remembers the fork generation it was opened in; in a
 * child every use raises ForkError, and the child never closes it (the
 * parent's worker thread does not exist there).
 */
#ifndef ENCACHE_PY_EXT_H
#define ENCACHE_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <encache.h>

/* What hits come back as. */
enum { OUT_BUFFER = 0, OUT_NUMPY = 1, OUT_TORCH = 2 };

typedef struct ec_pub ec_pub;
typedef struct ec_lookup ec_lookup; /* lookup.c: one lookup's state */

typedef struct handle {
  PyObject_HEAD
  encache *ec;
  PyThread_type_lock lock; /* serialises the calls on ec */
  unsigned long locked_by; /* the thread holding lock, 0 when none */
  unsigned long fork_gen;  /* the fork generation ec was opened in */
  int output;              /* OUT_* */
  int opened;              /* __init__ ran (or runs): never again */
  ec_pub **live;           /* storages alive (storage.c); under live_lock */
  size_t live_n, live_cap;
  PyThread_type_lock live_lock; /* a leaf lock: the lookup thread's reaps
                                   release storages without `lock` */
  /* Lookups started (wait=False) and not yet collected (waited for, or
   * their step closed); under lock.  While one is, the library's lookup
   * thread may reap publications, so storages are not shared (storage.c). */
  size_t pending_lookups;
  int closed_poisoned;     /* the close found the handle poisoned */
  PyObject *log;           /* callable(str) or NULL */
  unsigned skips_logged;   /* bit r: a skip for reason r was logged */
  PyObject *weakrefs;
} handle;

typedef struct step {
  PyObject_HEAD
  handle *owner;        /* strong reference; NULL once closed */
  encache_step *st;     /* NULL once closed; written under owner's lock */
  PyObject *results;    /* list of Result */
  /* The lookup started with wait=False and not yet collected, or NULL:
   * the library's lookup thread writes into it until then (lookup.c). */
  ec_lookup *pending;
} step;

/* module.c: shared state set by encache._encache._init(). */
extern PyTypeObject ec_handle_type, ec_step_type, ec_result_type,
    ec_buffer_type;
extern PyObject *ec_outcomes;  /* tuple: Outcome members by code */
extern PyObject *ec_skips;     /* tuple: Skip members by code */
extern PyObject *ec_describe;  /* callable(tensor) -> publish description */
extern PyObject *ec_dtype_of;  /* callable(obj) -> dtype code (cached) */
extern PyObject *ec_device_of; /* callable(obj) -> (kind, index) (cached) */
/* callable(dtype code, rows, cols, index) -> (object, address, stream) of
 * a new matrix on CUDA device index, or None when nothing can allocate
 * there (the destinations of a lookup's CUDA items). */
extern PyObject *ec_device_empty;
extern PyObject *ec_from_dlpack; /* torch's from_dlpack, or NULL */
extern PyObject *ec_as_array;    /* numpy.asarray, or NULL */
/* The package's subclass of Step that steps are made as (encache.Step),
 * or NULL (then Step itself). */
extern PyTypeObject *ec_step_class;
/* The handle whose callback (its log callable, a storage's release) this
 * thread runs, or NULL.  On the library's lookup thread, which holds the
 * handle's turn meanwhile, a call into that handle would wait for itself:
 * ec_handle_usable() refuses it, as it does on the caller's thread. */
extern _Thread_local handle *ec_calling_back;
extern unsigned long ec_fork_gen;

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
/* 0 when h can be used now; else raises (ClosedError, ForkError, or
 * InvalidError for a call from code the Cache itself is running: its log
 * callable, or a finalizer of a tensor it releases), -1. */
int ec_handle_usable(handle *h);
/* Runs `stmt` (library calls on h) with the GIL released and h's lock
 * held, or sets rc to ENCACHE_ECLOSED when h was closed meanwhile (by
 * another thread).  Call it with the GIL held; stmt must not touch Python. */
#define EC_LOCKED(h, rc, stmt)                                               \
  do {                                                                       \
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock((h)->lock, WAIT_LOCK);      \
    (h)->locked_by = PyThread_get_thread_ident();                            \
    if ((h)->ec == NULL)                                                     \
      (rc) = ENCACHE_ECLOSED;                                                \
    else {                                                                   \
      stmt;                                                                  \
    }                                                                        \
    (h)->locked_by = 0;                                                      \
    PyThread_release_lock((h)->lock);                                        \
    Py_END_ALLOW_THREADS                                                     \
  } while (0)
/* The log callback given to encache_open() (ctx: the handle). */
void ec_log(void *ctx, const char *message);

/* buffer.c: the memory of hits. */
int ec_block_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **blk);
void ec_block_release(void *ctx, size_t i, void *data, void *blk);
/* Registers the block cache's fork handlers; 0 or an errno. */
int ec_block_cache_init(void);
/* Sets the most bytes of freed blocks kept for reuse; the old value. */
size_t ec_block_cache_set(size_t max_bytes);
/* A copy of src[0..nbytes) in a block (from the cache when one fits) and
 * the storage that owns it, one reference in *out (its release returns
 * the block, on any thread); the copy's address in *copy.  Call with the
 * GIL held (the caller's other threads must not change src meanwhile).
 * 0, or ENCACHE_ENOMEM. */
int ec_snapshot(const void *src, uint64_t nbytes, encache_storage **out,
                const void **copy);
/* The Python object (tensor, array or Buffer) that takes ownership of
 * block blk holding a rows x cols matrix of dtype; NULL with an exception
 * set (blk is then freed). */
PyObject *ec_block_wrap(void *blk, int output, int dtype, uint64_t rows,
                        uint64_t cols);

/* storage.c: a publication's storage.  prepare (GIL held) records the
 * memory and a reference to `keep`; acquire (under h's lock, no GIL)
 * gives *out a reference to the listed storage of that memory, or makes
 * one from *prep (then *prep is set to NULL: the storage owns it);
 * discard (GIL held) drops a *prep left over. */
ec_pub *ec_pub_prepare(handle *h, PyObject *keep, uintptr_t base,
                       uint64_t nbytes);
int ec_pub_acquire(handle *h, ec_pub **prep, encache_storage **out);
void ec_pub_discard(ec_pub *p);

/* step.c */
PyObject *ec_step_new(handle *h);
/* The arguments of lookup(items, wait=True) (a METH_FASTCALL |
 * METH_KEYWORDS method's); 0 or -1 raised. */
int ec_lookup_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **items, int *wait);
/* 0 when s can be used now; else raises (ClosedError, ForkError), -1. */
int ec_step_usable(step *s);
/* Closes s (Step.close()); idempotent. */
void ec_step_close(step *s);

/* lookup.c.  Looks items up on s: with wait, the new Results (a list, also
 * appended to s's); without, starts the lookup (encache_lookup_start) and
 * returns a new reference to s, whose pending lookup ec_step_complete()
 * collects. */
PyObject *ec_step_lookup(step *s, PyObject *items, int wait);
/* r (a Result) is a hit: its id and output, borrowed; else NULL. */
PyObject *ec_result_hit(PyObject *r, PyObject **id);
/* Waits at most timeout_s seconds (< 0: without a bound, 0: a poll) for
 * s's pending lookup, with the GIL released, and appends its Results to
 * s's: 1 when none is pending (any more), 0 when it still is, -1 raised
 * (the lookup's error: it is then done with). */
int ec_step_complete(step *s, double timeout_s);
/* Under h's lock: k is collected (no longer counted as pending). */
void ec_lookup_collected_locked(handle *h, ec_lookup *k);
/* Under h's lock: whether h is poisoned (or its state unknown). */
int ec_handle_poisoned_locked(handle *h);
/* With the GIL, k just taken off its closing step: 1 when a wait() on
 * another thread runs on it (k is then that wait's to free, once it sees
 * the step closed), 0 when k is the caller's. */
int ec_lookup_hand_to_waiter(ec_lookup *k);
/* Frees k, the caller's (ec_lookup_hand_to_waiter() said so), whose
 * library step is closed (or its handle): its hits are released and its
 * CUDA destinations dropped, unless `poisoned`. */
void ec_step_drop_pending(ec_lookup *k, int poisoned);
/* worker.c: WorkerStep, the step state of encache.vllm's worker half. */
extern PyTypeObject ec_worker_step_type, ec_connector_hooks_type;
/* Readies the types; 0 or -1 raised. */
int ec_worker_step_init(void);
/* bench.c */
PyObject *ec_bench_c_lookup(PyObject *self, PyObject *args);
PyObject *ec_bench_c_publish(PyObject *self, PyObject *args);

#endif
