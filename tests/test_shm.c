/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm Store beyond the conformance suite: format checks, eviction and
 * its second chance, reads racing evictions, dead lock holders, killed
 * writers, corrupted indexes, and stress with many processes and threads.
 */
#include "runner.h"
#include "store_util.h"

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

/* A fresh private segment "NAME-<pid>" of the given size; destroyed at
 * exit by the process that made it. */
static char seg_name[64];
static pid_t seg_owner;
static void seg_destroy(void) {
  if (getpid() == seg_owner)
    encache_shm_destroy(seg_name);
}
static encache_store *seg_open(const char *size, char *url, size_t ulen) {
  snprintf(seg_name, sizeof(seg_name), "encache-shmtest-%d", (int)getpid());
  encache_shm_destroy(seg_name);
  seg_owner = getpid();
  atexit(seg_destroy);
  snprintf(url, ulen, "shm://%s?size=%s", seg_name, size);
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url, encache_store_errmsg(st));
  return st;
}

static encache_store *reopen(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url, encache_store_errmsg(st));
  return st;
}

/* key reads back whole and byte for byte as written. */
static void assert_hit(encache_store *st, const char *key, size_t len) {
  unsigned char *buf = malloc(len ? len : 1);
  int64_t r = ts_read_one(st, key, buf, len);
  int ok = r == (int64_t)len && ts_verify(key, buf, len);
  free(buf);
  if (!ok)
    test__fail(__FILE__, __LINE__, "%s: %lld bytes, not a hit of %zu", key,
               (long long)r, len);
}

static void put(encache_store *st, const char *key, size_t len,
                uint64_t version) {
  unsigned char *buf = malloc(len ? len : 1);
  ts_fill(key, version, buf, len);
  int rc = encache_store_write(st, key, NULL, 0, buf, len);
  free(buf);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "write %s: %s: %s", key,
               encache_err_name(rc), encache_store_errmsg(st));
}

static int open_err(const char *url, char *msg, size_t size) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  snprintf(msg, size, "%s", encache_store_errmsg(st));
  encache_store_close(st);
  return rc;
}

