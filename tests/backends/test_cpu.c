/*
 * The cpu backend driven directly through its ops table (probe, open, alloc,
 * write, run, read, close), every op and dtype on random shapes from a fixed
 * seed, each checked against a naive double-precision loop written here:
 * matmul loops for gemm, a direct DFT for fft, direct convolution for fir
 * (both the direct and the FFT path, forced), einsum loops for contract,
 * plain loops for reduce and map.  Tolerances scale with the problem size
 * (number of terms summed, log of the transform length).
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/cpu/cpu.h"

static const struct dspk__backend *be = &dspk__backend_cpu;
static struct dspk__dev *dev;
static char errmsg[256];
static atomic_int cancel_flag;
static struct dspk__opctx ctx = {.cancel = &cancel_flag, .errmsg = errmsg,
                                 .errmsg_len = sizeof errmsg};

/* ---- random numbers (fixed seed) --------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int irand(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }
static double urand(void) { return (double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1; }

/* ---- tensors ------------------------------------------------------------ */

static int is_cplx(dspk_dtype dt) { return dspk__dtype_is_complex(dt); }
static int W(dspk_dtype dt) { return is_cplx(dt) ? 2 : 1; }
static double eps(dspk_dtype dt) {
  return (dt == DSPK_F64 || dt == DSPK_C128) ? 2.2e-16 : 1.2e-7;
}

/* Values as the device stores them (rounded to the dtype). */
static double roundto(dspk_dtype dt, double v) {
  return (dt == DSPK_F32 || dt == DSPK_C64) ? (double)(float)v : v;
}

static void shape_set(struct dspk__tensor *t, dspk_dtype dt, int rank,
                      const int64_t *shape) {
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  for (int i = 0; i < rank; i++)
    t->shape[i] = shape[i];
}

/* Fills a tensor with random values in [-1,1) (also returned in *vals as
 * doubles, interleaved for complex; caller frees) and places it on the
 * device at a random element offset inside a bigger block. */
static void put_vals(struct dspk__tensor *t, const double *v);
static double *put_random(struct dspk__tensor *t) {
  int64_t n = dspk__tensor_numel(t) * W(t->dtype);
  double *v = malloc(sizeof(double) * (size_t)(n + 1));
  assert_non_null(v);
  for (int64_t i = 0; i < n; i++)
    v[i] = roundto(t->dtype, urand());
  put_vals(t, v);
  return v;
}

/* Places a tensor holding the values v (interleaved for complex) on the
 * device at a random element offset inside a bigger block. */
static void put_vals(struct dspk__tensor *t, const double *v) {
  int64_t n = dspk__tensor_numel(t) * W(t->dtype);
  size_t es = dspk__dtype_size(t->dtype);
  size_t off = (size_t)irand(0, 3) * es;
  assert_int_equal(be->alloc(dev, off + dspk__tensor_nbytes(t), &t->mem), 0);
  t->offset = off;
  char *buf = malloc(dspk__tensor_nbytes(t) + 16);
  assert_non_null(buf);
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype == DSPK_F32 || t->dtype == DSPK_C64) {
      float f = (float)v[i];
      memcpy(buf + i * 4, &f, 4);
    } else {
      memcpy(buf + i * 8, &v[i], 8);
    }
  }
  assert_int_equal(be->write(dev, t->mem, off, buf, dspk__tensor_nbytes(t)), 0);
  free(buf);
}

/* Reads a tensor back as doubles (interleaved for complex; caller frees). */
static double *get(const struct dspk__tensor *t) {
  int64_t n = dspk__tensor_numel(t) * W(t->dtype);
  size_t nb = dspk__tensor_nbytes(t);
  char *buf = malloc(nb + 16);
  double *v = malloc(sizeof(double) * (size_t)(n + 1));
  assert_non_null(buf);
  assert_non_null(v);
  assert_int_equal(be->read(dev, t->mem, t->offset, buf, nb), 0);
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype == DSPK_F32 || t->dtype == DSPK_C64) {
      float f;
      memcpy(&f, buf + i * 4, 4);
      v[i] = f;
    } else {
      memcpy(&v[i], buf + i * 8, 8);
    }
  }
  free(buf);
  return v;
}

/* Validates op, places its outputs (at a random offset) and runs it. */
static int run_op(struct dspk__op *op) {
  char msg[256];
  int rc = dspk__op_infer(op, msg, sizeof msg);
  if (rc)
    fail_msg("infer: %s", msg);
  for (int i = 0; i < op->nout; i++) {
    struct dspk__tensor *o = &op->out[i];
    size_t off = (size_t)irand(0, 2) * dspk__dtype_size(o->dtype);
    assert_int_equal(be->alloc(dev, off + dspk__tensor_nbytes(o), &o->mem), 0);
    o->offset = off;
  }
  errmsg[0] = 0;
  rc = be->run(dev, op, &ctx);
  struct dspk__fence *f;
  assert_int_equal(be->fence_record(dev, &f), 0);
  assert_int_equal(be->fence_wait(dev, f), 0);
  assert_int_equal(be->fence_query(dev, f), 1);
  be->fence_destroy(dev, f);
  return rc;
}

static void free_op(struct dspk__op *op) {
  for (int i = 0; i < op->nin; i++)
    be->free(dev, op->in[i].mem);
  for (int i = 0; i < op->nout; i++)
    be->free(dev, op->out[i].mem);
}

/* Fails with a description when |got - want| > tol anywhere. */
static void compare(const char *what, const double *got, const double *want,
                    int64_t n, double tol) {
  double worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(got[i] - want[i]);
    if (!(d <= worst) || isnan(got[i]) != isnan(want[i])) {
      worst = isnan(d) ? INFINITY : d;
      at = i;
    }
  }
  if (at >= 0 && !(worst <= tol))
    fail_msg("%s: element %lld is %.9g, want %.9g (err %.3g > tol %.3g)", what,
             (long long)at, got[at], want[at], worst, tol);
}

/* ---- setup -------------------------------------------------------------- */

static int setup(void **state) {
  (void)state;
  struct dspk__devinfo info[2];
  char why[128] = "";
  if (be->probe(info, 2, why, sizeof why) != 1)
    return -1;
  return be->open(0, NULL, &dev);
}

static int teardown(void **state) {
  (void)state;
  struct dspk__devstats st;
  be->stats(dev, &st);
  be->close(dev);
  dev = NULL;
  be->close(NULL); /* accepts NULL */
  return st.pool_bytes_in_use == 0 ? 0 : -1;
}

static void test_probe_memory(void **state) {
  (void)state;
  struct dspk__devinfo info[1];
  char why[64] = "";
  assert_int_equal(be->probe(info, 1, why, sizeof why), 1);
  assert_true(strncmp(info[0].name, "cpu (", 5) == 0);
  assert_string_equal(info[0].type, "cpu");
  assert_true(info[0].memory > 0);
  struct dspk__dev *d2;
  assert_int_equal(be->open(1, NULL, &d2), DSPK_ENODEV);

  struct dspk__mem *m;
  assert_int_equal(be->alloc(dev, 0, &m), 0);
  be->free(dev, m);
  assert_int_equal(be->alloc(dev, 100, &m), 0);
  assert_int_equal((uintptr_t)m->ptr % 64, 0);
  char src[100], dst[100];
  for (int i = 0; i < 100; i++)
    src[i] = (char)i;
  assert_int_equal(be->write(dev, m, 0, src, 100), 0);
  assert_int_equal(be->write(dev, m, 50, src, 51), DSPK_ERANGE);
  assert_int_equal(be->write(dev, m, 101, src, 0), DSPK_ERANGE);
  assert_int_equal(be->read(dev, m, 0, dst, 100), 0);
  assert_memory_equal(src, dst, 100);
  assert_int_equal(be->read(dev, m, 99, dst, 2), DSPK_ERANGE);
  assert_int_equal(be->sync(dev), 0);
  be->free(dev, m);
  be->free(dev, NULL);
}

/* ---- gemm --------------------------------------------------------------- */

/* Broadcast offset (in elements) of batch index idx[0..nb) into a tensor
 * whose leading rank-2 dims are right-aligned to the output's. */
static int64_t bcast_off(const struct dspk__tensor *t, int ro, const int64_t *idx,
                         int64_t mat) {
  int64_t off = 0, s = mat;
  for (int i = t->rank - 3; i >= 0; i--) {
    int io = i + (ro - t->rank);
    if (t->shape[i] != 1)
      off += idx[io] * s;
    s *= t->shape[i];
  }
  return off;
}

