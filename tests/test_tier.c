/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tier.c: the tiered Store (src/store/tier*.c) on a real shm segment
 * in front of a real redis-server that each test starts on a free port
 * (and kills, to take the remote tier away).  The remote is wrapped in
 * the fault Store (tests/fault_store.c), whose counters prove when the
 * remote tier was not asked.  The Store conformance suite and the
 * engine's acceptance cases run on a tier URL too (tests/on_tier.sh).
 * Tests say "skipped" and pass without redis-server.  One file for the
 * tier's suite (about 780 lines), its helpers shared by every test.
 */
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

#define ROWS 4
#define COLS 8
#define OBJ_LEN (ENCACHE_HEADER_SIZE + ROWS * COLS * 4)

/* One test's world: a redis-server, a segment, the tier over both. */
typedef struct world {
  pid_t redis;
  int port;
  char shm[64], local_url[128], remote_url[128];
  fault_ctl ctl;
  encache_store *tier, *local, *remote; /* local, remote: handles of our own */
} world;

/* What the exit handler cleans up when a test fails half way (a test
 * that ends cleans up in world_stop()): copies, not pointers into the
 * test's stack, which is gone by then. */
static pid_t exit_redis;
static char exit_shm[64];

static void world_exit(void) {
  if (exit_redis > 0)
    kill_wait(exit_redis, SIGKILL);
  exit_redis = 0;
  if (exit_shm[0])
    encache_shm_destroy(exit_shm);
  exit_shm[0] = '\0';
}

static encache_store *open_url(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url,
               encache_store_errmsg(NULL));
  return st;
}

/* Starts the world: 0, or -1 when redis-server is missing (skip). */
static int world_start(world *w, const char *size, size_t items,
                       uint64_t bytes) {
  memset(w, 0, sizeof(*w));
  if (!redis_have())
    return -1;
  w->port = free_port();
  w->redis = exit_redis = spawn_redis(w->port, NULL);
  snprintf(w->shm, sizeof(w->shm), "encache-tier-%d", (int)getpid());
  snprintf(exit_shm, sizeof(exit_shm), "%s", w->shm);
  atexit(world_exit);
  encache_shm_destroy(w->shm);
  snprintf(w->local_url, sizeof(w->local_url), "shm://%s?size=%s", w->shm,
           size);
  snprintf(w->remote_url, sizeof(w->remote_url),
           "redis://127.0.0.1:%d?connect_timeout_ms=2000&timeout_ms=5000",
           w->port);
  fault_ctl_init(&w->ctl);
  encache_store *remote = fault_store_wrap(open_url(w->remote_url), &w->ctl);
  ASSERT_EQ_INT(encache__tier_wrap(open_url(w->local_url), remote, "tier:test",
                                   items, bytes, &w->tier),
                0);
  w->local = open_url(w->local_url);
  w->remote = open_url(w->remote_url);
  return 0;
}

/* Closes the handles, stops the server (unless the test did) and removes
 * the segment. */
static void world_stop(world *w) {
  encache_store_close(w->tier);
  encache_store_close(w->local);
  encache_store_close(w->remote);
  exit_redis = w->redis; /* 0 when the test killed it */
  world_exit();
}

/* A well-formed v3 object (float32 ROWS x COLS) whose payload depends on
 * seed. */
static void make_obj(unsigned char *obj, unsigned seed) {
  float v[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++)
    v[i] = (float)(seed * 100 + (unsigned)i);
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  memcpy(obj + ENCACHE_HEADER_SIZE, v, sizeof(v));
}

static void put(encache_store *st, const char *key, unsigned seed) {
  unsigned char obj[OBJ_LEN];
  make_obj(obj, seed);
  int rc = encache_store_write(st, key, NULL, 0, obj, OBJ_LEN);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "write %s: %s: %s", key,
               encache_err_name(rc), encache_store_errmsg(st));
}

static void key_of(char *buf, const char *name) {
  snprintf(buf, 64, "t%d/%s", (int)getpid(), name);
}

