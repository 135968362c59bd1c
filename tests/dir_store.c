/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dir_store.c: a Store of a user's own, written against the public header
 * only and registered for the URL scheme testdir://PATH: each object is a
 * file of the directory PATH, so processes share it as they share shm.
 *
 * A file is named after a 128-bit hash of its key and holds the key's
 * length (8 bytes, little-endian), the key, then the object.  A write
 * fills a private temporary file and link()s it to its name: link() fails
 * when the name exists, so writes are atomic put-if-absent and a reader
 * never sees a partial object.  Leases (single flight) are files of their
 * own, under a lock file.  The conformance suite (tests/test_store.c)
 * runs on it: ctest's conformance-dir.
 */
#include "dir_store.h"

#include "encache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct dir_store {
  char path[4096];
} dir_store;

static const char *dir_of(encache_store *st) {
  return ((dir_store *)encache_store_data(st))->path;
}

static uint64_t fnv(const char *s, uint64_t h) {
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static void file_of(encache_store *st, const char *key, char *buf,
                    size_t size) {
  snprintf(buf, size, "%s/o-%016llx%016llx", dir_of(st),
           (unsigned long long)fnv(key, 0xcbf29ce484222325ull),
           (unsigned long long)fnv(key, 0x84222325cbf29ce4ull));
}

static uint64_t get_le64(const void *p) {
  const unsigned char *b = p;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)b[i] << (8 * i);
  return v;
}

/* Opens key's file and checks that it holds key: the fd positioned at the
 * object, whose length goes to *len; -1 with errno ENOENT when absent. */
static int open_object(encache_store *st, const char *key, uint64_t *len) {
  char path[4200];
  file_of(st, key, path, sizeof(path));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  struct stat sb;
  size_t klen = strlen(key);
  char *stored = malloc(klen + 8);
  int ok = stored != NULL && fstat(fd, &sb) == 0 &&
           read(fd, stored, klen + 8) == (ssize_t)(klen + 8) &&
           get_le64(stored) == klen && memcmp(stored + 8, key, klen) == 0;
  free(stored);
  if (!ok) { /* another key with the same hash, or damage: not ours */
    close(fd);
    errno = ENOENT;
    return -1;
  }
  *len = (uint64_t)sb.st_size - 8 - klen;
  return fd;
}

/* The encache code of a failed system call on key. */
static int sys_fail(encache_store *st, const char *what, const char *key) {
  int e = errno;
  if (e == ENOENT)
    return ENCACHE_ENOENT;
  return encache_store_fail(st, ENCACHE_EUNAVAIL, "%s %.80s: %s", what, key,
                            strerror(e));
}

static int d_object_size(encache_store *st, const char *key, uint64_t *len) {
  int fd = open_object(st, key, len);
  if (fd < 0)
    return sys_fail(st, "open", key);
  close(fd);
  return 0;
}

static int d_exists(encache_store *st, const char *const *keys, size_t n,
                    int *results) {
  for (size_t i = 0; i < n; i++) {
    uint64_t len;
    int rc = d_object_size(st, keys[i], &len);
    results[i] = rc == 0 ? 1 : rc == ENCACHE_ENOENT ? 0 : rc;
  }
  return 0;
}

static int64_t read_one(encache_store *st, const char *key, void *buf,
                        size_t cap) {
  uint64_t len;
  int fd = open_object(st, key, &len);
  if (fd < 0)
    return sys_fail(st, "open", key);
  int64_t r = (int64_t)len;
  if (len > cap)
    r = ENCACHE_ETOOLARGE;
  else if (len > 0 && read(fd, buf, len) != (ssize_t)len)
    r = encache_store_fail(st, ENCACHE_EUNAVAIL, "short read of %.80s", key);
  close(fd);
  return r;
}

