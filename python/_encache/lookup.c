/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.c: Step.lookup(items) (lookup.h): items to candidates, the
 * library's lookup with the GIL released, results to Result objects.
 *
 * A lookup started with wait=False (encache_lookup_start) runs the same
 * way on the library's lookup thread: its state (struct ec_lookup) then
 * lives in the step until wait() collects it, through the same
 * conversion to Results as the blocking lookup's (lk_finish), or until
 * the step is closed (lk_abandon releases its hits).  Its allocator runs
 * on that thread: it needs no GIL.
 *
 * Items become candidates in items.c.  Host destinations come from buffer.c's allocator, which
 * needs no GIL; the destinations of CUDA items are made before the lookup
 * (with the GIL, by the package's device_empty: torch tensors from torch's
 * own allocator) and handed out by the allocator, so a miss costs a
 * tensor that is dropped.
 */
#include "lookup.h"

#include "buffer.h"
#include "items.h"
#include "result.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STACK_ITEMS 16

/* ------------------------------------------------------ CUDA destinations */

/* cudaStreamLegacy, as cuda_runtime_api.h defines it. */
#define CUDA_STREAM_LEGACY ((uintptr_t)0x1)

typedef struct dests {
  const encache_candidate *c;
  Py_ssize_t n;
  PyObject **obj;    /* per candidate: its CUDA destination, or NULL */
  uintptr_t *addr;   /* ... its address */
  uint64_t *cap;     /* ... its bytes */
  uintptr_t stream;  /* the stream current on their device */
  int device_index;  /* -1 until a CUDA item is seen */
  Py_ssize_t failed; /* the CUDA candidate alloc had nothing for, or -1 */
  int poisoned;      /* the lookup poisoned the handle: keep them all */
} dests;

static int dest_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **blk) {
  dests *d = ctx;
  if (c->device != ENCACHE_DEVICE_CUDA)
    return ec_block_alloc(NULL, i, c, nbytes, data, blk);
  if (d->obj == NULL || d->obj[i] == NULL || nbytes > d->cap[i]) {
    d->failed = (Py_ssize_t)i;
    return -ENODEV;
  }
  *data = (void *)d->addr[i];
  *blk = NULL;
  return 0;
}

static void dest_release(void *ctx, size_t i, void *data, void *blk) {
  const dests *d = ctx;
  if (d->c[i].device != ENCACHE_DEVICE_CUDA)
    ec_block_release(NULL, i, data, blk);
}

/* Drops the destinations, except after a poisoning lookup: a copy may
 * still write into them, so they are never freed (as the library keeps
 * its own buffers then). */
static void dests_free(dests *d) {
  for (Py_ssize_t i = 0; d->obj != NULL && !d->poisoned && i < d->n; i++)
    Py_XDECREF(d->obj[i]);
  PyMem_Free(d->obj);
  PyMem_Free(d->addr);
  PyMem_Free(d->cap);
}

/* Makes the destination of CUDA candidate i (none when the package cannot
 * allocate there: the lookup then fails only if the library has a hit for
 * it); 0 or -1 raised. */
static int dest_make(dests *d, Py_ssize_t i) {
  const encache_candidate *c = &d->c[i];
  if (d->device_index >= 0 && c->device_index != d->device_index)
    return ec_invalid("on cuda:%d, another item on cuda:%d: one CUDA "
                      "device per lookup", c->device_index, d->device_index),
           -1;
  d->device_index = c->device_index;
  if (d->obj == NULL &&
      ((d->obj = PyMem_Calloc((size_t)d->n, sizeof(*d->obj))) == NULL ||
       (d->addr = PyMem_Calloc((size_t)d->n, sizeof(*d->addr))) == NULL ||
       (d->cap = PyMem_Calloc((size_t)d->n, sizeof(*d->cap))) == NULL))
    return PyErr_NoMemory(), -1;
  PyObject *r = PyObject_CallFunction(
      ec_device_empty, "iKKi", c->dtype, (unsigned long long)c->rows,
      (unsigned long long)c->cols, c->device_index);
  PyObject *t;
  unsigned long long addr, stream;
  int rc = r == NULL ? -1 : 0;
  if (r != NULL && r != Py_None) {
    if (!PyArg_ParseTuple(r, "OKK", &t, &addr, &stream))
      rc = -1;
    else {
      d->obj[i] = Py_NewRef(t);
      d->addr[i] = (uintptr_t)addr;
      d->cap[i] = c->rows * c->cols * encache_dtype_size(c->dtype);
      d->stream = (uintptr_t)stream;
    }
  }
  Py_XDECREF(r);
  return rc;
}

