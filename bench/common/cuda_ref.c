/*
 * cuBLAS / cuFFT in-process references for the benchmarks (cuda_ref.h),
 * and the overlap-save fir written with cuFFT.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"
#include "bench/common/bench_util.h"
#include "bench/common/cuda_ref.h"

#define CU dspk__cu
#define BL dspk__cublas
#define FF dspk__cufft

#define CK(x) DSPK_BENCH_CK("cuda reference", x)

double dspk_bench_cublas_gemm(dspk_dtype dt, int n, const void *ha, const void *hb, int reps) {
  size_t isz = dt == DSPK_F32 ? 4 : 2, nn = (size_t)n * n;
  cudaDataType_t in = dt == DSPK_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  CUdeviceptr a, b, c;
  CUstream st;
  cublasHandle_t h;
  float one = 1, zero = 0;
  double v[3];
  CK(CU.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CK(BL.cublasCreate(&h));
  CK(BL.cublasSetStream(h, (cudaStream_t)st));
  CK(CU.cuMemAlloc(&a, nn * isz));
  CK(CU.cuMemAlloc(&b, nn * isz));
  CK(CU.cuMemAlloc(&c, nn * 4));
  CK(CU.cuMemcpyHtoDAsync(a, ha, nn * isz, st));
  CK(CU.cuMemcpyHtoDAsync(b, hb, nn * isz, st));
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < (k < 0 ? 1 : reps); i++) {
      if (dt == DSPK_F32)
        CK(BL.cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float *)b, n,
                          (float *)a, n, &zero, (float *)c, n));
      else
        CK(BL.cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (void *)b, in, n,
                           (void *)a, in, n, &zero, (void *)c, CUDA_R_32F, n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CK(CU.cuStreamSynchronize(st));
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  BL.cublasDestroy(h);
  CU.cuMemFree(a);
  CU.cuMemFree(b);
  CU.cuMemFree(c);
  CU.cuStreamDestroy(st);
  return dspk_bench_median3(v);
}

double dspk_bench_cufft(int64_t n, int64_t batch, const void *hx, int reps) {
  size_t bytes = (size_t)(n * batch) * 8;
  CUdeviceptr x, y;
  CUstream st;
  cufftHandle p;
  size_t ws;
  long long nn = n;
  double v[3];
  CK(CU.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CK(CU.cuMemAlloc(&x, bytes));
  CK(CU.cuMemAlloc(&y, bytes));
  CK(CU.cuMemcpyHtoDAsync(x, hx, bytes, st));
  CK(FF.cufftCreate(&p));
  CK(FF.cufftMakePlanMany64(p, 1, &nn, NULL, 1, n, NULL, 1, n, CUFFT_C2C, batch, &ws));
  CK(FF.cufftSetStream(p, (cudaStream_t)st));
  for (int k = -1; k < 3; k++) {
    double t0 = dspk_bench_now_ms();
    for (int i = 0; i < (k < 0 ? 1 : reps); i++)
      CK(FF.cufftExecC2C(p, (cufftComplex *)x, (cufftComplex *)y, CUFFT_FORWARD));
    CK(CU.cuStreamSynchronize(st));
    if (k >= 0)
      v[k] = (dspk_bench_now_ms() - t0) / reps;
  }
  FF.cufftDestroy(p);
  CU.cuMemFree(x);
  CU.cuMemFree(y);
  CU.cuStreamDestroy(st);
  return dspk_bench_median3(v);
}

/* ---- fir: overlap-save with cuFFT ----------------------------------------- */

/* 32-bit indexing (the caller keeps every size below 2^31). */
static const char fir_src[] =
    "extern \"C\" __global__ void gather(const float *x, float *b, unsigned n, unsigned k,\n"
    "                                    unsigned S, unsigned L, unsigned total) {\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;\n"
    "       i += blockDim.x * gridDim.x) {\n"
    "    unsigned g = i / L, t = g * S + (i - g * L);\n"
    "    b[i] = t >= k - 1 && t - (k - 1) < n ? x[t - (k - 1)] : 0.0f;\n"
    "  }\n"
    "}\n"
    "struct c2 { float x, y; };\n"
    "extern \"C\" __global__ void cmul(c2 *f, const c2 *h, unsigned m, unsigned total) {\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;\n"
    "       i += blockDim.x * gridDim.x) {\n"
    "    c2 a = f[i], w = h[i % m], r;\n"
    "    r.x = a.x * w.x - a.y * w.y;\n"
    "    r.y = a.x * w.y + a.y * w.x;\n"
    "    f[i] = r;\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void scatter(const float *b, float *y, unsigned n, unsigned k,\n"
    "                                     unsigned S, unsigned L) {\n"
    "  for (unsigned t = blockIdx.x * blockDim.x + threadIdx.x; t < n;\n"
    "       t += blockDim.x * gridDim.x) {\n"
    "    unsigned g = t / S;\n"
    "    y[t] = b[g * L + (k - 1) + (t - g * S)];\n"
    "  }\n"
    "}\n";

/* Grid-stride kernels of 256 threads, at most one full wave of blocks
 * (8 a multiprocessor): on the H200 the gather and scatter run in 0.060
 * and 0.051 ms so, against 0.076 and 0.060 ms with 65536 blocks. */
static void launch(CUfunction f, int64_t n, int sms, CUstream st, void **args) {
  int64_t blocks = (n + 255) / 256;
  if (blocks > (int64_t)sms * 8)
    blocks = (int64_t)sms * 8;
  CK(CU.cuLaunchKernel(f, (unsigned)(blocks ? blocks : 1), 1, 1, 256, 1, 1, 0, st, args, NULL));
}