static int d_read(encache_store *st, const char *const *keys, size_t n,
                  void *const *bufs, const size_t *caps, int64_t *results) {
  for (size_t i = 0; i < n; i++)
    results[i] = read_one(st, keys[i], bufs[i], caps[i]);
  return 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int d_write(encache_store *st, const char *key, const void *hdr,
                   size_t hl, const void *p, size_t n) {
  static atomic_uint seq;
  char path[4200], tmp[4300];
  file_of(st, key, path, sizeof(path));
  snprintf(tmp, sizeof(tmp), "%s/t-%d-%u", dir_of(st), (int)getpid(),
           atomic_fetch_add(&seq, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return sys_fail(st, "create", tmp);
  size_t klen = strlen(key);
  unsigned char kl[8] = {0};
  for (int b = 0; b < 8; b++)
    kl[b] = (unsigned char)((uint64_t)klen >> (8 * b));
  int ok = write_all(fd, kl, 8) == 0 && write_all(fd, key, klen) == 0 &&
           write_all(fd, hdr, hl) == 0 && write_all(fd, p, n) == 0;
  ok = close(fd) == 0 && ok;
  int rc = 0;
  if (!ok)
    rc = sys_fail(st, "write", tmp);
  else if (link(tmp, path) != 0)
    rc = errno == EEXIST ? encache_store_fail(st, ENCACHE_EEXIST,
                                              "%.80s exists", key)
                         : sys_fail(st, "link", key);
  unlink(tmp);
  return rc;
}

static int d_remove(encache_store *st, const char *key) {
  uint64_t len;
  int fd = open_object(st, key, &len);
  if (fd < 0)
    return sys_fail(st, "open", key);
  close(fd);
  char path[4200];
  file_of(st, key, path, sizeof(path));
  return unlink(path) == 0 ? 0 : sys_fail(st, "unlink", key);
}

/* Calls fn(key, object length, arg) for every object file. */
static int each_object(encache_store *st,
                       int (*fn)(const char *key, uint64_t len, void *arg),
                       void *arg) {
  DIR *d = opendir(dir_of(st));
  if (d == NULL)
    return sys_fail(st, "opendir", dir_of(st));
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "o-", 2) != 0)
      continue;
    char path[4400];
    snprintf(path, sizeof(path), "%s/%s", dir_of(st), e->d_name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
      continue; /* removed meanwhile */
    unsigned char kl[8];
    struct stat sb;
    if (fread(kl, 1, 8, f) == 8 && fstat(fileno(f), &sb) == 0) {
      uint64_t klen = get_le64(kl);
      char *key = klen < (uint64_t)sb.st_size ? malloc(klen + 1) : NULL;
      if (key != NULL && fread(key, 1, klen, f) == klen) {
        key[klen] = '\0';
        rc = fn(key, (uint64_t)sb.st_size - 8 - klen, arg);
      }
      free(key);
    }
    fclose(f);
  }
  closedir(d);
  return rc;
}

typedef struct list_arg {
  const char *pattern;
  int (*cb)(const char *key, uint64_t len, void *arg);
  void *arg;
} list_arg;

static int list_one(const char *key, uint64_t len, void *arg) {
  list_arg *a = arg;
  if (a->pattern != NULL && fnmatch(a->pattern, key, 0) != 0)
    return 0;
  return a->cb(key, len, a->arg);
}

static int d_list(encache_store *st, const char *pattern,
                  int (*cb)(const char *key, uint64_t len, void *arg),
                  void *arg) {
  list_arg a = {pattern, cb, arg};
  return each_object(st, list_one, &a);
}

static int count_one(const char *key, uint64_t len, void *arg) {
  encache_store_stats *s = arg;
  s->objects++;
  s->bytes_used += 8 + strlen(key) + len;
  return 0;
}

static int d_stats(encache_store *st, encache_store_stats *s) {
  s->objects = s->bytes_used = 0;
  return each_object(st, count_one, s);
}

/* Leases: a file per key ("l-" + the key's hash) holding the token and
 * the deadline (CLOCK_MONOTONIC ms, one clock for the host's processes),
 * read and written under an exclusive flock of the directory's lock file,
 * so that of two takers one wins. */
static int lease_lock(encache_store *st) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/leases.lock", dir_of(st));
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The lease of key: 1 with its token and deadline, 0 when there is none. */
static int lease_read(const char *path, uint64_t *token, uint64_t *deadline) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  unsigned long long t = 0, d = 0;
  int n = fscanf(f, "%llu %llu", &t, &d);
  fclose(f);
  *token = t;
  *deadline = d;
  return n == 2;
}