TEST(shm_url_errors) {
  char msg[512];
  ASSERT_EQ_INT(open_err("shm://", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "segment name must be");
  ASSERT_EQ_INT(open_err("shm://a/b", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_EQ_INT(open_err("shm://x?size=0", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "size=0: must be a size from 1MiB");
  ASSERT_EQ_INT(open_err("shm://x?size=lots", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_EQ_INT(open_err("shm://x?colour=red", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "unknown option 'colour'");
  ASSERT_EQ_INT(open_err("shm://x?size", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_EQ_INT(open_err("shm://x?lock_timeout_ms=0", msg, sizeof(msg)),
                ENCACHE_EURL);
  ASSERT_EQ_INT(open_err("nosuch://x", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "nosuch://x: unknown Store URL scheme");
  ASSERT_EQ_INT(open_err("", msg, sizeof(msg)), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "empty Store URL");
  ASSERT_EQ_INT(encache_shm_destroy("../etc"), ENCACHE_EURL);
  ASSERT_EQ_INT(encache_shm_destroy("encache-never-made"), ENCACHE_ENOENT);
}

/* Overwrites `len` bytes at `off` of the segment file. */
static void poke(const char *name, off_t off, const void *bytes, size_t len) {
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", name);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(pwrite(fd, bytes, len, off), (ssize_t)len);
  close(fd);
}

TEST(shm_refuses_foreign_or_corrupt_header) {
  char url[128], msg[512];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  put(st, "k", 100, 1);
  encache_store_close(st);
  uint64_t word, saved;

  /* Magic. */
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", seg_name);
  int fd = open(path, O_RDONLY);
  ASSERT(pread(fd, &saved, 8, 0) == 8);
  close(fd);
  word = 0x1122334455667788ull;
  poke(seg_name, 0, &word, 8);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, "not an encache segment, or its header is damaged");
  ASSERT_CONTAINS(msg, "encache shm destroy");
  poke(seg_name, 0, &saved, 8);

  /* Format word: another layout version. */
  fd = open(path, O_RDONLY);
  ASSERT(pread(fd, &saved, 8, 8) == 8);
  close(fd);
  word = saved + (1ull << 56);
  poke(seg_name, 8, &word, 8);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_EFORMAT);
  char needle[64];
  snprintf(needle, sizeof(needle), "layout version %u", (unsigned)(word >> 56));
  ASSERT_CONTAINS(msg, needle);
  poke(seg_name, 8, &saved, 8);

  /* Geometry: a data offset that does not match. */
  fd = open(path, O_RDONLY);
  ASSERT(pread(fd, &saved, 8, 40) == 8);
  close(fd);
  word = saved + 4096;
  poke(seg_name, 40, &word, 8);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, "corrupted segment header");
  poke(seg_name, 40, &saved, 8);

  /* Restored, it opens and still holds its object. */
  st = reopen(url);
  unsigned char out[100];
  ASSERT_EQ_INT(ts_read_one(st, "k", out, sizeof(out)), 100);
  ASSERT(ts_verify("k", out, 100));
  encache_store_close(st);

  /* A file too short to hold a header. */
  fd = open(path, O_RDWR);
  ASSERT_EQ_INT(ftruncate(fd, 16), 0);
  close(fd);
  ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, "(16 bytes");
}

TEST(shm_evicts_when_full_and_refuses_too_large) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT_EQ_STR(s.kind, "shm");
  uint64_t cap = s.capacity;
  ASSERT(cap > (3u << 20) && cap < (4u << 20));
  for (int i = 0; i < 200; i++) {
    char key[32];
    snprintf(key, sizeof(key), "obj-%03d", i);
    put(st, key, 64 << 10, (uint64_t)i);
  }
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.evictions > 100);
  ASSERT(s.bytes_used <= s.capacity);
  ASSERT(s.objects * (64u << 10) <= s.capacity);
  unsigned char *out = malloc(64 << 10);
  assert_hit(st, "obj-199", 64 << 10);
  ASSERT_EQ_INT(ts_read_one(st, "obj-000", out, 64 << 10), ENCACHE_ENOENT);
  free(out);
  /* An object that cannot fit the segment is refused, not half-stored. */
  unsigned char *big = calloc(1, 4u << 20);
  ASSERT_EQ_INT(encache_store_write(st, "huge", NULL, 0, big, 4u << 20),
                ENCACHE_ETOOLARGE);
  ASSERT_CONTAINS(encache_store_errmsg(st), "does not fit");
  free(big);
  /* Tiny objects beyond the entry table evict by entry count. */
  for (int i = 0; i < 3000; i++) {
    char key[32];
    snprintf(key, sizeof(key), "tiny-%d", i);
    put(st, key, 8, (uint64_t)i);
  }
  unsigned char t[8];
  ASSERT_EQ_INT(ts_read_one(st, "tiny-2999", t, 8), 8);
  encache_store_close(st);
}

TEST(shm_second_chance_keeps_read_objects) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  unsigned char *out = malloc(64 << 10);
  put(st, "hot", 64 << 10, 1);
  put(st, "cold", 64 << 10, 1);
  for (int i = 0; i < 300; i++) {
    if (i % 10 == 0)
      ASSERT_EQ_INT(ts_read_one(st, "hot", out, 64 << 10), 64 << 10);
    char key[32];
    snprintf(key, sizeof(key), "filler-%d", i);
    put(st, key, 64 << 10, (uint64_t)i);
  }
  assert_hit(st, "hot", 64 << 10);
  ASSERT_EQ_INT(ts_read_one(st, "cold", out, 64 << 10), ENCACHE_ENOENT);
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.reinsertions >= 5);
  free(out);
  encache_store_close(st);
}

static encache_store *hook_store;
static void remove_during_read(void) {
  ASSERT_EQ_INT(encache_store_remove(hook_store, "victim"), 0);
  put(hook_store, "victim", 4096, 2); /* same key, new object, maybe same place */
}

TEST(shm_miss_when_object_replaced_while_read) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  hook_store = reopen(url);
  put(st, "victim", 4096, 1);
  unsigned char out[4096];
  encache__shm_read_hook = remove_during_read;
  ASSERT_EQ_INT(ts_read_one(st, "victim", out, sizeof(out)), ENCACHE_ENOENT);
  encache__shm_read_hook = NULL;
  ASSERT_EQ_INT(ts_read_one(st, "victim", out, sizeof(out)), 4096);
  uint64_t v;
  memcpy(&v, out, 8);
  ASSERT_EQ_U64(v, 2);
  encache_store_close(hook_store);
  encache_store_close(st);
}

TEST(shm_repairs_after_lock_holder_dies) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  for (int i = 0; i < 20; i++) {
    char key[32];
    snprintf(key, sizeof(key), "keep-%d", i);
    put(st, key, 10000, (uint64_t)i);
  }
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    encache_store *c = reopen(url);
    if (encache__shm_test_lock(c) != 0)
      _exit(1);
    _exit(0); /* dies holding the lock */
  }
  int status;
  waitpid(pid, &status, 0);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unsigned char out[10000];
  for (int i = 0; i < 20; i++) {
    char key[32];
    snprintf(key, sizeof(key), "keep-%d", i);
    ASSERT_EQ_INT(ts_read_one(st, key, out, sizeof(out)), 10000);
    ASSERT(ts_verify(key, out, 10000));
  }
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT_EQ_U64(s.repairs, 1);
  ASSERT_EQ_U64(s.objects, 20);
  put(st, "after", 100, 1);
  encache_store_close(st);
}

