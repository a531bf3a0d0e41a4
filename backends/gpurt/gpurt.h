/*
 * One GPU-runtime implementation for the CUDA and HIP backends (and any
 * runtime of the same family): the device lifecycle with ordered teardown,
 * memory through the caching pool, fences and the retirement queue built on
 * events, the pinned staging ring, plan caches with eviction, the generated
 * kernels compiled at run time through the kernel cache, the autotuned
 * launches, and the worker process that isolates raw kernels.  Everything a
 * runtime provides comes through one table of entry points,
 * struct dspk__gpurt_driver below; a backend is that table, its probe and
 * its identity (backends/cuda/cuda.c, backends/hip/hip.c):
 *
 *   device.c   the backend members: open/close, memory, fences, staging
 *   rtc.c      run-time compilation through the kernel cache, modules
 *   ops.c      gemm, fft, fir, reduce, map, contract, raw kernels
 *   fir_fft.c  fir's FFT (overlap-save) path and its choice against the direct kernel
 *   tune.c     autotuned launches
 *   worker.c   the daemon's side of the kernel worker (worker.h)
 *   worker_main.c  the worker process, over the same table
 *
 * Every function here runs on the device's runner thread (probe excepted).
 * The driver's entry points are called through the table's pointers, each a
 * one-line wrapper of the dlopen'd function (the handle types differ).
 */
#ifndef DSPK_BACKENDS_GPURT_GPURT_H
#define DSPK_BACKENDS_GPURT_GPURT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/common/kcompile.h"
#include "backends/common/plancache.h"
#include "backends/common/pool.h"
#include "backends/common/retire.h"
#include "backends/kernels/kernels.h"
#include "cache/cache.h"

#define DSPK__GPURT_MAX_DEVICES 16
#define DSPK__GPURT_BLAS_WORKSPACE ((size_t)32 << 20)

/* The runtime's handles as the shared code sees them. */
typedef uint64_t dspk__gptr; /* a device address */
typedef void *dspk__gstream, *dspk__gevent, *dspk__gmodule, *dspk__gfunc;

/* What a driver result means to the shared code (driver->classify). */
enum dspk__gres {
  DSPK__G_OK = 0,
  DSPK__G_NOT_READY, /* an event or stream still has work */
  DSPK__G_OOM,       /* out of device (or pinned host) memory */
  DSPK__G_NOT_FOUND, /* no such symbol in a module */
  DSPK__G_STICKY,    /* the process's context is dead (illegal address...) */
  DSPK__G_OTHER
};

/* FFT kinds of driver->fft_plan. */
enum dspk__gfft {
  DSPK__GFFT_C2C,
  DSPK__GFFT_Z2Z,
  DSPK__GFFT_R2C,
  DSPK__GFFT_D2Z,
  DSPK__GFFT_C2R, /* half spectrum (n/2+1) to n real values, unnormalised */
  DSPK__GFFT_Z2D
};

/* Per-runtime state written by the probe (main thread), read-only after. */
struct dspk__gpurt_state {
  int n;
  int ordinal[DSPK__GPURT_MAX_DEVICES];
  int sms[DSPK__GPURT_MAX_DEVICES]; /* multiprocessors / compute units */
  struct dspk__devinfo info[DSPK__GPURT_MAX_DEVICES];
};

/*
 * The table of one runtime.  Every entry point returns the runtime's own
 * result code (0 is success in every runtime of this family); classify()
 * maps it to enum dspk__gres and errname() names it.  Optional members
 * (marked) may be NULL; the rest are filled once the runtime is loaded.
 */
struct dspk__gpurt_driver {
  /* Identity. */
  const char *name;      /* "cuda": device ids, messages */
  const char *lang;      /* the raw-kernel language it compiles: "cuda" */
  const char *lang_desc; /* "CUDA C" */
  const char *compiler;  /* "nvrtc": the kernel-cache key */
  const char *env;       /* "DSPK_CUDA": prefix of its environment knobs */
  const char *worker;    /* "dspk-cuda-worker" */
  const char *worker_build, *worker_install; /* where the build/install put it */
  struct dspk__gpurt_state *st;
  /* Products of at most this many multiply-adds take our tiled kernel even
   * where the BLAS is loaded (its host work costs more than such a product
   * on the device; measured on CUDA, docs/backends.md).  0: always the
   * BLAS. */
  int64_t gemm_small;
  /* Messages name driver calls as CUDA's driver API does ("cuEventRecord");
   * another runtime gives its prefix ("hip": "hipEventRecord") and, NULL
   * terminated, the pairs whose names differ more ("cuMemAlloc",
   * "hipMalloc", ...).  NULL: the CUDA names. */
  const char *api_prefix;
  const char *const *api_renames;

