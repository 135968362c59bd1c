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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

enum section { SEC_EC, SEC_EXTRA, SEC_MOONCAKE, SEC_COUNT };

static const char *const section_names[SEC_COUNT] = {
    "ec_transfer_config", "ec_connector_extra_config", "mooncake"};

enum opt_type {
  T_BOOL,    /* JSON true/false only */
  T_STRING,  /* JSON string */
  T_POSINT,  /* integer > 0; floats, strings and booleans refused */
  T_UINT,    /* integer >= 0 */
  T_NUMBER,  /* any JSON number >= 0 */
  T_SIZE,    /* a size as vLLM's Mooncake config reads it (vllm_size) */
  T_ENUM,    /* a string among `choices` */
  T_PYSTR,   /* a key field: string, null, number or boolean, kept as
                Python's str() writes it (vLLM: str(extra.get(...))) */
  T_TRUTHY,  /* any JSON value, taken as Python's bool() takes it */
  T_TENANT,  /* Mooncake tenant_id: string or null, normalised as vLLM */
  T_DERIVED  /* not read from the JSON: computed at load (a member of
                that name is ignored, with a warning, as vLLM ignores it) */
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
  {SEC_EXTRA, "embedding_cache_prefix", T_PYSTR, "", NULL, 0},
  {SEC_EXTRA, "embedding_model_identity", T_PYSTR, NULL, NULL, 0},
  {SEC_EXTRA, "store_max_pending_items", T_POSINT, "32", NULL, 0},
  {SEC_EXTRA, "store_max_pending_bytes", T_POSINT, "2147483648", NULL, 0},
  {SEC_EXTRA, "store_read_buffer_bytes", T_POSINT, "134217728", NULL, 0},
  /* Mooncake Store client, read as vLLM's vllm/distributed/mooncake_store.py
   * reads it (defaults, sizes, refusals; docs/compatibility.md). */
  {SEC_MOONCAKE, "local_hostname", T_DERIVED, NULL, NULL, 0},
  {SEC_MOONCAKE, "metadata_server", T_STRING, NULL, NULL, 1},
  {SEC_MOONCAKE, "master_server_address", T_STRING, NULL, NULL, 1},
  {SEC_MOONCAKE, "protocol", T_STRING, "rdma", NULL, 0},
  {SEC_MOONCAKE, "device_name", T_STRING, "", NULL, 0},
  {SEC_MOONCAKE, "mode", T_ENUM, "embedded", "embedded|standalone-store", 0},
  {SEC_MOONCAKE, "global_segment_size", T_SIZE, "4294967296", NULL, 0},
  {SEC_MOONCAKE, "local_buffer_size", T_SIZE, "4294967296", NULL, 0},
  {SEC_MOONCAKE, "enable_offload", T_TRUTHY, "false", NULL, 0},
  {SEC_MOONCAKE, "tenant_id", T_TENANT, "default", NULL, 0},
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
  char *warn; /* a warning about this value, or NULL (owned) */
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
  encache__free(v->warn);
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

/* -------------------------------------------------------- Python text */

/* Python's str.isspace() for ASCII, which is what str.strip() removes
 * (other Unicode spaces are not stripped here). */
static int py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v' || (c >= 0x1c && c <= 0x1f);
}

/*
 * Writes d as Python's str() (= repr()) writes a float: the shortest
 * digits that read back to d; positional notation when the decimal point
 * falls within 16 digits of the first, else d.ddde+XX; "1.0", "1e+16",
 * "0.0001", "1e-05", "-0.0".  JSON has no NaN or infinity.
 */
