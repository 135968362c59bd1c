/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encoder.c: a minimal encoder step loop over encache, using only the
 * public header.
 *
 *   encoder [STORE_URL]
 *
 * It opens a handle from a vLLM ec-transfer-config, then runs two steps
 * over the same images: the first misses, encodes and publishes; the
 * second loads every output from the Store.  The "encoder" is a toy
 * function standing in for a vision tower.  Its own default segment is
 * removed at the end; a STORE_URL given is left as it is.
 */
#include <encache.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENS 4
#define HIDDEN 8

static const char config[] =
    "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
    "\"ec_producer\", \"ec_connector_extra_config\": {\"cross_encoder_cache\": "
    "true, \"embedding_cache_prefix\": \"example\"}}";

/* The stand-in encoder: a deterministic TOKENS x HIDDEN output per image. */
static void encode(const char *id, float *out) {
  unsigned h = 2166136261u;
  for (const char *p = id; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  for (int i = 0; i < TOKENS * HIDDEN; i++)
    out[i] = (float)((h >> (i % 24)) & 0xff) / 16.0f;
}

/* Destinations are plain heap buffers here; a serving stack would hand out
 * its own tensors. */
static int alloc_output(void *ctx, size_t i, const encache_candidate *c,
                        uint64_t nbytes, void **data, void **handle) {
  (void)ctx, (void)i, (void)c;
  *handle = NULL;
  *data = malloc(nbytes);
  return *data != NULL ? 0 : ENCACHE_ENOMEM;
}

static void release_output(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx, (void)i, (void)handle;
  free(data);
}

static void free_storage(void *ctx) { free(ctx); }

/* Encodes the misses of a lookup on step and publishes them on it; frees
 * the hits.  Returns 0, or -1 when a hit is wrong. */
static int encode_and_publish(encache_step *step, const char *const *ids,
                              size_t n, const encache_result *results) {
  for (size_t i = 0; i < n; i++) {
    float want[TOKENS * HIDDEN];
    encode(ids[i], want);
    if (results[i].outcome == ENCACHE_HIT) {
      if (memcmp(results[i].data, want, sizeof(want)) != 0) {
        fprintf(stderr, "%s: a hit differs from a fresh encode\n", ids[i]);
        return -1;
      }
      printf("  %-8s HIT (loaded %llu bytes)\n", ids[i],
             (unsigned long long)results[i].nbytes);
      free(results[i].data);
      continue;
    }
    /* Encode, then hand the output over: encache retains the storage
     * until the background write is done. */
    float *out = malloc(sizeof(want));
    if (out == NULL)
      return -1;
    memcpy(out, want, sizeof(want));
    encache_storage *s = NULL;
    if (encache_storage_new(out, sizeof(want), free_storage, out, &s) != 0) {
      free(out);
      return -1;
    }
    int64_t shape[2] = {TOKENS, HIDDEN};
    encache_tensor view = {sizeof view, out, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
    int q = encache_publish(step, ids[i], &view, s);
    encache_storage_unref(s);
    printf("  %-8s %s, encoded, publication %s\n", ids[i],
           encache_outcome_name(results[i].outcome), encache_skip_name(q));
  }
  return 0;
}

/* One encoder step: open it, look up, encode the misses, publish them on
 * the step, close it.  Returns hits.  (A pipelined server may keep several
 * steps open, looking up the next before it publishes this one.) */
static int run_step(encache *ec, const char *const *ids, size_t n) {
  encache_candidate cands[8];
  encache_result results[8] = {ENCACHE_RESULT_INIT};
  for (size_t i = 0; i < n; i++) {
    encache_candidate c = {sizeof(c), ids[i], ENCACHE_MODALITY_IMAGE,
                           ENCACHE_FLOAT32, TOKENS, HIDDEN,
                           ENCACHE_DEVICE_HOST, 0};
    cands[i] = c;
  }
  encache_allocator a = {sizeof(a), NULL, alloc_output, release_output, 0};
  encache_step *step = NULL;
  int hits = encache_step_open(ec, &step);
  if (hits == 0)
    hits = encache_lookup(step, cands, n, &a, results);
  if (hits < 0) {
    fprintf(stderr, "step: %s\n", encache_errmsg(ec));
    encache_step_close(step);
    return hits;
  }
  if (encode_and_publish(step, ids, n, results) < 0)
    hits = -1;
  encache_step_close(step); /* queued publications are not affected */
  return hits;
}

int main(int argc, char **argv) {
  encache_options o = ENCACHE_OPTIONS_INIT;
  o.ec_transfer_config = config;
  o.model = "example/vision-model";
  o.model_dtype = ENCACHE_FLOAT32;
  o.store_url = argc > 1 ? argv[1] : "shm://encache-example?size=16MiB";
  encache *ec = NULL;
  if (encache_open(&o, &ec) != 0) {
    fprintf(stderr, "open: %s\n", encache_errmsg(NULL));
    return 1;
  }
  static const char *const ids[] = {"cat.png", "dog.png", "cat.png"};
  printf("step 1\n");
  if (run_step(ec, ids, 3) < 0)
    return 1;
  encache_flush(ec); /* a real encoder does not wait; the example does */
  printf("step 2\n");
  int hits = run_step(ec, ids, 3);
  encache_stats st = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &st);
  printf("hits %llu, misses %llu, written %llu\n", (unsigned long long)st.hits,
         (unsigned long long)st.misses,
         (unsigned long long)st.published_written);
  int rc = encache_close(ec) != 0;
  if (rc)
    fprintf(stderr, "close: poisoned\n");
  /* A segment outlives its processes (that is how encoders share it):
   * remove the example's own, so that it leaves nothing behind and a
   * second run starts empty.  A Store given on the command line is the
   * caller's, and is left as it is. */
  if (argc <= 1)
    encache_shm_destroy("encache-example");
  return rc || hits != 3 ? 1 : 0;
}
