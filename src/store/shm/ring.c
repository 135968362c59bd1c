/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring.c: the shm Store's data ring: allocating a record at its head and
 * making room by eviction or a second chance at its tail.
 *
 * Allocation and eviction.  Records are allocated at the head of the
 * ring, at monotonically increasing 64-bit positions (position % data_size
 * is the offset); a record never wraps, the end of the ring is skipped
 * instead.  When a new record does not fit, the oldest record (the tail)
 * goes: evicted, or, if it was read since it was written and is small
 * (<= 1/16 of the ring), moved to the head instead: a second chance.  This
 * is FIFO with reinsertion, an approximation of LRU (CLOCK on a ring).
 * Its cost: a put may copy, under the lock, up to twice its own size plus
 * 64 KiB of reinserted records; a removed object's space is reused only
 * when the tail passes it.  Entries are evicted the same way when the
 * entry table is full.
 *
 * A live writer's record at the tail is not evicted: it is relabelled one
 * lap on, in place, so a stalled writer holds its own space, never the
 * whole ring.  Everything here runs under the segment lock.
 */
#include "shm.h"

#include <string.h>

/* The position where a record of rec bytes would start at the head: the
 * head itself, or the start of the ring when the record would wrap. */
static uint64_t head_start(shm_store *s, uint64_t head, uint64_t rec) {
  uint64_t off = head % s->data_size;
  return off + rec <= s->data_size ? head : head + (s->data_size - off);
}

/* Moves the oldest record e (checked copy c) to the head if it fits there
 * once it is gone from the tail.  Returns 1 when moved, 0 when the caller
 * should evict. */
static int reinsert_oldest(shm_store *s, shm_entry *e, const shm_entry *c,
                           const shm_entry *second) {
  uint64_t rec = rec_size(c->key_len, c->obj_len);
  uint64_t dst = head_start(s, s->h->head, rec);
  if (second != NULL && dst + rec > second->pos + s->data_size)
    return 0;
  /* MOVING first: if we die mid-copy, repair drops the entry rather than
   * trusting a half-moved record. */
  shm_entry n = *c;
  n.state = E_MOVING;
  encache__shm_store_entry(s, e, &n);
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  RELEASE_FENCE(); /* the new generation before any byte moves */
  memmove(rec_at(s, dst), rec_at(s, c->pos), rec);
  encache__shm_fifo_unlink(s, e);
  n.pos = dst;
  n.state = E_READY;
  s->h->head = dst + rec;
  encache__shm_fifo_append(s, e);
  encache__shm_store_entry(s, e, &n);
  s->h->reinsertions++;
  return 1;
}

/* A live writer's record at the tail (checked copy c) goes one lap on, in
 * place: its bytes stay where its writer is copying them, its position is
 * relabelled by one ring length, and the head skips past it.  So a stalled
 * writer holds its own space, never the whole ring. */
static void relabel_writing(shm_store *s, shm_entry *e, const shm_entry *c) {
  shm_entry n = *c;
  n.pos = c->pos + s->data_size;
  encache__shm_fifo_unlink(s, e);
  s->h->head = n.pos + rec_size(c->key_len, c->obj_len);
  encache__shm_fifo_append(s, e);
  encache__shm_store_entry(s, e, &n);
}

/* Frees the oldest record (e, checked copy c), gives it a second chance,
 * or, if it is being written, moves it a lap on (then returns 1). */
static int drop_oldest(shm_store *s, shm_entry *e, const shm_entry *c,
                       uint64_t *budget) {
  if (c->state == E_WRITING && encache__shm_owner_alive(s, c)) {
    relabel_writing(s, e, c);
    return 1;
  }
  uint64_t rec = rec_size(c->key_len, c->obj_len);
  shm_entry second;
  /* A next record that does not validate: no move (it could overlap it). */
  int has_second =
      c->fnext != 0 && encache__shm_load_entry(s, c->fnext, &second, 1);
  if (c->state == E_READY &&
      __atomic_load_n(&e->referenced, __ATOMIC_RELAXED) &&
      rec <= s->data_size / 16 && rec <= *budget &&
      (c->fnext == 0 || has_second) &&
      reinsert_oldest(s, e, c, has_second ? &second : NULL)) {
    *budget -= rec;
    return 0;
  }
  if (c->state == E_READY)
    s->h->evictions++;
  encache__shm_entry_free(s, e);
  return 0;
}

