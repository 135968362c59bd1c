/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_util.c: the Redis test suites' servers (tests/test_redis_*.c):
 * free loopback ports, redis-server processes (plain, password-protected
 * or cluster-enabled) started and killed, a hiredis connection to one,
 * three-master clusters, and the helpers several of those files share.
 */
#include "redis_util.h"

#include "runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int redis_have(void) {
  if (system("command -v redis-server >/dev/null 2>&1 && "
             "command -v redis-cli >/dev/null 2>&1") == 0)
    return 1;
  printf("# skipped: redis-server or redis-cli is not installed\n");
  return 0;
}

static int bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

/* A free port below the ephemeral range, whose cluster bus port (+10000)
 * is free too. */
int free_port(void) {
  static unsigned seed;
  if (seed == 0)
    seed = (unsigned)getpid() * 2654435761u;
  for (int tries = 0; tries < 1000; tries++) {
    seed = seed * 1103515245u + 12345u;
    int port = 12000 + (int)((seed >> 8) % 18000);
    if (bindable(port) && bindable(port + 10000))
      return port;
  }
  test__fail(__FILE__, __LINE__, "no free port");
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

redisContext *connect_to(int port) {
  struct timeval tv = {1, 0};
  return redisConnectWithTimeout("127.0.0.1", port, tv);
}

/* Whether the server on port answers PING (after AUTH password when not
 * NULL). */
int answers_ping(int port, const char *password) {
  redisContext *c = connect_to(port);
  int ok = 0;
  if (c != NULL && !c->err) {
    redisReply *r = password ? redisCommand(c, "AUTH %s", password) : NULL;
    if (r)
      freeReplyObject(r);
    r = redisCommand(c, "PING");
    ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (r)
      freeReplyObject(r);
  }
  if (c != NULL)
    redisFree(c);
  return ok;
}

/* Starts redis-server on port: in cluster mode with a config in dir when
 * dir is not NULL; with --requirepass password when that is not NULL.
 * Waits until it answers PING. */
pid_t spawn_redis_auth(int port, const char *dir,
                              const char *password) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    char p[16], conf[256];
    snprintf(p, sizeof(p), "%d", port);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    const char *argv[24] = {"redis-server", "--port", p, "--bind",
                            "127.0.0.1", "--save", "", "--appendonly", "no"};
    int n = 9;
    if (dir != NULL) {
      snprintf(conf, sizeof(conf), "%s/nodes-%d.conf", dir, port);
      const char *more[] = {"--dir", dir, "--cluster-enabled", "yes",
                            "--cluster-config-file", conf,
                            "--cluster-node-timeout", "2000",
                            "--cluster-require-full-coverage", "no"};
      for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
        argv[n++] = more[i];
    }
    if (password != NULL) {
      argv[n++] = "--requirepass";
      argv[n++] = password;
    }
    argv[n] = NULL;
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 200; i++) {
    if (answers_ping(port, password))
      return pid;
    usleep(20000);
  }
  test__fail(__FILE__, __LINE__, "redis-server on port %d did not start", port);
}

pid_t spawn_redis(int port, const char *dir) {
  return spawn_redis_auth(port, dir, NULL);
}

void kill_wait(pid_t pid, int sig) {
  kill(pid, sig);
  if (sig == SIGKILL || sig == SIGTERM)
    waitpid(pid, NULL, 0);
}

int redis_server_start_auth(redis_server *r, const char *password,
                            const char *options) {
  memset(r, 0, sizeof(*r));
  if (!redis_have())
    return 0;
  r->port = free_port();
  r->pid = spawn_redis_auth(r->port, NULL, password);
  redis_server_url(r, options, r->url, sizeof(r->url));
  return 1;
}

int redis_server_start(redis_server *r, const char *options) {
  return redis_server_start_auth(r, NULL, options);
}

void redis_server_stop(redis_server *r) { kill_wait(r->pid, SIGKILL); }

const char *redis_server_url(const redis_server *r, const char *options,
                             char *buf, size_t size) {
  snprintf(buf, size, "redis://127.0.0.1:%d%s", r->port,
           options != NULL ? options : "");
  return buf;
}


int slot_owner(const int *ports, int n, int ask, const char *key) {
  redisContext *c = connect_to(ask);
  redisReply *slot = c && !c->err ? redisCommand(c, "CLUSTER KEYSLOT %s", key)
                                  : NULL;
  redisReply *slots = slot ? redisCommand(c, "CLUSTER SLOTS") : NULL;
  int found = -1;
  for (size_t e = 0; slots && e < slots->elements && found < 0; e++) {
    redisReply *r = slots->element[e];
    if (slot->integer >= r->element[0]->integer &&
        slot->integer <= r->element[1]->integer)
      for (int i = 0; i < n; i++)
        if (r->element[2]->element[1]->integer == ports[i])
          found = i;
  }
  if (slot)
    freeReplyObject(slot);
  if (slots)
    freeReplyObject(slots);
  if (c)
    redisFree(c);
  return found;
}

