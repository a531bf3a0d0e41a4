/*
 * bench_cuda: the CUDA backend's benchmarks (issue 5 §8), side by side.
 *
 *   bench_cuda backend
 *       gemm 8192^2 f32 and bf16 and a batched fft of 2^20 c64 (batch 16)
 *       through the backend table (what a dspkd runner does with data in
 *       daemon buffers) vs cuBLAS/cuFFT called directly in-process on the
 *       same data; then the plan-eviction trace: 200 contractions over 50
 *       shapes with a plan cache of 16, with event retirement vs a stream
 *       synchronize on every eviction (same binary, a switch), reporting
 *       the GPU busy fraction (CUDA events around each task) and throughput.
 *   bench_cuda trace [PLAN_CACHE]
 *       only the eviction traces, with a contraction plan cache of
 *       PLAN_CACHE plans (default 16; 64 holds all 50 shapes: no misses),
 *       a retirement queue of 1024 entries, and one more pass per size,
 *       "gated": the stream held until the whole trace is enqueued, so the
 *       GPU runs it back to back (the busy figure's floor).
 *   bench_cuda daemon SOCKET [DEVICE]
 *       the same gemm/fft through a running dspkd (operands and outputs in
 *       daemon buffers on DEVICE, default cuda:0, tasks pipelined) vs
 *       cuBLAS/cuFFT in-process (on a device other than CUDA the second
 *       gemm is f16 against cublasGemmEx f16, and the stream is left out);
 *       then, on CUDA, a
 *       pipelined stream of gemm 1024^2 on resident buffers, answered on
 *       completion: the GPU busy fraction (goal >= 95%) and whether every
 *       answer came after its work (exit 1 if not).
 *   bench_cuda fir SOCKET DEVICE [REPS]
 *       fir of 2^24 f32 samples with 4096 taps on DEVICE (cuda:0, vulkan:N)
 *       through a running dspkd (daemon buffers; a stream of REPS tasks,
 *       default 20) vs an overlap-save fir written with cuFFT in-process
 *       (REPS runs, the best of three block lengths);
 *       the outputs are compared (exit 1 when they differ).
 *   bench_cuda latency SOCKET DEVICE
 *       one request at a time: dspk_ping, and a map of 16 f32 on DEVICE
 *       (medians of the wall time and of the answers' time_us).
 *   bench_cuda clientmem SOCKET
 *       gemm 4096^2 f32 with operands and result in the client's memory
 *       (malloc'd, and dspk_shared_alloc'd) through dspkd on cuda:0 vs
 *       pinned copies + cublasSgemm + copy back in-process; and client
 *       memory -> cuda:0 (256 MiB in a shared buffer) vs cuMemcpyHtoD from
 *       pinned memory (issue 12's H200 goals: >= 0.9 and >= 0.8).
 *   bench_cuda firstresult
 *       what a fresh process pays to get one gemm 1024^2 on the GPU by
 *       itself: load the driver, context, cuBLAS, copies, gemm, copy back.
 *   bench_cuda mknpy DIR
 *       writes DIR/a.npy and DIR/b.npy (1024x1024 f32) for dspk-submit.
 *
 * Prints markdown rows; timings are medians over repetitions.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"
#include "bench/common/bench_util.h"
#include "bench/common/cuda_ref.h"
#include "dspk/dspk.h"

#define CU dspk__cu
#define BL dspk__cublas

#define CK(x) DSPK_BENCH_CK("bench_cuda", x)

static void fill_random(void *p, size_t n, dspk_dtype dt) {
  uint64_t s = 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    float f = (float)((double)(s >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
    if (dt == DSPK_BF16) {
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else if (dt == DSPK_F16) {
      ((_Float16 *)p)[i] = (_Float16)f;
    } else {
      ((float *)p)[i] = f;
    }
  }
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), dspk_bench_cmp_d);
  return v[n / 2];
}

/* ---- backend vs in-process ------------------------------------------------ */

static const struct dspk__backend *B = &dspk__backend_cuda;
static struct dspk__dev *dev;

static struct dspk__tensor T(dspk_dtype dt, int rank, const int64_t *shape) {
  struct dspk__tensor t;
  memset(&t, 0, sizeof(t));
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++)
    t.shape[i] = shape[i];
  return t;
}

/* Times reps runs of op through the backend (operands already placed):
 * median of 3 batches, ms per run. */
static double time_backend(struct dspk__op *op, int reps) {
  atomic_int cancel = 0;
  char err[512];
  struct dspk__opctx ctx = {&cancel, NULL, NULL, err, sizeof(err), 0};
  double v[3];
  CK(B->run(dev, op, &ctx));
  CK(B->sync(dev));
  for (int k = 0; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < reps; i++)
      if (B->run(dev, op, &ctx)) {
        fprintf(stderr, "run: %s\n", err);
        exit(1);
      }
    CK(B->sync(dev));
    v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  return median(v, 3);
}

static void bench_gemm_backend(dspk_dtype dt, int n, int reps) {
  int64_t s[2] = {n, n};
  size_t isz = dspk__dtype_size(dt), nn = (size_t)n * n;
  void *ha = malloc(nn * isz), *hb = malloc(nn * isz);
  struct dspk__mem *ma, *mb, *mc;
  struct dspk__op op;
  char msg[256];
  double tb, tc, flop = 2.0 * n * (double)n * n;
  fill_random(ha, nn, dt);
  fill_random(hb, nn, dt);
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_GEMM;
  op.nin = 2;
  op.in[0] = T(dt, 2, s);
  op.in[1] = T(dt, 2, s);
  op.u.gemm.alpha = 1;
  CK(dspk__op_infer(&op, msg, sizeof(msg)));
  CK(B->alloc(dev, nn * isz, &ma));
  CK(B->alloc(dev, nn * isz, &mb));
  CK(B->alloc(dev, nn * 4, &mc));
  CK(B->write(dev, ma, 0, ha, nn * isz));
  CK(B->write(dev, mb, 0, hb, nn * isz));
  op.in[0].mem = ma;
  op.in[1].mem = mb;
  op.out[0].mem = mc;
  tb = time_backend(&op, reps);
  tc = dspk_bench_cublas_gemm(dt, n, ha, hb, reps);
  printf("| gemm %d^2 %s | %.3f ms (%.1f TFLOP/s) | %.3f ms (%.1f TFLOP/s) | %.3f |\n", n,
         dspk__dtype_name(dt), tb, flop / tb / 1e9, tc, flop / tc / 1e9, tc / tb);
  B->free(dev, ma);
  B->free(dev, mb);
  B->free(dev, mc);
  free(ha);
  free(hb);
}

