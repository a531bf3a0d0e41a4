/*
 * fir on the cpu: y = scipy.signal.lfilter(h, 1, x) along the last axis,
 * y[n] = sum_{k<=n} h[k] x[n-k], output as long as the input.
 *
 * Two paths, chosen per call by dspk__cpu_fir_use_fft() (the autotuner's
 * choice point) unless dev->fir_force says otherwise:
 *  - direct: y += h[k] * shifted x, one tap at a time over blocks of the
 *    output that stay in cache (vectorises well; best for short filters);
 *  - FFT: overlap-add with FFTW, blocks of length L (a 2^a 3^b 5^c 7^d size
 *    at least 8K), the filter's spectrum computed once per call; best for
 *    long filters.  Real signals use r2c/c2r transforms.  A segment of S
 *    outputs that comes out non-finite (a NaN or Inf in the data, or an
 *    overflow inside the transforms) is computed again by the direct sum,
 *    and so is each output too small for the transforms' error bound (a
 *    row of wide dynamic range, see RANGE_MARGIN).  Subnormal or huge data
 *    go through the transforms scaled by a power of two (scale.c).
 * Both paths' direct sums (the direct path's, and the FFT path's repair)
 * run on data scaled the same way (DEFINE_SCALED), so the products of
 * subnormal data keep their bits and those of huge data do not overflow.
 * One tap is H[0]*X exactly (fir_one_tap), on either path.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* GCC's -O2 vectorises only loops whose trip count needs no epilogue; the
 * direct filter's tap loop runs about 5x faster vectorised, so ask for the
 * dynamic cost model here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

#include <fftw3.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/tune.h"

/* An FFT output below this many times the transforms' error bound (eps
 * log2(L) max|x| sum|h|) is computed again by the direct sum: where the
 * FFT's result is kept, its relative error is at most about 1/RANGE_MARGIN
 * (2^-6 in single precision, 2^-20 in double; in practice far less, the
 * bound being a worst case).  Random data of one scale rarely come that
 * close to zero; a row of 1e20 next to 1 has its small outputs summed. */
#define RANGE_MARGIN(DBL) ((DBL) ? 1048576.0 : 64.0)

/* Scaling (DSPK__CPU_SCALE_EXP, scale.c, shared with fft.c): data whose
 * largest magnitude lies outside [2^-E, 2^E] are scaled by an exact power
 * of two into [1/2, 1) before the transforms (the taps once a call, the
 * samples a block at a time) and the block's outputs back after: the
 * transforms' intermediates of subnormal or nearly subnormal data would
 * otherwise lose their low bits to gradual underflow (the 1/L of the
 * inverse alone takes log2(L) of them), an absolute error of hundreds to
 * thousands of units of the smallest subnormal, far above the eps log2(L)
 * max|x| sum|h| the path is held to.  Inside that range nothing is scaled,
 * so the common data pay no ldexp. */

/* Output samples per block of the direct loop. */
#define DIRECT_BLOCK 2048

int dspk__cpu_fir_use_fft(struct dspk__dev *dev, dspk_dtype dt, int64_t n,
                          int64_t k, int64_t batch, struct dspk__opctx *ctx) {
  (void)batch;
  if (dev->env.cache) {
    int rc = dspk__cpu_tune_fir(dev, dt, n, k, ctx);
    if (rc >= 0 || rc == DSPK_ECANCELED)
      return rc;
    /* Any other failure (out of memory for scratch): the heuristic. */
  }
  /* Measured crossover on x86-64 (vectorised direct loop vs overlap-add):
   * about 32 taps for real signals, 16 for complex ones. */
  int64_t lim = dspk__dtype_is_complex(dt) ? 16 : 32;
  return k > lim && n * (k < n ? k : n) > 4096;
}

/* ---- direct ------------------------------------------------------------- */

/* Each writes the outputs [lo, hi) of one row (the FFT path recomputes
 * blocks of its output with them, see DEFINE_OLA). */
