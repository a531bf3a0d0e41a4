/*
 * CI test of the HIP backend without an AMD GPU: the fake HIP runtime of
 * fake_hip.c (host memory, an asynchronous stream, hiprtc, hipBLAS and
 * hipFFT on the host) behind the HIP driver table drives the shared GPU
 * runtime (backends/gpurt/) through the backend's own table:
 *
 *  - probe: hip:N with gfx target, UUID, memory, HIP version, and which
 *    libraries gemm and fft use; no device; the BLAS/FFT-less variant;
 *  - memory: writes and reads of odd sizes through a two-chunk staging ring
 *    against a host model, frees while copies are in flight (retired by
 *    events, not released early), pool reuse;
 *  - ops through the libraries, checked against naive double loops: gemm
 *    (batched, transposed, broadcast), fft (c2c, r2c) and contractions
 *    (complex ones through the complex gemm), with more shapes than the plan caches hold (evictions
 *    retire plans and their work areas);
 *  - raw kernels in lang "hip": compiled once through hiprtc and cached,
 *    run in dspk-hip-worker (tensors copied: the fake refuses IPC), a
 *    kernel that faults kills only the worker, the next one gets a fresh
 *    worker; a missing entry, a compile error, another language;
 *  - a sticky error in the daemon's own process: the device reports it on
 *    every later call, and close resets the device;
 *  - teardown: after every close the fake holds no device or pinned
 *    memory, event, stream, module, BLAS handle or FFT plan.
 * Fixed seeds; no GPU.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/schema.h"
#include "backends/hip/hip_internal.h"

struct fakehip_live {
  long dev_allocs, host_allocs, events, streams, modules, blas, plans, resets, launches,
      dead;
};
static void (*fake_live)(struct fakehip_live *);
static void (*fake_inject)(int);

static const struct dspk__backend *B = &dspk__backend_hip;
static struct dspk__dev *dev;
static char errmsg[4096];
static struct dspk__opctx ctx = {.errmsg = errmsg, .errmsg_len = sizeof(errmsg)};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void env_fake(int blas_fft) {
  setenv("DSPK_HIP_RUNTIME", FAKE_HIP_PATH, 1);
  setenv("DSPK_HIP_BLAS", blas_fft ? FAKE_HIP_PATH : "none", 1);
  setenv("DSPK_HIP_FFT", blas_fft ? FAKE_HIP_PATH : "none", 1);
  setenv("DSPK_HIP_WORKER", HIP_WORKER_PATH, 1);
  setenv("DSPK_HIP_PLAN_CACHE", "2", 1);
  setenv("DSPK_HIP_STAGE_CHUNKS", "2", 1);
  setenv("DSPK_HIP_STAGE_CHUNK_KIB", "4", 1);
  setenv("FAKE_HIP_DEVICES", "2", 1);
}

static int open_dev(void **state) {
  struct dspk__devinfo info[4];
  char why[200];
  (void)state;
  env_fake(1);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
  assert_int_equal(B->open(0, NULL, &dev), 0);
  return 0;
}

static void check_nothing_left(void) {
  struct fakehip_live l;
  fake_live(&l);
  assert_int_equal(l.dev_allocs, 0);
  assert_int_equal(l.host_allocs, 0);
  assert_int_equal(l.events, 0);
  assert_int_equal(l.streams, 0);
  assert_int_equal(l.modules, 0);
  assert_int_equal(l.blas, 0);
  assert_int_equal(l.plans, 0);
}

static int close_dev(void **state) {
  (void)state;
  B->close(dev);
  dev = NULL;
  B->shutdown();
  check_nothing_left();
  return 0;
}

/* ---- probe ------------------------------------------------------------------------ */

