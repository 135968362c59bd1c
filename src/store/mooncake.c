/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mooncake.c: Mooncake Store, loaded at run time through its C ABI.
 *
 * URL `mooncake:` reads the client JSON named by MOONCAKE_CONFIG_PATH;
 * `mooncake:PATH` reads PATH (docs/configuration.md).  The library is
 * $ENCACHE_MOONCAKE_LIBRARY, else libmooncake_store.so from the default
 * search path: Mooncake built with -DWITH_STORE_C_SHARED=ON, which exports
 * only the C ABI of mooncake-store/include/store_c.h.  encache builds and
 * runs without it; the prototypes it needs are declared here, in our own
 * words, from that ABI.
 *
 * Capabilities, per handle (mc_caps): reads go into the engine's staging
 * buffer, registered with Mooncake when the protocol needs registered
 * memory (RDMA and the rest); over "tcp" Mooncake reads into any memory,
 * so the handle asks for no registration (no staging registration, no
 * per-publication registration of the caller's tensor).  There is no
 * direct read into destinations: the C ABI reads an object whole into one
 * buffer (no scatter, and a buffer smaller than the object is refused),
 * and a destination has no room for the 24-byte header in front of its
 * payload, so one copy out of the staging buffer remains.  A read of a
 * missing key answers OBJECT_NOT_FOUND at the cost of an existence check
 * (ENCACHE_STORE_CAP_READ_ABSENT): the engine skips its own check.
 *
 * Writes check existence first, as the reference does, and this check
 * cannot be skipped: a Mooncake put on an existing key answers success
 * without replacing it, so the put's own answer cannot tell "written"
 * from "already there" (the publication counters would lie); the
 * publisher asks it for several queued keys at once (mc_write_known).
 * Then header
 * + payload are put from a registered buffer of this backend's (the C
 * ABI has no multi-buffer put); up to MC_WBUFS writes run at once, each
 * from its own buffer, grown when needed and registered once per size.
 * The client waits for each transfer by polling (a CPU per call in
 * flight, unless Mooncake was built with USE_EVENT_DRIVEN_COMPLETION):
 * ENCACHE_STORE_CAP_BUSY_WAIT, so the publisher keeps one write in
 * flight unless told otherwise (store_writes_in_flight).
 *
 * Removal by prefix (a namespace's purge) uses the ABI's remove by regex
 * when the library has it: "^" and the prefix, every regex syntax
 * character escaped.  Mooncake cannot list keys, so it cannot count them.
 *
 * Every Mooncake result code is classified by one table (mooncake_codes.c), per
 * operation (existence check, read, write), with vLLM's sets: not found,
 * already exists, recoverable (encode instead, or skip the write), or
 * "completion unconfirmed" (poison).  The engine judges byte counts
 * against its slots.
 *
 * Mooncake's first client creation in a process blocks SIGINT, SIGTERM,
 * SIGHUP and SIGUSR1 and handles them on a thread of its own
 * (docs/stores.md): a program's own handlers for those never run.
 *
 * Somewhat over 600 lines, on purpose: the ABI's prototypes, the
 * operations and the loader of one backend read together (its code table
 * is mooncake_codes.c).
 */
#include "backends.h"
#include "base.h"
#include "mooncake_codes.h"
#include "prefix.h"
#include "config/opts.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The C ABI (store_c.h), as function pointer types. */
typedef void *mc_handle;
typedef mc_handle (*mc_create_fn)(void);
typedef void (*mc_destroy_fn)(mc_handle);
typedef int (*mc_setup_fn)(mc_handle, const char *local_hostname,
                           const char *metadata_server,
                           uint64_t global_segment_size,
                           uint64_t local_buffer_size, const char *protocol,
                           const char *device_name,
                           const char *master_server_addr);
typedef int (*mc_health_fn)(mc_handle);
typedef int (*mc_put_from_fn)(mc_handle, const char *key, void *buffer,
                              size_t size, const void *replicate_config);
typedef int (*mc_batch_get_into_fn)(mc_handle, const char **keys,
                                    void **buffers, const size_t *sizes,
                                    size_t count, int64_t *results);
typedef int (*mc_batch_is_exist_fn)(mc_handle, const char **keys,
                                    size_t count, int *results);
typedef int64_t (*mc_get_size_fn)(mc_handle, const char *key);
typedef int (*mc_remove_fn)(mc_handle, const char *key, int force);
typedef int64_t (*mc_remove_by_regex_fn)(mc_handle, const char *pattern,
                                         int force);
typedef int (*mc_register_fn)(mc_handle, void *buffer, size_t size);
typedef int (*mc_unregister_fn)(mc_handle, void *buffer);

/* ---------------------------------------------------------------- handle */

/* Writes at once per handle (the publisher's writes in flight), each with
 * a registered buffer of its own. */
#define MC_WBUFS ENCACHE__WRITES_MAX

typedef struct mooncake_store {
  encache_store base;
  void *lib;
  mc_handle h;
  mc_destroy_fn destroy;
  mc_health_fn health;
  mc_put_from_fn put_from;
  mc_batch_get_into_fn batch_get_into;
  mc_batch_is_exist_fn batch_is_exist;
  mc_get_size_fn get_size;
  mc_remove_fn remove;
  mc_remove_by_regex_fn remove_by_regex; /* NULL in a library without it */
  mc_register_fn register_buffer;
  mc_unregister_fn unregister_buffer;
  encache__store_ops ops; /* this handle's table: caps per protocol */
  /* The write buffers: wbuf[i] (wcap[i] bytes, registered) is used by one
   * write at a time (wbusy[i]); a writer finding all busy waits on wfree.
   * Under wmu, but the bytes of a busy buffer belong to its writer. */
  pthread_mutex_t wmu;
  pthread_cond_t wfree;
  unsigned char *wbuf[MC_WBUFS];
  size_t wcap[MC_WBUFS];
  int wbusy[MC_WBUFS];
  int poisoned; /* a write buffer the Store may still touch: kept */
} mooncake_store;

static mooncake_store *ms(encache_store *st) { return (mooncake_store *)st; }

static int mc_exists(encache_store *st, const char *const *keys, size_t n,
                     int *results) {
  mooncake_store *s = ms(st);
  int rc = s->batch_is_exist(s->h, (const char **)keys, n, results);
  if (rc != 0) {
    /* No memory is lent to an existence check: a failed batch is "not
     * present" for vLLM, hence recoverable here (encode instead). */
    int c = encache__mooncake_classify_op(ENCACHE__MC_EXISTS, rc);
    return encache_store_fail(st, c == 0 ? ENCACHE_EUNAVAIL : c,
                              "%s: batch_is_exist answered %d (%s)",
                              s->base.url, rc,
                              encache__mooncake_code_name(rc));
  }
  for (size_t i = 0; i < n; i++)
    if (results[i] < 0)
      results[i] = encache__mooncake_classify_op(ENCACHE__MC_EXISTS,
                                                 results[i]);
    else if (results[i] > 1) /* vLLM: present only on 1 */
      results[i] = ENCACHE_EUNAVAIL;
  return 0;
}

/*
 * A read answer that would poison but is not about a transfer (an invalid
 * key, a code not in the table) for key: the engine may have read without
 * an existence check (ENCACHE_STORE_CAP_READ_ABSENT), where the reference
 * asks first and never reads a missing key.  Asking now gives the answer
 * the check would have given: an object that is not there had no replica
 * to transfer from (a read holds a lease on the object it reads, so it
 * cannot have vanished under the read), so nothing can still land in the
 * buffer.  An object that is there leaves the read unconfirmed, as before.
 */
static int read_confirm(mooncake_store *s, const char *key, int64_t code,
                        int cls) {
  if (cls != ENCACHE_EUNCONFIRMED ||
      (code != -400 && encache__mooncake_code_known(code)))
    return cls;
  const char *keys[1] = {key};
  int present = -1;
  int rc = s->batch_is_exist(s->h, keys, 1, &present);
  if (rc != 0)
    return ENCACHE_EUNAVAIL; /* a failed check: "encode instead" */
  if (present == 1)
    return cls;
  int e = present == 0 ? ENCACHE_ENOENT
                       : encache__mooncake_classify_op(ENCACHE__MC_EXISTS,
                                                       present);
  return e == ENCACHE_ENOENT ? e : ENCACHE_EUNAVAIL;
}

/* One batch_get_into of n distinct keys. */
static int read_batch(encache_store *st, const char *const *keys, size_t n,
                      void *const *bufs, const size_t *caps,
                      int64_t *results) {
  mooncake_store *s = ms(st);
  int rc = s->batch_get_into(s->h, (const char **)keys, (void **)bufs, caps, n,
                             results);
  if (rc != 0)
    return encache_store_fail(st, ENCACHE_EUNCONFIRMED,
                              "%s: batch_get_into answered %d", s->base.url,
                              rc);
  for (size_t i = 0; i < n; i++)
    if (results[i] < 0) {
      int64_t code = results[i];
      results[i] = read_confirm(
          s, keys[i], code, encache__mooncake_classify_op(ENCACHE__MC_READ, code));
      /* INVALID_PARAMS is also Mooncake's "the buffer is too small": ask
       * the object's size to tell the two apart. */
      if (code == -600) {
        int64_t size = s->get_size(s->h, keys[i]);
        if (size >= 0 && (uint64_t)size > caps[i]) {
          results[i] = ENCACHE_ETOOLARGE;
          continue;
        }
      }
      if (results[i] == ENCACHE_EUNCONFIRMED || results[i] == ENCACHE_EUNAVAIL)
        encache_store_fail(st, 0, "%s: %s: code %" PRId64 " (%s)",
                           s->base.url, keys[i], code,
                           encache__mooncake_code_name(code));
    }
  /* A count above the slot is left for the engine to judge. */
  return 0;
}

/* A key of the batch and where it stands in it (mc_read). */
typedef struct mc_slot {
  const char *key;
  size_t at;
} mc_slot;

static int slot_cmp(const void *a, const void *b) {
  const mc_slot *x = a, *y = b;
  int c = strcmp(x->key, y->key);
  return c != 0 ? c : x->at < y->at ? -1 : x->at > y->at;
}

/* The scratch of a batch read in rounds, one allocation for n keys: the
 * sort, each key's round, and one round's members (keys, buffers, sizes
 * and answers, in batch order).  Every member is 8-byte aligned. */
typedef struct mc_round {
  mc_slot *o;
  size_t *round;
  const char **keys;
  void **bufs;
  size_t *caps;
  int64_t *answers;
} mc_round;

#define MC_ROUND_ENTRY                                                        \
  (sizeof(mc_slot) + 2 * sizeof(size_t) + sizeof(char *) + sizeof(void *) +  \
   sizeof(int64_t))

static void round_carve(mc_round *m, unsigned char *p, size_t n) {
  m->o = (mc_slot *)(void *)p;
  m->round = (size_t *)(void *)(p += n * sizeof(mc_slot));
  m->keys = (const char **)(void *)(p += n * sizeof(size_t));
  m->bufs = (void **)(void *)(p += n * sizeof(char *));
  m->caps = (size_t *)(void *)(p += n * sizeof(void *));
  m->answers = (int64_t *)(void *)(p + n * sizeof(size_t));
}

/* Which occurrence of its key each of the n keys is (round[i]: 0 for the
 * first), using o (n slots); returns the number of rounds. */
static size_t read_rounds(const char *const *keys, size_t n, mc_slot *o,
                          size_t *round) {
  size_t rounds = 1;
  for (size_t i = 0; i < n; i++)
    o[i] = (mc_slot){keys[i], i}, round[i] = 0;
  qsort(o, n, sizeof(*o), slot_cmp);
  for (size_t i = 1; i < n; i++)
    if (strcmp(o[i].key, o[i - 1].key) == 0) {
      round[o[i].at] = round[o[i - 1].at] + 1;
      if (round[o[i].at] + 1 > rounds)
        rounds = round[o[i].at] + 1;
    }
  return rounds;
}

/*
 * Mooncake's batch_get_into keeps one buffer per key (a map from key to
 * buffer): a key asked twice in one batch fills one of its buffers only,
 * yet every one answers success, and the other would be judged as it was
 * left (a stale object in a reused staging slot would be a wrong hit).
 * So a batch with a key more than once is read in rounds, each key at
 * most once per round: round r reads the r-th occurrence of every key.
 * A batch of distinct keys (the usual one) is a single batch_get_into.
 */
static int mc_read(encache_store *st, const char *const *keys, size_t n,
                   void *const *bufs, const size_t *caps, int64_t *results) {
  if (n < 2)
    return read_batch(st, keys, n, bufs, caps, results);
  unsigned char *p = encache__calloc(n, MC_ROUND_ENTRY);
  if (p == NULL)
    return encache_store_fail(st, ENCACHE_EUNAVAIL, "out of memory");
  mc_round m;
  round_carve(&m, p, n);
  size_t rounds = read_rounds(keys, n, m.o, m.round);
  int rc = rounds == 1 ? read_batch(st, keys, n, bufs, caps, results) : 0;
  for (size_t r = 0; rounds > 1 && r < rounds && rc == 0; r++) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (m.round[i] == r) {
        m.o[k].at = i;
        m.keys[k] = keys[i], m.bufs[k] = bufs[i], m.caps[k++] = caps[i];
      }
    rc = read_batch(st, m.keys, k, m.bufs, m.caps, m.answers);
    for (size_t j = 0; rc == 0 && j < k; j++)
      results[m.o[j].at] = m.answers[j];
  }
  encache__free(p);
  return rc;
}

