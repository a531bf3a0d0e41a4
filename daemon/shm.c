/*
 * Shared-memory buffers (docs/protocol.md, "Shared memory"): a client passes
 * a memfd over SCM_RIGHTS with a buffer.import request, or asks for one with
 * buffer.share and maps the memfd that comes with the answer.  Either way
 * the daemon maps the memory itself (MAP_SHARED, read-write) and the buffer
 * is a buffer like any other: same ids, same table, same quotas.
 *
 * Why the seals: a client that shrinks a file the daemon has mapped makes
 * the daemon's next access to the lost pages a SIGBUS.  buffer.import
 * therefore takes only a memfd sealed with F_SEAL_SHRINK (and no hugetlbfs
 * file, whose faults can SIGBUS when huge pages run out); it maps exactly
 * the bytes the request names, which the file held when it was checked and
 * must keep for good.  Growing is harmless (the mapping does not grow).
 *
 * Placement on the device (runner): a backend with import_host uses the
 * mapping itself as its block (cpu: ops read and write the client's pages
 * in place); any other keeps a block of its own and the runner copies the
 * tensors a task uses from the mapping before the task and its results back
 * after it (dspkd_shm_sync), with the mapping pinned for DMA where the
 * backend offers host_register.  The mapping is the buffer's contents
 * between tasks; buffer.write and buffer.read copy into and out of it.
 *
 * File descriptors travel on the connection's socket, which libuv opens as
 * an IPC pipe: each read may bring some (libuv queues them on the handle).
 * They are taken off the handle at once (dspkd_shm_take_fds) and kept with
 * the stream position at the end of the read that brought them; the frame
 * that starts at or after that position cannot be the one they came with,
 * so they are closed as stray before it is handled (dspkd_shm_drop_stale).
 * The kernel attaches a sendmsg's descriptors to the first part of its data
 * (about 36 KiB at most) and ends the read there at the latest, so only a
 * buffer.import frame that starts that sendmsg is sure to find its
 * descriptor (protocol.md, Passing descriptors).
 *
 * Descriptors held for clients are bounded per connection and per user
 * (docs/admin.md, "File descriptors"), so that no user can use up the
 * daemon's RLIMIT_NOFILE: at most DSPKD_MAX_FDS unclaimed on a connection
 * and DSPKD_MAX_USER_FDS on all of one uid's besides the first of each
 * (a paused connection is not read while it keeps one, daemon/conn.c: a
 * client that sends each descriptor with its buffer.import keeps at most
 * that one on each connection, however many of them are paused, and meets
 * neither bound), and DSPKD_MAX_USER_SHARES
 * buffer.share memfds of one uid whose answers it has not read (all users'
 * together: dspkd_shm_share_max).  A
 * descriptor the daemon had no descriptor left to receive (the kernel drops
 * it in recvmsg) or to keep (F_DUPFD fails) is answered ELIMIT saying so,
 * never EINVAL: the client did send it.
 *
 * Memory mappings are bounded the same way (docs/protocol.md, "Quotas",
 * max_user_maps): every imported or shared buffer is a mapping of its own
 * (even many imports of one 4 KiB memfd), and the kernel lets a process have
 * vm.max_map_count of them; at that count every later mmap, brk and thread
 * stack of the daemon fails, for every user (probe 19 H1: one user's 65536
 * imports left others ENOMEM, silent resets, no connect).  The mappings
 * made for clients' buffers are counted on their user and the daemon
 * (dspkd_maps_take, lowered by the runner once unmapped: dspkd_maps_put);
 * past max_user_maps, or past the share of vm.max_map_count the daemon
 * leaves clients (the rest its own reserve: dspkd_maps_budget), a request
 * that would make one is ELIMIT before anything is mapped.  A mapping the
 * kernel refuses all the same (ENOMEM: out of memory, or the count filled
 * by the daemon's own) is the daemon's shortage, answered as such, never
 * the client's EINVAL.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "daemon/dspkd.h"
#include "daemon/log.h"
#include "daemon/sched.h"
#include "proto/testhook.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

/* ---- file descriptors on the connection ------------------------------- */

static void free_handle(uv_handle_t *h) { free(h); }

/* Logs that a descriptor a client sent was lost because the daemon had
 * none free (err: EMFILE or ENFILE): a warning at most once a minute, the
 * rest at debug, so that a client cannot flood the log. */
static void log_lost(struct conn *c, const char *what, int err) {
  static uint64_t last_ms, unlogged;
  uint64_t now = dspkd_now_ms();
  const char *name = err == EMFILE ? "EMFILE" : "ENFILE";
  if (last_ms && now - last_ms < 60000) {
    unlogged++;
    dspkd_debug("client %llu: %s: %s (%s)", (unsigned long long)c->id, what, name,
                strerror(err));
    return;
  }
  dspkd_warn("client %llu: %s: %s (%s; %llu more since the last such line; logged at most "
             "once a minute; docs/admin.md, \"File descriptors\")", (unsigned long long)c->id,
             what, name, strerror(err), (unsigned long long)unlogged);
  last_ms = now;
  unlogged = 0;
}

/* Keeps fd (-1: lost) as the connection's next unclaimed descriptor,
 * counted for its user when the connection keeps another already (the
 * user's count is of the descriptors beyond the first of each connection:
 * dspkd.h, DSPKD_MAX_USER_FDS). */
