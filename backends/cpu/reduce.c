/*
 * reduce on the cpu: sum, max, min, mean over a set of axes (keepdims=False),
 * as numpy does.  Values accumulate in double precision (one accumulator per
 * output element), walking X once in memory order: rows of the last axis are
 * either folded into one accumulator (last axis reduced) or added elementwise
 * into a row of accumulators (last axis kept).  max/min propagate NaN like
 * numpy; the mean of nothing is NaN.
 *
 * The sum (and mean) of real values over the last axis runs at memory
 * bandwidth: a row is cut into fixed blocks of SUM_BLOCK elements, each
 * summed pairwise as numpy does (leaves of PAIR_LEAF elements, each in
 * SUM_LANES independent double accumulators, which the compiler turns into
 * vector adds, the leaves' sums added in halves), and the blocks' partial
 * sums are added pairwise too.  So the error of an f64 sum of n values is
 * at most about (PAIR_LEAF / SUM_LANES + log2 n) units of rounding of the
 * sum of their magnitudes, numpy's own bound; with one running total per
 * lane over a whole block, [2^53, 1 x 10^6] lost 2048 of its ones (numpy
 * 16).  A reduction of the whole tensor splits its blocks over up to
 * SUM_THREADS threads; the split is by block, and the partials are combined
 * in the same order whatever the thread count, so the result is the same
 * bits on every run and every machine with IEEE doubles.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

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

#define SUM_LANES 8
#define PAIR_LEAF 128
#define SUM_BLOCK ((int64_t)1 << 14)
#define SUM_THREADS 8
/* Fewer elements than this are summed on the runner alone. */
#define SUM_PARALLEL_MIN ((int64_t)1 << 20)

/* On x86-64 the block sum is built twice, for AVX2 and for the baseline
 * (SSE2), and the loader picks one by the CPU (GCC's target_clones, an
 * ifunc): with SSE2 the f32 -> f64 conversions bound it below memory speed
 * (2^26 f32 on one core of the development VM: 33 ms against 10.6 ms with
 * AVX2).  Each lane is its own accumulator in both, so the bits are the
 * same. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SUM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SUM_CLONES
#endif

/* Sums n (<= PAIR_LEAF) contiguous values in SUM_LANES accumulators (inlined
 * into each build of sum_block). */
