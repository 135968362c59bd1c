/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handle_type.h: Handle, the type of an open engine handle (its state is
 * handle.h's), which encache.Cache subclasses: open, close, flush, stats,
 * and the steps and lookups it opens (step_type.h, lookup.h).
 */
#ifndef ENCACHE_PY_HANDLE_TYPE_H
#define ENCACHE_PY_HANDLE_TYPE_H

#include "handle.h"

extern PyTypeObject ec_handle_type;
/* Readies Handle and adds it to module m; 0 or -1 raised. */
int ec_handle_register(PyObject *m);

#endif
