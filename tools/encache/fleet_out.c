/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fleet_out.c: the statistics registry read into rows, and printed as
 * Prometheus text (format 0.0.4), JSON or a table.  One table of the
 * engine's counters (name, type, help, field) drives the Prometheus and
 * JSON output, so that both name every field of encache_stats.
 */
#include "fleet_out.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *fleet_segment(const char *arg) {
  static char def[64];
  const char *env = getenv("ENCACHE_STATS_SEGMENT");
  if (arg != NULL)
    return arg;
  if (env != NULL && env[0] != '\0')
    return env;
  snprintf(def, sizeof(def), FLEET_DEFAULT_SEGMENT ".%u", (unsigned)geteuid());
  return def;
}

static int collect_one(const encache_fleet_entry *e, void *ctx) {
  fleet_view *v = ctx;
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 16;
    fleet_row *r = realloc(v->rows, cap * sizeof(*r));
    if (r == NULL)
      return 1;
    v->rows = r;
    v->cap = cap;
  }
  fleet_row *r = &v->rows[v->n++];
  memset(r, 0, sizeof(*r));
  r->slot = e->slot;
  r->pid = (long long)e->pid;
  snprintf(r->encoder, sizeof(r->encoder), "%s", e->encoder);
  snprintf(r->store, sizeof(r->store), "%s", e->store);
  snprintf(r->ns, sizeof(r->ns), "%s", e->ns);
  r->st = *e->stats;
  r->lookup = *e->lookup;
  r->write = *e->write;
  r->bytes_written = e->bytes_written;
  return 0;
}

int fleet_collect(const char *segment, fleet_view *v, char *why, size_t n) {
  v->n = 0;
  int rc = encache_fleet_read(segment, collect_one, v);
  if (rc == ENCACHE_ENOENT)
    return 0; /* no encoder has published on this host yet */
  if (rc < 0) {
    snprintf(why, n, "%s", encache_errmsg(NULL));
    return rc;
  }
  if ((size_t)rc != v->n) {
    snprintf(why, n, "out of memory");
    return ENCACHE_ENOMEM;
  }
  return 0;
}

void fleet_view_free(fleet_view *v) {
  free(v->rows);
  memset(v, 0, sizeof(*v));
}

static double bucket_bound_us(int i) {
  return (double)(UINT64_C(1) << i);
}

double fleet_quantile(const encache_histogram *h, double q) {
  uint64_t total = 0, below = 0;
  for (int i = 0; i < ENCACHE_HISTOGRAM_BUCKETS; i++)
    total += h->bucket[i];
  if (total == 0)
    return -1;
  double rank = q * (double)total;
  for (int i = 0; i < ENCACHE_HISTOGRAM_BUCKETS; i++) {
    uint64_t c = h->bucket[i];
    if (c > 0 && (double)(below + c) >= rank) {
      if (i == ENCACHE_HISTOGRAM_BUCKETS - 1) /* beyond the last bound */
        return bucket_bound_us(i - 1);
      double lo = i == 0 ? 0 : bucket_bound_us(i - 1), hi = bucket_bound_us(i);
      return lo + (hi - lo) * ((rank - (double)below) / (double)c);
    }
    below += c;
  }
  return bucket_bound_us(ENCACHE_HISTOGRAM_BUCKETS - 2);
}

/* ------------------------------------------------------------ counters */

enum { COUNTER, GAUGE };

/* Every field of encache_stats, in its order (poisoned apart). */
typedef struct metric {
  const char *field; /* its name in encache_stats (and in the JSON) */
  const char *name;  /* encache_NAME (counters: + "_total") */
  int type;
  size_t off;   /* in encache_stats */
  double scale; /* 1, or 1e-6 for microseconds shown in seconds */
  const char *help;
} metric;