  /* Probe (main thread): loads the runtime, fills st (info, ordinals,
   * sms) and returns the number of devices, or 0 with the reason in why. */
  int (*probe)(struct dspk__gpurt_state *st, char *why, size_t whylen);
  void (*unload)(void); /* Optional: shutdown */
  /* Loads only the core runtime (the worker process): 0 or a dspk_errno. */
  int (*load)(char *why, size_t whylen);

  int (*classify)(int r);
  void (*errname)(int r, const char **name, const char **text);

  /* Device context and its stream.  ctx_open makes the context current on
   * the calling thread; ctx_close destroys the stream and releases the
   * context, resetting the device when dead (after a sticky error). */
  int (*ctx_open)(int ordinal, void **ctx, dspk__gstream *stream);
  void (*ctx_close)(int ordinal, void *ctx, dspk__gstream stream, int dead);

  int (*event_create)(dspk__gevent *ev); /* without timing */
  int (*event_destroy)(dspk__gevent ev);
  int (*event_record)(dspk__gevent ev, dspk__gstream s);
  int (*event_query)(dspk__gevent ev);
  int (*event_sync)(dspk__gevent ev);
  int (*stream_sync)(dspk__gstream s);
  int (*stream_query)(dspk__gstream s);

  int (*mem_alloc)(dspk__gptr *p, size_t n);
  int (*mem_free)(dspk__gptr p);
  int (*host_alloc)(void **p, size_t n); /* page-locked */
  int (*host_free)(void *p);
  /* Optional: pins / unpins a client's host mapping for DMA
   * (cuMemHostRegister). */
  int (*host_register)(void *p, size_t n);
  int (*host_unregister)(void *p);
  int (*htod_async)(dspk__gptr dst, const void *src, size_t n, dspk__gstream s);
  int (*dtoh_async)(void *dst, dspk__gptr src, size_t n, dspk__gstream s);
  int (*memset_async)(dspk__gptr dst, unsigned char v, size_t n, dspk__gstream s);
  int (*htod)(dspk__gptr dst, const void *src, size_t n); /* synchronous */
  int (*dtoh)(void *dst, dspk__gptr src, size_t n);

  int (*module_load)(dspk__gmodule *m, const void *image);
  int (*module_unload)(dspk__gmodule m);
  int (*module_func)(dspk__gfunc *f, dspk__gmodule m, const char *name);
  int (*launch)(dspk__gfunc f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shmem, dspk__gstream s, void **args);
  /* Optional: raises a function's dynamic shared memory limit. */
  int (*func_set_shared)(dspk__gfunc f, int bytes);

  /* IPC of device allocations (64-byte handles), for the worker. */
  int (*ipc_get)(unsigned char handle[64], dspk__gptr p);
  int (*ipc_open)(dspk__gptr *p, const unsigned char handle[64]);
  int (*ipc_close)(dspk__gptr p);

  /* Run-time compiler, without the cache (rtc.c adds it).  rtc_load
   * returns 0 or a dspk_errno with why; rtc_version the version for the
   * cache key; rtc_compile writes a malloc'd code object or the log. */
  int (*rtc_load)(char *why, size_t whylen);
  void (*rtc_version)(char *out, size_t len);
  void (*rtc_opts)(const char *arch, char *out, size_t len); /* for the key */
  int (*rtc_compile)(const char *arch, const char *name, const char *src,
                     void **bin, size_t *n, char *log, size_t loglen);

