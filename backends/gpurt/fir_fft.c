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
 * full wave of blocks (dspk__gpurt_launch1d_wave), with 32-bit indices
 * wherever the sizes allow.  Temporary memory from
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
 * Non-finite values: one NaN or Inf in a block's samples (or in a tap)
 * makes every output of its transforms non-finite, and finite samples
 * whose transforms overflow (3e38 times taps of 1e-6: an exact result of
 * 9e34) do the same, where the direct sum is non-finite only at the
 * outputs the value reaches (x[i] reaches y[i..i+k-1]), or nowhere.  So
 * the scatter lists each segment (the S outputs of one block) in which it
 * writes a NaN or an Inf (a count, a flag per block and the list, after
 * the blocks in the same temporary; count and flags cleared by a memset on
 * the stream), and dspk_fir_fix computes the listed segments again by the
 * direct sum, all on the stream: no wait on the host.  The result is the
 * direct sum's wherever that is finite, and non-finite exactly where it
 * is; a NaN sample costs its block's segment, a NaN tap the whole row, and
 * finite data a memset of nblk+1 words and one launch of a few hundred
 * blocks that read a count of zero.  The same design as vk_fir.c and the
 * cpu's overlap-add (backends/cpu/fir.c).  The repair reads X after Y is
 * written: the daemon never hands a fir an output that overlaps an input
 * (it computes such an output into a block of its own, daemon/task.c).
 *
 * Precision: f32 and c64 transform in single precision (error about
 * log2(L) ulps of the largest output, against the direct kernel's double
 * accumulation), f64 and c128 in double.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backends/common/fir_tune.h"
#include "backends/gpurt/gpurt.h"
#include "proto/testhook.h"

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

/* The kernels' integer arguments, 64-bit and 32-bit (the kernels of
 * backends/kernels/fir.cu come in both widths; see w32). */
struct fir_ints {
  int w32; /* every index below 2^31: the 32-bit kernels */
  int lg;
  int64_t n, k, S, nb, nblk, ta, tm, total, m2;
  unsigned un, uk, uS, unb, unblk, uta, utm, utotal, um2;
};

/* Fills a for blocks g, n samples a row, k taps, total samples, ta
 * gathered and tm multiplied values, half spectra of m2 values. */
static void fir_ints(struct fir_ints *a, const struct dspk__fir_geo *g, int64_t n, int64_t k,
                     int64_t total, int64_t ta, int64_t tm, int64_t m2) {
  const int64_t lim = (int64_t)1 << 31;
  *a = (struct fir_ints){.w32 = ta < lim && total < lim, .lg = g->lg, .n = n, .k = k,
                         .S = g->S, .nb = g->nb, .nblk = g->nblk, .ta = ta, .tm = tm,
                         .total = total, .m2 = m2};
  a->un = (unsigned)n, a->uk = (unsigned)k, a->uS = (unsigned)g->S, a->unb = (unsigned)g->nb;
  a->unblk = (unsigned)g->nblk, a->uta = (unsigned)ta, a->utm = (unsigned)tm;
  a->utotal = (unsigned)total, a->um2 = (unsigned)m2;
  if (DSPK_TEST_HOOK("DSPK_GPURT_FIR_WIDE")) /* tests: the 64-bit kernels at any size */
    a->w32 = 0;
}
#define FIR_INT(a, f) ((a)->w32 ? (void *)&(a)->u##f : (void *)&(a)->f)

/* The path's three kernels (prefix "dspk_fir_" or "dspk_fir_r"), in the
 * width of a. */
static int fir_kernels(struct dspk__dev *dev, dspk_dtype dt, const char *pre,
                       const struct fir_ints *a, dspk__gfunc fn[3], struct dspk__opctx *ctx) {
  static const char *const what[3] = {"gather", "cmul", "scatter"};
  char name[48];
  int rc = 0;
  for (int i = 0; i < 3 && rc == 0; i++) {
    snprintf(name, sizeof name, "%s%s%s", pre, what[i], a->w32 ? "32" : "");
    rc = kfn(dev, dt, name, &fn[i], ctx);
  }
  return rc;
}

/* The bytes of the list of non-finite segments for blocks g: a count, a
 * flag per block and a slot per block (backends/kernels/fir.cu). */
static size_t list_bytes(const struct dspk__fir_geo *g) {
  return 4 * (1 + 2 * (size_t)g->nblk);
}

