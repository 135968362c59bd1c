/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tier_purge.c: a tier used by several processes at once (issue 26):
 * a purge from one process while encoder processes read through their own
 * tier handles and promote (finding 5: purged objects came back into the
 * local tier and were served), and the engine's Store stats on a tier
 * whose local lock another process holds (9d: EUNAVAIL with an empty
 * message).  Real processes, one real shm segment, a real redis-server on
 * a free loopback port as the remote tier; skipped (said) without
 * redis-server.
 */
#include "redis_util.h"
#include "runner.h"
#include "engine.h"
#include "shm/testing.h"
#include "tier.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* What the test's exit handler cleans up if it fails half way. */
static pid_t exit_redis;
static char exit_shm[64];

static void purge_exit(void) {
  if (exit_redis > 0)
    kill_wait(exit_redis, SIGKILL);
  exit_redis = 0;
  if (exit_shm[0])
    encache_shm_destroy(exit_shm);
  exit_shm[0] = '\0';
}

/* A redis-server and a segment name; the tier's URL over both. */
typedef struct pworld {
  int port;
  char shm[64], local_url[160], remote_url[160], tier_url[400];
} pworld;

static int pworld_start(pworld *w, const char *local_opts) {
  memset(w, 0, sizeof(*w));
  if (!redis_have())
    return -1;
  w->port = free_port();
  exit_redis = spawn_redis(w->port, NULL);
  snprintf(w->shm, sizeof(w->shm), "encache-tierp-%d", (int)getpid());
  snprintf(exit_shm, sizeof(exit_shm), "%s", w->shm);
  atexit(purge_exit);
  encache_shm_destroy(w->shm);
  snprintf(w->local_url, sizeof(w->local_url), "shm://%s?%s", w->shm,
           local_opts);
  snprintf(w->remote_url, sizeof(w->remote_url),
           "redis://127.0.0.1:%d?connect_timeout_ms=2000&timeout_ms=5000",
           w->port);
  snprintf(w->tier_url, sizeof(w->tier_url), "tier:%s+%s", w->local_url,
           w->remote_url);
  return 0;
}

static encache_store *popen_url(const char *url) {
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url,
               encache_store_errmsg(NULL));
  return st;
}

/* ------------------------------------------- purge while encoders run */

enum {
  P_KEYS = 400,    /* objects per round */
  P_ENCODERS = 2,  /* encoder processes */
  P_ROUNDS = 4,
  P_COLS = 1000,   /* 1 x 1000 float32: 4 KiB objects, 1.6 MiB a round */
  P_LEN = ENCACHE_HEADER_SIZE + 4 * P_COLS,
  P_BATCH = 16
};

/* Shared by the test and its encoder processes (an anonymous shared
 * mapping): set by the test, counted by the encoders. */
typedef struct pshared {
  int stop, purged;
  uint64_t served; /* hits of purged keys read after the purge ended */
  uint64_t reads;  /* batches read */
} pshared;

static void pobject(unsigned char *obj, int i) {
  static float v[P_COLS];
  for (int j = 0; j < P_COLS; j++)
    v[j] = (float)(i * 1000 + j);
  int64_t shape[2] = {1, P_COLS};
  encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  memcpy(obj + ENCACHE_HEADER_SIZE, v, sizeof(v));
}

/* A promotion thread on a loaded host: each local write waits 1 ms, so
 * that promotions read from the remote before a purge are still queued
 * when it ends (up to promote_queue_items of them). */
static void slow_write(void) { usleep(1000); }

/* An encoder: reads the round's keys through its own tier handle, over
 * and over (a remote hit is promoted), until told to stop; counts the
 * hits of batches begun after the purge ended.  Its exit status. */
