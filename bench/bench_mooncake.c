/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_mooncake: the engine against Mooncake's own C ABI, in one run, on
 * a real Mooncake Store.
 *
 *   ENCACHE_TEST_MOONCAKE=1 ENCACHE_MOONCAKE_LIBRARY=.../libmooncake_store.so \
 *   MOONCAKE_CONFIG_PATH=mooncake.json bench_mooncake [--iterations N]
 *   [--overlap] [--sleep] [--pin] [--reads-in-flight N]
 *
 * (a) 4 hits of 16 KiB, 1 MiB and 8 MiB: Mooncake's batch_is_exist then
 *     batch_get_into of the 4 whole objects into registered buffers of a
 *     client of its own ("raw"), interleaved with encache_lookup() of the
 *     same 4 objects into warm destinations: p50, p99 and raw/lookup
 *     (targets: >= 0.9 at 16 KiB, >= 0.95 from 1 MiB up); first with an
 *     allocator that lends headroom (each object read straight into its
 *     destination), then with one that does not (read into the staging
 *     buffer, then copied);
 * (b) sustained writes of 1 MiB objects: put_from of header + payload from
 *     a registered buffer, one after the other, vs the engine's
 *     publication of as many (publish on the caller's thread, background
 *     writes), objects per second and the ratio (target >= 0.9);
 * (c) lookups that do not wait (issue 29): 4 hits of 1 MiB and 8 MiB, the
 *     step loop with encache_lookup_start() overlapping a compute of C =
 *     0.5, 1 and 2 x the read time R against the blocking loop, and a
 *     lookup started and waited at once against encache_lookup()
 *     (bench_overlap_table(), overlap.h; goals <= 1.1 x max(C, R) and
 *     <= 1.05).  --overlap runs only (c); --sleep: the compute sleeps
 *     instead of spinning (its core left free); --pin: this thread on
 *     one CPU, the handle's threads on the others (measure_pin_threads());
 *     then two steps' lookups started together against one after another
 *     (the handle's store_reads_in_flight: 1 on Mooncake unless
 *     --reads-in-flight says).
 *
 * The library is loaded as src/store/mooncake.c loads it (dlopen of
 * $ENCACHE_MOONCAKE_LIBRARY, the prototypes of store_c.h in our own
 * words), and its client is set up from the same client JSON.  Without
 * ENCACHE_TEST_MOONCAKE=1 it says "skipped: ..." and exits 0.
 */
#include "hits.h"
#include "overlap.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4

static const char usage[] =
    "usage: ENCACHE_TEST_MOONCAKE=1 bench_mooncake [--iterations N] "
    "[--overlap] [--sleep] [--pin] [--reads-in-flight N]\n";

/* The engine's options (%s: store_reads_in_flight's value). */
static const char json_fmt[] =
    "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
    "\"store_max_pending_items\": 64, \"store_max_pending_bytes\": 4294967296, "
    "\"store_reads_in_flight\": %s}}";

/* Mooncake's store C ABI, the calls used here. */
typedef struct raw_abi {
  void *h;
  void *(*create)(void);
  void (*destroy)(void *);
  int (*setup)(void *, const char *, const char *, uint64_t, uint64_t,
               const char *, const char *, const char *);
  int (*put_from)(void *, const char *, void *, size_t, const void *);
  int (*batch_get_into)(void *, const char **, void **, const size_t *,
                        size_t, int64_t *);
  int (*batch_is_exist)(void *, const char **, size_t, int *);
  int (*register_buffer)(void *, void *, size_t);
  int (*unregister_buffer)(void *, void *);
} raw_abi;

