/*
 * dspkd: the entry point.  Parses the command line, picks the socket path
 * (creating its directory), opens the cache, probes the backends and starts
 * one runner per device, listens, and runs the libuv loop until SIGTERM or
 * SIGINT.  The stop is ordered: stop accepting, fail queued work with
 * ESHUTDOWN, let running tasks finish, close connections, let every runner
 * close its device and exit, join every runner, shut the backends down,
 * close the cache, remove the socket, exit 0.  No runner thread is alive
 * when main returns.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/activation.h"
#include "daemon/config.h"
#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/lifecycle.h"
#include "daemon/linger.h"
#include "daemon/log.h"
#include "daemon/observe.h"
#include "daemon/paths.h"
#include "daemon/teardown.h"

#include "backends/backend.h"
#include "cache/cache.h"
#include "proto/sockpath.h"

/* Whether the default socket's directory dir, when it is there, is safe
 * from other users by the rule of every file dspkd trusts
 * (dspk__trust_stat): a symbolic link there owned by root or dspkd's user
 * only, the directory owned by one of them and not writable by group or
 * others without the sticky bit.  Another user's directory (or link) let
 * that user rename the live socket away and listen in its place, and hold
 * the state file beside it (probe 22 E2).  0, or -1 (logged: the path, why
 * and the fix). */
static int untrusted_dir(const char *dir) {
  char w[256];
  struct stat st;
  uid_t self = geteuid();

  if (lstat(dir, &st) != 0)
    return 0; /* missing: the bind or --end-job says so */
  if (S_ISLNK(st.st_mode) && dspk__trust_stat(&st, self, 1, "dspkd's ", w, sizeof w) != 0) {
    dspkd_error("refusing the socket directory %s: it is a symbolic link %s (another user "
                "chooses where the socket and the state file go): remove the link (dspkd "
                "makes the directory), or give the socket with --socket PATH", dir, w);
    return -1;
  }
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return 0; /* listening says what is wrong (socket_dir_error) */
  if (dspk__trust_stat(&st, self, 1, "dspkd's ", w, sizeof w) != 0) {
    dspkd_error("refusing the socket directory %s: it is %s (another user could replace "
                "the socket and the state file in it): %s, or give the socket with "
                "--socket PATH", dir, w,
                st.st_uid != self && st.st_uid != 0
                    ? "remove it (dspkd makes it again) or chown it to dspkd's user"
                    : "chmod go-w it");
    return -1;
  }
  return 0;
}

/* Fills cfg->socket_path, unless the option or the file set it, from
 * $DSPK_SOCKET or the default, and creates the default's directory when
 * create is set; end_job: for dspkd --end-job, whose refusal names
 * --job-state too.  0, -2 (logged) for a $DSPK_SOCKET longer than a Unix
 * socket's path may be (a bad value, exit 2, as --socket's), or -1
 * (logged). */