int encache__py_float_str(double d, char *buf, size_t size) {
  char tmp[40], digits[24];
  int prec;
  if (!isfinite(d) || size < 32)
    return ENCACHE_EINVAL;
  for (prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, d);
    if (strtod(tmp, NULL) == d)
      break;
  }
  const char *p = tmp;
  int neg = *p == '-';
  if (neg)
    p++;
  int nd = 0;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9')
      digits[nd++] = *p;
  int exp10 = *p == 'e' ? atoi(p + 1) : 0;
  while (nd > 1 && digits[nd - 1] == '0')
    nd--;
  digits[nd] = '\0';
  int decpt = d == 0 ? 1 : exp10 + 1;
  size_t w = 0;
  if (neg)
    buf[w++] = '-';
  if (decpt <= -4 || decpt > 16) {
    buf[w++] = digits[0];
    if (nd > 1) {
      buf[w++] = '.';
      memcpy(buf + w, digits + 1, (size_t)nd - 1);
      w += (size_t)nd - 1;
    }
    snprintf(buf + w, size - w, "e%c%02d", decpt - 1 < 0 ? '-' : '+',
             abs(decpt - 1));
  } else if (decpt <= 0) {
    buf[w++] = '0';
    buf[w++] = '.';
    for (int i = 0; i < -decpt; i++)
      buf[w++] = '0';
    memcpy(buf + w, digits, (size_t)nd);
    buf[w + (size_t)nd] = '\0';
  } else if (decpt >= nd) {
    memcpy(buf + w, digits, (size_t)nd);
    w += (size_t)nd;
    for (int i = nd; i < decpt; i++)
      buf[w++] = '0';
    memcpy(buf + w, ".0", 3);
  } else {
    memcpy(buf + w, digits, (size_t)decpt);
    w += (size_t)decpt;
    buf[w++] = '.';
    memcpy(buf + w, digits + decpt, (size_t)(nd - decpt));
    buf[w + (size_t)(nd - decpt)] = '\0';
  }
  return 0;
}

/*
 * A size as vLLM's _parse_size (vllm/distributed/mooncake_store.py) reads
 * it: an integer as is; a float truncated (int()); a string stripped and
 * lowered, then NUMBER [UNIT] with NUMBER made of digits and dots (read as
 * a float, so "1.5GB" is int(1.5 * 2**30)) and UNIT one of gb, mb, kb, b
 * (powers of 1024).  Returns 0, or writes why into `why`: -1 when vLLM
 * refuses it too, -2 when only encache does (negative, boolean, >= 2**64).
 */
