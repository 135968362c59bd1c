/*
 * shm.c: the embedded shared-memory Store (URL shm://NAME?size=SIZE).
 *
 * Every process on a host that opens NAME maps one POSIX shared-memory
 * segment (/dev/shm/encache-NAME).  The segment outlives the processes
 * until it is destroyed.
 *
 * Layout (all offsets from the start of the segment):
 *
 *   0            shm_header: magic, format word, geometry (immutable after
 *                creation), the robust process-shared mutex, and the
 *                mutable state it protects (ring head, lists, counters)
 *   entries_off  nentries x shm_entry: one per object
 *   buckets_off  nbuckets x u32: hash chains of entries (index + 1)
 *   slots_off    nslots x u64: the token of each writer slot's holder
 *   data_off     data_size bytes: a ring of records, one per object:
 *                the key, padding to 64 bytes, then the object bytes
 *
 * The magic is written last when a segment is created, under an flock()
 * held by whoever initialises it; an opener checks the magic and the
 * format word (layout version and the sizes of the shared types) and the
 * geometry before using anything, and refuses a mismatch (EFORMAT).
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
 * Concurrency.  All structure (entries, chains, lists, ring head,
 * counters) changes under the one robust mutex.  Data does not:
 *   - A writer allocates its record and an entry in state WRITING under
 *     the lock, copies the object outside it, and publishes the entry
 *     (READY) under the lock again.  Readers never see a WRITING entry,
 *     so they never see a partial object.  A WRITING entry at the tail
 *     is not evicted while its writer lives (the writer's handle holds an
 *     open-file-description lock on a slot byte, see owner_alive()); a
 *     dead writer's entry is reclaimed by whoever finds it.
 *   - A reader looks its keys up under the lock, noting each entry's
 *     generation, and copies outside it.  Every event that ends a record's
 *     validity (eviction, removal, reinsertion, repair) increments the
 *     entry's generation under the lock before the space can be reused;
 *     after copying, the reader checks the generation and reports a miss
 *     when it changed.  So a reader never returns bytes of an object that
 *     was evicted or replaced while it was being read (a seqlock).
 *
 * Crashes.  A process killed while holding the lock leaves it to the next
 * locker with EOWNERDEAD; that process runs repair(), which rebuilds all
 * derived structure (chains, lists, free list, counters) from the entries
 * that pass validation, and marks the mutex consistent.  Entries caught
 * half-moved, or written by dead writers, are dropped.  The same repair
 * runs whenever a lookup finds structure that does not validate (an index
 * out of range, a cycle): the Store is repaired, never trusted blindly.
 * The lock is taken with a timeout (lock_timeout_ms, default 5000), so a
 * wedged lock makes operations fail as recoverable, never hang.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ENCACHE_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define ENCACHE_TSAN 1
#endif

#ifdef ENCACHE_TSAN
/* The optimistic copy races with writers by design (the generation check
 * discards what it read); tell ThreadSanitizer not to report it. */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define OPTIMISTIC_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define OPTIMISTIC_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define OPTIMISTIC_BEGIN() ((void)0)
#define OPTIMISTIC_END() ((void)0)
#endif

#define SHM_MAGIC 0x314d48534e434e45ull /* "ENCNSHM1" */
#define SHM_VERSION 2u
#define REC_ALIGN 64u
#define SHM_MAX_KEY (64u * 1024u)
#define SHM_DEFAULT_SIZE (1ull << 30)
#define SHM_MIN_SIZE (1ull << 20)
#define SHM_MAX_NAME 200
#define SHM_PAGE 4096u
#define SHM_SLOTS 4096u /* handles that can write at once */

enum entry_state { E_FREE = 0, E_WRITING = 1, E_READY = 2, E_MOVING = 3 };

/* One object.  Invariants (under the lock): a non-FREE entry's record lies
 * within [tail, head) of the ring and inside the data region; READY and
 * WRITING entries are on their hash chain and on the FIFO list in
 * position order; FREE entries are on the free list (through hnext).
 * `gen` and `referenced` are also touched without the lock (atomically). */
typedef struct shm_entry {
  uint64_t gen;         /* bumped whenever the record stops being valid */
  uint64_t hash;        /* of the key */
  uint64_t pos;         /* ring position of the record */
  uint64_t obj_len;     /* object bytes (after the key) */
  uint64_t owner_token; /* WRITING: the writer's handle token */
  uint32_t key_len;
  uint32_t state;
  uint32_t hnext;       /* hash chain / free list: index + 1, 0 = end */
  uint32_t fprev, fnext;/* FIFO (ring order) list: index + 1 */
  uint32_t owner_slot;  /* WRITING: the writer's handle slot */
  uint32_t referenced;  /* set by readers: earns a second chance */
  uint32_t pad_;
} shm_entry;

typedef struct shm_header {
  /* Immutable after creation. */
  uint64_t magic;
  uint64_t format;
  uint64_t total_size;
  uint64_t entries_off;
  uint64_t buckets_off;
  uint64_t data_off;
  uint64_t data_size;
  uint32_t nentries;
  uint32_t nbuckets;
  uint64_t slots_off; /* nslots x u64: the token of each slot's holder */
  uint32_t nslots;
  uint32_t pad_;
  /* The lock, on its own cache line. */
  _Alignas(64) pthread_mutex_t lock;
  /* Mutable, under the lock. */
  _Alignas(64) uint64_t head;
  uint32_t fifo_first, fifo_last; /* index + 1 */
  uint32_t free_first;            /* index + 1 */
  uint32_t nobjects;
  uint64_t bytes_used;
  uint64_t evictions;
  uint64_t reinsertions;
  uint64_t repairs;
} shm_header;

#define SHM_FORMAT                                                           \
  (((uint64_t)SHM_VERSION << 56) | ((uint64_t)sizeof(shm_header) << 40) |    \
   ((uint64_t)sizeof(shm_entry) << 24) |                                     \
   ((uint64_t)sizeof(pthread_mutex_t) << 8) | (uint64_t)sizeof(void *))

