/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The statistics registry (src/fleet.c): real engine handles on a real shm
 * Store publishing into a real registry segment, read back through the
 * public encache_fleet_read(); a killed encoder is a real forked process.
 * Each test uses registry and Store names of its own (pid and a counter),
 * removed at exit.
 */
#include "runner.h"

#include "engine.h"
#include "fleet.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROWS 2
#define COLS 2

static char reg_name[64], store_seg[64], store_url[128];

static void cleanup(void) {
  char path[80];
  snprintf(path, sizeof(path), "/%s", reg_name);
  shm_unlink(path);
  encache_shm_destroy(store_seg);
}

/* A registry and a Store of the test's own (the previous test's removed,
 * when the tests share a process: ENCACHE_TEST_NOFORK). */
static void fleet_env(void) {
  static int count;
  if (reg_name[0] != '\0')
    cleanup();
  else
    atexit(cleanup);
  snprintf(reg_name, sizeof(reg_name), "encache.ftest-%d-%d", (int)getpid(),
           count);
  snprintf(store_seg, sizeof(store_seg), "encache-ftest-%d-%d", (int)getpid(),
           count++);
  snprintf(store_url, sizeof(store_url), "shm://%s?size=4MiB", store_seg);
  cleanup();
}

static char last_log[1024];
static void log_cb(void *ctx, const char *msg) {
  (void)ctx;
  snprintf(last_log, sizeof(last_log), "%s", msg);
}

