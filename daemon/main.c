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
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/activation.h"
#include "daemon/config.h"
#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/lifecycle.h"
#include "daemon/log.h"
#include "daemon/teardown.h"

#include "cache/cache.h"
#include "proto/units.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: dspkd [OPTION]...\n"
          "The dspk compute daemon: runs compute tasks that clients submit over a Unix\n"
          "socket (docs/protocol.md) on the host's devices.\n"
          "\n"
          "  --config PATH        configuration file (default " DSPKD_CONFIG_DEFAULT "\n"
          "                       when it exists; \"\" for none); flags override it\n"
          "  --socket PATH        listen here (default $DSPK_SOCKET, else\n"
          "                       $XDG_RUNTIME_DIR/dspk/dspkd.sock, /run/dspk/dspkd.sock as root)\n"
          "  --cache PATH         the persistent cache file (SQLite); default\n"
          "                       $CACHE_DIRECTORY/cache.db under systemd, else\n"
          "                       $XDG_CACHE_HOME/dspk/cache.db (~/.cache/dspk/cache.db)\n"
          "  --no-cache           run without a persistent cache (as --cache \"\")\n"
          "  --cache-max-bytes SIZE  size bound of the cache; least recently used entries\n"
          "                       are evicted (default 256M)\n"
          "  --backends LIST      comma list of backends to use (default: every one available)\n"
          "  --foreground         stay in the foreground (default: detach once listening)\n"
          "  --log-level LEVEL    error, warn, notice, info (default) or debug\n"
          "  --ready-fd N         write \"READY\\n\" to file descriptor N once listening, close it\n"
          "  --max-message SIZE   largest message (default 256M)\n"
          "  --max-depth N        nesting of arrays/maps (default 16)\n"
          "  --max-objects N      msgpack objects in one message (default 1048576)\n"
          "  --max-rank N         tensor rank (default 8, at most 8)\n"
          "  --max-elements N     elements in one tensor (default 2147483648)\n"
          "  --max-inflight N     requests in flight per connection (default 1024)\n"
          "  --max-unsent SIZE    unwritten response bytes per connection before reading\n"
          "                       pauses (default 64M)\n"
          "  --max-buffers N      buffers per connection (default 4096)\n"
          "  --max-clients N      open connections (default 256)\n"
          "  --max-user-clients N open connections of one user (default 64)\n"
          "  --max-user-partial SIZE  bytes of incomplete messages of one user's\n"
          "                       connections together (default 1G)\n"
          "  --max-user-memory SIZE|N%%  device memory of one user on each device:\n"
          "                       buffers and tasks in flight (default 50%%)\n"
          "  --max-conn-memory SIZE|N%%  the same for one connection (default 100%%)\n"
          "  --max-job-memory SIZE|N%%  the same for one Slurm job's connections\n"
          "                       together (default 100%%)\n"
          "  --job-required       a connection without a registered Slurm job may use\n"
          "                       the cpu only (default: every device)\n"
          "  --shutdown-timeout MS  at stop, cancel tasks still running after this\n"
          "                       (default 10000)\n"
          "  --idle-trim MS       once the last client has left, give cached memory\n"
          "                       back after this long (default 5000)\n"
          "  --metrics-listen ADDR:PORT  serve Prometheus metrics over HTTP at\n"
          "                       http://ADDR:PORT/metrics (default: off)\n"
          "  --device-inflight N  tasks a device has enqueued ahead of their answers\n"
          "                       (default 4, at most 64)\n"
          "  -h, --help           show this help\n"
          "  -V, --version        show the version\n"
          "\n"
          "SIZE is a byte count with an optional binary unit: K or KiB, M or MiB, G or\n"
          "GiB, T or TiB (2M = 2097152).\n"
          "\n"
          "The log goes to stderr, one line per event; when stderr is the systemd journal\n"
          "(JOURNAL_STREAM) each line carries its syslog priority (<3> error ... <7> debug).\n");
}

