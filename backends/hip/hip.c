/*
 * The HIP backend's driver table for the shared GPU runtime
 * (backends/gpurt/gpurt.h): the HIP runtime's module API, hiprtc,
 * hipBLAS/rocBLAS and hipFFT, all opened with dlopen (hip_api.h), and the
 * probe.  Each entry point is one call of the dlopen'd function it names.
 * HIP's runtime API keeps a current device per thread: ctx_open selects the
 * device on the calling thread, which is the device's runner thread (or the
 * worker process's only thread), the only one that touches it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/hip/hip_internal.h"
#include "dspk/errors.h"
#include "proto/utf8.h"

#define H dspk__hip
#define RTC dspk__hiprtc
#define BL dspk__hipblas
#define FF dspk__hipfft

/* ---- results ------------------------------------------------------------- */

static int classify(int r) {
  switch ((hipError_t)r) {
  case hipSuccess:
    return DSPK__G_OK;
  case hipErrorNotReady:
    return DSPK__G_NOT_READY;
  case hipErrorOutOfMemory:
    return DSPK__G_OOM;
  case hipErrorNotFound:
    return DSPK__G_NOT_FOUND;
  /* The errors after which HIP, like CUDA, keeps failing in this process:
   * a kernel's memory fault or abort takes the device's queues with it. */
  case hipErrorIllegalAddress:
  case hipErrorLaunchFailure:
  case hipErrorLaunchTimeOut:
  case hipErrorAssert:
  case hipErrorContextIsDestroyed:
  case hipErrorECCNotCorrectable:
  case hipErrorUnknown:
    return DSPK__G_STICKY;
  default:
    return DSPK__G_OTHER;
  }
}

static void errname(int r, const char **name, const char **text) {
  if (H.hipGetErrorName)
    *name = H.hipGetErrorName((hipError_t)r);
  if (H.hipGetErrorString)
    *text = H.hipGetErrorString((hipError_t)r);
}

/* ---- the runtime ------------------------------------------------------------ */

static int ctx_open(int ordinal, void **ctx, dspk__gstream *stream) {
  hipStream_t s;
  hipError_t r;
  if ((r = H.hipSetDevice(ordinal)) || (r = H.hipStreamCreateWithFlags(&s, hipStreamNonBlocking)))
    return (int)r;
  *ctx = NULL;
  *stream = s;
  return 0;
}

static void ctx_close(int ordinal, void *ctx, dspk__gstream stream, int dead) {
  hipError_t sel = H.hipSetDevice(ordinal);
  (void)ctx;
  /* After a sticky error the device's state in this process is dead (and
   * every call may fail, hipSetDevice included): the reset releases what
   * it held. */
  if (dead) {
    H.hipDeviceReset();
    return;
  }
  if (sel == hipSuccess && stream)
    H.hipStreamDestroy((hipStream_t)stream);
}

