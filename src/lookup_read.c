/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_read.c: the chunks of a lookup plan (lookup.h): the staging
 * buffer, the caller's destinations, and per chunk the read, validate and
 * deliver phases.  Every Store answer goes through
 * encache_store_classify().
 */
#include "lookup_read.h"
#include "device.h"

#include <inttypes.h>
#include <string.h>

int (*encache__copy_hook)(void *dst, const void *src, size_t n);

/* The lane whose staging buffer p reads into: its own, but the handle's
 * for CUDA destinations (the device state pins that one; such a plan
 * keeps the turn: choose_path()). */
static encache__lane *stage_of(const encache__plan *p) {
  return p->device ? &p->ec->lane : p->lane;
}

/* Allocates (and registers, when the Store needs it) p's staging buffer. */
static int staging_ensure(encache__plan *p) {
  encache *ec = p->ec;
  encache__lane *lane = stage_of(p);
  if (lane->staging != NULL)
    return 0;
  size_t size = (size_t)ec->read_buf_bytes;
  void *b = encache__aligned_alloc(4096, size);
  if (b == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM,
                         "out of memory: cannot allocate the %zu-byte "
                         "staging buffer", size);
  if (encache__store_profile_of(ec->store)->registered) {
    int rc = ec->store->ops->register_buffer(ec->store, b, size);
    if (encache_store_classify(rc) != ENCACHE_ANSWER_OK) {
      /* Nothing is kept: the next step tries again. */
      encache__aligned_free(b);
      return encache__fail(ec, ENCACHE_EUNAVAIL,
                           "registering the staging buffer failed: %s",
                           encache_store_errmsg(ec->store));
    }
    lane->staging_registered = 1;
  }
  lane->staging = b;
  ENCACHE__COUNT(ec, staging_allocations, 1);
  ENCACHE__COUNT(ec, staging_bytes, (uint64_t)size);
  return 0;
}

/* ------------------------------------------------------- destinations */

