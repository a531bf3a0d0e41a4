/*
 * The backend members shared by the GPU runtimes (gpurt.h): the device
 * lifecycle with fault handling, memory through the caching pool, fences as
 * the runtime's events, the retirement queue wired to those events, and the
 * pinned staging ring.  Every driver call goes through dev->drv.
 *
 * Faults.  CUDA (and HIP) errors such as an illegal address are sticky for the whole
 * process, so client kernels (op "kernel", the only code not ours) run in a
 * separate worker process per device (worker.h): a fault kills that
 * worker's context, the task fails with a clear error, the next raw kernel
 * gets a fresh worker, and the daemon's contexts on this and every other
 * device are untouched.  Should one of the daemon's own ops ever hit a
 * sticky error, the device reports it on every later call (ready()).
 * Memory blocks and fences carry a context generation number so that a
 * context rebuilt by a later design can tell its own from older ones.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/gpurt/gpurt.h"
#include "proto/testhook.h"

#define DRV (dev->drv)

/* ---- errors ----------------------------------------------------------- */

int dspk__gpurt_err(struct dspk__dev *dev, struct dspk__opctx *ctx,
                    const char *what, int r) {
  const struct dspk__gpurt_driver *drv = dev ? dev->drv : NULL;
  const char *name = NULL, *text = NULL;
  const char *rt = drv ? drv->name : "gpu";
  int cls = drv ? drv->classify(r) : DSPK__G_OTHER;
  char buf[256], api[96];
  what = dspk__gpurt_api(drv, what, api, sizeof(api));
  if (drv)
    drv->errname(r, &name, &text);
  if (cls == DSPK__G_OOM) {
    snprintf(buf, sizeof(buf), "%s: out of device memory on %s:%d", what, rt,
             dev ? dev->index : -1);
    dspk__gpurt_msg(ctx, DSPK_ENOMEM, "%s", buf);
    return DSPK_ENOMEM;
  }
  if (dev && cls == DSPK__G_STICKY) {
    snprintf(buf, sizeof(buf),
             "%s: %s (%s) on %s:%d: the device faulted (a kernel accessed "
             "memory it does not own, or crashed); its context is reset, "
             "buffers on it are lost",
             what, name ? name : "driver error", text ? text : "?", rt, dev->index);
    if (!dev->ctx_dead)
      dev->faults++;
    dev->ctx_dead = 1;
    snprintf(dev->fault, sizeof(dev->fault), "%s", buf);
  } else {
    snprintf(buf, sizeof(buf), "%s: %s (%s)", what, name ? name : "driver error",
             text ? text : "?");
  }
  dspk__gpurt_msg(ctx, DSPK_EDEVICE, "%s", buf);
  return DSPK_EDEVICE;
}

/* ---- probe ------------------------------------------------------------- */

int dspk__gpurt_probe(const struct dspk__gpurt_driver *drv, struct dspk__devinfo *info,
                      int max, char *why, size_t whylen) {
  int n;
  if (why && whylen)
    why[0] = 0;
  memset(drv->st, 0, sizeof(*drv->st));
  n = drv->probe(drv->st, why, whylen);
  if (n <= 0) {
    drv->st->n = 0;
    return 0;
  }
  if (n > DSPK__GPURT_MAX_DEVICES)
    n = DSPK__GPURT_MAX_DEVICES;
  drv->st->n = n;
  for (int i = 0; i < n && i < max; i++)
    info[i] = drv->st->info[i];
  return n;
}

void dspk__gpurt_shutdown(const struct dspk__gpurt_driver *drv) {
  drv->st->n = 0;
  if (drv->unload)
    drv->unload();
}

/* ---- fences ------------------------------------------------------------ */

static int fence_record_(struct dspk__dev *dev, struct dspk__fence **out) {
  struct dspk__fence *f;
  dspk__gevent ev;
  int r;
  if (dev->ctx_dead)
    return DSPK_EDEVICE;
  f = malloc(sizeof(*f));
  if (!f)
    return DSPK_ENOMEM;
  if (dev->nspare > 0) {
    ev = dev->spare[--dev->nspare];
  } else if ((r = DRV->event_create(&ev)) != 0) {
    free(f);
    return dspk__gpurt_err(dev, NULL, "cuEventCreate", r);
  }
  if ((r = DRV->event_record(ev, dev->stream)) != 0) {
    DRV->event_destroy(ev);
    free(f);
    return dspk__gpurt_err(dev, NULL, "cuEventRecord", r);
  }
  f->ev = ev;
  f->gen = dev->gen;
  *out = f;
  return 0;
}

int dspk__gpurt_fence_query(struct dspk__dev *dev, struct dspk__fence *f) {
  int r;
  if (f->gen != dev->gen)
    return 1; /* its context is gone, and with it all its work */
  r = DRV->event_query(f->ev);
  if (r == 0)
    return 1;
  if (DRV->classify(r) == DSPK__G_NOT_READY)
    return 0;
  return dspk__gpurt_err(dev, NULL, "cuEventQuery", r);
}

