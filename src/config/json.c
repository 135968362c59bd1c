/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/json.c: JSON members into values, an option's default, a
 * section parsed into a scratch copy (committed by the caller only when
 * the whole section is valid) and a JSON text read as vLLM reads it
 * (json.h).
 */
#include "config/json.h"
#include "config/python.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void encache__json_brief(const json_t *j, char *buf, size_t size) {
  char *s = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
  if (s == NULL) {
    snprintf(buf, size, "%s", encache__json_kind(j));
    return;
  }
  if (strlen(s) > 60)
    snprintf(buf, size, "%.57s...", s);
  else
    snprintf(buf, size, "%s", s);
  free(s);
}

/* Python's bool(): null, false, 0, 0.0, "", [] and {} are false. */
static int truthy(const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_TRUE:
    return 1;
  case JSON_INTEGER:
    return json_integer_value(j) != 0;
  case JSON_REAL:
    return json_real_value(j) != 0;
  case JSON_STRING:
    return json_string_length(j) != 0;
  case JSON_ARRAY:
    return json_array_size(j) != 0;
  case JSON_OBJECT:
    return json_object_size(j) != 0;
  default:
    return 0;
  }
}

/* A string member for a string kind; NULL with *rc set otherwise. */
static char *string_member(encache_config *cfg, const opt_def *o,
                           const json_t *j, const char *got, int *rc,
                           const char **odd) {
  const char *sec = encache__section_names[o->sec];
  char num[64];
  const char *py = NULL;
  if (o->kind == K_PYSTR) {
    if (encache__py_str(j, num, &py, odd) < 0) {
      *rc = json_is_real(j)
                ? encache__config_fail(cfg, ENCACHE_ECONFIG,
                                       "%s.%s: %s cannot "
                                       "be written as Python writes it",
                                       sec, o->name, got)
                : encache__config_fail(
                      cfg, ENCACHE_ECONFIG,
                      "%s.%s: must be a string, got %s %s (vLLM would write "
                      "Python's str() of it into every key, which no one "
                      "intends)",
                      sec, o->name, encache__json_kind(j), got);
      return NULL;
    }
  } else if (o->kind == K_TENANT && json_is_null(j)) {
    py = ""; /* vLLM's _normalize_tenant_id: null is "default" */
  } else if (json_is_string(j)) {
    py = json_string_value(j);
  } else {
    *rc = encache__config_fail(
        cfg, ENCACHE_ECONFIG, "%s.%s: must be a %s, got %s %s%s", sec, o->name,
        o->kind == K_TENANT ? "string or null" : "string",
        encache__json_kind(j), got,
        o->kind == K_TENANT ? " (vLLM refuses it too)" : "");
    return NULL;
  }
  char *s =
      o->kind == K_TENANT ? encache__tenant_normalize(py) : encache__strdup(py);
  *rc = s == NULL ? encache__config_oom(cfg) : 0;
  return s;
}

/* Python's int() of a str, base 10, for the values that fit 64 bits:
 * surrounding whitespace, a sign, digits with single '_' between them.
 * Returns 0 with *out, ENCACHE__PY_VLLM_REFUSES when int() refuses it,
 * ENCACHE__PY_ONLY_ENCACHE beyond 64 bits (a negative one is a sign of -1
 * and its magnitude: vLLM refuses it as <= 0). */
static int python_int(const char *s, int64_t *sign, uint64_t *out) {
  while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
    s++;
  *sign = 1;
  if (*s == '+' || *s == '-')
    *sign = *s++ == '-' ? -1 : 1;
  uint64_t u = 0;
  int digits = 0, big = 0;
  for (; (*s >= '0' && *s <= '9') || *s == '_'; s++) {
    if (*s == '_') {
      if (digits == 0 || s[1] < '0' || s[1] > '9')
        return ENCACHE__PY_VLLM_REFUSES;
      continue;
    }
    unsigned d = (unsigned)(*s - '0');
    big |= u > (UINT64_MAX - d) / 10;
    u = u * 10 + d;
    digits++;
  }
  while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
    s++;
  if (digits == 0 || *s != '\0')
    return ENCACHE__PY_VLLM_REFUSES;
  *out = u;
  return big ? ENCACHE__PY_ONLY_ENCACHE : 0;
}

/* A store_* option as vLLM's _positive_int reads it
 * (vllm/distributed/ec_transfer/ec_connector/mooncake/config.py at
 * e4bf5fb63fa46dc17924014d1379846afc9102f0): an integer, a finite
 * integral float (32.0) or a string int() reads ("32"), never a boolean;
 * the value must be > 0 (encache__value_check).  Its messages are vLLM's
 * ("ECMooncakeConnector requires NAME to be a positive integer."). */
