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
 * Creation.  The first opener (holding an flock() on the file for the
 * whole of it; others wait for it while it makes progress, within a
 * bound; a finished segment is attached without the flock) writes an "unfinished"
 * magic before it sizes the file, lays the segment out, and writes the
 * real magic last.  An opener that finds a file of size 0 or with the
 * unfinished magic under the flock knows its creator died: it remakes it,
 * unless some handle still holds a writer slot (then it is in use, and
 * damaged).  Any other magic is refused: a segment is never re-initialised
 * or resized while processes may have it mapped (they would die of SIGBUS).
 * An opener checks the magic, the format word (layout version and the
 * sizes of the shared types), the geometry and the lock before using
 * anything, and refuses a mismatch (EFORMAT).
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
 *     so they never see a partial object.  A WRITING entry's space is
 *     not reused while its writer lives (the writer's handle holds an
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
 * derived structure (chains, lists, free list, ring head, counters) from
 * the entries that pass validation, and marks the mutex consistent.
 * Entries caught half-moved, or written by dead writers, are dropped.  The
 * same repair runs whenever an operation finds structure that does not
 * validate: the Store is repaired, never trusted blindly.
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
 * Stalls.  The lock is taken with a timeout (lock_timeout_ms, default
 * 500); after a timeout the handle waits only briefly for the next second
 * (doubling to 32 s while timeouts go on), so a stopped lock holder costs
 * an encoder one timeout, not one per operation.  A writer stalled mid-copy (stopped, or slow) does not stop
 * the ring: when its record is the oldest, it is relabelled one lap on, in
 * place (its bytes do not move), and allocation goes around it.  Opening
 * never waits on the segment lock: the open-time validation runs at the
 * handle's first lock instead.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
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
#define SHM_VERSION 3u
#define REC_ALIGN 64u
#define SHM_MAX_KEY (64u * 1024u)
#define SHM_DEFAULT_SIZE (1ull << 30)
#define SHM_MIN_SIZE (1ull << 20)
#define SHM_MAX_NAME 200
#define SHM_PAGE 4096u
#define SHM_SLOTS 4096u /* handles that can write at once */
#define SHM_DEFAULT_LOCK_MS 500u
#define SHM_STALL_BACKOFF_MS 1000u /* after a lock timeout: brief waits */
#define SHM_STALL_WAIT_MS 2u
#define SHM_OPEN_WAIT_MS 5000u /* for a creator, + 8 ms per MiB, from the
                                  last growth of its file */

enum entry_state { E_FREE = 0, E_WRITING = 1, E_READY = 2, E_MOVING = 3 };
enum entry_flags { F_SUMMED = 1 }; /* `sum` holds the object's checksum */

/* One object.  Invariants (under the lock): a non-FREE entry's record lies
 * within [tail, head) of the ring and inside the data region; READY and
 * WRITING entries are on their hash chain and on the FIFO list in
 * position order; FREE entries are on the free list (through hnext);
 * `check` is entry_check() of the entry as the lock last left it (the
 * list links, `gen` and `referenced` are not covered: links are checked
 * by range and by walking, gen and referenced only ever make a miss).
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
  uint32_t check;       /* entry_check() */
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
  uint32_t dirty; /* a repair is owed (one could not finish) */
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
  uint64_t total_size; /* private copies of the checked geometry */
  char name[SHM_MAX_NAME + 1]; /* for messages */
  shm_header *h;
  shm_entry *entries;
  uint32_t *buckets;
  unsigned char *data;
  uint64_t data_size;
  uint32_t nentries, nbuckets, nslots;
  uint64_t *tokens;
  unsigned lock_timeout_ms;
  int checksum;         /* compute and verify object checksums */
  int validate_pending; /* check the structure at the next lock */
  uint64_t stalled_until_ms; /* after a lock timeout: wait briefly */
  unsigned stalls;           /* lock timeouts in a row */
  int slot;       /* this handle's writer slot, -1 = none */
  uint64_t token; /* this handle's token, in tokens[slot] */
  /* Records this handle copied but could not publish (the lock timed
   * out): published at its next successful lock, or at close. */
  pthread_mutex_t pmu;
  struct pending_pub {
    shm_entry *e;
    uint64_t gen, sum;
    uint32_t flags;
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

static uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* The check word of entry id: covers what only the lock changes and that
 * readers or allocation trust (not the links, gen or referenced). */
static uint32_t entry_check(const shm_entry *e, uint32_t id) {
  uint64_t h = mix64(0x9e3779b97f4a7c15ull ^ id);
  h = mix64(h ^ e->hash);
  h = mix64(h ^ e->pos);
  h = mix64(h ^ e->obj_len);
  h = mix64(h ^ e->owner_token);
  h = mix64(h ^ e->sum);
  h = mix64(h ^ ((uint64_t)e->key_len << 32 | e->state));
  h = mix64(h ^ ((uint64_t)e->owner_slot << 32 | e->flags));
  return (uint32_t)(h ^ h >> 32);
}

/* After the lock changed any field entry_check() covers. */
/* Writes the fields entry_check() covers from the private entry n, and
 * the check word computed from n: never from what the shared entry holds
 * by then (a peer's damage must not be sealed in). */
static void store_entry(shm_store *s, shm_entry *e, const shm_entry *n) {
  e->hash = n->hash;
  e->pos = n->pos;
  e->obj_len = n->obj_len;
  e->owner_token = n->owner_token;
  e->sum = n->sum;
  e->key_len = n->key_len;
  e->state = n->state;
  e->owner_slot = n->owner_slot;
  e->flags = n->flags;
  e->check = entry_check(n, ent_id(s, e));
}

/* Marks e FREE (its other covered fields zero). */
static void store_free(shm_store *s, shm_entry *e) {
  shm_entry n;
  memset(&n, 0, sizeof(n));
  n.state = E_FREE;
  store_entry(s, e, &n);
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
static int in_window(shm_store *s, const shm_entry *e, uint64_t head) {
  uint64_t rec = rec_size(e->key_len, e->obj_len);
  return e->pos <= head && rec <= head - e->pos &&
         head - e->pos <= s->data_size;
}

/* rec_fits(), and the record lies within the ring's last lap before head. */
static int entry_sane(shm_store *s, const shm_entry *e) {
  return rec_fits(s, e) &&
         in_window(s, e, __atomic_load_n(&s->h->head, __ATOMIC_RELAXED));
}

/* Copies entry id (index + 1) out of shared memory into *c: every later
 * use of its fields reads the copy, so bytes changing underneath cannot
 * turn a checked value into an unchecked one.  Returns 1 when the copy can
 * be trusted: its check word holds, its state is known and, unless FREE,
 * its record lies inside the data region and (with_head) inside the ring's
 * last lap. */
static int load_entry(shm_store *s, uint32_t id, shm_entry *c, int with_head) {
  shm_entry *e = ent(s, id);
  if (e == NULL)
    return 0;
  memcpy(c, e, sizeof(*c));
  /* The copy is what is used: no later read of a field may go back to the
   * shared entry instead. */
  __asm__ volatile("" ::: "memory");
  if (c->check != entry_check(c, id) || c->state > E_MOVING)
    return 0;
  return c->state == E_FREE ||
         (with_head ? entry_sane(s, c) : rec_fits(s, c));
}

/*
 * Object checksums: 4 lanes of 64-bit words over 32-byte blocks; per lane
 * a += w and b += a (Fletcher: position-sensitive) and c += lo32(w ^ k) *
 * hi32(w ^ k) (the XXH3 accumulator: not linear, so that changes which
 * cancel in the sums, such as bit 63 flipped in two words of one lane,
 * still change c), all modulo 2^64, finished by a mix of the lanes and the
 * length.  It is computed inside the copy, on the words as they pass
 * through registers (each loaded once, then stored and summed), so it
 * costs little beyond the copy itself (docs/stores.md has the figures) and
 * it is end to end: it is the sum of what the writer was given and of what
 * the reader returns, so whatever changes the bytes in the segment during
 * or after either copy (a stray write, a writer whose record was reclaimed
 * under it) makes the reader's sum differ.  It guards against damage, not
 * against an adversary.  Streaming: an object may be copied in pieces of
 * any length.
 */
typedef struct sum_state {
  uint64_t a[4], b[4], c[4];
  uint64_t len;
  unsigned char part[32];
  size_t npart;
} sum_state;

#define SUM_K0 0x9e3779b97f4a7c15ull
#define SUM_K1 0xc2b2ae3d27d4eb4full
#define SUM_K2 0x165667b19e3779f9ull
#define SUM_K3 0xd6e8feb86659fd93ull

/* sum_blocks(st, dst, p, n): copies n 32-byte blocks from p to dst (dst
 * NULL: sums only) and sums them.  Each word is loaded once: the empty asm
 * pins the loaded value in a register, so the compiler cannot load it a
 * second time for the sum (the source may be shared memory that a damaged
 * peer changes in between). */
#if defined(__x86_64__)
#include <immintrin.h>

static void sum_blocks_sse2(sum_state *st, unsigned char *dst,
                            const unsigned char *p, size_t nblocks) {
  const __m128i k01 = _mm_set_epi64x((long long)SUM_K1, (long long)SUM_K0);
  const __m128i k23 = _mm_set_epi64x((long long)SUM_K3, (long long)SUM_K2);
  __m128i a01 = _mm_loadu_si128((const __m128i *)st->a);
  __m128i a23 = _mm_loadu_si128((const __m128i *)(st->a + 2));
  __m128i b01 = _mm_loadu_si128((const __m128i *)st->b);
  __m128i b23 = _mm_loadu_si128((const __m128i *)(st->b + 2));
  __m128i c01 = _mm_loadu_si128((const __m128i *)st->c);
  __m128i c23 = _mm_loadu_si128((const __m128i *)(st->c + 2));
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i y = _mm_loadu_si128((const __m128i *)(p + 16));
    __asm__ volatile("" : "+x"(x), "+x"(y));
    if (dst != NULL) {
      _mm_storeu_si128((__m128i *)dst, x);
      _mm_storeu_si128((__m128i *)(dst + 16), y);
      dst += 32;
    }
    a01 = _mm_add_epi64(a01, x);
    a23 = _mm_add_epi64(a23, y);
    b01 = _mm_add_epi64(b01, a01);
    b23 = _mm_add_epi64(b23, a23);
    x = _mm_xor_si128(x, k01);
    y = _mm_xor_si128(y, k23);
    c01 = _mm_add_epi64(c01, _mm_mul_epu32(x, _mm_srli_epi64(x, 32)));
    c23 = _mm_add_epi64(c23, _mm_mul_epu32(y, _mm_srli_epi64(y, 32)));
  }
  _mm_storeu_si128((__m128i *)st->a, a01);
  _mm_storeu_si128((__m128i *)(st->a + 2), a23);
  _mm_storeu_si128((__m128i *)st->b, b01);
  _mm_storeu_si128((__m128i *)(st->b + 2), b23);
  _mm_storeu_si128((__m128i *)st->c, c01);
  _mm_storeu_si128((__m128i *)(st->c + 2), c23);
}

/* The same, four lanes per 32-byte vector, where the CPU has AVX2. */
__attribute__((target("avx2"))) static void
sum_blocks_avx2(sum_state *st, unsigned char *dst, const unsigned char *p,
                size_t nblocks) {
  const __m256i k = _mm256_set_epi64x((long long)SUM_K3, (long long)SUM_K2,
                                      (long long)SUM_K1, (long long)SUM_K0);
  __m256i a = _mm256_loadu_si256((const __m256i *)st->a);
  __m256i b = _mm256_loadu_si256((const __m256i *)st->b);
  __m256i c = _mm256_loadu_si256((const __m256i *)st->c);
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    __m256i x = _mm256_loadu_si256((const __m256i *)p);
    __asm__ volatile("" : "+x"(x));
    if (dst != NULL) {
      _mm256_storeu_si256((__m256i *)dst, x);
      dst += 32;
    }
    a = _mm256_add_epi64(a, x);
    b = _mm256_add_epi64(b, a);
    x = _mm256_xor_si256(x, k);
    c = _mm256_add_epi64(c, _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32)));
  }
  _mm256_storeu_si256((__m256i *)st->a, a);
  _mm256_storeu_si256((__m256i *)st->b, b);
  _mm256_storeu_si256((__m256i *)st->c, c);
}

