/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_mooncake.c: a stand-in for Mooncake's libmooncake_store.so, for
 * the tests of the Mooncake backend's wiring where no Mooncake runs: the
 * functions of its store C ABI that src/store/mooncake.c loads, over a
 * small in-process table of objects.  mooncake_store_remove_by_regex
 * matches with POSIX extended regexes (which read the escapes encache
 * writes as ECMAScript does), remembers the last pattern and force flag
 * (fake_mooncake_last_pattern, fake_mooncake_last_force) and answers
 * $FAKE_MOONCAKE_REGEX_RC instead when it is set.  Built without it
 * (FAKE_NO_REGEX) it is a library older than remove by regex.
 *
 * For the round-trip tests it counts the calls of each operation
 * (fake_mooncake_calls, indexed by enum fake_op) and answers an injected
 * code instead of its own when one is set (fake_mooncake_inject[op]: a
 * per-key code for the batch calls, the answer of put_from; 0 = none;
 * fake_mooncake_inject_batch[op] fails a whole batch call instead).  It
 * remembers the protocol setup was given (fake_mooncake_protocol).  One
 * lock serializes the operations (the publisher may write from several
 * threads).
 */
#include <pthread.h>
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_MAX 64

typedef struct fake {
  char *keys[FAKE_MAX];
  unsigned char *vals[FAKE_MAX];
  size_t lens[FAKE_MAX];
} fake;

char fake_mooncake_last_pattern[512];
int fake_mooncake_last_force = -1;
char fake_mooncake_protocol[32];

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;

enum fake_op { F_EXIST, F_GET, F_PUT, F_SIZE, F_REGISTER, F_UNREGISTER, F_OPS };
long fake_mooncake_calls[F_OPS];
int fake_mooncake_inject[F_OPS];
int fake_mooncake_inject_batch[F_OPS];

static int find(fake *f, const char *key) {
  for (int i = 0; i < FAKE_MAX; i++)
    if (f->keys[i] != NULL && strcmp(f->keys[i], key) == 0)
      return i;
  return -1;
}

static void drop(fake *f, int i) {
  free(f->keys[i]);
  free(f->vals[i]);
  f->keys[i] = NULL;
  f->vals[i] = NULL;
}

void *mooncake_store_create(void) { return calloc(1, sizeof(fake)); }

void mooncake_store_destroy(void *h) {
  for (int i = 0; i < FAKE_MAX; i++)
    drop(h, i);
  free(h);
}

int mooncake_store_setup(void *h, const char *a, const char *b, uint64_t c,
                         uint64_t d, const char *e, const char *f,
                         const char *g) {
  (void)h, (void)a, (void)b, (void)c, (void)d, (void)f, (void)g;
  strncpy(fake_mooncake_protocol, e ? e : "",
          sizeof(fake_mooncake_protocol) - 1);
  return 0;
}

int mooncake_store_health_check(void *h) { return h ? 0 : -1; }

static int put_from_locked(void *h, const char *key, void *buf, size_t size,
                            const void *cfg) {
  fake *f = h;
  (void)cfg;
  fake_mooncake_calls[F_PUT]++;
  if (fake_mooncake_inject[F_PUT] != 0)
    return fake_mooncake_inject[F_PUT];
  if (find(f, key) >= 0)
    return 0; /* Mooncake: a put never replaces */
  for (int i = 0; i < FAKE_MAX; i++)
    if (f->keys[i] == NULL) {
      f->keys[i] = strdup(key);
      f->vals[i] = malloc(size);
      memcpy(f->vals[i], buf, size);
      f->lens[i] = size;
      return 0;
    }
  return -200; /* NO_AVAILABLE_HANDLE */
}

/* Puts in flight at once, and the most seen (fake_mooncake_put_delay_us
 * makes each put last that long, outside the lock, as a transfer does). */
int fake_mooncake_put_delay_us, fake_mooncake_puts_in_flight_max;
/* Where the latest batch_get_into read its first 4 keys to. */
void *fake_mooncake_get_bufs[4];
static int puts_in_flight;

int mooncake_store_put_from(void *h, const char *key, void *buf, size_t size,
                            const void *cfg) {
  pthread_mutex_lock(&fake_mu);
  if (++puts_in_flight > fake_mooncake_puts_in_flight_max)
    fake_mooncake_puts_in_flight_max = puts_in_flight;
  int delay = fake_mooncake_put_delay_us;
  pthread_mutex_unlock(&fake_mu);
  if (delay > 0)
    usleep((useconds_t)delay);
  pthread_mutex_lock(&fake_mu);
  int r = put_from_locked(h, key, buf, size, cfg);
  puts_in_flight--;
  pthread_mutex_unlock(&fake_mu);
  return r;
}

/* Whether keys[k] comes again later in the batch: the real client keeps
 * one buffer per key (the last), so an earlier twin's buffer is left as it
 * was, yet answers success. */
