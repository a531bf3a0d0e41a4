/*
 * Whole-message reads and writes on the socket between a GPU backend and
 * its kernel worker process (worker.h), shared by both sides.
 */
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/gpurt/worker.h"

/* Reads (out == 0) or sends all n bytes at c, again after EINTR: 0, or -1
 * on an error or end of file. */
static int whole(int fd, char *c, size_t n, int out) {
  while (n > 0) {
    ssize_t r = out ? send(fd, c, n, MSG_NOSIGNAL) : read(fd, c, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

int dspk__worker_read(int fd, void *p, size_t n) { return whole(fd, p, n, 0); }

/* whole() only reads the bytes it sends. */
int dspk__worker_write(int fd, const void *p, size_t n) {
  return whole(fd, (char *)p, n, 1);
}
