/*
 * Socket activation (daemon/activation.h).  The checks follow
 * sd_listen_fds(3) and sd_is_socket_unix(3): the variables must name this
 * process, exactly one descriptor must be passed, and it must be a Unix
 * stream socket that already listens.  Anything else is an error at start
 * rather than a daemon that silently binds a second socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef DSPKD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#else
#define SD_LISTEN_FDS_START 3
#endif

#include "daemon/activation.h"
#include "daemon/log.h"
#include "daemon/teardown.h"
#include "proto/sockpath.h"

#ifndef DSPKD_HAVE_SYSTEMD
/* sd_listen_fds(1) without libsystemd: the count of descriptors passed from
 * SD_LISTEN_FDS_START, 0 when none (or meant for another process). */
static int listen_fds_builtin(void) {
  const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
  char *end;
  long p, n;
  int r = 0;

  if (!pid || !fds)
    goto out;
  errno = 0;
  p = strtol(pid, &end, 10);
  if (errno || *end || p != (long)getpid())
    goto out;
  n = strtol(fds, &end, 10);
  if (errno || *end || n < 0 || n > 64) {
    r = -EINVAL;
    goto out;
  }
  for (long i = 0; i < n; i++)
    if (fcntl(SD_LISTEN_FDS_START + (int)i, F_SETFD, FD_CLOEXEC) < 0) {
      r = -errno;
      goto out;
    }
  r = (int)n;
out:
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return r;
}

/* sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0): 1, 0 or -errno. */
static int is_unix_stream_listening(int fd) {
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  int type = 0, acc = 0;
  socklen_t l = sizeof type;

  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
    return -errno;
  l = sizeof acc;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) < 0)
    return -errno;
  memset(&sa, 0, sizeof sa);
  if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
    return -errno;
  return sa.sun_family == AF_UNIX && type == SOCK_STREAM && acc;
}
#endif

static int activation_fd(void) {
  int n, r;

#ifdef DSPKD_HAVE_SYSTEMD
  n = sd_listen_fds(1);
#else
  n = listen_fds_builtin();
#endif
  if (n == 0)
    return 0;
  if (n < 0) {
    dspkd_error("socket activation: cannot use the passed sockets: %s", strerror(-n));
    return DSPK_EINVAL;
  }
  if (n != 1) {
    dspkd_error("socket activation: %d sockets passed; dspkd takes exactly one "
                "(one ListenStream= in dspkd.socket)", n);
    return DSPK_EINVAL;
  }
#ifdef DSPKD_HAVE_SYSTEMD
  r = sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0);
#else
  r = is_unix_stream_listening(SD_LISTEN_FDS_START);
#endif
  if (r <= 0) {
    dspkd_error("socket activation: the passed descriptor is not a listening Unix "
                "stream socket%s%s", r < 0 ? ": " : "", r < 0 ? strerror(-r) : "");
    return DSPK_EINVAL;
  }
  return SD_LISTEN_FDS_START;
}

int dspkd_activation_start(struct dspkd *d) {
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  int fd = activation_fd();

  if (fd <= 0)
    return fd;
  d->activation_fd = fd;
  char shown[4 * sizeof sa.sun_path + 8];
  memset(&sa, 0, sizeof sa);
  /* Its address as clients name it (proto/sockpath.h): the path, or
   * "@name" for an abstract socket (ListenStream=@name); the log, status
   * and the checks of the state file's default see this text. */
  size_t sl = 0;
  if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
      dspk__sockaddr_show(shown, sizeof shown, &sa, len)[0] &&
      (sl = strlen(shown)) < sizeof d->cfg.socket_path)
    memcpy(d->cfg.socket_path, shown, sl + 1); /* (snprintf: -Wformat-truncation at -O1) */
  else
    snprintf(d->cfg.socket_path, sizeof d->cfg.socket_path, "(activated socket, fd %d)", fd);
  return 1;
}

int dspkd_socket_open(struct dspkd *d) {
#ifdef DSPK_TEST_HOOKS
  if (dspkd_test_exit_is("startup-fail")) {
    dspkd_error("test: failing the start after the devices opened "
                "(DSPKD_TEST_EXIT=startup-fail)");
    return DSPK_EINTERNAL;
  }
#endif
  return dspkd_listen(d);
}
