/*
 * dspkd's signals and the handles of its lifecycle that live beside the
 * normal loop (daemon/lifecycle.c):
 *   SIGTERM, SIGINT  the first starts the orderly stop (daemon/conn.c), the
 *                    second makes it fast: running tasks are canceled now,
 *                    the stop still goes in order;
 *   SIGHUP           reloads the configuration file (daemon/config.h);
 *   SIGPIPE and the  ignored (main's ignore_signals: every asynchronous
 *   others           signal whose default action would end or stop the
 *                    process, as dspkd(8) SIGNALS lists them).
 * The watchers are installed before the devices open, so a signal during
 * the start is acted on once the loop runs instead of killing the process
 * with devices open, and they stay until the loop has ended, after which
 * these signals are blocked: a late SIGTERM never cuts the teardown short.
 */
#ifndef DSPKD_LIFECYCLE_H
#define DSPKD_LIFECYCLE_H

#include "daemon/dspkd.h"

/* First thing in main: SIGTERM/SIGINT/SIGHUP get a handler that only
 * records them (whichever thread takes them), so none ends the process by
 * its default action before the watchers exist. */
void dspkd_lifecycle_early(void);
/* How many such signals were recorded and not yet handed over (the test
 * hook DSPKD_TEST_START_PAUSE waits on it). */
int dspkd_lifecycle_early_seen(void);

/* Installs the signal watchers (they do not keep the loop alive), then
 * raises again each signal recorded since dspkd_lifecycle_early, for them
 * to act on once the loop runs.  0 or a negative code (logged). */
int dspkd_lifecycle_start(struct dspkd *d);
/* After the devices opened and the socket listens: notifies systemd
 * (READY=1, STATUS=, watchdog). */
void dspkd_lifecycle_ready(struct dspkd *d);
/* Reads the configuration file again (SIGHUP, daemon.reload) between
 * RELOADING=1 and READY=1 with a STATUS= saying what holds now
 * (daemon/notify.h).  dspkd_config_reload's answer: 0 (a file was read),
 * 1 (no file to read) or a negative code (why in msg when given). */
int dspkd_reload(struct dspkd *d, char *msg, size_t msglen);
/* Blocks SIGTERM/SIGINT/SIGHUP, closes the watchers and the notify
 * handles, and runs the loop until they are closed.  Idempotent. */
void dspkd_lifecycle_close(struct dspkd *d);

#ifdef DSPK_TEST_HOOKS
/* daemon/testhooks.c: logs one warning per test-hook variable set in the
 * environment ("test build: NAME=VALUE is set: a test hook, obeyed by this
 * build only"), so that a test build run as a service is noticed (dspkd(8),
 * ENVIRONMENT).  The names are testhooks.c's HOOK_NAMES. */
void dspkd_test_warn_hooks(void);
/* daemon/testhooks.c: when $DSPKD_TEST_START_PAUSE names this point of the
 * start ("early": before the configuration is read; "config": after it,
 * before the watchers), starts a thread that does not block the stop and
 * reload signals (as a library's may), logs "test: start paused at POINT",
 * and waits (up to 30 s) until such a signal was recorded. */
void dspkd_test_start_pause(const char *point);
/* daemon/testhooks.c: when $DSPKD_TEST_PEER_STOP is the name
 * (/proc/PID/comm) of the process pid that just connected, stops the
 * daemon (SIGSTOP to itself) after the connection's peer pidfd was taken
 * and before its cgroup is read, so that a test can make that pid another
 * process's meanwhile (tests/cluster jobs_test.py, a reused pid). */
void dspkd_test_peer_pause(pid_t pid);
#else
#define dspkd_test_start_pause(point) ((void)0)
#define dspkd_test_peer_pause(pid) ((void)0)
#define dspkd_test_warn_hooks() ((void)0)
#endif

#endif /* DSPKD_LIFECYCLE_H */
