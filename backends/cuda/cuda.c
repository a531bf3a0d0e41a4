/*
 * The CUDA backend's table (backends/backend.h): probe, the device
 * lifecycle with fault recovery, memory through the caching pool, fences as
 * CUDA events, and the retirement queue wired to those events.
 *
 * Faults.  CUDA errors such as an illegal address are sticky for the whole
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

#include "backends/cuda/cuda_internal.h"

#define CU dspk__cu

/* ---- errors ----------------------------------------------------------- */

static int sticky(CUresult r) {
  switch (r) {
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_ASSERT:
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_CONTEXT_IS_DESTROYED:
  case CUDA_ERROR_ECC_UNCORRECTABLE:
  case CUDA_ERROR_UNKNOWN:
    return 1;
  default:
    return 0;
  }
}

int dspk__cuda_err(struct dspk__dev *dev, struct dspk__opctx *ctx,
                   const char *what, CUresult r) {
  const char *name = NULL, *text = NULL;
  char buf[256];
  if (CU.cuGetErrorName)
    CU.cuGetErrorName(r, &name);
  if (CU.cuGetErrorString)
    CU.cuGetErrorString(r, &text);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    snprintf(buf, sizeof(buf), "%s: out of device memory on cuda:%d", what,
             dev ? dev->index : -1);
    dspk__cuda_msg(ctx, DSPK_ENOMEM, "%s", buf);
    return DSPK_ENOMEM;
  }
  if (dev && sticky(r)) {
    snprintf(buf, sizeof(buf),
             "%s: %s (%s) on cuda:%d: the device faulted (a kernel accessed "
             "memory it does not own, or crashed); its context is reset, "
             "buffers on it are lost",
             what, name ? name : "CUDA error", text ? text : "?", dev->index);
    if (!dev->ctx_dead)
      dev->faults++;
    dev->ctx_dead = 1;
    snprintf(dev->fault, sizeof(dev->fault), "%s", buf);
  } else {
    snprintf(buf, sizeof(buf), "%s: %s (%s)", what, name ? name : "CUDA error",
             text ? text : "?");
  }
  dspk__cuda_msg(ctx, DSPK_EDEVICE, "%s", buf);
  return DSPK_EDEVICE;
}

/* ---- probe ------------------------------------------------------------- */

static struct {
  int n;
  CUdevice dev[DSPK__CUDA_MAX_DEVICES];
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  char driver_ver[32];
} g;

