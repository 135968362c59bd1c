/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store's key-bound check in windows (src/store/redis/wread.c,
 * docs/format.md "Redis objects"), on real servers: every length of
 * object around a window's edges, objects rewritten between two windows
 * of their read (misses, never hits), large windows received in place,
 * the windowed keys of one read in one stream, and a long stream of
 * small windows.  The check on whole values is test_redis_check.c's.
 * Tests say "skipped" and pass when redis-server is not installed.
 */
#include "runner.h"

#include "encache.h"
#include "redis_util.h"
#include "store_util.h"

#include "base.h"

#include <hiredis/hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Windows of 64 bytes around every length of object from 24 to 280
 * bytes: read back whole into a buffer of its exact size and into a
 * larger one (where the first window may end inside the check), and a
 * miss once a payload byte is flipped.
 */
TEST(redis_check_window_edges) {
  redis_server rs;
  if (!redis_server_start(&rs, "?window=64&window_depth=2&window_threshold=0"))
    return;
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(rs.url, &st), 0);
  redis_raw r;
  raw_open(&r, rs.url);
  static unsigned char obj[24 + 256], out[4096];
  for (int64_t cols = 0; cols <= 64; cols++) {
    int64_t shape[2] = {1, cols};
    encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0,
                        NULL};
    ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
    size_t len = 24 + (size_t)cols * 4;
    for (size_t i = 24; i < len; i++)
      obj[i] = (unsigned char)(i * 7 + (size_t)cols);
    char key[32];
    snprintf(key, sizeof(key), "edge-%d", (int)cols);
    ASSERT_EQ_INT(encache_store_write(st, key, obj, 24, obj + 24, len - 24), 0);
    const char *keys[1] = {key};
    void *bufs[1] = {out};
    int64_t res[1];
    for (int big = 0; big < 2; big++) {
      size_t caps[1] = {big ? sizeof(out) : len};
      memset(out, 0, sizeof(out));
      ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
      ASSERT_EQ_INT(res[0], (int64_t)len);
      ASSERT_EQ_MEM(out, obj, len);
    }
    if (len > 24) {
      raw_setrange(&r, key, len - 1, (unsigned char)(obj[len - 1] ^ 1));
      size_t caps[1] = {sizeof(out)};
      ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
      ASSERT_EQ_INT(res[0], ENCACHE_ENOENT);
    }
  }
  raw_close(&r);
  encache_store_close(st);
  redis_server_stop(&rs);
}

/* The Redis Store's test hook, called between the exchanges of a windowed
 * read (src/store/redis/redis.h). */
extern void (*encache__redis_window_hook)(const char *key, uint64_t done);

/* What the torn-read hook writes at its first call: the object of tw_cols
 * float32 columns whose payload starts at tw_seed, through tw_store (with
 * or without its check), in place of the one being read. */
static encache_store *tw_store;
static int64_t tw_cols;
static unsigned tw_seed;
static int tw_calls;

static size_t tw_object(unsigned char *obj, int64_t cols, unsigned seed) {
  int64_t shape[2] = {1, cols};
  encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0,
                      NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  size_t len = 24 + (size_t)cols * 4;
  for (size_t i = 24; i < len; i++)
    obj[i] = (unsigned char)((i >= 256 ? seed * 131u : 0) + i * 7u + (i >> 9));
  return len;
}

static const char *tw_key; /* the key the hook rewrites (NULL: any) */

static void tw_hook(const char *key, uint64_t done) {
  static unsigned char obj[24 + (80u << 10)];
  if (done == 0 || (tw_key != NULL && strcmp(key, tw_key) != 0) ||
      tw_calls++ != 0)
    return; /* once, after the first window */
  size_t len = tw_object(obj, tw_cols, tw_seed);
  encache_store_remove(tw_store, key);
  ASSERT_EQ_INT(encache_store_write(tw_store, key, obj, 24, obj + 24, len - 24),
                0);
}

