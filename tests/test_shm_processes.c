/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm Store under many processes and threads: stress, SIGKILLed
 * writers, a writer in another pid namespace, a lock timeout during a
 * publication, forked children, stopped writers and lock holders.
 * The helpers several of these files share are in tests/shm_util.c.
 */
#include "shm_util.h"

#include "shm/testing.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Random operations with verification, from one thread. */
typedef struct worker_arg {
  const char *url;
  encache_store *st;
  uint64_t seed;
  double seconds;
  int keys;
  int bad;
  long ops;
} worker_arg;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *worker(void *p) {
  worker_arg *a = p;
  unsigned char *buf = malloc(256 << 10), *out = malloc(256 << 10);
  uint64_t r = a->seed | 1;
  double end = now_s() + a->seconds;
  while (!a->bad && now_s() < end) {
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    int k = (int)(r % (uint64_t)a->keys);
    char key[32];
    snprintf(key, sizeof(key), "s-%d", k);
    size_t len = 24 + ((size_t)k * 7919u) % (200u << 10);
    unsigned op = (unsigned)(r >> 33) % 16;
    int rc;
    if (op < 6) {
      ts_fill(key, r, buf, len);
      rc = encache_store_write(a->st, key, buf, 24, buf + 24, len - 24);
      if (rc != 0 && rc != ENCACHE_EEXIST && rc != ENCACHE_EUNAVAIL) {
        fprintf(stderr, "# write %s: %s: %s\n", key, encache_err_name(rc),
                encache_store_errmsg(a->st));
        a->bad = 1;
      }
    } else if (op < 15) {
      int64_t n = ts_read_one(a->st, key, out, 256 << 10);
      if (n >= 0 && ((size_t)n != len || !ts_verify(key, out, len)))
        a->bad = 2;
      else if (n < 0 && n != ENCACHE_ENOENT && n != ENCACHE_EUNAVAIL)
        a->bad = 3;
    } else {
      rc = encache_store_remove(a->st, key);
      if (rc != 0 && rc != ENCACHE_ENOENT && rc != ENCACHE_EUNAVAIL)
        a->bad = 4;
    }
    a->ops++;
  }
  free(buf);
  free(out);
  return NULL;
}

/* One process: `threads` workers sharing one handle.  Returns 0 if clean. */
static int run_workers(const char *url, int threads, double seconds,
                       uint64_t seed) {
  encache_store *st = reopen(url);
  pthread_t t[8];
  worker_arg a[8];
  int bad = 0;
  for (int i = 0; i < threads; i++) {
    a[i] = (worker_arg){url, st, seed * 131 + (uint64_t)i * 7 + 1, seconds,
                        64, 0, 0};
    pthread_create(&t[i], NULL, worker, &a[i]);
  }
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    if (a[i].bad) {
      fprintf(stderr, "# worker %d: failure %d after %ld ops\n", i, a[i].bad,
              a[i].ops);
      bad = 1;
    }
  }
  encache_store_close(st);
  return bad;
}

static double stress_seconds(void) {
  const char *e = getenv("ENCACHE_STRESS_SECONDS");
  return e ? atof(e) : 3.0;
}

TEST(shm_stress_processes_and_threads) {
  char url[128];
  encache_store *st = seg_open("16MiB", url, sizeof(url));
  encache_store_close(st);
  enum { PROCS = 3, THREADS = 4 };
  pid_t pids[PROCS];
  for (int p = 0; p < PROCS; p++) {
    pids[p] = fork();
    ASSERT(pids[p] >= 0);
    if (pids[p] == 0)
      _exit(run_workers(url, THREADS, stress_seconds(), (uint64_t)p + 1));
  }
  for (int p = 0; p < PROCS; p++) {
    int status;
    waitpid(pids[p], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      test__fail(__FILE__, __LINE__, "process %d failed (status 0x%x)", p,
                 status);
  }
}

TEST(shm_threads_in_one_process) {
  /* The ThreadSanitizer build runs this one: threads share one handle. */
  char url[128];
  encache_store *st = seg_open("16MiB", url, sizeof(url));
  encache_store_close(st);
  ASSERT_EQ_INT(run_workers(url, 4, stress_seconds() / 2, 99), 0);
}

/* Verifies every object in the store; returns the count, -1 on a bad one. */
static int verify_all_cb(const char *key, uint64_t len, void *arg) {
  encache_store *st = arg;
  unsigned char *out = malloc(len ? len : 1);
  int64_t n = ts_read_one(st, key, out, len);
  int ok = n == ENCACHE_ENOENT || (n == (int64_t)len && ts_verify(key, out, len));
  free(out);
  if (!ok)
    fprintf(stderr, "# %s: read %lld of %llu bytes, or content differs\n",
            key, (long long)n, (unsigned long long)len);
  return ok ? 0 : 1;
}

TEST(shm_sigkill_writers_at_random_moments) {
  char url[128];
  encache_store *st = seg_open("8MiB", url, sizeof(url));
  enum { PROCS = 3 };
  pid_t pids[PROCS];
  uint64_t r = 12345;
  int kills = 0;
  for (int p = 0; p < PROCS; p++) {
    pids[p] = fork();
    if (pids[p] == 0)
      _exit(run_workers(url, 2, 60, (uint64_t)p + 11));
  }
  double end = now_s() + stress_seconds();
  while (now_s() < end) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    usleep((useconds_t)(2000 + (r >> 40) % 30000));
    int p = (int)((r >> 20) % PROCS);
    kill(pids[p], SIGKILL);
    int status;
    waitpid(pids[p], &status, 0);
    /* A worker that exited by itself found a bad object. */
    if (WIFEXITED(status))
      test__fail(__FILE__, __LINE__, "worker exited with %d before it was "
                 "killed", WEXITSTATUS(status));
    kills++;
    pids[p] = fork();
    if (pids[p] == 0)
      _exit(run_workers(url, 2, 60, r));
  }
  for (int p = 0; p < PROCS; p++) {
    kill(pids[p], SIGKILL);
    waitpid(pids[p], NULL, 0);
  }
  ASSERT(kills > 10);
  /* Consistent afterwards: every object verifies, and the Store works. */
  ASSERT_EQ_INT(encache_store_list(st, NULL, verify_all_cb, st), 0);
  ASSERT_EQ_INT(run_workers(url, 2, 0.5, 7), 0);
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.bytes_used <= s.capacity);
  fprintf(stderr, "# %d kills, %llu repairs, %llu objects\n", kills,
          (unsigned long long)s.repairs, (unsigned long long)s.objects);
  encache_store_close(st);
}

