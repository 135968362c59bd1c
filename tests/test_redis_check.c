/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store's key-bound check (issue 26, finding 10;
 * src/store/redis/check.c, docs/format.md "Redis objects") on real
 * servers: a byte flipped anywhere in a stored object (header, payload,
 * check) is never a hit, in one GET and in windows; an object copied
 * under another key (COPY, DUMP + RESTORE, GET + SET) is not a hit; an
 * object written without the check, as an older encache wrote it, is still
 * served (and refused with checksum=required); a tier never promotes a
 * damaged remote object; the check's bytes are those of the page's
 * vector.  The last test runs the same on the Store tests/on_redis.sh
 * names (TCP, a Unix socket, a Redis Cluster, windows forced).  Tests say
 * "skipped" and pass when redis-server is not installed.
 */
#include "runner.h"

#include "encache.h"
#include "redis_util.h"
#include "store_util.h"
#include "tier.h"

#include <hiredis/hiredis.h>

#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>

#define ROWS 4
/* float32 columns: 300 (a 4800-byte payload, received whole by the
 * hiredis reader) unless a test sets more (a value longer than the reader's
 * first read: received in place, io.c's recv_direct). */
static int64_t check_cols = 300;
#define COLS check_cols
#define MAX_COLS 65536
#define NBYTES ((size_t)ROWS * (size_t)COLS * 4)
#define MAX_NBYTES ((size_t)ROWS * MAX_COLS * 4)
#define NFLIPS 200
/* Windows of 1 KiB, two per exchange, for every value. */
#define WIN_1K "?window=1KiB&window_depth=2&window_threshold=0"
/* R1's digest (docs/format.md): mix64(sum(O1) ^ XXH3-64(K2)), in
 * little-endian order. */
#define CHECK_VECTOR_DIGEST 0xe6, 0xd6, 0xd4, 0x5b, 0xe3, 0x19, 0x93, 0xce

/* ------------------------------------------------------ raw server access */

/* A raw connection to the Store at url (redis://H:P, unix://PATH, or the
 * first seed of redis-cluster://H:P,...), following MOVED by hand. */
typedef struct raw {
  char url[512];
  redisContext *c;
} raw;

static redisContext *raw_dial(const char *url) {
  char host[256] = "";
  int port = 0;
  if (strncmp(url, "unix://", 7) == 0) {
    char path[256];
    sscanf(url + 7, "%255[^?]", path);
    return redisConnectUnix(path);
  }
  const char *hp = strstr(url, "://");
  hp = hp ? hp + 3 : url;
  const char *at = strchr(hp, '@');
  if (at != NULL && (strchr(hp, '?') == NULL || at < strchr(hp, '?')))
    hp = at + 1;
  sscanf(hp, "%255[^:]:%d", host, &port);
  return redisConnect(host, port);
}

static void raw_open(raw *r, const char *url) {
  snprintf(r->url, sizeof(r->url), "%s", url);
  r->c = raw_dial(url);
  ASSERT(r->c != NULL && !r->c->err);
}

static void raw_close(raw *r) { redisFree(r->c); }

/* A command about one key (its arguments as argv); MOVED followed. */
static redisReply *raw_cmd(raw *r, int argc, const char **argv,
                           const size_t *lens) {
  for (int round = 0; round < 3; round++) {
    redisReply *rep = redisCommandArgv(r->c, argc, argv, lens);
    ASSERT(rep != NULL);
    if (rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "MOVED ", 6) != 0)
      return rep;
    char where[300];
    snprintf(where, sizeof(where), "redis://%s", strchr(rep->str + 6, ' ') + 1);
    freeReplyObject(rep);
    redisFree(r->c);
    r->c = raw_dial(where);
    ASSERT(r->c != NULL && !r->c->err);
  }
  test__fail(__FILE__, __LINE__, "still redirected");
}

