/*
 * Tests of the Vulkan backend on whatever Vulkan device the machine has
 * (lavapipe in CI, the H200 on the GPU machine): every op against naive
 * double-precision references on random inputs, raw kernels in GLSL and
 * SPIR-V, compile errors, memory and fences, and the persistent caches
 * (a reopened device with the same cache file compiles nothing).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include <fftw3.h>

#include <glslang/Include/glslang_c_interface.h>
#include <glslang/Public/resource_limits_c.h>
/* libspirv.h defines a const at file scope (an external definition in C,
 * as in vk_spvval.c): renamed to keep the two apart. */
#define kDefaultMaxIdBound test_vulkan_kDefaultMaxIdBound
#include <spirv-tools/libspirv.h>
#undef kDefaultMaxIdBound

#include "cache/cache.h"
#include "backends/common/autotune.h"
#include "backends/common/fir_tune.h"
#include "backends/vulkan/vk.h"
#include "tests/vulkan/vk_harness.h"
#include "backends/vulkan/vk_sfft.h"
#include "backends/vulkan/vk_vkfft.h"

static struct dspk__dev *D;
static struct dspk__devinfo INFO[16];
static int NDEV;

static int setup(void **state) {
  (void)state;
  char why[256];
  NDEV = VKB->probe(INFO, 16, why, sizeof why);
  if (NDEV <= 0) {
    fprintf(stderr, "no vulkan device: %s\n", why);
    return -1;
  }
  int dev = getenv("DSPK_VK_TEST_DEVICE") ? atoi(getenv("DSPK_VK_TEST_DEVICE")) : 0;
  /* Clients' kernels compile in a child, as in the daemon (main below). */
  struct dspk__devenv env = {.compile_exe = "/proc/self/exe"};
  if (VKB->open(dev, &env, &D) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  VKB->close(D);
  VKB->shutdown();
  return 0;
}

static void t_probe(void **state) {
  (void)state;
  assert_true(NDEV >= 1);
  for (int i = 0; i < NDEV; i++) {
    assert_true(INFO[i].name[0] != 0);
    assert_true(INFO[i].type[0] != 0);
    assert_true(INFO[i].driver[0] != 0);
    assert_true(INFO[i].memory > 0);
    if (strstr(INFO[i].name, "llvmpipe")) {
      assert_string_equal(INFO[i].type, "cpu");
      assert_int_equal(INFO[i].software, 1);
    }
    print_message("vulkan:%d %s (%s%s) driver %s, %llu MiB\n", i, INFO[i].name,
                  INFO[i].type, INFO[i].software ? ", software" : "", INFO[i].driver,
                  (unsigned long long)(INFO[i].memory >> 20));
  }
}

static const dspk_dtype STD[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};

/* The capability query: every op; f16 and bf16 gemm on every device (the
 * scalar kernel where no cooperative matrices); f64 and c128 only with
 * shaderFloat64; fft only in a build with VkFFT; raw kernels in glsl and
 * spirv, not cuda or hip. */
static void t_caps(void **state) {
  struct dspk__devcaps caps;
  struct dspk__op o;
  char msg[256];
  uint32_t dbl = (1u << DSPK_F64) | (1u << DSPK_C128);
  uint32_t keep = D->has_f64 ? ~0u : ~dbl;
  (void)state;
  memset(&caps, 0, sizeof caps);
  VKB->caps(D, &caps);
  for (int op = 0; op < DSPK_OP_KERNEL; op++) {
    uint32_t want = dspk__op_dtypes[op] & keep;
    if (op == DSPK_OP_FFT && !dspk__vk_fft_built)
      want = 0;
    assert_int_equal(caps.dtypes[op], want);
  }
  assert_true(caps.dtypes[DSPK_OP_GEMM] & (1u << DSPK_F16));
  assert_true(caps.dtypes[DSPK_OP_GEMM] & (1u << DSPK_BF16));
  memset(&o, 0, sizeof o);
  o.kind = DSPK_OP_KERNEL;
  o.u.kernel.lang = "glsl";
  assert_int_equal(dspk__caps_check(&caps, &o, "vulkan:0", msg, sizeof msg), 0);
  o.u.kernel.lang = "spirv";
  assert_int_equal(dspk__caps_check(&caps, &o, "vulkan:0", msg, sizeof msg), 0);
  o.u.kernel.lang = "cuda";
  assert_int_equal(dspk__caps_check(&caps, &o, "vulkan:0", msg, sizeof msg), DSPK_ENOTSUP);
  assert_string_equal(msg, "kernel: vulkan:0 takes lang glsl, spirv, not \"cuda\"");
  print_message("vulkan:0 caps: f64 %s, fft %s\n", D->has_f64 ? "yes" : "no",
                caps.dtypes[DSPK_OP_FFT] ? "yes" : "no");
}

static void t_map(void **state) {
  (void)state;
  char msg[512];
  for (int di = 0; di < 4; di++)
    for (int fn = 0; fn < DSPK_MAPFN_COUNT; fn++) {
      dspk_dtype dt = STD[di];
      int rank = h_randint(1, 3);
      int64_t shape[3];
      for (int i = 0; i < rank; i++)
        shape[i] = h_randint(1, 40);
      struct htensor A = h_make(dt, rank, shape, 1), B = h_make(dt, rank, shape, 1), out;
      int bin = fn == DSPK_MAP_ADD || fn == DSPK_MAP_SUB || fn == DSPK_MAP_MUL ||
                fn == DSPK_MAP_AXPY;
      struct dspk__op op = {.kind = DSPK_OP_MAP, .nin = bin ? 2 : 1};
      op.u.map.fn = (dspk_mapfn)fn;
      op.u.map.alpha = 0.75;
      /* An odd element offset checks offset handling. */
      assert_int_equal(h_upload(D, &A, dspk__dtype_size(dt) * 3, &op.in[0]), 0);
      if (bin)
        assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
      int r = h_run(D, &op, &out, msg, sizeof msg);
      assert_int_equal(r, 0);
      double complex *want = calloc(A.n, sizeof *want);
      for (int64_t i = 0; i < A.n; i++) {
        double complex a = A.v[i], b = B.v[i];
        switch (fn) {
        case DSPK_MAP_ADD: want[i] = a + b; break;
        case DSPK_MAP_SUB: want[i] = a - b; break;
        case DSPK_MAP_MUL: want[i] = a * b; break;
        case DSPK_MAP_SCALE: want[i] = 0.75 * a; break;
        case DSPK_MAP_AXPY: want[i] = 0.75 * a + b; break;
        case DSPK_MAP_ABS: want[i] = cabs(a); break;
        case DSPK_MAP_EXP: want[i] = cexp(a); break;
        }
      }
      double e = h_relerr(&out, want, A.n);
      if (!(e <= h_tol(dt) * 4))
        fail_msg("map fn %d dtype %s: rel err %g", fn, dspk__dtype_name(dt), e);
      free(want);
      h_free(&A);
      h_free(&B);
      h_free(&out);
    }
}

/* A reduce of X (values set by the caller) checked against a host
 * reference computed in double. */
static void reduce_check(struct htensor *X, dspk_reduce fn, uint32_t axes, double tol) {
  char msg[512];
  struct htensor out;
  struct dspk__op op = {.kind = DSPK_OP_REDUCE, .nin = 1};
  op.u.reduce.fn = fn;
  op.u.reduce.axes = axes;
  assert_int_equal(h_upload(D, X, 0, &op.in[0]), 0);
  int r = h_run(D, &op, &out, msg, sizeof msg);
  if (r)
    fail_msg("reduce: %d %s", r, msg);
  double complex *want = calloc(out.n ? (size_t)out.n : 1, sizeof *want);
  int64_t *cnt = calloc(out.n ? (size_t)out.n : 1, sizeof *cnt);
  uint32_t ax = axes ? axes : (1u << X->rank) - 1; /* 0: every axis */
  for (int64_t i = 0; i < X->n; i++) {
    int64_t rem = i, oi = 0, mul = 1;
    for (int k = X->rank - 1; k >= 0; k--) {
      int64_t c = rem % X->shape[k];
      rem /= X->shape[k];
      if (!(ax & (1u << k))) {
        oi += c * mul;
        mul *= X->shape[k];
      }
    }
    double complex x = X->v[i];
    if (cnt[oi]++ == 0 && (fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN))
      want[oi] = x;
    else if (fn == DSPK_REDUCE_MAX)
      want[oi] = creal(x) > creal(want[oi]) ? x : want[oi];
    else if (fn == DSPK_REDUCE_MIN)
      want[oi] = creal(x) < creal(want[oi]) ? x : want[oi];
    else
      want[oi] += x;
  }
  if (fn == DSPK_REDUCE_MEAN)
    for (int64_t i = 0; i < out.n; i++)
      want[i] /= (double)cnt[i];
  double e = h_relerr(&out, want, out.n);
  if (!(e <= tol))
    fail_msg("reduce fn %d %s of %lld elements, axes %x: rel err %g", fn,
             dspk__dtype_name(X->dt), (long long)X->n, axes, e);
  free(want);
  free(cnt);
  h_free(&out);
}

static void t_reduce(void **state) {
  (void)state;
  for (int iter = 0; iter < 24; iter++) {
    dspk_dtype dt = STD[iter % 4];
    dspk_reduce fn = (dspk_reduce)((iter / 4) % 4);
    if ((fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN) && h_cplx(dt))
      dt = dt == DSPK_C64 ? DSPK_F32 : DSPK_F64;
    int rank = h_randint(1, 4);
    int64_t shape[4];
    for (int i = 0; i < rank; i++)
      shape[i] = h_randint(1, iter == 5 ? 3000 : 9);
    uint32_t axes = (uint32_t)h_randint(0, (1 << rank) - 1);
    struct htensor X = h_make(dt, rank, shape, 1);
    reduce_check(&X, fn, axes, h_tol(dt) * 10);
    h_free(&X);
  }
}

/* The sum (or mean) of X along axes into out, on the device. */
static void reduce_run(struct htensor *X, dspk_reduce fn, uint32_t axes, struct htensor *out) {
  char msg[512];
  struct dspk__op op = {.kind = DSPK_OP_REDUCE, .nin = 1};
  op.u.reduce.fn = fn;
  op.u.reduce.axes = axes;
  assert_int_equal(h_upload(D, X, 0, &op.in[0]), 0);
  int r = h_run(D, &op, out, msg, sizeof msg);
  if (r)
    fail_msg("reduce: %d %s", r, msg);
}

/* Small addends after a large one are kept: each invocation used to keep
 * one running total in the dtype, so f32 [2^24, 1 x 1000] summed to 2^24
 * (1000 lost); now they sum with compensation.  Rows of big + n ones, by
 * the short kernel (one invocation per output: n < 4096) and the long one
 * (a workgroup per output, several dispatches: n > 2 RED_SLICE), for f32,
 * c64 (both parts) and f64 (2^53); want is exact, got within tol of it. */
static void small_addends(dspk_dtype dt, int64_t rows, int64_t n, double big, double tol) {
  int64_t shape[2] = {rows, n + 1};
  struct htensor X = h_make(dt, 2, shape, 0), out;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i <= n; i++)
      X.v[r * (n + 1) + i] = (i ? 1 : big) * (h_cplx(dt) ? 1 - I : 1);
  for (int fn = 0; fn < 2; fn++) {
    reduce_run(&X, fn ? DSPK_REDUCE_MEAN : DSPK_REDUCE_SUM, 2u, &out);
    assert_int_equal(out.n, rows);
    long double want = ((long double)big + (long double)n) / (fn ? (long double)(n + 1) : 1);
    for (int64_t r = 0; r < rows; r++)
      for (int part = 0; part < (h_cplx(dt) ? 2 : 1); part++) {
        double got = part ? -cimag(out.v[r]) : creal(out.v[r]);
        /* mean divides once more: Vulkan's f32 division is within 2.5 ulps
         * (NVIDIA's is not correctly rounded), f64's correctly rounded. */
        double ulp = dt == DSPK_F64 || dt == DSPK_C128 ? 0x1p-53 : 0x1p-24;
        if (!(fabsl((long double)got - want) <= (tol + (fn ? 3 * ulp : 0)) * want))
          fail_msg("%s of %s [%g, 1 x %lld], row %lld part %d: %.17g, want %.17Lg",
                   fn ? "mean" : "sum", dspk__dtype_name(dt), big, (long long)n,
                   (long long)r, part, got, want);
      }
    h_free(&out);
  }
  h_free(&X);
}

/* Sums with an infinity or a NaN give numpy's: the compensation (an error
 * term that is NaN there) must not reach the result. */
static void nonfinite_sums(dspk_dtype dt, int64_t n) {
  static const double first[] = {INFINITY, -INFINITY, NAN, INFINITY};
  static const double second[] = {1, 1, 1, -INFINITY};
  for (int c = 0; c < 4; c++) {
    int64_t shape[1] = {n};
    struct htensor X = h_make(dt, 1, shape, 0), out;
    for (int64_t i = 0; i < n; i++)
      X.v[i] = 1;
    X.v[n / 3] = first[c];
    X.v[n / 2] = second[c];
    reduce_run(&X, DSPK_REDUCE_SUM, 0, &out);
    double want = first[c] + second[c], got = creal(out.v[0]);
    if (!(isnan(want) ? isnan(got) : got == want))
      fail_msg("sum of %s n=%lld with %g and %g: %g, want %g", dspk__dtype_name(dt),
               (long long)n, first[c], second[c], got, want);
    h_free(&out);
    h_free(&X);
  }
}

static void t_reduce_small_addends(void **state) {
  (void)state;
  nonfinite_sums(DSPK_F32, 1000);
  nonfinite_sums(DSPK_F32, 100000);
  nonfinite_sums(DSPK_C64, 100000);
  if (D->has_f64)
    nonfinite_sums(DSPK_F64, 1000);
  small_addends(DSPK_F32, 4, 1000, 16777216, 6e-8);
  small_addends(DSPK_C64, 2, 1000, 16777216, 6e-8);
  small_addends(DSPK_F32, 1, 1 << 20, 16777216, 3e-7);
  small_addends(DSPK_C64, 1, 1 << 20, 16777216, 3e-7);
  if (D->has_f64) {
    small_addends(DSPK_F64, 4, 1000, 9007199254740992.0, 1.2e-16);
    small_addends(DSPK_F64, 1, 1 << 20, 9007199254740992.0, 6e-16);
    small_addends(DSPK_C128, 1, 1 << 20, 9007199254740992.0, 6e-16);
  }
}

static void t_fir(void **state) {
  (void)state;
  char msg[512];
  for (int iter = 0; iter < 8; iter++) {
    dspk_dtype dt = STD[iter % 4];
    int64_t xs[2] = {h_randint(1, 4), h_randint(1, 700)};
    int64_t hs[1] = {iter == 3 ? 600 : h_randint(1, 40)};
    struct htensor X = h_make(dt, 2, xs, 1), Hh = h_make(dt, 1, hs, 1), out;
    struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
    assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
    assert_int_equal(h_upload(D, &Hh, 0, &op.in[1]), 0);
    assert_int_equal(h_run(D, &op, &out, msg, sizeof msg), 0);
    double complex *want = calloc(X.n, sizeof *want);
    for (int64_t b = 0; b < xs[0]; b++)
      for (int64_t n = 0; n < xs[1]; n++)
        for (int64_t k = 0; k < hs[0] && k <= n; k++)
          want[b * xs[1] + n] += Hh.v[k] * X.v[b * xs[1] + n - k];
    double e = h_relerr(&out, want, X.n);
    if (!(e <= h_tol(dt) * 10))
      fail_msg("fir dtype %s: rel err %g", dspk__dtype_name(dt), e);
    free(want);
    h_free(&X);
    h_free(&Hh);
    h_free(&out);
  }
}


/* Naive matmul with numpy broadcasting of batch dims. */
static void ref_gemm(const struct htensor *A, const struct htensor *B,
                     const struct htensor *C, int ta, int tb, double alpha, double beta,
                     const struct htensor *O, double complex *want) {
  int ro = O->rank, ra = A->rank, rb = B->rank;
  int64_t M = O->shape[ro - 2], N = O->shape[ro - 1];
  int64_t K = ta ? A->shape[ra - 2] : A->shape[ra - 1];
  int64_t nb = (M * N) != 0 ? O->n / (M * N) : 0;
  for (int64_t b = 0; b < nb; b++) {
    /* batch coords -> offsets in A, B, C (broadcast) */
    int64_t rem = b, oa = 0, ob = 0, oc = 0, sa = A->shape[ra - 1] * A->shape[ra - 2],
            sb = B->shape[rb - 1] * B->shape[rb - 2];
    int64_t sc = 1;
    int crank = C ? C->rank : 0, ck = crank < 2 ? crank : 2;
    for (int i = crank - ck; i < crank; i++)
      sc *= C->shape[i];
    for (int i = ro - 3; i >= 0; i--) {
      int64_t c = rem % O->shape[i];
      rem /= O->shape[i];
      int ia = i - (ro - ra), ib = i - (ro - rb), ic = i - (ro - crank);
      if (ia >= 0) { if (A->shape[ia] != 1) oa += c * sa; sa *= A->shape[ia]; }
      if (ib >= 0) { if (B->shape[ib] != 1) ob += c * sb; sb *= B->shape[ib]; }
      if (C && ic >= 0 && ic < crank - ck) { if (C->shape[ic] != 1) oc += c * sc; sc *= C->shape[ic]; }
    }
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double complex acc = 0;
        for (int64_t k = 0; k < K; k++) {
          double complex a = A->v[oa + (ta ? k * M + m : m * K + k)];
          double complex bv = B->v[ob + (tb ? n * K + k : k * N + n)];
          acc += a * bv;
        }
        double complex v = alpha * acc;
        if (C) {
          int64_t cn = crank >= 1 ? C->shape[crank - 1] : 1;
          int64_t cm = crank >= 2 ? C->shape[crank - 2] : 1;
          v += beta * C->v[oc + (cm == 1 ? 0 : m) * cn + (cn == 1 ? 0 : n)];
        }
        want[b * M * N + m * N + n] = v;
      }
  }
}

static void gemm_case(dspk_dtype dt, int ra, const int64_t *as, int rb, const int64_t *bs,
                      int ta, int tb, int crank, const int64_t *cs, double tol) {
  char msg[512];
  struct htensor A = h_make(dt, ra, as, 1), B = h_make(dt, rb, bs, 1), out;
  dspk_dtype odt = dt == DSPK_F64 ? DSPK_F64 : DSPK_F32;
  struct htensor C = h_make(odt, crank, cs, 1);
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = crank >= 0 ? 3 : 2};
  op.u.gemm.trans_a = ta;
  op.u.gemm.trans_b = tb;
  op.u.gemm.alpha = 1.5;
  op.u.gemm.beta = crank >= 0 ? -0.5 : 0;
  assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  if (crank >= 0)
    assert_int_equal(h_upload(D, &C, 0, &op.in[2]), 0);
  int r = h_run(D, &op, &out, msg, sizeof msg);
  if (r)
    fail_msg("gemm: %d %s", r, msg);
  double complex *want = calloc(out.n ? out.n : 1, sizeof *want);
  ref_gemm(&A, &B, crank >= 0 ? &C : NULL, ta, tb, 1.5, -0.5, &out, want);
  double e = h_relerr(&out, want, out.n);
  if (!(e <= tol))
    fail_msg("gemm %s ra %d rb %d ta %d tb %d crank %d: rel err %g", dspk__dtype_name(dt),
             ra, rb, ta, tb, crank, e);
  free(want);
  h_free(&A);
  h_free(&B);
  h_free(&C);
  h_free(&out);
}

static void t_gemm(void **state) {
  (void)state;
  const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_F16, DSPK_BF16};
  for (int iter = 0; iter < 16; iter++) {
    dspk_dtype dt = dts[iter % 4];
    int ta = (iter >> 2) & 1, tb = (iter >> 3) & 1;
    int64_t M = h_randint(1, 70), N = h_randint(1, 70), K = h_randint(1, 90);
    int64_t as[4], bs[4], cs[4];
    int ra = 2, rb = 2, crank = -1;
    if (iter % 3 == 1) { /* batch: A (2,3,..), B (3,..) broadcast */
      as[0] = 2; as[1] = 3; ra = 4;
      bs[0] = 3; rb = 3;
    } else if (iter % 3 == 2) { /* partial broadcast: A (2,1,..), B (1,3,..) */
      as[0] = 2; as[1] = 1; ra = 4;
      bs[0] = 1; bs[1] = 3; rb = 4;
    }
    as[ra - 2] = ta ? K : M; as[ra - 1] = ta ? M : K;
    bs[rb - 2] = tb ? N : K; bs[rb - 1] = tb ? K : N;
    if (iter % 2) { crank = 2; cs[0] = M; cs[1] = N; }
    if (iter == 5) { crank = 1; cs[0] = N; }
    if (iter == 7) { crank = 2; cs[0] = M; cs[1] = 1; }
    gemm_case(dt, ra, as, rb, bs, ta, tb, crank, cs, dt == DSPK_F64 ? 1e-12 : 1e-5);
  }
  /* Large enough to go through the autotuner (tile choice). */
  int64_t as[2] = {256, 256}, bs[2] = {256, 256};
  gemm_case(DSPK_F32, 2, as, 2, bs, 0, 0, -1, NULL, 1e-5);
}

static void contract_case(const char *subs, dspk_dtype dt, int ra, const int64_t *as, int rb,
                          const int64_t *bs) {
  char msg[512];
  struct htensor A = h_make(dt, ra, as, 1), B = h_make(dt, rb, bs, 1), out;
  struct dspk__op op = {.kind = DSPK_OP_CONTRACT, .nin = 2};
  snprintf(op.u.contract.subscripts, sizeof op.u.contract.subscripts, "%s", subs);
  assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  int r = h_run(D, &op, &out, msg, sizeof msg);
  if (r)
    fail_msg("contract %s: %d %s", subs, r, msg);
  /* Reference: loop over every assignment of all labels. */
  char la[9] = {0}, lb[9] = {0}, lo[9] = {0};
  sscanf(subs, "%8[a-zA-Z],%8[a-zA-Z]->%8[a-zA-Z]", la, lb, lo);
  char all[20] = {0};
  int nl = 0;
  int64_t sz[128] = {0};
  for (int i = 0; la[i]; i++) { sz[(int)la[i]] = as[i]; if (!memchr(all, la[i], nl)) all[nl++] = la[i]; }
  for (int i = 0; lb[i]; i++) { sz[(int)lb[i]] = bs[i]; if (!memchr(all, lb[i], nl)) all[nl++] = lb[i]; }
  double complex *want = calloc(out.n ? out.n : 1, sizeof *want);
  int64_t total = 1;
  for (int i = 0; i < nl; i++) total *= sz[(int)all[i]];
  int64_t val[128];
  for (int64_t t = 0; t < total; t++) {
    int64_t rem = t;
    for (int i = nl - 1; i >= 0; i--) { val[(int)all[i]] = rem % sz[(int)all[i]]; rem /= sz[(int)all[i]]; }
    int64_t ia = 0, ib = 0, io = 0;
    for (int i = 0; la[i]; i++) ia = ia * as[i] + val[(int)la[i]];
    for (int i = 0; lb[i]; i++) ib = ib * bs[i] + val[(int)lb[i]];
    for (int i = 0; lo[i]; i++) io = io * sz[(int)lo[i]] + val[(int)lo[i]];
    want[io] += A.v[ia] * B.v[ib];
  }
  double e = h_relerr(&out, want, out.n);
  if (!(e <= h_tol(dt) * 10))
    fail_msg("contract %s %s: rel err %g", subs, dspk__dtype_name(dt), e);
  free(want);
  h_free(&A);
  h_free(&B);
  h_free(&out);
}

static void t_contract(void **state) {
  (void)state;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    contract_case("ik,kj->ij", dt, 2, (int64_t[]){13, 17}, 2, (int64_t[]){17, 9});
    contract_case("bij,bjk->bik", dt, 3, (int64_t[]){3, 5, 7}, 3, (int64_t[]){3, 7, 4});
    contract_case("abc,cd->abd", dt, 3, (int64_t[]){2, 3, 5}, 2, (int64_t[]){5, 6});
    contract_case("ij,jk->ki", dt, 2, (int64_t[]){4, 6}, 2, (int64_t[]){6, 5});
    contract_case("ajb,jkb->kab", dt, 3, (int64_t[]){3, 4, 2}, 3, (int64_t[]){4, 5, 2});
    contract_case("ijx,jk->ik", dt, 3, (int64_t[]){3, 4, 5}, 2, (int64_t[]){4, 2});
    contract_case("i,j->ij", dt, 1, (int64_t[]){5}, 1, (int64_t[]){3});
  }
}


/* contract's remaking without the sums (an operand holds an infinity)
 * keeps 12 bytes a part (f32, c64) or 16 (f64, c128), both parts of a
 * complex value in one temporary: with the range it checks set to 65536
 * (test hook DSPK_VK_CONTRACT_RANGE), i,i->i of n values with an inf runs while
 * n times 12, 16, 24 or 32 bytes fit and is ELIMIT from one value more,
 * its message giving the bytes a value of the dtype (probe 15, B 4: c64
 * was refused from half the values the doc's "12 bytes a value" gave, the
 * message saying "(12 a value)"). */
static void t_contract_redo_limit(void **state) {
  (void)state;
  static const dspk_dtype dts[4] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  static const size_t per[4] = {12, 16, 24, 32};
  static const char *const what[4] = {"(12 a f32 value)", "(16 a f64 value)",
                                      "(24 a c64 value: 12 a part)",
                                      "(32 a c128 value: 16 a part)"};
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = dts[di];
    if ((dt == DSPK_F64 || dt == DSPK_C128) && !D->has_f64)
      continue;
    for (int more = 0; more < 2; more++) {
      char msg[512];
      int64_t n = 65536 / (int64_t)per[di] + more;
      struct htensor A = h_make(dt, 1, &n, 0), B = h_make(dt, 1, &n, 0), out;
      for (int64_t i = 0; i < n; i++) {
        A.v[i] = 1;
        B.v[i] = 2;
      }
      A.v[0] = INFINITY;
      struct dspk__op op = {.kind = DSPK_OP_CONTRACT, .nin = 2};
      snprintf(op.u.contract.subscripts, sizeof op.u.contract.subscripts, "i,i->i");
      assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
      assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
      setenv("DSPK_VK_CONTRACT_RANGE", "65536", 1);
      int r = h_run(D, &op, &out, msg, sizeof msg);
      unsetenv("DSPK_VK_CONTRACT_RANGE");
      if (more) {
        if (r != DSPK_ELIMIT || !strstr(msg, what[di]))
          fail_msg("contract i,i->i %s of %lld values with an inf: %d \"%s\", expected "
                   "ELIMIT with \"%s\"", dspk__dtype_name(dt), (long long)n, r, msg, what[di]);
      } else {
        if (r)
          fail_msg("contract i,i->i %s of %lld values with an inf: %d %s",
                   dspk__dtype_name(dt), (long long)n, r, msg);
        if (!(creal(out.v[0]) == INFINITY) || creal(out.v[n - 1]) != 2)
          fail_msg("contract i,i->i %s: %g ... %g, want inf ... 2", dspk__dtype_name(dt),
                   creal(out.v[0]), creal(out.v[n - 1]));
        h_free(&out);
      }
      h_free(&A);
      h_free(&B);
    }
  }
}


/* Sizes past what one shader invocation may loop on lavapipe (65535
 * iterations in all, after which llvmpipe silently leaves the loops): a
 * reduce over more than 5,591,296 elements, a gemm or contraction with a
 * long summed dimension.  The values keep f32 sums exact. */