static int hook_fd = -1;
static void stall_writer(void) {
  char c = 'w';
  if (write(hook_fd, &c, 1) != 1)
    _exit(3);
  pause(); /* the parent kills us here, mid-write */
}

TEST(shm_killed_writer_loses_only_its_object) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  put(st, "before", 5000, 1);
  int p[2];
  ASSERT_EQ_INT(pipe(p), 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    encache_store *c = reopen(url);
    hook_fd = p[1];
    encache__shm_write_hook = stall_writer;
    put(c, "doomed", 1 << 20, 1);
    _exit(0);
  }
  char c;
  ASSERT_EQ_INT(read(p[0], &c, 1), 1);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  ASSERT(WIFSIGNALED(status));
  /* The half-written object is invisible; the rest is intact. */
  const char *keys[2] = {"doomed", "before"};
  int pr[2];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 2, pr), 0);
  ASSERT_EQ_INT(pr[0], 0);
  ASSERT_EQ_INT(pr[1], 1);
  /* Its key can be written again (the dead writer's entry is reclaimed),
   * and the ring runs past its record. */
  put(st, "doomed", 1 << 20, 2);
  for (int i = 0; i < 100; i++) {
    char key[32];
    snprintf(key, sizeof(key), "more-%d", i);
    put(st, key, 100 << 10, (uint64_t)i);
  }
  assert_hit(st, "more-99", 100 << 10);
  encache_store_close(st);
}

TEST(shm_repairs_corrupted_index) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  for (int i = 0; i < 40; i++) {
    char key[32];
    snprintf(key, sizeof(key), "c-%d", i);
    put(st, key, 20000, (uint64_t)i);
  }
  encache_store_close(st);
  /* Garbage over part of the entry table, from its sixth entry on. */
  unsigned char junk[2048];
  uint64_t r = 42;
  for (size_t i = 0; i < sizeof(junk); i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    junk[i] = (unsigned char)(r >> 56);
  }
  poke(seg_name, lay.entries_off + 5 * lay.entry_size, junk, sizeof(junk));
  st = reopen(url);
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.repairs >= 1);
  ASSERT(s.objects < 40);
  /* Whatever survived is exactly what was written. */
  int survivors = 0;
  unsigned char *out = malloc(20000);
  for (int i = 0; i < 40; i++) {
    char key[32];
    snprintf(key, sizeof(key), "c-%d", i);
    int64_t n = ts_read_one(st, key, out, 20000);
    ASSERT(n == 20000 || n == ENCACHE_ENOENT);
    if (n == 20000) {
      ASSERT(ts_verify(key, out, 20000));
      survivors++;
    }
  }
  ASSERT(survivors >= 5);
  put(st, "fresh", 20000, 1);
  ASSERT_EQ_INT(ts_read_one(st, "fresh", out, 20000), 20000);
  free(out);
  encache_store_close(st);
}