static int vllm_positive_int(encache_config *cfg, const opt_def *o,
                             const json_t *j, value *v, const char *got) {
  const char *sec = encache__section_names[o->sec];
  int64_t sign = 1;
  int r = ENCACHE__PY_VLLM_REFUSES;
  if (json_is_integer(j)) {
    sign = json_integer_value(j) < 0 ? -1 : 1;
    v->u = (uint64_t)json_integer_value(j);
    r = 0;
  } else if (json_is_real(j)) {
    double d = json_real_value(j);
    r = isfinite(d) && d == floor(d) ? 0 : ENCACHE__PY_VLLM_REFUSES;
    sign = d < 0 ? -1 : 1;
    if (r == 0 && fabs(d) >= 18446744073709551616.0)
      r = ENCACHE__PY_ONLY_ENCACHE;
    else if (r == 0)
      v->u = (uint64_t)fabs(d);
  } else if (json_is_string(j)) {
    r = python_int(json_string_value(j), &sign, &v->u);
  }
  if (r == ENCACHE__PY_ONLY_ENCACHE)
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "%s.%s: %s is 2^64 or more: vLLM reads it, "
                                "encache holds 64 bits; refused",
                                sec, o->name, got);
  if (r != 0)
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "%s.%s: must be a positive integer (an "
                                "integer, an integral number or a string of "
                                "one, as vLLM reads it), got %s "
                                "(vLLM: ECMooncakeConnector requires %s to "
                                "be a positive integer.)",
                                sec, o->name, got, o->name);
  if (sign < 0 || v->u == 0)
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "%s.%s: must be a positive integer, got %s "
                                "(vLLM: ECMooncakeConnector requires %s > 0.)",
                                sec, o->name, got, o->name);
  return 0;
}

static int u64_member(encache_config *cfg, const opt_def *o, const json_t *j,
                      value *v, const char *got) {
  const char *sec = encache__section_names[o->sec];
  if (o->kind == K_SIZE) {
    char why[256];
    int r = encache__vllm_size(j, &v->u, why, sizeof(why));
    if (r != 0)
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG, "%s.%s: %s: %s%s", sec, o->name, got, why,
          r == ENCACHE__PY_VLLM_REFUSES
              ? "; vLLM would refuse this configuration too"
              : " (encache refuses it before Mooncake does)");
    return 0;
  }
  if (o->kind == K_VPOSINT)
    return vllm_positive_int(cfg, o, j, v, got);
  if (!json_is_integer(j) || json_integer_value(j) < 0)
    return encache__config_fail(
        cfg, ENCACHE_ECONFIG, "%s.%s: must be a %s integer, got %s", sec,
        o->name, o->kind == K_POSINT ? "positive" : "non-negative", got);
  v->u = (uint64_t)json_integer_value(j);
  return 0;
}

int encache__json_decode(encache_config *cfg, const opt_def *o, const json_t *j,
                         value *v, const char *got, const char **odd) {
  const char *sec = encache__section_names[o->sec];
  memset(v, 0, sizeof(*v));
  v->given = v->set = 1;
  *odd = NULL;
  switch (encache__kind_class(o->kind)) {
  case C_BOOL:
    if (o->kind == K_BOOL && !json_is_boolean(j))
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG,
          "%s.%s: must be a boolean (true or false), got %s %s", sec, o->name,
          encache__json_kind(j), got);
    v->b = truthy(j);
    return 0;
  case C_U64:
    return u64_member(cfg, o, j, v, got);
  case C_DOUBLE:
    if (!json_is_number(j))
      return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "%s.%s: must be a non-negative number, got "
                                  "%s",
                                  sec, o->name, got);
    v->d = json_number_value(j);
    return 0;
  case C_STRING: {
    int rc;
    v->s = string_member(cfg, o, j, got, &rc, odd);
    return rc;
  }
  }
  return ENCACHE_EINVAL;
}

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