static void t_long_loops(void **state) {
  (void)state;
  int64_t n1[1] = {5600001};
  struct htensor X = h_make(DSPK_F32, 1, n1, 0);
  for (int64_t i = 0; i < X.n; i++)
    X.v[i] = (double)(i % 3);
  X.v[4000000] = 7;
  reduce_check(&X, DSPK_REDUCE_SUM, 0, 0);
  reduce_check(&X, DSPK_REDUCE_MAX, 0, 0);
  reduce_check(&X, DSPK_REDUCE_MEAN, 0, 1e-6);
  X.v[4000000] = -7;
  reduce_check(&X, DSPK_REDUCE_MIN, 0, 0);
  h_free(&X);
  /* Along a strided axis, and along the last one of several rows. */
  int64_t s2[2] = {5600001, 2};
  X = h_make(DSPK_F32, 2, s2, 0);
  for (int64_t i = 0; i < X.n; i++)
    X.v[i] = (double)(i % 5 == 0);
  reduce_check(&X, DSPK_REDUCE_SUM, 1u, 0);
  X.shape[0] = 2;
  X.shape[1] = 5600001;
  reduce_check(&X, DSPK_REDUCE_SUM, 2u, 0);
  h_free(&X);
  /* gemm: K of 100000 (f32, f64, transposed, with C), and contractions
   * whose summed labels are long: in the gemm and in one operand only. */
  gemm_case(DSPK_F32, 2, (int64_t[]){2, 100000}, 2, (int64_t[]){100000, 3}, 0, 0, 2,
            (int64_t[]){2, 3}, 1e-4);
  gemm_case(DSPK_F64, 2, (int64_t[]){100000, 3}, 2, (int64_t[]){2, 100000}, 1, 1, -1, NULL,
            1e-11);
  contract_case("i,i->", DSPK_C128, 1, (int64_t[]){100000}, 1, (int64_t[]){100000});
  contract_case("ij,kj->ik", DSPK_F64, 2, (int64_t[]){2, 100000}, 2, (int64_t[]){3, 100000});
  contract_case("ij,k->ji", DSPK_F64, 2, (int64_t[]){3, 4}, 1, (int64_t[]){100000});
}

/* The direct fir kernel (forced; lavapipe takes it for short filters, or
 * when overlap-save cannot run) with 65000 taps: before its taps went in
 * slices, outputs from y[64768] on were 0 on lavapipe.  y[t] = t + 1
 * exactly.  (About 10 s on lavapipe: the sums are 2e9 multiply-adds.) */
static void t_fir_long_direct(void **state) {
  (void)state;
  char msg[512];
  int64_t nx[1] = {65000};
  struct htensor F = h_make(DSPK_F32, 1, nx, 0), H = h_make(DSPK_F32, 1, nx, 0), Y;
  for (int64_t i = 0; i < F.n; i++)
    F.v[i] = H.v[i] = 1;
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  assert_int_equal(h_upload(D, &F, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &H, 0, &op.in[1]), 0);
  dspk__vk_fir_force(0);
  int r = h_run(D, &op, &Y, msg, sizeof msg);
  dspk__vk_fir_force(-1);
  if (r)
    fail_msg("fir: %d %s", r, msg);
  for (int64_t i = 0; i < Y.n; i++)
    if (creal(Y.v[i]) != (double)(i + 1))
      fail_msg("direct fir of %lld taps: y[%lld] = %g", (long long)H.n, (long long)i,
               creal(Y.v[i]));
  h_free(&F);
  h_free(&H);
  h_free(&Y);
}

/* Work beyond maxComputeWorkGroupCount on some axis, which a test build
 * lowers with DSPK_VK_MAX_GROUPS so that small sizes reach it: reduce
 * (outputs on a 2-D grid), gemm (blocks of rows, of columns, of batches)
 * and contract's gather run in several dispatches, as the real limit
 * (65535) needs for outputs of millions of rows. */
static void t_dispatch_split(void **state) {
  (void)state;
  setenv("DSPK_VK_MAX_GROUPS", "7", 1);
  /* A workgroup per output (long rows), an invocation per output (short
   * ones, in one slice or two). */
  const int64_t shapes[3][2] = {{40, 5000}, {2000, 3}, {5, 3000}};
  for (int i = 0; i < 3; i++) {
    struct htensor X = h_make(DSPK_F64, 2, shapes[i], 1);
    reduce_check(&X, DSPK_REDUCE_SUM, 2u, 1e-12);
    reduce_check(&X, DSPK_REDUCE_MAX, 2u, 0);
    reduce_check(&X, DSPK_REDUCE_MEAN, 2u, 1e-12);
    h_free(&X);
  }
  setenv("DSPK_VK_MAX_GROUPS", "2", 1);
  gemm_case(DSPK_F32, 2, (int64_t[]){600, 20}, 2, (int64_t[]){20, 1}, 0, 0, -1, NULL, 1e-5);
  gemm_case(DSPK_F32, 2, (int64_t[]){1, 20}, 2, (int64_t[]){20, 600}, 0, 0, 2,
            (int64_t[]){1, 600}, 1e-5);
  gemm_case(DSPK_F64, 3, (int64_t[]){5, 140, 9}, 3, (int64_t[]){5, 150, 9}, 0, 1, -1, NULL,
            1e-12);
  contract_case("ij,k->ji", DSPK_F64, 2, (int64_t[]){30, 30}, 1, (int64_t[]){3});
  /* The direct fir kernel's outputs on a 2-D grid (2000 outputs: 8
   * workgroups on 3 x 3). */
  setenv("DSPK_VK_MAX_GROUPS", "3", 1);
  char msg[512];
  int64_t sx[2] = {4, 500}, sh[1] = {20};
  struct htensor F = h_make(DSPK_F64, 2, sx, 1), H = h_make(DSPK_F64, 1, sh, 1), Y;
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  assert_int_equal(h_upload(D, &F, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &H, 0, &op.in[1]), 0);
  dspk__vk_fir_force(0);
  int r = h_run(D, &op, &Y, msg, sizeof msg);
  dspk__vk_fir_force(-1);
  if (r)
    fail_msg("fir: %d %s", r, msg);
  double complex *want = calloc((size_t)F.n, sizeof *want);
  for (int64_t row = 0; row < 4; row++)
    for (int64_t t = 0; t < 500; t++)
      for (int64_t j = 0; j < 20 && j <= t; j++)
        want[row * 500 + t] += H.v[j] * F.v[row * 500 + t - j];
  double e = h_relerr(&Y, want, F.n);
  if (!(e <= 1e-12))
    fail_msg("fir split over dispatches: rel err %g", e);
  free(want);
  h_free(&F);
  h_free(&H);
  h_free(&Y);
  unsetenv("DSPK_VK_MAX_GROUPS");
}

/* A gemm canceled while autotuning (the progress callback raises the
 * cancel flag, as the daemon does when the client goes or the daemon
 * stops) returns DSPK_ECANCELED and says it was canceled, not a message
 * left by something before (the buffer holds one here, as a candidate's
 * failure would leave). */
static atomic_int cancel_flag;
static void cancel_on_progress(void *ud, const char *what, double fraction) {
  (void)ud, (void)what, (void)fraction;
  atomic_store(&cancel_flag, 1);
}
static void t_gemm_cancel(void **state) {
  (void)state;
  char msg[512];
  dspk__autotune_forget_all();
  int64_t sa[2] = {520, 64}, sb[2] = {64, 520};
  struct htensor A = h_make(DSPK_F64, 2, sa, 1), B = h_make(DSPK_F64, 2, sb, 1);
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2};
  op.u.gemm.alpha = 1;
  assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  assert_int_equal(VKB->alloc(D, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
  atomic_store(&cancel_flag, 0);
  struct dspk__opctx ctx = {.cancel = &cancel_flag, .progress = cancel_on_progress,
                            .errmsg = msg, .errmsg_len = sizeof msg};
  snprintf(msg, sizeof msg, "gemm: tile v2-128x128x16-t256 exceeds this device's limits");
  int r = VKB->run(D, &op, &ctx);
  /* ECANCELED when the work stopped; a device fast enough to finish the
   * tuning run that held the whole result first answers as usual (the
   * result then checked) */
  if (r == 0) {
    struct htensor C = h_make(op.out[0].dtype, op.out[0].rank, op.out[0].shape, 0);
    size_t nb = dspk__tensor_nbytes(&op.out[0]);
    void *p = malloc(nb + 16);
    assert_int_equal(VKB->read(D, op.out[0].mem, 0, p, nb), 0);
    h_unpack(&C, p);
    free(p);
    double complex *want = calloc((size_t)(520 * 520), sizeof *want);
    for (int i = 0; i < 520; i++)
      for (int k = 0; k < 64; k++)
        for (int j = 0; j < 520; j++)
          want[i * 520 + j] += A.v[i * 64 + k] * B.v[k * 520 + j];
    double e = h_relerr(&C, want, C.n);
    free(want);
    h_free(&C);
    if (!(e <= 1e-12))
      fail_msg("a gemm that finished before its cancel: rel err %g", e);
  } else {
    assert_int_equal(r, DSPK_ECANCELED);
    if (!strstr(msg, "canceled") || strstr(msg, "tile"))
      fail_msg("canceled gemm says: %s", msg);
  }
  VKB->free(D, op.out[0].mem);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, op.in[1].mem);
  h_free(&A);
  h_free(&B);
  dspk__autotune_forget_all();
}

static void t_fft(void **state) {
  (void)state;
  char msg[512];
  const int64_t ns[] = {8, 12, 100, 37, 1024, 4096, 5, 74, 1009};
  for (int iter = 0; iter < 18; iter++) {
    int64_t n = ns[iter % 9];
    if (getenv("FFTN"))
      n = atoi(getenv("FFTN"));
    dspk_dtype dt = getenv("FFTDT") ? (dspk_dtype)atoi(getenv("FFTDT")) : (iter % 4 == 0) ? DSPK_C64 : (iter % 4 == 1) ? DSPK_C128
                    : (iter % 4 == 2) ? DSPK_F32 : DSPK_F64;
    int inverse = h_cplx(dt) && (iter / 2) % 2;
    int64_t shape[2] = {h_randint(1, 3), n};
    if (getenv("FFTB"))
      shape[0] = atoi(getenv("FFTB"));
    struct htensor X = h_make(dt, 2, shape, 1), out;
    struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
    op.u.fft.inverse = inverse;
    assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
    int r = h_run(D, &op, &out, msg, sizeof msg);
    if (r)
      fail_msg("fft n=%lld %s: %d %s", (long long)n, dspk__dtype_name(dt), r, msg);
    int64_t m = h_cplx(dt) ? n : n / 2 + 1;
    double complex *want = calloc(shape[0] * m, sizeof *want);
    for (int64_t b = 0; b < shape[0]; b++)
      for (int64_t k = 0; k < m; k++) {
        double complex acc = 0;
        for (int64_t j = 0; j < n; j++) {
          double ang = (inverse ? 2 : -2) * M_PI * (double)((j * k) % n) / (double)n;
          acc += X.v[b * n + j] * cexp(I * ang);
        }
        want[b * m + k] = inverse ? acc / (double)n : acc;
      }
    double e = h_relerr(&out, want, shape[0] * m);
    double tol = (dt == DSPK_F64 || dt == DSPK_C128) ? 1e-10 : 1e-5;
    if (!(e <= tol)) /* NaN fails too */
      fail_msg("fft n=%lld %s inverse=%d: rel err %g", (long long)n, dspk__dtype_name(dt),
               inverse, e);
    free(want);
    h_free(&X);
    h_free(&out);
  }
}

/* ---- out-of-place fft against FFTW ---------------------------------------- */

/* want[b*n + k] = FFTW's transform of rows of x (n complex, batch rows), in
 * double precision, scaled by 1/n when inverse (numpy's ifft). */
static void fftw_ref(const double complex *x, double complex *want, int64_t n, int64_t batch,
                     int inverse) {
  int nn = (int)n;
  memcpy(want, x, sizeof *want * (size_t)(n * batch));
  fftw_plan pl = fftw_plan_many_dft(1, &nn, (int)batch, (fftw_complex *)want, NULL, 1, nn,
                                    (fftw_complex *)want, NULL, 1, nn,
                                    inverse ? FFTW_BACKWARD : FFTW_FORWARD, FFTW_ESTIMATE);
  assert_non_null(pl);
  fftw_execute(pl);
  fftw_destroy_plan(pl);
  if (inverse)
    for (int64_t i = 0; i < n * batch; i++)
      want[i] /= (double)n;
}

/* One complex transform of a random batch x n through the backend,
 * checked against FFTW; also checks that X is left as it was (the
 * transform reads it in place of a copy). */
static void fft_oop_case(dspk_dtype dt, int64_t n, int64_t batch, int inverse) {
  char msg[512];
  int64_t shape[2] = {batch, n};
  struct htensor X = h_make(dt, 2, shape, 1), out, back;
  struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
  op.u.fft.inverse = inverse;
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  assert_int_equal(VKB->alloc(D, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  int r = VKB->run(D, &op, &ctx);
  if (r)
    fail_msg("fft n=%lld x %lld: %d %s", (long long)n, (long long)batch, r, msg);
  out = h_make(dt, 2, shape, 0);
  back = h_make(dt, 2, shape, 0);
  size_t nb = dspk__tensor_nbytes(&op.out[0]);
  void *p = malloc(nb);
  assert_int_equal(VKB->read(D, op.out[0].mem, 0, p, nb), 0);
  h_unpack(&out, p);
  assert_int_equal(VKB->read(D, op.in[0].mem, 0, p, nb), 0);
  h_unpack(&back, p);
  free(p);
  double complex *want = malloc(sizeof *want * (size_t)(n * batch));
  fftw_ref(X.v, want, n, batch, inverse);
  double e = h_relerr(&out, want, n * batch);
  double tol = dt == DSPK_C128 ? 1e-11 : 2e-5 * (1 + log2((double)n) / 8);
  if (!(e <= tol)) /* NaN fails too */
    fail_msg("fft n=%lld x %lld %s inverse=%d: rel err %g", (long long)n, (long long)batch,
             dspk__dtype_name(dt), inverse, e);
  assert_true(h_relerr(&back, X.v, n * batch) == 0);
  free(want);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, op.out[0].mem);
  h_free(&X);
  h_free(&out);
  h_free(&back);
}

static void t_fft_oop(void **state) {
  (void)state;
  /* One-pass and multi-pass VkFFT plans (lavapipe's shared memory holds
   * 8192 c64 values: 2^16 takes two uploads), mixed radices, both
   * directions, batches above 1, buffers above the slab size (their own
   * VkBuffer). */
  static const struct {
    dspk_dtype dt;
    int64_t n, batch;
  } cases[] = {
      {DSPK_C64, 1 << 16, 3},  {DSPK_C64, 1 << 12, 5},   {DSPK_C64, 3 * 5 * 7 * 64, 2},
      {DSPK_C128, 1 << 15, 3}, {DSPK_C128, 6 * 1024, 2},
      {DSPK_C64, 16, 1000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int inverse = 0; inverse < 2; inverse++)
      fft_oop_case(cases[i].dt, cases[i].n, cases[i].batch, inverse);
}

/* Several transforms of one shape on different buffers, queued without
 * waiting in between (each buffer pair needs VkFFT's descriptors to name
 * it): more pairs than a plan has instances, so an instance is reused
 * while others are pending, and the same pairs again afterwards. */
static void t_fft_buffers(void **state) {
  (void)state;
  char msg[512];
  enum { K = 6 };
  int64_t n = 1 << 14, batch = 16; /* 2 MiB: dedicated buffers */
  int64_t shape[2] = {batch, n};
  struct htensor X[K];
  struct dspk__op op[K];
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < K; i++) {
      if (round == 0) {
        X[i] = h_make(DSPK_C64, 2, shape, 1);
        memset(&op[i], 0, sizeof op[i]);
        op[i].kind = DSPK_OP_FFT;
        op[i].nin = 1;
        op[i].u.fft.inverse = i % 2;
        assert_int_equal(h_upload(D, &X[i], 0, &op[i].in[0]), 0);
        assert_int_equal(dspk__op_infer(&op[i], msg, sizeof msg), 0);
        assert_int_equal(
            VKB->alloc(D, dspk__tensor_nbytes(&op[i].out[0]), &op[i].out[0].mem), 0);
      }
      struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
      if (VKB->run(D, &op[i], &ctx))
        fail_msg("fft %d: %s", i, msg);
    }
    for (int i = 0; i < K; i++) {
      struct htensor out = h_make(DSPK_C64, 2, shape, 0);
      size_t nb = dspk__tensor_nbytes(&op[i].out[0]);
      void *p = malloc(nb);
      assert_int_equal(VKB->read(D, op[i].out[0].mem, 0, p, nb), 0);
      h_unpack(&out, p);
      free(p);
      double complex *want = malloc(sizeof *want * (size_t)(n * batch));
      fftw_ref(X[i].v, want, n, batch, i % 2);
      double e = h_relerr(&out, want, n * batch);
      if (!(e <= 1e-5)) /* NaN fails too */
        fail_msg("fft on buffer pair %d (round %d): rel err %g", i, round, e);
      free(want);
      h_free(&out);
    }
  }
  for (int i = 0; i < K; i++) {
    VKB->free(D, op[i].in[0].mem);
    VKB->free(D, op[i].out[0].mem);
    h_free(&X[i]);
  }
}

/* Naive DFT of one row of n <= 64 c64 values (double precision). */
static void dft_row(const float *x, int64_t n, double complex *y) {
  double complex w[64]; /* n <= 64 */
  for (int64_t q = 0; q < n; q++)
    w[q] = cexp(-2.0 * M_PI * I * (double)q / (double)n);
  for (int64_t k = 0; k < n; k++) {
    double complex acc = 0;
    for (int64_t j = 0; j < n; j++)
      acc += CMPLX(x[2 * j], x[2 * j + 1]) * w[(j * k) % n];
    y[k] = acc;
  }
}

/* Checks rows of a c64 transform against dft_row: the first and last 2048
 * rows of every `every` rows (the starts of the chunks a temporary takes),
 * the last rows and every 61st; fails naming the first wrong row. */
static void check_rows(const char *what, const float *x, const float *y, int64_t n,
                       int64_t batch, int64_t every) {
  double complex *want = malloc(sizeof *want * (size_t)n);
  for (int64_t r = 0; r < batch; r++) {
    int64_t in_chunk = every ? r % every : r;
    if (!(in_chunk < 2048 || r >= batch - 2048 || r % 61 == 0))
      continue;
    dft_row(x + 2 * r * n, n, want);
    double err = 0, mag = 0;
    for (int64_t k = 0; k < n; k++) {
      double complex got = CMPLX(y[2 * (r * n + k)], y[2 * (r * n + k) + 1]);
      err = fmax(err, cabs(got - want[k]));
      mag = fmax(mag, cabs(want[k]));
    }
    if (!(err <= 1e-5 * (mag > 1 ? mag : 1))) /* NaN fails too */
      fail_msg("%s: row %lld of %lld wrong (max error %g)", what, (long long)r,
               (long long)batch, err);
  }
  free(want);
}

/* One case of t_fft_guard: a c64 fft of `batch` random rows of n, its
 * output (X itself when in place) between 64 KiB of a pattern before and
 * after it in its buffer, which must be left as they were; rows checked as
 * check_rows does with `every`. */
static void guard_case(int64_t n, int64_t batch, int inplace, int64_t every) {
  char msg[512];
  const size_t gb = 1 << 16, nb = (size_t)(batch * n * 8);
  float *x = malloc(nb), *y = malloc(nb), *pat = malloc(gb), *back = malloc(gb);
  assert_true(x && y && pat && back);
  for (size_t i = 0; i < nb / 4; i++)
    x[i] = (float)h_rand();
  for (size_t i = 0; i < gb / 4; i++)
    pat[i] = (float)(i % 977) + 0.25f;
  struct dspk__mem *mx, *mo;
  assert_int_equal(VKB->alloc(D, nb + 2 * gb, &mo), 0);
  assert_int_equal(VKB->write(D, mo, 0, pat, gb), 0);
  assert_int_equal(VKB->write(D, mo, gb + nb, pat, gb), 0);
  if (inplace) {
    mx = mo;
    assert_int_equal(VKB->write(D, mx, gb, x, nb), 0);
  } else {
    assert_int_equal(VKB->alloc(D, nb, &mx), 0);
    assert_int_equal(VKB->write(D, mx, 0, x, nb), 0);
  }
  struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
  op.in[0] = (struct dspk__tensor){.dtype = DSPK_C64, .rank = 2, .shape = {batch, n},
                                   .mem = mx, .offset = inplace ? gb : 0};
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  op.out[0].mem = mo;
  op.out[0].offset = gb;
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  const char *how = inplace ? "in place" : "out of place";
  if (VKB->run(D, &op, &ctx))
    fail_msg("fft %lld x %lld %s: %s", (long long)batch, (long long)n, how, msg);
  for (int side = 0; side < 2; side++) {
    assert_int_equal(VKB->read(D, mo, side ? gb + nb : 0, back, gb), 0);
    if (memcmp(back, pat, gb))
      fail_msg("fft %lld x %lld %s: the 64 KiB %s its output changed", (long long)batch,
               (long long)n, how, side ? "after" : "before");
  }
  assert_int_equal(VKB->read(D, mo, gb, y, nb), 0);
  char what[96];
  snprintf(what, sizeof what, "fft %lld x %lld %s", (long long)batch, (long long)n, how);
  check_rows(what, x, y, n, batch, every);
  VKB->free(D, mo);
  if (!inplace)
    VKB->free(D, mx);
  free(x);
  free(y);
  free(pat);
  free(back);
}

/* A transform writes its own output rows and nothing else: c64 rows of 64
 * in a batch that is no multiple of 16, as many as one binding takes (up
 * to 2429281), in place and out of place (on an H100, VkFFT wrote 15 rows
 * past such a batch when its dispatch was split: vk_fft.c, fit_rows).  And
 * Bluestein's rows (n = 17) in two whole chunks of its temporary and 1001
 * rows more: there VkFFT overwrote what lay after the rows in the
 * temporary, the exponents by which the first 960 rows of the third chunk
 * were scaled. */
static void t_fft_guard(void **state) {
  (void)state;
  uint64_t range = D->props.limits.maxStorageBufferRange & ~(uint64_t)15;
  int64_t batch = (int64_t)(range / (64 * 8)) - 2 * 128 - 16; /* guards: 128 rows each */
  if (batch > 2429281)
    batch = 2429281;
  batch = batch / 16 * 16 + 1;
  guard_case(64, batch, 0, 0);
  guard_case(64, batch, 1, 0);
  /* Bluestein: m = 64 and the exponent, 65 values a row of its temporaries */
  int64_t chunk = (int64_t)(range / (65 * 8)), bb = 2 * chunk + 1001;
  if ((uint64_t)bb * 17 * 8 + (1 << 17) > range) /* the output within one binding */
    bb = (int64_t)((range - (1 << 17)) / (17 * 8));
  guard_case(17, bb, 0, chunk);
}

/* Every tuning candidate, forced in turn, computes the right transform on
 * one- and multi-pass shapes (the tuner also checks each against an exact
 * DFT before using it; this checks the candidates themselves). */
static void t_fft_cands(void **state) {
  (void)state;
  static const char *names[] = {"vendor", "t256", "t64", "lut", "rb1", "c64", "c128",
                                "c64-t256", "c128-t256"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    setenv("DSPK_VK_FFT_TUNE", names[i], 1);
    print_message("fft candidate %s\n", names[i]);
    fft_oop_case(DSPK_C64, 1 << 16, 2, (int)(i % 2));
    fft_oop_case(DSPK_C64, 1 << 11, 3, 0);
  }
  unsetenv("DSPK_VK_FFT_TUNE");
}

/* Our own fft kernels (vk_sfft.c), each forced in turn, against FFTW in
 * both directions: the tuner's short list for one- and two-pass lengths,
 * plus configurations that reach the edges of the generator (2 and 32
 * values per thread, one and 16 transforms per workgroup, a batch that
 * does not fill the last workgroup, unequal two-pass splits); and names
 * that are not configurations run nothing. */
static void t_fft_sk(void **state) {
  (void)state;
  static const struct {
    int64_t n, batch;
  } shapes[] = {{64, 7}, {1024, 3}, {1 << 13, 2}, {1 << 16, 2}};
  static const char *extra[][2] = {
      {"64", "sk:1:16/4"},          {"64", "sk:1:1/32"},          {"64", "sk:1:4/2"},
      {"1024", "sk:1:2/32"},        {"8192", "sk:32:16/8:4/16"},  {"8192", "sk:256:1/32:8/4"},
      {"32768", "sk:2048:1/16:2/2"}, {"16384", "sk:16:16/16:2/32"},
      /* groups taking turns in shared memory (and a partial last one) */
      {"1024", "sk:1:4/16/2"},       {"64", "sk:1:4/2/2"},         {"8192", "sk:64:8/16/2:8/8/4"},
      {"65536", "sk:256:16/32/4:4/16/2"},
  };
  char name[64];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    struct dspk__vk_sfft_cfg c[8];
    int nc = dspk__vk_sfft_cands(D, (uint64_t)shapes[s].n, (uint64_t)shapes[s].batch, c, 8);
    assert_true(nc > 0);
    for (int i = 0; i < nc; i++) {
      dspk__vk_sfft_name(&c[i], name, sizeof name);
      print_message("fft kernel %s, n=%lld x %lld\n", name, (long long)shapes[s].n,
                    (long long)shapes[s].batch);
      setenv("DSPK_VK_FFT_TUNE", name, 1);
      for (int inverse = 0; inverse < 2; inverse++)
        fft_oop_case(DSPK_C64, shapes[s].n, shapes[s].batch, inverse);
    }
  }
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    struct dspk__vk_sfft_cfg c;
    int64_t n = atoll(extra[i][0]);
    assert_int_equal(dspk__vk_sfft_parse(extra[i][1], &c), 0);
    if (!dspk__vk_sfft_valid(D, (uint64_t)n, 5, &c)) {
      print_message("fft kernel %s does not fit this device\n", extra[i][1]);
      continue;
    }
    print_message("fft kernel %s, n=%lld x 5\n", extra[i][1], (long long)n);
    setenv("DSPK_VK_FFT_TUNE", extra[i][1], 1);
    fft_oop_case(DSPK_C64, n, 5, (int)(i % 2));
  }
  unsetenv("DSPK_VK_FFT_TUNE");
  struct dspk__vk_sfft_cfg c;
  static const char *bad[] = {"sk:",        "sk:1:4",       "sk:1:4/8:4/8", "sk:64:4/8",
                              "sk:64:4/8:4/8x", "sk:01:4/8", "sk:1:4/8/1", "sk:1:4/8/2/2",
                              "sk:1:-4/8", "sk:1:4/0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(dspk__vk_sfft_parse(bad[i], &c), -1);
  /* lengths and configurations that do not fit are refused, not run */
  assert_int_equal(dspk__vk_sfft_parse("sk:1:1/8", &c), 0);
  assert_false(dspk__vk_sfft_valid(D, 3 * 64, 1, &c));
  assert_false(dspk__vk_sfft_valid(D, 8192, 1, &c));
  assert_int_equal(dspk__vk_sfft_cands(D, 3 * 64, 1, &c, 1), 0);
}

/* Teardown of the tests that force fft tuning: no later test sees it,
 * even when one failed half-way. */
static int unset_tune(void **state) {
  (void)state;
  unsetenv("DSPK_VK_FFT_TUNE");
  return 0;
}

/* Output placed on the input itself: transformed in place (and never
 * tuned on, which would transform it several times). */
static void t_fft_inplace(void **state) {
  (void)state;
  char msg[512];
  int64_t n = 1 << 12, batch = 3, shape[2] = {batch, n};
  setenv("DSPK_VK_FFT_TUNE", "force", 1);
  for (int inverse = 0; inverse < 2; inverse++) {
    struct htensor X = h_make(DSPK_C64, 2, shape, 1), out = h_make(DSPK_C64, 2, shape, 0);
    struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
    op.u.fft.inverse = inverse;
    assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
    assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
    op.out[0] = op.in[0];
    struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
    if (VKB->run(D, &op, &ctx))
      fail_msg("in-place fft: %s", msg);
    size_t nb = dspk__tensor_nbytes(&op.out[0]);
    void *p = malloc(nb);
    assert_int_equal(VKB->read(D, op.out[0].mem, 0, p, nb), 0);
    h_unpack(&out, p);
    free(p);
    double complex *want = malloc(sizeof *want * (size_t)(n * batch));
    fftw_ref(X.v, want, n, batch, inverse);
    double e = h_relerr(&out, want, n * batch);
    if (!(e <= 1e-5)) /* NaN fails too */
      fail_msg("in-place fft inverse=%d: rel err %g", inverse, e);
    free(want);
    VKB->free(D, op.in[0].mem);
    h_free(&X);
    h_free(&out);
  }
  unsetenv("DSPK_VK_FFT_TUNE");
}

