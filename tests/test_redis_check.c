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
 * names (TCP, a Unix socket, a Redis Cluster, windows forced).  The check
 * read in windows (torn reads, streams) is test_redis_check_windows.c's;
 * the raw access to the server is redis_util.c's.  Tests say "skipped"
 * and pass when redis-server is not installed.
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
  redis_raw r;
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
  redis_raw r;
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
  redis_raw r;
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
  redis_raw r;
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
  redis_raw r;
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
  static unsigned char obj[24 + (512u << 10)], got[24 + (512u << 10)];
  redis_raw r;
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
    ASSERT_EQ_INT(ts_read_one(tier, good, got, 24 + sizes[s]), 24 + sizes[s]);
    ASSERT(ts_read_one(tier, bad, got, 24 + sizes[s]) < 0);
    /* Close writes only the copies still queued (small objects); a large
     * one is read again by the promotion thread, which close does not
     * wait for: wait for the queue first. */
    encache__tier_drain(tier);
    encache_store_close(tier);
    encache_store *local = NULL;
    ASSERT_EQ_INT(encache_store_open(lurl, &local), 0);
    ASSERT_EQ_INT(ts_read_one(local, good, got, 24 + sizes[s]), 24 + sizes[s]);
    ASSERT_EQ_INT(ts_read_one(local, bad, got, 24 + sizes[s]), ENCACHE_ENOENT);
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
