/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publisher.c: the bounded asynchronous publisher (docs/behaviour.md,
 * Publication).  encache_publish() (publish.c) checks a view and hands
 * its publication here.
 *
 * A publication is handed over on the caller's thread and nothing is
 * copied: the budgets are applied, the view's backing storage retained
 * and a job queued.  Writer threads take jobs in order (up to 8 of them,
 * each one job at a time: writes_in_flight()): if the key exists a writer
 * does nothing (never replace), else it writes header +
 * payload straight from the caller's storage (a Store whose write never
 * replaces answers "exists" itself: no separate check).  For a backend
 * whose write asks existence first (Mooncake), the writer asks once for
 * the job it takes and the jobs queued behind it, and each write takes
 * its job's answer (publish_ask.c).  Finished jobs
 * wait on the done list until a reap (start of every lookup, before every
 * enqueue, at flush and at close) releases them on the caller's thread: their
 * budget charges, and their storage references (whose release callbacks
 * thus never run on a writer).
 *
 * Budgets: at most store_max_pending_items jobs and store_max_pending_bytes
 * bytes are retained.  Bytes are charged per backing storage, once however
 * many views of it are pending, and released when the last is reaped.
 *
 * A CUDA output (device.c) is the exception: publish queues its copy
 * into a pooled page-locked buffer on the output's stream, with an event
 * after it (no wait on the caller's thread), before the budgets are
 * applied; the writer waits for the event (bounded: else the job is
 * fatal) and writes the buffer; reaping gives the buffer back.
 *
 * A job whose write cannot be confirmed is fatal: it keeps its storage and
 * charge forever, the writers stop touching the Store (later jobs are
 * released unwritten), and the next reap poisons the handle.
 *
 * Invariants (under mu): pending_items = jobs queued + running + done (+
 * fatal); pending_bytes = sum of nbytes of storages with views_pending > 0.
 */
#include "publisher.h"
#include "publish_ask.h"
#include "publish_job.h"
#include "device.h"
#include "fleet.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef encache__job job;
typedef struct encache__publisher encache__publisher;

int encache_storage_new(const void *base, uint64_t nbytes,
                        void (*release)(void *ctx), void *ctx,
                        encache_storage **out) {
  if (out == NULL || (base == NULL && nbytes != 0))
    return ENCACHE_EINVAL;
  encache_storage *s = encache__calloc(1, sizeof(*s));
  if (s == NULL)
    return ENCACHE_ENOMEM;
  s->refs = 1;
  s->base = base;
  s->nbytes = nbytes;
  s->release = release;
  s->ctx = ctx;
  *out = s;
  return 0;
}

void encache_storage_ref(encache_storage *s) {
  if (s != NULL)
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

void encache_storage_unref(encache_storage *s) {
  if (s == NULL)
    return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    if (s->release != NULL)
      s->release(s->ctx);
    encache__free(s);
  }
}

static void publish_gauges(encache *ec) {
  __atomic_store_n(&ec->live->pending_items, ec->pub->pending_items, __ATOMIC_RELAXED);
  __atomic_store_n(&ec->live->pending_bytes, ec->pub->pending_bytes, __ATOMIC_RELAXED);
}

/* ----------------------------------------------------------------- worker */

static void set_why(job *j, const char *what, encache_store *st) {
  snprintf(j->why, sizeof(j->why), "%s: %s", what, encache_store_errmsg(st));
}

/* Registers buffer [p, p + n) for the job's write when the Store needs
 * it; 0, or ENCACHE_EUNAVAIL (recoverable: the write is not issued). */
static int register_part(encache_store *st, job *j, const void *p, size_t n,
                         const char *what, int *registered) {
  if (!encache__store_profile_of(st)->registered || n == 0)
    return 0;
  int rc = st->ops->register_buffer(st, (void *)(uintptr_t)p, n);
  if (encache_store_classify(rc) != ENCACHE_ANSWER_OK) {
    set_why(j, what, st);
    return ENCACHE_EUNAVAIL;
  }
  *registered = 1;
  return 0;
}

/* Unregisters a registered part; 0, or ENCACHE_EUNCONFIRMED (fatal: the
 * Store may still use the memory). */
static int unregister_part(encache_store *st, job *j, const void *p,
                           int registered, const char *what) {
  if (!registered)
    return 0;
  int rc = st->ops->unregister_buffer(st, (void *)(uintptr_t)p);
  if (encache_store_classify(rc) == ENCACHE_ANSWER_OK)
    return 0;
  set_why(j, what, st);
  return ENCACHE_EUNCONFIRMED;
}

/* The job's existence check: 1 when it decides the job's result (present,
 * failed, fatal: *result), 0 when the key is absent (write it). */
static int job_exists(encache_store *st, job *j, int *result) {
  const char *keys[1] = {j->key};
  int present = 0;
  int rc = st->ops->exists(st, keys, 1, &present);
  int cls = encache_store_classify(rc);
  if (cls == ENCACHE_ANSWER_OK)
    cls = encache_store_classify(present);
  if (cls == ENCACHE_ANSWER_ABSENT ||
      (cls == ENCACHE_ANSWER_OK && present == 0))
    return 0;
  if (cls == ENCACHE_ANSWER_OK && present == 1) {
    *result = ENCACHE__JOB_PRESENT;
  } else if (cls == ENCACHE_ANSWER_RECOVERABLE) {
    set_why(j, "existence check", st);
    *result = ENCACHE__JOB_FAILED;
  } else {
    set_why(j, "existence check unconfirmed", st);
    *result = ENCACHE__JOB_FATAL;
  }
  return 1;
}

/* What the write's answer means for the job. */
static int write_result(encache_store *st, job *j, int rc) {
  switch (encache_store_classify(rc)) {
  case ENCACHE_ANSWER_OK:
    return ENCACHE__JOB_WRITTEN;
  case ENCACHE_ANSWER_EXISTS:
    return ENCACHE__JOB_PRESENT;
  case ENCACHE_ANSWER_RECOVERABLE:
  case ENCACHE_ANSWER_TOO_LARGE:
    set_why(j, "write", st);
    return ENCACHE__JOB_FAILED;
  default:
    set_why(j, "write unconfirmed", st);
    return ENCACHE__JOB_FATAL;
  }
}

/* Runs one job against the Store; returns an enum encache__job_result.  A Store
 * whose write never replaces (ENCACHE_STORE_CAP_PUT_IF_ABSENT) answers
 * "already there" itself (ENCACHE_EEXIST): no existence check first. */
static int run_job(encache *ec, job *j) {
  encache_store *st = ec->store;
  /* A CUDA output: its copy into the pinned buffer first (bounded). */
  if (j->pinned != NULL &&
      encache__pinned_wait(ec, j->pinned, j->why, sizeof(j->why)) < 0)
    return ENCACHE__JOB_FATAL;
  int result;
  if (!encache__store_profile_of(st)->put_if_absent &&
      job_exists(st, j, &result))
    return result;
  int reg_hdr = 0, reg_data = 0;
  if (register_part(st, j, j->hdr, sizeof(j->hdr), "registering the header",
                    &reg_hdr) < 0)
    return ENCACHE__JOB_FAILED; /* the write is not issued */
  if (register_part(st, j, j->data, (size_t)j->nbytes,
                    "registering the payload", &reg_data) < 0) {
    result = ENCACHE__JOB_FAILED;
  } else {
    uint64_t t0 = encache__fleet_clock(ec->fleet);
    encache_store_write_known w = {sizeof(w),      j->key,  j->hdr,
                                   sizeof(j->hdr), j->data, (size_t)j->nbytes,
                                   j->present};
    int rc =
        j->asked
            ? encache__store_control(st, ENCACHE_STORE_CONTROL_WRITE_KNOWN, &w)
            : st->ops->write(st, j->key, j->hdr, sizeof(j->hdr), j->data,
                             (size_t)j->nbytes);
    result = write_result(st, j, rc);
    encache__fleet_observe(ec->fleet, ENCACHE__FLEET_WRITE, t0,
                           result == ENCACHE__JOB_WRITTEN ? sizeof(j->hdr) + j->nbytes
                                                 : 0);
    if (result == ENCACHE__JOB_FATAL)
      return result; /* keep everything registered and retained */
  }
  if (unregister_part(st, j, j->data, reg_data, "unregistering the payload") < 0 ||
      unregister_part(st, j, j->hdr, reg_hdr, "unregistering the header") < 0)
    return ENCACHE__JOB_FATAL;
  return result;
}

/* How an idle writer waits: for a while it polls (1 ms timed waits, up
 * to IDLE_POLLS of them) and publishers do not signal it, so that during
 * a burst of encoder steps encache_publish() never pays for a wake-up
 * system call; after that it sleeps until signalled. */
#define IDLE_POLL_NS 1000000L
#define IDLE_POLLS 200

static void wait_for_work(encache *ec, int *polls) {
  if (*polls < IDLE_POLLS) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += IDLE_POLL_NS;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    (*polls)++;
    pthread_cond_timedwait(&ec->pub->work, &ec->pub->mu, &ts);
  } else {
    ec->pub->worker_waiting++; /* a count: several writers may sleep */
    pthread_cond_wait(&ec->pub->work, &ec->pub->mu);
    ec->pub->worker_waiting--;
  }
}

