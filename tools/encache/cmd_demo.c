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
 * The reference encoder is a deterministic CPU stand-in for a vision
 * tower: patchify, a projection with seeded weights, a GELU; its cost
 * grows with tokens x hidden size like a real one.  It is not a model.
 */
#include "tool.h"

#include "encache.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef ENCACHE_HAVE_STB
#include <dirent.h>
#include <stb/stb_image.h>
#endif

#define PATCH 8 /* pixels per patch side */
#define PATCH_IN (PATCH * PATCH * 3)

typedef struct demo_opts {
  int encoders, requests, images, tokens, hidden, dtype, verify, baseline,
      json;
  double skew;
  unsigned seed;
  const char *images_dir;
  const char *store_url;
} demo_opts;

enum { VERIFY_NONE, VERIFY_SAMPLE, VERIFY_ALL };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { return r->s = mix64(r->s + 0x9e3779b97f4a7c15ull); }
static double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) / 9007199254740992.0; }

/* ------------------------------------------------------------- the images */

typedef struct image {
  unsigned char *rgb; /* side x side x 3, the decoded, resized pixels */
  char id[40];        /* content hash of pixels + preprocessing */
} image;

typedef struct image_set {
  image *img;
  int n, gw, gh, side_w, side_h;
} image_set;

/* A procedural image: smooth gradients and rings with seeded noise. */
static void make_image(unsigned char *rgb, int w, int h, unsigned seed) {
  rng r = {mix64(seed + 1)};
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
 * pixels and the preprocessing parameters. */
static void content_id(const unsigned char *rgb, int w, int h, int tokens,
                       char *out) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  size_t n = (size_t)w * (size_t)h * 3;
  for (size_t i = 0; i < n; i++) {
    a = (a ^ rgb[i]) * 0x100000001b3ull;
    b = (b ^ rgb[i]) * 0x100000001b3ull + 0x9e37u;
  }
  uint64_t params = mix64((uint64_t)w << 40 ^ (uint64_t)h << 20 ^
                          (uint64_t)tokens << 4 ^ PATCH);
  snprintf(out, 40, "%016" PRIx64 "%016" PRIx64, mix64(a ^ params),
           mix64(b + params));
}

#ifdef ENCACHE_HAVE_STB
/* Loads every PNG/JPEG of dir, resized (nearest) to w x h. */
static int load_dir(const char *dir, image_set *set) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "encache demo: --images %s: %s\n", dir, strerror(errno));
    return -1;
  }
  struct dirent *e;
  int cap = 0;
  set->n = 0;
  while ((e = readdir(d)) != NULL) {
    const char *dot = strrchr(e->d_name, '.');
    if (dot == NULL || (strcasecmp(dot, ".png") && strcasecmp(dot, ".jpg") &&
                        strcasecmp(dot, ".jpeg")))
      continue;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    int iw, ih, ch;
    unsigned char *px = stbi_load(path, &iw, &ih, &ch, 3);
    if (px == NULL) {
      fprintf(stderr, "encache demo: skipping %s: %s\n", path,
              stbi_failure_reason());
      continue;
    }
    if (set->n == cap) {
      cap = cap ? cap * 2 : 16;
      set->img = realloc(set->img, sizeof(image) * (size_t)cap);
    }
    image *im = &set->img[set->n++];
    im->rgb = malloc((size_t)set->side_w * (size_t)set->side_h * 3);
    for (int y = 0; y < set->side_h; y++)
      for (int x = 0; x < set->side_w; x++)
        memcpy(im->rgb + 3 * (y * set->side_w + x),
               px + 3 * ((y * ih / set->side_h) * iw + x * iw / set->side_w), 3);
    stbi_image_free(px);
  }
  closedir(d);
  if (set->n == 0) {
    fprintf(stderr, "encache demo: --images %s: no PNG or JPEG file\n", dir);
    return -1;
  }
  return 0;
}
#endif

