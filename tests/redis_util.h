/* SPDX-License-Identifier: Apache-2.0 */
/* redis_util.h: the Redis test suites' servers (tests/redis_util.c). */
#ifndef ENCACHE_TEST_REDIS_UTIL_H
#define ENCACHE_TEST_REDIS_UTIL_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* 1 when redis-server and redis-cli are installed, else 0 (said). */
int redis_have(void);
/* A loopback port free now (and port + 10000, the cluster bus). */
int free_port(void);
double now_s(void);
redisContext *connect_to(int port);
int answers_ping(int port, const char *password);
/* Starts redis-server on port: cluster-enabled with its config in dir when
 * dir is not NULL, with --requirepass password when that is not NULL;
 * waits until it answers PING. */
pid_t spawn_redis_auth(int port, const char *dir, const char *password);
pid_t spawn_redis(int port, const char *dir);
/* The index in ports[0..n) of the master serving key's slot, as the
 * node at port `ask` sees the cluster; -1 when none (or no answer). */
int slot_owner(const int *ports, int n, int ask, const char *key);
/* Sends sig; waits for the process when it is SIGKILL or SIGTERM. */
void kill_wait(pid_t pid, int sig);

/* One redis-server of a test, on a free loopback port, and its URL:
 * redis://127.0.0.1:PORT followed by the options given. */
typedef struct redis_server {
  int port;
  pid_t pid;
  char url[256];
} redis_server;
/* Starts one (with --requirepass password when that is not NULL) and
 * waits until it answers; options ("?timeout_ms=300", NULL: none) end its
 * URL.  0 when redis-server is not installed (said: the test returns and
 * passes), else 1. */
int redis_server_start(redis_server *r, const char *options);
int redis_server_start_auth(redis_server *r, const char *password,
                            const char *options);
/* Kills it (SIGKILL) and waits for it. */
void redis_server_stop(redis_server *r);
/* r's address with other options: "redis://127.0.0.1:PORT" options, in
 * buf; returns buf. */
const char *redis_server_url(const redis_server *r, const char *options,
                             char *buf, size_t size);

/* A three-master cluster in a fresh directory. */
typedef struct cluster {
  char dir[64];
  int port[3];
  pid_t pid[3];
  char url[256];
} cluster;

void cluster_start(cluster *cl);
/* Kills the cluster's nodes and removes its directory. */
void cluster_stop(cluster *cl);
/* Which of the cluster's nodes owns key (index into cl->port). */
int owner(cluster *cl, const char *key);
/* The node's CLUSTER MYID (the caller frees it). */
char *node_id(int port);
/* Runs the command fmt (with a and b) on the node; fails the test on an
 * error. */
void on_node(int port, const char *fmt, const char *a, const char *b);

/* A raw connection to the Store at url (redis://H:P, unix://PATH, or the
 * first seed of redis-cluster://H:P,...), following MOVED by hand, for
 * what a test writes and reads past the Store: the values as they lie
 * on the server. */
typedef struct redis_raw {
  char url[512];
  redisContext *c;
} redis_raw;
void raw_open(redis_raw *r, const char *url);
void raw_close(redis_raw *r);
/* A command about one key (its arguments as argv); MOVED followed. */
redisReply *raw_cmd(redis_raw *r, int argc, const char **argv,
                    const size_t *lens);
void raw_set(redis_raw *r, const char *key, const void *v, size_t n);
/* The value at key into a fresh buffer (*n bytes); NULL when none. */
unsigned char *raw_get(redis_raw *r, const char *key, size_t *n);
/* Sets the byte at off of key's value to b. */
void raw_setrange(redis_raw *r, const char *key, size_t off,
                  unsigned char b);
void raw_del(redis_raw *r, const char *key);

/* The peak resident set of this process, in KiB. */
long maxrss_kib(void);
/* Waits for child; fails the test (naming what) unless it exited 0. */
void run_child_expect_exit0(pid_t child, const char *what);
/* A Store list callback that counts the keys in *(long *)arg. */
int count_keys(const char *key, uint64_t len, void *arg);

#endif