  /* Optional BLAS (Optional: NULL when the runtime has none; blas_open then
   * fails at run time when the library is absent, and the shared code falls
   * back to its own gemm kernel).  blas_gemm is column-major with batch
   * strides in elements; it returns the library's status (0: success). */
  const char *(*blas_name)(void); /* "cuBLAS", or NULL when not loaded */
  int (*blas_open)(void **h, dspk__gstream s, dspk__gptr ws, size_t wsn);
  void (*blas_close)(void *h);
  int (*blas_gemm)(void *h, dspk_dtype dt, int tx, int ty, int m, int n, int k,
                   double alpha, dspk__gptr X, int ldx, int64_t sx, dspk__gptr Y,
                   int ldy, int64_t sy, double beta, dspk__gptr C, int ldc,
                   int64_t sc, int batch);
  /* Optional FFT, likewise (own DFT kernels otherwise).  fft_plan returns
   * the library's status and the work-area size; 1 in *oom when the
   * status means out of memory. */
  const char *(*fft_name)(void); /* "cuFFT", or NULL when not loaded */
  int (*fft_plan)(void **plan, enum dspk__gfft kind, long long n, long long batch,
                  long long nout, size_t *ws, dspk__gstream s, int *oom);
  int (*fft_set_work)(void *plan, dspk__gptr ws);
  int (*fft_exec)(void *plan, enum dspk__gfft kind, dspk__gptr in, dspk__gptr out,
                  int inverse);
  void (*fft_destroy)(void *plan);
};

/* The entries of a driver table (cuda.c, hip.c) that the vendor's file
 * defines as static functions named after the member: those every table
 * has (DSPK__GPURT_DRIVER_ENTRIES) and the optional BLAS and FFT
 * (DSPK__GPURT_DRIVER_LIBS: a runtime without them leaves them out).  The
 * table sets its identity, state, loaders and func_set_shared (optional)
 * itself. */
#define DSPK__GPURT_DRIVER_ENTRIES                                             \
  .probe = probe, .load = load, .classify = classify, .errname = errname,     \
  .ctx_open = ctx_open, .ctx_close = ctx_close,                                \
  .event_create = event_create, .event_destroy = event_destroy,                \
  .event_record = event_record, .event_query = event_query,                    \
  .event_sync = event_sync, .stream_sync = stream_sync,                        \
  .stream_query = stream_query,                                                \
  .mem_alloc = mem_alloc, .mem_free = mem_free,                                \
  .host_alloc = host_alloc, .host_free = host_free,                            \
  .host_register = host_register, .host_unregister = host_unregister,          \
  .htod_async = htod_async, .dtoh_async = dtoh_async,                          \
  .memset_async = memset_async, .htod = htod, .dtoh = dtoh,                    \
  .module_load = module_load, .module_unload = module_unload,                  \
  .module_func = module_func, .launch = launch,                                \
  .ipc_get = ipc_get, .ipc_open = ipc_open, .ipc_close = ipc_close,            \
  .rtc_version = rtc_version, .rtc_opts = rtc_opts,                            \
  .rtc_compile = rtc_compile

#define DSPK__GPURT_DRIVER_LIBS                                                \
  .blas_name = blas_name, .blas_open = blas_open, .blas_close = blas_close,    \
  .blas_gemm = blas_gemm,                                                      \
  .fft_name = fft_name, .fft_plan = fft_plan, .fft_set_work = fft_set_work,    \
  .fft_exec = fft_exec, .fft_destroy = fft_destroy

/* A device's 16-byte UUID as text: 8-4-4-4-12 hex digits (as nvidia-smi
 * and rocm-smi print them after their prefix). */
static inline void dspk__gpurt_uuid(const void *bytes, char *out, size_t len) {
  const unsigned char *b = bytes;
  snprintf(out, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
           b[13], b[14], b[15]);
}

/* The backend members shared by every runtime (device.c); a runtime's
 * struct dspk__backend uses them, with a probe and open of its own that
 * pass its driver. */
int dspk__gpurt_probe(const struct dspk__gpurt_driver *drv, struct dspk__devinfo *info,
                      int max, char *why, size_t whylen);
void dspk__gpurt_shutdown(const struct dspk__gpurt_driver *drv);
int dspk__gpurt_open(const struct dspk__gpurt_driver *drv, int index,
                     const struct dspk__devenv *env, struct dspk__dev **out);
void dspk__gpurt_close(struct dspk__dev *dev);
int dspk__gpurt_alloc(struct dspk__dev *dev, size_t n, struct dspk__mem **out);
void dspk__gpurt_free(struct dspk__dev *dev, struct dspk__mem *m);
int dspk__gpurt_write(struct dspk__dev *dev, struct dspk__mem *m, size_t off,
                      const void *src, size_t n);
