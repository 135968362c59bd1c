/* SPDX-License-Identifier: Apache-2.0 */
/*
 * result.h: Result, the outcome of one item of a lookup (lookup.c makes
 * them; Step and the vLLM hooks read their hits).  It needs only the
 * core: a Result holds its output, whatever made it.
 */
#ifndef ENCACHE_PY_RESULT_H
#define ENCACHE_PY_RESULT_H

#include "core.h"

/* Readies Result and adds it to module m; 0 or -1 raised. */
int ec_result_register(PyObject *m);
/* A new Result, empty (ec_result_set() fills it); NULL raised. */
PyObject *ec_result_alloc(void);
/* Fills o, a new Result, with item id's answer r: its output `tensor`
 * (None unless a HIT) and `why` (a str, or None), whose references it
 * takes over. */
void ec_result_set(PyObject *o, PyObject *id, PyObject *tensor,
                   PyObject *why, const encache_result *r);
/* r (a Result) is a hit: its id and output, borrowed; else NULL. */
PyObject *ec_result_hit(PyObject *r, PyObject **id);

#endif