static void sum_blocks(sum_state *st, unsigned char *dst,
                       const unsigned char *p, size_t nblocks) {
  if (__builtin_cpu_supports("avx2"))
    sum_blocks_avx2(st, dst, p, nblocks);
  else
    sum_blocks_sse2(st, dst, p, nblocks);
}
#else
static void sum_blocks(sum_state *st, unsigned char *dst,
                       const unsigned char *p, size_t nblocks) {
  static const uint64_t k[4] = {SUM_K0, SUM_K1, SUM_K2, SUM_K3};
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    for (int l = 0; l < 4; l++) {
      unsigned char t[8];
      for (int j = 0; j < 8; j++) /* one load of each byte */
        t[j] = ((const volatile unsigned char *)p)[8 * l + j];
      if (dst != NULL)
        memcpy(dst + 8 * l, t, 8);
      uint64_t w = encache__get_le64(t);
      st->a[l] += w;
      st->b[l] += st->a[l];
      w ^= k[l];
      st->c[l] += (w & 0xffffffffu) * (w >> 32);
    }
    if (dst != NULL)
      dst += 32;
  }
}
#endif

/* Sums n bytes (already copied, or private) in pieces of any length. */
static void sum_update(sum_state *st, const unsigned char *p, size_t n) {
  st->len += n;
  if (st->npart > 0) {
    size_t take = 32 - st->npart < n ? 32 - st->npart : n;
    memcpy(st->part + st->npart, p, take);
    st->npart += take;
    p += take;
    n -= take;
    if (st->npart < 32)
      return;
    sum_blocks(st, NULL, st->part, 1);
    st->npart = 0;
  }
  sum_blocks(st, NULL, p, n / 32);
  st->npart = n % 32;
  memcpy(st->part, p + n - st->npart, st->npart);
}

