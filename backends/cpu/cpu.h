/*
 * Internal header of the cpu backend (backends/cpu/): the device and memory
 * structs, one entry point per op (one file each), and the choice points the
 * autotuner (issue 3) replaces with measured decisions:
 *
 *   dspk__cpu_fft_flags()     FFTW planning flags (FFTW_ESTIMATE for now)
 *   dspk__cpu_fir_use_fft()   fir: direct or FFT-based convolution
 *   dspk__cpu_gemm_threads()  gemm/contract: OpenBLAS thread count
 *
 * The cpu runs every op synchronously on the runner thread, so fences are
 * always complete and free() releases at once.  Neither fftw3.h nor cblas.h
 * is included here: files that need both include fftw3.h first, because
 * OpenBLAS's cblas.h pulls in complex.h, which changes fftw_complex.
 */
#ifndef DSPK_BACKENDS_CPU_CPU_H
#define DSPK_BACKENDS_CPU_CPU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/common/pool.h"

extern const struct dspk__backend dspk__backend_cpu;

struct dspk__mem {
  void *ptr;   /* 64-byte aligned (2 MiB for large blocks) */
  size_t size; /* usable bytes */
  struct dspk__pool_block *blk; /* large blocks: the pool's; else NULL */
  int foreign; /* import_host: ptr is a client's mapping, not ours to free */
  int used;    /* may hold earlier bytes (a cached block, the heap's memory) */
};

/* Blocks of at least this size come from the device's pool of 2 MiB
 * aligned mappings advised for transparent huge pages (cpu.c). */
#define DSPK__CPU_BIG_BLOCK ((size_t)2 << 20)
/* Bytes of freed large blocks the pool keeps for reuse. */
#define DSPK__CPU_POOL_CACHED ((size_t)256 << 20)

/* Kinds of FFTW plan kept in the device's plan cache. */
enum dspk__cpu_fft_kind {
  DSPK__CPU_FFT_FWD, /* complex to complex, forward */
  DSPK__CPU_FFT_BWD, /* complex to complex, backward (unnormalised) */
  DSPK__CPU_FFT_R2C, /* real to half complex */
  DSPK__CPU_FFT_C2R  /* half complex to real (destroys its input) */
};

struct dspk__cpu_plan {
  int kind, dbl, inplace, aligned; /* dbl: double precision */
  int n, batch;
  void *plan; /* fftw_plan or fftwf_plan */
  uint64_t last_use;
};

#define DSPK__CPU_PLANS 32

struct dspk__dev {
  struct dspk__devenv env;
  uint64_t bytes_in_use;
  /* FFTW plans keyed by (kind, precision, n, batch, in-place, aligned),
   * reused across tasks; least recently used evicted when full. */
  struct dspk__cpu_plan plans[DSPK__CPU_PLANS];
  int nplans;
  uint64_t plan_clock;
  uint64_t plans_made, plan_hits;
  /* fir path: -1 automatic (dspk__cpu_fir_use_fft), 0 direct, 1 FFT.  Tests
   * and the autotuner set it. */
  int fir_force;
  /* FFTW planner flags for new plans, an override for tests and benches;
   * 0 (which is also FFTW_MEASURE's value) leaves the choice to
   * dspk__cpu_fft_flags().  dspk__cpu_fft_release() drops plans made with
   * earlier flags. */
  unsigned fft_flags;
  /* OpenBLAS threads for gemm/contract, an override; 0 leaves the choice to
   * dspk__cpu_gemm_threads(). */
  int gemm_threads;
  /* gemm's speed per BLAS routine (dspk__cpu_gemm_slot: s, d, c, z gemm;
   * f64 runs at about half f32's speed, so neither predicts the other), in
   * multiply-adds per second, 0 before the first measurement: gemm_rate as
   * last measured (it sizes the tiles, gemm.c), gemm_rate_best the fastest
   * measured (a product that takes at most 10 ms at this speed runs in one
   * BLAS call). */
  double gemm_rate[4];
  double gemm_rate_best[4];
  /* Set when a plan was measured: its wisdom goes to the cache after the
   * op (dspk__cpu_fft_wisdom_flush). */
  int wisdom_dirty;
  /* Plans of 2^16 points or more that no stored wisdom answers are made
   * with FFTW_ESTIMATE at once and measured in full by a background thread
   * (fft.c, "background measuring"); the measured plan replaces the
   * estimated one at the start of the device's next op.  NULL until the
   * first such plan. */
  struct dspk__cpu_refine *refine;
  uint64_t plans_refined; /* measured plans swapped in */
  /* The running op's context (cpu_run), for waits that must see a cancel:
   * the FFTW planner lock while a background measuring holds it, a plan
   * measured for the op; and its kind (the progress of such a measuring
   * names it). */
  struct dspk__opctx *ctx;
  dspk_op op_kind;
  /* Large blocks (DSPK__CPU_BIG_BLOCK and up), cached after free for the
   * next alloc of their size class, under pool_mu. */
  struct dspk__pool pool;
  pthread_mutex_t pool_mu;
};

