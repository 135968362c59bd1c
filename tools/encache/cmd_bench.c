/*
 * encache bench: the machine's memcpy bandwidth, each Store's raw batched
 * read, and an encache lookup of the same hits, in one run, for several
 * object sizes; every figure with its ratio to memcpy and to the raw read.
 * Prints a table (or JSON) and can draw an SVG chart.
 */
#include "tool.h"

#include "encache.h"

#include "bench_common.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_STORES 8
#define MAX_SIZES 16

typedef struct figures {
  double raw_gbs, lookup_gbs, raw_p50_ms, lookup_p50_ms;
  int ok;
} figures;

/* Measures one Store at one object size: raw batched read and lookup. */
static int measure(const char *url, uint64_t size, int batch, int iters,
                   figures *f) {
  memset(f, 0, sizeof(*f));
  uint64_t cols = size >= 4096 ? 1024 : size / 4, rows = size / 4 / cols;
  uint64_t nbytes = rows * cols * 4;
  char model[64];
  snprintf(model, sizeof(model), "encache-bench/%d", (int)getpid());
  encache_options o;
  memset(&o, 0, sizeof(o));
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
      "\"store_read_buffer_bytes\": 1073741824}}";
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  encache_store *st = NULL;
  if (encache_open(&o, &ec) != 0 || encache_store_open(url, &st) != 0) {
    fprintf(stderr, "encache bench: %s: %s%s\n", url, encache_errmsg(ec),
            encache_store_errmsg(st));
    encache_close(ec);
    encache_store_close(st);
    return -1;
  }
  void **dst = calloc((size_t)batch, sizeof(void *));
  void **raw = calloc((size_t)batch, sizeof(void *));
  char (*ids)[48] = calloc((size_t)batch, 48);
  char **keys = calloc((size_t)batch, sizeof(char *));
  size_t *caps = calloc((size_t)batch, sizeof(size_t));
  int64_t *res = calloc((size_t)batch, sizeof(int64_t));
  encache_candidate *c = calloc((size_t)batch, sizeof(*c));
  encache_result *r = calloc((size_t)batch, sizeof(*r));
  double *t = calloc((size_t)iters, sizeof(double));
  double *u = calloc((size_t)iters, sizeof(double));
  int rc = 0;
  for (int k = 0; k < batch; k++) {
    dst[k] = malloc(nbytes);
    raw[k] = malloc(nbytes + 24);
    memset(dst[k], k + 1, nbytes);
    snprintf(ids[k], 48, "b-%" PRIu64 "-%d", nbytes, k);
    keys[k] = malloc(4096);
    encache_key(encache_namespace_of(ec), ids[k], keys[k], 4096);
    caps[k] = nbytes + 24;
    encache_candidate cc = {ids[k], ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32,
                            rows, cols, ENCACHE_DEVICE_HOST, 0};
    c[k] = cc;
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    encache_tensor v = {dst[k], ENCACHE_FLOAT32, 2, shape, NULL};
    unsigned char hdr[24];
    encache_header_encode(&v, hdr);
    int w = encache_store_write(st, keys[k], hdr, 24, dst[k], nbytes);
    if (w != 0 && w != ENCACHE_EEXIST) {
      fprintf(stderr, "encache bench: %s: write: %s\n", url,
              encache_store_errmsg(st));
      rc = -1;
    }
  }
  bench_pool p = {dst};
  encache_allocator a = {&p, bench_pool_alloc, NULL};
  for (int i = -1; i < iters && rc == 0; i++) {
    double t0 = bench_now();
    int rr = encache_store_read(st, (const char *const *)keys, (size_t)batch,
                                raw, caps, res);
    double t1 = bench_now();
    int hits = encache_lookup(ec, c, (size_t)batch, &a, r);
    double t2 = bench_now();
    if (rr != 0 || hits != batch) {
      fprintf(stderr, "encache bench: %s: %d of %d hits (%s)\n", url, hits,
              batch, encache_errmsg(ec));
      rc = -1;
    }
    if (i >= 0) {
      t[i] = t1 - t0;
      u[i] = t2 - t1;
    }
  }
  if (rc == 0) {
    double bytes = (double)nbytes * batch;
    f->raw_p50_ms = bench_pct(t, iters, 50) * 1e3;
    f->lookup_p50_ms = bench_pct(u, iters, 50) * 1e3;
    f->raw_gbs = bytes / (f->raw_p50_ms / 1e3) / 1e9;
    f->lookup_gbs = bytes / (f->lookup_p50_ms / 1e3) / 1e9;
    f->ok = 1;
  }
  for (int k = 0; k < batch; k++) {
    encache_store_remove(st, keys[k]);
    free(dst[k]);
    free(raw[k]);
    free(keys[k]);
  }
  free(dst), free(raw), free(ids), free(keys), free(caps), free(res), free(c),
      free(r), free(t), free(u);
  encache_close(ec);
  encache_store_close(st);
  return rc;
}

