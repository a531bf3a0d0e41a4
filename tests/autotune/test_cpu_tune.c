/*
 * Tests of the cpu backend's measured choices (backends/cpu/tune.c) on a
 * real cpu device with an in-memory cache: fir's direct/FFT choice is
 * tuned once per shape class and then served without measuring (also to
 * other sizes of the same class), obvious cases are not tuned, gemm's
 * thread count is tuned only for small products, FFTW planning uses
 * FFTW_MEASURE when there is a cache and its wisdom goes into the cache;
 * large plans without wisdom are estimated at once and measured in the
 * background, swapped in at the next op, their wisdom stored.
 */
#include <complex.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <fftw3.h>

#include "backends/cpu/tune.h"
#include "cache/cache.h"

static struct dspk__cache *cache;
static struct dspk__dev *dev;

static int setup(void **state) {
  (void)state;
  char warn[256];
  /* DSPK_TEST_CACHE=FILE keeps the decisions for inspection (sqlite3). */
  const char *path = getenv("DSPK_TEST_CACHE");
  if (dspk__cache_open(path ? path : ":memory:", NULL, &cache, warn,
                       sizeof warn) != 0)
    return -1;
  struct dspk__devenv env = {.cache = cache};
  return dspk__backend_cpu.open(0, &env, &dev);
}

static int teardown(void **state) {
  (void)state;
  dspk__backend_cpu.close(dev);
  dspk__cache_close(cache);
  return 0;
}

static struct dspk__cache_kstats tune_stats(void) {
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(cache, &s), 0);
  return s.kind[DSPK__CACHE_AUTOTUNE];
}

struct prog {
  int calls;
  double last;
};

static void on_progress(void *ud, const char *what, double f) {
  struct prog *p = ud;
  (void)what;
  p->calls++;
  p->last = f;
}

static void test_fir_choice(void **state) {
  (void)state;
  struct prog p = {0};
  struct dspk__opctx ctx = {.progress = on_progress, .progress_ud = &p};
  int a = dspk__cpu_tune_fir(dev, DSPK_F32, 100000, 64, &ctx);
  assert_true(a == 0 || a == 1);
  assert_int_equal(tune_stats().entries, 1);
  assert_int_equal(tune_stats().puts, 1);
  assert_true(p.calls > 0);
  assert_true(p.last == 1.0);
  /* Same class (n >= 2^16, k in (32, 64]): no new tuning. */
  p.calls = 0;
  assert_int_equal(dspk__cpu_tune_fir(dev, DSPK_F32, 300000, 50, &ctx), a);
  assert_int_equal(tune_stats().puts, 1);
  assert_int_equal(p.calls, 0);
  /* Obvious cases are not measured. */
  assert_int_equal(dspk__cpu_tune_fir(dev, DSPK_F32, 100000, 4, NULL), 0);
  assert_int_equal(dspk__cpu_tune_fir(dev, DSPK_F32, 100000, 4096, NULL), 1);
  assert_int_equal(tune_stats().puts, 1);
  /* Other dtypes and classes are tuned separately. */
  int b = dspk__cpu_tune_fir(dev, DSPK_C64, 5000, 100, NULL);
  assert_true(b == 0 || b == 1);
  int c = dspk__cpu_tune_fir(dev, DSPK_F64, 1000, 16, NULL);
  assert_true(c == 0 || c == 1);
  assert_int_equal(tune_stats().entries, 3);
  /* Cancelled before it starts: the caller sees DSPK_ECANCELED. */
  atomic_int cancel = 1;
  struct dspk__opctx cctx = {.cancel = &cancel};
  assert_int_equal(dspk__cpu_tune_fir(dev, DSPK_F32, 70000, 300, &cctx), DSPK_ECANCELED);
}

/* The link wraps aligned_alloc (tests/autotune/CMakeLists.txt): the calls
 * are counted, so a test can tell that the tuner made no scratch. */
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
static int aligned_allocs;
void *__wrap_aligned_alloc(size_t align, size_t n) {
  aligned_allocs++;
  return __real_aligned_alloc(align, n);
}