/* The destinations of the CUDA candidates among c[0..n); 0 or -1. */
static int dests_make(dests *d, const encache_candidate *c, Py_ssize_t n) {
  *d = (dests){.c = c, .n = n, .device_index = -1, .failed = -1};
  for (Py_ssize_t i = 0; i < n; i++)
    if (c[i].device == ENCACHE_DEVICE_CUDA && dest_make(d, i) < 0) {
      ec_item_invalid(i);
      return -1;
    }
  return 0;
}

/* The Result of r (for candidate c); its hit's block is taken over, or
 * freed on failure. */
static PyObject *result_of(int output, PyObject *id, const dests *d,
                           Py_ssize_t i, const encache_result *r) {
  const encache_candidate *c = &d->c[i];
  PyObject *o = ec_result_alloc();
  PyObject *tensor = r->outcome != ENCACHE_HIT ? Py_NewRef(Py_None)
                     : c->device == ENCACHE_DEVICE_CUDA
                         ? Py_NewRef(d->obj[i])
                         : ec_block_wrap(r->handle, output, c->dtype,
                                         c->rows, c->cols);
  PyObject *why = r->why != NULL ? ec_text(r->why) : Py_NewRef(Py_None);
  if (o == NULL || tensor == NULL || why == NULL) {
    Py_XDECREF(o);
    Py_XDECREF(tensor);
    Py_XDECREF(why);
    return NULL;
  }
  ec_result_set(o, id, tensor, why, r);
  return o;
}

/* ------------------------------------------------------------- a lookup */

/* What outcome a result has before the library writes it: a lookup that
 * never ran (queued, then its step closed) leaves its results so. */
#define OUTCOME_UNWRITTEN (-1)

/*
 * One lookup's state, from the parse of its items to its Results: the
 * candidates (their ids point into the id objects held in ids), the
 * results the library fills and the CUDA destinations.  A blocking lookup
 * keeps it on the C stack; a started one (wait=False) on the heap, owned
 * by its step (step.pending) until it is collected (wait) or its step is
 * closed, since the library's lookup thread writes into it meanwhile.
 * Arrays of up to STACK_ITEMS items live inside it.
 */
struct ec_lookup {
  Py_ssize_t n;      /* items */
  Py_ssize_t parsed; /* ids[0..parsed) are held */
  PyObject **ids;
  encache_candidate *c;
  encache_result *res;
  dests d;
  int have_d;        /* d was made: dests_free() it */
  int whys_copied;   /* res[].why are our copies (free them) */
  int counted;       /* in h->pending_lookups (under h's lock) */
  int waiting;       /* a wait() runs (with the GIL released): it frees */
  int abandoned;     /* the step was closed during that wait */
  PyObject *ids_stack[STACK_ITEMS];
  encache_candidate c_stack[STACK_ITEMS];
  encache_result r_stack[STACK_ITEMS];
};

/* Parses items into k (zeroed by the caller); 0, or -1 raised (lk_free()
 * k either way). */
static int lk_parse(ec_lookup *k, PyObject *items) {
  /* A copy: the caller's code, run while items are parsed, cannot change
   * what is being parsed. */
  PyObject *seq = PyTuple_Check(items) ? Py_NewRef(items)
                                       : PySequence_Tuple(items);
  if (seq == NULL) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      ec_invalid("items must be a sequence of Item (or of tuples)");
    }
    return -1;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(seq);
  int rc = -1;
  k->ids = k->ids_stack;
  k->c = k->c_stack;
  k->res = k->r_stack;
  if (n > STACK_ITEMS) {
    k->ids = PyMem_Malloc(sizeof(*k->ids) * (size_t)n);
    k->c = PyMem_Malloc(sizeof(*k->c) * (size_t)n);
    k->res = PyMem_Malloc(sizeof(*k->res) * (size_t)n);
    if (k->ids == NULL || k->c == NULL || k->res == NULL) {
      PyErr_NoMemory();
      goto done;
    }
  }
  k->n = n;
  for (; k->parsed < n; k->parsed++)
    if (ec_item_parse(PyTuple_GET_ITEM(seq, k->parsed), &k->c[k->parsed],
                   &k->ids[k->parsed]) < 0) {
      ec_item_invalid(k->parsed);
      goto done;
    }
  k->have_d = 1;
  if (dests_make(&k->d, k->c, n) < 0)
    goto done;
  for (Py_ssize_t i = 0; i < n; i++)
    k->res[i] = (encache_result){.size = sizeof(encache_result),
                                 .outcome = OUTCOME_UNWRITTEN};
  rc = 0;