static void test_probe(void **state) {
  struct dspk__devinfo info[4];
  char why[200];
  (void)state;
  env_fake(1);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
  for (int i = 0; i < 2; i++) {
    printf("hip:%d %s %s [%s] mem=%llu uuid=%s\n", i, info[i].name, info[i].arch,
           info[i].driver, (unsigned long long)info[i].memory, info[i].uuid);
    assert_non_null(strstr(info[i].name, "Fake AMD Instinct"));
    assert_string_equal(info[i].arch, "gfx90a:sramecc+:xnack-");
    assert_string_equal(info[i].driver, "HIP 6.2.41134; gemm hipBLAS, fft hipFFT");
    assert_int_equal(info[i].memory, (uint64_t)64 << 30);
    assert_int_equal(strlen(info[i].uuid), 36);
  }
  assert_string_equal(info[1].uuid, "10111213-1415-1617-1819-1a1b1c1d1e1f");
  B->shutdown();
  /* Without the libraries, gemm and fft are our own kernels, and says so. */
  env_fake(0);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
  assert_string_equal(info[0].driver, "HIP 6.2.41134; gemm own, fft own");
  B->shutdown();
  /* No device. */
  setenv("FAKE_HIP_DEVICES", "0", 1);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 0);
  printf("no device: %s\n", why);
  assert_non_null(strstr(why, "no AMD GPU"));
  B->shutdown();
  check_nothing_left();
}

/* ---- memory --------------------------------------------------------------------------- */

static void test_memory(void **state) {
  enum { N = 70000 };
  unsigned char *model = malloc(N), *buf = malloc(N + 1);
  struct dspk__mem *m, *tmp;
  struct dspk__devstats st0, st1;
  (void)state;
  assert_int_equal(B->alloc(dev, N, &m), 0);
  for (int i = 0; i < N; i++)
    model[i] = (unsigned char)(i * 13);
  assert_int_equal(B->write(dev, m, 0, model, N), 0);
  for (int r = 0; r < 300; r++) {
    size_t n = 1 + (size_t)((urand() + 1) * 0.5 * (r % 4 ? 9000 : N - 1));
    size_t off = (size_t)((urand() + 1) * 0.5 * (double)(N - n));
    if (r % 3) {
      for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)(r + i);
      assert_int_equal(B->write(dev, m, off, buf, n), 0);
      memcpy(model + off, buf, n);
      memset(buf, 0xee, n); /* the caller may reuse its buffer at once */
    } else {
      assert_int_equal(B->read(dev, m, off, buf + 1, n), 0);
      if (memcmp(buf + 1, model + off, n) != 0)
        fail_msg("round %d: %zu bytes at %zu differ", r, n, off);
    }
  }
  assert_int_equal(B->read(dev, m, 0, buf, N), 0);
  assert_memory_equal(buf, model, N);
  assert_int_equal(B->write(dev, m, N - 1, buf, 2), DSPK_ERANGE);
  /* A block freed behind a queued copy is retired, not released. */
  memset(&st0, 0, sizeof(st0));
  B->stats(dev, &st0);
  assert_int_equal(B->alloc(dev, 3000, &tmp), 0);
  assert_int_equal(B->write(dev, tmp, 0, model, 3000), 0); /* queued: pinned ring */
  B->free(dev, tmp);
  memset(&st1, 0, sizeof(st1));
  B->stats(dev, &st1);
  assert_true(st1.retire_deferred > st0.retire_deferred);
  assert_true(st1.retire_in_flight >= 1);
  assert_int_equal(B->sync(dev), 0);
  memset(&st1, 0, sizeof(st1));
  B->stats(dev, &st1);
  assert_int_equal(st1.retire_in_flight, 0);
  assert_true(st1.retire_released > st0.retire_released);
  /* The released block comes back from the pool. */
  assert_int_equal(B->alloc(dev, 3000, &tmp), 0);
  memset(&st0, 0, sizeof(st0));
  B->stats(dev, &st0);
  assert_true(st0.pool_hits > st1.pool_hits);
  B->free(dev, tmp);
  /* A registered client mapping: copies go straight from and to it, by
   * DMA that may still run when write returns (the mapping stays
   * untouched until the task is done: here, until a sync). */
  assert_int_equal(B->host_register(dev, buf, N), 0);
  for (int i = 0; i < N; i++)
    buf[i] = (unsigned char)(i * 5 + 1);
  assert_int_equal(B->write(dev, m, 0, buf, N), 0);
  memcpy(model, buf, N);
  assert_int_equal(B->sync(dev), 0);
  memset(buf, 0, N);
  assert_int_equal(B->read(dev, m, 0, buf, N), 0);
  assert_memory_equal(buf, model, N);
  B->host_unregister(dev, buf);
  B->free(dev, m);
  free(model);
  free(buf);
}