static int mc_object_size(encache_store *st, const char *key, uint64_t *len) {
  mooncake_store *s = ms(st);
  int64_t r = s->get_size(s->h, key);
  if (r < 0) {
    int c = encache__mooncake_classify_op(ENCACHE__MC_EXISTS, r);
    return encache_store_fail(st, c,
                              "%s: get_size %s: code %" PRId64 " (%s)",
                              s->base.url, key, r,
                              encache__mooncake_code_name(r));
  }
  *len = (uint64_t)r;
  return 0;
}

/* Makes write buffer i hold n bytes, registered.  Its writer owns it
 * (wbusy[i]), so no lock is needed for the buffer itself. */
static int wbuf_reserve(mooncake_store *s, int i, size_t n) {
  if (n <= s->wcap[i])
    return 0;
  if (s->wbuf[i] != NULL) {
    int rc = s->unregister_buffer(s->h, s->wbuf[i]);
    if (rc != 0) /* the Store may still use it: kept forever */
      return encache_store_fail(&s->base, ENCACHE_EUNCONFIRMED,
                                "%s: unregister_buffer answered %d",
                                s->base.url, rc);
    encache__aligned_free(s->wbuf[i]);
    s->wbuf[i] = NULL;
    s->wcap[i] = 0;
  }
  size_t cap = 1u << 20;
  while (cap < n)
    cap *= 2;
  void *p = encache__aligned_alloc(4096, cap);
  if (p == NULL)
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "out of memory: a %zu-byte write buffer", cap);
  int rc = s->register_buffer(s->h, p, cap);
  if (rc != 0) {
    encache__aligned_free(p);
    return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                              "%s: register_buffer of %zu bytes answered %d",
                              s->base.url, cap, rc);
  }
  s->wbuf[i] = p;
  s->wcap[i] = cap;
  return 0;
}