int dspk__gpurt_read(struct dspk__dev *dev, struct dspk__mem *m, size_t off, void *dst,
                     size_t n);
int dspk__gpurt_fence_record(struct dspk__dev *dev, struct dspk__fence **out);
int dspk__gpurt_fence_query(struct dspk__dev *dev, struct dspk__fence *f);
int dspk__gpurt_fence_wait(struct dspk__dev *dev, struct dspk__fence *f);
/* The same, for the backend table: a fence of a lost context is EDEVICE. */
int dspk__gpurt_table_fence_query(struct dspk__dev *dev, struct dspk__fence *f);
int dspk__gpurt_table_fence_wait(struct dspk__dev *dev, struct dspk__fence *f);
void dspk__gpurt_fence_destroy(struct dspk__dev *dev, struct dspk__fence *f);
int dspk__gpurt_sync(struct dspk__dev *dev);
int dspk__gpurt_run_checked(struct dspk__dev *dev, struct dspk__op *op,
                            struct dspk__opctx *ctx);
void dspk__gpurt_stats(struct dspk__dev *dev, struct dspk__devstats *out);
/* host_alloc / host_free / trim of the backend table (device.c): blocks
 * of cuMemHostAlloc memory in size classes (powers of two from 64 KiB to
 * DSPK__GPURT_HOSTMEM_MAX; NULL above), kept for reuse up to
 * DSPK__GPURT_HOSTMEM_KEEP bytes, all given back by trim; stage_read and
 * stage_write DMA straight from and to them. */
#define DSPK__GPURT_HOSTMEM_KEEP ((size_t)64 << 20)
#define DSPK__GPURT_HOSTMEM_MAX ((size_t)32 << 20)
void *dspk__gpurt_host_alloc(struct dspk__dev *dev, size_t n);
void dspk__gpurt_host_free(struct dspk__dev *dev, void *p);
void dspk__gpurt_trim(struct dspk__dev *dev);
/* settle of the backend table: the runner is idle; waits on the retirement
 * queue's events and releases what it holds (trim does so first too, then
 * gives the pool's free device memory back). */
void dspk__gpurt_settle(struct dspk__dev *dev);
/* Every op; f16 and bf16 gemm only through the BLAS library (the runtime's
 * own gemm kernel takes f32 and f64); raw kernels in the driver's lang. */
void dspk__gpurt_caps(struct dspk__dev *dev, struct dspk__devcaps *out);

/* The members of a runtime's struct dspk__backend, all but probe,
 * shutdown and open, which name the driver. */
#define DSPK__GPURT_BACKEND_MEMBERS                                            \
  .close = dspk__gpurt_close, .alloc = dspk__gpurt_alloc,                      \
  .free = dspk__gpurt_free, .write = dspk__gpurt_write,                        \
  .read = dspk__gpurt_read, .fence_record = dspk__gpurt_fence_record,          \
  .fence_query = dspk__gpurt_table_fence_query,                                \
  .fence_wait = dspk__gpurt_table_fence_wait,                                  \
  .fence_destroy = dspk__gpurt_fence_destroy, .sync = dspk__gpurt_sync,        \
  .host_register = dspk__gpurt_host_register,                                  \
  .host_unregister = dspk__gpurt_host_unregister,                              \
  .host_alloc = dspk__gpurt_host_alloc, .host_free = dspk__gpurt_host_free,   \
  .trim = dspk__gpurt_trim, .settle = dspk__gpurt_settle,                     \
  .caps = dspk__gpurt_caps, .run = dspk__gpurt_run_checked,                   \
  .stats = dspk__gpurt_stats

/* A block of device memory.  gen is the context generation it was made in:
 * after a fault rebuilds the context, older blocks are gone. */
struct dspk__mem {
  struct dspk__pool_block *blk;
  dspk__gptr ptr;
  size_t size;
  uint32_t gen;
  /* The block's bytes past size (the pool's rounding) were zeroed, before
   * a raw kernel first got the block (worker.c). */
  int tail_clean;
};

struct dspk__fence {
  dspk__gevent ev;
  uint32_t gen;
};

/* A compiled module of a generated kernel family for one dtype. */
struct dspk__gpurt_module {
  dspk__gmodule mod;
  int loaded;
  char cache_id[DSPK__HASH_HEX]; /* its cache entry, "" when none */
};

