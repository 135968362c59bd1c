/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.c: explicit steps.  A step is the candidate set of one encoder
 * step: lookups on it add their eligible candidates, and a publication
 * names the step and is accepted only for one of them (docs/behaviour.md:
 * "only outputs of inputs that were candidates in the current step").
 * Several steps may be open at once, so that a pipelined server may look
 * up step N+1 before it publishes step N.
 *
 * The handle holds its open steps in a fixed table of ENCACHE_MAX_STEPS
 * slots: opening one more is refused (ENCACHE_ESTEPS), never grown, and
 * encache_close() closes whatever is still open.  A step's memory is the
 * caller thread's, like the rest of the read path; the worker never sees
 * it.  Closing a step on a poisoned handle is safe: the Store never holds
 * a step's memory.
 *
 * A step also keeps the causes its lookups gave (encache_result.why), as
 * a list of notes freed when it closes, so that a result's text outlives
 * the lookup and later lookups on the step: pointers into a growing
 * buffer would not.
 */
#include "step.h"

#include <stdio.h>
#include <string.h>

/* A cause kept for the step's results (encache_result.why). */
struct step_note {
  struct step_note *next;
  char text[];
};

/* How many of the latest notes a new one is compared with: a lookup's
 * causes repeat (one Store message for a whole batch) but need not be
 * found among hundreds of distinct ones. */
#define NOTE_REUSE_ 16

static int step_open(encache *ec, encache_step **out);

int encache_step_open(encache *ec, encache_step **out) {
  if (out != NULL)
    *out = NULL;
  if (ec == NULL || out == NULL)
    return ENCACHE_EINVAL;
  encache__enter(ec); /* a started lookup may be using the steps */
  int rc = step_open(ec, out);
  encache__leave(ec);
  return rc;
}

static int step_open(encache *ec, encache_step **out) {
  if (encache__is_poisoned(ec))
    return ENCACHE_EPOISONED;
  if (ec->nsteps == ENCACHE_MAX_STEPS)
    return encache__fail(ec, ENCACHE_ESTEPS,
                         "encache_step_open: %d steps are open, the most a "
                         "handle holds (ENCACHE_MAX_STEPS): close one first",
                         ENCACHE_MAX_STEPS);
  encache_step *s = encache__calloc(1, sizeof(*s));
  if (s == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM,
                         "encache_step_open: out of memory");
  size_t slot = 0;
  while (ec->steps[slot] != NULL)
    slot++;
  ENCACHE_ASSERT(slot < ENCACHE_MAX_STEPS);
  s->ec = ec;
  s->slot = slot;
  ec->steps[slot] = s;
  ec->nsteps++;
  ENCACHE__COUNT(ec, steps_open, 1);
  *out = s;
  return 0;
}

/* Closes s; the caller has the handle's turn and held s
 * (encache__enter_step), so no started lookup of it is running: one
 * still queued is forgotten (it never runs; it took nothing), one done
 * is dropped with its answer. */
static void step_free(encache_step *s) {
  encache *ec = s->ec;
  if (ec->async_forget != NULL)
    ec->async_forget(s); /* lookup_async.c: out of its queue, its fd */
  ENCACHE_ASSERT(ec->steps[s->slot] == s);
  ec->steps[s->slot] = NULL;
  ec->nsteps--;
  __atomic_sub_fetch(&ec->live->steps_open, 1, __ATOMIC_RELAXED);
  encache__leases_end(s); /* the leases of outputs it never published */
  encache__free(s->lease);
  encache__free(s->contract);
  encache__free(s->hash);
  encache__free(s->off);
  encache__free(s->text);
  while (s->notes != NULL) {
    struct step_note *next = s->notes->next;
    encache__free(s->notes);
    s->notes = next;
  }
  encache__free(s);
}

void encache_step_close(encache_step *s) {
  if (s == NULL)
    return;
  encache *ec = s->ec;
  encache__enter_step(ec, s); /* waits for its lookup that is running */
  step_free(s);
  encache__leave(ec);
}

const char *encache__step_note(encache_step *s, const char *fallback,
                               const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  size_t k = 0;
  for (struct step_note *n = s->notes; n != NULL && k < NOTE_REUSE_;
       n = n->next, k++)
    if (strcmp(n->text, buf) == 0)
      return n->text;
  size_t len = strlen(buf) + 1;
  struct step_note *n = encache__malloc(sizeof(*n) + len);
  if (n == NULL)
    return fallback;
  memcpy(n->text, buf, len);
  n->next = s->notes;
  s->notes = n;
  return n->text;
}

