/*
 * A stand-in for libcuda.so.1 (loaded by dspkd through DSPK_CUDA_DRIVER) for
 * tests/cuda/fencefault.py: one device whose memory is host memory, copies
 * done at once, and a stream whose events complete only when something
 * waits for them (cuEventSynchronize, cuStreamSynchronize), so the daemon
 * really has several requests in flight.  A host-to-device copy whose data
 * starts with "DEVFAULT" makes the device report an error (a non-sticky
 * one) at the next event recorded behind it, as a fault reaches the host
 * through the next event; everything else succeeds.  Kernels are not run.
 * Built only for the tests.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define API __attribute__((visibility("default")))

struct fev {
  uint64_t target; /* the record's sequence number */
  CUresult err;    /* what the device reports there */
};
static uint64_t recorded, executed;
static CUresult pending; /* reported at the next event recorded */

API CUresult CUDAAPI cuInit(unsigned int Flags) {
  (void)Flags;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDriverGetVersion(int *v) {
  *v = 12040;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceGetCount(int *count) {
  *count = 1;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  *device = ordinal;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  (void)dev;
  strncpy(name, "fake CUDA device", (size_t)len);
  name[len - 1] = 0;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  (void)dev;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 4; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  (void)dev;
  *bytes = (size_t)1 << 30;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  (void)dev;
  memset(uuid, 0x5a, sizeof *uuid);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  (void)dev;
  *pctx = (CUcontext)(uintptr_t)0x1000;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  (void)dev;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  (void)dev;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  (void)ctx;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxSynchronize(void) {
  executed = recorded;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned int Flags) {
  (void)Flags;
  *s = (CUstream)(uintptr_t)0x2000;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamDestroy(CUstream s) {
  (void)s;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  (void)s;
  executed = recorded;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamQuery(CUstream s) {
  (void)s;
  return executed == recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult CUDAAPI cuEventCreate(CUevent *ev, unsigned int Flags) {
  (void)Flags;
  *ev = (CUevent)calloc(1, sizeof(struct fev));
  return *ev ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult CUDAAPI cuEventDestroy(CUevent ev) {
  free(ev);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream s) {
  struct fev *e = (struct fev *)ev;
  (void)s;
  e->target = ++recorded;
  e->err = pending;
  pending = CUDA_SUCCESS;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuEventQuery(CUevent ev) {
  struct fev *e = (struct fev *)ev;
  return executed < e->target ? CUDA_ERROR_NOT_READY : e->err;
}
API CUresult CUDAAPI cuEventSynchronize(CUevent ev) {
  struct fev *e = (struct fev *)ev;
  if (executed < e->target)
    executed = e->target;
  return e->err;
}
API CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  (void)a;
  (void)b;
  *ms = 0;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemAlloc(CUdeviceptr *p, size_t n) {
  void *m = malloc(n ? n : 1);
  if (!m)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemFree(CUdeviceptr p) {
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n,
                                       CUstream s) {
  (void)s;
  memcpy((void *)(uintptr_t)dst, src, n);
  if (n >= 8 && memcmp(src, "DEVFAULT", 8) == 0)
    pending = CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                       CUstream s) {
  (void)s;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n,
                                     CUstream s) {
  (void)s;
  memset((void *)(uintptr_t)dst, uc, n);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t n, unsigned int Flags) {
  (void)Flags;
  *pp = malloc(n ? n : 1);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult CUDAAPI cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemAllocHost(void **pp, size_t n) { return cuMemHostAlloc(pp, n, 0); }
/* Shared-memory buffers pin the client's mapping: nothing to do here. */
API CUresult CUDAAPI cuMemHostRegister(void *p, size_t n, unsigned int Flags) {
  (void)p, (void)n, (void)Flags;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemHostUnregister(void *p) {
  (void)p;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemGetInfo(size_t *free_, size_t *total) {
  *free_ = *total = (size_t)1 << 30;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuModuleLoadData(CUmodule *m, const void *image) {
  (void)m;
  (void)image;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  (void)m;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  (void)f;
  (void)m;
  (void)name;
  return CUDA_ERROR_NOT_FOUND;
}
API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int shared, CUstream s,
                                    void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
  (void)s, (void)params, (void)extra;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  (void)f, (void)a, (void)v;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) {
  *s = e == CUDA_ERROR_INVALID_HANDLE ? "CUDA_ERROR_INVALID_HANDLE" : "CUDA_ERROR";
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s) {
  (void)e;
  *s = "reported by the fake device";
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  (void)h, (void)p;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int f) {
  (void)p, (void)h, (void)f;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr p) {
  (void)p;
  return CUDA_ERROR_NOT_SUPPORTED;
}