static double memcpy_gbs(uint64_t size, int batch, int iters) {
  void **src = calloc((size_t)batch, sizeof(void *));
  void **dst = calloc((size_t)batch, sizeof(void *));
  double *t = calloc((size_t)iters, sizeof(double));
  for (int k = 0; k < batch; k++) {
    src[k] = malloc(size);
    dst[k] = malloc(size);
    memset(src[k], k, size);
    memset(dst[k], 0, size);
  }
  for (int i = -1; i < iters; i++) {
    double t0 = bench_now();
    for (int k = 0; k < batch; k++)
      memcpy(dst[k], src[k], size);
    if (i >= 0)
      t[i] = bench_now() - t0;
  }
  double gbs = (double)size * batch / bench_pct(t, iters, 50) / 1e9;
  for (int k = 0; k < batch; k++) {
    free(src[k]);
    free(dst[k]);
  }
  free(src), free(dst), free(t);
  return gbs;
}

static void size_label(char *buf, size_t n, uint64_t s) {
  if (s >= (1u << 20) && s % (1u << 20) == 0)
    snprintf(buf, n, "%" PRIu64 " MiB", s >> 20);
  else if (s >= 1024 && s % 1024 == 0)
    snprintf(buf, n, "%" PRIu64 " KiB", s >> 10);
  else
    snprintf(buf, n, "%" PRIu64 " B", s);
}

/* An SVG line chart: throughput against object size (log scale), one line
 * per Store's lookup and one for memcpy. */
