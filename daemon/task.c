/*
 * The runner's side of each job: buffer create/write/read/free and task.run
 * against the device's backend.  Everything here runs on the device's runner
 * thread, the only thread that touches the device and its memory.  Each job
 * ends with its response already encoded (j->resp), outputs attached by
 * reference, so the loop thread only writes bytes.
 *
 * task.run: the loop decoded and validated the request (dspk__op_infer,
 * bounds of every buffer reference); here inline inputs are copied into
 * device memory, outputs are placed (a temporary block, or the buffer the
 * request named), the backend runs the op, inline outputs are read back into
 * host memory that the response frame then owns, and temporaries go back to
 * the backend (free is deferred release by the backend's contract).  The
 * work may still run on the device when exec_task returns: the runner
 * records a fence and answers once it completed (daemon/device.c), and
 * dspkd_job_finish then adds the result's time_us (CLOCK_MONOTONIC, from the
 * start of the task's turn to the completion of its fence: upload, planning
 * or autotuning, the device's work and readback; not queueing, not the
 * socket), or turns the answer into the error the device reported.
 */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/log.h"

static void release_host(void *p) { free(p); }

/* ---- answers sent from device memory (struct mpin) ---------------------
 * Runner thread (or the loop running a tiny task while the runner is idle),
 * except unpin, the frame's release, which the loop runs once the bytes are
 * written or dropped. */


static void unpin(void *ud) {
  struct mpin *p = ud;
  struct device *dev = p->dev; /* read first: once idle, p may be freed */
  if (atomic_fetch_sub_explicit(&p->sending, 1, memory_order_acq_rel) == 1)
    dspkd_sched_sweep(dev); /* a retired block is freed without a next job */
}

/* The release of a buffer.read answer sent from its buffer's block: the
 * block's count, and once the loop queued the answer (rp->b set), its
 * buffer's read and reference (struct rdpin).  Without b (the runner
 * replaced the answer, or the loop dropped it before queuing) the job
 * still counts the read. */
static void unpin_read(void *ud) {
  struct rdpin *rp = ud;
  struct dbuf *b = rp->b;
  struct conn *c = rp->c;
  unpin(rp->pin);
  free(rp);
  if (b) {
    dspkd_quota_reads_done(b);
    dspkd_dbuf_unref(b->dev->d, b);
    dspkd_conn_unref(c); /* last: b's release may touch its connection */
  }
}

static bool pin_idle(struct mpin *p) {
  return atomic_load_explicit(&p->sending, memory_order_acquire) == 0;
}

/* The host address to send n bytes of mem from, at off, or NULL (copy). */
static const void *send_ptr(struct device *dev, struct dspk__mem *mem, uint64_t off,
                            size_t n) {
  char *p;
  if (n < DSPKD_SEND_IN_PLACE_MIN || !dev->be->host_ptr || !(p = dev->be->host_ptr(dev->bdev, mem)))
    return NULL;
  return p + off;
}

static void retire(struct device *dev, struct mpin *p, struct dspk__mem *mem) {
  p->mem = mem;
  p->next = dev->retired;
  dev->retired = p;
}

/* Results this large are read into the backend's page-locked memory where
 * it has some (host_alloc), sent from there and given back once sent: a
 * DMA instead of a pageable copy into freshly faulted pages. */
#define HOST_PINNED_MIN ((size_t)64 << 10)

/* Host memory to read an n-byte result into and send from: the backend's
 * host_alloc block with *pin to retire it once sent, or malloc'd memory
 * (*pin NULL) that the frame frees.  NULL when out of memory. */
static void *out_host(struct device *dev, size_t n, struct mpin **pin) {
  void *p;
  *pin = NULL;
  if (n >= HOST_PINNED_MIN && dev->be->host_alloc &&
      (p = dev->be->host_alloc(dev->bdev, n)) != NULL) {
    if ((*pin = calloc(1, sizeof(**pin))) != NULL) {
      (*pin)->dev = dev;
      (*pin)->host = p;
      return p;
    }
    dev->be->host_free(dev->bdev, p);
  }
  return malloc(n ? n : 1);
}

/* Gives out_host's memory back when no frame took it. */
static void out_host_drop(struct device *dev, void *p, struct mpin *pin) {
  if (pin) {
    dev->be->host_free(dev->bdev, pin->host);
    free(pin);
  } else {
    free(p);
  }
}

/* The frame about to send from pin's memory (mem, a device block, or
 * pin->host, out_host's block): retired until sent. */
static void retire_sending(struct device *dev, struct mpin *pin, struct dspk__mem *mem) {
  atomic_store(&pin->sending, 1);
  retire(dev, pin, mem);
}