void encache__plan_release_all(encache__plan *p) {
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
static int give_dest(encache__plan *p, size_t i, uint64_t nbytes) {
  void *data = NULL, *handle = NULL;
  int rc = p->a.alloc(p->a.ctx, i, encache__plan_cand(p, i), nbytes, &data, &handle);
  if (rc < 0 || (data == NULL && nbytes > 0)) {
    if (rc >= 0 && p->a.release != NULL)
      p->a.release(p->a.ctx, i, data, handle);
    rc = rc < 0 ? rc : ENCACHE_ENOMEM;
    encache__plan_release_all(p);
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
static void take_dest(encache__plan *p, size_t i) {
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
 * Direct (the Store needs no registration): the destinations first, then
 * either each header into a small buffer and each payload straight into
 * its destination (the Store offers split reads), or each whole object
 * into its destination's headroom and the destination (whole: the
 * allocator has room for the header in front); a destination whose
 * object is not a hit is given back after validation.  The direct paths
 * save a whole copy of every payload.  Returns 0, 1 when the batch
 * certainly did not happen (its items are UNAVAILABLE), or a negative
 * code.
 */
static int phase_read(encache__plan *p, size_t from, size_t to) {
  encache *ec = p->ec;
  int rc;
  for (size_t u = from; u < to; u++) {
    encache__item *it = &p->items[u];
    if (p->direct) {
      if ((rc = give_dest(p, it->first, it->nbytes)) < 0)
        return rc;
      unsigned char *data = p->res[it->first].data;
      p->heads[u] = p->whole ? data - ENCACHE_HEADER_SIZE : p->hdrs[u];
      p->bufs[u] = p->whole ? p->heads[u] : data;
      p->caps[u] = (size_t)(p->whole ? it->osize : it->nbytes);
    } else {
      p->heads[u] = p->bufs[u] = stage_of(p)->staging + it->off;
      p->caps[u] = (size_t)it->osize;
    }
  }
  ENCACHE__COUNT(ec, batched_reads, 1);
  const encache__store_ops *ops = ec->store->ops;
  const char **keys = p->keys + from;
  int64_t *answers = p->answers + from;
  encache__plan_store_begin(p);
  rc = p->direct && !p->whole
                 ? ops->read_split(ec->store, keys, to - from,
                                   ENCACHE_HEADER_SIZE, p->heads + from,
                                   p->bufs + from, p->caps + from, answers)
                 : ops->read(ec->store, keys, to - from, p->bufs + from,
                             p->caps + from, answers);
  encache__plan_store_end(p);
  encache__count_unchecked(ec);
  int answer = rc;
  rc = encache__plan_batch(p, rc, "a batched read");
  if (rc == 1) {
    encache__plan_unavailable(p, from, to,
                              encache__plan_store_why(p, "the read", answer, 0));
    for (size_t u = from; p->direct && u < to; u++)
      take_dest(p, p->items[u].first);
  }
  return rc;
}

/* What differed between the object found (r bytes, header found) and
 * item it's contract, kept by the step. */
static const char *incompatible_why(encache__plan *p, const encache__item *it,
                                    int verdict, const encache_header *found,
                                    uint64_t r) {
  const encache_candidate *c = &p->cand[it->first];
  const char *fallback = encache_verdict_name(verdict);
  switch (verdict) {
  case ENCACHE_BAD_SHAPE:
    return encache__step_note(p->step, fallback, "shape %" PRIu64 "x%" PRIu64
                              " (expected %" PRIu64 "x%" PRIu64 ")",
                              found->rows, found->cols, c->rows, c->cols);
  case ENCACHE_BAD_DTYPE: {
    const char *n = encache_dtype_name((int)found->dtype);
    return encache__step_note(p->step, fallback, "dtype %s (expected %s)",
                              n ? n : "unknown", encache_dtype_name(c->dtype));
  }
  case ENCACHE_BAD_MAGIC:
    return encache__step_note(p->step, fallback, "magic 0x%08" PRIx32
                              " (expected 0x%08x)", found->magic,
                              ENCACHE_MAGIC);
  default:
    return encache__step_note(p->step, fallback, "length %" PRIu64 " bytes "
                              "(expected 24 + %" PRIu64 ")", r,
                              it->nbytes);
  }
}

/* Judges item it's answer r, whose header (when r > 0) is at head. */
static int validate_one(encache__plan *p, encache__item *it, int64_t r,
                        const void *head) {
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
    if (v != ENCACHE_COMPATIBLE)
      it->why = incompatible_why(p, it, v, &res0->found, (uint64_t)r);
    return 0;
  }
  case ENCACHE_ANSWER_TOO_LARGE: /* longer than the contract */
    it->outcome = ENCACHE_INCOMPATIBLE;
    res0->verdict = ENCACHE_BAD_LENGTH;
    it->why = encache__step_note(p->step, "length", "length (more than "
                                 "24 + %" PRIu64 " bytes)", it->nbytes);
    return 0;
  case ENCACHE_ANSWER_ABSENT:
    it->outcome = ENCACHE_MISS;
    it->why = it->unchecked ? "not in the Store"
                            : "not in the Store (gone before the read)";
    return 0;
  case ENCACHE_ANSWER_RECOVERABLE:
    it->outcome = ENCACHE_UNAVAILABLE;
    it->why = encache__plan_store_why(p, "the read of this key", r, 1);
    return 0;
  default:
    return encache__poison(p->ec, "the Store answered an unknown code "
                           "%" PRId64 " for %s", r, it->key);
  }
}

/* Phase validate: every answer of the chunk first (if one leaves the
 * batch unconfirmed, no destination of it may be given back), then the
 * direct path's non-hits give their destinations back. */
static int phase_validate(encache__plan *p, size_t from, size_t to) {
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
static const encache__item *hit_of(const encache__plan *p, size_t i,
                                   size_t from, size_t to) {
  size_t u = p->unique_of[i];
  if (u == SIZE_MAX || u < from || u >= to ||
      p->items[u].outcome != ENCACHE_HIT)
    return NULL;
  return &p->items[u];
}

/* Copies a payload to a destination; a failed (device) copy poisons. */
static int copy_out(encache__plan *p, size_t i, const void *src, size_t n) {
  void *dst = p->res[i].data;
  if (p->cand[i].device == ENCACHE_DEVICE_CUDA) /* poisons on failure */
    return encache__device_copy_in(p->ec, p->step->stream,
                                   p->cand[i].device_index, dst, src, n);
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
static int phase_deliver(encache__plan *p, size_t from, size_t to) {
  int rc;
  for (size_t i = 0; i < p->n; i++) {
    const encache__item *it = hit_of(p, i, from, to);
    if (it != NULL && !(p->direct && i == it->first) &&
        (rc = give_dest(p, i, it->nbytes)) < 0)
      return rc;
  }
  for (size_t i = 0; i < p->n; i++) {
    const encache__item *it = hit_of(p, i, from, to);
    if (it == NULL)
      continue;
    if (!(p->direct && i == it->first)) {
      const void *src = p->direct ? p->res[it->first].data
                                  : stage_of(p)->staging + it->off +
                                        ENCACHE_HEADER_SIZE;
      if ((rc = copy_out(p, i, src, (size_t)it->nbytes)) < 0)
        return rc;
    }
    ENCACHE__COUNT(p->ec, bytes_read, it->nbytes);
    p->hits++;
  }
  return 0;
}

void encache__plan_whole(encache__plan *p) {
  uint64_t bytes = 0;
  p->whole = encache__store_profile_of(p->ec->store)->read_whole &&
             p->a.headroom >= ENCACHE_HEADER_SIZE;
  for (size_t i = 0; p->whole && i < p->n; i++)
    if (p->unique_of[i] != SIZE_MAX)
      p->whole = p->cand[i].device != ENCACHE_DEVICE_CUDA;
  for (size_t u = 0; p->whole && u < p->nu; u++) {
    p->whole = p->items[u].nbytes > 0; /* data is never NULL then */
    bytes += p->items[u].osize;
  }
  p->whole = p->whole && bytes >= ENCACHE__WHOLE_MIN_BYTES;
}

/* Payloads go straight to host destinations when the Store needs no
 * registered memory and splits its reads, or when whole objects may go
 * into the destinations' headroom (encache__plan_whole()). */
static void choose_path(encache__plan *p) {
  for (size_t i = 0; i < p->n; i++) /* CUDA hits go through the staging */
    if (p->unique_of[i] < p->np && p->cand[i].device == ENCACHE_DEVICE_CUDA)
      p->device = 1;
  if (p->device) /* the handle's staging buffer and device state */
    p->yield = 0;
  p->direct =
      (encache__store_profile_of(p->ec->store)->read_direct && !p->device) ||
      p->whole;
}

int encache__plan_read(encache__plan *p) {
  choose_path(p);
  if (p->np == 0)
    return 0;
  int rc = p->direct ? 0 : staging_ensure(p);
  if (rc == 0 && p->device)
    rc = encache__device_pin_staging(p->ec);
  if (rc == ENCACHE_EUNAVAIL) { /* registration failed: encode all */
    encache__plan_unavailable(p, 0, p->np,
                              encache__step_note(p->step, "registering the "
                                                 "staging buffer failed",
                                                 "%s", p->ec->errmsg));
    return 0;
  }
  for (size_t from = 0, to; rc == 0 && from < p->np; from = to) {
    for (to = from + 1; to < p->np && !p->items[to].chunk_start; to++)
      ;
    rc = phase_read(p, from, to);
    if (rc == 0 && (rc = phase_validate(p, from, to)) == 0 &&
        (rc = phase_deliver(p, from, to)) == 0 && p->device)
      rc = encache__device_sync(p->ec); /* before the next chunk's read */
    if (rc == 1)
      rc = 0;
  }
  return rc;
}

int encache__staging_unregister(encache *ec, encache__lane *lane) {
  if (!lane->staging_registered || encache__is_poisoned(ec))
    return encache__is_poisoned(ec) ? ENCACHE_EPOISONED : 0;
  int u = ec->store->ops->unregister_buffer(ec->store, lane->staging);
  if (encache_store_classify(u) != ENCACHE_ANSWER_OK)
    return encache__poison(ec, "unregistering the staging buffer failed: %s",
                           encache_strerror(u));
  lane->staging_registered = 0;
  return 0;
}