static void bench_fft_backend(int64_t n, int64_t batch, int reps) {
  int64_t s[2] = {batch, n};
  size_t bytes = (size_t)(n * batch) * 8;
  void *hx = malloc(bytes);
  struct dspk__mem *mx, *my;
  struct dspk__op op;
  char msg[256];
  double tb, tc;
  fill_random(hx, (size_t)(n * batch) * 2, DSPK_F32);
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FFT;
  op.nin = 1;
  op.in[0] = T(DSPK_C64, 2, s);
  CK(dspk__op_infer(&op, msg, sizeof(msg)));
  CK(B->alloc(dev, bytes, &mx));
  CK(B->alloc(dev, bytes, &my));
  CK(B->write(dev, mx, 0, hx, bytes));
  op.in[0].mem = mx;
  op.out[0].mem = my;
  tb = time_backend(&op, reps);
  tc = dspk_bench_cufft(n, batch, hx, reps);
  printf("| fft 2^%d c64 x %lld | %.3f ms (%.0f GB/s) | %.3f ms (%.0f GB/s) | %.3f |\n",
         (int)log2((double)n), (long long)batch, tb, 2.0 * bytes / tb / 1e6, tc,
         2.0 * bytes / tc / 1e6, tc / tb);
  B->free(dev, mx);
  B->free(dev, my);
  free(hx);
}

/* fir of 2^24 f32 samples with 4096 taps through the backend, each FFT
 * path forced (no daemon), vs the in-process cuFFT overlap-save: what the
 * backend's own work costs, apart from the daemon's. */
static void bench_fir_backend(int reps) {
  int64_t n = (int64_t)1 << 24, k = 4096, L = 0, xs[1] = {n}, hs[1] = {k};
  float *hx = malloc((size_t)n * 4), *hh = malloc((size_t)k * 4);
  struct dspk__mem *mx, *mh, *my;
  struct dspk__op op;
  char msg[256], why[256];
  CUcontext ctx;
  CK(dspk__cuda_load_nvrtc(why, sizeof(why)));
  CK(dspk__cuda_load_cufft(why, sizeof(why)));
  CK(CU.cuDevicePrimaryCtxRetain(&ctx, 0));
  CK(CU.cuCtxSetCurrent(ctx));
  fill_random(hx, (size_t)n, DSPK_F32);
  fill_random(hh, (size_t)k, DSPK_F32);
  CK(B->alloc(dev, (size_t)n * 4, &mx));
  CK(B->alloc(dev, (size_t)k * 4, &mh));
  CK(B->alloc(dev, (size_t)n * 4, &my));
  CK(B->write(dev, mx, 0, hx, (size_t)n * 4));
  CK(B->write(dev, mh, 0, hh, (size_t)k * 4));
  memset(&op, 0, sizeof(op));
  op.kind = DSPK_OP_FIR;
  op.nin = 2;
  op.in[0] = T(DSPK_F32, 1, xs);
  op.in[1] = T(DSPK_F32, 1, hs);
  CK(dspk__op_infer(&op, msg, sizeof(msg)));
  op.in[0].mem = mx;
  op.in[1].mem = mh;
  op.out[0].mem = my;
  double tr = dspk_bench_cufft_fir(n, k, hx, hh, reps, NULL, &L);
  for (int m = 1; m <= 3; m++) {
    dspk__cuda_fir_force(m);
    double tb = time_backend(&op, reps);
    printf("| fir 2^24 f32 x 4096 taps, %s | %.3f ms | cuFFT overlap-save L=%lld %.3f ms | %.3f |\n",
           dspk__cuda_fir_last(), tb, (long long)L, tr, tr / tb);
  }
  dspk__cuda_fir_force(-1);
  CU.cuDevicePrimaryCtxRelease(0);
  B->free(dev, mx);
  B->free(dev, mh);
  B->free(dev, my);
  free(hx);
  free(hh);
}

/* cuStreamWaitValue32 (looked up in the driver the backend opened): a
 * "gated" pass holds the stream behind a flag until every contraction is
 * enqueued, so the GPU then runs them back to back with no host work in
 * between: the busy figure's floor, set by the GPU's own gaps between
 * tasks (the two trace events and the next launch). */
typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, unsigned, unsigned);
static int trace_gated;

/* The eviction trace: 200 contractions "ikl,jlk->ji" (k*l = k of the
 * arguments, l = 16) over 50 shapes (i varies), plan cache 16.  Each plan
 * permutes B into a workspace of its own (k and l swap) and makes the
 * product as C^T, so every eviction retires a workspace.  Busy = sum of
 * per-task GPU spans / whole span. */
