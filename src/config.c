/*
 * config.c: the vLLM ec-transfer-config and the Mooncake client JSON.
 *
 * Every option encache knows is one row of `opts` below: its section, its
 * name, its type and its default.  Parsing, defaults, typed access and
 * the listing shown by `encache config check` all read that one table, so
 * an option is added in exactly one place.
 *
 * Invariants:
 *   - cfg->vals[i] always holds a valid value for option i: either its
 *     default (given == 0) or what the input said (given == 1).
 *   - A load parses into a scratch array and swaps it in only when the
 *     whole section is valid, so a failed load leaves cfg unchanged.
 *   - Unknown options are collected, never refused: vLLM ignores them too,
 *     and a fleet may run a newer encache beside an older one.
 */
#include "internal.h"

#include <jansson.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum section { SEC_EC, SEC_EXTRA, SEC_MOONCAKE, SEC_COUNT };

static const char *const section_names[SEC_COUNT] = {
    "ec_transfer_config", "ec_connector_extra_config", "mooncake"};

enum opt_type {
  T_BOOL,    /* JSON true/false only */
  T_STRING,  /* JSON string */
  T_POSINT,  /* integer > 0; floats, strings and booleans refused */
  T_UINT,    /* integer >= 0 */
  T_NUMBER,  /* any JSON number >= 0 */
  T_SIZE,    /* integer >= 0 or a size string ("4GB", "512MiB") */
  T_ENUM     /* a string among `choices` */
};

typedef struct opt_def {
  enum section sec;
  const char *name;
  enum opt_type type;
  const char *def;     /* default, as text in the type's syntax; NULL = unset */
  const char *choices; /* T_ENUM: '|'-separated */
  int required;        /* must be given when the section is loaded */
} opt_def;

/* clang-format off */
static const opt_def opts[] = {
  /* vLLM's ECTransferConfig fields: encache checks their types only. */
  {SEC_EC, "ec_connector", T_STRING, NULL, NULL, 0},
  {SEC_EC, "ec_role", T_ENUM, NULL, "ec_producer|ec_consumer|ec_both", 0},
  {SEC_EC, "engine_id", T_STRING, NULL, NULL, 0},
  {SEC_EC, "ec_connector_module_path", T_STRING, NULL, NULL, 0},
  {SEC_EC, "ec_buffer_device", T_STRING, NULL, NULL, 0},
  {SEC_EC, "ec_buffer_size", T_NUMBER, NULL, NULL, 0},
  {SEC_EC, "ec_ip", T_STRING, NULL, NULL, 0},
  {SEC_EC, "ec_port", T_UINT, NULL, NULL, 0},
  {SEC_EC, "ec_rank", T_UINT, NULL, NULL, 0},
  {SEC_EC, "ec_parallel_size", T_POSINT, NULL, NULL, 0},
  /* Cross-encoder output reuse (spec/behaviour.md). */
  {SEC_EXTRA, "cross_encoder_cache", T_BOOL, "false", NULL, 0},
  {SEC_EXTRA, "embedding_cache_prefix", T_STRING, "", NULL, 0},
  {SEC_EXTRA, "embedding_model_identity", T_STRING, NULL, NULL, 0},
  {SEC_EXTRA, "store_max_pending_items", T_POSINT, "32", NULL, 0},
  {SEC_EXTRA, "store_max_pending_bytes", T_POSINT, "2147483648", NULL, 0},
  {SEC_EXTRA, "store_read_buffer_bytes", T_POSINT, "134217728", NULL, 0},
  /* Mooncake Store client (defaults as vLLM's Mooncake config). */
  {SEC_MOONCAKE, "local_hostname", T_STRING, "localhost", NULL, 0},
  {SEC_MOONCAKE, "metadata_server", T_STRING, NULL, NULL, 1},
  {SEC_MOONCAKE, "master_server_address", T_STRING, NULL, NULL, 1},
  {SEC_MOONCAKE, "protocol", T_ENUM, "tcp", "tcp|rdma", 0},
  {SEC_MOONCAKE, "device_name", T_STRING, "", NULL, 0},
  {SEC_MOONCAKE, "mode", T_STRING, NULL, NULL, 0},
  {SEC_MOONCAKE, "global_segment_size", T_SIZE, "3355443200", NULL, 0},
  {SEC_MOONCAKE, "local_buffer_size", T_SIZE, "1073741824", NULL, 0},
  {SEC_MOONCAKE, "enable_offload", T_BOOL, "false", NULL, 0},
};
/* clang-format on */

