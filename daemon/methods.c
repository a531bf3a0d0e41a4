/*
 * The method table of docs/protocol.md and its handlers, on the loop
 * thread.  A handler validates its arguments completely (types, ranges,
 * buffer ownership and bounds, the op's shapes through dspk__op_infer)
 * before it allocates anything or queues a job, so every error a client can
 * cause is answered at once with a precise message and costs no device
 * time.  Handlers either answer directly (hello, ping, devices, status,
 * buffer.free, task.cancel) or queue a job on a device's runner (buffer
 * create/write/read, task.run), which answers when it completes.
 *
 * Every parameter's type, range and default is in proto/schema.c:
 * dspkd_dispatch decodes the params map against it before the handler runs,
 * so a handler reads typed values (r->v, indexed by the parameter enums of
 * proto/schema.h) and checks only what needs the daemon's state (buffers,
 * devices, shapes).
 *
 * Handlers return 0 when they answered or queued, or a negative code with
 * the detail in r->msg, which the caller sends as the error response.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/admin.h"
#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/log.h"
#include "proto/schema.h"
#include "proto/utf8.h"

_Static_assert(sizeof(((struct conn *)0)->name) > 2 * DSPK__CLIENT_NAME_MAX + 1,
               "hello client, echoed (dspk__utf8_echo)");

#define fail(r, code, ...) dspk__fail((r)->msg, sizeof (r)->msg, (code), __VA_ARGS__)

/* Prefixes r->msg with "what: " (for errors of nested decoders). */
static int prefix(struct req *r, int code, const char *what) {
  char tmp[sizeof r->msg];
  size_t n = strlen(what);
  memcpy(tmp, r->msg, sizeof tmp);
  if (n + 2 >= sizeof r->msg)
    return code;
  memcpy(r->msg, what, n);
  memcpy(r->msg + n, ": ", 2);
  memcpy(r->msg + n + 2, tmp, sizeof r->msg - n - 2);
  r->msg[sizeof r->msg - 1] = '\0';
  return code;
}

/* What a buffer of the connection c on cpu:0 can hold at most (UINT64_MAX:
 * no bound, or no cpu:0): the least of max_conn_memory, max_user_memory
 * and, for a connection of a Slurm job (decided, or as it would be decided
 * now), max_job_memory; the clients size their shared temporaries by it. */
static uint64_t cpu_memory_quota(const struct dspkd *d, struct conn *c) {
  for (int i = 0; i < d->ndevs; i++)
    if (strcmp(d->devs[i].id, "cpu:0") == 0)
      return dspkd_quota_conn_cap(c, &d->devs[i]);
  return UINT64_MAX;
}

/* The limits in force: hello's (ud: the struct conn; its message limits
 * are the connection's own), status' daemon.limits (ud: the struct dspkd,
 * NULL conn). */
struct limits_of {
  const struct dspkd *d;
  const struct conn *c;
  struct conn *asker; /* the connection the quota figure is for */
};

static void pack_limits(const void *ud, struct dspk__wbuf *w) {
  const struct limits_of *lo = ud;
  const struct dspkd *d = lo->d;
  const struct dspkd_config *cfg = &d->cfg;
  const struct dspk__limits *ml = lo->c ? &lo->c->lim : &cfg->lim;
  struct dspk__pval v[DSPK__LIM_COUNT];
  v[DSPK__LIM_MAX_MESSAGE] = dspk__pv_uint(ml->max_message);
  v[DSPK__LIM_MAX_DEPTH] = dspk__pv_uint(
      ml->max_depth < DSPK__SCAN_DEPTH_MAX ? ml->max_depth : DSPK__SCAN_DEPTH_MAX);
  v[DSPK__LIM_MAX_OBJECTS] = dspk__pv_uint(ml->max_objects);
  v[DSPK__LIM_MAX_RANK] = dspk__pv_uint(ml->max_rank);
  v[DSPK__LIM_MAX_ELEMENTS] = dspk__pv_uint(ml->max_elements);
  v[DSPK__LIM_MAX_INFLIGHT] = dspk__pv_uint(cfg->max_inflight);
  v[DSPK__LIM_MAX_UNSENT] = dspk__pv_uint(cfg->max_unsent);
  v[DSPK__LIM_MAX_BUFFERS] = dspk__pv_uint(cfg->max_buffers);
  v[DSPK__LIM_MAX_CLIENTS] = dspk__pv_uint(cfg->max_clients);
  v[DSPK__LIM_CPU_MEMORY_QUOTA] = dspk__pv_uint(cpu_memory_quota(d, lo->asker));
  dspk__map_encode(w, dspk__limits_f, DSPK__LIM_COUNT, v);
}

/* Whether the connection may use dev (daemon/jobs.c: its Slurm job's
 * allocation): 0, or ENODEV (EPERM when its job cannot be decided) with
 * r->msg set. */
static int device_ok(struct req *r, const struct device *dev) {
  struct conn *c = r->c;
  int err = dspkd_job_resolve(c, r->msg, sizeof r->msg);
  if (err < 0)
    return err;
  if (dspkd_job_dev_ok(c, dev))
    return 0;
  if (c->job)
    return fail(r, DSPK_ENODEV, "device %s is not in the allocation of Slurm job %" PRIu64,
                dev->id, c->job->id);
  return fail(r, DSPK_ENODEV, "device %s: this connection has no Slurm job on this node "
              "(job_required%s)", dev->id, c->d->jobs_fail_closed
                                               ? "; the Slurm jobs' state file was refused at "
                                                 "start, see the daemon's log"
                                               : "");
}

/* Resolves a device name ("any" or an id) among the devices the connection
 * may use; for "any", among those whose caps cover op (NULL: every device;
 * none: ENOTSUP, saying why the first usable device cannot).  NULL with
 * r->msg set. */
static struct device *resolve_device(struct req *r, const char *name,
                                     const struct dspk__op *op, int *err) {
  struct dspkd *d = r->c->d;
  struct device *dev;
  if ((*err = dspkd_job_resolve(r->c, r->msg, sizeof r->msg)) < 0)
    return NULL;
  if (strcmp(name, "any") == 0) {
    dev = dspkd_device_any(d, r->c, op);
    if (!dev && op && (dev = dspkd_device_any(d, r->c, NULL))) {
      char why[sizeof r->msg - 64];
      dspkd_device_none_why(d, r->c, op, why, sizeof why);
      *err = fail(r, DSPK_ENOTSUP, "no device runs this task (%s)", why);
      return NULL;
    }
    if (!dev)
      *err = fail(r, DSPK_ENODEV, "no device is available");
    return dev;
  }
  dev = dspkd_device_find(d, name, strlen(name));
  if (!dev) {
    char echo[DSPK__ECHO_CAP(DSPK__DEVICE_NAME_MAX)];
    *err = fail(r, DSPK_ENODEV, "no device \"%s\" (the devices method lists them)",
                dspk__utf8_echo(echo, sizeof echo, name, strlen(name), DSPK__DEVICE_NAME_MAX));
    return NULL;
  }
  if ((*err = device_ok(r, dev)) < 0)
    return NULL;
  return dev;
}

/* For handlers in other files (daemon/shm.c): resolve_device. */
struct device *dspkd_resolve_device(struct req *r, const char *name, int *err) {
  return resolve_device(r, name, NULL, err);
}

/* ---- hello, ping ------------------------------------------------------ */

/* A result response of method (proto/schema.h's id) to msgid: fields vals
 * (indexed by the method's result enum) through the table's encoder. */
struct wreq *dspkd_result(uint32_t msgid, int method, const struct dspk__pval *vals) {
  struct wreq *wr = dspkd_wreq_new();
  if (wr) {
    dspk__pack_result_head(&wr->w.pk, msgid);
    dspk__result_encode(&wr->w, &dspk__methods[method], vals);
  }
  return wr;
}

/* Answers r with its method's result (dspkd_result).  0 or ENOMEM. */
static int answer(struct req *r, int method, const struct dspk__pval *vals) {
  struct wreq *wr = dspkd_result(r->msgid, method, vals);
  if (!wr)
    return DSPK_ENOMEM;
  dspkd_conn_send(r->c, wr);
  return 0;
}

