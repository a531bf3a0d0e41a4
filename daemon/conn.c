/*
 * Client connections on the loop thread: the listening socket, accepting
 * (with the peer's SO_PEERCRED), reading into a per-connection buffer,
 * validating each frame with dspk__frame_scan() before msgpack-c decodes it
 * in place, dispatching requests, writing responses, backpressure, and the
 * connections' part of the stop (the sequence is daemon/lifecycle.c's).
 *
 * A connection lives until its socket is closed and its last in-flight job
 * and write are done (a refcount on the loop thread).  A connection with
 * too many requests in flight or too many response bytes not yet written
 * (or reserved) is paused: none of its requests is taken in until it
 * drains, so one client cannot make the daemon buffer without bound.  A
 * paused connection is still read into the read buffer it has, while it
 * keeps no descriptor a buffer.import has not claimed, so that its end of
 * stream and its task.cancel requests are seen ("reading while paused"),
 * and one not read at all is polled for its client's hangup while it has
 * requests in flight.  A frame that breaks the protocol or a
 * limit gets a `protocol.error` notification and that connection alone is
 * closed.
 *
 * buffer.write in place: when the head of a buffer.write (up to its data)
 * is in the read buffer and its data is not, and the buffer is cpu memory
 * that nothing else uses now (dspkd_land_begin), the rest of the data is
 * read from the socket straight into the buffer instead of the read buffer
 * (which the runner would copy it from: a third copy of every byte, after
 * the client's into the socket and the kernel's out of it).  The head went
 * through the frame scanner as any frame does; the data is a bin, opaque
 * bytes that end the frame.  A job then answers it in its turn.
 *
 * A buffer.write refused before its data came: when such a head (the data
 * last, 64 KiB or more, any other entries) is not received in place and
 * its request would be refused anyway (its arguments, its buffer, its
 * range: what the head tells), its data is read and dropped as it comes and
 * the request is then answered its error, as a whole frame of it would be,
 * instead of needing a read buffer for data that no one will use (which
 * max_user_partial may not allow: probe 19 A1).
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/admin.h"
#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/linger.h"
#include "daemon/log.h"
#include "daemon/notify.h"

#define RCHUNK_MIN ((size_t)64 << 10)   /* first read buffer of a connection */
#define RCHUNK_KEEP DSPKD_RCHUNK_KEEP  /* an idle buffer above this shrinks */
#define READ_MIN ((size_t)16 << 10)     /* least free space offered to read() */
#define LAND_MIN ((size_t)64 << 10)     /* buffer.write data received in place */
#define LAND_READ_MAX ((size_t)1 << 30) /* at most this much per read() */
#define SOCK_SNDBUF (1 << 20)           /* SO_SNDBUF asked for on each connection */

/* ---- outgoing frames -------------------------------------------------- */

struct wreq *dspkd_wreq_new(void) {
  /* Zero all but the wbuf, whose init sets what it needs (its inline bytes
   * need no clearing). */
  struct wreq *wr = malloc(sizeof(*wr));
  if (wr) {
    memset(wr, 0, offsetof(struct wreq, w));
    wr->fd = -1;
    dspk__wbuf_init(&wr->w);
  }
  return wr;
}

static void free_handle(uv_handle_t *h) { free(h); }

void dspkd_wreq_free(struct wreq *wr) {
  if (!wr)
    return;
  if (wr->fd >= 0)
    close(wr->fd);
  if (wr->fd_pipe) /* loop thread only: dspkd_conn_send made it */
    uv_close((uv_handle_t *)wr->fd_pipe, free_handle);
  if (wr->share_conn) /* loop thread only: set as it was sent */
    dspkd_shm_share_count(wr->share_conn, -1);
  dspk__wbuf_free(&wr->w); /* also the iovecs wr->bufs points at */
  free(wr);
}

/* An answer with a descriptor leaves c->fd_writes (its write is done). */
static void fd_unlink(struct conn *c, struct wreq *wr) {
  if (wr->fd_prev)
    wr->fd_prev->fd_next = wr->fd_next;
  else
    c->fd_writes = wr->fd_next;
  if (wr->fd_next)
    wr->fd_next->fd_prev = wr->fd_prev;
  wr->fd_prev = wr->fd_next = NULL;
}

static void on_write(uv_write_t *req, int status) {
  struct wreq *wr = (struct wreq *)req;
  struct conn *c = wr->c;

  c->unsent -= wr->cost;
  dspkd_user_answers(c, -(int64_t)wr->cost);
  if (status >= 0)
    c->d->obs.bytes_out += wr->len;
  if (wr->fd_pipe) {
    fd_unlink(c, wr);
    /* libuv clears send_handle once a sendmsg took the descriptor (with
     * the answer's first bytes): it counts until the client reads it. */
    if (req->send_handle == NULL && wr->share_conn == c) {
      wr->share_conn = NULL;
      dspkd_shm_fd_written(c);
    } else if (status < 0 && !c->closing && status != UV_ECANCELED && status != UV_EPIPE &&
               status != UV_ECONNRESET) {
      /* Nothing of it was written (the descriptor goes with the first
       * byte), so the stream is whole: its request is answered an error
       * instead (ETOOMANYREFS: the daemon's user has too many descriptors
       * in flight), and the connection goes on. */
      dspkd_shm_answer_failed(c, wr, status);
      dspkd_conn_update_read(c);
      dspkd_conn_unref(c);
      return;
    }
  }
  dspkd_wreq_free(wr);
  if (status < 0 && !c->closing) {
    dspkd_debug("client %llu: write failed: %s", (unsigned long long)c->id,
                uv_strerror(status));
    dspkd_conn_close(c, "write failed");
  } else if (c->close_after_flush && c->unsent == 0) {
    dspkd_conn_close(c, "daemon stopping");
  } else {
    dspkd_conn_update_read(c);
  }
  dspkd_conn_unref(c);
}

/* libuv's unix uv_buf_t is laid out as a struct iovec (so it can hand its
 * buffers to writev directly): the wbuf's iovecs serve as the buffers, with
 * no array of their own to allocate. */
_Static_assert(sizeof(uv_buf_t) == sizeof(struct iovec) &&
                   offsetof(uv_buf_t, base) == offsetof(struct iovec, iov_base) &&
                   offsetof(uv_buf_t, len) == offsetof(struct iovec, iov_len),
               "uv_buf_t is not laid out as struct iovec");

/* Cuts the frame into libuv buffers (wr->bufs, which alias the iovecs that
 * wr->w owns).  0 or a negative code. */
static int wreq_bufs(struct wreq *wr, size_t *nbufs) {
  struct iovec *iov;
  size_t n;
  int err = dspk__wbuf_iov(&wr->w, &iov, &n);
  if (err < 0)
    return err;
  wr->bufs = (uv_buf_t *)(void *)iov;
  wr->len = 0;
  for (size_t i = 0; i < n; i++)
    wr->len += iov[i].iov_len;
  *nbufs = n;
  return 0;
}

/* What wr holds while it is queued (wr->cost), nbufs the buffers libuv
 * is given: counted, not its bytes alone, so that many small answers are
 * bounded by max_unsent and max_user_unsent as one large one is (a queued
 * ping answer of 10 bytes holds about 800). */
static size_t wreq_cost(const struct wreq *wr, size_t nbufs) {
  size_t n = DSPKD_WREQ_COST + dspk__wbuf_held(&wr->w);
  if (nbufs > sizeof wr->req.bufsml / sizeof wr->req.bufsml[0]) /* libuv copies them */
    n += nbufs * sizeof(uv_buf_t) + DSPK__ALLOC_OVERHEAD;
  if (wr->fd_pipe)
    n += sizeof(*wr->fd_pipe) + DSPK__ALLOC_OVERHEAD;
  return n;
}

/* Drops the first `done` bytes (already written) from wr's buffers. */
static void wreq_skip(struct wreq *wr, size_t *nbufs, size_t done) {
  size_t i = 0;
  wr->len -= done;
  while (i < *nbufs && done >= wr->bufs[i].len)
    done -= wr->bufs[i++].len;
  if (i < *nbufs) {
    wr->bufs[i].base += done;
    wr->bufs[i].len -= done;
  }
  memmove(wr->bufs, wr->bufs + i, (*nbufs - i) * sizeof(uv_buf_t));
  *nbufs -= i;
}

void dspkd_conn_send(struct conn *c, struct wreq *wr) {
  size_t n;
  int err;

  if (!wr)
    return;
  if (c->closing) {
    dspkd_wreq_free(wr);
    return;
  }
  err = wreq_bufs(wr, &n);
  if (err < 0) {
    dspkd_error("client %llu: cannot encode a response: %s",
                (unsigned long long)c->id, dspk__strerror(err));
    dspkd_wreq_free(wr);
    dspkd_conn_close(c, "response encoding failed");
    return;
  }
  wr->c = c;
  if (wr->fd >= 0) {
    /* A memfd for the client (buffer.share): libuv sends it with the
     * frame's first byte, through a handle that owns it from here on.  It
     * counts until the client reads it (daemon/shm.c); an answer that
     * cannot carry it is an error answer instead. */
    if (!wr->share_conn) {
      dspkd_shm_share_count(c, +1);
      wr->share_conn = c;
    }
    if (!(wr->fd_pipe = malloc(sizeof(*wr->fd_pipe)))) {
      dspkd_shm_answer_failed(c, wr, UV_ENOMEM);
      return;
    }
    uv_pipe_init(c->d->loop, wr->fd_pipe, 0);
    if ((err = uv_pipe_open(wr->fd_pipe, wr->fd)) == 0) {
      wr->fd = -1;
      err = uv_write2(&wr->req, (uv_stream_t *)&c->pipe, wr->bufs, (unsigned)n,
                      (uv_stream_t *)wr->fd_pipe, on_write);
    }
    if (err != 0) {
      dspkd_shm_answer_failed(c, wr, err);
      return;
    }
    wr->fd_next = c->fd_writes;
    if (c->fd_writes)
      c->fd_writes->fd_prev = wr;
    c->fd_writes = wr;
    goto queued;
  }
  /* Nothing queued before it: write what the socket takes now.  A small
   * answer (ping, errors) usually goes whole, which spares uv_write's
   * completion round through the loop and an epoll_ctl per answer. */
  if (c->unsent == 0) {
    int w = uv_try_write((uv_stream_t *)&c->pipe, wr->bufs, (unsigned)n);
    if (w > 0)
      c->d->obs.bytes_out += (size_t)w;
    if (w >= 0 && (size_t)w == wr->len) {
      dspkd_wreq_free(wr);
      return;
    }
    if (w < 0 && w != UV_EAGAIN) {
      dspkd_wreq_free(wr);
      dspkd_conn_close(c, "write failed");
      return;
    }
    if (w > 0)
      wreq_skip(wr, &n, (size_t)w);
  }
  err = uv_write(&wr->req, (uv_stream_t *)&c->pipe, wr->bufs, (unsigned)n,
                 on_write);
queued:
  if (err < 0) {
    dspkd_wreq_free(wr);
    dspkd_conn_close(c, "write failed");
    return;
  }
  wr->cost = wreq_cost(wr, n);
  c->unsent += wr->cost;
  dspkd_user_answers(c, (int64_t)wr->cost);
  dspkd_conn_ref(c);
  dspkd_conn_update_read(c);
}

