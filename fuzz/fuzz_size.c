/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the size parser ("4GB", "512MiB", plain integers). */
#include "encache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (s == NULL)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';
  uint64_t v;
  int rc = encache_parse_size(s, &v);
  if (rc != 0 && rc != ENCACHE_EINVAL && rc != ENCACHE_ETOOLARGE)
    __builtin_trap();
  free(s);
  return 0;
}