static int m_hello(struct req *r) {
  struct conn *c = r->c;
  uint64_t version = r->v[DSPK__HELLO_VERSION].v.u;
  uint64_t job = r->v[DSPK__HELLO_JOB].v.u;
  struct dspk__pval v[5] = {0};

  if (version != DSPK_PROTOCOL_VERSION)
    return fail(r, DSPK_EVERSION, "client speaks protocol %" PRIu64
                ", this daemon speaks %d", version, DSPK_PROTOCOL_VERSION);
  if (r->v[DSPK__HELLO_CLIENT].set) { /* "" too: a name, the empty one */
    /* As one line, the way a message echoes a client's string (a viewer
     * of status, dspk-submit top, shows it as text). */
    const struct dspk__pval *n = &r->v[DSPK__HELLO_CLIENT];
    dspk__utf8_echo(c->name, sizeof c->name, n->v.s.p, n->v.s.n, DSPK__CLIENT_NAME_MAX);
  }
  /* The Slurm job the client says it belongs to (daemon/jobs.c checks it
   * at the first request that needs a device). */
  if (job && !c->job_state)
    c->job_claim = job;
  v[DSPK__R_HELLO_PROTOCOL] = dspk__pv_uint(DSPK_PROTOCOL_VERSION);
  v[DSPK__R_HELLO_DAEMON] = dspk__pv_str(DSPKD_VERSION);
  v[DSPK__R_HELLO_SERVER] = dspk__pv_str("dspkd");
  v[DSPK__R_HELLO_CLIENT_ID] = dspk__pv_uint(c->id);
  struct limits_of lo = {c->d, c, c};
  v[DSPK__R_HELLO_LIMITS] = dspk__pv_pack(pack_limits, &lo);
  return answer(r, DSPK__M_HELLO, v);
}

static void release_chunk(void *ud) { dspkd_chunk_unref(ud); }

static int m_ping(struct req *r) {
  struct dspk__pval v[1];
  int err;

  /* Echoed by reference: the frame's bytes stay alive until written. */
  r->chunk->refs++;
  v[DSPK__R_PING_DATA] = dspk__pv_bin(r->v[DSPK__PING_DATA].v.s.p, r->v[DSPK__PING_DATA].v.s.n,
                                      release_chunk, r->chunk);
  if ((err = answer(r, DSPK__M_PING, v)) < 0)
    r->chunk->refs--; /* never handed to a frame */
  return err;
}

/* ---- devices, status -------------------------------------------------- */

/* A device's ops as `devices` shows them: a map of each op it runs (raw
 * kernels aside) to the dtypes it runs it on; ud: its struct
 * dspk__devcaps. */
static void pack_ops(const void *ud, struct dspk__wbuf *w) {
  const struct dspk__devcaps *caps = ud;
  const struct dspk__param *dtypes = dspk__device_f[DSPK__DEV_OPS].item;
  size_t n = 0;
  for (int op = 0; op < DSPK_OP_COUNT; op++)
    n += op != DSPK_OP_KERNEL && caps->dtypes[op] != 0;
  msgpack_pack_map(&w->pk, n);
  for (int op = 0; op < DSPK_OP_COUNT; op++) {
    struct dspk__pval v = dspk__pv_mask(caps->dtypes[op]);
    if (op == DSPK_OP_KERNEL || !caps->dtypes[op])
      continue;
    dspk__pack_str(&w->pk, dspk__op_names[op]);
    dspk__value_encode(w, dtypes, &v);
  }
}

/* What m_devices decided once, for the packers of its fields. */
struct dv_ctx {
  const struct req *r;
  bool everything; /* an admin asked for all: every open device */
};

/* Whether devices shows dev: an open device the connection's job may use,
 * or any open device when an admin asks for all (whatever its job: the
 * UUIDs a Slurm node's GPU map is written from, docs/cluster.md). */
static bool dv_shown(const struct dv_ctx *x, const struct device *dev) {
  if (dev->open_state != 1)
    return false;
  return x->everything || dspkd_job_dev_ok(x->r->c, dev);
}

/* The devices the connection may use (devices' `devices`). */
static void dv_devices(const void *ud, struct dspk__wbuf *w) {
  const struct dv_ctx *x = ud;
  const struct dspkd *d = x->r->c->d;
  int n = 0;
  for (int i = 0; i < d->ndevs; i++)
    n += dv_shown(x, &d->devs[i]);
  msgpack_pack_array(&w->pk, (size_t)n);
  for (int i = 0; i < d->ndevs; i++) {
    const struct device *dev = &d->devs[i];
    struct dspk__pval v[DSPK__DEV_COUNT];
    if (!dv_shown(x, dev))
      continue;
    v[DSPK__DEV_ID] = dspk__pv_str(dev->id);
    v[DSPK__DEV_BACKEND] = dspk__pv_str(dev->be->name);
    v[DSPK__DEV_NAME] = dspk__pv_str(dev->info.name);
    v[DSPK__DEV_TYPE] = dspk__pv_str(dev->info.type);
    v[DSPK__DEV_ARCH] = dspk__pv_str(dev->info.arch);
    v[DSPK__DEV_DRIVER] = dspk__pv_str(dev->info.driver);
    v[DSPK__DEV_UUID] = dspk__pv_str(dev->info.uuid);
    v[DSPK__DEV_MEMORY] = dspk__pv_uint(dev->info.memory);
    v[DSPK__DEV_MAX_TENSOR_BYTES] = dspk__pv_uint(
        dev->info.max_tensor_bytes ? dev->info.max_tensor_bytes : dev->info.memory);
    v[DSPK__DEV_SOFTWARE] = dspk__pv_bool(dev->info.software != 0);
    v[DSPK__DEV_OPS] = dspk__pv_pack(pack_ops, &dev->caps);
    /* kernel_langs: the languages of the raw kernels it runs ([]: none) */
    v[DSPK__DEV_KERNEL_LANGS] =
        dspk__pv_mask(dev->caps.dtypes[DSPK_OP_KERNEL] ? dev->caps.langs : 0);
    dspk__map_encode(w, dspk__device_f, DSPK__DEV_COUNT, v);
  }
}

/* The backends without a usable device (with all: true; else none). */
static void dv_unavailable(const void *ud, struct dspk__wbuf *w) {
  const struct req *r = ud;
  const struct dspkd *d = r->c->d;
  bool all = r->v[DSPK__DEVICES_ALL].v.b;
  msgpack_pack_array(&w->pk, all ? (size_t)d->nunavail : 0);
  for (int i = 0; all && i < d->nunavail; i++) {
    struct dspk__pval v[DSPK__UNAV_COUNT];
    v[DSPK__UNAV_BACKEND] = dspk__pv_str(d->unavail[i].backend);
    v[DSPK__UNAV_REASON] = dspk__pv_str(d->unavail[i].reason);
    dspk__map_encode(w, dspk__unavail_f, DSPK__UNAV_COUNT, v);
  }
}

static int m_devices(struct req *r) {
  struct dv_ctx x = {.r = r, .everything = r->v[DSPK__DEVICES_ALL].v.b && dspkd_admin_is(r->c)};
  struct dspk__pval v[2];
  int err;

  /* An admin's all: true decides nothing (dv_shown). */
  if (!x.everything && (err = dspkd_job_resolve(r->c, r->msg, sizeof r->msg)) < 0)
    return err;
  v[DSPK__R_DEVICES_DEVICES] = dspk__pv_pack(dv_devices, &x);
  v[DSPK__R_DEVICES_UNAVAILABLE] = dspk__pv_pack(dv_unavailable, r);
  return answer(r, DSPK__M_DEVICES, v);
}

/* Whether the caller of status sees connection c in full: an admin sees
 * every connection, anyone else those of its own uid (and itself). */
static bool status_shows(const struct conn *caller, bool admin, const struct conn *c) {
  return c == caller || dspkd_sees_uid(caller, admin, (uint32_t)c->uid);
}

/* What m_status computed before packing, for the packers of its fields. */
struct status_ctx {
  struct req *r;
  bool admin;
  bool dev_shown[DSPKD_MAX_DEVICES]; /* dspkd_devices_usable */
  uint64_t shown, other_inflight, other_buffers;
  size_t njobs;
};