enum {
  OPT_SOCKET = 256, OPT_CACHE, OPT_BACKENDS, OPT_FOREGROUND, OPT_LOG_LEVEL, OPT_READY_FD,
  OPT_MAX_MESSAGE, OPT_MAX_DEPTH, OPT_MAX_OBJECTS, OPT_MAX_RANK, OPT_MAX_ELEMENTS,
  OPT_MAX_INFLIGHT, OPT_MAX_UNSENT, OPT_MAX_BUFFERS, OPT_MAX_CLIENTS, OPT_SHUTDOWN_TIMEOUT,
  OPT_HELP, OPT_VERSION, OPT_CONFIG, OPT_NO_CACHE, OPT_CACHE_MAX_BYTES,
  OPT_MAX_USER_CLIENTS, OPT_MAX_USER_PARTIAL, OPT_MAX_USER_MEMORY, OPT_MAX_CONN_MEMORY,
  OPT_METRICS_LISTEN, OPT_MAX_JOB_MEMORY, OPT_JOB_REQUIRED, OPT_IDLE_TRIM,
  OPT_DEVICE_INFLIGHT
};

static const struct option long_opts[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"cache", required_argument, NULL, OPT_CACHE},
    {"no-cache", no_argument, NULL, OPT_NO_CACHE},
    {"cache-max-bytes", required_argument, NULL, OPT_CACHE_MAX_BYTES},
    {"backends", required_argument, NULL, OPT_BACKENDS},
    {"foreground", no_argument, NULL, OPT_FOREGROUND},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"ready-fd", required_argument, NULL, OPT_READY_FD},
    {"max-message", required_argument, NULL, OPT_MAX_MESSAGE},
    {"max-depth", required_argument, NULL, OPT_MAX_DEPTH},
    {"max-objects", required_argument, NULL, OPT_MAX_OBJECTS},
    {"max-rank", required_argument, NULL, OPT_MAX_RANK},
    {"max-elements", required_argument, NULL, OPT_MAX_ELEMENTS},
    {"max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT},
    {"max-unsent", required_argument, NULL, OPT_MAX_UNSENT},
    {"max-buffers", required_argument, NULL, OPT_MAX_BUFFERS},
    {"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
    {"max-user-clients", required_argument, NULL, OPT_MAX_USER_CLIENTS},
    {"max-user-partial", required_argument, NULL, OPT_MAX_USER_PARTIAL},
    {"max-user-memory", required_argument, NULL, OPT_MAX_USER_MEMORY},
    {"max-conn-memory", required_argument, NULL, OPT_MAX_CONN_MEMORY},
    {"max-job-memory", required_argument, NULL, OPT_MAX_JOB_MEMORY},
    {"job-required", no_argument, NULL, OPT_JOB_REQUIRED},
    {"shutdown-timeout", required_argument, NULL, OPT_SHUTDOWN_TIMEOUT},
    {"idle-trim", required_argument, NULL, OPT_IDLE_TRIM},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"metrics-listen", required_argument, NULL, OPT_METRICS_LISTEN},
    {"device-inflight", required_argument, NULL, OPT_DEVICE_INFLIGHT},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* Parses a decimal count in [lo, hi]; 0, or -1 with a message. */
static int parse_count(const char *opt, const char *s, uint64_t lo, uint64_t hi,
                       uint64_t *out) {
  char *end;
  unsigned long long v;
  errno = 0;
  if (!*s || *s == '-')
    goto bad;
  v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi)
    goto bad;
  *out = v;
  return 0;
bad:
  fprintf(stderr, "dspkd: --%s: expected an integer from %llu to %llu, got \"%s\"\n", opt,
          (unsigned long long)lo, (unsigned long long)hi, s);
  return -1;
}

/* Parses a byte count with an optional unit (proto/units.h: 2M, 64KiB) in
 * [lo, hi]; 0, or -1 with a message. */
