/*
 * fir on the GPU runtimes (cuda, hip): the direct kernel (ops.c,
 * backends/kernels/fir.cu: a thread per output sample, k multiply-adds each)
 * or FFT convolution by overlap-save through the runtime's FFT library
 * (cuFFT, hipFFT; without one, direct only) (O(log L) per sample), chosen by the shared
 * autotune framework per shape class and device.
 *
 * Overlap-save: each row of n samples is cut into blocks of L = 2^lg
 * samples that overlap by k-1 (block b starts at sample b*S - (k-1), S =
 * L-k+1; samples outside the row read as zero).  A real signal (f32, f64):
 * the gather kernel writes the blocks as real rows and, after them, the
 * filter zero-padded and scaled by 1/L (cuFFT's inverse being
 * unnormalised); one batched R2C/D2Z plan makes all their half spectra,
 * the blocks' are multiplied by the filter's, one batched C2R/Z2D plan
 * transforms them back, and the last S samples of each row are scattered
 * into the output.  A complex signal: the same with complex rows and one
 * in-place C2C/Z2Z plan both ways.  Three kernels of
 * backends/kernels/fir.cu and two transforms per task; the kernels run one
 * full wave of blocks (dspk__gpurt_launch1d_wave).  Temporary memory from
 * the pool, retired after the task: the blocks and the filter (real: rows
 * of L samples and of L/2+1 complex values; complex: rows of L).
 *
 * The choice: filters of at most FIR_DIRECT_MAX_K taps are always direct.
 * For longer ones the candidates are "direct" and "ols-x4", "ols-x8",
 * "ols-x16" (L = 4, 8, 16 times the filter's length rounded up to a power
 * of two, at least 64, at most the row's full convolution length rounded
 * up), timed on the task's own operands the first time a shape
 * class (n = 2^a total samples, row = 2^b, k = 2^c taps; op "fir", layout
 * "path") is seen on a device; the decision and every timing persist in
 * the cache like every other autotune decision.  Without a decision (no
 * tuning possible: the output overlaps an input) the heuristic is FFT with
 * ols-x8 from FIR_FFT_MIN_K taps on.
 *
 * Precision: f32 and c64 transform in single precision (error about
 * log2(L) ulps of the largest output, against the direct kernel's double
 * accumulation), f64 and c128 in double.
 */
#include <stdlib.h>

#include "backends/common/fir_tune.h"
#include "backends/gpurt/gpurt.h"

#define HAVE_FFT(dev) ((dev)->drv->fft_name && (dev)->drv->fft_name() && !(dev)->own_kernels)

#define FIR_DIRECT_MAX_K 32 /* taps: always direct */
#define FIR_FFT_MIN_K 128   /* taps: FFT when no decision can be measured */
#define FIR_MAX_LG 30
static _Thread_local const char *fir_last = "";

/* A test hook (proto/testhook.h): a production build has no such global. */
#ifdef DSPK_TEST_HOOKS
static int fir_force = -1;
void dspk__gpurt_fir_force(int mode) {
  fir_force = mode >= 0 && mode < DSPK__FIR_NPATHS ? mode : -1;
}
#else
#define fir_force (-1)
#endif
const char *dspk__gpurt_fir_last(void) { return fir_last; }

static int kfn(struct dspk__dev *dev, dspk_dtype dt, const char *name, dspk__gfunc *fn,
               struct dspk__opctx *ctx) {
  return dspk__gpurt_kfunc(dev, DSPK__K_FIR, dt, name, fn, ctx);
}

static int exec(struct dspk__dev *dev, void *h, enum dspk__gfft type, dspk__gptr in,
                dspk__gptr out, int inverse, struct dspk__opctx *ctx) {
  int s = dev->drv->fft_exec(h, type, in, out, inverse);
  return s == 0 ? 0
                : dspk__gpurt_msg(ctx, DSPK_EDEVICE, "fir: %s exec failed: %d",
                                  dev->drv->fft_name(), s);
}

