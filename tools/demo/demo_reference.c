/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_reference.c: the demo's reference encoder, a deterministic CPU
 * stand-in for a vision tower: patchify, a projection with seeded weights,
 * a GELU; its cost grows with tokens x hidden size like a real one.  It is
 * not a model.  The same image always gives the same bits, so that a hit
 * can be checked against a fresh encode.
 */
#include "demo.h"
#include "hash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int demo_encoder_init(demo_encoder *e, const demo_opts *o) {
  e->tokens = o->tokens;
  e->hidden = o->hidden;
  e->dtype = o->dtype;
  e->w = malloc(sizeof(float) * DEMO_PATCH_IN * (size_t)o->hidden);
  e->b = malloc(sizeof(float) * (size_t)o->hidden);
  e->acc = malloc(sizeof(float) * (size_t)o->hidden);
  if (e->w == NULL || e->b == NULL || e->acc == NULL) {
    demo_encoder_free(e);
    return -1;
  }
  rng r = {demo_mix64(o->seed ^ 0x5eed)};
  float scale = 1.0f / sqrtf((float)DEMO_PATCH_IN);
  for (size_t i = 0; i < (size_t)DEMO_PATCH_IN * (size_t)o->hidden; i++)
    e->w[i] = (float)(rng_unit(&r) * 2 - 1) * scale;
  for (int i = 0; i < o->hidden; i++)
    e->b[i] = (float)(rng_unit(&r) * 0.2 - 0.1);
  return 0;
}

void demo_encoder_free(demo_encoder *e) {
  free(e->w);
  free(e->b);
  free(e->acc);
  e->w = e->b = e->acc = NULL;
}

static uint16_t to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if (exp >= 31)
    return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10)
      return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp), h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
      h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = sign | (uint32_t)exp << 10 | mant >> 13, rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;
  return (uint16_t)h;
}

static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* The patch of token t, normalized, into x[DEMO_PATCH_IN]. */
static void patch(const image_set *set, const image *im, int t, float *x) {
  int gx = t % set->gw, gy = t / set->gw, k = 0;
  for (int py = 0; py < DEMO_PATCH; py++)
    for (int px = 0; px < DEMO_PATCH; px++) {
      const unsigned char *p =
          im->rgb + 3 * ((gy * DEMO_PATCH + py) * set->side_w +
                         gx * DEMO_PATCH + px);
      for (int ch = 0; ch < 3; ch++)
        x[k++] = ((float)p[ch] / 255.0f - 0.5f) * 4.0f;
    }
}

void demo_encode(demo_encoder *e, const image_set *set, const image *im,
                 void *out) {
  float x[DEMO_PATCH_IN];
  for (int t = 0; t < e->tokens; t++) {
    patch(set, im, t, x);
    memcpy(e->acc, e->b, sizeof(float) * (size_t)e->hidden);
    for (int i = 0; i < DEMO_PATCH_IN; i++) {
      const float xi = x[i], *row = e->w + (size_t)i * (size_t)e->hidden;
      for (int h = 0; h < e->hidden; h++)
        e->acc[h] += xi * row[h];
    }
    for (int h = 0; h < e->hidden; h++) {
      float v = e->acc[h];
      float g = 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
      size_t at = (size_t)t * (size_t)e->hidden + (size_t)h;
      if (e->dtype == ENCACHE_FLOAT32)
        ((float *)out)[at] = g;
      else if (e->dtype == ENCACHE_FLOAT16)
        ((uint16_t *)out)[at] = to_half(g);
      else
        ((uint16_t *)out)[at] = to_bf16(g);
    }
  }
}
