/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_open.c: "tier:LOCAL+REMOTE" into a tiered Store (tier.h has the
 * syntax).  The local part must be an shm:// URL, which never holds a
 * '+', so the first '+' ends it and the remote URL (a password with '+'
 * included) is everything after.  The tier's own options ride in the
 * local part's query (promote_queue_items, promote_queue_bytes) and are
 * taken out before the shm Store sees it.  Messages show each part
 * redacted (encache_store_url_redact()), never a password.
 */
#include "backends.h"
#include "tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNTAX "tier:shm://NAME?size=SIZE+REMOTE_URL"

/* part, redacted, into buf (cut short with "..." when it does not fit). */
static const char *shown(const char *part, char *buf, size_t size) {
  if (encache_store_url_redact(part, buf, size) < 0)
    snprintf(buf, size, "%.*s...", (int)strcspn(part, ":@"), part);
  return buf;
}

/* body ("LOCAL+REMOTE", or anything given after "tier:"), each part
 * redacted on its own (a redactor sees one URL: a password after the
 * '+' would be shown), into buf. */
static const char *shown_body(const char *body, char *buf, size_t size) {
  char part[512], a[512];
  size_t n = strcspn(body, "+");
  if (body[n] == '\0')
    return shown(body, buf, size);
  snprintf(part, sizeof(part), "%.*s",
           (int)(n < sizeof(part) ? n : sizeof(part) - 1), body);
  shown(part, a, sizeof(a));
  size_t la = strlen(a);
  if (la + 2 > size)
    return shown(part, buf, size);
  memcpy(buf, a, la);
  buf[la] = '+';
  shown(body + n + 1, buf + la + 1, size - la - 1);
  return buf;
}