static void gemm_case(dspk_dtype dt, int with_c) {
  int ta = irand(0, 1), tb = irand(0, 1);
  int64_t M = irand(1, 40), N = irand(1, 40), K = irand(0, 50);
  int nbat = irand(0, 2);
  int64_t bshape[2] = {irand(1, 3), irand(1, 3)};
  int64_t sa[4], sb[4];
  int ra = 2 + irand(0, nbat), rb = 2 + irand(0, nbat);
  if (ra < 2 + nbat && rb < 2 + nbat)
    ra = 2 + nbat;
  for (int i = 0; i < ra - 2; i++) {
    int64_t d = bshape[i + (nbat - (ra - 2))];
    sa[i] = irand(0, 3) == 0 ? 1 : d;
  }
  for (int i = 0; i < rb - 2; i++) {
    int64_t d = bshape[i + (nbat - (rb - 2))];
    sb[i] = irand(0, 3) == 0 ? 1 : d;
  }
  sa[ra - 2] = ta ? K : M;
  sa[ra - 1] = ta ? M : K;
  sb[rb - 2] = tb ? N : K;
  sb[rb - 1] = tb ? K : N;
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_GEMM;
  op.nin = with_c ? 3 : 2;
  shape_set(&op.in[0], dt, ra, sa);
  shape_set(&op.in[1], dt, rb, sb);
  op.u.gemm.trans_a = ta;
  op.u.gemm.trans_b = tb;
  op.u.gemm.alpha = irand(0, 1) ? 1.0 : urand() * 2;
  op.u.gemm.beta = with_c ? urand() * 2 : 0;
  char msg[200];
  /* Output shape first, to draw a broadcastable C. */
  struct dspk__op probe = op;
  probe.nin = 2;
  probe.u.gemm.beta = 0; /* a beta without C is EINVAL */
  assert_int_equal(dspk__op_infer(&probe, msg, sizeof msg), 0);
  const struct dspk__tensor *po = &probe.out[0];
  if (with_c) {
    int rc = irand(1, po->rank);
    int64_t sc[DSPK_MAX_RANK];
    for (int i = 0; i < rc; i++) {
      int64_t d = po->shape[i + (po->rank - rc)];
      sc[i] = irand(0, 2) == 0 ? 1 : d;
    }
    shape_set(&op.in[2], dt, rc, sc);
  }
  double *A = put_random(&op.in[0]), *B = put_random(&op.in[1]);
  double *C = with_c ? put_random(&op.in[2]) : NULL;
  assert_int_equal(run_op(&op), 0);
  const struct dspk__tensor *O = &op.out[0];
  double *got = get(O);
  int64_t total = dspk__tensor_numel(O), nb = total / (M * N);
  double *want = calloc((size_t)total + 1, sizeof(double));
  int ro = O->rank;
  int64_t idx[DSPK_MAX_RANK] = {0};
  for (int64_t b = 0; b < nb; b++) {
    int64_t oa = bcast_off(&op.in[0], ro, idx, M * K);
    int64_t ob = bcast_off(&op.in[1], ro, idx, K * N);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
          double a = A[oa + (ta ? k * M + i : i * K + k)];
          double bv = B[ob + (tb ? j * K + k : k * N + j)];
          s += a * bv;
        }
        double c = 0;
        if (with_c) {
          /* C's element for output (idx, i, j), broadcasting. */
          const struct dspk__tensor *Ct = &op.in[2];
          int64_t full[DSPK_MAX_RANK];
          for (int d = 0; d < ro - 2; d++)
            full[d] = idx[d];
          full[ro - 2] = i;
          full[ro - 1] = j;
          int64_t off = 0, st = 1;
          for (int d = Ct->rank - 1; d >= 0; d--) {
            int io = d + (ro - Ct->rank);
            if (Ct->shape[d] != 1)
              off += full[io] * st;
            st *= Ct->shape[d];
          }
          c = C[off];
        }
        want[b * M * N + i * N + j] = op.u.gemm.alpha * s + op.u.gemm.beta * c;
      }
    for (int d = ro - 3; d >= 0; d--) {
      if (++idx[d] < O->shape[d])
        break;
      idx[d] = 0;
    }
  }
  char what[96];
  snprintf(what, sizeof what, "gemm %s M=%lld N=%lld K=%lld ta=%d tb=%d C=%d",
           dspk__dtype_name(dt), (long long)M, (long long)N, (long long)K, ta, tb,
           with_c);
  compare(what, got, want, total, 8 * eps(dt) * (double)(K + 4) * 4);
  free(A);
  free(B);
  free(C);
  free(got);
  free(want);
  free_op(&op);
}

static void test_gemm(void **state) {
  (void)state;
  for (int t = 0; t < 40; t++) {
    gemm_case(DSPK_F32, t % 3 == 0);
    gemm_case(DSPK_F64, t % 3 == 1);
  }
}

/* f16 and bf16 inputs with small integers (exact in both) give f32. */
static void test_gemm_half(void **state) {
  (void)state;
  for (int h = 0; h < 2; h++) {
    dspk_dtype dt = h ? DSPK_BF16 : DSPK_F16;
    int64_t M = 5, K = 7, N = 3;
    struct dspk__op op;
    memset(&op, 0, sizeof op);
    op.kind = DSPK_OP_GEMM;
    op.nin = 2;
    shape_set(&op.in[0], dt, 2, (int64_t[]){M, K});
    shape_set(&op.in[1], dt, 2, (int64_t[]){K, N});
    op.u.gemm.alpha = 1;
    double A[35], B[21];
    uint16_t ha[35], hb[21];
    for (int i = 0; i < 35; i++) {
      A[i] = irand(-8, 8);
      float f = (float)A[i];
      uint32_t bits;
      memcpy(&bits, &f, 4);
      if (h) {
        ha[i] = (uint16_t)(bits >> 16);
      } else { /* small integers: exact f16 by exponent rebias */
        uint32_t e = (bits >> 23) & 0xff, s = bits >> 31, m = bits & 0x7fffff;
        ha[i] = f == 0 ? (uint16_t)(s << 15)
                       : (uint16_t)(s << 15 | (e - 127 + 15) << 10 | m >> 13);
      }
    }
    for (int i = 0; i < 21; i++) {
      B[i] = irand(-8, 8);
      float f = (float)B[i];
      uint32_t bits;
      memcpy(&bits, &f, 4);
      uint32_t e = (bits >> 23) & 0xff, s = bits >> 31, m = bits & 0x7fffff;
      hb[i] = h ? (uint16_t)(bits >> 16)
                : f == 0 ? (uint16_t)(s << 15)
                         : (uint16_t)(s << 15 | (e - 127 + 15) << 10 | m >> 13);
    }
    assert_int_equal(be->alloc(dev, sizeof ha, &op.in[0].mem), 0);
    assert_int_equal(be->alloc(dev, sizeof hb, &op.in[1].mem), 0);
    be->write(dev, op.in[0].mem, 0, ha, sizeof ha);
    be->write(dev, op.in[1].mem, 0, hb, sizeof hb);
    assert_int_equal(run_op(&op), 0);
    assert_int_equal(op.out[0].dtype, DSPK_F32);
    double *got = get(&op.out[0]), want[15];
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        want[i * N + j] = 0;
        for (int k = 0; k < K; k++)
          want[i * N + j] += A[i * K + k] * B[k * N + j];
      }
    compare(h ? "gemm bf16" : "gemm f16", got, want, 15, 0);
    free(got);
    free_op(&op);
  }
}

/* ---- fft ---------------------------------------------------------------- */

static void fft_case(dspk_dtype dt, int inverse, int64_t n, int64_t rows) {
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  op.u.fft.inverse = inverse;
  int64_t shape[3] = {rows, n};
  int rank = 2;
  if (rows == 1 && irand(0, 1)) {
    shape[0] = n;
    rank = 1;
  }
  shape_set(&op.in[0], dt, rank, shape);
  double *x = put_random(&op.in[0]);
  assert_int_equal(run_op(&op), 0);
  double *got = get(&op.out[0]);
  int cx = is_cplx(dt);
  int64_t on = cx ? n : n / 2 + 1;
  double *want = malloc(sizeof(double) * (size_t)(2 * on * rows));
  double sign = inverse ? 1 : -1, peak = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < on; k++) {
      double re = 0, im = 0;
      for (int64_t j = 0; j < n; j++) {
        double xr = cx ? x[2 * (r * n + j)] : x[r * n + j];
        double xi = cx ? x[2 * (r * n + j) + 1] : 0;
        double a = sign * 2 * M_PI * (double)((j * k) % n) / (double)n;
        re += xr * cos(a) - xi * sin(a);
        im += xr * sin(a) + xi * cos(a);
      }
      if (inverse) {
        re /= (double)n;
        im /= (double)n;
      }
      want[2 * (r * on + k)] = re;
      want[2 * (r * on + k) + 1] = im;
      peak = fmax(peak, fmax(fabs(re), fabs(im)));
    }
  char what[80];
  snprintf(what, sizeof what, "fft %s%s n=%lld rows=%lld", dspk__dtype_name(dt),
           inverse ? " inverse" : "", (long long)n, (long long)rows);
  /* FFT rounding grows with log2(n), relative to the largest output. */
  compare(what, got, want, 2 * on * rows,
          64 * eps(dt) * (log2((double)n) + 1) * fmax(peak, 1e-300));
  free(x);
  free(got);
  free(want);
  free_op(&op);
}

static void test_fft(void **state) {
  (void)state;
  static const int64_t lens[] = {1, 2, 7, 16, 97, 128, 210, 256, 331, 1000};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    int64_t rows = irand(1, 4);
    fft_case(DSPK_C64, 0, lens[i], rows);
    fft_case(DSPK_C128, 0, lens[i], rows);
    fft_case(DSPK_C64, 1, lens[i], rows);
    fft_case(DSPK_C128, 1, lens[i], rows);
    fft_case(DSPK_F32, 0, lens[i], rows);
    fft_case(DSPK_F64, 0, lens[i], rows);
  }
}

/* Rows of subnormal values (integers of up to 700 units of the smallest
 * subnormal) between a row of the same integers as normal values, forward
 * and inverse, real and complex, out of place and in place (the output the
 * input's own memory: the rows are scaled before the transform there):
 * within half a unit of a long-double DFT of the integers, plus the
 * transform's rounding at the row's scale (protocol.md, fft row).  Before
 * cpu:0 scaled such rows the forward error was 2 to 70 units here. */
