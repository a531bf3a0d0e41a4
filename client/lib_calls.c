/*
 * libdspkclient's methods: ping, devices, status, the buffer calls and
 * task.run (synchronous and in flight), on top of the request/response
 * machinery of lib_conn.c.  Requests are packed from the protocol's table
 * (proto/schema.c) by its generic encoder straight into a dspk__wbuf whose
 * big bin payloads (tensor data, buffer writes) stay in the caller's
 * memory; results are decoded with proto's checked getters and copied into
 * memory the caller owns.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib_internal.h"
#include "proto/schema.h"
#include "proto/units.h"
#include "proto/utf8.h"

/* ---- small helpers ------------------------------------------------------ */

DSPK_EXPORT size_t dspk_dtype_size(dspk_dtype dt) {
  return dspk__dtype_size(dt);
}

DSPK_EXPORT const char *dspk_dtype_name(dspk_dtype dt) {
  return dspk__dtype_name(dt);
}

DSPK_EXPORT int dspk_dtype_from_name(const char *name, dspk_dtype *out) {
  dspk_dtype dt;
  if (!name || dspk__dtype_from_name(name, strlen(name), &dt) != 0)
    return DSPK_EDTYPE;
  if (out)
    *out = dt;
  return 0;
}

DSPK_EXPORT uint64_t dspk_tensor_numel(const dspk_tensor *t) {
  uint64_t n = 1;
  bool zero = false, over = false;
  if (!t)
    return 0;
  /* A negative axis makes the shape invalid whatever the other axes are
   * (a 0 axis included); a 0 axis wins over an overflowing product. */
  for (unsigned i = 0; i < t->rank && i < DSPK_MAX_RANK; i++) {
    if (t->shape[i] < 0)
      return UINT64_MAX;
    if (t->shape[i] == 0)
      zero = true;
    else if (!over)
      over = __builtin_mul_overflow(n, (uint64_t)t->shape[i], &n);
  }
  return zero ? 0 : over ? UINT64_MAX : n;
}

DSPK_EXPORT void dspk_tensor_inline(dspk_tensor *t, dspk_dtype dt,
                                    unsigned rank, const int64_t *shape,
                                    const void *data) {
  if (!t)
    return;
  memset(t, 0, sizeof(*t));
  t->dtype = dt;
  /* The rank as given, so that dspk_run/dspk_submit refuse a rank above
   * DSPK_MAX_RANK (ELIMIT) instead of running on a cut shape; NULL shape
   * leaves the axes 0. */
  t->rank = rank;
  for (unsigned i = 0; shape && i < rank && i < DSPK_MAX_RANK; i++)
    t->shape[i] = shape[i];
  t->data = data;
  uint64_t n = dspk_tensor_numel(t);
  size_t isz = dspk__dtype_size(dt);
  t->nbytes = isz && n > SIZE_MAX / isz ? SIZE_MAX : (size_t)n * isz;
}

DSPK_EXPORT void dspk_task_init(dspk_task *t, dspk_op op) {
  if (!t)
    return;
  memset(t, 0, sizeof(*t));
  t->op = op;
  t->gemm.alpha = 1.0;
  t->gemm.beta = 0.0;
  t->map.alpha = 1.0;
  for (int i = 0; i < 3; i++)
    t->kernel.grid[i] = t->kernel.block[i] = 1;
}

/* A request's parameters, packed by the table's encoder, and its result's
 * fields, decoded by the table's decoder (indexed by the DSPK__R_* enum). */
struct params {
  enum dspk__method_id m;
  struct dspk__pval v[DSPK__MAX_PARAMS];
  struct dspk__pval res[DSPK__MAX_PARAMS];
};

static void pack_params(void *ud, struct dspk__wbuf *w) {
  const struct params *a = ud;
  dspk__params_encode(w, dspk__methods[a->m].params, dspk__methods[a->m].nparams, a->v);
}

/* Calls a method of the table with the parameters of a. */
static int call(dspk_client *c, struct params *a, struct dspk__resp *r) {
  const struct dspk__method *m = &dspk__methods[a->m];
  char why[256];
  int rc = dspk__call(c, m->name, pack_params, a, r);
  if (rc != 0 || !m->results)
    return rc;
  if ((rc = dspk__result_decode(m, r->msg.result, a->res, why, sizeof why)) < 0) {
    dspk__resp_free(r);
    return dspk__cerr(c, rc, "%s", why);
  }
  return 0;
}

/* What a call gives its caller, made from the response's result (res: its
 * fields as the table's decoder found them, NULL for a method outside the
 * table): memory the caller owns, or NULL when out of memory. */
typedef void *make_fn(const msgpack_object *result, const struct dspk__pval *res);

/* Makes what the call gives from r with make, frees r, and puts it in *out. */
static int answer(dspk_client *c, struct dspk__resp *r, const struct dspk__pval *res,
                  make_fn *make, void **out) {
  void *p = make(r->msg.result, res);
  dspk__resp_free(r);
  if (!p)
    return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
  *out = p;
  return 0;
}

/* Calls a method of the table (call) and makes what it gives (answer). */
static int call_make(dspk_client *c, struct params *a, make_fn *make, void **out) {
  struct dspk__resp r;
  int rc = call(c, a, &r);
  return rc != 0 ? rc : answer(c, &r, a->res, make, out);
}

/* The result as JSON text (dspk_call_json, the admin calls). */
static void *make_json(const msgpack_object *result, const struct dspk__pval *res) {
  char *json;
  (void)res;
  return dspk__to_json(result, &json) == 0 ? json : NULL;
}

/* ---- ping, JSON calls, devices, status ----------------------------------- */

/* The bytes of a ping request of the largest request id around its payload,
 * less the payload's bin header: what dspk_ping_max leaves out of
 * max_message. */
static size_t ping_framing(void) {
  struct params a = {.m = DSPK__M_PING,
                     .v = {[DSPK__PING_DATA] = dspk__pv_bin("", 0, NULL, NULL)}};
  struct dspk__wbuf w;
  size_t len;
  dspk__wbuf_init(&w);
  dspk__pack_request_head(&w.pk, UINT32_MAX, dspk__methods[a.m].name, true);
  pack_params(&a, &w);
  len = dspk__wbuf_len(&w);
  dspk__wbuf_free(&w);
  return len - 2; /* an empty bin's header is bin8's, 2 bytes */
}

DSPK_EXPORT size_t dspk_ping_max(const dspk_client *c) {
  /* msgpack's bin header by the payload's size: bin8, bin16, bin32. */
  static const struct { size_t hdr, lo, hi; } bins[] = {
      {2, 0, 0xff}, {3, 0x100, 0xffff}, {5, 0x10000, SIZE_MAX}};
  size_t base, best = 0;
  if (!c)
    return 0;
  base = ping_framing();
  for (size_t i = 0; i < sizeof bins / sizeof bins[0]; i++) {
    if (c->send_max < base + bins[i].hdr)
      continue;
    size_t p = c->send_max - base - bins[i].hdr;
    if (p > bins[i].hi)
      p = bins[i].hi;
    if (p >= bins[i].lo && p > best)
      best = p;
  }
  return best;
}

DSPK_EXPORT int dspk_ping(dspk_client *c, const void *data, size_t n) {
  struct params a = {.m = DSPK__M_PING,
                     .v = {[DSPK__PING_DATA] = dspk__pv_bin(data, n, NULL, NULL)}};
  struct dspk__resp r;
  const void *echo;
  size_t elen;
  int rc;

  if (!c || (n && !data))
    return dspk__argerr(c, "dspk_ping: data is NULL and n is %zu", n);
  rc = call(c, &a, &r);
  if (rc == DSPK_ELIMIT && n > dspk_ping_max(c))
    return dspk__cerr(c, rc, "dspk_ping: a payload of %zu byte%s with its request's framing "
                      "exceeds the daemon's %zu-byte message limit (max_message); "
                      "dspk_ping_max() bytes (%zu) or less always fit",
                      n, dspk__s(n), c->send_max, dspk_ping_max(c));
  if (rc != 0)
    return rc;
  echo = a.res[DSPK__R_PING_DATA].v.s.p;
  elen = a.res[DSPK__R_PING_DATA].v.s.n;
  if (elen != n || (n && memcmp(echo, data, n) != 0))
    rc = dspk__cerr(c, DSPK_EPROTO, "ping: the echo differs from the data");
  dspk__resp_free(&r);
  return rc;
}

DSPK_EXPORT int dspk_call_json(dspk_client *c, const char *method,
                               char **json_out) {
  struct dspk__resp r;
  void *json = NULL;
  int rc;

  if (!c || !method || !json_out)
    return dspk__argerr(c, "dspk_call_json: %s is NULL", !method ? "method" : "json_out");
  rc = dspk__call(c, method, NULL, NULL, &r);
  if (rc == 0 && (rc = answer(c, &r, NULL, make_json, &json)) == 0)
    *json_out = json;
  return rc;
}

/* ---- Slurm jobs (admin) ---------------------------------------------------- */

struct job_uuids {
  const char *const *uuids;
  size_t n;
};

static void pack_uuids(const void *ud, struct dspk__wbuf *w) {
  const struct job_uuids *a = ud;
  msgpack_pack_array(&w->pk, a->n);
  for (size_t i = 0; i < a->n; i++)
    dspk__pack_str(&w->pk, a->uuids[i]);
}

static int job_call(dspk_client *c, struct params *a, const struct job_uuids *u,
                    char **json_out) {
  void *json = NULL;
  int rc;

  if (!c || !json_out)
    return dspk__argerr(c, "%s: json_out is NULL",
                        a->m == DSPK__M_JOB_END ? "dspk_job_end" : "dspk_job_register");
  if (u && u->n && !u->uuids)
    return dspk__argerr(c, "dspk_job_register: uuids is NULL and n is %zu", u->n);
  /* The daemon's limit (job.register's devices, proto/schema.c), stated
   * before a UUID is read. */
  if (u && u->n > DSPK__JOB_MAX_UUIDS)
    return dspk__cerr(c, DSPK_ELIMIT, "dspk_job_register: n %zu is more than %d UUIDs, the "
                      "most a job registers", u->n, DSPK__JOB_MAX_UUIDS);
  for (size_t i = 0; u && i < u->n; i++)
    if (!u->uuids[i])
      return dspk__argerr(c, "dspk_job_register: uuids[%zu] is NULL", i);
  if ((rc = call_make(c, a, make_json, &json)) == 0)
    *json_out = json;
  return rc;
}