/* Reads n keys through st; results in res, objects checked against seeds
 * (seed 0: not checked). */
static void read_n(encache_store *st, char keys[][64], int n, int64_t *res,
                   const unsigned *seeds) {
  unsigned char buf[16][OBJ_LEN], want[OBJ_LEN];
  const char *k[16];
  void *bufs[16];
  size_t caps[16];
  ASSERT(n <= 16);
  for (int i = 0; i < n; i++) {
    k[i] = keys[i];
    bufs[i] = buf[i];
    caps[i] = OBJ_LEN;
  }
  ASSERT_EQ_INT(encache_store_read(st, k, (size_t)n, bufs, caps, res), 0);
  for (int i = 0; seeds != NULL && i < n; i++)
    if (seeds[i] != 0 && res[i] == OBJ_LEN) {
      make_obj(want, seeds[i]);
      ASSERT_EQ_MEM(buf[i], want, OBJ_LEN);
    }
}

static int has(encache_store *st, const char *key) {
  int r = -1;
  ASSERT_EQ_INT(encache_store_exists(st, &key, 1, &r), 0);
  return r;
}

static encache_store_stats stats_of(encache_store *st) {
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  return s;
}

/* ------------------------------------------------------------- the URL */

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

/* ----------------------------------------------------------- lookups */

TEST(tier_local_hit_never_asks_the_remote) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  unsigned seeds[3] = {1, 2, 3};
  for (int i = 0; i < 3; i++) {
    key_of(keys[i], i == 0 ? "a" : i == 1 ? "b" : "c");
    put(w.tier, keys[i], seeds[i]);
    ASSERT_EQ_INT(has(w.local, keys[i]), 1); /* written to both */
    ASSERT_EQ_INT(has(w.remote, keys[i]), 1);
  }
  int exists0 = w.ctl.exists_calls, read0 = w.ctl.read_calls;
  int64_t res[3];
  const char *k[3] = {keys[0], keys[1], keys[2]};
  int present[3];
  ASSERT_EQ_INT(encache_store_exists(w.tier, k, 3, present), 0);
  ASSERT(present[0] == 1 && present[1] == 1 && present[2] == 1);
  read_n(w.tier, keys, 3, res, seeds);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  ASSERT_EQ_INT(w.ctl.exists_calls, exists0); /* the remote never asked */
  ASSERT_EQ_INT(w.ctl.read_calls, read0);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 3);
  ASSERT_EQ_U64(s.tier_remote_hits, 0);
  /* With the remote server gone, local hits are still hits. */
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  read_n(w.tier, keys, 3, res, seeds);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  world_stop(&w);
}

