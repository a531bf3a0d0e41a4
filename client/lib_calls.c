/*
 * libdspkclient's methods: ping, devices, status, the buffer calls and
 * task.run (synchronous and in flight), on top of the request/response
 * machinery of lib_conn.c.  Requests are packed straight into a dspk__wbuf
 * whose big bin payloads (tensor data, buffer writes) stay in the caller's
 * memory; results are decoded with proto's checked getters and copied into
 * memory the caller owns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib_internal.h"

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
  *out = dt;
  return 0;
}

DSPK_EXPORT uint64_t dspk_tensor_numel(const dspk_tensor *t) {
  uint64_t n = 1;
  for (unsigned i = 0; i < t->rank && i < DSPK_MAX_RANK; i++)
    n *= (uint64_t)t->shape[i];
  return n;
}

DSPK_EXPORT void dspk_tensor_inline(dspk_tensor *t, dspk_dtype dt,
                                    unsigned rank, const int64_t *shape,
                                    const void *data) {
  memset(t, 0, sizeof(*t));
  t->dtype = dt;
  t->rank = rank > DSPK_MAX_RANK ? DSPK_MAX_RANK : rank;
  for (unsigned i = 0; i < t->rank; i++)
    t->shape[i] = shape[i];
  t->data = data;
  t->nbytes = (size_t)dspk_tensor_numel(t) * dspk__dtype_size(dt);
}

DSPK_EXPORT void dspk_task_init(dspk_task *t, dspk_op op) {
  memset(t, 0, sizeof(*t));
  t->op = op;
  t->gemm.alpha = 1.0;
  t->gemm.beta = 0.0;
  t->map.alpha = 1.0;
  for (int i = 0; i < 3; i++)
    t->kernel.grid[i] = t->kernel.block[i] = 1;
}

static const char *op_name(dspk_op op) {
  switch (op) {
#define XX(e, name) case DSPK_OP_##e: return name;
    DSPK_OP_MAP(XX)
#undef XX
  default: return NULL;
  }
}

static const char *reduce_name(dspk_reduce fn) {
  switch (fn) {
#define XX(e, name) case DSPK_REDUCE_##e: return name;
    DSPK_REDUCE_MAP(XX)
#undef XX
  default: return NULL;
  }
}

static const char *mapfn_name(dspk_mapfn fn) {
  switch (fn) {
#define XX(e, name, nin) case DSPK_MAP_##e: return name;
    DSPK_MAPFN_MAP(XX)
#undef XX
  default: return NULL;
  }
}

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v) {
  dspk__pack_str(pk, k);
  dspk__pack_str(pk, v);
}

/* ---- ping, JSON calls, devices, status ----------------------------------- */

struct ping_args { const void *data; size_t n; };

static void pack_ping(void *ud, struct dspk__wbuf *w) {
  struct ping_args *a = ud;
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "data");
  dspk__wbuf_bin_ref(w, a->data, a->n, NULL, NULL);
}

DSPK_EXPORT int dspk_ping(dspk_client *c, const void *data, size_t n) {
  struct ping_args a = {data, n};
  struct dspk__resp r;
  const void *echo;
  size_t elen;
  int rc;

  if (!c || (n && !data))
    return DSPK_EINVAL;
  rc = dspk__call(c, "ping", pack_ping, &a, &r);
  if (rc != 0)
    return rc;
  if (dspk__obj_bin(dspk__map_get(r.msg.result, "data"), &echo, &elen) != 0 ||
      elen != n || (n && memcmp(echo, data, n) != 0))
    rc = dspk__cerr(c, DSPK_EPROTO, "ping: the echo differs from the data");
  dspk__resp_free(&r);
  return rc;
}

DSPK_EXPORT int dspk_call_json(dspk_client *c, const char *method,
                               char **json_out) {
  struct dspk__resp r;
  char *json;
  int rc;

  if (!c || !method || !json_out)
    return DSPK_EINVAL;
  rc = dspk__call(c, method, NULL, NULL, &r);
  if (rc != 0)
    return rc;
  rc = dspk__to_json(r.msg.result, &json);
  dspk__resp_free(&r);
  if (rc != 0)
    return dspk__cerr(c, rc, "out of memory");
  *json_out = json;
  return 0;
}

