/*
 * fft on the cpu through FFTW, and the device's FFTW plan cache (also used by
 * fir's FFT convolution).
 *
 * Plans are made once per (kind, precision, n, batch, in-place, alignment)
 * and reused: planning per task would cost more than the transform.  They
 * are made on scratch arrays, never on the task's data, so the planning
 * flags (dspk__cpu_fft_flags, the autotuner's choice point) may be
 * FFTW_MEASURE, which overwrites its arrays.  The task's arrays are then
 * passed to the new-array execute functions, which need the same alignment
 * as the planning arrays: unaligned operands (an offset into a buffer) get
 * plans made with FFTW_UNALIGNED.  FFTW's planner is not thread-safe, and
 * several devices or tests may plan at once, so every plan creation and
 * destruction holds one process-wide mutex; execution needs no lock.
 *
 * numpy's conventions: the forward transform is unnormalised, the inverse
 * divides by n; real input gives the n/2+1 non-negative frequencies.  Large
 * batches run in chunks so a cancel request is seen between chunks.
 */
#include <pthread.h>
#include <string.h>

#include <fftw3.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/tune.h"

/* Rows per execute call are chosen so a chunk is about this many elements. */
#define CHUNK_ELEMS ((int64_t)1 << 22)
/* Seconds one FFTW planner call may spend measuring (fftw_set_timelimit)
 * for a transform of PLAN_LIMIT_POINTS points (n * batch) or more. */
#define PLAN_TIMELIMIT_S 0.1
#define PLAN_LIMIT_POINTS ((int64_t)1 << 16)

static pthread_mutex_t fftw_mu = PTHREAD_MUTEX_INITIALIZER;

void dspk__cpu_fftw_lock(void) { pthread_mutex_lock(&fftw_mu); }
void dspk__cpu_fftw_unlock(void) { pthread_mutex_unlock(&fftw_mu); }

unsigned dspk__cpu_fft_flags(struct dspk__dev *dev, int kind, int dbl, int n,
                             int batch) {
  (void)kind;
  (void)dbl;
  if (dev->fft_flags)
    return dev->fft_flags;
  return dspk__cpu_tune_fft_flags(dev, n, batch);
}

/* Caller holds the FFTW lock. */
static void destroy_plan(struct dspk__cpu_plan *p) {
  if (!p->plan)
    return;
  if (p->dbl)
    fftw_destroy_plan(p->plan);
  else
    fftwf_destroy_plan(p->plan);
  p->plan = NULL;
}

void dspk__cpu_fft_release(struct dspk__dev *dev) {
  if (!dev)
    return;
  dspk__cpu_fftw_lock();
  for (int i = 0; i < dev->nplans; i++)
    destroy_plan(&dev->plans[i]);
  dspk__cpu_fftw_unlock();
  dev->nplans = 0;
}

/* One FFTW planner call for kind/precision; in and out are the planning
 * arrays.  The plan, or NULL. */
static void *plan_dft(int kind, int dbl, int n, int batch, void *in, void *out,
                      int idist, int odist, unsigned flags) {
  int nn = n, sign = kind == DSPK__CPU_FFT_FWD ? FFTW_FORWARD : FFTW_BACKWARD;
  /* The same calls in both precisions: pfx is fftw (double) or fftwf. */
#define PLAN_MANY(pfx)                                                         \
  switch (kind) {                                                              \
  case DSPK__CPU_FFT_R2C:                                                      \
    return pfx##_plan_many_dft_r2c(1, &nn, batch, in, NULL, 1, idist, out,     \
                                   NULL, 1, odist, flags);                     \
  case DSPK__CPU_FFT_C2R:                                                      \
    return pfx##_plan_many_dft_c2r(1, &nn, batch, in, NULL, 1, idist, out,     \
                                   NULL, 1, odist, flags);                     \
  default:                                                                     \
    return pfx##_plan_many_dft(1, &nn, batch, in, NULL, 1, idist, out, NULL,   \
                               1, odist, sign, flags);                         \
  }
  if (dbl)
    PLAN_MANY(fftw)
  PLAN_MANY(fftwf)
#undef PLAN_MANY
}

/* Makes a plan on scratch arrays; NULL when out of memory or FFTW fails.
 * *measured is set when FFTW measured (new wisdom).  Caller holds the lock. */