/*
 * Torn reads (issue 30): an object rewritten between two windows of its
 * read, by objects with and without the check (an upgrade: old writers
 * beside new ones, checksum=on and off), of the same length and header
 * with another payload (past its first 256 bytes), of the other format,
 * or of another shape with the same length, is a miss, never a hit;
 * undisturbed, the object then there is read whole.  Windows of 4 KiB, 2 per exchange, objects of
 * 64 KiB.
 */
TEST(redis_check_objects_rewritten_between_windows_are_misses) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char url[3][200];
  static const char *const modes[3] = {"on", "off", "required"};
  encache_store *st[3] = {NULL, NULL, NULL};
  for (int m = 0; m < 3; m++) {
    snprintf(url[m], sizeof(url[m]),
             "redis://127.0.0.1:%d?checksum=%s&window=4096&window_depth=2&"
             "window_threshold=0", rs.port, modes[m]);
    ASSERT_EQ_INT(encache_store_open(url[m], &st[m]), 0);
  }
  /* {writer, rewriter} (0: with the check, 1: without), and the columns
   * of the rewrite: the same shape, or one whose value has the same
   * length in the other format (4 columns, 16 bytes: the check). */
  static const int cases[][3] = {{0, 0, 0},  {0, 1, 0}, {0, 1, 4},
                                 {1, 0, 0},  {1, 0, -4}, {1, 1, 0}};
  static unsigned char a[24 + (80u << 10)], out[80u << 10];
  const int64_t cols = (64 << 10) / 4;
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
    for (int reader = 0; reader < 2; reader++) {
      size_t len = tw_object(a, cols, 1);
      encache_store_remove(st[0], "tw");
      ASSERT_EQ_INT(encache_store_write(st[cases[c][0]], "tw", a, 24, a + 24,
                                        len - 24), 0);
      tw_store = st[cases[c][1]];
      tw_cols = cols + cases[c][2];
      tw_seed = 2;
      tw_calls = 0;
      encache__redis_window_hook = tw_hook;
      int64_t got = ts_read_one(st[reader], "tw", out, sizeof(out));
      encache__redis_window_hook = NULL;
      printf("# case %zu, reader checksum=%s: %lld (%s)\n", c, modes[reader],
             (long long)got, encache_store_errmsg(st[reader]));
      ASSERT_EQ_INT(tw_calls >= 1, 1);
      ASSERT_EQ_INT(got, ENCACHE_ENOENT);
      /* Undisturbed, the object now there is read whole. */
      size_t blen = tw_object(a, tw_cols, 2);
      ASSERT_EQ_INT(ts_read_one(st[reader], "tw", out, sizeof(out)),
                    (int64_t)blen);
    }
  for (int m = 0; m < 3; m++)
    encache_store_close(st[m]);
  redis_server_stop(&rs);
}


/*
 * Objects of 6 MiB + 4 bytes in the default windows (1 MiB, 8 per
 * exchange), with and without the check: most of each window is received
 * by recv() straight into place, in pieces of any length (io.c,
 * recv_direct); read back whole, and a miss once a byte of the fourth
 * window is flipped (with the check; without it, the flip is read as it
 * is).
 */
TEST(redis_check_large_windows_received_in_place) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  const int64_t cols = (6 << 20) / 4 + 1;
  size_t len = 24 + (size_t)cols * 4;
  unsigned char *a = malloc(len), *out = malloc(len + 4096);
  ASSERT(a != NULL && out != NULL);
  for (int mode = 0; mode < 2; mode++) {
    char url[200];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d?checksum=%s&"
             "window_threshold=0", rs.port, mode ? "off" : "on");
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(url, &st), 0);
    redis_raw r;
    raw_open(&r, url);
    int64_t shape[2] = {1, cols};
    encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0,
                        NULL};
    ASSERT_EQ_INT(encache_header_encode(&t, a), 0);
    for (size_t i = 24; i < len; i++)
      a[i] = (unsigned char)(i * 13 + (i >> 11) + (size_t)mode);
    ASSERT_EQ_INT(encache_store_write(st, "big", a, 24, a + 24, len - 24), 0);
    const char *keys[1] = {"big"};
    void *bufs[1] = {out};
    size_t caps[1] = {len + 4096};
    int64_t res[1];
    for (int it = 0; it < 3; it++) {
      memset(out, 0, len);
      ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
      ASSERT_EQ_INT(res[0], (int64_t)len);
      ASSERT_EQ_INT(memcmp(out, a, len), 0);
    }
    size_t flip = (3u << 20) + 12345;
    raw_setrange(&r, "big", flip, (unsigned char)(a[flip] ^ 4));
    ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
    ASSERT_EQ_INT(res[0], mode ? (int64_t)len : ENCACHE_ENOENT);
    raw_del(&r, "big");
    raw_close(&r);
    encache_store_close(st);
  }
  free(a);
  free(out);
  redis_server_stop(&rs);
}

