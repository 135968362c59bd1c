/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lease.c: single flight (docs/engine.md, "Single flight"): one encoder
 * encodes a cold miss while the others wait for its output.
 *
 * With single_flight on and a Store with leases, a lookup's absent items
 * take their key's lease (encache_store_lease_take) with a random token
 * the step keeps: a taken lease leaves the item a MISS (the caller
 * encodes it).  An item whose lease another encoder holds polls, up to
 * single_flight_wait_ms: the object's existence (then it joins this
 * lookup's reads and is a HIT like any other), and the lease (taken:
 * a MISS, the holder gave up or died).  What is still held at the bound is
 * IN_FLIGHT.  A handle whose steps hold leases not yet published does
 * not wait (two encoders would wait for each other, and a lease of its
 * own step is encoded only after this lookup): its contended items are
 * IN_FLIGHT at once, for a lookup after its own are published.  A lease just taken is
 * followed by a second existence check: a holder may have written the
 * object and ended its lease in between, and the object is then read.  A lease is advisory: a Store that fails a lease call makes
 * the item a plain MISS (counted), never UNAVAILABLE, and nothing here
 * turns a miss into a hit without the normal read and validation.
 *
 * A publication hands the step's token to its job; the worker ends the
 * lease once the object is written (or found present, or failed), so a
 * waiter sees the object before the lease goes.  A publication that is
 * skipped, and a step that closes with leases it never published, end
 * them on the caller's thread.  Past its deadline (single_flight_ttl_ms)
 * a lease ends by itself: a holder that never publishes delays the
 * others by at most that, and on shm a holder that dies frees it at once.
 */
#include "lease.h"

#include <inttypes.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

enum { TAKEN = 0, HELD = 1, HELD_HERE = 2 };

/* Takes the item's lease for the step (renewing the step's own): TAKEN
 * (also when the Store failed: a plain miss), HELD by another encoder, or
 * HELD_HERE by another step of this handle (its encode comes after this
 * lookup: never wait for it). */
static int take(encache__plan *p, const encache__item *it) {
  encache *ec = p->ec;
  const char *id = p->cand[it->first].id;
  uint64_t *slot = encache__step_lease(p->step, id);
  ENCACHE_ASSERT(slot != NULL); /* dedupe added every item's id */
  if (*slot == 0 && encache__steps_lease_of(ec, p->step, id) != 0)
    return HELD_HERE;
  uint64_t token = *slot != 0 ? *slot : encache__lease_token();
  int cls = encache_store_classify(encache_store_lease_take(
      ec->store, it->key, token, ec->lease_ttl_ms));
  if (cls == ENCACHE_ANSWER_EXISTS)
    return HELD;
  if (cls == ENCACHE_ANSWER_OK && *slot == 0)
    ENCACHE__COUNT(ec, leases_taken, 1);
  else if (cls != ENCACHE_ANSWER_OK)
    ENCACHE__COUNT(ec, leases_failed, 1);
  /* Kept even when the call failed: the take may have happened with its
   * answer lost, and ending a lease that is not there costs nothing. */
  encache__lease_slot_set(ec, slot, token);
  return TAKEN;
}

/* The existence of items[list[0..n)] into p->present; 0, or
 * ENCACHE_EUNAVAIL when the check failed as a whole (a lease is advisory:
 * never poison). */
static int exists_of(encache__plan *p, const size_t *list, size_t n) {
  encache_store *st = p->ec->store;
  for (size_t k = 0; k < n; k++)
    p->keys[k] = p->items[list[k]].key;
  int rc = st->ops->exists(st, p->keys, n, p->present);
  return encache_store_classify(rc) == ENCACHE_ANSWER_OK ? 0
                                                          : ENCACHE_EUNAVAIL;
}

/* The leases just taken of items[taken[0..n)]: a holder may have written
 * its object and ended its lease between our existence check and our
 * take.  An object there now is read (a hit, not a second encode), and
 * its lease ends at once. */
static void confirm_absent(encache__plan *p, const size_t *taken, size_t n) {
  if (n == 0 || exists_of(p, taken, n) < 0)
    return; /* unknown: encode, as without the re-check */
  for (size_t k = 0; k < n; k++) {
    encache__item *it = &p->items[taken[k]];
    if (p->present[k] != 1)
      continue;
    uint64_t *slot = encache__step_lease(p->step, p->cand[it->first].id);
    encache__lease_end(p->ec, it->key,
                       encache__lease_slot_set(p->ec, slot, 0));
    encache__plan_present(p, it);
  }
}