int dspk__gpurt_fence_wait(struct dspk__dev *dev, struct dspk__fence *f) {
  int r;
  if (f->gen != dev->gen)
    return 0;
  r = DRV->event_sync(f->ev);
  return r == 0 ? 0 : dspk__gpurt_err(dev, NULL, "cuEventSynchronize", r);
}

/* The backend table's fences: the daemon answers a task once its fence
 * completed, so a fence whose context was rebuilt after a fault reports the
 * loss of its work (EDEVICE) rather than "reached".  (The retirement
 * queue's view above counts it as reached: its memory went with it.) */
int dspk__gpurt_table_fence_query(struct dspk__dev *dev, struct dspk__fence *f) {
  if (f->gen != dev->gen)
    return DSPK_EDEVICE;
  return dspk__gpurt_fence_query(dev, f);
}

int dspk__gpurt_table_fence_wait(struct dspk__dev *dev, struct dspk__fence *f) {
  if (f->gen != dev->gen)
    return DSPK_EDEVICE;
  return dspk__gpurt_fence_wait(dev, f);
}

void dspk__gpurt_fence_destroy(struct dspk__dev *dev, struct dspk__fence *f) {
  if (!f)
    return;
  if (f->gen == dev->gen && !dev->ctx_dead) {
    if (dev->nspare < (int)(sizeof(dev->spare) / sizeof(dev->spare[0])))
      dev->spare[dev->nspare++] = f->ev;
    else
      DRV->event_destroy(f->ev);
  }
  free(f);
}

static int stream_sync(struct dspk__dev *dev) {
  int r;
  if (dev->ctx_dead)
    return DSPK_EDEVICE;
  r = DRV->stream_sync(dev->stream);
  if (r == 0)
    dev->stage.work_queued = 0;
  return r == 0 ? 0 : dspk__gpurt_err(dev, NULL, "cuStreamSynchronize", r);
}

/* The retirement queue's view of the same fences. */
static int rq_record(void *ud, void **f) {
  return fence_record_(ud, (struct dspk__fence **)f);
}
static int rq_query(void *ud, void *f) { return dspk__gpurt_fence_query(ud, f); }
static int rq_wait(void *ud, void *f) { return dspk__gpurt_fence_wait(ud, f); }
static void rq_destroy(void *ud, void *f) { dspk__gpurt_fence_destroy(ud, f); }
static int rq_barrier(void *ud) { return stream_sync(ud); }
static const struct dspk__retire_ops retire_ops = {rq_record, rq_query, rq_wait,
                                                   rq_destroy, rq_barrier};

void dspk__gpurt_retire(struct dspk__dev *dev, dspk__retire_release_fn fn,
                       void *ud, void *res) {
  if (dev->ctx_dead) {
    fn(ud, res); /* the context's reset frees the device side */
    return;
  }
  if (dev->sync_on_evict) {
    if (stream_sync(dev) == 0)
      fn(ud, res);
    return;
  }
  dspk__retire_push(&dev->retire, fn, ud, res);
}

/* ---- pool -------------------------------------------------------------- */

static int raw_alloc(void *ud, size_t n, uint64_t *h) {
  struct dspk__dev *dev = ud;
  dspk__gptr p;
  int r = DRV->mem_alloc(&p, n);
  if (DRV->classify(r) == DSPK__G_OOM)
    return DSPK_ENOMEM;
  if (r != 0)
    return dspk__gpurt_err(dev, NULL, "cuMemAlloc", r);
  *h = (uint64_t)p;
  return 0;
}

static void raw_free(void *ud, uint64_t h) {
  struct dspk__dev *dev = ud;
  if (!dev->ctx_dead)
    DRV->mem_free((dspk__gptr)h);
}

static const struct dspk__pool_ops pool_ops = {raw_alloc, raw_free};

int dspk__gpurt_tmp_alloc(struct dspk__dev *dev, size_t n,
                         struct dspk__pool_block **out) {
  /* The retirement queue is asked (one event query) only when the pool
   * has no block of the size: a plan miss with a cached block costs none. */
  if (n == 0)
    n = 1;
  if (!dspk__pool_has_cached(&dev->pool, n))
    dspk__retire_drain(&dev->retire);
  return dspk__pool_get(&dev->pool, n, out);
}

void dspk__gpurt_tmp_free(struct dspk__dev *dev, struct dspk__pool_block *b) {
  if (b)
    dspk__gpurt_retire(dev, dspk__pool_put_cb, &dev->pool, b);
}

/* ---- pinned staging ------------------------------------------------------ */

/* Why a ring of cuMemHostAlloc chunks and not cuMemHostRegister of the
 * caller's memory: the callers' buffers (a request frame's bytes, a result
 * the daemon is about to send) live for one transfer, and registering them
 * costs a page-table walk and pinning of every page each time (the driver's
 * documentation calls it expensive and advises against doing it per copy),
 * while the copies from pageable memory it would replace run at 5.2 GB/s
 * on the H200.  A ring allocated once per device turns every copy into a
 * host memcpy into pinned memory (overlapped with the DMA of the previous
 * chunk) plus an asynchronous DMA at full PCIe speed, and writes return
 * without waiting for the device.  The chunks are plain (not
 * write-combined) memory because device-to-host copies read them back. */

