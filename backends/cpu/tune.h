/*
 * Measured choices of the cpu backend, on top of the shared autotune
 * framework (backends/common/autotune.h) and the persistent cache
 * (cache/cache.h, backends/cpu/fftw_wisdom.h).  Owned by the cache/autotune area;
 * the cpu backend calls these from its choice points (cpu.h):
 *
 *   fir:  dspk__cpu_fir_use_fft()    -> dspk__cpu_tune_fir()
 *   gemm: dspk__cpu_gemm_threads()   -> dspk__cpu_tune_gemm_threads()
 *   fft:  dspk__cpu_fft_flags()      -> dspk__cpu_tune_fft_flags()
 *         (dev->fft_flags and dev->gemm_threads stay overrides for tests)
 *         cpu open                   -> dspk__cpu_tune_wisdom_load()
 *         after making a new plan    -> dspk__cpu_tune_wisdom_save()
 *
 * Every function runs on the device's runner thread.  The tunings run on
 * scratch arrays of a representative size of the shape class (never on
 * the task's data) and are stored in dev->env.cache, so a restarted daemon
 * does not measure again.
 */
#ifndef DSPK_BACKENDS_CPU_TUNE_H
#define DSPK_BACKENDS_CPU_TUNE_H

#include "backends/cpu/cpu.h"
#include "cache/cache.h"

/* fir: returns 1 for FFT convolution, 0 for the direct loop, measured per
 * shape class (n and k bucketed to powers of two, dtype) when the choice is
 * not obvious (very short filters are direct, very long ones FFT), or a
 * negative dspk_errno (DSPK_ECANCELED, DSPK_ENOMEM): the caller then uses
 * its heuristic (or returns DSPK_ECANCELED).  ctx may be NULL; its cancel
 * flag and progress callback are used during a tuning. */
int dspk__cpu_tune_fir(struct dspk__dev *dev, dspk_dtype dt, int64_t n,
                       int64_t k, struct dspk__opctx *ctx);

/* gemm: returns the OpenBLAS thread count measured fastest for one product
 * of this size class (each of M, N, K <= 1024 and M*N*K <= 2^27), or 0
 * (the library's default) for larger products or when tuning fails. */
int dspk__cpu_tune_gemm_threads(struct dspk__dev *dev, dspk_dtype dt,
                                int64_t M, int64_t N, int64_t K);

/* gemm: the thread count dspk__cpu_tune_gemm_threads() would return, when
 * it is known without measuring (decided in this process, or a product not
 * tuned), else -1.  Any thread. */
int dspk__cpu_tune_gemm_decided(struct dspk__dev *dev, dspk_dtype dt, int64_t M,
                                int64_t N, int64_t K);

/* fft: planner flags for `batch` transforms of length n: FFTW_MEASURE when
 * the device has a cache to keep the wisdom in and the plan is one a
 * client is likely to reuse (batch <= 4: chunks of long transforms, single
 * signals), FFTW_ESTIMATE otherwise (every new batch count of a short
 * transform would be measured again, seconds each). */
unsigned dspk__cpu_tune_fft_flags(struct dspk__dev *dev, int n, int batch);

/* Imports the cache's FFTW wisdom (at device open).  Takes the FFTW lock.
 * Returns the number of precisions imported or a negative dspk_errno. */
int dspk__cpu_tune_wisdom_load(struct dspk__dev *dev);
/* Stores FFTW's wisdom in the cache when it changed (after a plan was made
 * with FFTW_MEASURE).  Takes the FFTW lock: call it without holding it.
 * Returns the number of blobs written or a negative dspk_errno. */
int dspk__cpu_tune_wisdom_save(struct dspk__dev *dev);
/* The same, for a caller that holds the FFTW lock (one that would rather
 * not wait for it: dspk__cpu_fft_wisdom_flush). */
int dspk__cpu_tune_wisdom_save_locked(struct dspk__dev *dev);

#endif /* DSPK_BACKENDS_CPU_TUNE_H */
