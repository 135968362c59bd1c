/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_promote.c: promotion of remote hits into the local tier.
 *
 * A lookup that finds an object only in the remote tier queues it in a
 * bounded queue (items and bytes, tier.h) and returns at once: a small
 * object (TIER_COPY_MAX) as a copy, a larger one as its key only, read
 * again from the remote tier by the promotion thread (a copy of a large
 * object would cost the lookup a large share of a remote read:
 * docs/performance.md, "Two tiers"; a Store that needs registered
 * buffers always gets copies).  One thread per tier handle writes the
 * queued objects into the local tier,
 * which never replaces an object (ENCACHE_EEXIST: another process
 * promoted or published it first, which is as good).  A full queue drops
 * the object and counts it: promotion is best-effort, a later lookup
 * finds the object remote again and tries again.  Only well-formed v3
 * objects are promoted (header decodes, magic, a known dtype, length =
 * header + rows x cols x dtype size), checked on the header the lookup
 * read and again on the whole object written, so that an object that is
 * incompatible in the remote tier never reaches the local one.
 *
 * Removals, across the processes of the host.  Every promotion carries
 * the local segment's purge epoch (encache__tier_epoch()) noted before
 * the remote was asked, and is written with ENCACHE__CONTROL_WRITE_AT_EPOCH:
 * the segment publishes it only if the epoch is unchanged, compared under
 * the segment lock.  A removal through any tier of the host (tier.c)
 * removes from the remote first, then bumps the epoch, then removes from
 * the local segment under that lock.  So a promotion of a removed object
 * read the remote before the remote removal (else it found nothing), with
 * an epoch from before the bump; its publication either comes before the
 * local removal, which then removes it, or after the bump, which refuses
 * it.  Any removal refuses every promotion read before it, whatever its
 * key: a removal rarely meets a lookup, and the next remote hit promotes
 * again.  Within this handle, encache__tier_promote_forget() also drops
 * the queued promotions of the removed keys, and keeps the others
 * current when the removal's bump was the only one since they were read.
 *
 * Locking: t->mu guards the queue, its reservations, stop, cur and the
 * promotions' gen.  The copy is made outside the lock, after a
 * reservation that keeps the bounds.
 */
#include "tier.h"

#include <stdint.h>
#include <string.h>

static void count(uint64_t *c) { __atomic_add_fetch(c, 1, __ATOMIC_RELAXED); }

/* Reserves room for one object of len bytes: 1, or 0 when full. */
static int reserve(tier_store *t, size_t len) {
  pthread_mutex_lock(&t->mu);
  int ok = !t->stop && t->qitems < t->max_items &&
           len <= t->max_bytes - t->qbytes;
  if (ok) {
    t->qitems++;
    t->qbytes += len;
  }
  pthread_mutex_unlock(&t->mu);
  return ok;
}

static void unreserve(tier_store *t, size_t len) {
  pthread_mutex_lock(&t->mu);
  t->qitems--;
  t->qbytes -= len;
  if (t->qitems == 0 && !t->busy)
    pthread_cond_broadcast(&t->idle);
  pthread_mutex_unlock(&t->mu);
}

/* Whether an object of len bytes whose header is head[0..hlen) is a
 * well-formed v3 object (the checks of encache_object_describe()). */
static int well_formed(const void *head, size_t hlen, size_t len) {
  encache_header h;
  uint64_t nbytes;
  return encache_header_decode(head, hlen, &h) == 0 &&
         h.magic == ENCACHE_MAGIC && h.dtype <= INT32_MAX &&
         encache_dtype_size((int)h.dtype) != 0 &&
         encache_payload_size((int)h.dtype, h.rows, h.cols, &nbytes) == 0 &&
         (uint64_t)len == ENCACHE_HEADER_SIZE + nbytes;
}