static int socket_path(struct dspkd_config *cfg, bool create, bool end_job) {
  const char *env = getenv("DSPK_SOCKET");
  const char *given = NULL;
  char dir[sizeof cfg->socket_path];
  int n;

  if (cfg->socket_path[0])
    return 0;
  if (env && *env)
    given = env;
  if (given) {
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
    if (max > sizeof cfg->socket_path)
      max = sizeof cfg->socket_path;
    if (strlen(given) >= max) {
      dspkd_error("$DSPK_SOCKET: expected a path of at most %zu bytes (a Unix socket's "
                  "limit), got %zu bytes", max - 1, strlen(given));
      return -2;
    }
    snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s", given);
    return 0;
  }
  if (geteuid() == 0) {
    snprintf(dir, sizeof dir, "/run/dspk");
  } else {
    const char *rt = getenv("XDG_RUNTIME_DIR");
    /* A relative one is ignored (the XDG Base Directory specification). */
    if (!rt || rt[0] != '/') {
      dspkd_error("XDG_RUNTIME_DIR is %s: give the socket with --socket PATH%s",
                  !rt ? "not set" : !*rt ? "empty" : "not an absolute path",
                  end_job ? ", or the state file with --job-state PATH (for --end-job "
                            "enough alone)"
                          : "");
      return -1;
    }
    n = snprintf(dir, sizeof dir, "%s/dspk", rt);
    if (n < 0 || (size_t)n >= sizeof dir) {
      dspkd_error("XDG_RUNTIME_DIR is too long: %s", rt);
      return -1;
    }
  }
  mode_t mode = geteuid() == 0 ? 0755 : 0700;
  if (create && mkdir(dir, mode) == 0) {
    /* Its mode whatever the umask (mkdir(2) gives mode & ~umask: under
     * umask 0777 a directory its own user cannot bind in, probe 22 E2). */
    if (chmod(dir, mode) != 0) {
      dspkd_error("cannot chmod %s to %04o: %s", dir, (unsigned)mode, strerror(errno));
      return -1;
    }
  } else if (create && errno != EEXIST) {
    dspkd_error("cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  if (untrusted_dir(dir) != 0)
    return -1;
  n = snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s/dspkd.sock", dir);
  if (n < 0 || (size_t)n >= sizeof cfg->socket_path) {
    dspkd_error("socket path too long: %s/dspkd.sock", dir);
    return -1;
  }
  return 0;
}

/* Puts /dev/null on standard descriptor fd (0, 1 or 2).  A standard
 * descriptor is never left closed: the next open(2), socket(2) or accept(2)
 * would take its number, and what the daemon writes to stderr (its log)
 * would go to that file or to a client's connection.  0, or -1 (errno). */
static int null_std_fd(int fd) {
  int null = open("/dev/null", O_RDWR);
  if (null < 0)
    return -1;
  if (null != fd) {
    if (dup2(null, fd) < 0) {
      int e = errno;
      close(null);
      errno = e;
      return -1;
    }
    close(null);
  }
  return 0;
}

/* Opens /dev/null on each of 0, 1 and 2 that the caller left closed
 * (`dspkd 2>&-`), before the daemon opens anything.  0, or -1 when
 * /dev/null cannot be opened (nothing can be logged then: stderr may be
 * the closed one). */
static int guard_std_fds(void) {
  for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && null_std_fd(fd) != 0)
      return -1;
  return 0;
}

/* The descriptors above 2 open when main started: the caller's (a script's
 * 9>&1, make's jobserver pipe, a supervisor's status pipe) and the ones
 * systemd passed.  Recorded before the daemon opens anything of its own, so
 * that a detached daemon can give back exactly the caller's
 * (close_inherited_fds). */
static int *inherited_fds;
static size_t n_inherited;

static void note_inherited(int fd) {
  int *n;
  if (n_inherited % 64 == 0) {
    n = realloc(inherited_fds, (n_inherited + 64) * sizeof *n);
    if (!n)
      return; /* not recorded: left open, as before */
    inherited_fds = n;
  }
  inherited_fds[n_inherited++] = fd;
}

/* Fills inherited_fds from /proc/self/fd, or, without /proc, by asking
 * fcntl(2) about every number below the soft RLIMIT_NOFILE (at most
 * 65536). */
static void record_inherited_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  struct dirent *e;

  if (dir) {
    while ((e = readdir(dir)) != NULL) {
      char *end;
      long fd = strtol(e->d_name, &end, 10);
      if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end || fd <= STDERR_FILENO ||
          fd > INT_MAX || fd == dirfd(dir))
        continue;
      note_inherited((int)fd);
    }
    closedir(dir);
    return;
  }
  struct rlimit rl;
  long top = 65536;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < (rlim_t)top)
    top = (long)rl.rlim_cur;
  for (long fd = STDERR_FILENO + 1; fd < top; fd++)
    if (fcntl((int)fd, F_GETFD) >= 0)
      note_inherited((int)fd);
}

/* Gives back the caller's descriptors (daemon(7)): a detached daemon
 * (detach != 0) closes every inherited descriptor above 2 but the ones it
 * was told to use (the --ready-fd until READY is written, the socket
 * passed by socket activation), so that whoever reads a pipe it passed
 * sees end-of-file at once rather than when the daemon exits; one in the
 * foreground keeps them but marks them close-on-exec, so that no child it
 * starts (an FFTW measure, a kernel compile) holds them either. */