static int event_create(dspk__gevent *ev) {
  return (int)H.hipEventCreateWithFlags((hipEvent_t *)ev, hipEventDisableTiming);
}
static int event_destroy(dspk__gevent ev) { return (int)H.hipEventDestroy((hipEvent_t)ev); }
static int event_record(dspk__gevent ev, dspk__gstream s) {
  return (int)H.hipEventRecord((hipEvent_t)ev, (hipStream_t)s);
}
static int event_query(dspk__gevent ev) { return (int)H.hipEventQuery((hipEvent_t)ev); }
static int event_sync(dspk__gevent ev) { return (int)H.hipEventSynchronize((hipEvent_t)ev); }
static int stream_sync(dspk__gstream s) { return (int)H.hipStreamSynchronize((hipStream_t)s); }
static int stream_query(dspk__gstream s) { return (int)H.hipStreamQuery((hipStream_t)s); }
static int mem_alloc(dspk__gptr *p, size_t n) {
  void *d = NULL;
  hipError_t r = H.hipMalloc(&d, n);
  *p = (dspk__gptr)(uintptr_t)d;
  return (int)r;
}
static int mem_free(dspk__gptr p) { return (int)H.hipFree((void *)(uintptr_t)p); }
static int host_alloc(void **p, size_t n) { return (int)H.hipHostMalloc(p, n, hipHostMallocDefault); }
static int host_free(void *p) { return (int)H.hipHostFree(p); }
static int host_register(void *p, size_t n) {
  return (int)H.hipHostRegister(p, n, hipHostRegisterDefault);
}
static int host_unregister(void *p) { return (int)H.hipHostUnregister(p); }
static int htod_async(dspk__gptr dst, const void *src, size_t n, dspk__gstream s) {
  return (int)H.hipMemcpyHtoDAsync((hipDeviceptr_t)(uintptr_t)dst, (void *)(uintptr_t)src, n,
                                   (hipStream_t)s);
}
static int dtoh_async(void *dst, dspk__gptr src, size_t n, dspk__gstream s) {
  return (int)H.hipMemcpyDtoHAsync(dst, (hipDeviceptr_t)(uintptr_t)src, n, (hipStream_t)s);
}
static int memset_async(dspk__gptr dst, unsigned char v, size_t n, dspk__gstream s) {
  return (int)H.hipMemsetD8Async((hipDeviceptr_t)(uintptr_t)dst, v, n, (hipStream_t)s);
}
static int htod(dspk__gptr dst, const void *src, size_t n) {
  return (int)H.hipMemcpyHtoD((hipDeviceptr_t)(uintptr_t)dst, (void *)(uintptr_t)src, n);
}
static int dtoh(void *dst, dspk__gptr src, size_t n) {
  return (int)H.hipMemcpyDtoH(dst, (hipDeviceptr_t)(uintptr_t)src, n);
}
static int module_load(dspk__gmodule *m, const void *image) {
  return (int)H.hipModuleLoadData((hipModule_t *)m, image);
}
static int module_unload(dspk__gmodule m) { return (int)H.hipModuleUnload((hipModule_t)m); }
static int module_func(dspk__gfunc *f, dspk__gmodule m, const char *name) {
  return (int)H.hipModuleGetFunction((hipFunction_t *)f, (hipModule_t)m, name);
}
static int launch(dspk__gfunc f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                  unsigned by, unsigned bz, unsigned shmem, dspk__gstream s, void **args) {
  return (int)H.hipModuleLaunchKernel((hipFunction_t)f, gx, gy, gz, bx, by, bz, shmem,
                                      (hipStream_t)s, args, NULL);
}
static int ipc_get(unsigned char handle[64], dspk__gptr p) {
  hipIpcMemHandle_t h;
  hipError_t r = H.hipIpcGetMemHandle(&h, (void *)(uintptr_t)p);
  _Static_assert(sizeof(h) == 64, "hipIpcMemHandle_t is 64 bytes");
  memcpy(handle, &h, sizeof(h));
  return (int)r;
}
static int ipc_open(dspk__gptr *p, const unsigned char handle[64]) {
  hipIpcMemHandle_t h;
  void *d = NULL;
  hipError_t r;
  memcpy(&h, handle, sizeof(h));
  r = H.hipIpcOpenMemHandle(&d, h, hipIpcMemLazyEnablePeerAccess);
  *p = (dspk__gptr)(uintptr_t)d;
  return (int)r;
}
static int ipc_close(dspk__gptr p) { return (int)H.hipIpcCloseMemHandle((void *)(uintptr_t)p); }

/* ---- hiprtc ---------------------------------------------------------------- */

/* hiprtc's own version number says little (ROCm 5.2 reports 9.0): the
 * runtime's version goes with it into the kernel cache's key. */
static void rtc_version(char *out, size_t len) {
  int v = 0;
  if (H.hipRuntimeGetVersion)
    H.hipRuntimeGetVersion(&v);
  snprintf(out, len, "%d.%d/%d", RTC.major, RTC.minor, v);
}

static void rtc_opts(const char *arch, char *out, size_t len) {
  snprintf(out, len, "--offload-arch=%s", arch);
}

