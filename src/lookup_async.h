/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_async.h: lookups that do not wait (lookup_async.c): the handle's
 * lookup thread, what encache_close() asks of it.
 */
#ifndef ENCACHE_LOOKUP_ASYNC_H
#define ENCACHE_LOOKUP_ASYNC_H

#include "core.h"

/* Stops the lookup thread, if it was started: the lookup it runs
 * completes, those still queued never run.  The caller must not have the
 * handle's turn (the thread may need it to finish). */
void encache__async_stop(encache *ec);
/* Frees the lookup thread's state (after encache__async_stop() and once
 * the steps are closed). */
void encache__async_free(encache *ec);

#endif
