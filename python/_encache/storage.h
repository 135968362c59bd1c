/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage.h: a publication's storage, one per backing storage while any
 * publication of it is pending (storage.c says why), listed in its
 * handle.
 */
#ifndef ENCACHE_PY_STORAGE_H
#define ENCACHE_PY_STORAGE_H

#include "handle.h"

/* prepare (GIL held) records the memory and a reference to `keep`;
 * acquire (under h's lock, no GIL) gives *out a reference to the listed
 * storage of that memory, or makes one from *prep (then *prep is set to
 * NULL: the storage owns it); discard (GIL held) drops a *prep left
 * over. */
ec_pub *ec_pub_prepare(handle *h, PyObject *keep, uintptr_t base,
                       uint64_t nbytes);
int ec_pub_acquire(handle *h, ec_pub **prep, encache_storage **out);
void ec_pub_discard(ec_pub *p);

#endif
