/*
 * libdspkclient's calls that watch the daemon: dspk_metrics (the Prometheus
 * text), dspk_trace (a recording of every job, turned into Chrome
 * trace-event JSON), and the per-device activity of dspk_status_get.
 *
 * The trace's conversion: the daemon answers with one record per job
 * (docs/protocol.md, `trace`); each becomes an "X" (complete) event on its
 * device's runner thread with its phases nested inside, and its wait in the
 * queue an "X" event on a thread of its client.  Queue waits of one client
 * overlap (a FIFO holds several jobs), and slices on one thread must nest,
 * so each client gets as many queue threads as it needs: a wait goes to the
 * first of them that is free by the time it begins.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib_internal.h"
#include "proto/schema.h"

#define RUN_TID 1
#define QUEUE_LANES 16   /* queue threads per client and device */
#define QUEUE_TID0 1000  /* tid of a client's queue lane: 1000 + 16 * client + lane */

void dspk__status_activity(const struct dspk__pval *dev, dspk_device_activity *a) {
  struct dspk__pval st[DSPK__DS_COUNT], run[DSPK__RO_COUNT];

  memset(a, 0, sizeof *a);
  a->busy = dev[DSPK__SV_BUSY].v.f;
  a->clients = dev[DSPK__SV_CLIENTS].v.u;
  a->memory = dev[DSPK__SV_MEMORY].v.u;
  dspk__fields(dspk__devstats_f, DSPK__DS_COUNT, dev[DSPK__SV_STATS].v.o, st);
  a->memory_in_use = st[DSPK__DS_POOL_BYTES_IN_USE].v.u;
  a->memory_cached = st[DSPK__DS_POOL_BYTES_CACHED].v.u;
  if (!dev[DSPK__SV_RUNNING_OP].nil) {
    dspk__fields(dspk__running_op_f, DSPK__RO_COUNT, dev[DSPK__SV_RUNNING_OP].v.o, run);
    a->running = true;
    dspk__strncpy_pval(&run[DSPK__RO_NAME], a->running_op, sizeof a->running_op);
    a->running_age_s = (double)run[DSPK__RO_AGE_MS].v.u / 1000.0;
  }
}

DSPK_EXPORT int dspk_metrics(dspk_client *c, char **text_out) {
  struct dspk__resp r;
  const char *s;
  size_t n;
  char *text;
  int rc;

  if (!c || !text_out)
    return dspk__argerr(c, "dspk_metrics: text_out is NULL");
  rc = dspk__call(c, "metrics", NULL, NULL, &r);
  if (rc != 0)
    return rc;
  if (dspk__obj_str(r.msg.result, &s, &n) != 0) {
    dspk__resp_free(&r);
    return dspk__cerr(c, DSPK_EPROTO, "metrics: the answer is not a string");
  }
  text = malloc(n + 1);
  if (!text) {
    dspk__resp_free(&r);
    return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
  }
  memcpy(text, s, n);
  text[n] = '\0';
  dspk__resp_free(&r);
  *text_out = text;
  return 0;
}

/* ---- trace ---------------------------------------------------------------- */

static void pack_seconds(void *ud, struct dspk__wbuf *w) {
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "seconds");
  msgpack_pack_double(&w->pk, *(const double *)ud);
}

/* Queue lanes in use: the end of the last wait on each lane of a client on
 * a device. */
struct lanes {
  uint64_t client;
  int pid;
  int used;
  uint64_t end[QUEUE_LANES];
};

struct conv {
  struct dspk__jbuf j;
  uint64_t base; /* us: the earliest time in the trace */
  int nev;
  struct lanes *lanes;
  size_t nlanes, caplanes;
};