void dspkd_retired_sweep(struct device *dev, bool exiting) {
  struct mpin **pp = &dev->retired;
  while (*pp) {
    struct mpin *p = *pp;
    if (pin_idle(p)) {
      *pp = p->next;
      if (p->host)
        dev->be->host_free(dev->bdev, p->host);
      else
        dev->be->free(dev->bdev, p->mem);
      free(p);
    } else if (exiting) {
      /* An answer still refers to it (the loop ended without writing it):
       * the backend's close releases the memory; the pin stays for the
       * frame's release. */
      *pp = p->next;
    } else {
      pp = &p->next;
    }
  }
}

/* Buffer b is about to be written: when answers are still sent from its
 * block, it moves to a new block (with its contents, unless `whole`: the
 * write replaces all of it) and the old one is retired.  0 or a code. */
static int unpin_for_write(struct device *dev, struct dbuf *b, bool whole) {
  struct dspk__mem *mem = NULL;
  struct mpin *p = b->pin;
  const void *src;
  int err;
  if (!p)
    return 0;
  if (pin_idle(p)) {
    b->pin = NULL;
    free(p);
    return 0;
  }
  if ((err = dev->be->alloc(dev->bdev, (size_t)b->size, &mem)) < 0)
    return err;
  if (!whole && b->size) {
    src = dev->be->host_ptr(dev->bdev, b->mem);
    if ((err = dev->be->write(dev->bdev, mem, 0, src, (size_t)b->size)) < 0) {
      dev->be->free(dev->bdev, mem);
      return err;
    }
  }
  retire(dev, p, b->mem);
  b->pin = NULL;
  b->mem = mem;
  return 0;
}

/* Counts one more answer sent from b's block; false when out of memory. */
static bool pin_buffer(struct dbuf *b) {
  if (!b->pin) {
    if (!(b->pin = calloc(1, sizeof(*b->pin))))
      return false;
    b->pin->dev = b->dev;
  }
  atomic_fetch_add_explicit(&b->pin->sending, 1, memory_order_relaxed);
  return true;
}

/* Encodes an error response into j->resp and records the code. */
static void fail(struct job *j, int code, const char *msg) {
  j->err = code;
  j->rdpin = NULL; /* an answer sent from a buffer's block is replaced */
  if (msg && *msg) {
    free(j->errmsg);
    j->errmsg = strdup(msg); /* for the loop's log line; NULL is fine */
  }
  dspkd_wreq_free(j->resp);
  j->resp = dspkd_wreq_new();
  if (j->resp)
    dspk__pack_error_response(&j->resp->w.pk, j->msgid, code,
                              msg && *msg ? msg : dspk__strerror(code));
}

static struct wreq *result_head(struct job *j) {
  dspkd_wreq_free(j->resp);
  j->resp = dspkd_wreq_new();
  if (j->resp)
    dspk__pack_result_head(&j->resp->w.pk, j->msgid);
  return j->resp;
}

/* Zeroes the first n bytes of a block: memory from a device's pool (or
 * the heap) may hold what an earlier request of any connection left there,
 * and no client may see that.  The backend's clear, else writes of zeros. */
static int clear_mem(struct device *dev, struct dspk__mem *mem, size_t n) {
  static unsigned char zeros[1 << 20]; /* .bss: the kernel's zero page until written */
  int err = 0;
  if (dev->be->clear)
    return dev->be->clear(dev->bdev, mem, n);
  for (size_t off = 0; off < n && err == 0; off += sizeof zeros)
    err = dev->be->write(dev->bdev, mem, off, zeros,
                         n - off < sizeof zeros ? n - off : sizeof zeros);
  return err;
}

