/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/python.h: what vLLM's Python does to a configuration value
 * (python.c), so that encache reads the JSON as a vLLM encoder does.  It
 * stands on no other file of the configuration: every function takes a
 * JSON value or a string and gives back a string, a number or a reason.
 */
#ifndef ENCACHE_CONFIG_PYTHON_H
#define ENCACHE_CONFIG_PYTHON_H

#include "internal.h"

#include <jansson.h>

/* The type of a JSON value in words, for messages ("an integer", "a
 * float", as Python would name what json.loads gives). */
const char *encache__json_kind(const json_t *j);
/* Python: [*a, *e) stripped as str.strip() strips ASCII. */
void encache__py_strip(const char **a, const char **e);
/* Why a number vLLM reads (a size, a positive integer) is refused: vLLM
 * refuses it too, or only encache does (negative, a boolean, 2^64 or
 * more, which vLLM would take).  Not a code: the caller's message says
 * which, and its code is ENCACHE_ECONFIG either way. */
enum { ENCACHE__PY_VLLM_REFUSES = 1, ENCACHE__PY_ONLY_ENCACHE = 2 };
/* vLLM's _parse_size: 0, or ENCACHE__PY_* with why. */
int encache__vllm_size(const json_t *j, uint64_t *out, char *why, size_t wsize);
/* vLLM's _normalize_tenant_id of a string: stripped, blank = "default".
 * An allocation, NULL when out of memory. */
char *encache__tenant_normalize(const char *t);
/* Python's str() of a float into buf (size >= 32); ENCACHE_EINVAL for a
 * value JSON cannot hold (the tests compare it with Python's own). */
int encache__py_float_str(double d, char *buf, size_t size);
/* Python's str() of a key field's JSON value into num[64] (or the
 * string itself); *odd says what vLLM made of a non-string value (NULL
 * for a string).  ENCACHE_ECONFIG for an object, an array or a float
 * Python cannot write. */
int encache__py_str(const json_t *j, char *num, const char **py,
                    const char **odd);

#endif
