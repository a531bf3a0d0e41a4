/*
 * The scheduler (daemon/sched.h): jobs, the per-device queues, the runner
 * threads and their in-flight lists, and the loop's side of finished jobs.
 *
 * Scheduling: each connection has its own FIFO per device, linked into the
 * device's ring while it holds jobs; the runner takes one job from the ring's
 * head queue and moves that queue to the tail, so connections take turns and
 * a client that floods a device cannot starve another.  Jobs of one
 * connection on one device start in arrival order.  Internal jobs (releasing
 * a buffer's memory) have a queue of their own in the same ring.
 *
 * Runners: each device's runner opens the device, enqueues its jobs' work
 * one at a time, and closes the device before it exits; only the runner
 * ever calls the device's backend.  Finished jobs go on the daemon's done
 * list and the runner wakes the loop with uv_async_send(); the loop
 * (dspkd_sched_done_cb) writes the response the runner encoded and frees
 * the job.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/dspkd.h"
#include "daemon/log.h"
#include "daemon/sched.h"
#include "daemon/teardown.h"

/* One connection's FIFO of jobs for one device, linked into the device's
 * round-robin ring while it holds jobs.  Guarded by the device's mutex. */
struct cqueue {
  struct job *head, *tail;
  struct cqueue *next; /* in the ring */
  bool in_ring;
  /* When its owner, a user (its connections' queues share it) or the
   * system, was last served on this device (the device's `turns` then). */
  uint64_t *turn, own_turn;
};

/* The singly linked FIFOs here (the ring, a queue, the in-flight list, the
 * done and note lists): head and tail pointers, linked through the member
 * `link`.  FIFO_PUSH appends x; FIFO_UNLINK takes x out wherever it is in
 * the list (nothing when it is not there).  Each evaluates x once. */
#define FIFO_PUSH(head, tail, x, link)                                         \
  do {                                                                         \
    __typeof__(x) x_ = (x);                                                    \
    x_->link = NULL;                                                           \
    if (tail)                                                                  \
      (tail)->link = x_;                                                       \
    else                                                                       \
      (head) = x_;                                                             \
    (tail) = x_;                                                               \
  } while (0)

#define FIFO_UNLINK(head, tail, x, link)                                       \
  do {                                                                         \
    __typeof__(x) x_ = (x), prev_ = NULL;                                      \
    for (__typeof__(x) p_ = (head); p_; prev_ = p_, p_ = p_->link) {           \
      if (p_ != x_)                                                            \
        continue;                                                              \
      if (prev_)                                                               \
        prev_->link = x_->link;                                                \
      else                                                                     \
        (head) = x_->link;                                                     \
      if ((tail) == x_)                                                        \
        (tail) = prev_;                                                        \
      break;                                                                   \
    }                                                                          \
    x_->link = NULL;                                                           \
  } while (0)

/* The internal queue of each device. */
static struct cqueue dspkd_sched_sysq[DSPKD_MAX_DEVICES];

struct cqueue *dspkd_sched_conn_new(struct dspkd *d) {
  return calloc(d->ndevs ? (size_t)d->ndevs : 1, sizeof(struct cqueue));
}

void dspkd_sched_conn_free(struct cqueue *q) { free(q); }

/* ---- jobs ------------------------------------------------------------- */

struct job *dspkd_job_new(struct conn *c, enum job_kind kind, uint32_t msgid,
                    struct device *dev) {
  struct job *j = calloc(1, sizeof(*j));
  if (!j)
    return NULL;
  j->kind = kind;
  j->msgid = msgid;
  j->dev = dev;
  j->conn = c;
  j->uid = c ? (uint32_t)c->uid : (uint32_t)-1;
  atomic_init(&j->cancel, 0);
  if (c)
    dspkd_conn_ref(c);
  return j;
}

void dspkd_job_free(struct dspkd *d, struct job *j) {
  if (!j)
    return;
  if (j->landed)
    j->buf->landing--;
  if (j->reading) /* not answered from the buffer's block (or dropped) */
    dspkd_quota_reads_done(j->buf);
  for (int i = 0; i < j->nrefs; i++)
    dspkd_dbuf_unref(d, j->refs[i]);
  dspkd_chunk_unref(j->chunk);
  dspkd_wreq_free(j->resp);
  if (j->share_counted && j->conn) /* its memfd is closed with the buffer */
    dspkd_shm_share_count(j->conn, -1);
  free(j->errmsg);
  if (j->conn)
    dspkd_conn_unref(j->conn);
  free(j);
}

