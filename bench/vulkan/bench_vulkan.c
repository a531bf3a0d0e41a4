/*
 * bench_vulkan: the Vulkan backend's benchmarks (issue 6 §7), side by side
 * in one process.
 *
 *   gemm f32 4096^2 and 8192^2 through the backend table (what a dspkd
 *   runner does with data already in device buffers; tile shape from the
 *   autotuner) vs cuBLAS sgemm on the same data; f16 and bf16 (f32
 *   accumulation; cooperative matrices where offered) vs cuBLAS GemmEx
 *   f16->f32 and bf16->f32;
 *   fft 2^20 c64, batch 16 (VkFFT or our kernels, whichever the tuner
 *   picks) vs cuFFT;
 *   time to first result (open the device, gemm 1024^2 + fft 2^16, read
 *   back) with a cold cache file vs the same file warm.
 *
 * `bench_vulkan fft [N BATCH]` runs the fft rows only, over more shapes (or
 * the one given), and prints the VkFFT tuning decision of each (winner,
 * passes over memory, every candidate's time) under the table, then each
 * VkFFT candidate's GPU time (timestamps) next to a plain copy of the data.
 * `bench_vulkan fftsk [N BATCH]` times, by GPU timestamps, each pass of
 * every configuration of our own kernels (backends/vulkan/vk_sfft.c).
 *
 * cuBLAS/cuFFT come through the CUDA backend's dlopen tables when that
 * backend is built and a CUDA driver is present; otherwise only the Vulkan
 * column is printed.  Timings are medians of 3 repetitions of `reps` runs.
 * Prints markdown rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/common/fir_tune.h"
#include "backends/vulkan/vk_sfft.h"
#include "bench/common/bench_util.h"
#include "bench/vulkan/bench_vk.h"
#include "cache/cache.h"
#ifdef DSPK_BENCH_CUDA
#include "backends/cuda/cuda_internal.h"
#include "bench/common/cuda_ref.h"
#define CU dspk__cu
#endif

extern const struct dspk__backend dspk__backend_vulkan;
/* backends/vulkan/vk_vkfft.h (not included: its header needs vk.h, whose
 * struct dspk__dev would clash with the CUDA backend's here). */
int dspk__vk_fft_tune_report(struct dspk__dev *d, uint64_t n, uint64_t batch, int dbl,
                             char *buf, size_t len);
int dspk__vk_fft_profile(struct dspk__dev *d, uint64_t n, uint64_t batch, char *buf,
                         size_t len);
