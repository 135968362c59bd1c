/* SPDX-License-Identifier: Apache-2.0 */
/*
 * url.c: Store URLs as messages show them.  encache_store_url_redact()
 * replaces the password of scheme://user:password@host by "***", so that
 * no message, no encache_store_url() and no tool output shows it; the
 * Redis URL parser finds the credentials with the same rule
 * (encache__url_userinfo()), so what it reads as the password is exactly
 * what the redacted form hides.
 */
#include "base.h"

#include <stdio.h>
#include <string.h>

#include <limits.h>

/* The text after "scheme://", or NULL when url has no such prefix (the
 * scheme is letters, digits, '+', '-' and '.', starting with a letter). */
static const char *after_scheme(const char *url) {
  const char *p = url;
  if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
    return NULL;
  while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
         (*p >= '0' && *p <= '9') || *p == '+' || *p == '-' || *p == '.')
    p++;
  return strncmp(p, "://", 3) == 0 ? p + 3 : NULL;
}

/* The last '@' in [p, end), or NULL. */
static const char *last_at(const char *p, const char *end) {
  const char *at = NULL;
  for (; p < end; p++)
    if (*p == '@')
      at = p;
  return at;
}

int encache__url_userinfo(const char *url, size_t *start, size_t *end) {
  const char *p = after_scheme(url);
  if (p == NULL || *p == '/') /* no authority: unix:///path */
    return 0;
  /* The authority ends at the first '?'; the credentials end at its last
   * '@' ('@', ':' and '/' may appear raw in a password).  A '?' followed
   * by an '@' before any '=' is taken as part of a password (a query is
   * key=value pairs, whose keys never hold '@'). */
  const char *q = strchr(p, '?'), *at;
  for (;;) {
    const char *qend = q ? q : p + strlen(p);
    at = last_at(p, qend);
    if (at != NULL || q == NULL)
      break;
    const char *later = strchr(q, '@'), *eq = strchr(q, '=');
    if (later == NULL || (eq != NULL && eq < later))
      break;
    q = strchr(later, '?');
  }
  if (at == NULL)
    return 0;
  *start = (size_t)(p - url);
  *end = (size_t)(at - url);
  return 1;
}

/* One URL (not a tier's), as encache_store_url_redact() shows it. */
static int redact_one(const char *url, char *buf, size_t size) {
  size_t len = strlen(url), start, end, keep = len, skip = 0;
  const char *colon = NULL;
  if (encache__url_userinfo(url, &start, &end))
    colon = memchr(url + start, ':', end - start);
  if (colon != NULL) {
    keep = (size_t)(colon + 1 - url); /* through "user:" */
    skip = end - keep;                /* the password */
  }
  size_t out = len - skip + (colon != NULL ? 3 : 0);
  if (out > INT_MAX)
    return ENCACHE_EINVAL;
  if (buf == NULL)
    return (int)out;
  if (size <= out) {
    buf[0] = '\0';
    return ENCACHE_ENOBUFS;
  }
  memcpy(buf, url, keep);
  if (colon != NULL) {
    memcpy(buf + keep, "***", 3);
    memcpy(buf + keep + 3, url + end, len - end);
  }
  buf[out] = '\0';
  return (int)out;
}

/* A tier, "tier:LOCAL+REMOTE", part by part: seen whole, the first
 * "scheme://" is the local part's and the remote's password would be
 * shown.  The local part is redacted from a copy on the stack; one that
 * does not fit (no shm URL is that long) is shown up to its first ':' or
 * '@', then "...".  The remote part may be a tier again (refused at
 * open, redacted all the same). */
static int redact_tier(const char *url, char *buf, size_t size) {
  char local[1024];
  size_t n = strcspn(url + 5, "+");
  const char *remote = url + 5 + n + 1;
  if (n < sizeof(local)) {
    memcpy(local, url + 5, n);
    local[n] = '\0';
  } else {
    size_t k = strcspn(url + 5, ":@");
    snprintf(local, sizeof(local), "%.*s...", (int)(k < 1000 ? k : 1000),
             url + 5);
  }
  int a = redact_one(local, NULL, 0);
  int b = encache_store_url_redact(remote, NULL, 0);
  if (a < 0 || b < 0 || (uint64_t)a + (uint64_t)b + 6 > INT_MAX)
    return ENCACHE_EINVAL;
  size_t out = 6 + (size_t)a + (size_t)b;
  if (buf == NULL)
    return (int)out;
  if (size <= out) {
    buf[0] = '\0';
    return ENCACHE_ENOBUFS;
  }
  memcpy(buf, "tier:", 5);
  redact_one(local, buf + 5, size - 5);
  buf[5 + a] = '+';
  encache_store_url_redact(remote, buf + 6 + a, size - 6 - (size_t)a);
  return (int)out;
}

int encache_store_url_redact(const char *url, char *buf, size_t size) {
  if (url == NULL || (buf == NULL && size > 0)) {
    if (buf != NULL && size > 0)
      buf[0] = '\0';
    return ENCACHE_EINVAL;
  }
  if (strncmp(url, "tier:", 5) == 0 && url[5 + strcspn(url + 5, "+")] == '+')
    return redact_tier(url, buf, size);
  return redact_one(url, buf, size);
}
