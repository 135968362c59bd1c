/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fleet_out.h: what `encache stats`, `encache exporter` and `encache top`
 * share: the live handles of the statistics registry read into rows
 * (encache_fleet_read()), and the ways to print them.
 */
#ifndef ENCACHE_FLEET_OUT_H
#define ENCACHE_FLEET_OUT_H

#include <stdio.h>

#include "encache.h"

/* The registry a tool reads unless --segment says: $ENCACHE_STATS_SEGMENT,
 * else the stats_segment option's default, FLEET_DEFAULT_SEGMENT ".<euid>"
 * (one registry per user). */
#define FLEET_DEFAULT_SEGMENT "encache.fleet"
const char *fleet_segment(const char *arg);

/* One live handle, copied. */
typedef struct fleet_row {
  uint32_t slot;
  long long pid;
  char encoder[128], store[256], ns[256];
  encache_stats st;
  encache_histogram lookup, write;
  uint64_t bytes_written;
} fleet_row;

typedef struct fleet_view {
  fleet_row *rows;
  size_t n, cap;
} fleet_view;

/* Reads the live handles of registry `segment` into *v (emptied first); a
 * registry that does not exist yet has none.  Returns 0, or a negative
 * code with the reason in why. */
int fleet_collect(const char *segment, fleet_view *v, char *why, size_t n);
void fleet_view_free(fleet_view *v);

/* The value under which a fraction q of a histogram's observations lie,
 * in microseconds (interpolated in its bucket); -1 when it is empty. */
double fleet_quantile(const encache_histogram *h, double q);

/* How fleet_label() writes a label: for a terminal (stats' table, top),
 * as a Prometheus label value, as the body of a JSON string. */
typedef enum { LABEL_TEXT, LABEL_PROM, LABEL_JSON } label_style;

/* Writes the label s (an encoder's, a Store URL: bytes from the registry,
 * which anyone who can write it, or damage, may have put there) in style
 * st, the one way every output path prints one: valid UTF-8 (U+FFFD for
 * each byte that does not start a character) with no control character
 * (C0, DEL, C1) left raw, so that it can neither drive a terminal nor
 * forge a row (label_escape() in fleet_out.c says how each style writes
 * them).  LABEL_TEXT counts characters (an escape's each): at most cut
 * of them (0: all), never a character or an escape cut in two, then
 * spaces up to pad.  Returns the characters written, padding aside. */
size_t fleet_label(FILE *out, const char *s, label_style st, size_t cut,
                   size_t pad);

/* The Prometheus text format (0.0.4) of the Store's counters (st NULL:
 * none) and of every handle of v.  Returns 0, or -1 with the reason in
 * why when the Store's counters cannot be read, unless tolerant: then
 * encache_store_up is 0 and the handles' metrics follow. */
int fleet_prometheus(FILE *out, encache_store *st, const fleet_view *v,
                     int tolerant, char *why, size_t n);
/* The Prometheus lines of a Store that could not be opened at url:
 * encache_store_up 0 (fleet_prometheus() with st NULL follows). */
void fleet_store_down(FILE *out, const char *url);
/* One JSON object: {"store": {...} or null, "handles": [...]}. */
int fleet_json(FILE *out, encache_store *st, const fleet_view *v, char *why,
               size_t n);
/* The handles as a table under a heading (nothing when there are none). */
void fleet_text(FILE *out, const fleet_view *v);

/* The end of `encache stats` (cmd_fleet.c): in `format` ("text" after
 * the Store's counters; "json" and "prometheus" all of it) the handles
 * of registry `segment` (NULL: fleet_segment()) and st's counters; st
 * NULL with down set: the Store at URL down could not be opened
 * (encache_store_up 0; "store": null).  Returns the tool's exit code. */
int stats_fleet(const char *format, const char *segment, encache_store *st,
                const char *down);

#endif
