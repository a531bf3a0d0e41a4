/*
 * dspkd's configuration file (daemon/config.h).  One table describes every
 * key: its section, its name (the command-line flag is the same name with
 * dashes), where it lives in struct dspkd_config, its range, and whether a
 * reload may change it.  The file is read with libinih through a reader that
 * counts lines, so every error names file:line.  Unknown sections and keys
 * are errors, not warnings: a typo in a limit must not go unnoticed.
 *
 * Precedence: command line > file > defaults.  Which keys the command line
 * set is found by scanning argv for the flags of the table (getopt_long's
 * unambiguous prefixes included), so a reload keeps them too.
 */
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DSPKD_HAVE_INIH
#include <ini.h>
#endif

#include "daemon/config.h"
#include "daemon/log.h"
#include "proto/units.h"

/* K_SHARE: a size in bytes, or a share of a device's memory ("50%"). */
enum ktype { K_SOCKET, K_STR, K_BOOL, K_LEVEL, K_UINT, K_SIZE, K_MS, K_USERS, K_GROUPS,
             K_SHARE };

struct key {
  const char *section;
  const char *name; /* file key; the flag is the same with '-' for '_' */
  enum ktype type;
  size_t off, width; /* the field in struct dspkd_config */
  uint64_t lo, hi;
  bool reload; /* a reload may change it */
};

#define F(field) offsetof(struct dspkd_config, field), sizeof(((struct dspkd_config *)0)->field)

static const struct key keys[] = {
    {"daemon", "socket", K_SOCKET, F(socket_path), 0, 0, false},
    {"daemon", "cache", K_STR, F(cache_path), 0, 0, false},
    {"daemon", "backends", K_STR, F(backends), 0, 0, false},
    {"daemon", "foreground", K_BOOL, F(foreground), 0, 0, false},
    {"daemon", "log_level", K_LEVEL, F(log_level), 0, 0, true},
    {"daemon", "shutdown_timeout", K_MS, F(shutdown_timeout_ms), 0, (uint64_t)1 << 40, true},
    {"limits", "max_message", K_SIZE, F(lim.max_message), 64, (uint64_t)1 << 32, true},
    {"limits", "max_depth", K_UINT, F(lim.max_depth), 4, 1024, true},
    {"limits", "max_objects", K_UINT, F(lim.max_objects), 16, (uint64_t)1 << 28, true},
    {"limits", "max_rank", K_UINT, F(lim.max_rank), 1, DSPK_MAX_RANK, true},
    {"limits", "max_elements", K_UINT, F(lim.max_elements), 1, (uint64_t)1 << 40, true},
    {"limits", "max_inflight", K_UINT, F(max_inflight), 1, 1 << 20, true},
    {"limits", "max_unsent", K_SIZE, F(max_unsent), 1, (uint64_t)1 << 40, true},
    {"limits", "max_buffers", K_UINT, F(max_buffers), 1, 1 << 24, true},
    {"limits", "max_clients", K_UINT, F(max_clients), 1, 1 << 20, true},
    {"policy", "allow_users", K_USERS, F(allow_users), 0, 0, true},
    {"policy", "allow_groups", K_GROUPS, F(allow_groups), 0, 0, true},
    {"policy", "admin_users", K_USERS, F(admin_users), 0, 0, true},
    {"policy", "admin_groups", K_GROUPS, F(admin_groups), 0, 0, true},
    /* Appended, so the indices above (KEY_LOG_LEVEL) stay. */
    {"daemon", "no_cache", K_BOOL, F(no_cache), 0, 0, false},
    {"daemon", "cache_max_bytes", K_SIZE, F(cache_max_bytes), 4096, (uint64_t)1 << 40, false},
    {"limits", "max_user_clients", K_UINT, F(max_user_clients), 1, 1 << 20, true},
    {"limits", "max_user_partial", K_SIZE, F(max_user_partial), 4096, (uint64_t)1 << 40, true},
    {"limits", "max_user_memory", K_SHARE, F(max_user_memory), 1, (uint64_t)1 << 50, true},
    {"limits", "max_conn_memory", K_SHARE, F(max_conn_memory), 1, (uint64_t)1 << 50, true},
    {"daemon", "metrics_listen", K_STR, F(metrics_listen), 0, 0, false},
    {"limits", "max_job_memory", K_SHARE, F(max_job_memory), 1, (uint64_t)1 << 50, true},
    {"policy", "job_required", K_BOOL, F(job_required), 0, 0, true},
    {"daemon", "idle_trim", K_MS, F(idle_trim_ms), 0, (uint64_t)1 << 40, true},
    {"daemon", "device_inflight", K_UINT, F(device_inflight), 1, DSPKD_MAX_DEVICE_INFLIGHT,
     false},
};
#define NKEYS (sizeof keys / sizeof keys[0])
_Static_assert(NKEYS <= 60, "the key masks are 64-bit");

