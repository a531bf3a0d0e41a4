/*
 * NVRTC compilation for the CUDA backend, always through the persistent
 * kernel cache (cache/cache.h) when the device has one: the key covers the
 * device (name, arch, UUID, driver version), NVRTC's version, the generated
 * source and the options, so a restarted daemon compiles nothing it
 * compiled before.  Also the per-device table of generated modules (one per
 * kernel family and dtype, loaded on first use) and the 1-D launcher.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/srccheck.h"
#include "proto/utf8.h"
#include "backends/cuda/cuda_internal.h"
#include "cache/cache.h"

#define NV dspk__nvrtc

struct dspk__cache_devid dspk__cuda_devid(const struct dspk__dev *dev) {
  return (struct dspk__cache_devid){.backend = "cuda", .name = dev->info.name,
                                    .arch = dev->arch, .uuid = dev->info.uuid,
                                    .driver = dev->info.driver};
}

static void fill_key(struct dspk__dev *dev, struct dspk__kernel_key *k,
                     const char *name, const char *src, size_t len,
                     const char *opts, const char *nvver) {
  memset(k, 0, sizeof(*k));
  k->dev = dspk__cuda_devid(dev);
  k->compiler = "nvrtc";
  k->compiler_version = nvver;
  k->name = name;
  k->source = src;
  k->source_len = len;
  k->options = opts;
}

int dspk__cuda_compile(struct dspk__dev *dev, const char *arch,
                       const char *name, const char *src, size_t len,
                       void **cubin, size_t *cubin_len, char *log,
                       size_t loglen) {
  char why[160], opt_arch[64], nvver[32], *text = NULL;
  const char *opts[2];
  struct dspk__kernel_key key;
  struct dspk__cache *cache = dev ? dev->env.cache : NULL;
  nvrtcProgram prog = NULL;
  nvrtcResult r;
  size_t n = 0;
  void *bin = NULL;
  int rc;
  if (log && loglen)
    log[0] = 0;
  /* NVRTC has no include callback: it opens any path a source names.
   * Refused from the text, before NVRTC sees it (srccheck.h). */
  if (dspk__src_check(src, len, DSPK__SRC_CUDA, name, log, loglen))
    return DSPK_ECOMPILE;
  if (dspk__cuda_load_nvrtc(why, sizeof(why)) != 0) {
    if (log && loglen)
      snprintf(log, loglen, "NVRTC unavailable: %s", why);
    return DSPK_ENOTSUP;
  }
  if (dev)
    arch = dev->arch;
  snprintf(opt_arch, sizeof(opt_arch), "--gpu-architecture=%s", arch);
  snprintf(nvver, sizeof(nvver), "%d.%d", NV.major, NV.minor);
  opts[0] = opt_arch;
  opts[1] = "--std=c++14";
  if (cache) {
    char joined[128];
    snprintf(joined, sizeof(joined), "%s %s", opts[0], opts[1]);
    fill_key(dev, &key, name, src, len, joined, nvver);
    if (dspk__cache_kernel_get(cache, &key, &bin, &n) == 0) {
      dev->kernel_cache_hits++;
      *cubin = bin;
      *cubin_len = n;
      return 0;
    }
  }
  /* NVRTC wants a NUL-terminated source. */
  text = malloc(len + 1);
  if (!text)
    return DSPK_ENOMEM;
  memcpy(text, src, len);
  text[len] = 0;
  if ((r = NV.nvrtcCreateProgram(&prog, text, name, 0, NULL, NULL)) != NVRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcCreateProgram: %s", NV.nvrtcGetErrorString(r));
    rc = r == NVRTC_ERROR_OUT_OF_MEMORY ? DSPK_ENOMEM : DSPK_ECOMPILE;
    goto out;
  }
  r = NV.nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t ls = 0;
    if (log && loglen) {
      int k = snprintf(log, loglen, "NVRTC (%s) failed to compile %s: ", arch, name);
      if (k > 0 && (size_t)k < loglen && NV.nvrtcGetProgramLogSize(prog, &ls) == NVRTC_SUCCESS) {
        char *full = malloc(ls + 1);
        if (full && NV.nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS) {
          full[ls] = 0;
          dspk__format(log + k, loglen - (size_t)k, "%s", full);
        }
        free(full);
      }
    }
    rc = DSPK_ECOMPILE;
    goto out;
  }
  if ((r = NV.nvrtcGetCUBINSize(prog, &n)) != NVRTC_SUCCESS || n == 0) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcGetCUBINSize: %s", NV.nvrtcGetErrorString(r));
    rc = DSPK_ECOMPILE;
    goto out;
  }
  bin = malloc(n);
  if (!bin) {
    rc = DSPK_ENOMEM;
    goto out;
  }
  if ((r = NV.nvrtcGetCUBIN(prog, bin)) != NVRTC_SUCCESS) {
    if (log && loglen)
      snprintf(log, loglen, "nvrtcGetCUBIN: %s", NV.nvrtcGetErrorString(r));
    free(bin);
    rc = DSPK_ECOMPILE;
    goto out;
  }
  if (dev)
    dev->kernels_compiled++;
  /* A failed put costs a later compile, never correctness. */
  if (cache)
    dspk__cache_kernel_put(cache, &key, bin, n);
  *cubin = bin;
  *cubin_len = n;
  rc = 0;
