/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lease.c: the shm Store's single-flight leases (encache_store_lease_take()
 * and encache_store_lease_drop()).
 *
 * The table.  nleases (a power of two, segment.c) shm_lease records in the
 * segment, apart from the entries and the ring: a lease is never an object,
 * so nothing that lists, reads, counts, evicts or purges objects sees one.
 * A key's lease lives in the LEASE_PROBE records from hash & (nleases - 1)
 * on (wrapping); a key is known by its length and two independent 64-bit
 * hashes (keys are up to 64 KiB: they are not kept).  Two keys whose 128
 * bits of hash both collide would share a lease: a wait or a duplicate
 * encode, never a wrong hit.
 *
 * Ending.  A lease is free when its token is 0, its deadline (the
 * CLOCK_MONOTONIC milliseconds, one clock for the processes of a host,
 * unless a time namespace offsets it)
 * has passed, or its holder is dead: the holder is the handle that took
 * or last renewed it, identified by its writer slot and slot token, alive
 * exactly as a writer is (repair.c: the slot's open-file-description lock,
 * dropped by the kernel when the process dies).  So a killed holder's
 * leases are free at once, not at their deadline, and so are those of a
 * handle that is closed.  Nothing sweeps the table: a free lease is
 * recognised, and reused, by whoever looks at it.
 *
 * Everything runs under the segment lock (take and drop are atomic).
 * Each lease is read once into a private copy; a copy that fails its
 * check word is damage (or a process killed while writing it): that lease
 * is free.  A full probe window is ENCACHE_EUNAVAIL at once, never a wait.
 */
#include "shm.h"

#include <inttypes.h>
#include <string.h>

#define LEASE_PROBE 64u /* the records a key's lease may occupy */

/* What identifies a key in the table. */
typedef struct lease_key {
  uint64_t hash, hash2;
  uint32_t len;
} lease_key;

/* A second hash of the key, independent of hash_key() (FNV-1a): 8 bytes at
 * a time through the 64-bit finalizer. */
static uint64_t hash2_of(const char *key, size_t len) {
  uint64_t h = 0x243f6a8885a308d3ull ^ ((uint64_t)len * 0x9e3779b97f4a7c15ull);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, key + i, 8);
    h = mix64(h ^ w) + 0x9e3779b97f4a7c15ull;
  }
  uint64_t w = 0;
  memcpy(&w, key + i, len - i);
  return mix64(h ^ w ^ ((uint64_t)(len - i) << 59));
}

/* The check word of lease record idx: covers every field. */
static uint32_t lease_check(const shm_lease *l, uint32_t idx) {
  const uint64_t w[] = {l->hash, l->hash2, l->token, l->deadline_ms,
                        l->owner_token,
                        (uint64_t)l->owner_slot << 32 | l->key_len};
  return check_words(0x7f4a7c159e3779b9ull, idx, w, sizeof(w) / sizeof(w[0]));
}

/* Writes the private lease n into record idx, sealed. */
static void lease_store(shm_store *s, uint32_t idx, shm_lease *n) {
  n->check = lease_check(n, idx);
  s->leases[idx] = *n;
}

static void lease_clear(shm_store *s, uint32_t idx) {
  shm_lease n;
  memset(&n, 0, sizeof(n));
  lease_store(s, idx, &n);
}

/* Whether the checked copy c (of record idx) is a lease that still holds:
 * sealed, before its deadline, its holder alive. */
static int lease_holds(shm_store *s, const shm_lease *c, uint32_t idx,
                       uint64_t now) {
  return c->token != 0 && c->check == lease_check(c, idx) &&
         now < c->deadline_ms &&
         encache__shm_slot_alive(s, c->owner_slot, c->owner_token);
}

static int lease_is(const shm_lease *c, const lease_key *k) {
  return c->token != 0 && c->hash == k->hash && c->hash2 == k->hash2 &&
         c->key_len == k->len;
}

/* Record i of key k's probe window. */
static uint32_t probe(const shm_store *s, const lease_key *k, uint32_t i) {
  return (uint32_t)(k->hash + i) & (s->nleases - 1);
}

static uint32_t probe_len(const shm_store *s) {
  return s->nleases < LEASE_PROBE ? s->nleases : LEASE_PROBE;
}