static int rtc_compile(const char *arch, const char *name, const char *text, void **out,
                       size_t *outlen, char *log, size_t loglen) {
  char opt[96];
  const char *opts[1];
  hiprtcProgram prog = NULL;
  hiprtcResult r;
  size_t n = 0;
  void *bin = NULL;
  int rc;
  rtc_opts(arch, opt, sizeof(opt));
  opts[0] = opt;
  if ((r = RTC.hiprtcCreateProgram(&prog, text, name, 0, NULL, NULL)) != HIPRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "hiprtcCreateProgram: %s", RTC.hiprtcGetErrorString(r));
    return r == HIPRTC_ERROR_OUT_OF_MEMORY ? DSPK_ENOMEM : DSPK_ECOMPILE;
  }
  r = RTC.hiprtcCompileProgram(prog, 1, opts);
  if (r != HIPRTC_SUCCESS) {
    size_t ls = 0;
    if (log && loglen) {
      int k = snprintf(log, loglen, "hiprtc (%s) failed to compile %s: ", arch, name);
      if (k > 0 && (size_t)k < loglen &&
          RTC.hiprtcGetProgramLogSize(prog, &ls) == HIPRTC_SUCCESS) {
        char *full = malloc(ls + 1);
        if (full && RTC.hiprtcGetProgramLog(prog, full) == HIPRTC_SUCCESS) {
          full[ls] = 0;
          dspk__format(log + k, loglen - (size_t)k, "%s", full);
        }
        free(full);
      }
    }
    rc = DSPK_ECOMPILE;
    goto out;
  }
  if ((r = RTC.hiprtcGetCodeSize(prog, &n)) != HIPRTC_SUCCESS || n == 0) {
    if (log && loglen)
      snprintf(log, loglen, "hiprtcGetCodeSize: %s", RTC.hiprtcGetErrorString(r));
    rc = DSPK_ECOMPILE;
    goto out;
  }
  if (!(bin = malloc(n))) {
    rc = DSPK_ENOMEM;
    goto out;
  }
  if ((r = RTC.hiprtcGetCode(prog, bin)) != HIPRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "hiprtcGetCode: %s", RTC.hiprtcGetErrorString(r));
    free(bin);
    rc = DSPK_ECOMPILE;
    goto out;
  }
  *out = bin;
  *outlen = n;
  rc = 0;
out:
  RTC.hiprtcDestroyProgram(&prog);
  return rc;
}

/* ---- hipBLAS / rocBLAS ------------------------------------------------------- */

static const char *blas_name(void) { return BL.lib ? BL.name : NULL; }

static int blas_open(void **h, dspk__gstream s, dspk__gptr ws, size_t wsn) {
  void *b = NULL;
  (void)ws; /* both libraries manage their own workspace */
  (void)wsn;
  if (BL.create(&b) != 0)
    return -1;
  BL.set_stream(b, (hipStream_t)s);
  *h = b;
  return 0;
}

static void blas_close(void *h) { BL.destroy(h); }

static int blas_gemm(void *h, dspk_dtype dt, int tx, int ty, int m, int n, int k, double alpha,
                     dspk__gptr X, int ldx, int64_t sx, dspk__gptr Y, int ldy, int64_t sy,
                     double beta, dspk__gptr C, int ldc, int64_t sc, int nb) {
  int ox = tx ? 112 : 111, oy = ty ? 112 : 111; /* N, T in both libraries */
  const void *px = (const void *)(uintptr_t)X, *py = (const void *)(uintptr_t)Y;
  void *pc = (void *)(uintptr_t)C;
  switch (dt) {
  case DSPK_F32: {
    float a = (float)alpha, be = (float)beta;
    return nb == 1 ? BL.sgemm(h, ox, oy, m, n, k, &a, px, ldx, py, ldy, &be, pc, ldc)
                   : BL.sgemm_sb(h, ox, oy, m, n, k, &a, px, ldx, sx, py, ldy, sy, &be, pc,
                                 ldc, sc, nb);
  }
  case DSPK_F64:
    return nb == 1 ? BL.dgemm(h, ox, oy, m, n, k, &alpha, px, ldx, py, ldy, &beta, pc, ldc)
                   : BL.dgemm_sb(h, ox, oy, m, n, k, &alpha, px, ldx, sx, py, ldy, sy, &beta,
                                 pc, ldc, sc, nb);
  case DSPK_C64: {
    float a[2] = {(float)alpha, 0}, be[2] = {(float)beta, 0};
    return BL.cgemm_sb(h, ox, oy, m, n, k, a, px, ldx, sx, py, ldy, sy, be, pc, ldc, sc, nb);
  }
  case DSPK_C128: {
    double a[2] = {alpha, 0}, be[2] = {beta, 0};
    return BL.zgemm_sb(h, ox, oy, m, n, k, a, px, ldx, sx, py, ldy, sy, be, pc, ldc, sc, nb);
  }
  default:
    return -1; /* f16/bf16: not through this table yet */
  }
}