TEST(tier_remote_hit_is_promoted_then_local) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  unsigned seeds[3] = {7, 8, 0};
  key_of(keys[0], "local");
  key_of(keys[1], "remote");
  key_of(keys[2], "absent");
  put(w.tier, keys[0], 7);
  put(w.remote, keys[1], 8); /* another host published it */
  int read0 = w.ctl.read_calls;
  int64_t res[3];
  read_n(w.tier, keys, 3, res, seeds);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  ASSERT_EQ_INT(res[2], ENCACHE_ENOENT);
  ASSERT_EQ_INT(w.ctl.read_calls, read0 + 1); /* one batch for both */
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, keys[1]), 1); /* promoted */
  ASSERT_EQ_INT(has(w.local, keys[2]), 0);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 1);
  ASSERT_EQ_U64(s.tier_remote_hits, 1);
  ASSERT_EQ_U64(s.tier_promotions_queued, 1);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 0);
  /* The next lookup of it is a local hit: the remote is not asked. */
  read_n(w.tier, keys, 2, res, seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  ASSERT_EQ_INT(w.ctl.read_calls, read0 + 1);
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_local_hits, 3);
  /* Split reads (the engine's) promote the whole object too. */
  char k2[64];
  key_of(k2, "split");
  put(w.remote, k2, 9);
  unsigned char head[ENCACHE_HEADER_SIZE], body[OBJ_LEN], want[OBJ_LEN];
  const char *kk = k2;
  void *heads[1] = {head}, *bufs[1] = {body};
  size_t caps[1] = {OBJ_LEN - ENCACHE_HEADER_SIZE};
  ASSERT_EQ_INT(w.tier->ops->read_split(w.tier, &kk, 1, ENCACHE_HEADER_SIZE,
                                        heads, bufs, caps, res),
                0);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  encache__tier_drain(w.tier);
  unsigned char got[OBJ_LEN];
  void *gb[1] = {got};
  size_t gc[1] = {OBJ_LEN};
  ASSERT_EQ_INT(encache_store_read(w.local, &kk, 1, gb, gc, res), 0);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  make_obj(want, 9);
  ASSERT_EQ_MEM(got, want, OBJ_LEN);
  /* A large object (above TIER_COPY_MAX) is read again from the remote
   * by the promotion thread, not copied by the lookup. */
  enum { BIG = ENCACHE_HEADER_SIZE + 4 * 100000 };
  static unsigned char big[BIG], back[BIG];
  int64_t shape[2] = {1, 100000};
  encache_tensor tb = {sizeof tb, big + ENCACHE_HEADER_SIZE, ENCACHE_FLOAT32, 2,
                       shape, NULL, 0, 0, NULL};
  for (size_t i = ENCACHE_HEADER_SIZE; i < BIG; i++)
    big[i] = (unsigned char)(i * 7);
  ASSERT_EQ_INT(encache_header_encode(&tb, big), 0);
  key_of(k2, "big");
  ASSERT_EQ_INT(encache_store_write(w.remote, k2, NULL, 0, big, BIG), 0);
  void *bb[1] = {back};
  size_t bc[1] = {BIG};
  int r0 = w.ctl.read_calls;
  ASSERT_EQ_INT(encache_store_read(w.tier, &kk, 1, bb, bc, res), 0);
  ASSERT_EQ_INT(res[0], BIG);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(w.ctl.read_calls, r0 + 2); /* the lookup's, the thread's */
  memset(back, 0, BIG);
  ASSERT_EQ_INT(encache_store_read(w.local, &kk, 1, bb, bc, res), 0);
  ASSERT_EQ_INT(res[0], BIG);
  ASSERT_EQ_MEM(back, big, BIG);
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_done, 3);
  world_stop(&w);
}

