/*
 * Output files written through a temporary and a rename (see outfile.h).
 *
 * The symbolic links of the output path are followed by hand (lstat and
 * readlink, at most OUTFILE_MAX_LINKS of them) rather than with realpath,
 * which fails on a dangling link: a link to a file not yet written creates
 * that file, as open(2) would.  The temporary lives beside the final
 * target, on the same file system, so the rename is atomic.
 *
 * A path that is one of procfs's links to an open descriptor (/dev/stdout,
 * /dev/fd/N, /proc/self/fd/N) is not followed to the file's name: the
 * descriptor is written through in place, as -o - is.
 *
 * Outputs are opened before the task runs, which may take minutes: a
 * SIGINT, SIGTERM, SIGHUP or SIGQUIT meanwhile (Ctrl-C) must not leave the
 * temporary behind, nor must any other signal whose default action ends
 * the process (SIGPIPE, SIGALRM, SIGUSR1, the real-time signals...: see
 * cleanup_signals).  The open temporaries are listed in a small table that
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
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dspk/errors.h"

#ifndef PROC_SUPER_MAGIC
#define PROC_SUPER_MAGIC 0x9fa0
#endif

/* As the kernel's limit on the links one path lookup follows (MAXSYMLINKS). */
#define OUTFILE_MAX_LINKS 40

/* The temporaries now open, for the signal handler; a slot is cleared
 * before its path is freed. */
#define OUTFILE_MAX_OPEN 8
static char *volatile open_tmps[OUTFILE_MAX_OPEN];
/* Every signal whose default action ends the process and that can be
 * caught (signal(7)); the real-time signals are added at run time. */
static const int cleanup_signals[] = {
    SIGHUP,  SIGINT,  SIGQUIT,   SIGILL,  SIGTRAP, SIGABRT, SIGBUS,    SIGFPE,
    SIGUSR1, SIGSEGV, SIGUSR2,   SIGPIPE, SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU,
    SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR,  SIGSYS};

/* The set of them, with SIGRTMIN..SIGRTMAX. */
static void cleanup_set(sigset_t *set) {
  sigemptyset(set);
  for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++)
    sigaddset(set, cleanup_signals[i]);
  for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
    sigaddset(set, s);
}

void dspk__fatal_signals(sigset_t *set) { cleanup_set(set); }

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
    sigset_t set;
    cleanup_set(&set);
    for (int sig = 1; sig < NSIG; sig++) {
      struct sigaction old, sa;
      if (sigismember(&set, sig) == 1 && sigaction(sig, NULL, &old) == 0 &&
          !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, NULL);
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

/* Whether the process has CAP_FOWNER (which passes the sticky directory
 * rule); without capget, whether it is root. */
static bool cap_fowner(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  if (syscall(SYS_capget, &h, d) != 0)
    return geteuid() == 0;
  return (d[CAP_FOWNER / 32].effective >> (CAP_FOWNER % 32)) & 1u;
}

int dspk__path_code(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:      /* a part of the path is a file: "a.npy/x.npy" */
  case ELOOP:        /* a loop of symbolic links */
  case ENAMETOOLONG: /* a name or path over the system's limit */
    return DSPK_ENOENT;
  case EACCES:
  case EPERM:
  case EROFS:
    return DSPK_EPERM;
  default:
    return DSPK_EIO;
  }
}

