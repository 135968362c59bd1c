/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wread.c: windowed reads of large objects (see redis.h, "Windows").
 *
 * The windowed keys of a batch on one node are read as one stream
 * (docs/performance.md, "One stream per node"): the commands of the keys
 * go on one connection, sent as the replies come in (io.c, rpipe.more),
 * so that window_depth windows are in flight at every moment, across the
 * end of one object and the start of the next, with no round trip
 * between them.  A key asks EXISTS, STRLEN
 * and its first window (at least the split, so that the header lands in
 * its own buffer); an object that fits in it was read by one GETRANGE,
 * atomically.  While that first window is on its way the stream starts
 * the next keys; once it is in, the key's other windows follow, each
 * received straight into its place in the caller's buffer (io.c,
 * recv_direct).
 *
 * Consistency.  The first window says, with STRLEN, whether the value
 * carries a check (check.c).  When it does, the windows cover the object
 * only, each fed to the key's digest as it lands (the first one once it is
 * known to be an object's), and the check is read by its own GETRANGE
 * after the last window (or with the first window, when that was all of
 * the value): the check covers every byte of the object and its key, so
 * windows of two objects, or a value replaced by another of any length or
 * format, fail it (a miss), and nothing else is asked, nothing read twice.
 * A value without a check (an older writer's, or checksum=off: the
 * upgrade) has no such guard, so it leaves the stream after its first
 * window and keeps the older guard: its other windows go window_depth per
 * exchange, each exchange ends with STRLEN, and the last one also reads the
 * head of the object and the tails of up to CHECK_TAILS windows again.
 * Objects are never changed in place, only deleted and written again, so
 * a difference in any of them means that the windows may come from two
 * objects: the key is a miss.  A key redirected (Redis Cluster) is read
 * again on the node named, in a stream of its own.
 *
 * (About 800 lines, on purpose: a key's windows, its verdicts and the
 * older guard, and the stream that reads a node's keys share the private
 * wread state and are one mechanism; the fuzzer (fuzz_wread) drives it
 * whole through encache__redis_wread().)
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>

#define CHECK_HEAD 256 /* bytes of the head read again at the end */
#define CHECK_TAIL 16  /* bytes at the end of a window read again */
#define CHECK_TAILS 64 /* windows whose tails are read again */
#define WX_REDIRECTED 100

void (*encache__redis_window_hook)(const char *key, uint64_t done);

typedef struct wread {
  redis_store *s;
  rset *set;
  const char *key;
  size_t split, cap;
  char *head, *buf;
  uint64_t len;    /* STRLEN at the start: the value's length */
  uint64_t objend; /* the object's: len, or len - CHECK_BYTES (checked) */
  uint64_t first;  /* bytes of the first window */
  int checked;     /* the value carries a check */
  uint64_t seed;   /* the seed of the key's check */
  sum_state hash;  /* checked: the sum of the object's bytes read so far */
  unsigned char ck[CHECK_BYTES]; /* checked: the value's check */
  size_t node;
  int ask;
  char *why;
  size_t whysize;
  /* In a stream (below). */
  int state;        /* WS_* */
  int follow;       /* WF_*: what is left once the stream is over */
  uint64_t nwin;    /* windows of the object, the first included */
  uint64_t asked;   /* windows asked, the first included */
  uint64_t got;     /* windows in */
  int64_t result;   /* WS_DONE: the length, or a code */
  int rounds;       /* streams it was read in */
  char whybuf[256];
} wread;

enum { WS_NEW, WS_FIRST, WS_WINDOWS, WS_DONE };
enum { WF_NONE, WF_LEGACY, WF_EMPTY, WF_REDIRECT };

/* Appends "VERB key [a b]" to o. */
static void put_cmd(obuf *o, const char *verb, const char *key, uint64_t a,
                    uint64_t b) {
  char sa[24], sb[24];
  snprintf(sa, sizeof(sa), "%" PRIu64, a);
  snprintf(sb, sizeof(sb), "%" PRIu64, b);
  const char *argv[4] = {verb, key, sa, sb};
  encache__redis_cmd(o, strcmp(verb, "GETRANGE") == 0 ? 4 : 2, argv, NULL);
}

static void put_asking(obuf *o) {
  const char *asking[1] = {"ASKING"};
  encache__redis_cmd(o, 1, asking, NULL);
}

/* The pipeline of one exchange: text commands, where each string reply
 * goes (item k: bufs[k], caps[k]; the pipe's split applies to item 0). */
