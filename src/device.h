/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device.h: CUDA devices (device.c): the CUDA runtime loaded at run time,
 * the pinned staging of lookups into CUDA destinations, and the pinned
 * pool of publications from CUDA outputs (docs/engine.md, "Device
 * outputs").  Without a runtime every function here fails with a reason;
 * nothing else in the library changes.
 */
#ifndef ENCACHE_DEVICE_H
#define ENCACHE_DEVICE_H

#include "core.h"

/* The CUDA ordinals encache serves: 0 .. ENCACHE__MAX_DEVICES - 1. */
#define ENCACHE__MAX_DEVICES 16

/* NULL when candidate c's destination can be served, else why not (a
 * static text: "CUDA runtime not available: ...", a device index out of
 * range, another kind).  Any thread. */
const char *encache__device_ineligible(const encache_candidate *c);

/* Lookups (caller's thread). */
/* Page-locks the staging buffer for CUDA copies (once); 0, or
 * ENCACHE_EUNAVAIL with the handle's message (lookup_read.c then answers
 * every item the lookup would read UNAVAILABLE, host ones too, since the
 * staging buffer serves them all; nothing is kept). */
int encache__device_pin_staging(encache *ec);
/* Queues the copy of src[0..n) (pinned) to device address dst on device
 * dev, on stream `given` (a step's; NULL: the handle's own).  0, or a
 * negative code with the handle's message (poison: the copy may be in
 * flight). */
int encache__device_copy_in(encache *ec, void *given, int dev, void *dst,
                            const void *src, size_t n);
/* Waits (at most device_sync_timeout_ms) for every copy queued since the
 * last wait.  0, or a negative code with the handle's message (poison). */
int encache__device_sync(encache *ec);

/* Publication.  A CUDA output's copy in a pinned buffer. */
typedef struct encache__pinned encache__pinned;
/* Caller's thread: takes a pinned buffer for view's payload (nbytes) from
 * the pool, queues the copy on view->stream and records an event after
 * it, in *out.  0; ENCACHE_SKIP_OVER_BYTES (the pool is full); or a
 * negative code with the handle's message: ENCACHE_ENOLIB (no runtime),
 * ENCACHE_EINVAL (device_index out of range), ENCACHE_EIO (nothing
 * queued), ENCACHE_EPOISONED (the copy was queued but no event follows
 * it, or a pool buffer's event cannot be queried: kept forever). */
int encache__device_publish_begin(encache *ec, const encache_tensor *view,
                                  uint64_t nbytes, encache__pinned **out);
/* The buffer's bytes (the payload to write). */
const void *encache__pinned_data(const encache__pinned *b);
/* Worker: makes the event's device the thread's current one, then waits
 * for the copy (bounded).  0, or ENCACHE_EUNCONFIRMED with why[0..size)
 * set (the job is fatal: the buffer must be kept). */
int encache__pinned_wait(encache *ec, encache__pinned *b, char *why,
                         size_t size);
/* Caller's thread: gives the buffer back to the pool (its copy need not
 * be complete: the pool waits for it before reusing it). */
void encache__pinned_release(encache *ec, encache__pinned *b);

/* Close (healthy handle, publisher stopped): destroys the streams and
 * events, unpins the staging buffer, frees the pool.  Returns 0, or a
 * negative code with the handle's message (the staging buffer could not
 * be unpinned: the caller poisons). */
int encache__device_free(encache *ec);

#endif
