/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fleet.c: the host-local statistics registry.  Each engine handle takes a
 * slot of a POSIX shared-memory object ("/" + the stats_segment option)
 * at open and counts into it for its life, so that `encache stats`,
 * `encache exporter` and `encache top` read every encoder of the host
 * without touching their processes.  It is separate from the Store: it
 * works the same whatever the Store is (shm, Redis, Mooncake, tiered).
 *
 * Layout: a header (magic, a format word that encodes the layout version
 * and the sizes of the shared types, the slot count) and nslots slots of
 * FLEET_SLOT_SIZE bytes, each on cache lines of its own.  A slot holds the
 * owner's identity (pid, start time, encoder label, Store URL, namespace),
 * its encache_stats (in room for any later, larger version of the struct)
 * and two histograms.  Version 1 is the only one; a segment of another
 * version or format is refused with a message (never written to) while
 * a process uses it, and made afresh by the next opener once none does.
 *
 * Ownership and liveness: a slot belongs to whoever holds the
 * open-file-description lock (F_OFD_SETLK) on the slot's first byte of the
 * segment file.  The kernel drops that lock when the owner closes its
 * descriptor or dies (SIGKILL included), in any pid namespace, so a dead
 * owner's slot is free for the next claimant with nothing to repair, and
 * a reader tells a live slot from a dead one by testing the lock (and
 * frees the dead one when it may write).  Locks of one process on
 * distinct descriptors conflict too, so each handle has its own.
 *
 * Concurrency: the owner's counters are updated with relaxed atomics (one
 * atomic add per count, no lock: the same cost as counting in the
 * handle's own memory).  The identity is written under a sequence number
 * (odd while it changes); a reader copies a slot and keeps the copy only
 * when the number was even and unchanged.  The segment is created under
 * flock(2), its magic written last, like the shm Store's.
 *
 * Trust: the registry belongs to one user (default name "encache.fleet."
 * + the euid), created 0600; a writer maps it and counts into the mapping,
 * so it publishes only into a file of its own user that nobody else may
 * write (another could truncate it under the mapping: SIGBUS), and a
 * reader trusts the same files only (another user's could forge rows).
 * Both open it without blocking or following a link, and refuse anything
 * but a regular file: a FIFO planted at its name would hang them.  Readers
 * never map it: they copy slots with pread(), so a file cut short under
 * them is a short read.  A header is trusted only when its slot count is
 * at most FLEET_MAX_SLOTS and the file is exactly that layout's size.
 *
 * (Over 600 lines: the layout, its checks, the writer and the reader share
 * the private slot types and belong in one file.)
 */
#include "fleet.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FLEET_MAGIC UINT64_C(0x7465656c66636e65)      /* "encflee t" */
#define FLEET_INIT_MAGIC UINT64_C(0x74696e6966636e65) /* unfinished */
#define FLEET_VERSION 1
#define FLEET_DEFAULT_SLOTS 256
#define FLEET_STATS_ROOM 512
#define FLEET_NAME_MAX 200
/* The most slots a registry may have (the real layout has 256): a header
 * that claims more is damaged or crafted, and would make every opener
 * walk (and a reader allocate for) millions of slots. */
#define FLEET_MAX_SLOTS 4096

unsigned encache__fleet_slots = FLEET_DEFAULT_SLOTS;

enum { SLOT_FREE = 0, SLOT_LIVE = 1 };

typedef struct fleet_header {
  uint64_t magic;
  uint64_t format; /* FLEET_FORMAT */
  uint32_t nslots;
  uint32_t slot_size;
  unsigned char reserved[40];
} fleet_header;

/* Who holds a slot: written once per claim, under the slot's seq. */
typedef struct fleet_ident {
  int64_t pid;
  uint64_t start_time;
  char encoder[128];
  char store[256];
  char ns[256];
} fleet_ident;

#define IDENT_WORDS (sizeof(fleet_ident) / 8)
#define HIST_WORDS (2 * sizeof(encache_histogram) / 8)

/* Invariant: while state is SLOT_LIVE, the owner holds the slot's lock.
 * Every field is accessed with atomics only: the owner's counters field
 * by field (STAT_ADD, fleet_observe), everything else word by word
 * through the unions' uint64_t views. */
typedef struct fleet_slot {
  uint64_t seq;   /* odd while the identity changes */
  uint32_t state; /* SLOT_FREE or SLOT_LIVE */
  uint32_t unused;
  uint64_t bytes_written;
  union {
    fleet_ident id;
    uint64_t w[IDENT_WORDS];
  } ident;
  union {
    encache_stats stats; /* the owner's counters (engine.h's STAT_ADD) */
    uint64_t room[FLEET_STATS_ROOM / 8];
  } u;
  union {
    encache_histogram hist[2]; /* count unused: the buckets' sum */
    uint64_t w[HIST_WORDS];
  } h;
} __attribute__((aligned(64))) fleet_slot;

_Static_assert(sizeof(fleet_ident) % 8 == 0 &&
                   sizeof(encache_histogram) % 8 == 0 &&
                   sizeof(encache_stats) % 8 == 0,
               "fleet: the slot's parts are whole words");

_Static_assert(sizeof(encache_stats) <= FLEET_STATS_ROOM,
               "fleet: encache_stats outgrew the slot's room: a new version");
_Static_assert(sizeof(fleet_header) == 64, "fleet: the header is one line");

/* Version, slot size, header size, stats room: any change is refused. */
#define FLEET_FORMAT                                                         \
  (((uint64_t)FLEET_VERSION << 48) | ((uint64_t)sizeof(fleet_slot) << 16) |  \
   (uint64_t)sizeof(fleet_header))

struct encache__fleet {
  int fd;
  unsigned char *base;
  size_t size;
  fleet_slot *slot;
};

/* An opened segment. */
typedef struct seg {
  int fd;
  unsigned char *base;
  size_t size;
  unsigned nslots;
} seg;

static fleet_slot *slot_at(const seg *s, unsigned i) {
  return (fleet_slot *)(s->base + sizeof(fleet_header) +
                        (size_t)i * sizeof(fleet_slot));
}

static off_t slot_off(unsigned i) {
  return (off_t)(sizeof(fleet_header) + (size_t)i * sizeof(fleet_slot));
}

/* "/" + name in path: 0, or ENCACHE_EURL when name is not one (message
 * in why). */
static int seg_path(const char *name, char *path, size_t n, char *why,
                    size_t whysz) {
  size_t len = strlen(name);
  int ok = len > 0 && len <= FLEET_NAME_MAX && name[0] != '.';
  for (size_t i = 0; ok && i < len; i++)
    ok = (name[i] >= 'a' && name[i] <= 'z') ||
         (name[i] >= 'A' && name[i] <= 'Z') ||
         (name[i] >= '0' && name[i] <= '9') || strchr("._-", name[i]);
  if (!ok) {
    snprintf(why, whysz, "not a segment name (1 to %d of A-Z a-z 0-9 . _ -, "
             "not starting with '.')", FLEET_NAME_MAX);
    return ENCACHE_EURL;
  }
  snprintf(path, n, "/%s", name);
  return 0;
}

/* Lays a new segment out (under the flock); the magic goes last.  A file
 * is never made shorter: a process of another version may still map it
 * (it would die of SIGBUS past the end); a longer one gets as many slots
 * as fill it (its size is then exactly the layout's, as seg_check wants). */
static int seg_init(seg *s, char *why, size_t whysz) {
  unsigned n = encache__fleet_slots ? encache__fleet_slots : 1;
  if (n > FLEET_MAX_SLOTS)
    n = FLEET_MAX_SLOTS;
  size_t size = sizeof(fleet_header) + (size_t)n * sizeof(fleet_slot);
  struct stat sb;
  if (fstat(s->fd, &sb) == 0 && (size_t)sb.st_size > size) {
    size_t body = (size_t)sb.st_size - sizeof(fleet_header);
    size_t want = (body + sizeof(fleet_slot) - 1) / sizeof(fleet_slot);
    if (want > FLEET_MAX_SLOTS) {
      snprintf(why, whysz, "an unused file of %lld bytes, larger than a "
               "registry of %d slots may be: remove it",
               (long long)sb.st_size, FLEET_MAX_SLOTS);
      return ENCACHE_EFORMAT;
    }
    n = (unsigned)want;
    size = sizeof(fleet_header) + (size_t)n * sizeof(fleet_slot);
  }
  if (ftruncate(s->fd, (off_t)size) < 0) {
    int e = errno;
    snprintf(why, whysz, "cannot size it: %s", strerror(e));
    return -e;
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    snprintf(why, whysz, "cannot map it: %s", strerror(e));
    return -e;
  }
  fleet_header *h = p;
  h->magic = FLEET_INIT_MAGIC;
  memset((unsigned char *)p + sizeof(*h), 0, size - sizeof(*h));
  h->format = FLEET_FORMAT;
  h->nslots = n;
  h->slot_size = (uint32_t)sizeof(fleet_slot);
  __atomic_store_n(&h->magic, FLEET_MAGIC, __ATOMIC_RELEASE);
  munmap(p, size);
  return 0;
}

/* Checks the header of a segment of `size` bytes (under the flock). */
static int seg_check(seg *s, size_t size, char *why, size_t whysz) {
  fleet_header h;
  memset(&h, 0, sizeof(h));
  if (size < sizeof(h) || pread(s->fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
      h.magic != FLEET_MAGIC) {
    snprintf(why, whysz, "not an encache statistics registry (%zu bytes, "
             "magic 0x%016" PRIx64 ")", size, h.magic);
    return ENCACHE_EFORMAT;
  }
  if (h.format >> 48 != FLEET_VERSION) {
    snprintf(why, whysz, "layout version %u, but this library reads version "
             "%u only (a newer or older encache made it; remove it when no "
             "encoder uses it)", (unsigned)(h.format >> 48), FLEET_VERSION);
    return ENCACHE_EFORMAT;
  }
  if (h.format != FLEET_FORMAT || h.slot_size != sizeof(fleet_slot) ||
      h.nslots == 0 || h.nslots > FLEET_MAX_SLOTS ||
      size != sizeof(h) + (size_t)h.nslots * sizeof(fleet_slot)) {
    snprintf(why, whysz, "damaged header (format 0x%016" PRIx64 ", %u slots "
             "of %u bytes in %zu bytes; expected format 0x%016" PRIx64 ", 1 "
             "to %d slots, the file exactly their size)", h.format,
             h.nslots, h.slot_size, size, (uint64_t)FLEET_FORMAT,
             FLEET_MAX_SLOTS);
    return ENCACHE_EFORMAT;
  }
  s->nslots = h.nslots;
  return 0;
}

/* Takes the segment's flock (held while it is created or checked, a few
 * system calls), waiting 100 ms at most: a creator stopped in the middle
 * (or a process of the same user holding the lock) must not hang every
 * encoder's open.  Only the registry's owner can open it (0600). */
static int seg_flock(int fd, int op) {
  for (int tries = 0;; tries++) {
    if (flock(fd, op | LOCK_NB) == 0)
      return 0;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return -errno;
    if (tries == 100)
      return -EWOULDBLOCK;
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Whether a process holds an OFD lock on some byte of the file: a slot in
 * use, whatever the layout version (every version holds such a lock for
 * each slot it uses: the one rule that no later version may change). */
static int seg_in_use(int fd) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET; /* l_start 0, l_len 0: the whole file */
  return fcntl(fd, F_OFD_GETLK, &fl) < 0 || fl.l_type != F_UNLCK;
}

/* The segment's size in *size, after it was laid out when it is to be
 * (under the flock): a new or unfinished one (its creator died), and, for
 * a creator, a registry of another layout version or format that no
 * process uses (encoders of an older encache all gone).  A file that is
 * not a registry (another magic) is never touched. */
static int seg_prepare(seg *s, int create, size_t *size, char *why,
                       size_t whysz) {
  uint64_t magic = 0;
  if (pread(s->fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))
    magic = 0; /* empty (just created) or cut short */
  int rc = 0;
  if (create && (magic == FLEET_INIT_MAGIC || magic == 0))
    rc = seg_init(s, why, whysz);
  for (int pass = 0; rc == 0 && pass < 2; pass++) {
    struct stat sb;
    if (fstat(s->fd, &sb) < 0) {
      rc = -errno;
      snprintf(why, whysz, "%s", strerror(-rc));
      break;
    }
    *size = (size_t)sb.st_size;
    rc = seg_check(s, *size, why, whysz);
    if (rc == ENCACHE_EFORMAT && pass == 0 && create &&
        magic == FLEET_MAGIC && !seg_in_use(s->fd))
      rc = seg_init(s, why, whysz); /* ours, unused: made afresh */
    else
      break;
  }
  return rc;
}

/* What a file that is not a regular file is, for messages. */
static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)   ? "a FIFO"
         : S_ISDIR(m)  ? "a directory"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

/* Only a regular file of this process's user that nobody else may write
 * is a registry: a writer maps it (another user could truncate it under
 * the mapping: SIGBUS, or read what it is told), a reader prints what it
 * holds (another user could forge its rows).  The caller opened it with
 * O_NONBLOCK and O_NOFOLLOW, so that a FIFO or a link planted at its name
 * is seen here, not waited on or followed.  0, or a negative code with
 * why (what the file is, who owns it, what to do). */
static int seg_trusted(int fd, const char *path, char *why, size_t whysz) {
  struct stat sb;
  if (fstat(fd, &sb) < 0) {
    int e = errno;
    snprintf(why, whysz, "%s", strerror(e));
    return -e;
  }
  if (!S_ISREG(sb.st_mode)) {
    snprintf(why, whysz, "%s, not a registry: refused (remove it: rm "
             "/dev/shm%s, once you know who made it)", file_kind(sb.st_mode),
             path);
    return ENCACHE_EFORMAT;
  }
  if (sb.st_uid != geteuid()) {
    snprintf(why, whysz, "owned by uid %u, not by this process's user (uid "
             "%u): refused (a registry is one user's: remove it, or read it "
             "as its owner)", (unsigned)sb.st_uid, (unsigned)geteuid());
    return -EPERM;
  }
  if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, whysz, "writable by group or others (mode 0%03o): refused "
             "(it must be 0600: chmod 600 /dev/shm%s)",
             (unsigned)(sb.st_mode & 0777), path);
    return -EPERM;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return 0;
}

/* shm_open() of path that never blocks (a FIFO) nor follows a link:
 * the descriptor, or -1 with why and *rc. */
static int seg_shm_open(const char *path, int create, int *rc, char *why,
                        size_t whysz) {
  int flags = O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC;
  int fd = create ? shm_open(path, O_RDWR | O_CREAT | flags, 0600)
                  : shm_open(path, O_RDONLY | flags, 0);
  if (fd >= 0)
    return fd;
  int e = errno;
  if (e == ENOENT) {
    snprintf(why, whysz, "no such registry");
    *rc = ENCACHE_ENOENT;
  } else if (e == ELOOP) {
    snprintf(why, whysz, "a symbolic link, not a registry: refused (remove "
             "it: rm /dev/shm%s, once you know who made it)", path);
    *rc = ENCACHE_EFORMAT;
  } else {
    snprintf(why, whysz, "%s", strerror(e));
    *rc = -e;
  }
  return -1;
}

/* Opens the segment at path: a writer (create set) creates it (0600) and
 * maps it; a reader opens it read-only and copies slots with pread(), so
 * that a file cut short under it is a short read, never SIGBUS.  Both
 * refuse a file that is not their user's own (seg_trusted). */
static int seg_open(seg *s, const char *path, int create, char *why,
                    size_t whysz) {
  memset(s, 0, sizeof(*s));
  int rc = 0;
  if ((s->fd = seg_shm_open(path, create, &rc, why, whysz)) < 0)
    return rc;
  size_t size = 0;
  rc = seg_trusted(s->fd, path, why, whysz);
  if (rc == 0 && (rc = seg_flock(s->fd, create ? LOCK_EX : LOCK_SH)) < 0)
    snprintf(why, whysz, "%s", rc == -EWOULDBLOCK
                                   ? "busy: another process holds its lock"
                                   : strerror(-rc));
  else if (rc == 0)
    rc = seg_prepare(s, create, &size, why, whysz);
  flock(s->fd, LOCK_UN);
  s->size = size;
  if (rc == 0 && create) {
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd,
                   0);
    if (p == MAP_FAILED)
      snprintf(why, whysz, "cannot map it: %s", strerror(-(rc = -errno)));
    else
      s->base = p;
  }
  if (rc != 0)
    close(s->fd);
  return rc;
}