/* ---- Slurm jobs (admin) ---------------------------------------------------- */

struct job_args {
  uint64_t job;
  uint32_t uid;
  const char *const *uuids;
  size_t n;
  bool reg;
};

static void pack_job(void *ud, struct dspk__wbuf *w) {
  const struct job_args *a = ud;
  msgpack_pack_map(&w->pk, a->reg ? 3 : 1);
  dspk__pack_str(&w->pk, "job");
  msgpack_pack_uint64(&w->pk, a->job);
  if (!a->reg)
    return;
  dspk__pack_str(&w->pk, "uid");
  msgpack_pack_uint32(&w->pk, a->uid);
  dspk__pack_str(&w->pk, "devices");
  msgpack_pack_array(&w->pk, a->n);
  for (size_t i = 0; i < a->n; i++)
    dspk__pack_str(&w->pk, a->uuids[i]);
}

static int job_call(dspk_client *c, const char *method, const struct job_args *a,
                    char **json_out) {
  struct dspk__resp r;
  char *json;
  int rc;

  if (!c || !json_out || !a->job || (a->n && !a->uuids))
    return DSPK_EINVAL;
  for (size_t i = 0; i < a->n; i++)
    if (!a->uuids[i])
      return DSPK_EINVAL;
  rc = dspk__call(c, method, pack_job, (void *)a, &r);
  if (rc != 0)
    return rc;
  rc = dspk__to_json(r.msg.result, &json);
  dspk__resp_free(&r);
  if (rc != 0)
    return dspk__cerr(c, rc, "out of memory");
  *json_out = json;
  return 0;
}

DSPK_EXPORT int dspk_job_register(dspk_client *c, uint64_t job, uint32_t uid,
                                  const char *const *uuids, size_t n, char **json_out) {
  struct job_args a = {job, uid, uuids, n, true};
  return job_call(c, "job.register", &a, json_out);
}

DSPK_EXPORT int dspk_job_end(dspk_client *c, uint64_t job, char **json_out) {
  struct job_args a = {job, 0, NULL, 0, false};
  return job_call(c, "job.end", &a, json_out);
}

static void pack_devices(void *ud, struct dspk__wbuf *w) {
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "all");
  if (*(bool *)ud)
    msgpack_pack_true(&w->pk);
  else
    msgpack_pack_false(&w->pk);
}

static uint32_t arr_size(const msgpack_object *o) {
  return o && o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size : 0;
}

DSPK_EXPORT int dspk_devices(dspk_client *c, bool all,
                             dspk_device_list **out) {
  struct dspk__resp r;
  dspk_device_list *l;
  const msgpack_object *devs, *unav;
  int rc;

  if (!c || !out)
    return DSPK_EINVAL;
  rc = dspk__call(c, "devices", pack_devices, &all, &r);
  if (rc != 0)
    return rc;
  devs = dspk__map_get(r.msg.result, "devices");
  unav = dspk__map_get(r.msg.result, "unavailable");
  l = calloc(1, sizeof(*l));
  if (!l)
    goto err_nomem;
  l->ndevices = arr_size(devs);
  l->nunavailable = arr_size(unav);
  l->devices = calloc(l->ndevices + 1, sizeof(*l->devices));
  l->unavailable = calloc(l->nunavailable + 1, sizeof(*l->unavailable));
  if (!l->devices || !l->unavailable ||
      dspk__to_json(r.msg.result, &l->json) != 0)
    goto err_list;
  for (size_t i = 0; i < l->ndevices; i++) {
    const msgpack_object *d = &devs->via.array.ptr[i];
    dspk_device *o = &l->devices[i];
    bool sw = false;
    dspk__strncpy_obj(dspk__map_get(d, "id"), o->id, sizeof o->id);
    dspk__strncpy_obj(dspk__map_get(d, "backend"), o->backend,
                      sizeof o->backend);
    dspk__strncpy_obj(dspk__map_get(d, "name"), o->name, sizeof o->name);
    dspk__strncpy_obj(dspk__map_get(d, "type"), o->type, sizeof o->type);
    dspk__strncpy_obj(dspk__map_get(d, "arch"), o->arch, sizeof o->arch);
    dspk__strncpy_obj(dspk__map_get(d, "driver"), o->driver,
                      sizeof o->driver);
    dspk__strncpy_obj(dspk__map_get(d, "uuid"), o->uuid, sizeof o->uuid);
    dspk__arg_u64(d, "memory", &o->memory, NULL, 0);
    dspk__arg_bool(d, "software", &sw, NULL, 0);
    o->software = sw;
  }
  for (size_t i = 0; i < l->nunavailable; i++) {
    const msgpack_object *u = &unav->via.array.ptr[i];
    dspk__strncpy_obj(dspk__map_get(u, "backend"), l->unavailable[i].backend,
                      sizeof l->unavailable[i].backend);
    dspk__strncpy_obj(dspk__map_get(u, "reason"), l->unavailable[i].reason,
                      sizeof l->unavailable[i].reason);
  }
  dspk__resp_free(&r);
  *out = l;
  return 0;

err_list:
  dspk_device_list_free(l);
err_nomem:
  dspk__resp_free(&r);
  return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
}

