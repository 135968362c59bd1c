/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the Redis Store's windowed reads (src/store/redis/wread.c): one
 * encache_store_read() of one to three keys, every one in windows of 64
 * bytes, 2 in flight (a stream), against a server on a unix socket that
 * answers whatever the input holds, then closes its side.  The input,
 * after two bytes that choose the number of keys, checksum=, whether each
 * object's header goes to a buffer of its own (as the engine reads) and
 * the buffers' size, is every byte the server sends to the first connection
 * (later ones, the older guard's and an empty value's, are closed
 * unanswered).  Whatever the bytes: nothing is written outside the
 * buffers (ASan), every answer is a length within its buffer or one of
 * the Store's codes, and with checksum=required every hit is an object
 * whose check, for its key, is among the bytes the server sent (a hit is
 * never made of bytes no check vouches for). */
#include "redis/redis.h"

#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXIN (96u << 10) /* what a unix socket's buffer takes at once */
#define NKEYS 3

static char path[108];
static int lfd = -1;

typedef struct server {
  const uint8_t *in;
  size_t len;
  int stop[2]; /* a pipe: readable once the read is over */
} server;

/* Answers the first connection with the input, then closes it once the
 * client has; closes later ones at once; returns when told to stop. */
static void *serve(void *arg) {
  server *sv = arg;
  for (int n = 0;; n++) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(lfd, &r);
    FD_SET(sv->stop[0], &r);
    int m = lfd > sv->stop[0] ? lfd : sv->stop[0];
    if (select(m + 1, &r, NULL, NULL, NULL) < 0 || FD_ISSET(sv->stop[0], &r))
      return NULL;
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
      continue;
    if (n == 0) {
      if (sv->len > 0 && write(c, sv->in, sv->len) != (ssize_t)sv->len)
        __builtin_trap(); /* fits the socket's buffer: MAXIN */
      shutdown(c, SHUT_WR);
      char sink[4096];
      while (read(c, sink, sizeof(sink)) > 0)
        ; /* until the client closes */
    }
    close(c);
  }
}

static void setup(void) {
  snprintf(path, sizeof(path), "/tmp/encache-fuzz-wread-%d.sock",
           (int)getpid());
  unlink(path);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
  lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
      listen(lfd, 8) != 0)
    __builtin_trap();
}

/* Whether a's n bytes hold b's m. */
static int holds(const uint8_t *a, size_t n, const unsigned char *b, size_t m) {
  for (size_t i = 0; i + m <= n; i++)
    if (memcmp(a + i, b, m) == 0)
      return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size - 2 > MAXIN)
    return 0;
  if (lfd < 0)
    setup();
  static const char *const modes[3] = {"on", "off", "required"};
  int mode = (data[0] & 3) % 3, nkeys = 1 + ((data[0] >> 2) & 3) % NKEYS;
  size_t cap = 64 + (size_t)data[1] * 8; /* 64 to 2104 bytes: 1 to 33 windows */
  char url[300];
  snprintf(url, sizeof(url),
           "unix://%s?window=64&window_depth=2&window_threshold=0&"
           "timeout_ms=200&checksum=%s",
           path, modes[mode]);
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    __builtin_trap();
  server sv = {data + 2, size - 2, {-1, -1}};
  pthread_t t;
  if (pipe(sv.stop) != 0 || pthread_create(&t, NULL, serve, &sv) != 0)
    __builtin_trap();
  static const char *const keys[NKEYS] = {"k0", "key-1", "{t}k2"};
  /* Buffers of their exact sizes (ASan sees a byte past them); with
   * split, each object's header to a head of its own, as the engine
   * reads (lookup_read.c). */
  size_t split = (data[0] & 0x10) ? ENCACHE_HEADER_SIZE : 0;
  unsigned char *heads[NKEYS], *bufs[NKEYS];
  size_t caps[NKEYS];
  int64_t res[NKEYS];
  for (int k = 0; k < NKEYS; k++) {
    heads[k] = malloc(split ? split : 1);
    bufs[k] = malloc(cap);
    caps[k] = cap;
    if (heads[k] == NULL || bufs[k] == NULL)
      __builtin_trap();
  }
  int rc = split ? st->ops->read_split(st, keys, (size_t)nkeys, split,
                                       (void *const *)heads,
                                       (void *const *)bufs, caps, res)
                 : encache_store_read(st, keys, (size_t)nkeys,
                                      (void *const *)bufs, caps, res);
  encache_store_close(st);
  if (write(sv.stop[1], "x", 1) != 1)
    __builtin_trap();
  pthread_join(t, NULL);
  close(sv.stop[0]);
  close(sv.stop[1]);
  if (getenv("FUZZ_WREAD_SHOW") != NULL) /* to see what a seed does */
    for (int k = 0; k < nkeys; k++)
      fprintf(stderr, "%s: %lld\n", keys[k],
              rc ? (long long)rc : (long long)res[k]);
  for (int k = 0; rc == 0 && k < nkeys; k++) {
    if (res[k] > (int64_t)(split + cap))
      __builtin_trap(); /* more than its buffers */
    if (res[k] < 0 && res[k] != ENCACHE_ENOENT && res[k] != ENCACHE_EUNAVAIL &&
        res[k] != ENCACHE_ETOOLARGE && res[k] != ENCACHE_ENOMEM)
      __builtin_trap(); /* not a Store's answer */
    if (mode == 2 && res[k] >= 0) {
      sum_state s;
      memset(&s, 0, sizeof(s));
      size_t h = (size_t)res[k] < split ? (size_t)res[k] : split;
      encache__shm_sum_update(&s, heads[k], h);
      encache__shm_sum_update(&s, bufs[k], (size_t)res[k] - h);
      unsigned char seal[CHECK_BYTES];
      encache__redis_check_seal(
          seal, encache__redis_check_digest(
                    &s, encache__redis_check_seed(keys[k])));
      if (!holds(data + 2, size - 2, seal, sizeof(seal)))
        __builtin_trap(); /* a hit no check the server sent vouches for */
    }
  }
  for (int k = 0; k < NKEYS; k++) {
    free(heads[k]);
    free(bufs[k]);
  }
  return 0;
}
