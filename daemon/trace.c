/*
 * The `trace` method (docs/protocol.md): records every job every device
 * runs for the given seconds, then answers with each job's phases (queue,
 * upload, tuning, compute, download), so a client can draw what each device
 * did and when it sat idle (dspk-submit trace writes Chrome trace-event
 * JSON from it).
 *
 * While at least one trace is in progress, each runner keeps its finished
 * jobs in a ring of DSPKD_TRACE_RING records (daemon/metrics.c,
 * trace_keep); a trace remembers where each ring stood when it began and at
 * its end copies what came after, under the device's mutex.  A device that
 * finished more jobs than the ring holds reports the oldest as dropped.
 * The job running at the end is included, marked running.  Traces in
 * progress at the daemon's stop are answered at once with what they have,
 * and so is a trace begun as an admin at a reload that takes that right
 * from its caller (dspkd_trace_reloaded).
 *
 * What a trace shows follows status (docs/security.md): the devices status
 * shows the caller, decided when the trace begins; on them, the jobs of
 * work the caller sees in full (dspkd_sees_uid: an admin all, anyone else
 * its own uid's, a buffer's release its owner's) with every field, and any
 * other job only as an anonymous busy interval: kind and name "other",
 * client 0, job nil, msgid 0, no error, no queue wait, no phases.
 * Loop thread only, except the rings (each guarded by its device's mutex).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/admin.h"
#include "daemon/dspkd.h"
#include "daemon/log.h"

#define TRACE_MAX_S 600.0  /* longest trace (DSPK__EXPECT_TRACE_SECONDS says it) */
/* Traces recording at once (docs/protocol.md, trace): admins have slots of
 * their own, so that no user's traces keep an admin from tracing; everyone
 * else shares the other slots, at most TRACE_MAX_PER_USER per uid, so that
 * one user cannot take them all. */
#define TRACE_MAX_SESSIONS 8
#define TRACE_MAX_ADMIN 8
#define TRACE_MAX_PER_USER 2

struct trace_sess {
  struct trace_sess *next;
  struct dspkd *d;
  struct conn *c;
  uint32_t msgid;
  uv_timer_t timer;
  uint64_t t0;
  uint64_t seq0[DSPKD_MAX_DEVICES];
  bool admin;                        /* the caller, when the trace began */
  uid_t uid;                         /* the caller's */
  bool shown[DSPKD_MAX_DEVICES];     /* the devices it is shown */
};

struct trec {
  struct trace_rec r;
  int dev;
};

/* Another user's job as the caller may see it: when the device was busy,
 * nothing of whose work, which request or what it was. */
static void pack_other(struct dspk__wbuf *w, const struct dspkd *d, const struct trec *x) {
  const struct trace_rec *r = &x->r;
  struct dspk__pval v[DSPK__TJ_COUNT] = {
      [DSPK__TJ_DEVICE] = dspk__pv_str(d->devs[x->dev].id),
      [DSPK__TJ_KIND] = dspk__pv_str(DSPKD_OTHER_WORK),
      [DSPK__TJ_NAME] = dspk__pv_str(DSPKD_OTHER_WORK),
      [DSPK__TJ_CLIENT] = dspk__pv_uint(0),
      [DSPK__TJ_JOB] = dspk__pv_nil(),
      [DSPK__TJ_MSGID] = dspk__pv_uint(0),
      [DSPK__TJ_ERROR] = dspk__pv_nil(),
      [DSPK__TJ_RUNNING] = dspk__pv_bool(r->running),
      [DSPK__TJ_QUEUED_US] = dspk__pv_uint(r->t.start / 1000),
      [DSPK__TJ_START_US] = dspk__pv_uint(r->t.start / 1000),
      [DSPK__TJ_END_US] = dspk__pv_uint(r->t.end / 1000),
  };
  dspk__map_encode(w, dspk__trace_job_f, DSPK__TJ_COUNT, v);
}

/* One job record, packed by the table (dspk__trace_job_f): a task's
 * phases only once reached. */