void dspkd_conn_send_error(struct conn *c, uint32_t msgid, int code, const char *msg) {
  struct wreq *wr;
  if (c->closing)
    return;
  wr = dspkd_wreq_new();
  if (!wr) {
    dspkd_conn_close(c, "out of memory");
    return;
  }
  dspk__pack_error_response(&wr->w.pk, msgid, code,
                            msg && *msg ? msg : dspk__strerror(code));
  dspkd_conn_send(c, wr);
}

/* Sends [2, "protocol.error", [error]], then closes the connection: the
 * client broke the protocol (or is refused, or its job ended), so nothing
 * more is owed to it.  With nothing queued the notice goes now, as far as
 * the socket takes it; behind queued answers it waits for them, for at
 * most NOTICE_FLUSH_MS (notice_flush).  A notice written whole lingers
 * (daemon/linger.c): the socket stays open, its sending side shut, until
 * the client has read it. */
static void conn_protocol_error(struct conn *c, int code, const char *msg) {
  struct wreq *wr;
  size_t n;
  uv_os_fd_t fd;

  if (dspkd_log_client_ok((long)c->uid, DSPKD_NOTICE))
    dspkd_notice(DSPKD_PEER_FMT ": %s: %s; closing the connection", DSPKD_PEER_ARGS(c),
                 dspk__err_name(code), msg);
  if (c->closing)
    return;
  wr = dspkd_wreq_new();
  if (wr) {
    dspk__pack_notify_head(&wr->w.pk, "protocol.error");
    dspk__pack_error(&wr->w.pk, code, msg);
    if (c->unsent > 0) {
      /* Answers wait (in part written): the notice goes after them, so
       * the client's stream holds whole messages (dspkd_conn_close). */
      c->notice = wr;
      wr = NULL;
    } else if (wreq_bufs(wr, &n) == 0 &&
               uv_try_write((uv_stream_t *)&c->pipe, wr->bufs, (unsigned)n) == (int)wr->len &&
               uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0) {
      dspkd_linger(c->d->loop, fd);
    }
    dspkd_wreq_free(wr);
  }
  dspkd_conn_close(c, msg);
}

void dspkd_conn_close_notice(struct conn *c, int code, const char *msg) {
  conn_protocol_error(c, code, msg);
}

/* ---- connection lifetime ---------------------------------------------- */

/* One large read buffer kept after use, for the next large frame of any
 * connection: a buffer above the malloc mmap threshold is a fresh mapping
 * each time (every page faulted in and cleared again), which was most of
 * the cost of a large transfer.  Loop thread only; given back by the idle
 * trim. */
static struct rchunk *spare_chunk;
/* Registered read buffers given up while the daemon stops: freed once the
 * devices are closed (dspkd_conn_handles_close), the registration gone
 * with the device's context. */
static struct rchunk *pinned_left;

void *dspkd_chunk_pin_span(struct rchunk *k, size_t *len) {
  uintptr_t a = ((uintptr_t)k->data + 4095) & ~(uintptr_t)4095;
  uintptr_t e = ((uintptr_t)k->data + k->cap) & ~(uintptr_t)4095;
  *len = e > a ? (size_t)(e - a) : 0;
  return (void *)a;
}

/* Frees a read buffer.  One that a runner registered for DMA goes to that
 * runner (JOB_UNPIN), the only thread that can unregister it, unless the
 * daemon is stopping: runners then may have taken their last job. */
static void chunk_free(struct rchunk *k) {
  struct device *dev;
  struct job *j;
  if (!k)
    return;
  dev = atomic_load(&k->pin_dev);
  if (!dev || !atomic_load(&k->pinned)) {
    free(k);
    return;
  }
  if (!dev->d->stopping && dev->open_state == 1 &&
      (j = dspkd_job_new(NULL, JOB_UNPIN, 0, dev)) != NULL) {
    j->unpin = k;
    dspkd_sched_submit(j);
    return;
  }
  k->next_left = pinned_left;
  pinned_left = k;
}

/* A fresh read buffer of cap bytes (header fields cleared), or NULL. */
static struct rchunk *chunk_new(size_t cap) {
  struct rchunk *k = malloc(sizeof(*k) + cap);
  if (k) {
    atomic_init(&k->pin_dev, NULL);
    atomic_init(&k->pinned, 0);
    k->next_left = NULL;
  }
  return k;
}

static void chunk_release(struct rchunk *k) {
  if (k->cap > RCHUNK_KEEP && (!spare_chunk || spare_chunk->cap < k->cap)) {
    chunk_free(spare_chunk);
    spare_chunk = k;
    return;
  }
  chunk_free(k);
}

void dspkd_chunk_unref(struct rchunk *k) {
  if (k && --k->refs == 0)
    chunk_release(k);
}

/* The idle trim: no client is connected; the spare read buffer, each
 * device's cached memory (a job on its runner) and the heap's free pages
 * go back to the system. */
static void on_trim(uv_timer_t *t) {
  struct dspkd *d = t->data;
  if (d->nconns > 0 || d->stopping)
    return;
  chunk_free(spare_chunk);
  spare_chunk = NULL;
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    struct job *j;
    if (dev->open_state != 1 || !(j = dspkd_job_new(NULL, JOB_TRIM, 0, dev)))
      continue;
    dspkd_sched_submit(j);
  }
  malloc_trim(0);
  dspkd_debug("idle: no clients for %llu ms: cached memory given back",
              (unsigned long long)d->cfg.idle_trim_ms);
}

/* Counts the connection's read buffer (c->rb) in its user's rbytes, after
 * any change of c->rb. */
static void rb_count(struct conn *c) {
  uint64_t cap = c->rb ? c->rb->cap : 0;
  if (c->user) {
    c->user->rbytes -= c->rbytes;
    c->user->rbytes += cap;
  }
  c->rbytes = cap;
}

void dspkd_conn_ref(struct conn *c) { c->refs++; }

/* A connection that writes its answers and notice before its socket
 * closes (notice_flush) leaves its Slurm job once nothing of the job's
 * runs any more, as a connection closed at once does: a job.end waiting
 * for its connections is not held up by a client that does not read.  A
 * buffer still held then is held by an answer not yet written (a
 * buffer.read sent from its memory): it stays the connection's and its
 * user's, no longer the job's (dspkd_quota_job_leave). */
static void notice_job_gone(struct conn *c) {
  if (c->notice_armed && c->notice_timer && c->job && !c->jobs) {
    dspkd_quota_job_leave(c);
    dspkd_job_conn_gone(c);
  }
}

void dspkd_conn_unref(struct conn *c) {
  struct dspkd *d = c->d;
  if (--c->refs > 0) {
    notice_job_gone(c);
    return;
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    d->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  d->nconns--;
  dspkd_debug("client %llu: gone", (unsigned long long)c->id);
  if (d->nconns == 0 && !d->stopping && !uv_is_closing((uv_handle_t *)&d->trim_timer))
    uv_timer_start(&d->trim_timer, on_trim, d->cfg.idle_trim_ms, 0);
  dspkd_chunk_unref(c->rb);
  c->rb = NULL;
  rb_count(c);
  if (c->share_fds) /* none is left once its jobs and writes are gone */
    dspkd_shm_share_count(c, -(int)c->share_fds);
  while (c->held_list) /* none is left once its jobs are gone */
    dspkd_conn_buf_unhold(c->held_list);
  dspkd_user_put(d, c->user);
  dspkd_job_conn_gone(c);
  free(c->bufs);
  dspkd_sched_conn_free(c->q);
  free(c->mem);
  free(c);
  dspkd_stop_progress(d);
}

static void on_conn_close(uv_handle_t *h) { dspkd_conn_unref(h->data); }

/* ---- the notice after waiting answers ----------------------------------
 * A connection closed with a protocol.error while answers wait to be
 * written (c->unsent > 0) keeps its socket for at most NOTICE_FLUSH_MS: its
 * answers already queued are written whole, then the notice, and the socket
 * lingers as after a notice written at once (daemon/linger.c).  Everything
 * else of the connection is gone already (dspkd_conn_close): nothing more
 * is queued, and what the client sends meanwhile is read and dropped.  A
 * client that has not read them by the bound gets the end of the stream
 * where it stopped reading, possibly inside an answer, without the notice
 * (docs/protocol.md, "Notifications from the daemon"). */
#define NOTICE_FLUSH_MS 2000

static void on_notice_timer_closed(uv_handle_t *h) { free(h); }

static void notice_pipe_close(struct conn *c) {
  if (!uv_is_closing((uv_handle_t *)&c->pipe)) {
    dspkd_shm_conn_park(c); /* as dspkd_conn_close does for the others */
    uv_close((uv_handle_t *)&c->pipe, on_conn_close);
  }
  if (c->notice_timer) {
    uv_close((uv_handle_t *)c->notice_timer, on_notice_timer_closed);
    c->notice_timer = NULL;
  }
}

static void on_notice_timer(uv_timer_t *t) {
  struct conn *c = t->data;
  if (!c->notice_armed) {
    c->notice_armed = true;
    notice_job_gone(c);
    uv_timer_start(t, on_notice_timer, NOTICE_FLUSH_MS, 0);
    return;
  }
  dspkd_debug("client %llu: its answers and notice not read within %d ms: closed",
              (unsigned long long)c->id, NOTICE_FLUSH_MS);
  notice_pipe_close(c); /* the notice's write is canceled with it */
}

static void on_notice_written(uv_write_t *req, int status) {
  struct wreq *wr = (struct wreq *)req;
  struct conn *c = wr->c;
  uv_os_fd_t fd;
  dspkd_wreq_free(wr);
  if (status == 0 && !uv_is_closing((uv_handle_t *)&c->pipe) &&
      uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0)
    dspkd_linger(c->d->loop, fd);
  notice_pipe_close(c);
  dspkd_conn_unref(c);
}

static void notice_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
  static char sink[65536]; /* the loop thread's: dropped */
  (void)h;
  (void)want;
  buf->base = sink;
  buf->len = sizeof sink;
}

static void notice_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  if (n < 0) /* the client's end of stream: it may still read */
    uv_read_stop(s);
}

/* Queues c->notice behind the answers that wait.  0, or a negative code
 * when it cannot (the caller closes the socket at once). */