DSPK_EXPORT void dspk_device_list_free(dspk_device_list *l) {
  if (!l)
    return;
  free(l->devices);
  free(l->unavailable);
  free(l->json);
  free(l);
}

DSPK_EXPORT int dspk_status_get(dspk_client *c, dspk_status **out) {
  struct dspk__resp r;
  dspk_status *s;
  const msgpack_object *d, *cl, *dv;
  int rc;

  if (!c || !out)
    return DSPK_EINVAL;
  rc = dspk__call(c, "status", NULL, NULL, &r);
  if (rc != 0)
    return rc;
  d = dspk__map_get(r.msg.result, "daemon");
  cl = dspk__map_get(r.msg.result, "clients");
  dv = dspk__map_get(r.msg.result, "devices");
  s = calloc(1, sizeof(*s));
  if (!s)
    goto err_nomem;
  s->nclients = arr_size(cl);
  s->ndevices = arr_size(dv);
  s->clients = calloc(s->nclients + 1, sizeof(*s->clients));
  s->devices = calloc(s->ndevices + 1, sizeof(*s->devices));
  s->activity = calloc(s->ndevices + 1, sizeof(*s->activity));
  if (!s->clients || !s->devices || !s->activity ||
      dspk__to_json(r.msg.result, &s->json) != 0)
    goto err_status;
  dspk__strncpy_obj(dspk__map_get(d, "version"), s->version,
                    sizeof s->version);
  dspk__obj_i64(dspk__map_get(d, "pid"), &s->pid);
  dspk__obj_f64(dspk__map_get(d, "uptime_s"), &s->uptime_s);
  dspk__strncpy_obj(dspk__map_get(d, "socket"), s->socket, sizeof s->socket);
  dspk__obj_u64(dspk__map_get(d, "connections"), &s->connections);
  for (size_t i = 0; i < s->nclients; i++) {
    const msgpack_object *o = &cl->via.array.ptr[i];
    dspk_status_client *x = &s->clients[i];
    dspk__obj_u64(dspk__map_get(o, "id"), &x->id);
    dspk__obj_i64(dspk__map_get(o, "pid"), &x->pid);
    dspk__obj_i64(dspk__map_get(o, "uid"), &x->uid);
    dspk__obj_i64(dspk__map_get(o, "gid"), &x->gid);
    dspk__strncpy_obj(dspk__map_get(o, "name"), x->name, sizeof x->name);
    dspk__obj_u64(dspk__map_get(o, "inflight"), &x->inflight);
    dspk__obj_u64(dspk__map_get(o, "buffers"), &x->buffers);
  }
  for (size_t i = 0; i < s->ndevices; i++) {
    const msgpack_object *o = &dv->via.array.ptr[i];
    dspk_status_device *x = &s->devices[i];
    dspk__strncpy_obj(dspk__map_get(o, "id"), x->id, sizeof x->id);
    dspk__obj_u64(dspk__map_get(o, "queued"), &x->queued);
    dspk__obj_u64(dspk__map_get(o, "running"), &x->running);
    dspk__obj_u64(dspk__map_get(o, "completed"), &x->completed);
    dspk__obj_u64(dspk__map_get(o, "failed"), &x->failed);
    dspk__status_activity(o, &s->activity[i]);
  }
  dspk__resp_free(&r);
  *out = s;
  return 0;

err_status:
  dspk_status_free(s);
err_nomem:
  dspk__resp_free(&r);
  return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
}