#define STAGE_CHUNKS_DEFAULT 16
#define STAGE_CHUNK_DEFAULT ((size_t)2 << 20) /* 16 x 2 MiB = 32 MiB */
#define STAGE_READ_DIRECT ((size_t)4 << 20)   /* see dspk__gpurt_stage_read */
#define STAGE_WRITE_DIRECT ((size_t)1 << 20)  /* on an idle stream, see dspk__gpurt_stage_write */

/* Waits for every copy still using a chunk, then frees the ring.  With a
 * dead context nothing can be waited for: the memory goes with the reset
 * that follows (cuDevicePrimaryCtxReset). */
static void stage_free(struct dspk__dev *dev) {
  struct dspk__gpurt_stage *s = &dev->stage;
  int dead = dev->ctx_dead;
  for (int i = 0; i < s->n; i++) {
    if (s->busy[i] && !dead && DRV->event_sync(s->ev[i]) != 0)
      dead = 1;
    s->busy[i] = 0;
  }
  for (int i = 0; i < s->n; i++)
    if (s->ev[i] && !dev->ctx_dead)
      DRV->event_destroy(s->ev[i]);
  /* A broken ring may still be read by a DMA without an event: only a
   * finished stream makes it safe to free. */
  if (s->host && !dead && (!s->broken || DRV->stream_sync(dev->stream) == 0))
    DRV->host_free(s->host);
  memset(s, 0, sizeof(*s));
}

/* Allocates a ring of n chunks of chunk bytes (n 0: none).  On failure the
 * ring stays off and the error is returned (open ignores it: copies then
 * go from pageable memory, slower but correct). */
static int stage_alloc(struct dspk__dev *dev, int n, size_t chunk) {
  struct dspk__gpurt_stage *s = &dev->stage;
  void *p = NULL;
  int r;
  int rc = 0;
  memset(s, 0, sizeof(*s));
  if (n <= 0)
    return 0;
  if (n < 2 || n > DSPK__GPURT_STAGE_MAX || chunk < 4096 || chunk > ((size_t)1 << 30))
    return DSPK_EINVAL;
  chunk = (chunk + 4095) & ~(size_t)4095;
  if ((r = DRV->host_alloc(&p, (size_t)n * chunk)) != 0)
    return dspk__gpurt_err(dev, NULL, "cuMemHostAlloc", r);
  for (int i = 0; i < n; i++) {
    if ((r = DRV->event_create(&s->ev[i])) != 0) {
      rc = dspk__gpurt_err(dev, NULL, "cuEventCreate", r);
      goto err_events;
    }
  }
  s->host = p;
  s->chunk = chunk;
  s->n = n;
  return 0;
err_events:
  for (int i = 0; i < n; i++)
    if (s->ev[i])
      DRV->event_destroy(s->ev[i]);
  DRV->host_free(p);
  memset(s, 0, sizeof(*s));
  return rc;
}

/* Takes the next chunk of the ring, waiting until the copy that used it
 * last has finished.  Writes its index.  0 or a dspk_errno. */
static int stage_take(struct dspk__dev *dev, int *idx) {
  struct dspk__gpurt_stage *s = &dev->stage;
  int i = s->next;
  if (s->busy[i]) {
    int r = DRV->event_query(s->ev[i]);
    if (DRV->classify(r) == DSPK__G_NOT_READY) {
      s->waits++;
      r = DRV->event_sync(s->ev[i]);
    }
    if (r != 0)
      return dspk__gpurt_err(dev, NULL, "cuEventSynchronize (staging)", r);
    s->busy[i] = 0;
  }
  s->next = (i + 1) % s->n;
  *idx = i;
  return 0;
}

/* Marks chunk i in use by the copy just enqueued.  Should the event fail,
 * the stream is drained instead; should that fail too, the ring is broken
 * (never touched again, freed only once the stream is known to be idle). */
static int stage_mark(struct dspk__dev *dev, int i) {
  struct dspk__gpurt_stage *s = &dev->stage;
  int r = DRV->event_record(s->ev[i], dev->stream);
  if (r == 0) {
    s->busy[i] = 1;
    return 0;
  }
  if (DRV->stream_sync(dev->stream) != 0)
    s->broken = 1;
  return dspk__gpurt_err(dev, NULL, "cuEventRecord (staging)", r);
}

static int stage_on(const struct dspk__dev *dev) {
  return dev->stage.host && !dev->stage.broken;
}

/* ---- client mappings pinned for DMA (shared-memory buffers) ---------------- */

/* Whether [p, p+n) lies within [base, base+len). */
static int range_in(const void *p, size_t n, const void *base, size_t len) {
  return (const char *)p >= (const char *)base && n <= len &&
         (size_t)((const char *)p - (const char *)base) <= len - n;
}

