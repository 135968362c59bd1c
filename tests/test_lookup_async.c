/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lookups that do not wait (encache_lookup_start, encache_step_wait,
 * encache_step_fd; docs/engine.md), on the real shm Store behind the
 * fault-injecting wrapper, which holds the lookup's reads where a test
 * needs a lookup in flight (no test waits for a fixed time to get one).
 */
#include "runner.h"
#include "store_util.h"

#include "engine.h"
#include "fault_store.h"
#include "redis_util.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COLS 4 /* float32: 16 bytes a row */
#define READ_BUF 4096 /* objects of more than 254 rows are OVERSIZE */

/* ------------------------------------------------------------- fixtures */

/* store_reads_in_flight of the engines aenv_open() opens (0: the Store's
 * choice, which is one for the fault wrapper). */
static int aenv_readers;
/* Whether the fault wrapper asks for registered memory (as Mooncake). */
static int aenv_registration;

typedef struct aenv {
  fault_ctl ctl;
  encache *ec;
  encache_store *raw; /* a second handle on the Store, for raw writes */
  char revision[64];
} aenv;

/* The options of e's engines (json: a buffer for them). */
static encache_options aenv_options(aenv *e, char *json, size_t size) {
  snprintf(json, size,
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", "
           "\"ec_role\": \"ec_producer\", \"ec_connector_extra_config\": {"
           "\"cross_encoder_cache\": true, \"store_read_buffer_bytes\": %d, "
           "\"store_reads_in_flight\": %d}}",
           READ_BUF, aenv_readers);
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = "shared/model";
  o.revision = e->revision;
  o.model_dtype = ENCACHE_FLOAT32;
  return o;
}

/* Opens an engine over the fault wrapper around a fresh Store, in a
 * namespace of its own. */
static encache *aenv_open(aenv *e) {
  static int count;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(e, 0, sizeof(*e));
  snprintf(e->revision, sizeof(e->revision), "la%d-%lld%09ld-%d",
           (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec, count++);
  fault_ctl_init(&e->ctl);
  e->ctl.registration = aenv_registration;
  encache_store *inner = ts_open("32MiB");
  e->raw = ts_reopen();
  char json[512];
  encache_options o = aenv_options(e, json, sizeof(json));
  int rc = encache__open_with_store(&o, fault_store_wrap(inner, &e->ctl),
                                    &e->ec);
  if (rc != 0)
    test__fail(__FILE__, __LINE__, "encache open: %s", encache_errmsg(e->ec));
  return e->ec;
}

static void aenv_done(aenv *e) { encache_store_close(e->raw); }

/* Opens e's engine (model, with `extra` in its extra config) and raw
 * handle on the Store at url (no fault wrapper). */
static void aenv_open_url(aenv *e, const char *url, const char *model,
                          const char *extra) {
  char json[256];
  snprintf(json, sizeof(json),
           "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": "
           "true%s}}", extra);
  memset(e, 0, sizeof(*e));
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = json;
  o.model = model;
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = url;
  if (encache_open(&o, &e->ec) != 0)
    test__fail(__FILE__, __LINE__, "open: %s", encache_errmsg(NULL));
  ASSERT_EQ_INT(encache_store_open(url, &e->raw), 0);
}

static encache_step *step_of(encache *ec) {
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  return step;
}

static encache_candidate cand(const char *id, uint64_t rows) {
  encache_candidate c = {sizeof(c), id, ENCACHE_MODALITY_IMAGE,
                         ENCACHE_FLOAT32, rows, COLS, ENCACHE_DEVICE_HOST, 0};
  return c;
}

/* Counting host allocator (atomics: it runs on the lookup thread). */
typedef struct talloc {
  int allocs, releases;
} talloc;

static int ta_alloc(void *ctx, size_t i, const encache_candidate *c,
                    uint64_t nbytes, void **data, void **handle) {
  (void)c;
  __atomic_add_fetch(&((talloc *)ctx)->allocs, 1, __ATOMIC_RELAXED);
  *data = malloc(nbytes ? nbytes : 1);
  *handle = (void *)(uintptr_t)(i + 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void ta_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  __atomic_add_fetch(&((talloc *)ctx)->releases, 1, __ATOMIC_RELAXED);
  free(data);
}

static encache_allocator allocator(talloc *t) {
  encache_allocator a = {sizeof(a), t, ta_alloc, ta_release, 0};
  return a;
}

static void free_hits(encache_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (r[i].outcome == ENCACHE_HIT) {
      free(r[i].data);
      r[i].data = NULL;
    }
}

/* The object for (id, rows): its payload derived from both. */
static void payload_of(const char *id, uint64_t rows, float *out) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = id; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  for (uint64_t i = 0; i < rows * COLS; i++)
    out[i] = (float)((h >> (i % 48)) & 0xffff) / 3.0f + (float)i;
}

/* Writes a header of (dtype, rows, cols) and `bytes` bytes of payload
 * under the handle's key for id, with the raw Store API. */
static void put(aenv *e, const char *id, int dtype, int64_t rows, int64_t cols,
                uint64_t rows_of_payload) {
  char key[512];
  ASSERT(encache_key(encache_namespace_of(e->ec), id, key, sizeof(key)) > 0);
  int64_t shape[2] = {rows, cols};
  encache_tensor t = {sizeof t, NULL, dtype, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  ASSERT_EQ_INT(encache_header_encode(&t, hdr), 0);
  size_t bytes = (size_t)(rows_of_payload * COLS * sizeof(float));
  float *p = malloc(bytes ? bytes : 1);
  payload_of(id, rows_of_payload, p);
  ASSERT_EQ_INT(encache_store_write(e->raw, key, hdr, sizeof(hdr), p, bytes),
                0);
  free(p);
}

/* Seeds `n` present objects of `rows` rows named PREFIX<k>. */
static void seed(aenv *e, const char *prefix, int n, uint64_t rows,
                 char ids[][32]) {
  for (int k = 0; k < n; k++) {
    snprintf(ids[k], 32, "%s%d", prefix, k);
    put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows, COLS, rows);
  }
}

static int readable(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int rc = poll(&p, 1, timeout_ms);
  ASSERT(rc >= 0);
  return rc == 1 && (p.revents & POLLIN);
}

/* -------------------------------------------------------------- property */

/* Compares two lookups' results over the same candidates. */
static void same_results(const encache_candidate *c, const encache_result *x,
                         const encache_result *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ_INT(x[i].outcome, y[i].outcome);
    ASSERT_EQ_INT(x[i].verdict, y[i].verdict);
    ASSERT_EQ_MEM(&x[i].found, &y[i].found, sizeof(x[i].found));
    ASSERT_EQ_U64(x[i].nbytes, y[i].nbytes);
    ASSERT((x[i].why == NULL) == (y[i].why == NULL));
    if (x[i].why != NULL)
      ASSERT_EQ_STR(x[i].why, y[i].why);
    if (x[i].outcome == ENCACHE_HIT) {
      ASSERT_EQ_MEM(x[i].data, y[i].data, x[i].nbytes);
      float want[300 * COLS];
      payload_of(c[i].id, c[i].rows, want);
      ASSERT_EQ_MEM(x[i].data, want, x[i].nbytes);
    }
  }
}

