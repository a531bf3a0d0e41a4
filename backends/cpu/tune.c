/*
 * Measured choices of the cpu backend (see tune.h): fir's direct loop
 * against FFT convolution per shape class, OpenBLAS's thread count for
 * small products, and FFTW planning with FFTW_MEASURE backed by wisdom in
 * the cache.  Each tuning runs the backend's own code paths on scratch
 * arrays of a representative size of the class, through the shared
 * autotune framework, which stores the decision and every timing.
 *
 * The device identity of every key is the CPU model and architecture,
 * with FFTW's and OpenBLAS's build strings and the CPU count as "driver":
 * a new library build or a different machine is a new tuning.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fftw3.h> /* before cblas.h: see cpu.h */
#include <cblas.h>

#include "backends/common/autotune.h"
#include "backends/cpu/tune.h"
#include "backends/cpu/fftw_wisdom.h"

/* fir: filters this short are always direct, this long always FFT. */
#define FIR_DIRECT_MAX_K 8
#define FIR_FFT_MIN_K 2048
/* fir: representative signal length of large-n classes (log2). */
#define FIR_REP_LOG2N 16
/* gemm: products tuned (larger ones use all threads). */
#define GEMM_MAX_DIM 1024
#define GEMM_MAX_LOG2_FLOPS 27
#define MAX_THREAD_CANDS 8
/* fft: plans of at most this many transforms are measured. */
#define FFT_MEASURE_MAX_BATCH 4

static const struct dspk__autotune_opts tune_opts = {.warmup = 1,
                                                     .samples = 5};
/* gemm's thread count: runs of a millisecond or less, where a moment of
 * load (another process on a core, a worker waking up) decides a sample.
 * Taken one after the other, a hiccup in the first sample of threads=2 cut
 * it (2.1 ms against 0.45 ms) and gemm 256^2 ran on one thread, 0.68 of an
 * in-process cblas_sgemm on two (docs/performance.md, "Data path, quiet
 * machine"); in rounds, with the median of more samples, it is one sample
 * of one round.  Each turn starts with an untimed run: the first run after
 * a change of the thread count often waits for OpenBLAS's workers. */
static const struct dspk__autotune_opts gemm_threads_opts = {
    .warmup = 1, .samples = 9, .interleave = 3};

/* ---- device identity ------------------------------------------------------ */

static pthread_once_t id_once = PTHREAD_ONCE_INIT;
static char id_name[128], id_arch[32], id_driver[256];
static int max_threads = 1;

static void read_id(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(id_name, sizeof id_name, "unknown cpu");
  while (f && fgets(line, sizeof line, f)) {
    const char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon)
      continue;
    for (colon++; *colon == ' ' || *colon == '\t'; colon++)
      ;
    snprintf(id_name, sizeof id_name, "%s", colon);
    id_name[strcspn(id_name, "\n")] = '\0';
    break;
  }
  if (f)
    fclose(f);
  struct utsname u;
  snprintf(id_arch, sizeof id_arch, "%.31s", uname(&u) == 0 ? u.machine : "");
  max_threads = openblas_get_num_threads();
  if (max_threads < 1)
    max_threads = 1;
  const char *blas = openblas_get_config();
  snprintf(id_driver, sizeof id_driver, "%.80s;%.120s;cpus=%ld;threads=%d",
           fftw_version, blas ? blas : "", sysconf(_SC_NPROCESSORS_ONLN),
           max_threads);
}

static struct dspk__cache_devid devid(void) {
  pthread_once(&id_once, read_id);
  return (struct dspk__cache_devid){"cpu", id_name, id_arch, "", id_driver};
}

/* Deterministic scratch contents in [-1, 1). */
static void fill(void *p, size_t bytes, int dbl) {
  uint32_t x = 12345;
  size_t n = bytes / (dbl ? 8 : 4);
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    double v = (double)(x >> 8) / (double)(1u << 23) - 1.0;
    if (dbl)
      ((double *)p)[i] = v;
    else
      ((float *)p)[i] = (float)v;
  }
}

