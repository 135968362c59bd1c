/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Mooncake backend without Mooncake: clear errors for a missing
 * library or symbol and a bad configuration, the result-code table, and
 * the engine's reaction to each class through the fault-injecting wrapper
 * (registration on, as with Mooncake), and the purge by regex through a
 * stand-in library (tests/fake_mooncake.c).  With a real Mooncake Store
 * (ENCACHE_TEST_MOONCAKE=1), tests/on_mooncake.sh runs the conformance and
 * acceptance suites on it.  The round trips of each operation, and their
 * fault cases, are counted and injected through the stand-in library
 * (over 600 lines: one backend's tests together).
 */
#include "runner.h"

#include "engine.h"
#include "lookup_read.h"
#include "fault_store.h"
#include "mooncake_codes.h"
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

static char cfg_path[64];

static void write_config_for(const char *protocol) {
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

static void write_config(void) { write_config_for("tcp"); }

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

/* vLLM's sets, written out again from its store_client.py (commit
 * 007aedc9630406af59037e7d3b1480f6d13f3228): the table must agree. */
static const int64_t vllm_safe_io[] = {-200, -703, -704, -705, -900, -901};
static const int64_t vllm_safe_get_extra[] = {-600, -702, -707};
static const int64_t vllm_safe_put_extra[] = {-1700};

static int in_set(int64_t code, const int64_t *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == code)
      return 1;
  return 0;
}
#define IN(code, set) in_set(code, set, sizeof(set) / sizeof(set[0]))

/* What vLLM does with `code` for operation op: 0 safe, 1 poison. */
static int vllm_poisons(int op, int64_t code) {
  if (op == ENCACHE__MC_EXISTS)
    return 0; /* batch_exists: only 1 is present; no memory lent */
  if (IN(code, vllm_safe_io))
    return 0;
  if (op == ENCACHE__MC_READ)
    return !IN(code, vllm_safe_get_extra);
  return !IN(code, vllm_safe_put_extra);
}

TEST(mooncake_result_code_table) {
  /* Every row, and codes the table does not name. */
  int64_t codes[64];
  size_t n = 0;
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    codes[n++] = encache__mooncake_code_at(i);
  ASSERT(n >= 13);
  codes[n++] = -1;
  codes[n++] = -12345;
  codes[n++] = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    for (int op = 0; op < ENCACHE__MC_OPS; op++) {
      int got = encache__mooncake_classify_op(op, codes[i]);
      if (vllm_poisons(op, codes[i])) {
        if (got != ENCACHE_EUNCONFIRMED)
          test__fail(__FILE__, __LINE__, "code %lld op %d: vLLM poisons, "
                     "encache answers %s", (long long)codes[i], op,
                     encache_err_name(got));
      } else if (got == ENCACHE_EUNCONFIRMED) {
        test__fail(__FILE__, __LINE__, "code %lld op %d: vLLM carries on, "
                   "encache poisons", (long long)codes[i], op);
      }
    }
  }
  /* The particular answers. */
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_EXISTS, -704), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -704), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -704), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -705), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -901), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -702), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, -1700), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -400), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -600), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -706), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -707), ENCACHE_EUNCONFIRMED);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_WRITE, -1700), ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache__mooncake_classify_op(ENCACHE__MC_READ, 4096), 0);
  ASSERT_EQ_INT(encache__mooncake_classify_op(99, -704), ENCACHE_EINVAL);
  ASSERT_EQ_STR(encache__mooncake_code_name(-901), "RPC_TIMEOUT");
  ASSERT_EQ_STR(encache__mooncake_code_name(-702), "INVALID_REPLICA");
  ASSERT_EQ_STR(encache__mooncake_code_name(-12345), "unknown");
  ASSERT_EQ_STR(encache__mooncake_code_name(0), "OK");
  /* The names are unique, and no row repeats a code. */
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    for (int j = i + 1; j < encache__mooncake_code_count(); j++)
      ASSERT(encache__mooncake_code_at(i) != encache__mooncake_code_at(j));
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
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache__open_with_store(&o, fault_store_wrap(inner, ctl), &ec), 0);
  /* One object to hit. */
  float v[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
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

/* One candidate looked up (op EXISTS or READ) or published (op WRITE) with
 * the Mooncake answer `code` injected through the fault wrapper, as the
 * backend classifies it.  Returns the lookup outcome (MISS, UNAVAILABLE,
 * ...), ENCACHE_EPOISONED, or for writes 0 / the counter that moved
 * (100 + published_failed, 200 + published_present). */
static int run_code(int op, int64_t code) {
  fault_ctl ctl;
  char seg[64];
  encache *ec = open_wrapped(&ctl, seg, sizeof(seg));
  int cls = encache__mooncake_classify_op(op, code);
  int ret;
  encache_allocator a = {sizeof(a), NULL, alloc_fn, release_fn, 0};
  static encache_result r; /* a poisoned lookup keeps its destination */
  r.size = sizeof(r);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  if (op != ENCACHE__MC_WRITE) {
    if (op == ENCACHE__MC_EXISTS) {
      ctl.exists_item = cls;
    } else {
      ctl.read_mode = READ_ITEM_CODE;
      ctl.read_item_code = cls;
    }
    encache_candidate c = {sizeof(c), "obj", ENCACHE_MODALITY_IMAGE,
                           ENCACHE_FLOAT32, 2, 2, ENCACHE_DEVICE_HOST, 0};
    int hits = encache_lookup(step, &c, 1, &a, &r);
    ret = hits < 0 ? hits : r.outcome;
  } else {
    encache_candidate c = {sizeof(c), "new", ENCACHE_MODALITY_IMAGE,
                           ENCACHE_FLOAT32, 2, 2, ENCACHE_DEVICE_HOST, 0};
    ASSERT_EQ_INT(encache_lookup(step, &c, 1, &a, &r), 0);
    ctl.write_rc = cls;
    static float out[4] = {5, 6, 7, 8}; /* a kept storage stays reachable */
    encache_storage *s = NULL;
    encache_storage_new(out, sizeof(out), NULL, NULL, &s);
    int64_t shape[2] = {2, 2};
    encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    ASSERT_EQ_INT(encache_publish(step, "new", &v, s), ENCACHE_QUEUED);
    encache_storage_unref(s);
    ret = encache_flush(ec);
    encache_stats stt = ENCACHE_STATS_INIT;
    encache_stats_get(ec, &stt);
    if (ret == 0)
      ret = stt.published_failed ? 100 : stt.published_present ? 200 : 0;
  }
  int closed = encache_close(ec);
  ASSERT_EQ_INT(closed, ret == ENCACHE_EPOISONED ? ENCACHE_EPOISONED : 0);
  encache_shm_destroy(seg);
  return ret;
}

TEST(mooncake_codes_through_the_engine) {
  int64_t codes[64];
  size_t n = 0;
  for (int i = 0; i < encache__mooncake_code_count(); i++)
    codes[n++] = encache__mooncake_code_at(i);
  codes[n++] = -1; /* not in the table */
  codes[n++] = -31337;
  for (size_t i = 0; i < n; i++) {
    int64_t code = codes[i];
    /* Existence checks: -704 is a miss, anything else "encode instead";
     * never poisoned. */
    int got = run_code(ENCACHE__MC_EXISTS, code);
    ASSERT_EQ_INT(got, code == -704 ? ENCACHE_MISS : ENCACHE_UNAVAILABLE);
    /* Reads: vLLM's safe set means encode instead; the rest poisons. */
    got = run_code(ENCACHE__MC_READ, code);
    if (vllm_poisons(ENCACHE__MC_READ, code))
      ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    else
      ASSERT_EQ_INT(got, code == -704 ? ENCACHE_MISS : ENCACHE_UNAVAILABLE);
    /* Writes: vLLM's safe set skips the write; the rest poisons. */
    got = run_code(ENCACHE__MC_WRITE, code);
    if (vllm_poisons(ENCACHE__MC_WRITE, code))
      ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    else
      ASSERT_EQ_INT(got, code == -705 ? 200 : 100);
  }
}

/* Opens mooncake:cfg_path on the library lib (tests/fake_mooncake.c). */
static encache_store *open_fake(const char *lib) {
  char url[128];
  write_config();
  snprintf(url, sizeof(url), "mooncake:%s", cfg_path);
  setenv("ENCACHE_MOONCAKE_LIBRARY", lib, 1);
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", lib,
               encache_store_errmsg(NULL));
  return st;
}