/* The pinned staging ring of a device (device.c): every host<->device copy of
 * the backend goes through n chunks of `chunk` bytes of page-locked host
 * memory, used in ring order.  busy[i] says a copy from or into chunk i may
 * be in flight on the stream and ev[i] marks its end: nothing writes or
 * reads the chunk before that event has completed.  host is NULL when
 * staging is off (DSPK_CUDA_STAGE_CHUNKS=0) or could not be allocated; the
 * backend then copies from pageable memory directly. */
#define DSPK__GPURT_STAGE_MAX 64
struct dspk__gpurt_stage {
  unsigned char *host;
  size_t chunk;
  int n, next;
  int broken; /* an in-flight copy lost its event: never reuse host */
  dspk__gevent ev[DSPK__GPURT_STAGE_MAX];
  unsigned char busy[DSPK__GPURT_STAGE_MAX];
  /* Counters (tests, benchmarks): chunks copied each way, and how often a
   * chunk had to wait for its previous copy to finish. */
  uint64_t chunks_h2d, chunks_d2h, waits;
  /* An op was queued since the stream was last seen idle: set by run(),
   * cleared by a synchronize.  Copies alone leave it clear. */
  int work_queued;
};

struct dspk__dev {
  const struct dspk__gpurt_driver *drv;
  int index;
  int ordinal; /* the runtime's device number */
  void *ctx;
  dspk__gstream stream;
  struct dspk__devenv env;
  struct dspk__kcompile_spare kspare; /* clients' compiles (kcompile.h) */
  struct dspk__devinfo info;
  char arch[32];       /* "sm_90", "gfx90a" */
  char rtc_ver[32];    /* the run-time compiler's version: "13.0" */
  int sms;             /* multiprocessors */
  uint32_t gen;        /* context generation, bumped by a rebuild */
  int ctx_dead;        /* a sticky error killed the context */
  char fault[256];     /* the last fault, for the next error message */

  struct dspk__pool pool;
  struct dspk__retire retire;
  struct dspk__plancache fft_plans, contract_plans, raw_modules;
  int sync_on_evict;   /* benchmark switch: barrier instead of retirement */
  int own_kernels;     /* test switch: gemm and fft through our own kernels */
  int64_t gemm_small;  /* products of at most this many multiply-adds: own kernel */

  /* Spare events, so recording a fence costs no cuEventCreate. */
  dspk__gevent spare[64];
  int nspare;

  void *blas; /* the runtime's BLAS handle; NULL: own gemm kernel */
  struct dspk__pool_block *blas_ws;

  struct dspk__gpurt_module mods[DSPK__K_COUNT][DSPK_DTYPE_COUNT];

  /* Benchmark hook: events recorded around the launches of the next
   * contraction (bench/cuda measures GPU busy time with them). */
  dspk__gevent trace_start, trace_end;

  /* The kernel worker (worker.h): raw kernels run in it. */
  int worker_pid, worker_fd, ipc_broken;
  uint64_t worker_starts;
  uint32_t worker_uid; /* the uid (dspk__opctx) whose raw kernels the worker runs */

  uint64_t kernels_compiled, kernel_cache_hits, faults;

  struct dspk__gpurt_stage stage;
  /* Client mappings pinned with host_register (shared-memory buffers,
   * backend host_register): copies from and to them skip the ring. */
  struct { void *p; size_t n; } *hostreg;
  size_t nhostreg, caphostreg;
  /* Page-locked blocks of host_alloc (device.c): in use, or kept for the
   * next results (used 0) up to a bound. */
  struct { void *p; size_t n; int used; } *hostmem;
  size_t nhostmem, caphostmem;
  /* Test hook: the reduction candidate (tune.c) every reduction launches,
   * bypassing autotuning; NULL for the normal choice. */
  const char *reduce_force;
};

/* Formats a driver error "cuX: CUDA_ERROR_Y (text)" into ctx->errmsg
 * (when ctx is not NULL), marks the context dead for sticky errors and
 * returns the dspk_errno for it. */
int dspk__gpurt_err(struct dspk__dev *dev, struct dspk__opctx *ctx,
                   const char *what, int r);
