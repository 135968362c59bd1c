/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resp_fake.h: a misbehaving RESP server for the Redis Store's tests.  It
 * listens on a free loopback port in a child process and answers every
 * connection as its mode says (see resp_fake.c).  Every mode ends by
 * itself after at most RESP_FAKE_LIFETIME_S, so that a client that never
 * gives up fails its test on a bound instead of hanging.
 */
#ifndef ENCACHE_TEST_RESP_FAKE_H
#define ENCACHE_TEST_RESP_FAKE_H

#include <sys/types.h>

#define RESP_FAKE_LIFETIME_S 30

typedef enum resp_mode {
  RESP_TRICKLE,      /* any command: a 100000-byte bulk, one byte per 100 ms */
  RESP_ENDLESS_LINE, /* any command: '+' then 'a' without end, fast */
  RESP_OVERSIZED,    /* any command: $2000000000 then a fast stream of bytes */
  RESP_MALFORMED,    /* any command: bytes that are not RESP */
  RESP_CLOSE_MID,    /* any command: half of a bulk reply, then close */
  RESP_STALE,        /* the first command of a connection is answered,
                        the second closes the connection unanswered */
  RESP_EPIPE,        /* reads 100 bytes of the first command, half-closes
                        (FIN), then resets: the client's send fails EPIPE */
  RESP_SCAN_ENDLESS, /* SCAN: 1000 new keys and a cursor that never is 0;
                        DBSIZE 10 */
  RESP_SCAN_BADKEYS, /* SCAN: cursor 0 and keys that are an integer, a nil,
                        an array and one string */
  RESP_MOVED,        /* any command: -MOVED 1234 127.0.0.1:1, as a cluster's
                        node would answer a key of another's slot */
  RESP_EXTRA,        /* any command: its normal answer, then :7 that answers
                        nothing asked */
  RESP_SCAN_SLOW     /* SCAN: 10 new keys and a cursor that never is 0, each
                        answer 1 ms late; DBSIZE: a status, not a count;
                        UNLINK: 1 (removed) */
} resp_mode;

/* Starts the server; sets *port; returns its pid (stop with
 * resp_fake_stop).  The server and its per-connection processes die with
 * the calling process. */
pid_t resp_fake_start(resp_mode mode, int *port);
/* Stops the server and every connection it serves; returns how many
 * connections it accepted. */
int resp_fake_stop(pid_t pid);

#endif
