/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wwrite.c: windowed writes of large objects (see redis.h, "Windows").
 *
 * The object (header, payload, and its check when it has one: check.c)
 * goes under a temporary key in the final key's slot, window
 * by window (wwindows(): SET NX PX of the first, SETRANGE of the others,
 * the last one second so that the string has its whole length at once),
 * window_depth per exchange, each exchange checking every answer and
 * renewing the expiry; wverify() checks that the temporary is still ours
 * and whole; then, in one exchange, the final expiry (ttl_s) or none,
 * RENAMENX tmp key (never replaces) and DEL tmp (which removes it when
 * RENAMENX refused); without ttl_s a PERSIST of the key follows, so a
 * writer that dies between the two leaves an object that expires, never
 * a partial one.  The final key never holds a partial object; a writer
 * that dies leaves a temporary that expires; any failure deletes it when
 * the server answers.
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <sys/random.h>
#include <unistd.h>

#define WX_REDIRECTED 100
#define WCMDS (WINDOW_DEPTH_MAX + 4)

enum { WANT_ASKING, WANT_OK, WANT_EQ, WANT_INT, WANT_POS };

typedef struct wwrite {
  redis_store *s;
  rset *set;
  const char *key;
  const char *hdr, *payload;
  const unsigned char *ck; /* the check after the payload */
  size_t hl, len, ckl;
  uint64_t total; /* hl + len + ckl */
  char *tmp;
  char ttl[24]; /* the temporary's expiry, ms */
  size_t node;
  int ask;
  char why[256];
} wwrite;

/* One exchange: text in o (segments by offset), object bytes by pointer,
 * and what each reply must be. */
typedef struct wxch {
  obuf o;
  struct {
    const char *p; /* NULL: text at o.p + off */
    size_t off, len;
  } seg[RUN_IOV_MAX];
  int nseg;
  size_t nrep;
  int kind[2 * WCMDS];
  int64_t expect[2 * WCMDS];
  rreply r[2 * WCMDS];
} wxch;

/* Text into the exchange (a segment of o, merged with the previous). */
static void wtext(wxch *x, const char *t, size_t n) {
  size_t off = x->o.len;
  encache__redis_put(&x->o, t, n);
  if (x->nseg > 0 && x->seg[x->nseg - 1].p == NULL) {
    x->seg[x->nseg - 1].len += n;
    return;
  }
  ENCACHE_ASSERT(x->nseg < RUN_IOV_MAX);
  x->seg[x->nseg].p = NULL;
  x->seg[x->nseg].off = off;
  x->seg[x->nseg++].len = n;
}

static void wbulk(wxch *x, const char *t, size_t n) {
  char num[32];
  wtext(x, num, (size_t)snprintf(num, sizeof(num), "$%zu\r\n", n));
  wtext(x, t, n);
  wtext(x, "\r\n", 2);
}

/* The bytes [a, b) of the value, as a bulk string from the caller's
 * buffers (header and payload) and the check, not copied. */
static void wdata(wwrite *w, wxch *x, uint64_t a, uint64_t b) {
  char num[32];
  wtext(x, num,
        (size_t)snprintf(num, sizeof(num), "$%" PRIu64 "\r\n", b - a));
  uint64_t pend = (uint64_t)w->hl + w->len; /* the check starts there */
  while (a < b) {
    const char *p = a < w->hl ? w->hdr + a
                    : a < pend ? w->payload + (a - w->hl)
                               : (const char *)w->ck + (a - pend);
    uint64_t end = a < w->hl ? w->hl : a < pend ? pend : b;
    if (end > b)
      end = b;
    ENCACHE_ASSERT(x->nseg < RUN_IOV_MAX);
    x->seg[x->nseg].p = p;
    x->seg[x->nseg++].len = (size_t)(end - a);
    a = end;
  }
  wtext(x, "\r\n", 2);
}

/* Starts a command of argc arguments whose reply must be `kind` (with
 * `expect`); ASKING first when asked.  The verb and the temporary key
 * follow. */
