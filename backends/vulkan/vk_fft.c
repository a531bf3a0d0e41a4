/*
 * fft on the Vulkan backend through VkFFT (vk_vkfft.c), with the cpu
 * backend's semantics: along the last axis, batched; complex input gives
 * numpy.fft.fft (numpy.fft.ifft, scaled by 1/n, when inverse), real input
 * numpy.fft.rfft.  Complex transforms copy X into the output and transform
 * it in place; real ones read X and write the half spectrum (VkFFT's
 * real transform needs an even n: odd ones go through a complex transform
 * of a widened copy, keeping the first n/2+1 outputs).
 *
 * A VkFFT plan is made per (n, batch, precision, kind, buffer sizes) and
 * kept in the device's plan cache.  VkFFT compiles its own GLSL at plan
 * creation; its binaries are saved into the persistent cache as a blob
 * keyed by the device, driver, VkFFT version and plan, so a restarted
 * daemon loads them instead of compiling (counted like other kernels).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "backends/vulkan/vk_vkfft.h"
#include "cache/cache.h"

struct fplan {
  int kind; /* 1: an FFT plan (see plan_evict in vk_backend.c) */
  struct dspk__vkfft *f;
};

void dspk__vk_fft_plan_free(struct dspk__dev *d, void *plan) {
  struct fplan *p = plan;
  /* A plan may still be in use by submitted work. */
  dspk__vk_submit(d);
  dspk__vk_wait_value(d, d->submitted);
  dspk__vkfft_destroy(p->f);
  free(p);
}

static int get_plan(struct dspk__dev *d, const struct dspk__vkfft_desc *desc,
                    struct fplan **out, struct dspk__opctx *ctx) {
  char key[160];
  int klen = snprintf(key, sizeof key, "fft|n=%llu|b=%llu|d=%d|r=%d|%llu|%llu",
                      (unsigned long long)desc->n, (unsigned long long)desc->batch,
                      desc->dbl, desc->r2c, (unsigned long long)desc->bufsize,
                      (unsigned long long)desc->insize);
  struct fplan *p = dspk__plancache_get(&d->plans, key, (size_t)klen);
  if (p) {
    *out = p;
    return 0;
  }
  if (!d->fft_fence) {
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkResult vr = VK(CreateFence)(d->dev, &fi, NULL, &d->fft_fence);
    if (vr != VK_SUCCESS) {
      d->fft_fence = VK_NULL_HANDLE;
      return dspk__vk_err(vr);
    }
  }
  p = calloc(1, sizeof *p);
  if (!p)
    return DSPK_ENOMEM;
  p->kind = 1;
  /* VkFFT submits its own work while planning: ours goes first. */
  int r = dspk__vk_submit(d);
  if (r)
    goto fail;
  char name[512];
  snprintf(name, sizeof name, "vkfft/%d/%s/%s/%s/%s", dspk__vkfft_version(), d->uuid,
           d->driver, dspk__vk_glslang_version(), key);
  void *bin = NULL, *save = NULL;
  size_t binlen = 0, savelen = 0;
  if (d->env.cache && dspk__cache_blob_get(d->env.cache, name, &bin, &binlen) == 0) {
    r = dspk__vkfft_create(d, &d->fft_fence, desc, bin, binlen, &p->f, NULL, NULL);
    free(bin);
    if (r == 0)
      d->kernel_cache_hits++;
  } else {
    r = -1;
  }
  if (r) {
    r = dspk__vkfft_create(d, &d->fft_fence, desc, NULL, 0, &p->f, d->env.cache ? &save : NULL,
                           &savelen);
    if (r == 0) {
      d->kernels_compiled++;
      if (save)
        dspk__cache_blob_put(d->env.cache, name, save, savelen);
    }
    free(save);
  }
  if (r) {
    r = dspk__vk_fail(ctx, r == DSPK_ENOMEM ? r : DSPK_EDEVICE,
                      "fft: VkFFT could not plan n=%llu batch=%llu (VkFFTResult %d)",
                      (unsigned long long)desc->n, (unsigned long long)desc->batch,
                      r <= -1000 ? -1000 - r : r);
    goto fail;
  }
  if ((r = dspk__plancache_put(&d->plans, key, (size_t)klen, p))) {
    dspk__vkfft_destroy(p->f);
    goto fail;
  }
  *out = p;
  return 0;
fail:
  free(p);
  return r;
}