static void exec_create(struct device *dev, struct job *j) {
  struct dspk__mem *mem = NULL;
  struct dspk__pval v[3];
  struct wreq *wr;
  int err;
  if (j->buf->host) { /* buffer.import / buffer.share (daemon/shm.c) */
    err = dspkd_shm_create(dev, j->buf);
    mem = j->buf->mem;
  } else {
    err = dev->be->alloc(dev->bdev, (size_t)j->buf->size, &mem);
    if (err == 0 && (err = clear_mem(dev, mem, (size_t)j->buf->size)) < 0) {
      dev->be->free(dev->bdev, mem);
      mem = NULL;
    }
  }
  if (err < 0) {
    char msg[128];
    snprintf(msg, sizeof msg, "cannot allocate %llu byte%s on %s",
             (unsigned long long)j->buf->size, j->buf->size == 1 ? "" : "s", dev->id);
    fail(j, err, msg);
    return;
  }
  j->buf->mem = mem;
  wr = result_head(j);
  if (!wr) {
    j->err = DSPK_ENOMEM;
    return;
  }
  /* buffer.import and buffer.share answer the same fields. */
  v[DSPK__R_BUF_BUFFER] = dspk__pv_uint(j->buf->id);
  v[DSPK__R_BUF_DEVICE] = dspk__pv_str(dev->id);
  v[DSPK__R_BUF_SIZE] = dspk__pv_uint(j->buf->size);
  dspk__result_encode(&wr->w, &dspk__methods[DSPK__M_BUFFER_CREATE], v);
  if (j->buf->host && j->buf->share_fd >= 0) { /* buffer.share: goes with the answer */
    wr->fd = j->buf->share_fd;
    wr->fd_msgid = j->msgid;
    wr->fd_buf = j->buf->id;
    j->buf->share_fd = -1;
  }
}

static void exec_write(struct device *dev, struct job *j) {
  struct dspk__pval v[1];
  struct wreq *wr;
  int err = 0;
  /* Received in place (daemon/conn.c): the bytes are in the buffer, and
   * the loop saw no answer sent from it; b->pin is not touched here, the
   * loop may be reading it for the next piece. */
  if (j->landed)
    goto answer;
  if ((err = unpin_for_write(dev, j->buf, j->off == 0 && j->size == j->buf->size)) < 0) {
    fail(j, err, "no memory to write a buffer that an answer is still sent from");
    return;
  }
  /* Shared: the mapping holds the contents (after the device's work on it). */
  if (j->buf->host && (!j->buf->host_direct || (err = dev->be->sync(dev->bdev)) == 0))
    memcpy((char *)j->buf->host + j->off, j->data, (size_t)j->size);
  else
    err = dev->be->write(dev->bdev, j->buf->mem, (size_t)j->off, j->data,
                         (size_t)j->size);
  if (err < 0) {
    fail(j, err, "buffer.write failed on the device");
    return;
  }
answer:
  wr = result_head(j);
  if (!wr) {
    j->err = DSPK_ENOMEM;
    return;
  }
  v[DSPK__R_BWRITE_SIZE] = dspk__pv_uint(j->size);
  dspk__result_encode(&wr->w, &dspk__methods[DSPK__M_BUFFER_WRITE], v);
}

static void exec_read(struct device *dev, struct job *j) {
  struct dspk__pval v[1];
  struct wreq *wr;
  /* Sent from the buffer's block itself, whatever part of it is read: the
   * answer holds the buffer (struct rdpin), so that a freed buffer stays
   * counted as its connection's until the answer is written, and a write
   * meanwhile, which moves the buffer to a new block, counts that block in
   * the memory quotas (dbuf.reads, daemon/quota.c).  Shared memory is
   * copied (its client may write it meanwhile). */
  const void *src = j->buf->host ? NULL
                                 : send_ptr(dev, j->buf->mem, j->off, (size_t)j->size);
  struct mpin *pin;
  void *host;
  int err;
  if (src) {
    struct rdpin *rp = calloc(1, sizeof(*rp));
    if (!rp || !(wr = result_head(j)) || !pin_buffer(j->buf)) {
      free(rp);
      fail(j, DSPK_ENOMEM, "no host memory for buffer.read");
      return;
    }
    rp->pin = j->buf->pin;
    v[DSPK__R_BREAD_DATA] = dspk__pv_bin(src, (size_t)j->size, unpin_read, rp);
    dspk__result_encode(&wr->w, &dspk__methods[DSPK__M_BUFFER_READ], v);
    j->rdpin = rp;
    return;
  }
  host = out_host(dev, (size_t)j->size, &pin);
  if (!host) {
    fail(j, DSPK_ENOMEM, "no host memory for buffer.read");
    return;
  }
  if (j->buf->host) { /* shared: the mapping holds the contents */
    err = j->buf->host_direct ? dev->be->sync(dev->bdev) : 0;
    if (err == 0)
      memcpy(host, (char *)j->buf->host + j->off, (size_t)j->size);
  } else {
    err = dev->be->read(dev->bdev, j->buf->mem, (size_t)j->off, host, (size_t)j->size);
  }
  if (err < 0) {
    out_host_drop(dev, host, pin);
    fail(j, err, "buffer.read failed on the device");
    return;
  }
  wr = result_head(j);
  if (!wr) {
    out_host_drop(dev, host, pin);
    j->err = DSPK_ENOMEM;
    return;
  }
  if (pin) {
    retire_sending(dev, pin, NULL);
    v[DSPK__R_BREAD_DATA] = dspk__pv_bin(host, (size_t)j->size, unpin, pin);
  } else {
    v[DSPK__R_BREAD_DATA] = dspk__pv_bin(host, (size_t)j->size, release_host, host);
  }
  dspk__result_encode(&wr->w, &dspk__methods[DSPK__M_BUFFER_READ], v);
}