static void pack_rec(struct dspk__wbuf *w, const struct dspkd *d, const struct trec *x) {
  const struct trace_rec *r = &x->r;
  bool task = r->kind == JOB_TASK;
  struct dspk__pval v[DSPK__TJ_COUNT] = {
      [DSPK__TJ_DEVICE] = dspk__pv_str(d->devs[x->dev].id),
      [DSPK__TJ_KIND] = dspk__pv_str(task ? "task" : dspkd_obs_job_name(r->kind, 0)),
      [DSPK__TJ_NAME] = dspk__pv_str(dspkd_obs_job_name(r->kind, r->op)),
      [DSPK__TJ_CLIENT] = dspk__pv_uint(r->client),
      /* the client's Slurm job */
      [DSPK__TJ_JOB] = r->slurm_job ? dspk__pv_uint(r->slurm_job) : dspk__pv_nil(),
      [DSPK__TJ_MSGID] = dspk__pv_uint(r->msgid),
      [DSPK__TJ_ERROR] = r->err ? dspk__pv_str(dspk__err_name(r->err)) : dspk__pv_nil(),
      [DSPK__TJ_RUNNING] = dspk__pv_bool(r->running),
      [DSPK__TJ_QUEUED_US] = dspk__pv_uint((r->t.queued ? r->t.queued : r->t.start) / 1000),
      [DSPK__TJ_START_US] = dspk__pv_uint(r->t.start / 1000),
      [DSPK__TJ_END_US] = dspk__pv_uint(r->t.end / 1000),
  };
  if (task && r->t.upload_end)
    v[DSPK__TJ_UPLOAD_END_US] = dspk__pv_uint(r->t.upload_end / 1000);
  if (task && r->t.compute_end)
    v[DSPK__TJ_COMPUTE_END_US] = dspk__pv_uint(r->t.compute_end / 1000);
  if (task && r->t.tune_start) {
    v[DSPK__TJ_TUNE_START_US] = dspk__pv_uint(r->t.tune_start / 1000);
    v[DSPK__TJ_TUNE_END_US] = dspk__pv_uint(r->t.tune_end / 1000);
  }
  dspk__map_encode(w, dspk__trace_job_f, DSPK__TJ_COUNT, v);
}

/* Takes the records of every device since the trace began (and the job
 * running now), and stops recording for this trace.  *out malloc'd. */
static int collect(struct trace_sess *s, uint64_t now, struct trec **out, size_t *n,
                   uint64_t *dropped) {
  struct dspkd *d = s->d;
  size_t cap = 0, k = 0;
  struct trec *v = NULL;
  int err = 0;

  *dropped = 0;
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    struct dev_obs *o = &dev->obs;
    uint64_t from;
    if (dev->open_state != 1)
      continue;
    pthread_mutex_lock(&dev->mu);
    if (!s->shown[i]) { /* a device the caller is not shown: nothing of it */
      o->tracers--;
      pthread_mutex_unlock(&dev->mu);
      continue;
    }
    from = s->seq0[i];
    if (o->seq - from > DSPKD_TRACE_RING) {
      *dropped += o->seq - from - DSPKD_TRACE_RING;
      from = o->seq - DSPKD_TRACE_RING;
    }
    if (!err && k + (o->seq - from) + 1 > cap) {
      size_t nc = k + (size_t)(o->seq - from) + 1 + cap;
      struct trec *nv = realloc(v, nc * sizeof *nv);
      if (nv) {
        v = nv;
        cap = nc;
      } else {
        err = DSPK_ENOMEM;
      }
    }
    for (uint64_t q = from; !err && o->rec && q < o->seq; q++) {
      v[k].r = o->rec[q % DSPKD_TRACE_RING];
      v[k++].dev = i;
    }
    if (!err && o->run_start) {
      struct trace_rec *r = &v[k].r;
      memset(r, 0, sizeof *r);
      r->t.queued = o->run_queued;
      r->t.start = o->run_start;
      r->t.end = now;
      r->client = o->run_client;
      r->slurm_job = o->run_job;
      r->uid = o->run_uid;
      r->msgid = o->run_msgid;
      r->kind = o->run_kind;
      r->op = o->run_op;
      r->running = true;
      v[k++].dev = i;
    }
    o->tracers--;
    pthread_mutex_unlock(&dev->mu);
  }
  if (err) {
    free(v);
    return err;
  }
  *out = v;
  *n = k;
  return 0;
}

static void on_timer_close(uv_handle_t *h) { free(h->data); }

