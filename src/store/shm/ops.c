/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ops.c: the shm Store's operations (exists, read, read_split,
 * object_size, write, remove, list, stats, close) and their table (with
 * the leases of lease.c), and the handle's life: its allocation, the
 * process's registry of open handles that fork() needs, its close.
 *
 * Each operation takes the segment lock only to look up or change the
 * structure (index.c, ring.c); object bytes are copied outside it, with
 * their checksum (checksum.c): a reader checks the entry's generation
 * after its copy (the seqlock of shm.h), a writer publishes its entry
 * under the lock again once its copy is complete.
 */
#include "shm.h"

#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Test hooks: read() calls the first between the lookup and the copy,
 * write() the second between the allocation and the copy. */
void (*encache__shm_read_hook)(void);
void (*encache__shm_write_hook)(void);

#define SHM_DEFAULT_LOCK_MS 500u

static int shm_exists(encache_store *st, const char *const *keys, size_t n,
                      int *results) {
  shm_store *s = (shm_store *)st;
  size_t klen;
  shm_entry c;
  int rc = encache__shm_lock(s);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = encache__shm_find(s, keys[i], (uint32_t)klen,
                                     hash_key(keys[i], klen), &c);
    results[i] = e != NULL && c.state == E_READY;
  }
  encache__shm_unlock(s);
  return 0;
}

/* ------------------------------------------------------------------ reads */

/* What a reader noted of an object under the lock, to copy it outside. */
typedef struct read_snap {
  shm_entry *e; /* NULL: nothing to copy (a miss, or replaced while read) */
  uint64_t gen, sum;
  const unsigned char *src;
  uint64_t len;
  int summed;
} read_snap;

/* Under the lock: looks each key up; a miss, a refused key or an object
 * too large gets its result now, a hit its snapshot. */