static uint64_t sum_final(sum_state *st) {
  if (st->npart > 0) {
    memset(st->part + st->npart, 0, 32 - st->npart);
    sum_blocks(st, NULL, st->part, 1);
    st->npart = 0;
  }
  uint64_t h = mix64(st->len ^ 0x5bd1e9955bd1e995ull);
  for (int i = 0; i < 4; i++)
    h = mix64(mix64(mix64(h ^ st->a[i]) ^ st->b[i]) ^ st->c[i]);
  return h;
}

/* Copies a few bytes through a private buffer and sums that buffer: the
 * sum is of exactly the bytes written. */
static void copy_sum_small(unsigned char *dst, const unsigned char *src,
                           size_t n, sum_state *st) {
  unsigned char tmp[32];
  for (size_t i = 0; i < n; i++) /* one load each, as above */
    tmp[i] = ((const volatile unsigned char *)src)[i];
  memcpy(dst, tmp, n);
  sum_update(st, tmp, n);
}

/* memcpy, and (when st) the sum of the bytes copied. */
static void copy_sum(unsigned char *dst, const unsigned char *src, size_t n,
                     sum_state *st) {
  if (n == 0)
    return; /* src may be NULL */
  if (st == NULL) {
    memcpy(dst, src, n);
    return;
  }
  if (st->npart > 0) { /* complete the pending block first */
    size_t take = 32 - st->npart < n ? 32 - st->npart : n;
    copy_sum_small(dst, src, take, st);
    dst += take, src += take, n -= take;
  }
  size_t nb = n / 32;
  sum_blocks(st, dst, src, nb);
  st->len += nb * 32;
  if (n % 32 > 0)
    copy_sum_small(dst + nb * 32, src + nb * 32, n % 32, st);
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
  fl.l_start = (off_t)(s->total_size + slot);
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

/* Whether any handle holds a writer slot of the segment file fd of `size`
 * bytes: whether any process has it open (it cannot tell: yes). */
static int slots_held(int fd, uint64_t size) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = (off_t)size;
  fl.l_len = SHM_SLOTS;
  return fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
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
  store_free(s, e);
  e->hnext = s->h->free_first;
  s->h->free_first = ent_id(s, e);
}

/* ----------------------------------------------------------------- repair */