void encache__steps_close_all(encache *ec) {
  for (size_t i = 0; i < ENCACHE_MAX_STEPS && ec->nsteps > 0; i++)
    if (ec->steps[i] != NULL)
      step_free(ec->steps[i]);
}

/* Grows *p to hold at least need elements of elem bytes (contents kept). */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t want = need < SIZE_MAX / 2 ? need + need / 2 + 8 : need;
  if (want > SIZE_MAX / elem)
    return ENCACHE_ENOMEM;
  void *q = encache__realloc(*p, want * elem);
  if (q == NULL)
    return ENCACHE_ENOMEM;
  *p = q;
  *cap = want;
  return 0;
}

int encache__step_reserve(encache_step *s, size_t more, size_t bytes) {
  if (more > SIZE_MAX - s->n || bytes > SIZE_MAX - s->text_len)
    return ENCACHE_ENOMEM;
  size_t cap = s->cap; /* hash and off share one capacity */
  if (grow((void **)&s->hash, &cap, s->n + more, sizeof(*s->hash)) < 0)
    return ENCACHE_ENOMEM;
  if (cap != s->cap) {
    size_t off_cap = s->cap, lease_cap = s->cap, contract_cap = s->cap;
    if (grow((void **)&s->off, &off_cap, cap, sizeof(*s->off)) < 0 ||
        grow((void **)&s->lease, &lease_cap, cap, sizeof(*s->lease)) < 0 ||
        grow((void **)&s->contract, &contract_cap, cap,
             sizeof(*s->contract)) < 0)
      return ENCACHE_ENOMEM; /* hash grew: harmless, cap stays */
    s->cap = cap;
  }
  return grow((void **)&s->text, &s->text_cap, s->text_len + bytes, 1);
}

/* The index of id in the set, or SIZE_MAX. */
static size_t find(const encache_step *s, const char *id, uint64_t hash) {
  for (size_t i = 0; i < s->n; i++)
    if (s->hash[i] == hash && strcmp(s->text + s->off[i], id) == 0)
      return i;
  return SIZE_MAX;
}

int encache__step_contract_ok(const encache_step *s, const char *id,
                              int dtype, uint64_t rows, uint64_t cols) {
  uint64_t hash = encache__hash_id(id);
  for (size_t i = find(s, id, hash); i < s->n; i++)
    if (s->hash[i] == hash && strcmp(s->text + s->off[i], id) == 0 &&
        s->contract[i].dtype == dtype && s->contract[i].rows == rows &&
        s->contract[i].cols == cols)
      return 1;
  return 0;
}

uint64_t *encache__step_lease(encache_step *s, const char *id) {
  size_t i = find(s, id, encache__hash_id(id));
  return i == SIZE_MAX ? NULL : &s->lease[i];
}

uint64_t encache__steps_lease_of(const encache *ec, const encache_step *except,
                                 const char *id) {
  if (ec->leases_held == 0)
    return 0;
  uint64_t hash = encache__hash_id(id);
  for (size_t k = 0; k < ENCACHE_MAX_STEPS; k++) {
    const encache_step *s = ec->steps[k];
    size_t i = s == NULL || s == except ? SIZE_MAX : find(s, id, hash);
    if (i != SIZE_MAX && s->lease[i] != 0)
      return s->lease[i];
  }
  return 0;
}

void encache__leases_end(encache_step *step) {
  encache *ec = step->ec;
  for (size_t i = 0; i < step->n; i++) {
    if (step->lease == NULL || step->lease[i] == 0)
      continue;
    char *key = encache__make_key(ec, step->text + step->off[i]);
    uint64_t token = encache__lease_slot_set(ec, &step->lease[i], 0);
    if (key != NULL) /* out of memory: it ends at its deadline */
      encache__lease_end(ec, key, token);
    encache__free(key);
  }
}

void encache__step_add(encache_step *s, const encache_candidate *c,
                       uint64_t hash) {
  const char *id = c->id;
  if (encache__step_contract_ok(s, id, c->dtype, c->rows, c->cols))
    return;
  size_t len = strlen(id) + 1;
  ENCACHE_ASSERT(s->n < s->cap && len <= s->text_cap - s->text_len);
  memcpy(s->text + s->text_len, id, len);
  s->hash[s->n] = hash;
  s->lease[s->n] = 0;
  s->contract[s->n] = (struct step_contract){c->dtype, c->rows, c->cols};
  s->off[s->n++] = s->text_len;
  s->text_len += len;
}

int encache_step_set_stream(encache_step *step, void *stream) {
  if (step == NULL)
    return ENCACHE_EINVAL;
  encache__enter_step(step->ec, step);
  step->stream = stream;
  encache__leave(step->ec);
  return 0;
}
