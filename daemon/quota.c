/*
 * Quotas and the accounting behind them (docs/protocol.md, "Quotas"): what
 * each connection and each user (uid) holds of the daemon.  Everything here
 * runs on the loop thread.
 *
 * - Answers: dspkd_sched_submit reserves the bytes a job's answer may take (the
 *   data of a buffer.read, the inline results of a task) in c->reserved;
 *   the connection is not read while unsent + reserved answers exceed
 *   max_unsent, so answers of admitted requests cannot pile up beyond it
 *   (by more than one answer); nor while those of all the user's
 *   connections together (user->answers) exceed max_user_unsent, but for a
 *   connection that owes none, which reads up to twice that.
 * - Device memory: a connection's buffers (created or being created) and
 *   the device memory its tasks in flight take for inline operands and
 *   results count against max_conn_memory (per connection) and
 *   max_user_memory (per user), on each device.  A request beyond either is
 *   answered ELIMIT before anything is allocated.
 *   A connection of a Slurm job (daemon/jobs.c) also counts against
 *   max_job_memory, over every connection of that job.  And every
 *   connection's together (dev->clients_mem) against max_memory: the
 *   quotas of each user leave the sum of all users unbounded (probe 21 E1:
 *   three users held 24 GiB of cpu buffers on a 23.5 GiB host, which the
 *   kernel backs only when they are written: the OOM killer, not an
 *   answer, would have come).  Past it a request is ENOMEM, the daemon's
 *   shortage, logged as a warning at most once a minute.
 * - Connections and read buffers per user: max_user_clients and
 *   max_user_partial (checked by daemon/conn.c with these counters).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/dspkd.h"
#include "daemon/log.h"

/* Whether u is no longer needed: no connection, no buffer.share memfd
 * counted, no mapping of its buffers (a runner lowers that count once the
 * last is unmapped, after its connections are gone: the struct is freed
 * then by the next dspkd_user_get's sweep). */
static bool user_unused(struct duser *u) {
  return u->nconns == 0 && u->share_fds == 0 && atomic_load(&u->maps) == 0;
}

struct duser *dspkd_user_get(struct dspkd *d, uid_t uid) {
  struct duser *u = NULL;
  for (struct duser **p = &d->users; *p;) {
    struct duser *o = *p;
    if (o->uid == uid) {
      u = o;
      p = &o->next;
    } else if (user_unused(o)) {
      *p = o->next;
      free(o);
    } else {
      p = &o->next;
    }
  }
  if (!u) {
    if (!(u = calloc(1, sizeof(*u))))
      return NULL;
    u->uid = uid;
    u->next = d->users;
    d->users = u;
  }
  u->nconns++;
  return u;
}

void dspkd_user_put(struct dspkd *d, struct duser *u) {
  if (!u)
    return;
  u->nconns--;
  dspkd_user_gc(d, u);
}

void dspkd_user_gc(struct dspkd *d, struct duser *u) {
  if (!user_unused(u))
    return;
  for (struct duser **p = &d->users; *p; p = &(*p)->next) {
    if (*p == u) {
      *p = u->next;
      break;
    }
  }
  free(u);
}

/* A memory quota's value on dev: bytes, or a share of its memory. */
static uint64_t quota_on(uint64_t v, const struct device *dev) {
  if (DSPKD_SHARE_IS(v)) {
    uint64_t pct = DSPKD_SHARE_PCT(v);
    if (!dev->info.memory || pct >= 100)
      return UINT64_MAX;
    return dev->info.memory / 100 * pct + dev->info.memory % 100 * pct / 100;
  }
  return v;
}

uint64_t dspkd_quota_mem(const struct dspkd *d, const struct device *dev, bool conn) {
  return quota_on(conn ? d->cfg.max_conn_memory : d->cfg.max_user_memory, dev);
}