done:
  Py_DECREF(seq);
  return rc;
}

/* Frees what k holds (not k itself); the hits' blocks are someone else's
 * by now (Results, or released). */
static void lk_free(ec_lookup *k) {
  if (k->have_d)
    dests_free(&k->d);
  for (Py_ssize_t i = 0; k->whys_copied && i < k->n; i++)
    free((char *)k->res[i].why);
  for (Py_ssize_t i = 0; i < k->parsed; i++)
    Py_DECREF(k->ids[i]);
  if (k->ids != k->ids_stack)
    PyMem_Free(k->ids);
  if (k->c != k->c_stack)
    PyMem_Free(k->c);
  if (k->res != k->r_stack)
    PyMem_Free(k->res);
}

/* Frees a lookup whose results nobody will see (its step was closed, or
 * its Cache): the hits' host blocks are released and the CUDA
 * destinations dropped, unless the handle was poisoned (a copy may still
 * write into them).  A lookup that never ran left every result
 * OUTCOME_UNWRITTEN; one that failed wrote no HIT. */
static void lk_abandon(ec_lookup *k, int poisoned) {
  k->d.poisoned = poisoned;
  for (Py_ssize_t i = 0; !poisoned && i < k->n; i++)
    if (k->res[i].outcome == ENCACHE_HIT)
      dest_release(&k->d, (size_t)i, k->res[i].data, k->res[i].handle);
  lk_free(k);
}

/* Frees k, which its waiter found given up (its step or its Cache was
 * closed meanwhile): no longer counted, its hits released unless the
 * handle is poisoned. */
static void lk_give_up(handle *h, ec_lookup *k) {
  int rc = 0, poisoned = 1;
  EC_LOCKED(h, rc, ec_lookup_collected_locked(h, k);
            poisoned = ec_handle_poisoned_locked(h));
  if (rc == ENCACHE_ECLOSED)
    poisoned = h->closed_poisoned;
  lk_abandon(k, poisoned);
  PyMem_Free(k);
}

/* The allocator of k's destinations (host blocks from buffer.c, CUDA
 * ones from k's dests: both need no GIL, so it may run on the library's
 * lookup thread). */
static encache_allocator lk_allocator(ec_lookup *k) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.ctx = &k->d;
  a.alloc = dest_alloc;
  a.release = dest_release;
  a.headroom = ENCACHE_HEADER_SIZE; /* host blocks have it (buffer.c) */
  return a;
}

/* Under h's lock: prepares s's library step for k (CUDA hits are copied
 * on the stream current on their device: torch's allocator orders its
 * memory there); 0 or a code. */
static int lk_prepare_locked(step *s, ec_lookup *k) {
  if (s->st == NULL)
    return ENCACHE_ECLOSED;
  /* torch's 0 is the legacy default stream (NULL would be the handle's
   * own). */
  if (k->d.obj != NULL)
    return encache_step_set_stream(
        s->st, (void *)(k->d.stream ? k->d.stream : CUDA_STREAM_LEGACY));
  return 0;
}

/* Under h's lock, once the library has answered rc for k: copies the
 * results' reasons (owned by the library's step, which another thread
 * may close once the lock is released), or the handle's message. */
static void lk_answered_locked(handle *h, ec_lookup *k, int rc, char *msg,
                               size_t cap) {
  if (rc >= 0) {
    for (Py_ssize_t i = 0; i < k->n; i++)
      if (k->res[i].why != NULL)
        k->res[i].why = strdup(k->res[i].why); /* NULL: no memory */
    k->whys_copied = 1;
  } else if (rc != ENCACHE_ECLOSED)
    PyOS_snprintf(msg, cap, "%s", encache_errmsg(h->ec));
}

