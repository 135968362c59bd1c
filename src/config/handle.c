/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/handle.c: the configuration handle's core: its one message and
 * the typed view of its values (handle.h says how the message is kept).
 */
#include "config/handle.h"

#include <stdarg.h>
#include <stdio.h>

/* ------------------------------------------------------------ messages */

int encache__config_fail(encache_config *cfg, int rc, const char *fmt, ...) {
  if (cfg == NULL)
    return rc;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cfg->errmsg, sizeof(cfg->errmsg), fmt, ap);
  va_end(ap);
  return rc;
}

int encache__config_oom(encache_config *cfg) {
  return encache__config_fail(cfg, ENCACHE_ENOMEM, "out of memory");
}

int encache__config_done(encache_config *cfg, int rc) {
  if (rc == 0)
    cfg->errmsg[0] = '\0';
  return rc;
}

const char *encache_config_errmsg(const encache_config *cfg) {
  return cfg != NULL ? cfg->errmsg : "";
}

/* ------------------------------------------------------------ the view */

void encache__config_sync(encache_config *cfg) {
  for (int i = 0; i < NOPTS; i++) {
    const opt_def *o = &encache__opt_defs[i];
    const value *v = &cfg->vals[i];
    void *f = (char *)&cfg->opts + o->off;
    switch (encache__kind_class(o->kind)) {
    case C_BOOL:
      *(int *)f = v->b;
      break;
    case C_U64:
      *(uint64_t *)f = v->u;
      break;
    case C_DOUBLE:
      *(double *)f = v->d;
      break;
    case C_STRING:
      *(const char **)f = v->set ? v->s : NULL;
      break;
    }
  }
}

const encache__opts *encache__config_opts(const encache_config *cfg) {
  return &cfg->opts;
}