DSPK_EXPORT int dspk_job_register(dspk_client *c, uint64_t job, uint32_t uid,
                                  const char *const *uuids, size_t n, char **json_out) {
  struct job_uuids u = {uuids, n};
  struct params a = {.m = DSPK__M_JOB_REGISTER, .v =
                     {[DSPK__JREG_JOB] = dspk__pv_uint(job), [DSPK__JREG_UID] = dspk__pv_uint(uid),
                      [DSPK__JREG_DEVICES] = dspk__pv_pack(pack_uuids, &u)}};
  if (!job)
    return dspk__argerr(c, "dspk_job_register: job 0 (job ids start at 1)");
  return job_call(c, &a, &u, json_out);
}

DSPK_EXPORT int dspk_job_end(dspk_client *c, uint64_t job, char **json_out) {
  struct params a = {.m = DSPK__M_JOB_END, .v = {[DSPK__JEND_JOB] = dspk__pv_uint(job)}};
  if (!job)
    return dspk__argerr(c, "dspk_job_end: job 0 (job ids start at 1)");
  return job_call(c, &a, NULL, json_out);
}

void dspk__fields(const struct dspk__param *f, int n, const msgpack_object *map,
                  struct dspk__pval *out) {
  char why[8];
  memset(out, 0, (size_t)n * sizeof *out);
  /* Checked with the whole result by dspk__result_decode: cannot fail. */
  (void)dspk__params_decode(f, n, map, NULL, out, why, sizeof why);
}

void dspk__strncpy_pval(const struct dspk__pval *v, char *buf, size_t buflen) {
  size_t n = 0;
  if (!buflen)
    return;
  if (v->set && !v->nil) {
    n = dspk__utf8_cut(v->v.s.p, v->v.s.n, buflen - 1);
    if (n)
      memcpy(buf, v->v.s.p, n);
  }
  buf[n] = '\0';
}

/* The mark that ends a client name cut to fit dspk_status_client.name (dspk.h):
 * a backslash the daemon's escaped form never holds alone (it writes a
 * name's backslash as \\ and escapes as \0, \uNNNN, \UNNNNNNNN). */
#define NAME_CUT_MARK "\\..."

/* Copies the daemon's escaped form of a client name (protocol.md,
 * "Errors": \\, \0, \uNNNN, \UNNNNNNNN, other characters as they are) into
 * buf; when it does not fit in buflen - 1 bytes, its longest prefix of
 * whole escapes and whole characters that leaves room for NAME_CUT_MARK,
 * then the mark: never the start of an escape or a character, never a
 * cut name that reads as another whole one. */
static void copy_escaped_name(const struct dspk__pval *v, char *buf, size_t buflen) {
  const char *s = v->set && !v->nil ? v->v.s.p : "";
  size_t n = v->set && !v->nil ? v->v.s.n : 0, i = 0, room = buflen - sizeof NAME_CUT_MARK;
  if (n < buflen) {
    dspk__strncpy_pval(v, buf, buflen);
    return;
  }
  while (i < n) {
    size_t k = 1;
    if (s[i] == '\\' && i + 1 < n)
      k = s[i + 1] == 'u' ? 6 : s[i + 1] == 'U' ? 10 : 2;
    else if (s[i] != '\\')
      k = dspk__utf8_seq(s + i, n - i) ? dspk__utf8_seq(s + i, n - i) : 1;
    if (i + k > room)
      break;
    i += k;
  }
  memcpy(buf, s, i);
  memcpy(buf + i, NAME_CUT_MARK, sizeof NAME_CUT_MARK);
}

static uint32_t arr_size(const msgpack_object *o) {
  return o && o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size : 0;
}

/* dspk_devices' list, from the result of devices. */
static void *make_devices(const msgpack_object *result, const struct dspk__pval *res) {
  const msgpack_object *devs = res[DSPK__R_DEVICES_DEVICES].v.o;
  const msgpack_object *unav = res[DSPK__R_DEVICES_UNAVAILABLE].v.o;
  dspk_device_list *l = calloc(1, sizeof(*l));

  if (!l)
    return NULL;
  l->ndevices = arr_size(devs);
  l->nunavailable = arr_size(unav);
  l->devices = calloc(l->ndevices + 1, sizeof(*l->devices));
  l->unavailable = calloc(l->nunavailable + 1, sizeof(*l->unavailable));
  if (!l->devices || !l->unavailable || dspk__to_json(result, &l->json) != 0) {
    dspk_device_list_free(l);
    return NULL;
  }
  for (size_t i = 0; i < l->ndevices; i++) {
    struct dspk__pval f[DSPK__DEV_COUNT];
    dspk_device *o = &l->devices[i];
    dspk__fields(dspk__device_f, DSPK__DEV_COUNT, &devs->via.array.ptr[i], f);
    dspk__strncpy_pval(&f[DSPK__DEV_ID], o->id, sizeof o->id);
    dspk__strncpy_pval(&f[DSPK__DEV_BACKEND], o->backend, sizeof o->backend);
    dspk__strncpy_pval(&f[DSPK__DEV_NAME], o->name, sizeof o->name);
    dspk__strncpy_pval(&f[DSPK__DEV_TYPE], o->type, sizeof o->type);
    dspk__strncpy_pval(&f[DSPK__DEV_ARCH], o->arch, sizeof o->arch);
    dspk__strncpy_pval(&f[DSPK__DEV_DRIVER], o->driver, sizeof o->driver);
    dspk__strncpy_pval(&f[DSPK__DEV_UUID], o->uuid, sizeof o->uuid);
    o->memory = f[DSPK__DEV_MEMORY].v.u;
    o->software = f[DSPK__DEV_SOFTWARE].v.b;
  }
  for (size_t i = 0; i < l->nunavailable; i++) {
    struct dspk__pval f[DSPK__UNAV_COUNT];
    dspk__fields(dspk__unavail_f, DSPK__UNAV_COUNT, &unav->via.array.ptr[i], f);
    dspk__strncpy_pval(&f[DSPK__UNAV_BACKEND], l->unavailable[i].backend,
                       sizeof l->unavailable[i].backend);
    dspk__strncpy_pval(&f[DSPK__UNAV_REASON], l->unavailable[i].reason,
                       sizeof l->unavailable[i].reason);
  }
  return l;
}

DSPK_EXPORT int dspk_devices(dspk_client *c, bool all,
                             dspk_device_list **out) {
  struct params a = {.m = DSPK__M_DEVICES, .v = {[DSPK__DEVICES_ALL] = dspk__pv_bool(all)}};
  void *l = NULL;
  int rc;

  if (!c || !out)
    return dspk__argerr(c, "dspk_devices: out is NULL");
  if ((rc = call_make(c, &a, make_devices, &l)) == 0)
    *out = l;
  return rc;
}

DSPK_EXPORT void dspk_device_list_free(dspk_device_list *l) {
  if (!l)
    return;
  free(l->devices);
  free(l->unavailable);
  free(l->json);
  free(l);
}

/* dspk_status_get's status, from the result of status. */
static void *make_status(const msgpack_object *result, const struct dspk__pval *res) {
  const msgpack_object *cl = res[DSPK__R_STATUS_CLIENTS].v.o;
  const msgpack_object *dv = res[DSPK__R_STATUS_DEVICES].v.o;
  const msgpack_object *jb = res[DSPK__R_STATUS_JOBS].v.o;
  struct dspk__pval f[DSPK__MAX_FIELDS];
  dspk_status *s = calloc(1, sizeof(*s));

  if (!s)
    return NULL;
  s->nclients = arr_size(cl);
  s->ndevices = arr_size(dv);
  s->njobs = arr_size(jb);
  s->self = -1;
  s->clients = calloc(s->nclients + 1, sizeof(*s->clients));
  s->client_job = calloc(s->nclients + 1, sizeof(*s->client_job));
  s->devices = calloc(s->ndevices + 1, sizeof(*s->devices));
  s->activity = calloc(s->ndevices + 1, sizeof(*s->activity));
  s->jobs = calloc(s->njobs + 1, sizeof(*s->jobs));
  if (!s->clients || !s->client_job || !s->devices || !s->activity || !s->jobs ||
      dspk__to_json(result, &s->json) != 0) {
    dspk_status_free(s);
    return NULL;
  }
  dspk__fields(dspk__st_daemon_f, DSPK__SD_COUNT, res[DSPK__R_STATUS_DAEMON].v.o, f);
  dspk__strncpy_pval(&f[DSPK__SD_VERSION], s->version, sizeof s->version);
  s->pid = f[DSPK__SD_PID].v.i;
  s->uptime_s = (double)f[DSPK__SD_UPTIME_S].v.u;
  dspk__strncpy_pval(&f[DSPK__SD_SOCKET], s->socket, sizeof s->socket);
  s->connections = f[DSPK__SD_CONNECTIONS].v.u;
  for (size_t i = 0; i < s->nclients; i++) {
    dspk_status_client *x = &s->clients[i];
    dspk__fields(dspk__st_client_f, DSPK__SC_COUNT, &cl->via.array.ptr[i], f);
    x->id = f[DSPK__SC_ID].v.u;
    x->pid = f[DSPK__SC_PID].v.i;
    x->uid = f[DSPK__SC_UID].v.i;
    x->gid = f[DSPK__SC_GID].v.i;
    copy_escaped_name(&f[DSPK__SC_NAME], x->name, sizeof x->name);
    x->inflight = f[DSPK__SC_INFLIGHT].v.u;
    x->buffers = f[DSPK__SC_BUFFERS].v.u;
    s->client_job[i] = f[DSPK__SC_JOB].set && !f[DSPK__SC_JOB].nil ? f[DSPK__SC_JOB].v.u : 0;
    if (f[DSPK__SC_SELF].v.b && s->self < 0)
      s->self = (int64_t)i;
  }
  for (size_t i = 0; i < s->njobs; i++) {
    dspk_status_job *x = &s->jobs[i];
    dspk__fields(dspk__st_job_f, DSPK__SJ_COUNT, &jb->via.array.ptr[i], f);
    x->job = f[DSPK__SJ_JOB].v.u;
    x->uid = f[DSPK__SJ_UID].v.i;
    x->ngpus = f[DSPK__SJ_DEVICES].v.o ? arr_size(f[DSPK__SJ_DEVICES].v.o) : 0;
    x->connections = f[DSPK__SJ_CONNECTIONS].v.u;
    x->inflight = f[DSPK__SJ_INFLIGHT].v.u;
    x->buffers = f[DSPK__SJ_BUFFERS].v.u;
    x->buffer_bytes = f[DSPK__SJ_BUFFER_BYTES].v.u;
    x->ended = f[DSPK__SJ_ENDED].v.b;
  }
  for (size_t i = 0; i < s->ndevices; i++) {
    dspk_status_device *x = &s->devices[i];
    dspk__fields(dspk__st_device_f, DSPK__SV_COUNT, &dv->via.array.ptr[i], f);
    dspk__strncpy_pval(&f[DSPK__SV_ID], x->id, sizeof x->id);
    x->queued = f[DSPK__SV_QUEUED].v.u;
    x->running = f[DSPK__SV_RUNNING].v.u;
    x->completed = f[DSPK__SV_COMPLETED].v.u;
    x->failed = f[DSPK__SV_FAILED].v.u;
    dspk__status_activity(f, &s->activity[i]);
  }
  return s;
}

