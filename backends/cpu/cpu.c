/*
 * The cpu backend's table: probe, device open/close, host memory, fences and
 * the op dispatcher.  The cpu is one device, "cpu:0", on which every op runs
 * synchronously on the runner thread through OpenBLAS and FFTW (one file per
 * op in this folder), so its fences are complete as soon as they are
 * recorded and free() releases memory at once.  It implements the whole
 * interface of backends/backend.h, which lets the daemon exercise every path
 * without a GPU.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fftw3.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/tune.h"

int dspk__cpu_err(struct dspk__opctx *ctx, int code, const char *fmt, ...) {
  if (ctx && ctx->errmsg && ctx->errmsg_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, ctx->errmsg_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

int dspk__cpu_canceled(const struct dspk__opctx *ctx) {
  return ctx && ctx->cancel && atomic_load_explicit(ctx->cancel, memory_order_relaxed);
}

/* Reads "model name" from /proc/cpuinfo into buf; "" when absent. */
static void cpu_model(char *buf, size_t len) {
  buf[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    char *p = strchr(line, ':');
    if (!p)
      continue;
    p++;
    while (*p == ' ' || *p == '\t')
      p++;
    size_t n = strcspn(p, "\n");
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
      n--;
    if (n >= len)
      n = len - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    break;
  }
  fclose(f);
}

static int cpu_probe(struct dspk__devinfo *info, int max, char *why,
                     size_t whylen) {
  (void)why;
  (void)whylen;
  if (max < 1)
    return 1;
  struct dspk__devinfo d;
  memset(&d, 0, sizeof d);
  char model[96]; /* name[128] fits "cpu (" + 80 of it + ", N threads)" */
  cpu_model(model, sizeof model);
  long threads = sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1)
    threads = 1;
  snprintf(d.name, sizeof d.name, "cpu (%.80s, %ld thread%s)",
           model[0] ? model : "unknown model", threads, threads == 1 ? "" : "s");
  snprintf(d.type, sizeof d.type, "cpu");
  struct utsname u;
  if (uname(&u) == 0)
    snprintf(d.arch, sizeof d.arch, "%.31s", u.machine);
  /* FFTW's version string ("fftw-3.3.10-sse2-avx"): wisdom is keyed by it. */
  snprintf(d.driver, sizeof d.driver, "%.63s", fftw_version);
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && psize > 0)
    d.memory = (uint64_t)pages * (uint64_t)psize;
  info[0] = d;
  return 1;
}

static int cpu_open(int index, const struct dspk__devenv *env,
                    struct dspk__dev **out) {
  if (index != 0)
    return DSPK_ENODEV;
  struct dspk__dev *dev = calloc(1, sizeof *dev);
  if (!dev)
    return DSPK_ENOMEM;
  if (env)
    dev->env = *env;
  dev->fir_force = -1;
  /* Stored FFTW wisdom makes FFTW_MEASURE plans quick; without it they are
   * measured again, so a failure here is not fatal. */
  dspk__cpu_tune_wisdom_load(dev);
  /* OpenBLAS's workers, started when the library was loaded, would spin
   * through the first task after a daemon start (on a 2-core machine one
   * core, ~90 ms of cpu time during a warm first fft): stop them; a gemm
   * starts them again. */
  dspk__cpu_blas_idle();
  *out = dev;
  return 0;
}

static void cpu_close(struct dspk__dev *dev) {
  if (!dev)
    return;
  dspk__cpu_fft_release(dev);
  free(dev);
}

static int cpu_alloc(struct dspk__dev *dev, size_t n, struct dspk__mem **out) {
  if (n > SIZE_MAX - 128)
    return DSPK_ENOMEM;
  struct dspk__mem *m = malloc(sizeof *m);
  if (!m)
    return DSPK_ENOMEM;
  size_t rounded = (n + 63) & ~(size_t)63;
  if (rounded == 0)
    rounded = 64;
  m->ptr = aligned_alloc(64, rounded);
  if (!m->ptr) {
    free(m);
    return DSPK_ENOMEM;
  }
  m->size = n;
  dev->bytes_in_use += n;
  *out = m;
  return 0;
}

