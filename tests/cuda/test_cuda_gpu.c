/*
 * GPU tests of the CUDA backend (ctest label "gpu"; scripts/gpu-suite.sh runs
 * them on the GPU machine).  Every op runs on cuda:0 and on the cpu backend
 * with the same random inputs (fixed seeds) and the results must agree;
 * f16/bf16 gemm is checked against naive double loops over the rounded
 * inputs; gemm, fft and contract also through the shared GPU runtime's own
 * kernels (the HIP backend's fallbacks without hipBLAS/hipFFT).  Also: raw kernels (arguments, compile errors with the log, a
 * missing entry), the fault path (an illegal address in a raw kernel fails
 * its task with a clear error; the kernel ran in the worker process, so the
 * daemon's context and buffers live on and the next raw kernel gets a fresh
 * worker; a worker killed outright is reported and replaced), a contraction trace that evicts plans through the retirement
 * queue (no barrier fallback, nothing leaked), and a restart with a warm
 * kernel cache (nothing compiled the second time).  The pinned staging
 * ring: round trips of odd sizes spanning chunks and the whole ring, and
 * uploads that reuse chunks while their earlier DMAs wait behind a busy
 * stream.  Reductions: every kernel candidate forced in turn, and tuned
 * launches whose decisions persist in the cache across a reopen.  fir's
 * overlap-save path (cuFFT) forced in each block size against a
 * double-precision direct loop, and its tuned choice kept in the cache
 * across a reopen.  Exits 77 when the host
 * has no CUDA device.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/common/autotune.h"
#include "backends/common/fir_tune.h"
#include "cache/cache.h"

extern const struct dspk__backend dspk__backend_cpu;
static const struct dspk__backend *CPU = &dspk__backend_cpu;
static const struct dspk__backend *GPU = &dspk__backend_cuda;
static struct dspk__dev *cpu, *gpu;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}
static int irand(int lo, int hi) { return lo + (int)((urand() + 1.0) * 0.5 * (hi - lo + 1)) % (hi - lo + 1); }

static struct dspk__tensor T(dspk_dtype dt, int rank, const int64_t *shape) {
  struct dspk__tensor t;
  memset(&t, 0, sizeof(t));
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++)
    t.shape[i] = shape[i];
  return t;
}

static void *rand_data(const struct dspk__tensor *t) {
  size_t n = (size_t)dspk__tensor_numel(t) * (dspk__dtype_is_complex(t->dtype) ? 2 : 1);
  void *p = malloc(dspk__tensor_nbytes(t) + 16);
  for (size_t i = 0; i < n; i++) {
    if (t->dtype == DSPK_F32 || t->dtype == DSPK_C64)
      ((float *)p)[i] = (float)urand();
    else
      ((double *)p)[i] = urand();
  }
  return p;
}

/* Progress callback handed to the GPU's ops by run_on (NULL: none). */
static void (*run_progress)(void *ud, const char *what, double fraction);

/* Runs op (inputs from host memory) on one backend; writes malloc'd
 * outputs.  Returns the backend's code; the message goes into err. */
static int run_on(const struct dspk__backend *be, struct dspk__dev *dev,
                  const struct dspk__op *tmpl, void *const in[], void *out[],
                  char *err, size_t errlen) {
  struct dspk__op op = *tmpl;
  struct dspk__mem *mi[DSPK__OP_MAX_IN] = {0}, *mo[DSPK__OP_MAX_OUT] = {0};
  atomic_int cancel = 0;
  struct dspk__opctx ctx = {&cancel, be == GPU ? run_progress : NULL, NULL, err, errlen, 0};
  char msg[256];
  int rc = dspk__op_infer(&op, msg, sizeof(msg));
  err[0] = 0;
  if (rc) {
    snprintf(err, errlen, "infer: %s", msg);
    return rc;
  }
  for (int i = 0; i < op.nin; i++) {
    size_t n = dspk__tensor_nbytes(&op.in[i]);
    assert_int_equal(be->alloc(dev, n, &mi[i]), 0);
    assert_int_equal(be->write(dev, mi[i], 0, in[i], n), 0);
    op.in[i].mem = mi[i];
  }
  for (int i = 0; i < op.nout; i++) {
    assert_int_equal(be->alloc(dev, dspk__tensor_nbytes(&op.out[i]), &mo[i]), 0);
    op.out[i].mem = mo[i];
  }
  rc = be->run(dev, &op, &ctx);
  for (int i = 0; i < op.nout && rc == 0; i++) {
    size_t n = dspk__tensor_nbytes(&op.out[i]);
    out[i] = malloc(n + 16);
    rc = be->read(dev, mo[i], 0, out[i], n);
  }
  for (int i = 0; i < op.nin; i++)
    be->free(dev, mi[i]);
  for (int i = 0; i < op.nout; i++)
    be->free(dev, mo[i]);
  return rc;
}

/* Max |a-b| over max |b| (complex as pairs of reals). */
static double relerr(dspk_dtype dt, const void *a, const void *b, int64_t numel) {
  int64_t n = numel * (dspk__dtype_is_complex(dt) ? 2 : 1);
  double md = 0, mb = 1e-300;
  for (int64_t i = 0; i < n; i++) {
    double x, y;
    if (dt == DSPK_F32 || dt == DSPK_C64) {
      x = ((const float *)a)[i];
      y = ((const float *)b)[i];
    } else {
      x = ((const double *)a)[i];
      y = ((const double *)b)[i];
    }
    if (isnan(x) != isnan(y))
      return INFINITY;
    if (isnan(x))
      continue;
    if (fabs(x - y) > md)
      md = fabs(x - y);
    if (fabs(y) > mb)
      mb = fabs(y);
  }
  return md / mb;
}

static double tol_of(dspk_dtype dt) {
  return (dt == DSPK_F32 || dt == DSPK_C64) ? 2e-5 : 1e-11;
}

/* Runs op on both backends with the same random inputs and compares. */
static void check_op(const char *what, const struct dspk__op *op) {
  void *in[DSPK__OP_MAX_IN] = {0}, *og[2] = {0}, *oc[2] = {0};
  char eg[1024], ec[1024];
  struct dspk__op inf = *op;
  int rg, rcpu;
  char msg[256];
  assert_int_equal(dspk__op_infer(&inf, msg, sizeof(msg)), 0);
  for (int i = 0; i < op->nin; i++)
    in[i] = rand_data(&op->in[i]);
  rg = run_on(GPU, gpu, op, in, og, eg, sizeof(eg));
  rcpu = run_on(CPU, cpu, op, in, oc, ec, sizeof(ec));
  if (rg != 0 || rcpu != 0)
    fail_msg("%s: cuda %d (%s), cpu %d (%s)", what, rg, eg, rcpu, ec);
  for (int i = 0; i < inf.nout; i++) {
    double e = relerr(inf.out[i].dtype, og[i], oc[i], dspk__tensor_numel(&inf.out[i]));
    double tol = tol_of(inf.out[i].dtype);
    if (!(e <= tol))
      fail_msg("%s: output %d differs from the cpu backend: rel err %g > %g", what, i, e, tol);
  }
  for (int i = 0; i < op->nin; i++)
    free(in[i]);
  for (int i = 0; i < 2; i++) {
    free(og[i]);
    free(oc[i]);
  }
}

static const dspk_dtype std4[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};

/* ---- ops against the cpu backend ----------------------------------------- */