static void raw_set(raw *r, const char *key, const void *v, size_t n) {
  const char *argv[3] = {"SET", key, v};
  size_t lens[3] = {3, strlen(key), n};
  redisReply *rep = raw_cmd(r, 3, argv, lens);
  ASSERT_EQ_INT(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
}

/* The value at key into a fresh buffer (*n bytes); NULL when none. */
static unsigned char *raw_get(raw *r, const char *key, size_t *n) {
  const char *argv[2] = {"GET", key};
  size_t lens[2] = {3, strlen(key)};
  redisReply *rep = raw_cmd(r, 2, argv, lens);
  unsigned char *out = NULL;
  if (rep->type == REDIS_REPLY_STRING) {
    out = malloc(rep->len + 1);
    memcpy(out, rep->str, rep->len);
    *n = rep->len;
  }
  freeReplyObject(rep);
  return out;
}

static void raw_setrange(raw *r, const char *key, size_t off, unsigned char b) {
  char at[32];
  snprintf(at, sizeof(at), "%zu", off);
  const char *argv[4] = {"SETRANGE", key, at, (const char *)&b};
  size_t lens[4] = {8, strlen(key), strlen(at), 1};
  freeReplyObject(raw_cmd(r, 4, argv, lens));
}

static void raw_del(raw *r, const char *key) {
  const char *argv[2] = {"DEL", key};
  size_t lens[2] = {3, strlen(key)};
  freeReplyObject(raw_cmd(r, 2, argv, lens));
}

/* ------------------------------------------------------------ the engine */

static encache *open_engine(const char *url) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config =
      "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true}}";
  o.model = "redis/check";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  if (encache_open(&o, &ec) != 0)
    test__fail(__FILE__, __LINE__, "open %s: %s", url, encache_errmsg(NULL));
  return ec;
}

/* The payload of id: floats derived from its name. */
static void payload_of(const char *id, float *f) {
  for (size_t i = 0; i < NBYTES / 4; i++)
    f[i] = (float)(i * 3 + strlen(id)) * 0.25f;
}

/* The v3 object of id (24 + NBYTES bytes) into obj. */
static void object_of(const char *id, unsigned char *obj) {
  int64_t shape[2] = {ROWS, COLS};
  encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0,
                      NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  payload_of(id, (float *)(obj + 24));
}

/* Looks id up (ROWS x COLS float32); returns the outcome.  A hit's bytes
 * are returned in *hit (free it), else *hit is NULL. */
static int look_one(encache *ec, const char *id, float **hit) {
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_candidate c = {sizeof(c), id, ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, ROWS, COLS, ENCACHE_DEVICE_HOST, 0};
  encache_allocator a = ts_host_allocator();
  encache_result r;
  r.size = sizeof(r);
  ASSERT(encache_lookup(step, &c, 1, &a, &r) >= 0);
  *hit = r.outcome == ENCACHE_HIT ? r.data : NULL;
  encache_step_close(step);
  return r.outcome;
}

/* Whether id's lookup is a hit with id's own payload (0: not a hit). */
static int hit_is_right(encache *ec, const char *id) {
  static float want[MAX_NBYTES / 4];
  float *got;
  if (look_one(ec, id, &got) != ENCACHE_HIT)
    return 0;
  payload_of(id, want);
  int same = memcmp(got, want, NBYTES) == 0;
  free(got);
  return same ? 1 : -1;
}

static void key_of(encache *ec, const char *id, char *key, size_t size) {
  ASSERT(encache_key(encache_namespace_of(ec), id, key, size) > 0);
}

/* Writes id's object through the Store at url (with the check). */
static void store_put(const char *url, const char *key, const char *id) {
  static unsigned char obj[24 + MAX_NBYTES];
  object_of(id, obj);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  encache_store_remove(st, key);
  ASSERT_EQ_INT(encache_store_write(st, key, obj, 24, obj + 24, NBYTES), 0);
  encache_store_close(st);
}

/* ------------------------------------------------------------ the tests */

/*
 * Flips one bit of each of `flips` positions of id's stored object, in
 * turn (all 24 header bytes, the last 16 bytes, the rest spread over the
 * payload), looks it up after each, and puts the byte back.  Returns how
 * many damaged objects were served as hits.
 */
static int flip_campaign(const char *url, const char *id, int flips) {
  encache *ec = open_engine(url);
  char key[512];
  key_of(ec, id, key, sizeof(key));
  store_put(url, key, id);
  ASSERT_EQ_INT(hit_is_right(ec, id), 1); /* undamaged: a hit */
  raw r;
  raw_open(&r, url);
  size_t len = 0;
  unsigned char *orig = raw_get(&r, key, &len);
  ASSERT(orig != NULL && len >= 24 + NBYTES);
  int served = 0;
  for (int i = 0; i < flips; i++) {
    size_t mid = (size_t)(flips - 40);
    size_t pos = i < 24            ? (size_t)i
                 : i >= flips - 16 ? len - (size_t)(flips - i)
                                   : 24 + (size_t)(i - 24) * (len - 40) / mid;
    raw_setrange(&r, key, pos, (unsigned char)(orig[pos] ^ (1u << (i % 8))));
    int right = hit_is_right(ec, id);
    ASSERT(right != 1); /* the damaged object's payload differs, or ... */
    served += right != 0;
    raw_setrange(&r, key, pos, orig[pos]);
  }
  ASSERT_EQ_INT(hit_is_right(ec, id), 1); /* repaired: a hit again */
  free(orig);
  raw_close(&r);
  ASSERT_EQ_INT(encache_close(ec), 0);
  printf("# %s: %d of %d flipped objects served\n", url, served, flips);
  return served;
}