/* Starts a three-master cluster in a fresh directory. */
void cluster_start(cluster *cl) {
  snprintf(cl->dir, sizeof(cl->dir), "/tmp/encache-cluster-%d", (int)getpid());
  mkdir(cl->dir, 0700);
  char cmd[512];
  int n = snprintf(cmd, sizeof(cmd), "redis-cli --cluster create");
  for (int i = 0; i < 3; i++) {
    cl->port[i] = free_port();
    cl->pid[i] = spawn_redis(cl->port[i], cl->dir);
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " 127.0.0.1:%d", cl->port[i]);
  }
  snprintf(cmd + n, sizeof(cmd) - (size_t)n,
           " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
  ASSERT_EQ_INT(system(cmd), 0);
  for (int i = 0; i < 3; i++) {
    int ok = 0;
    for (int k = 0; k < 200 && !ok; k++) {
      redisContext *c = connect_to(cl->port[i]);
      redisReply *r = redisCommand(c, "CLUSTER INFO");
      ok = r && r->str && strstr(r->str, "cluster_state:ok") != NULL;
      if (r)
        freeReplyObject(r);
      redisFree(c);
      if (!ok)
        usleep(50000);
    }
    ASSERT(ok);
  }
  snprintf(cl->url, sizeof(cl->url),
           "redis-cluster://127.0.0.1:%d,127.0.0.1:%d?timeout_ms=300&"
           "connect_timeout_ms=300", cl->port[0], cl->port[1]);
}

void cluster_stop(cluster *cl) {
  for (int i = 0; i < 3; i++)
    if (cl->pid[i] > 0)
      kill_wait(cl->pid[i], SIGKILL);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", cl->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "# could not remove %s\n", cl->dir);
}

/* Which of the cluster's nodes owns key (index into cl->port). */
int owner(cluster *cl, const char *key) {
  return slot_owner(cl->port, 3, cl->port[0], key);
}

char *node_id(int port) {
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, "CLUSTER MYID");
  char *id = strdup(r->str);
  freeReplyObject(r);
  redisFree(c);
  return id;
}

void on_node(int port, const char *fmt, const char *a, const char *b) {
  redisContext *c = connect_to(port);
  redisReply *r = redisCommand(c, fmt, a, b);
  if (r == NULL || r->type == REDIS_REPLY_ERROR)
    test__fail(__FILE__, __LINE__, "%s on %d: %s", fmt, port,
               r && r->str ? r->str : c->errstr);
  freeReplyObject(r);
  redisFree(c);
}

/* The peak resident set of this process, in KiB. */
long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

void run_child_expect_exit0(pid_t child, const char *what) {
  int status;
  ASSERT(waitpid(child, &status, 0) == child);
  if (WIFSIGNALED(status))
    test__fail(__FILE__, __LINE__, "%s: the process was killed by signal %d",
               what, WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    test__fail(__FILE__, __LINE__, "%s: exit %d", what, WEXITSTATUS(status));
}

int count_keys(const char *key, uint64_t len, void *arg) {
  ASSERT(key != NULL);
  (void)len;
  ++*(long *)arg;
  return 0;
}

/* ------------------------------------------------ raw access to a Store */

static redisContext *raw_dial(const char *url) {
  char host[256] = "";
  int port = 0;
  if (strncmp(url, "unix://", 7) == 0) {
    char path[256];
    sscanf(url + 7, "%255[^?]", path);
    return redisConnectUnix(path);
  }
  const char *hp = strstr(url, "://");
  hp = hp ? hp + 3 : url;
  const char *at = strchr(hp, '@');
  if (at != NULL && (strchr(hp, '?') == NULL || at < strchr(hp, '?')))
    hp = at + 1;
  sscanf(hp, "%255[^:]:%d", host, &port);
  return redisConnect(host, port);
}

void raw_open(redis_raw *r, const char *url) {
  snprintf(r->url, sizeof(r->url), "%s", url);
  r->c = raw_dial(url);
  ASSERT(r->c != NULL && !r->c->err);
}

void raw_close(redis_raw *r) { redisFree(r->c); }

redisReply *raw_cmd(redis_raw *r, int argc, const char **argv,
                    const size_t *lens) {
  for (int round = 0; round < 3; round++) {
    redisReply *rep = redisCommandArgv(r->c, argc, argv, lens);
    ASSERT(rep != NULL);
    if (rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "MOVED ", 6) != 0)
      return rep;
    char where[300];
    snprintf(where, sizeof(where), "redis://%s", strchr(rep->str + 6, ' ') + 1);
    freeReplyObject(rep);
    redisFree(r->c);
    r->c = raw_dial(where);
    ASSERT(r->c != NULL && !r->c->err);
  }
  test__fail(__FILE__, __LINE__, "still redirected");
}

void raw_set(redis_raw *r, const char *key, const void *v, size_t n) {
  const char *argv[3] = {"SET", key, v};
  size_t lens[3] = {3, strlen(key), n};
  redisReply *rep = raw_cmd(r, 3, argv, lens);
  ASSERT_EQ_INT(rep->type, REDIS_REPLY_STATUS);
  freeReplyObject(rep);
}

unsigned char *raw_get(redis_raw *r, const char *key, size_t *n) {
  const char *argv[2] = {"GET", key};
  size_t lens[2] = {3, strlen(key)};
  redisReply *rep = raw_cmd(r, 2, argv, lens);
  unsigned char *out = NULL;
  if (rep->type == REDIS_REPLY_STRING) {
    out = malloc(rep->len + 1);
    memcpy(out, rep->str, rep->len);
    *n = rep->len;
  }
  freeReplyObject(rep);
  return out;
}

void raw_setrange(redis_raw *r, const char *key, size_t off,
                  unsigned char b) {
  char at[32];
  snprintf(at, sizeof(at), "%zu", off);
  const char *argv[4] = {"SETRANGE", key, at, (const char *)&b};
  size_t lens[4] = {8, strlen(key), strlen(at), 1};
  freeReplyObject(raw_cmd(r, 4, argv, lens));
}

void raw_del(redis_raw *r, const char *key) {
  const char *argv[2] = {"DEL", key};
  size_t lens[2] = {3, strlen(key)};
  freeReplyObject(raw_cmd(r, 2, argv, lens));
}
