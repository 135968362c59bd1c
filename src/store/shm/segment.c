/* SPDX-License-Identifier: Apache-2.0 */
/*
 * segment.c: the shm Store's segment as a whole: the layout formula, the
 * format and identity checks, and creating or attaching to a segment.
 *
 * Creation.  The first opener (holding an flock() on the file for the
 * whole of it; others wait for it while it makes progress, within a
 * bound; a finished segment is attached without the flock) writes an
 * "unfinished" magic before it sizes the file, lays the segment out, and
 * writes the real magic last.  An opener that finds a file of size 0 or
 * with the unfinished magic under the flock knows its creator died: it
 * remakes it, unless some handle still holds a writer slot (then it is in
 * use, and damaged).  Any other magic is refused: a segment is never
 * re-initialised or resized while processes may have it mapped (they
 * would die of SIGBUS).  An opener checks the magic, the format word
 * (layout version and the sizes of the shared types), the geometry and
 * the lock before using anything, and refuses a mismatch (EFORMAT).
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_OPEN_WAIT_MS 5000u /* for a creator, + 8 ms per MiB, from the
                                  last growth of its file */
#define SHM_MIN_DATA (64u << 10) /* a segment leaves at least this to data */

/* ------------------------------------------------------ the layout formula */

/* How many entries and hash buckets a new segment of total bytes gets:
 * one entry per 2 KiB, from 256 to 2^24, and buckets a power of two. */
static void entry_counts(uint64_t total, uint32_t *nentries,
                         uint32_t *nbuckets) {
  uint64_t nent = total / 2048;
  if (nent < 256)
    nent = 256;
  if (nent > (1u << 24))
    nent = 1u << 24;
  uint64_t nb = 1;
  while (nb < nent)
    nb <<= 1;
  *nentries = (uint32_t)nent;
  *nbuckets = (uint32_t)nb;
}

/* How many leases a segment of nentries entries gets: one per 16
 * entries, a power of two from 256 to 65536. */
static uint32_t lease_count(uint32_t nentries) {
  uint32_t n = 256;
  while (n < 65536 && n < nentries / 16)
    n <<= 1;
  return n;
}

/* The layout formula: fills g's geometry (total_size, nentries, nbuckets,
 * nslots, nleases, and each region's offset; data_size, 0 when no room is
 * left). */
static void layout(uint64_t total, uint32_t nentries, uint32_t nbuckets,
                   shm_header *g) {
  g->total_size = total;
  g->nentries = nentries;
  g->nbuckets = nbuckets;
  g->nslots = SHM_SLOTS;
  g->nleases = lease_count(nentries);
  g->entries_off = align_up(sizeof(shm_header), SHM_PAGE);
  g->buckets_off = g->entries_off + (uint64_t)nentries * sizeof(shm_entry);
  g->slots_off =
      align_up(g->buckets_off + (uint64_t)nbuckets * sizeof(uint32_t), 64);
  g->leases_off = align_up(g->slots_off + SHM_SLOTS * sizeof(uint64_t), 64);
  g->data_off = align_up(
      g->leases_off + (uint64_t)g->nleases * sizeof(shm_lease), SHM_PAGE);
  g->data_size = g->data_off < total ? total - g->data_off : 0;
}

/* Whether the geometry of a (a header's checked copy) is the formula's
 * for its own total size and counts. */
static int geometry_ok(const shm_header *a) {
  shm_header w;
  uint64_t nb = a->nbuckets, ne = a->nentries;
  if (ne < 1 || ne > (1u << 24) || nb < ne || (nb & (nb - 1)) != 0)
    return 0;
  layout(a->total_size, a->nentries, a->nbuckets, &w);
  return a->entries_off == w.entries_off && a->buckets_off == w.buckets_off &&
         a->slots_off == w.slots_off && a->nslots == w.nslots &&
         a->leases_off == w.leases_off && a->nleases == w.nleases &&
         a->data_off == w.data_off && a->data_off < a->total_size &&
         a->data_size == w.data_size;
}

/* --------------------------------------------------- format and identity */

/* Lays out a fresh segment of total bytes: geometry, an initialised robust
 * process-shared mutex, empty lists.  The magic goes last. */