static void test_fft_subnormal(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  static const int64_t lens[] = {16, 97, 1000};
  for (int d = 0; d < 4; d++)
    for (int li = 0; li < 3; li++)
      for (int mode = 0; mode < 4; mode++) { /* bit 0 inverse, bit 1 in place */
        dspk_dtype dt = dts[d];
        int w = W(dt), sp = dt == DSPK_F32 || dt == DSPK_C64, inverse = mode & 1;
        if (w == 1 && mode)
          continue; /* real X: forward, out of place only */
        int64_t n = lens[li], rows = 3, on = w == 2 ? n : n / 2 + 1;
        int ue = sp ? -149 : -1074;
        double *x = malloc(sizeof(double) * (size_t)(rows * n * w));
        double *ints = malloc(sizeof(double) * (size_t)(rows * n * w));
        assert_non_null(x);
        assert_non_null(ints);
        for (int64_t i = 0; i < rows * n * w; i++) {
          ints[i] = (double)irand(-700, 700);
          x[i] = ldexp(ints[i], i / (n * w) == 1 ? 0 : ue);
        }
        struct dspk__op op;
        memset(&op, 0, sizeof op);
        op.kind = DSPK_OP_FFT;
        op.nin = 1;
        op.u.fft.inverse = inverse;
        shape_set(&op.in[0], dt, 2, (int64_t[]){rows, n});
        put_vals(&op.in[0], x);
        int rc;
        if (mode & 2) {
          char msg[256];
          assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
          op.out[0].mem = op.in[0].mem; /* in place */
          op.out[0].offset = op.in[0].offset;
          rc = be->run(dev, &op, &ctx);
        } else {
          rc = run_op(&op);
        }
        assert_int_equal(rc, 0);
        double *got = get(&op.out[0]);
        double u = sp ? 0x1p-24 : 0x1p-53, sign = inverse ? 1 : -1;
        for (int64_t r = 0; r < rows; r++) {
          long double *want = malloc(sizeof(long double) * (size_t)(2 * on));
          assert_non_null(want);
          long double big = 0;
          for (int64_t k = 0; k < on; k++) {
            long double re = 0, im = 0;
            for (int64_t j = 0; j < n; j++) {
              long double a = sign * 2 * 3.14159265358979323846264338327950288L *
                              (long double)((j * k) % n) / (long double)n;
              long double xr = ints[(r * n + j) * w], xi = w == 2 ? ints[(r * n + j) * w + 1] : 0;
              re += xr * cosl(a) - xi * sinl(a);
              im += xr * sinl(a) + xi * cosl(a);
            }
            want[2 * k] = inverse ? re / n : re;
            want[2 * k + 1] = inverse ? im / n : im;
            big = fmaxl(big, fmaxl(fabsl(want[2 * k]), fabsl(want[2 * k + 1])));
          }
          /* in units of the row's scale (the smallest subnormal, or 1) */
          int e = r == 1 ? 0 : -ue;
          double tol = r == 1 ? 64 * u * log2((double)n) * (double)big
                              : 0.5 + 2 * u * log2((double)n) * (double)big;
          for (int64_t k = 0; k < 2 * on; k++) {
            long double g = ldexpl((long double)got[r * 2 * on + k], e);
            if (!(fabsl(g - want[k]) <= tol))
              fail_msg("fft %s%s%s n=%lld row %lld (%s): output %lld%s is %.3Lf, want %.3Lf "
                       "(units of the row's scale; tol %.2f)",
                       dspk__dtype_name(dt), inverse ? " inverse" : "",
                       mode & 2 ? " in place" : "", (long long)n, (long long)r,
                       r == 1 ? "normal" : "subnormal", (long long)(k / 2), k % 2 ? " im" : " re",
                       g, want[k], tol);
          }
          free(want);
        }
        free(got);
        free(x);
        free(ints);
        if (mode & 2)
          op.out[0].mem = NULL; /* the input's, freed with it */
        free_op(&op);
      }
}

/* A second identical transform reuses the cached plan. */
static void test_fft_plan_reuse(void **state) {
  (void)state;
  uint64_t made = 0, hits = 0;
  for (int i = 0; i < 4; i++) {
    if (i == 1) { /* the first run planned; later ones reuse */
      made = dev->plans_made;
      hits = dev->plan_hits;
    }
    struct dspk__op op;
    memset(&op, 0, sizeof op);
    op.kind = DSPK_OP_FFT;
    op.nin = 1;
    shape_set(&op.in[0], DSPK_C64, 2, (int64_t[]){3, 512});
    assert_int_equal(be->alloc(dev, dspk__tensor_nbytes(&op.in[0]), &op.in[0].mem), 0);
    memset(op.in[0].mem->ptr, 0, dspk__tensor_nbytes(&op.in[0]));
    char msg[128];
    assert_int_equal(dspk__op_infer(&op, msg, sizeof msg), 0);
    assert_int_equal(be->alloc(dev, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
    assert_int_equal(be->run(dev, &op, &ctx), 0);
    free_op(&op);
  }
  assert_int_equal(dev->plans_made, made);
  assert_true(dev->plan_hits >= hits + 3);
}

/* Two devices planning and running transforms at once from two threads:
 * FFTW's planner is guarded by the backend's process-wide lock. */
static void *fft_thread(void *arg) {
  struct dspk__dev *d;
  intptr_t bad = 0;
  if (be->open(0, NULL, &d))
    return (void *)1;
  for (int it = 0; it < 30; it++) {
    int n = 8 + 3 * it + (int)(intptr_t)arg;
    struct dspk__op op;
    memset(&op, 0, sizeof op);
    op.kind = DSPK_OP_FFT;
    op.nin = 1;
    shape_set(&op.in[0], DSPK_C128, 1, (int64_t[]){n});
    char msg[128], em[128];
    struct dspk__opctx c = {.errmsg = em, .errmsg_len = sizeof em};
    if (dspk__op_infer(&op, msg, sizeof msg) ||
        be->alloc(d, dspk__tensor_nbytes(&op.in[0]), &op.in[0].mem) ||
        be->alloc(d, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem)) {
      bad = 1;
      break;
    }
    double *x = op.in[0].mem->ptr, *y = op.out[0].mem->ptr;
    for (int i = 0; i < 2 * n; i++)
      x[i] = i == 0 ? 1 : 0; /* unit impulse: every output bin is 1 */
    if (be->run(d, &op, &c))
      bad = 1;
    for (int i = 0; i < n; i++)
      if (fabs(y[2 * i] - 1) > 1e-12 || fabs(y[2 * i + 1]) > 1e-12)
        bad = 1;
    be->free(d, op.in[0].mem);
    be->free(d, op.out[0].mem);
  }
  be->close(d);
  return (void *)bad;
}

static void test_fft_threads(void **state) {
  (void)state;
  pthread_t t[2];
  for (intptr_t i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, fft_thread, (void *)i), 0);
  for (int i = 0; i < 2; i++) {
    void *r;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_null(r);
  }
}

/* ---- fir ---------------------------------------------------------------- */

static void fir_case(dspk_dtype dt, int force, int64_t n, int64_t k, int64_t rows) {
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  shape_set(&op.in[0], dt, 2, (int64_t[]){rows, n});
  shape_set(&op.in[1], dt, 1, (int64_t[]){k});
  double *x = put_random(&op.in[0]), *h = put_random(&op.in[1]);
  dev->fir_force = force;
  int rc = run_op(&op);
  dev->fir_force = -1;
  assert_int_equal(rc, 0);
  double *got = get(&op.out[0]);
  int w = W(dt);
  double *want = calloc((size_t)(rows * n * w + 1), sizeof(double));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < n; i++) {
      double re = 0, im = 0;
      for (int64_t j = 0; j < k && j <= i; j++) {
        const double *xv = &x[(r * n + i - j) * w], *hv = &h[j * w];
        if (w == 1) {
          re += hv[0] * xv[0];
        } else {
          re += hv[0] * xv[0] - hv[1] * xv[1];
          im += hv[0] * xv[1] + hv[1] * xv[0];
        }
      }
      want[(r * n + i) * w] = re;
      if (w == 2)
        want[(r * n + i) * w + 1] = im;
    }
  char what[96];
  snprintf(what, sizeof what, "fir %s %s n=%lld k=%lld rows=%lld",
           dspk__dtype_name(dt), force == 1 ? "fft" : force == 0 ? "direct" : "auto",
           (long long)n, (long long)k, (long long)rows);
  /* Values are in [-1,1): k terms, plus an FFT's log-length error. */
  double kk = (double)(k < n ? k : n);
  compare(what, got, want, rows * n * w,
          8 * eps(dt) * (kk + 4) * (force == 0 ? 1 : log2(8 * kk + 4096)));
  free(x);
  free(h);
  free(got);
  free(want);
  free_op(&op);
}

static void test_fir_direct(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int d = 0; d < 4; d++) {
    fir_case(dts[d], 0, 1, 1, 1);
    fir_case(dts[d], 0, 100, 7, 3);
    fir_case(dts[d], 0, 5000, 33, 2); /* spans several direct blocks */
    /* Several pieces between cancel checks (2^23 multiply-adds: 8192
     * outputs of 1024 taps, 2048 complex), across rows too. */
    fir_case(dts[d], 0, 20000, 1024, 2);
    fir_case(dts[d], 0, 10, 25, 2);   /* more taps than samples */
    fir_case(dts[d], 0, irand(1, 3000), irand(1, 200), irand(1, 3));
  }
}

static void test_fir_fft(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int d = 0; d < 4; d++) {
    fir_case(dts[d], 1, 1, 1, 1);
    fir_case(dts[d], 1, 100, 7, 3);
    fir_case(dts[d], 1, 20000, 129, 2); /* several overlap-add blocks */
    fir_case(dts[d], 1, 10, 25, 2);
    fir_case(dts[d], 1, irand(1, 9000), irand(1, 700), irand(1, 3));
  }
  fir_case(DSPK_F32, -1, 3000, 200, 1); /* automatic choice */
  fir_case(DSPK_F64, -1, 3000, 5, 1);
}

/* fir's FFT path with non-finite data, or finite data whose transforms
 * overflow: against a direct sum in double of the same values (in the
 * direct path's order), the non-finite outputs exactly where the reference
 * has them, component by component, and the others within the FFT's
 * tolerance of the largest finite output.  x and h hold rows*n and k values
 * (interleaved for complex). */
/* fir of one row x (n samples) through k taps h (values as doubles, W per
 * element), on the path force (0 direct, 1 FFT); the output as doubles
 * (get()).  The caller frees the op (free_op). */