static int encoder_main(const char *url, const char *keys, pshared *sh,
                        int slow) {
  encache_store *st = NULL;
  if (slow)
    encache__shm_write_hook = slow_write;
  if (encache_store_open(url, &st) != 0)
    return 10;
  static unsigned char buf[P_BATCH][P_LEN];
  const char *k[P_BATCH];
  void *bufs[P_BATCH];
  size_t caps[P_BATCH];
  int64_t res[P_BATCH];
  while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
    for (int i = 0; i < P_KEYS; i += P_BATCH) {
      int n = P_KEYS - i < P_BATCH ? P_KEYS - i : P_BATCH;
      for (int j = 0; j < n; j++) {
        k[j] = keys + (size_t)(i + j) * 64;
        bufs[j] = buf[j];
        caps[j] = P_LEN;
      }
      int after = __atomic_load_n(&sh->purged, __ATOMIC_ACQUIRE);
      if (encache_store_read(st, k, (size_t)n, bufs, caps, res) != 0)
        continue;
      uint64_t hits = 0;
      for (int j = 0; j < n; j++)
        hits += res[j] == P_LEN;
      if (after)
        __atomic_add_fetch(&sh->served, hits, __ATOMIC_RELAXED);
      __atomic_add_fetch(&sh->reads, 1, __ATOMIC_RELAXED);
    }
  }
  encache_store_close(st); /* writes what is still queued */
  return 0;
}

/* The purger: another process, its own tier handle. */
static int purger_main(const char *url, const char *prefix) {
  encache_store *st = NULL;
  uint64_t removed = 0;
  if (encache_store_open(url, &st) != 0)
    return 10;
  int rc = encache_store_remove_prefix(st, prefix, &removed);
  if (rc != 0)
    fprintf(stderr, "# purge: %s\n", encache_store_errmsg(st));
  encache_store_close(st);
  return rc == 0 ? 0 : 11;
}

static void wait_ok(pid_t pid, const char *what) {
  int status = 0;
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    test__fail(__FILE__, __LINE__, "%s: status 0x%x", what, status);
}

/* One round: the round's objects in the remote, encoders reading them,
 * a purge of them from another process, the encoders reading on for a
 * while.  Returns how many purged objects are in the local tier at the
 * end; *served, the hits the encoders had of them after the purge. */
static int purge_round(const pworld *w, encache_store *local,
                       encache_store *remote, pshared *sh, int round,
                       uint64_t *served) {
  static char keys[P_KEYS][64];
  static unsigned char obj[P_LEN];
  char prefix[64];
  snprintf(prefix, sizeof(prefix), "t%d/r%d/", (int)getpid(), round);
  for (int i = 0; i < P_KEYS; i++) {
    snprintf(keys[i], 64, "%.48s%d", prefix, i);
    pobject(obj, i);
    ASSERT_EQ_INT(encache_store_write(remote, keys[i], NULL, 0, obj, P_LEN), 0);
  }
  memset(sh, 0, sizeof(*sh));
  pid_t enc[P_ENCODERS];
  for (int e = 0; e < P_ENCODERS; e++)
    if ((enc[e] = fork()) == 0)
      _exit(encoder_main(w->tier_url, keys[0], sh, e == 1));
  /* Let them promote (the local tier holds about half a round: every
   * pass has remote hits), then purge from another process. */
  while (__atomic_load_n(&sh->reads, __ATOMIC_RELAXED) < 4 * P_KEYS / P_BATCH)
    usleep(1000);
  usleep(50000);
  pid_t p = fork();
  if (p == 0)
    _exit(purger_main(w->tier_url, prefix));
  wait_ok(p, "the purger");
  __atomic_store_n(&sh->purged, 1, __ATOMIC_RELEASE);
  usleep(200000);
  __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
  for (int e = 0; e < P_ENCODERS; e++)
    wait_ok(enc[e], "an encoder");
  int back = 0, in_remote = 0;
  for (int i = 0; i < P_KEYS; i++) {
    const char *k = keys[i];
    int r = 0;
    ASSERT_EQ_INT(encache_store_exists(local, &k, 1, &r), 0);
    back += r == 1;
    ASSERT_EQ_INT(encache_store_exists(remote, &k, 1, &r), 0);
    in_remote += r == 1;
  }
  ASSERT_EQ_INT(in_remote, 0);
  *served = __atomic_load_n(&sh->served, __ATOMIC_RELAXED);
  uint64_t gone = 0; /* the next round starts clean */
  ASSERT_EQ_INT(encache_store_remove_prefix(local, prefix, &gone), 0);
  return back;
}