static void test_gemm(void **state) {
  (void)state;
  for (int it = 0; it < 24; it++) {
    struct dspk__op op;
    dspk_dtype dt = it % 2 ? DSPK_F64 : DSPK_F32;
    int64_t M = irand(1, 70), K = irand(1, 90), N = irand(1, 70), b = irand(2, 4);
    int ta = (it / 2) % 2, tb = (it / 4) % 2, kind = (it / 8) % 3;
    int64_t as[4], bs[4];
    char what[96];
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.u.gemm.trans_a = ta;
    op.u.gemm.trans_b = tb;
    op.u.gemm.alpha = 1.0;
    if (kind == 0) { /* plain */
      as[0] = ta ? K : M; as[1] = ta ? M : K;
      bs[0] = tb ? N : K; bs[1] = tb ? K : N;
      op.in[0] = T(dt, 2, as);
      op.in[1] = T(dt, 2, bs);
    } else if (kind == 1) { /* batch x broadcast matrix, with C */
      as[0] = b; as[1] = ta ? K : M; as[2] = ta ? M : K;
      bs[0] = tb ? N : K; bs[1] = tb ? K : N;
      op.in[0] = T(dt, 3, as);
      op.in[1] = T(dt, 2, bs);
      int64_t cs[1] = {N};
      op.in[2] = T(dt, 1, cs);
      op.nin = 3;
      op.u.gemm.alpha = 0.5;
      op.u.gemm.beta = -2.0;
    } else { /* broadcasting both ways */
      as[0] = b; as[1] = 1; as[2] = ta ? K : M; as[3] = ta ? M : K;
      bs[0] = 1; bs[1] = 3; bs[2] = tb ? N : K; bs[3] = tb ? K : N;
      op.in[0] = T(dt, 4, as);
      op.in[1] = T(dt, 4, bs);
    }
    if (op.nin == 0)
      op.nin = 2;
    snprintf(what, sizeof(what), "gemm %s M=%lld K=%lld N=%lld ta=%d tb=%d kind=%d",
             dspk__dtype_name(dt), (long long)M, (long long)K, (long long)N, ta, tb, kind);
    check_op(what, &op);
  }
}

/* The same products through cuBLAS: test_gemm's sizes are small, so by
 * default they take the tiled kernel (DSPK__GPURT_GEMM_SMALL). */
static void test_gemm_blas(void **state) {
  dspk__cuda_set_gemm_small(gpu, 0);
  test_gemm(state);
  dspk__cuda_set_gemm_small(gpu, DSPK__GPURT_GEMM_SMALL);
}

static uint16_t to_bf16(float f, float *back) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  memcpy(back, &u, 4);
  return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f, float *back) {
  /* Values in [-1, 1]: normal or zero halves, round to nearest. */
  int e;
  double m = frexp(f, &e); /* f = m * 2^e, 0.5 <= |m| < 1 */
  uint16_t s = f < 0 ? 0x8000 : 0;
  if (f == 0 || e < -13) {
    *back = 0;
    return s;
  }
  long q = lround(fabs(m) * 2048.0); /* 11 significant bits */
  if (q == 2048) {
    q = 1024;
    e++;
  }
  *back = (float)ldexp((double)q / 2048.0, e) * (f < 0 ? -1.f : 1.f);
  return (uint16_t)(s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(q & 0x3ff));
}

static void test_gemm_half(void **state) {
  (void)state;
  for (int it = 0; it < 4; it++) {
    dspk_dtype dt = it % 2 ? DSPK_BF16 : DSPK_F16;
    int64_t M = irand(1, 80), K = irand(1, 200), N = irand(1, 80), b = it < 2 ? 1 : 3;
    int64_t as[3] = {b, M, K}, bs[2] = {K, N};
    struct dspk__op op;
    uint16_t *ha = malloc((size_t)(b * M * K) * 2), *hb = malloc((size_t)(K * N) * 2);
    float *fa = malloc((size_t)(b * M * K) * 4), *fb = malloc((size_t)(K * N) * 4), *out[2] = {0};
    void *in[2] = {ha, hb};
    char err[512];
    double md = 0, mr = 1e-30;
    for (int64_t i = 0; i < b * M * K; i++)
      ha[i] = dt == DSPK_BF16 ? to_bf16((float)urand(), &fa[i]) : to_f16((float)urand(), &fa[i]);
    for (int64_t i = 0; i < K * N; i++)
      hb[i] = dt == DSPK_BF16 ? to_bf16((float)urand(), &fb[i]) : to_f16((float)urand(), &fb[i]);
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.nin = 2;
    op.in[0] = T(dt, 3, as);
    op.in[1] = T(dt, 2, bs);
    op.u.gemm.alpha = 1.0;
    if (run_on(GPU, gpu, &op, in, (void **)out, err, sizeof(err)) != 0)
      fail_msg("gemm %s: %s", dspk__dtype_name(dt), err);
    for (int64_t q = 0; q < b; q++)
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double s = 0;
          for (int64_t k = 0; k < K; k++)
            s += (double)fa[(q * M + i) * K + k] * fb[k * N + j];
          md = fmax(md, fabs(s - out[0][(q * M + i) * N + j]));
          mr = fmax(mr, fabs(s));
        }
    if (md / mr > 1e-5)
      fail_msg("gemm %s: rel err %g", dspk__dtype_name(dt), md / mr);
    free(ha); free(hb); free(fa); free(fb); free(out[0]);
  }
}

static void test_fft(void **state) {
  static const int64_t lens[] = {1, 2, 97, 128, 1000, 4096, 1 << 16};
  (void)state;
  for (int it = 0; it < 28; it++) {
    dspk_dtype dt = std4[it % 4];
    int64_t n = lens[(it / 4) % 7], shape[2] = {irand(1, 3), n};
    struct dspk__op op;
    char what[64];
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_FFT;
    op.nin = 1;
    op.in[0] = T(dt, 2, shape);
    op.u.fft.inverse = dspk__dtype_is_complex(dt) && (it / 2) % 2;
    snprintf(what, sizeof(what), "fft %s n=%lld inv=%d", dspk__dtype_name(dt), (long long)n,
             op.u.fft.inverse);
    check_op(what, &op);
  }
}

/* The shared GPU runtime's own gemm and fft kernels (kernels/gemm.cu,
 * dft.cu), which the HIP backend uses where hipBLAS/rocBLAS or hipFFT are
 * missing: here run through the CUDA table on real hardware, against the
 * cpu backend.  Contractions take the complex gemm kernel. */
static void test_own_kernels(void **state) {
  static const int64_t lens[] = {1, 2, 97, 128, 1000, 4096};
  (void)state;
  dspk__cuda_set_own_kernels(gpu, 1);
  test_gemm(state);
  for (int it = 0; it < 24; it++) {
    dspk_dtype dt = std4[it % 4];
    int64_t n = lens[(it / 4) % 6], shape[2] = {irand(1, 3), n};
    struct dspk__op op;
    char what[64];
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_FFT;
    op.nin = 1;
    op.in[0] = T(dt, 2, shape);
    op.u.fft.inverse = dspk__dtype_is_complex(dt) && (it / 2) % 2;
    snprintf(what, sizeof(what), "own fft %s n=%lld inv=%d", dspk__dtype_name(dt),
             (long long)n, op.u.fft.inverse);
    check_op(what, &op);
  }
  for (int it = 0; it < 8; it++) {
    struct dspk__op op;
    int64_t as[3] = {irand(1, 3), irand(1, 40), irand(1, 40)}, bs[2];
    bs[0] = as[2];
    bs[1] = irand(1, 40);
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_CONTRACT;
    op.nin = 2;
    op.in[0] = T(std4[it % 4], 3, as);
    op.in[1] = T(std4[it % 4], 2, bs);
    snprintf(op.u.contract.subscripts, sizeof(op.u.contract.subscripts), "bij,jk->bki");
    check_op("own contract bij,jk->bki", &op);
  }
  dspk__cuda_set_own_kernels(gpu, 0);
}

static void test_fir(void **state) {
  static const int64_t taps[] = {1, 5, 33, 700};
  (void)state;
  for (int it = 0; it < 16; it++) {
    dspk_dtype dt = std4[it % 4];
    int64_t xs[2] = {irand(1, 4), irand(1, 3000)}, hs[1] = {taps[it / 4]};
    struct dspk__op op;
    char what[64];
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_FIR;
    op.nin = 2;
    op.in[0] = T(dt, 2, xs);
    op.in[1] = T(dt, 1, hs);
    snprintf(what, sizeof(what), "fir %s n=%lld k=%lld", dspk__dtype_name(dt),
             (long long)xs[1], (long long)hs[0]);
    check_op(what, &op);
  }
}

/* ---- fir: the FFT (overlap-save) path ------------------------------------- */

