/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/load.c: the loads of include/encache.h (the vLLM
 * ec-transfer-config, the Mooncake client JSON from text or a file) and
 * encache_config_validate().  Each section is read into a scratch copy
 * (json.c), checked against the rules between its options (sections.c)
 * and committed only when every section of the call is valid, so a
 * failed load leaves the handle as it was but for its message.
 */
#include "config/json.h"
#include "config/python.h"
#include "config/sections.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A section of obj read into s, then checked against its rules. */
static int load_checked(encache_config *cfg, scratch *s, enum section sec,
                        const json_t *obj, const char *skip) {
  int rc = encache__load_section(cfg, s, sec, obj, skip);
  return rc < 0 ? rc : encache__section_check(cfg, s->vals, sec);
}

int encache_config_load_ec(encache_config *cfg, const char *json, size_t len) {
  static const char extra_name[] = "ec_connector_extra_config";
  int rc = 0;
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if (json == NULL)
    return encache__config_fail(cfg, ENCACHE_EINVAL,
                                "ec_transfer_config: no JSON given");
  char *warn;
  json_t *root =
      encache__json_object(cfg, json, len, "ec_transfer_config", &rc, &warn);
  if (root == NULL)
    return rc;
  scratch s;
  memset(&s, 0, sizeof(s));
  json_t *extra = json_object_get(root, extra_name);
  json_t *empty = extra != NULL ? NULL : json_object();
  if (extra != NULL && !json_is_object(extra)) {
    char got[80];
    encache__json_brief(extra, got, sizeof(got));
    rc = encache__config_fail(cfg, ENCACHE_ECONFIG,
                              "ec_transfer_config.%s: must be an object, got "
                              "%s %s",
                              extra_name, encache__json_kind(extra), got);
  } else if (extra == NULL && empty == NULL) {
    rc = encache__config_oom(cfg);
  }
  if (rc == 0)
    rc = load_checked(cfg, &s, SEC_EC, root, extra_name);
  if (rc == 0)
    rc = load_checked(cfg, &s, SEC_EXTRA, extra ? extra : empty, NULL);
  if (rc == 0) {
    encache__commit_section(cfg, &s, SEC_EC);
    encache__commit_section(cfg, &s, SEC_EXTRA);
    encache__json_warn_set(cfg, 0, warn);
    warn = NULL;
  }
  encache__free(warn);
  json_decref(empty);
  encache__scratch_free(&s);
  json_decref(root);
  return encache__config_done(cfg, rc);
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
    return encache__config_fail(cfg, ENCACHE_EINVAL, "%s: no JSON given", what);
  char *warn;
  json_t *root = encache__json_object(cfg, json, len, what, &rc, &warn);
  if (root == NULL)
    return rc;
  scratch s;
  memset(&s, 0, sizeof(s));
  rc = load_checked(cfg, &s, SEC_MOONCAKE, root, NULL);
  if (rc == 0)
    rc = encache__derive_hostname(cfg, s.vals);
  if (rc == 0) {
    encache__commit_section(cfg, &s, SEC_MOONCAKE);
    cfg->mooncake_loaded = 1;
    encache__json_warn_set(cfg, 1, warn);
    warn = NULL;
  }
  encache__free(warn);
  encache__scratch_free(&s);
  json_decref(root);
  return encache__config_done(cfg, rc);
}

int encache_config_load_mooncake_file(encache_config *cfg, const char *path) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  if (path == NULL) {
    path = getenv("MOONCAKE_CONFIG_PATH");
    if (path == NULL || path[0] == '\0')
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG,
          "MOONCAKE_CONFIG_PATH: not set (it must name the Mooncake "
          "client JSON file)");
  }
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    return encache__config_fail(cfg, -e, "mooncake config %s: %s", path,
                                strerror(e));
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len == cap) {
      if (cap >= (size_t)64 << 20) {
        rc = encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "mooncake config %s: larger than 64 MiB",
                                  path);
        break;
      }
      cap = cap ? cap * 2 : 4096;
      char *nb = encache__realloc(buf, cap);
      if (nb == NULL) {
        rc = encache__config_oom(cfg);
        break;
      }
      buf = nb;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) {
      if (ferror(f))
        rc = encache__config_fail(cfg, ENCACHE_EIO,
                                  "mooncake config %s: read error", path);
      break;
    }
  }
  fclose(f);
  if (rc == 0)
    rc = encache_config_load_mooncake(cfg, buf, len, path);
  encache__free(buf);
  return rc;
}

int encache_config_validate(encache_config *cfg) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  int rc = encache__section_check(cfg, cfg->vals, SEC_EC);
  if (rc == 0 && cfg->mooncake_loaded) {
    rc = encache__section_check(cfg, cfg->vals, SEC_MOONCAKE);
    if (rc == 0 && !cfg->vals[ENCACHE_OPT_LOCAL_HOSTNAME].set)
      rc = encache__derive_hostname(cfg, cfg->vals);
  }
  encache__config_sync(cfg);
  return encache__config_done(cfg, rc);
}
