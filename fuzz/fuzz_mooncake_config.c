/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the Mooncake client JSON parser (sizes, modes, required fields)
 * and the typed setters against it (config_roundtrip.h). */
#include "encache.h"

#include "config_roundtrip.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  encache_config *cfg = NULL;
  if (encache_config_new(&cfg) != 0)
    return 0;
  int rc = encache_config_load_mooncake(cfg, (const char *)data, size, "fuzz");
  if (rc < 0 && encache_config_errmsg(cfg)[0] == '\0' && rc != ENCACHE_ENOMEM)
    __builtin_trap();
  if (rc == 0) {
    uint64_t seg;
    const char *mode;
    encache_config_u64(cfg, ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, &seg);
    encache_config_string(cfg, ENCACHE_OPT_MODE, &mode);
    /* The standalone rule holds for everything accepted. */
    if (mode != NULL && __builtin_strcmp(mode, "standalone-store") == 0 &&
        seg != 0)
      __builtin_trap();
    config_roundtrip(cfg, "mooncake");
  }
  encache_config_free(cfg);
  return 0;
}