/* What an id of the pool is in the Store. */
enum { ABSENT, PRESENT, WRONG_DTYPE, SHORT_OBJECT, OVERSIZE, STATES };

/* `iters` random candidate sets over random Store contents, each looked
 * up blocking and started then waited, on e's handle. */
static void property_run(aenv *e, int iters) {
  encache *ec = e->ec;
  unsigned seed_ = 20261202u;
  static const uint64_t rows_of[] = {1, 2, 8, 64};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  int hits_total = 0, kinds[STATES + 1] = {0};
  for (int iter = 0; iter < iters; iter++) {
    char ids[6][32];
    uint64_t rows[6];
    for (int k = 0; k < 6; k++) {
      snprintf(ids[k], sizeof(ids[k]), "it%d-%d", iter, k);
      int state = (int)(rand_r(&seed_) % STATES);
      kinds[state]++;
      rows[k] = state == OVERSIZE ? 300 : rows_of[rand_r(&seed_) % 4];
      switch (state) {
      case PRESENT: case OVERSIZE:
        put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows[k], COLS, rows[k]);
        break;
      case WRONG_DTYPE: /* the same byte count, another contract */
        put(e, ids[k], ENCACHE_BFLOAT16, (int64_t)rows[k], 2 * COLS, rows[k]);
        break;
      case SHORT_OBJECT: /* a header that says more than there is */
        put(e, ids[k], ENCACHE_FLOAT32, (int64_t)rows[k] + 1, COLS, rows[k]);
        break;
      default: break;
      }
    }
    size_t n = 1 + rand_r(&seed_) % 10;
    encache_candidate c[10];
    for (size_t i = 0; i < n; i++) {
      int k = (int)(rand_r(&seed_) % 6); /* duplicates too */
      c[i] = cand(ids[k], rows[k]);
      if (rand_r(&seed_) % 12 == 0) {
        c[i].modality = ENCACHE_MODALITY_AUDIO; /* SKIPPED */
        kinds[STATES]++;
      }
    }
    encache_result x[10], y[10], z[10];
    memset(x, 0, sizeof(x));
    memset(y, 0xa5, sizeof(y)); /* what the lookup does not write shows */
    memset(z, 0xa5, sizeof(z));
    x[0].size = y[0].size = z[0].size = sizeof(encache_result);
    encache_step *sx = step_of(ec), *sy = step_of(ec), *sz = step_of(ec);
    int want = encache_lookup(sx, c, n, &a, x);
    ASSERT(want >= 0);
    /* Two started at once (in flight together, with two lookup threads),
     * the later waited for first. */
    ASSERT_EQ_INT(encache_lookup_start(sy, c, n, &a, y), 0);
    ASSERT_EQ_INT(encache_lookup_start(sz, c, n, &a, z), 0);
    ASSERT_EQ_INT(encache_step_wait(sz, -1), want);
    ASSERT_EQ_INT(encache_step_wait(sy, -1), want);
    same_results(c, x, y, n);
    same_results(c, x, z, n);
    hits_total += want;
    free_hits(x, n);
    free_hits(y, n);
    free_hits(z, n);
    encache_step_close(sx);
    encache_step_close(sy);
    encache_step_close(sz);
  }
  ASSERT(hits_total > 0);
  for (int s = 0; s <= STATES; s++)
    ASSERT(kinds[s] > 0); /* every kind of object (and SKIPPED) was seen */
  encache_stats st = {.size = sizeof(st)};
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT(st.incompatible > 0 && st.oversize > 0 && st.misses > 0);
  ASSERT_EQ_INT(t.allocs - t.releases, 3 * hits_total);
}

