/*
 * reduce on the cpu (not yet implemented: returns DSPK_ENOTSUP).
 */
#include "backends/cpu/cpu.h"

int dspk__cpu_reduce(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  (void)dev;
  (void)op;
  return dspk__cpu_err(ctx, DSPK_ENOTSUP, "reduce: not yet on the cpu backend");
}
