/* SPDX-License-Identifier: Apache-2.0 */
/* measure.c: the measuring core (see measure.h). */
#include "measure.h"

#include "encache.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

double measure_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void measure_spin(double seconds) {
  /* Reading the clock is the work: no calibration to go stale, and the
   * vDSO read makes no system call, so the thread stays on its core. */
  double end = measure_now() + seconds;
  while (measure_now() < end)
    ;
}

void measure_sleep(double seconds) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  long ns = until.tv_nsec + (long)(seconds * 1e9);
  until.tv_sec += ns / 1000000000L;
  until.tv_nsec = ns % 1000000000L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
    ;
}

int measure_pin_threads(void) {
  /* The CPUs of the first call: a later one sees this thread pinned. */
  static cpu_set_t all;
  static int have_all;
  cpu_set_t mine, rest;
  if (!have_all && sched_getaffinity(0, sizeof(all), &all) != 0)
    return -errno;
  have_all = 1;
  if (CPU_COUNT(&all) < 2)
    return -ENOTSUP;
  int first = 0;
  while (!CPU_ISSET(first, &all))
    first++;
  CPU_ZERO(&mine);
  CPU_SET(first, &mine);
  rest = all;
  CPU_CLR(first, &rest);
  DIR *d = opendir("/proc/self/task");
  if (d == NULL)
    return -errno;
  int rc = 0;
  pid_t me = gettid();
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid > 0 && sched_setaffinity(tid, sizeof(mine),
                                     tid == me ? &mine : &rest) != 0)
      rc = -errno;
  }
  closedir(d);
  return rc;
}

int measure_init(measure *m, int cap) {
  m->n = 0;
  m->cap = cap > 0 ? cap : 1;
  m->t = malloc(sizeof(double) * (size_t)m->cap);
  return m->t ? 0 : -1;
}

void measure_free(measure *m) {
  free(m->t);
  m->t = NULL;
  m->n = m->cap = 0;
}

void measure_clear(measure *m) { m->n = 0; }

void measure_add(measure *m, double seconds) {
  if (m->n < m->cap)
    m->t[m->n++] = seconds;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double measure_pct(measure *m, int p) {
  if (m->n == 0)
    return 0;
  qsort(m->t, (size_t)m->n, sizeof(double), cmp_double);
  int i = (m->n * p) / 100;
  return m->t[i < m->n ? i : m->n - 1];
}

/* Runs f once, timed into m when m is not NULL. */
static int timed(measure *m, measure_fn f, void *ctx) {
  if (f == NULL)
    return 0;
  double t0 = measure_now();
  int rc = f(ctx);
  if (m != NULL)
    measure_add(m, measure_now() - t0);
  return rc;
}

int measure_pair(measure *base, measure_fn fbase, measure *subject,
                 measure_fn fsubject, void *ctx, int warmup, int iters) {
  int rc = 0;
  for (int i = -warmup; i < iters && rc == 0; i++) {
    rc = timed(i >= 0 ? base : NULL, fbase, ctx);
    if (rc == 0)
      rc = timed(i >= 0 ? subject : NULL, fsubject, ctx);
  }
  return rc;
}

double measure_gbs(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

void measure_size_label(char *buf, size_t size, uint64_t s) {
  if (s >= (1u << 20) && s % (1u << 20) == 0)
    snprintf(buf, size, "%" PRIu64 " MiB", s >> 20);
  else if (s >= 1024 && s % 1024 == 0)
    snprintf(buf, size, "%" PRIu64 " KiB", s >> 10);
  else
    snprintf(buf, size, "%" PRIu64 " B", s);
}

void measure_print_header(const char *label, const char *base,
                          const char *subject, int with_gbs) {
  char b50[32], b99[32], s50[32], s99[32];
  snprintf(b50, sizeof(b50), "%s p50", base);
  snprintf(b99, sizeof(b99), "%s p99", base);
  snprintf(s50, sizeof(s50), "%s p50", subject);
  snprintf(s99, sizeof(s99), "%s p99", subject);
  printf("%-14s %12s %12s %12s %12s", label, b50, b99, s50, s99);
  if (with_gbs) {
    char bg[32], sg[32];
    snprintf(bg, sizeof(bg), "%s GB/s", base);
    snprintf(sg, sizeof(sg), "%s GB/s", subject);
    printf(" %12s %12s", bg, sg);
  }
  printf(" %8s\n", "ratio");
}

void measure_print_row(const char *label, measure *base, measure *subject,
                       double bytes) {
  double b50 = measure_pct(base, 50), b99 = measure_pct(base, 99);
  double s50 = measure_pct(subject, 50), s99 = measure_pct(subject, 99);
  printf("%-14s %10.3fms %10.3fms %10.3fms %10.3fms", label, b50 * 1e3,
         b99 * 1e3, s50 * 1e3, s99 * 1e3);
  if (bytes > 0)
    printf(" %12.2f %12.2f", measure_gbs(bytes, b50), measure_gbs(bytes, s50));
  printf(" %8.2f\n", s50 > 0 ? b50 / s50 : 0);
}

/* Prints "PROG: WHAT: WHY" and the usage; returns 2. */
static int bad_option(const char *prog, const char *usage, const char *what,
                      const char *why) {
  const char *slash = strrchr(prog, '/');
  fprintf(stderr, "%s: %s: %s\n%s", slash ? slash + 1 : prog, what, why,
          usage);
  return 2;
}

int measure_options(int argc, char **argv, const char *usage, int url_arg,
                    const char **url, int *iters, int min_iters) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_value = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--store") == 0 || strcmp(a, "--iterations") == 0) {
      if (!has_value)
        return bad_option(argv[0], usage, a, "needs a value");
      const char *v = argv[++i];
      if (a[2] == 's') {
        *url = v;
        continue;
      }
      char *end;
      errno = 0;
      long n = strtol(v, &end, 10);
      if (errno || end == v || *end || n < 1 || n > 10000000)
        return bad_option(argv[0], usage, "--iterations", "must be a positive integer");
      *iters = n < min_iters ? min_iters : (int)n;
    } else if (url_arg && a[0] != '-') {
      *url = a;
    } else {
      return bad_option(argv[0], usage, a, "unknown option");
    }
  }
  return -1;
}

int measure_take_flag(int *argc, char **argv, const char *flag) {
  int found = 0;
  for (int i = 1; i < *argc; i++)
    if (strcmp(argv[i], flag) == 0) {
      memmove(&argv[i], &argv[i + 1], (size_t)(*argc - i) * sizeof(*argv));
      (*argc)--, i--;
      found = 1;
    }
  return found;
}

int measure_take_value(int *argc, char **argv, const char *flag,
                       const char **value) {
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], flag) != 0)
      continue;
    if (i + 1 >= *argc)
      return -1;
    *value = argv[i + 1];
    memmove(&argv[i], &argv[i + 2], (size_t)(*argc - i - 1) * sizeof(*argv));
    *argc -= 2;
    return 1;
  }
  return 0;
}

void measure_url_shown(const char *url, char *buf, size_t size) {
  if (encache_store_url_redact(url, buf, size) < 0)
    snprintf(buf, size, "%.*s:...", (int)strcspn(url, ":"), url);
}