TEST(lookup_async_results_equal_blocking_lookups) {
  aenv e;
  aenv_readers = 2;
  aenv_open(&e);
  aenv_readers = 0;
  property_run(&e, 200);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
}

/* The same over a real redis-server (skipped without one). */
TEST(lookup_async_results_equal_blocking_lookups_redis) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  char extra[64];
  snprintf(extra, sizeof(extra), ", \"store_read_buffer_bytes\": %d",
           READ_BUF);
  aenv e;
  aenv_open_url(&e, rs.url, "async/redis", extra);
  property_run(&e, 60);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
  kill_wait(rs.pid, SIGTERM);
}

/* ---------------------------------------------------- the fd, the waits */

TEST(lookup_async_fd_readable_once_per_lookup) {
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[3][32];
  seed(&e, "fd", 3, 2, ids);
  encache_step *step = step_of(ec);
  int fd = encache_step_fd(step);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(encache_step_fd(step), fd); /* the same one */
  ASSERT_EQ_INT(readable(fd, 0), 0);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL); /* none started */
  encache_candidate c[3] = {cand(ids[0], 2), cand(ids[1], 2), cand(ids[2], 2)};
  encache_result r[3] = {ENCACHE_RESULT_INIT};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  for (int round = 0; round < 3; round++) {
    e.ctl.hold_reads = round < 2; /* the last round runs free */
    ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), 0);
    if (round < 2) {
      fault_wait_reads_held(&e.ctl, 1);
      ASSERT_EQ_INT(readable(fd, 0), 0);
      ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
      ASSERT_EQ_INT(encache_step_wait(step, 30), ENCACHE_EPENDING);
      /* One lookup at a time on a step. */
      ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), ENCACHE_EINVAL);
      fault_release_reads(&e.ctl);
    }
    ASSERT_EQ_INT(readable(fd, 60000), 1);
    ASSERT_EQ_INT(readable(fd, 0), 1); /* stays readable until the wait */
    if (round == 1) /* the answer is kept until a wait takes it */
      ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), ENCACHE_EINVAL);
    ASSERT_EQ_INT(encache_step_wait(step, round == 2 ? -1 : 0), 3);
    ASSERT_EQ_INT(readable(fd, 0), 0); /* consumed */
    ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL); /* done */
    ASSERT_EQ_INT(readable(fd, 0), 0);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    free_hits(r, 3);
  }
  /* A step whose fd is asked for after its lookup completed. */
  encache_step *late = step_of(ec);
  ASSERT_EQ_INT(encache_lookup_start(late, c, 3, &a, r), 0);
  /* The handle's turn: a blocking call waits for the started lookup. */
  encache_step *other = step_of(ec);
  encache_step_close(other);
  int lfd = encache_step_fd(late);
  ASSERT(lfd >= 0 && lfd != fd);
  ASSERT_EQ_INT(readable(lfd, 60000), 1);
  ASSERT_EQ_INT(encache_step_wait(late, 0), 3);
  ASSERT_EQ_INT(readable(lfd, 0), 0);
  free_hits(r, 3);
  ASSERT_EQ_INT(t.allocs, 12);
  ASSERT_EQ_INT(t.releases, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* The first encache_step_fd() (an event loop's thread) and the first
 * encache_lookup_start() (the encoder's) race to start the lookup
 * threads: they are started once.  Before the fix both started a set;
 * the first was never joined: its lookup never ran (the bounded wait
 * answered ENCACHE_EPENDING) and its threads read the handle after
 * encache_close() (a crash, a use-after-free under ASan). */
typedef struct fd_racer {
  encache_step *step;
  int ready, go, fd;
  unsigned delay; /* spins after the go: the rounds sweep the offset */
} fd_racer;

static void spin(unsigned n) {
  for (volatile unsigned k = 0; k < n; k++)
    ;
}

static void *fd_racer_main(void *arg) {
  fd_racer *r = arg;
  __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&r->go, __ATOMIC_ACQUIRE))
    ;
  spin(r->delay);
  r->fd = encache_step_fd(r->step);
  return NULL;
}

TEST(lookup_async_first_fd_and_first_start_race_start_once) {
  for (int round = 0; round < 300; round++) {
    aenv e;
    aenv_readers = 2;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[1][32];
    seed(&e, "race", 1, 2, ids);
    encache_step *evloop = step_of(ec), *encoder = step_of(ec);
    fd_racer r = {evloop, 0, 0, -1, round % 2 ? (unsigned)(round * 7 % 300) : 0};
    pthread_t t;
    ASSERT_EQ_INT(pthread_create(&t, NULL, fd_racer_main, &r), 0);
    encache_candidate c[1] = {cand(ids[0], 2)};
    encache_result res[1] = {ENCACHE_RESULT_INIT};
    talloc ta = {0};
    encache_allocator a = allocator(&ta);
    while (!__atomic_load_n(&r.ready, __ATOMIC_ACQUIRE))
      ;
    __atomic_store_n(&r.go, 1, __ATOMIC_RELEASE);
    spin(round % 2 ? 0 : (unsigned)(round * 7 % 300));
    ASSERT_EQ_INT(encache_lookup_start(encoder, c, 1, &a, res), 0);
    pthread_join(t, NULL);
    ASSERT(r.fd >= 0);
    ASSERT_EQ_INT(encache_step_wait(encoder, 20000), 1); /* not lost */
    ASSERT_EQ_INT(res[0].outcome, ENCACHE_HIT);
    free_hits(res, 1);
    encache_step_close(evloop);
    encache_step_close(encoder);
    ASSERT_EQ_INT(encache_close(ec), 0);
    aenv_done(&e);
  }
}

TEST(lookup_async_refuses_bad_arguments_at_once) {
  aenv e;
  encache *ec = aenv_open(&e);
  encache_step *step = step_of(ec);
  encache_candidate c[1] = {cand("x", 2)};
  encache_result r[1] = {ENCACHE_RESULT_INIT};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  ASSERT_EQ_INT(encache_lookup_start(NULL, c, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &a, NULL), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "results is NULL");
  ASSERT_EQ_INT(encache_lookup_start(step, NULL, 1, &a, r), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, NULL, r), ENCACHE_EINVAL);
  ASSERT_CONTAINS(encache_errmsg(ec), "allocator is required");
  r[0].size = 3;
  ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &a, r), ENCACHE_EINVAL);
  r[0].size = sizeof(r[0]);
  ASSERT_EQ_INT(encache_step_wait(NULL, 0), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_step_fd(NULL), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EINVAL);
  ASSERT_EQ_STR(encache_err_name(ENCACHE_EPENDING), "EPENDING");
  ASSERT_CONTAINS(encache_strerror(ENCACHE_EPENDING), "not complete");
  /* A miss, through the thread; an allocator copied (a is gone by then). */
  {
    encache_allocator gone = allocator(&t);
    ASSERT_EQ_INT(encache_lookup_start(step, c, 1, &gone, r), 0);
    memset(&gone, 0, sizeof(gone));
  }
  ASSERT_EQ_INT(encache_step_wait(step, -1), 0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[0].why, "not in the Store");
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* ------------------------------------------------------- cancellation */

