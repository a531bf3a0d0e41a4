/*
 * The CUDA backend: the CUDA driver API, NVRTC, cuBLAS and cuFFT (opened
 * with dlopen, cuda_api.h) as a driver table of the shared GPU runtime
 * (backends/gpurt/gpurt.h), the probe, and the backend's identity.  All the
 * machinery (pool, staging, retirement, plans, worker, teardown, tuning)
 * lives in backends/gpurt/; each entry point here is one call of the
 * dlopen'd function it names.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "dspk/errors.h"
#include "proto/utf8.h"

#define CU dspk__cu
#define NV dspk__nvrtc
#define BL dspk__cublas
#define FF dspk__cufft

/* ---- results ------------------------------------------------------------- */

static int classify(int r) {
  switch ((CUresult)r) {
  case CUDA_SUCCESS:
    return DSPK__G_OK;
  case CUDA_ERROR_NOT_READY:
    return DSPK__G_NOT_READY;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return DSPK__G_OOM;
  case CUDA_ERROR_NOT_FOUND:
    return DSPK__G_NOT_FOUND;
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_ASSERT:
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_CONTEXT_IS_DESTROYED:
  case CUDA_ERROR_ECC_UNCORRECTABLE:
  case CUDA_ERROR_UNKNOWN:
    return DSPK__G_STICKY;
  default:
    return DSPK__G_OTHER;
  }
}

static void errname(int r, const char **name, const char **text) {
  if (CU.cuGetErrorName)
    CU.cuGetErrorName((CUresult)r, name);
  if (CU.cuGetErrorString)
    CU.cuGetErrorString((CUresult)r, text);
}

/* ---- the driver API -------------------------------------------------------- */

static int ctx_open(int ordinal, void **ctx, dspk__gstream *stream) {
  CUdevice d;
  CUcontext c;
  CUstream s;
  CUresult r;
  if ((r = CU.cuDeviceGet(&d, ordinal)) || (r = CU.cuDevicePrimaryCtxRetain(&c, d)))
    return (int)r;
  if ((r = CU.cuCtxSetCurrent(c)) || (r = CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING))) {
    CU.cuDevicePrimaryCtxRelease(d);
    return (int)r;
  }
  *ctx = c;
  *stream = s;
  return 0;
}

static void ctx_close(int ordinal, void *ctx, dspk__gstream stream, int dead) {
  CUdevice d;
  (void)ctx;
  if (stream && !dead)
    CU.cuStreamDestroy((CUstream)stream);
  if (CU.cuDeviceGet(&d, ordinal) != CUDA_SUCCESS)
    return;
  CU.cuDevicePrimaryCtxRelease(d);
  if (dead)
    CU.cuDevicePrimaryCtxReset(d);
}