static const char *op_name(dspk_op kind) {
  switch (kind) {
#define XX(e, name)                                                            \
  case DSPK_OP_##e:                                                            \
    return name;
    DSPK_OP_MAP(XX)
#undef XX
  default:
    return "?";
  }
}

/* The log line of a task that failed (loop thread): its message, else msg
 * (the one its client got), else the code's. */
static void log_task_failed(struct job *j, int code, const char *msg) {
  struct conn *c = j->conn;
  dspkd_log_task_failed(c ? (long)c->uid : -1L, j->dev ? j->dev->id : NULL,
                        op_name(j->op.kind), c ? c->id : 0, c ? (long)c->pid : 0L, code,
                        j->op.kind == DSPK_OP_KERNEL, j->errmsg ? j->errmsg : msg);
}

/* The method of a client's buffer job, for its log line. */
static const char *buf_method(const struct job *j) {
  switch (j->kind) {
  case JOB_BUF_CREATE:
    return j->share_counted || j->buf->share_fd >= 0 ? "buffer.share"
           : j->buf->has_file                         ? "buffer.import"
                                                      : "buffer.create";
  case JOB_BUF_WRITE:
    return "buffer.write";
  case JOB_BUF_READ:
    return "buffer.read";
  default:
    return NULL;
  }
}

/* The log line of a client's job that failed once it had reached its
 * device (loop thread): a task's "task failed" line; a buffer request's as
 * every method's failed request (daemon/conn.c), "client N: METHOD #ID:
 * ECODE: message", at the one rule's level (daemon/log.c): it failed on the
 * device or was canceled there, so never the client's mistake. */
static void log_failed(struct job *j, int code, const char *msg) {
  struct conn *c = j->conn;
  const char *method = buf_method(j);
  enum dspkd_level lv;
  if (j->kind == JOB_TASK) {
    log_task_failed(j, code, msg);
    return;
  }
  if (!c || !method)
    return;
  lv = dspkd_log_fail_level(code, false);
  if (dspkd_log_client_line_ok((long)c->uid, lv))
    dspkd_log(lv, "client %llu: %s #%u: %s: %s", (unsigned long long)c->id, method, j->msgid,
              dspk__err_name(code), j->errmsg ? j->errmsg : msg && *msg ? msg
                                                            : dspk__strerror(code));
}

static void ring_push(struct device *dev, struct cqueue *q) {
  q->in_ring = true;
  FIFO_PUSH(dev->ring_head, dev->ring_tail, q, next);
}

/* Unlinks q from the ring (dev->mu held). */
static void ring_remove(struct device *dev, struct cqueue *q) {
  if (!q->in_ring)
    return;
  FIFO_UNLINK(dev->ring_head, dev->ring_tail, q, next);
  q->in_ring = false;
}

/* Finished jobs go to the loop: the done list and a wake-up, unless the
 * loop itself answers them right after the read it is in (wake false). */
static void post_done(struct dspkd *d, struct job *j, bool wake) {
  pthread_mutex_lock(&d->done_mu);
  FIFO_PUSH(d->done_head, d->done_tail, j, next);
  pthread_mutex_unlock(&d->done_mu);
  if (wake)
    uv_async_send(&d->done_async);
}

/* A client job's work is done: the device's counts (dev->mu held). */
static void count_done(struct device *dev, struct job *j) {
  dev->running--;
  if (j->err)
    dev->failed++;
  else
    dev->completed++;
  j->state = JOB_DONE;
}

/* A tiny task on the cpu: at most this many bytes of operands and results. */
#define INLINE_MAX_BYTES ((size_t)64 << 10)

/* Runs a tiny map or reduce on cpu:0, a small gemm with nothing to tune
 * (backend quick), a buffer.read of cpu:0's memory, or the answer of a
 * buffer.write received in place, on
 * the loop thread itself when the
 * runner is idle (nothing queued, nothing in flight): handing it to the
 * runner and its answer back cost two thread wake-ups (about 17 us on a VM,
 * more than the task and its ping-sized round trip together).  The runner
 * is asleep and stays so (only the loop queues jobs, and it is busy here;
 * a runner awake to settle or sweep while idle holds dev->busy), so the
 * backend is still used by one thread at a time.  The cpu's work is
 * done when run returns (its fences are always reached).  Ops that may
 * plan or tune (fft, fir, a gemm not decided yet) go to the runner, and so
 * does anything longer than about a quarter millisecond (the loop serves
 * every client meanwhile).  true when it ran. */