double dspk_bench_cufft_fir(int64_t n, int64_t k, const float *hx, const float *hh, int reps,
                            float *hy, int64_t *lbest) {
  CUdevice dev;
  int maj = 0, min = 0, sms = 0;
  char arch[16], log[4096];
  void *bin = NULL;
  size_t blen = 0;
  CUmodule mod;
  CUfunction fg, fm, fs;
  CUstream st;
  CUdeviceptr x, y, h, b, f, hs;
  double best = 1e300;
  int64_t kp = 1;
  while (kp < k)
    kp <<= 1;
  if (n + (kp << 4) >= ((int64_t)1 << 31))
    dspk_bench_die("cuda reference", "fir: n below 2^31", 1);
  CK(CU.cuDeviceGet(&dev, 0));
  CK(CU.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CK(CU.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CK(CU.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  snprintf(arch, sizeof(arch), "sm_%d%d", maj, min);
  if (dspk__cuda_compile(NULL, arch, "fir_ref.cu", fir_src, sizeof(fir_src) - 1, &bin, &blen,
                         log, sizeof(log)) != 0) {
    fprintf(stderr, "fir reference: %s\n", log);
    exit(1);
  }
  CK(CU.cuModuleLoadData(&mod, bin));
  free(bin);
  CK(CU.cuModuleGetFunction(&fg, mod, "gather"));
  CK(CU.cuModuleGetFunction(&fm, mod, "cmul"));
  CK(CU.cuModuleGetFunction(&fs, mod, "scatter"));
  CK(CU.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CK(CU.cuMemAlloc(&x, (size_t)n * 4));
  CK(CU.cuMemAlloc(&y, (size_t)n * 4));
  CK(CU.cuMemcpyHtoDAsync(x, hx, (size_t)n * 4, st));
  for (int m = 2; m <= 4; m++) {
    int64_t L = kp << m, S = L - k + 1, nb = (n + S - 1) / S, m2 = L / 2 + 1;
    int64_t tb = nb * L, tf = nb * m2;
    long long nn = L;
    size_t ws;
    cufftHandle pf, pb, ph;
    float *hp = calloc((size_t)L, 4), sc = 1.0f / (float)L;
    double v[3];
    for (int64_t i = 0; i < k; i++)
      hp[i] = hh[i] * sc;
    CK(CU.cuMemAlloc(&h, (size_t)L * 4));
    CK(CU.cuMemAlloc(&hs, (size_t)m2 * 8));
    CK(CU.cuMemAlloc(&b, (size_t)tb * 4));
    CK(CU.cuMemAlloc(&f, (size_t)tf * 8));
    CK(CU.cuMemcpyHtoDAsync(h, hp, (size_t)L * 4, st));
    CK(FF.cufftCreate(&ph));
    CK(FF.cufftMakePlanMany64(ph, 1, &nn, NULL, 1, L, NULL, 1, m2, CUFFT_R2C, 1, &ws));
    CK(FF.cufftSetStream(ph, (cudaStream_t)st));
    CK(FF.cufftExecR2C(ph, (cufftReal *)h, (cufftComplex *)hs));
    CK(FF.cufftCreate(&pf));
    CK(FF.cufftMakePlanMany64(pf, 1, &nn, NULL, 1, L, NULL, 1, m2, CUFFT_R2C, nb, &ws));
    CK(FF.cufftSetStream(pf, (cudaStream_t)st));
    CK(FF.cufftCreate(&pb));
    CK(FF.cufftMakePlanMany64(pb, 1, &nn, NULL, 1, m2, NULL, 1, L, CUFFT_C2R, nb, &ws));
    CK(FF.cufftSetStream(pb, (cudaStream_t)st));
    {
      unsigned un = (unsigned)n, uk = (unsigned)k, uS = (unsigned)S, uL = (unsigned)L;
      unsigned utb = (unsigned)tb, um2 = (unsigned)m2, utf = (unsigned)tf;
      void *ag[7] = {&x, &b, &un, &uk, &uS, &uL, &utb};
      void *am[4] = {&f, &hs, &um2, &utf};
      void *as[6] = {&b, &y, &un, &uk, &uS, &uL};
      for (int r = -1; r < 3; r++) {
        double t0 = dspk_bench_now_ms();
        for (int i = 0; i < (r < 0 ? 1 : reps); i++) {
          launch(fg, tb, sms, st, ag);
          CK(FF.cufftExecR2C(pf, (cufftReal *)b, (cufftComplex *)f));
          launch(fm, tf, sms, st, am);
          CK(FF.cufftExecC2R(pb, (cufftComplex *)f, (cufftReal *)b));
          launch(fs, n, sms, st, as);
        }
        CK(CU.cuStreamSynchronize(st));
        if (r >= 0)
          v[r] = (dspk_bench_now_ms() - t0) / reps;
      }
    }
    double t = dspk_bench_median3(v);
    if (t < best) {
      best = t;
      if (lbest)
        *lbest = L;
      if (hy) {
        CK(CU.cuMemcpyDtoHAsync(hy, y, (size_t)n * 4, st));
        CK(CU.cuStreamSynchronize(st));
      }
    }
    FF.cufftDestroy(ph);
    FF.cufftDestroy(pf);
    FF.cufftDestroy(pb);
    CU.cuMemFree(h);
    CU.cuMemFree(hs);
    CU.cuMemFree(b);
    CU.cuMemFree(f);
    free(hp);
  }
  CU.cuMemFree(x);
  CU.cuMemFree(y);
  CU.cuModuleUnload(mod);
  CU.cuStreamDestroy(st);
  return best;
}