static void seg_close(seg *s) {
  if (s->base != NULL)
    munmap(s->base, s->size);
  close(s->fd);
}

/* The lock of slot i, as fcntl() takes it (l_pid 0, as OFD locks need). */
static struct flock slot_flock(unsigned i, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = slot_off(i);
  fl.l_len = 1;
  return fl;
}

/* Sets (F_WRLCK) or drops (F_UNLCK) the lock of slot i: 0, or -errno
 * (-EAGAIN or -EACCES: another holds it). */
static int slot_lock(int fd, unsigned i, short type) {
  struct flock fl = slot_flock(i, type);
  return fcntl(fd, F_OFD_SETLK, &fl) < 0 ? -errno : 0;
}

/* Whether another descriptor holds the lock of slot i. */
static int slot_locked(int fd, unsigned i) {
  struct flock fl = slot_flock(i, F_WRLCK);
  return fcntl(fd, F_OFD_GETLK, &fl) < 0 || fl.l_type != F_UNLCK;
}

/* Marks a slot whose lock the caller holds free (a reader mid-copy sees
 * the sequence number change). */
static void slot_free(fleet_slot *sl) {
  uint64_t q = __atomic_load_n(&sl->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&sl->state, SLOT_FREE, __ATOMIC_RELEASE);
  __atomic_store_n(&sl->seq, (q | 1) + 1, __ATOMIC_RELEASE);
}