static void cpu_free(struct dspk__dev *dev, struct dspk__mem *mem) {
  if (!mem)
    return;
  dev->bytes_in_use -= mem->size;
  free(mem->ptr);
  free(mem);
}

static int cpu_write(struct dspk__dev *dev, struct dspk__mem *mem, size_t off,
                     const void *src, size_t n) {
  (void)dev;
  if (off > mem->size || n > mem->size - off)
    return DSPK_ERANGE;
  if (n)
    memcpy((char *)mem->ptr + off, src, n);
  return 0;
}

static int cpu_read(struct dspk__dev *dev, struct dspk__mem *mem, size_t off,
                    void *dst, size_t n) {
  (void)dev;
  if (off > mem->size || n > mem->size - off)
    return DSPK_ERANGE;
  if (n)
    memcpy(dst, (char *)mem->ptr + off, n);
  return 0;
}

/* Every fence is the same, already reached point: ops run synchronously. */
struct dspk__fence {
  int unused;
};
static struct dspk__fence cpu_done_fence;

static int cpu_fence_record(struct dspk__dev *dev, struct dspk__fence **out) {
  (void)dev;
  *out = &cpu_done_fence;
  return 0;
}

static int cpu_fence_query(struct dspk__dev *dev, struct dspk__fence *f) {
  (void)dev;
  (void)f;
  return 1;
}

static int cpu_fence_wait(struct dspk__dev *dev, struct dspk__fence *f) {
  (void)dev;
  (void)f;
  return 0;
}

static void cpu_fence_destroy(struct dspk__dev *dev, struct dspk__fence *f) {
  (void)dev;
  (void)f;
}

static int cpu_sync(struct dspk__dev *dev) {
  (void)dev;
  return 0;
}

static int cpu_run(struct dspk__dev *dev, struct dspk__op *op,
                   struct dspk__opctx *ctx) {
  if (dspk__cpu_canceled(ctx))
    return DSPK_ECANCELED;
  switch (op->kind) {
  case DSPK_OP_GEMM: return dspk__cpu_gemm(dev, op, ctx);
  case DSPK_OP_FFT: return dspk__cpu_fft(dev, op, ctx);
  case DSPK_OP_FIR: return dspk__cpu_fir(dev, op, ctx);
  case DSPK_OP_CONTRACT: return dspk__cpu_contract(dev, op, ctx);
  case DSPK_OP_REDUCE: return dspk__cpu_reduce(dev, op, ctx);
  case DSPK_OP_MAP: return dspk__cpu_map(dev, op, ctx);
  case DSPK_OP_KERNEL:
    return dspk__cpu_err(ctx, DSPK_ENOTSUP,
                         "kernel: the cpu backend runs no raw kernels");
  default:
    return dspk__cpu_err(ctx, DSPK_ENOTSUP, "cpu: unknown op %d", (int)op->kind);
  }
}

static void cpu_stats(struct dspk__dev *dev, struct dspk__devstats *out) {
  memset(out, 0, sizeof *out);
  out->pool_bytes_in_use = dev->bytes_in_use;
  out->kernels_compiled = dev->plans_made; /* FFTW plans made */
  out->kernel_cache_hits = dev->plan_hits; /* FFTW plans reused */
}

const struct dspk__backend dspk__backend_cpu = {
    .name = "cpu",
    .probe = cpu_probe,
    .shutdown = NULL,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .write = cpu_write,
    .read = cpu_read,
    .fence_record = cpu_fence_record,
    .fence_query = cpu_fence_query,
    .fence_wait = cpu_fence_wait,
    .fence_destroy = cpu_fence_destroy,
    .sync = cpu_sync,
    .run = cpu_run,
    .stats = cpu_stats,
};