/* Takes a free write buffer (waiting for one): its index, or -1 when the
 * handle is poisoned. */
static int wbuf_take(mooncake_store *s) {
  pthread_mutex_lock(&s->wmu);
  int i = -1;
  while (!s->poisoned) {
    for (i = 0; i < MC_WBUFS && s->wbusy[i]; i++)
      ;
    if (i < MC_WBUFS)
      break;
    pthread_cond_wait(&s->wfree, &s->wmu);
  }
  if (s->poisoned)
    i = -1;
  else
    s->wbusy[i] = 1;
  pthread_mutex_unlock(&s->wmu);
  return i;
}

/* Gives buffer i back; rc EUNCONFIRMED poisons the handle (the buffer is
 * then kept busy: the Store may still read or register it). */
static void wbuf_give(mooncake_store *s, int i, int rc) {
  pthread_mutex_lock(&s->wmu);
  if (rc == ENCACHE_EUNCONFIRMED)
    s->poisoned = 1;
  else
    s->wbusy[i] = 0;
  pthread_cond_broadcast(&s->wfree);
  pthread_mutex_unlock(&s->wmu);
}

/* put_from of header + payload through write buffer i. */
static int put_via(mooncake_store *s, int i, const char *key, const void *hdr,
                   size_t hl, const void *payload, size_t len) {
  int rc = wbuf_reserve(s, i, hl + len);
  if (rc != 0)
    return rc;
  if (hl > 0) /* memcpy from NULL is undefined, even of 0 bytes */
    memcpy(s->wbuf[i], hdr, hl);
  if (len > 0)
    memcpy(s->wbuf[i] + hl, payload, len);
  int r = s->put_from(s->h, key, s->wbuf[i], hl + len, NULL);
  if (r >= 0)
    return 0;
  rc = encache__mooncake_classify_op(ENCACHE__MC_WRITE, r);
  return encache_store_fail(&s->base, rc, "%s: put_from %s: code %d (%s)",
                            s->base.url, key, r,
                            encache__mooncake_code_name(r));
}