static bool run_inline(struct device *dev, struct job *j) {
  const struct dspk__op *op = &j->op;
  uint64_t start, now;
  size_t bytes = 0;

  if (j->kind == JOB_BUF_WRITE && j->landed) {
    /* Its data is in the buffer already (received in place): it only
     * answers, on any device. */
  } else if (j->kind == JOB_BUF_READ && strcmp(dev->be->name, "cpu") == 0 &&
             !j->buf->has_file) {
    /* A read of cpu:0's own memory (not shared memory, which is copied):
     * answered from the buffer's block (the answer refers to it), or a copy
     * of less than 64 KiB (DSPKD_SEND_IN_PLACE_MIN). */
  } else if (j->kind == JOB_TASK && dev->be->quick && op->kind == DSPK_OP_GEMM) {
    /* A small gemm whose thread count is decided (backend quick), asked
     * once the device is open (bdev is set); and the connection's only
     * request in flight: a client that pipelines many goes through the
     * runner, in turns with the others (each would hold the loop for a
     * quarter millisecond, tests/daemon fairness). */
    bool open, quick = false;
    if (j->conn->inflight != 1)
      return false;
    pthread_mutex_lock(&dev->mu);
    open = dev->open_state == 1;
    pthread_mutex_unlock(&dev->mu);
    if (open)
      quick = dev->be->quick(dev->bdev, op) != 0;
    if (!quick)
      return false;
  } else {
    if (j->kind != JOB_TASK || strcmp(dev->be->name, "cpu") != 0 ||
        (op->kind != DSPK_OP_MAP && op->kind != DSPK_OP_REDUCE))
      return false;
    for (int i = 0; i < op->nin; i++)
      bytes += dspk__tensor_nbytes(&op->in[i]);
    for (int i = 0; i < op->nout; i++)
      bytes += dspk__tensor_nbytes(&op->out[i]);
    if (bytes > INLINE_MAX_BYTES)
      return false;
  }
  pthread_mutex_lock(&dev->mu);
  if (dev->busy || dev->ring_head || dev->stop || dev->open_state != 1) {
    pthread_mutex_unlock(&dev->mu);
    return false;
  }
  dev->busy = true;
  j->state = JOB_RUNNING;
  dev->running++;
  dspkd_obs_job_start(dev, j);
  dev->current = j;
  pthread_mutex_unlock(&dev->mu);

  start = j->t.start;
  dspkd_job_execute(dev, j);
  now = dspkd_now_ns();
  dspkd_job_finish(dev, j, 0, now - start);

  pthread_mutex_lock(&dev->mu);
  dev->current = NULL;
  dspkd_obs_job_end(dev, j, start, now, NULL);
  count_done(dev, j);
  dev->busy = false;
  if (dev->sweep) /* an answer came out meanwhile: the runner's to sweep */
    pthread_cond_broadcast(&dev->cv);
  pthread_mutex_unlock(&dev->mu);
  /* Within a read, answered right after it (daemon/conn.c's on_read) with
   * no wake-up: an eventfd write, a turn through epoll and a read saved. */
  post_done(dev->d, j, !dev->d->in_read);
  if (dev->d->in_read)
    dev->d->inline_done = true;
  return true;
}

void dspkd_sched_submit(struct job *j) {
  struct device *dev = j->dev;
  struct conn *c = j->conn;
  struct cqueue *q = c ? &c->q[dev->idx] : dev->sysq;

  if (c) {
    j->cprev = NULL;
    j->cnext = c->jobs;
    if (c->jobs)
      c->jobs->cprev = j;
    c->jobs = j;
    c->inflight++;
    dspkd_quota_charge(j);
  }
  memset(&j->t, 0, sizeof j->t);
  j->t.queued = dspkd_now_ns();
  if (c && run_inline(dev, j))
    return;
  pthread_mutex_lock(&dev->mu);
  j->state = JOB_QUEUED;
  j->q = q;
  if (!q->turn)
    q->turn = c && c->user ? &c->user->turn[dev->idx] : &q->own_turn;
  FIFO_PUSH(q->head, q->tail, j, next);
  if (!q->in_ring)
    ring_push(dev, q);
  if (c)
    dev->queued++;
  pthread_cond_signal(&dev->cv);
  pthread_mutex_unlock(&dev->mu);
}