static int ns_none(const encache_namespace_count *c, void *arg) {
  (void)c;
  (void)arg;
  return 1;
}

static int present(encache_store *st, const char *key) {
  const char *keys[1] = {key};
  int r[1] = {-1};
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, r), 0);
  return r[0];
}

/* A purge on Mooncake is one remove by regex: anchored, every regex
 * character of the prefix escaped, never forced (a read lease holds);
 * its count is the answer, its failure a message; it cannot count first.
 * A library without remove by regex gets no remove_prefix. */
TEST(mooncake_purge_is_one_escaped_remove_by_regex) {
  encache_store *st = open_fake(FAKE_MOONCAKE);
  ASSERT(encache_store_caps_of(st) & ENCACHE_STORE_CAP_REMOVE_PREFIX);
  static const char *const keys[] = {"a.b@id:1", "a.b@id:2", "aXb@id:1",
                                     "a.b@idx", "za.b@id:1"};
  for (size_t i = 0; i < 5; i++)
    ASSERT_EQ_INT(encache_store_write(st, keys[i], "h", 1, "v", 1), 0);
  uint64_t n = 0;
  ASSERT_EQ_INT(encache_store_remove_prefix(st, "a.b@id:", &n), 0);
  ASSERT_EQ_U64(n, 2);
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  ASSERT_EQ_STR((const char *)dlsym(lib, "fake_mooncake_last_pattern"),
                "^a\\.b@id:");
  ASSERT_EQ_INT(*(int *)dlsym(lib, "fake_mooncake_last_force"), 0);
  dlclose(lib);
  ASSERT_EQ_INT(present(st, "a.b@id:1"), 0);
  ASSERT_EQ_INT(present(st, "aXb@id:1"), 1);
  ASSERT_EQ_INT(present(st, "a.b@idx"), 1);
  ASSERT_EQ_INT(present(st, "za.b@id:1"), 1);
  ASSERT_EQ_INT(encache_store_count_prefix(st, "a.b@id:", &n, NULL),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "cannot count");
  setenv("FAKE_MOONCAKE_REGEX_RC", "-900", 1);
  ASSERT_EQ_INT(encache_store_remove_prefix(st, "a", &n), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "remove_by_regex ^a: code -900 (RPC_FAIL)");
  unsetenv("FAKE_MOONCAKE_REGEX_RC");
  encache_store_close(st);
  st = open_fake(FAKE_MOONCAKE_NO_REGEX);
  ASSERT_EQ_INT(encache_store_caps_of(st) & ENCACHE_STORE_CAP_REMOVE_PREFIX, 0);
  ASSERT_EQ_INT(encache_store_remove_prefix(st, "a", &n), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "can neither list");
  encache_store_close(st);
  unlink(cfg_path);
}

