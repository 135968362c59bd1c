/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resp_fake.c: a misbehaving RESP server (see resp_fake.h).  The parent
 * binds a loopback socket on port 0 and forks the acceptor; the acceptor
 * forks one process per connection, which reads RESP commands and answers
 * as the mode says.  All of them are in one process group (stopped
 * together) and die with their parent (PR_SET_PDEATHSIG) or after
 * RESP_FAKE_LIFETIME_S (alarm), whichever comes first.  Each accepted
 * connection writes one byte into a pipe, which resp_fake_stop() counts.
 */
#include "resp_fake.h"

#include "runner.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* --------------------------------------------------------- reading RESP */

typedef struct conn_in {
  int fd;
  char buf[65536];
  size_t pos, len;
} conn_in;

/* One byte of the connection; -1 at EOF or on an error. */
static int in_byte(conn_in *in) {
  if (in->pos == in->len) {
    ssize_t r = recv(in->fd, in->buf, sizeof(in->buf), 0);
    if (r <= 0)
      return -1;
    in->pos = 0;
    in->len = (size_t)r;
  }
  return (unsigned char)in->buf[in->pos++];
}

/* A line without its CRLF into out (truncated); -1 at EOF. */
static int in_line(conn_in *in, char *out, size_t size) {
  size_t n = 0;
  int ch;
  while ((ch = in_byte(in)) >= 0 && ch != '\n')
    if (ch != '\r' && n + 1 < size)
      out[n++] = (char)ch;
  out[n] = '\0';
  return ch < 0 ? -1 : 0;
}

/* Reads one command; its first two arguments (truncated to 63 bytes) go to
 * verb (upper-cased) and arg.  Returns 0, or -1 at EOF. */
static int read_command(conn_in *in, char *verb, char *arg) {
  char line[64];
  verb[0] = arg[0] = '\0';
  if (in_line(in, line, sizeof(line)) < 0 || line[0] != '*')
    return -1;
  long n = atol(line + 1);
  for (long k = 0; k < n; k++) {
    if (in_line(in, line, sizeof(line)) < 0 || line[0] != '$')
      return -1;
    long len = atol(line + 1);
    char *dst = k == 0 ? verb : k == 1 ? arg : NULL;
    for (long b = 0; b < len + 2; b++) {
      int ch = in_byte(in);
      if (ch < 0)
        return -1;
      if (dst != NULL && b < len && b < 63) {
        dst[b] = (char)toupper(ch);
        dst[b + 1] = '\0';
      }
    }
  }
  return 0;
}

/* ------------------------------------------------------------- writing */

static int out_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int out_str(int fd, const char *s) { return out_all(fd, s, strlen(s)); }

static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

/* Sends up to `total` bytes of 'x' in 64 KiB pieces; stops at an error. */
static void out_stream(int fd, const char *prefix, uint64_t total) {
  static char chunk[65536];
  memset(chunk, prefix[0] == '+' ? 'a' : 'x', sizeof(chunk));
  if (out_str(fd, prefix) < 0)
    return;
  for (uint64_t sent = 0; sent < total; sent += sizeof(chunk))
    if (out_all(fd, chunk, sizeof(chunk)) < 0)
      return;
}

/* A well-behaved answer to verb. */
static const char *normal_answer(const char *verb) {
  if (strcmp(verb, "GET") == 0)
    return "$5\r\nhello\r\n";
  if (strcmp(verb, "EXISTS") == 0 || strcmp(verb, "DEL") == 0)
    return ":1\r\n";
  if (strcmp(verb, "STRLEN") == 0)
    return ":5\r\n";
  if (strcmp(verb, "PING") == 0)
    return "+PONG\r\n";
  return "+OK\r\n";
}