/* The header's counters: evictions, reinsertions, repairs (shm.h: after
 * the ring head, the list ends, nobjects and bytes_used). */
static void poke_counters(const encache__shm_layout *lay, uint64_t ev,
                          uint64_t re, uint64_t rp) {
  uint64_t c[3] = {ev, re, rp};
  for (int i = 0; i < 3; i++)
    if (c[i] != 0)
      poke(seg_name, (off_t)(lay->head_off + 32 + 8 * (uint64_t)i), &c[i], 8);
}

TEST(shm_damaged_counters_are_repaired_not_reported) {
  char url[128];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  for (int i = 0; i < 40; i++) { /* 5 MiB through a 2 MiB ring */
    char key[32];
    snprintf(key, sizeof(key), "e-%d", i);
    put(st, key, 128 << 10, (uint64_t)i);
  }
  encache_store_stats s = {.size = sizeof(s)};
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  uint64_t evicted = s.evictions;
  ASSERT(evicted >= 20);
  ASSERT_EQ_U64(s.repairs, 0);
  /* repairs beyond anything a segment of this history can have made */
  poke_counters(&lay, 0, 0, UINT64_MAX - 1);
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT_EQ_U64(s.evictions, evicted); /* the others kept */
  ASSERT_EQ_U64(s.repairs, 1);
  /* more evictions and second chances than records the ring has held */
  poke_counters(&lay, UINT64_C(0x8badf00ddeadbeef), UINT64_C(1) << 40, 0);
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT_EQ_U64(s.evictions, 0);
  ASSERT_EQ_U64(s.reinsertions, 0);
  ASSERT_EQ_U64(s.repairs, 2);
  ASSERT_EQ_U64(s.objects, 40 - evicted); /* the objects untouched */
  put(st, "after", 128 << 10, 1); /* and counted from there */
  ASSERT_EQ_INT(encache_store_stats_get(st, &s), 0);
  ASSERT(s.evictions >= 1 && s.evictions <= 2);
  encache_store_close(st);
}

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

TEST(shm_overlong_key_is_refused_not_fatal) {
  char url[128];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  static char key[70000];
  memset(key, 'k', sizeof(key) - 1);
  const char *keys[1] = {key};
  int pr[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, pr), 0);
  ASSERT_EQ_INT(pr[0], ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_write(st, key, NULL, 0, "x", 1), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "key length 69999");
  encache_store_close(st);
}

/* ------------------------------------------- damage, stalls (issue 19) */

/* A second mapping of the segment file, as another process would have. */
static unsigned char *map_file(const char *name, size_t *size) {
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", name);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  struct stat sb;
  ASSERT_EQ_INT(fstat(fd, &sb), 0);
  *size = (size_t)sb.st_size;
  void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT(p != MAP_FAILED);
  return p;
}

/* Names keys[from..to) "PREFIX-i" and writes each, len bytes. */
static void put_keys(encache_store *st, char (*keys)[32], int from, int to,
                     const char *prefix, size_t len) {
  for (int i = from; i < to; i++) {
    snprintf(keys[i], sizeof(keys[i]), "%s-%d", prefix, i);
    put(st, keys[i], len, 1);
  }
}

/* Every key in keys[0..n) reads back either as a miss or byte for byte as
 * written; returns the number of hits. */
static int hits_all_right(encache_store *st, char keys[][32], int n,
                          size_t len) {
  unsigned char *buf = malloc(len);
  int hits = 0;
  for (int i = 0; i < n; i++) {
    int64_t r = ts_read_one(st, keys[i], buf, len);
    if (r == ENCACHE_ENOENT)
      continue;
    if (r != (int64_t)len || !ts_verify(keys[i], buf, len))
      test__fail(__FILE__, __LINE__, "%s: a wrong hit (%lld bytes)", keys[i],
                 (long long)r);
    hits++;
  }
  free(buf);
  return hits;
}

/* A fresh segment opened with extra URL options, and its layout. */
static encache_store *seg_open_with(const char *size, const char *opts,
                                    encache__shm_layout *lay) {
  char url[160], base[128];
  encache_store_close(seg_open(size, base, sizeof(base)));
  snprintf(url, sizeof(url), "%s&%s", base, opts);
  encache_store *st = reopen(url);
  ASSERT_EQ_INT(encache__shm_test_layout(st, lay), 0);
  return st;
}

