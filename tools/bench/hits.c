/* SPDX-License-Identifier: Apache-2.0 */
/* hits.c: the benchmarks' engine calls and objects (see hits.h). */
#include "hits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bench_pool_alloc(void *ctx, size_t i, const encache_candidate *c,
                     uint64_t nbytes, void **data, void **handle) {
  (void)c, (void)nbytes;
  *data = ((bench_pool *)ctx)->buf[i];
  *handle = NULL;
  return 0;
}

int bench_open(const char *prog, const char *url, const char *json,
               encache **ec, encache_store **st) {
  char model[64];
  snprintf(model, sizeof(model), "bench/%d", (int)getpid());
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  *ec = NULL;
  *st = NULL;
  if (encache_open(&o, ec) != 0 || encache_store_open(url, st) != 0) {
    char shown[256];
    measure_url_shown(url, shown, sizeof(shown));
    fprintf(stderr, "%s: %s: %s%s\n", prog, shown,
            *ec == NULL ? encache_errmsg(NULL) : "", encache_store_errmsg(NULL));
    encache_close(*ec);
    encache_store_close(*st);
    *ec = NULL;
    *st = NULL;
    return -1;
  }
  return 0;
}

int bench_lookup(encache *ec, encache_step **step, const encache_candidate *c,
                 size_t n, const encache_allocator *a, encache_result *r) {
  for (size_t i = 0; i < n; i++)
    r[i].size = sizeof(r[i]);
  int rc = encache_step_open(ec, step);
  return rc < 0 ? rc : encache_lookup(*step, c, n, a, r);
}

int bench_publish(encache_step *step, const char *id, const encache_tensor *v,
                  encache_storage *s) {
  return encache_publish(step, id, v, s);
}

void bench_stats(encache *ec, encache_stats *s) {
  s->size = sizeof(*s);
  encache_stats_get(ec, s);
}

encache_candidate bench_candidate(const char *id, uint64_t rows,
                                  uint64_t cols) {
  encache_candidate c = {sizeof(c), id,   ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, rows, cols, ENCACHE_DEVICE_HOST, 0};
  return c;
}

void bench_flush_if_full(encache *ec) {
  encache_stats now;
  bench_stats(ec, &now);
  if (now.pending_items > 40)
    encache_flush(ec);
}

double bench_publish_sustained(encache *ec, const char *prefix, int first,
                               int total, const encache_tensor *v,
                               const void *data, size_t nbytes,
                               uint64_t *written) {
  enum { B = 16 };
  bench_pool none = {NULL};
  encache_allocator a = {sizeof(a), &none, bench_pool_alloc, NULL, 0};
  encache_stats s0, s1;
  bench_stats(ec, &s0);
  double t0 = measure_now();
  for (int i = first; i < first + total; i += B) {
    char ids[B][32];
    encache_candidate c[B];
    encache_result r[B];
    for (int k = 0; k < B; k++) {
      snprintf(ids[k], sizeof(ids[k]), "%s-%d", prefix, i + k);
      c[k] = bench_candidate(ids[k], (uint64_t)v->shape[0],
                             (uint64_t)v->shape[1]);
    }
    encache_step *step = NULL;
    bench_lookup(ec, &step, c, B, &a, r);
    for (int k = 0; k < B; k++) {
      encache_storage *stg = NULL;
      encache_storage_new(data, nbytes, NULL, NULL, &stg);
      bench_publish(step, ids[k], v, stg);
      encache_storage_unref(stg);
    }
    encache_step_close(step);
    bench_flush_if_full(ec);
  }
  encache_flush(ec);
  double dt = measure_now() - t0;
  bench_stats(ec, &s1);
  *written = s1.published_written - s0.published_written;
  return dt;
}

int bench_write_object(encache_store *st, const char *key, void *data,
                       uint64_t rows, uint64_t cols) {
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[24];
  encache_header_encode(&v, hdr);
  return encache_store_write(st, key, hdr, 24, data, rows * cols * 4);
}

void bench_hits_drop(bench_hits *h) {
  for (int k = 0; h->dst && h->raw && h->keys && k < h->n; k++) {
    if (h->keys[k] != NULL)
      encache_store_remove(h->st, h->keys[k]);
    free(h->dst[k] ? (char *)h->dst[k] - BENCH_HEADROOM : NULL);
    free(h->raw[k]);
    free(h->keys[k]);
  }
  free(h->dst), free(h->raw), free(h->ids), free(h->keys), free(h->caps),
      free(h->res), free(h->c), free(h->r);
  memset(h, 0, sizeof(*h));
}