static void close_inherited_fds(const struct dspkd *d, int detach) {
  for (size_t i = 0; i < n_inherited; i++) {
    int fd = inherited_fds[i];
    if (fd == d->cfg.ready_fd || (d->activation_fd > 0 && fd == d->activation_fd))
      continue;
    if (detach)
      close(fd);
    else
      (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  free(inherited_fds);
  inherited_fds = NULL;
  n_inherited = 0;
}

/* Tells whoever waits (the tests, the parent of a detached daemon) that
 * the socket is listening, and gives fd back: closed, or, for a standard
 * descriptor (--ready-fd 0 or 1), replaced by /dev/null so that no later
 * file or connection takes its number. */
static void signal_ready(int fd) {
  static const char msg[] = "READY\n";
  if (fd < 0)
    return;
  if (write(fd, msg, sizeof msg - 1) != (ssize_t)(sizeof msg - 1))
    dspkd_warn("cannot write READY to --ready-fd %d: %s", fd, strerror(errno));
  if (fd > STDERR_FILENO)
    close(fd);
  else if (null_std_fd(fd) != 0)
    dspkd_warn("--ready-fd %d: cannot put /dev/null there: %s", fd, strerror(errno));
}

/* Raises the soft RLIMIT_NOFILE to the hard limit, as systemd advises for
 * services that need many descriptors (its default soft limit, 1024, is
 * for select(); dspkd polls with epoll): each connection takes one
 * descriptor and may hold up to DSPKD_MAX_FDS more that it sent for a
 * buffer.import not yet handled (docs/admin.md, "File descriptors").  Logs
 * what it has, and a warning when even the hard limit cannot hold
 * max_clients connections with their pending descriptors, the lingering
 * ones and a reserve for the daemon's own files. */
static void raise_nofile(const struct dspkd_config *cfg) {
  struct rlimit rl;
  unsigned long long was;

  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return;
  was = (unsigned long long)rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      dspkd_warn("cannot raise the soft RLIMIT_NOFILE from %llu to its hard limit %llu: %s",
                 was, (unsigned long long)rl.rlim_max, strerror(errno));
      (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  dspkd_config_check_nofile(cfg, was);
}

/* Detaches: the parent waits until the child is listening (or failed) and
 * exits with its status.  Runs before any thread exists.  The child gives
 * back the caller's descriptors: stdin and stdout become /dev/null (but a
 * --ready-fd 0 or 1, which signal_ready gives back once READY is written),
 * the inherited ones above 2 are closed (close_inherited_fds); stderr is
 * dspkd_log_detached's, once listening.  Returns the fd the child writes
 * READY to, or -1 on error. */
static int detach(const struct dspkd *d) {
  int p[2];
  pid_t pid;
  char buf[8];
  ssize_t n;

  if (pipe2(p, O_CLOEXEC) != 0) {
    dspkd_error("pipe: %s", strerror(errno));
    return -1;
  }
  pid = fork();
  if (pid < 0) {
    dspkd_error("fork: %s", strerror(errno));
    return -1;
  }
  if (pid > 0) {
    int status;
    close(p[1]);
    do
      n = read(p[0], buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n > 0)
      _exit(0);
    /* The child failed before it was ready: report its status. */
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status))
      _exit(WEXITSTATUS(status) ? WEXITSTATUS(status) : 1);
    _exit(1);
  }
  close(p[0]);
  if (setsid() < 0)
    dspkd_warn("setsid: %s", strerror(errno));
  if (chdir("/") != 0)
    dspkd_warn("cannot leave the start directory: chdir /: %s", strerror(errno));
  for (int fd = STDIN_FILENO; fd < STDERR_FILENO; fd++)
    if (fd != d->cfg.ready_fd && null_std_fd(fd) != 0)
      dspkd_warn("cannot put /dev/null on descriptor %d: %s", fd, strerror(errno));
  close_inherited_fds(d, 1);
  return p[1];
}

/* The cache's notice (opts.notice): its file was deleted or replaced while
 * the daemon runs, and what it did about it.  Any thread; dspkd_log is one
 * write(2). */
static void cache_notice(void *ud, const char *line) {
  (void)ud;
  dspkd_warn("cache: %s", line);
}

/* "a" or "an" before word (an autotune entry, a kernels entry). */
static const char *article(const char *word) {
  return word && strchr("aeiou", word[0]) && word[0] ? "an" : "a";
}

/* The cache's put_result: a put that failed in the database (a full disk,
 * an I/O error) is logged as a warning the first time and then at most once
 * a minute (with how many failed meanwhile), and once when puts work again;
 * dspk_cache_put_errors_total counts every one.  Called with the cache's
 * lock held, so the state needs no lock of its own. */
static void cache_put_result(void *ud, int kind, int err, const char *detail) {
  static uint64_t last_ns, failed, unlogged;
  static int logged;
  uint64_t now = dspkd_now_ns();
  (void)ud;
  if (err == 0) {
    if (failed)
      dspkd_warn("cache: storing works again (%llu put%s had failed)",
                 (unsigned long long)failed, failed == 1 ? "" : "s");
    failed = unlogged = 0;
    logged = 0;
    return;
  }
  failed++;
  if (logged && now - last_ns < 60ull * 1000000000ull) {
    unlogged++;
    return;
  }
  if (unlogged)
    dspkd_warn("cache: cannot store %s %s entry: %s (%s; %llu more failed since the last such"
               " line, logged at most once a minute)",
               article(dspk__cache_kind_name(kind)), dspk__cache_kind_name(kind), detail,
               dspk__strerror(err),
               (unsigned long long)unlogged);
  else
    dspkd_warn("cache: cannot store %s %s entry: %s (%s; the entry is not kept;"
               " dspk_cache_put_errors_total counts these, logged at most once a minute)",
               article(dspk__cache_kind_name(kind)), dspk__cache_kind_name(kind), detail,
               dspk__strerror(err));
  logged = 1;
  last_ns = now;
  unlogged = 0;
}

/* The cache's dropped (opts.dropped): an entry it would have served was
 * damaged in the file, or its user could not take it; it was deleted and is
 * made again from its source as on a miss.  Logged once per entry (the
 * next get is a miss). */
static void cache_dropped(void *ud, int kind, const char *what, const char *why) {
  (void)ud;
  dspkd_warn("cache: dropped %s %s entry (%s): %s; it is made again as on a miss",
             article(dspk__cache_kind_name(kind)), dspk__cache_kind_name(kind), what, why);
}

/* Opens the persistent cache: cfg.cache_path, else $CACHE_DIRECTORY/cache.db
 * (systemd's CacheDirectory=; the first of a colon list), else the cache's
 * own default ($XDG_CACHE_HOME/dspk/cache.db).  A location that cannot be
 * used falls back to an in-memory cache inside dspk__cache_open, whose one
 * warning is logged here once.  0, or -1 (logged) when even that failed. */
static int open_cache(struct dspkd *d) {
  struct dspkd_config *cfg = &d->cfg;
  struct dspk__cache_opts opts = {.max_bytes = cfg->cache_max_bytes,
                                  .notice = cache_notice,
                                  .put_result = cache_put_result,
                                  .dropped = cache_dropped};
  const char *path = cfg->cache_path ? cfg->cache_path : dspkd_paths_cache_dir_file();
  char warn[PATH_MAX + 256] = "";
  int err;

  err = dspk__cache_open(path, &opts, &d->cache, warn, sizeof warn);
  if (err < 0) {
    dspkd_error("cannot open the cache %s: %s", path ? path : "(default location)",
                dspk__strerror(err));
    return -1;
  }
  if (warn[0])
    dspkd_warn("cache: %s", warn);
  dspkd_info("cache: %s%s", dspk__cache_path(d->cache),
             dspk__cache_waiting_for_file(d->cache)
                 ? " (in memory until the file is free)"
             : dspk__cache_in_memory(d->cache) ? " (in memory: nothing persists)"
                                               : "");
  return 0;
}

/* The environment variables that turn the Vulkan drivers' shader disk
 * caches off (Mesa's drivers: lavapipe, radv, anv...; NVIDIA's), set where
 * the environment does not already give them a value. */
static void driver_caches_off(void) {
  static const char *const vars[][2] = {{"MESA_SHADER_CACHE_DISABLE", "true"},
                                        {"__GL_SHADER_DISK_CACHE", "0"}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (setenv(vars[i][0], vars[i][1], 0) != 0)
      dspkd_warn("cannot set %s: %s", vars[i][0], strerror(errno));
}

/* Ignores a signal whose default action would end or stop the daemon at
 * once (devices open, the socket left) and that means nothing to it, unless
 * something already handles it: a profiler's SIGPROF (gprof, gperftools), a
 * sanitizer's or the runtime's (a signal valgrind reserves refuses the
 * change; it is not ours to touch). */
static void ignore_signal(int signum) {
  struct sigaction sa;
  if (sigaction(signum, NULL, &sa) != 0 || sa.sa_handler != SIG_DFL ||
      (sa.sa_flags & SA_SIGINFO))
    return;
  sa.sa_handler = SIG_IGN;
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  (void)sigaction(signum, &sa, NULL);
}

/* The signals dspkd(8) SIGNALS lists as ignored: every asynchronous one
 * whose default action ends or stops the process, but SIGTERM, SIGINT and
 * SIGHUP (watched), SIGQUIT (kept: the core dump on request), SIGXCPU
 * (kept: a soft RLIMIT_CPU asks for the end; and the children inherit what
 * is ignored here, kcompile.c's relies on it), SIGKILL and SIGSTOP (no
 * program can).  SIGSYS and SIGTRAP are faults when a seccomp
 * filter or a breakpoint raises them, and the kernel then forces their
 * default action whatever the disposition: ignoring them only stops a
 * kill(1) from ending the daemon at once.  The fault signals (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGABRT) keep theirs: the sanitizers' handlers
 * and the core dump of a crash need them. */
static void ignore_signals(void) {
  static const int ignored[] = {SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
                                SIGIO,   SIGPWR,  SIGXFSZ, SIGSTKFLT, SIGSYS,  SIGTRAP,
                                SIGTSTP, SIGTTIN, SIGTTOU};
  for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
    ignore_signal(ignored[i]);
  for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
    ignore_signal(s);
}

/* Under socket activation: says (warn) that the socket the command line,
 * the file or $DSPK_SOCKET named (given; "" when none did) is not the one
 * dspkd listens on (passed), as dspkd(8) says: the passed one is used, and
 * the log names both, so that an administrator who set another path sees
 * why it was not taken. */
static void note_unused_socket(const char *given, const char *passed) {
  const char *env = getenv("DSPK_SOCKET");
  char name[PATH_MAX + 32];

  if (given[0])
    dspkd_config_name("socket", name, sizeof name);
  else if (env && *env)
    snprintf(name, sizeof name, "$DSPK_SOCKET");
  else
    return;
  if (!given[0])
    given = env;
  if (dspkd_paths_same(given, passed))
    return;
  dspkd_warn("%s %s is not used: dspkd listens on the socket that socket activation passed, "
             "%s", name, given, passed);
}

/* The signals dspkd(8) SIGNALS says keep their default action: SIGQUIT
 * and SIGXCPU (the core dump on request, the end a soft RLIMIT_CPU asks
 * for), the faults, and SIGCHLD, SIGCONT, SIGURG and SIGWINCH.  Across an
 * exec a disposition survives only as SIG_DFL or SIG_IGN, and a shell
 * starts a background job of a script (dspkd &) with SIGQUIT and SIGINT
 * ignored: an ignored one is given its default action back, as SIGINT gets
 * its handler.  The children dspkd starts inherit it too: an ignored
 * SIGCHLD would reap them before waitpid(2) sees them, an ignored SIGXCPU
 * would let a kernel compile run past its soft RLIMIT_CPU.  A handler that
 * is already there (a sanitizer's) is not ignoring it, and stays. */
static void default_signals(void) {
  static const int kept[] = {SIGQUIT, SIGXCPU, SIGSEGV, SIGBUS,  SIGFPE,  SIGILL,
                             SIGABRT, SIGCHLD, SIGCONT, SIGURG, SIGWINCH};
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
    struct sigaction sa;
    if (sigaction(kept[i], NULL, &sa) != 0 || (sa.sa_flags & SA_SIGINFO) ||
        sa.sa_handler != SIG_IGN)
      continue;
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = 0;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(kept[i], &sa, NULL);
  }
}

/* d->socket_name: the socket as the log and status name it.  A relative
 * path is bound as given in the foreground (its absolute form may exceed
 * a socket's 107 bytes) but named absolute, as a detached daemon, which
 * made it absolute before leaving its start directory, names it (probe 22
 * E3: "listening on u/s.sock" told no one which file that was).  An
 * activated socket is named as activation passed it. */
static void socket_name(struct dspkd *d, bool activated) {
  const char *p = d->cfg.socket_path;
  char cwd[PATH_MAX];
  int n = -1;
  if (!activated && p[0] != '/' && getcwd(cwd, sizeof cwd))
    n = snprintf(d->socket_name, sizeof d->socket_name, "%s%s%s", cwd,
                 strcmp(cwd, "/") ? "/" : "", p);
  if (n < 0 || (size_t)n >= sizeof d->socket_name)
    snprintf(d->socket_name, sizeof d->socket_name, "%s", p);
}

int main(int argc, char **argv) {
  static struct dspkd daemon_state;
  struct dspkd *d = &daemon_state;
  struct dspkd_config *cfg = &d->cfg;
  uv_loop_t loop;
  char given_socket[sizeof cfg->socket_path];
  int detach_fd = -1, rc = 1, activated, sp;

  /* glibc serves blocks of 128 KiB and up with fresh mappings until a freed
   * one raises its threshold, so the first tasks after a start re-fault
   * every large buffer (read buffers, results: 2433 page faults on the
   * second 8 MiB fft after a restart).  Start where that dynamic threshold
   * ends anyway after a large free (its maxima: 32 MiB mmap threshold,
   * trim at twice that), so freed buffers are reused from the start. */
  /* A child that measures one FFTW plan for a runner (backends/cpu/fft.c):
   * nothing of the daemon runs in it. */
  if (argc == 3 && strcmp(argv[1], "--fftw-measure") == 0)
    return dspk__cpu_fft_measure_main(argv[2]);
  /* A child that compiles one client's kernel source for a runner under
   * limits (backends/common/kcompile.h): nothing of the daemon runs in it. */
  if (argc == 3 && strcmp(argv[1], "--kernel-compile") == 0)
    return dspk__kernel_compile_main(argv[2]);
  /* Before any driver loads (and before any thread reads the environment):
   * the drivers' own disk caches off.  Mesa keys its shader disk cache by
   * the shader's compiled form, from which the owner mark of a raw kernel
   * (an OpSourceExtension, vk_shader.c) is gone, so a hit there would show
   * one user, by its time, that another ran the same kernel
   * (docs/security.md).  A value the administrator set wins (docs/admin.md). */
  driver_caches_off();
  /* A stop or reload signal from now on is recorded, whichever thread takes
   * it (a library may have started threads before main, with every signal
   * unblocked), and acted on once the watchers are in place. */
  /* Before anything opens a descriptor: 0-2 are never left closed, and
   * what the caller passed above them is known (close_inherited_fds). */
  if (guard_std_fds() != 0)
    return 1;
  record_inherited_fds();
  dspkd_lifecycle_early();
  /* Until its watchers are in place (dspkd_lifecycle_start), a stop or a
   * reload waits (blocked here, recorded on other threads) instead of ending
   * the process by its default action; the
   * signals dspkd has no use for are ignored (a file size limit then fails a
   * write with EFBIG instead of killing the daemon). */
  sigset_t early;
  sigemptyset(&early);
  sigaddset(&early, SIGTERM);
  sigaddset(&early, SIGINT);
  sigaddset(&early, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &early, NULL);
  ignore_signals();
  default_signals();
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  dspkd_heap_warm();

  dspkd_config_defaults(cfg);
  dspkd_test_warn_hooks();
  dspkd_test_start_pause("early");

  /* The command line, then the file for what no option set (daemon/config.h). */
  switch (dspkd_config_start(argc, argv, cfg)) {
  case 0: break;
  case 1: return 0;
  case 2:
    printf("dspkd %s (protocol %d)\n", DSPKD_VERSION, DSPK_PROTOCOL_VERSION);
    return 0;
  default: return 2;
  }

  /* dspkd --end-job ID: the state file the daemon would use, changed
   * offline; nothing of the daemon starts. */
  if (cfg->end_job) {
    char said[sizeof d->job_state + 256] = "";
    /* A relative socket the file names, whose default state file would be
     * the daemon's start directory's (unknown here: the epilog runs in
     * slurmd's), is refused by the file's own rule: its paths are absolute
     * (daemon/config.c). */
    /* A job_state given needs no socket (dspkd_paths_start checks it
     * against the default one when there is one). */
    if ((!cfg->job_state && socket_path(cfg, false, true) != 0) || dspkd_paths_start(cfg, 0) != 0)
      return 2;
    int r = dspkd_jobstate_end_offline(d, cfg->end_job, said, sizeof said);
    /* The outcome on stdout, whatever the log level: the epilog tells
     * "ended in PATH" from "no state file PATH" by it (and the status). */
    if (said[0] && (printf("%s\n", said) < 0 || fflush(stdout) != 0))
      dspkd_error("%s (written here: standard output failed: %s)", said, strerror(errno));
    return r;
  }

  dspkd_test_start_pause("config");
  snprintf(given_socket, sizeof given_socket, "%s", cfg->socket_path);
  activated = dspkd_activation_start(d);
  if (activated < 0)
    return 1;
  /* The listening socket is the event loop's: READY written there, and the
   * descriptor closed after it, would end the service. */
  if (activated && cfg->ready_fd == d->activation_fd) {
    dspkd_error("--ready-fd %d: that is the listening socket passed by socket activation "
                "(LISTEN_FDS); give the write end of a pipe the caller reads", cfg->ready_fd);
    return 2;
  }
  if (activated)
    note_unused_socket(given_socket, cfg->socket_path);
  else if ((sp = socket_path(cfg, true, false)) != 0)
    return sp == -2 ? 2 : 1;
  /* "@name" is an abstract socket to every client (proto/sockpath.h):
   * dspkd serves one that socket activation passes, and binds none itself
   * (an abstract socket has no file mode: who may connect would be up to
   * the [policy] lists alone, which the admin chooses by a ListenStream=). */
  if (!activated && dspk__sock_is_abstract(cfg->socket_path)) {
    char name[PATH_MAX + 32];
    if (given_socket[0])
      dspkd_config_name("socket", name, sizeof name);
    else
      snprintf(name, sizeof name, "$DSPK_SOCKET");
    dspkd_error("%s %s: an abstract socket (@NAME) is served only when socket activation "
                "passes it (ListenStream=%s in dspkd.socket); dspkd binds a path itself "
                "(./%s names a file of that name)", name, cfg->socket_path, cfg->socket_path,
                cfg->socket_path);
    return 2;
  }
  /* Before any device opens: a second daemon must not touch the GPUs. */
  if (!activated && (dspkd_socket_check(cfg->socket_path) != 0 ||
                     dspkd_socket_dir_check(cfg->socket_path) != 0))
    return 1;
  /* Detached, it leaves its start directory (which could not be unmounted
   * while it runs): the relative paths are resolved first.  In the
   * foreground too, so that the log, status and cache.stats name the same
   * files either way (probe 22 E3). */
  if (dspkd_config_absolute(cfg, !cfg->foreground) != 0)
    return 1;
  socket_name(d, activated);
  /* The Slurm jobs' state file: named, and none of the daemon's other
   * files (a bad configuration: exit 2). */
  if (dspkd_paths_start(cfg, activated) != 0)
    return 2;
  /* Made absolute (a relative path is the start directory's), its
   * directory checked, and its lock held from now on, before the file is
   * read and before a detached daemon leaves for /. */
  if (dspkd_jobstate_start(d) != 0)
    return 2;
  dspkd_test_start_pause("jobs");
  dspkd_config_log_source();
  if (!cfg->foreground) {
    detach_fd = detach(d);
    if (detach_fd < 0)
      return 1;
  } else {
    close_inherited_fds(d, 0);
  }

  raise_nofile(cfg);
  d->start_ms = dspkd_now_ms();
  d->exit_code = 0;
  if (uv_loop_init(&loop) != 0) {
    dspkd_error("cannot start the event loop");
    return 1;
  }
  d->loop = &loop;
  if (!msgpack_zone_init(&d->zone, 64 << 10)) {
    dspkd_error("out of memory");
    goto out_loop;
  }
  pthread_mutex_init(&d->done_mu, NULL);
  uv_async_init(&loop, &d->done_async, dspkd_sched_done_cb);
  d->done_async.data = d;
  uv_timer_init(&loop, &d->grace_timer);
  d->grace_timer.data = d;
  uv_timer_init(&loop, &d->trim_timer);
  d->trim_timer.data = d;
  uv_timer_init(&loop, &d->hup_timer);
  d->hup_timer.data = d;
  uv_idle_init(&loop, &d->resume);
  d->resume.data = d;
  uv_idle_init(&loop, &d->later);
  d->later.data = d;
  /* SIGTERM and SIGINT have one watcher, daemon/lifecycle.c's: it logs the
   * signal, then stops, so the journal says why before "stopping". */
  dspkd_lifecycle_start(d); /* SIGTERM during the start: acted on once the loop runs */
  pthread_sigmask(SIG_UNBLOCK, &early, NULL);

  if (cfg->no_cache)
    dspkd_config_log_no_cache();
  else if (open_cache(d) != 0)
    goto out_handles;

  if (dspkd_devices_start(d) != 0)
    goto out_devices;
  dspkd_shm_report_pages();
  dspkd_shm_report_maps(cfg);
  /* The Slurm jobs registered before a restart, matched to the devices
   * just opened, before any client is served (daemon/jobstate.c). */
  dspkd_jobstate_load(d);
  dspkd_teardown_arm(d); /* exit() from now on closes the devices first */
  if (dspkd_metrics_http_start(d) != 0)
    goto out_devices;
  if (dspkd_socket_open(d) != 0)
    goto out_devices;
  signal_ready(cfg->ready_fd);
  if (detach_fd >= 0) {
    signal_ready(detach_fd);
    dspkd_log_detached(); /* the starter's stderr is not held until we exit */
  }
  detach_fd = -1;
  dspkd_lifecycle_ready(d);

  uv_run(&loop, UV_RUN_DEFAULT);
  if (!d->runners_stopped) {
    /* The loop ended without the stop: a fatal error; still close in order. */
    dspkd_error("the event loop ended unexpectedly; stopping the devices");
    d->exit_code = 1;
    d->stopping = d->runners_stopped = true;
    dspkd_sched_stop(d);
  }
  dspkd_lifecycle_close(d);
  rc = d->exit_code;
  goto out_done;

out_devices:
  /* Start-up failed after the runners started: stop them in order. */
  d->stopping = true;
  d->runners_stopped = true;
  dspkd_sched_stop(d);
  rc = 1;
out_handles:
  uv_close((uv_handle_t *)&d->done_async, NULL);
  uv_close((uv_handle_t *)&d->grace_timer, NULL);
  uv_close((uv_handle_t *)&d->trim_timer, NULL);
  uv_close((uv_handle_t *)&d->hup_timer, NULL);
  uv_close((uv_handle_t *)&d->resume, NULL);
  uv_close((uv_handle_t *)&d->later, NULL);
  dspkd_lifecycle_close(d);
  dspkd_sched_join(d, true);
  uv_run(&loop, UV_RUN_DEFAULT);
out_done:
  if (d->obs.http) {
    dspkd_metrics_http_stop(d);
    uv_run(&loop, UV_RUN_DEFAULT); /* its handle's close */
  }
  dspkd_sched_join(d, true);
  dspkd_trace_free(d);
  dspkd_jobs_free(d);
  dspkd_teardown_disarm();
  dspkd_backends_shutdown(d);
  dspk__cache_close(d->cache);
  msgpack_zone_destroy(&d->zone);
  pthread_mutex_destroy(&d->done_mu);
out_loop:
  if (uv_loop_close(&loop) != 0)
    dspkd_warn("event loop closed with handles still open");
  dspkd_teardown_report();
  dspkd_log_client_flush(); /* what the last minute held back */
  if (rc == 0)
    dspkd_info("stopped");
  if (detach_fd >= 0)
    close(detach_fd);
  return rc;
}