/* backends/vulkan/vk.h's fir entry and hooks (same reason). */
int dspk__vk_fir(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
void dspk__vk_fir_force(int mode);
const char *dspk__vk_fir_last(void);
int dspk__vk_fir_last_fused(void);
int dspk__vk_gpu_ms(struct dspk__dev *d, int reps, int (*rec)(void *ud, int i), void *ud,
                    double *ms);
static const struct dspk__backend *V = &dspk__backend_vulkan;
/* The Vulkan gemm's kernel candidates (backends/vulkan/vk.h, declared here:
 * that header's struct dspk__dev clashes with the CUDA backend's). */
int dspk__vk_gemm_ncands(void);
const char *dspk__vk_gemm_cand_name(int i);
void dspk__vk_gemm_force(int i);
const char *dspk__vk_gemm_last(void);
/* backends/vulkan/vk_coopmat.c: which path f16 gemm takes on a device
 * (declared here for the reason vk_vkfft.h is not included). */
int dspk__vk_coopmat_describe(struct dspk__dev *d, char *buf, size_t len);

#define CK(x) DSPK_BENCH_CK("bench_vulkan", x)

static void fill(void *p, size_t n, dspk_dtype dt) {
  uint64_t s = 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    float f = (float)((double)(s >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
    if (dt == DSPK_F16) {
      /* multiples of 1/256 in [-1, 1]: exact in f16 */
      int q = (int)lrintf(f * 256);
      uint16_t h = 0;
      if (q) {
        int sgn = q < 0, a = abs(q), e = 0;
        while ((a >> e) > 1) e++;
        int E = e - 8 + 15;
        uint16_t mant = (uint16_t)(((a << (10 - e)) & 0x3ff));
        h = (uint16_t)((sgn << 15) | (E << 10) | mant);
      }
      ((uint16_t *)p)[i] = h;
    } else if (dt == DSPK_BF16) {
      /* multiples of 1/128 in [-1, 1]: exact in bf16 (the upper half of the f32) */
      float q = (float)lrintf(f * 128) / 128.0f;
      uint32_t u;
      memcpy(&u, &q, 4);
      ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else {
      ((float *)p)[i] = f;
    }
  }
}

static struct dspk__dev *open_dev(int idx, struct dspk__cache *c) {
  struct dspk__devenv env = {.cache = c};
  struct dspk__dev *d;
  CK(V->open(idx, &env, &d));
  return d;
}

static struct dspk__tensor upload(struct dspk__dev *d, dspk_dtype dt, int rank,
                                  const int64_t *shape, const void *host) {
  struct dspk__tensor t = {.dtype = dt, .rank = rank};
  memcpy(t.shape, shape, sizeof(int64_t) * rank);
  size_t nb = dspk__tensor_nbytes(&t);
  CK(V->alloc(d, nb, &t.mem));
  if (host)
    CK(V->write(d, t.mem, 0, host, nb));
  return t;
}

static int run_op(struct dspk__dev *d, struct dspk__op *op) {
  char msg[512] = "";
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  int r = V->run(d, op, &ctx);
  if (r)
    fprintf(stderr, "bench_vulkan: op failed: %d %s\n", r, msg);
  return r;
}

/* Times op (outputs placed) reps times per sample; the first call (plan,
 * compile, tuning) is untimed. */
static double time_op(struct dspk__dev *d, struct dspk__op *op, int reps) {
  double v[3];
  CK(run_op(d, op));
  CK(V->sync(d));
  for (int k = 0; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < reps; i++)
      CK(run_op(d, op));
    CK(V->sync(d));
    v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  return dspk_bench_median3(v);
}

static void place_outputs(struct dspk__dev *d, struct dspk__op *op) {
  char msg[256];
  CK(dspk__op_infer(op, msg, sizeof msg));
  for (int i = 0; i < op->nout; i++)
    CK(V->alloc(d, dspk__tensor_nbytes(&op->out[i]), &op->out[i].mem));
}
static void free_op(struct dspk__dev *d, struct dspk__op *op) {
  for (int i = 0; i < op->nin; i++)
    V->free(d, op->in[i].mem);
  for (int i = 0; i < op->nout; i++)
    V->free(d, op->out[i].mem);
  CK(V->sync(d));
}

#ifdef DSPK_BENCH_CUDA
static int cuda_ok;
static void cuda_init(void) {
  char why[256];
  CUcontext ctx;
  if (dspk__cuda_load_driver(why, sizeof why) || CU.cuInit(0) ||
      dspk__cuda_load_cublas(why, sizeof why) || dspk__cuda_load_cufft(why, sizeof why) ||
      CU.cuDevicePrimaryCtxRetain(&ctx, 0) || CU.cuCtxSetCurrent(ctx)) {
    printf("(no CUDA: %s)\n", why);
    return;
  }
  cuda_ok = 1;
}
#endif

static void bench_gemm(struct dspk__dev *d, dspk_dtype dt, int n, int reps) {
  size_t isz = dt == DSPK_F16 || dt == DSPK_BF16 ? 2 : 4, nn = (size_t)n * n;
  void *ha = malloc(nn * isz), *hb = malloc(nn * isz);
  fill(ha, nn, dt);
  fill(hb, nn, dt);
  int64_t shape[2] = {n, n};
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2};
  op.u.gemm.alpha = 1;
  op.in[0] = upload(d, dt, 2, shape, ha);
  op.in[1] = upload(d, dt, 2, shape, hb);
  place_outputs(d, &op);
  double tt = dspk_bench_now_ms();
  CK(run_op(d, &op)); /* includes the tile tuning on a cold cache */
  CK(V->sync(d));
  tt = dspk_bench_now_ms() - tt;
  const char *win = dspk__vk_gemm_last(); /* the autotuner's choice */
  double tv = time_op(d, &op, reps), flop = 2.0 * n * (double)n * n;
  free_op(d, &op);
  printf("| gemm %d^2 %s | %.3f ms (%.1f TFLOP/s) |", n, dspk__dtype_name(dt), tv,
         flop / tv / 1e9);
#ifdef DSPK_BENCH_CUDA
  if (cuda_ok) {
    double tc = dspk_bench_cublas_gemm(dt, n, ha, hb, reps);
    printf(" %.3f ms (%.1f TFLOP/s) | %.2f |", tc, flop / tc / 1e9, tc / tv);
  } else
#endif
    printf(" - | - |");
  printf(" first call %.0f ms, kernel %s |\n", tt, win ? win : "not the tiled gemm");
  free(ha);
  free(hb);
}

/* VkFFT tuning decisions of the fft rows, printed under the table. */
static char fft_notes[16384];

static void bench_fft(struct dspk__dev *d, int64_t n, int64_t batch, int reps) {
  size_t nn = (size_t)(n * batch) * 2;
  float *hx = malloc(nn * 4);
  fill(hx, nn, DSPK_F32);
  int64_t shape[2] = {batch, n};
  struct dspk__op op = {.kind = DSPK_OP_FFT, .nin = 1};
  op.in[0] = upload(d, DSPK_C64, 2, shape, hx);
  place_outputs(d, &op);
  double tv = time_op(d, &op, reps);
  free_op(d, &op);
  char rep[3072];
  size_t at = strlen(fft_notes);
  if (dspk__vk_fft_tune_report(d, (uint64_t)n, (uint64_t)batch, 0, rep, sizeof rep) == 0 &&
      at < sizeof fft_notes)
    snprintf(fft_notes + at, sizeof fft_notes - at, "fft 2^%d x %lld: %s\n",
             (int)log2((double)n), (long long)batch, rep);
  printf("| fft 2^%d c64 x %lld | %.3f ms |", (int)log2((double)n), (long long)batch, tv);
#ifdef DSPK_BENCH_CUDA
  if (cuda_ok) {
    double tc = dspk_bench_cufft(n, batch, hx, reps);
    printf(" %.3f ms | %.2f |", tc, tc / tv);
  } else
#endif
    printf(" - | - |");
  printf("\n");
  free(hx);
}

/* fir of 2^24 f32 samples with 4096 taps, each overlap-save block size
 * forced, fused into our fft kernels with each configuration the tuner
 * would offer and unfused (DSPK_VK_FIR_SK): host-timed streams and GPU
 * timestamps, vs the in-process cuFFT overlap-save.  n samples (2^24 in
 * the benchmark; smaller ones check the mode on software devices). */
struct fir_ud {
  struct dspk__dev *d;
  struct dspk__op *op;
};
static int fir_rec(void *ud, int i) {
  struct fir_ud *u = ud;
  char msg[256] = "";
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  (void)i;
  return dspk__vk_fir(u->d, u->op, &ctx);
}
/* reps runs recorded into one submission, host-timed: against time_op
 * (a submission each, as the daemon makes), what a submission costs. */
static double time_batch(struct dspk__dev *d, struct dspk__op *op, int reps) {
  struct fir_ud u = {d, op};
  double v[3];
  for (int k = 0; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < reps; i++)
      CK(fir_rec(&u, i));
    CK(V->sync(d));
    v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  return dspk_bench_median3(v);
}
static void fir_row(struct dspk__dev *d, struct dspk__op *op, const char *sk, double tr) {
  struct fir_ud u = {d, op};
  double gpu = -1;
  setenv("DSPK_VK_FIR_SK", sk, 1);
  double tv = time_op(d, op, 20), tb = time_batch(d, op, 20);
  if (dspk__vk_gpu_ms(d, 10, fir_rec, &u, &gpu))
    gpu = -1;
  printf("| fir 2^%d f32 x 4096, %s%s %s%s | %.3f ms (one submission %.3f, GPU %.3f ms) | "
         "%.3f ms | %.3f |\n",
         (int)log2((double)dspk__tensor_numel(&op->in[0])), dspk__vk_fir_last(),
         dspk__vk_fir_last_fused() ? " fused" : "", *sk ? sk : "(default)",
         getenv("DSPK_VK_FIR_NOFIX") ? " no repair" : "",
         tv, tb, gpu, tr, tr > 0 ? tr / tv : 0);
}
static void bench_fir(struct dspk__dev *d, int64_t n) {
  int64_t k = 4096, xs[1] = {n}, hs[1] = {k}, L = 0;
  float *hx = malloc((size_t)n * 4), *hh = malloc((size_t)k * 4);
  double tr = -1;
  fill(hx, (size_t)n, DSPK_F32);
  fill(hh, (size_t)k, DSPK_F32);
  struct dspk__op op = {.kind = DSPK_OP_FIR, .nin = 2};
  op.in[0] = upload(d, DSPK_F32, 1, xs, hx);
  op.in[1] = upload(d, DSPK_F32, 1, hs, hh);
  place_outputs(d, &op);
#ifdef DSPK_BENCH_CUDA
  if (cuda_ok)
    tr = dspk_bench_cufft_fir(n, k, hx, hh, 20, NULL, &L);
#endif
  printf("(cuFFT overlap-save: L=%lld)\n", (long long)L);
  for (int m = 1; m <= 3; m++) {
    struct dspk__fir_geo g;
    struct dspk__vk_sfft_cfg c[8];
    char name[64];
    dspk__vk_fir_force(m);
    fir_row(d, &op, "off", tr);
    /* the configuration the daemon runs, without its non-finite repair */
    setenv("DSPK_VK_FIR_NOFIX", "1", 1);
    fir_row(d, &op, "", tr);
    unsetenv("DSPK_VK_FIR_NOFIX");
    fir_row(d, &op, "", tr);
    if (dspk__fir_geometry(n, k, 1, m, 28, &g) == 0) {
      int nc = dspk__vk_sfft_cands(d, (uint64_t)g.L, (uint64_t)g.nblk + 1, c, 8);
      for (int i = 0; i < nc; i++) {
        dspk__vk_sfft_name(&c[i], name, sizeof name);
        fir_row(d, &op, name, tr);
      }
    }
  }
  unsetenv("DSPK_VK_FIR_SK");
  dspk__vk_fir_force(-1);
  free_op(d, &op);
  free(hx);
  free(hh);
}

/* Open the device, gemm 1024^2 f32 + fft 2^16 c64, read both back. */
static double first_result(int idx, struct dspk__cache *c, uint64_t *compiled) {
  int n = 1024;
  size_t nn = (size_t)n * n;
  float *h = malloc(nn * 4 * 2);
  fill(h, nn * 2, DSPK_F32);
  double t0 = dspk_bench_now_ms();
  struct dspk__dev *d = open_dev(idx, c);
  int64_t gs[2] = {n, n}, fs[2] = {1, 1 << 16};
  struct dspk__op g = {.kind = DSPK_OP_GEMM, .nin = 2}, f = {.kind = DSPK_OP_FFT, .nin = 1};
  g.u.gemm.alpha = 1;
  g.in[0] = upload(d, DSPK_F32, 2, gs, h);
  g.in[1] = upload(d, DSPK_F32, 2, gs, h + nn);
  f.in[0] = upload(d, DSPK_C64, 2, fs, h);
  place_outputs(d, &g);
  place_outputs(d, &f);
  CK(run_op(d, &g));
  CK(run_op(d, &f));
  CK(V->read(d, g.out[0].mem, 0, h, nn * 4));
  CK(V->read(d, f.out[0].mem, 0, h + nn, (size_t)(1 << 16) * 8));
  double t = dspk_bench_now_ms() - t0;
  struct dspk__devstats st = {0};
  V->stats(d, &st);
  *compiled = st.kernels_compiled;
  free_op(d, &g);
  free_op(d, &f);
  V->close(d);
  free(h);
  return t;
}

/* `bench_vulkan gemm [n ...]`: f32 n^2 gemm (default 4096 and 8192) with
 * every kernel candidate forced in turn, then with the autotuner's choice;
 * cuBLAS sgemm on the same data when CUDA is there. */
static void bench_gemm_cands(struct dspk__dev *d, int n, int reps) {
  size_t nn = (size_t)n * n;
  float *ha = malloc(nn * 4), *hb = malloc(nn * 4);
  fill(ha, nn, DSPK_F32);
  fill(hb, nn, DSPK_F32);
  int64_t shape[2] = {n, n};
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2};
  op.u.gemm.alpha = 1;
  op.in[0] = upload(d, DSPK_F32, 2, shape, ha);
  op.in[1] = upload(d, DSPK_F32, 2, shape, hb);
  place_outputs(d, &op);
  double flop = 2.0 * n * (double)n * n, tc = 0;
#ifdef DSPK_BENCH_CUDA
  if (cuda_ok)
    tc = dspk_bench_cublas_gemm(DSPK_F32, n, ha, hb, reps);
#endif
  for (int c = 0; c < dspk__vk_gemm_ncands(); c++) {
    dspk__vk_gemm_force(c);
    char msg[256] = "";
    struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
    int r = V->run(d, &op, &ctx);
    if (r == 0)
      r = V->sync(d);
    if (r) {
      printf("| gemm %d^2 f32 | %s | - | - | %s |\n", n, dspk__vk_gemm_cand_name(c), msg);
      continue;
    }
    double tv = time_op(d, &op, reps);
    printf("| gemm %d^2 f32 | %s | %.3f ms | %.1f TFLOP/s |", n, dspk__vk_gemm_cand_name(c), tv,
           flop / tv / 1e9);
    if (tc > 0)
      printf(" %.2f of cuBLAS (%.1f TFLOP/s) |\n", tc / tv, flop / tc / 1e9);
    else
      printf(" - |\n");
  }
  dspk__vk_gemm_force(-1);
  double tt = dspk_bench_now_ms();
  CK(run_op(d, &op));
  CK(V->sync(d));
  tt = dspk_bench_now_ms() - tt;
  const char *win = dspk__vk_gemm_last();
  double tv = time_op(d, &op, reps);
  printf("| gemm %d^2 f32 | autotuned: %s (first call %.0f ms) | %.3f ms | %.1f TFLOP/s |", n,
         win ? win : "?", tt, tv, flop / tv / 1e9);
  if (tc > 0)
    printf(" %.2f of cuBLAS (%.1f TFLOP/s) |\n", tc / tv, flop / tc / 1e9);
  else
    printf(" - |\n");
  free_op(d, &op);
  free(ha);
  free(hb);
}

/* Batched products of small matrices, f32 (bench_vulkan small [M N K BATCH]
 * ...): the small-product kernel against the tiles it replaced (the test
 * hook DSPK_VK_GEMM_NOSMALL), per shape. */
static void bench_small(struct dspk__dev *d, int64_t M, int64_t N, int64_t K, int64_t nb) {
  int64_t as[3] = {nb, M, K}, bs[3] = {nb, K, N};
  size_t na = (size_t)(nb * M * K), nbb = (size_t)(nb * K * N);
  float *ha = malloc(na * 4 + 4), *hb = malloc(nbb * 4 + 4);
  fill(ha, na, DSPK_F32);
  fill(hb, nbb, DSPK_F32);
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2};
  op.u.gemm.alpha = 1;
  op.in[0] = upload(d, DSPK_F32, 3, as, ha);
  op.in[1] = upload(d, DSPK_F32, 3, bs, hb);
  place_outputs(d, &op);
  double t[2];
  const char *name[2];
  for (int v = 0; v < 2; v++) {
    if (v)
      setenv("DSPK_VK_GEMM_NOSMALL", "1", 1);
    double t1 = dspk_bench_now_ms();
    CK(run_op(d, &op));
    CK(V->sync(d));
    t1 = dspk_bench_now_ms() - t1;
    name[v] = dspk__vk_gemm_last();
    int reps = t1 > 200 ? 1 : t1 > 20 ? 3 : 10;
    t[v] = time_op(d, &op, reps);
    unsetenv("DSPK_VK_GEMM_NOSMALL");
  }
  printf("| %lldx%lldx%lld batch %lld | %s %.3f ms | %s %.3f ms | %.2f |\n", (long long)M,
         (long long)N, (long long)K, (long long)nb, name[0] ? name[0] : "?", t[0],
         name[1] ? name[1] : "?", t[1], t[1] / t[0]);
  free_op(d, &op);
  free(ha);
  free(hb);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
  int fft_only = argc > 1 && strcmp(argv[1], "fft") == 0     ? 1
                 : argc > 1 && strcmp(argv[1], "fftsk") == 0 ? 2
                                                             : 0;
  int idx = bench_vk_pick(V);
  if (idx < 0)
    return 1;
#ifdef DSPK_BENCH_CUDA
  if (!quick)
    cuda_init();
#endif
  char path[] = "/tmp/bench-vk-cache-XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  unlink(path);
  struct dspk__cache *c;
  CK(dspk__cache_open(path, NULL, &c, NULL, 0));
  struct dspk__dev *d = open_dev(idx, c);
  char f16path[256];
  dspk__vk_coopmat_describe(d, f16path, sizeof f16path);
  printf("f16 gemm path: %s\n\n", f16path);
  if (argc > 1 && strcmp(argv[1], "fir") == 0) {
    printf("| op | vulkan | cuFFT | ratio |\n|---|---|---|---|\n");
    bench_fir(d, (int64_t)1 << (argc > 2 ? atoi(argv[2]) : 24)); /* bench_vulkan fir [LOG2N] */
    V->close(d);
    dspk__cache_close(c);
    unlink(path);
    V->shutdown();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "small") == 0) {
    printf("| M x N x K, batch | chosen | tiles | tiles / chosen |\n|---|---|---|---|\n");
    static const int64_t shapes[][4] = {
        {1, 1, 1, 20000}, {1, 1, 3, 100000}, {4, 4, 4, 10000}, {8, 8, 8, 4000},
        {16, 16, 16, 1000}, {16, 16, 256, 200}, {32, 32, 32, 200}, {32, 32, 1024, 20},
        {64, 64, 64, 50}, {2, 2, 4096, 200}, {2, 2, 8192, 50}};
    if (argc >= 6)
      for (int i = 2; i + 3 < argc; i += 4)
        bench_small(d, atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]),
                    atoll(argv[i + 3]));
    else
      for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        bench_small(d, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    V->close(d);
    dspk__cache_close(c);
    unlink(path);
    V->shutdown();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "gemm") == 0) {
    printf("| op | kernel | time | rate | vs cuBLAS |\n|---|---|---|---|---|\n");
    for (int i = 2; i < argc || i == 2; i++) {
      int gn = i < argc ? atoi(argv[i]) : 4096;
      if (gn > 0)
        bench_gemm_cands(d, gn, gn >= 4096 ? 5 : 2);
      if (argc <= 2)
        bench_gemm_cands(d, 8192, 5);
    }
    V->close(d);
    dspk__cache_close(c);
    unlink(path);
    V->shutdown();
    return 0;
  }
  printf("| op | vulkan | cuBLAS/cuFFT | ratio (cu time / vk time) | note |\n|---|---|---|---|---|\n");
  if (fft_only) {
    static const int64_t shapes[][2] = {
        {1 << 20, 16}, {1 << 16, 256}, {1 << 12, 4096}, {1 << 24, 1}, {1 << 22, 4}, {1 << 10, 16384}};
    if (argc > 3 && fft_only == 1) /* bench_vulkan fft N BATCH: that shape only */
      bench_fft(d, atoll(argv[2]), atoll(argv[3]), 20);
    for (size_t i = 0; argc <= 3 && fft_only == 1 && i < sizeof shapes / sizeof shapes[0]; i++)
      bench_fft(d, shapes[i][0], shapes[i][1], 20);
    printf("\n%s", fft_notes);
    /* GPU timestamps: each candidate's transform vs a plain copy. */
    int64_t pn = argc > 3 ? atoll(argv[2]) : 1 << 20, pb = argc > 3 ? atoll(argv[3]) : 16;
    char prof[4096];
    if (fft_only == 1 &&
        dspk__vk_fft_profile(d, (uint64_t)pn, (uint64_t)pb, prof, sizeof prof) == 0)
      printf("\nfft 2^%d x %lld, %s\n", (int)log2((double)pn), (long long)pb, prof);
    /* Our kernels: every configuration of each pass, GPU timestamps
     * (bench_vulkan fftsk [N BATCH]: only this). */
    if (fft_only == 2) {
      static char skprof[65536];
      int skr = dspk__vk_sfft_profile(d, (uint64_t)pn, (uint64_t)pb, skprof, sizeof skprof);
      printf("\nown kernels, fft 2^%d x %lld (C/E[/H] ms):\n%s%s\n", (int)log2((double)pn),
             (long long)pb, skprof, skr ? " (stopped by an error)" : "");
    }
    V->close(d);
    dspk__cache_close(c);
    unlink(path);
    V->shutdown();
    return 0;
  }
  int sizes[2] = {quick ? 256 : 4096, quick ? 512 : 8192};
  for (int i = 0; i < 2; i++)
    bench_gemm(d, DSPK_F32, sizes[i], quick ? 2 : 5);
  for (int i = 0; i < 2; i++)
    bench_gemm(d, DSPK_F16, sizes[i], quick ? 2 : 5);
  for (int i = 0; i < 2; i++)
    bench_gemm(d, DSPK_BF16, sizes[i], quick ? 2 : 5);
  bench_fft(d, quick ? 1 << 12 : 1 << 20, quick ? 2 : 16, quick ? 2 : 20);
  printf("\n%s", fft_notes);
  V->close(d);
  dspk__cache_close(c);
  unlink(path);
  /* Time to first result: a new cache file (cold), then the same (warm). */
  CK(dspk__cache_open(path, NULL, &c, NULL, 0));
  uint64_t k1, k2;
  double cold = first_result(idx, c, &k1);
  dspk__cache_close(c);
  CK(dspk__cache_open(path, NULL, &c, NULL, 0));
  double warm = first_result(idx, c, &k2);
  dspk__cache_close(c);
  unlink(path);
  printf("\n| time to first result (open + gemm 1024^2 + fft 2^16 + read) | cold cache | warm cache |\n"
         "|---|---|---|\n| | %.1f ms (%llu compiles) | %.1f ms (%llu compiles) |\n",
         cold, (unsigned long long)k1, warm, (unsigned long long)k2);
  V->shutdown();
  return 0;
}
