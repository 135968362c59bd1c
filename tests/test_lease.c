/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single-flight leases (encache_store_lease_take() and _drop()).  The
 * store_lease_ tests are conformance tests: they run on the Store under
 * test ($ENCACHE_TEST_STORE, or a fresh shm segment) with the rest of the
 * store_ suite, and pass with a note on a Store without
 * ENCACHE_STORE_CAP_LEASE.  The shm_lease_ tests check what only shm
 * promises: a holder's lease ends at once when its process dies or its
 * handle closes, a full table is a recoverable error, damage is no hold.
 */
#include "runner.h"
#include "store_util.h"

#include "shm/testing.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


/* 1 (after saying so) when the Store under test has no leases: then both
 * calls answer EINVAL, naming the reason. */
static int lease_skipped(encache_store *st) {
  if (encache_store_caps_of(st) & ENCACHE_STORE_CAP_LEASE)
    return 0;
  ASSERT_EQ_INT(encache_store_lease_take(st, "k", 1, 1000), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "no leases");
  ASSERT_EQ_INT(encache_store_lease_drop(st, "k", 1), ENCACHE_EINVAL);
  printf("# skipped: this Store has no leases\n");
  encache_store_close(st);
  return 1;
}

static int lease_count_cb(const char *key, uint64_t len, void *arg) {
  (void)key;
  (void)len;
  ++*(int *)arg;
  return 0;
}

static uint64_t mono_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

TEST(store_lease_take_renew_drop_and_never_an_object) {
  encache_store *st = ts_open("16MiB");
  if (lease_skipped(st))
    return;
  char key[96], prefix[96];
  ts_key(key, sizeof(key), "lease-one");
  ts_key(prefix, sizeof(prefix), "lease-");
  const uint64_t a = 0x1111, b = 0x2222;
  ASSERT_EQ_INT(encache_store_lease_take(st, key, a, 30000), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, a, 30000), 0); /* renewed */
  ASSERT_EQ_INT(encache_store_lease_take(st, key, b, 30000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, b), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, a), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, a), ENCACHE_ENOENT);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, b, 30000), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 0, 30000), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, a, 0), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_lease_take(st, "", a, 100), ENCACHE_EINVAL);
  /* A lease is no object: not there, not listed, not counted. */
  const char *keys[1] = {key};
  int there[1] = {7};
  uint64_t len = 0, objects = 9, bytes = 9, removed = 9;
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, there), 0);
  ASSERT_EQ_INT(there[0], 0);
  ASSERT_EQ_INT(encache_store_object_size(st, key, &len), ENCACHE_ENOENT);
  int listed = 0;
  if (encache_store_caps_of(st) & ENCACHE_STORE_CAP_LIST) {
    char pattern[100];
    snprintf(pattern, sizeof(pattern), "%s*", prefix);
    ASSERT_EQ_INT(encache_store_list(st, pattern, lease_count_cb, &listed), 0);
    ASSERT_EQ_INT(listed, 0);
    ASSERT_EQ_INT(encache_store_count_prefix(st, prefix, &objects, &bytes), 0);
    ASSERT_EQ_U64(objects, 0);
  }
  /* Nor does it stand in an object's way; purging objects leaves it. */
  ASSERT_EQ_INT(encache_store_write(st, key, NULL, 0, "abc", 3), 0);
  ASSERT_EQ_INT(encache_store_object_size(st, key, &len), 0);
  ASSERT_EQ_U64(len, 3);
  ASSERT_EQ_INT(encache_store_remove_prefix(st, prefix, &removed), 0);
  ASSERT_EQ_U64(removed, 1);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, a, 30000), ENCACHE_EEXIST);
  /* Another handle sees it; the token, not the handle, drops it. */
  encache_store *other = ts_reopen();
  ASSERT_EQ_INT(encache_store_lease_take(other, key, a, 30000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(other, key, b), 0);
  ASSERT_EQ_INT(encache_store_lease_take(other, key, a, 30000), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, a), 0);
  encache_store_close(other);
  encache_store_close(st);
}

