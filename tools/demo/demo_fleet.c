/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_fleet.c: the demo's fleet of encoder processes: forks one child per
 * encoder (each runs demo_encoder_run and writes its report to a pipe),
 * shows progress while reading the pipes, waits for the children and sums
 * their reports.
 */
#include "demo.h"
#include "measure.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child's report, as read from its pipe. */
typedef struct inbox {
  char *buf;
  size_t len, cap;
  int fd;
} inbox;

/* Reads what fd has; returns 0 at end of file (or when out of memory). */
static int drain(inbox *in) {
  if (in->len == in->cap) {
    size_t cap = in->cap ? in->cap * 2 : 65536;
    char *buf = realloc(in->buf, cap);
    if (buf == NULL)
      return 0;
    in->buf = buf;
    in->cap = cap;
  }
  ssize_t r = read(in->fd, in->buf + in->len, in->cap - in->len);
  if (r > 0)
    in->len += (size_t)r;
  return r != 0 && (r > 0 || errno == EINTR);
}

static void show_progress(const demo_opts *o, demo_shared *sh,
                          const char *label, int tty, double t0, int final) {
  uint64_t done = 0, total = (uint64_t)o->encoders * (uint64_t)o->requests;
  for (int i = 0; i < o->encoders; i++)
    done += __atomic_load_n(&sh->done[i], __ATOMIC_RELAXED);
  if (tty)
    fprintf(stderr, "\r%-26s %5.1f%%  %" PRIu64 "/%" PRIu64 " requests  %.1f s%s",
            label, 100.0 * (double)done / (double)total, done, total,
            measure_now() - t0, final ? "\n" : "");
  else
    fprintf(stderr, "%s: %" PRIu64 "/%" PRIu64 " requests, %.1f s\n", label,
            done, total, measure_now() - t0);
}

/* Forks the encoders; their pipes' read ends land in in[].fd. */
static int start(const demo_opts *o, const image_set *set, int use_cache,
                 const char *revision, demo_shared *sh, pid_t *pids,
                 inbox *in) {
  fflush(NULL);
  for (int i = 0; i < o->encoders; i++) {
    int p[2];
    if (pipe(p) != 0)
      return -1;
    pids[i] = fork();
    if (pids[i] < 0)
      return -1;
    if (pids[i] == 0) {
      close(p[0]);
      _exit(demo_encoder_run(o, set, i, use_cache, revision, sh, p[1]));
    }
    close(p[1]);
    in[i].fd = p[0];
  }
  return 0;
}

/* Reads the reports as they come (a full pipe would block a child), and
 * shows progress meanwhile. */
static void gather(const demo_opts *o, demo_shared *sh, inbox *in,
                   const char *label, double t0) {
  int tty = isatty(2), open_fds = o->encoders;
  double last = measure_now();
  while (open_fds > 0) {
    struct pollfd pf[DEMO_MAX_ENCODERS];
    for (int i = 0; i < o->encoders; i++) {
      pf[i].fd = in[i].fd;
      pf[i].events = POLLIN;
      pf[i].revents = 0;
    }
    poll(pf, (nfds_t)o->encoders, 100);
    for (int i = 0; i < o->encoders; i++)
      if (in[i].fd >= 0 && (pf[i].revents & (POLLIN | POLLHUP)) &&
          !drain(&in[i])) {
        close(in[i].fd);
        in[i].fd = -1;
        open_fds--;
      }
    if (measure_now() - last >= (tty ? 0.1 : 2.0)) {
      show_progress(o, sh, label, tty, t0, 0);
      last = measure_now();
    }
  }
}

/* Adds one child's report (and latencies) to ph; -1 when malformed. */
static int collect(phase *ph, const inbox *in) {
  report r;
  if (in->len < sizeof(r))
    return -1;
  memcpy(&r, in->buf, sizeof(r));
  size_t nh = r.nhit_lat, nm = r.nmiss_lat;
  if (in->len != sizeof(r) + sizeof(double) * (nh + nm))
    return -1;
  memcpy(ph->hit_lat + ph->nhit, in->buf + sizeof(r), sizeof(double) * nh);
  memcpy(ph->miss_lat + ph->nmiss, in->buf + sizeof(r) + sizeof(double) * nh,
         sizeof(double) * nm);
  ph->nhit += nh;
  ph->nmiss += nm;
  /* Sum every counter (the report is all uint64_t up to encode_s). */
  uint64_t *dst = (uint64_t *)&ph->total;
  const uint64_t *src = (const uint64_t *)&r;
  size_t nu = offsetof(report, encode_s) / sizeof(uint64_t);
  for (size_t k = 0; k < nu; k++)
    dst[k] += src[k];
  ph->total.encode_s += r.encode_s;
  ph->total.lookup_wait_s += r.lookup_wait_s;
  if (r.distinct > ph->total.distinct)
    ph->total.distinct = r.distinct;
  ph->total.poisoned |= r.poisoned;
  ph->total.failed |= r.failed;
  return 0;
}

int demo_fleet_run(const demo_opts *o, const image_set *set, int use_cache,
                   const char *revision, phase *ph) {
  memset(ph, 0, sizeof(*ph));
  size_t cap = (size_t)o->encoders * (size_t)o->requests * DEMO_MAX_BATCH;
  ph->hit_lat = malloc(sizeof(double) * cap);
  ph->miss_lat = malloc(sizeof(double) * cap);
  demo_shared *sh = mmap(NULL, sizeof(demo_shared), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED || ph->hit_lat == NULL || ph->miss_lat == NULL) {
    demo_phase_free(ph);
    return -1;
  }
  memset(sh, 0, sizeof(*sh));
  pid_t pids[DEMO_MAX_ENCODERS];
  inbox in[DEMO_MAX_ENCODERS];
  memset(in, 0, sizeof(in));
  double t0 = measure_now();
  if (start(o, set, use_cache, revision, sh, pids, in) < 0) {
    munmap(sh, sizeof(demo_shared));
    demo_phase_free(ph);
    return -1;
  }
  const char *label = use_cache ? "with encache" : "baseline (no cache)";
  gather(o, sh, in, label, t0);
  for (int i = 0; i < o->encoders; i++) {
    int status;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ph->failed = 1;
  }
  ph->wall_s = measure_now() - t0;
  show_progress(o, sh, label, isatty(2), t0, 1);
  for (int i = 0; i < o->encoders; i++) {
    if (collect(ph, &in[i]) < 0)
      ph->failed = 1;
    free(in[i].buf);
  }
  munmap(sh, sizeof(demo_shared));
  return 0;
}

void demo_phase_free(phase *ph) {
  free(ph->hit_lat);
  free(ph->miss_lat);
  ph->hit_lat = ph->miss_lat = NULL;
}
