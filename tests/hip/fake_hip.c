/*
 * A fake HIP runtime for CI (no AMD GPU anywhere): a shared library with
 * the entry points the HIP driver table uses (backends/hip/hip_api.h),
 * declared by ROCm's own headers so the ABI is the real one, plus hiprtc,
 * hipBLAS and hipFFT.  "Device memory" is host memory.  The stream really
 * is asynchronous, as in the fake CUDA driver of tests/cuda/test_cuda_stage.c:
 * copies to or from pinned memory, memsets and event records queue up and
 * run only when something waits (an event or stream synchronize), reading
 * their source then; a copy from or to pageable memory drains the queue
 * and runs at once.  BLAS and FFT calls drain the queue, then compute on
 * the host (column-major gemm, direct DFT), so results are checkable.
 * hiprtc "compiles" a source into a code object that is the source itself;
 * launches run nothing, except the raw kernels "fake_fill" (float *x, int
 * n, float v: x[i] = v) and "fake_fault" (an illegal address, after which
 * every call of this process fails, as HIP's sticky errors do).
 * fakehip_inject() makes the next launch fault the same way.  IPC handles
 * are refused, so raw-kernel tensors travel by copy to the worker (which
 * loads this library too).  fakehip_live() counts what is still allocated,
 * for the teardown checks.
 *
 * Environment: FAKE_HIP_DEVICES (default 1; 0: hipErrorNoDevice).
 *
 * The fake is thread-safe as HIP is: every entry point holds one process-wide
 * lock (GUARD), since the daemon's runners, one per device, call it at once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#define EXPORT __attribute__((visibility("default")))

/* One lock for all the fake's state, held until the entry point returns
 * (recursive: entry points call each other). */
static pthread_mutex_t big = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void unguard(int *unused) {
  (void)unused;
  pthread_mutex_unlock(&big);
}
#define GUARD()                                                                \
  __attribute__((cleanup(unguard))) int guard_ = pthread_mutex_lock(&big)

struct ihipStream_t { int id; };
struct ihipEvent_t { uint64_t target; };
struct ihipModule_t { char *code; };
struct ihipModuleSymbol_t { char name[64]; struct ihipModule_t *mod; };
struct _hiprtcProgram { char *src, *log; };

/* What is alive (fakehip_live). */
struct fakehip_live {
  long dev_allocs, host_allocs, events, streams, modules, blas, plans, resets, launches,
      dead;
};
static struct fakehip_live live;
static int dead, inject;

EXPORT void fakehip_live(struct fakehip_live *out) {
  GUARD();
  *out = live;
  out->dead = dead;
}
/* 1: the next launch faults; -1: a fresh "process" (the fault forgotten). */
EXPORT void fakehip_inject(int on) {
  GUARD();
  if (on < 0)
    dead = inject = 0;
  else
    inject = on;
}

/* ---- the queue ------------------------------------------------------------- */

enum { OP_COPY, OP_SET, OP_MARK };
struct fop {
  int kind;
  void *dst;
  const void *src;
  size_t n;
  int v;
};
#define QMAX 65536
static struct fop queue[QMAX];
static uint64_t queued, executed;

static void run_until(uint64_t seq) {
  while (executed < seq) {
    struct fop *o = &queue[executed % QMAX];
    if (o->kind == OP_COPY)
      memcpy(o->dst, o->src, o->n);
    else if (o->kind == OP_SET)
      memset(o->dst, o->v, o->n);
    executed++;
  }
}

static void enqueue(int kind, void *dst, const void *src, size_t n, int v) {
  if (queued - executed >= QMAX)
    run_until(queued);
  queue[queued % QMAX] = (struct fop){kind, dst, src, n, v};
  queued++;
}

static struct { void *p; size_t n; } pinned[256];
static int npinned;

static int is_pinned(const void *p, size_t n) {
  for (int i = 0; i < npinned; i++)
    if ((const char *)p >= (char *)pinned[i].p &&
        (const char *)p + n <= (char *)pinned[i].p + pinned[i].n)
      return 1;
  return 0;
}