#define NOPTS ((int)(sizeof(opts) / sizeof(opts[0])))

typedef struct value {
  int given;  /* 1 = from the input, 0 = default */
  int set;    /* 0 = unset (no default, not given) */
  int b;      /* T_BOOL */
  uint64_t u; /* T_POSINT, T_UINT, T_SIZE */
  double d;   /* T_NUMBER */
  char *s;    /* T_STRING, T_ENUM (owned) */
  char *text; /* the value as JSON text, for display (owned) */
} value;

struct encache_config {
  value vals[NOPTS];
  int mooncake_loaded;
  char **unknown[SEC_COUNT]; /* owned strings, "section.name" */
  int nunknown[SEC_COUNT];
  char *errmsg; /* owned; NULL = "" */
};

/* ------------------------------------------------------------ messages */

static int fail(encache_config *cfg, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(encache_config *cfg, int rc, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  encache__free(cfg->errmsg);
  cfg->errmsg = encache__strdup(buf); /* NULL on OOM: errmsg() says "" */
  return rc;
}

static void clear_error(encache_config *cfg) {
  encache__free(cfg->errmsg);
  cfg->errmsg = NULL;
}

const char *encache_config_errmsg(const encache_config *cfg) {
  return cfg != NULL && cfg->errmsg != NULL ? cfg->errmsg : "";
}

/* ---------------------------------------------------------------- sizes */

int encache_parse_size(const char *text, uint64_t *out) {
  static const struct {
    const char *unit;
    unsigned shift;
  } units[] = {{"b", 0},    {"kb", 10},  {"kib", 10}, {"k", 10},
               {"mb", 20},  {"mib", 20}, {"m", 20},   {"gb", 30},
               {"gib", 30}, {"g", 30},   {"tb", 40},  {"tib", 40},
               {"t", 40}};
  if (text == NULL || out == NULL)
    return ENCACHE_EINVAL;
  const char *p = text;
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p < '0' || *p > '9')
    return ENCACHE_EINVAL;
  uint64_t n = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      return ENCACHE_ETOOLARGE;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  while (*p == ' ' || *p == '\t')
    p++;
  const char *end = p + strlen(p);
  while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
    end--;
  size_t ulen = (size_t)(end - p);
  unsigned shift = 0;
  if (ulen > 0) {
    size_t i;
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
      if (strlen(units[i].unit) == ulen &&
          strncasecmp(p, units[i].unit, ulen) == 0)
        break;
    if (i == sizeof(units) / sizeof(units[0]))
      return ENCACHE_EINVAL;
    shift = units[i].shift;
  }
  if (shift > 0 && n > (UINT64_MAX >> shift))
    return ENCACHE_ETOOLARGE;
  *out = n << shift;
  return 0;
}

/* --------------------------------------------------------------- values */

static void value_clear(value *v) {
  encache__free(v->s);
  encache__free(v->text);
  memset(v, 0, sizeof(*v));
}

static const char *json_kind(const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_OBJECT:
    return "an object";
  case JSON_ARRAY:
    return "an array";
  case JSON_STRING:
    return "a string";
  case JSON_INTEGER:
    return "an integer";
  case JSON_REAL:
    return "a float";
  case JSON_TRUE:
  case JSON_FALSE:
    return "a boolean";
  case JSON_NULL:
    return "null";
  }
  return "a value";
}

/* The input value as short JSON text, for messages. */
static void json_brief(const json_t *j, char *buf, size_t size) {
  char *s = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
  if (s == NULL) {
    snprintf(buf, size, "%s", json_kind(j));
    return;
  }
  if (strlen(s) > 60)
    snprintf(buf, size, "%.57s...", s);
  else
    snprintf(buf, size, "%s", s);
  free(s);
}

