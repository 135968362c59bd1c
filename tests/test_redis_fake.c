/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store against the misbehaving servers of tests/resp_fake.c
 * (closing, trickling, endless, oversized, malformed, endless SCAN): each
 * test asserts a bounded outcome (time derived from timeout_ms, memory, a
 * clean code, no crash).  These need no redis-server.
 * Tests say "skipped" and pass when redis-server is not installed; the
 * servers, clusters and shared helpers are in tests/redis_util.c.
 */
#include "runner.h"

#include "encache.h"
#include "redis_util.h"
#include "store_util.h"
#include "resp_fake.h"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Opens a Store on a fake server with both timeouts at timeout_ms. */
static encache_store *open_fake(int port, unsigned timeout_ms) {
  char url[128];
  snprintf(url, sizeof(url),
           "redis://127.0.0.1:%d?timeout_ms=%u&connect_timeout_ms=%u", port,
           timeout_ms, timeout_ms);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  return st;
}

/* An existence check and a write of key "k" through st are UNAVAILABLE
 * (after a read that was). */
static void exists_and_write_unavailable(encache_store *st) {
  const char *keys[1] = {"k"};
  int present[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, present), 0);
  ASSERT_EQ_INT(present[0], ENCACHE_EUNAVAIL);
  ASSERT_EQ_INT(encache_store_write(st, "k", NULL, 0, "v", 1),
                ENCACHE_EUNAVAIL);
}

TEST(redis_fake_connection_closed_unanswered_is_retried_once) {
  int port;
  pid_t srv = resp_fake_start(RESP_STALE, &port);
  encache_store *st = open_fake(port, 1000);
  char buf[16];
  /* Each connection answers one command and closes at the next: every
   * operation after the first finds its pooled connection closed before
   * any byte of reply, redials at once and succeeds. */
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), 5);
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), 5);
  ASSERT_EQ_MEM(buf, "hello", 5);
  const char *keys[1] = {"k"};
  int present[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, present), 0);
  ASSERT_EQ_INT(present[0], 1);
  ASSERT_EQ_INT(encache_store_write(st, "w", NULL, 0, "v", 1), 0);
  encache_store_close(st);
  ASSERT_EQ_INT(resp_fake_stop(srv), 4);
}

/* Reads one key (into cap bytes) from a fake server in mode with
 * timeout_ms; asserts the result and bounds on time and peak memory.
 * Returns the open Store for more checks; *srv is the server. */
static encache_store *bounded_read(resp_mode mode, unsigned timeout_ms,
                                   size_t cap, int64_t expect, double max_s,
                                   long max_kib, pid_t *srv) {
  int port;
  *srv = resp_fake_start(mode, &port);
  encache_store *st = open_fake(port, timeout_ms);
  char *buf = malloc(cap);
  long rss0 = maxrss_kib();
  double t0 = now_s();
  int64_t r = ts_read_one(st, "k", buf, cap);
  double took = now_s() - t0;
  long grew = maxrss_kib() - rss0;
  free(buf);
  ASSERT_EQ_INT(r, expect);
  if (took > max_s || grew > max_kib)
    test__fail(__FILE__, __LINE__, "fake server mode %d, timeout_ms=%u: "
               "%.1f s (at most %.1f), +%ld KiB (at most %ld)", (int)mode,
               timeout_ms, took, max_s, grew, max_kib);
  return st;
}

TEST(redis_fake_trickling_reply_is_bounded_by_timeout) {
  pid_t srv;
  /* A byte every 0.1 s: a per-system-call timeout would never fire.  The
   * bound is 0.5 s, generous for a loaded machine. */
  encache_store *st = bounded_read(RESP_TRICKLE, 500, 256 * 1024,
                                   ENCACHE_EUNAVAIL, 4.0, 64 * 1024, &srv);
  ASSERT_CONTAINS(encache_store_errmsg(st), "timed out");
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_endless_reply_is_refused) {
  pid_t srv;
  encache_store *st = bounded_read(RESP_ENDLESS_LINE, 2000, 4096,
                                   ENCACHE_EUNAVAIL, 5.0, 64 * 1024, &srv);
  ASSERT_CONTAINS(encache_store_errmsg(st), "line longer than");
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_oversized_bulk_is_refused_unread) {
  pid_t srv;
  /* $2000000000 into 4 KiB: too large, known from the header alone. */
  encache_store *st = bounded_read(RESP_OVERSIZED, 2000, 4096,
                                   ENCACHE_ETOOLARGE, 5.0, 32 * 1024, &srv);
  /* The connection was dropped, not reused mid-reply: the next read asks
   * again on a new one. */
  char buf[4096];
  ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_ETOOLARGE);
  encache_store_close(st);
  ASSERT_EQ_INT(resp_fake_stop(srv), 2);
}

TEST(redis_fake_malformed_and_cut_replies_are_unavailable) {
  static const resp_mode modes[] = {RESP_MALFORMED, RESP_CLOSE_MID};
  for (size_t m = 0; m < 2; m++) {
    int port;
    pid_t srv = resp_fake_start(modes[m], &port);
    encache_store *st = open_fake(port, 1000);
    char buf[4096];
    double t0 = now_s();
    ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_EUNAVAIL);
    exists_and_write_unavailable(st);
    ASSERT(now_s() - t0 < 5.0);
    encache_store_close(st);
    resp_fake_stop(srv);
  }
}

