/* SPDX-License-Identifier: Apache-2.0 */
/*
 * owner.c: who may open an shm segment.  The segment's file lives in a
 * directory every local user can write (/dev/shm), under a predictable
 * name, so the file found there is checked before anything in it is
 * believed: a hostile user who makes it first could otherwise plant
 * objects that this user's encoders serve as hits, or truncate it under
 * their mappings (SIGBUS).
 *
 * The rule: the file is opened without following a symbolic link and
 * without blocking (a FIFO must not hang the open), and is accepted only
 * if it is a regular file that nobody outside its owner and group may
 * write, owned by this process's uid, or (the URL's group=, a deliberate
 * choice for encoders under several uids) whose group is the named one.
 * A group-writable file is accepted only with its group named.  A new
 * segment's file gets mode 0600, or with group= that group and 0660
 * (mode= overrides), whatever the umask.  A file this user may not open
 * at all is refused with the same messages (who owns it, and the way
 * out), not a bare "Permission denied".
 *
 * A creator that cannot give the new file to the group (not a member of
 * it) removes the file it made: left there, empty and 0600, it would
 * keep every member out until its owner or root removed it.  It removes
 * only its own: the file it created (O_CREAT | O_EXCL, open.c), still at
 * the name.
 */
#include "shm.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARE_HINT                                                           \
  "a segment shared between users names its group in the URL "             \
  "(?group=GROUP; docs/stores.md, \"Who may open a segment\")"

/* "uid N (name)" of uid, for messages. */
static void uid_text(uid_t uid, char *out, size_t size) {
  struct passwd pw, *res = NULL;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) == 0 && res != NULL)
    snprintf(out, size, "uid %u (%s)", (unsigned)uid, res->pw_name);
  else
    snprintf(out, size, "uid %u", (unsigned)uid);
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)  ? "a FIFO"
         : S_ISDIR(m) ? "a directory"
         : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) || S_ISBLK(m) ? "a device"
                                     : "not a plain file";
}

int encache__shm_parse_group(shm_store *s, const char *v) {
  char *end;
  unsigned long id = strtoul(v, &end, 10);
  if (end != v && *end == '\0' && id < (unsigned long)(gid_t)-1) {
    s->share_gid = (long)id;
    return 0;
  }
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(v, &gr, buf, sizeof(buf), &res) != 0 || res == NULL)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: group=%s: no such group (give a group "
                              "name or a numeric gid)", s->base.url, v);
  s->share_gid = (long)gr.gr_gid;
  return 0;
}

int encache__shm_parse_mode(shm_store *s, const char *v) {
  if (strcmp(v, "0600") != 0 && strcmp(v, "600") != 0 &&
      strcmp(v, "0660") != 0 && strcmp(v, "660") != 0)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: mode=%s: must be 0600 or 0660 (the "
                              "segment's owner and group read and write "
                              "it; others get no access)", s->base.url, v);
  s->create_mode = strstr(v, "660") != NULL ? 0660 : 0600;
  return 0;
}

int encache__shm_check_options(shm_store *s) {
  if (s->create_mode == 0660 && s->share_gid < 0)
    return encache_store_fail(&s->base, ENCACHE_EURL,
                              "%s: mode=0660 needs group= (the group the "
                              "segment is shared with)", s->base.url);
  if (s->create_mode == 0)
    s->create_mode = s->share_gid >= 0 ? 0660 : 0600;
  return 0;
}

/* Whether the named group (if any) is the file's. */
static int group_named(const shm_store *s, const struct stat *sb) {
  return s->share_gid >= 0 && (gid_t)s->share_gid == sb->st_gid;
}

/* The refusal (rc) of path, owned by who, not this process's user (me),
 * whose group the URL does not name. */
static int refuse_other_user(shm_store *s, int rc, const char *path,
                             const char *who, const char *me) {
  return encache_store_fail(&s->base, rc,
                            "%s: %s is owned by %s, not by this process's "
                            "user (%s), and not by a group the URL names: "
                            "refused; if it is not meant to be shared, its "
                            "owner (or root) can remove it: encache shm "
                            "destroy %s; " SHARE_HINT, s->base.url, path, who,
                            me, s->name);
}