/* The tuning path (forced on this device for a small size): every
 * candidate configuration is planned and measured, the result is right,
 * and the decision is stored in the cache with its timings. */
static void t_fft_tune(void **state) {
  (void)state;
  char path[] = "/tmp/dspk-vk-fft-tune-XXXXXX";
  assert_int_equal(h_cache_path(path), 0);
  struct dspk__cache *c;
  assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
  struct dspk__devenv env = {.cache = c};
  struct dspk__dev *d, *save = D;
  assert_int_equal(VKB->open(0, &env, &d), 0);
  setenv("DSPK_VK_FFT_TUNE", "force", 1);
  D = d;
  unsigned timed = dspk__vk_fft_timed();
  fft_oop_case(DSPK_C64, 512, 8, 0);
  timed = dspk__vk_fft_timed() - timed;
  fft_oop_case(DSPK_C64, 512, 8, 0); /* the decision from the plan cache */
  D = save;
  /* The candidates' runs are timed by the device (lavapipe has
   * timestamps): at least a warm-up and a sample of each of two. */
  print_message("fft tune: %u runs timed by timestamps\n", timed);
  if (dspk__vk_timestamps(d))
    assert_true(timed >= 4);
  unsetenv("DSPK_VK_FFT_TUNE");
  char rep[4096];
  assert_int_equal(dspk__vk_fft_tune_report(d, 512, 8, 0, rep, sizeof rep), 0);
  print_message("fft tune: %s\n", rep);
  assert_non_null(strstr(rep, "winner "));
  assert_null(strstr(rep, " 0 passes")); /* the winner's plan is cached */
  /* Every candidate ran and matched the exact DFT (tune_check). */
  assert_null(strstr(rep, "\"error\""));
  /* Of our kernels' plans (each with a temporary as large as X) only the
   * winner's stays in the plan cache. */
  int sk_plans = 0;
  for (unsigned i = 0; i < d->plans.n; i++)
    sk_plans += *(int *)d->plans.e[i].plan == 4;
  assert_true(sk_plans == (strstr(rep, "winner sk:") ? 1 : 0));
  VKB->close(d);
  dspk__cache_close(c);
  h_cache_unlink(path);
}

static const char raw_glsl[] =
    "#version 450\n"
    "layout(local_size_x = 64) in;\n"
    "layout(std430, binding = 0) buffer X { float x[]; };\n"
    "layout(std430, binding = 1) buffer Y { float y[]; };\n"
    "layout(push_constant) uniform P { uint n; float a; } p;\n"
    "void main() {\n"
    "  uint i = gl_GlobalInvocationID.x;\n"
    "  if (i < p.n) y[i] = p.a * x[i] + y[i];\n"
    "}\n";

static void raw_run(const char *lang, const void *src, size_t len) {
  char msg[512];
  int64_t n = 1000;
  struct htensor X = h_make(DSPK_F32, 1, &n, 1), Y = h_make(DSPK_F32, 1, &n, 1);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 2};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &Y, 0, &op.in[1]), 0);
  op.u.kernel.lang = lang;
  op.u.kernel.source = src;
  op.u.kernel.source_len = len;
  op.u.kernel.grid[0] = (uint32_t)((n + 63) / 64);
  op.u.kernel.nargs = 4;
  op.u.kernel.args[0] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  op.u.kernel.args[1] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 1};
  op.u.kernel.args[2] = (struct dspk__karg){.kind = DSPK__KARG_U32, .v.u32 = (uint32_t)n};
  op.u.kernel.args[3] = (struct dspk__karg){.kind = DSPK__KARG_F32, .v.f32 = 2.5f};
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  int r = VKB->run(D, &op, &ctx);
  if (r)
    fail_msg("raw %s: %d %s", lang, r, msg);
  float *y = malloc(n * 4);
  assert_int_equal(VKB->read(D, op.in[1].mem, 0, y, n * 4), 0);
  for (int64_t i = 0; i < n; i++)
    assert_float_equal(y[i], 2.5f * (float)creal(X.v[i]) + (float)creal(Y.v[i]), 1e-5);
  free(y);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, op.in[1].mem);
  h_free(&X);
  h_free(&Y);
}

/* The kernel of raw_glsl with the first ntensor tensors and nscalar scalars
 * of raw_run's args: refused with EINVAL, the message holding want, before
 * any pipeline is made (a layout without the bindings or push constants the
 * shader uses is undefined behaviour in Vulkan; lavapipe ran it silently). */
static void raw_refused(const char *lang, const void *src, size_t len, int ntensor,
                        int nscalar, const char *want) {
  char msg[512];
  int64_t n = 8;
  struct htensor X = h_make(DSPK_F32, 1, &n, 1);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 1};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  op.u.kernel.lang = lang;
  op.u.kernel.source = src;
  op.u.kernel.source_len = len;
  op.u.kernel.grid[0] = 1;
  for (int i = 0; i < ntensor; i++)
    op.u.kernel.args[op.u.kernel.nargs++] =
        (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  if (nscalar > 0)
    op.u.kernel.args[op.u.kernel.nargs++] =
        (struct dspk__karg){.kind = DSPK__KARG_U32, .v.u32 = (uint32_t)n};
  if (nscalar > 1)
    op.u.kernel.args[op.u.kernel.nargs++] =
        (struct dspk__karg){.kind = DSPK__KARG_F32, .v.f32 = 1.0f};
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  msg[0] = 0;
  int r = VKB->run(D, &op, &ctx);
  if (r != DSPK_EINVAL || !strstr(msg, want))
    fail_msg("raw %s with %d tensors, %d scalars: %d \"%s\", expected EINVAL \"%s\"", lang,
             ntensor, nscalar, r, msg, want);
  VKB->free(D, op.in[0].mem);
  h_free(&X);
}

static void raw_bindings(const char *lang, const void *src, size_t len) {
  raw_refused(lang, src, len, 0, 2, "binding 0, but args pass no tensor");
  raw_refused(lang, src, len, 1, 2, "binding 1, but args pass 1 tensor (bindings 0 to 0)");
  raw_refused(lang, src, len, 2, 1, "push-constant block is 8 bytes, the scalars of args "
                                    "fill 4");
  raw_refused(lang, src, len, 2, 0, "push-constant block is 8 bytes, the scalars of args "
                                    "fill 0");
}

static void t_raw_glsl(void **state) {
  (void)state;
  raw_run("glsl", raw_glsl, strlen(raw_glsl));
  raw_bindings("glsl", raw_glsl, strlen(raw_glsl));
}

/* Raw-kernel arguments with no elements (Vulkan has no empty descriptor
 * range): bound to 4 bytes of scratch memory, so .length() is 1 for a
 * 32-bit array and 0 for a 64-bit one (protocol.md, kernel), and a store
 * through one does not reach the bytes at its place: here a 0-element view
 * inside another tensor's buffer, whose data must stay as written. */
static void t_raw_len0(void **state) {
  (void)state;
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer O { float o[]; };\n"
      "layout(std430, binding = 1) buffer X { float x[]; };\n"
      "layout(std430, binding = 2) buffer Y { uvec2 y[]; };\n"
      "void main() { o[0] = float(x.length()); o[1] = float(y.length()); x[0] = 99.0; }\n";
  char msg[512];
  int64_t n = 256, two = 2;
  struct htensor X = h_make(DSPK_F32, 1, &n, 1), Ot = h_make(DSPK_F32, 1, &two, 0);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 3};
  assert_int_equal(h_upload(D, &Ot, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &X, 0, &op.in[1]), 0);
  struct dspk__mem *xm = op.in[1].mem;
  /* X's tensor becomes an empty view at an aligned place inside X's data;
   * Y an empty u64 (two 32-bit words) tensor of its own. */
  op.in[1].shape[0] = 0;
  op.in[1].offset = (size_t)D->align <= 512 ? (size_t)D->align : 512;
  op.in[2] = (struct dspk__tensor){.dtype = DSPK_F64, .rank = 2, .shape = {3, 0}};
  assert_int_equal(VKB->alloc(D, 0, &op.in[2].mem), 0);
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  op.u.kernel.grid[0] = 1;
  op.u.kernel.nargs = 3;
  for (int i = 0; i < 3; i++)
    op.u.kernel.args[i] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = i};
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  int r = VKB->run(D, &op, &ctx);
  if (r)
    fail_msg("raw kernel with empty tensors: %d %s", r, msg);
  float o[2], *x = malloc((size_t)n * 4);
  assert_int_equal(VKB->read(D, op.in[0].mem, 0, o, sizeof o), 0);
  assert_int_equal(VKB->read(D, xm, 0, x, (size_t)n * 4), 0);
  assert_float_equal(o[0], 1.0f, 0);
  assert_float_equal(o[1], 0.0f, 0);
  for (int64_t i = 0; i < n; i++)
    if (x[i] != (float)creal(X.v[i]))
      fail_msg("a store through an empty tensor reached its buffer at element %lld",
               (long long)i);
  free(x);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, xm);
  VKB->free(D, op.in[2].mem);
  h_free(&X);
  h_free(&Ot);
}

/* Runs raw GLSL src over tensors t[0..n) (each an argument, in order),
 * then the scalars sc[0..nsc), grid 1; returns run's code, msg the message. */
static int raw_over_lang(const char *lang, const void *src, size_t srclen,
                         struct dspk__tensor *t, int n, const struct dspk__karg *sc, int nsc,
                         char *msg, size_t len);

static int raw_over_sc(const char *src, struct dspk__tensor *t, int n,
                       const struct dspk__karg *sc, int nsc, char *msg, size_t len) {
  return raw_over_lang("glsl", src, strlen(src), t, n, sc, nsc, msg, len);
}

/* raw_over_sc for a kernel of language lang (glsl, spirv), srclen bytes. */
static int raw_over_lang(const char *lang, const void *src, size_t srclen,
                         struct dspk__tensor *t, int n, const struct dspk__karg *sc, int nsc,
                         char *msg, size_t len) {
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = n};
  for (int i = 0; i < n; i++) {
    op.in[i] = t[i];
    op.u.kernel.args[i] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = i};
  }
  for (int i = 0; i < nsc; i++)
    op.u.kernel.args[n + i] = sc[i];
  op.u.kernel.nargs = n + nsc;
  op.u.kernel.lang = lang;
  op.u.kernel.source = src;
  op.u.kernel.source_len = srclen;
  if (strcmp(lang, "spirv") == 0)
    snprintf(op.u.kernel.entry, sizeof op.u.kernel.entry, "main");
  op.u.kernel.grid[0] = 1;
  assert_int_equal(dspk__op_infer(&op, msg, len), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = len};
  msg[0] = 0;
  return VKB->run(D, &op, &ctx);
}

static int raw_over(const char *src, struct dspk__tensor *t, int n, char *msg, size_t len) {
  return raw_over_sc(src, t, n, NULL, 0, msg, len);
}

/* A tensor of n 32-bit words in a fresh block, zeroed. */
static struct dspk__tensor words(int64_t n) {
  struct dspk__tensor t = {.dtype = DSPK_F32, .rank = 1, .shape = {n}};
  uint32_t *z = calloc((size_t)n, 4);
  assert_int_equal(VKB->alloc(D, (size_t)n * 4, &t.mem), 0);
  assert_int_equal(VKB->write(D, t.mem, 0, z, (size_t)n * 4), 0);
  free(z);
  return t;
}

/* Workgroup (shared) memory and uninitialised locals of a raw kernel read
 * zero, never what an earlier kernel (another user's) left there: one
 * kernel fills a shared array with a pattern, the next copies out its own
 * unwritten shared array (lavapipe handed it the first one's bytes, every
 * word, before vk_spvzero.c). */
static void t_raw_zero_init(void **state) {
  (void)state;
  static const char writer[] =
      "#version 450\n"
      "layout(local_size_x = 64) in;\n"
      "layout(std430, binding = 0) buffer B { uint d[]; };\n"
      "shared uint sh[4096];\n"
      "void main() { uint i = gl_LocalInvocationID.x;\n"
      "  for (uint k = i; k < 4096u; k += 64u) sh[k] = 0x5EC2E7A5u + k;\n"
      "  barrier(); d[i] = sh[(i * 61u) % 4096u]; }\n";
  static const char reader[] =
      "#version 450\n"
      "layout(local_size_x = 64) in;\n"
      "layout(std430, binding = 0) buffer B { uint d[]; };\n"
      "layout(std430, binding = 1) buffer L { uint l[]; };\n"
      "shared uint sh[4096];\n"
      "void main() { uint i = gl_LocalInvocationID.x; uint v[16];\n"
      "  for (uint k = i; k < 4096u; k += 64u) d[k] = sh[k];\n"
      "  for (uint k = 0u; k < 16u; k++) l[i * 16u + k] = v[k]; }\n";
  char msg[512];
  if (!D->zero_wg) {
    /* Such a device refuses kernels with workgroup memory. */
    struct dspk__tensor t = words(4096);
    assert_int_equal(raw_over(writer, &t, 1, msg, sizeof msg), DSPK_ENOTSUP);
    assert_non_null(strstr(msg, "shaderZeroInitializeWorkgroupMemory"));
    VKB->free(D, t.mem);
    return;
  }
  for (int round = 0; round < 2; round++) {
    struct dspk__tensor t[2] = {words(4096), words(64 * 16)};
    int r = raw_over(writer, t, 1, msg, sizeof msg);
    if (r)
      fail_msg("writer: %d %s", r, msg);
    if ((r = raw_over(reader, t, 2, msg, sizeof msg)))
      fail_msg("reader: %d %s", r, msg);
    uint32_t *d = malloc(4096 * 4), *l = malloc(64 * 16 * 4);
    assert_int_equal(VKB->read(D, t[0].mem, 0, d, 4096 * 4), 0);
    assert_int_equal(VKB->read(D, t[1].mem, 0, l, 64 * 16 * 4), 0);
    int shared = 0, locals = 0;
    for (int k = 0; k < 4096; k++)
      shared += d[k] != 0;
    for (int k = 0; k < 64 * 16; k++)
      locals += l[k] != 0;
    if (shared || locals)
      fail_msg("round %d: %d of 4096 words of unwritten shared memory and %d of 1024 "
               "words of unwritten locals are not zero (shared[0] %#x)",
               round, shared, locals, d[0]);
    free(d);
    free(l);
    VKB->free(D, t[0].mem);
    VKB->free(D, t[1].mem);
  }
}

/* The padding a binding rounds a tensor up to (4 bytes), and the scratch
 * word an empty tensor is bound to, read zero: never what a block at that
 * place held before (0xab bytes written here, as another user's). */
static void t_raw_pad_zero(void **state) {
  (void)state;
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint a[]; };\n"
      "layout(std430, binding = 1) buffer E { uint e[]; };\n"
      "layout(std430, binding = 2) buffer O { uint o[]; };\n"
      "void main() { o[0] = a[a.length() - 1]; o[1] = e[0]; o[2] = a.length(); }\n";
  unsigned char dirty[512];
  memset(dirty, 0xab, sizeof dirty);
  char msg[512];
  for (int64_t n = 1; n <= 3; n += 2) {
    /* Blocks of the pool's smallest bucket, dirtied and given back: the
     * next ones of that bucket are these (the three tensors' and the
     * scratch block's). */
    struct dspk__mem *m[5];
    for (int i = 0; i < 5; i++) {
      assert_int_equal(VKB->alloc(D, sizeof dirty, &m[i]), 0);
      assert_int_equal(VKB->write(D, m[i], 0, dirty, sizeof dirty), 0);
    }
    for (int i = 0; i < 5; i++)
      VKB->free(D, m[i]);
    VKB->settle(D);
    /* A tensor of n zero f16 elements (2n bytes, bound as 2n + 2), an
     * empty one (the scratch word) and the output. */
    struct dspk__tensor t[3] = {{.dtype = DSPK_F16, .rank = 1, .shape = {n}},
                                {.dtype = DSPK_F32, .rank = 1, .shape = {0}},
                                {0}};
    unsigned char zero[8] = {0};
    assert_int_equal(VKB->alloc(D, (size_t)n * 2, &t[0].mem), 0);
    assert_int_equal(VKB->write(D, t[0].mem, 0, zero, (size_t)n * 2), 0);
    assert_int_equal(VKB->alloc(D, 0, &t[1].mem), 0);
    t[2] = words(4);
    int r = raw_over(src, t, 3, msg, sizeof msg);
    if (r)
      fail_msg("f16[%lld]: %d %s", (long long)n, r, msg);
    uint32_t o[3];
    assert_int_equal(VKB->read(D, t[2].mem, 0, o, sizeof o), 0);
    if (o[0] != 0 || o[1] != 0)
      fail_msg("f16[%lld]: its last word reads %#x (its padding not zeroed), an empty "
               "tensor %#x", (long long)n, o[0], o[1]);
    assert_int_equal(o[2], (n * 2 + 3) / 4);
    for (int i = 0; i < 3; i++)
      VKB->free(D, t[i].mem);
  }
}

/* The rounding of a tensor that ends with an imported buffer (shared
 * memory, buffer.import) whose size is not a multiple of 4 is zero, and a
 * store there reaches nothing (protocol.md, kernel), never the client's
 * bytes past the buffer's size in its mapping: tester C's f16[3] over 6
 * bytes of a memfd of 0x11s read them and wrote 0xabcd there.  Another
 * tensor over the same buffer (its first word) sees the kernel's stores
 * through the first one, as in place; a bf16 tensor of 5 elements ends
 * the same way.  Skipped where the device imports no host memory. */
static void t_raw_pad_import(void **state) {
  (void)state;
  if (!D->host_import_align || !D->local_is_host) {
    print_message("%s imports no host memory for ops\n", D->name);
    skip();
  }
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint w[]; };\n"
      "layout(std430, binding = 1) buffer B { uint v[]; };\n"
      "layout(std430, binding = 2) buffer O { uint o[]; };\n"
      "void main() { uint pad = w[w.length() - 1]; o[0] = pad; o[1] = w.length();\n"
      "  w[w.length() - 1] = pad | 0xabcd0000u; w[0] = 0x12345678u; o[2] = v[0]; }\n";
  long page = sysconf(_SC_PAGESIZE);
  int fd = memfd_create("p", MFD_CLOEXEC);
  assert_true(fd >= 0 && page > 0);
  assert_int_equal(ftruncate(fd, page), 0);
  unsigned char *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(p != MAP_FAILED);
  char msg[512];
  for (int k = 0; k < 2; k++) {
    /* f16[3] over 6 bytes; bf16[5] over 10. */
    size_t size = k == 0 ? 6 : 10;
    memset(p, 0x11, (size_t)page);
    struct dspk__tensor t[3] = {
        {.dtype = k == 0 ? DSPK_F16 : DSPK_BF16, .rank = 1, .shape = {(int64_t)size / 2}},
        {.dtype = DSPK_F32, .rank = 1, .shape = {1}},
        {0}};
    assert_int_equal(VKB->import_host(D, p, size, &t[0].mem), 0);
    t[1].mem = t[0].mem;
    t[2] = words(4);
    int r = raw_over(src, t, 3, msg, sizeof msg);
    if (r)
      fail_msg("%zu bytes: %d %s", size, r, msg);
    assert_int_equal(VKB->sync(D), 0);
    uint32_t o[3];
    assert_int_equal(VKB->read(D, t[2].mem, 0, o, sizeof o), 0);
    for (size_t i = size; i < size + 6; i++)
      if (p[i] != 0x11)
        fail_msg("%zu bytes: the client's byte %zu past the buffer is %#x, not 0x11 (the "
                 "kernel read %#x there)", size, i, p[i], o[0]);
    uint32_t want = 0x1111u; /* the buffer's bytes of the last word, zeros past them */
    if (o[0] != want || o[1] != (uint32_t)(size + 2) / 4)
      fail_msg("%zu bytes: the last word read %#x (want %#x: the buffer's bytes, zeros past "
               "them), length %u", size, o[0], want, o[1]);
    uint32_t first;
    memcpy(&first, p, 4);
    if (first != 0x12345678u || o[2] != 0x12345678u)
      fail_msg("%zu bytes: the first word %#x, read through the other tensor after the "
               "store %#x (want 0x12345678 both)", size, first, o[2]);
    if (p[size - 2] != 0x11 || p[size - 1] != 0x11)
      fail_msg("%zu bytes: the buffer's own bytes of the last word changed", size);
    VKB->free(D, t[0].mem);
    VKB->free(D, t[2].mem);
  }
  munmap(p, (size_t)page);
  close(fd);
}

/* Skips a test of raw kernels' bounded accesses on a device that does not
 * bound them (robust_raw 0: no pipeline robustness with robustBufferAccess2,
 * as protocol.md says). */
#define skip_unless_robust_raw()                                                              \
  do {                                                                                        \
    if (!D->robust_raw) {                                                                     \
      print_message("%s offers no pipeline robustness with robustBufferAccess2: raw kernels " \
                    "are not bounded there\n", D->name);                                      \
      skip();                                                                                 \
    }                                                                                         \
  } while (0)

/* A raw kernel's accesses stay within its tensors where the device bounds
 * them (robust_raw): one tensor is words 16..31 of a block of 64 that holds
 * a pattern (the rest of the block: another tensor's, another user's); the
 * kernel reads the words past its tensor's end and before its start (as
 * negative indices wrap) and writes past its end.  Loads read zero, stores
 * change nothing.  On a GPU without pipeline robustness the loads read the
 * pattern or fault: such a device (robust_raw 0, protocol.md says what it
 * means) skips the test. */
static void t_raw_bounded(void **state) {
  (void)state;
  skip_unless_robust_raw();
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint a[]; };\n"
      "layout(std430, binding = 1) buffer O { uint o[]; };\n"
      "layout(push_constant) uniform P { int n; } p;\n"
      "void main() { for (int k = 0; k < 16; k++) { o[k] = a[p.n + k];\n"
      "    o[16 + k] = a[uint(-1 - k)]; }\n"
      "  for (int k = 0; k < 16; k++) a[p.n + k] = 0xdeadu; }\n";
  uint32_t pat[64], back[64], o[32];
  for (int i = 0; i < 64; i++)
    pat[i] = 0x5EC20000u + (uint32_t)i;
  struct dspk__tensor t[2] = {{.dtype = DSPK_F32, .rank = 1, .shape = {16}, .offset = 64},
                              words(32)};
  assert_int_equal(VKB->alloc(D, sizeof pat, &t[0].mem), 0);
  assert_int_equal(VKB->write(D, t[0].mem, 0, pat, sizeof pat), 0);
  char msg[512];
  struct dspk__karg n16 = {.kind = DSPK__KARG_I32, .v.i32 = 16};
  int r = raw_over_sc(src, t, 2, &n16, 1, msg, sizeof msg);
  if (r)
    fail_msg("raw kernel: %d %s", r, msg);
  assert_int_equal(VKB->read(D, t[1].mem, 0, o, sizeof o), 0);
  assert_int_equal(VKB->read(D, t[0].mem, 0, back, sizeof back), 0);
  for (int k = 0; k < 32; k++)
    if (o[k] != 0)
      fail_msg("a load %s its tensor read %#x, not zero (word %d)", k < 16 ? "past" : "before",
               o[k], k);
  for (int i = 0; i < 64; i++)
    if (back[i] != pat[i])
      fail_msg("word %d of the block became %#x: a store past the tensor landed", i, back[i]);
  VKB->free(D, t[0].mem);
  VKB->free(D, t[1].mem);
}

/* A raw kernel's indices into memory other than its buffers are clamped
 * into their arrays (vk_spvrobust.c; probe 22 F1: on lavapipe a `shared`
 * array indexed past its end read the daemon's heap, a store landed there,
 * and a far index ended the process).  The kernel fills three neighbouring
 * workgroup arrays, a private and a local array, a local vector and a local
 * matrix, then stores through index i into the middle workgroup array and
 * into each of the others, reads back through i, and copies everything
 * out.  For every i, near and far, negative too, the store and the load
 * went to element clamp(i, 0, 3) and nothing else changed: the reference
 * is computed here, independently of the rewrite. */
static const char raw_oob_glsl[] =
    "#version 450\n"
    "layout(local_size_x = 1) in;\n"
    "layout(std430, binding = 0) buffer O { uint o[]; };\n"
    "layout(push_constant) uniform P { int i; } p;\n"
    "shared uint g[4];\n"
    "shared uint s[4];\n"
    "shared uint h[4];\n"
    "uint pv[4];\n"
    "void main() {\n"
    "  uint f[4]; uvec4 v; mat4 m; int i = p.i;\n"
    "  for (int k = 0; k < 4; k++) { g[k] = 0x600u + uint(k); s[k] = 0x500u + uint(k);\n"
    "    h[k] = 0x700u + uint(k); pv[k] = 0x800u + uint(k); f[k] = 0x900u + uint(k);\n"
    "    v[k] = 0xa00u + uint(k); m[k] = vec4(float(k)); }\n"
    "  s[i] = 0xdeadu; pv[i] = 0xbeefu; f[i] = 0xf00du; v[i] = 0xcafeu; m[i][i] = 99.0;\n"
    "  o[0] = s[i]; o[1] = pv[i]; o[2] = f[i]; o[3] = v[i]; o[4] = uint(m[i][i]);\n"
    "  for (int k = 0; k < 4; k++) { o[5 + k] = g[k]; o[9 + k] = s[k]; o[13 + k] = h[k];\n"
    "    o[17 + k] = pv[k]; o[21 + k] = f[k]; o[25 + k] = v[k]; o[29 + k] = uint(m[k][k]); }\n"
    "}\n";

static void raw_oob_check(const char *lang, const void *src, size_t len) {
  static const int32_t idx[] = {0,      3,     4,          5,           100,    -1,
                                -5,     24576, -8192,      100000,      -100000,
                                INT32_MAX, INT32_MIN};
  for (size_t j = 0; j < sizeof idx / sizeof idx[0]; j++) {
    int32_t i = idx[j];
    uint32_t c = i < 0 ? 0 : i > 3 ? 3 : (uint32_t)i, o[33], want[33];
    struct dspk__tensor t = words(33);
    struct dspk__karg a = {.kind = DSPK__KARG_I32, .v.i32 = i};
    char msg[512];
    int r = raw_over_lang(lang, src, len, &t, 1, &a, 1, msg, sizeof msg);
    if (r)
      fail_msg("%s, index %d: %d %s", lang, (int)i, r, msg);
    assert_int_equal(VKB->read(D, t.mem, 0, o, sizeof o), 0);
    VKB->free(D, t.mem);
    want[0] = 0xdead, want[1] = 0xbeef, want[2] = 0xf00d, want[3] = 0xcafe, want[4] = 99;
    for (uint32_t k = 0; k < 4; k++) {
      want[5 + k] = 0x600 + k;
      want[9 + k] = k == c ? 0xdead : 0x500 + k;
      want[13 + k] = 0x700 + k;
      want[17 + k] = k == c ? 0xbeef : 0x800 + k;
      want[21 + k] = k == c ? 0xf00d : 0x900 + k;
      want[25 + k] = k == c ? 0xcafe : 0xa00 + k;
      want[29 + k] = k == c ? 99 : k;
    }
    for (int k = 0; k < 33; k++)
      if (o[k] != want[k])
        fail_msg("%s, index %d: word %d is %#x, want %#x (the access is not clamped to "
                 "element %u)", lang, (int)i, k, o[k], want[k], c);
  }
}

/* The same in SPIR-V assembled here: constant indices past the end and
 * negative (OpInBoundsAccessChain, which the validator takes, and a
 * dynamic OpAccessChain), into a workgroup array between two others. */
