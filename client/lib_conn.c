/*
 * libdspkclient's connection layer: connecting and saying hello, sending
 * request frames with one writev-style sendmsg over the wbuf's segments (so
 * tensor payloads go from the caller's memory straight to the socket), and
 * receiving response frames with blocking reads.  Every received frame is
 * checked by dspk__frame_scan() before msgpack-c unpacks it.  Responses are
 * matched to requests by msgid; a response that arrives while the caller
 * waits for another request is kept until its own wait.  Notifications are
 * handled on the way: task.progress goes to the progress callback,
 * protocol.error records why the daemon is about to close the connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/lib_internal.h"
#include "proto/schema.h"
#include "proto/utf8.h"
#include "proto/sockpath.h"
#include "proto/units.h"

#ifndef DSPK_VERSION_STRING
#define DSPK_VERSION_STRING "0.0.0"
#endif

#define RBUF_MIN (64 * 1024)
/* A task.run result from this size on is received into its own memory. */
#define LAND_MIN (64 * 1024)
/* SO_SNDBUF asked for on the socket (dspk_connect). */
#define SOCK_SNDBUF (1 << 20)

static _Thread_local char connect_err[512];

int dspk__cerr(dspk_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  dspk__vformat(c->err, sizeof(c->err), fmt, ap);
  va_end(ap);
  if (!c->err[0] && code < 0) /* an empty reason (the daemon's, a decoder's) */
    snprintf(c->err, sizeof c->err, "%s", dspk__strerror(code));
  return code;
}

int dspk__argerr(dspk_client *c, const char *fmt, ...) {
  va_list ap;
  if (!c)
    return DSPK_EINVAL;
  va_start(ap, fmt);
  dspk__vformat(c->err, sizeof(c->err), fmt, ap);
  va_end(ap);
  return DSPK_EINVAL;
}

int dspk__forked(dspk_client *c) {
  if (c->pid == getpid())
    return 0;
  /* The socket and the shared memory are the parent's too: a child that
   * read or wrote them would take the parent's answers (dspk.h, fork). */
  return dspk__cerr(c, DSPK_ECLOSED, "this client belongs to process %ld, which "
                    "connected it; it cannot be used in a child of fork() (connect anew "
                    "there)", (long)c->pid);
}

/* The failure of a call on a client whose connection broke (dspk.h). */
static int broken_err(dspk_client *c) {
  if (c->broken_unseen) { /* the call that met the daemon's reason gives it as it is */
    c->broken_unseen = false;
    return dspk__cerr(c, c->broken_code, "%s", c->broken_why);
  }
  return dspk__cerr(c, c->broken_code, "connection is no longer usable: %s", c->broken_why);
}

static int mark_broken(dspk_client *c, int code) {
  if (!c->broken) {
    c->broken = true;
    c->broken_code = code;
    if (c->err[0])
      memcpy(c->broken_why, c->err, sizeof c->broken_why);
    else
      snprintf(c->broken_why, sizeof c->broken_why, "%s", dspk__strerror(code));
  }
  return code;
}

/* A failed recv: the daemon gone (reset, or a socket no longer connected)
 * is DSPK_ECLOSED, as a closed stream and a failed send are; anything else
 * DSPK_EIO. */
static int recv_code(int e) {
  return e == ECONNRESET || e == EPIPE || e == ENOTCONN ? DSPK_ECLOSED : DSPK_EIO;
}

DSPK_EXPORT const char *dspk_version(void) { return DSPK_VERSION_STRING; }
DSPK_EXPORT const char *dspk_strerror(int code) { return dspk__strerror(code); }
DSPK_EXPORT const char *dspk_err_name(int code) { return dspk__err_name(code); }
DSPK_EXPORT const char *dspk_connect_error(void) { return connect_err; }

DSPK_EXPORT const char *dspk_last_error(const dspk_client *c) {
  return c ? c->err : "";
}

DSPK_EXPORT const char *dspk_daemon_version(const dspk_client *c) {
  return c ? c->daemon_version : "";
}

DSPK_EXPORT size_t dspk_max_message(const dspk_client *c) { return c ? c->send_max : 0; }

DSPK_EXPORT int dspk_fd(const dspk_client *c) { return c ? c->fd : -1; }

DSPK_EXPORT void dspk_free(void *p) { free(p); }

DSPK_EXPORT int dspk_default_socket(char *buf, size_t buflen) {
  const char *env = getenv("DSPK_SOCKET");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  const char *job = getenv("SLURM_JOB_ID");
  int n;

  if (!buf && buflen)
    return DSPK_EINVAL;

  /* In a Slurm job the node's daemon (docs/cluster.md), not the session's
   * XDG_RUNTIME_DIR that sbatch carried over from the login node.  A
   * relative XDG_RUNTIME_DIR is ignored, as the XDG Base Directory
   * specification asks (the path would depend on the working directory). */
  const char *dir = "", *name = "/run/dspk/dspkd.sock";
  if (env && *env)
    name = env;
  else if (geteuid() != 0 && xdg && xdg[0] == '/' && !(job && *job)) {
    dir = xdg;
    name = "/dspk/dspkd.sock";
  }
  /* Measured first: buf is written only when the whole path fits (dspk.h:
   * outputs are written only on success). */
  n = snprintf(NULL, 0, "%s%s", dir, name);
  if (n < 0 || (size_t)n >= buflen)
    return DSPK_ELIMIT;
  snprintf(buf, buflen, "%s%s", dir, name);
  return 0;
}

/* ---- in-flight bookkeeping ---------------------------------------------- */

static size_t infl_slot(uint32_t msgid, size_t cap) {
  return (size_t)(msgid * 2654435761u) & (cap - 1); /* Knuth's multiplicative hash */
}

/* The slot of msgid when it is in flight, else NULL. */
static struct dspk__inflight *infl_find(const dspk_client *c, uint32_t msgid) {
  if (!c->capinflight || !msgid)
    return NULL;
  for (size_t i = infl_slot(msgid, c->capinflight);; i = (i + 1) & (c->capinflight - 1)) {
    if (c->inflight[i].msgid == msgid)
      return &c->inflight[i];
    if (c->inflight[i].msgid == 0)
      return NULL;
  }
}

static void infl_put(struct dspk__inflight *t, size_t cap, struct dspk__inflight e) {
  size_t i = infl_slot(e.msgid, cap);
  while (t[i].msgid)
    i = (i + 1) & (cap - 1);
  t[i] = e;
}

/* Room for one more in flight (so that adding it after its request was sent
 * cannot fail): 0 or DSPK_ENOMEM. */
static int infl_reserve(dspk_client *c) {
  size_t cap = c->capinflight ? c->capinflight : 16;
  struct dspk__inflight *t;
  while (2 * (c->ninflight + 1) > cap)
    cap *= 2;
  if (cap == c->capinflight)
    return 0;
  if (!(t = calloc(cap, sizeof *t)))
    return DSPK_ENOMEM;
  for (size_t i = 0; i < c->capinflight; i++)
    if (c->inflight[i].msgid)
      infl_put(t, cap, c->inflight[i]);
  free(c->inflight);
  c->inflight = t;
  c->capinflight = cap;
  return 0;
}

/* Adds msgid (infl_reserve made room). */
static void infl_add(dspk_client *c, uint32_t msgid) {
  infl_put(c->inflight, c->capinflight, (struct dspk__inflight){msgid, 0});
  c->ninflight++;
}

bool dspk__inflight_has(const dspk_client *c, uint32_t msgid) {
  return infl_find(c, msgid) != NULL;
}

bool dspk__daemon_busy(const dspk_client *c) {
  return c->ninflight > 0 || c->nabandoned > 0 || c->abandoned_lost;
}

/* Forgets ticket's dspk_result_to_file, closing its descriptor. */
static void sink_drop(dspk_client *c, uint32_t ticket) {
  for (size_t i = 0; i < c->nsinks; i++)
    if (c->sinks[i].ticket == ticket) {
      close(c->sinks[i].fd);
      c->sinks[i] = c->sinks[--c->nsinks];
      return;
    }
}

/* A request's answer is taken: no longer in flight.  Its
 * dspk_result_to_file stays until dspk_wait has decoded the answer
 * (dspk__sink_write, dspk__sink_forget). */
static void inflight_del(dspk_client *c, uint32_t msgid) {
  struct dspk__inflight *e = infl_find(c, msgid);
  size_t cap = c->capinflight, i, j;
  if (!e)
    return;
  /* Linear probing's deletion: the entries after it in its run that hash
   * at or before the hole move back into it. */
  i = (size_t)(e - c->inflight);
  c->inflight[i].msgid = 0;
  c->ninflight--;
  for (j = (i + 1) & (cap - 1); c->inflight[j].msgid; j = (j + 1) & (cap - 1)) {
    size_t h = infl_slot(c->inflight[j].msgid, cap);
    /* j's entry may move to i when its home h is not in (i, j]. */
    if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
      c->inflight[i] = c->inflight[j];
      c->inflight[j].msgid = 0;
      i = j;
    }
  }
}

/* Takes kept answer k (an index in c->done) out of done: the last one
 * moves into its place. */
static struct dspk__frame done_take(dspk_client *c, size_t k) {
  struct dspk__frame f = c->done[k];
  struct dspk__inflight *e = infl_find(c, f.msgid);
  if (e)
    e->kept = 0;
  /* Out of the arrival order... */
  if (f.older)
    c->done[f.older - 1].newer = f.newer;
  else
    c->done_oldest = f.newer;
  if (f.newer)
    c->done[f.newer - 1].older = f.older;
  else
    c->done_newest = f.older;
  /* ...and the last one moves into its slot, its neighbours told. */
  if (k < --c->ndone) {
    struct dspk__frame *m = &c->done[c->ndone];
    if (m->older)
      c->done[m->older - 1].newer = k + 1;
    else
      c->done_oldest = k + 1;
    if (m->newer)
      c->done[m->newer - 1].older = k + 1;
    else
      c->done_newest = k + 1;
    c->done[k] = *m;
    if ((e = infl_find(c, c->done[k].msgid)))
      e->kept = (uint32_t)k + 1;
  }
  return f;
}

static bool abandoned_has(const dspk_client *c, uint32_t msgid) {
  for (size_t i = 0; i < c->nabandoned; i++)
    if (c->abandoned[i].msgid == msgid)
      return true;
  return false;
}

