/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_promote.c: promotion of remote hits into the local tier.
 *
 * A lookup that finds an object only in the remote tier hands a copy of
 * it to a bounded queue (items and bytes, tier.h) and returns at once; one
 * thread per tier handle writes the queued copies into the local tier,
 * which never replaces an object (ENCACHE_EEXIST: another process
 * promoted or published it first, which is as good).  A full queue drops
 * the copy and counts it: promotion is best-effort, a later lookup finds
 * the object remote again and tries again.  Only well-formed v3 objects
 * are promoted (header decodes, magic, a known dtype, length = header +
 * rows x cols x dtype size: encache_object_describe()), so that an object
 * that is incompatible in the remote tier never reaches the local one.
 *
 * Locking: t->mu guards the queue, its reservations and stop.  The copy
 * is made outside the lock, after a reservation that keeps the bounds.
 */
#include "tier.h"

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

void encache__tier_promote(tier_store *t, const char *key, const void *head,
                           size_t hlen, const void *body, size_t blen) {
  size_t len = hlen + blen, klen = strlen(key);
  if (len > t->max_bytes || !reserve(t, len)) {
    count(&t->n.promo_dropped);
    return;
  }
  tier_promo *p = encache__malloc(sizeof(*p) + len + klen + 1);
  if (p != NULL) {
    memcpy(p->data, head, hlen);
    memcpy(p->data + hlen, body, blen);
    p->len = len;
    p->key = (char *)p->data + len;
    memcpy(p->key, key, klen + 1);
    p->next = NULL;
  }
  char why[96];
  if (p == NULL || encache_object_describe(p->data, len, why, sizeof(why))) {
    /* Out of memory, or not a well-formed object: never promoted. */
    encache__free(p);
    unreserve(t, len);
    count(&t->n.promo_dropped);
    return;
  }
  pthread_mutex_lock(&t->mu);
  if (t->tail != NULL)
    t->tail->next = p;
  else
    t->head = p;
  t->tail = p;
  count(&t->n.promo_queued);
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

/* Writes one promotion into the local tier. */
static void promote_one(tier_store *t, tier_promo *p) {
  int rc = t->local->ops->write(t->local, p->key, NULL, 0, p->data, p->len);
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
    pthread_mutex_unlock(&t->mu);
    /* Queued before close: written even when stopping, so that close
     * leaves the local tier as complete as the caller saw it. */
    promote_one(t, p);
    pthread_mutex_lock(&t->mu);
    t->busy = 0;
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
    return encache__store_fail(NULL, -rc, "tier: cannot start the promotion "
                               "thread: %s", strerror(rc));
  t->thread_started = 1;
  return 0;
}

void encache__tier_promote_stop(tier_store *t) {
  if (!t->thread_started)
    return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
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