uint64_t dspkd_quota_total(const struct dspkd *d, const struct device *dev) {
  uint64_t v = d->cfg.max_memory, pct;
  if (v == 0) /* unset: the host's RAM is shared with everything else */
    v = DSPKD_SHARE(strcmp(dev->be->name, "cpu") == 0 ? DSPKD_CPU_MEMORY_PCT : 100);
  if (!DSPKD_SHARE_IS(v))
    return v;
  if (!dev->info.memory)
    return UINT64_MAX; /* unknown: the allocation alone bounds it */
  pct = DSPKD_SHARE_PCT(v); /* here 100% is the whole memory, not "no bound" */
  return dev->info.memory / 100 * pct + dev->info.memory % 100 * pct / 100;
}

uint64_t dspkd_quota_conn_cap(struct conn *c, const struct device *dev) {
  const struct dspkd *d = c->d;
  uint64_t lim = dspkd_quota_mem(d, dev, true), u = dspkd_quota_mem(d, dev, false);
  struct djob *j = c->job;
  char why[256];
  if (u < lim)
    lim = u;
  if (!c->job_state && dspkd_job_decide(c, &j, why, sizeof why) != 0)
    j = NULL; /* undecidable: its first device request will say why */
  if (j) {
    uint64_t v = quota_on(d->cfg.max_job_memory, dev);
    if (v < lim)
      lim = v;
  }
  u = dspkd_quota_total(d, dev);
  return u < lim ? u : lim;
}

/* Device memory a job may take on its device: a new buffer, or a task's
 * inline operands and results (temporaries on the device). */
static uint64_t job_mem(const struct job *j) {
  uint64_t n = j->move_mem;
  switch (j->kind) {
  case JOB_BUF_CREATE:
    return j->buf->size;
  case JOB_BUF_WRITE:
    return n;
  case JOB_TASK:
    for (int i = 0; i < j->op.nin; i++)
      if (!j->in_buf[i])
        n += dspk__tensor_nbytes(&j->op.in[i]);
    for (int i = 0; i < j->op.nout; i++)
      if (!j->out_buf[i] || dspkd_out_aliases(j, i))
        n += dspk__tensor_nbytes(&j->op.out[i]);
    return n;
  default:
    return 0;
  }
}

/* Bytes the job's answer may take: its inline data and some for the rest
 * of the frame (a tensor's meta data, time_us, the envelope), and what
 * holding it costs the daemon (its struct: daemon/conn.c counts a queued
 * answer so). */
#define ANSWER_OVERHEAD (64 + DSPKD_WREQ_COST)
#define TENSOR_OVERHEAD 128
static size_t job_answer(const struct job *j) {
  size_t n = ANSWER_OVERHEAD;
  switch (j->kind) {
  case JOB_BUF_READ:
    return n + (size_t)j->size;
  case JOB_TASK:
    if (j->op.kind == DSPK_OP_KERNEL) { /* a kernel returns its inputs */
      for (int i = 0; i < j->op.nin; i++)
        n += TENSOR_OVERHEAD + (j->in_buf[i] ? 0 : dspk__tensor_nbytes(&j->op.in[i]));
    } else {
      for (int i = 0; i < j->op.nout; i++)
        n += TENSOR_OVERHEAD + (j->out_buf[i] ? 0 : dspk__tensor_nbytes(&j->op.out[i]));
    }
    return n;
  default:
    return n;
  }
}

/* What job_mem counted for a task, in words, with its verb ("the task's
 * inline operands need", "the result computed apart from outputs[0], which
 * overlaps input 0 in buffer 3, needs"): an output over bytes an input reads
 * takes device memory of its own though the task has nothing inline, and
 * the message must say so. */
/* Appends to out[0..len) (len > 0) at n, the length so far; the new
 * length, at most len - 1 (cut short there). */
__attribute__((format(printf, 4, 5))) static size_t cat(char *out, size_t len, size_t n,
                                                        const char *fmt, ...) {
  va_list ap;
  int w;
  va_start(ap, fmt);
  w = vsnprintf(out + n, len - n, fmt, ap);
  va_end(ap);
  return w < 0 || (size_t)w >= len - n ? len - 1 : n + (size_t)w;
}

