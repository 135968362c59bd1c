/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_fleet.c: the fleet commands, readers of the statistics registry
 * (docs/engine.md, "Seeing the fleet"): the end of `encache stats`,
 * `encache exporter` (Prometheus over HTTP: one poll() loop serving up to
 * 16 connections at once, each with a short deadline for its request head
 * and one for its whole life, the oldest idle one closed for a new one
 * when all are taken, loopback unless --allow-remote) and `encache top`
 * (a live table on a plain terminal: ANSI escapes, no curses, cut to the
 * terminal's size).
 *
 * (Over 600 lines: the three commands share the stop flag and its signal
 * handling; each section is short and stands alone.)
 */
#include "commands.h"
#include "fleet_out.h"

#include "encache.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

int stats_fleet(const char *format, const char *segment, encache_store *st,
                const char *down) {
  int text = strcmp(format, "text") == 0;
  if (!text && strcmp(format, "json") != 0 &&
      strcmp(format, "prometheus") != 0)
    return usage_error("stats", "--format: \"%s\" is not one of text, json, "
                       "prometheus", format);
  fleet_view v = {NULL, 0, 0};
  char why[600];
  int rc = fleet_collect(fleet_segment(segment), &v, why, sizeof(why));
  if (rc < 0) { /* text: the Store's counters are printed, it exits 0 */
    fprintf(stderr, "encache stats: %s\n", why);
  } else if (text) {
    fleet_text(stdout, &v);
  } else {
    if (down != NULL && format[0] == 'p')
      fleet_store_down(stdout, down);
    if (format[0] == 'j')
      rc = fleet_json(stdout, st, &v, why, sizeof(why));
    else
      rc = fleet_prometheus(stdout, st, &v, 0, why, sizeof(why));
    if (rc < 0)
      fprintf(stderr, "encache stats: %s\n", why);
  }
  fleet_view_free(&v);
  if (fflush(stdout) != 0) {
    perror("encache stats: write");
    return EXIT_FAIL;
  }
  return rc < 0 && !text ? EXIT_FAIL : EXIT_OK;
}

/* SIGINT and SIGTERM end the exporter and top (a flag, no SA_RESTART: a
 * blocked call returns EINTR). */
static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) {
  (void)sig;
  stop_requested = 1;
}

static void catch_stop(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a client that leaves: EPIPE, not death */
}

/* ------------------------------------------------------------ exporter */

static const char exporter_usage[] =
    "usage: encache [--store URL] exporter [--listen HOST:PORT]\n"
    "                                      [--allow-remote] [--segment NAME]\n"
    "\n"
    "Serves `encache stats --format prometheus` over HTTP for Prometheus to\n"
    "scrape: GET /metrics answers the counters and histograms of every\n"
    "engine handle open on this host (and the Store's counters when --store\n"
    "or $ENCACHE_STORE names one: it must answer at start; later failures\n"
    "give encache_store_up 0), read afresh for each request.  Runs until\n"
    "SIGINT or SIGTERM.\n"
    "\n"
    "  --listen HOST:PORT  where to listen (default 127.0.0.1:9464; port 0:\n"
    "                      any free port, printed at start; [::1]:PORT for\n"
    "                      IPv6)\n"
    "  --allow-remote      allow an address other than loopback (the metrics\n"
    "                      name the host's Stores and encoders)\n"
    "  --segment NAME      the registry (default: $ENCACHE_STATS_SEGMENT,\n"
    "                      else encache.fleet.<uid>)\n";

#define EXPORTER_TIMEOUT_S 5 /* a connection's whole life, at most */
#define EXPORTER_HEAD_S 2    /* ... and the time to send its request head */
#define EXPORTER_CONNS 16    /* served at once (then the oldest idle goes) */
#define REQUEST_MAX 8192

/* Splits HOST:PORT ([V6]:PORT) into host and port. */
static int split_listen(const char *arg, char *host, size_t hsz, char *port,
                        size_t psz) {
  const char *colon = strrchr(arg, ':');
  if (colon == NULL || colon[1] == '\0' || colon == arg)
    return -1;
  const char *h = arg;
  size_t hl = (size_t)(colon - arg);
  if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl == 0 || hl >= hsz || strlen(colon + 1) >= psz)
    return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, psz, "%s", colon + 1);
  return 0;
}

