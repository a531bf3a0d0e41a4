/*
 * systemd's notification protocol (sd_notify(3)) for dspkd: READY=1 once the
 * devices are open and the socket listens, STATUS= lines that follow the
 * number of devices, clients and tasks (sent when they change, at most four
 * times a second), STOPPING=1 with EXTEND_TIMEOUT_USEC= during the stop, and
 * WATCHDOG=1 from a loop timer when the service has WatchdogSec= (so a
 * wedged loop stops the pings and systemd restarts the daemon).
 *
 * libsystemd's sd-daemon API is used when the build found it
 * (DSPKD_HAVE_SYSTEMD); otherwise a small built-in sender speaks the same
 * datagram protocol to $NOTIFY_SOCKET.  Without $NOTIFY_SOCKET everything
 * here does nothing.  Loop thread only.
 */
#ifndef DSPKD_NOTIFY_H
#define DSPKD_NOTIFY_H

#include <stdint.h>

#include "daemon/dspkd.h"

/* Sends one notification message (e.g. "READY=1").  Returns 1 when sent,
 * 0 when there is no $NOTIFY_SOCKET, or a negative code. */
int dspkd_notify_send(const char *msg);

/* Starts the status watcher and the watchdog timer (neither keeps the loop
 * alive).  0 or a negative code (logged). */
int dspkd_notify_start(struct dspkd *d);
/* READY=1 with the first STATUS= line. */
void dspkd_notify_ready(struct dspkd *d);
/* STOPPING=1, and EXTEND_TIMEOUT_USEC= covering the grace period plus the
 * teardown of the devices. */
void dspkd_notify_stopping(struct dspkd *d);
/* The end of a reload (SIGHUP or daemon.reload): READY=1 with a STATUS=
 * line that says what holds now: the failure when the new file was
 * refused, else the current devices, clients and tasks (so a later good
 * reload replaces what an earlier refused one said). */
void dspkd_notify_reloaded(struct dspkd *d, bool ok);
/* EXTEND_TIMEOUT_USEC=usec (more time for the stop). */
void dspkd_notify_extend(uint64_t usec);
/* Closes what dspkd_notify_start() opened; run the loop once more after. */
void dspkd_notify_close(struct dspkd *d);

#endif /* DSPKD_NOTIFY_H */
