/*
 * The HIP libraries as the hip backend sees them: function tables filled by
 * dlopen/dlsym at run time.  The runtime (libamdhip64) and hiprtc (inside
 * libamdhip64 on ROCm 5, libhiprtc on ROCm 6 and later) are declared by
 * ROCm's own headers (Debian: libamdhip64-dev), used for types and
 * prototypes only; nothing here links against ROCm.  hipBLAS/rocBLAS and
 * hipFFT, which Debian does not package, are declared here with the
 * handful of types they need: their gemm entry points share one shape
 * (handle, opA, opB, m, n, k, alpha, A, lda, [strideA], B, ldb, [strideB],
 * beta, C, ldc, [strideC], [batch]) and their operation values (111 N,
 * 112 T), so one table serves either library.
 *
 * Threads: the tables are written by dspk__hip_load_*() on the main thread
 * (probe) and read-only afterwards.
 */
#ifndef DSPK_BACKENDS_HIP_HIP_API_H
#define DSPK_BACKENDS_HIP_HIP_API_H

#include <stddef.h>
#include <stdint.h>

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#define DSPK__HIP_FUNCS(XX)                                                    \
  XX(hipInit) XX(hipDriverGetVersion) XX(hipRuntimeGetVersion)                 \
  XX(hipGetDeviceCount) XX(hipDeviceGetName) XX(hipDeviceTotalMem)             \
  XX(hipDeviceGetAttribute) XX(hipGetDeviceProperties) XX(hipDeviceGetUuid)    \
  XX(hipSetDevice) XX(hipDeviceReset) XX(hipDeviceSynchronize)                 \
  XX(hipStreamCreateWithFlags) XX(hipStreamDestroy) XX(hipStreamSynchronize)   \
  XX(hipStreamQuery) XX(hipEventCreateWithFlags) XX(hipEventDestroy)           \
  XX(hipEventRecord) XX(hipEventQuery) XX(hipEventSynchronize)                 \
  XX(hipMalloc) XX(hipFree) XX(hipHostMalloc) XX(hipHostFree)                  \
  XX(hipHostRegister) XX(hipHostUnregister)                                    \
  XX(hipMemcpyHtoDAsync) XX(hipMemcpyDtoHAsync) XX(hipMemsetD8Async)           \
  XX(hipMemcpyHtoD) XX(hipMemcpyDtoH) XX(hipModuleLoadData)                    \
  XX(hipModuleUnload) XX(hipModuleGetFunction) XX(hipModuleLaunchKernel)       \
  XX(hipGetErrorName) XX(hipGetErrorString) XX(hipIpcGetMemHandle)             \
  XX(hipIpcOpenMemHandle) XX(hipIpcCloseMemHandle)

#define DSPK__HIPRTC_FUNCS(XX)                                                 \
  XX(hiprtcVersion) XX(hiprtcCreateProgram) XX(hiprtcCompileProgram)           \
  XX(hiprtcGetProgramLogSize) XX(hiprtcGetProgramLog) XX(hiprtcGetCodeSize)    \
  XX(hiprtcGetCode) XX(hiprtcDestroyProgram) XX(hiprtcGetErrorString)

#define DSPK__HIP_MEMBER(f) __typeof__(&f) f;

struct dspk__hip_api {
  void *lib;
  DSPK__HIP_FUNCS(DSPK__HIP_MEMBER)
};
struct dspk__hiprtc_api {
  void *lib;
  int major, minor;
  DSPK__HIPRTC_FUNCS(DSPK__HIP_MEMBER)
};

/* hipBLAS or rocBLAS (whichever loaded; names in hip.c). */
typedef int (*dspk__xgemm_fn)(void *h, int opa, int opb, int m, int n, int k,
                              const void *alpha, const void *A, int lda,
                              const void *B, int ldb, const void *beta, void *C,
                              int ldc);
typedef int (*dspk__xgemm_sb_fn)(void *h, int opa, int opb, int m, int n, int k,
                                 const void *alpha, const void *A, int lda,
                                 int64_t sa, const void *B, int ldb, int64_t sb,
                                 const void *beta, void *C, int ldc, int64_t sc,
                                 int batch);
struct dspk__hipblas_api {
  void *lib;
  const char *name; /* "hipBLAS", "rocBLAS" */
  int (*create)(void **h);
  int (*destroy)(void *h);
  int (*set_stream)(void *h, hipStream_t s);
  dspk__xgemm_fn sgemm, dgemm;
  dspk__xgemm_sb_fn sgemm_sb, dgemm_sb, cgemm_sb, zgemm_sb;
};

/* hipFFT (over rocFFT), the cuFFT-shaped API. */
struct dspk__hipfft_api {
  void *lib;
  int (*create)(void **plan);
  int (*destroy)(void *plan);
  int (*set_auto_allocation)(void *plan, int on);
  int (*make_plan_many64)(void *plan, int rank, long long *n, long long *inembed,
                          long long istride, long long idist, long long *onembed,
                          long long ostride, long long odist, int type, long long batch,
                          size_t *ws);
  int (*set_work_area)(void *plan, void *ws);
  int (*set_stream)(void *plan, hipStream_t s);
  int (*exec_c2c)(void *plan, void *in, void *out, int dir);
  int (*exec_z2z)(void *plan, void *in, void *out, int dir);
  int (*exec_r2c)(void *plan, void *in, void *out);
  int (*exec_d2z)(void *plan, void *in, void *out);
  int (*exec_c2r)(void *plan, void *in, void *out);
  int (*exec_z2d)(void *plan, void *in, void *out);
};

extern struct dspk__hip_api dspk__hip;
extern struct dspk__hiprtc_api dspk__hiprtc;
extern struct dspk__hipblas_api dspk__hipblas;
extern struct dspk__hipfft_api dspk__hipfft;

/*
 * Each loader opens its library once (later calls return the first
 * result), resolves every symbol and returns 0, or a negative dspk_errno
 * with the reason in why.  The test hooks (proto/testhook.h)
 * DSPK_HIP_RUNTIME, DSPK_HIP_BLAS and DSPK_HIP_FFT override those
 * libraries' paths ("none": do not load; hiprtc is then looked for in the
 * runtime's library first); the libraries are looked for in
 * DSPK_HIP_LIBDIR (environment, dspkd(8)), then in the dynamic linker's
 * path, then in /opt/rocm/lib.
 */
int dspk__hip_load_runtime(char *why, size_t whylen);
int dspk__hip_load_hiprtc(char *why, size_t whylen);
int dspk__hip_load_blas(char *why, size_t whylen);
int dspk__hip_load_fft(char *why, size_t whylen);
/* Resets the tables (the libraries stay mapped). */
void dspk__hip_unload(void);

#endif /* DSPK_BACKENDS_HIP_HIP_API_H */
