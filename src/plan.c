/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plan.c: what the phases of a lookup plan share (plan.h): a batch's
 * answer, the causes of UNAVAILABLE items, and an item found present.
 */
#include "plan.h"

#include <inttypes.h>
#include <stdio.h>

int encache__plan_batch(encache__plan *p, int rc, const char *what) {
  switch (encache_store_classify(rc)) {
  case ENCACHE_ANSWER_OK:
    return 0;
  case ENCACHE_ANSWER_RECOVERABLE:
    return 1;
  default:
    return encache__poison(p->ec, "%s's completion is unconfirmed (%s: %s)",
                           what, encache_err_name(rc),
                           encache_store_errmsg(p->ec->store));
  }
}

void encache__plan_unavailable(encache__plan *p, size_t from, size_t to,
                               const char *why) {
  for (size_t u = from; u < to; u++) {
    p->items[u].outcome = ENCACHE_UNAVAILABLE;
    p->items[u].why = why;
  }
}

const char *encache__plan_store_why(encache__plan *p, const char *what,
                                    int64_t rc, int per_key) {
  const char *msg = encache_store_errmsg(p->ec->store);
  const char *name = rc >= INT32_MIN ? encache_err_name((int)rc) : NULL;
  /* A batch's failure has one message; a key's answer has none of its
   * own, and the Store's latest message may name another key. */
  return encache__step_note(p->step, "the Store failed (no room to say why)",
                            "%s failed (%s)%s%s", what,
                            name ? name : "unknown code",
                            !msg[0] ? "" : per_key ? "; the Store said: " : ": ",
                            msg);
}

static void warn_oversize(const encache__plan *p, const encache__item *it) {
  encache *ec = p->ec;
  if (ec->log == NULL)
    return;
  char msg[256];
  snprintf(msg, sizeof(msg),
           "encache: object %s is %" PRIu64 " bytes, larger than the "
           "%" PRIu64 "-byte staging buffer (store_read_buffer_bytes): "
           "encoding it instead", p->cand[it->first].id, it->osize,
           ec->read_buf_bytes);
  ec->log(ec->log_ctx, msg);
}

void encache__plan_present(encache__plan *p, encache__item *it) {
  it->present = 1;
  if (it->osize > p->ec->read_buf_bytes) {
    it->outcome = ENCACHE_OVERSIZE;
    it->why = encache__step_note(
        p->step, "larger than store_read_buffer_bytes",
        "the object is %" PRIu64 " bytes, larger than the %" PRIu64
        "-byte staging buffer: raise store_read_buffer_bytes to at least "
        "%" PRIu64, it->osize, p->ec->read_buf_bytes, it->osize);
    warn_oversize(p, it);
  } else {
    p->np++;
  }
}
