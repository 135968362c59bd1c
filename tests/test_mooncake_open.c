/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Mooncake backend without Mooncake: clear errors for a missing
 * library or symbol and a bad configuration.
 * The stand-in library is tests/fake_mooncake.c; the helpers several of
 * these files share are in tests/mooncake_util.c.  With a real Mooncake
 * Store (ENCACHE_TEST_MOONCAKE=1), tests/on_mooncake.sh runs the
 * conformance and acceptance suites on it.
 */
#include "mooncake_util.h"

#include "engine.h"
#include "lookup_read.h"
#include "fault_store.h"
#include "mooncake_codes.h"
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

static int open_err(const char *url, char *msg, size_t size) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  snprintf(msg, size, "%s", encache_store_errmsg(st));
  encache_store_close(st);
  return rc;
}

TEST(mooncake_missing_library_or_symbol_is_clear) {
  char url[128], msg[1024];
  write_config();
  snprintf(url, sizeof(url), "mooncake:%s", cfg_path);
  setenv("ENCACHE_MOONCAKE_LIBRARY", "/nonexistent/libmooncake_store.so", 1);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_ENOLIB);
  ASSERT_CONTAINS(msg, "cannot load /nonexistent/libmooncake_store.so");
  ASSERT_CONTAINS(msg, "ENCACHE_MOONCAKE_LIBRARY");
  ASSERT_CONTAINS(msg, "WITH_STORE_C_SHARED");
  /* A library that is not Mooncake's: the missing symbol is named. */
  setenv("ENCACHE_MOONCAKE_LIBRARY", "libc.so.6", 1);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_ENOLIB);
  ASSERT_CONTAINS(msg, "has no symbol mooncake_store_create");
  /* Without the variable, the default name is looked up. */
  unsetenv("ENCACHE_MOONCAKE_LIBRARY");
  if (open_err(url, msg, sizeof(msg)) == ENCACHE_ENOLIB)
    ASSERT_CONTAINS(msg, "cannot load libmooncake_store.so");
  unlink(cfg_path);
}

TEST(mooncake_configuration_errors_name_the_field) {
  char msg[1024];
  unsetenv("MOONCAKE_CONFIG_PATH");
  ASSERT_EQ_INT(open_err("mooncake:", msg, sizeof(msg)), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(msg, "MOONCAKE_CONFIG_PATH: not set");
  snprintf(cfg_path, sizeof(cfg_path), "/tmp/encache-mc-%d.json", (int)getpid());
  FILE *f = fopen(cfg_path, "w");
  fputs("{\"metadata_server\": \"x\", \"master_server_address\": \"h:1\", "
        "\"enable_offload\": true}", f);
  fclose(f);
  setenv("MOONCAKE_CONFIG_PATH", cfg_path, 1);
  ASSERT_EQ_INT(open_err("mooncake:", msg, sizeof(msg)), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(msg, "mooncake.enable_offload: must not be true");
  unlink(cfg_path);
}