static void task_need_words(const struct job *j, char *out, size_t len) {
  const struct dspk__op *op = &j->op;
  bool in = false, res = false;
  int parts = 0, nalias = 0;
  size_t n = 0;

  for (int i = 0; i < op->nin; i++)
    in |= !j->in_buf[i] && dspk__tensor_nbytes(&op->in[i]) > 0;
  for (int i = 0; i < op->nout; i++) {
    if (!j->out_buf[i])
      res |= dspk__tensor_nbytes(&op->out[i]) > 0;
    else if (dspkd_out_aliases(j, i))
      nalias++;
  }
  out[0] = '\0';
  if (in || res) {
    n = cat(out, len, n, "the task's inline %s",
            in && res ? "operands and results" : in ? "operands" : "results");
    parts++;
  }
  for (int i = 0, seen = 0; i < op->nout; i++) {
    int k = dspkd_out_alias_input(j, i);
    const struct dbuf *ob = j->out_buf[i], *ib;
    char same[64] = "";
    if (k < 0)
      continue;
    ib = j->in_buf[k];
    if (ib != ob) /* another buffer over the same memfd */
      snprintf(same, sizeof same, " (buffer %" PRIu64 ", the same memory)", ib->id);
    seen++;
    n = cat(out, len, n,
            "%sthe result computed apart from outputs[%d], which overlaps input %d%s in "
            "buffer %" PRIu64,
            parts == 0 ? "" : seen == nalias ? " and " : ", ", i, k, same, ob->id);
    parts++;
  }
  if (j->move_mem) { /* last: its own clause closes with a comma */
    n = cat(out, len, n, "%sa second block for the buffers it writes while a buffer.read "
            "answer may still be sent from their memory,", parts ? " and " : "");
    cat(out, len, n, "%s", parts ? " need" : " needs");
    return;
  }
  /* The last part ends with its "which" clause when it is a result
   * computed apart: a comma closes it. */
  cat(out, len, n, "%s", nalias == 0 ? " need" : parts == 1 ? ", needs" : ", need");
}

/* What job j needs device memory for, with its verb, into what[len]. */
static void need_words(const struct job *j, char *what, size_t len) {
  if (j->kind == JOB_BUF_CREATE)
    snprintf(what, len, "the buffer needs");
  else if (j->kind == JOB_BUF_WRITE)
    snprintf(what, len, "writing buffer %" PRIu64 " while a buffer.read answer may "
             "still be sent from its memory needs a second block:", j->buf->id);
  else
    task_need_words(j, what, len);
}

static int over(char *msg, size_t len, const struct job *j, uint64_t need, uint64_t held,
                uint64_t lim, const char *who, const char *key) {
  char what[512];
  need_words(j, what, sizeof what);
  snprintf(msg, len, "%s %" PRIu64 " byte%s of %s, and %s already holds %" PRIu64
           " of the %" PRIu64 " it may (%s)",
           what, need, need == 1 ? "" : "s", j->dev->id, who, held, lim, key);
  return DSPK_ELIMIT;
}

/* Refusals for all users' memory: logged as the daemon's shortage of
 * mappings is (dspkd_log_shortage). */
static struct dspkd_ratelog mem_shortage; /* the loop thread's */