void dspk__abandon(dspk_client *c, uint32_t msgid, bool frees_buffer) {
  if (!dspk__inflight_has(c, msgid)) {
    for (size_t i = 0; i < c->nabandoned; i++) /* given up on already */
      if (c->abandoned[i].msgid == msgid)
        c->abandoned[i].frees_buffer |= frees_buffer;
    return;
  }
  {
    struct dspk__inflight *e = infl_find(c, msgid);
    if (e && e->kept) { /* cannot be (it would have been taken) */
      free(done_take(c, e->kept - 1).buf);
      inflight_del(c, msgid);
      sink_drop(c, msgid);
      dspk__shm_done(c, msgid);
      return;
    }
  }
  inflight_del(c, msgid);
  sink_drop(c, msgid);
  if (c->nabandoned == c->capabandoned) {
    size_t cap = c->capabandoned ? 2 * c->capabandoned : 8;
    struct dspk__abandoned *p = realloc(c->abandoned, cap * sizeof(*p));
    if (!p) { /* its temporaries stay busy, its answer is dropped all the same */
      c->abandoned_lost = true; /* and when it ends is never known */
      return;
    }
    c->abandoned = p;
    c->capabandoned = cap;
  }
  c->abandoned[c->nabandoned++] = (struct dspk__abandoned){msgid, frees_buffer};
}

/* Milliseconds of CLOCK_MONOTONIC. */
static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The deadline of a wait that starts now (0: none). */
static int64_t deadline_of(const dspk_client *c) {
  return c->timeout_ms > 0 ? now_ms() + c->timeout_ms : 0;
}

static int timed_out(dspk_client *c, const char *what) {
  return dspk__cerr(c, DSPK_ETIMEDOUT, "%s within %d ms (%s)", what, c->timeout_ms,
                    c->timeout_by);
}

/* Waits until the socket is ready for events (POLLIN, POLLOUT) or the
 * deadline passes (deadline 0: for ever); a signal does not end the wait.
 * 0 with the ready events in *revents, DSPK_ETIMEDOUT (nothing set in
 * c->err: the caller says what timed out) or DSPK_EIO. */
static int wait_ready(dspk_client *c, short events, int64_t deadline, short *revents) {
  for (;;) {
    struct pollfd pfd = {.fd = c->fd, .events = events};
    int ms = -1, n;
    if (deadline) {
      int64_t left = deadline - now_ms();
      if (left <= 0)
        return DSPK_ETIMEDOUT;
      ms = left > INT_MAX ? INT_MAX : (int)left;
    }
    n = poll(&pfd, 1, ms);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return mark_broken(c, dspk__cerr(c, DSPK_EIO, "poll: %s", strerror(errno)));
    if (n > 0) {
      *revents = pfd.revents;
      return 0;
    }
  }
}

uint32_t dspk__next_id(dspk_client *c) {
  uint32_t id;
  do /* 0 is never a ticket: dspk_wait_any uses it for "none" */
    id = c->next_id++;
  while (id == 0 || dspk__inflight_has(c, id) || abandoned_has(c, id));
  return id;
}

/* ---- sending ------------------------------------------------------------ */

static int fill(dspk_client *c, bool dontwait, int64_t deadline);
static int notice_salvage(dspk_client *c);

int dspk__send(dspk_client *c, struct dspk__wbuf *w, uint32_t msgid) {
  return dspk__send_fd(c, w, msgid, -1);
}

/* The registered file range (dspk_file_data) that holds [p, p + n), or
 * NULL: of those that hold it (ranges may overlap, several may start at
 * one address), the one registered last. */
static const struct dspk__fmap *fmap_of(const dspk_client *c, const void *p, size_t n) {
  const char *q = p;
  for (size_t i = c->nfmaps; i-- > 0;) {
    const struct dspk__fmap *m = &c->fmaps[i];
    if (!m->no && q >= m->addr && (size_t)(q - m->addr) <= m->len && n <= m->len - (size_t)(q - m->addr))
      return m;
  }
  return NULL;
}

bool dspk__file_range(const dspk_client *c, const void *p, size_t n) {
  return fmap_of(c, p, n) != NULL;
}

const struct dspk__fmap *dspk__fmap_of(const dspk_client *c, const void *p, size_t n) {
  return fmap_of(c, p, n);
}

static bool by_ref_file(const void *ud, const void *p, size_t n) {
  return fmap_of(ud, p, n) != NULL;
}

void dspk__wbuf_files(const dspk_client *c, struct dspk__wbuf *w) {
  if (c->nfmaps) {
    w->by_ref = by_ref_file;
    w->by_ref_ud = c;
  }
}

/* Drops fmaps[i] (closing its descriptor), keeping the others in the
 * order they were registered (fmap_of takes the last that fits). */
static void fmap_drop(dspk_client *c, size_t i) {
  close(c->fmaps[i].fd);
  memmove(&c->fmaps[i], &c->fmaps[i + 1], (c->nfmaps - i - 1) * sizeof(c->fmaps[0]));
  c->nfmaps--;
}

DSPK_EXPORT int dspk_file_data(dspk_client *c, const void *addr, size_t len, int fd,
                               uint64_t offset) {
  struct dspk__fmap m;
  if (!c || !addr)
    return dspk__argerr(c, "dspk_file_data: addr is NULL");
  if (dspk__forked(c))
    return DSPK_ECLOSED;
  if (len == 0) { /* forgets every range that starts at addr */
    for (size_t i = c->nfmaps; i-- > 0;)
      if (c->fmaps[i].addr == addr)
        fmap_drop(c, i);
    return 0;
  }
  /* Every check, and everything that can fail, before the ranges change: a
   * refused call leaves them as they were (dropping a registered range made
   * its operands go through the mapping: SIGBUS once the file shrank). */
  if (fd < 0)
    return dspk__argerr(c, "dspk_file_data: fd %d is not a file descriptor", fd);
  if ((uintptr_t)addr > UINTPTR_MAX - len)
    return dspk__argerr(c, "dspk_file_data: addr + len wraps around the address space");
  if ((uint64_t)len > (uint64_t)INT64_MAX || offset > (uint64_t)INT64_MAX - len)
    return dspk__argerr(c, "dspk_file_data: offset + len exceeds a file's largest offset");
  if (c->nfmaps == c->capfmaps) {
    size_t cap = c->capfmaps ? 2 * c->capfmaps : 4;
    struct dspk__fmap *p = realloc(c->fmaps, cap * sizeof(*p));
    if (!p)
      return dspk__cerr(c, DSPK_ENOMEM, "dspk_file_data: out of memory");
    c->fmaps = p;
    c->capfmaps = cap;
  }
  m = (struct dspk__fmap){addr, len, fcntl(fd, F_DUPFD_CLOEXEC, 0), offset, false};
  if (m.fd < 0)
    return dspk__cerr(c, DSPK_EIO, "dspk_file_data: %s", strerror(errno));
  /* The same range again replaces it (its file and offset); a range of
   * another length at addr stays, as any other overlapping range does. */
  for (size_t i = 0; i < c->nfmaps; i++)
    if (c->fmaps[i].addr == addr && c->fmaps[i].len == len) {
      fmap_drop(c, i);
      break;
    }
  c->fmaps[c->nfmaps++] = m;
  return 0;
}

DSPK_EXPORT int dspk_result_to_file(dspk_client *c, uint32_t ticket, int fd, uint64_t offset,
                                    bool *written) {
  struct stat st;
  int fl, dfd;
  if (!c)
    return dspk__argerr(c, "dspk_result_to_file: c is NULL");
  if (dspk__forked(c))
    return DSPK_ECLOSED;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return dspk__argerr(c, "dspk_result_to_file: fd %d is not a regular file", fd);
  if ((fl = fcntl(fd, F_GETFL)) < 0 || (fl & O_ACCMODE) != O_RDWR || (fl & O_APPEND))
    return dspk__argerr(c, "dspk_result_to_file: fd %d is not open for reading and writing "
                        "(without O_APPEND)", fd);
  /* Half a file's largest offset: the output's bytes (less than 2^62 in
   * any message) then always fit before 2^63-1. */
  if (offset > (uint64_t)INT64_MAX / 2)
    return dspk__argerr(c, "dspk_result_to_file: offset %llu is more than 2^62-1 "
                        "(4611686018427387903), the largest this call takes",
                        (unsigned long long)offset);
  if (!dspk__inflight_has(c, ticket))
    return dspk__cerr(c, DSPK_ENOENT, "dspk_result_to_file: ticket %u is not in flight",
                      (unsigned)ticket);
  /* Whatever can fail before the ticket's earlier file (if any) is
   * dropped: a refused call leaves it registered. */
  if (c->nsinks == c->capsinks) {
    size_t cap = c->capsinks ? 2 * c->capsinks : 4;
    struct dspk__sink *p = realloc(c->sinks, cap * sizeof(*p));
    if (!p)
      return dspk__cerr(c, DSPK_ENOMEM, "dspk_result_to_file: out of memory");
    c->sinks = p;
    c->capsinks = cap;
  }
  if ((dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
    return dspk__cerr(c, DSPK_EIO, "dspk_result_to_file: %s", strerror(errno));
  sink_drop(c, ticket);
  if (written) /* only now: outputs are written only on success (dspk.h) */
    *written = false;
  c->sinks[c->nsinks++] = (struct dspk__sink){ticket, dfd, offset, written};
  return 0;
}

void dspk__sink_forget(dspk_client *c, uint32_t ticket) { sink_drop(c, ticket); }

char *dspk__sink_write(dspk_client *c, uint32_t ticket, const void *data, size_t n) {
  struct dspk__sink s;
  struct dspk__nofsz g;
  long pg = sysconf(_SC_PAGESIZE);
  size_t i, done = 0;
  char *out = NULL;

  for (i = 0; i < c->nsinks && c->sinks[i].ticket != ticket; i++) {
  }
  if (i == c->nsinks)
    return NULL;
  s = c->sinks[i];
  c->sinks[i] = c->sinks[--c->nsinks];
  dspk__nofsz_begin(&g);
  while (n >= LAND_MIN && done < n) {
    ssize_t w = pwrite(s.fd, (const char *)data + done, n - done, (off_t)(s.off + done));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) /* a full disk, RLIMIT_FSIZE: the result stays in memory */
      break;
    done += (size_t)w;
  }
  dspk__nofsz_end(&g);
  if (n >= LAND_MIN && done == n) {
    uint64_t at = pg > 0 ? s.off / (uint64_t)pg * (uint64_t)pg : s.off;
    size_t maplen = (size_t)(s.off - at) + n;
    void *map = mmap(NULL, maplen, PROT_READ, MAP_SHARED, s.fd, (off_t)at);
    char *p = map == MAP_FAILED ? NULL : (char *)map + (s.off - at);
    if (p && dspk__file_lease(map, maplen, p)) {
      if (s.written)
        *s.written = true;
      out = p;
    } else if (map != MAP_FAILED) {
      munmap(map, maplen);
    }
  }
  close(s.fd);
  return out;
}

/* While a request with file ranges is sent: the socket non-blocking (sendfile
 * takes no MSG_DONTWAIT) and SIGPIPE blocked (nor MSG_NOSIGNAL; one raised
 * by a closed socket is taken back), so that sendfile behaves as the
 * sendmsg calls do. */
struct file_send {
  bool on;
  int flags;
  bool pipe_pending;
  sigset_t old;
};

static void file_send_begin(dspk_client *c, struct file_send *fs) {
  sigset_t pipe, pend;
  fs->on = false;
  if ((fs->flags = fcntl(c->fd, F_GETFL)) < 0 ||
      fcntl(c->fd, F_SETFL, fs->flags | O_NONBLOCK) < 0)
    return;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &fs->old);
  fs->pipe_pending = sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE);
  fs->on = true;
}