/* Room for one more entry of elem bytes in arr (n entries, capacity
 * *cap): arr itself, or the array moved to a larger allocation; NULL when
 * out of memory (arr unchanged). */
static void *grow(void *arr, size_t *cap, size_t n, size_t elem) {
  size_t c;
  void *na;
  if (n < *cap)
    return arr;
  c = *cap ? 2 * *cap : 8;
  if (!(na = realloc(arr, c * elem)))
    return NULL;
  *cap = c;
  return na;
}

/* Why register here, where the staging comment above argues against it:
 * a shared buffer's mapping lives as long as the buffer and is copied
 * around every task that uses it, so the one-time pinning pays back at the
 * first copy, and its copies then need no staging memcpy at all. */
static int host_pinned(const struct dspk__dev *dev, const void *p, size_t n) {
  for (size_t i = 0; i < dev->nhostreg; i++)
    if (range_in(p, n, dev->hostreg[i].p, dev->hostreg[i].n))
      return 1;
  return 0;
}

static int host_register_(struct dspk__dev *dev, void *p, size_t n) {
  int r;
  if (!DRV->host_register)
    return DSPK_ENOTSUP; /* copies go through the staging ring */
  void *nr = grow(dev->hostreg, &dev->caphostreg, dev->nhostreg, sizeof(*dev->hostreg));
  if (!nr)
    return DSPK_ENOMEM;
  dev->hostreg = nr;
  if ((r = DRV->host_register(p, n)) != 0)
    return dspk__gpurt_err(dev, NULL, "cuMemHostRegister", r);
  dev->hostreg[dev->nhostreg].p = p;
  dev->hostreg[dev->nhostreg].n = n;
  dev->nhostreg++;
  return 0;
}

void dspk__gpurt_host_unregister(struct dspk__dev *dev, void *p) {
  /* a dead context: only forgotten */
  for (size_t i = 0; i < dev->nhostreg; i++)
    if (dev->hostreg[i].p == p) {
      /* A copy still queued may read or fill the pages. */
      if (!dev->ctx_dead && DRV->stream_sync(dev->stream) == 0)
        DRV->host_unregister(p);
      dev->hostreg[i] = dev->hostreg[--dev->nhostreg];
      if (dev->nhostreg == 0) {
        free(dev->hostreg);
        dev->hostreg = NULL;
        dev->caphostreg = 0;
      }
      return;
    }
}

/* ---- page-locked memory for the daemon's results (host_alloc) ----------- */

/* Why: a result read back into malloc'd memory is a pageable copy (10 GB/s
 * on the H200 against 55 into pinned memory) into pages faulted in for the
 * occasion; the daemon sends the answer from the block and gives it back
 * once sent, so one block serves result after result. */
#define HOSTMEM_MIN ((size_t)64 << 10)

static int ready(struct dspk__dev *dev, struct dspk__opctx *ctx);

static int hostmem_find(const struct dspk__dev *dev, const void *p) {
  for (size_t i = 0; i < dev->nhostmem; i++)
    if (dev->hostmem[i].p == p)
      return (int)i;
  return -1;
}

static int host_owned(const struct dspk__dev *dev, const void *p, size_t n) {
  for (size_t i = 0; i < dev->nhostmem; i++)
    if (dev->hostmem[i].used && range_in(p, n, dev->hostmem[i].p, dev->hostmem[i].n))
      return 1;
  return 0;
}

/* Gives block i back to the driver (a dead context: only forgotten, the
 * reset frees it) and drops its entry. */
static void hostmem_drop(struct dspk__dev *dev, size_t i) {
  if (!dev->ctx_dead)
    DRV->host_free(dev->hostmem[i].p);
  dev->hostmem[i] = dev->hostmem[--dev->nhostmem];
  if (dev->nhostmem == 0) {
    free(dev->hostmem);
    dev->hostmem = NULL;
    dev->caphostmem = 0;
  }
}

void *dspk__gpurt_host_alloc(struct dspk__dev *dev, size_t n) {
  size_t c = HOSTMEM_MIN;
  void *p = NULL;
  /* Larger results take malloc'd memory: a block rounded up to a power of
   * two that is not kept would pin up to twice its bytes for one copy. */
  if (ready(dev, NULL) || n > DSPK__GPURT_HOSTMEM_MAX)
    return NULL;
  while (c < n)
    c *= 2;
  for (size_t i = 0; i < dev->nhostmem; i++)
    if (!dev->hostmem[i].used && dev->hostmem[i].n == c) {
      dev->hostmem[i].used = 1;
      return dev->hostmem[i].p;
    }
  void *nm = grow(dev->hostmem, &dev->caphostmem, dev->nhostmem, sizeof(*dev->hostmem));
  if (!nm)
    return NULL;
  dev->hostmem = nm;
  if (DRV->host_alloc(&p, c) != 0)
    return NULL;
  dev->hostmem[dev->nhostmem].p = p;
  dev->hostmem[dev->nhostmem].n = c;
  dev->hostmem[dev->nhostmem].used = 1;
  dev->nhostmem++;
  return p;
}

