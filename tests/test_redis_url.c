/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Store's URL and secrets: URL errors, TTL and AUTH, the
 * password redacted from every URL and message, passwords from the URL,
 * a file or the environment, AUTH under allocation failure.
 * Tests say "skipped" and pass when redis-server is not installed; the
 * servers, clusters and shared helpers are in tests/redis_util.c.
 */
#include "runner.h"

#include "encache.h"
#include "redis_util.h"
#include "store_util.h"
#include "resp_fake.h"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TEST(redis_url_errors) {
  static const struct {
    const char *url, *needle;
  } bad[] = {
      {"redis://127.0.0.1", "expected redis://[user:password@]host:port[/db]"},
      {"redis://127.0.0.1:99999", "expected redis://"},
      {"redis://127.0.0.1:6379/x", "the database must be a number"},
      {"redis://127.0.0.1:6379?timeout_ms=0", "timeout_ms=0: must be a positive"},
      {"redis://127.0.0.1:6379?colour=red", "unknown option 'colour'"},
      {"redis://127.0.0.1:6379?window=10", "window=10: must be at least 64"},
      {"redis://127.0.0.1:6379?window_depth=0", "window_depth=0: must be 1 to"},
      {"redis://127.0.0.1:6379?window_threshold=1GiB", "must be a size"},
      {"redis://127.0.0.1:6379?window=1MB", "window=1MB: must be a size"},
      {"redis-cluster://", "expected host:port[,host:port...]"},
      {"redis-cluster://a:1,b", "seed 'b' is not host:port"},
      {"unix://relative", "expected unix:///path/to/socket"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(bad[i].url, &st), ENCACHE_EURL);
    ASSERT_CONTAINS(encache_store_errmsg(st), bad[i].needle);
    encache_store_close(st);
  }
  /* A refused connection is recoverable, with a message. */
  encache_store *st = NULL;
  char url[64];
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", free_port());
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  const char *keys[1] = {"x"};
  int pr[1];
  ASSERT_EQ_INT(encache_store_exists(st, keys, 1, pr), 0);
  ASSERT_EQ_INT(pr[0], ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "Connection refused");
  ASSERT_EQ_INT(encache_store_write(st, "x", NULL, 0, "y", 1), ENCACHE_EUNAVAIL);
  encache_store_close(st);
}

TEST(redis_ttl_and_auth) {
  redis_server rs;
  if (!redis_server_start(&rs, NULL))
    return;
  redisContext *c = connect_to(rs.port);
  redisReply *r = redisCommand(c, "CONFIG SET requirepass s3cret");
  freeReplyObject(r);
  redisFree(c);
  char url[160];
  encache_store *st = NULL;
  snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d", rs.port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  encache_store_close(st);
  snprintf(url, sizeof(url), "redis://:s3cret@127.0.0.1:%d/3?ttl_s=100",
           rs.port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1), 0);
  encache_store_close(st);
  c = connect_to(rs.port);
  r = redisCommand(c, "AUTH s3cret");
  freeReplyObject(r);
  r = redisCommand(c, "SELECT 3");
  freeReplyObject(r);
  r = redisCommand(c, "TTL t");
  ASSERT(r->type == REDIS_REPLY_INTEGER && r->integer > 90 && r->integer <= 100);
  freeReplyObject(r);
  redisFree(c);
  redis_server_stop(&rs);
}

