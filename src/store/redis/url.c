/* SPDX-License-Identifier: Apache-2.0 */
/*
 * url.c: the Redis URL (see redis.h and docs/stores.md): nodes, database,
 * options and credentials.  Every message names the URL by s->base.url,
 * its redacted form, and no message ever quotes the password or the
 * content of a password file.
 *
 * The password is, first of all, the URL's (percent-decoded); else the
 * first line of the file named by password_file=PATH (as libpq's
 * PGPASSFILE, it keeps the secret out of command lines and process
 * listings); else $ENCACHE_REDIS_PASSWORD when set and not empty (as
 * redis-cli's REDISCLI_AUTH).  The user, when any, comes from the URL.
 */
#include "redis.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define PASSWORD_MAX 4096 /* the longest password line we read */

static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* A NUL-terminated copy of [p, p+len) with %XX sequences decoded (a '%'
 * not followed by two hex digits stays as it is); NULL: out of memory. */
static char *decoded(const char *p, size_t len) {
  char *out = encache__malloc(len + 1), *o = out;
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < len; i++) {
    int hi = i + 2 < len && p[i] == '%' ? hexval(p[i + 1]) : -1;
    int lo = hi >= 0 ? hexval(p[i + 2]) : -1;
    if (lo >= 0) {
      *o++ = (char)(hi * 16 + lo);
      i += 2;
    } else {
      *o++ = p[i];
    }
  }
  *o = '\0';
  return out;
}

/* The user and password of userinfo [p, p+len) ("user:password",
 * ":password" or "user").  Returns 0 or ENCACHE_ENOMEM: never a silent
 * connection without AUTH. */
static int take_userinfo(redis_store *s, const char *p, size_t len) {
  const char *colon = memchr(p, ':', len);
  size_t ulen = colon ? (size_t)(colon - p) : len;
  if (ulen > 0 && (s->user = decoded(p, ulen)) == NULL)
    goto oom;
  if (colon != NULL &&
      (s->password = decoded(colon + 1, len - ulen - 1)) == NULL)
    goto oom;
  return 0;
oom:
  return encache_store_fail(&s->base, ENCACHE_ENOMEM,
                            "%s: out of memory copying the credentials",
                            s->base.url);
}

/* The first line of path (its newline, and a CR before it, stripped) as
 * the password.  Returns 0, ENCACHE_EURL (empty or too long), -errno
 * (unreadable) or ENCACHE_ENOMEM; messages name the file, never what it
 * holds. */
static int read_password_file(redis_store *s, const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    int e = errno;
    return encache_store_fail(&s->base, -e, "%s: password_file %s: %s",
                              s->base.url, path, strerror(e));
  }
  char *line = encache__malloc(PASSWORD_MAX + 2);
  if (line == NULL) {
    fclose(f);
    return encache_store_fail(&s->base, ENCACHE_ENOMEM,
                              "%s: out of memory reading password_file %s",
                              s->base.url, path);
  }
  int rc = 0;
  if (fgets(line, PASSWORD_MAX + 2, f) == NULL) {
    rc = ferror(f) ? -EIO : ENCACHE_EURL;
    encache_store_fail(&s->base, rc, "%s: password_file %s: %s", s->base.url,
                       path, rc == -EIO ? strerror(EIO) : "the file is empty");
  } else {
    size_t n = strcspn(line, "\n");
    int whole = line[n] == '\n' || feof(f);
    if (n > 0 && line[n - 1] == '\r')
      n--;
    line[n] = '\0';
    if (!whole || n == 0)
      rc = encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: password_file %s: %s", s->base.url, path,
                              n == 0 ? "the first line is empty"
                                     : "the first line is longer than "
                                       "4096 bytes");
  }
  fclose(f);
  if (rc == 0)
    s->password = line;
  else
    encache__free(line);
  return rc;
}

/* The password when the URL has none: password_file (when given), else
 * $ENCACHE_REDIS_PASSWORD. */
static int default_password(redis_store *s, const char *password_file) {
  if (s->password != NULL)
    return 0; /* the URL's comes first */
  if (password_file != NULL)
    return read_password_file(s, password_file);
  const char *env = getenv("ENCACHE_REDIS_PASSWORD");
  if (env == NULL || env[0] == '\0')
    return 0;
  if ((s->password = encache__strdup(env)) == NULL)
    return encache_store_fail(&s->base, ENCACHE_ENOMEM,
                              "%s: out of memory copying "
                              "ENCACHE_REDIS_PASSWORD",
                              s->base.url);
  return 0;
}