static void drop_entry(shm_store *s, shm_entry *e) {
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  store_free(s, e);
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

/* Rebuilds every derived structure (lists, chains, ring head, counters)
 * from the entries that validate.  Runs under the segment lock; it reads
 * shared memory only through checked private copies and sorts in private
 * memory, so bytes changing while it runs (another process's bug) cannot
 * crash it; the next check finds whatever they broke.  Idempotent: a
 * process dying in here, or failing to allocate, leaves `dirty` set and
 * the next locker runs it again.  It never drops the record of a live
 * writer for a READY one: that writer is still copying into it. */
static int repair(shm_store *s) {
  shm_header *h = s->h;
  uint64_t ds = s->data_size;
  size_t cap = 0, nk = 0;
  kept_rec *kr = NULL;
  h->dirty = 1;
  for (uint32_t id = 1; id <= s->nentries; id++) {
    shm_entry c, *e = &s->entries[id - 1];
    int ok = load_entry(s, id, &c, 0), keep = 0;
    if (ok && c.state == E_READY)
      keep = hash_key((const char *)rec_at(s, c.pos), c.key_len) == c.hash;
    else if (ok && c.state == E_WRITING)
      keep = owner_alive(s, &c);
    if (!keep) {
      if (!ok || c.state != E_FREE)
        drop_entry(s, e);
      continue;
    }
    if (nk == cap) {
      size_t ncap = cap ? 2 * cap : 1024;
      kept_rec *n = encache__realloc(kr, ncap * sizeof(*kr));
      if (n == NULL) {
        encache__free(kr);
        return encache__store_fail(&s->base, ENCACHE_ENOMEM,
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

  /* The ring's last lap ends at the newest record; what lies outside it,
   * or overlaps a record it keeps, goes. */
  if (nk > 1)
    qsort(kr, nk, sizeof(*kr), cmp_pos);
  uint64_t newest = 0;
  for (size_t k = 0; k < nk; k++)
    newest = kr[k].end > newest ? kr[k].end : newest;
  size_t last = SIZE_MAX; /* the newest record kept so far */
  for (size_t k = 0; k < nk; k++) {
    if (newest - kr[k].pos > ds) {
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
  /* Two records of one key. */
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
    fifo_append(s, e);
    uint32_t *b = &s->buckets[kr[k].hash & (s->nbuckets - 1)];
    e->hnext = *b;
    *b = kr[k].id;
  }
  encache__free(kr);
  uint64_t head = h->head;
  if (h->nobjects == 0 ? head > (1ull << 62)
                       : head < last_end || head - first > ds)
    h->head = h->nobjects == 0 ? 0 : last_end;
  for (uint32_t i = s->nentries; i > 0; i--) {
    shm_entry *e = &s->entries[i - 1];
    if (e->state == E_FREE) {
      e->fprev = e->fnext = 0;
      e->hnext = h->free_first;
      h->free_first = i;
    }
  }
  h->repairs++;
  h->dirty = 0;
  return 0;
}

/* Checks every list and chain in O(entries); false when anything is out
 * of range, cyclic, fails its check or is inconsistent with the entries'
 * states and the ring head. */
static int structure_ok(shm_store *s) {
  shm_header *h = s->h;
  uint32_t n = s->nentries, live = 0, nfree = 0, chained = 0, prev = 0;
  uint64_t prev_end = 0, bytes = 0;
  shm_entry c;
  if (h->dirty)
    return 0;
  for (uint32_t i = h->fifo_first; i != 0; i = c.fnext) {
    if (++live > n || !load_entry(s, i, &c, 1) || c.fprev != prev ||
        (c.state != E_READY && c.state != E_WRITING) ||
        (live > 1 && c.pos < prev_end))
      return 0;
    prev_end = c.pos + rec_size(c.key_len, c.obj_len);
    bytes += rec_size(c.key_len, c.obj_len);
    prev = i;
  }
  if (h->fifo_last != prev || live != h->nobjects || bytes != h->bytes_used)
    return 0;
  for (uint32_t i = h->free_first; i != 0; i = c.hnext)
    if (++nfree > n || !load_entry(s, i, &c, 1) || c.state != E_FREE)
      return 0;
  if (live + nfree != n)
    return 0;
  for (uint32_t b = 0; b < s->nbuckets; b++)
    for (uint32_t i = s->buckets[b]; i != 0; i = c.hnext)
      if (++chained > live || !load_entry(s, i, &c, 1) ||
          c.state == E_FREE || (c.hash & (s->nbuckets - 1)) != b)
        return 0;
  return chained == live;
}

/* ---------------------------------------------------------------- locking */

/* Publishes a record this handle finished copying, if it is still ours. */
static int publish_record(shm_store *s, shm_entry *e, uint64_t gen,
                          uint64_t sum, uint32_t flags) {
  shm_entry c;
  if (load_entry(s, ent_id(s, e), &c, 0) && c.state == E_WRITING &&
      c.gen == gen && c.owner_slot == (uint32_t)s->slot &&
      c.owner_token == s->token) {
    c.state = E_READY;
    c.owner_slot = UINT32_MAX;
    c.sum = sum;
    c.flags = flags;
    store_entry(s, e, &c);
    return 0;
  }
  return -1;
}

/* Under the lock: publishes what an earlier timeout left pending. */
static void publish_pending(shm_store *s) {
  pthread_mutex_lock(&s->pmu);
  for (int i = 0; i < s->npending; i++)
    publish_record(s, s->pending[i].e, s->pending[i].gen, s->pending[i].sum,
                   s->pending[i].flags);
  __atomic_store_n(&s->npending, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&s->pmu);
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The end of the operator's way out, for messages about damage. */
#define DESTROY_HINT "destroy it (encache shm destroy %s) once no process uses it"

/* Whether the lock looks like the robust process-shared mutex that
 * segment_init() made.  glibc aborts inside pthread_mutex_timedlock() on
 * some damaged kind words, so the kind is compared with a fresh mutex's
 * before every lock (a damaged lock cannot be repaired while other
 * processes may be waiting on it). */
#ifdef __GLIBC__
static int good_kind;
static pthread_once_t good_kind_once = PTHREAD_ONCE_INIT;
static void good_kind_init(void) {
  pthread_mutex_t m;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&m, &a);
  good_kind = m.__data.__kind;
  pthread_mutex_destroy(&m);
  pthread_mutexattr_destroy(&a);
}
static int lock_damaged(pthread_mutex_t *m) {
  pthread_once(&good_kind_once, good_kind_init);
  return __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) != good_kind;
}
#else
static int lock_damaged(pthread_mutex_t *m) {
  (void)m;
  return 0;
}
#endif

/* Whether the header's immutable part still says what attach checked. */
static int identity_ok(shm_store *s) {
  const shm_header *h = s->h;
  return h->magic == SHM_MAGIC && h->format == SHM_FORMAT &&
         h->total_size == s->total_size && h->data_size == s->data_size &&
         h->nentries == s->nentries && h->nbuckets == s->nbuckets;
}

static int shm_lock_raw(shm_store *s);

static int shm_lock(shm_store *s) {
  int rc = shm_lock_raw(s);
  if (rc < 0)
    return rc;
  if (s->h->dirty || __atomic_exchange_n(&s->validate_pending, 0,
                                         __ATOMIC_RELAXED)) {
    if (!structure_ok(s))
      repair(s); /* on failure `dirty` stays: the next lock tries again */
  }
  if (__atomic_load_n(&s->npending, __ATOMIC_RELAXED) > 0)
    publish_pending(s);
  return 0;
}

static int shm_lock_raw(shm_store *s) {
  if (s->h == NULL)
    return encache__store_fail(&s->base, ENCACHE_EINVAL,
                               "%s: handle used in a child after fork(): "
                               "open a new one", s->base.url);
  if (!identity_ok(s))
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: the segment header is damaged (magic, "
                               "format or geometry changed): " DESTROY_HINT,
                               s->base.url, s->name);
  if (lock_damaged(&s->h->lock))
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: the segment lock is damaged: " DESTROY_HINT,
                               s->base.url, s->name);
  /* After a timeout, wait only briefly for a while: a stopped holder must
   * cost an encoder one timeout, not one per operation. */
  unsigned wait = s->lock_timeout_ms;
  uint64_t now = mono_ms();
  if (now < __atomic_load_n(&s->stalled_until_ms, __ATOMIC_RELAXED) &&
      wait > SHM_STALL_WAIT_MS)
    wait = SHM_STALL_WAIT_MS;
  /* A monotonic deadline where glibc has one: a step of the wall clock
   * must not stretch the wait.  (Not under ThreadSanitizer, which does not
   * intercept pthread_mutex_clocklock.) */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 30) && \
    !defined(ENCACHE_TSAN)
#define SHM_CLOCKLOCK 1
#endif
#ifdef SHM_CLOCKLOCK
  const clockid_t clock = CLOCK_MONOTONIC;
#else
  const clockid_t clock = CLOCK_REALTIME;
#endif
  struct timespec ts;
  clock_gettime(clock, &ts);
  ts.tv_sec += wait / 1000;
  ts.tv_nsec += (long)(wait % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
#ifdef SHM_CLOCKLOCK
  int rc = pthread_mutex_clocklock(&s->h->lock, clock, &ts);
#else
  int rc = pthread_mutex_timedlock(&s->h->lock, &ts);
#endif
  if (rc == 0 || rc == EOWNERDEAD) {
    __atomic_store_n(&s->stalled_until_ms, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stalls, 0, __ATOMIC_RELAXED);
    if (rc == EOWNERDEAD) {
      /* The previous holder died mid-update: rebuild, then vouch for it
       * (a repair that cannot finish leaves `dirty` for the next one). */
      repair(s);
      pthread_mutex_consistent(&s->h->lock);
    }
    return 0;
  }
  if (rc == ETIMEDOUT && wait < s->lock_timeout_ms)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: lock busy (its holder was stalled for %u "
                               "ms earlier: waits are brief for a while)",
                               s->base.url, s->lock_timeout_ms);
  if (rc == ETIMEDOUT) {
    /* The brief waits last 1 s after a full timeout, doubling with each
     * further full timeout up to 32 s (a holder that never resumes). */
    unsigned n = __atomic_load_n(&s->stalls, __ATOMIC_RELAXED);
    if (n < 6)
      __atomic_store_n(&s->stalls, ++n, __ATOMIC_RELAXED);
    uint64_t backoff = (uint64_t)SHM_STALL_BACKOFF_MS << (n - 1);
    __atomic_store_n(&s->stalled_until_ms, mono_ms() + backoff,
                     __ATOMIC_RELAXED);
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: lock not acquired within %u ms (its "
                               "holder may be stopped; for the next %" PRIu64
                               " ms operations wait at most %u ms)",
                               s->base.url, wait, backoff, SHM_STALL_WAIT_MS);
  }
  if (rc == EINVAL || rc == ENOTRECOVERABLE)
    return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: the segment lock is %s (%s): " DESTROY_HINT,
                               s->base.url,
                               rc == EINVAL ? "damaged" : "unrecoverable",
                               strerror(rc), s->name);
  return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                             "%s: lock failed: %s", s->base.url, strerror(rc));
}

static void shm_unlock(shm_store *s) { pthread_mutex_unlock(&s->h->lock); }

int encache__shm_test_lock(encache_store *st) {
  return shm_lock((shm_store *)st);
}

int encache__shm_test_layout(encache_store *st, encache__shm_layout *out) {
  shm_store *s = (shm_store *)st;
  if (st == NULL || st->ops != &shm_ops || s->h == NULL)
    return ENCACHE_EINVAL;
  memset(out, 0, sizeof(*out));
  out->total_size = s->total_size;
  out->lock_off = offsetof(shm_header, lock);
#ifdef __GLIBC__
  out->lock_kind_off = out->lock_off + offsetof(pthread_mutex_t, __data.__kind);
#endif
  out->head_off = offsetof(shm_header, head);
  out->fifo_first_off = offsetof(shm_header, fifo_first);
  out->fifo_last_off = offsetof(shm_header, fifo_last);
  out->free_first_off = offsetof(shm_header, free_first);
  out->entries_off = (uint64_t)((unsigned char *)s->entries - s->map);
  out->entry_size = sizeof(shm_entry);
  out->entry_pos_off = offsetof(shm_entry, pos);
  out->nentries = s->nentries;
  out->nbuckets = s->nbuckets;
  out->buckets_off = (uint64_t)((unsigned char *)s->buckets - s->map);
  out->data_off = (uint64_t)(s->data - s->map);
  out->data_size = s->data_size;
  return 0;
}

int encache__shm_test_repair(encache_store *st, int always) {
  shm_store *s = (shm_store *)st;
  int rc = shm_lock(s);
  if (rc < 0)
    return rc;
  if (always || !structure_ok(s))
    rc = repair(s);
  shm_unlock(s);
  return rc;
}

/* --------------------------------------------------------------- lookups */

/* Finds the live (non-FREE) entry for key, with its checked copy in *c;
 * sets *corrupt when the chain does not validate. */
static shm_entry *find(shm_store *s, const char *key, uint32_t klen,
                       uint64_t hash, shm_entry *c, int *corrupt) {
  uint32_t i = s->buckets[hash & (s->nbuckets - 1)];
  for (uint32_t steps = 0; i != 0; steps++) {
    if (steps > s->nentries || !load_entry(s, i, c, 1) ||
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

/* find() that repairs the structure and retries once when it is corrupt. */
static shm_entry *find_repairing(shm_store *s, const char *key,
                                 uint32_t klen, uint64_t hash, shm_entry *c) {
  int corrupt = 0;
  shm_entry *e = find(s, key, klen, hash, c, &corrupt);
  if (corrupt && repair(s) == 0) {
    corrupt = 0;
    e = find(s, key, klen, hash, c, &corrupt);
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
  shm_entry c;
  int rc = shm_lock(s);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = find_repairing(s, keys[i], (uint32_t)klen,
                                  hash_key(keys[i], klen), &c);
    results[i] = e != NULL && c.state == E_READY;
  }
  shm_unlock(s);
  return 0;
}

typedef struct read_snap {
  shm_entry *e;
  uint64_t gen, sum;
  const unsigned char *src;
  uint64_t len;
  int summed;
} read_snap;

/* Drops the objects whose bytes failed their checksum, if they are still
 * what was read (a later copy may have replaced them). */
static void drop_damaged(shm_store *s, const read_snap *snap, size_t n,
                         const int64_t *results) {
  if (shm_lock(s) < 0)
    return; /* the next reader finds them again */
  for (size_t i = 0; i < n; i++) {
    shm_entry *e = snap[i].e;
    if (e != NULL && results[i] == ENCACHE_ENOENT && e->state == E_READY &&
        __atomic_load_n(&e->gen, __ATOMIC_RELAXED) == snap[i].gen) {
      entry_free(s, e);
      s->h->repairs++;
    }
  }
  shm_unlock(s);
}

/* Reads whole objects (split 0) or splits each: its first `split` bytes to
 * heads[i], the rest to bufs[i].  Each object's checksum is verified on
 * the bytes as they landed in the caller's buffers. */
static int read_common(encache_store *st, const char *const *keys, size_t n,
                       size_t split, void *const *heads, void *const *bufs,
                       const size_t *caps, int64_t *results) {
  shm_store *s = (shm_store *)st;
  read_snap local[16];
  read_snap *snap = n <= 16 ? local : encache__calloc(n, sizeof(*snap));
  size_t damaged = 0;
  if (snap == NULL)
    return encache__store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = shm_lock(s);
  if (rc < 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    size_t klen;
    shm_entry c;
    snap[i].e = NULL;
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = find_repairing(s, keys[i], (uint32_t)klen,
                                  hash_key(keys[i], klen), &c);
    if (e == NULL || c.state != E_READY ||
        (s->checksum && !(c.flags & F_SUMMED))) {
      /* A handle that checks serves only objects it can check. */
      results[i] = ENCACHE_ENOENT;
    } else if (c.obj_len > caps[i] && c.obj_len - caps[i] > split) {
      results[i] = ENCACHE_ETOOLARGE;
    } else {
      snap[i].e = e;
      snap[i].gen = c.gen;
      snap[i].src = obj_at(s, &c);
      snap[i].len = c.obj_len;
      snap[i].sum = c.sum;
      snap[i].summed = s->checksum;
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
    sum_state sum = {0};
    OPTIMISTIC_BEGIN();
    if (h > 0)
      copy_sum(heads[i], snap[i].src, h, snap[i].summed ? &sum : NULL);
    copy_sum(bufs[i], snap[i].src + h, (size_t)snap[i].len - h,
             snap[i].summed ? &sum : NULL);
    OPTIMISTIC_END();
    /* Seqlock check: the copy above must complete before the generation
     * is read again. */
#ifdef ENCACHE_TSAN
    uint64_t gen = __atomic_load_n(&snap[i].e->gen, __ATOMIC_ACQUIRE);
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t gen = __atomic_load_n(&snap[i].e->gen, __ATOMIC_RELAXED);
#endif
    if (gen != snap[i].gen) {
      results[i] = ENCACHE_ENOENT;
      snap[i].e = NULL; /* replaced while read: not damage */
    } else if (snap[i].summed && sum_final(&sum) != snap[i].sum) {
      results[i] = ENCACHE_ENOENT; /* damaged: a miss, never served */
      damaged++;
    } else {
      results[i] = (int64_t)snap[i].len;
    }
  }
  if (damaged > 0)
    drop_damaged(s, snap, n, results);
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
  shm_entry c;
  int rc = key_ok(s, key, &klen);
  if (rc < 0 || (rc = shm_lock(s)) < 0)
    return rc;
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash_key(key, klen),
                                &c);
  if (e != NULL && c.state == E_READY)
    *len = c.obj_len;
  else
    rc = ENCACHE_ENOENT;
  shm_unlock(s);
  return rc;
}

/* ----------------------------------------------------------------- writes */

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
  store_entry(s, e, &n);
  __atomic_add_fetch(&e->gen, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  RELEASE_FENCE(); /* the new generation before any byte moves */
  memmove(rec_at(s, dst), rec_at(s, c->pos), rec);
  fifo_unlink(s, e);
  n.pos = dst;
  n.state = E_READY;
  s->h->head = dst + rec;
  fifo_append(s, e);
  store_entry(s, e, &n);
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
  fifo_unlink(s, e);
  s->h->head = n.pos + rec_size(c->key_len, c->obj_len);
  fifo_append(s, e);
  store_entry(s, e, &n);
}

/* Frees the oldest record (e, checked copy c), gives it a second chance,
 * or, if it is being written, moves it a lap on (then returns 1). */
static int drop_oldest(shm_store *s, shm_entry *e, const shm_entry *c,
                       uint64_t *budget) {
  if (c->state == E_WRITING && owner_alive(s, c)) {
    relabel_writing(s, e, c);
    return 1;
  }
  uint64_t rec = rec_size(c->key_len, c->obj_len);
  shm_entry second;
  /* A next record that does not validate: no move (it could overlap it). */
  int has_second = c->fnext != 0 && load_entry(s, c->fnext, &second, 1);
  if (c->state == E_READY && __atomic_load_n(&e->referenced, __ATOMIC_RELAXED) &&
      rec <= s->data_size / 16 && rec <= *budget &&
      (c->fnext == 0 || has_second) &&
      reinsert_oldest(s, e, c, has_second ? &second : NULL)) {
    *budget -= rec;
    return 0;
  }
  if (c->state == E_READY)
    s->h->evictions++;
  entry_free(s, e);
  return 0;
}

/* Makes room for a record of rec bytes and a free entry; returns the
 * record's position in *pos and the checked free entry in *fe (its id)
 * and *fnext (the free list after it), so that the caller uses what was
 * checked, not what the shared list holds by then.  The ends of the FIFO list and the free list
 * are checked first, and the head against them (entry_sane: the newest
 * record ends at or before it, the oldest starts at most a ring length
 * before it): a head moved back would put the record over live ones. */
static int make_room(shm_store *s, uint64_t rec, uint64_t *pos, uint32_t *fe,
                     uint32_t *fnext) {
  uint64_t budget = 2 * rec + 65536;
  unsigned relabelled = 0; /* in a row: more than writers can hold = full */
  for (uint64_t steps = 0;; steps++) {
    if (steps > 4 * (uint64_t)s->nentries + 16)
      return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                 "%s: could not make room", s->base.url);
    shm_header *h = s->h;
    uint32_t first = h->fifo_first, last = h->fifo_last, fr = h->free_first;
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    shm_entry oc, nc, fc;
    if ((first == 0) != (last == 0) ||
        (first != 0 && (!load_entry(s, first, &oc, 0) ||
                        !in_window(s, &oc, head) || oc.state == E_FREE ||
                        oc.fprev != 0)) ||
        (last != 0 && (!load_entry(s, last, &nc, 0) ||
                       !in_window(s, &nc, head) || nc.state == E_FREE ||
                       nc.fnext != 0)) ||
        (fr != 0 && (!load_entry(s, fr, &fc, 1) || fc.state != E_FREE))) {
      int rc = repair(s); /* the lists or the head do not validate */
      if (rc < 0)
        return rc;
      continue;
    }
    uint64_t start = head_start(s, head, rec);
    if (first == 0 && fr == 0)
      return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                 "%s: no free entry", s->base.url);
    if (fr != 0 && (first == 0 || start + rec <= oc.pos + s->data_size)) {
      *pos = start;
      *fe = fr;
      *fnext = fc.hnext;
      return 0;
    }
    if (relabelled > s->nslots ||
        (first == last && oc.state == E_WRITING && owner_alive(s, &oc)))
      return encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                                 "%s: full of objects still being written",
                                 s->base.url);
    relabelled = drop_oldest(s, ent(s, first), &oc, &budget) ? relabelled + 1
                                                              : 0;
  }
}

static int shm_write(encache_store *st, const char *key, const void *hdr,
                     size_t hdr_len, const void *payload, size_t len) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  shm_entry c;
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
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash, &c);
  if (e != NULL) {
    if (c.state != E_WRITING || owner_alive(s, &c)) {
      shm_unlock(s);
      return encache__store_fail(st, ENCACHE_EEXIST, "%s: key exists",
                                 s->base.url);
    }
    entry_free(s, e); /* its writer died */
  }
  uint32_t fe = 0, fnext = 0;
  if ((rc = make_room(s, rec, &pos, &fe, &fnext)) < 0) {
    shm_unlock(s);
    return rc;
  }
  e = ent(s, fe); /* checked by make_room: in range */
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
  store_entry(s, e, &n);
  __atomic_store_n(&e->referenced, 0, __ATOMIC_RELAXED);
  s->h->head = pos + rec;
  memcpy(rec_at(s, pos), key, klen);
  fifo_append(s, e);
  chain_insert(s, e);
  s->h->nobjects++;
  s->h->bytes_used += rec;
  uint64_t gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
  unsigned char *dst = rec_at(s, pos) + align_up(klen, REC_ALIGN);
  shm_unlock(s);

  if (encache__shm_write_hook != NULL)
    encache__shm_write_hook();
  /* The copy, outside the lock: nobody reads or reuses a WRITING record
   * while its writer lives.  The checksum is of the caller's bytes. */
  sum_state sum = {0};
  RELEASE_FENCE();
  copy_sum(dst, hdr, hdr_len, s->checksum ? &sum : NULL);
  copy_sum(dst + hdr_len, payload, len, s->checksum ? &sum : NULL);
  uint64_t digest = s->checksum ? sum_final(&sum) : 0;
  uint32_t flags = s->checksum ? F_SUMMED : 0;

  if ((rc = shm_lock(s)) < 0) {
    /* The copy is complete but cannot be published now.  Left WRITING it
     * would block its key for as long as this handle lives: publish it at
     * the handle's next successful lock (or at close), or, with no room to
     * remember it, leave it to be reclaimed when the handle closes. */
    pthread_mutex_lock(&s->pmu);
    if (s->npending < (int)(sizeof(s->pending) / sizeof(s->pending[0]))) {
      s->pending[s->npending].e = e;
      s->pending[s->npending].gen = gen;
      s->pending[s->npending].sum = digest;
      s->pending[s->npending].flags = flags;
      __atomic_store_n(&s->npending, s->npending + 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->pmu);
    return rc;
  }
  if (publish_record(s, e, gen, digest, flags) < 0)
    rc = encache__store_fail(st, ENCACHE_EUNAVAIL,
                             "%s: the object was reclaimed while being "
                             "written", s->base.url);
  shm_unlock(s);
  return rc;
}

static int shm_remove(encache_store *st, const char *key) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  shm_entry c;
  int rc = key_ok(s, key, &klen);
  if (rc < 0 || (rc = shm_lock(s)) < 0)
    return rc;
  shm_entry *e = find_repairing(s, key, (uint32_t)klen, hash_key(key, klen),
                                &c);
  if (e != NULL && c.state == E_READY)
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
  uint32_t cap = s->h->nobjects < s->nentries ? s->h->nobjects : s->nentries;
  list_item *items = encache__calloc(cap + 1u, sizeof(*items));
  size_t n = 0;
  shm_entry c;
  for (uint32_t i = s->h->fifo_first, steps = 0;
       items != NULL && i != 0 && n < cap && steps++ < s->nentries;
       i = c.fnext) {
    if (!load_entry(s, i, &c, 1))
      break; /* changed underneath since the check: list what we have */
    if (c.state != E_READY)
      continue;
    char *k = encache__malloc(c.key_len + 1u);
    if (k == NULL) {
      rc = ENCACHE_ENOMEM;
      break;
    }
    memcpy(k, rec_at(s, c.pos), c.key_len);
    k[c.key_len] = '\0';
    if (pattern != NULL && fnmatch(pattern, k, 0) != 0) {
      encache__free(k);
      continue;
    }
    items[n].key = k;
    items[n++].len = c.obj_len;
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
    .size = sizeof(encache__store_ops),
    .version = ENCACHE_STORE_BACKEND_VERSION,
    .kind = "shm",
    .caps = ENCACHE_STORE_CAP_READ_SPLIT | ENCACHE_STORE_CAP_LIST |
            ENCACHE_STORE_CAP_PUT_IF_ABSENT | ENCACHE_STORE_CAP_SHARED,
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
  h->magic = SHM_INIT_MAGIC; /* until the end: unfinished */
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
  for (uint32_t i = 0; i < nent; i++) {
    entries[i].hnext = i + 2 <= nent ? i + 2 : 0;
    entries[i].check = entry_check(&entries[i], i + 1);
  }
  h->free_first = 1;
  memset(s->map + h->buckets_off, 0, nb * sizeof(uint32_t));
  memset(s->map + h->slots_off, 0, SHM_SLOTS * sizeof(uint64_t));
  h->format = SHM_FORMAT;
  __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
  return 0;
}

/* Validates an existing segment's header before anything else is used. */
/* The header's immutable part, copied once: what is checked is what the
 * handle binds (a peer changing it in between cannot slip past). */
static void header_copy(shm_store *s, shm_header *g) {
  memcpy(g, s->map, offsetof(shm_header, lock));
  __asm__ volatile("" ::: "memory");
}

/* Validates an existing segment's header (its copy g) before anything
 * else is used. */
static int segment_check(shm_store *s, uint64_t file_size, shm_header *g) {
  header_copy(s, g);
  const shm_header *h = g;
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
                               "not match a %" PRIu64 "-byte segment): "
                               DESTROY_HINT, u, file_size, s->name);
  if (lock_damaged(&((shm_header *)s->map)->lock))
    return encache__store_fail(&s->base, ENCACHE_EFORMAT,
                               "%s: the segment lock is damaged: " DESTROY_HINT,
                               u, s->name);
  return 0;
}

