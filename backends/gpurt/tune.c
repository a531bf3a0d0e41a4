/*
 * Launch parameters of the generated kernels chosen by the shared autotune
 * framework (backends/common/autotune.h): the block size of a 1-D
 * grid-stride launch, per op, shape class (powers of two of the sizes that
 * matter), dtype and device.  The first launch of a class benchmarks the
 * candidates on the task's own data (each run waits for its kernel); the
 * winner lives in the persistent cache, so later tasks, and a restarted
 * daemon, launch at once.  A winner that fails at launch is reported to the
 * framework and the next choice re-tunes without it.
 *
 * Reductions choose more than a block size: which of the three kernels of
 * backends/kernels/reduce.cu (a block, a warp or a thread per output
 * element) and its block size, per (number of outputs, length of each
 * reduction: powers of two; whether the innermost axis is reduced; dtype;
 * device).  The candidates offered depend on the shape class (a thread per
 * output is not offered for reductions of thousands of elements, a block
 * per output not for a handful), so no tuning wastes time on a hopeless
 * candidate; the list is part of the key.
 */
#include <stdio.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/gpurt/gpurt.h"

#define NCANDS 5
static const struct dspk__autotune_cand *cands(void);

struct tune_ud {
  struct dspk__dev *dev;
  dspk__gfunc fn;
  int64_t n;
  void **args;
};

static int block_of(int idx) { return 64 << idx; }

static int launch(struct dspk__dev *dev, dspk__gfunc fn, int64_t n, int block,
                  void **args) {
  int64_t blocks = (n + block - 1) / block;
  int64_t cap = (int64_t)dev->sms * (2048 / block) * 4;
  if (blocks > cap)
    blocks = cap;
  if (blocks < 1)
    blocks = 1;
  return dev->drv->launch(fn, (unsigned)blocks, 1, 1, (unsigned)block, 1, 1, 0,
                          dev->stream, args) == 0
             ? 0
             : DSPK_EDEVICE;
}

static int cand_run(void *ud, int idx) {
  struct tune_ud *t = ud;
  int rc = launch(t->dev, t->fn, t->n, block_of(idx), t->args);
  if (rc)
    return rc;
  return t->dev->drv->stream_sync(t->dev->stream) == 0 ? 0 : DSPK_EDEVICE;
}

static const struct dspk__autotune_cand cand_table[NCANDS] = {
    {"block64", cand_run}, {"block128", cand_run}, {"block256", cand_run},
    {"block512", cand_run}, {"block1024", cand_run}};
static const struct dspk__autotune_cand *cands(void) { return cand_table; }

/* An autotune request for this device, with the task's progress and
 * cancel hooks when there is a task. */
static void req_init(struct dspk__autotune_req *req, struct dspk__dev *dev,
                     struct dspk__opctx *ctx, const char *op, const char *shape,
                     const char *dtypes, const char *layout,
                     const struct dspk__autotune_cand *cands, int ncands, void *ud) {
  memset(req, 0, sizeof(*req));
  req->op = op;
  req->shape = shape;
  req->dtypes = dtypes;
  req->layout = layout;
  req->dev = dspk__gpurt_devid(dev);
  req->cands = cands;
  req->ncands = ncands;
  req->ud = ud;
  if (ctx) {
    req->progress = ctx->progress;
    req->progress_ud = ctx->progress_ud;
    req->cancel = ctx->cancel;
  }
}

int dspk__gpurt_launch_tuned(struct dspk__dev *dev, dspk__gfunc fn, int64_t n, void **args,
                            const char *op, const char *shape_class, dspk_dtype dt,
                            struct dspk__opctx *ctx) {
  struct tune_ud ud = {dev, fn, n, args};
  struct dspk__autotune_req req;
  char shape[96];
  int ran_ok = 0;
  if (n <= 0)
    return 0;
  snprintf(shape, sizeof(shape), "n=2^%d%s%s", dspk__autotune_pow2((uint64_t)n),
           shape_class ? "," : "", shape_class ? shape_class : "");
  req_init(&req, dev, ctx, op, shape, dspk__dtype_name(dt), "", cands(), NCANDS, &ud);
  req.ran_ok = &ran_ok;
  for (;;) {
    int w, rc = dspk__autotune_choose(dev->env.cache, &req, NULL, &w, NULL);
    /* The kernel is the whole op (its callers' last step), each candidate
     * run waited for: one that completed left the op's whole result. */
    if (rc == DSPK_ECANCELED && ran_ok)
      return 0;
    if (rc == DSPK_ECANCELED)
      return dspk__gpurt_msg(ctx, rc, "%s: canceled while tuning", op);
    if (rc < 0)
      break; /* no decision: the default below */
    if (launch(dev, fn, n, block_of(w), args) == 0)
      return 0;
    dspk__autotune_failed(dev->env.cache, &req, w);
  }
  return dspk__gpurt_launch1d(dev, fn, n, args, ctx);
}

/* ---- reductions ----------------------------------------------------------- */

enum rkind { R_BLOCK, R_WARP, R_THREAD };

static const struct rcand {
  const char *name;
  enum rkind kind;
  int block;
} rcand_all[] = {
    {"block128", R_BLOCK, 128},   {"block256", R_BLOCK, 256},
    {"block512", R_BLOCK, 512},   {"block1024", R_BLOCK, 1024},
    {"warp4", R_WARP, 128},       {"warp8", R_WARP, 256},
    {"thread128", R_THREAD, 128}, {"thread256", R_THREAD, 256},
};
#define RCANDS ((int)(sizeof(rcand_all) / sizeof(rcand_all[0])))

