/*
 * gemm on the cpu: out = alpha*op(A)@op(B) + beta*C with numpy.matmul batch
 * broadcasting, through OpenBLAS.  The plain case (no batch, no C) is one
 * straight cblas call on the tensors in place, with no copy; batches loop
 * over cblas calls with broadcast offsets (stride 0 on broadcast axes); C is
 * first broadcast into the output, then gemm accumulates with beta.  f16 and
 * bf16 inputs are widened to f32 copies first.  Also the batched helper that
 * contract uses.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fftw3.h> /* before cblas.h: see cpu.h */
#include <cblas.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/tune.h"

int dspk__cpu_gemm_threads(struct dspk__dev *dev, dspk_dtype dt, int64_t M,
                           int64_t N, int64_t K, int64_t batch) {
  (void)batch;
  if (dev->gemm_threads)
    return dev->gemm_threads;
  if (dev->env.cache)
    return dspk__cpu_tune_gemm_threads(dev, dt, M, N, K);
  return 0; /* OpenBLAS's default, all cores */
}

/* OpenBLAS's own entry points: stop its worker threads (what it runs itself
 * before a fork), start them.  Weak, so that a BLAS without them still
 * links; then nothing is stopped. */
extern int blas_thread_shutdown_(void) __attribute__((weak));
extern int blas_thread_init(void) __attribute__((weak));

static atomic_int blas_parked; /* 1 while dspk__cpu_blas_idle's stop holds */
static atomic_int blas_stopped_once;

void dspk__cpu_blas_idle(void) {
  if (!blas_thread_shutdown_ || !blas_thread_init)
    return;
  /* Once per process, at the first device open, before any BLAS call ran:
   * stopping the pool under a running call would break it. */
  if (atomic_exchange(&blas_stopped_once, 1))
    return;
  blas_thread_shutdown_();
  atomic_store(&blas_parked, 1);
}

static void *blas_starter(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "dspk-blas");
  blas_thread_init();
  return NULL;
}

/* Before a BLAS call: starts the stopped pool again, from a thread of its
 * own, since threads inherit their creator's name and workers started on
 * the runner would be named after it.  When that thread cannot be made,
 * OpenBLAS starts the pool itself inside the call. */
static void blas_wake(void) {
  if (!atomic_exchange(&blas_parked, 0))
    return;
  pthread_t t;
  if (pthread_create(&t, NULL, blas_starter, NULL) == 0)
    pthread_join(t, NULL);
}

/* Sets OpenBLAS's thread count for one call; returns the previous count to
 * restore, or 0 when nothing changed. */
static int threads_enter(struct dspk__dev *dev, dspk_dtype dt, int64_t M,
                         int64_t N, int64_t K, int64_t batch) {
  blas_wake();
  int t = dspk__cpu_gemm_threads(dev, dt, M, N, K, batch);
  if (t <= 0)
    return 0;
  int prev = openblas_get_num_threads();
  if (prev == t)
    return 0;
  openblas_set_num_threads(t);
  return prev;
}

