/*
 * lookup.c: the read path of one encoder step (spec/behaviour.md, Lookup),
 * as a plan that phases fill in turn, each a function over one `plan`:
 *
 *   dedupe    eligibility (modality, dtype, shape, device); duplicate ids
 *             become one item (read once, copied to each); the eligible
 *             candidates join the step;
 *   exists    one batched existence check;
 *   classify  each existence answer; an object larger than the staging
 *             buffer is OVERSIZE (with a warning naming both sizes);
 *   chunk     walk the present items in order, object size = 24 + payload;
 *             one that does not fit the rest of the current chunk closes
 *             it; slots are packed from offset 0;
 *   read      per chunk, one batched read (into the staging buffer's
 *             slots, or straight into destinations, see read_chunk);
 *   validate  every answer and header of the chunk;
 *   deliver   the chunk's destinations, all before any copy, then the
 *             copies (outputs never alias the staging buffer);
 *   finish    outcomes and counters, copied out to the caller's results.
 *
 * The staging buffer is allocated and registered before the first chunk
 * that needs it (never when nothing hits or all are oversize), kept for
 * every later lookup, and unregistered only at close.
 *
 * Every Store answer is classified by encache_store_classify(): a count
 * equal to the slot is a read, a smaller one or "too large" is an
 * incompatible object, absent is a miss, recoverable is UNAVAILABLE;
 * anything else (a count above the slot, an unknown code, an unconfirmed
 * batch) poisons the handle, and the staging buffer and destinations are
 * then kept forever.
 *
 * Scratch memory: every array of the plan is carved from one buffer of
 * the handle (reused step to step: no allocation per lookup once it has
 * grown).  PLAN_ARRAYS lists them once; the size is computed from that
 * list and the carving walks the same list, with a bounds assertion.
 */
#include "engine.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int (*encache__copy_hook)(void *dst, const void *src, size_t n);

/* Per unique candidate. */
typedef struct item {
  size_t first;    /* index of the candidate it stands for */
  char *key;
  uint64_t nbytes; /* expected payload */
  uint64_t osize;  /* 24 + nbytes: the slot */
  uint64_t off;    /* slot offset in the staging buffer */
  int present;
  int chunk_start; /* the first item of a chunk */
  int outcome;     /* for the unique item; copied to its duplicates */
} item;

typedef unsigned char header_buf[ENCACHE_HEADER_SIZE];

/* The plan's arrays: X(name, element type, element count), the count an
 * expression of n (candidates) and text (bytes of the keys). */
#define PLAN_ARRAYS(X)                                                       \
  X(cand, encache_candidate, n) /* the caller's candidates, copied */      \
  X(res, encache_result, n)     /* results, copied out at the end */       \
  X(unique_of, size_t, n)       /* candidate -> item; SIZE_MAX: skipped */ \
  X(hash, uint64_t, n)          /* of each candidate's id */               \
  X(items, item, n)             /* items[0..nu) */                         \
  X(sorted, item, n)            /* the chunk phase's reordering */         \
  X(newpos, size_t, n)                                                     \
  X(keys, const char *, n)      /* per item: its key */                    \
  X(present, int, n)            /* per item: the existence answer */       \
  X(dest, size_t, n)            /* candidates holding a destination */     \
  X(bufs, void *, n)            /* per item: where its read goes */        \
  X(heads, void *, n)           /* per item: where its header goes */      \
  X(caps, size_t, n)                                                       \
  X(answers, int64_t, n)        /* per item: the read's answer */          \
  X(hdrs, header_buf, n)        /* direct reads: the headers */            \
  X(keytext, char, text)

typedef struct plan {
  encache *ec;
  encache_step *step;
  const encache_candidate *caller_c; /* strided by caller_c->size */
  encache_allocator a;
  size_t n, text;
  size_t nu;    /* unique items */
  size_t np;    /* items[0..np) are present and fit the staging buffer */
  size_t ndest; /* dest[0..ndest) */
  int direct;   /* payloads read straight into destinations */
  int hits;
#define PLAN_FIELD_(name, type, count) type *name;
  PLAN_ARRAYS(PLAN_FIELD_)
#undef PLAN_FIELD_
} plan;

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

