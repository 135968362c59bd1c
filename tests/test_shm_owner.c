/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who may open an shm segment: a hostile local user who makes the
 * segment's file first (world writable, a FIFO, a symlink, a segment of
 * their own with planted objects) is refused, never served; a segment
 * shared between uids is the URL's explicit choice (group=, mode=).
 *
 * The other user is real: a forked child that drops to uid and gid 65534
 * (nobody / nogroup on Debian) before it acts.  Switching uid needs root
 * (CI runs as root); as another user these tests note it and pass.
 */
#include "runner.h"
#include "store_util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_ID 65534u /* nobody / nogroup */

static char own_name[64];
static void own_cleanup(void) { encache_shm_destroy(own_name); }

/* A fresh segment name, destroyed at exit; its file's path in path. */
static const char *fresh_name(char *path, size_t size) {
  snprintf(own_name, sizeof(own_name), "encache-owner-%d", (int)getpid());
  encache_shm_destroy(own_name);
  atexit(own_cleanup);
  snprintf(path, size, "/dev/shm/encache-%s", own_name);
  return own_name;
}

static int open_msg(const char *url, char *msg, size_t size,
                    encache_store **keep) {
  encache_store *st = NULL;
  int rc = encache_store_open(url, &st);
  snprintf(msg, size, "%s", rc < 0 ? encache_store_errmsg(st) : "");
  if (rc == 0 && keep != NULL)
    *keep = st;
  else
    encache_store_close(st);
  return rc;
}

/* Runs fn(arg) in a child as uid, with gid as its group and its only
 * supplementary one; returns its exit status, or -1 where this process
 * cannot switch users (not root). */
static int as_user(unsigned uid, unsigned gid, int (*fn)(const char *),
                   const char *arg) {
  if (geteuid() != 0)
    return -1;
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    gid_t g = gid;
    if (setgroups(1, &g) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
      _exit(90);
    _exit(fn(arg));
  }
  int status = 0;
  ASSERT(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/* ... as uid/gid OTHER_ID. */
static int as_other_user(int (*fn)(const char *), const char *arg) {
  return as_user(OTHER_ID, OTHER_ID, fn, arg);
}

/* The hostile user: makes the segment, plants an object, opens it to all. */
static int plant(const char *url) {
  encache_store *st = NULL;
  if (encache_store_open(url, &st) != 0)
    return 1;
  unsigned char buf[256];
  ts_fill("planted", 7, buf, sizeof(buf));
  int rc = encache_store_write(st, "planted", NULL, 0, buf, sizeof(buf));
  encache_store_close(st);
  return rc == 0 ? 0 : 2;
}

static int plant_world_writable(const char *url) {
  int rc = plant(url);
  char path[128];
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", own_name);
  return rc != 0 ? rc : chmod(path, 0666) == 0 ? 0 : 3;
}

TEST(shm_segment_of_another_user_is_refused) {
  char path[128], url[256], msg[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  int made = as_other_user(plant_world_writable, url);
  if (made < 0) {
    printf("# not root: cannot act as another user; skipped\n");
    return;
  }
  ASSERT_EQ_INT(made, 0);
  /* The segment holds a valid planted object: opening must fail before
   * any of it can be served. */
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "owned by uid 65534");
  ASSERT_CONTAINS(msg, "writable by others");
  ASSERT_CONTAINS(msg, "encache shm destroy");
  /* Not world writable: still another user's. */
  ASSERT(chmod(path, 0600) == 0);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "owned by uid 65534");
  ASSERT_CONTAINS(msg, "not by this process's user (uid 0");
  ASSERT_CONTAINS(msg, "encache shm destroy");
  /* create=no and a group that is not the file's: the same refusal. */
  snprintf(url, sizeof(url), "shm://%s?create=no&group=0", name);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "owned by uid 65534");
}

TEST(shm_own_segment_writable_by_others_is_refused) {
  char path[128], url[256], msg[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  encache_store *st = NULL;
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), &st), 0);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  ASSERT_EQ_INT(sb.st_mode & 0777, 0600); /* the default: private */
  encache_store_close(st);
  ASSERT(chmod(path, 0606) == 0);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "writable by others (mode 0606)");
  ASSERT(chmod(path, 0660) == 0); /* group writable, no group= named */
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "writable by its group");
  ASSERT_CONTAINS(msg, "group=");
}

