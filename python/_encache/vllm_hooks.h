/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_hooks.h: the vLLM connector's per-step calls in C (encache.vllm):
 * WorkerStep, the step state of its worker half, and ConnectorHooks, the
 * C base class of its connector.  Above the Handle and Step types and the
 * lookup, which it calls; nothing of the generic binding stands on it.
 */
#ifndef ENCACHE_PY_VLLM_HOOKS_H
#define ENCACHE_PY_VLLM_HOOKS_H

#include "core.h"

/* Readies WorkerStep and ConnectorHooks and adds them to module m; 0 or
 * -1 raised. */
int ec_vllm_hooks_register(PyObject *m);

#endif
