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

#endif