static const char raw_oob_asm[] =
    "OpCapability Shader\n"
    "OpMemoryModel Logical GLSL450\n"
    "OpEntryPoint GLCompute %main \"main\"\n"
    "OpExecutionMode %main LocalSize 1 1 1\n"
    "OpDecorate %rt ArrayStride 4\n"
    "OpMemberDecorate %blk 0 Offset 0\n"
    "OpDecorate %blk Block\n"
    "OpDecorate %ob DescriptorSet 0\n"
    "OpDecorate %ob Binding 0\n"
    "OpMemberDecorate %pcb 0 Offset 0\n"
    "OpDecorate %pcb Block\n"
    "%void = OpTypeVoid\n"
    "%fn = OpTypeFunction %void\n"
    "%u32 = OpTypeInt 32 0\n"
    "%i32 = OpTypeInt 32 1\n"
    "%c0 = OpConstant %i32 0\n"
    "%c4 = OpConstant %u32 4\n"
    "%c7 = OpConstant %i32 7\n"
    "%cm9 = OpConstant %i32 -9\n"
    "%dead = OpConstant %u32 57005\n"
    "%beef = OpConstant %u32 48879\n"
    "%arr = OpTypeArray %u32 %c4\n"
    "%parr = OpTypePointer Workgroup %arr\n"
    "%pwu = OpTypePointer Workgroup %u32\n"
    "%rt = OpTypeRuntimeArray %u32\n"
    "%blk = OpTypeStruct %rt\n"
    "%pblk = OpTypePointer StorageBuffer %blk\n"
    "%psu = OpTypePointer StorageBuffer %u32\n"
    "%pcb = OpTypeStruct %i32\n"
    "%ppcb = OpTypePointer PushConstant %pcb\n"
    "%ppci = OpTypePointer PushConstant %i32\n"
    "%g = OpVariable %parr Workgroup\n"
    "%s = OpVariable %parr Workgroup\n"
    "%h = OpVariable %parr Workgroup\n"
    "%ob = OpVariable %pblk StorageBuffer\n"
    "%pc = OpVariable %ppcb PushConstant\n"
    "%main = OpFunction %void None %fn\n"
    "%l = OpLabel\n"
    "%pi = OpAccessChain %ppci %pc %c0\n"
    "%i = OpLoad %i32 %pi\n"
    "%s7 = OpInBoundsAccessChain %pwu %s %c7\n"
    "OpStore %s7 %dead\n"
    "%sm9 = OpInBoundsAccessChain %pwu %s %cm9\n"
    "OpStore %sm9 %beef\n"
    "%si = OpAccessChain %pwu %s %i\n"
    "%vi = OpLoad %u32 %si\n"
    "%o0 = OpAccessChain %psu %ob %c0 %c0\n"
    "OpStore %o0 %vi\n"
    "OpReturn\n"
    "OpFunctionEnd\n";

static uint32_t *to_spirv(const char *src, size_t *nw);
static void spv_assemble(const char *text, uint32_t **w, size_t *nw);

static void t_raw_oob_private(void **state) {
  (void)state;
  raw_oob_check("glsl", raw_oob_glsl, strlen(raw_oob_glsl));
  size_t nw;
  uint32_t *w = to_spirv(raw_oob_glsl, &nw);
  raw_oob_check("spirv", w, nw * 4);
  free(w);
  /* The assembled module: s[7] = 0xdead lands in s[3], s[-9] = 0xbeef in
   * s[0]; a load through i reads s[clamp(i, 0, 3)], zero elsewhere (the
   * module writes nothing else; the device zeroes workgroup memory). */
  spv_assemble(raw_oob_asm, &w, &nw);
  static const int32_t idx[] = {0, 3, 7, -9, 1, 100000, INT32_MIN};
  for (size_t j = 0; j < sizeof idx / sizeof idx[0]; j++) {
    int32_t i = idx[j];
    uint32_t c = i < 0 ? 0 : i > 3 ? 3 : (uint32_t)i, o = 1;
    uint32_t want = c == 3 ? 0xdead : c == 0 ? 0xbeef : 0;
    struct dspk__tensor t = words(1);
    struct dspk__karg a = {.kind = DSPK__KARG_I32, .v.i32 = i};
    char msg[512];
    int r = raw_over_lang("spirv", w, nw * 4, &t, 1, &a, 1, msg, sizeof msg);
    if (r)
      fail_msg("assembled, index %d: %d %s", (int)i, r, msg);
    assert_int_equal(VKB->read(D, t.mem, 0, &o, sizeof o), 0);
    VKB->free(D, t.mem);
    if (o != want)
      fail_msg("assembled, index %d: read %#x, want %#x", (int)i, o, want);
  }
  free(w);
}

/* How far robustBufferAccess2 bounds a raw kernel's index into a tensor
 * (probe 22 F2 1): the device checks the byte offset (member offset +
 * index x stride) it computes, and lavapipe computes it modulo 2^32 (a
 * 64-bit index cut to 32 bits), so d[2^30] of 4-byte elements is d[0].
 * protocol.md, "kernel", says what holds on every such device: an offset
 * in [binding size, 2^32) reads zero and drops its store; a negative one
 * or one of 2^32 or more either does so or, taken modulo 2^32, reaches
 * that element of the same binding; never anything outside the binding.
 * The tensor is 16 words in the middle of a 64-word block whose other
 * words are sentinels; each kernel loads and stores through one index.
 * On lavapipe the wrap is required (that is what the doc says it does). */
static void raw_wrap_check(const char *what, const char *lang, const void *src, size_t len,
                           bool wide, const int64_t *idx, size_t nidx) {
  bool lvp = strstr(D->name, "llvmpipe") != NULL;
  for (size_t j = 0; j < nidx; j++) {
    int64_t i = idx[j];
    uint32_t pat[64], back[64], o = 1;
    for (int k = 0; k < 64; k++)
      pat[k] = 0x5EC20000u + (uint32_t)k;
    struct dspk__tensor t[2] = {{.dtype = DSPK_F32, .rank = 1, .shape = {16}, .offset = 64},
                                words(1)};
    assert_int_equal(VKB->alloc(D, sizeof pat, &t[0].mem), 0);
    assert_int_equal(VKB->write(D, t[0].mem, 0, pat, sizeof pat), 0);
    struct dspk__karg a = wide ? (struct dspk__karg){.kind = DSPK__KARG_I64, .v.i64 = i}
                               : (struct dspk__karg){.kind = DSPK__KARG_I32, .v.i32 = (int32_t)i};
    char msg[512];
    int r = raw_over_lang(lang, src, len, t, 2, &a, 1, msg, sizeof msg);
    if (r)
      fail_msg("%s, index %lld: %d %s", what, (long long)i, r, msg);
    assert_int_equal(VKB->read(D, t[0].mem, 0, back, sizeof back), 0);
    assert_int_equal(VKB->read(D, t[1].mem, 0, &o, sizeof o), 0);
    VKB->free(D, t[0].mem);
    VKB->free(D, t[1].mem);
    /* The exact byte offset (in 128 bits' worth: |i| < 2^63, x4) and the
     * wrapped one. */
    bool exact_in = i >= 0 && i < ((int64_t)1 << 30);
    uint32_t w = (uint32_t)((uint64_t)i * 4u);
    int at = -1;
    for (int k = 0; k < 64; k++)
      if (back[k] != pat[k]) {
        if (k < 16 || k >= 32 || back[k] != 0xdeadu || at >= 0)
          fail_msg("%s, index %lld: word %d of the block became %#x: a store landed outside "
                   "its tensor or twice", what, (long long)i, k, back[k]);
        at = k - 16;
      }
    if (exact_in && i < 16 && at != (int)i)
      fail_msg("%s, index %lld: the in-range store landed at %d", what, (long long)i, at);
    if (exact_in && i >= 16 && (at >= 0 || o != 0))
      fail_msg("%s, index %lld (byte offset below 2^32, past the tensor): the store landed at "
               "%d, the load read %#x: not dropped / zero", what, (long long)i, at, o);
    if (!exact_in) {
      bool wraps = w < 64;
      if (at >= 0 && (!wraps || at != (int)(w / 4)))
        fail_msg("%s, index %lld: the store landed at %d, not at the wrapped offset %#x",
                 what, (long long)i, at, w);
      if (at < 0 && o != 0)
        fail_msg("%s, index %lld: the store was dropped but the load read %#x", what,
                 (long long)i, o);
      if (at >= 0 && o != pat[16 + at])
        fail_msg("%s, index %lld: the load read %#x, want the wrapped element %#x", what,
                 (long long)i, o, pat[16 + at]);
      if (lvp && wraps != (at >= 0))
        fail_msg("%s, index %lld: lavapipe %s the wrapped offset %#x, which protocol.md "
                 "says it %s", what, (long long)i, at >= 0 ? "reached" : "did not reach", w,
                 wraps ? "reaches" : "drops");
    }
  }
}

static const char raw_wrap_asm[] =
    "OpCapability Shader\n"
    "OpCapability Int64\n"
    "OpMemoryModel Logical GLSL450\n"
    "OpEntryPoint GLCompute %main \"main\"\n"
    "OpExecutionMode %main LocalSize 1 1 1\n"
    "OpDecorate %rt ArrayStride 4\n"
    "OpMemberDecorate %blk 0 Offset 0\n"
    "OpDecorate %blk Block\n"
    "OpDecorate %ab DescriptorSet 0\n"
    "OpDecorate %ab Binding 0\n"
    "OpDecorate %ob DescriptorSet 0\n"
    "OpDecorate %ob Binding 1\n"
    "OpMemberDecorate %pcb 0 Offset 0\n"
    "OpDecorate %pcb Block\n"
    "%void = OpTypeVoid\n"
    "%fn = OpTypeFunction %void\n"
    "%u32 = OpTypeInt 32 0\n"
    "%i32 = OpTypeInt 32 1\n"
    "%i64 = OpTypeInt 64 1\n"
    "%c0 = OpConstant %i32 0\n"
    "%dead = OpConstant %u32 57005\n"
    "%rt = OpTypeRuntimeArray %u32\n"
    "%blk = OpTypeStruct %rt\n"
    "%pblk = OpTypePointer StorageBuffer %blk\n"
    "%psu = OpTypePointer StorageBuffer %u32\n"
    "%pcb = OpTypeStruct %i64\n"
    "%ppcb = OpTypePointer PushConstant %pcb\n"
    "%ppci = OpTypePointer PushConstant %i64\n"
    "%ab = OpVariable %pblk StorageBuffer\n"
    "%ob = OpVariable %pblk StorageBuffer\n"
    "%pc = OpVariable %ppcb PushConstant\n"
    "%main = OpFunction %void None %fn\n"
    "%l = OpLabel\n"
    "%pi = OpAccessChain %ppci %pc %c0\n"
    "%i = OpLoad %i64 %pi\n"
    "%ai = OpAccessChain %psu %ab %c0 %i\n"
    "%v = OpLoad %u32 %ai\n"
    "%o0 = OpAccessChain %psu %ob %c0 %c0\n"
    "OpStore %o0 %v\n"
    "OpStore %ai %dead\n"
    "OpReturn\n"
    "OpFunctionEnd\n";

static void t_raw_wrap(void **state) {
  (void)state;
  skip_unless_robust_raw();
  static const char rt[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint d[]; };\n"
      "layout(std430, binding = 1) buffer O { uint o[]; };\n"
      "layout(push_constant) uniform P { int i; } p;\n"
      "void main() { o[0] = d[p.i]; d[p.i] = 0xdeadu; }\n";
  /* A fixed array before the runtime array: h[k] is word k of the binding. */
  static const char fixed[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint h[4]; uint d[]; };\n"
      "layout(std430, binding = 1) buffer O { uint o[]; };\n"
      "layout(push_constant) uniform P { int i; } p;\n"
      "void main() { o[0] = h[p.i]; h[p.i] = 0xdeadu; }\n";
  static const int64_t i32[] = {3, 15, 16, 100, (1 << 30) - 1, 1 << 29, -1, -16,
                                1 << 30, (1 << 30) + 2, -(1 << 30) + 5, -(1 << 30) - 1,
                                INT32_MAX, INT32_MIN, INT32_MIN + 7};
  raw_wrap_check("glsl d[i]", "glsl", rt, strlen(rt), false, i32, sizeof i32 / sizeof i32[0]);
  raw_wrap_check("glsl h[4] before d[]", "glsl", fixed, strlen(fixed), false, i32,
                 sizeof i32 / sizeof i32[0]);
  static const int64_t i64[] = {2, 16, (1 << 30) - 1, (int64_t)1 << 30, ((int64_t)1 << 32) + 3,
                                ((int64_t)1 << 34) + 5, -((int64_t)1 << 62) + 2,
                                ((int64_t)1 << 32) - 1, -((int64_t)1 << 32) + 20, INT64_MAX,
                                INT64_MIN + 9, -1};
  uint32_t *w;
  size_t nw;
  spv_assemble(raw_wrap_asm, &w, &nw);
  raw_wrap_check("spirv, 64-bit index", "spirv", w, nw * 4, true, i64,
                 sizeof i64 / sizeof i64[0]);
  free(w);
}

/* A raw kernel's tensor at a multiple of its item size but not of the
 * device's minStorageBufferOffsetAlignment (a slice of a client's shared
 * array, which protocol.md allows) was ENOTSUP "its offset must be a
 * multiple of 16 bytes", while the built-in ops took it.  Now it runs as if
 * in place (staged through an aligned block of the op's and copied back):
 * the kernel sees exactly its elements from index 0 (.length() as for an
 * aligned tensor, the padding of an odd f16 count reading zero, never the
 * block's next bytes), and its stores land in the tensor and nowhere else
 * of its block (a store to the padding neither). */
static void t_raw_misaligned(void **state) {
  (void)state;
  if (D->align <= 4) {
    print_message("%s binds storage buffers at any multiple of 4 bytes: no tensor of "
                  "a 4-byte item is misaligned there\n", D->name);
    skip();
  }
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer A { uint a[]; };\n"
      "layout(std430, binding = 1) buffer E { uint e[]; };\n"
      "layout(std430, binding = 2) buffer O { uint o[]; };\n"
      "void main() { o[0] = a.length(); o[1] = a[0]; o[2] = e.length();\n"
      "  o[3] = e[0]; o[4] = e[1];\n"
      "  for (uint k = 0u; k < a.length(); k++) a[k] = a[k] * 2u + 1u;\n"
      "  for (uint k = 0u; k < e.length(); k++) e[k] += 0x10001u; }\n";
  uint32_t pat[64], back[64], o[5];
  uint16_t hpat[64], hback[64];
  for (int i = 0; i < 64; i++) {
    pat[i] = 0x5EC20000u + (uint32_t)i;
    hpat[i] = (uint16_t)(0x1000 + i);
  }
  /* 8 f32 at byte 4 of a block of 64 words; 3 f16 at byte 2 of one of 64
   * halves (bound as 2 words: the second's upper half is padding); the
   * output. */
  struct dspk__tensor t[3] = {{.dtype = DSPK_F32, .rank = 1, .shape = {8}, .offset = 4},
                              {.dtype = DSPK_F16, .rank = 1, .shape = {3}, .offset = 2},
                              words(8)};
  assert_int_equal(VKB->alloc(D, sizeof pat, &t[0].mem), 0);
  assert_int_equal(VKB->write(D, t[0].mem, 0, pat, sizeof pat), 0);
  assert_int_equal(VKB->alloc(D, sizeof hpat, &t[1].mem), 0);
  assert_int_equal(VKB->write(D, t[1].mem, 0, hpat, sizeof hpat), 0);
  char msg[512];
  for (int round = 0; round < 2; round++) { /* the second on the first's results */
    int r = raw_over(src, t, 3, msg, sizeof msg);
    if (r)
      fail_msg("raw kernel over misaligned tensors: %d %s", r, msg);
    assert_int_equal(VKB->read(D, t[2].mem, 0, o, sizeof o), 0);
    assert_int_equal(VKB->read(D, t[0].mem, 0, back, sizeof back), 0);
    assert_int_equal(VKB->read(D, t[1].mem, 0, hback, sizeof hback), 0);
    assert_int_equal(o[0], 8);
    assert_int_equal(o[1], round ? pat[1] * 2u + 1u : pat[1]);
    assert_int_equal(o[2], 2);
    uint32_t h1 = (uint32_t)hpat[1] + (uint32_t)round, h2 = (uint32_t)hpat[2] + (uint32_t)round,
             h3 = (uint32_t)hpat[3] + (uint32_t)round;
    assert_int_equal(o[3], h1 | h2 << 16);
    if (o[4] != h3) /* its upper half: the padding, zero every time */
      fail_msg("round %d: the f16 tensor's last word reads %#x, not %#x (its padding is "
               "not zero)", round, o[4], h3);
    for (int i = 0; i < 64; i++) {
      uint32_t want = pat[i];
      for (int k = 0; k <= round; k++)
        if (i >= 1 && i <= 8)
          want = want * 2u + 1u;
      if (back[i] != want)
        fail_msg("round %d: word %d of the f32 block is %#x, not %#x", round, i, back[i],
                 want);
      uint16_t hw = (uint16_t)(hpat[i] + (i >= 1 && i <= 3 ? round + 1 : 0));
      if (hback[i] != hw)
        fail_msg("round %d: half %d of the f16 block is %#x, not %#x", round, i, hback[i],
                 hw);
    }
  }
  for (int i = 0; i < 3; i++)
    VKB->free(D, t[i].mem);
}

/* A raw kernel declaring a capability the device has not enabled is
 * ENOTSUP before any pipeline is made, naming it: Vulkan leaves such a
 * module undefined, and with PhysicalStorageBufferAddresses a kernel could
 * turn any number into a pointer to the device's memory. */
static void t_raw_caps(void **state) {
  (void)state;
  static const char bda[] =
      "#version 450\n"
      "#extension GL_EXT_buffer_reference : require\n"
      "#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require\n"
      "layout(local_size_x = 1) in;\n"
      "layout(buffer_reference, std430) buffer P { uint v; };\n"
      "layout(std430, binding = 0) buffer O { uint64_t o[]; };\n"
      "void main() { P q = P(o[0]); o[1] = q.v; }\n";
  char msg[512];
  struct dspk__tensor t = words(4);
  t.dtype = DSPK_F64;
  t.shape[0] = 2;
  int r = raw_over(bda, &t, 1, msg, sizeof msg);
  if (r != DSPK_ENOTSUP || !strstr(msg, "PhysicalStorageBufferAddresses"))
    fail_msg("a kernel with buffer references: %d \"%s\", expected ENOTSUP naming "
             "PhysicalStorageBufferAddresses", r, msg);
  VKB->free(D, t.mem);
  /* The capabilities of a plain kernel (Shader) pass. */
  uint32_t ok[] = {1}, w[] = {0x07230203, 0x10300, 0, 8, 0, 2u << 16 | 17, 1};
  assert_int_equal(dspk__vk_spv_caps(w, 7, ok, 1, msg, sizeof msg), 0);
  w[6] = 22; /* Int16, not in ok */
  assert_int_equal(dspk__vk_spv_caps(w, 7, ok, 1, msg, sizeof msg), DSPK_ENOTSUP);
  assert_non_null(strstr(msg, "capability Int16 (22)"));
  assert_non_null(strstr(msg, "it enables Shader"));
  /* Every capability is named, from SPIR-V's grammar (probe 23 F3: these
   * were numbers alone), the first name of one that has several, in the
   * list of those enabled too; a number SPIR-V does not define stays a
   * number. */
  static const struct {
    uint32_t c;
    const char *name;
  } named[] = {{4464, "DenormPreserve (4464)"}, {56, "StorageImageWriteWithoutFormat (56)"},
               {50, "ImageQuery (50)"}, {46, "SampledBuffer (46)"},
               {5301, "ShaderNonUniform (5301)"}, {5302, "RuntimeDescriptorArray (5302)"},
               {6033, "AtomicFloat32AddEXT (6033)"}, {4433, "StorageBuffer16BitAccess (4433)"},
               {99999, "capability 99999,"}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
    w[6] = named[i].c;
    assert_int_equal(dspk__vk_spv_caps(w, 7, ok, 1, msg, sizeof msg), DSPK_ENOTSUP);
    if (!strstr(msg, named[i].name))
      fail_msg("capability %u: \"%s\", expected \"%s\"", named[i].c, msg, named[i].name);
  }
  uint32_t ok2[] = {1, 6033};
  w[6] = 22;
  assert_int_equal(dspk__vk_spv_caps(w, 7, ok2, 2, msg, sizeof msg), DSPK_ENOTSUP);
  assert_non_null(strstr(msg, "it enables Shader, AtomicFloat32AddEXT)"));
  /* GLSL's atomicAdd on a float (GL_EXT_shader_atomic_float), which no
   * device enables for kernels: ENOTSUP naming its capability. */
  static const char fadd[] =
      "#version 450\n"
      "#extension GL_EXT_shader_atomic_float : require\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer O { float o[]; };\n"
      "void main() { atomicAdd(o[0], 1.0); }\n";
  struct dspk__tensor f = words(4);
  int r2 = raw_over(fadd, &f, 1, msg, sizeof msg);
  VKB->free(D, f.mem);
  if (r2 != DSPK_ENOTSUP || !strstr(msg, "capability AtomicFloat32AddEXT (6033)"))
    fail_msg("a float atomicAdd: %d \"%s\", expected ENOTSUP naming AtomicFloat32AddEXT", r2,
             msg);
}

/* GLSL compute source to SPIR-V 1.3 with glslang, independently of the
 * backend's compile path; *nw words, malloc'd. */
static uint32_t *to_spirv(const char *src, size_t *nw) {
  glslang_initialize_process();
  glslang_input_t in = {.language = GLSLANG_SOURCE_GLSL,
                        .stage = GLSLANG_STAGE_COMPUTE,
                        .client = GLSLANG_CLIENT_VULKAN,
                        .client_version = GLSLANG_TARGET_VULKAN_1_1,
                        .target_language = GLSLANG_TARGET_SPV,
                        .target_language_version = GLSLANG_TARGET_SPV_1_3,
                        .code = src,
                        .default_version = 450,
                        .default_profile = GLSLANG_NO_PROFILE,
                        .messages = GLSLANG_MSG_DEFAULT_BIT,
                        .resource = glslang_default_resource()};
  glslang_shader_t *sh = glslang_shader_create(&in);
  assert_true(glslang_shader_preprocess(sh, &in));
  assert_true(glslang_shader_parse(sh, &in));
  glslang_program_t *p = glslang_program_create();
  glslang_program_add_shader(p, sh);
  assert_true(glslang_program_link(p, GLSLANG_MSG_SPV_RULES_BIT | GLSLANG_MSG_VULKAN_RULES_BIT));
  glslang_program_SPIRV_generate(p, GLSLANG_STAGE_COMPUTE);
  *nw = glslang_program_SPIRV_get_size(p);
  uint32_t *w = malloc(*nw * 4 + 64);
  glslang_program_SPIRV_get(p, w);
  glslang_program_delete(p);
  glslang_shader_delete(sh);
  glslang_finalize_process();
  return w;
}

/* Inserts the instruction ins (its words) at word `at` of module w (nw
 * words, room for it). */
static void spv_insert(uint32_t *w, size_t *nw, size_t at, const uint32_t *ins) {
  size_t l = ins[0] >> 16;
  memmove(w + at + l, w + at, (*nw - at) * 4);
  memcpy(w + at, ins, l * 4);
  *nw += l;
}

/* The zero-initialising rewrite of client SPIR-V (vk_spvzero.c): every
 * Workgroup, Private and Function variable gets an OpConstantNull
 * initializer, OpUndefs (a global and a local one, added here) become
 * OpConstantNull, the module stays valid (spirv-val, where found at build
 * time); a device without zeroed workgroup memory refuses a module with a
 * shared array and takes one without; a malformed module is EINVAL. */
static void t_spv_zero_init(void **state) {
  (void)state;
  static const char src[] =
      "#version 450\n"
      "layout(local_size_x = 64) in;\n"
      "layout(std430, binding = 0) buffer B { uint d[]; };\n"
      "shared uint sh[64];\n"
      "shared vec4 sv;\n"
      "uint g;\n"
      "void main() { uint i = gl_LocalInvocationID.x; uint v[4]; mat2 m;\n"
      "  d[i] = sh[i] + v[i % 4u] + g + uint(m[0][0] + sv.x); }\n";
  static const char plain[] =
      "#version 450\n"
      "layout(local_size_x = 1) in;\n"
      "layout(std430, binding = 0) buffer B { uint d[]; };\n"
      "void main() { uint v[4]; d[0] = v[d[1] % 4u]; }\n";
  size_t nw, nz;
  uint32_t *w = to_spirv(src, &nw), *z = NULL;
  char msg[256];
  /* Two OpUndefs of the 32-bit uint type: one global, before the first
   * function, one local, after the first block's variables. */
  uint32_t tuint = 0, bound = w[3];
  size_t first_fn = 0;
  for (size_t i = 5; i < nw; i += w[i] >> 16) {
    if ((w[i] & 0xffff) == 21 && w[i + 2] == 32 && w[i + 3] == 0)
      tuint = w[i + 1];
    if ((w[i] & 0xffff) == 54 && !first_fn)
      first_fn = i;
  }
  assert_true(tuint && first_fn);
  size_t at = first_fn;
  while ((w[at] & 0xffff) != 248) /* OpLabel */
    at += w[at] >> 16;
  for (at += 2; (w[at] & 0xffff) == 59;)
    at += w[at] >> 16;
  uint32_t local[3] = {(3u << 16) | 1, tuint, bound + 1};
  spv_insert(w, &nw, at, local);
  /* use it: OpIAdd %uint %new %undef %undef */
  uint32_t add[5] = {(5u << 16) | 128, tuint, bound + 2, bound + 1, bound};
  spv_insert(w, &nw, at + 3, add);
  uint32_t global[3] = {(3u << 16) | 1, tuint, bound};
  spv_insert(w, &nw, first_fn, global);
  w[3] = bound + 3;

  int zr = dspk__vk_spv_zero_init(w, nw, 1, &z, &nz, msg, sizeof msg);
  if (zr) fail_msg("%d %s", zr, msg);
  int vars = 0, inits = 0, undefs = 0, nulls = 0;
  for (size_t i = 5; i < nz; i += z[i] >> 16) {
    uint32_t op = z[i] & 0xffff, l = z[i] >> 16;
    if (op == 59 && (z[i + 3] == 4 || z[i + 3] == 6 || z[i + 3] == 7)) {
      vars++;
      inits += l == 5;
    }
    undefs += op == 1;
    nulls += op == 46 && (z[i + 2] == bound || z[i + 2] == bound + 1);
  }
  print_message("spv zero init: %d variables, %d initialised, %zu -> %zu words\n", vars,
                inits, nw, nz);
  assert_true(vars >= 6); /* sh, sv, g, i, v, m at least */
  assert_int_equal(inits, vars);
  assert_int_equal(undefs, 0);
  assert_int_equal(nulls, 2);
#ifdef DSPK_SPIRV_VAL
  if (access(DSPK_SPIRV_VAL, X_OK) == 0) {
    char path[] = "/tmp/dspk-spvzero-XXXXXX", cmd[512];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, z, nz * 4), (ssize_t)(nz * 4));
    close(fd);
    snprintf(cmd, sizeof cmd, "%s --target-env vulkan1.3 %s", DSPK_SPIRV_VAL, path);
    int r = system(cmd);
    unlink(path);
    if (r != 0)
      fail_msg("spirv-val rejects the zero-initialised module (exit %d)", r);
  }
#endif
  free(z);
  z = NULL;
  /* No zeroed workgroup memory: refused, with the reason. */
  assert_int_equal(dspk__vk_spv_zero_init(w, nw, 0, &z, &nz, msg, sizeof msg), DSPK_ENOTSUP);
  assert_non_null(strstr(msg, "shaderZeroInitializeWorkgroupMemory"));
  assert_null(z);
  /* An instruction running past the module's end. */
  w[first_fn] = (w[first_fn] & 0xffff) | (0xffffu << 16);
  assert_int_equal(dspk__vk_spv_zero_init(w, nw, 1, &z, &nz, msg, sizeof msg), DSPK_EINVAL);
  assert_null(z);
  free(w);
  /* Without shared memory, a device that cannot zero it takes the kernel. */
  w = to_spirv(plain, &nw);
  assert_int_equal(dspk__vk_spv_zero_init(w, nw, 0, &z, &nz, msg, sizeof msg), 0);
  assert_true(nz > nw);
  free(z);
  free(w);
}

static void t_raw_spirv(void **state) {
  (void)state;
  size_t nw;
  uint32_t *w = to_spirv(raw_glsl, &nw);
  raw_run("spirv", w, nw * 4);
  /* SPIR-V 1.3: the entry point's interface does not list the buffers, the
   * functions' instructions tell which are used. */
  raw_bindings("spirv", w, nw * 4);
  /* Not SPIR-V: a clear error. */
  char msg[256];
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 0};
  op.u.kernel.lang = "spirv";
  op.u.kernel.source = "garbage!";
  op.u.kernel.source_len = 8;
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  assert_int_equal(VKB->run(D, &op, &ctx), DSPK_EINVAL);
  assert_non_null(strstr(msg, "SPIR-V"));
  free(w);
}