TEST(redis_url_redact) {
  static const struct {
    const char *url, *shown;
  } cases[] = {
      {"redis://user:pass@host:6379", "redis://user:***@host:6379"},
      {"redis://:pass@host:6379/2?timeout_ms=5",
       "redis://:***@host:6379/2?timeout_ms=5"},
      {"redis://u:@h:1", "redis://u:***@h:1"},
      {"redis://host:6379", "redis://host:6379"},
      {"redis://admin@h:1", "redis://admin@h:1"}, /* a user, no password */
      {"redis://u:p@ss@h:1", "redis://u:***@h:1"}, /* '@' in the password */
      {"redis://u:p:a/s@h:1/3", "redis://u:***@h:1/3"},
      {"redis://u:p%40ss%3Aw@h:1", "redis://u:***@h:1"},
      {"redis://u:pa?ss@h:1?ttl_s=1", "redis://u:***@h:1?ttl_s=1"},
      {"redis://u:pw@h:1?password_file=/x@y&ttl_s=3",
       "redis://u:***@h:1?password_file=/x@y&ttl_s=3"},
      {"redis://h:1?password_file=/x@y", "redis://h:1?password_file=/x@y"},
      {"redis-cluster://u:pw@a:1,b:2,c:3?timeout_ms=9",
       "redis-cluster://u:***@a:1,b:2,c:3?timeout_ms=9"},
      {"redis-cluster://a:1,b:2", "redis-cluster://a:1,b:2"},
      {"unix:///run/a@b.sock?db=2", "unix:///run/a@b.sock?db=2"},
      {"postgres://u:pw@db/x", "postgres://u:***@db/x"},
      {"shm://encache?size=1GiB", "shm://encache?size=1GiB"},
      {"mooncake:", "mooncake:"},
      /* A tier, part by part: the remote's password too. */
      {"tier:shm://e?size=8GiB&create=no+redis://u:p+w@h:1?db=2",
       "tier:shm://e?size=8GiB&create=no+redis://u:***@h:1?db=2"},
      {"tier:redis://u:pw@a:1+redis://v:pw@b:2",
       "tier:redis://u:***@a:1+redis://v:***@b:2"},
      {"tier:shm://e+tier:shm://f+redis://u:pw@h:1",
       "tier:shm://e+tier:shm://f+redis://u:***@h:1"},
      {"tier:shm://e?size=1MiB", "tier:shm://e?size=1MiB"}, /* no '+' */
      {"", ""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char buf[128];
    int len = (int)strlen(cases[i].shown);
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, NULL, 0), len);
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, sizeof(buf)),
                  len);
    ASSERT_EQ_STR(buf, cases[i].shown);
    /* Exactly long enough, and one byte short. */
    ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, (size_t)len + 1),
                  len);
    ASSERT_EQ_STR(buf, cases[i].shown);
    if (len > 0) {
      memset(buf, 'x', sizeof(buf));
      ASSERT_EQ_INT(encache_store_url_redact(cases[i].url, buf, (size_t)len),
                    ENCACHE_ENOBUFS);
      ASSERT_EQ_INT(buf[0], 0);
    }
  }
  char one[1] = {'x'};
  ASSERT_EQ_INT(encache_store_url_redact("redis://h:1", one, 1),
                ENCACHE_ENOBUFS);
  ASSERT_EQ_INT(one[0], 0);
  ASSERT_EQ_INT(encache_store_url_redact(NULL, NULL, 0), ENCACHE_EINVAL);
  ASSERT_EQ_INT(encache_store_url_redact("redis://h:1", NULL, 5),
                ENCACHE_EINVAL);
}

/* Asserts that msg names the URL redacted and never shows secret. */
static void assert_redacted(const char *msg, const char *shown,
                            const char *secret) {
  ASSERT_CONTAINS(msg, shown);
  if (strstr(msg, secret) != NULL)
    test__fail(__FILE__, __LINE__, "the message shows the password: %s", msg);
}