TEST(tier_remote_outage_keeps_local_hits) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  key_of(keys[0], "here");
  key_of(keys[1], "there");
  key_of(keys[2], "nowhere");
  put(w.tier, keys[0], 1);
  put(w.remote, keys[1], 2);
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  const char *k[3] = {keys[0], keys[1], keys[2]};
  int present[3];
  ASSERT_EQ_INT(encache_store_exists(w.tier, k, 3, present), 0);
  ASSERT_EQ_INT(present[0], 1);
  ASSERT_EQ_INT(encache_store_classify(present[1]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_EQ_INT(encache_store_classify(present[2]), ENCACHE_ANSWER_RECOVERABLE);
  int64_t res[3];
  unsigned seeds[3] = {1, 0, 0};
  read_n(w.tier, keys, 3, res, seeds);
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(encache_store_classify(res[1]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_EQ_INT(encache_store_classify(res[2]), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(w.tier), "remote tier");
  encache_store_stats s = stats_of(w.tier);
  ASSERT(s.tier_remote_errors >= 4);
  /* Writes: the local tier gets the object, the answer is the remote's. */
  char nk[64];
  key_of(nk, "new");
  unsigned char obj[OBJ_LEN];
  make_obj(obj, 5);
  int rc = encache_store_write(w.tier, nk, NULL, 0, obj, OBJ_LEN);
  ASSERT_EQ_INT(encache_store_classify(rc), ENCACHE_ANSWER_RECOVERABLE);
  ASSERT_CONTAINS(encache_store_errmsg(w.tier), "remote tier");
  ASSERT_EQ_INT(has(w.local, nk), 1);
  world_stop(&w);
}

static int t_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *data = malloc(nbytes ? nbytes : 1);
  *handle = NULL;
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void t_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

/* Looks ids up through ec (every outcome into r; hits freed). */
static void engine_lookup(encache *ec, const char *const *ids, int n,
                          encache_result *r, const unsigned char *want) {
  encache_candidate c[4];
  for (int i = 0; i < n; i++)
    c[i] = (encache_candidate){sizeof(c[i]), ids[i], ENCACHE_MODALITY_IMAGE,
                               ENCACHE_FLOAT32, ROWS, COLS,
                               ENCACHE_DEVICE_HOST, 0};
  r[0].size = sizeof(r[0]);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_allocator a = {sizeof(a), NULL, t_alloc, t_release, 0};
  ASSERT(encache_lookup(step, c, (size_t)n, &a, r) >= 0);
  for (int i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(r[i].data, want + ENCACHE_HEADER_SIZE,
                    OBJ_LEN - ENCACHE_HEADER_SIZE);
      free(r[i].data);
    }
  encache_step_close(step);
}

/* The engine over the tier: an object malformed in the remote tier is
 * INCOMPATIBLE and never promoted; with the remote gone, a local object
 * is a HIT, the others UNAVAILABLE (encoded), as over any failing Store,
 * and a local incompatible object stays INCOMPATIBLE. */
TEST(tier_remote_outage_seen_by_an_engine) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  const char *json =
      "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
      "\"ec_producer\", \"ec_connector_extra_config\": "
      "{\"cross_encoder_cache\": true}}";
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "tier/model";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  encache_store *tier = w.tier;
  ASSERT_EQ_INT(encache__open_with_store(&o, w.tier, &ec), 0);
  w.tier = NULL; /* the engine closes it */
  char key[512], fresh[512];
  unsigned char obj[OBJ_LEN], bad[OBJ_LEN];
  make_obj(obj, 3);
  memcpy(bad, obj, OBJ_LEN);
  bad[0] ^= 0xff;
  ASSERT(encache_key(encache_namespace_of(ec), "remote-bad", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, key, NULL, 0, bad, OBJ_LEN), 0);
  ASSERT(encache_key(encache_namespace_of(ec), "fresh", fresh, sizeof(fresh)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, fresh, NULL, 0, obj, OBJ_LEN), 0);
  static const char *const first[2] = {"remote-bad", "fresh"};
  encache_result r[3];
  engine_lookup(ec, first, 2, r, obj);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_HIT);
  encache__tier_drain(tier);
  ASSERT_EQ_INT(has(w.local, key), 0);
  ASSERT_EQ_INT(has(w.local, fresh), 1);
  ASSERT(encache_key(encache_namespace_of(ec), "local", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.local, key, NULL, 0, obj, OBJ_LEN), 0);
  /* An incompatible object (bad magic) in the local tier: INCOMPATIBLE,
   * never replaced by the remote's good one. */
  ASSERT(encache_key(encache_namespace_of(ec), "broken", key, sizeof(key)) > 0);
  ASSERT_EQ_INT(encache_store_write(w.local, key, NULL, 0, bad, OBJ_LEN), 0);
  ASSERT_EQ_INT(encache_store_write(w.remote, key, NULL, 0, obj, OBJ_LEN), 0);
  kill_wait(w.redis, SIGKILL);
  w.redis = exit_redis = 0;
  static const char *const ids[3] = {"local", "broken", "remote"};
  engine_lookup(ec, ids, 3, r, obj);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_INCOMPATIBLE);
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(encache_close(ec), 0);
  world_stop(&w);
}

