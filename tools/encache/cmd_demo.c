/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encache demo: a fleet of encoder processes sharing one Store.
 *
 * Each encoder serves a stream of requests of 1 to 4 images drawn with a
 * Zipf popularity from a set of images, and does what a real encoder
 * does: identify each image by a content hash of its decoded pixels and
 * preprocessing parameters, look the batch up, encode the misses with the
 * reference encoder, publish the new outputs, and check hits bit for bit
 * against a fresh encode.  The same workload then runs without encache
 * (the baseline) for comparison.
 *
 * This file holds the command: its options and the report.  The parts it
 * calls are the demo's library, tools/demo/ (listed in its demo.h).
 */
#include "demo.h"
#include "measure.h"
#include "commands.h"

#include "encache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

/* The figures of the report, computed once for both formats. */
typedef struct figures {
  double thr, bthr, hp50, hp99, mp50, mp99, saved;
  uint64_t skipped;
} figures;

static figures compute(phase *c, phase *b) {
  figures f;
  report *t = &c->total;
  measure hit = {c->hit_lat, (int)c->nhit, (int)c->nhit};
  measure miss = {c->miss_lat, (int)c->nmiss, (int)c->nmiss};
  f.thr = (double)t->images / c->wall_s;
  f.bthr = b ? (double)b->total.images / b->wall_s : 0;
  f.hp50 = measure_pct(&hit, 50) * 1e3;
  f.hp99 = measure_pct(&hit, 99) * 1e3;
  f.mp50 = measure_pct(&miss, 50) * 1e3;
  f.mp99 = measure_pct(&miss, 99) * 1e3;
  f.saved = b ? b->total.encode_s - t->encode_s
              : (double)t->hits *
                    (t->encodes ? t->encode_s / (double)t->encodes : 0);
  f.skipped = 0;
  for (int k = 1; k < ENCACHE_SKIP_REASONS_; k++)
    f.skipped += t->skipped[k];
  return f;
}

