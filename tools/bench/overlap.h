/* SPDX-License-Identifier: Apache-2.0 */
/*
 * overlap.h: lookups that do not wait, measured against the blocking
 * lookup, for `encache bench` and the benchmark programs' overlap
 * sections.  A serving loop's step k+1 starts its lookup
 * (encache_lookup_start()), encodes step k's misses meanwhile, then waits
 * for step k+1 (encache_step_wait()); the blocking loop looks up, then
 * encodes.  The encoding takes C with no encache call (while a started
 * lookup runs, every other call on the handle waits for it, so a real
 * loop publishes step k's outputs and closes step k after the wait):
 * measure_spin(C), which holds the caller's core as an encoder's host
 * thread spinning on the GPU does, or (sleeping) measure_sleep(C), which
 * leaves it free.  On a 2-core machine the spin takes one core and the
 * lookup thread the other (shm's read is a copy: CPU work on it); a Store
 * server on the same machine, or any other busy process, finds no third.
 * Step times are p50s; C is a multiple of R, the blocking lookup's p50
 * measured first.  The goals: an overlapped step within 1.1 x max(C, R),
 * a lookup started and waited at once within 1.05 x the blocking one.
 * Public API only.
 */
#ifndef ENCACHE_BENCH_OVERLAP_H
#define ENCACHE_BENCH_OVERLAP_H

#include "hits.h"

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
int bench_overlap_flags(int *argc, char **argv);

/* Measures h's hits: the blocking lookup against one started and waited
 * at once (3 x iters each, alternating), an empty one started and waited,
 * then for each of the nc multiples mult[] of R the two loops, rounds of
 * BENCH_OVERLAP_STEPS alternating A/B then B/A after a warm-up round,
 * about iters steps each, as flags (BENCH_OVERLAP_*) say.  0, or nonzero
 * after a message. */
int bench_overlap_measure(bench_hits *h, const double *mult, int nc, int iters,
                          int flags, bench_overlap *o);

/* The overlapped step against its goal: step / max(C, R), C as the
 * encoding ran (a sleep wakes late), for o's multiple j. */
double bench_overlap_ratio(const bench_overlap *o, int j);

/* The benchmark programs' section `section` (its letter): 4 hits of
 * 1 MiB, then of 8 MiB (ids PREFIX-SIZE-K), in the overlap measurement
 * with C = 0.5, 1 and 2 x R, printed; then two steps' lookups of 4 hits
 * each started together against one after another.  0, or nonzero on a
 * failure. */
int bench_overlap_table(encache *ec, encache_store *st, const char *section,
                        const char *prefix, int iters, int flags);

#endif
