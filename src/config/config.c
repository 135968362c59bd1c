/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config.c: the configuration handle's entry points: creation and
 * freeing, sizes, the deployment rules, the listing of effective
 * options, unknown members and warnings, and the namespace.  The
 * handle's invariants and its message are in handle.h.
 */
#include "config/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --------------------------------------------------------------- handle */

void encache_config_free(encache_config *cfg) {
  if (cfg == NULL)
    return;
  for (int i = 0; i < NOPTS; i++)
    encache__value_clear(&cfg->vals[i]);
  for (int s = 0; s < SEC_COUNT; s++)
    encache__unknown_clear(&cfg->unknown[s], &cfg->nunknown[s]);
  encache__free(cfg->json_warn[0]);
  encache__free(cfg->json_warn[1]);
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
    if (encache__value_default(&encache__opt_defs[i], &cfg->vals[i]) < 0) {
      encache_config_free(cfg);
      return ENCACHE_ENOMEM;
    }
  }
  encache__config_sync(cfg);
  *out = cfg;
  return 0;
}

/* ---------------------------------------------------------------- sizes */

int encache_parse_size(const char *text, uint64_t *out) {
  static const struct {
    const char *unit;
    unsigned shift;
  } units[] = {{"b", 0},    {"kb", 10},  {"kib", 10}, {"k", 10},   {"mb", 20},
               {"mib", 20}, {"m", 20},   {"gb", 30},  {"gib", 30}, {"g", 30},
               {"tb", 40},  {"tib", 40}, {"t", 40}};
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

/* ----------------------------------------------------------- deployment */

int encache_config_check_deployment(encache_config *cfg,
                                    const encache_deployment *given) {
  encache_deployment d;
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  encache_deployment_defaults(&d);
  if (given != NULL && encache__struct_in(&d, sizeof(d), given, sizeof(d)) < 0)
    return encache__config_fail(cfg, ENCACHE_EINVAL,
                                "encache_deployment: size %zu is not one this "
                                "library knows (at least %zu)",
                                given->size, sizeof(d));
  if (!cfg->opts.cross_encoder_cache)
    return encache__config_done(cfg, 0);
  if (!(d.mm_processor_cache_gb > 0))
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "mm_processor_cache_gb: is %g, so identifiers "
                                "would not be stable content hashes; "
                                "cross_encoder_cache needs the processor "
                                "cache on",
                                d.mm_processor_cache_gb);
  const struct {
    const char *name;
    int v;
  } sizes[] = {{"tensor_parallel_size", d.tensor_parallel_size},
               {"pipeline_parallel_size", d.pipeline_parallel_size},
               {"data_parallel_size", d.data_parallel_size}};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    if (sizes[i].v != 1)
      return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                  "%s: is %d; cross_encoder_cache supports "
                                  "only 1",
                                  sizes[i].name, sizes[i].v);
  if (d.dynamic_lora)
    return encache__config_fail(cfg, ENCACHE_ECONFIG,
                                "dynamic_lora: is on; cross_encoder_cache does "
                                "not support dynamic LoRA (outputs would "
                                "depend on the adapter)");
  return encache__config_done(cfg, 0);
}

/* -------------------------------------------------------------- listing */

static int visible(const encache_config *cfg, int i) {
  return encache__opt_defs[i].sec != SEC_MOONCAKE || cfg->mooncake_loaded;
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
    if (!visible(cfg, i) || idx-- != 0)
      continue;
    encache_config_item full = {
        sizeof(full), encache__section_names[encache__opt_defs[i].sec],
        encache__opt_defs[i].name, cfg->vals[i].text, !cfg->vals[i].given};
    return encache__struct_out(item, &full, sizeof(full), sizeof(full));
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

int encache_config_warning_count(const encache_config *cfg) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  int n = 0;
  for (int i = 0; i < NOPTS; i++)
    n += visible(cfg, i) && cfg->vals[i].warn != NULL;
  return n + (cfg->json_warn[0] != NULL) + (cfg->json_warn[1] != NULL);
}

const char *encache_config_warning_at(const encache_config *cfg, int idx) {
  if (cfg == NULL || idx < 0)
    return NULL;
  for (int i = 0; i < NOPTS; i++)
    if (visible(cfg, i) && cfg->vals[i].warn != NULL && idx-- == 0)
      return cfg->vals[i].warn;
  for (int k = 0; k < 2; k++) /* how the JSON itself was read */
    if (cfg->json_warn[k] != NULL && idx-- == 0)
      return cfg->json_warn[k];
  return NULL;
}

/* ------------------------------------------------------------ namespace */

int encache_config_namespace(const encache_config *cfg, const char *model,
                             const char *revision, const char *encoder_hash,
                             int dtype, char *buf, size_t size) {
  if (cfg == NULL)
    return ENCACHE_EINVAL;
  const value *prefix = &cfg->vals[ENCACHE_OPT_EMBEDDING_CACHE_PREFIX];
  const value *ident = &cfg->vals[ENCACHE_OPT_EMBEDDING_MODEL_IDENTITY];
  /* str(extra.get("embedding_model_identity", model)): the model path
   * only when the option is absent. */
  const char *m = ident->set ? ident->s : model;
  if (m == NULL || (!ident->set && m[0] == '\0'))
    return ENCACHE_EINVAL;
  encache_namespace_params p = {
      sizeof p, prefix->set ? prefix->s : NULL, m, revision, encoder_hash,
      dtype};
  return encache_namespace(&p, buf, size);
}