/* A single-node Store answered MOVED (a cluster's node behind a
 * redis:// URL, or a hostile server) follows no redirection: a whole
 * value, windows, an existence check and a write are UNAVAILABLE, the
 * message says why, and nothing is dialled at the address named (before,
 * the redirection wrote into the slot table a single node does not have:
 * found by fuzz_wread). */
TEST(redis_fake_moved_to_a_single_node_store_is_unavailable) {
  int port;
  pid_t srv = resp_fake_start(RESP_MOVED, &port);
  for (int windows = 0; windows < 2; windows++) {
    char url[160];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=1000%s", port,
             windows ? "&window=64&window_threshold=0" : "");
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(url, &st), 0);
    char buf[4096];
    ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_EUNAVAIL);
    if (windows)
      ASSERT_CONTAINS(encache_store_errmsg(st), "a redirection not followed");
    exists_and_write_unavailable(st);
    encache_store_close(st);
  }
  ASSERT_EQ_INT(resp_fake_stop(srv) >= 1, 1);
}

/* A server that sends a reply more than was asked (:7 after each
 * answer): the exchange fails UNAVAILABLE and its connection is dropped,
 * so that no later command takes the stray bytes for its own reply
 * (before, the EXISTS after a GET answered 7's "present"). */
TEST(redis_fake_bytes_after_the_last_reply_are_refused) {
  int port;
  pid_t srv = resp_fake_start(RESP_EXTRA, &port);
  encache_store *st = open_fake(port, 1000);
  char buf[4096];
  for (int round = 0; round < 3; round++) {
    ASSERT_EQ_INT(ts_read_one(st, "k", buf, sizeof(buf)), ENCACHE_EUNAVAIL);
    ASSERT_CONTAINS(encache_store_errmsg(st), "after the last reply");
    usleep(300 * 1000); /* past the node's backoff: a new connection */
    const char *keys[1] = {"k"};
    int present[1];
    ASSERT_EQ_INT(encache_store_exists(st, keys, 1, present), 0);
    ASSERT_EQ_INT(present[0], ENCACHE_EUNAVAIL);
    ASSERT_CONTAINS(encache_store_errmsg(st), "after the last reply");
    usleep(300 * 1000);
  }
  encache_store_close(st);
  ASSERT(resp_fake_stop(srv) >= 6); /* a connection for each exchange */
}

TEST(redis_fake_scan_that_never_ends_is_bounded) {
  int port;
  pid_t srv = resp_fake_start(RESP_SCAN_ENDLESS, &port);
  encache_store *st = open_fake(port, 1000);
  long n = 0;
  double t0 = now_s();
  ASSERT_EQ_INT(encache_store_list(st, NULL, count_keys, &n),
                ENCACHE_EUNAVAIL);
  double took = now_s() - t0;
  ASSERT_CONTAINS(encache_store_errmsg(st), "SCAN");
  if (took > 20.0 || n > 200000)
    test__fail(__FILE__, __LINE__, "a SCAN without end: %.1f s, %ld keys",
               took, n);
  encache_store_close(st);
  resp_fake_stop(srv);
}

TEST(redis_fake_scan_with_non_string_keys_is_refused) {
  int port;
  pid_t srv = resp_fake_start(RESP_SCAN_BADKEYS, &port);
  encache_store *st = open_fake(port, 1000);
  long n = 0;
  ASSERT_EQ_INT(encache_store_list(st, NULL, count_keys, &n),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "SCAN");
  encache_store_close(st);
  resp_fake_stop(srv);
}

/* A walk (a listing, then a removal by prefix) on a server whose SCAN
 * cursor never comes back to 0 and whose DBSIZE is no count: the bound on
 * calls alone (64 + 2^24/100) would take minutes at a SCAN a millisecond;
 * the handle's list timeout ends each walk instead, with the message of
 * that bound. */
TEST(redis_fake_scan_without_end_stops_at_the_list_timeout) {
  int port;
  pid_t srv = resp_fake_start(RESP_SCAN_SLOW, &port);
  encache_store *st = open_fake(port, 1000);
  ASSERT_EQ_INT(encache_store_set_list_timeout(st, 1000), 0);
  long n = 0;
  double t0 = now_s();
  ASSERT_EQ_INT(encache_store_list(st, NULL, count_keys, &n),
                ENCACHE_EUNAVAIL);
  double took = now_s() - t0;
  ASSERT_CONTAINS(encache_store_errmsg(st), "SCAN did not finish after");
  ASSERT_CONTAINS(encache_store_errmsg(st),
                  "the server's cursor never comes back to 0");
  if (took < 0.9 || took > 20.0)
    test__fail(__FILE__, __LINE__, "a listing with a 1 s bound: %.1f s",
               took);
  uint64_t removed = 0;
  t0 = now_s();
  ASSERT_EQ_INT(encache_store_remove_prefix(st, "k", &removed),
                ENCACHE_EUNAVAIL);
  took = now_s() - t0;
  ASSERT_CONTAINS(encache_store_errmsg(st),
                  "the server's cursor never comes back to 0");
  ASSERT(removed > 0); /* the keys of the pages it saw, counted */
  if (took < 0.9 || took > 20.0)
    test__fail(__FILE__, __LINE__, "a removal with a 1 s bound: %.1f s",
               took);
  encache_store_close(st);
  resp_fake_stop(srv);
}
