/* SPDX-License-Identifier: Apache-2.0 */
/*
 * campaign.c: a randomized adversarial campaign against the shm Store.
 *
 * Worker processes publish and look up objects in one segment; the parent
 * kills them (SIGKILL, then a new one takes the place) and stops them
 * (SIGSTOP for 10-300 ms, one stop in ten for 0.6-1.5 s: longer than the
 * lock timeout) at random, while a corrupter process changes
 * bytes of the index (entries, hash buckets, the ring head and the lists)
 * and of the objects' bytes.  Every object is derived from its key
 * (store_util's ts_fill), so every hit is checked byte for byte against
 * what was written for its key.  At the end it prints its counts; it
 * fails (exit 1) on any wrong hit, any crash (a worker that died of a
 * signal the campaign did not send, or exited non-zero) or any hang (a
 * worker that is not stopped and made no progress for --hang-ms).
 *
 *   encache_campaign [--seconds S] [--workers N] [--size SIZE]
 *                    [--keys N] [--corrupt on|off] [--seed N]
 *                    [--hang-ms MS] [--url URL]
 *
 * docs/stores.md gives the figures of a long run.
 */
#include "runner.h"
#include "store_util.h"

#include "encache.h"
#include "shm/testing.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 32

/* store_util.c reports through the test runner's function. */
void test__fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  _exit(2);
}

typedef struct worker_stats {
  uint64_t ops, hits, misses, unavailable, writes, write_fails, wrong;
  uint64_t heartbeat_ms; /* when the last operation ended */
  char wrong_key[96];
} worker_stats;

typedef struct campaign {
  double seconds;
  int workers, keys, corrupt;
  unsigned seed, hang_ms;
  char url[256], name[128];
  worker_stats *stats; /* shared with the workers */
  pid_t pid[MAX_WORKERS];
  int stopped[MAX_WORKERS];
  uint64_t resume_ms[MAX_WORKERS], stopped_since[MAX_WORKERS];
  uint64_t kills, stops, crashes, hangs, respawns;
  uint64_t retired[7]; /* the counts of workers that were replaced */
} campaign;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Each key's object size: 1 KiB to 256 KiB, fixed by the key. */
static size_t key_len(int k) {
  return (size_t)1024 << (k * 7 % 9);
}

/* Counts one read answer: a hit checked byte for byte, a miss, or a wrong
 * hit (any other bytes or length). */
static void count_read(worker_stats *ws, const char *key, size_t len,
                       const unsigned char *buf, int rc, int64_t res) {
  if (rc < 0 || res == ENCACHE_EUNAVAIL) {
    ws->unavailable++;
  } else if (res == ENCACHE_ENOENT) {
    ws->misses++;
  } else if (res == (int64_t)len && ts_verify(key, buf, len)) {
    ws->hits++;
  } else {
    ws->wrong++;
    snprintf(ws->wrong_key, sizeof(ws->wrong_key), "%s (%lld bytes)", key,
             (long long)res);
  }
}

/* A batch of 20 lookups (more than the Store's on-stack batch). */
static void batch_read(campaign *c, worker_stats *ws, encache_store *st,
                       unsigned char *bufs_mem) {
  enum { B = 20, CAP = 16 << 10 };
  char names[B][64];
  const char *keys[B];
  void *bufs[B];
  size_t caps[B], lens[B];
  int64_t res[B];
  for (int i = 0; i < B; i++) {
    int k = rand() % c->keys;
    snprintf(names[i], sizeof(names[i]), "campaign/%d", k);
    keys[i] = names[i];
    bufs[i] = bufs_mem + (size_t)i * CAP;
    caps[i] = CAP;
    lens[i] = key_len(k);
  }
  int rc = encache_store_read(st, keys, B, bufs, caps, res);
  for (int i = 0; i < B; i++)
    if (rc < 0 || res[i] != ENCACHE_ETOOLARGE)
      count_read(ws, keys[i], lens[i], bufs[i], rc, res[i]);
}