TEST(redis_url_errors_never_show_the_password) {
  static const struct {
    const char *url, *shown, *needle;
  } bad[] = {
      {"redis://u:hunter2@127.0.0.1:1/x", "redis://u:***@127.0.0.1:1/x",
       "the database must be a number"},
      {"redis://:hunter2@127.0.0.1", "redis://:***@127.0.0.1",
       "expected redis://"},
      {"redis://u:hun@ter2@127.0.0.1:1?colour=red",
       "redis://u:***@127.0.0.1:1?colour=red", "unknown option 'colour'"},
      {"redis-cluster://u:hunter2@a:1,b", "redis-cluster://u:***@a:1,b",
       "seed 'b' is not host:port"},
      {"redis://u:hunter2@127.0.0.1:1?timeout_ms=0",
       "redis://u:***@127.0.0.1:1?timeout_ms=0", "must be a positive"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    encache_store *st = NULL;
    ASSERT_EQ_INT(encache_store_open(bad[i].url, &st), ENCACHE_EURL);
    ASSERT_CONTAINS(encache_store_errmsg(st), bad[i].needle);
    assert_redacted(encache_store_errmsg(st), bad[i].shown, "hunter2");
    encache_store_close(st);
  }
  /* An operation's failure, and the handle's URL. */
  char url[96], shown[96];
  int port = free_port();
  snprintf(url, sizeof(url), "redis-cluster://u:hunter2@127.0.0.1:%d", port);
  snprintf(shown, sizeof(shown), "redis-cluster://u:***@127.0.0.1:%d", port);
  encache_store *st = NULL;
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_STR(encache_store_url(st), shown);
  ASSERT_EQ_INT(encache_store_write(st, "x", NULL, 0, "y", 1),
                ENCACHE_EUNAVAIL);
  assert_redacted(encache_store_errmsg(st), shown, "hunter2");
  encache_store_stats stats = {.size = sizeof(stats)};
  ASSERT(encache_store_stats_get(st, &stats) < 0);
  assert_redacted(encache_store_errmsg(st), shown, "hunter2");
  encache_store_close(st);
}

/* Writes and reads back a key on the Store at url; returns 0 or the
 * first failure's code, whose message goes to write_read_why. */
static char write_read_why[512];

static int write_read(const char *url) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  char key[32], got[8];
  snprintf(key, sizeof(key), "auth-%d", (int)getpid());
  const char *keys[1] = {key};
  void *bufs[1] = {got};
  size_t caps[1] = {sizeof(got)};
  int64_t res[1] = {0};
  if (rc == 0) {
    encache_store_remove(st, key);
    rc = encache_store_write(st, key, NULL, 0, "v", 1);
  }
  if (rc == 0)
    rc = encache_store_read(st, keys, 1, bufs, caps, res);
  if (rc == 0 && res[0] != 1)
    rc = res[0] < 0 ? (int)res[0] : ENCACHE_EINVAL;
  /* The message of the failed call, before the handle goes. */
  snprintf(write_read_why, sizeof(write_read_why), "%s",
           encache_store_errmsg(st));
  encache_store_close(st);
  return rc;
}

static char pw_dir[64];

/* A new password file, holding text, in a fresh directory
 * (password_files_remove() removes them). */
static void password_file(char *path, size_t size, const char *text) {
  if (pw_dir[0] == '\0') {
    snprintf(pw_dir, sizeof(pw_dir), "/tmp/encache-pw-XXXXXX");
    ASSERT(mkdtemp(pw_dir) != NULL);
  }
  static int n;
  snprintf(path, size, "%s/pw%d", pw_dir, n++);
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL);
  fputs(text, f);
  fclose(f);
}

static void password_files_remove(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", pw_dir);
  ASSERT(pw_dir[0] != '\0' && system(cmd) == 0);
}