/* Element i of a host array of dtype dt as (re, im). */
static void elem(dspk_dtype dt, const void *p, int64_t i, double *re, double *im) {
  switch (dt) {
  case DSPK_F32: *re = ((const float *)p)[i]; *im = 0; break;
  case DSPK_F64: *re = ((const double *)p)[i]; *im = 0; break;
  case DSPK_C64: *re = ((const float *)p)[2 * i]; *im = ((const float *)p)[2 * i + 1]; break;
  default: *re = ((const double *)p)[2 * i]; *im = ((const double *)p)[2 * i + 1]; break;
  }
}

/* Max over the checked outputs of |got - ref| / max |ref|, the reference a
 * double-precision direct loop: every output when rows*n*k is small, else
 * `samples` outputs spread over the signal (the first k among them). */
static double fir_vs_loop(dspk_dtype dt, const void *x, const void *h, const void *y,
                          int64_t rows, int64_t n, int64_t k, int samples) {
  int64_t total = rows * n, step = 1;
  double md = 0, mr = 1e-300;
  if ((double)total * (double)k > 2e8)
    step = total / samples + 1;
  for (int64_t i = 0; i < total; i += (i < k ? 1 : step)) {
    int64_t row = i / n, t = i % n;
    double ar = 0, ai = 0, xr, xi, hr, hi, gr, gi;
    for (int64_t j = 0; j < k && j <= t; j++) {
      elem(dt, h, j, &hr, &hi);
      elem(dt, x, row * n + t - j, &xr, &xi);
      ar += hr * xr - hi * xi;
      ai += hr * xi + hi * xr;
    }
    elem(dt, y, i, &gr, &gi);
    if (!(fabs(gr - ar) <= md))
      md = isnan(gr) ? INFINITY : fmax(md, fabs(gr - ar));
    if (!(fabs(gi - ai) <= md))
      md = isnan(gi) ? INFINITY : fmax(md, fabs(gi - ai));
    mr = fmax(mr, hypot(ar, ai));
  }
  return md / mr;
}

/* fir on cuda:0 with the path forced (mode -1: the normal choice); returns
 * the malloc'd output. */
static void *fir_gpu(dspk_dtype dt, int64_t rows, int64_t n, int64_t k, void *in[2],
                     int mode) {
  struct dspk__op op;
  int64_t xs[2] = {rows, n}, hs[1] = {k};
  void *out[1] = {NULL};
  char err[512];
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  op.in[0] = T(dt, 2, xs);
  op.in[1] = T(dt, 1, hs);
  dspk__cuda_fir_force(mode);
  int rc = run_on(GPU, gpu, &op, in, out, err, sizeof(err));
  dspk__cuda_fir_force(-1);
  if (rc)
    fail_msg("fir %s %lldx%lld k=%lld mode %d: %d %s", dspk__dtype_name(dt), (long long)rows,
             (long long)n, (long long)k, mode, rc, err);
  return out[0];
}

/* The overlap-save path forced in each block size, and the direct kernel,
 * against a double-precision direct loop and against each other: lengths
 * not powers of two, batches, a signal shorter than the filter, one tap,
 * and 2^20 samples with 4096 taps (sampled outputs). */
static void test_fir_fft(void **state) {
  static const int64_t cases[][3] = {
      {1, 1000, 200}, {3, 777, 129}, {2, 50, 300},  {1, 513, 1},     {4, 3001, 64},
      {1, 9000, 1500}, {5, 1, 7},    {2, 130, 130}, {1, 1 << 20, 4096}, {3, 100000, 1000}};
  static const char *const names[4] = {"direct", "ols-x4", "ols-x8", "ols-x16"};
  (void)state;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = std4[di];
    double tol = (dt == DSPK_F32 || dt == DSPK_C64) ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
      int64_t rows = cases[c][0], n = cases[c][1], k = cases[c][2];
      int64_t xs[2] = {rows, n}, hs[1] = {k};
      struct dspk__tensor tx = T(dt, 2, xs), th = T(dt, 1, hs);
      void *in[2] = {rand_data(&tx), rand_data(&th)}, *ref = NULL;
      for (int m = 0; m < 4; m++) {
        void *y = fir_gpu(dt, rows, n, k, in, m);
        double e = fir_vs_loop(dt, in[0], in[1], y, rows, n, k, 4000);
        double ed = m ? relerr(dt, y, ref, rows * n) : 0;
        assert_string_equal(dspk__cuda_fir_last(), names[m]);
        if (!(e <= tol) || !(ed <= 2 * tol))
          fail_msg("fir %s %s %lldx%lld k=%lld: rel err %g vs the loop, %g vs direct",
                   names[m], dspk__dtype_name(dt), (long long)rows, (long long)n,
                   (long long)k, e, ed);
        if (m)
          free(y);
        else
          ref = y;
      }
      /* the 64-bit kernels, which only sizes of 2^31 and more take */
      setenv("DSPK_GPURT_FIR_WIDE", "1", 1);
      void *yw = fir_gpu(dt, rows, n, k, in, 2);
      unsetenv("DSPK_GPURT_FIR_WIDE");
      double ew = relerr(dt, yw, ref, rows * n);
      if (!(ew <= 2 * tol))
        fail_msg("fir ols-x8 with 64-bit indices %s %lldx%lld k=%lld: rel err %g vs direct",
                 dspk__dtype_name(dt), (long long)rows, (long long)n, (long long)k, ew);
      free(yw);
      free(ref);
      free(in[0]);
      free(in[1]);
    }
  }
}

/* Element i of a host array of dtype dt set to (re, im). */
static void set_elem(dspk_dtype dt, void *p, int64_t i, double re, double im) {
  switch (dt) {
  case DSPK_F32: ((float *)p)[i] = (float)re; break;
  case DSPK_F64: ((double *)p)[i] = re; break;
  case DSPK_C64: ((float *)p)[2 * i] = (float)re; ((float *)p)[2 * i + 1] = (float)im; break;
  default: ((double *)p)[2 * i] = re; ((double *)p)[2 * i + 1] = im; break;
  }
}

/* The overlap-save path (forced in each block size, and chosen) on a NaN
 * or an Inf in x, a NaN in the last tap, and finite data whose transforms
 * overflow (3e38 times taps of 1e-6 in single precision: sums of at most
 * 9e34), every dtype, rows of one block and of several: the non-finite
 * outputs exactly where a direct loop in double has them, component by
 * component, the others within the path's tolerance of the largest
 * finite output. */
static void test_fir_fft_nonfinite(void **state) {
  static const int64_t cases[][3] = {{2, 2000, 300}, {1, 9000, 300}, {2, 20000, 1100}};
  (void)state;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = std4[di];
    int sp = dt == DSPK_F32 || dt == DSPK_C64, w = dspk__dtype_is_complex(dt) ? 2 : 1;
    double tol = sp ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
      for (int v = 0; v < 4; v++)
        for (int m = -1; m < 4; m++) {
          if (m == 0)
            continue;
          int64_t rows = cases[c][0], n = cases[c][1], k = cases[c][2], at = (rows - 1) * n + n / 4;
          int64_t xs[2] = {rows, n}, hs[1] = {k};
          struct dspk__tensor tx = T(dt, 2, xs), th = T(dt, 1, hs);
          void *in[2] = {rand_data(&tx), rand_data(&th)};
          double big = sp ? 3e38 : 1.7e308, re, im;
          if (v == 0) {
            elem(dt, in[0], at, &re, &im);
            set_elem(dt, in[0], at, NAN, im);
          } else if (v == 1) {
            elem(dt, in[0], at, &re, &im);
            set_elem(dt, in[0], at, w == 2 ? re : INFINITY, INFINITY);
          } else if (v == 2) {
            elem(dt, in[1], k - 1, &re, &im);
            set_elem(dt, in[1], k - 1, NAN, im);
          } else {
            for (int64_t i = 0; i < rows * n; i++)
              set_elem(dt, in[0], i, big, big);
            for (int64_t i = 0; i < k; i++)
              set_elem(dt, in[1], i, 1e-6, 1e-6);
          }
          void *y = fir_gpu(dt, rows, n, k, in, m);
          double *want = malloc(sizeof(double) * (size_t)(2 * rows * n)), mx = 1;
          for (int64_t i = 0; i < rows * n; i++) {
            int64_t row = i / n, t = i % n;
            double ar = 0, ai = 0, xr, xi, hr, hi;
            for (int64_t j = 0; j < k && j <= t; j++) {
              elem(dt, in[1], j, &hr, &hi);
              elem(dt, in[0], row * n + t - j, &xr, &xi);
              ar += hr * xr - hi * xi;
              ai += hr * xi + hi * xr;
            }
            want[2 * i] = ar;
            want[2 * i + 1] = ai;
            if (isfinite(ar))
              mx = fmax(mx, fabs(ar));
            if (isfinite(ai))
              mx = fmax(mx, fabs(ai));
          }
          for (int64_t i = 0; i < rows * n; i++) {
            double g[2];
            elem(dt, y, i, &g[0], &g[1]);
            for (int p = 0; p < w; p++) {
              double f = want[2 * i + p];
              if (!!isfinite(g[p]) != !!isfinite(f) || (isfinite(f) && !(fabs(g[p] - f) <= tol * mx)))
                fail_msg("fir %s mode %d (%s) %lldx%lld k=%lld case %d: output (row %lld, sample "
                         "%lld%s) is %g, the direct sum %g", dspk__dtype_name(dt), m,
                         dspk__cuda_fir_last(), (long long)rows, (long long)n, (long long)k, v,
                         (long long)(i / n), (long long)(i % n), p ? " im" : "", g[p], f);
            }
          }
          free(want);
          free(y);
          free(in[0]);
          free(in[1]);
        }
  }
}