/* Everything the fake handed out that hipDeviceReset reclaims, as a real
 * reset does with a dead device's memory, queues and modules. */
enum { R_DEV, R_STREAM, R_EVENT, R_MODULE };
static struct { void *p; int kind; } reg[65536];
static int nreg;
static void reg_add(void *p, int kind) {
  if (nreg < 65536)
    reg[nreg++] = (__typeof__(reg[0])){p, kind};
}
static void reg_del(void *p) {
  for (int i = nreg - 1; i >= 0; i--)
    if (reg[i].p == p) {
      reg[i] = reg[--nreg];
      return;
    }
}

#define ALIVE()                                                                \
  do {                                                                         \
    if (dead)                                                                  \
      return hipErrorIllegalAddress;                                           \
  } while (0)

/* ---- devices --------------------------------------------------------------- */

static int ndev(void) {
  const char *s = getenv("FAKE_HIP_DEVICES");
  return s && *s ? atoi(s) : 1;
}

EXPORT hipError_t hipInit(unsigned flags) {
  GUARD();
  (void)flags;
  return hipSuccess;
}
EXPORT hipError_t hipDriverGetVersion(int *v) {
  GUARD();
  *v = 60241134; /* 6.2.41134 */
  return hipSuccess;
}
EXPORT hipError_t hipRuntimeGetVersion(int *v) { return hipDriverGetVersion(v); }
EXPORT hipError_t hipGetDeviceCount(int *n) {
  GUARD();
  *n = ndev();
  return *n > 0 ? hipSuccess : hipErrorNoDevice;
}
EXPORT hipError_t hipDeviceGetName(char *name, int len, hipDevice_t d) {
  GUARD();
  snprintf(name, (size_t)len, "Fake AMD Instinct MI210 #%d", d);
  return hipSuccess;
}
EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t d) {
  GUARD();
  (void)d;
  *bytes = (size_t)64 << 30;
  return hipSuccess;
}
EXPORT hipError_t hipDeviceGetAttribute(int *pi, hipDeviceAttribute_t attr, int d) {
  GUARD();
  (void)d;
  *pi = attr == hipDeviceAttributeMultiprocessorCount ? 104 : 0;
  return hipSuccess;
}
EXPORT hipError_t hipGetDeviceProperties(hipDeviceProp_t *p, int d) {
  GUARD();
  (void)d;
  snprintf(p->gcnArchName, sizeof(p->gcnArchName), "gfx90a:sramecc+:xnack-");
  return hipSuccess;
}
EXPORT hipError_t hipDeviceGetUuid(hipUUID *u, hipDevice_t d) {
  GUARD();
  for (int i = 0; i < 16; i++)
    u->bytes[i] = (char)(0x10 * d + i);
  return hipSuccess;
}
EXPORT hipError_t hipSetDevice(int d) {
  GUARD();
  ALIVE();
  return d >= 0 && d < ndev() ? hipSuccess : hipErrorInvalidDevice;
}
EXPORT hipError_t hipDeviceReset(void) {
  GUARD();
  executed = queued; /* the queue is gone */
  for (int i = 0; i < nreg; i++) {
    switch (reg[i].kind) {
    case R_DEV: live.dev_allocs--; break;
    case R_STREAM: live.streams--; break;
    case R_EVENT: live.events--; break;
    default:
      live.modules--;
      free(((struct ihipModule_t *)reg[i].p)->code);
      break;
    }
    free(reg[i].p);
  }
  nreg = 0;
  live.resets++;
  return hipSuccess;
}
EXPORT hipError_t hipDeviceSynchronize(void) {
  GUARD();
  ALIVE();
  run_until(queued);
  return hipSuccess;
}
EXPORT const char *hipGetErrorName(hipError_t e) {
  GUARD();
  switch (e) {
  case hipSuccess: return "hipSuccess";
  case hipErrorNotReady: return "hipErrorNotReady";
  case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
  case hipErrorIllegalAddress: return "hipErrorIllegalAddress";
  case hipErrorNoDevice: return "hipErrorNoDevice";
  case hipErrorNotFound: return "hipErrorNotFound";
  case hipErrorNotSupported: return "hipErrorNotSupported";
  default: return "hipErrorUnknown";
  }
}
EXPORT const char *hipGetErrorString(hipError_t e) {
  GUARD();
  return e == hipErrorIllegalAddress ? "an illegal memory access was encountered"
                                     : hipGetErrorName(e);
}