TEST(shm_fifo_or_symlink_at_the_name_is_refused) {
  char path[128], url[256], msg[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  ASSERT(mkfifo(path, 0600) == 0);
  /* A blocking open of a FIFO would hang here: it must answer at once. */
  alarm(10);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "not a regular file (a FIFO)");
  ASSERT(unlink(path) == 0);
  char target[160];
  snprintf(target, sizeof(target), "%s-target", path);
  int fd = open(target, O_CREAT | O_RDWR, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT(symlink(target, path) == 0);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -ELOOP);
  ASSERT_CONTAINS(msg, "a symbolic link");
  unlink(target);
  struct stat sb;
  ASSERT(lstat(target, &sb) != 0); /* nothing was made through the link */
  alarm(0);
}

/* The other user makes a segment shared with its group. */
static int make_group_segment(const char *url) { return plant(url); }

TEST(shm_group_shares_a_segment_on_purpose) {
  char path[128], url[256], msg[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(url, sizeof(url), "shm://%s?size=1MiB&group=%u", name, OTHER_ID);
  int made = as_other_user(make_group_segment, url);
  if (made < 0) {
    printf("# not root: cannot act as another user; skipped\n");
    return;
  }
  ASSERT_EQ_INT(made, 0);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  ASSERT_EQ_INT(sb.st_mode & 0777, 0660); /* group= makes it 0660 */
  ASSERT_EQ_INT(sb.st_gid, OTHER_ID);
  /* A member of the group who names it opens it and reads the object. */
  encache_store *st = NULL;
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), &st), 0);
  unsigned char buf[256];
  const char *keys[1] = {"planted"};
  void *bufs[1] = {buf};
  size_t caps[1] = {sizeof(buf)};
  int64_t res[1];
  ASSERT_EQ_INT(encache_store_read(st, keys, 1, bufs, caps, res), 0);
  ASSERT_EQ_INT(res[0], sizeof(buf));
  ASSERT(ts_verify("planted", buf, sizeof(buf)));
  encache_store_close(st);
  /* Without group= the same segment is refused. */
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  /* Open to others, even with its group named: refused. */
  ASSERT(chmod(path, 0662) == 0);
  snprintf(url, sizeof(url), "shm://%s?group=%u", name, OTHER_ID);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), -EPERM);
  ASSERT_CONTAINS(msg, "writable by others");
}

TEST(shm_group_and_mode_options) {
  char path[128], url[256], msg[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(url, sizeof(url), "shm://%s?group=no-such-group-x", name);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "group=no-such-group-x: no such group");
  snprintf(url, sizeof(url), "shm://%s?mode=0666", name);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "mode=0666: ");
  snprintf(url, sizeof(url), "shm://%s?mode=rw", name);
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), ENCACHE_EURL);
  snprintf(url, sizeof(url), "shm://%s?mode=0660", name); /* no group= */
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), NULL), ENCACHE_EURL);
  ASSERT_CONTAINS(msg, "needs group=");
  /* Our own group, by name, kept out by the mode. */
  struct group *gr = getgrgid(getegid());
  ASSERT(gr != NULL);
  snprintf(url, sizeof(url), "shm://%s?size=1MiB&group=%s&mode=0600", name,
           gr->gr_name);
  encache_store *st = NULL;
  ASSERT_EQ_INT(open_msg(url, msg, sizeof(msg), &st), 0);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0);
  ASSERT_EQ_INT(sb.st_mode & 0777, 0600);
  ASSERT_EQ_INT(sb.st_gid, getegid());
  encache_store_close(st);
}

/* A member of a group that has no other user here (MEMBER_ID, in group
 * SHARED_GID only); OTHER_ID is not in that group. */
#define MEMBER_ID 65533u
#define SHARED_GID 64999u

/* Opens url; 0 when its open fails and the message holds every one of the
 * needles (separated by '|' after the URL: "URL|needle|needle"), else 1
 * (opened) or 2 (another message, printed). */