/* Opens a handle publishing into `segment` as `encoder` (NULL: unset). */
static encache *open_as(const char *segment, const char *encoder) {
  char json[1024], enc[320] = "";
  if (encoder != NULL)
    snprintf(enc, sizeof(enc), ", \"encoder_name\": \"%s\"", encoder);
  snprintf(json, sizeof(json),
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
           "\"ec_producer\", \"ec_connector_extra_config\": {"
           "\"cross_encoder_cache\": true, \"stats_segment\": \"%s\"%s}}",
           segment, enc);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "fleet/model";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = store_url;
  o.log = log_cb;
  encache *ec = NULL;
  if (encache_open(&o, &ec) != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  return ec;
}

/* The live entries of the test's registry, copied. */
typedef struct seen {
  int n;
  int64_t pid[8];
  char encoder[8][128], store[8][256], ns[8][256];
  encache_stats stats[8];
  encache_histogram lookup[8], write[8];
  uint64_t written[8];
} seen;

static int see(const encache_fleet_entry *e, void *ctx) {
  seen *s = ctx;
  ASSERT_EQ_U64(e->size, sizeof(*e));
  if (s->n < 8) {
    int i = s->n;
    s->pid[i] = e->pid;
    snprintf(s->encoder[i], sizeof(s->encoder[i]), "%s", e->encoder);
    snprintf(s->store[i], sizeof(s->store[i]), "%s", e->store);
    snprintf(s->ns[i], sizeof(s->ns[i]), "%s", e->ns);
    s->stats[i] = *e->stats;
    s->lookup[i] = *e->lookup;
    s->write[i] = *e->write;
    s->written[i] = e->bytes_written;
  }
  s->n++;
  return 0;
}

static int read_reg(seen *s) {
  memset(s, 0, sizeof(*s));
  int rc = encache_fleet_read(reg_name, see, s);
  if (rc < 0)
    test__fail(__FILE__, __LINE__, "fleet_read: %s", encache_errmsg(NULL));
  ASSERT_EQ_INT(rc, s->n);
  return rc;
}

TEST(fleet_slots_appear_on_open_and_vanish_on_close) {
  fleet_env();
  seen s;
  ASSERT_EQ_INT(encache_fleet_read(reg_name, see, &s), ENCACHE_ENOENT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "no such registry");
  encache *a = open_as(reg_name, "enc-a");
  encache *b = open_as(reg_name, NULL);
  ASSERT_EQ_INT(read_reg(&s), 2);
  ASSERT_EQ_STR(s.encoder[0], "enc-a");
  char want[64];
  snprintf(want, sizeof(want), "%d@", (int)getpid());
  ASSERT(strncmp(s.encoder[1], want, strlen(want)) == 0);
  ASSERT_EQ_INT(s.pid[0], getpid());
  ASSERT_EQ_INT(s.pid[1], getpid());
  ASSERT_CONTAINS(s.store[0], store_seg);
  ASSERT_EQ_STR(s.ns[0], encache_namespace_of(a));
  encache_close(a);
  ASSERT_EQ_INT(read_reg(&s), 1);
  ASSERT(strncmp(s.encoder[0], want, strlen(want)) == 0); /* b's */
  encache_close(b);
  ASSERT_EQ_INT(read_reg(&s), 0);
}

static float out_a[ROWS * COLS];

static int hit_alloc(void *ctx, size_t i, const encache_candidate *c,
                     uint64_t nbytes, void **data, void **handle) {
  (void)ctx;
  (void)i;
  (void)c;
  *data = malloc(nbytes);
  *handle = NULL;
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void hit_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx;
  (void)i;
  (void)handle;
  free(data);
}

/* Looks ids up in a new step, publishing the misses when publish is set. */
static int step_run(encache *ec, const char *const *ids, int n, int publish) {
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_candidate c[8];
  encache_result r[8];
  for (int i = 0; i < n; i++) {
    encache_candidate one = {sizeof(one), ids[i], ENCACHE_MODALITY_IMAGE,
                             ENCACHE_FLOAT32, ROWS, COLS,
                             ENCACHE_DEVICE_HOST, 0};
    c[i] = one;
  }
  encache_allocator a = {sizeof(a), NULL, hit_alloc, hit_release, 0};
  r[0].size = sizeof(r[0]);
  int hits = encache_lookup(step, c, (size_t)n, &a, r);
  ASSERT(hits >= 0);
  for (int i = 0; i < n; i++) {
    if (r[i].outcome == ENCACHE_HIT) {
      free(r[i].data);
    } else if (publish) {
      int64_t shape[2] = {ROWS, COLS};
      encache_tensor v = {sizeof v, out_a, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
      encache_storage *st = NULL;
      ASSERT_EQ_INT(encache_storage_new(out_a, sizeof(out_a), NULL, NULL, &st),
                    0);
      ASSERT_EQ_INT(encache_publish(step, ids[i], &v, st), 0);
      encache_storage_unref(st);
    }
  }
  ASSERT_EQ_INT(encache_flush(ec), 0);
  encache_step_close(step);
  return hits;
}

TEST(fleet_counters_match_stats_get_and_histograms_count) {
  fleet_env();
  encache *ec = open_as(reg_name, "counting");
  static const char *const ids[] = {"a", "b", "c", "d"};
  ASSERT_EQ_INT(step_run(ec, ids, 3, 1), 0);
  ASSERT_EQ_INT(step_run(ec, ids, 4, 0), 3);
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 1);
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_U64(s.stats[0].lookups, 2);
  ASSERT_EQ_U64(s.stats[0].hits, 3);
  ASSERT_EQ_U64(s.stats[0].misses, 4);
  ASSERT_EQ_U64(s.stats[0].published_written, 3);
  ASSERT_EQ_MEM(&s.stats[0], &st, sizeof(st)); /* every field */
  ASSERT_EQ_U64(s.lookup[0].count, 2);
  ASSERT_EQ_U64(s.write[0].count, 3);
  ASSERT(s.lookup[0].sum_ns > 0 && s.write[0].sum_ns > 0);
  ASSERT_EQ_U64(s.written[0], 3 * (ENCACHE_HEADER_SIZE + sizeof(out_a)));
  encache_close(ec);
}

TEST(fleet_histogram_buckets_are_log2_microseconds) {
  static const struct {
    uint64_t ns;
    unsigned bucket;
  } b[] = {{0, 0},        {1000, 0},       {1001, 1},        {2000, 1},
           {2001, 2},     {4000, 2},       {4001, 3},        {1500000, 11},
           {2048000, 11}, {2048001, 12},   {UINT64_C(1) << 62, 27}};
  for (size_t k = 0; k < sizeof(b) / sizeof(b[0]); k++)
    if (encache__fleet_bucket(b[k].ns) != b[k].bucket)
      test__fail(__FILE__, __LINE__, "%" PRIu64 " ns: bucket %u, not %u",
                 b[k].ns, encache__fleet_bucket(b[k].ns), b[k].bucket);
  fleet_env();
  encache__fleet *f =
      encache__fleet_attach(reg_name, "h", "shm://x", "ns", NULL, NULL);
  ASSERT(f != NULL);
  uint64_t now = encache__fleet_clock(f);
  /* Durations of at least 3 us and 1.5 ms (more on a slow machine). */
  encache__fleet_observe(f, ENCACHE__FLEET_LOOKUP, now - 3000, 0);
  encache__fleet_observe(f, ENCACHE__FLEET_LOOKUP, now - 1500000, 0);
  encache__fleet_observe(f, ENCACHE__FLEET_WRITE, now - 200, 100);
  encache__fleet_observe(f, ENCACHE__FLEET_WRITE, 0, 5); /* no start: none */
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 1);
  uint64_t from2 = 0, from11 = 0;
  for (int i = 2; i < ENCACHE_HISTOGRAM_BUCKETS; i++)
    from2 += s.lookup[0].bucket[i];
  for (int i = 11; i < ENCACHE_HISTOGRAM_BUCKETS; i++)
    from11 += s.lookup[0].bucket[i];
  ASSERT_EQ_U64(from2, 2);
  ASSERT(from11 >= 1);
  ASSERT_EQ_U64(s.lookup[0].count, 2);
  ASSERT(s.lookup[0].sum_ns >= 1503000);
  ASSERT_EQ_U64(s.write[0].count, 1);
  ASSERT_EQ_U64(s.written[0], 100);
  encache__fleet_detach(f);
  ASSERT_EQ_INT(read_reg(&s), 0);
}