static double *fir_run(struct dspk__op *op, dspk_dtype dt, int64_t n, int64_t k,
                       const double *x, const double *h, int force) {
  memset(op, 0, sizeof *op);
  op->kind = DSPK_OP_FIR;
  op->nin = 2;
  shape_set(&op->in[0], dt, 2, (int64_t[]){1, n});
  shape_set(&op->in[1], dt, 1, (int64_t[]){k});
  put_vals(&op->in[0], x);
  put_vals(&op->in[1], h);
  dev->fir_force = force;
  int rc = run_op(op);
  dev->fir_force = -1;
  assert_int_equal(rc, 0);
  return get(&op->out[0]);
}

static void fir_values_case(const char *what, dspk_dtype dt, int force, int64_t rows,
                            int64_t n, int64_t k, const double *xv, const double *hv) {
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  shape_set(&op.in[0], dt, 2, (int64_t[]){rows, n});
  shape_set(&op.in[1], dt, 1, (int64_t[]){k});
  put_vals(&op.in[0], xv);
  put_vals(&op.in[1], hv);
  dev->fir_force = force;
  int rc = run_op(&op);
  dev->fir_force = -1;
  assert_int_equal(rc, 0);
  double *got = get(&op.out[0]);
  int w = W(dt);
  int64_t m = rows * n * w;
  double *want = calloc((size_t)(m + 1), sizeof(double)), big = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < n; i++) {
      double re = 0, im = 0;
      for (int64_t j = 0; j < k && j <= i; j++) {
        const double *x = &xv[(r * n + i - j) * w], *h = &hv[j * w];
        if (w == 1) {
          re += h[0] * x[0];
        } else {
          re += h[0] * x[0] - h[1] * x[1];
          im += h[0] * x[1] + h[1] * x[0];
        }
      }
      want[(r * n + i) * w] = re;
      if (w == 2)
        want[(r * n + i) * w + 1] = im;
    }
  for (int64_t i = 0; i < m; i++)
    if (isfinite(want[i]) && fabs(want[i]) > big)
      big = fabs(want[i]);
  double tol = 8 * eps(dt) * (double)(k + 4) * log2(8.0 * (double)k + 4096) * (big > 1 ? big : 1);
  for (int64_t i = 0; i < m; i++) {
    if (!!isfinite(got[i]) != !!isfinite(want[i]))
      fail_msg("fir %s %s %s n=%lld k=%lld: output %lld (row %lld, sample %lld%s) is %g, the "
               "direct sum %g", what, dspk__dtype_name(dt), force == 1 ? "fft" : "auto",
               (long long)n, (long long)k, (long long)i, (long long)(i / w / n),
               (long long)(i / w % n), w == 2 ? (i % 2 ? " im" : " re") : "", got[i], want[i]);
    if (isfinite(want[i]) && !(fabs(got[i] - want[i]) <= tol))
      fail_msg("fir %s %s n=%lld k=%lld: output %lld is %.9g, want %.9g (tol %.3g)", what,
               dspk__dtype_name(dt), (long long)n, (long long)k, (long long)i, got[i],
               want[i], tol);
  }
  free(got);
  free(want);
  free_op(&op);
}

/* The FFT path on a NaN or an Inf in x, a NaN in the last tap, and finite
 * data whose transforms overflow (3e38 times taps of 1e-6 in f32: sums of
 * at most 9e34), every dtype, with the path forced and chosen (k = 300:
 * the cpu's heuristic takes FFT from 33 taps on), on rows of one block
 * and of several. */
static void test_fir_fft_nonfinite(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  static const int64_t ns[] = {2000, 20000};
  for (int d = 0; d < 4; d++)
    for (int ni = 0; ni < 2; ni++)
      for (int force = -1; force <= 1; force += 2) {
        dspk_dtype dt = dts[d];
        int w = W(dt), sp = dt == DSPK_F32 || dt == DSPK_C64;
        int64_t n = ns[ni], k = 300, rows = 2, m = rows * n * w;
        double *x = malloc(sizeof(double) * (size_t)m), *h = malloc(sizeof(double) * (size_t)(k * w));
        assert_non_null(x);
        assert_non_null(h);
        for (int c = 0; c < 4; c++) {
          for (int64_t i = 0; i < m; i++)
            x[i] = roundto(dt, urand());
          for (int64_t i = 0; i < k * w; i++)
            h[i] = roundto(dt, urand());
          const char *what;
          int64_t at = (n + n / 4) * w; /* row 1, sample n/4; row 0 stays finite */
          switch (c) {
          case 0: what = "NaN in x"; x[at] = NAN; break;
          case 1: what = "Inf in x"; x[at + w - 1] = INFINITY; break;
          case 2: what = "NaN in the last tap"; h[(k - 1) * w] = NAN; break;
          default:
            what = "transforms overflow";
            for (int64_t i = 0; i < m; i++)
              x[i] = sp ? 3e38 : 1.7e308;
            for (int64_t i = 0; i < k * w; i++)
              h[i] = 1e-6;
            break;
          }
          fir_values_case(what, dt, force, rows, n, k, x, h);
        }
        free(x);
        free(h);
      }
}

/* fir's FFT path on rows of a wide dynamic range: values in [-1, 1) with
 * a few of 1e20.  The transforms' error, about eps times 1e20 times the
 * taps, once swamped every output of the blocks the large values reach;
 * each output must be within the direct sum's own error (eps k times the
 * sum of |h_j x_{i-j}|) of a long-double direct sum. */
static void test_fir_fft_range(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int d = 0; d < 4; d++) {
    dspk_dtype dt = dts[d];
    int w = W(dt);
    int64_t n = 20000, k = 300, m = n * w;
    double *x = malloc(sizeof(double) * (size_t)m), *h = malloc(sizeof(double) * (size_t)(k * w));
    assert_non_null(x);
    assert_non_null(h);
    for (int64_t i = 0; i < m; i++)
      x[i] = roundto(dt, urand());
    for (int64_t i = 0; i < k * w; i++)
      h[i] = roundto(dt, urand());
    x[5000 * w] = roundto(dt, 1e20);
    x[12345 * w + w - 1] = roundto(dt, -1e20);
    struct dspk__op op;
    double *got = fir_run(&op, dt, n, k, x, h, 1);
    for (int64_t i = 0; i < n; i++) {
      long double re = 0, im = 0, a = 0;
      for (int64_t j = 0; j < k && j <= i; j++) {
        const double *xv = &x[(i - j) * w], *hv = &h[j * w];
        if (w == 1) {
          re += (long double)hv[0] * xv[0];
          a += fabsl((long double)hv[0] * xv[0]);
        } else {
          re += (long double)hv[0] * xv[0] - (long double)hv[1] * xv[1];
          im += (long double)hv[0] * xv[1] + (long double)hv[1] * xv[0];
          a += (fabsl((long double)hv[0]) + fabsl((long double)hv[1])) *
               (fabsl((long double)xv[0]) + fabsl((long double)xv[1]));
        }
      }
      double tol = 4 * eps(dt) * (double)(k + 4) * (double)a;
      for (int c = 0; c < w; c++) {
        double want = (double)(c ? im : re), g = got[i * w + c];
        if (!(fabs(g - want) <= tol))
          fail_msg("fir fft %s n=%lld k=%lld with values of 1e20: output %lld%s is %.9g, "
                   "want %.9g (tol %.3g)", dspk__dtype_name(dt), (long long)n, (long long)k,
                   (long long)i, w == 2 ? (c ? " im" : " re") : "", g, want, tol);
      }
    }
    free(got);
    free(x);
    free(h);
    free_op(&op);
  }
}

/* Output i of fir(x, h) (k taps, w doubles an element: 1 real, 2
 * complex), as a long-double direct sum: exact to far below a unit of the
 * smallest subnormal of either precision. */
static void fir_ref(const double *x, const double *h, int64_t k, int w, int64_t i,
                    long double *re, long double *im) {
  *re = *im = 0;
  for (int64_t j = 0; j < k && j <= i; j++) {
    const double *xv = &x[(i - j) * w], *hv = &h[j * w];
    if (w == 1) {
      *re += (long double)hv[0] * xv[0];
    } else {
      *re += (long double)hv[0] * xv[0] - (long double)hv[1] * xv[1];
      *im += (long double)hv[0] * xv[1] + (long double)hv[1] * xv[0];
    }
  }
}

/* fir's FFT path on subnormal data (probe 16 B2): samples of about 1e-40
 * (f32, c64) or 1e-310 (f64, c128) with taps in [-1, 1), taps that small
 * with samples in [-1, 1), and both of about 2^-70 (2^-540) so that their
 * products are subnormal.  The transforms' intermediates lost their low
 * bits to gradual underflow (the inverse's 1/L alone takes log2(L) of
 * them): errors of 200 to 5000 units of the smallest subnormal, where the
 * direct sum's are a few.  Each output part must be within the path's
 * stated error, eps log2(L) max|x| sum|h| (4 times), plus 4 units of the
 * smallest subnormal, of a long-double direct sum (exact to far below one
 * such unit). */