TEST(redis_check_flipped_bytes_are_never_hits) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char url[256];
  int served = flip_campaign(rs.url, "flip-get", NFLIPS);
  /* The same in windows of 1 KiB, two per exchange. */
  served += flip_campaign(redis_server_url(&rs, WIN_1K, url, sizeof(url)),
                          "flip-win", NFLIPS);
  ASSERT_EQ_INT(served, 0);
  redis_server_stop(&rs);
}

/* id's object copied to id2's key by each of three means; never a hit. */
static int copies_served(const char *url, int with_copy) {
  encache *ec = open_engine(url);
  char key[512], key2[512];
  key_of(ec, "copy-src", key, sizeof(key));
  key_of(ec, "copy-dst", key2, sizeof(key2));
  store_put(url, key, "copy-src");
  ASSERT_EQ_INT(hit_is_right(ec, "copy-src"), 1);
  raw r;
  raw_open(&r, url);
  int served = 0;
  for (int how = with_copy ? 0 : 2; how < 3; how++) {
    raw_del(&r, key2);
    redisReply *rep = NULL;
    if (how == 0) { /* COPY */
      const char *argv[3] = {"COPY", key, key2};
      rep = raw_cmd(&r, 3, argv, NULL);
    } else if (how == 1) { /* DUMP + RESTORE */
      const char *argv[2] = {"DUMP", key};
      redisReply *d = raw_cmd(&r, 2, argv, NULL);
      ASSERT_EQ_INT(d->type, REDIS_REPLY_STRING);
      const char *rv[4] = {"RESTORE", key2, "0", d->str};
      size_t rl[4] = {7, strlen(key2), 1, d->len};
      rep = raw_cmd(&r, 4, rv, rl);
      freeReplyObject(d);
    } else { /* GET + SET */
      size_t n;
      unsigned char *v = raw_get(&r, key, &n);
      raw_set(&r, key2, v, n);
      free(v);
    }
    ASSERT(rep == NULL || rep->type != REDIS_REPLY_ERROR);
    freeReplyObject(rep);
    float *got;
    int out = look_one(ec, "copy-dst", &got);
    served += out == ENCACHE_HIT;
    free(got);
  }
  raw_close(&r);
  ASSERT_EQ_INT(encache_close(ec), 0);
  return served;
}

TEST(redis_check_object_copied_under_another_key_is_not_a_hit) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char url[256];
  ASSERT_EQ_INT(copies_served(rs.url, 1), 0);
  redis_server_url(&rs, WIN_1K, url, sizeof(url));
  ASSERT_EQ_INT(copies_served(url, 1), 0);
  redis_server_stop(&rs);
}

/* SETs id's object raw under its key, as an older encache wrote it (no
 * check). */
static void old_object_put(encache *ec, const char *url, const char *id) {
  char key[512];
  key_of(ec, id, key, sizeof(key));
  static unsigned char obj[24 + MAX_NBYTES];
  object_of(id, obj);
  raw r;
  raw_open(&r, url);
  raw_set(&r, key, obj, 24 + NBYTES);
  raw_close(&r);
}

/* An object SET raw, as an older encache wrote it (no check): served by url;
 * returns whether it was a hit with its payload.  A hit is counted in the
 * handle's hits_unchecked (issue 41). */