static void worker(campaign *c, int w, unsigned seed) {
  worker_stats *ws = &c->stats[w];
  encache_store *st = NULL;
  if (encache_store_open(c->url, &st) != 0) {
    fprintf(stderr, "worker %d: open: %s\n", w, encache_store_errmsg(st));
    _exit(2);
  }
  unsigned char *buf = malloc(320 << 10), *obj = malloc(256 << 10);
  if (buf == NULL || obj == NULL)
    _exit(2);
  srand(seed);
  for (;;) {
    int k = rand() % c->keys;
    char key[64];
    snprintf(key, sizeof(key), "campaign/%d", k);
    size_t len = key_len(k);
    int op = rand() % 60;
    if (op == 0) {
      batch_read(c, ws, st, buf);
    } else if (op == 1) {
      encache_store_remove(st, key); /* absent or not, never an error */
    } else if (op % 3 == 0) {
      ts_fill(key, 1, obj, len);
      int rc = encache_store_write(st, key, NULL, 0, obj, len);
      if (rc == 0 || rc == ENCACHE_EEXIST)
        ws->writes++;
      else
        ws->write_fails++;
    } else {
      const char *keys[1] = {key};
      void *bufs[1] = {buf};
      size_t caps[1] = {256 << 10};
      int64_t res[1];
      int rc = encache_store_read(st, keys, 1, bufs, caps, res);
      count_read(ws, key, len, buf, rc, res[0]);
    }
    ws->ops++;
    __atomic_store_n(&ws->heartbeat_ms, now_ms(), __ATOMIC_RELEASE);
  }
}

/* Changes one byte of the index or of an object, at random, until killed. */
static void corrupter(campaign *c, const encache__shm_layout *l) {
  char path[256];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", c->name);
  int fd = open(path, O_RDWR);
  if (fd < 0)
    _exit(2);
  unsigned char *m = mmap(NULL, l->total_size, PROT_READ | PROT_WRITE,
                          MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    _exit(2);
  srand(c->seed ^ 0x5eed);
  for (uint64_t n = 0;; n++) {
    uint64_t off;
    switch (rand() % 8) {
    case 0: case 1: case 2: /* an entry */
      off = l->entries_off +
            (uint64_t)(rand() % (int)l->nentries) * l->entry_size +
            (uint64_t)(rand() % (int)l->entry_size);
      break;
    case 3: /* a bucket */
      off = l->buckets_off + (uint64_t)(rand() % (int)l->nbuckets) * 4;
      break;
    case 4: /* the ring head and the list heads */
      off = l->head_off + (uint64_t)(rand() % 24);
      break;
    default: /* an object's bytes */
      off = l->data_off + (uint64_t)rand() * 7919u % l->data_size;
      break;
    }
    m[off] ^= (unsigned char)(1u << (rand() % 8));
    __atomic_add_fetch(&c->stats[MAX_WORKERS].ops, 1, __ATOMIC_RELAXED);
    usleep(500 + (unsigned)(rand() % 2000));
  }
}

static void spawn(campaign *c, int w) {
  memset(&c->stats[w], 0, sizeof(c->stats[w]));
  c->stats[w].heartbeat_ms = now_ms();
  unsigned seed = c->seed * 1000003u + (unsigned)c->respawns++ * 31u + (unsigned)w;
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0)
    worker(c, w, seed);
  c->pid[w] = pid;
  c->stopped[w] = 0;
}

/* Adds a worker's counts to the totals of replaced workers. */
static void retire(campaign *c, int w) {
  worker_stats *ws = &c->stats[w];
  c->retired[0] += ws->ops;
  c->retired[1] += ws->hits;
  c->retired[2] += ws->misses;
  c->retired[3] += ws->unavailable;
  c->retired[4] += ws->writes;
  c->retired[5] += ws->write_fails;
  c->retired[6] += ws->wrong;
  if (ws->wrong > 0)
    fprintf(stderr, "campaign: WRONG HIT in worker %d: %s\n", w, ws->wrong_key);
}

