/*
 * Internal header of the CUDA backend (backends/cuda/): the device, memory
 * and fence structs, and the entry points shared by its files:
 *
 *   loader.c   dlopen of libcuda, NVRTC, cuBLAS, cuFFT (cuda_api.h)
 *   cuda.c     the backend table: probe, open/close, memory, fences, faults
 *   nvrtc.c    NVRTC compilation through the kernel cache, modules
 *   ops.c      gemm, fft, fir, reduce, map, contract, raw kernels
 *   fir_fft.c  fir's FFT (overlap-save) path and its choice against the direct kernel
 *
 * Every function here runs on the device's runner thread (probe excepted).
 */
#ifndef DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H
#define DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/common/plancache.h"
#include "backends/common/pool.h"
#include "backends/common/retire.h"
#include "backends/cuda/cuda_api.h"
#include "backends/kernels/kernels.h"
#include "cache/cache.h"

#define DSPK__CUDA_MAX_DEVICES 16
#define DSPK__CUDA_BLAS_WORKSPACE ((size_t)32 << 20)

extern const struct dspk__backend dspk__backend_cuda;

/* A block of device memory.  gen is the context generation it was made in:
 * after a fault rebuilds the context, older blocks are gone. */
struct dspk__mem {
  struct dspk__pool_block *blk;
  CUdeviceptr ptr;
  size_t size;
  uint32_t gen;
};

struct dspk__fence {
  CUevent ev;
  uint32_t gen;
};

/* A compiled module of a generated kernel family for one dtype. */
struct dspk__cuda_module {
  CUmodule mod;
  int loaded;
};

/* The pinned staging ring of a device (cuda.c): every host<->device copy of
 * the backend goes through n chunks of `chunk` bytes of page-locked host
 * memory, used in ring order.  busy[i] says a copy from or into chunk i may
 * be in flight on the stream and ev[i] marks its end: nothing writes or
 * reads the chunk before that event has completed.  host is NULL when
 * staging is off (DSPK_CUDA_STAGE_CHUNKS=0) or could not be allocated; the
 * backend then copies from pageable memory directly. */
#define DSPK__CUDA_STAGE_MAX 64
struct dspk__cuda_stage {
  unsigned char *host;
  size_t chunk;
  int n, next;
  int broken; /* an in-flight copy lost its event: never reuse host */
  CUevent ev[DSPK__CUDA_STAGE_MAX];
  unsigned char busy[DSPK__CUDA_STAGE_MAX];
  /* Counters (tests, benchmarks): chunks copied each way, and how often a
   * chunk had to wait for its previous copy to finish. */
  uint64_t chunks_h2d, chunks_d2h, waits;
  /* An op was queued since the stream was last seen idle: set by run(),
   * cleared by a synchronize.  Copies alone leave it clear. */
  int work_queued;
};

struct dspk__dev {
  int index;
  CUdevice cudev;
  CUcontext ctx;
  CUstream stream;
  struct dspk__devenv env;
  struct dspk__devinfo info;
  char arch[32];       /* "sm_90" */
  char driver_ver[32]; /* "13.0" */
  char nvrtc_ver[32];  /* "13.0" */
  int sms;             /* multiprocessors */
  uint32_t gen;        /* context generation, bumped by a rebuild */
  int ctx_dead;        /* a sticky error killed the context */
  char fault[256];     /* the last fault, for the next error message */

  struct dspk__pool pool;
  struct dspk__retire retire;
  struct dspk__plancache fft_plans, contract_plans, raw_modules;
  int sync_on_evict;   /* benchmark switch: barrier instead of retirement */

  /* Spare events, so recording a fence costs no cuEventCreate. */
  CUevent spare[64];
  int nspare;

  cublasHandle_t blas;
  struct dspk__pool_block *blas_ws;

  struct dspk__cuda_module mods[DSPK__K_COUNT][DSPK_DTYPE_COUNT];

  /* Benchmark hook: events recorded around the launches of the next
   * contraction (bench/cuda measures GPU busy time with them). */
  CUevent trace_start, trace_end;

  /* The kernel worker (worker.h): raw kernels run in it. */
  int worker_pid, worker_fd, ipc_broken;
  uint64_t worker_starts;