/*
 * A write whose existence answer is `present` (mc_exists()'s, asked by
 * the publisher with other queued keys: ENCACHE_STORE_CONTROL_WRITE_KNOWN), or
 * MC_UNASKED.  As vLLM's publisher: an object counts as present only on
 * the answer 1; any other answer (absent, or a failed check) goes on to
 * the put, which never replaces an existing key in Mooncake.  The check
 * stays: the put answers success for an existing key too (see the top).
 */
#define MC_UNASKED (-1000)

static int mc_write_known(encache_store *st, const char *key, int present,
                          const void *hdr, size_t hl, const void *payload,
                          size_t len) {
  mooncake_store *s = ms(st);
  if (hl + len == 0) /* Mooncake accepts the put and stores nothing */
    return encache_store_fail(st, ENCACHE_EINVAL,
                              "%s: Mooncake cannot store an empty object",
                              s->base.url);
  const char *keys[1] = {key};
  int rc = 0;
  if (present == MC_UNASKED)
    rc = s->batch_is_exist(s->h, keys, 1, &present);
  if (rc == 0 && present == 1)
    return encache_store_fail(st, ENCACHE_EEXIST, "%s: key exists",
                              s->base.url);
  int i = wbuf_take(s);
  if (i < 0)
    return encache_store_fail(st, ENCACHE_EUNCONFIRMED,
                              "%s: an earlier write is unconfirmed: this "
                              "handle writes no more", s->base.url);
  rc = put_via(s, i, key, hdr, hl, payload, len);
  wbuf_give(s, i, rc);
  return rc;
}