static int d_lease_take(encache_store *st, const char *key, uint64_t token,
                        uint32_t ttl_ms) {
  char path[4200];
  file_of(st, key, path, sizeof(path));
  path[strlen(dir_of(st)) + 1] = 'l'; /* "l-" + the key's hash */
  int lk = lease_lock(st);
  if (lk < 0)
    return sys_fail(st, "lock the leases of", key);
  uint64_t t, deadline, now = mono_ms();
  int rc = 0;
  if (lease_read(path, &t, &deadline) && t != token && deadline > now) {
    rc = encache_store_fail(st, ENCACHE_EEXIST, "%.80s: leased", key);
  } else {
    FILE *f = fopen(path, "w");
    if (f == NULL || fprintf(f, "%llu %llu\n", (unsigned long long)token,
                             (unsigned long long)(now + ttl_ms)) < 0)
      rc = sys_fail(st, "write the lease of", key);
    if (f != NULL && fclose(f) != 0 && rc == 0)
      rc = sys_fail(st, "write the lease of", key);
  }
  close(lk);
  return rc;
}

static int d_lease_drop(encache_store *st, const char *key, uint64_t token) {
  char path[4200];
  file_of(st, key, path, sizeof(path));
  path[strlen(dir_of(st)) + 1] = 'l';
  int lk = lease_lock(st);
  if (lk < 0)
    return sys_fail(st, "lock the leases of", key);
  uint64_t t, deadline;
  int rc = encache_store_fail(st, ENCACHE_ENOENT, "%.80s: not leased by this "
                              "token", key);
  if (lease_read(path, &t, &deadline) && t == token) {
    rc = deadline > mono_ms() ? 0 : rc; /* an expired lease is not held */
    unlink(path);
  }
  close(lk);
  return rc;
}

static void d_close(encache_store *st) {
  free(encache_store_data(st));
  encache_store_free(st);
}

static const encache_store_backend dir_backend = {
    .size = sizeof(encache_store_backend),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "testdir",
    .caps = ENCACHE_STORE_CAP_LIST | ENCACHE_STORE_CAP_PUT_IF_ABSENT |
            ENCACHE_STORE_CAP_SHARED | ENCACHE_STORE_CAP_LEASE,
    .exists = d_exists,
    .read = d_read,
    .object_size = d_object_size,
    .write = d_write,
    .remove = d_remove,
    .list = d_list,
    .stats = d_stats,
    .close = d_close,
    .lease_take = d_lease_take,
    .lease_drop = d_lease_drop};

int dir_store_open_as(const encache_store_backend *b, const char *url,
                      encache_store **out) {
  *out = NULL;
  const char *path = url + strlen("testdir://");
  if (strncmp(url, "testdir://", 10) != 0 || path[0] != '/' ||
      strlen(path) >= sizeof(((dir_store *)0)->path))
    return encache_store_fail(NULL, ENCACHE_EURL,
                              "%.200s: expected testdir:///absolute/path", url);
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return encache_store_fail(NULL, -errno, "mkdir %s: %s", path,
                              strerror(errno));
  dir_store *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return encache_store_fail(NULL, ENCACHE_ENOMEM, "out of memory");
  snprintf(d->path, sizeof(d->path), "%s", path);
  int rc = encache_store_new(b, d, url, out);
  if (rc < 0)
    free(d);
  return rc;
}

static int dir_open(const char *url, void *arg, encache_store **out) {
  (void)arg;
  return dir_store_open_as(&dir_backend, url, out);
}

int dir_store_register(void) {
  return encache_store_register("testdir", dir_open, NULL);
}

const encache_store_backend *dir_store_backend(void) { return &dir_backend; }