void encache__tier_promote(tier_store *t, uint64_t gen, const char *key,
                           const void *head, size_t hlen, const void *body,
                           size_t blen) {
  size_t len = hlen + blen, klen = strlen(key);
  if (!well_formed(head, hlen, len) || len > t->max_bytes ||
      !reserve(t, len)) {
    count(&t->n.promo_dropped);
    return;
  }
  int fetch =
      len > TIER_COPY_MAX && !encache__store_profile_of(t->remote)->registered;
  size_t data = fetch ? 0 : len;
  tier_promo *p = encache__malloc(sizeof(*p) + data + klen + 1);
  if (p == NULL) {
    unreserve(t, len);
    count(&t->n.promo_dropped);
    return;
  }
  if (!fetch) {
    memcpy(p->data, head, hlen);
    memcpy(p->data + hlen, body, blen);
  }
  p->len = len;
  p->fetch = fetch;
  p->key = (char *)p->data + data;
  memcpy(p->key, key, klen + 1);
  p->next = NULL;
  p->gen = gen;
  pthread_mutex_lock(&t->mu);
  int fresh = gen == encache__tier_epoch(t);
  if (fresh) {
    if (t->tail != NULL)
      t->tail->next = p;
    else
      t->head = p;
    t->tail = p;
  }
  pthread_mutex_unlock(&t->mu);
  if (!fresh) { /* read before a removal that began since */
    unreserve(t, len);
    encache__free(p);
  }
  count(fresh ? &t->n.promo_queued : &t->n.promo_dropped);
}

static int removed_by(const char *key, const char *what, int prefix) {
  return prefix ? strncmp(key, what, strlen(what)) == 0
                : strcmp(key, what) == 0;
}

