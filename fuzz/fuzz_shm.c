/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzzes the shm Store's checks of a segment it did not write: a valid
 * segment with a few objects is built in a memory file, then the input
 * patches bytes of its header (all but the lock's cache line: a damaged
 * kind word is refused, tested in tests/test_shm_repair.c, and a damaged owner
 * word is a lock held forever, which the lock timeout bounds but would
 * make each input take seconds) and of its index; the Store must refuse the segment or repair it,
 * and every operation after that must stay in bounds.
 *
 * Input: repeated (u8 region, u16 offset, u8 value) patches; region 0 is
 * the header, 1 the entry table, 2 the buckets.
 */
#include "encache.h"
#include "shm/testing.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEG_SIZE (1u << 20)

static void exercise(encache_store *st) {
  char key[32];
  unsigned char buf[4096];
  const char *keys[4] = {"k0", "k1", "k2", "nope"};
  void *bufs[4] = {buf, buf + 1024, buf + 2048, buf + 3072};
  size_t caps[4] = {1024, 1024, 1024, 1024};
  int64_t res[4];
  int present[4];
  encache_store_exists(st, keys, 4, present);
  if (encache_store_read(st, keys, 4, bufs, caps, res) == 0)
    for (int i = 0; i < 4; i++)
      if (res[i] > 1024)
        __builtin_trap();
  for (int i = 0; i < 40; i++) {
    snprintf(key, sizeof(key), "new%d", i);
    memset(buf, i, sizeof(buf));
    encache_store_write(st, key, buf, 24, buf, ((size_t)i * 997) % 4000);
  }
  encache_store_remove(st, "k1");
  encache_store_stats stats = {.size = sizeof(stats)};
  if (encache_store_stats_get(st, &stats) == 0 &&
      stats.bytes_used > stats.capacity)
    __builtin_trap();
}

static int count_cb(const char *key, uint64_t len, void *arg) {
  (void)key;
  (void)len;
  ++*(int *)arg;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("encache-fuzz", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  encache_store *st = NULL;
  if (encache__shm_open_fd(fd, "fuzz", SEG_SIZE, &st) != 0) {
    encache_store_close(st);
    close(fd);
    return 0;
  }
  unsigned char obj[700];
  for (int i = 0; i < 3; i++) {
    char key[8];
    snprintf(key, sizeof(key), "k%d", i);
    memset(obj, 'a' + i, sizeof(obj));
    encache_store_write(st, key, obj, 24, obj + 24, sizeof(obj) - 24);
  }
  encache__shm_layout lay;
  encache__shm_test_layout(st, &lay);
  encache_store_close(st);

  unsigned char *map =
      mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return 0;
  }
  /* Geometry of the segment, as the Store laid it out. */
  uint64_t entries_off = lay.entries_off, buckets_off = lay.buckets_off,
           data_off = lay.data_off;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint16_t off = (uint16_t)(data[i + 1] | data[i + 2] << 8);
    uint64_t at;
    switch (data[i] % 3) {
    case 0: /* header, skipping the lock's cache line */
      at = off % (entries_off - 64);
      at = at < lay.lock_off ? at : at + 64;
      break;
    case 1:
      at = entries_off + off % (buckets_off - entries_off);
      break;
    default:
      at = buckets_off + off % (data_off - buckets_off);
      break;
    }
    map[at] = data[i + 3];
  }
  munmap(map, SEG_SIZE);

  st = NULL;
  if (encache__shm_open_fd(fd, "fuzz", SEG_SIZE, &st) == 0) {
    exercise(st);
    int n = 0;
    encache_store_list(st, NULL, count_cb, &n);
  }
  encache_store_close(st);
  close(fd);
  return 0;
}
