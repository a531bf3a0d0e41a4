/*
 * The CUDA libraries as the backend sees them: function tables filled by
 * dlopen/dlsym at run time (libcuda.so.1, libnvrtc, libcublas, libcufft).
 * The toolkit headers give the types and prototypes only; nothing here is
 * linked against CUDA.  Each table member is declared with the type of the
 * header's prototype and named after the header's macro expansion, so
 * `dspk__cu.cuMemAlloc(...)` calls cuMemAlloc_v2, exactly the symbol the
 * headers would have linked.
 *
 * Threads: the tables are written by dspk__cuda_load_*() on the main thread
 * (probe) and read-only afterwards.
 */
#ifndef DSPK_BACKENDS_CUDA_CUDA_API_H
#define DSPK_BACKENDS_CUDA_CUDA_API_H

#include <stddef.h>

#include <cuda.h>
#include <cublas_v2.h>
#include <cufft.h>
#include <nvrtc.h>

#define DSPK__CU_FUNCS(XX)                                                     \
  XX(cuInit) XX(cuDriverGetVersion) XX(cuDeviceGetCount) XX(cuDeviceGet)       \
  XX(cuDeviceGetName) XX(cuDeviceGetAttribute) XX(cuDeviceTotalMem)            \
  XX(cuDeviceGetUuid) XX(cuDevicePrimaryCtxRetain)                             \
  XX(cuDevicePrimaryCtxRelease) XX(cuDevicePrimaryCtxReset)                    \
  XX(cuCtxSetCurrent) XX(cuCtxSynchronize) XX(cuStreamCreate)                  \
  XX(cuStreamDestroy) XX(cuStreamSynchronize) XX(cuStreamQuery)               \
  XX(cuEventCreate)                                                            \
  XX(cuEventDestroy) XX(cuEventRecord) XX(cuEventQuery) XX(cuEventSynchronize) \
  XX(cuEventElapsedTime) XX(cuMemAlloc) XX(cuMemFree) XX(cuMemcpyHtoDAsync)    \
  XX(cuMemcpyDtoHAsync) XX(cuMemcpyDtoDAsync) XX(cuMemsetD8Async)             \
  XX(cuMemHostAlloc) XX(cuMemFreeHost) XX(cuMemGetInfo) XX(cuModuleLoadData)  \
  XX(cuModuleUnload) XX(cuModuleGetFunction) XX(cuLaunchKernel)               \
  XX(cuGetErrorName) XX(cuGetErrorString) XX(cuFuncSetAttribute)              \
  XX(cuIpcGetMemHandle) XX(cuIpcOpenMemHandle) XX(cuIpcCloseMemHandle)         \
  XX(cuMemAllocHost) XX(cuMemcpyHtoD) XX(cuMemcpyDtoH)                        \
  XX(cuMemHostRegister) XX(cuMemHostUnregister)

#define DSPK__NVRTC_FUNCS(XX)                                                  \
  XX(nvrtcVersion) XX(nvrtcCreateProgram) XX(nvrtcCompileProgram)              \
  XX(nvrtcGetProgramLogSize) XX(nvrtcGetProgramLog) XX(nvrtcGetCUBINSize)      \
  XX(nvrtcGetCUBIN) XX(nvrtcDestroyProgram) XX(nvrtcGetErrorString)

#define DSPK__CUBLAS_FUNCS(XX)                                                 \
  XX(cublasCreate) XX(cublasDestroy) XX(cublasSetStream)                       \
  XX(cublasSetWorkspace) XX(cublasGetVersion) XX(cublasSgemm) XX(cublasDgemm)  \
  XX(cublasSgemmStridedBatched) XX(cublasDgemmStridedBatched)                  \
  XX(cublasCgemmStridedBatched) XX(cublasZgemmStridedBatched)                  \
  XX(cublasGemmEx) XX(cublasGemmStridedBatchedEx) XX(cublasSetMathMode)

#define DSPK__CUFFT_FUNCS(XX)                                                  \
  XX(cufftCreate) XX(cufftDestroy) XX(cufftSetAutoAllocation)                  \
  XX(cufftMakePlanMany64) XX(cufftSetWorkArea) XX(cufftSetStream)              \
  XX(cufftExecC2C) XX(cufftExecZ2Z) XX(cufftExecR2C) XX(cufftExecD2Z)          \
  XX(cufftExecC2R) XX(cufftExecZ2D) XX(cufftGetVersion)

#define DSPK__CUDA_MEMBER(f) __typeof__(&f) f;

struct dspk__cu_api {
  void *lib;
  DSPK__CU_FUNCS(DSPK__CUDA_MEMBER)
};
struct dspk__nvrtc_api {
  void *lib;
  int major, minor;
  DSPK__NVRTC_FUNCS(DSPK__CUDA_MEMBER)
};
struct dspk__cublas_api {
  void *lib;
  DSPK__CUBLAS_FUNCS(DSPK__CUDA_MEMBER)
};
struct dspk__cufft_api {
  void *lib;
  DSPK__CUFFT_FUNCS(DSPK__CUDA_MEMBER)
};

extern struct dspk__cu_api dspk__cu;
extern struct dspk__nvrtc_api dspk__nvrtc;
extern struct dspk__cublas_api dspk__cublas;
extern struct dspk__cufft_api dspk__cufft;

/*
 * Each loader opens its library once (later calls return the first
 * result), resolves every symbol of its table and returns 0, or a negative
 * dspk_errno with the reason ("libcuda.so.1 not found", "symbol X missing")
 * in why.  The test hook DSPK_CUDA_DRIVER (proto/testhook.h) overrides the
 * driver library's path (else libcuda.so.1 in the dynamic linker's path
 * alone); the toolkit libraries are looked for in the dynamic linker's
 * path, then in DSPK_CUDA_LIBDIR (environment, dspkd(8)), then in
 * /usr/local/cuda/lib64 and /usr/local/cuda/targets/x86_64-linux/lib.
 */
int dspk__cuda_load_driver(char *why, size_t whylen);
int dspk__cuda_load_nvrtc(char *why, size_t whylen);
int dspk__cuda_load_cublas(char *why, size_t whylen);
int dspk__cuda_load_cufft(char *why, size_t whylen);
/* Resets the tables (the libraries stay mapped: see loader.c). */
void dspk__cuda_unload(void);

#endif /* DSPK_BACKENDS_CUDA_CUDA_API_H */