/* raw_glsl as SPIR-V 1.3 whose buffers' DescriptorSet and Binding, the
 * push-constant block's second Offset and the Block decorations are given
 * through decoration groups (OpDecorationGroup, OpGroupDecorate,
 * OpGroupMemberDecorate): valid SPIR-V (spirv-val), which the resource
 * check once read as buffers without a binding.  "Offset 4" is the group's
 * Offset, replaced to make a block of 12 bytes. */
static const char raw_groups_asm[] =
    "OpCapability Shader\n"
    "%1 = OpExtInstImport \"GLSL.std.450\"\n"
    "OpMemoryModel Logical GLSL450\n"
    "OpEntryPoint GLCompute %4 \"main\" %11\n"
    "OpExecutionMode %4 LocalSize 64 1 1\n"
    "OpDecorate %11 BuiltIn GlobalInvocationId\n"
    "OpMemberDecorate %18 0 Offset 0\n"
    "OpDecorate %60 DescriptorSet 0\n"
    "OpDecorate %61 Binding 1\n"
    "OpDecorate %62 Binding 0\n"
    "OpDecorate %63 Offset 4\n"
    "OpDecorate %64 Block\n"
    "%60 = OpDecorationGroup\n"
    "%61 = OpDecorationGroup\n"
    "%62 = OpDecorationGroup\n"
    "%63 = OpDecorationGroup\n"
    "%64 = OpDecorationGroup\n"
    "OpGroupDecorate %60 %33 %42\n"
    "OpGroupDecorate %61 %33\n"
    "OpGroupDecorate %62 %42\n"
    "OpGroupMemberDecorate %63 %18 1\n"
    "OpGroupDecorate %64 %18 %31 %40\n"
    "OpDecorate %30 ArrayStride 4\n"
    "OpMemberDecorate %31 0 Offset 0\n"
    "OpDecorate %39 ArrayStride 4\n"
    "OpMemberDecorate %40 0 Offset 0\n"
    "OpDecorate %55 BuiltIn WorkgroupSize\n"
    "%2 = OpTypeVoid\n"
    "%3 = OpTypeFunction %2\n"
    "%6 = OpTypeInt 32 0\n"
    "%7 = OpTypePointer Function %6\n"
    "%9 = OpTypeVector %6 3\n"
    "%10 = OpTypePointer Input %9\n"
    "%11 = OpVariable %10 Input\n"
    "%12 = OpConstant %6 0\n"
    "%13 = OpTypePointer Input %6\n"
    "%17 = OpTypeFloat 32\n"
    "%18 = OpTypeStruct %6 %17\n"
    "%19 = OpTypePointer PushConstant %18\n"
    "%20 = OpVariable %19 PushConstant\n"
    "%21 = OpTypeInt 32 1\n"
    "%22 = OpConstant %21 0\n"
    "%23 = OpTypePointer PushConstant %6\n"
    "%26 = OpTypeBool\n"
    "%30 = OpTypeRuntimeArray %17\n"
    "%31 = OpTypeStruct %30\n"
    "%32 = OpTypePointer StorageBuffer %31\n"
    "%33 = OpVariable %32 StorageBuffer\n"
    "%35 = OpConstant %21 1\n"
    "%36 = OpTypePointer PushConstant %17\n"
    "%39 = OpTypeRuntimeArray %17\n"
    "%40 = OpTypeStruct %39\n"
    "%41 = OpTypePointer StorageBuffer %40\n"
    "%42 = OpVariable %41 StorageBuffer\n"
    "%44 = OpTypePointer StorageBuffer %17\n"
    "%53 = OpConstant %6 64\n"
    "%54 = OpConstant %6 1\n"
    "%55 = OpConstantComposite %9 %53 %54 %54\n"
    "%4 = OpFunction %2 None %3\n"
    "%5 = OpLabel\n"
    "%8 = OpVariable %7 Function\n"
    "%14 = OpAccessChain %13 %11 %12\n"
    "%15 = OpLoad %6 %14\n"
    "OpStore %8 %15\n"
    "%16 = OpLoad %6 %8\n"
    "%24 = OpAccessChain %23 %20 %22\n"
    "%25 = OpLoad %6 %24\n"
    "%27 = OpULessThan %26 %16 %25\n"
    "OpSelectionMerge %29 None\n"
    "OpBranchConditional %27 %28 %29\n"
    "%28 = OpLabel\n"
    "%34 = OpLoad %6 %8\n"
    "%37 = OpAccessChain %36 %20 %35\n"
    "%38 = OpLoad %17 %37\n"
    "%43 = OpLoad %6 %8\n"
    "%45 = OpAccessChain %44 %42 %22 %43\n"
    "%46 = OpLoad %17 %45\n"
    "%47 = OpFMul %17 %38 %46\n"
    "%48 = OpLoad %6 %8\n"
    "%49 = OpAccessChain %44 %33 %22 %48\n"
    "%50 = OpLoad %17 %49\n"
    "%51 = OpFAdd %17 %47 %50\n"
    "%52 = OpAccessChain %44 %33 %22 %34\n"
    "OpStore %52 %51\n"
    "OpBranch %29\n"
    "%29 = OpLabel\n"
    "OpReturn\n"
    "OpFunctionEnd\n";

/* Assembles text (SPIR-V 1.3, Vulkan 1.1) into *w, *nw words: the tests
 * make their modules independently of the backend. */
static void spv_assemble(const char *text, uint32_t **w, size_t *nw) {
  spv_context c = spvContextCreate(SPV_ENV_VULKAN_1_1);
  spv_binary bin = NULL;
  spv_diagnostic diag = NULL;
  assert_non_null(c);
  if (spvTextToBinary(c, text, strlen(text), &bin, &diag) != SPV_SUCCESS)
    fail_msg("spirv-as: %s", diag && diag->error ? diag->error : "failed");
  *nw = bin->wordCount;
  *w = malloc(bin->wordCount * 4);
  assert_non_null(*w);
  memcpy(*w, bin->code, bin->wordCount * 4);
  spvBinaryDestroy(bin);
  spvDiagnosticDestroy(diag);
  spvContextDestroy(c);
}

/* Runs the raw SPIR-V kernel w with one 4-element f32 tensor argument and
 * entry point entry: returns the result, *msg the message. */
static int raw_spirv_try(const void *w, size_t nbytes, const char *entry, char *msg,
                         size_t msglen) {
  int64_t n = 4;
  struct htensor X = h_make(DSPK_F32, 1, &n, 1);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 1};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  op.u.kernel.lang = "spirv";
  op.u.kernel.source = w;
  op.u.kernel.source_len = nbytes;
  snprintf(op.u.kernel.entry, sizeof op.u.kernel.entry, "%s", entry);
  op.u.kernel.grid[0] = 1;
  op.u.kernel.nargs = 1;
  op.u.kernel.args[0] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  assert_int_equal(dspk__op_infer(&op, msg, msglen), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = msglen};
  msg[0] = 0;
  int r = VKB->run(D, &op, &ctx);
  VKB->free(D, op.in[0].mem);
  h_free(&X);
  return r;
}

static int glsl_try(const char *src, char *msg, size_t msglen, float *x0);

/* A raw SPIR-V kernel is valid SPIR-V before a driver sees it (Vulkan
 * leaves an invalid module undefined): a module that decorates an id
 * nothing defines (92 bytes: lavapipe died of it in
 * vkCreateComputePipelines) and one whose id bound is 2^32-1 are ECOMPILE
 * quoting the validator, the message on one line; one with no entry point
 * of the name is ECOMPILE saying so; decorations given through decoration groups are read; a
 * work-group size or shared memory beyond the device's limits is ELIMIT. */
static void t_raw_spirv_valid(void **state) {
  (void)state;
  char msg[1024];
  /* OpCapability Shader, OpMemoryModel Logical GLSL450, OpEntryPoint
   * GLCompute %1 "main", OpDecorate %7 Binding 2^32-1 (then %d for
   * DescriptorSet 0): %1 and %7 defined nowhere. */
  uint32_t bad[23] = {0x07230203, 0x00010300, 0,          16,         0,
                      0x00020011, 1,          0x0003000e, 0,          1,
                      0x0005000f, 5,          1,          0x6e69616d, 0,
                      0x00040047, 7,          33,         0xffffffff, 0x00040047,
                      7,          34,         0};
  assert_int_equal(sizeof bad, 92);
  int r = raw_spirv_try(bad, sizeof bad, "main", msg, sizeof msg);
  if (r != DSPK_ECOMPILE || !strstr(msg, "spirv: invalid SPIR-V module (spirv-val, vulkan1.") ||
      strchr(msg, '\n'))
    fail_msg("undefined ids: %d \"%s\", expected ECOMPILE from spirv-val on one line", r, msg);
  print_message("undefined ids: %s\n", msg);
  /* The same decorating id 2^32-2, with an id bound of 2^32-1: the bound is
   * refused before the validator sizes its tables by it. */
  bad[3] = 0xffffffff;
  bad[16] = bad[20] = 0xfffffffe;
  bad[18] = 0;
  r = raw_spirv_try(bad, sizeof bad, "main", msg, sizeof msg);
  if (r != DSPK_ELIMIT || !strstr(msg, "spirv: the module's id bound 4294967295 is above 65628"))
    fail_msg("id bound 2^32-1: %d \"%s\", expected ELIMIT", r, msg);
  /* A bound within 65536 + 4 per word reaches the validator. */
  bad[3] = 65628;
  bad[16] = bad[20] = 65627;
  r = raw_spirv_try(bad, sizeof bad, "main", msg, sizeof msg);
  if (r != DSPK_ECOMPILE || !strstr(msg, "spirv: invalid SPIR-V module"))
    fail_msg("id bound 65628: %d \"%s\", expected ECOMPILE", r, msg);

  uint32_t *w;
  size_t nw;
  spv_assemble(raw_groups_asm, &w, &nw);
  /* Bindings through groups: it runs, and the bindings it uses are checked. */
  raw_run("spirv", w, nw * 4);
  raw_bindings("spirv", w, nw * 4);
  r = raw_spirv_try(w, nw * 4, "nope", msg, sizeof msg);
  if (r != DSPK_ECOMPILE || !strstr(msg, "no GLCompute entry point \"nope\""))
    fail_msg("entry nope: %d \"%s\", expected ECOMPILE", r, msg);
  /* A module whose instructions run past its end is an invalid module,
   * ECOMPILE from the validator (probe 23 F5: the docs said EINVAL): its
   * last word cut off, or its last instruction's word count past the end
   * by 1 and by 0xfff0. */
  for (int k = 0; k < 3; k++) {
    size_t last = nw - 1; /* OpFunctionEnd: 1 word */
    uint32_t keep = w[last];
    if (k)
      w[last] = (k == 1 ? 2u : 0xfff1u) << 16 | (keep & 0xffffu);
    r = raw_spirv_try(w, (k ? nw : nw - 1) * 4, "main", msg, sizeof msg);
    w[last] = keep;
    if (r != DSPK_ECOMPILE || !strstr(msg, "spirv: invalid SPIR-V module (spirv-val, vulkan1."))
      fail_msg("instructions past the end (%d): %d \"%s\", expected ECOMPILE", k, r, msg);
  }
  free(w);
  /* The group's Offset read: the push-constant block ends at 12 bytes. */
  char *text = strdup(raw_groups_asm);
  assert_non_null(text);
  char *at = strstr(text, "Offset 4");
  assert_non_null(at);
  at[7] = '8';
  spv_assemble(text, &w, &nw);
  raw_refused("spirv", w, nw * 4, 2, 2, "push-constant block is 12 bytes, the scalars of "
                                        "args fill 8");
  free(w);
  free(text);

  /* A work-group size beyond the device's limits (its WorkgroupSize
   * constant, which wins over LocalSize): ELIMIT, no pipeline (lavapipe ran
   * 65536 invocations silently). */
  const VkPhysicalDeviceLimits *lim = &D->props.limits;
  char over[32], *big = malloc(sizeof raw_groups_asm + 64);
  assert_non_null(big);
  snprintf(over, sizeof over, "%u", lim->maxComputeWorkGroupInvocations + 1);
  at = strstr(raw_groups_asm, "%53 = OpConstant %6 64");
  assert_non_null(at);
  size_t pre = (size_t)(at - raw_groups_asm) + strlen("%53 = OpConstant %6 ");
  snprintf(big, sizeof raw_groups_asm + 64, "%.*s%s%s", (int)pre, raw_groups_asm, over,
           at + strlen("%53 = OpConstant %6 64"));
  spv_assemble(big, &w, &nw);
  char want[200];
  snprintf(want, sizeof want, "work-group size %sx1x1 exceeds the device's", over);
  r = raw_spirv_try(w, nw * 4, "main", msg, sizeof msg);
  if (r != DSPK_ELIMIT || !strstr(msg, want))
    fail_msg("work-group size %s: %d \"%s\", expected ELIMIT \"%s\"", over, r, msg, want);
  free(w);
  free(big);

  /* Shared memory: maxComputeSharedMemorySize bytes run, 4 more are ELIMIT. */
  for (int more = 0; more <= 1; more++) {
    char src[512];
    snprintf(src, sizeof src,
             "#version 450\nlayout(local_size_x = 1) in;\n"
             "layout(std430, binding = 0) buffer X { float x[]; };\n"
             "shared float s[%u];\n"
             "void main() { s[%u] = 2.0; barrier(); x[0] = s[%u]; }\n",
             lim->maxComputeSharedMemorySize / 4 + (unsigned)more,
             lim->maxComputeSharedMemorySize / 4 - 1, lim->maxComputeSharedMemorySize / 4 - 1);
    float x0 = 0;
    r = glsl_try(src, msg, sizeof msg, &x0);
    if (!more) {
      if (r)
        fail_msg("shared memory at the limit: %d %s", r, msg);
      assert_float_equal(x0, 2.0f, 0);
    } else {
      snprintf(want, sizeof want, "shared (Workgroup) variables take %u bytes, more than the "
               "device's maxComputeSharedMemorySize %u", lim->maxComputeSharedMemorySize + 4,
               lim->maxComputeSharedMemorySize);
      if (r != DSPK_ELIMIT || !strstr(msg, want))
        fail_msg("shared memory over the limit: %d \"%s\", expected ELIMIT", r, msg);
    }
  }
}

/* Runs raw GLSL src with one f32[4] argument of zeros, grid 1: returns
 * run's code, msg the message, *x0 (when not NULL) the tensor's first
 * element after it. */
static int glsl_try(const char *src, char *msg, size_t msglen, float *x0) {
  int64_t n = 4;
  struct htensor X = h_make(DSPK_F32, 1, &n, 1);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 1};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  op.u.kernel.grid[0] = 1;
  op.u.kernel.nargs = 1;
  op.u.kernel.args[0] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  assert_int_equal(dspk__op_infer(&op, msg, msglen), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = msglen};
  msg[0] = 0;
  int r = VKB->run(D, &op, &ctx);
  if (r == 0 && x0)
    assert_int_equal(VKB->read(D, op.in[0].mem, 0, x0, 4), 0);
  VKB->free(D, op.in[0].mem);
  h_free(&X);
  return r;
}

/* The module of t_spv_spec_limits: one shared float array of length len
 * (its definition in lendef, after %N, %W and the other constants), the
 * work-group size given by mode (an OpExecutionMode(Id) line) and by wg
 * (decorations and constants of a WorkgroupSize object, or nothing). */
static void spec_module(char *out, size_t outlen, const char *mode, const char *wgdec,
                        const char *consts, const char *lendef) {
  int n = snprintf(out, outlen,
                   "OpCapability Shader\n"
                   "OpMemoryModel Logical GLSL450\n"
                   "OpEntryPoint GLCompute %%main \"main\"\n"
                   "%s"
                   "OpDecorate %%N SpecId 1\n"
                   "OpDecorate %%W SpecId 2\n"
                   "%s"
                   "OpDecorate %%rt ArrayStride 4\n"
                   "OpMemberDecorate %%A 0 Offset 0\n"
                   "OpDecorate %%A Block\n"
                   "OpDecorate %%a DescriptorSet 0\n"
                   "OpDecorate %%a Binding 0\n"
                   "%%void = OpTypeVoid\n"
                   "%%fn = OpTypeFunction %%void\n"
                   "%%float = OpTypeFloat 32\n"
                   "%%uint = OpTypeInt 32 0\n"
                   "%%int = OpTypeInt 32 1\n"
                   "%%v3 = OpTypeVector %%uint 3\n"
                   "%%one = OpConstant %%uint 1\n"
                   "%%two = OpConstant %%int 2\n"
                   "%%zero = OpConstant %%int 0\n"
                   "%s"
                   "%s"
                   "%%arr = OpTypeArray %%float %%len\n"
                   "%%parr = OpTypePointer Workgroup %%arr\n"
                   "%%sh = OpVariable %%parr Workgroup\n"
                   "%%rt = OpTypeRuntimeArray %%float\n"
                   "%%A = OpTypeStruct %%rt\n"
                   "%%pA = OpTypePointer StorageBuffer %%A\n"
                   "%%a = OpVariable %%pA StorageBuffer\n"
                   "%%pf = OpTypePointer StorageBuffer %%float\n"
                   "%%pw = OpTypePointer Workgroup %%float\n"
                   "%%main = OpFunction %%void None %%fn\n"
                   "%%l = OpLabel\n"
                   "%%p = OpAccessChain %%pf %%a %%zero %%zero\n"
                   "%%x = OpLoad %%float %%p\n"
                   "%%q = OpAccessChain %%pw %%sh %%zero\n"
                   "OpStore %%q %%x\n"
                   "%%y = OpLoad %%float %%q\n"
                   "%%p1 = OpAccessChain %%pf %%a %%zero %%one\n"
                   "OpStore %%p1 %%y\n"
                   "OpReturn\n"
                   "OpFunctionEnd\n",
                   mode, wgdec, consts, lendef);
  assert_true(n > 0 && (size_t)n < outlen);
}

/* Runs spec_module(...) as a raw SPIR-V kernel: its result, *msg. */
static int spec_try(const char *mode, const char *wgdec, const char *consts,
                    const char *lendef, char *msg, size_t msglen) {
  char text[4096];
  uint32_t *w;
  size_t nw;
  spec_module(text, sizeof text, mode, wgdec, consts, lendef);
  spv_assemble(text, &w, &nw);
  int r = raw_spirv_try(w, nw * 4, "main", msg, msglen);
  free(w);
  return r;
}

/* The daemon passes no specialization, so a specialization constant is its
 * default for the driver, and so for the limit checks: a shared array
 * sized by OpSpecConstant (tester C's: lavapipe gave the daemon's process
 * GiBs for one), or by an OpSpecConstantOp of them, counts its evaluated
 * length; a work-group size of specialization constants (a WorkgroupSize
 * object, LocalSizeId) counts their evaluated values; a length or size
 * that cannot be evaluated (a division by zero here) is EINVAL, never
 * passed unchecked. */
static void t_spv_spec_limits(void **state) {
  (void)state;
  const VkPhysicalDeviceLimits *lim = &D->props.limits;
  const char *ls1 = "OpExecutionMode %main LocalSize 1 1 1\n";
  char msg[1024], consts[512], want[256];
  uint32_t words = lim->maxComputeSharedMemorySize / 4, inv = lim->maxComputeWorkGroupInvocations;
  /* The length: the specialization constant itself (the report's), N + 0,
   * and N * 2 (glslang's `shared float s[N * 2]`). */
  static const char *const lens[2] = {"%len = OpSpecConstantOp %int IAdd %N %zero\n",
                                      "%len = OpSpecConstantOp %int IMul %N %two\n"};
  for (int form = 0; form < 3; form++)
    for (int more = 0; more <= 1; more++) {
      uint32_t len = words + (uint32_t)more;
      if (form == 2)
        len &= ~1u; /* an even length, as N * 2 */
      if (form == 2 && more)
        len += 2;
      int r;
      if (form == 0) {
        /* The plain OpSpecConstant length. */
        snprintf(consts, sizeof consts,
                 "%%W = OpSpecConstant %%uint 1\n%%len = OpSpecConstant %%int %u\n"
                 "%%N = OpSpecConstant %%int 1\n", len);
        r = spec_try(ls1, "", consts, "", msg, sizeof msg);
      } else {
        snprintf(consts, sizeof consts,
                 "%%N = OpSpecConstant %%int %u\n%%W = OpSpecConstant %%uint 1\n",
                 form == 2 ? len / 2 : len);
        r = spec_try(ls1, "", consts, lens[form - 1], msg, sizeof msg);
      }
      snprintf(want, sizeof want, "shared (Workgroup) variables take %u bytes, more than the "
               "device's maxComputeSharedMemorySize %u", len * 4,
               lim->maxComputeSharedMemorySize);
      if (!more && r)
        fail_msg("form %d: shared memory of %u bytes, at the limit: %d %s", form, len * 4, r,
                 msg);
      if (more && (r != DSPK_ELIMIT || !strstr(msg, want)))
        fail_msg("form %d: shared memory over the limit: %d \"%s\", expected ELIMIT \"%s\"",
                 form, r, msg, want);
    }
  /* A shared array the shader never uses counts too (the zeroing gives it
   * an initializer: lavapipe then gave the daemon's process 2.3 GiB for an
   * unused `shared float s[1 << 22]`). */
  {
    char src[512];
    snprintf(src, sizeof src,
             "#version 450\nlayout(local_size_x = 1) in;\n"
             "layout(std430, binding = 0) buffer X { float x[]; };\n"
             "shared float unused[%u];\nvoid main() { x[0] = 2.0; }\n", words + 1);
    int r = glsl_try(src, msg, sizeof msg, NULL);
    snprintf(want, sizeof want, "shared (Workgroup) variables take %u bytes", (words + 1) * 4);
    if (r != DSPK_ELIMIT || !strstr(msg, want))
      fail_msg("an unused shared array over the limit: %d \"%s\", expected ELIMIT", r, msg);
  }
  /* Arrays nested deeper than the check reads (2^18 floats in 18 levels of
   * 2 counted 0 bytes): EINVAL. */
  {
    char src[512] = "#version 450\nlayout(local_size_x = 1) in;\n"
                    "layout(std430, binding = 0) buffer X { float x[]; };\nshared float s";
    for (int k = 0; k < 18; k++)
      strcat(src, "[2]");
    strcat(src, ";\nvoid main() { s[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][1] = "
                "3.0; x[0] = s[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][1]; }\n");
    int r = glsl_try(src, msg, sizeof msg, NULL);
    if (r != DSPK_EINVAL || !strstr(msg, "variable \"s\" (id ") ||
        !strstr(msg, "more than 16 deep") || strstr(msg, "length"))
      fail_msg("a shared array of 18 levels: %d \"%s\", expected EINVAL naming s and the "
               "nesting limit", r, msg);
  }
  /* The same of every length the constant 1, 17 deep (probe 22 F2 2: the
   * message blamed the lengths and named the variable by its id), in
   * SPIR-V whose OpName holds control characters: the nesting limit is the
   * reason, the name is echoed escaped; 16 deep runs. */
  for (int deep = 16; deep <= 17; deep++) {
    char text[4096];
    int n = snprintf(text, sizeof text,
                     "OpCapability Shader\nOpMemoryModel Logical GLSL450\n"
                     "OpEntryPoint GLCompute %%main \"main\"\n"
                     "OpExecutionMode %%main LocalSize 1 1 1\n"
                     "OpName %%s \"sh\x1b[31m\n\"\n"
                     "%%void = OpTypeVoid\n%%fn = OpTypeFunction %%void\n"
                     "%%f = OpTypeFloat 32\n%%u = OpTypeInt 32 0\n%%one = OpConstant %%u 1\n"
                     "%%t0 = OpTypeArray %%f %%one\n");
    for (int k = 1; k < deep; k++)
      n += snprintf(text + n, sizeof text - (size_t)n, "%%t%d = OpTypeArray %%t%d %%one\n", k,
                    k - 1);
    snprintf(text + n, sizeof text - (size_t)n,
             "%%p = OpTypePointer Workgroup %%t%d\n%%s = OpVariable %%p Workgroup\n"
             "%%main = OpFunction %%void None %%fn\n%%l = OpLabel\nOpReturn\nOpFunctionEnd\n",
             deep - 1);
    uint32_t *w;
    size_t nw;
    spv_assemble(text, &w, &nw);
    struct dspk__tensor t = {.dtype = DSPK_F32, .rank = 1, .shape = {1}};
    assert_int_equal(VKB->alloc(D, 4, &t.mem), 0);
    int r = raw_over_lang("spirv", w, nw * 4, &t, 1, NULL, 0, msg, sizeof msg);
    VKB->free(D, t.mem);
    free(w);
    if (deep == 16 && r)
      fail_msg("a shared float[1] nested 16 deep: %d \"%s\", expected it to run", r, msg);
    if (deep == 17 &&
        (r != DSPK_EINVAL || !strstr(msg, "more than 16 deep") || strstr(msg, "length") ||
         !strstr(msg, "variable \"sh\\x1b[31m\\n\" (id ") || strchr(msg, 0x1b)))
      fail_msg("a shared float[1] nested 17 deep: %d \"%s\", expected EINVAL naming the "
               "nesting limit and the variable, escaped", r, msg);
  }
  /* A length that cannot be evaluated (N / 0) or below 1 (N - 8): EINVAL. */
  snprintf(consts, sizeof consts, "%%N = OpSpecConstant %%int 8\n%%W = OpSpecConstant %%uint 1\n");
  static const char *const badlens[2] = {"%len = OpSpecConstantOp %int SDiv %N %zero\n",
                                         "%len = OpSpecConstantOp %int ISub %zero %N\n"};
  for (int k = 0; k < 2; k++) {
    int r = spec_try(ls1, "", consts, badlens[k], msg, sizeof msg);
    if (r != DSPK_EINVAL || !strstr(msg, "shared (Workgroup) variable") ||
        !strstr(msg, "cannot be told"))
      fail_msg("length %s: %d \"%s\", expected EINVAL", badlens[k], r, msg);
  }

  /* The work-group size: a WorkgroupSize object of W + 1 (glslang's
   * `local_size_x_id`), at the limit runs, beyond it is ELIMIT. */
  const char *wgdec = "OpDecorate %wg BuiltIn WorkgroupSize\n";
  for (int more = 0; more <= 1; more++) {
    snprintf(consts, sizeof consts,
             "%%N = OpSpecConstant %%int 1\n%%W = OpSpecConstant %%uint %u\n"
             "%%wx = OpSpecConstantOp %%uint IAdd %%W %%one\n"
             "%%wg = OpSpecConstantComposite %%v3 %%wx %%one %%one\n"
             "%%len = OpSpecConstantOp %%int IAdd %%N %%zero\n",
             inv - 1 + (uint32_t)more);
    int r = spec_try(ls1, wgdec, consts, "", msg, sizeof msg);
    snprintf(want, sizeof want, "work-group size %ux1x1 exceeds the device's", inv + 1);
    if (!more && r)
      fail_msg("WorkgroupSize %u: %d %s", inv, r, msg);
    if (more && (r != DSPK_ELIMIT || !strstr(msg, want)))
      fail_msg("WorkgroupSize %u: %d \"%s\", expected ELIMIT \"%s\"", inv + 1, r, msg, want);
  }
  /* One that cannot be evaluated: EINVAL. */
  snprintf(consts, sizeof consts,
           "%%N = OpSpecConstant %%int 1\n%%W = OpSpecConstant %%uint 64\n"
           "%%wx = OpSpecConstantOp %%uint UDiv %%W %%W\n%%w0 = OpConstant %%uint 0\n"
           "%%wy = OpSpecConstantOp %%uint UDiv %%W %%w0\n"
           "%%wg = OpSpecConstantComposite %%v3 %%wx %%wy %%one\n"
           "%%len = OpSpecConstantOp %%int IAdd %%N %%zero\n");
  int r = spec_try(ls1, wgdec, consts, "", msg, sizeof msg);
  if (r != DSPK_EINVAL || !strstr(msg, "work-group size cannot be told"))
    fail_msg("WorkgroupSize W / 0: %d \"%s\", expected EINVAL", r, msg);
  /* GLSL's local_size_x_id (tester C's form): glslang gives it a
   * specialization constant of its own, default 1, which the driver uses
   * without specialization; the constant_id of 100000 is another: it runs,
   * a work group of 1. */
  {
    static const char src[] = "#version 450\nlayout(local_size_x_id = 0) in;\n"
                              "layout(constant_id = 0) const uint WG = 100000;\n"
                              "layout(std430, binding = 0) buffer X { float x[]; };\n"
                              "void main() { x[0] = float(gl_WorkGroupSize.x) + "
                              "float(WG == 100000u); }\n";
    float x0;
    if ((r = glsl_try(src, msg, sizeof msg, &x0)))
      fail_msg("local_size_x_id: %d %s", r, msg);
    if (x0 != 2.0f)
      fail_msg("local_size_x_id: gl_WorkGroupSize.x + (WG == 100000) is %g (expected 1 + 1)",
               x0);
  }
  /* LocalSizeId (Vulkan 1.3's maintenance4) of W * 2. */
  if (D->props.apiVersion >= VK_API_VERSION_1_3) {
    for (int more = 0; more <= 1; more++) {
      snprintf(consts, sizeof consts,
               "%%N = OpSpecConstant %%int 1\n%%W = OpSpecConstant %%uint %u\n"
               "%%u2 = OpConstant %%uint 2\n"
               "%%wx = OpSpecConstantOp %%uint IMul %%W %%u2\n"
               "%%len = OpSpecConstantOp %%int IAdd %%N %%zero\n",
               inv / 2 + (uint32_t)more);
      r = spec_try("OpExecutionModeId %main LocalSizeId %wx %one %one\n", "", consts, "", msg,
                   sizeof msg);
      snprintf(want, sizeof want, "work-group size %ux1x1 exceeds the device's",
               (inv / 2 + 1) * 2);
      if (!more && r)
        fail_msg("LocalSizeId %u: %d %s", inv / 2 * 2, r, msg);
      if (more && (r != DSPK_ELIMIT || !strstr(msg, want)))
        fail_msg("LocalSizeId: %d \"%s\", expected ELIMIT \"%s\"", r, msg, want);
    }
  }
}