/* Sets v from member j of option o, or fails naming the option. */
static int value_from_json(encache_config *cfg, const opt_def *o,
                           const json_t *j, value *v) {
  char got[80];
  const char *odd;
  encache__json_brief(j, got, sizeof(got));
  int rc = encache__json_decode(cfg, o, j, v, got, &odd);
  if (rc < 0)
    return rc;
  if (encache__value_render(o, v) < 0)
    return encache__config_oom(cfg);
  if ((rc = encache__value_check(cfg, o, v, got)) < 0 ||
      (rc = encache__value_note(cfg, o, v, got, odd)) < 0)
    return rc;
  if ((o->kind == K_PYSTR && !json_is_string(j)) ||
      (o->kind == K_TRUTHY && !json_is_boolean(j))) {
    /* Shown as given, not as read. */
    char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    encache__free(v->text);
    v->text = t ? encache__strdup(t) : NULL;
    free(t);
    if (v->text == NULL)
      return encache__config_oom(cfg);
  }
  return 0;
}

/* --------------------------------------------------------------- loads */

void encache__unknown_clear(char ***unknown, int *n) {
  for (int i = 0; i < *n; i++)
    encache__free((*unknown)[i]);
  encache__free(*unknown);
  *unknown = NULL;
  *n = 0;
}

void encache__scratch_free(scratch *s) {
  for (int i = 0; i < NOPTS; i++)
    encache__value_clear(&s->vals[i]);
  for (int k = 0; k < SEC_COUNT; k++)
    encache__unknown_clear(&s->unknown[k], &s->nunknown[k]);
}

static int add_unknown(scratch *s, enum section sec, const char *name) {
  char **u = encache__realloc(s->unknown[sec],
                              sizeof(char *) * (size_t)(s->nunknown[sec] + 1));
  if (u == NULL)
    return ENCACHE_ENOMEM;
  s->unknown[sec] = u;
  u[s->nunknown[sec]] =
      encache__asprintf("%s.%s", encache__section_names[sec], name);
  if (u[s->nunknown[sec]] == NULL)
    return ENCACHE_ENOMEM;
  s->nunknown[sec]++;
  return 0;
}

/* Reads member `name` = j of section sec into s. */
static int load_member(encache_config *cfg, scratch *s, enum section sec,
                       const char *name, const json_t *j) {
  int i = encache__opt_find(sec, name);
  if (i < 0)
    return add_unknown(s, sec, name) < 0 ? encache__config_oom(cfg) : 0;
  const opt_def *o = &encache__opt_defs[i];
  value *v = &s->vals[i];
  if (o->kind == K_DERIVED) {
    /* vLLM does not read it either: say so once. */
    encache__free(v->warn);
    v->warn = encache__asprintf(
        "%s.%s: ignored, as vLLM ignores it (the client's hostname is "
        "derived: see docs/configuration.md)",
        encache__section_names[sec], name);
    return v->warn == NULL ? encache__config_oom(cfg) : 0;
  }
  encache__value_clear(v);
  /* A null member of an option without a default leaves it unset, as
   * Python's dict.get would in vLLM (a key field is str(None) there). */
  if (json_is_null(j) && o->def == NULL && o->rule != R_REQUIRED &&
      o->kind != K_PYSTR) {
    if (encache__value_default(o, v) < 0)
      return encache__config_oom(cfg);
    v->given = 1;
    return 0;
  }
  return value_from_json(cfg, o, j, v);
}

int encache__load_section(encache_config *cfg, scratch *s, enum section sec,
                          const json_t *obj, const char *skip) {
  const char *name;
  json_t *j;
  for (int i = 0; i < NOPTS; i++)
    if (encache__opt_defs[i].sec == sec &&
        encache__value_default(&encache__opt_defs[i], &s->vals[i]) < 0)
      return encache__config_oom(cfg);
  json_object_foreach((json_t *)obj, name, j) {
    if (skip != NULL && strcmp(name, skip) == 0)
      continue;
    int rc = load_member(cfg, s, sec, name, j);
    if (rc < 0)
      return rc;
  }
  return 0;
}

void encache__commit_section(encache_config *cfg, scratch *s,
                             enum section sec) {
  for (int i = 0; i < NOPTS; i++) {
    if (encache__opt_defs[i].sec != sec)
      continue;
    encache__value_clear(&cfg->vals[i]);
    cfg->vals[i] = s->vals[i];
    memset(&s->vals[i], 0, sizeof(s->vals[i]));
  }
  encache__unknown_clear(&cfg->unknown[sec], &cfg->nunknown[sec]);
  cfg->unknown[sec] = s->unknown[sec];
  cfg->nunknown[sec] = s->nunknown[sec];
  s->unknown[sec] = NULL;
  s->nunknown[sec] = 0;
  encache__config_sync(cfg);
}

/* The path (a.b.c) of the first string under j that holds a NUL, written
 * into path (its first used bytes at *used); 1 if found, else 0. */