typedef struct wpipe {
  obuf o;
  size_t nrep;
  size_t item_of[2 * (WINDOW_DEPTH_MAX + CHECK_TAILS + 4)];
  unsigned char asking[2 * (WINDOW_DEPTH_MAX + CHECK_TAILS + 4)];
  rreply r[2 * (WINDOW_DEPTH_MAX + CHECK_TAILS + 4)];
  void *heads[WINDOW_DEPTH_MAX + CHECK_TAILS + 4];
  void *bufs[WINDOW_DEPTH_MAX + CHECK_TAILS + 4];
  size_t caps[WINDOW_DEPTH_MAX + CHECK_TAILS + 4];
  size_t nitems;
} wpipe;

/* Appends "VERB key [a b]" (ASKING first when asked); its string reply
 * goes to dst (cap bytes; NULL: none). */
static void wcmd(wread *w, wpipe *p, const char *verb, uint64_t a, uint64_t b,
                 void *dst, size_t cap) {
  if (w->ask) {
    put_asking(&p->o);
    p->asking[p->nrep] = 1;
    p->item_of[p->nrep++] = SIZE_MAX;
  }
  put_cmd(&p->o, verb, w->key, a, b);
  size_t item = SIZE_MAX;
  if (dst != NULL) {
    item = p->nitems++;
    p->heads[item] = dst;
    p->bufs[item] = dst;
    p->caps[item] = cap;
  }
  p->item_of[p->nrep++] = item;
}

/* The verdict on the replies of one exchange or stream: 0, WX_REDIRECTED
 * (w->node and w->ask updated) or ENCACHE_EUNAVAIL (why set) for r, one
 * reply of w's. */
static int wanswer(wread *w, const rreply *r) {
  if (is_redirect(r)) {
    w->node = encache__redis_redirect(w->s, r->text, &w->ask);
    if (w->node < MAX_NODES)
      return WX_REDIRECTED;
    snprintf(w->why, w->whysize, "GETRANGE %s: a redirection not followed "
             "(%s)%s", w->key, r->text,
             w->s->cluster ? "" : ": a cluster's node, for a single-node URL");
    return ENCACHE_EUNAVAIL;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    snprintf(w->why, w->whysize, "GETRANGE %s: %s", w->key, r->text);
    return ENCACHE_EUNAVAIL;
  }
  return 0;
}

/* Runs p on w's node; compacts the replies (ASKING's dropped) into
 * p->r[0..*n).  Returns 0, WX_REDIRECTED (w->node and w->ask updated),
 * or ENCACHE_EUNAVAIL (why set). */
static int wrun(wread *w, wpipe *p, size_t split, uint64_t bytes, size_t *n) {
  rpipe rp = {.replies = p->r, .cap = p->nrep, .item = p->item_of,
              .split = split, .heads = p->heads, .bufs = p->bufs,
              .caps = p->caps, .direct = 1};
  struct iovec iov = {p->o.p, p->o.len};
  char xwhy[256];
  int x = p->o.oom ? XR_FAIL
                   : encache__redis_run_on(w->s, w->set, w->node, &iov, 1,
                                           p->nrep, &rp,
                                           encache__redis_deadline(w->s, bytes),
                                           xwhy, sizeof(xwhy));
  encache__free(p->o.p);
  p->o.p = NULL;
  if (x != XR_OK) {
    snprintf(w->why, w->whysize, "GETRANGE %s: %s", w->key,
             p->o.oom ? "out of memory" : xwhy);
    return ENCACHE_EUNAVAIL;
  }
  *n = 0;
  for (size_t k = 0; k < p->nrep; k++) {
    if (p->asking[k] && p->r[k].type == REDIS_REPLY_STATUS)
      continue; /* ASKING's +OK */
    int rc = wanswer(w, &p->r[k]);
    if (rc != 0)
      return rc;
    p->r[(*n)++] = p->r[k];
  }
  return 0;
}

static int changed(wread *w, const char *what) {
  snprintf(w->why, w->whysize,
           "%s: the object changed while it was read (%s): a miss", w->key,
           what);
  return ENCACHE_ENOENT;
}

/* Copies the n bytes at offset off of the destination (head, then buf)
 * to out, or feeds them to st when out is NULL. */
static void gather(wread *w, uint64_t off, unsigned char *out, size_t n,
                   sum_state *st) {
  while (n > 0) {
    const char *src = off < w->split ? w->head + off
                                     : w->buf + (off - w->split);
    size_t k = off < w->split && w->split - off < n
                   ? (size_t)(w->split - off)
                   : n;
    if (out != NULL) {
      memcpy(out, src, k);
      out += k;
    } else {
      encache__shm_sum_update(st, (const unsigned char *)src, k);
    }
    off += k, n -= k;
  }
}

