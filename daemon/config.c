/*
 * dspkd's settings: the command line and the configuration file
 * (daemon/config.h).  One table describes every setting once: its section
 * and key in the file, its option (the same name with dashes), where it
 * lives in struct dspkd_config, its type and range, its default, its --help
 * text, and whether a reload may change it.  The defaults, getopt_long's
 * option list, the --help text, the range checks and the file's keys are all
 * made from it.  The file is read with libinih through a reader that counts
 * lines, so every error names file:line, and that refuses what libinih
 * would take but read otherwise than dspk.conf(5) says.  Unknown sections
 * and keys are errors, not warnings: a typo in a limit must not go
 * unnoticed.
 *
 * Precedence: command line > file > defaults.  getopt_long notes which keys
 * the command line set, so the file and a reload leave them alone.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef DSPKD_HAVE_INIH
#include <ini.h>
#endif

#include "backends/backend.h"
#include "cache/cache.h"
#include "daemon/config.h"
#include "daemon/linger.h"
#include "daemon/log.h"
#include "daemon/paths.h"
#include "proto/testhook.h"
#include "proto/units.h"
#include "proto/utf8.h"

#define DSPKD_SUN_PATH sizeof(((struct sockaddr_un *)0)->sun_path)

/* User text (a line of the file, a command-line argument) for a message,
 * with what cannot be seen escaped (dspk__utf8_visible: a tab as \t, a
 * zero-width space as \u200b, a byte that is not UTF-8 as \xNN), in one
 * of 8 rotating buffers: several may appear in one message.  Parsing runs
 * on one thread at a time (start, reload). */
static const char *visn(const char *s, size_t n) {
  static char buf[8][256];
  static unsigned next;
  char *b = buf[next++ % 8];
  return dspk__utf8_visible(b, sizeof buf[0], s, n);
}

static const char *vis(const char *s) { return visn(s, strlen(s)); }

/* K_SHARE: a size in bytes, or a share of a device's memory ("50%").
 * K_CONFIG, K_FD, K_HELP and K_VERSION are options of the command line
 * only (no field, or one the file cannot set). */
enum ktype { K_SOCKET, K_STR, K_BOOL, K_LEVEL, K_UINT, K_SIZE, K_MS, K_USERS, K_GROUPS,
             K_SHARE, K_CONFIG, K_FD, K_HELP, K_VERSION };

/* Where a setting may be given. */
enum { IN_FILE = 1, IN_ARGV = 2, IN_BOTH = 3 };

/* One daemon setting, described once: the command-line option, the file
 * key, the --help text, the default and the range all come from its row. */
struct key {
  const char *section; /* the file's section; NULL: command line only */
  const char *name;    /* file key; the option is the same with '-' for '_' */
  enum ktype type;
  size_t off, width; /* the field in struct dspkd_config */
  uint64_t lo, hi;
  bool reload;      /* a reload may change it */
  int where;        /* IN_FILE, IN_ARGV or both */
  const char *dflt; /* the default, written as in the file; NULL: none, or see help */
  const char *arg;  /* the option's value in --help; NULL: takes none */
  const char *help; /* --help text (" (default DFLT)" is appended) */
};

#define F(field) offsetof(struct dspkd_config, field), sizeof(((struct dspkd_config *)0)->field)
#define NOF 0, 0

/* In the order of --help.  tests/install/docs.sh reads the rows that begin
 * with {"section", "key", K_... and checks the man page and the example
 * file against them. */
static const struct key keys[] = {
    {NULL, "config", K_CONFIG, NOF, 0, 0, false, IN_ARGV, NULL, "PATH",
     "configuration file (default " DSPKD_CONFIG_DEFAULT " when it exists; \"\" for none); "
     "options override it"},
    {"daemon", "socket", K_SOCKET, F(socket_path), 0, 0, false, IN_BOTH, NULL, "PATH",
     "listen here (default $DSPK_SOCKET, else /run/dspk/dspkd.sock as root, else "
     "$XDG_RUNTIME_DIR/dspk/dspkd.sock)"},
    {"daemon", "cache", K_STR, F(cache_path), 0, 0, false, IN_BOTH, NULL, "PATH",
     "the persistent cache file (SQLite); default $CACHE_DIRECTORY/cache.db under systemd, "
     "else $XDG_CACHE_HOME/dspk/cache.db (~/.cache/dspk/cache.db)"},
    {"daemon", "no_cache", K_BOOL, F(no_cache), 0, 0, false, IN_BOTH, NULL, NULL,
     "run without a persistent cache (as --cache \"\")"},
    {"daemon", "cache_max_bytes", K_SIZE, F(cache_max_bytes), 4096, (uint64_t)1 << 40, false,
     IN_BOTH, "256M", "SIZE",
     "size bound of the cache; least recently used entries are evicted"},
    {"daemon", "job_state", K_STR, F(job_state), 0, 0, false, IN_BOTH, NULL, "PATH",
     "the file the registered Slurm jobs are kept in across restarts (default: the "
     "socket's path with .jobs for .sock, /run/dspk/dspkd.jobs under systemd)"},
    {"daemon", "backends", K_STR, F(backends), 0, 0, false, IN_BOTH, NULL, "LIST",
     "comma list of backends to use (default: every one available)"},
    {"daemon", "raw_kernels", K_STR, F(raw_kernels), 0, 0, false, IN_BOTH, "all", "LIST",
     "devices that run clients' raw kernels: all, none, or a comma list of device ids "
     "(vulkan:0,cuda:1); the others refuse them (ENOTSUP)"},
    {"daemon", "foreground", K_BOOL, F(foreground), 0, 0, false, IN_BOTH, NULL, NULL,
     "stay in the foreground (default: detach once listening)"},
    {"daemon", "log_level", K_LEVEL, F(log_level), 0, 0, true, IN_BOTH, "info", "LEVEL",
     "error, warn, notice, info or debug"},
    {NULL, "end_job", K_UINT, F(end_job), 1, UINT64_MAX, false, IN_ARGV, NULL, "ID",
     "do not start: mark Slurm job ID ended in the job_state file, for an epilog that "
     "finds no daemon, and print what was found; exit 0 (ended in the file, now or "
     "before), 4 (no state file there, nor perhaps its directory, or a file where its "
     "directory should be: nothing registered), 3 "
     "when a running dspkd holds the file (end the job through it), 1 when the file is "
     "refused or cannot be locked or written, 2 for a bad ID (digits from 1, no leading "
     "zero), command line or configuration, or when no state file can be named, it is "
     "another of dspkd's files, or its directory cannot be looked at (dspkd(8))"},
    {NULL, "ready_fd", K_FD, F(ready_fd), 0, INT_MAX, false, IN_ARGV, NULL, "N",
     "write \"READY\\n\" to file descriptor N (not 2) once listening, close it"},
    {"limits", "max_message", K_SIZE, F(lim.max_message), 64, (uint64_t)1 << 32, true,
     IN_BOTH, "256M", "SIZE", "largest message"},
    {"limits", "max_depth", K_UINT, F(lim.max_depth), 4, 1024, true, IN_BOTH, "16", "N",
     "nesting of arrays/maps"},
    {"limits", "max_objects", K_UINT, F(lim.max_objects), 16, (uint64_t)1 << 28, true,
     IN_BOTH, "65536", "N", "msgpack objects in one message"},
    {"limits", "max_rank", K_UINT, F(lim.max_rank), 1, DSPK_MAX_RANK, true, IN_BOTH, "8", "N",
     "tensor rank (at most 8)"},
    {"limits", "max_elements", K_UINT, F(lim.max_elements), 1, (uint64_t)1 << 40, true,
     IN_BOTH, "2147483648", "N", "elements in one tensor"},
    {"limits", "max_inflight", K_UINT, F(max_inflight), 1, 1 << 20, true, IN_BOTH, "1024",
     "N", "requests in flight per connection"},
    {"limits", "max_unsent", K_SIZE, F(max_unsent), 1, (uint64_t)1 << 40, true, IN_BOTH,
     "64M", "SIZE",
     "unwritten response bytes per connection before reading pauses"},
    {"limits", "max_buffers", K_UINT, F(max_buffers), 1, 1 << 24, true, IN_BOTH, "4096", "N",
     "buffers per connection"},
    {"limits", "max_clients", K_UINT, F(max_clients), 1, 1 << 20, true, IN_BOTH, "256", "N",
     "open connections"},
    /* One user may hold a quarter of the connections (max_user_clients has
     * no fixed default: unset, it is derived from max_clients by
     * derive_defaults(), at start and at each reload), half of each
     * device's memory, and four largest messages in incomplete frames. */
    {"limits", "max_user_clients", K_UINT, F(max_user_clients), 1, 1 << 20, true, IN_BOTH,
     NULL, "N", "open connections of one user (default: a quarter of max_clients, at least 1)"},
    /* Memory mappings of one user's buffers: no fixed default either, a
     * quarter of what vm.max_map_count leaves clients (dspkd_maps_budget). */
    {"limits", "max_user_maps", K_UINT, F(max_user_maps), 1, 1 << 24, true, IN_BOTH, NULL,
     "N", "memory mappings the daemon makes for one user's buffers (imported, shared, and "
     "cpu buffers of 2 MiB and up) (default: a quarter of what vm.max_map_count leaves "
     "clients)"},
    {"limits", "max_user_partial", K_SIZE, F(max_user_partial), 4096, (uint64_t)1 << 40,
     true, IN_BOTH, "1G", "SIZE",
     "bytes of incomplete messages of one user's connections together"},
    {"limits", "max_user_unsent", K_SIZE, F(max_user_unsent), 1, (uint64_t)1 << 40, true,
     IN_BOTH, "256M", "SIZE",
     "unwritten response bytes of one user's connections together before their reading "
     "pauses"},
    {"limits", "max_user_memory", K_SHARE, F(max_user_memory), 1, (uint64_t)1 << 50, true,
     IN_BOTH, "50%", "SIZE|N%",
     "device memory of one user on each device: buffers and tasks in flight"},
    {"limits", "max_conn_memory", K_SHARE, F(max_conn_memory), 1, (uint64_t)1 << 50, true,
     IN_BOTH, "100%", "SIZE|N%", "the same for one connection"},
    {"limits", "max_job_memory", K_SHARE, F(max_job_memory), 1, (uint64_t)1 << 50, true,
     IN_BOTH, "100%", "SIZE|N%", "the same for one Slurm job's connections together"},
    /* All users together: no fixed default either, a share that depends on
     * the device (dspkd_quota_total: the host's RAM is also the system's,
     * the daemon's own and the clients', and cpu buffers are backed only
     * when written, so the kernel would not refuse them in time). */
    {"limits", "max_memory", K_SHARE, F(max_memory), 1, (uint64_t)1 << 50, true, IN_BOTH,
     NULL, "SIZE|N%",
     "device memory of all users together on each device, as the quotas above count it "
     "(default: 75% of the cpu device's, the host's RAM; 100% of any other device's)"},
    {"policy", "job_required", K_BOOL, F(job_required), 0, 0, true, IN_BOTH, NULL, NULL,
     "a connection without a registered Slurm job may use the cpu only (default: every "
     "device)"},
    {"daemon", "shutdown_timeout", K_MS, F(shutdown_timeout_ms), 0, (uint64_t)1 << 40, true,
     IN_BOTH, "10000", "MS", "at stop, cancel tasks still running after this"},
    {"daemon", "idle_trim", K_MS, F(idle_trim_ms), 0, (uint64_t)1 << 40, true, IN_BOTH, "5000",
     "MS", "once the last client has left, give cached memory back after this long"},
    {"daemon", "metrics_listen", K_STR, F(metrics_listen), 0, 0, false, IN_BOTH, NULL,
     "ADDR:PORT",
     "serve Prometheus metrics over HTTP at http://ADDR:PORT/metrics (default: off)"},
    {"daemon", "device_inflight", K_UINT, F(device_inflight), 1, DSPKD_MAX_DEVICE_INFLIGHT,
     false, IN_BOTH, "4", "N",
     "tasks a device has enqueued ahead of their answers (at most 64)"},
    {"policy", "allow_users", K_USERS, F(allow_users), 0, 0, true, IN_FILE, NULL, NULL, NULL},
    {"policy", "allow_groups", K_GROUPS, F(allow_groups), 0, 0, true, IN_FILE, NULL, NULL,
     NULL},
    {"policy", "admin_users", K_USERS, F(admin_users), 0, 0, true, IN_FILE, NULL, NULL, NULL},
    {"policy", "admin_groups", K_GROUPS, F(admin_groups), 0, 0, true, IN_FILE, NULL, NULL,
     NULL},
    {NULL, "help", K_HELP, NOF, 0, 0, false, IN_ARGV, NULL, NULL, "show this help"},
    {NULL, "version", K_VERSION, NOF, 0, 0, false, IN_ARGV, NULL, NULL, "show the version"},
};
#define NKEYS (sizeof keys / sizeof keys[0])
_Static_assert(NKEYS <= 64, "the key masks are 64-bit");