typedef struct releaser {
  fault_ctl *ctl;
  int held;
  pthread_t thread;
} releaser;

/* Waits for the held reads, then gives the main thread time to block in
 * the call under test before releasing them (either order is safe: the
 * test asserts safety, not the interleaving). */
static void *release_main(void *arg) {
  releaser *r = arg;
  fault_wait_reads_held(r->ctl, r->held);
  struct timespec d = {0, 20 * 1000000L};
  nanosleep(&d, NULL);
  fault_release_reads(r->ctl);
  return NULL;
}

static void releaser_start(releaser *r, fault_ctl *ctl) {
  r->ctl = ctl;
  r->held = 1;
  ASSERT_EQ_INT(pthread_create(&r->thread, NULL, release_main, r), 0);
}

TEST(lookup_async_step_close_in_flight_is_safe) {
  /* One lookup thread (the second lookup queued), then two (both read). */
  for (int readers = 1; readers <= 2; readers++) {
    aenv e;
    aenv_readers = readers;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[4][32];
    seed(&e, "sc", 4, 8, ids);
    encache_candidate c[5] = {cand(ids[0], 8), cand(ids[1], 8),
                              cand(ids[2], 8), cand(ids[3], 8),
                              cand("sc-absent", 8)};
    static encache_result r[5] = {ENCACHE_RESULT_INIT};
    static encache_result q[5];
    for (int i = 0; i < 5; i++)
      q[i] = (encache_result){.size = sizeof(q[i]), .outcome = -1};
    talloc t = {0};
    encache_allocator a = allocator(&t);
    encache_step *step = step_of(ec), *queued = step_of(ec);
    (void)encache_step_fd(step); /* its fd is closed with it */
    e.ctl.hold_reads = 1;
    ASSERT_EQ_INT(encache_lookup_start(step, c, 5, &a, r), 0);
    ASSERT_EQ_INT(encache_lookup_start(queued, c, 5, &a, q), 0);
    fault_wait_reads_held(&e.ctl, 1);
    /* A wait with a bound returns while the Store is held. */
    ASSERT_EQ_INT(encache_step_wait(step, 50), ENCACHE_EPENDING);
    ASSERT_EQ_INT(encache_step_wait(queued, 10), ENCACHE_EPENDING);
    releaser rel;
    releaser_start(&rel, &e.ctl);
    encache_step_close(step); /* waits for its lookup, then closes */
    ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
    /* Completed: its hits are the caller's, as encache_lookup()'s are. */
    for (int i = 0; i < 4; i++)
      ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    ASSERT_EQ_INT(r[4].outcome, ENCACHE_MISS);
    free_hits(r, 5);
    /* The queued one either ran (then its answer waits) or is dropped with
     * its step, unrun: both are safe. */
    encache_step_close(queued);
    int ran = q[0].outcome == ENCACHE_HIT;
    if (ran)
      free_hits(q, 5);
    ASSERT_EQ_INT(t.allocs, 4 + 4 * ran);
    ASSERT_EQ_INT(t.releases, 0);
    ASSERT_EQ_INT(encache_close(ec), 0);
    aenv_done(&e);
  }
}