/* The overlap-save path keeps rows apart (each forced block size, every
 * dtype): rows 0 and 3 of zeros come out exactly zero, and rows of order
 * 1e30, 1 and 1e-20 in one batch each within tol of their own largest
 * output (a double loop), as the direct sum: no row's values or rounding
 * reach another's (vk_fir.c once packed two rows into one transform). */
static void test_fir_fft_rows(void **state) {
  static const int64_t cases[][2] = {{1000, 900}, {600, 599}, {5000, 200}, {300, 1000}};
  static const double scale[6] = {0, 1e30, 1, 0, 1e-20, 1};
  (void)state;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = std4[di];
    int w = dspk__dtype_is_complex(dt) ? 2 : 1;
    double tol = (dt == DSPK_F32 || dt == DSPK_C64) ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
      for (int m = 1; m < 4; m++) {
        int64_t rows = 6, n = cases[c][0], k = cases[c][1], xs[2] = {rows, n}, hs[1] = {k};
        struct dspk__tensor tx = T(dt, 2, xs), th = T(dt, 1, hs);
        void *in[2] = {rand_data(&tx), rand_data(&th)};
        for (int64_t i = 0; i < rows * n; i++) {
          double re, im;
          elem(dt, in[0], i, &re, &im);
          set_elem(dt, in[0], i, re * scale[i / n], im * scale[i / n]);
        }
        void *y = fir_gpu(dt, rows, n, k, in, m);
        for (int64_t r = 0; r < rows; r++) {
          double big = 0, err = 0;
          int64_t nz = 0;
          for (int64_t t = 0; t < n; t++) {
            double ar = 0, ai = 0, xr, xi, hr, hi, g[2];
            for (int64_t j = 0; j < k && j <= t; j++) {
              elem(dt, in[1], j, &hr, &hi);
              elem(dt, in[0], r * n + t - j, &xr, &xi);
              ar += hr * xr - hi * xi;
              ai += hr * xi + hi * xr;
            }
            elem(dt, y, r * n + t, &g[0], &g[1]);
            nz += g[0] != 0 || (w == 2 && g[1] != 0);
            big = fmax(big, hypot(ar, ai));
            err = fmax(err, hypot(g[0] - ar, w == 2 ? g[1] - ai : 0));
          }
          if (scale[r] == 0 ? nz != 0 : !(err <= tol * big))
            fail_msg("fir %s %s 6x%lld k=%lld: row %lld (of order %g) has %lld non-zero "
                     "outputs, error %g of its largest %g", dspk__cuda_fir_last(),
                     dspk__dtype_name(dt), (long long)n, (long long)k, (long long)r, scale[r],
                     (long long)nz, big > 0 ? err / big : err, big);
        }
        free(y);
        free(in[0]);
        free(in[1]);
      }
  }
}

static struct dspk__cache *restart_on(const char *file);

static int fir_tunings; /* "autotune fir" tunings finished */
static void count_fir_tuning(void *ud, const char *what, double fraction) {
  (void)ud;
  if (fraction >= 1.0 && strcmp(what, "autotune fir") == 0)
    fir_tunings++;
}

/* The tuned choice with a persistent cache: a long filter is tuned once
 * (the result right), the decision is stored under op "fir", layout
 * "path", and after a restart it comes from the cache (no tuning). */
static void test_fir_tuned(void **state) {
  char path[] = "/tmp/dspk-cuda-firtuneXXXXXX", file[64], first[64] = "";
  int64_t xs[2] = {1, 1 << 22}, hs[1] = {4096};
  struct dspk__tensor tx = T(DSPK_F32, 2, xs), th = T(DSPK_F32, 1, hs);
  void *in[2] = {rand_data(&tx), rand_data(&th)};
  (void)state;
  assert_non_null(mkdtemp(path));
  snprintf(file, sizeof(file), "%s/cache.db", path);
  run_progress = count_fir_tuning;
  for (int round = 0; round < 2; round++) {
    struct dspk__cache *cache = restart_on(file);
    char w[64];
    fir_tunings = 0;
    void *y = fir_gpu(DSPK_F32, 1, 1 << 22, 4096, in, -1);
    double e = fir_vs_loop(DSPK_F32, in[0], in[1], y, 1, 1 << 22, 4096, 2000);
    printf("fir f32 2^22, 4096 taps, round %d: %s (%d tunings), rel err %g\n", round,
           dspk__cuda_fir_last(), fir_tunings, e);
    assert_true(e <= 1e-5);
    /* round 0: the path, and the direct candidate's block size (op "fir"
     * too) when that was not tuned yet; round 1: none */
    if (round == 0)
      assert_true(fir_tunings >= 1);
    else
      assert_int_equal(fir_tunings, 0);
    struct dspk__tune_key k = {.dev = dspk__cuda_devid(gpu), .op = "fir",
                               .shape = "n=2^22,row=2^22,k=2^12", .dtypes = "f32",
                               .layout = "path",
                               .cands_hash = dspk__fir_tune_cands_hash()};
    assert_int_equal(dspk__cache_tune_get(cache, &k, w, sizeof(w)), 0);
    assert_string_equal(w, dspk__cuda_fir_last());
    if (round == 0)
      snprintf(first, sizeof(first), "%s", w);
    else
      assert_string_equal(w, first);
    free(y);
    GPU->close(gpu);
    gpu = NULL;
    dspk__cache_close(cache);
  }
  run_progress = NULL;
  dspk__autotune_forget_all();
  assert_int_equal(GPU->open(0, NULL, &gpu), 0);
  free(in[0]);
  free(in[1]);
  unlink(file);
  rmdir(path);
}

static void test_reduce(void **state) {
  (void)state;
  for (int it = 0; it < 40; it++) {
    dspk_dtype dt = std4[it % 4];
    dspk_reduce fn = (dspk_reduce)((it / 4) % 4);
    int64_t s3[3] = {irand(1, 9), irand(1, 40), irand(1, 300)};
    int64_t big[2] = {2, 200000};
    struct dspk__op op;
    char what[96];
    if (dspk__dtype_is_complex(dt) && (fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN))
      fn = DSPK_REDUCE_SUM;
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_REDUCE;
    op.nin = 1;
    op.u.reduce.fn = fn;
    if (it >= 36) {
      op.in[0] = T(dt, 2, big);
      op.u.reduce.axes = 2;
    } else {
      op.in[0] = T(dt, 3, s3);
      op.u.reduce.axes = (uint32_t)(it % 8); /* 0 = all */
    }
    snprintf(what, sizeof(what), "reduce %s fn=%d axes=%u shape=%lldx%lldx%lld",
             dspk__dtype_name(dt), (int)fn, op.u.reduce.axes, (long long)op.in[0].shape[0],
             (long long)op.in[0].shape[1], (long long)op.in[0].shape[2]);
    check_op(what, &op);
  }
}

/* ---- reductions: every kernel candidate, and tuned launches -------------- */

