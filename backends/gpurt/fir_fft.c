/*
 * fir on the GPU runtimes (cuda, hip): the direct kernel (ops.c,
 * backends/kernels/fir.cu: a thread per output sample, k multiply-adds each)
 * or FFT convolution by overlap-save through the runtime's FFT library
 * (cuFFT, hipFFT; without one, direct only) (O(log L) per sample), chosen by the shared
 * autotune framework per shape class and device.
 *
 * Overlap-save: each row of n samples is cut into blocks of L = 2^lg
 * samples that overlap by k-1 (block b starts at sample b*S - (k-1), S =
 * L-k+1; samples outside the row read as zero).  The blocks are gathered
 * into one buffer (complex; a real signal packs two consecutive blocks into
 * the real and imaginary parts of one, which the real filter keeps apart),
 * transformed by one batched in-place C2C/Z2Z cuFFT plan, multiplied by the
 * transform of the zero-padded filter (scaled by 1/L, cuFFT's inverse being
 * unnormalised), transformed back, and the last S samples of each block are
 * scattered into the output.  Four kernels of backends/kernels/fir.cu and
 * three transforms per task; temporary memory: (blocks x L) complex values
 * and L more for the filter, from the pool, retired after the task.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/gpurt/gpurt.h"

#define HAVE_FFT(dev) ((dev)->drv->fft_name && (dev)->drv->fft_name() && !(dev)->own_kernels)

#define FIR_DIRECT_MAX_K 32 /* taps: always direct */
#define FIR_FFT_MIN_K 128   /* taps: FFT when no decision can be measured */
#define FIR_MIN_LG 6        /* blocks of at least 64 samples */
#define FIR_MAX_LG 30
#define NCANDS 4 /* direct, ols-x4, ols-x8, ols-x16 */

static const char *const cand_names[NCANDS] = {"direct", "ols-x4", "ols-x8", "ols-x16"};
static _Thread_local const char *fir_last = "";

/* A test hook (proto/testhook.h): a production build has no such global. */
#ifdef DSPK_TEST_HOOKS
static int fir_force = -1;
void dspk__gpurt_fir_force(int mode) { fir_force = mode >= 0 && mode < NCANDS ? mode : -1; }
#else
#define fir_force (-1)
#endif
const char *dspk__gpurt_fir_last(void) { return fir_last; }

/* The block layout of one overlap-save run. */
struct geo {
  int lg;
  int64_t L, S, nb, nblk, nc;
};

/* Layout for rows of n samples, k taps (k <= n), mode m (1..3: blocks of
 * 2^(m+1) times k rounded up to a power of two). */
static int geometry(int64_t n, int64_t k, int64_t rows, int cplx, int m, struct geo *g) {
  int lg = dspk__autotune_pow2((uint64_t)k) + m + 1;
  int full = dspk__autotune_pow2((uint64_t)(n + k - 1));
  if (lg > full)
    lg = full;
  if (lg < FIR_MIN_LG)
    lg = FIR_MIN_LG;
  if (lg > FIR_MAX_LG)
    return DSPK_ELIMIT;
  g->lg = lg;
  g->L = (int64_t)1 << lg;
  g->S = g->L - k + 1;
  g->nb = (n + g->S - 1) / g->S;
  g->nblk = rows * g->nb;
  g->nc = cplx ? g->nblk : (g->nblk + 1) / 2;
  return 0;
}

static int kfn(struct dspk__dev *dev, dspk_dtype dt, const char *name, dspk__gfunc *fn,
               struct dspk__opctx *ctx) {
  return dspk__gpurt_kfunc(dev, DSPK__K_FIR, dt, name, fn, ctx);
}

static int exec(struct dspk__dev *dev, void *h, int dbl, dspk__gptr p, int inverse,
                struct dspk__opctx *ctx) {
  int s = dev->drv->fft_exec(h, dbl ? DSPK__GFFT_Z2Z : DSPK__GFFT_C2C, p, p, inverse);
  return s == 0 ? 0
                : dspk__gpurt_msg(ctx, DSPK_EDEVICE, "fir: %s exec failed: %d",
                                  dev->drv->fft_name(), s);
}