/* A result tensor's shape. */
static void pack_shape(const void *ud, struct dspk__wbuf *w) {
  const struct dspk__tensor *t = ud;
  msgpack_pack_array(&w->pk, (size_t)t->rank);
  for (int i = 0; i < t->rank; i++)
    msgpack_pack_int64(&w->pk, t->shape[i]);
}

/* Packs one output tensor by the table (dspk__out_tensor_f): a reference
 * when it went to a buffer, else the bytes read back into host memory (then
 * owned by the frame) or the device block itself, sent by reference
 * without a copy. */
static void pack_tensor(struct dspk__wbuf *w, const struct dspk__tensor *t,
                        const struct dbuf *ref, const void *data,
                        void (*release)(void *ud), void *ud) {
  struct dspk__pval v[DSPK__OUT_COUNT] = {
      [DSPK__OUT_DTYPE] = dspk__pv_enum((int)t->dtype),
      [DSPK__OUT_SHAPE] = dspk__pv_pack(pack_shape, t),
  };
  if (ref) {
    v[DSPK__OUT_BUFFER] = dspk__pv_uint(ref->id);
    v[DSPK__OUT_OFFSET] = dspk__pv_uint(t->offset);
  } else {
    v[DSPK__OUT_DATA] = dspk__pv_bin(data, dspk__tensor_nbytes(t), release, ud);
  }
  dspk__map_encode(w, dspk__out_tensor_f, DSPK__OUT_COUNT, v);
}

/* task.run's outputs: each result tensor.  An inline one's host memory goes
 * to the frame (its host[] entry is cleared); one sent from its device block
 * itself (pins[i]) has that block retired until sent. */
struct outputs {
  struct device *dev;
  const struct dspk__op *op;
  const struct dspk__tensor *res;
  struct dbuf *const *res_buf;
  void **host;
  const void *const *direct;
  struct mpin **pins;
  struct dspk__mem **tmp_in, **tmp_out;
  int nres;
};

static void pack_outputs(const void *ud, struct dspk__wbuf *w) {
  const struct outputs *o = ud;
  msgpack_pack_array(&w->pk, (size_t)o->nres);
  for (int i = 0; i < o->nres; i++) {
    if (o->pins[i] && o->pins[i]->host) { /* the backend's host_alloc block */
      retire_sending(o->dev, o->pins[i], NULL);
      pack_tensor(w, &o->res[i], NULL, o->pins[i]->host, unpin, o->pins[i]);
      o->pins[i] = NULL;
      o->host[i] = NULL;
      continue;
    }
    if (o->pins[i]) { /* the frame sends from the temporary, retired until sent */
      struct dspk__mem **own = o->op->kind == DSPK_OP_KERNEL ? &o->tmp_in[i] : &o->tmp_out[i];
      retire_sending(o->dev, o->pins[i], *own);
      *own = NULL;
      pack_tensor(w, &o->res[i], NULL, o->direct[i], unpin, o->pins[i]);
      o->pins[i] = NULL;
      continue;
    }
    pack_tensor(w, &o->res[i], o->res_buf[i], o->host[i], release_host, o->host[i]);
    o->host[i] = NULL; /* the frame owns it now */
  }
}

/* The opctx progress callback: a task.progress notification.  Those in
 * between (0 < fraction < 1) at most every PROGRESS_MS per task; a step's
 * start (0) and end (1) always, and they do not count against that rate:
 * an FFTW plan's 0 comes right after the previous plan's 1, and was
 * dropped when that 1 had started a new PROGRESS_MS. */
#define PROGRESS_MS 100
static void on_progress(void *ud, const char *what, double fraction) {
  struct job *j = ud;
  struct wreq *wr;
  uint64_t now = dspkd_now_ms();

  /* The trace's tuning phase: from the tuner's first report to its last. */
  if (what && strncmp(what, "autotune", 8) == 0) {
    j->t.tune_end = dspkd_now_ns();
    if (!j->t.tune_start)
      j->t.tune_start = j->t.tune_end;
  }
  if (fraction > 0.0 && fraction < 1.0) {
    if (j->progress_ms && now - j->progress_ms < PROGRESS_MS)
      return;
    j->progress_ms = now;
  }
  if (!(wr = dspkd_wreq_new()))
    return;
  dspk__pack_notify_head(&wr->w.pk, "task.progress");
  msgpack_pack_map(&wr->w.pk, 3);
  dspk__pack_kv_u64(&wr->w.pk, "msgid", j->msgid);
  dspk__pack_kv_str(&wr->w.pk, "what", what ? what : "");
  dspk__pack_str(&wr->w.pk, "fraction");
  msgpack_pack_double(&wr->w.pk, fraction < 0 ? 0 : fraction > 1 ? 1 : fraction);
  dspkd_sched_post_note(j->dev->d, j, wr);
}