static int notice_flush(struct conn *c) {
  struct wreq *wr = c->notice;
  size_t n;
  int err;
  c->notice = NULL;
  if (!(c->notice_timer = malloc(sizeof(*c->notice_timer)))) {
    dspkd_wreq_free(wr);
    return UV_ENOMEM;
  }
  uv_timer_init(c->d->loop, c->notice_timer);
  c->notice_timer->data = c;
  wr->c = c;
  if ((err = wreq_bufs(wr, &n)) < 0 ||
      (err = uv_write(&wr->req, (uv_stream_t *)&c->pipe, wr->bufs, (unsigned)n,
                      on_notice_written)) < 0) {
    dspkd_wreq_free(wr);
    uv_close((uv_handle_t *)c->notice_timer, on_notice_timer_closed);
    c->notice_timer = NULL;
    return err;
  }
  dspkd_conn_ref(c);
  /* First at once, from the loop (the caller may be walking the job's
   * connections: job.end), to leave the job; then at the bound. */
  uv_timer_start(c->notice_timer, on_notice_timer, 0, 0);
  (void)uv_read_start((uv_stream_t *)&c->pipe, notice_alloc, notice_read);
  return 0;
}

/* What the client sent and the daemon will never read is discarded before
 * the close: a stream socket closed with unread bytes resets its peer
 * (ECONNRESET), and the client would lose the answers it has not read yet
 * (the stop's ESHUTDOWNs, a protocol.error).  At most 16 MiB: a client that
 * is still sending gets its reset. */
static char sink[65536]; /* the loop thread's: bytes read to be dropped */

static void discard_unread(struct conn *c) {
  uv_os_fd_t fd;
  if (uv_fileno((const uv_handle_t *)&c->pipe, &fd) != 0)
    return;
  for (int i = 0; i < 256; i++) {
    ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EINTR))
      break;
  }
}

void dspkd_conn_close(struct conn *c, const char *why) {
  struct dspkd *d = c->d;

  if (c->closing)
    return;
  c->closing = true;
  dspkd_debug("client %llu: closing: %s", (unsigned long long)c->id, why);
  if (c->reading)
    uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = false;
  discard_unread(c);
  /* Queued jobs are dropped unanswered, running ones asked to stop; each
   * still holds a reference and frees its resources when it comes back. */
  dspkd_sched_drop(d, c, 0);
  dspkd_trace_conn_closed(c); /* its traces stop recording */
  dspkd_shm_conn_closed(c);   /* fds no buffer.import claimed */
  if (c->land.j) {            /* a buffer.write cut off in its data */
    dspkd_job_free(d, c->land.j);
    c->land.j = NULL;
  }
  c->land.discard = false;     /* a refused one: its answer is not owed */
  free(c->land.msg);
  c->land.msg = NULL;
  dspkd_sched_cancel_all(d, c);
  /* Its answers' descriptors the client has not read (a notice written
   * after the answers parks them once they are written: the park shuts
   * the socket's sending side). */
  if (!c->notice)
    dspkd_shm_conn_park(c);
  /* The table's references go; a buffer a job still holds stays allocated
   * until that job lets go: kept in the held list so that status, metrics
   * and the quotas count it until then (dspkd_dbuf_unref takes it out). */
  size_t nb = c->nbufs;
  c->nbufs = 0;
  c->buf_bytes = 0;
  for (size_t i = 0; i < nb; i++) {
    struct dbuf *b = c->bufs[i];
    dspkd_conn_buf_hold(c, b);
    dspkd_dbuf_unref(d, b);
  }
  if (c->notice) {
    if (notice_flush(c) == 0)
      return;
    dspkd_shm_conn_park(c);
  }
  uv_close((uv_handle_t *)&c->pipe, on_conn_close);
}

/* ---- reading ---------------------------------------------------------- */

static bool may_read(const struct conn *c) {
  const struct dspkd *d = c->d;
  return !c->closing && !d->stopping && !c->close_after_flush && !c->deferred &&
         dspkd_conn_inflight(c) < d->cfg.max_inflight &&
         c->unsent + c->reserved <= d->cfg.max_unsent &&
         /* One user's answers together: a connection that owes none of its
          * own reads up to twice the quota (a client waiting on it alone is
          * not held up by its other connections' unread answers unless
          * they hold the quota twice over), so that the user's many
          * connections cannot each hold one answer of up to max_message
          * beyond it (docs/protocol.md, max_user_unsent). */
         (!c->user || c->user->answers <= d->cfg.max_user_unsent ||
          (c->unsent + c->reserved == 0 &&
           c->user->answers <= dspkd_user_unsent_ceiling(d)));
}

/* nk (fresh, or the spare) takes the pending bytes of k, which it replaces:
 * k's reference is dropped (k NULL: none). */
static void chunk_take_pending(struct rchunk *nk, struct rchunk *k, size_t pending) {
  nk->refs = 1;
  nk->start = 0;
  nk->end = pending;
  if (pending)
    memcpy(nk->data, k->data + k->start, pending);
  dspkd_chunk_unref(k);
}

static bool may_peek(const struct conn *c);
static void peek_alloc(struct conn *c, uv_buf_t *buf);

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  struct conn *c = h->data;
  struct rchunk *k = c->rb, *nk;
  size_t pending, cap, limit;

  (void)suggested;
  if (c->land.j) { /* the rest of a buffer.write's data, and nothing after it */
    size_t left = c->land.len - c->land.got;
    *buf = uv_buf_init(c->land.dst + c->land.got,
                       (unsigned)(left < LAND_READ_MAX ? left : LAND_READ_MAX));
    return;
  }
  if (c->land.discard) { /* a refused one's: dropped */
    size_t left = c->land.len - c->land.got;
    *buf = uv_buf_init(sink, (unsigned)(left < sizeof sink ? left : sizeof sink));
    return;
  }
  if (!may_read(c)) { /* paused: no larger buffer (see may_peek) */
    peek_alloc(c, buf);
    return;
  }
  c->peek_nomem = false;
  *buf = uv_buf_init(NULL, 0);
  if (k && k->refs == 1 && k->start == k->end) {
    k->start = k->end = 0;
    if (k->cap > RCHUNK_KEEP) { /* a big idle buffer becomes the spare */
      chunk_release(k);
      c->rb = k = NULL;
      rb_count(c);
    }
  }
  if (k && k->cap - k->end >= READ_MIN) {
    buf->base = k->data + k->end;
    buf->len = k->cap - k->end;
    return;
  }
  pending = k ? k->end - k->start : 0;
  if (k && k->refs == 1 && k->start > 0 && k->cap - pending >= READ_MIN &&
      pending <= k->cap / 2) {
    /* Nobody else points into this buffer: compact it in place. */
    memmove(k->data, k->data + k->start, pending);
    k->start = 0;
    k->end = pending;
  } else {
    /* A frame may be at most max_message bytes; the scanner refuses it
     * before the buffer grows further. */
    limit = c->lim.max_message + READ_MIN;
    /* Doubled when one frame outgrew the buffer; the same size when jobs
     * still hold it (pipelined frames would otherwise double it up to
     * max_message, each one a fresh mapping). */
    cap = !k ? RCHUNK_MIN : k->refs > 1 ? k->cap : 2 * k->cap;
    if (cap < 2 * pending)
      cap = 2 * pending;
    if (cap < RCHUNK_MIN)
      cap = RCHUNK_MIN;
    if (cap > limit)
      cap = limit;
    if (cap < pending + READ_MIN)
      cap = pending + READ_MIN;
    /* The user's read buffers together stay within max_user_partial,
     * counted at their allocated size: a buffer that would pass it grows
     * only to what is left, however little more than what it holds that is
     * (a message up to that size still fits: the last reads may be shorter
     * than READ_MIN), or keeps the free space it already has; when neither
     * leaves a byte to read into, the frame cannot be taken in (on_read
     * closes the connection, naming the size the frame needs). */
    if (c->user && cap > RCHUNK_MIN) {
      uint64_t others = c->user->rbytes - c->rbytes, bound = c->d->cfg.max_user_partial;
      uint64_t room = bound > others ? bound - others : 0;
      if (cap > room && room > pending)
        cap = (size_t)room;
      if (others + cap > bound) {
        if (k && k->cap > k->end) /* what it has, no growth */
          goto have;
        c->over_partial = true;
        c->over_pending = pending;
        c->over_others = others;
        c->over_need = k ? dspk__frame_need(k->data + k->start, pending, &c->lim)
                         : (uint64_t)pending + 1;
        if (c->over_need <= pending)
          c->over_need = (uint64_t)pending + 1;
        return;
      }
    }
    /* A large frame is coming: the spare buffer, when it is as large and
     * the user's bound allows it, saves growing through fresh mappings. */
    if (cap > RCHUNK_KEEP && spare_chunk && spare_chunk->cap >= cap &&
        spare_chunk->cap <= limit &&
        (!c->user ||
         c->user->rbytes - c->rbytes + spare_chunk->cap <= c->d->cfg.max_user_partial)) {
      nk = spare_chunk;
      spare_chunk = NULL;
      chunk_take_pending(nk, k, pending);
      c->rb = k = nk;
      rb_count(c);
      goto have;
    }
    if (k && k->refs == 1 && k->start == 0 && !atomic_load(&k->pin_dev)) {
      nk = realloc(k, sizeof(*k) + cap);
      if (!nk) {
        c->rb_nomem = cap;
        return;
      }
    } else {
      /* Jobs hold the old buffer (their inline data lives in it), or a
       * runner registered its pages (they must not move): move only the
       * unconsumed bytes, a partial frame, into a fresh one. */
      nk = chunk_new(cap);
      if (!nk) {
        c->rb_nomem = cap;
        return;
      }
      chunk_take_pending(nk, k, pending);
    }
    nk->cap = cap;
    c->rb = k = nk;
    rb_count(c);
  }
have:
  buf->base = k->data + k->end;
  buf->len = k->cap - k->end;
}

/* Answers a request that failed before it reached a device, by the one rule
 * of every method: the client's own mistake a debug line only (which its
 * answer tells it); the daemon's failure (out of memory, internal) at its
 * level, limited per uid.  A refused task.run too, whose raw kernel has not
 * been compiled yet.  No line when the method logged the refusal in its own
 * (logged: struct req's); a debug line for the client's own per-user bound
 * (own_limit: struct req's). */
static void conn_refused(struct conn *c, const char *method, size_t method_len,
                         uint32_t msgid, int err, const char *msg, bool logged,
                         bool own_limit) {
  enum dspkd_level lv = own_limit ? DSPKD_DEBUG : dspkd_log_fail_level(err, false);
  if (!logged && dspkd_log_client_line_ok((long)c->uid, lv)) {
    char mv[2 * DSPKD_LOG_VALUE_MAX + 3]; /* the client's text, quoted if need be */
    dspkd_log(lv, "client %llu: %s #%u: %s: %s", (unsigned long long)c->id,
              dspkd_log_value(mv, sizeof mv, method, method_len), msgid,
              dspk__err_name(err), msg);
  }
  dspkd_conn_send_error(c, msgid, err, msg);
}

/* Decodes one validated frame in place and runs its request.  end: the
 * stream position where the frame ends, when it is handled in its turn (0:
 * a task.cancel taken ahead of held frames, peek_cancels): the descriptors
 * whose read ended within it came with it or before it and no later frame
 * can take them, so they are closed before its answer is written, whatever
 * the answer (those of a buffer.import once it took its own). */