/* The name of driver call `cuname` ("cuEventRecord") in drv's API. */
static inline const char *dspk__gpurt_api(const struct dspk__gpurt_driver *drv, const char *cuname,
                            char *buf, size_t len) {
  if (!drv || !drv->api_prefix || strncmp(cuname, "cu", 2) != 0)
    return cuname;
  for (const char *const *p = drv->api_renames; p && p[0]; p += 2) {
    size_t n = strlen(p[0]);
    if (strncmp(cuname, p[0], n) == 0 && (cuname[n] == 0 || cuname[n] == ' ')) {
      snprintf(buf, len, "%s%s", p[1], cuname + n);
      return buf;
    }
  }
  snprintf(buf, len, "%s%s", drv->api_prefix, cuname + 2);
  return buf;
}

/* Writes a message into ctx->errmsg (when there is one) and returns code. */
#define dspk__gpurt_msg dspk__op_fail

/* Device pointer of a tensor's first element (0 for an empty tensor the
 * daemon placed without memory). */
static inline dspk__gptr dspk__gpurt_ptr(const struct dspk__tensor *t) {
  return t->mem ? t->mem->ptr + t->offset : 0;
}

/* Temporary device memory for one op: from the pool, and handed back through
 * the retirement queue with dspk__gpurt_tmp_free (never released early). */
int dspk__gpurt_tmp_alloc(struct dspk__dev *dev, size_t n,
                         struct dspk__pool_block **out);
void dspk__gpurt_tmp_free(struct dspk__dev *dev, struct dspk__pool_block *b);
/* Hands any resource to the retirement queue, or (sync_on_evict) waits for
 * the stream and releases at once. */
void dspk__gpurt_retire(struct dspk__dev *dev, dspk__retire_release_fn fn,
                       void *ud, void *res);

/* rtc.c.  Compiles src with drv's run-time compiler for dev's arch (or
 * `arch` when dev is NULL: then drv says which runtime) through the kernel
 * cache; writes a malloc'd code object (cubin, hsaco).  cache_id (may be
 * NULL) gets the cache entry's key when the cache holds the code object
 * (dspk__cache_kernel_id), else "": a memo of the loaded module reports its
 * uses with dspk__cache_kernel_used.  Returns 0, DSPK_ECOMPILE with the
 * compiler log in log, or another dspk_errno. */
int dspk__gpurt_compile(const struct dspk__gpurt_driver *drv, struct dspk__dev *dev,
                        const char *arch, const char *name, const char *src, size_t len,
                        void **cubin, size_t *cubin_len, char *log, size_t loglen,
                        char cache_id[DSPK__HASH_HEX]);
/* dspk__gpurt_compile for a client's raw kernel (client: its task; NULL:
 * the daemon's own kernel).  client->owner is in the cache key, so the
 * entry is that uid's alone (a hit tells no one whether another uid
 * compiled the same source), and the compile runs in a child under the
 * limits of backends/common/kcompile.h when dev's env has a compile_exe
 * (DSPK_ELIMIT past them, DSPK_ECANCELED when client->cancel is set). */
int dspk__gpurt_compile_client(const struct dspk__gpurt_driver *drv, struct dspk__dev *dev,
                               const char *arch, const char *name,
                               const struct dspk__opctx *client, const char *src, size_t len,
                               void **cubin, size_t *cubin_len, char *log, size_t loglen,
                               char cache_id[DSPK__HASH_HEX]);
/* Stores a client's module compiled by dspk__gpurt_compile_client (which
 * stores only the daemon's own) in dev's persistent cache, once it has
 * loaded and its entry was found: one the driver refuses would fill the
 * cache with entries that never run.  cache_id as compile_client's. */
void dspk__gpurt_store_client(struct dspk__dev *dev, const char *name,
                              const struct dspk__opctx *client, const char *src, size_t len,
                              const void *cubin, size_t cubin_len,
                              char cache_id[DSPK__HASH_HEX]);
/* The child's side of a client's compile for drv (`EXE --kernel-compile
 * LANG:ARCH`, backends/registry.c): loads the compiler, then
 * dspk__kcompile_serve.  Returns the exit status. */
int dspk__gpurt_compile_main(const struct dspk__gpurt_driver *drv, const char *arch);
/* The function `entry` of a generated family's module for dtype dt,
 * compiling and loading it on first use. */