DSPK_EXPORT int dspk_status_get(dspk_client *c, dspk_status **out) {
  struct params a = {.m = DSPK__M_STATUS};
  void *s = NULL;
  int rc;

  if (!c || !out)
    return dspk__argerr(c, "dspk_status_get: out is NULL");
  if ((rc = call_make(c, &a, make_status, &s)) == 0)
    *out = s;
  return rc;
}

DSPK_EXPORT void dspk_status_free(dspk_status *s) {
  if (!s)
    return;
  free(s->clients);
  free(s->client_job);
  free(s->devices);
  free(s->activity);
  free(s->jobs);
  free(s->json);
  free(s);
}

/* ---- buffers ------------------------------------------------------------ */

DSPK_EXPORT int dspk_buffer_create(dspk_client *c, const char *device,
                                   size_t size, uint64_t *id_out) {
  struct params a = {.m = DSPK__M_BUFFER_CREATE, .v =
                     {[DSPK__BCREATE_DEVICE] = dspk__pv_str(device ? device : "cpu:0"),
                      [DSPK__BCREATE_SIZE] = dspk__pv_uint(size)}};
  struct dspk__resp r;
  uint64_t id;
  int rc;

  if (!c || !id_out)
    return dspk__argerr(c, "dspk_buffer_create: id_out is NULL");
  rc = call(c, &a, &r);
  /* Refused for a limit that idle shared temporaries count toward (max_buffers,
   * the memory quotas): they go, and the buffer is asked for once more. */
  if ((rc == DSPK_ELIMIT || rc == DSPK_ENOMEM) && dspk__shm_drop_idle(c))
    rc = call(c, &a, &r);
  if (rc != 0)
    return rc;
  id = a.res[DSPK__R_BUF_BUFFER].v.u;
  /* Its device, for tasks on "any" that refer to it (not known: such a
   * task's operands then go inline, never to a temporary elsewhere). */
  if (c->nbufdev == c->capbufdev) {
    size_t cap = c->capbufdev ? 2 * c->capbufdev : 16;
    struct dspk__bufdev *p = realloc(c->bufdev, cap * sizeof(*p));
    if (p) {
      c->bufdev = p;
      c->capbufdev = cap;
    }
  }
  if (c->nbufdev < c->capbufdev) {
    struct dspk__bufdev *e = &c->bufdev[c->nbufdev++];
    e->id = id;
    dspk__pval_str(&a.res[DSPK__R_BUF_DEVICE], e->device, sizeof e->device);
  }
  dspk__resp_free(&r);
  *id_out = id;
  return 0;
}

/* The device of buffer id, when this client knows it (a buffer it created,
 * a shared allocation or temporary of its own), else NULL. */
static const char *buffer_device(const dspk_client *c, uint64_t id) {
  for (size_t i = 0; i < c->nbufdev; i++)
    if (c->bufdev[i].id == id)
      return c->bufdev[i].device;
  for (size_t i = 0; i < c->nshm; i++)
    if (c->shm[i].id == id && !c->shm[i].freed)
      return c->shm[i].device;
  return NULL;
}

/* Bytes of a buffer.write request besides its data, at most: the envelope
 * [0, msgid, "buffer.write", [{"buffer": id, "offset": off, "data": bin}]]
 * takes 1 + 1 + 5 (uint32 msgid) + 13 + 1 for the array heads, method and
 * params, 1 + 7 + 9 + 7 + 9 + 5 for the map with its keys and 64-bit
 * values, and 5 for the longest bin header: 64.  A buffer.read answer
 * carries at most max_message - 64 data bytes (protocol.md, Limits). */
#define WRITE_FRAMING 64
#define READ_FRAMING 64

/* Large transfers go in pieces of at most PIECE bytes with up to WINDOW
 * requests in flight: the daemon copies one piece into the buffer (or out
 * of it) while the next crosses the socket, and its read buffers stay
 * small enough to be reused rather than mapped afresh for each transfer. */
#define PIECE ((size_t)4 << 20)
#define WINDOW 8

/* Largest payload of one buffer.write request (rd false) or buffer.read
 * answer (rd): PIECE, and what the daemon's max_message leaves beside the
 * framing; 0 when it leaves nothing (a max_message of 64 bytes or less). */
static size_t piece_max(const dspk_client *c, bool rd) {
  size_t framing = rd ? READ_FRAMING : WRITE_FRAMING;
  size_t m = c->send_max > framing ? c->send_max - framing : 0;
  return m < PIECE ? m : PIECE;
}

/* Waits for the oldest of the pieces in flight (ids[*head..*tail)); a read
 * (rd) lands in its place in dst.  Keeps the first error in *first, and in
 * *bad_off / *bad_len the range of the piece that had it. */
static void piece_wait(dspk_client *c, bool rd, const uint32_t *ids, char *const *dsts,
                       const size_t *lens, const uint64_t *offs, size_t *head, int *first,
                       char *err, uint64_t *bad_off, size_t *bad_len) {
  size_t i = *head % WINDOW;
  int rc;
  if (rd && lens[i]) {
    rc = dspk__wait_into(c, ids[i], dsts[i], lens[i]);
  } else {
    struct dspk__resp r;
    rc = dspk__wait(c, ids[i], &r);
    if (rc == 0)
      dspk__resp_free(&r);
  }
  if (rc != 0 && *first == 0) {
    *first = rc;
    memcpy(err, c->err, sizeof c->err);
    *bad_off = offs[i];
    *bad_len = lens[i];
  }
  (*head)++;
}

/* Writes src (rd false) or reads n bytes at offset into dst (rd; dst may be
 * NULL for 0 bytes, still a buffer.read) in pieces (see PIECE). */
static int transfer(dspk_client *c, bool rd, uint64_t id, uint64_t offset, const void *src,
                    void *dst, size_t n) {
  uint32_t ids[WINDOW];
  char *dsts[WINDOW];
  uint64_t offs[WINDOW], bad_off = offset;
  size_t lens[WINDOW], head = 0, tail = 0, done = 0, bad_len = n;
  char err[sizeof c->err];
  int first = 0;
  size_t piece = piece_max(c, rd);
  const char *what = rd ? "read" : "write";

  /* A range that runs past the last byte offset a buffer can have is
   * nobody's: refused before any piece goes (its pieces' offsets would
   * wrap to the start of the buffer). */
  if (n && n - 1 > UINT64_MAX - offset)
    return dspk__cerr(c, DSPK_ERANGE, "dspk_buffer_%s: %zu bytes at offset %" PRIu64
                      " run past the largest byte offset (2^64 - 1); nothing was %s", what,
                      n, offset, rd ? "read" : "written");

  /* No piece could carry a byte: refused before anything is sent (a
   * 0-byte transfer is one request, which dspk__send checks as any). */
  if (n && !piece)
    return dspk__cerr(c, DSPK_ELIMIT, "dspk_buffer_%s: the daemon's max_message (%zu "
                      "bytes) leaves no room for data in a buffer.%s %s (more than %d "
                      "bytes needed)", rd ? "read" : "write", c->send_max,
                      rd ? "read" : "write", rd ? "answer" : "request",
                      rd ? READ_FRAMING : WRITE_FRAMING);
  do {
    size_t k = n - done < piece ? n - done : piece;
    struct params a = {.m = rd ? DSPK__M_BUFFER_READ : DSPK__M_BUFFER_WRITE};
    uint32_t msgid;
    int rc;
    if (rd) {
      a.v[DSPK__BREAD_BUFFER] = dspk__pv_uint(id);
      a.v[DSPK__BREAD_OFFSET] = dspk__pv_uint(offset + done);
      a.v[DSPK__BREAD_SIZE] = dspk__pv_uint(k);
    } else {
      a.v[DSPK__BWRITE_BUFFER] = dspk__pv_uint(id);
      a.v[DSPK__BWRITE_OFFSET] = dspk__pv_uint(offset + done);
      a.v[DSPK__BWRITE_DATA] = dspk__pv_bin((const char *)src + done, k, NULL, NULL);
    }
    if (tail - head == WINDOW)
      piece_wait(c, rd, ids, dsts, lens, offs, &head, &first, err, &bad_off, &bad_len);
    if (first != 0)
      break;
    rc = dspk__send_call(c, dspk__methods[a.m].name, pack_params, &a, &msgid);
    if (rc != 0) {
      first = rc;
      memcpy(err, c->err, sizeof c->err);
      bad_off = offset + done;
      bad_len = k;
      break;
    }
    ids[tail % WINDOW] = msgid;
    offs[tail % WINDOW] = offset + done;
    dsts[tail % WINDOW] = rd && k ? (char *)dst + done : NULL;
    lens[tail % WINDOW] = k;
    tail++;
    done += k;
  } while (done < n);
  /* Every answer is taken, also after an error: the stream stays in step. */
  while (head < tail)
    piece_wait(c, rd, ids, dsts, lens, offs, &head, &first, err, &bad_off, &bad_len);
  if (first == 0)
    return 0;
  /* The caller asked for one range: a piece's error names it, and the
   * piece within it. */
  if (n > piece) {
    int k = snprintf(c->err, sizeof c->err, "dspk_buffer_%s of %zu bytes at offset %" PRIu64
                     ": the piece of %zu byte%s at offset %" PRIu64 ": ", what, n, offset,
                     bad_len, dspk__s(bad_len), bad_off);
    if (k > 0 && (size_t)k < sizeof c->err) { /* the piece's error after it, as it fits */
      size_t m = strnlen(err, sizeof c->err - (size_t)k - 1);
      memcpy(c->err + k, err, m);
      c->err[(size_t)k + m] = '\0';
    }
  } else {
    memcpy(c->err, err, sizeof c->err);
  }
  return first;
}