static const char *const reduce_cands[] = {"block128", "block256", "block512", "block1024",
                                           "warp4",    "warp8",    "thread128", "thread256"};

struct rshape {
  int rank;
  int64_t shape[3];
  uint32_t axes;
};
/* Long, short, inner, outer, mixed and all-axes reductions, sizes that are
 * not multiples of a warp or a block. */
static const struct rshape rshapes[] = {
    {2, {1, 1, 0}, 0},        {2, {3, 1001, 0}, 2},     {2, {1001, 3, 0}, 1},
    {3, {5, 7, 301}, 5},      {2, {2, 70001, 0}, 2},    {2, {33, 31, 0}, 0},
    {3, {129, 17, 3}, 2},     {2, {4099, 33, 0}, 2},
};

static void reduce_check(const struct rshape *rs, dspk_dtype dt, dspk_reduce fn,
                         const char *tag) {
  struct dspk__op op;
  char what[160];
  if (dspk__dtype_is_complex(dt) && (fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN))
    fn = DSPK_REDUCE_SUM;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.in[0] = T(dt, rs->rank, rs->shape);
  op.u.reduce.fn = fn;
  op.u.reduce.axes = rs->axes;
  snprintf(what, sizeof(what), "reduce %s %s fn=%d axes=%u shape=%lldx%lldx%lld", tag,
           dspk__dtype_name(dt), (int)fn, rs->axes, (long long)rs->shape[0],
           (long long)rs->shape[1], (long long)rs->shape[2]);
  check_op(what, &op);
}

/* Each kernel and block size on its own, whatever tuning would choose,
 * against the cpu backend. */
static void test_reduce_candidates(void **state) {
  int k = 0;
  (void)state;
  for (size_t c = 0; c < sizeof(reduce_cands) / sizeof(reduce_cands[0]); c++) {
    assert_int_equal(dspk__cuda_set_reduce_force(gpu, reduce_cands[c]), 0);
    for (size_t s = 0; s < sizeof(rshapes) / sizeof(rshapes[0]); s++, k++)
      reduce_check(&rshapes[s], std4[k % 4], (dspk_reduce)(k / 4 % 4), reduce_cands[c]);
  }
  assert_int_equal(dspk__cuda_set_reduce_force(gpu, NULL), 0);
  assert_int_equal(dspk__cuda_set_reduce_force(gpu, "block2048"), DSPK_EINVAL);
}

/* A daemon restart as the device sees it: the in-process memo of autotune
 * decisions forgotten, cuda:0 reopened on the cache file `file` (returned;
 * the caller closes it). */
static struct dspk__cache *restart_on(const char *file) {
  struct dspk__cache *cache;
  struct dspk__devenv env;
  char warn[256];
  dspk__autotune_forget_all();
  assert_int_equal(dspk__cache_open(file, NULL, &cache, warn, sizeof(warn)), 0);
  memset(&env, 0, sizeof(env));
  env.cache = cache;
  GPU->close(gpu);
  gpu = NULL;
  assert_int_equal(GPU->open(0, &env, &gpu), 0);
  return cache;
}

static int tunings; /* "autotune reduce" tunings finished (progress 1.0) */
static void count_tuning(void *ud, const char *what, double fraction) {
  (void)ud;
  if (fraction >= 1.0 && strcmp(what, "autotune reduce") == 0)
    tunings++;
}

/* Reductions with a persistent cache: the first of each shape class tunes
 * (the result still matches the cpu backend), the second does not, and
 * after a restart (memo forgotten, device reopened on the same cache file)
 * none tunes: the decisions came from the cache. */
static void test_reduce_tuned(void **state) {
  static const struct rshape cls[] = {
      {2, {4096, 64, 0}, 2},  {2, {64, 4096, 0}, 1}, {2, {8, 100000, 0}, 2},
      {2, {100000, 8, 0}, 2}, {2, {300, 300, 0}, 0}, {3, {64, 3, 512}, 5},
  };
  const int ncls = (int)(sizeof(cls) / sizeof(cls[0]));
  char path[] = "/tmp/dspk-cuda-rtuneXXXXXX", file[64];
  struct dspk__cache *cache;
  struct dspk__cache_stats cs;
  (void)state;
  assert_non_null(mkdtemp(path));
  snprintf(file, sizeof(file), "%s/cache.db", path);
  run_progress = count_tuning;
  for (int round = 0; round < 2; round++) {
    cache = restart_on(file);
    tunings = 0;
    for (int i = 0; i < ncls; i++)
      reduce_check(&cls[i], i % 2 ? DSPK_F64 : DSPK_F32, DSPK_REDUCE_SUM, "tuned");
    printf("round %d: %d reduce tunings\n", round, tunings);
    /* At least one tuning per class in the first round (an op may run
     * more than one reduce launch, each of its own class; 11 for these 6
     * on the H200), none once the decisions are stored. */
    if (round == 0)
      assert_true(tunings >= ncls);
    else
      assert_int_equal(tunings, 0);
    /* Again in the same process: the memo answers. */
    tunings = 0;
    for (int i = 0; i < ncls; i++)
      reduce_check(&cls[i], i % 2 ? DSPK_F64 : DSPK_F32, DSPK_REDUCE_MAX, "tuned again");
    assert_int_equal(tunings, 0);
    assert_int_equal(dspk__cache_stats(cache, &cs), 0);
    assert_true(cs.kind[DSPK__CACHE_AUTOTUNE].entries >= (uint64_t)ncls);
    GPU->close(gpu);
    gpu = NULL;
    dspk__cache_close(cache);
  }
  run_progress = NULL;
  dspk__autotune_forget_all();
  assert_int_equal(GPU->open(0, NULL, &gpu), 0);
  unlink(file);
  rmdir(path);
}

static void test_map(void **state) {
  static const int nin[] = {
#define XX(e, name, n) n,
      DSPK_MAPFN_MAP(XX)
#undef XX
  };
  (void)state;
  for (int f = 0; f < DSPK_MAPFN_COUNT; f++)
    for (int t = 0; t < 4; t++) {
      int64_t s[2] = {irand(1, 50), irand(1, 5000)};
      struct dspk__op op;
      char what[64];
      memset(&op, 0, sizeof(op));
      op.kind = DSPK_OP_MAP;
      op.nin = nin[f];
      op.u.map.fn = (dspk_mapfn)f;
      op.u.map.alpha = 1.75;
      op.in[0] = T(std4[t], 2, s);
      op.in[1] = T(std4[t], 2, s);
      snprintf(what, sizeof(what), "map fn=%d %s", f, dspk__dtype_name(std4[t]));
      check_op(what, &op);
    }
}

struct cs { const char *subs; int ra, rb; int64_t a[4], b[4]; };
static const struct cs contractions[] = {
    {"ik,kj->ij", 2, 2, {33, 17}, {17, 29}},
    {"bij,bjk->bik", 3, 3, {4, 12, 7}, {4, 7, 9}},
    {"abc,cd->abd", 3, 2, {3, 5, 6}, {6, 7}},
    {"ij,jk->ki", 2, 2, {8, 9}, {9, 10}},
    {"ik,jk->ij", 2, 2, {11, 13}, {12, 13}},
    {"ijk,jl->il", 3, 2, {5, 6, 7}, {6, 8}},
    {"bi,bj->bij", 2, 2, {3, 4}, {3, 5}},
    {"abcd,dbe->aec", 4, 3, {2, 3, 4, 5}, {5, 3, 6}},
    {"ij,ij->", 2, 2, {7, 9}, {7, 9}},
    {"ij,kl->ijkl", 2, 2, {2, 3}, {4, 5}},
    /* read in place with transposition flags and/or made as C^T */
    {"ki,kj->ij", 2, 2, {13, 11}, {13, 12}},
    {"ik,jk->ji", 2, 2, {11, 13}, {12, 13}},
    {"ki,jk->ji", 2, 2, {13, 11}, {12, 13}},
    {"bki,bjk->bji", 3, 3, {3, 13, 11}, {3, 12, 13}},
    {"ijk,kl->lji", 3, 2, {4, 5, 6}, {6, 7}},
    {"ikl,jlk->ji", 3, 3, {9, 4, 5}, {8, 5, 4}},
};