static void st_daemon(const void *ud, struct dspk__wbuf *w) {
  const struct status_ctx *x = ud;
  struct dspkd *d = x->r->c->d;
  struct dspk__pval v[DSPK__SD_COUNT];
  v[DSPK__SD_VERSION] = dspk__pv_str(DSPKD_VERSION);
  v[DSPK__SD_PID] = dspk__pv_int((int64_t)getpid());
  v[DSPK__SD_UPTIME_S] = dspk__pv_uint((dspkd_now_ms() - d->start_ms) / 1000);
  v[DSPK__SD_SOCKET] = dspk__pv_str(d->socket_name);
  v[DSPK__SD_CONNECTIONS] = dspk__pv_uint(d->nconns);
  v[DSPK__SD_STOPPING] = dspk__pv_bool(d->stopping);
  struct limits_of lo = {d, NULL, x->r->c};
  v[DSPK__SD_LIMITS] = dspk__pv_pack(pack_limits, &lo);
  dspk__map_encode(w, dspk__st_daemon_f, DSPK__SD_COUNT, v);
}

/* A peer credential as status shows it: -1 when unknown. */
static struct dspk__pval cred(uint32_t id) {
  return dspk__pv_int(id == (uint32_t)-1 ? -1 : (int64_t)id);
}

static void st_clients(const void *ud, struct dspk__wbuf *w) {
  const struct status_ctx *x = ud;
  struct req *r = x->r;
  struct dspkd *d = r->c->d;
  msgpack_pack_array(&w->pk, x->shown);
  for (struct conn *c = d->conns; c; c = c->next) {
    struct dspk__pval v[DSPK__SC_COUNT];
    if (!status_shows(r->c, x->admin, c))
      continue;
    v[DSPK__SC_ID] = dspk__pv_uint(c->id);
    v[DSPK__SC_PID] = dspk__pv_int((int64_t)c->pid);
    v[DSPK__SC_UID] = cred((uint32_t)c->uid);
    v[DSPK__SC_GID] = cred((uint32_t)c->gid);
    v[DSPK__SC_NAME] = dspk__pv_str(c->name);
    v[DSPK__SC_INFLIGHT] = dspk__pv_uint(dspkd_conn_inflight(c));
    v[DSPK__SC_BUFFERS] = dspk__pv_uint(c->nbufs + c->held_bufs);
    v[DSPK__SC_BUFFER_BYTES] = dspk__pv_uint(c->buf_bytes + c->held_bytes);
    v[DSPK__SC_UNSENT] = dspk__pv_uint(c->unsent);
    v[DSPK__SC_REQUESTS] = dspk__pv_uint(c->requests);
    v[DSPK__SC_SELF] = dspk__pv_bool(c == r->c);
    v[DSPK__SC_JOB] = c->job ? dspk__pv_uint(c->job->id) : dspk__pv_nil();
    dspk__map_encode(w, dspk__st_client_f, DSPK__SC_COUNT, v);
  }
}

static void st_other(const void *ud, struct dspk__wbuf *w) {
  const struct status_ctx *x = ud;
  struct dspk__pval v[DSPK__SO_COUNT];
  /* The connections not listed: counts only, nothing that names them. */
  v[DSPK__SO_CONNECTIONS] = dspk__pv_uint(x->r->c->d->nconns - x->shown);
  v[DSPK__SO_INFLIGHT] = dspk__pv_uint(x->other_inflight);
  v[DSPK__SO_BUFFERS] = dspk__pv_uint(x->other_buffers);
  dspk__map_encode(w, dspk__st_other_f, DSPK__SO_COUNT, v);
}

/* A job's GPUs: the UUIDs; ud: the struct djob. */
static void pack_job_devices(const void *ud, struct dspk__wbuf *w) {
  const struct djob *j = ud;
  msgpack_pack_array(&w->pk, (size_t)j->ndevs);
  for (int k = 0; k < j->ndevs; k++)
    dspk__pack_str(&w->pk, j->uuid[k]);
}

/* A registered job and its place in d->jobs: sorted by id, then by the
 * order of registration, as protocol.md says (a job registered again while
 * its earlier registration ends comes after it): the ending ones first,
 * and d->jobs has the newest first (job.register puts a job at its head;
 * it listed the new registration first: outside probe 16 F4). */
struct jpos {
  const struct djob *j;
  size_t at;
};

static int jpos_cmp(const void *a, const void *b) {
  const struct jpos *x = a, *y = b;
  if (x->j->id != y->j->id)
    return x->j->id < y->j->id ? -1 : 1;
  if (x->j->ended != y->j->ended)
    return x->j->ended ? -1 : 1;
  return x->at > y->at ? -1 : x->at < y->at;
}

static void st_jobs(const void *ud, struct dspk__wbuf *w) {
  const struct status_ctx *x = ud;
  struct req *r = x->r;
  struct dspkd *d = r->c->d;
  size_t n = 0, k = 0;
  struct jpos *order;
  /* The Slurm jobs registered here (daemon/jobs.c): to an admin every one,
   * to anyone else those of its uid; by increasing job id, as the metrics
   * list them (in the list's order if out of memory). */
  for (const struct djob *j = d->jobs; j; j = j->next)
    n++;
  order = n ? malloc(n * sizeof *order) : NULL;
  for (const struct djob *j = d->jobs; order && j; j = j->next, k++)
    order[k] = (struct jpos){j, k};
  if (order)
    qsort(order, n, sizeof *order, jpos_cmp);
  msgpack_pack_array(&w->pk, x->njobs);
  k = 0;
  for (const struct djob *j = order ? order[0].j : d->jobs; j;
       j = order ? (++k < n ? order[k].j : NULL) : j->next) {
    uint64_t inflight = 0, buffers = 0, bytes = 0;
    struct dspk__pval v[DSPK__SJ_COUNT];
    if (!dspkd_sees_uid(r->c, x->admin, (uint32_t)j->uid))
      continue;
    for (const struct conn *c = d->conns; c; c = c->next)
      if (c->job == j) {
        inflight += dspkd_conn_inflight(c);
        buffers += c->nbufs + c->held_bufs;
        bytes += c->buf_bytes + c->held_bytes;
      }
    v[DSPK__SJ_JOB] = dspk__pv_uint(j->id);
    v[DSPK__SJ_UID] = dspk__pv_int((int64_t)j->uid);
    v[DSPK__SJ_DEVICES] = dspk__pv_pack(pack_job_devices, j);
    v[DSPK__SJ_CONNECTIONS] = dspk__pv_uint(j->nconns);
    v[DSPK__SJ_INFLIGHT] = dspk__pv_uint(inflight);
    v[DSPK__SJ_BUFFERS] = dspk__pv_uint(buffers);
    v[DSPK__SJ_BUFFER_BYTES] = dspk__pv_uint(bytes);
    v[DSPK__SJ_ENDED] = dspk__pv_bool(j->ended);
    dspk__map_encode(w, dspk__st_job_f, DSPK__SJ_COUNT, v);
  }
  free(order);
}

/* A device's running_op: {name, age_ms, client?}; ud: struct running_op. */
struct running_op {
  const struct dev_activity *act;
  bool mine;    /* the caller sees whose work it is (dspkd_sees_uid) */
  bool closed;  /* its connection is closed (the client gone), the task runs on */
};

static void pack_running_op(const void *ud, struct dspk__wbuf *w) {
  const struct running_op *ro = ud;
  struct dspk__pval v[DSPK__RO_COUNT] = {0};
  /* Another user's work (or the daemon's own, to a non-admin): "other",
   * as trace shows it; no op, no connection. */
  v[DSPK__RO_NAME] = dspk__pv_str(ro->mine ? ro->act->what : DSPKD_OTHER_WORK);
  v[DSPK__RO_AGE_MS] = dspk__pv_uint(ro->act->age_ns / 1000000);
  if (ro->mine && ro->act->client) {
    v[DSPK__RO_CLIENT] = dspk__pv_uint(ro->act->client);
    /* A task outlives its connection until it ends (a raw kernel runs to
     * its end, protocol.md): the id names a connection that is gone. */
    if (ro->closed)
      v[DSPK__RO_CLOSED] = dspk__pv_bool(true);
  }
  dspk__map_encode(w, dspk__running_op_f, DSPK__RO_COUNT, v);
}