static void fds_push(struct conn *c, int fd) {
  c->fds[c->nfds].fd = fd;
  c->fds[c->nfds].pos = c->rx_pos;
  if (c->nfds > 0 && c->user)
    c->user->nfds++;
  c->nfds++;
}

int dspkd_shm_take_fds(struct conn *c, char *msg, size_t len) {
  while (uv_pipe_pending_count(&c->pipe) > 0) {
    uv_pipe_t *tmp = malloc(sizeof(*tmp));
    uv_os_fd_t ofd;
    int fd = -1, dup_err = 0;

    if (!tmp) {
      snprintf(msg, len, "cannot take a file descriptor (out of memory)");
      return DSPK_ENOMEM;
    }
    /* libuv hands a received descriptor out only through a handle: accept
     * it into a pipe, keep a duplicate, and let the handle close its own. */
    uv_pipe_init(c->d->loop, tmp, 0);
    if (uv_accept((uv_stream_t *)&c->pipe, (uv_stream_t *)tmp) == 0 &&
        uv_fileno((uv_handle_t *)tmp, &ofd) == 0) {
      fd = fcntl(ofd, F_DUPFD_CLOEXEC, 0);
      dup_err = fd < 0 ? errno : 0;
    } else {
      dup_err = EBADF;
    }
    uv_close((uv_handle_t *)tmp, free_handle);
    if (c->nfds == DSPKD_MAX_FDS) {
      if (fd >= 0)
        close(fd);
      snprintf(msg, len, "more than %d file descriptors not claimed by a buffer.import",
               DSPKD_MAX_FDS);
      return DSPK_ELIMIT;
    }
    if (c->nfds > 0 && c->user && c->user->nfds >= DSPKD_MAX_USER_FDS) {
      if (fd >= 0)
        close(fd);
      snprintf(msg, len, "more than %d file descriptors not claimed by a buffer.import "
               "on this user's connections together (besides the first on each)",
               DSPKD_MAX_USER_FDS);
      return DSPK_ELIMIT;
    }
    if (fd < 0 && (dup_err == EMFILE || dup_err == ENFILE)) {
      /* The descriptor came, but the daemon has none left to keep it:
       * the buffer.import it came with is told so (dspkd_m_buffer_import). */
      log_lost(c, "a file descriptor it sent is lost, the daemon has none left to keep it",
               dup_err);
      fds_push(c, -1);
      continue;
    }
    if (fd < 0) {
      snprintf(msg, len, "cannot take a file descriptor (%s)", strerror(dup_err));
      return DSPK_ENOMEM;
    }
    fds_push(c, fd);
  }
  return 0;
}

static void fds_shift(struct conn *c) {
  memmove(&c->fds[0], &c->fds[1], (size_t)(c->nfds - 1) * sizeof(c->fds[0]));
  c->nfds--;
  if (c->nfds > 0 && c->user) /* the one left first is the connection's own */
    c->user->nfds--;
}

void dspkd_shm_drop_stale(struct conn *c) { dspkd_shm_drop_upto(c, c->frame_pos); }

void dspkd_shm_drop_upto(struct conn *c, uint64_t pos) {
  while (c->nfds > 0 && c->fds[0].pos <= pos) {
    dspkd_debug("client %llu: closing a file descriptor no buffer.import claimed",
                (unsigned long long)c->id);
    if (c->fds[0].fd >= 0)
      close(c->fds[0].fd);
    fds_shift(c);
  }
}

void dspkd_shm_import_refused(struct conn *c) {
  if (c->nfds == 0)
    return;
  if (c->fds[0].fd >= 0)
    close(c->fds[0].fd);
  fds_shift(c);
}

void dspkd_shm_conn_closed(struct conn *c) {
  while (c->nfds > 0) {
    if (c->fds[0].fd >= 0)
      close(c->fds[0].fd);
    fds_shift(c);
  }
}

/* ---- buffer.share's descriptors until the client reads them ------------

 * The memfd of a buffer.share answer counts from the request until the
 * client has read the answer: a descriptor written to the socket is in
 * flight in the client's receive queue, which the kernel charges to the
 * daemon's user; once that user has RLIMIT_NOFILE descriptors in flight
 * every sendmsg with one fails (ETOOMANYREFS), whoever it is for.  The
 * daemon cannot see a client read, but it sees that a socket's send queue is
 * empty (SIOCOUTQ 0: every byte written to it was read, each answer's
 * descriptor with it, or the client closed its end, which drops them): a
 * connection's written descriptors (c->fds_written) stop counting then.
 * They are looked at when a count is at its bound (settle).  A connection
 * the daemon closes first (an end of stream, a protocol error) leaves its
 * unread descriptors in the client's socket: a duplicate of its socket is
 * kept ("parked", its sending side shut) and they count on its user until
 * the client has read them or closed its end (looked at by settle, and at
 * the parked socket's hangup).  A parked socket is one of the daemon's
 * descriptors: there are at most as many as memfds counted, which
 * dspkd_shm_share_max bounds within RLIMIT_NOFILE. */

struct dspkd_parked {
  uv_poll_t poll;
  int fd;                    /* the duplicate, closed after the poll handle */
  struct dspkd *d;
  struct duser *user;
  size_t n;                  /* descriptors it holds counted */
  bool closing;
  struct dspkd_parked *prev, *next;
};

static void count_user(struct dspkd *d, struct duser *u, ssize_t delta) {
  d->share_fds += (size_t)delta;
  if (u)
    u->share_fds += (size_t)delta;
}

