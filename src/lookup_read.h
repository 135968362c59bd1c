/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_read.h: the chunks of a lookup plan (lookup_read.c): the read
 * path's choice, the staging buffer, the destinations, and per chunk the
 * read, validate and deliver phases.
 */
#ifndef ENCACHE_LOOKUP_READ_H
#define ENCACHE_LOOKUP_READ_H

#include "plan.h"

/* Releases every destination handed out (the lookup failed). */
void encache__plan_release_all(encache__plan *p);
/* Reads, validates and delivers every chunk of items[0..np). */
int encache__plan_read(encache__plan *p);

/* Whether the lookup reads whole objects straight into its destinations
 * (p->whole), the header into the allocator's headroom: a Store that
 * neither splits reads nor needs registered memory, headroom of at least
 * ENCACHE_HEADER_SIZE, host destinations only, and at least
 * ENCACHE__WHOLE_MIN_BYTES of objects.  That path needs the existence
 * check (a miss must not take a destination: acceptance case 5), which
 * costs a round trip where the staged path, without the check on a
 * READ_ABSENT Store, costs a copy: the bound is where the two cost the
 * same (docs/performance.md, "Figures behind the engine's constants"). */
#define ENCACHE__WHOLE_MIN_BYTES (1u << 20)
void encache__plan_whole(encache__plan *p);
/* Close: unregisters the lane's staging buffer (when registered); 0, or
 * the handle poisoned (the Store may still write into it). */
int encache__staging_unregister(encache *ec, encache__lane *lane);

/* Test hook: replaces the copy of a payload into a destination (a device
 * copy may fail; a host copy cannot).  Non-zero return = failed copy. */
extern int (*encache__copy_hook)(void *dst, const void *src, size_t n);

#endif