void encache__tier_promote_forget(tier_store *t, const char *key, int prefix,
                                  uint64_t epoch) {
  tier_promo *drop = NULL;
  pthread_mutex_lock(&t->mu);
  for (tier_promo **pp = &t->head, *prev = NULL; *pp != NULL;) {
    tier_promo *p = *pp;
    if (!removed_by(p->key, key, prefix)) {
      /* Read under the epoch just before this removal's bump: no other
       * removal since, and this one is not of its key. */
      if (p->gen + 1 == epoch)
        p->gen = epoch;
      prev = p;
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    if (t->tail == p)
      t->tail = prev;
    t->qitems--;
    t->qbytes -= p->len;
    p->next = drop;
    drop = p;
  }
  if (t->qitems == 0 && !t->busy)
    pthread_cond_broadcast(&t->idle);
  pthread_mutex_unlock(&t->mu);
  while (drop != NULL) {
    tier_promo *p = drop;
    drop = p->next;
    encache__free(p);
    count(&t->n.promo_dropped);
  }
}

uint64_t encache__tier_epoch(tier_store *t) {
  uint64_t e = UINT64_MAX; /* a local handle used after fork(): refused */
  encache__store_control(t->local, ENCACHE__CONTROL_PURGE_EPOCH, &e);
  return e;
}

/* Whether p may still be written (no removal since it was read from the
 * remote), with the epoch to write it at in *gen. */
static int current(tier_store *t, const tier_promo *p, uint64_t *gen) {
  pthread_mutex_lock(&t->mu);
  *gen = p->gen;
  pthread_mutex_unlock(&t->mu);
  return *gen == encache__tier_epoch(t);
}

void encache__tier_promote_kick(tier_store *t) {
  /* Once per lookup, not per object: a wake-up per object would hand the
   * CPU to the promotion thread in the middle of the lookup. */
  pthread_mutex_lock(&t->mu);
  if (t->head != NULL)
    pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

/* Reads p's object again from the remote tier into the thread's buffer:
 * the object, or NULL (gone, changed length, not well-formed, served
 * without its check: tier.c). */
static const unsigned char *fetch(tier_store *t, tier_promo *p) {
  if (t->fcap < p->len) {
    encache__free(t->fbuf);
    t->fcap = 0;
    if ((t->fbuf = encache__malloc(p->len)) == NULL)
      return NULL;
    t->fcap = p->len;
  }
  const char *keys[1] = {p->key};
  void *bufs[1] = {t->fbuf};
  size_t caps[1] = {p->len};
  int64_t res[1];
  uint64_t unchecked = encache__tier_remote_unchecked(t);
  int rc = t->remote->ops->read(t->remote, keys, 1, bufs, caps, res);
  if (encache_store_classify(rc) == ENCACHE_ANSWER_UNCONFIRMED ||
      (rc == 0 && encache_store_classify(res[0]) == ENCACHE_ANSWER_UNCONFIRMED)) {
    /* The remote may still write into the buffer: it is never freed or
     * reused (deliberately leaked), and nothing more is read again. */
    t->fbuf = NULL;
    t->fcap = 0;
    t->fetch_off = 1;
    return NULL;
  }
  if (rc != 0 || res[0] != (int64_t)p->len ||
      encache__tier_remote_unchecked(t) != unchecked ||
      encache_object_describe(t->fbuf, p->len, NULL, 0) != 0)
    return NULL;
  return t->fbuf;
}

/* Writes one promotion into the local tier. */
static void promote_one(tier_store *t, tier_promo *p) {
  /* Closing: a copy is written, but nothing more is asked of the remote
   * (which may be down: close must not wait for its timeouts). */
  int stopping = __atomic_load_n(&t->stop, __ATOMIC_RELAXED);
  uint64_t gen;
  const unsigned char *obj = !current(t, p, &gen)    ? NULL
                             : !p->fetch              ? p->data
                             : stopping || t->fetch_off ? NULL
                                                        : fetch(t, p);
  if (obj == NULL) {
    count(&t->n.promo_dropped);
    return;
  }
  /* Published only if no removal bumped the epoch since gen (a removal
   * while it is written refuses it, or finds it: see the top). */
  encache__epoch_write w = {gen, p->key, NULL, 0, obj, p->len};
  int rc = encache__store_control(t->local, ENCACHE__CONTROL_WRITE_AT_EPOCH, &w);
  int cls = encache_store_classify(rc);
  count(cls == ENCACHE_ANSWER_OK || cls == ENCACHE_ANSWER_EXISTS
            ? &t->n.promo_done
            : &t->n.promo_dropped);
}

static void *promote_main(void *arg) {
  tier_store *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (t->head == NULL && !t->stop)
      pthread_cond_wait(&t->cv, &t->mu);
    tier_promo *p = t->head;
    if (p == NULL)
      break; /* stopping, and nothing left */
    t->head = p->next;
    if (t->head == NULL)
      t->tail = NULL;
    t->busy = 1;
    t->cur = p;
    pthread_mutex_unlock(&t->mu);
    /* Queued before close: written even when stopping, so that close
     * leaves the local tier as complete as the caller saw it. */
    promote_one(t, p);
    pthread_mutex_lock(&t->mu);
    t->busy = 0;
    t->cur = NULL;
    t->qitems--;
    t->qbytes -= p->len;
    encache__free(p);
    if (t->qitems == 0)
      pthread_cond_broadcast(&t->idle);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

int encache__tier_promote_start(tier_store *t) {
  int rc = pthread_create(&t->thread, NULL, promote_main, t);
  if (rc != 0)
    return encache_store_fail(NULL, -rc, "tier: cannot start the promotion "
                              "thread: %s", strerror(rc));
  t->thread_started = 1;
  return 0;
}

/* Waits for the thread: a read again already under way finishes first,
 * so close can take up to the remote's own timeout when it stalls (Redis:
 * timeout_ms; docs/stores.md says so).  Nothing more is read again. */
void encache__tier_promote_stop(tier_store *t) {
  if (!t->thread_started)
    return;
  pthread_mutex_lock(&t->mu);
  __atomic_store_n(&t->stop, 1, __ATOMIC_RELAXED);
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  t->thread_started = 0;
}

void encache__tier_drain(encache_store *st) {
  tier_store *t = (tier_store *)st;
  pthread_mutex_lock(&t->mu);
  while (t->qitems > 0 || t->busy)
    pthread_cond_wait(&t->idle, &t->mu);
  pthread_mutex_unlock(&t->mu);
}