static int is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const void *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const void *)sa;
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0,
                                               0, 0, 0, 0, 0xff, 0xff};
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
           (memcmp(in6->sin6_addr.s6_addr, v4mapped, 12) == 0 &&
            in6->sin6_addr.s6_addr[12] == 127);
  }
  return 0;
}

/* Binds and listens on `listen`; prints why and returns -1 (with *code
 * the exit code) on failure. */
static int open_listener(const char *listen_at, int allow_remote, int *code) {
  char host[256], port[32];
  long long pn;
  *code = EXIT_USAGE;
  if (split_listen(listen_at, host, sizeof(host), port, sizeof(port)) < 0)
    return usage_error("exporter", "--listen: \"%s\" is not HOST:PORT",
                       listen_at), -1;
  if (tool_int("exporter", "--listen's port", port, 0, 65535, &pn) < 0)
    return -1;
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int gai = getaddrinfo(host, port, &hints, &ai);
  if (gai != 0)
    return usage_error("exporter", "--listen: %s: %s", host,
                       gai_strerror(gai)), -1;
  int fd = -1;
  if (!is_loopback(ai->ai_addr) && !allow_remote) {
    usage_error("exporter", "--listen: %s is not a loopback address: the "
                "metrics would be served to the network; add --allow-remote "
                "to mean it", host);
  } else if ((fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                          0)) < 0) {
    *code = EXIT_FAIL;
    fprintf(stderr, "encache exporter: socket: %s\n", strerror(errno));
  } else {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 16) < 0) {
      int e = errno;
      *code = EXIT_FAIL;
      fprintf(stderr, "encache exporter: cannot listen on %s: %s%s\n",
              listen_at, strerror(e),
              e == EADDRINUSE ? " (another program has this port; choose "
                                "another with --listen)" : "");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  return fd;
}

/* One client connection of the exporter: its request head is read, then
 * its answer sent, without blocking, all within its deadline: a silent or
 * slow client holds its connection EXPORTER_HEAD_S at most before its
 * head is complete, EXPORTER_TIMEOUT_S in all, and never delays the
 * others.  While its head is not complete it is idle: the oldest idle
 * connection gives its place to a new one when all are taken, so that
 * clients that hold every connection cannot keep a scrape out. */
typedef struct conn {
  int fd;         /* -1: unused */
  double opened;  /* when it was accepted */
  double deadline; /* opened + EXPORTER_HEAD_S, then + EXPORTER_TIMEOUT_S */
  size_t in;      /* bytes of req read */
  char *out;      /* the answer (malloc), NULL while the head is read */
  size_t outn, sent;
  char req[REQUEST_MAX];
} conn;

/* Makes c's answer (headers, and the body unless head). */
static void respond(conn *c, const char *status, const char *type,
                    const char *extra, const char *body, size_t n, int head) {
  char hdr[512];
  int hn = snprintf(hdr, sizeof(hdr),
                    "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu"
                    "\r\n%sConnection: close\r\n\r\n", status, type, n, extra);
  size_t total = (size_t)hn + (head ? 0 : n);
  c->out = malloc(total ? total : 1);
  if (c->out == NULL) {
    fprintf(stderr, "encache exporter: out of memory for an answer\n");
    return; /* the connection is closed */
  }
  memcpy(c->out, hdr, (size_t)hn);
  if (!head)
    memcpy(c->out + hn, body, n);
  c->outn = total;
  c->sent = 0;
}