/* ---- ops through hipBLAS and hipFFT ------------------------------------------------------ */

static size_t esz(dspk_dtype dt) { return dspk__dtype_size(dt); }
static int cplx(dspk_dtype dt) { return dt == DSPK_C64 || dt == DSPK_C128; }

/* Element i of a host array as a complex double. */
static void get(const void *p, dspk_dtype dt, size_t i, double *re, double *im) {
  *im = 0;
  switch (dt) {
  case DSPK_F32: *re = ((const float *)p)[i]; break;
  case DSPK_F64: *re = ((const double *)p)[i]; break;
  case DSPK_C64: *re = ((const float *)p)[2 * i]; *im = ((const float *)p)[2 * i + 1]; break;
  default: *re = ((const double *)p)[2 * i]; *im = ((const double *)p)[2 * i + 1]; break;
  }
}

static void *rand_host(dspk_dtype dt, size_t n) {
  void *p = malloc(n * esz(dt) + 1);
  for (size_t i = 0; i < n * (cplx(dt) ? 2 : 1); i++) {
    if (dt == DSPK_F32 || dt == DSPK_C64)
      ((float *)p)[i] = (float)urand();
    else
      ((double *)p)[i] = urand();
  }
  return p;
}

static void set_tensor(struct dspk__tensor *t, dspk_dtype dt, int rank, const int64_t *shape) {
  memset(t, 0, sizeof(*t));
  t->dtype = dt;
  t->rank = rank;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

static void upload(struct dspk__tensor *t, const void *host) {
  size_t n = dspk__tensor_nbytes(t);
  assert_int_equal(B->alloc(dev, n, &t->mem), 0);
  assert_int_equal(B->write(dev, t->mem, 0, host, n), 0);
}

/* Infers, places the outputs, runs, and returns out[0] on the host. */
static void *run(struct dspk__op *op) {
  char msg[256];
  void *host;
  size_t n;
  if (dspk__op_infer(op, msg, sizeof(msg)) != 0)
    fail_msg("infer: %s", msg);
  n = dspk__tensor_nbytes(&op->out[0]);
  assert_int_equal(B->alloc(dev, n, &op->out[0].mem), 0);
  errmsg[0] = 0;
  if (B->run(dev, op, &ctx) != 0)
    fail_msg("run: %s", errmsg);
  host = malloc(n + 1);
  assert_int_equal(B->read(dev, op->out[0].mem, 0, host, n), 0);
  for (int i = 0; i < op->nin; i++)
    B->free(dev, op->in[i].mem);
  B->free(dev, op->out[0].mem);
  return host;
}

static void close_to(double got, double want, double tol, const char *what, size_t i) {
  if (fabs(got - want) > tol * (1 + fabs(want)))
    fail_msg("%s[%zu]: %.9g, want %.9g", what, i, got, want);
}

static void check_gemm(dspk_dtype dt, int64_t nb, int64_t M, int64_t K, int64_t N, int ta,
                       int tb, int bcast_b) {
  struct dspk__op op;
  int64_t sa[3] = {nb, ta ? K : M, ta ? M : K}, sb[3] = {nb, tb ? N : K, tb ? K : N};
  void *a = rand_host(dt, (size_t)(nb * M * K)), *b = rand_host(dt, (size_t)(nb * K * N)), *c;
  double tol = dt == DSPK_F32 || dt == DSPK_C64 ? 1e-4 : 1e-12;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  set_tensor(&op.in[0], dt, 3, sa);
  if (bcast_b)
    set_tensor(&op.in[1], dt, 2, sb + 1);
  else
    set_tensor(&op.in[1], dt, 3, sb);
  op.u.gemm.trans_a = ta;
  op.u.gemm.trans_b = tb;
  op.u.gemm.alpha = 1.5;
  upload(&op.in[0], a);
  upload(&op.in[1], b);
  c = run(&op);
  for (int64_t q = 0; q < nb; q++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double sr = 0, si = 0, gr, gi;
        for (int64_t l = 0; l < K; l++) {
          double ar, ai, br, bi;
          get(a, dt, (size_t)(q * M * K + (ta ? l * M + i : i * K + l)), &ar, &ai);
          get(b, dt, (size_t)((bcast_b ? 0 : q * K * N) + (tb ? j * K + l : l * N + j)), &br,
              &bi);
          sr += ar * br - ai * bi;
          si += ar * bi + ai * br;
        }
        get(c, dt, (size_t)((q * M + i) * N + j), &gr, &gi);
        close_to(gr, 1.5 * sr, tol, "gemm re", (size_t)((q * M + i) * N + j));
        close_to(gi, 1.5 * si, tol, "gemm im", (size_t)((q * M + i) * N + j));
      }
  free(a);
  free(b);
  free(c);
}

static void check_fft(dspk_dtype dt, int64_t batch, int64_t n) {
  struct dspk__op op;
  int64_t shape[2] = {batch, n};
  int real = !cplx(dt);
  int64_t nout = real ? n / 2 + 1 : n;
  dspk_dtype odt = dt == DSPK_F32 ? DSPK_C64 : dt == DSPK_F64 ? DSPK_C128 : dt;
  void *x = rand_host(dt, (size_t)(batch * n)), *y;
  double tol = dt == DSPK_F32 || dt == DSPK_C64 ? 1e-4 : 1e-10;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  set_tensor(&op.in[0], dt, 2, shape);
  upload(&op.in[0], x);
  y = run(&op);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t k = 0; k < nout; k++) {
      double sr = 0, si = 0, gr, gi;
      for (int64_t j = 0; j < n; j++) {
        double xr, xi, a = -2 * M_PI * (double)j * (double)k / (double)n;
        get(x, dt, (size_t)(b * n + j), &xr, &xi);
        sr += xr * cos(a) - xi * sin(a);
        si += xr * sin(a) + xi * cos(a);
      }
      get(y, odt, (size_t)(b * nout + k), &gr, &gi);
      close_to(gr, sr, tol * n, "fft re", (size_t)(b * nout + k));
      close_to(gi, si, tol * n, "fft im", (size_t)(b * nout + k));
    }
  free(x);
  free(y);
}

