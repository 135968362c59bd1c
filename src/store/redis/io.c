/* SPDX-License-Identifier: Apache-2.0 */
/*
 * io.c: our own I/O around the hiredis reader (see redis.h): sends with
 * sendmsg(MSG_NOSIGNAL), receives under one deadline per exchange, checks
 * each reply against its bound before its body is read, and the reply
 * functions that copy values straight into the caller's buffers.
 */
#include "redis.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

static rreply dummy_reply; /* for nested elements and stray replies */

static rreply *next_reply(const redisReadTask *task) {
  rpipe *p = task->privdata;
  if (p == NULL || task->parent != NULL || p->next >= p->cap)
    return &dummy_reply;
  rreply *r = &p->replies[p->next++];
  memset(r, 0, sizeof(*r));
  r->type = task->type;
  return r;
}

/* The bytes of item's value that go to its head. */
static size_t split_of(const rpipe *p, size_t item) {
  return p->splits != NULL ? p->splits[item] : p->split;
}

/* Copies the first len bytes of a value into item's buffers (its first
 * split bytes to its head), fed to st as they are copied (NULL: none),
 * or sets too_large when they do not fit. */
static void copy_value(const rpipe *p, size_t item, rreply *r,
                       const char *str, size_t len, sum_state *st) {
  size_t split = split_of(p, item);
  if (len > split && len - split > p->caps[item]) {
    r->too_large = 1;
    return;
  }
  size_t h = len < split ? len : split;
  const unsigned char *v = (const unsigned char *)str;
  encache__shm_copy_sum(p->heads[item], v, h, st);
  encache__shm_copy_sum(p->bufs[item], v + h, len - h, st);
}

/* The sum item's bytes go to as they are copied (NULL: none): the
 * item's; for the first window of a value (vlens), only when its
 * header says the value carries a check and the window ends within the
 * object (r->check records it). */
static sum_state *sum_of(const rpipe *p, size_t item, rreply *r,
                         const char *str, size_t len) {
  /* str: at least the first min(len, ENCACHE_HEADER_SIZE) bytes (all of
   * them from rf_string, the header from recv_direct) */
  if (p->sums == NULL || p->sums[item] == NULL)
    return NULL;
  uint64_t vlen = p->vlens != NULL ? p->vlens[item] : 0;
  if (vlen == 0)
    return p->sums[item];
  if (vlen < ENCACHE_HEADER_SIZE + CHECK_BYTES)
    return NULL;
  uint64_t obj =
      encache__redis_check_objlen((const unsigned char *)str, len, vlen);
  if (obj == vlen || len > obj)
    return NULL; /* no check, or the window runs into it */
  r->check = CHECK_SUMMED;
  return p->sums[item];
}

static void *rf_string(const redisReadTask *task, char *str, size_t len) {
  rreply *r = next_reply(task);
  rpipe *p = task->privdata;
  if (r == &dummy_reply)
    return r;
  r->len = (int64_t)len;
  if (task->type == REDIS_REPLY_STRING) {
    size_t item = p->item ? p->item[p->next - 1] : SIZE_MAX;
    if (p->bufs != NULL && item != SIZE_MAX) {
      if (p->seeds != NULL) { /* a whole value, its check verified */
        r->len = encache__redis_check_value(
            (const unsigned char *)str, len, split_of(p, item), p->heads[item],
            p->bufs[item], p->caps[item], p->seeds[item], &r->check);
        r->too_large = r->len < 0;
      } else {
        copy_value(p, item, r, str, len, sum_of(p, item, r, str, len));
      }
    } else {
      snprintf(r->text, sizeof(r->text), "%.*s", (int)(len < 199 ? len : 199),
               str);
    }
  } else {
    snprintf(r->text, sizeof(r->text), "%.*s", (int)(len < 199 ? len : 199),
             str);
  }
  return r;
}

/* None of the commands we pipeline answers an array: refuse it (hiredis
 * stops with an error and the connection is dropped) rather than read an
 * array of any size into the dummy. */
static void *rf_array(const redisReadTask *task, int n) {
  (void)n;
  rpipe *p = task->privdata;
  if (p != NULL)
    p->bad = "an array where a value was expected";
  return NULL;
}

static void *rf_integer(const redisReadTask *task, long long v) {
  rreply *r = next_reply(task);
  if (r != &dummy_reply) /* shared by every thread: never written */
    r->integer = v;
  return r;
}