/* After the first window (got bytes of the value, already summed when
 * summed): whether the value carries a check (check.c), the object's end,
 * too large or not; when checked, the sum of what the first window holds
 * of the object, and the check itself when the window held all of the
 * value.  Returns 1 when more windows follow, 0 when the value was read
 * whole, or a code. */
static int wformat(wread *w, uint64_t got, int summed) {
  unsigned char h[ENCACHE_HEADER_SIZE];
  size_t hn = got < sizeof(h) ? (size_t)got : sizeof(h);
  gather(w, 0, h, hn, NULL);
  w->objend = encache__redis_check_objlen(h, hn, w->len);
  w->checked = w->objend != w->len;
  uint64_t whole = sat_add(w->split, w->cap);
  if (w->objend > whole) {
    snprintf(w->why, w->whysize, "%s: %" PRIu64 " bytes where %" PRIu64
             " fit", w->key, w->objend, whole);
    return ENCACHE_ETOOLARGE;
  }
  if (w->checked && !summed) { /* the window ran into the check */
    memset(&w->hash, 0, sizeof(w->hash));
    gather(w, 0, NULL, (size_t)(got < w->objend ? got : w->objend), &w->hash);
  }
  if (w->checked) {
    if (w->len <= w->first) /* all of it: the check is in the buffers */
      gather(w, w->objend, w->ck, CHECK_BYTES, NULL);
  }
  return w->len > w->first;
}

/* The verdict on a value read whole: a miss when its check fails, or
 * when it has none and the handle requires one; else 0. */
static int wverdict(wread *w) {
  if (w->checked &&
      !encache__redis_check_holds(
          w->ck, encache__redis_check_digest(&w->hash, w->seed))) {
    snprintf(w->why, w->whysize,
             "%s: the object fails its check (damaged, or copied from "
             "another key): a miss",
             w->key);
    return ENCACHE_ENOENT;
  }
  if (!w->checked && w->s->checksum == CHECKSUM_REQUIRED) {
    snprintf(w->why, w->whysize,
             "%s: the object has no check (checksum=required): a miss",
             w->key);
    return ENCACHE_ENOENT;
  }
  return 0;
}

/* A key whose STRLEN said 0: empty, or gone between EXISTS and STRLEN;
 * one GET says which.  Returns 0 (empty), a code, or WX_REDIRECTED. */
static int wempty(wread *w) {
  wpipe *q = encache__calloc(1, sizeof(*q)); /* ~40 KB: not on the stack */
  if (q == NULL) {
    snprintf(w->why, w->whysize, "GET %s: out of memory", w->key);
    return ENCACHE_EUNAVAIL;
  }
  char none[1];
  size_t n;
  wcmd(w, q, "GET", 0, 0, none, 0);
  int rc = wrun(w, q, 0, 0, &n);
  if (rc == 0)
    rc = n != 1 || q->r[0].type == REDIS_REPLY_NIL ? ENCACHE_ENOENT
         : q->r[0].type == REDIS_REPLY_STRING && q->r[0].len == 0
             ? 0
             : changed(w, "length");
  encache__free(q);
  return rc;
}

/* Whether the n bytes at offset off of the destination equal q. */
static int same(const wread *w, uint64_t off, const char *q, size_t n) {
  if (off < w->split) {
    size_t h = w->split - off < n ? (size_t)(w->split - off) : n;
    if (memcmp(w->head + off, q, h) != 0)
      return 0;
    off += h, q += h, n -= h;
  }
  return n == 0 || memcmp(w->buf + (off - w->split), q, n) == 0;
}

/* The end of window k (k = 0: the first window) of the object. */
static uint64_t wend(const wread *w, uint64_t k) {
  uint64_t e = w->first + k * w->s->window;
  return e < w->objend ? e : w->objend;
}

/* The windows of the object, the first included. */
static uint64_t wcount(const wread *w) {
  uint64_t win = w->s->window;
  return 1 + (w->objend > w->first ? (w->objend - w->first + win - 1) / win
                                   : 0);
}

/* Appends the final checks to p: STRLEN is already there; the head and
 * the tails of up to CHECK_TAILS windows, into chk. */