static void check_contract(dspk_dtype dt, int64_t I, int64_t J, int64_t K) {
  struct dspk__op op;
  int64_t sa[2] = {I, J}, sb[2] = {J, K};
  void *a = rand_host(dt, (size_t)(I * J)), *b = rand_host(dt, (size_t)(J * K)), *c;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_CONTRACT;
  op.nin = 2;
  snprintf(op.u.contract.subscripts, sizeof(op.u.contract.subscripts), "ij,jk->ik");
  set_tensor(&op.in[0], dt, 2, sa);
  set_tensor(&op.in[1], dt, 2, sb);
  upload(&op.in[0], a);
  upload(&op.in[1], b);
  c = run(&op);
  for (int64_t i = 0; i < I; i++)
    for (int64_t k = 0; k < K; k++) {
      double sr = 0, si = 0, ar, ai, br, bi, g, gi;
      for (int64_t j = 0; j < J; j++) {
        get(a, dt, (size_t)(i * J + j), &ar, &ai);
        get(b, dt, (size_t)(j * K + k), &br, &bi);
        sr += ar * br - ai * bi;
        si += ar * bi + ai * br;
      }
      get(c, dt, (size_t)(i * K + k), &g, &gi);
      close_to(g, sr, 1e-4, "contract re", (size_t)(i * K + k));
      close_to(gi, si, 1e-4, "contract im", (size_t)(i * K + k));
    }
  free(a);
  free(b);
  free(c);
}