/* The Results of k's answer rc (the library's, as encache_lookup()
 * returns it), appended to s's: a new list of the new ones, or NULL
 * raised.  Every hit's block is taken over (or freed) whatever happens;
 * the blocking and the started lookup both end here. */
static PyObject *lk_finish(step *s, handle *h, ec_lookup *k, int rc,
                           const char *msg) {
  dests *d = &k->d;
  d->poisoned = rc == ENCACHE_EPOISONED;
  if (rc == -ENODEV && d->failed >= 0)
    return ec_invalid("item %zd: a hit on cuda:%d, but no CUDA tensor could "
                      "be made for it (torch is not imported, or "
                      "torch.cuda.is_available() is False)", d->failed,
                      d->c[d->failed].device_index);
  if (rc < 0)
    return ec_raise(rc, rc == ENCACHE_ECLOSED
                            ? "the step or its Cache is closed" : msg);
  Py_ssize_t n = d->n;
  PyObject *out = PyList_New(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *r = out != NULL
                      ? result_of(h->output, k->ids[i], d, i, &k->res[i])
                      : NULL;
    if (r == NULL) {
      if (k->res[i].outcome == ENCACHE_HIT && out == NULL)
        dest_release(d, (size_t)i, k->res[i].data, k->res[i].handle);
      Py_CLEAR(out);
      continue; /* the remaining hits' blocks are freed */
    }
    PyList_SET_ITEM(out, i, r);
  }
  if (out != NULL) {
    Py_ssize_t at = PyList_GET_SIZE(s->results);
    if (PyList_SetSlice(s->results, at, at, out) < 0)
      Py_CLEAR(out);
  }
  return out;
}

/* Starts k on s (k is then s's, until collected); NULL raised (k is then
 * still the caller's), or a new reference to s. */
static PyObject *lk_start(step *s, handle *h, ec_lookup *k) {
  encache_allocator a = lk_allocator(k);
  char msg[1024] = "";
  int rc = 0;
  EC_LOCKED(h, rc, rc = lk_prepare_locked(s, k);
            if (rc == 0) rc = encache_lookup_start(s->st, k->c, (size_t)k->n,
                                                   &a, k->res);
            if (rc == 0) {
              h->pending_lookups++;
              k->counted = 1;
            }
            else lk_answered_locked(h, k, rc, msg, sizeof(msg)));
  if (rc < 0)
    return lk_finish(s, h, k, rc, msg); /* raises */
  s->pending = k;
  return Py_NewRef((PyObject *)s);
}

/* lookup(items, wait=True), also Handle.lookup's: 0 or -1 raised. */
int ec_lookup_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **items, int *wait) {
  PyObject *w = nargs > 1 ? args[1] : NULL;
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i);
    if (!PyUnicode_Check(name) ||
        PyUnicode_CompareWithASCIIString(name, "wait") != 0) {
      PyErr_Format(PyExc_TypeError, "lookup() got an unexpected keyword "
                   "argument %R", name);
      return -1;
    }
    if (w != NULL) {
      PyErr_SetString(PyExc_TypeError,
                      "lookup() got multiple values for argument 'wait'");
      return -1;
    }
    w = args[nargs + i];
  }
  if (nargs < 1 || nargs > 2) {
    PyErr_Format(PyExc_TypeError, "lookup() takes items and, optionally, "
                 "wait (%zd positional arguments given)", nargs);
    return -1;
  }
  *items = args[0];
  *wait = w == NULL ? 1 : PyObject_IsTrue(w);
  return *wait < 0 ? -1 : 0;
}