#define M_(field, name, type, scale, help)                                   \
  {#field, name, type, offsetof(encache_stats, field), scale, help}

static const metric metrics[] = {
    M_(lookups, "lookups", COUNTER, 1, "encache_lookup() calls"),
    M_(candidates, "candidates", COUNTER, 1, "candidates looked up"),
    M_(hits, "hits", COUNTER, 1,
       "candidates delivered from the Store: encodes avoided"),
    M_(misses, "misses", COUNTER, 1, "MISS outcomes"),
    M_(incompatible, "incompatible", COUNTER, 1, "INCOMPATIBLE outcomes"),
    M_(oversize, "oversize", COUNTER, 1, "OVERSIZE outcomes"),
    M_(unavailable, "unavailable", COUNTER, 1, "UNAVAILABLE outcomes"),
    M_(skipped, "skipped", COUNTER, 1, "SKIPPED outcomes"),
    M_(bytes_read, "read_bytes", COUNTER, 1,
       "payload bytes loaded into destinations"),
    M_(batched_reads, "batched_reads", COUNTER, 1,
       "Store read calls (one per chunk)"),
    M_(published_queued, "published_queued", COUNTER, 1,
       "outputs queued for the Store"),
    M_(published_written, "published_written", COUNTER, 1,
       "outputs written to the Store"),
    M_(published_present, "published_present", COUNTER, 1,
       "outputs already in the Store: nothing written"),
    M_(published_failed, "published_failed", COUNTER, 1,
       "outputs not written: recoverable Store failures"),
    M_(pending_items, "pending_items", GAUGE, 1,
       "outputs queued or being written, not yet reaped"),
    M_(pending_bytes, "pending_bytes", GAUGE, 1,
       "bytes charged to the pending outputs"),
    M_(staging_allocations, "staging_allocations", COUNTER, 1,
       "times the staging buffer was allocated"),
    M_(staging_bytes, "staging_bytes", GAUGE, 1,
       "the staging buffer's size (0: none)"),
    M_(steps_open, "steps_open", GAUGE, 1, "steps open now"),
    M_(in_flight, "in_flight", COUNTER, 1, "IN_FLIGHT outcomes"),
    M_(leases_taken, "leases_taken", COUNTER, 1,
       "misses whose lease this handle took"),
    M_(leases_failed, "leases_failed", COUNTER, 1,
       "lease calls the Store failed"),
    M_(waited, "waited", COUNTER, 1,
       "candidates that waited for another encoder's output"),
    M_(waited_hits, "waited_hits", COUNTER, 1,
       "candidates that waited and became hits"),
    M_(wait_us, "wait_seconds", COUNTER, 1e-6,
       "time lookups spent waiting for other encoders"),
    M_(device_bytes_copied, "device_copied_bytes", COUNTER, 1,
       "payload bytes copied to CUDA destinations"),
    M_(device_published, "device_published", COUNTER, 1,
       "publications of CUDA outputs queued"),
    M_(device_pool_bytes, "device_pool_bytes", GAUGE, 1,
       "page-locked pool memory for CUDA outputs allocated now"),
    M_(device_pool_full, "device_pool_full", COUNTER, 1,
       "CUDA publications skipped: the page-locked pool was full"),
    M_(hits_unchecked, "hits_unchecked", COUNTER, 1,
       "objects the Store served without a check (Redis checksum=on): "
       "nothing vouched for their bytes"),
};

#define NMETRICS (sizeof(metrics) / sizeof(metrics[0]))

/* Every counter of encache_stats has a row (published_skipped[],
 * published_mismatch and poisoned are printed apart: the skips by reason,
 * encache_stats_skipped()): a field added to the struct must be added
 * here too, or this fails to compile. */
_Static_assert(NMETRICS ==
                   (offsetof(encache_stats, poisoned) -
                    offsetof(encache_stats, lookups)) / sizeof(uint64_t) -
                       ENCACHE_SKIP_COUNT_ +
                       (sizeof(encache_stats) -
                        offsetof(encache_stats, in_flight)) / sizeof(uint64_t) -
                       1,
               "fleet_out.c: a field of encache_stats has no metric");

static uint64_t field_of(const encache_stats *st, size_t off) {
  uint64_t v;
  memcpy(&v, (const unsigned char *)st + off, sizeof(v));
  return v;
}

/* The length of the valid UTF-8 character at s (1 to 4), or 0 when the
 * bytes there are not one (a stray continuation byte, an overlong form, a
 * surrogate, a character cut short). */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  unsigned char lo = 0x80, hi = 0xBF;
  size_t n;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4;
  else
    return 0;
  if (c == 0xE0)
    lo = 0xA0;
  else if (c == 0xED)
    hi = 0x9F;
  else if (c == 0xF0)
    lo = 0x90;
  else if (c == 0xF4)
    hi = 0x8F;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  return n;
}

/* The code point of the valid UTF-8 character of n bytes at s. */
static uint32_t utf8_code(const unsigned char *s, size_t n) {
  static const unsigned char lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t cp = s[0] & lead_bits[n];
  for (size_t i = 1; i < n; i++)
    cp = (cp << 6) | (s[i] & 0x3F);
  return cp;
}

