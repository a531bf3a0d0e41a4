/*
 * The cpu backend's table: probe, device open/close, host memory, fences and
 * the op dispatcher.  The cpu is one device, "cpu:0", on which every op runs
 * synchronously on the runner thread through OpenBLAS and FFTW (one file per
 * op in this folder), so its fences are complete as soon as they are
 * recorded and free() releases memory at once (large blocks go back to a
 * caching pool of huge-page mappings, see cpu_alloc).  It implements the whole
 * interface of backends/backend.h, which lets the daemon exercise every path
 * without a GPU.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fftw3.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/tune.h"
#include "proto/testhook.h"

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
  /* Test hook (proto/testhook.h): the host's RAM as these many bytes, so
   * that tests reach the bounds computed from it (max_memory's default)
   * without committing the test machine's memory. */
  const char *hook = DSPK_TEST_HOOK("DSPK_CPU_MEMORY");
  unsigned long long hv = 0;
  if (hook && sscanf(hook, "%llu", &hv) == 1 && hv > 0)
    d.memory = (uint64_t)hv;
  info[0] = d;
  return 1;
}

/*
 * Large blocks.  A fresh process touching a new 8 MiB buffer takes 2048
 * page faults (~2-3 us each on a VM), which is most of what the first large
 * task after a daemon start costs over the same task later.  So blocks of
 * DSPK__CPU_BIG_BLOCK and up are their own mappings, 2 MiB aligned and
 * advised MADV_HUGEPAGE (one fault per 2 MiB where transparent huge pages
 * are available; the advice is ignored elsewhere), kept after free in the
 * device's pool (backends/common/pool.c) for the next alloc of their size
 * class, up to DSPK__CPU_POOL_CACHED bytes.  The pool handle points to a
 * struct big_map.
 */
struct big_map {
  void *base; /* the 2 MiB aligned start */
  size_t len; /* mapped bytes, a multiple of 2 MiB */
};

static int big_alloc(void *ud, size_t n, uint64_t *handle) {
  (void)ud;
  const size_t huge = DSPK__CPU_BIG_BLOCK;
  if (n > SIZE_MAX - 2 * huge)
    return DSPK_ENOMEM;
  size_t len = (n + huge - 1) & ~(huge - 1);
  struct big_map *bm = malloc(sizeof *bm);
  if (!bm)
    return DSPK_ENOMEM;
  char *p = mmap(NULL, len + huge, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    free(bm);
    return DSPK_ENOMEM;
  }
  /* Keep the 2 MiB aligned part, unmap the rest. */
  char *a = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
  if (a > p)
    munmap(p, (size_t)(a - p));
  if ((size_t)(a - p) < huge)
    munmap(a + len, huge - (size_t)(a - p));
  (void)madvise(a, len, MADV_HUGEPAGE); /* advice only */
  bm->base = a;
  bm->len = len;
  *handle = (uint64_t)(uintptr_t)bm;
  return 0;
}

static void big_free(void *ud, uint64_t handle) {
  (void)ud;
  struct big_map *bm = (struct big_map *)(uintptr_t)handle;
  munmap(bm->base, bm->len);
  free(bm);
}

static const struct dspk__pool_ops big_ops = {.alloc = big_alloc,
                                              .free = big_free};

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
  pthread_mutex_init(&dev->pool_mu, NULL);
  dspk__pool_init(&dev->pool, &big_ops, NULL, DSPK__CPU_POOL_CACHED);
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
  dspk__pool_fini(&dev->pool);
  pthread_mutex_destroy(&dev->pool_mu);
  free(dev);
}

static int cpu_alloc(struct dspk__dev *dev, size_t n, struct dspk__mem **out) {
  if (n > SIZE_MAX - 128)
    return DSPK_ENOMEM;
  struct dspk__mem *m = malloc(sizeof *m);
  if (!m)
    return DSPK_ENOMEM;
  m->blk = NULL;
  m->foreign = 0;
  m->used = 1;
  if (n >= DSPK__CPU_BIG_BLOCK) {
    pthread_mutex_lock(&dev->pool_mu);
    m->used = dspk__pool_has_cached(&dev->pool, n); /* else a fresh mapping: zeros */
    int err = dspk__pool_get(&dev->pool, n, &m->blk);
    pthread_mutex_unlock(&dev->pool_mu);
    if (err < 0) {
      free(m);
      return err;
    }
    m->ptr = ((struct big_map *)(uintptr_t)m->blk->handle)->base;
  } else {
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded == 0)
      rounded = 64;
    m->ptr = aligned_alloc(64, rounded);
    if (!m->ptr) {
      free(m);
      return DSPK_ENOMEM;
    }
  }
  m->size = n;
  dev->bytes_in_use += n;
  *out = m;
  return 0;
}