TEST(lookup_async_handle_close_in_flight_is_safe) {
  /* With one lookup thread, then two (both lookups read at the close). */
  for (int run = 0; run < 4; run++) {
    int with_step_open = run & 1;
    aenv e;
    aenv_readers = 1 + run / 2;
    encache *ec = aenv_open(&e);
    aenv_readers = 0;
    char ids[3][32];
    seed(&e, "hc", 3, 64, ids);
    encache_candidate c[3] = {cand(ids[0], 64), cand(ids[1], 64),
                              cand(ids[2], 64)};
    static encache_result r[3] = {ENCACHE_RESULT_INIT};
    static encache_result q[3];
    for (int i = 0; i < 3; i++) /* not an outcome: one that never ran */
      q[i] = (encache_result){.size = sizeof(q[i]), .outcome = -1};
    talloc t = {0};
    encache_allocator a = allocator(&t);
    encache_step *step = step_of(ec), *queued = step_of(ec);
    (void)encache_step_fd(queued);
    e.ctl.hold_reads = 1;
    ASSERT_EQ_INT(encache_lookup_start(step, c, 3, &a, r), 0);
    ASSERT_EQ_INT(encache_lookup_start(queued, c, 3, &a, q), 0);
    fault_wait_reads_held(&e.ctl, 1);
    ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
    releaser rel;
    releaser_start(&rel, &e.ctl);
    if (with_step_open) { /* the step closes with the handle */
      ASSERT_EQ_INT(encache_close(ec), 0);
    } else {
      encache_step_close(step);
      ASSERT_EQ_INT(encache_close(ec), 0);
    }
    ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
    ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT); /* the running one completed */
    free_hits(r, 3);
    int ran = q[0].outcome == ENCACHE_HIT;
    if (ran)
      free_hits(q, 3);
    ASSERT_EQ_INT(t.allocs, 3 + 3 * ran);
    ASSERT_EQ_INT(t.releases, 0);
    aenv_done(&e);
  }
}

/* ----------------------------------------------------------------- poison */

TEST(lookup_async_unconfirmed_read_poisons_at_the_wait) {
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[2][32];
  seed(&e, "po", 2, 2, ids);
  encache_candidate c[2] = {cand(ids[0], 2), cand(ids[1], 2)};
  static encache_result r[2] = {ENCACHE_RESULT_INIT}; /* kept: reachable */
  talloc t = {0};
  encache_allocator a = allocator(&t);
  encache_step *step = step_of(ec);
  int fd = encache_step_fd(step);
  e.ctl.read_rc = ENCACHE_EUNCONFIRMED;
  e.ctl.hold_reads = 1;
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  fault_wait_reads_held(&e.ctl, 1);
  ASSERT_EQ_INT(encache_step_wait(step, 0), ENCACHE_EPENDING);
  fault_release_reads(&e.ctl);
  ASSERT_EQ_INT(readable(fd, 60000), 1);
  ASSERT_EQ_INT(encache_step_wait(step, -1), ENCACHE_EPOISONED);
  ASSERT_CONTAINS(encache_errmsg(ec), "poisoned");
  encache_stats st = {.size = sizeof(st)};
  ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
  ASSERT_EQ_INT(st.poisoned, 1);
  /* Later starts fail fast, as lookups do. */
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), ENCACHE_EPOISONED);
  ASSERT_EQ_INT(t.releases, 0); /* destinations the Store wrote are kept */
  ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  aenv_done(&e);
}

/* ------------------------------------------------------ run in order */

/* Records, per allocation, which lookup (its candidate's id's first
 * letter). */
typedef struct order_log {
  char seq[64];
  int n;
} order_log;

