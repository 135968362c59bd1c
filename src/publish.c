/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publish.c: encache_publish() (docs/behaviour.md, Publication), on the
 * caller's thread: the view is checked (a matrix of a known dtype, inside
 * its storage, the output of a candidate of the step under the contract
 * it was looked up with), the step's lease of it goes with it, and the
 * publisher (publisher.c) queues it or says why not.  Every skip is
 * counted here.
 */
#include "publisher.h"
#include "step.h"

#include <string.h>

static int skip(encache *ec, int reason) {
  if (reason == ENCACHE_SKIP_MISMATCH) /* past the array frozen in 1.0 */
    ENCACHE__COUNT(ec, published_mismatch, 1);
  else
    ENCACHE__COUNT(ec, published_skipped[reason], 1);
  return reason;
}

/* Whether view is a matrix of a known dtype that is not the output id was
 * a candidate for (the other faults of a view have reasons of their own,
 * check_view's). */
static int mismatched(const encache_step *step, const char *id,
                      const encache_tensor *view) {
  if (view->ndim != 2 || view->shape == NULL || view->shape[0] < 0 ||
      view->shape[1] < 0 || encache_dtype_size(view->dtype) == 0)
    return 0;
  return !encache__step_contract_ok(step, id, view->dtype,
                                    (uint64_t)view->shape[0],
                                    (uint64_t)view->shape[1]);
}

/* Checks the view against its storage: 0 (hdr and *nbytes set) or a skip
 * reason. */
static int check_view(const encache_tensor *view, const encache_storage *s,
                      unsigned char hdr[ENCACHE_HEADER_SIZE],
                      uint64_t *nbytes) {
  int rc = encache_header_encode(view, hdr);
  if (rc == ENCACHE_EDTYPE)
    return ENCACHE_SKIP_DTYPE;
  if (rc == ENCACHE_ECONTIG)
    return ENCACHE_SKIP_NOT_CONTIGUOUS;
  if (rc < 0)
    return ENCACHE_SKIP_NOT_MATRIX;
  encache_payload_size(view->dtype, (uint64_t)view->shape[0],
                       (uint64_t)view->shape[1], nbytes);
  if (!encache__storage_holds(s, view->data, *nbytes))
    return ENCACHE_SKIP_OUTSIDE_STORAGE;
  return 0;
}

/* Hands the publication of view under id's key to the publisher; its
 * lease token goes with it. */
static int publish_view(encache *ec, const char *id,
                        const encache_tensor *view, encache_storage *storage,
                        uint64_t lease) {
  unsigned char hdr[ENCACHE_HEADER_SIZE];
  encache__publication pb = {.storage = storage, .data = view->data,
                             .hdr = hdr, .lease = lease};
  int reason = check_view(view, storage, hdr, &pb.nbytes);
  if (reason != 0)
    return skip(ec, reason);
  if ((pb.key = encache__make_key(ec, id)) == NULL)
    return encache__fail(ec, ENCACHE_ENOMEM, "publish: out of memory");
  if (view->device != ENCACHE_DEVICE_HOST)
    pb.device = view;
  int rc = encache__publisher_submit(ec, &pb);
  return rc > 0 ? skip(ec, rc) : rc;
}

static int publish(encache_step *step, const char *id,
                   const encache_tensor *given, encache_storage *storage);

/* Takes the handle's turn (a started lookup may be running on it), once
 * the step's own started lookup is not running. */
int encache_publish(encache_step *step, const char *id,
                    const encache_tensor *given, encache_storage *storage) {
  if (step == NULL)
    return ENCACHE_EINVAL;
  encache__enter_step(step->ec, step);
  int rc = publish(step, id, given, storage);
  encache__leave(step->ec);
  return rc;
}

static int publish(encache_step *step, const char *id,
                   const encache_tensor *given, encache_storage *storage) {
  encache_tensor full;
  if (id == NULL || given == NULL || storage == NULL ||
      encache__struct_in(&full, sizeof(full), given,
                         ENCACHE__TENSOR_MIN) < 0)
    return ENCACHE_EINVAL;
  encache *ec = step->ec;
  if (encache__is_poisoned(ec))
    return ENCACHE_EPOISONED;
  if (!ec->enabled)
    return skip(ec, ENCACHE_SKIP_DISABLED);
  if (full.device != ENCACHE_DEVICE_HOST && full.device != ENCACHE_DEVICE_CUDA)
    return encache__fail(ec, ENCACHE_EINVAL, "publish: device %d is not an "
                         "encache_device_kind (host 0, CUDA 1)", full.device);
  int rc = encache__reap(ec);
  if (rc < 0)
    return rc;
  uint64_t *lease = encache__step_lease(step, id);
  if (lease == NULL)
    return skip(ec, ENCACHE_SKIP_NOT_CANDIDATE);
  /* Written, a wrong output would be INCOMPATIBLE to every reader and,
   * objects being never replaced, keep the right one out. */
  if (mismatched(step, id, &full))
    return skip(ec, ENCACHE_SKIP_MISMATCH);
  /* The step's lease of this output (single flight) goes with the job,
   * which ends it once written; not queued, it ends now. */
  uint64_t token = encache__lease_slot_set(ec, lease, 0);
  rc = publish_view(ec, id, &full, storage, token);
  if (rc != ENCACHE_QUEUED && token != 0) {
    char *key = encache__make_key(ec, id);
    if (key != NULL) /* out of memory: it ends at its deadline */
      encache__lease_end(ec, key, token);
    encache__free(key);
  }
  return rc;
}
