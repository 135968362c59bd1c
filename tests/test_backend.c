/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Store door (src/store/front.c, base.c): users' backends and their
 * checks, scheme registration, messages scoped to handles, the one
 * classification of answers, the control call and the profile, callers'
 * struct sizes, and the allocator hook.
 */
#include "runner.h"
#include "dir_store.h"
#include "store_util.h"
#include "base.h"
#include "prefix.h"

#include <fnmatch.h>
#include <regex.h>
#include <stdlib.h>
#include <unistd.h>

static char dir_url[256];

/* A fresh testdir:// Store in a private directory (removed at exit). */
static void remove_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir_url + strlen("testdir://"));
  if (system(cmd) != 0)
    fprintf(stderr, "# could not remove %s\n", dir_url);
}

static encache_store *open_dir(void) {
  snprintf(dir_url, sizeof(dir_url), "testdir:///tmp/encache-dir-%d",
           (int)getpid());
  atexit(remove_dir);
  encache_store *st = NULL;
  int rc = encache_store_open(dir_url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", dir_url,
               encache_store_errmsg(NULL));
  return st;
}

TEST(backend_checks_name_what_is_wrong) {
  encache_store_backend b = *dir_store_backend();
  encache_store *st = (encache_store *)1;
  b.version = 2;
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), ENCACHE_EINVAL);
  ASSERT(st == NULL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "version 2");
  b = *dir_store_backend();
  /* Smaller than API 1.0's table (which ends before remove_prefix). */
  b.size = offsetof(encache_store_backend, remove_prefix) - sizeof(void *);
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "is not this library's");
  b = *dir_store_backend();
  b.remove = NULL;
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "are required");
  b = *dir_store_backend();
  b.caps &= ~(unsigned)ENCACHE_STORE_CAP_LIST; /* list given, flag off */
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "list is given");
  b = *dir_store_backend();
  b.caps |= ENCACHE_STORE_CAP_READ_SPLIT; /* flag on, no function */
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "read_split is NULL");
  b = *dir_store_backend();
  ASSERT_EQ_INT(encache_store_new(&b, NULL, "x://u:p@h", &st), 0);
  ASSERT_EQ_INT(encache_store_caps_of(st), b.caps);
  encache_store_free(st);
}

static int never_open(const char *url, void *arg, encache_store **out) {
  (void)url;
  (void)arg;
  *out = NULL;
  return encache_store_fail(NULL, ENCACHE_EUNAVAIL, "never opens");
}

TEST(backend_registration_rules) {
  ASSERT_EQ_INT(encache_store_register("shm", never_open, NULL), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_register("testdir", never_open, NULL),
                ENCACHE_EEXIST);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "already taken");
  ASSERT_EQ_INT(encache_store_register("a/b", never_open, NULL), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_register("", never_open, NULL), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_register("ok", NULL, NULL), ENCACHE_EINVAL);
  /* Up to 16 schemes (testdir is one); a failing open leaves no handle. */
  int registered = 1;
  for (int i = 0; i < 20; i++) {
    char name[16];
    snprintf(name, sizeof(name), "never%d", i);
    int rc = encache_store_register(name, never_open, NULL);
    ASSERT(rc == 0 || rc == ENCACHE_ENOBUFS);
    registered += rc == 0;
  }
  ASSERT_EQ_INT(registered, 16);
  encache_store *st = (encache_store *)1;
  ASSERT_EQ_INT(encache_store_open("never3://anything", &st), ENCACHE_EUNAVAIL);
  ASSERT(st == NULL);
  ASSERT_EQ_STR(encache_store_errmsg(NULL), "never opens");
  ASSERT_EQ_INT(encache_store_open("never19://x", &st), ENCACHE_EURL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "unknown Store URL scheme");
}