TEST(shm_writer_in_another_pid_namespace_is_alive) {
  /* A writer's liveness must not depend on pids: a writer in another PID
   * namespace (a container sharing /dev/shm) is alive while it writes. */
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  int p[2];
  ASSERT_EQ_INT(pipe(p), 0);
  pid_t outer = fork();
  ASSERT(outer >= 0);
  if (outer == 0) {
    setpgid(0, 0); /* so that the test can kill the writer too */
    if (unshare(CLONE_NEWPID) != 0) {
      char c = 's'; /* not permitted here: skip */
      if (write(p[1], &c, 1) != 1)
        _exit(3);
      _exit(0);
    }
    pid_t inner = fork(); /* pid 1 of the new namespace */
    if (inner == 0) {
      encache_store *c = reopen(url);
      hook_fd = p[1];
      encache__shm_write_hook = stall_writer;
      put(c, "contained", 100 << 10, 1);
      _exit(0);
    }
    waitpid(inner, NULL, 0);
    _exit(0);
  }
  char c;
  ASSERT_EQ_INT(read(p[0], &c, 1), 1);
  if (c == 's') {
    printf("# skipped: cannot make a PID namespace here\n");
    waitpid(outer, NULL, 0);
    encache_store_close(st);
    return;
  }
  /* The writer is stalled mid-copy in its namespace: its key is taken. */
  unsigned char buf[16] = {0};
  ASSERT_EQ_INT(encache_store_write(st, "contained", NULL, 0, buf, sizeof(buf)),
                ENCACHE_EEXIST);
  /* Once the writer is killed, its record is reclaimed. */
  kill(-outer, SIGKILL);
  waitpid(outer, NULL, 0);
  for (int i = 0; i < 100; i++) {
    if (encache_store_write(st, "contained", NULL, 0, buf, sizeof(buf)) == 0)
      break;
    usleep(10000); /* the kernel tears the namespace down */
  }
  ASSERT_EQ_INT(ts_read_one(st, "contained", buf, sizeof(buf)), 16);
  encache_store_close(st);
}

/* A lock holder that stalls past the writer's lock timeout must not leave
 * the writer's finished record WRITING (it would block its key, and the
 * ring once it reaches the tail): it is published at the next lock. */
static int stall_pipe[2];
static void lock_from_a_child(void) {
  encache__shm_write_hook = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    encache_store *c = reopen(getenv("ENCACHE_SHM_TEST_URL"));
    if (encache__shm_test_lock(c) != 0)
      _exit(1);
    char ch = 'l';
    if (write(stall_pipe[1], &ch, 1) != 1)
      _exit(1);
    usleep(300000); /* longer than the writer's lock timeout */
    _exit(0);       /* dies holding it: the next locker repairs */
  }
  char ch;
  if (read(stall_pipe[0], &ch, 1) != 1)
    _exit(2);
}