static void file_send_end(dspk_client *c, struct file_send *fs, bool epipe) {
  if (!fs->on)
    return;
  if (epipe && !fs->pipe_pending) {
    sigset_t pipe;
    struct timespec zero = {0, 0};
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &fs->old, NULL);
  fcntl(c->fd, F_SETFL, fs->flags);
  fs->on = false;
}

void dspk__nofsz_begin(struct dspk__nofsz *g) {
  sigset_t xfsz, pend;
  sigemptyset(&xfsz);
  sigaddset(&xfsz, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &xfsz, &g->old);
  g->pending = sigpending(&pend) == 0 && sigismember(&pend, SIGXFSZ);
}

void dspk__nofsz_end(struct dspk__nofsz *g) {
  sigset_t xfsz, pend;
  struct timespec zero = {0, 0};
  sigemptyset(&xfsz);
  sigaddset(&xfsz, SIGXFSZ);
  if (!g->pending && sigpending(&pend) == 0 && sigismember(&pend, SIGXFSZ))
    while (sigtimedwait(&xfsz, NULL, &zero) < 0 && errno == EINTR) {
    }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

int dspk__send_fd(dspk_client *c, struct dspk__wbuf *w, uint32_t msgid, int fd) {
  union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } cm;
  struct file_send fs = {0};
  struct iovec *iov;
  size_t niov, total, sent = 0;
  int64_t deadline = deadline_of(c);
  bool epipe = false;
  int rc;

  if ((rc = dspk__forked(c)) != 0)
    return rc;
  if (c->broken)
    return broken_err(c);
  if (infl_reserve(c) != 0)
    return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
  rc = dspk__wbuf_iov(w, &iov, &niov);
  if (rc != 0)
    return dspk__cerr(c, rc, "out of memory packing the request");
  total = dspk__wbuf_len(w);
  /* What the caller can do about it is the caller's to say (task.run's
   * operands, ping's payload): a request of no operand has no remedy. */
  if (total > c->send_max)
    return dspk__cerr(c, DSPK_ELIMIT,
                      "request of %zu bytes exceeds the daemon's %zu-byte "
                      "message limit (max_message)", total, c->send_max);
  for (size_t i = 0; i < niov && !fs.on; i++)
    if (fmap_of(c, iov[i].iov_base, iov[i].iov_len))
      file_send_begin(c, &fs);

  rc = 0;
  while (niov > 0) {
    const struct dspk__fmap *fm = fs.on && fd < 0 ? fmap_of(c, iov->iov_base, iov->iov_len) : NULL;
    ssize_t n;
    if (fm) { /* the file's pages to the socket, no copy here */
      off_t off = (off_t)(fm->off + (uint64_t)((const char *)iov->iov_base - fm->addr));
      n = sendfile(c->fd, fm->fd, &off, iov->iov_len);
      if (n < 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                    errno == ESPIPE || errno == EBADF)) {
        /* Not from this descriptor (a pipe, not readable) or not to this
         * socket (the kernel): this range goes from memory from now on. */
        ((struct dspk__fmap *)fm)->no = true;
        continue;
      }
      if (n == 0) {
        rc = mark_broken(c, dspk__cerr(c, DSPK_EIO, "an input file ended before its "
                                       "data was sent (changed while in use?)"));
        goto out;
      }
    } else {
      struct msghdr mh = {0};
      size_t run = 1;
      while (fs.on && run < niov && run < IOV_MAX &&
             !fmap_of(c, iov[run].iov_base, iov[run].iov_len))
        run++;
      mh.msg_iov = iov;
      mh.msg_iovlen = fs.on ? run : niov > IOV_MAX ? IOV_MAX : niov;
      /* The descriptor goes with this request's first sendmsg only, whose
       * data starts with the frame: every earlier request was sent whole
       * before this function was called, so nothing of another frame comes
       * before it in this call (protocol.md, Passing descriptors: the kernel
       * gives the descriptor to the first part of the call's data only). */
      if (fd >= 0) {
        struct cmsghdr *h;
        memset(&cm, 0, sizeof cm);
        mh.msg_control = cm.buf;
        mh.msg_controllen = sizeof cm.buf;
        h = CMSG_FIRSTHDR(&mh);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof fd);
      }
      n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        /* The daemon stops reading from a client that leaves too many
         * answers unread, so while our send is blocked, take in what it
         * sends (kept in rbuf for the waits) instead of deadlocking. */
        short rev = 0;
        rc = wait_ready(c, POLLIN | POLLOUT, deadline, &rev);
        if (rc == DSPK_ETIMEDOUT) {
          /* Nothing of it sent: the request never was, the stream is
           * whole.  Part of it sent: the stream is inside a message. */
          rc = timed_out(c, sent ? "the daemon did not take the rest of a request "
                                   "(the connection is unusable now)"
                                 : "the daemon did not take the request");
          if (sent)
            rc = mark_broken(c, rc);
          goto out;
        }
        if (rc != 0)
          goto out;
        if (rev & POLLIN) {
          rc = fill(c, true, 0);
          if (rc != 0)
            goto out;
        }
        continue;
      }
      int e = errno;
      int code = (e == EPIPE || e == ECONNRESET) ? DSPK_ECLOSED : DSPK_EIO;
      epipe = e == EPIPE;
      /* The daemon closed: the reason it sent first, if it did, is queued. */
      if (code != DSPK_ECLOSED || (rc = notice_salvage(c)) == 0)
        rc = mark_broken(c, dspk__cerr(c, code, "sending to the daemon: %s", strerror(e)));
      goto out;
    }
    fd = -1; /* sent */
    sent += (size_t)n;
    while (niov > 0 && (size_t)n >= iov->iov_len) {
      n -= (ssize_t)iov->iov_len;
      iov++;
      niov--;
    }
    if (niov > 0) {
      iov->iov_base = (char *)iov->iov_base + n;
      iov->iov_len -= (size_t)n;
    }
  }
  infl_add(c, msgid);
out:
  file_send_end(c, &fs, epipe);
  return rc;
}

/* ---- receiving ---------------------------------------------------------- */

/* Reads more bytes into rbuf; with dontwait, only what is already there;
 * else waits for them until deadline (0: for ever), then DSPK_ETIMEDOUT
 * (nothing read, the stream whole; the message in c->err).  Bytes still to
 * be skipped (c->skip) are dropped first.  0, or a negative code
 * (connection broken). */
/* Moves rbuf's unconsumed bytes to the start of its allocation. */
static void rbuf_compact(dspk_client *c) {
  size_t lead = (size_t)(c->rbuf - c->rbase);
  if (!lead)
    return;
  memmove(c->rbase, c->rbuf, c->rlen);
  c->rbuf = c->rbase;
  c->rcap += lead;
}

/* At least RBUF_MIN / 4 bytes of room after rbuf's unconsumed ones: the
 * consumed bytes before them (next_frame only moves rbuf past a frame) are
 * taken back when there are at least as many as the bytes to move (so that
 * each byte received is moved at most once on average, however many
 * answers wait in rbuf), else the buffer grows (a spare one taken again
 * when it is large enough).  0 or DSPK_ENOMEM. */
static int rbuf_room(dspk_client *c) {
  size_t lead = (size_t)(c->rbuf - c->rbase);
  if (c->rcap - c->rlen >= RBUF_MIN / 4)
    return 0;
  if (lead && lead >= c->rlen) {
    rbuf_compact(c);
    if (c->rcap - c->rlen >= RBUF_MIN / 4)
      return 0;
  }
  size_t cap = lead + c->rcap ? 2 * (lead + c->rcap) : RBUF_MIN;
  char *p;
  if (c->spare && c->spare_cap >= cap) { /* grown before: take it again */
    p = c->spare;
    cap = c->spare_cap;
    c->spare = NULL;
    c->spare_cap = 0;
    if (c->rlen)
      memcpy(p, c->rbuf, c->rlen);
    free(c->rbase);
  } else {
    rbuf_compact(c);
    if (!(p = realloc(c->rbase, cap)))
      return DSPK_ENOMEM;
  }
  c->rbase = c->rbuf = p;
  c->rcap = cap;
  return 0;
}