static int order_alloc(void *ctx, size_t i, const encache_candidate *c,
                       uint64_t nbytes, void **data, void **handle) {
  order_log *l = ctx;
  (void)i;
  if (l->n < 63)
    l->seq[l->n++] = c->id[0];
  *handle = NULL;
  *data = malloc(nbytes ? nbytes : 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void order_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

/* A wait without a bound may run its lookup on the waiting thread (when
 * it has not begun and is the next to run), never before an older one:
 * lookups run in the order they were started, whoever waits. */
TEST(lookup_async_waits_keep_the_order_of_starts) {
  aenv e;
  encache *ec = aenv_open(&e);
  put(&e, "a1", ENCACHE_FLOAT32, 2, COLS, 2);
  put(&e, "b1", ENCACHE_FLOAT32, 2, COLS, 2);
  put(&e, "c1", ENCACHE_FLOAT32, 2, COLS, 2);
  encache_candidate ca = cand("a1", 2), cb = cand("b1", 2), cc = cand("c1", 2);
  static encache_result ra = ENCACHE_RESULT_INIT, rb = ENCACHE_RESULT_INIT,
                        rc_ = ENCACHE_RESULT_INIT;
  static order_log log;
  memset(&log, 0, sizeof(log));
  encache_allocator a = {sizeof(a), &log, order_alloc, order_release, 0};
  encache_step *sa = step_of(ec), *sb = step_of(ec), *sc = step_of(ec);
  e.ctl.hold_reads = 1;
  ASSERT_EQ_INT(encache_lookup_start(sa, &ca, 1, &a, &ra), 0);
  fault_wait_reads_held(&e.ctl, 1); /* a runs on the lookup thread */
  ASSERT_EQ_INT(encache_lookup_start(sb, &cb, 1, &a, &rb), 0);
  ASSERT_EQ_INT(encache_lookup_start(sc, &cc, 1, &a, &rc_), 0);
  releaser rel;
  releaser_start(&rel, &e.ctl);
  ASSERT_EQ_INT(encache_step_wait(sc, -1), 1); /* c is not the next: b is */
  ASSERT_EQ_INT(pthread_join(rel.thread, NULL), 0);
  ASSERT_EQ_INT(encache_step_wait(sa, -1), 1);
  ASSERT_EQ_INT(encache_step_wait(sb, -1), 1);
  ASSERT_EQ_INT(log.n, 3);
  ASSERT_EQ_MEM(log.seq, "abc", 3);
  /* Started and waited at once, with nothing before it: it may run here
   * or on the lookup thread, and gives the same answer. */
  log.n = 0;
  free(ra.data);
  ra.data = NULL;
  ASSERT_EQ_INT(encache_lookup_start(sa, &ca, 1, &a, &ra), 0);
  ASSERT_EQ_INT(encache_step_wait(sa, -1), 1);
  ASSERT_EQ_INT(log.n, 1);
  same_results(&ca, &ra, &ra, 1);
  free(ra.data);
  free(rb.data);
  free(rc_.data);
  encache_step_close(sa);
  encache_step_close(sb);
  encache_step_close(sc);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* --------------------------------------------------------------- budgets */

/* Whether n reads (or existence checks) are held within ms. */
static int reads_held_within(fault_ctl *ctl, int n, int ms) {
  struct timespec d = {0, 1000000L};
  for (int k = 0; k < ms; k++) {
    pthread_mutex_lock(&ctl->mu);
    int waiting = ctl->reads_waiting;
    pthread_mutex_unlock(&ctl->mu);
    if (waiting >= n)
      return 1;
    nanosleep(&d, NULL);
  }
  return 0;
}

static int reads_held_now(fault_ctl *ctl) {
  pthread_mutex_lock(&ctl->mu);
  int waiting = ctl->reads_waiting;
  pthread_mutex_unlock(&ctl->mu);
  return waiting;
}

/* However many steps have a lookup started, store_reads_in_flight of them
 * read the Store at once, each into its own lane (at most that many
 * staging buffers of store_read_buffer_bytes, registered with a Store that
 * needs it and unregistered at close); those queued hold nothing. */
TEST(lookup_async_many_steps_read_as_many_at_a_time_as_configured) {
  static const int readers[] = {1, 3, 1, 3};
  for (int rk = 0; rk < 4; rk++) {
    aenv e;
    aenv_readers = readers[rk];
    aenv_registration = rk >= 2; /* reads into registered staging buffers */
    encache *ec = aenv_open(&e);
    aenv_readers = aenv_registration = 0;
    char ids[4][32];
    seed(&e, "bu", 4, 32, ids); /* 512 bytes each: one chunk of 4 */
    encache_candidate c[4] = {cand(ids[0], 32), cand(ids[1], 32),
                              cand(ids[2], 32), cand(ids[3], 32)};
    enum { STEPS = ENCACHE_MAX_STEPS };
    static encache_result r[STEPS][4];
    static encache_step *steps[STEPS];
    talloc t = {0};
    encache_allocator a = allocator(&t);
    for (int k = 0; k < STEPS; k++)
      steps[k] = step_of(ec);
    e.ctl.hold_reads = 1;
    for (int k = 0; k < STEPS; k++) {
      r[k][0].size = sizeof(r[k][0]);
      ASSERT_EQ_INT(encache_lookup_start(steps[k], c, 4, &a, r[k]), 0);
    }
    ASSERT(reads_held_within(&e.ctl, readers[rk], 10000));
    /* Time for one more lookup to reach the Store, were one to run. */
    struct timespec d = {0, 50 * 1000000L};
    nanosleep(&d, NULL);
    ASSERT_EQ_INT(reads_held_now(&e.ctl), readers[rk]);
    ASSERT(__atomic_load_n(&t.allocs, __ATOMIC_RELAXED) <= 4 * readers[rk]);
    fault_release_reads(&e.ctl);
    for (int k = 0; k < STEPS; k++) {
      ASSERT_EQ_INT(encache_step_wait(steps[k], -1), 4);
      same_results(c, r[0], r[k], 4);
    }
    encache_stats st = {.size = sizeof(st)};
    ASSERT_EQ_INT(encache_stats_get(ec, &st), 0);
    ASSERT(st.staging_allocations <= (uint64_t)readers[rk]);
    ASSERT(st.staging_bytes <= (uint64_t)readers[rk] * READ_BUF);
    if (rk >= 2) { /* every lane read while the others did: one each */
      ASSERT_EQ_U64(st.staging_allocations, (uint64_t)readers[rk]);
      ASSERT_EQ_INT(e.ctl.registered, readers[rk]);
    }
    ASSERT_EQ_U64(st.lookups, STEPS);
    ASSERT_EQ_U64(st.hits, 4 * STEPS);
    for (int k = 0; k < STEPS; k++) {
      free_hits(r[k], 4);
      encache_step_close(steps[k]);
    }
    ASSERT_EQ_INT(t.allocs, 4 * STEPS);
    ASSERT_EQ_INT(encache_close(ec), 0);
    ASSERT_EQ_INT(e.ctl.registered, 0); /* each unregistered at close */
    aenv_done(&e);
  }
}

/* store_reads_in_flight: 1 to 8, or 0 (the Store's choice). */
TEST(lookup_async_reads_in_flight_is_checked_at_open) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = "{\"ec_connector_extra_config\": {"
                         "\"cross_encoder_cache\": true, "
                         "\"store_reads_in_flight\": 9}}";
  o.model = "async/option";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = "shm://never-opened"; /* refused before the Store opens */
  encache *ec = NULL;
  ASSERT_EQ_INT(encache_open(&o, &ec), ENCACHE_ECONFIG);
  ASSERT(ec == NULL);
  ASSERT_CONTAINS(encache_errmsg(NULL),
                  "store_reads_in_flight: 9 is too many (at most 8");
}

/* While started lookups read the Store (held there), the caller's calls
 * go on: a publish, a step opened and closed, a poll; the reads of two
 * steps are in flight at once, a third waits its turn; then all three
 * give the blocking lookup's results. */
TEST(lookup_async_reads_of_several_steps_in_flight_at_once) {
  aenv e;
  aenv_readers = 2;
  encache *ec = aenv_open(&e);
  aenv_readers = 0;
  char ids[3][32];
  seed(&e, "fl", 3, 16, ids);
  encache_candidate c[4] = {cand(ids[0], 16), cand(ids[1], 16),
                            cand(ids[2], 16), cand("fl-absent", 16)};
  static encache_result want[4], r[3][4];
  talloc t = {0};
  encache_allocator a = allocator(&t);
  encache_step *sp = step_of(ec), *s[3] = {step_of(ec), step_of(ec),
                                           step_of(ec)};
  /* sp's candidate, a miss, is published while the reads are held. */
  encache_candidate pc = cand("fl-published", 2);
  static encache_result pr = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(sp, &pc, 1, &a, &pr), 0);
  want[0].size = sizeof(want[0]);
  ASSERT_EQ_INT(encache_lookup(sp, c, 4, &a, want), 3);
  e.ctl.hold_reads = 1;
  for (int k = 0; k < 3; k++) {
    r[k][0].size = sizeof(r[k][0]);
    ASSERT_EQ_INT(encache_lookup_start(s[k], c, 4, &a, r[k]), 0);
  }
  ASSERT(reads_held_within(&e.ctl, 2, 10000));
  struct timespec d = {0, 50 * 1000000L};
  nanosleep(&d, NULL);
  ASSERT_EQ_INT(reads_held_now(&e.ctl), 2); /* the third is queued */
  float out[2 * COLS];
  payload_of("fl-published", 2, out);
  int64_t shape[2] = {2, COLS};
  encache_tensor view = {sizeof view, out, ENCACHE_FLOAT32, 2, shape, NULL,
                         ENCACHE_DEVICE_HOST, 0, NULL};
  encache_storage *storage = NULL;
  ASSERT_EQ_INT(encache_storage_new(out, sizeof(out), NULL, NULL, &storage),
                0);
  ASSERT_EQ_INT(encache_publish(sp, "fl-published", &view, storage),
                ENCACHE_QUEUED);
  encache_storage_unref(storage);
  encache_step *extra = step_of(ec);
  encache_step_close(extra);
  ASSERT_EQ_INT(encache_step_wait(s[2], 0), ENCACHE_EPENDING);
  fault_release_reads(&e.ctl); /* (the publisher's existence check too) */
  for (int k = 2; k >= 0; k--) {
    ASSERT_EQ_INT(encache_step_wait(s[k], -1), 3);
    same_results(c, want, r[k], 4);
    free_hits(r[k], 4);
  }
  free_hits(want, 4);
  ASSERT_EQ_INT(encache_flush(ec), 0);
  static encache_result back = ENCACHE_RESULT_INIT;
  ASSERT_EQ_INT(encache_lookup(s[0], &pc, 1, &a, &back), 1);
  same_results(&pc, &back, &back, 1); /* the bytes published */
  free_hits(&back, 1);
  encache_step_close(sp);
  for (int k = 0; k < 3; k++)
    encache_step_close(s[k]);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}

/* ------------------------------------------------- a Store that stops */

/* A Redis server stopped (SIGSTOP) under a started lookup: the waits with
 * a bound return while it hangs, the lookup ends at the Store's timeout
 * with UNAVAILABLE (never a hang, never a poisoned handle), and lookups
 * hit again once the server is back. */
TEST(lookup_async_stopped_store_waits_are_bounded) {
  redis_server rs;
  if (!redis_server_start(&rs, "?timeout_ms=300&connect_timeout_ms=300"))
    return;
  aenv e;
  aenv_open_url(&e, rs.url, "async/stopped", "");
  char ids[2][32];
  seed(&e, "st", 2, 8, ids);
  encache_candidate c[2] = {cand(ids[0], 8), cand(ids[1], 8)};
  encache_result r[2] = {ENCACHE_RESULT_INIT};
  talloc t = {0};
  encache_allocator a = allocator(&t);
  encache_step *step = step_of(e.ec);
  int fd = encache_step_fd(step);
  ASSERT(fd >= 0);
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  ASSERT_EQ_INT(encache_step_wait(step, -1), 2); /* connected: hits */
  free_hits(r, 2);
  ASSERT_EQ_INT(kill(rs.pid, SIGSTOP), 0);
  double t0 = now_s();
  ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
  ASSERT(now_s() - t0 < 0.25); /* a start never waits for the Store */
  ASSERT_EQ_INT(encache_step_wait(step, 20), ENCACHE_EPENDING);
  ASSERT_EQ_INT(readable(fd, 10000), 1); /* ended by the Store's timeout */
  ASSERT_EQ_INT(encache_step_wait(step, 0), 0);
  if (now_s() - t0 > 5.0) /* one 0.3 s timeout, generous on a busy machine */
    test__fail(__FILE__, __LINE__, "the lookup took %.3f s", now_s() - t0);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_UNAVAILABLE);
  ASSERT_EQ_INT(kill(rs.pid, SIGCONT), 0);
  int hits = 0;
  for (int i = 0; i < 300 && hits != 2; i++) { /* past the backoff */
    ASSERT_EQ_INT(encache_lookup_start(step, c, 2, &a, r), 0);
    hits = encache_step_wait(step, -1);
    ASSERT(hits >= 0);
    free_hits(r, 2);
    if (hits != 2)
      usleep(100000);
  }
  ASSERT_EQ_INT(hits, 2);
  encache_step_close(step);
  ASSERT_EQ_INT(encache_close(e.ec), 0);
  aenv_done(&e);
  redis_server_stop(&rs);
}

