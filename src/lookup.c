/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.c: the read path of one encoder step (docs/behaviour.md, Lookup),
 * as a plan that phases fill in turn, each a function over one `plan`:
 *
 *   dedupe    eligibility (modality, dtype, shape, device); duplicate ids
 *             become one item (read once, copied to each); the eligible
 *             candidates join the step;
 *   exists    one batched existence check (skipped where the read's own
 *             answer says "absent" as well: exists_needed);
 *   classify  each existence answer; an object larger than the staging
 *             buffer is OVERSIZE (with a warning naming both sizes);
 *   chunk     walk the present items in order, object size = 24 + payload;
 *             one that does not fit the rest of the current chunk closes
 *             it; slots are packed from offset 0, each of SLOT_PAGE_MIN
 *             or more on a page;
 *   read      per chunk, one batched read (into the staging buffer's
 *             slots, or straight into destinations; lookup_read.c);
 *   validate  every answer and header of the chunk;
 *   deliver   the chunk's destinations, all before any copy, then the
 *             copies (outputs never alias the staging buffer);
 *   finish    outcomes and counters, copied out to the caller's results.
 *
 * The staging buffer is allocated and registered before the first chunk
 * that needs it (never when nothing is present or all are oversize; at
 * the first read when the existence check is skipped), kept for
 * every later lookup of its lane (core.h), and unregistered only at close
 * (the lane's lookup thread's end).
 *
 * Every Store answer is classified by encache_store_classify(): a count
 * equal to the slot is a read, a smaller one or "too large" is an
 * incompatible object, absent is a miss, recoverable is UNAVAILABLE;
 * anything else (a count above the slot, an unknown code, an unconfirmed
 * batch) poisons the handle, and the staging buffer and destinations are
 * then kept forever.
 *
 * Scratch memory: every array of the plan is carved from one buffer of
 * the lane (reused step to step: no allocation per lookup once it has
 * grown).  PLAN_ARRAYS lists them once; the size is computed from that
 * list and the carving walks the same list, with a bounds assertion.
 */
#include "lookup.h"
#include "lease.h"
#include "lookup_read.h"
#include "device.h"
#include "fleet.h"
#include "publisher.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------- the scratch */

#define ALIGN_ 16

/* Adds count elements of elem bytes, aligned, to *sum; 0 or ENOMEM. */
static int size_add(size_t *sum, size_t count, size_t elem) {
  size_t part;
  if (__builtin_mul_overflow(count, elem, &part) || part > SIZE_MAX - ALIGN_)
    return ENCACHE_ENOMEM;
  part = (part + ALIGN_ - 1) & ~(size_t)(ALIGN_ - 1);
  return __builtin_add_overflow(*sum, part, sum) ? ENCACHE_ENOMEM : 0;
}

static int plan_size(const encache__plan *p, size_t *total) {
  size_t n = p->n, text = p->text;
  *total = 0;
#define PLAN_SIZE_(name, type, count)                                        \
  if (size_add(total, (size_t)(count), sizeof(type)) < 0)                    \
    return ENCACHE_ENOMEM;
  PLAN_ARRAYS(PLAN_SIZE_)
#undef PLAN_SIZE_
  return 0;
}

static void *carve(unsigned char *base, size_t cap, size_t *off, size_t count,
                   size_t elem) {
  void *r = base + *off;
  size_t end = *off;
  ENCACHE_ASSERT(size_add(&end, count, elem) == 0 && end <= cap);
  *off = end;
  return r;
}

static void plan_carve(encache__plan *p, unsigned char *base, size_t cap) {
  size_t n = p->n, text = p->text, off = 0;
#define PLAN_CARVE_(name, type, count)                                       \
  p->name = carve(base, cap, &off, (size_t)(count), sizeof(type));
  PLAN_ARRAYS(PLAN_CARVE_)
#undef PLAN_CARVE_
}

void encache__lookup_free(encache__lane *lane) {
  encache__free(lane->scratch);
  lane->scratch = NULL;
  lane->scratch_cap = 0;
}

/* Makes the lane's scratch hold at least need bytes (contents not kept). */
static int reserve(encache__lane *lane, size_t need) {
  if (need <= lane->scratch_cap)
    return 0;
  size_t size = need <= SIZE_MAX / 3 * 2 ? need + need / 2 : need;
  void *q = encache__malloc(size);
  if (q == NULL)
    return ENCACHE_ENOMEM;
  encache__free(lane->scratch);
  lane->scratch = q;
  lane->scratch_cap = size;
  return 0;
}

