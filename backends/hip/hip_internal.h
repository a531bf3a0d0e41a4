/*
 * Internal header of the HIP backend (backends/hip/): the HIP driver table
 * of the shared GPU runtime (backends/gpurt/gpurt.h).
 *
 *   loader.c   dlopen of libamdhip64, hiprtc, hipBLAS/rocBLAS, hipFFT
 *   hip.c      the driver table and the probe
 *   backend.c  struct dspk__backend dspk__backend_hip
 *   worker_main.c  dspk-hip-worker
 */
#ifndef DSPK_BACKENDS_HIP_HIP_INTERNAL_H
#define DSPK_BACKENDS_HIP_HIP_INTERNAL_H

#include "backends/gpurt/gpurt.h"
#include "backends/hip/hip_api.h"

extern const struct dspk__backend dspk__backend_hip;
extern const struct dspk__gpurt_driver dspk__gpurt_hip;

#endif /* DSPK_BACKENDS_HIP_HIP_INTERNAL_H */
