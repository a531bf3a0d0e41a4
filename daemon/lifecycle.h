/*
 * dspkd's signals and the handles of its lifecycle that live beside the
 * normal loop (daemon/lifecycle.c):
 *   SIGTERM, SIGINT  the first starts the orderly stop (daemon/conn.c), the
 *                    second makes it fast: running tasks are canceled now,
 *                    the stop still goes in order;
 *   SIGHUP           reloads the configuration file (daemon/config.h);
 *   SIGPIPE          ignored (main).
 * The watchers are installed before the devices open, so a signal during
 * the start is acted on once the loop runs instead of killing the process
 * with devices open, and they stay until the loop has ended, after which
 * these signals are blocked: a late SIGTERM never cuts the teardown short.
 */
#ifndef DSPKD_LIFECYCLE_H
#define DSPKD_LIFECYCLE_H

#include "daemon/dspkd.h"

/* Installs the signal watchers (they do not keep the loop alive).  0 or a
 * negative code (logged). */
int dspkd_lifecycle_start(struct dspkd *d);
/* After the devices opened and the socket listens: notifies systemd
 * (READY=1, STATUS=, watchdog). */
void dspkd_lifecycle_ready(struct dspkd *d);
/* Blocks SIGTERM/SIGINT/SIGHUP, closes the watchers and the notify
 * handles, and runs the loop until they are closed.  Idempotent. */
void dspkd_lifecycle_close(struct dspkd *d);

#endif /* DSPKD_LIFECYCLE_H */