typedef struct shm_store {
  encache_store base;
  int fd;
  unsigned char *map;
  size_t map_size;
  shm_header *h;
  shm_entry *entries;
  uint32_t *buckets;
  unsigned char *data;
  uint64_t data_size;
  uint32_t nentries, nbuckets, nslots;
  uint64_t *tokens;
  unsigned lock_timeout_ms;
  int slot;       /* this handle's writer slot, -1 = none */
  uint64_t token; /* this handle's token, in tokens[slot] */
  /* Records this handle copied but could not publish (the lock timed
   * out): published at its next successful lock, or at close. */
  pthread_mutex_t pmu;
  struct pending_pub {
    shm_entry *e;
    uint64_t gen;
  } pending[8];
  int npending;
  struct shm_store *reg_next; /* the process's open handles (fork) */
} shm_store;

/* Test hooks: read() calls the first between the lookup and the copy,
 * write() the second between the allocation and the copy. */
void (*encache__shm_read_hook)(void);
void (*encache__shm_write_hook)(void);

static const encache__store_ops shm_ops;

/* ------------------------------------------------------------- helpers */

static uint64_t hash_key(const char *key, size_t len) {
  /* FNV-1a, then a finalizer so that the low bits (the bucket) mix well. */
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)key[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

static uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

static uint64_t rec_size(uint64_t key_len, uint64_t obj_len) {
  return align_up(align_up(key_len, REC_ALIGN) + obj_len, REC_ALIGN);
}

static unsigned char *rec_at(shm_store *s, uint64_t pos) {
  return s->data + pos % s->data_size;
}

static unsigned char *obj_at(shm_store *s, const shm_entry *e) {
  return rec_at(s, e->pos) + align_up(e->key_len, REC_ALIGN);
}

/* The entry with index+1 `i`, or NULL when i is 0 or out of range. */
static shm_entry *ent(shm_store *s, uint32_t i) {
  return i == 0 || i > s->nentries ? NULL : &s->entries[i - 1];
}

static uint32_t ent_id(shm_store *s, const shm_entry *e) {
  return (uint32_t)(e - s->entries) + 1;
}

/* Whether e's fields describe a record that can be dereferenced safely. */
static int entry_sane(shm_store *s, const shm_entry *e) {
  uint64_t ds = s->data_size, head = s->h->head;
  if (e->key_len == 0 || e->key_len > SHM_MAX_KEY || e->obj_len > ds)
    return 0;
  uint64_t rec = rec_size(e->key_len, e->obj_len);
  return rec <= ds && e->pos % ds + rec <= ds && e->pos <= head &&
         rec <= head - e->pos && head - e->pos <= ds;
}

/*
 * Writer liveness.  Each handle holds an open-file-description lock
 * (F_OFD_SETLK) on one byte of the segment file beyond its end, its slot,
 * for as long as it is open, and writes a random token into tokens[slot].
 * The kernel drops the lock when the handle is closed or its process dies,
 * whatever the PID namespace; a WRITING entry's writer lives while its
 * slot is locked and still holds its token.
 */
static struct flock slot_lock(const shm_store *s, uint32_t slot, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = (off_t)(s->h->total_size + slot);
  fl.l_len = 1;
  return fl;
}

static int owner_alive(shm_store *s, const shm_entry *e) {
  uint32_t slot = e->owner_slot;
  if (slot >= s->nslots)
    return 0;
  if ((int)slot == s->slot)
    return e->owner_token == s->token; /* our own lock does not show */
  struct flock fl = slot_lock(s, slot, F_WRLCK);
  if (fcntl(s->fd, F_OFD_GETLK, &fl) != 0)
    return 1; /* cannot tell: assume alive, never reclaim blindly */
  return fl.l_type != F_UNLCK &&
         __atomic_load_n(&s->tokens[slot], __ATOMIC_ACQUIRE) == e->owner_token;
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
static void take_slot(shm_store *s) {
  s->slot = -1;
  for (uint32_t i = 0; i < s->nslots; i++) {
    struct flock fl = slot_lock(s, i, F_WRLCK);
    if (fcntl(s->fd, F_OFD_SETLK, &fl) == 0) {
      s->slot = (int)i;
      s->token = new_token(s);
      __atomic_store_n(&s->tokens[i], s->token, __ATOMIC_RELEASE);
      return;
    }
  }
}

/* ----------------------------------------------------- list maintenance */

static void fifo_unlink(shm_store *s, shm_entry *e) {
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

static void fifo_append(shm_store *s, shm_entry *e) {
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

static void chain_insert(shm_store *s, shm_entry *e) {
  uint32_t *b = &s->buckets[e->hash & (s->nbuckets - 1)];
  e->hnext = *b;
  *b = ent_id(s, e);
}

/* Ends the life of a live entry: its record becomes invalid (generation
 * bump first, so that readers copying it will report a miss), then the
 * entry returns to the free list. */
static void entry_free(shm_store *s, shm_entry *e) {
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  chain_unlink(s, e);
  fifo_unlink(s, e);
  s->h->nobjects--;
  s->h->bytes_used -= rec_size(e->key_len, e->obj_len);
  e->state = E_FREE;
  e->hnext = s->h->free_first;
  s->h->free_first = ent_id(s, e);
}

/* ----------------------------------------------------------------- repair */

static shm_store *repair_store; /* context for qsort's comparator */

static int cmp_pos(const void *a, const void *b) {
  const shm_entry *x = &repair_store->entries[*(const uint32_t *)a];
  const shm_entry *y = &repair_store->entries[*(const uint32_t *)b];
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static pthread_mutex_t repair_mutex = PTHREAD_MUTEX_INITIALIZER;

static void drop_entry(shm_entry *e) {
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  e->state = E_FREE;
}

/* Rebuilds every derived structure from the entries that validate.  Runs
 * under the segment lock; idempotent, so a process dying in here leaves
 * the next locker to run it again.  It allocates nothing (the bucket
 * array, rebuilt last, is the sorting scratch: nbuckets >= nentries), and
 * it never drops the record of a writer that is alive: that writer is
 * still copying into it. */
static void repair(shm_store *s) {
  shm_header *h = s->h;
  uint32_t n = s->nentries, kept = 0;
  uint32_t *order = s->buckets;

  for (uint32_t i = 0; i < n; i++) {
    shm_entry *e = &s->entries[i];
    int keep = 0;
    if (entry_sane(s, e)) {
      if (e->state == E_READY)
        keep = hash_key((const char *)rec_at(s, e->pos), e->key_len) == e->hash;
      else if (e->state == E_WRITING)
        keep = owner_alive(s, e);
    }
    if (keep)
      order[kept++] = i;
    else if (e->state != E_FREE)
      drop_entry(e);
  }
  /* qsort has no context argument: serialise repairs within the process. */
  pthread_mutex_lock(&repair_mutex);
  repair_store = s;
  qsort(order, kept, sizeof(uint32_t), cmp_pos);
  pthread_mutex_unlock(&repair_mutex);

  /* Overlapping records: one of each pair goes, never a live writer's. */
  h->fifo_first = h->fifo_last = h->free_first = 0;
  h->nobjects = 0;
  h->bytes_used = 0;
  shm_entry *last = NULL;
  for (uint32_t k = 0; k < kept; k++) {
    shm_entry *e = &s->entries[order[k]];
    e->fprev = e->fnext = 0;
    if (last != NULL &&
        last->pos + rec_size(last->key_len, last->obj_len) > e->pos) {
      if (e->state == E_WRITING && last->state != E_WRITING) {
        fifo_unlink(s, last);
        drop_entry(last);
      } else {
        drop_entry(e);
        continue;
      }
    }
    fifo_append(s, e);
    last = e;
  }
  /* The hash chains, from the list (the scratch is no longer needed);
   * of two records of one key, the older goes unless it is being written. */
  memset(s->buckets, 0, sizeof(uint32_t) * (size_t)s->nbuckets);
  for (uint32_t i = h->fifo_first; i != 0;) {
    shm_entry *e = &s->entries[i - 1];
    uint32_t next = e->fnext;
    shm_entry *twin = NULL;
    for (uint32_t c = s->buckets[e->hash & (s->nbuckets - 1)]; c && !twin;
         c = s->entries[c - 1].hnext) {
      shm_entry *o = &s->entries[c - 1];
      if (o->key_len == e->key_len &&
          memcmp(rec_at(s, o->pos), rec_at(s, e->pos), e->key_len) == 0)
        twin = o;
    }
    shm_entry *gone = twin == NULL ? NULL
                      : twin->state == E_WRITING ? e : twin;
    if (gone == twin && twin != NULL) {
      chain_unlink(s, twin);
      h->nobjects--;
      h->bytes_used -= rec_size(twin->key_len, twin->obj_len);
    }
    if (gone != NULL) {
      fifo_unlink(s, gone);
      drop_entry(gone);
    }
    if (gone != e) {
      chain_insert(s, e);
      h->nobjects++;
      h->bytes_used += rec_size(e->key_len, e->obj_len);
    }
    i = next;
  }
  for (uint32_t i = n; i-- > 0;) {
    shm_entry *e = &s->entries[i];
    if (e->state == E_FREE) {
      e->fprev = e->fnext = 0;
      e->hnext = h->free_first;
      h->free_first = i + 1;
    }
  }
  h->repairs++;
}

/* Checks every list and chain in O(entries); false when anything is out
 * of range, cyclic or inconsistent with the entries' states. */
static int structure_ok(shm_store *s) {
  shm_header *h = s->h;
  uint32_t n = s->nentries, live = 0, nfree = 0;
  uint64_t prev_end = 0, bytes = 0;
  uint32_t prev = 0;
  for (uint32_t i = h->fifo_first; i != 0; i = s->entries[i - 1].fnext) {
    shm_entry *e = ent(s, i);
    if (e == NULL || ++live > n || e->fprev != prev ||
        (e->state != E_READY && e->state != E_WRITING) || !entry_sane(s, e) ||
        (live > 1 && e->pos < prev_end))
      return 0;
    prev_end = e->pos + rec_size(e->key_len, e->obj_len);
    bytes += rec_size(e->key_len, e->obj_len);
    prev = i;
  }
  if (h->fifo_last != prev || live != h->nobjects || bytes != h->bytes_used)
    return 0;
  for (uint32_t i = h->free_first; i != 0; i = s->entries[i - 1].hnext) {
    shm_entry *e = ent(s, i);
    if (e == NULL || ++nfree > n || e->state != E_FREE)
      return 0;
  }
  if (live + nfree != n)
    return 0;
  uint32_t chained = 0;
  for (uint32_t b = 0; b < s->nbuckets; b++) {
    for (uint32_t i = s->buckets[b]; i != 0; i = s->entries[i - 1].hnext) {
      shm_entry *e = ent(s, i);
      if (e == NULL || ++chained > live || e->state == E_FREE ||
          (e->hash & (s->nbuckets - 1)) != b)
        return 0;
    }
  }
  return chained == live;
}

/* ---------------------------------------------------------------- locking */

/* Publishes a record this handle finished copying, if it is still ours. */
static int publish_record(shm_store *s, shm_entry *e, uint64_t gen) {
  if (e->state == E_WRITING && __atomic_load_n(&e->gen, __ATOMIC_RELAXED) == gen &&
      e->owner_slot == (uint32_t)s->slot && e->owner_token == s->token) {
    e->state = E_READY;
    e->owner_slot = UINT32_MAX;
    return 0;
  }
  return -1;
}

/* Under the lock: publishes what an earlier timeout left pending. */
static void publish_pending(shm_store *s) {
  pthread_mutex_lock(&s->pmu);
  for (int i = 0; i < s->npending; i++)
    publish_record(s, s->pending[i].e, s->pending[i].gen);
  __atomic_store_n(&s->npending, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&s->pmu);
}

static int shm_lock_raw(shm_store *s);

static int shm_lock(shm_store *s) {
  int rc = shm_lock_raw(s);
  if (rc == 0 && __atomic_load_n(&s->npending, __ATOMIC_RELAXED) > 0)
    publish_pending(s);
  return rc;
}

static int shm_lock_raw(shm_store *s) {
  if (s->h == NULL)
    return encache__store_fail(&s->base, ENCACHE_EINVAL,
                               "%s: handle used in a child after fork(): "
                               "open a new one", s->base.url);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += s->lock_timeout_ms / 1000;
  ts.tv_nsec += (long)(s->lock_timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  int rc = pthread_mutex_timedlock(&s->h->lock, &ts);
  if (rc == 0)
    return 0;
  if (rc == EOWNERDEAD) {
    /* The previous holder died mid-update: rebuild, then vouch for it. */
    repair(s);
    pthread_mutex_consistent(&s->h->lock);
    return 0;
  }
  if (rc == ETIMEDOUT)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: lock not acquired within %u ms",
                               s->base.url, s->lock_timeout_ms);
  return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                             "%s: lock failed: %s%s", s->base.url,
                             strerror(rc),
                             rc == ENOTRECOVERABLE
                                 ? " (destroy the segment: encache shm destroy)"
                                 : "");
}

static void shm_unlock(shm_store *s) { pthread_mutex_unlock(&s->h->lock); }

int encache__shm_test_lock(encache_store *st) {
  return shm_lock((shm_store *)st);
}

/* --------------------------------------------------------------- lookups */

/* Finds the live (non-FREE) entry for key; sets *corrupt when the chain
 * does not validate. */
static shm_entry *find(shm_store *s, const char *key, uint32_t klen,
                       uint64_t hash, int *corrupt) {
  uint32_t i = s->buckets[hash & (s->nbuckets - 1)];
  for (uint32_t steps = 0; i != 0; steps++) {
    shm_entry *e = ent(s, i);
    if (e == NULL || steps > s->nentries || e->state == E_FREE ||
        !entry_sane(s, e)) {
      *corrupt = 1;
      return NULL;
    }
    if (e->hash == hash && e->key_len == klen &&
        memcmp(rec_at(s, e->pos), key, klen) == 0)
      return e;
    i = e->hnext;
  }
  return NULL;
}

/* find() that repairs the structure and retries once when it is corrupt. */
static shm_entry *find_repairing(shm_store *s, const char *key,
                                 uint32_t klen, uint64_t hash) {
  int corrupt = 0;
  shm_entry *e = find(s, key, klen, hash, &corrupt);
  if (corrupt) {
    repair(s);
    corrupt = 0;
    e = find(s, key, klen, hash, &corrupt);
  }
  return corrupt ? NULL : e;
}

static int key_ok(shm_store *s, const char *key, size_t *klen) {
  *klen = strlen(key);
  if (*klen == 0 || *klen > SHM_MAX_KEY)
    return encache__store_fail(&s->base, ENCACHE_EINVAL,
                               "key length %zu: must be 1 to %u bytes", *klen,
                               SHM_MAX_KEY);
  return 0;
}

static int shm_exists(encache_store *st, const char *const *keys, size_t n,
                      int *results) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  int rc = shm_lock(s);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = find_repairing(s, keys[i], (uint32_t)klen,
                                  hash_key(keys[i], klen));
    results[i] = e != NULL && e->state == E_READY;
  }
  shm_unlock(s);
  return 0;
}

typedef struct read_snap {
  shm_entry *e;
  uint64_t gen;
  const unsigned char *src;
  uint64_t len;
} read_snap;

/* Reads whole objects (split 0) or splits each: its first `split` bytes to
 * heads[i], the rest to bufs[i]. */
static int read_common(encache_store *st, const char *const *keys, size_t n,
                       size_t split, void *const *heads, void *const *bufs,
                       const size_t *caps, int64_t *results) {
  shm_store *s = (shm_store *)st;
  read_snap local[16];
  read_snap *snap = n <= 16 ? local : encache__calloc(n, sizeof(*snap));
  if (snap == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = shm_lock(s);
  if (rc < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    size_t klen;
    snap[i].e = NULL;
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = find_repairing(s, keys[i], (uint32_t)klen,
                                  hash_key(keys[i], klen));
    if (e == NULL || e->state != E_READY) {
      results[i] = ENCACHE_ENOENT;
    } else if (e->obj_len > caps[i] && e->obj_len - caps[i] > split) {
      results[i] = ENCACHE_ETOOLARGE;
    } else {
      snap[i].e = e;
      snap[i].gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
      snap[i].src = obj_at(s, e);
      snap[i].len = e->obj_len;
      __atomic_store_n(&e->referenced, 1, __ATOMIC_RELAXED);
    }
  }
  shm_unlock(s);
  if (encache__shm_read_hook != NULL)
    encache__shm_read_hook();
  for (size_t i = 0; i < n; i++) {
    if (snap[i].e == NULL)
      continue;
    size_t h = snap[i].len < split ? (size_t)snap[i].len : split;
    OPTIMISTIC_BEGIN();
    if (h > 0)
      memcpy(heads[i], snap[i].src, h);
    memcpy(bufs[i], snap[i].src + h, (size_t)snap[i].len - h);
    OPTIMISTIC_END();
    /* Seqlock check: the copy above must complete before the generation
     * is read again. */
#ifdef ENCACHE_TSAN
    uint64_t gen = __atomic_load_n(&snap[i].e->gen, __ATOMIC_ACQUIRE);
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t gen = __atomic_load_n(&snap[i].e->gen, __ATOMIC_RELAXED);
#endif
    results[i] = gen == snap[i].gen ? (int64_t)snap[i].len : ENCACHE_ENOENT;
  }
out:
  if (snap != local)
    encache__free(snap);
  return rc;
}

static int shm_read(encache_store *st, const char *const *keys, size_t n,
                    void *const *bufs, const size_t *caps, int64_t *results) {
  return read_common(st, keys, n, 0, NULL, bufs, caps, results);
}

static int shm_read_split(encache_store *st, const char *const *keys,
                          size_t n, size_t split, void *const *heads,
                          void *const *bufs, const size_t *caps,
                          int64_t *results) {
  return read_common(st, keys, n, split, heads, bufs, caps, results);
}

static int shm_object_size(encache_store *st, const char *key,
                           uint64_t *len) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  int rc = key_ok(s, key, &klen);
  if (rc < 0 || (rc = shm_lock(s)) < 0)
    return rc;
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash_key(key, klen));
  if (e != NULL && e->state == E_READY)
    *len = e->obj_len;
  else
    rc = ENCACHE_ENOENT;
  shm_unlock(s);
  return rc;
}

/* ----------------------------------------------------------------- writes */

/* The position where a record of rec bytes would start at the head: the
 * head itself, or the start of the ring when the record would wrap. */
static uint64_t head_start(shm_store *s, uint64_t rec) {
  uint64_t head = s->h->head, off = head % s->data_size;
  return off + rec <= s->data_size ? head : head + (s->data_size - off);
}

/* Moves the oldest record e to the head if it fits there once it is gone
 * from the tail.  Returns 1 when moved, 0 when the caller should evict. */
static int reinsert_oldest(shm_store *s, shm_entry *e) {
  uint64_t rec = rec_size(e->key_len, e->obj_len);
  uint64_t dst = head_start(s, rec);
  shm_entry *next = ent(s, e->fnext);
  if (next != NULL && dst + rec > next->pos + s->data_size)
    return 0;
  /* MOVING first: if we die mid-copy, repair drops the entry rather than
   * trusting a half-moved record. */
  e->state = E_MOVING;
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  memmove(rec_at(s, dst), rec_at(s, e->pos), rec);
  fifo_unlink(s, e);
  e->pos = dst;
  s->h->head = dst + rec;
  fifo_append(s, e);
  e->state = E_READY;
  s->h->reinsertions++;
  return 1;
}

/* Frees the oldest record, or gives it a second chance.  Returns 0, or
 * ENCACHE_EUNAVAIL when the oldest is still being written. */
static int drop_oldest(shm_store *s, uint64_t *budget) {
  shm_entry *o = ent(s, s->h->fifo_first);
  if (o->state == E_WRITING && owner_alive(s, o))
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: full, and its oldest object is still "
                               "being written", s->base.url);
  uint64_t rec = rec_size(o->key_len, o->obj_len);
  if (o->state == E_READY && __atomic_load_n(&o->referenced, __ATOMIC_RELAXED) &&
      rec <= s->data_size / 16 && rec <= *budget && reinsert_oldest(s, o)) {
    *budget -= rec;
    return 0;
  }
  if (o->state == E_READY)
    s->h->evictions++;
  entry_free(s, o);
  return 0;
}