/* ------------------------------------------------ a process killed */

/* The child: lookups started and waited on two steps, without end, on
 * the Store under test (one byte on `ready` after the first). */
static void killed_child(aenv *e, const encache_candidate *c, int ready) {
  char json[512];
  encache_options o = aenv_options(e, json, sizeof(json));
  encache *ec = NULL;
  if (encache__open_with_store(&o, ts_reopen(), &ec) != 0)
    _exit(2);
  encache_step *s[2] = {NULL, NULL};
  if (encache_step_open(ec, &s[0]) < 0 || encache_step_open(ec, &s[1]) < 0)
    _exit(3);
  encache_allocator a = ts_host_allocator();
  static encache_result r[2][4];
  for (unsigned k = 0;; k++) {
    encache_result *q = r[k % 2];
    q[0].size = sizeof(q[0]);
    if (encache_lookup_start(s[k % 2], c, 4, &a, q) < 0)
      _exit(4);
    if (k > 0) {
      encache_result *p = r[(k + 1) % 2];
      if (encache_step_wait(s[(k + 1) % 2], -1) != 4)
        _exit(5);
      for (int i = 0; i < 4; i++)
        free(p[i].data);
    }
    if (k == 1 && write(ready, "r", 1) != 1)
      _exit(6);
  }
}

