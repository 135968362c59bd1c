/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/table.c: ENCACHE_OPTION_MAP expanded into the rows every other
 * part reads (section, name, kind, default, rule, doc, and where the
 * option lives in encache__opts), and the public metadata by id.
 */
#include "config/table.h"

#include <stddef.h>
#include <string.h>

const char *const encache__section_names[SEC_COUNT] = {
    "ec_transfer_config", "ec_connector_extra_config", "mooncake"};

/* A rule in words, for listings and the docs (arg: the choices). */
#define RULE_TEXT_ANY(arg) ""
#define RULE_TEXT_REQUIRED(arg) "required"
#define RULE_TEXT_NONZERO(arg) "> 0"
#define RULE_TEXT_ONE_OF(arg) "one of " arg
#define RULE_TEXT_RAM_STORE(arg) "false (a RAM Store is required)"
#define RULE_TEXT_DEFAULT_TENANT(arg) "only \"default\""
#define RULE_TEXT_KEY_PREFIX(arg) "key prefix: str(value) + \"@\""
#define RULE_TEXT_KEY_MODEL(arg) "key model field: \"model:\" + str(value)"

const opt_def encache__opt_defs[ENCACHE_OPT_COUNT] = {
/* clang-format off */
#define ROW_(ID, SEC, NAME, KIND, DEF, RULE, ARG, DOC)                         \
  [ENCACHE_OPT_##ID] = {.sec = SEC_##SEC, .name = #NAME, .kind = K_##KIND,     \
                        .def = DEF, .rule = R_##RULE, .arg = ARG, .doc = DOC,  \
                        .rule_text = RULE_TEXT_##RULE(ARG),                    \
                        .off = offsetof(encache__opts, NAME)},
/* clang-format on */
    ENCACHE_OPTION_MAP(ROW_)
#undef ROW_
};

static const struct {
  const char *name;
  enum kclass cls;
} kinds[] = {
    [K_BOOL] = {"boolean", C_BOOL},
    [K_TRUTHY] = {"truthy", C_BOOL},
    [K_POSINT] = {"positive integer", C_U64},
    [K_UINT] = {"non-negative integer", C_U64},
    [K_SIZE] = {"size", C_U64},
    [K_NUMBER] = {"number", C_DOUBLE},
    [K_STRING] = {"string", C_STRING},
    [K_ENUM] = {"enum", C_STRING},
    [K_PYSTR] = {"key text", C_STRING},
    [K_TENANT] = {"tenant", C_STRING},
    [K_DERIVED] = {"derived", C_STRING},
    [K_VPOSINT] = {"vLLM positive integer", C_U64},
};

enum kclass encache__kind_class(enum kind k) { return kinds[k].cls; }

const char *encache__kind_name(enum kind k) { return kinds[k].name; }

int encache__opt_find(int sec, const char *name) {
  for (int i = 0; i < NOPTS; i++)
    if ((sec == SEC_COUNT || (int)encache__opt_defs[i].sec == sec) &&
        strcmp(encache__opt_defs[i].name, name) == 0)
      return i;
  return -1;
}

/* ------------------------------------------------------------- metadata */

static const opt_def *def_of(encache_option id) {
  return (unsigned)id < ENCACHE_OPT_COUNT ? &encache__opt_defs[id] : NULL;
}

const char *encache_option_name(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? o->name : NULL;
}

const char *encache_option_section(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? encache__section_names[o->sec] : NULL;
}

const char *encache_option_type(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? kinds[o->kind].name : NULL;
}

const char *encache_option_default(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? o->def : NULL;
}

const char *encache_option_rule(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? o->rule_text : NULL;
}

const char *encache_option_doc(encache_option id) {
  const opt_def *o = def_of(id);
  return o ? o->doc : NULL;
}

int encache_option_find(const char *name) {
  if (name == NULL)
    return ENCACHE_ENOENT;
  const char *dot = strchr(name, '.');
  int sec = SEC_COUNT;
  if (dot != NULL) {
    for (sec = 0; sec < SEC_COUNT; sec++)
      if (strlen(encache__section_names[sec]) == (size_t)(dot - name) &&
          strncmp(encache__section_names[sec], name, (size_t)(dot - name)) == 0)
        break;
    if (sec == SEC_COUNT)
      return ENCACHE_ENOENT;
    name = dot + 1;
  }
  int i = encache__opt_find(sec, name);
  return i < 0 ? ENCACHE_ENOENT : i;
}
