/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Weight-following namespaces: encache_model_identity() on real model
 * directories written by the tests (files, subdirectories, symbolic
 * links), in a fresh temporary directory per test.
 */
#include "runner.h"

#include "encache.h"

#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* Pins the format (identity_vector): computed apart from the library with
 * Debian's xxhsum, the manifest laid out by hand:
 *   printf 'encache-weights-v1\n'; then for model.safetensors ("encache")
 *   and sub/b.bin (empty): the path's length (u64 LE), the path, the size
 *   (u64 LE), the 16 bytes `xxhsum -H2 FILE` prints in hex;
 *   xxhsum -H2 of the whole is the digest. */
#define IDENTITY_VECTOR "vec@weights:xxh128:bfa441cc331e95cbc8f5ebafe5b521dc"

static char scratch[256];

/* A fresh scratch directory for this test (its process). */
static void scratch_init(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(scratch, sizeof(scratch), "%s/encache-identity-XXXXXX",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  ASSERT(mkdtemp(scratch) != NULL);
}

static int rm_one(const char *path, const struct stat *st, int flag,
                  struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void scratch_free(void) {
  ASSERT_EQ_INT(nftw(scratch, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* scratch/rel, into path. */
static const char *at(char *path, size_t size, const char *rel) {
  snprintf(path, size, "%s/%s", scratch, rel);
  return path;
}

static void mkdir_at(const char *rel) {
  char p[512];
  ASSERT_EQ_INT(mkdir(at(p, sizeof(p), rel), 0755), 0);
}

/* Writes n bytes of a pattern seeded by seed to scratch/rel. */
static void write_at(const char *rel, size_t n, unsigned seed) {
  char p[512];
  FILE *f = fopen(at(p, sizeof(p), rel), "wb");
  ASSERT(f != NULL);
  for (size_t i = 0; i < n; i++)
    fputc((int)((i * 2654435761u + seed) >> 13) & 0xff, f);
  ASSERT_EQ_INT(fclose(f), 0);
}

/* Flips the bits of byte `off` of scratch/rel (same size). */
static void flip_at(const char *rel, long off) {
  char p[512];
  FILE *f = fopen(at(p, sizeof(p), rel), "r+b");
  ASSERT(f != NULL);
  ASSERT_EQ_INT(fseek(f, off, SEEK_SET), 0);
  int v = fgetc(f);
  ASSERT(v != EOF);
  ASSERT_EQ_INT(fseek(f, off, SEEK_SET), 0);
  fputc(v ^ 0xff, f);
  ASSERT_EQ_INT(fclose(f), 0);
}

/* The identity of scratch/rel with label (NULL = default), which must
 * succeed. */
static void ident(const char *rel, const char *label, char *out,
                  encache_identity_info *info) {
  char p[512];
  int rc = encache_model_identity(at(p, sizeof(p), rel), label, out,
                                  ENCACHE_MODEL_IDENTITY_MAX, info);
  if (rc < 0)
    test__fail(__FILE__, __LINE__, "identity of %s: %s (%s)", p,
               encache_strerror(rc), encache_errmsg(NULL));
  ASSERT_EQ_INT(rc, strlen(out));
}

/* Asserts that the identity of scratch/m, label "m", is base (same) or
 * is not. */
static void expect_m(const char *base, int same, int line) {
  char now[ENCACHE_MODEL_IDENTITY_MAX];
  ident("m", "m", now, NULL);
  if ((strcmp(base, now) == 0) != same)
    test__fail(__FILE__, line, "identity %s, expected %s %s", now,
               same ? "" : "other than", base);
}
#define SAME(base) expect_m(base, 1, __LINE__)
#define CHANGED(base) expect_m(base, 0, __LINE__)

/* A model: two shards, a vision tower in a subdirectory, a config. */
static void model_at(const char *dir, int reverse) {
  char p[256];
  mkdir_at(dir);
  snprintf(p, sizeof(p), "%s/visual", dir);
  mkdir_at(p);
  const char *names[] = {"model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors",
                         "visual/tower.bin", "extra.pt", "head.pth"};
  for (int k = 0; k < 5; k++) {
    int i = reverse ? 4 - k : k;
    snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
    write_at(p, 1000 + 4096 * (size_t)i, (unsigned)i);
  }
  snprintf(p, sizeof(p), "%s/config.json", dir);
  write_at(p, 100, 9);
}

/* A fresh scratch directory holding the model "m", and its identity
 * (label "m") in base. */
static void scratch_with_model(char *base) {
  scratch_init();
  model_at("m", 0);
  ident("m", "m", base, NULL);
}

TEST(identity_stable_across_runs_and_creation_order) {
  scratch_init();
  model_at("a", 0);
  model_at("b", 1); /* the same files, created in the opposite order */
  char a1[ENCACHE_MODEL_IDENTITY_MAX], a2[sizeof(a1)], b[sizeof(a1)];
  encache_identity_info info = ENCACHE_IDENTITY_INFO_INIT;
  ident("a", "m", a1, &info);
  ident("a", "m", a2, NULL);
  ident("b", "m", b, NULL);
  ASSERT_EQ_STR(a1, a2);
  ASSERT_EQ_STR(a1, b);
  ASSERT_EQ_U64(info.files, 5);
  ASSERT_EQ_U64(info.bytes, 5 * 1000 + 4096 * (0 + 1 + 2 + 3 + 4));
  /* The format: LABEL@weights:xxh128: and 32 lower-case hex digits. */
  ASSERT_EQ_INT(strlen(a1), strlen("m@weights:xxh128:") + 32);
  ASSERT(strncmp(a1, "m@weights:xxh128:", 17) == 0);
  for (const char *c = a1 + 17; *c; c++)
    ASSERT((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'));
  scratch_free();
}

/* Every change of the weights changes the identity; undoing it restores
 * the identity. */
TEST(identity_follows_every_change_of_the_weights) {
  char base[ENCACHE_MODEL_IDENTITY_MAX], now[sizeof(base)], p[512], q[512];
  scratch_with_model(base);
  ident("m", "other", now, NULL); /* the label is a part, the digest not */
  ASSERT_EQ_STR(strchr(now, '@'), strchr(base, '@'));
  ASSERT(strncmp(now, "other@", 6) == 0);
  flip_at("m/visual/tower.bin", 1500); /* one byte */
  CHANGED(base);
  write_at("m/visual/tower.bin", 1000 + 4096 * 2, 2); /* restored */
  SAME(base);
  ASSERT_EQ_INT(rename(at(p, sizeof(p), "m/extra.pt"),
                       at(q, sizeof(q), "m/extra2.pt")), 0);
  CHANGED(base);
  ASSERT_EQ_INT(rename(q, p), 0);
  SAME(base);
  write_at("m/visual/adapter.safetensors", 10, 7); /* added */
  CHANGED(base);
  ASSERT_EQ_INT(remove(at(p, sizeof(p), "m/visual/adapter.safetensors")), 0);
  SAME(base);
  ASSERT_EQ_INT(truncate(at(p, sizeof(p), "m/head.pth"), 1000), 0);
  CHANGED(base);
  ASSERT_EQ_INT(truncate(p, 0), 0); /* an empty weight file still counts */
  CHANGED(base);
  ASSERT_EQ_INT(remove(p), 0); /* removed */
  CHANGED(base);
  scratch_free();
}

TEST(identity_ignores_other_files_and_follows_links_to_weights) {
  char base[ENCACHE_MODEL_IDENTITY_MAX], now[sizeof(base)], p[512], q[512];
  scratch_with_model(base);
  write_at("m/config.json", 200, 3); /* changed */
  write_at("m/model.safetensors.index.json", 300, 4);
  write_at("m/tokenizer.model", 300, 5);
  write_at("m/.model-00001-of-00002.safetensors.tmp.bin", 50, 6);
  write_at("m/weights.safetensors.partial", 50, 6);
  mkdir_at("m/.cache");
  write_at("m/.cache/old.safetensors", 50, 6);
  mkdir_at("m/empty");
  /* A link to a directory of weights is not followed. */
  model_at("elsewhere", 0);
  ASSERT_EQ_INT(symlink(at(p, sizeof(p), "elsewhere"),
                        at(q, sizeof(q), "m/linked")), 0);
  SAME(base);
  encache_identity_info info = ENCACHE_IDENTITY_INFO_INIT;
  ident("m", "m", now, &info);
  ASSERT_EQ_U64(info.files, 5);
  /* A Hugging Face snapshot: links to blobs count as the files. */
  mkdir_at("snap");
  mkdir_at("snap/visual");
  const char *names[] = {"model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors",
                         "visual/tower.bin", "extra.pt", "head.pth"};
  for (int i = 0; i < 5; i++) {
    char from[512], to[512];
    snprintf(from, sizeof(from), "%s/m/%s", scratch, names[i]);
    snprintf(to, sizeof(to), "%s/snap/%s", scratch, names[i]);
    ASSERT_EQ_INT(symlink(from, to), 0);
  }
  ident("snap", "m", now, NULL);
  ASSERT_EQ_STR(base, now);
  scratch_free();
}

/* The default label is the directory's real name, made safe. */
TEST(identity_default_label_is_the_directory_name) {
  scratch_init();
  mkdir_at("Qwen2.5-VL 7B+rl");
  write_at("Qwen2.5-VL 7B+rl/w.safetensors", 10, 1);
  char id[ENCACHE_MODEL_IDENTITY_MAX], p[512], q[512];
  ident("Qwen2.5-VL 7B+rl", NULL, id, NULL);
  ASSERT(strncmp(id, "Qwen2.5-VL_7B_rl@weights:xxh128:", 32) == 0);
  ident("Qwen2.5-VL 7B+rl", "", id, NULL);
  ASSERT(strncmp(id, "Qwen2.5-VL_7B_rl@weights:", 25) == 0);
  ident("Qwen2.5-VL 7B+rl/.", NULL, id, NULL); /* the real path's name */
  ASSERT(strncmp(id, "Qwen2.5-VL_7B_rl@", 17) == 0);
  ASSERT_EQ_INT(symlink(at(p, sizeof(p), "Qwen2.5-VL 7B+rl"),
                        at(q, sizeof(q), "current")), 0);
  ident("current", NULL, id, NULL);
  ASSERT(strncmp(id, "Qwen2.5-VL_7B_rl@", 17) == 0);
  ident("current", "org/Qwen2.5-VL", id, NULL);
  ASSERT(strncmp(id, "org/Qwen2.5-VL@weights:xxh128:", 30) == 0);
  scratch_free();
}

/* A vector computed apart from the library (IDENTITY_VECTOR): identities
 * name stored namespaces, so they must never change. */
TEST(identity_vector) {
  scratch_init();
  mkdir_at("v");
  mkdir_at("v/sub");
  char p[512];
  FILE *f = fopen(at(p, sizeof(p), "v/model.safetensors"), "wb");
  ASSERT(f != NULL);
  fputs("encache", f);
  ASSERT_EQ_INT(fclose(f), 0);
  ASSERT((f = fopen(at(p, sizeof(p), "v/sub/b.bin"), "wb")) != NULL);
  ASSERT_EQ_INT(fclose(f), 0);
  char id[ENCACHE_MODEL_IDENTITY_MAX];
  ident("v", "vec", id, NULL);
  ASSERT_EQ_STR(id, IDENTITY_VECTOR);
  scratch_free();
}

TEST(identity_errors_name_the_path) {
  scratch_init();
  char id[ENCACHE_MODEL_IDENTITY_MAX], p[512];
  int rc = encache_model_identity(at(p, sizeof(p), "missing"), "m", id,
                                  sizeof(id), NULL);
  ASSERT_EQ_INT(rc, -ENOENT);
  ASSERT_CONTAINS(encache_errmsg(NULL), p);
  ASSERT_CONTAINS(encache_errmsg(NULL), "No such file or directory");
  mkdir_at("none");
  write_at("none/config.json", 10, 1);
  write_at("none/weights.safetensors.partial", 10, 1);
  rc = encache_model_identity(at(p, sizeof(p), "none"), "m", id, sizeof(id),
                              NULL);
  ASSERT_EQ_INT(rc, ENCACHE_ENOENT);
  ASSERT_CONTAINS(encache_errmsg(NULL), p);
  ASSERT_CONTAINS(encache_errmsg(NULL), "no weight files");
  rc = encache_model_identity(at(p, sizeof(p), "none/config.json"), "m", id,
                              sizeof(id), NULL);
  ASSERT_EQ_INT(rc, -ENOTDIR);
  ASSERT_CONTAINS(encache_errmsg(NULL), p);
  /* A dangling link named like weights: the path, not a silent skip. */
  ASSERT_EQ_INT(symlink("gone.bin", at(p, sizeof(p), "none/w.bin")), 0);
  rc = encache_model_identity(at(p, sizeof(p), "none"), "m", id, sizeof(id),
                              NULL);
  ASSERT_EQ_INT(rc, -ENOENT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "none/w.bin");
  /* A file that reads other than its size said: a file of /proc says 0
   * bytes and gives more, as a weight file being rewritten would. */
  ASSERT_EQ_INT(remove(at(p, sizeof(p), "none/w.bin")), 0);
  ASSERT_EQ_INT(symlink("/proc/self/status", p), 0);
  rc = encache_model_identity(at(p, sizeof(p), "none"), "m", id, sizeof(id),
                              NULL);
  ASSERT_EQ_INT(rc, -EAGAIN);
  ASSERT_CONTAINS(encache_errmsg(NULL), "none/w.bin: changed while it was "
                                        "read");
  scratch_free();
}

TEST(identity_refuses_bad_arguments) {
  scratch_init();
  model_at("m", 0);
  char id[ENCACHE_MODEL_IDENTITY_MAX], p[512];
  at(p, sizeof(p), "m");
  ASSERT_EQ_INT(encache_model_identity(NULL, "m", id, sizeof(id), NULL),
                ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_model_identity("", "m", id, sizeof(id), NULL),
                ENCACHE_EINVAL);
  const char *bad[] = {"a@b", "a:b", "a b", "a*", "caf\xc3\xa9"};
  for (int i = 0; i < 5; i++) {
    ASSERT_EQ_INT(encache_model_identity(p, bad[i], id, sizeof(id), NULL),
                  ENCACHE_EINVAL);
    ASSERT_CONTAINS(encache_errmsg(NULL), "label");
  }
  char long_label[ENCACHE_IDENTITY_LABEL_MAX + 2];
  memset(long_label, 'x', sizeof(long_label) - 1);
  long_label[sizeof(long_label) - 1] = '\0';
  ASSERT_EQ_INT(encache_model_identity(p, long_label, id, sizeof(id), NULL),
                ENCACHE_EINVAL);
  long_label[ENCACHE_IDENTITY_LABEL_MAX] = '\0'; /* the longest accepted */
  ASSERT_EQ_INT(encache_model_identity(p, long_label, id, sizeof(id), NULL),
                ENCACHE_MODEL_IDENTITY_MAX - 1);
  /* Too small a buffer, found before anything is read. */
  ASSERT_EQ_INT(encache_model_identity(p, "m", id, 17 + 32, NULL),
                ENCACHE_ENOBUFS);
  ASSERT_EQ_INT(encache_model_identity(p, "m", NULL, 0, NULL),
                ENCACHE_ENOBUFS);
  ASSERT_EQ_INT(encache_model_identity(p, "m", id, 17 + 33, NULL), 17 + 32);
  encache_identity_info info = {.size = 8};
  ASSERT_EQ_INT(encache_model_identity(p, "m", id, sizeof(id), &info),
                ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(NULL), "info->size");
  scratch_free();
}

TEST(identity_out_of_memory_every_allocation) {
  char want[ENCACHE_MODEL_IDENTITY_MAX], id[sizeof(want)], p[512];
  scratch_with_model(want);
  at(p, sizeof(p), "m");
  for (long n = 1;; n++) {
    test_alloc_fail_after(n);
    int rc = encache_model_identity(p, "m", id, sizeof(id), NULL);
    long made = test_alloc_fail_after(0);
    if (rc >= 0) {
      ASSERT_EQ_STR(id, want);
      ASSERT(made < n); /* every allocation has been made to fail */
      break;
    }
    ASSERT_EQ_INT(rc, ENCACHE_ENOMEM);
    ASSERT_CONTAINS(encache_errmsg(NULL), "out of memory");
  }
  scratch_free();
}