static void contract_op(struct dspk__op *op, const struct cs *c, dspk_dtype dt) {
  memset(op, 0, sizeof(*op));
  op->kind = DSPK_OP_CONTRACT;
  op->nin = 2;
  snprintf(op->u.contract.subscripts, sizeof(op->u.contract.subscripts), "%s", c->subs);
  op->in[0] = T(dt, c->ra, c->a);
  op->in[1] = T(dt, c->rb, c->b);
}

static void test_contract(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(contractions) / sizeof(contractions[0]); i++)
    for (int t = 0; t < 4; t++) {
      struct dspk__op op;
      char what[96];
      contract_op(&op, &contractions[i], std4[t]);
      snprintf(what, sizeof(what), "contract %s %s", contractions[i].subs,
               dspk__dtype_name(std4[t]));
      check_op(what, &op);
    }
}

/* 60 contractions over 50 shapes with a plan cache of 4 (set in main):
 * every eviction retires its workspaces through events. */
static void test_contract_eviction_trace(void **state) {
  struct dspk__devstats st0 = {0}, st1 = {0};
  (void)state;
  GPU->stats(gpu, &st0);
  for (int it = 0; it < 60; it++) {
    /* B is permuted (k and l swap) into a workspace of the plan's own */
    struct cs c = {"ikl,jlk->ji", 3, 3, {0, 4, 4}, {0, 4, 4}};
    struct dspk__op op;
    int s = irand(0, 49);
    c.a[0] = 8 + s;
    c.b[0] = 5 + s % 7;
    contract_op(&op, &c, DSPK_F32);
    check_op("contract trace", &op);
  }
  GPU->stats(gpu, &st1);
  printf("retire: deferred %llu released %llu barrier %llu leaked %llu max_in_flight %llu\n",
         (unsigned long long)st1.retire_deferred, (unsigned long long)st1.retire_released,
         (unsigned long long)st1.retire_barrier_fallbacks,
         (unsigned long long)st1.retire_leaked, (unsigned long long)st1.retire_max_in_flight);
  assert_true(st1.retire_deferred > st0.retire_deferred + 20);
  assert_int_equal(st1.retire_barrier_fallbacks, st0.retire_barrier_fallbacks);
  assert_int_equal(st1.retire_leaked, 0);
  assert_true(st1.pool_hits > st0.pool_hits);
}

/* ---- raw kernels ----------------------------------------------------------- */

static const char *saxpy_src =
    "extern \"C\" __global__ void saxpy(float *y, const float *x, float a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

static int run_kernel(const char *src, const char *entry, float *y, float *x, int n,
                      float a, char *err, size_t errlen, struct dspk__mem **keep) {
  struct dspk__op op;
  struct dspk__mem *my, *mx;
  atomic_int cancel = 0;
  struct dspk__opctx ctx = {&cancel, NULL, NULL, err, errlen, 0};
  int64_t s[1] = {n};
  char msg[256];
  int rc;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_KERNEL;
  op.nin = 2;
  op.in[0] = T(DSPK_F32, 1, s);
  op.in[1] = T(DSPK_F32, 1, s);
  op.u.kernel.lang = "cuda";
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  snprintf(op.u.kernel.entry, sizeof(op.u.kernel.entry), "%s", entry);
  op.u.kernel.grid[0] = (uint32_t)(n + 127) / 128;
  op.u.kernel.block[0] = 128;
  op.u.kernel.grid[1] = op.u.kernel.grid[2] = op.u.kernel.block[1] = op.u.kernel.block[2] = 1;
  op.u.kernel.nargs = 4;
  op.u.kernel.args[0].kind = DSPK__KARG_TENSOR;
  op.u.kernel.args[0].v.tensor = 0;
  op.u.kernel.args[1].kind = DSPK__KARG_TENSOR;
  op.u.kernel.args[1].v.tensor = 1;
  op.u.kernel.args[2].kind = DSPK__KARG_F32;
  op.u.kernel.args[2].v.f32 = a;
  op.u.kernel.args[3].kind = DSPK__KARG_I32;
  op.u.kernel.args[3].v.i32 = n;
  assert_int_equal(dspk__op_infer(&op, msg, sizeof(msg)), 0);
  assert_int_equal(GPU->alloc(gpu, (size_t)n * 4, &my), 0);
  assert_int_equal(GPU->alloc(gpu, (size_t)n * 4, &mx), 0);
  assert_int_equal(GPU->write(gpu, my, 0, y, (size_t)n * 4), 0);
  assert_int_equal(GPU->write(gpu, mx, 0, x, (size_t)n * 4), 0);
  op.in[0].mem = my;
  op.in[1].mem = mx;
  err[0] = 0;
  rc = GPU->run(gpu, &op, &ctx);
  if (rc == 0)
    rc = GPU->read(gpu, my, 0, y, (size_t)n * 4);
  if (keep) {
    *keep = my;
  } else {
    GPU->free(gpu, my);
  }
  GPU->free(gpu, mx);
  return rc;
}

static void test_raw_kernel(void **state) {
  enum { N = 1000 };
  float y[N], x[N], y0[N];
  char err[4096];
  (void)state;
  for (int i = 0; i < N; i++) {
    y[i] = y0[i] = (float)urand();
    x[i] = (float)urand();
  }
  assert_int_equal(run_kernel(saxpy_src, "saxpy", y, x, N, 3.0f, err, sizeof(err), NULL), 0);
  for (int i = 0; i < N; i++)
    assert_true(fabsf(y[i] - (3.0f * x[i] + y0[i])) < 1e-6f);
  /* Compile error: the compiler's log comes back. */
  assert_int_equal(run_kernel("extern \"C\" __global__ void saxpy(float *y) { y[0] = nope; }",
                              "saxpy", y, x, N, 1.0f, err, sizeof(err), NULL),
                   DSPK_ECOMPILE);
  assert_non_null(strstr(err, "nope"));
  /* Missing entry. */
  assert_int_equal(run_kernel(saxpy_src, "other", y, x, N, 1.0f, err, sizeof(err), NULL),
                   DSPK_EINVAL);
  assert_non_null(strstr(err, "other"));
}

static void test_fault_recovery(void **state) {
  const char *bad =
      "extern \"C\" __global__ void boom(float *y, const float *x, float a, int n) {\n"
      "  float *p = (float *)(0x10ull + 4096ull * threadIdx.x); p[0] = a; y[0] = x[0];\n"
      "}\n";
  enum { N = 256 };
  float y[N], x[N], back[N], *res[1] = {0};
  char err[1024];
  struct dspk__mem *old = NULL;
  uint64_t starts = gpu->worker_starts;
  (void)state;
  for (int i = 0; i < N; i++)
    y[i] = x[i] = (float)i - 100.0f;
  /* A kernel that faults fails its task with a clear error... */
  assert_int_equal(run_kernel(bad, "boom", y, x, N, 1.0f, err, sizeof(err), &old), DSPK_EDEVICE);
  printf("fault message: %s\n", err);
  assert_non_null(strstr(err, "ILLEGAL_ADDRESS"));
  assert_non_null(strstr(err, "boom"));
  assert_non_null(strstr(err, "unaffected"));
  assert_int_equal(gpu->worker_pid, 0); /* the poisoned worker is gone */
  /* ...while the daemon's context and its buffers live on: the buffer the
   * kernel had is still readable and usable by later ops. */
  assert_int_equal(GPU->read(gpu, old, 0, back, sizeof(back)), 0);
  {
    atomic_int cancel = 0;
    struct dspk__opctx ctx = {&cancel, NULL, NULL, err, sizeof(err), 0};
    int64_t s[1] = {N};
    char msg[128];
    struct dspk__mem *o;
    struct dspk__op op;
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_MAP;
    op.nin = 1;
    op.u.map.fn = DSPK_MAP_ABS;
    op.in[0] = T(DSPK_F32, 1, s);
    assert_int_equal(dspk__op_infer(&op, msg, sizeof(msg)), 0);
    op.in[0].mem = old;
    assert_int_equal(GPU->alloc(gpu, N * 4, &o), 0);
    op.out[0].mem = o;
    assert_int_equal(GPU->run(gpu, &op, &ctx), 0);
    res[0] = malloc(N * 4);
    assert_int_equal(GPU->read(gpu, o, 0, res[0], N * 4), 0);
    for (int i = 0; i < N; i++)
      assert_true(res[0][i] == fabsf(back[i]));
    free(res[0]);
    GPU->free(gpu, o);
    GPU->free(gpu, old);
  }
  /* The next raw kernel gets a fresh worker; built-in ops never stopped. */
  test_raw_kernel(state);
  assert_true(gpu->worker_starts > starts);
  check_op("gemm after fault", &(struct dspk__op){
      .kind = DSPK_OP_GEMM, .nin = 2,
      .in = {T(DSPK_F32, 2, (int64_t[]){20, 30}), T(DSPK_F32, 2, (int64_t[]){30, 40})},
      .u.gemm = {0, 0, 1.0, 0.0}});
  /* A worker that dies outright (killed) is reported and replaced too. */
  assert_true(gpu->worker_pid > 0);
  kill(gpu->worker_pid, SIGKILL);
  for (int i = 0; i < N; i++)
    y[i] = 0;
  assert_int_equal(run_kernel(saxpy_src, "saxpy", y, x, N, 2.0f, err, sizeof(err), NULL),
                   DSPK_EDEVICE);
  assert_non_null(strstr(err, "worker died"));
  assert_int_equal(run_kernel(saxpy_src, "saxpy", y, x, N, 2.0f, err, sizeof(err), NULL), 0);
  for (int i = 0; i < N; i++)
    assert_true(y[i] == 2.0f * x[i]);
}