/* The kernel module's version from /proc ("580.95.05"), or "". */
static void nvidia_version(char *out, size_t len) {
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  char line[256];
  out[0] = 0;
  if (!f)
    return;
  /* "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
   * Release Build ...": the first token after "Module" that starts with a
   * digit. */
  if (fgets(line, sizeof(line), f)) {
    char *p = strstr(line, "Module");
    char *save = NULL, *tok;
    if (p) {
      for (tok = strtok_r(p, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
        if (tok[0] >= '0' && tok[0] <= '9') {
          snprintf(out, len, "%s", tok);
          break;
        }
    }
  }
  fclose(f);
}

static int cuda_probe(struct dspk__devinfo *info, int max, char *why,
                      size_t whylen) {
  CUresult r;
  int n = 0, drv = 0;
  char kmod[32];
  if (why && whylen)
    why[0] = 0;
  g.n = 0;
  if (dspk__cuda_load_driver(why, whylen) != 0)
    return 0;
  r = CU.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    CU.cuGetErrorName(r, &name);
    if (r == CUDA_ERROR_NO_DEVICE)
      snprintf(why, whylen, "no CUDA device (cuInit: %s)", name);
    else if (r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH || r == (CUresult)35 /* INSUFFICIENT_DRIVER */ ||
             r == CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER ||
             r == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
      snprintf(why, whylen, "driver too old for this CUDA (cuInit: %s)", name);
    else
      snprintf(why, whylen, "cuInit failed: %s", name);
    return 0;
  }
  CU.cuDriverGetVersion(&drv);
  if (drv < 11040) {
    snprintf(why, whylen, "driver too old: CUDA %d.%d, needs 11.4 or newer",
             drv / 1000, drv % 1000 / 10);
    return 0;
  }
  if (CU.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
    snprintf(why, whylen, "no CUDA device");
    return 0;
  }
  nvidia_version(kmod, sizeof(kmod));
  snprintf(g.driver_ver, sizeof(g.driver_ver), "%d.%d", drv / 1000,
           drv % 1000 / 10);
  if (n > DSPK__CUDA_MAX_DEVICES)
    n = DSPK__CUDA_MAX_DEVICES;
  for (int i = 0; i < n; i++) {
    struct dspk__devinfo *d = &g.info[i];
    int maj = 0, min = 0;
    size_t mem = 0;
    CUuuid u;
    memset(d, 0, sizeof(*d));
    CU.cuDeviceGet(&g.dev[i], i);
    CU.cuDeviceGetName(d->name, sizeof(d->name), g.dev[i]);
    CU.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                            g.dev[i]);
    CU.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                            g.dev[i]);
    CU.cuDeviceTotalMem(&mem, g.dev[i]);
    snprintf(d->type, sizeof(d->type), "discrete");
    snprintf(d->arch, sizeof(d->arch), "sm_%d%d", maj, min);
    if (kmod[0])
      snprintf(d->driver, sizeof(d->driver), "%.24s (CUDA %.24s)", kmod, g.driver_ver);
    else
      snprintf(d->driver, sizeof(d->driver), "CUDA %.24s", g.driver_ver);
    if (CU.cuDeviceGetUuid(&u, g.dev[i]) == CUDA_SUCCESS) {
      const unsigned char *b = (const unsigned char *)u.bytes;
      snprintf(d->uuid, sizeof(d->uuid),
               "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
               b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
               b[11], b[12], b[13], b[14], b[15]);
    }
    d->memory = mem;
  }
  g.n = n;
  /* The toolkit libraries are optional: ops that need a missing one fail
   * with ENOTSUP and the library's name.  Loading them here, once, keeps
   * their start-up cost out of every task. */
  dspk__cuda_load_nvrtc(NULL, 0);
  dspk__cuda_load_cublas(NULL, 0);
  dspk__cuda_load_cufft(NULL, 0);
  for (int i = 0; i < n && i < max; i++)
    info[i] = g.info[i];
  return n;
}

static void cuda_shutdown(void) {
  g.n = 0;
  dspk__cuda_unload();
}

/* ---- fences ------------------------------------------------------------ */