/* Makes room for a record of rec bytes and a free entry; returns the
 * record's position in *pos. */
static int make_room(shm_store *s, uint64_t rec, uint64_t *pos) {
  uint64_t budget = 2 * rec + 65536;
  for (uint64_t steps = 0;; steps++) {
    if (steps > 4 * (uint64_t)s->nentries + 16)
      return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                 "%s: could not make room", s->base.url);
    shm_entry *oldest = ent(s, s->h->fifo_first);
    if ((s->h->fifo_first != 0 &&
         (oldest == NULL || oldest->state == E_FREE || !entry_sane(s, oldest))) ||
        (s->h->free_first != 0 && ent(s, s->h->free_first) == NULL) ||
        (s->h->free_first != 0 && ent(s, s->h->free_first)->state != E_FREE)) {
      repair(s); /* the lists do not validate: rebuild them */
      continue;
    }
    uint64_t start = head_start(s, rec);
    if (oldest == NULL) {
      if (s->h->free_first == 0)
        return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                   "%s: no free entry", s->base.url);
      *pos = start;
      return 0;
    }
    if (s->h->free_first != 0 && start + rec <= oldest->pos + s->data_size) {
      *pos = start;
      return 0;
    }
    int rc = drop_oldest(s, &budget);
    if (rc < 0)
      return rc;
  }
}