int dspk__gpurt_kfunc(struct dspk__dev *dev, enum dspk__kfamily f, dspk_dtype dt,
                     const char *entry, dspk__gfunc *out,
                     struct dspk__opctx *ctx);
/* Unloads every generated module (close, rebuild). */
void dspk__gpurt_modules_unload(struct dspk__dev *dev);
/* Launches a 1-D grid-stride kernel over n items (256 threads a block, at
 * most 32 blocks per multiprocessor). */
int dspk__gpurt_launch1d(struct dspk__dev *dev, dspk__gfunc fn, int64_t n,
                        void **args, struct dspk__opctx *ctx);
/* The same with at most per_sm blocks per multiprocessor: 8 (2048
 * threads) is one full wave, which suits streaming kernels whose items
 * are one load and one store (measured on the H200 for fir's gather and
 * scatter: 0.060 against 0.069 ms at 32 blocks). */
int dspk__gpurt_launch1d_wave(struct dspk__dev *dev, dspk__gfunc fn, int64_t n, int per_sm,
                              void **args, struct dspk__opctx *ctx);

/* worker.c.  Runs a raw kernel (op, compiled cubin) in the device's kernel
 * worker process, starting it when needed.  Waits for the kernel. */
int dspk__gpurt_worker_run(struct dspk__dev *dev, struct dspk__op *op,
                          const void *cubin, size_t cubin_len,
                          struct dspk__opctx *ctx);
/* Ends the worker (close). */
void dspk__gpurt_worker_stop(struct dspk__dev *dev);

/* tune.c.  Launches a 1-D grid-stride kernel over n items with the block
 * size the autotune framework chose for (op, shape class, dtype, device),
 * tuning on this launch's data the first time. */
/* The device's identity in cache keys (kernels, autotune decisions); the
 * strings belong to dev. */
struct dspk__cache_devid dspk__gpurt_devid(const struct dspk__dev *dev);
int dspk__gpurt_launch_tuned(struct dspk__dev *dev, dspk__gfunc fn, int64_t n,
                            void **args, const char *op, const char *shape_class,
                            dspk_dtype dt, struct dspk__opctx *ctx);

/* tune.c.  Launches a reduction (backends/kernels/reduce.cu: args are its
 * x, out, descriptor and fn) of nout outputs of nred elements each, inner
 * when the innermost axis is among those reduced, with the kernel and
 * block size the autotune framework chose for the class, tuning on this
 * launch's data the first time when tune is set (only when rerunning is
 * harmless: out does not overlap x).  0 or a dspk_errno. */
int dspk__gpurt_reduce_launch(struct dspk__dev *dev, dspk_dtype dt, int64_t nout,
                             int64_t nred, int inner, void **args, int tune,
                             struct dspk__opctx *ctx);

/* Test hook: makes every reduction launch the candidate named (tune.c:
 * "block128".."block1024", "warp4", "warp8", "thread128", "thread256"), or
 * the tuned choice again with NULL.  Returns 0, or DSPK_EINVAL for a name
 * that is not a candidate. */
int dspk__gpurt_set_reduce_force(struct dspk__dev *dev, const char *name);

/* ops.c */
int dspk__gpurt_run(struct dspk__dev *dev, struct dspk__op *op,
                   struct dspk__opctx *ctx);
void dspk__gpurt_fft_plan_evict(void *ud, void *plan);
/* The cached FFT-library plan of `batch` transforms of kind t along
 * contiguous rows of n input and nout output elements, its stream and work
 * area set; the handle stays valid until the plan cache evicts it. */
int dspk__gpurt_fft_plan(struct dspk__dev *dev, enum dspk__gfft t, long long n,
                         long long nout, long long batch, void **out,
                         struct dspk__opctx *ctx);
/* fir's direct kernel (backends/kernels/fir.cu). */
int dspk__gpurt_fir_direct(struct dspk__dev *dev, struct dspk__op *op,
                           struct dspk__opctx *ctx);

/* fir_fft.c.  fir: the direct kernel or FFT convolution (overlap-save
 * through the runtime's FFT library), chosen by the autotune framework per
 * shape class. */
int dspk__gpurt_fir(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx);
/* Test and benchmark hooks (process-wide; the first in test builds only:
 * DSPK_TEST_HOOKS): force fir's path (-1: the tuned choice, 0: direct,
 * 1..3: overlap-save with blocks of 2^(m+1) times the filter's length
 * rounded up to a power of two, "ols-x4".."ols-x16"), and the name of the
 * path the calling thread's last fir took. */
