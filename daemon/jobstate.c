/*
 * The Slurm jobs' state file (daemon/dspkd.h; docs/protocol.md, "Slurm
 * jobs"): the registered jobs (id, uid, GPU UUIDs) and the ended ones (id,
 * uid) outlive a restart of the daemon (systemctl restart, a package
 * upgrade, Restart=on-failure, the watchdog), so that a running job keeps
 * exactly its GPUs, a claim of an ended job stays EPERM, and the epilog of
 * a job registered before the restart ends it.
 *
 * The file is text, one record a line, rewritten whole after every
 * job.register and job.end that changed something:
 *
 *     dspkd-jobs 1
 *     job ID UID [UUID...]      a registered job, UUIDs normalised
 *     ended ID UID|-            an ended job, oldest first ("-": not registered)
 *     end N                     N: the records above; a file without it is cut short
 *
 * Written to PATH.tmp (O_EXCL, O_NOFOLLOW, mode 0600), fsynced, renamed over
 * PATH, and the directory fsynced; never over a file that is not a state
 * file (replaceable: a configuration file that job_state names by a slip
 * would be lost), which fails job.register and job.end with EIO instead.  Read once at start; a file that is a
 * symlink, not a regular file, not owned by the daemon's euid, writable by
 * group or others, unreadable, or not exactly the format above is taken as
 * lost state: nothing of it is used, the daemon logs why, and fails closed
 * (jobs_fail_closed: a connection without a registered job gets the cpu
 * only, as with job_required, until the daemon stops).  A directory that
 * other users can change (dir_trusted) refuses the start, --end-job, a
 * reload naming it, and each write.
 *
 * A running daemon holds an exclusive flock(2) on PATH.lock from before it
 * reads the file until it exits, and checks before each rewrite that the
 * lock file is still the inode it locked (EIO when not: its lock no longer
 * keeps anyone off the file).  A PATH.lock that is not empty (another
 * daemon's state file) is never taken for the lock, nor a PATH that another
 * process holds an flock on for a state file (another daemon's lock file),
 * nor a PATH with other hard links (the lock guards a name, not the file);
 * daemon/paths.c refuses the names of such files (.lock, .tmp).  A reload
 * whose job_state names another file runs the same checks on it
 * (dspkd_jobstate_reload_check).  dspkd --end-job ID (no daemon started:
 * the epilog of a job that ended while no daemon listened) takes it without
 * waiting, reads the file as the start does (what is there but is not a
 * regular file is refused for that reason, never taken for no file),
 * marks the job ended as job.end would and writes the file back with its
 * owner, group and mode;
 * without that the next start would register the job again, for good.
 * Loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "daemon/config.h"
#include "daemon/dspkd.h"
#include "daemon/log.h"
#include "daemon/paths.h"

#define STATE_MAGIC "dspkd-jobs 1"
#define STATE_MAX_BYTES (16u << 20) /* 4096 jobs of 64 UUIDs take under 11 MiB */
#define STATE_MAX_JOBS 4096         /* daemon/jobs.c's MAX_JOBS */

bool dspkd_jobs_required(const struct dspkd *d) {
  return d->cfg.job_required || d->jobs_fail_closed;
}

/* ---- where ------------------------------------------------------------- */

/* Names the file: d->job_state, absolute (a relative job_state is the
 * current directory's: the start directory, before a detached daemon
 * leaves it).  0; 1 when none can be named (logged: job.register and
 * job.end then fail with EIO); -1 when the current directory is unknown
 * (logged). */
static int name_file(struct dspkd *d) {
  char path[sizeof d->job_state];
  int n;

  d->job_state[0] = '\0';
  if (!d->cfg.job_state) /* dspkd_paths_start names it, default or not */
    return 1;
  n = snprintf(path, sizeof path, "%s", d->cfg.job_state);
  if (n < 0 || (size_t)n >= sizeof path) {
    dspkd_error("Slurm jobs: the state file's path is too long; job.register and job.end "
                "fail with EIO");
    return 1;
  }
  return dspkd_config_abspath("job_state", path, d->job_state, sizeof d->job_state);
}

/* The directory of path (absolute) in dir. */
static void dir_of(const char *path, char *dir, size_t len) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, len, ".");
  else
    snprintf(dir, len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

/* The state file's directory exists and is a directory, so that the
 * first job.register does not find out (a typo in job_state).  0, or -1
 * with why ("its directory DIR: REASON (...)", "DIR is not a directory
 * (...)"). */
static int check_dir(const char *path, char *why, size_t len) {
  char dir[sizeof((struct dspkd *)0)->job_state];
  struct stat st;

  dir_of(path, dir, sizeof dir);
  if (stat(dir, &st) != 0) {
    snprintf(why, len, "its directory %s: %s (create it, or set job_state)", dir,
             strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, len, "%s is not a directory (set job_state)", dir);
    return -1;
  }
  return 0;
}

/* Whether the directory that holds the state file path is safe from every
 * user but owner and root (dspk__trust_stat, the rule of every file dspkd
 * trusts: owned by one of them, not writable by group or others unless
 * sticky).  Another user who can rename entries there could move the file
 * aside and put it back after a job.end, and the next start registered the
 * ended job again; or swap the lock file and the temporary file (probe 22
 * E2).  A directory that cannot be looked at passes here (check_dir, or
 * the open that follows, says why).  0, or -1 with why. */
static int dir_trusted(const char *path, uid_t owner, char *why, size_t len) {
  char dir[sizeof((struct dspkd *)0)->job_state], w[200];
  struct stat st;

  dir_of(path, dir, sizeof dir);
  if (stat(dir, &st) != 0 || dspk__trust_stat(&st, owner, 1, "dspkd's ", w, sizeof w) == 0)
    return 0;
  snprintf(why, len, "its directory %s is %s, so an older state file could be put back "
           "and ended jobs registered again: chown the directory to root or dspkd's user "
           "and chmod go-w it (or +t), or set job_state to a path in such a directory", dir,
           w);
  return -1;
}

/* Whether the regular file at path has other names (hard links): a lock
 * guards a path, so a daemon on another name of a running daemon's state
 * file would take the file for its own, its jobs with it (outside probe 15
 * F5).  dspkd itself never links it (it renames a new file over it).  The
 * count in *n when so. */
static bool linked(const char *path, unsigned long *n) {
  struct stat st;
  if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink < 2)
    return false;
  *n = (unsigned long)st.st_nlink;
  return true;
}

#define LINKED_WHY "it has %lu hard links (other names of the file: another dspkd's state " \
                   "file, whose lock guards its own name only, at worst): remove the other " \
                   "links, or give job_state another path"