static int fill(dspk_client *c, bool dontwait, int64_t deadline) {
  ssize_t n;

  if (rbuf_room(c) != 0)
    return mark_broken(c, dspk__cerr(c, DSPK_ENOMEM, "out of memory"));
  /* While an answer is to go to a file (dspk_result_to_file), at most
   * RBUF_MIN bytes a read, however large rbuf grew: the answer's head then
   * comes in before its body, which land() sends to the file instead of
   * this read taking it whole into memory. */
  size_t room = c->rcap - c->rlen;
  if (c->nsinks && room > RBUF_MIN)
    room = RBUF_MIN;
  for (;;) {
    short rev;
    int rc;
    if (!dontwait && deadline &&
        (rc = wait_ready(c, POLLIN, deadline, &rev)) != 0)
      return rc == DSPK_ETIMEDOUT ? timed_out(c, "no answer from the daemon") : rc;
    n = recv(c->fd, c->rbuf + c->rlen, room, dontwait || deadline ? MSG_DONTWAIT : 0);
    if (n < 0 && errno == EINTR) /* a signal: the wait goes on */
      continue;
    if (n < 0 && !dontwait && deadline && (errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    break;
  }
  if (n < 0 && dontwait && (errno == EAGAIN || errno == EWOULDBLOCK))
    return 0;
  if (n < 0) {
    int e = errno;
    int rc = e == ECONNRESET ? notice_salvage(c) : 0;
    return rc ? rc : mark_broken(c, dspk__cerr(c, recv_code(e), "reading from the daemon: "
                                               "%s", strerror(e)));
  }
  if (n == 0) {
    int rc = notice_salvage(c); /* one read but not yet looked at (a send's wait) */
    if (rc)
      return rc;
    if (c->broken) /* protocol.error came first: keep its reason */
      return broken_err(c);
    return mark_broken(c, dspk__cerr(c, DSPK_ECLOSED,
                                     "the daemon closed the connection"));
  }
  if (c->skip) { /* the rest of an answer given up on */
    size_t d = (size_t)n < c->skip ? (size_t)n : c->skip;
    memmove(c->rbuf + c->rlen, c->rbuf + c->rlen + d, (size_t)n - d);
    c->skip -= d;
    n -= (ssize_t)d;
  }
  c->rlen += (size_t)n;
  return 0;
}

/* Maps the pages of [p, p + n) that are whole at once (MADV_POPULATE_WRITE),
 * where the kernel can: fresh memory that a recv is about to fill would
 * otherwise fault in one page at a time (1024 faults for 4 MiB where no
 * transparent huge page is to be had).  Advice only. */
static void populate(void *p, size_t n) {
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t a, b;
  if (pg <= 0 || n < (size_t)pg * 4)
    return;
  a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  b = ((uintptr_t)p + n) & ~((uintptr_t)pg - 1);
  if (b > a)
    (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
}

/* Bytes splice(2) moves from the socket into the pipe at a time (the
 * pipe is asked for this much room; the default 64 KiB works too). */
#define SINK_CHUNK ((size_t)1 << 20)

/* The sink's payload bytes [0, got) went to its file, the rest is still to
 * come: they are read back into memory of the payload's size, which the
 * rest is then received into (what land() would have made).  NULL when
 * they cannot be (out of memory, the file unreadable). */
static char *sink_fallback(const struct dspk__sink *s, size_t len, size_t got) {
  char *p = aligned_alloc(64, (len + 63) / 64 * 64);
  size_t done = 0;
  while (p && done < got) {
    ssize_t k = pread(s->fd, p + done, got - done, (off_t)(s->off + done));
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      free(p);
      return NULL;
    }
    done += (size_t)k;
  }
  return p;
}

/* land() for an answer with a dspk_result_to_file sink: the payload's
 * bytes in rbuf are written to the sink's file with pwrite, the rest moved
 * from the socket to the file through a pipe with splice(2) (never through
 * this process's memory), and c->land becomes a read-only shared mapping of
 * the file's range (*written set): 0.  A file that takes no write: 1,
 * nothing taken (land() goes on as usual).  One that stops taking them, or
 * a socket splice cannot read: 2, *mem holding the payload's first *got
 * bytes (read back from the file, and from the pipe), for land() to receive
 * the rest into as usual (*written left false: the caller writes the file
 * itself).  Or a negative code (the connection broken, a timeout). */
static int land_file(dspk_client *c, const struct dspk__run_head *h, struct dspk__sink *s,
                     int64_t deadline, char **mem, size_t *got) {
  size_t have = c->rlen - h->head, take = have < h->len ? have : h->len, pos = 0;
  long pg = sysconf(_SC_PAGESIZE);
  struct dspk__nofsz g;
  int rc;

  if (!c->sink_pipe_ok) {
    if (pipe2(c->sink_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      return 1;
    (void)fcntl(c->sink_pipe[1], F_SETPIPE_SZ, (int)SINK_CHUNK);
    c->sink_pipe_ok = true;
  }
  dspk__nofsz_begin(&g);
  while (pos < take) {
    ssize_t w = pwrite(s->fd, c->rbuf + h->head + pos, take - pos, (off_t)(s->off + pos));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    pos += (size_t)w;
  }
  dspk__nofsz_end(&g);
  if (pos < take)
    return 1;
  memmove(c->rbuf + h->head, c->rbuf + h->head + take, have - take);
  c->rlen = h->head + (have - take);
  memset(c->rbuf + h->len_at, 0, h->head - h->len_at); /* an empty bin now */
  while (pos < h->len) {
    size_t want = h->len - pos < SINK_CHUNK ? h->len - pos : SINK_CHUNK, left;
    short rev;
    ssize_t k;
    if ((rc = wait_ready(c, POLLIN, deadline, &rev)) != 0) {
      if (rc != DSPK_ETIMEDOUT)
        return rc;
      c->skip = h->len - pos; /* as land(): the stream stays whole */
      return timed_out(c, "the daemon's answer did not arrive whole");
    }
    k = splice(c->fd, NULL, c->sink_pipe[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (k < 0 && (errno == EINVAL || errno == ENOSYS)) /* no splice from this socket */
      break;
    if (k <= 0) {
      int e = errno;
      return mark_broken(c, dspk__cerr(c, k == 0 ? DSPK_ECLOSED : recv_code(e),
                                       "reading from the daemon: %s",
                                       k == 0 ? "connection closed" : strerror(e)));
    }
    for (left = (size_t)k; left > 0;) { /* the pipe emptied before the next */
      ssize_t w;
      if (!*mem) {
        loff_t o = (loff_t)(s->off + pos);
        dspk__nofsz_begin(&g);
        w = splice(c->sink_pipe[0], NULL, s->fd, &o, left, SPLICE_F_MOVE);
        dspk__nofsz_end(&g);
        if (w < 0 && errno == EINTR)
          continue;
        if (w <= 0 && !(*mem = sink_fallback(s, h->len, pos)))
          return mark_broken(c, dspk__cerr(c, DSPK_EIO, "writing a result to its file "
                                           "failed and it cannot be read back"));
        if (w <= 0)
          continue;
      } else {
        w = read(c->sink_pipe[0], *mem + pos, left);
        if (w < 0 && errno == EINTR)
          continue;
        if (w <= 0)
          return mark_broken(c, dspk__cerr(c, DSPK_EIO, "reading a result's pipe: %s",
                                           strerror(errno)));
      }
      pos += (size_t)w;
      left -= (size_t)w;
    }
    if (*mem) /* the pipe is empty: land() receives the rest */
      break;
  }
  if (pos < h->len || !*mem) {
    uint64_t at = pg > 0 ? s->off / (uint64_t)pg * (uint64_t)pg : s->off;
    size_t maplen = (size_t)(s->off - at) + h->len;
    void *map = pos < h->len ? MAP_FAILED
                             : mmap(NULL, maplen, PROT_READ, MAP_SHARED, s->fd, (off_t)at);
    char *data = map == MAP_FAILED ? NULL : (char *)map + (s->off - at);
    if (data && dspk__file_lease(map, maplen, data)) {
      if (s->written)
        *s->written = true;
      c->land = data;
      c->land_len = h->len;
      return 0;
    }
    if (map != MAP_FAILED)
      munmap(map, maplen);
    /* No mapping, or the rest still to come: what the file has, into memory. */
    if (!*mem && !(*mem = sink_fallback(s, h->len, pos)))
      return mark_broken(c, dspk__cerr(c, DSPK_ENOMEM, "a result given to its file "
                                       "cannot be read back"));
  }
  *got = pos;
  return 2;
}

/* When rbuf starts with the head of a task.run answer to msgid (any: to a
 * request in flight) whose first output carries at least LAND_MIN bytes, its
 * payload is received straight into memory of its own (64-byte aligned, as
 * decode_result would copy it to), not into rbuf: rbuf does not grow through
 * a large frame (each step a realloc copy and fresh pages) and the result is
 * not copied again.  rbuf keeps the frame with that bin emptied (its length
 * field zeroed); decode() puts the payload back.  0, or a negative code
 * (connection broken); not landing is not an error. */
static int land(dspk_client *c, bool any, uint32_t msgid, int64_t deadline) {
  struct dspk__run_head h;
  struct dspk__limits lim = c->lim;
  size_t have, take = 0;
  char *p;

  /* Not for wait_any with a deadline: a payload cut by its timeout would
   * be the answer of a request still in flight. */
  if (c->land || c->skip || (any && deadline) || c->rlen < 16 ||
      !dspk__run_head_scan(c->rbuf, c->rlen, &lim, &h) || h.len < LAND_MIN ||
      (any ? !dspk__inflight_has(c, h.msgid) : h.msgid != msgid))
    return 0;
  p = NULL;
  for (size_t i = 0; i < c->nsinks; i++)
    if (c->sinks[i].ticket == h.msgid) {
      int rc = land_file(c, &h, &c->sinks[i], deadline, &p, &take);
      sink_drop(c, h.msgid);
      if (rc < 0)
        free(p); /* a fallback's memory */
      if (rc <= 0)
        return rc;
      break;
    }
  if (!p) {
    if (!(p = aligned_alloc(64, (h.len + 63) / 64 * 64)))
      return 0; /* the ordinary path may still manage */
    populate(p, h.len);
    have = c->rlen - h.head;
    take = have < h.len ? have : h.len;
    memcpy(p, c->rbuf + h.head, take);
    memmove(c->rbuf + h.head, c->rbuf + h.head + take, have - take);
    c->rlen = h.head + (have - take);
    memset(c->rbuf + h.len_at, 0, h.head - h.len_at); /* an empty bin now */
  }
  while (take < h.len) {
    ssize_t got;
    short rev;
    int rc;
    if (deadline && (rc = wait_ready(c, POLLIN, deadline, &rev)) != 0) {
      free(p);
      if (rc != DSPK_ETIMEDOUT)
        return rc;
      /* The stream stays whole: the rest of this payload is dropped as it
       * comes, after it the frame (its bin emptied in rbuf) goes on. */
      c->skip = h.len - take;
      return timed_out(c, "the daemon's answer did not arrive whole");
    }
    got = recv(c->fd, p + take, h.len - take, deadline ? MSG_DONTWAIT : MSG_WAITALL);
    if (got < 0 && (errno == EINTR || (deadline && (errno == EAGAIN || errno == EWOULDBLOCK))))
      continue;
    if (got <= 0) {
      int e = errno;
      free(p);
      return mark_broken(c, dspk__cerr(c, got == 0 ? DSPK_ECLOSED : recv_code(e),
                                       "reading from the daemon: %s",
                                       got == 0 ? "connection closed" : strerror(e)));
    }
    take += (size_t)got;
  }
  c->land = p;
  c->land_len = h.len;
  return 0;
}

/* Takes the next complete frame out of the stream into an owned buffer.
 * A big frame that fills rbuf is handed over whole (no copy).  The answer
 * to msgid (any: to any request in flight) may land (above). */
static int next_frame(dspk_client *c, bool any, uint32_t msgid, int64_t deadline,
                      char **buf, size_t *len, size_t *cap) {
  struct dspk__limits lim = c->lim;
  char why[256];
  ssize_t n;
  int rc;

  why[0] = '\0';
  for (;;) {
    /* A landed payload still counts towards the frame's max_message. */
    lim.max_message = c->lim.max_message - (c->land ? c->land_len : 0);
    n = c->rlen ? dspk__frame_scan(c->rbuf, c->rlen, &lim, why, sizeof why)
                : 0;
    if (n < 0) {
      rc = mark_broken(c, dspk__cerr(c, (int)n, "bad frame from the daemon:"
                                     " %s", why));
      goto fail;
    }
    if (n > 0)
      break;
    if (c->broken) { /* nothing more will come that we could use */
      rc = broken_err(c);
      goto fail;
    }
    if ((rc = land(c, any, msgid, deadline)) != 0)
      goto fail;
    rc = fill(c, false, deadline);
    if (rc != 0)
      goto fail;
  }
  size_t rest = c->rlen - (size_t)n;
  *cap = 0;
  if (rest == 0 && (size_t)n > RBUF_MIN) {
    rbuf_compact(c); /* the allocation goes with the frame */
    *buf = c->rbuf;
    *len = (size_t)n;
    *cap = c->rcap;
    c->rbuf = c->rbase = NULL;
    c->rcap = c->rlen = 0;
    return 0;
  }
  char *p;
  if (!c->fbuf_busy && (size_t)n <= sizeof c->fbuf) {
    p = c->fbuf; /* given back by dspk__resp_free */
    c->fbuf_busy = true;
  } else if (!(p = malloc((size_t)n))) {
    return mark_broken(c, dspk__cerr(c, DSPK_ENOMEM, "out of memory"));
  }
  memcpy(p, c->rbuf, (size_t)n);
  /* Past the frame, without moving the rest (rbuf_room takes the room
   * back): a memmove of the rest for each frame made many answers read
   * ahead of their waits cost quadratic time. */
  c->rbuf += n;
  c->rcap -= (size_t)n;
  c->rlen = rest;
  if (!rest)
    rbuf_compact(c);
  *buf = p;
  *len = (size_t)n;
  return 0;
fail:
  dspk__land_free(c->land); /* the frame it belongs to will not come */
  c->land = NULL;
  return rc;
}

/* A notification: protocol.error is recorded; task.progress is copied
 * into *p (true: for the progress callback, which the caller calls with
 * progress_deliver once the frame is freed). */
static bool handle_notify(dspk_client *c, const struct dspk__msg *m, struct dspk__prog *p) {
  if (m->method_len == 13 && memcmp(m->method, "task.progress", 13) == 0) {
    uint64_t id = 0;
    if (!c->progress || !m->args)
      return false;
    p->fraction = 0;
    p->what[0] = '\0';
    dspk__arg_u64(m->args, "msgid", &id, NULL, 0);
    dspk__arg_f64(m->args, "fraction", &p->fraction, NULL, 0);
    dspk__strncpy_obj(dspk__map_get(m->args, "what"), p->what, sizeof p->what);
    p->ticket = (uint32_t)id;
    return true;
  } else if (m->method_len == 14 &&
             memcmp(m->method, "protocol.error", 14) == 0) {
    int64_t code = DSPK_EPROTO;
    char text[sizeof(c->err)] = "protocol error";
    if (m->args) {
      dspk__obj_i64(dspk__map_get(m->args, "code"), &code);
      dspk__strncpy_obj(dspk__map_get(m->args, "message"), text,
                        sizeof text);
    }
    if (code >= 0 || code <= DSPK__ERR_LAST)
      code = DSPK_EPROTO;
    dspk__cerr(c, (int)code, "daemon closed the connection: %s", text);
    if (!c->broken)
      c->broken_unseen = true;
    mark_broken(c, (int)code);
  }
  return false;
}

/* Calls the progress callback with p, unless it is running already (a call
 * made from it read this notification): then p waits in c->pq for it to
 * return, and is delivered in order after it by the outer delivery.  The
 * callback may make any call on c, so it is entered at most once at a time
 * and everything the nested calls read is kept for whoever waits for it. */
static void progress_deliver(dspk_client *c, const struct dspk__prog *p) {
  if (c->in_progress) {
    if (c->npq == c->cappq) {
      size_t cap = c->cappq ? 2 * c->cappq : 8;
      struct dspk__prog *q = realloc(c->pq, cap * sizeof(*q));
      if (!q)
        return; /* progress is advice: dropped */
      c->pq = q;
      c->cappq = cap;
    }
    c->pq[c->npq++] = *p;
    return;
  }
  c->in_progress = true;
  if (c->progress)
    c->progress(c->progress_ud, p->ticket, p->what, p->fraction);
  for (size_t i = 0; i < c->npq; i++) { /* read by calls made from it */
    struct dspk__prog q = c->pq[i];
    if (c->progress) /* it may have been removed meanwhile */
      c->progress(c->progress_ud, q.ticket, q.what, q.fraction);
  }
  c->npq = 0;
  c->in_progress = false;
}

/* A late answer of a request given up on (dspk__abandon): true when msgid
 * was one (the answer is to be dropped), after its temporaries were made
 * idle and, for a call that made a buffer, that buffer freed. */
static bool abandoned_answer(dspk_client *c, uint32_t msgid, const struct dspk__msg *m) {
  bool frees = false;
  size_t i;
  for (i = 0; i < c->nabandoned && c->abandoned[i].msgid != msgid; i++) {
  }
  if (i == c->nabandoned)
    return false;
  frees = c->abandoned[i].frees_buffer;
  c->abandoned[i] = c->abandoned[--c->nabandoned];
  dspk__shm_done(c, msgid);
  if (frees && !m->error && m->result) {
    uint64_t id = 0;
    if (dspk__arg_u64(m->result, "buffer", &id, NULL, 0) == 0 && id) {
      struct dspk__wbuf w;
      uint32_t fid = dspk__next_id(c);
      char err[sizeof c->err];
      memcpy(err, c->err, sizeof err);
      dspk__wbuf_init(&w);
      dspk__pack_request_head(&w.pk, fid, "buffer.free", true);
      msgpack_pack_map(&w.pk, 1);
      dspk__pack_str(&w.pk, "buffer");
      msgpack_pack_uint64(&w.pk, id);
      if (dspk__send(c, &w, fid) == 0) /* its answer is dropped in turn */
        dspk__abandon(c, fid, false);
      dspk__wbuf_free(&w);
      memcpy(c->err, err, sizeof err);
    }
  }
  return true;
}

/* After a send failed with EPIPE or ECONNRESET, or a read with ECONNRESET:
 * the daemon closed the connection, and may have said why just before (a
 * protocol.error: a refusal at connect, a limit), which a send that failed
 * first never read.  The bytes still queued on the socket are taken into
 * rbuf (without waiting; the frames there stay for the waits) and each whole
 * frame is looked at: a protocol.error becomes the connection's error, as
 * handle_notify makes it.  Its code, or 0 when none came (or the connection
 * was marked broken before). */
static int notice_salvage(dspk_client *c) {
  struct dspk__limits lim = c->lim;
  char why[256];
  size_t off = 0;

  if (c->broken)
    return 0;
  for (int i = 0; i < 64; i++) { /* the socket's buffer is bounded: so is this */
    ssize_t n;
    if (rbuf_room(c) != 0)
      break;
    n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    c->rlen += (size_t)n;
  }
  while (!c->broken && off < c->rlen) {
    msgpack_unpacked up;
    struct dspk__msg m;
    size_t pos = 0;
    ssize_t n;
    /* A landed payload (land()) belongs to the first frame. */
    lim.max_message = c->lim.max_message - (off == 0 && c->land ? c->land_len : 0);
    n = dspk__frame_scan(c->rbuf + off, c->rlen - off, &lim, why, sizeof why);
    if (n <= 0)
      break;
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, c->rbuf + off, (size_t)n, &pos) == MSGPACK_UNPACK_SUCCESS &&
        dspk__msg_parse(&up.data, &m, NULL, NULL, why, sizeof why) == 0 &&
        m.type == DSPK__NOTIFY && m.method_len == 14 &&
        memcmp(m.method, "protocol.error", 14) == 0) {
      struct dspk__prog unused;
      (void)handle_notify(c, &m, &unused);
    }
    msgpack_unpacked_destroy(&up);
    off += (size_t)n;
  }
  c->broken_unseen = false; /* the caller fails with it now */
  return c->broken ? c->broken_code : 0;
}

/* Puts a landed payload back into the frame just unpacked into r, the one
 * it came with: the first output's bin, emptied in the bytes, then points
 * at it (r owns it from here on).  Where land() found a head the unpacked
 * frame has one. */
static int land_restore(dspk_client *c, struct dspk__resp *r, size_t n) {
  msgpack_object *o = &r->up.data;
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4 ||
      (o = &o->via.array.ptr[3])->type != MSGPACK_OBJECT_MAP || o->via.map.size < 2 ||
      (o = &o->via.map.ptr[1].val)->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 1 ||
      (o = &o->via.array.ptr[0])->type != MSGPACK_OBJECT_MAP || o->via.map.size != 3 ||
      (o = &o->via.map.ptr[2].val)->type != MSGPACK_OBJECT_BIN || o->via.bin.size != 0)
    return dspk__cerr(c, DSPK_EINTERNAL, "a result received apart lost its place");
  o->via.bin.ptr = r->land;
  o->via.bin.size = (uint32_t)n;
  return 0;
}

/* Unpacks an accepted frame into r and parses its envelope. */
static int decode(dspk_client *c, char *buf, size_t len, size_t cap,
                  struct dspk__resp *r) {
  const msgpack_object *root;
  size_t off = 0;
  char why[256];
  int rc;

  why[0] = '\0';
  r->buf = buf;
  r->len = len;
  r->cap = cap;
  r->owner = c;
  r->zone = NULL;
  r->land = c->land; /* this frame's, when there is one (next_frame) */
  c->land = NULL;
  msgpack_unpacked_init(&r->up);
  if (!c->zone_busy &&
      (c->zone_ready ||
       (c->zone_ready = msgpack_zone_init(&c->zone, MSGPACK_ZONE_CHUNK_SIZE)))) {
    r->zone = &c->zone;
    c->zone_busy = true;
    rc = msgpack_unpack(buf, len, &off, r->zone, &r->up.data);
  } else {
    rc = msgpack_unpack_next(&r->up, buf, len, &off);
  }
  if (rc != MSGPACK_UNPACK_SUCCESS || off != len) {
    rc = dspk__cerr(c, DSPK_EPROTO, "undecodable frame from the daemon");
    goto err;
  }
  if (r->land && (rc = land_restore(c, r, c->land_len)) != 0)
    goto err;
  root = &r->up.data;
  rc = dspk__msg_parse(root, &r->msg, NULL, NULL, why, sizeof why);
  if (rc != 0) {
    dspk__cerr(c, rc, "bad message from the daemon: %s", why);
    goto err;
  }
  return 0;
err:
  dspk__resp_free(r);
  return mark_broken(c, rc);
}

/* Gives back r's unpacked objects (the borrowed zone, or its own). */
static void resp_unpacked_free(struct dspk__resp *r) {
  if (r->zone) {
    msgpack_zone_clear(r->zone);
    r->owner->zone_busy = false;
    r->zone = NULL;
  } else {
    msgpack_unpacked_destroy(&r->up);
  }
}

/* Gives back r's frame bytes (the borrowed fbuf, or its own). */
static void resp_buf_free(struct dspk__resp *r) {
  dspk_client *c = r->owner;
  if (c && r->buf == c->fbuf) {
    c->fbuf_busy = false;
  } else if (c && r->cap > c->spare_cap) {
    free(c->spare);
    c->spare = r->buf;
    c->spare_cap = r->cap;
  } else {
    free(r->buf);
  }
  r->buf = NULL;
}

void dspk__resp_free(struct dspk__resp *r) {
  if (!r || !r->buf)
    return;
  resp_unpacked_free(r);
  resp_buf_free(r);
  dspk__land_free(r->land);
  r->land = NULL;
}

/* Turns a decoded response into the caller's status: 0 for a result, the
 * error map's code (message in c->err) for an error. */
static int resp_status(dspk_client *c, struct dspk__resp *r) {
  const msgpack_object *e = r->msg.error;
  int64_t code = DSPK_EINTERNAL;
  const char *s;
  size_t n;

  if (!e) {
    c->err[0] = '\0';
    return 0;
  }
  if (dspk__obj_i64(dspk__map_get(e, "code"), &code) != 0 || code >= 0 ||
      code <= DSPK__ERR_LAST) {
    code = DSPK_EINTERNAL;
    if (dspk__obj_str(dspk__map_get(e, "name"), &s, &n) == 0)
      code = dspk__err_from_name(s, n);
  }
  if (dspk__obj_str(dspk__map_get(e, "message"), &s, &n) == 0)
    dspk__cerr(c, (int)code, "%.*s", (int)n, s);
  else
    dspk__cerr(c, (int)code, "%s", dspk__strerror((int)code));
  dspk__resp_free(r);
  return (int)code;
}

/* Takes a kept response (one read before its wait) for *msgid, or with
 * any for any request: 1 with *rc the wait's status (*out filled on 0),
 * 0 when none is kept. */
static int take_done(dspk_client *c, bool any, uint32_t *msgid, struct dspk__resp *out,
                     int *rc) {
  struct dspk__resp r;
  const struct dspk__inflight *e = any ? NULL : infl_find(c, *msgid);
  size_t k = any ? c->done_oldest - 1 : e && e->kept ? e->kept - 1 : SIZE_MAX;
  struct dspk__frame f;
  if (!c->ndone || k == SIZE_MAX)
    return 0;
  f = done_take(c, k);
  inflight_del(c, f.msgid);
  *rc = decode(c, f.buf, f.len, 0, &r);
  if (*rc != 0)
    return 1;
  *msgid = f.msgid;
  *rc = resp_status(c, &r);
  if (*rc == 0)
    *out = r;
  return 1;
}

/* Reads frames until the response to *msgid arrives (or, with any, the
 * response to any in-flight request, whose msgid is stored in *msgid).
 * Before each read it looks at what calls made from the progress callback
 * may have read meanwhile (kept responses, requests waited for there).
 * With a timeout (dspk_set_timeout) the whole wait is bounded: then
 * DSPK_ETIMEDOUT, and the request waited for (not with any) is given up on:
 * its late answer is dropped; the connection stays usable. */
static int wait_common(dspk_client *c, bool any, uint32_t *msgid,
                       struct dspk__resp *out) {
  struct dspk__resp r;
  struct dspk__prog prog;
  int64_t deadline = deadline_of(c);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc;

  if ((rc = dspk__forked(c)) != 0)
    return rc;
  for (;;) {
    if (c->closed) /* by dspk_close from the callback: nothing more is taken */
      return broken_err(c);
    /* A response that already arrived (also read by a nested call). */
    if (take_done(c, any, msgid, out, &rc))
      return rc;
    if (any && c->ninflight == 0)
      return c->broken ? broken_err(c)
                       : dspk__cerr(c, DSPK_ENOENT, "no request in flight");
    if (!any && !dspk__inflight_has(c, *msgid)) /* waited for by a nested call */
      return c->broken ? broken_err(c)
                       : dspk__cerr(c, DSPK_ENOENT, "request %u was waited for by a "
                                    "call from the progress callback", *msgid);
    rc = next_frame(c, any, *msgid, deadline, &buf, &len, &cap);
    if (rc == DSPK_ETIMEDOUT && !any)
      dspk__abandon(c, *msgid, false);
    if (rc != 0)
      return rc;
    rc = decode(c, buf, len, cap, &r);
    if (rc != 0)
      return rc;
    if (r.msg.type == DSPK__NOTIFY) {
      bool call = handle_notify(c, &r.msg, &prog);
      dspk__resp_free(&r); /* its buffers free for calls made from the callback */
      if (call)
        progress_deliver(c, &prog);
      continue;
    }
    if (r.msg.type != DSPK__RESPONSE) {
      dspk__resp_free(&r);
      return mark_broken(c, dspk__cerr(c, DSPK_EPROTO,
                                       "the daemon sent a request"));
    }
    uint32_t id = r.msg.msgid;
    if (!dspk__inflight_has(c, id)) { /* nobody waits for it: drop */
      (void)abandoned_answer(c, id, &r.msg);
      dspk__resp_free(&r);
      continue;
    }
    if (any || id == *msgid) {
      inflight_del(c, id);
      *msgid = id;
      rc = resp_status(c, &r);
      if (rc == 0)
        *out = r;
      return rc;
    }
    /* Someone else's: keep the frame (not the unpacked zone).  Never a
     * landed one (land() takes only the awaited answer). */
    if (r.land) {
      dspk__resp_free(&r);
      return mark_broken(c, dspk__cerr(c, DSPK_EINTERNAL, "a result received apart "
                                       "for an answer nobody waits for"));
    }
    if (c->ndone == c->capdone) {
      size_t cap = c->capdone ? 2 * c->capdone : 8;
      struct dspk__frame *p = realloc(c->done, cap * sizeof(*p));
      if (!p) {
        dspk__resp_free(&r);
        return mark_broken(c, dspk__cerr(c, DSPK_ENOMEM, "out of memory"));
      }
      c->done = p;
      c->capdone = cap;
    }
    if (r.buf == c->fbuf) { /* the lent buffer is for the next frame */
      char *p = malloc(r.len);
      if (!p) {
        dspk__resp_free(&r);
        return mark_broken(c, dspk__cerr(c, DSPK_ENOMEM, "out of memory"));
      }
      memcpy(p, r.buf, r.len);
      resp_buf_free(&r);
      r.buf = p;
    }
    resp_unpacked_free(&r);
    c->done[c->ndone++] = (struct dspk__frame){id, r.buf, r.len, c->done_newest, 0};
    if (c->done_newest)
      c->done[c->done_newest - 1].newer = c->ndone;
    else
      c->done_oldest = c->ndone;
    c->done_newest = c->ndone;
    infl_find(c, id)->kept = (uint32_t)c->ndone;
    r.cap = 0; /* the kept frame is freed plainly */
  }
}

int dspk__wait(dspk_client *c, uint32_t msgid, struct dspk__resp *r) {
  if (!dspk__inflight_has(c, msgid))
    return c->broken ? broken_err(c)
                     : dspk__cerr(c, DSPK_ENOENT, "request %u is not in flight", msgid);
  return wait_common(c, false, &msgid, r);
}

int dspk__wait_any(dspk_client *c, uint32_t *msgid, struct dspk__resp *r) {
  uint32_t id = 0;
  struct dspk__resp tmp;
  int rc = wait_common(c, true, &id, &tmp);
  if (rc == 0)
    *r = tmp;
  *msgid = id; /* the ticket whose answer this is (an error consumes it) */
  return rc;
}

int dspk__send_call(dspk_client *c, const char *method,
                    void (*pack)(void *ud, struct dspk__wbuf *w), void *ud,
                    uint32_t *id) {
  struct dspk__wbuf w;
  int rc;

  *id = dspk__next_id(c);
  dspk__wbuf_init(&w);
  dspk__wbuf_files(c, &w);
  dspk__pack_request_head(&w.pk, *id, method, pack != NULL);
  if (pack)
    pack(ud, &w);
  rc = dspk__send(c, &w, *id);
  dspk__wbuf_free(&w);
  return rc;
}

int dspk__call(dspk_client *c, const char *method,
               void (*pack)(void *ud, struct dspk__wbuf *w), void *ud,
               struct dspk__resp *r) {
  uint32_t id;
  int rc = dspk__send_call(c, method, pack, ud, &id);
  if (rc != 0)
    return rc;
  rc = dspk__wait(c, id, r);
  if (rc == DSPK_ETIMEDOUT) /* given up on: a buffer it makes late is freed */
    dspk__abandon(c, id, strcmp(method, "buffer.create") == 0);
  return rc;
}

/* Matches the head of a buffer.read answer, [1, msgid, nil, {"data": bin}],
 * at p[0..len): the header's length once it is all there and matches (with
 * the bin's length in *n), 0 while it may still match, -1 when it does not. */
static ssize_t read_head(const unsigned char *p, size_t len, uint32_t msgid, size_t *n) {
  unsigned char want[16];
  size_t h = 0, i;
  want[h++] = 0x94;
  want[h++] = 0x01;
  if (msgid < 128) {
    want[h++] = (unsigned char)msgid;
  } else if (msgid < 256) {
    want[h++] = 0xcc;
    want[h++] = (unsigned char)msgid;
  } else if (msgid < 65536) {
    want[h++] = 0xcd;
    want[h++] = (unsigned char)(msgid >> 8);
    want[h++] = (unsigned char)msgid;
  } else {
    want[h++] = 0xce;
    for (int s = 24; s >= 0; s -= 8)
      want[h++] = (unsigned char)(msgid >> s);
  }
  memcpy(want + h, "\xc0\x81\xa4" "data", 7);
  h += 7;
  for (i = 0; i < h && i < len; i++)
    if (p[i] != want[i])
      return -1;
  if (len < h + 1)
    return 0;
  size_t w = p[h] == 0xc4 ? 1 : p[h] == 0xc5 ? 2 : p[h] == 0xc6 ? 4 : 0;
  if (!w)
    return -1;
  if (len < h + 1 + w)
    return 0;
  *n = 0;
  for (i = 0; i < w; i++)
    *n = *n << 8 | p[h + 1 + i];
  return (ssize_t)(h + 1 + w);
}

int dspk__wait_into(dspk_client *c, uint32_t msgid, void *dst, size_t n) {
  struct dspk__resp r;
  const void *p;
  size_t len;
  ssize_t h = 0;
  int rc;

  if ((rc = dspk__forked(c)) != 0)
    return rc;
  if (!dspk__inflight_has(c, msgid))
    return c->broken ? broken_err(c)
                     : dspk__cerr(c, DSPK_ENOENT, "request %u is not in flight", msgid);
  /* The fast path: no earlier answer is kept and this one is next. */
  int64_t deadline = deadline_of(c);
  while (c->ndone == 0 && !c->broken && !c->skip &&
         (h = read_head((const unsigned char *)c->rbuf, c->rlen, msgid, &len)) == 0)
    if ((rc = fill(c, false, deadline)) != 0) {
      if (rc == DSPK_ETIMEDOUT)
        dspk__abandon(c, msgid, false);
      return rc;
    }
  if (c->ndone == 0 && !c->broken && !c->skip && h > 0 && len == n) {
    size_t have = c->rlen - (size_t)h < n ? c->rlen - (size_t)h : n;
    memcpy(dst, c->rbuf + h, have);
    c->rlen -= (size_t)h + have;
    memmove(c->rbuf, c->rbuf + h + have, c->rlen);
    while (have < n) {
      ssize_t got;
      short rev;
      if (deadline && (rc = wait_ready(c, POLLIN, deadline, &rev)) != 0) {
        if (rc != DSPK_ETIMEDOUT)
          return rc;
        /* The answer is taken (dropped): the rest of it as it comes. */
        c->skip = n - have;
        inflight_del(c, msgid);
        return timed_out(c, "the daemon's answer did not arrive whole");
      }
      got = recv(c->fd, (char *)dst + have, n - have, deadline ? MSG_DONTWAIT : MSG_WAITALL);
      if (got < 0 && (errno == EINTR || (deadline && (errno == EAGAIN || errno == EWOULDBLOCK))))
        continue;
      if (got <= 0) {
        int e = errno;
        return mark_broken(c, dspk__cerr(c, got == 0 ? DSPK_ECLOSED : recv_code(e),
                                         "reading from the daemon: %s",
                                         got == 0 ? "connection closed" : strerror(e)));
      }
      have += (size_t)got;
    }
    inflight_del(c, msgid);
    c->err[0] = '\0';
    return 0;
  }
  rc = dspk__wait(c, msgid, &r);
  if (rc != 0)
    return rc;
  {
    struct dspk__pval v[DSPK__MAX_PARAMS];
    char why[256];
    if ((rc = dspk__result_decode(&dspk__methods[DSPK__M_BUFFER_READ], r.msg.result, v, why,
                                  sizeof why)) < 0) {
      rc = dspk__cerr(c, rc, "%s", why);
    } else {
      p = v[DSPK__R_BREAD_DATA].v.s.p;
      len = v[DSPK__R_BREAD_DATA].v.s.n;
      if (len != n)
        rc = dspk__cerr(c, DSPK_EPROTO, "buffer.read: expected %zu byte%s", n, dspk__s(n));
      else if (n)
        memcpy(dst, p, n);
    }
  }
  dspk__resp_free(&r);
  return rc;
}

/* ---- connect / close ---------------------------------------------------- */

struct hello_args { const char *name; uint64_t job; char sane[DSPK__CLIENT_NAME_MAX + 1]; };

/* The client name as hello sends it: each byte of it that starts no
 * well-formed UTF-8 character as U+FFFD (as packing would make it), cut at
 * a character boundary to DSPK__CLIENT_NAME_MAX bytes, so that a name
 * within that limit, which dspk.h accepts, is not refused for the bytes
 * the replacement adds.  A longer name is sent as it is (the daemon refuses
 * it: DSPK_ELIMIT). */
static const char *hello_name(struct hello_args *a) {
  static const char fffd[] = "\xef\xbf\xbd";
  size_t n = strlen(a->name), i = 0, o = 0;
  if (n > DSPK__CLIENT_NAME_MAX || dspk__utf8_valid(a->name, n))
    return a->name;
  while (i < n) {
    size_t k = dspk__utf8_seq(a->name + i, n - i);
    const char *p = k ? a->name + i : fffd;
    size_t m = k ? k : sizeof fffd - 1;
    if (o + m > DSPK__CLIENT_NAME_MAX)
      break;
    memcpy(a->sane + o, p, m);
    o += m;
    i += k ? k : 1;
  }
  a->sane[o] = '\0';
  return a->sane;
}

/* Whether v is a Slurm job id as hello's job takes it: a decimal number
 * from 1 to 2^64-1 without leading zeros, signs or blanks; its value in
 * *id. */
static bool job_id(const char *v, uint64_t *id) {
  char *end;
  unsigned long long n;
  if (*v < '1' || *v > '9')
    return false;
  errno = 0;
  n = strtoull(v, &end, 10);
  if (errno || *end)
    return false;
  *id = (uint64_t)n;
  return true;
}

/* The Slurm job this process runs in, which hello tells the daemon
 * (docs/protocol.md, "Slurm jobs"): $DSPK_JOB when set and not empty,
 * else $SLURM_JOB_ID; 0 in *job when neither names one.  A $DSPK_JOB that
 * is set but no job id is DSPK_EINVAL, said in connect_err with its value
 * (bytes other than printable ASCII as \xHH, cut at 40): set by the user,
 * it is not dropped in silence, nor is $SLURM_JOB_ID taken instead.  A
 * $SLURM_JOB_ID that is no job id (Slurm's own variable) names none. */
static int env_job(uint64_t *job) {
  const char *v = getenv("DSPK_JOB");
  char shown[4 * 40 + 1];
  size_t o = 0;
  *job = 0;
  if (v && *v) {
    if (job_id(v, job))
      return 0;
    for (size_t i = 0; v[i] && i < 40; i++) {
      unsigned char b = (unsigned char)v[i];
      o += (size_t)snprintf(shown + o, sizeof shown - o, b >= 0x20 && b < 0x7f && b != '\\'
                                                         ? "%c" : "\\x%02x", b);
    }
    snprintf(connect_err, sizeof connect_err, "$DSPK_JOB '%s%s' is not a Slurm job id (a "
             "decimal number from 1 to 18446744073709551615, without leading zeros, signs "
             "or blanks); unset it, or set it empty, for $SLURM_JOB_ID's",
             shown, strlen(v) > 40 ? "..." : "");
    return DSPK_EINVAL;
  }
  v = getenv("SLURM_JOB_ID");
  if (!v || !job_id(v, job))
    *job = 0;
  return 0;
}

/* hello's params, packed from the protocol's table (proto/schema.c). */
static void pack_hello(void *ud, struct dspk__wbuf *w) {
  const struct dspk__method *m = &dspk__methods[DSPK__M_HELLO];
  struct hello_args *a = ud;
  struct dspk__pval v[DSPK__MAX_PARAMS] = {0};
  const char *name = hello_name(a);
  v[DSPK__HELLO_VERSION] = (struct dspk__pval){.set = true, .v = {.u = DSPK_PROTOCOL_VERSION}};
  v[DSPK__HELLO_CLIENT] = (struct dspk__pval){.set = true, .v = {.s = {name, strlen(name)}}};
  if (a->job)
    v[DSPK__HELLO_JOB] = (struct dspk__pval){.set = true, .v = {.u = a->job}};
  dspk__params_encode(w, m->params, m->nparams, v);
}

/* Frees what a client holds besides its socket and shared memory. */
static void client_free(dspk_client *c) {
  for (size_t i = 0; i < c->nfmaps; i++)
    close(c->fmaps[i].fd);
  free(c->fmaps);
  for (size_t i = 0; i < c->nsinks; i++)
    close(c->sinks[i].fd);
  free(c->sinks);
  if (c->sink_pipe_ok) {
    close(c->sink_pipe[0]);
    close(c->sink_pipe[1]);
  }
  dspk__land_free(c->land);
  free(c->rbase);
  free(c->spare);
  free(c->inflight);
  for (size_t i = 0; i < c->ndone; i++)
    free(c->done[i].buf);
  free(c->done);
  free(c->pq);
  free(c->abandoned);
  free(c->bufdev);
  if (c->zone_ready)
    msgpack_zone_destroy(&c->zone);
  free(c);
}

/* connect(2) on fd, bounded by timeout_ms (> 0): a daemon whose listen
 * backlog is full makes a non-blocking connect fail with EAGAIN, tried
 * again every 10 ms until the time runs out (ETIMEDOUT).  0 or errno. */
static int connect_bounded(int fd, const struct sockaddr_un *sa, socklen_t salen,
                           int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  int fl = fcntl(fd, F_GETFL), e = 0;
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return errno;
  for (;;) {
    if (connect(fd, (const struct sockaddr *)sa, salen) == 0)
      break;
    e = errno;
    if (e == EINTR)
      continue;
    if (e != EAGAIN && e != EINPROGRESS)
      break;
    if (e == EINPROGRESS) { /* not for AF_UNIX on Linux; handled all the same */
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      socklen_t sl = sizeof e;
      int64_t left = deadline - now_ms();
      if (left <= 0 || poll(&pfd, 1, (int)(left > INT_MAX ? INT_MAX : left)) == 0) {
        e = ETIMEDOUT;
        break;
      }
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0)
        e = errno;
      break;
    }
    if (now_ms() >= deadline) {
      e = ETIMEDOUT;
      break;
    }
    (void)poll(NULL, 0, 10);
    e = 0;
  }
  if (fcntl(fd, F_SETFL, fl) < 0 && !e)
    e = errno;
  return e;
}

DSPK_EXPORT int dspk_connect(const char *socket_path, const char *client_name,
                             dspk_client **out) {
  return dspk_connect_timeout(socket_path, client_name, 0, out);
}

DSPK_EXPORT int dspk_connect_timeout(const char *socket_path, const char *client_name,
                                     int timeout_ms, dspk_client **out) {
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)], why[400];
  struct sockaddr_un sa;
  socklen_t salen = 0;
  struct hello_args ha = {client_name ? client_name : "libdspkclient", 0, ""};
  struct dspk__resp r;
  dspk_client *c;
  int rc;

  connect_err[0] = '\0';
  if (!out) {
    snprintf(connect_err, sizeof connect_err, "out is NULL");
    return DSPK_EINVAL;
  }
  if ((rc = env_job(&ha.job)) != 0)
    return rc;
  if (socket_path) {
    if (strlen(socket_path) >= sizeof path) {
      snprintf(connect_err, sizeof connect_err,
               "socket path longer than %zu bytes", sizeof path - 1);
      return DSPK_ELIMIT;
    }
    strcpy(path, socket_path);
  } else if (dspk_default_socket(path, sizeof path) != 0) {
    const char *env = getenv("DSPK_SOCKET");
    snprintf(connect_err, sizeof connect_err, "%s longer than %zu bytes",
             env && *env ? "socket path from $DSPK_SOCKET" : "default socket path",
             sizeof path - 1);
    return DSPK_ELIMIT;
  }
  /* "@name": the abstract socket name (proto/sockpath.h), else a path. */
  if ((rc = dspk__sockaddr_parse(path, &sa, &salen, why, sizeof why)) != 0) {
    dspk__format(connect_err, sizeof connect_err, "%s%s", socket_path ? "" : "$DSPK_SOCKET: ",
                 why);
    return rc;
  }

  c = calloc(1, sizeof(*c));
  if (!c) {
    snprintf(connect_err, sizeof connect_err, "out of memory");
    return DSPK_ENOMEM;
  }
  c->next_id = 1;
  c->pid = getpid();
  dspk__limits_default(&c->lim);
  /* Responses may carry big outputs: accept up to 4 GiB per message and a
   * generous depth for status details.  The scanner still bounds every
   * count by the bytes that can follow. */
  if (sizeof(size_t) > 4)
    c->lim.max_message = (size_t)4 << 30;
  c->lim.max_depth = 32;
  c->lim.max_objects = (uint64_t)1 << 24; /* a trace's events, a status */
  c->send_max = (size_t)256 << 20; /* until hello says otherwise */
  c->shm_idle_bytes = SHM_IDLE_BYTES;
  c->cpu_quota = UINT64_MAX;
  c->shm_threshold = DSPK_SHARED_THRESHOLD;
  {
    /* A size as every size dspk takes ("1M", "4096"); not one: ignored. */
    const char *e = getenv("DSPK_SHARED_THRESHOLD");
    uint64_t v;
    if (e && *e && dspk__parse_size(e, &v) == 0)
      c->shm_threshold = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
  }
  c->lim.max_elements = (uint64_t)1 << 32;
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    snprintf(connect_err, sizeof connect_err, "socket: %s", strerror(errno));
    rc = DSPK_ECONNECT;
    goto err_alloc;
  }
  {
    /* A larger send buffer (the kernel caps it at net.core.wmem_max and
     * doubles it): a request of megabytes crosses in a few large steps
     * instead of one wake-up of the daemon per 208 KiB (the default), 8 MiB
     * there and back about 20% faster on the development VM.  Best effort. */
    int sb = SOCK_SNDBUF;
    (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
  }
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
  c->timeout_by = "dspk_connect_timeout";
  {
    int e = 0;
    if (c->timeout_ms)
      e = connect_bounded(c->fd, &sa, salen, c->timeout_ms);
    else if (connect(c->fd, (struct sockaddr *)&sa, salen) != 0)
      e = errno;
    /* The path as a message may show it: a newline or an escape sequence
     * in it written as an escape (dspk__utf8_visible), as dspk-submit
     * shows it. */
    char shown[512];
    struct stat st;
    dspk__utf8_visible(shown, sizeof shown, path, strlen(path));
    if (e == ETIMEDOUT) {
      dspk__format(connect_err, sizeof connect_err, "connect to %s: the daemon accepted no "
                   "connection within %d ms", shown, c->timeout_ms);
      rc = DSPK_ETIMEDOUT;
      goto err_socket;
    }
    if ((e == ECONNREFUSED || e == ENOTSOCK) && !dspk__sock_is_abstract(path) &&
        stat(path, &st) == 0 &&
        !S_ISSOCK(st.st_mode)) {
      /* Something is there, but nothing a daemon could listen on: say
       * what it is (the kernel says "Connection refused"), in the words
       * dspk-submit uses too (proto/sockpath.h). */
      char why[600];
      dspk__not_socket(why, sizeof why, path, strlen(path), st.st_mode);
      dspk__format(connect_err, sizeof connect_err, "connect to %s: %s", shown, why);
      rc = DSPK_ECONNECT;
      goto err_socket;
    }
    if (e && dspk__sock_is_abstract(path)) {
      /* No file to look at: say which form was taken, so that a path
       * meant with a leading '@' can be told ("./@x" names that file). */
      dspk__format(connect_err, sizeof connect_err,
                   "connect to %s: %s (an abstract socket: a leading '@' names the "
                   "abstract namespace)", shown,
                   e == ECONNREFUSED ? "no daemon listens on this abstract name" : strerror(e));
      rc = e == EACCES || e == EPERM ? DSPK_EPERM : DSPK_ECONNECT;
      goto err_socket;
    }
    if (e) {
      dspk__format(connect_err, sizeof connect_err, "connect to %s: %s", shown, strerror(e));
      rc = e == EACCES || e == EPERM ? DSPK_EPERM : DSPK_ECONNECT;
      goto err_socket;
    }
  }
  rc = dspk__call(c, "hello", pack_hello, &ha, &r);
  if (rc != 0) {
    /* A refusal (protocol.error) is the reason itself, not "no longer usable". */
    snprintf(connect_err, sizeof connect_err, "hello: %.480s",
             c->broken ? c->broken_why : c->err);
    goto err_socket;
  }
  {
    struct dspk__pval v[DSPK__MAX_PARAMS];
    uint64_t mm = 0, proto = DSPK_PROTOCOL_VERSION;
    char why[256];
    /* The version first: another protocol's hello may carry other fields
     * (other limits, none), which are no EPROTO but that version's. */
    if (dspk__arg_u64(r.msg.result, "protocol", &proto, NULL, 0) == 0 &&
        proto != DSPK_PROTOCOL_VERSION) {
      snprintf(connect_err, sizeof connect_err,
               "daemon speaks protocol %llu, this library %d",
               (unsigned long long)proto, DSPK_PROTOCOL_VERSION);
      rc = DSPK_EVERSION;
      dspk__resp_free(&r);
      goto err_socket;
    }
    if ((rc = dspk__result_decode(&dspk__methods[DSPK__M_HELLO], r.msg.result, v, why,
                                  sizeof why)) < 0) {
      snprintf(connect_err, sizeof connect_err, "hello: %.480s", why);
      dspk__resp_free(&r);
      goto err_socket;
    }
    dspk__pval_str(&v[DSPK__R_HELLO_DAEMON], c->daemon_version, sizeof c->daemon_version);
    /* The daemon's own limit, whatever it is (dspkd takes 64 bytes and up):
     * every size this library sends is computed from it (dspk_max_message),
     * and a request that would not fit fails here, before it is sent.  None
     * (0) could carry no request at all: not a hello of this protocol. */
    dspk__arg_u64(v[DSPK__R_HELLO_LIMITS].v.o, "max_message", &mm, NULL, 0);
    if (mm == 0) {
      snprintf(connect_err, sizeof connect_err, "hello: result.limits.max_message is 0");
      rc = DSPK_EPROTO;
      dspk__resp_free(&r);
      goto err_socket;
    }
    c->send_max = mm > SIZE_MAX ? SIZE_MAX : (size_t)mm;
    uint64_t quota = UINT64_MAX;
    dspk__arg_u64(v[DSPK__R_HELLO_LIMITS].v.o, "cpu_memory_quota", &quota, NULL, 0);
    if (quota / 8 < c->shm_idle_bytes)
      c->shm_idle_bytes = (size_t)(quota / 8);
    c->cpu_quota = quota;
    proto = v[DSPK__R_HELLO_PROTOCOL].v.u;
    if (proto != DSPK_PROTOCOL_VERSION) {
      snprintf(connect_err, sizeof connect_err,
               "daemon speaks protocol %llu, this library %d",
               (unsigned long long)proto, DSPK_PROTOCOL_VERSION);
      rc = DSPK_EVERSION;
      dspk__resp_free(&r);
      goto err_socket;
    }
  }
  dspk__resp_free(&r);
  *out = c;
  return 0;

err_socket:
  close(c->fd);
err_alloc:
  client_free(c);
  return rc;
}