static int segment_init(shm_store *s, uint64_t total) {
  shm_header *h = (shm_header *)s->map;
  memset(h, 0, sizeof(*h));
  h->magic = SHM_INIT_MAGIC; /* until the end: unfinished */
  uint32_t nent, nb;
  entry_counts(total, &nent, &nb);
  layout(total, nent, nb, h);
  if (h->data_off + SHM_MIN_DATA > total)
    return encache_store_fail(&s->base, ENCACHE_EINVAL,
                              "%s: size %" PRIu64 " is too small",
                              s->base.url, total);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&h->lock, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0)
    return encache_store_fail(&s->base, -rc, "%s: mutex init: %s",
                              s->base.url, strerror(rc));
  shm_entry *entries = (shm_entry *)(s->map + h->entries_off);
  memset(entries, 0, nent * sizeof(shm_entry));
  for (uint32_t i = 0; i < nent; i++) {
    entries[i].hnext = i + 2 <= nent ? i + 2 : 0;
    entries[i].check = encache__shm_entry_check(&entries[i], i + 1);
  }
  h->free_first = 1;
  memset(s->map + h->buckets_off, 0, nb * sizeof(uint32_t));
  memset(s->map + h->slots_off, 0, SHM_SLOTS * sizeof(uint64_t));
  memset(s->map + h->leases_off, 0, h->nleases * sizeof(shm_lease)); /* free */
  h->format = SHM_FORMAT;
  __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
  return 0;
}

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
    return encache_store_fail(&s->base, ENCACHE_EFORMAT,
                              "%s: not an encache segment (bad magic "
                              "0x%016" PRIx64 ")", u, h->magic);
  if (h->format != SHM_FORMAT)
    return encache_store_fail(
        &s->base, ENCACHE_EFORMAT,
        "%s: segment format 0x%016" PRIx64 " (layout version %u), this "
        "library uses 0x%016" PRIx64 " (version %u): destroy the segment or "
        "use a matching encache",
        u, h->format, (unsigned)(h->format >> 56), (uint64_t)SHM_FORMAT,
        SHM_VERSION);
  if (h->total_size != file_size || !geometry_ok(h))
    return encache_store_fail(&s->base, ENCACHE_EFORMAT,
                              "%s: corrupted segment header (geometry does "
                              "not match a %" PRIu64 "-byte segment): "
                              DESTROY_HINT, u, file_size, s->name);
  if (encache__shm_lock_damaged(&((shm_header *)s->map)->lock))
    return encache_store_fail(&s->base, ENCACHE_EFORMAT,
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
  s->leases = (shm_lease *)(s->map + g->leases_off);
  s->nleases = g->nleases;
}

int encache__shm_test_layout(encache_store *st, encache__shm_layout *out) {
  shm_store *s = encache__shm_handle(st);
  if (s == NULL || s->h == NULL)
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
  out->leases_off = (uint64_t)((unsigned char *)s->leases - s->map);
  out->lease_size = sizeof(shm_lease);
  out->nleases = s->nleases;
  return 0;
}

/* ------------------------------------------------------ create and attach */

/* Waits until the file holds a finished segment, or this opener holds its
 * flock (*locked = 1; the caller unlocks it, also on failure).  Returns
 * the file's size and first word in *size and *magic.  A creator is
 * waited for while its file grows, within a bound that grows with its
 * size (reserving memory takes time). */
static int wait_finished(shm_store *s, uint64_t *size, uint64_t *magic,
                         int *locked) {
  struct stat sb;
  const char *u = s->base.url;
  uint64_t start = mono_ms();
  blkcnt_t blocks = -1;
  for (;;) {
    *magic = 0;
    if (fstat(s->fd, &sb) != 0 ||
        ((*size = (uint64_t)sb.st_size) >= sizeof(*magic) &&
         pread(s->fd, magic, sizeof(*magic), 0) != (ssize_t)sizeof(*magic)))
      return encache_store_fail(&s->base, -errno, "%s: %s", u,
                                strerror(errno));
    if ((*magic == SHM_MAGIC && *size >= sizeof(shm_header)) || *locked)
      return 0;
    if (flock(s->fd, LOCK_EX | LOCK_NB) == 0) {
      *locked = 1; /* look again, under the flock */
      continue;
    }
    if (errno != EWOULDBLOCK && errno != EINTR)
      return encache_store_fail(&s->base, -errno, "%s: flock: %s", u,
                                strerror(errno));
    if (sb.st_blocks != blocks) { /* the creator is still reserving memory */
      blocks = sb.st_blocks;
      start = mono_ms();
    }
    uint64_t bound = SHM_OPEN_WAIT_MS + 8 * (*size >> 20);
    if (mono_ms() - start >= bound)
      return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                                "%s: another process has been creating the "
                                "segment for over %" PRIu64 " ms without "
                                "progress (is it stopped?)", u, bound);
    usleep(1000);
  }
}

/* Whether the file (size bytes, first word magic) is to be made afresh:
 * empty, or left unfinished by a creator that died (the caller holds the
 * flock that creator held).  Anything else but a finished segment is
 * refused. */
