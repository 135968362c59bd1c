/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.h: what the top of the engine (engine.c) asks of the read path
 * (lookup.c).
 */
#ifndef ENCACHE_LOOKUP_H
#define ENCACHE_LOOKUP_H

#include "core.h"

/* Frees a lane's scratch memory (close). */
void encache__lookup_free(encache__lane *lane);

/* encache_lookup() without taking the handle's turn (its caller has it),
 * timed for the lookup histogram, in lane (NULL: the handle's own,
 * ec->lane), giving the turn up around its Store calls when yield (a
 * lookup thread in its own lane; plan.h). */
int encache__lookup_timed(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          encache_result *results, encache__lane *lane,
                          int yield);
/* The checks encache_lookup() makes before any Store call, in its order,
 * without counting the call: 0, ENCACHE_EINVAL (the handle's message says
 * which, unless quiet: then it is not written, and the caller need not
 * have the handle's turn) or ENCACHE_EPOISONED. */
int encache__lookup_check(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          const encache_result *results, int quiet);

#endif