static int old_object_served(const char *url, const char *id) {
  encache *ec = open_engine(url);
  old_object_put(ec, url, id);
  int right = hit_is_right(ec, id);
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_U64(st.hits_unchecked, right != 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
  return right;
}

TEST(redis_check_objects_written_without_it_are_still_served) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char url[256];
  ASSERT_EQ_INT(old_object_served(rs.url, "old-get"), 1);
  redis_server_url(&rs, WIN_1K, url, sizeof(url));
  ASSERT_EQ_INT(old_object_served(url, "old-win"), 1);
  /* checksum=off writes them so (older readers read them), and a reader
   * with checksum=required serves none of them, but serves checked ones. */
  redis_server_url(&rs, "?checksum=off", url, sizeof(url));
  encache *ec = open_engine(url);
  char key[512];
  key_of(ec, "off", key, sizeof(key));
  ASSERT_EQ_INT(encache_close(ec), 0);
  store_put(url, key, "off");
  raw r;
  raw_open(&r, url);
  size_t n = 0;
  free(raw_get(&r, key, &n));
  raw_close(&r);
  ASSERT_EQ_INT(n, 24 + NBYTES);
  ASSERT_EQ_INT(old_object_served(url, "old-off"), 1);
  redis_server_url(&rs, "?checksum=required", url, sizeof(url));
  ASSERT_EQ_INT(old_object_served(url, "old-req"), 0);
  ec = open_engine(url);
  key_of(ec, "req", key, sizeof(key));
  store_put(url, key, "req");
  ASSERT_EQ_INT(hit_is_right(ec, "req"), 1);
  ASSERT_EQ_INT(encache_close(ec), 0);
  redis_server_stop(&rs);
}

/* The same three, for values of 64 KiB and 1 MiB read by one GET each (below
 * window_threshold): longer than the reader's first read, they are received
 * straight into their destinations (io.c, recv_direct) and checked there. */
TEST(redis_check_values_received_in_place_are_checked) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  static const int64_t sizes[] = {4096, MAX_COLS};
  int served = 0;
  for (int k = 0; k < 2; k++) {
    check_cols = sizes[k];
    served += flip_campaign(rs.url, k ? "flip-1m" : "flip-64k", 64);
    served += copies_served(rs.url, 1);
    ASSERT_EQ_INT(old_object_served(rs.url, k ? "old-1m" : "old-64k"), 1);
  }
  check_cols = 300;
  ASSERT_EQ_INT(served, 0);
  redis_server_stop(&rs);
}

/*
 * docs/format.md's vector R1: O1 (the float32 [[1, 2], [3, 4]]) written
 * under K2's key is the 40 bytes of O1 then these 16.
 */
TEST(redis_check_vector) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  static const unsigned char o1[40] = {
      0x4e, 0x4f, 0x4f, 0x4d, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
      2,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40,
      0,    0,    0x40, 0x40, 0, 0, 0x80, 0x40};
  static const unsigned char r1[16] = {
      0x45, 0x43, 0x4b, 0x31, 0, 0, 0, 0, /* "ECK1", reserved */
      CHECK_VECTOR_DIGEST};
  const char *key = "embedding@model:shared/model@revision:default@encoder:"
                    "encoder:default@dtype:torch.float32@protocol:v3"
                    "@id:image@1";
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(rs.url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, key, o1, 24, o1 + 24, 16), 0);
  raw r;
  raw_open(&r, rs.url);
  size_t n = 0;
  unsigned char *v = raw_get(&r, key, &n);
  ASSERT_EQ_INT(n, 56);
  ASSERT_EQ_MEM(v, o1, 40);
  ASSERT_EQ_MEM(v + 40, r1, 16);
  /* Read back through the Store: the v3 object, 40 bytes. */
  unsigned char out[64];
  const char *keys[1] = {key};
  void *bufs[1] = {out};
  size_t caps[1] = {40};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[0], 40);
  ASSERT_EQ_MEM(out, o1, 40);
  uint64_t len = 0;
  ASSERT_EQ_INT(encache_store_object_size(st, key, &len), 0);
  ASSERT_EQ_U64(len, 40);
  free(v);
  raw_close(&r);
  encache_store_close(st);
  redis_server_stop(&rs);
}

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
  raw r;
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