/* Under the lock: the record of key k's lease that holds (its copy in
 * *c), or -1; ends (clears) every record of k that no longer holds, and
 * notes in *spare the first free record of the window (-1: none). */
static int64_t lease_find(shm_store *s, const lease_key *k, uint64_t now,
                          shm_lease *c, int64_t *spare) {
  int64_t found = -1;
  *spare = -1;
  for (uint32_t i = 0; i < probe_len(s); i++) {
    uint32_t idx = probe(s, k, i);
    shm_lease l = s->leases[idx];
    if (lease_is(&l, k) && found < 0 && lease_holds(s, &l, idx, now)) {
      *c = l;
      found = idx;
      continue;
    }
    if (lease_is(&l, k))
      lease_clear(s, idx); /* ended: expired, dead holder, damaged, twin */
    if (*spare < 0 && (l.token == 0 || lease_is(&l, k)))
      *spare = idx;
  }
  return found;
}

/* Under the lock: a record of key k's window whose lease no longer holds
 * (another key's: expired, dead holder or damaged), or -1 when all hold. */
static int64_t lease_reclaim(shm_store *s, const lease_key *k, uint64_t now) {
  for (uint32_t i = 0; i < probe_len(s); i++) {
    uint32_t idx = probe(s, k, i);
    shm_lease l = s->leases[idx];
    if (!lease_holds(s, &l, idx, now))
      return idx;
  }
  return -1;
}

/* Checks the key and the handle before the lock; k the key's identity. */
static int lease_begin(shm_store *s, const char *key, lease_key *k) {
  size_t klen;
  int rc = key_ok(s, key, &klen);
  if (rc < 0)
    return rc;
  if (s->h == NULL)
    return encache__shm_lock(s); /* used after fork(): says so */
  k->hash = hash_key(key, klen);
  k->hash2 = hash2_of(key, klen);
  k->len = (uint32_t)klen;
  return encache__shm_lock(s);
}

int encache__shm_lease_take(encache_store *st, const char *key,
                            uint64_t token, uint32_t ttl_ms) {
  shm_store *s = (shm_store *)st;
  lease_key k;
  shm_lease c;
  int64_t spare;
  if (s->slot < 0 && s->h != NULL)
    return encache_store_fail(st, ENCACHE_EUNAVAIL,
                              "%s: all %u writer slots are taken (a lease "
                              "needs one): close some handles",
                              s->base.url, s->nslots);
  int rc = lease_begin(s, key, &k);
  if (rc < 0)
    return rc;
  uint64_t now = mono_ms();
  int64_t idx = lease_find(s, &k, now, &c, &spare);
  if (idx >= 0 && c.token != token) {
    encache__shm_unlock(s);
    return encache_store_fail(st, ENCACHE_EEXIST,
                              "%s: the lease is held by another holder for "
                              "%" PRIu64 " ms more", s->base.url,
                              c.deadline_ms - now);
  }
  if (idx < 0)
    idx = spare >= 0 ? spare : lease_reclaim(s, &k, now);
  if (idx < 0) {
    encache__shm_unlock(s);
    return encache_store_fail(st, ENCACHE_EUNAVAIL,
                              "%s: the lease table is full around this key "
                              "(%u leases held nearby, of %u): encode "
                              "without one", s->base.url, probe_len(s),
                              s->nleases);
  }
  /* Taken, or renewed: this handle now vouches for it. */
  shm_lease n = {k.hash, k.hash2, token, now + ttl_ms, s->token,
                 (uint32_t)s->slot, k.len, 0, {0}};
  lease_store(s, (uint32_t)idx, &n);
  encache__shm_unlock(s);
  return 0;
}

int encache__shm_lease_drop(encache_store *st, const char *key,
                            uint64_t token) {
  shm_store *s = (shm_store *)st;
  lease_key k;
  shm_lease c;
  int64_t spare;
  int rc = lease_begin(s, key, &k);
  if (rc < 0)
    return rc;
  int64_t idx = lease_find(s, &k, mono_ms(), &c, &spare);
  if (idx >= 0 && c.token == token)
    lease_clear(s, (uint32_t)idx);
  encache__shm_unlock(s);
  if (idx < 0 || c.token != token)
    return encache_store_fail(st, ENCACHE_ENOENT,
                              "%s: this token holds no lease of the key (it "
                              "expired, its holder was declared dead, or "
                              "another took it over)", s->base.url);
  return 0;
}