/* ---- hipFFT ------------------------------------------------------------------- */

static const char *fft_name(void) { return FF.lib ? "hipFFT" : NULL; }

/* hipfftType values (cuFFT's): C2C, Z2Z, R2C, D2Z, C2R, Z2D. */
static const int fft_types[] = {0x29, 0x69, 0x2a, 0x6a, 0x2c, 0x6c};

static int fft_plan(void **plan, enum dspk__gfft kind, long long n, long long batch,
                    long long nout, size_t *ws, dspk__gstream s, int *oom) {
  void *h = NULL;
  long long nn = n;
  /* A C2R or Z2D transform reads rows of n/2+1 complex values. */
  long long idist = kind == DSPK__GFFT_C2R || kind == DSPK__GFFT_Z2D ? n / 2 + 1 : n;
  int r;
  if ((r = FF.create(&h)) != 0)
    return r;
  FF.set_auto_allocation(h, 0);
  r = FF.make_plan_many64(h, 1, &nn, NULL, 1, idist, NULL, 1, nout, fft_types[kind], batch, ws);
  if (r != 0) {
    *oom = r == 2; /* HIPFFT_ALLOC_FAILED */
    FF.destroy(h);
    return r;
  }
  FF.set_stream(h, (hipStream_t)s);
  *plan = h;
  return 0;
}

static int fft_set_work(void *plan, dspk__gptr ws) {
  return FF.set_work_area(plan, (void *)(uintptr_t)ws);
}

static int fft_exec(void *plan, enum dspk__gfft kind, dspk__gptr in, dspk__gptr out,
                    int inverse) {
  void *i = (void *)(uintptr_t)in, *o = (void *)(uintptr_t)out;
  int dir = inverse ? 1 : -1; /* HIPFFT_BACKWARD, HIPFFT_FORWARD */
  switch (kind) {
  case DSPK__GFFT_C2C: return FF.exec_c2c(plan, i, o, dir);
  case DSPK__GFFT_Z2Z: return FF.exec_z2z(plan, i, o, dir);
  case DSPK__GFFT_R2C: return FF.exec_r2c(plan, i, o);
  case DSPK__GFFT_D2Z: return FF.exec_d2z(plan, i, o);
  case DSPK__GFFT_C2R: return FF.exec_c2r(plan, i, o);
  default: return FF.exec_z2d(plan, i, o);
  }
}

static void fft_destroy(void *plan) { FF.destroy(plan); }

/* ---- probe --------------------------------------------------------------------- */

/* The device's gfx target ("gfx90a:sramecc+:xnack-").  hipDeviceProp_t's
 * layout differs between ROCm releases (ROCm 6 added fields before
 * gcnArchName), so the properties are read into a generous zeroed buffer
 * and the target found by its "gfx" prefix. */
static void gfx_arch(int ordinal, char *out, size_t len) {
  size_t cap = 1 << 16;
  unsigned char *buf = calloc(1, cap);
  snprintf(out, len, "gfx");
  if (!buf)
    return;
  if (H.hipGetDeviceProperties((hipDeviceProp_t *)(void *)buf, ordinal) == hipSuccess) {
    for (size_t i = 0; i + 4 < cap; i++)
      if (buf[i] == 'g' && buf[i + 1] == 'f' && buf[i + 2] == 'x' && buf[i + 3] >= '0' &&
          buf[i + 3] <= '9' && (i == 0 || buf[i - 1] == 0)) {
        size_t k = 0;
        while (k + 1 < len && i + k < cap && buf[i + k] > ' ' && buf[i + k] < 127) {
          out[k] = (char)buf[i + k];
          k++;
        }
        out[k] = 0;
        break;
      }
  }
  free(buf);
}