static int load_abi(raw_abi *m) {
  const char *path = getenv("ENCACHE_MOONCAKE_LIBRARY");
  void *lib = dlopen(path && path[0] ? path : "libmooncake_store.so",
                     RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "bench_mooncake: %s\n", dlerror());
    return -1;
  }
  static const char *const names[] = {
      "mooncake_store_create",          "mooncake_store_destroy",
      "mooncake_store_setup",           "mooncake_store_put_from",
      "mooncake_store_batch_get_into",  "mooncake_store_batch_is_exist",
      "mooncake_store_register_buffer", "mooncake_store_unregister_buffer"};
  void *sym[8];
  for (int i = 0; i < 8; i++)
    if ((sym[i] = dlsym(lib, names[i])) == NULL) {
      fprintf(stderr, "bench_mooncake: no %s in the library\n", names[i]);
      return -1;
    }
  memcpy(&m->create, &sym[0], sizeof(sym[0]));
  memcpy(&m->destroy, &sym[1], sizeof(sym[0]));
  memcpy(&m->setup, &sym[2], sizeof(sym[0]));
  memcpy(&m->put_from, &sym[3], sizeof(sym[0]));
  memcpy(&m->batch_get_into, &sym[4], sizeof(sym[0]));
  memcpy(&m->batch_is_exist, &sym[5], sizeof(sym[0]));
  memcpy(&m->register_buffer, &sym[6], sizeof(sym[0]));
  memcpy(&m->unregister_buffer, &sym[7], sizeof(sym[0]));
  return 0;
}

/* A client of its own, set up from the client JSON as the backend does. */
static int raw_open(raw_abi *m) {
  encache_config *cfg = NULL;
  const char *host, *meta, *proto, *dev, *master;
  uint64_t seg, buf;
  if (encache_config_new(&cfg) != 0 ||
      encache_config_load_mooncake_file(cfg, NULL) != 0) {
    fprintf(stderr, "bench_mooncake: %s\n", encache_config_errmsg(cfg));
    encache_config_free(cfg);
    return -1;
  }
  encache_config_string(cfg, ENCACHE_OPT_LOCAL_HOSTNAME, &host);
  encache_config_string(cfg, ENCACHE_OPT_METADATA_SERVER, &meta);
  encache_config_string(cfg, ENCACHE_OPT_PROTOCOL, &proto);
  encache_config_string(cfg, ENCACHE_OPT_DEVICE_NAME, &dev);
  encache_config_string(cfg, ENCACHE_OPT_MASTER_SERVER_ADDRESS, &master);
  encache_config_u64(cfg, ENCACHE_OPT_GLOBAL_SEGMENT_SIZE, &seg);
  encache_config_u64(cfg, ENCACHE_OPT_LOCAL_BUFFER_SIZE, &buf);
  m->h = m->create();
  int rc = m->h == NULL ? -1
                        : m->setup(m->h, host, meta, seg, buf, proto, dev,
                                   master);
  if (rc == 0)
    printf("Mooncake client: protocol %s, master %s, metadata %s\n", proto,
           master, meta);
  else
    fprintf(stderr, "bench_mooncake: setup (master %s) answered %d\n", master,
            rc);
  encache_config_free(cfg);
  return rc == 0 ? 0 : -1;
}

/* (a): the raw side of 4 hits, its buffers registered once. */
typedef struct raw_hits {
  raw_abi *m;
  bench_hits *h;
  int exist[NOBJ];
} raw_hits;

static int raw_exist_read(void *ctx) {
  raw_hits *x = ctx;
  bench_hits *h = x->h;
  const char **keys = (const char **)h->keys;
  if (x->m->batch_is_exist(x->m->h, keys, NOBJ, x->exist) != 0 ||
      x->m->batch_get_into(x->m->h, keys, h->raw, h->caps, NOBJ, h->res) != 0)
    return fprintf(stderr, "bench_mooncake: a raw batch failed\n"), 1;
  for (int k = 0; k < NOBJ; k++)
    if (x->exist[k] != 1 || h->res[k] != (int64_t)h->caps[k])
      return fprintf(stderr, "bench_mooncake: raw %s: exists %d, read %lld\n",
                     h->keys[k], x->exist[k], (long long)h->res[k]), 1;
  return 0;
}