/* A device's stats: the backend's counters; ud: struct dspk__devstats. */
static void pack_devstats(const void *ud, struct dspk__wbuf *w) {
  const struct dspk__devstats *s = ud;
  struct dspk__pval v[DSPK__DS_COUNT];
  v[DSPK__DS_POOL_BYTES_IN_USE] = dspk__pv_uint(s->pool_bytes_in_use);
  v[DSPK__DS_POOL_BYTES_CACHED] = dspk__pv_uint(s->pool_bytes_cached);
  v[DSPK__DS_POOL_HITS] = dspk__pv_uint(s->pool_hits);
  v[DSPK__DS_POOL_MISSES] = dspk__pv_uint(s->pool_misses);
  v[DSPK__DS_RETIRE_DEFERRED] = dspk__pv_uint(s->retire_deferred);
  v[DSPK__DS_RETIRE_RELEASED] = dspk__pv_uint(s->retire_released);
  v[DSPK__DS_RETIRE_BARRIER_FALLBACKS] = dspk__pv_uint(s->retire_barrier_fallbacks);
  v[DSPK__DS_RETIRE_LEAKED] = dspk__pv_uint(s->retire_leaked);
  v[DSPK__DS_RETIRE_IN_FLIGHT] = dspk__pv_uint(s->retire_in_flight);
  v[DSPK__DS_RETIRE_MAX_IN_FLIGHT] = dspk__pv_uint(s->retire_max_in_flight);
  v[DSPK__DS_KERNELS_COMPILED] = dspk__pv_uint(s->kernels_compiled);
  v[DSPK__DS_KERNEL_CACHE_HITS] = dspk__pv_uint(s->kernel_cache_hits);
  dspk__map_encode(w, dspk__devstats_f, DSPK__DS_COUNT, v);
}

static void st_devices(const void *ud, struct dspk__wbuf *w) {
  const struct status_ctx *x = ud;
  struct req *r = x->r;
  struct dspkd *d = r->c->d;
  int n = 0;
  for (int i = 0; i < d->ndevs; i++)
    n += x->dev_shown[i];
  msgpack_pack_array(&w->pk, (size_t)n);
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    struct dspk__devstats s;
    struct dev_activity act;
    struct running_op ro = {.act = &act};
    struct dspk__pval v[DSPK__SV_COUNT];
    uint64_t q, run, done, failed;
    if (!x->dev_shown[i])
      continue;
    dspkd_sched_counters(dev, &q, &run, &done, &failed, &s);
    dspkd_obs_activity(dev, &act);
    /* Whose job it is as the clients list tells: to an admin, and to the
     * job's own user. */
    ro.mine = dspkd_sees_uid(r->c, x->admin, act.uid);
    if (act.running && act.client) {
      const struct conn *c = d->conns;
      while (c && c->id != act.client)
        c = c->next;
      ro.closed = !c || c->closing;
    }
    v[DSPK__SV_ID] = dspk__pv_str(dev->id);
    v[DSPK__SV_QUEUED] = dspk__pv_uint(q);
    v[DSPK__SV_RUNNING] = dspk__pv_uint(run);
    v[DSPK__SV_COMPLETED] = dspk__pv_uint(done);
    v[DSPK__SV_FAILED] = dspk__pv_uint(failed);
    v[DSPK__SV_BUSY] = dspk__pv_num(act.busy);
    v[DSPK__SV_CLIENTS] = dspk__pv_uint(act.clients);
    v[DSPK__SV_MEMORY] = dspk__pv_uint(dev->info.memory);
    v[DSPK__SV_RUNNING_OP] = act.running ? dspk__pv_pack(pack_running_op, &ro) : dspk__pv_nil();
    v[DSPK__SV_STATS] = dspk__pv_pack(pack_devstats, &s);
    dspk__map_encode(w, dspk__st_device_f, DSPK__SV_COUNT, v);
  }
}

static int m_status(struct req *r) {
  struct dspkd *d = r->c->d;
  struct status_ctx x = {.r = r, .admin = dspkd_admin_is(r->c)};
  struct dspk__pval v[5] = {0};

  /* The devices the caller may use, as its requests would find them, an
   * admin's too (without deciding its job for good: status is not a
   * request that needs a device). */
  dspkd_devices_usable(r->c, x.dev_shown);
  for (const struct djob *j = d->jobs; j; j = j->next)
    x.njobs += dspkd_sees_uid(r->c, x.admin, (uint32_t)j->uid);
  for (struct conn *c = d->conns; c; c = c->next)
    if (status_shows(r->c, x.admin, c))
      x.shown++;
    else {
      x.other_inflight += dspkd_conn_inflight(c);
      x.other_buffers += c->nbufs + c->held_bufs;
    }
  v[DSPK__R_STATUS_DAEMON] = dspk__pv_pack(st_daemon, &x);
  v[DSPK__R_STATUS_CLIENTS] = dspk__pv_pack(st_clients, &x);
  v[DSPK__R_STATUS_OTHER_CLIENTS] = dspk__pv_pack(st_other, &x);
  v[DSPK__R_STATUS_JOBS] = dspk__pv_pack(st_jobs, &x);
  v[DSPK__R_STATUS_DEVICES] = dspk__pv_pack(st_devices, &x);
  return answer(r, DSPK__M_STATUS, v);
}

/* ---- buffers ---------------------------------------------------------- */

/* Looks up the buffer id r->v[i] among the connection's buffers. */
static struct dbuf *arg_buffer(struct req *r, int i, int *err) {
  uint64_t id = r->v[i].v.u;
  struct dbuf *b = dspkd_conn_buf_find(r->c, id);
  if (!b)
    *err = fail(r, DSPK_ENOBUF, "no buffer %" PRIu64 " on this connection", id);
  return b;
}

int dspkd_buffer_fits(struct req *r, struct device *dev, uint64_t size) {
  struct conn *c = r->c;
  if (dev->info.memory && size > dev->info.memory)
    return fail(r, DSPK_ENOMEM, "%" PRIu64 " byte%s is more than %s has (%" PRIu64 ")",
                size, size == 1 ? "" : "s", dev->id, dev->info.memory);
  if (size > SIZE_MAX / 2)
    return fail(r, DSPK_ENOMEM, "%" PRIu64 " bytes is more than %s can allocate", size,
                dev->id);
  /* Creates still in flight count: pipelined creates cannot overshoot. */
  if (c->nbufs + c->creating >= c->d->cfg.max_buffers)
    return fail(r, DSPK_ELIMIT, "this connection already has %zu buffer%s, at most %" PRIu64
                " (max_buffers): free some first", c->nbufs + c->creating,
                c->nbufs + c->creating == 1 ? "" : "s", (uint64_t)c->d->cfg.max_buffers);
  return 0;
}

int dspkd_buffer_submit(struct req *r, struct device *dev, uint64_t size, void *host,
                        const struct stat *file, int share_fd) {
  struct conn *c = r->c;
  struct dbuf *b;
  struct job *j;
  int err;

  if (!(b = calloc(1, sizeof(*b))))
    goto nomem;
  if (!(b->free_job = dspkd_job_new(NULL, JOB_BUF_FREE, 0, dev)) ||
      !(j = dspkd_job_new(c, JOB_BUF_CREATE, r->msgid, dev))) {
    free(b->free_job); /* a fresh job without a connection holds nothing */
    free(b);
    goto nomem;
  }
  b->free_job->uid = (uint32_t)c->uid; /* the release is its owner's work (trace) */
  b->id = ++c->d->next_buf_id;
  b->dev = dev;
  b->size = size;
  b->refs = 1; /* the job's */
  b->host = host;
  if (file) {
    b->has_file = true;
    b->file_dev = file->st_dev;
    b->file_ino = file->st_ino;
  }
  b->share_fd = share_fd;
  if (dspkd_maps_needed(dev, size, host != NULL)) /* checked by the caller */
    dspkd_maps_take(c, b);
  j->buf = b;
  j->refs[j->nrefs++] = b;
  if ((err = dspkd_quota_check(j, r->msg, sizeof r->msg, &r->logged)) < 0) {
    dspkd_job_free(c->d, j); /* the buffer's release unmaps and closes */
    return err;
  }
  if (share_fd >= 0) { /* held until its answer is written (dspkd_shm_share_count) */
    j->share_counted = true;
    dspkd_shm_share_count(c, +1);
  }
  dspkd_sched_submit(j);
  return 0;
nomem:
  if (host)
    munmap(host, (size_t)size);
  if (share_fd >= 0)
    close(share_fd);
  return DSPK_ENOMEM;
}

