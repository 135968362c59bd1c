/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publish_ask.c: asking existence ahead, for a Store that answers
 * ENCACHE_STORE_CONTROL_WRITE_KNOWN (its write asks existence first, as
 * Mooncake's does: its profile's ask_ahead, src/store/base.h).  The
 * writer that takes a job not yet asked for asks exists() for it and the
 * jobs queued behind it (at most ASK_AHEAD) in one call, and hands each
 * answer to its job if that job is its own or still queued; a job another
 * writer took meanwhile asks for itself.  The answers live in the jobs:
 * none outlives its job.  The question is vLLM's (present only on 1),
 * asked a few writes earlier.
 */
#include "publish_ask.h"

#include <string.h>

#define ASK_AHEAD 32

typedef struct ask {
  encache__job *jobs[ASK_AHEAD];
  uint64_t seqs[ASK_AHEAD]; /* each job's seq: its address may be reused */
  const char *keys[ASK_AHEAD];
  int present[ASK_AHEAD];
  size_t n;
  char *text; /* the keys, copied: a job another writer finishes may be
               * reaped (freed) while the question is out */
} ask;

/* Under mu: j (just taken) and the queued jobs behind it that nobody has
 * asked for, marked as being asked.  Returns 1 when there is something
 * worth asking (two keys or more), else 0 (nothing marked). */
static int ask_collect(encache *ec, encache__job *j, ask *a) {
  size_t len = 0, k = 0;
  a->n = 0;
  if (!encache__store_profile_of(ec->store)->ask_ahead || j->asked || j->asking)
    return 0;
  for (encache__job *q = j; q != NULL && k < ASK_AHEAD;
       q = q == j ? ec->pub->queue_head : q->next)
    if (!q->asked && !q->asking)
      a->jobs[k++] = q, len += strlen(q->key) + 1;
  char *at = a->text = k > 1 ? encache__malloc(len) : NULL;
  for (size_t i = 0; at != NULL && i < k; i++) {
    size_t l = strlen(a->jobs[i]->key) + 1;
    a->keys[i] = memcpy(at, a->jobs[i]->key, l);
    a->seqs[i] = a->jobs[i]->seq;
    at += l;
    a->jobs[i]->asking = 1;
  }
  a->n = a->text != NULL ? k : 0;
  return a->n > 0;
}

/* Under mu: whether the job at q, queued as number seq, is still queued
 * (a job taken meanwhile may be gone, and another queued at its
 * address: the seq tells them apart). */
static int still_queued(const encache *ec, const encache__job *q,
                        uint64_t seq) {
  for (const encache__job *p = ec->pub->queue_head; p != NULL; p = p->next)
    if (p == q)
      return p->seq == seq;
  return 0;
}

/* Under mu: the answers to j and to the jobs still queued.  rc is the
 * exists() call's: a failed call answers every key "not known present"
 * (ENCACHE_EUNAVAIL), so that each write goes on to its put as vLLM's
 * does after a failed check, without asking again. */
static void ask_deliver(encache *ec, encache__job *j, ask *a, int rc) {
  for (size_t i = 0; i < a->n; i++) {
    encache__job *q = a->jobs[i];
    if (q != j && !still_queued(ec, q, a->seqs[i]))
      continue; /* taken by another writer (maybe gone): it asked */
    q->asking = 0;
    q->asked = 1;
    q->present = rc == 0 ? a->present[i] : ENCACHE_EUNAVAIL;
  }
  encache__free(a->text);
}

void encache__ask_ahead(encache *ec, encache__job *j) {
  ask a;
  if (encache__is_poisoned(ec) || !ask_collect(ec, j, &a))
    return; /* a poisoned handle touches the Store no more */
  pthread_mutex_unlock(&ec->pub->mu);
  encache_store *st = ec->store;
  int rc = st->ops->exists(st, a.keys, a.n, a.present);
  pthread_mutex_lock(&ec->pub->mu);
  ask_deliver(ec, j, &a, rc);
}
