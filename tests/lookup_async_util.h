/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_async_util.h: the fixtures of the tests of lookups that do not
 * wait (test_lookup_async.c, test_lookup_async_load.c): an engine over the
 * fault-injecting wrapper around a fresh Store (or over a Store URL), its
 * objects written raw, candidates and a counting allocator
 * (lookup_async_util.c).
 */
#ifndef ENCACHE_TEST_LOOKUP_ASYNC_UTIL_H
#define ENCACHE_TEST_LOOKUP_ASYNC_UTIL_H

#include "runner.h"

#include "encache.h"
#include "fault_store.h"

#include <stddef.h>
#include <stdint.h>

#define COLS 4        /* float32: 16 bytes a row */
#define READ_BUF 4096 /* objects of more than 254 rows are OVERSIZE */

/* store_reads_in_flight of the engines aenv_open() opens (0: the Store's
 * choice, which is one for the fault wrapper). */
extern int aenv_readers;
/* Whether the fault wrapper asks for registered memory (as Mooncake). */
extern int aenv_registration;

typedef struct aenv {
  fault_ctl ctl;
  encache *ec;
  encache_store *raw; /* a second handle on the Store, for raw writes */
  char revision[64];
} aenv;

/* The options of e's engines (json: a buffer for them). */
encache_options aenv_options(aenv *e, char *json, size_t size);
/* Opens an engine over the fault wrapper around a fresh Store, in a
 * namespace of its own. */
encache *aenv_open(aenv *e);
void aenv_done(aenv *e);
/* Opens e's engine (model, with `extra` in its extra config) and raw
 * handle on the Store at url (no fault wrapper). */
void aenv_open_url(aenv *e, const char *url, const char *model,
                   const char *extra);

encache_step *la_step(encache *ec);
/* A float32 candidate of rows x COLS on the host. */
encache_candidate la_cand(const char *id, uint64_t rows);

/* Counting host allocator (atomics: it runs on the lookup thread). */
typedef struct la_talloc {
  int allocs, releases;
} la_talloc;
encache_allocator la_allocator(la_talloc *t);
/* Frees the destinations of r's hits. */
void la_free_hits(encache_result *r, size_t n);

/* The object for (id, rows): its payload derived from both. */
void la_payload_of(const char *id, uint64_t rows, float *out);
/* Writes a header of (dtype, rows, cols) and rows_of_payload rows of
 * payload under the handle's key for id, with the raw Store API. */
void la_put(aenv *e, const char *id, int dtype, int64_t rows, int64_t cols,
            uint64_t rows_of_payload);
/* Seeds `n` present objects of `rows` rows named PREFIX<k>. */
void la_seed(aenv *e, const char *prefix, int n, uint64_t rows,
             char ids[][32]);
/* Compares two lookups' results over the same candidates c[0..n): the
 * same answers, and hits of the objects la_put() wrote. */
void la_same_results(const encache_candidate *c, const encache_result *x,
                     const encache_result *y, size_t n);
/* Whether fd is readable within timeout_ms. */
int la_readable(int fd, int timeout_ms);

#endif