/* Removes a finished or dropped job from its connection's in-flight list. */
static void conn_unlink_job(struct job *j) {
  struct conn *c = j->conn;
  if (!c)
    return;
  if (j->cprev)
    j->cprev->cnext = j->cnext;
  else
    c->jobs = j->cnext;
  if (j->cnext)
    j->cnext->cprev = j->cprev;
  j->cprev = j->cnext = NULL;
  c->inflight--;
  dspkd_quota_release(j);
}

/* Answers (code != 0) and frees jobs taken out of a queue. */
static void finish_dropped(struct dspkd *d, struct job *list, int code) {
  while (list) {
    struct job *j = list, *next = j->next;
    struct conn *c = j->conn;
    conn_unlink_job(j);
    /* In the words of the same event elsewhere: a running task canceled
     * says DSPKD_MSG_CANCELED too. */
    const char *why = code == DSPK_ESHUTDOWN ? "the daemon is stopping"
                      : code != DSPK_ECANCELED ? NULL
                      : j->kind == JOB_TASK    ? DSPKD_MSG_CANCELED
                                               : "the request was canceled";
    if (code)
      log_failed(j, code, why);
    if (c) /* taken out of its queue before it ran */
      dspkd_job_request_done(c, DSPK_ECANCELED);
    if (code && c && !c->closing)
      dspkd_conn_send_error(c, j->msgid, code, why);
    if (c)
      dspkd_conn_update_read(c);
    dspkd_job_free(d, j);
    list = next;
  }
}

void dspkd_sched_drop(struct dspkd *d, struct conn *c, int code) {
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    struct job *list = NULL, *tail = NULL;
    uint64_t n = 0;

    if (dev->open_state != 1 && dev->open_state != 0)
      continue;
    pthread_mutex_lock(&dev->mu);
    for (struct cqueue *q = dev->ring_head, *next; q; q = next) {
      next = q->next;
      if (q == dev->sysq || (c && q != &c->q[i]))
        continue;
      for (struct job *j = q->head; j; j = j->next)
        n++;
      if (tail)
        tail->next = q->head;
      else
        list = q->head;
      tail = q->tail;
      q->head = q->tail = NULL;
      ring_remove(dev, q);
    }
    dev->queued -= n;
    pthread_mutex_unlock(&dev->mu);
    finish_dropped(d, list, code);
  }
}

int dspkd_sched_cancel(struct conn *c, uint32_t msgid) {
  struct job *j;
  struct device *dev;
  int found = 0;

  /* c->jobs is newest first: a repeated msgid cancels the oldest request
   * still in flight with it (docs/protocol.md). */
  j = NULL;
  for (struct job *p = c->jobs; p; p = p->cnext)
    if (p->msgid == msgid)
      j = p;
  /* A buffer.write received in place is done once its data has come: the
   * bytes are in the buffer, and its job only answers in its turn. */
  if (!j || j->landed)
    return 0;
  dev = j->dev;
  pthread_mutex_lock(&dev->mu);
  if (j->state == JOB_QUEUED) {
    struct cqueue *q = j->q;
    FIFO_UNLINK(q->head, q->tail, j, next);
    if (!q->head)
      ring_remove(dev, q);
    dev->queued--;
    found = 2;
  } else if (j->state == JOB_RUNNING) {
    atomic_store(&j->cancel, 1);
    found = 1;
  }
  pthread_mutex_unlock(&dev->mu);
  if (found == 2)
    finish_dropped(c->d, j, DSPK_ECANCELED);
  return found != 0;
}

void dspkd_sched_post_note(struct dspkd *d, struct job *j, struct wreq *wr) {
  struct note *n = malloc(sizeof(*n));
  if (!n) {
    dspkd_wreq_free(wr);
    return;
  }
  n->c = j->conn; /* only the loop dereferences it */
  n->wr = wr;
  pthread_mutex_lock(&d->done_mu);
  FIFO_PUSH(d->notes_head, d->notes_tail, n, next);
  pthread_mutex_unlock(&d->done_mu);
  uv_async_send(&d->done_async);
}