static int make_images(const demo_opts *o, image_set *set) {
  set->gw = (int)ceil(sqrt((double)o->tokens));
  set->gh = (o->tokens + set->gw - 1) / set->gw;
  set->side_w = set->gw * PATCH;
  set->side_h = set->gh * PATCH;
  if (o->images_dir != NULL) {
#ifdef ENCACHE_HAVE_STB
    if (load_dir(o->images_dir, set) < 0)
      return -1;
#else
    fprintf(stderr, "encache demo: --images needs encache built with "
                    "libstb-dev\n");
    return -1;
#endif
  } else {
    set->n = o->images;
    set->img = calloc((size_t)set->n, sizeof(image));
    for (int i = 0; i < set->n; i++) {
      set->img[i].rgb = malloc((size_t)set->side_w * (size_t)set->side_h * 3);
      make_image(set->img[i].rgb, set->side_w, set->side_h,
                 o->seed * 7919u + (unsigned)i);
    }
  }
  for (int i = 0; i < set->n; i++)
    content_id(set->img[i].rgb, set->side_w, set->side_h, o->tokens,
               set->img[i].id);
  return 0;
}

/* --------------------------------------------------- the reference encoder */

typedef struct encoder {
  int tokens, hidden, dtype;
  float *w; /* PATCH_IN x hidden, row-major */
  float *b;
  float *acc; /* hidden */
} encoder;