static void head_moved_back(const char *opts) {
  encache__shm_layout lay;
  encache_store *st = seg_open_with("2MiB", opts, &lay);
  char keys[12][32];
  put_keys(st, keys, 0, 6, "before", 128 << 10);
  /* Another process moves the ring's head back by 96 KiB. */
  size_t size;
  unsigned char *m = map_file(seg_name, &size);
  uint64_t head;
  memcpy(&head, m + lay.head_off, 8);
  head -= 96 << 10;
  memcpy(m + lay.head_off, &head, 8);
  put_keys(st, keys, 6, 12, "after", 128 << 10);
  /* The newest record before the damage was not written over. */
  ASSERT(hits_all_right(st, keys, 12, 128 << 10) >= 7);
  unsigned char *buf = malloc(128 << 10);
  ASSERT_EQ_INT(ts_read_one(st, keys[5], buf, 128 << 10), 128 << 10);
  free(buf);
  munmap(m, size);
  encache_store_close(st);
}

TEST(shm_head_moved_back_never_makes_a_wrong_hit) {
  head_moved_back("checksum=off"); /* the structural checks alone */
  head_moved_back("checksum=on");
}

/* Finds the payload of key's record in the data region of a mapping. */
static unsigned char *payload_of(unsigned char *m, const encache__shm_layout *l,
                                 const char *key) {
  size_t klen = strlen(key);
  for (uint64_t off = 0; off + klen <= l->data_size; off += 64)
    if (memcmp(m + l->data_off + off, key, klen) == 0 &&
        m[l->data_off + off + klen] == 0)
      return m + l->data_off + off + (klen + 63) / 64 * 64;
  return NULL;
}

static int flipped_payloads_served(const char *opts) {
  encache__shm_layout lay;
  encache_store *st = seg_open_with("4MiB", opts, &lay);
  size_t size, len = 16 << 10;
  unsigned char *m = map_file(seg_name, &size), *buf = malloc(len);
  int served = 0;
  for (int i = 0; i < 20; i++) {
    char key[32];
    snprintf(key, sizeof(key), "flip-%d", i);
    put(st, key, len, 1);
    unsigned char *p = payload_of(m, &lay, key);
    ASSERT(p != NULL);
    if (i < 10) {
      p[(size_t)(i * 797) % len] ^= (unsigned char)(1u << (i % 8));
    } else {
      /* Bit 63 of two words of one lane, an even number of blocks
       * apart: changes that cancel in plain modular sums. */
      size_t at = (size_t)(i * 797) % (len - 128) / 8 * 8 + 7;
      p[at] ^= 0x80;
      p[at + 64 * (size_t)(i % 3 + 1)] ^= 0x80;
    }
    int64_t r = ts_read_one(st, key, buf, len);
    if (r == (int64_t)len)
      served++;
    else
      ASSERT_EQ_INT(r, ENCACHE_ENOENT);
  }
  free(buf);
  munmap(m, size);
  encache_store_close(st);
  return served;
}

TEST(shm_payload_bit_flips_are_misses) {
  ASSERT_EQ_INT(flipped_payloads_served("checksum=on"), 0);
  /* Without checksums nothing can tell (documented in docs/stores.md). */
  ASSERT_EQ_INT(flipped_payloads_served("checksum=off"), 20);
}

TEST(shm_damaged_lock_is_refused_not_fatal) {
  char url[128], msg[512];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  put(st, "k", 100, 1);
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  if (lay.lock_kind_off == 0) {
    encache_store_close(st);
    return; /* not glibc: the kind word is unknown */
  }
  size_t size;
  unsigned char *m = map_file(seg_name, &size);
  int saved, bad[] = {0x7fffffff, 3, 0x10, -1};
  memcpy(&saved, m + lay.lock_kind_off, sizeof(saved));
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memcpy(m + lay.lock_kind_off, &bad[i], sizeof(bad[i]));
    ASSERT_EQ_INT(open_err(url, msg, sizeof(msg)), ENCACHE_EFORMAT);
    ASSERT_CONTAINS(msg, "lock is damaged");
    ASSERT_CONTAINS(msg, "encache shm destroy");
    unsigned char out[100];
    ASSERT_EQ_INT(ts_read_one(st, "k", out, sizeof(out)), ENCACHE_EUNAVAIL);
    ASSERT_CONTAINS(encache_store_errmsg(st), "lock is damaged");
  }
  memcpy(m + lay.lock_kind_off, &saved, sizeof(saved));
  unsigned char out[100];
  ASSERT_EQ_INT(ts_read_one(st, "k", out, sizeof(out)), 100);
  munmap(m, size);
  encache_store_close(st);
}