void dspkd_sched_done_cb(uv_async_t *h) {
  struct dspkd *d = h->data;
  struct job *list;
  struct note *notes;

  pthread_mutex_lock(&d->done_mu);
  list = d->done_head;
  d->done_head = d->done_tail = NULL;
  notes = d->notes_head;
  d->notes_head = d->notes_tail = NULL;
  pthread_mutex_unlock(&d->done_mu);

  /* Notifications first: each precedes its job's completion. */
  while (notes) {
    struct note *n = notes;
    notes = n->next;
    if (!n->c->closing)
      dspkd_conn_send(n->c, n->wr);
    else
      dspkd_wreq_free(n->wr);
    free(n);
  }

  while (list) {
    struct job *j = list;
    struct conn *c = j->conn;
    /* Its answer's reservation is given back once the answer is queued (and
     * counted as unsent), not before: in between the user's answers would
     * read low, and its paused connections would take more requests. */
    size_t resv = j->resv_answer;
    list = j->next;
    j->next = NULL;
    j->resv_answer = 0;
    conn_unlink_job(j);
    if (j->err < 0)
      log_failed(j, j->err, NULL);
    dspkd_job_request_done(c, j->err);
    if (j->kind == JOB_BUF_CREATE && j->err == 0 && !c->closing) {
      /* The slot was reserved when the request came in. */
      if (dspkd_conn_buf_add(c, j->buf) != 0)
        dspkd_error("client %llu: cannot record buffer %llu",
                    (unsigned long long)c->id, (unsigned long long)j->buf->id);
    }
    dspkd_quota_keep_moved(j);
    if (j->resp && !c->closing) {
      if (j->rdpin) { /* sent from the buffer's block: the answer holds it */
        dspkd_dbuf_ref(j->buf);
        dspkd_conn_ref(c);
        j->rdpin->b = j->buf;
        j->rdpin->c = c;
        j->rdpin = NULL;
        j->reading = false; /* the answer's read now (daemon/task.c unpin_read) */
      }
      if (j->share_counted && j->resp->fd >= 0) { /* the answer holds the memfd now */
        j->resp->share_conn = c;
        j->share_counted = false;
      }
      dspkd_conn_send(c, j->resp);
      j->resp = NULL;
    } else if (!c->closing) {
      /* The runner could not allocate the answer: answer ENOMEM (the
       * connection closes if even that fails), never nothing. */
      dspkd_conn_send_error(c, j->msgid, DSPK_ENOMEM, "out of memory: the answer could not be built");
    }
    if (resv) {
      c->reserved -= resv;
      dspkd_user_answers(c, -(int64_t)resv);
    }
    dspkd_conn_update_read(c);
    dspkd_job_free(d, j);
  }
  dspkd_stop_progress(d);
}

/* ---- runners ---------------------------------------------------------- */

static void runner_log(void *ud, int level, const char *msg) {
  struct device *dev = ud;
  /* The backends' levels: 0 error, 1 warn, 2 info, 3 debug. */
  enum dspkd_level l = level <= 0   ? DSPKD_ERROR
                       : level == 1 ? DSPKD_WARN
                       : level == 2 ? DSPKD_INFO
                                    : DSPKD_DEBUG;
  dspkd_log(l, "%s: %s", dev->id, msg);
}

/* ---- the in-flight list ------------------------------------------------

 * A runner enqueues a job's work (dspkd_job_execute), records a fence behind it
 * and keeps the job in its in-flight list, up to dev->depth jobs, taking
 * the next job meanwhile: a GPU then has the next task's work queued before
 * the previous one finished.  A job is answered, oldest first, once its
 * fence completed: its outputs are final, an error the device reports
 * through its fence becomes its own answer, and its time_us covers the
 * device's work.  On the cpu every fence is reached when run returns, so
 * each job is answered right after it ran.  Runner thread only. */

static void ifl_push(struct device *dev, struct job *j) {
  FIFO_PUSH(dev->ifl_head, dev->ifl_tail, j, inext);
  dev->nifl++;
}

/* Copies the backend's counters into dev->stats (status shows them from
 * now on).  Runner thread, dev->mu not held. */