static void test_fir_fft_subnormal(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int d = 0; d < 4; d++)
    for (int c = 0; c < 3; c++) {
      dspk_dtype dt = dts[d];
      int w = W(dt), sp = dt == DSPK_F32 || dt == DSPK_C64;
      int64_t n = 30000, k = 20, m = n * w;
      double tiny = sp ? 1e-40 : 1e-310, half = sp ? 0x1p-70 : 0x1p-540;
      double unit = sp ? 0x1p-149 : 0x1p-1074;
      double xs = c == 0 ? tiny : c == 1 ? 1 : half, hs = c == 0 ? 1 : c == 1 ? tiny : half;
      double *x = malloc(sizeof(double) * (size_t)m), *h = malloc(sizeof(double) * (size_t)(k * w));
      assert_non_null(x);
      assert_non_null(h);
      double xmax = 0, hsum = 0;
      for (int64_t i = 0; i < m; i++) {
        x[i] = roundto(dt, urand() * xs);
        xmax = fabs(x[i]) > xmax ? fabs(x[i]) : xmax;
      }
      for (int64_t i = 0; i < k * w; i++) {
        h[i] = roundto(dt, urand() * hs);
        hsum += fabs(h[i]);
      }
      struct dspk__op op;
      double *got = fir_run(&op, dt, n, k, x, h, 1);
      /* L: 4096 here (8K is 160), log2 12. */
      double tol = 4 * eps(dt) * 12 * xmax * hsum + 4 * unit;
      for (int64_t i = 0; i < n; i++) {
        long double re, im;
        fir_ref(x, h, k, w, i, &re, &im);
        for (int p = 0; p < w; p++) {
          long double want = p ? im : re;
          double g = got[i * w + p];
          if (!(fabsl((long double)g - want) <= tol))
            fail_msg("fir fft %s n=%lld k=%lld, samples %g and taps %g at most: output %lld%s "
                     "is %.9g, want %.9Lg (%.1Lf units of the smallest subnormal off, tol %.1f)",
                     dspk__dtype_name(dt), (long long)n, (long long)k, xs, hs, (long long)i,
                     w == 2 ? (p ? " im" : " re") : "", g, want,
                     fabsl((long double)g - want) / unit, tol / unit);
        }
      }
      free(got);
      free(x);
      free(h);
      free_op(&op);
    }
}

/* Every cpu fir path's direct sums on subnormal and huge data (probe 18
 * B1): the direct path, and the FFT path whose outputs below its repair
 * threshold (2^6 or 2^20 times eps log2(L) max|x| sum|h|) are summed again
 * directly, which with 1024 taps covers most outputs here.  Cases: samples
 * that are integers of up to 700 units of the smallest subnormal with taps
 * in [-1, 1); taps such integers over samples in [-1, 1); both of about
 * 2^-70 (2^-540), so that every product is subnormal; and huge samples,
 * 0.75 2^128 (2^1024) times 1 + 2^-10 u, under taps 2, -2 and then small
 * ones, whose products 2 x overflow where the outputs (about 2^-9 of the
 * samples) are in range.  The direct sums rounded each subnormal product
 * to the subnormals' grid (f32 off by up to 23 units with 1024 taps, so the
 * repair made small outputs worse than the transforms' result) and
 * overflowed on the huge data (NaN).  Each output part must be within the
 * FFT path's stated error, eps log2(L) max|x| sum|h| (4 times, log2(L) at
 * most 13 here), plus 4 units of the smallest subnormal, of a long-double
 * direct sum (exact to far below one such unit). */
static void test_fir_subnormal_huge(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  static const int64_t ks[] = {20, 1024};
  for (int d = 0; d < 4; d++)
    for (int path = 0; path < 2; path++)
      for (int kc = 0; kc < 2; kc++)
        for (int c = 0; c < 4; c++) {
          dspk_dtype dt = dts[d];
          int w = W(dt), sp = dt == DSPK_F32 || dt == DSPK_C64;
          int64_t n = 12000, k = ks[kc], m = n * w;
          double unit = sp ? 0x1p-149 : 0x1p-1074, half = sp ? 0x1p-70 : 0x1p-540;
          double big = sp ? 0x1p127 * 1.5 : 0x1p1023 * 1.5;
          double *x = malloc(sizeof(double) * (size_t)m);
          double *h = malloc(sizeof(double) * (size_t)(k * w));
          assert_non_null(x);
          assert_non_null(h);
          double xmax = 0, hsum = 0;
          for (int64_t i = 0; i < m; i++) {
            double u = urand();
            x[i] = roundto(dt, c == 0   ? round(700 * u) * unit
                               : c == 1 ? u
                               : c == 2 ? u * half
                                        : big * (1 + u * 0x1p-10));
            xmax = fabs(x[i]) > xmax ? fabs(x[i]) : xmax;
          }
          for (int64_t i = 0; i < k * w; i++) {
            double u = urand();
            h[i] = roundto(dt, c == 0   ? u
                               : c == 1 ? round(700 * u) * unit
                               : c == 2 ? u * half
                               : i < w  ? 2
                               : i < 2 * w && i % w == 0 ? -2
                                        : u * 0x1p-10);
            hsum += fabs(h[i]);
          }
          struct dspk__op op;
          double *got = fir_run(&op, dt, n, k, x, h, path);
          double tol = 4 * eps(dt) * 13 * xmax * hsum + 4 * unit;
          for (int64_t i = 0; i < n; i++) {
            long double re, im;
            fir_ref(x, h, k, w, i, &re, &im);
            for (int p = 0; p < w; p++) {
              long double want = p ? im : re;
              double g = got[i * w + p];
              /* (the first output, 2 x[0] alone, is past the range: inf) */
              if (fabsl(want) > (sp ? FLT_MAX : DBL_MAX) * 1.001L ? !(isinf(g) && (g > 0) == (want > 0))
                                                                  : !(fabsl((long double)g - want) <= tol))
                fail_msg("fir %s %s n=%lld k=%lld case %d: output %lld%s is %.9g, want %.9Lg "
                         "(%.3Lg off: %.1Lf units of the smallest subnormal; tol %.3g)",
                         path ? "fft" : "direct", dspk__dtype_name(dt), (long long)n,
                         (long long)k, c, (long long)i, w == 2 ? (p ? " im" : " re") : "", g,
                         want, fabsl((long double)g - want),
                         fabsl((long double)g - want) / unit, tol);
            }
          }
          free(got);
          free(x);
          free(h);
          free_op(&op);
        }
}

/* fir with one tap is H[0]*X exactly on either path (probe 18 B3): each
 * output the product rounded once, with its sign of zero (a tap of -0 over
 * positive samples is -0, where a sum starting from +0 gave +0), NaN and
 * inf as the product's, complex as numpy's (hr xr - hi xi, hr xi + hi xr). */
static void test_fir_one_tap(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  static const double xs[] = {1, -2, 0, -0.0, 3e-39, INFINITY, 1e-300, 7};
  static const double hs[][2] = {{-0.0, 0}, {0, -0.0}, {-0.0, -0.0}, {0.5, -0.0}, {-3, 0.25}};
  for (int d = 0; d < 4; d++)
    for (int path = 0; path < 2; path++)
      for (int t = 0; t < 5; t++) {
        dspk_dtype dt = dts[d];
        int w = W(dt);
        int64_t n = 8;
        double x[16], h[2] = {hs[t][0], hs[t][1]};
        for (int i = 0; i < 16; i++)
          x[i] = roundto(dt, xs[(i * 3 + t) % 8] * (i % 3 == 2 ? -1 : 1));
        struct dspk__op op;
        memset(&op, 0, sizeof op);
        op.kind = DSPK_OP_FIR;
        op.nin = 2;
        shape_set(&op.in[0], dt, 1, (int64_t[]){n});
        shape_set(&op.in[1], dt, 1, (int64_t[]){1});
        put_vals(&op.in[0], x);
        put_vals(&op.in[1], h);
        dev->fir_force = path;
        int rc = run_op(&op);
        dev->fir_force = -1;
        assert_int_equal(rc, 0);
        double *got = get(&op.out[0]);
        for (int64_t i = 0; i < n; i++)
          for (int p = 0; p < w; p++) {
            double want;
            if (w == 1) {
              want = dt == DSPK_F32 ? (double)((float)h[0] * (float)x[i]) : h[0] * x[i];
            } else if (dt == DSPK_C64) {
              float hr = (float)h[0], hi = (float)h[1], xr = (float)x[2 * i],
                    xi = (float)x[2 * i + 1];
              float a = hr * xr, b = hi * xi, c = hr * xi, e = hi * xr;
              want = p ? (double)(c + e) : (double)(a - b);
            } else {
              double a = h[0] * x[2 * i], b = h[1] * x[2 * i + 1];
              double c = h[0] * x[2 * i + 1], e = h[1] * x[2 * i];
              want = p ? c + e : a - b;
            }
            double g = got[i * w + p];
            if (!(memcmp(&g, &want, sizeof g) == 0 || (isnan(g) && isnan(want))))
              fail_msg("fir %s %s one tap (%g, %g): output %lld%s is %g (sign %d), want %g "
                       "(sign %d)",
                       path ? "fft" : "direct", dspk__dtype_name(dt), h[0], h[1], (long long)i,
                       w == 2 ? (p ? " im" : " re") : "", g, signbit(g) != 0, want,
                       signbit(want) != 0);
          }
        free(got);
        free_op(&op);
      }
}

/* ---- contract ----------------------------------------------------------- */

