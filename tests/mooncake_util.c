/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_util.c: what the Mooncake backend tests (tests/test_mooncake_*.c)
 * share: a configuration file, a host allocator, and engines on the
 * stand-in library (tests/fake_mooncake.c) with its call counters and
 * injected answers.
 */
#include "mooncake_util.h"

#include "engine.h"
#include "lookup_read.h"
#include "fault_store.h"
#include "mooncake_codes.h"
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

char cfg_path[64];

void write_config_for(const char *protocol) {
  snprintf(cfg_path, sizeof(cfg_path), "/tmp/encache-mc-%d.json", (int)getpid());
  FILE *f = fopen(cfg_path, "w");
  ASSERT(f != NULL);
  fprintf(f, "{\"local_hostname\": \"127.0.0.1\", \"metadata_server\": "
          "\"P2PHANDSHAKE\", \"master_server_address\": \"127.0.0.1:50051\", "
          "\"protocol\": \"%s\", \"mode\": \"standalone-store\", "
          "\"global_segment_size\": 0, \"local_buffer_size\": \"64MB\"}",
          protocol);
  fclose(f);
}

void write_config(void) { write_config_for("tcp"); }

int alloc_fn(void *ctx, size_t i, const encache_candidate *c,
             uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *handle = NULL;
  *data = malloc(nbytes);
  return 0;
}

void release_fn(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

int present(encache_store *st, const char *key) {
  const char *keys[1] = {key};
  int r[1] = {-1};
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, r), 0);
  return r[0];
}

fake_ctl fake_of(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  fake_ctl f = {dlsym(lib, "fake_mooncake_calls"),
                dlsym(lib, "fake_mooncake_inject"),
                dlsym(lib, "fake_mooncake_inject_batch"),
                dlsym(lib, "fake_mooncake_protocol")};
  ASSERT(f.calls != NULL && f.inject != NULL && f.inject_batch != NULL &&
         f.protocol != NULL);
  dlclose(lib); /* still loaded: the backend never unloads it */
  return f;
}

void fake_reset(fake_ctl *f) {
  memset(f->calls, 0, F_OPS * sizeof(long));
  memset(f->inject, 0, F_OPS * sizeof(int));
  memset(f->inject_batch, 0, F_OPS * sizeof(int));
}

/* More members of ec_connector_extra_config for engine_on_fake ("" or
 * ", \"name\": value"). */
const char *fake_extra = "";

/* An engine on the stand-in with protocol, a staging buffer of rbuf
 * bytes, and the 2x2 float32 objects "a" and "b" in it; counters reset. */
encache *engine_on_fake(const char *protocol, unsigned rbuf, fake_ctl *f) {
  write_config_for(protocol);
  char url[128];
  snprintf(url, sizeof(url), "mooncake:%s", cfg_path);
  setenv("ENCACHE_MOONCAKE_LIBRARY", FAKE_MOONCAKE, 1);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  *f = fake_of(FAKE_MOONCAKE);
  char extra[256];
  snprintf(extra, sizeof(extra), "{\"ec_connector_extra_config\": "
           "{\"cross_encoder_cache\": true, \"store_read_buffer_bytes\": "
           "%u%s}}", rbuf, fake_extra);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = extra;
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache__open_with_store(&o, st, &ec), 0);
  static const char *const ids[] = {"a", "b"};
  for (int i = 0; i < 2; i++) {
    float v[4] = {(float)i, 2, 3, 4};
    int64_t shape[2] = {2, 2};
    encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    unsigned char hdr[24];
    char key[256];
    encache_header_encode(&t, hdr);
    encache_key(encache_namespace_of(ec), ids[i], key, sizeof(key));
    ASSERT_EQ_INT(encache_store_write(ec->store, key, hdr, 24, v, sizeof(v)),
                  0);
  }
  fake_reset(f);
  return ec;
}

/* Looks up ids (2x2 float32, or rows x rows for "big") into r. */
int lookup_fake(encache_step *step, const char *const *ids, size_t n,
                encache_result *r) {
  encache_candidate c[4];
  encache_allocator a = {sizeof(a), NULL, alloc_fn, release_fn, 0};
  for (size_t i = 0; i < n; i++) {
    uint64_t rows = strcmp(ids[i], "big") == 0 ? 64 : 2;
    encache_candidate ci = {sizeof(ci), ids[i], ENCACHE_MODALITY_IMAGE,
                            ENCACHE_FLOAT32, rows, rows, ENCACHE_DEVICE_HOST,
                            0};
    c[i] = ci;
    r[i].size = sizeof(r[i]);
  }
  return encache_lookup(step, c, n, &a, r);
}

void free_results(encache_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT)
      free(r[i].data);
}
