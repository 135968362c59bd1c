/* SPDX-License-Identifier: Apache-2.0 */
#include "store_util.h"

#include "runner.h"
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char url[512];
static char shm_name[64];
static pid_t owner;

static void destroy_segment(void) {
  if (shm_name[0] && getpid() == owner)
    encache_shm_destroy(shm_name);
}

encache_store *ts_open(const char *size) {
  ts_prepare(size);
  return ts_reopen();
}

void ts_prepare(const char *size) {
  const char *env = getenv("ENCACHE_TEST_STORE");
  if (env != NULL && env[0] != '\0') {
    snprintf(url, sizeof(url), "%s", env);
  } else {
    snprintf(shm_name, sizeof(shm_name), "encache-test-%d", (int)getpid());
    snprintf(url, sizeof(url), "shm://%s?size=%s", shm_name, size);
    encache_shm_destroy(shm_name);
    owner = getpid();
    atexit(destroy_segment);
  }
}

encache_store *ts_reopen(void) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s: %s", url,
               encache_err_name(rc), encache_store_errmsg(st));
  return st;
}

void ts_key(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "t%d/%s", (int)getpid(), name);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

static uint64_t seed_of(const char *key, uint64_t version, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = key; *p; p++)
    h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return mix(h ^ mix(version) ^ mix(len + 1));
}

void ts_fill(const char *key, uint64_t version, unsigned char *buf,
             size_t len) {
  size_t i = 0;
  if (len >= 8) {
    memcpy(buf, &version, 8);
    i = 8;
  }
  uint64_t s = seed_of(key, len >= 8 ? version : 0, len);
  for (; i + 8 <= len; i += 8) {
    s = mix(s + i);
    memcpy(buf + i, &s, 8);
  }
  s = mix(s + i);
  for (; i < len; i++)
    buf[i] = (unsigned char)(s >> (8 * (i % 8)));
}

int ts_verify(const char *key, const unsigned char *buf, size_t len) {
  uint64_t version = 0;
  if (len >= 8)
    memcpy(&version, buf, 8);
  unsigned char *want = malloc(len ? len : 1);
  if (want == NULL)
    return 0;
  ts_fill(key, version, want, len);
  int ok = memcmp(want, buf, len) == 0;
  free(want);
  return ok;
}

int64_t ts_read_one(encache_store *st, const char *key, void *buf,
                    size_t cap) {
  const char *keys[1] = {key};
  void *bufs[1] = {buf};
  size_t caps[1] = {cap};
  int64_t res[1];
  int rc = encache_store_read(st, keys, 1, bufs, caps, res);
  return rc < 0 ? rc : res[0];
}

static int host_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *handle = NULL;
  *data = malloc(nbytes ? nbytes : 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void host_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

encache_allocator ts_host_allocator(void) {
  encache_allocator a = ENCACHE_ALLOCATOR_INIT;
  a.alloc = host_alloc;
  a.release = host_release;
  return a;
}

void ts_check_profile(encache_store *st, int ask_ahead) {
  const encache__store_profile *p = encache__store_profile_of(st);
  unsigned caps = encache_store_caps_of(st);
  /* lookup_read.c's choose_path and lookup.c's exists_needed, as written
   * with flags: split reads without registration go straight out. */
  ASSERT_EQ_INT(p->read_direct, (caps & ENCACHE_STORE_CAP_READ_SPLIT) &&
                                    !(caps & ENCACHE_STORE_CAP_REGISTER));
  ASSERT_EQ_INT(p->read_whole, !(caps & (ENCACHE_STORE_CAP_REGISTER |
                                         ENCACHE_STORE_CAP_READ_SPLIT)));
  ASSERT_EQ_INT(p->registered, (caps & ENCACHE_STORE_CAP_REGISTER) != 0);
  ASSERT_EQ_INT(p->read_absent, (caps & ENCACHE_STORE_CAP_READ_ABSENT) != 0);
  ASSERT_EQ_INT(p->put_if_absent,
                (caps & ENCACHE_STORE_CAP_PUT_IF_ABSENT) != 0);
  ASSERT_EQ_INT(p->lease, (caps & ENCACHE_STORE_CAP_LEASE) != 0);
  ASSERT_EQ_INT(p->ask_ahead, ask_ahead);
  /* publish.c's writes_in_flight: ENCACHE__WRITERS (2) on a shared Store
   * whose calls do not poll. */
  ASSERT_EQ_INT(p->writes_in_flight, (caps & ENCACHE_STORE_CAP_SHARED) &&
                                             !(caps & ENCACHE_STORE_CAP_BUSY_WAIT)
                                         ? 2
                                         : 1);
}
