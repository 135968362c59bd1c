/* SPDX-License-Identifier: Apache-2.0 */
/*
 * items.h: a lookup's items (id, dtype, shape[, device]) read into the
 * library's candidates.  Stands on the module core only; the lookup
 * (lookup.h) uses it.
 */
#ifndef ENCACHE_PY_ITEMS_H
#define ENCACHE_PY_ITEMS_H

#include "core.h"

/* Fills c from item and sets *id to a new reference to its id (c->id
 * points into it); 0, or -1 with an exception set. */
int ec_item_parse(PyObject *item, encache_candidate *c, PyObject **id);
/* Replaces a pending ValueError or TypeError (InvalidError is one) with
 * InvalidError naming item i; other exceptions (KeyboardInterrupt,
 * MemoryError) go on as they are. */
void ec_item_invalid(Py_ssize_t i);

#endif
