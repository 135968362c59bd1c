/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_encoder.c: one encoder process of the demo.  It serves its stream
 * of requests as a real encoder does: look the batch up, encode the
 * misses with the reference encoder, publish the new outputs, check hits
 * bit for bit against a fresh encode; then it reports to the parent.
 *
 * Hits land in destinations from a pool that is reused, as a serving
 * stack's tensor allocator (a caching allocator) hands out blocks it
 * already holds: the hit latency is then the lookup's, not the page
 * faults of fresh memory.  A destination goes back to the pool when the
 * encoder is done with the hit (or when the lookup releases it).
 *
 * The engine calls (open, lookup, publish, counters) each stand in one
 * small function below.
 */
#include "demo.h"
#include "hash.h"
#include "measure.h"

#include "encache.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------ the burst gate */

/* --burst: waits until every encoder has reached request `q` (at most
 * 10 s: an encoder that died does not stall the others for good). */
static void burst_gate(demo_shared *sh, int encoders, int q) {
  uint64_t want = (uint64_t)encoders * (uint64_t)(q + 1);
  __atomic_add_fetch(&sh->arrived, 1, __ATOMIC_ACQ_REL);
  double until = measure_now() + 10.0;
  struct timespec nap = {0, 50000}; /* 50 us */
  while (__atomic_load_n(&sh->arrived, __ATOMIC_ACQUIRE) < want &&
         measure_now() < until)
    nanosleep(&nap, NULL);
}

/* ------------------------------------------------ the destination pool */

#define POOL_CAP (2 * DEMO_MAX_BATCH)

/* Under `mu`: with --overlap the allocator's callbacks run on the
 * library's lookup thread while this encoder hands hits back. */
typedef struct dst_pool {
  pthread_mutex_t mu;
  void *free[POOL_CAP]; /* buffers not handed out, warm */
  int nfree;
  size_t bytes; /* each buffer's size: one output */
} dst_pool;

/* A new warm buffer (touched, as memory a serving stack has used is). */
static void *pool_new(const dst_pool *p) {
  void *b = malloc(p->bytes ? p->bytes : 1);
  if (b != NULL)
    memset(b, 0, p->bytes);
  return b;
}

static void pool_put(dst_pool *p, void *data) {
  pthread_mutex_lock(&p->mu);
  int kept = data != NULL && p->nfree < POOL_CAP;
  if (kept)
    p->free[p->nfree++] = data;
  pthread_mutex_unlock(&p->mu);
  if (!kept)
    free(data);
}

static int pool_init(dst_pool *p, size_t bytes) {
  memset(p, 0, sizeof(*p));
  pthread_mutex_init(&p->mu, NULL);
  p->bytes = bytes;
  for (int k = 0; k < DEMO_MAX_BATCH; k++) {
    void *b = pool_new(p);
    if (b == NULL)
      return -1;
    pool_put(p, b);
  }
  return 0;
}

static void pool_free(dst_pool *p) {
  while (p->nfree > 0)
    free(p->free[--p->nfree]);
  pthread_mutex_destroy(&p->mu);
}

static int pool_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **handle) {
  dst_pool *p = ctx;
  (void)i;
  (void)c;
  *handle = NULL;
  if (nbytes > p->bytes)
    return ENCACHE_EINVAL; /* not one of this encoder's outputs */
  pthread_mutex_lock(&p->mu);
  *data = p->nfree > 0 ? p->free[--p->nfree] : NULL;
  pthread_mutex_unlock(&p->mu);
  if (*data == NULL)
    *data = pool_new(p);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void pool_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  pool_put(ctx, data);
}

/* ---------------------------------------------------------- the worker */

/* One request: its images, their candidates and results, and its step.
 * With --overlap (the default) the next request's lookup is started
 * before this one's misses are encoded (docs/engine.md, "Lookups that do
 * not wait"), as an encoder with a queue of requests does. */
typedef struct request {
  int n;
  int pick[DEMO_MAX_BATCH];
  /* Per image: not yet published by this encoder when the lookup
   * started (a miss of it may be this encoder's own encode in between). */
  unsigned char fresh[DEMO_MAX_BATCH];
  encache_candidate c[DEMO_MAX_BATCH];
  encache_result res[DEMO_MAX_BATCH];
  encache_step *step;
  int started;   /* a started lookup not yet waited for */
  int rc;        /* the lookup's answer: hits, or a negative code */
  double t_wait; /* the time the step waited for its lookup */
} request;

