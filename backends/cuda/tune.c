/*
 * Launch parameters of the generated kernels chosen by the shared autotune
 * framework (backends/common/autotune.h): the block size of a 1-D
 * grid-stride launch, per op, shape class (powers of two of the sizes that
 * matter), dtype and device.  The first launch of a class benchmarks the
 * candidates on the task's own data (each run waits for its kernel); the
 * winner lives in the persistent cache, so later tasks, and a restarted
 * daemon, launch at once.  A winner that fails at launch is reported to the
 * framework and the next choice re-tunes without it.
 */
#include <stdio.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/cuda/cuda_internal.h"

#define NCANDS 5
static const struct dspk__autotune_cand *cands(void);

struct tune_ud {
  struct dspk__dev *dev;
  CUfunction fn;
  int64_t n;
  void **args;
};

static int block_of(int idx) { return 64 << idx; }

static int launch(struct dspk__dev *dev, CUfunction fn, int64_t n, int block,
                  void **args) {
  int64_t blocks = (n + block - 1) / block;
  int64_t cap = (int64_t)dev->sms * (2048 / block) * 4;
  if (blocks > cap)
    blocks = cap;
  if (blocks < 1)
    blocks = 1;
  return dspk__cu.cuLaunchKernel(fn, (unsigned)blocks, 1, 1, (unsigned)block, 1, 1, 0,
                                 dev->stream, args, NULL) == CUDA_SUCCESS
             ? 0
             : DSPK_EDEVICE;
}

static int cand_run(void *ud, int idx) {
  struct tune_ud *t = ud;
  int rc = launch(t->dev, t->fn, t->n, block_of(idx), t->args);
  if (rc)
    return rc;
  return dspk__cu.cuStreamSynchronize(t->dev->stream) == CUDA_SUCCESS ? 0 : DSPK_EDEVICE;
}

static const struct dspk__autotune_cand cand_table[NCANDS] = {
    {"block64", cand_run}, {"block128", cand_run}, {"block256", cand_run},
    {"block512", cand_run}, {"block1024", cand_run}};
static const struct dspk__autotune_cand *cands(void) { return cand_table; }

int dspk__cuda_launch_tuned(struct dspk__dev *dev, CUfunction fn, int64_t n, void **args,
                            const char *op, const char *shape_class, dspk_dtype dt,
                            struct dspk__opctx *ctx) {
  struct tune_ud ud = {dev, fn, n, args};
  struct dspk__autotune_req req;
  char shape[96];
  if (n <= 0)
    return 0;
  snprintf(shape, sizeof(shape), "n=2^%d%s%s", dspk__autotune_pow2((uint64_t)n),
           shape_class ? "," : "", shape_class ? shape_class : "");
  memset(&req, 0, sizeof(req));
  req.op = op;
  req.shape = shape;
  req.dtypes = dspk__dtype_name(dt);
  req.layout = "";
  req.dev.backend = "cuda";
  req.dev.name = dev->info.name;
  req.dev.arch = dev->arch;
  req.dev.uuid = dev->info.uuid;
  req.dev.driver = dev->info.driver;
  req.cands = cands();
  req.ncands = NCANDS;
  req.ud = &ud;
  if (ctx) {
    req.progress = ctx->progress;
    req.progress_ud = ctx->progress_ud;
    req.cancel = ctx->cancel;
  }
  for (;;) {
    int w, rc = dspk__autotune_choose(dev->env.cache, &req, NULL, &w, NULL);
    if (rc == DSPK_ECANCELED)
      return dspk__cuda_msg(ctx, rc, "%s: canceled while tuning", op);
    if (rc < 0)
      break; /* no decision: the default below */
    if (launch(dev, fn, n, block_of(w), args) == 0)
      return 0;
    dspk__autotune_failed(dev->env.cache, &req, w);
  }
  return dspk__cuda_launch1d(dev, fn, n, args, ctx);
}