static int shm_write(encache_store *st, const char *key, const void *hdr,
                     size_t hdr_len, const void *payload, size_t len) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  int rc = key_ok(s, key, &klen);
  if (rc < 0)
    return rc;
  uint64_t obj_len = (uint64_t)hdr_len + len;
  if (obj_len > s->data_size ||
      rec_size(klen, obj_len) > s->data_size)
    return encache__store_fail(st, ENCACHE_ETOOLARGE,
                               "%s: object of %" PRIu64 " bytes does not fit "
                               "the %" PRIu64 "-byte segment",
                               s->base.url, obj_len, s->data_size);
  uint64_t hash = hash_key(key, klen), rec = rec_size(klen, obj_len), pos = 0;
  if (s->h == NULL)
    return shm_lock(s); /* used after fork(): says so */
  if (s->slot < 0)
    return encache__store_fail(st, ENCACHE_EUNAVAIL,
                               "%s: all %u writer slots are taken: close some "
                               "handles", s->base.url, s->nslots);
  if ((rc = shm_lock(s)) < 0)
    return rc;
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash);
  if (e != NULL) {
    if (e->state != E_WRITING || owner_alive(s, e)) {
      shm_unlock(s);
      return encache__store_fail(st, ENCACHE_EEXIST, "%s: key exists",
                                 s->base.url);
    }
    entry_free(s, e); /* its writer died */
  }
  if ((rc = make_room(s, rec, &pos)) < 0) {
    shm_unlock(s);
    return rc;
  }
  e = ent(s, s->h->free_first);
  s->h->free_first = e->hnext;
  e->state = E_WRITING;
  e->hash = hash;
  e->key_len = (uint32_t)klen;
  e->obj_len = obj_len;
  e->pos = pos;
  e->owner_slot = (uint32_t)s->slot;
  e->owner_token = s->token;
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  s->h->head = pos + rec;
  memcpy(rec_at(s, pos), key, klen);
  fifo_append(s, e);
  chain_insert(s, e);
  s->h->nobjects++;
  s->h->bytes_used += rec;
  uint64_t gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
  unsigned char *dst = obj_at(s, e);
  shm_unlock(s);

  if (encache__shm_write_hook != NULL)
    encache__shm_write_hook();
  /* The copy, outside the lock: nobody reads or reuses a WRITING record
   * while its writer lives. */
  if (hdr_len > 0)
    memcpy(dst, hdr, hdr_len);
  if (len > 0)
    memcpy(dst + hdr_len, payload, len);

  if ((rc = shm_lock(s)) < 0) {
    /* The copy is complete but cannot be published now.  Left WRITING it
     * would block its key, and the whole ring once it reaches the tail,
     * for as long as this handle lives: publish it at the handle's next
     * successful lock (or at close), or, with no room to remember it,
     * leave it to be reclaimed when the handle closes. */
    pthread_mutex_lock(&s->pmu);
    if (s->npending < (int)(sizeof(s->pending) / sizeof(s->pending[0]))) {
      s->pending[s->npending].e = e;
      s->pending[s->npending].gen = gen;
      __atomic_store_n(&s->npending, s->npending + 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->pmu);
    return rc;
  }
  if (publish_record(s, e, gen) < 0)
    rc = encache__store_fail(st, ENCACHE_EUNAVAIL,
                             "%s: the object was reclaimed while being "
                             "written", s->base.url);
  shm_unlock(s);
  return rc;
}