/* With two or more GPUs: a fault on cuda:0 leaves cuda:1 (its own runner
 * in the daemon, here the same thread) untouched. */
static int ndev;
static void test_other_device_untouched(void **state) {
  struct dspk__dev *g1 = NULL, *g0 = gpu;
  enum { N = 64 };
  float y[N], x[N];
  char err[1024];
  struct dspk__op op;
  (void)state;
  if (ndev < 2) {
    printf("one CUDA device: nothing to check\n");
    return;
  }
  assert_int_equal(GPU->open(1, NULL, &g1), 0);
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  op.in[0] = T(DSPK_F64, 2, (int64_t[]){33, 44});
  op.in[1] = T(DSPK_F64, 2, (int64_t[]){44, 55});
  gpu = g1;
  check_op("gemm on cuda:1", &op);
  gpu = g0;
  for (int i = 0; i < N; i++)
    y[i] = x[i] = 1.0f;
  assert_int_equal(run_kernel("extern \"C\" __global__ void boom(float *y, const float *x, "
                              "float a, int n) { *(float *)0x10 = a; }",
                              "boom", y, x, N, 1.0f, err, sizeof(err), NULL),
                   DSPK_EDEVICE);
  assert_non_null(strstr(err, "ILLEGAL_ADDRESS"));
  gpu = g1;
  check_op("gemm on cuda:1 after a fault on cuda:0", &op);
  gpu = g0;
  check_op("gemm on cuda:0 after its fault", &op);
  printf("two CUDA devices: cuda:1 answered right before and after a fault on cuda:0\n");
  GPU->close(g1);
}

/* ---- warm kernel cache across a restart ------------------------------------ */

/* ---- pinned staging ------------------------------------------------------ */

/* Fills n bytes with a pattern that differs per tag and per position. */
static void fill_bytes(unsigned char *p, size_t n, unsigned tag) {
  uint64_t x = 0x2545f4914f6cdd1dull ^ ((uint64_t)tag * 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)(x >> 24);
  }
}

/* Writes n pattern bytes (from an odd host address) at an odd offset of a
 * fresh device block, reads them back (into an odd host address), and
 * compares; also reads back a middle part on its own. */
static void roundtrip(size_t n, unsigned tag) {
  struct dspk__mem *m = NULL;
  size_t off = 7, sub = n / 3;
  unsigned char *src = malloc(n + 2), *dst = malloc(n + 2);
  assert_non_null(src);
  assert_non_null(dst);
  fill_bytes(src + 1, n, tag);
  memset(dst, 0xa5, n + 2);
  assert_int_equal(GPU->alloc(gpu, n + off + 5, &m), 0);
  assert_int_equal(GPU->write(gpu, m, off, src + 1, n), 0);
  assert_int_equal(GPU->read(gpu, m, off, dst + 1, n), 0);
  if (memcmp(src + 1, dst + 1, n) != 0)
    fail_msg("staging round trip of %zu bytes (tag %u) differs", n, tag);
  assert_int_equal(dst[0], 0xa5);
  assert_int_equal(dst[n + 1], 0xa5);
  if (n > 3) {
    memset(dst, 0, n + 2);
    assert_int_equal(GPU->read(gpu, m, off + sub, dst, n - 2 * sub), 0);
    assert_memory_equal(dst, src + 1 + sub, n - 2 * sub);
  }
  GPU->free(gpu, m);
  free(src);
  free(dst);
}

/* A kernel that keeps the stream busy for about `cycles` clocks, so that
 * copies enqueued after it wait in the stream while the host goes on. */
static void launch_spin(long long cycles) {
  static const char src[] =
      "extern \"C\" __global__ void spin(long long cycles) {\n"
      "  long long t0 = clock64();\n"
      "  while (clock64() - t0 < cycles) {}\n"
      "}\n";
  static CUmodule mod;
  static CUfunction fn;
  void *args[1] = {&cycles};
  if (!mod) {
    void *cubin = NULL;
    size_t len = 0;
    char log[2048];
    assert_int_equal(dspk__cuda_compile(gpu, NULL, "spin", src, sizeof(src) - 1, &cubin,
                                        &len, log, sizeof(log)),
                     0);
    assert_int_equal(dspk__cu.cuModuleLoadData(&mod, cubin), CUDA_SUCCESS);
    free(cubin);
    assert_int_equal(dspk__cu.cuModuleGetFunction(&fn, mod, "spin"), CUDA_SUCCESS);
  }
  assert_int_equal(dspk__cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, dspk__cuda_stream(gpu),
                                           args, NULL),
                   CUDA_SUCCESS);
  gpu->stage.work_queued = 1; /* an op, queued without run() */
}