static void summary_json(const demo_opts *o, const char *url,
                         const image_set *set, const report *t, phase *b,
                         const figures *f, int verified_ok) {
  const char *dt = encache_dtype_name(o->dtype);
  printf("{\n  \"store\": \"%s\",\n  \"encoder\": \"reference (a deterministic "
         "CPU stand-in for a vision tower)\",\n", url);
  printf("  \"workload\": {\"encoders\": %d, \"requests_per_encoder\": %d, "
         "\"images\": %d, \"tokens\": %d, \"hidden\": %d, \"dtype\": \"%s\", "
         "\"skew\": %g},\n", o->encoders, o->requests, set->n, o->tokens,
         o->hidden, dt, o->skew);
  printf("  \"requests\": %" PRIu64 ",\n  \"images\": %" PRIu64 ",\n",
         t->requests, t->images);
  printf("  \"hits\": {\"total\": %" PRIu64 ", \"published_by_other_encoders\": "
         "%" PRIu64 ", \"published_by_same_encoder\": %" PRIu64 "},\n",
         t->hits, t->hits_other, t->hits_own);
  printf("  \"misses\": {\"miss\": %" PRIu64 ", \"incompatible\": %" PRIu64
         ", \"oversize\": %" PRIu64 ", \"unavailable\": %" PRIu64
         ", \"skipped\": %" PRIu64 "},\n",
         t->outcome[ENCACHE_MISS], t->outcome[ENCACHE_INCOMPATIBLE],
         t->outcome[ENCACHE_OVERSIZE], t->outcome[ENCACHE_UNAVAILABLE],
         t->outcome[ENCACHE_SKIPPED]);
  uint64_t avoided = t->images - t->encodes, hits = t->hits_other + t->hits_own;
  printf("  \"encodes\": %" PRIu64 ",\n  \"encodes_avoided\": %" PRIu64
         ",\n  \"repeats_within_a_request\": %" PRIu64 ",\n",
         t->encodes, avoided, avoided > hits ? avoided - hits : 0);
  printf("  \"encoder_seconds\": %.3f,\n  \"encoder_seconds_saved\": %.3f,\n",
         t->encode_s, f->saved);
  printf("  \"throughput_images_per_s\": %.1f,\n", f->thr);
  if (b)
    printf("  \"baseline_throughput_images_per_s\": %.1f,\n  \"speedup\": %.2f,\n",
           f->bthr, f->thr / f->bthr);
  printf("  \"hit_latency_ms\": {\"p50\": %.3f, \"p99\": %.3f},\n", f->hp50, f->hp99);
  printf("  \"miss_latency_ms\": {\"p50\": %.3f, \"p99\": %.3f},\n", f->mp50, f->mp99);
  printf("  \"lookups\": {\"started_ahead\": %" PRIu64 ", \"looked_again\": %"
         PRIu64 ", \"store_wait_seconds\": %.6f},\n", t->lookups_ahead,
         t->looked_again, t->lookup_wait_s);
  printf("  \"bytes_read\": %" PRIu64 ",\n  \"publications\": {\"written\": %" PRIu64
         ", \"already_present\": %" PRIu64 ", \"failed\": %" PRIu64,
         t->bytes_read, t->published_written, t->published_present,
         t->published_failed);
  static const char *const skip_ids[] = {
#define SKIP_ID_(name, value, msg) [value] = #name,
      ENCACHE_SKIP_MAP(SKIP_ID_)
#undef SKIP_ID_
  };
  for (int k = 1; k < ENCACHE_SKIP_REASONS_; k++)
    if (t->skipped[k])
      printf(", \"skipped_%s\": %" PRIu64, skip_ids[k], t->skipped[k]);
  if (t->tier_local + t->tier_remote > 0)
    printf("},\n  \"tier\": {\"hosts\": %d, \"local_hits\": %" PRIu64
           ", \"remote_hits\": %" PRIu64 ", \"promoted\": %" PRIu64, o->hosts,
           t->tier_local, t->tier_remote, t->tier_promoted);
  printf("},\n  \"verification\": {\"mode\": \"%s\", \"checked\": %" PRIu64
         ", \"failed\": %" PRIu64 ", \"passed\": %s}\n}\n",
         o->verify == VERIFY_ALL ? "all" : o->verify == VERIFY_SAMPLE ? "sample" : "none",
         t->verified, t->verify_failed, verified_ok ? "true" : "false");
}

