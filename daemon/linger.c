/*
 * A connection closed after a `protocol.error` (a refusal at accept:
 * max_clients, max_user_clients, allow_users and allow_groups; or a frame
 * that broke the protocol or a limit) lingers so that the client reads the
 * notice.  Closed at once, the notice was mostly lost: the client's write
 * (its hello, sent right after connecting) failed with EPIPE before it read
 * anything, and on Linux closing an AF_UNIX socket whose receive queue still
 * holds bytes makes the peer's read fail with ECONNRESET.
 *
 * So the socket is kept open apart from the connection (a duplicate of its
 * descriptor; the connection itself closes as any other, with its jobs,
 * buffers and counts): its sending side is shut, so the client reads the
 * notice and then the end of stream, and what the client still sends is read
 * and dropped until the client's end of stream (it closes once it read the
 * notice), DSPKD_LINGER_BYTES, or DSPKD_LINGER_MS on a loop timer, whichever
 * comes first.  At most DSPKD_LINGER_MAX sockets linger at once, so a flood
 * of refused connects holds no more descriptors than that; beyond, the
 * socket closes at once (the client libraries still look for the notice
 * among the bytes queued to them when their write fails).  Lingering costs
 * the loop one read callback per chunk, nothing that waits.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/linger.h"

struct lingerer {
  uv_pipe_t pipe;
  uv_timer_t timer;
  size_t bytes;     /* read and dropped so far */
  int open;         /* handles not yet closed */
  bool ending;
  struct lingerer *prev, *next;
};

static struct lingerer *lingering;
static size_t nlinger;
static bool stopped;
static char sink[64 << 10]; /* what the clients send lands here, and is dropped */

static void on_closed(uv_handle_t *h) {
  struct lingerer *l = h->data;
  if (--l->open == 0)
    free(l);
}

static void linger_end(struct lingerer *l) {
  if (l->ending)
    return;
  l->ending = true;
  if (l->prev)
    l->prev->next = l->next;
  else
    lingering = l->next;
  if (l->next)
    l->next->prev = l->prev;
  nlinger--;
  uv_close((uv_handle_t *)&l->pipe, on_closed);
  uv_close((uv_handle_t *)&l->timer, on_closed);
}

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
  (void)h;
  (void)want;
  buf->base = sink;
  buf->len = sizeof sink;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  struct lingerer *l = s->data;
  (void)buf;
  if (n < 0 || (l->bytes += (size_t)n) >= DSPKD_LINGER_BYTES)
    linger_end(l); /* the client's end of stream (or an error), or enough */
}

static void on_timer(uv_timer_t *t) { linger_end(t->data); }

void dspkd_linger(uv_loop_t *loop, int fd) {
  struct lingerer *l;
  int dfd;

  if (stopped || nlinger >= DSPKD_LINGER_MAX)
    return;
  if (!(l = calloc(1, sizeof(*l))))
    return;
  if ((dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
    free(l);
    return;
  }
  (void)shutdown(dfd, SHUT_WR); /* the notice is the last the client gets */
  uv_pipe_init(loop, &l->pipe, 0);
  uv_timer_init(loop, &l->timer);
  l->pipe.data = l->timer.data = l;
  l->open = 2;
  l->next = lingering;
  if (lingering)
    lingering->prev = l;
  lingering = l;
  nlinger++;
  if (uv_pipe_open(&l->pipe, dfd) != 0) {
    close(dfd);
    linger_end(l);
    return;
  }
  if (uv_read_start((uv_stream_t *)&l->pipe, on_alloc, on_read) != 0 ||
      uv_timer_start(&l->timer, on_timer, DSPKD_LINGER_MS, 0) != 0)
    linger_end(l);
}

void dspkd_linger_stop(void) {
  stopped = true;
  while (lingering)
    linger_end(lingering);
}