TEST(tier_incompatible_remote_object_never_promoted) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char keys[3][64];
  key_of(keys[0], "bad-magic");
  key_of(keys[1], "bad-length");
  key_of(keys[2], "good");
  unsigned char obj[OBJ_LEN + 4];
  make_obj(obj, 4);
  obj[0] ^= 0xff;
  ASSERT_EQ_INT(encache_store_write(w.remote, keys[0], NULL, 0, obj, OBJ_LEN), 0);
  make_obj(obj, 4);
  memset(obj + OBJ_LEN, 0, 4);
  ASSERT_EQ_INT(encache_store_write(w.remote, keys[1], NULL, 0, obj, OBJ_LEN - 4), 0);
  put(w.remote, keys[2], 5);
  int64_t res[3];
  read_n(w.tier, keys, 3, res, NULL);
  ASSERT_EQ_INT(res[0], OBJ_LEN); /* delivered as read: the engine judges */
  ASSERT_EQ_INT(res[1], OBJ_LEN - 4);
  ASSERT_EQ_INT(res[2], OBJ_LEN);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, keys[0]), 0);
  ASSERT_EQ_INT(has(w.local, keys[1]), 0);
  ASSERT_EQ_INT(has(w.local, keys[2]), 1);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_remote_hits, 3);
  ASSERT_EQ_U64(s.tier_promotions_queued, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 2);
  world_stop(&w);
}

TEST(tier_local_eviction_refilled_from_the_remote) {
  world w;
  if (world_start(&w, "1MiB", 0, 0) < 0)
    return;
  /* 64 objects of 32 KiB: twice the segment.  The first ones are evicted
   * locally, stay in the remote, and come back from it. */
  enum { N = 64, LEN = 32 << 10 };
  static unsigned char obj[LEN], got[LEN];
  char key[N][64];
  for (int i = 0; i < N; i++) {
    char name[16];
    snprintf(name, sizeof(name), "big-%d", i);
    key_of(key[i], name);
    /* A v3 header of a 1 x (LEN-24)/4 float32 matrix, payload of seed i. */
    int64_t shape[2] = {1, (LEN - ENCACHE_HEADER_SIZE) / 4};
    encache_tensor t = {sizeof t, obj + ENCACHE_HEADER_SIZE, ENCACHE_FLOAT32, 2,
                        shape, NULL, 0, 0, NULL};
    memset(obj + ENCACHE_HEADER_SIZE, i + 1, LEN - ENCACHE_HEADER_SIZE);
    ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
    ASSERT_EQ_INT(encache_store_write(w.tier, key[i], NULL, 0, obj, LEN), 0);
  }
  ASSERT_EQ_INT(has(w.local, key[0]), 0); /* evicted here */
  ASSERT_EQ_INT(has(w.remote, key[0]), 1);
  ASSERT(stats_of(w.local).evictions > 0);
  const char *k = key[0];
  void *b[1] = {got};
  size_t caps[1] = {LEN};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
  ASSERT_EQ_INT(res[0], LEN);
  ASSERT_EQ_INT(got[LEN - 1], 1);
  encache__tier_drain(w.tier);
  ASSERT_EQ_INT(has(w.local, key[0]), 1); /* promoted again */
  int read0 = w.ctl.read_calls;
  ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
  ASSERT_EQ_INT(res[0], LEN);
  ASSERT_EQ_INT(w.ctl.read_calls, read0); /* a local hit now */
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_remote_hits, 1);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  world_stop(&w);
}

/* The promotion thread, held in its local write; the queue fills. */
static int hold_fd[2];
static void hold_promotion(void) {
  char c;
  while (read(hold_fd[0], &c, 1) < 0) {
  }
}