static int mc_write(encache_store *st, const char *key, const void *hdr,
                    size_t hl, const void *payload, size_t len) {
  return mc_write_known(st, key, MC_UNASKED, hdr, hl, payload, len);
}

/* The one control request Mooncake knows: a write whose existence the
 * publisher asked ahead (ENCACHE_STORE_CONTROL_WRITE_KNOWN). */
static int mc_control(encache_store *st, int op, void *arg) {
  const encache_store_write_known *w = arg;
  if (op != ENCACHE_STORE_CONTROL_WRITE_KNOWN)
    return ENCACHE_STORE_CONTROL_UNKNOWN;
  if (w == NULL)
    return 0;
  return mc_write_known(st, w->key, w->present, w->hdr, w->hdr_len,
                        w->payload, w->len);
}

static int mc_remove(encache_store *st, const char *key) {
  mooncake_store *s = ms(st);
  int r = s->remove(s->h, key, 0);
  if (r >= 0)
    return 0;
  int c = encache__mooncake_classify_op(ENCACHE__MC_EXISTS, r);
  return encache_store_fail(st, c,
                            "%s: remove %s: code %d (%s)", s->base.url, key,
                            r, encache__mooncake_code_name(r));
}

/* Removes by the anchored, escaped regex of prefix.  Without force:
 * objects under a read lease (10 s after a read, by default) are skipped
 * by Mooncake, never torn from under a reader; a later run removes them. */
static int mc_remove_prefix(encache_store *st, const char *prefix,
                            uint64_t *removed) {
  mooncake_store *s = ms(st);
  char *re = encache__prefix_regex(prefix);
  if (re == NULL)
    return encache_store_fail(st, ENCACHE_ENOMEM, "out of memory");
  int64_t r = s->remove_by_regex(s->h, re, 0);
  if (r >= 0) {
    *removed = (uint64_t)r;
    encache__free(re);
    return 0;
  }
  int rc = encache_store_fail(st, ENCACHE_EUNAVAIL,
                              "%s: remove_by_regex %s: code %" PRId64 " (%s)",
                              s->base.url, re, r,
                              encache__mooncake_code_name(r));
  encache__free(re);
  return rc;
}

static int mc_register(encache_store *st, void *buf, size_t len) {
  mooncake_store *s = ms(st);
  int r = s->register_buffer(s->h, buf, len);
  return r == 0 ? 0
                : encache_store_fail(st, ENCACHE_EUNAVAIL,
                                     "%s: register_buffer answered %d",
                                     s->base.url, r);
}