/* Starts an event: {"name":NAME,"ph":PH,"pid":P,"tid":T, ... (no closing). */
static void ev_head(struct conv *cv, const char *name, size_t nlen, const char *ph, int pid,
                    uint64_t tid) {
  char num[96];
  dspk__jputs(&cv->j, cv->nev++ ? ",\n{\"name\":" : "\n{\"name\":");
  dspk__jstr(&cv->j, name, nlen);
  snprintf(num, sizeof num, ",\"ph\":\"%s\",\"pid\":%d,\"tid\":%" PRIu64, ph, pid, tid);
  dspk__jputs(&cv->j, num);
}

/* Metadata: process_name / thread_name / *_sort_index. */
static void ev_meta(struct conv *cv, const char *what, int pid, uint64_t tid, const char *name,
                    long sort) {
  char num[64];
  ev_head(cv, what, strlen(what), "M", pid, tid);
  if (name) {
    dspk__jputs(&cv->j, ",\"args\":{\"name\":");
    dspk__jstr(&cv->j, name, strlen(name));
    dspk__jputs(&cv->j, "}}");
  } else {
    snprintf(num, sizeof num, ",\"args\":{\"sort_index\":%ld}}", sort);
    dspk__jputs(&cv->j, num);
  }
}

/* A complete event [t0, t1] (us, absolute); args is JSON text or NULL. */
static void ev_x(struct conv *cv, const char *name, size_t nlen, const char *cat, int pid,
                 uint64_t tid, uint64_t t0, uint64_t t1, const char *args) {
  char num[96];
  if (t1 < t0)
    t1 = t0;
  ev_head(cv, name, nlen, "X", pid, tid);
  snprintf(num, sizeof num, ",\"cat\":\"%s\",\"ts\":%" PRIu64 ",\"dur\":%" PRIu64, cat,
           t0 - cv->base, t1 - t0);
  dspk__jputs(&cv->j, num);
  if (args) {
    dspk__jputs(&cv->j, ",\"args\":");
    dspk__jputs(&cv->j, args);
  }
  dspk__jputs(&cv->j, "}");
}

/* The queue thread of this client on this device that is free at t0 (the
 * last one when all are busy); names it when it is new. */
static uint64_t queue_tid(struct conv *cv, int pid, uint64_t client, uint64_t t0,
                          uint64_t t1) {
  struct lanes *l = NULL;
  int k;
  char name[64];

  for (size_t i = 0; i < cv->nlanes; i++)
    if (cv->lanes[i].pid == pid && cv->lanes[i].client == client)
      l = &cv->lanes[i];
  if (!l) {
    if (cv->nlanes == cv->caplanes) {
      size_t cap = cv->caplanes ? 2 * cv->caplanes : 16;
      struct lanes *nl = realloc(cv->lanes, cap * sizeof *nl);
      if (!nl) {
        cv->j.err = DSPK_ENOMEM;
        return QUEUE_TID0;
      }
      cv->lanes = nl;
      cv->caplanes = cap;
    }
    l = &cv->lanes[cv->nlanes++];
    memset(l, 0, sizeof *l);
    l->pid = pid;
    l->client = client;
  }
  for (k = 0; k < QUEUE_LANES - 1; k++)
    if (k >= l->used || l->end[k] <= t0)
      break;
  if (k >= l->used) {
    uint64_t tid = QUEUE_TID0 + QUEUE_LANES * client + (uint64_t)k;
    l->used = k + 1;
    if (client)
      snprintf(name, sizeof name, k ? "client %" PRIu64 " queue %d" : "client %" PRIu64 " queue",
               client, k + 1);
    else
      snprintf(name, sizeof name, k ? "daemon queue %d" : "daemon queue", k + 1);
    ev_meta(cv, "thread_name", pid, tid, name, 0);
    ev_meta(cv, "thread_sort_index", pid, tid, NULL, (long)(tid > 0x7fffffff ? 0x7fffffff : tid));
  }
  l->end[k] = t1;
  return QUEUE_TID0 + QUEUE_LANES * client + (uint64_t)k;
}

/* A uint field of a job record (0 when absent or nil). */
static uint64_t u64_of(const struct dspk__pval *f, int k) {
  return f[k].set && !f[k].nil ? f[k].v.u : 0;
}