static int parse_bytes(const char *opt, const char *s, uint64_t lo, uint64_t hi,
                       uint64_t *out) {
  uint64_t v;
  if (dspk__parse_size(s, &v) != 0 || v < lo || v > hi) {
    fprintf(stderr,
            "dspkd: --%s: expected a size from %llu to %llu bytes (suffix K, M, G or T "
            "allowed), got \"%s\"\n",
            opt, (unsigned long long)lo, (unsigned long long)hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* Fills cfg->socket_path from --socket, $DSPK_SOCKET or the default, and
 * creates the default's directory.  0 or -1 (logged). */
static int socket_path(struct dspkd_config *cfg, const char *given) {
  const char *env = getenv("DSPK_SOCKET");
  char dir[sizeof cfg->socket_path];
  int n;

  if (!given && env && *env)
    given = env;
  if (given) {
    if (strlen(given) >= sizeof cfg->socket_path) {
      dspkd_error("socket path too long (%zu bytes): %s", strlen(given), given);
      return -1;
    }
    snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s", given);
    return 0;
  }
  if (geteuid() == 0) {
    snprintf(dir, sizeof dir, "/run/dspk");
  } else {
    const char *rt = getenv("XDG_RUNTIME_DIR");
    if (!rt || !*rt) {
      dspkd_error("XDG_RUNTIME_DIR is not set: give the socket with --socket PATH");
      return -1;
    }
    n = snprintf(dir, sizeof dir, "%s/dspk", rt);
    if (n < 0 || (size_t)n >= sizeof dir) {
      dspkd_error("XDG_RUNTIME_DIR is too long: %s", rt);
      return -1;
    }
  }
  if (mkdir(dir, geteuid() == 0 ? 0755 : 0700) != 0 && errno != EEXIST) {
    dspkd_error("cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  n = snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s/dspkd.sock", dir);
  if (n < 0 || (size_t)n >= sizeof cfg->socket_path) {
    dspkd_error("socket path too long: %s/dspkd.sock", dir);
    return -1;
  }
  return 0;
}

static void on_signal(uv_signal_t *h, int signum) {
  struct dspkd *d = h->data;
  dspkd_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  d->exit_code = 0;
  dspkd_stop(d);
}

/* Tells whoever waits (the tests, the parent of a detached daemon) that
 * the socket is listening. */
static void signal_ready(int fd) {
  static const char msg[] = "READY\n";
  if (fd < 0)
    return;
  if (write(fd, msg, sizeof msg - 1) != (ssize_t)(sizeof msg - 1))
    dspkd_warn("--ready-fd %d: %s", fd, strerror(errno));
  close(fd);
}

/* Detaches: the parent waits until the child is listening (or failed) and
 * exits with its status.  Runs before any thread exists.  Returns the fd the
 * child writes READY to, or -1 on error. */
static int detach(void) {
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
  {
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      if (null > STDERR_FILENO)
        close(null);
    }
  }
  return p[1];
}

/* Opens the persistent cache: cfg.cache_path, else $CACHE_DIRECTORY/cache.db
 * (systemd's CacheDirectory=; the first of a colon list), else the cache's
 * own default ($XDG_CACHE_HOME/dspk/cache.db).  A location that cannot be
 * used falls back to an in-memory cache inside dspk__cache_open, whose one
 * warning is logged here once.  0, or -1 (logged) when even that failed. */
static int open_cache(struct dspkd *d) {
  struct dspkd_config *cfg = &d->cfg;
  struct dspk__cache_opts opts = {.max_bytes = cfg->cache_max_bytes};
  const char *path = cfg->cache_path, *cd = getenv("CACHE_DIRECTORY");
  static char sdpath[PATH_MAX];
  char warn[PATH_MAX + 256] = "";
  int err;

  if (!path && cd && cd[0] == '/') {
    size_t n = strcspn(cd, ":");
    int k = snprintf(sdpath, sizeof sdpath, "%.*s/cache.db", (int)n, cd);
    if (k > 0 && (size_t)k < sizeof sdpath)
      path = sdpath;
  }
  err = dspk__cache_open(path, &opts, &d->cache, warn, sizeof warn);
  if (err < 0) {
    dspkd_error("cannot open the cache %s: %s", path ? path : "(default location)",
                dspk__strerror(err));
    return -1;
  }
  if (warn[0])
    dspkd_warn("cache: %s", warn);
  dspkd_info("cache: %s%s", dspk__cache_path(d->cache),
             dspk__cache_in_memory(d->cache) ? " (in memory: nothing persists)" : "");
  return 0;
}

int main(int argc, char **argv) {
  static struct dspkd daemon_state;
  struct dspkd *d = &daemon_state;
  struct dspkd_config *cfg = &d->cfg;
  const char *given_socket = NULL;
  uv_loop_t loop;
  uint64_t v;
  int opt, detach_fd = -1, rc = 1, activated;
  int cli_cache = 0; /* 1: --cache PATH, -1: --no-cache (the last one wins) */
  enum dspkd_level level;

  /* glibc serves blocks of 128 KiB and up with fresh mappings until a freed
   * one raises its threshold, so the first tasks after a start re-fault
   * every large buffer (read buffers, results: 2433 page faults on the
   * second 8 MiB fft after a restart).  Start where that dynamic threshold
   * ends anyway after a large free (its maxima: 32 MiB mmap threshold,
   * trim at twice that), so freed buffers are reused from the start. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  dspkd_heap_warm();

  dspkd_config_defaults(cfg);

  while ((opt = getopt_long(argc, argv, "hV", long_opts, NULL)) != -1) {
    switch (opt) {
    case OPT_SOCKET: given_socket = optarg; break;
    case OPT_CACHE:
      cfg->cache_path = optarg;
      cli_cache = 1;
      break;
    case OPT_NO_CACHE: cli_cache = -1; break;
    case OPT_CACHE_MAX_BYTES:
      if (parse_bytes("cache-max-bytes", optarg, 4096, (uint64_t)1 << 40, &v)) return 2;
      cfg->cache_max_bytes = v;
      break;
    case OPT_BACKENDS: cfg->backends = optarg; break;
    case OPT_FOREGROUND: cfg->foreground = true; break;
    case OPT_LOG_LEVEL:
      if (dspkd_log_parse_level(optarg, &level) != 0) {
        fprintf(stderr, "dspkd: --log-level: expected error, warn, notice, info or debug\n");
        return 2;
      }
      dspkd_log_set_level(level);
      break;
    case OPT_READY_FD:
      if (parse_count("ready-fd", optarg, 0, INT_MAX, &v)) return 2;
      if (fcntl((int)v, F_GETFD) < 0) {
        fprintf(stderr, "dspkd: --ready-fd %s: not an open file descriptor\n", optarg);
        return 2;
      }
      cfg->ready_fd = (int)v;
      break;
    case OPT_MAX_MESSAGE:
      if (parse_bytes("max-message", optarg, 64, (uint64_t)1 << 32, &v)) return 2;
      cfg->lim.max_message = (size_t)v;
      break;
    case OPT_MAX_DEPTH:
      if (parse_count("max-depth", optarg, 4, 1024, &v)) return 2;
      cfg->lim.max_depth = (unsigned)v;
      break;
    case OPT_MAX_OBJECTS:
      if (parse_count("max-objects", optarg, 16, (uint64_t)1 << 28, &v)) return 2;
      cfg->lim.max_objects = (size_t)v;
      break;
    case OPT_MAX_RANK:
      if (parse_count("max-rank", optarg, 1, DSPK_MAX_RANK, &v)) return 2;
      cfg->lim.max_rank = (unsigned)v;
      break;
    case OPT_MAX_ELEMENTS:
      if (parse_count("max-elements", optarg, 1, (uint64_t)1 << 40, &v)) return 2;
      cfg->lim.max_elements = v;
      break;
    case OPT_MAX_INFLIGHT:
      if (parse_count("max-inflight", optarg, 1, 1 << 20, &v)) return 2;
      cfg->max_inflight = (size_t)v;
      break;
    case OPT_MAX_UNSENT:
      if (parse_bytes("max-unsent", optarg, 1, (uint64_t)1 << 40, &v)) return 2;
      cfg->max_unsent = (size_t)v;
      break;
    case OPT_MAX_BUFFERS:
      if (parse_count("max-buffers", optarg, 1, 1 << 24, &v)) return 2;
      cfg->max_buffers = (size_t)v;
      break;
    case OPT_MAX_CLIENTS:
      if (parse_count("max-clients", optarg, 1, 1 << 20, &v)) return 2;
      cfg->max_clients = (size_t)v;
      break;
    case OPT_MAX_USER_CLIENTS:
      if (parse_count("max-user-clients", optarg, 1, 1 << 20, &v)) return 2;
      cfg->max_user_clients = (size_t)v;
      break;
    case OPT_MAX_USER_PARTIAL:
      if (parse_bytes("max-user-partial", optarg, 4096, (uint64_t)1 << 40, &v)) return 2;
      cfg->max_user_partial = v;
      break;
    case OPT_MAX_USER_MEMORY:
    case OPT_MAX_CONN_MEMORY:
    case OPT_MAX_JOB_MEMORY:
      if (dspkd_config_parse_share(optarg, 1, (uint64_t)1 << 50, &v) != 0) {
        fprintf(stderr, "dspkd: --%s: expected a size (suffix K, M, G or T allowed) or a "
                "share of each device's memory from 1%% to 100%%\n",
                opt == OPT_MAX_USER_MEMORY   ? "max-user-memory"
                : opt == OPT_MAX_CONN_MEMORY ? "max-conn-memory"
                                             : "max-job-memory");
        return 2;
      }
      if (opt == OPT_MAX_USER_MEMORY)
        cfg->max_user_memory = v;
      else if (opt == OPT_MAX_CONN_MEMORY)
        cfg->max_conn_memory = v;
      else
        cfg->max_job_memory = v;
      break;
    case OPT_JOB_REQUIRED: cfg->job_required = true; break;
    case OPT_SHUTDOWN_TIMEOUT:
      if (parse_count("shutdown-timeout", optarg, 0, (uint64_t)1 << 40, &v)) return 2;
      cfg->shutdown_timeout_ms = v;
      break;
    case OPT_IDLE_TRIM:
      if (parse_count("idle-trim", optarg, 0, (uint64_t)1 << 40, &v)) return 2;
      cfg->idle_trim_ms = v;
      break;
    case OPT_METRICS_LISTEN: cfg->metrics_listen = optarg; break;
    case OPT_DEVICE_INFLIGHT:
      if (parse_count("device-inflight", optarg, 1, DSPKD_MAX_DEVICE_INFLIGHT, &v)) return 2;
      cfg->device_inflight = (unsigned)v;
      break;
    case OPT_CONFIG: break; /* read by dspkd_config_start() */
    case 'h':
    case OPT_HELP:
      usage(stdout);
      return 0;
    case 'V':
    case OPT_VERSION:
      printf("dspkd %s (protocol %d)\n", DSPKD_VERSION, DSPK_PROTOCOL_VERSION);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "dspkd: unexpected argument \"%s\" (see --help)\n", argv[optind]);
    return 2;
  }

  /* The file fills what no flag set (daemon/config.h). */
  if (dspkd_config_start(argc, argv, cfg) != 0)
    return 2;
  /* Which cache: a flag wins over the file; the file's no_cache wins over
   * its cache; "" is no cache. */
  if (cli_cache)
    cfg->no_cache = cli_cache < 0;
  if (cli_cache < 0 || (cfg->cache_path && !cfg->cache_path[0])) {
    cfg->no_cache = true;
    cfg->cache_path = NULL;
  }

  signal(SIGPIPE, SIG_IGN);
  activated = dspkd_activation_start(d);
  if (activated < 0)
    return 1;
  if (!activated &&
      socket_path(cfg, given_socket ? given_socket : dspkd_config_file_socket()) != 0)
    return 1;
  /* Before any device opens: a second daemon must not touch the GPUs. */
  if (!activated && dspkd_socket_check(cfg->socket_path) != 0)
    return 1;
  if (!cfg->foreground) {
    detach_fd = detach();
    if (detach_fd < 0)
      return 1;
  }

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
  uv_signal_init(&loop, &d->sigterm);
  uv_signal_init(&loop, &d->sigint);
  d->sigterm.data = d->sigint.data = d;
  dspkd_lifecycle_start(d); /* SIGTERM during the start: acted on once the loop runs */

  if (!cfg->no_cache && open_cache(d) != 0)
    goto out_handles;

  if (dspkd_devices_start(d) != 0)
    goto out_devices;
  dspkd_teardown_arm(d); /* exit() from now on closes the devices first */
  if (dspkd_metrics_http_start(d) != 0)
    goto out_devices;
  if (dspkd_socket_open(d) != 0)
    goto out_devices;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  signal_ready(cfg->ready_fd);
  signal_ready(detach_fd);
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
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
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
  if (rc == 0)
    dspkd_info("stopped");
  if (detach_fd >= 0)
    close(detach_fd);
  return rc;
}