/* What the start found, for reloads. */
static char conf_path[PATH_MAX];
static bool have_conf;     /* a file was read (at start or by a reload since) */
static bool conf_default;  /* no --config: conf_path is the default, read when it exists */
static uint64_t flag_mask; /* bit i: keys[i] came from the command line */
static char file_socket[256];
static char *file_strs[NKEYS]; /* strings of the file the configuration owns */
/* The restart-only keys as the start set them (file, else defaults): what a
 * reload compares a new file's values with, so that a key the file changed,
 * added or removed is logged alike. */
static struct dspkd_config start_cfg;
static char *reload_strs[NKEYS]; /* a reload's strings, freed once compared */
/* What turned the cache off, for dspkd_config_log_no_cache: an option, or
 * the file's no_cache. */
static const char *no_cache_from = "";

static int key_index(const char *name) {
  for (size_t i = 0; i < NKEYS; i++)
    if (strcmp(keys[i].name, name) == 0)
      return (int)i;
  return -1;
}

static int store(const struct key *k, const char *value, bool from_file,
                 struct dspkd_config *cfg, char *why, size_t len);

void dspkd_maps_budget(uint64_t max_map_count, uint64_t *clients, uint64_t *user) {
  uint64_t reserve = max_map_count / 4;
  if (reserve < DSPKD_MAPS_RESERVE_MIN)
    reserve = DSPKD_MAPS_RESERVE_MIN;
  if (reserve > max_map_count / 2)
    reserve = max_map_count / 2;
  *clients = max_map_count - reserve;
  *user = *clients / 4 ? *clients / 4 : 1;
}

uint64_t dspkd_max_map_count(void) {
  /* Test hook (proto/testhook.h): a small count, which a process cannot
   * set for itself, so that tests reach the clients' ceiling. */
  const char *e = DSPK_TEST_HOOK("DSPKD_TEST_MAX_MAP_COUNT");
  unsigned long long v = 0;
  FILE *f;
  if (e && sscanf(e, "%llu", &v) == 1 && v > 0)
    return (uint64_t)v;
  if ((f = fopen("/proc/sys/vm/max_map_count", "re")) != NULL) {
    if (fscanf(f, "%llu", &v) != 1)
      v = 0;
    fclose(f);
  }
  return v > 0 ? (uint64_t)v : DSPKD_MAX_MAP_COUNT_DEFAULT;
}

/* The defaults computed from other keys, for those left unset (0, below
 * every such key's lower bound) once the command line and the file are
 * read: max_user_clients, a quarter of max_clients (at least 1); and the
 * mappings: vm.max_map_count read again, the clients' share of it, and
 * max_user_maps, a quarter of that share. */
static void derive_defaults(struct dspkd_config *cfg) {
  uint64_t user;
  if (cfg->max_user_clients == 0)
    cfg->max_user_clients = cfg->max_clients / 4 ? cfg->max_clients / 4 : 1;
  cfg->max_map_count = dspkd_max_map_count();
  dspkd_maps_budget(cfg->max_map_count, &cfg->maps_clients, &user);
  if (cfg->max_user_maps == 0)
    cfg->max_user_maps = user;
}

/* Warns of limits that are each in range but together never apply (at
 * start and at each reload, once the derived ones are set): a user quota
 * above the whole (max_user_clients > max_clients). */
static void warn_limits(const struct dspkd_config *cfg) {
  char name[PATH_MAX + 64];
  if (cfg->max_user_clients > cfg->max_clients)
    dspkd_warn("%s %zu is more than max_clients %zu: one user is bounded by max_clients "
               "alone (give max_user_clients %zu or less)",
               dspkd_config_name("max_user_clients", name, sizeof name), cfg->max_user_clients,
               cfg->max_clients, cfg->max_clients);
}

void dspkd_config_defaults(struct dspkd_config *cfg) {
  char why[160];
  memset(cfg, 0, sizeof *cfg);
  dspk__limits_default(&cfg->lim);
  cfg->ready_fd = -1;
  for (size_t i = 0; i < NKEYS; i++) {
    if (!keys[i].dflt)
      continue;
    /* The table's own defaults always parse (tests/lifecycle checks the
     * values through status). */
    if (store(&keys[i], keys[i].dflt, false, cfg, why, sizeof why) != 0)
      abort();
  }
}

/* ---- values ----------------------------------------------------------- */

static void put_uint(void *p, size_t width, uint64_t v) {
  if (width == sizeof(uint32_t)) {
    uint32_t x = (uint32_t)v;
    memcpy(p, &x, sizeof x);
  } else {
    memcpy(p, &v, sizeof v);
  }
}

/* Whether s begins with a 0 followed by another digit ("08", "065534"): a
 * number that reads two ways (octal to some readers).  Every number of the
 * file and the command line refuses it (counts, sizes, shares, durations,
 * ports, device indexes), and a user or group list takes such a word as a
 * name, never as a number (outside probe 16 E3). */
static bool leading_zero(const char *s) { return s[0] == '0' && s[1] >= '0' && s[1] <= '9'; }

/* Parses an unsigned decimal; for sizes with an optional binary unit
 * (proto/units.h: K, M, G, T, KiB...), for durations with ms or s.  0 or
 * -1. */
static int parse_uint(const char *s, enum ktype t, uint64_t *out) {
  char *end;
  unsigned long long v;
  uint64_t mul = 1;

  if (leading_zero(s))
    return -1;
  if (t == K_SIZE)
    return dspk__parse_size(s, out);
  /* A digit first, as sizes (dspk__parse_size) and shares: no sign and no
   * blank, which strtoull would skip (" 8", "\n8"). */
  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || end == s)
    return -1;
  if (t == K_MS && *end) {
    if (strcmp(end, "s") == 0)
      mul = 1000;
    else if (strcmp(end, "ms") != 0)
      return -1;
  } else if (*end) {
    return -1;
  }
  if (v > UINT64_MAX / mul)
    return -1;
  *out = (uint64_t)v * mul;
  return 0;
}

int dspkd_config_parse_share(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  size_t n = strlen(s);
  uint64_t v;
  if (n > 1 && s[n - 1] == '%') {
    char num[8];
    if (n - 1 >= sizeof num)
      return -1;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    if (parse_uint(num, K_UINT, &v) != 0 || v < 1 || v > 100)
      return -1;
    *out = DSPKD_SHARE(v);
    return 0;
  }
  if (parse_uint(s, K_SIZE, &v) != 0 || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

static int parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"yes", "true", "on", "1"};
  static const char *const no[] = {"no", "false", "off", "0"};
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, yes[i]) == 0) {
      *out = true;
      return 0;
    }
    if (strcmp(s, no[i]) == 0) {
      *out = false;
      return 0;
    }
  }
  return -1;
}

/* What parse_ids has to say about the names of the last list it parsed
 * that no longer resolve ("" none): handle_key logs it as a warning. */
static char ids_warn[320];

/* Looks name up as a user (or a group) into *id.  0; 1 when the name
 * service says there is no such name; -1 when the lookup failed (errno:
 * the name service did not answer, out of memory...). */