/* Why a file that lstat(2) found to be of mode, not a regular file, is
 * refused: the words of the start (open_safe, lock_take) and of dspkd
 * --end-job alike.  A static string. */
static const char *not_regular(mode_t mode) {
  if (S_ISLNK(mode))
    return "it is a symbolic link";
  if (S_ISDIR(mode))
    return "not a regular file (a directory)";
  if (S_ISFIFO(mode))
    return "not a regular file (a FIFO)";
  if (S_ISSOCK(mode))
    return "not a regular file (a socket)";
  if (S_ISCHR(mode))
    return "not a regular file (a character device)";
  if (S_ISBLK(mode))
    return "not a regular file (a block device)";
  return "not a regular file";
}

/* Why a file dspkd opens was refused with EACCES (a mode that shuts out
 * its own user, such as 000: one made under umask 0777 by a dspkd before
 * probe 22 E2), in why: the system's words, the mode, the owner, what
 * dspkd must do with the file (what: "read", ...) and the fix. */
static void unreadable(const struct stat *st, const char *what, const char *fix, char *why,
                       size_t len) {
  snprintf(why, len, "%s (mode %04o, owner uid %lu; dspkd runs as uid %lu and must %s it): "
           "%s", strerror(EACCES), (unsigned)(st->st_mode & 07777),
           (unsigned long)st->st_uid, (unsigned long)geteuid(), what, fix);
}

/* Whether the file open on fd begins "dspkd-jobs " (a dspkd state file of
 * any version). */
static bool is_state_file(int fd) {
  static const char magic[] = "dspkd-jobs ";
  char head[sizeof magic - 1];
  ssize_t n;

  do
    n = pread(fd, head, sizeof head, 0);
  while (n < 0 && errno == EINTR);
  return (size_t)n == sizeof head && memcmp(head, magic, sizeof head) == 0;
}

/* ---- the lock ----------------------------------------------------------- */

/* PATH.lock, beside the state file: a running daemon holds an exclusive
 * flock(2) on it for its whole life, taken before it reads the file, so
 * that dspkd --end-job (which takes it without waiting) never changes the
 * file under a daemon, whose next write would bring the job back.  The
 * file is empty; it must be a regular file of owner (created so, mode
 * 0600), not writable by group or others, not a symbolic link, and empty
 * (dspkd never writes it: one with text is another file, another daemon's
 * state file at worst, whose next write would replace the lock).  The
 * locked descriptor; -2 when another process holds the lock; -3 when it
 * does not exist and create is false; -1 with why. */
static int lock_take(const char *state, uid_t owner, gid_t group, bool create, char *why,
                     size_t len) {
  char path[sizeof((struct dspkd *)0)->job_state + 8];
  struct stat st;
  int fd;

  snprintf(path, sizeof path, "%s.lock", state);
  /* Looked at before it is opened: a FIFO, a device or a socket there is
   * refused for what it is, not opened (a socket's open says only ENXIO). */
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    snprintf(why, len, "%s", not_regular(st.st_mode));
    return -1;
  }
  for (int tries = 0;; tries++) {
    fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 || errno != ENOENT)
      break;
    if (!create)
      return -3;
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    /* 0600 whatever the umask: open(2) gives 0600 & ~umask, mode 000
     * under umask 0777, which refused every later start of a daemon not
     * run as root (probe 22 E2). */
    if (fd >= 0 && fchmod(fd, 0600) != 0) {
      snprintf(why, len, "fchmod 0600: %s", strerror(errno));
      close(fd);
      unlink(path);
      return -1;
    }
    if (fd >= 0 && owner != geteuid() && fchown(fd, owner, group) != 0) {
      snprintf(why, len, "fchown to uid %lu: %s", (unsigned long)owner, strerror(errno));
      close(fd);
      unlink(path);
      return -1;
    }
    if (fd >= 0 || errno != EEXIST || tries)
      break; /* EEXIST: made meanwhile, opened once more */
  }
  if (fd < 0) {
    int e = errno;
    if (e == EACCES && lstat(path, &st) == 0)
      unreadable(&st, "read and write",
                 "chmod 600 it, or remove it (it holds nothing: dspkd makes it again)", why,
                 len);
    else
      snprintf(why, len, "%s", e == ELOOP ? "it is a symbolic link" : strerror(e));
    return -1;
  }
  if (fstat(fd, &st) != 0)
    snprintf(why, len, "fstat: %s", strerror(errno));
  else if (!S_ISREG(st.st_mode))
    snprintf(why, len, "%s", not_regular(st.st_mode));
  else if (dspk__trust_stat(&st, owner, 0, NULL, why, len) != 0)
    ; /* owned by another user, or writable by group or others */
  else if (st.st_size != 0)
    snprintf(why, len, "not empty (%s): not a lock file dspkd made, which is empty; "
             "give each daemon a state file of its own", is_state_file(fd)
                 ? "a dspkd state file: another daemon's, whose next write would replace "
                   "this lock"
                 : "another program's file");
  else if (flock(fd, LOCK_EX | LOCK_NB) == 0)
    return fd;
  else if (errno == EWOULDBLOCK) {
    close(fd);
    return -2;
  } else
    snprintf(why, len, "flock: %s", strerror(errno));
  close(fd);
  return -1;
}

/* Whether another process holds an flock(2) on the regular file at path
 * (tried shared, without waiting, and let go at once): such a file is a
 * lock file (another daemon's PATH.lock, named as job_state by a slip),
 * never a state file, which nothing locks; taken for an empty state file,
 * the first write renamed a state file over it and the other daemon's lock
 * was gone. */
static bool held_by_other(const char *path) {
  struct stat st;
  bool held;
  int fd;

  /* Looked at first: what is not a regular file (a device, a FIFO) is
   * never opened here; the read refuses it for what it is. */
  if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return false;
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return false;
  held = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_SH | LOCK_NB) != 0 &&
         errno == EWOULDBLOCK;
  close(fd); /* lets a shared lock taken here go */
  return held;
}

#define HELD_WHY "another process holds an flock(2) on it: it is a lock file (another " \
                 "dspkd's PATH.lock), not a state file"

/* Records the inode of the lock held on fd, which save checks before each
 * rewrite.  0, or -1 (fstat failed). */
static int note_lock(struct dspkd *d, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return -1;
  d->job_lock_held = true;
  d->job_lock_dev = st.st_dev;
  d->job_lock_ino = st.st_ino;
  return 0;
}