static int shm_remove(encache_store *st, const char *key) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  int rc = key_ok(s, key, &klen);
  if (rc < 0 || (rc = shm_lock(s)) < 0)
    return rc;
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash_key(key, klen));
  if (e != NULL && e->state == E_READY)
    entry_free(s, e);
  else
    rc = encache__store_fail(st, ENCACHE_ENOENT, "%s: no such key",
                             s->base.url);
  shm_unlock(s);
  return rc;
}

typedef struct list_item {
  char *key;
  uint64_t len;
} list_item;

static int shm_list(encache_store *st, const char *pattern,
                    int (*cb)(const char *key, uint64_t len, void *arg),
                    void *arg) {
  shm_store *s = (shm_store *)st;
  int rc = shm_lock(s);
  if (rc < 0)
    return rc;
  if (!structure_ok(s))
    repair(s);
  /* Copy the matching keys out first: callbacks run without the lock. */
  list_item *items = encache__calloc(s->h->nobjects + 1u, sizeof(*items));
  size_t n = 0;
  for (uint32_t i = s->h->fifo_first; items != NULL && i != 0;
       i = s->entries[i - 1].fnext) {
    shm_entry *e = &s->entries[i - 1];
    if (e->state != E_READY)
      continue;
    char *k = encache__malloc(e->key_len + 1u);
    if (k == NULL) {
      rc = ENCACHE_ENOMEM;
      break;
    }
    memcpy(k, rec_at(s, e->pos), e->key_len);
    k[e->key_len] = '\0';
    if (pattern != NULL && fnmatch(pattern, k, 0) != 0) {
      encache__free(k);
      continue;
    }
    items[n].key = k;
    items[n++].len = e->obj_len;
  }
  shm_unlock(s);
  if (items == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (rc == 0)
      rc = cb(items[i].key, items[i].len, arg);
    encache__free(items[i].key);
  }
  encache__free(items);
  return rc;
}

