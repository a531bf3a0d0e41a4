/*
 * Run-time compilation (NVRTC, hiprtc: the driver's rtc_compile), always
 * through the persistent kernel cache (cache/cache.h) when the device has
 * one: the key covers the device (runtime, name, arch, UUID, driver
 * version), the compiler and its version, the source and the options, so a restarted daemon compiles nothing it
 * compiled before.  Also the per-device table of generated modules (one per
 * kernel family and dtype, loaded on first use) and the 1-D launcher.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/kcompile.h"
#include "backends/common/srccheck.h"
#include "proto/utf8.h"
#include "backends/gpurt/gpurt.h"
#include "cache/cache.h"

#define DRV (dev->drv)

struct dspk__cache_devid dspk__gpurt_devid(const struct dspk__dev *dev) {
  return (struct dspk__cache_devid){.backend = dev->drv->name, .name = dev->info.name,
                                    .arch = dev->arch, .uuid = dev->info.uuid,
                                    .driver = dev->info.driver};
}

static void fill_key(struct dspk__dev *dev, struct dspk__kernel_key *k,
                     const char *name, const char *owner, const char *src, size_t len,
                     const char *opts, const char *nvver) {
  memset(k, 0, sizeof(*k));
  k->dev = dspk__gpurt_devid(dev);
  k->compiler = dev->drv->compiler;
  k->compiler_version = nvver;
  k->name = name;
  k->source = src;
  k->source_len = len;
  k->options = opts;
  k->owner = owner;
}

/* The texts a kernel key points to. */
struct key_bufs {
  char owner[24], opts[128], rtver[32];
};

/* The cache key of a kernel dev compiles from src (a client's: its owner's
 * alone), its texts in kb. */
static void cache_key(struct dspk__dev *dev, struct dspk__kernel_key *k, struct key_bufs *kb,
                      const char *name, const struct dspk__opctx *client, const char *src,
                      size_t len) {
  if (client)
    snprintf(kb->owner, sizeof kb->owner, "uid %u", (unsigned)client->owner);
  dev->drv->rtc_version(kb->rtver, sizeof kb->rtver);
  dev->drv->rtc_opts(dev->arch, kb->opts, sizeof kb->opts);
  fill_key(dev, k, name, client ? kb->owner : NULL, src, len, kb->opts, kb->rtver);
}

void dspk__gpurt_store_client(struct dspk__dev *dev, const char *name,
                              const struct dspk__opctx *client, const char *src, size_t len,
                              const void *cubin, size_t cubin_len,
                              char cache_id[DSPK__HASH_HEX]) {
  struct dspk__kernel_key key;
  struct key_bufs kb;
  if (!dev->env.cache)
    return;
  cache_key(dev, &key, &kb, name, client, src, len);
  if (dspk__cache_kernel_put(dev->env.cache, &key, cubin, cubin_len) == 0)
    dspk__cache_kernel_id(&key, cache_id);
}

int dspk__gpurt_compile(const struct dspk__gpurt_driver *drv, struct dspk__dev *dev,
                        const char *arch, const char *name, const char *src, size_t len,
                        void **cubin, size_t *cubin_len, char *log, size_t loglen,
                        char cache_id[DSPK__HASH_HEX]) {
  return dspk__gpurt_compile_client(drv, dev, arch, name, NULL, src, len, cubin, cubin_len, log,
                                    loglen, cache_id);
}

/* The child of kcompile.h: drv's compiler for arch. */
struct rtc_child {
  const struct dspk__gpurt_driver *drv;
  const char *arch;
};

static int rtc_child_fn(void *ud, const char *src, size_t len, void **bin, size_t *binlen,
                        char *log, size_t loglen) {
  const struct rtc_child *c = ud;
  (void)len; /* NUL-terminated: the compiler reads up to the first NUL */
  return c->drv->rtc_compile(c->arch, "kernel.cu", src, bin, binlen, log, loglen);
}

int dspk__gpurt_compile_main(const struct dspk__gpurt_driver *drv, const char *arch) {
  char why[160];
  struct rtc_child c = {drv, arch};
  /* Loaded before the limits: the library's own pages are not the
   * source's doing. */
  if (drv->rtc_load(why, sizeof why) != 0)
    return 2;
  /* A trivial kernel sets the compiler up before the client's source
   * arrives (kcompile.h, spare). */
  return dspk__kcompile_serve(rtc_child_fn, &c, "extern \"C\" __global__ void dspk_warm() {}\n");
}