TEST(backend_user_store_round_trip_and_messages) {
  encache_store *st = open_dir();
  ASSERT_EQ_STR(encache_store_url(st), dir_url);
  ASSERT_EQ_INT(encache_store_caps_of(st) & ENCACHE_STORE_CAP_PUT_IF_ABSENT,
                ENCACHE_STORE_CAP_PUT_IF_ABSENT);
  ASSERT_EQ_INT(encache_store_write(st, "k1", "hdr", 3, "payload", 7), 0);
  ASSERT_EQ_INT(encache_store_write(st, "k1", "x", 1, NULL, 0), ENCACHE_EEXIST);
  /* The message belongs to this handle and this thread. */
  ASSERT_CONTAINS(encache_store_errmsg(st), "k1 exists");
  encache_store *other = open_dir();
  ASSERT_EQ_STR(encache_store_errmsg(other), "");
  char buf[16];
  void *bufs[1] = {buf};
  size_t caps[1] = {sizeof(buf)};
  const char *keys[1] = {"k1"};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(other, keys, 1, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[0], 10);
  ASSERT_EQ_MEM(buf, "hdrpayload", 10);
  encache_store_close(other);
  /* Stats through a caller's struct of another size. */
  struct {
    encache_store_stats s;
    uint64_t future_field;
  } big;
  memset(&big, 0x77, sizeof(big));
  big.s.size = sizeof(big);
  ASSERT_EQ_INT(encache_store_stats_get(st, &big.s), 0);
  ASSERT_EQ_STR(big.s.kind, "testdir");
  ASSERT_EQ_U64(big.s.objects, 1);
  ASSERT_EQ_U64(big.future_field, 0); /* what this library does not know */
  encache_store_stats small = {.size = offsetof(encache_store_stats, kind)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &small), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "API 1.0's is");
  /* A size nobody set (garbage) is refused, never trusted. */
  encache_store_stats unset;
  memset(&unset, 0xA5, sizeof(unset));
  ASSERT_EQ_INT(encache_store_stats_get(st, &unset), ENCACHE_EINVAL);
  encache_store_close(st);
}

TEST(backend_answers_classified_once) {
  static const struct {
    int64_t rc;
    int answer;
  } table[] = {{0, ENCACHE_ANSWER_OK},
               {1, ENCACHE_ANSWER_OK},
               {1 << 20, ENCACHE_ANSWER_OK},
               {ENCACHE_ENOENT, ENCACHE_ANSWER_ABSENT},
               {ENCACHE_EEXIST, ENCACHE_ANSWER_EXISTS},
               {ENCACHE_ETOOLARGE, ENCACHE_ANSWER_TOO_LARGE},
               {ENCACHE_EUNAVAIL, ENCACHE_ANSWER_RECOVERABLE},
               {ENCACHE_EINVAL, ENCACHE_ANSWER_RECOVERABLE},
               {ENCACHE_ENOMEM, ENCACHE_ANSWER_RECOVERABLE},
               {ENCACHE_EUNCONFIRMED, ENCACHE_ANSWER_UNCONFIRMED},
               {ENCACHE_EIO, ENCACHE_ANSWER_UNCONFIRMED},
               {-30699, ENCACHE_ANSWER_UNCONFIRMED},
               {INT64_MIN, ENCACHE_ANSWER_UNCONFIRMED}};
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    ASSERT_EQ_INT(encache_store_classify(table[i].rc), table[i].answer);
}

static long counted[3]; /* malloc-like, aligned, free */
static void *count_malloc(size_t n) { counted[0]++; return malloc(n); }
static void *count_calloc(size_t n, size_t s) { counted[0]++; return calloc(n, s); }
static void *count_realloc(void *p, size_t n) { counted[0]++; return realloc(p, n); }
static void count_free(void *p) { counted[2]++; free(p); }

TEST(backend_allocator_hook_sees_every_block) {
  encache_allocfuncs half = {sizeof(half), count_malloc, NULL, NULL, NULL, NULL};
  ASSERT_EQ_INT(encache_set_allocators(&half, NULL), ENCACHE_EINVAL);
  encache_allocfuncs f = {sizeof(f), count_malloc, count_calloc, count_realloc,
                          count_free, NULL};
  ASSERT_EQ_INT(encache_set_allocators(&f, NULL), 0);
  encache_store *st = ts_open("16MiB");
  ASSERT_EQ_INT(encache_store_write(st, "a", "x", 1, NULL, 0), 0);
  encache_store_close(st);
  encache_allocfuncs old = {.size = sizeof(old)};
  ASSERT_EQ_INT(encache_set_allocators(NULL, &old), 0);
  ASSERT(old.malloc_fn == count_malloc && old.free_fn == count_free);
  ASSERT(counted[0] > 0);
  ASSERT_EQ_INT(counted[2], counted[0]); /* every block came back */
}