TEST(fleet_killed_encoder_slot_is_reclaimed) {
  fleet_env();
  encache__fleet_slots = 1; /* the registry this test creates */
  int ready[2];
  ASSERT_EQ_INT(pipe(ready), 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    encache *ec = open_as(reg_name, "doomed");
    static const char *const ids[] = {"x"};
    step_run(ec, ids, 1, 1);
    if (write(ready[1], "r", 1) != 1)
      _exit(1);
    for (;;)
      pause();
  }
  close(ready[1]); /* a child that fails closes the pipe: read gives 0 */
  char c;
  ASSERT_EQ_INT(read(ready[0], &c, 1), 1);
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 1);
  ASSERT_EQ_INT(s.pid[0], pid);
  ASSERT_EQ_STR(s.encoder[0], "doomed");
  ASSERT_EQ_U64(s.stats[0].lookups, 1);
  kill(pid, SIGKILL);
  ASSERT_EQ_INT(waitpid(pid, NULL, 0), pid);
  ASSERT_EQ_INT(read_reg(&s), 0); /* dead: ignored, and freed */
  /* The one slot is free again: a new handle gets it. */
  last_log[0] = '\0';
  encache *ec = open_as(reg_name, "heir");
  ASSERT_EQ_STR(last_log, "");
  ASSERT_EQ_INT(read_reg(&s), 1);
  ASSERT_EQ_STR(s.encoder[0], "heir");
  ASSERT_EQ_U64(s.stats[0].lookups, 0); /* not the dead one's counters */
  encache_close(ec);
  close(ready[0]);
}