/* The address of a tensor's first element (NULL for an empty tensor that
 * was given no memory). */
static inline void *dspk__cpu_ptr(const struct dspk__tensor *t) {
  return t->mem ? (char *)t->mem->ptr + t->offset : NULL;
}

/* Writes a message into ctx->errmsg (when there is one) and returns code. */
#define dspk__cpu_err dspk__op_fail

/* 1 when the client asked to cancel the task. */
int dspk__cpu_canceled(const struct dspk__opctx *ctx);

/* The ops: each returns 0 or a negative dspk_errno (message in ctx).  A new
 * op's cpu implementation is declared here and listed in DSPK__CPU_OPS,
 * which cpu_run (cpu.c) dispatches on; an op it lacks is ENOTSUP. */
typedef int dspk__cpu_op_fn(struct dspk__dev *dev, struct dspk__op *op,
                            struct dspk__opctx *ctx);
dspk__cpu_op_fn dspk__cpu_gemm, dspk__cpu_fft, dspk__cpu_fir, dspk__cpu_contract,
    dspk__cpu_reduce, dspk__cpu_map;
#define DSPK__CPU_OPS                                                          \
  {                                                                            \
    [DSPK_OP_GEMM] = dspk__cpu_gemm, [DSPK_OP_FFT] = dspk__cpu_fft,            \
    [DSPK_OP_FIR] = dspk__cpu_fir, [DSPK_OP_CONTRACT] = dspk__cpu_contract,    \
    [DSPK_OP_REDUCE] = dspk__cpu_reduce, [DSPK_OP_MAP] = dspk__cpu_map,        \
  }

/* Batched, contiguous row-major C[b] = A[b] @ B[b] (A: M x K, B: K x N,
 * C: M x N, beta 0) for f32/f64/c64/c128, each product in BLAS calls sized
 * as gemm's (gemm.c), polling cancel between them.  Returns 0,
 * DSPK_ECANCELED or DSPK_EDTYPE. */
int dspk__cpu_gemm_batched(struct dspk__dev *dev, dspk_dtype dt, int64_t batch,
                           int64_t M, int64_t N, int64_t K, const void *A,
                           const void *B, void *C, struct dspk__opctx *ctx);

/* Choice point: OpenBLAS threads for one gemm of this size, or 0 to leave
 * the library's default: dev->gemm_threads when set, else measured
 * (backends/cpu/tune.h) when the device has a cache, else 0. */
int dspk__cpu_gemm_threads(struct dspk__dev *dev, dspk_dtype dt, int64_t M,
                           int64_t N, int64_t K, int64_t batch);

/* Choice point: FFTW planner flags: dev->fft_flags when set, else
 * FFTW_MEASURE when the device has a cache (wisdom is loaded at open and
 * saved after each new plan), else FFTW_ESTIMATE.  Planning never touches
 * the task's data: plans are made on scratch arrays, so MEASURE is safe. */
unsigned dspk__cpu_fft_flags(struct dspk__dev *dev, int kind, int dbl, int n,
                             int batch);

/* Returns the cached or a new plan for `batch` contiguous transforms of
 * length n (kind as above; R2C/C2R complex side has n/2+1 elements), for
 * arrays whose alignment matches `aligned` (fftw_alignment_of()==0).  The
 * device owns the plan.  NULL when FFTW cannot plan, or when the running
 * op (dev->ctx) was canceled while waiting for the planner lock (callers
 * check dspk__cpu_canceled). */
void *dspk__cpu_fft_plan(struct dspk__dev *dev, int kind, int dbl, int n,
                         int batch, int inplace, int aligned);

/* Executes plan (from dspk__cpu_fft_plan) on in/out with FFTW's new-array
 * execute functions; the arrays must match the plan's alignment. */
void dspk__cpu_fft_exec(int kind, int dbl, void *plan, void *in, void *out);
/* Stores FFTW's wisdom in the device's cache when a plan was measured
 * since the last call (best effort; takes the FFTW lock). */