static void *rf_nil(const redisReadTask *task) {
  rreply *r = next_reply(task);
  if (r != &dummy_reply)
    r->type = REDIS_REPLY_NIL; /* the task says STRING for a nil bulk */
  return r;
}

static void rf_free(void *obj) { (void)obj; }

static redisReplyObjectFunctions reply_fns = {rf_string, rf_array, rf_integer,
                                              rf_nil, rf_free};

/* Ordinary replies: hiredis's own functions (taken from a reader it made),
 * with arrays bounded in elements. */
static redisReplyObjectFunctions hiredis_fns, plain_fns;
static pthread_once_t plain_once = PTHREAD_ONCE_INIT;

static void *pl_array(const redisReadTask *task, int n) {
  if (n > PLAIN_ELEMENTS_MAX) {
    rpipe *p = task->privdata;
    if (p != NULL)
      p->bad = "an array of more than 1048576 elements";
    return NULL;
  }
  return hiredis_fns.createArray(task, n);
}

static void plain_init(void) {
  redisReader *r = redisReaderCreate();
  if (r == NULL)
    return; /* plain_fns stays empty: encache__redis_replies() says NULL */
  hiredis_fns = *r->fn;
  redisReaderFree(r);
  plain_fns = hiredis_fns;
  plain_fns.createArray = pl_array;
}

redisReplyObjectFunctions *encache__redis_replies(int plain) {
  pthread_once(&plain_once, plain_init);
  if (plain_fns.createString == NULL)
    return NULL;
  return plain ? &plain_fns : &reply_fns;
}

/* The bounds of an exchange that may move `bytes` bytes. */
xtime encache__redis_deadline(const redis_store *s, uint64_t bytes) {
  xtime t = {now_ms() + s->timeout_ms + (bytes >> 20) * MS_PER_MIB, /* < 2^48 */
             s->timeout_ms};
  return t;
}

/* Waits until fd is ready for events, at most until the deadline and for
 * idle_ms.  Returns 0, or -errno (-ETIMEDOUT), errno set. */
static int wait_fd(int fd, short events, xtime t) {
  uint64_t end = now_ms() + t.idle_ms;
  if (end > t.deadline)
    end = t.deadline;
  for (;;) {
    uint64_t now = now_ms();
    if (now >= end) {
      errno = ETIMEDOUT;
      return -ETIMEDOUT;
    }
    uint64_t left = end - now;
    struct pollfd pfd = {fd, events, 0};
    int r = poll(&pfd, 1, left > INT_MAX ? INT_MAX : (int)left);
    if (r > 0)
      return 0; /* ready, or an error the next call reports */
    if (r < 0 && errno != EINTR)
      return -errno;
  }
}

/* Sends all of iov (modified) before the deadline: 0, or -errno, errno
 * set. */