/* Reads key through st into a buffer of its size; returns the answer. */
static int64_t read_key(encache_store *st, const char *key, size_t cap) {
  static unsigned char buf[1u << 20];
  const char *keys[1] = {key};
  void *bufs[1] = {buf};
  size_t caps[1] = {cap};
  int64_t res[1];
  int rc = encache_store_read(st, keys, 1, bufs, caps, res);
  return rc < 0 ? rc : res[0];
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
 * with another payload (past its first 256 bytes), of the other format, or of another shape with
 * the same length, is a miss, never a hit; undisturbed, the object then
 * there is read whole.  Windows of 4 KiB, 2 per exchange, objects of
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
      int64_t got = read_key(st[reader], "tw", sizeof(out));
      encache__redis_window_hook = NULL;
      printf("# case %zu, reader checksum=%s: %lld (%s)\n", c, modes[reader],
             (long long)got, encache_store_errmsg(st[reader]));
      ASSERT_EQ_INT(tw_calls >= 1, 1);
      ASSERT_EQ_INT(got, ENCACHE_ENOENT);
      /* Undisturbed, the object now there is read whole. */
      size_t blen = tw_object(a, tw_cols, 2);
      ASSERT_EQ_INT(read_key(st[reader], "tw", sizeof(out)), (int64_t)blen);
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
    raw r;
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
  raw r;
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
      raw r;
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

/*
 * A tier in front of Redis: a damaged remote object (one payload byte
 * flipped), small (copied into the promotion queue) or large (read again
 * by the promotion thread), is not read and not promoted; an undamaged
 * one beside it is promoted.
 */
TEST(redis_check_tier_never_promotes_a_damaged_object) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char rurl[160], turl[300], lurl[200], shm[64];
  redis_server_url(&rs, NULL, rurl, sizeof(rurl));
  snprintf(shm, sizeof(shm), "check-tier-%d", (int)getpid());
  snprintf(turl, sizeof(turl), "tier:shm://%s?size=16MiB+%s", shm, rurl);
  snprintf(lurl, sizeof(lurl), "shm://%s?create=no", shm);
  static const size_t sizes[2] = {4096, 512u << 10};
  encache_store *remote = NULL;
  ASSERT_EQ_INT(encache_store_open(rurl, &remote), 0);
  static unsigned char obj[24 + (512u << 10)];
  raw r;
  raw_open(&r, rurl);
  for (int s = 0; s < 2; s++) {
    int64_t shape[2] = {1, (int64_t)sizes[s] / 4};
    encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0,
                        NULL};
    ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
    memset(obj + 24, 7, sizes[s]);
    char good[64], bad[64];
    snprintf(good, sizeof(good), "tier-good-%d", s);
    snprintf(bad, sizeof(bad), "tier-bad-%d", s);
    ASSERT_EQ_INT(encache_store_write(remote, good, obj, 24, obj + 24,
                                      sizes[s]), 0);
    ASSERT_EQ_INT(encache_store_write(remote, bad, obj, 24, obj + 24,
                                      sizes[s]), 0);
    raw_setrange(&r, bad, 24 + sizes[s] / 2, 8);
    encache_store *tier = NULL;
    ASSERT_EQ_INT(encache_store_open(turl, &tier), 0);
    ASSERT_EQ_INT(read_key(tier, good, 24 + sizes[s]), 24 + sizes[s]);
    ASSERT(read_key(tier, bad, 24 + sizes[s]) < 0);
    /* Close writes only the copies still queued (small objects); a large
     * one is read again by the promotion thread, which close does not
     * wait for: wait for the queue first. */
    encache__tier_drain(tier);
    encache_store_close(tier);
    encache_store *local = NULL;
    ASSERT_EQ_INT(encache_store_open(lurl, &local), 0);
    ASSERT_EQ_INT(read_key(local, good, 24 + sizes[s]), 24 + sizes[s]);
    ASSERT_EQ_INT(read_key(local, bad, 24 + sizes[s]), ENCACHE_ENOENT);
    encache_store_close(local);
  }
  raw_close(&r);
  encache_store_close(remote);
  encache_shm_destroy(shm);
  redis_server_stop(&rs);
}

/* The flips, copies and old objects on the Store tests/on_redis.sh names
 * ($ENCACHE_TEST_STORE: TCP, a Unix socket, the cluster; windows forced). */
TEST(redis_check_on_the_url_under_test) {
  const char *url = getenv("ENCACHE_TEST_STORE");
  if (url == NULL || (strncmp(url, "redis://", 8) != 0 &&
                      strncmp(url, "unix://", 7) != 0 &&
                      strncmp(url, "redis-cluster://", 16) != 0)) {
    printf("# skipped: ENCACHE_TEST_STORE is not a Redis URL\n");
    return;
  }
  char id[64];
  snprintf(id, sizeof(id), "flip-%d", (int)getpid());
  ASSERT_EQ_INT(flip_campaign(url, id, 60), 0);
  /* COPY and RESTORE would cross slots in a cluster: GET + SET there. */
  ASSERT_EQ_INT(copies_served(url, strncmp(url, "redis-cluster:", 14) != 0), 0);
  snprintf(id, sizeof(id), "old-%d", (int)getpid());
  ASSERT_EQ_INT(old_object_served(url, id), 1);
}