/* Widens real rows into complex (mode 0: c[i] = (x[i], 0)) or keeps the
 * first m of each complex row of n (mode 1: o[b*m+k] = c[b*n+k]). */
static int fft_copy(struct dspk__dev *d, int dbl, int mode, const struct dspk__vk_bind *src,
                    uint32_t soff, const struct dspk__vk_bind *dst, uint32_t doff,
                    uint32_t total, uint32_t n, uint32_t m, struct dspk__opctx *ctx) {
  char src_[2048];
  snprintf(src_, sizeof src_,
           "#version 450\n"
           "layout(local_size_x = %d) in;\n"
           "layout(std430, binding = 0) readonly buffer BX { %s x[]; };\n"
           "layout(std430, binding = 1) writeonly buffer BO { %s o[]; };\n"
           "layout(push_constant) uniform PC { uint total, n, m, ox, oo; } pc;\n"
           "void main() {\n"
           "  uint stride = gl_NumWorkGroups.x * %du;\n"
           "  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += stride) {\n"
           "%s"
           "  }\n}\n",
           DSPK__VK_WG, mode == 0 ? (dbl ? "double" : "float") : (dbl ? "dvec2" : "vec2"),
           dbl ? "dvec2" : "vec2", DSPK__VK_WG,
           mode == 0 ? (dbl ? "    o[pc.oo + i] = dvec2(x[pc.ox + i], 0.0LF);\n"
                            : "    o[pc.oo + i] = vec2(x[pc.ox + i], 0.0);\n")
                     : "    o[pc.oo + i] = x[pc.ox + (i / pc.m) * pc.n + i % pc.m];\n");
  struct dspk__vk_kernel *k;
  int r = dspk__vk_kernel(d, "fftcopy", src_, NULL, 0, "main", 2, 20, &k, ctx);
  if (r)
    return r;
  struct dspk__vk_bind b[2] = {*src, *dst};
  uint32_t pc[5] = {total, n, m, soff, doff};
  uint32_t g = (total + DSPK__VK_WG - 1) / DSPK__VK_WG;
  return dspk__vk_dispatch(d, k, b, 2, pc, sizeof pc, g > 65535 ? 65535 : (g ? g : 1), 1, 1);
}

/* rfft of odd n: widen, complex transform, keep the half spectrum. */
static int rfft_odd(struct dspk__dev *d, const struct dspk__tensor *X,
                    const struct dspk__tensor *O, uint64_t n, uint64_t batch, int dbl,
                    struct dspk__opctx *ctx) {
  size_t ces = dbl ? 16 : 8;
  struct dspk__mem *t;
  int r = dspk__vk_alloc(d, (size_t)(n * batch) * ces, &t);
  if (r)
    return r;
  struct dspk__vk_bind bx, bo, bt = {t->buf, t->off, t->size};
  uint32_t ex, eo;
  struct fplan *p = NULL;
  if ((r = dspk__vk_bind_tensor(d, X, &bx, &ex)) || (r = dspk__vk_bind_tensor(d, O, &bo, &eo)))
    goto out;
  if ((r = fft_copy(d, dbl, 0, &bx, ex, &bt, 0, (uint32_t)(n * batch), 0, 0, ctx)))
    goto out;
  struct dspk__vkfft_desc desc = {.n = n, .batch = batch, .dbl = dbl, .buf = t->buf,
                                  .bufsize = t->bufsize};
  if ((r = get_plan(d, &desc, &p, ctx)))
    goto out;
  VkCommandBuffer cb;
  if ((r = dspk__vk_cmd(d, &cb)))
    goto out;
  if ((r = dspk__vkfft_append(p->f, cb, 0, t->buf, t->off, VK_NULL_HANDLE, 0))) {
    r = dspk__vk_fail(ctx, DSPK_EDEVICE, "fft: VkFFT could not record (VkFFTResult %d)",
                      -1000 - r);
    goto out;
  }
  dspk__vk_barrier(d);
  r = fft_copy(d, dbl, 1, &bt, 0, &bo, eo, (uint32_t)((n / 2 + 1) * batch), (uint32_t)n,
               (uint32_t)(n / 2 + 1), ctx);
out:
  dspk__vk_submit(d);
  dspk__vk_free(d, t);
  return r;
}