static int m_buffer_create(struct req *r) {
  char devname[DSPK__DEVICE_NAME_MAX + 1];
  uint64_t size = r->v[DSPK__BCREATE_SIZE].v.u;
  struct device *dev;
  int err = 0;

  dspk__pval_str(&r->v[DSPK__BCREATE_DEVICE], devname, sizeof devname);
  if (!(dev = resolve_device(r, devname, NULL, &err)))
    return err;
  if ((err = dspkd_buffer_fits(r, dev, size)) < 0)
    return err;
  if (dspkd_maps_needed(dev, size, false) && (err = dspkd_maps_check(r, "buffer.create")) < 0)
    return err;
  return dspkd_buffer_submit(r, dev, size, NULL, NULL, -1);
}

/* buffer.write's checks of its arguments, its data being len bytes: the
 * buffer (*bp), or NULL with *err set and r->msg the error. */
static struct dbuf *write_checks(struct req *r, uint64_t len, int *err) {
  uint64_t off = r->v[DSPK__BWRITE_OFFSET].v.u;
  struct dbuf *b;

  if (!(b = arg_buffer(r, DSPK__BWRITE_BUFFER, err)))
    return NULL;
  if ((*err = device_ok(r, b->dev)) < 0)
    return NULL;
  /* Worded as buffer.read words the same cases. */
  if (off > b->size) {
    *err = fail(r, DSPK_ERANGE, "offset %" PRIu64 " is past the end of buffer %" PRIu64
                " (%" PRIu64 " byte%s)", off, b->id, b->size, b->size == 1 ? "" : "s");
    return NULL;
  }
  if (len > b->size - off) {
    *err = fail(r, DSPK_ERANGE, "writing %" PRIu64 " byte%s at offset %" PRIu64
                " overruns buffer %" PRIu64 " of %" PRIu64 " byte%s", len, dspk__s(len),
                off, b->id, b->size, b->size == 1 ? "" : "s");
    return NULL;
  }
  return b;
}

static int m_buffer_write(struct req *r) {
  struct dbuf *b;
  const void *data = r->v[DSPK__BWRITE_DATA].v.s.p;
  size_t len = r->v[DSPK__BWRITE_DATA].v.s.n;
  struct job *j;
  int err = 0;

  if (!(b = write_checks(r, len, &err)))
    return err;
  if (!(j = dspkd_job_new(r->c, JOB_BUF_WRITE, r->msgid, b->dev)))
    return DSPK_ENOMEM;
  dspkd_dbuf_ref(b);
  j->buf = b;
  j->refs[j->nrefs++] = b;
  j->off = r->v[DSPK__BWRITE_OFFSET].v.u;
  j->size = len;
  j->data = data;
  /* A second block while answers may be sent from the buffer's block. */
  dspkd_quota_move_mem(j);
  if ((err = dspkd_quota_check(j, r->msg, sizeof r->msg, &r->logged)) < 0) {
    dspkd_job_free(r->c->d, j);
    return err;
  }
  r->chunk->refs++;
  j->chunk = r->chunk;
  dspkd_sched_submit(j);
  return 0;
}

int dspkd_write_refused(struct req *r, uint64_t len) {
  const struct dspk__method *m = &dspk__methods[DSPK__M_BUFFER_WRITE];
  int err;

  if ((err = dspk__params_decode(m->params, m->nparams, r->args, NULL, r->v, r->msg,
                                 sizeof r->msg)) < 0)
    return err;
  return write_checks(r, len, &err) ? 0 : err;
}

/* buffer.write in place: the same checks as m_buffer_write, and that no
 * job in flight uses the buffer but earlier landed writes (whose data is
 * in it already), no answer is still sent from its memory (struct mpin: a
 * read answer keeps the bytes it read), and its memory is the cpu's, which
 * the loop may write while no op uses it (backend host_ptr).  Those
 * conditions hold until the data has come: only later requests of this
 * connection could use the buffer, and they follow the data. */
char *dspkd_land_begin(struct conn *c, const struct dspk__write_head *h) {
  struct req r = {.c = c, .msgid = h->msgid};
  struct dbuf *b = dspkd_conn_buf_find(c, h->buffer);
  struct device *dev;
  struct job *j;
  char *p;
  bool open;

  if (!b || b->host || !b->mem || b->refs - b->landing != 1 || h->offset > b->size ||
      h->len > b->size - h->offset || c->d->stopping)
    return NULL;
  dev = b->dev;
  if (!dev->be->host_ptr ||
      (b->pin && atomic_load_explicit(&b->pin->sending, memory_order_acquire) != 0) ||
      device_ok(&r, dev) < 0)
    return NULL;
  pthread_mutex_lock(&dev->mu);
  open = dev->open_state == 1 && !dev->stop && !dev->exited;
  pthread_mutex_unlock(&dev->mu);
  if (!open || !(p = dev->be->host_ptr(dev->bdev, b->mem)) ||
      !(j = dspkd_job_new(c, JOB_BUF_WRITE, h->msgid, dev)))
    return NULL;
  dspkd_dbuf_ref(b);
  j->buf = b;
  j->refs[j->nrefs++] = b;
  j->off = h->offset;
  j->size = h->len;
  j->landed = true;
  b->landing++;
  c->land.j = j;
  c->land.dst = p + h->offset;
  c->land.got = 0;
  c->land.len = h->len;
  return c->land.dst;
}

void dspkd_land_end(struct conn *c) {
  struct job *j = c->land.j;
  c->land.j = NULL;
  c->requests++;
  dspkd_sched_submit(j);
}

static int m_buffer_read(struct req *r) {
  struct dbuf *b;
  uint64_t off = r->v[DSPK__BREAD_OFFSET].v.u, size;
  uint64_t max = r->c->lim.max_message - 64;
  struct job *j;
  int err = 0;

  if (!(b = arg_buffer(r, DSPK__BREAD_BUFFER, &err)))
    return err;
  if ((err = device_ok(r, b->dev)) < 0)
    return err;
  if (off > b->size)
    return fail(r, DSPK_ERANGE, "offset %" PRIu64 " is past the end of buffer %" PRIu64
                " (%" PRIu64 " byte%s)", off, b->id, b->size, b->size == 1 ? "" : "s");
  size = r->v[DSPK__BREAD_SIZE].set ? r->v[DSPK__BREAD_SIZE].v.u : b->size - off;
  if (size > b->size - off)
    return fail(r, DSPK_ERANGE, "reading %" PRIu64 " byte%s at offset %" PRIu64
                " overruns buffer %" PRIu64 " of %" PRIu64 " byte%s", size,
                size == 1 ? "" : "s", off, b->id, b->size, b->size == 1 ? "" : "s");
  /* The advice must work (probe 16 A#4: "read in pieces" where no piece
   * could be read). */
  if (size > max && max == 0)
    return fail(r, DSPK_ELIMIT, "reading %" PRIu64 " byte%s at once; this daemon's "
                "max_message (64) leaves no room for data in a reply: no buffer.read can "
                "return any (its administrator may raise max_message)", size, dspk__s(size));
  if (size > max)
    return fail(r, DSPK_ELIMIT, "reading %" PRIu64 " byte%s at once; the reply may hold at "
                "most %" PRIu64 " (max_message less 64): read at most %" PRIu64 " byte%s "
                "per call", size, dspk__s(size), max, max, dspk__s(max));
  if (!(j = dspkd_job_new(r->c, JOB_BUF_READ, r->msgid, b->dev)))
    return DSPK_ENOMEM;
  dspkd_dbuf_ref(b);
  j->buf = b;
  j->refs[j->nrefs++] = b;
  j->off = off;
  j->size = size;
  /* May be answered from the buffer's block (daemon/task.c, exec_read). */
  if (!b->has_file && b->dev->be->host_ptr && size >= DSPKD_SEND_IN_PLACE_MIN) {
    j->reading = true;
    b->reads++;
  }
  dspkd_sched_submit(j);
  return 0;
}