void dspkd_shm_share_count(struct conn *c, int delta) {
  c->share_fds += (size_t)(ssize_t)delta;
  count_user(c->d, c->user, delta);
}

void dspkd_shm_fd_written(struct conn *c) { c->fds_written++; }

/* Whether every byte written to socket fd was read by its peer, or its
 * peer closed its end (which drops what it did not read, the descriptors
 * with it). */
static bool all_read(int fd) {
  int n = -1;
  return ioctl(fd, SIOCOUTQ, &n) == 0 && n == 0;
}

static void conn_settle(struct conn *c) {
  uv_os_fd_t fd;
  if (c->fds_written && uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 && all_read(fd)) {
    c->share_fds -= c->fds_written;
    count_user(c->d, c->user, -(ssize_t)c->fds_written);
    c->fds_written = 0;
  }
}

static void on_parked_closed(uv_handle_t *h) {
  struct dspkd_parked *p = h->data;
  struct duser *u = p->user;
  struct dspkd *d = p->d;
  close(p->fd); /* a uv_poll_t leaves its descriptor open */
  count_user(d, u, -(ssize_t)p->n);
  free(p);
  dspkd_user_gc(d, u);
}

static void parked_end(struct dspkd_parked *p) {
  if (p->closing)
    return;
  p->closing = true;
  if (p->prev)
    p->prev->next = p->next;
  else
    p->d->parked = p->next;
  if (p->next)
    p->next->prev = p->prev;
  uv_close((uv_handle_t *)&p->poll, on_parked_closed);
}

/* Both sides of the parked socket are shut: the client closed its end (its
 * unread answers gone with it), or only shut its sending side (then the
 * hangup stays: no more polling, settle looks at it when it counts). */
static void on_parked_hup(uv_poll_t *h, int status, int events) {
  struct dspkd_parked *p = h->data;
  (void)status;
  (void)events;
  if (all_read(p->fd))
    parked_end(p);
  else
    uv_poll_stop(&p->poll);
}

/* Looks again at the descriptors written and not yet read of user u's
 * connections (every user's: u NULL), and ends the parked sockets whose
 * client has read them or is gone. */
static void settle(struct dspkd *d, struct duser *u) {
  for (struct conn *c = d->conns; c; c = c->next)
    if ((!u || c->user == u) && !c->closing)
      conn_settle(c);
  for (struct dspkd_parked *p = d->parked, *next; p; p = next) {
    next = p->next;
    if ((!u || p->user == u) && all_read(p->fd))
      parked_end(p);
  }
}

