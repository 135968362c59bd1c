/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/table.h: the options table, the bottom of the configuration
 * (src/config/).  ENCACHE_OPTION_MAP (include/encache.h) is the one table
 * of options; table.c expands it into `encache__opt_defs`, which every
 * other file reads, and answers the public metadata by id.
 *
 * The rooms, bottom first (each file stands only on those before it):
 *   table.c     the rows, their kinds and metadata (this header)
 *   python.c    what vLLM's Python does to a value (python.h)
 *   handle.c    the handle's core: the values, their typed view, the one
 *               message (handle.h)
 *   value.c     one value: rendering, the checks of its kind and rule
 *               (value.h)
 *   json.c      JSON members into values, a section parsed into a
 *               scratch copy, defaults (json.h)
 *   sections.c  the rules between options of a section, the derived
 *               local hostname (sections.h)
 *   config.c, load.c, setters.c: the entry points of include/encache.h
 *               (the handle and its listings; the loads and validate();
 *               the typed setters and getters), on top of all the others.
 *
 * A value goes one way whatever its source (a JSON member, a typed
 * setter, a default): decoded into a `value` (json.c, or setters.c),
 * checked against its kind and rule (encache__value_check), then stored.
 * The typed view the library reads (encache__opts) is refreshed from the
 * values after every change.
 */
#ifndef ENCACHE_CONFIG_TABLE_H
#define ENCACHE_CONFIG_TABLE_H

#include "internal.h"

#include "config/opts.h"

enum section { SEC_EC, SEC_EXTRA, SEC_MOONCAKE, SEC_COUNT };

enum kind {
  K_BOOL,
  K_TRUTHY,
  K_POSINT,
  K_UINT,
  K_SIZE,
  K_NUMBER,
  K_STRING,
  K_ENUM,
  K_PYSTR,
  K_TENANT,
  K_DERIVED,
  K_VPOSINT
};

/* The C type a kind is held in, and so the setter that takes it. */
enum kclass { C_BOOL, C_U64, C_DOUBLE, C_STRING };

enum rule {
  R_ANY,
  R_REQUIRED,
  R_NONZERO,
  R_ONE_OF,
  R_RAM_STORE,
  R_DEFAULT_TENANT,
  R_KEY_PREFIX,
  R_KEY_MODEL
};

typedef struct opt_def {
  enum section sec;
  const char *name;
  enum kind kind;
  const char *def; /* default as JSON text; NULL = unset */
  enum rule rule;
  const char *arg; /* R_ONE_OF: '|'-separated choices */
  const char *doc;
  const char *rule_text;
  size_t off; /* of the field in encache__opts */
} opt_def;

#define NOPTS ((int)ENCACHE_OPT_COUNT)

extern const opt_def encache__opt_defs[ENCACHE_OPT_COUNT];
extern const char *const encache__section_names[SEC_COUNT];
enum kclass encache__kind_class(enum kind k);
const char *encache__kind_name(enum kind k);
/* The row named `name` in section sec (SEC_COUNT = any), or -1. */
int encache__opt_find(int sec, const char *name);

#endif