static void test_ops_libraries(void **state) {
  struct dspk__devstats s0, s1;
  (void)state;
  check_gemm(DSPK_F32, 1, 5, 7, 3, 0, 0, 0);
  check_gemm(DSPK_F64, 3, 4, 6, 5, 1, 0, 1);
  check_gemm(DSPK_F32, 2, 3, 4, 2, 0, 1, 0);
  check_gemm(DSPK_F64, 2, 2, 3, 4, 1, 1, 0);
  check_fft(DSPK_C64, 3, 8);
  check_fft(DSPK_F64, 2, 6);
  memset(&s0, 0, sizeof(s0));
  B->stats(dev, &s0);
  /* More shapes than the plan caches hold: FFT plans (16) with work areas
   * from the pool, contraction plans (DSPK_HIP_PLAN_CACHE=2). */
  for (int64_t n = 3; n < 24; n++)
    check_fft(DSPK_C128, 2, n);
  for (int64_t j = 1; j < 6; j++)
    check_contract(j % 2 ? DSPK_C64 : DSPK_C128, 3, j, 4);
  check_contract(DSPK_F32, 2, 3, 5);
  memset(&s1, 0, sizeof(s1));
  B->stats(dev, &s1);
  /* Evicted plans (and the fft plans' work areas) went through the queue. */
  assert_true(s1.retire_deferred - s0.retire_deferred >= 5 + 3);
}

static void test_ops_own_kernels(void **state) {
  struct dspk__op op;
  struct dspk__devinfo info[4];
  char why[200];
  int64_t sa[2] = {4, 3}, sb[2] = {3, 2}, sx[1] = {16};
  struct fakehip_live l0, l1;
  float a[12] = {0}, b[6] = {0};
  void *c;
  (void)state;
  env_fake(0);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
  assert_int_equal(B->open(1, NULL, &dev), 0);
  fake_live(&l0);
  /* gemm and fft launch our own kernels (the fake runs none of them). */
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  op.u.gemm.alpha = 1;
  set_tensor(&op.in[0], DSPK_F32, 2, sa);
  set_tensor(&op.in[1], DSPK_F32, 2, sb);
  upload(&op.in[0], a);
  upload(&op.in[1], b);
  free(run(&op));
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  set_tensor(&op.in[0], DSPK_C64, 1, sx);
  {
    float x[32] = {0};
    upload(&op.in[0], x);
  }
  free(run(&op));
  fake_live(&l1);
  assert_int_equal(l1.launches - l0.launches, 2);
  /* Half precision needs a BLAS library. */
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  op.u.gemm.alpha = 1;
  set_tensor(&op.in[0], DSPK_F16, 2, sa);
  set_tensor(&op.in[1], DSPK_F16, 2, sb);
  upload(&op.in[0], a);
  upload(&op.in[1], b);
  assert_int_equal(dspk__op_infer(&op, why, sizeof(why)), 0);
  assert_int_equal(B->alloc(dev, dspk__tensor_nbytes(&op.out[0]), &op.out[0].mem), 0);
  assert_int_equal(B->run(dev, &op, &ctx), DSPK_ENOTSUP);
  assert_non_null(strstr(errmsg, "needs a BLAS library"));
  for (int i = 0; i < 2; i++)
    B->free(dev, op.in[i].mem);
  B->free(dev, op.out[0].mem);
  /* An alpha that rounds to 0 in f32 (the product's precision) is the 0 the
   * op computes with: it reads neither A nor B, so f16 needs no BLAS library
   * here, and the result is +0 (alpha negative: still no -0). */
  for (int neg = 0; neg < 2; neg++) {
    float *o;
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.nin = 2;
    op.u.gemm.alpha = neg ? -1e-50 : 1e-50;
    set_tensor(&op.in[0], DSPK_F16, 2, sa);
    set_tensor(&op.in[1], DSPK_F16, 2, sb);
    upload(&op.in[0], a);
    upload(&op.in[1], b);
    o = run(&op);
    for (int i = 0; i < 8; i++)
      assert_true(o[i] == 0 && !signbit(o[i]));
    free(o);
  }
  /* A beta that rounds to 0 reads no C: the output (C copied in) is cleared,
   * not scaled by a kernel (which would keep C's NaN: NaN*1e-50). */
  {
    int64_t sc[2] = {4, 2};
    float cn[8], *o;
    for (int i = 0; i < 8; i++)
      cn[i] = NAN;
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.nin = 3;
    op.u.gemm.alpha = 0;
    op.u.gemm.beta = 1e-50;
    set_tensor(&op.in[0], DSPK_F32, 2, sa);
    set_tensor(&op.in[1], DSPK_F32, 2, sb);
    set_tensor(&op.in[2], DSPK_F32, 2, sc);
    upload(&op.in[0], a);
    upload(&op.in[1], b);
    upload(&op.in[2], cn);
    fake_live(&l0);
    o = run(&op);
    fake_live(&l1);
    assert_int_equal(l1.launches - l0.launches, 1); /* C into the output */
    for (int i = 0; i < 8; i++)
      assert_true(o[i] == 0 && !signbit(o[i]));
    free(o);
  }
  c = NULL;
  free(c);
}

