/*
 * fft on the cpu (not yet implemented: returns DSPK_ENOTSUP).
 */
#include "backends/cpu/cpu.h"

int dspk__cpu_fft(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  (void)dev;
  (void)op;
  return dspk__cpu_err(ctx, DSPK_ENOTSUP, "fft: not yet on the cpu backend");
}

void dspk__cpu_fft_release(struct dspk__dev *dev) { (void)dev; }