/* Whether the ends of the FIFO list (first, last: checked copies in *oc,
 * *nc) and of the free list (fr: in *fc) validate, and the head with them
 * (in_window: the newest record ends at or before it, the oldest starts
 * at most a ring length before it): a head moved back would put the
 * record over live ones. */
static int ends_ok(shm_store *s, uint32_t first, uint32_t last, uint32_t fr,
                   uint64_t head, shm_entry *oc, shm_entry *nc,
                   shm_entry *fc) {
  return (first == 0) == (last == 0) &&
         (first == 0 || (encache__shm_load_entry(s, first, oc, 0) &&
                         encache__shm_in_window(s, oc, head) &&
                         oc->state != E_FREE && oc->fprev == 0)) &&
         (last == 0 || (encache__shm_load_entry(s, last, nc, 0) &&
                        encache__shm_in_window(s, nc, head) &&
                        nc->state != E_FREE && nc->fnext == 0)) &&
         (fr == 0 ||
          (encache__shm_load_entry(s, fr, fc, 1) && fc->state == E_FREE));
}

/* Makes room for a record of rec bytes and a free entry; returns the
 * record's position in *pos and the checked free entry in *fe (its id)
 * and *fnext (the free list after it), so that the caller uses what was
 * checked, not what the shared list holds by then. */
static int make_room(shm_store *s, uint64_t rec, uint64_t *pos, uint32_t *fe,
                     uint32_t *fnext) {
  uint64_t budget = 2 * rec + 65536;
  unsigned relabelled = 0; /* in a row: more than writers can hold = full */
  for (uint64_t steps = 0;; steps++) {
    if (steps > 4 * (uint64_t)s->nentries + 16)
      return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                                "%s: could not make room", s->base.url);
    shm_header *h = s->h;
    uint32_t first = h->fifo_first, last = h->fifo_last, fr = h->free_first;
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    shm_entry oc, nc, fc;
    if (!ends_ok(s, first, last, fr, head, &oc, &nc, &fc)) {
      int rc = encache__shm_repair(s); /* the lists or the head */
      if (rc < 0)
        return rc;
      continue;
    }
    uint64_t start = head_start(s, head, rec);
    if (first == 0 && fr == 0)
      return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                                "%s: no free entry", s->base.url);
    if (fr != 0 && (first == 0 || start + rec <= oc.pos + s->data_size)) {
      *pos = start;
      *fe = fr;
      *fnext = fc.hnext;
      return 0;
    }
    if (relabelled > s->nslots ||
        (first == last && oc.state == E_WRITING &&
         encache__shm_owner_alive(s, &oc)))
      return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                                "%s: full of objects still being written",
                                s->base.url);
    relabelled = drop_oldest(s, ent(s, first), &oc, &budget) ? relabelled + 1
                                                              : 0;
  }
}

/* Allocates the record of a new object (key of klen bytes, hash, obj_len
 * object bytes) at the head: its entry, in state WRITING and owned by
 * this handle, goes on its chain and the FIFO list, and its key into the
 * ring.  Returns the entry in *ep and where its object bytes go in *dst
 * (from the private values: what the shared entry says by then is not
 * trusted). */
int encache__shm_alloc_record(shm_store *s, const char *key, size_t klen,
                              uint64_t hash, uint64_t obj_len,
                              shm_entry **ep, unsigned char **dst) {
  uint64_t rec = rec_size(klen, obj_len), pos = 0;
  uint32_t fe = 0, fnext = 0;
  int rc = make_room(s, rec, &pos, &fe, &fnext);
  if (rc < 0)
    return rc;
  shm_entry *e = ent(s, fe); /* checked by make_room: in range */
  s->h->free_first = fnext;
  shm_entry n;
  memset(&n, 0, sizeof(n));
  n.state = E_WRITING;
  n.hash = hash;
  n.key_len = (uint32_t)klen;
  n.obj_len = obj_len;
  n.pos = pos;
  n.owner_slot = (uint32_t)s->slot;
  n.owner_token = s->token;
  encache__shm_store_entry(s, e, &n);
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  s->h->head = pos + rec;
  memcpy(rec_at(s, pos), key, klen);
  encache__shm_fifo_append(s, e);
  encache__shm_chain_insert(s, e);
  s->h->nobjects++;
  s->h->bytes_used += rec;
  *ep = e;
  *dst = rec_at(s, pos) + rec_obj_off(klen);
  return 0;
}
