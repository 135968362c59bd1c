/* SPDX-License-Identifier: Apache-2.0 */
/*
 * measure.h: the measuring core of the benchmark programs (bench/), of
 * `encache bench` and of the demo: a clock, series of timed samples with
 * percentiles, warm-up, an operation timed against a baseline measured in
 * the same run, the printing of those figures and ratios, and the options
 * the benchmark programs share.  Public API only.
 */
#ifndef ENCACHE_MEASURE_H
#define ENCACHE_MEASURE_H

#include <stddef.h>
#include <stdint.h>

/* Seconds on the monotonic clock. */
double measure_now(void);

/* Keeps the calling thread busy for `seconds` on the monotonic clock: a
 * compute phase of known length (the encoding of a step's misses, which
 * occupies its thread and makes no encache call), a core taken while it
 * lasts. */
void measure_spin(double seconds);

/* Sleeps until `seconds` from now on the monotonic clock (the timer slack
 * of the calling thread set to its least): a compute phase that leaves
 * its core free, as an encoder whose host thread blocks until the GPU is
 * done.  The wake-up comes some microseconds late: time it. */
void measure_sleep(double seconds);

/* Pins the calling thread to the first CPU it may run on and every other
 * thread of the process (a library's worker threads) to the others, so
 * that the scheduler cannot stack a woken worker on the caller's busy
 * core; again after new threads started.  The CPUs are those the caller
 * could use at the first call.  0, or a negative errno (ENOTSUP: fewer
 * than 2 CPUs). */
int measure_pin_threads(void);

/* A series of samples (seconds).  Percentiles sort the series. */
typedef struct measure {
  double *t;
  int n, cap;
} measure;

/* 0, or -1 when out of memory. */
int measure_init(measure *m, int cap);
void measure_free(measure *m);
void measure_clear(measure *m);
/* Adds a sample; one beyond the capacity is dropped. */
void measure_add(measure *m, double seconds);
/* The p-th percentile (0 for an empty series). */
double measure_pct(measure *m, int p);

/* One timed operation: returns 0, or nonzero to stop (a failure). */
typedef int (*measure_fn)(void *ctx);

/* Runs base then subject `warmup` times untimed, then `iters` times each,
 * interleaved so that both see the same machine; the times land in base
 * and subject (either function may be NULL: not run).  Returns 0, or the
 * first nonzero result of a function. */
int measure_pair(measure *base, measure_fn fbase, measure *subject,
                 measure_fn fsubject, void *ctx, int warmup, int iters);

/* GB/s for bytes moved in seconds (0 when seconds is 0). */
double measure_gbs(double bytes, double seconds);

/* url as output shows it: its password, if any, replaced by "***". */
void measure_url_shown(const char *url, char *buf, size_t size);

/* "16 KiB", "8 MiB", "100 B". */
void measure_size_label(char *buf, size_t size, uint64_t bytes);

/* A table of an operation against its baseline, one row per case:
 * LABEL, the baseline's p50 and p99, the subject's p50 and p99 (ms), with
 * bytes > 0 both p50 throughputs (GB/s: give with_gbs to the header), and
 * the ratio base p50 / subject p50 (above 1: the subject is faster). */
void measure_print_header(const char *label, const char *base,
                          const char *subject, int with_gbs);
void measure_print_row(const char *label, measure *base, measure *subject,
                       double bytes);

/* The options of the benchmark programs: [--store URL] [--iterations N]
 * (a positional URL too when url_arg is set).  *url stays as it was when
 * none is given; iterations are clamped to at least min_iters.  Returns
 * -1 to go on, else the exit status: 0 when --help printed the usage, 2
 * after printing what is wrong and the usage. */
int measure_options(int argc, char **argv, const char *usage, int url_arg,
                    const char **url, int *iters, int min_iters);

/* Removes every argument equal to flag from argv[1..*argc) (before
 * measure_options(), for a program's own sections); returns 1 when there
 * was one, else 0. */
int measure_take_flag(int *argc, char **argv, const char *flag);
/* Takes `flag VALUE` out of argv: 1 (*value set), 0 (absent), or -1 (no
 * value after it). */
int measure_take_value(int *argc, char **argv, const char *flag,
                       const char **value);

#endif