static int starts(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The options of the tier in the local part's query, into *items and
 * *bytes; the other pairs are copied to shm (the local URL to open). */
static int take_options(const char *local, char *shm, size_t size,
                        size_t *items, uint64_t *bytes) {
  const char *q = strchr(local, '?');
  size_t base = q ? (size_t)(q - local) : strlen(local);
  if (base >= size)
    return encache_store_fail(NULL, ENCACHE_EURL, "tier: the local tier's "
                              "URL is too long");
  memcpy(shm, local, base);
  shm[base] = '\0';
  encache__query qs = {q ? q + 1 : NULL};
  char k[64], v[128];
  int rc;
  char sep = '?';
  while ((rc = encache__query_next(&qs, k, sizeof(k), v, sizeof(v))) > 0) {
    char *end = NULL;
    if (strcmp(k, "promote_queue_items") == 0) {
      unsigned long long n = strtoull(v, &end, 10);
      if (end == v || *end != '\0' || n == 0 || n > 1000000)
        return encache_store_fail(NULL, ENCACHE_EURL, "tier: "
                                  "promote_queue_items=%s: must be 1 to "
                                  "1000000 (default 1024)", v);
      *items = (size_t)n;
    } else if (strcmp(k, "promote_queue_bytes") == 0) {
      if (encache_parse_size(v, bytes) < 0 || *bytes < TIER_QUEUE_BYTES_MIN)
        return encache_store_fail(NULL, ENCACHE_EURL, "tier: "
                                  "promote_queue_bytes=%s: must be a size "
                                  "of at least 64KiB (default 64MiB)", v);
    } else {
      size_t len = strlen(shm);
      if (snprintf(shm + len, size - len, "%c%s=%s", sep, k, v) >=
          (int)(size - len))
        return encache_store_fail(NULL, ENCACHE_EURL, "tier: the local "
                                  "tier's URL is too long");
      sep = '&';
    }
  }
  if (rc < 0)
    return encache_store_fail(NULL, ENCACHE_EURL, "tier: %s: malformed query "
                              "(use ?key=value&...)", shm);
  return 0;
}

/* Splits body ("LOCAL+REMOTE") and checks each part: 0 with *remote set
 * and the local part in local[], or ENCACHE_EURL naming what is wrong. */
static int split(const char *body, char *local, size_t size,
                 const char **remote) {
  char a[512], b[512];
  const char *plus = strchr(body, '+');
  if (body[0] == '\0')
    return encache_store_fail(NULL, ENCACHE_EURL, "tier: nothing after "
                              "'tier:' (use " SYNTAX ")");
  if (!starts(body, "shm://"))
    return encache_store_fail(NULL, ENCACHE_EURL, "tier:%s: the local tier "
                              "must be an shm:// Store%s (use " SYNTAX ")",
                              shown_body(body, a, sizeof(a)),
                              starts(body, "tier:") ? ", not a tier" : "");
  if (plus == NULL)
    return encache_store_fail(NULL, ENCACHE_EURL, "tier:%s: no '+' and remote "
                              "Store after the local tier (use " SYNTAX ")",
                              shown(body, a, sizeof(a)));
  if ((size_t)(plus - body) >= size)
    return encache_store_fail(NULL, ENCACHE_EURL, "tier: the local tier's "
                              "URL is too long");
  memcpy(local, body, (size_t)(plus - body));
  local[plus - body] = '\0';
  *remote = plus + 1;
  shown(local, a, sizeof(a));
  if (**remote == '\0')
    return encache_store_fail(NULL, ENCACHE_EURL, "tier:%s+: the remote "
                              "Store URL after '+' is missing (use " SYNTAX
                              ")", a);
  if (starts(*remote, "tier:"))
    return encache_store_fail(NULL, ENCACHE_EURL, "tier:%s+%s: a tier of a "
                              "tier: the remote Store cannot be a tier: Store",
                              a, shown_body(*remote, b, sizeof(b)));
  if (starts(*remote, "shm:"))
    return encache_store_fail(NULL, ENCACHE_EURL, "tier:%s+%s: the remote "
                              "tier is host-local shm: give a distributed "
                              "Store (redis://, redis-cluster://, unix://, "
                              "mooncake:, ...)", a,
                              shown(*remote, b, sizeof(b)));
  return 0;
}

/* Opens one tier; on failure its message, prefixed with which tier. */
static int open_part(const char *which, const char *url, encache_store **st) {
  int rc = encache_store_open(url, st);
  if (rc < 0) {
    char msg[400], a[512];
    const char *m = encache_store_errmsg(NULL);
    snprintf(msg, sizeof(msg), "%s", m[0] ? m : encache_strerror(rc));
    encache_store_fail(NULL, rc, "tier: the %s tier %s: %s", which,
                       shown(url, a, sizeof(a)), msg);
  }
  return rc;
}

int encache__tier_open(const char *url, encache_store **out) {
  *out = NULL;
  char local[512], shm[512];
  const char *remote = NULL;
  size_t items = 0;
  uint64_t bytes = 0;
  if (!starts(url, "tier:"))
    return encache_store_fail(NULL, ENCACHE_EURL, "not a tier: URL");
  int rc = split(url + 5, local, sizeof(local), &remote);
  if (rc == 0)
    rc = take_options(local, shm, sizeof(shm), &items, &bytes);
  if (rc < 0)
    return rc;
  /* The remote first: a remote URL that does not open (unknown scheme,
   * bad option) must not leave a segment created for nothing.  A local
   * part that then fails costs one remote open and close (Redis connects
   * on first use: nothing reached). */
  encache_store *l = NULL, *r = NULL;
  if ((rc = open_part("remote", remote, &r)) < 0)
    return rc;
  if ((rc = open_part("local", shm, &l)) < 0) {
    encache_store_close(r);
    return rc;
  }
  char a[512], b[512];
  char *name = encache__asprintf("tier:%s+%s", shown(local, a, sizeof(a)),
                                 shown(remote, b, sizeof(b)));
  if (name == NULL) {
    encache_store_close(l);
    encache_store_close(r);
    return encache_store_fail(NULL, ENCACHE_ENOMEM, "tier: out of memory");
  }
  rc = encache__tier_wrap(l, r, name, items, bytes, out);
  encache__free(name);
  return rc;
}