static void *make_plan(int kind, int dbl, int n, int batch, int inplace,
                       int aligned, unsigned flags, int *measured) {
  size_t cs = dbl ? 16 : 8, rs = dbl ? 8 : 4;
  int nh = n / 2 + 1, r2c = kind == DSPK__CPU_FFT_R2C, c2r = kind == DSPK__CPU_FFT_C2R;
  /* r2c: n reals in, nh complex out; c2r the other way round; else n
   * complex both sides. */
  size_t real_bytes = (size_t)n * batch * rs, half_bytes = (size_t)nh * batch * cs;
  size_t cplx_bytes = (size_t)n * batch * cs;
  size_t in_bytes = r2c ? real_bytes : c2r ? half_bytes : cplx_bytes;
  size_t out_bytes = r2c ? half_bytes : c2r ? real_bytes : cplx_bytes;
  int idist = c2r ? nh : n, odist = r2c ? nh : n;
  if (r2c || c2r)
    inplace = 0; /* the padded in-place real layout is never used here */
  if (!aligned)
    flags |= FFTW_UNALIGNED;
  void *in = dbl ? fftw_malloc(in_bytes) : fftwf_malloc(in_bytes);
  void *out = inplace ? in : dbl ? fftw_malloc(out_bytes) : fftwf_malloc(out_bytes);
  void *plan = NULL;
  if (!in || !out)
    goto done;
  /* A cold FFTW_MEASURE plan of a large size can measure for minutes, and
   * the planner cannot be interrupted: bound it, so a canceled task (or a
   * stopping daemon) waits at most about that long for the planner.  FFTW
   * then keeps the best plan it measured in that time (a plan cut short
   * makes no wisdom).  Smaller sizes measure in well under that on an idle
   * machine, and unbounded, so their wisdom is complete. */
  double limit = (int64_t)n * batch >= PLAN_LIMIT_POINTS ? PLAN_TIMELIMIT_S
                                                         : FFTW_NO_TIMELIMIT;
  if (dbl)
    fftw_set_timelimit(limit);
  else
    fftwf_set_timelimit(limit);
  /* With MEASURE (FFTW_ESTIMATE unset), a plan that stored wisdom already
   * answers is made without measuring and adds no wisdom: only a measured
   * plan makes the device's wisdom worth saving again. */
  if (!(flags & FFTW_ESTIMATE))
    plan = plan_dft(kind, dbl, n, batch, in, out, idist, odist,
                    flags | FFTW_WISDOM_ONLY);
  if (!plan) {
    plan = plan_dft(kind, dbl, n, batch, in, out, idist, odist, flags);
    *measured = plan && !(flags & FFTW_ESTIMATE);
  }
done:
  if (dbl) {
    if (out && out != in)
      fftw_free(out);
    fftw_free(in);
  } else {
    if (out && out != in)
      fftwf_free(out);
    fftwf_free(in);
  }
  return plan;
}

void *dspk__cpu_fft_plan(struct dspk__dev *dev, int kind, int dbl, int n,
                         int batch, int inplace, int aligned) {
  if (kind == DSPK__CPU_FFT_R2C || kind == DSPK__CPU_FFT_C2R)
    inplace = 0;
  uint64_t now = ++dev->plan_clock;
  for (int i = 0; i < dev->nplans; i++) {
    struct dspk__cpu_plan *p = &dev->plans[i];
    if (p->kind == kind && p->dbl == dbl && p->n == n && p->batch == batch &&
        p->inplace == inplace && p->aligned == aligned) {
      p->last_use = now;
      dev->plan_hits++;
      return p->plan;
    }
  }
  unsigned flags = dspk__cpu_fft_flags(dev, kind, dbl, n, batch);
  dspk__cpu_fftw_lock();
  int measured = 0;
  void *plan = make_plan(kind, dbl, n, batch, inplace, aligned, flags, &measured);
  struct dspk__cpu_plan *slot = NULL;
  if (plan) {
    if (dev->nplans < DSPK__CPU_PLANS) {
      slot = &dev->plans[dev->nplans++];
    } else {
      slot = &dev->plans[0];
      for (int i = 1; i < dev->nplans; i++)
        if (dev->plans[i].last_use < slot->last_use)
          slot = &dev->plans[i];
      destroy_plan(slot);
    }
  }
  dspk__cpu_fftw_unlock();
  if (!plan)
    return NULL;
  *slot = (struct dspk__cpu_plan){.kind = kind, .dbl = dbl, .inplace = inplace,
                                  .aligned = aligned, .n = n, .batch = batch,
                                  .plan = plan, .last_use = now};
  dev->plans_made++;
  if (measured)
    dev->wisdom_dirty = 1; /* new wisdom to store after the op */
  return plan;
}