static int open_fails_saying(const char *spec) {
  char url[256], msg[1024];
  const char *bar = strchr(spec, '|');
  snprintf(url, sizeof(url), "%.*s", (int)(bar - spec), spec);
  int rc = open_msg(url, msg, sizeof(msg), NULL);
  if (rc == 0)
    return 1;
  for (const char *n = bar; n != NULL; n = strchr(n + 1, '|')) {
    char needle[128];
    const char *end = strchr(n + 1, '|');
    snprintf(needle, sizeof(needle), "%.*s",
             (int)(end ? end - n - 1 : (long)strlen(n + 1)), n + 1);
    if (strstr(msg, needle) == NULL) {
      fprintf(stderr, "# uid %u: open %s: %d, \"%s\" (lacks \"%s\")\n",
              (unsigned)geteuid(), url, rc, msg, needle);
      return 2;
    }
  }
  return 0;
}

/* Opens url and writes an object; 0 on success (the message printed
 * otherwise). */
static int open_and_write(const char *url) {
  char msg[1024];
  encache_store *st = NULL;
  if (open_msg(url, msg, sizeof(msg), &st) != 0) {
    fprintf(stderr, "# uid %u: open %s: \"%s\"\n", (unsigned)geteuid(), url,
            msg);
    return 1;
  }
  unsigned char buf[64];
  ts_fill("member", 6, buf, sizeof(buf));
  int rc = encache_store_write(st, "member", NULL, 0, buf, sizeof(buf));
  encache_store_close(st);
  return rc == 0 ? 0 : 2;
}

/* issue 41 (b): a user outside the group who opens a group= segment first
 * cannot give it to the group; the file it made is removed (it was left,
 * empty and 0600, and kept every member out with a bare "Permission
 * denied"), and a member then makes the segment. */
TEST(shm_group_create_by_a_non_member_leaves_no_file) {
  char path[128], spec[512];
  const char *name = fresh_name(path, sizeof(path));
  snprintf(spec, sizeof(spec),
           "shm://%s?size=1MiB&group=%u|cannot give the new segment to "
           "group %u|is this user a member of it?|the file it made is "
           "removed",
           name, SHARED_GID, SHARED_GID);
  int made = as_other_user(open_fails_saying, spec);
  if (made < 0) {
    printf("# not root: cannot act as another user; skipped\n");
    return;
  }
  ASSERT_EQ_INT(made, 0);
  struct stat sb;
  errno = 0;
  ASSERT(lstat(path, &sb) != 0);
  ASSERT_EQ_INT(errno, ENOENT); /* no file left behind */
  char url[256];
  snprintf(url, sizeof(url), "shm://%s?size=1MiB&group=%u", name, SHARED_GID);
  ASSERT_EQ_INT(as_user(MEMBER_ID, SHARED_GID, open_and_write, url), 0);
  ASSERT(stat(path, &sb) == 0);
  ASSERT_EQ_INT(sb.st_uid, MEMBER_ID);
  ASSERT_EQ_INT(sb.st_gid, SHARED_GID);
  ASSERT_EQ_INT(sb.st_mode & 0777, 0660);
}

/* A file a member may not open at all (shm_open: EACCES) is refused with
 * the message that names its owner and the way out, not a bare
 * "shm_open ...: Permission denied". */
TEST(shm_segment_a_member_may_not_open_names_its_owner) {
  char path[128], url[256], spec[512];
  const char *name = fresh_name(path, sizeof(path));
  /* Another user's private segment (as a failed group= create used to
   * leave behind), opened by a member naming its group. */
  snprintf(url, sizeof(url), "shm://%s?size=1MiB", name);
  int made = as_other_user(plant, url);
  if (made < 0) {
    printf("# not root: cannot act as another user; skipped\n");
    return;
  }
  ASSERT_EQ_INT(made, 0);
  snprintf(spec, sizeof(spec),
           "shm://%s?size=1MiB&group=%u|/dev/shm/encache-%s is owned by "
           "uid 65534|not by this process's user (uid %u|encache shm "
           "destroy %s|group=GROUP",
           name, SHARED_GID, name, MEMBER_ID, name);
  ASSERT_EQ_INT(as_user(MEMBER_ID, SHARED_GID, open_fails_saying, spec), 0);
  /* Its group named, but not one the member is in (0660, group 65534). */
  ASSERT(chmod(path, 0660) == 0);
  snprintf(spec, sizeof(spec),
           "shm://%s?group=%u|owned by uid 65534|group gid %u, mode 0660|"
           "may not be opened by this process's user (uid %u|"
           "encache shm destroy %s",
           name, OTHER_ID, OTHER_ID, MEMBER_ID, name);
  ASSERT_EQ_INT(as_user(MEMBER_ID, SHARED_GID, open_fails_saying, spec), 0);
}