static void threads_leave(int prev) {
  if (prev > 0)
    openblas_set_num_threads(prev);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f,
           man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* A widened f32 copy of an f16/bf16 tensor (caller frees), or NULL. */
static float *widen(const struct dspk__tensor *t) {
  int64_t n = dspk__tensor_numel(t);
  float *out = malloc((size_t)(n ? n : 1) * sizeof(float));
  if (!out)
    return NULL;
  const uint16_t *src = dspk__cpu_ptr(t);
  for (int64_t i = 0; i < n; i++) {
    uint16_t v;
    memcpy(&v, src + i, 2);
    if (t->dtype == DSPK_BF16) {
      uint32_t bits = (uint32_t)v << 16;
      memcpy(&out[i], &bits, 4);
    } else {
      out[i] = half_to_float(v);
    }
  }
  return out;
}

/* Broadcasts C into out (both dtype dt, C right-aligned to out's shape). */
static void broadcast_c(const struct dspk__tensor *C, const struct dspk__tensor *o,
                        size_t es) {
  int ro = o->rank, off = ro - C->rank;
  int64_t cstride[DSPK_MAX_RANK], idx[DSPK_MAX_RANK];
  int64_t s = 1;
  for (int i = ro - 1; i >= 0; i--) {
    int ic = i - off;
    int64_t dim = ic >= 0 ? C->shape[ic] : 1;
    cstride[i] = dim == 1 ? 0 : s;
    s *= dim;
    idx[i] = 0;
  }
  const char *c = dspk__cpu_ptr(C);
  char *d = dspk__cpu_ptr(o);
  int64_t n = o->shape[ro - 1], outer = dspk__tensor_numel(o) / (n ? n : 1);
  if (n == 0)
    return;
  for (int64_t r = 0; r < outer; r++) {
    int64_t coff = 0;
    for (int i = 0; i < ro - 1; i++)
      coff += idx[i] * cstride[i];
    if (cstride[ro - 1]) {
      memcpy(d, c + coff * es, (size_t)n * es);
    } else {
      for (int64_t j = 0; j < n; j++)
        memcpy(d + j * es, c + coff * es, es);
    }
    d += n * es;
    for (int i = ro - 2; i >= 0; i--) {
      if (++idx[i] < o->shape[i])
        break;
      idx[i] = 0;
    }
  }
}

static void scale_out(void *p, dspk_dtype dt, int64_t n, double beta) {
  if (dt == DSPK_F32) {
    float *f = p;
    for (int64_t i = 0; i < n; i++)
      f[i] = beta == 0 ? 0.0f : (float)(beta * f[i]);
  } else {
    double *f = p;
    for (int64_t i = 0; i < n; i++)
      f[i] = beta == 0 ? 0.0 : beta * f[i];
  }
}

/* Large products are cut into tiles so that a cancel request is seen
 * between tiles: docs/protocol.md promises about 200 ms.  A product the
 * best measured speed says takes at most WHOLE_S runs in one BLAS call: tiles
 * pack their panels again and hand work to BLAS's threads once each (a
 * 2048^2 f32 product in 16 tiles of 512 x 512 ran at 0.945 of one
 * cblas_sgemm call on the 2-core development VM).  The speed tiles measure
 * is below a whole call's (2048^2 whole: about 1e11 multiply-adds/s on an
 * idle VM, 6.4e10 measured by its tiles under load), so WHOLE_S leaves room
 * for that: at 0.1 s a 2048^2 product stayed tiled.  A tile is sized
 * from the device's measured speed to take about TILE_S (TILE_WORK0
 * multiply-adds before the first measurement), within TILE_WORK_MIN and
 * TILE_WORK_MAX, and keeps at least TILE_MIN rows and columns so that BLAS's
 * packing of its panels costs little. */
#define TILE_S 0.03
#define WHOLE_S 0.2
#define TILE_WORK0 ((int64_t)1 << 26)
#define TILE_WORK_MIN ((int64_t)1 << 24)
#define TILE_WORK_MAX ((int64_t)1 << 34)
#define TILE_MIN 256

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One BLAS gemm call on row-major operands of dtype dt: c = alpha*op(a)@op(b)
 * + beta*c, m x n x k; alpha and beta are real (imaginary part 0). */
static void blas_gemm(dspk_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int lda, const void *b, int ldb,
                      double beta, void *c, int ldc) {
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans,
                       TB = tb ? CblasTrans : CblasNoTrans;
  switch (dt) {
  case DSPK_F64:
    cblas_dgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, alpha, a, lda, b, ldb,
                beta, c, ldc);
    break;
  case DSPK_C64: {
    const float al[2] = {(float)alpha, 0}, be[2] = {(float)beta, 0};
    cblas_cgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, al, a, lda, b, ldb, be, c,
                ldc);
    break;
  }
  case DSPK_C128: {
    const double al[2] = {alpha, 0}, be[2] = {beta, 0};
    cblas_zgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, al, a, lda, b, ldb, be, c,
                ldc);
    break;
  }
  default:
    cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, (float)alpha, a, lda, b,
                ldb, (float)beta, c, ldc);
    break;
  }
}

/* blas_gemm in tiles (rows, columns, and the inner dimension, whose later
 * pieces accumulate with beta 1), checking the cancel flag before each tile
 * but the first, and measuring the device's speed (dev->gemm_rate, complex
 * products counting 4 multiply-adds).  es: the item size of the operands.
 * 0 or DSPK_ECANCELED. */