static void human_bytes(char *buf, size_t size, uint64_t b) {
  if (b >= (1ull << 30))
    snprintf(buf, size, "%.2f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, size, "%.1f MiB", (double)b / (1ull << 20));
  else
    snprintf(buf, size, "%.1f KiB", (double)b / 1024);
}

static void summary_text(const demo_opts *o, const char *url,
                         const image_set *set, const report *t, phase *b,
                         const figures *f, int verified_ok) {
  const char *dt = encache_dtype_name(o->dtype);
  char rb[32], wb[32];
  human_bytes(rb, sizeof(rb), t->bytes_read);
  uint64_t out_bytes = (uint64_t)o->tokens * (uint64_t)o->hidden *
                       encache_dtype_size(o->dtype);
  human_bytes(wb, sizeof(wb), t->published_written * (out_bytes + 24));
  printf("\nencache demo: %d encoders sharing %s\n", o->encoders, url);
  printf("encoder: the reference encoder, a deterministic CPU stand-in for a "
         "vision tower (not a model)\n");
  printf("workload: %d requests per encoder, 1-4 images each from %d images "
         "(Zipf s=%g), %d tokens x %d hidden, %s\n\n", o->requests, set->n,
         o->skew, o->tokens, o->hidden, dt);
  /* The baseline's column, when there is one. */
  char bq[32] = "", bi[32] = "", be[32] = "", bt[32] = "", bthr_s[32] = "";
  if (b) {
    snprintf(bq, sizeof(bq), "%20" PRIu64, b->total.requests);
    snprintf(bi, sizeof(bi), "%20" PRIu64, b->total.images);
    snprintf(be, sizeof(be), "%20" PRIu64, b->total.encodes);
    snprintf(bt, sizeof(bt), "%19.2fs", b->total.encode_s);
    snprintf(bthr_s, sizeof(bthr_s), "%20.1f", f->bthr);
  }
  printf("%-30s %16s %20s\n", "", "with encache", b ? "without (baseline)" : "");
  printf("%-30s %16" PRIu64 " %s\n", "requests", t->requests, bq);
  printf("%-30s %16" PRIu64 " %s\n", "images", t->images, bi);
  printf("%-30s %16" PRIu64 " %s\n", "encoder runs", t->encodes, be);
  printf("%-30s %9" PRIu64 " (%4.1f%%)\n", "encodes avoided",
         t->images - t->encodes,
         t->images ? 100.0 * (double)(t->images - t->encodes) / (double)t->images : 0);
  /* The three rows below add up to the one above: an image that repeats
   * within one request is encoded (or found) once for all its copies. */
  uint64_t avoided = t->images - t->encodes, hits = t->hits_other + t->hits_own;
  printf("%-30s %16" PRIu64 "\n", "  hits from other encoders", t->hits_other);
  printf("%-30s %16" PRIu64 "\n", "  hits of own publications", t->hits_own);
  printf("%-30s %16" PRIu64 "\n", "  repeats within a request",
         avoided > hits ? avoided - hits : 0);
  printf("%-30s %16s\n", "misses by reason", "");
  static const char *const names[] = {"",         "miss",
                                      "incompatible", "oversize",
                                      "unavailable",  "skipped",
                                      "in flight"};
  for (int k = 1; k <= ENCACHE_IN_FLIGHT; k++)
    printf("  %-28s %16" PRIu64 "\n", names[k], t->outcome[k]);
  printf("%-30s %15.2fs %s\n", "encoder time", t->encode_s, bt);
  printf("%-30s %15.2fs%s\n", "encoder time saved", f->saved,
         b ? "" : "  (estimated: hits x mean encode time)");
  printf("%-30s %16.1f %s\n", "throughput (images/s)", f->thr, bthr_s);
  if (b)
    printf("%-30s %15.2fx\n", "speed-up", f->thr / f->bthr);
  printf("%-30s %9.3f / %.3f ms\n", "hit latency p50 / p99", f->hp50, f->hp99);
  printf("%-30s %9.3f / %.3f ms\n", "miss latency p50 / p99", f->mp50, f->mp99);
  printf("%-30s %15.3fs  (%.3f ms a request; %s)\n",
         "store time steps waited", t->lookup_wait_s,
         t->requests ? t->lookup_wait_s * 1e3 / (double)t->requests : 0,
         t->lookups_ahead ? "lookups started ahead, overlapping encodes"
                          : "blocking lookups");
  if (t->looked_again)
    printf("%-30s %16" PRIu64 "  (single flight, or encoded here while "
           "looked up)\n", "  images looked up again", t->looked_again);
  printf("%-30s %16s\n", "bytes read", rb);
  if (t->tier_local + t->tier_remote > 0)
    printf("%-30s %9" PRIu64 " local, %" PRIu64 " remote (%" PRIu64
           " promoted; %d host%s)\n", "store hits by tier", t->tier_local,
           t->tier_remote, t->tier_promoted, o->hosts, o->hosts > 1 ? "s" : "");
  printf("%-30s %16s  (%" PRIu64 " objects; %" PRIu64 " already present)\n",
         "bytes published", wb, t->published_written, t->published_present);
  printf("%-30s %16" PRIu64, "publications skipped", f->skipped + t->published_failed);
  for (int k = 1; k < ENCACHE_SKIP_REASONS_; k++)
    if (t->skipped[k])
      printf("  %s: %" PRIu64, encache_skip_name(k), t->skipped[k]);
  if (t->published_failed)
    printf("  store failed: %" PRIu64, t->published_failed);
  printf("\n%-30s %s (%" PRIu64 " hits checked bit for bit against a fresh "
         "encode)\n", "verification", verified_ok ? "passed" : "FAILED",
         t->verified);
}

static const char demo_usage[] =
    "usage: encache [--store URL] demo [OPTIONS]\n"
    "\n"
    "Runs a fleet of encoder processes that share one Store: each serves\n"
    "requests of 1 to 4 images drawn with a Zipf popularity, looks them up,\n"
    "encodes the misses with the reference encoder (a deterministic CPU\n"
    "stand-in for a vision tower, not a model), publishes the new outputs,\n"
    "and checks hits bit for bit against a fresh encode.  Then the same\n"
    "workload runs without encache, and a summary compares the two.\n"
    "Without --store, a private shared-memory Store is made and removed.\n"
    "\n"
    "  --encoders N       encoder processes (default 4)\n"
    "  --requests N       requests per encoder (default 100)\n"
    "  --images N|DIR     N procedural images (default 48), or the PNG/JPEG\n"
    "                     files of DIR\n"
    "  --tokens N         output tokens per image (default 64)\n"
    "  --hidden N         hidden size (default 768)\n"
    "  --dtype DTYPE      float32 (default), float16 or bfloat16\n"
    "  --skew S           Zipf exponent of image popularity (default 1.1)\n"
    "  --verify MODE      all, sample (default: every 8th hit) or none\n"
    "  --no-baseline      skip the run without encache\n"
    "  --overlap          (the default) each encoder starts the next\n"
    "                     request's lookup (encache_lookup_start) before it\n"
    "                     encodes the current one's misses, so the Store's\n"
    "                     reads overlap encoding; the summary shows the Store\n"
    "                     time the steps still waited for\n"
    "  --no-overlap       look each request up only when it is served (the\n"
    "                     blocking lookup), to compare\n"
    "  --burst            every encoder gets the same requests at the same\n"
    "                     moment (new images reaching a fleet at once); the\n"
    "                     fleet runs without, then with single flight (one\n"
    "                     encoder encodes, the others wait up to 5 s for its\n"
    "                     output) and the summary compares duplicate encodes\n"
    "  --seed N           workload seed (default 1)\n"
    "  --hosts N          with --store tier:shm://NAME?...+REMOTE: N simulated\n"
    "                     hosts (1 to 16), each its own shm tier NAME-h0,\n"
    "                     NAME-h1, ... (removed after the run) in front of\n"
    "                     the one REMOTE; encoder i runs on host i mod N; the\n"
    "                     summary adds hits per tier (default 1)\n"
    "  --json             print the summary as JSON\n"
    "Exit status: 0 when it ran and verification passed, 1 otherwise.\n";


enum {
  D_ENCODERS, D_REQUESTS, D_IMAGES, D_TOKENS, D_HIDDEN, D_DTYPE, D_SKEW,
  D_VERIFY, D_BASELINE, D_NO_BASELINE, D_SEED, D_BURST, D_HOSTS, D_OVERLAP,
  D_NO_OVERLAP
};

static const tool_opt demo_opts_table[] = {
    [D_ENCODERS] = {"encoders", 1}, [D_REQUESTS] = {"requests", 1},
    [D_IMAGES] = {"images", 1},     [D_TOKENS] = {"tokens", 1},
    [D_HIDDEN] = {"hidden", 1},     [D_DTYPE] = {"dtype", 1},
    [D_SKEW] = {"skew", 1},         [D_VERIFY] = {"verify", 1},
    [D_BASELINE] = {"baseline", 0}, [D_NO_BASELINE] = {"no-baseline", 0},
    [D_SEED] = {"seed", 1},         [D_BURST] = {"burst", 0},
    [D_HOSTS] = {"hosts", 1},       [D_OVERLAP] = {"overlap", 0},
    [D_NO_OVERLAP] = {"no-overlap", 0},
    {NULL, 0}};

/* An integer option, when given, into *out; -1 after a message. */
static int int_opt(const tool_args *a, int which, const char *name, int lo,
                   int hi, int *out) {
  const char *v = a->val[which];
  return v == NULL ? 0 : tool_int32("demo", name, v, lo, hi, out);
}

/* The demo's options into o; -1 after a message naming the option. */
static int demo_args(const tool_args *a, demo_opts *o) {
  demo_opts d = {4, 100, 48, 64, 768, ENCACHE_FLOAT32, VERIFY_SAMPLE, 1,
                 1.1, 1, NULL, NULL, 0, 0, 0, 1, 1};
  *o = d;
  int seed = 1;
  const char *images = a->val[D_IMAGES], *v;
  if (images != NULL && !(images[0] >= '0' && images[0] <= '9'))
    o->images_dir = images;
  else if (int_opt(a, D_IMAGES, "--images", 1, 1000000, &o->images) < 0)
    return -1;
  if (int_opt(a, D_ENCODERS, "--encoders", 1, DEMO_MAX_ENCODERS,
              &o->encoders) < 0 ||
      int_opt(a, D_REQUESTS, "--requests", 1, 10000000, &o->requests) < 0 ||
      int_opt(a, D_TOKENS, "--tokens", 1, 65536, &o->tokens) < 0 ||
      int_opt(a, D_HIDDEN, "--hidden", 1, 65536, &o->hidden) < 0 ||
      int_opt(a, D_SEED, "--seed", 0, INT32_MAX, &seed) < 0 ||
      int_opt(a, D_HOSTS, "--hosts", 1, 16, &o->hosts) < 0)
    return -1;
  o->seed = (unsigned)seed;
  if ((v = a->val[D_DTYPE]) != NULL && (o->dtype = encache_dtype_parse(v)) < 0)
    return usage_error("demo", "--dtype: unknown dtype \"%s\"", v), -1;
  if ((v = a->val[D_SKEW]) != NULL) {
    char *end;
    o->skew = strtod(v, &end);
    if (end == v || *end != '\0' || !(o->skew >= 0) || o->skew > 10)
      return usage_error("demo", "--skew: must be a number from 0 to 10, got "
                                 "\"%s\"", v), -1;
  }
  if ((v = a->val[D_VERIFY]) != NULL) {
    static const char *const modes[] = {"none", "sample", "all"};
    int k = 0;
    while (k < 3 && strcmp(v, modes[k]) != 0)
      k++;
    if (k == 3)
      return usage_error("demo", "--verify: all, sample or none, got \"%s\"",
                         v), -1;
    o->verify = k; /* VERIFY_NONE, VERIFY_SAMPLE, VERIFY_ALL */
  }
  if (a->val[D_NO_BASELINE] != NULL && a->val[D_BASELINE] != NULL)
    return usage_error("demo", "--baseline and --no-baseline: give one"), -1;
  o->baseline = a->val[D_NO_BASELINE] == NULL;
  o->burst = a->val[D_BURST] != NULL;
  if (a->val[D_NO_OVERLAP] != NULL && a->val[D_OVERLAP] != NULL)
    return usage_error("demo", "--overlap and --no-overlap: give one"), -1;
  o->overlap = a->val[D_NO_OVERLAP] == NULL;
  if (o->burst && a->val[D_BASELINE] != NULL)
    return usage_error("demo", "--burst compares single flight off and on: "
                               "it has no --baseline"), -1;
  if (o->hosts > 1 && o->burst)
    return usage_error("demo", "--hosts and --burst: give one"), -1;
  return 0;
}

/* Opens the Store at url and asks it about one key, in a child process
 * (a Store's library may start threads, and the encoders are forked
 * later).  Returns 0, or -1 with the Store's reason in why: a Store that
 * cannot be opened or answers nothing stops the demo before it starts. */
static int store_probe(const char *url, char *why, size_t size) {
  int p[2];
  if (pipe(p) != 0)
    return snprintf(why, size, "pipe: %s", strerror(errno)), -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    char msg[1024] = "";
    encache_store *st = NULL;
    int rc = encache_store_open(url, &st);
    const char *key = "encache-demo-probe";
    int present = 0;
    if (rc == 0 && (rc = encache_store_exists(st, &key, 1, &present)) == 0 &&
        present < 0)
      rc = present;
    if (rc < 0) {
      const char *m = encache_store_errmsg(st);
      snprintf(msg, sizeof(msg), "%s", m[0] ? m : encache_strerror(rc));
    }
    encache_store_close(st);
    if (write(p[1], msg, strlen(msg)) < 0) { /* the parent sees nothing */
    }
    _exit(rc < 0 ? 1 : 0);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return snprintf(why, size, "fork: %s", strerror(errno)), -1;
  }
  size_t len = 0;
  ssize_t r;
  while (len + 1 < size && (r = read(p[0], why + len, size - 1 - len)) > 0)
    len += (size_t)r;
  why[len] = '\0';
  close(p[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return 0;
  if (why[0] == '\0')
    snprintf(why, size, "the probe process failed (status %d)", status);
  return -1;
}

/* The keys of a run's namespace, collected before any is removed (a
 * listing is not promised to survive removals). */
typedef struct key_list {
  char **keys;
  size_t n, cap;
  int oom;
} key_list;

static int collect_key(const char *key, uint64_t len, void *arg) {
  (void)len;
  key_list *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **k = realloc(l->keys, cap * sizeof(*k));
    if (k == NULL)
      return l->oom = 1;
    l->keys = k;
    l->cap = cap;
  }
  if ((l->keys[l->n] = strdup(key)) == NULL)
    return l->oom = 1;
  l->n++;
  return 0;
}

/* Removes the run's objects (its revision) from a Store the user gave,
 * so that a demo leaves nothing behind; says so when it cannot. */
static void clean_namespace(const char *url, const char *shown,
                            const char *revision) {
  char pattern[128];
  snprintf(pattern, sizeof(pattern), "*@revision:%s@*", revision);
  encache_store *st = NULL;
  key_list l = {NULL, 0, 0, 0};
  int rc = encache_store_open(url, &st);
  if (rc == 0)
    rc = encache_store_list(st, pattern, collect_key, &l);
  size_t removed = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (rc == 0 && encache_store_remove(st, l.keys[i]) == 0)
      removed++;
    free(l.keys[i]);
  }
  free(l.keys);
  if (rc != 0 || l.oom || removed < l.n)
    fprintf(stderr, "encache demo: the run's objects (keys '%s') may be left "
            "in %s: %s\n", pattern, shown,
            rc == 0 ? "some could not be removed"
            : rc == ENCACHE_EINVAL ? "this Store cannot list its keys"
                                   : encache_store_errmsg(st));
  encache_store_close(st);
}

