/*
 * fft on the Vulkan backend when VkFFT (libvkfft-dev) was not found at
 * build time: the op is reported as not supported.
 */
#include "backends/vulkan/vk.h"

const int dspk__vk_fft_built = 0;

int dspk__vk_fft(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  (void)d;
  (void)op;
  return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                       "fft: this build has no VkFFT (install libvkfft-dev and rebuild)");
}

void dspk__vk_fft_plan_free(struct dspk__dev *d, void *plan) {
  (void)d;
  (void)plan;
}