TEST(shm_zeroed_magic_is_refused_never_remade) {
  char url[128], small[160], msg[512];
  encache_store *st = seg_open("4MiB", url, sizeof(url));
  char keys[8][32];
  put_keys(st, keys, 0, 8, "z", 256 << 10);
  size_t size;
  unsigned char *m = map_file(seg_name, &size);
  uint64_t saved, zero = 0;
  memcpy(&saved, m, 8);
  memcpy(m, &zero, 8);
  /* A new opener asking for a smaller segment is refused... */
  snprintf(small, sizeof(small), "shm://%s?size=1MiB", seg_name);
  ASSERT_EQ_INT(open_err(small, msg, sizeof(msg)), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, "header is damaged");
  /* ...and did not shrink it: the attached handle (which would die of
   * SIGBUS past 1 MiB) answers "unavailable" and reads nothing. */
  struct stat sb;
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", seg_name);
  ASSERT_EQ_INT(stat(path, &sb), 0);
  ASSERT_EQ_U64((uint64_t)sb.st_size, (uint64_t)size);
  unsigned char *buf = malloc(256 << 10);
  ASSERT_EQ_INT(ts_read_one(st, keys[7], buf, 256 << 10), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "header is damaged");
  memcpy(m, &saved, 8);
  ASSERT_EQ_INT(hits_all_right(st, keys, 8, 256 << 10), 8);
  free(buf);
  munmap(m, size);
  encache_store_close(st);

  /* An unfinished segment (its creator died) is remade; an empty file
   * too. */
  int fd = open(path, O_RDWR | O_TRUNC);
  ASSERT(fd >= 0);
  uint64_t init = 0x54494e494e434e45ull; /* "ENCNINIT" */
  ASSERT_EQ_INT(pwrite(fd, &init, 8, 0), 8);
  ASSERT_EQ_INT(ftruncate(fd, 1 << 20), 0);
  close(fd);
  st = reopen(small);
  put(st, "remade", 100, 1);
  encache_store_close(st);
  fd = open(path, O_RDWR | O_TRUNC);
  close(fd);
  st = reopen(small);
  put(st, "remade", 100, 1);
  encache_store_close(st);
}

/* A child that damages index bytes at random for `ms` milliseconds. */
static pid_t start_scribbler(const encache__shm_layout *l, unsigned ms,
                             unsigned seed) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid != 0)
    return pid;
  size_t size;
  unsigned char *m = map_file(seg_name, &size);
  srand(seed);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    uint64_t off;
    switch (rand() % 4) {
    case 0: /* an entry field */
      off = l->entries_off + (uint64_t)(rand() % (int)l->nentries) * l->entry_size +
            (uint64_t)(rand() % (int)l->entry_size);
      break;
    case 1: /* a bucket */
      off = l->buckets_off + (uint64_t)(rand() % (int)l->nbuckets) * 4;
      break;
    case 2: /* the head and the lists */
      off = l->head_off + (uint64_t)(rand() % 24);
      break;
    default: /* a position: far out of range */
      off = l->entries_off + (uint64_t)(rand() % (int)l->nentries) * l->entry_size +
            l->entry_pos_off + 4;
      break;
    }
    m[off] = (unsigned char)rand();
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 <
           (long)ms);
  _exit(0);
}