DSPK_EXPORT int dspk_buffer_write(dspk_client *c, uint64_t id,
                                  uint64_t offset, const void *data,
                                  size_t n) {
  char *local;

  if (!c || (n && !data))
    return dspk__argerr(c, "dspk_buffer_write: data is NULL and n is %zu", n);
  if (dspk__forked(c)) /* its shared memory is the parent's too */
    return DSPK_ECLOSED;
  /* A shared buffer of ours with nothing in flight: its bytes are here
   * (not for bytes of a file range, dspk_file_data: those go with sendfile,
   * never read through the caller's mapping of the file). */
  if (!(n && dspk__file_range(c, data, n)) &&
      (local = dspk__shm_local(c, id, offset, n)) != NULL) {
    if (n) /* data may be NULL for 0 bytes; it may lie in the mapping itself */
      memmove(local, data, n);
    return 0;
  }
  /* From the buffer's own pages, in more than one piece: the daemon may
   * have written a piece into bytes that a later one is still to be sent
   * from; a copy taken now gives the bytes as they were at the call, as
   * the local memmove and a one-piece request do. */
  if (n > piece_max(c, false) && dspk__shm_overlaps(c, id, data, n)) {
    void *tmp = malloc(n);
    int rc;
    if (!tmp)
      return dspk__cerr(c, DSPK_ENOMEM, "dspk_buffer_write: out of memory for a copy of "
                        "%zu bytes that lie in the shared buffer written", n);
    memcpy(tmp, data, n);
    rc = transfer(c, false, id, offset, tmp, NULL, n);
    free(tmp);
    return rc;
  }
  return transfer(c, false, id, offset, data, NULL, n);
}

DSPK_EXPORT int dspk_buffer_read(dspk_client *c, uint64_t id, uint64_t offset,
                                 void *dst, size_t n) {
  char *local;

  if (!c || (n && !dst))
    return dspk__argerr(c, "dspk_buffer_read: dst is NULL and n is %zu", n);
  if (dspk__forked(c))
    return DSPK_ECLOSED;
  if ((local = dspk__shm_local(c, id, offset, n)) != NULL) {
    if (n) /* dst may be NULL for 0 bytes; it may lie in the mapping itself */
      memmove(dst, local, n);
    return 0;
  }
  /* Into the buffer's own pages, in more than one piece: a piece received
   * there could change bytes that a later piece is still to read; through a
   * copy, dst gets the bytes as the daemon read them. */
  if (n > piece_max(c, true) && dspk__shm_overlaps(c, id, dst, n)) {
    void *tmp = malloc(n);
    int rc;
    if (!tmp)
      return dspk__cerr(c, DSPK_ENOMEM, "dspk_buffer_read: out of memory for a copy of "
                        "%zu bytes that lie in the shared buffer read", n);
    rc = transfer(c, true, id, offset, NULL, tmp, n);
    if (rc == 0)
      memcpy(dst, tmp, n);
    free(tmp);
    return rc;
  }
  return transfer(c, true, id, offset, NULL, dst, n);
}

DSPK_EXPORT int dspk_buffer_free(dspk_client *c, uint64_t id) {
  struct params a = {.m = DSPK__M_BUFFER_FREE, .v = {[DSPK__BFREE_BUFFER] = dspk__pv_uint(id)}};
  struct dspk__resp r;
  uint32_t msgid;
  int rc;

  if (!c)
    return DSPK_EINVAL;
  rc = dspk__send_call(c, dspk__methods[a.m].name, pack_params, &a, &msgid);
  if (rc != 0)
    return rc; /* not sent: the buffer is still there */
  rc = dspk__wait(c, msgid, &r);
  if (rc == DSPK_ETIMEDOUT) /* given up on: the daemon frees it all the same */
    dspk__abandon(c, msgid, false);
  if (rc == 0)
    dspk__resp_free(&r);
  /* Gone (or going, or never there): a shared allocation or temporary with
   * this id is no longer one the daemon has (lib_shm.c). */
  if (rc == 0 || rc == DSPK_ETIMEDOUT || rc == DSPK_ENOBUF) {
    dspk__shm_freed(c, id);
    for (size_t i = 0; i < c->nbufdev; i++)
      if (c->bufdev[i].id == id) {
        c->bufdev[i] = c->bufdev[--c->nbufdev];
        break;
      }
  }
  return rc;
}

/* ---- tasks -------------------------------------------------------------- */

/* Checks what the library must trust before reading caller memory. */
static int check_task(dspk_client *c, const dspk_task *t) {
  if ((unsigned)t->op >= DSPK_OP_COUNT)
    return dspk__cerr(c, DSPK_EINVAL, "unknown op %d", (int)t->op);
  if (t->ninputs && !t->inputs)
    return dspk__cerr(c, DSPK_EINVAL, "inputs is NULL");
  /* The daemon's limit (DSPK__OP_MAX_IN), in its words, before any operand
   * is read or copied into shared memory (and never past inputs[3]). */
  if (t->ninputs > DSPK_MAX_OUTPUTS)
    return dspk__cerr(c, DSPK_EINVAL, "inputs: expected a non-empty array of at most %d "
                      "tensors, got an array of %u items", DSPK_MAX_OUTPUTS, t->ninputs);
  /* The daemon's bound on outputs (its row in proto/schema.c: every op has
   * one result), in its words, so that any count too many reads alike
   * whoever finds it (probe 18 A2; it said "more than 4 output buffers"
   * past 4 and sent 2 to 4 for the daemon to refuse). */
  {
    const struct dspk__param *o = &dspk__methods[DSPK__M_TASK_RUN].params[DSPK__RUN_OUTPUTS];
    if (t->nout_refs > o->max)
      return dspk__cerr(c, DSPK_EINVAL, "outputs: expected %s, got an array of %u items",
                        o->expect, t->nout_refs);
  }
  for (unsigned i = 0; i < t->ninputs; i++) {
    const dspk_tensor *x = &t->inputs[i];
    size_t isz = dspk__dtype_size(x->dtype);
    if (!isz)
      return dspk__cerr(c, DSPK_EDTYPE, "input %u: invalid dtype", i);
    if (x->rank > DSPK_MAX_RANK)
      return dspk__cerr(c, DSPK_ELIMIT, "input %u: rank %u exceeds %d", i,
                        x->rank, DSPK_MAX_RANK);
    for (unsigned k = 0; k < x->rank; k++)
      if (x->shape[k] < 0)
        return dspk__cerr(c, DSPK_EINVAL, "input %u: negative shape[%u]", i,
                          k);
    /* The daemon's rule (protocol.md, Tensors), checked here first so that
     * no size below is computed with wrapping arithmetic: the product of
     * the dimensions, each 0 counted as 1, times the item size, at most
     * 2^63-1 bytes. */
    uint64_t extent = isz;
    bool over = false, empty = false;
    for (unsigned k = 0; k < x->rank; k++) {
      if (!x->shape[k])
        empty = true;
      else if (!over && (__builtin_mul_overflow(extent, (uint64_t)x->shape[k], &extent) ||
                         extent > (uint64_t)INT64_MAX))
        over = true;
    }
    if (over) {
      /* The whole shape, in the daemon's words (proto/codec.c): the product
       * is the fault, not one dimension (probe 20 A1).  8 dimensions of 19
       * digits fit the 200 bytes. */
      char sh[200];
      size_t n = 0;
      for (unsigned k = 0; k < x->rank && n < sizeof sh; k++)
        n += (size_t)snprintf(sh + n, sizeof sh - n, "%s%lld", k ? ", " : "",
                              (long long)x->shape[k]);
      return dspk__cerr(c, DSPK_ELIMIT, "input %u: tensor shape [%s]: product of dimensions "
                        "(0 as 1) times item size %zu passes 2^63-1 bytes%s", i, sh, isz,
                        empty ? ", the limit even with no elements" : "");
    }
    if (!x->is_ref && x->nbytes != dspk_tensor_numel(x) * isz) /* cannot wrap now */
      return dspk__cerr(c, DSPK_EINVAL,
                        "input %u: nbytes %zu, but its shape needs %llu", i,
                        x->nbytes,
                        (unsigned long long)(dspk_tensor_numel(x) * isz));
    if (!x->is_ref && x->nbytes && !x->data)
      return dspk__cerr(c, DSPK_EINVAL, "input %u: data is NULL", i);
  }
  if (t->op == DSPK_OP_REDUCE && (unsigned)t->reduce.fn >= DSPK_REDUCE_COUNT)
    return dspk__cerr(c, DSPK_EINVAL, "reduce.fn: unknown value %d", (int)t->reduce.fn);
  if (t->op == DSPK_OP_REDUCE && t->reduce.naxes > DSPK_MAX_RANK)
    return dspk__cerr(c, DSPK_EINVAL, "reduce.naxes: %u is more than %d", t->reduce.naxes,
                      DSPK_MAX_RANK);
  if (t->op == DSPK_OP_MAP && (unsigned)t->map.fn >= DSPK_MAPFN_COUNT)
    return dspk__cerr(c, DSPK_EINVAL, "map.fn: unknown value %d", (int)t->map.fn);
  if (t->op == DSPK_OP_CONTRACT && !t->contract.subscripts)
    return dspk__cerr(c, DSPK_EINVAL, "contract: subscripts is NULL");
  if (t->op == DSPK_OP_CONTRACT) {
    /* A byte that starts no UTF-8 character would be packed as U+FFFD, and
     * the daemon would name that character, one the caller never wrote:
     * named here as the daemon names it when it gets the byte
     * (protocol.md, "Errors": "byte 0xff"; dspk__utf8_char_name), in the
     * daemon's message, the subscripts echoed as the daemon echoes them
     * (dspk__utf8_echo: the byte as \xff).  No such byte is a label; a
     * string past the daemon's length is left to its "longer than"
     * message. */
    const char *ss = t->contract.subscripts;
    size_t sn = strlen(ss), i = 0, k;
    if (sn < DSPK__SUBSCRIPTS_MAX && !dspk__utf8_valid(ss, sn)) {
      char se[DSPK__ECHO_CAP(DSPK__SUBSCRIPTS_MAX)], cn[32];
      while ((k = dspk__utf8_seq(ss + i, sn - i)) != 0)
        i += k;
      dspk__utf8_echo(se, sizeof se, ss, sn, sn);
      return dspk__cerr(c, DSPK_EINVAL, "contract: \"%s\": %s is not a letter (labels are "
                        "a-z, A-Z)", se, dspk__utf8_char_name(cn, sizeof cn, ss + i, sn - i));
    }
  }
  /* Each field on its own (entry NULL is protocol.md's default, "main"). */
  if (t->op == DSPK_OP_KERNEL && !t->kernel.lang)
    return dspk__cerr(c, DSPK_EINVAL, "kernel.lang is NULL (one of cuda, glsl, spirv, hip)");
  if (t->op == DSPK_OP_KERNEL &&
      dspk__choice_find(dspk__kernel_langs, t->kernel.lang, strlen(t->kernel.lang)) < 0) {
    /* Echoed as the daemon echoes an unknown value (protocol.md "Errors":
     * its first 32 bytes, a newline as \n, an ESC as \x1b, U+200B as
     * \u200b): one line, no terminal sequence, and the six characters
     * \u200b told apart from U+200B (probe 21 D-2: it was copied raw). */
    char le[DSPK__ECHO_CAP(32)];
    return dspk__cerr(c, DSPK_EINVAL, "kernel.lang: unknown language \"%s\" (one of cuda, "
                      "glsl, spirv, hip)",
                      dspk__utf8_echo(le, sizeof le, t->kernel.lang, strlen(t->kernel.lang), 32));
  }
  if (t->op == DSPK_OP_KERNEL && t->kernel.source_len && !t->kernel.source)
    return dspk__cerr(c, DSPK_EINVAL, "kernel.source is NULL and kernel.source_len is %zu",
                      t->kernel.source_len);
  if (t->op == DSPK_OP_KERNEL && t->kernel.nargs > DSPK_KERNEL_MAX_ARGS)
    return dspk__cerr(c, DSPK_EINVAL, "kernel.nargs: %u is more than %d", t->kernel.nargs,
                      DSPK_KERNEL_MAX_ARGS);
  /* An unknown kind was packed as f64 from the union's bytes.  Named as
   * the protocol (and the daemon's messages about the same args) name it. */
  for (unsigned i = 0; t->op == DSPK_OP_KERNEL && i < t->kernel.nargs; i++)
    if ((unsigned)t->kernel.args[i].kind > DSPK_KARG_F64)
      return dspk__cerr(c, DSPK_EINVAL, "options.args[%u]: unknown kind %d", i,
                        (int)t->kernel.args[i].kind);
  return 0;
}