static int event_create(dspk__gevent *ev) {
  return (int)CU.cuEventCreate((CUevent *)ev, CU_EVENT_DISABLE_TIMING);
}
static int event_destroy(dspk__gevent ev) { return (int)CU.cuEventDestroy((CUevent)ev); }
static int event_record(dspk__gevent ev, dspk__gstream s) {
  return (int)CU.cuEventRecord((CUevent)ev, (CUstream)s);
}
static int event_query(dspk__gevent ev) { return (int)CU.cuEventQuery((CUevent)ev); }
static int event_sync(dspk__gevent ev) { return (int)CU.cuEventSynchronize((CUevent)ev); }
static int stream_sync(dspk__gstream s) { return (int)CU.cuStreamSynchronize((CUstream)s); }
static int stream_query(dspk__gstream s) { return (int)CU.cuStreamQuery((CUstream)s); }
static int mem_alloc(dspk__gptr *p, size_t n) {
  CUdeviceptr d = 0;
  CUresult r = CU.cuMemAlloc(&d, n);
  *p = (dspk__gptr)d;
  return (int)r;
}
static int mem_free(dspk__gptr p) { return (int)CU.cuMemFree((CUdeviceptr)p); }
static int host_alloc(void **p, size_t n) { return (int)CU.cuMemHostAlloc(p, n, 0); }
static int host_free(void *p) { return (int)CU.cuMemFreeHost(p); }
static int host_register(void *p, size_t n) { return (int)CU.cuMemHostRegister(p, n, 0); }
static int host_unregister(void *p) { return (int)CU.cuMemHostUnregister(p); }
static int htod_async(dspk__gptr dst, const void *src, size_t n, dspk__gstream s) {
  return (int)CU.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, (CUstream)s);
}
static int dtoh_async(void *dst, dspk__gptr src, size_t n, dspk__gstream s) {
  return (int)CU.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, (CUstream)s);
}
static int memset_async(dspk__gptr dst, unsigned char v, size_t n, dspk__gstream s) {
  return (int)CU.cuMemsetD8Async((CUdeviceptr)dst, v, n, (CUstream)s);
}
static int htod(dspk__gptr dst, const void *src, size_t n) {
  return (int)CU.cuMemcpyHtoD((CUdeviceptr)dst, src, n);
}
static int dtoh(void *dst, dspk__gptr src, size_t n) {
  return (int)CU.cuMemcpyDtoH(dst, (CUdeviceptr)src, n);
}
static int module_load(dspk__gmodule *m, const void *image) {
  return (int)CU.cuModuleLoadData((CUmodule *)m, image);
}
static int module_unload(dspk__gmodule m) { return (int)CU.cuModuleUnload((CUmodule)m); }
static int module_func(dspk__gfunc *f, dspk__gmodule m, const char *name) {
  return (int)CU.cuModuleGetFunction((CUfunction *)f, (CUmodule)m, name);
}
static int launch(dspk__gfunc f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                  unsigned by, unsigned bz, unsigned shmem, dspk__gstream s, void **args) {
  return (int)CU.cuLaunchKernel((CUfunction)f, gx, gy, gz, bx, by, bz, shmem, (CUstream)s,
                                args, NULL);
}
static int func_set_shared(dspk__gfunc f, int bytes) {
  return (int)CU.cuFuncSetAttribute((CUfunction)f,
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}
static int ipc_get(unsigned char handle[64], dspk__gptr p) {
  CUipcMemHandle h;
  CUresult r = CU.cuIpcGetMemHandle(&h, (CUdeviceptr)p);
  _Static_assert(sizeof(h) == 64, "CUipcMemHandle is 64 bytes");
  memcpy(handle, &h, sizeof(h));
  return (int)r;
}
static int ipc_open(dspk__gptr *p, const unsigned char handle[64]) {
  CUipcMemHandle h;
  CUdeviceptr d = 0;
  CUresult r;
  memcpy(&h, handle, sizeof(h));
  r = CU.cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  *p = (dspk__gptr)d;
  return (int)r;
}
static int ipc_close(dspk__gptr p) { return (int)CU.cuIpcCloseMemHandle((CUdeviceptr)p); }

/* ---- NVRTC ----------------------------------------------------------------- */

static void rtc_version(char *out, size_t len) {
  snprintf(out, len, "%d.%d", NV.major, NV.minor);
}

static void rtc_opts(const char *arch, char *out, size_t len) {
  snprintf(out, len, "--gpu-architecture=%s --std=c++14", arch);
}

static int rtc_compile(const char *arch, const char *name, const char *text, void **out,
                       size_t *outlen, char *log, size_t loglen) {
  char opt_arch[64];
  const char *opts[2];
  nvrtcProgram prog = NULL;
  nvrtcResult r;
  size_t n = 0;
  void *bin = NULL;
  int rc;
  snprintf(opt_arch, sizeof(opt_arch), "--gpu-architecture=%s", arch);
  opts[0] = opt_arch;
  opts[1] = "--std=c++14";
  if ((r = NV.nvrtcCreateProgram(&prog, text, name, 0, NULL, NULL)) != NVRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcCreateProgram: %s", NV.nvrtcGetErrorString(r));
    return r == NVRTC_ERROR_OUT_OF_MEMORY ? DSPK_ENOMEM : DSPK_ECOMPILE;
  }
  r = NV.nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t ls = 0;
    if (log && loglen) {
      int k = snprintf(log, loglen, "NVRTC (%s) failed to compile %s: ", arch, name);
      if (k > 0 && (size_t)k < loglen && NV.nvrtcGetProgramLogSize(prog, &ls) == NVRTC_SUCCESS) {
        char *full = malloc(ls + 1);
        if (full && NV.nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS) {
          full[ls] = 0;
          dspk__format(log + k, loglen - (size_t)k, "%s", full);
        }
        free(full);
      }
    }
    rc = DSPK_ECOMPILE;
    goto out;
  }
  if ((r = NV.nvrtcGetCUBINSize(prog, &n)) != NVRTC_SUCCESS || n == 0) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcGetCUBINSize: %s", NV.nvrtcGetErrorString(r));
    rc = DSPK_ECOMPILE;
    goto out;
  }
  bin = malloc(n);
  if (!bin) {
    rc = DSPK_ENOMEM;
    goto out;
  }
  if ((r = NV.nvrtcGetCUBIN(prog, bin)) != NVRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcGetCUBIN: %s", NV.nvrtcGetErrorString(r));
    free(bin);
    rc = DSPK_ECOMPILE;
    goto out;
  }
  *out = bin;
  *outlen = n;
  rc = 0;
