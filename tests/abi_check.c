/* SPDX-License-Identifier: Apache-2.0 */
/*
 * abi_check.c: the promise "same major = same ABI", tested.
 *
 * This program is compiled against tests/abi/1.0/encache.h, a copy of the
 * public header as API 1.0 froze it, and linked with the shared library
 * of this tree, as an encoder built against 1.0 would run against a later
 * 1.x library.  It walks every kind of caller-allocated struct through
 * the library: keys, objects, typed options, a Store, the engine with two
 * open steps, stats, the allocator hook.  Keep the copy as it is when the
 * header grows: that is the point.
 */
#include "encache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "abi_check: %s:%d: %s failed\n", __FILE__, __LINE__,   \
              #cond);                                                        \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static long mallocs;
static void *count_malloc(size_t n) { mallocs++; return malloc(n); }
static void *count_calloc(size_t n, size_t s) { mallocs++; return calloc(n, s); }
static void *count_realloc(void *p, size_t n) { mallocs++; return realloc(p, n); }

static int take(void *ctx, size_t i, const encache_candidate *c,
                uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *handle = NULL;
  *data = malloc(nbytes);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void give_back(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

static void keys_and_objects(void) {
  encache_namespace_params p = {sizeof p, "team@cache", "shared/model",
                                "rev:1", NULL, ENCACHE_FLOAT32};
  char ns[256], key[300];
  CHECK(encache_namespace(&p, ns, sizeof(ns)) > 0);
  CHECK(encache_key(ns, "image@1", key, sizeof(key)) > 0);
  CHECK(strcmp(key, "team@cache@embedding@model:shared/model@revision:rev:1"
                    "@encoder:encoder:default@dtype:torch.float32"
                    "@protocol:v3@id:image@1") == 0);
  int64_t shape[2] = {2, 2};
  encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL};
  unsigned char obj[ENCACHE_HEADER_SIZE + 16] = {0};
  CHECK(encache_header_encode(&t, obj) == 0);
  encache_contract c = {ENCACHE_FLOAT32, 2, 2};
  CHECK(encache_object_check(obj, sizeof(obj), &c, NULL) == ENCACHE_COMPATIBLE);
}

/* A Store through its handle: write, read, stats. */
static void store(const char *url) {
  encache_store *st = NULL;
  CHECK(encache_store_open(url, &st) == 0);
  CHECK(encache_store_write(st, "abi-key", "hdr", 3, "body", 4) == 0);
  char buf[16];
  void *bufs[1] = {buf};
  size_t caps[1] = {sizeof(buf)};
  const char *keys[1] = {"abi-key"};
  int64_t res[1];
  CHECK(encache_store_read(st, keys, 1, bufs, caps, res) == 0 && res[0] == 7);
  encache_store_stats s = {.size = sizeof s};
  CHECK(encache_store_stats_get(st, &s) == 0 && s.objects >= 1);
  CHECK(encache_store_classify(res[0]) == ENCACHE_ANSWER_OK);
  encache_store_close(st);
}

/* The engine, configured with typed setters, two steps open at once. */
static void engine(const char *url) {
  encache_config *cfg = NULL;
  CHECK(encache_config_new(&cfg) == 0);
  CHECK(encache_config_set_bool(cfg, ENCACHE_OPT_CROSS_ENCODER_CACHE, 1) == 0);
  CHECK(encache_config_set_string(cfg, ENCACHE_OPT_EMBEDDING_CACHE_PREFIX,
                                  "abi") == 0);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.config = cfg;
  o.model = "abi/model";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  int rc = encache_open(&o, &ec);
  if (rc != 0)
    fprintf(stderr, "abi_check: open: %s\n", encache_errmsg(NULL));
  CHECK(rc == 0);
  encache_config_free(cfg);
  encache_step *a = NULL, *b = NULL;
  CHECK(encache_step_open(ec, &a) == 0 && encache_step_open(ec, &b) == 0);
  encache_candidate ca = {sizeof ca, "img-a", ENCACHE_MODALITY_IMAGE,
                          ENCACHE_FLOAT32, 2, 4, ENCACHE_DEVICE_HOST, 0};
  encache_candidate cb = ca;
  cb.id = "img-b";
  encache_allocator al = {sizeof al, NULL, take, give_back};
  encache_result r[1] = {ENCACHE_RESULT_INIT};
  CHECK(encache_lookup(a, &ca, 1, &al, r) == 0 && r[0].outcome == ENCACHE_MISS);
  CHECK(encache_lookup(b, &cb, 1, &al, r) == 0);
  static float out[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t shape[2] = {2, 4};
  encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL};
  encache_storage *s = NULL;
  CHECK(encache_storage_new(out, sizeof(out), NULL, NULL, &s) == 0);
  CHECK(encache_publish(a, "img-a", &v, s) == ENCACHE_QUEUED);
  CHECK(encache_publish(b, "img-a", &v, s) == ENCACHE_SKIP_NOT_CANDIDATE);
  encache_storage_unref(s);
  encache_step_close(a);
  encache_step_close(b);
  CHECK(encache_flush(ec) == 0);
  encache_stats st = ENCACHE_STATS_INIT;
  CHECK(encache_stats_get(ec, &st) == 0 && st.published_written == 1);
  /* The output is a hit now. */
  CHECK(encache_step_open(ec, &a) == 0);
  CHECK(encache_lookup(a, &ca, 1, &al, r) == 1 && r[0].outcome == ENCACHE_HIT);
  CHECK(memcmp(r[0].data, out, sizeof(out)) == 0);
  free(r[0].data);
  encache_step_close(a);
  CHECK(encache_close(ec) == 0);
}

int main(void) {
  if (encache_version_number() >> 16 != ENCACHE_VERSION_MAJOR) {
    fprintf(stderr, "loaded %s, built against %s\n", encache_version(),
            ENCACHE_VERSION_STRING);
    return 1;
  }
  encache_allocfuncs fns = {sizeof fns, count_malloc, count_calloc,
                            count_realloc, free, NULL};
  CHECK(encache_set_allocators(&fns, NULL) == 0);
  char name[64], url[128];
  snprintf(name, sizeof(name), "encache-abi-%d", (int)getpid());
  snprintf(url, sizeof(url), "shm://%s?size=16MiB", name);
  encache_shm_destroy(name);
  keys_and_objects();
  store(url);
  engine(url);
  encache_shm_destroy(name);
  CHECK(mallocs > 0); /* the library allocated through the hook */
  CHECK(encache_set_allocators(NULL, NULL) == 0);
  printf("libencache %s, built against the %s header: ok\n", encache_version(),
         ENCACHE_VERSION_STRING);
  return 0;
}