/* ------------------------------------------------------------ the plan */

/* The allocator check of plan_begin(), made before any Store call. */
static int allocator_check(encache *ec, const encache_allocator *a,
                           encache_allocator *full, int quiet) {
  if (a == NULL || encache__struct_in(full, sizeof(*full), a,
                                      ENCACHE__ALLOCATOR_MIN) < 0 ||
      full->alloc == NULL)
    return quiet ? ENCACHE_EINVAL : encache__fail(ec, ENCACHE_EINVAL,
                         "lookup: an allocator is required (size set to "
                         "sizeof(encache_allocator), alloc set)");
  return 0;
}

/* Checks the caller's structs, sizes and carves the scratch, copies the
 * candidates in. */
static int plan_begin(encache__plan *p, encache_step *step,
                      const encache_candidate *c, size_t n,
                      const encache_allocator *a, encache__lane *lane,
                      int yield) {
  encache *ec = step->ec;
  memset(p, 0, sizeof(*p));
  p->ec = ec;
  p->step = step;
  p->lane = lane != NULL ? lane : &ec->lane;
  p->yield = yield;
  p->caller_c = c;
  p->n = n;
  if (allocator_check(ec, a, &p->a, 0) < 0)
    return ENCACHE_EINVAL;
  size_t ns_len = strlen(ec->ns);
  for (size_t i = 0; i < n; i++) {
    const encache_candidate *ci = encache__plan_cand(p, i);
    if (ci->size != c->size ||
        encache__struct_check(ci, sizeof(encache_candidate),
                              ENCACHE__CANDIDATE_MIN) < 0)
      return encache__fail(ec, ENCACHE_EINVAL,
                           "lookup: candidate %zu: size %zu (candidate 0's "
                           "is %zu; this library's sizeof is %zu, a larger "
                           "one must hold zeros beyond it)", i, ci->size,
                           c->size, sizeof(encache_candidate));
    size_t need = ci->id != NULL ? strlen(ci->id) : 0;
    if (ci->id != NULL &&
        (__builtin_add_overflow(need, ns_len + 5, &need) ||
         __builtin_add_overflow(p->text, need, &p->text)))
      return encache__fail(ec, ENCACHE_ENOMEM, "lookup: out of memory");
  }
  size_t total;
  if (plan_size(p, &total) < 0 || reserve(p->lane, total) < 0)
    return encache__fail(ec, ENCACHE_ENOMEM, "lookup: out of memory");
  plan_carve(p, p->lane->scratch, p->lane->scratch_cap);
  for (size_t i = 0; i < n; i++) {
    encache__struct_in(&p->cand[i], sizeof(p->cand[i]), encache__plan_cand(p, i),
                       ENCACHE__CANDIDATE_MIN);
    memset(&p->res[i], 0, sizeof(p->res[i]));
    p->res[i].size = sizeof(p->res[i]);
    p->res[i].outcome = ENCACHE_SKIPPED;
    p->unique_of[i] = SIZE_MAX;
  }
  return 0;
}

/* NULL when c is eligible, or the rule it breaks (SKIPPED's why). */
static const char *ineligible(encache_step *step,
                              const encache_candidate *c) {
  uint64_t nbytes;
  if (c->id == NULL || c->id[0] == '\0')
    return "no id (NULL or empty)";
  size_t idlen = strnlen(c->id, ENCACHE_MAX_ID_LEN + 1);
  if (idlen > ENCACHE_MAX_ID_LEN)
    return encache__step_note(step, "the id is too long",
                              "the id of %zu bytes is too long (at most %d: "
                              "ENCACHE_MAX_ID_LEN)", strlen(c->id),
                              ENCACHE_MAX_ID_LEN);
  if (c->modality != ENCACHE_MODALITY_IMAGE)
    return "not an image (only image outputs are cached)";
  const char *why;
  if (c->device != ENCACHE_DEVICE_HOST &&
      (why = encache__device_ineligible(c)) != NULL)
    return why; /* device.c: no CUDA runtime, or not a device of it */
  if (c->rows == 0 || c->cols == 0)
    return "rows or cols is 0";
  if (encache_dtype_size(c->dtype) == 0)
    return "dtype not float32/float16/bfloat16";
  if (encache_payload_size(c->dtype, c->rows, c->cols, &nbytes) != 0 ||
      nbytes > SIZE_MAX - ENCACHE_HEADER_SIZE)
    return "rows x cols too large";
  return NULL;
}

