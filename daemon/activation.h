/*
 * Socket activation for dspkd: when systemd (dspkd.socket) or
 * systemd-socket-activate passed a listening socket (sd_listen_fds(3)), the
 * daemon serves on it instead of binding its own, and leaves its file alone
 * at the stop (systemd owns it).  libsystemd's sd-daemon API is used when
 * the build found it, a built-in reading of $LISTEN_PID/$LISTEN_FDS
 * otherwise.  Loop thread, at start.
 */
#ifndef DSPKD_ACTIVATION_H
#define DSPKD_ACTIVATION_H

#include "daemon/dspkd.h"

/*
 * Before the devices open: looks for a socket passed by systemd.  Returns 1
 * when one was (d->activation_fd set, d->cfg.socket_path from its address),
 * 0 when nothing was passed, or a negative code (logged) when what was
 * passed is not exactly one listening AF_UNIX SOCK_STREAM socket.  Clears
 * the LISTEN_* variables so nothing the daemon starts inherits them.
 */
int dspkd_activation_start(struct dspkd *d);

/*
 * After the devices opened: listens on the activated socket, else binds
 * d->cfg.socket_path (both through dspkd_listen()).  0 or a negative code
 * (logged).  Honours DSPKD_TEST_EXIT=startup-fail (daemon/teardown.h).
 */
int dspkd_socket_open(struct dspkd *d);

#endif /* DSPKD_ACTIVATION_H */