TEST(store_lease_ends_at_its_deadline) {
  encache_store *st = ts_open("16MiB");
  if (lease_skipped(st))
    return;
  char key[96], renewed[96];
  ts_key(key, sizeof(key), "lease-ttl");
  ts_key(renewed, sizeof(renewed), "lease-renewed");
  const uint64_t a = 0xa1, b = 0xb2;
  uint64_t t0 = mono_now_ms();
  ASSERT_EQ_INT(encache_store_lease_take(st, key, a, 300), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, renewed, a, 300), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, renewed, a, 60000), 0);
  int rc = encache_store_lease_take(st, key, b, 60000);
  if (mono_now_ms() - t0 < 300)
    ASSERT_EQ_INT(rc, ENCACHE_EEXIST);
  /* Free at its deadline, not before; bounded. */
  while (rc == ENCACHE_EEXIST && mono_now_ms() - t0 < 10000) {
    usleep(2000);
    rc = encache_store_lease_take(st, key, b, 60000);
  }
  ASSERT_EQ_INT(rc, 0);
  uint64_t waited = mono_now_ms() - t0;
  if (waited < 299)
    test__fail(__FILE__, __LINE__, "a 300 ms lease ended after %" PRIu64
               " ms", waited);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, a), ENCACHE_ENOENT);
  /* The renewal moved the other one's deadline a minute on. */
  ASSERT_EQ_INT(encache_store_lease_take(st, renewed, b, 60000),
                ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, b), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, renewed, a), 0);
  encache_store_close(st);
}

/* Many processes take the same keys at once, round after round: exactly
 * one wins each key each round; the winners drop theirs between rounds. */
#define RACE_PROCS 8
#define RACE_ROUNDS 20
#define RACE_KEYS 8

typedef struct race_board {
  int arrived[2 * RACE_ROUNDS]; /* two barriers a round */
  int winners[RACE_ROUNDS][RACE_KEYS];
  int bad;
} race_board;

/* Waits (at most 20 s) until every process reached barrier i. */
static void race_barrier(race_board *rb, int i) {
  __atomic_add_fetch(&rb->arrived[i], 1, __ATOMIC_ACQ_REL);
  uint64_t t0 = mono_now_ms();
  while (__atomic_load_n(&rb->arrived[i], __ATOMIC_ACQUIRE) < RACE_PROCS)
    if (mono_now_ms() - t0 > 20000) {
      __atomic_store_n(&rb->bad, 1, __ATOMIC_RELAXED);
      _exit(2);
    }
}

static void race_child(race_board *rb, const char *prefix, int p) {
  encache_store *c = ts_reopen();
  uint64_t token = ((uint64_t)getpid() << 8) | (uint64_t)(p + 1);
  for (int r = 0; r < RACE_ROUNDS; r++) {
    int won[RACE_KEYS] = {0};
    race_barrier(rb, 2 * r);
    for (int i = 0; i < RACE_KEYS; i++) {
      int j = (i + p) % RACE_KEYS; /* each process in its own order */
      char key[128];
      snprintf(key, sizeof(key), "%s%d", prefix, j);
      int rc = encache_store_lease_take(c, key, token, 60000);
      if (rc == 0) {
        won[j] = 1;
        __atomic_add_fetch(&rb->winners[r][j], 1, __ATOMIC_RELAXED);
      } else if (rc != ENCACHE_EEXIST) {
        fprintf(stderr, "# take %s: %s: %s\n", key, encache_err_name(rc),
                encache_store_errmsg(c));
        __atomic_store_n(&rb->bad, 1, __ATOMIC_RELAXED);
      }
    }
    race_barrier(rb, 2 * r + 1);
    for (int j = 0; j < RACE_KEYS; j++) {
      char key[128];
      snprintf(key, sizeof(key), "%s%d", prefix, j);
      if (won[j] && encache_store_lease_drop(c, key, token) != 0)
        __atomic_store_n(&rb->bad, 1, __ATOMIC_RELAXED);
    }
  }
  encache_store_close(c);
  _exit(0);
}

