/* SPDX-License-Identifier: Apache-2.0 */
/*
 * direct_redis.h: the server's ceiling, for bench_redis (a): reads on a
 * socket of their own, without hiredis, every value received by recv()
 * straight into its place in the destination and nothing checked.
 *
 *   direct_get      one GET per object, the whole reply received in place;
 *   direct_windows  1 MiB GETRANGE windows, 8 in flight, each received in
 *                   place (the naive client's windows, without hiredis's
 *                   reader).
 *
 * No client reads faster from the same server: direct_get says whether
 * plain GET's cliff is the client's (hiredis's reader) or the server's,
 * and direct_windows is the most any windowed reader can move, so that
 * encache's lookup is measured against it too.  Bench code: a reply it
 * does not expect is an error, never parsed further.
 */
#ifndef ENCACHE_BENCH_DIRECT_REDIS_H
#define ENCACHE_BENCH_DIRECT_REDIS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DIRECT_WINDOW (1u << 20)
#define DIRECT_DEPTH 8

/* A socket and the bytes read past the last reply's end. */
typedef struct direct_conn {
  int fd;
  char buf[4096];
  size_t at, end;
} direct_conn;

static inline int direct_send(direct_conn *c, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

static inline int direct_byte(direct_conn *c) {
  if (c->at == c->end) {
    ssize_t k = recv(c->fd, c->buf, sizeof(c->buf), 0);
    if (k <= 0)
      return -1;
    c->at = 0, c->end = (size_t)k;
  }
  return (unsigned char)c->buf[c->at++];
}

/* Receives one bulk reply: its first `keep` bytes into dst, the rest (a
 * check after the object) dropped; returns 0, or -1 on an error, a reply
 * that is not a bulk string, or one shorter than keep. */
static inline int direct_bulk(direct_conn *c, void *dst, uint64_t keep) {
  char line[32];
  size_t n = 0;
  int ch;
  while ((ch = direct_byte(c)) >= 0 && ch != '\n')
    if (n < sizeof(line) - 1)
      line[n++] = (char)ch;
  line[n] = '\0';
  if (ch < 0 || line[0] != '$')
    return -1;
  long long len = strtoll(line + 1, NULL, 10);
  if (len < 0 || (uint64_t)len < keep)
    return -1;
  uint64_t left = (uint64_t)len + 2; /* and its CRLF */
  unsigned char *p = dst;
  size_t have = c->end - c->at;
  size_t take = have < keep ? have : (size_t)keep;
  memcpy(p, c->buf + c->at, take);
  c->at += take, p += take, left -= take, keep -= take;
  while (keep > 0) { /* straight into place */
    ssize_t k = recv(c->fd, p, (size_t)keep, 0);
    if (k <= 0)
      return -1;
    p += k, keep -= (uint64_t)k, left -= (uint64_t)k;
  }
  while (left > 0) { /* the dropped tail and the CRLF */
    if (c->at == c->end) {
      if (direct_byte(c) < 0)
        return -1;
      c->at--; /* refilled: the byte is still to be skipped */
    }
    size_t skip = c->end - c->at < left ? c->end - c->at : (size_t)left;
    c->at += skip, left -= skip;
  }
  return 0;
}

static inline int direct_cmd(direct_conn *c, const char *verb,
                             const char *key, const uint64_t *args,
                             int nargs) {
  char cmd[512], num[24];
  int n = snprintf(cmd, sizeof(cmd), "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
                   2 + nargs, strlen(verb), verb, strlen(key), key);
  for (int i = 0; i < nargs && n > 0 && (size_t)n < sizeof(cmd); i++) {
    int d = snprintf(num, sizeof(num), "%llu", (unsigned long long)args[i]);
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, "$%d\r\n%s\r\n", d, num);
  }
  if (n <= 0 || (size_t)n >= sizeof(cmd))
    return -1;
  return direct_send(c, cmd, (size_t)n);
}

/* GET of each of the n keys (pipelined), its first len bytes into dst[k]. */
static inline int direct_get(direct_conn *c, char *const *keys,
                             void *const *dst, int n, uint64_t len) {
  for (int k = 0; k < n; k++)
    if (direct_cmd(c, "GET", keys[k], NULL, 0) != 0)
      return -1;
  for (int k = 0; k < n; k++)
    if (direct_bulk(c, dst[k], len) != 0)
      return -1;
  return 0;
}

/* The first len bytes of each key in windows, DIRECT_DEPTH in flight. */
static inline int direct_windows(direct_conn *c, char *const *keys,
                                 void *const *dst, int n, uint64_t len) {
  uint64_t per = (len + DIRECT_WINDOW - 1) / DIRECT_WINDOW;
  uint64_t total = per * (uint64_t)n, sent = 0, got = 0;
  while (got < total) {
    for (; sent < total && sent - got < DIRECT_DEPTH; sent++) {
      uint64_t off = (sent % per) * DIRECT_WINDOW;
      uint64_t range[2] = {off, off + DIRECT_WINDOW - 1};
      if (direct_cmd(c, "GETRANGE", keys[sent / per], range, 2) != 0)
        return -1;
    }
    uint64_t off = (got % per) * DIRECT_WINDOW;
    uint64_t want = len - off < DIRECT_WINDOW ? len - off : DIRECT_WINDOW;
    if (direct_bulk(c, (char *)dst[got / per] + off, want) != 0)
      return -1;
    got++;
  }
  return 0;
}

#endif