/* A gemm op of f32 m x k by k x n, as the daemon hands it over. */
static struct dspk__op gemm_op(int64_t m, int64_t n, int64_t k) {
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2, .nout = 1};
  op.in[0] = (struct dspk__tensor){.dtype = DSPK_F32, .rank = 2, .shape = {m, k}};
  op.in[1] = (struct dspk__tensor){.dtype = DSPK_F32, .rank = 2, .shape = {k, n}};
  op.out[0] = (struct dspk__tensor){.dtype = DSPK_F32, .rank = 2, .shape = {m, n}};
  return op;
}

/* cblas_sgemm and cblas_dgemm are wrapped too: the BLAS calls one gemm
 * makes.  While sim_rate is set, each call also advances the clock gemm's
 * tiles are timed with (test hook dspk__cpu_gemm_clock_skew) by the time it
 * would take at sim_rate multiply-adds per second, as on a machine that
 * other processes slow down, and records that time; the call numbered
 * cancel_at sets cancel_flag as it starts, as a task.cancel arriving then. */
void __real_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc);
void __wrap_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc);
void __real_cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                        const double *a, int lda, const double *b, int ldb, double beta,
                        double *c, int ldc);
void __wrap_cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                        const double *a, int lda, const double *b, int ldb, double beta,
                        double *c, int ldc);
