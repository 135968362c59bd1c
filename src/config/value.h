/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/value.h: one option's value (value.c): its rendering as JSON
 * text and the checks of its kind and rule, which every source of a
 * value (a JSON member, a typed setter) ends in.
 */
#ifndef ENCACHE_CONFIG_VALUE_H
#define ENCACHE_CONFIG_VALUE_H

#include "config/handle.h"

void encache__value_clear(value *v);
/* Renders v as JSON text into v->text.  Returns 0 or ENCACHE_ENOMEM. */
int encache__value_render(const opt_def *o, value *v);
/* Checks v (typed, rendered) against o's kind and rule; `got` is the
 * value as given, for the message. */
int encache__value_check(encache_config *cfg, const opt_def *o, const value *v,
                         const char *got);
/* A key field's warning: `odd` says what vLLM made of a non-string
 * value (NULL for a string). */
int encache__value_note(encache_config *cfg, const opt_def *o, value *v,
                        const char *got, const char *odd);

#endif