PyObject *ec_step_lookup(step *s, PyObject *items, int wait) {
  if (ec_step_usable(s) < 0)
    return NULL;
  if (s->pending != NULL)
    return ec_invalid("a lookup started with wait=False is pending on this "
                      "step: wait() for it (or close the step) before "
                      "another lookup");
  handle *h = (handle *)Py_NewRef(s->owner);
  PyObject *out = NULL;
  if (!wait) {
    ec_lookup *k = PyMem_Calloc(1, sizeof(*k));
    if (k == NULL)
      out = PyErr_NoMemory();
    else if (lk_parse(k, items) < 0 || (out = lk_start(s, h, k)) == NULL) {
      lk_free(k);
      PyMem_Free(k);
    }
    Py_DECREF(h);
    return out;
  }
  ec_lookup k;
  memset(&k, 0, offsetof(ec_lookup, ids_stack));
  if (lk_parse(&k, items) == 0) {
    encache_allocator a = lk_allocator(&k);
    char msg[1024] = "";
    int rc = 0;
    EC_LOCKED(h, rc, rc = lk_prepare_locked(s, &k);
              if (rc == 0) rc = encache_lookup(s->st, k.c, (size_t)k.n, &a,
                                               k.res);
              lk_answered_locked(h, &k, rc, msg, sizeof(msg)));
    out = lk_finish(s, h, &k, rc, msg);
  }
  lk_free(&k);
  Py_DECREF(h);
  return out;
}

/* Milliseconds since an arbitrary origin (the waits' clock). */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The longest one wait holds the handle's lock and leaves signals
 * unchecked (Ctrl-C interrupts an unbounded wait). */
#define WAIT_SLICE_MS 100

int ec_step_complete(step *s, double timeout_s) {
  ec_lookup *k = s->pending;
  if (k == NULL)
    return 1;
  if (ec_step_usable(s) < 0)
    return -1;
  if (k->waiting) {
    ec_invalid("another thread waits for this step's lookup");
    return -1;
  }
  handle *h = (handle *)Py_NewRef(s->owner);
  double until = timeout_s < 0 ? 0 : now_ms() + timeout_s * 1e3;
  char msg[1024] = "";
  int rc = ENCACHE_EPENDING, out = -1;
  k->waiting = 1;
  for (;;) {
    double left = timeout_s < 0 ? WAIT_SLICE_MS : until - now_ms();
    int ms = left <= 0 ? 0 : left > WAIT_SLICE_MS ? WAIT_SLICE_MS
                                                  : (int)(left + 0.999);
    EC_LOCKED(h, rc, rc = s->st == NULL ? ENCACHE_ECLOSED
                                        : encache_step_wait(s->st, ms);
              if (rc != ENCACHE_EPENDING && rc != ENCACHE_ECLOSED) {
                ec_lookup_collected_locked(h, k);
                lk_answered_locked(h, k, rc, msg, sizeof(msg));
              });
    if (rc != ENCACHE_EPENDING || k->abandoned || ms == 0 ||
        (timeout_s >= 0 && now_ms() >= until))
      break;
    if (PyErr_CheckSignals() < 0) {
      k->waiting = 0;
      if (k->abandoned) /* a signal handler closed the step */
        lk_give_up(h, k);
      Py_DECREF(h);
      return -1; /* still pending (or given up) */
    }
  }
  k->waiting = 0;
  if (rc == ENCACHE_EPENDING && !k->abandoned) {
    Py_DECREF(h);
    return 0;
  }
  /* Done with, one way or the other: k is ours to free. */
  if (k->abandoned || rc == ENCACHE_ECLOSED) {
    /* The step was closed meanwhile (it left k to us), or its Cache (which
     * waited for a running lookup, and dropped a queued one). */
    if (s->pending == k)
      s->pending = NULL;
    lk_give_up(h, k);
    ec_raise(ENCACHE_ECLOSED, "the step or its Cache was closed while its "
                              "lookup was waited for");
    Py_DECREF(h);
    return -1;
  }
  s->pending = NULL;
  PyObject *results = lk_finish(s, h, k, rc, msg);
  lk_free(k);
  PyMem_Free(k);
  if (results != NULL) {
    Py_DECREF(results);
    out = 1;
  }
  Py_DECREF(h);
  return out;
}

void ec_lookup_collected_locked(handle *h, ec_lookup *k) {
  if (k->counted)
    h->pending_lookups--;
  k->counted = 0;
}

int ec_lookup_hand_to_waiter(ec_lookup *k) {
  if (!k->waiting)
    return 0;
  k->abandoned = 1;
  return 1;
}

void ec_step_drop_pending(ec_lookup *k, int poisoned) {
  lk_abandon(k, poisoned);
  PyMem_Free(k);
}