#define DSPK_SHM_OPERANDS 8 /* inputs looked at for shared memory */

/* shm: the inline operand is in shared memory (lib_shm.c): a reference to
 * buffer sid at soff instead of its bytes. */
static void pack_tensor(struct dspk__wbuf *w, const dspk_tensor *x, bool shm,
                        uint64_t sid, uint64_t soff) {
  msgpack_packer *pk = &w->pk;
  int64_t shape[DSPK_MAX_RANK];

  for (unsigned k = 0; k < x->rank; k++)
    shape[k] = x->shape[k];
  if (x->is_ref || shm) {
    msgpack_pack_map(pk, 4);
    dspk__pack_str(pk, "buffer");
    msgpack_pack_uint64(pk, shm ? sid : x->buffer);
    dspk__pack_str(pk, "offset");
    msgpack_pack_uint64(pk, shm ? soff : x->offset);
    dspk__pack_tensor_meta(pk, x->dtype, x->rank, shape);
  } else {
    msgpack_pack_map(pk, 3);
    dspk__pack_tensor_meta(pk, x->dtype, x->rank, shape);
    dspk__pack_str(pk, "data");
    dspk__wbuf_bin_ref(w, x->data, x->nbytes, NULL, NULL);
  }
}

/* task.run's inputs: the task's operands, those in shared memory as
 * references (shm[i]: buffer sid[i] at soff[i]). */
struct inputs {
  const dspk_task *t;
  const bool *shm;
  const uint64_t *sid, *soff;
};

static void pack_inputs(const void *ud, struct dspk__wbuf *w) {
  const struct inputs *in = ud;
  const dspk_task *t = in->t;
  msgpack_pack_array(&w->pk, t->ninputs);
  for (unsigned i = 0; i < t->ninputs; i++) {
    bool s = i < DSPK_SHM_OPERANDS && in->shm[i];
    pack_tensor(w, &t->inputs[i], s, s ? in->sid[i] : 0, s ? in->soff[i] : 0);
  }
}

static void pack_outputs(const void *ud, struct dspk__wbuf *w) {
  const dspk_task *t = ud;
  msgpack_pack_array(&w->pk, t->nout_refs);
  for (unsigned i = 0; i < t->nout_refs; i++) {
    struct dspk__pval v[DSPK__OREF_COUNT] = {
        [DSPK__OREF_BUFFER] = dspk__pv_uint(t->out_refs[i].buffer),
        [DSPK__OREF_OFFSET] = dspk__pv_uint(t->out_refs[i].offset)};
    dspk__map_encode(w, dspk__out_ref_f, DSPK__OREF_COUNT, v);
  }
}

static void pack_axes(const void *ud, struct dspk__wbuf *w) {
  const dspk_task *t = ud;
  msgpack_pack_array(&w->pk, t->reduce.naxes);
  for (unsigned i = 0; i < t->reduce.naxes; i++)
    msgpack_pack_int(&w->pk, t->reduce.axes[i]);
}

/* args: [{tensor: i} | {i32: v} | {u32: v} | {i64: v} | {f32: v} | {f64: v}] */
static void pack_kargs(const void *ud, struct dspk__wbuf *w) {
  const dspk_task *t = ud;
  msgpack_packer *pk = &w->pk;
  msgpack_pack_array(pk, t->kernel.nargs);
  for (unsigned i = 0; i < t->kernel.nargs; i++) {
    const dspk_karg *a = &t->kernel.args[i];
    msgpack_pack_map(pk, 1);
    switch (a->kind) {
    case DSPK_KARG_TENSOR:
      dspk__pack_str(pk, "tensor");
      msgpack_pack_int(pk, a->v.tensor);
      break;
    case DSPK_KARG_I32:
      dspk__pack_str(pk, "i32");
      msgpack_pack_int32(pk, a->v.i32);
      break;
    case DSPK_KARG_U32:
      dspk__pack_str(pk, "u32");
      msgpack_pack_uint32(pk, a->v.u32);
      break;
    case DSPK_KARG_I64:
      dspk__pack_str(pk, "i64");
      msgpack_pack_int64(pk, a->v.i64);
      break;
    case DSPK_KARG_F32:
      dspk__pack_str(pk, "f32");
      msgpack_pack_float(pk, a->v.f32);
      break;
    default:
      dspk__pack_str(pk, "f64");
      msgpack_pack_double(pk, a->v.f64);
    }
  }
}

/* The options map of t's op, from the op's table in proto/schema.c. */
static void pack_options(const void *ud, struct dspk__wbuf *w) {
  const dspk_task *t = ud;
  const struct dspk__op_desc *od = &dspk__ops[t->op];
  struct dspk__pval v[DSPK__MAX_PARAMS] = {0};

  switch (t->op) {
  case DSPK_OP_GEMM:
    v[DSPK__GEMM_TRANS_A] = dspk__pv_bool(t->gemm.trans_a);
    v[DSPK__GEMM_TRANS_B] = dspk__pv_bool(t->gemm.trans_b);
    v[DSPK__GEMM_ALPHA] = dspk__pv_num(t->gemm.alpha);
    v[DSPK__GEMM_BETA] = dspk__pv_num(t->gemm.beta);
    break;
  case DSPK_OP_FFT:
    v[DSPK__FFT_INVERSE] = dspk__pv_bool(t->fft.inverse);
    break;
  case DSPK_OP_CONTRACT:
    v[DSPK__CONTRACT_SUBSCRIPTS] = dspk__pv_str(t->contract.subscripts);
    break;
  case DSPK_OP_REDUCE:
    v[DSPK__REDUCE_FN] = dspk__pv_enum((int)t->reduce.fn);
    if (t->reduce.naxes)
      v[DSPK__REDUCE_AXES] = dspk__pv_pack(pack_axes, t);
    break;
  case DSPK_OP_MAP:
    v[DSPK__MAP_FN] = dspk__pv_enum((int)t->map.fn);
    v[DSPK__MAP_ALPHA] = dspk__pv_num(t->map.alpha);
    break;
  case DSPK_OP_KERNEL:
    v[DSPK__KERNEL_LANG] = dspk__pv_enum(dspk__choice_find(dspk__kernel_langs, t->kernel.lang,
                                                    strlen(t->kernel.lang)));
    v[DSPK__KERNEL_SOURCE] = dspk__pv_bin(t->kernel.source, t->kernel.source_len, NULL, NULL);
    v[DSPK__KERNEL_ENTRY] = dspk__pv_str(t->kernel.entry ? t->kernel.entry : "main");
    v[DSPK__KERNEL_GRID].set = v[DSPK__KERNEL_BLOCK].set = true;
    memcpy(v[DSPK__KERNEL_GRID].v.dim, t->kernel.grid, sizeof t->kernel.grid);
    memcpy(v[DSPK__KERNEL_BLOCK].v.dim, t->kernel.block, sizeof t->kernel.block);
    v[DSPK__KERNEL_SHARED] = dspk__pv_uint(t->kernel.shared);
    v[DSPK__KERNEL_ARGS] = dspk__pv_pack(pack_kargs, t);
    break;
  default:
    break;
  }
  dspk__params_encode(w, od->options, od->noptions, v);
}

/* At least the bytes of task t's one result, when the op's rules give it
 * from the operands' shapes alone (gemm, fft, fir, map: backends/op.c); 0
 * when unknown or empty (the daemon's checks say what is wrong). */