static int fence_record(struct dspk__dev *dev, struct dspk__fence **out) {
  struct dspk__fence *f;
  CUevent ev;
  CUresult r;
  if (dev->ctx_dead)
    return DSPK_EDEVICE;
  f = malloc(sizeof(*f));
  if (!f)
    return DSPK_ENOMEM;
  if (dev->nspare > 0) {
    ev = dev->spare[--dev->nspare];
  } else if ((r = CU.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
    free(f);
    return dspk__cuda_err(dev, NULL, "cuEventCreate", r);
  }
  if ((r = CU.cuEventRecord(ev, dev->stream)) != CUDA_SUCCESS) {
    CU.cuEventDestroy(ev);
    free(f);
    return dspk__cuda_err(dev, NULL, "cuEventRecord", r);
  }
  f->ev = ev;
  f->gen = dev->gen;
  *out = f;
  return 0;
}

static int fence_query(struct dspk__dev *dev, struct dspk__fence *f) {
  CUresult r;
  if (f->gen != dev->gen)
    return 1; /* its context is gone, and with it all its work */
  r = CU.cuEventQuery(f->ev);
  if (r == CUDA_SUCCESS)
    return 1;
  if (r == CUDA_ERROR_NOT_READY)
    return 0;
  return dspk__cuda_err(dev, NULL, "cuEventQuery", r);
}

static int fence_wait(struct dspk__dev *dev, struct dspk__fence *f) {
  CUresult r;
  if (f->gen != dev->gen)
    return 0;
  r = CU.cuEventSynchronize(f->ev);
  return r == CUDA_SUCCESS ? 0 : dspk__cuda_err(dev, NULL, "cuEventSynchronize", r);
}

static void fence_destroy(struct dspk__dev *dev, struct dspk__fence *f) {
  if (!f)
    return;
  if (f->gen == dev->gen && !dev->ctx_dead) {
    if (dev->nspare < (int)(sizeof(dev->spare) / sizeof(dev->spare[0])))
      dev->spare[dev->nspare++] = f->ev;
    else
      CU.cuEventDestroy(f->ev);
  }
  free(f);
}

static int stream_sync(struct dspk__dev *dev) {
  CUresult r;
  if (dev->ctx_dead)
    return DSPK_EDEVICE;
  r = CU.cuStreamSynchronize(dev->stream);
  if (r == CUDA_SUCCESS)
    dev->stage.work_queued = 0;
  return r == CUDA_SUCCESS ? 0 : dspk__cuda_err(dev, NULL, "cuStreamSynchronize", r);
}

/* The backend table's fences: the daemon answers a task once its fence
 * completed, so a fence whose context was rebuilt after a fault reports the
 * loss of its work (EDEVICE) rather than "reached". */
static int table_fence_query(struct dspk__dev *dev, struct dspk__fence *f) {
  if (f->gen != dev->gen)
    return DSPK_EDEVICE;
  return fence_query(dev, f);
}
static int table_fence_wait(struct dspk__dev *dev, struct dspk__fence *f) {
  if (f->gen != dev->gen)
    return DSPK_EDEVICE;
  return fence_wait(dev, f);
}

/* The retirement queue's view of the same fences: a fence of a context
 * that is gone counts as reached (its work, and the memory, went with it). */
static int rq_record(void *ud, void **f) {
  return fence_record(ud, (struct dspk__fence **)f);
}
static int rq_query(void *ud, void *f) { return fence_query(ud, f); }
static int rq_wait(void *ud, void *f) { return fence_wait(ud, f); }
static void rq_destroy(void *ud, void *f) { fence_destroy(ud, f); }
static int rq_barrier(void *ud) { return stream_sync(ud); }
static const struct dspk__retire_ops retire_ops = {rq_record, rq_query, rq_wait,
                                                   rq_destroy, rq_barrier};

void dspk__cuda_retire(struct dspk__dev *dev, dspk__retire_release_fn fn,
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
  CUdeviceptr p;
  CUresult r = CU.cuMemAlloc(&p, n);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return DSPK_ENOMEM;
  if (r != CUDA_SUCCESS)
    return dspk__cuda_err(dev, NULL, "cuMemAlloc", r);
  *h = (uint64_t)p;
  return 0;
}

static void raw_free(void *ud, uint64_t h) {
  struct dspk__dev *dev = ud;
  if (!dev->ctx_dead)
    CU.cuMemFree((CUdeviceptr)h);
}

static const struct dspk__pool_ops pool_ops = {raw_alloc, raw_free};

int dspk__cuda_tmp_alloc(struct dspk__dev *dev, size_t n,
                         struct dspk__pool_block **out) {
  dspk__retire_drain(&dev->retire);
  return dspk__pool_get(&dev->pool, n ? n : 1, out);
}

void dspk__cuda_tmp_free(struct dspk__dev *dev, struct dspk__pool_block *b) {
  if (b)
    dspk__cuda_retire(dev, dspk__pool_put_cb, &dev->pool, b);
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
#define STAGE_READ_DIRECT ((size_t)4 << 20)   /* see dspk__cuda_stage_read */
#define STAGE_WRITE_DIRECT ((size_t)1 << 20)  /* on an idle stream, see dspk__cuda_stage_write */

/* Waits for every copy still using a chunk, then frees the ring.  With a
 * dead context nothing can be waited for: the memory goes with the reset
 * that follows (cuDevicePrimaryCtxReset). */
static void stage_free(struct dspk__dev *dev) {
  struct dspk__cuda_stage *s = &dev->stage;
  int dead = dev->ctx_dead;
  for (int i = 0; i < s->n; i++) {
    if (s->busy[i] && !dead && CU.cuEventSynchronize(s->ev[i]) != CUDA_SUCCESS)
      dead = 1;
    s->busy[i] = 0;
  }
  for (int i = 0; i < s->n; i++)
    if (s->ev[i] && !dev->ctx_dead)
      CU.cuEventDestroy(s->ev[i]);
  /* A broken ring may still be read by a DMA without an event: only a
   * finished stream makes it safe to free. */
  if (s->host && !dead && (!s->broken || CU.cuStreamSynchronize(dev->stream) == CUDA_SUCCESS))
    CU.cuMemFreeHost(s->host);
  memset(s, 0, sizeof(*s));
}

/* Allocates a ring of n chunks of chunk bytes (n 0: none).  On failure the
 * ring stays off and the error is returned (open ignores it: copies then
 * go from pageable memory, slower but correct). */
static int stage_alloc(struct dspk__dev *dev, int n, size_t chunk) {
  struct dspk__cuda_stage *s = &dev->stage;
  void *p = NULL;
  CUresult r;
  int rc = 0;
  memset(s, 0, sizeof(*s));
  if (n <= 0)
    return 0;
  if (n < 2 || n > DSPK__CUDA_STAGE_MAX || chunk < 4096 || chunk > ((size_t)1 << 30))
    return DSPK_EINVAL;
  chunk = (chunk + 4095) & ~(size_t)4095;
  if ((r = CU.cuMemHostAlloc(&p, (size_t)n * chunk, 0)) != CUDA_SUCCESS)
    return dspk__cuda_err(dev, NULL, "cuMemHostAlloc", r);
  for (int i = 0; i < n; i++) {
    if ((r = CU.cuEventCreate(&s->ev[i], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
      rc = dspk__cuda_err(dev, NULL, "cuEventCreate", r);
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
      CU.cuEventDestroy(s->ev[i]);
  CU.cuMemFreeHost(p);
  memset(s, 0, sizeof(*s));
  return rc;
}

/* Takes the next chunk of the ring, waiting until the copy that used it
 * last has finished.  Writes its index.  0 or a dspk_errno. */
static int stage_take(struct dspk__dev *dev, int *idx) {
  struct dspk__cuda_stage *s = &dev->stage;
  int i = s->next;
  if (s->busy[i]) {
    CUresult r = CU.cuEventQuery(s->ev[i]);
    if (r == CUDA_ERROR_NOT_READY) {
      s->waits++;
      r = CU.cuEventSynchronize(s->ev[i]);
    }
    if (r != CUDA_SUCCESS)
      return dspk__cuda_err(dev, NULL, "cuEventSynchronize (staging)", r);
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
  struct dspk__cuda_stage *s = &dev->stage;
  CUresult r = CU.cuEventRecord(s->ev[i], dev->stream);
  if (r == CUDA_SUCCESS) {
    s->busy[i] = 1;
    return 0;
  }
  if (CU.cuStreamSynchronize(dev->stream) != CUDA_SUCCESS)
    s->broken = 1;
  return dspk__cuda_err(dev, NULL, "cuEventRecord (staging)", r);
}

static int stage_on(const struct dspk__dev *dev) {
  return dev->stage.host && !dev->stage.broken;
}

/* ---- client mappings pinned for DMA (shared-memory buffers) ---------------- */

/* Why register here, where the staging comment above argues against it:
 * a shared buffer's mapping lives as long as the buffer and is copied
 * around every task that uses it, so the one-time pinning pays back at the
 * first copy, and its copies then need no staging memcpy at all. */
static int host_pinned(const struct dspk__dev *dev, const void *p, size_t n) {
  for (size_t i = 0; i < dev->nhostreg; i++)
    if ((const char *)p >= (const char *)dev->hostreg[i].p &&
        n <= dev->hostreg[i].n &&
        (size_t)((const char *)p - (const char *)dev->hostreg[i].p) <= dev->hostreg[i].n - n)
      return 1;
  return 0;
}

int dspk__cuda_host_register(struct dspk__dev *dev, void *p, size_t n) {
  CUresult r;
  if (dev->nhostreg == dev->caphostreg) {
    size_t cap = dev->caphostreg ? 2 * dev->caphostreg : 8;
    void *nr = realloc(dev->hostreg, cap * sizeof(*dev->hostreg));
    if (!nr)
      return DSPK_ENOMEM;
    dev->hostreg = nr;
    dev->caphostreg = cap;
  }
  if ((r = CU.cuMemHostRegister(p, n, 0)) != CUDA_SUCCESS)
    return dspk__cuda_err(dev, NULL, "cuMemHostRegister", r);
  dev->hostreg[dev->nhostreg].p = p;
  dev->hostreg[dev->nhostreg].n = n;
  dev->nhostreg++;
  return 0;
}

void dspk__cuda_host_unregister(struct dspk__dev *dev, void *p) {
  for (size_t i = 0; i < dev->nhostreg; i++)
    if (dev->hostreg[i].p == p) {
      /* A copy still queued may read or fill the pages. */
      if (!dev->ctx_dead && CU.cuStreamSynchronize(dev->stream) == CUDA_SUCCESS)
        CU.cuMemHostUnregister(p);
      dev->hostreg[i] = dev->hostreg[--dev->nhostreg];
      if (dev->nhostreg == 0) {
        free(dev->hostreg);
        dev->hostreg = NULL;
        dev->caphostreg = 0;
      }
      return;
    }
}

int dspk__cuda_stage_write(struct dspk__dev *dev, CUdeviceptr dst,
                           const void *src, size_t n) {
  struct dspk__cuda_stage *s = &dev->stage;
  const unsigned char *p = src;
  CUresult r;
  int rc;
  if (n == 0)
    return 0;
  /* A pinned client mapping: DMA straight from it, asynchronously. */
  if (dev->nhostreg && host_pinned(dev, src, n)) {
    r = CU.cuMemcpyHtoDAsync(dst, src, n, dev->stream);
    return r == CUDA_SUCCESS ? 0 : dspk__cuda_err(dev, NULL, "cuMemcpyHtoDAsync", r);
  }
  /* A copy from pageable memory makes the driver synchronize the stream
   * first: free when the stream holds no ops (only copies, or nothing), and
   * then the driver's own staged copy is the faster one for large writes (a
   * gemm 1024^2 task on an idle H200: 0.98 ms pageable vs 1.32 ms through
   * the ring).  While ops are queued, the ring keeps them running. */
  if (stage_on(dev) && n >= STAGE_WRITE_DIRECT && dev->stage.work_queued &&
      CU.cuStreamQuery(dev->stream) == CUDA_SUCCESS)
    dev->stage.work_queued = 0;
  if (!stage_on(dev) || (n >= STAGE_WRITE_DIRECT && !dev->stage.work_queued)) {
    r = CU.cuMemcpyHtoDAsync(dst, src, n, dev->stream);
    return r == CUDA_SUCCESS ? 0 : dspk__cuda_err(dev, NULL, "cuMemcpyHtoDAsync", r);
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
    if ((r = CU.cuMemcpyHtoDAsync(dst, h, k, dev->stream)) != CUDA_SUCCESS)
      return dspk__cuda_err(dev, NULL, "cuMemcpyHtoDAsync", r);
    if ((rc = stage_mark(dev, i)))
      return rc;
    s->chunks_h2d++;
    p += k;
    dst += k;
    n -= k;
  }
  return 0;
}

int dspk__cuda_stage_read(struct dspk__dev *dev, void *dst, CUdeviceptr src,
                          size_t n) {
  struct dspk__cuda_stage *s = &dev->stage;
  unsigned char *p = dst;
  size_t issued = 0, done = 0;
  /* The chunks of this read in flight, oldest first: ring order, so the
   * oldest is always (first + k) % s->n. */
  int first = s->next, inflight = 0;
  CUresult r;
  int rc;
  /* Reads from STAGE_READ_DIRECT up go straight to the caller's pageable
   * memory: a read waits for its data either way, and on the H200 the
   * driver's own pipelined copy measured 12-15 GB/s there against 8.5-11
   * through the ring (bench/cuda_staging); below it the ring is faster
   * (13 vs 7.7 GB/s at 1 MiB).  Writes use the ring unless the stream is
   * idle (see dspk__cuda_stage_write). */
  if (!stage_on(dev) || n >= STAGE_READ_DIRECT ||
      (dev->nhostreg && host_pinned(dev, dst, n))) { /* pinned mapping: DMA into it */
    if (n > 0 && (r = CU.cuMemcpyDtoHAsync(dst, src, n, dev->stream)) != CUDA_SUCCESS)
      return dspk__cuda_err(dev, NULL, "cuMemcpyDtoHAsync", r);
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
      r = CU.cuMemcpyDtoHAsync(s->host + (size_t)i * s->chunk, src + issued, k, dev->stream);
      if (r != CUDA_SUCCESS)
        return dspk__cuda_err(dev, NULL, "cuMemcpyDtoHAsync", r);
      if ((rc = stage_mark(dev, i)))
        return rc;
      s->chunks_d2h++;
      issued += k;
      inflight++;
    }
    {
      int i = first;
      size_t k = n - done < s->chunk ? n - done : s->chunk;
      if ((r = CU.cuEventSynchronize(s->ev[i])) != CUDA_SUCCESS)
        return dspk__cuda_err(dev, NULL, "cuEventSynchronize (staging)", r);
      s->busy[i] = 0;
      memcpy(p + done, s->host + (size_t)i * s->chunk, k);
      done += k;
      inflight--;
      first = (first + 1) % s->n;
    }
  }
  return 0;
}

int dspk__cuda_stage_config(struct dspk__dev *dev, int nchunks, size_t chunk) {
  stage_free(dev);
  return stage_alloc(dev, nchunks, chunk);
}

/* ---- device setup and teardown ------------------------------------------- */

static unsigned env_uint(const char *name, unsigned dflt) {
  const char *s = getenv(name);
  if (s && *s) {
    long v = strtol(s, NULL, 10);
    if (v > 0 && v < 4096)
      return (unsigned)v;
  }
  return dflt;
}

/* Builds everything that lives in a context.  Returns 0 or a dspk_errno. */
static int setup(struct dspk__dev *dev) {
  CUresult r;
  int rc;
  if ((r = CU.cuDevicePrimaryCtxRetain(&dev->ctx, dev->cudev)) != CUDA_SUCCESS)
    return dspk__cuda_err(NULL, NULL, "cuDevicePrimaryCtxRetain", r);
  if ((r = CU.cuCtxSetCurrent(dev->ctx)) != CUDA_SUCCESS) {
    rc = dspk__cuda_err(NULL, NULL, "cuCtxSetCurrent", r);
    goto err_ctx;
  }
  if ((r = CU.cuStreamCreate(&dev->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    rc = dspk__cuda_err(NULL, NULL, "cuStreamCreate", r);
    goto err_ctx;
  }
  dev->ctx_dead = 0;
  dspk__pool_init(&dev->pool, &pool_ops, dev, 0);
  if ((rc = dspk__retire_init(&dev->retire, &retire_ops, dev,
                              env_uint("DSPK_CUDA_RETIRE_CAPACITY", 0))))
    goto err_stream;
  if ((rc = dspk__plancache_init(&dev->fft_plans, 16, dspk__cuda_fft_plan_evict, dev)))
    goto err_retire;
  if ((rc = dspk__plancache_init(&dev->contract_plans,
                                 env_uint("DSPK_CUDA_PLAN_CACHE", 16),
                                 dspk__cuda_contract_plan_evict, dev)))
    goto err_fft;
  if ((rc = dspk__plancache_init(&dev->raw_modules, 32, dspk__cuda_raw_module_evict, dev)))
    goto err_contract;
  if (dspk__cublas.lib) {
    cublasStatus_t s = dspk__cublas.cublasCreate(&dev->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
      dev->blas = NULL;
    } else {
      dspk__cublas.cublasSetStream(dev->blas, dev->stream);
      if (dspk__pool_get(&dev->pool, DSPK__CUDA_BLAS_WORKSPACE, &dev->blas_ws) == 0)
        dspk__cublas.cublasSetWorkspace(dev->blas, (void *)(uintptr_t)dev->blas_ws->handle,
                                        dev->blas_ws->size);
    }
  }
  /* At open, not on first use: pinning 32 MiB takes milliseconds that the
   * first task of a client should not pay.  Without it copies still work
   * (from pageable memory), so a failure is not fatal. */
  {
    const char *e = getenv("DSPK_CUDA_STAGE_CHUNKS");
    int n = e && *e ? (int)strtol(e, NULL, 10) : STAGE_CHUNKS_DEFAULT;
    size_t kib = env_uint("DSPK_CUDA_STAGE_CHUNK_KIB", (unsigned)(STAGE_CHUNK_DEFAULT >> 10));
    if (n < 0 || n > DSPK__CUDA_STAGE_MAX)
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
  CU.cuStreamDestroy(dev->stream);
err_ctx:
  CU.cuDevicePrimaryCtxRelease(dev->cudev);
  return rc;
}

/* The ordered teardown of issue 5: synchronize, drain the retirement queue
 * (waiting on each event), free the pool and the pinned staging ring (after
 * the events of its last copies), unload modules, destroy library handles
 * and streams, release the context.  With a dead context nothing
 * waits: the reset that follows frees the device side. */
static void teardown(struct dspk__dev *dev) {
  int dead = dev->ctx_dead;
  dspk__cuda_worker_stop(dev);
  if (!dead)
    CU.cuStreamSynchronize(dev->stream);
  /* Plans hand their workspaces to the queue first. */
  dspk__plancache_fini(&dev->fft_plans);
  dspk__plancache_fini(&dev->contract_plans);
  dspk__plancache_fini(&dev->raw_modules);
  if (dev->blas)
    dspk__cublas.cublasSetWorkspace(dev->blas, NULL, 0);
  if (dev->blas_ws) {
    dspk__cuda_retire(dev, dspk__pool_put_cb, &dev->pool, dev->blas_ws);
    dev->blas_ws = NULL;
  }
  if (dead)
    dspk__retire_abandon(&dev->retire);
  dspk__retire_fini(&dev->retire);
  dspk__pool_fini(&dev->pool);
  stage_free(dev);
  dspk__cuda_modules_unload(dev);
  if (dev->blas) {
    dspk__cublas.cublasDestroy(dev->blas);
    dev->blas = NULL;
  }
  while (dev->nspare > 0) {
    CUevent ev = dev->spare[--dev->nspare];
    if (!dead)
      CU.cuEventDestroy(ev);
  }
  if (!dead)
    CU.cuStreamDestroy(dev->stream);
  dev->stream = NULL;
  CU.cuDevicePrimaryCtxRelease(dev->cudev);
  if (dead)
    CU.cuDevicePrimaryCtxReset(dev->cudev);
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
  return dspk__cuda_msg(ctx, DSPK_EDEVICE,
                        "%s; CUDA cannot recover from this inside a process: restart "
                        "dspkd", dev->fault);
}

static int cuda_open(int index, const struct dspk__devenv *env,
                     struct dspk__dev **out) {
  struct dspk__dev *dev;
  int rc;
  if (index < 0 || index >= g.n)
    return DSPK_ENODEV;
  dev = calloc(1, sizeof(*dev));
  if (!dev)
    return DSPK_ENOMEM;
  dev->index = index;
  dev->worker_fd = -1;
  dev->cudev = g.dev[index];
  dev->info = g.info[index];
  if (env)
    dev->env = *env;
  snprintf(dev->arch, sizeof(dev->arch), "%s", dev->info.arch);
  snprintf(dev->driver_ver, sizeof(dev->driver_ver), "%s", g.driver_ver);
  if (dspk__nvrtc.lib)
    snprintf(dev->nvrtc_ver, sizeof(dev->nvrtc_ver), "%d.%d", dspk__nvrtc.major,
             dspk__nvrtc.minor);
  CU.cuDeviceGetAttribute(&dev->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                          dev->cudev);
  if (dev->sms <= 0)
    dev->sms = 16;
  dev->gen = 1;
  if ((rc = setup(dev))) {
    free(dev);
    return rc;
  }
  *out = dev;
  return 0;
}

static void cuda_close(struct dspk__dev *dev) {
  if (!dev)
    return;
  teardown(dev);
  free(dev->hostreg); /* the daemon unregisters before it closes; never left */
  free(dev);
}

/* ---- memory ------------------------------------------------------------ */

static int cuda_alloc(struct dspk__dev *dev, size_t n, struct dspk__mem **out) {
  struct dspk__mem *m;
  int rc;
  if ((rc = ready(dev, NULL)))
    return rc;
  m = calloc(1, sizeof(*m));
  if (!m)
    return DSPK_ENOMEM;
  if ((rc = dspk__cuda_tmp_alloc(dev, n, &m->blk))) {
    free(m);
    return rc;
  }
  m->ptr = (CUdeviceptr)m->blk->handle;
  m->size = n;
  m->gen = dev->gen;
  *out = m;
  return 0;
}

static void cuda_free(struct dspk__dev *dev, struct dspk__mem *m) {
  if (!m)
    return;
  if (m->gen == dev->gen)
    dspk__cuda_tmp_free(dev, m->blk);
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

static int cuda_write(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                      const void *src, size_t n) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = check_mem(dev, m, off, n)))
    return rc;
  return dspk__cuda_stage_write(dev, m->ptr + off, src, n);
}

static int cuda_read(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                     void *dst, size_t n) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = check_mem(dev, m, off, n)))
    return rc;
  if ((rc = dspk__cuda_stage_read(dev, dst, m->ptr + off, n)))
    return rc;
  dspk__retire_drain(&dev->retire);
  return 0;
}

static int cuda_host_register(struct dspk__dev *dev, void *ptr, size_t n) {
  int rc = ready(dev, NULL);
  return rc ? rc : dspk__cuda_host_register(dev, ptr, n);
}

static void cuda_host_unregister(struct dspk__dev *dev, void *ptr) {
  dspk__cuda_host_unregister(dev, ptr); /* a dead context: only forgotten */
}

static int cuda_fence_record(struct dspk__dev *dev, struct dspk__fence **out) {
  int rc = ready(dev, NULL);
  return rc ? rc : fence_record(dev, out);
}

static int cuda_sync(struct dspk__dev *dev) {
  int rc;
  if ((rc = ready(dev, NULL)) || (rc = stream_sync(dev)))
    return rc;
  dspk__retire_drain(&dev->retire);
  return 0;
}

/* ---- ops --------------------------------------------------------------- */

static int cuda_run(struct dspk__dev *dev, struct dspk__op *op,
                    struct dspk__opctx *ctx) {
  int rc;
  if ((rc = ready(dev, ctx)))
    return rc;
  for (int i = 0; i < op->nin + op->nout; i++) {
    const struct dspk__tensor *t = i < op->nin ? &op->in[i] : &op->out[i - op->nin];
    if (t->mem && t->mem->gen != dev->gen)
      return dspk__cuda_msg(ctx, DSPK_EDEVICE,
                            "%s %d was lost when cuda:%d was reset after a fault",
                            i < op->nin ? "input" : "output",
                            i < op->nin ? i : i - op->nin, dev->index);
    if (t->mem && dspk__tensor_nbytes(t) > t->mem->size - t->offset)
      return dspk__cuda_msg(ctx, DSPK_ERANGE, "%s %d lies outside its buffer",
                            i < op->nin ? "input" : "output",
                            i < op->nin ? i : i - op->nin);
  }
  dspk__retire_drain(&dev->retire);
  dev->stage.work_queued = 1;
  return dspk__cuda_run(dev, op, ctx);
}

static void cuda_stats(struct dspk__dev *dev, struct dspk__devstats *out) {
  dspk__pool_stats_fill(&dev->pool, out);
  dspk__retire_stats_fill(&dev->retire, out);
  out->kernels_compiled = dev->kernels_compiled;
  out->kernel_cache_hits = dev->kernel_cache_hits;
}

/* ---- hooks ------------------------------------------------------------- */

void dspk__cuda_set_sync_on_evict(struct dspk__dev *dev, int on) {
  dev->sync_on_evict = on;
}
void dspk__cuda_set_trace_events(struct dspk__dev *dev, CUevent start, CUevent end) {
  dev->trace_start = start;
  dev->trace_end = end;
}
CUstream dspk__cuda_stream(struct dspk__dev *dev) { return dev->stream; }
cublasHandle_t dspk__cuda_blas(struct dspk__dev *dev) { return dev->blas; }

const struct dspk__backend dspk__backend_cuda = {
    .name = "cuda",
    .probe = cuda_probe,
    .shutdown = cuda_shutdown,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .write = cuda_write,
    .read = cuda_read,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .fence_record = cuda_fence_record,
    .fence_query = table_fence_query,
    .fence_wait = table_fence_wait,
    .fence_destroy = fence_destroy,
    .sync = cuda_sync,
    .run = cuda_run,
    .stats = cuda_stats,
};