/* The overlap-save path of complex signals, blocks as in g. */
static int fir_ols_complex(struct dspk__dev *dev, struct dspk__op *op,
                           const struct dspk__fir_geo *g, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk_dtype dt = X->dtype;
  int dbl = dt == DSPK_C128;
  size_t cs = dbl ? 16 : 8;
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int k = (int)(H->shape[0] < n ? H->shape[0] : n);
  struct dspk__pool_block *bb = NULL;
  dspk__gfunc fgat, fmul, fsct;
  void *pb;
  int rc;
  if ((rc = kfn(dev, dt, "dspk_fir_gather", &fgat, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_cmul", &fmul, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_scatter", &fsct, ctx)))
    return rc;
  /* the blocks, then the filter's block */
  if ((rc = dspk__gpurt_tmp_alloc(dev, (size_t)((g->nblk + 1) * g->L) * cs, &bb)))
    return dspk__gpurt_msg(ctx, rc, "fir: no device memory for %lld blocks of %lld samples",
                          (long long)g->nblk, (long long)g->L);
  {
    dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
    dspk__gptr pbb = (dspk__gptr)bb->handle, phs = pbb + (dspk__gptr)(g->nblk * g->L) * cs;
    int64_t L = g->L, S = g->S, nb = g->nb, nblk = g->nblk, tb = g->nblk * g->L;
    int64_t ta = tb + g->L;
    int lg = g->lg;
    enum dspk__gfft type = dbl ? DSPK__GFFT_Z2Z : DSPK__GFFT_C2C;
    float sf = 1.0f / (float)L;
    double sd = 1.0 / (double)L;
    void *agat[11] = {&x, &h, &pbb, &n, &k, &S, &lg, &nb, &nblk,
                      dbl ? (void *)&sd : (void *)&sf, &ta};
    void *amul[4] = {&pbb, &phs, &lg, &tb};
    void *asct[8] = {&pbb, &y, &n, &k, &S, &lg, &nb, &total};
    /* One plan of nblk+1 rows both ways (the filter's row comes back
     * transformed and unused). */
    if ((rc = dspk__gpurt_launch1d_wave(dev, fgat, ta, 8, agat, ctx)) ||
        (rc = dspk__gpurt_fft_plan(dev, type, L, L, g->nblk + 1, &pb, ctx)) ||
        (rc = exec(dev, pb, type, pbb, pbb, 0, ctx)) ||
        (rc = dspk__gpurt_launch1d_wave(dev, fmul, tb, 8, amul, ctx)) ||
        (rc = exec(dev, pb, type, pbb, pbb, 1, ctx)) ||
        (rc = dspk__gpurt_launch1d_wave(dev, fsct, total, 8, asct, ctx)))
      goto out;
  }
out:
  dspk__gpurt_tmp_free(dev, bb);
  return rc;
}

/* The overlap-save path of real signals (f32, f64), blocks as in g: R2C
 * and C2R transforms of real blocks, as one writes it with cuFFT by hand
 * (on the H200, 2^24 samples with 4096 taps in blocks of 16384, R2C 0.067
 * + C2R 0.059 ms against 0.077 + 0.078 ms for complex transforms of blocks
 * packed two to one), the filter's spectrum made by the same transforms
 * (a separate transform of the filter cost 15 to 20 us more). */
static int fir_ols_real(struct dspk__dev *dev, struct dspk__op *op,
                        const struct dspk__fir_geo *g, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk_dtype dt = X->dtype;
  int dbl = dt == DSPK_F64;
  size_t rs = dbl ? 8 : 4;
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t m2 = g->L / 2 + 1, rows = g->nblk + 1; /* the blocks and the filter */
  int k = (int)(H->shape[0] < n ? H->shape[0] : n);
  struct dspk__pool_block *bb = NULL, *ff = NULL;
  dspk__gfunc fgat, fmul, fsct;
  void *pf, *pi;
  int rc;
  if ((rc = kfn(dev, dt, "dspk_fir_rgather", &fgat, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_rcmul", &fmul, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_rscatter", &fsct, ctx)))
    return rc;
  if ((rc = dspk__gpurt_tmp_alloc(dev, (size_t)(rows * g->L) * rs, &bb)) ||
      (rc = dspk__gpurt_tmp_alloc(dev, (size_t)(rows * m2) * 2 * rs, &ff))) {
    rc = dspk__gpurt_msg(ctx, rc, "fir: no device memory for %lld blocks of %lld samples",
                        (long long)g->nblk, (long long)g->L);
    goto out;
  }
  {
    dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
    dspk__gptr pbb = (dspk__gptr)bb->handle, pff = (dspk__gptr)ff->handle;
    dspk__gptr phs = pff + (dspk__gptr)(g->nblk * m2) * 2 * rs;
    int64_t L = g->L, S = g->S, nb = g->nb, nblk = g->nblk, ta = rows * g->L;
    int64_t tf = g->nblk * m2;
    int lg = g->lg;
    enum dspk__gfft fwd = dbl ? DSPK__GFFT_D2Z : DSPK__GFFT_R2C;
    enum dspk__gfft inv = dbl ? DSPK__GFFT_Z2D : DSPK__GFFT_C2R;
    float sf = 1.0f / (float)L;
    double sd = 1.0 / (double)L;
    void *agat[11] = {&x, &h, &pbb, &n, &k, &S, &lg, &nb, &nblk,
                      dbl ? (void *)&sd : (void *)&sf, &ta};
    void *amul[4] = {&pff, &phs, &m2, &tf};
    void *asct[8] = {&pbb, &y, &n, &k, &S, &lg, &nb, &total};
    /* Each plan is executed before the next is looked up, so an eviction
     * retires a plan behind its last use. */
    if ((rc = dspk__gpurt_launch1d_wave(dev, fgat, ta, 8, agat, ctx)) ||
        (rc = dspk__gpurt_fft_plan(dev, fwd, L, m2, rows, &pf, ctx)) ||
        (rc = exec(dev, pf, fwd, pbb, pff, 0, ctx)) ||
        (rc = dspk__gpurt_launch1d_wave(dev, fmul, tf, 8, amul, ctx)) ||
        (rc = dspk__gpurt_fft_plan(dev, inv, L, L, g->nblk, &pi, ctx)) ||
        (rc = exec(dev, pi, inv, pff, pbb, 0, ctx)))
      goto out;
    rc = dspk__gpurt_launch1d_wave(dev, fsct, total, 8, asct, ctx);
  }
out:
  if (bb)
    dspk__gpurt_tmp_free(dev, bb);
  if (ff)
    dspk__gpurt_tmp_free(dev, ff);
  return rc;
}