/* The trace's devices: the ids of the open devices shown to the caller. */
static void pack_devices(const void *ud, struct dspk__wbuf *w) {
  const struct trace_sess *s = ud;
  const struct dspkd *d = s->d;
  int ndev = 0;
  for (int i = 0; i < d->ndevs; i++)
    ndev += d->devs[i].open_state == 1 && s->shown[i];
  msgpack_pack_array(&w->pk, (size_t)ndev);
  for (int i = 0; i < d->ndevs; i++)
    if (d->devs[i].open_state == 1 && s->shown[i])
      dspk__pack_str(&w->pk, d->devs[i].id);
}

/* The trace's jobs: the records collected, each in full or anonymous. */
struct trace_out {
  const struct trace_sess *s;
  const struct trec *v;
  size_t n;
};

static void pack_jobs(const void *ud, struct dspk__wbuf *w) {
  const struct trace_out *o = ud;
  const struct trace_sess *s = o->s;
  msgpack_pack_array(&w->pk, o->n);
  for (size_t i = 0; i < o->n; i++) {
    const struct trace_rec *r = &o->v[i].r;
    if ((r->client && r->client == s->c->id) || dspkd_sees_uid(s->c, s->admin, r->uid))
      pack_rec(w, s->d, &o->v[i]);
    else
      pack_other(w, s->d, &o->v[i]);
  }
}

/* Answers the trace and forgets it. */
static void finish(struct trace_sess *s) {
  struct dspkd *d = s->d;
  struct conn *c = s->c;
  struct trace_sess **pp;
  struct trec *v = NULL;
  size_t n = 0;
  uint64_t dropped = 0, now = dspkd_now_ns();
  int err;

  for (pp = &d->obs.traces; *pp && *pp != s; pp = &(*pp)->next)
    ;
  if (*pp)
    *pp = s->next;
  uv_timer_stop(&s->timer);
  err = collect(s, now, &v, &n, &dropped);
  if (!c->closing) {
    struct trace_out o = {s, v, n};
    struct dspk__pval rv[5] = {[DSPK__R_TRACE_START_US] = dspk__pv_uint(s->t0 / 1000),
                               [DSPK__R_TRACE_END_US] = dspk__pv_uint(now / 1000),
                               [DSPK__R_TRACE_DROPPED] = dspk__pv_uint(dropped),
                               [DSPK__R_TRACE_DEVICES] = dspk__pv_pack(pack_devices, s),
                               [DSPK__R_TRACE_JOBS] = dspk__pv_pack(pack_jobs, &o)};
    struct wreq *wr = err ? NULL : dspkd_result(s->msgid, DSPK__M_TRACE, rv);
    if (!wr)
      dspkd_conn_send_error(c, s->msgid, DSPK_ENOMEM, "out of memory for the trace");
    else
      dspkd_conn_send(c, wr);
  }
  free(v);
  dspkd_debug("client %llu: trace #%u: %zu jobs, %llu dropped", (unsigned long long)c->id,
              s->msgid, n, (unsigned long long)dropped);
  uv_close((uv_handle_t *)&s->timer, on_timer_close);
  dspkd_conn_paid(c);
}

static void on_timer(uv_timer_t *t) { finish(t->data); }