void dspkd_shm_conn_park(struct conn *c) {
  struct dspkd *d = c->d;
  struct dspkd_parked *p;
  uv_os_fd_t fd;
  int dfd = -1;

  /* Answers libuv is still writing whose descriptor went out with their
   * first bytes (libuv clears send_handle then): out, though the rest of
   * the answer is never written now.  The others are never sent. */
  for (struct wreq *wr = c->fd_writes; wr; wr = wr->fd_next)
    if (wr->req.send_handle == NULL && wr->share_conn == c) {
      wr->share_conn = NULL;
      c->fds_written++;
    }
  conn_settle(c);
  if (!c->fds_written)
    return;
  if (!d->stopping && uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 &&
      (p = calloc(1, sizeof(*p))) != NULL) {
    if ((dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
        uv_poll_init(d->loop, &p->poll, dfd) == 0) {
      /* The client reads what is queued to it, then its end of stream. */
      (void)shutdown(dfd, SHUT_WR);
      p->poll.data = p;
      p->fd = dfd;
      p->d = d;
      p->user = c->user;
      p->n = c->fds_written;
      c->share_fds -= c->fds_written; /* the user's and the daemon's stay */
      c->fds_written = 0;
      p->next = d->parked;
      if (d->parked)
        d->parked->prev = p;
      d->parked = p;
      if (uv_poll_start(&p->poll, UV_DISCONNECT, on_parked_hup) != 0)
        parked_end(p);
      dspkd_debug("client %llu: closed with %zu buffer.share descriptors not yet read: "
                  "they count for its user until read", (unsigned long long)c->id, p->n);
      return;
    }
    if (dfd >= 0)
      close(dfd);
    free(p);
  }
  /* Stopping, or no memory or descriptor to keep it: no longer counted. */
  c->share_fds -= c->fds_written;
  count_user(d, c->user, -(ssize_t)c->fds_written);
  c->fds_written = 0;
}

void dspkd_shm_parked_close(struct dspkd *d) {
  while (d->parked)
    parked_end(d->parked);
}

uint64_t dspkd_shm_share_max(const struct dspkd *d) {
  struct rlimit rl;
  uint64_t need = dspkd_fds_need(&d->cfg);
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return UINT64_MAX;
  if ((uint64_t)rl.rlim_cur < need + DSPKD_MAX_USER_SHARES)
    return DSPKD_MAX_USER_SHARES;
  return (uint64_t)rl.rlim_cur - need;
}

void dspkd_shm_answer_failed(struct conn *c, struct wreq *wr, int status) {
  static uint64_t last_ms, unlogged;
  uint64_t now = dspkd_now_ms();
  uint32_t msgid = wr->fd_msgid;
  struct dbuf *b;
  char msg[256];
  int code = DSPK_ELIMIT;

  if (status == -ETOOMANYREFS) {
    snprintf(msg, sizeof msg, "buffer.share: the daemon cannot pass the memfd now: its "
             "user has as many descriptors in flight to clients that have not read them "
             "as its RLIMIT_NOFILE allows (ETOOMANYREFS): try again later");
  } else if (status == UV_ENOMEM) {
    code = DSPK_ENOMEM;
    snprintf(msg, sizeof msg, "buffer.share: out of memory to send the memfd");
  } else {
    code = DSPK_EIO;
    snprintf(msg, sizeof msg, "buffer.share: the memfd cannot be sent: %s", strerror(-status));
  }
  /* The memfd goes with wr; the buffer, which the client cannot know of
   * without the answer, goes too. */
  if (wr->fd_buf && (b = dspkd_conn_buf_remove(c, wr->fd_buf)) != NULL)
    dspkd_dbuf_unref(c->d, b);
  dspkd_wreq_free(wr);
  if (last_ms && now - last_ms < 60000) {
    unlogged++;
    dspkd_debug("client %llu: #%u: %s", (unsigned long long)c->id, msgid, msg);
  } else {
    dspkd_warn("client %llu (pid %ld): buffer.share #%u answered %s: %s (%llu more since "
               "the last such line; logged at most once a minute; docs/admin.md, \"File "
               "descriptors\")", (unsigned long long)c->id, (long)c->pid, msgid,
               dspk__err_name(code), msg, (unsigned long long)unlogged);
    last_ms = now;
    unlogged = 0;
  }
  dspkd_conn_send_error(c, msgid, code, msg);
}

/* ---- the methods ------------------------------------------------------ */

#define fail(r, code, ...) dspk__fail((r)->msg, sizeof (r)->msg, (code), __VA_ARGS__)

/* ---- memory mappings of clients' buffers ------------------------------- */

bool dspkd_maps_needed(const struct device *dev, uint64_t size, bool shared) {
  return shared || (strcmp(dev->be->name, "cpu") == 0 && size >= DSPKD_CPU_MAP_MIN);
}

void dspkd_log_shortage(struct dspkd_ratelog *rl, const struct conn *c, const char *what,
                        const char *section) {
  uint64_t now = dspkd_now_ms();
  if (rl->last_ms && now - rl->last_ms < 60000) {
    rl->unlogged++;
    dspkd_debug("client %llu: %s", (unsigned long long)c->id, what);
    return;
  }
  dspkd_warn(DSPKD_PEER_FMT ": %s (%llu more since the last such line; logged at most once a "
             "minute; docs/admin.md, \"%s\")", DSPKD_PEER_ARGS(c), what,
             (unsigned long long)rl->unlogged, section);
  rl->last_ms = now;
  rl->unlogged = 0;
}

static struct dspkd_ratelog maps_shortage; /* the loop thread's */

static void log_shortage(struct conn *c, const char *what) {
  dspkd_log_shortage(&maps_shortage, c, what, "Memory mappings");
}

int dspkd_maps_check(struct req *r, const char *method) {
  struct conn *c = r->c;
  struct dspkd *d = c->d;
  uint64_t all = atomic_load(&d->client_maps), lim = d->cfg.max_user_maps;
  uint64_t mine = c->user ? atomic_load(&c->user->maps) : 0;
  char what[320];

  if (c->user && mine >= lim)
    return fail(r, DSPK_ELIMIT, "%s: this user's buffers hold %" PRIu64 " memory mapping%s "
                "of the daemon, at most %" PRIu64 " (max_user_maps; each imported or shared "
                "buffer takes one, and each cpu buffer of 2 MiB and up): free some first",
                method, mine, mine == 1 ? "" : "s", lim);
  if (all >= d->cfg.maps_clients) {
    snprintf(what, sizeof what, "%s: refused: the buffers of all users hold %" PRIu64
             " memory mappings, the share of vm.max_map_count %" PRIu64 " the daemon "
             "leaves them", method, all, d->cfg.max_map_count);
    log_shortage(c, what);
    r->logged = true;
    return fail(r, DSPK_ELIMIT, "%s: the daemon has no memory mapping left for clients' "
                "buffers (all users' buffers hold %" PRIu64 ", what vm.max_map_count %" PRIu64
                " leaves them): not this client's fault, try again later", method, all,
                d->cfg.max_map_count);
  }
  return 0;
}

void dspkd_maps_take(struct conn *c, struct dbuf *b) {
  if (!c->user)
    return;
  b->map_user = c->user;
  atomic_fetch_add(&c->user->maps, 1);
  atomic_fetch_add(&c->d->client_maps, 1);
}

void dspkd_maps_put(struct dspkd *d, struct dbuf *b) {
  struct duser *u = b->map_user;
  if (!u)
    return;
  b->map_user = NULL;
  atomic_fetch_sub(&d->client_maps, 1);
  atomic_fetch_sub(&u->maps, 1); /* the last touch: the loop may free u after it */
}

void dspkd_shm_report_maps(const struct dspkd_config *cfg) {
  dspkd_info("memory mappings: vm.max_map_count %" PRIu64 ", of which clients' buffers may "
             "take %" PRIu64 " (the rest is the daemon's reserve), one user's %" PRIu64
             " (max_user_maps)", cfg->max_map_count, cfg->maps_clients, cfg->max_user_maps);
}

/* The answer to a mapping the kernel refused (err: mmap's errno) of what
 * (the method): the client's fault (EACCES: a descriptor opened read-only;
 * EPERM: a memfd sealed against writing) is EINVAL with the remedy
 * (client_fault, NULL for buffer.share, whose memfd is the daemon's); any
 * other (ENOMEM: out of memory or of mappings, EAGAIN, ENFILE) is the
 * daemon's shortage, ENOMEM, logged. */
static int map_failed(struct req *r, const char *what, int err, const char *client_fault) {
  char line[256];
  if (client_fault && (err == EACCES || err == EPERM))
    return fail(r, DSPK_EINVAL, "%s: cannot map the memfd read-write (%s): %s", what,
                strerror(err), client_fault);
  snprintf(line, sizeof line, "%s: mmap of the memfd failed: %s", what, strerror(err));
  log_shortage(r->c, line);
  r->logged = true;
  return fail(r, DSPK_ENOMEM, "%s: the daemon cannot map the memfd (%s: it is out of memory "
              "or of memory mappings, vm.max_map_count): not this client's fault, try again "
              "later", what, strerror(err));
}

/* The arguments both methods take: {device?: "cpu:0", size}. */
static int shm_args(struct req *r, const char *what, struct device **dev, uint64_t *size) {
  char devname[48] = "cpu:0";
  int err;

  if ((err = dspk__arg_str(r->args, "device", devname, sizeof devname, r->msg,
                           sizeof r->msg)))
    return err;
  if (dspk__obj_u64(dspk__map_get(r->args, "size"), size) != 0)
    return fail(r, DSPK_EINVAL, "size: expected " DSPK__EXPECT_BYTES);
  if (*size == 0)
    return fail(r, DSPK_EINVAL, "%s: size must be at least 1 byte", what);
  if (!(*dev = dspkd_resolve_device(r, devname, &err)))
    return err; /* as buffer.create: the connection's Slurm job's devices */
  return dspkd_buffer_fits(r, *dev, *size);
}

void dspkd_shm_report_pages(void) {
  char line[256], *a, *b;
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
  if (!f)
    return; /* no transparent huge pages in this kernel */
  if (fgets(line, sizeof line, f) && (a = strchr(line, '[')) && (b = strchr(a, ']'))) {
    *b = '\0';
    if (strcmp(a + 1, "never") == 0 || strcmp(a + 1, "deny") == 0)
      dspkd_info("shared memory: 4 KiB pages (transparent_hugepage/shmem_enabled is %s); "
                 "\"advise\" lets shared buffers ask for 2 MiB pages (docs/admin.md)", a + 1);
    else
      dspkd_debug("shared memory: transparent_hugepage/shmem_enabled is %s", a + 1);
  }
  fclose(f);
}

/* Queues the create job of a shared buffer over the mapping host and, for
 * buffer.share, the memfd that goes with the answer (dspkd_buffer_submit,
 * which takes both). */
static int shm_submit(struct req *r, struct device *dev, uint64_t size, void *host,
                      const struct stat *file, int share_fd) {
  /* Huge pages where the system allows them for shared memory
   * (transparent_hugepage/shmem_enabled "advise"): ops striding through a
   * large operand miss the TLB far less (docs/performance.md). */
  (void)madvise(host, (size_t)size, MADV_HUGEPAGE);
  return dspkd_buffer_submit(r, dev, size, host, file, share_fd);
}

/* Whether the daemon is out of descriptors now: EMFILE or ENFILE (a
 * duplicate of the connection's socket cannot be made), else 0. */
static int fds_exhausted(struct conn *c) {
  uv_os_fd_t sfd;
  int fd;
  if (uv_fileno((uv_handle_t *)&c->pipe, &sfd) != 0)
    return 0;
  fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0);
  if (fd >= 0) {
    close(fd);
    return 0;
  }
  return errno == EMFILE || errno == ENFILE ? errno : 0;
}