static int enum_has(const char *choices, const char *s) {
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

/* Renders v as JSON text into v->text.  Returns 0 or ENCACHE_ENOMEM. */
static int value_render(const opt_def *o, value *v) {
  encache__free(v->text);
  v->text = NULL;
  if (!v->set) {
    v->text = encache__strdup("null");
  } else {
    switch (o->type) {
    case T_BOOL:
      v->text = encache__strdup(v->b ? "true" : "false");
      break;
    case T_POSINT:
    case T_UINT:
    case T_SIZE:
      v->text = encache__asprintf("%" PRIu64, v->u);
      break;
    case T_NUMBER:
      v->text = encache__asprintf("%.17g", v->d);
      break;
    case T_STRING:
    case T_ENUM: {
      json_t *js = json_string(v->s);
      char *s = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
      json_decref(js);
      if (s != NULL) {
        v->text = encache__strdup(s);
        free(s);
      }
      break;
    }
    }
  }
  return v->text == NULL ? ENCACHE_ENOMEM : 0;
}

/* Sets v from the option's default text. */
static int value_default(const opt_def *o, value *v) {
  memset(v, 0, sizeof(*v));
  if (o->def != NULL) {
    v->set = 1;
    switch (o->type) {
    case T_BOOL:
      v->b = strcmp(o->def, "true") == 0;
      break;
    case T_POSINT:
    case T_UINT:
    case T_SIZE:
      v->u = strtoull(o->def, NULL, 10);
      break;
    case T_NUMBER:
      v->d = strtod(o->def, NULL);
      break;
    case T_STRING:
    case T_ENUM:
      if ((v->s = encache__strdup(o->def)) == NULL)
        return ENCACHE_ENOMEM;
      break;
    }
  }
  return value_render(o, v);
}

/* Sets v from JSON j for option o, or fails naming the option. */
static int value_from_json(encache_config *cfg, const opt_def *o,
                           const json_t *j, value *v) {
  char got[80];
  const char *sec = section_names[o->sec];
  memset(v, 0, sizeof(*v));
  v->given = 1;
  v->set = 1;
  json_brief(j, got, sizeof(got));

  switch (o->type) {
  case T_BOOL:
    if (!json_is_boolean(j))
      return fail(cfg, ENCACHE_ECONFIG,
                  "%s.%s: must be a boolean (true or false), got %s %s", sec,
                  o->name, json_kind(j), got);
    v->b = json_is_true(j);
    break;
  case T_STRING:
  case T_ENUM:
    if (!json_is_string(j))
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: must be a string, got %s %s",
                  sec, o->name, json_kind(j), got);
    if (o->type == T_ENUM && !enum_has(o->choices, json_string_value(j)))
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: must be one of %s, got %s",
                  sec, o->name, o->choices, got);
    if ((v->s = encache__strdup(json_string_value(j))) == NULL)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
    break;
  case T_POSINT:
  case T_UINT:
    if (!json_is_integer(j) || json_integer_value(j) < 0 ||
        (o->type == T_POSINT && json_integer_value(j) == 0))
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: must be a %s integer, got %s",
                  sec, o->name,
                  o->type == T_POSINT ? "positive" : "non-negative", got);
    v->u = (uint64_t)json_integer_value(j);
    break;
  case T_NUMBER:
    if (!json_is_number(j) || json_number_value(j) < 0 ||
        !isfinite(json_number_value(j)))
      return fail(cfg, ENCACHE_ECONFIG,
                  "%s.%s: must be a non-negative number, got %s", sec,
                  o->name, got);
    v->d = json_number_value(j);
    break;
  case T_SIZE:
    if (json_is_integer(j) && json_integer_value(j) >= 0) {
      v->u = (uint64_t)json_integer_value(j);
    } else if (json_is_string(j)) {
      int rc = encache_parse_size(json_string_value(j), &v->u);
      if (rc < 0)
        return fail(cfg, ENCACHE_ECONFIG,
                    "%s.%s: %s size %s (use bytes, or a number with B, KB, "
                    "MB, GB, TB, KiB, MiB, GiB or TiB)",
                    sec, o->name,
                    rc == ENCACHE_ETOOLARGE ? "too large a" : "not a", got);
    } else {
      return fail(cfg, ENCACHE_ECONFIG,
                  "%s.%s: must be a size (a non-negative integer of bytes or "
                  "a string such as \"4GB\"), got %s",
                  sec, o->name, got);
    }
    break;
  }
  if (value_render(o, v) < 0)
    return fail(cfg, ENCACHE_ENOMEM, "out of memory");
  return 0;
}