/* The struct-size rule on the structs of keys and objects: a struct
 * older than 1.0 is refused, a newer one is read when what this library
 * does not know is zero, and refused when it is set. */
TEST(abi_sizes_of_key_and_object_structs) {
  struct {
    encache_namespace_params p;
    uint64_t future;
  } np = {{sizeof np, NULL, "m", NULL, NULL, ENCACHE_FLOAT32}, 0};
  char ns[256];
  ASSERT(encache_namespace(&np.p, ns, sizeof(ns)) > 0);
  np.future = 1;
  ASSERT_EQ_INT(encache_namespace(&np.p, ns, sizeof(ns)), ENCACHE_EINVAL);
  np.future = 0;
  np.p.size = sizeof(np.p) - 1;
  ASSERT_EQ_INT(encache_namespace(&np.p, ns, sizeof(ns)), ENCACHE_EINVAL);

  int64_t shape[2] = {2, 3};
  struct {
    encache_tensor t;
    uint64_t future;
  } tv = {{sizeof tv, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL}, 0};
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  ASSERT_EQ_INT(encache_header_encode(&tv.t, hdr), 0);
  tv.future = 7;
  ASSERT_EQ_INT(encache_header_encode(&tv.t, hdr), ENCACHE_EINVAL);
  encache_tensor zero = {0, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&zero, hdr), ENCACHE_EINVAL);
}

static int never_called(encache_store *st, const char *prefix,
                        uint64_t *removed) {
  (void)st, (void)prefix, (void)removed;
  test__fail(__FILE__, __LINE__, "remove_prefix read beyond a 1.0 table");
}

static int answers_42(encache_store *st, const char *prefix,
                      uint64_t *removed) {
  (void)st;
  *removed = strcmp(prefix, "p@id:") == 0 ? 42 : 0;
  return 0;
}

static void put_five(encache_store *st) {
  static const char *const keys[] = {"old@id:1", "old@id:2", "old@idx",
                                     "old@id", "new@id:1"};
  for (size_t i = 0; i < 5; i++)
    ASSERT_EQ_INT(encache_store_write(st, keys[i], "h", 1, "body", 4), 0);
}

/* A backend built against the 1.0 header has no remove_prefix: its table
 * is accepted, nothing beyond its size is read, and a purge lists and
 * removes.  A backend's own remove_prefix is what the door calls. */
TEST(backend_remove_prefix_on_a_table_of_api_1_0) {
  encache_store *st = open_dir(), *old = NULL;
  static encache_store_backend b10, b;
  b10 = *dir_store_backend();
  b10.size = offsetof(encache_store_backend, remove_prefix);
  b10.caps &= ~(unsigned)ENCACHE_STORE_CAP_LEASE; /* 1.0 had no leases */
  b10.remove_prefix = never_called; /* beyond its size: never read */
  ASSERT_EQ_INT(dir_store_open_as(&b10, dir_url, &old), 0);
  put_five(old);
  uint64_t n = 0, bytes = 0;
  ASSERT_EQ_INT(encache_store_count_prefix(old, "old@id:", &n, &bytes), 0);
  ASSERT_EQ_U64(n, 2);
  ASSERT_EQ_U64(bytes, 10);
  ASSERT_EQ_INT(encache_store_remove_prefix(old, "old@id:", &n), 0);
  ASSERT_EQ_U64(n, 2);
  ASSERT_EQ_INT(encache_store_count_prefix(st, "old@id:", &n, NULL), 0);
  ASSERT_EQ_U64(n, 0);
  ASSERT_EQ_INT(encache_store_count_prefix(st, "old@", &n, NULL), 0);
  ASSERT_EQ_U64(n, 2); /* "old@idx" and "old@id": not under "old@id:" */
  encache_store_close(old);
  /* The flag on a 1.0 table, or without the function, is refused. */
  b10.caps |= ENCACHE_STORE_CAP_REMOVE_PREFIX;
  ASSERT_EQ_INT(dir_store_open_as(&b10, dir_url, &old), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "remove_prefix is NULL");
  b = *dir_store_backend();
  b.remove_prefix = answers_42; /* given, flag off */
  ASSERT_EQ_INT(dir_store_open_as(&b, dir_url, &old), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "remove_prefix is given");
  b.caps |= ENCACHE_STORE_CAP_REMOVE_PREFIX;
  ASSERT_EQ_INT(dir_store_open_as(&b, dir_url, &old), 0);
  ASSERT_EQ_INT(encache_store_remove_prefix(old, "p@id:", &n), 0);
  ASSERT_EQ_U64(n, 42);
  encache_store_close(old);
  /* Neither a listing nor a remove_prefix: said so. */
  b = *dir_store_backend();
  b.caps &= ~(unsigned)ENCACHE_STORE_CAP_LIST;
  b.list = NULL;
  ASSERT_EQ_INT(dir_store_open_as(&b, dir_url, &old), 0);
  ASSERT_EQ_INT(encache_store_remove_prefix(old, "old@", &n), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(old), "neither list its keys");
  ASSERT_EQ_INT(encache_store_count_prefix(old, "old@", &n, NULL),
                ENCACHE_EINVAL);
  encache_store_close(old);
  encache_store_close(st);
}