static size_t result_bound(const dspk_task *t) {
  const dspk_tensor *a = t->ninputs > 0 ? &t->inputs[0] : NULL;
  uint64_t n = 1, es;
  if (!a || a->rank > DSPK_MAX_RANK || !(es = dspk_dtype_size(a->dtype)))
    return 0;
  switch (t->op) {
  case DSPK_OP_GEMM: {
    const dspk_tensor *b = t->ninputs > 1 ? &t->inputs[1] : NULL;
    unsigned ra = a->rank, rb, ro;
    if (!b || ra < 2 || (rb = b->rank) < 2 || rb > DSPK_MAX_RANK)
      return 0;
    ro = ra > rb ? ra : rb;
    for (unsigned i = 2; i < ro; i++) { /* batch axes, broadcast right-aligned */
      int64_t da = i < ra ? a->shape[ra - 1 - i] : 1, db = i < rb ? b->shape[rb - 1 - i] : 1;
      int64_t d = da > db ? da : db;
      if (d <= 0 || __builtin_mul_overflow(n, (uint64_t)d, &n))
        return 0;
    }
    int64_t m = t->gemm.trans_a ? a->shape[ra - 1] : a->shape[ra - 2];
    int64_t k = t->gemm.trans_b ? b->shape[rb - 2] : b->shape[rb - 1];
    if (m <= 0 || k <= 0 || __builtin_mul_overflow(n, (uint64_t)m, &n) ||
        __builtin_mul_overflow(n, (uint64_t)k, &n))
      return 0;
    es = a->dtype == DSPK_F64 ? 8 : 4;
    break;
  }
  case DSPK_OP_FFT:
    if (a->rank < 1 || a->shape[a->rank - 1] <= 0)
      return 0;
    n = dspk_tensor_numel(a);
    if (a->dtype != DSPK_C64 && a->dtype != DSPK_C128) { /* real: n/2+1 complex */
      int64_t last = a->shape[a->rank - 1];
      n = n / (uint64_t)last * (uint64_t)(last / 2 + 1);
      es *= 2;
    }
    break;
  case DSPK_OP_FIR:
  case DSPK_OP_MAP:
    n = dspk_tensor_numel(a);
    break;
  default:
    return 0;
  }
  if (__builtin_mul_overflow(n, es, &n) || n > SIZE_MAX)
    return 0;
  return (size_t)n;
}

/* dspk_submit, and dspk_run's send (may_wait: it may make temporaries,
 * which waits for buffer.import's answer; dspk_submit never waits). */
/* The bytes of t's inputs sent inline (SIZE_MAX where they pass it): not
 * references, nor those of shm (NULL: none) that a shared buffer carries. */
static size_t inline_bytes(const dspk_task *t, const bool *shm) {
  size_t n = 0;
  for (unsigned i = 0; i < t->ninputs; i++)
    if (!t->inputs[i].is_ref && !(shm && i < DSPK_SHM_OPERANDS && shm[i]))
      n = t->inputs[i].nbytes > SIZE_MAX - n ? SIZE_MAX : n + t->inputs[i].nbytes;
  return n;
}

/* Whether the daemon would refuse a task on device for the device itself,
 * where the task is too large to be sent and asking with it is no option:
 * DSPK_ENODEV (no such device, or not the Slurm job's), or DSPK_ELIMIT for
 * a name longer than DSPK__DEVICE_NAME_MAX, with the daemon's own
 * words in c->err, as the task with small operands gets them, rather than
 * advice about its size that would not help; 0 otherwise (c->err kept), or
 * a broken connection's or a timeout's code.  "any" is not asked about.
 * Asked with a buffer.create of 2^64-1 bytes, which the daemon answers at
 * once and refuses whatever the device: it resolves the device first, as
 * for task.run (daemon/methods.c, resolve_device), then the size, so no
 * buffer is made. */
static int device_refused(dspk_client *c, const char *device) {
  struct params a = {.m = DSPK__M_BUFFER_CREATE, .v =
                     {[DSPK__BCREATE_DEVICE] = dspk__pv_str(device),
                      [DSPK__BCREATE_SIZE] = dspk__pv_uint(UINT64_MAX)}};
  struct dspk__resp r;
  char keep[sizeof c->err];
  int rc;
  if (strcmp(device, "any") == 0)
    return 0;
  /* A name longer than the protocol's is refused by the daemon's decoder
   * whatever the task, in these words (proto/schema.c); said here, as a
   * name too long for the probe's own message would not be. */
  if (strlen(device) > DSPK__DEVICE_NAME_MAX)
    return dspk__cerr(c, DSPK_ELIMIT, "device: longer than %d bytes", DSPK__DEVICE_NAME_MAX);
  memcpy(keep, c->err, sizeof keep);
  rc = call(c, &a, &r);
  if (rc == 0) { /* a daemon that made it after all: given back */
    (void)dspk_buffer_free(c, a.res[DSPK__R_BUF_BUFFER].v.u);
    dspk__resp_free(&r);
  }
  /* ENODEV, or the device parameter itself refused ("device: ..."): the
   * task's refusal whatever its size. */
  if (rc == DSPK_ENODEV || c->broken || rc == DSPK_ETIMEDOUT ||
      (rc < 0 && strncmp(c->err, "device: ", 8) == 0))
    return rc;
  memcpy(c->err, keep, sizeof keep);
  return 0;
}

static int submit(dspk_client *c, const dspk_task *t, uint32_t *ticket, bool may_wait);

/* Whether the daemon would refuse the raw kernel t on its device whatever
 * its tensors' size (a device that runs no raw kernels, none of t's
 * language, raw kernels turned off; for "any", every device): asked with a
 * stand-in of t small enough for any message, one f32 element and a source
 * that no compiler takes (#error; not SPIR-V), through the socket (no
 * temporary).  The daemon checks the device before it compiles anything
 * (daemon/methods.c), so it answers in the words the task would get with
 * small tensors; a device that takes the kernel answers ECOMPILE (nothing
 * runs either way).  DSPK_ENOTSUP or DSPK_ENODEV with the daemon's words in
 * c->err, a broken connection's or a timeout's code, else 0 (c->err kept). */
static int kernel_refused(dspk_client *c, const dspk_task *t) {
  static const char src[] = "#error libdspkclient: a check of the device, never run\n";
  float one = 0.0f;
  int64_t shape[1] = {1};
  char keep[sizeof c->err];
  size_t threshold = c->shm_threshold;
  dspk_tensor x;
  dspk_task p;
  dspk_result res;
  uint32_t ticket;
  int rc;
  dspk_task_init(&p, DSPK_OP_KERNEL);
  dspk_tensor_inline(&x, DSPK_F32, 1, shape, &one);
  p.device = t->device;
  p.ninputs = 1;
  p.inputs = &x;
  p.kernel.lang = t->kernel.lang;
  p.kernel.source = src;
  p.kernel.source_len = sizeof src - 1;
  p.kernel.entry = t->kernel.entry;
  for (int i = 0; i < 3; i++)
    p.kernel.grid[i] = p.kernel.block[i] = 1;
  p.kernel.nargs = 1;
  p.kernel.args[0].kind = DSPK_KARG_TENSOR;
  p.kernel.args[0].v.tensor = 0;
  memcpy(keep, c->err, sizeof keep);
  c->shm_threshold = 0;
  rc = submit(c, &p, &ticket, false);
  c->shm_threshold = threshold;
  if (rc == 0 && (rc = dspk_wait(c, ticket, &res)) == 0)
    dspk_result_free(&res);
  if (rc == DSPK_ENOTSUP || rc == DSPK_ENODEV || c->broken || rc == DSPK_ETIMEDOUT)
    return rc;
  memcpy(c->err, keep, sizeof keep);
  return 0;
}

/* A raw kernel returns its inline tensors inline, in one answer: more than
 * an answer may carry (max_message - 1024, protocol.md) is refused before
 * anything is sent, with what the caller can do about it (dspk.h), unless
 * its device would refuse it anyway (device_refused, kernel_refused). */
static int kernel_fits(dspk_client *c, const dspk_task *t) {
  size_t n = inline_bytes(t, NULL);
  int rc;
  if (t->op != DSPK_OP_KERNEL || n <= dspk__result_inline_max(c))
    return 0;
  if ((rc = device_refused(c, t->device ? t->device : "any")) != 0 ||
      (rc = kernel_refused(c, t)) != 0)
    return rc;
  return dspk__cerr(c, DSPK_ELIMIT, "kernel: its inline tensors total %zu byte%s and come "
                    "back inline, more than an answer of the daemon carries (its %zu-byte "
                    "max_message less %d); pass big tensors as buffer references (is_ref: "
                    "dspk_buffer_create and dspk_buffer_write, or dspk_shared_alloc)",
                    n, dspk__s(n), c->send_max, DSPK__RESULT_FRAMING);
}

/* Writes into buf what sends the inline operands of t (on device, the
 * task's after "any" was resolved; shm: those already in shared memory)
 * through shared memory, true for c's current shared threshold: only
 * dspk_shared_alloc where no threshold would make a temporary of them (no
 * such operand, or "any" on a daemon not known to have no hardware
 * device, lib_shm.c); else the threshold that would, where the current
 * one (0: off, or above their largest) does not. */