static void read_lookup(shm_store *s, const char *const *keys, size_t n,
                        size_t split, const size_t *caps, read_snap *snap,
                        int64_t *results) {
  for (size_t i = 0; i < n; i++) {
    size_t klen;
    shm_entry c;
    snap[i].e = NULL;
    if (key_ok(s, keys[i], &klen) < 0) {
      results[i] = ENCACHE_EINVAL;
      continue;
    }
    shm_entry *e = encache__shm_find(s, keys[i], (uint32_t)klen,
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
}

/* Copies object i (snapshot sn) out: its first split bytes to heads[i],
 * the rest to bufs[i]; then checks it (generation, checksum) and sets
 * *result.  Returns 1 when its bytes failed their checksum (damage). */
static int read_copy(read_snap *sn, size_t split, void *const *heads,
                     void *const *bufs, size_t i, int64_t *result) {
  size_t h = sn->len < split ? (size_t)sn->len : split;
  sum_state sum = {0};
  OPTIMISTIC_BEGIN();
  if (h > 0)
    encache__shm_copy_sum(heads[i], sn->src, h, sn->summed ? &sum : NULL);
  encache__shm_copy_sum(bufs[i], sn->src + h, (size_t)sn->len - h,
                        sn->summed ? &sum : NULL);
  OPTIMISTIC_END();
  /* Seqlock check: the copy above must complete before the generation is
   * read again. */
#ifdef ENCACHE_TSAN
  uint64_t gen = __atomic_load_n(&sn->e->gen, __ATOMIC_ACQUIRE);
#else
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  uint64_t gen = __atomic_load_n(&sn->e->gen, __ATOMIC_RELAXED);
#endif
  if (gen != sn->gen) {
    *result = ENCACHE_ENOENT;
    sn->e = NULL; /* replaced while read: not damage */
    return 0;
  }
  if (sn->summed && encache__shm_sum_final(&sum) != sn->sum) {
    *result = ENCACHE_ENOENT; /* damaged: a miss, never served */
    return 1;
  }
  *result = (int64_t)sn->len;
  return 0;
}

/* Drops the objects whose bytes failed their checksum, if they are still
 * what was read (a later copy may have replaced them). */
static void drop_damaged(shm_store *s, const read_snap *snap, size_t n,
                         const int64_t *results) {
  if (encache__shm_lock(s) < 0)
    return; /* the next reader finds them again */
  for (size_t i = 0; i < n; i++) {
    shm_entry *e = snap[i].e;
    if (e != NULL && results[i] == ENCACHE_ENOENT && e->state == E_READY &&
        __atomic_load_n(&e->gen, __ATOMIC_RELAXED) == snap[i].gen) {
      encache__shm_entry_free(s, e);
      s->h->repairs++;
    }
  }
  encache__shm_unlock(s);
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
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int rc = encache__shm_lock(s);
  if (rc < 0)
    goto out;
  read_lookup(s, keys, n, split, caps, snap, results);
  encache__shm_unlock(s);
  if (encache__shm_read_hook != NULL)
    encache__shm_read_hook();
  for (size_t i = 0; i < n; i++)
    if (snap[i].e != NULL)
      damaged += (size_t)read_copy(&snap[i], split, heads, bufs, i,
                                   &results[i]);
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

/* Checks key, takes the lock and finds key's READY entry: returns 0
 * holding the lock, with the entry in *ep and its checked copy in *c; or
 * ENCACHE_ENOENT when there is none, a refused key or a failed lock's
 * error, not holding it. */
static int lock_find_ready(shm_store *s, const char *key, shm_entry **ep,
                           shm_entry *c) {
  size_t klen;
  int rc = key_ok(s, key, &klen);
  if (rc < 0 || (rc = encache__shm_lock(s)) < 0)
    return rc;
  *ep = encache__shm_find(s, key, (uint32_t)klen, hash_key(key, klen), c);
  if (*ep == NULL || c->state != E_READY) {
    encache__shm_unlock(s);
    return ENCACHE_ENOENT;
  }
  return 0;
}

static int shm_object_size(encache_store *st, const char *key,
                           uint64_t *len) {
  shm_store *s = (shm_store *)st;
  shm_entry c, *e;
  int rc = lock_find_ready(s, key, &e, &c);
  if (rc < 0)
    return rc;
  *len = c.obj_len;
  encache__shm_unlock(s);
  return 0;
}

/* ----------------------------------------------------------------- writes */

/* What refuses a write before the lock: a key or an object that cannot be
 * held, a handle after fork(), a handle with no writer slot. */
static int write_refused(shm_store *s, const char *key, uint64_t obj_len,
                         size_t *klen) {
  int rc = key_ok(s, key, klen);
  if (rc < 0)
    return rc;
  if (obj_len > s->data_size || rec_size(*klen, obj_len) > s->data_size)
    return encache_store_fail(&s->base, ENCACHE_ETOOLARGE,
                              "%s: object of %" PRIu64 " bytes does not fit "
                              "the %" PRIu64 "-byte segment",
                              s->base.url, obj_len, s->data_size);
  if (s->h == NULL)
    return encache__shm_lock(s); /* used after fork(): says so */
  if (s->slot < 0)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: all %u writer slots are taken: close some "
                              "handles", s->base.url, s->nslots);
  return 0;
}

/* Under the lock: refuses a key that exists (reclaiming a dead writer's
 * entry), then allocates the new object's record.  Returns its entry in
 * *ep, the entry's generation in *gen and where its bytes go in *dst. */
static int write_reserve(shm_store *s, const char *key, size_t klen,
                         uint64_t obj_len, shm_entry **ep, uint64_t *gen,
                         unsigned char **dst) {
  uint64_t hash = hash_key(key, klen);
  shm_entry c;
  int rc = encache__shm_lock(s);
  if (rc < 0)
    return rc;
  shm_entry *e = encache__shm_find(s, key, (uint32_t)klen, hash, &c);
  if (e != NULL) {
    if (c.state != E_WRITING || encache__shm_owner_alive(s, &c)) {
      encache__shm_unlock(s);
      return encache_store_fail(&s->base, ENCACHE_EEXIST, "%s: key exists",
                                s->base.url);
    }
    encache__shm_entry_free(s, e); /* its writer died */
  }
  rc = encache__shm_alloc_record(s, key, klen, hash, obj_len, ep, dst);
  if (rc == 0)
    *gen = __atomic_load_n(&(*ep)->gen, __ATOMIC_RELAXED);
  encache__shm_unlock(s);
  return rc;
}

/* Publishes the copied record p names: at once, or, when the lock cannot
 * be had, at the handle's next successful lock. */
static int write_publish(shm_store *s, const shm_pending *p) {
  int rc = encache__shm_lock(s);
  if (rc < 0) {
    /* The copy is complete but cannot be published now.  Left WRITING it
     * would block its key for as long as this handle lives: publish it at
     * the handle's next successful lock (or at close), or, with no room to
     * remember it, leave it to be reclaimed when the handle closes. */
    pthread_mutex_lock(&s->pmu);
    if (s->npending < (int)(sizeof(s->pending) / sizeof(s->pending[0]))) {
      s->pending[s->npending] = *p;
      __atomic_store_n(&s->npending, s->npending + 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->pmu);
    return rc;
  }
  int r = encache__shm_publish(s, p);
  if (r < 0)
    rc = encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                            "%s: the object was reclaimed while being "
                            "written", s->base.url);
  else if (r > 0)
    rc = encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                            "%s: not written: a removal through a tier "
                            "began after the object was read (purge epoch "
                            "%" PRIu64 ", now %" PRIu64 ")", s->base.url,
                            p->epoch,
                            __atomic_load_n(&s->h->purge_epoch,
                                            __ATOMIC_RELAXED));
  encache__shm_unlock(s);
  return rc;
}

/* A write; at_epoch: published only while the purge epoch is epoch. */
static int write_common(shm_store *s, const char *key, const void *hdr,
                        size_t hdr_len, const void *payload, size_t len,
                        int at_epoch, uint64_t epoch) {
  size_t klen;
  uint64_t obj_len = (uint64_t)hdr_len + len, gen = 0;
  shm_entry *e = NULL;
  unsigned char *dst = NULL;
  int rc = write_refused(s, key, obj_len, &klen);
  if (rc < 0 || (rc = write_reserve(s, key, klen, obj_len, &e, &gen, &dst)) < 0)
    return rc;
  if (encache__shm_write_hook != NULL)
    encache__shm_write_hook();
  /* The copy, outside the lock: nobody reads or reuses a WRITING record
   * while its writer lives.  The checksum is of the caller's bytes. */
  sum_state sum = {0};
  RELEASE_FENCE();
  encache__shm_copy_sum(dst, hdr, hdr_len, s->checksum ? &sum : NULL);
  encache__shm_copy_sum(dst + hdr_len, payload, len,
                        s->checksum ? &sum : NULL);
  shm_pending p = {e, gen, s->checksum ? encache__shm_sum_final(&sum) : 0,
                   s->checksum ? F_SUMMED : 0, at_epoch, epoch};
  return write_publish(s, &p);
}

static int shm_write(encache_store *st, const char *key, const void *hdr,
                     size_t hdr_len, const void *payload, size_t len) {
  return write_common((shm_store *)st, key, hdr, hdr_len, payload, len, 0, 0);
}

/* The purge epoch's requests (base.h: the tier's side of removals): read
 * it, bump it, or write only while it is still the one given.  A handle
 * used in a child after fork() refuses them. */
static int shm_control(encache_store *st, int op, void *arg) {
  shm_store *s = (shm_store *)st;
  if (op != ENCACHE__CONTROL_PURGE_EPOCH &&
      op != ENCACHE__CONTROL_PURGE_EPOCH_BUMP &&
      op != ENCACHE__CONTROL_WRITE_AT_EPOCH)
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  if (arg == NULL)
    return 0;
  if (op == ENCACHE__CONTROL_WRITE_AT_EPOCH) {
    const encache__epoch_write *w = arg;
    return write_common(s, w->key, w->hdr, w->hdr_len, w->payload, w->len, 1,
                        w->epoch);
  }
  if (s->h == NULL)
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "shm handle used in a child after fork(): "
                              "open a new one");
  *(uint64_t *)arg =
      op == ENCACHE__CONTROL_PURGE_EPOCH
          ? __atomic_load_n(&s->h->purge_epoch, __ATOMIC_ACQUIRE)
          : __atomic_add_fetch(&s->h->purge_epoch, 1, __ATOMIC_SEQ_CST);
  return 0;
}