int dspkd_m_trace(struct req *r) {
  struct dspkd *d = r->c->d;
  struct trace_sess *s;
  struct trace_rec *fresh[DSPKD_MAX_DEVICES] = {0};
  double seconds = r->v[DSPK__TRACE_SECONDS].v.f;
  bool admin = dspkd_admin_is(r->c);
  uid_t uid = r->c->uid;
  int nadmin = 0, nother = 0, nuid = 0;

  if (!(seconds > 0 && seconds <= TRACE_MAX_S)) {
    /* What came, as every message names a client's number: an integer
     * exactly, a float as a float ("18446744073709551615", "0", "0.0",
     * "-0.0", "700.0", "600.0000000000001", "nan"). */
    char got[40];
    dspk__obj_num_str(r->v[DSPK__TRACE_SECONDS].src, got, sizeof got);
    snprintf(r->msg, sizeof r->msg, "seconds: expected " DSPK__EXPECT_TRACE_SECONDS ", got %s",
             got);
    return DSPK_EINVAL;
  }
  if (d->stopping) {
    snprintf(r->msg, sizeof r->msg, "the daemon is stopping");
    return DSPK_ESHUTDOWN;
  }
  for (s = d->obs.traces; s; s = s->next) {
    if (s->admin)
      nadmin++;
    else
      nother++;
    if (!s->admin && s->uid == uid)
      nuid++;
  }
  if (admin && nadmin >= TRACE_MAX_ADMIN) {
    snprintf(r->msg, sizeof r->msg, "%d traces of admins are in progress already "
             "(at most %d)", nadmin, TRACE_MAX_ADMIN);
    return DSPK_EBUSY;
  }
  if (!admin && nuid >= TRACE_MAX_PER_USER) {
    snprintf(r->msg, sizeof r->msg, "this user has %d traces in progress already "
             "(at most %d per user)", nuid, TRACE_MAX_PER_USER);
    r->own_limit = true; /* its own bound: a debug line (the others are shared) */
    return DSPK_EBUSY;
  }
  if (!admin && nother >= TRACE_MAX_SESSIONS) {
    snprintf(r->msg, sizeof r->msg, "%d traces of users who are not admins are in "
             "progress already (at most %d)", nother, TRACE_MAX_SESSIONS);
    return DSPK_EBUSY;
  }
  s = calloc(1, sizeof *s);
  if (!s)
    return DSPK_ENOMEM;
  /* Whom the caller may see is fixed now, as status would show it. */
  s->admin = admin;
  s->uid = uid;
  dspkd_devices_shown(r->c, s->admin, s->shown);
  /* The rings, allocated at the first trace (only the loop sets them). */
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (dev->open_state != 1 || dev->obs.rec)
      continue;
    fresh[i] = calloc(DSPKD_TRACE_RING, sizeof *fresh[i]);
    if (!fresh[i]) {
      for (int k = 0; k <= i; k++)
        free(fresh[k]);
      free(s);
      return DSPK_ENOMEM;
    }
  }
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (dev->open_state != 1)
      continue;
    pthread_mutex_lock(&dev->mu);
    if (fresh[i])
      dev->obs.rec = fresh[i];
    dev->obs.tracers++;
    s->seq0[i] = dev->obs.seq;
    pthread_mutex_unlock(&dev->mu);
  }
  s->d = d;
  s->c = r->c;
  s->msgid = r->msgid;
  s->t0 = dspkd_now_ns();
  uv_timer_init(d->loop, &s->timer);
  s->timer.data = s;
  dspkd_conn_owe(r->c);
  s->next = d->obs.traces;
  d->obs.traces = s;
  uv_timer_start(&s->timer, on_timer, (uint64_t)(seconds * 1000.0 + 0.5), 0);
  dspkd_debug("client %llu: trace #%u for %.3f s", (unsigned long long)r->c->id, r->msgid,
              seconds);
  return 0;
}

const struct trace_sess *dspkd_trace_next(const struct trace_sess *s) { return s->next; }

void dspkd_trace_conn_closed(struct conn *c) {
  struct trace_sess *s = c->d->obs.traces, *next;
  for (; s; s = next) {
    next = s->next;
    if (s->c == c)
      finish(s); /* unanswered: the connection is closing */
  }
}

void dspkd_trace_stop_all(struct dspkd *d) {
  while (d->obs.traces)
    finish(d->obs.traces);
}

size_t dspkd_trace_reloaded(struct dspkd *d) {
  struct trace_sess *s = d->obs.traces, *next;
  size_t n = 0;
  /* The rights of a trace are fixed when it begins; a reload that takes a
   * caller's admin right away ends its trace there, so that what it shows
   * of other users' work was all recorded while it was an admin (outside
   * probe 16 E4: it kept showing them for up to 600 s). */
  for (; s; s = next) {
    next = s->next;
    if (!s->admin || s->c->closing || dspkd_admin_is(s->c))
      continue;
    dspkd_notice(DSPKD_PEER_FMT ": trace #%u ended at the reload: the caller is no longer "
                 "an admin (it showed every user's jobs); answered with what it recorded "
                 "until now", DSPKD_PEER_ARGS(s->c), s->msgid);
    finish(s);
    n++;
  }
  return n;
}

void dspkd_trace_free(struct dspkd *d) {
  for (int i = 0; i < d->ndevs; i++) {
    free(d->devs[i].obs.rec);
    d->devs[i].obs.rec = NULL;
  }
}