/* Reaps worker w after we killed it, or finds that it died by itself. */
static void reap(campaign *c, int w, int we_killed) {
  int status;
  if (waitpid(c->pid[w], &status, 0) != c->pid[w])
    return;
  if (we_killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
    return;
  c->crashes++;
  if (WIFSIGNALED(status))
    fprintf(stderr, "campaign: CRASH: worker %d died of signal %d (%s)\n", w,
            WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    fprintf(stderr, "campaign: CRASH: worker %d exited with %d\n", w,
            WEXITSTATUS(status));
}

static int parse(campaign *c, int argc, char **argv) {
  const char *size = "16MiB";
  c->seconds = 20;
  c->workers = 4;
  c->keys = 200;
  c->corrupt = 1;
  c->seed = (unsigned)getpid();
  c->hang_ms = 3000;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("usage: encache_campaign [--seconds S] [--workers N] [--size SIZE]\n"
             "         [--keys N] [--corrupt on|off] [--seed N] [--hang-ms MS]\n"
             "An adversarial campaign on a private shm segment: workers publish\n"
             "and look up, are killed and stopped at random while a corrupter\n"
             "changes index and object bytes; every hit is checked byte for\n"
             "byte.  Exit 1 on any wrong hit, crash or hang.\n");
      exit(0);
    }
    if (v == NULL) {
      fprintf(stderr, "encache_campaign: %s needs a value (see --help)\n", a);
      return -1;
    }
    i++;
    char *end;
    if (strcmp(a, "--seconds") == 0)
      c->seconds = strtod(v, &end);
    else if (strcmp(a, "--workers") == 0)
      c->workers = (int)strtol(v, &end, 10);
    else if (strcmp(a, "--keys") == 0)
      c->keys = (int)strtol(v, &end, 10);
    else if (strcmp(a, "--seed") == 0)
      c->seed = (unsigned)strtoul(v, &end, 10);
    else if (strcmp(a, "--hang-ms") == 0)
      c->hang_ms = (unsigned)strtoul(v, &end, 10);
    else if (strcmp(a, "--size") == 0)
      size = v, end = (char *)v + strlen(v);
    else if (strcmp(a, "--corrupt") == 0 &&
             (strcmp(v, "on") == 0 || strcmp(v, "off") == 0))
      c->corrupt = strcmp(v, "on") == 0, end = (char *)v + strlen(v);
    else {
      fprintf(stderr, "encache_campaign: unknown option or value: %s %s\n", a, v);
      return -1;
    }
    if (*end != '\0' || end == v) {
      fprintf(stderr, "encache_campaign: %s %s: not a number\n", a, v);
      return -1;
    }
  }
  if (c->seconds <= 0 || c->seconds > 86400 || c->workers < 1 ||
      c->workers > MAX_WORKERS || c->keys < 1 || c->keys > 100000 ||
      c->hang_ms < 100) {
    fprintf(stderr, "encache_campaign: --seconds 0-86400, --workers 1-%d, "
                    "--keys 1-100000, --hang-ms >= 100\n", MAX_WORKERS);
    return -1;
  }
  snprintf(c->name, sizeof(c->name), "encache-campaign-%d", (int)getpid());
  snprintf(c->url, sizeof(c->url), "shm://%s?size=%s", c->name, size);
  return 0;
}

