/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/value.c: one option's value: its rendering and the checks of
 * its kind and rule.  A JSON member (json.c) and a setter (setters.c) end
 * in the same check, so they accept the same values with the same
 * messages.
 */
#include "config/value.h"

#include <jansson.h>

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
