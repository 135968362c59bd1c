/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publisher.h: the bounded asynchronous publisher (publisher.c), as the
 * rest of the engine sees it: started and stopped with the handle, fed
 * one publication at a time, reaped on the caller's thread.  Its state
 * and jobs are its own (publish_job.h).
 */
#ifndef ENCACHE_PUBLISHER_H
#define ENCACHE_PUBLISHER_H

#include "core.h"

/* Starts the writer threads (ec->pub); 0, or a negative code (errno's:
 * no thread could start) with nothing left to stop. */
int encache__publisher_start(encache *ec);
/* Marks closing, waits for the writers to drain the queue, joins them.
 * NULL ec->pub: nothing. */
void encache__publisher_stop(encache *ec);
/* Frees the stopped publisher (a healthy handle's: a poisoned one keeps
 * its fatal jobs' memory forever, and never calls this). */
void encache__publisher_free(encache *ec);
/* Releases finished jobs; returns 0 or ENCACHE_EPOISONED. */
int encache__reap(encache *ec);

/* One publication: the key (ownership passes to the publisher, also on
 * failure), its header and payload (data, nbytes: inside storage), and
 * the token of the lease it ends once written (0 = none).  A CUDA view
 * (device: view) is copied to a page-locked buffer first, on its stream.
 * Returns ENCACHE_QUEUED, an encache_skip_reason (nothing kept), or a
 * negative code with the handle's message. */
typedef struct encache__publication {
  char *key;
  encache_storage *storage;
  const void *data;
  uint64_t nbytes;
  const unsigned char *hdr; /* ENCACHE_HEADER_SIZE bytes */
  uint64_t lease;
  const encache_tensor *device; /* a CUDA view, or NULL */
} encache__publication;
int encache__publisher_submit(encache *ec, const encache__publication *pb);

/* Whether [data, data + nbytes) lies inside storage. */
int encache__storage_holds(const encache_storage *s, const void *data,
                           uint64_t nbytes);

#endif
