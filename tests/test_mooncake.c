/*
 * The Mooncake backend without Mooncake: clear errors for a missing
 * library or symbol and a bad configuration, the result-code table, and
 * the engine's reaction to each class through the fault-injecting wrapper
 * (registration on, as with Mooncake).  With a real Mooncake Store
 * (ENCACHE_TEST_MOONCAKE=1), tests/on_mooncake.sh runs the conformance and
 * acceptance suites on it.
 */
#include "runner.h"

#include "engine.h"
#include "fault_store.h"

#include <unistd.h>

static char cfg_path[64];

static void write_config(void) {
  snprintf(cfg_path, sizeof(cfg_path), "/tmp/encache-mc-%d.json", (int)getpid());
  FILE *f = fopen(cfg_path, "w");
  ASSERT(f != NULL);
  fputs("{\"local_hostname\": \"127.0.0.1\", \"metadata_server\": "
        "\"P2PHANDSHAKE\", \"master_server_address\": \"127.0.0.1:50051\", "
        "\"protocol\": \"tcp\", \"mode\": \"standalone-store\", "
        "\"global_segment_size\": 0, \"local_buffer_size\": \"64MB\"}", f);
  fclose(f);
}

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

TEST(mooncake_result_code_table) {
  static const struct {
    int64_t code;
    int want;
    const char *name;
  } cases[] = {
      {0, 0, "OK"},
      {4096, 0, "OK"}, /* a byte count */
      {-704, ENCACHE_ENOENT, "OBJECT_NOT_FOUND"},
      {-705, ENCACHE_EEXIST, "OBJECT_ALREADY_EXISTS"},
      {-200, ENCACHE_EUNAVAIL, "NO_AVAILABLE_HANDLE"},
      {-400, ENCACHE_EUNAVAIL, "INVALID_KEY"},
      {-600, ENCACHE_EUNAVAIL, "INVALID_PARAMS"},
      {-703, ENCACHE_EUNAVAIL, "REPLICA_IS_NOT_READY"},
      {-706, ENCACHE_EUNAVAIL, "OBJECT_HAS_LEASE"},
      {-707, ENCACHE_EUNAVAIL, "LEASE_EXPIRED"},
      {-900, ENCACHE_EUNAVAIL, "RPC_FAIL"},
      {-1700, ENCACHE_EUNAVAIL, "TENANT_QUOTA_EXCEEDED"},
      /* Anything else leaves completion unconfirmed. */
      {-1, ENCACHE_EUNCONFIRMED, "unknown"},   /* INTERNAL_ERROR, short answers */
      {-800, ENCACHE_EUNCONFIRMED, "unknown"}, /* TRANSFER_FAIL */
      {-901, ENCACHE_EUNCONFIRMED, "unknown"}, /* RPC_TIMEOUT */
      {-12345, ENCACHE_EUNCONFIRMED, "unknown"},
      {INT64_MIN, ENCACHE_EUNCONFIRMED, "unknown"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (cases[i].code > 0)
      ASSERT_EQ_INT(encache__mooncake_classify(cases[i].code), 0);
    else {
      ASSERT_EQ_INT(encache__mooncake_classify(cases[i].code), cases[i].want);
      ASSERT_EQ_STR(encache__mooncake_code_name(cases[i].code), cases[i].name);
    }
  }
}

/* The engine's reaction to each class, on the shm Store wrapped with
 * registration on (as Mooncake needs it) and the classified answers
 * injected. */
static encache *open_wrapped(fault_ctl *ctl, char *seg, size_t seglen) {
  snprintf(seg, seglen, "encache-mctest-%d", (int)getpid());
  encache_shm_destroy(seg);
  char url[128];
  snprintf(url, sizeof(url), "shm://%s?size=4MiB", seg);
  encache_store *inner = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &inner), 0);
  fault_ctl_init(ctl);
  ctl->registration = 1;
  encache_options o;
  memset(&o, 0, sizeof(o));
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache__open_with_store(&o, fault_store_wrap(inner, ctl), &ec), 0);
  /* One object to hit. */
  float v[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  encache_tensor t = {v, ENCACHE_FLOAT32, 2, shape, NULL};
  unsigned char hdr[24];
  encache_header_encode(&t, hdr);
  char key[256];
  encache_key(encache_namespace_of(ec), "obj", key, sizeof(key));
  encache_store *st = NULL;
  encache_store_open(url, &st);
  encache_store_write(st, key, hdr, 24, v, sizeof(v));
  encache_store_close(st);
  return ec;
}