/* The overlap-save path with blocks of mode m (1..3). */
static int fir_ols(struct dspk__dev *dev, struct dspk__op *op, int m, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t rows = total / n, k = H->shape[0] < n ? H->shape[0] : n;
  struct dspk__fir_geo g;
  int rc;
  if (!HAVE_FFT(dev))
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP, "fir: no FFT library on this %s host",
                           dev->drv->name);
  /* Every block its own row (complex geometry): the real path does not
   * pack two blocks into one. */
  if ((rc = dspk__fir_geometry(n, k, rows, 1, m, FIR_MAX_LG, &g)))
    return dspk__gpurt_msg(ctx, rc, "fir: %lld taps are too many for FFT convolution",
                          (long long)k);
  return dspk__dtype_is_complex(X->dtype) ? fir_ols_complex(dev, op, &g, ctx)
                                          : fir_ols_real(dev, op, &g, ctx);
}

static int run_path(struct dspk__dev *dev, struct dspk__op *op, int c,
                    struct dspk__opctx *ctx) {
  fir_last = dspk__fir_path_names[c];
  return c == 0 ? dspk__gpurt_fir_direct(dev, op, ctx) : fir_ols(dev, op, c, ctx);
}

/* Waits for what a path enqueued (the autotune candidates run to
 * completion). */
static int finish(struct dspk__dev *dev, int rc) {
  if (rc)
    return rc;
  return dev->drv->stream_sync(dev->stream) == 0 ? 0 : DSPK_EDEVICE;
}

static int lost(struct dspk__dev *dev) { return dev->ctx_dead; }

/* Whether the output shares memory with an input (tuning reruns the op on
 * the task's operands, which is harmless only when it does not). */
static int overlaps(const struct dspk__op *op) {
  const struct dspk__tensor *Y = &op->out[0];
  dspk__gptr y = dspk__gpurt_ptr(Y), ye = y + dspk__tensor_nbytes(Y);
  for (int i = 0; i < 2; i++) {
    dspk__gptr a = dspk__gpurt_ptr(&op->in[i]), ae = a + dspk__tensor_nbytes(&op->in[i]);
    if (a < ye && y < ae)
      return 1;
  }
  return 0;
}

int dspk__gpurt_fir(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t k = op->in[1].shape[0] < n ? op->in[1].shape[0] : n;
  if (op->in[1].shape[0] > INT32_MAX)
    return dspk__gpurt_msg(ctx, DSPK_ELIMIT, "fir: H has more than 2^31-1 taps");
  if (total == 0)
    return 0;
  if (fir_force >= 0)
    return run_path(dev, op, fir_force, ctx);
  if (k <= FIR_DIRECT_MAX_K || !HAVE_FFT(dev))
    return run_path(dev, op, 0, ctx);
  if (!overlaps(op)) {
    static const struct dspk__fir_ops ops = {run_path, finish, lost};
    int rc = dspk__fir_tuned(dev, op, dev->env.cache, dspk__gpurt_devid(dev), &ops, ctx);
    if (rc <= 0)
      return rc;
  }
  return run_path(dev, op, k >= FIR_FFT_MIN_K ? 2 : 0, ctx);
}