void dspk__gpurt_host_free(struct dspk__dev *dev, void *p) {
  int i = hostmem_find(dev, p);
  size_t kept = 0;
  if (i < 0)
    return;
  for (size_t k = 0; k < dev->nhostmem; k++)
    if (!dev->hostmem[k].used)
      kept += dev->hostmem[k].n;
  /* Its DMA finished before read() returned: no event to wait for. */
  if (dev->ctx_dead || kept + dev->hostmem[i].n > DSPK__GPURT_HOSTMEM_KEEP)
    hostmem_drop(dev, (size_t)i);
  else
    dev->hostmem[i].used = 0;
}

void dspk__gpurt_settle(struct dspk__dev *dev) {
  /* A lost context's queue is abandoned at close; its events answer nothing. */
  if (dev->retire.n && !dev->ctx_dead)
    dspk__retire_sync(&dev->retire);
}

void dspk__gpurt_trim(struct dspk__dev *dev) {
  for (size_t i = dev->nhostmem; i-- > 0;)
    if (!dev->hostmem[i].used)
      hostmem_drop(dev, i);
  if (dev->ctx_dead)
    return;
  dspk__gpurt_settle(dev);
  dspk__pool_trim(&dev->pool);
}

int dspk__gpurt_stage_write(struct dspk__dev *dev, dspk__gptr dst,
                           const void *src, size_t n) {
  struct dspk__gpurt_stage *s = &dev->stage;
  const unsigned char *p = src;
  int r;
  int rc;
  if (n == 0)
    return 0;
  /* A pinned client mapping: DMA straight from it, asynchronously. */
  if ((dev->nhostreg && host_pinned(dev, src, n)) ||
      (dev->nhostmem && host_owned(dev, src, n))) {
    r = DRV->htod_async(dst, src, n, dev->stream);
    return r == 0 ? 0 : dspk__gpurt_err(dev, NULL, "cuMemcpyHtoDAsync", r);
  }
  /* A copy from pageable memory makes the driver synchronize the stream
   * first: free when the stream holds no ops (only copies, or nothing), and
   * then the driver's own staged copy is the faster one for large writes (a
   * gemm 1024^2 task on an idle H200: 0.98 ms pageable vs 1.32 ms through
   * the ring).  While ops are queued, the ring keeps them running. */
  if (stage_on(dev) && n >= STAGE_WRITE_DIRECT && dev->stage.work_queued &&
      DRV->stream_query(dev->stream) == 0)
    dev->stage.work_queued = 0;
  if (!stage_on(dev) || (n >= STAGE_WRITE_DIRECT && !dev->stage.work_queued)) {
    r = DRV->htod_async(dst, src, n, dev->stream);
    return r == 0 ? 0 : dspk__gpurt_err(dev, NULL, "cuMemcpyHtoDAsync", r);
  }
  /* Chunk k+1 is filled while the DMA of chunk k runs; a chunk is reused
   * only after the event behind its last DMA. */
  while (n > 0) {
    size_t k = n < s->chunk ? n : s->chunk;
    unsigned char *h;
    int i;
    if ((rc = stage_take(dev, &i)))
      return rc;
    h = s->host + (size_t)i * s->chunk;
    memcpy(h, p, k);
    if ((r = DRV->htod_async(dst, h, k, dev->stream)) != 0)
      return dspk__gpurt_err(dev, NULL, "cuMemcpyHtoDAsync", r);
    if ((rc = stage_mark(dev, i)))
      return rc;
    s->chunks_h2d++;
    p += k;
    dst += k;
    n -= k;
  }
  return 0;
}

int dspk__gpurt_stage_read(struct dspk__dev *dev, void *dst, dspk__gptr src,
                          size_t n) {
  struct dspk__gpurt_stage *s = &dev->stage;
  unsigned char *p = dst;
  size_t issued = 0, done = 0;
  /* The chunks of this read in flight, oldest first: ring order, so the
   * oldest is always (first + k) % s->n. */
  int first = s->next, inflight = 0;
  int r;
  int rc;
  /* Reads from STAGE_READ_DIRECT up go straight to the caller's pageable
   * memory: a read waits for its data either way, and on the H200 the
   * driver's own pipelined copy measured 12-15 GB/s there against 8.5-11
   * through the ring (bench/cuda_staging); below it the ring is faster
   * (13 vs 7.7 GB/s at 1 MiB).  Writes use the ring unless the stream is
   * idle (see dspk__gpurt_stage_write). */
  if (!stage_on(dev) || n >= STAGE_READ_DIRECT ||
      (dev->nhostreg && host_pinned(dev, dst, n)) || /* pinned mapping: DMA into it */
      (dev->nhostmem && host_owned(dev, dst, n))) {
    if (n > 0 && (r = DRV->dtoh_async(dst, src, n, dev->stream)) != 0)
      return dspk__gpurt_err(dev, NULL, "cuMemcpyDtoHAsync", r);
    return stream_sync(dev);
  }
  if (n == 0)
    return stream_sync(dev);
  /* Up to s->n DMAs in flight; the oldest chunk is copied out while the
   * later ones run, then refilled with the next part. */
  while (done < n) {
    while (issued < n && inflight < s->n) {
      size_t k = n - issued < s->chunk ? n - issued : s->chunk;
      int i;
      if ((rc = stage_take(dev, &i)))
        return rc;
      r = DRV->dtoh_async(s->host + (size_t)i * s->chunk, src + issued, k, dev->stream);
      if (r != 0)
        return dspk__gpurt_err(dev, NULL, "cuMemcpyDtoHAsync", r);
      if ((rc = stage_mark(dev, i)))
        return rc;
      s->chunks_d2h++;
      issued += k;
      inflight++;
    }
    {
      int i = first;
      size_t k = n - done < s->chunk ? n - done : s->chunk;
      if ((r = DRV->event_sync(s->ev[i])) != 0)
        return dspk__gpurt_err(dev, NULL, "cuEventSynchronize (staging)", r);
      s->busy[i] = 0;
      memcpy(p + done, s->host + (size_t)i * s->chunk, k);
      done += k;
      inflight--;
      first = (first + 1) % s->n;
    }
  }
  return 0;
}

