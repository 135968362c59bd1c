/* SPDX-License-Identifier: Apache-2.0 */
#include "store_util.h"

#include "runner.h"

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
