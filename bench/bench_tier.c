/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_tier: the tiered Store (tier:shm://...+redis://...) against its
 * two tiers alone, in one run (issue 17, item 5).
 *
 *   bench_tier [redis://HOST:PORT] [--iterations N]
 *
 * (the URL defaults to $ENCACHE_REDIS_URL, as scripts/redis-servers.sh
 * writes it).  Three engines in one process, on the same objects (4 per
 * batch, of 16 KiB, 1 MiB and 8 MiB): one over a plain shm segment, one
 * over the Redis server, one over a tier of a second shm segment in front
 * of that server.  Printed, p50 of N lookups of the batch:
 *
 * (a) a repeated remote hit, once promoted (a local hit of the tier),
 *     against a plain shm lookup of the same objects: target tier/shm
 *     <= 1.2;
 * (b) a first remote hit (the local copies removed before each lookup,
 *     untimed; the promotion it queues is waited for, untimed, before
 *     anything else is timed) against a plain Redis lookup, which of the
 *     two goes first alternating: target tier/redis <= 1.1.
 *
 * The two lookups of a pair alternate so that both see the same machine.
 */
#include "hits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOBJ 4

static const char usage[] =
    "usage: bench_tier [redis://HOST:PORT] [--iterations N]\n"
    "  (default URL: $ENCACHE_REDIS_URL)\n";

static const size_t sizes[] = {16u << 10, 1u << 20, 8u << 20};
#define NSIZES ((int)(sizeof(sizes) / sizeof(sizes[0])))

typedef struct side {
  encache *ec;
  encache_store *st;
} side;

/* Removes the local tier's copies of h's objects. */
static void drop_local(encache_store *local, bench_hits *h) {
  for (int k = 0; k < h->n; k++)
    encache_store_remove(local, h->keys[k]);
}

/* Waits (at most 2 s) until the local tier holds all of h's objects. */
static int wait_promoted(encache_store *local, bench_hits *h) {
  for (double t0 = measure_now(); measure_now() - t0 < 2.0;) {
    int present[NOBJ], all = 1;
    if (encache_store_exists(local, (const char *const *)h->keys,
                             (size_t)h->n, present) != 0)
      return -1;
    for (int k = 0; k < h->n; k++)
      all &= present[k] == 1;
    if (all)
      return 0;
    usleep(200);
  }
  return -1;
}

static void row(const char *label, measure *base, measure *subject,
                double target) {
  double b = measure_pct(base, 50), s = measure_pct(subject, 50);
  printf("%-8s %12.1f %12.1f %12.1f %12.1f %10.2f %8s\n", label, b * 1e6,
         measure_pct(base, 99) * 1e6, s * 1e6, measure_pct(subject, 99) * 1e6,
         s / b, s / b <= target ? "met" : "missed");
}

/* One timed lookup of h into *seconds; 0, or 1 when it failed. */
static int timed(bench_hits *h, double *seconds) {
  double t0 = measure_now();
  int rc = bench_hits_lookup(h);
  *seconds = measure_now() - t0;
  return rc;
}

/* (b) for one size: first remote hits against plain Redis lookups.  Which
 * goes first alternates, and the promotion a tier lookup queues is waited
 * for before anything else is timed, so that neither lookup shares the
 * machine with it. */
static int first_hits(bench_hits *tier, bench_hits *redis,
                      encache_store *local, int iters, measure *mb,
                      measure *ms) {
  for (int it = -2; it < iters; it++) {
    double tr = 0, tt = 0;
    drop_local(local, tier);
    int rc = it % 2 ? timed(redis, &tr) : 0;
    rc = rc || timed(tier, &tt);
    int waited = rc == 0 ? wait_promoted(local, tier) : 0;
    rc = rc || (it % 2 ? 0 : timed(redis, &tr));
    if (rc != 0 || waited != 0) {
      fprintf(stderr, "bench_tier: %s\n",
              rc ? "a lookup failed" : "no promotion within 2 s");
      return 1;
    }
    if (it >= 0)
      measure_add(mb, tr), measure_add(ms, tt);
  }
  return 0;
}

/* measure_pair's two functions over one context: the two hit sets. */
typedef struct two {
  bench_hits *base, *subject;
} two;
static int base_lookup(void *ctx) { return bench_hits_lookup(((two *)ctx)->base); }
static int subject_lookup(void *ctx) {
  return bench_hits_lookup(((two *)ctx)->subject);
}

static void header(const char *title, const char *base, const char *ratio,
                   const char *target) {
  char b50[24], b99[24];
  snprintf(b50, sizeof(b50), "%s p50", base);
  snprintf(b99, sizeof(b99), "%s p99", base);
  printf("%s\n%-8s %12s %12s %12s %12s %10s %8s\n", title, "object", b50, b99,
         "tier p50", "tier p99", ratio, target);
}

/* (a) and (b) for one size; their rows into the two tables' buffers. */
static int one_size(side *shm, side *redis, side *tier, encache_store *local,
                    size_t size, int iters, measure *b, measure *s) {
  bench_hits hs, hr, ht;
  if (bench_hits_make(&hs, shm->ec, shm->st, "tier", NOBJ, size) != 0)
    return 1;
  if (bench_hits_make(&hr, redis->ec, redis->st, "tier", NOBJ, size) != 0) {
    bench_hits_drop(&hs);
    return 1;
  }
  ht = hr; /* the same objects and destinations, through the tier */
  ht.ec = tier->ec;
  int rc = first_hits(&ht, &hr, local, iters, &b[1], &s[1]);
  two pair = {&hs, &ht}; /* (a): promoted now (first_hits waited for it) */
  if (rc == 0)
    rc = measure_pair(&b[0], base_lookup, &s[0], subject_lookup, &pair, 2,
                      iters);
  drop_local(local, &ht);
  bench_hits_drop(&hs);
  bench_hits_drop(&hr);
  return rc;
}

static int run(side *shm, side *redis, side *tier, encache_store *local,
               int iters) {
  measure b[NSIZES][2], s[NSIZES][2];
  int rc = 0;
  for (int z = 0; z < NSIZES; z++)
    for (int i = 0; i < 2; i++)
      if (measure_init(&b[z][i], iters) < 0 || measure_init(&s[z][i], iters) < 0)
        return 1;
  for (int z = 0; z < NSIZES && rc == 0; z++)
    rc = one_size(shm, redis, tier, local, sizes[z], iters, b[z], s[z]);
  for (int i = 0; i < 2 && rc == 0; i++) {
    header(i == 0 ? "(a) a repeated remote hit (promoted: a local hit) vs "
                    "plain shm, 4 objects, us"
                  : "\n(b) a first remote hit (then promoted) vs plain "
                    "Redis, 4 objects, us",
           i == 0 ? "shm" : "redis", i == 0 ? "tier/shm" : "tier/redis",
           i == 0 ? "<= 1.2" : "<= 1.1");
    for (int z = 0; z < NSIZES; z++) {
      char label[16];
      measure_size_label(label, sizeof(label), sizes[z]);
      row(label, &b[z][i], &s[z][i], i == 0 ? 1.2 : 1.1);
    }
  }
  for (int z = 0; z < NSIZES; z++)
    for (int i = 0; i < 2; i++)
      measure_free(&b[z][i]), measure_free(&s[z][i]);
  return rc;
}

int main(int argc, char **argv) {
  const char *url = getenv("ENCACHE_REDIS_URL");
  int iters = 50;
  int rc = measure_options(argc, argv, usage, 1, &url, &iters, 5);
  if (rc >= 0)
    return rc;
  if (url == NULL || url[0] == '\0') {
    fprintf(stderr, "bench_tier: no Redis URL (give one, or set "
                    "ENCACHE_REDIS_URL)\n%s", usage);
    return 2;
  }
  char seg[64], lseg[64], shm_url[128], local_url[128], tier_url[1024];
  snprintf(seg, sizeof(seg), "bench-tier-shm-%d", (int)getpid());
  snprintf(lseg, sizeof(lseg), "bench-tier-local-%d", (int)getpid());
  snprintf(shm_url, sizeof(shm_url), "shm://%s?size=128MiB", seg);
  snprintf(local_url, sizeof(local_url), "shm://%s?size=128MiB", lseg);
  snprintf(tier_url, sizeof(tier_url), "tier:%s+%s", local_url, url);
  const char *json = "{\"ec_connector_extra_config\": {\"cross_encoder_cache\""
                     ": true, \"store_read_buffer_bytes\": 67108864}}";
  side shm = {0}, redis = {0}, tier = {0};
  encache_store *local = NULL;
  rc = 1;
  if (bench_open("bench_tier", shm_url, json, &shm.ec, &shm.st) == 0 &&
      bench_open("bench_tier", url, json, &redis.ec, &redis.st) == 0 &&
      bench_open("bench_tier", tier_url, json, &tier.ec, &tier.st) == 0 &&
      encache_store_open(local_url, &local) == 0) {
    printf("stores: %s, %s, %s\n", encache_store_url(shm.st),
           encache_store_url(redis.st), encache_store_url(tier.st));
    printf("p50 and p99 of %d lookups of %d hits; ratios of p50s\n\n", iters,
           NOBJ);
    rc = run(&shm, &redis, &tier, local, iters);
  }
  encache_store_close(local);
  side *all[3] = {&shm, &redis, &tier};
  for (int i = 0; i < 3; i++) {
    encache_close(all[i]->ec);
    encache_store_close(all[i]->st);
  }
  encache_shm_destroy(seg);
  encache_shm_destroy(lseg);
  return rc != 0;
}
