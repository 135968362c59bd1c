/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.h: what the top of the engine (engine.c) asks of the read path
 * (lookup.c).
 */
#ifndef ENCACHE_LOOKUP_H
#define ENCACHE_LOOKUP_H

#include "core.h"

/* Frees the plan's scratch memory (close). */
void encache__lookup_free(encache *ec);

/* encache_lookup() without the handle's turn (its caller has it), timed
 * for the lookup histogram. */
int encache__lookup_timed(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          encache_result *results);
/* The checks encache_lookup() makes before any Store call, in its order,
 * without counting the call: 0, ENCACHE_EINVAL (the handle's message says
 * which, unless quiet: then it is not written, and the caller need not
 * have the handle's turn) or ENCACHE_EPOISONED. */
int encache__lookup_check(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          const encache_result *results, int quiet);

#endif
