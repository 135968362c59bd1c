/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.c: the shm Store's index: the entries (one per object) and their
 * check word, the hash chains that find an entry by key, the FIFO list
 * that keeps live entries in ring order, and the free list.
 *
 * Everything here runs under the segment lock (lock.c).  What an
 * operation trusts of an entry is never read where it lies in shared
 * memory: encache__shm_load_entry() copies the entry out once and the
 * copy must pass its check word and range checks; what the lock writes
 * back goes through encache__shm_store_entry(), which seals the private
 * values, never what the shared entry holds by then.  A chain that does
 * not validate is repaired (repair.c) and walked again.
 */
#include "shm.h"

#include <string.h>

/* The check word of entry id: covers what only the lock changes and that
 * readers or allocation trust (not the links, gen or referenced). */
uint32_t encache__shm_entry_check(const shm_entry *e, uint32_t id) {
  const uint64_t w[] = {e->hash, e->pos, e->obj_len, e->owner_token, e->sum,
                        (uint64_t)e->key_len << 32 | e->state,
                        (uint64_t)e->owner_slot << 32 | e->flags};
  return check_words(0x9e3779b97f4a7c15ull, id, w, sizeof(w) / sizeof(w[0]));
}

/* After the lock changed any field encache__shm_entry_check() covers:
 * writes those fields from the private entry n, and the check word
 * computed from n: never from what the shared entry holds by then (a
 * peer's damage must not be sealed in). */
void encache__shm_store_entry(shm_store *s, shm_entry *e, const shm_entry *n) {
  e->hash = n->hash;
  e->pos = n->pos;
  e->obj_len = n->obj_len;
  e->owner_token = n->owner_token;
  e->sum = n->sum;
  e->key_len = n->key_len;
  e->state = n->state;
  e->owner_slot = n->owner_slot;
  e->flags = n->flags;
  e->check = encache__shm_entry_check(n, ent_id(s, e));
}

/* Marks e FREE (its other covered fields zero). */
void encache__shm_store_free(shm_store *s, shm_entry *e) {
  shm_entry n;
  memset(&n, 0, sizeof(n));
  n.state = E_FREE;
  encache__shm_store_entry(s, e, &n);
}

/* Whether a record of e's key and object lengths at e's position lies
 * inside the data region. */
static int rec_fits(shm_store *s, const shm_entry *e) {
  uint64_t ds = s->data_size;
  if (e->key_len == 0 || e->key_len > SHM_MAX_KEY || e->obj_len > ds)
    return 0;
  uint64_t rec = rec_size(e->key_len, e->obj_len);
  return rec <= ds && e->pos % ds + rec <= ds;
}

/* Whether e's record (which rec_fits()) lies within the ring's last lap
 * before head. */
int encache__shm_in_window(shm_store *s, const shm_entry *e, uint64_t head) {
  uint64_t rec = rec_size(e->key_len, e->obj_len);
  return e->pos <= head && rec <= head - e->pos &&
         head - e->pos <= s->data_size;
}

/* rec_fits(), and the record lies within the ring's last lap before head. */
static int entry_sane(shm_store *s, const shm_entry *e) {
  return rec_fits(s, e) &&
         encache__shm_in_window(
             s, e, __atomic_load_n(&s->h->head, __ATOMIC_RELAXED));
}

/* Copies entry id (index + 1) out of shared memory into *c: every later
 * use of its fields reads the copy, so bytes changing underneath cannot
 * turn a checked value into an unchecked one.  Returns 1 when the copy can
 * be trusted: its check word holds, its state is known and, unless FREE,
 * its record lies inside the data region and (with_head) inside the ring's
 * last lap. */
int encache__shm_load_entry(shm_store *s, uint32_t id, shm_entry *c,
                            int with_head) {
  shm_entry *e = ent(s, id);
  if (e == NULL)
    return 0;
  memcpy(c, e, sizeof(*c));
  /* The copy is what is used: no later read of a field may go back to the
   * shared entry instead. */
  __asm__ volatile("" ::: "memory");
  if (c->check != encache__shm_entry_check(c, id) || c->state > E_MOVING)
    return 0;
  return c->state == E_FREE ||
         (with_head ? entry_sane(s, c) : rec_fits(s, c));
}

/* ----------------------------------------------------- list maintenance */

void encache__shm_fifo_unlink(shm_store *s, shm_entry *e) {
  shm_entry *p = ent(s, e->fprev), *n = ent(s, e->fnext);
  if (p != NULL)
    p->fnext = e->fnext;
  else
    s->h->fifo_first = e->fnext;
  if (n != NULL)
    n->fprev = e->fprev;
  else
    s->h->fifo_last = e->fprev;
  e->fprev = e->fnext = 0;
}

void encache__shm_fifo_append(shm_store *s, shm_entry *e) {
  uint32_t id = ent_id(s, e);
  shm_entry *last = ent(s, s->h->fifo_last);
  e->fprev = s->h->fifo_last;
  e->fnext = 0;
  if (last != NULL)
    last->fnext = id;
  else
    s->h->fifo_first = id;
  s->h->fifo_last = id;
}

static void chain_unlink(shm_store *s, shm_entry *e) {
  uint32_t id = ent_id(s, e);
  uint32_t *link = &s->buckets[e->hash & (s->nbuckets - 1)];
  for (uint32_t steps = 0; *link != 0 && steps <= s->nentries; steps++) {
    shm_entry *c = ent(s, *link);
    if (c == NULL)
      break;
    if (*link == id) {
      *link = e->hnext;
      break;
    }
    link = &c->hnext;
  }
  e->hnext = 0;
}

void encache__shm_chain_insert(shm_store *s, shm_entry *e) {
  uint32_t *b = &s->buckets[e->hash & (s->nbuckets - 1)];
  e->hnext = *b;
  *b = ent_id(s, e);
}

/* Ends the life of a live entry: its record becomes invalid (generation
 * bump first, so that readers copying it will report a miss), then the
 * entry returns to the free list. */
void encache__shm_entry_free(shm_store *s, shm_entry *e) {
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  chain_unlink(s, e);
  encache__shm_fifo_unlink(s, e);
  s->h->nobjects--;
  s->h->bytes_used -= rec_size(e->key_len, e->obj_len);
  encache__shm_store_free(s, e);
  e->hnext = s->h->free_first;
  s->h->free_first = ent_id(s, e);
}

/* --------------------------------------------------------------- lookups */

/* Finds the live (non-FREE) entry for key, with its checked copy in *c;
 * sets *corrupt when the chain does not validate. */
shm_entry *encache__shm_find_once(shm_store *s, const char *key,
                                  uint32_t klen, uint64_t hash, shm_entry *c,
                                  int *corrupt) {
  uint32_t i = s->buckets[hash & (s->nbuckets - 1)];
  for (uint32_t steps = 0; i != 0; steps++) {
    if (steps > s->nentries || !encache__shm_load_entry(s, i, c, 1) ||
        c->state == E_FREE) {
      *corrupt = 1;
      return NULL;
    }
    if (c->hash == hash && c->key_len == klen &&
        memcmp(rec_at(s, c->pos), key, klen) == 0)
      return ent(s, i);
    i = c->hnext;
  }
  return NULL;
}