static void wchecks(wread *w, wpipe *p, char *chk, uint64_t nwin) {
  size_t head = w->objend < CHECK_HEAD ? (size_t)w->objend : CHECK_HEAD;
  wcmd(w, p, "GETRANGE", 0, head - 1, chk, head);
  uint64_t step = nwin > CHECK_TAILS ? (nwin + CHECK_TAILS - 1) / CHECK_TAILS
                                     : 1;
  for (uint64_t k = 0, t = 0; k < nwin; k += step, t++) {
    uint64_t e = wend(w, k);
    wcmd(w, p, "GETRANGE", e - CHECK_TAIL, e - 1,
         chk + CHECK_HEAD + t * CHECK_TAIL, CHECK_TAIL);
  }
}

/* Compares the final checks (replies from index at) with what was read. */
static int wcompare(wread *w, const wpipe *p, size_t at, size_t n,
                    const char *chk, uint64_t nwin) {
  size_t head = w->objend < CHECK_HEAD ? (size_t)w->objend : CHECK_HEAD;
  if (at >= n || p->r[at].len != (int64_t)head || p->r[at].too_large ||
      !same(w, 0, chk, head))
    return changed(w, "head");
  uint64_t step = nwin > CHECK_TAILS ? (nwin + CHECK_TAILS - 1) / CHECK_TAILS
                                     : 1;
  for (uint64_t k = 0, t = 0; k < nwin; k += step, t++) {
    const rreply *r = &p->r[at + 1 + t];
    if (at + 1 + t >= n || r->len != CHECK_TAIL || r->too_large ||
        !same(w, wend(w, k) - CHECK_TAIL, chk + CHECK_HEAD + t * CHECK_TAIL,
              CHECK_TAIL))
      return changed(w, "window tail");
  }
  return 0;
}

/*
 * The windows after the first of a value without a check (an older
 * writer's, or checksum=off), window_depth per exchange, straight into
 * their places: each exchange ends with STRLEN and the last one reads the
 * head and the tails again.  Returns 0 or a code.
 */
static int wlegacy(wread *w) {
  uint64_t depth = w->s->window_depth, nwin = wcount(w);
  char chk[CHECK_HEAD + CHECK_TAILS * CHECK_TAIL];
  wpipe *p = encache__malloc(sizeof(*p)); /* ~40 KB: not on the stack */
  if (p == NULL) {
    snprintf(w->why, w->whysize, "GETRANGE %s: out of memory", w->key);
    return ENCACHE_EUNAVAIL;
  }
  int rc = 0;
  for (uint64_t k = 1; rc == 0;) {
    if (encache__redis_window_hook != NULL)
      encache__redis_window_hook(w->key, wend(w, k - 1));
    memset(p, 0, sizeof(*p));
    uint64_t bytes = 0, k0 = k;
    for (; k < nwin && k - k0 < depth; k++) {
      uint64_t a = wend(w, k - 1), e = wend(w, k);
      wcmd(w, p, "GETRANGE", a, e - 1, w->buf + (a - w->split), e - a);
      bytes += e - a;
    }
    size_t nw = (size_t)(k - k0), n;
    wcmd(w, p, "STRLEN", 0, 0, NULL, 0);
    if (k == nwin)
      wchecks(w, p, chk, nwin);
    if ((rc = wrun(w, p, 0, bytes, &n)) != 0)
      break;
    for (size_t j = 0; j < nw && rc == 0; j++)
      if (j >= n || p->r[j].too_large ||
          (uint64_t)p->r[j].len != wend(w, k0 + j) - wend(w, k0 + j - 1))
        rc = changed(w, "short window");
    if (rc == 0 && (nw >= n || p->r[nw].type != REDIS_REPLY_INTEGER ||
                    (uint64_t)p->r[nw].integer != w->len))
      rc = changed(w, "length");
    if (rc == 0 && k == nwin) {
      rc = wcompare(w, p, nw + 1, n, chk, nwin);
      break;
    }
  }
  encache__free(p);
  return rc;
}

/* ---------------------------------------------------------- a stream */

/* What a reply of a stream is. */
enum { R_ASKING, R_EXISTS, R_STRLEN, R_FIRST, R_WINDOW, R_CHECK };

typedef struct wstream {
  redis_store *s;
  wread **w; /* its keys, all on one node */
  size_t n;
  size_t started; /* keys [0, started) have been asked for */
  size_t cursor;  /* no key before it has a window left to ask */
  uint64_t inflight; /* windows asked and not in */
  size_t done;       /* replies looked at */
  obuf o;
  int oom;
  uint64_t asked; /* replies asked since the start */
  /* per reply, from the first not taken (done) on */
  rreply *r;
  size_t *item_of;
  uint32_t *rkey;
  unsigned char *role;
  size_t nrep, rcap;
  /* per item, from the first whose reply is not taken on */
  void **heads, **bufs;
  size_t *caps, *splits;
  sum_state **sums;
  uint64_t *vlens;
  size_t nitems, icap;
  rpipe p;
} wstream;