  uint64_t kernels_compiled, kernel_cache_hits, faults;

  struct dspk__cuda_stage stage;
  /* Client mappings pinned with cuMemHostRegister (shared-memory buffers,
   * backend host_register): copies from and to them skip the ring. */
  struct { void *p; size_t n; } *hostreg;
  size_t nhostreg, caphostreg;
  /* Test hook: the reduction candidate (tune.c) every reduction launches,
   * bypassing autotuning; NULL for the normal choice. */
  const char *reduce_force;
};

/* Formats a CUDA driver error "cuX: CUDA_ERROR_Y (text)" into ctx->errmsg
 * (when ctx is not NULL), marks the context dead for sticky errors and
 * returns the dspk_errno for it. */
int dspk__cuda_err(struct dspk__dev *dev, struct dspk__opctx *ctx,
                   const char *what, CUresult r);
/* Writes a message into ctx->errmsg (when there is one) and returns code. */
#define dspk__cuda_msg dspk__op_fail

/* Device pointer of a tensor's first element (0 for an empty tensor the
 * daemon placed without memory). */
static inline CUdeviceptr dspk__cuda_ptr(const struct dspk__tensor *t) {
  return t->mem ? t->mem->ptr + t->offset : 0;
}

/* Temporary device memory for one op: from the pool, and handed back through
 * the retirement queue with dspk__cuda_tmp_free (never released early). */
int dspk__cuda_tmp_alloc(struct dspk__dev *dev, size_t n,
                         struct dspk__pool_block **out);
void dspk__cuda_tmp_free(struct dspk__dev *dev, struct dspk__pool_block *b);
/* Hands any resource to the retirement queue, or (sync_on_evict) waits for
 * the stream and releases at once. */
void dspk__cuda_retire(struct dspk__dev *dev, dspk__retire_release_fn fn,
                       void *ud, void *res);

/* nvrtc.c.  Compiles src for dev's arch (or `arch` when dev is NULL) through
 * the kernel cache; writes a malloc'd cubin.  Returns 0, DSPK_ECOMPILE with
 * the compiler log in log, or another dspk_errno. */
int dspk__cuda_compile(struct dspk__dev *dev, const char *arch,
                       const char *name, const char *src, size_t len,
                       void **cubin, size_t *cubin_len, char *log,
                       size_t loglen);
/* The function `entry` of a generated family's module for dtype dt,
 * compiling and loading it on first use. */
int dspk__cuda_kfunc(struct dspk__dev *dev, enum dspk__kfamily f, dspk_dtype dt,
                     const char *entry, CUfunction *out,
                     struct dspk__opctx *ctx);
/* Unloads every generated module (close, rebuild). */
void dspk__cuda_modules_unload(struct dspk__dev *dev);
/* Launches a 1-D grid-stride kernel over n items. */
int dspk__cuda_launch1d(struct dspk__dev *dev, CUfunction fn, int64_t n,
                        void **args, struct dspk__opctx *ctx);

/* worker.c.  Runs a raw kernel (op, compiled cubin) in the device's kernel
 * worker process, starting it when needed.  Waits for the kernel. */
int dspk__cuda_worker_run(struct dspk__dev *dev, struct dspk__op *op,
                          const void *cubin, size_t cubin_len,
                          struct dspk__opctx *ctx);
/* Ends the worker (close). */
void dspk__cuda_worker_stop(struct dspk__dev *dev);

/* tune.c.  Launches a 1-D grid-stride kernel over n items with the block
 * size the autotune framework chose for (op, shape class, dtype, device),
 * tuning on this launch's data the first time. */
/* The device's identity in cache keys (kernels, autotune decisions); the
 * strings belong to dev. */
struct dspk__cache_devid dspk__cuda_devid(const struct dspk__dev *dev);
int dspk__cuda_launch_tuned(struct dspk__dev *dev, CUfunction fn, int64_t n,
                            void **args, const char *op, const char *shape_class,
                            dspk_dtype dt, struct dspk__opctx *ctx);

/* tune.c.  Launches a reduction (backends/kernels/reduce.cu: args are its
 * x, out, descriptor and fn) of nout outputs of nred elements each, inner
 * when the innermost axis is among those reduced, with the kernel and
 * block size the autotune framework chose for the class, tuning on this
 * launch's data the first time when tune is set (only when rerunning is
 * harmless: out does not overlap x).  0 or a dspk_errno. */