static int sgemm_calls, gemm_calls, cancel_at;
static double sim_rate, sim_longest, sim_canceled_call;
static atomic_int cancel_flag;
static void sim_call(int m, int n, int k) {
  gemm_calls++;
  if (gemm_calls == cancel_at)
    atomic_store(&cancel_flag, 1);
  if (sim_rate > 0) {
    double s = (double)m * n * k / sim_rate;
    dspk__cpu_gemm_clock_skew += s;
    if (s > sim_longest)
      sim_longest = s;
    if (gemm_calls == cancel_at)
      sim_canceled_call = s;
  }
}
void __wrap_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc) {
  sgemm_calls++;
  sim_call(m, n, k);
  __real_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void __wrap_cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                        const double *a, int lda, const double *b, int ldb, double beta,
                        double *c, int ldc) {
  sim_call(m, n, k);
  __real_cblas_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* A product the best measured speed says takes at most 10 ms is one BLAS call
 * (tiles cost packing and thread hand-offs); a longer one is tiled so that
 * cancel is seen between tiles.  Both right (spot checks in double). */
static void test_gemm_whole(void **state) {
  (void)state;
  const int M = 256, N = 256, K = 1024;
  float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
  float *c = malloc(sizeof(float) * M * N);
  for (int i = 0; i < M * K; i++)
    a[i] = (float)((i * 7) % 13) - 6;
  for (int i = 0; i < K * N; i++)
    b[i] = (float)((i * 5) % 11) - 5;
  dev->gemm_threads = 1; /* no thread tuning (its own BLAS calls) */
  for (int pass = 0; pass < 2; pass++) {
    /* 2^26 multiply-adds: 6.7 ms at 1e10/s (whole), 0.67 s at 1e8/s (tiles) */
    dev->gemm_rate[0] = dev->gemm_rate_best[0] = pass == 0 ? 1e10 : 1e8;
    sgemm_calls = 0;
    memset(c, 0, sizeof(float) * M * N);
    assert_int_equal(dspk__cpu_gemm_batched(dev, DSPK_F32, 1, M, N, K, a, b, c, NULL), 0);
    if (pass == 0)
      assert_int_equal(sgemm_calls, 1);
    else
      assert_true(sgemm_calls > 1);
    for (int i = 0; i < M; i += 37)
      for (int j = 0; j < N; j += 29) {
        double want = 0;
        for (int l = 0; l < K; l++)
          want += (double)a[i * K + l] * b[l * N + j];
        assert_true(fabs(c[i * N + j] - want) <= 1e-6 * (1 + fabs(want)));
      }
  }
  /* A tall, narrow product in tiles: all columns fit in one, so a tile
   * takes more rows (the least tile, 2^24 multiply-adds at 1e8/s: 2^18 of
   * them), not a square piece's 1024: four calls, not 1024. */
  const int TM = 1 << 20, TN = 8, TK = 8;
  float *ta = malloc(sizeof(float) * TM * TK), *tb = malloc(sizeof(float) * TK * TN);
  float *tc = malloc(sizeof(float) * TM * TN);
  for (int i = 0; i < TM * TK; i++)
    ta[i] = (float)((i * 7) % 13) - 6;
  for (int i = 0; i < TK * TN; i++)
    tb[i] = (float)((i * 5) % 11) - 5;
  dev->gemm_rate[0] = dev->gemm_rate_best[0] = 1e8;
  sim_rate = 1e8; /* every call looks this slow: the speed stays */
  sgemm_calls = 0;
  assert_int_equal(dspk__cpu_gemm_batched(dev, DSPK_F32, 1, TM, TN, TK, ta, tb, tc, NULL), 0);
  sim_rate = 0;
  dspk__cpu_gemm_clock_skew = 0;
  assert_int_equal(sgemm_calls, 4);
  for (int i = 0; i < TM; i += 997)
    for (int j = 0; j < TN; j++) {
      double want = 0;
      for (int l = 0; l < TK; l++)
        want += (double)ta[i * TK + l] * tb[l * TN + j];
      assert_true(fabs(tc[i * TN + j] - want) <= 1e-6 * (1 + fabs(want)));
    }
  free(ta);
  free(tb);
  free(tc);
  dev->gemm_threads = 0;
  dev->gemm_rate[0] = dev->gemm_rate_best[0] = 0;
  free(a);
  free(b);
  free(c);
}

/* protocol.md, task.cancel: a running gemm stops within about 200 ms of a
 * cancel, also on a loaded machine.  The device measured f32 at 1e11
 * multiply-adds/s on a quiet machine; now the cores run 8 times slower
 * (simulated: the sgemm wrapper advances gemm's clock).  2048 x 2048 x
 * 1024 then takes 0.34 s: it must not run in one call (it did while a
 * product predicted at 0.2 s or less ran whole), and no call may take
 * more than 0.2 s, the first (sized from the old speed) nor the later ones
 * (sized from the speed the first measured).  An f64 product is not
 * predicted from f32's speed (f64 runs at about half of it): never
 * measured in f64, its first call is the small tile of a device that
 * measured nothing (2^26 multiply-adds).  Results are checked
 * against sums in double, and a canceled product makes no call after the
 * one the cancel came in. */
static void test_gemm_cancel_loaded(void **state) {
  (void)state;
  const int M = 2048, N = 2048, K = 1024;
  double *a = malloc(sizeof(double) * M * K), *b = malloc(sizeof(double) * K * N);
  double *c = malloc(sizeof(double) * M * N);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  dev->gemm_threads = 1; /* no thread tuning (its own BLAS calls) */
  struct dspk__opctx ctx = {.cancel = &cancel_flag};
  for (int pass = 0; pass < 3; pass++) {
    /* 0: f32, canceled in its first call; 1: f32 to the end; 2: f64,
     * canceled in its first call. */
    int dbl = pass == 2;
    for (int i = 0; i < M * K; i++) {
      double v = (double)((i * 7) % 13) - 6;
      if (dbl)
        a[i] = v;
      else
        ((float *)a)[i] = (float)v;
    }
    for (int i = 0; i < K * N; i++) {
      double v = (double)((i * 5) % 11) - 5;
      if (dbl)
        b[i] = v;
      else
        ((float *)b)[i] = (float)v;
    }
    memset(dev->gemm_rate, 0, sizeof dev->gemm_rate);
    memset(dev->gemm_rate_best, 0, sizeof dev->gemm_rate_best);
    dev->gemm_rate[0] = dev->gemm_rate_best[0] = 1e11;
    sim_rate = 1e11 / 8;
    sim_longest = sim_canceled_call = 0;
    gemm_calls = 0;
    cancel_at = pass == 1 ? 0 : 1;
    atomic_store(&cancel_flag, 0);
    memset(c, 0, sizeof(double) * M * N);
    int rc = dspk__cpu_gemm_batched(dev, dbl ? DSPK_F64 : DSPK_F32, 1, M, N, K, a, b, c,
                                    &ctx);
    sim_rate = 0;
    dspk__cpu_gemm_clock_skew = 0;
    if (pass != 1) {
      assert_int_equal(rc, DSPK_ECANCELED);
      assert_int_equal(gemm_calls, 1);
      assert_true(sim_canceled_call > 0 && sim_canceled_call <= 0.2);
      if (dbl) /* a first tile (2^26 multiply-adds), not one sized from f32 */
        assert_true(sim_canceled_call <= (double)(1 << 26) / (1e11 / 8));
      continue;
    }
    assert_int_equal(rc, 0);
    assert_true(gemm_calls > 1);
    assert_true(sim_longest <= 0.2);
    /* The speed the later tiles were sized from is this machine's. */
    assert_true(dev->gemm_rate[0] <= 1e11 / 8);
    assert_true(dev->gemm_rate_best[0] == 1e11);
    const float *fa = (const float *)a, *fb = (const float *)b, *fc = (const float *)c;
    for (int i = 0; i < M; i += 37)
      for (int j = 0; j < N; j += 29) {
        double want = 0;
        for (int l = 0; l < K; l++)
          want += (double)fa[i * K + l] * fb[l * N + j];
        assert_true(fabs(fc[i * N + j] - want) <= 1e-6 * (1 + fabs(want)));
      }
  }
  dev->gemm_threads = 0;
  memset(dev->gemm_rate, 0, sizeof dev->gemm_rate);
  memset(dev->gemm_rate_best, 0, sizeof dev->gemm_rate_best);
  free(a);
  free(b);
  free(c);
}

static void test_gemm_threads(void **state) {
  (void)state;
  uint64_t before = tune_stats().puts;
  /* Not quick (the loop may not run it) before its thread count is
   * decided: that would tune on the loop thread. */
  struct dspk__op op = gemm_op(64, 64, 64);
  int decided = dspk__cpu_tune_gemm_decided(dev, DSPK_F32, 64, 64, 64);
  assert_int_equal(dspk__backend_cpu.quick(dev, &op) != 0, decided >= 0);
  int t = dspk__cpu_tune_gemm_threads(dev, DSPK_F32, 64, 64, 64);
  assert_int_equal(dspk__cpu_tune_gemm_decided(dev, DSPK_F32, 64, 64, 64), t);
  assert_true(dspk__backend_cpu.quick(dev, &op));
  /* Large products are never quick; untuned ones need no decision. */
  op = gemm_op(512, 512, 512);
  assert_false(dspk__backend_cpu.quick(dev, &op));
  op = gemm_op(1 << 20, 8, 1);
  assert_false(dspk__backend_cpu.quick(dev, &op)); /* 40 MiB of operands */
  assert_int_equal(dspk__cpu_tune_gemm_decided(dev, DSPK_C64, 8, 8, 8), 0);
  assert_true(t >= 0);
  if (t > 0) /* more than one thread available: it was measured */
    assert_int_equal(tune_stats().puts, before + 1);
  /* A decision already made is looked up before any scratch matrix is
   * allocated and filled (that was 16% of a small gemm's runner time). */
  aligned_allocs = 0;
  assert_int_equal(dspk__cpu_tune_gemm_threads(dev, DSPK_F32, 60, 50, 40), t);
  assert_int_equal(aligned_allocs, 0);
  assert_int_equal(dspk__cpu_tune_gemm_threads(dev, DSPK_F32, 2048, 2048, 2048), 0);
  assert_int_equal(dspk__cpu_tune_gemm_threads(dev, DSPK_C64, 8, 8, 8), 0);
}

static void test_fft_wisdom(void **state) {
  (void)state;
  assert_int_equal(dspk__cpu_tune_fft_flags(dev, 1 << 20, 1), FFTW_MEASURE);
  assert_int_equal(dspk__cpu_tune_fft_flags(dev, 64, 4096), FFTW_ESTIMATE);
  struct dspk__devenv none = {0};
  struct dspk__dev *bare;
  assert_int_equal(dspk__backend_cpu.open(0, &none, &bare), 0);
  assert_int_equal(dspk__cpu_tune_fft_flags(bare, 1 << 20, 1), FFTW_ESTIMATE);
  assert_int_equal(dspk__cpu_tune_wisdom_save(bare), 0);
  dspk__backend_cpu.close(bare);

  void *plan = dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 2048, 1, 0, 1);
  assert_non_null(plan);
  /* Stored now (by the backend's own hook after planning, or here). */
  assert_true(dspk__cpu_tune_wisdom_save(dev) >= 0);
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(cache, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 2);
  assert_int_equal(dspk__cpu_tune_wisdom_save(dev), 0);
  assert_true(dspk__cpu_tune_wisdom_load(dev) >= 1);

  /* A plan the stored wisdom answers is not measured and makes nothing to
   * save (a restarted daemon's first fft used to export and compare its
   * whole wisdom after such a plan); a new size is measured. */
  dspk__cpu_fft_release(dev);
  dev->wisdom_dirty = 0;
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 2048, 1, 0, 1));
  assert_int_equal(dev->wisdom_dirty, 0);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 1536, 1, 0, 1));
  assert_int_equal(dev->wisdom_dirty, 1);
}

