/* SPDX-License-Identifier: Apache-2.0 */
/*
 * open.c: opening an shm Store (its URL: the segment name and the
 * options), opening one on a file descriptor (tests, the fuzzer), and
 * destroying a segment.
 */
#include "shm.h"
#include "../backends.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SHM_DEFAULT_SIZE (1ull << 30)
#define SHM_MIN_SIZE (1ull << 20)
#define SHM_MAX_SIZE (1ull << 46)

/* ---------------------------------------------------------------- opening */

int encache__shm_open_fd(int fd, const char *label, uint64_t create_size,
                         encache_store **out) {
  shm_store *s;
  if (out == NULL)
    return ENCACHE_EINVAL;
  *out = NULL;
  int rc = encache__shm_alloc(label, out, &s);
  if (rc < 0)
    return rc;
  s->lock_timeout_ms = 1000;
  snprintf(s->name, sizeof(s->name), "%s", label);
  if ((s->fd = dup(fd)) < 0)
    return encache_store_fail(&s->base, -errno, "dup: %s", strerror(errno));
  return encache__shm_attach(
      s, create_size < SHM_MIN_SIZE ? SHM_MIN_SIZE : create_size);
}

static int name_ok(const char *name, size_t len) {
  if (len == 0 || len > SHM_MAX_NAME)
    return 0;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
      return 0;
  }
  return name[0] != '.';
}

/* One option of the URL's query (k=v) into the handle, *size or *create. */
static int parse_option(shm_store *s, const char *k, const char *v,
                        uint64_t *size, int *create) {
  const char *url = s->base.url;
  if (strcmp(k, "create") == 0) {
    if (strcmp(v, "yes") != 0 && strcmp(v, "no") != 0)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: create=%s: must be yes or no", url, v);
    *create = strcmp(v, "yes") == 0;
  } else if (strcmp(k, "size") == 0) {
    if (encache_parse_size(v, size) < 0 || *size < SHM_MIN_SIZE ||
        *size > SHM_MAX_SIZE)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: size=%s: must be a size from 1MiB to "
                                "64TiB (e.g. 4GiB, 512MB)", url, v);
  } else if (strcmp(k, "lock_timeout_ms") == 0) {
    char *end;
    unsigned long ms = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || ms == 0 || ms > 3600000)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: lock_timeout_ms=%s: must be 1 to "
                                "3600000", url, v);
    s->lock_timeout_ms = (unsigned)ms;
  } else if (strcmp(k, "checksum") == 0) {
    if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: checksum=%s: must be on or off", url, v);
    s->checksum = strcmp(v, "on") == 0;
  } else if (strcmp(k, "group") == 0) {
    return encache__shm_parse_group(s, v);
  } else if (strcmp(k, "mode") == 0) {
    return encache__shm_parse_mode(s, v);
  } else {
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: unknown option '%s' (known: size, "
                              "lock_timeout_ms, checksum, create, group, "
                              "mode)", url, k);
  }
  return 0;
}

/* The URL's query (NULL: none) into the handle's options, *size and
 * *create. */
static int parse_query(shm_store *s, const char *query, uint64_t *size,
                       int *create) {
  encache__query qs = {query};
  char k[64], v[64];
  int rc;
  while ((rc = encache__query_next(&qs, k, sizeof(k), v, sizeof(v))) > 0)
    if ((rc = parse_option(s, k, v, size, create)) < 0)
      return rc;
  if (rc < 0)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: malformed query (use ?key=value&...)",
                              s->base.url);
  return encache__shm_check_options(s);
}

/* Opens the segment's file at path (shm_open), making it when create is
 * set: with O_EXCL first, so that s->created says whether this open made
 * it.  Never through a symbolic link, never blocking (a FIFO at the
 * name); the file is then checked before anything in it is used
 * (owner.c).  The descriptor, or -1 with errno set. */
static int open_file(shm_store *s, const char *path, int create) {
  int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  for (int tries = 0; tries < 8; tries++) {
    if (create) {
      int fd = shm_open(path, flags | O_CREAT | O_EXCL, 0600);
      s->created = fd >= 0;
      if (fd >= 0 || errno != EEXIST)
        return fd;
    }
    int fd = shm_open(path, flags, 0600);
    if (fd >= 0 || errno != ENOENT || !create)
      return fd;
    /* Removed between the two opens: make it again. */
  }
  errno = EAGAIN;
  return -1;
}

int encache__shm_open(const char *url, encache_store **out) {
  shm_store *s;
  *out = NULL;
  int rc = encache__shm_alloc(url, out, &s);
  if (rc < 0)
    return rc;
  const char *name = url + 6, *q = strchr(name, '?');
  size_t nlen = q ? (size_t)(q - name) : strlen(name);
  if (!name_ok(name, nlen))
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: the segment name must be 1 to %d of "
                              "A-Z a-z 0-9 . _ - (not starting with '.')",
                              url, SHM_MAX_NAME);
  uint64_t size = SHM_DEFAULT_SIZE;
  int create = 1;
  if ((rc = parse_query(s, q ? q + 1 : NULL, &size, &create)) < 0)
    return rc;
  char path[SHM_MAX_NAME + 16];
  snprintf(path, sizeof(path), "/encache-%.*s", (int)nlen, name);
  snprintf(s->name, sizeof(s->name), "%.*s", (int)nlen, name);
  char file[sizeof(path) + 16]; /* where Linux keeps it, for messages */
  snprintf(file, sizeof(file), "/dev/shm%s", path);
  s->fd = open_file(s, path, create);
  if (s->fd < 0 && errno == ENOENT && !create)
    return encache_store_fail(&s->base, ENCACHE_ENOENT,
                              "%s: no such segment \"%s\" (create=no opens "
                              "only an existing one)", url, s->name);
  if (s->fd < 0 && errno == ELOOP)
    return encache_store_fail(&s->base, -ELOOP,
                              "%s: %s is a symbolic link: refused "
                              "(someone else made it: remove it and open "
                              "again)", url, file);
  if (s->fd < 0 && errno == EACCES) /* who owns it, and the way out */
    return encache__shm_refuse_unopened(s, file);
  if (s->fd < 0)
    return encache_store_fail(&s->base, -errno, "%s: shm_open %s: %s", url,
                              path, strerror(errno));
  if ((rc = encache__shm_check_owner(s, file)) < 0)
    return rc;
  /* create_size 0: attach to a finished segment, never make one. */
  return encache__shm_attach(s, create ? size : 0);
}

int encache_shm_destroy(const char *name) {
  if (name == NULL || !name_ok(name, strlen(name)))
    return ENCACHE_EURL;
  char path[SHM_MAX_NAME + 16];
  snprintf(path, sizeof(path), "/encache-%s", name);
  if (shm_unlink(path) != 0)
    return errno == ENOENT ? ENCACHE_ENOENT : -errno;
  return 0;
}