int encache__shm_check_owner(shm_store *s, const char *path) {
  const char *u = s->base.url;
  struct stat sb;
  char who[300], me[300];
  if (fstat(s->fd, &sb) != 0)
    return encache_store_fail(&s->base, -errno, "%s: fstat %s: %s", u, path,
                              strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return encache_store_fail(&s->base, -EPERM,
                              "%s: %s is not a regular file (%s): refused; "
                              "someone else made it: remove it (rm %s) and "
                              "open again", u, path, file_kind(sb.st_mode),
                              path);
  uid_text(sb.st_uid, who, sizeof(who));
  uid_text(geteuid(), me, sizeof(me));
  if (sb.st_mode & S_IWOTH)
    return encache_store_fail(&s->base, -EPERM,
                              "%s: %s is owned by %s and writable by others "
                              "(mode 0%03o): refused, anyone could plant "
                              "or destroy objects in it; its owner (or root) "
                              "can remove it: encache shm destroy %s", u,
                              path, who, (unsigned)(sb.st_mode & 0777),
                              s->name);
  if (sb.st_uid != geteuid() && !group_named(s, &sb))
    return refuse_other_user(s, -EPERM, path, who, me);
  if ((sb.st_mode & S_IWGRP) && !group_named(s, &sb))
    return encache_store_fail(&s->base, -EPERM,
                              "%s: %s is writable by its group (gid %u, "
                              "mode 0%03o), which the URL does not name: "
                              "refused; " SHARE_HINT, u, path,
                              (unsigned)sb.st_gid,
                              (unsigned)(sb.st_mode & 0777));
  return 0;
}

int encache__shm_refuse_unopened(shm_store *s, const char *path) {
  struct stat sb;
  char who[300], me[300];
  if (lstat(path, &sb) != 0) /* gone meanwhile, or not where Linux puts it */
    return encache_store_fail(&s->base, -EACCES, "%s: shm_open %s: %s",
                              s->base.url, path, strerror(EACCES));
  uid_text(sb.st_uid, who, sizeof(who));
  uid_text(geteuid(), me, sizeof(me));
  if (sb.st_uid != geteuid() && !group_named(s, &sb))
    return refuse_other_user(s, -EACCES, path, who, me);
  return encache_store_fail(&s->base, -EACCES,
                            "%s: %s (owned by %s, group gid %u, mode 0%03o) "
                            "may not be opened by this process's user (%s): "
                            "permission denied; a member of its group (the "
                            "URL's group=) may open it when its mode is "
                            "0660; else its owner (or root) can remove it: "
                            "encache shm destroy %s", s->base.url, path, who,
                            (unsigned)sb.st_gid, (unsigned)(sb.st_mode & 0777),
                            me, s->name);
}

/* Removes the file this open created, if the name still holds it;
 * returns whether it did. */
static int unlink_created(shm_store *s) {
  char path[SHM_MAX_NAME + 32];
  struct stat mine, there;
  snprintf(path, sizeof(path), "/dev/shm/encache-%s", s->name);
  return s->created && fstat(s->fd, &mine) == 0 &&
         lstat(path, &there) == 0 && mine.st_dev == there.st_dev &&
         mine.st_ino == there.st_ino && encache_shm_destroy(s->name) == 0;
}

int encache__shm_own_new_file(shm_store *s) {
  if (s->create_mode == 0) /* opened on a descriptor: left as it is */
    return 0;
  int group = s->share_gid >= 0 &&
              fchown(s->fd, (uid_t)-1, (gid_t)s->share_gid) != 0;
  if (!group && fchmod(s->fd, (mode_t)s->create_mode) == 0)
    return 0;
  int err = errno;
  const char *gone = unlink_created(s) ? "; the file it made is removed" : "";
  if (group)
    return encache_store_fail(&s->base, -err,
                              "%s: cannot give the new segment to group %ld "
                              "(is this user a member of it?): %s%s",
                              s->base.url, s->share_gid, strerror(err), gone);
  return encache_store_fail(&s->base, -err, "%s: fchmod: %s%s", s->base.url,
                            strerror(err), gone);
}