static int scratch(struct dspk__mem *m, size_t bytes, int dbl) {
  size_t rounded = (bytes + 63) & ~(size_t)63;
  m->ptr = aligned_alloc(64, rounded ? rounded : 64);
  m->size = bytes;
  if (!m->ptr)
    return DSPK_ENOMEM;
  fill(m->ptr, bytes, dbl);
  return 0;
}

/* ---- fir -------------------------------------------------------------------- */

struct fir_tune {
  struct dspk__dev *dev;
  struct dspk__op op;
  struct dspk__opctx ctx;
  int use_fft[2];
  /* Scratch operands, made on the first benchmark run only: a decision
   * found in the memo or the cache needs none. */
  int dbl, ready;
  size_t xbytes, hbytes;
  struct dspk__mem mx, mh, my;
};

static int fir_run(void *ud, int i) {
  struct fir_tune *t = ud;
  if (!t->ready) {
    int rc = scratch(&t->mx, t->xbytes, t->dbl);
    if (rc == 0)
      rc = scratch(&t->mh, t->hbytes, t->dbl);
    if (rc == 0)
      rc = scratch(&t->my, t->xbytes, t->dbl);
    if (rc < 0)
      return rc;
    t->ready = 1;
  }
  int saved = t->dev->fir_force;
  t->dev->fir_force = t->use_fft[i];
  int rc = dspk__cpu_fir(t->dev, &t->op, &t->ctx);
  t->dev->fir_force = saved;
  return rc;
}

/* See tune.h. */
int dspk__cpu_tune_fir(struct dspk__dev *dev, dspk_dtype dt, int64_t n,
                       int64_t k, struct dspk__opctx *ctx) {
  if (k > n)
    k = n; /* taps beyond the signal never reach the output */
  if (k <= FIR_DIRECT_MAX_K)
    return 0;
  if (k >= FIR_FFT_MIN_K)
    return 1;
  int kc = dspk__autotune_pow2((uint64_t)k);
  int nc = dspk__autotune_pow2((uint64_t)n);
  int cap = kc + 2 > FIR_REP_LOG2N ? kc + 2 : FIR_REP_LOG2N;
  char shape[64];
  if (nc > cap) {
    nc = cap;
    snprintf(shape, sizeof shape, "n>=2^%d,k=2^%d", nc, kc);
  } else {
    snprintf(shape, sizeof shape, "n=2^%d,k=2^%d", nc, kc);
  }
  int64_t nr = (int64_t)1 << nc, kr = (int64_t)1 << kc;
  if (kr > nr)
    kr = nr;

  /* The likely winner first, so the other is cut after one sample. */
  static const struct dspk__autotune_cand direct_first[2] = {
      {"direct", fir_run}, {"fft", fir_run}};
  static const struct dspk__autotune_cand fft_first[2] = {
      {"fft", fir_run}, {"direct", fir_run}};
  int fft_is_first = kc >= 6;

  struct fir_tune t = {.dev = dev};
  t.use_fft[0] = fft_is_first;
  t.use_fft[1] = !fft_is_first;
  if (ctx) {
    t.ctx.cancel = ctx->cancel;
    t.ctx.progress = ctx->progress;
    t.ctx.progress_ud = ctx->progress_ud;
  }
  size_t es = dspk__dtype_size(dt);
  t.dbl = dt == DSPK_F64 || dt == DSPK_C128;
  t.xbytes = (size_t)nr * es;
  t.hbytes = (size_t)kr * es;
  t.op.kind = DSPK_OP_FIR;
  t.op.nin = 2;
  t.op.nout = 1;
  t.op.in[0] = (struct dspk__tensor){.dtype = dt, .rank = 1, .shape = {nr},
                                     .mem = &t.mx};
  t.op.in[1] = (struct dspk__tensor){.dtype = dt, .rank = 1, .shape = {kr},
                                     .mem = &t.mh};
  t.op.out[0] = (struct dspk__tensor){.dtype = dt, .rank = 1, .shape = {nr},
                                      .mem = &t.my};

  struct dspk__autotune_req req = {
      .op = "fir",
      .shape = shape,
      .dtypes = dspk__dtype_name(dt),
      .layout = "",
      .dev = devid(),
      .cands = fft_is_first ? fft_first : direct_first,
      .ncands = 2,
      .ud = &t,
      .progress = t.ctx.progress,
      .progress_ud = t.ctx.progress_ud,
      .cancel = t.ctx.cancel,
  };
  int w;
  int rc = dspk__autotune_choose(dev->env.cache, &req, &tune_opts, &w, NULL);
  if (rc == 0)
    rc = t.use_fft[w];
  free(t.mx.ptr);
  free(t.mh.ptr);
  free(t.my.ptr);
  return rc;
}

