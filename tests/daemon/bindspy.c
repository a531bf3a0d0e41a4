/*
 * LD_PRELOAD shim for dspkd_test.py's "sockmode" group: after every bind(),
 * chmod() and fchmodat() the daemon makes, it records the mode the socket
 * file ($DSPK_BINDSPY_PATH) has at that moment in $DSPK_BINDSPY_LOG ("bind
 * 660"), so the test sees whether the socket ever existed with a mode other
 * than its final one.  Test-only; never installed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void record(const char *ev) {
  const char *log = getenv("DSPK_BINDSPY_LOG"), *path = getenv("DSPK_BINDSPY_PATH");
  struct stat st;
  char line[64];
  int n, fd;
  if (!log || !path || lstat(path, &st) != 0)
    return;
  n = snprintf(line, sizeof line, "%s %o\n", ev, (unsigned)(st.st_mode & 07777));
  fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    if (write(fd, line, (size_t)n) != n)
      n = 0;
    close(fd);
  }
}

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr *a, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t);
  int r, e;
  if (!real)
    *(void **)&real = dlsym(RTLD_NEXT, "bind");
  r = real(fd, a, len);
  e = errno;
  if (r == 0 && a && a->sa_family == AF_UNIX)
    record("bind");
  errno = e;
  return r;
}

__attribute__((visibility("default"))) int chmod(const char *path, mode_t mode) {
  static int (*real)(const char *, mode_t);
  int r, e;
  if (!real)
    *(void **)&real = dlsym(RTLD_NEXT, "chmod");
  r = real(path, mode);
  e = errno;
  record("chmod");
  errno = e;
  return r;
}

__attribute__((visibility("default"))) int fchmodat(int dirfd, const char *path, mode_t mode, int flags) {
  static int (*real)(int, const char *, mode_t, int);
  int r, e;
  if (!real)
    *(void **)&real = dlsym(RTLD_NEXT, "fchmodat");
  r = real(dirfd, path, mode, flags);
  e = errno;
  record("fchmodat");
  errno = e;
  return r;
}