static int open_code(int e) {
  return dspk__path_code(e);
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

/* Whether p, a symbolic link, is one of procfs's links to an open
 * descriptor (/proc/PID/fd/N, reached as /dev/stdout, /dev/fd/N,
 * /proc/self/fd/N, /proc/thread-self/fd/N): 1 with *fdno = N when the
 * descriptor is this process's, 2 when another process's, else 0.  Such a
 * link names an open file description, not a path: its readlink text
 * ("/home/u/log.txt", "pipe:[123]") is no path to write to. */
static int fd_link(const char *p, int *fdno) {
  const char *base = strrchr(p, '/');
  char *dir, *real;
  struct statfs sf;
  char own[64];
  int kind = 0, k, pid = (int)getpid(), tid = -1;
  long n;
  if (!base || !base[1] || strspn(base + 1, "0123456789") != strlen(base + 1))
    return 0;
  dir = dir_of(p);
  if (!dir)
    return 0;
  real = statfs(dir, &sf) == 0 && sf.f_type == PROC_SUPER_MAGIC ? realpath(dir, NULL) : NULL;
  free(dir);
  if (!real)
    return 0;
  k = strlen(real) > 3 ? (int)strlen(real) - 3 : 0;
  if (strcmp(real + k, "/fd") == 0) {
    kind = 2;
    snprintf(own, sizeof own, "/proc/%d/fd", pid);
    if (strcmp(real, own) == 0 ||
        (sscanf(real, "/proc/%*d/task/%d/fd", &tid) == 1 &&
         snprintf(own, sizeof own, "/proc/%d/task/%d/fd", pid, tid) > 0 &&
         strcmp(real, own) == 0))
      kind = 1;
  }
  free(real);
  n = strtol(base + 1, NULL, 10);
  if (kind == 1 && n >= 0 && n <= 0x7fffffff)
    *fdno = (int)n;
  else if (kind == 1)
    kind = 2;
  return kind;
}

/* The final target of path (its links followed), malloc'd; NULL with errno
 * set (ELOOP, ENOMEM).  A link to an open descriptor (fd_link) is not
 * followed: *fdlink is then set to fd_link's answer and the path returned
 * is the link's. */
static char *resolve(const char *path, int *fdlink, int *fdno) {
  char *p = strdup(path);
  *fdlink = 0;
  for (int n = 0; p; n++) {
    struct stat st;
    char *link, *next, *dir;
    ssize_t len;
    if (lstat(p, &st) < 0 || !S_ISLNK(st.st_mode))
      return p; /* a missing path or another error: open reports it */
    if ((*fdlink = fd_link(p, fdno)) != 0)
      return p;
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

/* path opened and written directly, never replaced; trunc: a regular file
 * it reaches is emptied first. */
static int open_direct(dspk__outfile *o, const char *path, bool trunc, char *err,
                       size_t errlen) {
  struct stat st;
  int e, fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0666);
  if (fd < 0) {
    e = errno;
    seterr(err, errlen, e);
    return open_code(e);
  }
  if (trunc && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) {
    e = errno;
    close(fd);
    seterr(err, errlen, e);
    return open_code(e);
  }
  o->fd = fd;
  return 0;
}

/* Bit fd of the standard descriptors closed at the start. */
static unsigned std_closed;

void dspk__std_mark_closed(int fd) {
  if (fd >= 0 && fd <= 2)
    std_closed |= 1u << fd;
}

bool dspk__std_closed(int fd) { return fd >= 0 && fd <= 2 && (std_closed >> fd & 1u); }

const char *dspk__std_name(int fd) {
  return fd == 0 ? "<stdin>" : fd == 1 ? "<stdout>" : "<stderr>";
}

int dspk__fd_alias(const char *path) {
  int fdlink = 0, fdno = -1;
  char *target;
  if (strcmp(path, "-") == 0)
    return STDIN_FILENO;
  target = resolve(path, &fdlink, &fdno);
  free(target);
  return target != NULL && fdlink == 1 ? fdno : -1;
}

/* What an output path writes to, for telling two spellings of one file
 * apart from two files: a descriptor of this process ("-" is 1), or a file
 * by st_dev/st_ino (links followed), or, for a file not there yet, its
 * directory's st_dev/st_ino and its name in it. */
struct out_id {
  int fd; /* >= 0: a descriptor (dev/ino its file's when fstat works) */
  bool have_file;
  dev_t dev;
  ino_t ino;
  char *name; /* malloc'd: the last component when the file is missing */
};

static void out_id_of(const char *path, struct out_id *id) {
  struct stat st;
  int fdlink = 0, fdno = -1;
  char *target;
  memset(id, 0, sizeof *id);
  id->fd = -1;
  if (strcmp(path, "-") == 0) {
    id->fd = STDOUT_FILENO;
  } else {
    target = resolve(path, &fdlink, &fdno);
    if (target == NULL)
      return;
    if (fdlink == 1) {
      id->fd = fdno;
    } else if (stat(target, &st) == 0) {
      id->have_file = true;
      id->dev = st.st_dev;
      id->ino = st.st_ino;
    } else {
      const char *slash = strrchr(target, '/');
      char *dir = dir_of(target);
      if (dir != NULL && stat(dir, &st) == 0 && (id->name = strdup(slash ? slash + 1 : target))) {
        id->dev = st.st_dev;
        id->ino = st.st_ino;
      }
      free(dir);
    }
    free(target);
    if (id->fd < 0)
      return;
  }
  if (fstat(id->fd, &st) == 0) {
    id->have_file = true;
    id->dev = st.st_dev;
    id->ino = st.st_ino;
  }
}

int dspk__outfile_same(const char *a, const char *b) {
  struct out_id x, y;
  int same;
  out_id_of(a, &x);
  out_id_of(b, &y);
  if (x.fd >= 0 && x.fd == y.fd)
    same = 1;
  else if (x.have_file && y.have_file)
    same = x.dev == y.dev && x.ino == y.ino;
  else
    same = x.name != NULL && y.name != NULL && x.dev == y.dev && x.ino == y.ino &&
           strcmp(x.name, y.name) == 0;
  free(x.name);
  free(y.name);
  return same;
}

int dspk__outfile_open(dspk__outfile *o, const char *path, char *err,
                       size_t errlen) {
  struct stat st;
  char *target, *dir = NULL, *tmp = NULL;
  bool exists;
  mode_t mode;
  int fd, e;

  int fdlink, fdno = -1;

  o->fd = -1;
  o->target = o->tmp = NULL;
  o->to_stdout = false;
  if (strcmp(path, "-") == 0 && dspk__std_closed(STDOUT_FILENO)) {
    if (errlen)
      snprintf(err, errlen, "descriptor %d is not open", STDOUT_FILENO);
    return DSPK_ENOENT;
  }
  if (strcmp(path, "-") == 0) {
    o->fd = STDOUT_FILENO;
    o->to_stdout = true;
    return 0;
  }
  target = resolve(path, &fdlink, &fdno);
  if (!target) {
    e = errno;
    seterr(err, errlen, e);
    return open_code(e);
  }
  if (fdlink == 1) {
    /* One of this process's descriptors (-o /dev/stdout): written through
     * a duplicate of it, at its offset, as -o - writes standard output;
     * never replaced, so a file opened for appending is appended to. */
    int fl = fcntl(fdno, F_GETFL);
    free(target);
    if (dspk__std_closed(fdno))
      fl = -1; /* its placeholder (main.c) */
    if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY) {
      if (errlen)
        snprintf(err, errlen, fl < 0 ? "descriptor %d is not open"
                                     : "descriptor %d is not open for writing", fdno);
      return fl < 0 ? DSPK_ENOENT : DSPK_EPERM;
    }
    fd = fcntl(fdno, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) {
      e = errno;
      seterr(err, errlen, e);
      return open_code(e);
    }
    o->fd = fd;
    o->to_stdout = fdno == STDOUT_FILENO;
    return 0;
  }
  if (fdlink == 2) {
    /* Another process's descriptor: opened (the kernel follows the link to
     * the open file), written directly, never replaced. */
    free(target);
    return open_direct(o, path, true, err, errlen);
  }
  exists = stat(target, &st) == 0;
  if (!exists && errno != ENOENT) {
    /* A path that cannot lead to a file (a name over NAME_MAX, a part of
     * it a file, a loop of links): found now, where the temporary beside
     * it could still be made and the rename would fail after the work. */
    e = errno;
    goto fail;
  }
  if (exists && !S_ISREG(st.st_mode)) {
    /* A FIFO, a device, a directory (which open refuses): written directly. */
    free(target);
    return open_direct(o, path, false, err, errlen);
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
  /* The rename over an existing file is refused in a sticky directory
   * (/tmp) to a caller who owns neither the file nor the directory and
   * lacks CAP_FOWNER (the kernel's may_delete): found now, before any
   * work, not after it. */
  if (exists) {
    struct stat dst;
    uid_t me = geteuid();
    if (stat(dir, &dst) == 0 && (dst.st_mode & S_ISVTX) && st.st_uid != me &&
        dst.st_uid != me && !cap_fowner()) {
      if (errlen)
        snprintf(err, errlen, "cannot replace it: %s is a sticky directory and neither "
                 "it nor the file is yours", dir);
      free(tmp);
      free(dir);
      free(target);
      return DSPK_EPERM;
    }
  }
  /* Blocked, the signals cannot come between creating the file and
   * listing it. */
  {
    sigset_t block, old;
    cleanup_set(&block);
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
  int code = DSPK_EIO;
  /* Not synced first (as cp and numpy.save): an fsync cost a fresh
   * command 2-5 ms (gemm 1024^2 on cuda:0 from 7.7 to 12.6 ms).  The rename
   * replaces the file whole for every process; what reaches the disk after
   * a crash of the machine is the file system's rule for a rename. */
  if (close(o->fd) < 0)
    e = errno;
  o->fd = -1;
  if (!e && o->tmp && rename(o->tmp, o->target) < 0) {
    e = errno; /* refused (EPERM, EACCES) as an open would be */
    code = open_code(e);
  }
  if (e) {
    dspk__outfile_abort(o);
    seterr(err, errlen, e);
    return code;
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