TEST(fleet_full_registry_degrades_without_failing_open) {
  fleet_env();
  encache__fleet_slots = 2;
  encache *a = open_as(reg_name, "a"), *b = open_as(reg_name, "b");
  last_log[0] = '\0';
  encache *c = open_as(reg_name, "c"); /* no slot left: opens anyway */
  ASSERT_CONTAINS(last_log, "full: its 2 slots are taken");
  ASSERT_CONTAINS(last_log, "not published");
  static const char *const ids[] = {"q"};
  step_run(c, ids, 1, 0);
  encache_stats st = ENCACHE_STATS_INIT;
  ASSERT_EQ_INT(encache_stats_get(c, &st), 0);
  ASSERT_EQ_U64(st.lookups, 1); /* it counts in its own memory */
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 2);
  encache_close(a);
  encache *d = open_as(reg_name, "d");
  ASSERT_EQ_INT(read_reg(&s), 2);
  encache_close(b);
  encache_close(c);
  encache_close(d);
  ASSERT_EQ_INT(read_reg(&s), 0);
}

/* Fills the registry's shm object with a header of the test's making;
 * returns its descriptor. */
static int write_segment(const void *bytes, size_t n, size_t total) {
  char path[80];
  snprintf(path, sizeof(path), "/%s", reg_name);
  int fd = shm_open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(ftruncate(fd, (off_t)total), 0);
  ASSERT_EQ_INT(pwrite(fd, bytes, n, 0), (long long)n);
  return fd;
}

/* Holds (F_WRLCK) or drops (F_UNLCK) an OFD lock on byte off of fd's
 * file. */
static void hold_byte(int fd, off_t off, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = off;
  fl.l_len = 1;
  ASSERT_EQ_INT(fcntl(fd, F_OFD_SETLK, &fl), 0);
}

/* The lock of a slot of a process of another version (byte 1000). */
static void hold_slot(int fd, short type) { hold_byte(fd, 1000, type); }

TEST(fleet_damaged_or_other_version_segment_is_refused_clearly) {
  encache__fleet_slots = 4; /* smaller than the other version's file */
  fleet_env();
  char junk[4096];
  memset(junk, 'x', sizeof(junk));
  close(write_segment(junk, sizeof(junk), sizeof(junk)));
  seen s;
  last_log[0] = '\0';
  encache *ec = open_as(reg_name, "e"); /* never a failed open */
  ASSERT_CONTAINS(last_log, "not an encache statistics registry");
  ASSERT_CONTAINS(last_log, reg_name);
  encache_close(ec);
  ASSERT_EQ_INT(encache_fleet_read(reg_name, see, &s), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "not an encache statistics registry");
  char path[80], head[8];
  snprintf(path, sizeof(path), "/%s", reg_name);
  int jfd = shm_open(path, O_RDONLY, 0);
  ASSERT(jfd >= 0);
  ASSERT_EQ_INT(pread(jfd, head, sizeof(head), 0), (long long)sizeof(head));
  ASSERT_EQ_MEM(head, junk, sizeof(head)); /* not ours: never touched */
  close(jfd);
  /* The header of version 1 (src/fleet.c) with version 2 in the format,
   * in use by a process of that version: refused, never written. */
  uint64_t hdr[8] = {UINT64_C(0x7465656c66636e65), (UINT64_C(2) << 48), 0};
  int fd = write_segment(hdr, sizeof(hdr), 65536);
  hold_slot(fd, F_WRLCK);
  last_log[0] = '\0';
  ec = open_as(reg_name, "e");
  ASSERT_CONTAINS(last_log, "layout version 2, but this library reads "
                            "version 1 only");
  encache_close(ec);
  ASSERT_EQ_INT(encache_fleet_read(reg_name, see, &s), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "layout version 2");
  uint64_t after[8];
  ASSERT_EQ_INT(pread(fd, after, sizeof(after), 0), (long long)sizeof(after));
  ASSERT_EQ_MEM(after, hdr, sizeof(hdr));
  /* Once nobody uses it, the next encoder makes it afresh (never shorter:
   * a process of the other version may still map it). */
  hold_slot(fd, F_UNLCK);
  last_log[0] = '\0';
  ec = open_as(reg_name, "e2");
  ASSERT_EQ_STR(last_log, "");
  ASSERT_EQ_INT(read_reg(&s), 1);
  ASSERT_EQ_STR(s.encoder[0], "e2");
  struct stat sb;
  ASSERT_EQ_INT(fstat(fd, &sb), 0);
  ASSERT(sb.st_size >= 65536);
  encache_close(ec);
  close(fd);
}

