/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/handle.h: the configuration handle's core (handle.c): the values
 * it holds, their typed view, and its one message.
 *
 * The message is kept in the handle and nowhere else, as hiredis keeps
 * err/errstr on its context: a failed call writes it once
 * (encache__config_fail), and every call that changes the handle ends in
 * encache__config_done(), which clears it on success.  So
 * encache_config_errmsg() always speaks of the handle's last call that
 * changed it.
 */
#ifndef ENCACHE_CONFIG_HANDLE_H
#define ENCACHE_CONFIG_HANDLE_H

#include "config/table.h"

/* One option's value, whatever its source.  Invariant: `text` renders
 * the value (JSON text, "null" when unset) once a value is stored. */
typedef struct value {
  int given;  /* 1 = from the input or a setter, 0 = default */
  int set;    /* 0 = unset (no default, not given) */
  int b;      /* C_BOOL */
  uint64_t u; /* C_U64 */
  double d;   /* C_DOUBLE */
  char *s;    /* C_STRING (owned) */
  char *text; /* the value as JSON text, for display (owned) */
  char *warn; /* a warning about this value, or NULL (owned) */
} value;

/*
 * Invariants:
 *   - vals[i] always holds a valid value for option i: either its default
 *     (given == 0) or what the input or a setter said (given == 1), and
 *     opts is the typed view of vals (encache__config_sync).
 *   - A load parses into a scratch copy and swaps it in only when the
 *     whole section is valid, and a setter stores only a checked value,
 *     so a failed call leaves the handle unchanged but for its message.
 */
struct encache_config {
  value vals[NOPTS];
  encache__opts opts;        /* the typed view of vals (encache__config_sync) */
  int mooncake_loaded;       /* the mooncake section is in use */
  char **unknown[SEC_COUNT]; /* owned strings, "section.name" */
  int nunknown[SEC_COUNT];
  /* A warning about how the JSON itself was read (a duplicate key: the
   * last value wins, as in Python), of the last successful load of the
   * ec-transfer-config [0] and of the Mooncake JSON [1]; owned, or NULL. */
  char *json_warn[2];
  char errmsg[1024]; /* never allocated: kept on out of memory too */
};

/* Sets cfg's message (cfg may be NULL) and returns rc. */
int encache__config_fail(encache_config *cfg, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int encache__config_oom(encache_config *cfg);
/* The end of a call that changes cfg: rc 0 clears the message (a failure
 * has set its own); returns rc. */
int encache__config_done(encache_config *cfg, int rc);
/* Refreshes cfg->opts from cfg->vals. */
void encache__config_sync(encache_config *cfg);

#endif
