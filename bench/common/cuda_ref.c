/*
 * cuBLAS / cuFFT in-process references for the benchmarks (cuda_ref.h).
 */
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