static int shm_stats(encache_store *st, encache_store_stats *out) {
  shm_store *s = (shm_store *)st;
  int rc = shm_lock(s);
  if (rc < 0)
    return rc;
  out->objects = s->h->nobjects;
  out->bytes_used = s->h->bytes_used;
  out->capacity = s->data_size;
  out->evictions = s->h->evictions;
  out->reinsertions = s->h->reinsertions;
  out->repairs = s->h->repairs;
  shm_unlock(s);
  return 0;
}

/*
 * The process's open handles.  A child made by fork() shares each
 * handle's open file description (through the descriptor and through the
 * mapping), and with it the writer-slot lock: a parent killed mid-write
 * would look alive for as long as its children live.  So the child drops
 * both at once (the lock stays with the parent's); in the child the
 * handles answer EINVAL until closed.
 */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static shm_store *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void reg_prepare(void) { pthread_mutex_lock(&reg_mu); }
static void reg_parent(void) { pthread_mutex_unlock(&reg_mu); }
static void reg_child(void) {
  for (shm_store *s = reg_head; s != NULL; s = s->reg_next) {
    if (s->map != NULL)
      munmap(s->map, s->map_size);
    if (s->fd >= 0)
      close(s->fd);
    s->map = NULL;
    s->h = NULL;
    s->fd = -1;
    s->slot = -1;
  }
  pthread_mutex_unlock(&reg_mu);
}
static void reg_init(void) {
  pthread_atfork(reg_prepare, reg_parent, reg_child);
}

static void reg_add(shm_store *s) {
  pthread_once(&reg_once, reg_init);
  pthread_mutex_lock(&reg_mu);
  s->reg_next = reg_head;
  reg_head = s;
  pthread_mutex_unlock(&reg_mu);
}

static void reg_remove(shm_store *s) {
  pthread_mutex_lock(&reg_mu);
  for (shm_store **p = &reg_head; *p != NULL; p = &(*p)->reg_next)
    if (*p == s) {
      *p = s->reg_next;
      break;
    }
  pthread_mutex_unlock(&reg_mu);
}

static void shm_close(encache_store *st) {
  shm_store *s = (shm_store *)st;
  reg_remove(s);
  if (s->map != NULL && s->npending > 0 && shm_lock(s) == 0)
    shm_unlock(s); /* publishes what a timeout left pending */
  if (s->map != NULL && s->slot >= 0)
    /* Our token goes first, so that no one takes our records for alive
     * in the moment between the next holder's lock and its token. */
    __atomic_store_n(&s->tokens[s->slot], 0, __ATOMIC_RELEASE);
  if (s->map != NULL)
    munmap(s->map, s->map_size);
  if (s->fd >= 0)
    close(s->fd);
  pthread_mutex_destroy(&s->pmu);
  encache__free(s->base.url);
  encache__free(s);
}