static int lookup_fn(void *ctx) { return bench_hits_lookup(((raw_hits *)ctx)->h); }

/* (a) with destinations that lend headroom bytes (0: none). */
static int bench_hits_vs_raw(raw_abi *m, encache *ec, encache_store *st,
                             int iters, size_t headroom) {
  static const size_t sizes[] = {16u << 10, 1u << 20, 8u << 20};
  printf("\n(a) 4 hits: batch_is_exist + batch_get_into (raw) vs "
         "encache_lookup, %s\n", headroom ? "destinations with headroom "
         "(read straight into them)" : "destinations without headroom "
         "(staged, then copied)");
  measure t, u;
  if (measure_init(&t, iters) < 0 || measure_init(&u, iters) < 0)
    return -1;
  measure_print_header("object", "raw", "lookup", 0);
  int rc = 0;
  for (int s = 0; s < 3 && rc == 0; s++) {
    bench_hits h;
    if ((rc = bench_hits_make(&h, ec, st, "a", NOBJ, sizes[s])) != 0)
      break;
    h.a.headroom = headroom;
    for (int k = 0; k < NOBJ; k++)
      if (m->register_buffer(m->h, h.raw[k], h.caps[k]) != 0)
        rc = fprintf(stderr, "bench_mooncake: register_buffer failed\n");
    raw_hits x = {m, &h, {0}};
    measure_clear(&t);
    measure_clear(&u);
    if (rc == 0)
      rc = measure_pair(&t, raw_exist_read, &u, lookup_fn, &x, 2, iters);
    char label[16];
    measure_size_label(label, sizeof(label), sizes[s]);
    if (rc == 0)
      measure_print_row(label, &t, &u, 0);
    for (int k = 0; k < NOBJ; k++)
      m->unregister_buffer(m->h, h.raw[k]);
    bench_hits_drop(&h); /* its removes may meet read leases: left there */
  }
  measure_free(&t);
  measure_free(&u);
  return rc;
}

/* (b), raw: put_from of objects first..first+total; seconds, or -1. */
static double raw_puts(raw_abi *m, encache *ec, int first, int total,
                       size_t nbytes, const void *data) {
  size_t len = nbytes + 24;
  void *page = NULL; /* page-aligned, as bench_hits_make()'s buffers */
  unsigned char *buf = posix_memalign(&page, 4096, len) == 0 ? page : NULL;
  if (buf == NULL || m->register_buffer(m->h, buf, len) != 0) {
    free(buf);
    return -1;
  }
  int64_t shape[2] = {(int64_t)(nbytes / 4096), 1024};
  encache_tensor v = {sizeof v, (void *)data, ENCACHE_FLOAT32, 2, shape, NULL,
                      0, 0, NULL};
  encache_header_encode(&v, buf);
  memcpy(buf + 24, data, nbytes);
  double t0 = measure_now(), dt = 0;
  for (int i = first; i < first + total && dt >= 0; i++) {
    char key[256], id[32];
    snprintf(id, sizeof(id), "b-raw-%d", i);
    encache_key(encache_namespace_of(ec), id, key, sizeof(key));
    int r = m->put_from(m->h, key, buf, len, NULL);
    if (r != 0)
      dt = -1, fprintf(stderr, "bench_mooncake: put_from answered %d\n", r);
  }
  if (dt >= 0)
    dt = measure_now() - t0;
  m->unregister_buffer(m->h, buf);
  free(buf);
  return dt;
}

/* (b), engine: as many publications (bench_publish_sustained()).
 * Seconds; the count written in *written. */
static double engine_puts(encache *ec, int first, int total, size_t nbytes,
                          void *data, uint64_t *written) {
  uint64_t rows = nbytes / 4096, cols = 1024;
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  return bench_publish_sustained(ec, "b-eng", first, total, &v, data, nbytes,
                                 written);
}

