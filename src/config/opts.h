/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/opts.h: the options as the library reads them: one typed field
 * per row of ENCACHE_OPTION_MAP (include/encache.h), named as the option.
 * The engine and the Stores read these fields and never look an option
 * up by name.
 *
 * Invariant: every field holds a valid value (its default when the option
 * was not given); a string is NULL only for an unset option without a
 * default.  Strings belong to the configuration handle.
 */
#ifndef ENCACHE_CONFIG_OPTS_H
#define ENCACHE_CONFIG_OPTS_H

#include "encache.h"

#include <stdint.h>

/* The C type of each kind. */
#define ENCACHE__CTYPE_BOOL int
#define ENCACHE__CTYPE_TRUTHY int
#define ENCACHE__CTYPE_POSINT uint64_t
#define ENCACHE__CTYPE_VPOSINT uint64_t
#define ENCACHE__CTYPE_UINT uint64_t
#define ENCACHE__CTYPE_SIZE uint64_t
#define ENCACHE__CTYPE_NUMBER double
#define ENCACHE__CTYPE_STRING const char *
#define ENCACHE__CTYPE_ENUM const char *
#define ENCACHE__CTYPE_PYSTR const char *
#define ENCACHE__CTYPE_TENANT const char *
#define ENCACHE__CTYPE_DERIVED const char *

typedef struct encache__opts {
#define ENCACHE__OPT_FIELD_(id, sec, name, kind, ...)                          \
  ENCACHE__CTYPE_##kind name;
  ENCACHE_OPTION_MAP(ENCACHE__OPT_FIELD_)
#undef ENCACHE__OPT_FIELD_
} encache__opts;

/* The typed options of cfg; valid while cfg is and unchanged by reads. */
const encache__opts *encache__config_opts(const encache_config *cfg);

#endif