/* One job record (its fields against dspk__trace_job_f, checked by
 * dspk__result_decode): its queue wait, its run and its phases. */
static void conv_job(struct conv *cv, const msgpack_object *job, int pid) {
  struct dspk__pval f[DSPK__TJ_COUNT];
  const char *name, *e = NULL;
  size_t nlen, elen = 0;
  bool running, task, other;
  uint64_t client, msgid, sjob, q, s, end, up, comp, t0, t1;
  struct dspk__jbuf a = {0};
  char num[96];

  dspk__fields(dspk__trace_job_f, DSPK__TJ_COUNT, job, f);
  client = u64_of(f, DSPK__TJ_CLIENT), msgid = u64_of(f, DSPK__TJ_MSGID);
  sjob = u64_of(f, DSPK__TJ_JOB);
  q = u64_of(f, DSPK__TJ_QUEUED_US), s = u64_of(f, DSPK__TJ_START_US);
  end = u64_of(f, DSPK__TJ_END_US);
  up = u64_of(f, DSPK__TJ_UPLOAD_END_US), comp = u64_of(f, DSPK__TJ_COMPUTE_END_US);
  t0 = u64_of(f, DSPK__TJ_TUNE_START_US), t1 = u64_of(f, DSPK__TJ_TUNE_END_US);
  name = f[DSPK__TJ_NAME].v.s.p;
  nlen = f[DSPK__TJ_NAME].v.s.n;
  task = f[DSPK__TJ_KIND].v.s.n == 4 && memcmp(f[DSPK__TJ_KIND].v.s.p, "task", 4) == 0;
  /* another user's job, anonymous (docs/protocol.md, trace) */
  other = f[DSPK__TJ_KIND].v.s.n == 5 && memcmp(f[DSPK__TJ_KIND].v.s.p, "other", 5) == 0;
  if (!f[DSPK__TJ_ERROR].nil) {
    e = f[DSPK__TJ_ERROR].v.s.p;
    elen = f[DSPK__TJ_ERROR].v.s.n;
  }
  running = f[DSPK__TJ_RUNNING].v.b;

  snprintf(num, sizeof num, "{\"client\":%" PRIu64 ",\"msgid\":%" PRIu64, client, msgid);
  dspk__jputs(&a, num);
  if (sjob) {
    snprintf(num, sizeof num, ",\"job\":%" PRIu64, sjob);
    dspk__jputs(&a, num);
  }
  if (e) {
    dspk__jputs(&a, ",\"error\":");
    dspk__jstr(&a, e, elen);
  }
  if (running)
    dspk__jputs(&a, ",\"running\":true");
  dspk__jputs(&a, "}");
  if (a.err) {
    cv->j.err = a.err;
    free(a.p);
    return;
  }
  if (q < s)
    ev_x(cv, name, nlen, "queue", pid, queue_tid(cv, pid, client, q, s), q, s, a.p);
  ev_x(cv, name, nlen, task ? "task" : other ? "other" : "buffer", pid, RUN_TID, s, end, a.p);
  free(a.p);
  if (!task)
    return;
  if (up)
    ev_x(cv, "upload", 6, "phase", pid, RUN_TID, s, up, NULL);
  if (up && comp)
    ev_x(cv, "compute", 7, "phase", pid, RUN_TID, up, comp, NULL);
  if (t0 && t1 && up && comp)
    ev_x(cv, "tuning", 6, "phase", pid, RUN_TID, t0 < up ? up : t0, t1 > comp ? comp : t1,
         NULL);
  if (comp && !running)
    ev_x(cv, "download", 8, "phase", pid, RUN_TID, comp, end, NULL);
}