typedef struct worker {
  const demo_opts *o;
  const image_set *set;
  int index;
  encache *ec; /* NULL: the baseline, without encache */
  demo_encoder enc;
  dst_pool pool;
  double *cdf;
  rng r;
  char *published; /* per image: this encoder published it */
  unsigned char *requested; /* per image: this encoder was asked for it */
  void *check;     /* a fresh encode, to verify a hit against */
  uint64_t nbytes;
  report rep;
  double *hit_lat, *miss_lat;
} worker;

/* The engine calls of the demo, each in one place. */
static encache *engine_open(const worker *w, const char *revision) {
  encache_options eo = ENCACHE_OPTIONS_INIT;
  char json[512];
  snprintf(json, sizeof(json),
           "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
           "\"ec_producer\", \"ec_connector_extra_config\": "
           "{\"cross_encoder_cache\": true, \"embedding_cache_prefix\": "
           "\"demo\", \"single_flight\": %s, \"single_flight_wait_ms\": %d}}",
           w->o->flight ? "true" : "false", w->o->flight_wait_ms);
  eo.ec_transfer_config = json;
  eo.model = "encache-demo/reference-encoder";
  eo.revision = revision;
  eo.model_dtype = w->o->dtype;
  char host_url[1024];
  if (demo_host_url(w->o, w->index % w->o->hosts, host_url,
                    sizeof(host_url)) < 0) {
    fprintf(stderr, "encache demo: encoder %d: the Store URL is too long\n",
            w->index);
    return NULL;
  }
  eo.store_url = host_url;
  encache *ec = NULL;
  if (encache_open(&eo, &ec) != 0) {
    fprintf(stderr, "encache demo: encoder %d: %s\n", w->index,
            encache_errmsg(NULL));
    return NULL;
  }
  return ec;
}

static encache_allocator engine_allocator(worker *w) {
  encache_allocator a = {sizeof(a), &w->pool, pool_alloc, pool_release, 0};
  return a;
}

/* Opens the request's step (closed by engine_step_done), unless open, and
 * looks c[0..n) up on it: started only when `start`. */
static int engine_lookup(worker *w, request *rq, const encache_candidate *c,
                         size_t n, encache_result *res, int start) {
  encache_allocator a = engine_allocator(w);
  int rc = rq->step != NULL ? 0 : encache_step_open(w->ec, &rq->step);
  if (rc < 0)
    return rc;
  return start ? encache_lookup_start(rq->step, c, n, &a, res)
               : encache_lookup(rq->step, c, n, &a, res);
}

static int engine_wait(request *rq) {
  return encache_step_wait(rq->step, -1);
}

static void engine_step_done(request *rq) {
  encache_step_close(rq->step);
  rq->step = NULL;
}

/* free() as the release callback of a published output. */
static void free_output(void *p) { free(p); }

static int engine_publish(worker *w, request *rq, const char *id, void *out) {
  encache_storage *s = NULL;
  int rc = encache_storage_new(out, w->nbytes, free_output, out, &s);
  if (rc < 0) {
    free(out);
    return rc;
  }
  int64_t shape[2] = {w->o->tokens, w->o->hidden};
  encache_tensor v = {sizeof v, out, w->o->dtype, 2, shape, NULL, 0, 0, NULL};
  rc = encache_publish(rq->step, id, &v, s);
  encache_storage_unref(s);
  return rc;
}

/* Flushes, copies the engine's counters into the report, closes. */
static void engine_finish(worker *w) {
  encache_stats st = ENCACHE_STATS_INIT;
  encache_flush(w->ec);
  encache_stats_get(w->ec, &st);
  w->rep.bytes_read = st.bytes_read;
  w->rep.published_written = st.published_written;
  w->rep.published_present = st.published_present;
  w->rep.published_failed = st.published_failed;
  w->rep.waited = st.waited;
  w->rep.waited_hits = st.waited_hits;
  w->rep.wait_us = st.wait_us;
  for (int k = 1; k < ENCACHE_SKIP_REASONS_; k++)
    w->rep.skipped[k] = encache_stats_skipped(&st, k);
  demo_tier_counts(w->ec, &w->rep);
  if (encache_close(w->ec) != 0) {
    w->rep.poisoned = 1;
    w->rep.failed = 1;
  }
  w->ec = NULL;
}