/* ---- raw kernels in the worker -------------------------------------------------------------- */

static const char ksrc[] =
    "extern \"C\" __global__ void fake_fill(float *x, int n, float v) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = v; }\n"
    "extern \"C\" __global__ void fake_fault(float *x, int n, float v) { x[-1000000] = v; }\n";

static int raw(const char *lang, const char *src, const char *entry, struct dspk__mem *m,
               int n, float v) {
  struct dspk__op op;
  int64_t shape[1] = {n};
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_KERNEL;
  op.nin = 1;
  set_tensor(&op.in[0], DSPK_F32, 1, shape);
  op.in[0].mem = m;
  op.u.kernel.lang = lang;
  op.u.kernel.source = src;
  op.u.kernel.source_len = strlen(src);
  snprintf(op.u.kernel.entry, sizeof(op.u.kernel.entry), "%s", entry);
  for (int i = 0; i < 3; i++)
    op.u.kernel.grid[i] = op.u.kernel.block[i] = 1;
  op.u.kernel.block[0] = 64;
  op.u.kernel.nargs = 3;
  op.u.kernel.args[0].kind = DSPK__KARG_TENSOR;
  op.u.kernel.args[0].v.tensor = 0;
  op.u.kernel.args[1].kind = DSPK__KARG_I32;
  op.u.kernel.args[1].v.i32 = n;
  op.u.kernel.args[2].kind = DSPK__KARG_F32;
  op.u.kernel.args[2].v.f32 = v;
  errmsg[0] = 0;
  return B->run(dev, &op, &ctx);
}

static void expect_filled(struct dspk__mem *m, int n, float v) {
  float got[64];
  assert_int_equal(B->read(dev, m, 0, got, sizeof(float) * (size_t)n), 0);
  for (int i = 0; i < n; i++)
    assert_true(got[i] == v);
}

static void test_raw_kernels(void **state) {
  struct dspk__mem *m;
  struct dspk__devstats st;
  (void)state;
  assert_int_equal(B->alloc(dev, 64 * sizeof(float), &m), 0);
  if (raw("hip", ksrc, "fake_fill", m, 64, 2.5f) != 0)
    fail_msg("fill: %s", errmsg);
  expect_filled(m, 64, 2.5f);
  /* Compiled once: the second run finds the module in the cache. */
  memset(&st, 0, sizeof(st));
  B->stats(dev, &st);
  assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 3.5f), 0);
  expect_filled(m, 64, 3.5f);
  {
    struct dspk__devstats st2;
    memset(&st2, 0, sizeof(st2));
    B->stats(dev, &st2);
    assert_int_equal(st2.kernels_compiled, st.kernels_compiled);
  }
  /* A fault kills the worker only. */
  assert_int_equal(raw("hip", ksrc, "fake_fault", m, 64, 1.0f), DSPK_EDEVICE);
  printf("fault: %s\n", errmsg);
  assert_non_null(strstr(errmsg, "hipErrorIllegalAddress"));
  assert_non_null(strstr(errmsg, "isolated worker process"));
  assert_non_null(strstr(errmsg, "hip:0"));
  assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 4.5f), 0);
  expect_filled(m, 64, 4.5f);
  assert_true(dev->worker_starts >= 2);
  /* Another uid's kernel gets a fresh worker (a new context: nothing of
   * the first user's kernels in its shared memory or registers); that
   * uid's next one keeps it; back to the first uid, another fresh one. */
  {
    uint64_t starts = dev->worker_starts;
    ctx.owner = 1001;
    assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 5.5f), 0);
    assert_int_equal(dev->worker_starts, starts + 1);
    assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 6.5f), 0);
    assert_int_equal(dev->worker_starts, starts + 1);
    ctx.owner = 0;
    assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 7.5f), 0);
    assert_int_equal(dev->worker_starts, starts + 2);
    expect_filled(m, 64, 7.5f);
  }
  /* Errors that never reach the worker. */
  assert_int_equal(raw("hip", ksrc, "no_such", m, 64, 1.0f), DSPK_EINVAL);
  assert_non_null(strstr(errmsg, "no entry"));
  assert_int_equal(raw("hip", "void k() { syntax_error; }", "k", m, 64, 1.0f), DSPK_ECOMPILE);
  assert_non_null(strstr(errmsg, "syntax_error"));
  assert_int_equal(raw("cuda", ksrc, "fake_fill", m, 64, 1.0f), DSPK_ENOTSUP);
  assert_non_null(strstr(errmsg, "lang \"hip\""));
  B->free(dev, m);
}