int dspk__gpurt_stage_config(struct dspk__dev *dev, int nchunks, size_t chunk) {
  stage_free(dev);
  return stage_alloc(dev, nchunks, chunk);
}

/* ---- device setup and teardown ------------------------------------------- */

#ifdef DSPK_TEST_HOOKS
const char *dspk__gpurt_hook(const struct dspk__gpurt_driver *drv, const char *name) {
  char var[96];
  snprintf(var, sizeof(var), "%s_%s", drv->env, name);
  return DSPK_TEST_HOOK(var);
}
#endif

unsigned dspk__gpurt_hook_uint(const char *s, unsigned dflt) {
  if (s && *s) {
    long v = strtol(s, NULL, 10);
    if (v > 0 && v < 4096)
      return (unsigned)v;
  }
  return dflt;
}

/* Builds everything that lives in a context.  Returns 0 or a dspk_errno. */
static int setup(struct dspk__dev *dev) {
  const struct dspk__gpurt_driver *drv = dev->drv;
  int r;
  int rc;
  if ((r = drv->ctx_open(dev->ordinal, &dev->ctx, &dev->stream)) != 0)
    return dspk__gpurt_err(dev, NULL, "cuDevicePrimaryCtxRetain", r);
  dev->ctx_dead = 0;
  dspk__pool_init(&dev->pool, &pool_ops, dev, 0);
  if ((rc = dspk__retire_init(
           &dev->retire, &retire_ops, dev,
           dspk__gpurt_hook_uint(DSPK__GPURT_HOOK(drv, "RETIRE_CAPACITY"), 0))))
    goto err_stream;
  if ((rc = dspk__plancache_init(&dev->fft_plans, 16, dspk__gpurt_fft_plan_evict, dev)))
    goto err_retire;
  if ((rc = dspk__plancache_init(&dev->contract_plans,
                                 dspk__gpurt_hook_uint(DSPK__GPURT_HOOK(drv, "PLAN_CACHE"), 16),
                                 dspk__gpurt_contract_plan_evict, dev)))
    goto err_fft;
  if ((rc = dspk__plancache_init(&dev->raw_modules, 32, dspk__gpurt_raw_module_evict, dev)))
    goto err_contract;
  if (drv->blas_name && drv->blas_name()) {
    if (dspk__pool_get(&dev->pool, DSPK__GPURT_BLAS_WORKSPACE, &dev->blas_ws) != 0)
      dev->blas_ws = NULL;
    if (drv->blas_open(&dev->blas, dev->stream, dev->blas_ws ? dev->blas_ws->handle : 0,
                       dev->blas_ws ? dev->blas_ws->size : 0) != 0) {
      dev->blas = NULL;
      if (dev->blas_ws)
        dspk__pool_put(&dev->pool, dev->blas_ws);
      dev->blas_ws = NULL;
    }
  }
  /* At open, not on first use: pinning 32 MiB takes milliseconds that the
   * first task of a client should not pay.  Without it copies still work
   * (from pageable memory), so a failure is not fatal. */
  {
    const char *e;
    int n;
    size_t kib = dspk__gpurt_hook_uint(DSPK__GPURT_HOOK(drv, "STAGE_CHUNK_KIB"),
                                       (unsigned)(STAGE_CHUNK_DEFAULT >> 10));
    e = DSPK__GPURT_HOOK(drv, "STAGE_CHUNKS");
    n = e && *e ? (int)strtol(e, NULL, 10) : STAGE_CHUNKS_DEFAULT;
    if (n < 0 || n > DSPK__GPURT_STAGE_MAX)
      n = STAGE_CHUNKS_DEFAULT;
    if (stage_alloc(dev, n, kib << 10))
      memset(&dev->stage, 0, sizeof(dev->stage));
  }
  return 0;
err_contract:
  dspk__plancache_fini(&dev->contract_plans);
err_fft:
  dspk__plancache_fini(&dev->fft_plans);
err_retire:
  dspk__retire_fini(&dev->retire);
err_stream:
  drv->ctx_close(dev->ordinal, dev->ctx, dev->stream, 0);
  return rc;
}