static void encoder_init(encoder *e, const demo_opts *o) {
  e->tokens = o->tokens;
  e->hidden = o->hidden;
  e->dtype = o->dtype;
  e->w = malloc(sizeof(float) * PATCH_IN * (size_t)o->hidden);
  e->b = malloc(sizeof(float) * (size_t)o->hidden);
  e->acc = malloc(sizeof(float) * (size_t)o->hidden);
  rng r = {mix64(o->seed ^ 0x5eed)};
  float scale = 1.0f / sqrtf((float)PATCH_IN);
  for (size_t i = 0; i < (size_t)PATCH_IN * (size_t)o->hidden; i++)
    e->w[i] = (float)(rng_unit(&r) * 2 - 1) * scale;
  for (int i = 0; i < o->hidden; i++)
    e->b[i] = (float)(rng_unit(&r) * 0.2 - 0.1);
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

/* Encodes one image into out (tokens x hidden of the demo's dtype). */
static void encode(encoder *e, const image_set *set, const image *im, void *out) {
  float x[PATCH_IN];
  for (int t = 0; t < e->tokens; t++) {
    int gx = t % set->gw, gy = t / set->gw, k = 0;
    for (int py = 0; py < PATCH; py++)
      for (int px = 0; px < PATCH; px++) {
        const unsigned char *p =
            im->rgb + 3 * ((gy * PATCH + py) * set->side_w + gx * PATCH + px);
        for (int ch = 0; ch < 3; ch++)
          x[k++] = ((float)p[ch] / 255.0f - 0.5f) * 4.0f;
      }
    memcpy(e->acc, e->b, sizeof(float) * (size_t)e->hidden);
    for (int i = 0; i < PATCH_IN; i++) {
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

/* ------------------------------------------------------------ one encoder */

/* What an encoder process reports to the parent. */
typedef struct report {
  uint64_t requests, images, hits, hits_own, hits_other, encodes;
  uint64_t outcome[6];
  uint64_t verified, verify_failed;
  uint64_t bytes_read, published_written, published_present, published_failed;
  uint64_t skipped[ENCACHE_SKIP_COUNT_];
  double encode_s, wall_s;
  int poisoned, failed;
  uint32_t nhit_lat, nmiss_lat;
} report;

typedef struct shared {
  uint64_t done[64]; /* requests done, per encoder */
} shared;

/* Zipf popularity over n images: a cumulative table. */
static double *zipf_table(int n, double s) {
  double *cdf = malloc(sizeof(double) * (size_t)n), sum = 0;
  for (int i = 0; i < n; i++)
    cdf[i] = sum += 1.0 / pow(i + 1, s);
  for (int i = 0; i < n; i++)
    cdf[i] /= sum;
  return cdf;
}

static int zipf_pick(const double *cdf, int n, rng *r) {
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

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0 && errno != EINTR)
      return;
    if (w > 0) {
      c += w;
      n -= (size_t)w;
    }
  }
}

static int run_encoder(const demo_opts *o, const image_set *set, int index,
                       int use_cache, const char *revision, shared *sh,
                       int fd) {
  report rep;
  memset(&rep, 0, sizeof(rep));
  size_t max_lat = (size_t)o->requests * 4;
  double *hit_lat = malloc(sizeof(double) * max_lat);
  double *miss_lat = malloc(sizeof(double) * max_lat);
  encoder enc;
  encoder_init(&enc, o);
  uint64_t nbytes = (uint64_t)o->tokens * (uint64_t)o->hidden *
                    encache_dtype_size(o->dtype);
  double *cdf = zipf_table(set->n, o->skew);
  rng r = {mix64(o->seed * 1000003u + (unsigned)index)};
  char *published = calloc((size_t)set->n, 1);
  void *check = malloc(nbytes);
  encache *ec = NULL;
  if (use_cache) {
    encache_options eo;
    memset(&eo, 0, sizeof(eo));
    eo.ec_transfer_config =
        "{\"ec_connector\": \"ECMooncakeStorageConnector\", \"ec_role\": "
        "\"ec_producer\", \"ec_connector_extra_config\": "
        "{\"cross_encoder_cache\": true, \"embedding_cache_prefix\": "
        "\"demo\"}}";
    eo.model = "encache-demo/reference-encoder";
    eo.revision = revision;
    eo.model_dtype = o->dtype;
    eo.store_url = o->store_url;
    if (encache_open(&eo, &ec) != 0) {
      fprintf(stderr, "encache demo: encoder %d: %s\n", index,
              encache_errmsg(ec));
      rep.failed = 1;
      encache_close(ec);
      ec = NULL;
    }
  }
  double t_start = now_s();
  for (int q = 0; q < o->requests && !rep.failed; q++) {
    int n = 1 + (int)(rng_next(&r) % 4);
    int pick[4];
    encache_candidate c[4];
    encache_result res[4];
    for (int k = 0; k < n; k++) {
      pick[k] = zipf_pick(cdf, set->n, &r);
      encache_candidate cc = {set->img[pick[k]].id, ENCACHE_MODALITY_IMAGE,
                              o->dtype, (uint64_t)o->tokens,
                              (uint64_t)o->hidden, ENCACHE_DEVICE_HOST, 0};
      c[k] = cc;
      res[k].outcome = ENCACHE_MISS;
    }
    double t0 = now_s(), t_lookup = 0;
    if (ec != NULL) {
      encache_allocator a = tool_host_allocator;
      int hits = encache_lookup(ec, c, (size_t)n, &a, res);
      if (hits < 0) {
        fprintf(stderr, "encache demo: encoder %d: lookup: %s\n", index,
                encache_errmsg(ec));
        rep.failed = 1;
        rep.poisoned = hits == ENCACHE_EPOISONED;
        break;
      }
      t_lookup = now_s() - t0;
    }
    for (int k = 0; k < n; k++) {
      const image *im = &set->img[pick[k]];
      rep.images++;
      if (ec != NULL)
        rep.outcome[res[k].outcome]++;
      if (res[k].outcome == ENCACHE_HIT) {
        rep.hits++;
        if (published[pick[k]])
          rep.hits_own++;
        else
          rep.hits_other++;
        hit_lat[rep.nhit_lat++] = t_lookup;
        if (o->verify == VERIFY_ALL ||
            (o->verify == VERIFY_SAMPLE && rep.hits % 8 == 1)) {
          encode(&enc, set, im, check);
          rep.verified++;
          if (memcmp(check, res[k].data, nbytes) != 0) {
            rep.verify_failed++;
            fprintf(stderr, "encache demo: encoder %d: VERIFICATION FAILED: "
                            "the hit for %s differs from a fresh encode\n",
                    index, im->id);
          }
        }
        free(res[k].data);
        continue;
      }
      double te = now_s();
      void *out = malloc(nbytes);
      encode(&enc, set, im, out);
      double dt = now_s() - te;
      rep.encodes++;
      rep.encode_s += dt;
      miss_lat[rep.nmiss_lat++] = t_lookup + dt;
      if (ec != NULL) {
        encache_storage *s = NULL;
        encache_storage_new(out, nbytes, tool_free, out, &s);
        int64_t shape[2] = {o->tokens, o->hidden};
        encache_tensor v = {out, o->dtype, 2, shape, NULL};
        int pq = encache_publish(ec, im->id, &v, s);
        encache_storage_unref(s);
        if (pq == ENCACHE_QUEUED)
          published[pick[k]] = 1;
        if (pq < 0) {
          fprintf(stderr, "encache demo: encoder %d: publish: %s\n", index,
                  encache_errmsg(ec));
          rep.failed = 1;
          rep.poisoned = pq == ENCACHE_EPOISONED;
        }
      } else {
        free(out);
      }
    }
    rep.requests++;
    __atomic_add_fetch(&sh->done[index], 1, __ATOMIC_RELAXED);
  }
  if (ec != NULL) {
    encache_stats st;
    encache_flush(ec);
    encache_stats_get(ec, &st);
    rep.bytes_read = st.bytes_read;
    rep.published_written = st.published_written;
    rep.published_present = st.published_present;
    rep.published_failed = st.published_failed;
    for (int k = 0; k < ENCACHE_SKIP_COUNT_; k++)
      rep.skipped[k] = st.published_skipped[k];
    if (encache_close(ec) != 0) {
      rep.poisoned = 1;
      rep.failed = 1;
    }
  }
  rep.wall_s = now_s() - t_start;
  write_all(fd, &rep, sizeof(rep));
  write_all(fd, hit_lat, sizeof(double) * rep.nhit_lat);
  write_all(fd, miss_lat, sizeof(double) * rep.nmiss_lat);
  return rep.failed || rep.verify_failed ? 1 : 0;
}

/* ---------------------------------------------------------------- a phase */

typedef struct phase {
  report total;
  double *hit_lat, *miss_lat;
  size_t nhit, nmiss;
  double wall_s;
  int failed;
} phase;

/* A child's report, as read from its pipe. */
typedef struct inbox {
  char *buf;
  size_t len, cap;
  int fd;
} inbox;

/* Reads what fd has; returns 0 at end of file. */
static int drain(inbox *in) {
  if (in->len == in->cap) {
    in->cap = in->cap ? in->cap * 2 : 65536;
    in->buf = realloc(in->buf, in->cap);
  }
  ssize_t r = read(in->fd, in->buf + in->len, in->cap - in->len);
  if (r > 0)
    in->len += (size_t)r;
  return r != 0 || errno == EINTR;
}

static void show_progress(const demo_opts *o, shared *sh, const char *label,
                          int tty, double t0, int final) {
  uint64_t done = 0, total = (uint64_t)o->encoders * (uint64_t)o->requests;
  for (int i = 0; i < o->encoders; i++)
    done += __atomic_load_n(&sh->done[i], __ATOMIC_RELAXED);
  if (tty)
    fprintf(stderr, "\r%-26s %5.1f%%  %" PRIu64 "/%" PRIu64 " requests  %.1f s%s",
            label, 100.0 * (double)done / (double)total, done, total,
            now_s() - t0, final ? "\n" : "");
  else
    fprintf(stderr, "%s: %" PRIu64 "/%" PRIu64 " requests, %.1f s\n", label,
            done, total, now_s() - t0);
}

static int run_phase(const demo_opts *o, const image_set *set, int use_cache,
                     const char *revision, phase *ph) {
  memset(ph, 0, sizeof(*ph));
  shared *sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED)
    return -1;
  memset(sh, 0, sizeof(*sh));
  pid_t pids[64];
  inbox in[64];
  memset(in, 0, sizeof(in));
  double t0 = now_s();
  fflush(NULL);
  for (int i = 0; i < o->encoders; i++) {
    int p[2];
    if (pipe(p) != 0)
      return -1;
    pids[i] = fork();
    if (pids[i] == 0) {
      close(p[0]);
      _exit(run_encoder(o, set, i, use_cache, revision, sh, p[1]));
    }
    close(p[1]);
    in[i].fd = p[0];
  }
  const char *label = use_cache ? "with encache" : "baseline (no cache)";
  int tty = isatty(2), open_fds = o->encoders;
  double last = now_s();
  /* Read the reports as they come (a full pipe would block a child), and
   * show progress meanwhile. */
  while (open_fds > 0) {
    struct pollfd pf[64];
    for (int i = 0; i < o->encoders; i++) {
      pf[i].fd = in[i].fd;
      pf[i].events = POLLIN;
    }
    poll(pf, (nfds_t)o->encoders, 100);
    for (int i = 0; i < o->encoders; i++)
      if (in[i].fd >= 0 && (pf[i].revents & (POLLIN | POLLHUP)) && !drain(&in[i])) {
        close(in[i].fd);
        in[i].fd = -1;
        open_fds--;
      }
    if (now_s() - last >= (tty ? 0.1 : 2.0)) {
      show_progress(o, sh, label, tty, t0, 0);
      last = now_s();
    }
  }
  for (int i = 0; i < o->encoders; i++) {
    int status;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ph->failed = 1;
  }
  ph->wall_s = now_s() - t0;
  show_progress(o, sh, label, tty, t0, 1);
  size_t cap = (size_t)o->encoders * (size_t)o->requests * 4;
  ph->hit_lat = malloc(sizeof(double) * cap);
  ph->miss_lat = malloc(sizeof(double) * cap);
  for (int i = 0; i < o->encoders; i++) {
    report r;
    if (in[i].len < sizeof(r)) {
      ph->failed = 1;
      free(in[i].buf);
      continue;
    }
    memcpy(&r, in[i].buf, sizeof(r));
    size_t nh = r.nhit_lat, nm = r.nmiss_lat;
    if (in[i].len != sizeof(r) + sizeof(double) * (nh + nm)) {
      ph->failed = 1;
      free(in[i].buf);
      continue;
    }
    memcpy(ph->hit_lat + ph->nhit, in[i].buf + sizeof(r), sizeof(double) * nh);
    memcpy(ph->miss_lat + ph->nmiss, in[i].buf + sizeof(r) + sizeof(double) * nh,
           sizeof(double) * nm);
    ph->nhit += nh;
    ph->nmiss += nm;
    free(in[i].buf);
    /* Sum every counter (the report is all uint64_t up to encode_s). */
    uint64_t *dst = (uint64_t *)&ph->total;
    const uint64_t *src = (const uint64_t *)&r;
    size_t nu = offsetof(report, encode_s) / sizeof(uint64_t);
    for (size_t k = 0; k < nu; k++)
      dst[k] += src[k];
    ph->total.encode_s += r.encode_s;
    ph->total.poisoned |= r.poisoned;
    ph->total.failed |= r.failed;
  }
  munmap(sh, sizeof(shared));
  return 0;
}

/* ---------------------------------------------------------------- summary */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pctl(double *v, size_t n, int p) {
  if (n == 0)
    return 0;
  qsort(v, n, sizeof(double), cmp_double);
  size_t i = (n * (size_t)p) / 100;
  return v[i < n ? i : n - 1];
}

static void human_bytes(char *buf, size_t size, uint64_t b) {
  if (b >= (1ull << 30))
    snprintf(buf, size, "%.2f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, size, "%.1f MiB", (double)b / (1ull << 20));
  else
    snprintf(buf, size, "%.1f KiB", (double)b / 1024);
}

static void summary(const demo_opts *o, const char *url, const image_set *set,
                    phase *c, phase *b, int verified_ok) {
  report *t = &c->total;
  double thr = (double)t->images / c->wall_s;
  double bthr = b ? (double)b->total.images / b->wall_s : 0;
  double hp50 = pctl(c->hit_lat, c->nhit, 50) * 1e3,
         hp99 = pctl(c->hit_lat, c->nhit, 99) * 1e3,
         mp50 = pctl(c->miss_lat, c->nmiss, 50) * 1e3,
         mp99 = pctl(c->miss_lat, c->nmiss, 99) * 1e3;
  double saved = b ? b->total.encode_s - t->encode_s
                   : (double)t->hits * (t->encodes ? t->encode_s / (double)t->encodes : 0);
  uint64_t skipped = 0;
  for (int k = 1; k < ENCACHE_SKIP_COUNT_; k++)
    skipped += t->skipped[k];
  const char *dt = encache_dtype_name(o->dtype);
  if (o->json) {
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
    printf("  \"encodes\": %" PRIu64 ",\n  \"encodes_avoided\": %" PRIu64 ",\n",
           t->encodes, t->images - t->encodes);
    printf("  \"encoder_seconds\": %.3f,\n  \"encoder_seconds_saved\": %.3f,\n",
           t->encode_s, saved);
    printf("  \"throughput_images_per_s\": %.1f,\n", thr);
    if (b)
      printf("  \"baseline_throughput_images_per_s\": %.1f,\n  \"speedup\": %.2f,\n",
             bthr, thr / bthr);
    printf("  \"hit_latency_ms\": {\"p50\": %.3f, \"p99\": %.3f},\n", hp50, hp99);
    printf("  \"miss_latency_ms\": {\"p50\": %.3f, \"p99\": %.3f},\n", mp50, mp99);
    printf("  \"bytes_read\": %" PRIu64 ",\n  \"publications\": {\"written\": %" PRIu64
           ", \"already_present\": %" PRIu64 ", \"failed\": %" PRIu64,
           t->bytes_read, t->published_written, t->published_present,
           t->published_failed);
    static const char *const skip_ids[] = {
#define SKIP_ID_(name, value, msg) [value] = #name,
        ENCACHE_SKIP_MAP(SKIP_ID_)
#undef SKIP_ID_
    };
    for (int k = 1; k < ENCACHE_SKIP_COUNT_; k++)
      if (t->skipped[k])
        printf(", \"skipped_%s\": %" PRIu64, skip_ids[k], t->skipped[k]);
    printf("},\n  \"verification\": {\"mode\": \"%s\", \"checked\": %" PRIu64
           ", \"failed\": %" PRIu64 ", \"passed\": %s}\n}\n",
           o->verify == VERIFY_ALL ? "all" : o->verify == VERIFY_SAMPLE ? "sample" : "none",
           t->verified, t->verify_failed, verified_ok ? "true" : "false");
    return;
  }
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
    snprintf(bthr_s, sizeof(bthr_s), "%20.1f", bthr);
  }
  printf("%-30s %16s %20s\n", "", "with encache", b ? "without (baseline)" : "");
  printf("%-30s %16" PRIu64 " %s\n", "requests", t->requests, bq);
  printf("%-30s %16" PRIu64 " %s\n", "images", t->images, bi);
  printf("%-30s %16" PRIu64 " %s\n", "encoder runs", t->encodes, be);
  printf("%-30s %9" PRIu64 " (%4.1f%%)\n", "encodes avoided",
         t->images - t->encodes,
         t->images ? 100.0 * (double)(t->images - t->encodes) / (double)t->images : 0);
  printf("%-30s %16" PRIu64 "\n", "  hits from other encoders", t->hits_other);
  printf("%-30s %16" PRIu64 "\n", "  hits of own publications", t->hits_own);
  printf("%-30s %16s\n", "misses by reason", "");
  static const char *const names[] = {"", "miss", "incompatible", "oversize",
                                      "unavailable", "skipped"};
  for (int k = 1; k <= ENCACHE_SKIPPED; k++)
    printf("  %-28s %16" PRIu64 "\n", names[k], t->outcome[k]);
  printf("%-30s %15.2fs %s\n", "encoder time", t->encode_s, bt);
  printf("%-30s %15.2fs%s\n", "encoder time saved", saved,
         b ? "" : "  (estimated: hits x mean encode time)");
  printf("%-30s %16.1f %s\n", "throughput (images/s)", thr, bthr_s);
  if (b)
    printf("%-30s %15.2fx\n", "speed-up", thr / bthr);
  printf("%-30s %9.3f / %.3f ms\n", "hit latency p50 / p99", hp50, hp99);
  printf("%-30s %9.3f / %.3f ms\n", "miss latency p50 / p99", mp50, mp99);
  printf("%-30s %16s\n", "bytes read", rb);
  printf("%-30s %16s  (%" PRIu64 " objects; %" PRIu64 " already present)\n",
         "bytes published", wb, t->published_written, t->published_present);
  printf("%-30s %16" PRIu64, "publications skipped", skipped + t->published_failed);
  for (int k = 1; k < ENCACHE_SKIP_COUNT_; k++)
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
    "  --seed N           workload seed (default 1)\n"
    "  --json             print the summary as JSON\n"
    "Exit status: 0 when it ran and verification passed, 1 otherwise.\n";

static int int_opt(const char *name, const char *v, int lo, int hi, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    usage_error("demo", "%s: must be an integer from %d to %d, got \"%s\"",
                name, lo, hi, v);
    return -1;
  }
  *out = (int)x;
  return 0;
}

int cmd_demo(const tool_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"encoders", required_argument, NULL, 'e'},
      {"requests", required_argument, NULL, 'r'},
      {"images", required_argument, NULL, 'i'},
      {"tokens", required_argument, NULL, 't'},
      {"hidden", required_argument, NULL, 'H'},
      {"dtype", required_argument, NULL, 'd'},
      {"skew", required_argument, NULL, 's'},
      {"verify", required_argument, NULL, 'v'},
      {"baseline", no_argument, NULL, 'b'},
      {"no-baseline", no_argument, NULL, 'B'},
      {"seed", required_argument, NULL, 'S'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  demo_opts o = {4, 100, 48, 64, 768, ENCACHE_FLOAT32, VERIFY_SAMPLE, 1, 0,
                 1.1, 1, NULL, NULL};
  int c, seed = 1;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'e': if (int_opt("--encoders", optarg, 1, 64, &o.encoders)) return EXIT_USAGE; break;
    case 'r': if (int_opt("--requests", optarg, 1, 10000000, &o.requests)) return EXIT_USAGE; break;
    case 'i':
      if (optarg[0] >= '0' && optarg[0] <= '9') {
        if (int_opt("--images", optarg, 1, 1000000, &o.images))
          return EXIT_USAGE;
      } else {
        o.images_dir = optarg;
      }
      break;
    case 't': if (int_opt("--tokens", optarg, 1, 65536, &o.tokens)) return EXIT_USAGE; break;
    case 'H': if (int_opt("--hidden", optarg, 1, 65536, &o.hidden)) return EXIT_USAGE; break;
    case 'd':
      if ((o.dtype = encache_dtype_parse(optarg)) < 0)
        return usage_error("demo", "--dtype: unknown dtype \"%s\"", optarg);
      break;
    case 's': {
      char *end;
      o.skew = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || !(o.skew >= 0) || o.skew > 10)
        return usage_error("demo", "--skew: must be a number from 0 to 10, "
                                   "got \"%s\"", optarg);
      break;
    }
    case 'v':
      if (strcmp(optarg, "all") == 0)
        o.verify = VERIFY_ALL;
      else if (strcmp(optarg, "sample") == 0)
        o.verify = VERIFY_SAMPLE;
      else if (strcmp(optarg, "none") == 0)
        o.verify = VERIFY_NONE;
      else
        return usage_error("demo", "--verify: all, sample or none, got \"%s\"",
                           optarg);
      break;
    case 'b': o.baseline = 1; break;
    case 'B': o.baseline = 0; break;
    case 'S': if (int_opt("--seed", optarg, 0, INT32_MAX, &seed)) return EXIT_USAGE; break;
    case 'j': o.json = 1; break;
    case 'h': fputs(demo_usage, stdout); return EXIT_OK;
    case ':': return usage_error("demo", "%s needs a value", argv[optind - 1]);
    default:
      return usage_error("demo", "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("demo", "unexpected argument '%s'", argv[optind]);
  o.seed = (unsigned)seed;

  image_set set;
  memset(&set, 0, sizeof(set));
  if (make_images(&o, &set) < 0)
    return EXIT_USAGE;
  uint64_t out_bytes = (uint64_t)o.tokens * (uint64_t)o.hidden *
                       encache_dtype_size(o.dtype);

  /* The Store: the one given, or a private shm segment sized for every
   * output twice over. */
  char own_url[160], own_name[64], revision[64];
  const char *url = g->store_url;
  own_name[0] = '\0';
  if (url == NULL) {
    uint64_t need = (out_bytes + 4096) * (uint64_t)set.n * 2 + (16u << 20);
    snprintf(own_name, sizeof(own_name), "encache-demo-%d", (int)getpid());
    snprintf(own_url, sizeof(own_url), "shm://%s?size=%" PRIu64, own_name, need);
    encache_shm_destroy(own_name);
    url = own_url;
  }
  o.store_url = url;
  /* A namespace of this run's own, so that hits are this run's. */
  snprintf(revision, sizeof(revision), "run-%d-%ld", (int)getpid(),
           (long)time(NULL));

  phase cached, base;
  int rc = run_phase(&o, &set, 1, revision, &cached);
  int baseline_ok = 0;
  if (rc == 0 && o.baseline)
    baseline_ok = run_phase(&o, &set, 0, revision, &base) == 0;
  if (own_name[0])
    encache_shm_destroy(own_name);
  if (rc != 0) {
    fprintf(stderr, "encache demo: could not start the encoders\n");
    return EXIT_FAIL;
  }
  int verified_ok = cached.total.verify_failed == 0 && !cached.total.poisoned;
  summary(&o, url, &set, &cached, baseline_ok ? &base : NULL, verified_ok);
  fflush(stdout);
  int exit_code = EXIT_OK;
  if (cached.failed || !verified_ok) {
    fprintf(stderr, "encache demo: %s\n",
            !verified_ok ? "VERIFICATION FAILED: a hit differed from a fresh "
                           "encode (see above)"
                         : "an encoder failed (see above)");
    exit_code = EXIT_FAIL;
  }
  free(cached.hit_lat);
  free(cached.miss_lat);
  if (baseline_ok) {
    free(base.hit_lat);
    free(base.miss_lat);
  }
  for (int i = 0; i < set.n; i++)
    free(set.img[i].rgb);
  free(set.img);
  return exit_code;
}
