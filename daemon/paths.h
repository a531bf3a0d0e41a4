/*
 * The daemon's own files as it runs on them (dspk.conf(5), "FILES"): the
 * socket, the cache and the Slurm jobs' state file, each the setting's
 * value or, unset, its default.  Decided once at start, before the
 * daemon detaches: a cache that would be made at the socket's or the
 * configuration file's path is refused, and a state file that would
 * overwrite the socket or the
 * cache (or one of SQLite's files beside it), itself, by its temporary
 * file or by its lock file, is refused, and so is a start
 * that has no state file at all.  A reload compares a file's values with
 * these, by the file each names, not by whether the file sets the key.
 * Loop thread only.
 */
#ifndef DSPKD_PATHS_H
#define DSPKD_PATHS_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/dspkd.h"

/* The cache file the daemon opens when the cache key is unset:
 * $CACHE_DIRECTORY/cache.db (systemd's CacheDirectory=, the first of a
 * colon list), else NULL (the cache library's own default).  The returned
 * string is static. */
const char *dspkd_paths_cache_dir_file(void);

/*
 * After the socket's path is known (cfg->socket_path; activated: 1 when it
 * came by socket activation) and, detached, made absolute: decides the
 * cache's and the state file's paths, stores the state file's in
 * cfg->job_state, and checks them.  0, or -1 after logging one line (exit
 * 2): the cache, or one of its -wal, -shm and -journal, is the socket or
 * the configuration file; no state file can be named (the socket has no
 * path, and neither job_state nor $RUNTIME_DIRECTORY names one), or it is
 * the socket, the
 * configuration file (dspkd_config_file), the cache, one of the cache's
 * -wal, -shm and -journal, or its temporary file (PATH.tmp) or its lock
 * file (PATH.lock) is one of those, or its name ends in ".lock" or ".tmp"
 * (another state file's lock or temporary file).  An empty cfg->socket_path (dspkd
 * --end-job with job_state set: no socket needed) is checked as the
 * default socket, when one can be told.
 */
int dspkd_paths_start(struct dspkd_config *cfg, int activated);

/*
 * At a reload, for the keys socket, cache, no_cache and job_state: 1 when
 * the value the file nw gives (its default when unset) names another file
 * than the one the daemon runs on, 0 when the same, -1 for any other key.
 * cache and no_cache choose one file together: when it changed, 1 for the
 * one of the two whose value is not was's (the start's file values: for
 * cache, the file it names alone, "" and ":memory:" none), for each when
 * both are not, and for cache when neither is.
 * socket_fixed: the command line set the socket (the file's is not used).
 */
int dspkd_paths_reload_differs(const char *key, const struct dspkd_config *was,
                               const struct dspkd_config *nw, bool socket_fixed);

/*
 * At a reload, before anything of the file nw is applied: the checks
 * dspkd_paths_start makes of the state file nw would give the next start
 * (its job_state, else the default of the socket it gives) against the
 * socket, the configuration file and the cache nw gives.  A key the command
 * line set (socket_fixed; job_state_fixed; cache_fixed: cache or no_cache)
 * is the running one, not the file's.  0, or -1 with the line the start
 * would log in why (the reload then keeps the running configuration).
 */
int dspkd_paths_reload_check(const struct dspkd_config *nw, bool socket_fixed,
                             bool job_state_fixed, bool cache_fixed, char *why, size_t len);

/* At a reload: the state file the file nw gives the next start (its
 * job_state, else the default of the socket it gives; socket_fixed: the
 * command line's socket), absolute, in jobs.  0; 1 when it is the default
 * socket's default state file, whose directory the start makes; -1 when
 * none can be told. */
int dspkd_paths_reload_job_state(const struct dspkd_config *nw, bool socket_fixed,
                                 char *jobs, size_t len);

/* 1 when a and b name the same file: the same inode where both exist,
 * else the same path once their directories are resolved. */
bool dspkd_paths_same(const char *a, const char *b);

#endif /* DSPKD_PATHS_H */
