/*
 * What the GPU backends' fir (backends/gpurt/fir_fft.c,
 * backends/vulkan/vk_fir.c) share: the four paths ("direct", then
 * overlap-save with blocks of 4, 8 or 16 times the filter's length,
 * "ols-x4", "ols-x8", "ols-x16"), the block layout of an overlap-save run,
 * and the choice of a path by the autotune framework (autotune.h) on the
 * task's own operands, per shape class (n = 2^a total samples, row = 2^b,
 * k = 2^c taps; op "fir", layout "path") and device.
 */
#ifndef DSPK_BACKENDS_COMMON_FIR_TUNE_H
#define DSPK_BACKENDS_COMMON_FIR_TUNE_H

#include <stdint.h>

#include "backends/op.h"
#include "cache/cache.h"

#define DSPK__FIR_NPATHS 4 /* direct, ols-x4, ols-x8, ols-x16 */
#define DSPK__FIR_MIN_LG 6 /* blocks of at least 64 samples */

struct dspk__dev;

/* The paths' names, also the autotune candidates' names. */
extern const char *const dspk__fir_path_names[DSPK__FIR_NPATHS];

/* The block layout of one overlap-save run: blocks of L = 2^lg samples
 * overlapping by k-1 (S = L-k+1 new samples each), nb blocks per row, nblk
 * in all, each transformed as one complex row of its own (a real signal's
 * with imaginary parts 0).  Never two blocks to a transform: the rounding
 * of a transform scales with all of its values, so a block's outputs
 * would carry an error relative to the other block's largest sample (1e20
 * in one block made the next one's outputs, of order 100, wrong by 1e13:
 * probe 15, B 1). */
struct dspk__fir_geo {
  int lg;
  int64_t L, S, nb, nblk;
};

/* Layout for rows of n samples, k taps (k <= n), path m (1..3: blocks of
 * 2^(m+1) times k rounded up to a power of two, at least 2^DSPK__FIR_MIN_LG,
 * at most the row's full convolution length rounded up).  Returns 0, or
 * DSPK_ELIMIT when the blocks would need more than 2^max_lg samples. */
int dspk__fir_geometry(int64_t n, int64_t k, int64_t rows, int m, int max_lg,
                       struct dspk__fir_geo *g);

/* How a backend runs a path of the op. */
struct dspk__fir_ops {
  /* Runs path c (an index of dspk__fir_path_names) of op, as the task does
   * (enqueued on the device). */
  int (*run)(struct dspk__dev *d, struct dspk__op *op, int c, struct dspk__opctx *ctx);
  /* Waits for the work run enqueued; rc is run's result.  Returns the
   * candidate's result. */
  int (*finish)(struct dspk__dev *d, int rc);
  /* Optional: whether the device was lost, so that a failed winner is not
   * replaced by another candidate. */
  int (*lost)(struct dspk__dev *d);
  /* Optional: runs path c reps times as run does, between two timestamps
   * of the device, waits for them, and writes the device's time for the
   * reps runs in ns.  Returns 0, run's error, or 1 when the device has no
   * timestamps (nothing ran; the tuner then times run and finish by the
   * clock). */
  int (*timed)(struct dspk__dev *d, struct dspk__op *op, int c, int reps,
               struct dspk__opctx *ctx, uint64_t *ns);
};

/*
 * Runs op by the path the autotune framework chooses for its shape class on
 * this device (tuning the candidates on the task's operands the first
 * time: the overlap-save paths first, then the direct one, each sample
 * four runs and one wait, timed by the device's timestamps where ops
 * offers them, with the task's cancel and progress hooks);
 * a winner that fails, except the direct path, is reported to the framework
 * and the choice made again.  Returns the run's result, DSPK_ECANCELED
 * (with a message in ctx) when the tuning was canceled, or 1 when there is
 * no decision (the caller runs its heuristic).  The output must not overlap
 * an input: the candidates rerun the op on the task's operands.
 */
int dspk__fir_tuned(struct dspk__dev *d, struct dspk__op *op, struct dspk__cache *cache,
                    struct dspk__cache_devid devid, const struct dspk__fir_ops *ops,
                    struct dspk__opctx *ctx);

/* Whether the calling thread is running a candidate's sample for the
 * tuner.  The FFT path then skips its repair of non-finite segments
 * (vk_fir.c, gpurt/fir_fft.c), so that NaNs in the task's operands (a NaN
 * tap costs the direct sum on every row) do not make the overlap-save
 * candidates look as slow as the direct one and fix "direct" for the
 * whole shape class; the task's own run after the choice repairs. */
int dspk__fir_sampling(void);

/* The candidates' hash in the path decisions' cache key (tests read the
 * decision with it). */
uint64_t dspk__fir_tune_cands_hash(void);

#endif /* DSPK_BACKENDS_COMMON_FIR_TUNE_H */
