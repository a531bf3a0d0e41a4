/* The fir paths' layout and choice shared by the GPU backends (see
 * fir_tune.h). */
#include <stdio.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/common/fir_tune.h"
#include "dspk/errors.h"
#include "proto/dtype.h"

const char *const dspk__fir_path_names[DSPK__FIR_NPATHS] = {"direct", "ols-x4", "ols-x8",
                                                            "ols-x16"};

int dspk__fir_geometry(int64_t n, int64_t k, int64_t rows, int m, int max_lg,
                       struct dspk__fir_geo *g) {
  int lg = dspk__autotune_pow2((uint64_t)k) + m + 1;
  int full = dspk__autotune_pow2((uint64_t)(n + k - 1));
  if (lg > full)
    lg = full;
  if (lg < DSPK__FIR_MIN_LG)
    lg = DSPK__FIR_MIN_LG;
  if (lg > max_lg)
    return DSPK_ELIMIT;
  g->lg = lg;
  g->L = (int64_t)1 << lg;
  g->S = g->L - k + 1;
  g->nb = (n + g->S - 1) / g->S;
  g->nblk = rows * g->nb;
  return 0;
}

struct tune_ud {
  const struct dspk__fir_ops *ops;
  struct dspk__dev *d;
  struct dspk__op *op;
  struct dspk__opctx ctx; /* the task's cancel and progress, a scratch message */
  char msg[256];
  int untimed;      /* ops->timed said the device has no timestamps */
  int have_ns;      /* the last sample has the device's time, ns */
  uint64_t ns;
};

/* The candidates in timing order: the overlap-save paths first, so that
 * the direct loop, far slower for long filters, is cut after its first
 * sample (autotune.h's early cut); path_of maps a candidate to its path. */
static const int path_of[DSPK__FIR_NPATHS] = {1, 2, 3, 0};

/* One sample of a candidate on the task's operands: FIR_TUNE_REPS runs,
 * then one wait, timed by the device where it can.  A wait costs about as
 * much as the difference between two paths (on the H200, Vulkan's submit
 * and timeline wait varied by 0.1 to 0.2 ms around paths of 0.3 ms that
 * differ by 10%): single runs timed by the clock chose at random, and
 * samples of four still spread by 20% (1.30-1.67 ms for one path), so the
 * device's timestamps time them where it has them. */
#define FIR_TUNE_REPS 4
static _Thread_local int sampling;
int dspk__fir_sampling(void) { return sampling; }

static int cand_sample(struct tune_ud *u, int idx) {
  int rc = 0;
  u->have_ns = 0;
  if (u->ops->timed && !u->untimed) {
    rc = u->ops->timed(u->d, u->op, path_of[idx], FIR_TUNE_REPS, &u->ctx, &u->ns);
    if (rc != 1) {
      u->have_ns = rc == 0;
      return rc;
    }
    u->untimed = 1;
    rc = 0;
  }
  for (int i = 0; i < FIR_TUNE_REPS && rc == 0; i++)
    rc = u->ops->run(u->d, u->op, path_of[idx], &u->ctx);
  return u->ops->finish(u->d, rc);
}

/* The autotune framework's run of candidate idx: a sample, with sampling
 * set (see dspk__fir_sampling). */
static int cand_run(void *ud, int idx) {
  sampling = 1;
  int rc = cand_sample(ud, idx);
  sampling = 0;
  return rc;
}

/* The autotune framework's ran_ns: the device's time of the sample. */
static int cand_ns(void *ud, int idx, uint64_t *ns) {
  const struct tune_ud *u = ud;
  (void)idx;
  if (!u->have_ns)
    return -1;
  *ns = u->ns;
  return 0;
}

static const struct dspk__autotune_cand cands[DSPK__FIR_NPATHS] = {
    {"ols-x4", cand_run}, {"ols-x8", cand_run}, {"ols-x16", cand_run}, {"direct", cand_run}};

uint64_t dspk__fir_tune_cands_hash(void) {
  return dspk__autotune_cands_hash(cands, DSPK__FIR_NPATHS);
}

int dspk__fir_tuned(struct dspk__dev *d, struct dspk__op *op, struct dspk__cache *cache,
                    struct dspk__cache_devid devid, const struct dspk__fir_ops *ops,
                    struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t k = op->in[1].shape[0] < n ? op->in[1].shape[0] : n;
  struct tune_ud u = {.ops = ops, .d = d, .op = op};
  struct dspk__autotune_req req;
  char shape[96];
  int ran_ok = 0;
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
  req.dev = devid;
  req.cands = cands;
  req.ncands = DSPK__FIR_NPATHS;
  req.ud = &u;
  req.ran_ns = cand_ns;
  req.ran_ok = &ran_ok;
  if (ctx) {
    u.ctx.cancel = ctx->cancel;
    u.ctx.progress = ctx->progress;
    u.ctx.progress_ud = ctx->progress_ud;
    req.progress = ctx->progress;
    req.progress_ud = ctx->progress_ud;
    req.cancel = ctx->cancel;
  }
  for (;;) {
    int w, rc = dspk__autotune_choose(cache, &req, NULL, &w, NULL);
    /* Each candidate run is the whole fir on the task's operands, finished
     * (ops->finish): one that completed left the whole result. */
    if (rc == DSPK_ECANCELED && ran_ok)
      return 0;
    if (rc == DSPK_ECANCELED)
      return dspk__op_fail(ctx, rc, "fir: canceled while tuning");
    if (rc < 0)
      return 1; /* no decision: the caller's heuristic */
    rc = ops->run(d, op, path_of[w], ctx);
    if (rc == 0 || path_of[w] == 0 || rc == DSPK_ECANCELED || (ops->lost && ops->lost(d)))
      return rc;
    dspk__autotune_failed(cache, &req, w);
  }
}
