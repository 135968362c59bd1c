/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_util.h: what the tiered Store's tests (tests/test_tier_*.c) share
 * (tests/tier_util.c).
 */
#ifndef ENCACHE_TEST_TIER_UTIL_H
#define ENCACHE_TEST_TIER_UTIL_H

#include "runner.h"

#include "encache.h"
#include "fault_store.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/* What the exit handler (world_exit()) cleans up when a test fails half
 * way: the server and the segment. */
extern pid_t exit_redis;
extern char exit_shm[64];
void world_exit(void);
/* Opens url; fails the test on error. */
encache_store *open_url(const char *url);
/* Starts the world: 0, or -1 when redis-server is missing (skip). */
int world_start(world *w, const char *size, size_t items, uint64_t bytes);
/* Closes the handles, stops the server (unless the test did) and removes
 * the segment. */
void world_stop(world *w);
/* A well-formed v3 object (float32 ROWS x COLS) whose payload depends on
 * seed. */
void make_obj(unsigned char *obj, unsigned seed);
/* Writes seed's object under key; fails the test on error. */
void tier_put(encache_store *st, const char *key, unsigned seed);
/* A key of this test process: "t<pid>/<name>" (buf of 64 bytes). */
void key_of(char *buf, const char *name);
/* Reads n keys through st; results in res, objects checked against seeds
 * (seed 0: not checked). */
void read_n(encache_store *st, char keys[][64], int n, int64_t *res,
            const unsigned *seeds);
/* The Store's existence answer for key. */
int has(encache_store *st, const char *key);
encache_store_stats stats_of(encache_store *st);

#endif