static void conn_frame(struct conn *c, struct rchunk *k, const char *p, size_t n,
                       uint64_t end) {
  struct dspkd *d = c->d;
  msgpack_object root;
  struct dspk__msg m;
  uint32_t msgid = 0;
  bool has_msgid = false;
  size_t off = 0;
  char msg[256];
  int err;

  /* d->zone holds one frame's objects at a time: a frame decoded while
   * another's handler runs would clear that one's arguments under it
   * (conn_process leaves such a frame to the loop, on_later; peek_cancels
   * and conn_discard_refused call nothing between their decode and its
   * clear that could take another frame). */
  if (d->frame) {
    dspkd_error("internal error: client %llu's frame decoded while client %llu's is handled",
                (unsigned long long)c->id, (unsigned long long)d->frame->id);
#ifdef DSPK_TEST_HOOKS
    abort();
#endif
  }
  d->frame = c;
  err = msgpack_unpack(p, n, &off, &d->zone, &root);
  if (err != MSGPACK_UNPACK_SUCCESS) {
    conn_protocol_error(c, err == MSGPACK_UNPACK_NOMEM_ERROR ? DSPK_ENOMEM : DSPK_EPROTO,
                        "message cannot be decoded");
    goto out;
  }
  /* A notification from a client is ignored whatever it holds (only its
   * type and its 3 or more elements are looked at): the protocol closes a
   * connection for a malformed request or response, never for a
   * notification it ignores anyway. */
  if (root.type == MSGPACK_OBJECT_ARRAY && root.via.array.size >= 3 &&
      root.via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
      root.via.array.ptr[0].via.u64 == DSPK__NOTIFY) {
    dspkd_debug("client %llu: notification ignored", (unsigned long long)c->id);
    goto out;
  }
  /* Of the three types dspk__msg_parse() knows, a client sends only two
   * (notifications are out above): its text, naming all three, would be
   * untrue here. */
  if (root.type == MSGPACK_OBJECT_ARRAY && root.via.array.size >= 1 &&
      (root.via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
       root.via.array.ptr[0].via.u64 != DSPK__REQUEST)) {
    const msgpack_object *t = &root.via.array.ptr[0];
    if (t->type == MSGPACK_OBJECT_POSITIVE_INTEGER && t->via.u64 == DSPK__RESPONSE)
      conn_protocol_error(c, DSPK_EPROTO, "clients send requests, not responses");
    else if (t->type == MSGPACK_OBJECT_POSITIVE_INTEGER && t->via.u64 == DSPK__NOTIFY) {
      /* Its type is right, its length is not (one of 3 or more is ignored
       * above). */
      snprintf(msg, sizeof msg, "message array has %u %s, expected 3 or more for a notification",
               (unsigned)root.via.array.size, root.via.array.size == 1 ? "element" : "elements");
      conn_protocol_error(c, DSPK_EPROTO, msg);
    } else {
      /* What came, as every wrong kind is named (probe 17 A3). */
      char w[64];
      snprintf(msg, sizeof msg, "message type (element 0) must be 0 (request) or 2 "
               "(notification): got %s", dspk__obj_what(t, w, sizeof w));
      conn_protocol_error(c, DSPK_EPROTO, msg);
    }
    goto out;
  }
  err = dspk__msg_parse(&root, &m, &msgid, &has_msgid, msg, sizeof msg);
  if (end && (err < 0 || m.method_len != sizeof "buffer.import" - 1 ||
              memcmp(m.method, "buffer.import", m.method_len) != 0))
    dspkd_shm_drop_upto(c, end);
  if (err < 0) {
    /* A message with a msgid can be answered; anything else is not a
     * conversation the daemon can continue. */
    if (has_msgid && root.type == MSGPACK_OBJECT_ARRAY &&
        root.via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        root.via.array.ptr[0].via.u64 == DSPK__REQUEST)
      dspkd_conn_send_error(c, msgid, err, msg);
    else
      conn_protocol_error(c, err, msg);
    goto out;
  }
  {
    struct req r = {.c = c, .msgid = m.msgid, .args = m.args, .chunk = k};
    c->requests++;
    r.msg[0] = '\0';
    err = dspkd_dispatch(&r, m.method, m.method_len);
    if (end)
      dspkd_shm_drop_upto(c, end);
    if (err < 0)
      conn_refused(c, m.method, m.method_len, m.msgid, err, r.msg, r.logged, r.own_limit);
  }
out:
  if (end)
    dspkd_shm_drop_upto(c, end);
  msgpack_zone_clear(&d->zone);
  d->frame = NULL;
}

/* ---- reading while paused --------------------------------------------- */

/* While a connection may take no new request (may_read: max_inflight,
 * max_unsent, max_user_unsent; the unsent bytes counting the answers its
 * requests in flight reserved, so that one task with a large inline result
 * pauses it from its start), its socket is still read, into the read
 * buffer it has and never a larger one, so that the client's end of stream
 * and its task.cancel requests are seen while its tasks run
 * (docs/protocol.md, "Backpressure"): a closed connection cancels them, and
 * a task.cancel is answered at once.  Reading stops when that buffer is
 * full (of requests held back, or of a large request's first part: a
 * zero-length buffer from peek_alloc, which on_read takes as the pause),
 * when the connection keeps a descriptor (peek_fds), when more than
 * PEEK_UNSENT bytes of answers wait for the client (it is not reading: its
 * hangup fails the write), or the connection is closing, ended or received
 * data in place. */
#define PEEK_MIN ((size_t)4 << 10)     /* least free space a paused read takes */
#define PEEK_UNSENT ((size_t)64 << 10) /* answers a paused connection may owe */

static bool may_peek(const struct conn *c) {
  return !c->closing && !c->d->stopping && !c->close_after_flush && !c->deferred &&
         !c->eof && !c->land.j && !c->land.discard && c->unsent <= PEEK_UNSENT;
}

/* Whether a paused read has room (peek_alloc finds it without growing the
 * read buffer past RCHUNK_MIN). */
static bool peek_room(const struct conn *c) {
  const struct rchunk *k = c->rb;
  size_t pending = k ? k->end - k->start : 0;
  if (c->peek_nomem)
    return false;
  return !k || k->cap - k->end >= PEEK_MIN ||
         (k->refs == 1 && k->cap - pending >= PEEK_MIN) || pending + PEEK_MIN <= RCHUNK_MIN;
}

/* Whether a paused connection may read for more with the descriptors it
 * keeps: none.  A descriptor sent by the protocol's rule, first in the
 * sendmsg of its buffer.import frame, ends the read that brings it at that
 * frame's end (the kernel ends a read after the data a descriptor came
 * with), so a paused connection keeps at most the one of the first frame it
 * holds with a descriptor, and reads on once the pause ended and that frame
 * claimed it.  Reading on while paused, each further buffer.import held
 * kept its descriptor: a client that pipelined 9 of them behind a task in
 * flight under max_inflight (or while its user's other connections left
 * answers unread, max_user_unsent) passed DSPKD_MAX_FDS and was closed, and
 * paused connections together passed its user's DSPKD_MAX_USER_FDS, closing
 * another connection's first correct buffer.import (docs/protocol.md,
 * "Passing descriptors").  What the client sends meanwhile waits in the
 * socket, a task.cancel too (docs/protocol.md, "Backpressure"). */
static bool peek_fds(const struct conn *c) { return c->nfds == 0; }

/* on_alloc for a paused read: the room left in the read buffer, made by
 * compacting it, or a fresh buffer of RCHUNK_MIN (the first buffer every
 * connection is granted) when jobs hold the current one; never more.
 * None (a zero-length buffer: libuv's read callback gets UV_ENOBUFS, which
 * on_read takes as the pause it is, and stops reading) when the buffer is
 * full, or a fresh one cannot be allocated (c->peek_nomem: the connection
 * is read again once the pause ends, the ordinary path then growing its
 * buffer or closing it for the shortage).  A connection is paused here
 * without a dspkd_conn_update_read of its own when the pause comes from its
 * user's other connections (max_user_unsent: their answers queued) or from
 * the daemon (the stop): it was still reading, maybe with a buffer that the
 * start of a large message had filled, which closed it without a notice
 * (probe 23 D1). */
static void peek_alloc(struct conn *c, uv_buf_t *buf) {
  struct rchunk *k = c->rb;
  size_t pending = k ? k->end - k->start : 0;

  *buf = uv_buf_init(NULL, 0);
  if (!k || k->cap - k->end < PEEK_MIN) {
    if (k && k->refs == 1 && k->cap - pending >= PEEK_MIN) {
      memmove(k->data, k->data + k->start, pending);
      k->start = 0;
      k->end = pending;
    } else if (pending + PEEK_MIN <= RCHUNK_MIN) {
      struct rchunk *nk = chunk_new(RCHUNK_MIN);
      if (!nk) {
        c->peek_nomem = true;
        return;
      }
      nk->cap = RCHUNK_MIN;
      chunk_take_pending(nk, k, pending);
      c->rb = k = nk;
      rb_count(c);
    } else {
      return;
    }
  }
  buf->base = k->data + k->end;
  buf->len = k->cap - k->end;
}

/* Skips a msgpack str header at p[*i] (of n bytes): its length, or -1. */
static long str_len(const unsigned char *p, size_t n, size_t *i) {
  size_t at = *i, len, hdr;
  if (at >= n)
    return -1;
  if ((p[at] & 0xe0) == 0xa0) {
    len = p[at] & 0x1f;
    hdr = 1;
  } else if (p[at] == 0xd9 && at + 1 < n) {
    len = p[at + 1];
    hdr = 2;
  } else if (p[at] == 0xda && at + 2 < n) {
    len = (size_t)p[at + 1] << 8 | p[at + 2];
    hdr = 3;
  } else if (p[at] == 0xdb && at + 4 < n) {
    len = (size_t)p[at + 1] << 24 | (size_t)p[at + 2] << 16 | (size_t)p[at + 3] << 8 | p[at + 4];
    hdr = 5;
  } else {
    return -1;
  }
  *i = at + hdr;
  return (long)len;
}

/* Whether the bytes at p (n of them, maybe not a whole frame) start a
 * request [0, msgid, "task.cancel", ...], in any of the encodings msgpack
 * allows for its array, msgid and method name: a look at its first bytes,
 * the frame itself being scanned and decoded as any other. */