out:
  if (prog)
    NV.nvrtcDestroyProgram(&prog);
  free(text);
  return rc;
}

int dspk__cuda_kfunc(struct dspk__dev *dev, enum dspk__kfamily f, dspk_dtype dt,
                     const char *entry, CUfunction *out,
                     struct dspk__opctx *ctx) {
  struct dspk__cuda_module *m;
  CUresult r;
  int rc;
  if (!dspk__kfamily_typed(f))
    dt = (dspk_dtype)0;
  if ((unsigned)f >= DSPK__K_COUNT || (unsigned)dt >= DSPK_DTYPE_COUNT)
    return DSPK_EINVAL;
  m = &dev->mods[f][dt];
  if (!m->loaded) {
    char *src = NULL, name[64], log[2048];
    size_t len = 0, blen = 0;
    void *bin = NULL;
    if ((rc = dspk__kernel_source(f, dt, &src, &len)))
      return dspk__cuda_msg(ctx, rc, "no %s kernel for %s",
                            dspk__kfamily_name(f), dspk__dtype_name(dt));
    snprintf(name, sizeof(name), "dspk_%s_%s.cu", dspk__kfamily_name(f),
             dspk__kfamily_typed(f) ? dspk__dtype_name(dt) : "any");
    rc = dspk__cuda_compile(dev, NULL, name, src, len, &bin, &blen, log, sizeof(log));
    free(src);
    if (rc)
      return dspk__cuda_msg(ctx, rc, "%s", log);
    r = dspk__cu.cuModuleLoadData(&m->mod, bin);
    free(bin);
    if (r != CUDA_SUCCESS)
      return dspk__cuda_err(dev, ctx, "cuModuleLoadData", r);
    m->loaded = 1;
  }
  r = dspk__cu.cuModuleGetFunction(out, m->mod, entry);
  if (r != CUDA_SUCCESS)
    return dspk__cuda_err(dev, ctx, entry, r);
  return 0;
}

void dspk__cuda_modules_unload(struct dspk__dev *dev) {
  for (int f = 0; f < DSPK__K_COUNT; f++)
    for (int t = 0; t < DSPK_DTYPE_COUNT; t++) {
      struct dspk__cuda_module *m = &dev->mods[f][t];
      if (m->loaded && !dev->ctx_dead)
        dspk__cu.cuModuleUnload(m->mod);
      m->loaded = 0;
    }
}

int dspk__cuda_launch1d(struct dspk__dev *dev, CUfunction fn, int64_t n,
                        void **args, struct dspk__opctx *ctx) {
  /* 256 threads; enough blocks to cover n, at most 32 per multiprocessor
   * (grid-stride loops do the rest).  The autotune framework replaces this
   * choice when it lands. */
  int64_t blocks = (n + 255) / 256;
  int64_t cap = (int64_t)dev->sms * 32;
  CUresult r;
  if (n <= 0)
    return 0;
  if (blocks > cap)
    blocks = cap;
  r = dspk__cu.cuLaunchKernel(fn, (unsigned)blocks, 1, 1, 256, 1, 1, 0,
                              dev->stream, args, NULL);
  return r == CUDA_SUCCESS ? 0 : dspk__cuda_err(dev, ctx, "cuLaunchKernel", r);
}