DSPK_EXPORT void dspk_status_free(dspk_status *s) {
  if (!s)
    return;
  free(s->clients);
  free(s->devices);
  free(s->activity);
  free(s->json);
  free(s);
}

/* ---- buffers ------------------------------------------------------------ */

struct buf_args {
  const char *device;
  uint64_t id, offset, size;
  const void *data;
  int kind; /* 0 create, 1 write, 2 read, 3 free */
};

static void pack_buf(void *ud, struct dspk__wbuf *w) {
  struct buf_args *a = ud;
  msgpack_packer *pk = &w->pk;

  switch (a->kind) {
  case 0:
    msgpack_pack_map(pk, 2);
    pack_kv_str(pk, "device", a->device);
    dspk__pack_str(pk, "size");
    msgpack_pack_uint64(pk, a->size);
    break;
  case 1:
    msgpack_pack_map(pk, 3);
    dspk__pack_str(pk, "buffer");
    msgpack_pack_uint64(pk, a->id);
    dspk__pack_str(pk, "offset");
    msgpack_pack_uint64(pk, a->offset);
    dspk__pack_str(pk, "data");
    dspk__wbuf_bin_ref(w, a->data, a->size, NULL, NULL);
    break;
  case 2:
    msgpack_pack_map(pk, 3);
    dspk__pack_str(pk, "buffer");
    msgpack_pack_uint64(pk, a->id);
    dspk__pack_str(pk, "offset");
    msgpack_pack_uint64(pk, a->offset);
    dspk__pack_str(pk, "size");
    msgpack_pack_uint64(pk, a->size);
    break;
  default:
    msgpack_pack_map(pk, 1);
    dspk__pack_str(pk, "buffer");
    msgpack_pack_uint64(pk, a->id);
  }
}

DSPK_EXPORT int dspk_buffer_create(dspk_client *c, const char *device,
                                   size_t size, uint64_t *id_out) {
  struct buf_args a = {.device = device ? device : "cpu:0", .size = size,
                       .kind = 0};
  struct dspk__resp r;
  uint64_t id;
  int rc;

  if (!c || !id_out)
    return DSPK_EINVAL;
  rc = dspk__call(c, "buffer.create", pack_buf, &a, &r);
  if (rc != 0)
    return rc;
  if (dspk__obj_u64(dspk__map_get(r.msg.result, "buffer"), &id) != 0)
    rc = dspk__cerr(c, DSPK_EPROTO, "buffer.create: no buffer id in result");
  dspk__resp_free(&r);
  if (rc == 0)
    *id_out = id;
  return rc;
}

/* Largest payload of one buffer.write request or buffer.read answer: the
 * daemon's max_message less room for the envelope and keys. */
static size_t chunk_max(const dspk_client *c) {
  return c->send_max > 8192 ? c->send_max - 4096 : c->send_max / 2;
}

/* Large transfers go in pieces of at most PIECE bytes with up to WINDOW
 * requests in flight: the daemon copies one piece into the buffer (or out
 * of it) while the next crosses the socket, and its read buffers stay
 * small enough to be reused rather than mapped afresh for each transfer. */
#define PIECE ((size_t)4 << 20)
#define WINDOW 8

static size_t piece_max(const dspk_client *c) {
  size_t m = chunk_max(c);
  return m < PIECE ? m : PIECE;
}

/* Waits for the oldest of the pieces in flight (ids[*head..*tail)); a read
 * lands in its place in dst.  Keeps the first error in *first. */
static void piece_wait(dspk_client *c, const uint32_t *ids, char *const *dsts,
                       const size_t *lens, size_t *head, int *first, char *err) {
  size_t i = *head % WINDOW;
  int rc;
  if (dsts[i]) {
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
  }
  (*head)++;
}

