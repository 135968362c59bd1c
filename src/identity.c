/* SPDX-License-Identifier: Apache-2.0 */
/*
 * identity.c: encache_model_identity(), the identity string of a model's
 * weights (the header says what counts and what the string looks like).
 *
 * Three phases.  The walk collects the weight files under the model
 * directory (relative path and size) into a growing array, bounded by
 * IDENTITY_MAX_FILES and IDENTITY_MAX_DEPTH.  The array is sorted by
 * relative path, bytewise, so that the digest does not depend on the
 * order in which a directory lists its entries.  Then each file's content
 * is hashed on its own (XXH3-128, streamed through one buffer), and its
 * path, size and content digest go into the manifest's hash.  Hashing each
 * file on its own keeps the door open to hashing files in parallel without
 * changing any identity.
 *
 * Identities name the namespaces users' objects live under: the manifest's
 * layout (MANIFEST_TAG first) never changes without a new tag in the
 * string ("xxh128" names this one).
 *
 * Every file is opened relative to the model directory's descriptor, so
 * that a rename of the directory during the call cannot mix two trees.  No
 * global state: the only shared thing is the calling thread's message.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define IDENTITY_MAX_DEPTH 32
#define IDENTITY_MAX_FILES 100000
/* Reads of 128 KiB into a page-aligned buffer: one that stays in the L2
 * cache and that the kernel's copy can write aligned (docs/performance.md,
 * "Figures behind the engine's constants"). */
#define IDENTITY_CHUNK ((size_t)128 << 10)
#define IDENTITY_TAG "@weights:xxh128:"
#define MANIFEST_TAG "encache-weights-v1\n"
/* The smallest encache_identity_info accepted: its size when it came (a
 * field added later goes at the end, and this stays). */
#define IDENTITY_INFO_MIN sizeof(encache_identity_info)

/* One weight file: its path relative to the model directory. */
typedef struct wfile {
  char *rel;
  uint64_t size;
} wfile;

/* What the walk has found; files[0..n) are owned by it. */
typedef struct walk {
  const char *root; /* model_dir as the caller gave it, for messages */
  int rootfd;
  wfile *files;
  size_t n, cap;
  uint64_t bytes;
} walk;

/* Records why rel (relative to the model directory, "" for itself)
 * failed with errno e; returns -e. */
static int path_failed(const walk *w, const char *rel, int e) {
  return encache__thread_failed(-e, "%s%s%s: %s", w->root, rel[0] ? "/" : "",
                                rel, strerror(e));
}

static int is_weight_name(const char *name) {
  static const char *const suffixes[] = {".safetensors", ".bin", ".pt",
                                         ".pth"};
  size_t len = strlen(name);
  for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
    size_t s = strlen(suffixes[i]);
    if (len > s && memcmp(name + len - s, suffixes[i], s) == 0)
      return 1;
  }
  return 0;
}

static int add_file(walk *w, const char *rel, uint64_t size) {
  if (w->n == IDENTITY_MAX_FILES)
    return encache__thread_failed(ENCACHE_ETOOLARGE,
                                  "%s: more than %d weight files", w->root,
                                  IDENTITY_MAX_FILES);
  if (w->n == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 64;
    wfile *f = encache__realloc(w->files, cap * sizeof(*f));
    if (f == NULL)
      return encache__thread_failed(ENCACHE_ENOMEM, "%s: out of memory",
                                    w->root);
    w->files = f;
    w->cap = cap;
  }
  char *copy = encache__strdup(rel);
  if (copy == NULL)
    return encache__thread_failed(ENCACHE_ENOMEM, "%s: out of memory",
                                  w->root);
  w->files[w->n].rel = copy;
  w->files[w->n++].size = size;
  w->bytes += size;
  return 0;
}

static int walk_dir(walk *w, const char *rel, int depth);

