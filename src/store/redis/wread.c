/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wread.c: windowed reads of large objects (see redis.h, "Windows").
 *
 * The first exchange asks EXISTS, STRLEN and the first window (at least
 * the split, so that the header lands in its own buffer); an object that
 * fits in it was read by one GETRANGE, atomically.  The other windows go
 * window_depth per exchange, each window received straight into its
 * place in the caller's buffer (io.c, recv_direct).
 *
 * Consistency (issue 30).  The first window says, with STRLEN, whether
 * the value carries a check (check.c).  When it does, the windows cover
 * the object only, each fed to the digest as it lands, the first one once
 * it is known to be an object's, and the check is read by its own
 * GETRANGE in the last exchange (or with the first window, when that was
 * all of the value): the check covers every byte of the object and its
 * key, so windows of two objects, or a value replaced by another of any
 * length or format, fail it (a miss), and nothing else is asked: one
 * exchange per window_depth windows, nothing read twice.  A value without
 * a check (an older writer's, or checksum=off: the upgrade) has no such
 * guard, so it keeps the older one: each exchange ends with STRLEN, and
 * the last one also reads the head of the object and the tails of up to
 * CHECK_TAILS windows again.  Objects are never changed in place, only
 * deleted and written again, so a difference in any of them means that
 * the windows may come from two objects: the key is a miss.
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
} wread;

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
  sum_state *hash; /* items [0, nhashed) are summed into it (NULL: none) */
  size_t nhashed;
  size_t len_reply; /* rpipe's */
  int direct;       /* rpipe's */
} wpipe;

/* Appends "VERB key [a b]" (ASKING first when asked); its string reply
 * goes to dst (cap bytes; NULL: none). */
static void wcmd(wread *w, wpipe *p, const char *verb, uint64_t a, uint64_t b,
                 void *dst, size_t cap) {
  char sa[24], sb[24];
  snprintf(sa, sizeof(sa), "%" PRIu64, a);
  snprintf(sb, sizeof(sb), "%" PRIu64, b);
  const char *argv[4] = {verb, w->key, sa, sb};
  if (w->ask) {
    const char *asking[1] = {"ASKING"};
    encache__redis_cmd(&p->o, 1, asking, NULL);
    p->asking[p->nrep] = 1;
    p->item_of[p->nrep++] = SIZE_MAX;
  }
  encache__redis_cmd(&p->o, strcmp(verb, "GETRANGE") == 0 ? 4 : 2, argv, NULL);
  size_t item = SIZE_MAX;
  if (dst != NULL) {
    item = p->nitems++;
    p->heads[item] = dst;
    p->bufs[item] = dst;
    p->caps[item] = cap;
  }
  p->item_of[p->nrep++] = item;
}

/* Runs p on w's node; compacts the replies (ASKING's dropped) into
 * p->r[0..*n).  Returns 0, WX_REDIRECTED (w->node and w->ask updated),
 * or ENCACHE_EUNAVAIL (why set). */