/* The start time of this process, clock ticks after boot (the 22nd field
 * of /proc/self/stat), or 0. */
static uint64_t start_time(void) {
  char buf[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
  if (fd >= 0)
    close(fd);
  if (n <= 0)
    return 0;
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long long v = 0;
  /* After ") ": state, then fields 4 to 21, then starttime. */
  if (p == NULL ||
      sscanf(p + 2, "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                    "%*s %*s %*s %*s %*s %llu", &v) != 1)
    return 0;
  return v;
}

/* Seqlock without fences (ThreadSanitizer refuses them): the writer's
 * stores after the odd seq are release stores, so none is seen before
 * it (the reader copies with pread(): slot_read). */
static void put_words(uint64_t *dst, const void *src, size_t n) {
  for (size_t k = 0; k < n; k++) {
    uint64_t w = 0;
    if (src != NULL)
      memcpy(&w, (const unsigned char *)src + k * 8, 8);
    __atomic_store_n(&dst[k], w, __ATOMIC_RELEASE);
  }
}

/* Copies src into dst (cap bytes), cut when longer at a UTF-8 character
 * boundary: a label cut in the middle of a character would be invalid
 * UTF-8 in every reader's output. */
static void copy_cut(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) {
    n = cap - 1;
    while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
      n--; /* src[n], the first byte left out, continues a character */
  }
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Writes the identity of a slot the caller holds, counters zeroed. */
static void slot_fill(fleet_slot *sl, const char *encoder, const char *store,
                      const char *ns) {
  fleet_ident id;
  memset(&id, 0, sizeof(id));
  id.pid = (int64_t)getpid();
  id.start_time = start_time();
  if (encoder != NULL && encoder[0] != '\0') {
    copy_cut(id.encoder, sizeof(id.encoder), encoder);
  } else {
    char host[64];
    if (gethostname(host, sizeof(host)) < 0)
      snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    snprintf(id.encoder, sizeof(id.encoder), "%d@%s", (int)getpid(), host);
  }
  copy_cut(id.store, sizeof(id.store), store);
  copy_cut(id.ns, sizeof(id.ns), ns);
  encache_stats zero;
  memset(&zero, 0, sizeof(zero));
  zero.size = sizeof(zero);
  uint64_t q = __atomic_load_n(&sl->seq, __ATOMIC_RELAXED) | 1; /* odd */
  __atomic_store_n(&sl->seq, q, __ATOMIC_RELAXED);
  __atomic_store_n(&sl->state, SLOT_FREE, __ATOMIC_RELEASE);
  __atomic_store_n(&sl->bytes_written, 0, __ATOMIC_RELEASE);
  put_words(sl->ident.w, &id, IDENT_WORDS);
  put_words(sl->u.room, NULL, FLEET_STATS_ROOM / 8);
  put_words(sl->u.room, &zero, sizeof(zero) / 8);
  put_words(sl->h.w, NULL, HIST_WORDS);
  __atomic_store_n(&sl->seq, q + 1, __ATOMIC_RELEASE);
  __atomic_store_n(&sl->state, SLOT_LIVE, __ATOMIC_RELEASE);
}

const char *encache__fleet_default(char *buf, size_t n) {
  snprintf(buf, n, "encache.fleet.%u", (unsigned)geteuid());
  return buf;
}

static void warn(void (*log)(void *, const char *), void *log_ctx,
                 const char *segment, const char *why) {
  char msg[512];
  if (log == NULL)
    return;
  snprintf(msg, sizeof(msg), "encache: statistics registry \"%s\": %s; this "
           "handle's counters are not published (stats_segment)", segment,
           why);
  log(log_ctx, msg);
}

encache__fleet *encache__fleet_attach(const char *segment, const char *encoder,
                                      const char *store, const char *ns,
                                      void (*log)(void *, const char *),
                                      void *log_ctx) {
  if (segment == NULL || segment[0] == '\0' || strcmp(segment, "off") == 0)
    return NULL;
  char path[FLEET_NAME_MAX + 2], why[384];
  seg s;
  if (seg_path(segment, path, sizeof(path), why, sizeof(why)) < 0 ||
      seg_open(&s, path, 1, why, sizeof(why)) < 0) {
    warn(log, log_ctx, segment, why);
    return NULL;
  }
  encache__fleet *f = encache__calloc(1, sizeof(*f));
  int err = 0;
  for (unsigned i = 0; f != NULL && i < s.nslots && err == 0; i++) {
    int rc = slot_lock(s.fd, i, F_WRLCK);
    if (rc != 0 && rc != -EAGAIN && rc != -EACCES)
      err = rc; /* not "taken": the locks do not work here */
    if (rc == 0) {
      f->fd = s.fd;
      f->base = s.base;
      f->size = s.size;
      f->slot = slot_at(&s, i);
      slot_fill(f->slot, encoder, store, ns);
      return f;
    }
  }
  if (f == NULL)
    snprintf(why, sizeof(why), "out of memory");
  else if (err != 0)
    snprintf(why, sizeof(why), "cannot lock a slot: %s", strerror(-err));
  else
    snprintf(why, sizeof(why), "full: its %u slots are taken by live "
             "handles", s.nslots);
  warn(log, log_ctx, segment, why);
  encache__free(f);
  seg_close(&s);
  return NULL;
}

encache_stats *encache__fleet_stats(encache__fleet *f) {
  return &f->slot->u.stats;
}

void encache__fleet_detach(encache__fleet *f) {
  if (f == NULL)
    return;
  slot_free(f->slot);
  /* Closing the descriptor drops its lock, the last one. */
  munmap(f->base, f->size);
  close(f->fd);
  encache__free(f);
}

uint64_t encache__fleet_clock(const encache__fleet *f) {
  if (f == NULL)
    return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  return ns != 0 ? ns : 1;
}

unsigned encache__fleet_bucket(uint64_t ns) {
  uint64_t us = ns / 1000 + (ns % 1000 != 0); /* rounded up */
  unsigned i = us <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(us - 1);
  return i < ENCACHE_HISTOGRAM_BUCKETS ? i : ENCACHE_HISTOGRAM_BUCKETS - 1;
}

void encache__fleet_observe(encache__fleet *f, int which, uint64_t t0,
                            uint64_t bytes) {
  if (f == NULL || t0 == 0)
    return;
  uint64_t ns = encache__fleet_clock(f) - t0;
  unsigned i = encache__fleet_bucket(ns);
  encache_histogram *h = &f->slot->h.hist[which];
  __atomic_add_fetch(&h->bucket[i], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&h->sum_ns, ns, __ATOMIC_RELAXED);
  if (bytes != 0)
    __atomic_add_fetch(&f->slot->bytes_written, bytes, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------- reading */

/* What a reader copies out of a slot. */
typedef struct slot_copy {
  fleet_ident id;
  uint64_t bytes_written;
  encache_stats stats;
  encache_histogram hist[2];
} slot_copy;

/* The 8 bytes at off of the file, or 1 (odd: "changing") on a short read. */
static uint64_t word_at(int fd, off_t off) {
  uint64_t w;
  return pread(fd, &w, sizeof(w), off) == (ssize_t)sizeof(w) ? w : 1;
}

/* Copies live slot i into *c: 1, or 0 when it is not live (its owner is
 * dead, or it changed while copied).  Through pread() from the
 * descriptor, not a mapping: a file cut short under the reader is a short
 * read (the slot skipped), never SIGBUS.  The seqlock's two looks at seq
 * are reads of their own, around the copy (system calls: ordered). */
static int slot_read(seg *s, unsigned i, fleet_slot *buf, slot_copy *c) {
  off_t off = slot_off(i);
  uint64_t q = word_at(s->fd, off);
  if ((q & 1) || !slot_locked(s->fd, i) ||
      pread(s->fd, buf, sizeof(*buf), off) != (ssize_t)sizeof(*buf) ||
      buf->state != SLOT_LIVE)
    return 0;
  memcpy(&c->id, &buf->ident.id, sizeof(c->id));
  c->id.encoder[sizeof(c->id.encoder) - 1] =
      c->id.store[sizeof(c->id.store) - 1] =
          c->id.ns[sizeof(c->id.ns) - 1] = '\0';
  c->bytes_written = buf->bytes_written;
  memcpy(&c->stats, buf->u.room, sizeof(c->stats));
  c->stats.size = sizeof(c->stats);
  memcpy(c->hist, buf->h.hist, sizeof(c->hist));
  for (int h = 0; h < 2; h++) { /* count = the buckets' sum, consistent */
    c->hist[h].count = 0;
    for (int b = 0; b < ENCACHE_HISTOGRAM_BUCKETS; b++)
      c->hist[h].count += c->hist[h].bucket[b];
  }
  return word_at(s->fd, off) == q;
}

int encache_fleet_read(const char *segment, encache_fleet_fn fn, void *ctx) {
  if (fn == NULL)
    return encache__thread_failed(ENCACHE_EINVAL, "encache_fleet_read: fn "
                                  "is NULL");
  char path[FLEET_NAME_MAX + 2], why[384], def[64];
  if (segment == NULL || segment[0] == '\0')
    segment = encache__fleet_default(def, sizeof(def));
  seg s;
  if (seg_path(segment, path, sizeof(path), why, sizeof(why)) < 0)
    return encache__thread_failed(ENCACHE_EURL, "statistics registry "
                                  "\"%s\": %s", segment, why);
  int rc = seg_open(&s, path, 0, why, sizeof(why));
  if (rc < 0)
    return encache__thread_failed(rc, "statistics registry \"%s\": %s",
                                  segment, why);
  slot_copy *c = encache__malloc(sizeof(*c));
  fleet_slot *buf = encache__aligned_alloc(64, sizeof(*buf)); /* its type's */
  int n = c == NULL || buf == NULL
              ? encache__thread_failed(ENCACHE_ENOMEM, "out of memory")
              : 0;
  for (unsigned i = 0; n >= 0 && i < s.nslots; i++) {
    if (!slot_read(&s, i, buf, c))
      continue;
    encache_fleet_entry e = {
        .size = sizeof(e), .pid = c->id.pid, .start_time = c->id.start_time,
        .encoder = c->id.encoder, .store = c->id.store, .ns = c->id.ns,
        .stats = &c->stats, .lookup = &c->hist[ENCACHE__FLEET_LOOKUP],
        .write = &c->hist[ENCACHE__FLEET_WRITE],
        .bytes_written = c->bytes_written, .slot = i};
    n++;
    if (fn(&e, ctx) != 0)
      break;
  }
  encache__free(c);
  encache__aligned_free(buf);
  seg_close(&s);
  return n;
}