/* How label style st writes the control character cp (C0, DEL or C1), or
 * a backslash, a quote: into rep; 0 when cp is written as it is.  TEXT
 * shows each as the text of its C escape (\n, \x1b, \u009b) and a
 * backslash doubled, so that what is printed says what the label holds;
 * PROM keeps a backslash, a quote and a newline exact (the format has
 * escapes for them) and writes the others as TEXT shows them; JSON keeps
 * all of them exact (\u00XX). */
static int label_escape(uint32_t cp, label_style st, char *rep, size_t n) {
  int ctl = cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
  const char *pre = st == LABEL_PROM ? "\\\\" : "\\";
  if (cp == '\\')
    return snprintf(rep, n, "\\\\");
  if (cp == '"')
    return st == LABEL_TEXT ? 0 : snprintf(rep, n, "\\\"");
  if (!ctl)
    return 0;
  if (cp == '\n') /* the same text in all three */
    return snprintf(rep, n, "\\n");
  if (st == LABEL_JSON)
    return snprintf(rep, n, "\\u%04x", (unsigned)cp);
  if (cp == '\r' || cp == '\t')
    return snprintf(rep, n, "%s%c", pre, cp == '\r' ? 'r' : 't');
  return cp < 0x80 ? snprintf(rep, n, "%sx%02x", pre, (unsigned)cp)
                   : snprintf(rep, n, "%su%04x", pre, (unsigned)cp);
}

size_t fleet_label(FILE *out, const char *s, label_style st, size_t cut,
                   size_t pad) {
  const unsigned char *u = (const unsigned char *)s;
  size_t shown = 0;
  while (*u != '\0') {
    size_t n = utf8_len(u), w = 1;
    char rep[16];
    int rn = n == 0 ? 0 : label_escape(utf8_code(u, n), st, rep, sizeof(rep));
    if (rn > 0 && st == LABEL_TEXT)
      w = (size_t)rn; /* escapes are ASCII: a column per byte */
    if (cut != 0 && shown + w > cut)
      break; /* never a character or an escape cut in two */
    if (n == 0)
      fputs("\xEF\xBF\xBD", out); /* U+FFFD, for this byte */
    else if (rn > 0)
      fputs(rep, out);
    else
      fwrite(u, 1, n, out);
    u += n == 0 ? 1 : n;
    shown += w;
  }
  for (size_t i = shown; i < pad; i++)
    fputc(' ', out);
  return shown;
}

/* ---------------------------------------------------------- Prometheus */

/* A label value as the text format wants it (fleet_label()). */
static void label_value(FILE *out, const char *s) {
  fleet_label(out, s, LABEL_PROM, 0, 0);
}

static void row_labels(FILE *out, const fleet_row *r, const char *extra) {
  fputs("{encoder=\"", out);
  label_value(out, r->encoder);
  fprintf(out, "\",pid=\"%lld\",slot=\"%" PRIu32 "\",store=\"", r->pid,
          r->slot);
  label_value(out, r->store);
  fprintf(out, "\"%s%s}", extra[0] ? "," : "", extra);
}