/* The compiles so far on dev. */
static uint64_t compiled(void) {
  struct dspk__devstats st;
  memset(&st, 0, sizeof(st));
  B->stats(dev, &st);
  return st.kernels_compiled;
}

/* A client's raw kernel is its owner's alone (docs/security.md): the same
 * source run by another uid compiles again, so whether one user ran a
 * source shows nowhere to another.  Its compile runs in a child (`EXE
 * --kernel-compile hip:ARCH`, this test's main) under the limits of
 * backends/common/kcompile.h: the code and the compiler's log come back
 * from there. */
static void test_raw_owner_child(void **state) {
  struct dspk__devenv env = {.compile_exe = "/proc/self/exe"};
  struct dspk__devinfo info[4];
  struct dspk__mem *m;
  char why[200];
  uint64_t c0;
  (void)state;
  env_fake(1);
  assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
  assert_int_equal(B->open(0, &env, &dev), 0);
  assert_int_equal(B->alloc(dev, 64 * sizeof(float), &m), 0);
  c0 = compiled();
  ctx.owner = 1001;
  if (raw("hip", ksrc, "fake_fill", m, 64, 2.5f) != 0)
    fail_msg("fill: %s", errmsg);
  expect_filled(m, 64, 2.5f);
  assert_int_equal(compiled(), c0 + 1);
  assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 3.5f), 0); /* its own: the table */
  assert_int_equal(compiled(), c0 + 1);
  ctx.owner = 1002;
  assert_int_equal(raw("hip", ksrc, "fake_fill", m, 64, 4.5f), 0); /* not 1001's */
  expect_filled(m, 64, 4.5f);
  assert_int_equal(compiled(), c0 + 2);
  assert_int_equal(raw("hip", "void k() { syntax_error; }", "k", m, 64, 1.0f), DSPK_ECOMPILE);
  assert_non_null(strstr(errmsg, "syntax_error"));
  ctx.owner = 0;
  B->free(dev, m);
}

/* ---- a sticky error in this process ---------------------------------------------------------- */

static void test_sticky_error(void **state) {
  struct dspk__op op;
  int64_t shape[1] = {16};
  float x[16] = {0};
  struct dspk__mem *m;
  struct fakehip_live l;
  char why[200];
  (void)state;
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_MAP;
  op.nin = 2;
  op.u.map.fn = DSPK_MAP_ADD;
  set_tensor(&op.in[0], DSPK_F32, 1, shape);
  set_tensor(&op.in[1], DSPK_F32, 1, shape);
  upload(&op.in[0], x);
  upload(&op.in[1], x);
  assert_int_equal(dspk__op_infer(&op, why, sizeof(why)), 0);
  assert_int_equal(B->alloc(dev, 64, &op.out[0].mem), 0);
  fake_inject(1);
  assert_int_equal(B->run(dev, &op, &ctx), DSPK_EDEVICE);
  printf("sticky: %s\n", errmsg);
  assert_non_null(strstr(errmsg, "the device faulted"));
  assert_int_equal(B->alloc(dev, 64, &m), DSPK_EDEVICE);
  assert_int_equal(B->run(dev, &op, &ctx), DSPK_EDEVICE);
  assert_non_null(strstr(errmsg, "cannot recover"));
  for (int i = 0; i < 2; i++)
    B->free(dev, op.in[i].mem);
  B->free(dev, op.out[0].mem);
  B->close(dev);
  dev = NULL;
  fake_live(&l);
  assert_int_equal(l.resets, 1);
  fake_inject(-1); /* the fake's next "process" */
  B->shutdown();
}