static void stats_refresh(struct device *dev) {
  struct dspk__devstats stats;
  if (!dev->be->stats)
    return;
  memset(&stats, 0, sizeof stats);
  dev->be->stats(dev->bdev, &stats);
  pthread_mutex_lock(&dev->mu);
  dev->stats = stats;
  pthread_mutex_unlock(&dev->mu);
}

/* The oldest job's work is done (err: what its fence reported): answers it
 * (a client job goes on the done list) or frees it (an internal job). */
static void ifl_complete(struct device *dev, int err) {
  struct dspkd *d = dev->d;
  struct job *j = dev->ifl_head;
  uint64_t now = dspkd_now_ns();
  uint64_t start = j->t.start > dev->last_done_ns ? j->t.start : dev->last_done_ns;
  bool counted = dspkd_job_counted(j);
  struct dspk__devstats stats;

  FIFO_UNLINK(dev->ifl_head, dev->ifl_tail, j, inext);
  dev->nifl--;
  dev->last_done_ns = now;
  /* time_us: from when the runner took it, so never less than its work on
   * the device (the turn's start, kept for the busy time, can be later than
   * the work's start when the runner saw the job before it finish late). */
  if (counted)
    dspkd_job_finish(dev, j, err, now - j->t.start);
  if (dev->be->stats) {
    memset(&stats, 0, sizeof stats);
    dev->be->stats(dev->bdev, &stats);
  }
  pthread_mutex_lock(&dev->mu);
  if (dev->be->stats)
    dev->stats = stats;
  dspkd_obs_job_end(dev, j, start, now, dev->ifl_head);
  if (counted)
    count_done(dev, j);
  pthread_mutex_unlock(&dev->mu);
  if (counted)
    post_done(d, j, true);
  else
    free(j);
}

/* Answers the in-flight jobs whose work is done, oldest first.  wait: block
 * until the oldest one is done.  Runner thread, dev->mu not held. */
static void ifl_reap(struct device *dev, bool wait) {
  const struct dspk__backend *be = dev->be;
  while (dev->ifl_head) {
    struct job *j = dev->ifl_head;
    int r = 1;
    if (j->fence) {
      if (wait) {
        r = be->fence_wait(dev->bdev, j->fence);
        if (r == 0)
          r = 1;
      } else {
        r = be->fence_query(dev->bdev, j->fence);
      }
      if (r == 0)
        return;
      be->fence_destroy(dev->bdev, j->fence);
      j->fence = NULL;
    }
    ifl_complete(dev, r < 0 ? r : 0);
    wait = false;
  }
}

/* Runs one job taken from the ring (dev->mu not held): enqueues its work,
 * records its fence and puts it in the in-flight list. */
static void run_one(struct device *dev, struct job *j) {
  const struct dspk__backend *be = dev->be;
  bool counted = dspkd_job_counted(j);
#ifdef DSPK_TEST_HOOKS
  dspkd_test_runner_job(dev); /* DSPKD_TEST_EXIT=runner (daemon/testhooks.c) */
#endif
  dspkd_job_execute(dev, j);
  if (counted) {
    pthread_mutex_lock(&dev->mu);
    dev->current = NULL;
    pthread_mutex_unlock(&dev->mu);
  }
  /* A failed job waits for nothing of its own; an internal free is
   * deferred release by the backend's contract. */
  if (counted && j->err == 0 && be->fence_record) {
    int err = be->fence_record(dev->bdev, &j->fence);
    if (err < 0) {
      j->fence = NULL;
      dspkd_job_finish(dev, j, err, 0);
    }
  }
  ifl_push(dev, j);
  ifl_reap(dev, false);
}