DSPK_EXPORT void dspk_close(dspk_client *c) {
  if (!c)
    return;
  if (c->pid != getpid()) {
    /* A child of fork(): its copy of the descriptor and of the mappings go,
     * nothing is sent and the socket is not shut down (the parent's
     * connection, its buffers and its temporaries stay the parent's). */
    dspk__shm_close(c);
    if (c->fd >= 0)
      close(c->fd);
    client_free(c);
    return;
  }
  if (c->in_progress) {
    /* From c's own progress callback: the call that invoked it still uses
     * c.  The connection ends now (that call fails); a dspk_close after
     * that call returned frees c. */
    c->closed = true;
    if (!c->broken) {
      (void)shutdown(c->fd, SHUT_RDWR);
      /* The call that invoked the callback says it as it is (dspk.h);
       * later calls say "connection is no longer usable: " before it. */
      c->broken_unseen = true;
      mark_broken(c, dspk__cerr(c, DSPK_ECLOSED, "closed by dspk_close from the "
                                "progress callback"));
    }
    return;
  }
  dspk__shm_close(c);
  if (c->fd >= 0)
    close(c->fd);
  client_free(c);
}

DSPK_EXPORT void dspk_set_progress(dspk_client *c, dspk_progress_fn fn,
                                   void *ud) {
  if (!c)
    return;
  c->progress = fn;
  c->progress_ud = ud;
}

DSPK_EXPORT int dspk_set_timeout(dspk_client *c, int ms) {
  if (!c)
    return DSPK_EINVAL;
  if (ms < 0)
    return dspk__argerr(c, "dspk_set_timeout: ms is %d (0: no limit)", ms);
  c->timeout_ms = ms;
  c->timeout_by = "dspk_set_timeout";
  return 0;
}