static void cpu_free(struct dspk__dev *dev, struct dspk__mem *mem) {
  if (!mem)
    return;
  if (mem->foreign) { /* a client's mapping: the daemon unmaps it */
    free(mem);
    return;
  }
  dev->bytes_in_use -= mem->size;
  if (mem->blk) {
    pthread_mutex_lock(&dev->pool_mu);
    dspk__pool_put(&dev->pool, mem->blk);
    pthread_mutex_unlock(&dev->pool_mu);
  } else {
    free(mem->ptr);
  }
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

/* Shared memory: the client's pages are the block, so ops read and write
 * them in place (page-aligned, so the 64-byte alignment holds). */
static int cpu_import_host(struct dspk__dev *dev, void *ptr, size_t n,
                           struct dspk__mem **out) {
  struct dspk__mem *m = malloc(sizeof *m);
  (void)dev;
  if (!m)
    return DSPK_ENOMEM;
  m->ptr = ptr;
  m->size = n;
  m->blk = NULL;
  m->foreign = 1;
  m->used = 1; /* the client's bytes: never cleared (clear is for alloc's blocks) */
  *out = m;
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

/* Products of at most this many multiply-adds are quick (256^3: about
 * 0.2 ms on two cores). */
#define QUICK_GEMM_MACS ((int64_t)1 << 24)
#define QUICK_GEMM_BYTES ((int64_t)4 << 20) /* operands and result */

/* See backend.h: a plain f32/f64 gemm (no batch, no C, no widening) small
 * enough, whose thread count needs no tuning now. */
static int cpu_quick(struct dspk__dev *dev, const struct dspk__op *op) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1], *O = &op->out[0];
  int64_t M, N, K;
  if (op->kind != DSPK_OP_GEMM || op->nin != 2 || op->nout != 1 || A->rank != 2 ||
      B->rank != 2 || O->rank != 2 || (O->dtype != DSPK_F32 && O->dtype != DSPK_F64) ||
      A->dtype != O->dtype || B->dtype != O->dtype)
    return 0;
  M = O->shape[0];
  N = O->shape[1];
  K = A->shape[op->u.gemm.trans_a ? 0 : 1];
  if (M < 1 || N < 1 || K < 1 || M > QUICK_GEMM_MACS || N > QUICK_GEMM_MACS ||
      K > QUICK_GEMM_MACS || M * N > QUICK_GEMM_MACS / K ||
      (M * K + K * N + M * N) * (int64_t)dspk__dtype_size(O->dtype) > QUICK_GEMM_BYTES)
    return 0;
  return dev->gemm_threads || !dev->env.cache ||
         dspk__cpu_tune_gemm_decided(dev, O->dtype, M, N, K) >= 0;
}

static int cpu_run(struct dspk__dev *dev, struct dspk__op *op,
                   struct dspk__opctx *ctx) {
  if (dspk__cpu_canceled(ctx))
    return DSPK_ECANCELED;
  static dspk__cpu_op_fn *const ops[DSPK_OP_COUNT] = DSPK__CPU_OPS;
  if (op->kind == DSPK_OP_KERNEL)
    return dspk__cpu_err(ctx, DSPK_ENOTSUP, "kernel: the cpu backend runs no raw kernels");
  if ((unsigned)op->kind >= DSPK_OP_COUNT || !ops[op->kind])
    return dspk__cpu_err(ctx, DSPK_ENOTSUP, "cpu: unknown op %d", (int)op->kind);
  dspk__cpu_fft_adopt(dev); /* between ops: no plan of dev is in use */
  dev->ctx = ctx;
  dev->op_kind = op->kind;
  int rc = ops[op->kind](dev, op, ctx);
  dev->ctx = NULL;
  return rc;
}

static void cpu_trim(struct dspk__dev *dev) {
  pthread_mutex_lock(&dev->pool_mu);
  dspk__pool_trim(&dev->pool);
  pthread_mutex_unlock(&dev->pool_mu);
}

static void cpu_stats(struct dspk__dev *dev, struct dspk__devstats *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&dev->pool_mu);
  dspk__pool_stats_fill(&dev->pool, out);
  pthread_mutex_unlock(&dev->pool_mu);
  out->pool_bytes_in_use = dev->bytes_in_use;
  out->kernels_compiled = dev->plans_made; /* FFTW plans made */
  out->kernel_cache_hits = dev->plan_hits; /* FFTW plans reused */
}

static int cpu_clear(struct dspk__dev *dev, struct dspk__mem *mem, size_t n) {
  (void)dev;
  if (mem->used && n)
    memset(mem->ptr, 0, n < mem->size ? n : mem->size);
  return 0;
}

static void *cpu_host_ptr(struct dspk__dev *dev, struct dspk__mem *mem) {
  (void)dev;
  return mem->ptr;
}

/* Every op and dtype but raw kernels: a new op is the cpu's first. */
static void cpu_caps(struct dspk__dev *dev, struct dspk__devcaps *out) {
  (void)dev;
  dspk__caps_add_ops(out, DSPK__CAPS_ALL_OPS);
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
    .import_host = cpu_import_host,
    .host_ptr = cpu_host_ptr,
    .clear = cpu_clear,
    .quick = cpu_quick,
    .fence_record = cpu_fence_record,
    .fence_query = cpu_fence_query,
    .fence_wait = cpu_fence_wait,
    .fence_destroy = cpu_fence_destroy,
    .sync = cpu_sync,
    .caps = cpu_caps,
    .run = cpu_run,
    .trim = cpu_trim,
    .stats = cpu_stats,
};
