/* SPDX-License-Identifier: Apache-2.0 */
/*
 * delay_relay: a TCP relay on loopback that holds every chunk it reads
 * for DELAY_US microseconds before it passes it on, each way: a simulated
 * network delay for the benchmarks where `tc qdisc ... netem` is missing
 * (issue 30; docs/performance.md, "At the wire's speed").
 *
 *   delay_relay LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_US
 *
 * Each connection gets a connection to the target and, each way, a
 * reading thread that timestamps chunks of up to 256 KiB into a queue and
 * a writing thread that sends each once its time has come.  The queue is
 * unbounded (a benchmark's pipeline is what is in flight); the relay's
 * own copies cap its throughput (about 1.1 GB/s on a 2-core machine).
 * A measuring tool, not a product: it runs until killed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256u << 10)

typedef struct chunk {
  struct chunk *next;
  uint64_t due_ns;
  size_t n;
  char d[];
} chunk;

/* One way of a connection; mu guards the queue and eof. */
typedef struct pump {
  int from, to;
  chunk *head, *tail;
  int eof;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} pump;

static uint64_t delay_ns;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *pump_read(void *arg) {
  pump *p = arg;
  for (;;) {
    chunk *c = malloc(sizeof(*c) + CHUNK);
    ssize_t r = c != NULL ? recv(p->from, c->d, CHUNK, 0) : -1;
    pthread_mutex_lock(&p->mu);
    if (r <= 0) {
      free(c);
      p->eof = 1;
      pthread_cond_signal(&p->cv);
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    c->n = (size_t)r;
    c->due_ns = now_ns() + delay_ns;
    c->next = NULL;
    if (p->tail != NULL)
      p->tail->next = c;
    else
      p->head = c;
    p->tail = c;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

static void *pump_write(void *arg) {
  pump *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (p->head == NULL && !p->eof)
      pthread_cond_wait(&p->cv, &p->mu);
    chunk *c = p->head;
    if (c != NULL && (p->head = c->next) == NULL)
      p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    if (c == NULL) {
      shutdown(p->to, SHUT_WR);
      return NULL;
    }
    uint64_t t = now_ns();
    if (c->due_ns > t) {
      struct timespec s = {(time_t)((c->due_ns - t) / 1000000000u),
                           (long)((c->due_ns - t) % 1000000000u)};
      nanosleep(&s, NULL);
    }
    for (size_t off = 0; off < c->n;) {
      ssize_t w = send(p->to, c->d + off, c->n - off, MSG_NOSIGNAL);
      if (w <= 0)
        break;
      off += (size_t)w;
    }
    free(c);
  }
}

static void pump_start(int from, int to) {
  pump *p = calloc(1, sizeof(*p));
  pthread_t t;
  if (p == NULL)
    return;
  p->from = from, p->to = to;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pthread_create(&t, NULL, pump_read, p) == 0)
    pthread_detach(t);
  if (pthread_create(&t, NULL, pump_write, p) == 0)
    pthread_detach(t);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: delay_relay LISTEN_PORT TARGET_HOST TARGET_PORT "
                    "DELAY_US\n");
    return 2;
  }
  delay_ns = strtoull(argv[4], NULL, 10) * 1000u;
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a, t;
  memset(&a, 0, sizeof(a));
  memset(&t, 0, sizeof(t));
  a.sin_family = t.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  t.sin_port = htons((uint16_t)atoi(argv[3]));
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (inet_pton(AF_INET, argv[2], &t.sin_addr) != 1 ||
      bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 64) != 0) {
    perror("delay_relay");
    return 1;
  }
  for (;;) {
    int c = accept(l, NULL, NULL), s = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || s < 0 || connect(s, (struct sockaddr *)&t, sizeof(t)) != 0) {
      if (c >= 0)
        close(c);
      if (s >= 0)
        close(s);
      continue;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pump_start(c, s);
    pump_start(s, c);
  }
}