static const encache__store_ops shm_ops = {
    .kind = "shm",
    .exists = shm_exists,
    .read = shm_read,
    .read_split = shm_read_split,
    .object_size = shm_object_size,
    .write = shm_write,
    .remove = shm_remove,
    .list = shm_list,
    .stats = shm_stats,
    .close = shm_close};

/* ------------------------------------------------------ create and attach */

/* Lays out a fresh segment of total bytes: geometry, an initialised robust
 * process-shared mutex, empty lists.  The magic goes last. */
static int segment_init(shm_store *s, uint64_t total) {
  shm_header *h = (shm_header *)s->map;
  memset(h, 0, sizeof(*h));
  uint64_t nent = total / 2048;
  if (nent < 256)
    nent = 256;
  if (nent > (1u << 24))
    nent = 1u << 24;
  uint64_t nb = 1;
  while (nb < nent)
    nb <<= 1;
  h->total_size = total;
  h->nentries = (uint32_t)nent;
  h->nbuckets = (uint32_t)nb;
  h->entries_off = align_up(sizeof(shm_header), SHM_PAGE);
  h->buckets_off = h->entries_off + nent * sizeof(shm_entry);
  h->slots_off = align_up(h->buckets_off + nb * sizeof(uint32_t), 64);
  h->nslots = SHM_SLOTS;
  h->data_off = align_up(h->slots_off + SHM_SLOTS * sizeof(uint64_t), SHM_PAGE);
  if (h->data_off + (64u << 10) > total)
    return encache__store_fail(&s->base, ENCACHE_EINVAL,
                               "%s: size %" PRIu64 " is too small",
                               s->base.url, total);
  h->data_size = total - h->data_off;

  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&h->lock, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0)
    return encache__store_fail(&s->base, -rc, "%s: mutex init: %s",
                               s->base.url, strerror(rc));
  shm_entry *entries = (shm_entry *)(s->map + h->entries_off);
  memset(entries, 0, nent * sizeof(shm_entry));
  for (uint32_t i = 0; i < nent; i++)
    entries[i].hnext = i + 2 <= nent ? i + 2 : 0;
  h->free_first = 1;
  memset(s->map + h->buckets_off, 0, nb * sizeof(uint32_t));
  memset(s->map + h->slots_off, 0, SHM_SLOTS * sizeof(uint64_t));
  h->format = SHM_FORMAT;
  __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
  return 0;
}

/* Validates an existing segment's header before anything else is used. */
static int segment_check(shm_store *s, uint64_t file_size) {
  const shm_header *h = (const shm_header *)s->map;
  const char *u = s->base.url;
  if (h->magic != SHM_MAGIC)
    return encache__store_fail(&s->base, ENCACHE_EFORMAT,
                               "%s: not an encache segment (bad magic "
                               "0x%016" PRIx64 ")", u, h->magic);
  if (h->format != SHM_FORMAT)
    return encache__store_fail(
        &s->base, ENCACHE_EFORMAT,
        "%s: segment format 0x%016" PRIx64 " (layout version %u), this "
        "library uses 0x%016" PRIx64 " (version %u): destroy the segment or "
        "use a matching encache",
        u, h->format, (unsigned)(h->format >> 56), (uint64_t)SHM_FORMAT,
        SHM_VERSION);
  uint64_t nb = h->nbuckets, ne = h->nentries;
  if (h->total_size != file_size || ne < 1 || ne > (1u << 24) || nb < ne ||
      (nb & (nb - 1)) != 0 ||
      h->entries_off != align_up(sizeof(shm_header), SHM_PAGE) ||
      h->buckets_off != h->entries_off + ne * sizeof(shm_entry) ||
      h->slots_off != align_up(h->buckets_off + nb * sizeof(uint32_t), 64) ||
      h->nslots != SHM_SLOTS ||
      h->data_off != align_up(h->slots_off + SHM_SLOTS * sizeof(uint64_t),
                              SHM_PAGE) ||
      h->data_off >= file_size || h->data_size != file_size - h->data_off)
    return encache__store_fail(&s->base, ENCACHE_EFORMAT,
                               "%s: corrupted segment header (geometry does "
                               "not match a %" PRIu64 "-byte segment)",
                               u, file_size);
  return 0;
}

static void bind_geometry(shm_store *s) {
  s->h = (shm_header *)s->map;
  s->entries = (shm_entry *)(s->map + s->h->entries_off);
  s->buckets = (uint32_t *)(s->map + s->h->buckets_off);
  s->data = s->map + s->h->data_off;
  s->data_size = s->h->data_size;
  s->nentries = s->h->nentries;
  s->nbuckets = s->h->nbuckets;
  s->tokens = (uint64_t *)(s->map + s->h->slots_off);
  s->nslots = s->h->nslots;
}

static int shm_alloc(const char *url, encache_store **out, shm_store **sp) {
  shm_store *s = encache__calloc(1, sizeof(*s));
  if (s == NULL)
    return ENCACHE_ENOMEM;
  s->base.ops = &shm_ops;
  s->fd = -1;
  s->lock_timeout_ms = 5000;
  s->slot = -1;
  pthread_mutex_init(&s->pmu, NULL);
  if ((s->base.url = encache__strdup(url)) == NULL) {
    pthread_mutex_destroy(&s->pmu);
    encache__free(s);
    return ENCACHE_ENOMEM;
  }
  reg_add(s);
  *out = &s->base;
  *sp = s;
  return 0;
}

/* Maps fd (already open on the segment), creating the segment when it is
 * empty or was never finished, else validating it. */