static int lookup_id(const char *name, bool group, uint32_t *id) {
  char stack[4096], *buf = stack, *big = NULL;
  size_t len = sizeof stack;
  int e;

  for (;;) {
    if (group) {
      struct group g, *r = NULL;
      e = getgrnam_r(name, &g, buf, len, &r);
      if (e == 0 && r)
        *id = (uint32_t)r->gr_gid;
      else if (e == 0)
        e = -1;
    } else {
      struct passwd pw, *r = NULL;
      e = getpwnam_r(name, &pw, buf, len, &r);
      if (e == 0 && r)
        *id = (uint32_t)r->pw_uid;
      else if (e == 0)
        e = -1;
    }
    if (e != ERANGE || len >= (1u << 20))
      break;
    len *= 2;
    char *n = realloc(big, len);
    if (!n) {
      e = ENOMEM;
      break;
    }
    buf = big = n;
  }
  free(big);
  if (e == 0)
    return 0;
  /* getpwnam_r(3): these say "not found" too, as some name services
   * report it. */
  if (e == -1 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM)
    return 1;
  errno = e;
  return -1;
}

/* Parses a list of user (or group) names or numeric ids, separated by
 * commas or spaces.  A name that does not resolve (no such user or group
 * now, or a name service that does not answer: an LDAP server not up yet
 * at boot) is no error: it stands in the list for no one (DSPKD_ID_NOBODY,
 * never a process's id), so that a list of names none of which resolves
 * still admits only root and dspkd's own user, and is said in ids_warn.
 * A name has no length limit of dspk's own (a line's is the only one):
 * one too long for this system's user names is one that does not resolve,
 * and a directory service's may be long ("user@long.domain.example").
 * 0, or -1 with the reason in msg. */
static int parse_ids(const char *s, bool groups, struct dspkd_idlist *out, char *msg,
                     size_t len) {
  struct dspkd_idlist l = {0};
  char word[INI_MAX_LINE]; /* a line of the file is shorter (reader) */
  size_t w = 0;

  ids_warn[0] = '\0';
  while (*s) {
    size_t n = strcspn(s, ", \t");
    if (n == 0) {
      s++;
      continue;
    }
    if (n >= sizeof word) { /* not from a line of the file */
      snprintf(msg, len, "an entry longer than %zu bytes", sizeof word - 1);
      return -1;
    }
    memcpy(word, s, n);
    word[n] = '\0';
    s += n;
    if (l.n >= DSPKD_MAX_IDS) {
      snprintf(msg, len, "more than %d entries", DSPKD_MAX_IDS);
      return -1;
    }
    /* A number is the one rule of every number here: decimal digits from
     * the first byte, no sign, blank or leading 0 ("+65534", "065534" and
     * " 1" are names, which no user has: a warning, admitting no one). */
    char *end;
    errno = 0;
    unsigned long v = strtoul(word, &end, 10);
    if (!errno && *end == '\0' && word[0] >= '0' && word[0] <= '9' && !leading_zero(word) &&
        v < UINT32_MAX) {
      l.id[l.n++] = (uint32_t)v;
      continue;
    }
    uint32_t id;
    int r = lookup_id(word, groups, &id), e = errno;
    if (r == 0) {
      l.id[l.n++] = id;
      continue;
    }
    l.id[l.n++] = DSPKD_ID_NOBODY;
    int k;
    if (r > 0)
      k = snprintf(ids_warn + w, sizeof ids_warn - w, "%sno such %s \"%s\"", w ? "; " : "",
                   groups ? "group" : "user", vis(word));
    else
      k = snprintf(ids_warn + w, sizeof ids_warn - w, "%scannot look up %s \"%s\": %s",
                   w ? "; " : "", groups ? "group" : "user", vis(word), strerror(e));
    if (k > 0)
      w = w + (size_t)k < sizeof ids_warn ? w + (size_t)k : sizeof ids_warn - 1;
  }
  *out = l;
  return 0;
}

/* ---- the file ----------------------------------------------------------- */

struct parse {
  const char *path;
  FILE *f;
  int line;       /* the line the reader returned last */
  int read_errno; /* the file could not be read to its end */
  struct dspkd_config *cfg;
  const struct dspkd_config *running; /* reload: the running configuration */
  uint64_t skip;                      /* keys the command line set */
  uint64_t seen;                      /* keys the file set */
  int cache_line, no_cache_line;      /* cache, no_cache = yes: where the file set them */
  int err_line;                       /* first error of a handler or the reader, or 0 */
  char err[PATH_MAX + 320];
};

__attribute__((format(printf, 2, 3))) static int perr(struct parse *p, const char *fmt,
                                                      ...) {
  va_list ap;
  char msg[320];
  if (p->err_line)
    return 0;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  p->err_line = p->line;
  snprintf(p->err, sizeof p->err, "%s:%d: %s", p->path, p->line, msg);
  return 0;
}

/* Whether [name] (n bytes) is a section of the key table. */
static bool known_section(const char *name, size_t n) {
  for (size_t i = 0; i < NKEYS; i++)
    if (keys[i].section && strlen(keys[i].section) == n &&
        memcmp(keys[i].section, name, n) == 0)
      return true;
  return false;
}

/* Checks one line (s, its leading blanks and byte order mark skipped) for
 * what libinih would take but read otherwise than dspk.conf(5) says, since
 * the Debian library's leniencies are compiled in: text after a section's
 * ']' (ignored by inih), a section without keys (never reaches the
 * handler), ':' for '=', and " ;" in a value (inih cuts the value there).
 * indented: s had leading blanks.  0, or -1 with the error recorded. */
static int check_line(struct parse *p, const char *s, bool indented) {
  const char *end, *sep;

  if (!*s || *s == '#' || *s == ';')
    return 0;
  if (*s == '[') {
    end = strchr(s, ']');
    if (!end)
      return 0; /* inih's syntax error */
    for (const char *c = end + 1; *c; c++)
      if (!isspace((unsigned char)*c)) {
        perr(p, "text after the section header [%s] (a comment takes a line of its own)",
             visn(s + 1, (size_t)(end - s - 1)));
        return -1;
      }
    if (!known_section(s + 1, (size_t)(end - s - 1))) {
      perr(p, "unknown section [%s]", visn(s + 1, (size_t)(end - s - 1)));
      return -1;
    }
    return 0;
  }
  sep = strpbrk(s, "=:");
  if (!sep) {
    if (!indented)
      return 0; /* inih's syntax error */
    perr(p, "an indented line does not continue the value above (a value takes one line)");
    return -1;
  }
  if (*sep == ':') {
    perr(p, "expected key = value (\":\" does not separate a key from its value)");
    return -1;
  }
  /* inih ends a value at a ';' after a blank (its inline comments). */
  for (const char *c = sep + 1; *c; c++)
    if (*c == ';' && c > sep + 1 && isspace((unsigned char)c[-1])) {
      perr(p, "a comment cannot follow a value (\";\" after a blank); a comment takes a "
              "line of its own");
      return -1;
    }
  return 0;
}

/* The UTF-8 byte order mark (U+FEFF). */
#define BOM "\xEF\xBB\xBF"

/* libinih's reader: hands it the next line whole, or ends the file (NULL)
 * at a line it would misread (check_line), a NUL byte (inih would see the
 * line end there), or a line longer than its buffer (num bytes with the
 * terminating NUL; inih would take the rest as another line).  Leading
 * blanks are removed, so that inih never takes an indented line for the
 * continuation of the value above: indentation means nothing. */
static char *reader(char *str, int num, void *stream) {
  struct parse *p = stream;
  size_t n = 0, max = num > 0 ? (size_t)num - 1 : 0;
  bool nul = false;
  char *s = str, *text;
  int c;

  errno = 0;
  while ((c = getc(p->f)) != EOF && c != '\n') {
    if (c == '\0')
      nul = true;
    if (n < max)
      str[n] = (char)c;
    n++;
  }
  if (c == EOF && ferror(p->f)) {
    p->read_errno = errno ? errno : EIO;
    return NULL;
  }
  if (c == EOF && n == 0)
    return NULL;
  p->line++;
  if (nul) {
    perr(p, "NUL byte");
    return NULL;
  }
  if (n > max) {
    perr(p, "line longer than %zu bytes", max);
    return NULL;
  }
  str[n] = '\0';
  if (p->line == 1 && n >= 3 && memcmp(s, BOM, 3) == 0)
    s += 3; /* a UTF-8 byte order mark, which inih skips too */
  text = s;
  while (isspace((unsigned char)*text))
    text++;
  /* inih skips a byte order mark at the start of the first line it is
   * handed: after the file's own (removed above) or after blanks, a second
   * one would be skipped too, where dspk.conf(5) ignores one only, at the
   * very start.  On any other line inih keeps it (an unknown key, a syntax
   * error). */
  if (p->line == 1 && strncmp(text, BOM, 3) == 0) {
    perr(p, "a byte order mark (\\ufeff) that is not the first bytes of the file: only "
            "one, at the very start, is ignored");
    return NULL;
  }
  if (check_line(p, text, text > s) != 0)
    return NULL;
  memmove(str, text, strlen(text) + 1);
  return str;
}

/* Whether the n bytes at p name a backend dspk knows (built in or not). */
static bool known_backend(const char *p, size_t n) {
  for (int i = 0; dspk__known_backends[i]; i++)
    if (strlen(dspk__known_backends[i]) == n && memcmp(dspk__known_backends[i], p, n) == 0)
      return true;
  return false;
}

/* Whether the item p[0..n) of the comma list s (p inside s) is one that
 * comes before it in s. */
static bool item_before(const char *s, const char *p, size_t n) {
  for (const char *q = s; q < p;) {
    size_t m = strcspn(q, ",");
    if (m == n && memcmp(q, p, n) == 0)
      return true;
    q += m + 1;
  }
  return false;
}

/* backends: a comma list of the backends dspk knows (those this build lacks
 * included: they are listed as unavailable), no blanks, no empty item.
 * Checked here so that a bad list stops dspkd with status 2 naming
 * file:line, as every other bad value does, before any device is opened. */