/* The registry's entry of this process, copied (see_own). */
typedef struct own_entry {
  int found;
  encache_stats stats;
} own_entry;

static int see_own(const encache_fleet_entry *e, void *ctx) {
  own_entry *o = ctx;
  if (e->pid == (int64_t)getpid()) {
    o->found++;
    o->stats = *e->stats;
  }
  return 0;
}

/* The output of the built tool (beside this program) run with args, into
 * out; 0, or -1 when there is no tool beside it. */
static int run_tool(const char *args, char *out, size_t size) {
  char exe[512], cmd[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0)
    return -1;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  ASSERT(slash != NULL);
  snprintf(slash + 1, sizeof(exe) - (size_t)(slash + 1 - exe), "encache");
  if (access(exe, X_OK) != 0)
    return -1;
  snprintf(cmd, sizeof(cmd), "'%s' %s 2>&1", exe, args);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  size_t got = fread(out, 1, size - 1, p);
  out[got] = '\0';
  pclose(p);
  return 0;
}

/*
 * issue 41: under checksum=on (the default) an object without a check is
 * served, as documented: a hit whose bytes nothing vouched for.  The
 * handle counts them (hits_unchecked, whole values and windows), the
 * statistics registry carries the count and `encache stats` shows it; an
 * object with its check counts as a hit only; checksum=required serves
 * none of them and counts none.
 */
TEST(redis_check_hits_without_it_are_counted_and_shown) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char url[200], reg[64], key[512];
  snprintf(reg, sizeof(reg), "encache.rcheck-%d", (int)getpid());
  char path[128];
  snprintf(path, sizeof(path), "/%s", reg);
  shm_unlink(path);
  redis_server_url(&rs, NULL, url, sizeof(url));
  char json[512];
  snprintf(json, sizeof(json),
           "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
           "\"stats_segment\": \"%s\", \"encoder_name\": \"rcheck\"}}", reg);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "redis/check";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), 0);
  key_of(ec, "with-check", key, sizeof(key));
  store_put(url, key, "with-check");
  ASSERT_EQ_INT(hit_is_right(ec, "with-check"), 1);
  old_object_put(ec, url, "bare");
  ASSERT_EQ_INT(hit_is_right(ec, "bare"), 1);
  ASSERT_EQ_INT(hit_is_right(ec, "bare"), 1);
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_U64(st.hits, 3);
  ASSERT_EQ_U64(st.hits_unchecked, 2);
  /* What `encache stats` reads: the registry... */
  own_entry own = {0, ENCACHE_STATS_INIT};
  ASSERT(encache_fleet_read(reg, see_own, &own) >= 1);
  ASSERT_EQ_INT(own.found, 1);
  ASSERT_EQ_U64(own.stats.hits_unchecked, 2);
  /* ... and what it prints of it. */
  static char out[1 << 16];
  char args[512];
  snprintf(args, sizeof(args), "--store '%s' stats --segment %s --format json",
           url, reg);
  if (run_tool(args, out, sizeof(out)) == 0) {
    ASSERT_CONTAINS(out, "\"encoder\": \"rcheck\"");
    ASSERT_CONTAINS(out, "\"hits\": 3");
    ASSERT_CONTAINS(out, "\"hits_unchecked\": 2");
    snprintf(args, sizeof(args),
             "--store '%s' stats --segment %s --format prometheus", url, reg);
    ASSERT_EQ_INT(run_tool(args, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "# TYPE encache_hits_unchecked_total counter");
    ASSERT_CONTAINS(out, "encache_hits_unchecked_total{encoder=\"rcheck\"");
    snprintf(args, sizeof(args), "--store '%s' stats --segment %s", url, reg);
    ASSERT_EQ_INT(run_tool(args, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "unchecked");
  } else {
    printf("# no encache tool beside this program: its output not checked\n");
  }
  ASSERT_EQ_INT(encache_close(ec), 0);
  /* In windows too; and never under checksum=required. */
  redis_server_url(&rs, WIN_1K, url, sizeof(url));
  ASSERT_EQ_INT(old_object_served(url, "bare-win"), 1);
  redis_server_url(&rs, "?checksum=required", url, sizeof(url));
  ASSERT_EQ_INT(old_object_served(url, "bare-req"), 0);
  shm_unlink(path);
  redis_server_stop(&rs);
}