static inline __attribute__((always_inline)) double sum_leaf(const char *p, int dbl,
                                                            int64_t n) {
  double a[SUM_LANES] = {0};
  int64_t i = 0;
  if (dbl) {
    const double *x = (const double *)p;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
      for (int l = 0; l < SUM_LANES; l++)
        a[l] += x[i + l];
    for (; i < n; i++)
      a[i % SUM_LANES] += x[i];
  } else {
    const float *x = (const float *)p;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
      for (int l = 0; l < SUM_LANES; l++)
        a[l] += (double)x[i + l];
    for (; i < n; i++)
      a[i % SUM_LANES] += (double)x[i];
  }
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Sums a[0 .. n) pairwise: halves, down to one or two values. */
static double sum_pairwise(const double *a, int64_t n) {
  if (n <= 2)
    return n == 0 ? 0.0 : n == 1 ? a[0] : a[0] + a[1];
  int64_t h = n / 2;
  return sum_pairwise(a, h) + sum_pairwise(a + h, n - h);
}

/* Sums n (<= SUM_BLOCK) contiguous values: leaves of PAIR_LEAF (the last
 * one shorter) each by sum_leaf, their sums pairwise. */
SUM_CLONES static double sum_block(const char *p, int dbl, int64_t n) {
  double part[SUM_BLOCK / PAIR_LEAF];
  int64_t nl = 0;
  for (int64_t i = 0; i < n; i += PAIR_LEAF)
    part[nl++] = sum_leaf(p + (size_t)i * (dbl ? 8 : 4), dbl,
                          n - i < PAIR_LEAF ? n - i : PAIR_LEAF);
  return sum_pairwise(part, nl);
}

/* Sums n values st apart from p pairwise, as sum_block (the parts of a
 * complex row: st = 2), leaves in SUM_LANES accumulators too. */
static double sum_strided(const char *p, int dbl, int64_t n, int64_t st) {
  if (n <= PAIR_LEAF) {
    double a[SUM_LANES] = {0};
    for (int64_t i = 0; i < n; i++)
      a[i % SUM_LANES] += load(p, dbl, i * st);
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  }
  int64_t h = n / 2;
  return sum_strided(p, dbl, h, st) +
         sum_strided(p + (size_t)(h * st) * (dbl ? 8 : 4), dbl, n - h, st);
}

struct sum_part {
  const char *x;
  int dbl;
  int64_t n;            /* elements of the whole row */
  int64_t b0, b1;       /* this part's blocks */
  double *partial;      /* [blocks] */
  const struct dspk__opctx *ctx;
  int canceled;
};

static void *sum_blocks(void *ud) {
  struct sum_part *s = ud;
  size_t es = s->dbl ? 8 : 4;
  for (int64_t b = s->b0; b < s->b1; b++) {
    if ((b & 63) == 63 && dspk__cpu_canceled(s->ctx)) {
      s->canceled = 1;
      break;
    }
    int64_t i = b * SUM_BLOCK, m = s->n - i < SUM_BLOCK ? s->n - i : SUM_BLOCK;
    s->partial[b] = sum_block(s->x + (size_t)i * es, s->dbl, m);
  }
  return NULL;
}

/* The sum of n contiguous real values (see the top of the file): 0, or
 * DSPK_ECANCELED / DSPK_ENOMEM. */
static int sum_row(const char *x, int dbl, int64_t n, const struct dspk__opctx *ctx,
                   double *out) {
  if (n <= SUM_BLOCK) {
    *out = sum_block(x, dbl, n);
    return 0;
  }
  int64_t nb = (n + SUM_BLOCK - 1) / SUM_BLOCK;
  double *partial = malloc(sizeof(double) * (size_t)nb);
  if (!partial)
    return DSPK_ENOMEM;
  struct sum_part parts[SUM_THREADS];
  pthread_t th[SUM_THREADS];
  int started[SUM_THREADS] = {0};
  long cpus = n >= SUM_PARALLEL_MIN ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
  int nt = cpus < 1 ? 1 : cpus > SUM_THREADS ? SUM_THREADS : (int)cpus;
  if (nt > nb)
    nt = (int)nb;
  for (int t = 0; t < nt; t++)
    parts[t] = (struct sum_part){.x = x, .dbl = dbl, .n = n, .b0 = nb * t / nt,
                                 .b1 = nb * (t + 1) / nt, .partial = partial,
                                 .ctx = ctx};
  /* Part 0 on this thread; a helper that cannot start leaves its part to
   * this thread too. */
  for (int t = 1; t < nt; t++)
    started[t] = pthread_create(&th[t], NULL, sum_blocks, &parts[t]) == 0;
  sum_blocks(&parts[0]);
  int canceled = parts[0].canceled;
  for (int t = 1; t < nt; t++) {
    if (started[t])
      pthread_join(th[t], NULL);
    else
      sum_blocks(&parts[t]);
    canceled |= parts[t].canceled;
  }
  double acc = sum_pairwise(partial, nb);
  free(partial);
  if (canceled)
    return DSPK_ECANCELED;
  *out = acc;
  return 0;
}

/* The row loops see a cancel after about this many elements (a few ms):
 * counted by rows, a cancel waited for 1024 rows however long, or for the
 * whole of one long row. */
#define CHECK_ELEMS ((int64_t)1 << 20)

/* Counts m more elements done; 1 when a cancel check is due and the task
 * was canceled. */
static int poll_cancel(int64_t *since, int64_t m, const struct dspk__opctx *ctx) {
  *since += m;
  if (*since < CHECK_ELEMS)
    return 0;
  *since = 0;
  return dspk__cpu_canceled(ctx);
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
  /* Real sums over the last axis: each row by sum_row (the top of the file). */
  int sums = last_reduced && W == 1 && (fn == DSPK_REDUCE_SUM || fn == DSPK_REDUCE_MEAN);
  size_t es = dbl ? 8 : 4;
  int rc = 0;
  if (sums && onumel == 1) { /* the whole tensor: one row */
    n = total;
    rows = total ? 1 : 0;
  }
  int64_t since = 0;
  for (int64_t row = 0; row < rows; row++) {
    if (row && poll_cancel(&since, 0, ctx)) {
      rc = DSPK_ECANCELED;
      goto out;
    }
    int64_t oo = 0;
    for (int i = 0; i < r - 1; i++)
      oo += idx[i] * ostr[i];
    int64_t base = row * n * W;
    if (sums) {
      double v;
      if ((rc = sum_row(x + (size_t)base * es, dbl, n, ctx, &v)) < 0) {
        if (rc == DSPK_ENOMEM)
          rc = dspk__cpu_err(ctx, rc, "reduce: out of memory");
        goto out;
      }
      acc[oo] += v;
    } else if (last_reduced) {
      for (int64_t j0 = 0; j0 < n; j0 += CHECK_ELEMS) {
        int64_t j1 = n - j0 < CHECK_ELEMS ? n : j0 + CHECK_ELEMS;
        if (j0 && dspk__cpu_canceled(ctx)) {
          rc = DSPK_ECANCELED;
          goto out;
        }
        for (int w = 0; w < W; w++) {
          double a = acc[oo * W + w];
          if (fn == DSPK_REDUCE_SUM || fn == DSPK_REDUCE_MEAN)
            a += sum_strided(x + (size_t)(base + j0 * W + w) * es, dbl, j1 - j0, W);
          else
            for (int64_t j = j0; j < j1; j++)
              a = fold(fn, a, load(x, dbl, base + j * W + w));
          acc[oo * W + w] = a;
        }
      }
    } else {
      double *ao = acc + oo * W;
      for (int64_t j0 = 0; j0 < n * W; j0 += CHECK_ELEMS) {
        int64_t j1 = n * W - j0 < CHECK_ELEMS ? n * W : j0 + CHECK_ELEMS;
        if (j0 && dspk__cpu_canceled(ctx)) {
          rc = DSPK_ECANCELED;
          goto out;
        }
        for (int64_t j = j0; j < j1; j++)
          ao[j] = fold(fn, ao[j], load(x, dbl, base + j));
      }
    }
    since += n * W;
    for (int i = r - 2; i >= 0; i--) {
      if (++idx[i] < X->shape[i])
        break;
      idx[i] = 0;
    }
  }
  if (fn == DSPK_REDUCE_MEAN)
    for (int64_t i = 0; i < onumel * W; i++)
      acc[i] = count ? acc[i] / (double)count : -NAN; /* numpy's (x86's 0/0) */
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