static void wcmd(wwrite *w, wxch *x, int argc, const char *verb,
                 const char *key, int kind, int64_t expect) {
  char num[32];
  if (w->ask) {
    wtext(x, "*1\r\n$6\r\nASKING\r\n", 16);
    x->kind[x->nrep++] = WANT_ASKING;
  }
  wtext(x, num, (size_t)snprintf(num, sizeof(num), "*%d\r\n", argc));
  wbulk(x, verb, strlen(verb));
  wbulk(x, key, strlen(key));
  x->kind[x->nrep] = kind;
  x->expect[x->nrep++] = expect;
}

/* Runs x on w's node and checks each reply.  Returns 0, WX_REDIRECTED
 * (w->node and w->ask updated) or ENCACHE_EUNAVAIL (why set). */
static int wrun(wwrite *w, wxch *x, uint64_t bytes) {
  struct iovec iov[RUN_IOV_MAX];
  for (int i = 0; i < x->nseg; i++) {
    iov[i].iov_base = (void *)(x->seg[i].p ? x->seg[i].p
                                           : x->o.p + x->seg[i].off);
    iov[i].iov_len = x->seg[i].len;
  }
  rpipe p = {.replies = x->r, .cap = x->nrep};
  char xwhy[200];
  int xr = x->o.oom ? XR_FAIL
                    : encache__redis_run_on(
                          w->s, w->set, w->node, iov, x->nseg, x->nrep, &p,
                          encache__redis_deadline(w->s, bytes), xwhy,
                          sizeof(xwhy));
  encache__free(x->o.p);
  x->o.p = NULL;
  if (xr != XR_OK) {
    snprintf(w->why, sizeof(w->why), "%s", x->o.oom ? "out of memory" : xwhy);
    return ENCACHE_EUNAVAIL;
  }
  for (size_t k = 0; k < x->nrep; k++) {
    const rreply *r = &x->r[k];
    if (is_redirect(r)) {
      w->node = encache__redis_redirect(w->s, r->text, &w->ask);
      return WX_REDIRECTED;
    }
    int ok = x->kind[k] == WANT_ASKING || x->kind[k] == WANT_OK
                 ? r->type == REDIS_REPLY_STATUS
             : x->kind[k] == WANT_INT ? r->type == REDIS_REPLY_INTEGER
             : x->kind[k] == WANT_POS
                 ? r->type == REDIS_REPLY_INTEGER && r->integer > 0
                                   : r->type == REDIS_REPLY_INTEGER &&
                                         r->integer == x->expect[k];
    if (!ok) {
      snprintf(w->why, sizeof(w->why), "%s",
               r->type == REDIS_REPLY_ERROR ? r->text
               : r->type == REDIS_REPLY_NIL ? "the temporary key exists"
                                            : "the temporary key changed");
      return ENCACHE_EUNAVAIL;
    }
  }
  return 0;
}

/* Deletes the temporary, when the node answers (else it expires). */
static void wdiscard(wwrite *w) {
  wxch x = {0};
  wcmd(w, &x, 2, "DEL", w->tmp, WANT_INT, 0);
  char why[sizeof(w->why)];
  memcpy(why, w->why, sizeof(why));
  size_t node = w->node;
  int ask = w->ask;
  wrun(w, &x, 0);
  memcpy(w->why, why, sizeof(why));
  w->node = node;
  w->ask = ask;
}

/* Window i of the order 0, last, 1, 2, ...: [*a, *b) of the object. */
static void wnth(const wwrite *w, uint64_t nwin, uint64_t i, uint64_t *a,
                 uint64_t *b) {
  uint64_t k = i == 0 ? 0 : i == 1 ? nwin - 1 : i - 1;
  *a = k * w->s->window;
  *b = w->total - *a < w->s->window ? w->total : *a + w->s->window;
}

