/*
 * Output files written through a temporary and a rename (see outfile.h).
 *
 * The symbolic links of the output path are followed by hand (lstat and
 * readlink, at most OUTFILE_MAX_LINKS of them) rather than with realpath,
 * which fails on a dangling link: a link to a file not yet written creates
 * that file, as open(2) would.  The temporary lives beside the final
 * target, on the same file system, so the rename is atomic.
 *
 * Outputs are opened before the task runs, which may take minutes: a
 * SIGINT, SIGTERM, SIGHUP or SIGQUIT meanwhile (Ctrl-C) must not leave the
 * temporary behind.  The open temporaries are listed in a small table that
 * a handler, installed with the first temporary for those signals still at
 * their default, unlinks before dying of the signal as before.
 */
#include "client/submit/outfile.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspk/errors.h"

/* As the kernel's limit on the links one path lookup follows (MAXSYMLINKS). */
#define OUTFILE_MAX_LINKS 40

/* The temporaries now open, for the signal handler; a slot is cleared
 * before its path is freed. */
#define OUTFILE_MAX_OPEN 8
static char *volatile open_tmps[OUTFILE_MAX_OPEN];
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static void on_fatal_signal(int sig) {
  int e = errno;
  for (int i = 0; i < OUTFILE_MAX_OPEN; i++)
    if (open_tmps[i])
      unlink(open_tmps[i]);
  signal(sig, SIG_DFL);
  raise(sig);
  errno = e;
}

/* Lists tmp for the handler (installed the first time); 0, or -1 when the
 * table is full (the output is then not written: EMFILE). */
static int track(char *tmp) {
  static bool installed;
  if (!installed) {
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
      struct sigaction old, sa;
      if (sigaction(cleanup_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(cleanup_signals[i], &sa, NULL);
      }
    }
    installed = true;
  }
  for (int i = 0; i < OUTFILE_MAX_OPEN; i++)
    if (!open_tmps[i]) {
      open_tmps[i] = tmp;
      return 0;
    }
  return -1;
}

static void untrack(const char *tmp) {
  for (int i = 0; i < OUTFILE_MAX_OPEN; i++)
    if (open_tmps[i] == tmp)
      open_tmps[i] = NULL;
}

static int open_code(int e) {
  return e == ENOENT ? DSPK_ENOENT
         : e == EACCES || e == EPERM || e == EROFS ? DSPK_EPERM
                                                   : DSPK_EIO;
}

static void seterr(char *err, size_t errlen, int e) {
  if (errlen)
    snprintf(err, errlen, "%s", strerror(e));
}

/* The directory part of p ("." when none), malloc'd, or NULL. */
static char *dir_of(const char *p) {
  const char *s = strrchr(p, '/');
  if (!s)
    return strdup(".");
  if (s == p)
    return strdup("/");
  return strndup(p, (size_t)(s - p));
}

/* The final target of path (its links followed), malloc'd; NULL with errno
 * set (ELOOP, ENOMEM). */
static char *resolve(const char *path) {
  char *p = strdup(path);
  for (int n = 0; p; n++) {
    struct stat st;
    char *link, *next, *dir;
    ssize_t len;
    if (lstat(p, &st) < 0 || !S_ISLNK(st.st_mode))
      return p; /* a missing path or another error: open reports it */
    if (n == OUTFILE_MAX_LINKS) {
      free(p);
      errno = ELOOP;
      return NULL;
    }
    link = malloc((size_t)st.st_size + 2);
    if (!link)
      break;
    len = readlink(p, link, (size_t)st.st_size + 1);
    if (len < 0 || len > st.st_size) { /* changed under us */
      free(link);
      if (len >= 0)
        errno = EAGAIN;
      break;
    }
    link[len] = '\0';
    if (link[0] == '/') {
      next = link;
    } else {
      dir = dir_of(p);
      next = NULL;
      if (dir && asprintf(&next, "%s/%s", dir, link) < 0)
        next = NULL;
      free(dir);
      free(link);
      if (!next)
        break;
    }
    free(p);
    p = next;
  }
  free(p);
  return NULL;
}

