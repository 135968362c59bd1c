/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine_util.h: what the engine tests (tests/test_engine_*.c) share: an
 * env on the Store under test (behind the fault wrapper of
 * tests/fault_store.c), engines opened on it, the counting host allocator,
 * the reference encoder and its objects.
 */
#ifndef ENCACHE_TEST_ENGINE_UTIL_H
#define ENCACHE_TEST_ENGINE_UTIL_H

#include "runner.h"
#include "store_util.h"

#include "engine.h"
#include "fault_store.h"

#include <stddef.h>
#include <stdint.h>

#define ROWS 2
#define COLS 2 /* float32 2x2: 16 payload bytes, 40-byte objects */

typedef struct env {
  char url[128];
  char seg[64];
  fault_ctl ctl;
  encache *ec;
} env;

/* The revision of the last env_init(): its namespace. */
extern char revision[64];
const char *test_revision(void);
/* A fresh env on $ENCACHE_TEST_STORE or a private shm segment. */
void env_init(env *e, int registration);
void json_for(char *buf, size_t size, uint64_t read_buf, uint64_t items,
              uint64_t bytes);
encache_options options(const char *json);
/* Opens an engine over the fault wrapper around the env's Store. */
encache *open_on(env *e, uint64_t read_buf, uint64_t items, uint64_t bytes);
encache *open_default(env *e);
encache_step *step_of(encache *ec);

/* The host allocator of the tests: counts, can fail the n-th call. */
typedef struct talloc {
  int allocs, releases, fail_at;
} talloc;

int ta_alloc(void *ctx, size_t i, const encache_candidate *c, uint64_t nbytes,
             void **data, void **handle);
void ta_release(void *ctx, size_t i, void *data, void *handle);
encache_allocator allocator(talloc *t);
encache_candidate cand(const char *id);
/* The reference encoder: a deterministic output per id. */
void encode(const char *id, float *out);

/* Releases of the storages made by storage_of(): storage_release()
 * counts them. */
extern int storage_releases;
void storage_release(void *ctx);
encache_storage *storage_of(float **data, size_t floats);
/* Publishes the reference output for id; returns publish()'s answer. */
int publish_ref(encache_step *step, const char *id);
/* Writes raw bytes under key_ns's key for id, straight to the Store. */
void store_raw(env *e, const char *key_ns, const char *id, const void *obj,
               size_t len);
/* A valid v3 object for id, as the reference encoder makes it. */
size_t ref_object(const char *id, unsigned char *obj);
/* Waits until the worker has finished every job (without reaping). */
void wait_worker_idle(encache *ec);

/* Stores valid objects for ids through a first handle's namespace. */
void seed(env *e, const char *ns, const char *const *ids, int n);
int lookup_ids(encache_step *step, const char *const *ids, int n,
               encache_result *r, talloc *t);
void free_hits(encache_result *r, int n);

#endif