int dspkd_quota_check(const struct job *j, char *msg, size_t len, bool *logged) {
  const struct conn *c = j->conn;
  const struct dspkd *d;
  uint64_t need = job_mem(j), lim, held;
  int idx;

  if (!c || !need || !c->user || !c->mem)
    return 0;
  d = c->d;
  idx = j->dev->idx;
  lim = dspkd_quota_mem(d, j->dev, true);
  held = c->mem[idx];
  if (need > lim || held > lim - need)
    return over(msg, len, j, need, held, lim, "this connection", "max_conn_memory");
  lim = dspkd_quota_mem(d, j->dev, false);
  held = c->user->mem[idx];
  if (need > lim || held > lim - need)
    return over(msg, len, j, need, held, lim, "this user", "max_user_memory");
  if (c->job) {
    lim = quota_on(d->cfg.max_job_memory, j->dev);
    held = c->job->mem[idx];
    if (need > lim || held > lim - need)
      return over(msg, len, j, need, held, lim, "this Slurm job", "max_job_memory");
  }
  lim = dspkd_quota_total(d, j->dev);
  held = j->dev->clients_mem;
  if (need > lim || held > lim - need) {
    char what[512];
    need_words(j, what, sizeof what);
    snprintf(msg, len, "%s %" PRIu64 " byte%s of %s, and all users together hold %" PRIu64
             " of the %" PRIu64 " the daemon gives clients there (max_memory): the daemon's "
             "memory is taken, not this client's fault; try again later", what, need,
             need == 1 ? "" : "s", j->dev->id, held, lim);
    dspkd_log_shortage(&mem_shortage, c, msg, "Device memory");
    *logged = true;
    return DSPK_ENOMEM;
  }
  return 0;
}

uint64_t dspkd_user_unsent_ceiling(const struct dspkd *d) {
  return 2 * d->cfg.max_user_unsent; /* max_user_unsent is at most 2^40 */
}

void dspkd_user_answers(struct conn *c, int64_t delta) {
  struct duser *u = c->user;
  struct dspkd *d = c->d;
  bool was_over;

  if (!u)
    return;
  uint64_t ceiling = dspkd_user_unsent_ceiling(d);
  was_over = u->answers > d->cfg.max_user_unsent;
  bool was_above = u->answers > ceiling;
  u->answers += (uint64_t)delta;
  /* The user's connections whose reading paused for the quota go on: all
   * of them back within it, those that owe nothing back within its
   * ceiling (daemon/conn.c, may_read). */
  if ((was_over && u->answers <= d->cfg.max_user_unsent) ||
      (was_above && u->answers <= ceiling))
    for (struct conn *o = d->conns, *next; o; o = next) {
      next = o->next;
      if (o->user == u && o != c && !o->closing)
        dspkd_conn_update_read(o);
    }
}

void dspkd_quota_charge(struct job *j) {
  struct conn *c = j->conn;
  if (!c)
    return;
  j->resv_answer = job_answer(j);
  c->reserved += j->resv_answer;
  dspkd_user_answers(c, (int64_t)j->resv_answer);
  if (j->kind == JOB_BUF_CREATE)
    c->creating++;
  j->resv_mem = job_mem(j);
  j->resv_dev = j->dev;
  j->slurm_job = c->job ? c->job->id : 0;
  if (j->resv_mem && c->user && c->mem) {
    c->mem[j->dev->idx] += j->resv_mem;
    c->user->mem[j->dev->idx] += j->resv_mem;
    j->dev->clients_mem += j->resv_mem;
    if ((j->resv_job = c->job))
      c->job->mem[j->dev->idx] += j->resv_mem;
  }
}

void dspkd_quota_release(struct job *j) {
  struct conn *c = j->conn;
  if (!c)
    return;
  c->reserved -= j->resv_answer;
  dspkd_user_answers(c, -(int64_t)j->resv_answer);
  j->resv_answer = 0;
  if (j->kind == JOB_BUF_CREATE)
    c->creating--;
  if (j->resv_mem && c->user && c->mem) {
    c->mem[j->resv_dev->idx] -= j->resv_mem;
    c->user->mem[j->resv_dev->idx] -= j->resv_mem;
    j->resv_dev->clients_mem -= j->resv_mem;
    if (j->resv_job)
      j->resv_job->mem[j->resv_dev->idx] -= j->resv_mem;
  }
  j->resv_mem = 0;
  j->resv_job = NULL;
}