/* Processes killed (SIGKILL) while their lookup threads read: the Store
 * and every other encoder go on, hits bit for bit. */
TEST(lookup_async_process_killed_mid_lookup) {
  const char *store = getenv("ENCACHE_TEST_STORE");
  if (store != NULL && strncmp(store, "shm://", 6) != 0) {
    printf("# skipped: the shm Store's test (%s is another)\n", store);
    return;
  }
  aenv e;
  encache *ec = aenv_open(&e);
  char ids[4][32];
  seed(&e, "ki", 4, 64, ids);
  encache_candidate c[4] = {cand(ids[0], 64), cand(ids[1], 64),
                            cand(ids[2], 64), cand(ids[3], 64)};
  unsigned seed_ = 29;
  for (int round = 0; round < 8; round++) {
    int p[2];
    ASSERT_EQ_INT(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      killed_child(&e, c, p[1]);
    }
    close(p[1]);
    char b;
    ASSERT_EQ_INT((int)read(p[0], &b, 1), 1); /* its lookups run */
    close(p[0]);
    usleep(rand_r(&seed_) % 3000);
    ASSERT_EQ_INT(kill(pid, SIGKILL), 0);
    int status;
    ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* This process's lookups: every one a hit, bit for bit. */
    encache_result x[4] = {ENCACHE_RESULT_INIT}, y[4] = {ENCACHE_RESULT_INIT};
    talloc t = {0};
    encache_allocator a = allocator(&t);
    encache_step *sx = step_of(ec), *sy = step_of(ec);
    ASSERT_EQ_INT(encache_lookup(sx, c, 4, &a, x), 4);
    ASSERT_EQ_INT(encache_lookup_start(sy, c, 4, &a, y), 0);
    ASSERT_EQ_INT(encache_step_wait(sy, -1), 4);
    same_results(c, x, y, 4);
    free_hits(x, 4);
    free_hits(y, 4);
    encache_step_close(sx);
    encache_step_close(sy);
  }
  /* The Store still takes writes and reads them back. */
  put(&e, "ki-after", ENCACHE_FLOAT32, 8, COLS, 8);
  encache_candidate c1 = cand("ki-after", 8);
  encache_result r1 = ENCACHE_RESULT_INIT;
  talloc t = {0};
  encache_allocator a = allocator(&t);
  encache_step *s = step_of(ec);
  ASSERT_EQ_INT(encache_lookup_start(s, &c1, 1, &a, &r1), 0);
  ASSERT_EQ_INT(encache_step_wait(s, -1), 1);
  same_results(&c1, &r1, &r1, 1);
  free_hits(&r1, 1);
  encache_step_close(s);
  ASSERT_EQ_INT(encache_close(ec), 0);
  aenv_done(&e);
}