/* The item candidate i duplicates (same id, same contract), or SIZE_MAX. */
static size_t duplicate_of(const encache__plan *p, size_t i) {
  const encache_candidate *ci = &p->cand[i];
  for (size_t u = 0; u < p->nu; u++) {
    const encache_candidate *f = &p->cand[p->items[u].first];
    if (p->hash[p->items[u].first] == p->hash[i] && strcmp(f->id, ci->id) == 0 &&
        f->dtype == ci->dtype && f->rows == ci->rows && f->cols == ci->cols)
      return u;
  }
  return SIZE_MAX;
}

/* Phase dedupe: the items, their keys; the step learns its candidates. */
static int phase_dedupe(encache__plan *p) {
  size_t ns_len = strlen(p->ec->ns), text = 0;
  char *keytext = p->keytext;
  for (size_t i = 0; i < p->n; i++) {
    const encache_candidate *ci = &p->cand[i];
    if ((p->res[i].why = ineligible(p->step, ci)) != NULL)
      continue;
    p->hash[i] = encache__hash_id(ci->id);
    if ((p->unique_of[i] = duplicate_of(p, i)) != SIZE_MAX)
      continue;
    encache__item *it = &p->items[p->nu];
    memset(it, 0, sizeof(*it));
    it->first = i;
    it->outcome = ENCACHE_MISS;
    it->why = "not in the Store";
    encache_payload_size(ci->dtype, ci->rows, ci->cols, &it->nbytes);
    it->osize = ENCACHE_HEADER_SIZE + it->nbytes;
    size_t idlen = strlen(ci->id);
    it->key = keytext;
    encache_key(p->ec->ns, ci->id, keytext, ns_len + 5 + idlen);
    keytext += ns_len + 5 + idlen;
    text += idlen + 1;
    p->keys[p->nu] = it->key;
    p->unique_of[i] = p->nu++;
  }
  ENCACHE_ASSERT(keytext <= p->keytext + p->text);
  if (encache__step_reserve(p->step, p->nu, text) < 0)
    return encache__fail(p->ec, ENCACHE_ENOMEM,
                         "lookup: out of memory (the step's candidates)");
  for (size_t u = 0; u < p->nu; u++)
    encache__step_add(p->step, &p->cand[p->items[u].first],
                      p->hash[p->items[u].first]);
  return 0;
}


/* Phase exists: one batched existence check.  1: stop (recoverable). */
static int phase_exists(encache__plan *p) {
  encache_store *st = p->ec->store;
  encache__plan_store_begin(p);
  int answer = st->ops->exists(st, p->keys, p->nu, p->present);
  encache__plan_store_end(p);
  int rc = encache__plan_batch(p, answer, "the existence check");
  if (rc == 1)
    encache__plan_unavailable(p, 0, p->nu,
                              encache__plan_store_why(p, "the existence check",
                                                      answer, 0));
  return rc;
}

/* Phase classify: each existence answer; oversize objects. */
static int phase_classify(encache__plan *p) {
  for (size_t u = 0; u < p->nu; u++) {
    encache__item *it = &p->items[u];
    int ans = p->present[u];
    int cls = encache_store_classify(ans);
    if (cls == ENCACHE_ANSWER_RECOVERABLE) { /* e.g. a key it refuses */
      it->outcome = ENCACHE_UNAVAILABLE;
      it->why = encache__plan_store_why(p, "the existence check of this "
                                        "key", ans, 1);
      continue;
    }
    if (cls == ENCACHE_ANSWER_ABSENT)
      ans = 0;
    else if (cls != ENCACHE_ANSWER_OK || (ans != 0 && ans != 1))
      return encache__poison(p->ec, "the existence check answered an "
                                    "unknown code %d for %s", ans, it->key);
    if (ans == 1)
      encache__plan_present(p, it);
  }
  return 0;
}

/* Objects of this size or more get a slot that starts on a page (the
 * staging buffer is page-aligned: reads into a slot past a page are
 * slower, docs/performance.md, "Figures behind the engine's constants").
 * Smaller ones are packed. */
#define SLOT_PAGE_MIN 65536

/* Phase chunk: present, fitting items first (stable; unique_of follows),
 * then their slots (page-aligned from SLOT_PAGE_MIN up) and chunk
 * boundaries. */
