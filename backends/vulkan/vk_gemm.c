/*
 * gemm and contract on the Vulkan backend (placeholder).
 */
#include "backends/vulkan/vk.h"

int dspk__vk_gemm(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  (void)d;
  (void)op;
  return dspk__vk_fail(ctx, DSPK_ENOTSUP, "gemm: not yet available on vulkan");
}
int dspk__vk_contract(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  (void)d;
  (void)op;
  return dspk__vk_fail(ctx, DSPK_ENOTSUP, "contract: not yet available on vulkan");
}