static int check_backends(const char *s, char *why, size_t len) {
  if (!*s) {
    /* Empty is refused from the file and the command line alike (it
     * once meant every backend on the command line only). */
    snprintf(why, len, "expected a comma list (no blanks) of cpu, cuda, vulkan, hip; "
             "got an empty list (leave it out to use every backend)");
    return -1;
  }
  for (const char *p = s;;) {
    size_t n = strcspn(p, ",");
    if (!known_backend(p, n)) {
      snprintf(why, len, "expected a comma list (no blanks) of cpu, cuda, vulkan, hip; "
               "got \"%s\" in \"%s\"", visn(p, n), vis(s));
      return -1;
    }
    /* A list names each once, as a key is given once: a repeat means a
     * mistake (another backend meant), never a second meaning. */
    if (item_before(s, p, n)) {
      snprintf(why, len, "expected each backend once; got \"%s\" twice in \"%s\"",
               visn(p, n), vis(s));
      return -1;
    }
    if (!p[n])
      return 0;
    p += n + 1;
  }
}

/* raw_kernels: all, none, or a comma list of device ids (BACKEND:N, a
 * backend dspk knows, N without a leading 0); whether each device exists
 * is the host's to say, so an id of none here runs nothing and is no
 * error: the start warns of it (daemon/device.c, log_raw_kernels). */
static int check_raw_kernels(const char *s, char *why, size_t len) {
  if (strcmp(s, "all") == 0 || strcmp(s, "none") == 0)
    return 0;
  if (!*s) {
    snprintf(why, len, "expected all, none, or a comma list (no blanks) of device ids such "
             "as vulkan:0 or cuda:1; got an empty value (leave it out for all)");
    return -1;
  }
  for (const char *p = s;;) {
    size_t n = strcspn(p, ","), b = strcspn(p, ":,");
    bool known = known_backend(p, b);
    size_t digits = b < n ? strspn(p + b + 1, "0123456789") : 0;
    /* The index as the daemon writes it: no leading 0 ("vulkan:00" reads
     * as vulkan:0 to a person, and would name no device). */
    if (!known || b >= n || digits == 0 || digits > 3 || b + 1 + digits != n ||
        (digits > 1 && p[b + 1] == '0')) {
      snprintf(why, len, "expected all, none, or a comma list (no blanks) of device ids "
               "such as vulkan:0 or cuda:1 (the index without a leading 0); got \"%s\" in "
               "\"%s\"", visn(p, n), vis(s));
      return -1;
    }
    if (item_before(s, p, n)) {
      snprintf(why, len, "expected each device once; got \"%s\" twice in \"%s\"",
               visn(p, n), vis(s));
      return -1;
    }
    if (!p[n])
      return 0;
    p += n + 1;
  }
}

bool dspkd_raw_kernels_on(const struct dspkd_config *cfg, const char *id) {
  const char *s = cfg->raw_kernels;
  size_t len = strlen(id);
  if (!s || strcmp(s, "all") == 0)
    return true;
  for (const char *p = s; *p;) {
    size_t n = strcspn(p, ",");
    if (n == len && memcmp(p, id, n) == 0)
      return true;
    p += n + (p[n] == ',');
  }
  return false; /* "none", or not listed */
}

/* 1 when s[0..n) is a decimal from 0 to max without a leading 0 (but "0"
 * itself): nothing a reader could take for octal, and one spelling each. */
static bool plain_decimal(const char *s, size_t n, unsigned long max) {
  unsigned long v = 0;
  if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
    return false;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (unsigned long)(s[i] - '0');
  }
  return v <= max;
}

/* 1 when s[0..n) is a host name (letters, digits, '-', '_' and '.', not all
 * digits and dots) that inet_aton does not read as an IPv4 address, or a
 * dotted IPv4 address of four decimal parts.  getaddrinfo reads an IPv4
 * address in inet_aton's forms nobody means ("0" is 0.0.0.0, "127.1" is
 * 127.0.0.1, "010" octal, "0x7f.1" and "0x7f000001" hexadecimal), and
 * ignores what follows a blank ("127.0.0.1 x"): each of those, or a blank,
 * is refused. */
static bool plain_host(const char *s, size_t n) {
  size_t parts = 0, start = 0;
  char host[256];
  struct in_addr a;

  if (n == 0)
    return true; /* every address */
  if (n >= sizeof host)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i]))
      return false;
  memcpy(host, s, n);
  host[n] = '\0';
  if (strspn(host, "0123456789.") < n && inet_aton(host, &a) == 0)
    return true; /* a host name */
  for (size_t i = 0; i <= n; i++) {
    if (i < n && s[i] != '.')
      continue;
    if (!plain_decimal(s + start, i - start, 255))
      return false;
    parts++;
    start = i + 1;
  }
  return parts == 4;
}

/* 1 when s[0..n), the inside of brackets, is an IPv6 address (with a
 * %ZONE after it, which getaddrinfo resolves): nothing else goes in
 * brackets ("[]" and "[127.0.0.1]" are refused, not read as every
 * address and an IPv4 address). */
static bool bracketed_v6(const char *s, size_t n) {
  char host[INET6_ADDRSTRLEN + 1];
  struct in6_addr a;
  size_t k = strcspn(s, "%");

  if (k > n)
    k = n;
  if (k == 0 || k >= sizeof host || (k < n && k + 1 == n))
    return false;
  memcpy(host, s, k);
  host[k] = '\0';
  return inet_pton(AF_INET6, host, &a) == 1;
}

/* metrics_listen: ADDR:PORT ([V6]:PORT; :PORT for every address) with a
 * decimal port from 0 to 65535; no value that reads two ways: an IPv6
 * address without brackets ("::1:0"), an IPv4 address not of four decimal
 * parts ("0:0", "127.1:0", "0x7f.1:0"), a number with a leading 0, a
 * blank.  Whether a host name resolves is seen when the listener
 * starts. */
static int check_listen(const char *s, char *why, size_t len) {
  const char *colon = strrchr(s, ':');
  size_t n = colon ? (size_t)(colon - s) : 0;

  if (colon && plain_decimal(colon + 1, strlen(colon + 1), 65535)) {
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
      if (bracketed_v6(s + 1, n - 2))
        return 0;
    } else if (bracketed_v6(s, n)) {
      /* The hint only where the host is an IPv6 address as it stands: a
       * value with other text ("[::1]x:0") gets the general message. */
      snprintf(why, len, "an IPv6 address goes in brackets ([%.*s]:%s), got \"%s\"", (int)n,
               s, colon + 1, vis(s));
      return -1;
    } else if (plain_host(s, n)) {
      return 0;
    }
  }
  snprintf(why, len, "expected ADDR:PORT with a port from 0 to 65535 (decimal, no leading 0) "
           "and ADDR a host name, an IPv4 address of four decimal parts, [IPV6], or nothing "
           "(every address), e.g. 127.0.0.1:9464; got \"%s\"", vis(s));
  return -1;
}

/* Parses value and stores it in cfg's field of k (a string: the pointer
 * itself, so the caller keeps value alive).  0, or -1 with what was
 * expected in why. */