/*
 * The windowed keys of one read go as one stream (wread.c, issue 30):
 * windows of 4 KiB, 2 in flight, nine keys of every kind in one
 * encache_store_read(): checked objects of one window, two and sixteen;
 * a missing key; an object without a check (the older guard, after the
 * stream); an empty value; an object larger than its buffer; one with a
 * byte flipped; and one rewritten while its windows are in flight (the
 * hook, called as its second window is asked).  Each key gets its own
 * answer, every hit its own bytes, and the rewritten key, then read
 * undisturbed, is the object now there.
 */
TEST(redis_check_windowed_keys_of_one_read_in_one_stream) {
  redis_server rs;
  if (!redis_server_start(&rs, "?window=4096&window_depth=2&"
                               "window_threshold=0"))
    return;
  char offurl[300];
  snprintf(offurl, sizeof(offurl), "%s&checksum=off", rs.url);
  encache_store *st = NULL, *off = NULL;
  ASSERT_EQ_INT(encache_store_open(rs.url, &st), 0);
  ASSERT_EQ_INT(encache_store_open(offurl, &off), 0);
  redis_raw r;
  raw_open(&r, rs.url);
  enum { NK = 9 };
  static const char *const keys[NK] = {"s0", "s1", "s2", "s3", "s4",
                                       "s5", "s6", "s7", "s8"};
  /* columns (0: none written), the writer (1: without the check) */
  static const int64_t cols[NK] = {16384, 0, 10240, 0, 16384,
                                   1536,  700, 16384, 16384};
  static const int plain[NK] = {0, 0, 1, 0, 0, 0, 0, 0, 0};
  static unsigned char obj[NK][24 + (64u << 10)], out[NK][24 + (64u << 10)];
  size_t len[NK];
  for (int k = 0; k < NK; k++) {
    len[k] = cols[k] ? tw_object(obj[k], cols[k], 10u + (unsigned)k) : 0;
    if (cols[k])
      ASSERT_EQ_INT(encache_store_write(plain[k] ? off : st, keys[k], obj[k],
                                        24, obj[k] + 24, len[k] - 24), 0);
  }
  raw_set(&r, "s3", "", 0);
  raw_setrange(&r, "s7", 30000, (unsigned char)(obj[7][30000] ^ 1));
  void *bufs[NK];
  size_t caps[NK];
  int64_t res[NK];
  for (int k = 0; k < NK; k++) {
    bufs[k] = out[k];
    caps[k] = k == 4 ? 32u << 10 : sizeof(out[k]);
  }
  tw_store = st;
  tw_cols = cols[8];
  tw_seed = 99;
  tw_calls = 0;
  tw_key = "s8";
  encache__redis_window_hook = tw_hook;
  memset(out, 0, sizeof(out));
  ASSERT_EQ_INT(encache_store_read(st, keys, NK, bufs, caps, res), 0);
  encache__redis_window_hook = NULL;
  tw_key = NULL;
  ASSERT(tw_calls >= 1); /* its own rewrite, windowed, calls it too */
  static const int64_t miss = ENCACHE_ENOENT;
  const int64_t want[NK] = {(int64_t)len[0], miss, (int64_t)len[2], 0,
                            ENCACHE_ETOOLARGE, (int64_t)len[5],
                            (int64_t)len[6], miss, miss};
  for (int k = 0; k < NK; k++) {
    printf("# %s: %lld\n", keys[k], (long long)res[k]);
    ASSERT_EQ_INT(res[k], want[k]);
    if (want[k] > 0)
      ASSERT_EQ_MEM(out[k], obj[k], len[k]);
  }
  /* Undisturbed, the object now at s8 is read whole. */
  size_t l8 = tw_object(obj[8], cols[8], 99);
  ASSERT_EQ_INT(encache_store_read(st, keys, NK, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[8], (int64_t)l8);
  ASSERT_EQ_MEM(out[8], obj[8], l8);
  ASSERT_EQ_INT(res[0], (int64_t)len[0]);
  /* With checksum=required the empty value, which has no check, and the
   * object without one are misses; the checked ones are still hits. */
  char requrl[300];
  snprintf(requrl, sizeof(requrl), "%s&checksum=required", rs.url);
  encache_store *req = NULL;
  ASSERT_EQ_INT(encache_store_open(requrl, &req), 0);
  ASSERT_EQ_INT(encache_store_read(req, keys, NK, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[3], ENCACHE_ENOENT);
  ASSERT_EQ_INT(res[2], ENCACHE_ENOENT);
  ASSERT_EQ_INT(res[0], (int64_t)len[0]);
  ASSERT_EQ_INT(res[5], (int64_t)len[5]);
  encache_store_close(req);
  raw_close(&r);
  encache_store_close(st);
  encache_store_close(off);
  redis_server_stop(&rs);
}

/*
 * A long stream: three checked objects of 96 KiB in windows of 64 bytes,
 * 16 in flight, read in one call (4611 replies: the stream's arrays are
 * shifted down as replies are taken, wread.c's scompact), each object's
 * header to a buffer of its own as the engine reads; every byte read
 * back, and a miss once one byte of the middle object is flipped.
 */
TEST(redis_check_long_stream_of_small_windows) {
  redis_server rs;
  if (!redis_server_start(&rs, "?window=64&window_depth=16&"
                               "window_threshold=0"))
    return;
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(rs.url, &st), 0);
  enum { NK = 3, LCOLS = 24576 }; /* 96 KiB of float32 */
  static const char *const keys[NK] = {"l0", "l1", "l2"};
  static unsigned char obj[NK][24 + LCOLS * 4], body[NK][LCOLS * 4],
      head[NK][24];
  size_t len = 0;
  for (int k = 0; k < NK; k++) {
    len = tw_object(obj[k], LCOLS, 20u + (unsigned)k);
    ASSERT_EQ_INT(encache_store_write(st, keys[k], obj[k], 24, obj[k] + 24,
                                      len - 24), 0);
  }
  void *heads[NK] = {head[0], head[1], head[2]};
  void *bufs[NK] = {body[0], body[1], body[2]};
  size_t caps[NK] = {LCOLS * 4, LCOLS * 4, LCOLS * 4};
  int64_t res[NK];
  for (int flip = 0; flip < 2; flip++) {
    if (flip) {
      redis_raw r;
      raw_open(&r, rs.url);
      raw_setrange(&r, "l1", 50000, (unsigned char)(obj[1][50000] ^ 1));
      raw_close(&r);
    }
    memset(body, 0, sizeof(body));
    ASSERT_EQ_INT(st->ops->read_split(st, keys, NK, 24, heads, bufs, caps,
                                      res), 0);
    for (int k = 0; k < NK; k++) {
      if (flip && k == 1) {
        ASSERT_EQ_INT(res[k], ENCACHE_ENOENT);
        continue;
      }
      ASSERT_EQ_INT(res[k], (int64_t)len);
      ASSERT_EQ_MEM(head[k], obj[k], 24);
      ASSERT_EQ_MEM(body[k], obj[k] + 24, len - 24);
    }
  }
  encache_store_close(st);
  redis_server_stop(&rs);
}