static int gemm_tiled(struct dspk__dev *dev, dspk_dtype dt, size_t es, int ta, int tb,
                      int64_t M, int64_t N, int64_t K, double alpha, const char *a,
                      int lda, const char *b, int ldb, double beta, char *c, int ldc,
                      const struct dspk__opctx *ctx) {
  int64_t tm = M, tn = N, tk = K;
  int64_t cost = dt == DSPK_C64 || dt == DSPK_C128 ? 4 : 1;
  int64_t work = TILE_WORK0;
  bool first = true;

  if (dev->gemm_rate > 0) {
    double w = dev->gemm_rate * TILE_S / (double)cost;
    work = w < (double)TILE_WORK_MIN   ? TILE_WORK_MIN
           : w > (double)TILE_WORK_MAX ? TILE_WORK_MAX
                                       : (int64_t)w;
  }
  bool whole = dev->gemm_rate_best > 0 && (double)M * (double)N * (double)K * (double)cost <=
                                              dev->gemm_rate_best * WHOLE_S;
  if (!whole && M * N > work / K) { /* K >= 1 here */
    int64_t side = TILE_MIN;
    while (side * 2 * side * 2 <= work / K)
      side *= 2;
    tm = M < side ? M : side;
    tn = N < side ? N : side;
    if (tm * tn > work / K) {
      tk = work / (tm * tn);
      if (tk < TILE_MIN)
        tk = TILE_MIN;
      if (tk > K)
        tk = K;
    }
  }
  for (int64_t r = 0; r < M; r += tm) {
    int64_t mr = M - r < tm ? M - r : tm;
    for (int64_t q = 0; q < N; q += tn) {
      int64_t nq = N - q < tn ? N - q : tn;
      for (int64_t p = 0; p < K; p += tk) {
        int64_t kp = K - p < tk ? K - p : tk;
        if (!first && dspk__cpu_canceled(ctx))
          return DSPK_ECANCELED;
        first = false;
        /* op(A)[r, p] and op(B)[p, q] in the stored layouts. */
        const char *pa = a + (size_t)(ta ? p * lda + r : r * lda + p) * es;
        const char *pb = b + (size_t)(tb ? q * ldb + p : p * ldb + q) * es;
        double t0 = now_s();
        blas_gemm(dt, ta, tb, mr, nq, kp, alpha, pa, lda, pb, ldb, p ? 1.0 : beta,
                  c + (size_t)(r * ldc + q) * es, ldc);
        double dt_s = now_s() - t0;
        /* Only tiles long enough to time well teach the speed: the device's
         * own, so the fastest tiles count and a slower one lowers it by at
         * most 5%.  Sized from the speed of a tile slowed down by other
         * processes on the cores, tiles got smaller, with more packing and
         * thread hand-offs per multiply-add, and slower still: 64 tiles
         * instead of 16 for 2048^2 on a loaded 2-core machine, 0.78 of an
         * in-process cblas_sgemm instead of 0.92 (docs/performance.md, h12). */
        if (dt_s > 1e-3) {
          double rate = (double)(mr * nq * kp * cost) / dt_s;
          dev->gemm_rate = rate > 0.95 * dev->gemm_rate ? rate : 0.95 * dev->gemm_rate;
          if (rate > dev->gemm_rate_best)
            dev->gemm_rate_best = rate;
        }
      }
    }
  }
  return 0;
}