struct rtune_ud {
  struct dspk__dev *dev;
  dspk__gfunc fn[3]; /* by enum rkind */
  int64_t nout;
  void **args;
  const struct rcand *c[RCANDS]; /* the offered candidates, in order */
};

/* Launches candidate c and returns the launch's int.  Shared memory:
 * one accumulator (at most 16 bytes) per thread of the block and warp
 * kernels. */
static int rlaunch(const struct rtune_ud *u, const struct rcand *c) {
  int64_t per = c->kind == R_BLOCK ? 1 : c->kind == R_WARP ? c->block / 32 : c->block;
  int64_t blocks = (u->nout + per - 1) / per;
  int64_t cap = (int64_t)u->dev->sms * (c->kind == R_THREAD ? (2048 / c->block) * 4 : 32);
  unsigned shmem = c->kind == R_THREAD ? 0 : (unsigned)c->block * 16u;
  if (blocks > cap)
    blocks = cap;
  if (blocks < 1)
    blocks = 1;
  return u->dev->drv->launch(u->fn[c->kind], (unsigned)blocks, 1, 1, (unsigned)c->block, 1,
                             1, shmem, u->dev->stream, u->args);
}

static int rcand_run(void *ud, int idx) {
  struct rtune_ud *u = ud;
  if (rlaunch(u, u->c[idx]) != 0)
    return DSPK_EDEVICE;
  return u->dev->drv->stream_sync(u->dev->stream) == 0 ? 0 : DSPK_EDEVICE;
}

/* The untuned choice (no cache decision could be made): the heuristic the
 * backend used before tuning. */
static const struct rcand *rdefault(const struct dspk__dev *dev, int64_t nout, int64_t nred) {
  if (nred >= 64 || nout < (int64_t)dev->sms * 64)
    return &rcand_all[1]; /* block256 */
  return &rcand_all[7];   /* thread256 */
}

int dspk__gpurt_reduce_launch(struct dspk__dev *dev, dspk_dtype dt, int64_t nout,
                             int64_t nred, int inner, void **args, int tune,
                             struct dspk__opctx *ctx) {
  static const char *const entry[3] = {"dspk_reduce_block", "dspk_reduce_warp",
                                       "dspk_reduce_thread"};
  struct dspk__autotune_cand cands[RCANDS];
  struct rtune_ud ud;
  struct dspk__autotune_req req;
  char shape[64];
  int r;
  int n = 0, rc, ran_ok = 0;
  if (nout <= 0)
    return 0;
  memset(&ud, 0, sizeof(ud));
  ud.dev = dev;
  ud.nout = nout;
  ud.args = args;
  for (int k = 0; k < 3; k++)
    if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_REDUCE, dt, entry[k], &ud.fn[k], ctx)))
      return rc;
  if (dev->reduce_force) {
    for (int i = 0; i < RCANDS; i++)
      if (strcmp(rcand_all[i].name, dev->reduce_force) == 0) {
        r = rlaunch(&ud, &rcand_all[i]);
        return r == 0 ? 0 : dspk__gpurt_err(dev, ctx, "cuLaunchKernel", r);
      }
  }
  /* The candidates worth timing for this class: a thread per output only
   * for short reductions, a block per output only for long ones, a warp
   * per output in between (the ranges overlap, so the borders are tuned). */
  for (int i = 0; i < RCANDS; i++) {
    const struct rcand *c = &rcand_all[i];
    if (c->kind == R_THREAD && nred > 256)
      continue;
    if (c->kind == R_BLOCK && nred < 32)
      continue;
    if (c->kind == R_BLOCK && c->block > 256 && nred < 1024)
      continue;
    if (c->kind == R_WARP && nred > (int64_t)1 << 16)
      continue;
    ud.c[n] = c;
    cands[n].name = c->name;
    cands[n].run = rcand_run;
    n++;
  }
  if (tune) {
    snprintf(shape, sizeof(shape), "nout=2^%d,nred=2^%d", dspk__autotune_pow2((uint64_t)nout),
             dspk__autotune_pow2((uint64_t)nred));
    req_init(&req, dev, ctx, "reduce", shape, dspk__dtype_name(dt), inner ? "inner" : "outer",
             cands, n, &ud);
    req.ran_ok = &ran_ok;
    for (;;) {
      int w;
      rc = dspk__autotune_choose(dev->env.cache, &req, NULL, &w, NULL);
      if (rc == DSPK_ECANCELED && ran_ok) /* as in dspk__gpurt_launch_tuned */
        return 0;
      if (rc == DSPK_ECANCELED)
        return dspk__gpurt_msg(ctx, rc, "reduce: canceled while tuning");
      if (rc < 0)
        break; /* no decision: the default below */
      if (rlaunch(&ud, ud.c[w]) == 0)
        return 0;
      dspk__autotune_failed(dev->env.cache, &req, w);
    }
  }
  r = rlaunch(&ud, rdefault(dev, nout, nred));
  return r == 0 ? 0 : dspk__gpurt_err(dev, ctx, "cuLaunchKernel", r);
}

int dspk__gpurt_set_reduce_force(struct dspk__dev *dev, const char *name) {
  if (name) {
    int i = 0;
    while (i < RCANDS && strcmp(rcand_all[i].name, name) != 0)
      i++;
    if (i == RCANDS)
      return DSPK_EINVAL;
    name = rcand_all[i].name;
  }
  dev->reduce_force = name;
  return 0;
}
