/*
 * Whole-message reads and writes on the socket between a GPU backend and
 * its kernel worker process (worker.h), shared by both sides.
 */
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/gpurt/worker.h"

int dspk__worker_read(int fd, void *p, size_t n) {
  char *c = p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

int dspk__worker_write(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t r = send(fd, c, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}