static void shm_remedy(dspk_client *c, const dspk_task *t, const char *device, const bool *shm,
                       uint64_t task_bytes, char *buf, size_t len) {
  /* What "any" is decides whether a temporary is made for it: asked now
   * where no task has asked yet (threshold 0 never does). */
  size_t big = 0;
  for (unsigned i = 0; i < t->ninputs && i < DSPK_SHM_OPERANDS; i++) {
    const dspk_tensor *x = &t->inputs[i];
    if (!x->is_ref && x->nbytes && !shm[i] && x->nbytes > big &&
        !dspk__file_range(c, x->data, x->nbytes))
      big = x->nbytes;
  }
  /* A temporary that the connection's quota on cpu:0 leaves no room for is
   * not made, whatever the threshold: said so, not a threshold to set. */
  if (big != 0 &&
      (strcmp(device, "cpu:0") == 0 ||
       (strcmp(device, "any") == 0 && dspk__shm_any_is_cpu(c))) &&
      dspk__shm_quota_stops(c, "cpu:0", big, task_bytes))
    snprintf(buf, len, "dspk_shared_alloc; no temporary is made for them "
             "(dspk_set_shared_threshold), whatever the threshold: one of %zu bytes, in whole "
             "2 MiB units, with the task's other inline bytes would pass the %llu bytes this "
             "connection may hold on cpu:0 (max_conn_memory or max_user_memory)",
             big, (unsigned long long)c->cpu_quota);
  else if (big == 0 || (c->shm_threshold != 0 && c->shm_threshold <= big))
    snprintf(buf, len, "dspk_shared_alloc");
  else if (strcmp(device, "any") == 0 && !dspk__shm_any_is_cpu(c))
    snprintf(buf, len, "dspk_shared_alloc; a temporary, dspk_set_shared_threshold, is made "
             "for a task on \"any\" only when the daemon has no hardware device");
  else if (c->shm_threshold == 0)
    snprintf(buf, len, "dspk_shared_alloc, or a dspk_set_shared_threshold of 1 to %zu bytes: "
             "it is 0, which turns temporaries off", big);
  else
    snprintf(buf, len, "dspk_shared_alloc, or a dspk_set_shared_threshold of 1 to %zu bytes: "
             "it is %zu, above every inline operand", big, c->shm_threshold);
}

/* A task.run request larger than the daemon's max_message (dspk__send's
 * ELIMIT), said with what the caller can do about it: its operands sent
 * inline (shm: those a shared buffer carries) through buffers, where that
 * would make room enough. */
static int task_too_big(dspk_client *c, const dspk_task *t, const char *device, const bool *shm,
                        uint64_t task_bytes, size_t total) {
  size_t inl = inline_bytes(t, shm);
  char src[64] = "", remedy[512];
  int rc;
  /* A device the daemon would refuse the task for is that refusal (ENODEV),
   * as a small task gets it: no size advice helps then. */
  if ((rc = device_refused(c, device)) != 0 ||
      (t->op == DSPK_OP_KERNEL && (rc = kernel_refused(c, t)) != 0))
    return rc;
  if (t->op == DSPK_OP_KERNEL)
    snprintf(src, sizeof src, " (a raw kernel's source of %zu byte%s)", t->kernel.source_len,
             dspk__s(t->kernel.source_len));
  if (inl == 0 || total - inl >= c->send_max)
    return dspk__cerr(c, DSPK_ELIMIT, "task.run request of %zu bytes exceeds the daemon's "
                      "%zu-byte message limit (max_message), its inline operands' %zu byte%s "
                      "aside%s: too small a limit for this task", total, c->send_max, inl,
                      dspk__s(inl), src);
  if (t->op == DSPK_OP_KERNEL)
    return dspk__cerr(c, DSPK_ELIMIT, "task.run request of %zu bytes exceeds the daemon's "
                      "%zu-byte message limit (max_message): a raw kernel's source (%zu "
                      "byte%s) and inline tensors (%zu byte%s) go in it; pass big tensors as "
                      "buffer references (is_ref: dspk_buffer_create and dspk_buffer_write, "
                      "or dspk_shared_alloc)", total, c->send_max, t->kernel.source_len,
                      dspk__s(t->kernel.source_len), inl, dspk__s(inl));
  shm_remedy(c, t, device, shm, task_bytes, remedy, sizeof remedy);
  return dspk__cerr(c, DSPK_ELIMIT, "task.run request of %zu bytes exceeds the daemon's "
                    "%zu-byte message limit (max_message); pass big operands through "
                    "daemon buffers (is_ref: dspk_buffer_write splits) or shared memory "
                    "(%s)", total, c->send_max, remedy);
}

static int submit(dspk_client *c, const dspk_task *t, uint32_t *ticket, bool may_wait) {
  uint64_t sid[DSPK_SHM_OPERANDS], soff[DSPK_SHM_OPERANDS];
  bool shm[DSPK_SHM_OPERANDS] = {0};
  struct inputs in = {t, shm, sid, soff};
  struct params a = {.m = DSPK__M_TASK_RUN};
  struct dspk__wbuf w;
  dspk_task out = {0}; /* its out_refs: the result's temporary */
  size_t bound;
  uint64_t task_bytes; /* the inline operands and result: a temporary's room (lib_shm.c) */
  uint32_t id;
  const char *device, *shdev = NULL; /* the task's; its shared operands' */
  int rc;

  if (!c || !t || !ticket)
    return dspk__argerr(c, "dspk_submit: %s is NULL", !t ? "task" : "ticket");
  device = t->device ? t->device : "any";
  if (dspk__forked(c)) /* before a temporary, the parent's memory too, is filled */
    return DSPK_ECLOSED;
  rc = check_task(c, t);
  if (rc == 0)
    rc = kernel_fits(c, t);
  if (rc != 0)
    return rc;
  a.v[DSPK__RUN_OP] = dspk__pv_enum((int)t->op);
  a.v[DSPK__RUN_DEVICE] = dspk__pv_str(t->device ? t->device : "any");
  /* Operands in the caller's shared allocations go as references to them
   * where a reference can stand for them (dspk.h): on "any" the first such
   * operand's device runs the task (its temporaries are made there too);
   * the bytes of one on another device, or at an offset between items, go
   * as any other operand's (dspk__shm_operand). */
  for (unsigned i = 0; t->op != DSPK_OP_KERNEL && i < t->ninputs && i < DSPK_SHM_OPERANDS; i++) {
    const dspk_tensor *x = &t->inputs[i];
    const struct dspk__shm *s = x->is_ref || !x->nbytes ? NULL
                                : dspk__shm_holding(c, x->data, x->nbytes);
    size_t isz = dspk__dtype_size(x->dtype);
    if (s && isz && (size_t)((const char *)x->data - s->ptr) % isz == 0) {
      shdev = s->device;
      break;
    }
  }
  /* A reference to a buffer pins the task to its device (protocol.md,
   * task.run): on "any" its temporaries go there too, not to a device the
   * daemon would refuse beside it (EINVAL, operands on two devices).  A
   * reference to a buffer of unknown device leaves nothing to a temporary. */
  bool unknown_ref = false;
  if (strcmp(device, "any") == 0) {
    const char *rdev = NULL;
    for (unsigned i = 0; i < t->ninputs && !rdev; i++)
      if (t->inputs[i].is_ref && !(rdev = buffer_device(c, t->inputs[i].buffer)))
        unknown_ref = true;
    for (unsigned i = 0; i < t->nout_refs && i < DSPK_MAX_OUTPUTS && !rdev; i++)
      if (!(rdev = buffer_device(c, t->out_refs[i].buffer)))
        unknown_ref = true;
    if (rdev) {
      shdev = rdev;
      unknown_ref = false;
    }
  }
  /* On "any" such operands choose the device: temporaries go there too. */
  if (shdev && strcmp(device, "any") == 0)
    device = shdev;
  a.v[DSPK__RUN_INPUTS] = dspk__pv_pack(pack_inputs, &in);
  a.v[DSPK__RUN_OPTIONS] = dspk__pv_pack(pack_options, t);
  /* What the task itself needs of the device's memory, for the temporaries'
   * room under a quota (lib_shm.c, shm_temp). */
  task_bytes = t->nout_refs || t->op == DSPK_OP_KERNEL ? 0 : result_bound(t);
  for (unsigned i = 0; i < t->ninputs; i++) {
    const dspk_tensor *x = &t->inputs[i];
    if (!x->is_ref && x->nbytes && !dspk__shm_holding(c, x->data, x->nbytes))
      task_bytes = x->nbytes > UINT64_MAX - task_bytes ? UINT64_MAX : task_bytes + x->nbytes;
  }
  /* Operands in shared memory, or big enough to go through it (lib_shm.c). */
  /* Not for a raw kernel: its inline inputs come back inline. */
  for (unsigned i = 0; t->op != DSPK_OP_KERNEL && i < t->ninputs && i < DSPK_SHM_OPERANDS;
       i++) {
    const dspk_tensor *x = &t->inputs[i];
    if (x->is_ref || !x->nbytes)
      continue;
    /* A file's bytes (dspk_file_data) go with sendfile whatever their size
     * (a copy into a temporary would fault every page of the mapping in),
     * unless they could not go inline at all. */
    if (!dspk__operand_needs_shm(c, x->nbytes) &&
        (unknown_ref || dspk__file_range(c, x->data, x->nbytes)))
      continue;
    /* dspk_submit waits only for an operand that could not go inline; such
     * an operand takes a temporary whatever the threshold (lib_shm.c). */
    rc = dspk__shm_operand(c, device, x->data, x->nbytes, dspk__dtype_size(x->dtype),
                           task_bytes, may_wait, &sid[i], &soff[i]);
    if (rc < 0) {
      dspk__shm_sent(c, 0, false);
      return rc;
    }
    shm[i] = rc == 1;
    /* In a temporary: no longer the task's inline bytes (the result's
     * temporary was refused for counting both). */
    if (shm[i] && !dspk__shm_holding(c, x->data, x->nbytes))
      task_bytes -= task_bytes > x->nbytes ? x->nbytes : task_bytes;
  }
  if (t->nout_refs)
    a.v[DSPK__RUN_OUTPUTS] = dspk__pv_pack(pack_outputs, t);
  /* A large result on the cpu: written by the daemon into a temporary shared
   * buffer and copied from there by dspk_wait, instead of crossing the socket. */
  if (!t->nout_refs && !unknown_ref && t->op != DSPK_OP_KERNEL &&
      (bound = result_bound(t)) != 0) {
    /* No shared memory to be had (a limit, a quota): the result comes
     * inline, unless it cannot (dspk__result_needs_shm): then the refusal
     * is the task's failure, before anything is sent. */
    rc = dspk__shm_result(c, device, bound, task_bytes, may_wait, &out.out_refs[0].buffer);
    if (rc < 0) {
      dspk__shm_sent(c, 0, false);
      return rc;
    }
    if (rc == 1) {
      out.nout_refs = 1;
      a.v[DSPK__RUN_OUTPUTS] = dspk__pv_pack(pack_outputs, &out);
    }
  }
  id = dspk__next_id(c);
  dspk__wbuf_init(&w);
  dspk__wbuf_files(c, &w);
  dspk__pack_request_head(&w.pk, id, "task.run", true);
  pack_params(&a, &w);
  rc = dspk__send(c, &w, id);
  if (rc == DSPK_ELIMIT && dspk__wbuf_len(&w) > c->send_max)
    rc = task_too_big(c, t, device, shm, task_bytes, dspk__wbuf_len(&w));
  dspk__wbuf_free(&w);
  dspk__shm_sent(c, id, rc == 0);
  if (rc != 0)
    return rc;
  *ticket = id;
  return 0;
}