/* The largest prime factor of n. */
static uint64_t max_prime(uint64_t n) {
  uint64_t p = 1;
  for (uint64_t f = 2; f * f <= n; f++)
    while (n % f == 0) {
      p = f;
      n /= f;
    }
  return n > 1 ? n : p;
}

int dspk__vk_fft(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *O = &op->out[0];
  int r2c = !dspk__dtype_is_complex(X->dtype);
  int dbl = X->dtype == DSPK_F64 || X->dtype == DSPK_C128;
  if (dbl && !d->has_f64)
    return dspk__vk_fail(ctx, DSPK_EDTYPE, "fft: this Vulkan device lacks shaderFloat64");
  uint64_t n = (uint64_t)X->shape[X->rank - 1];
  uint64_t total = (uint64_t)dspk__tensor_numel(X);
  if (total == 0)
    return 0;
  uint64_t batch = total / n;
  /* VkFFT 1.2.26 handles lengths with large prime factors by Bluestein's
   * algorithm, whose results were wrong in our tests (lavapipe): refuse
   * rather than answer wrongly. */
  if (max_prime(n) > 13)
    return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                         "fft: length %llu has the prime factor %llu; the vulkan backend "
                         "supports lengths whose prime factors are at most 13 (use cpu:0)",
                         (unsigned long long)n, (unsigned long long)max_prime(n));
  size_t xes = dspk__dtype_size(X->dtype), oes = dspk__dtype_size(O->dtype);
  VkDeviceSize xoff = X->mem->off + X->offset, ooff = O->mem->off + O->offset;
  if (xoff % xes || ooff % oes)
    return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                         "fft: operands must start at a multiple of their element size");
  if (r2c && (n % 2 || total > UINT32_MAX / 2))
    return total > UINT32_MAX / 2
               ? dspk__vk_fail(ctx, DSPK_ELIMIT, "fft: real input above 2^31 elements")
               : rfft_odd(d, X, O, n, batch, dbl, ctx);
  if (r2c && (n % 2 || total > UINT32_MAX / 2))
    return total > UINT32_MAX / 2
               ? dspk__vk_fail(ctx, DSPK_ELIMIT, "fft: real input above 2^31 elements")
               : rfft_odd(d, X, O, n, batch, dbl, ctx);
  struct dspk__vkfft_desc desc = {.n = n,
                                  .batch = batch,
                                  .dbl = dbl,
                                  .r2c = r2c,
                                  .buf = O->mem->buf,
                                  .bufsize = O->mem->bufsize,
                                  .inbuf = r2c ? X->mem->buf : VK_NULL_HANDLE,
                                  .insize = r2c ? X->mem->bufsize : 0};
  struct fplan *p = NULL;
  int r = get_plan(d, &desc, &p, ctx);
  if (r)
    return r;
  VkCommandBuffer cb;
  if ((r = dspk__vk_cmd(d, &cb)))
    return r;
  if (!r2c) {
    VkBufferCopy c = {.srcOffset = xoff, .dstOffset = ooff, .size = dspk__tensor_nbytes(X)};
    VK(CmdCopyBuffer)(cb, X->mem->buf, O->mem->buf, 1, &c);
    dspk__vk_barrier(d);
  }
  r = dspk__vkfft_append(p->f, cb, op->u.fft.inverse, O->mem->buf, ooff,
                         r2c ? X->mem->buf : VK_NULL_HANDLE, r2c ? xoff : 0);
  if (r)
    return dspk__vk_fail(ctx, DSPK_EDEVICE, "fft: VkFFT could not record (VkFFTResult %d)",
                         -1000 - r);
  dspk__vk_barrier(d);
  return 0;
}
