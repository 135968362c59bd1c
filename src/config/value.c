/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/value.c: one option's value: its default, its rendering, the
 * checks of its kind and rule, and the typed setters and getters by id.
 * A JSON member (json.c) and a setter end in the same check and store,
 * so they accept the same values with the same messages.
 */
#include "config/config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void encache__value_clear(value *v) {
  encache__free(v->s);
  encache__free(v->text);
  encache__free(v->warn);
  memset(v, 0, sizeof(*v));
}

static char *json_text_of_string(const char *s) {
  json_t *js = json_string(s);
  char *t = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
  json_decref(js);
  char *r = t ? encache__strdup(t) : NULL;
  free(t);
  return r;
}

/* Renders v as JSON text into v->text.  Returns 0 or ENCACHE_ENOMEM. */
int encache__value_render(const opt_def *o, value *v) {
  encache__free(v->text);
  v->text = NULL;
  if (!v->set)
    v->text = encache__strdup("null");
  else if (encache__kind_class(o->kind) == C_BOOL)
    v->text = encache__strdup(v->b ? "true" : "false");
  else if (encache__kind_class(o->kind) == C_U64)
    v->text = encache__asprintf("%" PRIu64, v->u);
  else if (encache__kind_class(o->kind) == C_DOUBLE)
    v->text = encache__asprintf("%.17g", v->d);
  else
    v->text = json_text_of_string(v->s);
  return v->text == NULL ? ENCACHE_ENOMEM : 0;
}

/* Sets v to o's default: its JSON text read as a member would be. */
int encache__value_default(const opt_def *o, value *v) {
  memset(v, 0, sizeof(*v));
  if (o->def != NULL) {
    json_t *j = json_loads(o->def, JSON_DECODE_ANY, NULL);
    const char *odd;
    int rc = j == NULL ? ENCACHE_ENOMEM
                       : encache__json_decode(NULL, o, j, v, o->def, &odd);
    json_decref(j);
    if (rc < 0)
      return rc;
    v->given = 0;
  }
  return encache__value_render(o, v);
}

static int one_of(const char *choices, const char *s) {
  size_t n = strlen(s);
  for (const char *p = choices; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, s, n) == 0)
      return 1;
    p += len + (bar ? 1 : 0);
  }
  return 0;
}

int encache__value_check(encache_config *cfg, const opt_def *o, const value *v,
                         const char *got) {
  const char *sec = encache__section_names[o->sec];
  if (!v->set)
    return 0;
  if ((o->kind == K_POSINT || o->kind == K_VPOSINT) && v->u == 0)
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "%s.%s: must be a positive integer, got %s",
                                sec, o->name, got);
  if (o->kind == K_NUMBER && !(isfinite(v->d) && v->d >= 0))
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "%s.%s: must be a non-negative number, got %s",
                                sec, o->name, got);
  switch (o->rule) {
  case R_ONE_OF:
    if (!one_of(o->arg, v->s))
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG, "%s.%s: must be one of %s, got %s%s", sec,
          o->name, o->arg, got,
          o->sec == SEC_MOONCAKE ? " (vLLM refuses it too)" : "");
    break;
  case R_NONZERO:
    if (v->u == 0)
      return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "%s.%s: must be > 0, got %s (vLLM refuses "
                                  "it too)",
                                  sec, o->name, got);
    break;
  case R_REQUIRED:
    /* An empty address is not an address: Mooncake's setup can only fail
     * on it, so it is refused where the docs call the option required. */
    if (encache__kind_class(o->kind) == C_STRING && v->s != NULL &&
        v->s[0] == '\0')
      return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "%s.%s: must not be empty: it is required "
                                  "(an empty address can only fail when "
                                  "the client sets up)",
                                  sec, o->name);
    break;
  case R_RAM_STORE:
    /* Offloading objects to SSD would let a read complete from a tier
     * encache cannot reason about (vLLM's embedding client refuses it). */
    if (v->b)
      return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "%s.%s: must not be true (got %s): encache "
                                  "requires a RAM Store, as vLLM's "
                                  "cross_encoder_cache does",
                                  sec, o->name, got);
    break;
  case R_DEFAULT_TENANT:
    /* Mooncake's C ABI (store_c.h) setup takes no tenant: a client would
     * join the default tenant where vLLM joins this one. */
    if (strcmp(v->s, "default") != 0)
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG,
          "%s.%s: \"%s\" cannot be honoured: the Mooncake C ABI encache "
          "loads (store_c.h setup) takes no tenant, so encache would join "
          "the default tenant while vLLM joins \"%s\" (and they would share "
          "no objects); remove tenant_id or use the default tenant "
          "(docs/compatibility.md says what joining it would need)",
          sec, o->name, v->s, v->s);
    break;
  default:
    break;
  }
  return 0;
}

int encache__value_note(encache_config *cfg, const opt_def *o, value *v,
                        const char *got, const char *odd) {
  int model = o->rule == R_KEY_MODEL;
  if (odd == NULL && model && v->s != NULL && v->s[0] == '\0')
    odd = "an empty string";
  if (odd == NULL || (o->rule != R_KEY_MODEL && o->rule != R_KEY_PREFIX))
    return 0;
  encache__free(v->warn);
  v->warn = encache__asprintf(
      "%s.%s: %s (%s) gives the key field %s%s%s, as vLLM writes it "
      "(Python's str()); give a string if that is not what you mean",
      encache__section_names[o->sec], o->name, got, odd, model ? "model:" : "",
      v->s, model ? "" : "@ (a prefix)");
  return v->warn == NULL ? encache__config_oom(cfg) : 0;
}

/* ------------------------------------------------------------ the view */

void encache__config_sync(encache_config *cfg) {
  for (int i = 0; i < NOPTS; i++) {
    const opt_def *o = &encache__opt_defs[i];
    const value *v = &cfg->vals[i];
    void *f = (char *)&cfg->opts + o->off;
    switch (encache__kind_class(o->kind)) {
    case C_BOOL:
      *(int *)f = v->b;
      break;
    case C_U64:
      *(uint64_t *)f = v->u;
      break;
    case C_DOUBLE:
      *(double *)f = v->d;
      break;
    case C_STRING:
      *(const char **)f = v->set ? v->s : NULL;
      break;
    }
  }
}

const encache__opts *encache__config_opts(const encache_config *cfg) {
  return &cfg->opts;
}

/* -------------------------------------------------------------- setters */

static const char *const setter_names[] = {"bool", "u64", "double", "string"};

/* The row of id if setter `cls` may set it, else fails. */
static const opt_def *settable(encache_config *cfg, encache_option id,
                               enum kclass cls, int *rc) {
  *rc = ENCACHE_EINVAL;
  if (cfg == NULL)
    return NULL;
  if ((unsigned)id >= ENCACHE_OPT_COUNT) {
    *rc = encache__config_fail(cfg, ENCACHE_EINVAL,
                               "option id %d: no such "
                               "option",
                               (int)id);
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
  encache__config_clear_error(cfg);
  return 0;
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
    return encache__config_fail(cfg, ENCACHE_EINVAL,
                                "option id %d: no such "
                                "option",
                                (int)id);
  value v;
  if (encache__value_default(&encache__opt_defs[id], &v) < 0) {
    encache__value_clear(&v);
    return encache__config_oom(cfg);
  }
  encache__value_clear(&cfg->vals[id]);
  cfg->vals[id] = v;
  encache__config_sync(cfg);
  encache__config_clear_error(cfg);
  return 0;
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