int dspk__cpu_gemm(struct dspk__dev *dev, struct dspk__op *op,
                   struct dspk__opctx *ctx) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  const struct dspk__tensor *C = op->nin > 2 ? &op->in[2] : NULL;
  struct dspk__tensor *O = &op->out[0];
  int ta = op->u.gemm.trans_a != 0, tb = op->u.gemm.trans_b != 0;
  int ra = A->rank, rb = B->rank, ro = O->rank;
  int64_t M = O->shape[ro - 2], N = O->shape[ro - 1];
  int64_t K = A->shape[ta ? ra - 2 : ra - 1];
  double alpha, beta; /* as the op computes with them: f32-rounded for an f32 product */
  dspk__op_gemm_scalars(op, &alpha, &beta);
  size_t es = dspk__dtype_size(O->dtype);
  int64_t total = dspk__tensor_numel(O);
  float *wa = NULL, *wb = NULL;
  int rc = 0;

  if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
    return dspk__cpu_err(ctx, DSPK_ENOTSUP,
                         "gemm: matrix dimensions above 2^31-1 are not supported");
  if (total == 0)
    return 0;
  if (C && beta != 0) {
    if (dspk__cpu_ptr(C) != dspk__cpu_ptr(O) || C->rank != ro ||
        dspk__tensor_numel(C) != total)
      broadcast_c(C, O, es);
  } else {
    beta = 0;
  }
  /* Nothing to multiply: out = beta*C exactly, +0 without C or with beta 0
   * (as BLAS: alpha 0 of either sign, or K = 0, adds no alpha*0). */
  if (K == 0 || alpha == 0) {
    scale_out(dspk__cpu_ptr(O), O->dtype, total, beta);
    return 0;
  }

  const void *pa = dspk__cpu_ptr(A), *pb = dspk__cpu_ptr(B);
  if (A->dtype == DSPK_F16 || A->dtype == DSPK_BF16) {
    wa = widen(A);
    wb = widen(B);
    if (!wa || !wb) {
      rc = dspk__cpu_err(ctx, DSPK_ENOMEM, "gemm: out of memory widening %s",
                         dspk__dtype_name(A->dtype));
      goto out;
    }
    pa = wa;
    pb = wb;
  }
  size_t ies = (A->dtype == DSPK_F64) ? 8 : 4;

  /* Row-major storage: A is (rows x cols) = (M x K), or (K x M) when
   * transposed; ld is the stored row length, at least 1 for BLAS. */
  int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N), ldc = (int)N;
  if (lda < 1) lda = 1;
  if (ldb < 1) ldb = 1;

  /* Batch offsets (in elements) with broadcasting. */
  int nb = ro - 2;
  int64_t astr[DSPK_MAX_RANK], bstr[DSPK_MAX_RANK], idx[DSPK_MAX_RANK];
  int64_t sa = M * K, sb = K * N;
  for (int i = nb - 1; i >= 0; i--) {
    int ia = i - (ro - ra), ib = i - (ro - rb);
    int64_t da = ia >= 0 ? A->shape[ia] : 1, db = ib >= 0 ? B->shape[ib] : 1;
    astr[i] = da == 1 ? 0 : sa;
    bstr[i] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
    idx[i] = 0;
  }
  int64_t batch = total / (M * N);
  int prev = threads_enter(dev, O->dtype, M, N, K, batch);
  char *po = dspk__cpu_ptr(O);
  for (int64_t b = 0; b < batch; b++) {
    if (b && dspk__cpu_canceled(ctx)) {
      rc = DSPK_ECANCELED;
      break;
    }
    int64_t oa = 0, ob = 0;
    for (int i = 0; i < nb; i++) {
      oa += idx[i] * astr[i];
      ob += idx[i] * bstr[i];
    }
    const char *a = (const char *)pa + oa * ies, *bm = (const char *)pb + ob * ies;
    char *c = po + b * M * N * es;
    rc = gemm_tiled(dev, O->dtype == DSPK_F64 ? DSPK_F64 : DSPK_F32, ies, ta, tb, M, N, K,
                    alpha, a, lda, bm, ldb, beta, c, ldc, ctx);
    if (rc < 0)
      break;
    for (int i = nb - 1; i >= 0; i--) {
      if (++idx[i] < O->shape[i])
        break;
      idx[i] = 0;
    }
  }
  threads_leave(prev);
out:
  free(wa);
  free(wb);
  return rc;
}

int dspk__cpu_gemm_batched(struct dspk__dev *dev, dspk_dtype dt, int64_t batch,
                           int64_t M, int64_t N, int64_t K, const void *A,
                           const void *B, void *C, struct dspk__opctx *ctx) {
  size_t es = dspk__dtype_size(dt);
  if (M == 0 || N == 0 || batch == 0)
    return 0;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
    return dspk__cpu_err(ctx, DSPK_ENOTSUP,
                         "contract: matrix dimensions above 2^31-1 are not supported");
  if (K == 0) {
    memset(C, 0, (size_t)(batch * M * N) * es);
    return 0;
  }
  int prev = threads_enter(dev, dt, M, N, K, batch);
  int rc = 0;
  for (int64_t b = 0; b < batch && rc == 0; b++) {
    if (b && dspk__cpu_canceled(ctx)) {
      rc = DSPK_ECANCELED;
      break;
    }
    if (dt != DSPK_F32 && dt != DSPK_F64 && dt != DSPK_C64 && dt != DSPK_C128) {
      rc = dspk__cpu_err(ctx, DSPK_EDTYPE, "contract: dtype %s not supported",
                         dspk__dtype_name(dt));
      break;
    }
    rc = gemm_tiled(dev, dt, es, 0, 0, M, N, K, 1.0, (const char *)A + b * M * K * es, (int)K,
                    (const char *)B + b * K * N * es, (int)N, 0.0,
                    (char *)C + b * M * N * es, (int)N, ctx);
  }
  threads_leave(prev);
  return rc;
}