/* The capability query: with hipBLAS every op and dtype, f16/bf16 gemm
 * included; without it (our own gemm kernel) gemm takes f32 and f64 only;
 * raw kernels in "hip" only, another language is ENOTSUP naming it. */
static void test_caps(void **state) {
  struct dspk__devinfo info[4];
  struct dspk__devcaps caps;
  struct dspk__op o;
  char why[200], msg[256];
  const uint32_t f = (1u << DSPK_F32) | (1u << DSPK_F64);
  const uint32_t half = (1u << DSPK_F16) | (1u << DSPK_BF16);
  (void)state;
  for (int blas = 0; blas < 2; blas++) {
    env_fake(blas);
    assert_int_equal(B->probe(info, 4, why, sizeof(why)), 2);
    assert_int_equal(B->open(0, NULL, &dev), 0);
    memset(&caps, 0, sizeof caps);
    B->caps(dev, &caps);
    assert_int_equal(caps.dtypes[DSPK_OP_GEMM], blas ? f | half : f);
    for (int op = DSPK_OP_FFT; op < DSPK_OP_KERNEL; op++)
      assert_int_equal(caps.dtypes[op], dspk__op_dtypes[op]);
    assert_int_equal(caps.langs, 1u << dspk__choice_find(dspk__kernel_langs, "hip", 3));
    memset(&o, 0, sizeof o);
    o.kind = DSPK_OP_GEMM;
    o.nin = 2;
    o.in[0].dtype = o.in[1].dtype = DSPK_F16;
    assert_int_equal(dspk__caps_check(&caps, &o, "hip:0", msg, sizeof msg),
                     blas ? 0 : DSPK_ENOTSUP);
    if (!blas)
      assert_string_equal(msg, "gemm: hip:0 does not run gemm on f16 (it takes f32, f64)");
    memset(&o, 0, sizeof o);
    o.kind = DSPK_OP_KERNEL;
    o.u.kernel.lang = "hip";
    assert_int_equal(dspk__caps_check(&caps, &o, "hip:0", msg, sizeof msg), 0);
    o.u.kernel.lang = "cuda";
    assert_int_equal(dspk__caps_check(&caps, &o, "hip:0", msg, sizeof msg), DSPK_ENOTSUP);
    assert_string_equal(msg, "kernel: hip:0 takes lang hip, not \"cuda\"");
    if (!blas) {
      B->close(dev);
      dev = NULL;
      B->shutdown();
    }
  }
}

int main(int argc, char **argv) {
  /* The child a device's compile_exe names (test_raw_owner_child). */
  if (argc == 3 && strcmp(argv[1], "--kernel-compile") == 0)
    return dspk__kernel_compile_main(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe),
      cmocka_unit_test_teardown(test_caps, close_dev),
      cmocka_unit_test_setup_teardown(test_memory, open_dev, close_dev),
      cmocka_unit_test_setup_teardown(test_ops_libraries, open_dev, close_dev),
      cmocka_unit_test_teardown(test_ops_own_kernels, close_dev),
      cmocka_unit_test_setup_teardown(test_raw_kernels, open_dev, close_dev),
      cmocka_unit_test_teardown(test_raw_owner_child, close_dev),
      cmocka_unit_test_setup(test_sticky_error, open_dev),
  };
  void *fake = dlopen(FAKE_HIP_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!fake) {
    fprintf(stderr, "cannot load %s: %s\n", FAKE_HIP_PATH, dlerror());
    return 1;
  }
  *(void **)&fake_live = dlsym(fake, "fakehip_live");
  *(void **)&fake_inject = dlsym(fake, "fakehip_inject");
  if (!fake_live || !fake_inject)
    return 1;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
