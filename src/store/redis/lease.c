/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lease.c: single-flight leases on Redis and Redis Cluster
 * (encache_store_lease_take() and encache_store_lease_drop(); see redis.h).
 *
 * The lease of the object key K is the string key LEASE_PREFIX K
 * ("encache-lease:K"): its value is the holder's token in decimal, its
 * expiry (PX) the lease's deadline.  It is never an object: namespaces
 * start with "embedding" or the caller's prefix, so a listing, a count or a
 * purge of a namespace never sees it (a listing of every key does, as it
 * sees other programs' keys).  In a cluster the lease key hashes to a slot
 * of its own (or K's hash tag's): each command names one key, so it may.
 *
 * Each operation is one Lua script, run atomically on the key's node:
 *   take: the key holds our token: PEXPIRE ttl (renewed), 1; it holds
 *         another's: 0 (ENCACHE_EEXIST); there is none: SET PX ttl, 1.
 *   drop: the key holds our token: DEL, 1; else 0 (ENCACHE_ENOENT).
 * A script goes as EVALSHA of its SHA-1 and, when the node answers
 * NOSCRIPT (a new node, a restart, SCRIPT FLUSH), as EVAL, which loads it
 * there.  Any other answer than the integers 0 and 1 is ENCACHE_EUNAVAIL
 * with what the server said, never a lease.
 *
 * What a lease on Redis promises: at most one holder while its key lives.
 * The key ends at its deadline (a killed holder holds it until then), and
 * earlier if the server loses it: evicted under maxmemory with an allkeys
 * policy, or lost in a failover before a replica had it.  Then a second
 * encoder may take it: a duplicate encode, never a wrong hit.
 *
 * A command that the server closed unanswered is sent once more
 * (encache__redis_run_on()).  Both scripts are idempotent for one token,
 * except a drop that ran before the close: the second one answers
 * ENCACHE_ENOENT, and the lease is gone either way.
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>

static const char take_script[] =
    "local v = redis.call('GET', KEYS[1]) "
    "if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 "
    "elseif v then return 0 end "
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1";
/* sha1sum of take_script (tests check that EVALSHA finds it). */
static const char take_sha[] = "a0627a83f517476faa78b907735fef4128f7046f";

static const char drop_script[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0";
static const char drop_sha[] = "6fbe84d1140fd2047394924af9d845b83c070bec";

/* Runs take (ttl_ms > 0) or drop (ttl_ms 0) on the lease key of key:
 * EVALSHA, else EVAL.  Returns 0, ENCACHE_EEXIST (take) or ENCACHE_ENOENT
 * (drop) when the script answers 0, or a Store code; the message set on
 * failure. */
static int lease_op(encache_store *st, const char *key, uint64_t token,
                    uint32_t ttl_ms) {
  redis_store *s = (redis_store *)st;
  int take = ttl_ms > 0;
  size_t plen = sizeof(LEASE_PREFIX) - 1, klen = strlen(key);
  char *lkey = encache__malloc(plen + klen + 1);
  if (lkey == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  memcpy(lkey, LEASE_PREFIX, plen);
  memcpy(lkey + plen, key, klen + 1);
  char tok[24], ttl[16], why[512];
  snprintf(tok, sizeof(tok), "%" PRIu64, token);
  snprintf(ttl, sizeof(ttl), "%" PRIu32, ttl_ms);
  const char *argv[6] = {"EVALSHA", take ? take_sha : drop_sha, "1", lkey,
                         tok, ttl};
  rreply r;
  int rc = encache__redis_command(s, lkey, take ? 6 : 5, argv, NULL, &r, why,
                                  sizeof(why));
  if (rc == 0 && r.type == REDIS_REPLY_ERROR &&
      strncmp(r.text, "NOSCRIPT", 8) == 0) {
    argv[0] = "EVAL";
    argv[1] = take ? take_script : drop_script;
    rc = encache__redis_command(s, lkey, take ? 6 : 5, argv, NULL, &r, why,
                                sizeof(why));
  }
  encache__free(lkey);
  if (rc == 0 && r.type == REDIS_REPLY_INTEGER && r.integer == 1)
    return 0;
  if (rc == 0 && r.type == REDIS_REPLY_INTEGER && r.integer == 0)
    return take ? encache_store_fail(st, ENCACHE_EEXIST,
                                     "%s: the lease of %s is held by another",
                                     s->base.url, key)
                : encache_store_fail(st, ENCACHE_ENOENT,
                                     "%s: token %s does not hold the lease "
                                     "of %s",
                                     s->base.url, tok, key);
  if (rc == 0) {
    rc = ENCACHE_EUNAVAIL;
    snprintf(why, sizeof(why), "%s",
             r.type == REDIS_REPLY_ERROR ? r.text : "an unexpected answer");
  }
  return encache_store_fail(st, rc, "%s: lease %s of %s: %s", s->base.url,
                            take ? "take" : "drop", key, why);
}

int encache__redis_lease_take(encache_store *st, const char *key,
                              uint64_t token, uint32_t ttl_ms) {
  return lease_op(st, key, token, ttl_ms); /* ttl_ms > 0: front.c checks */
}

int encache__redis_lease_drop(encache_store *st, const char *key,
                              uint64_t token) {
  return lease_op(st, key, token, 0);
}