static int later_twin(const char **keys, size_t n, size_t k) {
  for (size_t j = k + 1; j < n; j++)
    if (strcmp(keys[j], keys[k]) == 0)
      return 1;
  return 0;
}

static int batch_get_into_locked(void *h, const char **keys, void **bufs,
                                  const size_t *sizes, size_t n,
                                  int64_t *results) {
  fake_mooncake_calls[F_GET]++;
  for (size_t k = 0; k < n && k < 4; k++)
    fake_mooncake_get_bufs[k] = bufs[k];
  if (fake_mooncake_inject_batch[F_GET] != 0)
    return fake_mooncake_inject_batch[F_GET];
  for (size_t k = 0; k < n; k++) {
    int i = find(h, keys[k]);
    fake *f = h;
    if (fake_mooncake_inject[F_GET] != 0)
      results[k] = fake_mooncake_inject[F_GET];
    else if (i < 0)
      results[k] = -704;
    else if (f->lens[i] > sizes[k])
      results[k] = -600;
    else if (later_twin(keys, n, k)) /* as Mooncake: a map of key to buffer */
      results[k] = (int64_t)f->lens[i];
    else
      memcpy(bufs[k], f->vals[i], f->lens[i]), results[k] = (int64_t)f->lens[i];
  }
  return 0;
}

int mooncake_store_batch_get_into(void *h, const char **keys, void **bufs,
                                  const size_t *sizes, size_t n,
                                  int64_t *results) {
  pthread_mutex_lock(&fake_mu);
  int r = batch_get_into_locked(h, keys, bufs, sizes, n, results);
  pthread_mutex_unlock(&fake_mu);
  return r;
}

static int batch_is_exist_locked(void *h, const char **keys, size_t n,
                                  int *results) {
  fake_mooncake_calls[F_EXIST]++;
  if (fake_mooncake_inject_batch[F_EXIST] != 0)
    return fake_mooncake_inject_batch[F_EXIST];
  for (size_t k = 0; k < n; k++)
    results[k] = fake_mooncake_inject[F_EXIST] != 0
                     ? fake_mooncake_inject[F_EXIST]
                     : find(h, keys[k]) >= 0;
  return 0;
}

int mooncake_store_batch_is_exist(void *h, const char **keys, size_t n,
                                  int *results) {
  pthread_mutex_lock(&fake_mu);
  int r = batch_is_exist_locked(h, keys, n, results);
  pthread_mutex_unlock(&fake_mu);
  return r;
}

static int64_t get_size_locked(void *h, const char *key) {
  fake_mooncake_calls[F_SIZE]++;
  int i = find(h, key);
  return i < 0 ? -704 : (int64_t)((fake *)h)->lens[i];
}

int64_t mooncake_store_get_size(void *h, const char *key) {
  pthread_mutex_lock(&fake_mu);
  int64_t r = get_size_locked(h, key);
  pthread_mutex_unlock(&fake_mu);
  return r;
}

static int remove_locked(void *h, const char *key, int force) {
  (void)force;
  int i = find(h, key);
  if (i < 0)
    return -704;
  drop(h, i);
  return 0;
}

int mooncake_store_remove(void *h, const char *key, int force) {
  pthread_mutex_lock(&fake_mu);
  int r = remove_locked(h, key, force);
  pthread_mutex_unlock(&fake_mu);
  return r;
}

int mooncake_store_register_buffer(void *h, void *buf, size_t size) {
  (void)h, (void)buf, (void)size;
  pthread_mutex_lock(&fake_mu);
  fake_mooncake_calls[F_REGISTER]++;
  pthread_mutex_unlock(&fake_mu);
  return 0;
}

int mooncake_store_unregister_buffer(void *h, void *buf) {
  (void)h, (void)buf;
  pthread_mutex_lock(&fake_mu);
  fake_mooncake_calls[F_UNREGISTER]++;
  pthread_mutex_unlock(&fake_mu);
  return 0;
}

#ifndef FAKE_NO_REGEX
int64_t mooncake_store_remove_by_regex(void *h, const char *pattern,
                                       int force) {
  fake *f = h;
  strncpy(fake_mooncake_last_pattern, pattern,
          sizeof(fake_mooncake_last_pattern) - 1);
  fake_mooncake_last_force = force;
  const char *rc = getenv("FAKE_MOONCAKE_REGEX_RC");
  if (rc != NULL)
    return strtoll(rc, NULL, 10);
  regex_t rx;
  if (regcomp(&rx, pattern, REG_EXTENDED | REG_NOSUB) != 0)
    return -600; /* INVALID_PARAMS, as Mooncake answers a bad regex */
  int64_t removed = 0;
  for (int i = 0; i < FAKE_MAX; i++)
    if (f->keys[i] != NULL && regexec(&rx, f->keys[i], 0, NULL, 0) == 0) {
      drop(f, i);
      removed++;
    }
  regfree(&rx);
  return removed;
}
#endif