/* store_probe() on every simulated host's Store (the one given when
 * --hosts is 1). */
static int hosts_probe(const demo_opts *o, char *why, size_t size) {
  for (int h = 0; h < o->hosts; h++) {
    char url[1024];
    if (demo_host_url(o, h, url, sizeof(url)) < 0)
      return snprintf(why, size, "the Store URL is too long"), -1;
    if (store_probe(url, why, size) < 0)
      return -1;
  }
  return 0;
}

/* clean_namespace() through the first host's Store (the one given when
 * --hosts is 1; a tier removes from both its tiers), then the simulated
 * hosts' segments, which are the demo's. */
static void hosts_clean(const demo_opts *o, const char *shown,
                        const char *revision) {
  char url[1024], seg[256];
  if (demo_host_url(o, 0, url, sizeof(url)) == 0)
    clean_namespace(url, shown, revision);
  for (int h = 0; h < o->hosts; h++)
    if (demo_host_segment(o, h, seg, sizeof(seg)) == 0)
      encache_shm_destroy(seg);
}

/* --burst (tools/demo/demo_burst.c) on url, then its objects removed (or the
 * demo's own segment destroyed); the exit status. */
static int run_burst(demo_opts *o, image_set *set, const char *url,
                     const char *shown, const char *own_name, int json) {
  char revisions[2][64] = {"", ""};
  int rc = demo_burst_run(o, set, shown, json, revisions);
  for (int f = 0; f < 2 && !own_name[0]; f++)
    if (revisions[f][0])
      clean_namespace(url, shown, revisions[f]);
  if (own_name[0])
    encache_shm_destroy(own_name);
  demo_images_free(set);
  return rc == 0 ? EXIT_OK : EXIT_FAIL;
}