/* ---- streams and events ------------------------------------------------------- */

EXPORT hipError_t hipStreamCreateWithFlags(hipStream_t *s, unsigned flags) {
  GUARD();
  (void)flags;
  ALIVE();
  *s = calloc(1, sizeof(**s));
  reg_add(*s, R_STREAM);
  live.streams++;
  return hipSuccess;
}
EXPORT hipError_t hipStreamDestroy(hipStream_t s) {
  GUARD();
  reg_del(s);
  free(s);
  live.streams--;
  return hipSuccess;
}
EXPORT hipError_t hipStreamSynchronize(hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  run_until(queued);
  return hipSuccess;
}
EXPORT hipError_t hipStreamQuery(hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  return executed == queued ? hipSuccess : hipErrorNotReady;
}
EXPORT hipError_t hipEventCreateWithFlags(hipEvent_t *e, unsigned flags) {
  GUARD();
  (void)flags;
  ALIVE();
  *e = calloc(1, sizeof(**e));
  reg_add(*e, R_EVENT);
  live.events++;
  return hipSuccess;
}
EXPORT hipError_t hipEventDestroy(hipEvent_t e) {
  GUARD();
  reg_del(e);
  free(e);
  live.events--;
  return hipSuccess;
}
EXPORT hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  enqueue(OP_MARK, NULL, NULL, 0, 0);
  e->target = queued;
  return hipSuccess;
}
EXPORT hipError_t hipEventQuery(hipEvent_t e) {
  GUARD();
  ALIVE();
  return executed >= e->target ? hipSuccess : hipErrorNotReady;
}
EXPORT hipError_t hipEventSynchronize(hipEvent_t e) {
  GUARD();
  ALIVE();
  run_until(e->target);
  return hipSuccess;
}

/* ---- memory ---------------------------------------------------------------------- */

EXPORT hipError_t hipMalloc(void **p, size_t n) {
  GUARD();
  ALIVE();
  if (n > ((size_t)1 << 34))
    return hipErrorOutOfMemory;
  *p = malloc(n ? n : 1);
  reg_add(*p, R_DEV);
  live.dev_allocs++;
  return hipSuccess;
}
EXPORT hipError_t hipFree(void *p) {
  GUARD();
  ALIVE();
  reg_del(p);
  free(p);
  live.dev_allocs--;
  return hipSuccess;
}
EXPORT hipError_t hipHostMalloc(void **p, size_t n, unsigned flags) {
  GUARD();
  (void)flags;
  ALIVE();
  if (npinned >= 256)
    return hipErrorOutOfMemory;
  *p = malloc(n);
  pinned[npinned].p = *p;
  pinned[npinned++].n = n;
  live.host_allocs++;
  return hipSuccess;
}
EXPORT hipError_t hipHostFree(void *p) {
  GUARD();
  for (int i = 0; i < npinned; i++)
    if (pinned[i].p == p) {
      /* Nothing queued may still read or fill it. */
      for (uint64_t s = executed; s < queued; s++) {
        const struct fop *o = &queue[s % QMAX];
        if (o->kind == OP_COPY && (is_pinned(o->src, 1) || is_pinned(o->dst, 1))) {
          fprintf(stderr, "fake hip: hipHostFree of memory a queued copy uses\n");
          abort();
        }
      }
      pinned[i] = pinned[--npinned];
      free(p);
      live.host_allocs--;
      return hipSuccess;
    }
  return hipErrorInvalidValue;
}
/* Registered client mappings count as pinned: copies from them queue. */
EXPORT hipError_t hipHostRegister(void *p, size_t n, unsigned flags) {
  GUARD();
  (void)flags;
  ALIVE();
  if (npinned >= 256)
    return hipErrorOutOfMemory;
  pinned[npinned].p = p;
  pinned[npinned++].n = n;
  return hipSuccess;
}
EXPORT hipError_t hipHostUnregister(void *p) {
  GUARD();
  for (int i = 0; i < npinned; i++)
    if (pinned[i].p == p) {
      pinned[i] = pinned[--npinned];
      return hipSuccess;
    }
  return hipErrorInvalidValue;
}