/* ---- what a descriptor sent to buffer.import is ------------------------ */

/* Filesystem magic numbers (statfs(2)) the messages name. */
#define TMPFS_MAGIC_ 0x01021994UL
static const struct {
  unsigned long magic;
  const char *name;
} fs_names[] = {
    {TMPFS_MAGIC_, "tmpfs"},      {HUGETLBFS_MAGIC, "hugetlbfs"}, {0xEF53, "ext2/ext3/ext4"},
    {0x58465342, "xfs"},          {0x9123683E, "btrfs"},          {0x794c7630, "overlayfs"},
    {0x65735546, "fuse"},         {0x6969, "nfs"},                {0x9fa0, "proc"},
    {0x62656572, "sysfs"},        {0x858458f6, "ramfs"},          {0x5345434d, "secretmem"},
    {0x50494446, "pidfs"},        {0x6e736673, "nsfs"},
};

/* The /proc/self/fd link of fd into buf ("" when /proc cannot say). */
static void fd_link(int fd, char *buf, size_t size) {
  char path[40];
  ssize_t n;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  n = readlink(path, buf, size - 1);
  buf[n > 0 ? n : 0] = '\0';
}

/* Whether the regular file fd (stat st, on a filesystem of magic fs) is a
 * memfd.  memfd_create(2) documents the mark: the /proc/self/fd link of a
 * memfd reads "/memfd:NAME".  A tmpfs file reachable by a path (a POSIX
 * shm_open or /dev/shm file, which F_GET_SEALS answers as it does a memfd)
 * would show the same only in a tmpfs mounted at "/", so a memfd must also
 * lie where every memfd does and no path leads: the kernel's own shmem
 * mount, whose device is that of a memfd the daemon makes (once: every
 * non-hugetlb memfd shares it), or, for MFD_HUGETLB, a hugetlbfs.  Without
 * /proc the device decides alone; without a memfd of the daemon's own (no
 * descriptor free) the link does.  Only messages depend on the answer: what
 * is refused is decided by the seals. */