/* The Store of the run: the one given, or a private shm segment sized
 * for every output twice over (its name in own_name, its URL in
 * own_url). */
static const char *demo_store(const tool_globals *g, const demo_opts *o,
                              const image_set *set, char own_url[160],
                              char own_name[64]) {
  if (g->store_url != NULL)
    return g->store_url;
  uint64_t out_bytes = (uint64_t)o->tokens * (uint64_t)o->hidden *
                       encache_dtype_size(o->dtype);
  uint64_t need = (out_bytes + 4096) * (uint64_t)set->n * 2 + (16u << 20);
  snprintf(own_name, 64, "encache-demo-%d", (int)getpid());
  snprintf(own_url, 160, "shm://%s?size=%" PRIu64, own_name, need);
  encache_shm_destroy(own_name);
  return own_url;
}

/* The fleet with the cache (and the baseline without it) on o->store_url,
 * in a namespace of this run's own so that hits are this run's; then its
 * objects removed (or the demo's own segment destroyed) and the summary
 * printed.  Frees set; the exit status. */
static int run_fleet(demo_opts *o, image_set *set, const char *shown,
                     const char *own_name, int json) {
  char revision[64];
  snprintf(revision, sizeof(revision), "run-%d-%ld", (int)getpid(),
           (long)time(NULL));
  phase cached, base;
  int rc = demo_fleet_run(o, set, 1, revision, &cached);
  if (rc == 0 && cached.failed) {
    /* An encoder said why (above); a baseline and a summary would only
     * hide it. */
    fprintf(stderr, "encache demo: an encoder failed (see above): stopped\n");
    demo_phase_free(&cached);
    rc = 1;
  }
  int baseline_ok =
      rc == 0 && o->baseline && demo_fleet_run(o, set, 0, revision, &base) == 0;
  if (own_name[0])
    encache_shm_destroy(own_name);
  else
    hosts_clean(o, shown, revision);
  if (rc != 0) {
    if (rc < 0)
      fprintf(stderr, "encache demo: could not start the encoders\n");
    demo_images_free(set);
    return EXIT_FAIL;
  }
  int verified_ok = cached.total.verify_failed == 0 && !cached.total.poisoned;
  figures f = compute(&cached, baseline_ok ? &base : NULL);
  (json ? summary_json : summary_text)(o, shown, set, &cached.total,
                                       baseline_ok ? &base : NULL, &f,
                                       verified_ok);
  fflush(stdout);
  int exit_code = EXIT_OK;
  if (cached.failed || !verified_ok) {
    fprintf(stderr, "encache demo: %s\n",
            !verified_ok ? "VERIFICATION FAILED: a hit differed from a fresh "
                           "encode (see above)"
                         : "an encoder failed (see above)");
    exit_code = EXIT_FAIL;
  }
  demo_phase_free(&cached);
  if (baseline_ok)
    demo_phase_free(&base);
  demo_images_free(set);
  return exit_code;
}