/* Replies taken before the arrays are shifted down: so that a stream of
 * any length holds about what is in flight, not all it asked. */
#define STREAM_COMPACT 1024

/* Moves the n-element array *a (of size-byte elements) to one of cap:
 * 0, or ENCACHE_ENOMEM. */
static int grow(void *a, size_t cap, size_t size) {
  void **pa = a, *np = encache__realloc(*pa, cap * size);
  if (np == NULL)
    return ENCACHE_ENOMEM;
  *pa = np;
  return 0;
}

/* Room for two more replies and one more item: 0, or ENCACHE_ENOMEM. */
static int room(wstream *ws) {
  if (ws->nrep + 2 > ws->rcap) {
    size_t c = ws->rcap ? 2 * ws->rcap : 64;
    if (grow(&ws->r, c, sizeof(*ws->r)) ||
        grow(&ws->item_of, c, sizeof(*ws->item_of)) ||
        grow(&ws->rkey, c, sizeof(*ws->rkey)) ||
        grow(&ws->role, c, sizeof(*ws->role)))
      return ENCACHE_ENOMEM;
    ws->rcap = c;
  }
  if (ws->nitems + 1 > ws->icap) {
    size_t c = ws->icap ? 2 * ws->icap : 32;
    if (grow(&ws->heads, c, sizeof(*ws->heads)) ||
        grow(&ws->bufs, c, sizeof(*ws->bufs)) ||
        grow(&ws->caps, c, sizeof(*ws->caps)) ||
        grow(&ws->splits, c, sizeof(*ws->splits)) ||
        grow(&ws->sums, c, sizeof(*ws->sums)) ||
        grow(&ws->vlens, c, sizeof(*ws->vlens)))
      return ENCACHE_ENOMEM;
    ws->icap = c;
  }
  return 0;
}

/* Asks "VERB key [a b]" of key kx (ASKING first when it is asked); a
 * string reply goes to dst (len bytes; NULL: none; the first window: to
 * the key's head and buffer), fed to sum (NULL: none). */
static void sask(wstream *ws, size_t kx, int role, const char *verb,
                 uint64_t a, uint64_t b, char *dst, size_t len,
                 sum_state *sum) {
  wread *w = ws->w[kx];
  if (ws->oom || room(ws) != 0) {
    ws->oom = 1;
    return;
  }
  if (w->ask) {
    put_asking(&ws->o);
    ws->item_of[ws->nrep] = SIZE_MAX;
    ws->rkey[ws->nrep] = (uint32_t)kx;
    ws->role[ws->nrep++] = R_ASKING;
    ws->asked++;
  }
  put_cmd(&ws->o, verb, w->key, a, b);
  size_t item = SIZE_MAX;
  if (dst != NULL) {
    item = ws->nitems++;
    int first = role == R_FIRST; /* its head is the key's, split apart */
    ws->heads[item] = first ? w->head : dst;
    ws->bufs[item] = first ? w->buf : dst;
    ws->caps[item] = first ? w->cap : len;
    ws->splits[item] = first ? w->split : 0;
    ws->sums[item] = sum;
    ws->vlens[item] = 0; /* a first window's: once its STRLEN is in */
  }
  ws->item_of[ws->nrep] = item;
  ws->rkey[ws->nrep] = (uint32_t)kx;
  ws->role[ws->nrep++] = (unsigned char)role;
  ws->asked++;
}

/* Starts key kx: EXISTS, STRLEN and its first window. */
static void sstart(wstream *ws, size_t kx) {
  wread *w = ws->w[kx];
  uint64_t whole = sat_add(w->split, w->cap);
  uint64_t first = w->s->window > w->split ? w->s->window : w->split;
  w->first = first < whole ? first : whole;
  if (w->first == 0)
    w->first = 1;
  w->state = WS_FIRST;
  sask(ws, kx, R_EXISTS, "EXISTS", 0, 0, NULL, 0, NULL);
  sask(ws, kx, R_STRLEN, "STRLEN", 0, 0, NULL, 0, NULL);
  sask(ws, kx, R_FIRST, "GETRANGE", 0, w->first - 1, w->head, 0, &w->hash);
  w->asked = 1;
  ws->inflight++;
}

