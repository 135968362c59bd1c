/*
 * lookup.c: the read path of one encoder step (spec/behaviour.md, Lookup).
 *
 *   1. reap finished publications;
 *   2. decide eligibility (modality, dtype, shape, device), drop duplicate
 *      ids (read once, copied to each);
 *   3. one batched existence check;
 *   4. plan chunks: walk the present items in order, object size = 24 +
 *      payload; an object larger than the staging buffer is OVERSIZE; one
 *      that does not fit the rest of the current chunk closes it; slots
 *      are packed from offset 0;
 *   5. allocate and register the staging buffer on the first non-empty
 *      chunk (never when nothing hits or all are oversize), keep it for
 *      every later lookup, unregister it only at close;
 *   6. per chunk: one batched read into the slots, validate every answer
 *      and header, allocate the chunk's destinations, copy each payload to
 *      its own destination (outputs never alias the staging buffer).
 *
 * Every Store answer is classified: a count equal to the slot is a read,
 * a smaller one or "too large" is an incompatible object, not found is a
 * miss, recoverable is UNAVAILABLE; anything else (a count above the slot,
 * an unknown code, an unconfirmed batch) poisons the handle, and the
 * staging buffer is then kept forever.
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
  int outcome;     /* for the unique item; copied to its duplicates */
} item;

void encache__lookup_free(encache *ec) {
  encache__free(ec->cand_ids);
  encache__free(ec->cand_hash);
  encache__free(ec->cand_text);
  encache__free(ec->scratch);
  ec->cand_ids = NULL;
  ec->cand_hash = NULL;
  ec->cand_text = NULL;
  ec->scratch = NULL;
  ec->ncand = ec->cand_ids_cap = ec->cand_hash_cap = ec->cand_text_cap = 0;
  ec->scratch_cap = 0;
}

/* Makes *p hold at least need bytes (contents not kept). */
static int reserve(void **p, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t size = need + need / 2;
  void *q = encache__malloc(size);
  if (q == NULL)
    return ENCACHE_ENOMEM;
  encache__free(*p);
  *p = q;
  *cap = size;
  return 0;
}

/* Remembers the step's eligible candidates: only their outputs may be
 * published.  The buffers are reused from step to step.  On allocation
 * failure the set is left empty (publications are then skipped, which is
 * safe). */
static void remember_candidates(encache *ec, const encache_candidate *c,
                                const int *eligible, size_t n) {
  size_t m = 0, text = 0;
  ec->ncand = 0;
  for (size_t i = 0; i < n; i++)
    if (eligible[i]) {
      m++;
      text += strlen(c[i].id) + 1;
    }
  if (reserve((void **)&ec->cand_ids, &ec->cand_ids_cap, m * sizeof(char *)) < 0 ||
      reserve((void **)&ec->cand_hash, &ec->cand_hash_cap, m * 8) < 0 ||
      reserve((void **)&ec->cand_text, &ec->cand_text_cap, text) < 0)
    return;
  char *w = ec->cand_text;
  for (size_t i = 0; i < n; i++) {
    if (!eligible[i])
      continue;
    size_t len = strlen(c[i].id) + 1;
    memcpy(w, c[i].id, len);
    ec->cand_ids[ec->ncand] = w;
    ec->cand_hash[ec->ncand++] = encache__hash_id(c[i].id);
    w += len;
  }
}

static int eligible_candidate(const encache_candidate *c) {
  uint64_t nbytes;
  return c->id != NULL && c->id[0] != '\0' &&
         c->modality == ENCACHE_MODALITY_IMAGE &&
         c->device == ENCACHE_DEVICE_HOST && c->rows > 0 && c->cols > 0 &&
         encache_payload_size(c->dtype, c->rows, c->cols, &nbytes) == 0 &&
         nbytes <= SIZE_MAX - ENCACHE_HEADER_SIZE;
}