/* Inline inputs this large are copied to the device by DMA straight from
 * the read buffer that holds them: the runner registers that buffer's
 * pages (host_register) the first time, and the buffer, kept for the next
 * large frame of any connection (daemon/conn.c's spare), stays registered
 * until it is freed.  A fresh client's gemm 1024^2 from .npy files sends 8
 * MiB this way: a pageable copy of them took most of the task's time on
 * the H200. */
#define PIN_INPUT_MIN ((size_t)1 << 20)

static void pin_chunk(struct device *dev, struct job *j) {
  struct rchunk *k = j->chunk;
  struct device *none = NULL;
  size_t big = 0, len;
  void *p;
  if (!k || !dev->be->host_register || k->cap <= DSPKD_RCHUNK_KEEP ||
      atomic_load(&k->pin_dev))
    return;
  for (int i = 0; i < j->op.nin; i++)
    if (j->in_data[i] && dspk__tensor_nbytes(&j->op.in[i]) > big)
      big = dspk__tensor_nbytes(&j->op.in[i]);
  if (big < PIN_INPUT_MIN)
    return;
  /* One runner registers (a buffer may feed tasks on several devices);
   * the others copy as before.  A failed registration is not retried. */
  if (!atomic_compare_exchange_strong(&k->pin_dev, &none, dev))
    return;
  p = dspkd_chunk_pin_span(k, &len);
  if (len && dev->be->host_register(dev->bdev, p, len) == 0) {
    atomic_store(&k->pinned, 1);
    dspkd_debug("%s: a read buffer of %zu bytes registered for DMA", dev->id, len);
  }
}

/* Whether a and b may share memory at equal offsets: one buffer, or two
 * mappings of one memfd (both map it from its start). */
static bool same_memory(const struct dbuf *a, const struct dbuf *b) {
  return a == b || (a && b && a->has_file && b->has_file && a->file_dev == b->file_dev &&
                    a->file_ino == b->file_ino);
}

bool dspkd_out_aliases(const struct job *j, int i) {
  return dspkd_out_alias_input(j, i) >= 0;
}

int dspkd_out_alias_input(const struct job *j, int i) {
  const struct dspk__op *op = &j->op;
  const struct dspk__tensor *o = &op->out[i];
  uint64_t ob = o->offset, on = dspk__tensor_nbytes(o);
  if (!j->out_buf[i] || on == 0)
    return -1;
  for (int k = 0; k < op->nin; k++) {
    const struct dspk__tensor *t = &op->in[k];
    uint64_t tb = t->offset, tn = dspk__tensor_nbytes(t);
    if (!same_memory(j->in_buf[k], j->out_buf[i]) || tn == 0 || tb >= ob + on ||
        ob >= tb + tn)
      continue;
    if (op->kind == DSPK_OP_MAP && tb == ob && tn == on)
      continue; /* in place, element by element */
    return k;
  }
  return -1;
}

/* Copies the result that an aliased output was computed into (its own
 * block) into the buffer at its offset, through host memory (the backend
 * interface has no device-to-device copy; aliasing is the rare case). */
static int copy_aliased(struct device *dev, struct dspk__mem *from, struct dspk__mem *to,
                        uint64_t off, size_t n) {
  void *h = malloc(n);
  int err;
  if (!h)
    return DSPK_ENOMEM;
  err = dev->be->read(dev->bdev, from, 0, h, n);
  if (err >= 0)
    err = dev->be->write(dev->bdev, to, off, h, n);
  /* h may go: write reads later only from a host_register'ed mapping. */
  free(h);
  return err;
}