static int run_demo(const tool_globals *g, const tool_args *a) {
  demo_opts o;
  image_set set;
  memset(&set, 0, sizeof(set));
  if (demo_args(a, &o) < 0)
    return EXIT_USAGE;
  if (demo_images_make(&o, &set) < 0) {
    demo_images_free(&set);
    return EXIT_USAGE;
  }
  char own_url[160], own_name[64] = "";
  const char *url = demo_store(g, &o, &set, own_url, own_name);
  o.store_url = url;
  char why[1024], shown[256];
  measure_url_shown(url, shown, sizeof(shown));
  if (o.hosts > 1 && !demo_is_tier(url)) {
    demo_images_free(&set);
    return usage_error("demo", "--hosts %d needs --store tier:shm://NAME?..."
                       "+REMOTE (each host its own shm tier), not %s", o.hosts,
                       shown);
  }
  if (hosts_probe(&o, why, sizeof(why)) < 0) {
    fprintf(stderr, "encache demo: cannot use the Store %s: %s\n", shown, why);
    if (own_name[0])
      encache_shm_destroy(own_name);
    demo_images_free(&set);
    return EXIT_FAIL;
  }
  if (o.burst)
    return run_burst(&o, &set, url, shown, own_name, g->json);
  return run_fleet(&o, &set, shown, own_name, g->json);
}

const tool_command cmd_demo = {
    "demo", "run a fleet of encoders sharing one Store (the main job)",
    demo_usage, demo_opts_table, TOOL_STORE | TOOL_JSON, 0, 0, "",
    run_demo};
