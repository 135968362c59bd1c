/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm.h: what the files of the embedded shared-memory Store (URL
 * shm://NAME?size=SIZE) share, and nothing else includes: the layout of
 * the segment, the handle, and the functions one file offers the others.
 *
 * Every process on a host that opens NAME maps one POSIX shared-memory
 * segment (/dev/shm/encache-NAME).  The segment outlives the processes
 * until it is destroyed.
 *
 * Layout (all offsets from the start of the segment; segment.c holds the
 * formula, layout(), and nothing else computes them):
 *
 *   0            shm_header: magic, format word, geometry (immutable after
 *                creation), the robust process-shared mutex, and the
 *                mutable state it protects (ring head, lists, counters)
 *   entries_off  nentries x shm_entry: one per object
 *   buckets_off  nbuckets x u32: hash chains of entries (index + 1)
 *   slots_off    nslots x u64: the token of each writer slot's holder
 *   leases_off   nleases x shm_lease: the single-flight leases, an open
 *                hash table by key (lease.c); never objects
 *   data_off     data_size bytes: a ring of records, one per object:
 *                the key, padding to 64 bytes, then the object bytes
 *                (rec_obj_off() and rec_size() below)
 *   total_size   past the end of the file: one byte per writer slot, for
 *                its holder's lock (slot_range() in repair.c)
 *
 * Concurrency.  All structure (entries, chains, lists, ring head,
 * counters) changes under the one robust mutex.  Data does not:
 *   - A writer allocates its record and an entry in state WRITING under
 *     the lock, copies the object outside it, and publishes the entry
 *     (READY) under the lock again.  Readers never see a WRITING entry,
 *     so they never see a partial object.  A WRITING entry's space is
 *     not reused while its writer lives (the writer's handle holds an
 *     open-file-description lock on a slot byte, see repair.c); a dead
 *     writer's entry is reclaimed by whoever finds it.
 *   - A reader looks its keys up under the lock, noting each entry's
 *     generation, and copies outside it.  Every event that ends a record's
 *     validity (eviction, removal, reinsertion, repair) increments the
 *     entry's generation under the lock before the space can be reused;
 *     after copying, the reader checks the generation and reports a miss
 *     when it changed.  So a reader never returns bytes of an object that
 *     was evicted or replaced while it was being read (a seqlock).
 *
 * Damage.  The segment is shared writable memory: a bug in any attached
 * process can change any byte.  So nothing read from it is trusted where
 * it is used.  The geometry is kept in the handle (private) once checked
 * at attach; an entry is read once into a private copy, and the copy must
 * pass its check word (a hash of the fields that only the lock changes,
 * and of the entry's own index) and the range checks before any of it is
 * used; the ring head is checked against the newest and oldest records
 * before an allocation; repair reads shared memory only through such
 * copies and sorts in private memory; and each object carries a checksum
 * of its bytes, computed while they are copied in and verified on the
 * bytes copied out (`checksum=off` turns both off: docs/stores.md has the
 * cost).  Damage that is found is repaired or refused (a miss), never
 * served.  A damaged lock or identity (magic, format) is refused with a
 * message that says to destroy the segment.
 *
 * The files, one concern each:
 *   segment.c   the layout formula, creation and attach, format checks
 *   index.c     entries and their check word, hash chains, the FIFO list,
 *               lookups
 *   ring.c      allocation in the data ring, eviction, second chance
 *   lock.c      the segment lock, stalls, publications left pending
 *   repair.c    writer liveness (slots), the structure check, repair,
 *               the lookup that repairs a corrupt chain
 *   lease.c     single-flight leases: their table, taking and dropping
 *   checksum.c  object checksums, computed inside the copies
 *   ops.c       the Store operations and their table, the handle's
 *               life (allocation, the fork registry, close)
 *   open.c      URL and options, opening, destroying
 */
#ifndef ENCACHE_SHM_H
#define ENCACHE_SHM_H

#include "../base.h"
#include "testing.h"
#include "sum.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

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

/* A release fence before data stores that must not be seen ahead of an
 * earlier generation change (weakly ordered CPUs).  ThreadSanitizer does
 * not support fences (and has no such CPU to model). */
#ifdef ENCACHE_TSAN
#define RELEASE_FENCE() ((void)0)
#else
#define RELEASE_FENCE() __atomic_thread_fence(__ATOMIC_RELEASE)
#endif

#define SHM_MAGIC 0x314d48534e434e45ull      /* "ENCNSHM1" */
#define SHM_INIT_MAGIC 0x54494e494e434e45ull /* "ENCNINIT": being created */
#define SHM_VERSION 5u /* 4: the lease table (lease.c); 5: purge_epoch */
#define REC_ALIGN 64u
#define SHM_MAX_KEY (64u * 1024u)
#define SHM_MAX_NAME 200
#define SHM_PAGE 4096u
#define SHM_SLOTS 4096u /* handles that can write at once */

/* The end of the operator's way out, for messages about damage. */
#define DESTROY_HINT                                                         \
  "destroy it (encache shm destroy %s) once no process uses it"

enum entry_state { E_FREE = 0, E_WRITING = 1, E_READY = 2, E_MOVING = 3 };
enum entry_flags { F_SUMMED = 1 }; /* `sum` holds the object's checksum */

/* One object.  Invariants (under the lock): a non-FREE entry's record lies
 * within [tail, head) of the ring and inside the data region; READY and
 * WRITING entries are on their hash chain and on the FIFO list in
 * position order; FREE entries are on the free list (through hnext);
 * `check` is encache__shm_entry_check() of the entry as the lock last
 * left it (the list links, `gen` and `referenced` are not covered: links
 * are checked by range and by walking, gen and referenced only ever make
 * a miss).
 * `gen` and `referenced` are also touched without the lock (atomically). */
typedef struct shm_entry {
  uint64_t gen;         /* bumped whenever the record stops being valid */
  uint64_t hash;        /* of the key */
  uint64_t pos;         /* ring position of the record */
  uint64_t obj_len;     /* object bytes (after the key) */
  uint64_t owner_token; /* WRITING: the writer's handle token */
  uint64_t sum;         /* READY with F_SUMMED: checksum of the object */
  uint32_t key_len;
  uint32_t state;
  uint32_t hnext;       /* hash chain / free list: index + 1, 0 = end */
  uint32_t fprev, fnext;/* FIFO (ring order) list: index + 1 */
  uint32_t owner_slot;  /* WRITING: the writer's handle slot */
  uint32_t referenced;  /* set by readers: earns a second chance */
  uint32_t flags;       /* entry_flags */
  uint32_t check;       /* encache__shm_entry_check() */
  uint32_t pad_;
} shm_entry;

/* One single-flight lease (lease.c): the lease of the key whose two
 * hashes and length these are, held by `token` until deadline_ms
 * (CLOCK_MONOTONIC) while the handle of writer slot owner_slot, token
 * owner_token, lives.  token 0: free.  `check` is lease_check() of the
 * rest (a lease that fails it is free: damage costs a duplicate encode,
 * never a wrong hit).  Only the lock reads or writes a lease. */
typedef struct shm_lease {
  uint64_t hash;        /* hash_key() of the key */
  uint64_t hash2;       /* a second, independent hash of the key */
  uint64_t token;       /* the holder's token; 0 = free */
  uint64_t deadline_ms; /* mono_ms() at which the lease ends */
  uint64_t owner_token; /* the holding handle's slot token */
  uint32_t owner_slot;  /* the holding handle's writer slot */
  uint32_t key_len;
  uint32_t check;
  uint32_t pad_[3];
} shm_lease;

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
  uint32_t nleases;    /* a power of two */
  uint64_t leases_off; /* nleases x shm_lease */
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
  uint32_t dirty; /* a repair is owed (one could not finish) */
  /* Changed without the lock, by atomic increments only: the removals
   * made through a tier on this segment (tier.c bumps it after each
   * removal from its remote tier, before its removal from this one).  A
   * write made for an earlier epoch (a promotion, read from the remote
   * before such a removal) is refused when it is published
   * (ENCACHE__CONTROL_WRITE_AT_EPOCH, base.h), so that no process of the
   * host brings a removed object back.  Damage to it costs refused promotions,
   * never a wrong hit.  On its own cache line: it is read by every
   * remote lookup of a tier and written by removals only. */
  _Alignas(64) uint64_t purge_epoch;
} shm_header;

/* Every process that maps a segment reads these structs at these offsets:
 * a change to either is a new layout version (SHM_VERSION), never a quiet
 * one.  The format word below also carries the sizes, so that a build
 * whose types differ is refused at attach; these checks stop such a build
 * from being made by accident.  (The mutex's own size belongs to the C
 * library: only its bound is checked, the format word records it.) */
#define SHM_FIELD_AT(type, field, off)                                       \
  _Static_assert(offsetof(type, field) == (off),                           \
                 #type "." #field " moved: bump SHM_VERSION")
_Static_assert(sizeof(shm_entry) == 88, "shm_entry size: bump SHM_VERSION");
SHM_FIELD_AT(shm_entry, gen, 0);
SHM_FIELD_AT(shm_entry, hash, 8);
SHM_FIELD_AT(shm_entry, pos, 16);
SHM_FIELD_AT(shm_entry, obj_len, 24);
SHM_FIELD_AT(shm_entry, owner_token, 32);
SHM_FIELD_AT(shm_entry, sum, 40);
SHM_FIELD_AT(shm_entry, key_len, 48);
SHM_FIELD_AT(shm_entry, state, 52);
SHM_FIELD_AT(shm_entry, hnext, 56);
SHM_FIELD_AT(shm_entry, fprev, 60);
SHM_FIELD_AT(shm_entry, fnext, 64);
SHM_FIELD_AT(shm_entry, owner_slot, 68);
SHM_FIELD_AT(shm_entry, referenced, 72);
SHM_FIELD_AT(shm_entry, flags, 76);
SHM_FIELD_AT(shm_entry, check, 80);
_Static_assert(sizeof(shm_lease) == 64, "shm_lease size: bump SHM_VERSION");
SHM_FIELD_AT(shm_lease, hash, 0);
SHM_FIELD_AT(shm_lease, hash2, 8);
SHM_FIELD_AT(shm_lease, token, 16);
SHM_FIELD_AT(shm_lease, deadline_ms, 24);
SHM_FIELD_AT(shm_lease, owner_token, 32);
SHM_FIELD_AT(shm_lease, owner_slot, 40);
SHM_FIELD_AT(shm_lease, key_len, 44);
SHM_FIELD_AT(shm_lease, check, 48);
_Static_assert(sizeof(pthread_mutex_t) <= 64,
               "the segment lock must fit its cache line");
_Static_assert(sizeof(shm_header) == 320, "shm_header size: bump SHM_VERSION");
SHM_FIELD_AT(shm_header, magic, 0);
SHM_FIELD_AT(shm_header, format, 8);
SHM_FIELD_AT(shm_header, total_size, 16);
SHM_FIELD_AT(shm_header, entries_off, 24);
SHM_FIELD_AT(shm_header, buckets_off, 32);
SHM_FIELD_AT(shm_header, data_off, 40);
SHM_FIELD_AT(shm_header, data_size, 48);
SHM_FIELD_AT(shm_header, nentries, 56);
SHM_FIELD_AT(shm_header, nbuckets, 60);
SHM_FIELD_AT(shm_header, slots_off, 64);
SHM_FIELD_AT(shm_header, nslots, 72);
SHM_FIELD_AT(shm_header, nleases, 76);
SHM_FIELD_AT(shm_header, leases_off, 80);
SHM_FIELD_AT(shm_header, lock, 128);
SHM_FIELD_AT(shm_header, head, 192);
SHM_FIELD_AT(shm_header, fifo_first, 200);
SHM_FIELD_AT(shm_header, fifo_last, 204);
SHM_FIELD_AT(shm_header, free_first, 208);
SHM_FIELD_AT(shm_header, nobjects, 212);
SHM_FIELD_AT(shm_header, bytes_used, 216);
SHM_FIELD_AT(shm_header, evictions, 224);
SHM_FIELD_AT(shm_header, reinsertions, 232);
SHM_FIELD_AT(shm_header, repairs, 240);
SHM_FIELD_AT(shm_header, dirty, 248);
SHM_FIELD_AT(shm_header, purge_epoch, 256);
/* The slot tokens and the hash buckets: arrays of these, shared. */
_Static_assert(sizeof(uint64_t) == 8 && sizeof(uint32_t) == 4,
               "slot tokens are u64, buckets u32");

/* The format word: the layout version and the sizes of the shared types. */
#define SHM_FORMAT                                                           \
  (((uint64_t)SHM_VERSION << 56) | ((uint64_t)sizeof(shm_header) << 40) |    \
   ((uint64_t)sizeof(shm_entry) << 24) |                                     \
   ((uint64_t)sizeof(pthread_mutex_t) << 8) | (uint64_t)sizeof(void *))

/* A record this handle copied, to be published: at once, or later when
 * the lock timed out.  at_epoch: published only while the segment's
 * purge_epoch is still `epoch` (else freed: encache__shm_publish()). */
typedef struct shm_pending {
  shm_entry *e;
  uint64_t gen, sum;
  uint32_t flags;
  int at_epoch;
  uint64_t epoch;
} shm_pending;

typedef struct shm_store {
  encache_store base;
  int fd;
  unsigned char *map;
  size_t map_size;
  uint64_t total_size; /* private copies of the checked geometry */
  char name[SHM_MAX_NAME + 1]; /* for messages */
  shm_header *h;
  shm_entry *entries;
  uint32_t *buckets;
  unsigned char *data;
  uint64_t data_size;
  uint32_t nentries, nbuckets, nslots;
  uint64_t *tokens;
  shm_lease *leases;
  uint32_t nleases;
  unsigned lock_timeout_ms;
  /* Who may share the segment: its group (the URL's group=; -1: nobody
   * but this uid) and the mode a new segment's file gets (open.c). */
  long share_gid;
  unsigned create_mode;
  /* This open made the segment's file (O_CREAT | O_EXCL): if it cannot
   * give it to the group, it removes it (owner.c). */
  int created;
  int checksum;         /* compute and verify object checksums */
  int validate_pending; /* check the structure at the next lock */
  uint64_t stalled_until_ms; /* after a lock timeout: wait briefly */
  unsigned stalls;           /* lock timeouts in a row */
  int slot;       /* this handle's writer slot, -1 = none */
  uint64_t token; /* this handle's token, in tokens[slot] */
  /* Records this handle copied but could not publish (the lock timed
   * out): published at its next successful lock, or at close. */
  pthread_mutex_t pmu;
  shm_pending pending[8];
  int npending;
  struct shm_store *reg_next; /* the process's open handles (fork) */
} shm_store;

/* A streaming object checksum (checksum.c): sum_state, in sum.h. */

/* ------------------------------------------------ small shared helpers */

static inline uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

/* A record: the key, padded to REC_ALIGN, then the object, padded. */
static inline uint64_t rec_obj_off(uint64_t key_len) {
  return align_up(key_len, REC_ALIGN);
}

static inline uint64_t rec_size(uint64_t key_len, uint64_t obj_len) {
  return align_up(rec_obj_off(key_len) + obj_len, REC_ALIGN);
}

static inline unsigned char *rec_at(shm_store *s, uint64_t pos) {
  return s->data + pos % s->data_size;
}

static inline unsigned char *obj_at(shm_store *s, const shm_entry *e) {
  return rec_at(s, e->pos) + rec_obj_off(e->key_len);
}

/* The entry with index+1 `i`, or NULL when i is 0 or out of range. */
static inline shm_entry *ent(shm_store *s, uint32_t i) {
  return i == 0 || i > s->nentries ? NULL : &s->entries[i - 1];
}

static inline uint32_t ent_id(shm_store *s, const shm_entry *e) {
  return (uint32_t)(e - s->entries) + 1;
}

/* A check word: words w[0..n) mixed in turn after seed ^ id. */
static inline uint32_t check_words(uint64_t seed, uint32_t id,
                                   const uint64_t *w, size_t n) {
  uint64_t h = mix64(seed ^ id);
  for (size_t i = 0; i < n; i++)
    h = mix64(h ^ w[i]);
  return (uint32_t)(h ^ h >> 32);
}

static inline uint64_t hash_key(const char *key, size_t len) {
  /* FNV-1a, then a finalizer so that the low bits (the bucket) mix well. */
  uint64_t h = encache__fnv1a(key, len);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

static inline uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ------------------------------------------- segment.c: layout, attach */

/* Creates (when empty or unfinished) or checks the segment on s->fd, maps
 * it and binds the handle to its checked geometry. */
int encache__shm_attach(shm_store *s, uint64_t create_size);

/* Whether the header's immutable part still says what attach checked
 * (every lock asks: inline). */
static inline int identity_ok(const shm_store *s) {
  const shm_header *h = s->h;
  return h->magic == SHM_MAGIC && h->format == SHM_FORMAT &&
         h->total_size == s->total_size && h->data_size == s->data_size &&
         h->nentries == s->nentries && h->nbuckets == s->nbuckets &&
         h->nleases == s->nleases;
}

/* ------------------------------------------------- index.c: the entries */

/* The check word of entry id (index + 1). */
uint32_t encache__shm_entry_check(const shm_entry *e, uint32_t id);
/* Writes the covered fields of the private entry n into e, sealed. */
void encache__shm_store_entry(shm_store *s, shm_entry *e, const shm_entry *n);
void encache__shm_store_free(shm_store *s, shm_entry *e);
/* Whether e's record lies within the ring's last lap before head. */
int encache__shm_in_window(shm_store *s, const shm_entry *e, uint64_t head);
/* Copies entry id into *c; 1 when the copy passes its checks. */
int encache__shm_load_entry(shm_store *s, uint32_t id, shm_entry *c,
                            int with_head);
void encache__shm_fifo_unlink(shm_store *s, shm_entry *e);
void encache__shm_fifo_append(shm_store *s, shm_entry *e);
void encache__shm_chain_insert(shm_store *s, shm_entry *e);
/* Ends a live entry (its generation first) and frees it. */
void encache__shm_entry_free(shm_store *s, shm_entry *e);
/* The live entry of key (NULL: none), its checked copy in *c, or NULL
 * with *corrupt set when the chain does not validate. */
shm_entry *encache__shm_find_once(shm_store *s, const char *key,
                                  uint32_t klen, uint64_t hash, shm_entry *c,
                                  int *corrupt);

/* Checks a key's length (returned in *klen); the message says the bounds.
 * (Every key of every operation asks: inline.) */
static inline int key_ok(shm_store *s, const char *key, size_t *klen) {
  *klen = strlen(key);
  if (*klen == 0 || *klen > SHM_MAX_KEY)
    return encache_store_fail(&s->base, ENCACHE_EINVAL,
                              "key length %zu: must be 1 to %u bytes", *klen,
                              SHM_MAX_KEY);
  return 0;
}

/* ----------------------------------------- ring.c: allocation, eviction */

/* Makes room for and allocates a new object's record, WRITING, owned by
 * this handle: its entry in *ep, where its object bytes go in *dst. */
int encache__shm_alloc_record(shm_store *s, const char *key, size_t klen,
                              uint64_t hash, uint64_t obj_len,
                              shm_entry **ep, unsigned char **dst);

/* ------------------------------------------------------ lock.c: the lock */

/* Takes the segment lock (validating, repairing, publishing what is
 * pending); 0, or an error with its message recorded. */
int encache__shm_lock(shm_store *s);
void encache__shm_unlock(shm_store *s);
/* Whether m's kind word is not a robust process-shared mutex's. */
int encache__shm_lock_damaged(pthread_mutex_t *m);
/* Under the lock: READY the record p names, if still this handle's: 0;
 * ENCACHE_ENOENT when it is not (reclaimed); 1 when p is for a purge
 * epoch that has passed (the record is freed instead). */
int encache__shm_publish(shm_store *s, const shm_pending *p);

/* ------------------------------------------- repair.c: liveness, repair */

/* Whether the writer of a WRITING entry (a checked copy) lives. */
int encache__shm_owner_alive(shm_store *s, const shm_entry *e);
/* Whether the handle of writer slot `slot`, slot token `token`, lives. */
int encache__shm_slot_alive(shm_store *s, uint32_t slot, uint64_t token);
/* Takes a writer slot for the handle (s->slot -1: none left). */
void encache__shm_take_slot(shm_store *s);
/* Whether any handle holds a slot of the segment file fd of size bytes. */
int encache__shm_slots_held(int fd, uint64_t size);
/* Under the lock: rebuilds all derived structure from valid entries. */
int encache__shm_repair(shm_store *s);
/* Under the lock: whether every list and chain validates. */
int encache__shm_structure_ok(shm_store *s);
/* The live entry of key (NULL: none), its checked copy in *c, through
 * index.c's lookup; repairs a chain that does not validate and looks
 * again, once. */
shm_entry *encache__shm_find(shm_store *s, const char *key, uint32_t klen,
                             uint64_t hash, shm_entry *c);
/* Checks the header's counters against what the segment's history
 * allows and restarts (0) those that cannot be right, counting a repair
 * (repair.c).  Under the lock. */
void encache__shm_check_counters(shm_store *s);

/* ----------------------------------------------------- lease.c: leases */

int encache__shm_lease_take(encache_store *st, const char *key,
                            uint64_t token, uint32_t ttl_ms);
int encache__shm_lease_drop(encache_store *st, const char *key,
                            uint64_t token);

/* ------------------------------------------------ checksum.c: checksums */

/* encache__shm_sum_final(), encache__shm_copy_sum() and
 * encache__shm_sum_update(): in sum.h (the Redis Store uses them too). */

/* ------------------------------------------------------------- ops.c */

/* The shm handle st is, or NULL when st is another Store's. */
shm_store *encache__shm_handle(encache_store *st);
/* A new handle for url, with the defaults, on the fork registry. */
int encache__shm_alloc(const char *url, encache_store **out, shm_store **sp);

/* owner.c: the URL's group= and mode=, their consistency (after the whole
 * query), the check of an opened segment's file (path: where the file
 * lies, for messages), the message of a file this user may not open
 * (shm_open failed with EACCES: -EACCES), and the group and mode a new
 * segment's file gets (a file this open created is removed when that
 * fails). */
int encache__shm_parse_group(shm_store *s, const char *v);
int encache__shm_parse_mode(shm_store *s, const char *v);
int encache__shm_check_options(shm_store *s);
int encache__shm_check_owner(shm_store *s, const char *path);
int encache__shm_refuse_unopened(shm_store *s, const char *path);
int encache__shm_own_new_file(shm_store *s);

#endif
