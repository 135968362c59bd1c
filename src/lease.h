/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lease.h: single flight's phase of a lookup (lease.c).
 */
#ifndef ENCACHE_LEASE_H
#define ENCACHE_LEASE_H

#include "plan.h"

/* Phase lease (lease.c), between classify and chunk, with single flight
 * on: each absent item takes its key's lease (it stays a MISS: encode it);
 * one another encoder holds waits up to single_flight_wait_ms for that
 * encoder's output (then present: it is read as any other), or for the
 * lease, else is IN_FLIGHT.  0, or a negative code. */
int encache__plan_lease(encache__plan *p);

#endif