static bool is_cancel(const char *s, size_t n) {
  static const char name[] = "task.cancel";
  const unsigned char *p = (const unsigned char *)s;
  size_t i;
  long len;
  bool zero;

  if (n >= 1 && p[0] == 0x94)
    i = 1;
  else if (n >= 3 && p[0] == 0xdc && p[1] == 0 && p[2] == 4)
    i = 3;
  else if (n >= 5 && p[0] == 0xdd && p[1] == 0 && p[2] == 0 && p[3] == 0 && p[4] == 4)
    i = 5;
  else
    return false;
  /* The type (0) and the msgid: integers of any width. */
  for (int field = 0; field < 2; field++) {
    size_t w;
    if (i >= n)
      return false;
    if (p[i] < 0x80) {
      zero = p[i] == 0;
      i++;
      w = 0;
    } else if (p[i] >= 0xcc && p[i] <= 0xcf) {
      w = (size_t)1 << (p[i] - 0xcc);
    } else if (p[i] >= 0xd0 && p[i] <= 0xd3) {
      w = (size_t)1 << (p[i] - 0xd0);
    } else {
      return false;
    }
    if (w) {
      if (i + 1 + w > n)
        return false;
      zero = true;
      for (size_t b = 0; b < w; b++)
        zero = zero && p[i + 1 + b] == 0;
      i += 1 + w;
    }
    if (field == 0 && !zero)
      return false;
  }
  len = str_len(p, n, &i);
  return len == (long)(sizeof name - 1) && i + (size_t)len <= n &&
         memcmp(p + i, name, sizeof name - 1) == 0;
}

/* The msgid a task.cancel frame (decoded in d->zone) names, or -1. */
static int64_t cancel_target(const msgpack_object *root) {
  const msgpack_object *a, *m;
  if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size != 4)
    return -1;
  a = &root->via.array.ptr[3];
  if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != 1 ||
      a->via.array.ptr[0].type != MSGPACK_OBJECT_MAP)
    return -1;
  m = &a->via.array.ptr[0];
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object_kv *kv = &m->via.map.ptr[i];
    if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == 5 &&
        memcmp(kv->key.via.str.ptr, "msgid", 5) == 0)
      return kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER && kv->val.via.u64 <= UINT32_MAX
                 ? (int64_t)kv->val.via.u64
                 : -1;
  }
  return -1;
}

/* Overwrites a frame of n bytes (n >= 8) with a notification of the same
 * size, [2, nil, bin], which the daemon ignores when it comes to it. */
static void frame_blank(char *s, size_t n) {
  unsigned char *p = (unsigned char *)s;
  size_t body = n - 3;
  p[0] = 0x93;
  p[1] = 0x02;
  p[2] = 0xc0;
  if (body - 2 <= 0xff) {
    p[3] = 0xc4;
    p[4] = (unsigned char)(body - 2);
  } else if (body - 3 <= 0xffff) {
    p[3] = 0xc5;
    p[4] = (unsigned char)((body - 3) >> 8);
    p[5] = (unsigned char)(body - 3);
  } else {
    uint32_t len = (uint32_t)(body - 5);
    p[3] = 0xc6;
    p[4] = (unsigned char)(len >> 24);
    p[5] = (unsigned char)(len >> 16);
    p[6] = (unsigned char)(len >> 8);
    p[7] = (unsigned char)len;
  }
}

static bool turn_open(struct conn *c);
static void turn_frame(struct conn *c, struct rchunk *k, const char *p, size_t n,
                       uint64_t end);

/* The connection is paused with requests held in its read buffer: each
 * task.cancel behind them that names a request of this connection in
 * flight now is answered now (it cancels the request it would cancel in
 * its turn: the oldest in flight with that msgid, older than any request
 * held) and left in the buffer as an ignored notification.  Any other
 * task.cancel waits for its turn (it may name a request held before it)
 * and is looked at again once another request was taken in.  Frames are
 * scanned once (c->pk_pos: the stream position scanned up to). */
static void peek_cancels(struct conn *c) {
  const struct dspk__limits *lim = &c->lim;
  struct rchunk *k = c->rb;
  uint64_t base;
  size_t off;
  char msg[256];

  if (!k || k->start == k->end)
    return;
  base = c->rx_pos - (k->end - k->start); /* the stream position of k->start */
  if (c->pk_pos <= base || (c->pk_wait && c->pk_req != c->requests)) {
    off = k->start;
    c->pk_wait = 0;
  } else {
    off = k->start + (size_t)(c->pk_pos - base);
  }
  k->refs++;
  while (off < k->end && may_peek(c)) {
    ssize_t n = dspk__frame_scan(k->data + off, k->end - off, lim, msg, sizeof msg);
    msgpack_object root;
    size_t used = 0;
    int64_t target = -1;
    bool live = false;

    if (n <= 0)
      break;
    if (off > k->start && is_cancel(k->data + off, (size_t)n) &&
        msgpack_unpack(k->data + off, (size_t)n, &used, &c->d->zone, &root) ==
            MSGPACK_UNPACK_SUCCESS)
      target = cancel_target(&root);
    msgpack_zone_clear(&c->d->zone);
    for (const struct job *j = c->jobs; target >= 0 && j && !live; j = j->cnext)
      live = j->msgid == (uint32_t)target;
    if (live && !turn_open(c))
      break; /* looked at again in the next turn (c->pk_pos: this frame) */
    if (live) {
      turn_frame(c, k, k->data + off, (size_t)n, 0);
      frame_blank(k->data + off, (size_t)n);
    } else if (target >= 0) {
      c->pk_wait++;
    }
    off += (size_t)n;
  }
  c->pk_pos = base + (off - k->start);
  c->pk_req = c->requests;
  dspkd_chunk_unref(k);
}

/* The incomplete frame at k->start (have bytes of it) is the head of a
 * buffer.write whose data, 64 KiB or more, ends the frame, and is not
 * received in place: when the ordinary path would refuse it (its arguments,
 * its buffer, its range), its data is dropped as it comes (c->land.discard)
 * and the request answered its error once all of it came (discard_end).
 * The head is decoded, its bin emptied, once per frame. */
static void conn_discard_refused(struct conn *c, struct rchunk *k) {
  struct dspk__write_head h;
  size_t have = k->end - k->start;
  uint64_t start = c->rx_pos - have;
  struct dspkd *d = c->d;
  msgpack_object root;
  struct dspk__msg m;
  uint32_t msgid = 0;
  bool has_msgid = false;
  size_t off = 0;
  char msg[64], *frame;
  int err;

  if (c->land.checked == start + 1 ||
      !dspk__write_head_find(k->data + k->start, have, &c->lim, &h) || h.len < LAND_MIN ||
      have >= h.head + h.len)
    return;
  c->land.checked = start + 1;
  /* The head with an empty bin: a whole request, decoded as any. */
  if (!(frame = malloc(h.bin_at + 2)))
    return;
  memcpy(frame, k->data + k->start, h.bin_at);
  frame[h.bin_at] = (char)0xc4;
  frame[h.bin_at + 1] = 0;
  err = 0;
  if (msgpack_unpack(frame, h.bin_at + 2, &off, &d->zone, &root) == MSGPACK_UNPACK_SUCCESS &&
      dspk__msg_parse(&root, &m, &msgid, &has_msgid, msg, sizeof msg) >= 0) {
    struct req r = {.c = c, .msgid = m.msgid, .args = m.args};
    r.msg[0] = '\0';
    if ((err = dspkd_write_refused(&r, h.len)) < 0) {
      c->land.msg = strdup(r.msg);
      c->land.msgid = m.msgid;
    }
  }
  msgpack_zone_clear(&d->zone);
  free(frame);
  if (err >= 0)
    return; /* a good request: the ordinary path */
  c->frame_pos = start;
  dspkd_shm_drop_stale(c);
  c->land.discard = true;
  c->land.err = err;
  c->land.got = have - h.head;
  c->land.len = h.len;
  k->start = k->end;
}

/* All of a refused buffer.write's data came: its answer, as conn_frame
 * gives it (the descriptors that came with the frame closed first). */
static void discard_end(struct conn *c) {
  static const char method[] = "buffer.write";
  char *msg = c->land.msg;

  c->land.discard = false;
  c->land.msg = NULL;
  c->requests++;
  dspkd_shm_drop_upto(c, c->rx_pos);
  conn_refused(c, method, sizeof method - 1, c->land.msgid, c->land.err,
               msg ? msg : dspk__strerror(c->land.err), false, false);
  free(msg);
}

/* An incomplete frame at k->start: when it is the head of a buffer.write
 * whose data can go straight into its buffer, the data read so far goes
 * there and the rest will follow it (on_alloc); the read buffer is then
 * empty.  The frame scanner has accepted the bytes so far.  Otherwise, a
 * buffer.write the daemon refuses has its data dropped as it comes
 * (conn_discard_refused). */
static void conn_land(struct conn *c, struct rchunk *k) {
  struct dspk__write_head h;
  size_t have = k->end - k->start;
  char *dst;

  if (c->land.j || c->land.discard || have < 16)
    return;
  if (!dspk__write_head_scan(k->data + k->start, have, &c->lim, &h) || h.len < LAND_MIN ||
      have >= h.head + h.len) {
    conn_discard_refused(c, k);
    return;
  }
  /* As for any frame: fds that came before it were not sent with it. */
  c->frame_pos = c->rx_pos - have;
  dspkd_shm_drop_stale(c);
  if (!(dst = dspkd_land_begin(c, &h))) {
    conn_discard_refused(c, k);
    return;
  }
  c->land.got = have - h.head;
  memcpy(dst, k->data + k->start + h.head, c->land.got);
  c->d->obs.bytes_in_place += c->land.got;
  k->start = k->end;
}

/* Decoding requests is the loop's own work, shared by every client: one
 * user's connections together handle at most TURN_MSGS messages and
 * TURN_BYTES of them, and spend at most TURN_NS of the loop's time on them
 * (decoding, answering, a tiny task run on the loop), in one turn of the
 * loop (at least one message, whatever its size); the rest waits for the
 * next turn (a new millisecond of loop time, or `resume`), their reading
 * stopped meanwhile, so a user who floods the daemon from many connections
 * delays another user's requests by about one turn, not by one message of
 * each of those connections.  Bytes alone did not bound a turn: 256 KiB of
 * 9-byte pings is 29,000 requests, a quarter second of the loop's time. */
#define TURN_BYTES (256u << 10)
#define TURN_MSGS 256u
#define TURN_NS (2u * 1000 * 1000)

/* dspkd_conn_update_read on every connection whose flag at offset flag (a
 * bool of struct conn) is set, clearing it; on every one when flag is
 * SIZE_MAX.  A connection closed meanwhile stays in the list until its
 * close callback: the walk holds each one it visits. */
static void update_reads(struct dspkd *d, size_t flag) {
  for (struct conn *c = d->conns, *next; c; c = next) {
    dspkd_conn_ref(c);
    bool *set = flag == SIZE_MAX ? NULL : (bool *)((char *)c + flag);
    if (!set || *set) {
      if (set)
        *set = false;
      dspkd_conn_update_read(c);
    }
    next = c->next;
    dspkd_conn_unref(c);
  }
}

static void on_resume(uv_idle_t *h) {
  struct dspkd *d = h->data;
  uv_idle_stop(h);
  d->turn_gen++;
  update_reads(d, offsetof(struct conn, deferred));
}

/* Whether c's user may handle another message in this turn (checked before
 * the frame is even scanned: scanning costs as much as decoding). */