void dspk__cpu_fft_wisdom_flush(struct dspk__dev *dev);
/* 1 when p has the alignment FFTW's SIMD plans want. */
int dspk__cpu_fft_aligned(int dbl, const void *p);

/* Power-of-two scaling of the data of FFTW's transforms (scale.c): data
 * whose largest magnitude lies outside [2^-E, 2^E], E = DSPK__CPU_SCALE_EXP
 * (60 for f32 and c64, 900 for f64 and c128), are transformed multiplied by
 * 2^dspk__cpu_scale_exp() and the results multiplied back, so that neither
 * subnormal data lose bits in the intermediates nor huge data overflow
 * there.  Inside that range the intermediates stay well inside the normal
 * range (lengths below 2^31) and nothing is scaled. */
#define DSPK__CPU_SCALE_EXP(DBL) ((DBL) ? 900 : 60)
/* The e such that m * 2^e lies in [1/2, 1), or 0 where m is 0, not finite,
 * or inside [2^-DSPK__CPU_SCALE_EXP, 2^DSPK__CPU_SCALE_EXP]. */
int dspk__cpu_scale_exp(double m, int dbl);
/* The largest magnitude among n floats (dbl 0) or doubles, a NaN larger
 * than any (so a row with a NaN or an infinity gives a non-finite value,
 * and dspk__cpu_scale_exp() 0). */
double dspk__cpu_absmax(const void *v, int64_t n, int dbl);
/* v[i] *= 2^e for n floats (dbl 0) or doubles, each rounded once (through
 * the subnormals). */
void dspk__cpu_scale2(void *v, int64_t n, int dbl, int e);
/* x * 2^e, rounded once to R (float or double). */
#define DSPK__CPU_SCALE2(DBL, R, v, e)                                         \
  ((DBL) ? (R)ldexp((double)(v), (e)) : (R)ldexpf((float)(v), (e)))

/* Process-wide lock around FFTW's planner (not thread-safe): plan creation,
 * destruction and wisdom import/export must hold it. */
void dspk__cpu_fftw_lock(void);
void dspk__cpu_fftw_unlock(void);

/* Frees every cached plan of dev and what background measuring made; a
 * measuring in progress is not waited for (its thread frees its own). */
void dspk__cpu_fft_release(struct dspk__dev *dev);
/* At the start of an op (cpu_run): swaps the plans that background
 * measuring finished into the plan cache and stores the new wisdom. */
void dspk__cpu_fft_adopt(struct dspk__dev *dev);
/* Waits until no background measuring is queued or running (tests,
 * benches); returns the number of measured plans waiting for adoption. */
int dspk__cpu_fft_refine_wait(struct dspk__dev *dev);
/* The index of dt's BLAS routine in dev->gemm_rate: 0 f32 (and the f16 and
 * bf16 widened to it), 1 f64, 2 c64, 3 c128. */
static inline int dspk__cpu_gemm_slot(dspk_dtype dt) {
  return dt == DSPK_F64 ? 1 : dt == DSPK_C64 ? 2 : dt == DSPK_C128 ? 3 : 0;
}

#ifdef DSPK_TEST_HOOKS
/* Test hook: seconds added to the clock gemm's tiles are timed with, so
 * that a test can make BLAS calls look as slow as on a loaded machine
 * (gemm.c; the runner thread's only). */
extern double dspk__cpu_gemm_clock_skew;
/* Test hook: while closed (1), a background measuring thread waits before
 * it starts measuring, so a test can hold one alive for as long as it
 * needs. */
void dspk__cpu_fft_refine_gate(int closed);
#endif

/* Stops OpenBLAS's worker threads, which busy-wait (sched_yield) for 2^28
 * cycles (~0.13 s at 2 GHz) after they start at library load, so that the
 * first tasks after a daemon start do not compete with them for the cores.
 * Acts once per process (later calls return at once), and must run before
 * any BLAS call (device open).  The next gemm starts the pool again, from a
 * thread named "dspk-blas" rather than the runner.  A BLAS without those
 * entry points is left alone. */
void dspk__cpu_blas_idle(void);

/* Choice point: 1 to filter with FFT convolution, 0 for the direct loop,
 * for `batch` rows of n samples and k taps: measured per shape class
 * (backends/cpu/tune.h) when the device has a cache, else a heuristic.
 * DSPK_ECANCELED when the task was canceled during a measurement. */
int dspk__cpu_fir_use_fft(struct dspk__dev *dev, dspk_dtype dt, int64_t n,
                          int64_t k, int64_t batch, struct dspk__opctx *ctx);

#endif /* DSPK_BACKENDS_CPU_CPU_H */