TEST(redis_auth_password_from_url_file_and_environment) {
  const char *pw = "s3cr3t:p@ss/w0rd"; /* ':', '@' and '/' raw in URLs */
  redis_server rs;
  if (!redis_server_start_auth(&rs, pw, NULL))
    return;
  char url[512], shown[128], file[128], bad[128], missing[160];
  unsetenv("ENCACHE_REDIS_PASSWORD");
  /* In the URL: raw, percent-encoded, with the default user. */
  snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", pw, rs.port);
  ASSERT_EQ_INT(write_read(url), 0);
  snprintf(url, sizeof(url),
           "redis://default:s3cr3t%%3Ap%%40ss%%2Fw0rd@127.0.0.1:%d", rs.port);
  ASSERT_EQ_INT(write_read(url), 0);
  /* In a file (newline stripped; CRLF too), and in the environment. */
  password_file(file, sizeof(file), "s3cr3t:p@ss/w0rd\r\nnext line\n");
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", rs.port,
           file);
  ASSERT_EQ_INT(write_read(url), 0);
  setenv("ENCACHE_REDIS_PASSWORD", pw, 1);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", rs.port);
  ASSERT_EQ_INT(write_read(url), 0);
  /* Precedence: the URL's, then the file's, then the environment's. */
  setenv("ENCACHE_REDIS_PASSWORD", "wrong-env", 1);
  ASSERT_EQ_INT(write_read(url), ENCACHE_EUNAVAIL);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", rs.port,
           file);
  ASSERT_EQ_INT(write_read(url), 0);
  password_file(bad, sizeof(bad), "wrong-file\n");
  snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d?password_file=%s", pw,
           rs.port, bad);
  ASSERT_EQ_INT(write_read(url), 0);
  unsetenv("ENCACHE_REDIS_PASSWORD");

  /* Refused: the message says AUTH and shows no password. */
  encache_store *st = NULL;
  snprintf(url, sizeof(url), "redis://u:wrong-url@127.0.0.1:%d", rs.port);
  snprintf(shown, sizeof(shown), "redis://u:***@127.0.0.1:%d", rs.port);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  assert_redacted(encache_store_errmsg(st), shown, "wrong-url");
  encache_store_close(st);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", rs.port,
           bad);
  ASSERT_EQ_INT(encache_store_open(url, &st), 0);
  ASSERT_EQ_INT(encache_store_write(st, "t", NULL, 0, "v", 1),
                ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "AUTH");
  assert_redacted(encache_store_errmsg(st), "redis://127.0.0.1", "wrong-file");
  encache_store_close(st);
  /* No password at all: the server's NOAUTH, named. */
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", rs.port);
  ASSERT_EQ_INT(write_read(url), ENCACHE_EUNAVAIL);
  ASSERT_CONTAINS(write_read_why, "NOAUTH");

  /* A password file that cannot be used: the open fails, naming the file
   * and never its content. */
  snprintf(missing, sizeof(missing), "%s.missing", file);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", rs.port,
           missing);
  ASSERT_EQ_INT(encache_store_open(url, &st), -ENOENT);
  ASSERT_CONTAINS(encache_store_errmsg(st), missing);
  encache_store_close(st);
  password_file(bad, sizeof(bad), "\nwrong-file\n");
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d?password_file=%s", rs.port,
           bad);
  ASSERT_EQ_INT(encache_store_open(url, &st), ENCACHE_EURL);
  ASSERT_CONTAINS(encache_store_errmsg(st), "the first line is empty");
  assert_redacted(encache_store_errmsg(st), bad, "wrong-file");
  encache_store_close(st);
  password_files_remove();
  redis_server_stop(&rs);
}

TEST(redis_auth_out_of_memory_is_an_error_never_a_connection_without_auth) {
  const char *pw = "oom-s3cret";
  redis_server rs;
  if (!redis_server_start_auth(&rs, pw, NULL))
    return;
  char url[512], file[128];
  password_file(file, sizeof(file), "oom-s3cret\n");
  for (int variant = 0; variant < 3; variant++) {
    if (variant == 0)
      snprintf(url, sizeof(url), "redis://default:%s@127.0.0.1:%d", pw,
               rs.port);
    else
      snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s%s", rs.port,
               variant == 1 ? "?password_file=" : "", variant == 1 ? file : "");
    if (variant == 2)
      setenv("ENCACHE_REDIS_PASSWORD", pw, 1);
    int opened = 0;
    for (long n = 1; !opened; n++) {
      ASSERT(n < 100);
      encache_store *st = NULL;
      test_alloc_fail_after(n);
      int rc = encache_store_open(url, &st);
      test_alloc_fail_after(0);
      if (rc == 0) {
        /* Opened: it authenticates (the server refuses anything else). */
        int w = encache_store_write(st, "oom", NULL, 0, "v", 1);
        if (w != 0 && w != ENCACHE_EEXIST)
          test__fail(__FILE__, __LINE__, "variant %d, allocation %ld: "
                     "write: %d: %s", variant, n, w, encache_store_errmsg(st));
        opened = 1;
      } else {
        ASSERT_EQ_INT(rc, ENCACHE_ENOMEM);
        ASSERT_CONTAINS(encache_store_errmsg(st), "out of memory");
        if (strstr(encache_store_errmsg(st), pw) != NULL)
          test__fail(__FILE__, __LINE__, "shows the password: %s",
                     encache_store_errmsg(st));
      }
      encache_store_close(st);
    }
    unsetenv("ENCACHE_REDIS_PASSWORD");
  }
  password_files_remove();
  redis_server_stop(&rs);
}
