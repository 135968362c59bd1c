/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake_util.h: what the Mooncake backend tests (tests/test_mooncake_*.c)
 * share (tests/mooncake_util.c).
 */
#ifndef ENCACHE_TEST_MOONCAKE_UTIL_H
#define ENCACHE_TEST_MOONCAKE_UTIL_H

#include "runner.h"

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

/* The configuration file of the last write_config_for(). */
extern char cfg_path[64];
/* Writes a standalone-store configuration with protocol to cfg_path. */
void write_config_for(const char *protocol);
void write_config(void);

/* A host allocator of malloc'd destinations (each hit's data is the
 * caller's to free). */
int alloc_fn(void *ctx, size_t i, const encache_candidate *c, uint64_t nbytes,
             void **data, void **handle);
void release_fn(void *ctx, size_t i, void *data, void *handle);
/* The Store's existence answer for key. */
int present(encache_store *st, const char *key);

/* The stand-in's call counters and injected answers (fake_mooncake.c). */
enum { F_EXIST, F_GET, F_PUT, F_SIZE, F_REGISTER, F_UNREGISTER, F_OPS };
typedef struct fake_ctl {
  long *calls;
  int *inject, *inject_batch;
  const char *protocol;
} fake_ctl;

fake_ctl fake_of(const char *path);
void fake_reset(fake_ctl *f);
/* More members of ec_connector_extra_config for engine_on_fake ("" or
 * ", \"name\": value"). */
extern const char *fake_extra;
/* An engine on the stand-in with protocol, a staging buffer of rbuf
 * bytes, and the 2x2 float32 objects "a" and "b" in it; counters reset. */
encache *engine_on_fake(const char *protocol, unsigned rbuf, fake_ctl *f);
/* Looks up ids (2x2 float32, or rows x rows for "big") into r. */
int lookup_fake(encache_step *step, const char *const *ids, size_t n,
                encache_result *r);
void free_results(encache_result *r, size_t n);

#endif