static int wrun(wread *w, wpipe *p, size_t split, uint64_t bytes, size_t *n) {
  rpipe rp = {p->r,    0,          p->nrep,      p->item_of, split,
              p->heads, p->bufs,    p->caps,      NULL,       NULL,
              p->hash,  p->nhashed, p->len_reply, p->direct};
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
    if (is_redirect(&p->r[k])) {
      w->node = encache__redis_redirect(w->s, p->r[k].text, &w->ask);
      return WX_REDIRECTED;
    }
    if (p->r[k].type == REDIS_REPLY_ERROR) {
      snprintf(w->why, w->whysize, "GETRANGE %s: %s", w->key, p->r[k].text);
      return ENCACHE_EUNAVAIL;
    }
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

/* EXISTS, STRLEN and the first window.  Returns 1 when more windows
 * follow, 0 when the object was read whole, or a code. */
static int wfirst(wread *w) {
  wpipe p = {0};
  uint64_t whole = sat_add(w->split, w->cap);
  uint64_t first = w->s->window > w->split ? w->s->window : w->split;
  w->first = first < whole ? first : whole;
  if (w->first == 0)
    w->first = 1;
  wcmd(w, &p, "EXISTS", 0, 0, NULL, 0);
  wcmd(w, &p, "STRLEN", 0, 0, NULL, 0);
  p.len_reply = p.nrep; /* 1 + STRLEN's: the window is summed as it is
                           copied when it is a checked object's */
  memset(&w->hash, 0, sizeof(w->hash));
  p.hash = &w->hash;
  p.direct = 1;
  wcmd(w, &p, "GETRANGE", 0, w->first - 1, w->head, w->cap);
  p.bufs[0] = w->buf;
  size_t n;
  int rc = wrun(w, &p, w->split, w->first, &n);
  if (rc != 0)
    return rc;
  if (n != 3 || p.r[0].type != REDIS_REPLY_INTEGER ||
      p.r[1].type != REDIS_REPLY_INTEGER ||
      p.r[2].type != REDIS_REPLY_STRING) {
    snprintf(w->why, w->whysize, "GETRANGE %s: unexpected answers", w->key);
    return ENCACHE_EUNAVAIL;
  }
  if (p.r[0].integer == 0)
    return ENCACHE_ENOENT;
  w->len = (uint64_t)p.r[1].integer;
  if (w->len == 0) {
    /* Empty, or gone between EXISTS and STRLEN: one GET says which. */
    wpipe *q = &p; /* reused: a second wpipe would double the ~40 KB frame */
    memset(q, 0, sizeof(*q));
    char none[1];
    wcmd(w, q, "GET", 0, 0, none, 0);
    if ((rc = wrun(w, q, 0, 0, &n)) != 0)
      return rc;
    if (n != 1 || q->r[0].type == REDIS_REPLY_NIL)
      return ENCACHE_ENOENT;
    return q->r[0].type == REDIS_REPLY_STRING && q->r[0].len == 0
               ? 0
               : changed(w, "length");
  }
  uint64_t want = w->len < w->first ? w->len : w->first;
  if (p.r[2].too_large || (uint64_t)p.r[2].len != want)
    return changed(w, "first window");
  return wformat(w, want, p.r[2].check == CHECK_SUMMED);
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

/* The verdict on the last exchange of an unchecked value (replies from
 * index at on): the check's re-reads.  Returns 0 or a code. */
static int wlast(wread *w, const wpipe *p, size_t at, size_t n,
                 const char *chk, uint64_t nwin) {
  if (!w->checked)
    return wcompare(w, p, at, n, chk, nwin);
  if (at >= n || p->r[at].too_large || p->r[at].len != CHECK_BYTES)
    return changed(w, "check");
  return 0;
}

/*
 * The windows after the first, window_depth per exchange, straight into
 * their places.  A checked value's windows are fed to the digest as they
 * arrive and its last exchange reads the check: nothing else, since
 * windows of two objects fail it.  An unchecked value (an older writer's,
 * or checksum=off) has no such guard: each exchange ends with STRLEN and
 * the last one reads the head and the tails again.  Returns 0 or a code.
 */
static int wrest(wread *w) {
  uint64_t win = w->s->window, depth = w->s->window_depth;
  uint64_t nwin =
      1 + (w->objend > w->first ? (w->objend - w->first + win - 1) / win : 0);
  char chk[CHECK_HEAD + CHECK_TAILS * CHECK_TAIL];
  for (uint64_t k = 1;;) {
    if (encache__redis_window_hook != NULL)
      encache__redis_window_hook(w->key, wend(w, k - 1));
    wpipe p = {0};
    uint64_t bytes = 0, k0 = k;
    for (; k < nwin && k - k0 < depth; k++) {
      uint64_t a = wend(w, k - 1), e = wend(w, k);
      wcmd(w, &p, "GETRANGE", a, e - 1, w->buf + (a - w->split), e - a);
      bytes += e - a;
    }
    size_t nw = (size_t)(k - k0), at = nw + (size_t)!w->checked;
    p.hash = w->checked ? &w->hash : NULL;
    p.nhashed = nw;
    p.direct = 1;
    if (!w->checked)
      wcmd(w, &p, "STRLEN", 0, 0, NULL, 0);
    if (k == nwin && w->checked)
      wcmd(w, &p, "GETRANGE", w->objend, w->len - 1, w->ck, CHECK_BYTES);
    if (k == nwin && !w->checked)
      wchecks(w, &p, chk, nwin);
    size_t n;
    int rc = wrun(w, &p, 0, bytes, &n);
    if (rc != 0)
      return rc;
    for (size_t j = 0; j < nw; j++)
      if (j >= n || p.r[j].too_large ||
          (uint64_t)p.r[j].len != wend(w, k0 + j) - wend(w, k0 + j - 1))
        return changed(w, "short window");
    if (!w->checked && (nw >= n || p.r[nw].type != REDIS_REPLY_INTEGER ||
                        (uint64_t)p.r[nw].integer != w->len))
      return changed(w, "length");
    if (k == nwin)
      return wlast(w, &p, at, n, chk, nwin);
  }
}

int64_t encache__redis_wread(redis_store *s, rset *set, const char *key,
                             size_t split, void *head, void *buf, size_t cap,
                             char *why, size_t whysize) {
  wread w = {.s = s, .set = set, .key = key, .split = split, .cap = cap,
             .head = head, .buf = buf, .why = why, .whysize = whysize,
             .seed = encache__redis_check_seed(key)};
  w.node = encache__redis_locate(s, key);
  int rc = ENCACHE_EUNAVAIL;
  why[0] = '\0';
  if (w.node >= MAX_NODES)
    snprintf(why, whysize, "no node serves the slot of %s", key);
  for (int round = 0; round < ROUNDS && w.node < MAX_NODES; round++) {
    w.checked = 0;
    rc = wfirst(&w);
    if (rc == 1)
      rc = wrest(&w);
    if (rc == 0)
      rc = wverdict(&w);
    if (rc != WX_REDIRECTED)
      return rc < 0 ? rc : (int64_t)(w.checked ? w.objend : w.len);
    rc = ENCACHE_EUNAVAIL;
    snprintf(why, whysize, "%s: still redirected after %d rounds", key,
             ROUNDS);
  }
  return rc;
}