/* Runs raw kernel src (lang glsl or spirv) with one f32[4] tensor and
 * scalars filling exactly nbytes of push constants (i64s, then a u32 for
 * the last 4 bytes when nbytes is not a multiple of 8): its result, *msg. */
static int pc_try(const char *lang, const void *src, size_t len, uint32_t nbytes, char *msg,
                  size_t msglen) {
  struct dspk__karg sc[15];
  int nsc = 0;
  assert_true(nbytes % 4 == 0 && nbytes <= 116);
  for (uint32_t k = 0; k < nbytes / 8; k++)
    sc[nsc++] = (struct dspk__karg){.kind = DSPK__KARG_I64, .v.i64 = 0};
  if (nbytes % 8)
    sc[nsc++] = (struct dspk__karg){.kind = DSPK__KARG_U32, .v.u32 = 0};
  struct dspk__tensor t = words(4);
  int r = raw_over_lang(lang, src, len, &t, 1, sc, nsc, msg, msglen);
  VKB->free(D, t.mem);
  return r;
}

/* A push-constant block holding matrices ends where the last byte of its
 * last column (row, for RowMajor) ends: MatrixStride apart, not packed
 * (probe 23 F1: GLSL's `mat3 m` with 9 f32 scalars ran, the block's 44
 * bytes counted as 36, and m[2][2] read 0 from bytes never pushed).  The
 * block at its size runs; 4 bytes short of it is EINVAL naming the size,
 * in GLSL (std430, as glslang lays it out) and in SPIR-V with a
 * MatrixStride of its own, given directly or through a decoration group.
 * The values read are checked in python/tests/test_operands.py. */
static void t_raw_pc_matrix(void **state) {
  (void)state;
  static const struct {
    const char *decl, *expr;
    uint32_t size; /* the block's bytes, std430 */
  } cases[] = {
      {"mat3 m;", "m[2][2]", 44},                       /* 3 columns of 16 bytes */
      {"layout(row_major) mat3 m;", "m[2][2]", 44},     /* 3 rows of 16 bytes */
      {"mat2x3 m;", "m[1][2]", 28},                     /* 2 columns of vec3 */
      {"layout(row_major) mat3x2 m;", "m[2][1]", 28},   /* 2 rows of vec3 */
      {"mat3x2 m;", "m[2][1]", 24},                     /* 3 columns of vec2: packed */
      {"mat2x3 ms[2];", "ms[1][1][2]", 60},             /* ArrayStride 32 */
      {"float f; S s;", "s.m[1][2]", 60},               /* S at 16, its m at 16 more */
      {"float f; mat4x3 m;", "m[3][2]", 76},            /* m at 16 */
  };
  char src[1024], msg[1024], want[160];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(src, sizeof src,
             "#version 450\nlayout(local_size_x = 1) in;\n"
             "layout(std430, binding = 0) buffer X { float x[]; };\n"
             "struct S { float a; mat2x3 m; };\n"
             "layout(push_constant) uniform P { %s };\n"
             "void main() { x[0] = %s; }\n",
             cases[i].decl, cases[i].expr);
    int r = pc_try("glsl", src, strlen(src), cases[i].size, msg, sizeof msg);
    if (r)
      fail_msg("`%s` with %u bytes of scalars: %d \"%s\", expected it to run", cases[i].decl,
               cases[i].size, r, msg);
    r = pc_try("glsl", src, strlen(src), cases[i].size - 4, msg, sizeof msg);
    snprintf(want, sizeof want, "push-constant block is %u bytes, the scalars of args fill %u",
             cases[i].size, cases[i].size - 4);
    if (r != DSPK_EINVAL || !strstr(msg, want))
      fail_msg("`%s` with %u bytes of scalars: %d \"%s\", expected EINVAL \"%s\"",
               cases[i].decl, cases[i].size - 4, r, msg, want);
  }
  /* SPIR-V: a mat2 whose columns are MatrixStride bytes apart (8 packed):
   * the block is (2 - 1) * stride + 8 bytes. */
  static const char *const decos[] = {
      "OpMemberDecorate %%P 0 ColMajor\nOpMemberDecorate %%P 0 MatrixStride %u\n",
      "OpMemberDecorate %%P 0 RowMajor\nOpMemberDecorate %%P 0 MatrixStride %u\n",
      "OpDecorate %%g MatrixStride %u\nOpDecorate %%g ColMajor\n%%g = OpDecorationGroup\n"
      "OpGroupMemberDecorate %%g %%P 0\n",
  };
  static const uint32_t strides[] = {8, 16, 64, 4096};
  for (size_t d = 0; d < sizeof decos / sizeof decos[0]; d++)
    for (size_t s = 0; s < sizeof strides / sizeof strides[0]; s++) {
      char deco[256], text[2048];
      snprintf(deco, sizeof deco, decos[d], strides[s]);
      snprintf(text, sizeof text,
               "OpCapability Shader\nOpMemoryModel Logical GLSL450\n"
               "OpEntryPoint GLCompute %%main \"main\"\n"
               "OpExecutionMode %%main LocalSize 1 1 1\n"
               "OpDecorate %%rt ArrayStride 4\nOpMemberDecorate %%A 0 Offset 0\n"
               "OpDecorate %%A Block\nOpDecorate %%a DescriptorSet 0\n"
               "OpDecorate %%a Binding 0\nOpMemberDecorate %%P 0 Offset 0\n%s"
               "OpDecorate %%P Block\n"
               "%%void = OpTypeVoid\n%%fn = OpTypeFunction %%void\n"
               "%%float = OpTypeFloat 32\n%%int = OpTypeInt 32 1\n"
               "%%v2 = OpTypeVector %%float 2\n%%m2 = OpTypeMatrix %%v2 2\n"
               "%%P = OpTypeStruct %%m2\n%%pP = OpTypePointer PushConstant %%P\n"
               "%%pc = OpVariable %%pP PushConstant\n"
               "%%rt = OpTypeRuntimeArray %%float\n%%A = OpTypeStruct %%rt\n"
               "%%pA = OpTypePointer StorageBuffer %%A\n%%a = OpVariable %%pA StorageBuffer\n"
               "%%pf = OpTypePointer StorageBuffer %%float\n"
               "%%ppf = OpTypePointer PushConstant %%float\n"
               "%%zero = OpConstant %%int 0\n%%one = OpConstant %%int 1\n"
               "%%main = OpFunction %%void None %%fn\n%%l = OpLabel\n"
               "%%q = OpAccessChain %%ppf %%pc %%zero %%one %%one\n"
               "%%x = OpLoad %%float %%q\n%%p = OpAccessChain %%pf %%a %%zero %%zero\n"
               "OpStore %%p %%x\nOpReturn\nOpFunctionEnd\n",
               deco);
      uint32_t *w;
      size_t nw;
      spv_assemble(text, &w, &nw);
      uint32_t size = strides[s] + 8;
      int r = size <= 116 ? pc_try("spirv", w, nw * 4, size, msg, sizeof msg) : 0;
      if (r)
        fail_msg("mat2, MatrixStride %u (%zu), %u bytes of scalars: %d \"%s\", expected it "
                 "to run", strides[s], d, size, r, msg);
      r = pc_try("spirv", w, nw * 4, 16, msg, sizeof msg);
      snprintf(want, sizeof want, "push-constant block is %u bytes, the scalars of args fill "
               "16", size);
      if (size > 16 ? r != DSPK_EINVAL || !strstr(msg, want) : r != 0)
        fail_msg("mat2, MatrixStride %u (%zu), 16 bytes of scalars: %d \"%s\", expected %s",
                 strides[s], d, r, msg, size > 16 ? want : "it to run");
      free(w);
    }
}

/* Sizes past the 2^40 bytes the checks count to are said as "more than"
 * that, not as that many bytes (probe 23 F4: a shared array of 2^66 bytes
 * was said to take 1099511627776); 2^40 bytes is counted exactly, 2^40 + 4
 * in two variables is more.  The push-constant block's size is said the
 * same way. */
static void t_spv_size_over(void **state) {
  (void)state;
  static const struct {
    const char *dims, *want;
  } cases[] = {
      {"%t1 = OpTypeArray %t0 %n\n%t2 = OpTypeArray %t1 %n\n%t3 = OpTypeArray %t2 %n\n",
       "variables take more than 1099511627776 bytes, more than the device's"},
      {"%t1 = OpTypeArray %t0 %n\n%t3 = OpTypeArray %t1 %k\n",
       "variables take 1099511627776 bytes, more than the device's"},
      {"%t1 = OpTypeArray %t0 %n\n%t3 = OpTypeArray %t1 %k\n"
       "%pu = OpTypePointer Workgroup %u\n%s2 = OpVariable %pu Workgroup\n",
       "variables take more than 1099511627776 bytes, more than the device's"},
  };
  char text[2048], msg[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* uint[65536][65536][65536][65536] (2^66 bytes), uint[64][65536][65536]
     * (GLSL's order; 2^40 bytes), and that with a uint more. */
    snprintf(text, sizeof text,
             "OpCapability Shader\nOpMemoryModel Logical GLSL450\n"
             "OpEntryPoint GLCompute %%main \"main\"\n"
             "OpExecutionMode %%main LocalSize 1 1 1\n"
             "%%void = OpTypeVoid\n%%fn = OpTypeFunction %%void\n"
             "%%u = OpTypeInt 32 0\n%%n = OpConstant %%u 65536\n%%k = OpConstant %%u 64\n"
             "%%t0 = OpTypeArray %%u %%n\n%s"
             "%%p = OpTypePointer Workgroup %%t3\n%%s = OpVariable %%p Workgroup\n"
             "%%main = OpFunction %%void None %%fn\n%%l = OpLabel\nOpReturn\nOpFunctionEnd\n",
             cases[i].dims);
    uint32_t *w;
    size_t nw;
    spv_assemble(text, &w, &nw);
    int r = raw_spirv_try(w, nw * 4, "main", msg, sizeof msg);
    free(w);
    if (r != DSPK_ELIMIT || !strstr(msg, cases[i].want))
      fail_msg("shared memory %zu: %d \"%s\", expected ELIMIT \"%s\"", i, r, msg, cases[i].want);
  }
  /* A push-constant block of float[65536] 2^31 bytes apart (2^47 + 4 bytes). */
  snprintf(text, sizeof text,
           "OpCapability Shader\nOpMemoryModel Logical GLSL450\n"
           "OpEntryPoint GLCompute %%main \"main\"\n"
           "OpExecutionMode %%main LocalSize 1 1 1\n"
           "OpDecorate %%t0 ArrayStride 2147483648\n"
           "OpMemberDecorate %%P 0 Offset 0\nOpDecorate %%P Block\n"
           "%%void = OpTypeVoid\n%%fn = OpTypeFunction %%void\n"
           "%%f = OpTypeFloat 32\n%%u = OpTypeInt 32 0\n%%n = OpConstant %%u 65536\n"
           "%%z = OpConstant %%u 0\n"
           "%%t0 = OpTypeArray %%f %%n\n%%P = OpTypeStruct %%t0\n"
           "%%pP = OpTypePointer PushConstant %%P\n%%pc = OpVariable %%pP PushConstant\n"
           "%%pf = OpTypePointer PushConstant %%f\n"
           "%%main = OpFunction %%void None %%fn\n%%l = OpLabel\n"
           "%%q = OpAccessChain %%pf %%pc %%z %%z\n%%x = OpLoad %%f %%q\n"
           "OpReturn\nOpFunctionEnd\n");
  uint32_t *w;
  size_t nw;
  spv_assemble(text, &w, &nw);
  int r = raw_spirv_try(w, nw * 4, "main", msg, sizeof msg);
  free(w);
  if (r != DSPK_EINVAL ||
      !strstr(msg, "push-constant block is more than 1099511627776 bytes, the scalars of args "
                   "fill 0"))
    fail_msg("a push-constant block of 2^47 bytes: %d \"%s\", expected EINVAL saying more "
             "than 2^40", r, msg);
}

/* Module shapes that documented checks refuse, named as documented rather
 * than as the robust-access pass's refusal (probe 23 F2: an array of
 * storage buffers was "the daemon cannot bound this module's memory
 * accesses ... must use Logical addressing", its binding unnamed). */
static void t_raw_refused_named(void **state) {
  (void)state;
  static const char *const bodies[] = {
      "bufs[1].a[0] = 1.0;", "bufs[0].a[0] = 1.0;",
      "bufs[gl_GlobalInvocationID.x].a[0] = 1.0;", "bufs[0].a[gl_GlobalInvocationID.x] = 1.0;"};
  char src[1024], msg[1024];
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    snprintf(src, sizeof src,
             "#version 450\nlayout(local_size_x = 1) in;\n"
             "layout(std430, binding = 0) buffer A { float a[]; } bufs[2];\n"
             "void main() { %s }\n", bodies[i]);
    struct dspk__tensor t[2] = {words(4), words(4)};
    int r = raw_over(src, t, 2, msg, sizeof msg);
    VKB->free(D, t[0].mem);
    VKB->free(D, t[1].mem);
    if (r != DSPK_EINVAL || !strstr(msg, "array of resources at set 0, binding 0"))
      fail_msg("an array of 2 storage buffers (%s): %d \"%s\", expected EINVAL naming "
               "binding 0", bodies[i], r, msg);
  }
}

static void t_raw_error(void **state) {
  (void)state;
  static const char bad[] = "#version 450\nlayout(local_size_x=1) in;\n"
                            "void main() { undefined_thing = 1; }\n";
  char msg[1024];
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 0};
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = bad;
  op.u.kernel.source_len = strlen(bad);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  assert_int_equal(VKB->run(D, &op, &ctx), DSPK_ECOMPILE);
  assert_non_null(strstr(msg, "undefined_thing"));
  op.u.kernel.lang = "cuda";
  assert_int_equal(VKB->run(D, &op, &ctx), DSPK_ENOTSUP);
}

/* A raw GLSL kernel writing tag into o[0], run for owner (a uid) on d:
 * returns the run's result, the message in msg. */
static int raw_owned(struct dspk__dev *d, uint32_t owner, unsigned tag, char *msg, size_t len) {
  char src[256];
  int64_t n = 1;
  struct htensor O = h_make(DSPK_F32, 1, &n, 0);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 1};
  snprintf(src, sizeof src,
           "#version 450\nlayout(local_size_x = 1) in;\n"
           "layout(std430, binding = 0) buffer O { uint o[]; };\n"
           "void main() { o[0] = %uu; }\n", tag);
  assert_int_equal(h_upload(d, &O, 0, &op.in[0]), 0);
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  op.u.kernel.grid[0] = 1;
  op.u.kernel.nargs = 1;
  op.u.kernel.args[0] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  assert_int_equal(dspk__op_infer(&op, msg, len), 0);
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = len, .owner = owner};
  msg[0] = 0;
  int r = VKB->run(d, &op, &ctx);
  if (r == 0) {
    uint32_t got = 0;
    assert_int_equal(VKB->read(d, op.in[0].mem, 0, &got, 4), 0);
    assert_int_equal(got, tag);
  }
  VKB->free(d, op.in[0].mem);
  h_free(&O);
  return r;
}

/* The compiles of raw_owned's kernel so far on d. */
static uint64_t compiled(struct dspk__dev *d, uint64_t *hits) {
  struct dspk__devstats st;
  memset(&st, 0, sizeof st);
  VKB->stats(d, &st);
  if (hits)
    *hits = st.kernel_cache_hits;
  return st.kernels_compiled;
}

/* A client's raw kernel is its owner's alone (docs/security.md): another
 * uid running the same source compiles it anew, from the device's table
 * and from the persistent cache alike, so neither kernels_compiled nor the
 * time a task takes tells one user whether another ran a given source. */
static void t_raw_owner(void **state) {
  (void)state;
  char msg[512], path[] = "/tmp/dspk-vk-owner-XXXXXX";
  unsigned tag = 424242u + (unsigned)getpid() % 1000u;
  uint64_t hits, hits0;
  assert_int_equal(h_cache_path(path), 0);
  for (int round = 0; round < 2; round++) {
    struct dspk__cache *c;
    struct dspk__dev *d;
    assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
    struct dspk__devenv env = {.cache = c, .compile_exe = "/proc/self/exe"};
    assert_int_equal(VKB->open(0, &env, &d), 0);
    if (round == 0) {
      assert_int_equal(raw_owned(d, 1001, tag, msg, sizeof msg), 0);
      assert_int_equal(compiled(d, NULL), 1);
      assert_int_equal(raw_owned(d, 1001, tag, msg, sizeof msg), 0); /* its own: the table */
      assert_int_equal(compiled(d, NULL), 1);
      assert_int_equal(raw_owned(d, 1002, tag, msg, sizeof msg), 0); /* not 1001's */
      assert_int_equal(compiled(d, NULL), 2);
    } else {
      /* Restarted: each owner's entry is in the file, a third's is not. */
      compiled(d, &hits0);
      assert_int_equal(raw_owned(d, 1002, tag, msg, sizeof msg), 0);
      assert_int_equal(compiled(d, &hits), 0);
      assert_int_equal(hits, hits0 + 1);
      assert_int_equal(raw_owned(d, 1003, tag, msg, sizeof msg), 0);
      assert_int_equal(compiled(d, &hits), 1);
      assert_int_equal(hits, hits0 + 1);
    }
    VKB->close(d);
    dspk__cache_close(c);
  }
  h_cache_unlink(path);
}

/* The mark dspk__vk_kernel gives a client's module (the driver's caches key
 * pipelines by the module's bytes): one OpSourceExtension after the
 * preamble, the rest unchanged, different per owner. */
static void t_spv_mark(void **state) {
  (void)state;
  /* Header; OpCapability Shader; OpMemoryModel Logical GLSL450; OpSource. */
  static const uint32_t m[] = {0x07230203, 0x00010000, 0, 8, 0, (2u << 16) | 17, 1,
                               (3u << 16) | 14, 0, 1, (3u << 16) | 3, 2, 450};
  uint32_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  assert_int_equal(dspk__vk_spv_mark(m, 13, "dspk-owner-uid-1", &a, &na), 0);
  assert_int_equal(dspk__vk_spv_mark(m, 13, "dspk-owner-uid-2", &b, &nb), 0);
  assert_int_equal(na, 13 + 1 + 5); /* 16 characters and a NUL: 5 words */
  assert_int_equal(nb, na);
  assert_memory_equal(a, m, 10 * 4);
  assert_int_equal(a[10], (6u << 16) | 4u);
  assert_string_equal((const char *)(a + 11), "dspk-owner-uid-1");
  assert_memory_equal(a + 16, m + 10, 3 * 4);
  assert_memory_not_equal(a, b, na * 4);
  free(a);
  free(b);
}

/* A GLSL source whose macros expand to 2^levels tokens in 0.5 KiB. */
static char *macro_bomb(int levels) {
  size_t cap = 4096;
  char *s = malloc(cap);
  int at = snprintf(s, cap,
                    "#version 450\nlayout(local_size_x = 1) in;\n"
                    "layout(std430, binding = 0) buffer A { float a[]; };\n#define A0 +1.0\n");
  for (int i = 1; i <= levels; i++)
    at += snprintf(s + at, cap - (size_t)at, "#define A%d A%d A%d\n", i, i - 1, i - 1);
  snprintf(s + at, cap - (size_t)at, "void main() { a[0] = %d.0 A%d; }\n", (int)getpid(),
           levels);
  return s;
}

/* A client's source cannot make the compiler take unbounded memory or time
 * (docs/protocol.md, kernel): 2^22 tokens (GiBs and about 20 s in glslang)
 * end in ELIMIT at the compile's limits, and a canceled task stops its
 * compile at once. */
static void t_raw_compile_limits(void **state) {
  (void)state;
  char msg[512];
  char *src = macro_bomb(22);
  int64_t n = 1;
  struct htensor X = h_make(DSPK_F32, 1, &n, 0);
  struct dspk__op op = {.kind = DSPK_OP_KERNEL, .nin = 1};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  op.u.kernel.grid[0] = 1;
  op.u.kernel.nargs = 1;
  op.u.kernel.args[0] = (struct dspk__karg){.kind = DSPK__KARG_TENSOR, .v.tensor = 0};
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  atomic_int cancel = 1;
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg, .cancel = &cancel};
  msg[0] = 0;
  assert_int_equal(VKB->run(D, &op, &ctx), DSPK_ECANCELED);
  atomic_store(&cancel, 0);
  int r = VKB->run(D, &op, &ctx);
  if (r != DSPK_ELIMIT || !strstr(msg, "a client's kernel compile may"))
    fail_msg("a 2^22-token source: %d \"%s\", expected ELIMIT at the compile's limits", r, msg);
  print_message("macro bomb: %s\n", msg);
  VKB->free(D, op.in[0].mem);
  h_free(&X);
  free(src);
}

/* Shared memory in place (VK_EXT_external_memory_host): a memfd mapping
 * imported as device memory is read and written by an op directly; on a
 * device without the extension import_host must say ENOTSUP (the daemon
 * then stages copies), which is checked instead. */
static void t_import_host(void **state) {
  (void)state;
  const int64_t n = 3000;
  size_t bytes = (size_t)n * sizeof(float);
  int fa = memfd_create("a", MFD_CLOEXEC), fo = memfd_create("o", MFD_CLOEXEC);
  assert_true(fa >= 0 && fo >= 0);
  assert_int_equal(ftruncate(fa, (off_t)bytes), 0);
  assert_int_equal(ftruncate(fo, (off_t)bytes), 0);
  float *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fa, 0);
  float *o = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fo, 0);
  assert_true(a != MAP_FAILED && o != MAP_FAILED);
  struct dspk__mem *ma = NULL, *mo = NULL;
  int r = VKB->import_host(D, a, bytes, &ma);
  print_message("VK_EXT_external_memory_host: %s (alignment %llu)\n",
                D->host_import_align ? "offered" : "not offered",
                (unsigned long long)D->host_import_align);
  if (!D->host_import_align || !D->local_is_host) {
    /* Not offered, or a discrete GPU: ops never read the client's pages
     * across the bus (host_register instead, t_host_register). */
    assert_int_equal(r, DSPK_ENOTSUP);
  } else {
    char msg[256];
    assert_int_equal(r, 0);
    assert_int_equal(VKB->import_host(D, o, bytes, &mo), 0);
    struct dspk__mem *mx = NULL;
    assert_int_equal(VKB->import_host(D, (char *)a + 4, 64, &mx), DSPK_ENOTSUP); /* misaligned */
    for (int64_t i = 0; i < n; i++) {
      a[i] = (float)h_rand();
      o[i] = -1.0f;
    }
    struct dspk__op op = {.kind = DSPK_OP_MAP, .nin = 1};
    op.u.map.fn = DSPK_MAP_SCALE;
    op.u.map.alpha = 2.0;
    op.in[0] = (struct dspk__tensor){.dtype = DSPK_F32, .rank = 1, .shape = {n}, .mem = ma};
    assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
    op.out[0].mem = mo;
    op.out[0].offset = 0;
    struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
    assert_int_equal(VKB->run(D, &op, &ctx), 0);
    assert_int_equal(VKB->sync(D), 0);
    for (int64_t i = 0; i < n; i++)
      if (o[i] != 2.0f * a[i])
        fail_msg("o[%lld] = %g, want %g", (long long)i, (double)o[i], 2.0 * a[i]);
    VKB->free(D, ma);
    VKB->free(D, mo);
  }
  munmap(a, bytes);
  munmap(o, bytes);
  close(fa);
  close(fo);
}

/* host_register: a client's pages imported for DMA.  Writes from and reads
 * into a registered mapping are the device's copies (no staging), in order
 * with the work around them; an unregistered address still stages. */
static void t_host_register(void **state) {
  (void)state;
  const size_t bytes = 3 * 4096 + 100;
  int fd = memfd_create("r", MFD_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
  unsigned char *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(h != MAP_FAILED);
  int r = VKB->host_register(D, h, bytes);
  if (!D->host_import_align) {
    assert_int_equal(r, DSPK_ENOTSUP);
  } else {
    assert_int_equal(r, 0);
    assert_non_null(D->hostregs);
    struct dspk__mem *m;
    assert_int_equal(VKB->alloc(D, bytes, &m), 0);
    for (size_t i = 0; i < bytes; i++)
      h[i] = (unsigned char)(i * 13 + 5);
    /* Whole and at an offset, device side and host side. */
    assert_int_equal(VKB->write(D, m, 0, h, bytes), 0);
    assert_int_equal(VKB->write(D, m, 7, h + 4096, 1000), 0);
    /* The device reads registered pages when the copy runs, not in write
     * (backend.h): they stay unchanged until then. */
    assert_int_equal(VKB->sync(D), 0);
    memset(h, 0, bytes);
    assert_int_equal(VKB->read(D, m, 0, h + 1, bytes - 1), 0);
    for (size_t i = 0; i + 1 < bytes; i++) {
      unsigned char want = i >= 7 && i < 1007 ? (unsigned char)((i - 7 + 4096) * 13 + 5)
                                              : (unsigned char)(i * 13 + 5);
      if (h[i + 1] != want)
        fail_msg("byte %zu: %u, want %u", i, h[i + 1], want);
    }
    /* A range that runs past the mapping is not the mapping's: staged. */
    unsigned char *tmp = malloc(bytes);
    assert_non_null(tmp);
    memcpy(tmp, h, bytes);
    assert_int_equal(VKB->read(D, m, 0, tmp, bytes), 0);
    assert_int_equal(tmp[8], (unsigned char)((1 + 4096) * 13 + 5));
    free(tmp);
    VKB->free(D, m);
    VKB->host_unregister(D, h);
    assert_null(D->hostregs);
    VKB->host_unregister(D, h); /* not registered: nothing */
  }
  munmap(h, bytes);
  close(fd);
}

static void t_memory(void **state) {
  (void)state;
  /* Sizes across the slab / dedicated boundary; offsets; fences. */
  size_t sizes[] = {0, 1, 513, 4096, (1 << 20) - 3, (3 << 20) + 5};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    struct dspk__mem *m;
    assert_int_equal(VKB->alloc(D, n, &m), 0);
    unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
    for (size_t k = 0; k < n; k++)
      a[k] = (unsigned char)(k * 7 + i);
    assert_int_equal(VKB->write(D, m, 0, a, n), 0);
    memset(b, 0, n + 1);
    assert_int_equal(VKB->read(D, m, 0, b, n), 0);
    assert_memory_equal(a, b, n);
    if (n > 10) {
      assert_int_equal(VKB->write(D, m, 3, a, 5), 0);
      assert_int_equal(VKB->read(D, m, 3, b, 5), 0);
      assert_memory_equal(a, b, 5);
    }
    assert_int_equal(VKB->write(D, m, n + ((size_t)1 << 40), a, 1), DSPK_ERANGE);
    struct dspk__fence *f;
    assert_int_equal(VKB->fence_record(D, &f), 0);
    assert_int_equal(VKB->fence_wait(D, f), 0);
    assert_int_equal(VKB->fence_query(D, f), 1);
    VKB->fence_destroy(D, f);
    VKB->free(D, m);
    free(a);
    free(b);
  }
  assert_int_equal(VKB->sync(D), 0);
  struct dspk__devstats st = {0};
  VKB->stats(D, &st);
  assert_true(st.retire_released > 0);
  assert_int_equal(st.retire_leaked, 0);
  assert_true(st.pool_hits + st.pool_misses > 0);
}

