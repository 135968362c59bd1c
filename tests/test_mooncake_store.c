/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Mooncake Store on the stand-in library: the purge by regex, the
 * namespaces it cannot list, a key asked twice in one read, the caps of
 * each protocol.
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