static void bench_trace(int sync_on_evict, int64_t i0, int64_t di, int64_t j, int64_t k,
                        const char *label) {
  enum { NT = 200, NS = 50 };
  struct dspk__mem *ma, *mb, *mc;
  int64_t imax = i0 + di * (NS - 1);
  size_t bytes_a = (size_t)(imax * k) * 4, bytes_b = (size_t)(j * k) * 4;
  size_t bytes_c = (size_t)(imax * j) * 4;
  void *h = malloc(bytes_a > bytes_b ? bytes_a : bytes_b);
  CUevent ev[2 * NT];
  atomic_int cancel = 0;
  char err[512];
  struct dspk__opctx ctx = {&cancel, NULL, NULL, err, sizeof(err), 0};
  struct dspk__devstats s0, s1;
  uint64_t seed = 12345;
  int shapes[NT];
  double t0, wall, busy = 0, gpu[NT], hh[NT], hm[NT];
  int nh = 0, nm = 0;
  float span;
  CUdeviceptr gate = 0;
  for (int t = 0; t < NT; t++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    shapes[t] = (int)((seed >> 33) % NS);
  }
  fill_random(h, (bytes_a > bytes_b ? bytes_a : bytes_b) / 4, DSPK_F32);
  CK(B->alloc(dev, bytes_a, &ma));
  CK(B->alloc(dev, bytes_b, &mb));
  CK(B->alloc(dev, bytes_c, &mc));
  CK(B->write(dev, ma, 0, h, bytes_a));
  CK(B->write(dev, mb, 0, h, bytes_b));
  for (int e = 0; e < 2 * NT; e++)
    CK(CU.cuEventCreate(&ev[e], CU_EVENT_DEFAULT));
  dspk__cuda_set_sync_on_evict(dev, sync_on_evict);
  CK(B->sync(dev));
  memset(&s0, 0, sizeof(s0));
  memset(&s1, 0, sizeof(s1));
  B->stats(dev, &s0);
  if (trace_gated) {
    wait_value_fn wait = (wait_value_fn)(uintptr_t)dlsym(CU.lib, "cuStreamWaitValue32_v2");
    if (!wait) {
      fprintf(stderr, "bench_cuda: no cuStreamWaitValue32_v2 in the driver\n");
      exit(1);
    }
    CK(CU.cuMemAlloc(&gate, 4));
    CK(CU.cuMemsetD8Async(gate, 0, 4, dspk__cuda_stream(dev)));
    CK(wait(dspk__cuda_stream(dev), gate, 1, 0 /* CU_STREAM_WAIT_VALUE_GEQ */));
  }
  t0 = dspk_bench_now_ms();
  for (int t = 0; t < NT; t++) {
    struct dspk__op op;
    int64_t as[3] = {i0 + di * shapes[t], k / 16, 16}, bs[3] = {j, 16, k / 16};
    char msg[256];
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_CONTRACT;
    op.nin = 2;
    snprintf(op.u.contract.subscripts, sizeof(op.u.contract.subscripts), "ikl,jlk->ji");
    op.in[0] = T(DSPK_F32, 3, as);
    op.in[1] = T(DSPK_F32, 3, bs);
    CK(dspk__op_infer(&op, msg, sizeof(msg)));
    op.in[0].mem = ma;
    op.in[1].mem = mb;
    op.out[0].mem = mc;
    /* The backend records these right before the contraction's first
     * launch and after its last, so host-side work (plan creation, a
     * synchronize on eviction) shows up as idle GPU time. */
    dspk__cuda_set_trace_events(dev, ev[2 * t], ev[2 * t + 1]);
    {
      uint64_t m0 = dspk__gpurt_contract_misses(dev);
      double h0 = dspk_bench_now_ms();
      if (B->run(dev, &op, &ctx)) {
        fprintf(stderr, "contract: %s\n", err);
        exit(1);
      }
      double us = (dspk_bench_now_ms() - h0) * 1e3;
      if (dspk__gpurt_contract_misses(dev) != m0)
        hm[nm++] = us;
      else
        hh[nh++] = us;
    }
  }
  if (trace_gated) {
    CUstream s2;
    CK(CU.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(CU.cuMemsetD8Async(gate, 1, 4, s2));
    CK(CU.cuStreamSynchronize(s2));
    CK(CU.cuStreamDestroy(s2));
  }
  CK(B->sync(dev));
  wall = dspk_bench_now_ms() - t0;
  if (gate)
    CK(CU.cuMemFree(gate));
  B->stats(dev, &s1);
  for (int t = 0; t < NT; t++) {
    float ms;
    CK(CU.cuEventElapsedTime(&ms, ev[2 * t], ev[2 * t + 1]));
    busy += ms;
    gpu[t] = ms * 1e3;
  }
  qsort(hh, (size_t)nh, sizeof(double), dspk_bench_cmp_d);
  qsort(hm, (size_t)nm, sizeof(double), dspk_bench_cmp_d);
  qsort(gpu, NT, sizeof(double), dspk_bench_cmp_d);
  CK(CU.cuEventElapsedTime(&span, ev[0], ev[2 * NT - 1]));
  printf("| %s, %s%s | %.1f%% | %.0f contractions/s | %.2f ms | %.1f / %.1f us (%d / %d) | "
         "%.1f us | deferred %llu, barrier fallbacks %llu, max in flight %llu, pool misses "
         "%llu |\n",
         label, sync_on_evict ? "sync per eviction" : "event retirement",
         trace_gated ? ", gated (the GPU's floor)"
                     : dev->gemm_small ? "" : ", cuBLAS for every product",
         100.0 * busy / span, NT / (wall / 1e3), wall, nh ? hh[nh / 2] : 0.0,
         nm ? hm[nm / 2] : 0.0, nh, nm, gpu[NT / 2],
         (unsigned long long)(s1.retire_deferred - s0.retire_deferred),
         (unsigned long long)(s1.retire_barrier_fallbacks - s0.retire_barrier_fallbacks),
         (unsigned long long)s1.retire_max_in_flight,
         (unsigned long long)(s1.pool_misses - s0.pool_misses));
  dspk__cuda_set_sync_on_evict(dev, 0);
  for (int e = 0; e < 2 * NT; e++)
    CU.cuEventDestroy(ev[e]);
  B->free(dev, ma);
  B->free(dev, mb);
  B->free(dev, mc);
  free(h);
}

/* The three eviction traces, each size: one untimed pass of each variant
 * warms the pool and the kernels, then the measured passes alternate:
 * small products on the tiled kernel (the default) with event retirement
 * and with a synchronize per eviction, then every product through cuBLAS
 * (dspk__cuda_set_gemm_small 0) with event retirement. */
static void run_traces(int gated) {
  printf("\n| trace | GPU busy | throughput | wall | host per run, plan hit / miss (count) "
         "| GPU per contraction | retirement |\n|---|---|---|---|---|---|---|\n");
  for (int sz = 0; sz < 3; sz++) {
    static const int64_t P[3][4] = {{1024, 64, 1024, 1024}, {256, 16, 512, 512},
                                    {64, 8, 256, 256}};
    static const char *const L[3] = {"large (i=1024..4160, j=k=1024)",
                                     "medium (i=256..1040, j=k=512)",
                                     "small (i=64..456, j=k=256)"};
    for (int w = 0; w < 2; w++) {
      dspk__cuda_set_gemm_small(dev, w ? 0 : DSPK__GPURT_GEMM_SMALL);
      bench_trace(0, P[sz][0], P[sz][1], P[sz][2], P[sz][3], "(warm-up)");
    }
    bench_trace(1, P[sz][0], P[sz][1], P[sz][2], P[sz][3], "(warm-up)");
    for (int r = 0; r < 2; r++) {
      dspk__cuda_set_gemm_small(dev, DSPK__GPURT_GEMM_SMALL);
      bench_trace(0, P[sz][0], P[sz][1], P[sz][2], P[sz][3], L[sz]);
      bench_trace(1, P[sz][0], P[sz][1], P[sz][2], P[sz][3], L[sz]);
      dspk__cuda_set_gemm_small(dev, 0);
      bench_trace(0, P[sz][0], P[sz][1], P[sz][2], P[sz][3], L[sz]);
      if (gated) {
        dspk__cuda_set_gemm_small(dev, DSPK__GPURT_GEMM_SMALL);
        trace_gated = 1;
        bench_trace(0, P[sz][0], P[sz][1], P[sz][2], P[sz][3], L[sz]);
        trace_gated = 0;
      }
    }
    dspk__cuda_set_gemm_small(dev, DSPK__GPURT_GEMM_SMALL);
  }
}

static int open_dev(const char *plan_cache) {
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  char why[256];
  setenv("DSPK_CUDA_PLAN_CACHE", plan_cache, 1);
  if (B->probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why)) < 1) {
    fprintf(stderr, "bench_cuda: no CUDA device: %s\n", why);
    return 1;
  }
  CK(B->open(0, NULL, &dev));
  printf("device: %s (%s), driver %s, contraction plan cache %s\n\n", info[0].name,
         info[0].arch, info[0].driver, plan_cache);
  return 0;
}

