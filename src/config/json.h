/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/json.h: JSON into values (json.c): a member decoded, checked
 * and rendered; an option's default (its JSON text read as a member
 * would be); a section parsed into a scratch copy and committed whole;
 * a JSON text read as vLLM (Python's json.loads) reads it.
 *
 * Unknown members are collected, never refused: vLLM ignores them too,
 * and a fleet may run a newer encache beside an older one.
 */
#ifndef ENCACHE_CONFIG_JSON_H
#define ENCACHE_CONFIG_JSON_H

#include "config/value.h"

#include <jansson.h>

/* Parse state for one load: scratch values of every option (only the
 * loaded section's entries are used) and the unknown names found. */
typedef struct scratch {
  value vals[NOPTS];
  char **unknown[SEC_COUNT];
  int nunknown[SEC_COUNT];
} scratch;

/* Decodes j into v for option o (kind only; no rule); got is j as short
 * text.  *odd as for encache__value_note. */
int encache__json_decode(encache_config *cfg, const opt_def *o, const json_t *j,
                         value *v, const char *got, const char **odd);
/* Sets v to o's default: its JSON text read as a member would be. */
int encache__value_default(const opt_def *o, value *v);
/* j as short JSON text, for messages. */
void encache__json_brief(const json_t *j, char *buf, size_t size);
/* json[0..len) as one JSON object (what names it in messages), with a
 * warning in *warn about how it was read; NULL with *rc after a
 * message. */
json_t *encache__json_object(encache_config *cfg, const char *json, size_t len,
                             const char *what, int *rc, char **warn);
/* Replaces cfg's JSON warning k (0: ec, 1: mooncake) by warn (owned). */
void encache__json_warn_set(encache_config *cfg, int k, char *warn);
/* Reads the members of obj as section sec into s (defaults first; a
 * member named skip, which may be NULL, is the caller's).  The rules
 * between options are the caller's to check (sections.h). */
int encache__load_section(encache_config *cfg, scratch *s, enum section sec,
                          const json_t *obj, const char *skip);
/* Moves the scratch values and unknowns of section sec into cfg. */
void encache__commit_section(encache_config *cfg, scratch *s, enum section sec);
void encache__scratch_free(scratch *s);
/* Frees the names in *unknown and empties it. */
void encache__unknown_clear(char ***unknown, int *n);

#endif