static void contract_case(dspk_dtype dt, const char *subs) {
  int64_t size[128];
  for (int c = 0; c < 128; c++)
    size[c] = irand(1, 6);
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_CONTRACT;
  op.nin = 2;
  snprintf(op.u.contract.subscripts, sizeof op.u.contract.subscripts, "%s", subs);
  char la[9] = "", lb[9] = "", lo[9] = "";
  assert_int_equal(sscanf(subs, "%8[a-zA-Z],%8[a-zA-Z]->%8[a-zA-Z]", la, lb, lo) >= 2, 1);
  if (!strstr(subs, "->") || strstr(subs, "->")[2] == 0)
    lo[0] = 0;
  int64_t sa[8], sb[8];
  for (int i = 0; la[i]; i++)
    sa[i] = size[(int)la[i]];
  for (int i = 0; lb[i]; i++)
    sb[i] = size[(int)lb[i]];
  shape_set(&op.in[0], dt, (int)strlen(la), sa);
  shape_set(&op.in[1], dt, (int)strlen(lb), sb);
  double *A = put_random(&op.in[0]), *B = put_random(&op.in[1]);
  assert_int_equal(run_op(&op), 0);
  double *got = get(&op.out[0]);
  int w = W(dt);
  int64_t on = dspk__tensor_numel(&op.out[0]);
  double *want = calloc((size_t)(on * w + 1), sizeof(double));
  /* Every combination of every label's index. */
  char all[20] = "";
  for (const char *s = subs; *s; s++)
    if (((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')) && !strchr(all, *s))
      strncat(all, s, 1);
  int nl = (int)strlen(all);
  int64_t idx[128] = {0}, combos = 1;
  for (int i = 0; i < nl; i++)
    combos *= size[(int)all[i]];
  int64_t terms = combos / (on ? on : 1);
  for (int64_t t = 0; t < combos; t++) {
    int64_t ia = 0, ib = 0, io = 0;
    for (int i = 0; la[i]; i++)
      ia = ia * size[(int)la[i]] + idx[(int)la[i]];
    for (int i = 0; lb[i]; i++)
      ib = ib * size[(int)lb[i]] + idx[(int)lb[i]];
    for (int i = 0; lo[i]; i++)
      io = io * size[(int)lo[i]] + idx[(int)lo[i]];
    if (w == 1) {
      want[io] += A[ia] * B[ib];
    } else {
      double ar = A[2 * ia], ai = A[2 * ia + 1], br = B[2 * ib], bi = B[2 * ib + 1];
      want[2 * io] += ar * br - ai * bi;
      want[2 * io + 1] += ar * bi + ai * br;
    }
    for (int i = nl - 1; i >= 0; i--) {
      if (++idx[(int)all[i]] < size[(int)all[i]])
        break;
      idx[(int)all[i]] = 0;
    }
  }
  char what[96];
  snprintf(what, sizeof what, "contract %s %s", dspk__dtype_name(dt), subs);
  compare(what, got, want, on * w, 8 * eps(dt) * (double)(terms + 4) * 2);
  free(A);
  free(B);
  free(got);
  free(want);
  free_op(&op);
}

static void test_contract(void **state) {
  (void)state;
  static const char *subs[] = {
      "ik,kj->ij",   "bij,bjk->bik", "abc,cd->abd", "ij,jk->ki",  "ij,kj->ik",
      "ji,jk->ik",   "bik,bkj->bji", "i,j->ij",     "ij,ij->",    "ij,ij->ij",
      "abc,bd->dc",  "ijk,k->j",     "Ab,bC->CA",   "xy,zw->wyxz", "abcd,dcb->a",
      "a,b->",       "bij,jk->bik",  "ij,j->i",
  };
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (size_t s = 0; s < sizeof subs / sizeof *subs; s++)
    for (int d = 0; d < 4; d++)
      for (int rep = 0; rep < 2; rep++)
        contract_case(dts[d], subs[s]);
}

/* contract of complex values holding an infinity keeps numpy's infinite
 * parts: (inf+0j)*(2+0j) summed is inf+nanj, (inf+1j)*(1-2j) is inf-infj
 * (OpenBLAS's cgemm/zgemm made both nan+nanj, by scaling with 1+0j). */
static void contract_inf_case(dspk_dtype dt, const char *subs, int ra, const int64_t *sa,
                              const double *a, int rb, const int64_t *sb, const double *b,
                              int64_t nout, const double *want) {
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_CONTRACT;
  op.nin = 2;
  strcpy(op.u.contract.subscripts, subs);
  shape_set(&op.in[0], dt, ra, sa);
  shape_set(&op.in[1], dt, rb, sb);
  put_vals(&op.in[0], a);
  put_vals(&op.in[1], b);
  assert_int_equal(run_op(&op), 0);
  double *got = get(&op.out[0]);
  for (int64_t i = 0; i < 2 * nout; i++)
    if (!(isnan(want[i]) ? isnan(got[i]) : got[i] == want[i]))
      fail_msg("contract %s %s: part %lld is %g, want %g", dspk__dtype_name(dt), subs,
               (long long)i, got[i], want[i]);
  free(got);
  free_op(&op);
}

static void test_contract_complex_inf(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_C64, DSPK_C128};
  for (int d = 0; d < 2; d++) {
    dspk_dtype dt = dts[d];
    contract_inf_case(dt, "i,i->", 1, (int64_t[]){1}, (double[]){INFINITY, 0}, 1,
                      (int64_t[]){1}, (double[]){2, 0}, 1, (double[]){INFINITY, NAN});
    contract_inf_case(dt, "i,->i", 1, (int64_t[]){1}, (double[]){INFINITY, 1}, 0, NULL,
                      (double[]){1, -2}, 1, (double[]){INFINITY, -INFINITY});
    contract_inf_case(dt, "ij,jk->ik", 2, (int64_t[]){1, 1}, (double[]){INFINITY, 0}, 2,
                      (int64_t[]){1, 1}, (double[]){2, 0}, 1, (double[]){INFINITY, NAN});
    /* 2x3 @ 3x2 with one inf+0j in B (row 1, column 0): column 0 gets
     * a[i][1]*inf (an infinite real part), column 1 stays finite and exact. */
    double a[12] = {1, 0, 2, 0, 3, 0, -1, 0, -2, 0, 1, 0};
    double b[12] = {1, 0, 1, 0, INFINITY, 0, 2, 0, 1, 0, 1, 0};
    contract_inf_case(dt, "ij,jk->ik", 2, (int64_t[]){2, 3}, a, 2, (int64_t[]){3, 2}, b, 4,
                      (double[]){INFINITY, NAN, 8, 0, -INFINITY, NAN, -4, 0});
    /* A NaN stays a NaN in both parts. */
    contract_inf_case(dt, "i,i->", 1, (int64_t[]){2}, (double[]){NAN, 0, 1, 0}, 1,
                      (int64_t[]){2}, (double[]){2, 0, 1, 0}, 1, (double[]){NAN, NAN});
    /* Finite operands whose product or sum overflows: numpy's -1+infj
     * and inf+2j (the BLAS's scaling by 1+0j gave nan+infj and inf+nanj). */
    double big = dt == DSPK_C64 ? 3e38 : 1.7e308;
    contract_inf_case(dt, "ij,jk->ik", 2, (int64_t[]){1, 1}, (double[]){big, 0.5}, 2,
                      (int64_t[]){1, 1}, (double[]){0, 2}, 1, (double[]){-1, INFINITY});
    contract_inf_case(dt, "i,i->", 1, (int64_t[]){2}, (double[]){big, 1, big, 1}, 1,
                      (int64_t[]){2}, (double[]){1, 0, 1, 0}, 1, (double[]){INFINITY, 2});
    contract_inf_case(dt, "bk,kc->c", 2, (int64_t[]){2, 1}, (double[]){big, 0, -2.5, 0.5},
                      2, (int64_t[]){1, 1}, (double[]){0, 2}, 1, (double[]){-1, INFINITY});
  }
}

/* ---- reduce ------------------------------------------------------------- */

static void reduce_case(dspk_dtype dt, dspk_reduce fn) {
  int rank = irand(0, 4);
  int64_t shape[4];
  for (int i = 0; i < rank; i++)
    shape[i] = irand(1, 7);
  uint32_t axes = rank ? (uint32_t)irand(0, (1 << rank) - 1) : 0;
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.u.reduce.fn = fn;
  op.u.reduce.axes = axes;
  shape_set(&op.in[0], dt, rank, shape);
  double *x = put_random(&op.in[0]);
  assert_int_equal(run_op(&op), 0);
  double *got = get(&op.out[0]);
  uint32_t eff = axes ? axes : (uint32_t)((1u << rank) - 1);
  int w = W(dt);
  int64_t on = dspk__tensor_numel(&op.out[0]), n = dspk__tensor_numel(&op.in[0]);
  double *want = malloc(sizeof(double) * (size_t)(on * w + 1));
  int *seen = calloc((size_t)on + 1, sizeof(int));
  int64_t count = n / on;
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, o = 0, ostride = 1;
    for (int d = rank - 1; d >= 0; d--) {
      int64_t id = rem % shape[d];
      rem /= shape[d];
      if (!(eff & (1u << d))) {
        o += id * ostride;
        ostride *= shape[d];
      }
    }
    for (int c = 0; c < w; c++) {
      double v = x[i * w + c], *a = &want[o * w + c];
      if (!seen[o])
        *a = fn == DSPK_REDUCE_SUM || fn == DSPK_REDUCE_MEAN ? 0 : v;
      if (fn == DSPK_REDUCE_MAX)
        *a = fmax(*a, v);
      else if (fn == DSPK_REDUCE_MIN)
        *a = fmin(*a, v);
      else
        *a += v;
    }
    seen[o] = 1;
  }
  if (fn == DSPK_REDUCE_MEAN)
    for (int64_t i = 0; i < on * w; i++)
      want[i] /= (double)count;
  char what[64];
  snprintf(what, sizeof what, "reduce %d %s rank=%d axes=%u", (int)fn,
           dspk__dtype_name(dt), rank, axes);
  compare(what, got, want, on * w, 4 * eps(dt) * (double)(count + 1));
  free(x);
  free(got);
  free(want);
  free(seen);
  free_op(&op);
}

static void test_reduce(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int t = 0; t < 12; t++)
    for (int d = 0; d < 4; d++)
      for (int f = 0; f < DSPK_REDUCE_COUNT; f++) {
        if ((f == DSPK_REDUCE_MAX || f == DSPK_REDUCE_MIN) && d >= 2)
          continue;
        reduce_case(dts[d], (dspk_reduce)f);
      }
}

/* The sum of a long row is the documented order of additions, to the bit
 * (backends/cpu/reduce.c): blocks of 2^14 elements, each summed pairwise
 * (leaves of 128 elements, each in 8 double lanes combined as
 * ((0+4)+(1+5))+((2+6)+(3+7)), the leaves' sums added in halves), the
 * blocks' sums added in halves too, whatever the thread count.  This file is built for the baseline
 * CPU, so on a machine with AVX2 it also checks that the backend's AVX2
 * build of the block sum gives the baseline's bits. */
