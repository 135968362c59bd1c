/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine.c: the top of the engine: opening and closing the handle, and
 * its statistics.  The handle's core (messages, poison, keys) is core.c,
 * the read path lookup.c, the publisher publisher.c.
 *
 * A handle opened with cross_encoder_cache false holds nothing but its
 * configuration: no Store, no worker thread, no buffers.
 *
 * A failed open frees its handle and leaves its message for the calling
 * thread's encache_errmsg(NULL).
 */
#include "engine.h"
#include "device.h"
#include "fleet.h"
#include "lookup.h"
#include "lookup_async.h"
#include "lookup_read.h"
#include "publisher.h"
#include "step.h"
#include "config/opts.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Another part's message for rc, or rc's own when that part left none
 * (the engine's message is never empty). */
static const char *detail(const char *msg, int rc) {
  return msg != NULL && msg[0] != '\0' ? msg : encache_strerror(rc);
}

/* The configuration of o: its typed `config` (the caller's), else a new
 * one parsed from the JSON (*own, freed by the caller). */
static int load_config(encache *ec, const encache_options *o,
                       encache_config **own, encache_config **cfg) {
  *own = NULL;
  if (o->config != NULL) {
    /* The deployment check records its message in the configuration:
     * the one write encache_open() makes to the caller's (documented at
     * encache_options.config). */
    *cfg = (encache_config *)(uintptr_t)o->config;
    return 0;
  }
  int rc = encache_config_new(own);
  if (rc < 0)
    return encache__fail(ec, rc, "out of memory");
  *cfg = *own;
  size_t len = o->ec_transfer_config_len ? o->ec_transfer_config_len
                                         : strlen(o->ec_transfer_config);
  rc = encache_config_load_ec(*cfg, o->ec_transfer_config, len);
  return rc < 0 ? encache__fail(ec, rc, "%s",
                                detail(encache_config_errmsg(*cfg), rc))
                : 0;
}

/* Keeps the registry's options for open_store() (fleet.c). */
static int fleet_options(encache *ec, const encache__opts *opt) {
  const char *seg = opt->stats_segment;
  char def[64];
  if (seg == NULL && ((seg = getenv("ENCACHE_STATS_SEGMENT")) == NULL ||
                      seg[0] == '\0'))
    seg = encache__fleet_default(def, sizeof(def)); /* per user (fleet.c) */
  if ((ec->fleet_segment = encache__strdup(seg)) == NULL)
    return ENCACHE_ENOMEM;
  if (opt->encoder_name != NULL &&
      (ec->fleet_encoder = encache__strdup(opt->encoder_name)) == NULL)
    return ENCACHE_ENOMEM;
  return 0;
}

/* Gives up the handle's registry slot (if any): it counts in its own
 * memory again, from the slot's last values. */
static void fleet_leave(encache *ec) {
  if (ec->fleet != NULL) {
    memcpy(&ec->stats, ec->live, sizeof(ec->stats));
    ec->live = &ec->stats;
    encache__fleet_detach(ec->fleet);
    ec->fleet = NULL;
  }
  encache__free(ec->fleet_segment);
  encache__free(ec->fleet_encoder);
  ec->fleet_segment = ec->fleet_encoder = NULL;
}

/* Everything the configuration decides, checked before any resource. */
static int configure(encache *ec, const encache_options *o) {
  encache_config *own = NULL, *cfg = NULL;
  int rc = load_config(ec, o, &own, &cfg);
  if (rc < 0) {
    encache_config_free(own);
    return rc;
  }
  rc = encache_config_check_deployment(cfg, o->deployment);
  if (rc < 0) {
    encache__fail(ec, rc, "%s", detail(encache_config_errmsg(cfg), rc));
    encache_config_free(own);
    return rc;
  }
  const encache__opts *opt = encache__config_opts(cfg);
  ec->enabled = opt->cross_encoder_cache;
  ec->max_items = opt->store_max_pending_items;
  ec->max_bytes = opt->store_max_pending_bytes;
  ec->read_buf_bytes = opt->store_read_buffer_bytes;
  ec->single_flight = opt->single_flight;
  ec->lease_ttl_ms = opt->single_flight_ttl_ms > UINT32_MAX
                         ? UINT32_MAX
                         : (uint32_t)opt->single_flight_ttl_ms;
  ec->lease_wait_ms = opt->single_flight_wait_ms;
  ec->pinned_pool_max = opt->device_pinned_pool_bytes;
  ec->device_timeout_ms = opt->device_sync_timeout_ms;
  ec->writes_in_flight = opt->store_writes_in_flight > ENCACHE__WRITES_MAX
                             ? ENCACHE__WRITES_MAX + 1
                             : (unsigned)opt->store_writes_in_flight;
  ec->reads_in_flight = opt->store_reads_in_flight > ENCACHE__WRITES_MAX
                            ? ENCACHE__WRITES_MAX + 1
                            : (unsigned)opt->store_reads_in_flight;

  /* The namespace as vLLM writes it (encache_config_namespace): an
   * identity of "" or null gives "model:" or "model:None", with a warning
   * for the log. */
  int n = encache_config_namespace(cfg, o->model, o->revision,
                                   o->encoder_hash, o->model_dtype, NULL, 0);
  if (n == ENCACHE_EINVAL)
    rc = encache__fail(ec, ENCACHE_EINVAL,
                       "model: required (the model path as given to the "
                       "encoder) unless embedding_model_identity is set");
  else if (encache_dtype_size(o->model_dtype) == 0)
    rc = encache__fail(ec, ENCACHE_EDTYPE,
                       "model_dtype: %d is not float32, float16 or bfloat16",
                       o->model_dtype);
  else if (ec->writes_in_flight > ENCACHE__WRITES_MAX ||
           ec->reads_in_flight > ENCACHE__WRITES_MAX)
    rc = encache__fail(ec, ENCACHE_ECONFIG,
                       "store_%s_in_flight: %" PRIu64 " is too many (at "
                       "most %d; 0: the Store's choice)",
                       ec->writes_in_flight > ENCACHE__WRITES_MAX ? "writes"
                                                                  : "reads",
                       ec->writes_in_flight > ENCACHE__WRITES_MAX
                           ? opt->store_writes_in_flight
                           : opt->store_reads_in_flight,
                       ENCACHE__WRITES_MAX);
  else if (opt->single_flight_wait_ms > 3600000 ||
           opt->single_flight_ttl_ms > 3600000)
    rc = encache__fail(ec, ENCACHE_ECONFIG,
                       "single_flight_%s_ms: at most 3600000 (one hour)",
                       opt->single_flight_wait_ms > 3600000 ? "wait" : "ttl");
  else if (ec->read_buf_bytes > SIZE_MAX / 2)
    rc = encache__fail(ec, ENCACHE_ECONFIG,
                       "store_read_buffer_bytes: too large for this machine");
  else if (n < 0)
    rc = encache__fail(ec, n, "namespace: %s", encache_strerror(n));
  if (rc == 0) {
    if ((ec->ns = encache__malloc((size_t)n + 1)) == NULL ||
        encache_config_namespace(cfg, o->model, o->revision, o->encoder_hash,
                                 o->model_dtype, ec->ns, (size_t)n + 1) < 0 ||
        fleet_options(ec, opt) < 0)
      rc = encache__fail(ec, ENCACHE_ENOMEM, "out of memory");
  }
  for (int i = 0; rc == 0 && ec->log != NULL &&
                  i < encache_config_warning_count(cfg); i++)
    ec->log(ec->log_ctx, encache_config_warning_at(cfg, i));
  encache_config_free(own);
  return rc;
}

/* The caller's options, checked, into *o (this library's struct). */
static int take_options(const encache_options *in, encache **out,
                        encache_options *o) {
  if (out == NULL)
    return encache__thread_failed(ENCACHE_EINVAL, "encache_open: out is NULL");
  if (in == NULL)
    return encache__thread_failed(ENCACHE_EINVAL,
                                  "encache_open: options are NULL");
  if (encache__struct_in(o, sizeof(*o), in, ENCACHE__OPTIONS_MIN) < 0)
    return encache__thread_failed(
        ENCACHE_EINVAL,
        "encache_open: options.size %zu: not an "
        "encache_options of this library (sizeof %zu; a "
        "larger one must hold zeros beyond it)",
        in->size, sizeof(*o));
  if ((o->ec_transfer_config == NULL) == (o->config == NULL))
    return encache__thread_failed(
        ENCACHE_EINVAL,
        "encache_open: give exactly one of "
        "ec_transfer_config (the vLLM JSON) and config (%s)",
        o->config != NULL ? "both are set" : "neither is");
  return 0;
}

/* Frees the handle itself, once nothing of it is in use. */
static void handle_free(encache *ec) {
  encache__steps_close_all(ec);
  encache__async_free(ec);
  fleet_leave(ec);
  encache__lookup_free(&ec->lane);
  encache__publisher_free(ec);
  encache__free(ec->ns);
  pthread_mutex_destroy(&ec->run);
  encache__free(ec);
}

/* Frees what a failed open built (the Store included) and keeps its
 * message for encache_errmsg(NULL). */
static int open_failed(encache *ec, int rc) {
  encache__thread_failed(rc, "%s", ec->errmsg);
  encache_store_close(ec->store);
  handle_free(ec);
  return rc;
}

/* single_flight needs a Store with leases: without, it is off (said). */
static void check_single_flight(encache *ec) {
  if (!ec->single_flight || encache__store_profile_of(ec->store)->lease)
    return;
  ec->single_flight = 0;
  if (ec->log != NULL)
    ec->log(ec->log_ctx, "encache: single_flight is on but this Store has "
                         "no leases: every miss is encoded, as without it");
}

static int open_store(encache *ec, const char *url, encache_store *given) {
  int rc = 0;
  if (given != NULL)
    ec->store = given;
  else if ((rc = encache_store_open(url, &ec->store)) < 0) {
    encache__fail(ec, rc, "store: %s",
                  detail(encache_store_errmsg(ec->store), rc));
    encache_store_close(ec->store);
    ec->store = NULL;
  }
  if (rc == 0) {
    check_single_flight(ec);
    /* Before the worker starts: from here on it counts in ec->live. */
    ec->fleet = encache__fleet_attach(ec->fleet_segment, ec->fleet_encoder,
                                      encache_store_url(ec->store), ec->ns,
                                      ec->log, ec->log_ctx);
    if (ec->fleet != NULL)
      ec->live = encache__fleet_stats(ec->fleet);
  }
  return rc;
}

static int open_common(const encache_options *in, encache_store *given,
                       encache **out) {
  encache_options o;
  if (out != NULL)
    *out = NULL;
  int rc = take_options(in, out, &o);
  encache *ec = rc < 0 ? NULL : encache__calloc(1, sizeof(*ec));
  if (ec == NULL) {
    encache_store_close(given);
    return rc < 0 ? rc
                  : encache__thread_failed(
                        ENCACHE_ENOMEM,
                        "encache_open: out of memory (the handle)");
  }
  ec->live = &ec->stats;
  pthread_mutex_init(&ec->run, NULL);
  ec->log = o.log;
  ec->log_ctx = o.log_ctx;
  rc = configure(ec, &o);
  if (rc < 0 || !ec->enabled)
    encache_store_close(given);
  else if ((rc = open_store(ec, o.store_url, given)) == 0 &&
           (rc = encache__publisher_start(ec)) < 0)
    encache__fail(ec, rc, "cannot start the publisher thread: %s",
                  encache_strerror(rc));
  if (rc < 0)
    return open_failed(ec, rc);
  *out = ec;
  return 0;
}

int encache_open(const encache_options *o, encache **out) {
  return open_common(o, NULL, out);
}

int encache__open_with_store(const encache_options *o, encache_store *st,
                             encache **out) {
  return open_common(o, st, out);
}

/* Closed poisoned handles, kept reachable on purpose: the Store may still
 * write into their buffers, so they are never freed, and a leak checker
 * should see them as kept, not lost. */
static encache *graveyard;
static pthread_mutex_t graveyard_mu = PTHREAD_MUTEX_INITIALIZER;

static int bury(encache *ec) {
  encache__steps_close_all(ec); /* the Store never holds a step's memory */
  fleet_leave(ec);
  pthread_mutex_lock(&graveyard_mu);
  ec->next_buried = graveyard;
  graveyard = ec;
  pthread_mutex_unlock(&graveyard_mu);
  return ENCACHE_EPOISONED;
}

int encache_close(encache *ec) {
  if (ec == NULL)
    return 0;
  int rc = 0;
  /* The lookup it runs completes first (queued ones never run): then
   * nothing but this thread uses the handle. */
  encache__async_stop(ec);
  if (ec->enabled && ec->store != NULL) {
    encache__publisher_stop(ec);
    rc = encache__reap(ec);
    if (rc == 0 && encache__staging_unregister(ec, &ec->lane) == 0)
      encache__async_unregister(ec); /* each poisons when it fails */
    if (!encache__is_poisoned(ec))
      encache__device_free(ec); /* poisons when a copy is unconfirmed */
    if (encache__is_poisoned(ec)) {
      /* The Store may still write into the staging buffer and the kept
       * jobs' memory: leave them, and the Store, alone. */
      return bury(ec);
    }
    /* Before the Store goes: the steps end the leases they still hold
     * (after the queued writes, which ended theirs). */
    encache__steps_close_all(ec);
    encache__aligned_free(ec->lane.staging);
    encache_store_close(ec->store);
  } else if (encache__is_poisoned(ec)) {
    return bury(ec);
  }
  handle_free(ec);
  return rc;
}

int encache_stats_get(const encache *ec, encache_stats *st) {
  if (ec == NULL || st == NULL)
    return ENCACHE_EINVAL;
  encache_stats full;
  memset(&full, 0, sizeof(full));
  const uint64_t *src = &ec->live->lookups;
  uint64_t *dst = &full.lookups;
  /* Every field from `lookups` up to `poisoned` is a uint64_t counter. */
  _Static_assert((offsetof(encache_stats, poisoned) -
                  offsetof(encache_stats, lookups)) % sizeof(uint64_t) == 0,
                 "encache_stats: the counters are uint64_t, then poisoned");
  size_t n = (offsetof(encache_stats, poisoned) -
              offsetof(encache_stats, lookups)) / sizeof(uint64_t);
  for (size_t i = 0; i < n; i++)
    dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  full.poisoned = __atomic_load_n(&ec->poisoned, __ATOMIC_ACQUIRE);
  /* The counters added in 1.2, after poisoned, up to the end. */
  src = &ec->live->in_flight;
  dst = &full.in_flight;
  n = (sizeof(encache_stats) - offsetof(encache_stats, in_flight)) /
      sizeof(uint64_t);
  for (size_t i = 0; i < n; i++)
    dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  return encache__struct_out(st, &full, sizeof(full), ENCACHE__STATS_MIN);
}

uint64_t encache_stats_skipped(const encache_stats *st, int reason) {
  if (st == NULL || reason <= 0 || reason >= ENCACHE_SKIP_REASONS_)
    return 0;
  if (reason < ENCACHE_SKIP_COUNT_)
    return st->published_skipped[reason];
  if (st->size < offsetof(encache_stats, published_mismatch) +
                     sizeof(st->published_mismatch))
    return 0;
  return st->published_mismatch;
}

/* Any thread: a failure's message goes to the calling thread's
 * encache_errmsg(NULL), never into ec's (the encoder thread's). */
int encache_engine_store_stats(const encache *ec, encache_store_stats *st) {
  if (ec == NULL || st == NULL || ec->store == NULL)
    return encache__thread_failed(ENCACHE_EINVAL, "encache_engine_store_stats: "
                                  "%s", ec == NULL || st == NULL
                                            ? "a NULL argument"
                                            : "a disabled handle has no Store");
  int rc = encache_store_stats_get(ec->store, st);
  if (rc < 0) {
    const char *m = encache_store_errmsg(ec->store);
    encache__thread_failed(rc, "the Store's stats: %s: %s",
                           encache_store_url(ec->store),
                           m[0] ? m : encache_strerror(rc));
  }
  return rc;
}
