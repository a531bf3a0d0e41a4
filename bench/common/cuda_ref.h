/*
 * The in-process side of the CUDA comparisons (bench_cuda, bench_vulkan):
 * cuBLAS and cuFFT called directly through the CUDA backend's dlopen tables,
 * with their own handle, stream and memory, on the caller's bytes.  Each
 * returns the median ms per call of 3 batches of `reps` back-to-back calls
 * ended by one synchronize (after one untimed call); a failing CUDA call
 * prints what failed and exits 1.
 */
#ifndef DSPK_BENCH_CUDA_REF_H
#define DSPK_BENCH_CUDA_REF_H

#include <stdint.h>

#include "dspk/types.h"

/* C (n x n, f32) = A B, row-major n x n inputs of dtype dt: f32 through
 * cublasSgemm, f16/bf16 through cublasGemmEx with f32 accumulation. */
double dspk_bench_cublas_gemm(dspk_dtype dt, int n, const void *ha, const void *hb, int reps);
/* A forward C2C fft of `batch` c64 rows of n points, out of place. */
double dspk_bench_cufft(int64_t n, int64_t batch, const void *hx, int reps);

/* fir (scipy.signal.lfilter(h, 1, x)) of n f32 samples with k f32 taps,
 * the way one would write it with cuFFT: overlap-save with blocks of L
 * samples (a gather kernel, a batched R2C transform, a multiplication by
 * the filter's half spectrum, a batched C2R transform, a scatter kernel;
 * kernels compiled with NVRTC and launched one full wave of blocks), the
 * filter's spectrum made once outside the timing.  Timed for L = 4, 8 and 16 times k rounded up to a power of
 * two; returns the fastest (its L in *lbest), and the output of that run
 * in hy (n floats) when hy is not NULL.  The caller has a current context
 * and loaded NVRTC and cuFFT. */
double dspk_bench_cufft_fir(int64_t n, int64_t k, const float *hx, const float *hh, int reps,
                            float *hy, int64_t *lbest);

#endif /* DSPK_BENCH_CUDA_REF_H */
