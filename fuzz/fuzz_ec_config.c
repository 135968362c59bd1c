/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the vLLM ec-transfer-config parser, the listing built from it,
 * and the typed setters against it (config_roundtrip.h). */
#include "encache.h"

#include "config_roundtrip.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  encache_config *cfg = NULL;
  if (encache_config_new(&cfg) != 0)
    return 0;
  int rc = encache_config_load_ec(cfg, (const char *)data, size);
  if (rc < 0 && encache_config_errmsg(cfg)[0] == '\0' && rc != ENCACHE_ENOMEM)
    __builtin_trap(); /* every refusal says why */
  int n = encache_config_item_count(cfg);
  for (int i = 0; i < n; i++) {
    encache_config_item it = {.size = sizeof(it)};
    if (encache_config_item_at(cfg, i, &it) != 0 || it.value == NULL)
      __builtin_trap();
  }
  for (int i = 0; i < encache_config_unknown_count(cfg); i++)
    if (encache_config_unknown_at(cfg, i) == NULL)
      __builtin_trap();
  if (rc == 0)
    config_roundtrip(cfg, "ec_");
  encache_config_check_deployment(cfg, NULL);
  encache_config_free(cfg);
  return 0;
}