TEST(tier_full_promotion_queue_drops_without_waiting) {
  world w;
  if (world_start(&w, "4MiB", 2, 0) < 0)
    return;
  enum { N = 12 };
  char keys[N][64];
  for (int i = 0; i < N; i++) {
    char name[16];
    snprintf(name, sizeof(name), "q-%d", i);
    key_of(keys[i], name);
    put(w.remote, keys[i], (unsigned)i + 1);
  }
  ASSERT_EQ_INT(pipe(hold_fd), 0);
  encache__shm_write_hook = hold_promotion;
  int64_t res[N];
  unsigned seeds[N];
  for (int i = 0; i < N; i++)
    seeds[i] = (unsigned)i + 1;
  /* Returns with every hit while the promotion thread is held. */
  read_n(w.tier, keys, N, res, seeds);
  for (int i = 0; i < N; i++)
    ASSERT_EQ_INT(res[i], OBJ_LEN);
  encache_store_stats s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_queued + s.tier_promotions_dropped, N);
  /* At most the two queued and the one being written. */
  ASSERT(s.tier_promotions_queued <= 3);
  ASSERT(s.tier_promotions_dropped >= N - 3);
  ASSERT_EQ_U64(s.tier_promotions_done, 0);
  ASSERT_EQ_INT((int)write(hold_fd[1], "xxxxxxxxxxxx", N), N);
  encache__tier_drain(w.tier);
  encache__shm_write_hook = NULL;
  s = stats_of(w.tier);
  ASSERT_EQ_U64(s.tier_promotions_done, s.tier_promotions_queued);
  close(hold_fd[0]), close(hold_fd[1]);
  world_stop(&w);
}

/* ---------------------------------------------- writes, removal, leases */

TEST(tier_writes_answer_as_the_shared_tier) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char a[64], b[64];
  key_of(a, "only-local");
  key_of(b, "only-remote");
  put(w.local, a, 1);
  put(w.remote, b, 2);
  unsigned char obj[OBJ_LEN];
  make_obj(obj, 3);
  /* New to the shared tier: written (the local copy stays as it was). */
  ASSERT_EQ_INT(encache_store_write(w.tier, a, NULL, 0, obj, OBJ_LEN), 0);
  ASSERT_EQ_INT(has(w.remote, a), 1);
  /* The shared tier has it: present (EEXIST), and not written locally:
   * this host serves the fleet's object (seed 2), never its own. */
  ASSERT_EQ_INT(encache_store_write(w.tier, b, NULL, 0, obj, OBJ_LEN),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT(has(w.local, b), 0);
  /* Never replaced in either tier. */
  char keys[2][64];
  memcpy(keys[0], a, 64);
  memcpy(keys[1], b, 64);
  int64_t res[2];
  unsigned local_seeds[2] = {1, 0};
  read_n(w.local, keys, 2, res, local_seeds);
  unsigned remote_seeds[2] = {3, 2};
  read_n(w.remote, keys, 2, res, remote_seeds);
  /* Through the tier, b is the remote's, and so is its promoted copy. */
  unsigned tier_seeds[2] = {1, 2};
  read_n(w.tier, keys, 2, res, tier_seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  encache__tier_drain(w.tier);
  read_n(w.local, keys, 2, res, tier_seeds);
  ASSERT_EQ_INT(res[1], OBJ_LEN);
  /* Removal: both tiers; ENOENT once neither has it. */
  ASSERT_EQ_INT(encache_store_remove(w.tier, a), 0);
  ASSERT_EQ_INT(has(w.local, a), 0);
  ASSERT_EQ_INT(has(w.remote, a), 0);
  ASSERT_EQ_INT(encache_store_remove(w.tier, a), ENCACHE_ENOENT);
  /* Leases are the shared tier's. */
  ASSERT_EQ_INT(encache_store_lease_take(w.tier, b, 11, 5000), 0);
  ASSERT_EQ_INT(encache_store_lease_take(w.remote, b, 12, 5000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_take(w.local, b, 12, 5000), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(w.tier, b, 11), 0);
  world_stop(&w);
}

/* A removal (remove, remove_prefix) while the promotion of the object is
 * being written, or queued: the object does not come back in the local
 * tier. */
static int entered_fd[2];
static void enter_and_hold(void) {
  ASSERT_EQ_INT((int)write(entered_fd[1], "e", 1), 1);
  hold_promotion();
}

TEST(tier_removal_beats_a_pending_promotion) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  /* A tier without the fault Store (which cannot list: no purge). */
  encache_store *tier = NULL;
  ASSERT_EQ_INT(encache__tier_wrap(open_url(w.local_url),
                                   open_url(w.remote_url), "tier:test", 0, 0,
                                   &tier),
                0);
  char keys[3][64], prefix[64];
  key_of(keys[0], "being-written");
  key_of(keys[1], "pre/queued");
  key_of(keys[2], "kept");
  key_of(prefix, "pre/");
  for (int i = 0; i < 3; i++)
    put(w.remote, keys[i], (unsigned)i + 1);
  ASSERT_EQ_INT(pipe(hold_fd), 0);
  ASSERT_EQ_INT(pipe(entered_fd), 0);
  encache__shm_write_hook = enter_and_hold;
  int64_t res[3];
  read_n(tier, keys, 1, res, NULL); /* keys[0]: its write is held */
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  char c;
  ASSERT_EQ_INT((int)read(entered_fd[0], &c, 1), 1);
  read_n(tier, keys + 1, 2, res, NULL); /* queued behind it */
  ASSERT_EQ_INT(res[0], OBJ_LEN);
  ASSERT_EQ_INT(stats_of(tier).tier_promotions_queued, 3);
  ASSERT_EQ_INT(encache_store_remove(tier, keys[0]), 0);
  uint64_t removed = 0;
  ASSERT_EQ_INT(encache_store_remove_prefix(tier, prefix, &removed), 0);
  ASSERT_EQ_U64(removed, 1);
  ASSERT_EQ_INT((int)write(hold_fd[1], "xxx", 3), 3);
  encache__tier_drain(tier);
  encache__shm_write_hook = NULL;
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ_INT(has(w.remote, keys[i]), 0);
    ASSERT_EQ_INT(has(w.local, keys[i]), 0); /* not put back */
    ASSERT_EQ_INT(has(tier, keys[i]), 0);
  }
  ASSERT_EQ_INT(has(w.local, keys[2]), 1); /* another key: promoted */
  encache_store_stats s = stats_of(tier);
  ASSERT_EQ_U64(s.tier_promotions_done, 1);
  ASSERT_EQ_U64(s.tier_promotions_dropped, 2);
  close(hold_fd[0]), close(hold_fd[1]);
  close(entered_fd[0]), close(entered_fd[1]);
  encache_store_close(tier);
  world_stop(&w);
}