/* A failed engine call: its message, and the encoder stops. */
static void engine_failed(worker *w, const char *what, int rc) {
  fprintf(stderr, "encache demo: encoder %d: %s: %s\n", w->index, what,
          encache_errmsg(w->ec));
  w->rep.failed = 1;
  w->rep.poisoned = rc == ENCACHE_EPOISONED;
}

/* A hit: checked against a fresh encode when the sample says so, then its
 * destination goes back to the pool. */
static void on_hit(worker *w, int pick, encache_result *res, double t_lookup) {
  const image *im = &w->set->img[pick];
  w->rep.hits++;
  if (w->published[pick])
    w->rep.hits_own++;
  else
    w->rep.hits_other++;
  w->hit_lat[w->rep.nhit_lat++] = t_lookup;
  if (w->o->verify == VERIFY_ALL ||
      (w->o->verify == VERIFY_SAMPLE && w->rep.hits % 8 == 1)) {
    demo_encode(&w->enc, w->set, im, w->check);
    w->rep.verified++;
    if (memcmp(w->check, res->data, w->nbytes) != 0) {
      w->rep.verify_failed++;
      fprintf(stderr, "encache demo: encoder %d: VERIFICATION FAILED: the "
                      "hit for %s differs from a fresh encode\n",
              w->index, im->id);
    }
  }
  pool_put(&w->pool, res->data);
}

/* A miss: encoded into a new output (NULL after a message). */
static void *encode_miss(worker *w, int pick, double t_lookup) {
  double te = measure_now();
  void *out = malloc(w->nbytes);
  if (out == NULL) {
    fprintf(stderr, "encache demo: encoder %d: out of memory\n", w->index);
    w->rep.failed = 1;
    return NULL;
  }
  demo_encode(&w->enc, w->set, &w->set->img[pick], out);
  double dt = measure_now() - te;
  w->rep.encodes++;
  w->rep.encode_s += dt;
  w->miss_lat[w->rep.nmiss_lat++] = t_lookup + dt;
  return out;
}

/* Publishes the output of image `pick` on rq's step. */
static void publish_output(worker *w, request *rq, int pick, void *out) {
  if (w->ec == NULL || w->rep.failed) {
    free(out);
    return;
  }
  int pq = engine_publish(w, rq, w->set->img[pick].id, out);
  if (pq == ENCACHE_QUEUED)
    w->published[pick] = 1;
  if (pq < 0)
    engine_failed(w, "publish", pq);
}

/* Looks c[0..n) up on rq's step: started only (rq->started) when
 * `start`; the blocking lookup's time into rq->t_wait.  Returns 0, or -1
 * after a message. */
static int lookup_batch(worker *w, request *rq, const encache_candidate *c,
                        size_t n, encache_result *res, int start) {
  rq->t_wait = 0;
  if (w->ec == NULL)
    return 0;
  double t0 = measure_now();
  int rc = engine_lookup(w, rq, c, n, res, start);
  if (rc >= 0 && start) {
    rq->started = 1;
    return 0;
  }
  rq->t_wait = measure_now() - t0;
  w->rep.lookup_wait_s += rq->t_wait;
  if (rc >= 0)
    return 0;
  engine_failed(w, "lookup", rc);
  return -1;
}

/* Waits for rq's started lookup, if any: the time the step still waited
 * for the Store into rq->t_wait.  Returns 0, or -1 after a message. */
static int lookup_complete(worker *w, request *rq) {
  if (!rq->started)
    return rq->rc;
  double t0 = measure_now();
  int rc = engine_wait(rq);
  rq->started = 0;
  rq->t_wait = measure_now() - t0;
  w->rep.lookup_wait_s += rq->t_wait;
  w->rep.lookups_ahead++;
  if (rc >= 0)
    return 0;
  engine_failed(w, "lookup", rc);
  return -1;
}

/* Whether res[k] of rq waits for a second lookup: IN_FLIGHT with single
 * flight (another encoder is encoding it), or a MISS of an image this
 * encoder published after rq's lookup started (the lookup ran while this
 * encoder was encoding it). */
static int look_again(const worker *w, const request *rq, int k) {
  int outcome = rq->res[k].outcome;
  return outcome == ENCACHE_IN_FLIGHT ||
         (outcome == ENCACHE_MISS && rq->fresh[k] && w->published[rq->pick[k]]);
}