static int shm_attach(shm_store *s, uint64_t create_size) {
  struct stat sb;
  int rc = 0, fresh = 0;
  if (flock(s->fd, LOCK_EX) != 0)
    return encache__store_fail(&s->base, -errno, "%s: flock: %s",
                               s->base.url, strerror(errno));
  if (fstat(s->fd, &sb) != 0) {
    rc = encache__store_fail(&s->base, -errno, "%s: fstat: %s", s->base.url,
                             strerror(errno));
    goto out;
  }
  uint64_t size = (uint64_t)sb.st_size;
  fresh = size == 0;
  if (!fresh && size >= sizeof(shm_header)) {
    /* A segment whose creator died before writing the magic is remade. */
    uint64_t magic = 0;
    if (pread(s->fd, &magic, sizeof(magic), 0) == (ssize_t)sizeof(magic) &&
        magic == 0)
      fresh = 1;
  }
  if (fresh) {
    size = align_up(create_size, SHM_PAGE);
    if (ftruncate(s->fd, (off_t)size) != 0) {
      rc = encache__store_fail(&s->base, -errno, "%s: ftruncate: %s",
                               s->base.url, strerror(errno));
      goto out;
    }
    /* Reserve the memory now: a full /dev/shm must fail here, cleanly,
     * not with SIGBUS on some later write. */
    int fr = posix_fallocate(s->fd, 0, (off_t)size);
    if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) {
      rc = encache__store_fail(&s->base, -fr,
                               "%s: cannot reserve %" PRIu64 " bytes: %s",
                               s->base.url, size, strerror(fr));
      if (ftruncate(s->fd, 0) != 0) { /* leave it empty, to be remade */
      }
      goto out;
    }
  } else if (size < sizeof(shm_header)) {
    rc = encache__store_fail(&s->base, ENCACHE_EFORMAT,
                             "%s: %" PRIu64 " bytes: too short to be an "
                             "encache segment", s->base.url, size);
    goto out;
  }
  if (size > SIZE_MAX) {
    rc = encache__store_fail(&s->base, ENCACHE_EFORMAT, "%s: too large",
                             s->base.url);
    goto out;
  }
  /* Populate the page tables now: first-touch faults would otherwise
   * cost every early write of a large segment about as much as its copy.
   * Small segments (tests, the fuzzer) are cheaper to fault in lazily. */
  int populate = size >= (64ull << 20) ? MAP_POPULATE : 0;
  void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | populate, s->fd, 0);
  if (map == MAP_FAILED) {
    rc = encache__store_fail(&s->base, -errno, "%s: mmap: %s", s->base.url,
                             strerror(errno));
    goto out;
  }
  s->map = map;
  s->map_size = (size_t)size;
  rc = fresh ? segment_init(s, size) : segment_check(s, size);
  if (rc == 0) {
    bind_geometry(s);
    take_slot(s);
  }
out:
  flock(s->fd, LOCK_UN);
  if (rc == 0 && !fresh) {
    /* Validate the mutable structure once per open; repair what does not
     * hold (a corrupted index is repaired, never trusted). */
    if ((rc = shm_lock(s)) == 0) {
      if (!structure_ok(s))
        repair(s);
      shm_unlock(s);
    }
  }
  return rc;
}

int encache__shm_open_fd(int fd, const char *label, uint64_t create_size,
                         encache_store **out) {
  shm_store *s;
  if (out == NULL)
    return ENCACHE_EINVAL;
  *out = NULL;
  int rc = shm_alloc(label, out, &s);
  if (rc < 0)
    return rc;
  s->lock_timeout_ms = 1000;
  if ((s->fd = dup(fd)) < 0)
    return encache__store_fail(&s->base, -errno, "dup: %s", strerror(errno));
  return shm_attach(s, create_size < SHM_MIN_SIZE ? SHM_MIN_SIZE : create_size);
}

static int name_ok(const char *name, size_t len) {
  if (len == 0 || len > SHM_MAX_NAME)
    return 0;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
      return 0;
  }
  return name[0] != '.';
}

int encache__shm_open(const char *url, encache_store **out) {
  shm_store *s;
  *out = NULL;
  int rc = shm_alloc(url, out, &s);
  if (rc < 0)
    return rc;
  const char *name = url + 6, *q = strchr(name, '?');
  size_t nlen = q ? (size_t)(q - name) : strlen(name);
  if (!name_ok(name, nlen))
    return encache__store_fail(&s->base, ENCACHE_EURL,
                               "%s: the segment name must be 1 to %d of "
                               "A-Z a-z 0-9 . _ - (not starting with '.')",
                               url, SHM_MAX_NAME);
  uint64_t size = SHM_DEFAULT_SIZE;
  encache__query qs = {q ? q + 1 : NULL};
  char k[64], v[64];
  while ((rc = encache__query_next(&qs, k, sizeof(k), v, sizeof(v))) > 0) {
    if (strcmp(k, "size") == 0) {
      if (encache_parse_size(v, &size) < 0 || size < SHM_MIN_SIZE ||
          size > (1ull << 46))
        return encache__store_fail(&s->base, ENCACHE_EURL,
                                   "%s: size=%s: must be a size from 1MiB to "
                                   "64TiB (e.g. 4GiB, 512MB)", url, v);
    } else if (strcmp(k, "lock_timeout_ms") == 0) {
      char *end;
      unsigned long ms = strtoul(v, &end, 10);
      if (end == v || *end != '\0' || ms == 0 || ms > 3600000)
        return encache__store_fail(&s->base, ENCACHE_EURL,
                                   "%s: lock_timeout_ms=%s: must be 1 to "
                                   "3600000", url, v);
      s->lock_timeout_ms = (unsigned)ms;
    } else {
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: unknown option '%s' (known: size, "
                                 "lock_timeout_ms)", url, k);
    }
  }
  if (rc < 0)
    return encache__store_fail(&s->base, ENCACHE_EURL,
                               "%s: malformed query (use ?key=value&...)", url);
  char path[SHM_MAX_NAME + 16];
  snprintf(path, sizeof(path), "/encache-%.*s", (int)nlen, name);
  s->fd = shm_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->fd < 0)
    return encache__store_fail(&s->base, -errno, "%s: shm_open %s: %s", url,
                               path, strerror(errno));
  return shm_attach(s, size);
}

int encache_shm_destroy(const char *name) {
  if (name == NULL || !name_ok(name, strlen(name)))
    return ENCACHE_EURL;
  char path[SHM_MAX_NAME + 16];
  snprintf(path, sizeof(path), "/encache-%s", name);
  if (shm_unlink(path) != 0)
    return errno == ENOENT ? ENCACHE_ENOENT : -errno;
  return 0;
}