/* Clears the list's count and flags at fl before the scatter lists
 * anything. */
static int clear_list(struct dspk__dev *dev, dspk__gptr fl, const struct dspk__fir_geo *g,
                      struct dspk__opctx *ctx) {
  int r = dev->drv->memset_async(fl, 0, 4 * (1 + (size_t)g->nblk), dev->stream);
  return r ? dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r) : 0;
}

/* The repair of non-finite segments (see the top of the file; skipped in
 * the tuner's samples, see dspk__fir_sampling): the direct sum on the
 * segments the scatter listed in fl, on the stream (no wait on the host),
 * by at most 4 blocks per multiprocessor, each of which reads a count of
 * zero and ends when nothing is listed. */
static int fix_flagged(struct dspk__dev *dev, struct dspk__op *op, dspk__gptr fl,
                       const struct dspk__fir_geo *g, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
  int64_t n = X->shape[X->rank - 1], S = g->S, nb = g->nb, nblk = g->nblk;
  int k = (int)(H->shape[0] < n ? H->shape[0] : n);
  void *args[9] = {&x, &h, &y, &n, &k, &fl, &S, &nb, &nblk};
  dspk__gfunc fn;
  int rc = kfn(dev, X->dtype, "dspk_fir_fix", &fn, ctx);
  /* one item per (segment, chunk of 256 outputs) pair, were all listed */
  return rc ? rc
            : dspk__gpurt_launch1d_wave(dev, fn, nblk * ((S + 255) / 256) * 256, 4, args, ctx);
}