/* Asks what can be asked: the next windows of the keys whose first
 * window is in (the first such key first), then new keys, while fewer
 * than window_depth windows are in flight; a key's check once all of its
 * windows are asked. */
static void sfill(wstream *ws) {
  uint64_t depth = ws->s->window_depth;
  while (ws->inflight < depth && !ws->oom) {
    while (ws->cursor < ws->started &&
           (ws->w[ws->cursor]->state == WS_DONE ||
            (ws->w[ws->cursor]->state == WS_WINDOWS &&
             ws->w[ws->cursor]->asked > ws->w[ws->cursor]->nwin)))
      ws->cursor++; /* nothing left to ask of it */
    size_t kx = ws->cursor;
    while (kx < ws->started && (ws->w[kx]->state != WS_WINDOWS ||
                                ws->w[kx]->asked > ws->w[kx]->nwin))
      kx++;
    if (kx < ws->started) {
      wread *w = ws->w[kx];
      if (w->asked < w->nwin) {
        uint64_t a = wend(w, w->asked - 1), e = wend(w, w->asked);
        if (encache__redis_window_hook != NULL)
          encache__redis_window_hook(w->key, a);
        sask(ws, kx, R_WINDOW, "GETRANGE", a, e - 1,
             w->buf + (a - w->split), (size_t)(e - a), &w->hash);
        ws->inflight++;
      } else { /* all its windows asked: its check */
        sask(ws, kx, R_CHECK, "GETRANGE", w->objend, w->len - 1,
             (char *)w->ck, CHECK_BYTES, NULL);
      }
      w->asked++;
    } else if (ws->started < ws->n) {
      sstart(ws, ws->started++);
    } else {
      break;
    }
  }
}

static void sfinish(wread *w, int64_t result) {
  w->state = WS_DONE;
  w->result = result;
}

/* Takes a key's first window r (a string): the whole object, or the
 * first of its windows (the rest follow in the stream), or a value
 * without a check (the older guard, after the stream). */
static void stake_first(wread *w, const rreply *r) {
  uint64_t want = w->len < w->first ? w->len : w->first;
  if (r->too_large || (uint64_t)r->len != want) {
    sfinish(w, changed(w, "first window"));
    return;
  }
  w->got = 1;
  int rc = wformat(w, want, r->check == CHECK_SUMMED);
  if (rc == 1 && !w->checked) {
    w->follow = WF_LEGACY; /* the older guard, after the stream */
    sfinish(w, ENCACHE_EUNAVAIL);
  } else if (rc == 1) {
    w->nwin = wcount(w);
    w->state = WS_WINDOWS;
  } else {
    sfinish(w, rc < 0 ? rc : (rc = wverdict(w)) < 0 ? rc : (int64_t)w->objend);
  }
}

/* Takes reply j, of key kx. */
static void stake(wstream *ws, size_t j) {
  wread *w = ws->w[ws->rkey[j]];
  const rreply *r = &ws->r[j];
  int role = ws->role[j];
  if (role == R_FIRST || role == R_WINDOW)
    ws->inflight--;
  if (w->state == WS_DONE)
    return; /* decided: what is still on its way is read and left */
  if (role == R_ASKING && r->type == REDIS_REPLY_STATUS)
    return;
  int rc = wanswer(w, r);
  if (rc == WX_REDIRECTED) {
    w->follow = WF_REDIRECT;
    sfinish(w, ENCACHE_EUNAVAIL);
    return;
  }
  if (rc != 0) {
    sfinish(w, rc);
    return;
  }
  switch (role) {
  case R_EXISTS:
    if (r->type != REDIS_REPLY_INTEGER)
      break;
    if (r->integer == 0)
      sfinish(w, ENCACHE_ENOENT);
    return;
  case R_STRLEN:
    if (r->type != REDIS_REPLY_INTEGER)
      break;
    w->len = (uint64_t)r->integer;
    /* its first window, asked right after it, is summed by this length
     * (io.c, sum_of) */
    ws->vlens[ws->item_of[j + (w->ask ? 2 : 1)]] = w->len;
    if (w->len == 0) {
      w->follow = WF_EMPTY;
      sfinish(w, ENCACHE_EUNAVAIL);
    }
    return;
  case R_FIRST:
    if (r->type != REDIS_REPLY_STRING)
      break;
    stake_first(w, r);
    return;
  case R_WINDOW:
    if (r->too_large ||
        (uint64_t)r->len != wend(w, w->got) - wend(w, w->got - 1)) {
      sfinish(w, changed(w, "short window"));
      return;
    }
    w->got++;
    return;
  case R_CHECK:
    if (r->too_large || r->len != CHECK_BYTES) {
      sfinish(w, changed(w, "check"));
      return;
    }
    rc = wverdict(w);
    sfinish(w, rc < 0 ? rc : (int64_t)w->objend);
    return;
  default:
    break;
  }
  snprintf(w->why, w->whysize, "GETRANGE %s: unexpected answers", w->key);
  sfinish(w, ENCACHE_EUNAVAIL);
}