int dspk__gpurt_compile_client(const struct dspk__gpurt_driver *drv, struct dspk__dev *dev,
                               const char *arch, const char *name,
                               const struct dspk__opctx *client, const char *src, size_t len,
                               void **cubin, size_t *cubin_len, char *log, size_t loglen,
                               char cache_id[DSPK__HASH_HEX]) {
  char why[160], *text = NULL;
  struct dspk__kernel_key key;
  struct key_bufs kb;
  struct dspk__cache *cache = dev ? dev->env.cache : NULL;
  size_t n = 0;
  void *bin = NULL;
  int rc;
  if (dev)
    drv = dev->drv;
  if (log && loglen)
    log[0] = 0;
  if (cache_id)
    cache_id[0] = 0;
  /* NVRTC and hiprtc have no include callback: they open any path a source
   * names.  Refused from the text, before the compiler sees it (srccheck.h). */
  if (dspk__src_check(src, len, DSPK__SRC_CUDA, name, log, loglen))
    return DSPK_ECOMPILE;
  if (drv->rtc_load(why, sizeof(why)) != 0) {
    if (log && loglen)
      snprintf(log, loglen, "%s unavailable: %s", drv->compiler, why);
    return DSPK_ENOTSUP;
  }
  if (dev)
    arch = dev->arch;
  if (cache) {
    cache_key(dev, &key, &kb, name, client, src, len);
    if (dspk__cache_kernel_get(cache, &key, &bin, &n) == 0) {
      dev->kernel_cache_hits++;
      if (cache_id)
        dspk__cache_kernel_id(&key, cache_id);
      *cubin = bin;
      *cubin_len = n;
      return 0;
    }
  }
  /* The compilers want a NUL-terminated source. */
  text = malloc(len + 1);
  if (!text)
    return DSPK_ENOMEM;
  memcpy(text, src, len);
  text[len] = 0;
  if (client && dev && dev->env.compile_exe) {
    /* A client's source: in a child, under kcompile.h's limits. */
    char lang[64];
    snprintf(lang, sizeof lang, "%s:%s", drv->lang, arch);
    rc = dspk__kcompile_run(&dev->kspare, dev->env.compile_exe, lang, text, strlen(text),
                            client->cancel, &bin, &n, log, loglen);
  } else {
    rc = drv->rtc_compile(arch, name, text, &bin, &n, log, loglen);
  }
  free(text);
  if (rc)
    return rc;
  if (dev)
    dev->kernels_compiled++;
  /* A failed put costs a later compile, never correctness.  A client's
   * module is stored by dspk__gpurt_store_client once it has loaded. */
  if (cache && !client && dspk__cache_kernel_put(cache, &key, bin, n) == 0 && cache_id)
    dspk__cache_kernel_id(&key, cache_id);
  *cubin = bin;
  *cubin_len = n;
  return 0;
}

int dspk__gpurt_kfunc(struct dspk__dev *dev, enum dspk__kfamily f, dspk_dtype dt,
                     const char *entry, dspk__gfunc *out,
                     struct dspk__opctx *ctx) {
  struct dspk__gpurt_module *m;
  int r;
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
      return dspk__gpurt_msg(ctx, rc, "no %s kernel for %s",
                            dspk__kfamily_name(f), dspk__dtype_name(dt));
    snprintf(name, sizeof(name), "dspk_%s_%s.cu", dspk__kfamily_name(f),
             dspk__kfamily_typed(f) ? dspk__dtype_name(dt) : "any");
    rc = dspk__gpurt_compile(DRV, dev, NULL, name, src, len, &bin, &blen, log, sizeof(log),
                             m->cache_id);
    free(src);
    if (rc)
      return dspk__gpurt_msg(ctx, rc, "%s", log);
    r = DRV->module_load(&m->mod, bin);
    free(bin);
    if (r != 0)
      return dspk__gpurt_err(dev, ctx, "cuModuleLoadData", r);
    m->loaded = 1;
  } else { /* served from memory: a use of its cache entry */
    dspk__cache_kernel_used(dev->env.cache, m->cache_id);
  }
  r = DRV->module_func(out, m->mod, entry);
  if (r != 0)
    return dspk__gpurt_err(dev, ctx, entry, r);
  return 0;
}

void dspk__gpurt_modules_unload(struct dspk__dev *dev) {
  for (int f = 0; f < DSPK__K_COUNT; f++)
    for (int t = 0; t < DSPK_DTYPE_COUNT; t++) {
      struct dspk__gpurt_module *m = &dev->mods[f][t];
      if (m->loaded && !dev->ctx_dead)
        DRV->module_unload(m->mod);
      m->loaded = 0;
    }
}

int dspk__gpurt_launch1d_wave(struct dspk__dev *dev, dspk__gfunc fn, int64_t n, int per_sm,
                              void **args, struct dspk__opctx *ctx) {
  /* 256 threads; enough blocks to cover n, at most per_sm per
   * multiprocessor (grid-stride loops do the rest). */
  int64_t blocks = (n + 255) / 256;
  int64_t cap = (int64_t)dev->sms * per_sm;
  int r;
  if (n <= 0)
    return 0;
  if (blocks > cap)
    blocks = cap;
  r = DRV->launch(fn, (unsigned)blocks, 1, 1, 256, 1, 1, 0, dev->stream, args);
  return r == 0 ? 0 : dspk__gpurt_err(dev, ctx, "cuLaunchKernel", r);
}

int dspk__gpurt_launch1d(struct dspk__dev *dev, dspk__gfunc fn, int64_t n,
                        void **args, struct dspk__opctx *ctx) {
  /* The autotune framework replaces this choice when it lands. */
  return dspk__gpurt_launch1d_wave(dev, fn, n, 32, args, ctx);
}