out:
  NV.nvrtcDestroyProgram(&prog);
  return rc;
}

/* ---- cuBLAS ---------------------------------------------------------------- */

static const char *blas_name(void) { return BL.lib ? "cuBLAS" : NULL; }

static int blas_open(void **h, dspk__gstream s, dspk__gptr ws, size_t wsn) {
  cublasHandle_t b;
  if (BL.cublasCreate(&b) != CUBLAS_STATUS_SUCCESS)
    return -1;
  BL.cublasSetStream(b, (cudaStream_t)s);
  if (ws)
    BL.cublasSetWorkspace(b, (void *)(uintptr_t)ws, wsn);
  *h = b;
  return 0;
}

static void blas_close(void *h) {
  BL.cublasSetWorkspace(h, NULL, 0);
  BL.cublasDestroy(h);
}

static int blas_gemm(void *h, dspk_dtype dt, int tx, int ty, int m, int n, int k, double alpha,
                     dspk__gptr X, int ldx, int64_t sx, dspk__gptr Y, int ldy, int64_t sy,
                     double beta, dspk__gptr C, int ldc, int64_t sc, int nb) {
  cublasHandle_t b = h;
  cublasOperation_t ox = tx ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t oy = ty ? CUBLAS_OP_T : CUBLAS_OP_N;
  void *px = (void *)(uintptr_t)X, *py = (void *)(uintptr_t)Y, *pc = (void *)(uintptr_t)C;
  switch (dt) {
  case DSPK_F32: {
    float a = (float)alpha, be = (float)beta;
    return nb == 1 ? (int)BL.cublasSgemm(b, ox, oy, m, n, k, &a, px, ldx, py, ldy, &be, pc, ldc)
                   : (int)BL.cublasSgemmStridedBatched(b, ox, oy, m, n, k, &a, px, ldx, sx, py,
                                                       ldy, sy, &be, pc, ldc, sc, nb);
  }
  case DSPK_F64:
    return nb == 1 ? (int)BL.cublasDgemm(b, ox, oy, m, n, k, &alpha, px, ldx, py, ldy, &beta,
                                         pc, ldc)
                   : (int)BL.cublasDgemmStridedBatched(b, ox, oy, m, n, k, &alpha, px, ldx, sx,
                                                       py, ldy, sy, &beta, pc, ldc, sc, nb);
  case DSPK_C64: {
    cuComplex a = {(float)alpha, 0}, be = {(float)beta, 0};
    return (int)BL.cublasCgemmStridedBatched(b, ox, oy, m, n, k, &a, px, ldx, sx, py, ldy, sy,
                                             &be, pc, ldc, sc, nb);
  }
  case DSPK_C128: {
    cuDoubleComplex a = {alpha, 0}, be = {beta, 0};
    return (int)BL.cublasZgemmStridedBatched(b, ox, oy, m, n, k, &a, px, ldx, sx, py, ldy, sy,
                                             &be, pc, ldc, sc, nb);
  }
  case DSPK_F16:
  case DSPK_BF16: {
    float a = (float)alpha, be = (float)beta;
    cudaDataType_t in = dt == DSPK_F16 ? CUDA_R_16F : CUDA_R_16BF;
    return nb == 1
               ? (int)BL.cublasGemmEx(b, ox, oy, m, n, k, &a, px, in, ldx, py, in, ldy, &be, pc,
                                      CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
               : (int)BL.cublasGemmStridedBatchedEx(b, ox, oy, m, n, k, &a, px, in, ldx, sx, py,
                                                    in, ldy, sy, &be, pc, CUDA_R_32F, ldc, sc,
                                                    nb, CUBLAS_COMPUTE_32F,
                                                    CUBLAS_GEMM_DEFAULT);
  }
  default:
    return -1;
  }
}

/* ---- cuFFT ------------------------------------------------------------------ */

static const char *fft_name(void) { return FF.lib ? "cuFFT" : NULL; }

static const cufftType fft_types[] = {CUFFT_C2C, CUFFT_Z2Z, CUFFT_R2C,
                                      CUFFT_D2Z, CUFFT_C2R, CUFFT_Z2D};

static int fft_plan(void **plan, enum dspk__gfft kind, long long n, long long batch,
                    long long nout, size_t *ws, dspk__gstream s, int *oom) {
  cufftHandle h;
  cufftResult r;
  long long nn = n;
  /* A C2R or Z2D transform reads rows of n/2+1 complex values. */
  long long idist = kind == DSPK__GFFT_C2R || kind == DSPK__GFFT_Z2D ? n / 2 + 1 : n;
  if ((r = FF.cufftCreate(&h)) != CUFFT_SUCCESS)
    return (int)r;
  FF.cufftSetAutoAllocation(h, 0);
  r = FF.cufftMakePlanMany64(h, 1, &nn, NULL, 1, idist, NULL, 1, nout, fft_types[kind], batch, ws);
  if (r != CUFFT_SUCCESS) {
    *oom = r == CUFFT_ALLOC_FAILED;
    FF.cufftDestroy(h);
    return (int)r;
  }
  FF.cufftSetStream(h, (cudaStream_t)s);
  *plan = (void *)(uintptr_t)h;
  return 0;
}

static int fft_set_work(void *plan, dspk__gptr ws) {
  return (int)FF.cufftSetWorkArea((cufftHandle)(uintptr_t)plan, (void *)(uintptr_t)ws);
}

static int fft_exec(void *plan, enum dspk__gfft kind, dspk__gptr in, dspk__gptr out,
                    int inverse) {
  cufftHandle h = (cufftHandle)(uintptr_t)plan;
  void *i = (void *)(uintptr_t)in, *o = (void *)(uintptr_t)out;
  switch (kind) {
  case DSPK__GFFT_C2C: return (int)FF.cufftExecC2C(h, i, o, inverse ? CUFFT_INVERSE : CUFFT_FORWARD);
  case DSPK__GFFT_Z2Z: return (int)FF.cufftExecZ2Z(h, i, o, inverse ? CUFFT_INVERSE : CUFFT_FORWARD);
  case DSPK__GFFT_R2C: return (int)FF.cufftExecR2C(h, i, o);
  case DSPK__GFFT_D2Z: return (int)FF.cufftExecD2Z(h, i, o);
  case DSPK__GFFT_C2R: return (int)FF.cufftExecC2R(h, i, o);
  default: return (int)FF.cufftExecZ2D(h, i, o);
  }
}

static void fft_destroy(void *plan) { FF.cufftDestroy((cufftHandle)(uintptr_t)plan); }

/* ---- probe --------------------------------------------------------------------- */

/* The kernel module's version from /proc ("580.95.05"), or "". */
static void nvidia_version(char *out, size_t len) {
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  char line[256];
  out[0] = 0;
  if (!f)
    return;
  /* "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
   * Release Build ...": the first token after "Module" that starts with a
   * digit. */
  if (fgets(line, sizeof(line), f)) {
    char *p = strstr(line, "Module");
    char *save = NULL, *tok;
    if (p) {
      for (tok = strtok_r(p, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
        if (tok[0] >= '0' && tok[0] <= '9') {
          snprintf(out, len, "%s", tok);
          break;
        }
    }
  }
  fclose(f);
}

static int probe(struct dspk__gpurt_state *g, char *why, size_t whylen) {
  CUresult r;
  int n = 0, drv = 0;
  char kmod[32], driver_ver[32];
  if (dspk__cuda_load_driver(why, whylen) != 0)
    return 0;
  r = CU.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    CU.cuGetErrorName(r, &name);
    if (r == CUDA_ERROR_NO_DEVICE)
      snprintf(why, whylen, "no CUDA device (cuInit: %s)", name);
    else if (r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH || r == (CUresult)35 /* INSUFFICIENT_DRIVER */ ||
             r == CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER ||
             r == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
      snprintf(why, whylen, "driver too old for this CUDA (cuInit: %s)", name);
    else
      snprintf(why, whylen, "cuInit failed: %s", name);
    return 0;
  }
  CU.cuDriverGetVersion(&drv);
  if (drv < 11040) {
    snprintf(why, whylen, "driver too old: CUDA %d.%d, needs 11.4 or newer",
             drv / 1000, drv % 1000 / 10);
    return 0;
  }
  if (CU.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
    snprintf(why, whylen, "no CUDA device");
    return 0;
  }
  nvidia_version(kmod, sizeof(kmod));
  snprintf(driver_ver, sizeof(driver_ver), "%d.%d", drv / 1000, drv % 1000 / 10);
  if (n > DSPK__GPURT_MAX_DEVICES)
    n = DSPK__GPURT_MAX_DEVICES;
  for (int i = 0; i < n; i++) {
    struct dspk__devinfo *d = &g->info[i];
    int maj = 0, min = 0;
    size_t mem = 0;
    CUdevice dev = 0;
    CUuuid u;
    memset(d, 0, sizeof(*d));
    CU.cuDeviceGet(&dev, i);
    g->ordinal[i] = i;
    CU.cuDeviceGetName(d->name, sizeof(d->name), dev);
    CU.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    CU.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    CU.cuDeviceGetAttribute(&g->sms[i], CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    CU.cuDeviceTotalMem(&mem, dev);
    snprintf(d->type, sizeof(d->type), "discrete");
    snprintf(d->arch, sizeof(d->arch), "sm_%d%d", maj, min);
    if (kmod[0])
      snprintf(d->driver, sizeof(d->driver), "%.24s (CUDA %.24s)", kmod, driver_ver);
    else
      snprintf(d->driver, sizeof(d->driver), "CUDA %.24s", driver_ver);
    if (CU.cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS)
      dspk__gpurt_uuid(u.bytes, d->uuid, sizeof(d->uuid));
    d->memory = mem;
  }
  /* The toolkit libraries are optional: ops that need a missing one fail
   * with ENOTSUP and the library's name.  Loading them here, once, keeps
   * their start-up cost out of every task. */
  dspk__cuda_load_nvrtc(NULL, 0);
  dspk__cuda_load_cublas(NULL, 0);
  dspk__cuda_load_cufft(NULL, 0);
  return n;
}

static int load(char *why, size_t whylen) {
  int rc = dspk__cuda_load_driver(why, whylen);
  if (rc == 0 && CU.cuInit(0) != CUDA_SUCCESS) {
    snprintf(why, whylen, "cuInit failed");
    rc = DSPK_ENODEV;
  }
  return rc;
}

static struct dspk__gpurt_state cuda_state;

const struct dspk__gpurt_driver dspk__gpurt_cuda = {
    .name = "cuda",
    .lang = "cuda",
    .lang_desc = "CUDA C",
    .compiler = "nvrtc",
    .env = "DSPK_CUDA",
    .worker = "dspk-cuda-worker",
#ifdef DSPK_CUDA_WORKER_BUILD
    .worker_build = DSPK_CUDA_WORKER_BUILD,
#endif
#ifdef DSPK_CUDA_WORKER_INSTALL
    .worker_install = DSPK_CUDA_WORKER_INSTALL,
#endif
    .st = &cuda_state,
    /* cublasSgemm of 64..456 x 256 x 256 f32: 12-17 us of host work (two
     * launches) for 8.4 us on the H200's device; the tiled kernel: one
     * launch (docs/performance.md, small contractions). */
    .gemm_small = DSPK__GPURT_GEMM_SMALL,
    .unload = dspk__cuda_unload,
    .func_set_shared = func_set_shared,
    .rtc_load = dspk__cuda_load_nvrtc,
    DSPK__GPURT_DRIVER_ENTRIES,
    DSPK__GPURT_DRIVER_LIBS,
};