static void test_staging(void **state) {
  static const size_t sizes[] = {1, 3, 4095, 4099, ((size_t)2 << 20) - 1, (size_t)2 << 20,
                                 ((size_t)2 << 20) + 1, 7654321, ((size_t)40 << 20) + 13};
  enum { NB = 6 };
  const size_t small = 64 << 10, bsz = small + 999; /* each spans 2 chunks */
  struct dspk__mem *mb[NB];
  unsigned char *host[NB], *back;
  uint64_t waits0, h2d0, d2h0;
  (void)state;
  /* The default ring (16 x 2 MiB): transfers inside one chunk, on chunk
   * boundaries, spanning several chunks and wrapping the whole ring. */
  assert_non_null(gpu->stage.host);
  h2d0 = gpu->stage.chunks_h2d;
  d2h0 = gpu->stage.chunks_d2h;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    roundtrip(sizes[i], (unsigned)i);
  /* On this idle stream writes of 1 MiB and more go straight from
   * pageable memory (the driver's synchronize costs nothing), so only the
   * four small ones use the ring (all through it would be 33 chunks); reads
   * of 4 MiB and more go straight to pageable memory, so only the smaller
   * reads use it: 15 chunks, where all reads through the ring would take
   * more than 40. */
  assert_true(gpu->stage.chunks_h2d - h2d0 >= 4 && gpu->stage.chunks_h2d - h2d0 < 10);
  assert_true(gpu->stage.chunks_d2h - d2h0 >= 8 && gpu->stage.chunks_d2h - d2h0 < 20);
  /* Behind a running kernel a large write takes the ring (4 chunks for
   * 7654321 bytes), so the queued work is not drained; a second large write
   * right after a direct one (only a copy queued) goes direct too. */
  {
    const size_t n = 7654321;
    unsigned char *src = malloc(n), *dst = malloc(n);
    struct dspk__mem *m = NULL;
    uint64_t h0;
    assert_non_null(src);
    assert_non_null(dst);
    fill_bytes(src, n, 77);
    assert_int_equal(GPU->alloc(gpu, n, &m), 0);
    launch_spin(20 * 1000 * 1000);
    h0 = gpu->stage.chunks_h2d;
    assert_int_equal(GPU->write(gpu, m, 0, src, n), 0);
    assert_int_equal((int)(gpu->stage.chunks_h2d - h0), 4);
    assert_int_equal(GPU->read(gpu, m, 0, dst, n), 0);
    assert_memory_equal(dst, src, n);
    h0 = gpu->stage.chunks_h2d;
    fill_bytes(src, n, 78);
    assert_int_equal(GPU->write(gpu, m, 0, src, n / 2), 0);
    assert_int_equal(GPU->write(gpu, m, n / 2, src + n / 2, n - n / 2), 0);
    assert_int_equal((int)(gpu->stage.chunks_h2d - h0), 0);
    assert_int_equal(GPU->read(gpu, m, 0, dst, n), 0);
    assert_memory_equal(dst, src, n);
    GPU->free(gpu, m);
    free(src);
    free(dst);
  }

  /* A ring of two 64 KiB chunks, and uploads that queue behind a kernel of
   * tens of milliseconds: every chunk is reused while its previous DMA is
   * still waiting in the stream, so each reuse must wait for its event
   * (without that guard a later upload would overwrite an earlier one's
   * bytes before they reached the device). */
  assert_int_equal(dspk__cuda_stage_config(gpu, 2, small), 0);
  for (int b = 0; b < NB; b++) {
    host[b] = malloc(bsz);
    assert_non_null(host[b]);
    fill_bytes(host[b], bsz, 100u + (unsigned)b);
    assert_int_equal(GPU->alloc(gpu, bsz, &mb[b]), 0);
  }
  waits0 = gpu->stage.waits;
  launch_spin(40 * 1000 * 1000);
  for (int b = 0; b < NB; b++)
    assert_int_equal(GPU->write(gpu, mb[b], 0, host[b], bsz), 0);
  printf("staging: %llu waits for a busy chunk while uploads queued behind a kernel\n",
         (unsigned long long)(gpu->stage.waits - waits0));
  assert_true(gpu->stage.waits - waits0 >= 1);
  back = malloc(bsz);
  assert_non_null(back);
  for (int b = 0; b < NB; b++) {
    memset(back, 0, bsz);
    assert_int_equal(GPU->read(gpu, mb[b], 0, back, bsz), 0);
    if (memcmp(back, host[b], bsz) != 0)
      fail_msg("upload %d came back different: a staging chunk was overwritten in flight", b);
  }
  /* Reads that queue behind a kernel: each chunk is copied out only after
   * its own DMA. */
  launch_spin(20 * 1000 * 1000);
  memset(back, 0, bsz);
  assert_int_equal(GPU->read(gpu, mb[NB - 1], 0, back, bsz), 0);
  assert_memory_equal(back, host[NB - 1], bsz);
  for (int b = 0; b < NB; b++) {
    GPU->free(gpu, mb[b]);
    free(host[b]);
  }
  free(back);
  /* Transfers many times the ring, odd sizes, and ops whose operands span
   * chunks, through the small ring. */
  roundtrip(((size_t)1 << 20) + 17, 7);
  roundtrip(small - 1, 8);
  {
    int64_t sa[2] = {300, 77}, sb[2] = {77, 129}, sx[2] = {3, 40001};
    struct dspk__op op;
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.nin = 2;
    op.in[0] = T(DSPK_F64, 2, sa);
    op.in[1] = T(DSPK_F64, 2, sb);
    op.u.gemm.alpha = 1.0;
    check_op("gemm f64 through a 2 x 64 KiB ring", &op);
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_REDUCE;
    op.nin = 1;
    op.in[0] = T(DSPK_F32, 2, sx);
    op.u.reduce.fn = DSPK_REDUCE_SUM;
    op.u.reduce.axes = 2;
    check_op("reduce f32 through a 2 x 64 KiB ring", &op);
  }
  /* Staging off: copies from pageable memory still round-trip. */
  assert_int_equal(dspk__cuda_stage_config(gpu, 0, 0), 0);
  assert_null(gpu->stage.host);
  roundtrip(3000001, 9);
  /* Back to the default for the tests that follow. */
  assert_int_equal(dspk__cuda_stage_config(gpu, 16, (size_t)2 << 20), 0);
  roundtrip(5, 10);
}

static void warm_workload(void) {
  struct dspk__op op;
  int64_t s[2] = {64, 100}, h[1] = {7};
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_MAP;
  op.nin = 2;
  op.u.map.fn = DSPK_MAP_ADD;
  op.in[0] = T(DSPK_F32, 2, s);
  op.in[1] = T(DSPK_F32, 2, s);
  check_op("warm map", &op);
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.in[0] = T(DSPK_F64, 2, s);
  check_op("warm reduce", &op);
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  op.in[0] = T(DSPK_C64, 2, s);
  op.in[1] = T(DSPK_C64, 1, h);
  check_op("warm fir", &op);
  contract_op(&op, &contractions[7], DSPK_F32); /* abcd,dbe->aec: needs a permutation */
  check_op("warm contract", &op);
}

static void test_warm_cache_restart(void **state) {
  char path[] = "/tmp/dspk-cuda-cacheXXXXXX", file[64];
  struct dspk__cache *cache;
  struct dspk__devstats st;
  (void)state;
  assert_non_null(mkdtemp(path));
  snprintf(file, sizeof(file), "%s/cache.db", path);
  for (int round = 0; round < 2; round++) {
    cache = restart_on(file);
    warm_workload();
    memset(&st, 0, sizeof(st));
    GPU->stats(gpu, &st);
    printf("round %d: kernels compiled %llu, cache hits %llu\n", round,
           (unsigned long long)st.kernels_compiled, (unsigned long long)st.kernel_cache_hits);
    if (round == 0) {
      struct dspk__cache_stats cs;
      assert_true(st.kernels_compiled >= 4);
      /* The fir and map launches were tuned and the decisions stored. */
      assert_int_equal(dspk__cache_stats(cache, &cs), 0);
      assert_true(cs.kind[DSPK__CACHE_AUTOTUNE].entries >= 2);
    } else {
      assert_int_equal(st.kernels_compiled, 0);
      assert_true(st.kernel_cache_hits >= 4);
    }
    GPU->close(gpu);
    gpu = NULL;
    dspk__cache_close(cache);
  }
  assert_int_equal(GPU->open(0, NULL, &gpu), 0);
  unlink(file);
  rmdir(path);
}

int main(void) {
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES], cinfo[1];
  char why[256];
  int n, rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_staging),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_gemm_half),
      cmocka_unit_test(test_fft),
      cmocka_unit_test(test_own_kernels),
      cmocka_unit_test(test_gemm_blas),
      cmocka_unit_test(test_fir),
      cmocka_unit_test(test_fir_fft),
      cmocka_unit_test(test_fir_fft_nonfinite),
      cmocka_unit_test(test_fir_fft_rows),
      cmocka_unit_test(test_reduce),
      cmocka_unit_test(test_reduce_candidates),
      cmocka_unit_test(test_reduce_tuned),
      cmocka_unit_test(test_fir_tuned),
      cmocka_unit_test(test_map),
      cmocka_unit_test(test_contract),
      cmocka_unit_test(test_contract_eviction_trace),
      cmocka_unit_test(test_raw_kernel),
      cmocka_unit_test(test_fault_recovery),
      cmocka_unit_test(test_other_device_untouched),
      cmocka_unit_test(test_warm_cache_restart),
  };
  n = ndev = GPU->probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why));
  if (n <= 0) {
    printf("skipped: %s\n", why);
    return 77;
  }
  printf("cuda:0 %s %s %s\n", info[0].name, info[0].arch, info[0].driver);
  setenv("DSPK_CUDA_PLAN_CACHE", "4", 1);
  if (CPU->probe(cinfo, 1, why, sizeof(why)) < 1 || CPU->open(0, NULL, &cpu) != 0 ||
      GPU->open(0, NULL, &gpu) != 0) {
    printf("cannot open devices\n");
    return 1;
  }
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  GPU->close(gpu);
  CPU->close(cpu);
  GPU->shutdown();
  return rc;
}
