/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_async.h: lookups that do not wait (lookup_async.c): the handle's
 * lookup threads, what encache_close() asks of them.
 */
#ifndef ENCACHE_LOOKUP_ASYNC_H
#define ENCACHE_LOOKUP_ASYNC_H

#include "core.h"

/* Stops the lookup threads, if they were started: the lookups they run
 * complete, those still queued never run.  The caller must not have the
 * handle's turn (a thread may need it to finish). */
void encache__async_stop(encache *ec);
/* Close, after encache__async_stop(): unregisters the threads' staging
 * buffers (those registered): 0, or the handle poisoned. */
int encache__async_unregister(encache *ec);
/* Frees the lookup threads' state and lanes (after encache__async_stop()
 * and once the steps are closed; never on a poisoned handle, whose
 * staging buffers the Store may still write into). */
void encache__async_free(encache *ec);

#endif