/* One forward c64 fft of an impulse at index 1 through the backend's run
 * (so through its adoption point): X[k] = exp(-2 pi i k / n). */
static void run_fft_impulse(int64_t n) {
  const struct dspk__backend *be = &dspk__backend_cpu;
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FFT;
  op.nin = op.nout = 1;
  op.in[0].dtype = op.out[0].dtype = DSPK_C64;
  op.in[0].rank = op.out[0].rank = 1;
  op.in[0].shape[0] = op.out[0].shape[0] = n;
  size_t nb = (size_t)n * sizeof(float complex);
  assert_int_equal(be->alloc(dev, nb, &op.in[0].mem), 0);
  assert_int_equal(be->alloc(dev, nb, &op.out[0].mem), 0);
  float complex *x = be->host_ptr(dev, op.in[0].mem), *y = be->host_ptr(dev, op.out[0].mem);
  memset(x, 0, nb);
  x[1] = 1;
  atomic_int cancel = 0;
  struct dspk__opctx ctx = {.cancel = &cancel};
  assert_int_equal(be->run(dev, &op, &ctx), 0);
  for (int64_t k = 0; k < n; k += 997) {
    double a = -2 * 3.14159265358979323846 * (double)k / (double)n;
    assert_true(cabs((double complex)y[k] - (cos(a) + I * sin(a))) < 1e-4);
  }
  be->free(dev, op.in[0].mem);
  be->free(dev, op.out[0].mem);
}