/* Runs a small fixed workload (three generated kernels) on dev. */
static void workload(struct dspk__dev *d) {
  char msg[512];
  int64_t n = 100;
  struct dspk__dev *save = D;
  D = d;
  for (int fn = 0; fn < 3; fn++) {
    struct htensor A = h_make(DSPK_F32, 1, &n, 1), out;
    struct dspk__op op = {.kind = DSPK_OP_MAP, .nin = 1};
    op.u.map.fn = fn == 0 ? DSPK_MAP_SCALE : fn == 1 ? DSPK_MAP_ABS : DSPK_MAP_EXP;
    op.u.map.alpha = 2;
    assert_int_equal(h_upload(d, &A, 0, &op.in[0]), 0);
    assert_int_equal(h_run(d, &op, &out, msg, sizeof msg), 0);
    h_free(&A);
    h_free(&out);
  }
  int64_t fs[2] = {2, 64};
  struct htensor X = h_make(DSPK_C64, 2, fs, 1), out;
  struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
  assert_int_equal(h_upload(d, &X, 0, &op.in[0]), 0);
  assert_int_equal(h_run(d, &op, &out, msg, sizeof msg), 0);
  h_free(&X);
  h_free(&out);
  D = save;
}

static void t_cache_restart(void **state) {
  (void)state;
  char path[] = "/tmp/dspk-vk-cache-XXXXXX";
  assert_int_equal(h_cache_path(path), 0);
  struct dspk__devstats st;
  for (int round = 0; round < 2; round++) {
    struct dspk__cache *c;
    assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
    struct dspk__devenv env = {.cache = c};
    struct dspk__dev *d;
    struct dspk__cache_stats before, after;
    assert_int_equal(VKB->open(0, &env, &d), 0);
    workload(d);
    /* The same work again is served from the device's memory (kernel
     * table, plan cache); those uses count in the file too, so that the
     * size bound evicts what was least recently used. */
    assert_int_equal(dspk__cache_stats(c, &before), 0);
    workload(d);
    assert_int_equal(dspk__cache_stats(c, &after), 0);
    assert_true(after.kind[DSPK__CACHE_KERNELS].stored_hits >=
                before.kind[DSPK__CACHE_KERNELS].stored_hits + 3); /* 3 map kernels */
    assert_true(after.kind[DSPK__CACHE_BLOBS].stored_hits >=
                before.kind[DSPK__CACHE_BLOBS].stored_hits + 1); /* the VkFFT plan */
    memset(&st, 0, sizeof st);
    VKB->stats(d, &st);
    VKB->close(d); /* saves the pipeline-cache data */
    if (round == 0) {
      assert_int_equal(st.kernels_compiled, 4); /* 3 kernels, 1 VkFFT plan */
      assert_int_equal(st.kernel_cache_hits, 0);
    } else {
      assert_int_equal(st.kernels_compiled, 0);
      assert_int_equal(st.kernel_cache_hits, 4);
      struct dspk__cache_stats cs;
      assert_int_equal(dspk__cache_stats(c, &cs), 0);
      assert_true(cs.kind[DSPK__CACHE_BLOBS].entries >= 1); /* pipeline cache */
    }
    dspk__cache_close(c);
  }
  h_cache_unlink(path);
}

/* The persistent cache holds glslang's module of a client's kernel, not a
 * clamped one (a file written before the clamping existed holds the same),
 * and the clamping runs on every module it serves: after a restart the
 * kernel of t_raw_oob_private comes from the file (kernel_cache_hits) and
 * its indices are still clamped. */
static void t_raw_oob_cached(void **state) {
  (void)state;
  char path[] = "/tmp/dspk-vk-cache-XXXXXX";
  assert_int_equal(h_cache_path(path), 0);
  struct dspk__dev *saved = D;
  for (int round = 0; round < 2; round++) {
    struct dspk__cache *c;
    struct dspk__devstats st = {0};
    assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
    struct dspk__devenv env = {.cache = c};
    assert_int_equal(VKB->open(0, &env, &D), 0);
    raw_oob_check("glsl", raw_oob_glsl, strlen(raw_oob_glsl));
    VKB->stats(D, &st);
    VKB->close(D);
    D = saved;
    dspk__cache_close(c);
    assert_int_equal(st.kernels_compiled, round == 0 ? 1 : 0);
    assert_int_equal(st.kernel_cache_hits, round == 0 ? 0 : 1);
  }
  h_cache_unlink(path);
}

/* One gemm with alpha 1.5 (and beta -0.5 with C), A uploaded `apad` bytes
 * into its block: returns the run's result (DSPK_ENOTSUP from a forced
 * candidate that cannot run it), and fails the test when a run that
 * succeeded differs from the naive double reference. */
static int gemm_try(int ra, const int64_t *as, int rb, const int64_t *bs, int ta, int tb,
                    int crank, const int64_t *cs, size_t apad, const char *what) {
  char msg[512];
  struct htensor A = h_make(DSPK_F32, ra, as, 1), B = h_make(DSPK_F32, rb, bs, 1), out;
  struct htensor C = h_make(DSPK_F32, crank, cs, 1);
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = crank >= 0 ? 3 : 2};
  op.u.gemm.trans_a = ta;
  op.u.gemm.trans_b = tb;
  op.u.gemm.alpha = 1.5;
  op.u.gemm.beta = crank >= 0 ? -0.5 : 0;
  assert_int_equal(h_upload(D, &A, apad, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  if (crank >= 0)
    assert_int_equal(h_upload(D, &C, 0, &op.in[2]), 0);
  int r = h_run(D, &op, &out, msg, sizeof msg);
  if (r == 0) {
    double complex *want = calloc(out.n ? (size_t)out.n : 1, sizeof *want);
    ref_gemm(&A, &B, crank >= 0 ? &C : NULL, ta, tb, 1.5, -0.5, &out, want);
    double e = h_relerr(&out, want, out.n);
    free(want);
    h_free(&out);
    if (!(e <= 1e-5))
      fail_msg("gemm %s: rel err %g", what, e);
  } else if (r != DSPK_ENOTSUP) {
    fail_msg("gemm %s: %d %s", what, r, msg);
  }
  h_free(&A);
  h_free(&B);
  h_free(&C);
  return r;
}

/* Batched products of small matrices (M x N at most 256 elements, or 1024
 * with K at most 128; more than one batch entry) take the small-product kernel, one invocation per
 * output element ("small-batched" in dspk__vk_gemm_last()), instead of a
 * tile's workgroup per batch entry: results against the naive reference
 * for every dtype gemm and contract accept, 1x1x1 products in a batch of
 * 50,000, broadcast batches (whole, fully broadcast, and broadcasts whose
 * batch dims merge into two levels or more), transposes and a C term; a
 * large batched gemm keeps the tiles. */
static void t_gemm_small(void **state) {
  (void)state;
  struct scase {
    int ra;
    int64_t as[5];
    int rb;
    int64_t bs[5];
    int ta, tb, crank;
    int64_t cs[2];
  } cs[] = {
      {3, {50000, 1, 1}, 3, {50000, 1, 1}, 0, 0, -1, {0}},
      {3, {40, 3, 7}, 3, {40, 7, 5}, 0, 0, 2, {3, 5}},
      {3, {9, 16, 8}, 3, {9, 8, 16}, 1, 1, 1, {8}},
      {3, {3, 32, 20}, 3, {3, 32, 20}, 0, 1, -1, {0}},      /* M*N = 1024: the bound */
      {3, {6, 2, 3000}, 2, {3000, 3}, 0, 0, -1, {0}},       /* long K, B broadcast */
      {2, {2, 5}, 3, {700, 5, 3}, 0, 0, 2, {2, 1}},         /* A broadcast */
      {4, {7, 1, 2, 3}, 4, {1, 5, 3, 4}, 0, 0, -1, {0}},    /* two levels */
      {5, {2, 1, 3, 2, 3}, 4, {4, 1, 2, 2}, 1, 0, 2, {3, 2}}, /* three levels: groups */
      {5, {2, 3, 1, 4, 6}, 3, {4, 6, 1}, 0, 0, -1, {0}},    /* merged leading dims */
  };
  const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_F16, DSPK_BF16};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
    for (int di = 0; di < 4; di++) {
      const struct scase *c = &cs[i];
      if (i == 0 && di >= 2) /* f16/bf16 take the same kernel; keep the test short */
        continue;
      gemm_case(dts[di], c->ra, c->as, c->rb, c->bs, c->ta, c->tb, c->crank, c->cs,
                dts[di] == DSPK_F64 ? 1e-12 : 1e-5);
      /* f16/bf16 outputs of more than 256 per matrix keep the cooperative-
       * matrix tiles where the device has them (the H200; that path names
       * no kernel here: dspk__vk_gemm_last() is NULL after it): only their
       * results are checked. */
      int64_t M = c->ta ? c->as[c->ra - 1] : c->as[c->ra - 2];
      int64_t N = c->tb ? c->bs[c->rb - 2] : c->bs[c->rb - 1];
      if ((dts[di] == DSPK_F16 || dts[di] == DSPK_BF16) && M * N > 256)
        continue;
      assert_non_null(dspk__vk_gemm_last());
      assert_string_equal(dspk__vk_gemm_last(), "small-batched");
    }
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    contract_case("i,i->i", dt, 1, (int64_t[]){50000}, 1, (int64_t[]){50000});
    assert_string_equal(dspk__vk_gemm_last(), "small-batched");
    contract_case("ab,ab->b", dt, 2, (int64_t[]){3, 20000}, 2, (int64_t[]){3, 20000});
    assert_string_equal(dspk__vk_gemm_last(), "small-batched");
    contract_case("bij,bjk->bik", dt, 3, (int64_t[]){300, 4, 6}, 3, (int64_t[]){300, 6, 2});
    assert_string_equal(dspk__vk_gemm_last(), "small-batched");
    contract_case("ib,bj->bji", dt, 2, (int64_t[]){5, 100}, 2, (int64_t[]){100, 3});
    assert_string_equal(dspk__vk_gemm_last(), "small-batched");
  }
  /* Large matrices keep the tiles, 32x32 with a long K too; a single small
   * product too. */
  gemm_case(DSPK_F32, 3, (int64_t[]){2, 64, 32}, 3, (int64_t[]){2, 32, 64}, 0, 0, -1, NULL,
            1e-5);
  assert_string_not_equal(dspk__vk_gemm_last(), "small-batched");
  gemm_case(DSPK_F32, 3, (int64_t[]){2, 32, 256}, 3, (int64_t[]){2, 256, 32}, 0, 0, -1, NULL,
            1e-5);
  assert_string_not_equal(dspk__vk_gemm_last(), "small-batched");
  gemm_case(DSPK_F32, 2, (int64_t[]){3, 4}, 2, (int64_t[]){4, 5}, 0, 0, -1, NULL, 1e-5);
  assert_string_not_equal(dspk__vk_gemm_last(), "small-batched");
}

/* A long small-product batch goes to the device in pieces with a cancel
 * check between them: with pieces of 2^12 multiply-adds and a cancel that
 * comes (test hook) once the first piece ran, a contraction i,i->i of
 * 50,000 elements answers ECANCELED; without the cancel, the same pieces
 * give the exact result. */
static void t_gemm_small_cancel(void **state) {
  (void)state;
  char msg[512];
  int64_t n = 50000;
  struct htensor A = h_make(DSPK_F32, 1, &n, 1), B = h_make(DSPK_F32, 1, &n, 1);
  struct dspk__op op = {.kind = DSPK_OP_CONTRACT, .nin = 2};
  snprintf(op.u.contract.subscripts, sizeof op.u.contract.subscripts, "i,i->i");
  assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  assert_int_equal(VKB->alloc(D, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
  setenv("DSPK_VK_GEMM_SMALL_PIECE", "4096", 1);
  for (int cancel = 1; cancel >= 0; cancel--) {
    if (cancel)
      setenv("DSPK_VK_GEMM_CANCEL_AFTER", "1", 1);
    else
      unsetenv("DSPK_VK_GEMM_CANCEL_AFTER");
    atomic_store(&cancel_flag, 0);
    msg[0] = 0;
    struct dspk__opctx ctx = {.cancel = &cancel_flag, .errmsg = msg, .errmsg_len = sizeof msg};
    int r = VKB->run(D, &op, &ctx);
    assert_int_equal(VKB->sync(D), 0);
    if (cancel) {
      if (r != DSPK_ECANCELED || !strstr(msg, "canceled"))
        fail_msg("small-product contract with a cancel: %d %s", r, msg);
      continue;
    }
    assert_int_equal(r, 0);
    assert_string_equal(dspk__vk_gemm_last(), "small-batched");
    struct htensor C = h_make(DSPK_F32, 1, &n, 0);
    void *p = malloc((size_t)n * 4 + 16);
    assert_int_equal(VKB->read(D, op.out[0].mem, 0, p, (size_t)n * 4), 0);
    h_unpack(&C, p);
    free(p);
    for (int64_t i = 0; i < n; i++)
      if (creal(C.v[i]) != (double)(float)(creal(A.v[i]) * creal(B.v[i])))
        fail_msg("i,i->i in pieces: element %lld", (long long)i);
    h_free(&C);
  }
  unsetenv("DSPK_VK_GEMM_SMALL_PIECE");
  VKB->free(D, op.out[0].mem);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, op.in[1].mem);
  h_free(&A);
  h_free(&B);
}

/* Every gemm kernel candidate, forced through dspk__vk_gemm_force(), on
 * shapes that are multiples of every tile and shapes that are not, with
 * vec4-aligned and unaligned operands, each transposition, batches and a
 * C term; then the autotuner's choice is reported by dspk__vk_gemm_last(). */
static void t_gemm_cands(void **state) {
  (void)state;
  struct gcase {
    int64_t M, N, K;
    int ta, tb, batch, crank;
    size_t apad;
  } cs[] = {
      {128, 128, 32, 0, 0, 2, 2, 0}, /* full tiles, vec4, batch, C */
      {68, 132, 20, 0, 0, 1, -1, 0}, /* vec4, edge tiles */
      {37, 45, 29, 1, 1, 1, 1, 0},   /* scalar, edges, both transposed, C row */
      {64, 64, 48, 1, 0, 1, -1, 0},  /* A m-fast vec4 */
      {128, 128, 16, 0, 1, 1, 2, 0}, /* B k-fast vec4, C */
      {64, 64, 32, 0, 0, 1, -1, 4},  /* A one float off alignment: scalar A */
      {128, 128, 0, 0, 0, 1, 2, 0},  /* K = 0: beta * C only */
  };
  int nc = dspk__vk_gemm_ncands(), ran = 0, v2ran = 0;
  /* lavapipe states 32 KiB of shared memory but its shared memory is host
   * memory: let it run the larger tiles too, so every candidate is checked
   * here before a GPU runs it. */
  const char *dv = getenv("DSPK_VK_TEST_DEVICE");
  int sw = INFO[dv ? atoi(dv) : 0].software;
  if (sw)
    setenv("DSPK_VK_GEMM_NOLIMITS", "1", 1);
  for (int c = 0; c < nc; c++) {
    const char *name = dspk__vk_gemm_cand_name(c);
    assert_non_null(name);
    dspk__vk_gemm_force(c);
    int ok = 0;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
      const struct gcase *g = &cs[i];
      int64_t as[3], bs[2], cc[2];
      int ra = g->batch > 1 ? 3 : 2;
      if (ra == 3)
        as[0] = g->batch;
      as[ra - 2] = g->ta ? g->K : g->M;
      as[ra - 1] = g->ta ? g->M : g->K;
      bs[0] = g->tb ? g->N : g->K;
      bs[1] = g->tb ? g->K : g->N;
      cc[0] = g->crank == 1 ? g->N : g->M;
      cc[1] = g->N;
      char what[96];
      snprintf(what, sizeof what, "%s %lldx%lldx%lld case %d", name, (long long)g->M,
               (long long)g->N, (long long)g->K, (int)i);
      int r = gemm_try(ra, as, 2, bs, g->ta, g->tb, g->crank, cc, g->apad, what);
      if (r == 0) {
        assert_non_null(dspk__vk_gemm_last());
        assert_string_equal(dspk__vk_gemm_last(), name);
        ok++;
      }
    }
    /* A candidate runs every case or none (beyond the device's limits). */
    assert_true(ok == 0 || ok == (int)(sizeof cs / sizeof cs[0]));
    if (ok) {
      ran++;
      v2ran += strncmp(name, "v2", 2) == 0;
    } else {
      print_message("gemm candidate %s: beyond this device's limits, skipped\n", name);
    }
  }
  dspk__vk_gemm_force(-1);
  if (sw)
    unsetenv("DSPK_VK_GEMM_NOLIMITS");
  assert_true(ran >= nc / 2);
  assert_true(!sw || ran == nc);
  assert_true(v2ran >= 1);
  /* Large enough to be tuned: the winner is one of the candidates. */
  int64_t as[2] = {128, 1024}, bs[2] = {1024, 128};
  assert_int_equal(gemm_try(2, as, 2, bs, 0, 0, -1, NULL, 0, "tuned"), 0);
  assert_non_null(dspk__vk_gemm_last());
  print_message("gemm 128x128x1024 f32: autotuner chose %s\n", dspk__vk_gemm_last());
}

/* fir with the path forced (mode: 0 direct, 1..3 overlap-save ols-x4..x16,
 * -1 the normal choice) on device d: rows x n signal, k taps, against a
 * double-precision direct loop.  Returns the relative error (max abs diff
 * over max abs reference); *out gets the result when not NULL. */
static double fir_case(struct dspk__dev *d, dspk_dtype dt, int64_t rows, int64_t n, int64_t k,
                       int mode, struct htensor *out) {
  char msg[512];
  int64_t xs[2] = {rows, n}, hs[1] = {k};
  struct htensor X = h_make(dt, 2, xs, 1), Hh, got;
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  struct dspk__dev *save = D;
  Hh = h_make(dt, 1, hs, 1);
  D = d;
  assert_int_equal(h_upload(d, &X, dspk__dtype_size(dt) * 5, &op.in[0]), 0);
  assert_int_equal(h_upload(d, &Hh, 0, &op.in[1]), 0);
  dspk__vk_fir_force(mode);
  int r = h_run(d, &op, &got, msg, sizeof msg);
  dspk__vk_fir_force(-1);
  D = save;
  if (r)
    fail_msg("fir %s %lldx%lld k=%lld mode %d: %d %s", dspk__dtype_name(dt), (long long)rows,
             (long long)n, (long long)k, mode, r, msg);
  /* (one tap is H[0]*X exactly: the direct kernel, whatever is forced) */
  if (mode >= 0)
    assert_string_equal(dspk__vk_fir_last(),
                        mode == 0 || k == 1 ? "direct"
                        : mode == 1         ? "ols-x4"
                        : mode == 2         ? "ols-x8"
                                            : "ols-x16");
  double complex *want = calloc(X.n ? X.n : 1, sizeof *want);
  for (int64_t b = 0; b < rows; b++)
    for (int64_t i = 0; i < n; i++)
      for (int64_t t = 0; t < k && t <= i; t++)
        want[b * n + i] += Hh.v[t] * X.v[b * n + i - t];
  double e = h_relerr(&got, want, X.n);
  free(want);
  h_free(&X);
  h_free(&Hh);
  if (out)
    *out = got;
  else
    h_free(&got);
  return e;
}

/* fir's FFT (overlap-save) path forced in each of its block sizes and the
 * direct path, against the reference and against each other: lengths not
 * powers of two, batches of rows, a signal shorter than the filter, one
 * tap, a filter longer than a block's stride; every dtype the device has. */
static void t_fir_fft(void **state) {
  (void)state;
  static const int64_t cases[][3] = {{3, 777, 129}, {2, 50, 300}, {1, 513, 1},
                                     {1, 9000, 1500}, {5, 1, 7},   {2, 130, 130}};
  int nfused = 0;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    if ((dt == DSPK_F64 || dt == DSPK_C128) && !D->has_f64)
      continue;
    /* single precision: the direct sums and the transforms both round;
     * double: the transforms' twiddles decide */
    double tol = dt == DSPK_F32 || dt == DSPK_C64 ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      int64_t rows = cases[c][0], n = cases[c][1], k = cases[c][2];
      struct htensor ref, got;
      uint64_t seed = h_seed;
      double e0 = fir_case(D, dt, rows, n, k, 0, &ref);
      if (!(e0 <= tol))
        fail_msg("fir direct %s %lldx%lld k=%lld: rel err %g", dspk__dtype_name(dt),
                 (long long)rows, (long long)n, (long long)k, e0);
      /* every block size in single precision, one in double (the
       * transforms' plans cost most of the test's time on lavapipe) */
      int dbl = dt == DSPK_F64 || dt == DSPK_C128;
      for (int m = dbl ? 2 : 1; m <= (dbl ? 2 : 3); m++) {
        h_seed = seed;
        double e = fir_case(D, dt, rows, n, k, m, &got);
        double ed = h_relerr(&got, ref.v, ref.n);
        int fused = dspk__vk_fir_last_fused();
        if (!(e <= tol) || !(ed <= 2 * tol))
          fail_msg("fir ols mode %d%s %s %lldx%lld k=%lld: rel err %g (vs direct %g)", m,
                   fused ? " fused" : "", dspk__dtype_name(dt), (long long)rows, (long long)n,
                   (long long)k, e, ed);
        h_free(&got);
        if (!fused)
          continue;
        /* f32 ran fused into our fft kernels: the unfused path too */
        setenv("DSPK_VK_FIR_SK", "off", 1);
        h_seed = seed;
        e = fir_case(D, dt, rows, n, k, m, &got);
        unsetenv("DSPK_VK_FIR_SK");
        assert_false(dspk__vk_fir_last_fused());
        if (!(e <= tol))
          fail_msg("fir ols mode %d unfused %s %lldx%lld k=%lld: rel err %g", m,
                   dspk__dtype_name(dt), (long long)rows, (long long)n, (long long)k, e);
        h_free(&got);
        nfused++;
      }
      h_free(&ref);
    }
  }
  /* f32 blocks of every case fit our fft kernels */
  assert_true(nfused > 0);
  print_message("fir f32: %d cases ran fused into our fft kernels\n", nfused);
}

/* fir's FFT path keeps rows apart (the direct sum of a row never involves
 * another): rows of very different magnitude in one batch, each forced
 * block size, f32 fused into our fft kernels and not.  Rows: 0 zeros, 1
 * of order 1e30, 2 of order 1, 3 zeros, 4 of order 1e-20 (and more rows
 * of order 1 in some cases); a zero row must come out exactly zero, every
 * other within tol of its own largest output (the double-precision direct
 * sum).  The shapes give one block per row (rows paired across, were they
 * packed two rows to a transform), an odd and an even number of blocks;
 * every block size in single precision, one in double (as t_fir_fft: the
 * plans cost most of the time on lavapipe); each also with its blocks in
 * chunks of 3 (test hook DSPK_VK_FIR_CHUNK: blocks too many for one
 * maxStorageBufferRange go in chunks), which cross rows. */
static void t_fir_fft_rows(void **state) {
  (void)state;
  static const int64_t cases[][3] = {/* rows, n, k */
                                     {5, 1000, 900}, {6, 600, 599}, {5, 2000, 300},
                                     {7, 300, 1000}, {5, 5000, 200}};
  static const double scale[5] = {0, 1e30, 1, 0, 1e-20};
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    int sp = dt == DSPK_F32 || dt == DSPK_C64;
    if (!sp && !D->has_f64)
      continue;
    double tol = sp ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      for (int m = sp ? 1 : 2; m <= (sp ? 3 : 2); m++)
        for (int unfused = 0; unfused < 3; unfused++) {
          /* 1: f32 unfused, 2: blocks in chunks of 3 (DSPK_VK_FIR_CHUNK) */
          if (unfused == 1 && dt != DSPK_F32)
            continue;
          char msg[512];
          int64_t rows = cases[c][0], n = cases[c][1], k = cases[c][2];
          int64_t xs[2] = {rows, n}, hs[1] = {k};
          struct htensor X = h_make(dt, 2, xs, 1), Hh = h_make(dt, 1, hs, 1), got;
          struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
          for (int64_t i = 0; i < X.n; i++)
            X.v[i] *= i / n < 5 ? scale[i / n] : 1;
          if (unfused == 1)
            setenv("DSPK_VK_FIR_SK", "off", 1);
          if (unfused == 2)
            setenv("DSPK_VK_FIR_CHUNK", "3", 1);
          assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
          assert_int_equal(h_upload(D, &Hh, 0, &op.in[1]), 0);
          dspk__vk_fir_force(m);
          int r = h_run(D, &op, &got, msg, sizeof msg);
          dspk__vk_fir_force(-1);
          unsetenv("DSPK_VK_FIR_SK");
          unsetenv("DSPK_VK_FIR_CHUNK");
          if (r)
            fail_msg("fir rows %s %lldx%lld k=%lld mode %d: %d %s", dspk__dtype_name(dt),
                     (long long)rows, (long long)n, (long long)k, m, r, msg);
          assert_string_equal(dspk__vk_fir_last(), dspk__fir_path_names[m]);
          int fused = dspk__vk_fir_last_fused();
          assert_true(!unfused || !fused);
          for (int64_t b = 0; b < rows; b++) {
            double complex *want = calloc((size_t)n, sizeof *want);
            double big = 0, err = 0;
            int64_t nz = 0;
            for (int64_t i = 0; i < n; i++) {
              for (int64_t t = 0; t < k && t <= i; t++)
                want[i] += Hh.v[t] * X.v[b * n + i - t];
              big = fmax(big, cabs(want[i]));
              err = fmax(err, cabs(got.v[b * n + i] - want[i]));
              nz += got.v[b * n + i] != 0;
            }
            free(want);
            if (b < 5 && scale[b] == 0 ? nz != 0 : !(err <= tol * big))
              fail_msg("fir rows %s %lldx%lld k=%lld %s%s: row %lld (of order %g) has %lld "
                       "non-zero outputs, error %g of its largest %g",
                       dspk__dtype_name(dt), (long long)rows, (long long)n, (long long)k,
                       dspk__fir_path_names[m], fused ? " fused" : "", (long long)b,
                       b < 5 ? scale[b] : 1.0, (long long)nz, big > 0 ? err / big : err, big);
          }
          h_free(&got);
          h_free(&X);
          h_free(&Hh);
        }
  }
}

/* fir's FFT path keeps the blocks of one row apart as it keeps rows apart
 * (probe 15, B 1: a real row's blocks went two to a transform, so a sample
 * of 1e20 made the outputs of the next block, of order 100, wrong by 1e13
 * on lavapipe): one row of samples in [0.5, 1] with one of 1e20 (f32, c64)
 * or 1e200 (f64, c128) at index 100, every output within tol of the bound
 * of protocol.md's fir, eps log2(L) max|x| sum|h| with max|x| over the
 * samples of the output's own block (those from t - (k-1) - (S - 1 - j) to
 * t, j its place among the block's S outputs), against the double direct
 * sum; each block size of the dtype's precision, f32 fused and not. */
