/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_roundtrip.h: a property of every configuration the JSON parser
 * accepts: each option's typed value, given to its typed setter in a fresh
 * handle, is accepted and reads back the same, and the rules between
 * options (encache_config_validate) hold.  The JSON path and the setters
 * share their checks; this catches any drift between them.
 */
#ifndef ENCACHE_FUZZ_CONFIG_ROUNDTRIP_H
#define ENCACHE_FUZZ_CONFIG_ROUNDTRIP_H

#include "encache.h"

#include <stdint.h>
#include <string.h>

/* Sets option id of `to` from `from`; 0, or the setter's error. */
static int copy_option(const encache_config *from, encache_config *to,
                       encache_option id) {
  int b;
  uint64_t u;
  double d;
  const char *s;
  if (encache_config_is_set(from, id) == 0)
    return 0; /* unset in both */
  if (encache_config_bool(from, id, &b) == 0)
    return encache_config_set_bool(to, id, b);
  if (encache_config_u64(from, id, &u) == 0)
    return encache_config_set_u64(to, id, u);
  if (encache_config_double(from, id, &d) == 0)
    return encache_config_set_double(to, id, d);
  if (encache_config_string(from, id, &s) == 0)
    return encache_config_set_string(to, id, s);
  return ENCACHE_EINVAL;
}

static int same_option(const encache_config *a, const encache_config *b,
                       encache_option id) {
  int ba, bb;
  uint64_t ua, ub;
  double da, db;
  const char *sa, *sb;
  if (encache_config_bool(a, id, &ba) == 0)
    return encache_config_bool(b, id, &bb) == 0 && ba == bb;
  if (encache_config_u64(a, id, &ua) == 0)
    return encache_config_u64(b, id, &ub) == 0 && ua == ub;
  if (encache_config_double(a, id, &da) == 0)
    return encache_config_double(b, id, &db) == 0 && da == db;
  if (encache_config_string(a, id, &sa) != 0 ||
      encache_config_string(b, id, &sb) != 0)
    return 0;
  return sa == sb || (sa != NULL && sb != NULL && strcmp(sa, sb) == 0);
}

/* Checks the property for the options of sections whose name starts
 * with `prefix` ("ec_" or "mooncake"); traps when it breaks. */
static void config_roundtrip(const encache_config *cfg, const char *prefix) {
  encache_config *copy = NULL;
  if (encache_config_new(&copy) != 0)
    return;
  for (int i = 0; i < ENCACHE_OPT_COUNT; i++) {
    encache_option id = (encache_option)i;
    if (id == ENCACHE_OPT_LOCAL_HOSTNAME ||
        strncmp(encache_option_section(id), prefix, strlen(prefix)) != 0)
      continue;
    int rc = copy_option(cfg, copy, id);
    if (rc == ENCACHE_ENOMEM)
      goto out;
    if (rc != 0 || !same_option(cfg, copy, id))
      __builtin_trap();
  }
  int rc = encache_config_validate(copy);
  if (rc != 0 && rc != ENCACHE_ENOMEM)
    __builtin_trap();
out:
  encache_config_free(copy);
}

#endif