static bool turn_open(struct conn *c) {
  struct duser *u = c->user;
  struct dspkd *d = c->d;
  uint64_t now = uv_now(d->loop);

  if (!u)
    return true;
  if (u->turn_ms != now || u->turn_gen != d->turn_gen) {
    u->turn_ms = now;
    u->turn_gen = d->turn_gen;
    u->turn_bytes = 0;
    u->turn_msgs = 0;
    u->turn_ns = 0;
    u->turn_over = false;
  }
  if (u->turn_bytes < TURN_BYTES && u->turn_msgs < TURN_MSGS && u->turn_ns < TURN_NS)
    return true;
  if (!u->turn_over) {
    u->turn_over = true;
    dspkd_debug("uid %ld: turn used up (%llu messages, %llu bytes, %llu us of the loop): "
                "its connections wait for the next", (long)u->uid,
                (unsigned long long)u->turn_msgs, (unsigned long long)u->turn_bytes,
                (unsigned long long)(u->turn_ns / 1000));
  }
  c->deferred = true;
  if (!uv_is_closing((uv_handle_t *)&d->resume))
    uv_idle_start(&d->resume, on_resume);
  return false;
}

/* Handles one frame of n bytes counted against c's user's turn (which
 * turn_open let in): conn_frame's contract. */
static void turn_frame(struct conn *c, struct rchunk *k, const char *p, size_t n,
                       uint64_t end) {
  struct duser *u = c->user;
  uint64_t t0;

  if (!u) {
    conn_frame(c, k, p, n, end);
    return;
  }
  u->turn_bytes += (uint64_t)n;
  u->turn_msgs++;
  t0 = dspkd_now_ns();
  conn_frame(c, k, p, n, end); /* u lives on: the caller holds a ref on c */
  u->turn_ns += dspkd_now_ns() - t0;
}

/* The held frames of connections whose pause ended inside another frame's
 * handler (conn_process): taken now, from the loop, each connection's in
 * order (dspkd_conn_update_read).  Until then such a connection reads on
 * as its limits allow: what it reads goes behind the frames it holds. */
static void on_later(uv_idle_t *h) {
  struct dspkd *d = h->data;
  uv_idle_stop(h);
  update_reads(d, offsetof(struct conn, later));
}

/* Runs every complete frame in the read buffer while the connection may
 * take more requests. */
static void conn_process(struct conn *c) {
  const struct dspk__limits *lim = &c->lim;
  struct dspkd *d = c->d;
  char msg[256];

  if (c->in_process)
    return;
  /* Inside another frame's handler, whose arguments d->zone holds: that
   * handler ended this connection's pause (a task.cancel dropping a queued
   * task whose answer counted in the user's max_user_unsent, a close giving
   * back a connection's answers, job.end answering the job.end calls that
   * waited), and this connection's held frames are left to the loop
   * (on_later), never decoded and run inside that handler (its own
   * connection's next frames wait for it anyway: c->in_process). */
  if (d->frame) {
    c->later = true;
    if (!uv_is_closing((uv_handle_t *)&d->later))
      uv_idle_start(&d->later, on_later);
    return;
  }
  c->in_process = true;
  dspkd_conn_ref(c);
  c->held = false;
  for (;;) {
    struct rchunk *k = c->rb;
    ssize_t n;
    const char *p;

    if (!k || k->start == k->end)
      break;
    /* Paused, a task.cancel at the head is taken in its turn all the
     * same, and one behind held requests maybe before it (peek_cancels). */
    if (!may_read(c) && !(may_peek(c) && is_cancel(k->data + k->start, k->end - k->start))) {
      if (may_peek(c)) {
        peek_cancels(c);
        /* A cancel it took may have ended the pause (a queued task's
         * answer reserved no more): the held requests go on now, for no
         * read may ever come to take them (dspkd_conn_update_read, called
         * meanwhile, left them to this loop). */
        if (may_read(c) && !c->closing)
          continue;
      }
      c->held = !c->closing;
      break;
    }
    if (!turn_open(c)) {
      c->held = true;
      break;
    }
    msg[0] = '\0';
    n = dspk__frame_scan(k->data + k->start, k->end - k->start, lim, msg, sizeof msg);
    if (n == 0) {
      conn_land(c, k);
      break;
    }
    if (n < 0) {
      conn_protocol_error(c, (int)n, msg[0] ? msg : dspk__strerror((int)n));
      break;
    }
    p = k->data + k->start;
    /* Where this frame starts in the stream: fds that came before it were
     * not sent with it (daemon/shm.c). */
    c->frame_pos = c->rx_pos - (k->end - k->start);
    dspkd_shm_drop_stale(c);
    k->start += (size_t)n;
    k->refs++; /* the frame's bytes stay put while the request is decoded */
    turn_frame(c, k, p, (size_t)n, c->frame_pos + (uint64_t)n);
    dspkd_chunk_unref(k);
  }
  c->in_process = false;
  dspkd_conn_unref(c);
}

/* Whether the client closed its end for good (both directions shut: POLLHUP),
 * not just its sending side. */
static bool conn_peer_gone(struct conn *c) {
  struct pollfd p = {.events = 0};
  if (uv_fileno((uv_handle_t *)&c->pipe, &p.fd) != 0)
    return true;
  return poll(&p, 1, 0) != 0 && (p.revents & (POLLHUP | POLLERR));
}

/* A connection that is not read (paused with its read buffer full of
 * requests held back or keeping a descriptor, or receiving a buffer.write's
 * data in place, or
 * after its client's end of stream) yet has requests in flight and no
 * answer queued (a queued answer's write fails once the client is gone)
 * is looked at every HUP_POLL_MS: a client that has closed the connection
 * then has its tasks canceled without waiting for them to end. */
#define HUP_POLL_MS 100

static bool hup_watched(const struct conn *c) {
  return !c->closing && !c->reading && c->unsent == 0 && dspkd_conn_inflight(c) > 0 &&
         !c->d->stopping;
}

static void on_hup_poll(uv_timer_t *t) {
  struct dspkd *d = t->data;
  bool any = false;
  for (struct conn *c = d->conns, *next; c; c = next) {
    dspkd_conn_ref(c);
    if (hup_watched(c)) {
      if (conn_peer_gone(c))
        dspkd_conn_close(c, "the client closed the connection");
      else
        any = true;
    }
    next = c->next;
    dspkd_conn_unref(c);
  }
  if (!any)
    uv_timer_stop(t);
}

/* After the client's end of stream: closes the connection once every request
 * it sent whole is answered and written, or at once when the stream ended
 * inside a message. */
static void conn_eof_check(struct conn *c) {
  const struct rchunk *k = c->rb;
  bool partial = c->land.j || c->land.discard || (!c->held && k && k->start != k->end);

  if (c->in_process) /* conn_process checks again when it is done */
    return;
  if (partial)
    dspkd_conn_close(c, "end of stream inside a message");
  else if (!c->held && dspkd_conn_inflight(c) == 0 && c->unsent == 0)
    dspkd_conn_close(c, "end of stream");
}

void dspkd_conn_owe(struct conn *c) {
  dspkd_conn_ref(c);
  c->owed++;
}

void dspkd_conn_paid(struct conn *c) {
  c->owed--;
  dspkd_conn_update_read(c);
  dspkd_conn_unref(c);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  struct conn *c = s->data;
  (void)buf;
  if (n == UV_ENOBUFS && c->over_partial) {
    char msg[320];
    snprintf(msg, sizeof msg, "this connection's incomplete message (%llu bytes so far) "
             "needs a read buffer of at least %llu bytes, with which this user's read buffers "
             "would be %llu bytes (allocated size), more than max_user_partial (%llu bytes)",
             (unsigned long long)c->over_pending, (unsigned long long)c->over_need,
             (unsigned long long)(c->over_others + c->over_need),
             (unsigned long long)c->d->cfg.max_user_partial);
    conn_protocol_error(c, DSPK_ELIMIT, msg);
    return;
  }
  if (n == UV_ENOBUFS && c->rb_nomem) {
    /* The daemon's own shortage (out of memory, or of memory mappings,
     * vm.max_map_count): the client is told and the log says so, never a
     * silent reset (probe 19 H2). */
    char msg[256];
    snprintf(msg, sizeof msg, "the daemon cannot allocate a read buffer of %zu bytes for "
             "this connection's next message (out of memory): not the client's fault, try "
             "again later", c->rb_nomem);
    if (dspkd_log_client_line_ok((long)c->uid, DSPKD_WARN))
      dspkd_warn(DSPKD_PEER_FMT ": closed: %s", DSPKD_PEER_ARGS(c), msg);
    conn_protocol_error(c, DSPK_ENOMEM, msg);
    return;
  }
  if (n == UV_ENOBUFS) {
    /* No room for a paused read (peek_alloc): the pause it is, never a
     * close; what the client sends meanwhile waits in the socket until the
     * pause ends (dspkd_conn_update_read reads it again then). */
    if (may_read(c)) {
      /* on_alloc refuses a read only as said above: an internal error,
       * told to the client and logged, not a silent close. */
      char msg[128];
      snprintf(msg, sizeof msg, "internal error: no read buffer for this connection (%s)",
               uv_strerror((int)n));
      dspkd_error(DSPKD_PEER_FMT ": closed: %s", DSPKD_PEER_ARGS(c), msg);
      conn_protocol_error(c, DSPK_EINTERNAL, msg);
      return;
    }
    dspkd_debug("client %llu: paused with %s: not read until the pause ends",
                (unsigned long long)c->id,
                c->peek_nomem ? "no read buffer to be had (out of memory)"
                              : "its read buffer full");
    uv_read_stop(s);
    c->reading = false;
    dspkd_conn_update_read(c);
    return;
  }
  if (n == UV_EOF && !conn_peer_gone(c)) {
    /* shutdown(SHUT_WR): the requests it sent whole are answered first. */
    c->eof = true;
    dspkd_conn_update_read(c);
    return;
  }
  if (n < 0) {
    if (n != UV_EOF)
      dspkd_debug("client %llu: read: %s", (unsigned long long)c->id,
                  uv_strerror((int)n));
    dspkd_conn_close(c, n == UV_EOF ? "end of stream" : uv_strerror((int)n));
    return;
  }
  if (n == 0)
    return;
  if (c->land.j) { /* read into the buffer (on_alloc) */
    c->land.got += (size_t)n;
    c->d->obs.bytes_in_place += (size_t)n;
  } else if (c->land.discard) { /* read into the sink (on_alloc) */
    c->land.got += (size_t)n;
  } else {
    c->rb->end += (size_t)n;
  }
  c->rx_pos += (size_t)n;
  c->d->obs.bytes_in += (size_t)n;
  /* SCM_RIGHTS descriptors that came with these bytes (buffer.import). */
  if (uv_pipe_pending_count(&c->pipe) > 0) {
    char msg[128];
    int err = dspkd_shm_take_fds(c, msg, sizeof msg);
    if (err < 0) {
      conn_protocol_error(c, err, msg);
      return;
    }
  }
  dspkd_conn_ref(c);
  c->d->in_read = true;
  if (c->land.j && c->land.got == c->land.len)
    dspkd_land_end(c);
  else if (c->land.discard && c->land.got == c->land.len)
    discard_end(c);
  conn_process(c);
  c->d->in_read = false;
  /* Jobs that ran on the loop (run_inline) are answered now, not after a
   * turn through epoll for a wake-up. */
  if (c->d->inline_done) {
    c->d->inline_done = false;
    dspkd_sched_done_cb(&c->d->done_async);
  }
  dspkd_conn_update_read(c);
  dspkd_conn_unref(c);
}

