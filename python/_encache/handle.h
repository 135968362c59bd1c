/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handle.h: an open engine handle's state (struct handle, the object of a
 * Handle: handle_type.c is the type), its lock, whether it can be used
 * now, and the log callback it gives the library.
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
 */
#ifndef ENCACHE_PY_HANDLE_H
#define ENCACHE_PY_HANDLE_H

#include "core.h"

typedef struct ec_pub ec_pub; /* storage.h: a publication's storage */

typedef struct handle {
  PyObject_HEAD
  encache *ec;
  PyThread_type_lock lock; /* serialises the calls on ec */
  unsigned long locked_by; /* the thread holding lock, 0 when none */
  unsigned long fork_gen;  /* the fork generation ec was opened in */
  int output;              /* what hits come back as: OUT_* (buffer.h) */
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

/* The handle whose callback (its log callable, a storage's release) this
 * thread runs, or NULL.  On the library's lookup thread, which holds the
 * handle's turn meanwhile, a call into that handle would wait for itself:
 * ec_handle_usable() refuses it, as it does on the caller's thread. */
extern _Thread_local handle *ec_calling_back;

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
/* Under h's lock: whether h is poisoned (or its state unknown). */
int ec_handle_poisoned_locked(handle *h);
/* The log callback given to encache_open() (ctx: the handle). */
void ec_log(void *ctx, const char *message);

#endif
