/*
 * The daemon's own files (daemon/paths.h): which paths it runs on, that the
 * Slurm jobs' state file is none of the others, and what a reload compares.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/paths.h"

#include "cache/cache.h"

/* What the daemon runs on, from dspkd_paths_start: the socket (for a
 * reload, as the start had it), the cache file ("" for none), the state
 * file. */
static struct {
  bool activated;
  char start[PATH_MAX]; /* the start directory ("" unknown): a reloaded file's
                           relative paths are its, as at start */
  char socket[PATH_MAX];
  char cache[PATH_MAX];
  char job_state[PATH_MAX];
} run;

const char *dspkd_paths_cache_dir_file(void) {
  static char path[PATH_MAX];
  const char *cd = getenv("CACHE_DIRECTORY");
  int n;
  if (!cd || cd[0] != '/')
    return NULL;
  n = snprintf(path, sizeof path, "%.*s/cache.db", (int)strcspn(cd, ":"), cd);
  return n > 0 && (size_t)n < sizeof path ? path : NULL;
}

/* The cache file the cache key's value p names (the default when NULL) in
 * out; "" for none ("" or ":memory:").  0, or -1 when it cannot be told
 * (no home). */
static int cache_named(const char *p, char *out, size_t len) {
  char *dflt = NULL;
  int n;

  out[0] = '\0';
  if (p && !p[0])
    return 0;
  if (!p)
    p = dspkd_paths_cache_dir_file();
  if (!p && !(p = dflt = dspk__cache_default_path()))
    return -1;
  n = snprintf(out, len, "%s", strcmp(p, ":memory:") ? p : "");
  free(dflt);
  return n >= 0 && (size_t)n < len ? 0 : -1;
}

/* The cache file cfg's cache and no_cache name together (no_cache wins) in
 * out; "" for none.  0, or -1 as cache_named. */
static int cache_file(const struct dspkd_config *cfg, char *out, size_t len) {
  out[0] = '\0';
  return cfg->no_cache ? 0 : cache_named(cfg->cache_path, out, len);
}

/* The socket dspkd listens on when the socket key is unset (main.c's
 * socket_path: $DSPK_SOCKET, else the runtime directory's dspk/dspkd.sock). */
static int default_socket(char *out, size_t len) {
  const char *env = getenv("DSPK_SOCKET"), *rt = getenv("XDG_RUNTIME_DIR");
  int n;
  if (env && *env)
    n = snprintf(out, len, "%s", env);
  else if (geteuid() == 0)
    n = snprintf(out, len, "/run/dspk/dspkd.sock");
  else if (rt && rt[0] == '/') /* a relative one is ignored, as in main.c */
    n = snprintf(out, len, "%s/dspk/dspkd.sock", rt);
  else
    return -1;
  return n >= 0 && (size_t)n < len ? 0 : -1;
}

/* socket with the symbolic links of its last component followed (up to 40,
 * as the kernel does; a relative target is the link's directory's), in
 * out: the path of the socket itself, which a daemon never listens on
 * through a link (its start refuses a socket path that is not a socket).
 * A path that is not a link, or whose link cannot be read, stays as it is. */
static void follow_last(const char *socket, char *out, size_t len) {
  char cur[PATH_MAX], target[PATH_MAX];
  struct stat st;

  snprintf(cur, sizeof cur, "%s", socket);
  for (int hops = 0; hops < 40 && lstat(cur, &st) == 0 && S_ISLNK(st.st_mode); hops++) {
    ssize_t n = readlink(cur, target, sizeof target - 1);
    const char *slash = strrchr(cur, '/');
    char next[PATH_MAX];
    int k;

    if (n <= 0)
      break;
    target[n] = '\0';
    if (target[0] == '/' || !slash)
      k = snprintf(next, sizeof next, "%s", target);
    else
      k = snprintf(next, sizeof next, "%.*s/%s", (int)(slash - cur), cur, target);
    if (k < 0 || (size_t)k >= sizeof next)
      break;
    memcpy(cur, next, (size_t)k + 1);
  }
  snprintf(out, len, "%s", cur);
}

/* Whether the daemon's socket s (activated: passed by socket activation)
 * is a file: neither an activated one without an address ("(activated
 * socket, fd N)") nor an abstract one ("@name", proto/sockpath.h), which
 * have no directory for a state file beside them. */
