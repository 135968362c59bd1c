/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's lookups on the stand-in Mooncake library: one read per
 * lookup, faults without the existence check, reads straight into the
 * caller's headroom, large slots on a page.
 * The stand-in library is tests/fake_mooncake.c; the helpers several of
 * these files share are in tests/mooncake_util.c.  With a real Mooncake
 * Store (ENCACHE_TEST_MOONCAKE=1), tests/on_mooncake.sh runs the
 * conformance and acceptance suites on it.
 */
#include "mooncake_util.h"

#include "engine.h"
#include "lookup_read.h"
#include "fault_store.h"
#include "mooncake_codes.h"
#include "store_util.h"

#include <dlfcn.h>
#include <unistd.h>

/* A lookup is one batch_get_into: its -704 answers are the misses, with
 * the reason and counters of an existence check's; an object larger than
 * the staging buffer still gets the check (OVERSIZE is said only of
 * objects that exist). */
TEST(mooncake_lookup_is_one_read) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 4096, &f);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  encache_result r[3];
  static const char *const abc[] = {"a", "c", "b"};
  ASSERT_EQ_INT(lookup_fake(step, abc, 3, r), 2);
  ASSERT_EQ_INT(f.calls[F_EXIST], 0);
  ASSERT_EQ_INT(f.calls[F_GET], 1);
  ASSERT_EQ_INT(r[0].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_HIT);
  ASSERT_EQ_INT((int)((float *)r[2].data)[0], 1);
  free_results(r, 3);
  encache_stats s = ENCACHE_STATS_INIT;
  encache_stats_get(ec, &s);
  ASSERT_EQ_U64(s.hits, 2);
  ASSERT_EQ_U64(s.misses, 1);
  /* 16 KiB + 24 does not fit 4096 bytes: checked, absent, a MISS. */
  static const char *const abig[] = {"a", "big"};
  ASSERT_EQ_INT(lookup_fake(step, abig, 2, r), 1);
  ASSERT_EQ_INT(f.calls[F_EXIST], 1);
  ASSERT_EQ_INT(r[1].outcome, ENCACHE_MISS);
  ASSERT_EQ_STR(r[1].why, "not in the Store");
  free_results(r, 2);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* The faults of the skipped check: a recoverable read answer is
 * UNAVAILABLE; a code that would poison a read but is not about a
 * transfer (an invalid key, an unknown code) is asked about, and of a
 * missing key is what the check would have said (encode instead); of a
 * key that is there it poisons, as before; a failed batch poisons, as a
 * failed read always did. */
TEST(mooncake_lookup_faults_without_the_check) {
  static const int codes[] = {-900, -400, -31337};
  for (size_t k = 0; k < 3; k++) {
    fake_ctl f;
    encache *ec = engine_on_fake("tcp", 4096, &f);
    encache_step *step = NULL;
    ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
    encache_result r[2];
    static const char *const cd[] = {"c", "d"};
    f.inject[F_GET] = codes[k];
    ASSERT_EQ_INT(lookup_fake(step, cd, 2, r), 0);
    int want = codes[k] == -900 ? ENCACHE_UNAVAILABLE : ENCACHE_MISS;
    ASSERT_EQ_INT(r[0].outcome, want);
    ASSERT_EQ_INT(r[1].outcome, want);
    ASSERT_EQ_INT(f.calls[F_EXIST], codes[k] == -900 ? 0 : 2);
    /* The check itself failing: encode instead. */
    f.inject[F_EXIST] = -900;
    ASSERT_EQ_INT(lookup_fake(step, cd, 2, r), 0);
    ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
    f.inject[F_EXIST] = 0;
    static const char *const a[] = {"a"};
    int got = lookup_fake(step, a, 1, r);
    if (codes[k] == -900) {
      ASSERT_EQ_INT(got, 0);
      ASSERT_EQ_INT(r[0].outcome, ENCACHE_UNAVAILABLE);
      f.inject[F_GET] = 0;
      f.inject_batch[F_GET] = -1;
      got = lookup_fake(step, a, 1, r);
    }
    ASSERT_EQ_INT(got, ENCACHE_EPOISONED);
    ASSERT_EQ_INT(encache_close(ec), ENCACHE_EPOISONED);
  }
  unlink(cfg_path);
}

/* Destinations with 64 bytes in front and 64 behind, all 0xEE. */
typedef struct roomy {
  int allocs, releases, copies;
} roomy;

static roomy *roomy_now;

static int roomy_alloc(void *ctx, size_t i, const encache_candidate *c,
                       uint64_t nbytes, void **data, void **handle) {
  (void)i, (void)c;
  unsigned char *base = malloc(64 + nbytes + 64);
  ASSERT(base != NULL);
  memset(base, 0xee, 64 + nbytes + 64);
  ((roomy *)ctx)->allocs++;
  *handle = base;
  *data = base + 64;
  return 0;
}

static void roomy_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i, (void)data;
  ((roomy *)ctx)->releases++;
  free(handle);
}

static int roomy_copy(void *dst, const void *src, size_t n) {
  roomy_now->copies++;
  memcpy(dst, src, n);
  return 0;
}

/* Writes the 512x512 float32 object ID (1 MiB), its floats v, v+1, ... */
static void write_big(encache *ec, const char *id, float v) {
  static float m[512 * 512];
  for (size_t k = 0; k < 512 * 512; k++)
    m[k] = v + (float)k;
  int64_t shape[2] = {512, 512};
  encache_tensor t = {sizeof t, m, ENCACHE_FLOAT32, 2, shape, NULL, 0, 0, NULL};
  unsigned char hdr[24];
  char key[256];
  encache_header_encode(&t, hdr);
  encache_key(encache_namespace_of(ec), id, key, sizeof(key));
  ASSERT_EQ_INT(encache_store_write(ec->store, key, hdr, 24, m, sizeof(m)), 0);
}