static int store(const struct key *k, const char *value, bool from_file,
                 struct dspkd_config *cfg, char *why, size_t len) {
  void *field = (char *)cfg + k->off;
  uint64_t v;

  switch (k->type) {
  case K_SOCKET:
    /* The limit of a Unix socket's address, checked here so that a path
     * too long is a bad value (exit 2, file:line), not a failed listen. */
    if (!*value || strlen(value) >= k->width || strlen(value) >= DSPKD_SUN_PATH) {
      snprintf(why, len, "expected a non-empty path of at most %zu bytes (a Unix "
               "socket's limit), got %zu bytes", (size_t)DSPKD_SUN_PATH - 1, strlen(value));
      return -1;
    }
    /* Every path of the file is absolute (see job_state below): a relative
     * one would be the start directory's, which the file cannot know and
     * dspkd --end-job cannot either.  "@name" is an abstract socket. */
    if (from_file && value[0] != '/' && value[0] != '@') {
      snprintf(why, len, "expected an absolute path or @NAME (an abstract socket), got \"%s\" "
               "(a relative path would be the directory dspkd started in)", vis(value));
      return -1;
    }
    memcpy(field, value, strlen(value) + 1);
    return 0;
  case K_STR:
    /* On the command line "" is a value for cache only (--cache "": no
     * cache); an empty backends or metrics_listen is refused below, from
     * the file and the command line alike.  In the file an empty value is
     * a bad value for every key but the [policy] lists (nobody listed),
     * cache included: no_cache = yes says what "cache =" would. */
    if (from_file && !*value) {
      snprintf(why, len, "%s", k->off == offsetof(struct dspkd_config, cache_path)
                                   ? "expected a path (no_cache = yes runs without a cache)"
                                   : "expected a value");
      return -1;
    }
    if (k->off == offsetof(struct dspkd_config, job_state) && !*value) {
      snprintf(why, len, "expected a path (the Slurm jobs' state cannot be turned off)");
      return -1;
    }
    /* The file's relative path would be the start directory's, which the
     * Slurm epilog's dspkd --end-job, run in slurmd's directory with this
     * file, cannot know: it would end the job in another file, or find
     * none, and the daemon would register the job again at its next
     * start.  --job-state stays relative to the current directory. */
    if (k->off == offsetof(struct dspkd_config, cache_path) && from_file && *value != '/' &&
        strcmp(value, ":memory:") != 0) {
      snprintf(why, len, "expected an absolute path or :memory:, got \"%s\" (a relative path "
               "would be the directory dspkd started in)", vis(value));
      return -1;
    }
    if (k->off == offsetof(struct dspkd_config, job_state) && from_file && *value != '/') {
      snprintf(why, len, "expected an absolute path, got \"%s\" (the Slurm epilog's dspkd "
               "--end-job cannot know the directory dspkd started in)", vis(value));
      return -1;
    }
    if (k->off == offsetof(struct dspkd_config, backends) &&
        check_backends(value, why, len) != 0)
      return -1;
    if (k->off == offsetof(struct dspkd_config, metrics_listen) &&
        check_listen(value, why, len) != 0)
      return -1;
    if (k->off == offsetof(struct dspkd_config, raw_kernels) &&
        check_raw_kernels(value, why, len) != 0)
      return -1;
    *(const char **)field = value;
    return 0;
  case K_BOOL: {
    bool b;
    if (parse_bool(value, &b) != 0) {
      snprintf(why, len, "expected yes|no, true|false, on|off or 1|0, got \"%s\"", vis(value));
      return -1;
    }
    memcpy(field, &b, sizeof b);
    return 0;
  }
  case K_LEVEL: {
    enum dspkd_level l;
    if (dspkd_log_parse_level(value, &l) != 0) {
      snprintf(why, len, "expected error, warn, notice, info or debug, got \"%s\"", vis(value));
      return -1;
    }
    *(int *)field = (int)l;
    return 0;
  }
  case K_UINT:
  case K_SIZE:
  case K_MS:
  case K_FD:
    /* A Slurm job id as $SLURM_JOB_ID has it and the state file writes it:
     * hello's rule and the file's reader refuse "05", so does --end-job. */
    if (k->off == offsetof(struct dspkd_config, end_job) && leading_zero(value)) {
      snprintf(why, len, "expected a job id from 1 to %llu without a leading zero, got "
               "\"%s\"", (unsigned long long)k->hi, vis(value));
      return -1;
    }
    if (parse_uint(value, k->type, &v) != 0 || v < k->lo || v > k->hi) {
      snprintf(why, len, "expected %s from %llu to %llu%s, got \"%s\"%s",
               k->type == K_SIZE ? "a size" : "an integer", (unsigned long long)k->lo,
               (unsigned long long)k->hi,
               k->type == K_SIZE  ? " bytes (" DSPK__SIZE_UNITS ")"
               : k->type == K_MS ? " milliseconds (suffix ms or s allowed)"
                                 : "",
               vis(value), leading_zero(value) ? " (a leading 0 reads two ways: none is "
                                                 "allowed)" : "");
      return -1;
    }
    if (k->type == K_FD && fcntl((int)v, F_GETFD) < 0) {
      snprintf(why, len, "%s: not an open file descriptor", vis(value));
      return -1;
    }
    /* Open read-only (9</dev/null) or for nothing (O_PATH), it would take
     * no READY: the daemon would serve while whoever waits for READY
     * waits for ever.  Refused now, as a closed one is. */
    if (k->type == K_FD) {
      int fl = fcntl((int)v, F_GETFL);
      if (fl < 0 || ((fl & O_ACCMODE) != O_WRONLY && (fl & O_ACCMODE) != O_RDWR)) {
        snprintf(why, len, "%s: not open for writing (READY could not be written there); "
                 "give the write end of a pipe the caller reads", vis(value));
        return -1;
      }
    }
    /* The daemon logs to stderr for its whole life: READY there, and the
     * descriptor given back after it, would take the log away. */
    if (k->type == K_FD && v == STDERR_FILENO) {
      snprintf(why, len, "%s: that is standard error, where dspkd logs; give another "
               "descriptor (the write end of a pipe the caller reads)", value);
      return -1;
    }
    put_uint(field, k->width, v);
    return 0;
  case K_SHARE:
    if (dspkd_config_parse_share(value, k->lo, k->hi, &v) != 0) {
      snprintf(why, len, "expected a size from %llu to %llu bytes (" DSPK__SIZE_UNITS ") "
               "or a share of each device's memory from 1%% to 100%%, got \"%s\"%s",
               (unsigned long long)k->lo, (unsigned long long)k->hi, vis(value),
               leading_zero(value) ? " (a leading 0 reads two ways: none is allowed)" : "");
      return -1;
    }
    put_uint(field, k->width, v);
    return 0;
  case K_USERS:
  case K_GROUPS: {
    struct dspkd_idlist l;
    if (parse_ids(value, k->type == K_GROUPS, &l, why, len) != 0)
      return -1;
    memcpy(field, &l, sizeof l);
    return 0;
  }
  case K_CONFIG:
  case K_HELP:
  case K_VERSION:
    break;
  }
  return 0;
}

/* For an unknown key name that is a file key spelled with '-' for '_' (the
 * command line's spelling, --max-clients): "; did you mean max_clients?",
 * naming the key's section when it is not section; else "".  The file
 * spells keys with '_' only (dspk.conf(5)): a dashed name used to be taken
 * as the key in silence (probe 19 E1), a second spelling the page never
 * named. */
static void dash_hint(const char *name, const char *section, char *out, size_t len) {
  char kname[64];
  int idx;

  out[0] = '\0';
  if (!strchr(name, '-') || strlen(name) >= sizeof kname)
    return;
  snprintf(kname, sizeof kname, "%s", name);
  for (char *c = kname; *c; c++)
    if (*c == '-')
      *c = '_';
  idx = key_index(kname);
  if (idx < 0 || !(keys[idx].where & IN_FILE))
    return;
  if (strcmp(section, keys[idx].section) == 0)
    snprintf(out, len, "; did you mean %s?", keys[idx].name);
  else
    snprintf(out, len, "; did you mean %s (in [%s])?", keys[idx].name, keys[idx].section);
}

/* Stores a value; in a reload, keys that need a restart are only compared
 * with the running value (and a difference logged). */
static int handle_key(void *user, const char *section, const char *name, const char *value) {
  struct parse *p = user;
  struct dspkd_config scratch;
  char why[256];
  const struct key *k;
  int idx;
  bool skip;

  idx = key_index(name);
  k = idx >= 0 && (keys[idx].where & IN_FILE) ? &keys[idx] : NULL;
  /* inih gives "" as the section of a key above the first header: there is
   * no section "[]" to name, the header is what is missing. */
  if (!k) {
    char hint[96];
    dash_hint(name, section, hint, sizeof hint);
    if (!section[0])
      return perr(p, "unknown key \"%s\" before any [section]%s", vis(name), hint);
    return perr(p, "unknown key \"%s\" in [%s]%s", vis(name), vis(section), hint);
  }
  if (!section[0])
    return perr(p, "key \"%s\" comes before any [section]; it belongs in [%s]", vis(name),
                k->section);
  if (strcmp(section, k->section) != 0)
    return perr(p, "key \"%s\" belongs in section [%s], not [%s]", vis(name), k->section,
                vis(section));
  /* A list of [policy] given again adds its entries to the list (a line
   * holds at most 199 bytes, libinih's buffer: a long list takes several
   * lines).  Any other key given twice is refused. */
  if ((p->seen & ((uint64_t)1 << idx)) && (k->type == K_USERS || k->type == K_GROUPS)) {
    struct dspkd_idlist *l = (struct dspkd_idlist *)(void *)((char *)p->cfg + k->off);
    struct dspkd_idlist *more = (struct dspkd_idlist *)(void *)((char *)&scratch + k->off);
    bool skip_more = (p->skip & ((uint64_t)1 << idx)) != 0;
    ids_warn[0] = '\0';
    if (store(k, value, true, &scratch, why, sizeof why) != 0)
      return perr(p, "%s: %s", name, why);
    if (skip_more)
      return 1;
    /* Its names that do not resolve: as on the key's first line. */
    if (ids_warn[0])
      dspkd_warn("%s:%d: %s: %s: such a name admits no one until a reload finds it (the "
                 "other entries apply)", p->path, p->line, name, ids_warn);
    if (l->n + more->n > DSPKD_MAX_IDS)
      return perr(p, "%s: more than %d entries (this line and those before)", name,
                  DSPKD_MAX_IDS);
    memcpy(l->id + l->n, more->id, more->n * sizeof more->id[0]);
    l->n += more->n;
    return 1;
  }
  if (p->seen & ((uint64_t)1 << idx))
    return perr(p, "key \"%s\" given twice", vis(name));
  p->seen |= (uint64_t)1 << idx;
  skip = (p->skip & ((uint64_t)1 << idx)) != 0;

  /* socket, cache, backends, metrics_listen: strings that only a restart
   * changes; a reload keeps its copy in reload_strs for the comparison
   * (dspkd_config_reload), the running configuration's strings stay. */
  if (p->running && k->type == K_STR) {
    if (store(k, value, true, &scratch, why, sizeof why) != 0)
      return perr(p, "%s: %s", name, why);
    if (skip)
      return 1;
    free(reload_strs[idx]);
    if (!(reload_strs[idx] = strdup(value)))
      return perr(p, "out of memory");
    *(const char **)((char *)p->cfg + k->off) = reload_strs[idx];
    return 1;
  }
  /* A key the command line set is still checked. */
  ids_warn[0] = '\0';
  if (store(k, value, true, skip ? &scratch : p->cfg, why, sizeof why) != 0)
    return perr(p, "%s: %s", name, why);
  /* A name of an allow or admin list that does not resolve admits no one
   * (until a reload finds it): the rest of the file applies. */
  if (ids_warn[0] && !skip)
    dspkd_warn("%s:%d: %s: %s: such a name admits no one until a reload finds it (the "
               "other entries apply)", p->path, p->line, name, ids_warn);
  if (skip)
    return 1;
  if (k->type == K_SOCKET) {
    if (!p->running)
      snprintf(file_socket, sizeof file_socket, "%s", value);
  } else if (k->type == K_STR) {
    char *s = strdup(value);
    if (!s)
      return perr(p, "out of memory");
    free(file_strs[idx]);
    file_strs[idx] = s;
    *(const char **)((char *)p->cfg + k->off) = s;
  }
  return 1;
}

/* libinih's handler: one key, stored by handle_key, then checked against
 * the keys the file gave before it.  cache with no_cache = yes is refused
 * at the second of the two, whichever comes first, as --cache with
 * --no-cache is on the command line: the file's no_cache used to win in
 * silence, the cache it names never opened.  Checked whatever the command
 * line set (the file is wrong either way), at start and at a reload. */
static int handler(void *user, const char *section, const char *name, const char *value) {
  struct parse *p = user;
  int idx, other;
  bool yes;

  if (!handle_key(user, section, name, value) || p->err_line)
    return 0;
  idx = key_index(name);
  if (idx == key_index("cache")) {
    p->cache_line = p->line;
    other = p->no_cache_line;
  } else if (idx == key_index("no_cache") && parse_bool(value, &yes) == 0 && yes) {
    p->no_cache_line = p->line;
    other = p->cache_line;
  } else {
    return 1;
  }
  if (!other)
    return 1;
  if (idx == key_index("cache"))
    return perr(p, "%s and no_cache = yes (line %d) both given (give one)", vis(name), other);
  return perr(p, "%s = %s and cache (line %d) both given (give one)", vis(name), vis(value),
              other);
}