/* The daemon's answer as Chrome trace-event JSON. */
static int convert(const struct dspk__pval *res, char **out) {
  const msgpack_object *devs = res[DSPK__R_TRACE_DEVICES].v.o;
  const msgpack_object *jobs = res[DSPK__R_TRACE_JOBS].v.o;
  struct conv cv = {0};
  uint64_t start = res[DSPK__R_TRACE_START_US].v.u, end = res[DSPK__R_TRACE_END_US].v.u;
  char num[160], id[64];
  uint32_t ndev = devs->via.array.size;
  uint32_t njob = jobs->via.array.size;

  cv.base = start;
  for (uint32_t i = 0; i < njob; i++) {
    struct dspk__pval f[DSPK__TJ_COUNT];
    uint64_t q;
    dspk__fields(dspk__trace_job_f, DSPK__TJ_COUNT, &jobs->via.array.ptr[i], f);
    q = f[DSPK__TJ_QUEUED_US].v.u;
    if (q && q < cv.base)
      cv.base = q;
  }
  dspk__jputs(&cv.j, "{\"traceEvents\":[");
  for (uint32_t i = 0; i < ndev; i++) {
    dspk__strncpy_obj(&devs->via.array.ptr[i], id, sizeof id);
    ev_meta(&cv, "process_name", (int)i + 1, 0, id, 0);
    ev_meta(&cv, "process_sort_index", (int)i + 1, 0, NULL, (long)i);
    ev_meta(&cv, "thread_name", (int)i + 1, RUN_TID, "runner", 0);
    ev_meta(&cv, "thread_sort_index", (int)i + 1, RUN_TID, NULL, 0);
  }
  for (uint32_t i = 0; i < njob; i++) {
    const msgpack_object *job = &jobs->via.array.ptr[i];
    const msgpack_object *dev = dspk__map_get(job, "device");
    int pid = 0;
    for (uint32_t k = 0; k < ndev && dev; k++) {
      dspk__strncpy_obj(&devs->via.array.ptr[k], id, sizeof id);
      if (dev->type == MSGPACK_OBJECT_STR && dev->via.str.size == strlen(id) &&
          (!*id || memcmp(dev->via.str.ptr, id, strlen(id)) == 0))
        pid = (int)k + 1;
    }
    if (pid)
      conv_job(&cv, job, pid);
  }
  snprintf(num, sizeof num,
           "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"start_us\":%" PRIu64
           ",\"end_us\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"jobs\":%" PRIu32 "}}\n",
           start - cv.base, end - cv.base, res[DSPK__R_TRACE_DROPPED].v.u, njob);
  dspk__jputs(&cv.j, num);
  free(cv.lanes);
  if (cv.j.err) {
    free(cv.j.p);
    return cv.j.err;
  }
  *out = cv.j.p;
  return 0;
}

DSPK_EXPORT int dspk_trace(dspk_client *c, double seconds, char **json_out) {
  struct dspk__resp r;
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char why[256];
  char *json = NULL;
  int rc;

  if (!c || !json_out)
    return dspk__argerr(c, "dspk_trace: json_out is NULL");
  /* Both ends refused here, in one wording (above 600 was the daemon's
   * "seconds: expected a number in (0, 600]"), the value as every message
   * names a float (proto/dtype.h): 600.0001 is not "600", 0 is "0.0". */
  if (!(seconds > 0 && seconds <= 600)) {
    char num[40];
    return dspk__argerr(c, "dspk_trace: seconds %s is not in (0, 600]",
                        dspk__float_str(num, sizeof num, seconds, false));
  }
  rc = dspk__call(c, "trace", pack_seconds, &seconds, &r);
  if (rc != 0)
    return rc;
  /* The whole answer against the table, each job record included. */
  if ((rc = dspk__result_decode(&dspk__methods[DSPK__M_TRACE], r.msg.result, v, why,
                                sizeof why)) < 0) {
    dspk__resp_free(&r);
    return dspk__cerr(c, rc, "%s", why);
  }
  rc = convert(v, &json);
  dspk__resp_free(&r);
  if (rc != 0)
    return dspk__cerr(c, rc, "out of memory");
  *json_out = json;
  return 0;
}
