/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/setters.c: the typed setters and getters of include/encache.h,
 * by id and by name.  A setter builds a typed value and stores it through
 * the same check as a JSON member (value.c), so both accept the same
 * values with the same messages; a reset stores the option's default.
 */
#include "config/json.h"
#include "config/python.h"

#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------- setters */

static const char *const setter_names[] = {"bool", "u64", "double", "string"};

static int no_such_option(encache_config *cfg, encache_option id) {
  return encache__config_fail(cfg, ENCACHE_EINVAL,
                              "option id %d: no such option", (int)id);
}

/* The row of id if setter `cls` may set it, else fails. */
static const opt_def *settable(encache_config *cfg, encache_option id,
                               enum kclass cls, int *rc) {
  *rc = ENCACHE_EINVAL;
  if (cfg == NULL)
    return NULL;
  if ((unsigned)id >= ENCACHE_OPT_COUNT) {
    *rc = no_such_option(cfg, id);
    return NULL;
  }
  const opt_def *o = &encache__opt_defs[id];
  const char *sec = encache__section_names[o->sec];
  if (o->kind == K_DERIVED)
    *rc = encache__config_fail(cfg, ENCACHE_EINVAL,
                               "%s.%s: derived, not "
                               "set (see docs/configuration.md)",
                               sec, o->name);
  else if (encache__kind_class(o->kind) != cls)
    *rc = encache__config_fail(cfg, ENCACHE_EINVAL,
                               "%s.%s: a %s option: set "
                               "it with encache_config_set_%s",
                               sec, o->name, encache__kind_name(o->kind),
                               setter_names[encache__kind_class(o->kind)]);
  else
    *rc = 0;
  return *rc == 0 ? o : NULL;
}

/* Checks the typed value v of option o and stores it, or frees it. */
static int store(encache_config *cfg, const opt_def *o, value *v) {
  v->given = v->set = 1;
  int rc = encache__value_render(o, v) < 0 ? encache__config_oom(cfg) : 0;
  if (rc == 0)
    rc = encache__value_check(cfg, o, v, v->text);
  if (rc == 0)
    rc = encache__value_note(cfg, o, v, v->text, NULL);
  if (rc < 0) {
    encache__value_clear(v);
    return rc;
  }
  int i = (int)(o - encache__opt_defs);
  encache__value_clear(&cfg->vals[i]);
  cfg->vals[i] = *v;
  cfg->mooncake_loaded |= o->sec == SEC_MOONCAKE;
  encache__config_sync(cfg);
  return encache__config_done(cfg, 0);
}

/* The setter of one C type: a typed value, then store(). */
#define SETTER_(fn, ctype, cls, field, expr)                                   \
  int fn(encache_config *cfg, encache_option id, ctype value_) {               \
    int rc;                                                                    \
    const opt_def *o = settable(cfg, id, cls, &rc);                            \
    value v = {.field = (expr)};                                               \
    return o == NULL ? rc : store(cfg, o, &v);                                 \
  }
SETTER_(encache_config_set_bool, int, C_BOOL, b, value_ != 0)
SETTER_(encache_config_set_u64, uint64_t, C_U64, u, value_)
SETTER_(encache_config_set_double, double, C_DOUBLE, d, value_)
#undef SETTER_

int encache_config_set_string(encache_config *cfg, encache_option id,
                              const char *value_) {
  int rc;
  const opt_def *o = settable(cfg, id, C_STRING, &rc);
  if (o == NULL)
    return rc;
  if (value_ == NULL)
    return encache_config_reset(cfg, id);
  value v = {.s = o->kind == K_TENANT ? encache__tenant_normalize(value_)
                                      : encache__strdup(value_)};
  return v.s == NULL ? encache__config_oom(cfg) : store(cfg, o, &v);
}

int encache_config_reset(encache_config *cfg, encache_option id) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if ((unsigned)id >= ENCACHE_OPT_COUNT)
    return no_such_option(cfg, id);
  value v;
  if (encache__value_default(&encache__opt_defs[id], &v) < 0) {
    encache__value_clear(&v);
    return encache__config_oom(cfg);
  }
  encache__value_clear(&cfg->vals[id]);
  cfg->vals[id] = v;
  encache__config_sync(cfg);
  return encache__config_done(cfg, 0);
}

/* -------------------------------------------------------------- getters */

static const value *get_typed(const encache_config *cfg, int i, enum kclass cls,
                              int *rc) {
  *rc = ENCACHE_EINVAL;
  if (cfg == NULL || i < 0 || i >= NOPTS ||
      encache__kind_class(encache__opt_defs[i].kind) != cls)
    return NULL;
  *rc = 0;
  return &cfg->vals[i];
}

/* The getter by id of one C type: the value, or EINVAL. */
#define GETTER_(fn, ctype, cls, expr)                                          \
  int fn(const encache_config *cfg, encache_option id, ctype *out) {           \
    int rc;                                                                    \
    const value *v = get_typed(cfg, (int)id, cls, &rc);                        \
    if (v != NULL && out != NULL)                                              \
      *out = (expr);                                                           \
    return rc;                                                                 \
  }
GETTER_(encache_config_bool, int, C_BOOL, v->b)
GETTER_(encache_config_u64, uint64_t, C_U64, v->u)
GETTER_(encache_config_double, double, C_DOUBLE, v->d)
GETTER_(encache_config_string, const char *, C_STRING, v->set ? v->s : NULL)
#undef GETTER_

int encache_config_is_set(const encache_config *cfg, encache_option id) {
  if (cfg == NULL || (unsigned)id >= ENCACHE_OPT_COUNT)
    return ENCACHE_EINVAL;
  return cfg->vals[id].set;
}

/* By name: the id, then the getter by id. */
static int id_of(const encache_config *cfg, const char *name) {
  if (cfg == NULL || name == NULL)
    return ENCACHE_EINVAL;
  return encache_option_find(name);
}

int encache_config_get_bool(const encache_config *cfg, const char *name,
                            int *out) {
  int id = id_of(cfg, name);
  return id < 0 ? id : encache_config_bool(cfg, (encache_option)id, out);
}

int encache_config_get_u64(const encache_config *cfg, const char *name,
                           uint64_t *out) {
  int id = id_of(cfg, name);
  return id < 0 ? id : encache_config_u64(cfg, (encache_option)id, out);
}

int encache_config_get_string(const encache_config *cfg, const char *name,
                              const char **out) {
  int id = id_of(cfg, name);
  return id < 0 ? id : encache_config_string(cfg, (encache_option)id, out);
}
