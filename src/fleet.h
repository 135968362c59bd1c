/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fleet.h: the host-local statistics registry (fleet.c).  An engine
 * handle takes a slot of the registry at open and counts into it; tools
 * read it with encache_fleet_read() (include/encache.h).
 */
#ifndef ENCACHE_FLEET_H
#define ENCACHE_FLEET_H

#include "internal.h"

typedef struct encache__fleet encache__fleet;

/* Which histogram an observation goes to. */
enum { ENCACHE__FLEET_LOOKUP = 0, ENCACHE__FLEET_WRITE = 1 };

/* Takes a slot of the registry `segment` (NULL = none: "" and "off" too)
 * for a handle labelled `encoder` (NULL = PID@HOSTNAME) on `store`, in
 * namespace ns, and returns it with its counters zeroed, or NULL: no
 * registry wanted, or one that cannot be used, which is said through
 * log(log_ctx, message) (a handle without a slot counts in its own
 * memory).  Never fails otherwise. */
encache__fleet *encache__fleet_attach(const char *segment, const char *encoder,
                                      const char *store, const char *ns,
                                      void (*log)(void *, const char *),
                                      void *log_ctx);
/* The slot's counters: where the handle counts while it holds the slot. */
encache_stats *encache__fleet_stats(encache__fleet *f);
/* Frees the slot (NULL: nothing). */
void encache__fleet_detach(encache__fleet *f);

/* A monotonic time in nanoseconds, never 0; 0 when f is NULL (no clock
 * read: a handle without a slot pays nothing). */
uint64_t encache__fleet_clock(const encache__fleet *f);
/* Counts an observation that started at t0 (encache__fleet_clock(); 0 =
 * none) in histogram `which`, and `bytes` written (ENCACHE__FLEET_WRITE
 * of a successful write).  Relaxed atomics only: any thread. */
void encache__fleet_observe(encache__fleet *f, int which, uint64_t t0,
                            uint64_t bytes);

/* The histogram bucket of a duration of ns nanoseconds: the smallest i
 * with ns <= 2^i microseconds, the last bucket beyond. */
unsigned encache__fleet_bucket(uint64_t ns);

/* The default registry of this process's user: "encache.fleet.<euid>",
 * in buf (64 bytes are enough); returns buf. */
const char *encache__fleet_default(char *buf, size_t n);

/* Test hook: the number of slots of a registry created from now on. */
extern unsigned encache__fleet_slots;

#endif