static int mode_backend(void) {
  if (open_dev("16"))
    return 1;
  printf("| op | through the backend | cuBLAS/cuFFT in-process | ratio |\n|---|---|---|---|\n");
  bench_gemm_backend(DSPK_F32, 8192, 10);
  bench_gemm_backend(DSPK_BF16, 8192, 40);
  bench_fft_backend(1 << 20, 16, 40);
  bench_fir_backend(20);
  run_traces(0);
  B->close(dev);
  B->shutdown();
  return 0;
}

/* ---- through the daemon ----------------------------------------------------- */

/* Writes n bytes into a daemon buffer in 64 MiB pieces (a message has a
 * size limit). */
static int buf_write(dspk_client *c, uint64_t id, const void *p, size_t n) {
  for (size_t off = 0; off < n; off += (size_t)64 << 20) {
    size_t k = n - off < ((size_t)64 << 20) ? n - off : ((size_t)64 << 20);
    int rc = dspk_buffer_write(c, id, off, (const char *)p + off, k);
    if (rc)
      return rc;
  }
  return 0;
}

static double time_daemon(dspk_client *c, const dspk_task *t, uint64_t probe_buf, int reps) {
  double v[3];
  uint32_t tk[256];
  dspk_result r;
  float tmp;
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    int n = k < 0 ? 1 : reps;
    for (int i = 0; i < n; i++)
      CK(dspk_submit(c, t, &tk[i]));
    for (int i = 0; i < n; i++) {
      int rc = dspk_wait(c, tk[i], &r);
      if (rc) {
        fprintf(stderr, "task: %s\n", dspk_last_error(c));
        exit(1);
      }
      dspk_result_free(&r);
    }
    /* A read orders after all the device's work. */
    CK(dspk_buffer_read(c, probe_buf, 0, &tmp, sizeof(tmp)));
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / n;
  }
  return median(v, 3);
}

/* One task at a time, as a client that waits for each answer: the median
 * wall time from submit to answer over `reps` tasks, and the median of the
 * answers' time_us (the runner's time, the device's work included). */
static double time_single(dspk_client *c, const dspk_task *t, int reps, double *time_us) {
  double w[64], u[64];
  dspk_result r;
  uint32_t tk;
  if (reps > 64)
    reps = 64;
  for (int i = 0; i < reps; i++) {
    double t0 = dspk_bench_now_ms();
    CK(dspk_submit(c, t, &tk));
    if (dspk_wait(c, tk, &r)) {
      fprintf(stderr, "task: %s\n", dspk_last_error(c));
      exit(1);
    }
    w[i] = dspk_bench_now_ms() - t0;
    u[i] = (double)r.time_us;
    dspk_result_free(&r);
  }
  qsort(w, (size_t)reps, sizeof(double), dspk_bench_cmp_d);
  qsort(u, (size_t)reps, sizeof(double), dspk_bench_cmp_d);
  *time_us = u[reps / 2];
  return w[reps / 2];
}

static int bench_stream(dspk_client *c);