int dspkd_jobstate_start(struct dspkd *d) {
  char why[sizeof d->job_state + 256] = "";
  unsigned long links;
  int fd, r = name_file(d);

  if (r != 0) {
    d->job_state[0] = '\0';
    return r < 0 ? -1 : 0; /* no file: nothing to guard */
  }
  if (check_dir(d->job_state, why, sizeof why) != 0) {
    dspkd_error("Slurm jobs: the state file %s cannot be written: %s", d->job_state, why);
    return -1;
  }
  if (dir_trusted(d->job_state, geteuid(), why, sizeof why) != 0) {
    dspkd_error("Slurm jobs: refusing the state file %s: %s; not starting", d->job_state, why);
    return -1;
  }
  /* A dspkd --end-job holds the lock for one rewrite of the file: waited
   * for, up to 2 s; another daemon holds it for good. */
  for (int i = 0; (fd = lock_take(d->job_state, geteuid(), getegid(), true, why,
                                  sizeof why)) == -2 && i < 200; i++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  if (fd == -2) {
    dspkd_error("Slurm jobs: another dspkd uses the state file %s (it holds %s.lock); not "
                "starting: give each daemon its own job_state", d->job_state, d->job_state);
    return -1;
  }
  if (fd >= 0 && note_lock(d, fd) != 0) {
    snprintf(why, sizeof why, "fstat: %s", strerror(errno));
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    dspkd_error("Slurm jobs: cannot lock %s.lock: %s; not starting (dspkd --end-job could "
                "then change the state file %s under this daemon)", d->job_state, why,
                d->job_state);
    return -1;
  }
  /* Checked with the lock held, so that a daemon on that lock file cannot
   * be starting meanwhile unseen. */
  if (held_by_other(d->job_state)) {
    dspkd_error("Slurm jobs: refusing the state file %s: " HELD_WHY "; not starting: give "
                "job_state another path", d->job_state);
    return -1;
  }
  if (linked(d->job_state, &links)) {
    dspkd_error("Slurm jobs: refusing the state file %s: " LINKED_WHY "; not starting",
                d->job_state, links);
    return -1;
  }
  /* Held, never closed: the kernel lets it go when the daemon exits. */
  dspkd_config_job_state_check(dspkd_jobstate_reload_check);
  return 0;
}

int dspkd_jobstate_reload_check(const struct dspkd *d, const char *path, bool dir, char *why,
                                size_t len) {
  char reason[sizeof d->job_state + 256] = "";
  unsigned long links;
  int fd;

  /* The file the daemon runs on: its lock is this daemon's. */
  if (d->job_state[0] && dspkd_paths_same(path, d->job_state))
    return 0;
  if (dir && check_dir(path, reason, sizeof reason) != 0) {
    snprintf(why, len, "the state file %s cannot be written: %s", path, reason);
    return -1;
  }
  if (dir_trusted(path, geteuid(), reason, sizeof reason) != 0) {
    snprintf(why, len, "the next start refuses the state file %s: %s", path, reason);
    return -1;
  }
  /* The lock as the start takes it, let go at once; not made when absent
   * (no daemon holds it then). */
  fd = lock_take(path, geteuid(), getegid(), false, reason, sizeof reason);
  if (fd >= 0)
    close(fd);
  if (fd == -2) {
    snprintf(why, len, "another process holds %s.lock: another dspkd uses the state file "
             "%s (or its epilog's dspkd --end-job does now), which the next start refuses: "
             "give each daemon its own job_state", path, path);
    return -1;
  }
  if (fd == -1) {
    snprintf(why, len, "the next start cannot lock %s.lock: %s", path, reason);
    return -1;
  }
  if (held_by_other(path)) {
    snprintf(why, len, "job_state %s: " HELD_WHY, path);
    return -1;
  }
  if (linked(path, &links)) {
    snprintf(why, len, "job_state %s: " LINKED_WHY, path, links);
    return -1;
  }
  return 0;
}

/* ---- writing ------------------------------------------------------------ */

/* The file's text for d's jobs, in a malloc'd buffer.  0 or -1 (errno). */
static int state_text(const struct dspkd *d, char **buf, size_t *len) {
  FILE *f = open_memstream(buf, len);
  unsigned long n = 0;

  if (!f)
    return -1;
  fprintf(f, STATE_MAGIC "\n");
  for (const struct djob *j = d->jobs; j; j = j->next) {
    if (j->ended)
      continue;
    fprintf(f, "job %" PRIu64 " %lu", j->id, (unsigned long)j->uid);
    for (int i = 0; i < j->ndevs; i++)
      fprintf(f, " %s", j->uuid[i]);
    fputc('\n', f);
    n++;
  }
  for (unsigned k = 0; k < d->nended; k++) {
    uint64_t id = d->ended_jobs[k];
    uid_t uid = d->ended_uids[k];
    if (uid == (uid_t)-1)
      fprintf(f, "ended %" PRIu64 " -\n", id);
    else
      fprintf(f, "ended %" PRIu64 " %lu\n", id, (unsigned long)uid);
    n++;
  }
  fprintf(f, "end %lu\n", n);
  if (ferror(f)) {
    fclose(f);
    free(*buf);
    *buf = NULL;
    errno = ENOMEM;
    return -1;
  }
  return fclose(f) == 0 ? 0 : -1;
}

/* fsync of path's directory, so that the rename is on disk.  0 or -1. */
static int sync_dir(const char *path) {
  char dir[sizeof((struct dspkd *)0)->job_state];
  int fd, r;

  dir_of(path, dir, sizeof dir);
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  r = fsync(fd);
  close(fd);
  return r;
}

/* Writes text to fd, syncs and closes it (also on error).  0, or -1 with
 * errno and the step that failed in *step. */
static int write_synced(int fd, const char *text, size_t len, const char **step) {
  FILE *f = fdopen(fd, "w");
  int e;

  if (!f) {
    e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  *step = "write";
  if (fwrite(text, 1, len, f) == len && fflush(f) == 0) {
    *step = "fsync";
    if (fsync(fd) == 0) {
      *step = "close";
      return fclose(f) == 0 ? 0 : -1;
    }
  }
  e = errno;
  fclose(f);
  errno = e;
  return -1;
}

/* Whether path may be replaced by a state file: it does not exist, or it
 * is a regular file that is empty or whose first line begins "dspkd-jobs "
 * (a dspkd state file of any version).  Anything else, a file of another
 * program that job_state names by a slip, is never replaced: it would be
 * lost.  0 (it may), or -1 with errno (EEXIST: it is not a state file) and
 * what in *step. */
#define NOT_STATE "not a state file"
#define NOT_OURS "not its temporary file"
static int replaceable(const char *path, const char **step) {
  static const char magic[] = "dspkd-jobs ";
  char head[sizeof magic - 1];
  struct stat st;
  ssize_t n;
  int fd;

  if (lstat(path, &st) != 0)
    return errno == ENOENT ? 0 : (*step = "stat", -1);
  if (!S_ISREG(st.st_mode)) {
    *step = "replace a file that is not a regular one";
    errno = EEXIST;
    return -1;
  }
  *step = "read the file to be replaced";
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? 0 : -1;
  do
    n = pread(fd, head, sizeof head, 0);
  while (n < 0 && errno == EINTR);
  close(fd);
  if (n < 0)
    return -1;
  if (n == 0 || ((size_t)n == sizeof head && memcmp(head, magic, sizeof head) == 0))
    return 0;
  *step = NOT_STATE;
  errno = EEXIST;
  return -1;
}

/* Writes text to path through path.tmp: mode 0600, the daemon's, or with
 * keep's owner, group and mode (NULL: the former); never over a file that
 * is not a state file (replaceable).  0, or -1 with errno and the step
 * that failed in *step. */
static int replace_file(const char *path, const char *text, size_t len,
                        const struct stat *keep, const char **step) {
  char tmp[sizeof((struct dspkd *)0)->job_state + 8];
  int fd, e;

  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  /* A PATH.tmp left by a write cut short is this daemon's (a regular file
   * of its user, or of keep's owner, which it gives the file) and is
   * removed; anything else there (another user's file in a sticky
   * directory, a symbolic link) is not dspkd's to remove (probe 20 E1). */
  struct stat st;
  if (lstat(tmp, &st) == 0 &&
      (!S_ISREG(st.st_mode) ||
       (st.st_uid != geteuid() && (!keep || st.st_uid != keep->st_uid)))) {
    *step = NOT_OURS;
    errno = EEXIST;
    return -1;
  }
  *step = "remove";
  if (unlink(tmp) != 0 && errno != ENOENT)
    return -1;
  *step = "create";
  fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return -1;
  *step = "chown";
  if (keep && (keep->st_uid != geteuid() || keep->st_gid != getegid()) &&
      fchown(fd, keep->st_uid, keep->st_gid) != 0) {
    e = errno;
    close(fd);
    goto fail;
  }
  /* 0600 whatever the umask (open(2) gave 0600 & ~umask: a mode 000
   * state file under umask 0777, probe 22 E2), or keep's mode (dspkd
   * --end-job rewriting the daemon's file). */
  *step = "chmod";
  if (fchmod(fd, keep ? keep->st_mode & 0777 : 0600) != 0) {
    e = errno;
    close(fd);
    goto fail;
  }
  if (write_synced(fd, text, len, step) != 0) {
    e = errno;
    goto fail;
  }
  /* Never over what is not a state file: another daemon's socket, the
   * configuration file, another program's file. */
  if (replaceable(path, step) != 0) {
    e = errno;
    goto fail;
  }
  *step = "rename";
  if (rename(tmp, path) != 0) {
    e = errno;
    goto fail;
  }
  /* The new file is in place: memory and the file agree, so a directory
   * that cannot be synced is a warning, not a failed call. */
  if (sync_dir(path) != 0)
    dspkd_warn("Slurm jobs: %s written, but its directory could not be synced: %s", path,
               strerror(errno));
  return 0;
fail:
  unlink(tmp);
  errno = e;
  return -1;
}

/* Whether the lock file at job_state.lock is no longer the inode d locked
 * (replaced, renamed or removed: another daemon that took it for its state
 * file, or a hand): d's flock then guards nothing, and dspkd --end-job or a
 * daemon started on the same file could change it under d, whose next
 * write would undo that.  The message in msg when so. */
static bool lock_moved(const struct dspkd *d, char *msg, size_t len) {
  char lock[sizeof d->job_state + 8];
  struct stat st;

  if (!d->job_lock_held)
    return false;
  snprintf(lock, sizeof lock, "%s.lock", d->job_state);
  int r = lstat(lock, &st), e = errno;

  if (r == 0 && st.st_dev == d->job_lock_dev && st.st_ino == d->job_lock_ino)
    return false;
  snprintf(msg, len, "cannot write the Slurm jobs' state file %s: its lock file %s is no "
           "longer the file dspkd locked (%s), so dspkd --end-job or another dspkd could "
           "change the state file meanwhile; nothing written: find what replaced the lock "
           "(a daemon whose job_state names it), then restart dspkd", d->job_state, lock,
           r != 0 && e == ENOENT ? "it was removed" : "another file is there");
  return true;
}

/* dspkd_jobstate_save, the file written with keep's owner, group and mode
 * (NULL: the daemon's, 0600). */
static int save(const struct dspkd *d, const struct stat *keep, char *msg, size_t len) {
  char *text = NULL;
  size_t n = 0;
  const char *step = "format";
  int r;

  if (!d->job_state[0]) {
    snprintf(msg, len, "no Slurm jobs' state file (set job_state in dspkd.conf)");
    return DSPK_EIO;
  }
  if (lock_moved(d, msg, len))
    return DSPK_EIO;
  /* Each time: a directory made unsafe after the start (chmod 0777, a
   * chown) would let another user undo this write. */
  if (dir_trusted(d->job_state, keep ? keep->st_uid : geteuid(), msg, len) != 0) {
    char why[sizeof d->job_state + 400];
    snprintf(why, sizeof why, "%s", msg);
    snprintf(msg, len, "cannot write the Slurm jobs' state file %s: %s", d->job_state, why);
    return DSPK_EIO;
  }
  r = state_text(d, &text, &n);
  if (r == 0)
    r = replace_file(d->job_state, text, n, keep, &step);
  /* The steps that work on PATH.tmp name it, so that the admin looks
   * where the trouble is. */
  if (r != 0 && strcmp(step, NOT_STATE) == 0) {
    snprintf(msg, len, "cannot write the Slurm jobs' state file %s: the file there is not "
             "a dspkd state file (its first line is not \"dspkd-jobs ...\"), and dspkd "
             "does not replace it: look at it, then move it away or give job_state another "
             "path", d->job_state);
  } else if (r != 0 && strcmp(step, NOT_OURS) == 0) {
    snprintf(msg, len, "cannot write the Slurm jobs' state file %s: %s.tmp, the name of "
             "its temporary file, is a file dspkd did not make (a symbolic link, or another "
             "user's file), and dspkd does not remove it: look at it, then move it away or "
             "give job_state another path", d->job_state, d->job_state);
  } else if (r != 0) {
    static const char *const on_tmp[] = {"remove", "create", "chown", "chmod",
                                         "write",  "fsync",  "close"};
    bool tmp = false;
    for (size_t i = 0; i < sizeof on_tmp / sizeof on_tmp[0]; i++)
      tmp = tmp || strcmp(step, on_tmp[i]) == 0;
    snprintf(msg, len, "cannot write the Slurm jobs' state file %s (%s%s%s%s: %s)",
             d->job_state, step, tmp ? " " : "", tmp ? d->job_state : "", tmp ? ".tmp" : "",
             strerror(errno));
  }
  free(text);
  return r == 0 ? 0 : DSPK_EIO;
}

int dspkd_jobstate_save(const struct dspkd *d, char *msg, size_t len) {
  return save(d, NULL, msg, len);
}

/* ---- reading ------------------------------------------------------------ */

/* What a parse of the file found, applied only when all of it is good. */
struct parsed {
  struct djob *jobs; /* in the order of the file */
  struct djob **tail;
  size_t njobs;
  uint64_t ended[DSPKD_ENDED_SLOTS];
  uid_t ended_uid[DSPKD_ENDED_SLOTS];
  unsigned nended;
};

/* A decimal from lo to hi, as the daemon writes it (no sign, no leading
 * zero), nothing else.  0 or -1. */
static int parse_num(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  unsigned long long v;
  if (*s < '0' || *s > '9' || (s[0] == '0' && s[1]))
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

/* parse_num of field what (of line kind: "job", "ended") with what is
 * wrong in why when it fails: not a decimal, a leading zero, or out of its
 * range (job 0 is no Slurm job; uid 4294967295 is (uid_t)-1, no uid). */
static int field_num(const char *kind, const char *what, const char *s, uint64_t lo,
                     uint64_t hi, uint64_t *out, char *why, size_t len) {
  size_t k = strlen(s);
  if (parse_num(s, lo, hi, out) == 0)
    return 0;
  if (strspn(s, "0123456789") != k)
    snprintf(why, len, "%s: %s \"%.24s%s\" is not a decimal number", kind, what, s,
             k > 24 ? "..." : "");
  else if (s[0] == '0' && s[1])
    snprintf(why, len, "%s: %s %.24s%s has a leading zero (dspkd writes none)", kind, what, s,
             k > 24 ? "..." : "");
  else
    snprintf(why, len, "%s: %s %.24s%s is out of range (%" PRIu64 " to %" PRIu64 "%s)", kind,
             what, s, k > 24 ? "..." : "", lo, hi,
             /* The note only for the value it explains (probe 16 A nit: an ID
              * of 2^64 was told "0 is no Slurm job"). */
             lo == 1 && strcmp(s, "0") == 0                   ? ": 0 is no Slurm job"
             : hi == UINT32_MAX - 1 && strcmp(s, "4294967295") == 0 ? ": 4294967295 is no uid"
                                                                     : "");
  return -1;
}

/* A normalised UUID: 1 to DSPKD_UUID_LEN - 1 lower-case hex digits. */
static bool uuid_ok(const char *s) {
  size_t n = strlen(s);
  return n && n < DSPKD_UUID_LEN && strspn(s, "0123456789abcdef") == n;
}

static bool job_listed(const struct parsed *p, uint64_t id) {
  for (const struct djob *j = p->jobs; j; j = j->next)
    if (j->id == id)
      return true;
  return false;
}

static bool ended_listed(const struct parsed *p, uint64_t id) {
  for (unsigned i = 0; i < p->nended; i++)
    if (p->ended[i] == id)
      return true;
  return false;
}

/* "job ID UID UUID...", its words after "job" in w[0..n).  0, or -1 with
 * why. */
static int parse_job(struct parsed *p, char **w, int n, char *why, size_t len) {
  uint64_t id, uid;
  struct djob *j;
  if (n < 2 || n - 2 > DSPKD_JOB_MAX_DEVICES) {
    snprintf(why, len, "expected job ID UID and at most %d UUIDs", DSPKD_JOB_MAX_DEVICES);
    return -1;
  }
  if (field_num("job", "ID", w[0], 1, UINT64_MAX, &id, why, len) ||
      field_num("job", "UID", w[1], 0, UINT32_MAX - 1, &uid, why, len))
    return -1;
  if (job_listed(p, id)) {
    snprintf(why, len, "job %" PRIu64 " listed twice", id);
    return -1;
  }
  /* The daemon never writes a job both registered and ended (a new
   * registration forgets the end). */
  if (ended_listed(p, id)) {
    snprintf(why, len, "job %" PRIu64 " both ended and registered", id);
    return -1;
  }
  if (p->njobs >= STATE_MAX_JOBS) {
    snprintf(why, len, "more than %d jobs", STATE_MAX_JOBS);
    return -1;
  }
  if (!(j = calloc(1, sizeof *j))) {
    snprintf(why, len, "out of memory");
    return -1;
  }
  j->id = id;
  j->uid = (uid_t)uid;
  for (int i = 2; i < n; i++) {
    if (!uuid_ok(w[i])) {
      size_t k = strlen(w[i]);
      /* The quote cut at 40 bytes is marked so ("..."). */
      if (k >= DSPKD_UUID_LEN && strspn(w[i], "0123456789abcdef") == k)
        snprintf(why, len, "job %" PRIu64 ": UUID \"%.40s%s\" has %zu hex digits, more than "
                 "%d", id, w[i], k > 40 ? "..." : "", k, DSPKD_UUID_LEN - 1);
      else
        snprintf(why, len, "job %" PRIu64 ": \"%.40s%s\" is not a UUID (lower-case hex "
                 "digits)", id, w[i], k > 40 ? "..." : "");
      free(j);
      return -1;
    }
    for (int k = 0; k < j->ndevs; k++)
      if (strcmp(j->uuid[k], w[i]) == 0) {
        snprintf(why, len, "job %" PRIu64 ": UUID %s listed twice", id, w[i]);
        free(j);
        return -1;
      }
    snprintf(j->uuid[j->ndevs++], DSPKD_UUID_LEN, "%s", w[i]);
  }
  *p->tail = j;
  p->tail = &j->next;
  p->njobs++;
  return 0;
}

/* "ended ID UID|-".  0, or -1 with why. */
static int parse_ended(struct parsed *p, char **w, int n, char *why, size_t len) {
  uint64_t id, uid = (uint64_t)(uid_t)-1;
  if (n != 2) {
    snprintf(why, len, "expected ended ID UID (or - for none)");
    return -1;
  }
  if (field_num("ended", "ID", w[0], 1, UINT64_MAX, &id, why, len) ||
      (strcmp(w[1], "-") != 0 &&
       field_num("ended", "UID (or -)", w[1], 0, UINT32_MAX - 1, &uid, why, len)))
    return -1;
  if (ended_listed(p, id) || job_listed(p, id)) {
    snprintf(why, len, "job %" PRIu64 " %s", id,
             job_listed(p, id) ? "both registered and ended" : "ended twice");
    return -1;
  }
  if (p->nended >= DSPKD_ENDED_SLOTS) {
    snprintf(why, len, "more than %d ended jobs", DSPKD_ENDED_SLOTS);
    return -1;
  }
  p->ended[p->nended] = id;
  p->ended_uid[p->nended++] = (uid_t)uid;
  return 0;
}

/* Splits line at single spaces into at most max words.  The count, -1
 * when a word is empty, or -2 when there are more (the first max in w). */
static int split(char *line, char **w, int max) {
  int n = 0;
  for (char *s = line;;) {
    char *sp = strchr(s, ' ');
    if (sp == s || !*s)
      return -1;
    if (n == max)
      return -2;
    w[n++] = s;
    if (!sp)
      return n;
    *sp = '\0';
    s = sp + 1;
  }
}

/* One line (without its newline), the lineno-th.  0, 1 after "end N", or
 * -1 with why. */
static int parse_line(struct parsed *p, char *line, int lineno, char *why, size_t len) {
  char *w[DSPKD_JOB_MAX_DEVICES + 3];
  uint64_t count;
  int n;

  if (lineno == 1 && strcmp(line, STATE_MAGIC) == 0)
    return 0;
  /* A first line that is not a state file's (not "dspkd-jobs ...") is
   * another file; one that is, but for a control byte (a file converted
   * to DOS line ends whole: "dspkd-jobs 1\r"), is said as the other lines'
   * are (outside probe 15 A3). */
  if (lineno == 1 && strncmp(line, "dspkd-jobs ", 11) != 0) {
    snprintf(why, len, "not \"" STATE_MAGIC "\" (not a dspkd job state file, or "
             "another version's)");
    return -1;
  }
  /* The separator is one space: a tab, another control byte, a blank at
   * either end or two in a row are said as such, not as a line of no known
   * kind. */
  for (const char *c = line; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) {
      if (*c == '\t')
        snprintf(why, len, "a tab at byte %zu (fields are separated by one space)",
                 (size_t)(c - line) + 1);
      else
        snprintf(why, len, "a control byte 0x%02x at byte %zu%s", (unsigned char)*c,
                 (size_t)(c - line) + 1, *c == '\r' ? " (a carriage return: DOS line ends?)"
                                                     : "");
      return -1;
    }
  if (!line[0]) {
    snprintf(why, len, "an empty line");
    return -1;
  }
  if (line[0] == ' ' || line[strlen(line) - 1] == ' ' || strstr(line, "  ")) {
    snprintf(why, len, "%s (fields are separated by one space)",
             line[0] == ' ' ? "a blank at the start of the line"
             : strstr(line, "  ") ? "two blanks in a row" : "a blank at the end of the line");
    return -1;
  }
  if (lineno == 1) {
    snprintf(why, len, "not \"" STATE_MAGIC "\" (another version's dspkd job state file)");
    return -1;
  }
  n = split(line, w, (int)(sizeof w / sizeof w[0]));
  /* A job with more GPUs than a job may have: said as such, not as a line
   * of no known kind. */
  if (n == -2 && strcmp(w[0], "job") == 0) {
    snprintf(why, len, "job %.20s: more than %d UUIDs (a job has at most %d GPUs)", w[1],
             DSPKD_JOB_MAX_DEVICES, DSPKD_JOB_MAX_DEVICES);
    return -1;
  }
  if (n == -2 && strcmp(w[0], "ended") == 0)
    n = 4; /* refused by parse_ended: not "ended ID UID" */
  if (n > 0 && strcmp(w[0], "job") == 0)
    return parse_job(p, w + 1, n - 1, why, len);
  if (n > 0 && strcmp(w[0], "ended") == 0)
    return parse_ended(p, w + 1, n - 1, why, len);
  if (n == 2 && strcmp(w[0], "end") == 0 && parse_num(w[1], 0, UINT64_MAX, &count) == 0) {
    if (count == p->njobs + p->nended)
      return 1;
    snprintf(why, len, "\"end %" PRIu64 "\" but %zu record%s", count,
             p->njobs + (size_t)p->nended, p->njobs + (size_t)p->nended == 1 ? "" : "s");
    return -1;
  }
  snprintf(why, len, "expected job, ended or end");
  return -1;
}

/* Parses the n bytes of text.  0, or -1 with why (the line named). */
static int parse_text(struct parsed *p, char *text, size_t n, char *why, size_t len) {
  char *s = text, *end = text + n, reason[200];
  int lineno = 0, r = 0;

  if (memchr(text, '\0', n)) {
    snprintf(why, len, "a NUL byte");
    return -1;
  }
  /* An empty file has no jobs, as an absent one (touch(1), a tmpfiles.d
   * "f" line; the daemon never leaves one: it writes a temporary and
   * renames it), and is replaced by the next write: it was "cut short
   * after line 0", which failed every start closed and every --end-job
   * (outside probe 14 E6). */
  if (n == 0)
    return 0;
  while (s < end && r == 0) {
    char *nl = memchr(s, '\n', (size_t)(end - s));
    if (!nl) {
      snprintf(why, len, "line %d: cut short (no newline)", lineno + 1);
      return -1;
    }
    *nl = '\0';
    r = parse_line(p, s, ++lineno, reason, sizeof reason);
    if (r < 0) {
      snprintf(why, len, "line %d: %s", lineno, reason);
      return -1;
    }
    s = nl + 1;
  }
  if (r != 1) {
    snprintf(why, len, "cut short after line %d (no \"end\" line)", lineno);
    return -1;
  }
  if (s != end) {
    snprintf(why, len, "text after the \"end\" line (line %d)", lineno + 1);
    return -1;
  }
  return 0;
}

/* Opens path for reading if it is safe: a regular file of owner (the
 * daemon's euid) that group and others cannot write, not a symlink.  What
 * is there is looked at (lstat) before it is opened, so that a FIFO, a
 * device or a socket is refused for what it is and never opened; fstat
 * checks again what was opened.  The fd, -2 when nothing is there, or -1
 * with why (dspkd --end-job refuses with the same words: not_regular). */
static int open_safe(const char *path, uid_t owner, struct stat *st, char *why, size_t len) {
  int fd;

  if (lstat(path, st) != 0) {
    if (errno == ENOENT)
      return -2;
    snprintf(why, len, "%s", strerror(errno));
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    snprintf(why, len, "%s", not_regular(st->st_mode));
    return -1;
  }
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return -2;
  if (fd < 0) {
    if (errno == EACCES)
      unreadable(st, "read", "chmod 600 it", why, len);
    else
      snprintf(why, len, "%s", errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    return -1;
  }
  if (fstat(fd, st) != 0)
    snprintf(why, len, "fstat: %s", strerror(errno));
  else if (!S_ISREG(st->st_mode))
    snprintf(why, len, "%s", not_regular(st->st_mode));
  else if (dspk__trust_stat(st, owner, 0, "dspkd's ", why, len) != 0)
    ; /* owned by another user, or writable by group or others (dspkd writes it 0600) */
  else if ((uint64_t)st->st_size > STATE_MAX_BYTES)
    snprintf(why, len, "larger than %u bytes", STATE_MAX_BYTES);
  else
    return fd;
  close(fd);
  return -1;
}

/* Reads the file of owner (open_safe) into a malloc'd buffer (*text, *n
 * bytes; what fstat said of it in st).  0, 1 when it does not exist, or -1
 * with why. */
static int read_state(const char *path, uid_t owner, struct stat *stp, char **text, size_t *n,
                      char *why, size_t len) {
  struct stat st;
  size_t got = 0;
  int fd = open_safe(path, owner, &st, why, len);

  if (fd == -2)
    return 1;
  if (fd < 0)
    return -1;
  if (!(*text = malloc((size_t)st.st_size + 1))) {
    snprintf(why, len, "out of memory");
    close(fd);
    return -1;
  }
  for (;;) {
    ssize_t r = read(fd, *text + got, (size_t)st.st_size + 1 - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      snprintf(why, len, "read: %s", strerror(errno));
      break;
    }
    got += (size_t)r;
    if (r == 0 || got > (size_t)st.st_size)
      break;
  }
  close(fd);
  if (got > (size_t)st.st_size)
    snprintf(why, len, "it grew while read");
  if (why[0]) {
    free(*text);
    return -1;
  }
  *n = got;
  if (stp)
    *stp = st;
  return 0;
}

/* Whether an open device of d has the (normalised) UUID u. */
static bool have_uuid(const struct dspkd *d, const char *u) {
  char n[DSPKD_UUID_LEN];
  for (int i = 0; i < d->ndevs; i++)
    if (d->devs[i].open_state == 1 &&
        dspkd_uuid_norm(d->devs[i].info.uuid, sizeof d->devs[i].info.uuid, n) == 0 &&
        strcmp(n, u) == 0)
      return true;
  return false;
}

/* Registers the parsed jobs, in the order of the file (d->jobs' order),
 * and remembers the ended ones; warn: a GPU of a job that no device of
 * the daemon has is logged. */
static void apply(struct dspkd *d, struct parsed *p, bool warn) {
  struct djob **tail = &d->jobs;
  while (*tail)
    tail = &(*tail)->next;
  while (p->jobs) {
    struct djob *j = p->jobs;
    p->jobs = j->next;
    for (int i = 0; i < j->ndevs; i++)
      if (warn && !have_uuid(d, j->uuid[i]))
        dspkd_warn("%s: Slurm job %" PRIu64 " (uid %lu): no device of this daemon has its "
                   "GPU %s now; the job keeps its other devices (the cpu and the GPUs "
                   "found)", d->job_state, j->id, (unsigned long)j->uid, j->uuid[i]);
    j->next = NULL;
    *tail = j;
    tail = &j->next;
    d->njobs++;
  }
  /* Oldest first, as job.end adds them (the parse refused a file that
   * lists one twice or more than DSPKD_ENDED_SLOTS). */
  for (unsigned i = 0; i < p->nended; i++)
    dspkd_job_end_record(d, p->ended[i], p->ended_uid[i], NULL);
}

static void parsed_free(struct parsed *p) {
  while (p->jobs) {
    struct djob *j = p->jobs;
    p->jobs = j->next;
    free(j);
  }
}

void dspkd_jobstate_load(struct dspkd *d) {
  struct parsed p = {0};
  char why[320] = "", *text = NULL;
  size_t n = 0, njobs;
  int r;

  if (!d->job_state[0]) {
    d->jobs_fail_closed = true;
    dspkd_error("Slurm jobs: no state file to read: connections without a registered job "
                "get the cpu only (as job_required = yes) until dspkd stops");
    return;
  }
  p.tail = &p.jobs;
  r = read_state(d->job_state, geteuid(), NULL, &text, &n, why, sizeof why);
  if (r == 1) {
    dspkd_info("Slurm jobs: %s does not exist: no job registered before this start",
               d->job_state);
    return;
  }
  if (r == 0)
    r = parse_text(&p, text, n, why, sizeof why);
  free(text);
  if (r != 0) {
    const char *step;
    parsed_free(&p);
    d->jobs_fail_closed = true;
    dspkd_error("Slurm jobs: refusing the state file %s: %s; starting without the jobs "
                "registered before, and connections without a registered job get the cpu "
                "only (as job_required = yes) until dspkd stops; %s", d->job_state, why,
                replaceable(d->job_state, &step) == 0
                    ? "the next job.register or job.end writes the file anew"
                    : "job.register and job.end fail with EIO while it is there (dspkd "
                      "replaces only a regular file that is a dspkd state file)");
    return;
  }
  njobs = p.njobs;
  apply(d, &p, true);
  dspkd_info("Slurm jobs: %s: %zu job(s) registered again, %u ended job(s) remembered",
             d->job_state, njobs, p.nended);
}

/* ---- dspkd --end-job ----------------------------------------------------- */

/* Marks job id ended in d's jobs as job.end does: out of the registered
 * ones, into the ended ones (with its uid, or none when it was not
 * registered).  *uid: the uid it was registered for ((uid_t)-1: none).
 * Whether anything changed. */
static bool end_in(struct dspkd *d, uint64_t id, uid_t *uid) {
  struct djob *j = NULL;
  for (j = d->jobs; j && (j->id != id || j->ended); j = j->next)
    ;
  *uid = j ? j->uid : (uid_t)-1;
  if (!dspkd_job_end_record(d, id, *uid, NULL) && !j)
    return false;
  if (j)
    j->ended = true;
  return true;
}

/* The outcome when there is no state file: nothing is registered in it;
 * note (NULL: none) says why there can be none ("no directory DIR", "F is
 * not a directory"). */
static int no_file(const struct dspkd *d, uint64_t id, const char *note, char *said,
                   size_t len) {
  snprintf(said, len, "Slurm job %" PRIu64 ": no state file %s%s%s%s: nothing is registered "
           "there", id, d->job_state, note ? " (" : "", note ? note : "", note ? ")" : "");
  return DSPKD_EXIT_NOFILE;
}

/* Whether there can be no state file at path because its directory is
 * missing (/run/dspk on a node just rebooted) or a file is where a
 * directory of its path should be: then why in note.  A directory that
 * cannot be looked at for another reason (EACCES) is not known to be
 * missing: false. */
static bool no_dir(const char *path, char *note, size_t len) {
  char dir[sizeof((struct dspkd *)0)->job_state], up[sizeof dir];
  struct stat st;

  dir_of(path, dir, sizeof dir);
  if (stat(dir, &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return false;
    snprintf(note, len, "%s is not a directory", dir);
    return true;
  }
  if (errno == ENOENT) {
    snprintf(note, len, "no directory %s", dir);
    return true;
  }
  if (errno != ENOTDIR)
    return false;
  /* A file on the way: the nearest ancestor that exists is it. */
  snprintf(up, sizeof up, "%s", dir);
  while (strcmp(up, "/") != 0 && strcmp(up, ".") != 0) {
    char parent[sizeof dir];
    dir_of(up, parent, sizeof parent);
    snprintf(up, sizeof up, "%s", parent);
    if (stat(up, &st) == 0 && !S_ISDIR(st.st_mode)) {
      snprintf(note, len, "%s is not a directory", up);
      return true;
    }
  }
  snprintf(note, len, "a file is on the path of %s", dir);
  return true;
}

/* The state file is refused for why (the words of the start's refusal):
 * logged; the exit status, 1. */
static int refuse(const struct dspkd *d, uint64_t id, const char *why) {
  dspkd_error("--end-job %" PRIu64 ": refusing the state file %s: %s; the job is not ended "
              "there (a dspkd started on it refuses it too and fails closed): look at the "
              "file, or remove it", id, d->job_state, why);
  return 1;
}

/* With the lock held (lock_fd): reads the file of owner, ends job id in
 * it and writes it back with its owner, group and mode.  An exit status,
 * the outcome in said for 0 and DSPKD_EXIT_NOFILE. */
static int end_locked(struct dspkd *d, uint64_t id, uid_t owner, char *said, size_t len) {
  struct parsed p = {0};
  struct stat st;
  char why[320] = "", msg[640], *text = NULL;
  size_t n = 0;
  uid_t uid;
  int r;

  p.tail = &p.jobs;
  r = read_state(d->job_state, owner, &st, &text, &n, why, sizeof why);
  if (r == 1)
    return no_file(d, id, NULL, said, len);
  if (r == 0)
    r = parse_text(&p, text, n, why, sizeof why);
  free(text);
  if (r != 0) {
    parsed_free(&p);
    return refuse(d, id, why);
  }
  apply(d, &p, false);
  if (!end_in(d, id, &uid)) {
    snprintf(said, len, "Slurm job %" PRIu64 ": had ended already in %s", id, d->job_state);
    return 0;
  }
  if (save(d, &st, msg, sizeof msg) != 0) {
    dspkd_error("--end-job %" PRIu64 ": %s; the job is not ended", id, msg);
    return 1;
  }
  if (uid == (uid_t)-1)
    snprintf(said, len, "Slurm job %" PRIu64 ": not registered in %s; recorded there as "
             "ended", id, d->job_state);
  else
    snprintf(said, len, "Slurm job %" PRIu64 " (uid %lu): ended in %s", id,
             (unsigned long)uid, d->job_state);
  return 0;
}

/* The lock's path, in buf. */
static const char *lock_path(const struct dspkd *d, char *buf, size_t len) {
  snprintf(buf, len, "%s.lock", d->job_state);
  return buf;
}

int dspkd_jobstate_end_offline(struct dspkd *d, uint64_t id, char *said, size_t len) {
  struct stat st;
  uid_t owner = geteuid();
  gid_t group = getegid();
  char why[sizeof d->job_state + 400] = "", lock[sizeof d->job_state + 8];
  char dir[sizeof d->job_state];
  char note[sizeof d->job_state + 32];
  unsigned long links;
  bool exists;
  int fd, r;
  mode_t mode;

  if (name_file(d) != 0) {
    dspkd_error("--end-job %" PRIu64 ": no state file to end it in", id);
    return 2;
  }
  /* No directory (/run/dspk on a node just rebooted), or a file where a
   * directory should be (the socket's path under a file): no file can be
   * there, so no job a start would register again, as when the file alone
   * is missing (exit 4, never the start's "cannot be written"). */
  if (no_dir(d->job_state, note, sizeof note))
    return no_file(d, id, note, said, len);
  dir_of(d->job_state, dir, sizeof dir);
  if (stat(dir, &st) != 0) {
    dspkd_error("--end-job %" PRIu64 ": cannot tell whether the state file %s exists: its "
                "directory %s: %s", id, d->job_state, dir, strerror(errno));
    return 2;
  }
  /* What is at the path (lstat, as the start's read looks first): nothing
   * (no file, exit 4), a regular file, or something the start refuses (a
   * symbolic link, dangling or not, a directory, a FIFO, a socket, a
   * device: exit 1 with the start's reason, never "no state file"). */
  exists = lstat(d->job_state, &st) == 0;
  if (!exists && errno != ENOENT)
    return refuse(d, id, strerror(errno));
  mode = exists ? st.st_mode : 0;
  /* Root ends a job in the file of a daemon that runs as another user
   * (User=dspk): the file and its lock keep their owner. */
  if (owner == 0 && ((exists && S_ISREG(mode)) ||
                     (lstat(lock_path(d, lock, sizeof lock), &st) == 0 &&
                      S_ISREG(st.st_mode)))) {
    owner = st.st_uid;
    group = st.st_gid;
  }
  /* Before the lock is taken or made: in a directory another user can
   * change, the file and its lock are not what they seem. */
  if (dir_trusted(d->job_state, owner, why, sizeof why) != 0) {
    dspkd_error("--end-job %" PRIu64 ": refusing the state file %s: %s; the job is not "
                "ended (a dspkd started on it refuses it too)", id, d->job_state, why);
    return 1;
  }
  /* The lock is created only for a regular file: a running dspkd (exit 3)
   * is told from one that is not there before the file is refused. */
  fd = lock_take(d->job_state, owner, group, exists && S_ISREG(mode), why, sizeof why);
  if (fd == -2) {
    dspkd_error("--end-job %" PRIu64 ": a running dspkd holds %s.lock: end the job through "
                "it (dspk-submit job end --job %" PRIu64 ")", id, d->job_state, id);
    return DSPKD_EXIT_LOCKED;
  }
  if (fd == -3 && exists)
    return refuse(d, id, not_regular(mode));
  if (fd == -3)
    return no_file(d, id, NULL, said, len);
  if (fd < 0) {
    dspkd_error("--end-job %" PRIu64 ": cannot lock %s.lock: %s", id, d->job_state, why);
    return 1;
  }
  if (note_lock(d, fd) != 0 || held_by_other(d->job_state)) {
    r = refuse(d, id, d->job_lock_held ? HELD_WHY : strerror(errno));
    close(fd);
    return r;
  }
  if (linked(d->job_state, &links)) {
    snprintf(why, sizeof why, LINKED_WHY, links);
    r = refuse(d, id, why);
    close(fd);
    return r;
  }
  r = end_locked(d, id, owner, said, len);
  dspkd_jobs_free(d);
  close(fd);
  return r;
}