/* Writes (dst NULL) or reads n bytes at offset in pieces (see PIECE). */
static int transfer(dspk_client *c, uint64_t id, uint64_t offset, const void *src,
                    void *dst, size_t n) {
  uint32_t ids[WINDOW];
  char *dsts[WINDOW];
  size_t lens[WINDOW], head = 0, tail = 0, done = 0;
  char err[sizeof c->err];
  int first = 0;

  do {
    size_t k = n - done < piece_max(c) ? n - done : piece_max(c);
    struct buf_args a = {.id = id, .offset = offset + done, .size = k,
                         .kind = dst ? 2 : 1};
    uint32_t msgid;
    int rc;
    if (!dst)
      a.data = (const char *)src + done;
    if (tail - head == WINDOW)
      piece_wait(c, ids, dsts, lens, &head, &first, err);
    if (first != 0)
      break;
    rc = dspk__send_call(c, dst ? "buffer.read" : "buffer.write", pack_buf, &a, &msgid);
    if (rc != 0) {
      first = rc;
      memcpy(err, c->err, sizeof c->err);
      break;
    }
    ids[tail % WINDOW] = msgid;
    dsts[tail % WINDOW] = dst ? (char *)dst + done : NULL;
    lens[tail % WINDOW] = k;
    tail++;
    done += k;
  } while (done < n);
  /* Every answer is taken, also after an error: the stream stays in step. */
  while (head < tail)
    piece_wait(c, ids, dsts, lens, &head, &first, err);
  if (first != 0)
    memcpy(c->err, err, sizeof c->err);
  return first;
}

DSPK_EXPORT int dspk_buffer_write(dspk_client *c, uint64_t id,
                                  uint64_t offset, const void *data,
                                  size_t n) {
  char *local;

  if (!c || (n && !data))
    return DSPK_EINVAL;
  /* A shared buffer of ours with nothing in flight: its bytes are here. */
  if ((local = dspk__shm_local(c, id, offset, n)) != NULL) {
    memcpy(local, data, n);
    return 0;
  }
  return transfer(c, id, offset, data, NULL, n);
}

DSPK_EXPORT int dspk_buffer_read(dspk_client *c, uint64_t id, uint64_t offset,
                                 void *dst, size_t n) {
  char *local;

  if (!c || (n && !dst))
    return DSPK_EINVAL;
  if ((local = dspk__shm_local(c, id, offset, n)) != NULL) {
    memcpy(dst, local, n);
    return 0;
  }
  return transfer(c, id, offset, NULL, dst, n);
}

DSPK_EXPORT int dspk_buffer_free(dspk_client *c, uint64_t id) {
  struct buf_args a = {.id = id, .kind = 3};
  struct dspk__resp r;
  int rc;

  if (!c)
    return DSPK_EINVAL;
  rc = dspk__call(c, "buffer.free", pack_buf, &a, &r);
  if (rc == 0)
    dspk__resp_free(&r);
  return rc;
}

/* ---- tasks -------------------------------------------------------------- */

/* Checks what the library must trust before reading caller memory. */
static int check_task(dspk_client *c, const dspk_task *t) {
  if (!op_name(t->op))
    return dspk__cerr(c, DSPK_EINVAL, "unknown op %d", (int)t->op);
  if (t->ninputs && !t->inputs)
    return dspk__cerr(c, DSPK_EINVAL, "inputs is NULL");
  if (t->nout_refs > DSPK_MAX_OUTPUTS)
    return dspk__cerr(c, DSPK_EINVAL, "more than %d output buffers",
                      DSPK_MAX_OUTPUTS);
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
    if (!x->is_ref && x->nbytes != dspk_tensor_numel(x) * isz)
      return dspk__cerr(c, DSPK_EINVAL,
                        "input %u: nbytes %zu, but its shape needs %llu", i,
                        x->nbytes,
                        (unsigned long long)(dspk_tensor_numel(x) * isz));
    if (!x->is_ref && x->nbytes && !x->data)
      return dspk__cerr(c, DSPK_EINVAL, "input %u: data is NULL", i);
  }
  if (t->op == DSPK_OP_REDUCE && (!reduce_name(t->reduce.fn) ||
                                  t->reduce.naxes > DSPK_MAX_RANK))
    return dspk__cerr(c, DSPK_EINVAL, "reduce: bad fn or naxes");
  if (t->op == DSPK_OP_MAP && !mapfn_name(t->map.fn))
    return dspk__cerr(c, DSPK_EINVAL, "map: bad fn");
  if (t->op == DSPK_OP_CONTRACT && !t->contract.subscripts)
    return dspk__cerr(c, DSPK_EINVAL, "contract: subscripts is NULL");
  if (t->op == DSPK_OP_KERNEL &&
      (t->kernel.nargs > DSPK_KERNEL_MAX_ARGS || !t->kernel.lang ||
       !t->kernel.entry || (t->kernel.source_len && !t->kernel.source)))
    return dspk__cerr(c, DSPK_EINVAL, "kernel: bad lang, entry, source or "
                      "nargs");
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