/* Takes j off the running list.  Under mu. */
static void running_remove(encache *ec, job *j) {
  for (job **pp = &ec->pub->running; *pp != NULL; pp = &(*pp)->next)
    if (*pp == j) {
      *pp = j->next;
      return;
    }
}

static void *worker_main(void *arg) {
  encache *ec = arg;
  int polls = 0;
  pthread_mutex_lock(&ec->pub->mu);
  for (;;) {
    while (ec->pub->queue_head == NULL && !ec->pub->closing)
      wait_for_work(ec, &polls);
    polls = 0;
    job *j = ec->pub->queue_head;
    if (j == NULL)
      break; /* closing, and drained */
    ec->pub->queue_head = j->next;
    if (ec->pub->queue_head == NULL)
      ec->pub->queue_tail = NULL;
    j->next = ec->pub->running;
    ec->pub->running = j;
    if (!ec->pub->writers_fatal)
      encache__ask_ahead(ec, j); /* may unlock and lock mu */
    int fatal_seen = ec->pub->writers_fatal;
    pthread_mutex_unlock(&ec->pub->mu);

    int result;
    if (fatal_seen || encache__is_poisoned(ec)) {
      snprintf(j->why, sizeof(j->why), "not written: the handle is poisoned");
      result = ENCACHE__JOB_FAILED; /* the Store is not touched again */
    } else {
      result = run_job(ec, j);
      /* Written (or there, or not written): the waiters may go on. */
      if (result != ENCACHE__JOB_FATAL)
        encache__lease_end(ec, j->key, j->lease);
    }

    pthread_mutex_lock(&ec->pub->mu);
    if (result == ENCACHE__JOB_FATAL)
      ec->pub->writers_fatal = 1;
    j->result = result;
    j->done = 1;
    running_remove(ec, j);
    j->next = ec->pub->done_head;
    ec->pub->done_head = j;
    if (ec->pub->queue_head == NULL && ec->pub->running == NULL)
      pthread_cond_broadcast(&ec->pub->idle);
  }
  pthread_cond_broadcast(&ec->pub->idle);
  pthread_mutex_unlock(&ec->pub->mu);
  return NULL;
}