/* object_size and reads answer from the local tier when it has the
 * object, an empty object included, whatever the remote says or whether
 * it is up. */
TEST(tier_object_size_and_empty_objects_are_local_hits) {
  world w;
  if (world_start(&w, "4MiB", 0, 0) < 0)
    return;
  char lonly[64], empty[64];
  key_of(lonly, "lonly");
  key_of(empty, "empty");
  put(w.local, lonly, 1);
  ASSERT_EQ_INT(encache_store_write(w.local, empty, NULL, 0, "", 0), 0);
  for (int down = 0; down < 2; down++) {
    uint64_t len = 0;
    ASSERT_EQ_INT(encache_store_object_size(w.tier, lonly, &len), 0);
    ASSERT_EQ_U64(len, OBJ_LEN);
    len = 7;
    ASSERT_EQ_INT(encache_store_object_size(w.tier, empty, &len), 0);
    ASSERT_EQ_U64(len, 0);
    int read0 = w.ctl.read_calls;
    uint64_t hits0 = stats_of(w.tier).tier_local_hits;
    const char *k = empty;
    unsigned char buf[8];
    void *b[1] = {buf};
    size_t caps[1] = {sizeof(buf)};
    int64_t res[1] = {-1};
    ASSERT_EQ_INT(encache_store_read(w.tier, &k, 1, b, caps, res), 0);
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(w.ctl.read_calls, read0); /* the remote not asked */
    ASSERT_EQ_U64(stats_of(w.tier).tier_local_hits, hits0 + 1);
    if (!down) {
      kill_wait(w.redis, SIGKILL);
      w.redis = exit_redis = 0;
    }
  }
  world_stop(&w);
}