static void *runner_main(void *arg) {
  struct device *dev = arg;
  struct dspkd *d = dev->d;
  /* Large FFTW plans are measured by a child dspkd (--fftw-measure), so the
   * planner stays free for the device's other tasks meanwhile; a client's
   * kernel source is compiled by one (--kernel-compile) under limits. */
  struct dspk__devenv env = {d->cache, runner_log, dev, "/proc/self/exe", "/proc/self/exe"};
  struct dspk__dev *bdev = NULL;
  struct dspk__devstats stats;
  char why[256] = "";
  char tname[16];
  bool settled = false; /* settle() ran since the runner last had work */
  int err;

  /* "dspk-run:" names runners for the exit checks (daemon/teardown.c). */
  snprintf(tname, sizeof tname, "dspk-run:%.6s", dev->id);
  pthread_setname_np(pthread_self(), tname);
  dspkd_heap_warm(); /* this thread's malloc arena */
  err = dev->be->open(dev->bindex, &env, &bdev);
  pthread_mutex_lock(&dev->mu);
  if (err < 0) {
    dev->open_state = err;
    snprintf(dev->open_err, sizeof dev->open_err, "%s", why[0] ? why : dspk__strerror(err));
    dev->exited = true;
    pthread_cond_broadcast(&dev->cv);
    pthread_mutex_unlock(&dev->mu);
    return NULL;
  }
  dev->bdev = bdev;
  memset(&dev->caps, 0, sizeof dev->caps);
  dev->be->caps(bdev, &dev->caps);
  /* raw_kernels leaves this device out: it runs none (devices lists no
   * kernel_langs, "any" passes it by, a task naming it is refused). */
  if (dev->caps.dtypes[DSPK_OP_KERNEL] && !dspkd_raw_kernels_on(&d->cfg, dev->id)) {
    dev->caps.dtypes[DSPK_OP_KERNEL] = 0;
    dev->caps.langs = 0;
    dev->kernels_off = true;
  }
  if (dev->be->stats) {
    memset(&stats, 0, sizeof stats);
    dev->be->stats(bdev, &stats);
    dev->stats = stats;
  }
  dev->open_state = 1;
  dev->obs.start_ns = dspkd_now_ns();
  pthread_cond_broadcast(&dev->cv);

  for (;;) {
    struct cqueue *q;
    struct job *j;

    /* busy (read by the loop's run_inline): a job is running or in flight. */
    dev->busy = dev->ifl_head != NULL;
    while (!dev->ring_head && !dev->ifl_head && !dev->stop) {
      /* Idle: what the backend's retirement queue still holds (the last
       * free's memory) is released now, on its fences, and the blocks
       * retired behind answers as soon as those are out (dev->sweep), not
       * at the next job.  busy keeps the loop's run_inline off the device
       * meanwhile; while run_inline holds it, this waits for its end (it
       * wakes the runner when a sweep is due). */
      bool do_settle = !settled && dev->be->settle, do_sweep = dev->sweep;
      if ((do_settle || do_sweep) && !dev->busy) {
        settled = true;
        dev->sweep = false;
        dev->busy = true;
        pthread_mutex_unlock(&dev->mu);
        if (do_sweep && dev->retired)
          dspkd_retired_sweep(dev, false);
        if (do_settle)
          dev->be->settle(bdev);
        stats_refresh(dev);
        pthread_mutex_lock(&dev->mu);
        dev->busy = false;
        continue;
      }
      pthread_cond_wait(&dev->cv, &dev->mu);
    }
    settled = false;
    if (!dev->ring_head || dev->nifl >= dev->depth) {
      /* Nothing more to enqueue (or enough enqueued): wait for the oldest
       * job in flight; none left and stopping: exit. */
      if (!dev->ifl_head)
        break;
      pthread_mutex_unlock(&dev->mu);
      ifl_reap(dev, true);
      pthread_mutex_lock(&dev->mu);
      continue;
    }
    /* Round robin between users, then between one user's connections: the
     * first queue in the ring of the user served longest ago gives one job
     * and goes to the tail. */
    q = dev->ring_head;
    for (struct cqueue *o = q->next; o; o = o->next)
      if (*o->turn < *q->turn)
        q = o;
    *q->turn = ++dev->turns;
    j = q->head;
    FIFO_UNLINK(q->head, q->tail, j, next);
    ring_remove(dev, q);
    if (q->head)
      ring_push(dev, q);
    j->state = JOB_RUNNING;
    dev->busy = true;
    if (dspkd_job_counted(j)) {
      dev->queued--;
      dev->running++;
    }
    dspkd_obs_job_start(dev, j); /* daemon/metrics.c */
    /* The exit handler cancels it from any thread (run_one clears it). */
    dev->current = dspkd_job_counted(j) ? j : NULL;
    pthread_mutex_unlock(&dev->mu);
    run_one(dev, j);
    pthread_mutex_lock(&dev->mu);
  }
  pthread_mutex_unlock(&dev->mu);

  dspkd_retired_sweep(dev, true);
  dev->be->close(bdev);
  dev->bdev = NULL;
  dspkd_info("%s: device closed", dev->id);
  pthread_mutex_lock(&dev->mu);
  dev->exited = true;
  pthread_mutex_unlock(&dev->mu);
  uv_async_send(&d->done_async);
  return NULL;
}