static double lanes_ref(const double *x, int64_t n) {
  double a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++)
      a[l] += x[i + l];
  for (; i < n; i++)
    a[i % 8] += x[i];
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static double halves_ref(const double *x, int64_t n) {
  if (n <= 2)
    return n == 1 ? x[0] : x[0] + x[1];
  return halves_ref(x, n / 2) + halves_ref(x + n / 2, n - n / 2);
}

static double pairwise_ref(const double *x, int64_t n) {
  double leaf[128];
  int64_t nl = 0;
  for (int64_t i = 0; i < n; i += 128)
    leaf[nl++] = lanes_ref(x + i, n - i < 128 ? n - i : 128);
  return halves_ref(leaf, nl);
}

/* Small addends after a large one keep numpy's accuracy: f64 [2^53, 1 x n]
 * (a running total per lane over a block lost 2048 of 10^6 ones; pairwise,
 * as numpy, 16), along the last axis of a real row and of a complex one. */
static void test_reduce_sum_pairwise(void **state) {
  (void)state;
  for (int c = 0; c < 2; c++) {
    int64_t n = 1000001;
    dspk_dtype dt = c ? DSPK_C128 : DSPK_F64;
    struct dspk__op op;
    memset(&op, 0, sizeof op);
    op.kind = DSPK_OP_REDUCE;
    op.nin = 1;
    op.u.reduce.fn = DSPK_REDUCE_SUM;
    shape_set(&op.in[0], dt, 1, &n);
    double *x = malloc(sizeof(double) * (size_t)(2 * n));
    assert_non_null(x);
    for (int64_t i = 0; i < n * W(dt); i++)
      x[i] = 1;
    x[0] = x[W(dt) - 1] = 9007199254740992.0;
    put_vals(&op.in[0], x);
    assert_int_equal(run_op(&op), 0);
    double *got = get(&op.out[0]);
    for (int w = 0; w < W(dt); w++) {
      double lost = 9007199254740992.0 + 1000000.0 - got[w];
      if (!(fabs(lost) <= 64))
        fail_msg("sum of %s [2^53, 1 x 10^6], part %d: %.17g, %g off", dspk__dtype_name(dt),
                 w, got[w], lost);
    }
    free(x);
    free(got);
    free_op(&op);
  }
}

static void test_reduce_sum_bits(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64};
  static const int64_t ns[] = {16383, 16384 + 5, ((int64_t)3 << 20) + 7};
  for (int d = 0; d < 2; d++)
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
      int64_t n = ns[k];
      struct dspk__op op;
      memset(&op, 0, sizeof op);
      op.kind = DSPK_OP_REDUCE;
      op.nin = 1;
      op.u.reduce.fn = DSPK_REDUCE_SUM;
      shape_set(&op.in[0], dts[d], 1, &n);
      double *x = put_random(&op.in[0]);
      for (int64_t i = 0; i < n; i++)
        x[i] *= 1.0 + (double)(i % 1000) * 1e3; /* magnitudes apart: order shows */
      /* put_random's values scaled: write them again */
      {
        size_t es = dspk__dtype_size(dts[d]);
        char *buf = malloc((size_t)n * es);
        assert_non_null(buf);
        for (int64_t i = 0; i < n; i++) {
          if (dts[d] == DSPK_F32) {
            float f = (float)x[i];
            x[i] = f;
            memcpy(buf + i * 4, &f, 4);
          } else {
            memcpy(buf + i * 8, &x[i], 8);
          }
        }
        assert_int_equal(be->write(dev, op.in[0].mem, op.in[0].offset, buf, (size_t)n * es), 0);
        free(buf);
      }
      assert_int_equal(run_op(&op), 0);
      double *got = get(&op.out[0]);
      int64_t nb = (n + 16383) / 16384;
      double *part = malloc(sizeof(double) * (size_t)nb);
      assert_non_null(part);
      for (int64_t b = 0; b < nb; b++)
        part[b] = pairwise_ref(x + b * 16384, n - b * 16384 < 16384 ? n - b * 16384 : 16384);
      double want = halves_ref(part, nb);
      free(part);
      if (dts[d] == DSPK_F32)
        want = (double)(float)want;
      if (memcmp(&got[0], &want, sizeof want) != 0)
        fail_msg("sum of %lld %s: %.17g, not %.17g", (long long)n,
                 dspk__dtype_name(dts[d]), got[0], want);
      free(x);
      free(got);
      free_op(&op);
    }
}

/* ---- map ---------------------------------------------------------------- */

static void map_case(dspk_dtype dt, dspk_mapfn fn) {
  int rank = irand(0, 3);
  int64_t shape[3];
  for (int i = 0; i < rank; i++)
    shape[i] = irand(1, 9);
  static const int nin[] = {2, 2, 2, 1, 2, 1, 1};
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_MAP;
  op.nin = nin[fn];
  op.u.map.fn = fn;
  op.u.map.alpha = urand() * 3;
  shape_set(&op.in[0], dt, rank, shape);
  if (op.nin == 2)
    shape_set(&op.in[1], dt, rank, shape);
  double *a = put_random(&op.in[0]), *b = op.nin == 2 ? put_random(&op.in[1]) : NULL;
  assert_int_equal(run_op(&op), 0);
  double *got = get(&op.out[0]);
  int64_t n = dspk__tensor_numel(&op.in[0]);
  int w = W(dt), ow = W(op.out[0].dtype);
  double *want = malloc(sizeof(double) * (size_t)(n * 2 + 1)), al = op.u.map.alpha;
  if (dt == DSPK_F32 || dt == DSPK_C64)
    al = (float)al;
  for (int64_t i = 0; i < n; i++) {
    double ar = a[i * w], ai = w == 2 ? a[i * w + 1] : 0;
    double br = b ? b[i * w] : 0, bi = b && w == 2 ? b[i * w + 1] : 0;
    double rr = 0, ri = 0;
    switch (fn) {
    case DSPK_MAP_ADD: rr = ar + br; ri = ai + bi; break;
    case DSPK_MAP_SUB: rr = ar - br; ri = ai - bi; break;
    case DSPK_MAP_MUL: rr = ar * br - ai * bi; ri = ar * bi + ai * br; break;
    case DSPK_MAP_SCALE: rr = al * ar; ri = al * ai; break;
    case DSPK_MAP_AXPY: rr = al * ar + br; ri = al * ai + bi; break;
    case DSPK_MAP_ABS: rr = sqrt(ar * ar + ai * ai); break;
    case DSPK_MAP_EXP: rr = exp(ar) * cos(ai); ri = exp(ar) * sin(ai); break;
    default: break;
    }
    want[i * ow] = rr;
    if (ow == 2)
      want[i * ow + 1] = ri;
  }
  char what[64];
  snprintf(what, sizeof what, "map %d %s rank=%d", (int)fn, dspk__dtype_name(dt), rank);
  compare(what, got, want, n * ow, 16 * eps(dt));
  free(a);
  free(b);
  free(got);
  free(want);
  free_op(&op);
}

static void test_map(void **state) {
  (void)state;
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (int t = 0; t < 5; t++)
    for (int d = 0; d < 4; d++)
      for (int f = 0; f < DSPK_MAPFN_COUNT; f++)
        map_case(dts[d], (dspk_mapfn)f);
}

/* ---- empty tensors ------------------------------------------------------ */

/* Runs op (inputs of the given shapes, zero-filled) and returns output 0 as
 * doubles (caller frees). */
static double *run_shapes(struct dspk__op *op, dspk_dtype dt, const int64_t *s0,
                          int r0, const int64_t *s1, int r1) {
  shape_set(&op->in[0], dt, r0, s0);
  if (op->nin > 1)
    shape_set(&op->in[1], dt, r1, s1);
  for (int i = 0; i < op->nin; i++) {
    size_t nb = dspk__tensor_nbytes(&op->in[i]);
    assert_int_equal(be->alloc(dev, nb, &op->in[i].mem), 0);
    memset(op->in[i].mem->ptr, 0, nb);
  }
  int rc = run_op(op);
  if (rc)
    fail_msg("run: %d %s", rc, errmsg);
  return get(&op->out[0]);
}

static void test_empty(void **state) {
  (void)state;
  struct dspk__op op;
  double *y;
  /* sum over an axis of length 0 is 0; mean is NaN. */
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.u.reduce.axes = 2;
  y = run_shapes(&op, DSPK_F32, (int64_t[]){3, 0}, 2, NULL, 0);
  assert_int_equal(op.out[0].rank, 1);
  for (int i = 0; i < 3; i++)
    assert_true(y[i] == 0);
  free(y);
  free_op(&op);
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.u.reduce.fn = DSPK_REDUCE_MEAN;
  y = run_shapes(&op, DSPK_F64, (int64_t[]){0, 4}, 2, NULL, 0);
  assert_int_equal(op.out[0].rank, 0);
  assert_true(isnan(y[0]));
  free(y);
  free_op(&op);
  /* a contraction over a label of size 0 is zeros */
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_CONTRACT;
  op.nin = 2;
  strcpy(op.u.contract.subscripts, "ik,kj->ji");
  y = run_shapes(&op, DSPK_C64, (int64_t[]){2, 0}, 2, (int64_t[]){0, 3}, 2);
  for (int i = 0; i < 12; i++)
    assert_true(y[i] == 0);
  free(y);
  free_op(&op);
  /* gemm with K = 0 is zeros */
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  op.u.gemm.alpha = 1;
  y = run_shapes(&op, DSPK_F64, (int64_t[]){2, 0}, 2, (int64_t[]){0, 3}, 2);
  for (int i = 0; i < 6; i++)
    assert_true(y[i] == 0);
  free(y);
  free_op(&op);
  /* no rows at all: fft, fir, map, gemm batch of 0 */
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  free(run_shapes(&op, DSPK_F32, (int64_t[]){0, 8}, 2, NULL, 0));
  assert_int_equal(op.out[0].shape[1], 5);
  free_op(&op);
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  free(run_shapes(&op, DSPK_C128, (int64_t[]){0, 8}, 2, (int64_t[]){3}, 1));
  free_op(&op);
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_MAP;
  op.nin = 2;
  op.u.map.fn = DSPK_MAP_MUL;
  free(run_shapes(&op, DSPK_F32, (int64_t[]){4, 0}, 2, (int64_t[]){4, 0}, 2));
  free_op(&op);
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  free(run_shapes(&op, DSPK_F32, (int64_t[]){0, 2, 3}, 3, (int64_t[]){3, 4}, 2));
  assert_int_equal(op.out[0].shape[0], 0);
  free_op(&op);
}

