/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm Store's URL, format and creation: URL errors, a foreign or
 * corrupt header refused, an overlong key, concurrent opens of a large
 * new segment, create=no.
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