/* How many writes to keep in flight: store_writes_in_flight, else the
 * Store's choice (its profile's: src/store/base.c). */
static unsigned writes_in_flight(const encache *ec) {
  if (ec->writes_in_flight > 0)
    return ec->writes_in_flight;
  return encache__store_profile_of(ec->store)->writes_in_flight;
}

/* Starts the writers.  One that cannot start leaves fewer writes in
 * flight, nothing else; none at all fails the open. */
int encache__publisher_start(encache *ec) {
  encache__publisher *pub = encache__calloc(1, sizeof(*pub));
  if (pub == NULL)
    return ENCACHE_ENOMEM;
  pthread_mutex_init(&pub->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the writers' polls */
  pthread_cond_init(&pub->work, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&pub->idle, NULL);
  ec->pub = pub;
  int rc = 0, want = (int)writes_in_flight(ec);
  while (pub->nwriters < want &&
         (rc = pthread_create(&pub->writers[pub->nwriters], NULL, worker_main,
                              ec)) == 0)
    pub->nwriters++;
  if (pub->nwriters > 0)
    return 0;
  encache__publisher_free(ec);
  return -rc;
}

void encache__publisher_stop(encache *ec) {
  encache__publisher *pub = ec->pub;
  if (pub == NULL)
    return;
  pthread_mutex_lock(&pub->mu);
  pub->closing = 1;
  pthread_cond_broadcast(&pub->work);
  pthread_mutex_unlock(&pub->mu);
  for (int i = 0; i < pub->nwriters; i++)
    pthread_join(pub->writers[i], NULL);
  pub->nwriters = 0;
}

void encache__publisher_free(encache *ec) {
  encache__publisher *pub = ec->pub;
  if (pub == NULL)
    return;
  ENCACHE_ASSERT(pub->nwriters == 0 && pub->fatal_jobs == NULL);
  pthread_mutex_destroy(&pub->mu);
  pthread_cond_destroy(&pub->work);
  pthread_cond_destroy(&pub->idle);
  encache__free(pub);
  ec->pub = NULL;
}

/* ------------------------------------------------------------------- reap */

int encache__reap(encache *ec) {
  if (ec->pub == NULL) /* disabled, or not started */
    return encache__is_poisoned(ec) ? ENCACHE_EPOISONED : 0;
  pthread_mutex_lock(&ec->pub->mu);
  job *done = ec->pub->done_head;
  ec->pub->done_head = NULL;
  job *release = NULL;
  const char *fatal_why = NULL;
  char why[400];
  while (done != NULL) {
    job *j = done;
    done = j->next;
    if (j->result == ENCACHE__JOB_FATAL) {
      /* Kept forever, with its charge and its storage. */
      j->next = ec->pub->fatal_jobs;
      ec->pub->fatal_jobs = j;
      snprintf(why, sizeof(why), "%.160s (%.200s)", j->why, j->key);
      fatal_why = why;
      continue;
    }
    encache_storage *s = j->storage;
    if (--s->views_pending == 0)
      ec->pub->pending_bytes -= s->nbytes;
    ec->pub->pending_items--;
    j->next = release;
    release = j;
  }
  publish_gauges(ec);
  pthread_mutex_unlock(&ec->pub->mu);

  /* Outside the lock: counters, then the caller's release callbacks. */
  while (release != NULL) {
    job *j = release;
    release = j->next;
    switch (j->result) {
    case ENCACHE__JOB_WRITTEN: ENCACHE__COUNT(ec, published_written, 1); break;
    case ENCACHE__JOB_PRESENT: ENCACHE__COUNT(ec, published_present, 1); break;
    default:
      ENCACHE__COUNT(ec, published_failed, 1);
      if (ec->log != NULL) { /* the Store's reason, on the caller's thread */
        char msg[512];
        snprintf(msg, sizeof(msg), "encache: %s not written: %s", j->key,
                 j->why);
        ec->log(ec->log_ctx, msg);
      }
      break;
    }
    if (j->pinned != NULL)
      encache__pinned_release(ec, j->pinned);
    encache_storage_unref(j->storage);
    encache__free(j->key);
    encache__free(j);
  }
  if (fatal_why != NULL)
    return encache__poison(ec, "a publication's write is unconfirmed: %s",
                           fatal_why);
  return encache__is_poisoned(ec) ? ENCACHE_EPOISONED : 0;
}

int encache_flush(encache *ec) {
  if (ec == NULL)
    return ENCACHE_EINVAL;
  if (!ec->enabled)
    return 0;
  encache__enter(ec); /* a started lookup may be running: its turn first */
  pthread_mutex_lock(&ec->pub->mu);
  while (ec->pub->queue_head != NULL || ec->pub->running != NULL)
    pthread_cond_wait(&ec->pub->idle, &ec->pub->mu);
  pthread_mutex_unlock(&ec->pub->mu);
  int rc = encache__reap(ec);
  encache__leave(ec);
  return rc;
}

static int key_pending(const encache *ec, const char *key) {
  const job *lists[3] = {ec->pub->queue_head, ec->pub->running, ec->pub->done_head};
  for (int l = 0; l < 3; l++)
    for (const job *j = lists[l]; j != NULL; j = j->next)
      if (strcmp(j->key, key) == 0)
        return 1;
  return 0;
}

/* Queues j under the budgets: ENCACHE_QUEUED or a skip reason; with
 * dry_run, only says (a CUDA output checks before its copy). */
static int enqueue(encache *ec, job *j, int dry_run) {
  encache_storage *storage = j->storage;
  pthread_mutex_lock(&ec->pub->mu);
  int reason = ENCACHE_QUEUED;
  uint64_t charge = storage->views_pending == 0 ? storage->nbytes : 0;
  if (ec->pub->closing)
    reason = ENCACHE_SKIP_CLOSED;
  else if (key_pending(ec, j->key))
    reason = ENCACHE_SKIP_PENDING;
  else if (ec->pub->pending_items + 1 > ec->max_items)
    reason = ENCACHE_SKIP_OVER_ITEMS;
  else if (charge > ec->max_bytes - ec->pub->pending_bytes)
    reason = ENCACHE_SKIP_OVER_BYTES;
  if (reason == ENCACHE_QUEUED && !dry_run) {
    __atomic_add_fetch(&storage->refs, 1, __ATOMIC_RELAXED);
    storage->views_pending++;
    ec->pub->pending_bytes += charge;
    ec->pub->pending_items++;
    j->seq = ++ec->pub->job_seq;
    if (ec->pub->queue_tail != NULL)
      ec->pub->queue_tail->next = j;
    else
      ec->pub->queue_head = j;
    ec->pub->queue_tail = j;
    publish_gauges(ec);
    /* Wake a writer only if one sleeps: a busy one finds the job, and
     * the caller's thread is spared a system call. */
    if (ec->pub->worker_waiting)
      pthread_cond_signal(&ec->pub->work);
  }
  pthread_mutex_unlock(&ec->pub->mu);
  return reason;
}

int encache__storage_holds(const encache_storage *s, const void *data,
                           uint64_t nbytes) {
  const unsigned char *d = data;
  return nbytes == 0 ||
         (d != NULL && d >= s->base && (uint64_t)(d - s->base) <= s->nbytes &&
          nbytes <= s->nbytes - (uint64_t)(d - s->base));
}

/* Frees a job that was never queued (its pinned buffer back to the pool). */
static void job_drop(encache *ec, job *j) {
  if (j->pinned != NULL)
    encache__pinned_release(ec, j->pinned);
  encache__free(j->key);
  encache__free(j);
}

int encache__publisher_submit(encache *ec, const encache__publication *pb) {
  job *j = encache__calloc(1, sizeof(*j));
  if (j == NULL) {
    encache__free(pb->key);
    return encache__fail(ec, ENCACHE_ENOMEM, "publish: out of memory");
  }
  j->key = pb->key;
  j->lease = pb->lease;
  j->storage = pb->storage;
  j->data = pb->data;
  j->nbytes = pb->nbytes;
  memcpy(j->hdr, pb->hdr, sizeof(j->hdr));
  int reason;
  if (pb->device != NULL) { /* budgets first: the copy is queued at once */
    if ((reason = enqueue(ec, j, 1)) != ENCACHE_QUEUED ||
        (reason = encache__device_publish_begin(ec, pb->device, pb->nbytes,
                                                &j->pinned)) != 0) {
      job_drop(ec, j);
      return reason;
    }
    j->data = encache__pinned_data(j->pinned);
  }
  if ((reason = enqueue(ec, j, 0)) != ENCACHE_QUEUED) {
    job_drop(ec, j);
    return reason;
  }
  ENCACHE__COUNT(ec, published_queued, 1);
  if (j->pinned != NULL)
    ENCACHE__COUNT(ec, device_published, 1);
  return ENCACHE_QUEUED;
}