static int find_opt(enum section sec, const char *name) {
  for (int i = 0; i < NOPTS; i++)
    if (opts[i].sec == sec && strcmp(opts[i].name, name) == 0)
      return i;
  return -1;
}

static int find_opt_any(const char *name) {
  for (int i = 0; i < NOPTS; i++)
    if (strcmp(opts[i].name, name) == 0)
      return i;
  return -1;
}

/* --------------------------------------------------------------- handle */

static void unknown_clear(encache_config *cfg, enum section sec) {
  for (int i = 0; i < cfg->nunknown[sec]; i++)
    encache__free(cfg->unknown[sec][i]);
  encache__free(cfg->unknown[sec]);
  cfg->unknown[sec] = NULL;
  cfg->nunknown[sec] = 0;
}

void encache_config_free(encache_config *cfg) {
  if (cfg == NULL)
    return;
  for (int i = 0; i < NOPTS; i++)
    value_clear(&cfg->vals[i]);
  for (int s = 0; s < SEC_COUNT; s++)
    unknown_clear(cfg, (enum section)s);
  encache__free(cfg->errmsg);
  encache__free(cfg);
}

int encache_config_new(encache_config **out) {
  if (out == NULL)
    return ENCACHE_EINVAL;
  *out = NULL;
  encache_config *cfg = encache__calloc(1, sizeof(*cfg));
  if (cfg == NULL)
    return ENCACHE_ENOMEM;
  for (int i = 0; i < NOPTS; i++) {
    if (value_default(&opts[i], &cfg->vals[i]) < 0) {
      encache_config_free(cfg);
      return ENCACHE_ENOMEM;
    }
  }
  *out = cfg;
  return 0;
}

/* Parse state for one load: the scratch values of every option (only the
 * loaded sections' entries are used) and the unknown names found. */
typedef struct scratch {
  value vals[NOPTS];
  char **unknown[SEC_COUNT];
  int nunknown[SEC_COUNT];
} scratch;

static void scratch_free(scratch *s) {
  for (int i = 0; i < NOPTS; i++)
    value_clear(&s->vals[i]);
  for (int k = 0; k < SEC_COUNT; k++) {
    for (int i = 0; i < s->nunknown[k]; i++)
      encache__free(s->unknown[k][i]);
    encache__free(s->unknown[k]);
  }
}

static int add_unknown(scratch *s, enum section sec, const char *name) {
  char **u = encache__realloc(s->unknown[sec],
                              sizeof(char *) * (size_t)(s->nunknown[sec] + 1));
  if (u == NULL)
    return ENCACHE_ENOMEM;
  s->unknown[sec] = u;
  u[s->nunknown[sec]] = encache__asprintf("%s.%s", section_names[sec], name);
  if (u[s->nunknown[sec]] == NULL)
    return ENCACHE_ENOMEM;
  s->nunknown[sec]++;
  return 0;
}

/* Reads the members of object `obj` as section `sec` into s.  Members named
 * in `skip` (may be NULL) are handled by the caller. */