static int mode_daemon(const char *sock, const char *dev) {
  int cuda = strncmp(dev, "cuda:", 5) == 0;
  dspk_client *c;
  char why[256];
  int rc;
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  if (dspk_connect(sock, "bench_cuda", &c)) {
    fprintf(stderr, "bench_cuda: connect: %s\n", dspk_connect_error());
    return 1;
  }
  if (B->probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why)) < 1)
    return 1;
  printf("| op (data in daemon buffers on %s) | through dspkd | in-process cuBLAS/cuFFT | "
         "ratio |\n|---|---|---|---|\n",
         dev);
  for (int which = 0; which < 3; which++) {
    dspk_task t;
    dspk_tensor in[2];
    uint64_t ba, bb, bo;
    int n = 8192, reps = which == 0 ? 10 : which == 1 ? 100 : 200;
    /* The second gemm: bf16 on CUDA, f16 elsewhere (Vulkan has no bf16). */
    dspk_dtype dt = which != 1 ? DSPK_F32 : cuda ? DSPK_BF16 : DSPK_F16;
    size_t isz = dspk_dtype_size(dt), nn = (size_t)n * n;
    void *ha, *hb = NULL;
    double td, tc;
    dspk_task_init(&t, which < 2 ? DSPK_OP_GEMM : DSPK_OP_FFT);
    t.device = dev;
    memset(in, 0, sizeof(in));
    if (which < 2) {
      ha = malloc(nn * isz);
      hb = malloc(nn * isz);
      fill_random(ha, nn, dt);
      fill_random(hb, nn, dt);
      CK(dspk_buffer_create(c, dev, nn * isz, &ba));
      CK(dspk_buffer_create(c, dev, nn * isz, &bb));
      CK(dspk_buffer_create(c, dev, nn * 4, &bo));
      CK(buf_write(c, ba, ha, nn * isz));
      CK(buf_write(c, bb, hb, nn * isz));
      for (int i = 0; i < 2; i++) {
        in[i].dtype = dt;
        in[i].rank = 2;
        in[i].shape[0] = in[i].shape[1] = n;
        in[i].is_ref = true;
        in[i].buffer = i ? bb : ba;
      }
      t.ninputs = 2;
    } else {
      int64_t fn = 1 << 20, batch = 16;
      size_t bytes = (size_t)(fn * batch) * 8;
      ha = malloc(bytes);
      fill_random(ha, bytes / 4, DSPK_F32);
      CK(dspk_buffer_create(c, dev, bytes, &ba));
      CK(dspk_buffer_create(c, dev, bytes, &bo));
      CK(buf_write(c, ba, ha, bytes));
      in[0].dtype = DSPK_C64;
      in[0].rank = 2;
      in[0].shape[0] = batch;
      in[0].shape[1] = fn;
      in[0].is_ref = true;
      in[0].buffer = ba;
      t.ninputs = 1;
      bb = 0;
    }
    t.inputs = in;
    t.nout_refs = 1;
    t.out_refs[0].buffer = bo;
    t.out_refs[0].offset = 0;
    td = time_daemon(c, &t, bo, reps);
    if (which < 2) {
      double flop = 2.0 * n * (double)n * n;
      CK(dspk__cuda_load_cublas(why, sizeof(why)));
      {
        CUcontext ctx;
        CK(CU.cuDevicePrimaryCtxRetain(&ctx, 0));
        CK(CU.cuCtxSetCurrent(ctx));
      }
      tc = dspk_bench_cublas_gemm(dt, n, ha, hb, reps);
      printf("| gemm %d^2 %s | %.3f ms (%.1f TFLOP/s) | %.3f ms (%.1f TFLOP/s) | %.3f |\n", n,
             dspk_dtype_name(dt), td, flop / td / 1e9, tc, flop / tc / 1e9, tc / td);
      fflush(stdout);
      CK(dspk_buffer_free(c, bb));
    } else {
      CUcontext ctx;
      CK(dspk__cuda_load_cufft(why, sizeof(why)));
      CK(CU.cuDevicePrimaryCtxRetain(&ctx, 0));
      CK(CU.cuCtxSetCurrent(ctx));
      tc = dspk_bench_cufft(1 << 20, 16, ha, reps);
      printf("| fft 2^20 c64 x 16 | %.3f ms | %.3f ms | %.3f |\n", td, tc, tc / td);
    }
    CK(dspk_buffer_free(c, ba));
    CK(dspk_buffer_free(c, bo));
    free(ha);
    free(hb);
  }
  rc = cuda ? bench_stream(c) : 0;
  dspk_close(c);
  return rc;
}

/* A pipelined stream of gemm 1024^2 f32 on resident buffers through dspkd,
 * each task answered when the GPU finished it: N tasks with W in flight on
 * the connection.  The GPU busy fraction is N times the in-process
 * per-gemm device time (cuBLAS back to back on one stream) over the
 * stream's wall time; "answered after its work" checks that no task's
 * time_us is below 90% of that device time (an answer that came before
 * the work would show a few microseconds). */