/* One entry `name` of the directory rel ("" = the model directory). */
static int walk_entry(walk *w, const char *rel, const char *name, int depth) {
  char path[PATH_MAX];
  int len = snprintf(path, sizeof(path), "%s%s%s", rel, rel[0] ? "/" : "",
                     name);
  if (len < 0 || (size_t)len >= sizeof(path))
    return encache__thread_failed(-ENAMETOOLONG, "%s/%s%s...: path too long",
                                  w->root, rel, rel[0] ? "/" : "");
  struct stat st;
  if (fstatat(w->rootfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return path_failed(w, path, errno);
  if (S_ISDIR(st.st_mode))
    return walk_dir(w, path, depth + 1);
  if (!is_weight_name(name))
    return 0;
  /* A link to a weight file counts as the file (a Hugging Face cache
   * snapshot is made of them); one to anything else is left out. */
  if (S_ISLNK(st.st_mode) && fstatat(w->rootfd, path, &st, 0) != 0)
    return path_failed(w, path, errno);
  return S_ISREG(st.st_mode) ? add_file(w, path, (uint64_t)st.st_size) : 0;
}

/* Adds the weight files of the directory rel and below. */
static int walk_dir(walk *w, const char *rel, int depth) {
  if (depth > IDENTITY_MAX_DEPTH)
    return encache__thread_failed(-ELOOP, "%s/%s: deeper than %d directories",
                                  w->root, rel, IDENTITY_MAX_DEPTH);
  int fd = openat(w->rootfd, rel[0] ? rel : ".",
                  O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd < 0 ? NULL : fdopendir(fd);
  if (d == NULL) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return path_failed(w, rel, e);
  }
  int rc = 0;
  struct dirent *ent;
  errno = 0;
  while (rc == 0 && (ent = readdir(d)) != NULL) {
    if (ent->d_name[0] != '.') /* ., .., hidden files and directories */
      rc = walk_entry(w, rel, ent->d_name, depth);
    errno = 0;
  }
  if (rc == 0 && errno != 0)
    rc = path_failed(w, rel, errno);
  closedir(d);
  return rc;
}

static int by_path(const void *a, const void *b) {
  return strcmp(((const wfile *)a)->rel, ((const wfile *)b)->rel);
}

/* Whether the file behind fd is still what `before` described. */
static int unchanged(int fd, const struct stat *before) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_size == before->st_size &&
         st.st_mtim.tv_sec == before->st_mtim.tv_sec &&
         st.st_mtim.tv_nsec == before->st_mtim.tv_nsec;
}

/* The XXH3-128 digest of f's content (canonical, big-endian bytes) into
 * out, read through buf[0..IDENTITY_CHUNK). */
static int hash_file(const walk *w, const wfile *f, unsigned char *buf,
                     XXH3_state_t *st, XXH128_canonical_t *out) {
  int fd = openat(w->rootfd, f->rel, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return path_failed(w, f->rel, errno);
  struct stat before;
  int rc = fstat(fd, &before) == 0 ? 0 : -errno;
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_128bits_reset(st);
  uint64_t total = 0;
  while (rc == 0) {
    ssize_t got = read(fd, buf, IDENTITY_CHUNK);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      rc = got < 0 ? -errno : 0;
      break;
    }
    XXH3_128bits_update(st, buf, (size_t)got);
    total += (uint64_t)got;
  }
  if (rc < 0)
    rc = path_failed(w, f->rel, -rc);
  else if (total != f->size || (uint64_t)before.st_size != f->size ||
           !unchanged(fd, &before))
    rc = encache__thread_failed(-EAGAIN, "%s/%s: changed while it was read; "
                                "compute the identity once the writer has "
                                "finished", w->root, f->rel);
  close(fd);
  if (rc == 0)
    XXH128_canonicalFromHash(out, XXH3_128bits_digest(st));
  return rc;
}

/* The manifest's digest of the sorted files of w, as 32 hex digits. */
static int hash_files(const walk *w, char hex[33]) {
  unsigned char *buf = encache__aligned_alloc(4096, IDENTITY_CHUNK);
  XXH3_state_t *file = XXH3_createState(), *all = XXH3_createState();
  int rc = 0;
  if (buf == NULL || file == NULL || all == NULL)
    rc = encache__thread_failed(ENCACHE_ENOMEM, "%s: out of memory", w->root);
  else
    XXH3_128bits_reset(all);
  if (rc == 0)
    XXH3_128bits_update(all, MANIFEST_TAG, strlen(MANIFEST_TAG));
  for (size_t i = 0; rc == 0 && i < w->n; i++) {
    XXH128_canonical_t digest;
    unsigned char le[16];
    size_t len = strlen(w->files[i].rel);
    encache__put_le64(le, (uint64_t)len);
    encache__put_le64(le + 8, w->files[i].size);
    rc = hash_file(w, &w->files[i], buf, file, &digest);
    if (rc == 0) {
      XXH3_128bits_update(all, le, 8);
      XXH3_128bits_update(all, w->files[i].rel, len);
      XXH3_128bits_update(all, le + 8, 8);
      XXH3_128bits_update(all, digest.digest, sizeof(digest.digest));
    }
  }
  if (rc == 0) {
    XXH128_canonical_t d;
    XXH128_canonicalFromHash(&d, XXH3_128bits_digest(all));
    for (int i = 0; i < 16; i++)
      snprintf(hex + 2 * i, 3, "%02x", d.digest[i]);
  }
  XXH3_freeState(file);
  XXH3_freeState(all);
  encache__aligned_free(buf);
  return rc;
}

static int label_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
         c == '/';
}