static int must_create(shm_store *s, uint64_t size, uint64_t magic,
                       int *fresh) {
  *fresh = 0;
  if (magic == SHM_MAGIC && size >= sizeof(shm_header))
    return 0;
  if (size == 0) {
    *fresh = 1;
    return 0;
  }
  if (magic == SHM_INIT_MAGIC) {
    /* Its creator held the flock we now hold: it died mid-creation.  It
     * is remade unless a handle has it open (then it is damaged). */
    if (encache__shm_slots_held(s->fd, size))
      return encache_store_fail(&s->base, ENCACHE_EFORMAT,
                                "%s: the segment is marked unfinished but "
                                "is in use: " DESTROY_HINT,
                                s->base.url, s->name);
    *fresh = 1;
    return 0;
  }
  return encache_store_fail(&s->base, ENCACHE_EFORMAT,
                            "%s: not an encache segment, or its header is "
                            "damaged (%" PRIu64 " bytes, magic 0x%016" PRIx64
                            "): " DESTROY_HINT,
                            s->base.url, size, magic, s->name);
}

/* Sizes the file for a new segment of create_size bytes (rounded up to a
 * page, in *size), marked unfinished, and reserves its memory. */
static int create_file(shm_store *s, uint64_t create_size, uint64_t *size) {
  const char *u = s->base.url;
  uint64_t init = SHM_INIT_MAGIC;
  *size = align_up(create_size, SHM_PAGE);
  int rc = encache__shm_own_new_file(s);
  if (rc < 0)
    return rc;
  if (ftruncate(s->fd, 0) != 0 ||
      pwrite(s->fd, &init, sizeof(init), 0) != (ssize_t)sizeof(init) ||
      ftruncate(s->fd, (off_t)*size) != 0)
    return encache_store_fail(&s->base, -errno, "%s: cannot create: %s", u,
                              strerror(errno));
  /* Reserve the memory now: a full /dev/shm must fail here, cleanly, not
   * with SIGBUS on some later write. */
  int fr = posix_fallocate(s->fd, 0, (off_t)*size);
  if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) {
    rc = encache_store_fail(&s->base, -fr,
                                 "%s: cannot reserve %" PRIu64 " bytes: %s",
                                 u, *size, strerror(fr));
    if (ftruncate(s->fd, 0) != 0) { /* leave it empty, to be remade */
    }
    return rc;
  }
  return 0;
}

/* Maps the segment of size bytes, lays it out (fresh) or checks it, and
 * binds the handle to it. */
static int map_segment(shm_store *s, uint64_t size, int fresh) {
  const char *u = s->base.url;
  if (size > SIZE_MAX)
    return encache_store_fail(&s->base, ENCACHE_EFORMAT, "%s: too large", u);
  /* Populate the page tables now: first-touch faults would otherwise
   * cost every early write of a large segment about as much as its copy.
   * Small segments (tests, the fuzzer) are cheaper to fault in lazily. */
  int populate = size >= (64ull << 20) ? MAP_POPULATE : 0;
  void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | populate, s->fd, 0);
  if (map == MAP_FAILED)
    return encache_store_fail(&s->base, -errno, "%s: mmap: %s", u,
                              strerror(errno));
  s->map = map;
  s->map_size = (size_t)size;
  shm_header g;
  int rc = fresh ? segment_init(s, size) : segment_check(s, size, &g);
  if (rc < 0)
    return rc;
  if (fresh)
    header_copy(s, &g);
  bind_geometry(s, &g);
  encache__shm_take_slot(s);
  /* Validate the mutable structure at the first lock, not here: an open
   * must not wait on a lock whose holder may be stopped. */
  s->validate_pending = !fresh;
  return 0;
}

/* A finished segment (real magic) is never remade, so attaching to one
 * needs no flock; only creation does.  create_size 0 (the URL's
 * create=no) attaches to a finished segment only. */
int encache__shm_attach(shm_store *s, uint64_t create_size) {
  uint64_t size = 0, magic = 0;
  int locked = 0, fresh = 0;
  int rc = wait_finished(s, &size, &magic, &locked);
  if (rc == 0)
    rc = must_create(s, size, magic, &fresh);
  if (rc == 0 && fresh && create_size == 0) /* create=no */
    rc = encache_store_fail(&s->base, ENCACHE_ENOENT,
                            "%s: no such segment \"%s\": its file is empty "
                            "or unfinished (create=no opens only a finished "
                            "one)", s->base.url, s->name);
  else if (rc == 0 && fresh)
    rc = create_file(s, create_size, &size);
  if (rc == 0)
    rc = map_segment(s, size, fresh);
  if (locked)
    flock(s->fd, LOCK_UN);
  return rc;
}
