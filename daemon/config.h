/*
 * dspkd's configuration file (/etc/dspk/dspkd.conf, INI read with libinih):
 * every setting the command line has, plus the access policy.  The command
 * line wins over the file; the file wins over the built-in defaults.  SIGHUP
 * reads the file again and applies what can change while clients stay
 * connected (limits, policy, log level, grace period); an invalid file keeps
 * the running configuration.  Loop thread only.
 */
#ifndef DSPKD_CONFIG_H
#define DSPKD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/dspkd.h"

#ifndef DSPKD_SYSCONFDIR
#define DSPKD_SYSCONFDIR "/etc"
#endif
/* Read at start when --config is not given and the file exists. */
#define DSPKD_CONFIG_DEFAULT DSPKD_SYSCONFDIR "/dspk/dspkd.conf"

/* Fills cfg with the built-in defaults (the table's, which --help shows). */
void dspkd_config_defaults(struct dspkd_config *cfg);

/* Parses a quota given as a size (lo to hi bytes, proto/units.h) or as a
 * share of each device's memory ("1%" to "100%", DSPKD_SHARE).  0 or -1. */
int dspkd_config_parse_share(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

/*
 * After dspkd_config_defaults(): parses the command line into cfg (getopt_long
 * over the settings table), then reads --config (or the default file, when it
 * exists) and applies every key of the file that no option set, and sets the
 * log level.  cfg->socket_path is the socket the option or the file named
 * ("" : neither).  Returns 0; 1 after writing --help to stdout (exit 0); 2
 * for --version (the caller writes it; exit 0); or DSPK_EINVAL/DSPK_ENOENT/DSPK_EIO after writing one line to
 * stderr (naming the file and line for the file's errors; exit 2).
 * Remembers the file and the options for dspkd_config_reload().
 */
int dspkd_config_start(int argc, char **argv, struct dspkd_config *cfg);
/* The configuration file the daemon reads (at start and at a reload):
 * --config's, else the default (also while it does not exist: a reload
 * reads it once it does); NULL with --config "".  The string is static. */
const char *dspkd_config_file(void);
/* Logs (info) the file dspkd_config_start read, or that it read none and
 * why; once the start-up checks passed (an error stays the one line). */
void dspkd_config_log_source(void);
/* Logs (info) that dspkd runs without a cache and what said so (--no-cache,
 * --cache "", or the file's no_cache): the line that stands for "cache:
 * PATH" when cfg->no_cache is set. */
void dspkd_config_log_no_cache(void);

/*
 * Before a detached daemon leaves its start directory (chdir("/")): makes
 * the relative paths it uses later absolute, from the current directory:
 * cfg->socket_path, cfg->cache_path and the file a reload reads.  0, or -1
 * (logged: the directory is unknown, or a path gets too long).  In the
 * foreground (detached false) the cache and the file alike, so that the
 * log, status and cache.stats name the same files as a detached daemon's
 * (probe 22 E3), where that can be done (else left as given, 0); the
 * socket is bound as given there (its absolute form may be longer than a
 * socket's 107 bytes), d->socket_name names it absolute.
 */
int dspkd_config_absolute(struct dspkd_config *cfg, bool detached);
/* path as an absolute path in out (len bytes): a relative one from the
 * current directory.  0, or -1 (logged, naming what: the directory is
 * unknown, or the path gets too long). */
int dspkd_config_abspath(const char *what, const char *path, char *out, size_t len);

/* How a message names the setting key: "--OPTION" when the command line
 * set it, else "FILE: key" (or the key alone without a file), in buf. */
const char *dspkd_config_name(const char *key, char *buf, size_t len);

/*
 * Reads the file again (SIGHUP) and applies the keys that may change while
 * running; keys the command line set keep their value; a key that needs a
 * restart (socket, cache, no_cache, cache_max_bytes, backends, foreground,
 * metrics_listen, device_inflight) whose value (the file's, else its
 * default; for socket, cache and job_state the file it names:
 * daemon/paths.h) differs from the one the daemon started with is logged ("KEY
 * changed; it takes effect at the next start") and not applied, whether the
 * file changed, added or removed it.  Without --config the default file is
 * read when it exists now, even if it did not at start.  An invalid file
 * changes nothing.  Returns 0 (a file was read), 1 when no file was read
 * (--config "", or no --config and the default file does not exist and was
 * never read: nothing changes), or a negative code (logged, and described in
 * msg when msg is not NULL).
 */
int dspkd_config_reload(struct dspkd *d, char *msg, size_t msglen);

/* The check a reload makes of the state file the next start would use,
 * when it is not the running one (dir: its directory is checked too, not
 * one the start makes; daemon/jobstate.c hands its own,
 * dspkd_jobstate_reload_check, once the daemon holds its lock; config.c
 * does not link the state file's code, which a program that reads the
 * configuration alone, the fuzz harness, does without): 0, or -1 with
 * the reason in why (the reload then keeps the running configuration). */
typedef int dspkd_job_state_check(const struct dspkd *d, const char *path, bool dir,
                                  char *why, size_t len);
void dspkd_config_job_state_check(dspkd_job_state_check *check);

/* Logs whether RLIMIT_NOFILE can hold max_clients connections with their
 * pending descriptors, the lingering ones and the daemon's own reserve (at
 * info, "file descriptors: RLIMIT_NOFILE N (soft limit was was; ...)"), or
 * a warning that it cannot (docs/admin.md, "File descriptors").  At the
 * start (after the soft limit is raised) and at each reload that changes
 * max_clients. */
void dspkd_config_check_nofile(const struct dspkd_config *cfg, unsigned long long was);

/* The memory mappings of clients' buffers (docs/admin.md, "Memory
 * mappings"): of max_map_count (vm.max_map_count), a reserve stays the
 * daemon's own (its libraries, threads, heap, read buffers, the device
 * pools): a quarter of it, at least DSPKD_MAPS_RESERVE_MIN but at most half.
 * Writes the rest, what all users' buffers together may map (*clients), and
 * the default of max_user_maps, a quarter of that, at least 1 (*user). */
#define DSPKD_MAPS_RESERVE_MIN 16384
#define DSPKD_MAX_MAP_COUNT_DEFAULT 65530 /* the kernel's default, when unreadable */
void dspkd_maps_budget(uint64_t max_map_count, uint64_t *clients, uint64_t *user);
/* vm.max_map_count (/proc/sys/vm/max_map_count), or
 * DSPKD_MAX_MAP_COUNT_DEFAULT when it cannot be read. */
uint64_t dspkd_max_map_count(void);

/* 1 when a peer with these credentials may connect: the allow lists are
 * empty, or it is root or the daemon's own user, or it is listed (its uid,
 * its primary group or one of its supplementary groups). */
int dspkd_policy_may_connect(const struct dspkd_config *cfg, uid_t uid, gid_t gid,
                             const gid_t *groups, size_t ngroups);
/* 1 when a peer with these credentials is an admin of the daemon: root,
 * the daemon's own user, or listed in admin_users/admin_groups (its uid, its
 * primary group or one of its supplementary groups).  The lists add admins;
 * they never take root's or the daemon's own user's rights away.  The one
 * rule behind every privilege check (daemon/admin.h, dspkd_admin_is): the
 * admin methods, cache.clear, and what status, trace and metrics show. */
int dspkd_policy_is_admin(const struct dspkd_config *cfg, uid_t uid, gid_t gid,
                          const gid_t *groups, size_t ngroups);

#endif /* DSPKD_CONFIG_H */