static int vllm_size(const json_t *j, uint64_t *out, char *why, size_t wsize) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"gb", 1073741824.0}, {"mb", 1048576.0}, {"kb", 1024.0},
               {"b", 1.0}};
  double num, mult = 1;
  if (json_is_integer(j)) {
    if (json_integer_value(j) < 0) {
      snprintf(why, wsize, "a size must not be negative");
      return -2;
    }
    *out = (uint64_t)json_integer_value(j);
    return 0;
  }
  if (json_is_boolean(j)) {
    snprintf(why, wsize, "a boolean is not a size (vLLM would take it as %d "
             "bytes)", json_is_true(j) ? 1 : 0);
    return -2;
  }
  if (json_is_real(j)) {
    num = json_real_value(j);
  } else if (json_is_string(j)) {
    const char *t = json_string_value(j), *e = t + strlen(t);
    while (t < e && py_space(*t))
      t++;
    while (e > t && py_space(e[-1]))
      e--;
    if (t == e) {
      snprintf(why, wsize, "an empty size (vLLM refuses it: \"Size cannot be "
               "empty\")");
      return -1;
    }
    const char *q = t;
    int ndig = 0, ndot = 0;
    for (; q < e && ((*q >= '0' && *q <= '9') || *q == '.'); q++)
      *q == '.' ? ndot++ : ndig++;
    const char *nend = q;
    while (q < e && py_space(*q))
      q++;
    size_t ulen = (size_t)(e - q);
    int known = ulen == 0;
    for (size_t i = 0; !known && i < sizeof(units) / sizeof(units[0]); i++)
      if (strlen(units[i].unit) == ulen &&
          strncasecmp(q, units[i].unit, ulen) == 0) {
        mult = units[i].mult;
        known = 1;
      }
    if (nend == t || !known) {
      snprintf(why, wsize, "not a size vLLM accepts (a number with an "
               "optional unit B, KB, MB or GB, powers of 1024; vLLM refuses "
               "anything else, GiB and TB included)");
      return -1;
    }
    if (ndig == 0 || ndot > 1) {
      snprintf(why, wsize, "not a number vLLM accepts (Python's float() "
               "refuses it)");
      return -1;
    }
    char numtext[64];
    if ((size_t)(nend - t) >= sizeof(numtext)) {
      snprintf(why, wsize, "a number too long");
      return -2;
    }
    memcpy(numtext, t, (size_t)(nend - t));
    numtext[nend - t] = '\0';
    num = strtod(numtext, NULL);
  } else {
    snprintf(why, wsize, "not a size (vLLM refuses %s: \"Unsupported type "
             "for size\")", json_kind(j));
    return -1;
  }
  double v = num * mult; /* as Python: float * int, then int() */
  if (!(v > -1.0)) {
    snprintf(why, wsize, "a size must not be negative");
    return -2;
  }
  if (v >= 18446744073709551616.0) {
    snprintf(why, wsize, "too large a size (2**64 bytes or more)");
    return -2;
  }
  *out = (uint64_t)v;
  return 0;
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
    case T_TRUTHY:
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
    case T_ENUM:
    case T_PYSTR:
    case T_TENANT:
    case T_DERIVED: {
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
    case T_TRUTHY:
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
    case T_PYSTR:
    case T_TENANT:
    case T_DERIVED:
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
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: must be one of %s, got %s%s",
                  sec, o->name, o->choices, got,
                  o->sec == SEC_MOONCAKE ? " (vLLM refuses it too)" : "");
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
  case T_SIZE: {
    char why[256];
    int r = vllm_size(j, &v->u, why, sizeof(why));
    if (r < 0)
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: %s: %s%s", sec, o->name, got,
                  why,
                  r == -1 ? "; vLLM would refuse this configuration too"
                          : " (encache refuses it before Mooncake does)");
    break;
  }
  case T_TRUTHY:
    /* Python's bool(): null, false, 0, 0.0, "", [] and {} are false. */
    switch (json_typeof(j)) {
    case JSON_TRUE: v->b = 1; break;
    case JSON_FALSE: case JSON_NULL: v->b = 0; break;
    case JSON_INTEGER: v->b = json_integer_value(j) != 0; break;
    case JSON_REAL: v->b = json_real_value(j) != 0; break;
    case JSON_STRING: v->b = json_string_length(j) != 0; break;
    case JSON_ARRAY: v->b = json_array_size(j) != 0; break;
    case JSON_OBJECT: v->b = json_object_size(j) != 0; break;
    }
    break;
  case T_TENANT: {
    /* vLLM's _normalize_tenant_id: null or blank is "default"; a string
     * is stripped; anything else is a TypeError. */
    const char *t = "default";
    size_t n = 7;
    if (json_is_string(j)) {
      const char *a = json_string_value(j), *e = a + strlen(a);
      while (a < e && py_space(*a))
        a++;
      while (e > a && py_space(e[-1]))
        e--;
      if (e > a) {
        t = a;
        n = (size_t)(e - a);
      }
    } else if (!json_is_null(j)) {
      return fail(cfg, ENCACHE_ECONFIG, "%s.%s: must be a string or null, got "
                  "%s %s (vLLM refuses it too)", sec, o->name, json_kind(j),
                  got);
    }
    if ((v->s = encache__malloc(n + 1)) == NULL)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
    memcpy(v->s, t, n);
    v->s[n] = '\0';
    break;
  }
  case T_PYSTR: {
    /* vLLM builds the key field with str(extra.get(name, default)): the
     * JSON value is written as Python writes it. */
    char num[64];
    const char *py = NULL, *odd = NULL;
    switch (json_typeof(j)) {
    case JSON_STRING:
      py = json_string_value(j);
      if (py[0] == '\0' && strcmp(o->name, "embedding_model_identity") == 0)
        odd = "an empty string";
      break;
    case JSON_NULL: py = "None"; odd = "None in Python"; break;
    case JSON_TRUE: py = "True"; odd = "a boolean"; break;
    case JSON_FALSE: py = "False"; odd = "a boolean"; break;
    case JSON_INTEGER:
      snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(j));
      py = num;
      odd = "an integer";
      break;
    case JSON_REAL:
      if (encache__py_float_str(json_real_value(j), num, sizeof(num)) < 0)
        return fail(cfg, ENCACHE_ECONFIG, "%s.%s: %s cannot be written as "
                    "Python writes it", sec, o->name, got);
      py = num;
      odd = "a float";
      break;
    default:
      return fail(cfg, ENCACHE_ECONFIG,
                  "%s.%s: must be a string, got %s %s (vLLM would write "
                  "Python's str() of it into every key, which no one "
                  "intends)", sec, o->name, json_kind(j), got);
    }
    if ((v->s = encache__strdup(py)) == NULL)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
    if (odd != NULL) {
      int model = strcmp(o->name, "embedding_model_identity") == 0;
      v->warn = encache__asprintf(
          "%s.%s: %s (%s) gives the key field %s%s%s, as vLLM writes it "
          "(Python's str()); give a string if that is not what you mean",
          sec, o->name, got, odd, model ? "model:" : "", py,
          model ? "" : "@ (a prefix)");
      if (v->warn == NULL)
        return fail(cfg, ENCACHE_ENOMEM, "out of memory");
    }
    break;
  }
  case T_DERIVED:
    break; /* never read from the JSON (load_section skips it) */
  }
  if (value_render(o, v) < 0)
    return fail(cfg, ENCACHE_ENOMEM, "out of memory");
  if ((o->type == T_PYSTR && !json_is_string(j)) ||
      (o->type == T_TRUTHY && !json_is_boolean(j))) {
    /* Shown as given, not as read. */
    char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    if (t == NULL)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
    encache__free(v->text);
    v->text = encache__strdup(t);
    free(t);
    if (v->text == NULL)
      return fail(cfg, ENCACHE_ENOMEM, "out of memory");
  }
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
    if (opts[i].type == T_DERIVED) {
      /* vLLM does not read it either: say so once. */
      encache__free(s->vals[i].warn);
      s->vals[i].warn = encache__asprintf(
          "%s.%s: ignored, as vLLM ignores it (the client's hostname is "
          "derived: see docs/configuration.md)", section_names[sec], name);
      if (s->vals[i].warn == NULL)
        return fail(cfg, ENCACHE_ENOMEM, "out of memory");
      continue;
    }
    value_clear(&s->vals[i]);
    /* A null member of an option without a default leaves it unset, as
     * Python's dict.get would in vLLM (a key field is str(None) there). */
    if (json_is_null(j) && opts[i].def == NULL && !opts[i].required &&
        opts[i].type != T_PYSTR) {
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
  /* vLLM's ECTransferConfig.__post_init__: a connector needs a role. */
  if (s.vals[find_opt(SEC_EC, "ec_connector")].set &&
      !s.vals[find_opt(SEC_EC, "ec_role")].set) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "ec_transfer_config.ec_role: required when ec_connector is set "
              "(one of ec_producer|ec_consumer|ec_both; vLLM refuses it too)");
    goto out;
  }
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