static int bench_stream(dspk_client *c) {
  enum { N = 4000, W = 32, WARM = 50 };
  int n = 1024;
  size_t nn = (size_t)n * n;
  float *ha = malloc(nn * 4), *hb = malloc(nn * 4), tmp;
  uint64_t ba, bb, bo, min_us = UINT64_MAX, sum_us = 0;
  uint32_t tk[W];
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  char why[256];
  double t0, wall, tc, busy;
  int after = 0;

  fill_random(ha, nn, DSPK_F32);
  fill_random(hb, nn, DSPK_F32);
  CK(dspk_buffer_create(c, "cuda:0", nn * 4, &ba));
  CK(dspk_buffer_create(c, "cuda:0", nn * 4, &bb));
  CK(dspk_buffer_create(c, "cuda:0", nn * 4, &bo));
  CK(buf_write(c, ba, ha, nn * 4));
  CK(buf_write(c, bb, hb, nn * 4));
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cuda:0";
  memset(in, 0, sizeof(in));
  for (int i = 0; i < 2; i++) {
    in[i].dtype = DSPK_F32;
    in[i].rank = 2;
    in[i].shape[0] = in[i].shape[1] = n;
    in[i].is_ref = true;
    in[i].buffer = i ? bb : ba;
  }
  t.inputs = in;
  t.ninputs = 2;
  t.nout_refs = 1;
  t.out_refs[0].buffer = bo;
  for (int pass = 0; pass < 2; pass++) {
    int total = pass ? N : WARM, sent = 0, done = 0;
    CK(dspk_buffer_read(c, bo, 0, &tmp, sizeof(tmp)));
    t0 = dspk_bench_now_ms();
    while (done < total) {
      while (sent < total && sent - done < W)
        CK(dspk_submit(c, &t, &tk[sent++ % W]));
      if (dspk_wait(c, tk[done++ % W], &r)) {
        fprintf(stderr, "task: %s\n", dspk_last_error(c));
        exit(1);
      }
      if (pass) {
        sum_us += r.time_us;
        if (r.time_us < min_us)
          min_us = r.time_us;
      }
      dspk_result_free(&r);
    }
    CK(dspk_buffer_read(c, bo, 0, &tmp, sizeof(tmp)));
    wall = dspk_bench_now_ms() - t0;
  }
  CK(dspk__cuda_load_cublas(why, sizeof(why)));
  {
    CUcontext ctx;
    CK(CU.cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(CU.cuCtxSetCurrent(ctx));
  }
  tc = dspk_bench_cublas_gemm(DSPK_F32, n, ha, hb, 500);
  busy = N * tc / wall;
  after = (double)min_us >= 0.9 * tc * 1e3;
  printf("\n| gemm 1024^2 f32 stream on resident buffers (%d tasks, %d in flight) | per task "
         "through dspkd | GPU time per gemm in-process | GPU busy | time_us min / mean | "
         "answered after its work |\n|---|---|---|---|---|---|\n", N, W);
  printf("| answers on completion | %.4f ms | %.4f ms | %.1f%% (goal >= 95%%) | %llu / %.1f us "
         "| %s |\n", wall / N, tc, 100.0 * busy, (unsigned long long)min_us,
         (double)sum_us / N, after ? "yes" : "NO");
  CK(dspk_buffer_free(c, ba));
  CK(dspk_buffer_free(c, bb));
  CK(dspk_buffer_free(c, bo));
  free(ha);
  free(hb);
  return after ? 0 : 1;
}

/* ---- fir through the daemon vs an in-process cuFFT overlap-save -------------- */

/* fir of 2^24 f32 samples with 4096 taps on `device` through dspkd (signal,
 * taps and output in daemon buffers; the first task, untimed, lets the
 * autotuner choose the path) vs dspk_bench_cufft_fir on cuda:0; the two
 * outputs are compared. */
static int mode_fir(const char *sock, const char *device, int reps) {
  dspk_client *c;
  char why[256];
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  int64_t n = (int64_t)1 << 24, k = 4096, L = 0;
  float *hx = malloc((size_t)n * 4), *hh = malloc((size_t)k * 4);
  float *yd = malloc((size_t)n * 4), *yr = malloc((size_t)n * 4);
  uint64_t bx, bh, by;
  dspk_task t;
  dspk_tensor in[2];
  double td, tr, t1, t1us, tr1, md = 0, mr = 1e-30;
  CUcontext ctx;
  if (dspk_connect(sock, "bench_cuda", &c)) {
    fprintf(stderr, "bench_cuda: connect: %s\n", dspk_connect_error());
    return 1;
  }
  if (B->probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why)) < 1)
    return 1;
  fill_random(hx, (size_t)n, DSPK_F32);
  fill_random(hh, (size_t)k, DSPK_F32);
  for (int64_t i = 0; i < k; i++)
    hh[i] *= 0.05f; /* keeps the outputs of order 1 */
  CK(dspk_buffer_create(c, device, (size_t)n * 4, &bx));
  CK(dspk_buffer_create(c, device, (size_t)k * 4, &bh));
  CK(dspk_buffer_create(c, device, (size_t)n * 4, &by));
  CK(buf_write(c, bx, hx, (size_t)n * 4));
  CK(buf_write(c, bh, hh, (size_t)k * 4));
  dspk_task_init(&t, DSPK_OP_FIR);
  t.device = device;
  memset(in, 0, sizeof(in));
  for (int i = 0; i < 2; i++) {
    in[i].dtype = DSPK_F32;
    in[i].rank = 1;
    in[i].shape[0] = i ? k : n;
    in[i].is_ref = true;
    in[i].buffer = i ? bh : bx;
  }
  t.inputs = in;
  t.ninputs = 2;
  t.nout_refs = 1;
  t.out_refs[0].buffer = by;
  t.out_refs[0].offset = 0;
  td = time_daemon(c, &t, by, reps);
  t1 = time_single(c, &t, 15, &t1us);
  for (size_t off = 0; off < (size_t)n * 4; off += (size_t)64 << 20) {
    size_t m = (size_t)n * 4 - off < ((size_t)64 << 20) ? (size_t)n * 4 - off : ((size_t)64 << 20);
    CK(dspk_buffer_read(c, by, off, (char *)yd + off, m));
  }
  CK(dspk__cuda_load_nvrtc(why, sizeof(why)));
  CK(dspk__cuda_load_cufft(why, sizeof(why)));
  CK(CU.cuDevicePrimaryCtxRetain(&ctx, 0));
  CK(CU.cuCtxSetCurrent(ctx));
  tr = dspk_bench_cufft_fir(n, k, hx, hh, reps, yr, &L);
  tr1 = dspk_bench_cufft_fir(n, k, hx, hh, 1, NULL, NULL);
  for (int64_t i = 0; i < n; i++) {
    md = fmax(md, fabs((double)yd[i] - yr[i]));
    mr = fmax(mr, fabs((double)yr[i]));
  }
  printf("| fir 2^24 f32, 4096 taps on %s, %d in a stream | %.3f ms (%.2f GS/s) | cuFFT overlap-save L=%lld: "
         "%.3f ms | **%.3f** | max diff / max %.2g |\n",
         device, reps, td, (double)n / td / 1e6, (long long)L, tr, tr / td, md / mr);
  printf("| the same one task at a time (submit, wait for its answer) | %.3f ms (answer's time_us "
         "%.0f) | one run and a synchronize: %.3f ms | **%.3f** | |\n",
         t1, t1us, tr1, tr1 / t1);
  CK(dspk_buffer_free(c, bx));
  CK(dspk_buffer_free(c, bh));
  CK(dspk_buffer_free(c, by));
  dspk_close(c);
  free(hx);
  free(hh);
  free(yd);
  free(yr);
  return md / mr <= 1e-4 ? 0 : 1;
}

/* ---- one task at a time: where a tiny task's answer time goes ---------------- */

/* A ping and a map "scale" of 16 f32 on `device` (inline operands, inline
 * result), each one at a time (submit, wait for the answer), 200 of each:
 * the medians of their wall times and of the tasks' time_us. */
static int mode_latency(const char *sock, const char *device) {
  dspk_client *c;
  dspk_task t;
  dspk_tensor in;
  float x[16];
  int64_t shape[1] = {16};
  double w[200], us, tw;
  if (dspk_connect(sock, "bench_cuda", &c)) {
    fprintf(stderr, "bench_cuda: connect: %s\n", dspk_connect_error());
    return 1;
  }
  for (int i = 0; i < 16; i++)
    x[i] = (float)i;
  for (int i = 0; i < 200; i++) {
    double t0 = dspk_bench_now_ms();
    CK(dspk_ping(c, NULL, 0));
    w[i] = dspk_bench_now_ms() - t0;
  }
  qsort(w, 200, sizeof(double), dspk_bench_cmp_d);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = device;
  t.map.fn = DSPK_MAP_SCALE;
  t.map.alpha = 2.0;
  dspk_tensor_inline(&in, DSPK_F32, 1, shape, x);
  t.inputs = &in;
  t.ninputs = 1;
  (void)time_single(c, &t, 64, &us); /* compiles the kernel, warms up */
  tw = time_single(c, &t, 64, &us);
  printf("| one at a time on %s | ping %.1f us (p90 %.1f) | map scale 16 f32: %.1f us, time_us %.0f |\n",
         device, w[100] * 1e3, w[180] * 1e3, tw * 1e3, us);
  dspk_close(c);
  return 0;
}