static int send_all(int fd, struct iovec *iov, int cnt, xtime deadline) {
  while (cnt > 0) {
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)(cnt > IOV_MAX ? IOV_MAX : cnt);
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if ((errno != EAGAIN && errno != EWOULDBLOCK) ||
          wait_fd(fd, POLLOUT, deadline) < 0)
        return -errno;
      continue;
    }
    while (cnt > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      cnt--;
    }
    if (cnt > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

/*
 * Called when the reader needs more bytes: refuses the reply being parsed
 * if it already exceeds its bound, before its body is read.  hiredis has
 * consumed the type byte of the item it is parsing, so a bulk string's
 * length is at the read position; a value for an item with a buffer may
 * be split + cap + SLACK_BYTES long (XR_TOOBIG beyond), anything else has
 * the bounds of its kind.
 */
static int check_bounds(redisReader *rd, const rpipe *p, int plain, char *why,
                        size_t whysize) {
  size_t buffered = rd->len - rd->pos;
  if (rd->ridx >= 0 && rd->rstack[rd->ridx].type == REDIS_REPLY_STRING) {
    const char *h = rd->buf + rd->pos;
    const char *cr = memchr(h, '\r', buffered);
    if (cr != NULL) {
      uint64_t len = 0;
      int digits = 0;
      for (const char *d = h; d < cr && *d >= '0' && *d <= '9' && digits < 19;
           d++, digits++)
        len = len * 10 + (uint64_t)(*d - '0');
      size_t item = SIZE_MAX;
      uint64_t limit = plain ? PLAIN_BULK_MAX : LINE_MAX_BYTES;
      if (!plain && rd->rstack[rd->ridx].parent == NULL && p->bufs != NULL &&
          p->item != NULL && p->next < p->cap &&
          (item = p->item[p->next]) != SIZE_MAX)
        limit = sat_add(sat_add(split_of(p, item), p->caps[item]),
                        SLACK_BYTES);
      if (digits > 0 && len > limit) {
        snprintf(why, whysize,
                 "a %" PRIu64 "-byte value where at most %" PRIu64
                 " fit: refused unread",
                 len, limit);
        return item != SIZE_MAX ? XR_TOOBIG : XR_FAIL;
      }
      return XR_OK; /* its body is coming, within bounds */
    }
  }
  if (buffered > LINE_MAX_BYTES) {
    snprintf(why, whysize, "a reply line longer than %u bytes", LINE_MAX_BYTES);
    return XR_FAIL;
  }
  return XR_OK;
}

/* Receives n bytes into dst before the deadline, each piece fed to st as
 * it lands (NULL: none).  Returns 0, or XR_FAIL (why set). */
static int recv_into(int fd, unsigned char *dst, size_t n, sum_state *st,
                     xtime deadline, uint64_t *received, char *why,
                     size_t whysize) {
  while (n > 0) {
    ssize_t r = recv(fd, dst, n, MSG_DONTWAIT);
    if (r > 0) {
      if (st != NULL)
        encache__shm_sum_update(st, dst, (size_t)r);
      dst += r, n -= (size_t)r, *received += (uint64_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
        wait_fd(fd, POLLIN, deadline) == 0)
      continue;
    snprintf(why, whysize, "%s", r == 0 ? "connection closed by the server "
                                          "mid-reply"
                                 : errno == ETIMEDOUT ? "timed out mid-reply"
                                                      : strerror(errno));
    return XR_FAIL;
  }
  return 0;
}

/* Moves up to n bytes of the reader's buffer to dst (fed to st); returns
 * how many. */
static size_t take_buffered(redisReader *rd, unsigned char *dst, size_t n,
                            sum_state *st) {
  size_t m = rd->len - rd->pos < n ? rd->len - rd->pos : n;
  encache__shm_copy_sum(dst, (const unsigned char *)rd->buf + rd->pos, m, st);
  rd->pos += m;
  return m;
}

/*
 * A direct pipe's string reply (rpipe.direct), received into its item's
 * buffers without the hiredis reader: once the reader has taken the '$'
 * of a top-level bulk string whose length line is buffered and whose
 * value fits, the bytes already buffered are moved to their place and
 * the rest is received straight into it by recv(), fed to a sum as it
 * lands (while it is in cache); the reader is left as after a whole
 * reply.  A window is fed to its item's sum (sum_of()); a whole value
 * (the pipe has seeds: a GET) that carries a check is fed to a sum of its
 * own, its object alone received into place and its check into a buffer
 * here, then verified, as encache__redis_check_value() does on the
 * reader's path.  Anything else (a nil, a value that does not fit, a
 * line or header not buffered yet, an item without a buffer) goes
 * through the reader.  Returns 1 when a reply was taken, 0 when not, or
 * XR_FAIL.
 */
static int recv_direct(redisContext *c, rpipe *p, xtime deadline,
                       uint64_t *received, char *why, size_t whysize) {
  redisReader *rd = c->reader;
  if (rd->ridx != 0 || rd->rstack[0].type != REDIS_REPLY_STRING ||
      p->next >= p->cap || p->bufs == NULL || p->item == NULL ||
      p->item[p->next] == SIZE_MAX)
    return 0;
  size_t item = p->item[p->next], buffered = rd->len - rd->pos;
  const char *h = rd->buf + rd->pos, *cr = memchr(h, '\r', buffered);
  uint64_t len = 0;
  int digits = 0;
  for (const char *d = h; cr != NULL && d < cr; d++, digits++)
    if (*d < '0' || *d > '9' || digits >= 19)
      return 0;
    else
      len = len * 10 + (uint64_t)(*d - '0');
  if (cr == NULL || cr + 1 >= h + buffered || cr[1] != '\n' || digits == 0 ||
      (digits > 1 && h[0] == '0')) /* the reader refuses those */
    return 0;
  /* A whole value's check, and a first window's sum (sum_of), are decided
   * by the value's header: it must be buffered. */
  int whole = p->seeds != NULL;
  int first = !whole && p->sums != NULL && p->sums[item] != NULL &&
              p->vlens != NULL && p->vlens[item] != 0;
  size_t split = split_of(p, item);
  size_t line = (size_t)(cr + 2 - h);
  size_t hb = len < ENCACHE_HEADER_SIZE ? (size_t)len : ENCACHE_HEADER_SIZE;
  if (line + (whole || first ? hb : 0) > buffered)
    return 0;
  uint64_t obj =
      whole ? encache__redis_check_objlen((const unsigned char *)h + line, hb,
                                          len)
            : len;
  if (obj > sat_add(split, p->caps[item]))
    return 0;
  rd->pos += line;
  rreply *r = &p->replies[p->next++];
  memset(r, 0, sizeof(*r));
  r->type = REDIS_REPLY_STRING;
  r->len = (int64_t)obj;
  sum_state own = {0}, *st;
  if (whole)
    st = obj != len ? &own : NULL;
  else
    st = sum_of(p, item, r, rd->buf + rd->pos, (size_t)len);
  size_t hn = obj < split ? (size_t)obj : split;
  unsigned char tail[CHECK_BYTES], crlf[2];
  unsigned char *part[4] = {p->heads[item], p->bufs[item], tail, crlf};
  size_t plen[4] = {hn, (size_t)obj - hn, (size_t)(len - obj), 2};
  for (int k = 0; k < 4; k++) {
    sum_state *sk = k < 2 ? st : NULL;
    size_t m = take_buffered(rd, part[k], plen[k], sk);
    if (recv_into(c->fd, part[k] + m, plen[k] - m, sk, deadline, received,
                  why, whysize) != 0)
      return XR_FAIL;
  }
  if (crlf[0] != '\r' || crlf[1] != '\n') {
    snprintf(why, whysize, "protocol error: a value not ended by CRLF");
    return XR_FAIL;
  }
  if (whole && obj != len)
    r->check = encache__redis_check_holds(
                   tail, encache__redis_check_digest(&own, p->seeds[item]))
                   ? CHECK_OK
                   : CHECK_BAD;
  rd->ridx = -1; /* as after a whole reply: the next one starts afresh */
  return 1;
}

/* Sends what a stream's more() appended since the last call: 0, or
 * ENCACHE_ENOMEM or ENCACHE_EUNAVAIL with why set. */
static int send_more(int fd, rpipe *p, xtime deadline, char *why,
                     size_t whysize) {
  if (p->out->oom) {
    snprintf(why, whysize, "out of memory");
    return ENCACHE_ENOMEM;
  }
  if (p->out_sent == p->out->len)
    return 0;
  struct iovec iov = {p->out->p + p->out_sent, p->out->len - p->out_sent};
  p->out_sent = p->out->len;
  if (send_all(fd, &iov, 1, deadline) == 0)
    return 0;
  snprintf(why, whysize, "%s",
           errno == ETIMEDOUT ? "timed out sending" : strerror(errno));
  return ENCACHE_EUNAVAIL;
}

/* Reads nrep replies (ordinary ones into out when out is not NULL) before
 * the deadline.  A stream's more() is called after each reply, and what
 * it appends is sent. */
static int recv_replies(redisContext *c, rpipe *p, void **out,
                        size_t nrep, xtime deadline, char *why,
                        size_t whysize) {
  redisReader *rd = c->reader;
  char chunk[16384];
  uint64_t received = 0;
  for (size_t got = 0; got < nrep;) {
    void *reply = NULL;
    if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
      snprintf(why, whysize, "protocol error: %s",
               p->bad ? p->bad : rd->errstr);
      return XR_FAIL;
    }
    int d = 0;
    if (reply != NULL) {
      if (out != NULL)
        out[got] = reply;
      d = 1;
    } else if (p != NULL && p->direct && out == NULL) {
      d = recv_direct(c, p, deadline, &received, why, whysize);
    }
    if (d == 1) {
      got++;
      if (p != NULL && p->more != NULL) {
        nrep = p->more(p);
        if (send_more(c->fd, p, deadline, why, whysize) != 0)
          return XR_FAIL;
      }
      continue;
    }
    if (d != 0)
      return d;
    int b = check_bounds(rd, p, out != NULL, why, whysize);
    if (b != XR_OK)
      return b;
    ssize_t r = recv(c->fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (r > 0) {
      received += (uint64_t)r;
      if (out != NULL && received > PLAIN_TOTAL_MAX) {
        snprintf(why, whysize, "replies longer than %u bytes", PLAIN_TOTAL_MAX);
        return XR_FAIL;
      }
      if (redisReaderFeed(rd, chunk, (size_t)r) != REDIS_OK) {
        snprintf(why, whysize, "out of memory");
        return XR_FAIL;
      }
      continue;
    }
    if (r == 0) {
      snprintf(why, whysize, "connection closed by the server%s",
               received ? " mid-reply" : "");
      return received ? XR_FAIL : XR_STALE;
    }
    if (errno == EINTR)
      continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) &&
        wait_fd(c->fd, POLLIN, deadline) == 0)
      continue;
    int e = errno;
    if (e == ETIMEDOUT)
      snprintf(why, whysize, "timed out (%" PRIu64 " bytes of reply in time)",
               received);
    else
      snprintf(why, whysize, "%s", strerror(e));
    return received == 0 && (e == ECONNRESET || e == EPIPE) ? XR_STALE
                                                            : XR_FAIL;
  }
  return XR_OK;
}