/* ------------------------------------------- round trips on the stand-in */

/* The stand-in's call counters and injected answers (fake_mooncake.c). */
enum { F_EXIST, F_GET, F_PUT, F_SIZE, F_REGISTER, F_UNREGISTER, F_OPS };
typedef struct fake_ctl {
  long *calls;
  int *inject, *inject_batch;
  const char *protocol;
} fake_ctl;

static fake_ctl fake_of(const char *path) {
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

static void fake_reset(fake_ctl *f) {
  memset(f->calls, 0, F_OPS * sizeof(long));
  memset(f->inject, 0, F_OPS * sizeof(int));
  memset(f->inject_batch, 0, F_OPS * sizeof(int));
}

/* More members of ec_connector_extra_config for engine_on_fake ("" or
 * ", \"name\": value"). */
static const char *fake_extra = "";

/* An engine on the stand-in with protocol, a staging buffer of rbuf
 * bytes, and the 2x2 float32 objects "a" and "b" in it; counters reset. */
static encache *engine_on_fake(const char *protocol, unsigned rbuf,
                               fake_ctl *f) {
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
static int lookup_fake(encache_step *step, const char *const *ids, size_t n,
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

static void free_results(encache_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT)
      free(r[i].data);
}

/* Mooncake fills one buffer per key of a batch (fake_mooncake.c does as
 * it does): a key asked twice in one lookup (two contracts of one output)
 * is read in two rounds, and the first slot never keeps what an earlier
 * lookup left there (here "b", of the same shape: a wrong hit). */
/* Mooncake's C ABI (store_c.h, kvcache-ai/Mooncake at
 * 0b1f5c0c8b26455735cb5b74e58f87a6c0d740a9) has no call that lists keys:
 * the namespace listing says so by name instead of listing nothing. */
TEST(mooncake_namespaces_cannot_be_listed_and_say_why) {
  encache_store *st = open_fake(FAKE_MOONCAKE);
  ASSERT_EQ_INT(encache_store_write(st, "ns@id:1", "h", 1, "v", 1), 0);
  ASSERT_EQ_INT(encache_store_namespaces(st, ns_none, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st),
                  "Mooncake's C ABI (store_c.h) has no call that lists");
  encache_store_close(st);
}

TEST(mooncake_same_key_twice_in_one_read) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[2];
  static const char *const b[] = {"b"};
  ASSERT_EQ_INT(lookup_fake(step, b, 1, r), 1);
  free_results(r, 1);
  int gets = f.calls[F_GET];
  encache_candidate c[2] = {
      {sizeof(c[0]), "a", ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, 2, 2,
       ENCACHE_DEVICE_HOST, 0},
      {sizeof(c[0]), "a", ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, 4, 1,
       ENCACHE_DEVICE_HOST, 0}};
  encache_allocator a = {sizeof(a), NULL, alloc_fn, release_fn, 0};
  r[0].size = sizeof(r[0]);
  ASSERT_EQ_INT(encache_lookup(step, c, 2, &a, r), 1);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT((int)((float *)r[0].data)[0], 0); /* a's, not b's */
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_STR(r[1].why, "shape 2x2 (expected 4x1)");
  ASSERT_EQ_INT(f.calls[F_GET] - gets, 2);
  free_results(r, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* Over TCP the handle needs no registration; over RDMA it does.  Both
 * read a missing key as cheaply as they check it. */
TEST(mooncake_caps_follow_the_protocol) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  ASSERT_EQ_STR(f.protocol, "tcp");
  unsigned caps = encache_store_caps_of(ec->store);
  ASSERT_EQ_INT(caps & ENCACHE_STORE_CAP_REGISTER, 0);
  ASSERT(caps & ENCACHE_STORE_CAP_READ_ABSENT);
  ASSERT(caps & ENCACHE_STORE_CAP_PUT_IF_ABSENT);
  ts_check_profile(ec->store, 1); /* write_known: asked ahead */
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[2];
  static const char *const ab[] = {"a", "b"};
  ASSERT_EQ_INT(lookup_fake(step, ab, 2, r), 2);
  free_results(r, 2);
  ASSERT_EQ_INT(f.calls[F_REGISTER], 0); /* the staging buffer: plain */
  ASSERT_EQ_INT(encache_close(ec), 0);
  ec = engine_on_fake("rdma", 4096, &f);
  caps = encache_store_caps_of(ec->store);
  ASSERT(caps & ENCACHE_STORE_CAP_REGISTER);
  ASSERT(caps & ENCACHE_STORE_CAP_READ_ABSENT);
  ts_check_profile(ec->store, 1);
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  ASSERT_EQ_INT(lookup_fake(step, ab, 2, r), 2);
  free_results(r, 2);
  ASSERT_EQ_INT(f.calls[F_REGISTER], 1); /* the staging buffer, once */
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* A lookup is one batch_get_into: its -704 answers are the misses, with
 * the reason and counters of an existence check's; an object larger than
 * the staging buffer still gets the check (OVERSIZE is said only of
 * objects that exist). */
TEST(mooncake_lookup_is_one_read) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[3];
  static const char *const abc[] = {"a", "c", "b"};
  ASSERT_EQ_INT(lookup_fake(step, abc, 3, r), 2);
  ASSERT_EQ_INT(f.calls[F_EXIST], 0);
  ASSERT_EQ_INT(f.calls[F_GET], 1);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT((int)((float *)r[2].data)[0], 1);
  free_results(r, 3);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.hits, 2);
  ASSERT_EQ_U64(s.misses, 1);
  /* 16 KiB + 24 does not fit 4096 bytes: checked, absent, a MISS. */
  static const char *const abig[] = {"a", "big"};
  ASSERT_EQ_INT(lookup_fake(step, abig, 2, r), 1);
  ASSERT_EQ_INT(f.calls[F_EXIST], 1);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  free_results(r, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* The faults of the skipped check: a recoverable read answer is
 * UNAVAILABLE; a code that would poison a read but is not about a
 * transfer (an invalid key, an unknown code) is asked about, and of a
 * missing key is what the check would have said (encode instead); of a
 * key that is there it poisons, as before; a failed batch poisons, as a
 * failed read always did. */
TEST(mooncake_lookup_faults_without_the_check) {
  static const int codes[] = {-900, -400, -31337};
  for (size_t k = 0; k < 3; k++) {
    fake_ctl f;
    encache *ec = engine_on_fake("tcp", 4096, &f);
    encache_step *step = NULL;
    ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
    encache_result r[2];
    static const char *const cd[] = {"c", "d"};
    f.inject[F_GET] = codes[k];
    ASSERT_EQ_INT(lookup_fake(step, cd, 2, r), 0);
    int want = codes[k] == -900 ? ENCACHE_UNAVAILABLE : ENCACHE_MISS;
    ASSERT_EQ_INT(r[0].outcome, want);
    ASSERT_EQ_INT(r[1].outcome, want);
    ASSERT_EQ_INT(f.calls[F_EXIST], codes[k] == -900 ? 0 : 2);
    /* The check itself failing: encode instead. */
    f.inject[F_EXIST] = -900;
    ASSERT_EQ_INT(lookup_fake(step, cd, 2, r), 0);
    ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
    f.inject[F_EXIST] = 0;
    static const char *const a[] = {"a"};
    int got = lookup_fake(step, a, 1, r);
    if (codes[k] == -900) {
      ASSERT_EQ_INT(got, 0);
      ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
      f.inject[F_GET] = 0;
      f.inject_batch[F_GET] = -1;
      got = lookup_fake(step, a, 1, r);
    }
    ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  }
  unlink(cfg_path);
}

/* Publishes the 2x2 float32 output {5, 6, 7, 8} for each of ids[0..n)
 * on step: every one queued. */
static void publish_all(encache_step *step, const char *const *ids, int n) {
  static float out[4] = {5, 6, 7, 8};
  int64_t shape[2] = {2, 2};
  encache_tensor v = {sizeof v, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  encache_storage *s = NULL;
  ASSERT_EQ_INT(encache_storage_new(out, sizeof(out), NULL, NULL, &s), 0);
  for (int i = 0; i < n; i++)
    ASSERT_EQ_INT(encache_publish(step, ids[i], &v, s), ENCACHE_QUEUED);
  encache_storage_unref(s);
}

/* A publication is the backend's check and one put: the engine checks
 * nothing itself (the write answers "exists"), so written and present
 * are counted as before; a failed check goes on to the put as vLLM's
 * publisher does; a failed put is skipped or poisons as its code says. */
TEST(mooncake_publication_round_trips) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[4];
  static const char *const ids[] = {"a", "n1", "n2", "n3"};
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 1);
  free_results(r, 4);
  fake_reset(&f);
  publish_all(step, ids, 2); /* "a", "n1" */
  ASSERT_EQ_INT(encache_flush(ec), 0);
  /* One check each, or one for both when the second was queued before
   * the first was taken (asked ahead: mooncake_existence_asked_ahead). */
  ASSERT(f.calls[F_EXIST] == 1 || f.calls[F_EXIST] == 2);
  ASSERT_EQ_INT(f.calls[F_PUT], 1);
  /* The write buffer was registered by the seeding writes; a tensor
   * never is over TCP. */
  ASSERT_EQ_INT(f.calls[F_REGISTER], 0);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 1);
  ASSERT_EQ_U64(st.published_present, 1);
  f.inject[F_EXIST] = -900; /* the check fails: put anyway */
  publish_all(step, ids + 2, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  f.inject[F_EXIST] = 0;
  f.inject[F_PUT] = -200; /* no handle: skipped */
  publish_all(step, ids + 3, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 2);
  ASSERT_EQ_U64(st.published_failed, 1);
  ASSERT_EQ_INT(lookup_fake(step, ids + 2, 1, r), 1); /* n2 is there */
  free_results(r, 1);
  f.inject[F_PUT] = -800; /* a transfer failure: unconfirmed */
  publish_all(step, ids + 3, 1);
  ASSERT_EQ_INT(encache_flush(ec), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  unlink(cfg_path);
}

/* Publishes 4 outputs on an engine on the stand-in whose puts take
 * 50 ms, and returns how many were in flight at most; every publication
 * is written once, each from a write buffer of its own. */
static int puts_in_flight(const char *extra) {
  fake_ctl f;
  fake_extra = extra;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  fake_extra = "";
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  int *delay = dlsym(lib, "fake_mooncake_put_delay_us");
  int *most = dlsym(lib, "fake_mooncake_puts_in_flight_max");
  dlclose(lib);
  ASSERT(delay != NULL && most != NULL);
  *delay = 50000;
  *most = 0;
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const ids[] = {"w1", "w2", "w3", "w4"};
  encache_result r[4];
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 0);
  publish_all(step, ids, 4);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  *delay = 0;
  ASSERT_EQ_INT(f.calls[F_PUT], 4);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 4);
  ASSERT_EQ_INT(lookup_fake(step, ids, 4, r), 4);
  free_results(r, 4);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
  return *most;
}

/* Mooncake's client waits by polling (ENCACHE_STORE_CAP_BUSY_WAIT): one
 * write in flight by default, as many as store_writes_in_flight says
 * otherwise, and more than 8 is refused by name. */
TEST(mooncake_writes_in_flight) {
  ASSERT_EQ_INT(puts_in_flight(""), 1);
  ASSERT_EQ_INT(puts_in_flight(", \"store_writes_in_flight\": 3"), 3);
  write_config_for("tcp");
  char url[128];
  snprintf(url, sizeof(url), "mooncake:%s", cfg_path);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = "{\"ec_connector_extra_config\": {"
                         "\"cross_encoder_cache\": true, "
                         "\"store_writes_in_flight\": 9}}";
  o.model = "mc";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT_CONTAINS(encache_errmsg(NULL), "store_writes_in_flight: 9 is too many");
  unlink(cfg_path);
}

/* ------------------------------------------- reads into the headroom */

/* Destinations with 64 bytes in front and 64 behind, all 0xEE. */
typedef struct roomy {
  int allocs, releases, copies;
} roomy;

static roomy *roomy_now;

static int roomy_alloc(void *ctx, size_t i, const encache_candidate *c,
                       uint64_t nbytes, void **data, void **handle) {
  (void)i, (void)c;
  unsigned char *base = malloc(64 + nbytes + 64);
  ASSERT(base != NULL);
  memset(base, 0xee, 64 + nbytes + 64);
  ((roomy *)ctx)->allocs++;
  *handle = base;
  *data = base + 64;
  return 0;
}

static void roomy_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i, (void)data;
  ((roomy *)ctx)->releases++;
  free(handle);
}