static int load_section(encache_config *cfg, scratch *s, enum section sec,
                        const json_t *obj, const char *skip) {
  const char *name;
  json_t *j;
  for (int i = 0; i < NOPTS; i++) {
    if (opts[i].sec != sec)
      continue;
    if (value_default(&opts[i], &s->vals[i]) < 0)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
  }
  json_object_foreach((json_t *)obj, name, j) {
    if (skip != NULL && strcmp(name, skip) == 0)
      continue;
    int i = find_opt(sec, name);
    if (i < 0) {
      if (add_unknown(s, sec, name) < 0)
        return fail(cfg, ENCACHE_ENOMEM, "out of memory");
      continue;
    }
    value_clear(&s->vals[i]);
    /* A null member of an option without a default leaves it unset, as
     * Python's dict.get would in vLLM. */
    if (json_is_null(j) && opts[i].def == NULL && !opts[i].required) {
      if (value_default(&opts[i], &s->vals[i]) < 0)
        return fail(cfg, ENCACHE_ENOMEM, "out of memory");
      s->vals[i].given = 1;
      continue;
    }
    int rc = value_from_json(cfg, &opts[i], j, &s->vals[i]);
    if (rc < 0)
      return rc;
  }
  for (int i = 0; i < NOPTS; i++)
    if (opts[i].sec == sec && opts[i].required && !s->vals[i].set)
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: required, but missing",
                  section_names[sec], opts[i].name);
  return 0;
}

/* Moves the scratch values and unknowns of section `sec` into cfg. */
static void commit_section(encache_config *cfg, scratch *s, enum section sec) {
  for (int i = 0; i < NOPTS; i++) {
    if (opts[i].sec != sec)
      continue;
    value_clear(&cfg->vals[i]);
    cfg->vals[i] = s->vals[i];
    memset(&s->vals[i], 0, sizeof(s->vals[i]));
  }
  unknown_clear(cfg, sec);
  cfg->unknown[sec] = s->unknown[sec];
  cfg->nunknown[sec] = s->nunknown[sec];
  s->unknown[sec] = NULL;
  s->nunknown[sec] = 0;
}

/* Parses json[0..len) as one JSON object, or fails with line and column. */
static json_t *parse_object(encache_config *cfg, const char *json, size_t len,
                            const char *what, int *rc) {
  json_error_t err;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
  if (root == NULL) {
    *rc = json_error_code(&err) == json_error_out_of_memory
              ? fail(cfg, ENCACHE_ENOMEM, "%s: out of memory", what)
              : fail(cfg, ENCACHE_EJSON, "%s: malformed JSON at line %d, "
                                         "column %d: %s",
                     what, err.line, err.column, err.text);
    return NULL;
  }
  if (!json_is_object(root)) {
    char got[80];
    json_brief(root, got, sizeof(got));
    *rc = fail(cfg, ENCACHE_ECONFIG, "%s: must be a JSON object, got %s %s",
               what, json_kind(root), got);
    json_decref(root);
    return NULL;
  }
  return root;
}

int encache_config_load_ec(encache_config *cfg, const char *json, size_t len) {
  int rc = 0;
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if (json == NULL)
    return fail(cfg, ENCACHE_EINVAL, "ec_transfer_config: no JSON given");
  json_t *root = parse_object(cfg, json, len, "ec_transfer_config", &rc);
  if (root == NULL)
    return rc;

  scratch s;
  memset(&s, 0, sizeof(s));
  static const char extra_name[] = "ec_connector_extra_config";
  json_t *extra = json_object_get(root, extra_name);
  if (extra != NULL && !json_is_object(extra)) {
    char got[80];
    json_brief(extra, got, sizeof(got));
    rc = fail(cfg, ENCACHE_ECONFIG,
              "ec_transfer_config.%s: must be an object, got %s %s",
              extra_name, json_kind(extra), got);
    goto out;
  }
  if ((rc = load_section(cfg, &s, SEC_EC, root, extra_name)) < 0)
    goto out;
  json_t *empty = extra != NULL ? NULL : json_object();
  rc = load_section(cfg, &s, SEC_EXTRA, extra != NULL ? extra : empty, NULL);
  json_decref(empty);
  if (rc < 0)
    goto out;
  commit_section(cfg, &s, SEC_EC);
  commit_section(cfg, &s, SEC_EXTRA);
  clear_error(cfg);
out:
  scratch_free(&s);
  json_decref(root);
  return rc;
}