/* Binds the handle to the checked copy g of the header. */
static void bind_geometry(shm_store *s, const shm_header *g) {
  s->h = (shm_header *)s->map;
  s->total_size = g->total_size;
  s->entries = (shm_entry *)(s->map + g->entries_off);
  s->buckets = (uint32_t *)(s->map + g->buckets_off);
  s->data = s->map + g->data_off;
  s->data_size = g->data_size;
  s->nentries = g->nentries;
  s->nbuckets = g->nbuckets;
  s->tokens = (uint64_t *)(s->map + g->slots_off);
  s->nslots = SHM_SLOTS;
}

static int shm_alloc(const char *url, encache_store **out, shm_store **sp) {
  shm_store *s = encache__calloc(1, sizeof(*s));
  if (s == NULL)
    return ENCACHE_ENOMEM;
  s->base.ops = &shm_ops;
  s->fd = -1;
  s->lock_timeout_ms = SHM_DEFAULT_LOCK_MS;
  s->checksum = 1;
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
 * empty or its creator died before finishing it, else validating it.  A
 * finished segment (real magic) is never remade, so attaching to one needs
 * no flock; only creation does, and an opener waits for a creator within a
 * bound that grows with the segment's size (reserving memory takes time). */
static int shm_attach(shm_store *s, uint64_t create_size) {
  struct stat sb;
  int rc = 0, fresh = 0, locked = 0;
  const char *u = s->base.url;
  uint64_t size = 0, magic = 0, start = mono_ms();
  blkcnt_t blocks = -1;
  for (;;) {
    magic = 0;
    if (fstat(s->fd, &sb) != 0 ||
        ((size = (uint64_t)sb.st_size) >= sizeof(magic) &&
         pread(s->fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))) {
      rc = encache__store_fail(&s->base, -errno, "%s: %s", u, strerror(errno));
      goto out;
    }
    if ((magic == SHM_MAGIC && size >= sizeof(shm_header)) || locked)
      break;
    if (flock(s->fd, LOCK_EX | LOCK_NB) == 0) {
      locked = 1; /* look again, under the flock */
      continue;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      rc = encache__store_fail(&s->base, -errno, "%s: flock: %s", u,
                               strerror(errno));
      goto out;
    }
    if (sb.st_blocks != blocks) { /* the creator is still reserving memory */
      blocks = sb.st_blocks;
      start = mono_ms();
    }
    uint64_t bound = SHM_OPEN_WAIT_MS + 8 * (size >> 20);
    if (mono_ms() - start >= bound) {
      rc = encache__store_fail(&s->base, ENCACHE_EUNAVAIL,
                               "%s: another process has been creating the "
                               "segment for over %" PRIu64 " ms without "
                               "progress (is it stopped?)", u, bound);
      goto out;
    }
    usleep(1000);
  }
  if (magic == SHM_MAGIC && size >= sizeof(shm_header)) {
    fresh = 0;
  } else if (size == 0) {
    fresh = 1;
  } else if (magic == SHM_INIT_MAGIC) {
    /* Its creator held the flock we now hold: it died mid-creation.  It
     * is remade unless a handle has it open (then it is damaged). */
    if (slots_held(s->fd, size)) {
      rc = encache__store_fail(&s->base, ENCACHE_EFORMAT,
                               "%s: the segment is marked unfinished but is "
                               "in use: " DESTROY_HINT, u, s->name);
      goto out;
    }
    fresh = 1;
  } else {
    rc = encache__store_fail(&s->base, ENCACHE_EFORMAT,
                             "%s: not an encache segment, or its header is "
                             "damaged (%" PRIu64 " bytes, magic 0x%016" PRIx64
                             "): " DESTROY_HINT, u, size, magic, s->name);
    goto out;
  }
  if (fresh) {
    uint64_t init = SHM_INIT_MAGIC;
    size = align_up(create_size, SHM_PAGE);
    if (ftruncate(s->fd, 0) != 0 ||
        pwrite(s->fd, &init, sizeof(init), 0) != (ssize_t)sizeof(init) ||
        ftruncate(s->fd, (off_t)size) != 0) {
      rc = encache__store_fail(&s->base, -errno, "%s: cannot create: %s", u,
                               strerror(errno));
      goto out;
    }
    /* Reserve the memory now: a full /dev/shm must fail here, cleanly,
     * not with SIGBUS on some later write. */
    int fr = posix_fallocate(s->fd, 0, (off_t)size);
    if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) {
      rc = encache__store_fail(&s->base, -fr,
                               "%s: cannot reserve %" PRIu64 " bytes: %s", u,
                               size, strerror(fr));
      if (ftruncate(s->fd, 0) != 0) { /* leave it empty, to be remade */
      }
      goto out;
    }
  }
  if (size > SIZE_MAX) {
    rc = encache__store_fail(&s->base, ENCACHE_EFORMAT, "%s: too large", u);
    goto out;
  }
  /* Populate the page tables now: first-touch faults would otherwise
   * cost every early write of a large segment about as much as its copy.
   * Small segments (tests, the fuzzer) are cheaper to fault in lazily. */
  int populate = size >= (64ull << 20) ? MAP_POPULATE : 0;
  void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | populate, s->fd, 0);
  if (map == MAP_FAILED) {
    rc = encache__store_fail(&s->base, -errno, "%s: mmap: %s", u,
                             strerror(errno));
    goto out;
  }
  s->map = map;
  s->map_size = (size_t)size;
  shm_header g;
  rc = fresh ? segment_init(s, size) : segment_check(s, size, &g);
  if (rc == 0) {
    if (fresh)
      header_copy(s, &g);
    bind_geometry(s, &g);
    take_slot(s);
    /* Validate the mutable structure at the first lock, not here: an open
     * must not wait on a lock whose holder may be stopped. */
    s->validate_pending = !fresh;
  }
out:
  if (locked)
    flock(s->fd, LOCK_UN);
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
  snprintf(s->name, sizeof(s->name), "%s", label);
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
    } else if (strcmp(k, "checksum") == 0) {
      if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
        return encache__store_fail(&s->base, ENCACHE_EURL,
                                   "%s: checksum=%s: must be on or off", url,
                                   v);
      s->checksum = strcmp(v, "on") == 0;
    } else {
      return encache__store_fail(&s->base, ENCACHE_EURL,
                                 "%s: unknown option '%s' (known: size, "
                                 "lock_timeout_ms, checksum)", url, k);
    }
  }
  if (rc < 0)
    return encache__store_fail(&s->base, ENCACHE_EURL,
                               "%s: malformed query (use ?key=value&...)", url);
  char path[SHM_MAX_NAME + 16];
  snprintf(path, sizeof(path), "/encache-%.*s", (int)nlen, name);
  snprintf(s->name, sizeof(s->name), "%.*s", (int)nlen, name);
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