/* The overlap-save path of complex signals, blocks as in g. */
static int fir_ols_complex(struct dspk__dev *dev, struct dspk__op *op,
                           const struct dspk__fir_geo *g, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk_dtype dt = X->dtype;
  int dbl = dt == DSPK_C128;
  size_t cs = dbl ? 16 : 8;
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t k = H->shape[0] < n ? H->shape[0] : n;
  struct dspk__pool_block *bb = NULL;
  struct fir_ints a;
  dspk__gfunc fn[3];
  void *pb;
  int rc;
  fir_ints(&a, g, n, k, total, (g->nblk + 1) * g->L, g->nblk * g->L, 0);
  if ((rc = fir_kernels(dev, dt, "dspk_fir_", &a, fn, ctx)))
    return rc;
  /* the blocks, then the filter's block, then the list (fix_flagged) */
  if ((rc = dspk__gpurt_tmp_alloc(dev, (size_t)a.ta * cs + list_bytes(g), &bb)))
    return dspk__gpurt_msg(ctx, rc, "fir: no device memory for %lld blocks of %lld samples",
                          (long long)g->nblk, (long long)g->L);
  {
    dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
    dspk__gptr pbb = (dspk__gptr)bb->handle, phs = pbb + (dspk__gptr)a.tm * cs;
    dspk__gptr pfl = pbb + (dspk__gptr)a.ta * cs;
    enum dspk__gfft type = dbl ? DSPK__GFFT_Z2Z : DSPK__GFFT_C2C;
    float sf = 1.0f / (float)g->L;
    double sd = 1.0 / (double)g->L;
    void *agat[11] = {&x, &h, &pbb, FIR_INT(&a, n), FIR_INT(&a, k), FIR_INT(&a, S), &a.lg,
                      FIR_INT(&a, nb), FIR_INT(&a, nblk), dbl ? (void *)&sd : (void *)&sf,
                      FIR_INT(&a, ta)};
    void *amul[4] = {&pbb, &phs, &a.lg, FIR_INT(&a, tm)};
    void *asct[10] = {&pbb, &y, &pfl, FIR_INT(&a, n), FIR_INT(&a, k), FIR_INT(&a, S), &a.lg,
                      FIR_INT(&a, nb), FIR_INT(&a, nblk), FIR_INT(&a, total)};
    /* One plan of nblk+1 rows both ways (the filter's row comes back
     * transformed and unused). */
    if ((rc = dspk__gpurt_launch1d_wave(dev, fn[0], a.ta, 8, agat, ctx)) == 0 &&
        (rc = dspk__gpurt_fft_plan(dev, type, g->L, g->L, g->nblk + 1, &pb, ctx)) == 0 &&
        (rc = exec(dev, pb, type, pbb, pbb, 0, ctx)) == 0 &&
        (rc = dspk__gpurt_launch1d_wave(dev, fn[1], a.tm, 8, amul, ctx)) == 0 &&
        (rc = exec(dev, pb, type, pbb, pbb, 1, ctx)) == 0 &&
        (rc = clear_list(dev, pfl, g, ctx)) == 0 &&
        (rc = dspk__gpurt_launch1d_wave(dev, fn[2], total, 8, asct, ctx)) == 0)
      rc = dspk__fir_sampling() ? 0 : fix_flagged(dev, op, pfl, g, ctx);
  }
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
  int64_t k = H->shape[0] < n ? H->shape[0] : n;
  struct dspk__pool_block *bb = NULL, *ff = NULL;
  struct fir_ints a;
  dspk__gfunc fn[3];
  void *pf, *pi;
  int rc;
  fir_ints(&a, g, n, k, total, rows * g->L, g->nblk * m2, m2);
  if ((rc = fir_kernels(dev, dt, "dspk_fir_r", &a, fn, ctx)))
    return rc;
  if ((rc = dspk__gpurt_tmp_alloc(dev, (size_t)a.ta * rs + list_bytes(g), &bb)) ||
      (rc = dspk__gpurt_tmp_alloc(dev, (size_t)(rows * m2) * 2 * rs, &ff))) {
    rc = dspk__gpurt_msg(ctx, rc, "fir: no device memory for %lld blocks of %lld samples",
                        (long long)g->nblk, (long long)g->L);
    goto out;
  }
  {
    dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
    dspk__gptr pbb = (dspk__gptr)bb->handle, pff = (dspk__gptr)ff->handle;
    dspk__gptr phs = pff + (dspk__gptr)a.tm * 2 * rs, pfl = pbb + (dspk__gptr)a.ta * rs;
    enum dspk__gfft fwd = dbl ? DSPK__GFFT_D2Z : DSPK__GFFT_R2C;
    enum dspk__gfft inv = dbl ? DSPK__GFFT_Z2D : DSPK__GFFT_C2R;
    float sf = 1.0f / (float)g->L;
    double sd = 1.0 / (double)g->L;
    void *agat[11] = {&x, &h, &pbb, FIR_INT(&a, n), FIR_INT(&a, k), FIR_INT(&a, S), &a.lg,
                      FIR_INT(&a, nb), FIR_INT(&a, nblk), dbl ? (void *)&sd : (void *)&sf,
                      FIR_INT(&a, ta)};
    void *amul[4] = {&pff, &phs, FIR_INT(&a, m2), FIR_INT(&a, tm)};
    void *asct[10] = {&pbb, &y, &pfl, FIR_INT(&a, n), FIR_INT(&a, k), FIR_INT(&a, S), &a.lg,
                      FIR_INT(&a, nb), FIR_INT(&a, nblk), FIR_INT(&a, total)};
    /* Each plan is executed before the next is looked up, so an eviction
     * retires a plan behind its last use. */
    if ((rc = dspk__gpurt_launch1d_wave(dev, fn[0], a.ta, 8, agat, ctx)) == 0 &&
        (rc = dspk__gpurt_fft_plan(dev, fwd, g->L, m2, rows, &pf, ctx)) == 0 &&
        (rc = exec(dev, pf, fwd, pbb, pff, 0, ctx)) == 0 &&
        (rc = dspk__gpurt_launch1d_wave(dev, fn[1], a.tm, 8, amul, ctx)) == 0 &&
        (rc = dspk__gpurt_fft_plan(dev, inv, g->L, g->L, g->nblk, &pi, ctx)) == 0 &&
        (rc = exec(dev, pi, inv, pff, pbb, 0, ctx)) == 0 &&
        (rc = clear_list(dev, pfl, g, ctx)) == 0 &&
        (rc = dspk__gpurt_launch1d_wave(dev, fn[2], total, 8, asct, ctx)) == 0)
      rc = dspk__fir_sampling() ? 0 : fix_flagged(dev, op, pfl, g, ctx);
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
  /* Every block its own row (see dspk__fir_geo). */
  if ((rc = dspk__fir_geometry(n, k, rows, m, FIR_MAX_LG, &g)))
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
    static const struct dspk__fir_ops ops = {.run = run_path, .finish = finish, .lost = lost};
    int rc = dspk__fir_tuned(dev, op, dev->env.cache, dspk__gpurt_devid(dev), &ops, ctx);
    if (rc <= 0)
      return rc;
  }
  return run_path(dev, op, k >= FIR_FFT_MIN_K ? 2 : 0, ctx);
}
