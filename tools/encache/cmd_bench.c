/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encache bench: the machine's memcpy bandwidth, each Store's raw batched
 * read, and an encache lookup of the same hits, in one run, for several
 * object sizes; every figure with its ratio to memcpy and to the raw read.
 * Then the blocking and the non-blocking lookup side by side: the lookup
 * against one started and waited at once, and a step loop's step with
 * the compute C equal to the read time, blocking against overlapped
 * (bench_overlap_measure(), tools/bench/overlap.h).  Prints tables (or
 * JSON) and can draw an SVG chart.  The timing is the benchmarks'
 * measuring core (tools/bench/measure.h), the objects tools/bench/hits.h's.
 */
#include "commands.h"

#include "encache.h"

#include "hits.h"
#include "overlap.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SIZES 16

typedef struct figures {
  double raw_gbs, lookup_gbs, raw_p50_ms, lookup_p50_ms;
  bench_overlap ov; /* blocking vs non-blocking, C = 1 x R */
  int ok;
} figures;

/* Measures one Store at one object size: raw batched read and lookup. */
static int measure_store(const char *url, uint64_t size, int batch, int iters,
                         figures *f) {
  memset(f, 0, sizeof(*f));
  encache *ec;
  encache_store *st;
  if (bench_open("encache bench", url,
                 "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
                 "true, \"store_read_buffer_bytes\": 1073741824}}",
                 &ec, &st) != 0)
    return -1;
  bench_hits h;
  measure t = {NULL, 0, 0}, u = {NULL, 0, 0};
  int rc = bench_hits_make(&h, ec, st, "b", batch, size);
  if (rc == 0 && (measure_init(&t, iters) < 0 || measure_init(&u, iters) < 0))
    rc = -1;
  if (rc == 0 &&
      measure_pair(&t, bench_hits_read, &u, bench_hits_lookup, &h, 1, iters))
    rc = -1;
  static const double one_r = 1.0;
  if (rc == 0 && bench_overlap_measure(&h, &one_r, 1, iters, 0, &f->ov) != 0)
    rc = -1;
  if (rc == 0) {
    double bytes = (double)h.nbytes * batch;
    f->raw_p50_ms = measure_pct(&t, 50) * 1e3;
    f->lookup_p50_ms = measure_pct(&u, 50) * 1e3;
    f->raw_gbs = measure_gbs(bytes, f->raw_p50_ms / 1e3);
    f->lookup_gbs = measure_gbs(bytes, f->lookup_p50_ms / 1e3);
    f->ok = 1;
  }
  bench_hits_drop(&h);
  measure_free(&t);
  measure_free(&u);
  encache_close(ec);
  encache_store_close(st);
  if (rc < 0) {
    char shown[256];
    measure_url_shown(url, shown, sizeof(shown));
    fprintf(stderr, "encache bench: %s: measurement failed\n", shown);
  }
  return rc;
}

/* memcpy of batch buffers of size bytes (the baseline). */
typedef struct copies {
  void **src, **dst;
  int batch;
  uint64_t size;
} copies;

static int copy(void *ctx) {
  copies *c = ctx;
  for (int k = 0; k < c->batch; k++)
    memcpy(c->dst[k], c->src[k], c->size);
  return 0;
}

static double memcpy_gbs(uint64_t size, int batch, int iters) {
  copies c = {calloc((size_t)batch, sizeof(void *)),
              calloc((size_t)batch, sizeof(void *)), batch, size};
  for (int k = 0; k < batch; k++) {
    c.src[k] = malloc(size);
    c.dst[k] = malloc(size);
    memset(c.src[k], k, size);
    memset(c.dst[k], 0, size);
  }
  measure t;
  measure_init(&t, iters);
  measure_pair(&t, copy, NULL, NULL, &c, 1, iters);
  double gbs = measure_gbs((double)size * batch, measure_pct(&t, 50));
  measure_free(&t);
  for (int k = 0; k < batch; k++) {
    free(c.src[k]);
    free(c.dst[k]);
  }
  free(c.src), free(c.dst);
  return gbs;
}

/* An SVG line chart: throughput against object size (log scale), one line
 * per Store's lookup and one for memcpy. */