/* The overlap-save path with blocks of mode m (1..3). */
static int fir_ols(struct dspk__dev *dev, struct dspk__op *op, int m, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk_dtype dt = X->dtype;
  int cplx = dspk__dtype_is_complex(dt), dbl = dt == DSPK_F64 || dt == DSPK_C128;
  size_t cs = dbl ? 16 : 8;
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t rows = total / n, k64 = H->shape[0] < n ? H->shape[0] : n;
  struct geo g;
  struct dspk__pool_block *hp = NULL, *bb = NULL;
  dspk__gfunc fpad, fgat, fmul, fsct;
  void *p1, *pb;
  int rc, k = (int)k64;
  if (!HAVE_FFT(dev))
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP, "fir: no FFT library on this %s host",
                           dev->drv->name);
  if ((rc = geometry(n, k64, rows, cplx, m, &g)))
    return dspk__gpurt_msg(ctx, rc, "fir: %lld taps are too many for FFT convolution",
                          (long long)k64);
  if ((rc = kfn(dev, dt, "dspk_fir_hpad", &fpad, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_gather", &fgat, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_cmul", &fmul, ctx)) ||
      (rc = kfn(dev, dt, "dspk_fir_scatter", &fsct, ctx)))
    return rc;
  if ((rc = dspk__gpurt_tmp_alloc(dev, (size_t)g.L * cs, &hp)) ||
      (rc = dspk__gpurt_tmp_alloc(dev, (size_t)(g.nc * g.L) * cs, &bb))) {
    rc = dspk__gpurt_msg(ctx, rc, "fir: no device memory for %lld blocks of %lld samples",
                        (long long)g.nc, (long long)g.L);
    goto out;
  }
  {
    dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
    dspk__gptr php = (dspk__gptr)hp->handle, pbb = (dspk__gptr)bb->handle;
    int64_t L = g.L, S = g.S, nb = g.nb, nblk = g.nblk, tb = g.nc * g.L;
    int64_t ts = cplx ? total : g.nc * g.S;
    int lg = g.lg;
    enum dspk__gfft type = dbl ? DSPK__GFFT_Z2Z : DSPK__GFFT_C2C;
    float sf = 1.0f / (float)L;
    double sd = 1.0 / (double)L;
    void *apad[5] = {&h, &php, &k, &L, dbl ? (void *)&sd : (void *)&sf};
    void *agat[9] = {&x, &pbb, &n, &k, &S, &lg, &nb, &nblk, &tb};
    void *amul[4] = {&pbb, &php, &lg, &tb};
    void *asct[9] = {&pbb, &y, &n, &k, &S, &lg, &nb, &nblk, &ts};
    /* The filter's spectrum; each plan is executed before the next is
     * looked up, so an eviction retires a plan behind its last use. */
    if ((rc = dspk__gpurt_launch1d(dev, fpad, L, apad, ctx)) ||
        (rc = dspk__gpurt_fft_plan(dev, type, L, L, 1, &p1, ctx)) ||
        (rc = exec(dev, p1, dbl, php, 0, ctx)) ||
        (rc = dspk__gpurt_launch1d(dev, fgat, tb, agat, ctx)) ||
        (rc = dspk__gpurt_fft_plan(dev, type, L, L, g.nc, &pb, ctx)) ||
        (rc = exec(dev, pb, dbl, pbb, 0, ctx)) ||
        (rc = dspk__gpurt_launch1d(dev, fmul, tb, amul, ctx)) ||
        (rc = exec(dev, pb, dbl, pbb, 1, ctx)))
      goto out;
    rc = dspk__gpurt_launch1d(dev, fsct, ts, asct, ctx);
  }
out:
  if (hp)
    dspk__gpurt_tmp_free(dev, hp);
  if (bb)
    dspk__gpurt_tmp_free(dev, bb);
  return rc;
}

static int run_path(struct dspk__dev *dev, struct dspk__op *op, int c,
                    struct dspk__opctx *ctx) {
  fir_last = cand_names[c];
  return c == 0 ? dspk__gpurt_fir_direct(dev, op, ctx) : fir_ols(dev, op, c, ctx);
}

struct tune_ud {
  struct dspk__dev *dev;
  struct dspk__op *op;
  struct dspk__opctx ctx; /* the task's cancel and progress, a scratch message */
  char msg[256];
};

/* One candidate on the task's operands, to completion. */
static int cand_run(void *ud, int idx) {
  struct tune_ud *u = ud;
  int rc = run_path(u->dev, u->op, idx, &u->ctx);
  if (rc)
    return rc;
  return u->dev->drv->stream_sync(u->dev->stream) == 0 ? 0 : DSPK_EDEVICE;
}

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
  static const struct dspk__autotune_cand cands[NCANDS] = {
      {"direct", cand_run}, {"ols-x4", cand_run}, {"ols-x8", cand_run}, {"ols-x16", cand_run}};
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
    struct tune_ud u = {.dev = dev, .op = op};
    struct dspk__autotune_req req;
    char shape[96];
    u.ctx.errmsg = u.msg;
    u.ctx.errmsg_len = sizeof u.msg;
    snprintf(shape, sizeof shape, "n=2^%d,row=2^%d,k=2^%d",
             dspk__autotune_pow2((uint64_t)total), dspk__autotune_pow2((uint64_t)n),
             dspk__autotune_pow2((uint64_t)k));
    memset(&req, 0, sizeof req);
    req.op = "fir";
    req.shape = shape;
    req.dtypes = dspk__dtype_name(X->dtype);
    req.layout = "path";
    req.dev = dspk__gpurt_devid(dev);
    req.cands = cands;
    req.ncands = NCANDS;
    req.ud = &u;
    if (ctx) {
      u.ctx.cancel = ctx->cancel;
      u.ctx.progress = ctx->progress;
      u.ctx.progress_ud = ctx->progress_ud;
      req.progress = ctx->progress;
      req.progress_ud = ctx->progress_ud;
      req.cancel = ctx->cancel;
    }
    for (;;) {
      int w, rc = dspk__autotune_choose(dev->env.cache, &req, NULL, &w, NULL);
      if (rc == DSPK_ECANCELED)
        return dspk__gpurt_msg(ctx, rc, "fir: canceled while tuning");
      if (rc < 0)
        break; /* no decision: the heuristic below */
      rc = run_path(dev, op, w, ctx);
      if (rc == 0 || w == 0 || rc == DSPK_ECANCELED || dev->ctx_dead)
        return rc;
      dspk__autotune_failed(dev->env.cache, &req, w);
    }
  }
  return run_path(dev, op, k >= FIR_FFT_MIN_K ? 2 : 0, ctx);
}