static void exec_task(struct device *dev, struct job *j) {
  const struct dspk__backend *be = dev->be;
  struct dspk__op *op = &j->op;
  struct dspk__mem *tmp_in[DSPK__OP_MAX_IN] = {0};
  struct dspk__mem *tmp_out[DSPK__OP_MAX_OUT] = {0};
#define NRES (DSPK__OP_MAX_IN > DSPK__OP_MAX_OUT ? DSPK__OP_MAX_IN : DSPK__OP_MAX_OUT)
  void *host[NRES] = {0};
  /* Outputs computed into a block of their own (dspkd_out_aliases), and the
   * offset in their buffer the result is copied to. */
  bool aliased[DSPK__OP_MAX_OUT] = {0};
  uint64_t alias_off[DSPK__OP_MAX_OUT] = {0};
  /* Large inline results on a device with host_ptr: sent from the block. */
  const void *direct[NRES] = {0};
  struct mpin *pins[NRES] = {0};
  struct dspk__tensor *res; /* the tensors the response returns */
  struct dbuf **res_buf;
  int nres, err = 0, empty_res = 0;
  char msg[512] = "";
  struct dspk__opctx ctx = {.cancel = &j->cancel, .progress = on_progress, .progress_ud = j,
                            .errmsg = msg, .errmsg_len = sizeof msg, .owner = j->uid};
  struct wreq *wr;

  if (atomic_load(&j->cancel)) {
    snprintf(msg, sizeof msg, "%s", DSPKD_MSG_CANCELED);
    err = DSPK_ECANCELED;
    goto out;
  }
  /* Buffers this task writes, while answers are still sent from them: they
   * move to new blocks first (copied, unless the output covers all of a
   * buffer that no input reads). */
  for (int i = 0; i < op->nout + (op->kind == DSPK_OP_KERNEL ? op->nin : 0); i++) {
    bool out = i < op->nout;
    struct dbuf *b = out ? j->out_buf[i] : j->in_buf[i - op->nout];
    bool whole;
    if (!b || !b->pin)
      continue;
    whole = out && op->out[i].offset == 0 && dspk__tensor_nbytes(&op->out[i]) == b->size;
    for (int k = 0; k < op->nin && whole; k++)
      whole = j->in_buf[k] != b;
    if ((err = unpin_for_write(dev, b, whole)) < 0) {
      snprintf(msg, sizeof msg, "no memory on %s to write a buffer that an answer is "
               "still sent from", dev->id);
      goto out;
    }
  }
  pin_chunk(dev, j);
  for (int i = 0; i < op->nin; i++) {
    struct dspk__tensor *t = &op->in[i];
    if (j->in_buf[i]) {
      t->mem = j->in_buf[i]->mem;
      /* A shared buffer the device cannot use in place: one copy in. */
      if ((err = dspkd_shm_sync(dev, j->in_buf[i], t->offset, dspk__tensor_nbytes(t),
                                true)) < 0) {
        snprintf(msg, sizeof msg, "cannot copy shared input %d to %s", i, dev->id);
        goto out;
      }
      continue;
    }
    size_t n = dspk__tensor_nbytes(t);
    err = be->alloc(dev->bdev, n, &tmp_in[i]);
    if (err < 0) {
      snprintf(msg, sizeof msg, "cannot allocate %zu byte%s on %s for input %d", n,
               n == 1 ? "" : "s", dev->id, i);
      goto out;
    }
    t->mem = tmp_in[i];
    t->offset = 0;
    if (n && (err = be->write(dev->bdev, t->mem, 0, j->in_data[i], n)) < 0) {
      snprintf(msg, sizeof msg, "cannot copy input %d to %s", i, dev->id);
      goto out;
    }
  }
  for (int i = 0; i < op->nout; i++)
    aliased[i] = dspkd_out_aliases(j, i);
  for (int i = 0; i < op->nout; i++) {
    struct dspk__tensor *t = &op->out[i];
    if (j->out_buf[i] && !aliased[i]) {
      t->mem = j->out_buf[i]->mem;
      continue;
    }
    if (aliased[i])
      alias_off[i] = t->offset;
    size_t n = dspk__tensor_nbytes(t);
    err = be->alloc(dev->bdev, n, &tmp_out[i]);
    if (err < 0) {
      snprintf(msg, sizeof msg, "cannot allocate %zu byte%s on %s for output %d%s", n,
               n == 1 ? "" : "s", dev->id, i,
               aliased[i] ? " (computed apart from its buffer: it overlaps an input)" : "");
      goto out;
    }
    /* A raw kernel need not write all of its output: what it leaves must
     * not be an earlier request's bytes (the ops write every element). */
    if (op->kind == DSPK_OP_KERNEL && (err = clear_mem(dev, tmp_out[i], n)) < 0) {
      snprintf(msg, sizeof msg, "cannot clear %zu byte%s on %s for output %d", n,
               n == 1 ? "" : "s", dev->id, i);
      goto out;
    }
    t->mem = tmp_out[i];
    t->offset = 0;
  }
  j->t.upload_end = dspkd_now_ns();
  /* Results without elements need no work, whatever the operands' sizes
   * (dspk__op_infer checked that every size is representable). */
  for (int i = 0; i < op->nout && !empty_res; i++)
    empty_res = dspk__tensor_numel(&op->out[i]) != 0 ? -1 : 0;
  dspkd_test_cancel_wait(j, "before");
  if (op->kind == DSPK_OP_KERNEL || op->nout == 0 || empty_res < 0)
    err = be->run(dev->bdev, op, &ctx);
  j->t.compute_end = dspkd_now_ns();
  dspkd_test_cancel_wait(j, "after");
  /* ECANCELED only when the backend says its work stopped before it was
   * complete: an op that finished (one BLAS call, work already handed to a
   * device) gets its usual answer with its outputs, even when a cancel came
   * meanwhile (docs/protocol.md, task.cancel). */
  if (err == DSPK_ECANCELED) {
    /* Not a backend's message from before (an autotune candidate's failure
     * may have left one): the task was canceled. */
    snprintf(msg, sizeof msg, "%s", DSPKD_MSG_CANCELED);
    err = DSPK_ECANCELED;
    goto out;
  }
  if (err < 0)
    goto out;
  for (int i = 0; i < op->nout; i++) {
    struct dspk__tensor *t = &op->out[i];
    size_t n = dspk__tensor_nbytes(t);
    if (!aliased[i])
      continue;
    if ((err = copy_aliased(dev, tmp_out[i], j->out_buf[i]->mem, alias_off[i], n)) < 0) {
      snprintf(msg, sizeof msg, "cannot copy output %d into its buffer on %s", i, dev->id);
      goto out;
    }
    t->mem = j->out_buf[i]->mem; /* answered as the reference it was */
    t->offset = alias_off[i];
  }
  /* A raw kernel writes into its inputs: those are what it returns. */
  if (op->kind == DSPK_OP_KERNEL) {
    res = op->in;
    res_buf = j->in_buf;
    nres = op->nin;
  } else {
    res = op->out;
    res_buf = j->out_buf;
    nres = op->nout;
  }
  for (int i = 0; i < nres; i++) {
    size_t n = dspk__tensor_nbytes(&res[i]);
    if (res_buf[i] && res_buf[i]->host_direct) {
      /* The device wrote the client's pages itself: answered once done. */
      if ((err = be->sync(dev->bdev)) < 0) {
        snprintf(msg, sizeof msg, "%s failed writing output %d", dev->id, i);
        goto out;
      }
      continue;
    }
    if (res_buf[i]) {
      /* A shared buffer the device cannot use in place: one copy out. */
      if ((err = dspkd_shm_sync(dev, res_buf[i], res[i].offset, n, false)) < 0) {
        snprintf(msg, sizeof msg, "cannot copy output %d to its shared buffer", i);
        goto out;
      }
      continue;
    }
    {
      struct dspk__mem **own = op->kind == DSPK_OP_KERNEL ? &tmp_in[i] : &tmp_out[i];
      if (*own && *own == res[i].mem &&
          (direct[i] = send_ptr(dev, res[i].mem, res[i].offset, n))) {
        if (!(pins[i] = calloc(1, sizeof(*pins[i])))) {
          err = DSPK_ENOMEM;
          snprintf(msg, sizeof msg, "no host memory for output %d", i);
          goto out;
        }
        pins[i]->dev = dev;
        continue;
      }
    }
    host[i] = out_host(dev, n, &pins[i]);
    if (!host[i]) {
      err = DSPK_ENOMEM;
      snprintf(msg, sizeof msg, "no host memory for output %d (%zu byte%s)", i, n,
               n == 1 ? "" : "s");
      goto out;
    }
    if (n && (err = be->read(dev->bdev, res[i].mem, res[i].offset, host[i], n)) < 0) {
      snprintf(msg, sizeof msg, "cannot read output %d back from %s", i, dev->id);
      goto out;
    }
  }
  wr = result_head(j);
  if (!wr) {
    err = DSPK_ENOMEM;
    goto out;
  }
  {
    const struct dspk__method *m = &dspk__methods[DSPK__M_TASK_RUN];
    struct outputs o = {dev, op, res, res_buf, host, direct, pins, tmp_in, tmp_out, nres};
    struct dspk__pval v[3];
    v[DSPK__R_RUN_DEVICE] = dspk__pv_str(dev->id);
    v[DSPK__R_RUN_OUTPUTS] = dspk__pv_pack(pack_outputs, &o);
    v[DSPK__R_RUN_TIME_US] = dspk__pv_uint(0);
    /* time_us, the last field, is packed by dspkd_job_finish once the
     * device has finished the work. */
    dspk__result_head(&wr->w, m, v);
    dspk__result_fields(&wr->w, m, v, 0, DSPK__R_RUN_TIME_US);
  }
out:
  /* An aliased output that failed before its copy names its buffer again
   * (its block goes below). */
  for (int i = 0; i < op->nout; i++)
    if (aliased[i] && op->out[i].mem == tmp_out[i]) {
      op->out[i].mem = j->out_buf[i]->mem;
      op->out[i].offset = alias_off[i];
    }
  for (int i = 0; i < DSPK__OP_MAX_IN; i++)
    if (tmp_in[i])
      be->free(dev->bdev, tmp_in[i]);
  for (int i = 0; i < DSPK__OP_MAX_OUT; i++)
    if (tmp_out[i])
      be->free(dev->bdev, tmp_out[i]);
  for (size_t i = 0; i < NRES; i++) {
    if (pins[i] && pins[i]->host)
      out_host_drop(dev, host[i], pins[i]); /* never packed */
    else {
      free(host[i]);
      free(pins[i]);
    }
  }
#undef NRES
  if (err < 0)
    fail(j, err, msg);
}