int bench_hits_make(bench_hits *h, encache *ec, encache_store *st,
                    const char *prefix, int n, uint64_t size) {
  memset(h, 0, sizeof(*h));
  h->ec = ec, h->st = st, h->n = n;
  h->cols = size >= 4096 ? 1024 : size / 4;
  h->rows = size / 4 / h->cols;
  h->nbytes = h->rows * h->cols * 4;
  size_t m = (size_t)n;
  h->dst = calloc(m, sizeof(void *)), h->raw = calloc(m, sizeof(void *));
  h->ids = calloc(m, 48), h->keys = calloc(m, sizeof(char *));
  h->caps = calloc(m, sizeof(size_t)), h->res = calloc(m, sizeof(int64_t));
  h->c = calloc(m, sizeof(*h->c)), h->r = calloc(m, sizeof(*h->r));
  int rc = h->dst && h->raw && h->ids && h->keys && h->caps && h->res &&
                   h->c && h->r ? 0 : -1;
  for (int k = 0; k < n && rc == 0; k++) {
    void *room = NULL, *raw = NULL;
    if (posix_memalign(&room, 4096, BENCH_HEADROOM + h->nbytes) == 0)
      h->dst[k] = (char *)room + BENCH_HEADROOM;
    if (posix_memalign(&raw, 4096, h->nbytes + 24) == 0)
      h->raw[k] = memset(raw, 0, h->nbytes + 24);
    h->keys[k] = malloc(4096);
    if (!h->dst[k] || !h->raw[k] || !h->keys[k]) {
      rc = -1;
      break;
    }
    memset(h->dst[k], k + 1, h->nbytes);
    snprintf(h->ids[k], 48, "%s-%llu-%d", prefix,
             (unsigned long long)h->nbytes, k);
    encache_key(encache_namespace_of(ec), h->ids[k], h->keys[k], 4096);
    h->caps[k] = h->nbytes + 24;
    h->c[k] = bench_candidate(h->ids[k], h->rows, h->cols);
    int w = bench_write_object(st, h->keys[k], h->dst[k], h->rows, h->cols);
    if (w != 0 && w != ENCACHE_EEXIST) {
      fprintf(stderr, "bench: write: %s\n", encache_store_errmsg(st));
      rc = -2;
    }
  }
  if (rc == -1)
    fprintf(stderr, "bench: out of memory\n");
  if (rc < 0) {
    bench_hits_drop(h);
    return -1;
  }
  h->pool.buf = h->dst;
  encache_allocator a = {sizeof(a), &h->pool, bench_pool_alloc, NULL,
                         BENCH_HEADROOM};
  h->a = a;
  return 0;
}

int bench_hits_read(void *ctx) {
  bench_hits *h = ctx;
  int rc = encache_store_read(h->st, (const char *const *)h->keys,
                              (size_t)h->n, h->raw, h->caps, h->res);
  if (rc != 0)
    fprintf(stderr, "bench: read: %s\n", encache_store_errmsg(h->st));
  return rc != 0;
}

int bench_hits_check(bench_hits *h, int hits) {
  if (hits != h->n)
    fprintf(stderr, "bench: %d of %d hits: %s\n", hits, h->n,
            encache_errmsg(h->ec));
  return hits != h->n;
}

int bench_hits_lookup(void *ctx) {
  bench_hits *h = ctx;
  encache_step *step = NULL;
  int hits = bench_lookup(h->ec, &step, h->c, (size_t)h->n, &h->a, h->r);
  encache_step_close(step);
  return bench_hits_check(h, hits);
}

int bench_hits_table(encache *ec, encache_store *st, const char *prefix, int n,
                     const size_t *sizes, int nsizes, measure_fn raw,
                     int iters) {
  measure t, u;
  if (measure_init(&t, iters) < 0 || measure_init(&u, iters) < 0)
    return -1;
  measure_print_header("object", "raw", "lookup", 0);
  int rc = 0;
  for (int s = 0; s < nsizes && rc == 0; s++) {
    bench_hits h;
    if ((rc = bench_hits_make(&h, ec, st, prefix, n, sizes[s])) != 0)
      break;
    measure_clear(&t);
    measure_clear(&u);
    rc = measure_pair(&t, raw, &u, bench_hits_lookup, &h, 1, iters);
    char label[16];
    measure_size_label(label, sizeof(label), sizes[s]);
    if (rc == 0)
      measure_print_row(label, &t, &u, 0);
    bench_hits_drop(&h);
  }
  measure_free(&t);
  measure_free(&u);
  return rc;
}
