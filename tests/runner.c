/* SPDX-License-Identifier: Apache-2.0 */
/*
 * runner.c: runs every test of tests/list.h in a child process.
 *
 * Usage: encache_tests [SUBSTRING...]   run the tests whose names contain
 *                                      any SUBSTRING (all without one)
 *        ENCACHE_TEST_NOFORK=1         run in-process (for a debugger)
 *        ENCACHE_TEST_TIMEOUT=SECONDS  per-test limit (default 120): the
 *                                      test's alarm; 30 s later the runner
 *                                      kills its process group
 *                                      (a test whose alarm cannot end it)
 * Output is TAP; the exit status is 1 if any test failed.
 */
#include "runner.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "list.h"
#include "dir_store.h"

#include "encache.h"

#include <stdatomic.h>

static atomic_long alloc_countdown; /* 0 = disarmed */
static atomic_long alloc_count;

static int alloc_should_fail(void) {
  atomic_fetch_add(&alloc_count, 1);
  long c = atomic_load(&alloc_countdown);
  while (c > 0) {
    if (c == 1)
      return 1; /* stays at 1: every later allocation fails too */
    if (atomic_compare_exchange_weak(&alloc_countdown, &c, c - 1))
      return 0;
  }
  return 0;
}

static void *failing_malloc(size_t n) {
  return alloc_should_fail() ? NULL : malloc(n);
}
static void *failing_calloc(size_t n, size_t size) {
  return alloc_should_fail() ? NULL : calloc(n, size);
}
static void *failing_realloc(void *p, size_t n) {
  return alloc_should_fail() ? NULL : realloc(p, n);
}
static void *failing_aligned(size_t alignment, size_t n) {
  void *p = NULL;
  return alloc_should_fail() || posix_memalign(&p, alignment, n) != 0 ? NULL
                                                                       : p;
}

long test_alloc_fail_after(long n) {
  static const encache_allocfuncs failing = {
      sizeof(encache_allocfuncs), failing_malloc, failing_calloc,
      failing_realloc, free, failing_aligned};
  atomic_store(&alloc_countdown, n > 0 ? n : 0);
  if (encache_set_allocators(n > 0 ? &failing : NULL, NULL) != 0)
    test__fail(__FILE__, __LINE__, "encache_set_allocators refused");
  return atomic_exchange(&alloc_count, 0);
}

#define DECLARE_(name) void test_##name(void);
TEST_LIST(DECLARE_)
#undef DECLARE_

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
#define ENTRY_(name) {#name, test_##name},
    TEST_LIST(ENTRY_)
#undef ENTRY_
};

void test__fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "# %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  exit(1);
}

size_t test__first_diff(const void *a, const void *b, size_t n) {
  const unsigned char *x = a, *y = b;
  size_t i = 0;
  while (i < n && x[i] == y[i])
    i++;
  return i;
}

static int selected(const char *name, int argc, char **argv) {
  if (argc < 2)
    return 1;
  for (int i = 1; i < argc; i++)
    if (strstr(name, argv[i]) != NULL)
      return 1;
  return 0;
}

/* Seconds past a test's own limit (its alarm) before the runner kills it. */
#define KILL_GRACE_S 30

/* Waits for child pid at most `seconds`: 1 with its *status, 0 when it
 * still runs, polling every 2 ms (no signal handler: the tests own their
 * signals). */
static int wait_for(pid_t pid, unsigned seconds, int *status) {
  struct timespec start, now, tick = {0, 2000000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid)
      return 1;
    if (r < 0 && errno != EINTR) {
      perror("waitpid");
      exit(2);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= (time_t)seconds)
      return 0;
    nanosleep(&tick, NULL);
  }
}

/* What a test that does not end is doing, on stdout as TAP comments:
 * each thread's state and kernel wait channel, and, when gdb is there,
 * every thread's stack (a LeakSanitizer pass at exit, say, blocks every
 * signal while its tracer runs). */
static void show_threads(pid_t pid) {
  char cmd[640];
  snprintf(cmd, sizeof(cmd),
           "for t in /proc/%d/task/*; do echo \"# thread ${t##*/}: "
           "$(cut -d' ' -f3 $t/stat 2>/dev/null) $(cat $t/wchan "
           "2>/dev/null)\"; done; command -v gdb >/dev/null && "
           "timeout 60 gdb -batch -nx -p %d -ex 'thread apply all bt' "
           "2>&1 | sed 's/^/# /'",
           (int)pid, (int)pid);
  fflush(stdout);
  if (system(cmd) != 0)
    printf("# (no stacks: gdb could not attach)\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  size_t n = sizeof(tests) / sizeof(tests[0]);
  int nofork = getenv("ENCACHE_TEST_NOFORK") != NULL;
  const char *t = getenv("ENCACHE_TEST_TIMEOUT");
  unsigned timeout = t ? (unsigned)atoi(t) : 120;
  int failed = 0, ran = 0;

  /* The Store of a user's own (tests/dir_store.c), as a program would
   * register it at start-up. */
  if (dir_store_register() != 0) {
    fprintf(stderr, "registering testdir://: %s\n", encache_store_errmsg(NULL));
    return 1;
  }
  size_t planned = 0;
  for (size_t i = 0; i < n; i++)
    planned += (size_t)selected(tests[i].name, argc, argv);
  printf("1..%zu\n", planned);
  fflush(stdout);
  for (size_t i = 0; i < n; i++) {
    if (!selected(tests[i].name, argc, argv))
      continue;
    ran++;
    if (nofork) {
      tests[i].fn();
      printf("ok %d - %s\n", ran, tests[i].name);
      continue;
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      /* A process group of its own: a test that does not end is killed
       * with the processes it started. */
      setpgid(0, 0);
      alarm(timeout);
      tests[i].fn();
      /* exit(), not _exit(): LeakSanitizer checks for leaks at exit. */
      exit(0);
    }
    setpgid(pid, pid); /* also here: no race with the kill below */
    int status, killed = 0;
    if (wait_for(pid, timeout + KILL_GRACE_S, &status) == 0) {
      /* Its alarm did not end it (SIGALRM blocked, a hang at exit): */
      show_threads(pid);
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
      killed = 1;
    }
    if (killed) {
      failed++;
      printf("not ok %d - %s (no end after %u s: killed by the runner)\n",
             ran, tests[i].name, timeout + KILL_GRACE_S);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("ok %d - %s\n", ran, tests[i].name);
    } else {
      failed++;
      if (WIFSIGNALED(status))
        printf("not ok %d - %s (killed by signal %d%s)\n", ran,
               tests[i].name, WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? ": timeout" : "");
      else
        printf("not ok %d - %s (exit %d)\n", ran, tests[i].name,
               WEXITSTATUS(status));
    }
    fflush(stdout);
  }
  printf("# %d tests, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}