static int roomy_copy(void *dst, const void *src, size_t n) {
  roomy_now->copies++;
  memcpy(dst, src, n);
  return 0;
}

/* Writes the 512x512 float32 object ID (1 MiB), its floats v, v+1, ... */
static void write_big(encache *ec, const char *id, float v) {
  static float m[512 * 512];
  for (size_t k = 0; k < 512 * 512; k++)
    m[k] = v + (float)k;
  int64_t shape[2] = {512, 512};
  encache_tensor t = {sizeof t, m, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[24];
  char key[256];
  encache_header_encode(&t, hdr);
  encache_key(encache_namespace_of(ec), id, key, sizeof(key));
  ASSERT_EQ_INT(encache_store_write(ec->store, key, hdr, 24, m, sizeof(m)), 0);
}

/* Looks A, B, C (absent) and A again up (1 MiB each, else the 2x2 a, b, c,
 * a) with an allocator of headroom h; checks every hit, what lies around
 * it and that the miss took no destination; returns the copies made (out
 * of the staging buffer or a destination) and in *checks the existence
 * checks. */
static int lookup_roomy(encache_step *step, int big, size_t h, fake_ctl *f,
                        int *checks) {
  static const char *const ids[2][4] = {{"a", "b", "c", "a"},
                                        {"A", "B", "C", "A"}};
  uint64_t side = big ? 512 : 2, nbytes = side * side * 4;
  roomy t = {0, 0, 0};
  roomy_now = &t;
  encache__copy_hook = roomy_copy;
  encache_allocator a = {sizeof(a), &t, roomy_alloc, roomy_release, h};
  encache_candidate c[4];
  encache_result r[4];
  for (int i = 0; i < 4; i++) {
    c[i] = (encache_candidate){sizeof(c[i]), ids[big][i],
                               ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, side,
                               side, ENCACHE_DEVICE_HOST, 0};
    r[i].size = sizeof(r[i]);
  }
  *checks = f->calls[F_EXIST];
  ASSERT_EQ_INT(encache_lookup(step, c, 4, &a, r), 3);
  encache__copy_hook = NULL;
  *checks = f->calls[F_EXIST] - *checks;
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(t.allocs, 3); /* none for the miss */
  ASSERT_EQ_INT(t.releases, 0);
  for (int i = 0; i < 4; i++) {
    if (i == 2)
      continue;
    ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    const float *got = r[i].data;
    float first = big ? (i == 1 ? 7000 : 3000) : (float)(i == 1);
    ASSERT(got[0] == first && got[3] == (big ? first + 3 : 4));
    unsigned char *base = r[i].handle, *d = r[i].data;
    int whole = *checks > 0; /* the whole-object path checks first */
    for (size_t k = 0; k < 64 - (whole ? 24 : 0); k++)
      ASSERT_EQ_INT(base[k], 0xee);
    for (size_t k = 0; k < 64; k++)
      ASSERT_EQ_INT(d[nbytes + k], 0xee);
    if (whole && i < 2) /* the object's header, read in front */
      ASSERT_EQ_U64(((encache_header *)(void *)(d - 24))->magic,
                    ENCACHE_MAGIC);
    free(base);
  }
  return t.copies;
}

/* Over TCP (no registration, no split read) an allocator with room for
 * the header in front of each destination gets whole objects of 1 MiB
 * or more in all read straight into it, after an existence check (a miss
 * takes no destination): no copy but the duplicate's, nothing written
 * outside [data - 24, data + nbytes).  With less room, or less than
 * 1 MiB of objects, staged without the check, as before. */
TEST(mooncake_reads_straight_into_headroom) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 8u << 20, &f);
  write_big(ec, "A", 3000);
  write_big(ec, "B", 7000);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  int checks = 0;
  ASSERT_EQ_INT(lookup_roomy(step, 1, ENCACHE_HEADER_SIZE, &f, &checks), 1);
  ASSERT_EQ_INT(checks, 1);
  ASSERT_EQ_INT(lookup_roomy(step, 1, 64, &f, &checks), 1);
  ASSERT_EQ_INT(lookup_roomy(step, 1, ENCACHE_HEADER_SIZE - 1, &f, &checks),
                3);
  ASSERT_EQ_INT(checks, 0);
  ASSERT_EQ_INT(lookup_roomy(step, 1, 0, &f, &checks), 3);
  ASSERT_EQ_INT(lookup_roomy(step, 0, 64, &f, &checks), 3); /* 48 bytes */
  ASSERT_EQ_INT(checks, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* A staged lookup packs small objects in the staging buffer, and starts
 * each of 64 KiB or more on a page (reads into memory just past a page
 * were slower: lookup.c, SLOT_PAGE_MIN). */
TEST(mooncake_large_slots_start_on_a_page) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 8u << 20, &f);
  write_big(ec, "A", 3000);
  write_big(ec, "B", 7000);
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  void **bufs = dlsym(lib, "fake_mooncake_get_bufs");
  dlclose(lib);
  ASSERT(bufs != NULL);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  int checks = 0;
  ASSERT_EQ_INT(lookup_roomy(step, 1, 0, &f, &checks), 3);
  uintptr_t a = (uintptr_t)bufs[0], b = (uintptr_t)bufs[1];
  ASSERT_EQ_U64(b % 4096, 0);
  ASSERT_EQ_U64(b - a, ((1u << 20) + 24 + 4095) & ~(uintptr_t)4095);
  ASSERT_EQ_INT(lookup_roomy(step, 0, 0, &f, &checks), 3);
  ASSERT_EQ_U64((uintptr_t)bufs[1] - (uintptr_t)bufs[0], 24 + 16);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* Publishes "a" (there already) and p0..p6 while each put takes 20 ms, so
 * that they queue, and flushes. */