TEST(shm_repair_survives_concurrent_damage) {
  char url[128];
  encache_store *st = seg_open("2MiB", url, sizeof(url));
  char keys[40][32];
  put_keys(st, keys, 0, 40, "r", 8 << 10);
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  pid_t pid = start_scribbler(&lay, 1500, 7);
  int repairs = 0, writes = 0;
  unsigned char buf[8 << 10];
  ts_fill("x", 1, buf, sizeof(buf));
  for (int round = 0; waitpid(pid, NULL, WNOHANG) == 0; round++) {
    if (encache__shm_test_repair(st, 1) == 0)
      repairs++;
    char key[32];
    snprintf(key, sizeof(key), "w-%d", round);
    if (encache_store_write(st, key, NULL, 0, buf, sizeof(buf)) == 0)
      writes++;
    (void)hits_all_right(st, keys, 40, 8 << 10);
  }
  printf("# %d repairs, %d writes under damage\n", repairs, writes);
  ASSERT(repairs > 0);
  /* Damage stopped: one repair makes it whole and usable again. */
  ASSERT_EQ_INT(encache__shm_test_repair(st, 0), 0);
  put(st, "after-the-damage", 8 << 10, 1);
  ASSERT_EQ_INT(ts_read_one(st, "after-the-damage", buf, sizeof(buf)), 8 << 10);
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

TEST(shm_concurrent_opens_of_a_large_new_segment) {
  char url[128];
  encache_store_close(seg_open("1MiB", url, sizeof(url)));
  encache_shm_destroy(seg_name); /* a new name, created by the openers */
  snprintf(url, sizeof(url), "shm://%s?size=256MiB", seg_name);
  int go[2];
  ASSERT_EQ_INT(pipe(go), 0);
  pid_t pids[3];
  for (int i = 0; i < 3; i++) {
    pids[i] = fork();
    ASSERT(pids[i] >= 0);
    if (pids[i] == 0) {
      char c;
      if (read(go[0], &c, 1) != 1)
        _exit(3);
      encache_store *st = NULL;
      int rc = encache_store_open(url, &st);
      if (rc != 0)
        fprintf(stderr, "open: %s\n", encache_store_errmsg(st));
      encache_store_close(st);
      _exit(rc == 0 ? 0 : 1);
    }
  }
  ASSERT_EQ_INT(write(go[1], "xxx", 3), 3);
  for (int i = 0; i < 3; i++) {
    int status;
    ASSERT_EQ_INT(waitpid(pids[i], &status, 0), pids[i]);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  encache_store *st = reopen(url);
  put(st, "k", 100, 1);
  encache_store_close(st);
}

/* create=no (issue 18): an absent segment is "no such segment", and none
 * appears; an existing one opens; an empty file (a creator that died
 * before writing) is refused and left alone; a bad value is named. */
TEST(shm_create_no_never_creates) {
  char name[64], url[160], path[96];
  snprintf(name, sizeof(name), "encache-nocreate-%d", (int)getpid());
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", name);
  encache_shm_destroy(name);
  snprintf(url, sizeof(url), "shm://%s?size=2MiB&create=no", name);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_ENOENT);
  ASSERT(st == NULL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "no such segment");
  ASSERT(access(path, F_OK) != 0);
  /* Made by a writer, then opened without creating. */
  snprintf(url, sizeof(url), "shm://%s?size=2MiB", name);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "k", NULL, 0, "v", 1), 0);
  encache_store_close(st);
  snprintf(url, sizeof(url), "shm://%s?create=no", name);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  uint64_t got = 0;
  ASSERT_EQ_INT(encache_store_object_size(st, "k", &got), 0);
  ASSERT_EQ_U64(got, 1);
  encache_store_close(st);
  ASSERT_EQ_INT(encache_shm_destroy(name), 0);
  /* An empty file: not a segment yet, and create=no does not make one. */
  char shm_path[96];
  snprintf(shm_path, sizeof(shm_path), "/encache-%s", name);
  int fd = shm_open(shm_path, O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_ENOENT);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "empty or unfinished");
  struct stat sb;
  ASSERT_EQ_INT(stat(path, &sb), 0);
  ASSERT_EQ_INT((int)sb.st_size, 0);
  ASSERT_EQ_INT(encache_shm_destroy(name), 0);
  snprintf(url, sizeof(url), "shm://%s?create=maybe", name);
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_EURL);
  ASSERT_CONTAINS(encache_store_errmsg(NULL), "create=maybe: must be yes or no");
  ASSERT(access(path, F_OK) != 0);
}
