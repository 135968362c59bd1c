/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config.h: what the configuration's files share (src/config/).
 *
 * ENCACHE_OPTION_MAP (include/encache.h) is the one table of options;
 * table.c expands it into `encache__opt_defs`, which every other file
 * reads.  A value goes one way whatever its source (a JSON member, a
 * typed setter, a default): decoded into a `value` (json.c, or the
 * setters in value.c), checked against its kind and rule
 * (encache__value_check), then stored.  The typed view the library reads
 * (encache__opts) is refreshed from the values after every change.
 *
 * Files: table.c (the rows and their metadata), value.c (values, setters,
 * getters), json.c (JSON members and the ec sections), python.c (what
 * vLLM's Python does to a value), sections.c (the rules between options,
 * the Mooncake JSON, validate()),
 * config.c (the handle, listings, deployment, namespace).
 */
#ifndef ENCACHE_CONFIG_CONFIG_H
#define ENCACHE_CONFIG_CONFIG_H

#include "internal.h"

#include "config/opts.h"

#include <jansson.h>

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

/* One option's value, whatever its source.  Invariant: `text` renders
 * the value (JSON text, "null" when unset) once a value is stored. */
typedef struct value {
  int given;  /* 1 = from the input or a setter, 0 = default */
  int set;    /* 0 = unset (no default, not given) */
  int b;      /* C_BOOL */
  uint64_t u; /* C_U64 */
  double d;   /* C_DOUBLE */
  char *s;    /* C_STRING (owned) */
  char *text; /* the value as JSON text, for display (owned) */
  char *warn; /* a warning about this value, or NULL (owned) */
} value;

struct encache_config {
  value vals[NOPTS];
  encache__opts opts;        /* the typed view of vals (encache__config_sync) */
  int mooncake_loaded;       /* the mooncake section is in use */
  char **unknown[SEC_COUNT]; /* owned strings, "section.name" */
  int nunknown[SEC_COUNT];
  /* A warning about how the JSON itself was read (a duplicate key: the
   * last value wins, as in Python), of the last successful load of the
   * ec-transfer-config [0] and of the Mooncake JSON [1]; owned, or NULL. */
  char *json_warn[2];
  char errmsg[1024]; /* never allocated: kept on out of memory too */
};

/* Parse state for one load: scratch values of every option (only the
 * loaded section's entries are used) and the unknown names found. */
typedef struct scratch {
  value vals[NOPTS];
  char **unknown[SEC_COUNT];
  int nunknown[SEC_COUNT];
} scratch;

/* Sets cfg's message (cfg may be NULL) and returns rc. */
int encache__config_fail(encache_config *cfg, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int encache__config_oom(encache_config *cfg);
void encache__config_clear_error(encache_config *cfg);
void encache__config_sync(encache_config *cfg);

void encache__value_clear(value *v);
int encache__value_render(const opt_def *o, value *v);
int encache__value_default(const opt_def *o, value *v);
/* Checks v (typed, rendered) against o's kind and rule; `got` is the
 * value as given, for the message. */
int encache__value_check(encache_config *cfg, const opt_def *o, const value *v,
                         const char *got);
/* A key field's warning: `odd` says what vLLM made of a non-string
 * value (NULL for a string). */
int encache__value_note(encache_config *cfg, const opt_def *o, value *v,
                        const char *got, const char *odd);

/* JSON: decodes j into v for option o (kind only; no rule); got is j as
 * short text.  *odd as for encache__value_note. */
int encache__json_decode(encache_config *cfg, const opt_def *o, const json_t *j,
                         value *v, const char *got, const char **odd);
const char *encache__json_kind(const json_t *j);
void encache__json_brief(const json_t *j, char *buf, size_t size);
json_t *encache__json_object(encache_config *cfg, const char *json, size_t len,
                             const char *what, int *rc, char **warn);
/* Replaces cfg's JSON warning k (0: ec, 1: mooncake) by warn (owned). */
void encache__json_warn_set(encache_config *cfg, int k, char *warn);
int encache__load_section(encache_config *cfg, scratch *s, enum section sec,
                          const json_t *obj, const char *skip);
void encache__commit_section(encache_config *cfg, scratch *s, enum section sec);
void encache__scratch_free(scratch *s);
/* Frees the names in *unknown and empties it. */
void encache__unknown_clear(char ***unknown, int *n);
/* The rules between options of section sec, on vals. */
int encache__section_check(encache_config *cfg, const value *vals,
                           enum section sec);
/* Sets the derived local_hostname in vals. */
int encache__derive_hostname(encache_config *cfg, value *vals);

/* Python: [*a, *e) stripped as str.strip() strips ASCII. */
void encache__py_strip(const char **a, const char **e);
/* vLLM's _parse_size: 0, or -1 (vLLM refuses it too) / -2 (only encache
 * does) with why. */
int encache__vllm_size(const json_t *j, uint64_t *out, char *why, size_t wsize);
/* vLLM's _normalize_tenant_id of a string: stripped, blank = "default".
 * An allocation, NULL when out of memory. */
char *encache__tenant_normalize(const char *t);
/* Python's str() of a key field's JSON value into num[64] (or the
 * string itself); *odd as above.  ENCACHE_ECONFIG for an object, an
 * array or a float Python cannot write. */
int encache__py_str(const json_t *j, char *num, const char **py,
                    const char **odd);

#endif