static void serve(int fd, resp_mode mode) {
  static conn_in in;
  in.fd = fd;
  in.pos = in.len = 0;
  char verb[64], arg[64];
  unsigned long long scan_key = 0;
  if (mode == RESP_EPIPE) {
    /* Read a little of the command, FIN, then a reset: the client's socket
     * is in CLOSE_WAIT when the reset comes, so its next send gets EPIPE
     * (and SIGPIPE without MSG_NOSIGNAL). */
    char some[100];
    size_t got = 0;
    while (got < sizeof(some)) {
      ssize_t r = recv(fd, some + got, sizeof(some) - got, 0);
      if (r <= 0)
        return;
      got += (size_t)r;
    }
    shutdown(fd, SHUT_WR);
    sleep_ms(200);
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
    return;
  }
  for (int ncmd = 0; read_command(&in, verb, arg) == 0; ncmd++) {
    switch (mode) {
    case RESP_TRICKLE: {
      char head[] = "$100000\r\n";
      for (size_t i = 0;; i++) {
        char ch = i < sizeof(head) - 1 ? head[i] : 'x';
        if (out_all(fd, &ch, 1) < 0)
          return;
        sleep_ms(100);
      }
    }
    case RESP_ENDLESS_LINE:
      out_stream(fd, "+", 512ull << 20);
      sleep_ms(RESP_FAKE_LIFETIME_S * 1000);
      return;
    case RESP_OVERSIZED:
      out_stream(fd, "$2000000000\r\n", 256ull << 20);
      sleep_ms(RESP_FAKE_LIFETIME_S * 1000);
      return;
    case RESP_MALFORMED:
      out_str(fd, "?what is this\r\n");
      sleep_ms(RESP_FAKE_LIFETIME_S * 1000);
      return;
    case RESP_CLOSE_MID:
      out_str(fd, "$100\r\nabc");
      return;
    case RESP_EXTRA: {
      char both[64];
      snprintf(both, sizeof(both), "%s:7\r\n", normal_answer(verb));
      if (out_str(fd, both) < 0)
        return;
      break;
    }
    case RESP_MOVED:
      if (out_str(fd, "-MOVED 1234 127.0.0.1:1\r\n") < 0)
        return;
      break;
    case RESP_STALE:
      if (ncmd >= 1)
        return; /* closed without an answer */
      if (out_str(fd, normal_answer(verb)) < 0)
        return;
      break;
    case RESP_SCAN_ENDLESS:
    case RESP_SCAN_BADKEYS:
      if (strcmp(verb, "DBSIZE") == 0) {
        if (out_str(fd, mode == RESP_SCAN_ENDLESS ? ":10\r\n" : ":4\r\n") < 0)
          return;
      } else if (strcmp(verb, "SCAN") == 0 && mode == RESP_SCAN_BADKEYS) {
        if (out_str(fd, "*2\r\n$1\r\n0\r\n*4\r\n:1\r\n$-1\r\n*0\r\n"
                        "$3\r\nkey\r\n") < 0)
          return;
      } else if (strcmp(verb, "SCAN") == 0) {
        static char reply[64 * 1024];
        int n = snprintf(reply, sizeof(reply), "*2\r\n$1\r\n7\r\n*1000\r\n");
        for (int k = 0; k < 1000; k++) {
          char key[32];
          int kl = snprintf(key, sizeof(key), "k%llu", scan_key++);
          n += snprintf(reply + n, sizeof(reply) - (size_t)n, "$%d\r\n%s\r\n",
                        kl, key);
        }
        if (out_all(fd, reply, (size_t)n) < 0)
          return;
      } else if (out_str(fd, normal_answer(verb)) < 0) {
        return;
      }
      break;
    case RESP_SCAN_SLOW:
      if (strcmp(verb, "DBSIZE") == 0) {
        if (out_str(fd, "+lots\r\n") < 0)
          return;
      } else if (strcmp(verb, "SCAN") == 0) {
        char reply[512];
        int n = snprintf(reply, sizeof(reply), "*2\r\n$1\r\n7\r\n*10\r\n");
        for (int k = 0; k < 10; k++) {
          char key[32];
          int kl = snprintf(key, sizeof(key), "k%llu", scan_key++);
          n += snprintf(reply + n, sizeof(reply) - (size_t)n, "$%d\r\n%s\r\n",
                        kl, key);
        }
        sleep_ms(1);
        if (out_all(fd, reply, (size_t)n) < 0)
          return;
      } else if (out_str(fd, strcmp(verb, "UNLINK") == 0
                                 ? ":1\r\n"
                                 : normal_answer(verb)) < 0) {
        return;
      }
      break;
    case RESP_EPIPE:
      return;
    }
  }
}

/* ------------------------------------------------------ start and stop */

static struct {
  pid_t pid;
  int counter; /* read end of the connection-count pipe */
} servers[8];

pid_t resp_fake_start(resp_mode mode, int *port) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT(lfd >= 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  ASSERT(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
  ASSERT(listen(lfd, 64) == 0);
  ASSERT(getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
  *port = ntohs(a.sin_port);
  int counter[2];
  ASSERT(pipe(counter) == 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(0);
    alarm(RESP_FAKE_LIFETIME_S + 5);
    signal(SIGCHLD, SIG_IGN); /* connections reap themselves */
    close(counter[0]);
    pid_t acceptor = getpid();
    for (;;) {
      int fd = accept(lfd, NULL, NULL);
      if (fd < 0) {
        if (errno == EINTR)
          continue;
        _exit(1);
      }
      if (write(counter[1], "c", 1) != 1)
        _exit(1);
      pid_t c = fork();
      if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != acceptor)
          _exit(0);
        alarm(RESP_FAKE_LIFETIME_S);
        close(lfd);
        serve(fd, mode);
        close(fd);
        _exit(0);
      }
      close(fd);
    }
  }
  setpgid(pid, pid); /* also here: no race with the kill in stop */
  close(lfd);
  close(counter[1]);
  fcntl(counter[0], F_SETFL, O_NONBLOCK);
  for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++)
    if (servers[i].pid == 0) {
      servers[i].pid = pid;
      servers[i].counter = counter[0];
      return pid;
    }
  test__fail(__FILE__, __LINE__, "too many fake servers");
}

int resp_fake_stop(pid_t pid) {
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  int n = 0;
  for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++)
    if (servers[i].pid == pid) {
      char b[256];
      ssize_t r;
      while ((r = read(servers[i].counter, b, sizeof(b))) > 0)
        n += (int)r;
      close(servers[i].counter);
      servers[i].pid = 0;
    }
  return n;
}