/* One round of a wait: the held items' existence, then their leases.
 * Keeps in held[0..*n) those still held; 0, or ENCACHE_EUNAVAIL when the
 * existence check failed (the wait stops). */
static int poll_held(encache__plan *p, size_t *held, size_t *n, size_t *taken) {
  if (exists_of(p, held, *n) < 0)
    return ENCACHE_EUNAVAIL;
  size_t w = 0, nt = 0;
  for (size_t k = 0; k < *n; k++) {
    encache__item *it = &p->items[held[k]];
    int t = p->present[k] == 1 ? -1 : take(p, it);
    if (t < 0)
      encache__plan_present(p, it); /* the holder's output: read it */
    else if (t == TAKEN)
      taken[nt++] = held[k];
    else
      held[w++] = held[k];
  }
  *n = w;
  confirm_absent(p, taken, nt);
  return 0;
}

/* Waits up to single_flight_wait_ms while held[0..*n) are held (taken:
 * scratch room for as many). */
static void wait_held(encache__plan *p, size_t *held, size_t *n,
                      size_t *taken) {
  encache *ec = p->ec;
  uint64_t start = now_us(), deadline = start + ec->lease_wait_ms * 1000u;
  uint64_t backoff = 1000; /* us: doubles up to 16 ms */
  ENCACHE__COUNT(ec, waited, *n);
  for (size_t k = 0; k < *n; k++)
    p->items[held[k]].waited = 1;
  for (uint64_t t = start; *n > 0 && t < deadline; t = now_us()) {
    uint64_t nap = backoff < deadline - t ? backoff : deadline - t;
    struct timespec ts = {(time_t)(nap / 1000000u),
                          (long)(nap % 1000000u) * 1000};
    nanosleep(&ts, NULL);
    if (backoff < 16000)
      backoff *= 2;
    if (poll_held(p, held, n, taken) < 0)
      break;
  }
  ENCACHE__COUNT(ec, wait_us, now_us() - start);
}

int encache__plan_lease(encache__plan *p) {
  /* Scratch of the plan that is free until phase chunk: newpos and dest
   * (n each; items are at most n). */
  size_t *held = p->newpos, *taken = p->dest, n = 0, nt = 0, here = 0;
  for (size_t u = 0; u < p->nu; u++) {
    encache__item *it = &p->items[u];
    if (it->outcome != ENCACHE_MISS || it->present)
      continue;
    int t = take(p, it);
    if (t == TAKEN)
      taken[nt++] = u;
    else
      held[n++] = u;
    it->held_here = t == HELD_HERE;
    here += t == HELD_HERE;
  }
  confirm_absent(p, taken, nt);
  /* A handle that holds leases (of this lookup, or of steps it has not
   * published yet) does not wait: the encoders it would wait for may be
   * waiting for those (both would wait to the bound), and its own leases'
   * encodes come after this lookup.  It answers IN_FLIGHT at once; a
   * lookup made after publishing its own waits. */
  const char *why = "another encoder holds its lease: it is encoding it now "
                    "(single flight)";
  if (n > here && p->ec->lease_wait_ms > 0 && p->ec->leases_held > 0)
    why = "another encoder holds its lease (it is encoding it); this "
          "encoder holds leases too: encode and publish those, then look "
          "this up again (single flight)";
  else if (n > 0 && p->ec->lease_wait_ms > 0 && p->ec->leases_held == 0) {
    wait_held(p, held, &n, taken);
    why = encache__step_note(p->step, "another encoder holds its lease",
                             "another encoder holds its lease (it is "
                             "encoding it) and its output did not come "
                             "within %" PRIu64 " ms (single_flight_wait_ms)",
                             p->ec->lease_wait_ms);
  }
  for (size_t k = 0; k < n; k++) {
    encache__item *it = &p->items[held[k]];
    it->outcome = ENCACHE_IN_FLIGHT;
    it->why = it->held_here ? "this encoder holds its lease in another "
                              "step, not published yet (single flight)"
                            : why;
  }
  return 0;
}
