/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step_type.h: Step, the type of a step (its state is step.h's): its
 * lookups (lookup.h), its publications, its close.
 */
#ifndef ENCACHE_PY_STEP_TYPE_H
#define ENCACHE_PY_STEP_TYPE_H

#include "step.h"

extern PyTypeObject ec_step_type;
/* The package's subclass of Step that steps are made as (encache.Step),
 * or NULL (then Step itself); set by _init() (module.c). */
extern PyTypeObject *ec_step_class;
/* Sets ec_step_class to cls (a subclass of Step, checked by the caller). */
void ec_step_set_class(PyTypeObject *cls);
/* Readies Step and adds it to module m; 0 or -1 raised. */
int ec_step_register(PyObject *m);

/* A new step of h (Handle.step()); NULL raised. */
PyObject *ec_step_new(handle *h);
/* Closes s (Step.close()); idempotent. */
void ec_step_close(step *s);

#endif
