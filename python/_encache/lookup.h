/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.h: a step's lookups (lookup(items, wait=True)), which make its
 * Results (result.h): the blocking lookup, the one started with
 * wait=False and its collection.  Above the step's state (step.h), below the Step type and
 * everything that looks up through it (Handle.lookup, the vLLM hooks).
 */
#ifndef ENCACHE_PY_LOOKUP_H
#define ENCACHE_PY_LOOKUP_H

#include "step.h"

/* The arguments of lookup(items, wait=True) (a METH_FASTCALL |
 * METH_KEYWORDS method's: Step.lookup, Handle.lookup); 0 or -1 raised. */
int ec_lookup_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **items, int *wait);
/* Looks items up on s: with wait, the new Results (a list, also appended
 * to s's); without, starts the lookup (encache_lookup_start) and returns a
 * new reference to s, whose pending lookup ec_step_complete() collects. */
PyObject *ec_step_lookup(step *s, PyObject *items, int wait);
/* Waits at most timeout_s seconds (< 0: without a bound, 0: a poll) for
 * s's pending lookup, with the GIL released, and appends its Results to
 * s's: 1 when none is pending (any more), 0 when it still is, -1 raised
 * (the lookup's error: it is then done with). */
int ec_step_complete(step *s, double timeout_s);

/* A pending lookup given up by its closing step (ec_step_close) goes
 * through these three, in this order. */
/* With the GIL, k just taken off its closing step: 1 when a wait() on
 * another thread runs on it (k is then that wait's to free, once it sees
 * the step closed), 0 when k is the caller's. */
int ec_lookup_hand_to_waiter(ec_lookup *k);
/* Under h's lock: k is collected (no longer counted as pending). */
void ec_lookup_collected_locked(handle *h, ec_lookup *k);
/* Frees k, the caller's (ec_lookup_hand_to_waiter() said so), whose
 * library step is closed (or its handle): its hits are released and its
 * CUDA destinations dropped, unless `poisoned`. */
void ec_step_drop_pending(ec_lookup *k, int poisoned);

#endif