static void publish_queued(encache *ec, int round) {
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  int *delay = dlsym(lib, "fake_mooncake_put_delay_us");
  dlclose(lib);
  ASSERT(delay != NULL);
  *delay = 20000;
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  char ids[8][16];
  const char *idp[8];
  encache_result r[8];
  for (int i = 0; i < 8; i++) {
    snprintf(ids[i], sizeof(ids[i]), i == 0 ? "a" : "p%d-%d", round, i);
    idp[i] = ids[i];
  }
  ASSERT_EQ_INT(lookup_fake(step, idp, 4, r), 1);
  free_results(r, 4);
  ASSERT_EQ_INT(lookup_fake(step, idp + 4, 4, r), 0);
  publish_all(step, idp, 8);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  *delay = 0;
  encache_step_close(step);
}

/* Publications queued behind a slow put have their existence asked in
 * one batch_is_exist (the writer asks ahead for the queued jobs), not one
 * each, with the same counters: the object already there is not put.  An
 * answer lives in its job: a later publication of a key that was removed
 * meanwhile asks again and is written.  Several writers give the same
 * counts.  A batch that fails sends each of its writes on to the put, as
 * vLLM's publisher does after a failed check, without asking again. */
TEST(mooncake_existence_asked_ahead) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  f.calls[F_EXIST] = f.calls[F_PUT] = 0;
  publish_queued(ec, 1);
  /* Usually 1 or 2 (the first job may be taken alone); fewer than 8 in
   * any case. */
  ASSERT(f.calls[F_EXIST] >= 1 && f.calls[F_EXIST] < 8);
  ASSERT_EQ_INT(f.calls[F_PUT], 7);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 7);
  ASSERT_EQ_U64(st.published_present, 1);
  char key[256];
  encache_key(encache_namespace_of(ec), "a", key, sizeof(key));
  ASSERT_EQ_INT(encache_store_remove(ec->store, key), 0);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  static const char *const a[] = {"a"};
  encache_result r[1];
  ASSERT_EQ_INT(lookup_fake(step, a, 1, r), 0);
  publish_all(step, a, 1);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_step_close(step);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 8);
  ASSERT_EQ_U64(st.published_present, 1);
  f.calls[F_EXIST] = f.calls[F_PUT] = 0;
  f.inject_batch[F_EXIST] = -1; /* every batch_is_exist fails */
  publish_queued(ec, 2);
  f.inject_batch[F_EXIST] = 0;
  /* The failed batch answered for its jobs: none asks again. */
  ASSERT(f.calls[F_EXIST] >= 1 && f.calls[F_EXIST] < 8);
  ASSERT_EQ_INT(f.calls[F_PUT], 8);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 16); /* "a" was put again: "written" */
  ASSERT_EQ_U64(st.published_present, 1);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
  fake_extra = ", \"store_writes_in_flight\": 3";
  ec = engine_on_fake("tcp", 4096, &f);
  fake_extra = "";
  publish_queued(ec, 3);
  encache_stats_get(ec, &st);
  ASSERT_EQ_U64(st.published_written, 7);
  ASSERT_EQ_U64(st.published_present, 1);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}