/* Adds "host:port" as a node; returns 0 or ENCACHE_EURL. */
static int add_hostport(redis_store *s, const char *hp, size_t len) {
  char buf[300];
  if (len == 0 || len >= sizeof(buf))
    return ENCACHE_EURL;
  memcpy(buf, hp, len);
  buf[len] = '\0';
  char *colon = strrchr(buf, ':');
  if (colon == NULL || colon == buf)
    return ENCACHE_EURL;
  *colon = '\0';
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    return ENCACHE_EURL;
  if (encache__redis_node_index(s, buf, (int)port) == NO_NODE)
    return ENCACHE_EURL;
  return 0;
}

/* unix:///path: the socket path is [rest, rest+hlen). */
static int take_socket(redis_store *s, const char *rest, size_t hlen) {
  if (hlen == 0 || rest[0] != '/' || hlen >= sizeof(s->nodes[0].host))
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: expected unix:///path/to/socket",
                              s->base.url);
  memcpy(s->nodes[0].host, rest, hlen);
  s->nodes[0].host[hlen] = '\0';
  s->nnodes = 1;
  return 0;
}

/* redis-cluster://: the seeds host:port,host:port... */
static int take_seeds(redis_store *s, const char *rest, size_t hlen) {
  for (const char *p = rest; p < rest + hlen;) {
    const char *comma = memchr(p, ',', (size_t)(rest + hlen - p));
    size_t l = comma ? (size_t)(comma - p) : (size_t)(rest + hlen - p);
    if (add_hostport(s, p, l) < 0)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: seed '%.*s' is not host:port",
                                s->base.url, (int)l, p);
    p += l + (comma ? 1 : 0);
  }
  s->nseeds = s->nnodes;
  if (s->nseeds == 0)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: expected host:port[,host:port...]",
                              s->base.url);
  if ((s->slots = encache__malloc(NSLOTS * sizeof(uint16_t))) == NULL)
    return encache_store_fail(&s->base, ENCACHE_ENOMEM, "%s: out of memory",
                              s->base.url);
  for (size_t k = 0; k < NSLOTS; k++)
    s->slots[k] = NO_NODE;
  s->need_refresh = 1;
  return 0;
}

/* redis://: host:port[/db]. */
static int take_host(redis_store *s, const char *rest, size_t hlen) {
  const char *slash = memchr(rest, '/', hlen);
  size_t hp = slash ? (size_t)(slash - rest) : hlen;
  if (add_hostport(s, rest, hp) < 0)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: expected redis://[user:password@]host:"
                              "port[/db]",
                              s->base.url);
  if (slash != NULL) {
    char *end;
    long db = strtol(slash + 1, &end, 10);
    if (end != rest + hlen || end == slash + 1 || db < 0 || db > 65535)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: the database must be a number",
                                s->base.url);
    s->db = (int)db;
  }
  return 0;
}

/* A size option (window, window_threshold): bytes, or with a suffix
 * KiB, MiB, GiB (K, M, G: the same); at most 512 MiB. */
static int take_size(redis_store *s, const char *k, const char *v,
                     uint64_t *out) {
  static const struct {
    const char *suffix;
    unsigned shift;
  } units[] = {{"", 0},   {"B", 0},    {"K", 10}, {"KiB", 10}, {"M", 20},
               {"MiB", 20}, {"G", 30}, {"GiB", 30}};
  char *end;
  unsigned long long val = strtoull(v, &end, 10);
  size_t u = 0, nunits = sizeof(units) / sizeof(units[0]);
  while (u < nunits && strcmp(end, units[u].suffix) != 0)
    u++;
  if (end == v || v[0] == '-' || u == nunits || val > (512ull << 20) ||
      (val << units[u].shift) > (512ull << 20))
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: %s=%s: must be a size in bytes (or with "
                              "KiB, MiB), at most 512MiB",
                              s->base.url, k, v);
  *out = (uint64_t)val << units[u].shift;
  return 0;
}

/* The windowing options (redis.h, "Windows"). */
static int take_window(redis_store *s, const char *k, const char *v) {
  if (strcmp(k, "window_depth") == 0) {
    char *end;
    unsigned long d = strtoul(v, &end, 10);
    if (end == v || *end != '\0' || d < 1 || d > WINDOW_DEPTH_MAX)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: window_depth=%s: must be 1 to %d",
                                s->base.url, v, WINDOW_DEPTH_MAX);
    s->window_depth = (unsigned)d;
    return 0;
  }
  uint64_t val = 0;
  int rc = take_size(s, k, v, &val);
  if (rc < 0)
    return rc;
  if (strcmp(k, "window") == 0) {
    if (val < WINDOW_MIN)
      return encache_store_fail(&s->base, ENCACHE_EURL,
                                "%s: window=%s: must be at least %u bytes",
                                s->base.url, v, WINDOW_MIN);
    s->window = val;
  } else {
    s->window_threshold = val;
  }
  return 0;
}

