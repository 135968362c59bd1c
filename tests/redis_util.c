/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_util.c: the Redis test suites' servers (tests/test_redis.c,
 * tests/test_redis_failover.c): free loopback ports, redis-server processes
 * (plain, password-protected or cluster-enabled) started and killed, a
 * hiredis connection to one.
 */
#include "redis_util.h"

#include "runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
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