/* Whether the configuration file at path (st: what fstat said of the file
 * opened) is one that users other than root and the daemon's own could
 * change, as sshd's StrictModes asks (outside probe 16 E1: a file of
 * another user that everyone could write was read without a word, and
 * whoever wrote admin_users there became an admin): the rule of every file
 * dspkd trusts (dspk__trust_stat), for the file, a symbolic link at path
 * (its owner), and the directories that hold the link and the file.  At
 * start and at each reload.  true with the message in err. */
static bool untrusted(const char *path, const struct stat *st, char *err, size_t len) {
  char w[300], dir[PATH_MAX], target[PATH_MAX];
  const char *what = "it is";
  bool link_bad = false;
  struct stat lst = {0};
  uid_t self = geteuid();

  if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
    if (dspk__trust_stat(&lst, self, 1, "dspkd's ", w, sizeof w) != 0) {
      what = "it is a symbolic link";
      link_bad = true;
      goto bad;
    }
  }
  if (dspk__trust_stat(st, self, 1, "dspkd's ", w, sizeof w) != 0)
    goto bad;
  if (dspk__trust_dir_of(path, self, 1, "dspkd's ", dir, sizeof dir, w, sizeof w) != 0)
    goto bad_dir;
  if (S_ISLNK(lst.st_mode) && realpath(path, target) &&
      dspk__trust_dir_of(target, self, 1, "dspkd's ", dir, sizeof dir, w, sizeof w) != 0)
    goto bad_dir;
  return false;
bad:
  /* The fix for what was found: chown follows a link, so a link's is
   * removing it (or chown -h); a file's owner or mode is chown or chmod. */
  snprintf(err, len, "%s: refusing the configuration file: %s %s (whoever can change it "
           "decides who may connect and who is an admin): %s", path, what, w,
           link_bad ? "remove the link (or chown -h it to root)"
           : st->st_uid != self && st->st_uid != 0 ? "chown root and chmod go-w it"
                                                  : "chmod go-w it");
  return true;
bad_dir:
  snprintf(err, len, "%s: refusing the configuration file: its directory %s is %s (whoever "
           "can change it can replace the file): %s the directory %s%s, or move the file",
           path, dir, w, strstr(w, "owned by") == w ? "chown root and chmod go-w" : "chmod go-w",
           dir, strstr(w, "owned by") == w ? "" : " (or chmod +t it)");
  return true;
}

/* Reads path into cfg (keys in skip untouched).  0 or a negative code, with
 * a one-line message in err. */
static int load(const char *path, struct dspkd_config *cfg,
                const struct dspkd_config *running, uint64_t skip, char *err, size_t len) {
#ifdef DSPKD_HAVE_INIH
  struct parse p = {.path = path, .cfg = cfg, .running = running, .skip = skip};
  const char *why = NULL;
  struct stat st;
  int fd, r;

  /* O_NONBLOCK: a FIFO must not block the start (it changes nothing for a
   * regular file).  Anything but a regular file is refused: stdio would read
   * a directory as an empty file. */
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    snprintf(err, len, "%s: cannot read: %s%s", path, strerror(e),
             e == ENOENT && lstat(path, &st) == 0 ? " (a symbolic link to a missing file)"
                                                   : "");
    return e == ENOENT ? DSPK_ENOENT : DSPK_EIO;
  }
  if (fstat(fd, &st) != 0)
    why = strerror(errno);
  else if (S_ISDIR(st.st_mode))
    why = strerror(EISDIR);
  else if (!S_ISREG(st.st_mode)) /* what it is, as the cache's refusal says */
    why = S_ISCHR(st.st_mode)    ? "not a regular file (a character device)"
          : S_ISBLK(st.st_mode)  ? "not a regular file (a block device)"
          : S_ISFIFO(st.st_mode) ? "not a regular file (a FIFO)"
          : S_ISSOCK(st.st_mode) ? "not a regular file (a socket)"
                                 : "not a regular file";
  if (why) {
    snprintf(err, len, "%s: cannot read: %s", path, why);
    close(fd);
    return DSPK_EIO;
  }
  if (untrusted(path, &st, err, len)) {
    /* A refused configuration, as an invalid one (exit status 2 at start):
     * nothing failed to read. */
    close(fd);
    return DSPK_EINVAL;
  }
  p.f = fdopen(fd, "r");
  if (!p.f) {
    snprintf(err, len, "%s: cannot read: %s", path, strerror(errno));
    close(fd);
    return DSPK_EIO;
  }
  r = ini_parse_stream(reader, &p, handler, &p);
  fclose(p.f);
  if (p.read_errno) {
    snprintf(err, len, "%s: cannot read: %s", path, strerror(p.read_errno));
    return DSPK_EIO;
  }
  if (r == 0 && !p.err_line)
    return 0;
  if (r > 0 && (!p.err_line || r < p.err_line)) {
    snprintf(err, len, "%s:%d: syntax error (expected [section], key = value, or a "
                       "comment starting with # or ;)", path, r);
  } else if (p.err_line) {
    snprintf(err, len, "%s", p.err);
  } else {
    snprintf(err, len, "%s: cannot parse (%s)", path, r == -2 ? "out of memory" : "i/o error");
  }
  return DSPK_EINVAL;
#else
  (void)cfg;
  (void)running;
  (void)skip;
  snprintf(err, len, "%s: this dspkd was built without libinih and cannot read "
                     "configuration files", path);
  return DSPK_ENOTSUP;
#endif
}

/* ---- the command line ---------------------------------------------------- */

/* The option's name: the key's with '-' for '_'. */
static void opt_name(const struct key *k, char *out, size_t len) {
  snprintf(out, len, "%s", k->name);
  for (char *c = out; *c; c++)
    if (*c == '_')
      *c = '-';
}

/* Writes text from column 23 on, wrapped before column 80. */
static void wrap(FILE *f, const char *head, const char *text) {
  enum { COL = 23, WIDTH = 79 };
  int col = fprintf(f, "%s", head);
  if (col <= COL - 2) {
    fprintf(f, "%*s", COL - col, "");
    col = COL;
  } else {
    fputs("  ", f);
    col += 2;
  }
  for (bool first = true; *text; first = false) {
    size_t n = strcspn(text, " ");
    if (!first && col + 1 + (int)n > WIDTH) {
      fprintf(f, "\n%*s", COL, "");
      col = COL;
    } else if (!first) {
      fputc(' ', f);
      col++;
    }
    fprintf(f, "%.*s", (int)n, text);
    col += (int)n;
    text += n;
    while (*text == ' ')
      text++;
  }
  fputc('\n', f);
}

static void usage(FILE *f) {
  fputs("Usage: dspkd [OPTION]...\n"
        "The dspk compute daemon: runs compute tasks that clients submit over a Unix\n"
        "socket (docs/protocol.md) on the host's devices.\n"
        "\n",
        f);
  for (size_t i = 0; i < NKEYS; i++) {
    const struct key *k = &keys[i];
    char name[40], head[96], text[640]; /* --end-job's is the longest: 470 */
    if (!(k->where & IN_ARGV))
      continue;
    opt_name(k, name, sizeof name);
    snprintf(head, sizeof head, "  %s--%s%s%s",
             k->type == K_HELP ? "-h, " : k->type == K_VERSION ? "-V, " : "", name,
             k->arg ? " " : "", k->arg ? k->arg : "");
    snprintf(text, sizeof text, "%s%s%s%s", k->help, k->dflt ? " (default " : "",
             k->dflt ? k->dflt : "", k->dflt ? ")" : "");
    wrap(f, head, text);
  }
  fputs("\n"
        "SIZE is a byte count with an optional binary unit: K or KiB, M or MiB, G or\n"
        "GiB, T or TiB (2M = 2097152).  Every option but --config, --end-job,\n"
        "--ready-fd, --help and --version is also a key of the configuration file\n"
        "(dspk.conf(5)).\n"
        "\n"
        "The log goes to stderr, one line per event; when stderr is the systemd journal\n"
        "(JOURNAL_STREAM) each line carries its syslog priority (<3> error ... <7> debug).\n",
        f);
}

/* Says what was wrong with an option getopt_long refused ('?': unknown or
 * an ambiguous prefix, ':': its argument missing), in one logged line:
 * getopt's own messages and the usage text on stderr would bypass the
 * log's journal prefix (systemd.md). */
static void bad_option(int opt, const char *arg, const struct option *opts) {
  char names[512] = "";
  size_t len, n = 0, used = 0;

  if (opt == ':') {
    if (strncmp(arg, "--", 2) == 0)
      dspkd_error("option '%s' requires an argument (see --help)", vis(arg));
    else
      dspkd_error("option '-%c' requires an argument (see --help)", optopt);
    return;
  }
  if (strncmp(arg, "--", 2) != 0) {
    dspkd_error("unknown option '-%c' (see --help)", optopt > 0 && optopt < 256 ? optopt : '?');
    return;
  }
  len = strcspn(arg + 2, "=");
  const struct option *only = NULL;
  for (const struct option *o = opts; o->name; o++) {
    if (strncmp(o->name, arg + 2, len) != 0)
      continue;
    n++;
    if (!only || strlen(o->name) == len)
      only = o; /* the one match, or the one named in full */
    if (used < sizeof names) {
      int w = snprintf(names + used, sizeof names - used, " --%s", o->name);
      used += w > 0 ? (size_t)w : 0;
    }
  }
  /* A switch given a value (--foreground=1): getopt_long calls it
   * unrecognized, which sends the reader to look for a typo. */
  if (only && only->has_arg == no_argument && arg[2 + len] == '=' &&
      (n == 1 || strlen(only->name) == len))
    dspkd_error("option '--%s' takes no value (give it alone: '--%s')", only->name,
                only->name);
  else if (n > 1)
    dspkd_error("option '%.*s' is ambiguous; possibilities:%s", (int)(len + 2), arg, names);
  else
    dspkd_error("unrecognized option '%s' (see --help)", vis(arg));
}