static int mc_unregister(encache_store *st, void *buf) {
  mooncake_store *s = ms(st);
  int r = s->unregister_buffer(s->h, buf);
  return r == 0 ? 0
                : encache_store_fail(st, ENCACHE_EUNCONFIRMED,
                                     "%s: unregister_buffer answered %d",
                                     s->base.url, r);
}

static int mc_stats(encache_store *st, encache_store_stats *out) {
  mooncake_store *s = ms(st);
  int r = s->health(s->h);
  (void)out; /* Mooncake's C ABI reports no counters: all unknown */
  return r == 0 ? 0
                : encache_store_fail(st, ENCACHE_EUNAVAIL,
                                     "%s: health_check answered %d",
                                     s->base.url, r);
}

static void mc_close(encache_store *st) {
  mooncake_store *s = ms(st);
  if (s->h != NULL && !s->poisoned) {
    for (int i = 0; i < MC_WBUFS; i++)
      if (s->wbuf[i] != NULL && s->unregister_buffer(s->h, s->wbuf[i]) == 0)
        encache__aligned_free(s->wbuf[i]);
    s->destroy(s->h);
  }
  /* The library stays loaded: Mooncake's threads may outlive destroy. */
  pthread_cond_destroy(&s->wfree);
  pthread_mutex_destroy(&s->wmu);
  encache__free(s->base.url);
  encache__free(s);
}

#define MC_OPS_                                                                 \
  .size = sizeof(encache__store_ops),                                          \
  .version = ENCACHE_STORE_BACKEND_VERSION, .kind = "mooncake",                \
  .exists = mc_exists, .read = mc_read, .object_size = mc_object_size,         \
  .write = mc_write, .remove = mc_remove, .register_buffer = mc_register,      \
  .unregister_buffer = mc_unregister, .stats = mc_stats, .close = mc_close,  \
  .control = mc_control
#define MC_CAPS_                                                               \
  (ENCACHE_STORE_CAP_REGISTER | ENCACHE_STORE_CAP_PUT_IF_ABSENT |              \
   ENCACHE_STORE_CAP_SHARED | ENCACHE_STORE_CAP_READ_ABSENT |                  \
   ENCACHE_STORE_CAP_BUSY_WAIT)

/* Every handle starts from this table (mc_caps adapts its copy). */
static const encache__store_ops mooncake_ops = {MC_OPS_, .caps = MC_CAPS_};

/* The handle's capabilities: remove by prefix when the library exports
 * mooncake_store_remove_by_regex; no registration over "tcp" (Mooncake's
 * TCP transport reads into and writes from any memory of the process). */
static void mc_caps(mooncake_store *s, const char *protocol) {
  if (s->remove_by_regex != NULL) {
    s->ops.caps |= ENCACHE_STORE_CAP_REMOVE_PREFIX;
    s->ops.remove_prefix = mc_remove_prefix;
  }
  if (protocol != NULL && strcmp(protocol, "tcp") == 0) {
    s->ops.caps &= ~(unsigned)ENCACHE_STORE_CAP_REGISTER;
    s->ops.register_buffer = NULL;
    s->ops.unregister_buffer = NULL;
  }
}

/* Reads the client JSON (PATH of "mooncake:PATH", else
 * $MOONCAKE_CONFIG_PATH): a bad one is reported whatever the library. */
static int load_config(mooncake_store *s, const char *url,
                       encache_config **cfg) {
  const char *path = url[9] != '\0' ? url + 9 : NULL; /* "mooncake:" */
  int rc = encache_config_new(cfg);
  if (rc == 0)
    rc = encache_config_load_mooncake_file(*cfg, path);
  if (rc < 0) {
    /* Out of memory, the configuration may have no message to give. */
    const char *msg = rc == ENCACHE_ENOMEM ? "out of memory reading the "
                                             "client JSON"
                                           : encache_config_errmsg(*cfg);
    rc = rc == ENCACHE_ENOMEM ? rc : ENCACHE_ECONFIG;
    encache_store_fail(&s->base, rc, "%s: %s", url, msg);
  }
  return rc;
}

/* Loads Mooncake's store C ABI ($ENCACHE_MOONCAKE_LIBRARY) into s; the
 * create and setup functions go to *create and *setup. */