/* The ordered teardown of issue 5: synchronize, drain the retirement queue
 * (waiting on each event), free the pool and the pinned staging ring (after
 * the events of its last copies), unload modules, destroy library handles
 * and streams, release the context.  With a dead context nothing
 * waits: the reset that follows frees the device side. */
static void teardown(struct dspk__dev *dev) {
  const struct dspk__gpurt_driver *drv = dev->drv;
  int dead = dev->ctx_dead;
  dspk__gpurt_worker_stop(dev);
  if (!dead)
    drv->stream_sync(dev->stream);
  /* Plans hand their workspaces to the queue first. */
  dspk__plancache_fini(&dev->fft_plans);
  dspk__plancache_fini(&dev->contract_plans);
  dspk__plancache_fini(&dev->raw_modules);
  if (dev->blas) {
    drv->blas_close(dev->blas);
    dev->blas = NULL;
  }
  if (dev->blas_ws) {
    dspk__gpurt_retire(dev, dspk__pool_put_cb, &dev->pool, dev->blas_ws);
    dev->blas_ws = NULL;
  }
  if (dead)
    dspk__retire_abandon(&dev->retire);
  dspk__retire_fini(&dev->retire);
  dspk__pool_fini(&dev->pool);
  stage_free(dev);
  while (dev->nhostmem > 0) /* blocks the daemon never gave back too */
    hostmem_drop(dev, dev->nhostmem - 1);
  dspk__gpurt_modules_unload(dev);
  while (dev->nspare > 0) {
    dspk__gevent ev = dev->spare[--dev->nspare];
    if (!dead)
      drv->event_destroy(ev);
  }
  drv->ctx_close(dev->ordinal, dev->ctx, dead ? NULL : dev->stream, dead);
  dev->stream = NULL;
  dev->ctx = NULL;
}

/* Every entry point starts here.  A sticky error in this process (which
 * the daemon's own ops should never cause: client kernels run in the
 * worker) leaves CUDA unusable in the whole process, as the CUDA
 * documentation says: "to continue using CUDA, the process must be
 * terminated and relaunched".  The device then fails every call with the
 * original fault and that advice. */
static int ready(struct dspk__dev *dev, struct dspk__opctx *ctx) {
  if (!dev->ctx_dead)
    return 0;
  return dspk__gpurt_msg(ctx, DSPK_EDEVICE,
                        "%s; the %s runtime cannot recover from this inside a process: "
                        "restart dspkd", dev->fault, DRV->name);
}

int dspk__gpurt_open(const struct dspk__gpurt_driver *drv, int index,
                     const struct dspk__devenv *env, struct dspk__dev **out) {
  struct dspk__dev *dev;
  int rc;
  if (index < 0 || index >= drv->st->n)
    return DSPK_ENODEV;
  dev = calloc(1, sizeof(*dev));
  if (!dev)
    return DSPK_ENOMEM;
  dev->drv = drv;
  dev->index = index;
  dev->worker_fd = -1;
  dev->ordinal = drv->st->ordinal[index];
  dev->info = drv->st->info[index];
  if (env)
    dev->env = *env;
  snprintf(dev->arch, sizeof(dev->arch), "%s", dev->info.arch);
  if (drv->rtc_load(NULL, 0) == 0)
    drv->rtc_version(dev->rtc_ver, sizeof(dev->rtc_ver));
  dev->sms = drv->st->sms[index];
  if (dev->sms <= 0)
    dev->sms = 16;
  dev->gen = 1;
  dev->gemm_small = drv->gemm_small;
  if ((rc = setup(dev))) {
    free(dev);
    return rc;
  }
  *out = dev;
  return 0;
}

void dspk__gpurt_close(struct dspk__dev *dev) {
  if (!dev)
    return;
  dspk__kcompile_spare_end(&dev->kspare);
  teardown(dev);
  free(dev->hostreg); /* the daemon unregisters before it closes; never left */
  free(dev);
}

/* ---- memory ------------------------------------------------------------ */

int dspk__gpurt_alloc(struct dspk__dev *dev, size_t n, struct dspk__mem **out) {
  struct dspk__mem *m;
  int rc;
  if ((rc = ready(dev, NULL)))
    return rc;
  m = calloc(1, sizeof(*m));
  if (!m)
    return DSPK_ENOMEM;
  if ((rc = dspk__gpurt_tmp_alloc(dev, n, &m->blk))) {
    free(m);
    return rc;
  }
  m->ptr = (dspk__gptr)m->blk->handle;
  m->size = n;
  m->gen = dev->gen;
  *out = m;
  return 0;
}

void dspk__gpurt_free(struct dspk__dev *dev, struct dspk__mem *m) {
  if (!m)
    return;
  if (m->gen == dev->gen)
    dspk__gpurt_tmp_free(dev, m->blk);
  else
    free(m->blk); /* its memory went with its context */
  free(m);
}