static int nul_string(const json_t *j, char *path, size_t size, size_t used) {
  if (json_is_string(j))
    return memchr(json_string_value(j), '\0', json_string_length(j)) != NULL;
  const char *name;
  json_t *v;
  size_t i;
  if (json_is_object(j))
    json_object_foreach((json_t *)j, name, v) {
      int n = snprintf(path + used, size - used, "%s%s", used ? "." : "", name);
      if (nul_string(v, path, size,
                     n < 0 || (size_t)n >= size - used ? size - 1 : used + (size_t)n))
        return 1;
      path[used] = '\0';
    }
  if (json_is_array(j))
    json_array_foreach(j, i, v) {
      int n = snprintf(path + used, size - used, "[%zu]", i);
      if (nul_string(v, path, size,
                     n < 0 || (size_t)n >= size - used ? size - 1 : used + (size_t)n))
        return 1;
      path[used] = '\0';
    }
  return 0;
}

/* The refusal of a JSON text that Python's json.loads reads but that
 * jansson cannot hold: an integer of 2^63 or more (or below -2^63). */
static int too_big_integer(encache_config *cfg, const char *what,
                           const json_error_t *err) {
  return encache__config_fail(
      cfg, ENCACHE_ECONFIG,
      "%s: the integer at line %d, column %d is outside -2^63 .. 2^63-1: "
      "vLLM (Python's json.loads) reads integers of any size, encache "
      "holds 64 bits and no option takes a value that large: refused",
      what, err->line, err->column);
}

void encache__json_warn_set(encache_config *cfg, int k, char *warn) {
  encache__free(cfg->json_warn[k]);
  cfg->json_warn[k] = warn;
}

/* Parses json[0..len) as one JSON object, or fails with line and column.
 * It is read as vLLM reads it, with Python's json.loads: a key given twice
 * in one object keeps its last value (jansson does so without
 * JSON_REJECT_DUPLICATES), with a warning in *warn (from the allocator,
 * for the caller to keep or free; NULL when none) naming where, since the
 * first value is silently dropped.  Python's json reads \u0000 inside a
 * string, so it is read here too, and then refused by name: no string of
 * the configuration may hold a NUL (a C string would end there, and two
 * different identities or prefixes would give one namespace).  Integers
 * beyond 64 bits are refused, saying that vLLM would read them. */
json_t *encache__json_object(encache_config *cfg, const char *json, size_t len,
                             const char *what, int *rc, char **warn) {
  json_error_t err;
  *warn = NULL;
  json_t *root =
      json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
  if (root == NULL && json_error_code(&err) == json_error_duplicate_key) {
    char text[512];
    snprintf(text, sizeof(text),
             "%s: a key is given twice in one object (first at line %d, "
             "column %d): the last value is used, as vLLM (Python's "
             "json.loads) uses it, and the earlier ones are ignored",
             what, err.line, err.column);
    root = json_loadb(json, len, JSON_ALLOW_NUL, &err);
    if (root != NULL && (*warn = encache__strdup(text)) == NULL) {
      json_decref(root);
      *rc = encache__config_fail(cfg, ENCACHE_ENOMEM, "%s: out of memory",
                                 what);
      return NULL;
    }
  }
  if (root == NULL && json_error_code(&err) == json_error_numeric_overflow) {
    *rc = too_big_integer(cfg, what, &err);
    return NULL;
  }
  char path[256] = "";
  if (root != NULL && nul_string(root, path, sizeof(path), 0)) {
    *rc = encache__config_fail(cfg, ENCACHE_ECONFIG,
                               "%s: %s: the string holds a NUL character "
                               "(\\u0000): refused, no key or option may hold "
                               "one", what, path);
    json_decref(root);
    encache__free(*warn);
    *warn = NULL;
    return NULL;
  }
  if (root == NULL) {
    *rc = json_error_code(&err) == json_error_out_of_memory
              ? encache__config_fail(cfg, ENCACHE_ENOMEM, "%s: out of memory",
                                     what)
              : encache__config_fail(cfg, ENCACHE_EJSON,
                                     "%s: malformed JSON at line %d, column "
                                     "%d: %s",
                                     what, err.line, err.column, err.text);
    return NULL;
  }
  if (!json_is_object(root)) {
    char got[80];
    encache__json_brief(root, got, sizeof(got));
    *rc = encache__config_fail(cfg, ENCACHE_ECONFIG,
                               "%s: must be a JSON object, got %s %s", what,
                               encache__json_kind(root), got);
    json_decref(root);
    encache__free(*warn);
    *warn = NULL;
    return NULL;
  }
  return root;
}