static int alloc_fn(void *ctx, size_t i, const encache_candidate *c,
                    uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *handle = NULL;
  *data = malloc(nbytes);
  return 0;
}

static void release_fn(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

TEST(mooncake_codes_through_the_engine) {
  static const struct {
    int64_t code;
    int outcome; /* -1: poisoned */
  } reads[] = {{-704, ENCACHE_MISS},        {-707, ENCACHE_UNAVAILABLE},
               {-703, ENCACHE_UNAVAILABLE}, {-600, ENCACHE_UNAVAILABLE},
               {-900, ENCACHE_UNAVAILABLE}, {-800, -1},
               {-1, -1},                    {-31337, -1}};
  for (size_t k = 0; k < sizeof(reads) / sizeof(reads[0]); k++) {
    fault_ctl ctl;
    char seg[64];
    encache *ec = open_wrapped(&ctl, seg, sizeof(seg));
    ctl.read_mode = READ_ITEM_CODE;
    ctl.read_item_code = encache__mooncake_classify(reads[k].code);
    encache_candidate c = {"obj", ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, 2, 2,
                           ENCACHE_DEVICE_HOST, 0};
    static encache_result r; /* a poisoned lookup keeps its destination */
    encache_allocator a = {NULL, alloc_fn, release_fn};
    int hits = encache_lookup(ec, &c, 1, &a, &r);
    if (reads[k].outcome < 0) {
      ASSERT_EQ_INT(hits, ENCACHE_EPOISONED);
      ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
    } else {
      ASSERT_EQ_INT(hits, 0);
      ASSERT_EQ_INT(r.outcome, reads[k].outcome);
      ASSERT_EQ_INT(encache_close(ec), 0);
    }
    encache_shm_destroy(seg);
  }
  /* Writes: a quota answer is recoverable, an unknown one poisons. */
  static const struct {
    int64_t code;
    int poisoned;
  } writes[] = {{-1700, 0}, {-200, 0}, {-705, 0}, {-1, 1}, {-800, 1}};
  for (size_t k = 0; k < sizeof(writes) / sizeof(writes[0]); k++) {
    fault_ctl ctl;
    char seg[64];
    encache *ec = open_wrapped(&ctl, seg, sizeof(seg));
    encache_candidate c = {"new", ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, 2, 2,
                           ENCACHE_DEVICE_HOST, 0};
    encache_result r;
    encache_allocator a = {NULL, alloc_fn, release_fn};
    ASSERT_EQ_INT(encache_lookup(ec, &c, 1, &a, &r), 0);
    ctl.write_rc = encache__mooncake_classify(writes[k].code);
    static float out[4] = {5, 6, 7, 8}; /* a kept storage stays reachable */
    encache_storage *s = NULL;
    encache_storage_new(out, sizeof(out), NULL, NULL, &s);
    int64_t shape[2] = {2, 2};
    encache_tensor v = {out, ENCACHE_FLOAT32, 2, shape, NULL};
    ASSERT_EQ_INT(encache_publish(ec, "new", &v, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    int rc = encache_flush(ec);
    ASSERT_EQ_INT(rc, writes[k].poisoned ? ENCACHE_EPOISONED : 0);
    ASSERT_EQ_INT(encache_close(ec), writes[k].poisoned ? ENCACHE_EPOISONED : 0);
    encache_shm_destroy(seg);
  }
}