/* The prefix as a shell pattern (shm, Redis) and as Mooncake's regex:
 * every special character is literal, and the regex is anchored.  POSIX
 * extended regexes read these escapes as ECMAScript does. */
TEST(backend_prefix_patterns_escape_every_special_character) {
  static const char ns[] = "a*b?c[d]e\\f.g^h$i+j(k)l{1}m|n/o@id:";
  char *glob = encache__prefix_glob(ns), *re = encache__prefix_regex(ns);
  ASSERT(glob != NULL && re != NULL);
  ASSERT_EQ_STR(glob, "a\\*b\\?c\\[d\\]e\\\\f.g^h$i+j(k)l{1}m|n/o@id:*");
  ASSERT_EQ_STR(re, "^a\\*b\\?c\\[d\\]e\\\\f\\.g\\^h\\$i\\+j\\(k\\)l\\{1\\}m\\|n/o@id:");
  regex_t rx;
  ASSERT_EQ_INT(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
  char key[128];
  snprintf(key, sizeof(key), "%sx", ns);
  ASSERT_EQ_INT(fnmatch(glob, key, 0), 0);
  ASSERT_EQ_INT(regexec(&rx, key, 0, NULL, 0), 0);
  snprintf(key, sizeof(key), "z%s", ns); /* not at the start */
  ASSERT(fnmatch(glob, key, 0) != 0);
  ASSERT(regexec(&rx, key, 0, NULL, 0) != 0);
  for (size_t i = 0; ns[i]; i++) {
    if (strchr("*?[]\\.^$+(){}|", ns[i]) == NULL)
      continue;
    snprintf(key, sizeof(key), "%sx", ns);
    key[i] = 'Q'; /* what an unescaped character would let through */
    if (fnmatch(glob, key, 0) == 0 || regexec(&rx, key, 0, NULL, 0) == 0)
      test__fail(__FILE__, __LINE__, "%s matches %s / %s", key, glob, re);
  }
  regfree(&rx);
  free(glob);
  free(re);
}

static int ctl_calls;

/* A control that knows ENCACHE_STORE_CONTROL_WRITE_KNOWN (and refuses
 * the write itself); or none of the requests. */
static int ctl_knows_write(encache_store *st, int op, void *arg) {
  (void)st;
  ctl_calls++;
  if (op != ENCACHE_STORE_CONTROL_WRITE_KNOWN)
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  return arg == NULL ? 0 : ENCACHE_EUNAVAIL;
}

static int ctl_knows_nothing(encache_store *st, int op, void *arg) {
  (void)st;
  (void)op;
  (void)arg;
  ctl_calls++;
  return ENCACHE_STORE_CONTROL_UNKNOWN;
}

/* A backend without control, one whose table ends before it, and one
 * that does not know the request all answer ENCACHE_STORE_CONTROL_UNKNOWN
 * (not supported: no asking ahead); one that knows it answers it. */
TEST(backend_control_unknown_means_not_supported) {
  encache_store_backend b = *dir_store_backend();
  encache_store *st = NULL;
  encache_store_write_known w = {sizeof(w), "k", NULL, 0, "x", 1, 0};
  uint64_t epoch = 0;
  ASSERT(b.control == NULL);
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), 0);
  ASSERT_EQ_INT(encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN,
                                       NULL),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  ASSERT_EQ_INT(encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN,
                                       &w),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  ASSERT_EQ_INT(encache__store_profile_of(st)->ask_ahead, 0);
  ts_check_profile(st, 0);
  encache_store_free(st);

  /* API 1.0's table ends before control: it is never read. */
  b.caps &= ~(unsigned)(ENCACHE_STORE_CAP_REMOVE_PREFIX |
                        ENCACHE_STORE_CAP_LEASE);
  b.size = ENCACHE__BACKEND_SIZE_1_0;
  b.control = ctl_knows_write;
  ctl_calls = 0;
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), 0);
  ASSERT_EQ_INT(encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN,
                                       &w),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  ASSERT_EQ_INT(ctl_calls, 0);
  ts_check_profile(st, 0);
  encache_store_free(st);

  b = *dir_store_backend();
  b.control = ctl_knows_nothing;
  ctl_calls = 0;
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), 0);
  /* Asked at open, once per request the profile asks about
   * (ENCACHE_STORE_CONTROL_WRITE_KNOWN, ENCACHE__CONTROL_UNCHECKED). */
  ASSERT_EQ_INT(ctl_calls, 2);
  ASSERT_EQ_INT(encache__store_control(st, 12345, &w),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  ts_check_profile(st, 0);
  encache_store_free(st);

  b.control = ctl_knows_write;
  ASSERT_EQ_INT(encache_store_new(&b, NULL, NULL, &st), 0);
  ts_check_profile(st, 1);
  ASSERT_EQ_INT(encache__store_control(st, 12345, &w),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  /* The built-in backends' own requests are nobody else's. */
  ASSERT_EQ_INT(encache__store_control(st, ENCACHE__CONTROL_PURGE_EPOCH,
                                       &epoch),
                ENCACHE_STORE_CONTROL_UNKNOWN);
  ASSERT_EQ_INT(encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN,
                                       &w),
                ENCACHE_EUNAVAIL);
  encache_store_free(st);
}