/* Sends iov (modified) on c and reads nrep replies: ours into p, or
 * ordinary ones into out (NULLs on failure); a stream's (p->more) come
 * from more() instead.  Returns an XR_ code; why says what failed. */
int encache__redis_exchange(redisContext *c, struct iovec *iov, int cnt,
                            size_t nrep, rpipe *p, void **out, xtime deadline,
                            char *why, size_t whysize) {
  int x;
  struct iovec first;
  if (p != NULL && p->more != NULL) { /* a stream: its first commands */
    p->out_sent = 0;
    p->restart = 1;
    nrep = p->more(p);
    p->restart = 0;
    if (p->out->oom) {
      snprintf(why, whysize, "out of memory");
      return XR_FAIL;
    }
    first.iov_base = p->out->p;
    first.iov_len = p->out->len;
    iov = &first;
    cnt = 1;
    p->out_sent = p->out->len;
  }
  if (send_all(c->fd, iov, cnt, deadline) < 0) {
    int e = errno;
    snprintf(why, whysize, "%s",
             e == ETIMEDOUT ? "timed out sending" : strerror(e));
    x = e == EPIPE || e == ECONNRESET ? XR_STALE : XR_FAIL;
  } else {
    c->reader->privdata = p;
    x = recv_replies(c, p, out, nrep, deadline, why, whysize);
    c->reader->privdata = NULL;
    size_t extra = c->reader->len - c->reader->pos;
    if (x == XR_OK && extra > 0) {
      /* Bytes after the last reply answer nothing we asked: the next
       * exchange on this connection would take them for its replies,
       * and the replies before them may be as misplaced.  None is
       * taken (p->next: 0), the exchange fails, the connection goes. */
      snprintf(why, whysize,
               "protocol error: %zu bytes after the last reply asked", extra);
      x = XR_FAIL;
      if (p != NULL)
        p->next = 0;
    }
  }
  for (size_t k = 0; x != XR_OK && out != NULL && k < nrep; k++)
    if (out[k] != NULL) {
      freeReplyObject(out[k]);
      out[k] = NULL;
    }
  return x;
}

void encache__redis_put(obuf *b, const void *d, size_t n) {
  if (b->oom)
    return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n && cap < SIZE_MAX / 2)
      cap *= 2;
    char *np = cap - b->len < n ? NULL : encache__realloc(b->p, cap);
    if (np == NULL) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}

/* Appends a command; lens NULL = C strings. */
void encache__redis_cmd(obuf *b, int argc, const char *const *argv,
                        const size_t *lens) {
  char num[32];
  encache__redis_put(b, num, (size_t)snprintf(num, sizeof(num), "*%d\r\n", argc));
  for (int i = 0; i < argc; i++) {
    size_t n = lens ? lens[i] : strlen(argv[i]);
    encache__redis_put(b, num, (size_t)snprintf(num, sizeof(num), "$%zu\r\n", n));
    encache__redis_put(b, argv[i], n);
    encache__redis_put(b, "\r\n", 2);
  }
}
