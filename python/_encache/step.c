/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.c: whether a step can be used now (step.h).
 */
#include "step.h"

int ec_step_usable(step *s) {
  if (s->owner == NULL) {
    ec_raise(ENCACHE_ECLOSED, "the step is closed");
    return -1;
  }
  return ec_handle_usable(s->owner);
}