TEST(fleet_off_and_bad_names) {
  fleet_env();
  last_log[0] = '\0';
  encache *ec = open_as("off", NULL);
  ASSERT_EQ_STR(last_log, "");
  ASSERT(ec->fleet == NULL);
  encache_close(ec);
  ec = open_as("", NULL);
  ASSERT(ec->fleet == NULL);
  encache_close(ec);
  ec = open_as("bad/name", NULL);
  ASSERT_CONTAINS(last_log, "\"bad/name\": not a segment name");
  encache_close(ec);
  seen s;
  ASSERT_EQ_INT(encache_fleet_read("bad/name", see, &s), ENCACHE_EURL);
  ASSERT_EQ_INT(encache_fleet_read(reg_name, NULL, NULL), ENCACHE_EINVAL);
}

/* The registry's shm object, opened read-write by the test. */
static int open_reg(void) {
  char path[80];
  snprintf(path, sizeof(path), "/%s", reg_name);
  int fd = shm_open(path, O_RDWR, 0);
  ASSERT(fd >= 0);
  return fd;
}

TEST(fleet_reader_survives_registry_truncated_under_it) {
  fleet_env();
  encache__fleet_slots = 4;
  encache *ec = open_as(reg_name, "cut");
  int fd = open_reg();
  struct stat sb;
  ASSERT_EQ_INT(fstat(fd, &sb), 0);
  ASSERT_EQ_INT(sb.st_mode & 0777, 0600); /* only its user may write it */
  size_t size = (size_t)sb.st_size;
  unsigned char *saved = malloc(size);
  ASSERT(saved != NULL);
  ASSERT_EQ_INT(pread(fd, saved, size, 0), (long long)size); /* a live slot */
  encache_close(ec);
  /* A live owner of slot 0 (its lock, on the slot's first byte, 64). */
  hold_byte(fd, 64, F_WRLCK);
  ASSERT_EQ_INT(pwrite(fd, saved, size, 0), (long long)size);
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 1);
  ASSERT_EQ_STR(s.encoder[0], "cut");
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) { /* reads while the parent cuts the file and restores it */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int reads = 0;
    do {
      seen c;
      memset(&c, 0, sizeof(c));
      encache_fleet_read(reg_name, see, &c); /* any answer but a crash */
      reads++;
      clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 1 || reads < 100);
    _exit(0);
  }
  int status = 0;
  for (;;) {
    ASSERT_EQ_INT(ftruncate(fd, 0), 0);
    ASSERT_EQ_INT(pwrite(fd, saved, size / 2, 0), (long long)(size / 2));
    ASSERT_EQ_INT(pwrite(fd, saved, size, 0), (long long)size);
    pid_t w = waitpid(pid, &status, WNOHANG);
    ASSERT(w >= 0);
    if (w == pid)
      break;
  }
  ASSERT(WIFEXITED(status)); /* not killed by SIGBUS */
  ASSERT_EQ_INT(WEXITSTATUS(status), 0);
  free(saved);
  close(fd);
}