static void family(FILE *out, const char *name, const char *type,
                   const char *help) {
  fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_value(FILE *out, double v) {
  fprintf(out, " %.17g\n", v);
}

static void prom_histogram(FILE *out, const fleet_view *v, const char *name,
                           const char *help, int write) {
  family(out, name, "histogram", help);
  for (size_t k = 0; k < v->n; k++) {
    const fleet_row *r = &v->rows[k];
    const encache_histogram *h = write ? &r->write : &r->lookup;
    uint64_t cum = 0;
    char le[64];
    for (int i = 0; i < ENCACHE_HISTOGRAM_BUCKETS; i++) {
      cum += h->bucket[i];
      if (i == ENCACHE_HISTOGRAM_BUCKETS - 1)
        snprintf(le, sizeof(le), "le=\"+Inf\"");
      else
        snprintf(le, sizeof(le), "le=\"%.9g\"", bucket_bound_us(i) * 1e-6);
      fprintf(out, "%s_bucket", name);
      row_labels(out, r, le);
      fprintf(out, " %" PRIu64 "\n", cum);
    }
    fprintf(out, "%s_sum", name);
    row_labels(out, r, "");
    fprintf(out, " %.9f\n", (double)h->sum_ns * 1e-9);
    fprintf(out, "%s_count", name);
    row_labels(out, r, "");
    fprintf(out, " %" PRIu64 "\n", cum);
  }
}

static void prom_handles(FILE *out, const fleet_view *v) {
  char name[96];
  family(out, "encache_handles", "gauge",
         "engine handles of this host publishing statistics");
  fprintf(out, "encache_handles %zu\n", v->n);
  for (size_t m = 0; m < NMETRICS; m++) {
    snprintf(name, sizeof(name), "encache_%s%s", metrics[m].name,
             metrics[m].type == COUNTER ? "_total" : "");
    family(out, name, metrics[m].type == COUNTER ? "counter" : "gauge",
           metrics[m].help);
    for (size_t k = 0; k < v->n; k++) {
      fputs(name, out);
      row_labels(out, &v->rows[k], "");
      prom_value(out, (double)field_of(&v->rows[k].st, metrics[m].off) *
                          metrics[m].scale);
    }
  }
  family(out, "encache_published_skipped_total", "counter",
         "outputs not queued for the Store, by reason");
  for (size_t k = 0; k < v->n; k++)
    for (int s = 1; s < ENCACHE_SKIP_REASONS_; s++) {
      char reason[96];
      snprintf(reason, sizeof(reason), "reason=\"%s\"", encache_skip_name(s));
      fputs("encache_published_skipped_total", out);
      row_labels(out, &v->rows[k], reason);
      fprintf(out, " %" PRIu64 "\n",
              encache_stats_skipped(&v->rows[k].st, s));
    }
  family(out, "encache_written_bytes_total", "counter",
         "bytes written to the Store (headers included)");
  for (size_t k = 0; k < v->n; k++) {
    fputs("encache_written_bytes_total", out);
    row_labels(out, &v->rows[k], "");
    fprintf(out, " %" PRIu64 "\n", v->rows[k].bytes_written);
  }
  family(out, "encache_poisoned", "gauge", "1 when the handle is poisoned");
  for (size_t k = 0; k < v->n; k++) {
    fputs("encache_poisoned", out);
    row_labels(out, &v->rows[k], "");
    fprintf(out, " %d\n", v->rows[k].st.poisoned != 0);
  }
  prom_histogram(out, v, "encache_lookup_duration_seconds",
                 "encache_lookup() call durations", 0);
  prom_histogram(out, v, "encache_store_write_duration_seconds",
                 "the publisher's Store write durations", 1);
}

/* The Store's own counters (as `encache stats` prints them). */
typedef struct store_metric {
  const char *name, *type, *help;
  size_t off;
} store_metric;

static const store_metric store_metrics[] = {
    {"encache_store_objects", "gauge", "objects stored",
     offsetof(encache_store_stats, objects)},
    {"encache_store_used_bytes", "gauge",
     "bytes held, including per-object overhead",
     offsetof(encache_store_stats, bytes_used)},
    {"encache_store_capacity_bytes", "gauge", "bytes available for objects",
     offsetof(encache_store_stats, capacity)},
    {"encache_store_evictions_total", "counter", "objects evicted",
     offsetof(encache_store_stats, evictions)},
    {"encache_store_reinsertions_total", "counter",
     "second chances given at eviction",
     offsetof(encache_store_stats, reinsertions)},
    {"encache_store_repairs_total", "counter",
     "repairs after a crashed process or damage",
     offsetof(encache_store_stats, repairs)},
};

static int store_stats(encache_store *st, encache_store_stats *s, char *why,
                       size_t n) {
  memset(s, 0, sizeof(*s));
  s->size = sizeof(*s);
  if (encache_store_stats_get(st, s) < 0) {
    snprintf(why, n, "%s", encache_store_errmsg(st));
    return -1;
  }
  return 0;
}

static uint64_t store_field(const encache_store_stats *s, size_t off) {
  uint64_t v;
  memcpy(&v, (const unsigned char *)s + off, sizeof(v));
  return v;
}

/* encache_store_up: whether the Store answered (its counters follow). */
static void store_up(FILE *out, const char *url, int up) {
  family(out, "encache_store_up", "gauge",
         "1 when the Store answered for its counters, else 0");
  fputs("encache_store_up{store=\"", out);
  label_value(out, url);
  fprintf(out, "\"} %d\n", up);
}

void fleet_store_down(FILE *out, const char *url) { store_up(out, url, 0); }

int fleet_prometheus(FILE *out, encache_store *st, const fleet_view *v,
                     int tolerant, char *why, size_t n) {
  encache_store_stats s;
  if (st != NULL && store_stats(st, &s, why, n) < 0) {
    if (!tolerant)
      return -1;
    store_up(out, encache_store_url(st), 0);
    st = NULL; /* the handles' metrics all the same */
  } else if (st != NULL) {
    store_up(out, encache_store_url(st), 1);
  }
  for (size_t m = 0; st != NULL && m < sizeof(store_metrics) /
                                           sizeof(store_metrics[0]); m++) {
    uint64_t val = store_field(&s, store_metrics[m].off);
    if (val == UINT64_MAX) /* the backend does not know it */
      continue;
    family(out, store_metrics[m].name, store_metrics[m].type,
           store_metrics[m].help);
    fprintf(out, "%s{store=\"", store_metrics[m].name);
    label_value(out, encache_store_url(st));
    fprintf(out, "\",kind=\"");
    label_value(out, s.kind);
    fprintf(out, "\"} %" PRIu64 "\n", val);
  }
  prom_handles(out, v);
  return 0;
}

/* ---------------------------------------------------------------- JSON */

static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  fleet_label(out, s, LABEL_JSON, 0, 0);
  fputc('"', out);
}

