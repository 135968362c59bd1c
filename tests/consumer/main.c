/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c: a program of a project that uses an installed encache
 * (tests/install.sh builds it with find_package(encache) against both
 * targets, and with pkg-config).  It checks the loaded library's version
 * against the header's, makes a protocol:v3 key, and writes and reads back
 * an object in a private shared-memory Store, which it then destroys.
 *
 *   consumer SEGMENT_NAME
 */
#include <encache.h>

#include <stdio.h>
#include <string.h>

static int fail(const char *what, int rc, const encache_store *st) {
  const char *why = encache_store_errmsg(st);
  fprintf(stderr, "consumer: %s: %s\n", what,
          why != NULL && why[0] ? why : encache_strerror(rc));
  return 1;
}

/* Writes an object under key and checks that it reads back as written. */
static int round_trip(encache_store *st, const char *key) {
  static const char payload[] = "encoder output";
  int rc = encache_store_write(st, key, NULL, 0, payload, sizeof(payload));
  if (rc != 0)
    return fail("write", rc, st);
  char buf[64] = {0};
  void *bufs[1] = {buf};
  size_t caps[1] = {sizeof(buf)};
  int64_t got[1] = {0};
  const char *keys[1] = {key};
  rc = encache_store_read(st, keys, 1, bufs, caps, got);
  if (rc != 0)
    return fail("read", rc, st);
  if (got[0] != (int64_t)sizeof(payload) ||
      memcmp(buf, payload, sizeof(payload)) != 0) {
    fprintf(stderr, "consumer: read back %lld bytes, not the %zu written\n",
            (long long)got[0], sizeof(payload));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer SEGMENT_NAME\n");
    return 2;
  }
  if (strcmp(encache_version(), ENCACHE_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: header %s, library %s\n",
            ENCACHE_VERSION_STRING, encache_version());
    return 1;
  }
  encache_namespace_params p = {sizeof(p), "consumer", "my/vlm", NULL, NULL,
                                ENCACHE_FLOAT32};
  char ns[256], key[300], url[128];
  int rc = encache_namespace(&p, ns, sizeof(ns));
  if (rc < 0 || (rc = encache_key(ns, "image-1", key, sizeof(key))) < 0)
    return fail("key", rc, NULL);
  snprintf(url, sizeof(url), "shm://%s?size=4MiB", argv[1]);
  encache_store *st = NULL;
  if ((rc = encache_store_open(url, &st)) != 0)
    return fail("open", rc, NULL);
  int bad = round_trip(st, key);
  encache_store_close(st);
  if ((rc = encache_shm_destroy(argv[1])) != 0)
    return fail("destroy", rc, NULL);
  if (!bad)
    printf("consumer: encache %s, %s written and read back\n",
           encache_version(), key);
  return bad;
}