/* Serves res[k] of the request (k in want[0..n)): hits checked, misses
 * encoded (all of them first, then published: a publication waits for a
 * lookup started meanwhile).  With `defer`, leaves in *later the ones to
 * look up again (look_again) once this encoder's own are published. */
static void serve_results(worker *w, request *rq, const int *pick,
                          encache_result *res, const int *want, int n,
                          double t_lookup, int defer, int *later,
                          int *nlater) {
  void *out[DEMO_MAX_BATCH];
  int outpick[DEMO_MAX_BATCH], nout = 0;
  for (int j = 0; j < n && !w->rep.failed; j++) {
    int k = want[j];
    if (defer && look_again(w, rq, k)) {
      later[(*nlater)++] = k;
      continue;
    }
    w->rep.images++;
    if (w->ec != NULL)
      w->rep.outcome[res[k].outcome]++;
    if (res[k].outcome == ENCACHE_HIT) {
      on_hit(w, pick[k], &res[k], t_lookup);
      continue;
    }
    /* The same image twice in one request is encoded once, as a serving
     * stack dedupes a batch by its content hash. */
    int again = 0;
    for (int e = 0; e < j && !again; e++)
      again = pick[want[e]] == pick[k] && res[want[e]].outcome != ENCACHE_HIT;
    if (!again && (out[nout] = encode_miss(w, pick[k], t_lookup)) != NULL)
      outpick[nout++] = pick[k];
  }
  for (int k = 0; k < nout; k++)
    publish_output(w, rq, outpick[k], out[k]);
}

/* Draws the next request of 1 to DEMO_MAX_BATCH images into rq. */
static void request_draw(worker *w, request *rq) {
  int n = 1 + (int)(rng_next(&w->r) % DEMO_MAX_BATCH);
  rq->n = n;
  rq->started = 0;
  rq->rc = 0;
  for (int k = 0; k < n; k++) {
    int pick = demo_zipf_pick(w->cdf, w->set->n, &w->r);
    rq->pick[k] = pick;
    rq->fresh[k] = !w->published[pick];
    if (!w->requested[pick]) {
      w->requested[pick] = 1;
      w->rep.distinct++;
    }
    encache_candidate cc = {sizeof(cc), w->set->img[pick].id,
                            ENCACHE_MODALITY_IMAGE, w->o->dtype,
                            (uint64_t)w->o->tokens, (uint64_t)w->o->hidden,
                            ENCACHE_DEVICE_HOST, 0};
    rq->c[k] = cc;
    rq->res[k].size = sizeof(rq->res[k]);
    rq->res[k].outcome = ENCACHE_MISS;
  }
}

/* Draws rq and looks it up: started when `start`, else done (its answer
 * in rq->rc). */
static void request_begin(worker *w, request *rq, int start) {
  request_draw(w, rq);
  rq->rc = lookup_batch(w, rq, rq->c, (size_t)rq->n, rq->res, start);
}

/* Serves rq, whose lookup has completed: encodes its misses (while `next`,
 * when given, has its lookup started), publishes them, then looks up
 * again what was deferred. */
static void request_serve(worker *w, request *rq, request *next) {
  int n = rq->n, all[DEMO_MAX_BATCH], later[DEMO_MAX_BATCH], nlater = 0;
  for (int k = 0; k < n; k++)
    all[k] = k;
  int ok = lookup_complete(w, rq) == 0;
  if (next != NULL && ok)
    request_begin(w, next, 1);
  if (ok)
    serve_results(w, rq, rq->pick, rq->res, all, n, rq->t_wait, 1, later,
                  &nlater);
  if (nlater > 0 && !w->rep.failed) {
    /* The images another encoder was encoding (single flight), or this
     * one was while the lookup ran, looked up again (now waiting for
     * their output) after this encoder's own are published. */
    encache_candidate c2[DEMO_MAX_BATCH];
    encache_result r2[DEMO_MAX_BATCH];
    int pick2[DEMO_MAX_BATCH], idx[DEMO_MAX_BATCH];
    for (int j = 0; j < nlater; j++) {
      c2[j] = rq->c[later[j]];
      pick2[j] = rq->pick[later[j]];
      idx[j] = j;
      r2[j].size = sizeof(r2[j]);
    }
    double t1 = rq->t_wait;
    w->rep.looked_again += (uint64_t)nlater;
    if (lookup_batch(w, rq, c2, (size_t)nlater, r2, 0) == 0)
      serve_results(w, rq, pick2, r2, idx, nlater, t1 + rq->t_wait, 0, NULL,
                    NULL);
  }
  if (rq->step != NULL)
    engine_step_done(rq);
  w->rep.requests++;
}

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r <= 0 && errno != EINTR)
      return;
    if (r > 0) {
      c += r;
      n -= (size_t)r;
    }
  }
}