EXPORT hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void *src, size_t n, hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  if (!is_pinned(src, n)) {
    run_until(queued);
    memcpy(dst, src, n);
  } else {
    enqueue(OP_COPY, dst, src, n, 0);
  }
  return hipSuccess;
}
EXPORT hipError_t hipMemcpyDtoHAsync(void *dst, hipDeviceptr_t src, size_t n, hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  if (!is_pinned(dst, n)) {
    run_until(queued);
    memcpy(dst, src, n);
  } else {
    enqueue(OP_COPY, dst, src, n, 0);
  }
  return hipSuccess;
}
EXPORT hipError_t hipMemsetD8Async(hipDeviceptr_t dst, unsigned char v, size_t n,
                                   hipStream_t s) {
  GUARD();
  (void)s;
  ALIVE();
  enqueue(OP_SET, dst, NULL, n, v);
  return hipSuccess;
}
EXPORT hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t n) {
  GUARD();
  ALIVE();
  run_until(queued);
  memcpy(dst, src, n);
  return hipSuccess;
}
EXPORT hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t n) {
  GUARD();
  ALIVE();
  run_until(queued);
  memcpy(dst, src, n);
  return hipSuccess;
}
EXPORT hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p) {
  GUARD();
  (void)h;
  (void)p;
  return hipErrorNotSupported; /* processes share no fake memory */
}
EXPORT hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t h, unsigned flags) {
  GUARD();
  (void)p;
  (void)h;
  (void)flags;
  return hipErrorNotSupported;
}
EXPORT hipError_t hipIpcCloseMemHandle(void *p) {
  GUARD();
  (void)p;
  return hipErrorNotSupported;
}

/* ---- modules ------------------------------------------------------------------------- */

#define CODE_MAGIC "FAKEHSACO\n"

EXPORT hipError_t hipModuleLoadData(hipModule_t *m, const void *image) {
  GUARD();
  ALIVE();
  if (strncmp(image, CODE_MAGIC, strlen(CODE_MAGIC)) != 0)
    return hipErrorInvalidImage;
  *m = calloc(1, sizeof(**m));
  (*m)->code = strdup(image);
  reg_add(*m, R_MODULE);
  live.modules++;
  return hipSuccess;
}
EXPORT hipError_t hipModuleUnload(hipModule_t m) {
  GUARD();
  reg_del(m);
  free(m->code);
  free(m);
  live.modules--;
  return hipSuccess;
}
EXPORT hipError_t hipModuleGetFunction(hipFunction_t *f, hipModule_t m, const char *name) {
  GUARD();
  char pat[80];
  ALIVE();
  snprintf(pat, sizeof(pat), " %s(", name);
  if (!strstr(m->code, pat))
    return hipErrorNotFound;
  /* Functions live as long as their module in HIP; the fake keeps them
   * in a small ring, which is enough for a test. */
  {
    static struct ihipModuleSymbol_t syms[1024];
    static int next;
    struct ihipModuleSymbol_t *s = &syms[next++ % 1024];
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->mod = m;
    *f = s;
  }
  return hipSuccess;
}
EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                        hipStream_t s, void **args, void **extra) {
  GUARD();
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)s, (void)extra;
  ALIVE();
  live.launches++;
  if (inject || strcmp(f->name, "fake_fault") == 0) {
    inject = 0;
    dead = 1;
    return hipErrorIllegalAddress;
  }
  run_until(queued);
  if (strcmp(f->name, "fake_fill") == 0) {
    float *x = *(float **)args[0];
    int n = *(int *)args[1];
    float v = *(float *)args[2];
    for (int i = 0; i < n; i++)
      x[i] = v;
  }
  return hipSuccess;
}

