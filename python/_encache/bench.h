/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench.h: the benchmark's baseline (python/encache/bench.py), the same
 * lookups and publications made from C alone on a Cache's own handle; the
 * module's _bench_c_lookup and _bench_c_publish (module.c's table).
 */
#ifndef ENCACHE_PY_BENCH_H
#define ENCACHE_PY_BENCH_H

#include "core.h"

PyObject *ec_bench_c_lookup(PyObject *self, PyObject *args);
PyObject *ec_bench_c_publish(PyObject *self, PyObject *args);

#endif