TEST(fleet_writer_refuses_a_registry_others_may_write) {
  fleet_env();
  encache *ec = open_as(reg_name, "mine");
  ASSERT(ec->fleet != NULL);
  encache_close(ec);
  int fd = open_reg();
  ASSERT_EQ_INT(fchmod(fd, 0666), 0);
  last_log[0] = '\0';
  ec = open_as(reg_name, "w"); /* never a failed open */
  ASSERT(ec->fleet == NULL);
  ASSERT_CONTAINS(last_log, reg_name);
  ASSERT_CONTAINS(last_log, "writable by group or others (mode 0666)");
  ASSERT_CONTAINS(last_log, "not published");
  encache_close(ec);
  ASSERT_EQ_INT(fchmod(fd, 0600), 0);
  if (geteuid() != 0) {
    printf("# skipped the other-owner part: it needs root (chown)\n");
  } else {
    ASSERT_EQ_INT(fchown(fd, 65534, (gid_t)-1), 0);
    last_log[0] = '\0';
    ec = open_as(reg_name, "w");
    ASSERT(ec->fleet == NULL);
    ASSERT_CONTAINS(last_log, "owned by uid 65534, not by this process's "
                              "user (uid 0)");
    encache_close(ec);
  }
  close(fd);
  /* The default name is the user's own. */
  char def[64], want[64];
  snprintf(want, sizeof(want), "encache.fleet.%u", (unsigned)geteuid());
  ASSERT_EQ_STR(encache__fleet_default(def, sizeof(def)), want);
}