/* Looks A, B, C (absent) and A again up (1 MiB each, else the 2x2 a, b, c,
 * a) with an allocator of headroom h; checks every hit, what lies around
 * it and that the miss took no destination; returns the copies made (out
 * of the staging buffer or a destination) and in *checks the existence
 * checks. */
static int lookup_roomy(encache_step *step, int big, size_t h, fake_ctl *f,
                        int *checks) {
  static const char *const ids[2][4] = {{"a", "b", "c", "a"},
                                        {"A", "B", "C", "A"}};
  uint64_t side = big ? 512 : 2, nbytes = side * side * 4;
  roomy t = {0, 0, 0};
  roomy_now = &t;
  encache__copy_hook = roomy_copy;
  encache_allocator a = {sizeof(a), &t, roomy_alloc, roomy_release, h};
  encache_candidate c[4];
  encache_result r[4];
  for (int i = 0; i < 4; i++) {
    c[i] = (encache_candidate){sizeof(c[i]), ids[big][i],
                               ENCACHE_MODALITY_IMAGE, ENCACHE_FLOAT32, side,
                               side, ENCACHE_DEVICE_HOST, 0};
    r[i].size = sizeof(r[i]);
  }
  *checks = f->calls[F_EXIST];
  ASSERT_EQ_INT(encache_lookup(step, c, 4, &a, r), 3);
  encache__copy_hook = NULL;
  *checks = f->calls[F_EXIST] - *checks;
  ASSERT_EQ_INT(r[2].outcome, ENCACHE_MISS);
  ASSERT_EQ_INT(t.allocs, 3); /* none for the miss */
  ASSERT_EQ_INT(t.releases, 0);
  for (int i = 0; i < 4; i++) {
    if (i == 2)
      continue;
    ASSERT_EQ_INT(r[i].outcome, ENCACHE_HIT);
    const float *got = r[i].data;
    float first = big ? (i == 1 ? 7000 : 3000) : (float)(i == 1);
    ASSERT(got[0] == first && got[3] == (big ? first + 3 : 4));
    unsigned char *base = r[i].handle, *d = r[i].data;
    int whole = *checks > 0; /* the whole-object path checks first */
    for (size_t k = 0; k < 64 - (whole ? 24 : 0); k++)
      ASSERT_EQ_INT(base[k], 0xee);
    for (size_t k = 0; k < 64; k++)
      ASSERT_EQ_INT(d[nbytes + k], 0xee);
    if (whole && i < 2) /* the object's header, read in front */
      ASSERT_EQ_U64(((encache_header *)(void *)(d - 24))->magic,
                    ENCACHE_MAGIC);
    free(base);
  }
  return t.copies;
}

/* Over TCP (no registration, no split read) an allocator with room for
 * the header in front of each destination gets whole objects of 1 MiB
 * or more in all read straight into it, after an existence check (a miss
 * takes no destination): no copy but the duplicate's, nothing written
 * outside [data - 24, data + nbytes).  With less room, or less than
 * 1 MiB of objects, staged without the check, as before. */
TEST(mooncake_reads_straight_into_headroom) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 8u << 20, &f);
  write_big(ec, "A", 3000);
  write_big(ec, "B", 7000);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  int checks = 0;
  ASSERT_EQ_INT(lookup_roomy(step, 1, ENCACHE_HEADER_SIZE, &f, &checks), 1);
  ASSERT_EQ_INT(checks, 1);
  ASSERT_EQ_INT(lookup_roomy(step, 1, 64, &f, &checks), 1);
  ASSERT_EQ_INT(lookup_roomy(step, 1, ENCACHE_HEADER_SIZE - 1, &f, &checks),
                3);
  ASSERT_EQ_INT(checks, 0);
  ASSERT_EQ_INT(lookup_roomy(step, 1, 0, &f, &checks), 3);
  ASSERT_EQ_INT(lookup_roomy(step, 0, 64, &f, &checks), 3); /* 48 bytes */
  ASSERT_EQ_INT(checks, 0);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}

/* A staged lookup packs small objects in the staging buffer, and starts
 * each of 64 KiB or more on a page (reads into memory just past a page
 * were slower: lookup.c, SLOT_PAGE_MIN). */
TEST(mooncake_large_slots_start_on_a_page) {
  fake_ctl f;
  encache *ec = engine_on_fake("tcp", 8u << 20, &f);
  write_big(ec, "A", 3000);
  write_big(ec, "B", 7000);
  void *lib = dlopen(FAKE_MOONCAKE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(lib != NULL);
  void **bufs = dlsym(lib, "fake_mooncake_get_bufs");
  dlclose(lib);
  ASSERT(bufs != NULL);
  encache_step *step = NULL;
  ASSERT_EQ_INT(encache_step_open(ec, &step), 0);
  int checks = 0;
  ASSERT_EQ_INT(lookup_roomy(step, 1, 0, &f, &checks), 3);
  uintptr_t a = (uintptr_t)bufs[0], b = (uintptr_t)bufs[1];
  ASSERT_EQ_U64(b % 4096, 0);
  ASSERT_EQ_U64(b - a, ((1u << 20) + 24 + 4095) & ~(uintptr_t)4095);
  ASSERT_EQ_INT(lookup_roomy(step, 0, 0, &f, &checks), 3);
  ASSERT_EQ_U64((uintptr_t)bufs[1] - (uintptr_t)bufs[0], 24 + 16);
  ASSERT_EQ_INT(encache_close(ec), 0);
  unlink(cfg_path);
}