int dspk__cuda_reduce_launch(struct dspk__dev *dev, dspk_dtype dt, int64_t nout,
                             int64_t nred, int inner, void **args, int tune,
                             struct dspk__opctx *ctx);

/* Test hook: makes every reduction launch the candidate named (tune.c:
 * "block128".."block1024", "warp4", "warp8", "thread128", "thread256"), or
 * the tuned choice again with NULL.  Returns 0, or DSPK_EINVAL for a name
 * that is not a candidate. */
int dspk__cuda_set_reduce_force(struct dspk__dev *dev, const char *name);

/* ops.c */
int dspk__cuda_run(struct dspk__dev *dev, struct dspk__op *op,
                   struct dspk__opctx *ctx);
void dspk__cuda_fft_plan_evict(void *ud, void *plan);
/* The cached cuFFT plan of `batch` transforms of type t (a cufftType) along
 * contiguous rows of n input and nout output elements, its stream and work
 * area set; the handle stays valid until the plan cache evicts it. */
int dspk__cuda_fft_plan(struct dspk__dev *dev, int t, long long n, long long nout,
                        long long batch, cufftHandle *out, struct dspk__opctx *ctx);
/* fir's direct kernel (backends/kernels/fir.cu). */
int dspk__cuda_fir_direct(struct dspk__dev *dev, struct dspk__op *op,
                          struct dspk__opctx *ctx);

/* fir_fft.c.  fir: the direct kernel or FFT convolution (overlap-save
 * through cuFFT), chosen by the autotune framework per shape class. */
int dspk__cuda_fir(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx);
/* Test and benchmark hooks (process-wide): force fir's path (-1: the
 * tuned choice, 0: direct, 1..3: overlap-save with blocks of 2^(m+1) times
 * the filter's length rounded up to a power of two, "ols-x4".."ols-x16"),
 * and the name of the path the calling thread's last fir took. */
void dspk__cuda_fir_force(int mode);
const char *dspk__cuda_fir_last(void);
void dspk__cuda_contract_plan_evict(void *ud, void *plan);
void dspk__cuda_raw_module_evict(void *ud, void *mod);

/* Test and benchmark hooks (declared here, used by tests/cuda and
 * bench/cuda): switch plan eviction to a stream synchronize, and read the
 * compile counters. */
void dspk__cuda_set_sync_on_evict(struct dspk__dev *dev, int on);
void dspk__cuda_set_trace_events(struct dspk__dev *dev, CUevent start, CUevent end);
CUstream dspk__cuda_stream(struct dspk__dev *dev);
/* Replaces dev's staging ring by one of nchunks chunks of chunk bytes
 * (nchunks 0: staging off, pageable copies), after waiting for the copies
 * of the old one.  Returns 0 or a dspk_errno (the ring is then off). */
int dspk__cuda_stage_config(struct dspk__dev *dev, int nchunks, size_t chunk);
/* Host to device and device to host through the staging ring (or directly
 * when it is off): the backend's write() and read() without their checks,
 * for the backend's own transfers.  stage_write returns once src has been
 * copied (the DMA may still run); stage_read once dst is filled, which also
 * orders it after all work enqueued before.  0 or a dspk_errno. */
/* host_register / host_unregister of the backend table (cuda.c):
 * cuMemHostRegister of a client's mapping, remembered so that
 * dspk__cuda_stage_write/read DMA straight from and to it; unregister first
 * drains the stream (a copy may still read the pages).  0 or a dspk_errno. */
int dspk__cuda_host_register(struct dspk__dev *dev, void *p, size_t n);
void dspk__cuda_host_unregister(struct dspk__dev *dev, void *p);
int dspk__cuda_stage_write(struct dspk__dev *dev, CUdeviceptr dst,
                           const void *src, size_t n);
int dspk__cuda_stage_read(struct dspk__dev *dev, void *dst, CUdeviceptr src,
                          size_t n);
cublasHandle_t dspk__cuda_blas(struct dspk__dev *dev);

#endif /* DSPK_BACKENDS_CUDA_CUDA_INTERNAL_H */