static bool sock_has_path(const char *s, bool activated) {
  return !(activated && s[0] == '(') && s[0] != '@';
}

/* The state file's default for a daemon on socket: the socket's path, the
 * links of its last component followed (follow_last: a socket named
 * through a link, as an epilog's DSPK_SOCKET may, is the daemon's socket
 * the link leads to), with its ".sock" suffix (if any) replaced by ".jobs";
 * for an activated socket without a path, dspkd.jobs in $RUNTIME_DIRECTORY
 * (systemd's RuntimeDirectory=).  0, or -1 when neither is known. */
static int default_job_state(const char *given, bool has_path, char *out, size_t len) {
  const char *rt = getenv("RUNTIME_DIRECTORY");
  char socket[PATH_MAX];
  size_t n;
  int k;

  follow_last(given, socket, sizeof socket);
  n = strlen(socket);
  if (has_path) {
    if (n > 5 && strcmp(socket + n - 5, ".sock") == 0)
      n -= 5;
    k = snprintf(out, len, "%.*s.jobs", (int)n, socket);
  } else if (rt && rt[0] == '/') {
    k = snprintf(out, len, "%.*s/dspkd.jobs", (int)strcspn(rt, ":"), rt);
  } else {
    return -1;
  }
  return k >= 0 && (size_t)k < len ? 0 : -1;
}

/* path with its directory resolved (realpath) when that directory exists,
 * else path as given, in out. */