/* ---- operands in client memory (issue 12) ------------------------------------ */

/* What an in-process program does before its first cuBLAS call: load the
 * driver, cuInit, the primary context of GPU 0 made current, a stream,
 * cuBLAS and a handle on that stream. */
static void cuda_cublas_init(CUstream *st, cublasHandle_t *h) {
  char why[256];
  CUdevice d;
  CUcontext ctx;
  CK(dspk__cuda_load_driver(why, sizeof(why)));
  CK(CU.cuInit(0));
  CK(CU.cuDeviceGet(&d, 0));
  CK(CU.cuDevicePrimaryCtxRetain(&ctx, d));
  CK(CU.cuCtxSetCurrent(ctx));
  CK(CU.cuStreamCreate(st, CU_STREAM_NON_BLOCKING));
  CK(dspk__cuda_load_cublas(why, sizeof(why)));
  CK(BL.cublasCreate(h));
  CK(BL.cublasSetStream(*h, (cudaStream_t)*st));
}

/* Median ms of 3 batches of reps dspk_run calls of t (each waits for its
 * answer, which comes when the work is done), after one untimed call. */
static double time_run(dspk_client *c, const dspk_task *t, int reps, uint64_t *time_us) {
  double v[3];
  dspk_result r;
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < (k < 0 ? 1 : reps); i++) {
      if (dspk_run(c, t, &r)) {
        fprintf(stderr, "bench_cuda: task: %s\n", dspk_last_error(c));
        exit(1);
      }
      if (time_us)
        *time_us = r.time_us;
      dspk_result_free(&r);
    }
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  return median(v, 3);
}

/* gemm n^2 f32 with A, B and the result in this process's memory: through
 * dspkd on cuda:0 with malloc'd operands (libdspkclient sends them through
 * shared temporaries, the result comes back inline) and with operands and
 * result in dspk_shared_alloc memory, vs the same in-process: pinned
 * copies, cublasSgemm, copy back.  Then client memory -> device: a reduce
 * of 256 MiB in a shared buffer against the same reduce of a resident one
 * (the runner's time_us; the difference is the copy), vs cuMemcpyHtoD of
 * 256 MiB from pinned memory in-process. */
static int mode_clientmem(const char *sock) {
  const int n = 4096, reps = 10;
  const size_t bytes = (size_t)n * n * 4, big = (size_t)256 << 20;
  const char *cdev = "cuda:0";
  float one = 1, zero = 0;
  dspk_client *c;
  CUstream st;
  CUdeviceptr da, db, dc, dx;
  cublasHandle_t h;
  void *pa, *pb, *pc, *px;
  double v[3];
  if (dspk_connect(sock, "bench_cuda", &c)) {
    fprintf(stderr, "bench_cuda: connect: %s\n", dspk_connect_error());
    return 1;
  }
  /* In-process reference. */
  cuda_cublas_init(&st, &h);
  CK(CU.cuMemHostAlloc(&pa, bytes, 0));
  CK(CU.cuMemHostAlloc(&pb, bytes, 0));
  CK(CU.cuMemHostAlloc(&pc, bytes, 0));
  CK(CU.cuMemHostAlloc(&px, big, 0));
  CK(CU.cuMemAlloc(&da, bytes));
  CK(CU.cuMemAlloc(&db, bytes));
  CK(CU.cuMemAlloc(&dc, bytes));
  CK(CU.cuMemAlloc(&dx, big));
  fill_random(pa, (size_t)n * n, DSPK_F32);
  fill_random(pb, (size_t)n * n, DSPK_F32);
  fill_random(px, big / 4, DSPK_F32);
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < (k < 0 ? 1 : reps); i++) {
      CK(CU.cuMemcpyHtoDAsync(da, pa, bytes, st));
      CK(CU.cuMemcpyHtoDAsync(db, pb, bytes, st));
      CK(BL.cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float *)db, n,
                        (float *)da, n, &zero, (float *)dc, n));
      CK(CU.cuMemcpyDtoHAsync(pc, dc, bytes, st));
      CK(CU.cuStreamSynchronize(st));
    }
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  double tref = median(v, 3);
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < (k < 0 ? 1 : reps); i++) {
      CK(CU.cuMemcpyHtoDAsync(dx, px, big, st));
      CK(CU.cuStreamSynchronize(st));
    }
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  double thtod = median(v, 3);

  /* Through dspkd: malloc'd operands, result inline. */
  float *ma = malloc(bytes), *mb = malloc(bytes);
  memcpy(ma, pa, bytes);
  memcpy(mb, pb, bytes);
  int64_t shape[2] = {n, n};
  dspk_tensor in[2];
  dspk_task t;
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = cdev;
  dspk_tensor_inline(&in[0], DSPK_F32, 2, shape, ma);
  dspk_tensor_inline(&in[1], DSPK_F32, 2, shape, mb);
  t.inputs = in;
  t.ninputs = 2;
  double tmal = time_run(c, &t, reps, NULL);

  /* Operands and result in shared memory. */
  void *sa, *sb, *sc, *sx;
  uint64_t ia, ib, ic, ix, rx;
  CK(dspk_shared_alloc(c, cdev, bytes, &sa, &ia));
  CK(dspk_shared_alloc(c, cdev, bytes, &sb, &ib));
  CK(dspk_shared_alloc(c, cdev, bytes, &sc, &ic));
  memcpy(sa, pa, bytes);
  memcpy(sb, pb, bytes);
  dspk_tensor_inline(&in[0], DSPK_F32, 2, shape, sa);
  dspk_tensor_inline(&in[1], DSPK_F32, 2, shape, sb);
  t.nout_refs = 1;
  t.out_refs[0].buffer = ic;
  t.out_refs[0].offset = 0;
  double tsh = time_run(c, &t, reps, NULL);
  /* The shared result against the in-process one. */
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < (size_t)n * n; i += 997) {
    md = fmax(md, fabs((double)((float *)sc)[i] - ((float *)pc)[i]));
    mr = fmax(mr, fabs((double)((float *)pc)[i]));
  }

  /* Client memory -> device: reduce of 256 MiB, shared vs resident. */
  int64_t xs[1] = {(int64_t)(big / 4)};
  uint64_t us_sh = 0, us_res = 0;
  CK(dspk_shared_alloc(c, cdev, big, &sx, &ix));
  memcpy(sx, px, big);
  CK(dspk_buffer_create(c, cdev, big, &rx));
  CK(buf_write(c, rx, px, big));
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = cdev;
  dspk_tensor_inline(&in[0], DSPK_F32, 1, xs, sx);
  t.inputs = in;
  t.ninputs = 1;
  double tred_sh = time_run(c, &t, reps, &us_sh);
  memset(&in[0], 0, sizeof(in[0]));
  in[0].dtype = DSPK_F32;
  in[0].rank = 1;
  in[0].shape[0] = xs[0];
  in[0].is_ref = true;
  in[0].buffer = rx;
  double tred_res = time_run(c, &t, reps, &us_res);
  double copy_ms = tred_sh - tred_res;

  printf("| gemm %d^2 f32, operands and result in client memory | dspkd on %s | in-process "
         "(pinned copies + cublasSgemm + copy back) | ratio |\n|---|---|---|---|\n", n, cdev);
  printf("| malloc'd operands (shared temporaries), result inline | %.3f ms | %.3f ms | **%.3f** |\n",
         tmal, tref, tref / tmal);
  printf("| operands and result in dspk_shared_alloc memory | %.3f ms | %.3f ms | **%.3f** |\n",
         tsh, tref, tref / tsh);
  printf("(shared result vs in-process: max diff / max %.2g)\n\n", md / mr);
  printf("| client memory -> %s, 256 MiB | through dspkd | in-process cuMemcpyHtoD from pinned | "
         "ratio |\n|---|---|---|---|\n", cdev);
  printf("| reduce on a shared buffer %.3f ms - on a resident one %.3f ms (time_us %llu - %llu) "
         "| %.1f GB/s | %.3f ms, %.1f GB/s | **%.3f** |\n",
         tred_sh, tred_res, (unsigned long long)us_sh, (unsigned long long)us_res,
         copy_ms > 0 ? big / copy_ms / 1e6 : 0.0, thtod, big / thtod / 1e6,
         copy_ms > 0 ? thtod / copy_ms : 0.0);
  CK(dspk_shared_free(c, sa));
  CK(dspk_shared_free(c, sb));
  CK(dspk_shared_free(c, sc));
  CK(dspk_shared_free(c, sx));
  CK(dspk_buffer_free(c, rx));
  dspk_close(c);
  free(ma);
  free(mb);
  BL.cublasDestroy(h);
  CU.cuMemFree(da);
  CU.cuMemFree(db);
  CU.cuMemFree(dc);
  CU.cuMemFree(dx);
  CU.cuMemFreeHost(pa);
  CU.cuMemFreeHost(pb);
  CU.cuMemFreeHost(pc);
  CU.cuMemFreeHost(px);
  return md / mr <= 1e-3 ? 0 : 1;
}

