/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm Store's eviction: when full, its second chance for objects
 * read, and a read racing the replacement of its object.
 * The helpers several of these files share are in tests/shm_util.c.
 */
#include "shm_util.h"

#include "shm/testing.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TEST(shm_evicts_when_full_and_refuses_too_large) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT_EQ_STR(s.kind, "shm");
  uint64_t cap = s.capacity;
  ASSERT(cap > (3u << 20) && cap < (4u << 20));
  for (int i = 0; i < 200; i++) {
    char key[32];
    snprintf(key, sizeof(key), "obj-%03d", i);
    put(st, key, 64 << 10, (uint64_t)i);
  }
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.evictions > 100);
  ASSERT(s.bytes_used <= s.capacity);
  ASSERT(s.objects * (64u << 10) <= s.capacity);
  unsigned char *out = malloc(64 << 10);
  assert_hit(st, "obj-199", 64 << 10);
  ASSERT_EQ_INT(ts_read_one(st, "obj-000", out, 64 << 10), ENCACHE_ENOENT);
  free(out);
  /* An object that cannot fit the segment is refused, not half-stored. */
  unsigned char *big = calloc(1, 4u << 20);
  ASSERT_EQ_INT(encache_store_write(st, "huge", NULL, 0, big, 4u << 20),
                ENCACHE_ETOOLARGE);
  ASSERT_CONTAINS(encache_store_errmsg(st), "does not fit");
  free(big);
  /* Tiny objects beyond the entry table evict by entry count. */
  for (int i = 0; i < 3000; i++) {
    char key[32];
    snprintf(key, sizeof(key), "tiny-%d", i);
    put(st, key, 8, (uint64_t)i);
  }
  unsigned char t[8];
  ASSERT_EQ_INT(ts_read_one(st, "tiny-2999", t, 8), 8);
  encache_store_close(st);
}

TEST(shm_second_chance_keeps_read_objects) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  unsigned char *out = malloc(64 << 10);
  put(st, "hot", 64 << 10, 1);
  put(st, "cold", 64 << 10, 1);
  for (int i = 0; i < 300; i++) {
    if (i % 10 == 0)
      ASSERT_EQ_INT(ts_read_one(st, "hot", out, 64 << 10), 64 << 10);
    char key[32];
    snprintf(key, sizeof(key), "filler-%d", i);
    put(st, key, 64 << 10, (uint64_t)i);
  }
  assert_hit(st, "hot", 64 << 10);
  ASSERT_EQ_INT(ts_read_one(st, "cold", out, 64 << 10), ENCACHE_ENOENT);
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.reinsertions >= 5);
  free(out);
  encache_store_close(st);
}

static encache_store *hook_store;
static void remove_during_read(void) {
  ASSERT_EQ_INT(encache_store_remove(hook_store, "victim"), 0);
  put(hook_store, "victim", 4096, 2); /* same key, new object, maybe same place */
}

TEST(shm_miss_when_object_replaced_while_read) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  hook_store = reopen(url);
  put(st, "victim", 4096, 1);
  unsigned char out[4096];
  encache__shm_read_hook = remove_during_read;
  ASSERT_EQ_INT(ts_read_one(st, "victim", out, sizeof(out)), ENCACHE_ENOENT);
  encache__shm_read_hook = NULL;
  ASSERT_EQ_INT(ts_read_one(st, "victim", out, sizeof(out)), 4096);
  uint64_t v;
  memcpy(&v, out, 8);
  ASSERT_EQ_U64(v, 2);
  encache_store_close(hook_store);
  encache_store_close(st);
}