/* The label into out[0..ENCACHE_IDENTITY_LABEL_MAX]: the caller's,
 * checked, or the directory's name made safe. */
static int make_label(const char *dir, const char *label, char *out) {
  if (label != NULL && label[0] != '\0') {
    size_t len = strlen(label);
    if (len > ENCACHE_IDENTITY_LABEL_MAX)
      return encache__thread_failed(ENCACHE_EINVAL,
                                    "label \"%.40s...\": longer than %d bytes",
                                    label, ENCACHE_IDENTITY_LABEL_MAX);
    for (size_t i = 0; i < len; i++)
      if (!label_char_ok(label[i]))
        return encache__thread_failed(
            ENCACHE_EINVAL, "label \"%s\": character '%c' (at %zu) is not "
            "a letter, digit, '.', '_', '-' or '/'", label, label[i], i);
    memcpy(out, label, len + 1);
    return 0;
  }
  char *real = realpath(dir, NULL);
  if (real == NULL) {
    int e = errno;
    return encache__thread_failed(-e, "%s: %s", dir, strerror(e));
  }
  const char *base = strrchr(real, '/');
  base = base != NULL ? base + 1 : real;
  size_t n = 0;
  for (; base[n] != '\0' && n < ENCACHE_IDENTITY_LABEL_MAX; n++)
    out[n] = label_char_ok(base[n]) ? base[n] : '_'; /* no '/' in a name */
  out[n] = '\0';
  free(real); /* realpath() allocates with the C library's malloc */
  if (n == 0)
    strcpy(out, "model");
  return 0;
}

/* Checks the arguments and builds the label; the first failure wins. */
static int identity_args(const char *dir, const char *label, size_t size,
                         encache_identity_info *info, char *lab) {
  if (dir == NULL || dir[0] == '\0')
    return encache__thread_failed(ENCACHE_EINVAL, "encache_model_identity: "
                                  "the model directory is NULL or empty");
  if (info != NULL &&
      !encache__struct_size_ok(info->size, IDENTITY_INFO_MIN))
    return encache__thread_failed(ENCACHE_EINVAL, "encache_model_identity: "
                                  "info->size %zu: not an "
                                  "encache_identity_info (sizeof %zu)",
                                  info->size, sizeof(encache_identity_info));
  int rc = make_label(dir, label, lab);
  if (rc == 0 && size < strlen(lab) + strlen(IDENTITY_TAG) + 33)
    rc = encache__thread_failed(ENCACHE_ENOBUFS, "encache_model_identity: "
                                "a buffer of %zu bytes is too small (%zu "
                                "needed)", size,
                                strlen(lab) + strlen(IDENTITY_TAG) + 33);
  return rc;
}

int encache_model_identity(const char *model_dir, const char *label,
                           char *buf, size_t size,
                           encache_identity_info *info) {
  char lab[ENCACHE_IDENTITY_LABEL_MAX + 1], hex[33];
  int rc = identity_args(model_dir, label, buf == NULL ? 0 : size, info, lab);
  if (rc < 0)
    return rc;
  walk w = {.root = model_dir, .rootfd = -1};
  w.rootfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (w.rootfd < 0)
    return path_failed(&w, "", errno);
  rc = walk_dir(&w, "", 0);
  if (rc == 0 && w.n == 0)
    rc = encache__thread_failed(ENCACHE_ENOENT,
                                "%s: no weight files (*.safetensors, *.bin, "
                                "*.pt, *.pth) in it or below", model_dir);
  if (rc == 0) {
    qsort(w.files, w.n, sizeof(*w.files), by_path);
    rc = hash_files(&w, hex);
  }
  if (rc == 0 && info != NULL) {
    encache_identity_info full = {sizeof(full), w.n, w.bytes};
    encache__struct_out(info, &full, sizeof(full), IDENTITY_INFO_MIN);
  }
  if (rc == 0)
    rc = snprintf(buf, size, "%s" IDENTITY_TAG "%s", lab, hex);
  for (size_t i = 0; i < w.n; i++)
    encache__free(w.files[i].rel);
  encache__free(w.files);
  close(w.rootfd);
  return rc;
}
