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
 * between BLAS calls: docs/protocol.md promises about 200 ms, also while
 * other processes slow the cores down (5-7 times at a load of 3-5 on the
 * 2-core development VM).  Each call's length is predicted from the speed
 * measured for its dtype (dev->gemm_rate[slot], f32 is about twice f64):
 *
 * - a product that the fastest speed measured says takes at most WHOLE_S
 *   runs in one BLAS call (tiles pack their panels again and hand work to
 *   BLAS's threads once each);
 * - an op's first tile is sized to take about FIRST_S at the speed last
 *   measured, by cutting the inner dimension (its later pieces accumulate
 *   with beta 1, which costs BLAS nothing it does not do itself between
 *   its own panels of K);
 * - the other tiles about TILE_S (TILE_WORK0 multiply-adds before the
 *   first measurement), within TILE_WORK_MIN and TILE_WORK_MAX: square
 *   pieces of the output of TILE_MIN to TILE_SIDE_MAX rows and columns
 *   (more rows when all columns fit in one, or the reverse), as large as
 *   leave TILE_K of the inner dimension, and the inner dimension cut to
 *   fit (BLAS's threads share the rows and columns of a call, and BLAS
 *   cuts K into panels of a few hundred itself: 2048^2 f32 in 3 calls of
 *   all rows and columns ran at 0.99 of one call in the daemon, in 5 with
 *   1024 a side at 0.97).  A tile cut to TILE_MIN of K (the op's first, or
 *   one after the cores got slower) then takes at most half of TILE_S at
 *   the speed its sides were sized from (a product with K under 2 TILE_MIN
 *   is not cut: up to TILE_S);
 * - a tile that took more than LATE_S (the cores got slower) sets the
 *   speed the next tiles are sized from to its own at once; a faster one
 *   raises it, a slower one within LATE_S lowers it by at most 5% (sized
 *   from each slowed tile's speed, 2048^2 went from 16 tiles to 64 on a
 *   loaded machine, 0.78 of an in-process cblas_sgemm instead of 0.92:
 *   docs/performance.md, h12).
 *
 * So a call the cancel waits for takes at most 200 ms unless the cores are
 * 13 times slower than the speed measured before the op (its first call),
 * or 6 times slower than the tile before (its later calls).  When
 * WHOLE_S was 0.2 s, a 2000^2 f64 product ran in one call, predicted from
 * f32's speed, and went on for 1.3-2 s after a cancel at a load of 3-5. */
#define WHOLE_S 0.01
#define FIRST_S 0.01
#define TILE_S 0.03
#define LATE_S 0.06
#define TILE_WORK0 ((int64_t)1 << 26)
#define TILE_WORK_MIN ((int64_t)1 << 24)
#define TILE_WORK_MAX ((int64_t)1 << 34)
#define TILE_MIN 256
#define TILE_K 512
#define TILE_SIDE_MAX 2048

#ifdef DSPK_TEST_HOOKS
double dspk__cpu_gemm_clock_skew;
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#ifdef DSPK_TEST_HOOKS
  t += dspk__cpu_gemm_clock_skew;
#endif
  return t;
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

/* Multiply-adds of one tile that takes about secs at the speed rate
 * (complex products count cost = 4 each), within the limits above. */
static int64_t tile_work(double rate, double secs, int64_t cost) {
  if (rate <= 0)
    return TILE_WORK0;
  double w = rate * secs / (double)cost;
  return w < (double)TILE_WORK_MIN   ? TILE_WORK_MIN
         : w > (double)TILE_WORK_MAX ? TILE_WORK_MAX
                                     : (int64_t)w;
}

/* blas_gemm in tiles (rows, columns, and the inner dimension, whose later
 * pieces accumulate with beta 1), sized as the top of this section says,
 * checking the cancel flag before each tile but the op's first and
 * measuring the device's speed for dt (dev->gemm_rate).  es: the item size
 * of the operands; *calls: the BLAS calls the op made so far.  0 or
 * DSPK_ECANCELED. */
static int gemm_tiled(struct dspk__dev *dev, dspk_dtype dt, size_t es, int ta, int tb,
                      int64_t M, int64_t N, int64_t K, double alpha, const char *a,
                      int lda, const char *b, int ldb, double beta, char *c, int ldc,
                      const struct dspk__opctx *ctx, int64_t *calls) {
  int slot = dspk__cpu_gemm_slot(dt);
  double *rate = &dev->gemm_rate[slot], *best = &dev->gemm_rate_best[slot];
  int64_t cost = dt == DSPK_C64 || dt == DSPK_C128 ? 4 : 1;
  bool whole = *best > 0 &&
               (double)M * (double)N * (double)K * (double)cost <= *best * WHOLE_S;
  int64_t work = whole ? INT64_MAX : tile_work(*rate, TILE_S, cost);
  int64_t side = 0, mr = 0, nq = 0;

  for (int64_t r = 0; r < M; r += mr) {
    for (int64_t q = 0; q < N; q += nq) {
      for (int64_t p = 0, kp; p < K; p += kp) {
        if (side == 0) { /* the square tile side for work, recomputed after a change */
          int64_t kk = K < TILE_K ? K : TILE_K;
          side = TILE_MIN;
          while (side < TILE_SIDE_MAX && side < (M > N ? M : N) &&
                 side * 2 * side * 2 <= work / kk)
            side *= 2;
        }
        if (q == 0 && p == 0) { /* all columns in one tile: more rows */
          int64_t kk = K < TILE_K ? K : TILE_K, t = side;
          if (N < side && work / (N * kk) > side)
            t = work / (N * kk);
          mr = whole || M - r < t ? M - r : t;
        }
        if (p == 0) { /* all rows in one tile: more columns */
          int64_t kk = K < TILE_K ? K : TILE_K, t = side;
          if (M < side && work / (M * kk) > side)
            t = work / (M * kk);
          nq = whole || N - q < t ? N - q : t;
        }
        int64_t w = work;
        if (*calls == 0 && !whole) {
          int64_t first = tile_work(*rate, FIRST_S, cost);
          w = first < work ? first : work;
        }
        kp = K - p;
        if ((double)mr * (double)nq * (double)kp > (double)w) {
          kp = w / (mr * nq);
          if (kp < TILE_MIN)
            kp = TILE_MIN;
          if (K - p - kp < TILE_MIN) /* no sliver of K left for one more call */
            kp = K - p;
        }
        if (*calls > 0 && dspk__cpu_canceled(ctx))
          return DSPK_ECANCELED;
        (*calls)++;
        /* op(A)[r, p] and op(B)[p, q] in the stored layouts. */
        const char *pa = a + (size_t)(ta ? p * lda + r : r * lda + p) * es;
        const char *pb = b + (size_t)(tb ? q * ldb + p : p * ldb + q) * es;
        double t0 = now_s();
        blas_gemm(dt, ta, tb, mr, nq, kp, alpha, pa, lda, pb, ldb, p ? 1.0 : beta,
                  c + (size_t)(r * ldc + q) * es, ldc);
        double dt_s = now_s() - t0;
        /* Only tiles long enough to time well teach the speed. */
        if (dt_s > 1e-3) {
          double v = (double)(mr * nq * kp * cost) / dt_s;
          *rate = v > 0.95 * *rate || dt_s > LATE_S ? v : 0.95 * *rate;
          if (v > *best)
            *best = v;
          if (!whole) {
            int64_t nw = tile_work(*rate, TILE_S, cost);
            if (nw != work) {
              work = nw;
              side = 0;
            }
          }
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
  int64_t calls = 0;
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
                    alpha, a, lda, bm, ldb, beta, c, ldc, ctx, &calls);
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
  int64_t calls = 0;
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
                    (char *)C + b * M * N * es, (int)N, ctx, &calls);
  }
  threads_leave(prev);
  return rc;
}
