/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzzes the Redis Store's reply reader (src/store/redis/io.c) on the
 * paths of windowed reads and of whole values (GETs, their check
 * verified): the input, after two bytes that size the destinations and
 * choose the summing or the check, is what a server answers to a
 * pipeline of four items (windows, or values) on a socket, read by
 * encache__redis_exchange() with the pipe direct (values received into
 * place by recv, not through the hiredis reader) or not.  Whatever the
 * bytes, nothing is written outside the destinations (ASan), no reply
 * says it holds more than its destination, and a value received directly
 * is the same, bytes, length and check, as the same value through the
 * reader. */
#include "redis/redis.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NITEMS 4
#define MAXIN (96u << 10) /* what a socket pair's buffer takes at once */

typedef struct run {
  rreply r[NITEMS];
  unsigned char dst[NITEMS][65536];
  sum_state sum;
  size_t got; /* replies taken */
  int x;
} run;

/* Reads the answers in (len bytes) to NITEMS items with pipe p's shape. */
static void one(const uint8_t *in, size_t len, size_t cap, size_t nhashed,
                int whole, int first, int direct, run *o) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    return;
  if (len > 0 && write(sv[1], in, len) != (ssize_t)len)
    __builtin_trap();
  shutdown(sv[1], SHUT_WR);
  redisContext *c = redisConnectFd(sv[0]);
  if (c == NULL || c->reader == NULL)
    __builtin_trap();
  c->reader->fn = encache__redis_replies(0);
  size_t item[NITEMS], caps[NITEMS];
  void *heads[NITEMS], *bufs[NITEMS];
  for (size_t k = 0; k < NITEMS; k++) {
    item[k] = k == 2 ? SIZE_MAX : k; /* one reply without a buffer */
    caps[k] = cap;
    heads[k] = bufs[k] = o->dst[k];
  }
  static const uint64_t seeds[NITEMS] = {1, 0x9e3779b97f4a7c15ull, 3, 4};
  memset(o, 0, sizeof(*o));
  /* Items below nhashed are summed; with first, item 1 is the first
   * window of a value of first bytes (summed only when its header says
   * that value carries a check). */
  sum_state *sums[NITEMS];
  uint64_t vlens[NITEMS] = {0, first, 0, 0};
  for (size_t k = 0; k < NITEMS; k++)
    sums[k] = !whole && k < nhashed ? &o->sum : NULL;
  rpipe p = {.replies = o->r, .cap = NITEMS, .item = item, .heads = heads,
             .bufs = bufs, .caps = caps, .seeds = whole ? seeds : NULL,
             .sums = sums, .vlens = vlens, .direct = direct};
  char cmd[] = "PING\r\n", why[256];
  struct iovec iov = {cmd, sizeof(cmd) - 1};
  xtime t = {now_ms() + 1000, 1000};
  o->x = encache__redis_exchange(c, &iov, 1, NITEMS, &p, NULL, t, why,
                                 sizeof(why));
  o->got = p.next;
  for (size_t k = 0; k < p.next; k++)
    if (o->r[k].type == REDIS_REPLY_STRING && item[k] != SIZE_MAX &&
        !o->r[k].too_large && o->r[k].len > (int64_t)cap)
      __builtin_trap();
  redisFree(c); /* closes sv[0] */
  close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size - 2 > MAXIN)
    return 0;
  /* Destinations of up to 64 KiB: values longer than the reader's first
   * 16 KiB read are received by recv() into place. */
  size_t cap = ((size_t)data[0] << 8) % 65537;
  size_t nhashed = data[1] % (NITEMS + 1);
  int whole = (data[1] & 0x80) != 0; /* GETs: values checked, not summed */
  /* a first window's value length: the objects of 1 to 32 KiB */
  int first = (data[1] & 0x40) != 0 ? 24 + CHECK_BYTES + 1024 * (data[0] & 31)
                                    : 0;
  static run a, b;
  one(data + 2, size - 2, cap, nhashed, whole, first, 1, &a);
  one(data + 2, size - 2, cap, nhashed, whole, first, 0, &b);
  /* The replies both took agree (the direct one may take a value the
   * reader refuses only by failing where the reader failed too). */
  if (a.x == XR_OK && b.x == XR_OK) {
    if (a.got != b.got)
      __builtin_trap();
    for (size_t k = 0; k < a.got; k++) {
      if (a.r[k].type != b.r[k].type || a.r[k].len != b.r[k].len ||
          a.r[k].too_large != b.r[k].too_large ||
          a.r[k].check != b.r[k].check)
        __builtin_trap();
      if (a.r[k].type == REDIS_REPLY_STRING && k != 2 && !a.r[k].too_large &&
          memcmp(a.dst[k], b.dst[k], (size_t)a.r[k].len) != 0)
        __builtin_trap();
    }
    if (!whole && nhashed && encache__shm_sum_final(&a.sum) !=
                       encache__shm_sum_final(&b.sum))
      __builtin_trap();
  }
  return 0;
}
