/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage.c: the storages of published memory (storage.h), one per
 * backing storage while any publication of it is pending, so that the
 * budgets charge the views of one storage once (docs/python.md, publish).
 *
 * Each handle lists the storages it made that are still alive (h->live),
 * under its live_lock (a storage is released on the reaping thread: the
 * caller's, or the lookup thread for a lookup started with wait=False).
 * A publication looks its memory up there: found, it takes another
 * reference (encache_storage_ref: safe, since a listed
 * storage's last reference can only go in a reap, and reaps run inside
 * library calls made under the handle's lock, or inside a started lookup:
 * while one is pending nothing is shared); not found, it makes one, whose
 * release removes it from the list and drops the Python reference that
 * kept the memory (on the reaping thread, which takes the GIL for it).
 * The binding drops its own reference right after encache_publish(), so a
 * storage lives exactly as long as a queued publication needs it.
 */
#include "storage.h"

#include <stdlib.h>

struct ec_pub {
  handle *h;      /* whose list holds it (the handle outlives its reaps) */
  PyObject *keep; /* holds the memory */
  uintptr_t base;
  uint64_t nbytes;
  encache_storage *s;
};

ec_pub *ec_pub_prepare(handle *h, PyObject *keep, uintptr_t base,
                       uint64_t nbytes) {
  ec_pub *p = PyMem_RawCalloc(1, sizeof(*p));
  if (p == NULL)
    return (ec_pub *)PyErr_NoMemory();
  p->h = h;
  p->keep = Py_NewRef(keep);
  p->base = base;
  p->nbytes = nbytes;
  return p;
}

void ec_pub_discard(ec_pub *p) {
  if (p == NULL)
    return;
  Py_DECREF(p->keep);
  PyMem_RawFree(p);
}

/* The storage's release: off the list, then the memory's reference. */
static void pub_release(void *ctx) {
  ec_pub *p = ctx;
  handle *h = p->h;
  PyThread_acquire_lock(h->live_lock, WAIT_LOCK);
  for (size_t i = 0; i < h->live_n; i++)
    if (h->live[i] == p) {
      h->live[i] = h->live[--h->live_n];
      break;
    }
  PyThread_release_lock(h->live_lock);
  PyGILState_STATE g = PyGILState_Ensure();
  handle *outer = ec_calling_back;
  ec_calling_back = h; /* a finalizer that calls h is refused */
  Py_DECREF(p->keep);
  ec_calling_back = outer;
  PyGILState_Release(g);
  PyMem_RawFree(p);
}

int ec_pub_acquire(handle *h, ec_pub **prep, encache_storage **out) {
  ec_pub *p = *prep;
  int rc = 0;
  PyThread_acquire_lock(h->live_lock, WAIT_LOCK);
  /* While a started lookup may reap on the lookup thread, a listed
   * storage's last reference may go at any moment: none is shared then
   * (each publication charges its own storage). */
  for (size_t i = 0; h->pending_lookups == 0 && i < h->live_n; i++)
    if (h->live[i]->base == p->base && h->live[i]->nbytes == p->nbytes) {
      encache_storage_ref(h->live[i]->s);
      *out = h->live[i]->s;
      goto done; /* *prep stays the caller's, to discard */
    }
  if (h->live_n == h->live_cap) {
    size_t cap = h->live_cap ? 2 * h->live_cap : 16;
    ec_pub **l = realloc(h->live, cap * sizeof(*l));
    if (l == NULL) {
      rc = ENCACHE_ENOMEM;
      goto done;
    }
    h->live = l;
    h->live_cap = cap;
  }
  rc = encache_storage_new((const void *)p->base, p->nbytes, pub_release, p,
                           &p->s);
  if (rc < 0)
    goto done;
  h->live[h->live_n++] = p;
  *out = p->s;
  *prep = NULL; /* the storage's now */
done:
  PyThread_release_lock(h->live_lock);
  return rc;
}