static void pack_bool(msgpack_packer *pk, const char *k, bool v) {
  dspk__pack_str(pk, k);
  if (v)
    msgpack_pack_true(pk);
  else
    msgpack_pack_false(pk);
}

static void pack_double(msgpack_packer *pk, const char *k, double v) {
  dspk__pack_str(pk, k);
  msgpack_pack_double(pk, v);
}

static void pack_u32x3(msgpack_packer *pk, const char *k, const uint32_t *v) {
  dspk__pack_str(pk, k);
  msgpack_pack_array(pk, 3);
  for (int i = 0; i < 3; i++)
    msgpack_pack_uint32(pk, v[i]);
}

static void pack_options(struct dspk__wbuf *w, const dspk_task *t) {
  msgpack_packer *pk = &w->pk;

  switch (t->op) {
  case DSPK_OP_GEMM:
    msgpack_pack_map(pk, 4);
    pack_bool(pk, "trans_a", t->gemm.trans_a);
    pack_bool(pk, "trans_b", t->gemm.trans_b);
    pack_double(pk, "alpha", t->gemm.alpha);
    pack_double(pk, "beta", t->gemm.beta);
    break;
  case DSPK_OP_FFT:
    msgpack_pack_map(pk, 1);
    pack_bool(pk, "inverse", t->fft.inverse);
    break;
  case DSPK_OP_CONTRACT:
    msgpack_pack_map(pk, 1);
    pack_kv_str(pk, "subscripts", t->contract.subscripts);
    break;
  case DSPK_OP_REDUCE:
    msgpack_pack_map(pk, t->reduce.naxes ? 2 : 1);
    pack_kv_str(pk, "fn", reduce_name(t->reduce.fn));
    if (t->reduce.naxes) {
      dspk__pack_str(pk, "axes");
      msgpack_pack_array(pk, t->reduce.naxes);
      for (unsigned i = 0; i < t->reduce.naxes; i++)
        msgpack_pack_int(pk, t->reduce.axes[i]);
    }
    break;
  case DSPK_OP_MAP:
    msgpack_pack_map(pk, 2);
    pack_kv_str(pk, "fn", mapfn_name(t->map.fn));
    pack_double(pk, "alpha", t->map.alpha);
    break;
  case DSPK_OP_KERNEL:
    msgpack_pack_map(pk, 7);
    pack_kv_str(pk, "lang", t->kernel.lang);
    dspk__pack_str(pk, "source");
    dspk__wbuf_bin_ref(w, t->kernel.source, t->kernel.source_len, NULL, NULL);
    pack_kv_str(pk, "entry", t->kernel.entry);
    pack_u32x3(pk, "grid", t->kernel.grid);
    pack_u32x3(pk, "block", t->kernel.block);
    dspk__pack_str(pk, "shared");
    msgpack_pack_uint32(pk, t->kernel.shared);
    /* args: [{tensor: i} | {i32: v} | {u32: v} | {i64: v} | {f32: v} |
     * {f64: v}] */
    dspk__pack_str(pk, "args");
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
    break;
  default: /* fir: no options */
    msgpack_pack_map(pk, 0);
  }
}