static void set_outcome(encache *ec, encache_result *r, int outcome) {
  r->outcome = outcome;
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
    if (rc < 0) {
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

/* Destinations handed out so far, released if the lookup fails. */
typedef struct dest_log {
  size_t *idx;
  size_t n;
} dest_log;

static void release_all(const encache_allocator *a, dest_log *d,
                        encache_result *results) {
  for (size_t k = 0; k < d->n; k++) {
    encache_result *r = &results[d->idx[k]];
    if (a->release != NULL)
      a->release(a->ctx, d->idx[k], r->data, r->handle);
    r->data = r->handle = NULL;
    r->outcome = ENCACHE_UNAVAILABLE;
  }
  d->n = 0;
}

/* Hands out the destination of candidate i (logged for release). */
static int give_dest(encache *ec, const encache_allocator *a,
                     const encache_candidate *c, size_t i, uint64_t nbytes,
                     encache_result *results, dest_log *dl) {
  void *data = NULL, *handle = NULL;
  int rc = a->alloc(a->ctx, i, &c[i], nbytes, &data, &handle);
  if (rc < 0 || (data == NULL && nbytes > 0)) {
    if (rc >= 0 && a->release != NULL)
      a->release(a->ctx, i, data, handle);
    rc = rc < 0 ? rc : ENCACHE_ENOMEM;
    return encache__fail(ec, rc, "the allocator failed for candidate %zu "
                                 "(%s): %s", i, c[i].id, encache_strerror(rc));
  }
  results[i].data = data;
  results[i].handle = handle;
  results[i].nbytes = nbytes;
  dl->idx[dl->n++] = i;
  return 0;
}

/* Gives candidate i's destination back (its object was not a hit). */
static void take_dest(const encache_allocator *a, size_t i,
                      encache_result *results, dest_log *dl) {
  for (size_t k = 0; k < dl->n; k++) {
    if (dl->idx[k] != i)
      continue;
    if (a->release != NULL)
      a->release(a->ctx, i, results[i].data, results[i].handle);
    results[i].data = results[i].handle = NULL;
    results[i].nbytes = 0;
    dl->idx[k] = dl->idx[--dl->n];
    return;
  }
}

/* Classifies the answer r for item it, whose header (when r > 0) is at
 * head.  Returns 0, or ENCACHE_EPOISONED for an answer that leaves the
 * read unconfirmed. */
static int classify(encache *ec, item *it, int64_t r, const void *head,
                    const encache_candidate *c, encache_result *res0) {
  if (r >= 0 && (uint64_t)r > it->osize)
    return encache__poison(ec, "the Store answered %" PRId64 " bytes for a "
                               "%" PRIu64 "-byte slot", r, it->osize);
  if (r >= 0) {
    encache_contract ct = {c->dtype, c->rows, c->cols};
    /* Only the header is read: the length is judged from r. */
    int v = encache_object_check(head, (size_t)r, &ct, &res0->found);
    res0->verdict = v;
    it->outcome = v == ENCACHE_COMPATIBLE ? ENCACHE_HIT : ENCACHE_INCOMPATIBLE;
  } else if (r == ENCACHE_ETOOLARGE) {
    it->outcome = ENCACHE_INCOMPATIBLE; /* longer than the contract */
    res0->verdict = ENCACHE_BAD_LENGTH;
  } else if (r == ENCACHE_ENOENT) {
    it->outcome = ENCACHE_MISS;
  } else if (r == ENCACHE_EUNAVAIL || r == ENCACHE_EINVAL) {
    it->outcome = ENCACHE_UNAVAILABLE;
  } else {
    return encache__poison(ec, "the Store answered an unknown code %" PRId64
                               " for %s", r, it->key);
  }
  return 0;
}

/* Copies a payload to a destination; a failed (device) copy poisons. */
static int deliver_copy(encache *ec, void *dst, const void *src, size_t n,
                        size_t i, const char *id) {
  if (encache__copy_hook != NULL ? encache__copy_hook(dst, src, n) != 0
                                 : (memcpy(dst, src, n), 0))
    /* A device copy may still be in flight: keep the staging buffer and
     * every destination. */
    return encache__poison(ec, "copying candidate %zu (%s) to its "
                               "destination failed", i, id);
  return 0;
}

/*
 * Reads one chunk items[from..to) and delivers its hits.
 *
 * Staged (the Store needs registered memory): one batched read into the
 * staging slots, validation, the chunk's destinations, then the copies.
 * Direct (the Store offers split reads and needs no registration): the
 * destinations first, one batched read of each header into a small buffer
 * and each payload straight into its destination, then validation; a
 * destination whose object is not a hit is given back.  The direct path
 * saves a whole copy of every payload.
 */
/* The arrays of one batched read, sized for the largest chunk. */
typedef struct chunk_bufs {
  const char **keys;
  void **bufs, **heads;
  unsigned char *hdrs;
  size_t *caps;
  int64_t *res;
} chunk_bufs;

static int read_chunk(encache *ec, const encache_candidate *c, size_t n,
                      item *items, size_t from, size_t to,
                      const size_t *unique_of, const encache_allocator *a,
                      encache_result *results, dest_log *dl, int *hits,
                      int direct, const chunk_bufs *cb) {
  size_t m = to - from;
  const char **keys = cb->keys;
  void **bufs = cb->bufs, **heads = cb->heads;
  unsigned char *hdrs = cb->hdrs;
  size_t *caps = cb->caps;
  int64_t *res = cb->res;
  int rc = 0;
  for (size_t k = 0; k < m; k++) {
    item *it = &items[from + k];
    keys[k] = it->key;
    if (direct) {
      if ((rc = give_dest(ec, a, c, it->first, it->nbytes, results, dl)) < 0) {
        release_all(a, dl, results);
        goto out;
      }
      heads[k] = hdrs + k * ENCACHE_HEADER_SIZE;
      bufs[k] = results[it->first].data;
      caps[k] = (size_t)it->nbytes;
    } else {
      heads[k] = ec->staging + it->off;
      bufs[k] = heads[k];
      caps[k] = (size_t)it->osize;
    }
  }
  STAT_ADD(ec, batched_reads, 1);
  rc = direct ? ec->store->ops->read_split(ec->store, keys, m,
                                           ENCACHE_HEADER_SIZE, heads, bufs,
                                           caps, res)
              : ec->store->ops->read(ec->store, keys, m, bufs, caps, res);
  if (rc == ENCACHE_EUNAVAIL || rc == ENCACHE_ENOMEM) {
    for (size_t k = 0; k < m; k++) {
      items[from + k].outcome = ENCACHE_UNAVAILABLE;
      if (direct)
        take_dest(a, items[from + k].first, results, dl);
    }
    rc = 0;
    goto out;
  }
  if (rc < 0) {
    rc = encache__poison(ec, "a batched read's completion is unconfirmed "
                             "(%s: %s)", encache_err_name(rc),
                         encache_store_errmsg(ec->store));
    goto out;
  }
  /* Every answer first: if one leaves the batch unconfirmed, no
   * destination of it may be given back. */
  for (size_t k = 0; k < m; k++) {
    item *it = &items[from + k];
    if ((rc = classify(ec, it, res[k], heads[k], &c[it->first],
                       &results[it->first])) < 0)
      goto out;
  }
  for (size_t k = 0; direct && k < m; k++)
    if (items[from + k].outcome != ENCACHE_HIT)
      take_dest(a, items[from + k].first, results, dl);
  /* Every destination of the chunk before any copy (the direct path's
   * first occurrences already hold theirs, filled by the read). */
  for (size_t i = 0; i < n; i++) {
    size_t u = unique_of[i];
    if (u == SIZE_MAX || u < from || u >= to || items[u].outcome != ENCACHE_HIT ||
        (direct && i == items[u].first))
      continue;
    if ((rc = give_dest(ec, a, c, i, items[u].nbytes, results, dl)) < 0) {
      release_all(a, dl, results);
      goto out;
    }
  }
  for (size_t i = 0; i < n; i++) {
    size_t u = unique_of[i];
    if (u == SIZE_MAX || u < from || u >= to || items[u].outcome != ENCACHE_HIT)
      continue;
    if (!(direct && i == items[u].first)) {
      const void *src = direct ? results[items[u].first].data
                               : ec->staging + items[u].off + ENCACHE_HEADER_SIZE;
      if ((rc = deliver_copy(ec, results[i].data, src, (size_t)items[u].nbytes,
                             i, c[i].id)) < 0)
        goto out;
    }
    STAT_ADD(ec, bytes_read, items[u].nbytes);
    (*hits)++;
  }
out:
  return rc;
}

/* A bump allocator over the handle's scratch buffer. */
typedef struct bump {
  unsigned char *p;
  size_t off;
} bump;

static void *take(bump *b, size_t size) {
  void *r = b->p + b->off;
  b->off += (size + 15) & ~(size_t)15;
  return r;
}

int encache_lookup(encache *ec, const encache_candidate *c, size_t n,
                   const encache_allocator *a, encache_result *results) {
  if (ec == NULL || (n > 0 && (c == NULL || results == NULL)))
    return ENCACHE_EINVAL;
  if (encache__is_poisoned(ec))
    return ENCACHE_EPOISONED;
  for (size_t i = 0; i < n; i++) {
    memset(&results[i], 0, sizeof(results[i]));
    results[i].outcome = ENCACHE_SKIPPED;
  }
  STAT_ADD(ec, lookups, 1);
  STAT_ADD(ec, candidates, n);
  if (!ec->enabled) {
    STAT_ADD(ec, skipped, n);
    return 0;
  }
  if (a == NULL || a->alloc == NULL)
    return encache__fail(ec, ENCACHE_EINVAL, "lookup: an allocator is required");
  int rc = encache__reap(ec);
  if (rc < 0)
    return rc;
  if (n == 0) {
    encache__lookup_free(ec);
    return 0;
  }

  /* Every array of this lookup comes from one scratch buffer, reused from
   * step to step: no allocation per lookup once it has grown. */
  size_t ns_len = strlen(ec->ns), text = 0;
  for (size_t i = 0; i < n; i++)
    text += c[i].id != NULL ? ns_len + 5 + strlen(c[i].id) : 0;
  size_t per = 2 * sizeof(int) + 3 * sizeof(size_t) + sizeof(uint64_t) +
               2 * sizeof(item) + 3 * sizeof(void *) + sizeof(char *) +
               ENCACHE_HEADER_SIZE + sizeof(size_t) + sizeof(int64_t);
  if (n > (SIZE_MAX - text) / per / 2 ||
      reserve((void **)&ec->scratch, &ec->scratch_cap,
              n * per + text + 16 * 16 + n * 16 * 2) < 0)
    return encache__fail(ec, ENCACHE_ENOMEM, "out of memory");
  bump b = {ec->scratch, 0};
  int *eligible = take(&b, n * sizeof(int));
  size_t *unique_of = take(&b, n * sizeof(size_t));
  uint64_t *hash = take(&b, n * sizeof(uint64_t));
  item *items = take(&b, n * sizeof(item));
  item *sorted = take(&b, n * sizeof(item));
  size_t *newpos = take(&b, n * sizeof(size_t));
  const char **keys = take(&b, n * sizeof(char *));
  int *present = take(&b, n * sizeof(int));
  dest_log dl = {take(&b, n * sizeof(size_t)), 0};
  chunk_bufs cb = {take(&b, n * sizeof(char *)), take(&b, n * sizeof(void *)),
                   take(&b, n * sizeof(void *)),
                   take(&b, n * ENCACHE_HEADER_SIZE),
                   take(&b, n * sizeof(size_t)), take(&b, n * sizeof(int64_t))};
  char *keytext = (char *)ec->scratch + b.off;
  size_t nu = 0;
  int hits = 0;
  rc = 0;

  /* Eligibility and duplicates: the same id with the same contract is
   * read once. */
  for (size_t i = 0; i < n; i++) {
    unique_of[i] = SIZE_MAX;
    eligible[i] = eligible_candidate(&c[i]);
    if (!eligible[i])
      continue;
    hash[i] = encache__hash_id(c[i].id);
    for (size_t u = 0; u < nu && unique_of[i] == SIZE_MAX; u++) {
      const encache_candidate *f = &c[items[u].first];
      if (hash[items[u].first] == hash[i] && strcmp(f->id, c[i].id) == 0 &&
          f->dtype == c[i].dtype && f->rows == c[i].rows && f->cols == c[i].cols)
        unique_of[i] = u;
    }
    if (unique_of[i] != SIZE_MAX)
      continue;
    item *it = &items[nu];
    memset(it, 0, sizeof(*it));
    it->first = i;
    it->outcome = ENCACHE_MISS;
    encache_payload_size(c[i].dtype, c[i].rows, c[i].cols, &it->nbytes);
    it->osize = ENCACHE_HEADER_SIZE + it->nbytes;
    size_t idlen = strlen(c[i].id);
    it->key = keytext;
    encache_key(ec->ns, c[i].id, keytext, ns_len + 5 + idlen);
    keytext += ns_len + 5 + idlen;
    keys[nu] = it->key;
    unique_of[i] = nu++;
  }
  remember_candidates(ec, c, eligible, n);
  if (nu == 0)
    goto deliver;

  /* One batched existence check. */
  rc = ec->store->ops->exists(ec->store, keys, nu, present);
  if (rc == ENCACHE_EUNAVAIL || rc == ENCACHE_ENOMEM) {
    for (size_t u = 0; u < nu; u++)
      items[u].outcome = ENCACHE_UNAVAILABLE;
    rc = 0;
    goto deliver;
  }
  if (rc < 0) {
    rc = encache__poison(ec, "the existence check's completion is "
                             "unconfirmed (%s)", encache_err_name(rc));
    goto out;
  }
  for (size_t u = 0; u < nu; u++) {
    int p = present[u];
    items[u].present = p == 1;
    if (p == 1)
      continue;
    if (p == 0 || p == ENCACHE_ENOENT)
      items[u].outcome = ENCACHE_MISS;
    else if (p == ENCACHE_EUNAVAIL || p == ENCACHE_EINVAL)
      /* EINVAL: the Store refused the key (too long...): certainly not
       * done, so recoverable. */
      items[u].outcome = ENCACHE_UNAVAILABLE;
    else {
      rc = encache__poison(ec, "the existence check answered an unknown "
                               "code %d for %s", p, items[u].key);
      goto out;
    }
  }

  /* Payloads go straight to host destinations when the Store can split
   * its reads and needs no registered memory. */
  int direct = ec->store->ops->read_split != NULL &&
               ec->store->ops->register_buffer == NULL;

  /* Plan chunks over the present items, in order; read each. */
  size_t first = SIZE_MAX; /* first item of the open chunk */
  uint64_t used = 0;
  /* Present items are compacted to the front so that a chunk is a range. */
  size_t np = 0;
  for (size_t u = 0; u < nu; u++) {
    if (!items[u].present)
      continue;
    if (items[u].osize > ec->read_buf_bytes) {
      items[u].outcome = ENCACHE_OVERSIZE;
      if (ec->log != NULL) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "encache: object %s is %" PRIu64 " bytes, larger than the "
                 "%" PRIu64 "-byte staging buffer (store_read_buffer_bytes): "
                 "encoding it instead", c[items[u].first].id, items[u].osize,
                 ec->read_buf_bytes);
        ec->log(ec->log_ctx, msg);
      }
      continue;
    }
    np++;
  }
  /* Reorder: present, fitting items first (stable), keeping unique_of
   * consistent. */
  if (np > 0) {
    size_t w = 0;
    for (int pass = 0; pass < 2; pass++)
      for (size_t u = 0; u < nu; u++) {
        int fits = items[u].present && items[u].outcome != ENCACHE_OVERSIZE;
        if (fits == (pass == 0)) {
          newpos[u] = w;
          sorted[w++] = items[u];
        }
      }
    memcpy(items, sorted, nu * sizeof(item));
    for (size_t i = 0; i < n; i++)
      if (unique_of[i] != SIZE_MAX)
        unique_of[i] = newpos[unique_of[i]];
  }
  for (size_t u = 0; u <= np; u++) {
    int close_chunk = u == np ||
                      (first != SIZE_MAX && used + items[u].osize > ec->read_buf_bytes);
    if (close_chunk && first != SIZE_MAX) {
      rc = direct ? 0 : staging_ensure(ec);
      if (rc == ENCACHE_EUNAVAIL) { /* registration failed: encode all */
        for (size_t k = 0; k < np; k++)
          items[k].outcome = ENCACHE_UNAVAILABLE;
        rc = 0;
        break;
      }
      if (rc < 0)
        goto out;
      rc = read_chunk(ec, c, n, items, first, u, unique_of, a, results, &dl,
                      &hits, direct, &cb);
      if (rc < 0)
        goto out;
      first = SIZE_MAX;
      used = 0;
    }
    if (u == np)
      break;
    if (first == SIZE_MAX)
      first = u;
    items[u].off = used;
    used += items[u].osize;
  }

deliver:
  for (size_t i = 0; i < n; i++) {
    if (unique_of[i] == SIZE_MAX) {
      set_outcome(ec, &results[i], ENCACHE_SKIPPED);
      continue;
    }
    item *it = &items[unique_of[i]];
    if (it->outcome == ENCACHE_INCOMPATIBLE && i != it->first) {
      results[i].verdict = results[it->first].verdict;
      results[i].found = results[it->first].found;
    }
    set_outcome(ec, &results[i], it->outcome);
  }
  rc = hits;
out:
  if (rc < 0 && !encache__is_poisoned(ec))
    release_all(a, &dl, results);
  return rc;
}