static int probe(struct dspk__gpurt_state *g, char *why, size_t whylen) {
  hipError_t r;
  int n = 0, ver = 0;
  char drv[32];
  if (dspk__hip_load_runtime(why, whylen) != 0)
    return 0;
  r = H.hipInit(0);
  if (r == hipSuccess)
    r = H.hipGetDeviceCount(&n);
  if (r != hipSuccess || n <= 0) {
    const char *name = H.hipGetErrorName(r);
    if (access("/dev/kfd", F_OK) != 0)
      snprintf(why, whylen, "no AMD GPU: /dev/kfd is absent (no amdgpu kernel driver; %s)",
               name ? name : "no device");
    else if (r == hipErrorNoDevice || n <= 0)
      snprintf(why, whylen, "no AMD GPU (hipGetDeviceCount: %s)", name ? name : "0 devices");
    else if (r == hipErrorInsufficientDriver)
      snprintf(why, whylen, "amdgpu driver too old for this HIP runtime (%s)", name);
    else
      snprintf(why, whylen, "hipInit failed: %s", name ? name : "?");
    return 0;
  }
  H.hipDriverGetVersion(&ver);
  /* HIP_VERSION: major * 10^7 + minor * 10^5 + patch. */
  snprintf(drv, sizeof(drv), "%d.%d.%d", ver / 10000000, ver / 100000 % 100, ver % 100000);
  /* The optional libraries, once, at probe: their load time stays out of
   * tasks, and the driver string says which paths gemm and fft take. */
  dspk__hip_load_hiprtc(NULL, 0);
  dspk__hip_load_blas(NULL, 0);
  dspk__hip_load_fft(NULL, 0);
  if (n > DSPK__GPURT_MAX_DEVICES)
    n = DSPK__GPURT_MAX_DEVICES;
  for (int i = 0; i < n; i++) {
    struct dspk__devinfo *d = &g->info[i];
    size_t mem = 0;
    hipUUID u;
    int integrated = 0;
    memset(d, 0, sizeof(*d));
    g->ordinal[i] = i;
    H.hipDeviceGetName(d->name, (int)sizeof(d->name), i);
    H.hipDeviceTotalMem(&mem, i);
    H.hipDeviceGetAttribute(&g->sms[i], hipDeviceAttributeMultiprocessorCount, i);
    H.hipDeviceGetAttribute(&integrated, hipDeviceAttributeIntegrated, i);
    snprintf(d->type, sizeof(d->type), "%s", integrated ? "integrated" : "discrete");
    gfx_arch(i, d->arch, sizeof(d->arch));
    snprintf(d->driver, sizeof(d->driver), "HIP %.20s; gemm %s, fft %s", drv,
             BL.lib ? BL.name : "own", FF.lib ? "hipFFT" : "own");
    memset(&u, 0, sizeof(u));
    if (H.hipDeviceGetUuid(&u, i) == hipSuccess)
      dspk__gpurt_uuid(u.bytes, d->uuid, sizeof(d->uuid));
    d->memory = mem;
  }
  return n;
}

static int load(char *why, size_t whylen) {
  int rc = dspk__hip_load_runtime(why, whylen);
  if (rc == 0 && H.hipInit(0) != hipSuccess) {
    snprintf(why, whylen, "hipInit failed");
    rc = DSPK_ENODEV;
  }
  return rc;
}

static struct dspk__gpurt_state hip_state;

static const char *const renames[] = {
    "cuMemAlloc", "hipMalloc", "cuMemFree", "hipFree", "cuMemHostAlloc", "hipHostMalloc",
    "cuLaunchKernel", "hipModuleLaunchKernel", "cuMemHostRegister", "hipHostRegister", "cuDevicePrimaryCtxRetain", "hipSetDevice",
    NULL};

const struct dspk__gpurt_driver dspk__gpurt_hip = {
    .name = "hip",
    .lang = "hip",
    .lang_desc = "HIP C++",
    .compiler = "hiprtc",
    .env = "DSPK_HIP",
    .worker = "dspk-hip-worker",
#ifdef DSPK_HIP_WORKER_BUILD
    .worker_build = DSPK_HIP_WORKER_BUILD,
#endif
#ifdef DSPK_HIP_WORKER_INSTALL
    .worker_install = DSPK_HIP_WORKER_INSTALL,
#endif
    .st = &hip_state,
    .api_prefix = "hip",
    .api_renames = renames,
    .unload = dspk__hip_unload,
    .func_set_shared = NULL, /* AMD GPUs offer their full LDS without opting in */
    .rtc_load = dspk__hip_load_hiprtc,
    DSPK__GPURT_DRIVER_ENTRIES,
    DSPK__GPURT_DRIVER_LIBS,
};