TEST(fleet_crafted_slot_count_is_refused_at_once) {
  fleet_env();
  encache__fleet_slots = 2;
  encache_close(open_as(reg_name, "x"));
  int fd = open_reg();
  uint32_t hdr[16];
  ASSERT_EQ_INT(pread(fd, hdr, sizeof(hdr), 0), (long long)sizeof(hdr));
  uint64_t slot_size = hdr[5]; /* magic, format, nslots, slot_size */
  ASSERT_EQ_INT(hdr[4], 2);
  /* 2^24 slots in a sparse file exactly their size. */
  hdr[4] = 1u << 24;
  ASSERT_EQ_INT(pwrite(fd, hdr, sizeof(hdr), 0), (long long)sizeof(hdr));
  ASSERT_EQ_INT(ftruncate(fd, (off_t)(64 + (slot_size << 24))), 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  seen s;
  ASSERT_EQ_INT(encache_fleet_read(reg_name, see, &s), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "16777216 slots");
  ASSERT_CONTAINS(encache_errmsg(NULL), "1 to 4096 slots");
  last_log[0] = '\0';
  encache *ec = open_as(reg_name, "y");
  ASSERT(ec->fleet == NULL);
  ASSERT_CONTAINS(last_log, "larger than a registry of 4096 slots may be");
  encache_close(ec);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("# refused in %.3f s\n", (double)(t1.tv_sec - t0.tv_sec) +
                                      (t1.tv_nsec - t0.tv_nsec) / 1e9);
  /* 3 slots claimed in the file of 2: refused (not exactly its size). */
  hdr[4] = 3;
  ASSERT_EQ_INT(ftruncate(fd, (off_t)(64 + 2 * slot_size)), 0);
  ASSERT_EQ_INT(pwrite(fd, hdr, sizeof(hdr), 0), (long long)sizeof(hdr));
  ASSERT_EQ_INT(encache_fleet_read(reg_name, see, &s), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(encache_errmsg(NULL), "damaged header (format");
  close(fd);
}

TEST(fleet_long_names_are_cut_at_a_character_boundary) {
  fleet_env();
  char name[256] = "";
  for (int i = 0; i < 100; i++)
    strcat(name, "\xc3\xa9"); /* é, 2 bytes: 200 bytes in all */
  encache *ec = open_as(reg_name, name);
  seen s;
  ASSERT_EQ_INT(read_reg(&s), 1);
  /* 127 bytes fit: 63 whole characters, not 63 and half of one. */
  ASSERT_EQ_INT(strlen(s.encoder[0]), 126);
  ASSERT(strncmp(s.encoder[0], name, 126) == 0);
  encache_close(ec);
}

/* ---------------------------------------- hostile registries (issue 26) */

/* encache_fleet_read() of the test's registry in a child, killed after
 * 10 s (a read that blocks, on a FIFO say, would hang every tool): its
 * result and message in msg, or "hung" with ENCACHE_EUNAVAIL. */
static int read_in_child(char *msg, size_t n) {
  int p[2];
  ASSERT_EQ_INT(pipe(p), 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    alarm(10);
    seen s;
    char out[600];
    int rc = encache_fleet_read(reg_name, see, &s);
    int len = snprintf(out, sizeof(out), "%d %s", rc, encache_errmsg(NULL));
    _exit(write(p[1], out, (size_t)len + 1) == len + 1 ? 0 : 1);
  }
  close(p[1]);
  char buf[600] = "";
  ssize_t got = read(p[0], buf, sizeof(buf) - 1);
  close(p[0]);
  int status = 0, rc = ENCACHE_EUNAVAIL;
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
    snprintf(msg, n, "hung: still in encache_fleet_read() after 10 s");
    return rc;
  }
  buf[got > 0 ? got : 0] = '\0';
  int used = 0;
  if (sscanf(buf, "%d %n", &rc, &used) != 1)
    test__fail(__FILE__, __LINE__, "the child said \"%s\"", buf);
  snprintf(msg, n, "%s", buf + used);
  return rc;
}

TEST(fleet_reader_refuses_a_fifo_a_link_and_other_users_files) {
  fleet_env();
  char path[128], msg[600];
  snprintf(path, sizeof(path), "/dev/shm/%s", reg_name);
  /* A FIFO: a blocking open would wait for a writer forever. */
  ASSERT_EQ_INT(mkfifo(path, 0600), 0);
  ASSERT_EQ_INT(read_in_child(msg, sizeof(msg)), ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, reg_name);
  ASSERT_CONTAINS(msg, "a FIFO, not a registry");
  ASSERT_CONTAINS(msg, "remove it");
  last_log[0] = '\0';
  encache *ec = open_as(reg_name, "w"); /* the writer: never a failed open */
  ASSERT(ec->fleet == NULL);
  ASSERT_CONTAINS(last_log, "a FIFO, not a registry");
  encache_close(ec);
  ASSERT_EQ_INT(unlink(path), 0);
  /* A real registry of ours, then a symbolic link to it at another name. */
  encache_close(open_as(reg_name, "mine"));
  char real[sizeof(reg_name)];
  memcpy(real, reg_name, sizeof(real));
  ASSERT(strlen(real) + 5 < sizeof(reg_name));
  strcat(reg_name, ".link");
  char link[128];
  snprintf(link, sizeof(link), "/dev/shm/%s", reg_name);
  ASSERT_EQ_INT(symlink(path, link), 0);
  int rc = read_in_child(msg, sizeof(msg));
  ASSERT_EQ_INT(unlink(link), 0);
  memcpy(reg_name, real, sizeof(real));
  ASSERT_EQ_INT(rc, ENCACHE_EFORMAT);
  ASSERT_CONTAINS(msg, "a symbolic link, not a registry");
  /* Writable by others: anyone could forge its rows. */
  int fd = open_reg();
  ASSERT_EQ_INT(fchmod(fd, 0622), 0);
  ASSERT_EQ_INT(read_in_child(msg, sizeof(msg)), -EPERM);
  ASSERT_CONTAINS(msg, "writable by group or others (mode 0622)");
  ASSERT_EQ_INT(fchmod(fd, 0600), 0);
  ASSERT_EQ_INT(read_in_child(msg, sizeof(msg)), 0);
  if (geteuid() != 0) {
    printf("# skipped the other-owner part: it needs root (chown)\n");
  } else { /* another uid's (no user needs to exist for it) */
    ASSERT_EQ_INT(fchown(fd, 65534, 65534), 0);
    ASSERT_EQ_INT(read_in_child(msg, sizeof(msg)), -EPERM);
    ASSERT_CONTAINS(msg, "owned by uid 65534");
    ASSERT_CONTAINS(msg, "not by this process's user (uid 0)");
  }
  close(fd);
}