int encache_config_load_mooncake(encache_config *cfg, const char *json,
                                 size_t len, const char *origin) {
  int rc = 0;
  char what[512];
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  snprintf(what, sizeof(what), "mooncake config%s%s", origin ? " " : "",
           origin ? origin : "");
  if (json == NULL)
    return fail(cfg, ENCACHE_EINVAL, "%s: no JSON given", what);
  json_t *root = parse_object(cfg, json, len, what, &rc);
  if (root == NULL)
    return rc;

  scratch s;
  memset(&s, 0, sizeof(s));
  if ((rc = load_section(cfg, &s, SEC_MOONCAKE, root, NULL)) < 0)
    goto out;

  /* A RAM Store is required: offloading objects to SSD would let a read
   * complete from a tier encache cannot reason about. */
  const value *off = &s.vals[find_opt(SEC_MOONCAKE, "enable_offload")];
  if (off->b) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.enable_offload: must not be true: encache requires a "
              "RAM Store");
    goto out;
  }
  /* In standalone-store mode the encoder contributes no memory to the
   * pool; the default segment size would silently contribute 3.125 GiB. */
  const value *mode = &s.vals[find_opt(SEC_MOONCAKE, "mode")];
  const value *seg = &s.vals[find_opt(SEC_MOONCAKE, "global_segment_size")];
  if (mode->set && strcmp(mode->s, "standalone-store") == 0 &&
      (!seg->given || seg->u != 0)) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.global_segment_size: mode \"standalone-store\" needs "
              "an explicit global_segment_size of 0, got %s",
              seg->given ? seg->text : "none (default 3355443200)");
    goto out;
  }
  commit_section(cfg, &s, SEC_MOONCAKE);
  cfg->mooncake_loaded = 1;
  clear_error(cfg);
out:
  scratch_free(&s);
  json_decref(root);
  return rc;
}

int encache_config_load_mooncake_file(encache_config *cfg, const char *path) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if (path == NULL) {
    path = getenv("MOONCAKE_CONFIG_PATH");
    if (path == NULL || path[0] == '\0')
      return fail(cfg, ENCACHE_ECONFIG,
                  "MOONCAKE_CONFIG_PATH: not set (it must name the Mooncake "
                  "client JSON file)");
  }
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    return fail(cfg, -e, "mooncake config %s: %s", path, strerror(e));
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len == cap) {
      if (cap >= (size_t)64 << 20) {
        rc = fail(cfg, ENCACHE_ECONFIG,
                  "mooncake config %s: larger than 64 MiB", path);
        break;
      }
      cap = cap ? cap * 2 : 4096;
      char *nb = encache__realloc(buf, cap);
      if (nb == NULL) {
        rc = fail(cfg, ENCACHE_ENOMEM, "out of memory");
        break;
      }
      buf = nb;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) {
      if (ferror(f))
        rc = fail(cfg, ENCACHE_EIO, "mooncake config %s: read error", path);
      break;
    }
  }
  fclose(f);
  if (rc == 0)
    rc = encache_config_load_mooncake(cfg, buf, len, path);
  encache__free(buf);
  return rc;
}

/* ----------------------------------------------------------- deployment */

void encache_deployment_defaults(encache_deployment *d) {
  if (d == NULL)
    return;
  d->mm_processor_cache_gb = 4;
  d->tensor_parallel_size = 1;
  d->pipeline_parallel_size = 1;
  d->data_parallel_size = 1;
  d->dynamic_lora = 0;
}