static int plot(const char *path, const uint64_t *sizes, int ns,
                const double *mem, const char *const *urls, int nst,
                figures f[MAX_STORES][MAX_SIZES]) {
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
    size_label(lab, sizeof(lab), sizes[j]);
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
    "(--store may be given several times; default: a private shm segment)\n"
    "and object size, the raw batched read of BATCH objects and an encache\n"
    "lookup of the same hits; prints GB/s with the ratios lookup/memcpy and\n"
    "lookup/raw.  --plot draws throughput against object size as SVG.\n"
    "\n"
    "  --sizes LIST       comma-separated sizes (default 16KiB,1MiB,8MiB,30MiB)\n"
    "  --batch N          objects per batched call (default 4)\n"
    "  --iterations N     timed repetitions, the median is kept (default 20)\n";

int cmd_bench(const tool_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"store", required_argument, NULL, 'u'},
      {"sizes", required_argument, NULL, 's'},
      {"batch", required_argument, NULL, 'b'},
      {"iterations", required_argument, NULL, 'i'},
      {"json", no_argument, NULL, 'j'},
      {"plot", required_argument, NULL, 'p'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *urls[MAX_STORES];
  int nst = 0, batch = 4, iters = 20, json = 0, c;
  const char *sizes_arg = "16KiB,1MiB,8MiB,30MiB", *plot_path = NULL;
  long long v;
  for (int i = 0; i < g->nstores && nst < MAX_STORES; i++)
    urls[nst++] = g->stores[i];
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'u':
      if (nst == MAX_STORES)
        return usage_error("bench", "at most %d stores", MAX_STORES);
      urls[nst++] = optarg;
      break;
    case 's': sizes_arg = optarg; break;
    case 'b':
      if (parse_int_option("bench", "--batch", optarg, 0, &v) < 0 || v > 256)
        return EXIT_USAGE;
      batch = (int)v;
      break;
    case 'i':
      if (parse_int_option("bench", "--iterations", optarg, 0, &v) < 0 ||
          v > 100000)
        return EXIT_USAGE;
      iters = (int)v < 3 ? 3 : (int)v;
      break;
    case 'j': json = 1; break;
    case 'p': plot_path = optarg; break;
    case 'h': fputs(bench_usage, stdout); return EXIT_OK;
    case ':': return usage_error("bench", "%s needs a value", argv[optind - 1]);
    default:
      return usage_error("bench", "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  if (plot_path != NULL && (strlen(plot_path) < 4 ||
                            strcmp(plot_path + strlen(plot_path) - 4, ".svg")))
    return usage_error("bench", "--plot: only SVG is written: name the file "
                                "*.svg");
  uint64_t sizes[MAX_SIZES];
  int ns = 0;
  char *list = strdup(sizes_arg);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    if (ns == MAX_SIZES || encache_parse_size(tok, &sizes[ns]) < 0 ||
        sizes[ns] < 16 || sizes[ns] > (1ull << 30)) {
      usage_error("bench", "--sizes: \"%s\" is not a size from 16 B to 1 GiB "
                           "(at most %d sizes)", tok, MAX_SIZES);
      free(list);
      return EXIT_USAGE;
    }
    ns++;
  }
  free(list);
  char own[160] = "", own_name[64] = "";
  if (nst == 0) {
    uint64_t need = 64u << 20;
    for (int j = 0; j < ns; j++)
      if ((sizes[j] + 4096) * (uint64_t)batch * 2 + (64u << 20) > need)
        need = (sizes[j] + 4096) * (uint64_t)batch * 2 + (64u << 20);
    snprintf(own_name, sizeof(own_name), "encache-bench-%d", (int)getpid());
    snprintf(own, sizeof(own), "shm://%s?size=%" PRIu64, own_name, need);
    urls[nst++] = own;
  }
  double mem[MAX_SIZES];
  static figures f[MAX_STORES][MAX_SIZES];
  int failed = 0;
  for (int j = 0; j < ns; j++)
    mem[j] = memcpy_gbs(sizes[j], batch, iters);
  for (int s = 0; s < nst; s++)
    for (int j = 0; j < ns; j++)
      if (measure(urls[s], sizes[j], batch, iters, &f[s][j]) < 0)
        failed = 1;
  if (own_name[0])
    encache_shm_destroy(own_name);

  if (json) {
    printf("{\"batch\": %d, \"iterations\": %d, \"results\": [", batch, iters);
    for (int s = 0; s < nst; s++)
      for (int j = 0; j < ns; j++)
        printf("%s\n {\"store\": \"%s\", \"size\": %" PRIu64 ", "
               "\"memcpy_gbs\": %.3f, \"raw_gbs\": %.3f, \"lookup_gbs\": %.3f, "
               "\"raw_p50_ms\": %.4f, \"lookup_p50_ms\": %.4f, "
               "\"lookup_vs_memcpy\": %.3f, \"lookup_vs_raw\": %.3f}",
               s || j ? "," : "", urls[s], sizes[j], mem[j], f[s][j].raw_gbs,
               f[s][j].lookup_gbs, f[s][j].raw_p50_ms, f[s][j].lookup_p50_ms,
               f[s][j].lookup_gbs / mem[j],
               f[s][j].raw_gbs > 0 ? f[s][j].lookup_gbs / f[s][j].raw_gbs : 0);
    printf("\n]}\n");
  } else {
    printf("batch of %d objects, median of %d iterations\n\n", batch, iters);
    printf("%-44s %8s %9s %9s %9s %11s %8s %8s\n", "store", "size", "memcpy",
           "raw", "lookup", "lookup p50", "vs mem", "vs raw");
    for (int s = 0; s < nst; s++)
      for (int j = 0; j < ns; j++) {
        char lab[32];
        size_label(lab, sizeof(lab), sizes[j]);
        if (!f[s][j].ok) {
          printf("%-44.44s %8s   (failed)\n", urls[s], lab);
          continue;
        }
        printf("%-44.44s %8s %6.2fGB/s %6.2fGB/s %6.2fGB/s %9.3fms %8.2f %8.2f\n",
               urls[s], lab, mem[j], f[s][j].raw_gbs, f[s][j].lookup_gbs,
               f[s][j].lookup_p50_ms, f[s][j].lookup_gbs / mem[j],
               f[s][j].lookup_gbs / f[s][j].raw_gbs);
      }
  }
  if (plot_path != NULL) {
    if (plot(plot_path, sizes, ns, mem, urls, nst, f) < 0)
      return EXIT_FAIL;
    if (!json)
      printf("\nchart: %s\n", plot_path);
  }
  return failed ? EXIT_FAIL : EXIT_OK;
}