static int shm_remove(encache_store *st, const char *key) {
  shm_store *s = (shm_store *)st;
  shm_entry c, *e;
  int rc = lock_find_ready(s, key, &e, &c);
  if (rc == ENCACHE_ENOENT)
    return encache_store_fail(st, ENCACHE_ENOENT, "%s: no such key",
                              s->base.url);
  if (rc < 0)
    return rc;
  encache__shm_entry_free(s, e);
  encache__shm_unlock(s);
  return 0;
}

/* ------------------------------------------------------------ list, stats */

typedef struct list_item {
  char *key;
  uint64_t len;
} list_item;

/* Under the lock: copies the keys of the READY objects that match pattern
 * (all when NULL) and their lengths into items (room for cap), in ring
 * order; their count in *n.  ENCACHE_ENOMEM keeps what was copied. */
static int list_copy(shm_store *s, const char *pattern, list_item *items,
                     uint32_t cap, size_t *n) {
  shm_entry c;
  *n = 0;
  for (uint32_t i = s->h->fifo_first, steps = 0;
       i != 0 && *n < cap && steps++ < s->nentries; i = c.fnext) {
    if (!encache__shm_load_entry(s, i, &c, 1))
      break; /* changed underneath since the check: list what we have */
    if (c.state != E_READY)
      continue;
    char *k = encache__malloc(c.key_len + 1u);
    if (k == NULL)
      return ENCACHE_ENOMEM;
    memcpy(k, rec_at(s, c.pos), c.key_len);
    k[c.key_len] = '\0';
    if (pattern != NULL && fnmatch(pattern, k, 0) != 0) {
      encache__free(k);
      continue;
    }
    items[*n].key = k;
    items[(*n)++].len = c.obj_len;
  }
  return 0;
}