/* ---- hiprtc ------------------------------------------------------------------------------ */

EXPORT const char *hiprtcGetErrorString(hiprtcResult r) {
  GUARD();
  return r == HIPRTC_SUCCESS ? "HIPRTC_SUCCESS" : "HIPRTC_ERROR_COMPILATION";
}
EXPORT hiprtcResult hiprtcVersion(int *major, int *minor) {
  GUARD();
  *major = 6;
  *minor = 2;
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcCreateProgram(hiprtcProgram *prog, const char *src, const char *name,
                                        int nh, const char **h, const char **hn) {
  GUARD();
  struct _hiprtcProgram *p = calloc(1, sizeof(*p));
  (void)name, (void)nh, (void)h, (void)hn;
  p->src = malloc(strlen(CODE_MAGIC) + strlen(src) + 1);
  strcpy(p->src, CODE_MAGIC);
  strcat(p->src, src);
  p->log = strdup("");
  *prog = p;
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcCompileProgram(hiprtcProgram prog, int n, const char **opts) {
  GUARD();
  if (n < 1 || strncmp(opts[0], "--offload-arch=gfx", 18) != 0)
    return HIPRTC_ERROR_INVALID_OPTION;
  if (strstr(prog->src, "syntax_error")) {
    free(prog->log);
    prog->log = strdup("kernel.cu:1:1: error: use of undeclared identifier 'syntax_error'");
    return HIPRTC_ERROR_COMPILATION;
  }
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcGetProgramLogSize(hiprtcProgram prog, size_t *n) {
  GUARD();
  *n = strlen(prog->log) + 1;
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcGetProgramLog(hiprtcProgram prog, char *log) {
  GUARD();
  strcpy(log, prog->log);
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcGetCodeSize(hiprtcProgram prog, size_t *n) {
  GUARD();
  *n = strlen(prog->src) + 1;
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcGetCode(hiprtcProgram prog, char *code) {
  GUARD();
  strcpy(code, prog->src);
  return HIPRTC_SUCCESS;
}
EXPORT hiprtcResult hiprtcDestroyProgram(hiprtcProgram *prog) {
  GUARD();
  free((*prog)->src);
  free((*prog)->log);
  free(*prog);
  *prog = NULL;
  return HIPRTC_SUCCESS;
}

/* ---- hipBLAS: column-major gemm on the host --------------------------------------------- */

EXPORT int hipblasCreate(void **h) {
  GUARD();
  *h = malloc(1);
  live.blas++;
  return 0;
}
EXPORT int hipblasDestroy(void *h) {
  GUARD();
  free(h);
  live.blas--;
  return 0;
}
EXPORT int hipblasSetStream(void *h, hipStream_t s) {
  GUARD();
  (void)h, (void)s;
  return 0;
}

/* One gemm of element type T (size esz, complex when cplx). */
static void gemm_host(int cplx, int dbl, int opa, int opb, int m, int n, int k,
                      const double *alpha, const void *A, int lda, const void *B, int ldb,
                      const double *beta, void *C, int ldc) {
  run_until(queued);
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double sr = 0, si = 0;
      for (int l = 0; l < k; l++) {
        size_t ia = opa == 112 ? (size_t)l + (size_t)i * lda : (size_t)i + (size_t)l * lda;
        size_t ib = opb == 112 ? (size_t)j + (size_t)l * ldb : (size_t)l + (size_t)j * ldb;
        double ar, ai = 0, br, bi = 0;
        if (dbl) {
          ar = ((const double *)A)[ia << cplx];
          br = ((const double *)B)[ib << cplx];
          if (cplx) {
            ai = ((const double *)A)[2 * ia + 1];
            bi = ((const double *)B)[2 * ib + 1];
          }
        } else {
          ar = ((const float *)A)[ia << cplx];
          br = ((const float *)B)[ib << cplx];
          if (cplx) {
            ai = ((const float *)A)[2 * ia + 1];
            bi = ((const float *)B)[2 * ib + 1];
          }
        }
        sr += ar * br - ai * bi;
        si += ar * bi + ai * br;
      }
      {
        size_t ic = (size_t)i + (size_t)j * ldc;
        double cr = 0, ci = 0;
        if (beta[0] != 0) {
          cr = dbl ? ((double *)C)[ic << cplx] : ((float *)C)[ic << cplx];
          if (cplx)
            ci = dbl ? ((double *)C)[2 * ic + 1] : ((float *)C)[2 * ic + 1];
        }
        cr = alpha[0] * sr + beta[0] * cr;
        ci = alpha[0] * si + beta[0] * ci;
        if (dbl) {
          ((double *)C)[ic << cplx] = cr;
          if (cplx)
            ((double *)C)[2 * ic + 1] = ci;
        } else {
          ((float *)C)[ic << cplx] = (float)cr;
          if (cplx)
            ((float *)C)[2 * ic + 1] = (float)ci;
        }
      }
    }
}

EXPORT int hipblasSgemm(void *h, int oa, int ob, int m, int n, int k, const float *alpha,
                        const float *A, int lda, const float *B, int ldb, const float *beta,
                        float *C, int ldc) {
  GUARD();
  double a = *alpha, b = *beta;
  (void)h;
  gemm_host(0, 0, oa, ob, m, n, k, &a, A, lda, B, ldb, &b, C, ldc);
  return 0;
}
EXPORT int hipblasDgemm(void *h, int oa, int ob, int m, int n, int k, const double *alpha,
                        const double *A, int lda, const double *B, int ldb,
                        const double *beta, double *C, int ldc) {
  GUARD();
  (void)h;
  gemm_host(0, 1, oa, ob, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  return 0;
}
#define SB(name, cplx, dbl, T)                                                          \
  EXPORT int name(void *h, int oa, int ob, int m, int n, int k, const T *alpha,         \
                  const T *A, int lda, int64_t sa, const T *B, int ldb, int64_t sb,     \
                  const T *beta, T *C, int ldc, int64_t sc, int batch) {                \
    GUARD();                                                                            \
    double a = (double)alpha[0], b = (double)beta[0];                                   \
    (void)h;                                                                            \
    for (int i = 0; i < batch; i++)                                                     \
      gemm_host(cplx, dbl, oa, ob, m, n, k, &a, A + ((size_t)sa * i << cplx), lda,      \
                B + ((size_t)sb * i << cplx), ldb, &b, C + ((size_t)sc * i << cplx), ldc); \
    return 0;                                                                           \
  }
SB(hipblasSgemmStridedBatched, 0, 0, float)
SB(hipblasDgemmStridedBatched, 0, 1, double)
SB(hipblasCgemmStridedBatched, 1, 0, float)
SB(hipblasZgemmStridedBatched, 1, 1, double)

/* ---- hipFFT: a direct DFT on the host ------------------------------------------------------ */

struct fplan {
  long long n, batch, idist, odist;
  int type;
  void *work;
};

EXPORT int hipfftCreate(void **p) {
  GUARD();
  *p = calloc(1, sizeof(struct fplan));
  live.plans++;
  return 0;
}
EXPORT int hipfftDestroy(void *p) {
  GUARD();
  free(p);
  live.plans--;
  return 0;
}
EXPORT int hipfftSetAutoAllocation(void *p, int on) {
  GUARD();
  (void)p, (void)on;
  return 0;
}
EXPORT int hipfftMakePlanMany64(void *pp, int rank, long long *n, long long *inembed,
                                long long istride, long long idist, long long *onembed,
                                long long ostride, long long odist, int type, long long batch,
                                size_t *ws) {
  GUARD();
  struct fplan *p = pp;
  (void)inembed, (void)onembed;
  if (rank != 1 || istride != 1 || ostride != 1)
    return 5; /* HIPFFT_INVALID_VALUE */
  p->n = n[0];
  p->batch = batch;
  p->idist = idist;
  p->odist = odist;
  p->type = type;
  *ws = 4096; /* a work area, so plans own pool memory */
  return 0;
}
EXPORT int hipfftSetWorkArea(void *p, void *w) {
  GUARD();
  ((struct fplan *)p)->work = w;
  return 0;
}
EXPORT int hipfftSetStream(void *p, hipStream_t s) {
  GUARD();
  (void)p, (void)s;
  return 0;
}

static int dft_host(struct fplan *p, const void *in, void *out, int dir, int real, int dbl) {
  GUARD();
  const double pi2 = 6.283185307179586476925286766559;
  long long nout = real ? p->n / 2 + 1 : p->n;
  if (!p->work)
    return 4; /* HIPFFT_EXEC_FAILED: the plan needs its work area */
  run_until(queued);
  for (long long b = 0; b < p->batch; b++)
    for (long long k = 0; k < nout; k++) {
      double sr = 0, si = 0;
      for (long long j = 0; j < p->n; j++) {
        long long ix = b * p->idist + j;
        double xr, xi = 0, a = dir * pi2 * (double)((j * k) % p->n) / (double)p->n;
        if (real) {
          xr = dbl ? ((const double *)in)[ix] : ((const float *)in)[ix];
        } else {
          xr = dbl ? ((const double *)in)[2 * ix] : ((const float *)in)[2 * ix];
          xi = dbl ? ((const double *)in)[2 * ix + 1] : ((const float *)in)[2 * ix + 1];
        }
        sr += xr * cos(a) - xi * sin(a);
        si += xr * sin(a) + xi * cos(a);
      }
      {
        long long io = b * p->odist + k;
        if (dbl) {
          ((double *)out)[2 * io] = sr;
          ((double *)out)[2 * io + 1] = si;
        } else {
          ((float *)out)[2 * io] = (float)sr;
          ((float *)out)[2 * io + 1] = (float)si;
        }
      }
    }
  return 0;
}

/* The inverse of a real transform: n real values per row from the half
 * spectrum (n/2+1 values, the rest by Hermitian symmetry), unnormalised. */
static int c2r_host(struct fplan *p, const void *in, void *out, int dbl) {
  GUARD();
  const double pi2 = 6.283185307179586476925286766559;
  long long h = p->n / 2 + 1;
  if (!p->work)
    return 4;
  run_until(queued);
  for (long long b = 0; b < p->batch; b++)
    for (long long j = 0; j < p->n; j++) {
      double s = 0;
      for (long long k = 0; k < p->n; k++) {
        long long kk = k < h ? k : p->n - k, ix = b * p->idist + kk;
        double xr = dbl ? ((const double *)in)[2 * ix] : ((const float *)in)[2 * ix];
        double xi = dbl ? ((const double *)in)[2 * ix + 1] : ((const float *)in)[2 * ix + 1];
        double a = pi2 * (double)((j * k) % p->n) / (double)p->n;
        if (k >= h)
          xi = -xi;
        s += xr * cos(a) - xi * sin(a);
      }
      if (dbl)
        ((double *)out)[b * p->odist + j] = s;
      else
        ((float *)out)[b * p->odist + j] = (float)s;
    }
  return 0;
}

EXPORT int hipfftExecC2C(void *p, void *in, void *out, int dir) { return dft_host(p, in, out, dir, 0, 0); }
EXPORT int hipfftExecZ2Z(void *p, void *in, void *out, int dir) { return dft_host(p, in, out, dir, 0, 1); }
EXPORT int hipfftExecR2C(void *p, void *in, void *out) { return dft_host(p, in, out, -1, 1, 0); }
EXPORT int hipfftExecD2Z(void *p, void *in, void *out) { return dft_host(p, in, out, -1, 1, 1); }
EXPORT int hipfftExecC2R(void *p, void *in, void *out) { return c2r_host(p, in, out, 0); }
EXPORT int hipfftExecZ2D(void *p, void *in, void *out) { return c2r_host(p, in, out, 1); }
