/* SPDX-License-Identifier: Apache-2.0 */
/* lookup_async_util.c: see lookup_async_util.h. */
#include "lookup_async_util.h"
#include "store_util.h"

#include "engine.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int aenv_readers;
int aenv_registration;

encache_options aenv_options(aenv *e, char *json, size_t size) {
  snprintf(json, size,
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", "
           "\"ec_role\": \"ec_producer\", \"ec_connector_extra_config\": {"
           "\"cross_encoder_cache\": true, \"store_read_buffer_bytes\": %d, "
           "\"store_reads_in_flight\": %d}}",
           READ_BUF, aenv_readers);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "shared/model";
  o.revision = e->revision;
  o.model_dtype = ENCACHE_FLOAT32;
  return o;
}

encache *aenv_open(aenv *e) {
  static int count;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(e, 0, sizeof(*e));
  snprintf(e->revision, sizeof(e->revision), "la%d-%lld%09ld-%d",
           (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec, count++);
  fault_ctl_init(&e->ctl);
  e->ctl.registration = aenv_registration;
  encache_store *inner = ts_open("32MiB");
  e->raw = ts_reopen();
  char json[512];
  encache_options o = aenv_options(e, json, sizeof(json));
  int rc = encache__open_with_store(&o, fault_store_wrap(inner, &e->ctl),
                                    &e->ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "encache open: %s", encache_errmsg(e->ec));
  return e->ec;
}

void aenv_done(aenv *e) { encache_store_close(e->raw); }

void aenv_open_url(aenv *e, const char *url, const char *model,
                   const char *extra) {
  char json[256];
  snprintf(json, sizeof(json),
           "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
           "true%s}}", extra);
  memset(e, 0, sizeof(*e));
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  if (encache_open(&o, &e->ec) != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  ASSERT_EQ_INT(encache_store_open(url, &e->raw), 0);
}

encache_step *la_step(encache *ec) {
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  return step;
}

encache_candidate la_cand(const char *id, uint64_t rows) {
  encache_candidate c = {sizeof(c), id, ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, rows, COLS, ENCACHE_DEVICE_HOST, 0};
  return c;
}

static int ta_alloc(void *ctx, size_t i, const encache_candidate *c,
                    uint64_t nbytes, void **data, void **handle) {
  (void)c;
  __atomic_add_fetch(&((la_talloc *)ctx)->allocs, 1, __ATOMIC_RELAXED);
  *data = malloc(nbytes ? nbytes : 1);
  *handle = (void *)(uintptr_t)(i + 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void ta_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  __atomic_add_fetch(&((la_talloc *)ctx)->releases, 1, __ATOMIC_RELAXED);
  free(data);
}

encache_allocator la_allocator(la_talloc *t) {
  encache_allocator a = {sizeof(a), t, ta_alloc, ta_release, 0};
  return a;
}

void la_free_hits(encache_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT) {
      free(r[i].data);
      r[i].data = NULL;
    }
}

void la_payload_of(const char *id, uint64_t rows, float *out) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = id; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  for (uint64_t i = 0; i < rows * COLS; i++)
    out[i] = (float)((h >> (i % 48)) & 0xffff) / 3.0f + (float)i;
}

void la_put(aenv *e, const char *id, int dtype, int64_t rows, int64_t cols,
            uint64_t rows_of_payload) {
  char key[512];
  ASSERT(encache_key(encache_namespace_of(e->ec), id, key, sizeof(key)) > 0);
  int64_t shape[2] = {rows, cols};
  encache_tensor t = {sizeof t, NULL, dtype, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  ASSERT_EQ_INT(encache_header_encode(&t, hdr), 0);
  size_t bytes = (size_t)(rows_of_payload * COLS * sizeof(float));
  float *p = malloc(bytes ? bytes : 1);
  la_payload_of(id, rows_of_payload, p);
  ASSERT_EQ_INT(encache_store_write(e->raw, key, hdr, sizeof(hdr), p, bytes),
                0);
  free(p);
}

void la_seed(aenv *e, const char *prefix, int n, uint64_t rows,
             char ids[][32]) {
  for (int k = 0; k < n; k++) {
    snprintf(ids[k], 32, "%s%d", prefix, k);
    la_put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows, COLS, rows);
  }
}

int la_readable(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int rc = poll(&p, 1, timeout_ms);
  ASSERT(rc >= 0);
  return rc == 1 && (p.revents & POLLIN);
}

void la_same_results(const encache_candidate *c, const encache_result *x,
                     const encache_result *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ_INT(x[i].outcome, y[i].outcome);
    ASSERT_EQ_INT(x[i].verdict, y[i].verdict);
    ASSERT_EQ_MEM(&x[i].found, &y[i].found, sizeof(x[i].found));
    ASSERT_EQ_U64(x[i].nbytes, y[i].nbytes);
    ASSERT((x[i].why == NULL) == (y[i].why == NULL));
    if (x[i].why != NULL)
      ASSERT_EQ_STR(x[i].why, y[i].why);
    if (x[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(x[i].data, y[i].data, x[i].nbytes);
      float want[300 * COLS];
      la_payload_of(c[i].id, c[i].rows, want);
      ASSERT_EQ_MEM(x[i].data, want, x[i].nbytes);
    }
  }
}