/* ---- gemm ------------------------------------------------------------------- */

struct gemm_tune {
  int dbl;
  int m, n, k;
  int threads[MAX_THREAD_CANDS];
  /* Scratch operands, made on the first benchmark run only: a decision
   * found in the memo or the cache needs none (making and filling them
   * first was 16% of the runner's time on small gemms). */
  int ready;
  struct dspk__mem ma, mb, mc;
  void *a, *b, *c;
};

static int gemm_run(void *ud, int i) {
  struct gemm_tune *t = ud;
  if (!t->ready) {
    size_t es = t->dbl ? 8 : 4;
    int rc = scratch(&t->ma, (size_t)t->m * t->k * es, t->dbl);
    if (rc == 0)
      rc = scratch(&t->mb, (size_t)t->k * t->n * es, t->dbl);
    if (rc == 0)
      rc = scratch(&t->mc, (size_t)t->m * t->n * es, t->dbl);
    if (rc < 0)
      return rc;
    t->a = t->ma.ptr;
    t->b = t->mb.ptr;
    t->c = t->mc.ptr;
    t->ready = 1;
  }
  int prev = openblas_get_num_threads();
  openblas_set_num_threads(t->threads[i]);
  if (t->dbl)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->m, t->n, t->k,
                1.0, t->a, t->k, t->b, t->n, 0.0, t->c, t->n);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->m, t->n, t->k,
                1.0f, t->a, t->k, t->b, t->n, 0.0f, t->c, t->n);
  openblas_set_num_threads(prev);
  return 0;
}

/* The tuning request of a gemm's thread count: fills t, cands and shape,
 * and returns the number of candidates, or 0 when the product is not tuned
 * (the library's default). */
static int gemm_req(dspk_dtype dt, int64_t M, int64_t N, int64_t K, struct gemm_tune *t,
                    char names[MAX_THREAD_CANDS][16],
                    struct dspk__autotune_cand cands[MAX_THREAD_CANDS], char *shape,
                    size_t shapelen, struct dspk__autotune_req *req) {
  if (max_threads < 2 || (dt != DSPK_F32 && dt != DSPK_F64))
    return 0;
  if (M < 1 || N < 1 || K < 1 || M > GEMM_MAX_DIM || N > GEMM_MAX_DIM ||
      K > GEMM_MAX_DIM)
    return 0;
  int mc = dspk__autotune_pow2((uint64_t)M), nc = dspk__autotune_pow2((uint64_t)N),
      kc = dspk__autotune_pow2((uint64_t)K);
  if (mc + nc + kc > GEMM_MAX_LOG2_FLOPS)
    return 0;

  /* Candidates: 1, 2, 4, ... below max_threads, and max_threads. */
  *t = (struct gemm_tune){.dbl = dt == DSPK_F64, .m = 1 << mc, .n = 1 << nc, .k = 1 << kc};
  int n = 0;
  for (int th = 1; th < max_threads && n < MAX_THREAD_CANDS - 1; th *= 2)
    t->threads[n++] = th;
  t->threads[n++] = max_threads;
  for (int i = 0; i < n; i++) {
    snprintf(names[i], sizeof names[i], "threads=%d", t->threads[i]);
    cands[i] = (struct dspk__autotune_cand){names[i], gemm_run};
  }
  snprintf(shape, shapelen, "m=2^%d,n=2^%d,k=2^%d", mc, nc, kc);
  /* All threads, as the library would take in-process, unless fewer are
   * clearly faster: at a daemon's start its other devices warm up (lavapipe
   * compiling its shaders) and can make a core look slow, and gemm 256^2
   * was then run on one thread (time_us 330 us against 230 on two, on the
   * development VM, in one fresh daemon of two).  The policy is part of the
   * key (layout), so decisions made without it are made again. */
  *req = (struct dspk__autotune_req){
      .op = "gemm.threads", .shape = shape,
      .dtypes = dspk__dtype_name(dt), .layout = "row-major,prefer-all-within-10%",
      .dev = devid(), .cands = cands, .ncands = n, .ud = t,
      .prefer = n - 1, .prefer_margin = 0.10};
  return n;
}