/* ---- first result of a fresh process ----------------------------------------- */

static int mode_firstresult(void) {
  double t0 = dspk_bench_now_ms();
  int n = 1024;
  size_t bytes = (size_t)n * n * 4;
  float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes), one = 1, zero = 0;
  CUstream st;
  CUdeviceptr da, db, dc;
  cublasHandle_t h;
  fill_random(a, (size_t)n * n, DSPK_F32);
  fill_random(b, (size_t)n * n, DSPK_F32);
  cuda_cublas_init(&st, &h);
  CK(CU.cuMemAlloc(&da, bytes));
  CK(CU.cuMemAlloc(&db, bytes));
  CK(CU.cuMemAlloc(&dc, bytes));
  CK(CU.cuMemcpyHtoDAsync(da, a, bytes, st));
  CK(CU.cuMemcpyHtoDAsync(db, b, bytes, st));
  CK(BL.cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float *)db, n, (float *)da, n,
                    &zero, (float *)dc, n));
  CK(CU.cuMemcpyDtoHAsync(c, dc, bytes, st));
  CK(CU.cuStreamSynchronize(st));
  printf("in-process first result: %.1f ms inside main (c[0]=%g)\n", dspk_bench_now_ms() - t0, c[0]);
  return 0;
}

static int mode_mknpy(const char *dir) {
  for (int k = 0; k < 2; k++) {
    char path[512], hdr[128];
    int n = 1024;
    float *p = malloc((size_t)n * n * 4);
    FILE *f;
    int hl;
    snprintf(path, sizeof(path), "%s/%c.npy", dir, k ? 'b' : 'a');
    fill_random(p, (size_t)n * n, DSPK_F32);
    hl = snprintf(hdr, sizeof(hdr), "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", n, n);
    while ((10 + hl + 1) % 64)
      hdr[hl++] = ' ';
    hdr[hl++] = '\n';
    f = fopen(path, "wb");
    if (!f)
      return 1;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)hl, f);
    fwrite(p, 4, (size_t)n * n, f);
    fclose(f);
    free(p);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "backend") == 0)
    return mode_backend();
  if (argc >= 2 && strcmp(argv[1], "trace") == 0) {
    /* The gated pass enqueues the whole trace before the GPU starts: the
     * retirement queue must hold every eviction without waiting. */
    setenv("DSPK_CUDA_RETIRE_CAPACITY", "1024", 1);
    if (open_dev(argc > 2 ? argv[2] : "16"))
      return 1;
    run_traces(1);
    B->close(dev);
    B->shutdown();
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "daemon") == 0)
    return mode_daemon(argv[2], argc > 3 ? argv[3] : "cuda:0");
  if (argc >= 4 && strcmp(argv[1], "fir") == 0)
    return mode_fir(argv[2], argv[3], argc >= 5 ? atoi(argv[4]) : 20);
  if (argc >= 4 && strcmp(argv[1], "latency") == 0)
    return mode_latency(argv[2], argv[3]);
  if (argc >= 3 && strcmp(argv[1], "clientmem") == 0)
    return mode_clientmem(argv[2]);
  if (argc >= 2 && strcmp(argv[1], "firstresult") == 0)
    return mode_firstresult();
  if (argc >= 3 && strcmp(argv[1], "mknpy") == 0)
    return mode_mknpy(argv[2]);
  fprintf(stderr, "usage: bench_cuda backend | trace [PLAN_CACHE] | daemon SOCKET [DEVICE] | fir SOCKET DEVICE [REPS] | latency SOCKET DEVICE | "
                  "firstresult | mknpy DIR\n");
  return 2;
}
