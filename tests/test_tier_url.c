/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiered Store's URL (src/store/tier*.c): errors that name what is
 * wrong, the URL shown redacted, the caps of both tiers.
 * On a real shm segment in front of a real redis-server that each test
 * starts on a free port; tests say "skipped" and pass without
 * redis-server.  The world they share is in tests/tier_util.c.
 */
#include "tier_util.h"

#include "fault_store.h"
#include "redis_util.h"
#include "runner.h"
#include "engine.h"
#include "shm/testing.h"
#include "tier.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(tier_url_errors_name_what_is_wrong) {
  static const struct {
    const char *url, *says;
  } bad[] = {
      {"tier:", "nothing after 'tier:'"},
      {"tier:shm://x?size=1MiB", "no '+'"},
      {"tier:shm://x?size=1MiB+", "remote Store URL after '+' is missing"},
      {"tier:redis://u:secret@h:1+redis://h:2", "must be an shm:// Store"},
      /* A password in the remote part, whatever the local part is. */
      {"tier:redis://h:1?timeout_ms=5+redis://v:secret@h2:1", "must be an shm:// Store"},
      {"tier:shm:/rvz?size=1MiB+redis://v:secret@h2:1", "must be an shm:// Store"},
      {"tier:tier:shm://x+redis://u:secret@h:1", "not a tier"},
      {"tier:shm://x+tier:shm://y+redis://u:secret@h:1", "a tier of a tier"},
      {"tier:shm://x+shm://u:secret@y", "host-local shm"},
      {"tier:shm://x?promote_queue_items=0+redis://u:secret@h:1",
       "promote_queue_items=0: must be 1 to 1000000"},
      {"tier:shm://x?promote_queue_bytes=lots+redis://u:secret@h:1",
       "promote_queue_bytes=lots: must be a size of at least 64KiB"},
      {"tier:shm://x?promote_queue_bytes=1KiB+redis://u:secret@h:1",
       "promote_queue_bytes=1KiB: must be a size of at least 64KiB"},
      {"tier:shm://x?size=1MiB&bogus=1+redis://u:secret@h:1", "unknown option 'bogus'"},
      {"tier:shm://x?size=1MiB&(=1+redis://u:secret@h:1", "the local tier"},
      {"tier:shm://bad name+redis://u:secret@h:1", "the local tier"},
      {"tier:shm://x?size=1MiB+redis://u:secret@h:1?bogus=2", "the remote tier"},
      {"tier:shm://x?size=1MiB+nosuch://u:secret@h", "the remote tier"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    encache_store *st = (encache_store *)1;
    int rc = encache_store_open(bad[i].url, &st);
    ASSERT(rc < 0);
    ASSERT(st == NULL);
    ASSERT_CONTAINS(encache_store_errmsg(NULL), bad[i].says);
    if (strstr(encache_store_errmsg(NULL), "secret") != NULL)
      test__fail(__FILE__, __LINE__, "%s: the message shows the password: %s",
                 bad[i].url, encache_store_errmsg(NULL));
  }
  /* A remote part that does not open leaves no segment behind. */
  char url[128], path[128];
  snprintf(url, sizeof(url), "tier:shm://encache-tier-rv-%d?size=1MiB+nosuch://h",
           (int)getpid());
  snprintf(path, sizeof(path), "/dev/shm/encache-encache-tier-rv-%d",
           (int)getpid());
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_EURL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "the remote tier nosuch://h");
  if (access(path, F_OK) == 0) {
    encache_shm_destroy(path + strlen("/dev/shm/encache-"));
    test__fail(__FILE__, __LINE__, "%s: left %s behind", url, path);
  }
}

TEST(tier_url_shown_redacted_and_caps_of_both_tiers) {
  /* The remote is not reached at open (Redis connects on first use). */
  char name[64], url[256];
  snprintf(name, sizeof(name), "encache-tier-url-%d", (int)getpid());
  snprintf(exit_shm, sizeof(exit_shm), "%s", name); /* if it fails */
  atexit(world_exit);
  snprintf(url, sizeof(url),
           "tier:shm://%s?size=1MiB&promote_queue_items=4+redis://u:p+w@d@"
           "127.0.0.1:1?connect_timeout_ms=100",
           name);
  encache_store *st = open_url(url);
  char want[256];
  snprintf(want, sizeof(want),
           "tier:shm://%s?size=1MiB&promote_queue_items=4+redis://u:***@"
           "127.0.0.1:1?connect_timeout_ms=100",
           name);
  ASSERT_EQ_STR(encache_store_url(st), want);
  unsigned caps = encache_store_caps_of(st);
  ASSERT(caps & ENCACHE_STORE_CAP_READ_SPLIT);
  ASSERT(caps & ENCACHE_STORE_CAP_LIST);
  ASSERT(caps & ENCACHE_STORE_CAP_PUT_IF_ABSENT);
  ASSERT(caps & ENCACHE_STORE_CAP_REMOVE_PREFIX);
  ASSERT(caps & ENCACHE_STORE_CAP_LEASE);
  ASSERT(!(caps & ENCACHE_STORE_CAP_REGISTER));
  encache_store_stats s = stats_of(st);
  ASSERT_EQ_STR(s.kind, "tier");
  ASSERT_EQ_U64(s.tier_local_hits, 0);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 0);
  /* The remote is down: a lookup says so, naming the remote tier. */
  const char *k = "nothing";
  int r;
  int rc = encache_store_exists(st, &k, 1, &r);
  ASSERT(rc < 0 || r < 0);
  ASSERT_EQ_INT(encache_store_classify(rc < 0 ? rc : r),
                ENCACHE_ANSWER_RECOVERABLE);
  /* The remote's own message, relayed whole: the tier once, the host once. */
  const char *m = encache_store_errmsg(st);
  const char *head =
      "remote tier: redis://u:***@127.0.0.1:1?connect_timeout_ms=100: ";
  if (strncmp(m, head, strlen(head)) != 0)
    test__fail(__FILE__, __LINE__, "relayed as \"%s\", not from \"%s\"", m,
               head);
  ASSERT_CONTAINS(m, "Connection refused");
  ASSERT(strstr(m + 1, "remote tier") == NULL);
  ASSERT(strstr(m + strlen("remote tier: r"), "redis://") == NULL);
  encache_store_close(st);
  encache_shm_destroy(name);
  /* Other Stores say they have no tier counters. */
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  st = open_url(url);
  s = stats_of(st);
  ASSERT_EQ_U64(s.tier_local_hits, UINT64_MAX);
  /* A caller built before 1.3 (a struct without the tier fields). */
  encache_store_stats old;
  memset(&old, 0x5a, sizeof(old));
  old.size = offsetof(encache_store_stats, tier_local_hits);
  ASSERT_EQ_INT(encache_store_stats_get(st, &old), 0);
  ASSERT_EQ_U64(old.tier_local_hits, 0x5a5a5a5a5a5a5a5aull); /* untouched */
  encache_store_close(st);
  encache_shm_destroy(name);
  exit_shm[0] = '\0';
}