/* See tune.h. */
int dspk__cpu_tune_gemm_threads(struct dspk__dev *dev, dspk_dtype dt,
                                int64_t M, int64_t N, int64_t K) {
  char names[MAX_THREAD_CANDS][16], shape[64];
  struct dspk__autotune_cand cands[MAX_THREAD_CANDS];
  struct dspk__autotune_req req;
  struct gemm_tune t;
  int out = 0, w;
  (void)devid(); /* max_threads */
  if (!gemm_req(dt, M, N, K, &t, names, cands, shape, sizeof shape, &req))
    return 0;
  if (dspk__autotune_choose(dev->env.cache, &req, &gemm_threads_opts, &w, NULL) == 0)
    out = t.threads[w];
  free(t.ma.ptr);
  free(t.mb.ptr);
  free(t.mc.ptr);
  return out;
}

/* See tune.h. */
int dspk__cpu_tune_gemm_decided(struct dspk__dev *dev, dspk_dtype dt, int64_t M,
                                int64_t N, int64_t K) {
  char names[MAX_THREAD_CANDS][16], shape[64];
  struct dspk__autotune_cand cands[MAX_THREAD_CANDS];
  struct dspk__autotune_req req;
  struct gemm_tune t;
  int w;
  (void)devid();
  if (!gemm_req(dt, M, N, K, &t, names, cands, shape, sizeof shape, &req))
    return 0;
  return dspk__autotune_peek(dev->env.cache, &req, &w) == 0 ? t.threads[w] : -1;
}

/* ---- fft ---------------------------------------------------------------------- */

/* See tune.h. */
unsigned dspk__cpu_tune_fft_flags(struct dspk__dev *dev, int n, int batch) {
  (void)n;
  return dev && dev->env.cache && batch <= FFT_MEASURE_MAX_BATCH
             ? FFTW_MEASURE
             : FFTW_ESTIMATE;
}

/* See tune.h. */
int dspk__cpu_tune_wisdom_load(struct dspk__dev *dev) {
  if (!dev || !dev->env.cache)
    return 0;
  /* Read the device identity of the tuning keys now, at open, rather than
   * inside the first task that needs a decision (/proc/cpuinfo and
   * OpenBLAS's configuration: about 1 ms there). */
  (void)devid();
  dspk__cpu_fftw_lock();
  int rc = dspk__fftw_wisdom_load(dev->env.cache);
  dspk__cpu_fftw_unlock();
  return rc;
}

/* See tune.h. */
int dspk__cpu_tune_wisdom_save(struct dspk__dev *dev) {
  if (!dev || !dev->env.cache)
    return 0;
  dspk__cpu_fftw_lock();
  int rc = dspk__cpu_tune_wisdom_save_locked(dev);
  dspk__cpu_fftw_unlock();
  return rc;
}

/* See tune.h. */
int dspk__cpu_tune_wisdom_save_locked(struct dspk__dev *dev) {
  if (!dev || !dev->env.cache)
    return 0;
  return dspk__fftw_wisdom_save(dev->env.cache);
}