static int bench_writes(raw_abi *m, encache *ec, int iters) {
  size_t nbytes = 1u << 20;
  int total = (iters + 3) / 4 * 64; /* four rounds of steps of 16 */
  printf("\n(b) sustained writes of %d objects of 1 MiB: put_from (raw) vs "
         "publication\n", total);
  void *data = calloc(1, nbytes);
  if (data == NULL)
    return -1;
  /* Four rounds, raw then engine, then engine then raw, and again, so
   * that both meet the same machine and the same fresh Store memory. */
  double raw = 0, eng = 0;
  uint64_t written = 0;
  int n = total / 4;
  for (int round = 0; round < 4 && raw >= 0 && eng >= 0; round++) {
    uint64_t w = 0;
    double e = round % 2 ? engine_puts(ec, round * n, n, nbytes, data, &w) : 0;
    double r = raw_puts(m, ec, round * n, n, nbytes, data);
    if (round % 2 == 0 && r >= 0)
      e = engine_puts(ec, round * n, n, nbytes, data, &w);
    raw = r < 0 ? -1 : raw + r;
    eng = e < 0 ? -1 : eng + e;
    written += w;
  }
  free(data);
  if (raw < 0 || eng < 0)
    return -1;
  printf("raw put_from: %.0f objects/s (%.2f GB/s)\n", total / raw,
         measure_gbs((double)total * nbytes, raw));
  printf("publication:  %.0f objects/s (%.2f GB/s), %llu written, ratio "
         "%.2f\n", written / eng, measure_gbs((double)written * nbytes, eng),
         (unsigned long long)written, (written / eng) / (total / raw));
  return written == (uint64_t)total ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *url = "mooncake:";
  int iters = 20;
  int only_overlap = measure_take_flag(&argc, argv, "--overlap");
  int flags = bench_overlap_flags(&argc, argv);
  const char *readers = "0";
  if (measure_take_value(&argc, argv, "--reads-in-flight", &readers) < 0 ||
      strspn(readers, "0123456789") != strlen(readers) || !*readers ||
      strlen(readers) > 2) {
    fprintf(stderr, "bench_mooncake: --reads-in-flight takes 0 to 8\n%s",
            usage);
    return 2;
  }
  char json[512];
  snprintf(json, sizeof(json), json_fmt, readers);
  int rc = measure_options(argc, argv, usage, 0, &url, &iters, 5);
  if (rc >= 0)
    return rc;
  const char *on = getenv("ENCACHE_TEST_MOONCAKE");
  if (on == NULL || strcmp(on, "1") != 0) {
    printf("skipped: set ENCACHE_TEST_MOONCAKE=1 (with "
           "ENCACHE_MOONCAKE_LIBRARY and MOONCAKE_CONFIG_PATH) to measure "
           "on a real Mooncake Store\n");
    return 0;
  }
  raw_abi m;
  encache *ec;
  encache_store *st;
  if (bench_open("bench_mooncake", url, json, &ec, &st) != 0)
    return 1;
  if (load_abi(&m) != 0 || raw_open(&m) != 0) {
    encache_close(ec);
    encache_store_close(st);
    return 1;
  }
  printf("store: %s (caps 0x%x)\n", encache_store_url(st),
         encache_store_caps_of(st));
  rc = only_overlap ? 0 : bench_hits_vs_raw(&m, ec, st, iters, BENCH_HEADROOM);
  if (rc == 0 && !only_overlap)
    rc = bench_hits_vs_raw(&m, ec, st, iters, 0);
  if (rc == 0 && !only_overlap)
    rc = bench_writes(&m, ec, iters);
  if (rc == 0)
    rc = bench_overlap_table(ec, st, "(c)", "c", iters, flags);
  encache_close(ec);
  encache_store_close(st);
  m.destroy(m.h);
  return rc != 0;
}