int main(int argc, char **argv) {
  static campaign c;
  if (parse(&c, argc, argv) < 0)
    return 2;
  c.stats = mmap(NULL, sizeof(worker_stats) * (MAX_WORKERS + 1),
                 PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c.stats == MAP_FAILED)
    return 2;
  encache_store *st = NULL;
  if (encache_store_open(c.url, &st) != 0) {
    fprintf(stderr, "encache_campaign: %s\n", encache_store_errmsg(st));
    return 2;
  }
  encache__shm_layout lay;
  encache__shm_test_layout(st, &lay);
  for (int w = 0; w < c.workers; w++)
    spawn(&c, w);
  pid_t corrupter_pid = -1;
  if (c.corrupt) {
    corrupter_pid = fork();
    if (corrupter_pid == 0)
      corrupter(&c, &lay);
  }
  srand(c.seed);
  uint64_t start = now_ms(), end = start + (uint64_t)(c.seconds * 1000);
  while (now_ms() < end) {
    usleep(20000 + (unsigned)(rand() % 40000));
    uint64_t t = now_ms();
    int w = rand() % c.workers;
    if (c.stopped[w] == 0 && rand() % 2 == 0) {
      kill(c.pid[w], SIGKILL);
      reap(&c, w, 1);
      retire(&c, w);
      c.kills++;
      spawn(&c, w);
    } else if (c.stopped[w] == 0) {
      kill(c.pid[w], SIGSTOP);
      c.stopped[w] = 1;
      c.stops++;
      c.stopped_since[w] = t;
      /* Mostly short; one stop in ten outlasts the lock timeout. */
      c.resume_ms[w] = t + (rand() % 10 == 0 ? 600 + (uint64_t)(rand() % 900)
                                             : 10 + (uint64_t)(rand() % 290));
    }
    for (int i = 0; i < c.workers; i++) {
      if (c.stopped[i] && t >= c.resume_ms[i]) {
        c.stats[i].heartbeat_ms = now_ms(); /* stopped time is not a hang */
        kill(c.pid[i], SIGCONT);
        c.stopped[i] = 0;
      }
      int status;
      if (waitpid(c.pid[i], &status, WNOHANG) == c.pid[i]) {
        c.crashes++;
        fprintf(stderr, "campaign: CRASH: worker %d ended by itself (%s %d)\n",
                i, WIFSIGNALED(status) ? "signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        retire(&c, i);
        spawn(&c, i);
        continue;
      }
      uint64_t hb = __atomic_load_n(&c.stats[i].heartbeat_ms, __ATOMIC_ACQUIRE);
      if (!c.stopped[i] && now_ms() > hb + c.hang_ms) {
        c.hangs++;
        fprintf(stderr, "campaign: HANG: worker %d made no progress for %llu ms\n",
                i, (unsigned long long)(now_ms() - hb));
        kill(c.pid[i], SIGKILL);
        reap(&c, i, 1);
        retire(&c, i);
        spawn(&c, i);
      }
    }
  }
  if (corrupter_pid > 0) {
    kill(corrupter_pid, SIGKILL);
    waitpid(corrupter_pid, NULL, 0);
  }
  for (int w = 0; w < c.workers; w++) {
    kill(c.pid[w], SIGKILL);
    if (c.stopped[w])
      kill(c.pid[w], SIGCONT);
    reap(&c, w, 1);
    retire(&c, w);
  }
  encache_store_stats ss = {.size = sizeof(ss)};
  memset(&ss, 0, sizeof(ss));
  int src = encache_store_stats_get(st, &ss);
  encache_store_close(st);
  encache_shm_destroy(c.name);
  uint64_t *r = c.retired;
  printf("campaign: %.1f s, %d workers, %d keys, seed %u\n"
         "  operations %llu: hits %llu (each checked byte for byte), misses "
         "%llu, unavailable %llu, writes %llu, failed writes %llu\n"
         "  kills %llu, stops %llu, corruptions %llu, repairs %llu%s\n"
         "  wrong hits %llu, crashes %llu, hangs %llu (bound %u ms)\n",
         (double)(now_ms() - start) / 1000, c.workers, c.keys, c.seed,
         (unsigned long long)r[0], (unsigned long long)r[1],
         (unsigned long long)r[2], (unsigned long long)r[3],
         (unsigned long long)r[4], (unsigned long long)r[5],
         (unsigned long long)c.kills, (unsigned long long)c.stops,
         (unsigned long long)c.stats[MAX_WORKERS].ops,
         (unsigned long long)(src == 0 ? ss.repairs : 0),
         src == 0 ? "" : " (the segment answered no stats)",
         (unsigned long long)r[6], (unsigned long long)c.crashes,
         (unsigned long long)c.hangs, c.hang_ms);
  int bad = r[6] > 0 || c.crashes > 0 || c.hangs > 0 || r[1] == 0;
  if (r[1] == 0)
    fprintf(stderr, "campaign: no hit at all: the campaign checked nothing\n");
  printf("campaign: %s\n", bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
