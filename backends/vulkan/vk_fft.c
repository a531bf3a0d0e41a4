/*
 * fft on the Vulkan backend (placeholder until VkFFT is wired in).
 */
#include "backends/vulkan/vk.h"

int dspk__vk_fft(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  (void)d;
  (void)op;
  return dspk__vk_fail(ctx, DSPK_ENOTSUP, "fft: not yet available on vulkan");
}

void dspk__vk_fft_plan_free(struct dspk__dev *d, void *plan) {
  (void)d;
  (void)plan;
}
