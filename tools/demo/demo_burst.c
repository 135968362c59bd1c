/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_burst.c: `encache demo --burst`: new images reaching every encoder
 * at the same moment (a viral image, a shared system-prompt image at
 * start-up).  Every encoder serves the same request stream, and a gate
 * starts each request on all of them together.  The fleet runs twice on
 * a cold namespace each: without single flight, where every encoder that
 * misses an image encodes it (duplicate encodes), and with it, where one
 * encoder holds the image's lease and the others wait for its output.
 */
#include "demo.h"
#include "measure.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The longest a waiter waits for another encoder's output. */
#define BURST_WAIT_MS 5000

static uint64_t duplicates(const report *t) {
  return t->encodes > t->distinct ? t->encodes - t->distinct : 0;
}

static void burst_text(const demo_opts *o, const char *url,
                       const image_set *set, const phase ph[2], int ok) {
  const report *a = &ph[0].total, *b = &ph[1].total;
  printf("\nencache demo --burst: %d encoders sharing %s; every request "
         "reaches all of them at the same moment\n", o->encoders, url);
  printf("workload: %d requests, the same for every encoder, 1-4 images "
         "each from %d images (Zipf s=%g), %d tokens x %d hidden, %s; each "
         "run on a cold namespace\n\n", o->requests, set->n, o->skew,
         o->tokens, o->hidden, encache_dtype_name(o->dtype));
  printf("%-32s %18s %18s\n", "", "single flight off", "single flight on");
#define ROW(label, field)                                                    \
  printf("%-32s %18" PRIu64 " %18" PRIu64 "\n", label, a->field, b->field)
  ROW("images", images);
  ROW("distinct images", distinct);
  ROW("encoder runs", encodes);
  printf("%-32s %18" PRIu64 " %18" PRIu64 "\n", "duplicate encodes",
         duplicates(a), duplicates(b));
  ROW("hits", hits);
  ROW("waited for another's output", waited);
  ROW("  and got it (hits)", waited_hits);
  ROW("in flight at the bound", outcome[ENCACHE_IN_FLIGHT]);
#undef ROW
  printf("%-32s %17.2fs %17.2fs", "time spent waiting",
         (double)a->wait_us / 1e6, (double)b->wait_us / 1e6);
  if (b->waited)
    printf("  (%.1f ms per waiter)",
           (double)b->wait_us / 1e3 / (double)b->waited);
  printf("\n%-32s %17.2fs %17.2fs\n", "encoder time", a->encode_s,
         b->encode_s);
  printf("%-32s %17.2fs %17.2fs\n", "wall time", ph[0].wall_s, ph[1].wall_s);
  printf("\n%-32s %s (%" PRIu64 " hits checked bit for bit against a fresh "
         "encode)\n", "verification", ok ? "passed" : "FAILED",
         a->verified + b->verified);
}

static void burst_json_side(const char *name, const phase *ph, int last) {
  const report *t = &ph->total;
  printf("  \"%s\": {\"images\": %" PRIu64 ", \"distinct_images\": %" PRIu64
         ", \"encodes\": %" PRIu64 ", \"duplicate_encodes\": %" PRIu64
         ", \"hits\": %" PRIu64 ", \"waited\": %" PRIu64
         ", \"waited_hits\": %" PRIu64 ", \"in_flight\": %" PRIu64
         ", \"wait_seconds\": %.3f, \"encoder_seconds\": %.3f, "
         "\"wall_seconds\": %.3f}%s\n", name, t->images, t->distinct,
         t->encodes, duplicates(t), t->hits, t->waited, t->waited_hits,
         t->outcome[ENCACHE_IN_FLIGHT], (double)t->wait_us / 1e6,
         t->encode_s, ph->wall_s, last ? "" : ",");
}

static void burst_json(const demo_opts *o, const char *url,
                       const image_set *set, const phase ph[2], int ok) {
  printf("{\n  \"store\": \"%s\",\n  \"burst\": true,\n", url);
  printf("  \"workload\": {\"encoders\": %d, \"requests_per_encoder\": %d, "
         "\"images\": %d, \"tokens\": %d, \"hidden\": %d, \"dtype\": \"%s\", "
         "\"skew\": %g},\n", o->encoders, o->requests, set->n, o->tokens,
         o->hidden, encache_dtype_name(o->dtype), o->skew);
  burst_json_side("single_flight_off", &ph[0], 0);
  burst_json_side("single_flight_on", &ph[1], 0);
  printf("  \"verification\": {\"checked\": %" PRIu64 ", \"failed\": %" PRIu64
         ", \"passed\": %s}\n}\n", ph[0].total.verified + ph[1].total.verified,
         ph[0].total.verify_failed + ph[1].total.verify_failed,
         ok ? "true" : "false");
}

int demo_burst_run(demo_opts *o, const image_set *set, const char *shown,
                   int json, char revisions[2][64]) {
  phase ph[2];
  memset(ph, 0, sizeof(ph));
  int started = 0, failed = 0;
  for (int f = 0; f < 2 && !failed; f++) {
    o->flight = f;
    o->flight_wait_ms = BURST_WAIT_MS;
    snprintf(revisions[f], 64, "burst-%d-%ld-%d", (int)getpid(),
             (long)time(NULL), f);
    if (demo_fleet_run(o, set, 1, revisions[f], &ph[f]) < 0) {
      fprintf(stderr, "encache demo: could not start the encoders\n");
      failed = 1;
      break;
    }
    started++;
    failed = ph[f].failed;
  }
  int ok = !failed;
  for (int f = 0; f < started; f++)
    ok = ok && ph[f].total.verify_failed == 0 && !ph[f].total.poisoned;
  if (!failed)
    (json ? burst_json : burst_text)(o, shown, set, ph, ok);
  else
    fprintf(stderr, "encache demo: an encoder failed (see above): stopped\n");
  for (int f = 0; f < started; f++)
    demo_phase_free(&ph[f]);
  return ok ? 0 : 1;
}