static void respond_text(conn *c, const char *status, const char *extra,
                         const char *text) {
  respond(c, status, "text/plain; charset=utf-8", extra, text, strlen(text),
          0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The Prometheus body, from open_memstream (the caller frees *body);
 * NULL *body with the reason in why on failure. */
static void metrics_body(const char *segment, encache_store *st, char **body,
                         size_t *n, char *why, size_t wsz) {
  fleet_view v = {NULL, 0, 0};
  *body = NULL;
  FILE *m = open_memstream(body, n);
  int rc = m == NULL ? -1 : fleet_collect(segment, &v, why, wsz);
  if (m == NULL)
    snprintf(why, wsz, "out of memory");
  else if (rc == 0)
    rc = fleet_prometheus(m, st, &v, 1, why, wsz);
  if (m != NULL && fclose(m) != 0 && rc == 0) {
    snprintf(why, wsz, "out of memory");
    rc = -1;
  }
  fleet_view_free(&v);
  if (rc < 0) {
    free(*body);
    *body = NULL;
  }
}

/* Makes the answer to c's complete request head. */
static void answer(conn *c, const char *segment, encache_store *st) {
  char method[16], target[1024], version[16];
  if (sscanf(c->req, "%15s %1023s %15s", method, target, version) != 3 ||
      strncmp(version, "HTTP/1.", 7) != 0) {
    respond_text(c, "400 Bad Request", "", "bad request\n");
    return;
  }
  int head = strcmp(method, "HEAD") == 0;
  target[strcspn(target, "?#")] = '\0';
  if (strcmp(target, "/metrics") != 0) {
    respond_text(c, "404 Not Found", "", "not found: try /metrics\n");
  } else if (!head && strcmp(method, "GET") != 0) {
    respond_text(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n",
                 "only GET /metrics\n");
  } else {
    char *body, why[600];
    size_t len = 0;
    metrics_body(segment, st, &body, &len, why, sizeof(why));
    if (body == NULL) {
      fprintf(stderr, "encache exporter: %s\n", why);
      respond_text(c, "500 Internal Server Error", "", why);
    } else {
      respond(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8", "",
              body, len, head);
    }
    free(body);
  }
}

static void conn_close(conn *c) {
  close(c->fd);
  free(c->out);
  c->fd = -1;
  c->out = NULL;
}

/* Moves c on after poll() said it is ready: reads what the client sent
 * (the answer is made once the head is complete; a head too long is a
 * 400), or sends what the client can take.  Closes it when done. */
static void conn_step(conn *c, const char *segment, encache_store *st) {
  if (c->out == NULL) {
    ssize_t r = recv(c->fd, c->req + c->in, sizeof(c->req) - 1 - c->in,
                     MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return;
    if (r <= 0) { /* the client left (or half-closed without a request) */
      conn_close(c);
      return;
    }
    c->in += (size_t)r;
    c->req[c->in] = '\0';
    if (strstr(c->req, "\r\n\r\n") != NULL || strstr(c->req, "\n\n") != NULL)
      answer(c, segment, st);
    else if (c->in + 1 >= sizeof(c->req))
      respond_text(c, "400 Bad Request", "", "request head too long\n");
    else
      return;
    c->deadline = c->opened + EXPORTER_TIMEOUT_S; /* its answer's time */
    if (c->out == NULL)
      conn_close(c); /* no memory for the answer */
    return;
  }
  ssize_t w = send(c->fd, c->out + c->sent, c->outn - c->sent,
                   MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return;
  if (w <= 0 || (c->sent += (size_t)w) == c->outn)
    conn_close(c); /* done, or the client left */
}

/* The conn a new connection takes: a free one, else the oldest idle one
 * (still reading its head), closed for it; NULL when every one is sending
 * an answer (each is done within its deadline). */
static conn *conn_slot(conn *cs) {
  conn *idle = NULL;
  for (int i = 0; i < EXPORTER_CONNS; i++) {
    if (cs[i].fd < 0)
      return &cs[i];
    if (cs[i].out == NULL && (idle == NULL || cs[i].opened < idle->opened))
      idle = &cs[i];
  }
  if (idle != NULL)
    conn_close(idle);
  return idle;
}

/* Takes a new connection (closed at once when every conn is sending an
 * answer) and reads the request it may have sent already. */
static void conn_accept(int lfd, conn *cs, const char *segment,
                        encache_store *st) {
  int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (cfd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOMEM ||
        errno == ENOBUFS)
      poll(NULL, 0, 100); /* out of something: no busy loop */
    return;
  }
  conn *c = conn_slot(cs);
  if (c == NULL) {
    close(cfd);
    return;
  }
  c->fd = cfd;
  c->in = 0;
  c->req[0] = '\0';
  c->opened = now_s();
  c->deadline = c->opened + EXPORTER_HEAD_S;
  conn_step(c, segment, st);
}

/* Serves until SIGINT or SIGTERM: up to EXPORTER_CONNS connections at
 * once, each closed at its deadline whatever it is doing. */
static void serve_loop(int lfd, const char *segment, encache_store *st) {
  static conn cs[EXPORTER_CONNS];
  for (int i = 0; i < EXPORTER_CONNS; i++)
    cs[i].fd = -1;
  while (!stop_requested) {
    struct pollfd p[EXPORTER_CONNS + 1];
    int map[EXPORTER_CONNS + 1], np = 1, wait_ms = 1000;
    double now = now_s();
    p[0] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < EXPORTER_CONNS; i++) {
      if (cs[i].fd < 0)
        continue;
      double left = (cs[i].deadline - now) * 1000.0 + 1.0;
      if (left < wait_ms)
        wait_ms = left < 0 ? 0 : (int)left;
      map[np] = i;
      p[np++] = (struct pollfd){cs[i].fd, cs[i].out ? POLLOUT : POLLIN, 0};
    }
    if (poll(p, (nfds_t)np, wait_ms) > 0) { /* else a timeout, or EINTR */
      for (int k = 1; k < np; k++)
        if (p[k].revents != 0)
          conn_step(&cs[map[k]], segment, st);
      if (p[0].revents & POLLIN)
        conn_accept(lfd, cs, segment, st);
    }
    now = now_s();
    for (int i = 0; i < EXPORTER_CONNS; i++)
      if (cs[i].fd >= 0 && now > cs[i].deadline)
        conn_close(&cs[i]); /* silent or slow: its time is up */
  }
  for (int i = 0; i < EXPORTER_CONNS; i++)
    if (cs[i].fd >= 0)
      conn_close(&cs[i]);
}

/* Prints where the exporter listens (the port chosen for port 0). */
static void say_listening(int fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  char host[256] = "?", port[32] = "?";
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port,
                sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  int v6 = ss.ss_family == AF_INET6;
  fprintf(stderr, "encache exporter: serving http://%s%s%s:%s/metrics\n",
          v6 ? "[" : "", host, v6 ? "]" : "", port);
}

static int run_exporter(const tool_globals *g, const tool_args *a) {
  const char *segment = fleet_segment(a->val[2]);
  int code;
  int lfd = open_listener(a->val[0] ? a->val[0] : "127.0.0.1:9464",
                          a->val[1] != NULL, &code);
  if (lfd < 0)
    return code;
  /* A Store that does not answer at start is a mistake to say at once;
   * one that stops answering later gives encache_store_up 0. */
  encache_store *st = NULL;
  encache_store_stats ss = {.size = sizeof(ss)};
  if (g->store_url != NULL && (st = tool_open_store("exporter", g, 1)) != NULL &&
      encache_store_stats_get(st, &ss) < 0) {
    fprintf(stderr, "encache exporter: the Store does not answer: %s\n",
            encache_store_errmsg(st));
    encache_store_close(st);
    st = NULL;
  }
  if (g->store_url != NULL && st == NULL) {
    close(lfd);
    return EXIT_FAIL;
  }
  catch_stop();
  say_listening(lfd);
  serve_loop(lfd, segment, st);
  fprintf(stderr, "encache exporter: stopped\n");
  close(lfd);
  encache_store_close(st);
  return EXIT_OK;
}

static const tool_opt exporter_opts[] = {
    {"listen", 1}, {"allow-remote", 0}, {"segment", 1}, {NULL, 0}};
const tool_command cmd_exporter = {
    "exporter", "serve the host's statistics to Prometheus over HTTP",
    exporter_usage, exporter_opts, TOOL_STORE, 0, 0, "", run_exporter};

/* ----------------------------------------------------------------- top */

static const char top_usage[] =
    "usage: encache top [--interval MS] [--once] [--segment NAME]\n"
    "\n"
    "Shows the engine handles open on this host, live: one row per encoder\n"
    "with its pid, Store, hit rate (hits per candidate looked up), encodes\n"
    "avoided (hits), hits served without a check (UNCHECKED: Redis under\n"
    "checksum=on; checksum=required refuses them), bytes read from and\n"
    "written to the Store, lookup latency percentiles (p50, p99, from the\n"
    "histograms) and pending writes.  Press q to quit.\n"
    "\n"
    "  --interval MS   refresh every MS milliseconds (default 1000)\n"
    "  --once          print one frame and exit (for scripts)\n"
    "  --segment NAME  the registry (default: $ENCACHE_STATS_SEGMENT, else\n"
    "                  encache.fleet.<uid>)\n";

/* n bytes with a binary unit, in buf. */
static const char *human_bytes(uint64_t n, char *buf, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, size, u ? "%.1f%s" : "%.0f%s", v, units[u]);
  return buf;
}

/* A latency of us microseconds (-1: none), in buf. */
static const char *human_us(double us, char *buf, size_t size) {
  if (us < 0)
    snprintf(buf, size, "-");
  else if (us < 1000)
    snprintf(buf, size, "%.0fus", us);
  else if (us < 1e6)
    snprintf(buf, size, "%.1fms", us / 1e3);
  else
    snprintf(buf, size, "%.2fs", us / 1e6);
  return buf;
}

static int row_cmp(const void *x, const void *y) {
  const fleet_row *a = x, *b = y;
  int c = strcmp(a->encoder, b->encoder);
  return c != 0 ? c : (a->pid > b->pid) - (a->pid < b->pid);
}

/* The frame's text, one line per row (no ANSI), into out. */
static void top_text(FILE *out, const char *segment) {
  fleet_view v = {NULL, 0, 0};
  char why[600], t[32], b1[32], b2[32], l1[32], l2[32];
  int rc = fleet_collect(segment, &v, why, sizeof(why));
  time_t now = time(NULL);
  strftime(t, sizeof(t), "%H:%M:%S", localtime(&now));
  fprintf(out, "encache top - registry %s - %zu handle%s - %s\n", segment,
          v.n, v.n == 1 ? "" : "s", t);
  if (rc < 0)
    fprintf(out, "error: %s\n", why);
  fprintf(out, "%-20s %8s %6s %9s %9s %9s %9s %8s %8s %7s  %s\n", "ENCODER",
          "PID", "HIT%", "AVOIDED", "UNCHECKED", "READ", "WRITTEN", "P50",
          "P99", "PENDING", "STORE");
  if (v.n > 1)
    qsort(v.rows, v.n, sizeof(v.rows[0]), row_cmp);
  for (size_t k = 0; k < v.n; k++) {
    const fleet_row *r = &v.rows[k];
    double rate = r->st.candidates
                      ? 100.0 * (double)r->st.hits / (double)r->st.candidates
                      : 0.0;
    fleet_label(out, r->encoder, LABEL_TEXT, 20, 20);
    fprintf(out, " %8lld %5.1f%% %9" PRIu64 " %9" PRIu64 " %9s %9s %8s %8s %7"
            PRIu64 "  ", r->pid, rate, r->st.hits, r->st.hits_unchecked,
            human_bytes(r->st.bytes_read, b1, sizeof(b1)),
            human_bytes(r->bytes_written, b2, sizeof(b2)),
            human_us(fleet_quantile(&r->lookup, 0.5), l1, sizeof(l1)),
            human_us(fleet_quantile(&r->lookup, 0.99), l2, sizeof(l2)),
            r->st.pending_items);
    fleet_label(out, r->store, LABEL_TEXT, 0, 0);
    fputc('\n', out);
  }
  fleet_view_free(&v);
}

/* The terminal's size (80x24 when it does not say). */
static void term_size(int *cols, int *rows) {
  struct winsize ws;
  *cols = 80;
  *rows = 24;
  if (ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    *cols = ws.ws_col;
    *rows = ws.ws_row < 3 ? 3 : ws.ws_row;
  }
}

/* Writes line (len bytes) cut to cols columns (a UTF-8 character counts
 * one: its continuation bytes none). */
static void put_cut(const char *line, size_t len, int cols) {
  size_t n = 0;
  for (int c = 0; n < len; n++) {
    if (((unsigned char)line[n] & 0xC0) != 0x80 && c++ == cols)
      break;
  }
  fwrite(line, 1, n, stdout);
}

/* One frame.  live: drawn over the last one (ANSI: home, each line's rest
 * cleared, then the screen's), cut to the terminal's width and height,
 * the last line saying how many rows did not fit; else plain lines. */
static void top_frame(const char *segment, int live) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (m == NULL)
    return;
  top_text(m, segment);
  if (fclose(m) != 0 || text == NULL) {
    free(text);
    return;
  }
  if (!live) {
    fputs(text, stdout);
  } else {
    int cols, rows, nl = 0;
    term_size(&cols, &rows);
    for (size_t i = 0; i < len; i++)
      nl += text[i] == '\n';
    fputs("\033[H", stdout);
    const char *p = text;
    for (int k = 0; k < nl && k < rows - 1; k++) {
      const char *e = strchr(p, '\n');
      if (k == rows - 2 && nl > rows - 1)
        break; /* the last line left says what did not fit */
      put_cut(p, (size_t)(e - p), cols);
      fputs("\033[K\n", stdout);
      p = e + 1;
    }
    char last[64];
    int shown = nl < rows - 1 ? nl : rows - 2;
    if (nl > shown)
      snprintf(last, sizeof(last), "(%d more lines; q quits)", nl - shown);
    else
      snprintf(last, sizeof(last), "(q quits)");
    put_cut(last, strlen(last), cols);
    fputs("\033[J", stdout);
  }
  fflush(stdout);
  free(text);
}