static void t_fir_fft_blocks(void **state) {
  (void)state;
  const int64_t n = 9000, k = 200;
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    int sp = dt == DSPK_F32 || dt == DSPK_C64;
    if (!sp && !D->has_f64)
      continue;
    double eps = sp ? 0x1p-24 : 0x1p-53, spike = sp ? (double)(float)1e20 : 1e200;
    for (int m = sp ? 1 : 2; m <= (sp ? 3 : 2); m++)
      for (int unfused = 0; unfused < 3; unfused++) {
        /* 1: f32 unfused, 2: blocks in chunks of 2 (DSPK_VK_FIR_CHUNK; the
         * 11, 5 and 3 blocks of modes 1-3 each end in a chunk of one: with
         * chunks of 3, mode 3's 3 blocks were one chunk, which an H100 ran
         * fused) */
        if (unfused == 1 && dt != DSPK_F32)
          continue;
        char msg[512];
        int64_t xs[2] = {1, n}, hs[1] = {k};
        struct htensor X = h_make(dt, 2, xs, 0), Hh = h_make(dt, 1, hs, 0), got;
        for (int64_t i = 0; i < n; i++)
          X.v[i] = h_cplx(dt) ? (0.75 + 0.25 * h_rand()) + I * (0.75 + 0.25 * h_rand())
                              : 0.75 + 0.25 * h_rand();
        for (int64_t i = 0; i < k; i++)
          Hh.v[i] = 0.75 + 0.25 * h_rand();
        if (sp)
          for (int64_t i = 0; i < n; i++)
            X.v[i] = (float)creal(X.v[i]) + I * (float)cimag(X.v[i]);
        for (int64_t i = 0; i < k && sp; i++)
          Hh.v[i] = (float)creal(Hh.v[i]);
        X.v[100] = spike;
        struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
        if (unfused == 1)
          setenv("DSPK_VK_FIR_SK", "off", 1);
        if (unfused == 2)
          setenv("DSPK_VK_FIR_CHUNK", "2", 1);
        assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
        assert_int_equal(h_upload(D, &Hh, 0, &op.in[1]), 0);
        dspk__vk_fir_force(m);
        int r = h_run(D, &op, &got, msg, sizeof msg);
        dspk__vk_fir_force(-1);
        unsetenv("DSPK_VK_FIR_SK");
        unsetenv("DSPK_VK_FIR_CHUNK");
        if (r)
          fail_msg("fir blocks %s mode %d: %d %s", dspk__dtype_name(dt), m, r, msg);
        assert_true(unfused != 2 || !dspk__vk_fir_last_fused());
        assert_string_equal(dspk__vk_fir_last(), dspk__fir_path_names[m]);
        int fused = dspk__vk_fir_last_fused();
        struct dspk__fir_geo g;
        assert_int_equal(dspk__fir_geometry(n, k, 1, m, 28, &g), 0);
        double hsum = 0;
        for (int64_t i = 0; i < k; i++)
          hsum += cabs(Hh.v[i]);
        for (int64_t t = 0; t < n; t++) {
          double complex want = 0;
          for (int64_t j = 0; j < k && j <= t; j++)
            want += Hh.v[j] * X.v[t - j];
          int64_t b0 = t / g.S * g.S - (k - 1); /* the block's first sample */
          double mx = 0;
          for (int64_t i = b0 < 0 ? 0 : b0; i < b0 + g.L && i < n; i++)
            mx = fmax(mx, cabs(X.v[i]));
          double bound = 8 * eps * g.lg * mx * hsum + 4 * eps * cabs(want) * k;
          if (!(cabs(got.v[t] - want) <= bound))
            fail_msg("fir blocks %s %s%s (L %lld, S %lld): y[%lld] = %g%+gi, want %g%+gi: "
                     "error %g above the bound %g of its block (max|x| %g)",
                     dspk__dtype_name(dt), dspk__fir_path_names[m], fused ? " fused" : "",
                     (long long)g.L, (long long)g.S, (long long)t, creal(got.v[t]),
                     cimag(got.v[t]), creal(want), cimag(want), cabs(got.v[t] - want), bound,
                     mx);
        }
        h_free(&got);
        h_free(&X);
        h_free(&Hh);
      }
  }
}

/* The direct fir kernel goes to the device in pieces with a cancel check
 * between them (probe 15, B 2: a fir of 2^23 taps over 9e6 samples, too
 * long for the FFT path's blocks on lavapipe, ran whole for more than 15
 * minutes, and neither its client's leaving nor SIGTERM stopped it): with
 * pieces of 2^16 multiply-adds and a cancel that comes (test hook) once
 * the second piece was submitted, 3 rows of 4000 samples with 300 taps
 * answer ECANCELED; without the cancel, the same pieces give the double
 * direct sum. */
static void t_fir_direct_cancel(void **state) {
  (void)state;
  char msg[512];
  int64_t xs[2] = {3, 4000}, hs[1] = {300};
  struct htensor X = h_make(DSPK_F32, 2, xs, 1), Hh = h_make(DSPK_F32, 1, hs, 1);
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  assert_int_equal(h_upload(D, &X, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &Hh, 0, &op.in[1]), 0);
  assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
  assert_int_equal(VKB->alloc(D, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
  setenv("DSPK_VK_FIR_PIECE", "65536", 1);
  dspk__vk_fir_force(0);
  for (int cancel = 1; cancel >= 0; cancel--) {
    if (cancel)
      setenv("DSPK_VK_FIR_CANCEL_AFTER", "2", 1);
    else
      unsetenv("DSPK_VK_FIR_CANCEL_AFTER");
    atomic_store(&cancel_flag, 0);
    msg[0] = 0;
    struct dspk__opctx ctx = {.cancel = &cancel_flag, .errmsg = msg, .errmsg_len = sizeof msg};
    int r = VKB->run(D, &op, &ctx);
    assert_int_equal(VKB->sync(D), 0);
    if (cancel) {
      if (r != DSPK_ECANCELED || !strstr(msg, "canceled"))
        fail_msg("direct fir with a cancel: %d %s", r, msg);
      continue;
    }
    if (r)
      fail_msg("direct fir in pieces: %d %s", r, msg);
    assert_string_equal(dspk__vk_fir_last(), "direct");
    struct htensor Y = h_make(DSPK_F32, 2, xs, 0);
    void *p = malloc((size_t)X.n * 4 + 16);
    assert_int_equal(VKB->read(D, op.out[0].mem, 0, p, (size_t)X.n * 4), 0);
    h_unpack(&Y, p);
    free(p);
    double complex *want = calloc((size_t)X.n, sizeof *want);
    for (int64_t row = 0; row < 3; row++)
      for (int64_t t = 0; t < 4000; t++)
        for (int64_t j = 0; j < 300 && j <= t; j++)
          want[row * 4000 + t] += Hh.v[j] * X.v[row * 4000 + t - j];
    double e = h_relerr(&Y, want, X.n);
    if (!(e <= 1e-5))
      fail_msg("direct fir in pieces: rel err %g", e);
    free(want);
    h_free(&Y);
  }
  dspk__vk_fir_force(-1);
  unsetenv("DSPK_VK_FIR_PIECE");
  VKB->free(D, op.out[0].mem);
  VKB->free(D, op.in[0].mem);
  VKB->free(D, op.in[1].mem);
  h_free(&X);
  h_free(&Hh);
}

/* fir on x and h (host tensors: rows x n and k values) with the path mode
 * forced (as fir_case), against a direct sum in double in the direct
 * kernel's order (component by component, no C complex multiply): the
 * non-finite outputs exactly where the reference has them, and the others
 * within tol of the largest finite output. */
static void fir_values_case(const char *what, dspk_dtype dt, int mode, const struct htensor *X,
                            const struct htensor *Hh, double tol) {
  char msg[512];
  int64_t rows = X->shape[0], n = X->shape[1], k = Hh->shape[0];
  struct htensor got;
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  assert_int_equal(h_upload(D, X, dspk__dtype_size(dt) * 3, &op.in[0]), 0);
  assert_int_equal(h_upload(D, Hh, 0, &op.in[1]), 0);
  dspk__vk_fir_force(mode);
  int r = h_run(D, &op, &got, msg, sizeof msg);
  dspk__vk_fir_force(-1);
  if (r)
    fail_msg("fir %s %s mode %d: %d %s", what, dspk__dtype_name(dt), mode, r, msg);
  if (mode > 0)
    assert_string_equal(dspk__vk_fir_last(), dspk__fir_path_names[mode]);
  const char *path = dspk__vk_fir_last();
  int fused = dspk__vk_fir_last_fused();
  double *want = calloc((size_t)(2 * X->n), sizeof *want), big = 0;
  for (int64_t b = 0; b < rows; b++)
    for (int64_t i = 0; i < n; i++) {
      double re = 0, im = 0;
      for (int64_t t = 0; t < k && t <= i; t++) {
        double hr = creal(Hh->v[t]), hi = cimag(Hh->v[t]);
        double xr = creal(X->v[b * n + i - t]), xi = cimag(X->v[b * n + i - t]);
        re += hr * xr - hi * xi;
        im += hr * xi + hi * xr;
      }
      want[2 * (b * n + i)] = re;
      want[2 * (b * n + i) + 1] = im;
    }
  int nonfinite = 0;
  for (int64_t i = 0; i < 2 * X->n; i++)
    if (isfinite(want[i]) && fabs(want[i]) > big)
      big = fabs(want[i]);
    else if (!isfinite(want[i]))
      nonfinite = 1;
  /* The overlap-save path's list of non-finite segments (vk_fir.c): the
   * repair's indirect dispatch (x, 1, 1) has workgroups exactly when a
   * segment is listed, and one is where the direct sum is non-finite. */
  if (strcmp(path, "direct") != 0) {
    uint32_t head[4];
    assert_int_equal(dspk__vk_fir_list_head(D, head), 0);
    if (head[1] != 1 || head[2] != 1 || !head[0] != !head[3] || (nonfinite && !head[3]))
      fail_msg("fir %s %s %s%s: the list's head is %u %u %u, %u listed", what,
               dspk__dtype_name(dt), path, fused ? " fused" : "", head[0], head[1], head[2],
               head[3]);
  }
  for (int64_t i = 0; i < 2 * X->n; i++) {
    if (!h_cplx(dt) && (i & 1))
      continue;
    double g = i & 1 ? cimag(got.v[i / 2]) : creal(got.v[i / 2]);
    if (!!isfinite(g) != !!isfinite(want[i]))
      fail_msg("fir %s %s %lldx%lld k=%lld %s%s: output (row %lld, sample %lld%s) is %g, the "
               "direct sum %g", what, dspk__dtype_name(dt), (long long)rows, (long long)n,
               (long long)k, path, fused ? " fused" : "", (long long)(i / 2 / n),
               (long long)(i / 2 % n), h_cplx(dt) ? (i & 1 ? " im" : " re") : "", g, want[i]);
    if (isfinite(want[i]) && !(fabs(g - want[i]) <= tol * (big > 1 ? big : 1)))
      fail_msg("fir %s %s %lldx%lld k=%lld %s%s: output %lld is %.9g, want %.9g", what,
               dspk__dtype_name(dt), (long long)rows, (long long)n, (long long)k, path,
               fused ? " fused" : "", (long long)i, g, want[i]);
  }
  free(want);
  h_free(&got);
}

/* fir's FFT path on a NaN or an Inf in x, a NaN in the last tap, and finite
 * data whose transforms overflow (3e38 times taps of 1e-6 in single
 * precision: sums of at most 9e34): every dtype the device has, the
 * overlap-save path forced in each block size (rows of one block and of
 * several; f32 fused into our fft kernels and not) and chosen (lavapipe's
 * heuristic: ols-x8 from 128 taps), and the repair with few workgroups;
 * each followed by finite data in the same workspace, which must list
 * nothing (the list cleared by the run itself). */
static void t_fir_fft_nonfinite(void **state) {
  (void)state;
  static const int64_t cases[][4] = {/* rows, n, k, mode */
                                     {2, 2000, 300, 1}, {2, 2000, 300, 3},
                                     {1, 9000, 300, 1}, {2, 3000, 300, -1}};
  for (int di = 0; di < 4; di++) {
    dspk_dtype dt = STD[di];
    int sp = dt == DSPK_F32 || dt == DSPK_C64, cx = h_cplx(dt);
    if (!sp && !D->has_f64)
      continue;
    double tol = sp ? 1e-5 : 1e-12;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      for (int v = 0; v < 4; v++)
        for (int off = 0; off < 4; off++) {
          if (off == 2 && dt != DSPK_F32)
            continue;
          int64_t rows = cases[c][0], n = cases[c][1], k = cases[c][2];
          int64_t xs[2] = {rows, n}, hs[1] = {k}, at = (rows - 1) * n + n / 4;
          struct htensor X = h_make(dt, 2, xs, 1), Hh = h_make(dt, 1, hs, 1);
          const char *what = "transforms overflow";
          if (v == 0) {
            what = "NaN in x"; /* in the last row, the others stay finite */
            X.v[at] = CMPLX(NAN, cimag(X.v[at]));
          } else if (v == 1) {
            what = "Inf in x";
            X.v[at] = cx ? CMPLX(creal(X.v[at]), INFINITY) : INFINITY;
          } else if (v == 2) {
            what = "NaN in the last tap";
            Hh.v[k - 1] = CMPLX(NAN, cimag(Hh.v[k - 1]));
          } else {
            double big = sp ? 3e38 : 1.7e308;
            for (int64_t i = 0; i < X.n; i++)
              X.v[i] = cx ? CMPLX(big, big) : big;
            for (int64_t i = 0; i < k; i++)
              Hh.v[i] = cx ? CMPLX(1e-6, 1e-6) : 1e-6;
          }
          /* off 1: the repair's workgroups take several segments each, the
           * taps in several dispatches; off 2: f32 not fused; off 3: the
           * blocks in chunks of 2 (DSPK_VK_FIR_CHUNK), the list cleared by
           * the first only */
          if (off == 1)
            setenv("DSPK_VK_FIR_FIX_GROUPS", "1", 1);
          if (off == 2)
            setenv("DSPK_VK_FIR_SK", "off", 1);
          if (off == 3)
            setenv("DSPK_VK_FIR_CHUNK", "2", 1);
          fir_values_case(what, dt, (int)cases[c][3], &X, &Hh, tol);
          unsetenv("DSPK_VK_FIR_FIX_GROUPS");
          if (off == 2)
            assert_false(dspk__vk_fir_last_fused());
          h_free(&X);
          h_free(&Hh);
          /* Finite data next, in the same workspace (f32 fused or not):
           * the run clears the list the last one left (no fill of its own),
           * so nothing is listed and the repair launches no workgroup. */
          if (v != 1 && off != 1) {
            uint32_t head[4];
            X = h_make(dt, 2, xs, 1);
            Hh = h_make(dt, 1, hs, 1);
            fir_values_case("finite after", dt, (int)cases[c][3], &X, &Hh, tol);
            if (strcmp(dspk__vk_fir_last(), "direct") != 0) {
              assert_int_equal(dspk__vk_fir_list_head(D, head), 0);
              assert_int_equal(head[0], 0);
              assert_int_equal(head[3], 0);
            }
            h_free(&X);
            h_free(&Hh);
          }
          unsetenv("DSPK_VK_FIR_SK");
          unsetenv("DSPK_VK_FIR_CHUNK");
        }
  }
}

/* The choice through the autotuner (forced to tune on this device, as a
 * hardware device would): a short filter stays direct without a tuning,
 * a long one is tuned, the result is right, and the decision is in the
 * cache under op "fir", layout "path", with the four candidates' hash;
 * a reopened device takes it from the cache. */
static void t_fir_tune(void **state) {
  (void)state;
  char path[] = "/tmp/dspk-vk-fir-tune-XXXXXX";
  assert_int_equal(h_cache_path(path), 0);
  struct dspk__cache *c;
  assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
  struct dspk__devenv env = {.cache = c};
  struct dspk__dev *d;
  char winner[64] = "";
  dspk__autotune_forget_all();
  dspk__vk_fir_tune_always(1);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(VKB->open(0, &env, &d), 0);
    double e = fir_case(d, DSPK_F32, 1, 20000, 16, -1, NULL);
    assert_true(e <= 1e-5);
    assert_string_equal(dspk__vk_fir_last(), "direct");
    unsigned timed = dspk__vk_fir_timed();
    e = fir_case(d, DSPK_F32, 2, 20000, 1000, -1, NULL);
    timed = dspk__vk_fir_timed() - timed;
    print_message("fir f32 2x20000, 1000 taps (round %d): %s, rel err %g, %u runs timed "
                  "by timestamps\n", round, dspk__vk_fir_last(), e, timed);
    assert_true(e <= 1e-5);
    /* The first round tunes: every run of the candidates is timed by the
     * device where its queue has timestamps, as lavapipe's has: a warm-up
     * and five samples for the first candidate, a warm-up and at least one
     * sample for each other (a candidate four times slower than the best
     * so far is cut after its first); the second takes the decision from
     * the cache. */
    if (round == 0 && dspk__vk_timestamps(d))
      assert_true(timed >= 6 + 3 * 2);
    else
      assert_int_equal(timed, 0);
    struct dspk__tune_key k = {.dev = dspk__vk_devid(d),
                               .op = "fir",
                               .shape = "n=2^16,row=2^15,k=2^10",
                               .dtypes = "f32",
                               .layout = "path",
                               .cands_hash = dspk__fir_tune_cands_hash()};
    char w[64];
    assert_int_equal(dspk__cache_tune_get(c, &k, w, sizeof w), 0);
    assert_string_equal(w, dspk__vk_fir_last());
    if (round == 0)
      snprintf(winner, sizeof winner, "%s", w);
    else
      assert_string_equal(w, winner);
    VKB->close(d);
    dspk__autotune_forget_all(); /* the second round reads the cache */
  }
  dspk__vk_fir_tune_always(0);
  dspk__cache_close(c);
  h_cache_unlink(path);
}

/* A long filter whose last tap is NaN, tuned on the task's own operands
 * (forced to tune, as on a hardware device): the tuner's samples skip the
 * repair of non-finite segments (dspk__fir_sampling), so the overlap-save
 * path, not the direct one it would cost as much as with the repair,
 * wins the shape class, and the task's own run repairs: the NaNs exactly
 * where the direct sum has them. */
static void t_fir_tune_nonfinite(void **state) {
  (void)state;
  char path[] = "/tmp/dspk-vk-fir-tunenf-XXXXXX";
  assert_int_equal(h_cache_path(path), 0);
  struct dspk__cache *c;
  assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
  struct dspk__devenv env = {.cache = c};
  struct dspk__dev *d, *save = D;
  int64_t xs[2] = {2, 20000}, hs[1] = {1000};
  struct htensor X = h_make(DSPK_F32, 2, xs, 1), Hh = h_make(DSPK_F32, 1, hs, 1);
  Hh.v[999] = NAN;
  dspk__autotune_forget_all();
  dspk__vk_fir_tune_always(1);
  assert_int_equal(VKB->open(0, &env, &d), 0);
  D = d;
  unsigned timed = dspk__vk_fir_timed(), repairs = dspk__vk_fir_repairs();
  fir_values_case("NaN in the last tap, tuned", DSPK_F32, -1, &X, &Hh, 1e-5);
  D = save;
  timed = dspk__vk_fir_timed() - timed;
  repairs = dspk__vk_fir_repairs() - repairs;
  print_message("fir f32 2x20000, 1000 taps, the last NaN: tuned to %s (%u samples timed, %u "
                "repairs)\n", dspk__vk_fir_last(), timed, repairs);
  /* the overlap-save samples ran without the repair, the task's run with
   * (where the tuner kept an overlap-save path: lavapipe does; a fast GPU
   * may find the direct sum of 1000 taps quicker, and needs no repair) */
  int direct = strcmp(dspk__vk_fir_last(), "direct") == 0, ts = dspk__vk_timestamps(d);
  VKB->close(d);
  assert_true(!ts || timed >= 6 + 3 * 2);
  assert_int_equal(repairs, direct ? 0 : 1);
  dspk__autotune_forget_all();
  dspk__vk_fir_tune_always(0);
  dspk__cache_close(c);
  h_cache_unlink(path);
  h_free(&X);
  h_free(&Hh);
}

/* A block freed twice (the second free a caller's mistake, which
 * backends/backend.h forbids): the second free is ignored, so the pool
 * never holds the block twice and the next two blocks of its size are
 * different ones.  Before, both frees put it in the pool's free list, the
 * next two blocks were the same memory, and the tensors uploaded into
 * them overwrote each other (probe 15: a harness that freed a contract's
 * inputs after h_run had freed them saw i,i->i give 4 for 1 * 2). */
static void t_free_twice(void **state) {
  (void)state;
  for (size_t n = 16384; n <= ((size_t)2 << 20); n *= 128) { /* a slab's slot, own memory */
    struct dspk__mem *m, *a, *b;
    assert_int_equal(VKB->alloc(D, n, &m), 0);
    VKB->free(D, m);
    VKB->free(D, m);
    assert_int_equal(VKB->sync(D), 0);
    assert_int_equal(VKB->alloc(D, n, &a), 0);
    assert_int_equal(VKB->alloc(D, n, &b), 0);
    if (a == b)
      fail_msg("a block of %zu bytes freed twice came back twice", n);
    uint32_t x = 1, y = 2, got = 0;
    assert_int_equal(VKB->write(D, a, 0, &x, 4), 0);
    assert_int_equal(VKB->write(D, b, 0, &y, 4), 0);
    assert_int_equal(VKB->read(D, a, 0, &got, 4), 0);
    assert_int_equal(got, 1);
    VKB->free(D, a);
    VKB->free(D, b);
  }
}

/* The inputs h_run freed, freed again, as that harness did. */
static void free_again(void) {
  for (int i = 0; i < h_nfreed; i++)
    VKB->free(D, h_freed[i]);
  h_nfreed = 0;
}

static void map_add_case(dspk_dtype dt, int64_t n) {
  char msg[512];
  struct htensor A = h_make(dt, 1, &n, 1), B = h_make(dt, 1, &n, 1), out;
  struct dspk__op op = {.kind = DSPK_OP_MAP, .nin = 2};
  op.u.map.fn = DSPK_MAP_ADD;
  assert_int_equal(h_upload(D, &A, 0, &op.in[0]), 0);
  assert_int_equal(h_upload(D, &B, 0, &op.in[1]), 0);
  int r = h_run(D, &op, &out, msg, sizeof msg);
  if (r)
    fail_msg("map add: %d %s", r, msg);
  double complex *want = calloc((size_t)n, sizeof *want);
  for (int64_t i = 0; i < n; i++)
    want[i] = A.v[i] + B.v[i];
  double e = h_relerr(&out, want, n);
  if (!(e <= h_tol(dt) * 4))
    fail_msg("map add %s of %lld: rel err %g", dspk__dtype_name(dt), (long long)n, e);
  free(want);
  h_free(&A);
  h_free(&B);
  h_free(&out);
}

/* Every op on blocks that earlier tasks' inputs had, of another dtype and
 * of the same or another size, each task's inputs freed a second time
 * before the next (as above): each result against its reference.  The
 * blocks are of one bucket (16 KiB, or 8 KiB and 16 KiB), so the next
 * task's blocks are those just freed. */
static void t_reuse_after_free(void **state) {
  (void)state;
  const dspk_dtype cx = D->has_f64 ? DSPK_C128 : DSPK_C64;
  const dspk_dtype rx = D->has_f64 ? DSPK_F64 : DSPK_F32;
  contract_case("i,i->i", DSPK_F32, 1, (int64_t[]){4096}, 1, (int64_t[]){4096});
  free_again();
  contract_case("i,i->i", DSPK_C64, 1, (int64_t[]){2048}, 1, (int64_t[]){2048});
  free_again();
  contract_case("i,i->i", DSPK_F32, 1, (int64_t[]){4000}, 1, (int64_t[]){4000});
  free_again();
  map_add_case(cx, 16384 / dspk__dtype_size(cx));
  free_again();
  map_add_case(DSPK_F32, 4096);
  free_again();
  gemm_case(rx, 2, (int64_t[]){32, 4096 / 32 / (int64_t)dspk__dtype_size(rx) * 4}, 2,
            (int64_t[]){4096 / 32 / (int64_t)dspk__dtype_size(rx) * 4, 32}, 0, 0, -1, NULL,
            rx == DSPK_F64 ? 1e-12 : 1e-5);
  free_again();
  gemm_case(DSPK_F32, 2, (int64_t[]){64, 64}, 2, (int64_t[]){64, 64}, 1, 0, -1, NULL, 1e-5);
  free_again();
  int64_t xs[2] = {1, 2045}, hs[1] = {2048};
  struct htensor X = h_make(DSPK_C64, 2, xs, 1), Hh = h_make(DSPK_C64, 1, hs, 1);
  fir_values_case("on reused blocks", DSPK_C64, -1, &X, &Hh, 1e-4);
  free_again();
  h_free(&X);
  h_free(&Hh);
  int64_t rs[2] = {64, 64};
  X = h_make(DSPK_F32, 2, rs, 1);
  reduce_check(&X, DSPK_REDUCE_SUM, 1u, 1e-5);
  free_again();
  h_free(&X);
  map_add_case(DSPK_C64, 2048);
  free_again();
  if (dspk__vk_fft_built)
    fft_oop_case(DSPK_C64, 2048, 1, 0);
}

int main(int argc, char **argv) {
  /* The child the device's compile_exe names (setup, t_raw_owner). */
  if (argc == 3 && strcmp(argv[1], "--kernel-compile") == 0)
    return dspk__kernel_compile_main(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_probe),     cmocka_unit_test(t_caps),
      cmocka_unit_test(t_memory),
      cmocka_unit_test(t_import_host), cmocka_unit_test(t_host_register),
      cmocka_unit_test(t_map),       cmocka_unit_test(t_reduce),
      cmocka_unit_test(t_reduce_small_addends),
      cmocka_unit_test(t_fir),       cmocka_unit_test(t_fir_fft),
      cmocka_unit_test(t_fir_fft_rows), cmocka_unit_test(t_fir_fft_blocks),
      cmocka_unit_test(t_fir_direct_cancel), cmocka_unit_test(t_contract_redo_limit),
      cmocka_unit_test(t_free_twice), cmocka_unit_test(t_reuse_after_free),
      cmocka_unit_test(t_fir_fft_nonfinite), cmocka_unit_test(t_fir_tune_nonfinite),
      cmocka_unit_test(t_fir_tune),  cmocka_unit_test(t_gemm),
      cmocka_unit_test(t_contract),  cmocka_unit_test(t_long_loops),
      cmocka_unit_test(t_fir_long_direct),
      cmocka_unit_test(t_dispatch_split), cmocka_unit_test(t_gemm_cancel),
      cmocka_unit_test(t_fft),
      cmocka_unit_test(t_fft_oop),   cmocka_unit_test(t_fft_buffers),
      cmocka_unit_test(t_fft_guard),
      cmocka_unit_test_teardown(t_fft_tune, unset_tune),
      cmocka_unit_test_teardown(t_fft_inplace, unset_tune),
      cmocka_unit_test_teardown(t_fft_cands, unset_tune),
      cmocka_unit_test_teardown(t_fft_sk, unset_tune),
      cmocka_unit_test(t_raw_glsl),
      cmocka_unit_test(t_raw_len0),
      cmocka_unit_test(t_raw_zero_init),
      cmocka_unit_test(t_raw_pad_zero), cmocka_unit_test(t_raw_pad_import),
      cmocka_unit_test(t_raw_bounded),
      cmocka_unit_test(t_raw_oob_private),
      cmocka_unit_test(t_raw_wrap),
      cmocka_unit_test(t_raw_misaligned),
      cmocka_unit_test(t_raw_caps),
      cmocka_unit_test(t_spv_zero_init),
      cmocka_unit_test(t_raw_spirv), cmocka_unit_test(t_raw_spirv_valid),
      cmocka_unit_test(t_spv_spec_limits),
      cmocka_unit_test(t_raw_pc_matrix), cmocka_unit_test(t_raw_refused_named),
      cmocka_unit_test(t_spv_size_over),
      cmocka_unit_test(t_raw_error),
      cmocka_unit_test(t_raw_owner), cmocka_unit_test(t_spv_mark),
      cmocka_unit_test(t_raw_compile_limits),
      cmocka_unit_test(t_cache_restart),
      cmocka_unit_test(t_raw_oob_cached),
      cmocka_unit_test(t_gemm_cands),
      cmocka_unit_test(t_gemm_small),
      cmocka_unit_test(t_gemm_small_cancel),
  };
  /* DSPK_VK_TEST_FILTER=t_fir* runs only the matching tests (by hand). */
  if (getenv("DSPK_VK_TEST_FILTER"))
    cmocka_set_test_filter(getenv("DSPK_VK_TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
