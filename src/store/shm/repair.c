/* SPDX-License-Identifier: Apache-2.0 */
/*
 * repair.c: the shm Store's writer liveness, its structure check and its
 * repair (and the lookup that repairs a corrupt chain it meets).
 *
 * Writer liveness.  Each handle holds an open-file-description lock
 * (F_OFD_SETLK) on one byte of the segment file beyond its end, its slot,
 * for as long as it is open, and writes a random token into tokens[slot].
 * The kernel drops the lock when the handle is closed or its process dies,
 * whatever the PID namespace; a WRITING entry's writer, and a lease's
 * holder (lease.c), lives while its slot is locked and still holds its
 * token.
 *
 * Crashes.  A process killed while holding the lock leaves it to the next
 * locker with EOWNERDEAD; that process runs encache__shm_repair(), which
 * rebuilds all derived structure (chains, lists, free list, ring head,
 * counters) from the entries that pass validation, and marks the mutex
 * consistent.
 * Entries caught half-moved, or written by dead writers, are dropped.  The
 * same repair runs whenever an operation finds structure that does not
 * validate: the Store is repaired, never trusted blindly.
 */
#include "shm.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ------------------------------------------------------- writer liveness */

/* The lock on writer slots [first, first + n) of a segment file of total
 * bytes: the bytes just past its end. */
static struct flock slot_range(uint64_t total, uint32_t first, uint32_t n) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = (off_t)(total + first);
  fl.l_len = n;
  return fl;
}

/* Whether the handle of writer slot `slot`, slot token `token`, lives:
 * its slot byte is locked and still holds that token. */
int encache__shm_slot_alive(shm_store *s, uint32_t slot, uint64_t token) {
  if (slot >= s->nslots)
    return 0;
  if ((int)slot == s->slot)
    return token == s->token; /* our own lock does not show */
  struct flock fl = slot_range(s->total_size, slot, 1);
  if (fcntl(s->fd, F_OFD_GETLK, &fl) != 0)
    return 1; /* cannot tell: assume alive, never reclaim blindly */
  return fl.l_type != F_UNLCK &&
         __atomic_load_n(&s->tokens[slot], __ATOMIC_ACQUIRE) == token;
}

/* Whether the writer of the WRITING entry e (a checked copy) lives. */
int encache__shm_owner_alive(shm_store *s, const shm_entry *e) {
  return encache__shm_slot_alive(s, e->owner_slot, e->owner_token);
}

static uint64_t new_token(const shm_store *s) {
  uint64_t t = 0;
  if (getrandom(&t, sizeof(t), GRND_NONBLOCK) != (ssize_t)sizeof(t)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^
        (uint64_t)getpid() << 16 ^ (uint64_t)(uintptr_t)s;
  }
  return t | 1; /* never 0, the token of a free slot */
}

/* Takes a free slot for this handle (none: it cannot write). */
void encache__shm_take_slot(shm_store *s) {
  s->slot = -1;
  for (uint32_t i = 0; i < s->nslots; i++) {
    struct flock fl = slot_range(s->total_size, i, 1);
    if (fcntl(s->fd, F_OFD_SETLK, &fl) == 0) {
      s->slot = (int)i;
      s->token = new_token(s);
      __atomic_store_n(&s->tokens[i], s->token, __ATOMIC_RELEASE);
      return;
    }
  }
}

/* Whether any handle holds a writer slot of the segment file fd of `size`
 * bytes: whether any process has it open (it cannot tell: yes). */
int encache__shm_slots_held(int fd, uint64_t size) {
  struct flock fl = slot_range(size, 0, SHM_SLOTS);
  return fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
}

/* ----------------------------------------------------------------- repair */

static void drop_entry(shm_store *s, shm_entry *e) {
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  encache__shm_store_free(s, e);
}

/* What repair keeps of a live entry, in private memory: sorting and every
 * decision read values that cannot change underneath. */
typedef struct kept_rec {
  uint64_t pos, end, hash;
  size_t prev; /* the kept record before this one (a stack), or SIZE_MAX */
  uint32_t id, key_len;
  uint8_t writing, dropped;
} kept_rec;