void dspk__cpu_fft_exec(int kind, int dbl, void *plan, void *in, void *out) {
  if (dbl) {
    switch (kind) {
    case DSPK__CPU_FFT_R2C: fftw_execute_dft_r2c(plan, in, out); break;
    case DSPK__CPU_FFT_C2R: fftw_execute_dft_c2r(plan, in, out); break;
    default: fftw_execute_dft(plan, in, out); break;
    }
  } else {
    switch (kind) {
    case DSPK__CPU_FFT_R2C: fftwf_execute_dft_r2c(plan, in, out); break;
    case DSPK__CPU_FFT_C2R: fftwf_execute_dft_c2r(plan, in, out); break;
    default: fftwf_execute_dft(plan, in, out); break;
    }
  }
}

void dspk__cpu_fft_wisdom_flush(struct dspk__dev *dev) {
  if (!dev->wisdom_dirty || !dev->env.cache)
    return;
  dev->wisdom_dirty = 0;
  dspk__cpu_tune_wisdom_save(dev); /* best effort: a failure costs a re-plan */
}

int dspk__cpu_fft_aligned(int dbl, const void *p) {
  return dbl ? fftw_alignment_of((double *)p) == 0
             : fftwf_alignment_of((float *)p) == 0;
}

int dspk__cpu_fft(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  struct dspk__tensor *Y = &op->out[0];
  int cplx = dspk__dtype_is_complex(X->dtype);
  int dbl = X->dtype == DSPK_F64 || X->dtype == DSPK_C128;
  int kind = !cplx ? DSPK__CPU_FFT_R2C
             : op->u.fft.inverse ? DSPK__CPU_FFT_BWD : DSPK__CPU_FFT_FWD;
  int64_t n = X->shape[X->rank - 1];
  int64_t rows = dspk__tensor_numel(X) / n;
  int64_t on = Y->shape[Y->rank - 1];
  size_t ies = dspk__dtype_size(X->dtype), oes = dspk__dtype_size(Y->dtype);
  int64_t chunk = CHUNK_ELEMS / n;
  if (chunk < 1)
    chunk = 1;
  if (chunk > rows)
    chunk = rows;
  if (chunk > INT32_MAX)
    chunk = INT32_MAX;
  char *in = dspk__cpu_ptr(X), *out = dspk__cpu_ptr(Y);
  for (int64_t r = 0; r < rows; r += chunk) {
    if (r && dspk__cpu_canceled(ctx))
      return DSPK_ECANCELED;
    int64_t cb = rows - r < chunk ? rows - r : chunk;
    char *pi = in + r * n * ies, *po = out + r * on * oes;
    int aligned = dspk__cpu_fft_aligned(dbl, pi) && dspk__cpu_fft_aligned(dbl, po);
    void *plan = dspk__cpu_fft_plan(dev, kind, dbl, (int)n, (int)cb, pi == po, aligned);
    if (!plan)
      return dspk__cpu_err(ctx, DSPK_ENOMEM,
                           "fft: FFTW could not plan a transform of length %lld",
                           (long long)n);
    dspk__cpu_fft_exec(kind, dbl, plan, pi, po);
    dspk__cpu_fft_wisdom_flush(dev);
    if (kind == DSPK__CPU_FFT_BWD) {
      int64_t m = 2 * cb * n;
      if (dbl) {
        double *f = (double *)po, s = 1.0 / (double)n;
        for (int64_t i = 0; i < m; i++)
          f[i] *= s;
      } else {
        float *f = (float *)po, s = (float)(1.0 / (double)n);
        for (int64_t i = 0; i < m; i++)
          f[i] *= s;
      }
    }
  }
  return 0;
}