TEST(tier_purge_from_another_process_stays_purged) {
  pworld w;
  if (pworld_start(&w, "size=1MiB&promote_queue_items=64") < 0)
    return;
  pshared *sh = mmap(NULL, sizeof(pshared), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(sh != MAP_FAILED);
  char url[200];
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", w.shm);
  encache_store *local = popen_url(url); /* creates the segment */
  encache_store *remote = popen_url(w.remote_url);
  int back = 0;
  uint64_t served = 0;
  char report[512] = "";
  for (int r = 0; r < P_ROUNDS; r++) {
    uint64_t s = 0;
    int b = purge_round(&w, local, remote, sh, r, &s);
    size_t len = strlen(report);
    snprintf(report + len, sizeof(report) - len, "%sround %d: %d of %d back, "
             "%llu hit reads after the purge", r ? "; " : "", r, b, P_KEYS,
             (unsigned long long)s);
    back += b;
    served += s;
  }
  encache_store_close(local);
  encache_store_close(remote);
  munmap(sh, sizeof(pshared));
  purge_exit();
  if (back != 0 || served != 0)
    test__fail(__FILE__, __LINE__, "purged objects came back into the local "
               "tier: %d over %d rounds, %llu hit reads served after the purge "
               "(want 0 and 0): %s", back, P_ROUNDS,
               (unsigned long long)served, report);
  printf("# %s\n", report);
}

/* ------------------------------------- stats with the local lock held */

/* The engine's Store stats on a tier whose local lock another process
 * holds: recoverable, and the calling thread's message says which tier
 * and why (it was empty); once the holder lets it go, they work again.
 * (The holder unlocks rather than dies: ThreadSanitizer does not model a
 * robust mutex's EOWNERDEAD across processes, and CI runs tier_ under
 * it.) */
TEST(tier_engine_stats_with_the_local_lock_held_say_why) {
  pworld w;
  if (pworld_start(&w, "size=1MiB&lock_timeout_ms=100") < 0)
    return;
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config =
      "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
      "\"ec_producer\", \"ec_connector_extra_config\": "
      "{\"cross_encoder_cache\": true}}";
  o.model = "tier/model";
  o.model_dtype = ENCACHE_FLOAT32;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache__open_with_store(&o, popen_url(w.tier_url), &ec), 0);
  int fd[2], go[2];
  ASSERT_EQ_INT(pipe(fd), 0);
  ASSERT_EQ_INT(pipe(go), 0);
  pid_t holder = fork();
  char c;
  if (holder == 0) {
    encache_store *st = NULL;
    if (encache_store_open(w.local_url, &st) != 0 ||
        encache__shm_test_lock(st) != 0)
      _exit(1);
    if (write(fd[1], "l", 1) != 1 || read(go[0], &c, 1) != 1)
      _exit(1); /* holds the lock until told */
    encache__shm_test_unlock(st);
    encache_store_close(st);
    _exit(0);
  }
  ASSERT_EQ_INT((int)read(fd[0], &c, 1), 1);
  encache_store_stats s = {.size = sizeof(s)};
  int rc = encache_engine_store_stats(ec, &s);
  ASSERT_EQ_INT((int)write(go[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ_INT(waitpid(holder, &status, 0), holder);
  ASSERT_EQ_INT(status, 0);
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  const char *m = encache_errmsg(NULL);
  ASSERT_CONTAINS(m, "local tier: ");
  ASSERT_CONTAINS(m, "lock not acquired within 100 ms");
  ASSERT_CONTAINS(m, w.shm);
  printf("# %s\n", m);
  /* The lock is free again: the next call answers. */
  ASSERT_EQ_INT(encache_engine_store_stats(ec, &s), 0);
  ASSERT_EQ_STR(s.kind, "tier");
  ASSERT_EQ_INT(encache_close(ec), 0);
  close(fd[0]), close(fd[1]), close(go[0]), close(go[1]);
  purge_exit();
}