/* A plan of 2^16 points or more that the wisdom does not answer: estimated
 * for the task (no wisdom yet), measured in full by the background thread,
 * swapped in at the start of the next op (a new plan of the same key),
 * its wisdom stored, results right with either plan. */
static void test_fft_background_measure(void **state) {
  (void)state;
  const int n = 1 << 16;
  dspk__cpu_fft_release(dev);
  dev->wisdom_dirty = 0;
  uint64_t refined = dev->plans_refined;
  void *est = dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 0, n, 1, 0, 1);
  assert_non_null(est);
  assert_int_equal(dev->wisdom_dirty, 0); /* estimated: nothing measured yet */
  run_fft_impulse(n); /* the estimated plan, while the thread measures */
  assert_true(dspk__cpu_fft_refine_wait(dev) <= 1);
  run_fft_impulse(n); /* adopts first: the measured plan */
  assert_int_equal(dev->plans_refined, refined + 1);
  void *measured = dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 0, n, 1, 0, 1);
  assert_non_null(measured);
  assert_ptr_not_equal(measured, est);
  assert_int_equal(dev->wisdom_dirty, 0); /* stored */
  /* The wisdom answers it now: after a release it is made from wisdom. */
  dspk__cpu_fft_release(dev);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 0, n, 1, 0, 1));
  assert_int_equal(dspk__cpu_fft_refine_wait(dev), 0);
  assert_null(dev->refine); /* nothing was queued */
}