#define DEFINE_DIRECT(NAME, T)                                                 \
  static void NAME(const T *restrict x, const T *restrict h, T *restrict y, \
                   int64_t lo, int64_t hi, int64_t k) {                        \
    for (int64_t b0 = lo; b0 < hi; b0 += DIRECT_BLOCK) {                       \
      int64_t b1 = b0 + DIRECT_BLOCK < hi ? b0 + DIRECT_BLOCK : hi;           \
      for (int64_t i = b0; i < b1; i++)                                        \
        y[i] = 0;                                                              \
      int64_t kmax = k < b1 ? k : b1;                                          \
      for (int64_t j = 0; j < kmax; j++) {                                     \
        T hj = h[j];                                                           \
        int64_t s = b0 > j ? b0 : j;                                           \
        const T *xs = x - j;                                                   \
        for (int64_t i = s; i < b1; i++)                                       \
          y[i] += hj * xs[i];                                                  \
      }                                                                        \
    }                                                                          \
  }

DEFINE_DIRECT(direct_f32, float)
DEFINE_DIRECT(direct_f64, double)
/* Complex data as interleaved (re, im) pairs: written out by hand because
 * C's complex multiply calls a NaN-checking helper per element. */
#define DEFINE_DIRECT_C(NAME, R)                                               \
  static void NAME(const R *restrict x, const R *restrict h, R *restrict y, \
                   int64_t lo, int64_t hi, int64_t k) {                        \
    for (int64_t b0 = lo; b0 < hi; b0 += DIRECT_BLOCK) {                       \
      int64_t b1 = b0 + DIRECT_BLOCK < hi ? b0 + DIRECT_BLOCK : hi;           \
      for (int64_t i = 2 * b0; i < 2 * b1; i++)                                \
        y[i] = 0;                                                              \
      int64_t kmax = k < b1 ? k : b1;                                          \
      for (int64_t j = 0; j < kmax; j++) {                                     \
        R hr = h[2 * j], hi = h[2 * j + 1];                                    \
        int64_t s = b0 > j ? b0 : j;                                           \
        const R *xs = x - 2 * j;                                               \
        for (int64_t i = s; i < b1; i++) {                                     \
          R xr = xs[2 * i], xi = xs[2 * i + 1];                                \
          y[2 * i] += hr * xr - hi * xi;                                       \
          y[2 * i + 1] += hr * xi + hi * xr;                                   \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }

DEFINE_DIRECT_C(direct_c64, float)
DEFINE_DIRECT_C(direct_c128, double)

/* Outputs per piece of the scaled direct sum: each piece scans the samples
 * it reads (its outputs' and the k-1 before) for their largest magnitude. */
#define SCALED_CHUNK 8192

/* The direct sum of outputs [lo, hi) of one row on scaled data: the taps h
 * come already multiplied by 2^eh (eh from dspk__cpu_scale_exp of their
 * largest magnitude, 0 when they are not scaled), and the samples each
 * piece reads are multiplied by 2^ex, ex from their own largest magnitude,
 * into tmp (W (SCALED_CHUNK + k - 1) values) when it is not 0; the piece's
 * outputs are then multiplied by 2^-(ex+eh), each rounded once.  Without
 * it, each product of subnormal samples or taps is rounded to the
 * subnormals' grid (an f32 sum of 1024 such products was off by 23 units
 * of the smallest subnormal; the FFT path's repair of small outputs made
 * them worse than the transforms' result it replaced, probe 18 B1), and
 * the products or running sums of huge data overflow where the result is
 * in range.  Inside [2^-E, 2^E] (scale.c) nothing is copied: ordinary data
 * pay one vectorised scan per piece, small next to its k multiply-adds an
 * output.  A piece whose samples hold a NaN or an infinity is not scaled
 * (its largest magnitude is not finite). */
#define DEFINE_SCALED(NAME, R, DBL, W, DIRECT)                                 \
  static void NAME(const R *x, const R *h, int eh, R *y, int64_t lo,          \
                   int64_t hi, int64_t k, R *tmp) {                            \
    for (int64_t c0 = lo; c0 < hi; c0 += SCALED_CHUNK) {                       \
      int64_t c1 = hi - c0 < SCALED_CHUNK ? hi : c0 + SCALED_CHUNK;            \
      int64_t a = c0 - k + 1 > 0 ? c0 - k + 1 : 0, m = W * (c1 - a);          \
      const R *xa = x + W * a;                                                 \
      int ex = dspk__cpu_scale_exp(dspk__cpu_absmax(xa, m, DBL), DBL);         \
      if (ex) {                                                                \
        for (int64_t i = 0; i < m; i++)                                        \
          tmp[i] = DSPK__CPU_SCALE2(DBL, R, xa[i], ex);                        \
        xa = tmp;                                                              \
      }                                                                        \
      /* outputs [c0, c1) as [c0-a, c1-a) of the samples from a: each reads \
       * samples from c0-(k-1) >= a on */                                      \
      DIRECT(xa, h, y + W * a, c0 - a, c1 - a, k);                             \
      if (ex + eh)                                                             \
        for (int64_t i = W * c0; i < W * c1; i++)                              \
          y[i] = DSPK__CPU_SCALE2(DBL, R, y[i], -(ex + eh));                   \
    }                                                                          \
  }

DEFINE_SCALED(scaled_f32, float, 0, 1, direct_f32)
DEFINE_SCALED(scaled_f64, double, 1, 1, direct_f64)
DEFINE_SCALED(scaled_c64, float, 0, 2, direct_c64)
DEFINE_SCALED(scaled_c128, double, 1, 2, direct_c128)

/* The taps as DEFINE_SCALED reads them: *eh from their largest magnitude,
 * and when it is not 0 a copy of the k taps (W es bytes each) multiplied
 * by 2^*eh in *hs (the caller frees it); otherwise *hs is NULL.  Returns 0
 * or DSPK_ENOMEM. */
static int scaled_taps(const void *h, int64_t k, int w, int dbl, void **hs, int *eh) {
  *hs = NULL;
  *eh = dspk__cpu_scale_exp(dspk__cpu_absmax(h, w * k, dbl), dbl);
  if (!*eh)
    return 0;
  size_t es = dbl ? sizeof(double) : sizeof(float);
  if (!(*hs = malloc(es * (size_t)(w * k))))
    return DSPK_ENOMEM;
  memcpy(*hs, h, es * (size_t)(w * k));
  dspk__cpu_scale2(*hs, w * k, dbl, *eh);
  return 0;
}

/* The scratch DEFINE_SCALED copies a piece's samples to: W (SCALED_CHUNK +
 * k) values of es bytes, or NULL. */
static void *scaled_tmp(int64_t k, int w, size_t es) {
  return malloc(es * (size_t)(w * (SCALED_CHUNK + k)));
}

/* fir with one tap: y = H[0]*X exactly, each product rounded once with its
 * sign of zero (a tap of -0 over positive samples gives -0, as lfilter's
 * and numpy's H[0]*X; a sum starting from +0 gives +0), a complex one as
 * numpy's (ar br - ai bi, ar bi + ai br), on either path. */
static void fir_one_tap(const struct dspk__op *op, int64_t total) {
  const struct dspk__tensor *X = &op->in[0];
  const void *xv = dspk__cpu_ptr(X), *hv = dspk__cpu_ptr(&op->in[1]);
  void *yv = dspk__cpu_ptr(&op->out[0]);
  switch (X->dtype) {
  case DSPK_F32: {
    const float *x = xv, h = *(const float *)hv;
    float *y = yv;
    for (int64_t i = 0; i < total; i++)
      y[i] = h * x[i];
    break;
  }
  case DSPK_F64: {
    const double *x = xv, h = *(const double *)hv;
    double *y = yv;
    for (int64_t i = 0; i < total; i++)
      y[i] = h * x[i];
    break;
  }
  case DSPK_C64: {
    const float *x = xv, *h = hv;
    float *y = yv, hr = h[0], hi = h[1];
    for (int64_t i = 0; i < total; i++) {
      float xr = x[2 * i], xi = x[2 * i + 1];
      y[2 * i] = hr * xr - hi * xi;
      y[2 * i + 1] = hr * xi + hi * xr;
    }
    break;
  }
  default: {
    const double *x = xv, *h = hv;
    double *y = yv, hr = h[0], hi = h[1];
    for (int64_t i = 0; i < total; i++) {
      double xr = x[2 * i], xi = x[2 * i + 1];
      y[2 * i] = hr * xr - hi * xi;
      y[2 * i + 1] = hr * xi + hi * xr;
    }
    break;
  }
  }
}

/* The direct loop sees a cancel after every piece of about this many
 * multiply-adds (a complex one counting 4): a few ms on one core.  Checking
 * every 16 rows instead let one row of 2^24 samples and 64 taps, or 16
 * shorter ones, run on for seconds after a cancel. */
#define DIRECT_CHECK_WORK ((int64_t)1 << 23)

static int fir_direct(const struct dspk__op *op, int64_t rows, int64_t n,
                      int64_t k, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  dspk_dtype dt = X->dtype;
  size_t es = dspk__dtype_size(dt);
  int w = dspk__dtype_is_complex(dt) ? 2 : 1, dbl = dt == DSPK_F64 || dt == DSPK_C128;
  const char *x = dspk__cpu_ptr(X), *h = dspk__cpu_ptr(H);
  char *y = dspk__cpu_ptr(&op->out[0]);
  void *hs, *tmp = scaled_tmp(k, w, es / (size_t)w);
  int eh, rc = tmp ? scaled_taps(h, k, w, dbl, &hs, &eh) : DSPK_ENOMEM;
  if (rc) {
    free(tmp);
    return dspk__cpu_err(ctx, DSPK_ENOMEM, "fir: out of memory for %lld taps",
                         (long long)k);
  }
  if (hs)
    h = hs;
  int64_t per = DIRECT_CHECK_WORK / ((k ? k : 1) * (dspk__dtype_is_complex(dt) ? 4 : 1));
  if (per < 64)
    per = 64; /* outputs per piece */
  int64_t since = 0;
  for (int64_t r = 0; r < rows; r++) {
    const char *xr = x + r * n * es;
    char *yr = y + r * n * es;
    for (int64_t lo = 0; lo < n;) {
      int64_t hi = n - lo < per - since ? n : lo + (per - since);
      switch (dt) {
      case DSPK_F32: scaled_f32((const float *)xr, (const float *)h, eh, (float *)yr, lo, hi, k, tmp); break;
      case DSPK_F64: scaled_f64((const double *)xr, (const double *)h, eh, (double *)yr, lo, hi, k, tmp); break;
      case DSPK_C64: scaled_c64((const float *)xr, (const float *)h, eh, (float *)yr, lo, hi, k, tmp); break;
      default: scaled_c128((const double *)xr, (const double *)h, eh, (double *)yr, lo, hi, k, tmp); break;
      }
      since += hi - lo;
      lo = hi;
      if (since >= per) {
        since = 0;
        if ((lo < n || r + 1 < rows) && dspk__cpu_canceled(ctx)) {
          rc = DSPK_ECANCELED;
          goto out;
        }
      }
    }
  }
out:
  free(hs);
  free(tmp);
  return rc;
}

/* ---- FFT (overlap-add) -------------------------------------------------- */

/* The smallest 2^a 3^b 5^c 7^d >= n (FFTW is fastest on those). */
static int64_t good_size(int64_t n) {
  for (int64_t m = n < 1 ? 1 : n;; m++) {
    int64_t r = m;
    static const int f[] = {2, 3, 5, 7};
    for (int i = 0; i < 4; i++)
      while (r % f[i] == 0)
        r /= f[i];
    if (r == 1)
      return m;
  }
}

/* One precision of the overlap-add filter on R (float or double) arrays;
 * W is 2 for a complex signal (interleaved, c2c transforms) and 1 for a real
 * one (r2c/c2r).  Spectra are interleaved (re, im) pairs.
 *
 * Non-finite values: one NaN or Inf in a block's input (or in a tap) makes
 * every output of its transforms non-finite, and values whose transforms
 * overflow (3e38 times taps of 1e-6: an exact result of 9e34) do the same,
 * where the direct sum is non-finite only at the outputs the value reaches
 * (x[i] reaches y[i..i+k-1]), or nowhere.  So once the blocks up to s0 are
 * added, the outputs [s0, s0+S) are final, and a segment that holds a
 * non-finite output is computed again by the direct sum DIRECT: a NaN
 * sample costs the two segments its block reaches, a NaN tap the whole row,
 * finite data one scan of the output.  The result is then the direct sum's
 * wherever that is finite, and non-finite exactly where it is.  (X is read
 * after Y is written: the daemon never hands a fir an output that overlaps
 * an input, daemon/task.c.) */
#define DEFINE_OLA(NAME, R, DBL, W, DIRECT)                                    \
  static int NAME(struct dspk__dev *dev, const void *xv, const void *hv,      \
                  void *yv, int64_t rows, int64_t n, int64_t k, int64_t L,     \
                  struct dspk__opctx *ctx) {                                   \
    const R *x = xv, *h = hv;                                                  \
    R *y = yv;                                                                 \
    int64_t nh = W == 2 ? L : L / 2 + 1, S = L - k + 1;                        \
    int fk = W == 2 ? DSPK__CPU_FFT_FWD : DSPK__CPU_FFT_R2C;                   \
    int bk = W == 2 ? DSPK__CPU_FFT_BWD : DSPK__CPU_FFT_C2R;                   \
    int rc = 0;                                                                \
    int64_t per = DIRECT_CHECK_WORK / (k * W * W); /* repair: outputs a piece */ \
    if (per < 64)                                                              \
      per = 64;                                                                \
    size_t bb = sizeof(R) * W * L, sb = sizeof(R) * 2 * nh;                    \
    R *buf = DBL ? fftw_malloc(bb) : fftwf_malloc(bb);                         \
    R *spec = DBL ? fftw_malloc(sb) : fftwf_malloc(sb);                        \
    R *hs = DBL ? fftw_malloc(sb) : fftwf_malloc(sb);                          \
    R *tmp = scaled_tmp(k, W, sizeof(R)); /* DIRECT's */                       \
    void *hsv = NULL; /* the taps scaled for DIRECT, or NULL */                \
    int eh = 0;                                                                \
    void *pf = dspk__cpu_fft_plan(dev, fk, DBL, (int)L, 1, 0, 1);              \
    /* canceled during the first plan: no second one to wait for */           \
    void *pb = pf || !dspk__cpu_canceled(ctx)                                  \
                   ? dspk__cpu_fft_plan(dev, bk, DBL, (int)L, 1, 0, 1)         \
                   : NULL;                                                     \
    if (buf && spec && hs && tmp && (!pf || !pb) && dspk__cpu_canceled(ctx)) { \
      rc = DSPK_ECANCELED;                                                     \
      goto out;                                                                \
    }                                                                          \
    if (tmp && scaled_taps(h, k, W, DBL, &hsv, &eh)) {                         \
      free(tmp);                                                               \
      tmp = NULL;                                                              \
    }                                                                          \
    const R *hd = hsv ? (const R *)hsv : h;                                    \
    if (!buf || !spec || !hs || !tmp || !pf || !pb) {                          \
      rc = dspk__cpu_err(ctx, DSPK_ENOMEM,                                     \
                         "fir: out of memory for an FFT of length %lld",       \
                         (long long)L);                                        \
      goto out;                                                                \
    }                                                                          \
    /* The filter's spectrum, scaled by 1/L for the unnormalised inverse   \
     * (and by 2^eh, see DSPK__CPU_SCALE_EXP). */                              \
    memset(buf, 0, bb);                                                        \
    memcpy(buf, hd, sizeof(R) * W * k); /* the taps times 2^eh */             \
    dspk__cpu_fft_exec(fk, DBL, pf, buf, hs);                                  \
    for (int64_t i = 0; i < 2 * nh; i++)                                       \
      hs[i] *= (R)(1.0 / (double)L);                                           \
    /* The transforms' error at an output is about eps log2(L) times        \
     * max|x| (over the two blocks reaching it) times sum|h|. */               \
    double hsum = 0, lg = 1;                                                   \
    for (int64_t i = 0; i < W * k; i++)                                        \
      hsum += fabs((double)h[i]);                                              \
    while ((int64_t)1 << (int)lg < L)                                          \
      lg++;                                                                    \
    for (int64_t r = 0; r < rows; r++) {                                       \
      const R *xr = x + r * n * W;                                             \
      R *yr = y + r * n * W;                                                   \
      R mprev = 0;                                                             \
      memset(yr, 0, sizeof(R) * W * n);                                        \
      for (int64_t s0 = 0; s0 < n; s0 += S) {                                  \
        if (dspk__cpu_canceled(ctx)) {                                         \
          rc = DSPK_ECANCELED;                                                 \
          goto out;                                                            \
        }                                                                      \
        int64_t len = n - s0 < S ? n - s0 : S;                                 \
        int64_t e = len * W, bad = 0;                                          \
        R mb = 0;                                                              \
        for (int64_t i = 0; i < e; i++)                                        \
          mb = fabs((double)xr[s0 * W + i]) > mb ? (R)fabs((double)xr[s0 * W + i]) : mb; \
        int ex = dspk__cpu_scale_exp(mb, DBL);                                 \
        memcpy(buf, xr + s0 * W, sizeof(R) * W * len);                         \
        for (int64_t i = 0; ex && i < e; i++)                                  \
          buf[i] = DSPK__CPU_SCALE2(DBL, R, buf[i], ex);                       \
        memset(buf + len * W, 0, sizeof(R) * W * (L - len));                   \
        dspk__cpu_fft_exec(fk, DBL, pf, buf, spec);                            \
        for (int64_t i = 0; i < nh; i++) {                                     \
          R ar = spec[2 * i], ai = spec[2 * i + 1];                            \
          R br = hs[2 * i], bi = hs[2 * i + 1];                                \
          spec[2 * i] = ar * br - ai * bi;                                     \
          spec[2 * i + 1] = ar * bi + ai * br;                                 \
        }                                                                      \
        dspk__cpu_fft_exec(bk, DBL, pb, spec, buf);                            \
        int64_t m = n - s0 < L ? n - s0 : L;                                   \
        R *yo = yr + s0 * W;                                                   \
        if (ex + eh)                                                           \
          for (int64_t i = 0; i < m * W; i++)                                  \
            yo[i] += DSPK__CPU_SCALE2(DBL, R, buf[i], -(ex + eh));             \
        else                                                                   \
          for (int64_t i = 0; i < m * W; i++)                                  \
            yo[i] += buf[i];                                                   \
        for (int64_t i = 0; i < e; i++)                                        \
          bad |= !isfinite(yo[i]);                                             \
        for (int64_t lo = s0; bad && lo < s0 + len; lo += per) {               \
          if (lo > s0 && dspk__cpu_canceled(ctx)) {                            \
            rc = DSPK_ECANCELED;                                               \
            goto out;                                                          \
          }                                                                    \
          DIRECT(xr, hd, eh, yr, lo,                                           \
                 s0 + len - lo < per ? s0 + len : lo + per, k, tmp);           \
        }                                                                      \
        /* The outputs reached by the two blocks' absolute error:           \
         * below RANGE_MARGIN times it, they are the direct sum's. */          \
        double thr = RANGE_MARGIN(DBL) * (DBL ? DBL_EPSILON : FLT_EPSILON) *  \
                     lg * (mb > mprev ? mb : mprev) * hsum;                    \
        mprev = mb;                                                            \
        if (bad || !(thr > 0))                                                 \
          continue;                                                            \
        int64_t done = 0;                                                      \
        for (int64_t i = s0; i < s0 + len;) {                                  \
          if (!(fabs((double)yr[i * W]) +                                      \
                    (W == 2 ? fabs((double)yr[i * W + W - 1]) : 0.0) < thr)) { \
            i++;                                                               \
            continue;                                                          \
          }                                                                    \
          int64_t j = i + 1;                                                   \
          while (j < s0 + len && j - i < per &&                                \
                 fabs((double)yr[j * W]) +                                     \
                         (W == 2 ? fabs((double)yr[j * W + W - 1]) : 0.0) < thr) \
            j++;                                                               \
          DIRECT(xr, hd, eh, yr, i, j, k, tmp);                                \
          done += j - i;                                                       \
          if (done >= per) {                                                   \
            done = 0;                                                          \
            if (dspk__cpu_canceled(ctx)) {                                     \
              rc = DSPK_ECANCELED;                                             \
              goto out;                                                        \
            }                                                                  \
          }                                                                    \
          i = j;                                                               \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  out:                                                                         \
    free(tmp);                                                                 \
    free(hsv);                                                                 \
    if (DBL) {                                                                 \
      fftw_free(buf);                                                          \
      fftw_free(spec);                                                         \
      fftw_free(hs);                                                           \
    } else {                                                                   \
      fftwf_free(buf);                                                         \
      fftwf_free(spec);                                                        \
      fftwf_free(hs);                                                          \
    }                                                                          \
    return rc;                                                                 \
  }

DEFINE_OLA(ola_f32, float, 0, 1, scaled_f32)
DEFINE_OLA(ola_f64, double, 1, 1, scaled_f64)
DEFINE_OLA(ola_c64, float, 0, 2, scaled_c64)
DEFINE_OLA(ola_c128, double, 1, 2, scaled_c128)

static int fir_fft(struct dspk__dev *dev, const struct dspk__op *op,
                   int64_t rows, int64_t n, int64_t k, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  /* Whole rows in one block when that is short; otherwise blocks of a fast
   * size well above k so most of each block is new signal. */
  int64_t full = good_size(n + k - 1);
  int64_t blk = good_size(8 * k > 4096 ? 8 * k : 4096);
  int64_t L = full < blk ? full : blk;
  if (L > (1 << 30))
    return dspk__cpu_err(ctx, DSPK_ENOTSUP,
                         "fir: H has %lld taps, too many for FFT convolution",
                         (long long)k);
  const void *x = dspk__cpu_ptr(X), *h = dspk__cpu_ptr(H);
  void *y = dspk__cpu_ptr(&op->out[0]);
  switch (X->dtype) {
  case DSPK_F32: return ola_f32(dev, x, h, y, rows, n, k, L, ctx);
  case DSPK_F64: return ola_f64(dev, x, h, y, rows, n, k, L, ctx);
  case DSPK_C64: return ola_c64(dev, x, h, y, rows, n, k, L, ctx);
  default: return ola_c128(dev, x, h, y, rows, n, k, L, ctx);
  }
}

int dspk__cpu_fir(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  int64_t n = X->shape[X->rank - 1], k = op->in[1].shape[0];
  if (n == 0)
    return 0;
  int64_t rows = dspk__tensor_numel(X) / n;
  if (k == 1) {
    fir_one_tap(op, rows * n);
    return 0;
  }
  int use_fft = dev->fir_force >= 0
                    ? dev->fir_force
                    : dspk__cpu_fir_use_fft(dev, X->dtype, n, k, rows, ctx);
  if (use_fft < 0)
    return use_fft;
  /* Taps beyond the signal's length never reach the output. */
  if (k > n)
    k = n;
  if (!use_fft)
    return fir_direct(op, rows, n, k, ctx);
  int rc = fir_fft(dev, op, rows, n, k, ctx);
  dspk__cpu_fft_wisdom_flush(dev);
  return rc;
}