DSPK_EXPORT int dspk_submit(dspk_client *c, const dspk_task *t,
                            uint32_t *ticket) {
  struct dspk__wbuf w;
  msgpack_packer *pk;
  const char *dev;
  uint64_t sid[DSPK_SHM_OPERANDS], soff[DSPK_SHM_OPERANDS];
  bool shm[DSPK_SHM_OPERANDS] = {0};
  uint32_t id;
  int rc;

  if (!c || !t || !ticket)
    return DSPK_EINVAL;
  rc = check_task(c, t);
  if (rc != 0)
    return rc;
  /* Operands in shared memory, or big enough to go through it (lib_shm.c). */
  dev = t->device && *t->device ? t->device : "any";
  /* Not for a raw kernel: its inline inputs come back inline. */
  for (unsigned i = 0; t->op != DSPK_OP_KERNEL && i < t->ninputs && i < DSPK_SHM_OPERANDS;
       i++) {
    const dspk_tensor *x = &t->inputs[i];
    if (x->is_ref || !x->nbytes)
      continue;
    rc = dspk__shm_operand(c, dev, x->data, x->nbytes, &sid[i], &soff[i]);
    if (rc < 0) {
      dspk__shm_sent(c, 0, false);
      return rc;
    }
    shm[i] = rc == 1;
  }
  id = dspk__next_id(c);
  dspk__wbuf_init(&w);
  pk = &w.pk;
  dspk__pack_request_head(pk, id, "task.run", true);
  msgpack_pack_map(pk, t->nout_refs ? 5 : 4);
  pack_kv_str(pk, "op", op_name(t->op));
  pack_kv_str(pk, "device", t->device && *t->device ? t->device : "any");
  dspk__pack_str(pk, "inputs");
  msgpack_pack_array(pk, t->ninputs);
  for (unsigned i = 0; i < t->ninputs; i++)
    pack_tensor(&w, &t->inputs[i], i < DSPK_SHM_OPERANDS && shm[i],
                i < DSPK_SHM_OPERANDS ? sid[i] : 0, i < DSPK_SHM_OPERANDS ? soff[i] : 0);
  dspk__pack_str(pk, "options");
  pack_options(&w, t);
  if (t->nout_refs) {
    dspk__pack_str(pk, "outputs");
    msgpack_pack_array(pk, t->nout_refs);
    for (unsigned i = 0; i < t->nout_refs; i++) {
      msgpack_pack_map(pk, 2);
      dspk__pack_str(pk, "buffer");
      msgpack_pack_uint64(pk, t->out_refs[i].buffer);
      dspk__pack_str(pk, "offset");
      msgpack_pack_uint64(pk, t->out_refs[i].offset);
    }
  }
  rc = dspk__send(c, &w, id);
  dspk__wbuf_free(&w);
  dspk__shm_sent(c, id, rc == 0);
  if (rc != 0)
    return rc;
  *ticket = id;
  return 0;
}

DSPK_EXPORT void dspk_result_free(dspk_result *r) {
  if (!r)
    return;
  for (unsigned i = 0; i < r->nout && i < DSPK_MAX_OUTPUTS; i++)
    if (!r->out[i].is_ref)
      free((void *)r->out[i].data);
  memset(r, 0, sizeof(*r));
}

/* Decodes a task.run result into res, copying inline outputs into aligned
 * memory owned by res. */