/* The profile of each built-in Store (Mooncake's: test_mooncake_store.c) is
 * what the engine's flag tests chose; only shm knows the purge epoch; Redis
 * (and a tier in front of it) counts the objects served without a check. */
TEST(backend_profiles_of_the_built_in_stores) {
  char name[64], url[256];
  snprintf(name, sizeof(name), "encache-profile-%d", (int)getpid());
  encache_shm_destroy(name);
  /* Redis connects at the first call: none is made. */
  const char *tail[] = {"", "redis://127.0.0.1:1",
                        "unix:///nonexistent/redis.sock",
                        "+redis://127.0.0.1:1"};
  for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++) {
    encache_store *st = NULL;
    if (i == 1 || i == 2)
      snprintf(url, sizeof(url), "%s", tail[i]);
    else
      snprintf(url, sizeof(url), "%sshm://%s?size=4M%s", i ? "tier:" : "",
               name, tail[i]);
    if (encache_store_open(url, &st) != 0)
      test__fail(__FILE__, __LINE__, "open %s: %s", url,
                 encache_store_errmsg(NULL));
    ts_check_profile(st, 0);
    ASSERT_EQ_INT(encache__store_profile_of(st)->unchecked, i != 0);
    uint64_t epoch = 1;
    ASSERT_EQ_INT(encache__store_control(st, ENCACHE__CONTROL_PURGE_EPOCH,
                                         &epoch),
                  i == 0 ? 0 : ENCACHE_STORE_CONTROL_UNKNOWN);
    encache_store_close(st);
  }
  encache_shm_destroy(name);
}
