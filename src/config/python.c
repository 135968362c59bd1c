/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/python.c: what vLLM's Python does to a configuration value, so
 * that encache reads the JSON as a vLLM encoder does: str.strip(), str()
 * of a float and of a key field, _parse_size, _normalize_tenant_id.
 */
#include "config/python.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *encache__json_kind(const json_t *j) {
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

/* Python's str.isspace() for ASCII, which is what str.strip() removes
 * (other Unicode spaces are not stripped here). */
static int py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v' || (c >= 0x1c && c <= 0x1f);
}

void encache__py_strip(const char **a, const char **e) {
  while (*a < *e && py_space(**a))
    (*a)++;
  while (*e > *a && py_space((*e)[-1]))
    (*e)--;
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
 * (powers of 1024).  Returns 0, or writes why into `why`:
 * ENCACHE__PY_VLLM_REFUSES when vLLM refuses it too,
 * ENCACHE__PY_ONLY_ENCACHE when only encache does (negative, boolean,
 * >= 2**64).
 */
/* The string form of a size: "NUMBER [UNIT]" into num and mult. */
static int size_text(const char *t, double *num, double *mult, char *why,
                     size_t wsize) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {
      {"gb", 1073741824.0}, {"mb", 1048576.0}, {"kb", 1024.0}, {"b", 1.0}};
  const char *e = t + strlen(t);
  encache__py_strip(&t, &e);
  if (t == e) {
    snprintf(why, wsize,
             "an empty size (vLLM refuses it: \"Size cannot be "
             "empty\")");
    return ENCACHE__PY_VLLM_REFUSES;
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
  *mult = 1;
  for (size_t i = 0; !known && i < sizeof(units) / sizeof(units[0]); i++)
    if (strlen(units[i].unit) == ulen &&
        strncasecmp(q, units[i].unit, ulen) == 0) {
      *mult = units[i].mult;
      known = 1;
    }
  if (nend == t || !known) {
    snprintf(why, wsize,
             "not a size vLLM accepts (a number with an "
             "optional unit B, KB, MB or GB, powers of 1024; vLLM refuses "
             "anything else, GiB and TB included)");
    return ENCACHE__PY_VLLM_REFUSES;
  }
  if (ndig == 0 || ndot > 1) {
    snprintf(why, wsize,
             "not a number vLLM accepts (Python's float() "
             "refuses it)");
    return ENCACHE__PY_VLLM_REFUSES;
  }
  char numtext[64];
  if ((size_t)(nend - t) >= sizeof(numtext)) {
    snprintf(why, wsize, "a number too long");
    return ENCACHE__PY_ONLY_ENCACHE;
  }
  memcpy(numtext, t, (size_t)(nend - t));
  numtext[nend - t] = '\0';
  *num = strtod(numtext, NULL);
  return 0;
}

int encache__vllm_size(const json_t *j, uint64_t *out, char *why,
                       size_t wsize) {
  double num, mult = 1;
  if (json_is_integer(j)) {
    if (json_integer_value(j) < 0) {
      snprintf(why, wsize, "a size must not be negative");
      return ENCACHE__PY_ONLY_ENCACHE;
    }
    *out = (uint64_t)json_integer_value(j);
    return 0;
  }
  if (json_is_boolean(j)) {
    snprintf(why, wsize,
             "a boolean is not a size (vLLM would take it as %d "
             "bytes)",
             json_is_true(j) ? 1 : 0);
    return ENCACHE__PY_ONLY_ENCACHE;
  }
  if (json_is_real(j)) {
    num = json_real_value(j);
  } else if (json_is_string(j)) {
    int r = size_text(json_string_value(j), &num, &mult, why, wsize);
    if (r != 0)
      return r;
  } else {
    snprintf(why, wsize,
             "not a size (vLLM refuses %s: \"Unsupported type "
             "for size\")",
             encache__json_kind(j));
    return ENCACHE__PY_VLLM_REFUSES;
  }
  double v = num * mult; /* as Python: float * int, then int() */
  if (!(v > -1.0)) {
    snprintf(why, wsize, "a size must not be negative");
    return ENCACHE__PY_ONLY_ENCACHE;
  }
  if (v >= 18446744073709551616.0) {
    snprintf(why, wsize, "too large a size (2**64 bytes or more)");
    return ENCACHE__PY_ONLY_ENCACHE;
  }
  *out = (uint64_t)v;
  return 0;
}

/* vLLM's _normalize_tenant_id of a string. */
char *encache__tenant_normalize(const char *t) {
  const char *e = t + strlen(t);
  encache__py_strip(&t, &e);
  if (t == e) {
    t = "default";
    e = t + 7;
  }
  char *r = encache__malloc((size_t)(e - t) + 1);
  if (r != NULL) {
    memcpy(r, t, (size_t)(e - t));
    r[e - t] = '\0';
  }
  return r;
}

/* vLLM builds a key field with str(extra.get(name, default)): the JSON
 * value is written as Python writes it. */
int encache__py_str(const json_t *j, char *num, const char **py,
                    const char **odd) {
  *odd = NULL;
  switch (json_typeof(j)) {
  case JSON_STRING:
    *py = json_string_value(j);
    return 0;
  case JSON_NULL:
    *py = "None";
    *odd = "None in Python";
    return 0;
  case JSON_TRUE:
  case JSON_FALSE:
    *py = json_is_true(j) ? "True" : "False";
    *odd = "a boolean";
    return 0;
  case JSON_INTEGER:
    snprintf(num, 64, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
    *py = num;
    *odd = "an integer";
    return 0;
  case JSON_REAL:
    *py = num;
    *odd = "a float";
    return encache__py_float_str(json_real_value(j), num, 64) < 0
               ? ENCACHE_ECONFIG
               : 0;
  default:
    return ENCACHE_ECONFIG;
  }
}
