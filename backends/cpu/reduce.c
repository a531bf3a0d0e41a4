/*
 * reduce on the cpu: sum, max, min, mean over a set of axes (keepdims=False),
 * as numpy does.  Values accumulate in double precision (one accumulator per
 * output element), walking X once in memory order: rows of the last axis are
 * either folded into one accumulator (last axis reduced) or added elementwise
 * into a row of accumulators (last axis kept).  max/min propagate NaN like
 * numpy; the mean of nothing is NaN.
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu.h"

static double load(const char *p, int dbl, int64_t i) {
  return dbl ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static double fold(dspk_reduce fn, double acc, double v) {
  switch (fn) {
  case DSPK_REDUCE_MAX: return (v > acc || v != v) ? v : acc;
  case DSPK_REDUCE_MIN: return (v < acc || v != v) ? v : acc;
  default: return acc + v;
  }
}

int dspk__cpu_reduce(struct dspk__dev *dev, struct dspk__op *op,
                     struct dspk__opctx *ctx) {
  (void)dev;
  const struct dspk__tensor *X = &op->in[0];
  struct dspk__tensor *O = &op->out[0];
  dspk_reduce fn = op->u.reduce.fn;
  int r = X->rank, dbl = X->dtype == DSPK_F64 || X->dtype == DSPK_C128;
  int W = dspk__dtype_is_complex(X->dtype) ? 2 : 1;
  uint32_t axes = op->u.reduce.axes;
  if (axes == 0)
    axes = r ? (uint32_t)((1ull << r) - 1) : 0;
  int64_t onumel = dspk__tensor_numel(O), count = 1;
  int64_t ostr[DSPK_MAX_RANK], idx[DSPK_MAX_RANK], s = 1;
  for (int i = r - 1; i >= 0; i--) {
    idx[i] = 0;
    if (axes & (1u << i)) {
      ostr[i] = 0;
      count *= X->shape[i];
    } else {
      ostr[i] = s;
      s *= X->shape[i];
    }
  }
  double init = fn == DSPK_REDUCE_MAX ? -INFINITY : fn == DSPK_REDUCE_MIN ? INFINITY : 0.0;
  double *acc = malloc(sizeof(double) * (size_t)(onumel ? onumel : 1) * W);
  if (!acc)
    return dspk__cpu_err(ctx, DSPK_ENOMEM, "reduce: out of memory");
  for (int64_t i = 0; i < onumel * W; i++)
    acc[i] = init;

  const char *x = dspk__cpu_ptr(X);
  int64_t n = r ? X->shape[r - 1] : 1;
  int64_t total = dspk__tensor_numel(X), rows = n ? total / n : 0;
  int last_reduced = r == 0 || (axes & (1u << (r - 1)));
  int rc = 0;
  for (int64_t row = 0; row < rows; row++) {
    if ((row & 1023) == 1023 && dspk__cpu_canceled(ctx)) {
      rc = DSPK_ECANCELED;
      goto out;
    }
    int64_t oo = 0;
    for (int i = 0; i < r - 1; i++)
      oo += idx[i] * ostr[i];
    int64_t base = row * n * W;
    if (last_reduced) {
      for (int w = 0; w < W; w++) {
        double a = acc[oo * W + w];
        for (int64_t j = 0; j < n; j++)
          a = fold(fn, a, load(x, dbl, base + j * W + w));
        acc[oo * W + w] = a;
      }
    } else {
      double *ao = acc + oo * W;
      for (int64_t j = 0; j < n * W; j++)
        ao[j] = fold(fn, ao[j], load(x, dbl, base + j));
    }
    for (int i = r - 2; i >= 0; i--) {
      if (++idx[i] < X->shape[i])
        break;
      idx[i] = 0;
    }
  }
  if (fn == DSPK_REDUCE_MEAN)
    for (int64_t i = 0; i < onumel * W; i++)
      acc[i] = count ? acc[i] / (double)count : NAN;
  if (dbl) {
    double *o = dspk__cpu_ptr(O);
    for (int64_t i = 0; i < onumel * W; i++)
      o[i] = acc[i];
  } else {
    float *o = dspk__cpu_ptr(O);
    for (int64_t i = 0; i < onumel * W; i++)
      o[i] = (float)acc[i];
  }
out:
  free(acc);
  return rc;
}
