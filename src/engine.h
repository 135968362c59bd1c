/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine.h: the top of the engine (engine.c), as the tests see it.
 */
#ifndef ENCACHE_ENGINE_H
#define ENCACHE_ENGINE_H

#include "core.h"

/* Opens a handle on a given Store (ownership passes to the handle, also
 * on failure); tests wrap a real Store with fault injection this way. */
int encache__open_with_store(const encache_options *o, encache_store *st,
                             encache **out);

#endif