void dspkd_sched_sweep(struct device *dev) {
  pthread_mutex_lock(&dev->mu);
  dev->sweep = true;
  pthread_cond_broadcast(&dev->cv);
  pthread_mutex_unlock(&dev->mu);
}

void dspkd_sched_stop(struct dspkd *d) {
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    pthread_mutex_lock(&dev->mu);
    dev->stop = true;
    pthread_cond_broadcast(&dev->cv);
    pthread_mutex_unlock(&dev->mu);
  }
}

int dspkd_sched_join(struct dspkd *d, bool wait) {
  int all = 1;
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    bool exited;
    if (dev->joined)
      continue;
    pthread_mutex_lock(&dev->mu);
    exited = dev->exited;
    pthread_mutex_unlock(&dev->mu);
    if (!exited && !wait) {
      all = 0;
      continue;
    }
    pthread_join(dev->thread, NULL);
    dev->joined = true;
  }
  return all;
}

void dspkd_sched_counters(struct device *dev, uint64_t *queued, uint64_t *running,
                           uint64_t *completed, uint64_t *failed,
                           struct dspk__devstats *stats) {
  pthread_mutex_lock(&dev->mu);
  *queued = dev->queued;
  *running = dev->running;
  *completed = dev->completed;
  *failed = dev->failed;
  *stats = dev->stats;
  pthread_mutex_unlock(&dev->mu);
}

static void *runner_main(void *arg);

int dspkd_sched_start(struct device *dev) {
  sigset_t all, old;
  int err;

  dev->sysq = &dspkd_sched_sysq[dev->idx];
  memset(dev->sysq, 0, sizeof *dev->sysq);
  dev->sysq->turn = &dev->sysq->own_turn;
  dev->depth = dev->d->cfg.device_inflight ? dev->d->cfg.device_inflight : 1;
  /* Runners never take the daemon's signals: those reach the loop. */
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  err = pthread_create(&dev->thread, NULL, runner_main, dev);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err != 0) {
    dev->open_state = DSPK_ENOMEM;
    snprintf(dev->open_err, sizeof dev->open_err, "cannot start its runner: %s",
             strerror(err));
    dev->exited = true;
    dev->joined = true;
    return DSPK_ENOMEM;
  }
  dev->thread_started = true;
  return 0;
}

void dspkd_sched_cancel_all(struct dspkd *d, struct conn *c) {
  for (struct conn *p = c ? c : d->conns; p; p = c ? NULL : p->next)
    for (struct job *j = p->jobs; j; j = j->cnext)
      atomic_store(&j->cancel, 1);
}

/* Takes every client queue out of the device's ring (dev->mu held). */
static void unlink_client_queues(struct device *dev) {
  bool sys = false;
  for (struct cqueue *q = dev->ring_head, *next; q; q = next) {
    next = q->next;
    q->next = NULL;
    q->in_ring = false;
    if (q == dev->sysq) {
      sys = true;
      continue;
    }
    q->head = q->tail = NULL;
  }
  dev->ring_head = dev->ring_tail = sys ? dev->sysq : NULL;
  if (sys)
    dev->sysq->in_ring = true;
}

int dspkd_sched_abandon(struct dspkd *d, const struct device *self) {
  int canceled = 0;
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (!dev->thread_started || dev->joined)
      continue;
    pthread_mutex_lock(&dev->mu);
    dev->stop = true;
    unlink_client_queues(dev);
    if (dev->current && dev != self) {
      atomic_store(&dev->current->cancel, 1);
      canceled++;
    }
    pthread_cond_broadcast(&dev->cv);
    pthread_mutex_unlock(&dev->mu);
  }
  return canceled;
}

uint64_t dspkd_sched_clients_locked(struct device *dev, const struct cqueue *run_q) {
  uint64_t n = 0;
  for (struct cqueue *q = dev->ring_head; q; q = q->next)
    if (q != dev->sysq)
      n++;
  if (run_q && run_q != dev->sysq && !run_q->in_ring)
    n++;
  return n;
}
