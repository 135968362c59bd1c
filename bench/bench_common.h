/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_common.h: what the benchmark programs and `encache bench` share
 * besides the measuring core (measure.h): destinations from a fixed pool
 * (as a serving stack's allocator would reuse memory, so that a benchmark
 * times encache, not malloc), and the one place where they call the
 * engine's lookup, publication, open and counters.  Public API only.
 */
#ifndef ENCACHE_BENCH_COMMON_H
#define ENCACHE_BENCH_COMMON_H

#include "encache.h"
#include "measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Candidate i's destination is buf[i]. */
typedef struct bench_pool {
  void **buf;
} bench_pool;

static inline int bench_pool_alloc(void *ctx, size_t i,
                                   const encache_candidate *c, uint64_t nbytes,
                                   void **data, void **handle) {
  (void)c, (void)nbytes;
  *data = ((bench_pool *)ctx)->buf[i];
  *handle = NULL;
  return 0;
}

/* The engine calls of the benchmarks, each in one place. */

/* Opens an engine handle (model "bench/PID", float32, the vLLM JSON) and
 * the Store at url.  Returns 0, or -1 after a message (nothing open). */
static inline int bench_open(const char *prog, const char *url,
                             const char *json, encache **ec,
                             encache_store **st) {
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

/* Opens a step on *step (the caller closes it) and looks up c[0..n). */
static inline int bench_lookup(encache *ec, encache_step **step,
                               const encache_candidate *c, size_t n,
                               const encache_allocator *a, encache_result *r) {
  for (size_t i = 0; i < n; i++)
    r[i].size = sizeof(r[i]);
  int rc = encache_step_open(ec, step);
  return rc < 0 ? rc : encache_lookup(*step, c, n, a, r);
}

static inline int bench_publish(encache_step *step, const char *id,
                                const encache_tensor *v, encache_storage *s) {
  return encache_publish(step, id, v, s);
}

static inline void bench_stats(encache *ec, encache_stats *s) {
  s->size = sizeof(*s);
  encache_stats_get(ec, s);
}

/* A float32 candidate of rows x cols on the host. */
static inline encache_candidate bench_candidate(const char *id, uint64_t rows,
                                                uint64_t cols) {
  encache_candidate c = {sizeof(c), id,   ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, rows, cols, ENCACHE_DEVICE_HOST, 0};
  return c;
}

/* The sustained benchmarks' pace: after a step, wait for the worker when
 * the queue nears the item budget (more than 40 pending), so that the
 * figure is what the worker sustains, not what the budget sheds. */
static inline void bench_flush_if_full(encache *ec) {
  encache_stats now;
  bench_stats(ec, &now);
  if (now.pending_items > 40)
    encache_flush(ec);
}

/* Sustained publication: `total` new ids PREFIX-FIRST, PREFIX-FIRST+1, ...
 * looked up (all miss) in steps of 16 and each published from view v over
 * the storage [data, data + nbytes), paced by bench_flush_if_full().
 * Seconds, with the objects written meanwhile in *written. */
static inline double bench_publish_sustained(encache *ec, const char *prefix,
                                             int first, int total,
                                             const encache_tensor *v,
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

/* Writes data (rows x cols float32) at key with its v3 header, as the
 * engine would.  Returns the Store's answer (0, ENCACHE_EEXIST, ...). */
static inline int bench_write_object(encache_store *st, const char *key,
                                     void *data, uint64_t rows,
                                     uint64_t cols) {
  int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
  encache_tensor v = {sizeof v, data, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[24];
  encache_header_encode(&v, hdr);
  return encache_store_write(st, key, hdr, 24, data, rows * cols * 4);
}

/* n float32 objects of nbytes each in the Store under ids PREFIX-SIZE-K
 * of the engine's namespace, as the engine would write them: with their
 * candidates, warm destinations (the pool, each with BENCH_HEADROOM bytes
 * in front that the allocator lends: encache_allocator.headroom) and raw
 * read buffers, page-aligned: Mooncake's TCP reads into memory at some
 * offsets (malloc's, 16 bytes past a page) were up to a third slower. */
#define BENCH_HEADROOM 4096

typedef struct bench_hits {
  encache *ec;
  encache_store *st;
  int n;
  uint64_t rows, cols, nbytes;
  char (*ids)[48];
  char **keys;
  void **dst, **raw;
  size_t *caps;
  int64_t *res;
  encache_candidate *c;
  encache_result *r;
  bench_pool pool;
  encache_allocator a;
} bench_hits;

/* Removes the objects and frees what h holds (also a half-made h). */
static inline void bench_hits_drop(bench_hits *h) {
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

/* Returns 0, or -1 after a message (then h holds nothing). */
static inline int bench_hits_make(bench_hits *h, encache *ec,
                                  encache_store *st, const char *prefix, int n,
                                  uint64_t size) {
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

/* measure_fn: the raw Store's batched read of the objects. */
static inline int bench_hits_read(void *ctx) {
  bench_hits *h = ctx;
  int rc = encache_store_read(h->st, (const char *const *)h->keys,
                              (size_t)h->n, h->raw, h->caps, h->res);
  if (rc != 0)
    fprintf(stderr, "bench: read: %s\n", encache_store_errmsg(h->st));
  return rc != 0;
}

/* 0 when a lookup's answer is h's n hits, else 1 after a message. */
static inline int bench_hits_check(bench_hits *h, int hits) {
  if (hits != h->n)
    fprintf(stderr, "bench: %d of %d hits: %s\n", hits, h->n,
            encache_errmsg(h->ec));
  return hits != h->n;
}

/* measure_fn: an encache lookup of the objects, all hits. */
static inline int bench_hits_lookup(void *ctx) {
  bench_hits *h = ctx;
  encache_step *step = NULL;
  int hits = bench_lookup(h->ec, &step, h->c, (size_t)h->n, &h->a, h->r);
  encache_step_close(step);
  return bench_hits_check(h, hits);
}

/* For each size, n objects read by the baseline `raw` and looked up, in
 * the measuring core's table.  Returns 0, or nonzero on a failure. */
static inline int bench_hits_table(encache *ec, encache_store *st,
                                   const char *prefix, int n,
                                   const size_t *sizes, int nsizes,
                                   measure_fn raw, int iters) {
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

/*
 * Lookups that do not wait (issue 29): a serving loop's step k+1 starts
 * its lookup (encache_lookup_start()), encodes step k's misses meanwhile,
 * then waits for step k+1 (encache_step_wait()); the blocking loop looks
 * up, then encodes.  The encoding takes C with no encache call (while a
 * started lookup runs, every other call on the handle waits for it, so a
 * real loop publishes step k's outputs and closes step k after the wait):
 * measure_spin(C), which holds the caller's core as an encoder's host
 * thread spinning on the GPU does, or (sleeping) measure_sleep(C), which
 * leaves it free.  On a 2-core machine the spin takes one core and the
 * lookup thread the other (shm's read is a copy: CPU work on it); a Store
 * server on the same machine, or any other busy process, finds no third.
 * Step times are p50s; C is a multiple of R, the blocking lookup's p50
 * measured first.  The goals: an overlapped step within 1.1 x max(C, R),
 * a lookup started and waited at once within 1.05 x the blocking one.
 */
#define BENCH_OVERLAP_MAX 3
#define BENCH_OVERLAP_STEPS 5 /* steps per round; rounds alternate A/B, B/A */
/* bench_overlap_measure()'s flags: the encoding sleeps instead of
 * spinning; the caller and the handle's threads are pinned apart
 * (measure_pin_threads()) once the lookup thread runs. */
#define BENCH_OVERLAP_SLEEP 1
#define BENCH_OVERLAP_PIN 2

typedef struct bench_overlap {
  int flags; /* BENCH_OVERLAP_* */
  double lookup, at_once; /* p50s, alternating: lookup is R */
  double handoff;         /* p50 of an empty lookup started and waited */
  int nc;
  double c[BENCH_OVERLAP_MAX];          /* compute asked per step */
  double encoded[BENCH_OVERLAP_MAX];    /* p50 of the compute as it ran */
  double blocking[BENCH_OVERLAP_MAX];   /* p50 step, blocking loop */
  double overlapped[BENCH_OVERLAP_MAX]; /* p50 step, overlapped loop */
  double waited[BENCH_OVERLAP_MAX];     /* p50 in encache_step_wait() */
  double starting[BENCH_OVERLAP_MAX];   /* p50 in step open + start */
} bench_overlap;

/* The flags of the benchmark programs' options --sleep and --pin, taken
 * out of argv (measure_take_flag()). */
static inline int bench_overlap_flags(int *argc, char **argv) {
  int flags = 0;
  if (measure_take_flag(argc, argv, "--sleep"))
    flags |= BENCH_OVERLAP_SLEEP;
  if (measure_take_flag(argc, argv, "--pin"))
    flags |= BENCH_OVERLAP_PIN;
  return flags;
}

/* Opens a step on *step (the caller closes it) and starts the lookup of
 * h's first n hits into r.  0, or 1 after a message. */
static inline int bench_hits_start(bench_hits *h, encache_step **step,
                                   int n, encache_result *r) {
  for (int i = 0; i < n; i++)
    r[i].size = sizeof(r[i]);
  int rc = encache_step_open(h->ec, step);
  if (rc == 0)
    rc = encache_lookup_start(*step, h->c, (size_t)n, &h->a, r);
  if (rc != 0)
    fprintf(stderr, "bench: start: %s: %s\n", encache_err_name(rc),
            encache_errmsg(h->ec));
  return rc != 0;
}

/* measure_fn: a lookup of the objects started and waited for at once. */
static inline int bench_hits_start_wait(void *ctx) {
  bench_hits *h = ctx;
  encache_step *step = NULL;
  int rc = bench_hits_start(h, &step, h->n, h->r);
  if (rc == 0)
    rc = bench_hits_check(h, encache_step_wait(step, -1));
  encache_step_close(step);
  return rc;
}

/* measure_fn: an empty lookup started and waited for at once: the hand-off
 * to the lookup thread and back, nothing read. */
static inline int bench_empty_start_wait(void *ctx) {
  bench_hits *h = ctx;
  encache_step *step = NULL;
  int rc = bench_hits_start(h, &step, 0, h->r);
  if (rc == 0 && (rc = encache_step_wait(step, -1)) != 0)
    fprintf(stderr, "bench: empty lookup: %s\n", encache_err_name(rc));
  encache_step_close(step);
  return rc != 0;
}

static inline void bench_add(measure *m, double seconds) {
  if (m != NULL)
    measure_add(m, seconds);
}

/* Encodes for c (asleep with BENCH_OVERLAP_SLEEP); the time it took into
 * m. */
static inline void bench_encode(const bench_overlap *o, double c, measure *m) {
  double t0 = measure_now();
  if (o->flags & BENCH_OVERLAP_SLEEP)
    measure_sleep(c);
  else
    measure_spin(c);
  bench_add(m, measure_now() - t0);
}

/* BENCH_OVERLAP_STEPS steps of the blocking loop (lookup, then c of
 * encoding), each step's time into t (NULL: untimed).  0, or 1 after a
 * message. */
static inline int bench_steps_blocking(bench_hits *h, const bench_overlap *o,
                                       double c, measure *t) {
  for (int k = 0; k < BENCH_OVERLAP_STEPS; k++) {
    double t0 = measure_now();
    if (bench_hits_lookup(h) != 0)
      return 1;
    bench_encode(o, c, NULL);
    bench_add(t, measure_now() - t0);
  }
  return 0;
}

/* BENCH_OVERLAP_STEPS steps of the overlapped loop: m[0] each step's
 * time, m[1] its time in encache_step_wait(), m[2] its encoding's, m[3]
 * its step open and encache_lookup_start()'s (NULL: untimed).  The step
 * before the first is looked up untimed (the
 * pipeline's fill).  Two steps are open at once, each with its results
 * (h->r and r2); their hits share h's destinations, which nothing reads
 * here.  0, or 1 after a message. */
static inline int bench_steps_overlapped(bench_hits *h, const bench_overlap *o,
                                         double c, measure *m,
                                         encache_result *r2) {
  encache_result *rs[2] = {h->r, r2};
  encache_step *cur = NULL, *next = NULL;
  int rc = bench_hits_start(h, &cur, h->n, rs[0]);
  if (rc == 0)
    rc = bench_hits_check(h, encache_step_wait(cur, -1));
  for (int k = 0; k < BENCH_OVERLAP_STEPS && rc == 0; k++) {
    double t0 = measure_now();
    rc = bench_hits_start(h, &next, h->n, rs[(k + 1) & 1]);
    if (rc != 0)
      break;
    double t1 = measure_now();
    bench_encode(o, c, m ? &m[2] : NULL); /* step k's misses */
    double t2 = measure_now();
    rc = bench_hits_check(h, encache_step_wait(next, -1));
    double t3 = measure_now();
    encache_step_close(cur); /* after its outputs were published */
    cur = next;
    next = NULL;
    if (m != NULL) {
      measure_add(&m[0], measure_now() - t0);
      measure_add(&m[1], t3 - t2);
      measure_add(&m[3], t1 - t0);
    }
  }
  encache_step_close(next);
  encache_step_close(cur);
  return rc;
}

/* Measures h's hits: the blocking lookup against one started and waited
 * at once (3 x iters each, alternating), an empty one started and waited,
 * then for each of the nc multiples mult[] of R the two loops, rounds of
 * BENCH_OVERLAP_STEPS alternating A/B then B/A after a warm-up round,
 * about iters steps each, as flags (BENCH_OVERLAP_*) say.  0, or nonzero
 * after a message. */
static inline int bench_overlap_measure(bench_hits *h, const double *mult,
                                        int nc, int iters, int flags,
                                        bench_overlap *o) {
  memset(o, 0, sizeof(*o));
  o->flags = flags;
  o->nc = nc < BENCH_OVERLAP_MAX ? nc : BENCH_OVERLAP_MAX;
  int rounds = (iters + BENCH_OVERLAP_STEPS - 1) / BENCH_OVERLAP_STEPS;
  int cap = rounds * BENCH_OVERLAP_STEPS;
  cap = cap > 3 * iters ? cap : 3 * iters;
  encache_result *r2 = calloc((size_t)h->n, sizeof(*r2));
  measure m[5]; /* blocking; overlapped, waited, encoded, starting */
  int rc = r2 == NULL ? -1 : 0;
  for (int k = 0; k < 5; k++)
    if (measure_init(&m[k], cap) < 0)
      rc = -1;
  if (rc == 0 && (flags & BENCH_OVERLAP_PIN) &&
      (rc = bench_hits_start_wait(h)) == 0) { /* the lookup thread runs */
    int pin = measure_pin_threads();
    if (pin < 0) {
      fprintf(stderr, "bench: cannot pin the threads: %s\n", strerror(-pin));
      rc = 1;
    }
  }
  /* The at-once tax is a few hand-offs between threads: thrice the
   * samples, for a steadier median. */
  if (rc == 0)
    rc = measure_pair(&m[0], bench_hits_lookup, &m[1], bench_hits_start_wait,
                      h, 2, 3 * iters);
  o->lookup = measure_pct(&m[0], 50);
  o->at_once = measure_pct(&m[1], 50);
  measure_clear(&m[1]);
  if (rc == 0)
    rc = measure_pair(&m[1], bench_empty_start_wait, NULL, NULL, h, 2,
                      3 * iters);
  o->handoff = measure_pct(&m[1], 50);
  for (int j = 0; j < o->nc && rc == 0; j++) {
    o->c[j] = mult[j] * o->lookup;
    for (int k = 0; k < 5; k++)
      measure_clear(&m[k]);
    for (int r = -1; r < rounds && rc == 0; r++)
      for (int side = 0; side < 2 && rc == 0; side++) {
        int b = (r & 1) ? 1 - side : side; /* A/B, then B/A */
        rc = b == 0 ? bench_steps_blocking(h, o, o->c[j], r < 0 ? NULL : &m[0])
                    : bench_steps_overlapped(h, o, o->c[j], r < 0 ? NULL : &m[1],
                                             r2);
      }
    o->blocking[j] = measure_pct(&m[0], 50);
    o->overlapped[j] = measure_pct(&m[1], 50);
    o->waited[j] = measure_pct(&m[2], 50);
    o->encoded[j] = measure_pct(&m[3], 50);
    o->starting[j] = measure_pct(&m[4], 50);
  }
  for (int k = 0; k < 5; k++)
    measure_free(&m[k]);
  free(r2);
  if (rc == -1)
    fprintf(stderr, "bench: out of memory\n");
  return rc;
}

/* max(C, R), C as the encoding ran (a sleep wakes late). */
static inline double bench_overlap_max(const bench_overlap *o, int j) {
  return o->encoded[j] > o->lookup ? o->encoded[j] : o->lookup;
}

/* The overlapped step against its goal: step / max(C, R). */
static inline double bench_overlap_ratio(const bench_overlap *o, int j) {
  double most = bench_overlap_max(o, j);
  return most > 0 ? o->overlapped[j] / most : 0;
}

static inline void bench_overlap_print_header(int steps, int flags) {
  printf("step loop, p50 of %d steps each, rounds alternating: blocking "
         "(lookup, then encode C)\nagainst overlapped (start step k+1's "
         "lookup, encode step k's C, wait step k+1); the encoding\n%s; R is "
         "the blocking lookup's p50, C as the encoding ran.%s\n", steps,
         flags & BENCH_OVERLAP_SLEEP
             ? "sleeps for C (its core left free; a sleep wakes some "
               "microseconds late)"
             : "is a spin of C on the caller's thread: on a 2-core "
               "machine it holds one core and\nthe lookup thread the "
               "other",
         flags & BENCH_OVERLAP_PIN ? "\nPinned: this thread on the first "
                                     "CPU, the handle's threads on the others."
                                   : "");
  printf("(\"start\": the overlapped step's step open and "
         "encache_lookup_start(), p50.)\n");
  printf("%-8s %4s %9s %10s %10s %10s %13s %15s %9s\n", "object", "C/R", "C",
         "blocking", "overlapped", "max(C,R)", "step/max", "waited (of R)",
         "start");
}

/* Prints o's rows under bench_overlap_print_header(), then the started
 * and waited at once against the blocking lookup. */
static inline void bench_overlap_print(const char *label, const bench_overlap *o) {
  double r = o->lookup;
  for (int j = 0; j < o->nc; j++) {
    double q = bench_overlap_ratio(o, j);
    printf("%-8s %4.1f %7.3fms %8.3fms %8.3fms %8.3fms %6.3f %-6s %7.3fms "
           "%3.0f%% %7.3fms\n", label, r > 0 ? o->c[j] / r : 0,
           o->encoded[j] * 1e3, o->blocking[j] * 1e3, o->overlapped[j] * 1e3,
           bench_overlap_max(o, j) * 1e3, q, q <= 1.1 ? "<=1.1" : ">1.1!",
           o->waited[j] * 1e3, r > 0 ? 100 * o->waited[j] / r : 0,
           o->starting[j] * 1e3);
  }
  double a = r > 0 ? o->at_once / r : 0;
  printf("%-8s start+wait at once %.3fms vs lookup %.3fms: %.3f %s (an "
         "empty one: %.1fus)\n", label, o->at_once * 1e3, r * 1e3, a,
         a <= 1.05 ? "<=1.05" : ">1.05!", o->handoff * 1e6);
}

/* Two steps' lookups, each of its own objects (h[0] and h[1]): looked up
 * one after another (blocking), or both started, then both waited for,
 * their reads in flight at once (store_reads_in_flight lookup threads). */
typedef struct bench_two {
  bench_hits *h[2];
} bench_two;

/* measure_fn: the two lookups one after another. */
static inline int bench_two_blocking(void *ctx) {
  bench_two *t = ctx;
  return bench_hits_lookup(t->h[0]) || bench_hits_lookup(t->h[1]);
}

/* measure_fn: both started, then both waited for. */
static inline int bench_two_started(void *ctx) {
  bench_two *t = ctx;
  encache_step *s[2] = {NULL, NULL};
  int rc = 0;
  for (int k = 0; k < 2 && rc == 0; k++)
    rc = bench_hits_start(t->h[k], &s[k], t->h[k]->n, t->h[k]->r);
  for (int k = 0; k < 2; k++) {
    if (s[k] == NULL)
      continue;
    int hits = encache_step_wait(s[k], -1);
    if (rc == 0)
      rc = bench_hits_check(t->h[k], hits);
    encache_step_close(s[k]);
  }
  return rc;
}

/* Prints the two steps' lookups, started together against one after
 * another (p50s of iters each, alternating).  0, or nonzero on a
 * failure. */
static inline int bench_two_print(const char *label, bench_hits *h0,
                                  bench_hits *h1, int iters) {
  bench_two t = {{h0, h1}};
  measure a, b;
  int rc = measure_init(&a, iters) < 0 || measure_init(&b, iters) < 0 ? -1 : 0;
  if (rc == 0)
    rc = measure_pair(&a, bench_two_blocking, &b, bench_two_started, &t, 2,
                      iters);
  if (rc == 0) {
    double x = measure_pct(&a, 50), y = measure_pct(&b, 50);
    printf("%-8s started together %8.3fms, one after another %8.3fms: "
           "%.3f\n", label, y * 1e3, x * 1e3, x > 0 ? y / x : 0);
  }
  measure_free(&a);
  measure_free(&b);
  return rc;
}

/* The benchmark programs' section `section` (its letter): 4 hits of
 * 1 MiB, then of 8 MiB (ids PREFIX-SIZE-K), in the overlap measurement
 * with C = 0.5, 1 and 2 x R, printed; then two steps' lookups of 4 hits
 * each started together against one after another.  0, or nonzero on a
 * failure. */
static inline int bench_overlap_table(encache *ec, encache_store *st,
                                      const char *section, const char *prefix,
                                      int iters, int flags) {
  static const double mult[] = {0.5, 1.0, 2.0};
  static const size_t sizes[] = {1u << 20, 8u << 20};
  int steps = (iters + BENCH_OVERLAP_STEPS - 1) / BENCH_OVERLAP_STEPS;
  printf("\n%s lookups that do not wait: 4 hits\n", section);
  bench_overlap_print_header(steps * BENCH_OVERLAP_STEPS, flags);
  int rc = 0;
  for (int s = 0; s < 2 && rc == 0; s++) {
    bench_hits h;
    bench_overlap o;
    if ((rc = bench_hits_make(&h, ec, st, prefix, 4, sizes[s])) != 0)
      break;
    rc = bench_overlap_measure(&h, mult, 3, iters, flags, &o);
    char label[16];
    measure_size_label(label, sizeof(label), sizes[s]);
    if (rc == 0)
      bench_overlap_print(label, &o);
    bench_hits_drop(&h);
  }
  static const size_t two_sizes[] = {16u << 10, 1u << 20, 8u << 20};
  printf("two steps' lookups of 4 hits each, each of its own objects "
         "(store_reads_in_flight lookup threads), p50s of %d, alternating\n",
         iters);
  for (int s = 0; s < 3 && rc == 0; s++) {
    bench_hits h[2];
    char p2[64], label[16];
    for (int k = 0; k < 2 && rc == 0; k++) {
      snprintf(p2, sizeof(p2), "%s-two%d", prefix, k);
      if ((rc = bench_hits_make(&h[k], ec, st, p2, 4, two_sizes[s])) != 0 &&
          k == 1)
        bench_hits_drop(&h[0]);
    }
    if (rc != 0)
      break;
    measure_size_label(label, sizeof(label), two_sizes[s]);
    rc = bench_two_print(label, &h[0], &h[1], iters);
    bench_hits_drop(&h[1]);
    bench_hits_drop(&h[0]);
  }
  return rc;
}

#endif