static bool is_memfd(int fd, const struct stat *st, unsigned long fs) {
  static dev_t memfd_dev;
  static bool known;
  char link[16];
  bool named;

  fd_link(fd, link, sizeof link);
  named = strncmp(link, "/memfd:", 7) == 0;
  if (fs == HUGETLBFS_MAGIC)
    return named;
  if (fs != TMPFS_MAGIC_ || !S_ISREG(st->st_mode))
    return false;
  if (!known) {
    struct stat own;
    int mfd = memfd_create("dspk-probe", MFD_CLOEXEC);
    if (mfd >= 0 && fstat(mfd, &own) == 0) {
      memfd_dev = own.st_dev;
      known = true;
    }
    if (mfd >= 0)
      close(mfd);
  }
  if (known && st->st_dev != memfd_dev)
    return false;
  return named || (known && link[0] == '\0');
}

/* What fd is, in a few words for a message ("a pipe", "a regular file on
 * ext2/ext3/ext4", "a memfd", "an O_PATH descriptor of a memfd", ...), into
 * buf; fl is its F_GETFL.  Returns whether it is a memfd (is_memfd). */
static bool fd_describe(int fd, int fl, char *buf, size_t size) {
  struct statfs sfs;
  struct stat st;
  char link[64];
  const char *path = (fl >= 0 && (fl & O_PATH)) ? "an O_PATH descriptor of " : "";
  unsigned long fs = fstatfs(fd, &sfs) == 0 ? (unsigned long)sfs.f_type : 0;

  if (fstat(fd, &st) != 0) {
    snprintf(buf, size, "a descriptor fstat cannot read (%s)", strerror(errno));
    return false;
  }
  fd_link(fd, link, sizeof link);
  if (strncmp(link, "anon_inode:", 11) == 0) {
    /* "anon_inode:[eventfd]", "anon_inode:inotify": the kind, in the
     * kernel's words (only its letters are copied). */
    size_t n = 0;
    for (const char *p = link + 11; *p && n < 24; p++)
      if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '_' || *p == '-' || *p == '.')
        link[n++] = *p;
    link[n] = '\0';
    snprintf(buf, size, "%san anonymous-inode descriptor (%s)", path, n ? link : "?");
    return false;
  }
  switch (st.st_mode & S_IFMT) {
  case S_IFIFO: snprintf(buf, size, "%sa pipe or FIFO", path); return false;
  case S_IFSOCK: snprintf(buf, size, "%sa socket", path); return false;
  case S_IFDIR: snprintf(buf, size, "%sa directory", path); return false;
  case S_IFCHR:
  case S_IFBLK:
    snprintf(buf, size, "%sa %s device (%u:%u)", path, S_ISCHR(st.st_mode) ? "character" : "block",
             major(st.st_rdev), minor(st.st_rdev));
    return false;
  case S_IFLNK: snprintf(buf, size, "%sa symbolic link", path); return false;
  case S_IFREG: break;
  default:
    snprintf(buf, size, "%sa descriptor of file type 0%o", path, (unsigned)(st.st_mode & S_IFMT));
    return false;
  }
  if (is_memfd(fd, &st, fs)) {
    snprintf(buf, size, "%sa %smemfd", path, fs == HUGETLBFS_MAGIC ? "hugetlb " : "");
    return true;
  }
  for (size_t i = 0; i < sizeof fs_names / sizeof fs_names[0]; i++)
    if (fs_names[i].magic == fs) {
      snprintf(buf, size, "%sa regular file on %s%s", path, fs_names[i].name,
               fs == TMPFS_MAGIC_ ? " (a POSIX shm_open or /dev/shm file)" : "");
      return false;
    }
  snprintf(buf, size, "%sa regular file on a filesystem of magic 0x%lx", path, fs);
  return false;
}

/* The refusal of a descriptor buffer.import cannot take as it is: an
 * O_PATH one, one F_GET_SEALS fails on (seals < 0, its errno seal_err),
 * one without F_SEAL_SHRINK, or a hugetlbfs file.  Each message names what
 * the descriptor is (fd_describe) and what to send instead. */
static int import_refusal(struct req *r, int fd, int fl, int seals, int seal_err,
                          bool hugetlb) {
  char what[160];
  bool memfd = fd_describe(fd, fl, what, sizeof what);

  if (fl >= 0 && (fl & O_PATH))
    return fail(r, DSPK_EINVAL, "buffer.import: the file descriptor is %s, which gives no "
                "access to its contents: send %s", what, memfd ? "the memfd itself, opened "
                "read-write" : "a memfd (memfd_create with MFD_ALLOW_SEALING, sealed with "
                "F_SEAL_SHRINK)");
  if (!memfd && (seals < 0 || !(seals & F_SEAL_SHRINK)))
    return fail(r, DSPK_EINVAL, "buffer.import: the file descriptor is %s, not a memfd: "
                "send one made with memfd_create(name, MFD_ALLOW_SEALING) and sealed with "
                "F_SEAL_SHRINK", what);
  if (hugetlb)
    return fail(r, DSPK_EINVAL, "buffer.import: the file descriptor is %s: hugetlbfs memory "
                "is refused (a fault without a free huge page is a SIGBUS)", what);
  if (seals < 0)
    return fail(r, DSPK_EINVAL, "buffer.import: the file descriptor is %s, and F_GET_SEALS "
                "fails on it (%s)", what, strerror(seal_err));
  if (seals & F_SEAL_SEAL) /* a memfd made without MFD_ALLOW_SEALING starts so */
    return fail(r, DSPK_EINVAL, "buffer.import: the memfd is not sealed against "
                "shrinking and can take no seal (made without MFD_ALLOW_SEALING, or "
                "F_SEAL_SEAL set): make it with MFD_ALLOW_SEALING and add F_SEAL_SHRINK");
  return fail(r, DSPK_EINVAL, "buffer.import: the memfd is not sealed against "
              "shrinking: add F_SEAL_SHRINK (fcntl F_ADD_SEALS) before sending it");
}