/*
 * The windows, window_depth per exchange, in the order first, last, then
 * the others: SET tmp <first> NX PX (the only command that gives the
 * temporary an expiry), then SETRANGE, which with the last window gives
 * the string its whole length at once (APPENDs would make Redis grow and
 * copy it at each window).  Each SETRANGE must answer the whole length: a
 * temporary evicted and made again by a SETRANGE other than the last
 * window's is shorter.  Each exchange after the first starts with PTTL,
 * which must be positive (one made again by SETRANGE has no expiry), and
 * PEXPIRE (renewed); wverify() checks the same after the last.
 */
static int wwindows(wwrite *w) {
  uint64_t nwin = (w->total + w->s->window - 1) / w->s->window, done = 0;
  for (uint64_t i = 0; i < nwin;) {
    if (i > 0 && encache__redis_window_hook != NULL)
      encache__redis_window_hook(w->key, done);
    wxch x = {0};
    if (i > 0) {
      wcmd(w, &x, 2, "PTTL", w->tmp, WANT_POS, 0);
      wcmd(w, &x, 3, "PEXPIRE", w->tmp, WANT_EQ, 1);
      wbulk(&x, w->ttl, strlen(w->ttl));
    }
    uint64_t bytes = 0;
    for (unsigned k = 0; k < w->s->window_depth && i < nwin; k++, i++) {
      uint64_t a, b;
      char at[24];
      wnth(w, nwin, i, &a, &b);
      if (i == 0) {
        wcmd(w, &x, 6, "SET", w->tmp, WANT_OK, 0);
      } else {
        wcmd(w, &x, 4, "SETRANGE", w->tmp, WANT_EQ, (int64_t)w->total);
        wbulk(&x, at, (size_t)snprintf(at, sizeof(at), "%" PRIu64, a));
      }
      wdata(w, &x, a, b);
      if (i == 0) {
        wbulk(&x, "NX", 2);
        wbulk(&x, "PX", 2);
        wbulk(&x, w->ttl, strlen(w->ttl));
      }
      bytes += b - a;
    }
    int rc = wrun(w, &x, bytes);
    if (rc != 0)
      return rc;
    done += bytes;
  }
  return 0;
}

/* After the last window: the temporary is still the one we made (it has
 * its expiry) and whole. */
static int wverify(wwrite *w) {
  wxch x = {0};
  wcmd(w, &x, 2, "PTTL", w->tmp, WANT_POS, 0);
  wcmd(w, &x, 2, "STRLEN", w->tmp, WANT_EQ, (int64_t)w->total);
  return wrun(w, &x, 0);
}

/* The final expiry, RENAMENX and DEL of the temporary; then PERSIST when
 * the objects have no expiry.  Returns 0, ENCACHE_EEXIST or a failure. */
static int wplace(wwrite *w) {
  wxch x = {0};
  char ms[32];
  if (w->s->ttl_s) {
    snprintf(ms, sizeof(ms), "%" PRIu64, (uint64_t)w->s->ttl_s * 1000);
    wcmd(w, &x, 3, "PEXPIRE", w->tmp, WANT_EQ, 1);
    wbulk(&x, ms, strlen(ms));
  }
  wcmd(w, &x, 3, "RENAMENX", w->tmp, WANT_INT, 0);
  wbulk(&x, w->key, strlen(w->key));
  size_t renamenx = x.nrep - 1;
  wcmd(w, &x, 2, "DEL", w->tmp, WANT_INT, 0);
  int rc = wrun(w, &x, 0);
  if (rc != 0)
    return rc;
  if (x.r[renamenx].integer == 0) {
    snprintf(w->why, sizeof(w->why), "key exists");
    return ENCACHE_EEXIST;
  }
  if (w->s->ttl_s == 0) {
    wxch y = {0};
    wcmd(w, &y, 2, "PERSIST", w->key, WANT_INT, 0);
    wrun(w, &y, 0); /* else the object expires with the temporary's expiry */
  }
  return 0;
}

/* A hash tag for each slot ("{tag}" puts a key in that slot whatever
 * follows), the shortest over [0-9a-zA-Z]: made once, in a few ms. */