/* ---- cancel and unsupported --------------------------------------------- */

static void test_cancel(void **state) {
  (void)state;
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_MAP;
  op.nin = 1;
  op.u.map.fn = DSPK_MAP_EXP;
  shape_set(&op.in[0], DSPK_F32, 1, (int64_t[]){16});
  double *a = put_random(&op.in[0]);
  atomic_store(&cancel_flag, 1);
  int rc = run_op(&op);
  atomic_store(&cancel_flag, 0);
  assert_int_equal(rc, DSPK_ECANCELED);
  free(a);
  free_op(&op);

  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_KERNEL;
  op.u.kernel.lang = "cuda";
  op.u.kernel.source = "";
  assert_int_equal(run_op(&op), DSPK_ENOTSUP);
  assert_non_null(strstr(errmsg, "kernel"));
}

/* Each op sees a cancel after a bounded piece of work, also inside one row
 * (protocol.md, task.cancel: within about 200 ms): with the flag set before
 * the op's code runs (called directly, not through run, which looks first),
 * work that spans more than one piece stops with ECANCELED.  Before, map
 * and fft ran 2^20 and 2^22 elements between checks, fir's direct loop 16
 * rows and reduce 1024 rows, however long, and contract's permuted copies
 * had no check: each of these ran to its end. */
/* cblas_sgemm, wrapped: sets the cancel flag while cancel_in_blas, as a
 * task.cancel arriving during a BLAS call. */
static int cancel_in_blas;
void __real_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc);
void __wrap_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc);
void __wrap_cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta,
                        float *c, int ldc) {
  if (cancel_in_blas)
    atomic_store(&cancel_flag, 1);
  __real_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int run_canceled(struct dspk__op *op, dspk__cpu_op_fn *fn) {
  char msg[256];
  int rc = dspk__op_infer(op, msg, sizeof msg);
  if (rc)
    fail_msg("infer: %s", msg);
  for (int i = 0; i < op->nout; i++)
    assert_int_equal(be->alloc(dev, dspk__tensor_nbytes(&op->out[i]), &op->out[i].mem), 0);
  for (int i = 0; i < op->nin; i++) {
    size_t nb = dspk__tensor_nbytes(&op->in[i]);
    assert_int_equal(be->alloc(dev, nb, &op->in[i].mem), 0);
    memset(op->in[i].mem->ptr, 0, nb);
  }
  atomic_store(&cancel_flag, !cancel_in_blas);
  rc = fn(dev, op, &ctx);
  atomic_store(&cancel_flag, 0);
  free_op(op);
  return rc;
}

static void test_cancel_pieces(void **state) {
  (void)state;
  struct dspk__op op;
  memset(&op, 0, sizeof op); /* map: 2^19 elements */
  op.kind = DSPK_OP_MAP;
  op.nin = 1;
  op.u.map.fn = DSPK_MAP_EXP;
  shape_set(&op.in[0], DSPK_F32, 1, (int64_t[]){1 << 19});
  assert_int_equal(run_canceled(&op, dspk__cpu_map), DSPK_ECANCELED);

  memset(&op, 0, sizeof op); /* reduce: max of one row of 2^21 */
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.u.reduce.fn = DSPK_REDUCE_MAX;
  shape_set(&op.in[0], DSPK_F32, 1, (int64_t[]){1 << 21});
  assert_int_equal(run_canceled(&op, dspk__cpu_reduce), DSPK_ECANCELED);
  memset(&op, 0, sizeof op); /* reduce: min over the first axis, 2 rows */
  op.kind = DSPK_OP_REDUCE;
  op.nin = 1;
  op.u.reduce.fn = DSPK_REDUCE_MIN;
  op.u.reduce.axes = 1;
  shape_set(&op.in[0], DSPK_F64, 2, (int64_t[]){2, 1 << 21});
  assert_int_equal(run_canceled(&op, dspk__cpu_reduce), DSPK_ECANCELED);

  memset(&op, 0, sizeof op); /* fir, direct: one row, 2^24 multiply-adds */
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  shape_set(&op.in[0], DSPK_F32, 1, (int64_t[]){1 << 16});
  shape_set(&op.in[1], DSPK_F32, 1, (int64_t[]){256});
  dev->fir_force = 0;
  int rc = run_canceled(&op, dspk__cpu_fir);
  dev->fir_force = -1;
  assert_int_equal(rc, DSPK_ECANCELED);

  /* contract: canceled during its one BLAS call, 2^22 outputs left to
   * permute into the output's order after it */
  memset(&op, 0, sizeof op);
  op.kind = DSPK_OP_CONTRACT;
  op.nin = 2;
  strcpy(op.u.contract.subscripts, "ik,kj->ji");
  shape_set(&op.in[0], DSPK_F32, 2, (int64_t[]){2048, 1});
  shape_set(&op.in[1], DSPK_F32, 2, (int64_t[]){1, 2048});
  cancel_in_blas = 1;
  dev->gemm_threads = 1; /* no thread tuning */
  rc = run_canceled(&op, dspk__cpu_contract);
  cancel_in_blas = 0;
  dev->gemm_threads = 0;
  assert_int_equal(rc, DSPK_ECANCELED);

  memset(&op, 0, sizeof op); /* fft: 2048 transforms of 1024, 2^21 points */
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  shape_set(&op.in[0], DSPK_C64, 2, (int64_t[]){2048, 1024});
  assert_int_equal(run_canceled(&op, dspk__cpu_fft), DSPK_ECANCELED);
}

/* The capability query: every op with every dtype dspk__op_infer accepts,
 * f16/bf16 gemm included, and no raw kernels (the daemon answers ENOTSUP
 * for them on cpu:0 before anything runs). */
static void test_caps(void **state) {
  (void)state;
  struct dspk__devcaps caps;
  struct dspk__op o;
  char msg[256] = "";
  const uint32_t std = (1u << DSPK_F32) | (1u << DSPK_F64) | (1u << DSPK_C64) | (1u << DSPK_C128);
  memset(&caps, 0, sizeof caps);
  be->caps(dev, &caps);
  assert_int_equal(caps.dtypes[DSPK_OP_GEMM],
                   (1u << DSPK_F32) | (1u << DSPK_F64) | (1u << DSPK_F16) | (1u << DSPK_BF16));
  assert_int_equal(caps.dtypes[DSPK_OP_FFT], std);
  assert_int_equal(caps.dtypes[DSPK_OP_FIR], std);
  assert_int_equal(caps.dtypes[DSPK_OP_CONTRACT], std);
  assert_int_equal(caps.dtypes[DSPK_OP_REDUCE], std);
  assert_int_equal(caps.dtypes[DSPK_OP_MAP], std);
  assert_int_equal(caps.dtypes[DSPK_OP_KERNEL], 0);
  assert_int_equal(caps.langs, 0);

  memset(&o, 0, sizeof o);
  o.kind = DSPK_OP_GEMM;
  o.nin = 2;
  o.in[0].dtype = o.in[1].dtype = DSPK_BF16;
  assert_int_equal(dspk__caps_check(&caps, &o, "cpu:0", msg, sizeof msg), 0);
  o.kind = DSPK_OP_MAP;
  o.in[0].dtype = DSPK_BF16; /* not a dtype map runs anywhere */
  assert_int_equal(dspk__caps_check(&caps, &o, "cpu:0", msg, sizeof msg), DSPK_ENOTSUP);
  assert_string_equal(msg, "map: cpu:0 does not run map on bf16 (it takes f32, f64, c64, c128)");
  memset(&o, 0, sizeof o);
  o.kind = DSPK_OP_KERNEL;
  o.u.kernel.lang = "cuda";
  assert_int_equal(dspk__caps_check(&caps, &o, "cpu:0", msg, sizeof msg), DSPK_ENOTSUP);
  assert_string_equal(msg, "kernel: cpu:0 runs no raw kernels");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_caps),
      cmocka_unit_test(test_probe_memory), cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_gemm_half),    cmocka_unit_test(test_fft),
      cmocka_unit_test(test_fft_subnormal), cmocka_unit_test(test_fft_plan_reuse), cmocka_unit_test(test_fft_threads),
      cmocka_unit_test(test_fir_direct),
      cmocka_unit_test(test_fir_fft),      cmocka_unit_test(test_fir_fft_nonfinite),
      cmocka_unit_test(test_fir_fft_range),
      cmocka_unit_test(test_fir_fft_subnormal),
      cmocka_unit_test(test_fir_subnormal_huge), cmocka_unit_test(test_fir_one_tap),
      cmocka_unit_test(test_contract),
      cmocka_unit_test(test_contract_complex_inf),
      cmocka_unit_test(test_reduce),       cmocka_unit_test(test_reduce_sum_bits),
      cmocka_unit_test(test_reduce_sum_pairwise),
      cmocka_unit_test(test_map),
      cmocka_unit_test(test_empty),        cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_cancel_pieces),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
