/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm Store's repairs and damage: a dead lock holder, a killed
 * writer, corrupted indexes and counters, the ring's head moved back,
 * payload bit flips, a damaged lock, a zeroed magic, damage while it
 * repairs.
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