/* An option given twice, or --cache with --no-cache: refused (logged), as
 * the file refuses a key given twice; the last one does not silently win. */
static bool repeated_option(int i, char names[][40]) {
  int cache = key_index("cache"), no_cache = key_index("no_cache");
  int other = i == cache ? no_cache : i == no_cache ? cache : -1;
  if (flag_mask & ((uint64_t)1 << i)) {
    dspkd_error("option '--%s' given twice (give each option once)", names[i]);
    return true;
  }
  if (other >= 0 && (flag_mask & ((uint64_t)1 << other))) {
    dspkd_error("options '--%s' and '--%s' both given (give one)", names[other], names[i]);
    return true;
  }
  return false;
}

/* Parses the command line into cfg with getopt_long (options built from
 * the table); notes which keys it set in flag_mask and --config in
 * *config.  0, 1 (help written), 2 (--version), or a negative code
 * (message written). */
static int parse_argv(int argc, char **argv, struct dspkd_config *cfg, const char **config,
                      int *cli_cache) {
  struct option opts[NKEYS + 1];
  char names[NKEYS][40];
  size_t n = 0;
  int opt, alone = 0; /* 1: --help, 2: --version */
  const char *alone_name = NULL, *other_name = NULL; /* another option given */

  for (size_t i = 0; i < NKEYS; i++) {
    if (!(keys[i].where & IN_ARGV))
      continue;
    opt_name(&keys[i], names[i], sizeof names[i]);
    opts[n++] = (struct option){names[i], keys[i].arg ? required_argument : no_argument, NULL,
                                256 + (int)i};
  }
  opts[n] = (struct option){NULL, 0, NULL, 0};
  optind = 0; /* glibc: start over (the fuzzer parses many times) */
  opterr = 0; /* getopt's own messages would bypass the log (its journal prefix) */
  while ((opt = getopt_long(argc, argv, ":hV", opts, NULL)) != -1) {
    const struct key *k;
    char why[256];
    if (opt == 'h' || opt == 'V')
      opt = 256 + key_index(opt == 'h' ? "help" : "version");
    if (opt < 256) {
      bad_option(opt, argv[optind - 1], opts);
      return DSPK_EINVAL;
    }
    k = &keys[opt - 256];
    if (repeated_option(opt - 256, names))
      return DSPK_EINVAL;
    flag_mask |= (uint64_t)1 << (opt - 256);
    if (k->type != K_HELP && k->type != K_VERSION && !other_name)
      other_name = names[opt - 256];
    switch (k->type) {
    case K_HELP:
    case K_VERSION:
      /* Acted on once every word is read: alone, or refused below. */
      if (alone)
        other_name = alone_name;
      alone = k->type == K_HELP ? 1 : 2;
      alone_name = names[opt - 256];
      continue;
    case K_CONFIG:
      *config = optarg;
      continue;
    default:
      break;
    }
    if (store(k, k->arg ? optarg : "yes", false, cfg, why, sizeof why) != 0) {
      dspkd_error("--%s: %s", names[opt - 256], why);
      return DSPK_EINVAL;
    }
    if (k->off == offsetof(struct dspkd_config, cache_path) && k->type == K_STR)
      *cli_cache = 1;
    else if (k->off == offsetof(struct dspkd_config, no_cache))
      *cli_cache = -1;
  }
  if (optind < argc) {
    dspkd_error("unexpected argument \"%s\" (see --help)", vis(argv[optind]));
    return DSPK_EINVAL;
  }
  /* --help and --version do only that: given with anything else
   * (--end-job, which would then exit 0 without ending the job: outside
   * probe 16 F1), the command line is refused rather than the other
   * options silently ignored. */
  if (alone && other_name) {
    dspkd_error("option '--%s' must be given alone: with '--%s' the command line is refused "
                "(nothing else would be done)", alone_name, other_name);
    return DSPK_EINVAL;
  }
  if (alone == 1)
    usage(stdout);
  return alone;
}

/* Whether the default file is absent: nothing has its name (ENOENT from
 * lstat, its directory searchable).  Anything else, a directory on the way
 * the daemon's user cannot search, a symbolic link to nothing, a loop, an
 * I/O error, is a file that cannot be read: load() says why. */
static bool default_absent(const char *path) {
  struct stat st;
  return lstat(path, &st) != 0 && errno == ENOENT;
}

int dspkd_config_start(int argc, char **argv, struct dspkd_config *cfg) {
  const char *config = NULL;
  char err[PATH_MAX + 512];
  int r, cli_cache = 0; /* 1: --cache PATH, -1: --no-cache (never both) */

  flag_mask = 0;
  file_socket[0] = '\0';
  if ((r = parse_argv(argc, argv, cfg, &config, &cli_cache)) != 0)
    return r;
  /* --cache and --no-cache each decide both keys of the cache's choice (the
   * option wins over the file's cache and no_cache alike), so both are the
   * command line's: the file's are read but not applied, at start and at a
   * reload, nor reported as changed by one. */
  if (cli_cache)
    flag_mask |= (uint64_t)1 << key_index("cache") | (uint64_t)1 << key_index("no_cache");
  have_conf = conf_default = false;
  conf_path[0] = '\0';
  if (config && !*config)
    goto done; /* --config "": no file at all, nor at a reload */
  if (!config) {
    /* The default file is read when it exists, now or at a reload. */
    snprintf(conf_path, sizeof conf_path, "%s", DSPKD_CONFIG_DEFAULT);
    conf_default = true;
    if (default_absent(DSPKD_CONFIG_DEFAULT))
      goto done;
    config = DSPKD_CONFIG_DEFAULT;
  }
  if (strlen(config) >= sizeof conf_path) {
    dspkd_error("--config: path too long");
    return DSPK_EINVAL;
  }
  snprintf(conf_path, sizeof conf_path, "%s", config);
  r = load(conf_path, cfg, NULL, flag_mask, err, sizeof err);
  if (r < 0) {
    dspkd_error("%s", err);
    return r;
  }
  have_conf = true;
done:
  derive_defaults(cfg);
  warn_limits(cfg);
  start_cfg = *cfg;
  /* Which cache: an option wins over the file (whose cache and
   * no_cache = yes never come together: handler); --cache "" is no cache. */
  if (cli_cache)
    cfg->no_cache = cli_cache < 0;
  no_cache_from = cli_cache < 0 ? "--no-cache"
                  : cli_cache > 0 ? "--cache \"\""
                                  : "no_cache = yes";
  if (cfg->no_cache || (cfg->cache_path && !cfg->cache_path[0])) {
    cfg->no_cache = true;
    cfg->cache_path = NULL;
  }
  dspkd_log_set_level((enum dspkd_level)cfg->log_level);
  return 0;
}

const char *dspkd_config_file(void) {
  return conf_path[0] ? conf_path : NULL;
}

void dspkd_config_log_no_cache(void) {
  if (no_cache_from[0] == '-')
    dspkd_info("cache: none (%s): nothing persists", no_cache_from);
  else
    dspkd_info("cache: none (%s in %s): nothing persists", no_cache_from, conf_path);
}

void dspkd_config_log_source(void) {
  if (have_conf)
    dspkd_info("configuration read from %s", conf_path);
  else if (conf_default)
    dspkd_info("no configuration file (%s does not exist): the built-in defaults",
               conf_path);
  else
    dspkd_info("no configuration file (--config \"\"): the built-in defaults");
}

const char *dspkd_config_name(const char *key, char *buf, size_t len) {
  int i = key_index(key);
  if (i >= 0 && (flag_mask & ((uint64_t)1 << i))) {
    char opt[40];
    opt_name(&keys[i], opt, sizeof opt);
    snprintf(buf, len, "--%s", opt);
  } else {
    snprintf(buf, len, "%s%s%s", conf_path[0] ? conf_path : "", conf_path[0] ? ": " : "", key);
  }
  return buf;
}

/* Writes cwd/path into out (len bytes, at most max - 1 used) when path is
 * relative.  0, or -1 (logged, naming what). */
static int absolute(const char *what, const char *path, char *out, size_t len, size_t max) {
  char cwd[PATH_MAX];
  int n;
  if (!getcwd(cwd, sizeof cwd)) {
    dspkd_error("%s %s: cannot tell the current directory: %s", what, path, strerror(errno));
    return -1;
  }
  n = snprintf(out, len, "%s%s%s", cwd, strcmp(cwd, "/") ? "/" : "", path);
  if (n < 0 || (size_t)n >= len || (size_t)n >= max) {
    dspkd_error("%s %s: as an absolute path (%s/%s) it has more than %zu bytes; give a "
                "shorter one", what, path, cwd, path, max - 1);
    return -1;
  }
  return 0;
}

int dspkd_config_abspath(const char *what, const char *path, char *out, size_t len) {
  if (path[0] == '/') {
    int n = snprintf(out, len, "%s", path);
    if (n >= 0 && (size_t)n < len)
      return 0;
    dspkd_error("%s %s: more than %zu bytes; give a shorter one", what, path, len - 1);
    return -1;
  }
  return absolute(what, path, out, len, len);
}

/* absolute() for dspkd_config_absolute: detached, a failure is logged and
 * fatal (-1); in the foreground the path stays as given (0), unlogged. */
static int absolute_for(bool detached, const char *what, const char *path, char *out,
                        size_t len, size_t max) {
  char cwd[PATH_MAX];
  if (detached)
    return absolute(what, path, out, len, max);
  if (!getcwd(cwd, sizeof cwd))
    return 1;
  int n = snprintf(out, len, "%s%s%s", cwd, strcmp(cwd, "/") ? "/" : "", path);
  return n < 0 || (size_t)n >= len || (size_t)n >= max ? 1 : 0;
}