TEST(store_lease_races_have_one_winner_per_key) {
  encache_store *st = ts_open("16MiB");
  if (lease_skipped(st))
    return;
  encache_store_close(st); /* each process opens its own handle */
  char prefix[64];
  ts_key(prefix, sizeof(prefix), "lease-race-");
  race_board *rb = mmap(NULL, sizeof(*rb), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(rb != MAP_FAILED);
  memset(rb, 0, sizeof(*rb));
  pid_t pids[RACE_PROCS];
  for (int p = 0; p < RACE_PROCS; p++) {
    pids[p] = fork();
    ASSERT(pids[p] >= 0);
    if (pids[p] == 0)
      race_child(rb, prefix, p);
  }
  for (int p = 0; p < RACE_PROCS; p++) {
    int status;
    waitpid(pids[p], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      test__fail(__FILE__, __LINE__, "process %d failed (status 0x%x)", p,
                 status);
  }
  ASSERT_EQ_INT(rb->bad, 0);
  for (int r = 0; r < RACE_ROUNDS; r++)
    for (int j = 0; j < RACE_KEYS; j++)
      if (rb->winners[r][j] != 1)
        test__fail(__FILE__, __LINE__, "round %d key %d: %d winners", r, j,
                   rb->winners[r][j]);
  munmap(rb, sizeof(*rb));
}

/* ------------------------------------------------------------- shm only */

/* A fresh private shm segment of `size`, whatever Store the suite is on. */
static encache_store *shm_private(const char *size) {
  unsetenv("ENCACHE_TEST_STORE");
  return ts_open(size);
}

static void lease_key(char *buf, size_t len, const char *prefix, int i) {
  snprintf(buf, len, "%s%d", prefix, i);
}

/* A child process that takes the leases of prefix0, prefix1, ... (n of
 * them; n < 0: until the table refuses one), says how many it took (-1:
 * an unexpected answer) and stays until killed. */
static pid_t holder(const char *prefix, int n, uint64_t token, int *taken) {
  int p[2];
  ASSERT_EQ_INT(pipe(p), 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    alarm(60); /* never outlives a failed test */
    encache_store *c = ts_reopen();
    int i = 0;
    for (; n < 0 || i < n; i++) {
      char key[128];
      lease_key(key, sizeof(key), prefix, i);
      int rc = encache_store_lease_take(c, key, token, 600000);
      if (rc != 0) {
        i = n < 0 && rc == ENCACHE_EUNAVAIL ? i : -1;
        break;
      }
    }
    if (write(p[1], &i, sizeof(i)) != (ssize_t)sizeof(i))
      _exit(3);
    for (;;)
      pause();
  }
  close(p[1]);
  ASSERT_EQ_INT(read(p[0], taken, sizeof(*taken)), sizeof(*taken));
  close(p[0]);
  return pid;
}

static void kill_holder(pid_t pid) {
  int status;
  ASSERT_EQ_INT(kill(pid, SIGKILL), 0);
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
}

TEST(shm_lease_killed_holder_frees_at_once) {
  encache_store *st = shm_private("16MiB");
  char prefix[64], key[128];
  ts_key(prefix, sizeof(prefix), "held-");
  int taken = 0;
  pid_t pid = holder(prefix, 50, 0xdead, &taken);
  ASSERT_EQ_INT(taken, 50);
  lease_key(key, sizeof(key), prefix, 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 0xbeef, 1000),
                ENCACHE_EEXIST);
  /* A stopped holder is alive: its leases hold. */
  int status;
  ASSERT_EQ_INT(kill(pid, SIGSTOP), 0);
  ASSERT_EQ_INT(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT(WIFSTOPPED(status));
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 0xbeef, 1000),
                ENCACHE_EEXIST);
  /* Killed, its leases (ten minutes long) are free at once. */
  kill_holder(pid);
  uint64_t t0 = mono_now_ms();
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 0xdead), ENCACHE_ENOENT);
  for (int i = 0; i < 50; i++) {
    lease_key(key, sizeof(key), prefix, i);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 0xbeef, 1000), 0);
  }
  uint64_t took = mono_now_ms() - t0;
  printf("# 50 leases of a killed holder taken over in %" PRIu64 " ms\n",
         took);
  ASSERT(took < 1000);
  encache_store_close(st);
}