/* Flags of daemon/main.c that are not configuration keys; the first two
 * take no value, the others one. */
static const char *const other_flags[] = {"help", "version", "ready-fd", "config"};
#define NOTHER (sizeof other_flags / sizeof other_flags[0])
#define FLAG_CONFIG (NKEYS + 3)
#define KEY_LOG_LEVEL 4 /* keys[4] */

/* What the start found, for reloads. */
static char conf_path[PATH_MAX];
static bool have_conf;
static uint64_t flag_mask; /* bit i: keys[i] came from the command line */
static char file_socket[256];
static char *file_strs[3]; /* cache, backends, metrics_listen: strings the configuration owns */

void dspkd_config_defaults(struct dspkd_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  dspk__limits_default(&cfg->lim);
  cfg->ready_fd = -1;
  cfg->max_inflight = 1024;
  cfg->max_unsent = (size_t)64 << 20;
  cfg->max_buffers = 4096;
  cfg->max_clients = 256;
  /* One user may hold a quarter of the connections, half of each device's
   * memory, and four largest messages in incomplete frames. */
  cfg->max_user_clients = 64;
  cfg->max_user_partial = (uint64_t)1 << 30;
  cfg->max_user_memory = DSPKD_SHARE(50);
  cfg->max_conn_memory = DSPKD_SHARE(100);
  cfg->max_job_memory = DSPKD_SHARE(100);
  cfg->shutdown_timeout_ms = 10000;
  cfg->idle_trim_ms = 5000;
  cfg->device_inflight = 4;
  cfg->log_level = DSPKD_INFO;
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

/* Parses an unsigned decimal; for sizes with an optional binary unit
 * (proto/units.h: K, M, G, T, KiB...), for durations with ms or s.  0 or
 * -1. */
static int parse_uint(const char *s, enum ktype t, uint64_t *out) {
  char *end;
  unsigned long long v;
  uint64_t mul = 1;

  if (t == K_SIZE)
    return dspk__parse_size(s, out);
  if (!*s || *s == '-' || *s == '+')
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

/* Parses a list of user (or group) names or numeric ids, separated by
 * commas or spaces.  0, or -1 with the offending word in msg. */
static int parse_ids(const char *s, bool groups, struct dspkd_idlist *out, char *msg,
                     size_t len) {
  struct dspkd_idlist l = {0};
  char word[64];

  while (*s) {
    size_t n = strcspn(s, ", \t");
    if (n == 0) {
      s++;
      continue;
    }
    if (n >= sizeof word) {
      snprintf(msg, len, "name too long");
      return -1;
    }
    memcpy(word, s, n);
    word[n] = '\0';
    s += n;
    if (l.n >= DSPKD_MAX_IDS) {
      snprintf(msg, len, "more than %d entries", DSPKD_MAX_IDS);
      return -1;
    }
    char *end;
    errno = 0;
    unsigned long v = strtoul(word, &end, 10);
    if (!errno && *end == '\0' && word[0] != '-' && v < UINT32_MAX) {
      l.id[l.n++] = (uint32_t)v;
      continue;
    }
    if (groups) {
      struct group *g = getgrnam(word);
      if (!g) {
        snprintf(msg, len, "no such group \"%s\"", word);
        return -1;
      }
      l.id[l.n++] = (uint32_t)g->gr_gid;
    } else {
      struct passwd *p = getpwnam(word);
      if (!p) {
        snprintf(msg, len, "no such user \"%s\"", word);
        return -1;
      }
      l.id[l.n++] = (uint32_t)p->pw_uid;
    }
  }
  *out = l;
  return 0;
}

/* ---- the file ----------------------------------------------------------- */

struct parse {
  const char *path;
  FILE *f;
  int line;      /* the line the reader returned last */
  int completed; /* lines read to their newline */
  struct dspkd_config *cfg;
  const struct dspkd_config *running; /* reload: the running configuration */
  uint64_t skip;                      /* keys the command line set */
  uint64_t seen;                      /* keys the file set */
  int err_line;                       /* first error of a handler, or 0 */
  char err[PATH_MAX + 320];
};

static char *reader(char *str, int num, void *stream) {
  struct parse *p = stream;
  char *r = fgets(str, num, p->f);
  if (!r)
    return NULL;
  p->line = p->completed + 1;
  if (strchr(r, '\n'))
    p->completed++;
  return r;
}

static const struct key *find_key(const char *name, int *idx) {
  for (size_t i = 0; i < NKEYS; i++) {
    if (strcmp(keys[i].name, name) == 0) {
      *idx = (int)i;
      return &keys[i];
    }
  }
  return NULL;
}

__attribute__((format(printf, 2, 3))) static int perr(struct parse *p, const char *fmt,
                                                      ...) {
  va_list ap;
  char msg[256];
  if (p->err_line)
    return 0;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  p->err_line = p->line;
  snprintf(p->err, sizeof p->err, "%s:%d: %s", p->path, p->line, msg);
  return 0;
}

/* Stores a value; in a reload, keys that need a restart are only compared
 * with the running value (and a difference logged). */
static int handler(void *user, const char *section, const char *name, const char *value) {
  struct parse *p = user;
  char kname[64], why[128];
  const struct key *k;
  int idx;
  void *field;
  uint64_t v;

  snprintf(kname, sizeof kname, "%s", name);
  for (char *c = kname; *c; c++)
    if (*c == '-')
      *c = '_';
  k = find_key(kname, &idx);
  if (!k)
    return perr(p, "unknown key \"%s\" in [%s]", name, section);
  if (strcmp(section, k->section) != 0)
    return perr(p, "key \"%s\" belongs in section [%s], not [%s]", name, k->section,
                section);
  if (p->seen & ((uint64_t)1 << idx))
    return perr(p, "key \"%s\" given twice", name);
  p->seen |= (uint64_t)1 << idx;
  field = (char *)p->cfg + k->off;

  switch (k->type) {
  case K_SOCKET:
    if (!*value || strlen(value) >= sizeof file_socket)
      return perr(p, "socket: expected a path shorter than %zu bytes", sizeof file_socket);
    break;
  case K_STR:
    if (!*value)
      return perr(p, "%s: expected a value", name);
    break;
  case K_BOOL: {
    bool b;
    if (parse_bool(value, &b) != 0)
      return perr(p, "%s: expected yes or no, got \"%s\"", name, value);
    if (!(p->skip & ((uint64_t)1 << idx)))
      memcpy(field, &b, sizeof b);
    return 1;
  }
  case K_LEVEL: {
    enum dspkd_level l;
    if (dspkd_log_parse_level(value, &l) != 0)
      return perr(p, "%s: expected error, warn, notice, info or debug, got \"%s\"", name, value);
    if (!(p->skip & ((uint64_t)1 << idx)))
      *(int *)field = (int)l;
    return 1;
  }
  case K_UINT:
  case K_SIZE:
  case K_MS:
    if (parse_uint(value, k->type, &v) != 0 || v < k->lo || v > k->hi)
      return perr(p, "%s: expected an integer from %llu to %llu%s, got \"%s\"", name,
                  (unsigned long long)k->lo, (unsigned long long)k->hi,
                  k->type == K_SIZE  ? " (suffix K, M, G or T allowed)"
                  : k->type == K_MS ? " milliseconds (or with suffix s)"
                                    : "",
                  value);
    if (!(p->skip & ((uint64_t)1 << idx)))
      put_uint(field, k->width, v);
    return 1;
  case K_SHARE:
    if (dspkd_config_parse_share(value, k->lo, k->hi, &v) != 0)
      return perr(p, "%s: expected a size from %llu to %llu (suffix K, M, G or T allowed) "
                  "or a share of each device's memory from 1%% to 100%%, got \"%s\"", name,
                  (unsigned long long)k->lo, (unsigned long long)k->hi, value);
    if (!(p->skip & ((uint64_t)1 << idx)))
      put_uint(field, k->width, v);
    return 1;
  case K_USERS:
  case K_GROUPS: {
    struct dspkd_idlist l;
    if (parse_ids(value, k->type == K_GROUPS, &l, why, sizeof why) != 0)
      return perr(p, "%s: %s", name, why);
    if (!(p->skip & ((uint64_t)1 << idx)))
      memcpy(field, &l, sizeof l);
    return 1;
  }
  }

  /* socket, cache, backends, metrics_listen: strings that only a restart
   * changes. */
  if (p->skip & ((uint64_t)1 << idx))
    return 1;
  if (p->running) {
    const char *cur = k->type == K_SOCKET ? file_socket : *(const char *const *)field;
    if (!cur || strcmp(cur, value) != 0)
      dspkd_warn("%s: %s changed; it takes effect at the next start", p->path, name);
    return 1;
  }
  if (k->type == K_SOCKET) {
    snprintf(file_socket, sizeof file_socket, "%s", value);
  } else {
    int slot = strcmp(k->name, "cache") == 0 ? 0 : strcmp(k->name, "backends") == 0 ? 1 : 2;
    char *s = strdup(value);
    if (!s)
      return perr(p, "out of memory");
    free(file_strs[slot]);
    file_strs[slot] = s;
    *(const char **)field = s;
  }
  return 1;
}

/* Reads path into cfg (keys in skip untouched).  0 or a negative code, with
 * a one-line message in err. */
static int load(const char *path, struct dspkd_config *cfg,
                const struct dspkd_config *running, uint64_t skip, char *err, size_t len) {
#ifdef DSPKD_HAVE_INIH
  struct parse p = {.path = path, .cfg = cfg, .running = running, .skip = skip};
  int r;

  p.f = fopen(path, "re");
  if (!p.f) {
    int e = errno;
    snprintf(err, len, "%s: cannot read: %s", path, strerror(e));
    return e == ENOENT ? DSPK_ENOENT : DSPK_EIO;
  }
  r = ini_parse_stream(reader, &p, handler, &p);
  fclose(p.f);
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

/* Marks the key (or notes the --config value) an argv word names; returns
 * 1 when the flag takes the next word as its value. */
static int scan_flag(const char *arg, const char *next, const char **config) {
  char name[64];
  const char *eq = strchr(arg, '=');
  size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
  int match = -1, nmatch = 0;
  bool exact = false;

  if (n >= sizeof name)
    return 0;
  memcpy(name, arg, n);
  name[n] = '\0';
  for (char *c = name; *c; c++)
    if (*c == '-')
      *c = '_';
  /* getopt_long accepts any unambiguous prefix: match the same way. */
  for (size_t i = 0; i < NKEYS + NOTHER && !exact; i++) {
    char cand[64];
    snprintf(cand, sizeof cand, "%s", i < NKEYS ? keys[i].name : other_flags[i - NKEYS]);
    for (char *c = cand; *c; c++)
      if (*c == '-')
        *c = '_';
    if (strncmp(cand, name, n) != 0)
      continue;
    if (cand[n] == '\0') {
      exact = true;
      match = (int)i;
      nmatch = 1;
    } else {
      match = (int)i;
      nmatch++;
    }
  }
  if (nmatch != 1)
    return 0;
  if ((size_t)match < NKEYS)
    flag_mask |= (uint64_t)1 << match;
  if ((size_t)match == FLAG_CONFIG)
    *config = eq ? eq + 1 : next;
  if ((size_t)match < NKEYS)
    return !eq && keys[match].type != K_BOOL;
  return !eq && (size_t)match >= NKEYS + 2;
}

int dspkd_config_start(int argc, char **argv, struct dspkd_config *cfg) {
  const char *config = NULL;
  char err[PATH_MAX + 512];
  int r;

  flag_mask = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0)
      break;
    if (strncmp(argv[i], "--", 2) != 0)
      continue;
    i += scan_flag(argv[i] + 2, i + 1 < argc ? argv[i + 1] : NULL, &config);
  }
  if (config && !*config)
    return 0; /* --config "": no file at all */
  if (!config) {
    if (access(DSPKD_CONFIG_DEFAULT, F_OK) != 0)
      return 0;
    config = DSPKD_CONFIG_DEFAULT;
  }
  if (strlen(config) >= sizeof conf_path) {
    fprintf(stderr, "dspkd: --config: path too long\n");
    return DSPK_EINVAL;
  }
  snprintf(conf_path, sizeof conf_path, "%s", config);
  r = load(conf_path, cfg, NULL, flag_mask, err, sizeof err);
  if (r < 0) {
    fprintf(stderr, "dspkd: %s\n", err);
    return r;
  }
  have_conf = true;
  if (!(flag_mask & ((uint64_t)1 << KEY_LOG_LEVEL)))
    dspkd_log_set_level((enum dspkd_level)cfg->log_level);
  return 0;
}

const char *dspkd_config_file_socket(void) { return file_socket[0] ? file_socket : NULL; }

int dspkd_config_reload(struct dspkd *d, char *msg, size_t msglen) {
  struct dspkd_config nw;
  char err[PATH_MAX + 512];
  int r;

  if (!have_conf) {
    dspkd_info("reload: no configuration file was read at start; nothing to do");
    return 0;
  }
  dspkd_config_defaults(&nw);
  r = load(conf_path, &nw, &d->cfg, flag_mask, err, sizeof err);
  if (r < 0) {
    dspkd_error("reload: %s; keeping the running configuration", err);
    if (msg && msglen)
      snprintf(msg, msglen, "%.*s; keeping the running configuration",
               (int)(msglen > 64 ? msglen - 40 : msglen), err);
    return r;
  }
  for (size_t i = 0; i < NKEYS; i++) {
    const struct key *k = &keys[i];
    if (!k->reload || (flag_mask & ((uint64_t)1 << i)))
      continue;
    memcpy((char *)&d->cfg + k->off, (char *)&nw + k->off, k->width);
  }
  if (!(flag_mask & ((uint64_t)1 << KEY_LOG_LEVEL)))
    dspkd_log_set_level((enum dspkd_level)d->cfg.log_level);
  dspkd_info("configuration reloaded from %s", conf_path);
  return 0;
}

/* ---- policy -------------------------------------------------------------- */

static int in_list(const struct dspkd_idlist *l, uint32_t id) {
  for (unsigned i = 0; i < l->n; i++)
    if (l->id[i] == id)
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
  if (!cfg->admin_users.n && !cfg->admin_groups.n)
    return uid == 0 || uid == geteuid();
  return in_list(&cfg->admin_users, (uint32_t)uid) ||
         in_groups(&cfg->admin_groups, gid, groups, ngroups);
}