static int plot(const char *path, const uint64_t *sizes, int ns,
                const double *mem, const char (*urls)[256], int nst,
                figures f[TOOL_MAX_STORES][MAX_SIZES]) {
  FILE *out = fopen(path, "w");
  if (out == NULL) {
    perror(path);
    return -1;
  }
  const int W = 760, H = 440, L = 70, R = 220, T = 40, B = 60;
  double ymax = 0;
  for (int j = 0; j < ns; j++) {
    if (mem[j] > ymax)
      ymax = mem[j];
    for (int s = 0; s < nst; s++)
      if (f[s][j].lookup_gbs > ymax)
        ymax = f[s][j].lookup_gbs;
  }
  ymax = ymax <= 0 ? 1 : ymax * 1.1;
  double lx0 = log2((double)sizes[0]), lx1 = log2((double)sizes[ns - 1]);
  if (lx1 <= lx0)
    lx1 = lx0 + 1;
#define X(j) (L + (log2((double)sizes[j]) - lx0) / (lx1 - lx0) * (W - L - R))
#define Y(v) (H - B - (v) / ymax * (H - T - B))
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
               "height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%d\" y=\"24\" font-size=\"15\">encache bench: batched "
               "lookup throughput vs object size</text>\n", W, H, L);
  fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
               "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
          L, H - B, W - R, H - B, L, T, L, H - B);
  for (int k = 0; k <= 4; k++) {
    double v = ymax * k / 4;
    fprintf(out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n"
                 "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
            L - 6, Y(v) + 4, v, L, Y(v), W - R, Y(v));
  }
  for (int j = 0; j < ns; j++) {
    char lab[32];
    measure_size_label(lab, sizeof(lab), sizes[j]);
    fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
            X(j), H - B + 18, lab);
  }
  fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">object size "
               "(log scale)</text>\n<text x=\"16\" y=\"%d\" transform=\"rotate("
               "-90 16 %d)\" text-anchor=\"middle\">GB/s</text>\n",
          (L + W - R) / 2, H - 16, (T + H - B) / 2, (T + H - B) / 2);
  static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                       "#9467bd", "#ff7f0e", "#8c564b",
                                       "#e377c2", "#17becf"};
  for (int s = -1; s < nst; s++) {
    const char *color = s < 0 ? "#555" : colors[s % 8];
    fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s "
                 "points=\"", color, s < 0 ? " stroke-dasharray=\"6 4\"" : "");
    for (int j = 0; j < ns; j++)
      fprintf(out, "%.1f,%.1f ", X(j), Y(s < 0 ? mem[j] : f[s][j].lookup_gbs));
    fprintf(out, "\"/>\n<text x=\"%d\" y=\"%d\" fill=\"%s\">%.28s</text>\n",
            W - R + 12, T + 20 * (s + 2), color, s < 0 ? "memcpy" : urls[s]);
  }
  fprintf(out, "</svg>\n");
#undef X
#undef Y
  return fclose(out) == 0 ? 0 : -1;
}

static const char bench_usage[] =
    "usage: encache [--store URL]... bench [--sizes LIST] [--batch N]\n"
    "                [--iterations N] [--json] [--plot FILE.svg]\n"
    "\n"
    "Measures, in one run, the machine's memcpy bandwidth and, for each Store\n"
    "(--store may be given several times; default: $ENCACHE_STORE, else a\n"
    "private shm segment, removed at the end)\n"
    "and object size, the raw batched read of BATCH objects and an encache\n"
    "lookup of the same hits; prints GB/s with the ratios lookup/memcpy and\n"
    "lookup/raw.  --plot draws throughput against object size as SVG.\n"
    "\n"
    "Then the blocking and the non-blocking lookup side by side: the lookup\n"
    "against one started and waited at once (encache_lookup_start, then\n"
    "encache_step_wait; goal <= 1.05 x), and a serving loop's step whose\n"
    "encoding (a spin of C on the caller's thread) takes as long as the\n"
    "lookup, R: blocking (lookup, then encode: C + R) against overlapped\n"
    "(start the next step's lookup, encode, wait; goal <= 1.1 x max(C, R)),\n"
    "with the time still waited.  The spin holds a core: with 2 cores the\n"
    "lookup thread has the other to itself, and a Store's server on the\n"
    "same machine (redis-server) competes with both.\n"
    "\n"
    "  --sizes LIST       comma-separated sizes (default 16KiB,1MiB,8MiB,30MiB)\n"
    "  --batch N          objects per batched call (default 4)\n"
    "  --iterations N     timed repetitions, the median is kept (default 20)\n";

enum { B_SIZES, B_BATCH, B_ITERATIONS, B_PLOT };

static const tool_opt bench_opts[] = {[B_SIZES] = {"sizes", 1},
                                      [B_BATCH] = {"batch", 1},
                                      [B_ITERATIONS] = {"iterations", 1},
                                      [B_PLOT] = {"plot", 1},
                                      {NULL, 0}};