static char slot_tags[NSLOTS][5];
static pthread_once_t tags_once = PTHREAD_ONCE_INIT;

static void tags_init(void) {
  static const char al[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  size_t left = NSLOTS;
  for (unsigned len = 1; len <= 4 && left > 0; len++) {
    uint64_t count = 1;
    for (unsigned i = 0; i < len; i++)
      count *= sizeof(al) - 1;
    for (uint64_t n = 0; n < count && left > 0; n++) {
      char t[5] = {0};
      uint64_t v = n;
      for (unsigned i = 0; i < len; i++, v /= sizeof(al) - 1)
        t[i] = al[v % (sizeof(al) - 1)];
      unsigned slot = encache__redis_key_slot(t);
      if (slot_tags[slot][0] == '\0') {
        memcpy(slot_tags[slot], t, sizeof(t));
        left--;
      }
    }
  }
}

/* A fresh temporary key for w->key, in its slot (cluster); NULL when out
 * of memory.  Its name is unique across hosts and containers, not only
 * processes: pids and monotonic clocks repeat between containers, and two
 * writers sharing a temporary would mix their windows (the second one's
 * pipelined SETRANGEs run even when its SET NX fails), so 64 random bits
 * join pid, counter and time. */
static char *wtmp_name(const wwrite *w) {
  static unsigned long counter;
  unsigned long n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
    nonce = (uint64_t)(uintptr_t)&nonce ^ ((uint64_t)n << 32) ^ now_ms();
  char tag[8] = "";
  if (w->s->cluster) {
    pthread_once(&tags_once, tags_init);
    snprintf(tag, sizeof(tag), "{%s}",
             slot_tags[encache__redis_key_slot(w->key)]);
  }
  return encache__asprintf("%sencache-tmp:%s:%lx.%lx.%" PRIx64 ".%016" PRIx64,
                           tag, w->key, (unsigned long)getpid(), n, now_ms(),
                           nonce);
}

int encache__redis_wwrite(redis_store *s, rset *set, const char *key,
                          const void *hdr, size_t hl, const void *payload,
                          size_t len, const unsigned char *ck, size_t ckl) {
  wwrite w = {.s = s, .set = set, .key = key, .hdr = hdr, .payload = payload,
              .ck = ck, .hl = hl, .len = len, .ckl = ckl,
              .total = (uint64_t)hl + len + ckl};
  /* Long enough for one exchange twice over; renewed at each. */
  uint64_t mib = (s->window * s->window_depth + (1u << 20) - 1) >> 20;
  snprintf(w.ttl, sizeof(w.ttl), "%" PRIu64,
           2 * (s->timeout_ms + mib * MS_PER_MIB));
  w.node = encache__redis_locate(s, key);
  int rc = ENCACHE_EUNAVAIL;
  snprintf(w.why, sizeof(w.why), "no node serves its slot");
  for (int round = 0; round < ROUNDS && w.node < MAX_NODES; round++) {
    w.tmp = wtmp_name(&w);
    if (w.tmp == NULL)
      return encache_store_fail(&s->base, ENCACHE_ENOMEM, "out of memory");
    size_t node = w.node;
    int ask = w.ask;
    rc = wwindows(&w);
    if (rc == 0)
      rc = wverify(&w);
    if (rc == 0)
      rc = wplace(&w);
    if (rc == WX_REDIRECTED || rc == ENCACHE_EUNAVAIL) {
      size_t next = w.node;
      int next_ask = w.ask;
      w.node = node, w.ask = ask;
      wdiscard(&w); /* where it was written */
      w.node = next, w.ask = next_ask;
    }
    encache__free(w.tmp);
    if (rc != WX_REDIRECTED)
      break;
    rc = ENCACHE_EUNAVAIL;
    snprintf(w.why, sizeof(w.why), "still redirected after %d rounds", ROUNDS);
  }
  return rc == 0 ? 0
                 : encache_store_fail(&s->base, rc, "%s: windowed SET %s: %s",
                                      s->base.url, key, w.why);
}