static int load_library(mooncake_store *s, const char *url,
                        mc_create_fn *create, mc_setup_fn *setup) {
  const char *lib = getenv("ENCACHE_MOONCAKE_LIBRARY");
  if (lib == NULL || lib[0] == '\0')
    lib = "libmooncake_store.so";
  s->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (s->lib == NULL)
    return encache_store_fail(&s->base, ENCACHE_ENOLIB,
                              "%s: cannot load %s (%s). Build Mooncake with "
                              "-DWITH_STORE_C_SHARED=ON and point "
                              "ENCACHE_MOONCAKE_LIBRARY at its "
                              "libmooncake_store.so (or put its directory on "
                              "LD_LIBRARY_PATH)", url, lib, dlerror());
  static const char *const names[] = {
      "mooncake_store_create",         "mooncake_store_destroy",
      "mooncake_store_setup",          "mooncake_store_health_check",
      "mooncake_store_put_from",       "mooncake_store_batch_get_into",
      "mooncake_store_batch_is_exist", "mooncake_store_get_size",
      "mooncake_store_remove",         "mooncake_store_register_buffer",
      "mooncake_store_unregister_buffer"};
  void *sym[sizeof(names) / sizeof(names[0])];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if ((sym[i] = dlsym(s->lib, names[i])) == NULL)
      return encache_store_fail(&s->base, ENCACHE_ENOLIB,
                                "%s: %s has no symbol %s: it is not "
                                "Mooncake's store C ABI (build with "
                                "-DWITH_STORE_C_SHARED=ON)", url, lib,
                                names[i]);
  memcpy(create, &sym[0], sizeof(*create));
  memcpy(&s->destroy, &sym[1], sizeof(s->destroy));
  memcpy(setup, &sym[2], sizeof(*setup));
  memcpy(&s->health, &sym[3], sizeof(s->health));
  memcpy(&s->put_from, &sym[4], sizeof(s->put_from));
  memcpy(&s->batch_get_into, &sym[5], sizeof(s->batch_get_into));
  memcpy(&s->batch_is_exist, &sym[6], sizeof(s->batch_is_exist));
  memcpy(&s->get_size, &sym[7], sizeof(s->get_size));
  memcpy(&s->remove, &sym[8], sizeof(s->remove));
  memcpy(&s->register_buffer, &sym[9], sizeof(s->register_buffer));
  memcpy(&s->unregister_buffer, &sym[10], sizeof(s->unregister_buffer));
  void *regex = dlsym(s->lib, "mooncake_store_remove_by_regex");
  if (regex != NULL)
    memcpy(&s->remove_by_regex, &regex, sizeof(s->remove_by_regex));
  return 0;
}

/* Creates the client and sets it up as the configuration says. */
static int setup_client(mooncake_store *s, const char *url,
                        const encache_config *cfg, mc_create_fn create,
                        mc_setup_fn setup) {
  const encache__opts *opt = encache__config_opts(cfg);
  const char *meta = opt->metadata_server, *proto = opt->protocol;
  const char *master = opt->master_server_address;
  s->h = create();
  int r = s->h == NULL ? -1
                       : setup(s->h, opt->local_hostname, meta,
                               opt->global_segment_size, opt->local_buffer_size,
                               proto, opt->device_name, master);
  if (r == 0) {
    mc_caps(s, proto);
    return 0;
  }
  if (s->h != NULL)
    s->destroy(s->h);
  s->h = NULL;
  return encache_store_fail(&s->base, ENCACHE_EUNAVAIL,
                            "%s: Mooncake setup (master %s, metadata %s, "
                            "protocol %s) answered %d", url, master, meta,
                            proto, r);
}

int encache__mooncake_open(const char *url, encache_store **out) {
  *out = NULL;
  mooncake_store *s = encache__calloc(1, sizeof(*s));
  if (s == NULL || (s->base.url = encache__strdup(url)) == NULL) {
    encache__free(s);
    return encache_store_fail(NULL, ENCACHE_ENOMEM, "out of memory");
  }
  s->ops = mooncake_ops;
  s->base.ops = &s->ops;
  pthread_mutex_init(&s->wmu, NULL);
  pthread_cond_init(&s->wfree, NULL);
  *out = &s->base;
  encache_config *cfg = NULL;
  mc_create_fn create = NULL;
  mc_setup_fn setup = NULL;
  int rc = load_config(s, url, &cfg);
  if (rc == 0)
    rc = load_library(s, url, &create, &setup);
  if (rc == 0)
    rc = setup_client(s, url, cfg, create, setup);
  if (rc == 0)
    encache__store_profile_set(&s->base);
  encache_config_free(cfg);
  return rc;
}