int dspk__outfile_open(dspk__outfile *o, const char *path, char *err,
                       size_t errlen) {
  struct stat st;
  char *target, *dir = NULL, *tmp = NULL;
  bool exists;
  mode_t mode;
  int fd, e;

  o->fd = -1;
  o->target = o->tmp = NULL;
  if (strcmp(path, "-") == 0) {
    o->fd = STDOUT_FILENO;
    return 0;
  }
  target = resolve(path);
  if (!target) {
    e = errno;
    seterr(err, errlen, e);
    return open_code(e);
  }
  exists = stat(target, &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    /* A FIFO, a device, a directory (which open refuses): written directly. */
    free(target);
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
      e = errno;
      seterr(err, errlen, e);
      return open_code(e);
    }
    o->fd = fd;
    return 0;
  }
  /* A file that a plain open could not write is not replaced either. */
  if (exists && faccessat(AT_FDCWD, target, W_OK, AT_EACCESS) < 0) {
    e = errno;
    goto fail;
  }
  dir = dir_of(target);
  if (!dir || asprintf(&tmp, "%s/.dspk-submit-XXXXXX", dir) < 0) {
    tmp = NULL;
    e = ENOMEM;
    goto fail;
  }
  /* Blocked, the signals cannot come between creating the file and
   * listing it. */
  {
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
      sigaddset(&block, cleanup_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    fd = mkostemp(tmp, O_CLOEXEC);
    e = errno;
    if (fd >= 0 && track(tmp) < 0) {
      close(fd);
      unlink(tmp);
      fd = -1;
      e = EMFILE;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
  }
  if (fd < 0) {
    free(tmp);
    tmp = NULL;
    if (exists && errlen) {
      /* The file could be written, but not replaced: say why. */
      snprintf(err, errlen, "cannot create a temporary file in %s to replace it: %s",
               dir, strerror(e));
      free(dir);
      free(target);
      return open_code(e);
    }
    goto fail;
  }
  if (exists) {
    mode = st.st_mode & 07777;
    if ((st.st_uid != geteuid() || st.st_gid != getegid()) &&
        fchown(fd, st.st_uid, st.st_gid) < 0) {
      /* Not ours to give away: the new file is the process's, as a file
       * written anew would be. */
    }
  } else {
    mode_t mask = umask(0);
    umask(mask);
    mode = 0666 & ~mask;
  }
  if (fchmod(fd, mode) < 0) {
    e = errno;
    close(fd);
    untrack(tmp);
    unlink(tmp);
    goto fail;
  }
  free(dir);
  o->fd = fd;
  o->target = target;
  o->tmp = tmp;
  return 0;
fail:
  free(tmp);
  free(dir);
  free(target);
  seterr(err, errlen, e);
  return open_code(e);
}

int dspk__outfile_write(dspk__outfile *o, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(o->fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int dspk__outfile_commit(dspk__outfile *o, char *err, size_t errlen) {
  int e = 0;
  if (o->fd < 0)
    return 0;
  if (o->fd == STDOUT_FILENO && !o->tmp) {
    o->fd = -1;
    return 0;
  }
  /* Not synced first (as cp and numpy.save): an fsync cost a fresh
   * command 2-5 ms (gemm 1024^2 on cuda:0 from 7.7 to 12.6 ms).  The rename
   * replaces the file whole for every process; what reaches the disk after
   * a crash of the machine is the file system's rule for a rename. */
  if (close(o->fd) < 0)
    e = errno;
  o->fd = -1;
  if (!e && o->tmp && rename(o->tmp, o->target) < 0)
    e = errno;
  if (e) {
    dspk__outfile_abort(o);
    seterr(err, errlen, e);
    return DSPK_EIO;
  }
  untrack(o->tmp);
  free(o->tmp);
  free(o->target);
  o->tmp = o->target = NULL;
  return 0;
}

void dspk__outfile_abort(dspk__outfile *o) {
  if (o->fd >= 0 && !(o->fd == STDOUT_FILENO && !o->tmp))
    close(o->fd);
  o->fd = -1;
  if (o->tmp) {
    unlink(o->tmp);
    untrack(o->tmp);
  }
  free(o->tmp);
  free(o->target);
  o->tmp = o->target = NULL;
}