static int check_mem(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                     size_t n) {
  if (m->gen != dev->gen)
    return DSPK_EDEVICE;
  if (off > m->size || n > m->size - off)
    return DSPK_ERANGE;
  return 0;
}

int dspk__gpurt_write(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                      const void *src, size_t n) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = check_mem(dev, m, off, n)))
    return rc;
  return dspk__gpurt_stage_write(dev, m->ptr + off, src, n);
}

int dspk__gpurt_read(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                     void *dst, size_t n) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = check_mem(dev, m, off, n)))
    return rc;
  if ((rc = dspk__gpurt_stage_read(dev, dst, m->ptr + off, n)))
    return rc;
  dspk__retire_drain(&dev->retire);
  return 0;
}

int dspk__gpurt_host_register(struct dspk__dev *dev, void *ptr, size_t n) {
  int rc = ready(dev, NULL);
  return rc ? rc : host_register_(dev, ptr, n);
}

int dspk__gpurt_fence_record(struct dspk__dev *dev, struct dspk__fence **out) {
  int rc = ready(dev, NULL);
  return rc ? rc : fence_record_(dev, out);
}

int dspk__gpurt_sync(struct dspk__dev *dev) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = stream_sync(dev)))
    return rc;
  dspk__retire_drain(&dev->retire);
  return 0;
}

/* ---- ops --------------------------------------------------------------- */

int dspk__gpurt_run_checked(struct dspk__dev *dev, struct dspk__op *op,
                    struct dspk__opctx *ctx) {
  int rc;
  if ((rc = ready(dev, ctx)))
    return rc;
  for (int i = 0; i < op->nin + op->nout; i++) {
    const struct dspk__tensor *t = i < op->nin ? &op->in[i] : &op->out[i - op->nin];
    if (t->mem && t->mem->gen != dev->gen)
      return dspk__gpurt_msg(ctx, DSPK_EDEVICE,
                            "%s %d was lost when %s:%d was reset after a fault",
                            i < op->nin ? "input" : "output",
                            i < op->nin ? i : i - op->nin, DRV->name, dev->index);
    if (t->mem && dspk__tensor_nbytes(t) > t->mem->size - t->offset)
      return dspk__gpurt_msg(ctx, DSPK_ERANGE, "%s %d lies outside its buffer",
                            i < op->nin ? "input" : "output",
                            i < op->nin ? i : i - op->nin);
  }
  /* Retired blocks return to the pool when an allocation needs them
   * (dspk__gpurt_tmp_alloc), on every push and on sync; a task drains the
   * queue only once it is half full.  An event query costs about 1 us on
   * the H200 host, 5% of a small contraction's host time (the eviction
   * trace in docs/performance.md). */
  if (dev->retire.n >= dev->retire.cap / 2)
    dspk__retire_drain(&dev->retire);
  dev->stage.work_queued = 1;
  return dspk__gpurt_run(dev, op, ctx);
}

void dspk__gpurt_stats(struct dspk__dev *dev, struct dspk__devstats *out) {
  dspk__pool_stats_fill(&dev->pool, out);
  dspk__retire_stats_fill(&dev->retire, out);
  out->kernels_compiled = dev->kernels_compiled;
  out->kernel_cache_hits = dev->kernel_cache_hits;
}

void dspk__gpurt_caps(struct dspk__dev *dev, struct dspk__devcaps *out) {
  /* The ops of ops.c's switch (dspk__gpurt_run): a new op is the cpu's
   * until its case is written and added here. */
  dspk__caps_add_ops(out, DSPK__CAPS_OP(GEMM) | DSPK__CAPS_OP(FFT) | DSPK__CAPS_OP(FIR) |
                              DSPK__CAPS_OP(CONTRACT) | DSPK__CAPS_OP(REDUCE) |
                              DSPK__CAPS_OP(MAP));
  if (!dev->blas || dev->own_kernels)
    out->dtypes[DSPK_OP_GEMM] &= ~((1u << DSPK_F16) | (1u << DSPK_BF16));
  dspk__caps_add_lang(out, DRV->lang);
}

/* ---- hooks ------------------------------------------------------------- */

void dspk__gpurt_set_sync_on_evict(struct dspk__dev *dev, int on) {
  dev->sync_on_evict = on;
}
void dspk__gpurt_set_own_kernels(struct dspk__dev *dev, int on) { dev->own_kernels = on; }
void dspk__gpurt_set_gemm_small(struct dspk__dev *dev, int64_t madds) {
  dev->gemm_small = madds;
}
void dspk__gpurt_set_trace_events(struct dspk__dev *dev, dspk__gevent start, dspk__gevent end) {
  dev->trace_start = start;
  dev->trace_end = end;
}
uint64_t dspk__gpurt_contract_misses(struct dspk__dev *dev) {
  return dev->contract_plans.misses;
}
dspk__gstream dspk__gpurt_stream(struct dspk__dev *dev) { return dev->stream; }
void *dspk__gpurt_blas(struct dspk__dev *dev) { return dev->blas; }