static int m_buffer_free(struct req *r) {
  struct dbuf *b;
  struct wreq *wr;
  int err = 0;

  if (!(b = arg_buffer(r, DSPK__BFREE_BUFFER, &err)))
    return err;
  if (!(wr = dspkd_result(r->msgid, DSPK__M_BUFFER_FREE, NULL)))
    return DSPK_ENOMEM;
  dspkd_conn_buf_remove(r->c, b->id);
  dspkd_dbuf_unref(r->c->d, b);
  dspkd_conn_send(r->c, wr);
  return 0;
}

/* ---- task.run --------------------------------------------------------- */

/* Whether map m has exactly one key, as every map is read (docs/protocol.md,
 * "Framing"): keys that are not strings are ignored, and a key given twice
 * is one key (its first value counts). */
static bool one_key(const msgpack_object *m) {
  const msgpack_object_str *first = NULL;
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object *k = &m->via.map.ptr[i].key;
    if (k->type != MSGPACK_OBJECT_STR)
      continue;
    if (!first)
      first = &k->via.str;
    else if (k->via.str.size != first->size ||
             memcmp(k->via.str.ptr, first->ptr, first->size) != 0)
      return false;
  }
  return first != NULL;
}

/* The kernel's args (an array of at most 16 one-key maps, checked by the
 * decoder): each names its kind by its key. */
static int kernel_args(struct req *r, const struct dspk__pval *args, struct dspk__op *op) {
  static const struct { const char *key; enum dspk__karg_kind kind; } kinds[] = {
      {"tensor", DSPK__KARG_TENSOR}, {"i32", DSPK__KARG_I32}, {"u32", DSPK__KARG_U32},
      {"i64", DSPK__KARG_I64},       {"f32", DSPK__KARG_F32}, {"f64", DSPK__KARG_F64}};
  const msgpack_object *a = args->v.o;
  if (!args->set)
    return 0;
  for (uint32_t i = 0; i < a->via.array.size; i++) {
    const msgpack_object *m = &a->via.array.ptr[i];
    struct dspk__karg *k = &op->u.kernel.args[i];
    const msgpack_object *v = NULL;
    size_t t;
    int64_t iv;
    double fv;
    char w[64];
    if (m->type != MSGPACK_OBJECT_MAP || !one_key(m))
      return fail(r, DSPK_EINVAL, "options.args[%u]: expected a map with one key, got %s", i,
                  dspk__obj_what(m, w, sizeof w));
    for (t = 0; t < sizeof kinds / sizeof kinds[0]; t++)
      if ((v = dspk__map_get(m, kinds[t].key)))
        break;
    if (!v)
      return fail(r, DSPK_EINVAL, "options.args[%u]: the key must be tensor, i32, u32, "
                  "i64, f32 or f64", i);
    k->kind = kinds[t].kind;
    if (k->kind == DSPK__KARG_F32 || k->kind == DSPK__KARG_F64) {
      if (dspk__obj_f64(v, &fv) != 0)
        return fail(r, DSPK_EINVAL, "options.args[%u]: expected a number, got %s", i,
                    dspk__obj_what(v, w, sizeof w));
      /* A finite value that would round to an infinity is ERANGE, as an
       * integer outside its type's (one that rounds to FLT_MAX is in range;
       * infinities and NaN are f32 values), naming the value as given. */
      if (k->kind == DSPK__KARG_F32 && !dspk__f64_fits_f32(fv)) {
        return fail(r, DSPK_ERANGE, "options.args[%u]: %s is out of f32 range (it "
                    "would round to an infinity)", i, dspk__obj_num_str(v, w, sizeof w));
      }
      if (k->kind == DSPK__KARG_F32)
        (void)dspk__obj_f32(v, &k->v.f32); /* from the exact value (fv: an int rounded) */
      else
        k->v.f64 = fv;
      continue;
    }
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > INT64_MAX)
      return fail(r, k->kind == DSPK__KARG_TENSOR ? DSPK_EINVAL : DSPK_ERANGE,
                  "options.args[%u]: %s is out of %s range", i, dspk__obj_num_str(v, w, sizeof w),
                  k->kind == DSPK__KARG_TENSOR ? "tensor index" : kinds[t].key);
    if (dspk__obj_i64(v, &iv) != 0)
      return fail(r, DSPK_EINVAL, "options.args[%u]: expected an integer, got %s", i,
                  dspk__obj_what(v, w, sizeof w));
    switch (k->kind) {
    case DSPK__KARG_TENSOR:
      if (iv < 0 || iv >= op->nin)
        return fail(r, DSPK_EINVAL, "options.args[%u]: tensor %" PRId64
                    " is not an input index", i, iv);
      k->v.tensor = (int)iv;
      break;
    case DSPK__KARG_I32:
      if (iv < INT32_MIN || iv > INT32_MAX)
        return fail(r, DSPK_ERANGE, "options.args[%u]: %s is out of i32 range", i,
                    dspk__obj_num_str(v, w, sizeof w));
      k->v.i32 = (int32_t)iv;
      break;
    case DSPK__KARG_U32:
      if (iv < 0 || iv > UINT32_MAX)
        return fail(r, DSPK_ERANGE, "options.args[%u]: %s is out of u32 range", i,
                    dspk__obj_num_str(v, w, sizeof w));
      k->v.u32 = (uint32_t)iv;
      break;
    default:
      k->v.i64 = iv;
      break;
    }
  }
  op->u.kernel.nargs = (int)a->via.array.size;
  return 0;
}

/* The reduce op's axes (a non-empty array, checked by the decoder): each
 * an integer in [-rank, rank), none repeated. */
static int reduce_axes(struct req *r, const struct dspk__pval *axes, struct dspk__op *op) {
  int rank = op->in[0].rank;
  int64_t given[DSPK_MAX_RANK]; /* by axis: the value that named it first */
  uint32_t at[DSPK_MAX_RANK];   /* and its index in axes */
  op->u.reduce.axes = 0;
  for (uint32_t i = 0; axes->set && i < axes->v.o->via.array.size; i++) {
    const msgpack_object *o = &axes->v.o->via.array.ptr[i];
    int64_t ax;
    char w[64];
    if (dspk__obj_i64(o, &ax) != 0 && !(o->type == MSGPACK_OBJECT_POSITIVE_INTEGER))
      return fail(r, DSPK_EINVAL, "options.axes[%u]: expected an integer, got %s", i,
                  dspk__obj_what(o, w, sizeof w));
    /* An integer beyond int64 (2^63 and up) is out of range as any other. */
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 > INT64_MAX)
      ax = INT64_MAX;
    if (ax < -rank || ax >= rank)
      return fail(r, DSPK_EINVAL, "options.axes[%u]: axis %s is out of range for input 0 "
                  "of rank %d", i, dspk__obj_num_str(o, w, sizeof w), rank);
    int64_t as_sent = ax;
    if (ax < 0)
      ax += rank;
    if (op->u.reduce.axes & (1u << ax))
      return fail(r, DSPK_EINVAL, "options.axes[%u]: %" PRId64 " names the same axis as "
                  "options.axes[%u] (%" PRId64 ") of input 0 (rank %d)", i, as_sent, at[ax],
                  given[ax], rank);
    op->u.reduce.axes |= 1u << ax;
    given[ax] = as_sent;
    at[ax] = i;
  }
  return 0;
}

/* gemm's alpha and beta, map's alpha, of an op that uses them as f32 (the
 * inputs are decoded by now; dspk__op_gemm_scalars, dspk__op_map_alpha):
 * an integer sent is rounded once, to the nearest f32 from its exact value,
 * which the double then holds exactly, so that the op's own rounding to f32
 * changes nothing.  The table's double would be a second rounding
 * (2^53 + 2^29 + 1 to the tie 2^53 + 2^29, then to 2^53).  A float sent is
 * a double already, rounded once by the op. */
