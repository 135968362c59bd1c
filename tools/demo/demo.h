/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo.h: the demo's library (tools/demo/), which the tool's
 * `encache demo` (tools/encache/cmd_demo.c: its options and report)
 * calls.  It uses the public header and tools/bench/measure.h, nothing
 * of the tool.
 *
 *   demo_workload.c   the images (procedural, or loaded by demo_images.c),
 *                     their content identifiers, the Zipf request stream
 *   demo_images.c     the image loader (PNG/JPEG through stb, optional)
 *   demo_reference.c  the reference encoder, a deterministic CPU stand-in
 *                     for a vision tower (not a model)
 *   demo_encoder.c    one encoder process: look up, encode misses, publish,
 *                     verify hits; its destinations come from a reused pool
 *   demo_fleet.c      the fleet: fork the encoder processes, show progress,
 *                     wait for them and collect their reports
 *   demo_burst.c      --burst: the same new images reaching every encoder
 *                     at once, with and without single flight
 *   demo_tier.c       --hosts: each simulated host's Store URL and its
 *                     tier: Store's counters
 *   hash.h            the seeded hash of the generators and identifiers
 */
#ifndef ENCACHE_DEMO_H
#define ENCACHE_DEMO_H

#include <stddef.h>
#include <stdint.h>

#include "encache.h"

#define DEMO_PATCH 8 /* pixels per patch side */
#define DEMO_PATCH_IN (DEMO_PATCH * DEMO_PATCH * 3)
#define DEMO_MAX_ENCODERS 64
#define DEMO_MAX_BATCH 4 /* images per request */

enum { VERIFY_NONE, VERIFY_SAMPLE, VERIFY_ALL };

typedef struct demo_opts {
  int encoders, requests, images, tokens, hidden, dtype, verify, baseline;
  double skew;
  unsigned seed;
  const char *images_dir;
  const char *store_url;
  /* --burst: every encoder serves the same requests, each request started
   * by all at the same moment (demo_burst.c); flight: the engine's single
   * flight on (single_flight_wait_ms flight_wait_ms). */
  int burst, flight, flight_wait_ms;
  /* --hosts: simulated hosts, each its own shm tier of a tier: Store
   * (demo_tier.c); 1 = the Store as given. */
  int hosts;
  /* --overlap (the default): each encoder starts the next request's
   * lookup before it encodes the current one's misses. */
  int overlap;
} demo_opts;

/* ------------------------------------------------------------ workload */

typedef struct rng {
  uint64_t s;
} rng;

uint64_t rng_next(rng *r);
double rng_unit(rng *r); /* uniform in [0, 1) */

typedef struct image {
  unsigned char *rgb; /* side_w x side_h x 3, the decoded, resized pixels */
  char id[40];        /* content hash of pixels + preprocessing */
} image;

typedef struct image_set {
  image *img;
  int n, gw, gh, side_w, side_h; /* gw x gh patches of side_w x side_h px */
} image_set;

/* The images of the run (procedural, or the files of o->images_dir) and
 * their identifiers.  Returns 0, or -1 after a message. */
int demo_images_make(const demo_opts *o, image_set *set);
void demo_images_free(image_set *set);

/* Loads every PNG/JPEG of dir, resized (nearest) to set's side; -1 after a
 * message (also when the tool is built without stb). */
int demo_images_load(const char *dir, image_set *set);

/* Zipf popularity over n images: a cumulative table to free. */
double *demo_zipf_table(int n, double s);
int demo_zipf_pick(const double *cdf, int n, rng *r);

/* --------------------------------------------------- reference encoder */

typedef struct demo_encoder {
  int tokens, hidden, dtype;
  float *w; /* DEMO_PATCH_IN x hidden, row-major */
  float *b;
  float *acc; /* hidden */
} demo_encoder;

int demo_encoder_init(demo_encoder *e, const demo_opts *o);
void demo_encoder_free(demo_encoder *e);
/* Encodes one image into out (tokens x hidden of the demo's dtype). */
void demo_encode(demo_encoder *e, const image_set *set, const image *im,
                 void *out);

/* ------------------------------------------------------- one encoder */

/* What an encoder process reports to the parent.  Every counter up to
 * encode_s is a uint64_t (the fleet sums them as an array). */
typedef struct report {
  uint64_t requests, images, hits, hits_own, hits_other, encodes;
  uint64_t outcome[ENCACHE_IN_FLIGHT + 1];
  uint64_t verified, verify_failed;
  uint64_t bytes_read, published_written, published_present, published_failed;
  uint64_t skipped[ENCACHE_SKIP_REASONS_];
  uint64_t waited, waited_hits, wait_us; /* single flight */
  uint64_t tier_local, tier_remote, tier_promoted; /* a tier: Store's */
  /* Lookups started ahead (--overlap) and waited for; images looked up a
   * second time (single flight, or an overlapped lookup that ran while
   * this encoder encoded the image). */
  uint64_t lookups_ahead, looked_again;
  double encode_s, wall_s;
  double lookup_wait_s; /* the time steps waited for their lookups */
  uint64_t distinct; /* images it requested: the fleet keeps the largest */
  int poisoned, failed;
  uint32_t nhit_lat, nmiss_lat;
} report;

/* Shared with the parent, for progress, and the encoders' burst gate. */
typedef struct demo_shared {
  uint64_t done[DEMO_MAX_ENCODERS]; /* requests done, per encoder */
  uint64_t arrived;                 /* burst: arrivals at the gate */
} demo_shared;

/* Runs the burst comparison (single flight off, then on, each in the
 * namespace of the revision it writes in revisions[]) on o->store_url
 * and prints its summary; 0, or 1 when an encoder failed or a hit
 * differed. */
int demo_burst_run(demo_opts *o, const image_set *set, const char *shown,
                   int json, char revisions[2][64]);

/* Runs encoder `index` (in a child process) and writes its report and
 * latencies to fd.  Returns the child's exit status. */
int demo_encoder_run(const demo_opts *o, const image_set *set, int index,
                     int use_cache, const char *revision, demo_shared *sh,
                     int fd);

/* ------------------------------------------------------------- fleet */

typedef struct phase {
  report total;
  double *hit_lat, *miss_lat; /* seconds, every encoder's */
  size_t nhit, nmiss;
  double wall_s;
  int failed;
} phase;

/* Runs o->encoders encoder processes to the end and sums their reports
 * into ph (whose latencies the caller frees with demo_phase_free).
 * Returns 0, or -1 when they could not be started. */
int demo_fleet_run(const demo_opts *o, const image_set *set, int use_cache,
                   const char *revision, phase *ph);
void demo_phase_free(phase *ph);

/* ------------------------------------------------------- hosts (tiers) */

/* Whether url is a tier: Store with an shm local tier. */
int demo_is_tier(const char *url);
/* The Store URL of simulated host `host`: o->store_url with the local
 * segment NAME made NAME-h<host> (as given when o->hosts is 1).  0, or
 * -1 when buf is too small. */
int demo_host_url(const demo_opts *o, int host, char *buf, size_t size);
/* That host's segment name; -1 when o->hosts is 1. */
int demo_host_segment(const demo_opts *o, int host, char *buf, size_t size);
/* A tier: Store's per-tier counters of ec into rep (nothing otherwise). */
void demo_tier_counts(encache *ec, report *rep);

#endif