/* A measured plan nobody adopted is freed by the release (ASan's leak
 * check), and a plan the runner needs while a measuring holds the planner
 * lock gives up when its task is canceled. */
static void *hold_lock(void *arg) {
  atomic_int *st = arg;
  dspk__cpu_fftw_lock();
  atomic_store(st, 1);
  while (atomic_load(st) == 1) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  dspk__cpu_fftw_unlock();
  return NULL;
}

static void test_fft_background_release_cancel(void **state) {
  (void)state;
  dspk__cpu_fft_release(dev);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 1 << 17, 1, 0, 1));
  assert_true(dspk__cpu_fft_refine_wait(dev) <= 1);
  dspk__cpu_fft_release(dev); /* drops the measured plan unadopted */
  assert_null(dev->refine);

  atomic_int st = 0, cancel = 1;
  struct dspk__opctx ctx = {.cancel = &cancel};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_lock, &st), 0);
  while (atomic_load(&st) == 0) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  dev->ctx = &ctx; /* as cpu_run sets it */
  assert_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 777, 1, 0, 1));
  dev->ctx = NULL;
  atomic_store(&st, 2);
  pthread_join(t, NULL);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 777, 1, 0, 1));
}

/* The number of this process's threads named name. */
static int threads_named(const char *name) {
  char path[300], comm[32];
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  assert_non_null(d);
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f && fgets(comm, sizeof comm, f) && strncmp(comm, name, strlen(name)) == 0)
      n++;
    if (f)
      fclose(f);
  }
  closedir(d);
  return n;
}

/* A release (device close) while a background measuring runs does not
 * wait for it: the thread is still there when the release has returned,
 * and it frees the device's plans and its own when done (ASan's leak
 * check; the test binary may exit first).  The gate holds the thread
 * before its measuring, so that it cannot have finished before the checks
 * (wisdom can answer a measuring at once).  Last: the thread may still
 * hold the planner lock when the tests end. */
static void test_fft_background_release_busy(void **state) {
  (void)state;
  dspk__cpu_fft_release(dev);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 777, 1, 0, 1));
  dspk__cpu_fft_refine_gate(1);
  assert_non_null(dspk__cpu_fft_plan(dev, DSPK__CPU_FFT_FWD, 1, 1 << 21, 1, 0, 1));
  assert_non_null(dev->refine);
  dspk__cpu_fft_release(dev);
  assert_null(dev->refine);
  assert_int_equal(dev->nplans, 0);
  assert_int_equal(threads_named("dspk-fftw-plan"), 1); /* still running */
  dspk__cpu_fft_refine_gate(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fir_choice),
      cmocka_unit_test(test_gemm_threads),
      cmocka_unit_test(test_gemm_whole),
      cmocka_unit_test(test_gemm_cancel_loaded),
      cmocka_unit_test(test_fft_wisdom),
      cmocka_unit_test(test_fft_background_measure),
      cmocka_unit_test(test_fft_background_release_cancel),
      cmocka_unit_test(test_fft_background_release_busy),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