int encache_config_check_deployment(encache_config *cfg,
                                    const encache_deployment *d) {
  encache_deployment defaults;
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if (d == NULL) {
    encache_deployment_defaults(&defaults);
    d = &defaults;
  }
  clear_error(cfg);
  if (!cfg->vals[find_opt(SEC_EXTRA, "cross_encoder_cache")].b)
    return 0;
  if (!(d->mm_processor_cache_gb > 0))
    return fail(cfg, ENCACHE_ECONFIG,
                "mm_processor_cache_gb: is %g, so identifiers would not be "
                "stable content hashes; cross_encoder_cache needs the "
                "processor cache on",
                d->mm_processor_cache_gb);
  static const struct {
    const char *name;
    size_t off;
  } sizes[] = {
      {"tensor_parallel_size", offsetof(encache_deployment, tensor_parallel_size)},
      {"pipeline_parallel_size", offsetof(encache_deployment, pipeline_parallel_size)},
      {"data_parallel_size", offsetof(encache_deployment, data_parallel_size)},
  };
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    int v = *(const int *)((const char *)d + sizes[i].off);
    if (v != 1)
      return fail(cfg, ENCACHE_ECONFIG,
                  "%s: is %d; cross_encoder_cache supports only 1",
                  sizes[i].name, v);
  }
  if (d->dynamic_lora)
    return fail(cfg, ENCACHE_ECONFIG,
                "dynamic_lora: is on; cross_encoder_cache does not support "
                "dynamic LoRA (outputs would depend on the adapter)");
  return 0;
}

/* -------------------------------------------------------------- listing */

static int visible(const encache_config *cfg, int i) {
  return opts[i].sec != SEC_MOONCAKE || cfg->mooncake_loaded;
}

int encache_config_item_count(const encache_config *cfg) {
  int n = 0;
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  for (int i = 0; i < NOPTS; i++)
    n += visible(cfg, i);
  return n;
}

int encache_config_item_at(const encache_config *cfg, int idx,
                           encache_config_item *item) {
  if (cfg == NULL || item == NULL || idx < 0)
    return ENCACHE_EINVAL;
  for (int i = 0; i < NOPTS; i++) {
    if (!visible(cfg, i))
      continue;
    if (idx-- == 0) {
      item->section = section_names[opts[i].sec];
      item->name = opts[i].name;
      item->value = cfg->vals[i].text;
      item->is_default = !cfg->vals[i].given;
      return 0;
    }
  }
  return ENCACHE_EINVAL;
}

int encache_config_unknown_count(const encache_config *cfg) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  int n = 0;
  for (int s = 0; s < SEC_COUNT; s++)
    n += cfg->nunknown[s];
  return n;
}

const char *encache_config_unknown_at(const encache_config *cfg, int i) {
  if (cfg == NULL || i < 0)
    return NULL;
  for (int s = 0; s < SEC_COUNT; s++) {
    if (i < cfg->nunknown[s])
      return cfg->unknown[s][i];
    i -= cfg->nunknown[s];
  }
  return NULL;
}

/* --------------------------------------------------------------- access */

static const value *get_typed(const encache_config *cfg, const char *name,
                              int t1, int t2, int t3, int *rc) {
  if (cfg == NULL || name == NULL) {
    *rc = ENCACHE_EINVAL;
    return NULL;
  }
  int i = find_opt_any(name);
  if (i < 0) {
    *rc = ENCACHE_ENOENT;
    return NULL;
  }
  int t = (int)opts[i].type;
  if (t != t1 && t != t2 && t != t3) {
    *rc = ENCACHE_EINVAL;
    return NULL;
  }
  *rc = 0;
  return &cfg->vals[i];
}

int encache_config_get_bool(const encache_config *cfg, const char *name,
                            int *out) {
  int rc;
  const value *v = get_typed(cfg, name, T_BOOL, T_BOOL, T_BOOL, &rc);
  if (v != NULL && out != NULL)
    *out = v->b;
  return rc;
}

int encache_config_get_u64(const encache_config *cfg, const char *name,
                           uint64_t *out) {
  int rc;
  const value *v = get_typed(cfg, name, T_POSINT, T_UINT, T_SIZE, &rc);
  if (v != NULL && out != NULL)
    *out = v->u;
  return rc;
}

int encache_config_get_string(const encache_config *cfg, const char *name,
                              const char **out) {
  int rc;
  const value *v = get_typed(cfg, name, T_STRING, T_ENUM, T_ENUM, &rc);
  if (v != NULL && out != NULL)
    *out = v->set ? v->s : NULL;
  return rc;
}
