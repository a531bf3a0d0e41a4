/*
 * Internal header of the CUDA backend (backends/cuda/): the CUDA driver
 * table of the shared GPU runtime (backends/gpurt/gpurt.h) and the names
 * tests and benchmarks use for the runtime's hooks on a CUDA device.
 *
 *   loader.c   dlopen of libcuda, NVRTC, cuBLAS, cuFFT (cuda_api.h)
 *   cuda.c     the driver table: one call of the dlopen'd function each,
 *              the probe, NVRTC, cuBLAS and cuFFT behind the table
 *   backend.c  struct dspk__backend dspk__backend_cuda
 *   worker_main.c  dspk-cuda-worker
 */
#ifndef DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H
#define DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H

#include "backends/cuda/cuda_api.h"
#include "backends/gpurt/gpurt.h"

#define DSPK__CUDA_MAX_DEVICES DSPK__GPURT_MAX_DEVICES

extern const struct dspk__backend dspk__backend_cuda;
extern const struct dspk__gpurt_driver dspk__gpurt_cuda;

/* The shared runtime's hooks under their CUDA names (tests, benchmarks). */
#define dspk__cuda_stage_config dspk__gpurt_stage_config
#define dspk__cuda_set_reduce_force dspk__gpurt_set_reduce_force
#define dspk__cuda_set_sync_on_evict dspk__gpurt_set_sync_on_evict
#define dspk__cuda_host_register dspk__gpurt_host_register
#define dspk__cuda_host_unregister dspk__gpurt_host_unregister
#define dspk__cuda_fir_force dspk__gpurt_fir_force
#define dspk__cuda_devid dspk__gpurt_devid
#define dspk__cuda_fir_last dspk__gpurt_fir_last
#define dspk__cuda_set_own_kernels dspk__gpurt_set_own_kernels
#define dspk__cuda_set_gemm_small dspk__gpurt_set_gemm_small
static inline int dspk__cuda_stage_write(struct dspk__dev *dev, CUdeviceptr dst,
                                         const void *src, size_t n) {
  return dspk__gpurt_stage_write(dev, (dspk__gptr)dst, src, n);
}
static inline int dspk__cuda_stage_read(struct dspk__dev *dev, void *dst, CUdeviceptr src,
                                        size_t n) {
  return dspk__gpurt_stage_read(dev, dst, (dspk__gptr)src, n);
}
static inline int dspk__cuda_compile(struct dspk__dev *dev, const char *arch, const char *name,
                                     const char *src, size_t len, void **bin, size_t *n,
                                     char *log, size_t loglen) {
  return dspk__gpurt_compile(&dspk__gpurt_cuda, dev, arch, name, src, len, bin, n, log, loglen,
                             NULL);
}
static inline CUstream dspk__cuda_stream(struct dspk__dev *dev) {
  return (CUstream)dspk__gpurt_stream(dev);
}
static inline void dspk__cuda_set_trace_events(struct dspk__dev *dev, CUevent start,
                                               CUevent end) {
  dspk__gpurt_set_trace_events(dev, start, end);
}

#endif /* DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H */