static void resolve_dir(const char *path, char *out, size_t len) {
  char dir[PATH_MAX], real[PATH_MAX];
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  int n;

  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  if (!realpath(dir, real)) {
    snprintf(out, len, "%s", path);
    return;
  }
  n = snprintf(out, len, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
  if (n < 0 || (size_t)n >= len)
    snprintf(out, len, "%s", path);
}

bool dspkd_paths_same(const char *a, const char *b) {
  struct stat sa, sb;
  char ra[PATH_MAX], rb[PATH_MAX];

  if (strcmp(a, b) == 0)
    return true;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  resolve_dir(a, ra, sizeof ra);
  resolve_dir(b, rb, sizeof rb);
  return strcmp(ra, rb) == 0;
}

/* The name of another of the daemon's files that path is, or NULL: the
 * socket (sock, NULL without a path), the configuration file (conf, NULL
 * for none) or the cache (cache, "" for none) and the files SQLite keeps
 * beside it.  The one it is goes into what. */
static const char *collides(const char *path, const char *sock, const char *conf,
                            const char *cache, char *what, size_t len) {
  static const char *const sides[] = {"", "-wal", "-shm", "-journal"};
  char side[PATH_MAX + 16];

  if (sock && dspkd_paths_same(path, sock)) {
    snprintf(what, len, "%s", sock);
    return "the socket";
  }
  if (conf && dspkd_paths_same(path, conf)) {
    snprintf(what, len, "%s", conf);
    return "the configuration file";
  }
  for (size_t i = 0; cache[0] && i < sizeof sides / sizeof sides[0]; i++) {
    snprintf(side, sizeof side, "%s%s", cache, sides[i]);
    if (dspkd_paths_same(path, side)) {
      snprintf(what, len, "%s", side);
      return i ? "a file of the cache's (SQLite's, beside it)" : "the cache";
    }
  }
  return NULL;
}

/* A reloaded file's path p as the start read it: a relative one from the
 * start directory (a detached daemon has left it for /). */
static void from_start(char *p, size_t len) {
  char rel[PATH_MAX];
  if (!p[0] || p[0] == '/' || p[0] == '(' || p[0] == '@' || !run.start[0])
    return;
  snprintf(rel, sizeof rel, "%s", p);
  int n = snprintf(p, len, "%s/%s", run.start, rel);
  if (n < 0 || (size_t)n >= len) /* too long to be the running file */
    snprintf(p, len, "%s", rel);
}

/* The checks of a state file's path js (absolute; name: the setting that
 * named it, for the message) against the daemon's other files: the socket
 * sock (NULL for none), the configuration file conf (NULL for none) and
 * the cache (cache, "" for none), for the file, its temporary file and its
 * lock file; and its name: one ending in ".lock" or ".tmp" is the name of
 * another state file's lock or temporary file (PATH.lock, PATH.tmp), so
 * that two daemons, or a daemon and itself, would share one file.  0, or -1
 * with the one line that says why in why. */
static int check_paths(const char *js, const char *sock, const char *conf,
                       const char *cache, const char *name, char *why, size_t len) {
  char what[PATH_MAX + 16], tmp[PATH_MAX + 8], lock[PATH_MAX + 8];
  const char *is, *base = strrchr(js, '/') ? strrchr(js, '/') + 1 : js;
  size_t n = strlen(base);

  snprintf(tmp, sizeof tmp, "%s.tmp", js);
  snprintf(lock, sizeof lock, "%s.lock", js);
  if ((is = collides(js, sock, conf, cache, what, sizeof what)) != NULL) {
    snprintf(why, len, "%s %s is %s (%s): the Slurm jobs' state file would replace it at "
             "the first job.register; give it a path of its own", name, js, is, what);
    return -1;
  }
  if ((is = collides(tmp, sock, conf, cache, what, sizeof what)) != NULL) {
    snprintf(why, len, "%s %s: its temporary file %s is %s (%s), which each job.register "
             "would remove; give the state file another path", name, js, tmp, is, what);
    return -1;
  }
  /* Checked before the lock is taken (dspkd_jobstate_start creates it):
   * a lock file made at the socket's path made the bind fail ("exists and
   * is not a socket") and stayed, failing every later start; the cache
   * would double as the lock file. */
  if ((is = collides(lock, sock, conf, cache, what, sizeof what)) != NULL) {
    snprintf(why, len, "%s %s: its lock file %s is %s (%s), which dspkd would create and "
             "hold while it runs; give the state file another path", name, js, lock, is,
             what);
    return -1;
  }
  /* A state file at another one's PATH.lock renamed a new file over the
   * lock that daemon holds (its flock then on a removed file, and dspkd
   * --end-job free to change its state file under it); one at its
   * PATH.tmp is removed by its next write; and a daemon on PATH whose
   * PATH.lock is another daemon's state file locks that file, which the
   * other's next write replaces.  By name, whether the other file exists
   * yet or not. */
  for (int i = 0; i < 2; i++) {
    const char *sfx = i ? ".tmp" : ".lock";
    size_t k = strlen(sfx);
    if (n > k && strcmp(base + n - k, sfx) == 0) {
      snprintf(why, len, "%s %s ends in %s, the name of the %s file of another state file "
               "(%.*s, whose daemon %s); give the state file a name that does not end in "
               ".lock or .tmp", name, js, sfx, i ? "temporary" : "lock", (int)(strlen(js) - k),
               js, i ? "removes it at each write" : "holds an flock(2) on it while it runs");
      return -1;
    }
  }
  return 0;
}

/* What the regular file at path is when it is another dspkd's or
 * SQLite's, or NULL: a dspkd state file (it begins "dspkd-jobs "), a file
 * another process holds an flock(2) on (a lock file: another daemon's
 * PATH.lock; SQLite locks with fcntl(2), never flock, so a cache that
 * another process shares is not one), a path whose PATH.lock, empty,
 * another process holds an flock on (a running daemon's state file, which
 * it has not written yet), and, unless side (path is one of the files SQLite
 * keeps beside the cache, not the cache), one whose name ends in -wal,
 * -shm or -journal beside a database (another cache's file of SQLite's).
 * The database's path goes into what for the last.  Nothing is changed:
 * the flock is tried shared, without waiting, and let go at once. */
static const char *cache_foreign(const char *path, bool side, char *what, size_t len) {
  static const char *const sfx[] = {"-wal", "-shm", "-journal"};
  static const char magic[] = "dspkd-jobs ", sqlite[16] = "SQLite format 3";
  const char *is = NULL;
  char head[sizeof sqlite];
  struct stat st;
  size_t n = strlen(path);
  ssize_t got;
  int fd;

  if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
      (fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) >= 0) {
    do
      got = pread(fd, head, sizeof magic - 1, 0);
    while (got < 0 && errno == EINTR);
    if (got == (ssize_t)sizeof magic - 1 && memcmp(head, magic, sizeof magic - 1) == 0)
      is = "a dspkd state file (another daemon's job_state, whose registered jobs the "
           "cache would replace)";
    else if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      is = "a file another process holds an flock(2) on (a lock file: another dspkd's "
           "PATH.lock)";
    close(fd); /* lets a shared lock taken here go */
    if (is)
      return is;
  }
  /* A state file not written yet (no job registered) has its lock file
   * already, held by its daemon (empty: dspkd never writes it). */
  char lock[PATH_MAX + 8];
  if ((size_t)snprintf(lock, sizeof lock, "%s.lock", path) < sizeof lock &&
      stat(lock, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 &&
      (fd = open(lock, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) >= 0) {
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      is = "the state file of another running dspkd (another process holds an flock(2) on "
           "its lock file, PATH.lock)";
    close(fd);
    if (is)
      return is;
  }
  for (size_t i = 0; !side && i < sizeof sfx / sizeof sfx[0]; i++) {
    size_t k = strlen(sfx[i]);
    if (n <= k || strcmp(path + n - k, sfx[i]) != 0)
      continue;
    snprintf(what, len, "%.*s", (int)(n - k), path);
    if (stat(what, &st) != 0 || !S_ISREG(st.st_mode))
      return NULL;
    if (st.st_size != 0 && ((fd = open(what, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0 ||
                            (got = pread(fd, head, sizeof head, 0), close(fd),
                             got != (ssize_t)sizeof head ||
                                 memcmp(head, sqlite, sizeof head) != 0)))
      return NULL;
    return "a file SQLite keeps beside the database";
  }
  return NULL;
}

/* The cache (cache, "" none) and the files SQLite keeps beside it checked
 * against the socket (sock) and the configuration file (conf), and against
 * the files of other daemons (cache_foreign): the cache opened at the
 * configuration file's path took it for a corrupt cache, moved it aside
 * and wrote a database there (the next start could not read its
 * configuration); opened at the socket's, it made the bind fail and
 * stayed, failing every later start; opened at another daemon's state
 * file, lock file or cache's -wal, it moved that file aside or wrote a
 * database into it under the daemon that runs on it.  name: the setting,
 * for the message; foreign: the checks against other daemons' files
 * (made after the state file's own, which name this daemon's own state
 * and lock files as such), else those against the socket and the
 * configuration file.  0, or -1 with the one line that says why in why. */
static int check_cache(const char *cache, const char *sock, const char *conf,
                       const char *name, bool foreign, char *why, size_t len) {
  static const char *const sides[] = {"", "-wal", "-shm", "-journal"};
  char side[PATH_MAX + 16], what[PATH_MAX + 16];
  const char *is;

  for (size_t i = 0; cache[0] && i < sizeof sides / sizeof sides[0]; i++) {
    snprintf(side, sizeof side, "%s%s", cache, sides[i]);
    if (!foreign && (is = collides(side, sock, conf, "", what, sizeof what)) != NULL) {
      if (i == 0)
        snprintf(why, len, "%s %s is %s (%s): the cache would be made in its place; give "
                 "the cache a path of its own", name, cache, is, what);
      else
        snprintf(why, len, "%s %s: its file %s (SQLite's, beside it) is %s (%s), which "
                 "SQLite would create and remove; give the cache another path", name, cache,
                 side, is, what);
      return -1;
    }
    what[0] = '\0';
    if (!foreign || (is = cache_foreign(side, i != 0, what, sizeof what)) == NULL)
      continue;
    if (what[0])
      snprintf(why, len, "%s %s is %s %s (another cache's, which SQLite would move aside "
               "under the daemon that uses it); give the cache a path of its own", name,
               cache, is, what);
    else if (i == 0)
      snprintf(why, len, "%s %s is %s: the cache would be made in its place; give the cache "
               "a path of its own", name, cache, is);
    else
      snprintf(why, len, "%s %s: its file %s (SQLite's, beside it) is %s, which SQLite "
               "would open as the cache's; give the cache another path", name, cache, side,
               is);
    return -1;
  }
  return 0;
}

int dspkd_paths_start(struct dspkd_config *cfg, int activated) {
  bool has_path = sock_has_path(cfg->socket_path, activated);
  char name[PATH_MAX + 64], cname[PATH_MAX + 64], why[3 * PATH_MAX + 512];
  char dflt[PATH_MAX];
  const char *conf = dspkd_config_file(), *sock = has_path ? cfg->socket_path : NULL;

  run.activated = activated;
  if (!getcwd(run.start, sizeof run.start))
    run.start[0] = '\0';
  snprintf(run.socket, sizeof run.socket, "%s", cfg->socket_path);
  if (cache_file(cfg, run.cache, sizeof run.cache) != 0)
    run.cache[0] = '\0'; /* no home: the cache falls back to memory */
  dspkd_config_name("job_state", name, sizeof name);
  if (cfg->job_state) {
    snprintf(run.job_state, sizeof run.job_state, "%s", cfg->job_state);
  } else if (default_job_state(cfg->socket_path, has_path, run.job_state,
                               sizeof run.job_state) != 0) {
    if (!has_path || getenv("RUNTIME_DIRECTORY"))
      dspkd_error("Slurm jobs: the socket passed by socket activation has no path (an "
                  "abstract or unnamed socket) and $RUNTIME_DIRECTORY names no directory: "
                  "there is no default state file, and without one the registered jobs "
                  "would be lost at each restart; set job_state (dspk.conf(5))");
    else
      dspkd_error("Slurm jobs: the default state file's path is too long; set job_state");
    return -1;
  }
  /* Absolute, as a reload compares them (a detached daemon is in / then). */
  from_start(run.socket, sizeof run.socket);
  from_start(run.cache, sizeof run.cache);
  from_start(run.job_state, sizeof run.job_state);
  /* jobstate.c takes it from here: its own default is not needed. */
  cfg->job_state = run.job_state;
  /* dspkd --end-job with job_state set names no socket (none is needed,
   * and a user without $XDG_RUNTIME_DIR has none): the default one, when
   * it can be told, is the daemon's that the collisions are checked
   * against. */
  if (sock && !sock[0])
    sock = default_socket(dflt, sizeof dflt) == 0 ? dflt : NULL;
  /* Before the cache is opened (made, when absent). */
  dspkd_config_name("cache", cname, sizeof cname);
  if (check_cache(run.cache, sock, conf, cname, false, why, sizeof why) != 0 ||
      check_paths(run.job_state, sock, conf, run.cache, name, why, sizeof why) != 0 ||
      check_cache(run.cache, sock, conf, cname, true, why, sizeof why) != 0) {
    dspkd_error("%s", why);
    return -1;
  }
  return 0;
}

/* The socket a reloaded file nw gives the daemon (socket_fixed: the
 * command line's), in sock: the running one under socket activation or
 * when the command line set it, else the file's, else the default one.
 * 0, or -1 when the default cannot be told. */
static int reload_socket(const struct dspkd_config *nw, bool socket_fixed, char *sock,
                         size_t len) {
  if (run.activated || socket_fixed || !nw->socket_path[0]) {
    if (!run.activated && !socket_fixed && !nw->socket_path[0])
      return default_socket(sock, len);
    snprintf(sock, len, "%s", run.socket);
    return 0;
  }
  snprintf(sock, len, "%s", nw->socket_path);
  from_start(sock, len);
  return 0;
}

/* The state file a reloaded file nw names (its default for the socket
 * sock when unset), absolute, in jobs.  0, or -1 when none can be told. */
static int reload_job_state(const struct dspkd_config *nw, const char *sock, char *jobs,
                            size_t len) {
  bool has_path = sock_has_path(run.socket, run.activated);
  if (nw->job_state) {
    snprintf(jobs, len, "%s", nw->job_state);
    from_start(jobs, len);
    return 0;
  }
  return default_job_state(sock, has_path, jobs, len);
}

int dspkd_paths_reload_check(const struct dspkd_config *nw, bool socket_fixed,
                             bool job_state_fixed, bool cache_fixed, char *why, size_t len) {
  char sock[PATH_MAX], cache[PATH_MAX], jobs[PATH_MAX], name[PATH_MAX + 64];
  char cname[PATH_MAX + 64];
  bool has_path = sock_has_path(run.socket, run.activated);

  /* A file without socket, for a daemon with no default one (not root,
   * no absolute $XDG_RUNTIME_DIR, no $DSPK_SOCKET): the next start refuses
   * it ("give the socket with --socket PATH"), and so does the reload
   * (probe 20 E2: it was "reloaded", every restart-only key logged as
   * changed). */
  if (reload_socket(nw, socket_fixed, sock, sizeof sock) != 0) {
    const char *rt = getenv("XDG_RUNTIME_DIR");
    snprintf(why, len, "the file sets no socket, and this daemon has no default one "
             "(XDG_RUNTIME_DIR is %s, $DSPK_SOCKET is unset, and it does not run as root): "
             "the next start would refuse it; give socket in the file",
             !rt ? "not set" : !*rt ? "empty" : rt[0] != '/' ? "not an absolute path"
                                                             : "too long");
    return -1;
  }
  if (job_state_fixed)
    snprintf(jobs, sizeof jobs, "%s", run.job_state);
  else if (reload_job_state(nw, sock, jobs, sizeof jobs) != 0)
    return 0;
  if (cache_fixed)
    snprintf(cache, sizeof cache, "%s", run.cache);
  else if (cache_file(nw, cache, sizeof cache) != 0)
    cache[0] = '\0';
  from_start(cache, sizeof cache);
  dspkd_config_name("job_state", name, sizeof name);
  dspkd_config_name("cache", cname, sizeof cname);
  /* The cache's checks as at start: a cache the next start refuses is
   * refused now.  Those against other daemons' files only for a cache
   * other than the running one, which passed them at start (and whose
   * file another process may lock for a while without making it theirs). */
  if (check_cache(cache, has_path ? sock : NULL, dspkd_config_file(), cname, false, why,
                  len) != 0 ||
      check_paths(jobs, has_path ? sock : NULL, dspkd_config_file(), cache, name, why,
                  len) != 0)
    return -1;
  if (!cache[0] || (run.cache[0] && dspkd_paths_same(cache, run.cache)))
    return 0;
  return check_cache(cache, has_path ? sock : NULL, dspkd_config_file(), cname, true, why,
                     len);
}

int dspkd_paths_reload_job_state(const struct dspkd_config *nw, bool socket_fixed,
                                 char *jobs, size_t len) {
  char sock[PATH_MAX];
  const char *env = getenv("DSPK_SOCKET");
  if (reload_socket(nw, socket_fixed, sock, sizeof sock) != 0 ||
      reload_job_state(nw, sock, jobs, len) != 0)
    return -1;
  /* The default socket's directory (/run/dspk, $XDG_RUNTIME_DIR/dspk) is
   * made by the start before it looks at the state file beside it. */
  return !nw->job_state && !run.activated && !socket_fixed && !nw->socket_path[0] &&
         !(env && *env);
}

int dspkd_paths_reload_differs(const char *key, const struct dspkd_config *was,
                               const struct dspkd_config *nw, bool socket_fixed) {
  char sock[PATH_MAX], cache[PATH_MAX], jobs[PATH_MAX];

  /* Under socket activation the socket is the one passed, whatever the
   * file says; a socket the command line set is not the file's either.
   * Only socket and job_state depend on it (a socket that cannot be told
   * made every restart-only key "changed": probe 20 E2). */
  if (strcmp(key, "socket") == 0)
    return reload_socket(nw, socket_fixed, sock, sizeof sock) != 0 ||
           !dspkd_paths_same(sock, run.socket);
  if (strcmp(key, "job_state") == 0) {
    if (reload_socket(nw, socket_fixed, sock, sizeof sock) != 0 ||
        reload_job_state(nw, sock, jobs, sizeof jobs) != 0)
      return 1;
    return !dspkd_paths_same(jobs, run.job_state);
  }
  if (strcmp(key, "no_cache") == 0 || strcmp(key, "cache") == 0) {
    char named[PATH_MAX], named_was[PATH_MAX];
    bool no_cache_changed = nw->no_cache != was->no_cache, cache_changed;

    /* The two keys choose one file: nothing changed unless it did. */
    if (cache_file(nw, cache, sizeof cache) != 0)
      cache[0] = '\0';
    from_start(cache, sizeof cache);
    if (!cache[0] ? !run.cache[0] : run.cache[0] && dspkd_paths_same(cache, run.cache))
      return 0;
    /* Then it is said of the key the file changed (each, when both did):
     * cache's value is the file it names alone, no_cache aside. */
    if (cache_named(nw->cache_path, named, sizeof named) != 0)
      named[0] = '\0';
    if (cache_named(was->cache_path, named_was, sizeof named_was) != 0)
      named_was[0] = '\0';
    from_start(named, sizeof named);
    from_start(named_was, sizeof named_was);
    cache_changed = !named[0] != !named_was[0] ||
                    (named[0] && !dspkd_paths_same(named, named_was));
    if (strcmp(key, "no_cache") == 0)
      return no_cache_changed;
    return cache_changed || !no_cache_changed;
  }
  return -1;
}