void dspkd_quota_buf(struct conn *c, struct dbuf *b, int sign) {
  if (!c->user || !c->mem)
    return;
  if (sign > 0) {
    c->mem[b->dev->idx] += b->size;
    c->user->mem[b->dev->idx] += b->size;
    b->dev->clients_mem += b->size;
    if ((b->qjob = c->job))
      b->qjob->mem[b->dev->idx] += b->size;
  } else {
    c->mem[b->dev->idx] -= b->size;
    c->user->mem[b->dev->idx] -= b->size;
    b->dev->clients_mem -= b->size;
    if (b->qjob)
      b->qjob->mem[b->dev->idx] -= b->size;
    b->qjob = NULL;
  }
}

/* The buffers job j writes (a kernel's inputs too), each once, into w[];
 * their count. */
static int written_bufs(const struct job *j, struct dbuf **w) {
  int n = 0;
  if (j->kind == JOB_BUF_WRITE) {
    w[n++] = j->buf;
    return n;
  }
  if (j->kind != JOB_TASK)
    return 0;
  for (int i = 0; i < j->op.nout + (j->op.kind == DSPK_OP_KERNEL ? j->op.nin : 0); i++) {
    struct dbuf *b = i < j->op.nout ? j->out_buf[i] : j->in_buf[i - j->op.nout];
    bool seen = false;
    for (int k = 0; k < n && !seen; k++)
      seen = w[k] == b;
    if (b && !seen)
      w[n++] = b;
  }
  return n;
}

void dspkd_quota_move_mem(struct job *j) {
  struct dbuf *w[DSPK__OP_MAX_IN + DSPK__OP_MAX_OUT + 1];
  int n = written_bufs(j, w);
  j->move_mem = 0;
  for (int i = 0; i < n; i++)
    if (w[i]->reads > 0)
      j->move_mem += w[i]->size;
}

/* Adds bytes (sign > 0) to, or takes them from, what connection c, its
 * user and Slurm job qjob hold on device dev, and all users together. */
static void quota_bytes(struct conn *c, struct djob *qjob, struct device *dev, uint64_t bytes,
                        int sign) {
  int idx = dev->idx;
  if (!c->user || !c->mem)
    return;
  if (sign > 0) {
    c->mem[idx] += bytes;
    c->user->mem[idx] += bytes;
    dev->clients_mem += bytes;
    if (qjob)
      qjob->mem[idx] += bytes;
  } else {
    c->mem[idx] -= bytes;
    c->user->mem[idx] -= bytes;
    dev->clients_mem -= bytes;
    if (qjob)
      qjob->mem[idx] -= bytes;
  }
}

void dspkd_quota_keep_moved(struct job *j) {
  struct dbuf *w[DSPK__OP_MAX_IN + DSPK__OP_MAX_OUT + 1];
  struct conn *c = j->conn;
  int n;
  if (!j->move_mem || !c)
    return;
  n = written_bufs(j, w);
  for (int i = 0; i < n; i++) {
    struct dbuf *b = w[i];
    if (b->reads == 0) /* its answers are out: any old block is freed */
      continue;
    if (!b->moved_c) {
      b->moved_c = c;
      b->moved_job = c->job;
      dspkd_conn_ref(c);
    }
    b->moved += b->size;
    quota_bytes(b->moved_c, b->moved_job, b->dev, b->size, +1);
  }
  j->move_mem = 0;
}

void dspkd_quota_reads_done(struct dbuf *b) {
  struct conn *c = b->moved_c;
  if (--b->reads > 0 || !c)
    return;
  quota_bytes(c, b->moved_job, b->dev, b->moved, -1);
  b->moved = 0;
  b->moved_c = NULL;
  b->moved_job = NULL;
  dspkd_conn_unref(c);
}

void dspkd_quota_job_leave(struct conn *c) {
  for (struct dbuf *b = c->held_list; b; b = b->held_next) {
    int idx = b->dev->idx;
    if (b->qjob) {
      b->qjob->mem[idx] -= b->size;
      b->qjob = NULL;
    }
    if (b->moved_job) {
      b->moved_job->mem[idx] -= b->moved;
      b->moved_job = NULL;
    }
  }
}