/* Waits up to ms for a key on the terminal: 1 when q was pressed (0 too
 * when a signal came: the caller looks at its flags). */
static int wait_key(int tty, int ms) {
  struct pollfd p = {0, POLLIN, 0};
  if (!tty) {
    poll(NULL, 0, ms);
    return 0;
  }
  if (poll(&p, 1, ms) > 0) {
    char c;
    ssize_t r = read(0, &c, 1);
    return r == 1 && (c == 'q' || c == 'Q');
  }
  return 0;
}

/* top's terminal: raw keys (no echo, no line editing) and the alternate
 * screen while it runs; given back on every way out (q, SIGINT, SIGTERM,
 * SIGQUIT, SIGHUP) and around a stop (SIGTSTP: Ctrl-Z), taken again on
 * SIGCONT. */
static volatile sig_atomic_t top_suspend, top_resumed;
static void on_tstp(int sig) {
  (void)sig;
  top_suspend = 1;
}
static void on_cont(int sig) {
  (void)sig;
  top_resumed = 1;
}
static void on_winch(int sig) { /* interrupts the wait: a redraw */
  (void)sig;
}

static void term_enter(int tty, const struct termios *saved) {
  if (tty) {
    struct termios raw = *saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(0, TCSANOW, &raw);
  }
  fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, no cursor */
  fflush(stdout);
}

