/* SPDX-License-Identifier: Apache-2.0 */
/* overlap.c: lookups that do not wait, measured (see overlap.h). */
#include "overlap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_overlap_flags(int *argc, char **argv) {
  int flags = 0;
  if (measure_take_flag(argc, argv, "--sleep"))
    flags |= BENCH_OVERLAP_SLEEP;
  if (measure_take_flag(argc, argv, "--pin"))
    flags |= BENCH_OVERLAP_PIN;
  return flags;
}

/* Opens a step on *step (the caller closes it) and starts the lookup of
 * h's first n hits into r.  0, or 1 after a message. */
static int bench_hits_start(bench_hits *h, encache_step **step, int n,
                            encache_result *r) {
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
static int bench_hits_start_wait(void *ctx) {
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
static int bench_empty_start_wait(void *ctx) {
  bench_hits *h = ctx;
  encache_step *step = NULL;
  int rc = bench_hits_start(h, &step, 0, h->r);
  if (rc == 0 && (rc = encache_step_wait(step, -1)) != 0)
    fprintf(stderr, "bench: empty lookup: %s\n", encache_err_name(rc));
  encache_step_close(step);
  return rc != 0;
}

static void bench_add(measure *m, double seconds) {
  if (m != NULL)
    measure_add(m, seconds);
}

/* Encodes for c (asleep with BENCH_OVERLAP_SLEEP); the time it took into
 * m. */
static void bench_encode(const bench_overlap *o, double c, measure *m) {
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
static int bench_steps_blocking(bench_hits *h, const bench_overlap *o,
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
 * before the first is looked up untimed (the pipeline's fill).  Two steps are open at once, each with its results
 * (h->r and r2); their hits share h's destinations, which nothing reads
 * here.  0, or 1 after a message. */
static int bench_steps_overlapped(bench_hits *h, const bench_overlap *o,
                                  double c, measure *m, encache_result *r2) {
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

int bench_overlap_measure(bench_hits *h, const double *mult, int nc, int iters,
                          int flags, bench_overlap *o) {
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
        measure *timed = r < 0 ? NULL : b == 0 ? &m[0] : &m[1];
        rc = b == 0 ? bench_steps_blocking(h, o, o->c[j], timed)
                    : bench_steps_overlapped(h, o, o->c[j], timed, r2);
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
static double bench_overlap_max(const bench_overlap *o, int j) {
  return o->encoded[j] > o->lookup ? o->encoded[j] : o->lookup;
}

double bench_overlap_ratio(const bench_overlap *o, int j) {
  double most = bench_overlap_max(o, j);
  return most > 0 ? o->overlapped[j] / most : 0;
}

static void bench_overlap_print_header(int steps, int flags) {
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
static void bench_overlap_print(const char *label, const bench_overlap *o) {
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
static int bench_two_blocking(void *ctx) {
  bench_two *t = ctx;
  return bench_hits_lookup(t->h[0]) || bench_hits_lookup(t->h[1]);
}

/* measure_fn: both started, then both waited for. */
static int bench_two_started(void *ctx) {
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
static int bench_two_print(const char *label, bench_hits *h0, bench_hits *h1,
                           int iters) {
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

int bench_overlap_table(encache *ec, encache_store *st, const char *section,
                        const char *prefix, int iters, int flags) {
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