/* Drops the replies taken and the items of none to come: the arrays
 * start again at the first reply not taken (p->next with them). */
static void scompact(wstream *ws, rpipe *p) {
  size_t k = ws->done, ib = ws->nitems;
  for (size_t j = k; j < ws->nrep && ib == ws->nitems; j++)
    if (ws->item_of[j] != SIZE_MAX)
      ib = ws->item_of[j]; /* items go in the order of their replies */
  size_t nr = ws->nrep - k, ni = ws->nitems - ib;
  memmove(ws->r, ws->r + k, nr * sizeof(*ws->r));
  memmove(ws->item_of, ws->item_of + k, nr * sizeof(*ws->item_of));
  memmove(ws->rkey, ws->rkey + k, nr * sizeof(*ws->rkey));
  memmove(ws->role, ws->role + k, nr * sizeof(*ws->role));
  for (size_t j = 0; j < nr; j++)
    if (ws->item_of[j] != SIZE_MAX)
      ws->item_of[j] -= ib;
  memmove(ws->heads, ws->heads + ib, ni * sizeof(*ws->heads));
  memmove(ws->bufs, ws->bufs + ib, ni * sizeof(*ws->bufs));
  memmove(ws->caps, ws->caps + ib, ni * sizeof(*ws->caps));
  memmove(ws->splits, ws->splits + ib, ni * sizeof(*ws->splits));
  memmove(ws->sums, ws->sums + ib, ni * sizeof(*ws->sums));
  memmove(ws->vlens, ws->vlens + ib, ni * sizeof(*ws->vlens));
  ws->nrep = nr, ws->nitems = ni, ws->done = 0;
  p->next -= k;
}

/* rpipe.more: looks at the replies come in, asks what can be asked. */
static size_t smore(rpipe *p) {
  wstream *ws = p->ctx;
  if (p->restart) { /* the start, or a start again on a new connection */
    ws->o.len = 0;
    ws->nrep = ws->nitems = ws->done = ws->started = ws->cursor = 0;
    ws->inflight = ws->asked = 0;
    for (size_t k = 0; k < ws->n; k++) {
      ws->w[k]->state = WS_NEW;
      ws->w[k]->follow = WF_NONE;
      ws->w[k]->whybuf[0] = '\0'; /* a plain miss says nothing */
      ws->w[k]->checked = 0;
      memset(&ws->w[k]->hash, 0, sizeof(ws->w[k]->hash));
    }
  }
  for (; ws->done < p->next; ws->done++)
    stake(ws, ws->done);
  if (ws->done >= STREAM_COMPACT && 2 * ws->done >= ws->nrep)
    scompact(ws, p);
  if (p->out_sent == ws->o.len)
    ws->o.len = p->out_sent = 0; /* all sent: the buffer starts again */
  sfill(ws);
  if (ws->oom)
    ws->o.oom = 1; /* the exchange fails: out of memory */
  p->replies = ws->r;
  p->cap = ws->nrep;
  p->item = ws->item_of;
  p->heads = ws->heads;
  p->bufs = ws->bufs;
  p->caps = ws->caps;
  p->splits = ws->splits;
  p->sums = ws->sums;
  p->vlens = ws->vlens;
  return (size_t)ws->asked;
}

/* Reads the n keys of w, all on w[0]'s node, as one stream; every key is
 * then WS_DONE. */