static int shm_list(encache_store *st, const char *pattern,
                    int (*cb)(const char *key, uint64_t len, void *arg),
                    void *arg) {
  shm_store *s = (shm_store *)st;
  int rc = encache__shm_lock(s);
  if (rc < 0)
    return rc;
  if (!encache__shm_structure_ok(s))
    encache__shm_repair(s);
  /* Copy the matching keys out first: callbacks run without the lock. */
  uint32_t cap = s->h->nobjects < s->nentries ? s->h->nobjects : s->nentries;
  list_item *items = encache__calloc(cap + 1u, sizeof(*items));
  size_t n = 0;
  if (items != NULL)
    rc = list_copy(s, pattern, items, cap, &n);
  encache__shm_unlock(s);
  if (items == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
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
  int rc = encache__shm_lock(s);
  if (rc < 0)
    return rc;
  encache__shm_check_counters(s); /* damaged ones are never reported */
  out->objects = s->h->nobjects;
  out->bytes_used = s->h->bytes_used;
  out->capacity = s->data_size;
  out->evictions = s->h->evictions;
  out->reinsertions = s->h->reinsertions;
  out->repairs = s->h->repairs;
  encache__shm_unlock(s);
  return 0;
}

/* ---------------------------------------------------- the handle's life */

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
  if (s->map != NULL && s->npending > 0 && encache__shm_lock(s) == 0)
    encache__shm_unlock(s); /* publishes what a timeout left pending */
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
            ENCACHE_STORE_CAP_PUT_IF_ABSENT | ENCACHE_STORE_CAP_SHARED |
            ENCACHE_STORE_CAP_LEASE,
    .exists = shm_exists,
    .read = shm_read,
    .read_split = shm_read_split,
    .object_size = shm_object_size,
    .write = shm_write,
    .remove = shm_remove,
    .list = shm_list,
    .stats = shm_stats,
    .close = shm_close,
    .lease_take = encache__shm_lease_take, /* lease.c */
    .lease_drop = encache__shm_lease_drop,
    .control = shm_control};

shm_store *encache__shm_handle(encache_store *st) {
  return st != NULL && st->ops == &shm_ops ? (shm_store *)st : NULL;
}

int encache__shm_alloc(const char *url, encache_store **out, shm_store **sp) {
  shm_store *s = encache__calloc(1, sizeof(*s));
  if (s == NULL)
    return ENCACHE_ENOMEM;
  s->base.ops = &shm_ops;
  encache__store_profile_set(&s->base);
  s->fd = -1;
  s->lock_timeout_ms = SHM_DEFAULT_LOCK_MS;
  s->checksum = 1;
  s->share_gid = -1;
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