int dspkd_m_buffer_import(struct req *r) {
  struct conn *c = r->c;
  struct device *dev;
  struct statfs sfs;
  struct stat st;
  uint64_t size;
  void *host;
  int fd, fl, seals, seal_err, err;
  bool hugetlb;

  if (c->nfds == 0 && (err = fds_exhausted(c))) {
    /* The kernel drops the descriptors of a message the daemon has no
     * descriptor free to receive: the client did send one. */
    log_lost(c, "buffer.import: no file descriptor came with it and the daemon has none "
             "free (the kernel drops the descriptors it cannot pass on)", err);
    return fail(r, DSPK_ELIMIT, "buffer.import: the daemon had no file descriptor left "
                "to receive the memfd (%s): try again later", err == EMFILE ? "EMFILE"
                : "ENFILE");
  }
  if (c->nfds == 0)
    return fail(r, DSPK_EINVAL, "buffer.import: no file descriptor came with this request "
                "(send one memfd with SCM_RIGHTS in a sendmsg whose data starts with "
                "this request)");
  fd = c->fds[0].fd;
  fds_shift(c);
  if (fd < 0)
    return fail(r, DSPK_ELIMIT, "buffer.import: the daemon had no file descriptor left "
                "to receive the memfd (EMFILE): try again later");
  if ((err = shm_args(r, "buffer.import", &dev, &size)))
    goto out;
  /* Seals decide what is taken (a memfd sealed against shrinking, on no
   * hugetlbfs); what the descriptor is only words the refusal. */
  fl = fcntl(fd, F_GETFL);
  seals = fcntl(fd, F_GET_SEALS);
  seal_err = errno;
  hugetlb = fstatfs(fd, &sfs) == 0 && (unsigned long)sfs.f_type == HUGETLBFS_MAGIC;
  if ((fl >= 0 && (fl & O_PATH)) || seals < 0 || !(seals & F_SEAL_SHRINK) || hugetlb) {
    err = import_refusal(r, fd, fl, seals, seal_err, hugetlb);
    goto out;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    err = fail(r, DSPK_EINVAL, "buffer.import: the file descriptor is not a regular file");
    goto out;
  }
  if ((uint64_t)st.st_size < size) {
    err = fail(r, DSPK_EINVAL, "buffer.import: the memfd has %lld byte%s, fewer than size "
               "%" PRIu64, (long long)st.st_size, st.st_size == 1 ? "" : "s", size);
    goto out;
  }
  if ((err = dspkd_maps_check(r, "buffer.import")))
    goto out;
  host = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (host == MAP_FAILED) {
    err = map_failed(r, "buffer.import", errno,
                     "open it O_RDWR and do not seal it against writing");
    goto out;
  }
  err = shm_submit(r, dev, size, host, &st, -1);
out:
  close(fd);
  return err;
}

