/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_workload.c: what the demo's encoders are asked to encode: a set of
 * images (procedural, or files loaded by demo_images.c), each identified
 * as a serving stack would (a hash of its decoded pixels and its
 * preprocessing parameters), and requests drawn with a Zipf popularity.
 */
#include "demo.h"
#include "hash.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

uint64_t rng_next(rng *r) {
  return r->s = demo_mix64(r->s + 0x9e3779b97f4a7c15ull);
}

double rng_unit(rng *r) {
  return (double)(rng_next(r) >> 11) / 9007199254740992.0;
}

/* A procedural image: smooth gradients and rings with seeded noise. */
static void make_image(unsigned char *rgb, int w, int h, unsigned seed) {
  rng r = {demo_mix64(seed + 1)};
  double fx = 0.05 + rng_unit(&r) * 0.3, fy = 0.05 + rng_unit(&r) * 0.3;
  double cx = rng_unit(&r) * w, cy = rng_unit(&r) * h;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      double d = sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy));
      unsigned char *p = rgb + 3 * (y * w + x);
      p[0] = (unsigned char)(127 + 120 * sin(x * fx));
      p[1] = (unsigned char)(127 + 120 * cos(y * fy));
      p[2] = (unsigned char)((int)(d * 9) ^ (int)(rng_next(&r) & 15));
    }
}

/* The identifier a serving stack would compute: a hash of the decoded
 * pixels and the preprocessing parameters (128 bits, two seeds). */
static void content_id(const unsigned char *rgb, int w, int h, int tokens,
                       char *out) {
  size_t n = (size_t)w * (size_t)h * 3;
  uint64_t params = (uint64_t)w << 40 ^ (uint64_t)h << 20 ^
                    (uint64_t)tokens << 4 ^ DEMO_PATCH;
  snprintf(out, 40, "%016" PRIx64 "%016" PRIx64, demo_hash(rgb, n, params),
           demo_hash(rgb, n, ~params));
}

int demo_images_make(const demo_opts *o, image_set *set) {
  set->gw = (int)ceil(sqrt((double)o->tokens));
  set->gh = (o->tokens + set->gw - 1) / set->gw;
  set->side_w = set->gw * DEMO_PATCH;
  set->side_h = set->gh * DEMO_PATCH;
  size_t bytes = (size_t)set->side_w * (size_t)set->side_h * 3;
  if (o->images_dir != NULL) {
    if (demo_images_load(o->images_dir, set) < 0)
      return -1;
  } else {
    set->n = o->images;
    set->img = calloc((size_t)set->n, sizeof(image));
    if (set->img == NULL)
      return fprintf(stderr, "encache demo: out of memory\n"), -1;
    for (int i = 0; i < set->n; i++) {
      if ((set->img[i].rgb = malloc(bytes)) == NULL)
        return fprintf(stderr, "encache demo: out of memory\n"), -1;
      make_image(set->img[i].rgb, set->side_w, set->side_h,
                 o->seed * 7919u + (unsigned)i);
    }
  }
  for (int i = 0; i < set->n; i++)
    content_id(set->img[i].rgb, set->side_w, set->side_h, o->tokens,
               set->img[i].id);
  return 0;
}

void demo_images_free(image_set *set) {
  for (int i = 0; set->img != NULL && i < set->n; i++)
    free(set->img[i].rgb);
  free(set->img);
  set->img = NULL;
  set->n = 0;
}

double *demo_zipf_table(int n, double s) {
  double *cdf = malloc(sizeof(double) * (size_t)n), sum = 0;
  if (cdf == NULL)
    return NULL;
  for (int i = 0; i < n; i++)
    cdf[i] = sum += 1.0 / pow(i + 1, s);
  for (int i = 0; i < n; i++)
    cdf[i] /= sum;
  return cdf;
}

int demo_zipf_pick(const double *cdf, int n, rng *r) {
  double u = rng_unit(r);
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (cdf[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