/* --sizes into sizes[]; returns how many, or -1 after a message. */
static int parse_sizes(const char *arg, uint64_t *sizes) {
  int ns = 0;
  char *list = strdup(arg);
  if (list == NULL)
    return usage_error("bench", "out of memory"), -1;
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    if (ns == MAX_SIZES || encache_parse_size(tok, &sizes[ns]) < 0 ||
        sizes[ns] < 16 || sizes[ns] > (1ull << 30)) {
      usage_error("bench", "--sizes: \"%s\" is not a size from 16 B to 1 GiB "
                           "(at most %d sizes)", tok, MAX_SIZES);
      free(list);
      return -1;
    }
    ns++;
  }
  free(list);
  return ns > 0 ? ns : (usage_error("bench", "--sizes: empty list"), -1);
}

typedef struct bench_table {
  int batch, iters, ns, nst;
  uint64_t sizes[MAX_SIZES];
  const char *urls[TOOL_MAX_STORES];
  char shown[TOOL_MAX_STORES][256]; /* the URLs as output shows them */
  double mem[MAX_SIZES];
  figures f[TOOL_MAX_STORES][MAX_SIZES];
} bench_table;

static void print_json(const bench_table *t) {
  printf("{\"batch\": %d, \"iterations\": %d, \"results\": [", t->batch,
         t->iters);
  for (int s = 0; s < t->nst; s++)
    for (int j = 0; j < t->ns; j++) {
      const figures *f = &t->f[s][j];
      printf("%s\n {\"store\": \"%s\", \"size\": %" PRIu64 ", "
             "\"memcpy_gbs\": %.3f, \"raw_gbs\": %.3f, \"lookup_gbs\": %.3f, "
             "\"raw_p50_ms\": %.4f, \"lookup_p50_ms\": %.4f, "
             "\"lookup_vs_memcpy\": %.3f, \"lookup_vs_raw\": %.3f, "
             "\"overlap\": {\"lookup_p50_ms\": %.4f, "
             "\"start_wait_p50_ms\": %.4f, \"start_wait_vs_lookup\": %.3f, "
             "\"compute_ms\": %.4f, \"step_blocking_ms\": %.4f, "
             "\"step_overlapped_ms\": %.4f, \"step_vs_max\": %.3f, "
             "\"waited_ms\": %.4f}}",
             s || j ? "," : "", t->shown[s], t->sizes[j], t->mem[j], f->raw_gbs,
             f->lookup_gbs, f->raw_p50_ms, f->lookup_p50_ms,
             f->lookup_gbs / t->mem[j],
             f->raw_gbs > 0 ? f->lookup_gbs / f->raw_gbs : 0,
             f->ov.lookup * 1e3, f->ov.at_once * 1e3,
             f->ov.lookup > 0 ? f->ov.at_once / f->ov.lookup : 0,
             f->ov.c[0] * 1e3, f->ov.blocking[0] * 1e3,
             f->ov.overlapped[0] * 1e3, bench_overlap_ratio(&f->ov, 0),
             f->ov.waited[0] * 1e3);
    }
  printf("\n]}\n");
}

static void print_table(const bench_table *t) {
  printf("batch of %d objects, median of %d iterations\n\n", t->batch,
         t->iters);
  printf("%-44s %8s %9s %9s %9s %11s %8s %8s\n", "store", "size", "memcpy",
         "raw", "lookup", "lookup p50", "vs mem", "vs raw");
  for (int s = 0; s < t->nst; s++)
    for (int j = 0; j < t->ns; j++) {
      const figures *f = &t->f[s][j];
      char lab[32];
      measure_size_label(lab, sizeof(lab), t->sizes[j]);
      if (!f->ok) {
        printf("%-44.44s %8s   (failed)\n", t->shown[s], lab);
        continue;
      }
      printf("%-44.44s %8s %6.2fGB/s %6.2fGB/s %6.2fGB/s %9.3fms %8.2f %8.2f\n",
             t->shown[s], lab, t->mem[j], f->raw_gbs, f->lookup_gbs,
             f->lookup_p50_ms, f->lookup_gbs / t->mem[j],
             f->lookup_gbs / f->raw_gbs);
    }
  printf("\nblocking and non-blocking lookup, p50 (ms): the lookup R "
         "against one started and\nwaited at once (ratio, goal <= 1.05); "
         "a step that encodes for C = R (a spin on this\nthread): blocking "
         "(lookup, then encode) against overlapped (start the next "
         "step's\nlookup, encode, wait; ratio to max(C, R), goal <= 1.1), "
         "and the time it still waited\n\n");
  printf("%-44s %8s %9s %10s %7s %9s %10s %8s %8s\n", "store", "size",
         "lookup", "start+wait", "ratio", "blocking", "overlapped", "ratio",
         "waited");
  for (int s = 0; s < t->nst; s++)
    for (int j = 0; j < t->ns; j++) {
      const bench_overlap *o = &t->f[s][j].ov;
      char lab[32];
      measure_size_label(lab, sizeof(lab), t->sizes[j]);
      if (!t->f[s][j].ok)
        continue;
      printf("%-44.44s %8s %9.3f %10.3f %7.3f %9.3f %10.3f %8.3f %8.3f\n",
             t->shown[s], lab, o->lookup * 1e3, o->at_once * 1e3,
             o->lookup > 0 ? o->at_once / o->lookup : 0, o->blocking[0] * 1e3,
             o->overlapped[0] * 1e3, bench_overlap_ratio(o, 0),
             o->waited[0] * 1e3);
    }
}

