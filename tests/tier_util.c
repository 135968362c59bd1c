/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_util.c: what the tiered Store's tests (tests/test_tier_*.c) share:
 * a world of a redis-server, a shm segment and the tier over both (the
 * remote wrapped in the fault Store of tests/fault_store.c, whose counters
 * prove when the remote tier was not asked), and objects written and read
 * through it.  The Store conformance suite and the engine's acceptance
 * cases run on a tier URL too (tests/on_tier.sh).
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

/* What the exit handler cleans up when a test fails half way (a test
 * that ends cleans up in world_stop()): copies, not pointers into the
 * test's stack, which is gone by then. */
pid_t exit_redis;
char exit_shm[64];

void world_exit(void) {
  if (exit_redis > 0)
    kill_wait(exit_redis, SIGKILL);
  exit_redis = 0;
  if (exit_shm[0])
    encache_shm_destroy(exit_shm);
  exit_shm[0] = '\0';
}

encache_store *open_url(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url,
               encache_store_errmsg(NULL));
  return st;
}

/* Starts the world: 0, or -1 when redis-server is missing (skip). */
int world_start(world *w, const char *size, size_t items, uint64_t bytes) {
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
void world_stop(world *w) {
  encache_store_close(w->tier);
  encache_store_close(w->local);
  encache_store_close(w->remote);
  exit_redis = w->redis; /* 0 when the test killed it */
  world_exit();
}

/* A well-formed v3 object (float32 ROWS x COLS) whose payload depends on
 * seed. */
void make_obj(unsigned char *obj, unsigned seed) {
  float v[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++)
    v[i] = (float)(seed * 100 + (unsigned)i);
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor t = {sizeof t, v, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  memcpy(obj + ENCACHE_HEADER_SIZE, v, sizeof(v));
}

void tier_put(encache_store *st, const char *key, unsigned seed) {
  unsigned char obj[OBJ_LEN];
  make_obj(obj, seed);
  int rc = encache_store_write(st, key, NULL, 0, obj, OBJ_LEN);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "write %s: %s: %s", key,
               encache_err_name(rc), encache_store_errmsg(st));
}

void key_of(char *buf, const char *name) {
  snprintf(buf, 64, "t%d/%s", (int)getpid(), name);
}

/* Reads n keys through st; results in res, objects checked against seeds
 * (seed 0: not checked). */
void read_n(encache_store *st, char keys[][64], int n, int64_t *res,
            const unsigned *seeds) {
  unsigned char buf[16][OBJ_LEN], want[OBJ_LEN];
  /* Zeroed: out of line, the compiler cannot see that n > 0. */
  const char *k[16] = {0};
  void *bufs[16] = {0};
  size_t caps[16] = {0};
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

int has(encache_store *st, const char *key) {
  int r = -1;
  ASSERT_EQ_INT(encache_store_exists(st, &key, 1, &r), 0);
  return r;
}

encache_store_stats stats_of(encache_store *st) {
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  return s;
}