static int plan_size(const plan *p, size_t *total) {
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

static void plan_carve(plan *p, unsigned char *base, size_t cap) {
  size_t n = p->n, text = p->text, off = 0;
#define PLAN_CARVE_(name, type, count)                                       \
  p->name = carve(base, cap, &off, (size_t)(count), sizeof(type));
  PLAN_ARRAYS(PLAN_CARVE_)
#undef PLAN_CARVE_
}

void encache__lookup_free(encache *ec) {
  encache__free(ec->scratch);
  ec->scratch = NULL;
  ec->scratch_cap = 0;
}

/* Makes the handle's scratch hold at least need bytes (contents not kept). */
static int reserve(encache *ec, size_t need) {
  if (need <= ec->scratch_cap)
    return 0;
  size_t size = need <= SIZE_MAX / 3 * 2 ? need + need / 2 : need;
  void *q = encache__malloc(size);
  if (q == NULL)
    return ENCACHE_ENOMEM;
  encache__free(ec->scratch);
  ec->scratch = q;
  ec->scratch_cap = size;
  return 0;
}

/* ------------------------------------------------------------ the plan */

static const encache_candidate *caller_cand(const plan *p, size_t i) {
  return ENCACHE__AT(const encache_candidate, p->caller_c, i);
}

/* Checks the caller's structs, sizes and carves the scratch, copies the
 * candidates in. */
static int plan_begin(plan *p, encache_step *step, const encache_candidate *c,
                      size_t n, const encache_allocator *a) {
  encache *ec = step->ec;
  memset(p, 0, sizeof(*p));
  p->ec = ec;
  p->step = step;
  p->caller_c = c;
  p->n = n;
  if (a == NULL || encache__struct_in(&p->a, sizeof(p->a), a,
                                      ENCACHE__ALLOCATOR_MIN) < 0 ||
      p->a.alloc == NULL)
    return encache__fail(ec, ENCACHE_EINVAL,
                         "lookup: an allocator is required (size set to "
                         "sizeof(encache_allocator), alloc set)");
  size_t ns_len = strlen(ec->ns);
  for (size_t i = 0; i < n; i++) {
    const encache_candidate *ci = caller_cand(p, i);
    if (ci->size != c->size ||
        encache__struct_in(&(encache_candidate){0}, sizeof(encache_candidate),
                           ci, ENCACHE__CANDIDATE_MIN) < 0)
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
  if (plan_size(p, &total) < 0 || reserve(ec, total) < 0)
    return encache__fail(ec, ENCACHE_ENOMEM, "lookup: out of memory");
  plan_carve(p, ec->scratch, ec->scratch_cap);
  for (size_t i = 0; i < n; i++) {
    encache__struct_in(&p->cand[i], sizeof(p->cand[i]), caller_cand(p, i),
                       ENCACHE__CANDIDATE_MIN);
    memset(&p->res[i], 0, sizeof(p->res[i]));
    p->res[i].size = sizeof(p->res[i]);
    p->res[i].outcome = ENCACHE_SKIPPED;
    p->unique_of[i] = SIZE_MAX;
  }
  return 0;
}

static int eligible_candidate(const encache_candidate *c) {
  uint64_t nbytes;
  return c->id != NULL && c->id[0] != '\0' &&
         c->modality == ENCACHE_MODALITY_IMAGE &&
         c->device == ENCACHE_DEVICE_HOST && c->rows > 0 && c->cols > 0 &&
         encache_payload_size(c->dtype, c->rows, c->cols, &nbytes) == 0 &&
         nbytes <= SIZE_MAX - ENCACHE_HEADER_SIZE;
}

/* The item candidate i duplicates (same id, same contract), or SIZE_MAX. */
static size_t duplicate_of(const plan *p, size_t i) {
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
static int phase_dedupe(plan *p) {
  size_t ns_len = strlen(p->ec->ns), text = 0;
  char *keytext = p->keytext;
  for (size_t i = 0; i < p->n; i++) {
    const encache_candidate *ci = &p->cand[i];
    if (!eligible_candidate(ci))
      continue;
    p->hash[i] = encache__hash_id(ci->id);
    if ((p->unique_of[i] = duplicate_of(p, i)) != SIZE_MAX)
      continue;
    item *it = &p->items[p->nu];
    memset(it, 0, sizeof(*it));
    it->first = i;
    it->outcome = ENCACHE_MISS;
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
    encache__step_add(p->step, p->cand[p->items[u].first].id,
                      p->hash[p->items[u].first]);
  return 0;
}

/* A whole batch's answer: 0 done, 1 certainly not done (the caller marks
 * its items UNAVAILABLE), or poison. */
static int batch_answer(plan *p, int rc, const char *what) {
  switch (encache_store_classify(rc)) {
  case ENCACHE_ANSWER_OK:
    return 0;
  case ENCACHE_ANSWER_RECOVERABLE:
    return 1;
  default:
    return encache__poison(p->ec, "%s's completion is unconfirmed (%s: %s)",
                           what, encache_err_name(rc),
                           encache_store_errmsg(p->ec->store));
  }
}

static void mark_unavailable(plan *p, size_t from, size_t to) {
  for (size_t u = from; u < to; u++)
    p->items[u].outcome = ENCACHE_UNAVAILABLE;
}

/* Phase exists: one batched existence check.  1: stop (recoverable). */
static int phase_exists(plan *p) {
  encache_store *st = p->ec->store;
  int rc = batch_answer(p, st->ops->exists(st, p->keys, p->nu, p->present),
                        "the existence check");
  if (rc == 1)
    mark_unavailable(p, 0, p->nu);
  return rc;
}

static void warn_oversize(const plan *p, const item *it) {
  encache *ec = p->ec;
  if (ec->log == NULL)
    return;
  char msg[256];
  snprintf(msg, sizeof(msg),
           "encache: object %s is %" PRIu64 " bytes, larger than the "
           "%" PRIu64 "-byte staging buffer (store_read_buffer_bytes): "
           "encoding it instead", p->cand[it->first].id, it->osize,
           ec->read_buf_bytes);
  ec->log(ec->log_ctx, msg);
}

/* Phase classify: each existence answer; oversize objects. */
static int phase_classify(plan *p) {
  for (size_t u = 0; u < p->nu; u++) {
    item *it = &p->items[u];
    int ans = p->present[u];
    int cls = encache_store_classify(ans);
    if (cls == ENCACHE_ANSWER_RECOVERABLE) { /* e.g. a key it refuses */
      it->outcome = ENCACHE_UNAVAILABLE;
      continue;
    }
    if (cls == ENCACHE_ANSWER_ABSENT)
      ans = 0;
    else if (cls != ENCACHE_ANSWER_OK || (ans != 0 && ans != 1))
      return encache__poison(p->ec, "the existence check answered an "
                                    "unknown code %d for %s", ans, it->key);
    it->present = ans == 1;
    if (it->present && it->osize > p->ec->read_buf_bytes) {
      it->outcome = ENCACHE_OVERSIZE;
      warn_oversize(p, it);
    } else if (it->present) {
      p->np++;
    }
  }
  return 0;
}

/* Phase chunk: present, fitting items first (stable; unique_of follows),
 * then their slots and chunk boundaries. */
static void phase_chunk(plan *p) {
  size_t w = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t u = 0; u < p->nu; u++) {
      int fits = p->items[u].present && p->items[u].outcome != ENCACHE_OVERSIZE;
      if (fits == (pass == 0)) {
        p->newpos[u] = w;
        p->sorted[w++] = p->items[u];
      }
    }
  memcpy(p->items, p->sorted, p->nu * sizeof(item));
  for (size_t i = 0; i < p->n; i++)
    if (p->unique_of[i] != SIZE_MAX)
      p->unique_of[i] = p->newpos[p->unique_of[i]];
  uint64_t used = 0;
  for (size_t u = 0; u < p->np; u++) {
    item *it = &p->items[u];
    it->chunk_start = u == 0 || used + it->osize > p->ec->read_buf_bytes;
    if (it->chunk_start)
      used = 0;
    it->off = used;
    used += it->osize;
    p->keys[u] = it->key;
  }
}

/* Allocates (and registers, when the Store needs it) the staging buffer. */
static int staging_ensure(encache *ec) {
  if (ec->staging != NULL)
    return 0;
  size_t size = (size_t)ec->read_buf_bytes;
  void *p = encache__aligned_alloc(4096, size);
  if (p == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM,
                         "cannot allocate the %zu-byte staging buffer", size);
  if (ec->store->ops->register_buffer != NULL) {
    int rc = ec->store->ops->register_buffer(ec->store, p, size);
    if (encache_store_classify(rc) != ENCACHE_ANSWER_OK) {
      /* Nothing is kept: the next step tries again. */
      encache__aligned_free(p);
      return encache__fail(ec, ENCACHE_EUNAVAIL,
                           "registering the staging buffer failed: %s",
                           encache_store_errmsg(ec->store));
    }
    ec->staging_registered = 1;
  }
  ec->staging = p;
  STAT_ADD(ec, staging_allocations, 1);
  __atomic_store_n(&ec->stats.staging_bytes, (uint64_t)size, __ATOMIC_RELAXED);
  return 0;
}

/* ------------------------------------------------------- destinations */

/* Releases every destination handed out (the lookup failed). */
static void release_all(plan *p) {
  for (size_t k = 0; k < p->ndest; k++) {
    encache_result *r = &p->res[p->dest[k]];
    if (p->a.release != NULL)
      p->a.release(p->a.ctx, p->dest[k], r->data, r->handle);
    r->data = r->handle = NULL;
    r->outcome = ENCACHE_UNAVAILABLE;
  }
  p->ndest = 0;
}

/* Hands out the destination of candidate i (logged for release). */
static int give_dest(plan *p, size_t i, uint64_t nbytes) {
  void *data = NULL, *handle = NULL;
  int rc = p->a.alloc(p->a.ctx, i, caller_cand(p, i), nbytes, &data, &handle);
  if (rc < 0 || (data == NULL && nbytes > 0)) {
    if (rc >= 0 && p->a.release != NULL)
      p->a.release(p->a.ctx, i, data, handle);
    rc = rc < 0 ? rc : ENCACHE_ENOMEM;
    release_all(p);
    return encache__fail(p->ec, rc, "the allocator failed for candidate %zu "
                                    "(%s): %s", i, p->cand[i].id,
                         encache_strerror(rc));
  }
  p->res[i].data = data;
  p->res[i].handle = handle;
  p->res[i].nbytes = nbytes;
  p->dest[p->ndest++] = i;
  return 0;
}

/* Gives candidate i's destination back (its object was not a hit). */
static void take_dest(plan *p, size_t i) {
  for (size_t k = 0; k < p->ndest; k++) {
    if (p->dest[k] != i)
      continue;
    if (p->a.release != NULL)
      p->a.release(p->a.ctx, i, p->res[i].data, p->res[i].handle);
    p->res[i].data = p->res[i].handle = NULL;
    p->res[i].nbytes = 0;
    p->dest[k] = p->dest[--p->ndest];
    return;
  }
}

/* ------------------------------------------------------------- a chunk */

/*
 * Phase read: one batched read of items[from..to).
 *
 * Staged (the Store needs registered memory): into the staging slots.
 * Direct (the Store offers split reads and needs no registration): the
 * destinations first, then each header into a small buffer and each
 * payload straight into its destination; a destination whose object is
 * not a hit is given back after validation.  The direct path saves a
 * whole copy of every payload.  Returns 0, 1 when the batch certainly did
 * not happen (its items are UNAVAILABLE), or a negative code.
 */
static int phase_read(plan *p, size_t from, size_t to) {
  encache *ec = p->ec;
  int rc;
  for (size_t u = from; u < to; u++) {
    item *it = &p->items[u];
    if (p->direct) {
      if ((rc = give_dest(p, it->first, it->nbytes)) < 0)
        return rc;
      p->heads[u] = p->hdrs[u];
      p->bufs[u] = p->res[it->first].data;
      p->caps[u] = (size_t)it->nbytes;
    } else {
      p->heads[u] = p->bufs[u] = ec->staging + it->off;
      p->caps[u] = (size_t)it->osize;
    }
  }
  STAT_ADD(ec, batched_reads, 1);
  const encache__store_ops *ops = ec->store->ops;
  const char **keys = p->keys + from;
  int64_t *answers = p->answers + from;
  rc = p->direct ? ops->read_split(ec->store, keys, to - from,
                                   ENCACHE_HEADER_SIZE, p->heads + from,
                                   p->bufs + from, p->caps + from, answers)
                 : ops->read(ec->store, keys, to - from, p->bufs + from,
                             p->caps + from, answers);
  rc = batch_answer(p, rc, "a batched read");
  if (rc == 1) {
    mark_unavailable(p, from, to);
    for (size_t u = from; p->direct && u < to; u++)
      take_dest(p, p->items[u].first);
  }
  return rc;
}

/* Judges item it's answer r, whose header (when r > 0) is at head. */
static int validate_one(plan *p, item *it, int64_t r, const void *head) {
  encache_result *res0 = &p->res[it->first];
  const encache_candidate *c = &p->cand[it->first];
  switch (encache_store_classify(r)) {
  case ENCACHE_ANSWER_OK: {
    if ((uint64_t)r > it->osize)
      return encache__poison(p->ec, "the Store answered %" PRId64 " bytes "
                             "for a %" PRIu64 "-byte slot", r, it->osize);
    encache_contract ct = {c->dtype, c->rows, c->cols};
    /* Only the header is read: the length is judged from r. */
    int v = encache_object_check(head, (size_t)r, &ct, &res0->found);
    res0->verdict = v;
    it->outcome = v == ENCACHE_COMPATIBLE ? ENCACHE_HIT : ENCACHE_INCOMPATIBLE;
    return 0;
  }
  case ENCACHE_ANSWER_TOO_LARGE: /* longer than the contract */
    it->outcome = ENCACHE_INCOMPATIBLE;
    res0->verdict = ENCACHE_BAD_LENGTH;
    return 0;
  case ENCACHE_ANSWER_ABSENT:
    it->outcome = ENCACHE_MISS;
    return 0;
  case ENCACHE_ANSWER_RECOVERABLE:
    it->outcome = ENCACHE_UNAVAILABLE;
    return 0;
  default:
    return encache__poison(p->ec, "the Store answered an unknown code "
                           "%" PRId64 " for %s", r, it->key);
  }
}

/* Phase validate: every answer of the chunk first (if one leaves the
 * batch unconfirmed, no destination of it may be given back), then the
 * direct path's non-hits give their destinations back. */
static int phase_validate(plan *p, size_t from, size_t to) {
  for (size_t u = from; u < to; u++) {
    int rc = validate_one(p, &p->items[u], p->answers[u], p->heads[u]);
    if (rc < 0)
      return rc;
  }
  for (size_t u = from; p->direct && u < to; u++)
    if (p->items[u].outcome != ENCACHE_HIT)
      take_dest(p, p->items[u].first);
  return 0;
}

/* The chunk's hit that candidate i stands for, or NULL. */
static const item *hit_of(const plan *p, size_t i, size_t from, size_t to) {
  size_t u = p->unique_of[i];
  if (u == SIZE_MAX || u < from || u >= to ||
      p->items[u].outcome != ENCACHE_HIT)
    return NULL;
  return &p->items[u];
}

/* Copies a payload to a destination; a failed (device) copy poisons. */
static int copy_out(plan *p, size_t i, const void *src, size_t n) {
  void *dst = p->res[i].data;
  if (encache__copy_hook != NULL ? encache__copy_hook(dst, src, n) != 0
                                 : (memcpy(dst, src, n), 0))
    /* A device copy may still be in flight: keep the staging buffer and
     * every destination. */
    return encache__poison(p->ec, "copying candidate %zu (%s) to its "
                                  "destination failed", i, p->cand[i].id);
  return 0;
}

/* Phase deliver: every destination of the chunk before any copy (the
 * direct path's first occurrences hold theirs, filled by the read), then
 * the copies. */
static int phase_deliver(plan *p, size_t from, size_t to) {
  int rc;
  for (size_t i = 0; i < p->n; i++) {
    const item *it = hit_of(p, i, from, to);
    if (it != NULL && !(p->direct && i == it->first) &&
        (rc = give_dest(p, i, it->nbytes)) < 0)
      return rc;
  }
  for (size_t i = 0; i < p->n; i++) {
    const item *it = hit_of(p, i, from, to);
    if (it == NULL)
      continue;
    if (!(p->direct && i == it->first)) {
      const void *src = p->direct ? p->res[it->first].data
                                  : p->ec->staging + it->off + ENCACHE_HEADER_SIZE;
      if ((rc = copy_out(p, i, src, (size_t)it->nbytes)) < 0)
        return rc;
    }
    STAT_ADD(p->ec, bytes_read, it->nbytes);
    p->hits++;
  }
  return 0;
}

/* Reads, validates and delivers every chunk. */
static int read_chunks(plan *p) {
  /* Payloads go straight to host destinations when the Store can split
   * its reads and needs no registered memory. */
  const encache__store_ops *ops = p->ec->store->ops;
  p->direct = ops->read_split != NULL && ops->register_buffer == NULL;
  if (p->np == 0)
    return 0;
  int rc = p->direct ? 0 : staging_ensure(p->ec);
  if (rc == ENCACHE_EUNAVAIL) { /* registration failed: encode all */
    mark_unavailable(p, 0, p->np);
    return 0;
  }
  for (size_t from = 0, to; rc == 0 && from < p->np; from = to) {
    for (to = from + 1; to < p->np && !p->items[to].chunk_start; to++)
      ;
    rc = phase_read(p, from, to);
    if (rc == 0 && (rc = phase_validate(p, from, to)) == 0)
      rc = phase_deliver(p, from, to);
    if (rc == 1)
      rc = 0;
  }
  return rc;
}

static int plan_run(plan *p) {
  int rc = phase_dedupe(p);
  if (rc < 0 || p->nu == 0)
    return rc;
  if ((rc = phase_exists(p)) != 0 || (rc = phase_classify(p)) < 0)
    return rc < 0 ? rc : 0;
  phase_chunk(p);
  return read_chunks(p);
}

/* --------------------------------------------------------------- finish */

static void count_outcome(encache *ec, int outcome) {
  switch (outcome) {
  case ENCACHE_MISS: STAT_ADD(ec, misses, 1); break;
  case ENCACHE_INCOMPATIBLE: STAT_ADD(ec, incompatible, 1); break;
  case ENCACHE_OVERSIZE: STAT_ADD(ec, oversize, 1); break;
  case ENCACHE_UNAVAILABLE: STAT_ADD(ec, unavailable, 1); break;
  case ENCACHE_SKIPPED: STAT_ADD(ec, skipped, 1); break;
  case ENCACHE_HIT: STAT_ADD(ec, hits, 1); break;
  default: break;
  }
}

/* Phase finish: each candidate's outcome (duplicates share their item's). */
static void phase_finish(plan *p) {
  for (size_t i = 0; i < p->n; i++) {
    encache_result *r = &p->res[i];
    if (p->unique_of[i] != SIZE_MAX) {
      const item *it = &p->items[p->unique_of[i]];
      if (it->outcome == ENCACHE_INCOMPATIBLE && i != it->first) {
        r->verdict = p->res[it->first].verdict;
        r->found = p->res[it->first].found;
      }
      r->outcome = it->outcome;
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

int encache_lookup(encache_step *step, const encache_candidate *c, size_t n,
                   const encache_allocator *a, encache_result *results) {
  if (step == NULL || (n > 0 && (c == NULL || results == NULL)))
    return ENCACHE_EINVAL;
  encache *ec = step->ec;
  if (encache__is_poisoned(ec))
    return ENCACHE_EPOISONED;
  if (n > 0 && results->size < ENCACHE__RESULT_MIN)
    return encache__fail(ec, ENCACHE_EINVAL,
                         "lookup: results[0].size %zu is below "
                         "sizeof(encache_result) %zu", results->size,
                         sizeof(encache_result));
  STAT_ADD(ec, lookups, 1);
  STAT_ADD(ec, candidates, n);
  if (!ec->enabled) {
    static const encache_result skipped = {.size = sizeof(encache_result),
                                           .outcome = ENCACHE_SKIPPED};
    for (size_t i = 0; i < n; i++)
      result_out(results, i, &skipped);
    STAT_ADD(ec, skipped, n);
    return 0;
  }
  int rc = encache__reap(ec);
  if (rc < 0 || n == 0)
    return rc;
  plan p;
  if ((rc = plan_begin(&p, step, c, n, a)) < 0)
    return rc;
  rc = plan_run(&p);
  if (rc == 0) {
    phase_finish(&p);
    rc = p.hits;
  } else if (!encache__is_poisoned(ec)) {
    release_all(&p);
  }
  for (size_t i = 0; i < n; i++)
    result_out(results, i, &p.res[i]);
  return rc;
}