/* The Stores to measure: those given (--store, else $ENCACHE_STORE, as
 * every command reads it), or a private shm segment sized for the largest
 * batch (its name in own_name). */
static void pick_stores(const tool_globals *g, bench_table *t, char *own,
                        size_t own_size, char *own_name, size_t name_size) {
  for (int i = 0; i < g->nstores; i++)
    t->urls[t->nst++] = g->stores[i];
  if (t->nst == 0 && g->store_url != NULL)
    t->urls[t->nst++] = g->store_url;
  if (t->nst > 0)
    return;
  uint64_t need = 64u << 20;
  for (int j = 0; j < t->ns; j++) {
    uint64_t n = (t->sizes[j] + 4096) * (uint64_t)t->batch * 2 + (64u << 20);
    if (n > need)
      need = n;
  }
  snprintf(own_name, name_size, "encache-bench-%d", (int)getpid());
  snprintf(own, own_size, "shm://%s?size=%" PRIu64, own_name, need);
  t->urls[t->nst++] = own;
}

static int run_bench(const tool_globals *g, const tool_args *a) {
  static bench_table t;
  const char *plot_path = a->val[B_PLOT];
  t.batch = 4;
  t.iters = 20;
  if (a->val[B_BATCH] != NULL &&
      tool_int32("bench", "--batch", a->val[B_BATCH], 1, 256, &t.batch) < 0)
    return EXIT_USAGE;
  if (a->val[B_ITERATIONS] != NULL &&
      tool_int32("bench", "--iterations", a->val[B_ITERATIONS], 1, 100000,
                 &t.iters) < 0)
    return EXIT_USAGE;
  if (t.iters < 3)
    t.iters = 3;
  if (plot_path != NULL && (strlen(plot_path) < 4 ||
                            strcmp(plot_path + strlen(plot_path) - 4, ".svg")))
    return usage_error("bench", "--plot: only SVG is written: name the file "
                                "*.svg");
  t.ns = parse_sizes(a->val[B_SIZES] ? a->val[B_SIZES]
                                     : "16KiB,1MiB,8MiB,30MiB", t.sizes);
  if (t.ns < 0)
    return EXIT_USAGE;
  char own[160] = "", own_name[64] = "";
  pick_stores(g, &t, own, sizeof(own), own_name, sizeof(own_name));
  for (int s = 0; s < t.nst; s++) {
    measure_url_shown(t.urls[s], t.shown[s], sizeof(t.shown[s]));
    /* A Store that cannot be opened stops the run before any figure. */
    encache_store *st = NULL;
    if (encache_store_open(t.urls[s], &st) != 0) {
      fprintf(stderr, "encache bench: cannot open the Store %s: %s\n",
              t.shown[s], encache_store_errmsg(NULL));
      if (own_name[0])
        encache_shm_destroy(own_name);
      return EXIT_FAIL;
    }
    encache_store_close(st);
  }
  int failed = 0;
  for (int j = 0; j < t.ns; j++)
    t.mem[j] = memcpy_gbs(t.sizes[j], t.batch, t.iters);
  for (int s = 0; s < t.nst; s++)
    for (int j = 0; j < t.ns; j++)
      if (measure_store(t.urls[s], t.sizes[j], t.batch, t.iters,
                        &t.f[s][j]) < 0)
        failed = 1;
  if (own_name[0])
    encache_shm_destroy(own_name);
  if (g->json)
    print_json(&t);
  else
    print_table(&t);
  if (plot_path != NULL) {
    if (plot(plot_path, t.sizes, t.ns, t.mem, t.shown, t.nst, t.f) < 0)
      return EXIT_FAIL;
    if (!g->json)
      printf("\nchart: %s\n", plot_path);
  }
  return failed ? EXIT_FAIL : EXIT_OK;
}

const tool_command cmd_bench = {
    "bench", "measure Stores against memcpy and their raw reads", bench_usage,
    bench_opts, TOOL_STORES | TOOL_JSON, 0, 0, "", run_bench};