#ifdef DSPK_TEST_HOOKS
void dspk__gpurt_fir_force(int mode);
#endif
const char *dspk__gpurt_fir_last(void);
void dspk__gpurt_contract_plan_evict(void *ud, void *plan);
void dspk__gpurt_raw_module_evict(void *ud, void *mod);

/* Test and benchmark hooks (declared here, used by tests/cuda and
 * bench/cuda): switch plan eviction to a stream synchronize, and read the
 * compile counters. */
void dspk__gpurt_set_sync_on_evict(struct dspk__dev *dev, int on);
/* Test hook: gemm (and contractions) and fft through our own kernels
 * (kernels/gemm.cu, dft.cu), as on a host without the runtime's BLAS and
 * FFT libraries, even where they are loaded: the GPU suite checks the HIP
 * backend's fallbacks on NVIDIA hardware with it. */
void dspk__gpurt_set_own_kernels(struct dspk__dev *dev, int on);
/* Benchmark and test hook: the largest product (multiply-adds) that takes
 * the tiled kernel where a BLAS is loaded (default: the driver's
 * gemm_small, DSPK__GPURT_GEMM_SMALL on CUDA; 0: every product through the
 * BLAS). */
#define DSPK__GPURT_GEMM_SMALL ((int64_t)1 << 25)
void dspk__gpurt_set_gemm_small(struct dspk__dev *dev, int64_t madds);
void dspk__gpurt_set_trace_events(struct dspk__dev *dev, dspk__gevent start, dspk__gevent end);
/* Benchmark hook: contraction plans made so far (plan cache misses). */
uint64_t dspk__gpurt_contract_misses(struct dspk__dev *dev);
dspk__gstream dspk__gpurt_stream(struct dspk__dev *dev);
/* Replaces dev's staging ring by one of nchunks chunks of chunk bytes
 * (nchunks 0: staging off, pageable copies), after waiting for the copies
 * of the old one.  Returns 0 or a dspk_errno (the ring is then off). */
int dspk__gpurt_stage_config(struct dspk__dev *dev, int nchunks, size_t chunk);
/* Host to device and device to host through the staging ring (or directly
 * when it is off): the backend's write() and read() without their checks,
 * for the backend's own transfers.  stage_write returns once src has been
 * copied (the DMA may still run); stage_read once dst is filled, which also
 * orders it after all work enqueued before.  0 or a dspk_errno. */
int dspk__gpurt_stage_write(struct dspk__dev *dev, dspk__gptr dst,
                           const void *src, size_t n);
int dspk__gpurt_stage_read(struct dspk__dev *dev, void *dst, dspk__gptr src,
                          size_t n);
void *dspk__gpurt_blas(struct dspk__dev *dev);
/* host_register / host_unregister of the backend table: the driver's
 * host_register of a client's mapping, remembered so that
 * dspk__gpurt_stage_write/read DMA straight from and to it; unregister
 * first drains the stream (a copy may still read the pages).  0 or a
 * dspk_errno. */
int dspk__gpurt_host_register(struct dspk__dev *dev, void *p, size_t n);
void dspk__gpurt_host_unregister(struct dspk__dev *dev, void *p);
/* Test hooks (proto/testhook.h) under the driver's prefix:
 * DSPK__GPURT_HOOK(drv, "PLAN_CACHE") is $DSPK_CUDA_PLAN_CACHE (or
 * $DSPK_HIP_...) in a test build, NULL (the name not compiled in)
 * otherwise.  dspk__gpurt_hook_uint reads such a value as a positive integer
 * below 4096, else returns dflt. */
#ifdef DSPK_TEST_HOOKS
const char *dspk__gpurt_hook(const struct dspk__gpurt_driver *drv, const char *name);
#define DSPK__GPURT_HOOK(drv, name) dspk__gpurt_hook(drv, name)
#else
#define DSPK__GPURT_HOOK(drv, name) ((void)(drv), (const char *)NULL)
#endif
unsigned dspk__gpurt_hook_uint(const char *value, unsigned dflt);

#endif /* DSPK_BACKENDS_GPURT_GPURT_H */