static int decode_result(dspk_client *c, const msgpack_object *result,
                         dspk_result *res) {
  dspk_result out = {0};
  const msgpack_object *outs = dspk__map_get(result, "outputs");
  char why[256];
  int rc;

  dspk__strncpy_obj(dspk__map_get(result, "device"), out.device,
                    sizeof out.device);
  /* Optional (older daemons lack it): absent or malformed leaves 0. */
  if (dspk__obj_u64(dspk__map_get(result, "time_us"), &out.time_us) != 0)
    out.time_us = 0;
  if (!outs || outs->type != MSGPACK_OBJECT_ARRAY ||
      outs->via.array.size > DSPK_MAX_OUTPUTS)
    return dspk__cerr(c, DSPK_EPROTO, "task.run result: bad outputs");
  for (uint32_t i = 0; i < outs->via.array.size; i++) {
    struct dspk__wire_tensor wt;
    dspk_tensor *t = &out.out[i];
    rc = dspk__tensor_decode(&outs->via.array.ptr[i], &c->lim, &wt, why,
                             sizeof why);
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
    if (!wt.is_ref) {
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
    return DSPK_EINVAL;
  rc = dspk__wait(c, ticket, &r);
  dspk__shm_done(c, ticket); /* its temporary shared operands are free */
  if (rc != 0)
    return rc;
  rc = decode_result(c, r.msg.result, res);
  dspk__resp_free(&r);
  return rc;
}

DSPK_EXPORT int dspk_wait_any(dspk_client *c, uint32_t *ticket,
                              dspk_result *res) {
  struct dspk__resp r;
  uint32_t id;
  int rc;

  if (!c || !ticket || !res)
    return DSPK_EINVAL;
  rc = dspk__wait_any(c, &id, &r);
  if (id != 0)
    dspk__shm_done(c, id);
  if (rc == 0) {
    rc = decode_result(c, r.msg.result, res);
    dspk__resp_free(&r);
  }
  if (id != 0) /* 0: no request was answered (none in flight, I/O error) */
    *ticket = id;
  return rc;
}

DSPK_EXPORT int dspk_run(dspk_client *c, const dspk_task *t,
                         dspk_result *res) {
  uint32_t ticket;
  int rc;

  if (!res)
    return DSPK_EINVAL;
  rc = dspk_submit(c, t, &ticket);
  if (rc != 0)
    return rc;
  return dspk_wait(c, ticket, res);
}

static void pack_cancel(void *ud, struct dspk__wbuf *w) {
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "msgid");
  msgpack_pack_uint32(&w->pk, *(uint32_t *)ud);
}

DSPK_EXPORT int dspk_cancel(dspk_client *c, uint32_t ticket, bool *canceled) {
  struct dspk__resp r;
  bool yes = false;
  int rc;

  if (!c)
    return DSPK_EINVAL;
  rc = dspk__call(c, "task.cancel", pack_cancel, &ticket, &r);
  if (rc != 0)
    return rc;
  dspk__arg_bool(r.msg.result, "canceled", &yes, NULL, 0);
  dspk__resp_free(&r);
  if (canceled)
    *canceled = yes;
  return 0;
}

/* ---- cache --------------------------------------------------------------- */

static const char *const cache_kinds[] = {"kernels", "autotune", "blobs"};

static void pack_cache_clear(void *ud, struct dspk__wbuf *w) {
  unsigned mask = *(unsigned *)ud;
  size_t n = 0;
  for (int k = 0; k < 3; k++)
    n += (mask >> k) & 1u;
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "kinds");
  msgpack_pack_array(&w->pk, n);
  for (int k = 0; k < 3; k++)
    if ((mask >> k) & 1u)
      dspk__pack_str(&w->pk, cache_kinds[k]);
}

DSPK_EXPORT int dspk_cache_clear(dspk_client *c, unsigned kinds,
                                 unsigned *cleared) {
  struct dspk__resp r;
  const msgpack_object *a;
  unsigned mask = kinds & DSPK_CACHE_ALL, got = 0;
  int rc;

  if (!c || (kinds & ~DSPK_CACHE_ALL))
    return DSPK_EINVAL;
  if (!mask)
    mask = DSPK_CACHE_ALL;
  rc = dspk__call(c, "cache.clear", pack_cache_clear, &mask, &r);
  if (rc != 0)
    return rc;
  a = dspk__map_get(r.msg.result, "cleared");
  for (uint32_t i = 0; i < arr_size(a); i++) {
    const char *s;
    size_t n;
    if (dspk__obj_str(&a->via.array.ptr[i], &s, &n) != 0)
      continue;
    for (unsigned k = 0; k < 3; k++)
      if (strlen(cache_kinds[k]) == n && memcmp(cache_kinds[k], s, n) == 0)
        got |= 1u << k;
  }
  dspk__resp_free(&r);
  if (cleared)
    *cleared = got;
  return 0;
}
