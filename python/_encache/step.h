/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.h: a step's state (struct step, the object of a Step: step_type.c
 * is the type) and whether it can be used now.  A room apart from the
 * type so that the lookup (lookup.c), which fills a step's results and
 * collects its pending lookup, stands on the state, and the type, whose
 * methods call the lookup, stands on the lookup: not both ways.
 */
#ifndef ENCACHE_PY_STEP_H
#define ENCACHE_PY_STEP_H

#include "handle.h"

typedef struct ec_lookup ec_lookup; /* lookup.c: one lookup's state */

typedef struct step {
  PyObject_HEAD
  handle *owner;        /* strong reference; NULL once closed */
  encache_step *st;     /* NULL once closed; written under owner's lock */
  PyObject *results;    /* list of Result */
  /* The lookup started with wait=False and not yet collected, or NULL:
   * the library's lookup thread writes into it until then (lookup.c). */
  ec_lookup *pending;
} step;

/* 0 when s can be used now; else raises (ClosedError, ForkError), -1. */
int ec_step_usable(step *s);

#endif
