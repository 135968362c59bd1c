/*
 * abi_check.c: built against the shared library and the public header
 * only, as an outside program would be: the exported surface links and
 * the library loaded is the one the header describes.
 */
#include "encache.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  if (encache_version_number() >> 16 != ENCACHE_VERSION_MAJOR) {
    fprintf(stderr, "loaded %s, built against %s\n", encache_version(),
            ENCACHE_VERSION_STRING);
    return 1;
  }
  encache_namespace_params p = {sizeof p, "team@cache", "shared/model",
                                "rev:1",  NULL,         ENCACHE_FLOAT32};
  char ns[256], key[300];
  if (encache_namespace(&p, ns, sizeof(ns)) < 0 ||
      encache_key(ns, "image@1", key, sizeof(key)) < 0 ||
      strcmp(key, "team@cache@embedding@model:shared/model@revision:rev:1"
                  "@encoder:encoder:default@dtype:torch.float32"
                  "@protocol:v3@id:image@1") != 0) {
    fprintf(stderr, "key mismatch through the shared library\n");
    return 1;
  }
  encache_config *cfg = NULL;
  if (encache_config_new(&cfg) != 0 ||
      encache_config_load_ec(cfg, "{}", 2) != 0) {
    fprintf(stderr, "config through the shared library failed\n");
    return 1;
  }
  encache_config_free(cfg);
  printf("libencache %s: ok\n", encache_version());
  return 0;
}