static void json_histogram(FILE *out, const char *name,
                           const encache_histogram *h) {
  fprintf(out, ", \"%s\": {\"count\": %" PRIu64 ", \"sum_ns\": %" PRIu64
          ", \"buckets_us\": [", name, h->count, h->sum_ns);
  for (int i = 0; i < ENCACHE_HISTOGRAM_BUCKETS; i++)
    fprintf(out, "%s%" PRIu64, i ? ", " : "", h->bucket[i]);
  fputs("]}", out);
}

static void json_row(FILE *out, const fleet_row *r) {
  fprintf(out, "{\"slot\": %" PRIu32 ", \"pid\": %lld, \"encoder\": ", r->slot,
          r->pid);
  json_string(out, r->encoder);
  fputs(", \"store\": ", out);
  json_string(out, r->store);
  fputs(", \"namespace\": ", out);
  json_string(out, r->ns);
  fputs(", \"stats\": {", out);
  for (size_t m = 0; m < NMETRICS; m++)
    fprintf(out, "%s\"%s\": %" PRIu64, m ? ", " : "", metrics[m].field,
            field_of(&r->st, metrics[m].off));
  fputs(", \"published_skipped\": {", out);
  for (int s = 1; s < ENCACHE_SKIP_REASONS_; s++) {
    fprintf(out, "%s", s > 1 ? ", " : "");
    json_string(out, encache_skip_name(s));
    fprintf(out, ": %" PRIu64, encache_stats_skipped(&r->st, s));
  }
  fprintf(out, "}, \"poisoned\": %s, \"written_bytes\": %" PRIu64 "}",
          r->st.poisoned ? "true" : "false", r->bytes_written);
  json_histogram(out, "lookup", &r->lookup);
  json_histogram(out, "write", &r->write);
  fputc('}', out);
}

int fleet_json(FILE *out, encache_store *st, const fleet_view *v, char *why,
               size_t n) {
  encache_store_stats s;
  if (st != NULL && store_stats(st, &s, why, n) < 0)
    return -1;
  fputs("{\"store\": ", out);
  if (st == NULL) {
    fputs("null", out);
  } else {
    fputs("{\"url\": ", out);
    json_string(out, encache_store_url(st));
    fputs(", \"kind\": ", out);
    json_string(out, s.kind);
    for (size_t m = 0; m < sizeof(store_metrics) / sizeof(store_metrics[0]);
         m++) {
      uint64_t val = store_field(&s, store_metrics[m].off);
      fprintf(out, ", \"%s\": ", store_metrics[m].name + 14);
      if (val == UINT64_MAX)
        fputs("null", out);
      else
        fprintf(out, "%" PRIu64, val);
    }
    fputc('}', out);
  }
  fputs(", \"handles\": [", out);
  for (size_t k = 0; k < v->n; k++) {
    fputs(k ? ", " : "", out);
    json_row(out, &v->rows[k]);
  }
  fputs("]}\n", out);
  return 0;
}

/* ---------------------------------------------------------------- text */

void fleet_text(FILE *out, const fleet_view *v) {
  if (v->n == 0)
    return;
  fprintf(out, "\n%-24s %8s %10s %10s %10s %12s %10s %10s  %s\n", "encoder",
          "pid", "lookups", "hits", "unchecked", "candidates", "p50_us",
          "p99_us", "store");
  for (size_t k = 0; k < v->n; k++) {
    const fleet_row *r = &v->rows[k];
    fleet_label(out, r->encoder, LABEL_TEXT, 0, 24);
    fprintf(out, " %8lld %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %12" PRIu64
            " %10.0f %10.0f  ", r->pid, r->st.lookups, r->st.hits,
            r->st.hits_unchecked, r->st.candidates,
            fleet_quantile(&r->lookup, 0.5), fleet_quantile(&r->lookup, 0.99));
    fleet_label(out, r->store, LABEL_TEXT, 0, 0);
    fputc('\n', out);
  }
}