static void f32_scalars(const msgpack_object *o, struct dspk__op *op) {
  static const char *gemm_keys[] = {"alpha", "beta"}, *map_keys[] = {"alpha"};
  double *gemm_vals[] = {&op->u.gemm.alpha, &op->u.gemm.beta}, *map_vals[] = {&op->u.map.alpha};
  const char **keys;
  double **vals;
  int n;
  dspk_dtype dt = op->nin > 0 ? op->in[0].dtype : DSPK_F64;
  if (op->kind == DSPK_OP_GEMM && dt != DSPK_F64) {
    keys = gemm_keys, vals = gemm_vals, n = 2;
  } else if (op->kind == DSPK_OP_MAP && (dt == DSPK_F32 || dt == DSPK_C64)) {
    keys = map_keys, vals = map_vals, n = 1;
  } else {
    return;
  }
  for (int i = 0; i < n; i++) {
    const msgpack_object *x = o && o->type == MSGPACK_OBJECT_MAP ? dspk__map_get(o, keys[i]) : NULL;
    float f;
    if (x && (x->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
              x->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) &&
        dspk__obj_f32(x, &f) == 0)
      *vals[i] = f;
  }
}

/* Decodes the op's options with the op's table (proto/schema.c), which
 * stores the plain values into op->u; here only what needs more than the
 * table: a reduce's axes (rank), a kernel's source and args. */
static int task_options(struct req *r, const msgpack_object *o, struct dspk__op *op) {
  const struct dspk__op_desc *od = &dspk__ops[op->kind];
  struct dspk__pval v[DSPK__MAX_PARAMS];
  int err;

  if ((err = dspk__params_decode(od->options, od->noptions, o, "options.", v, r->msg,
                                 sizeof r->msg)))
    return err;
  dspk__params_store(od->options, od->noptions, v, &op->u);
  f32_scalars(o, op);
  switch (op->kind) {
  case DSPK_OP_REDUCE:
    return reduce_axes(r, &v[DSPK__REDUCE_AXES], op);
  case DSPK_OP_KERNEL:
    /* The table's strings outlive the frame's zone. */
    op->u.kernel.lang = dspk__kernel_langs[v[DSPK__KERNEL_LANG].v.e];
    op->u.kernel.source = v[DSPK__KERNEL_SOURCE].v.s.p;
    op->u.kernel.source_len = v[DSPK__KERNEL_SOURCE].v.s.n;
    /* A text source reaches its compiler as a C string: a NUL would end it
     * there, silently dropping the rest (SPIR-V is binary). */
    if (strcmp(op->u.kernel.lang, "spirv") != 0) {
      const char *z = memchr(op->u.kernel.source, 0, op->u.kernel.source_len);
      if (z)
        return fail(r, DSPK_EINVAL, "options.source: a %s source holds a NUL byte (at byte "
                    "%zu)", op->u.kernel.lang,
                    (size_t)(z - (const char *)op->u.kernel.source));
    }
    /* Left out: "main".  Given as "": no function has that name (not the
     * default, which only leaving it out asks for). */
    if (!v[DSPK__KERNEL_ENTRY].set)
      snprintf(op->u.kernel.entry, sizeof op->u.kernel.entry, "main");
    else if (!op->u.kernel.entry[0])
      return fail(r, DSPK_EINVAL, "options.entry: \"\" names no entry point (leave "
                  "entry out for \"main\")");
    return kernel_args(r, &v[DSPK__KERNEL_ARGS], op);
  default:
    break;
  }
  return 0;
}

/* Bytes a task.run response spends besides its inline data: the envelope,
 * the device id, and per result its keys, dtype, shape and bin header
 * (under 200 bytes with 8 dimensions; 4 results at most). */
#define RESULT_FRAMING 1024

/* The connection's message limits that task.run's op obeys (max_bytes
 * stays unset until the device is known). */
static void task_limits(const struct dspk__limits *cl, struct dspk__op_limits *l) {
  dspk__op_limits_none(l);
  l->max_elements = cl->max_elements;
  l->max_rank = cl->max_rank;
  l->max_inline = cl->max_message > RESULT_FRAMING
                      ? (uint64_t)cl->max_message - RESULT_FRAMING
                      : 0;
}

/* Pins the task to dev (a referenced buffer's device). */
static int pin(struct req *r, struct device **pinned, struct device *dev,
               const char *what, uint64_t id) {
  if (*pinned && *pinned != dev)
    return fail(r, DSPK_EINVAL, "%s: buffer %" PRIu64 " is on %s, another operand is on %s",
                what, id, dev->id, (*pinned)->id);
  *pinned = dev;
  return 0;
}

/* task.run: checks the request and submits its job.  A task.run refused
 * here never reached a device: daemon/conn.c logs it as any other failed
 * request (the client's own mistake at debug only); the "task failed" line
 * is for a task its device failed (daemon/sched.c). */
