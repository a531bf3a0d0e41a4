/*
 * Whether a file, or the directory that holds it, is safe from other users:
 * the one rule dspkd applies to every file it trusts (the persistent cache
 * and its SQLite companions, the configuration file, the Slurm jobs' state
 * file and its lock).  A file another user can write (a cache whose kernels
 * they replace, a configuration that makes them an admin), or a directory
 * in which they can rename or remove entries (a cache file swapped for a
 * link to any file), would let that user change what the daemon does for
 * everyone (outside probe 16 E1).  Library code: it describes, the daemon
 * decides and logs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"

/* See cache.h. */
int dspk__trust_stat(const struct stat *st, uid_t owner, int root_ok, const char *whose,
                     char *why, size_t len) {
  const char *w = whose ? whose : "";
  if (st->st_uid != owner && !(root_ok && st->st_uid == 0)) {
    if (root_ok && owner != 0)
      snprintf(why, len, "owned by uid %lu, not by root or %suid %lu", (unsigned long)st->st_uid,
               w, (unsigned long)owner);
    else
      snprintf(why, len, "owned by uid %lu, not by %suid %lu", (unsigned long)st->st_uid, w,
               (unsigned long)owner);
    return -1;
  }
  if (S_ISLNK(st->st_mode))
    return 0; /* a link's own mode is always 0777 and means nothing */
  if (S_ISDIR(st->st_mode) && (st->st_mode & (S_IWGRP | S_IWOTH)) &&
      !(st->st_mode & S_ISVTX)) {
    snprintf(why, len, "a directory writable by group or others without the sticky bit "
             "(mode %04o: they can rename or replace what is in it)",
             (unsigned)(st->st_mode & 07777));
    return -1;
  }
  if (!S_ISDIR(st->st_mode) && (st->st_mode & (S_IWGRP | S_IWOTH))) {
    snprintf(why, len, "writable by group or others (mode %04o)",
             (unsigned)(st->st_mode & 07777));
    return -1;
  }
  return 0;
}

/* See cache.h. */
int dspk__trust_dir_of(const char *path, uid_t owner, int root_ok, const char *whose,
                       char *dir, size_t dirlen, char *why, size_t len) {
  struct stat st;
  const char *slash = strrchr(path, '/');
  int n;

  if (!slash)
    n = snprintf(dir, dirlen, ".");
  else if (slash == path)
    n = snprintf(dir, dirlen, "/");
  else
    n = snprintf(dir, dirlen, "%.*s", (int)(slash - path), path);
  if (n < 0 || (size_t)n >= dirlen) {
    snprintf(why, len, "its directory's name is too long");
    return -1;
  }
  if (stat(dir, &st) != 0) {
    snprintf(why, len, "its directory %s: %s", dir, strerror(errno));
    return -1;
  }
  return dspk__trust_stat(&st, owner, root_ok, whose, why, len);
}