static int worker_init(worker *w, const demo_opts *o, const image_set *set,
                       int index) {
  memset(w, 0, sizeof(*w));
  w->o = o;
  w->set = set;
  w->index = index;
  w->nbytes = (uint64_t)o->tokens * (uint64_t)o->hidden *
              encache_dtype_size(o->dtype);
  size_t max_lat = (size_t)o->requests * DEMO_MAX_BATCH;
  w->hit_lat = malloc(sizeof(double) * max_lat);
  w->miss_lat = malloc(sizeof(double) * max_lat);
  w->cdf = demo_zipf_table(set->n, o->skew);
  w->published = calloc((size_t)set->n, 1);
  w->requested = calloc((size_t)set->n, 1);
  w->check = malloc(w->nbytes);
  /* A burst gives every encoder the same stream. */
  w->r.s = demo_mix64(o->seed * 1000003u + (o->burst ? 0u : (unsigned)index));
  if (!w->hit_lat || !w->miss_lat || !w->cdf || !w->published ||
      !w->requested || !w->check ||
      demo_encoder_init(&w->enc, o) < 0 || pool_init(&w->pool, w->nbytes) < 0) {
    fprintf(stderr, "encache demo: encoder %d: out of memory\n", index);
    return -1;
  }
  return 0;
}

static void worker_free(worker *w) {
  pool_free(&w->pool);
  demo_encoder_free(&w->enc);
  free(w->hit_lat);
  free(w->miss_lat);
  free(w->cdf);
  free(w->published);
  free(w->requested);
  free(w->check);
}

int demo_encoder_run(const demo_opts *o, const image_set *set, int index,
                     int use_cache, const char *revision, demo_shared *sh,
                     int fd) {
  static worker w;
  if (worker_init(&w, o, set, index) < 0)
    w.rep.failed = 1;
  else if (use_cache && (w.ec = engine_open(&w, revision)) == NULL)
    w.rep.failed = 1;
  double t_start = measure_now();
  /* --overlap: request q+1's lookup runs while q's misses are encoded
   * (request_serve).  Not with --burst: its gate starts every request of
   * the fleet at the same moment. */
  int overlap = o->overlap && !o->burst;
  static request rqs[2];
  request *cur = &rqs[0], *next = &rqs[1];
  if (overlap && !w.rep.failed)
    request_begin(&w, cur, 1);
  int q = 0;
  for (; q < o->requests && !w.rep.failed; q++) {
    if (o->burst)
      burst_gate(sh, o->encoders, q);
    if (!overlap)
      request_begin(&w, cur, 0);
    request_serve(&w, cur, overlap && q + 1 < o->requests ? next : NULL);
    __atomic_add_fetch(&sh->done[index], 1, __ATOMIC_RELAXED);
    request *t = cur;
    cur = next;
    next = t;
  }
  for (int k = 0; k < 2; k++) /* a lookup started before a failure */
    if (rqs[k].step != NULL)
      engine_step_done(&rqs[k]);
  /* An encoder that stops early arrives at every gate left, so that the
   * others never wait for it. */
  if (o->burst && q < o->requests)
    __atomic_add_fetch(&sh->arrived, (uint64_t)(o->requests - q),
                       __ATOMIC_RELEASE);
  if (w.ec != NULL)
    engine_finish(&w);
  w.rep.wall_s = measure_now() - t_start;
  write_all(fd, &w.rep, sizeof(w.rep));
  write_all(fd, w.hit_lat, sizeof(double) * w.rep.nhit_lat);
  write_all(fd, w.miss_lat, sizeof(double) * w.rep.nmiss_lat);
  worker_free(&w);
  return w.rep.failed || w.rep.verify_failed ? 1 : 0;
}
