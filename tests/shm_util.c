/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm_util.c: what the shm Store tests (tests/test_shm_*.c) share: a fresh
 * private segment, objects written and checked whole, open errors, bytes
 * poked into a segment, and a writer stalled by the Store's test hook.
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

/* A fresh private segment "NAME-<pid>" of the given size; destroyed at
 * exit by the process that made it. */
char seg_name[64];
static pid_t seg_owner;
static void seg_destroy(void) {
  if (getpid() == seg_owner)
    encache_shm_destroy(seg_name);
}
encache_store *seg_open(const char *size, char *url, size_t ulen) {
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

encache_store *reopen(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url, encache_store_errmsg(st));
  return st;
}

/* key reads back whole and byte for byte as written. */
void assert_hit(encache_store *st, const char *key, size_t len) {
  unsigned char *buf = malloc(len ? len : 1);
  int64_t r = ts_read_one(st, key, buf, len);
  int ok = r == (int64_t)len && ts_verify(key, buf, len);
  free(buf);
  if (!ok)
    test__fail(__FILE__, __LINE__, "%s: %lld bytes, not a hit of %zu", key,
               (long long)r, len);
}

void put(encache_store *st, const char *key, size_t len, uint64_t version) {
  unsigned char *buf = malloc(len ? len : 1);
  ts_fill(key, version, buf, len);
  int rc = encache_store_write(st, key, NULL, 0, buf, len);
  free(buf);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "write %s: %s: %s", key,
               encache_err_name(rc), encache_store_errmsg(st));
}

int open_err(const char *url, char *msg, size_t size) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  snprintf(msg, size, "%s", encache_store_errmsg(st));
  encache_store_close(st);
  return rc;
}

/* Overwrites `len` bytes at `off` of the segment file. */
void poke(const char *name, off_t off, const void *bytes, size_t len) {
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", name);
  int fd = open(path, O_RDWR);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(pwrite(fd, bytes, len, off), (ssize_t)len);
  close(fd);
}

/* The Store's test hook for a write: tells hook_fd, then waits to be
 * killed mid-write. */
int hook_fd = -1;
void stall_writer(void) {
  char c = 'w';
  if (write(hook_fd, &c, 1) != 1)
    _exit(3);
  pause(); /* the parent kills us here, mid-write */
}
