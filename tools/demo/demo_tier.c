/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_tier.c: `encache demo --hosts N` on a tiered Store
 * (tier:shm://NAME?...+REMOTE): N simulated hosts, each with its own shm
 * tier (segment NAME-h0, NAME-h1, ...) in front of the one remote Store;
 * encoder i runs on host i % N.  Each encoder reports the hits of each
 * tier (encache_engine_store_stats()), which the summary adds up.
 */
#include "demo.h"

#include <stdio.h>
#include <string.h>

/* The segment name of a tier URL's local part: its start and length. */
static int local_name(const char *url, size_t *start, size_t *len) {
  static const char prefix[] = "tier:shm://";
  if (strncmp(url, prefix, sizeof(prefix) - 1) != 0)
    return -1;
  *start = sizeof(prefix) - 1;
  *len = strcspn(url + *start, "?+");
  return 0;
}

int demo_is_tier(const char *url) {
  size_t s, l;
  return url != NULL && local_name(url, &s, &l) == 0;
}

int demo_host_url(const demo_opts *o, int host, char *buf, size_t size) {
  size_t s, l;
  if (o->hosts <= 1 || local_name(o->store_url, &s, &l) < 0)
    return snprintf(buf, size, "%s", o->store_url) < (int)size ? 0 : -1;
  int n = snprintf(buf, size, "%.*s-h%d%s", (int)(s + l), o->store_url, host,
                   o->store_url + s + l);
  return n >= 0 && (size_t)n < size ? 0 : -1;
}

int demo_host_segment(const demo_opts *o, int host, char *buf, size_t size) {
  size_t s, l;
  if (o->hosts <= 1 || local_name(o->store_url, &s, &l) < 0)
    return -1;
  int n = snprintf(buf, size, "%.*s-h%d", (int)l, o->store_url + s, host);
  return n >= 0 && (size_t)n < size ? 0 : -1;
}

void demo_tier_counts(encache *ec, report *rep) {
  encache_store_stats s = {.size = sizeof(s)};
  if (encache_engine_store_stats(ec, &s) != 0 ||
      s.tier_local_hits == UINT64_MAX)
    return; /* not a tier */
  rep->tier_local = s.tier_local_hits;
  rep->tier_remote = s.tier_remote_hits;
  rep->tier_promoted = s.tier_promotions_done;
}