/* The address a UDP socket would send from to reach `addr` (nothing is
 * sent: connect() on a datagram socket only picks a route), or NULL. */
static char *outbound_address(int family, const void *addr, size_t alen) {
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return NULL;
  char text[INET6_ADDRSTRLEN] = "";
  struct sockaddr_storage local;
  socklen_t llen = sizeof(local);
  int ok = connect(fd, (const struct sockaddr *)addr, (socklen_t)alen) == 0 &&
           getsockname(fd, (struct sockaddr *)&local, &llen) == 0;
  close(fd);
  if (!ok)
    return NULL;
  const void *a = family == AF_INET
                      ? (const void *)&((struct sockaddr_in *)&local)->sin_addr
                      : (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr;
  if (inet_ntop(family, a, text, sizeof(text)) == NULL)
    return NULL;
  return encache__strdup(text);
}

/*
 * The local hostname a vLLM encoder gives Mooncake's setup(): vLLM does
 * not read local_hostname from the JSON; it takes
 * MOONCAKE_REQUESTER_LOCAL_HOSTNAME (stripped, when not blank), else
 * vllm.utils.network_utils.get_ip(): VLLM_HOST_IP when not empty, else the
 * source address of a UDP route to 8.8.8.8:80, else to
 * [2001:4860:4860::8888]:80, else "0.0.0.0".  Returns an allocation.
 */
char *encache__mooncake_local_hostname(void) {
  const char *o = getenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME");
  if (o != NULL) {
    const char *e = o + strlen(o);
    while (o < e && py_space(*o))
      o++;
    while (e > o && py_space(e[-1]))
      e--;
    if (e > o) {
      char *r = encache__malloc((size_t)(e - o) + 1);
      if (r != NULL) {
        memcpy(r, o, (size_t)(e - o));
        r[e - o] = '\0';
      }
      return r;
    }
  }
  const char *ip = getenv("VLLM_HOST_IP");
  if (ip != NULL && ip[0] != '\0')
    return encache__strdup(ip);
  struct sockaddr_in v4;
  memset(&v4, 0, sizeof(v4));
  v4.sin_family = AF_INET;
  v4.sin_port = htons(80);
  inet_pton(AF_INET, "8.8.8.8", &v4.sin_addr);
  char *r = outbound_address(AF_INET, &v4, sizeof(v4));
  if (r != NULL)
    return r;
  struct sockaddr_in6 v6;
  memset(&v6, 0, sizeof(v6));
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(80);
  inet_pton(AF_INET6, "2001:4860:4860::8888", &v6.sin6_addr);
  r = outbound_address(AF_INET6, &v6, sizeof(v6));
  return r != NULL ? r : encache__strdup("0.0.0.0");
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

  /* vLLM's MooncakeStoreConfig.__post_init__ refusals, then encache's. */
  const value *mode = &s.vals[find_opt(SEC_MOONCAKE, "mode")];
  const value *seg = &s.vals[find_opt(SEC_MOONCAKE, "global_segment_size")];
  const value *lbuf = &s.vals[find_opt(SEC_MOONCAKE, "local_buffer_size")];
  int standalone = strcmp(mode->s, "standalone-store") == 0;
  if (lbuf->u == 0) {
    rc = fail(cfg, ENCACHE_ECONFIG, "mooncake.local_buffer_size: must be > 0, "
              "got %s (vLLM refuses it too)", lbuf->text);
    goto out;
  }
  if (!standalone && seg->u == 0) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.global_segment_size: mode \"embedded\"%s needs a "
              "global_segment_size > 0, got 0 (vLLM refuses it too; a pure "
              "client is mode \"standalone-store\")",
              mode->given ? "" : " (the default mode)");
    goto out;
  }
  if (standalone && seg->u != 0) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.global_segment_size: mode \"standalone-store\" needs "
              "an explicit global_segment_size of 0, got %s (vLLM refuses it "
              "too)",
              seg->given ? seg->text : "none (default 4294967296)");
    goto out;
  }
  /* A RAM Store is required: offloading objects to SSD would let a read
   * complete from a tier encache cannot reason about (vLLM's embedding
   * client refuses it as well). */
  const value *off = &s.vals[find_opt(SEC_MOONCAKE, "enable_offload")];
  if (off->b) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.enable_offload: must not be true (got %s): encache "
              "requires a RAM Store, as vLLM's cross_encoder_cache does",
              off->text);
    goto out;
  }
  /* Mooncake's C ABI (store_c.h) setup takes no tenant: a client would
   * join the default tenant where vLLM joins this one. */
  const value *tenant = &s.vals[find_opt(SEC_MOONCAKE, "tenant_id")];
  if (strcmp(tenant->s, "default") != 0) {
    rc = fail(cfg, ENCACHE_ECONFIG,
              "mooncake.tenant_id: \"%s\" cannot be honoured: the Mooncake C "
              "ABI encache loads (store_c.h setup) takes no tenant, so encache "
              "would join the default tenant while vLLM joins \"%s\" (and "
              "they would share no objects); remove tenant_id or use the "
              "default tenant",
              tenant->s, tenant->s);
    goto out;
  }
  value *host = &s.vals[find_opt(SEC_MOONCAKE, "local_hostname")];
  encache__free(host->s);
  host->s = encache__mooncake_local_hostname();
  host->set = 1;
  if (host->s == NULL || value_render(&opts[find_opt(SEC_MOONCAKE,
                                                     "local_hostname")],
                                      host) < 0) {
    rc = fail(cfg, ENCACHE_ENOMEM, "out of memory");
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

#define M(t) (1u << (t))
static const value *get_typed(const encache_config *cfg, const char *name,
                              unsigned types, int *rc) {
  if (cfg == NULL || name == NULL) {
    *rc = ENCACHE_EINVAL;
    return NULL;
  }
  int i = find_opt_any(name);
  if (i < 0) {
    *rc = ENCACHE_ENOENT;
    return NULL;
  }
  if (!(types & M(opts[i].type))) {
    *rc = ENCACHE_EINVAL;
    return NULL;
  }
  *rc = 0;
  return &cfg->vals[i];
}

int encache_config_get_bool(const encache_config *cfg, const char *name,
                            int *out) {
  int rc;
  const value *v = get_typed(cfg, name, M(T_BOOL) | M(T_TRUTHY), &rc);
  if (v != NULL && out != NULL)
    *out = v->b;
  return rc;
}

int encache_config_get_u64(const encache_config *cfg, const char *name,
                           uint64_t *out) {
  int rc;
  const value *v = get_typed(cfg, name, M(T_POSINT) | M(T_UINT) | M(T_SIZE), &rc);
  if (v != NULL && out != NULL)
    *out = v->u;
  return rc;
}

int encache_config_get_string(const encache_config *cfg, const char *name,
                              const char **out) {
  int rc;
  const value *v = get_typed(cfg, name,
                   M(T_STRING) | M(T_ENUM) | M(T_PYSTR) | M(T_TENANT) | M(T_DERIVED),
                   &rc);
  if (v != NULL && out != NULL)
    *out = v->set ? v->s : NULL;
  return rc;
}

/* ------------------------------------------------------------- warnings */

int encache_config_warning_count(const encache_config *cfg) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  int n = 0;
  for (int i = 0; i < NOPTS; i++)
    n += visible(cfg, i) && cfg->vals[i].warn != NULL;
  return n;
}

const char *encache_config_warning_at(const encache_config *cfg, int idx) {
  if (cfg == NULL || idx < 0)
    return NULL;
  for (int i = 0; i < NOPTS; i++)
    if (visible(cfg, i) && cfg->vals[i].warn != NULL && idx-- == 0)
      return cfg->vals[i].warn;
  return NULL;
}

/* ------------------------------------------------------------ namespace */

int encache_config_namespace(const encache_config *cfg, const char *model,
                             const char *revision, const char *encoder_hash,
                             int dtype, char *buf, size_t size) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  const value *prefix = &cfg->vals[find_opt(SEC_EXTRA, "embedding_cache_prefix")];
  const value *ident = &cfg->vals[find_opt(SEC_EXTRA, "embedding_model_identity")];
  /* str(extra.get("embedding_model_identity", model)): the model path
   * only when the option is absent. */
  const char *m = ident->set ? ident->s : model;
  if (m == NULL || (!ident->set && m[0] == '\0'))
    return ENCACHE_EINVAL;
  encache_namespace_params p = {prefix->set ? prefix->s : NULL, m, revision,
                                encoder_hash, dtype};
  return encache_namespace(&p, buf, size);
}