TEST(shm_lease_closed_handle_and_forked_child) {
  encache_store *st = shm_private("16MiB");
  char key[64];
  ts_key(key, sizeof(key), "handle");
  /* A closed handle's leases end with it. */
  encache_store *other = ts_reopen();
  ASSERT_EQ_INT(encache_store_lease_take(other, key, 1, 600000), 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 2, 600000), ENCACHE_EEXIST);
  encache_store_close(other);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 2, 600000), 0);
  /* A child after fork() cannot use its parent's handle, and its exit
   * does not end the parent's lease. */
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int rc = encache_store_lease_take(st, key, 3, 1000);
    _exit(rc == ENCACHE_EINVAL &&
                  strstr(encache_store_errmsg(st), "fork") != NULL
              ? 0
              : 1);
  }
  int status;
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  other = ts_reopen();
  ASSERT_EQ_INT(encache_store_lease_take(other, key, 3, 1000), ENCACHE_EEXIST);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 2), 0);
  ASSERT_EQ_INT(encache_store_lease_take(other, key, 3, 1000), 0);
  encache_store_close(other);
  encache_store_close(st);
}

TEST(shm_lease_full_table_is_recoverable) {
  encache_store *st = shm_private("1MiB");
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  ASSERT_EQ_INT(lay.nleases, 256); /* the smallest table */
  char prefix[64], key[128];
  ts_key(prefix, sizeof(prefix), "full-");
  int n = 0, rc = 0;
  for (; n <= (int)lay.nleases && rc == 0; n++) {
    lease_key(key, sizeof(key), prefix, n);
    rc = encache_store_lease_take(st, key, 7, 600000);
  }
  n--; /* key n was refused */
  ASSERT_EQ_INT(rc, ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "lease table is full");
  printf("# the table refused lease %d of %u\n", n + 1, lay.nleases);
  ASSERT(n >= 64 && n <= (int)lay.nleases);
  char first[128];
  lease_key(first, sizeof(first), prefix, 0);
  ASSERT_EQ_INT(encache_store_lease_take(st, first, 7, 600000), 0);
  for (int i = 0; i < n; i++) {
    char k[128];
    lease_key(k, sizeof(k), prefix, i);
    ASSERT_EQ_INT(encache_store_lease_drop(st, k, 7), 0);
  }
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 7, 600000), 0);
  ASSERT_EQ_INT(encache_store_lease_drop(st, key, 7), 0);
  /* A table filled by a process that dies is free again at once. */
  ts_key(prefix, sizeof(prefix), "dead-full-");
  pid_t pid = holder(prefix, -1, 9, &n);
  ASSERT(n >= 64);
  lease_key(key, sizeof(key), prefix, n);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 7, 600000),
                ENCACHE_EUNAVAIL);
  kill_holder(pid);
  ASSERT_EQ_INT(encache_store_lease_take(st, key, 7, 600000), 0);
  encache_store_close(st);
}

TEST(shm_lease_damaged_records_are_free) {
  encache_store *st = shm_private("4MiB");
  encache__shm_layout lay;
  ASSERT_EQ_INT(encache__shm_test_layout(st, &lay), 0);
  char prefix[64], key[128], path[128];
  ts_key(prefix, sizeof(prefix), "damaged-");
  for (int i = 0; i < 20; i++) {
    lease_key(key, sizeof(key), prefix, i);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 1, 600000), 0);
  }
  ASSERT_EQ_INT(encache_store_write(st, prefix, NULL, 0, "abc", 3), 0);
  /* Garbage over the whole lease table. */
  size_t len = (size_t)lay.nleases * lay.lease_size;
  unsigned char *junk = malloc(len);
  ASSERT(junk != NULL);
  uint64_t r = 42;
  for (size_t i = 0; i < len; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    junk[i] = (unsigned char)(r >> 56);
  }
  snprintf(path, sizeof(path), "/dev/shm/encache-encache-test-%d",
           (int)getpid());
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(pwrite(fd, junk, len, (off_t)lay.leases_off), (ssize_t)len);
  close(fd);
  free(junk);
  /* Every lease is free; the objects are untouched. */
  for (int i = 0; i < 20; i++) {
    lease_key(key, sizeof(key), prefix, i);
    ASSERT_EQ_INT(encache_store_lease_drop(st, key, 1), ENCACHE_ENOENT);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 2, 600000), 0);
    ASSERT_EQ_INT(encache_store_lease_take(st, key, 3, 600000),
                  ENCACHE_EEXIST);
  }
  uint64_t size = 0;
  ASSERT_EQ_INT(encache_store_object_size(st, prefix, &size), 0);
  ASSERT_EQ_U64(size, 3);
  encache_store_close(st);
}