/* checksum=on|off|required (redis.h, "Integrity"). */
static int take_checksum(redis_store *s, const char *v) {
  static const char *const names[] = {"on", "off", "required"};
  for (int i = 0; i < 3; i++)
    if (strcmp(v, names[i]) == 0) {
      s->checksum = i; /* CHECKSUM_ON, _OFF, _REQUIRED */
      return 0;
    }
  return encache_store_fail(&s->base, ENCACHE_EURL,
                            "%s: checksum=%s: must be on, off or required",
                            s->base.url, v);
}

/* One numeric option k=v. */
static int take_number(redis_store *s, int unix_sock, const char *k,
                       const char *v) {
  char *end;
  unsigned long val = strtoul(v, &end, 10);
  int number = end != v && *end == '\0' && val <= 86400000ul;
  unsigned *field = strcmp(k, "connect_timeout_ms") == 0
                        ? &s->connect_timeout_ms
                    : strcmp(k, "timeout_ms") == 0 ? &s->timeout_ms
                    : strcmp(k, "ttl_s") == 0      ? &s->ttl_s
                                                   : NULL;
  if (field == NULL && !(unix_sock && strcmp(k, "db") == 0))
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: unknown option '%s' (known: "
                              "connect_timeout_ms, timeout_ms, ttl_s, "
                              "window, window_threshold, window_depth, "
                              "checksum, password_file%s)",
                              s->base.url, k, unix_sock ? ", db" : "");
  if (!number || (field != &s->ttl_s && val == 0) ||
      (field == NULL && val > 65535))
    return encache_store_fail(
        &s->base, ENCACHE_EURL, "%s: %s=%s: must be a %s number", s->base.url,
        k, v, field == &s->ttl_s ? "non-negative" : "positive");
  if (field != NULL)
    *field = (unsigned)val;
  else
    s->db = (int)val;
  return 0;
}

/* The options ?k=v&..., then the password when the URL has none. */
static int take_options(redis_store *s, int unix_sock, const char *query) {
  encache__query qs = {query};
  char k[64], v[PASSWORD_MAX];
  char *password_file = NULL;
  int rc, more;
  while ((more = encache__query_next(&qs, k, sizeof(k), v, sizeof(v))) > 0) {
    if (strcmp(k, "password_file") == 0) {
      encache__free(password_file);
      rc = (password_file = encache__strdup(v)) != NULL
               ? 0
               : encache_store_fail(&s->base, ENCACHE_ENOMEM,
                                    "%s: out of memory", s->base.url);
    } else if (strcmp(k, "checksum") == 0) {
      rc = take_checksum(s, v);
    } else if (strncmp(k, "window", 6) == 0 &&
               (k[6] == '\0' || strcmp(k + 6, "_threshold") == 0 ||
                strcmp(k + 6, "_depth") == 0)) {
      rc = take_window(s, k, v);
    } else {
      rc = take_number(s, unix_sock, k, v);
    }
    if (rc < 0) {
      encache__free(password_file);
      return rc;
    }
  }
  rc = more < 0 ? encache_store_fail(&s->base, ENCACHE_EURL,
                                     "%s: malformed query (use "
                                     "?key=value&...)",
                                     s->base.url)
                : 0;
  if (rc == 0)
    rc = default_password(s, password_file);
  encache__free(password_file);
  return rc;
}

int encache__redis_parse_url(redis_store *s, const char *url) {
  const char *rest;
  int unix_sock = 0;
  if (strncmp(url, "redis-cluster://", 16) == 0) {
    s->cluster = 1;
    rest = url + 16;
  } else if (strncmp(url, "redis://", 8) == 0) {
    rest = url + 8;
  } else {
    unix_sock = 1;
    rest = url + 7; /* unix:// */
  }
  size_t start, end;
  if (!unix_sock && encache__url_userinfo(url, &start, &end)) {
    int rc = take_userinfo(s, url + start, end - start);
    if (rc < 0)
      return rc;
    rest = url + end + 1;
  }
  const char *q = strchr(rest, '?');
  size_t hlen = q ? (size_t)(q - rest) : strlen(rest);
  int rc = unix_sock    ? take_socket(s, rest, hlen)
           : s->cluster ? take_seeds(s, rest, hlen)
                        : take_host(s, rest, hlen);
  return rc < 0 ? rc : take_options(s, unix_sock, q ? q + 1 : NULL);
}