int dspkd_config_absolute(struct dspkd_config *cfg, bool detached) {
  static char cache[PATH_MAX];
  char buf[PATH_MAX];
  int r;
  if (detached && cfg->socket_path[0] && cfg->socket_path[0] != '/') {
    if (absolute("socket", cfg->socket_path, buf, sizeof buf, DSPKD_SUN_PATH) != 0)
      return -1;
    memcpy(cfg->socket_path, buf, strlen(buf) + 1); /* shorter than DSPKD_SUN_PATH */
  }
  /* ":memory:" names no file (an in-memory cache): detached, it was made
   * "/START/:memory:", a file of that name (probe 22 E3's neighbour). */
  if (cfg->cache_path && cfg->cache_path[0] && cfg->cache_path[0] != '/' &&
      strcmp(cfg->cache_path, ":memory:") != 0) {
    if ((r = absolute_for(detached, "cache", cfg->cache_path, cache, sizeof cache,
                          sizeof cache)) < 0)
      return -1;
    if (r == 0)
      cfg->cache_path = cache;
  }
  if (conf_path[0] && conf_path[0] != '/') {
    if ((r = absolute_for(detached, "configuration file", conf_path, buf, sizeof buf,
                          sizeof conf_path)) < 0)
      return -1;
    if (r == 0)
      memcpy(conf_path, buf, strlen(buf) + 1); /* shorter than conf_path */
  }
  return 0;
}

/* 1 when every item of the comma list a is in the comma list b. */
static bool items_in(const char *a, const char *b) {
  for (const char *p = a; *p;) {
    size_t n = strcspn(p, ",");
    bool found = false;
    for (const char *q = b; *q && !found;) {
      size_t m = strcspn(q, ",");
      found = m == n && memcmp(p, q, n) == 0;
      q += m + (q[m] == ',');
    }
    if (!found)
      return false;
    p += n + (p[n] == ',');
  }
  return true;
}

/* 1 when a restart-only key's value in a and b differs (strings by
 * content, NULL as unset; the lists backends and raw_kernels as sets: the
 * order of their items changes nothing). */
static int restart_key_differs(const struct key *k, const struct dspkd_config *a,
                               const struct dspkd_config *b) {
  const char *pa = (const char *)a + k->off, *pb = (const char *)b + k->off;
  if (k->type == K_STR) {
    const char *sa = *(const char *const *)pa, *sb = *(const char *const *)pb;
    if (sa && sb && (k->off == offsetof(struct dspkd_config, backends) ||
                     k->off == offsetof(struct dspkd_config, raw_kernels)))
      return !items_in(sa, sb) || !items_in(sb, sa);
    return strcmp(sa ? sa : "", sb ? sb : "") != 0;
  }
  if (k->type == K_SOCKET)
    return strcmp(pa, pb) != 0;
  return memcmp(pa, pb, k->width) != 0;
}

uint64_t dspkd_fds_need(const struct dspkd_config *cfg) {
  return (uint64_t)cfg->max_clients * (1 + DSPKD_MAX_FDS) + DSPKD_LINGER_MAX +
         DSPKD_NOFILE_RESERVE;
}

void dspkd_config_check_nofile(const struct dspkd_config *cfg, unsigned long long was) {
  struct rlimit rl;
  unsigned long long need;

  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return;
  need = (unsigned long long)dspkd_fds_need(cfg);
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) {
    dspkd_info("file descriptors: RLIMIT_NOFILE %llu (soft limit was %llu; %llu needed at "
               "most for max_clients %zu, the rest for buffer.share memfds not yet read)",
               (unsigned long long)rl.rlim_cur, was, need, cfg->max_clients);
    return;
  }
  dspkd_warn("file descriptors: RLIMIT_NOFILE %llu (hard limit %llu) is below the %llu that "
             "max_clients %zu connection%s may need (%d each with their pending "
             "buffer.import descriptors, plus %d for the daemon's own files): raise the hard "
             "limit (LimitNOFILE= in the unit, or ulimit -Hn) or lower max_clients "
             "(docs/admin.md, \"File descriptors\")", (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max, need, cfg->max_clients,
             cfg->max_clients == 1 ? "" : "s", 1 + DSPKD_MAX_FDS,
             DSPKD_LINGER_MAX + DSPKD_NOFILE_RESERVE);
}

static dspkd_job_state_check *job_state_check;

void dspkd_config_job_state_check(dspkd_job_state_check *check) {
  job_state_check = check;
}

int dspkd_config_reload(struct dspkd *d, char *msg, size_t msglen) {
  struct dspkd_config nw, was;
  size_t clients_were = d->cfg.max_clients;
  char err[3 * PATH_MAX + 512], jobs[PATH_MAX];
  int r, made;

  if (!conf_path[0]) {
    dspkd_info("reload: started with --config \"\": no configuration file to read");
    return 1;
  }
  if (conf_default && !have_conf && default_absent(conf_path)) {
    dspkd_info("reload: %s does not exist; the built-in defaults stay", conf_path);
    return 1;
  }
  dspkd_config_defaults(&nw);
  r = load(conf_path, &nw, &d->cfg, flag_mask, err, sizeof err);
  if (r < 0) {
    dspkd_error("reload: %s; keeping the running configuration", err);
    if (msg && msglen)
      snprintf(msg, msglen, "%.*s; keeping the running configuration",
               (int)(msglen > 64 ? msglen - 40 : msglen), err);
    goto out;
  }
  /* The state file the next start would use must pass the start's checks
   * now, as a relative job_state is refused above: else a reload would
   * accept a value that the next start (a package upgrade weeks later)
   * and the epilog's dspkd --end-job refuse. */
  if (dspkd_paths_reload_check(
          &nw, (flag_mask >> key_index("socket")) & 1, (flag_mask >> key_index("job_state")) & 1,
          ((flag_mask >> key_index("cache")) | (flag_mask >> key_index("no_cache"))) & 1, err,
          sizeof err) != 0) {
    dspkd_error("reload: %s; keeping the running configuration", err);
    if (msg && msglen)
      snprintf(msg, msglen, "%.*s; keeping the running configuration",
               (int)(msglen > 64 ? msglen - 40 : msglen), err);
    r = DSPK_EINVAL;
    goto out;
  }
  /* The new state file's directory and lock, as the next start checks
   * them (daemon/jobstate.c): a missing directory, another running
   * daemon's file or a hard link to it was "takes effect at the next
   * start", which refused it (outside probe 15 F4). */
  if (job_state_check && !((flag_mask >> key_index("job_state")) & 1) &&
      (made = dspkd_paths_reload_job_state(&nw, (flag_mask >> key_index("socket")) & 1, jobs,
                                           sizeof jobs)) >= 0 &&
      job_state_check(d, jobs, made == 0, err, sizeof err) != 0) {
    dspkd_error("reload: Slurm jobs: %s; keeping the running configuration", err);
    if (msg && msglen)
      snprintf(msg, msglen, "%.*s; keeping the running configuration",
               (int)(msglen > 64 ? msglen - 40 : msglen), err);
    r = DSPK_EINVAL;
    goto out;
  }
  /* The start's file socket, with which the file's new one is compared. */
  was = start_cfg;
  snprintf(was.socket_path, sizeof was.socket_path, "%s", file_socket);
  for (size_t i = 0; i < NKEYS; i++) {
    const struct key *k = &keys[i];
    if (flag_mask & ((uint64_t)1 << i) || !(k->where & IN_FILE))
      continue;
    if (k->reload) {
      memcpy((char *)&d->cfg + k->off, (char *)&nw + k->off, k->width);
      continue;
    }
    /* A restart-only key whose value (the file's, else its default) is not
     * the one the daemon started with, whether the file changed, added or
     * removed it: said, as dspk.conf(5) promises, not applied. */
    int paths = dspkd_paths_reload_differs(
        k->name, &was, &nw, (flag_mask >> key_index("socket")) & 1);
    if (paths >= 0 ? paths : restart_key_differs(k, &was, &nw))
      dspkd_warn("%s: %s changed; it takes effect at the next start", conf_path, k->name);
  }
  /* A derived key the file leaves unset is derived again (from the new
   * max_clients); one the command line set is kept as the loop kept it. */
  derive_defaults(&d->cfg);
  warn_limits(&d->cfg);
  have_conf = true;
  dspkd_log_set_level((enum dspkd_level)d->cfg.log_level);
  dspkd_info("configuration reloaded from %s", conf_path);
  /* The checks the start makes of a reloadable key, made again when a
   * reload changed it: the descriptors max_clients needs. */
  if (d->cfg.max_clients != clients_were) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
      dspkd_config_check_nofile(&d->cfg, (unsigned long long)rl.rlim_cur);
  }
  r = 0;
out:
  for (size_t i = 0; i < NKEYS; i++) {
    free(reload_strs[i]);
    reload_strs[i] = NULL;
  }
  return r;
}

/* ---- policy -------------------------------------------------------------- */

static int in_list(const struct dspkd_idlist *l, uint32_t id) {
  for (unsigned i = 0; i < l->n; i++)
    if (l->id[i] == id && id != DSPKD_ID_NOBODY) /* a name that did not resolve */
      return 1;
  return 0;
}

static int in_groups(const struct dspkd_idlist *l, gid_t gid, const gid_t *groups,
                     size_t ngroups) {
  if (in_list(l, (uint32_t)gid))
    return 1;
  for (size_t i = 0; i < ngroups; i++)
    if (in_list(l, (uint32_t)groups[i]))
      return 1;
  return 0;
}

int dspkd_policy_may_connect(const struct dspkd_config *cfg, uid_t uid, gid_t gid,
                             const gid_t *groups, size_t ngroups) {
  if (!cfg->allow_users.n && !cfg->allow_groups.n)
    return 1;
  if (uid == 0 || uid == geteuid())
    return 1;
  return in_list(&cfg->allow_users, (uint32_t)uid) ||
         in_groups(&cfg->allow_groups, gid, groups, ngroups);
}

int dspkd_policy_is_admin(const struct dspkd_config *cfg, uid_t uid, gid_t gid,
                          const gid_t *groups, size_t ngroups) {
  if (uid == (uid_t)-1)
    return 0;
  if (uid == 0 || uid == geteuid())
    return 1;
  return in_list(&cfg->admin_users, (uint32_t)uid) ||
         in_groups(&cfg->admin_groups, gid, groups, ngroups);
}