static int m_task_run(struct req *r) {
  char devname[DSPK__DEVICE_NAME_MAX + 1];
  struct conn *c = r->c;
  struct dspkd *d = c->d;
  const msgpack_object *inputs = r->v[DSPK__RUN_INPUTS].v.o;
  const msgpack_object *outputs = r->v[DSPK__RUN_OUTPUTS].set ? r->v[DSPK__RUN_OUTPUTS].v.o
                                                              : NULL;
  dspk_op kind = (dspk_op)r->v[DSPK__RUN_OP].v.e;
  const char *opname = dspk__op_names[kind];
  char what[32];
  struct device *pinned = NULL, *dev = NULL;
  struct dspk__op_limits lim;
  unsigned inline_in = 0, inline_out;
  struct job *j;
  int err = 0;

  _Static_assert(DSPK__OP_MAX_IN == 4 && DSPK__OP_MAX_OUT == 1,
                 "inputs and outputs counts in proto/schema.c");
  dspk__pval_str(&r->v[DSPK__RUN_DEVICE], devname, DSPK__DEVICE_NAME_MAX + 1);

  if (!(j = dspkd_job_new(c, JOB_TASK, r->msgid, NULL)))
    return DSPK_ENOMEM;
  j->op.kind = kind;
  j->op.nin = (int)inputs->via.array.size;
  for (int i = 0; i < j->op.nin; i++) {
    struct dspk__wire_tensor wt;
    struct dspk__tensor *t = &j->op.in[i];
    snprintf(what, sizeof what, "input %d", i);
    err = dspk__tensor_decode(&inputs->via.array.ptr[i], &c->lim, &wt, r->msg,
                              sizeof r->msg);
    if (err < 0) {
      prefix(r, err, what);
      goto fail;
    }
    t->dtype = wt.dtype;
    t->rank = (int)wt.rank;
    memcpy(t->shape, wt.shape, sizeof wt.shape);
    if (!wt.is_ref) {
      j->in_data[i] = wt.data;
      inline_in |= 1u << i;
      continue;
    }
    struct dbuf *b = dspkd_conn_buf_find(c, wt.buffer);
    if (!b) {
      err = fail(r, DSPK_ENOBUF, "%s: no buffer %" PRIu64 " on this connection", what,
                 wt.buffer);
      goto fail;
    }
    if ((err = dspk__tensor_offset_check(&wt, r->msg, sizeof r->msg)) < 0) {
      prefix(r, err, what);
      goto fail;
    }
    if (wt.offset > b->size || wt.nbytes > b->size - wt.offset) {
      err = fail(r, DSPK_ERANGE, "%s: %zu byte%s at offset %" PRIu64 " overrun%s buffer %"
                 PRIu64 " of %" PRIu64 " byte%s", what, wt.nbytes, wt.nbytes == 1 ? "" : "s",
                 wt.offset, wt.nbytes == 1 ? "s" : "", b->id, b->size,
                 b->size == 1 ? "" : "s");
      goto fail;
    }
    if ((err = pin(r, &pinned, b->dev, what, b->id)))
      goto fail;
    dspkd_dbuf_ref(b);
    j->refs[j->nrefs++] = b;
    j->in_buf[i] = b;
    t->offset = (size_t)wt.offset;
  }
  if ((err = task_options(r, r->v[DSPK__RUN_OPTIONS].v.o, &j->op)))
    goto fail;
  task_limits(&c->lim, &lim);
  if ((err = dspk__op_infer_lim(&j->op, &lim, r->msg, sizeof r->msg)) < 0)
    goto fail;
  /* Results come back inline unless outputs names a buffer; a kernel's
   * results are its inputs, inline as they came. */
  inline_out = kind == DSPK_OP_KERNEL ? inline_in : (1u << j->op.nout) - 1;
  if (outputs && kind == DSPK_OP_KERNEL && outputs->via.array.size) {
    err = fail(r, DSPK_EINVAL, "outputs: a kernel writes into its inputs");
    goto fail;
  }
  for (uint32_t k = 0; outputs && k < outputs->via.array.size; k++) {
    const msgpack_object *o = &outputs->via.array.ptr[k];
    struct dspk__tensor *t = &j->op.out[k];
    uint64_t id, off;
    size_t nb, isz;
    struct dbuf *b;
    snprintf(what, sizeof what, "outputs[%u]", k);
    if ((int)k >= j->op.nout) {
      /* Not reached while every op but kernel has DSPK__OP_MAX_OUT results
       * (the params refuse a longer outputs); kept for an op with fewer. */
      err = fail(r, DSPK_EINVAL, "%s: %s has %d result%s", what, opname, j->op.nout,
                 j->op.nout == 1 ? "" : "s");
      goto fail;
    }
    if (o->type == MSGPACK_OBJECT_NIL)
      continue; /* this output comes back inline */
    /* Checked with the params against its row (dspk__out_ref_f). */
    struct dspk__pval rv[DSPK__OREF_COUNT];
    if ((err = dspk__params_decode(dspk__out_ref_f, DSPK__OREF_COUNT, o, "", rv, r->msg,
                                   sizeof r->msg)) < 0) {
      prefix(r, err, what);
      goto fail;
    }
    id = rv[DSPK__OREF_BUFFER].v.u;
    off = rv[DSPK__OREF_OFFSET].v.u;
    if (!(b = dspkd_conn_buf_find(c, id))) {
      err = fail(r, DSPK_ENOBUF, "%s: no buffer %" PRIu64 " on this connection", what, id);
      goto fail;
    }
    nb = dspk__tensor_nbytes(t);
    isz = dspk__dtype_size(t->dtype);
    if (isz && off % isz != 0) {
      err = fail(r, DSPK_EINVAL, "%s: offset %" PRIu64 " is not a multiple of the %s item "
                 "size %zu", what, off, dspk__dtype_name(t->dtype), isz);
      goto fail;
    }
    if (off > b->size || nb > b->size - off) {
      err = fail(r, DSPK_ERANGE, "%s: the %zu-byte result at offset %" PRIu64
                 " overruns buffer %" PRIu64 " of %" PRIu64 " byte%s", what, nb, off, b->id,
                 b->size, b->size == 1 ? "" : "s");
      goto fail;
    }
    if ((err = pin(r, &pinned, b->dev, what, b->id)))
      goto fail;
    dspkd_dbuf_ref(b);
    j->refs[j->nrefs++] = b;
    j->out_buf[k] = b;
    t->offset = (size_t)off;
    inline_out &= ~(1u << k);
  }
  if (strcmp(devname, "any") == 0 && pinned) {
    dev = pinned;
    if ((err = device_ok(r, dev)) < 0)
      goto fail;
  } else {
    if (!(dev = resolve_device(r, devname, &j->op, &err)))
      goto fail;
    if (pinned && pinned != dev) {
      err = fail(r, DSPK_EINVAL, "the task asks for %s but its buffers are on %s", dev->id,
                 pinned->id);
      goto fail;
    }
  }
  /* Routing by the device's caps: a named device (or the buffers' one)
   * that lacks the op, the dtype or the kernel language answers ENOTSUP
   * now and runs nothing. */
  if ((err = dspkd_device_caps_check(dev, &j->op, r->msg, sizeof r->msg)) < 0)
    goto fail;
  if (dev->info.memory)
    lim.max_bytes = dev->info.memory;
  if ((err = dspk__op_check_results(&j->op, &lim, inline_out, inline_in, r->msg,
                                    sizeof r->msg)) < 0)
    goto fail;
  j->dev = dev;
  dspkd_quota_move_mem(j);
  if ((err = dspkd_quota_check(j, r->msg, sizeof r->msg, &r->logged)) < 0)
    goto fail;
  r->chunk->refs++; /* inline inputs and kernel source point into the frame */
  j->chunk = r->chunk;
  dspkd_sched_submit(j);
  return 0;
fail:
  dspkd_job_free(d, j);
  return err;
}

static int m_task_cancel(struct req *r) {
  struct wreq *wr = dspkd_wreq_new(); /* first: an ENOMEM cancels nothing */
  struct dspk__pval v[1];
  if (!wr)
    return DSPK_ENOMEM;
  v[DSPK__R_CANCEL_CANCELED] =
      dspk__pv_bool(dspkd_sched_cancel(r->c, (uint32_t)r->v[DSPK__CANCEL_MSGID].v.u) != 0);
  dspk__pack_result_head(&wr->w.pk, r->msgid);
  dspk__result_encode(&wr->w, &dspk__methods[DSPK__M_TASK_CANCEL], v);
  dspkd_conn_send(r->c, wr);
  return 0;
}

/* ---- the table -------------------------------------------------------- */

/* The handler of each method of proto/schema.c's table. */
static int (*const handlers[DSPK__M_COUNT])(struct req *r) = {
    [DSPK__M_HELLO] = m_hello,
    [DSPK__M_PING] = m_ping,
    [DSPK__M_DEVICES] = m_devices,
    [DSPK__M_STATUS] = m_status,
    [DSPK__M_BUFFER_CREATE] = m_buffer_create,
    [DSPK__M_BUFFER_WRITE] = m_buffer_write,
    [DSPK__M_BUFFER_READ] = m_buffer_read,
    [DSPK__M_BUFFER_FREE] = m_buffer_free,
    [DSPK__M_BUFFER_IMPORT] = dspkd_m_buffer_import, /* daemon/shm.c */
    [DSPK__M_BUFFER_SHARE] = dspkd_m_buffer_share,
    [DSPK__M_TASK_RUN] = m_task_run,
    [DSPK__M_TASK_CANCEL] = m_task_cancel,
    [DSPK__M_DAEMON_RELOAD] = dspkd_m_daemon_reload, /* daemon/admin.c */
    [DSPK__M_DAEMON_STOP] = dspkd_m_daemon_stop,
    [DSPK__M_CACHE_STATS] = dspkd_m_cache_stats, /* daemon/cache_methods.c */
    [DSPK__M_CACHE_CLEAR] = dspkd_m_cache_clear,
    [DSPK__M_METRICS] = dspkd_m_metrics, /* daemon/metrics.c */
    [DSPK__M_TRACE] = dspkd_m_trace,     /* daemon/trace.c */
    [DSPK__M_JOB_REGISTER] = dspkd_m_job_register, /* daemon/jobs.c */
    [DSPK__M_JOB_END] = dspkd_m_job_end,
};

int dspkd_dispatch(struct req *r, const char *method, size_t len) {
  const struct dspk__method *m = dspk__method_find(method, len);
  int err;

  if (!m || !handlers[m - dspk__methods]) {
    char echo[DSPK__ECHO_CAP(64)];
    return fail(r, DSPK_ENOMETHOD, "unknown method \"%s\"",
                dspk__utf8_echo(echo, sizeof echo, method, len, 64));
  }
  /* Admin methods refuse a non-admin before looking at its arguments,
   * or once they are checked (enum dspk__admin). */
  if (m->admin == DSPK__ADMIN_FIRST && (err = dspkd_admin_check(r, m->name)) < 0)
    return err;
  if ((err = dspk__params_decode(m->params, m->nparams, r->args, NULL, r->v, r->msg,
                                 sizeof r->msg)) < 0) {
    /* The descriptor a buffer.import takes is closed at once whatever the
     * answer, this one too (no later buffer.import takes it instead). */
    if (m == &dspk__methods[DSPK__M_BUFFER_IMPORT])
      dspkd_shm_import_refused(r->c);
    return err;
  }
  if (m->admin == DSPK__ADMIN_AFTER_PARAMS && (err = dspkd_admin_check(r, m->name)) < 0)
    return err;
  return handlers[m - dspk__methods](r);
}

uint64_t dspkd_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
