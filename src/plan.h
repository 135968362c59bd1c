/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plan.h: the plan of one lookup (plan.c holds the helpers every phase
 * shares).  lookup.c runs the plan and its phases up to the chunks;
 * lease.c (single flight) and lookup_read.c (the chunks: read, validate,
 * deliver) are phases that stand on it.  Run by whoever has the handle's
 * turn (core.h).
 */
#ifndef ENCACHE_PLAN_H
#define ENCACHE_PLAN_H

#include "step.h"

/* Per unique candidate. */
typedef struct encache__item {
  size_t first;    /* index of the candidate it stands for */
  char *key;
  uint64_t nbytes; /* expected payload */
  uint64_t osize;  /* 24 + nbytes: the slot */
  uint64_t off;    /* slot offset in the staging buffer */
  int present;
  int unchecked;   /* taken as present without an existence check */
  int waited;      /* it waited for another encoder's output (lease.c) */
  int held_here;   /* another step of this handle holds its lease */
  int chunk_start; /* the first item of a chunk */
  int outcome;     /* for the unique item; copied to its duplicates */
  const char *why; /* its cause when not a HIT (kept by the step) */
} encache__item;

typedef unsigned char encache__header_buf[ENCACHE_HEADER_SIZE];

/* The plan's arrays: X(name, element type, element count), the count an
 * expression of n (candidates) and text (bytes of the keys). */
#define PLAN_ARRAYS(X)                                                       \
  X(cand, encache_candidate, n) /* the caller's candidates, copied */      \
  X(res, encache_result, n)     /* results, copied out at the end */       \
  X(unique_of, size_t, n)       /* candidate -> item; SIZE_MAX: skipped */ \
  X(hash, uint64_t, n)          /* of each candidate's id */               \
  X(items, encache__item, n)             /* items[0..nu) */                         \
  X(sorted, encache__item, n)            /* the chunk phase's reordering */         \
  X(newpos, size_t, n)                                                     \
  X(keys, const char *, n)      /* per item: its key */                    \
  X(present, int, n)            /* per item: the existence answer */       \
  X(dest, size_t, n)            /* candidates holding a destination */     \
  X(bufs, void *, n)            /* per item: where its read goes */        \
  X(heads, void *, n)           /* per item: where its header goes */      \
  X(caps, size_t, n)                                                       \
  X(answers, int64_t, n)        /* per item: the read's answer */          \
  X(hdrs, encache__header_buf, n)        /* direct reads: the headers */            \
  X(keytext, char, text)

typedef struct encache__plan {
  encache *ec;
  encache_step *step;
  /* The lane it runs in (its scratch; its staging buffer, but for CUDA
   * destinations: the handle's), and whether it gives the handle's turn
   * up around its Store calls (a lookup thread's lane: see core.h). */
  encache__lane *lane;
  int yield;
  const encache_candidate *caller_c; /* strided by caller_c->size */
  encache_allocator a;
  size_t n, text;
  size_t nu;    /* unique items */
  size_t np;    /* items[0..np) are present and fit the staging buffer */
  size_t ndest; /* dest[0..ndest) */
  int direct;   /* payloads read straight into destinations */
  int whole;    /* ... as whole objects, headers in the headroom */
  int device;   /* some hit may go to a CUDA device (device.c) */
  int hits;
#define PLAN_FIELD_(name, type, count) type *name;
  PLAN_ARRAYS(PLAN_FIELD_)
#undef PLAN_FIELD_
} encache__plan;

/* The caller's candidate i (its array is strided by its own size). */
static inline const encache_candidate *
encache__plan_cand(const encache__plan *p, size_t i) {
  return ENCACHE__AT(const encache_candidate, p->caller_c, i);
}

/* Around a Store call of the plan: gives the handle's turn up when the
 * plan may (p->yield), and takes it back.  Between the two the plan
 * touches only itself, its lane and the Store. */
static inline void encache__plan_store_begin(encache__plan *p) {
  if (p->yield)
    encache__leave(p->ec);
}
static inline void encache__plan_store_end(encache__plan *p) {
  if (p->yield)
    encache__enter(p->ec);
}

/* A whole batch's answer: 0 done, 1 certainly not done (the caller marks
 * its items UNAVAILABLE), or poison. */
int encache__plan_batch(encache__plan *p, int rc, const char *what);
/* Marks items[from..to) UNAVAILABLE because of why. */
void encache__plan_unavailable(encache__plan *p, size_t from, size_t to,
                               const char *why);
/* The cause of a Store call `what` that answered code rc (for the whole
 * batch, or per_key for one key): its name and the Store's message, kept
 * by the step. */
const char *encache__plan_store_why(encache__plan *p, const char *what,
                                    int64_t rc, int per_key);
/* An item found present: it will be read, or is OVERSIZE. */
void encache__plan_present(encache__plan *p, encache__item *it);

#endif