DSPK_EXPORT int dspk_submit(dspk_client *c, const dspk_task *t,
                            uint32_t *ticket) {
  return submit(c, t, ticket, false);
}

DSPK_EXPORT void dspk_result_free(dspk_result *r) {
  if (!r)
    return;
  for (unsigned i = 0; i < r->nout && i < DSPK_MAX_OUTPUTS; i++)
    if (!r->out[i].is_ref && !dspk__shm_lease_return(r->out[i].data))
      free((void *)r->out[i].data);
  memset(r, 0, sizeof(*r));
}

/* Decodes a task.run result into res, copying inline outputs into aligned
 * memory owned by res (the first one received into such memory already,
 * r->land, is taken as it is); an output in ticket's temporary shared buffer
 * (dspk__shm_result) is lent to res instead (dspk__shm_lend), or copied
 * too when it cannot be. */
static int decode_result(dspk_client *c, struct dspk__resp *r, uint32_t ticket,
                         dspk_result *res) {
  const msgpack_object *result = r->msg.result;
  dspk_result out = {0};
  const msgpack_object *outs;
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char why[256];
  int rc;

  if ((rc = dspk__result_decode(&dspk__methods[DSPK__M_TASK_RUN], result, v, why,
                                sizeof why)) < 0)
    return dspk__cerr(c, rc, "%s", why);
  dspk__pval_str(&v[DSPK__R_RUN_DEVICE], out.device, sizeof out.device);
  out.time_us = v[DSPK__R_RUN_TIME_US].v.u;
  outs = v[DSPK__R_RUN_OUTPUTS].v.o;
  if (outs->via.array.size > DSPK_MAX_OUTPUTS)
    return dspk__cerr(c, DSPK_EPROTO, "task.run result: bad outputs");
  for (uint32_t i = 0; i < outs->via.array.size; i++) {
    struct dspk__wire_tensor wt;
    dspk_tensor *t = &out.out[i];
    rc = dspk__tensor_decode(&outs->via.array.ptr[i], &c->lim, &wt, why,
                             sizeof why);
    if (rc == 0)
      rc = dspk__tensor_offset_check(&wt, why, sizeof why);
    if (rc != 0) {
      dspk_result_free(&out);
      return dspk__cerr(c, DSPK_EPROTO, "task.run output %u: %s", i, why);
    }
    t->dtype = wt.dtype;
    t->rank = wt.rank;
    memcpy(t->shape, wt.shape, sizeof t->shape);
    t->nbytes = wt.nbytes;
    t->is_ref = wt.is_ref;
    t->buffer = wt.buffer;
    t->offset = wt.offset;
    if (i == 0 && c->nsinks) {
      /* dspk_result_to_file of an answer that did not go to the file on its
       * way in: from its memory, or from its temporary's pages. */
      const void *src = wt.is_ref ? dspk__shm_of_ticket(c, ticket, wt.buffer, wt.offset,
                                                        wt.nbytes)
                                  : wt.data;
      char *f = src ? dspk__sink_write(c, ticket, src, wt.nbytes) : NULL;
      if (f) {
        t->data = f;
        t->is_ref = false;
        t->buffer = t->offset = 0;
        out.nout = i + 1;
        continue;
      }
    }
    if (wt.is_ref &&
        (t->data = dspk__shm_lend(c, ticket, wt.buffer, wt.offset, wt.nbytes)) != NULL) {
      t->is_ref = false; /* the result came through a temporary, lent to it */
      t->buffer = t->offset = 0;
      out.nout = i + 1;
      continue;
    }
    if (wt.is_ref && (wt.data = dspk__shm_of_ticket(c, ticket, wt.buffer, wt.offset,
                                                     wt.nbytes)) != NULL) {
      t->is_ref = false; /* the result came through a temporary: inline */
      t->buffer = t->offset = 0;
      wt.is_ref = false;
    }
    if (!wt.is_ref && wt.nbytes && wt.data == r->land) {
      t->data = r->land; /* received into its own memory (lib_conn.c, land) */
      r->land = NULL;
    } else if (!wt.is_ref) {
      size_t cap = (wt.nbytes + 63) / 64 * 64;
      void *p = aligned_alloc(64, cap ? cap : 64);
      if (!p) {
        dspk_result_free(&out);
        return dspk__cerr(c, DSPK_ENOMEM, "out of memory for output %u", i);
      }
      if (wt.nbytes)
        memcpy(p, wt.data, wt.nbytes);
      t->data = p;
    }
    out.nout = i + 1;
  }
  *res = out;
  return 0;
}

DSPK_EXPORT int dspk_wait(dspk_client *c, uint32_t ticket, dspk_result *res) {
  struct dspk__resp r;
  int rc;

  if (!c || !res)
    return dspk__argerr(c, "dspk_wait: res is NULL");
  rc = dspk__wait(c, ticket, &r);
  if (rc == 0) {
    rc = decode_result(c, &r, ticket, res);
    dspk__resp_free(&r);
  }
  dspk__sink_forget(c, ticket); /* an error answer's, or one too small */
  dspk__shm_done(c, ticket); /* its temporaries are free */
  dspk__shm_trim(c);         /* those beyond the bound go */
  return rc;
}

DSPK_EXPORT int dspk_wait_any(dspk_client *c, uint32_t *ticket,
                              dspk_result *res) {
  struct dspk__resp r;
  uint32_t id;
  int rc;

  if (!c || !ticket || !res)
    return dspk__argerr(c, "dspk_wait_any: %s is NULL", !ticket ? "ticket" : "res");
  rc = dspk__wait_any(c, &id, &r);
  if (rc == 0) {
    rc = decode_result(c, &r, id, res);
    dspk__resp_free(&r);
  }
  if (id != 0) { /* 0: no request was answered (none in flight, I/O error) */
    dspk__sink_forget(c, id);
    dspk__shm_done(c, id);
    dspk__shm_trim(c);
    *ticket = id;
  }
  return rc;
}

DSPK_EXPORT int dspk_run(dspk_client *c, const dspk_task *t,
                         dspk_result *res) {
  uint32_t ticket;
  int rc;

  if (!c || !t || !res)
    return dspk__argerr(c, "dspk_run: %s is NULL", !t ? "task" : "res");
  rc = submit(c, t, &ticket, true);
  if (rc != 0)
    return rc;
  /* Asked before the wait: its trim frees idle temporaries beyond the
   * bound, which the daemon counted when it refused the task (probe 23 B1:
   * an idle 4 MiB one under a 16 MiB quota, freed by the trim, and the
   * task was not sent again). */
  bool held = dspk__shm_of_task(c, ticket) != 0 || dspk__shm_has_idle(c);
  rc = dspk_wait(c, ticket, res);
  /* Refused for a limit (a memory quota, max_buffers) while the library's
   * own temporaries held memory, the task's or idle ones (whole 2 MiB
   * units): a temporary is no failure of the task (dspk.h), so the idle
   * ones are freed (the task's are idle now) and the task goes once more
   * through the socket, as with threshold 0 (an operand or result that
   * cannot cross it still takes one).  The python client's _run does the
   * same. */
  if (rc == DSPK_ELIMIT && (dspk__shm_drop_idle(c) || held) && !c->broken) {
    size_t threshold = c->shm_threshold;
    c->shm_threshold = 0;
    rc = submit(c, t, &ticket, true);
    c->shm_threshold = threshold;
    if (rc == 0)
      rc = dspk_wait(c, ticket, res);
  }
  return rc;
}

DSPK_EXPORT int dspk_cancel(dspk_client *c, uint32_t ticket, bool *canceled) {
  struct params a = {.m = DSPK__M_TASK_CANCEL, .v = {[DSPK__CANCEL_MSGID] = dspk__pv_uint(ticket)}};
  struct dspk__resp r;
  bool yes = false;
  int rc;

  if (!c)
    return DSPK_EINVAL;
  rc = call(c, &a, &r);
  if (rc != 0)
    return rc;
  yes = a.res[DSPK__R_CANCEL_CANCELED].v.b;
  dspk__resp_free(&r);
  if (canceled)
    *canceled = yes;
  return 0;
}

/* ---- cache --------------------------------------------------------------- */

/* DSPK_CACHE_* bit k is dspk__cache_kind_names[k], as the table's enum
 * list bits. */
_Static_assert(DSPK_CACHE_KERNELS == 1u && DSPK_CACHE_AUTOTUNE == 2u && DSPK_CACHE_BLOBS == 4u,
               "cache kinds in the order of dspk__cache_kind_names");

DSPK_EXPORT int dspk_cache_clear(dspk_client *c, unsigned kinds,
                                 unsigned *cleared) {
  struct params p = {.m = DSPK__M_CACHE_CLEAR};
  struct dspk__resp r;
  const msgpack_object *a;
  unsigned mask = kinds & DSPK_CACHE_ALL, got = 0;
  int rc;

  if (!c || (kinds & ~DSPK_CACHE_ALL))
    return dspk__argerr(c, "dspk_cache_clear: kinds 0x%x has bits outside DSPK_CACHE_ALL (0x%x)",
                        kinds, DSPK_CACHE_ALL);
  if (!mask)
    mask = DSPK_CACHE_ALL;
  p.v[DSPK__CCLEAR_KINDS] = (struct dspk__pval){.set = true, .v = {.mask = mask}};
  rc = call(c, &p, &r);
  if (rc != 0)
    return rc;
  a = p.res[DSPK__R_CCLEAR_CLEARED].v.o;
  for (uint32_t i = 0; i < arr_size(a); i++) {
    const char *s;
    size_t n;
    if (dspk__obj_str(&a->via.array.ptr[i], &s, &n) != 0)
      continue;
    int k = dspk__choice_find(dspk__cache_kind_names, s, n);
    if (k >= 0)
      got |= 1u << k;
  }
  dspk__resp_free(&r);
  if (cleared)
    *cleared = got;
  return 0;
}