void dspkd_conn_update_read(struct conn *c) {
  bool want;

  if (c->closing)
    return;
  if (c->held && !c->in_process && (may_read(c) || may_peek(c))) {
    dspkd_conn_ref(c);
    conn_process(c);
    dspkd_conn_unref(c);
    if (c->closing)
      return;
  }
  if (may_read(c))
    c->peek_nomem = false; /* the ordinary path grows the buffer, or tells the shortage */
  if (c->eof) {
    conn_eof_check(c);
    want = false;
  } else {
    /* Paused, the socket is read for more only while the connection keeps
     * no descriptor unclaimed (peek_fds). */
    want = may_read(c) || (may_peek(c) && peek_room(c) && peek_fds(c));
  }
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
      c->reading = true;
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
  }
  if (hup_watched(c) && !uv_is_active((uv_handle_t *)&c->d->hup_timer) &&
      !uv_is_closing((uv_handle_t *)&c->d->hup_timer))
    uv_timer_start(&c->d->hup_timer, on_hup_poll, HUP_POLL_MS, HUP_POLL_MS);
}

/* A reload may raise max_inflight, max_unsent or max_user_unsent: every
 * connection is looked at again, so that one paused by an old value reads
 * (and takes its held requests) at once, not when one of its requests ends
 * (protocol.md, "Limits"; probe 23 G2).  Inside a frame (daemon.reload) the
 * other connections' held frames are left to the loop (conn_process). */
void dspkd_conn_reloaded(struct dspkd *d) { update_reads(d, SIZE_MAX); }

/* ---- accepting -------------------------------------------------------- */

/* How many of d's connections other than self (only user u's when u is not
 * NULL) are gone though still counted: closing, or their client closed its
 * end (POLLHUP: both directions shut, not a half-close) and the loop has
 * not read that end of stream yet.  Asked only when a limit would refuse
 * self: a client that connects again right after closing (a shell loop of
 * commands under max_user_clients 1) is not refused for its own connection
 * that is already gone. */
static size_t conns_gone(struct dspkd *d, const struct conn *self, const struct duser *u) {
  size_t n = 0;
  for (struct conn *o = d->conns; o; o = o->next) {
    struct pollfd p = {.events = 0};
    if (o == self || (u && o->user != u))
      continue;
    if (o->closing) {
      n++;
      continue;
    }
    if (uv_fileno((uv_handle_t *)&o->pipe, &p.fd) == 0 && poll(&p, 1, 0) == 1 &&
        (p.revents & POLLHUP))
      n++;
  }
  return n;
}

/* The daemon accepts itself (accept4 on the listening socket, watched by a
 * uv_poll_t) instead of through uv_listen: libuv meets a full descriptor
 * table (EMFILE, ENFILE) by accepting and closing the waiting connections
 * in silence, neither the client nor the log ever told why.  Here one
 * descriptor is kept in reserve (/dev/null): when accept fails for want of
 * descriptors it is closed, the waiting connection accepted on it, sent a
 * protocol.error ELIMIT notification and closed, and the reserve taken
 * again; a warning says so in the log, at most once a minute (with how many
 * were refused since).  When even that fails (another thread took the
 * descriptor) the listener rests ACCEPT_REST_MS before it tries again,
 * rather than spin on a socket that stays readable. */
#define ACCEPT_REST_MS 100
static uv_poll_t listen_poll;
static uv_timer_t accept_rest;
static bool accept_handles;
static int reserve_fd = -1;
static struct {
  uint64_t last_ns, unlogged;
  bool logged;
} fd_refusals;

static void reserve_take(void) {
  if (reserve_fd < 0)
    reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void accept_fd(struct dspkd *d, int fd);
static void accept_close(void);

/* Logs a refusal for want of descriptors (rate-limited). */
static void log_fd_refusal(int err, bool told) {
  uint64_t now = dspkd_now_ns();
  struct rlimit rl;
  char lim[48] = "";
  if (fd_refusals.logged && now - fd_refusals.last_ns < 60ull * 1000000000ull) {
    fd_refusals.unlogged++;
    return;
  }
  if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
    snprintf(lim, sizeof lim, " (RLIMIT_NOFILE %llu)", (unsigned long long)rl.rlim_cur);
  char more[64] = "";
  if (fd_refusals.unlogged)
    snprintf(more, sizeof more, "; %llu more since the last such line",
             (unsigned long long)fd_refusals.unlogged);
  dspkd_warn("accept: %s%s: a connection was refused%s%s (logged at most once a minute; "
             "LimitNOFILE= raises the limit)",
             strerror(err), lim, told ? " with protocol.error ELIMIT" : " unanswered", more);
  fd_refusals.logged = true;
  fd_refusals.last_ns = now;
  fd_refusals.unlogged = 0;
}

/* Accepts one waiting connection on the reserve descriptor, tells it why
 * it is refused and closes it.  1 when one was refused so, 0 when none was
 * waiting (accept checks for a free descriptor before it looks at the
 * queue), -1 when it could not be done. */
static int refuse_for_fds(int lfd, int err) {
  struct wreq *wr;
  char msg[160];
  size_t n;
  int fd;
  if (reserve_fd < 0)
    return -1;
  close(reserve_fd);
  reserve_fd = -1;
  fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    reserve_take();
    return 0;
  }
  if (fd >= 0) {
    bool told = false;
    snprintf(msg, sizeof msg, "the daemon has no file descriptor left for a connection (%s): "
             "refused; try again later", strerror(err));
    wr = dspkd_wreq_new();
    if (wr) {
      dspk__pack_notify_head(&wr->w.pk, "protocol.error");
      dspk__pack_error(&wr->w.pk, DSPK_ELIMIT, msg);
      if (wreq_bufs(wr, &n) == 0) {
        struct msghdr mh = {.msg_iov = (struct iovec *)(void *)wr->bufs,
                            .msg_iovlen = n};
        told = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)wr->len;
      }
      dspkd_wreq_free(wr);
    }
    /* What the client sent already is read and dropped, so the close does
     * not reset the connection before the client read the notice. */
    {
      char sink[4096];
      for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
    }
    shutdown(fd, SHUT_WR);
    close(fd);
    log_fd_refusal(err, told);
  }
  reserve_take();
  return fd >= 0 ? 1 : -1;
}

static void on_accept_rest(uv_timer_t *t);

static void on_listen_ready(uv_poll_t *h, int status, int events) {
  struct dspkd *d = h->data;
  int lfd;
  (void)events;
  if (status < 0) {
    dspkd_warn("accept: %s", uv_strerror(status));
    return;
  }
  if (uv_fileno((uv_handle_t *)&d->listener, &lfd) != 0)
    return;
  /* A bounded batch per wake-up, as libuv's own accept loop: the loop's
   * other work is not held up by a flood of connections. */
  for (int i = 0; i < 64 && d->listening; i++) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      accept_fd(d, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return;
    if (errno == EMFILE || errno == ENFILE) {
      int err = errno, r = refuse_for_fds(lfd, err);
      if (r > 0)
        continue;
      if (r == 0)
        return;
      log_fd_refusal(err, false);
    } else {
      dspkd_warn("accept: %s", strerror(errno));
    }
    uv_poll_stop(&listen_poll);
    uv_timer_start(&accept_rest, on_accept_rest, ACCEPT_REST_MS, 0);
    return;
  }
}

static void on_accept_rest(uv_timer_t *t) {
  struct dspkd *d = t->data;
  if (d->listening)
    uv_poll_start(&listen_poll, UV_READABLE, on_listen_ready);
}

/* Starts accepting on d->listener (bound; listening when `do_listen` is
 * false, as an activated socket is).  0 or a libuv error code. */
static int listen_start(struct dspkd *d, bool do_listen) {
  int lfd, r;
  if ((r = uv_fileno((uv_handle_t *)&d->listener, &lfd)) != 0)
    return r;
  if (do_listen && listen(lfd, 128) != 0)
    return -errno;
  if ((r = uv_poll_init(d->loop, &listen_poll, lfd)) != 0)
    return r;
  listen_poll.data = d;
  uv_timer_init(d->loop, &accept_rest);
  accept_rest.data = d;
  accept_handles = true;
  reserve_take();
  return uv_poll_start(&listen_poll, UV_READABLE, on_listen_ready);
}

static void accept_fd(struct dspkd *d, int fd) {
  struct conn *c;
  struct ucred cred;
  socklen_t len = sizeof cred;

  c = calloc(1, sizeof(*c));
  if (!c || !(c->q = dspkd_sched_conn_new(d))) {
    free(c);
    dspkd_error("accept: out of memory");
    close(fd);
    return;
  }
  /* ipc: the socket carries SCM_RIGHTS descriptors (buffer.import); on Unix
   * libuv adds no framing of its own, the stream stays the protocol's. */
  uv_pipe_init(d->loop, &c->pipe, 1);
  c->pipe.data = c;
  c->d = d;
  c->lim = d->cfg.lim;
  c->refs = 1;
  c->id = ++d->next_conn_id;
  c->next = d->conns;
  if (d->conns)
    d->conns->prev = c;
  d->conns = c;
  d->nconns++;
  d->obs.conns_total++;
  uv_timer_stop(&d->trim_timer);
  if (uv_pipe_open(&c->pipe, fd) != 0) {
    close(fd);
    c->closing = true;
    uv_close((uv_handle_t *)&c->pipe, on_conn_close);
    return;
  }
  {
    /* Answers of megabytes cross in a few large steps instead of one
     * wake-up of the client per 208 KiB, the default (the kernel caps this
     * at net.core.wmem_max and doubles it).  Best effort. */
    int sb = SOCK_SNDBUF;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
  }
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->gid = cred.gid;
  } else {
    c->pid = -1;
    c->uid = (uid_t)-1;
    c->gid = (gid_t)-1;
  }
  dspkd_job_peer_cgroup(c, fd);
  dspkd_debug(DSPKD_PEER_FMT ": connected", DSPKD_PEER_ARGS(c));
  if (!dspkd_admin_may_connect(c)) {
    char msg[192];
    dspkd_admin_connect_refusal(c, msg, sizeof msg);
    conn_protocol_error(c, DSPK_EPERM, msg);
    return;
  }
  /* An admin (a Slurm prolog or epilog, dspk-submit as root) has a few
   * connections more than others may take: users filling the daemon must
   * not make a job's prolog fail and drain the node. */
  size_t extra = dspkd_admin_is(c) ? DSPKD_ADMIN_EXTRA_CONNS : 0;
  if (d->nconns > d->cfg.max_clients + extra &&
      d->nconns - conns_gone(d, c, NULL) > d->cfg.max_clients + extra) {
    char msg[128];
    /* An admin is told both numbers: the count is not the limit. */
    if (extra)
      snprintf(msg, sizeof msg, "more than %zu connections (max_clients %zu and %zu more for "
               "admins)", d->cfg.max_clients + extra, d->cfg.max_clients, extra);
    else
      snprintf(msg, sizeof msg, "more than %zu connection%s (max_clients)", d->cfg.max_clients,
               d->cfg.max_clients == 1 ? "" : "s");
    conn_protocol_error(c, DSPK_ELIMIT, msg);
    return;
  }
  if (!(c->mem = calloc(d->ndevs ? (size_t)d->ndevs : 1, sizeof(*c->mem))) ||
      !(c->user = dspkd_user_get(d, c->uid))) {
    conn_protocol_error(c, DSPK_ENOMEM, "out of memory");
    return;
  }
  if (c->user->nconns > d->cfg.max_user_clients + extra &&
      c->user->nconns - conns_gone(d, c, c->user) > d->cfg.max_user_clients + extra) {
    char msg[128], more[48] = "";
    size_t n = c->user->nconns - 1 - conns_gone(d, c, c->user);
    if (extra)
      snprintf(more, sizeof more, " and %zu more for admins", extra);
    snprintf(msg, sizeof msg, "this user has %zu connection%s already (max_user_clients %zu%s)",
             n, n == 1 ? "" : "s", d->cfg.max_user_clients, more);
    conn_protocol_error(c, DSPK_ELIMIT, msg);
    return;
  }
  dspkd_conn_update_read(c);
}