static void term_leave(int tty, const struct termios *saved) {
  fputs("\033[?25h\033[?1049l", stdout);
  fflush(stdout);
  if (tty)
    tcsetattr(0, TCSANOW, saved);
}

static void top_signals(void) {
  catch_stop(); /* SIGINT, SIGTERM */
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop;
  sigaction(SIGQUIT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sa.sa_handler = on_tstp;
  sigaction(SIGTSTP, &sa, NULL);
  sa.sa_handler = on_cont;
  sigaction(SIGCONT, &sa, NULL);
  sa.sa_handler = on_winch;
  sigaction(SIGWINCH, &sa, NULL); /* a redraw at the new size */
}

static int run_top(const tool_globals *g, const tool_args *a) {
  (void)g;
  const char *segment = fleet_segment(a->val[2]);
  int interval = 1000;
  if (a->val[0] != NULL &&
      tool_int32("top", "--interval", a->val[0], 50, 3600000, &interval) < 0)
    return EXIT_USAGE;
  if (a->val[1] != NULL) {
    fleet_view v = {NULL, 0, 0};
    char why[600];
    int rc = fleet_collect(segment, &v, why, sizeof(why));
    fleet_view_free(&v);
    if (rc < 0) {
      fprintf(stderr, "encache top: %s\n", why);
      return EXIT_FAIL;
    }
    top_frame(segment, 0);
    return EXIT_OK;
  }
  struct termios saved;
  int tty = isatty(0) && tcgetattr(0, &saved) == 0;
  top_signals();
  term_enter(tty, &saved);
  while (!stop_requested) {
    if (top_suspend) { /* Ctrl-Z: the terminal back, then stop */
      top_suspend = 0;
      term_leave(tty, &saved);
      raise(SIGSTOP);
    }
    if (top_resumed) { /* after a stop, or a new size */
      top_resumed = 0;
      term_enter(tty, &saved);
    }
    top_frame(segment, 1);
    if (wait_key(tty, interval))
      break;
  }
  term_leave(tty, &saved);
  return EXIT_OK;
}

static const tool_opt top_opts[] = {
    {"interval", 1}, {"once", 0}, {"segment", 1}, {NULL, 0}};
const tool_command cmd_top = {"top", "show the host's encoders live",
                              top_usage, top_opts, 0, 0, 0, "", run_top};