int dspkd_m_buffer_share(struct req *r) {
  struct device *dev;
  struct stat st;
  uint64_t size, max;
  void *host;
  int fd, err;

  if ((err = shm_args(r, "buffer.share", &dev, &size)))
    return err;
  if (r->c->user && r->c->user->share_fds >= DSPKD_MAX_USER_SHARES)
    settle(r->c->d, r->c->user);
  if (r->c->user && r->c->user->share_fds >= DSPKD_MAX_USER_SHARES)
    return fail(r, DSPK_ELIMIT, "buffer.share: this user has %d shared memfds whose "
                "answers it has not read (at most %d: read the answers first)",
                DSPKD_MAX_USER_SHARES, DSPKD_MAX_USER_SHARES);
  if ((uint64_t)r->c->d->share_fds >= (max = dspkd_shm_share_max(r->c->d)))
    settle(r->c->d, NULL);
  if ((uint64_t)r->c->d->share_fds >= max)
    return fail(r, DSPK_ELIMIT, "buffer.share: the users of this daemon together have "
                "%zu shared memfds whose answers they have not read (at most %" PRIu64
                ", what the daemon's RLIMIT_NOFILE leaves): try again later",
                r->c->d->share_fds, max);
  if ((err = dspkd_maps_check(r, "buffer.share")))
    return err;
  const char *no_memfd = DSPK_TEST_HOOK("DSPKD_TEST_MEMFD_ERRNO");
  if (no_memfd) {
    fd = -1;
    errno = atoi(no_memfd);
  } else {
    fd = memfd_create("dspk-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  }
  if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
    /* The daemon's shortage, as buffer.import's: a warning at most once a
     * minute (probe 19 I1: logged nothing, in words of its own). */
    int e = errno;
    log_lost(r->c, "buffer.share: the daemon has no file descriptor free for the memfd", e);
    return fail(r, DSPK_ELIMIT, "buffer.share: the daemon had no file descriptor left for "
                "the memfd (%s): try again later", e == EMFILE ? "EMFILE" : "ENFILE");
  }
  if (fd < 0 && errno == ENOMEM)
    return fail(r, DSPK_ENOMEM, "buffer.share: the daemon has no memory for the memfd "
                "(memfd_create: %s): not this client's fault, try again later", strerror(errno));
  if (fd < 0) {
    /* No memfds in the daemon (a seccomp filter of the service, an old
     * kernel): nothing a client can change, and no lack of memory (probe
     * 23 B: it said ENOMEM); the administrator learns it from the log. */
    static bool warned; /* once: no client floods the log with it */
    int e = errno;
    if (!warned)
      dspkd_warn("client %llu: buffer.share: the daemon cannot make memfds (memfd_create: %s): "
                 "check the service's system call filter (said once)",
                 (unsigned long long)r->c->id, strerror(e));
    warned = true;
    return fail(r, DSPK_ENOTSUP, "buffer.share: shared memory is unavailable to the daemon "
                "(memfd_create: %s): use buffer.create with buffer.write and buffer.read",
                strerror(e));
  }
  if (ftruncate(fd, (off_t)size) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      fstat(fd, &st) != 0) {
    err = fail(r, DSPK_ENOMEM, "buffer.share: cannot size the memfd: %s", strerror(errno));
    close(fd);
    return err;
  }
  host = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (host == MAP_FAILED) {
    err = map_failed(r, "buffer.share", errno, NULL);
    close(fd);
    return err;
  }
  return shm_submit(r, dev, size, host, &st, fd);
}

/* ---- the runner's side ------------------------------------------------ */

/* MADV_POPULATE_WRITE over the runs of pages of [p, p + n) that mincore
 * finds resident (in the memfd's page cache), in windows of 64 Ki pages. */
static void populate_resident(void *p, size_t n) {
  const size_t win = (size_t)1 << 16;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = (n + pg - 1) / pg;
  unsigned char *vec = malloc(np < win ? np : win);
  if (!vec)
    return;
  for (size_t w0 = 0; w0 < np; w0 += win) {
    size_t wn = np - w0 < win ? np - w0 : win;
    char *base = (char *)p + w0 * pg;
    size_t len = w0 + wn == np ? n - w0 * pg : wn * pg;
    if (mincore(base, len, vec) != 0)
      break;
    for (size_t i = 0; i < wn;) {
      if (!(vec[i] & 1)) {
        i++;
        continue;
      }
      size_t j = i;
      while (j < wn && (vec[j] & 1))
        j++;
      size_t end = j * pg < len ? j * pg : len;
      (void)madvise(base + i * pg, end - i * pg, MADV_POPULATE_WRITE);
      i = j;
    }
  }
  free(vec);
}

int dspkd_shm_create(struct device *dev, struct dbuf *b) {
  const struct dspk__backend *be = dev->be;
  int err = DSPK_ENOTSUP;

  /* Map the pages the memfd has now, in one call per run of them on the
   * runner, rather than one fault per 4 KiB page when a task first reads
   * it (a reduce of 256 MiB in a client's memfd: 367 ms of page faults
   * against 17 ms of work on the development VM).  Only those: a page the
   * memfd lacks would be allocated (a client's sparse memfd made whole in
   * the daemon's memory, a fresh buffer.share's every page at once, on the
   * runner); those come as they are written.  Older kernels lack the
   * advice: then pages fault as before. */
  populate_resident(b->host, (size_t)b->size);

  /* Test hook (proto/testhook.h): DSPKD_TEST_SHM_STAGED=1 takes the staged
   * path (a block of the device's own plus copies, as on cuda) on every
   * backend, so CI runs it on the cpu. */
  static int staged = -1;
  if (staged < 0) {
    const char *e = DSPK_TEST_HOOK("DSPKD_TEST_SHM_STAGED");
    staged = e && strcmp(e, "1") == 0;
  }
  if (be->import_host && !staged)
    err = be->import_host(dev->bdev, b->host, (size_t)b->size, &b->mem);
  if (err == 0) {
    b->host_direct = true;
    return 0;
  }
  if (err != DSPK_ENOTSUP)
    return err;
  if ((err = be->alloc(dev->bdev, (size_t)b->size, &b->mem)) < 0)
    return err;
  if (be->host_register && be->host_register(dev->bdev, b->host, (size_t)b->size) == 0)
    b->host_registered = true;
  return 0;
}

void dspkd_shm_release(struct device *dev, struct dbuf *b) {
  if (b->host_registered && dev->be->host_unregister)
    dev->be->host_unregister(dev->bdev, b->host);
  b->host_registered = false;
  if (b->host)
    munmap(b->host, (size_t)b->size);
  b->host = NULL;
  if (b->share_fd >= 0)
    close(b->share_fd);
  b->share_fd = -1;
}

int dspkd_shm_sync(struct device *dev, struct dbuf *b, uint64_t off, size_t n,
                   bool to_dev) {
  char *p = (char *)b->host + off;
  if (!b->host || b->host_direct || n == 0)
    return 0;
  return to_dev ? dev->be->write(dev->bdev, b->mem, (size_t)off, p, n)
                : dev->be->read(dev->bdev, b->mem, (size_t)off, p, n);
}