static int socket_is_live(const char *path) {
  struct sockaddr_un sa;
  int fd, r;

  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  r = r == 0 ? 1 : -errno;
  close(fd);
  return r;
}

int dspkd_socket_check(const char *path) {
  struct stat st;
  int r;

  if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    dspkd_error("socket path is %zu bytes, longer than the %zu a Unix socket "
                "allows: %s", strlen(path),
                sizeof(((struct sockaddr_un *)0)->sun_path) - 1, path);
    return DSPK_ELIMIT;
  }
  if (lstat(path, &st) != 0)
    return 0;
  if (!S_ISSOCK(st.st_mode)) {
    dspkd_error("%s exists and is not a socket; not replacing it", path);
    return DSPK_EINVAL;
  }
  r = socket_is_live(path);
  if (r == 1) {
    dspkd_error("another daemon is listening on %s; not replacing it", path);
    return DSPK_EBUSY;
  }
  if (r == -EPROTOTYPE) { /* bound by something else: not a stale dspkd socket */
    dspkd_error("%s is a socket of another type (not a stream socket, as dspkd's); "
                "not replacing it", path);
    return DSPK_EINVAL;
  }
  if (r != -ECONNREFUSED) {
    dspkd_error("cannot check %s: %s", path, strerror(-r));
    return DSPK_EIO;
  }
  /* A stale socket of another user is not this daemon's (a socket left in
   * a sticky directory, another daemon's): never removed (probe 20 E1). */
  if (st.st_uid != geteuid()) {
    dspkd_error("%s is a socket of uid %lu, not of this daemon's uid %lu, and nothing "
                "listens on it; not replacing it (remove it, or give another --socket)",
                path, (unsigned long)st.st_uid, (unsigned long)geteuid());
    return DSPK_EINVAL;
  }
  dspkd_info("removing stale socket %s", path);
  if (unlink(path) != 0 && errno != ENOENT) {
    dspkd_error("cannot remove stale socket %s: %s", path, strerror(errno));
    return DSPK_EIO;
  }
  return 0;
}

/* Binds the socket so that it is created with mode 0660, never wider for a
 * moment (a bind then chmod leaves the umask's mode visible in between):
 * the umask is 0117 around the bind.  The umask is the process's, and the
 * device threads already run; a file one of them creates in that window
 * gets a narrower mode than it would, never a wider one, and the daemon's
 * own files (cache database, wisdom) are read back only by the daemon. */
int dspkd_bind_0660(uv_pipe_t *p, const char *path) {
  /* Bound here and handed to libuv (uv_pipe_open), not by uv_pipe_bind,
   * whose close unlinks the path whatever file it names by then (another
   * daemon's socket, after ours was removed): dspkd_listen_stop removes
   * the file while it is still ours. */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  int fd, r;
  if (n >= sizeof sa.sun_path)
    return UV_ENAMETOOLONG;
  memcpy(sa.sun_path, path, n + 1);
  if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
    return -errno;
  mode_t old = umask(0117);
  r = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : -errno;
  umask(old);
  if (r == 0 && (r = uv_pipe_open(p, fd)) != 0)
    (void)unlink(path);
  if (r != 0)
    close(fd);
  return r;
}

/* Whether path's directory is missing, unreachable or not a directory:
 * 0, or -1 (logged as "cannot listen on PATH: ..."). */
static int socket_dir_error(const char *path) {
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  const char *slash = strrchr(path, '/');
  struct stat st;

  if (!slash || (size_t)(slash - path) >= sizeof dir)
    return 0;
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  memcpy(dir, path, n);
  dir[n] = '\0';
  if (stat(dir, &st) != 0) {
    dspkd_error("cannot listen on %s: directory %s: %s", path, dir, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    dspkd_error("cannot listen on %s: %s is not a directory", path, dir);
    return -1;
  }
  return 0;
}

int dspkd_socket_dir_check(const char *path) {
  return socket_dir_error(path);
}

/* Logs why binding path failed: for a missing or unreachable directory
 * (ENOENT, EACCES), the directory is looked at to say which it was. */
static void listen_error(const char *path, int r) {
  if ((r == UV_EACCES || r == UV_ENOENT) && socket_dir_error(path) != 0)
    return;
  dspkd_error("cannot listen on %s: %s", path, uv_strerror(r));
}

int dspkd_listen(struct dspkd *d) {
  /* Bound by the path given (relative in the foreground: see
   * d->socket_name), named absolute. */
  const char *path = d->cfg.socket_path, *name = d->socket_name[0] ? d->socket_name : path;
  int r;

  if (d->activation_fd > 0) {
    /* Socket activation (daemon/activation.c): systemd bound and listens. */
    uv_pipe_init(d->loop, &d->listener, 0);
    d->listener.data = d;
    r = uv_pipe_open(&d->listener, d->activation_fd);
    if (r == 0)
      r = listen_start(d, false);
    if (r < 0) {
      dspkd_error("cannot listen on the activated socket %s: %s", name, uv_strerror(r));
      accept_close();
      uv_close((uv_handle_t *)&d->listener, NULL);
      return DSPK_EIO;
    }
    d->listening = d->activated = true;
    dspkd_info("listening on %s (socket activation)", name);
    return 0;
  }
  /* Checked again here: another daemon may have started meanwhile. */
  r = dspkd_socket_check(path);
  if (r < 0)
    return r;
  uv_pipe_init(d->loop, &d->listener, 0);
  d->listener.data = d;
  r = dspkd_bind_0660(&d->listener, path);
  if (r == 0)
    r = listen_start(d, true);
  if (r < 0) {
    listen_error(path, r);
    accept_close();
    uv_close((uv_handle_t *)&d->listener, NULL);
    return DSPK_EIO;
  }
  d->listening = true;
  {
    struct stat st;
    if (stat(path, &st) == 0) {
      d->sock_dev = st.st_dev;
      d->sock_ino = st.st_ino;
    }
  }
  dspkd_info("listening on %s", name);
  return 0;
}

/* ---- stopping (the sequence is daemon/lifecycle.c's) ------------------- */

/* Closes what listen_start opened (the reserve descriptor too). */
static void accept_close(void) {
  if (accept_handles) {
    accept_handles = false;
    uv_close((uv_handle_t *)&listen_poll, NULL);
    uv_close((uv_handle_t *)&accept_rest, NULL);
  }
  if (reserve_fd >= 0) {
    close(reserve_fd);
    reserve_fd = -1;
  }
}

void dspkd_listen_stop(struct dspkd *d) {
  if (!d->listening)
    return;
  accept_close();
  uv_close((uv_handle_t *)&d->listener, NULL);
  d->listening = false;
  /* An activated socket's file belongs to systemd (RemoveOnStop=).  Ours
   * is removed only while the path names it: one removed meanwhile and
   * replaced (another daemon's socket, any file) is not ours to remove. */
  struct stat st;
  if (d->activated || lstat(d->cfg.socket_path, &st) != 0)
    return;
  if (!S_ISSOCK(st.st_mode) || st.st_dev != d->sock_dev || st.st_ino != d->sock_ino) {
    dspkd_info("%s is no longer this daemon's socket: left in place", d->socket_name);
    return;
  }
  if (unlink(d->cfg.socket_path) != 0 && errno != ENOENT)
    dspkd_warn("cannot remove %s: %s", d->socket_name, strerror(errno));
}

/* At the stop: answers each complete request already read but not yet
 * started (held back by the in-flight or unsent bounds) with ESHUTDOWN, so
 * no request the daemon took in goes unanswered.  Bytes still in the
 * kernel's socket buffer were never taken in; the close tells of those. */
void dspkd_conn_refuse_buffered(struct conn *c) {
  const struct dspk__limits *lim = &c->lim;
  struct rchunk *k = c->rb;
  char msg[256];

  while (!c->closing && k && k->start < k->end) {
    ssize_t n = dspk__frame_scan(k->data + k->start, k->end - k->start, lim, msg,
                                 sizeof msg);
    msgpack_object root;
    struct dspk__msg m;
    uint32_t msgid = 0;
    bool has_msgid = false;
    size_t off = 0;

    if (n <= 0)
      break;
    if (msgpack_unpack(k->data + k->start, (size_t)n, &off, &c->d->zone, &root) ==
            MSGPACK_UNPACK_SUCCESS &&
        dspk__msg_parse(&root, &m, &msgid, &has_msgid, msg, sizeof msg) == 0 &&
        m.type == DSPK__REQUEST)
      dspkd_conn_send_error(c, m.msgid, DSPK_ESHUTDOWN, "the daemon is stopping");
    msgpack_zone_clear(&c->d->zone);
    k->start += (size_t)n;
  }
}

/* The last step of the stop sequence (daemon/lifecycle.c): the transport's
 * own handles and memory. */
void dspkd_conn_handles_close(struct dspkd *d) {
  dspkd_linger_stop();
  dspkd_shm_parked_close(d);
  chunk_free(spare_chunk); /* stopping: to pinned_left when registered */
  spare_chunk = NULL;
  while (pinned_left) {
    struct rchunk *k = pinned_left;
    pinned_left = k->next_left;
    free(k);
  }
  uv_close((uv_handle_t *)&d->trim_timer, NULL);
  uv_close((uv_handle_t *)&d->hup_timer, NULL);
  uv_close((uv_handle_t *)&d->resume, NULL);
  uv_close((uv_handle_t *)&d->later, NULL);
}