static int cmp_pos(const void *a, const void *b) {
  const kept_rec *x = a, *y = b;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_hash_pos(const void *a, const void *b) {
  const kept_rec *x = a, *y = b;
  if (x->hash != y->hash)
    return x->hash < y->hash ? -1 : 1;
  return cmp_pos(a, b);
}

/* Of overlapping records, or two of one key, which goes: the newer (or,
 * for twins, the older), except that a live writer's record is kept over
 * a READY one (its writer is still copying into it). */
static void drop_one_of(kept_rec *older, kept_rec *newer, int twins) {
  if (newer->writing && !older->writing)
    older->dropped = 1;
  else if (older->writing && !newer->writing)
    newer->dropped = 1;
  else if (twins)
    older->dropped = 1;
  else
    newer->dropped = 1;
}

/* Whether entry id (checked copy c, ok when it passed) is kept: a READY
 * entry whose key still hashes to its hash, or a live writer's. */
static int worth_keeping(shm_store *s, const shm_entry *c, int ok) {
  if (ok && c->state == E_READY)
    return hash_key((const char *)rec_at(s, c->pos), c->key_len) == c->hash;
  if (ok && c->state == E_WRITING)
    return encache__shm_owner_alive(s, c);
  return 0;
}

/* Copies what repair keeps of each entry worth keeping into a private
 * array (*krp, *nkp entries; the caller frees it) and drops the others. */
static int collect_kept(shm_store *s, kept_rec **krp, size_t *nkp) {
  size_t cap = 0, nk = 0;
  kept_rec *kr = NULL;
  for (uint32_t id = 1; id <= s->nentries; id++) {
    shm_entry c, *e = &s->entries[id - 1];
    int ok = encache__shm_load_entry(s, id, &c, 0);
    if (!worth_keeping(s, &c, ok)) {
      if (!ok || c.state != E_FREE)
        drop_entry(s, e);
      continue;
    }
    if (nk == cap) {
      size_t ncap = cap ? 2 * cap : 1024;
      kept_rec *n = encache__realloc(kr, ncap * sizeof(*kr));
      if (n == NULL) {
        encache__free(kr);
        return encache_store_fail(&s->base, ENCACHE_ENOMEM,
                                  "%s: out of memory for a repair",
                                  s->base.url);
      }
      kr = n;
      cap = ncap;
    }
    kr[nk++] = (kept_rec){c.pos, c.pos + rec_size(c.key_len, c.obj_len),
                          c.hash, SIZE_MAX, id, c.key_len,
                          c.state == E_WRITING, 0};
  }
  *krp = kr;
  *nkp = nk;
  return 0;
}

/* The ring's last lap ends at the newest record; what lies outside it, or
 * overlaps a record it keeps, goes.  Sorts kr by position. */
static void drop_overlaps(shm_store *s, kept_rec *kr, size_t nk) {
  if (nk > 1)
    qsort(kr, nk, sizeof(*kr), cmp_pos);
  uint64_t newest = 0;
  for (size_t k = 0; k < nk; k++)
    newest = kr[k].end > newest ? kr[k].end : newest;
  size_t last = SIZE_MAX; /* the newest record kept so far */
  for (size_t k = 0; k < nk; k++) {
    if (newest - kr[k].pos > s->data_size) {
      kr[k].dropped = 1;
      continue;
    }
    while (last != SIZE_MAX && !kr[k].dropped && kr[last].end > kr[k].pos) {
      drop_one_of(&kr[last], &kr[k], 0);
      if (kr[last].dropped)
        last = kr[last].prev;
    }
    if (!kr[k].dropped) {
      kr[k].prev = last;
      last = k;
    }
  }
}

/* Of two records of one key, one goes.  Leaves kr sorted by position. */
static void drop_twins(shm_store *s, kept_rec *kr, size_t nk) {
  if (nk > 1)
    qsort(kr, nk, sizeof(*kr), cmp_hash_pos);
  for (size_t k = 0; k < nk; k++)
    for (size_t j = k + 1; j < nk && kr[j].hash == kr[k].hash; j++)
      if (!kr[k].dropped && !kr[j].dropped &&
          kr[j].key_len == kr[k].key_len &&
          memcmp(rec_at(s, kr[j].pos), rec_at(s, kr[k].pos),
                 kr[k].key_len) == 0)
        drop_one_of(&kr[k], &kr[j], 1);
  if (nk > 1)
    qsort(kr, nk, sizeof(*kr), cmp_pos);
}

/* Rebuilds the FIFO list, the chains and the counters from the kept
 * records (in position order), then the ring head and the free list. */
static void rebuild(shm_store *s, const kept_rec *kr, size_t nk) {
  shm_header *h = s->h;
  h->fifo_first = h->fifo_last = h->free_first = 0;
  h->nobjects = 0;
  h->bytes_used = 0;
  memset(s->buckets, 0, sizeof(uint32_t) * (size_t)s->nbuckets);
  uint64_t first = 0, last_end = 0;
  for (size_t k = 0; k < nk; k++) {
    shm_entry *e = &s->entries[kr[k].id - 1];
    if (kr[k].dropped) {
      drop_entry(s, e);
      continue;
    }
    if (h->nobjects++ == 0)
      first = kr[k].pos;
    last_end = kr[k].end;
    h->bytes_used += kr[k].end - kr[k].pos;
    encache__shm_fifo_append(s, e);
    uint32_t *b = &s->buckets[kr[k].hash & (s->nbuckets - 1)];
    e->hnext = *b;
    *b = kr[k].id;
  }
  uint64_t head = h->head;
  if (h->nobjects == 0 ? head > (1ull << 62)
                       : head < last_end || head - first > s->data_size)
    h->head = h->nobjects == 0 ? 0 : last_end;
  for (uint32_t i = s->nentries; i > 0; i--) {
    shm_entry *e = &s->entries[i - 1];
    if (e->state == E_FREE) {
      e->fprev = e->fnext = 0;
      e->hnext = h->free_first;
      h->free_first = i;
    }
  }
}

/* Rebuilds every derived structure (lists, chains, ring head, counters)
 * from the entries that validate.  Runs under the segment lock; it reads
 * shared memory only through checked private copies and sorts in private
 * memory, so bytes changing while it runs (another process's bug) cannot
 * crash it; the next check finds whatever they broke.  Idempotent: a
 * process dying in here, or failing to allocate, leaves `dirty` set and
 * the next locker runs it again.  It never drops the record of a live
 * writer for a READY one: that writer is still copying into it. */
int encache__shm_repair(shm_store *s) {
  kept_rec *kr = NULL;
  size_t nk = 0;
  s->h->dirty = 1;
  int rc = collect_kept(s, &kr, &nk);
  if (rc < 0)
    return rc;
  drop_overlaps(s, kr, nk);
  drop_twins(s, kr, nk);
  rebuild(s, kr, nk);
  encache__free(kr);
  s->h->repairs++;
  s->h->dirty = 0;
  return 0;
}

/* Checks every list and chain in O(entries); false when anything is out
 * of range, cyclic, fails its check or is inconsistent with the entries'
 * states and the ring head. */
int encache__shm_structure_ok(shm_store *s) {
  shm_header *h = s->h;
  uint32_t n = s->nentries, live = 0, nfree = 0, chained = 0, prev = 0;
  uint64_t prev_end = 0, bytes = 0;
  shm_entry c;
  if (h->dirty)
    return 0;
  for (uint32_t i = h->fifo_first; i != 0; i = c.fnext) {
    if (++live > n || !encache__shm_load_entry(s, i, &c, 1) ||
        c.fprev != prev || (c.state != E_READY && c.state != E_WRITING) ||
        (live > 1 && c.pos < prev_end))
      return 0;
    prev_end = c.pos + rec_size(c.key_len, c.obj_len);
    bytes += rec_size(c.key_len, c.obj_len);
    prev = i;
  }
  if (h->fifo_last != prev || live != h->nobjects || bytes != h->bytes_used)
    return 0;
  for (uint32_t i = h->free_first; i != 0; i = c.hnext)
    if (++nfree > n || !encache__shm_load_entry(s, i, &c, 1) ||
        c.state != E_FREE)
      return 0;
  if (live + nfree != n)
    return 0;
  for (uint32_t b = 0; b < s->nbuckets; b++)
    for (uint32_t i = s->buckets[b]; i != 0; i = c.hnext)
      if (++chained > live || !encache__shm_load_entry(s, i, &c, 1) ||
          c.state == E_FREE || (c.hash & (s->nbuckets - 1)) != b)
        return 0;
  return chained == live;
}

/* The most repairs a segment can have made beyond one per record (an
 * object dropped for its checksum, a dead writer's): a repair walks the
 * whole entry table, so 2^32 of them would take weeks of nothing else. */
#define REPAIRS_SLACK (UINT64_C(1) << 32)

/* Every eviction and every second chance ends a record of the ring (a
 * second chance allocates its successor), and every record took at
 * least REC_ALIGN bytes of ring positions below the head: together they
 * are at most head / REC_ALIGN.  Repairs are at most one per record plus
 * REPAIRS_SLACK.  A counter past its bound was written by something
 * else than its one increment (damage, another process's bug): it
 * restarts from 0, as a Prometheus counter may, and the repair is
 * counted, so that stats never reports it. */
void encache__shm_check_counters(shm_store *s) {
  shm_header *h = s->h;
  uint64_t records = __atomic_load_n(&h->head, __ATOMIC_RELAXED) / REC_ALIGN;
  int damaged = 0;
  if (h->evictions > records || h->reinsertions > records ||
      h->evictions + h->reinsertions > records) {
    h->evictions = h->reinsertions = 0;
    damaged = 1;
  }
  if (h->repairs > records + REPAIRS_SLACK) {
    h->repairs = 0;
    damaged = 1;
  }
  h->repairs += (uint64_t)damaged;
}

/* ---------------------------------------------------- repairing lookups */

/* Finds the live entry for key (NULL: none), with its checked copy in *c;
 * repairs the structure and looks again once when the chain is corrupt. */
shm_entry *encache__shm_find(shm_store *s, const char *key, uint32_t klen,
                             uint64_t hash, shm_entry *c) {
  int corrupt = 0;
  shm_entry *e = encache__shm_find_once(s, key, klen, hash, c, &corrupt);
  if (corrupt && encache__shm_repair(s) == 0) {
    corrupt = 0;
    e = encache__shm_find_once(s, key, klen, hash, c, &corrupt);
  }
  return corrupt ? NULL : e;
}