static void sread(redis_store *s, rset *set, wread **w, size_t n) {
  wstream ws = {.s = s, .w = w, .n = n};
  uint64_t bytes = 0; /* the most it may move: its deadline */
  for (size_t k = 0; k < n; k++)
    bytes = sat_add(bytes, sat_add(w[k]->split, w[k]->cap));
  if (bytes > (1ull << 40))
    bytes = 1ull << 40; /* a deadline days away: idle_ms still bounds it */
  ws.p = (rpipe){.split = w[0]->split, .direct = 1, .more = smore,
                 .out = &ws.o, .ctx = &ws};
  char xwhy[256];
  struct iovec none = {NULL, 0}; /* the stream's commands come from smore */
  int x = encache__redis_run_on(s, set, w[0]->node, &none, 0, 0, &ws.p,
                                encache__redis_deadline(s, bytes), xwhy,
                                sizeof(xwhy));
  for (size_t k = 0; k < n; k++) {
    if (w[k]->state == WS_DONE)
      continue;
    snprintf(w[k]->why, w[k]->whysize, "GETRANGE %s: %s", w[k]->key,
             ws.o.oom ? "out of memory" : x == XR_OK ? "no answer" : xwhy);
    w[k]->follow = WF_NONE;
    sfinish(w[k], ENCACHE_EUNAVAIL);
  }
  encache__free(ws.o.p);
  encache__free(ws.r);
  encache__free(ws.item_of);
  encache__free(ws.rkey);
  encache__free(ws.role);
  encache__free(ws.heads);
  encache__free(ws.bufs);
  encache__free(ws.caps);
  encache__free(ws.splits);
  encache__free(ws.sums);
  encache__free(ws.vlens);
}

void encache__redis_wread(redis_store *s, rset *set, size_t n,
                          const char *const *keys, size_t split,
                          void *const *heads, void *const *bufs,
                          const size_t *caps, int64_t *results, char *why,
                          size_t whysize) {
  why[0] = '\0';
  if (n == 0)
    return;
  wread *all = encache__calloc(n, sizeof(*all));
  wread **todo = encache__calloc(n, sizeof(*todo)),
        **batch = encache__calloc(n, sizeof(*batch));
  if (all == NULL || todo == NULL || batch == NULL) {
    for (size_t i = 0; i < n; i++)
      results[i] = ENCACHE_ENOMEM;
    snprintf(why, whysize, "windowed reads: out of memory");
    goto out;
  }
  size_t ntodo = 0;
  for (size_t i = 0; i < n; i++) {
    wread *w = &all[i];
    *w = (wread){.s = s, .set = set, .key = keys[i], .split = split,
                 .cap = caps[i], .head = heads[i], .buf = bufs[i],
                 .why = w->whybuf, .whysize = sizeof(w->whybuf),
                 .seed = encache__redis_check_seed(keys[i]),
                 .node = encache__redis_locate(s, keys[i]),
                 .result = ENCACHE_EUNAVAIL};
    if (w->node >= MAX_NODES)
      snprintf(w->whybuf, sizeof(w->whybuf), "no node serves the slot of %s",
               keys[i]);
    else
      todo[ntodo++] = w;
  }
  /* A stream per node; a key redirected goes again on the node named
   * (ASKING first when it was asked), ROUNDS times at most. */
  while (ntodo > 0) {
    size_t node = todo[0]->node, nb = 0, keep = 0;
    for (size_t k = 0; k < ntodo; k++)
      if (todo[k]->node == node)
        batch[nb++] = todo[k];
      else
        todo[keep++] = todo[k];
    ntodo = keep;
    sread(s, set, batch, nb);
    for (size_t k = 0; k < nb; k++) {
      wread *w = batch[k];
      int rc = 0;
      w->rounds++;
      if (w->follow == WF_LEGACY && (rc = wlegacy(w)) == 0)
        rc = wverdict(w);
      else if (w->follow == WF_EMPTY && (rc = wempty(w)) == 0)
        rc = wverdict(w); /* no check: a miss when one is required */
      if (rc == WX_REDIRECTED)
        w->follow = WF_REDIRECT;
      else if (w->follow == WF_LEGACY || w->follow == WF_EMPTY)
        w->result = rc < 0 ? rc : (int64_t)w->len;
      if (w->follow != WF_REDIRECT)
        continue;
      w->result = ENCACHE_EUNAVAIL;
      snprintf(w->whybuf, sizeof(w->whybuf),
               "%s: still redirected after %d rounds", w->key, ROUNDS);
      if (w->rounds < ROUNDS && w->node < MAX_NODES)
        todo[ntodo++] = w; /* again, on the node named */
    }
  }
  for (size_t i = 0; i < n; i++) {
    results[i] = all[i].result;
    if (all[i].result < 0 && all[i].whybuf[0] != '\0')
      snprintf(why, whysize, "%s", all[i].whybuf); /* a plain miss: none */
    if (all[i].result > 0 && !all[i].checked) /* served, unvouched for */
      __atomic_add_fetch(&s->unchecked, 1, __ATOMIC_RELAXED);
  }
out:
  encache__free(all);
  encache__free(todo);
  encache__free(batch);
}