void dspkd_job_finish(struct device *dev, struct job *j, int err, uint64_t ns) {
  if (j->err < 0)
    return; /* answered with the error it already had */
  if (err < 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s reported an error while running this %s: %s", dev->id,
             j->kind == JOB_TASK ? "task" : "request", dspk__strerror(err));
    fail(j, err, msg);
    return;
  }
  /* Rounded up, so a task that ran always reports at least 1. */
  if (j->kind == JOB_TASK && j->resp) {
    struct dspk__pval v[3];
    v[DSPK__R_RUN_TIME_US] = dspk__pv_uint((ns + 999) / 1000);
    dspk__result_fields(&j->resp->w, &dspk__methods[DSPK__M_TASK_RUN], v, DSPK__R_RUN_TIME_US,
                        DSPK__R_RUN_TIME_US + 1);
  }
}

void dspkd_job_execute(struct device *dev, struct job *j) {
  if (dev->retired)
    dspkd_retired_sweep(dev, false);
  switch (j->kind) {
  case JOB_TASK:
    exec_task(dev, j);
    break;
  case JOB_BUF_CREATE:
    exec_create(dev, j);
    break;
  case JOB_BUF_WRITE:
    exec_write(dev, j);
    break;
  case JOB_BUF_READ:
    exec_read(dev, j);
    break;
  case JOB_BUF_FREE: /* the runner frees the job itself when it is done */
    if (j->buf->pin && !pin_idle(j->buf->pin)) {
      retire(dev, j->buf->pin, j->buf->mem); /* freed once its answers are out */
      j->buf->mem = NULL;
    } else {
      free(j->buf->pin);
    }
    j->buf->pin = NULL;
    if (j->buf->mem)
      dev->be->free(dev->bdev, j->buf->mem);
    if (j->buf->host)
      dspkd_shm_release(dev, j->buf); /* after free: unpin, unmap */
    dspkd_maps_put(dev->d, j->buf);
    free(j->buf);
    j->buf = NULL;
    break;
  case JOB_UNPIN: { /* a read buffer this runner registered (daemon/conn.c) */
    size_t len;
    void *p = dspkd_chunk_pin_span(j->unpin, &len);
    dev->be->host_unregister(dev->bdev, p);
    free(j->unpin);
    j->unpin = NULL;
    dspkd_debug("%s: a read buffer of %zu bytes unregistered and freed", dev->id, len);
    break; /* the runner frees the job itself (an internal job) */
  }
  case JOB_TRIM:
    if (dev->be->trim)
      dev->be->trim(dev->bdev);
    /* The heap's free pages too, here, after the buffer releases queued
     * before this job (the loop's own malloc_trim at the idle trim runs
     * before the runner has freed the buffers of the connections just
     * closed: probe 19 H3, thousands of shared buffers' records stayed). */
    malloc_trim(0);
    if (dev->be->stats) { /* status shows it from now on */
      struct dspk__devstats st;
      memset(&st, 0, sizeof st);
      dev->be->stats(dev->bdev, &st);
      pthread_mutex_lock(&dev->mu);
      dev->stats = st;
      pthread_mutex_unlock(&dev->mu);
    }
    dspkd_debug("%s: idle: cached memory given back", dev->id);
    break; /* the runner frees the job itself (an internal job) */
  }
}