TEST(shm_publication_survives_a_lock_timeout) {
  char url[160], base[128];
  encache_store *st = seg_open("4MiB", base, sizeof(base));
  encache_store_close(st);
  snprintf(url, sizeof(url), "%s&lock_timeout_ms=50", base);
  setenv("ENCACHE_SHM_TEST_URL", url, 1);
  ASSERT_EQ_INT(pipe(stall_pipe), 0);
  st = reopen(url);
  encache__shm_write_hook = lock_from_a_child;
  unsigned char buf[4096];
  ts_fill("victim", 1, buf, sizeof(buf));
  ASSERT_EQ_INT(encache_store_write(st, "victim", NULL, 0, buf, sizeof(buf)),
                ENCACHE_EUNAVAIL); /* the final lock timed out */
  while (wait(NULL) > 0)
    ;
  /* The next lock of the handle publishes it. */
  unsigned char out[4096];
  ASSERT_EQ_INT(ts_read_one(st, "victim", out, sizeof(out)), 4096);
  ASSERT(ts_verify("victim", out, sizeof(out)));
  for (int i = 0; i < 100; i++) { /* and the ring runs past it */
    char key[32];
    snprintf(key, sizeof(key), "after-%d", i);
    put(st, key, 100 << 10, (uint64_t)i);
  }
  encache_store_close(st);
}

/* A child forked after the handle was opened must not keep a killed
 * writer looking alive (it would share the writer's slot lock). */
TEST(shm_forked_child_does_not_keep_a_dead_writer_alive) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  int p[2];
  ASSERT_EQ_INT(pipe(p), 0);
  pid_t writer = fork();
  ASSERT(writer >= 0);
  if (writer == 0) {
    encache_store *w = reopen(url);
    int q[2];
    char r;
    if (pipe(q) != 0)
      _exit(1);
    if (fork() == 0) { /* a worker that outlives its parent */
      /* fork() has returned here: the handles are dropped already. */
      if (write(q[1], "r", 1) != 1)
        _exit(1);
      sleep(3);
      _exit(0);
    }
    if (read(q[0], &r, 1) != 1) /* not before the worker dropped them */
      _exit(1);
    hook_fd = p[1];
    encache__shm_write_hook = stall_writer;
    put(w, "orphaned", 100 << 10, 1);
    _exit(0);
  }
  char c;
  ASSERT_EQ_INT(read(p[0], &c, 1), 1);
  kill(writer, SIGKILL);
  waitpid(writer, NULL, 0);
  /* The writer is dead (its child lives on): its record is reclaimed. */
  unsigned char buf[64] = {0};
  ASSERT_EQ_INT(encache_store_write(st, "orphaned", NULL, 0, buf, sizeof(buf)), 0);
  encache_store_close(st);
}

static void stop_self(void) { raise(SIGSTOP); }

static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (t.tv_nsec - t0->tv_nsec) / 1e9;
}

TEST(shm_stopped_writer_does_not_stall_the_ring) {
  char url[128];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    encache_store *w = reopen(url);
    encache__shm_write_hook = stop_self; /* stopped mid-copy */
    put(w, "stalled", 64 << 10, 1);
    encache_store_close(w);
    _exit(0);
  }
  int status;
  ASSERT_EQ_INT(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT(WIFSTOPPED(status));
  /* Ten laps of the ring while it is stopped: every write goes around. */
  char key[32];
  for (int i = 0; i < 200; i++) {
    snprintf(key, sizeof(key), "lap-%d", i);
    put(st, key, 100 << 10, 1);
  }
  assert_hit(st, key, 100 << 10);
  /* Resumed, it publishes its object intact. */
  kill(pid, SIGCONT);
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_hit(st, "stalled", 64 << 10);
  encache_store_close(st);
}

TEST(shm_stopped_lock_holder_costs_one_timeout) {
  char url[128];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  put(st, "k", 100, 1);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    encache_store *c = reopen(url);
    if (encache__shm_test_lock(c) != 0)
      _exit(1);
    raise(SIGSTOP); /* stopped holding the lock */
    _exit(0);
  }
  int status;
  ASSERT_EQ_INT(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT(WIFSTOPPED(status));
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  encache_store *o = reopen(url); /* opens do not wait on the lock */
  double open_s = since(&t0);
  unsigned char out[100];
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_EQ_INT(ts_read_one(o, "k", out, sizeof(out)), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(o), "lock not acquired within 500 ms");
  double first_s = since(&t0);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 20; i++)
    ASSERT_EQ_INT(ts_read_one(o, "k", out, sizeof(out)), ENCACHE_EUNAVAIL);
  double next_s = since(&t0);
  printf("# open %.3f s, first operation %.3f s, next 20 %.3f s\n", open_s,
         first_s, next_s);
  ASSERT(open_s < 2.0);             /* no wait for the lock (0.5 s) */
  ASSERT(first_s >= 0.45 && first_s < 3.0);
  ASSERT(next_s < 0.4 * 20 / 2);    /* far less than 20 timeouts */
  /* The holder dies: the next locker repairs and goes on. */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  ASSERT_EQ_INT(ts_read_one(o, "k", out, sizeof(out)), 100);
  encache_store_close(o);
  encache_store_close(st);
}