static void phase_chunk(encache__plan *p) {
  size_t w = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t u = 0; u < p->nu; u++) {
      int fits = p->items[u].present && p->items[u].outcome != ENCACHE_OVERSIZE;
      if (fits == (pass == 0)) {
        p->newpos[u] = w;
        p->sorted[w++] = p->items[u];
      }
    }
  memcpy(p->items, p->sorted, p->nu * sizeof(encache__item));
  for (size_t i = 0; i < p->n; i++)
    if (p->unique_of[i] != SIZE_MAX)
      p->unique_of[i] = p->newpos[p->unique_of[i]];
  uint64_t used = 0;
  for (size_t u = 0; u < p->np; u++) {
    encache__item *it = &p->items[u];
    if (it->osize >= SLOT_PAGE_MIN) /* a page-aligned slot (see above) */
      used = (used + 4095) & ~(uint64_t)4095;
    it->chunk_start = u == 0 || used + it->osize > p->ec->read_buf_bytes;
    if (it->chunk_start)
      used = 0;
    it->off = used;
    used += it->osize;
    p->keys[u] = it->key;
  }
}

/* Whether the lookup needs the existence check.  A Store whose read
 * answers "absent" as cheaply (ENCACHE_STORE_CAP_READ_ABSENT) is read
 * without it, every item taken as present, when that changes no outcome:
 * reads through the staging buffer (a direct read would hand out, then
 * take back, a destination per miss), no item too large for the buffer
 * (OVERSIZE is said only of objects that exist), single flight off (its
 * leases are taken for the absent). */
static int exists_needed(const encache__plan *p) {
  const encache__store_profile *sp = encache__store_profile_of(p->ec->store);
  if (!sp->read_absent || p->ec->single_flight || p->whole || sp->read_direct)
    return 1;
  for (size_t u = 0; u < p->nu; u++)
    if (p->items[u].osize > p->ec->read_buf_bytes)
      return 1;
  return 0;
}

static int plan_run(encache__plan *p) {
  int rc = phase_dedupe(p);
  if (rc < 0 || p->nu == 0)
    return rc;
  encache__plan_whole(p);
  if (!exists_needed(p)) {
    for (size_t u = 0; u < p->nu; u++) {
      p->items[u].unchecked = 1; /* its read says whether it exists */
      encache__plan_present(p, &p->items[u]);
    }
  } else if ((rc = phase_exists(p)) != 0 || (rc = phase_classify(p)) < 0) {
    return rc < 0 ? rc : 0;
  }
  if (p->ec->single_flight && (rc = encache__plan_lease(p)) < 0)
    return rc;
  phase_chunk(p);
  return encache__plan_read(p);
}

/* --------------------------------------------------------------- finish */

static void count_outcome(encache *ec, int outcome) {
  switch (outcome) {
  case ENCACHE_MISS: ENCACHE__COUNT(ec, misses, 1); break;
  case ENCACHE_INCOMPATIBLE: ENCACHE__COUNT(ec, incompatible, 1); break;
  case ENCACHE_OVERSIZE: ENCACHE__COUNT(ec, oversize, 1); break;
  case ENCACHE_UNAVAILABLE: ENCACHE__COUNT(ec, unavailable, 1); break;
  case ENCACHE_SKIPPED: ENCACHE__COUNT(ec, skipped, 1); break;
  case ENCACHE_HIT: ENCACHE__COUNT(ec, hits, 1); break;
  case ENCACHE_IN_FLIGHT: ENCACHE__COUNT(ec, in_flight, 1); break;
  default: break;
  }
}

/* Phase finish: each candidate's outcome (duplicates share their item's). */
static void phase_finish(encache__plan *p) {
  for (size_t i = 0; i < p->n; i++) {
    encache_result *r = &p->res[i];
    if (p->unique_of[i] != SIZE_MAX) {
      const encache__item *it = &p->items[p->unique_of[i]];
      if (it->outcome == ENCACHE_INCOMPATIBLE && i != it->first) {
        r->verdict = p->res[it->first].verdict;
        r->found = p->res[it->first].found;
      }
      r->outcome = it->outcome;
      r->why = it->outcome == ENCACHE_HIT ? NULL : it->why;
      if (it->waited && it->outcome == ENCACHE_HIT && i == it->first)
        ENCACHE__COUNT(p->ec, waited_hits, 1);
    }
    count_outcome(p->ec, r->outcome);
  }
}

