/*
 * contract on the cpu (not yet implemented: returns DSPK_ENOTSUP).
 */
#include "backends/cpu/cpu.h"

int dspk__cpu_contract(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  (void)dev;
  (void)op;
  return dspk__cpu_err(ctx, DSPK_ENOTSUP, "contract: not yet on the cpu backend");
}