/* Writes results[i] (strided by results[0].size) from *full. */
static void result_out(encache_result *results, size_t i,
                       const encache_result *full) {
  encache_result *r = ENCACHE__AT(encache_result, results, i);
  r->size = results->size;
  encache__struct_out(r, full, sizeof(*full), ENCACHE__RESULT_MIN);
}

/* The checks of the arguments before the call is counted; quiet: without
 * the handle's message. */
static int first_checks(encache *ec, const encache_candidate *c, size_t n,
                        const encache_result *results, int quiet) {
  if (n > 0 && (c == NULL || results == NULL))
    return quiet ? ENCACHE_EINVAL
                 : encache__fail(ec, ENCACHE_EINVAL, "lookup: %s is NULL",
                                 c == NULL ? "c" : "results");
  if (encache__is_poisoned(ec))
    return ENCACHE_EPOISONED;
  if (n > 0 && !encache__struct_size_ok(results->size, ENCACHE__RESULT_MIN))
    return quiet ? ENCACHE_EINVAL : encache__fail(ec, ENCACHE_EINVAL,
                         "lookup: results[0].size %zu is not a size of "
                         "encache_result (at least %zu, API 1.0's; set it)",
                         results->size, (size_t)ENCACHE__RESULT_MIN);
  return 0;
}

static int lookup(encache_step *step, const encache_candidate *c, size_t n,
                  const encache_allocator *a, encache_result *results,
                  encache__lane *lane, int yield) {
  encache *ec = step->ec;
  int rc = first_checks(ec, c, n, results, 0);
  if (rc < 0)
    return rc;
  ENCACHE__COUNT(ec, lookups, 1);
  ENCACHE__COUNT(ec, candidates, n);
  if (!ec->enabled) {
    static const encache_result skipped = {
        .size = sizeof(encache_result), .outcome = ENCACHE_SKIPPED,
        .why = "cross_encoder_cache is off"};
    for (size_t i = 0; i < n; i++)
      result_out(results, i, &skipped);
    ENCACHE__COUNT(ec, skipped, n);
    return 0;
  }
  rc = encache__reap(ec); /* the publisher's finished jobs */
  if (rc < 0 || n == 0)
    return rc;
  encache__plan p;
  if ((rc = plan_begin(&p, step, c, n, a, lane, yield)) < 0)
    return rc;
  rc = plan_run(&p);
  if (rc == 0) {
    phase_finish(&p);
    rc = p.hits;
  } else {
    if (!encache__is_poisoned(ec))
      encache__plan_release_all(&p);
    const char *why = encache__step_note(step, "the lookup failed",
                                         "the lookup failed (%s): %s",
                                         encache_err_name(rc), ec->errmsg);
    for (size_t i = 0; i < n; i++) { /* nothing was delivered: encode all */
      p.res[i].outcome = ENCACHE_UNAVAILABLE;
      p.res[i].why = why;
    }
  }
  for (size_t i = 0; i < n; i++)
    result_out(results, i, &p.res[i]);
  return rc;
}

int encache__lookup_timed(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          encache_result *results, encache__lane *lane,
                          int yield) {
  encache *ec = step->ec;
  uint64_t t0 = encache__fleet_clock(ec->fleet);
  uint64_t counted = __atomic_load_n(&ec->live->lookups, __ATOMIC_RELAXED);
  int rc = lookup(step, c, n, a, results, lane, yield);
  /* Only the calls `lookups` counts (not those refused at once). */
  if (__atomic_load_n(&ec->live->lookups, __ATOMIC_RELAXED) != counted)
    encache__fleet_observe(ec->fleet, ENCACHE__FLEET_LOOKUP, t0, 0);
  return rc;
}

int encache__lookup_check(encache_step *step, const encache_candidate *c,
                          size_t n, const encache_allocator *a,
                          const encache_result *results, int quiet) {
  encache *ec = step->ec;
  int rc = first_checks(ec, c, n, results, quiet);
  encache_allocator full;
  if (rc == 0 && ec->enabled && n > 0)
    rc = allocator_check(ec, a, &full, quiet);
  return rc;
}

/* Takes the handle's turn (a started lookup may be running on it), once
 * the step's own started lookup is not running. */
int encache_lookup(encache_step *step, const encache_candidate *c, size_t n,
                   const encache_allocator *a, encache_result *results) {
  if (step == NULL)
    return ENCACHE_EINVAL;
  encache__enter_step(step->ec, step);
  int rc = encache__lookup_timed(step, c, n, a, results, NULL, 0);
  encache__leave(step->ec);
  return rc;
}
