/*
 * fft on the Vulkan backend through VkFFT (vk_vkfft.c) or our own kernels
 * (vk_sfft.c, when the tuner measures them faster), with the cpu
 * backend's semantics: along the last axis, batched; complex input gives
 * numpy.fft.fft (numpy.fft.ifft, scaled by 1/n, when inverse), real input
 * numpy.fft.rfft.  Complex transforms run out of place: VkFFT reads X and
 * writes the output directly, one pass over memory per VkFFT upload (two
 * for 2^20 on the H200), nothing copied.  Real ones read X and write the
 * half spectrum (VkFFT's real transform needs an even n: odd ones go
 * through a complex transform of a widened copy, keeping the first n/2+1
 * outputs).  Lengths with a prime factor above 13 use our own Bluestein
 * (chirp-z) convolution over VkFFT power-of-two transforms.
 *
 * A VkFFT plan is made per (n, batch, precision, kind, in or out of
 * place, buffer sizes, tuning) and kept in the device's plan cache.  VkFFT
 * compiles its own GLSL at plan creation; its binaries are saved into the
 * persistent cache as a blob keyed by the device, driver, VkFFT version
 * and the whole plan key, so a restarted daemon loads them instead of
 * compiling (counted like other kernels).
 *
 * VkFFT binds buffers through descriptor sets it updates when a launch
 * names other buffers, which Vulkan forbids while earlier work still uses
 * them.  So a plan keeps up to FFT_INST instances (applications loaded
 * from the same binaries, sharing one temporary buffer): a launch takes
 * the instance already bound to its buffers, else an idle one, else makes
 * a new one, and only waits for the device when all are busy.
 *
 * Tuning: VkFFT reads the device's limits itself (shared memory, workgroup
 * sizes and invocations, warp size and defaults by vendor); which
 * coalescing width, threads per workgroup, register boost and twiddle
 * source suit a large transform best is measured instead of guessed (with
 * 48 KiB of shared memory, VkFFT's NVIDIA default of 32-byte coalescing is
 * what makes 2^20 two passes; 64 or 128 bytes read memory in larger pieces
 * but take three).  Large transforms (at least FFT_TUNE_MIN elements) on a
 * hardware device go through the autotune framework once per shape class
 * and device (candidates in `tunes`, then, for complex float
 * power-of-two lengths, our own kernels' short list from vk_sfft.c); the
 * winner is stored in the persistent cache with every candidate's timing.
 * On the H200 our kernels win at 2^20 x 16 (two passes of 1024, 0.92-0.95
 * of cuFFT against VkFFT's 0.76: docs/performance.md).
 */
#include <complex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/vulkan/vk.h"
#include "backends/vulkan/vk_sfft.h"
#include "backends/vulkan/vk_vkfft.h"
#include "cache/cache.h"
#include "proto/testhook.h"

#define FFT_INST 4                      /* instances of one plan */
#define FFT_TUNE_MIN ((uint64_t)1 << 21) /* elements; smaller: VkFFT's defaults */

static uint64_t max_prime(uint64_t n);

/* The bytes one binding may cover (maxStorageBufferRange), down to a
 * multiple of 16, VkFFT's largest complex element: its descriptors'
 * ranges are bufferSize rounded up to one. */
static uint64_t max_range(const struct dspk__dev *d) {
  return d->props.limits.maxStorageBufferRange & ~(uint64_t)15;
}

/* Rows that one VkFFT launch takes unsplit whatever the plan: VkFFT 1.2.26
 * puts a batch's rows on the workgroups' y, one or more rows a workgroup
 * (fit_rows). */
static uint64_t vkfft_rows(const struct dspk__dev *d) {
  return d->props.limits.maxComputeWorkGroupCount[1];
}

/* The bufferSize VkFFT is given for the VkBuffer of m.  VkFFT binds a
 * buffer as one descriptor from byte 0 to bufferSize, the offsets coming at
 * each launch, so a tensor is within it when it ends by then.  The
 * VkBuffer's size, at most max_range: a VkBuffer within the range keeps
 * its size (multiples of 16 from the pool), and so the plan keys and the
 * binaries stored under them; a larger one is bound up to the range only
 * (it was bound whole, past maxStorageBufferRange), and a tensor ending past
 * that goes through a temporary (dspk__vk_fft). */
static uint64_t vkfft_span(const struct dspk__dev *d, const struct dspk__mem *m) {
  uint64_t s = m->bufsize & ~(uint64_t)15;
  return s < max_range(d) ? s : max_range(d);
}

/* Records a copy of n bytes and a barrier into the open command buffer. */
static int copy_bytes(struct dspk__dev *d, VkBuffer src, VkDeviceSize soff, VkBuffer dst,
                      VkDeviceSize doff, VkDeviceSize n) {
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  VkBufferCopy c = {.srcOffset = soff, .dstOffset = doff, .size = n};
  VK(CmdCopyBuffer)(cb, src, dst, 1, &c);
  dspk__vk_barrier(d);
  return 0;
}

struct finst {
  struct dspk__vkfft *f;
  uint64_t last_use; /* timeline value of its last launch's submission */
};

struct fplan {
  int kind; /* 1: an FFT plan (see plan_evict in vk_backend.c) */
  struct dspk__vkfft_desc desc;
  void *bin; /* VkFFT's binaries, for further instances (may be NULL) */
  size_t binlen;
  char *blob; /* the persistent cache's blob of bin (malloc'd), NULL when none */
  int split; /* its launches split a dispatch: never launched (fit_rows) */
  int ninst;
  struct finst inst[FFT_INST];
};

/* A tuning decision kept in the plan cache (saves the autotune lookup):
 * a VkFFT configuration (tunes[winner]), or one of our kernels (sk). */
struct tplan {
  int kind; /* 3 */
  int winner, use_sk;
  struct dspk__vk_sfft_cfg sk;
};

struct bplan;
static void bplan_free(struct dspk__dev *d, struct bplan *p);

static void fplan_release(void *ud, void *res) {
  struct fplan *p = res;
  (void)ud;
  /* The first instance owns the temporary buffer the others share. */
  for (int i = p->ninst - 1; i >= 0; i--)
    dspk__vkfft_destroy(p->inst[i].f);
  free(p->bin);
  free(p->blob);
  free(p);
}

/* A plan may still be in use by submitted work: it is destroyed once the
 * device is done with it, through the retirement queue (no wait here). */
static void fplan_free(struct dspk__dev *d, struct fplan *p) {
  if (p)
    dspk__retire_push(&d->retire, fplan_release, d, p);
}

void dspk__vk_fft_plan_free(struct dspk__dev *d, void *plan) {
  int kind = *(int *)plan;
  if (kind == 2)
    bplan_free(d, plan);
  else if (kind == 3)
    free(plan);
  else if (kind == 4)
    dspk__vk_sfft_plan_free(d, plan);
  else
    fplan_free(d, plan);
}

static int plan_key(const struct dspk__vkfft_desc *desc, char *key, size_t len) {
  const struct dspk__vkfft_tune *t = &desc->tune;
  return snprintf(key, len,
                  "fft|n=%llu|b=%llu|d=%d|r=%d|o=%d|%llu|%llu|c=%u|t=%u|g=%u|w=%u|l=%u%s",
                  (unsigned long long)desc->n, (unsigned long long)desc->batch, desc->dbl,
                  desc->r2c, desc->oop, (unsigned long long)desc->bufsize,
                  (unsigned long long)desc->insize, t->coalesced, t->aim_threads,
                  t->reg_boost, t->bw_boost, t->lut,
                  /* real rows not merged in pairs, forward plan only
                   * (vk_vkfft.c): not the binaries saved before */
                  desc->r2c ? "|sf" : "");
}

/* Makes a plan with its first instance (binaries from the persistent cache,
 * else compiled and saved there).  The caller owns *out. */
static int make_plan(struct dspk__dev *d, const struct dspk__vkfft_desc *desc,
                     struct fplan **out, struct dspk__opctx *ctx) {
  char key[DSPK__PLANCACHE_KEY_MAX];
  plan_key(desc, key, sizeof key);
  if (!d->fft_fence) {
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkResult vr = VK(CreateFence)(d->dev, &fi, NULL, &d->fft_fence);
    if (vr != VK_SUCCESS) {
      d->fft_fence = VK_NULL_HANDLE;
      return dspk__vk_err(vr);
    }
  }
  struct fplan *p = calloc(1, sizeof *p);
  if (!p)
    return DSPK_ENOMEM;
  p->kind = 1;
  p->desc = *desc;
  /* VkFFT submits its own work while planning: ours goes first. */
  int r = dspk__vk_submit(d);
  if (r)
    goto fail;
  char name[600];
  snprintf(name, sizeof name, "vkfft/%d/%s/%s/%s/%s", dspk__vkfft_version(), d->uuid,
           d->driver, dspk__vk_glslang_version(), key);
  void *bin = NULL;
  size_t binlen = 0;
  r = -1;
  if (d->env.cache && dspk__cache_blob_get(d->env.cache, name, &bin, &binlen) == 0) {
    r = dspk__vkfft_create(d, &d->fft_fence, desc, bin, binlen, &p->inst[0].f, NULL, NULL);
    if (r == 0) {
      d->kernel_cache_hits++;
      p->bin = bin;
      p->binlen = binlen;
      p->blob = strdup(name); /* NULL: its later uses are not counted, no more */
    } else {
      /* Stored by a VkFFT of the same version for this device and driver
       * (the name says so): one it refuses was damaged.  Made again. */
      free(bin);
      (void)dspk__cache_blob_drop(d->env.cache, name, "VkFFT could not make its plan from it");
    }
  }
  if (r) {
    r = dspk__vkfft_create(d, &d->fft_fence, desc, NULL, 0, &p->inst[0].f, &p->bin,
                           &p->binlen);
    if (r == 0) {
      d->kernels_compiled++;
      if (p->bin && d->env.cache && dspk__cache_blob_put(d->env.cache, name, p->bin,
                                                         p->binlen) == 0)
        p->blob = strdup(name);
    }
  }
  if (r) {
    r = dspk__vk_fail(ctx, r == DSPK_ENOMEM ? r : DSPK_EDEVICE,
                      "fft: VkFFT could not plan n=%llu batch=%llu (VkFFTResult %d)",
                      (unsigned long long)desc->n, (unsigned long long)desc->batch,
                      r <= -1000 ? -1000 - r : r);
    goto fail;
  }
  p->ninst = 1;
  p->split = dspk__vkfft_split(p->inst[0].f);
  *out = p;
  return 0;
fail:
  free(p->bin);
  free(p->blob);
  free(p);
  return r;
}

static int get_plan(struct dspk__dev *d, const struct dspk__vkfft_desc *desc,
                    struct fplan **out, struct dspk__opctx *ctx) {
  char key[DSPK__PLANCACHE_KEY_MAX];
  int klen = plan_key(desc, key, sizeof key);
  struct fplan *p = dspk__plancache_get(&d->plans, key, (size_t)klen);
  if (p) {
    if (p->blob) /* served from memory: a use of the stored binaries */
      dspk__cache_blob_used(d->env.cache, p->blob);
    *out = p;
    return 0;
  }
  int r = make_plan(d, desc, &p, ctx);
  if (r)
    return r;
  if ((r = dspk__plancache_put(&d->plans, key, (size_t)klen, p))) {
    fplan_free(d, p);
    return r;
  }
  *out = p;
  return 0;
}

/* The most rows, up to *rows, that one launch of desc's plan (desc.batch
 * set to them) takes without splitting a dispatch.  Past the device's
 * maxComputeWorkGroupCount workgroups along an axis, VkFFT 1.2.26 splits a
 * dispatch, and the split launches write past the plan's last row, up to a
 * workgroup's rows (an H100: 15 and 31 rows past a batch of 2429281 rows
 * of 64 and of 16 c64, into whatever the buffer held there; test_vulkan
 * t_fft_guard).  Short rows share a workgroup, so a batch of several
 * million rows is mostly one launch; *rows is halved until its plan does
 * not split (the plans made are kept in the plan cache, so a shape seen
 * before finds its rows there). */
static int fit_rows(struct dspk__dev *d, struct dspk__vkfft_desc desc, uint64_t *rows,
                    struct dspk__opctx *ctx) {
  while (*rows > vkfft_rows(d)) {
    struct fplan *p;
    desc.batch = *rows;
    int r = get_plan(d, &desc, &p, ctx);
    if (r)
      return r;
    if (!p->split)
      return 0;
    *rows = (*rows + 1) / 2;
  }
  return 0;
}

static int reached(struct dspk__dev *d, uint64_t v) {
  uint64_t cur = 0;
  if (v == 0)
    return 1;
  return VK(GetSemaphoreCounterValue)(d->dev, d->timeline, &cur) == VK_SUCCESS && cur >= v;
}

/* Picks the instance of p that may launch on (buf, inbuf) now: one bound
 * to them, an idle one, a new one, or (all busy) the least recently used
 * once the device is done with it. */
static int pick_inst(struct dspk__dev *d, struct fplan *p, VkBuffer buf, VkBuffer inbuf,
                     struct finst **out) {
  int idle = -1, lru = 0;
  for (int i = 0; i < p->ninst; i++) {
    if (dspk__vkfft_bound(p->inst[i].f, buf, inbuf)) {
      *out = &p->inst[i];
      return 0;
    }
    if (p->inst[i].last_use < p->inst[lru].last_use)
      lru = i;
    if (idle < 0 && reached(d, p->inst[i].last_use))
      idle = i;
  }
  if (idle >= 0) {
    *out = &p->inst[idle];
    return 0;
  }
  if (p->ninst < FFT_INST && p->bin) {
    struct dspk__vkfft_desc desc = p->desc;
    desc.buf = buf;
    desc.inbuf = inbuf;
    desc.temp = VK_NULL_HANDLE;
    dspk__vkfft_temp(p->inst[0].f, &desc.temp, &desc.tempsize);
    int r = dspk__vk_submit(d); /* VkFFT may submit while planning */
    if (r == 0)
      r = dspk__vkfft_create(d, &d->fft_fence, &desc, p->bin, p->binlen,
                             &p->inst[p->ninst].f, NULL, NULL);
    if (r == 0) {
      p->inst[p->ninst].last_use = 0;
      *out = &p->inst[p->ninst++];
      return 0;
    }
  }
  /* Its last launch may be in the command buffer being recorded. */
  int r = dspk__vk_submit(d);
  if (r == 0)
    r = dspk__vk_wait_value(d, p->inst[lru].last_use);
  if (r)
    return r;
  *out = &p->inst[lru];
  return 0;
}

/* Records one transform of plan p into the open command buffer, followed
 * by a barrier.  inbuf: the input of r2c and out-of-place plans. */
static int fft_launch(struct dspk__dev *d, struct fplan *p, int inverse, VkBuffer buf,
                      VkDeviceSize off, VkBuffer inbuf, VkDeviceSize inoff,
                      struct dspk__opctx *ctx) {
  struct finst *in;
  VkCommandBuffer cb;
  if (p->split) /* it would write past its rows (fit_rows) */
    return dspk__vk_fail(ctx, DSPK_EDEVICE,
                         "fft: VkFFT's plan of n=%llu x %llu would split its dispatch",
                         (unsigned long long)p->desc.n, (unsigned long long)p->desc.batch);
  if (!p->desc.r2c && !p->desc.oop)
    inbuf = VK_NULL_HANDLE;
  int r = pick_inst(d, p, buf, inbuf, &in);
  if (r || (r = dspk__vk_cmd(d, &cb)))
    return r;
  r = dspk__vkfft_append(in->f, cb, inverse, buf, off, inbuf, inoff);
  if (r)
    return dspk__vk_fail(ctx, DSPK_EDEVICE, "fft: VkFFT could not record (VkFFTResult %d)",
                         -1000 - r);
  in->last_use = d->submitted + 1; /* what the open command buffer signals */
  dspk__vk_barrier(d);
  return 0;
}

/* ---- Bluestein (chirp-z) for lengths with a prime factor above 13 ------- */

/* X_k = c_k * sum_j (x_j c_j) conj(c_{k-j}), c_j = exp(s i pi j^2 / n): a
 * convolution of length M (a power of two >= 2n-1) done with VkFFT.  The
 * plan keeps the chirp c (n values) and the transform of the convolution
 * kernel b (M values), both made once; the chirp's phases are computed on
 * the host from j^2 mod 2n in integers, so they are exact for any n. */
struct bplan {
  int kind; /* 2: a Bluestein plan */
  struct dspk__mem *chirp, *bhat;
  uint64_t n, m;
};

static void bplan_free(struct dspk__dev *d, struct bplan *p) {
  dspk__vk_free(d, p->chirp);
  dspk__vk_free(d, p->bhat);
  free(p);
}

static int blue_kernel(struct dspk__dev *d, int dbl, struct dspk__vk_kernel **k,
                       struct dspk__opctx *ctx) {
  char src[4096];
  const char *T = dbl ? "dvec2" : "vec2", *R = dbl ? "double" : "float";
  snprintf(src, sizeof src,
           "#version 450\n"
           "layout(local_size_x = %d) in;\n"
           "#define T %s\n#define R %s\n"
           "layout(std430, binding = 0) readonly buffer BX { T x[]; };\n"
           "layout(std430, binding = 1) readonly buffer BC { T c[]; };\n"
           "layout(std430, binding = 2) readonly buffer BB { T bh[]; };\n"
           "layout(std430, binding = 3) buffer BT { T t[]; };\n"
           "layout(std430, binding = 4) writeonly buffer BO { T o[]; };\n"
           "layout(std430, binding = 5) buffer BE { T ex[]; };\n"
           "layout(push_constant) uniform PC { uint total, n, m, ox, oo, mode; R scale; } pc;\n"
           "T cmul(T a, T b) { return T(a.x*b.x - a.y*b.y, a.x*b.y + a.y*b.x); }\n"
           "shared R red[%d];\n"
           "int rexp(uint r) { return int(ex[r].x); }\n"
           "T sc(T v, int e) { return ldexp(ldexp(v, ivec2(e / 2)), ivec2(e - e / 2)); }\n"
           "void main() {\n"
           "  if (pc.mode == 3u) {\n"
           /* a workgroup a row: the exponent e of its largest |part|
            * (0 for a row of zeros or with inf or NaN), kept in ex: not
            * in t, where VkFFT's transforms of the rows may write past
            * the last row */
           "    for (uint r = gl_WorkGroupID.x; r < pc.oo; r += gl_NumWorkGroups.x) {\n"
           "      R a = R(0);\n"
           "      for (uint j = gl_LocalInvocationID.x; j < pc.n; j += %du) {\n"
           "        T v = abs(x[pc.ox + r * pc.n + j]);\n"
           "        a = (v.x > a || isnan(v.x)) ? v.x : a;\n"
           "        a = (v.y > a || isnan(v.y)) ? v.y : a;\n"
           "      }\n"
           "      red[gl_LocalInvocationID.x] = a;\n"
           "      barrier();\n"
           "      for (uint h = %du; h > 0u; h >>= 1) {\n"
           "        if (gl_LocalInvocationID.x < h) {\n"
           "          R b = red[gl_LocalInvocationID.x + h];\n"
           "          if (b > red[gl_LocalInvocationID.x] || isnan(b))\n"
           "            red[gl_LocalInvocationID.x] = b;\n"
           "        }\n"
           "        barrier();\n"
           "      }\n"
           "      if (gl_LocalInvocationID.x == 0u) {\n"
           "        R mx = red[0];\n"
           "        int e = 0;\n"
           "        if (!isnan(mx) && !isinf(mx) && mx > R(0))\n"
           "          frexp(mx, e);\n"
           "        ex[r] = T(R(e), R(0));\n"
           "      }\n"
           "      barrier();\n"
           "    }\n"
           "    return;\n"
           "  }\n"
           "  uint stride = gl_NumWorkGroups.x * %du;\n"
           "  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += stride) {\n"
           "    if (pc.mode == 0u) {\n"
           /* each row scaled by 2^-e: its convolution's values of the
            * order of n m, not of n m max|x| (which overflowed), and
            * exact in binary floating point */
           "      uint r = i / pc.m, j = i %% pc.m;\n"
           "      t[i] = j < pc.n ? cmul(sc(x[pc.ox + r * pc.n + j], -rexp(r)), c[j])\n"
           "                      : T(0);\n"
           "    } else if (pc.mode == 1u) {\n"
           "      t[i] = cmul(t[i], bh[i %% pc.m]);\n"
           "    }\n"
           "  }\n"
           "  if (pc.mode == 2u) {\n"
           "    uint tot = pc.total / pc.m * pc.n;\n"
           "    for (uint i = gl_GlobalInvocationID.x; i < tot; i += stride) {\n"
           "      uint r = i / pc.n, k = i %% pc.n;\n"
           "      o[pc.oo + i] = sc(pc.scale * cmul(t[r * pc.m + k], c[k]), rexp(r));\n"
           "    }\n"
           "  }\n}\n",
           DSPK__VK_WG, T, R, DSPK__VK_WG, DSPK__VK_WG, DSPK__VK_WG / 2, DSPK__VK_WG);
  return dspk__vk_kernel(d, "bluestein", src, NULL, 0, "main", 6, 32, k, ctx);
}

static int blue_pass(struct dspk__dev *d, struct dspk__vk_kernel *k,
                     const struct dspk__vk_bind *b, int dbl, uint32_t total, uint32_t n,
                     uint32_t m, uint32_t ox, uint32_t oo, uint32_t mode, double scale) {
  struct {
    uint32_t total, n, m, ox, oo, mode;
    union { float f; double d; } scale;
  } pc = {total, n, m, ox, oo, mode, {0}};
  if (dbl)
    pc.scale.d = scale;
  else
    pc.scale.f = (float)scale;
  /* mode 3 (the rows' exponents): a workgroup a row, oo rows */
  uint32_t g = mode == 3 ? oo : (total + DSPK__VK_WG - 1) / DSPK__VK_WG;
  return dspk__vk_dispatch(d, k, b, 6, &pc, 32, g > 65535 ? 65535 : (g ? g : 1), 1, 1);
}

static int get_bplan(struct dspk__dev *d, uint64_t n, int dbl, int inverse, struct bplan **out,
                     struct dspk__opctx *ctx) {
  char key[96];
  int klen = snprintf(key, sizeof key, "bluestein|n=%llu|d=%d|i=%d", (unsigned long long)n,
                      dbl, inverse);
  struct bplan *p = dspk__plancache_get(&d->plans, key, (size_t)klen);
  if (p) {
    *out = p;
    return 0;
  }
  uint64_t m = 1;
  while (m < 2 * n - 1)
    m <<= 1;
  size_t es = dbl ? 16 : 8;
  p = calloc(1, sizeof *p);
  double *c = malloc(sizeof(double) * 2 * m), *bb = calloc(2 * m, sizeof(double));
  void *buf = malloc(es * m);
  int r = DSPK_ENOMEM;
  if (!p || !c || !bb || !buf)
    goto fail;
  p->kind = 2;
  p->n = n;
  p->m = m;
  double s = inverse ? 1.0 : -1.0;
  for (uint64_t j = 0; j < n; j++) {
    uint64_t q = (j * j) % (2 * n); /* j < 2^31: no overflow */
    double ang = s * M_PI * (double)q / (double)n;
    c[2 * j] = cos(ang);
    c[2 * j + 1] = sin(ang);
    bb[2 * j] = c[2 * j];
    bb[2 * j + 1] = -c[2 * j + 1];
    if (j) {
      bb[2 * (m - j)] = c[2 * j];
      bb[2 * (m - j) + 1] = -c[2 * j + 1];
    }
  }
  if ((r = dspk__vk_alloc(d, es * n, &p->chirp)) || (r = dspk__vk_alloc(d, es * m, &p->bhat)))
    goto fail;
  for (int t = 0; t < 2; t++) {
    const double *v = t ? bb : c;
    uint64_t cnt = t ? m : n;
    for (uint64_t i = 0; i < 2 * cnt; i++) {
      if (dbl)
        ((double *)buf)[i] = v[i];
      else
        ((float *)buf)[i] = (float)v[i];
    }
    if ((r = dspk__vk_write(d, t ? p->bhat : p->chirp, 0, buf, es * cnt)))
      goto fail;
  }
  struct dspk__vkfft_desc desc = {.n = m, .batch = 1, .dbl = dbl, .buf = p->bhat->buf,
                                  .bufsize = vkfft_span(d, p->bhat)};
  struct fplan *fp;
  if ((r = get_plan(d, &desc, &fp, ctx)) ||
      (r = fft_launch(d, fp, 0, p->bhat->buf, p->bhat->off, VK_NULL_HANDLE, 0, ctx)))
    goto fail;
  if ((r = dspk__vk_submit(d)))
    goto fail;
  if ((r = dspk__plancache_put(&d->plans, key, (size_t)klen, p)))
    goto fail;
  free(c);
  free(bb);
  free(buf);
  *out = p;
  return 0;
fail:
  if (p)
    bplan_free(d, p);
  free(c);
  free(bb);
  free(buf);
  return r;
}

/* dst rows (n complex) = FFT of src rows, any n, through Bluestein.  The
 * convolution's temporaries hold m + 1 values a row (m >= 2n-1, a power of
 * two; and the row's exponent): the rows go in chunks whose temporary, and
 * VkFFT's own of the same size, stay within maxStorageBufferRange, and
 * whose VkFFT plan does not split its dispatch (fit_rows).  A row alone
 * larger is ELIMIT (docs/protocol.md, fft). */
static int bluestein(struct dspk__dev *d, const struct dspk__vk_bind *src, uint32_t soff,
                     const struct dspk__vk_bind *dst, uint32_t doff, uint64_t n,
                     uint64_t batch, int dbl, int inverse, struct dspk__opctx *ctx) {
  size_t es = dbl ? 16 : 8;
  uint64_t m = 1;
  while (m < 2 * n - 1)
    m <<= 1;
  if ((m + 1) * es > max_range(d))
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "fft: n=%llu takes Bluestein's convolution of m=%llu points a row "
                         "(the power of two from 2n-1), whose %llu bytes ((m+1) x %zu) exceed "
                         "this device's maxStorageBufferRange %llu",
                         (unsigned long long)n, (unsigned long long)m,
                         (unsigned long long)((m + 1) * es), es,
                         (unsigned long long)d->props.limits.maxStorageBufferRange);
  struct bplan *p;
  struct dspk__vk_kernel *k;
  int r = get_bplan(d, n, dbl, inverse, &p, ctx);
  if (r || (r = blue_kernel(d, dbl, &k, ctx)))
    return r;
  uint64_t chunk = max_range(d) / ((m + 1) * es);
  uint64_t rows = batch < chunk ? batch : chunk;
  struct dspk__mem *t, *e;
  /* t: the convolution's rows; e: each row's exponent (mode 3), apart
   * from what VkFFT transforms (they lay after the rows, where VkFFT wrote
   * when its dispatch was split: fit_rows) */
  if ((r = dspk__vk_alloc(d, es * m * rows, &t)))
    return r;
  if ((r = dspk__vk_alloc(d, es * rows, &e))) {
    dspk__vk_free(d, t);
    return r;
  }
  r = fit_rows(d, (struct dspk__vkfft_desc){.n = m, .dbl = dbl, .buf = t->buf,
                                            .bufsize = vkfft_span(d, t)},
               &rows, ctx);
  for (uint64_t r0 = 0; r0 < batch && r == 0; r0 += rows) {
    uint64_t kr = batch - r0 < rows ? batch - r0 : rows;
    uint32_t tot = (uint32_t)(m * kr), so = soff + (uint32_t)(r0 * n),
             dof = doff + (uint32_t)(r0 * n);
    struct dspk__vk_bind b[6] = {*src,
                                 {p->chirp->buf, p->chirp->off, es * n},
                                 {p->bhat->buf, p->bhat->off, es * m},
                                 {t->buf, t->off, es * m * kr},
                                 *dst,
                                 {e->buf, e->off, es * kr}};
    struct dspk__vkfft_desc desc = {.n = m, .batch = kr, .dbl = dbl, .buf = t->buf,
                                    .bufsize = vkfft_span(d, t)};
    struct fplan *fp;
    /* The plan first: making it may submit what is recorded so far. */
    if ((r = get_plan(d, &desc, &fp, ctx)) ||
        (r = blue_pass(d, k, b, dbl, tot, (uint32_t)n, (uint32_t)m, so, (uint32_t)kr, 3,
                       1.0)) ||
        (r = blue_pass(d, k, b, dbl, tot, (uint32_t)n, (uint32_t)m, so, 0, 0, 1.0)) ||
        (r = fft_launch(d, fp, 0, t->buf, t->off, VK_NULL_HANDLE, 0, ctx)) ||
        (r = blue_pass(d, k, b, dbl, tot, (uint32_t)n, (uint32_t)m, 0, 0, 1, 1.0)) ||
        (r = fft_launch(d, fp, 1, t->buf, t->off, VK_NULL_HANDLE, 0, ctx)))
      break;
    r = blue_pass(d, k, b, dbl, tot, (uint32_t)n, (uint32_t)m, 0, dof, 2,
                  inverse ? 1.0 / (double)n : 1.0);
  }
  dspk__vk_submit(d);
  dspk__vk_free(d, t);
  dspk__vk_free(d, e);
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

/* rfft of odd n (or n with a large prime factor): widen, complex
 * transform, keep the half spectrum; in chunks of rows whose widened copy
 * (and VkFFT's temporary, n + 1 values a row at most) stays within
 * maxStorageBufferRange.  bx, bo: X and the output, bound. */
static int rfft_odd(struct dspk__dev *d, const struct dspk__vk_bind *bx, uint32_t ex,
                    const struct dspk__vk_bind *bo, uint32_t eo, uint64_t n, uint64_t batch,
                    int dbl, struct dspk__opctx *ctx) {
  size_t ces = dbl ? 16 : 8;
  if ((n + 1) * ces > max_range(d))
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "fft: a row of n=%llu needs %llu bytes of a temporary ((n+1) x %zu, "
                         "real rows widened to complex), more than this device's "
                         "maxStorageBufferRange %llu",
                         (unsigned long long)n, (unsigned long long)((n + 1) * ces), ces,
                         (unsigned long long)d->props.limits.maxStorageBufferRange);
  uint64_t chunk = max_range(d) / ((n + 1) * ces);
  uint64_t rows = batch < chunk ? batch : chunk, h = n / 2 + 1;
  struct dspk__mem *t;
  int r = dspk__vk_alloc(d, (size_t)(n * rows) * ces, &t);
  if (r)
    return r;
  if (max_prime(n) <= 13) /* (Bluestein fits its own) */
    r = fit_rows(d, (struct dspk__vkfft_desc){.n = n, .dbl = dbl, .buf = t->buf,
                                              .bufsize = vkfft_span(d, t)},
                 &rows, ctx);
  for (uint64_t r0 = 0; r0 < batch && r == 0; r0 += rows) {
    uint64_t kr = batch - r0 < rows ? batch - r0 : rows;
    struct dspk__vk_bind bt = {t->buf, t->off, n * kr * ces};
    if ((r = fft_copy(d, dbl, 0, bx, ex + (uint32_t)(r0 * n), &bt, 0, (uint32_t)(n * kr), 0, 0,
                      ctx)))
      break;
    if (max_prime(n) > 13) {
      /* in place through Bluestein: its output pass reads a separate buffer */
      r = bluestein(d, &bt, 0, &bt, 0, n, kr, dbl, 0, ctx);
    } else {
      struct dspk__vkfft_desc desc = {.n = n, .batch = kr, .dbl = dbl, .buf = t->buf,
                                      .bufsize = vkfft_span(d, t)};
      struct fplan *p;
      if ((r = get_plan(d, &desc, &p, ctx)) == 0)
        r = fft_launch(d, p, 0, t->buf, t->off, VK_NULL_HANDLE, 0, ctx);
    }
    if (r == 0)
      r = fft_copy(d, dbl, 1, &bt, 0, bo, eo + (uint32_t)(r0 * h), (uint32_t)(h * kr),
                   (uint32_t)n, (uint32_t)h, ctx);
  }
  dspk__vk_submit(d);
  dspk__vk_free(d, t);
  return r;
}

/* ---- tuning ------------------------------------------------------------- */

/* The candidate configurations (names are stored as the winner; changing
 * the list re-tunes, its hash being part of the key).  "vendor" is
 * VkFFT's own choice for the device's vendor. */
static const struct {
  const char *name;
  struct dspk__vkfft_tune t;
} tunes[] = {
    {"vendor", {0, 0, 0, 0, 0}},      {"t256", {0, 256, 0, 0, 0}},
    {"t64", {0, 64, 0, 0, 0}},        {"lut", {0, 0, 0, 0, 1}},
    {"rb1", {0, 0, 1, 0, 0}},         {"c64", {64, 0, 0, 0, 0}},
    {"c128", {128, 0, 0, 0, 0}},      {"c64-t256", {64, 256, 0, 0, 0}},
    {"c128-t256", {128, 256, 0, 0, 0}},
};
#define NTUNES ((int)(sizeof tunes / sizeof tunes[0]))

/* Tune on hardware devices for large transforms; DSPK_VK_FFT_TUNE=force
 * tunes any size on any device (tests), =off never, =<candidate name>
 * uses that candidate for every out-of-place transform it can run (tests
 * and measurements: *forced gets its index in tunes, or NTUNES with *sk
 * set for one of our kernels ("sk:..."); else -1). */
static int want_tune(struct dspk__dev *d, uint64_t total, int *forced,
                     struct dspk__vk_sfft_cfg *sk) {
  const char *e = DSPK_TEST_HOOK("DSPK_VK_FFT_TUNE");
  *forced = -1;
  if (e && strcmp(e, "off") == 0)
    return 0;
  if (e && strcmp(e, "force") == 0)
    return 1;
  for (int i = 0; e && i < NTUNES; i++)
    if (strcmp(e, tunes[i].name) == 0) {
      *forced = i;
      return 0;
    }
  if (e && dspk__vk_sfft_parse(e, sk) == 0) {
    *forced = NTUNES;
    return 0;
  }
  return d->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU && total >= FFT_TUNE_MIN;
}

#define SK_CANDS 8 /* of our kernels, at most, per shape */
#define NCANDS (NTUNES + SK_CANDS)

/* Our kernels that may run desc's transform (complex float, out of
 * place, power-of-two n): the tuner's candidates after tunes[]. */
static int sk_cands(struct dspk__dev *d, const struct dspk__vkfft_desc *desc,
                    struct dspk__vk_sfft_cfg *out) {
  if (desc->dbl || desc->r2c || !desc->oop)
    return 0;
  return dspk__vk_sfft_cands(d, desc->n, desc->batch, out, SK_CANDS);
}

#define TUNE_SAMPLES 32 /* output values checked per candidate and row */

struct tune_ud {
  struct dspk__dev *d;
  struct dspk__vkfft_desc desc;
  int inverse;
  VkDeviceSize off, inoff;
  struct fplan *plans[NTUNES]; /* VkFFT's candidates' plans */
  int checked[NCANDS];
  struct dspk__vk_sfft_cfg sk[SK_CANDS]; /* candidates NTUNES.. */
  void *skplans[SK_CANDS];               /* their plans (only the winner's is kept) */
  int nsk;
  struct dspk__vk_bind bx, bo;         /* the operands, for our kernels */
  uint32_t ex, eo;
  /* The check: exact DFT values at positions pos[] of the first and last
   * row, computed on the host from X; the output is read from om. */
  struct dspk__mem *xm, *om;
  VkDeviceSize xelem, oelem; /* the operands' first elements in xm, om */
  int ref_state;             /* 0: not made yet, 1: made, <0: its error */
  int nsamp;
  uint64_t pos[2 * TUNE_SAMPLES];
  double complex ref[2 * TUNE_SAMPLES];
  double refmax;
  int cand;        /* the candidate rec_cand records */
  int have_ns;     /* the last run was timed by the device: ns */
  uint64_t ns;
};

/* Fills u's reference: the exact DFT (phases from j*k mod n in integers)
 * of X's first and last rows at a few positions.  Returns 0, or an error
 * (then every candidate counts as failed: VkFFT's defaults are used). */
static int tune_ref(struct tune_ud *u) {
  uint64_t n = u->desc.n, batch = u->desc.batch;
  size_t es = u->desc.dbl ? 16 : 8;
  int per = TUNE_SAMPLES;
  while (per > 2 && (uint64_t)per * n > ((uint64_t)1 << 26))
    per /= 2; /* bounds the host work to about 2^27 multiply-adds */
  double complex *x = malloc(n * sizeof *x);
  double *tw = malloc(2 * n * sizeof *tw);
  void *raw = malloc(n * es);
  int r = DSPK_ENOMEM;
  if (!x || !tw || !raw)
    goto out;
  for (uint64_t m = 0; m < n; m++) {
    double a = (u->inverse ? 2.0 : -2.0) * M_PI * (double)m / (double)n;
    tw[2 * m] = cos(a);
    tw[2 * m + 1] = sin(a);
  }
  u->nsamp = 0;
  u->refmax = 0;
  for (int row = 0; row < 2; row++) {
    uint64_t b = row ? batch - 1 : 0;
    if ((r = dspk__vk_read(u->d, u->xm, (size_t)((u->xelem + b * n) * es), raw, n * es)))
      goto out;
    for (uint64_t j = 0; j < n; j++)
      x[j] = u->desc.dbl ? ((double *)raw)[2 * j] + I * ((double *)raw)[2 * j + 1]
                         : ((float *)raw)[2 * j] + I * ((float *)raw)[2 * j + 1];
    for (int s = 0; s < per; s++) {
      uint64_t k = s == 0 ? 0 : s == 1 ? n - 1 : (uint64_t)s * 2654435761u % n;
      double complex acc = 0;
      uint64_t ph = 0;
      for (uint64_t j = 0; j < n; j++) {
        acc += x[j] * (tw[2 * ph] + I * tw[2 * ph + 1]);
        ph += k;
        if (ph >= n)
          ph -= n;
      }
      if (u->inverse)
        acc /= (double)n;
      u->pos[u->nsamp] = b * n + k;
      u->ref[u->nsamp++] = acc;
      if (cabs(acc) > u->refmax)
        u->refmax = cabs(acc);
    }
  }
  r = 0;
out:
  free(x);
  free(tw);
  free(raw);
  return r;
}

/* Compares candidate i's output (its run has finished) with the reference:
 * 0 when it matches, DSPK_EDEVICE when a configuration computes wrong
 * values (it is then left out of the tuning). */
static int tune_check(struct tune_ud *u, int i) {
  size_t es = u->desc.dbl ? 16 : 8;
  double tol = (u->desc.dbl ? 1e-9 : 1e-3) * (u->refmax > 0 ? u->refmax : 1);
  for (int s = 0; s < u->nsamp; s++) {
    unsigned char v[16];
    int r = dspk__vk_read(u->d, u->om, (size_t)((u->oelem + u->pos[s]) * es), v, es);
    if (r)
      return r;
    double re, im;
    if (u->desc.dbl) {
      memcpy(&re, v, 8);
      memcpy(&im, v + 8, 8);
    } else {
      float f[2];
      memcpy(f, v, 8);
      re = f[0];
      im = f[1];
    }
    if (!(cabs(re + I * im - u->ref[s]) <= tol))
      return DSPK_EDEVICE;
  }
  u->checked[i] = 1;
  return 0;
}

/* Runs candidate i TUNE_REPS times back to back on the real operands, to
 * completion: what is timed is the device's throughput, as in a stream of
 * tasks, more than the fixed cost of one submission and wait (about
 * 0.1 ms on the H200, half a large transform's time, which would let the
 * noise of that cost pick the winner). */
#define TUNE_REPS 4
static _Thread_local unsigned fft_timed; /* tuner runs timed by timestamps */
unsigned dspk__vk_fft_timed(void) { return fft_timed; }

/* Records one transform of candidate u->cand into the open command buffer. */
static int rec_cand(void *ud, int k) {
  struct tune_ud *u = ud;
  int i = u->cand;
  (void)k;
  return i >= NTUNES ? dspk__vk_sfft(u->d, &u->sk[i - NTUNES], u->desc.n, u->desc.batch,
                                     u->inverse, &u->bx, u->ex, &u->bo, u->eo,
                                     &u->skplans[i - NTUNES], NULL)
                     : fft_launch(u->d, u->plans[i], u->inverse, u->desc.buf, u->off,
                                  u->desc.inbuf, u->inoff, NULL);
}

/* The runs are timed by the device's timestamps where its queue has them
 * (tune_ns): by the clock, the submit and wait around them spread as much
 * as configurations differ (on the H200, daemons that chose differently
 * gave fft 2^20 x 16 at 0.194 and 0.203 ms). */
static int tune_run(void *ud, int i) {
  struct tune_ud *u = ud;
  int r = 0;
  if (i < NTUNES && !u->plans[i]) {
    struct dspk__vkfft_desc desc = u->desc;
    desc.tune = tunes[i].t;
    if ((r = make_plan(u->d, &desc, &u->plans[i], NULL)))
      return r;
  }
  if (i < NTUNES && u->plans[i]->split)
    return DSPK_ENOTSUP; /* it would write past the output (fit_rows) */
  u->cand = i;
  u->have_ns = 0;
  if (dspk__vk_timestamps(u->d)) {
    double ms;
    if ((r = dspk__vk_gpu_ms(u->d, TUNE_REPS, rec_cand, u, &ms)) == 0) {
      u->ns = (uint64_t)(ms * TUNE_REPS * 1e6 + 0.5);
      u->have_ns = 1;
      fft_timed++;
    }
  } else {
    for (int k = 0; k < TUNE_REPS && r == 0; k++)
      r = rec_cand(u, k);
    if (r == 0)
      r = dspk__vk_submit(u->d);
    if (r == 0)
      r = dspk__vk_wait_value(u->d, u->d->submitted);
  }
  if (r == 0 && !u->checked[i]) {
    /* Made on the first run (the decision may come from the cache). */
    if (u->ref_state == 0)
      u->ref_state = tune_ref(u) == 0 ? 1 : -1;
    r = u->ref_state > 0 ? tune_check(u, i) : DSPK_EDEVICE;
  }
  return r;
}

/* The autotune framework's ran_ns: the device's time of the last run. */
static int tune_ns(void *ud, int i, uint64_t *ns) {
  const struct tune_ud *u = ud;
  (void)i;
  if (!u->have_ns)
    return -1;
  *ns = u->ns;
  return 0;
}

/* The request for desc's shape: tunes[] then our kernels sk[0..nsk)
 * (their names are written into names). */
static void tune_req(struct dspk__dev *d, const struct dspk__vkfft_desc *desc, char *shape,
                     size_t len, const struct dspk__vk_sfft_cfg *sk, int nsk,
                     char (*names)[48], struct dspk__autotune_cand *cands,
                     struct dspk__autotune_req *req) {
  snprintf(shape, len, "n=%llu,b=2^%d", (unsigned long long)desc->n,
           dspk__autotune_pow2(desc->batch));
  for (int i = 0; i < NTUNES + nsk; i++) {
    if (i >= NTUNES)
      dspk__vk_sfft_name(&sk[i - NTUNES], names[i - NTUNES], 48);
    cands[i].name = i < NTUNES ? tunes[i].name : names[i - NTUNES];
    cands[i].run = tune_run;
  }
  memset(req, 0, sizeof *req);
  req->op = "fft";
  req->shape = shape;
  req->dtypes = desc->dbl ? "c128" : "c64";
  req->layout = desc->oop ? "oop" : "inplace";
  req->dev = dspk__vk_devid(d);
  req->cands = cands;
  req->ncands = NTUNES + nsk;
  req->ran_ns = tune_ns;
}

/* Chooses, for desc's shape, between VkFFT's configurations (sets
 * desc->tune; *use_sk = 0) and our kernels (*use_sk = 1, *sk), measuring
 * the candidates on these operands on a miss, each checked against an
 * exact DFT of a few outputs.  X and O: the operands (out of place).  The
 * winner's VkFFT plan goes into the plan cache, the others are freed.
 * Returns 0 (VkFFT's defaults when nothing could be measured),
 * DSPK_ECANCELED, or 1 when canceled after a candidate's run completed and
 * passed its check: O then holds the transform (each run is the whole op on
 * these operands, waited for). */
static int fft_choose(struct dspk__dev *d, struct dspk__vkfft_desc *desc, int inverse,
                      const struct dspk__tensor *X, const struct dspk__tensor *O,
                      int *use_sk, struct dspk__vk_sfft_cfg *sk, struct dspk__opctx *ctx) {
  size_t es = desc->dbl ? 16 : 8;
  VkDeviceSize off = O->mem->off + O->offset, inoff = X->mem->off + X->offset;
  char key[128];
  int klen = snprintf(key, sizeof key, "fftune|n=%llu|b=%llu|d=%d|o=%d",
                      (unsigned long long)desc->n, (unsigned long long)desc->batch, desc->dbl,
                      desc->oop);
  *use_sk = 0;
  struct tplan *tp = dspk__plancache_get(&d->plans, key, (size_t)klen);
  if (tp) {
    desc->tune = tunes[tp->winner].t;
    *use_sk = tp->use_sk;
    *sk = tp->sk;
    return 0;
  }
  char shape[96], names[SK_CANDS][48];
  struct dspk__autotune_cand cands[NCANDS];
  struct dspk__autotune_req req;
  /* tune_ud holds the reference values: on the heap, not the stack. */
  struct tune_ud *u = calloc(1, sizeof *u);
  if (!u)
    return 0;
  u->d = d;
  u->desc = *desc;
  u->inverse = inverse;
  u->off = off;
  u->inoff = inoff;
  u->xm = X->mem;
  u->xelem = X->offset / es;
  u->om = O->mem;
  u->oelem = O->offset / es;
  u->nsk = sk_cands(d, desc, u->sk);
  if (u->nsk && (dspk__vk_bind_tensor(d, X, &u->bx, &u->ex) ||
                 dspk__vk_bind_tensor(d, O, &u->bo, &u->eo)))
    u->nsk = 0;
  tune_req(d, desc, shape, sizeof shape, u->sk, u->nsk, names, cands, &req);
  int ran_ok = 0;
  req.ud = u;
  req.ran_ok = &ran_ok;
  if (ctx) {
    req.progress = ctx->progress;
    req.progress_ud = ctx->progress_ud;
    req.cancel = ctx->cancel;
  }
  int w = 0, r = dspk__autotune_choose(d->env.cache, &req, NULL, &w, NULL);
  if (r < 0 || w < 0 || w >= NTUNES + u->nsk)
    w = 0;
  for (int i = 0; i < NTUNES; i++)
    if (u->plans[i] && i != w)
      fplan_free(d, u->plans[i]);
  for (int i = 0; i < u->nsk; i++) /* each holds a temporary as large as X */
    if (i + NTUNES == w)
      dspk__vk_sfft_keep(d, u->skplans[i]);
    else
      dspk__vk_sfft_plan_free(d, u->skplans[i]);
  int winner = w < NTUNES ? w : 0;
  desc->tune = tunes[winner].t;
  if (w >= NTUNES) {
    *use_sk = 1;
    *sk = u->sk[w - NTUNES];
  } else if (u->plans[w]) {
    char pk[DSPK__PLANCACHE_KEY_MAX];
    int pklen = plan_key(desc, pk, sizeof pk);
    if (dspk__plancache_get(&d->plans, pk, (size_t)pklen) ||
        dspk__plancache_put(&d->plans, pk, (size_t)pklen, u->plans[w]))
      fplan_free(d, u->plans[w]);
  }
  free(u);
  if (r == DSPK_ECANCELED)
    return ran_ok ? 1 : r;
  tp = malloc(sizeof *tp);
  if (tp) {
    tp->kind = 3;
    tp->winner = winner;
    tp->use_sk = *use_sk;
    tp->sk = *sk;
    if (dspk__plancache_put(&d->plans, key, (size_t)klen, tp))
      free(tp);
  }
  return 0;
}

int dspk__vk_fft_tune_report(struct dspk__dev *d, uint64_t n, uint64_t batch, int dbl,
                             char *buf, size_t len) {
  struct dspk__vkfft_desc desc = {.n = n, .batch = batch, .dbl = dbl, .oop = 1};
  char shape[96], timings[2048] = "", winner[64] = "", names[SK_CANDS][48];
  struct dspk__autotune_cand cands[NCANDS];
  struct dspk__vk_sfft_cfg sk[SK_CANDS];
  int nsk = sk_cands(d, &desc, sk);
  struct dspk__autotune_req req;
  tune_req(d, &desc, shape, sizeof shape, sk, nsk, names, cands, &req);
  struct dspk__tune_key k = {.dev = req.dev,
                             .op = req.op,
                             .shape = req.shape,
                             .dtypes = req.dtypes,
                             .layout = req.layout,
                             .cands_hash = dspk__autotune_cands_hash(cands, NTUNES + nsk)};
  if (!d->env.cache || dspk__cache_tune_get(d->env.cache, &k, winner, sizeof winner))
    return DSPK_ENOENT;
  dspk__cache_tune_timings(d->env.cache, &k, timings, sizeof timings);
  /* our kernels: one pass up to DSPK__SK_MAXL, else two */
  int passes = strncmp(winner, "sk:", 3) ? 0 : strncmp(winner, "sk:1:", 5) ? 2 : 1;
  for (unsigned i = 0; i < d->plans.n; i++) {
    struct fplan *p = d->plans.e[i].plan;
    if (p->kind == 1 && p->desc.n == n && p->desc.batch == batch && p->desc.dbl == dbl &&
        p->desc.oop)
      for (int t = 0; t < NTUNES; t++)
        if (!strcmp(tunes[t].name, winner) &&
            !memcmp(&tunes[t].t, &p->desc.tune, sizeof p->desc.tune))
          passes = dspk__vkfft_passes(p->inst[0].f);
  }
  snprintf(buf, len, "winner %s, %d passes; ns per candidate (%d transforms): %s", winner, passes,
           TUNE_REPS, timings);
  return 0;
}

int dspk__vk_timestamps(struct dspk__dev *d) {
  VkQueueFamilyProperties qf[16];
  uint32_t nq = 16;
  VK(GetPhysicalDeviceQueueFamilyProperties)(d->pd, &nq, qf);
  return d->qfamily < nq && qf[d->qfamily].timestampValidBits != 0 &&
         d->props.limits.timestampPeriod > 0;
}

int dspk__vk_gpu_ms(struct dspk__dev *d, int reps, int (*rec)(void *ud, int i), void *ud,
                    double *ms) {
  PFN_vkCreateQueryPool CreateQueryPool;
  PFN_vkDestroyQueryPool DestroyQueryPool;
  PFN_vkCmdResetQueryPool CmdResetQueryPool;
  PFN_vkCmdWriteTimestamp CmdWriteTimestamp;
  PFN_vkGetQueryPoolResults GetQueryPoolResults;
#define LOAD(name) name = (PFN_vk##name)VK(GetDeviceProcAddr)(d->dev, "vk" #name)
  LOAD(CreateQueryPool);
  LOAD(DestroyQueryPool);
  LOAD(CmdResetQueryPool);
  LOAD(CmdWriteTimestamp);
  LOAD(GetQueryPoolResults);
#undef LOAD
  if (!CreateQueryPool || !DestroyQueryPool || !CmdResetQueryPool || !CmdWriteTimestamp ||
      !GetQueryPoolResults || !dspk__vk_timestamps(d))
    return DSPK_ENOTSUP;
  VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                              .queryType = VK_QUERY_TYPE_TIMESTAMP,
                              .queryCount = 2};
  VkQueryPool qp;
  VkResult vr = CreateQueryPool(d->dev, &qi, NULL, &qp);
  if (vr != VK_SUCCESS)
    return dspk__vk_err(vr);
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    goto out;
  CmdResetQueryPool(cb, qp, 0, 2);
  dspk__vk_barrier(d);
  CmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
  for (int i = 0; i < reps && r == 0; i++)
    if ((r = rec(ud, i)) == 0)
      r = dspk__vk_cmd(d, &cb); /* still the same command buffer */
  if (r)
    goto out;
  CmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
  if ((r = dspk__vk_submit(d)) || (r = dspk__vk_wait_value(d, d->submitted)))
    goto out;
  uint64_t ts[2];
  vr = GetQueryPoolResults(d->dev, qp, 0, 2, sizeof ts, ts, sizeof ts[0],
                           VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  if (vr != VK_SUCCESS)
    r = dspk__vk_err(vr);
  else
    *ms = (double)(ts[1] - ts[0]) * d->props.limits.timestampPeriod / 1e6 / reps;
out:
  /* the pool may be named by a recorded, unsubmitted command buffer */
  dspk__vk_submit(d);
  dspk__vk_wait_value(d, d->submitted);
  DestroyQueryPool(d->dev, qp, NULL);
  return r;
}

struct prof_ud {
  struct dspk__dev *d;
  struct dspk__mem *x, *y;
  struct fplan *p;
};
static int rec_copy(void *ud, int i) {
  struct prof_ud *u = ud;
  VkCommandBuffer cb;
  (void)i;
  int r = dspk__vk_cmd(u->d, &cb);
  if (r)
    return r;
  VkBufferCopy c = {.srcOffset = u->x->off, .dstOffset = u->y->off, .size = u->x->size};
  VK(CmdCopyBuffer)(cb, u->x->buf, u->y->buf, 1, &c);
  dspk__vk_barrier(u->d);
  return 0;
}
static int rec_fft(void *ud, int i) {
  struct prof_ud *u = ud;
  (void)i;
  return fft_launch(u->d, u->p, 0, u->y->buf, u->y->off, u->x->buf, u->x->off, NULL);
}

int dspk__vk_fft_profile(struct dspk__dev *d, uint64_t n, uint64_t batch, char *buf,
                         size_t len) {
  struct prof_ud u = {.d = d};
  size_t bytes = (size_t)(n * batch) * 8;
  int r, reps = 10, at = 0;
  buf[0] = 0;
  if ((r = dspk__vk_alloc(d, bytes, &u.x)) || (r = dspk__vk_alloc(d, bytes, &u.y)))
    goto out;
  VkCommandBuffer cb;
  if ((r = dspk__vk_cmd(d, &cb)))
    goto out;
  VK(CmdFillBuffer)(cb, u.x->buf, u.x->off, bytes, 0);
  dspk__vk_barrier(d);
  double ms = 0;
  if ((r = dspk__vk_gpu_ms(d, reps, rec_copy, &u, &ms)))
    goto out;
  at += snprintf(buf + at, len - (size_t)at, "GPU time: copy X->Y %.3f ms (%.0f GB/s moved)",
                 ms, 2.0 * (double)bytes / ms / 1e6);
  for (int i = 0; i < NTUNES && (size_t)at < len; i++) {
    struct dspk__vkfft_desc desc = {.n = n,
                                    .batch = batch,
                                    .oop = 1,
                                    .buf = u.y->buf,
                                    .bufsize = vkfft_span(d, u.y),
                                    .inbuf = u.x->buf,
                                    .insize = vkfft_span(d, u.x),
                                    .tune = tunes[i].t};
    if (make_plan(d, &desc, &u.p, NULL)) {
      at += snprintf(buf + at, len - (size_t)at, "; %s: no plan", tunes[i].name);
      continue;
    }
    if (u.p->split) { /* it would write past Y (fit_rows) */
      at += snprintf(buf + at, len - (size_t)at, "; %s: splits its dispatch", tunes[i].name);
      fplan_free(d, u.p);
      u.p = NULL;
      continue;
    }
    r = dspk__vk_gpu_ms(d, reps, rec_fft, &u, &ms);
    int passes = dspk__vkfft_passes(u.p->inst[0].f);
    fplan_free(d, u.p);
    u.p = NULL;
    if (r)
      goto out;
    at += snprintf(buf + at, len - (size_t)at, "; %s %.3f ms (%d passes)", tunes[i].name, ms,
                   passes);
  }
out:
  dspk__vk_submit(d);
  dspk__vk_wait_value(d, d->submitted);
  dspk__vk_free(d, u.x);
  dspk__vk_free(d, u.y);
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

/* Binds the input X and the output O; fails the op when either cannot be
 * bound. */
static int bind_io(struct dspk__dev *d, const struct dspk__tensor *X, const struct dspk__tensor *O,
                   struct dspk__vk_bind *bx, uint32_t *ex, struct dspk__vk_bind *bo,
                   uint32_t *eo, struct dspk__opctx *ctx) {
  int r;
  if ((r = dspk__vk_bind_named(d, X, bx, ex, ctx, "fft's X")) ||
      (r = dspk__vk_bind_named(d, O, bo, eo, ctx, "fft's output")))
    return r;
  return 0;
}
const int dspk__vk_fft_built = 1;

/* VkFFT's path in chunks of at most `chunk` rows (VkFFT's temporary within
 * maxStorageBufferRange), X and the output each through a temporary of a
 * chunk where VkFFT cannot bind it where it is (xin, oin: 0; it ends past
 * the range in a larger VkBuffer), copied in and out.  oop: 0 when X is the
 * output (in place). */
static int fft_chunks(struct dspk__dev *d, const struct dspk__tensor *X,
                      const struct dspk__tensor *O, uint64_t n, uint64_t batch, int dbl,
                      int r2c, int oop, int inverse, int xin, int oin, uint64_t chunk,
                      struct dspk__opctx *ctx) {
  uint64_t xrow = n * dspk__dtype_size(X->dtype),
           orow = (r2c ? n / 2 + 1 : n) * dspk__dtype_size(O->dtype);
  uint64_t rows = batch < chunk ? batch : chunk;
  VkDeviceSize xoff = X->mem->off + X->offset, ooff = O->mem->off + O->offset;
  struct dspk__mem *tx = NULL, *to = NULL;
  int r = 0;
  if (!xin && (r = dspk__vk_alloc(d, rows * xrow, &tx)))
    return r;
  if ((r2c || oop) && !oin && (r = dspk__vk_alloc(d, rows * orow, &to)))
    goto out;
  for (uint64_t r0 = 0; r0 < batch && r == 0; r0 += rows) {
    uint64_t kr = batch - r0 < rows ? batch - r0 : rows;
    VkBuffer ib = X->mem->buf, ob = O->mem->buf;
    VkDeviceSize io = xoff + r0 * xrow, oo = ooff + r0 * orow;
    uint64_t isz = vkfft_span(d, X->mem), osz = vkfft_span(d, O->mem);
    if (tx) {
      ib = tx->buf;
      isz = vkfft_span(d, tx);
    }
    if (!r2c && !oop) {
      ob = ib;
      oo = io;
      osz = isz;
    } else if (to) {
      ob = to->buf;
      oo = to->off;
      osz = vkfft_span(d, to);
    }
    struct dspk__vkfft_desc desc = {.n = n,
                                    .batch = kr,
                                    .dbl = dbl,
                                    .r2c = r2c,
                                    .oop = oop,
                                    .buf = ob,
                                    .bufsize = osz,
                                    .inbuf = r2c || oop ? ib : VK_NULL_HANDLE,
                                    .insize = r2c || oop ? isz : 0};
    if (r0 == 0) { /* launches that do not split (fit_rows) */
      if ((r = fit_rows(d, desc, &rows, ctx)))
        break;
      desc.batch = kr = batch < rows ? batch : rows;
    }
    if (tx) {
      if ((r = copy_bytes(d, X->mem->buf, io, tx->buf, tx->off, kr * xrow)))
        break;
      io = tx->off;
      if (!r2c && !oop)
        oo = io;
    }
    struct fplan *p;
    if ((r = get_plan(d, &desc, &p, ctx)) ||
        (r = fft_launch(d, p, inverse, ob, oo, desc.inbuf, io, ctx)))
      break;
    if (!oin)
      r = copy_bytes(d, ob, oo, O->mem->buf, ooff + r0 * orow, kr * orow);
  }
out:
  dspk__vk_submit(d);
  dspk__vk_free(d, tx);
  dspk__vk_free(d, to);
  return r;
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
  /* X and the output are each within the device's max_tensor_bytes, on
   * every path (protocol.md, devices), as every op's tensors are.  VkFFT's
   * own path binds each tensor's VkBuffer itself, from its byte 0 (the
   * offsets come at launch): up to vkfft_span, never past
   * maxStorageBufferRange, a tensor ending later going through a temporary
   * (fft_chunks). */
  struct dspk__vk_bind bx, bo;
  uint32_t ex, eo;
  int r = bind_io(d, X, O, &bx, &ex, &bo, &eo, ctx);
  if (r)
    return r;
  if (n == 1) {
    /* A transform of length 1 is the identity (ifft's 1/n is 1), and rfft
     * widens to (x, 0); VkFFT refuses n = 1. */
    if (total > UINT32_MAX)
      return dspk__vk_fail(ctx, DSPK_ELIMIT, "fft: more than 2^32-1 transforms of length 1");
    return fft_copy(d, dbl, r2c ? 0 : 1, &bx, ex, &bo, eo, (uint32_t)total, 1, 1, ctx);
  }
  /* VkFFT 1.2.26's own Bluestein path gave wrong results in our tests
   * (lavapipe): lengths with a prime factor above 13 use ours. */
  if (max_prime(n) > 13 && !r2c)
    return bluestein(d, &bx, ex, &bo, eo, n, batch, dbl, op->u.fft.inverse, ctx);
  size_t xes = dspk__dtype_size(X->dtype), oes = dspk__dtype_size(O->dtype);
  VkDeviceSize xoff = X->mem->off + X->offset, ooff = O->mem->off + O->offset;
  if (xoff % xes || ooff % oes)
    return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                         "fft: operands must start at a multiple of their element size");
  if (r2c && (n % 2 || max_prime(n) > 13 || total > UINT32_MAX / 2))
    return total > UINT32_MAX / 2
               ? dspk__vk_fail(ctx, DSPK_ELIMIT, "fft: real input above 2^31 elements")
               : rfft_odd(d, &bx, ex, &bo, eo, n, batch, dbl, ctx);
  int oop = !r2c;
  if (!r2c && X->mem->buf == O->mem->buf) {
    VkDeviceSize nb = dspk__tensor_nbytes(X);
    if (xoff == ooff)
      oop = 0; /* the same tensor: in place */
    else if (xoff < ooff + nb && ooff < xoff + nb)
      return dspk__vk_fail(ctx, DSPK_ENOTSUP, "fft: input and output overlap");
  }
  /* VkFFT's temporary (multi-pass transforms) holds up to n + 1 complex
   * values a row: the rows go in chunks within maxStorageBufferRange, and a
   * row alone larger is ELIMIT (docs/protocol.md, fft). */
  size_t cs = dbl ? 16 : 8;
  if ((n + 1) * cs > max_range(d))
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "fft: a row of n=%llu needs %llu bytes of a temporary ((n+1) x %zu, "
                         "VkFFT's), more than this device's maxStorageBufferRange %llu",
                         (unsigned long long)n, (unsigned long long)((n + 1) * cs), cs,
                         (unsigned long long)d->props.limits.maxStorageBufferRange);
  uint64_t chunk = max_range(d) / ((n + 1) * cs);
  int xin = xoff + dspk__tensor_nbytes(X) <= vkfft_span(d, X->mem),
      oin = ooff + dspk__tensor_nbytes(O) <= vkfft_span(d, O->mem);
  if (chunk < batch || !xin || !oin)
    return fft_chunks(d, X, O, n, batch, dbl, r2c, oop, op->u.fft.inverse, xin, oin, chunk,
                      ctx);
  struct dspk__vkfft_desc desc = {.n = n,
                                  .batch = batch,
                                  .dbl = dbl,
                                  .r2c = r2c,
                                  .oop = oop,
                                  .buf = O->mem->buf,
                                  .bufsize = vkfft_span(d, O->mem),
                                  .inbuf = r2c || oop ? X->mem->buf : VK_NULL_HANDLE,
                                  .insize = r2c || oop ? vkfft_span(d, X->mem) : 0};
  /* One launch of VkFFT's default plan, else chunks (fit_rows); tuning
   * runs the candidates on these operands (never in place), but not those
   * that would split their dispatch. */
  uint64_t rows = batch;
  if ((r = fit_rows(d, desc, &rows, ctx)))
    return r;
  if (rows < batch)
    return fft_chunks(d, X, O, n, batch, dbl, r2c, oop, op->u.fft.inverse, xin, oin, rows,
                      ctx);
  int forced, use_sk = 0;
  struct dspk__vk_sfft_cfg sk;
  if (oop && want_tune(d, total, &forced, &sk) &&
      ((r = fft_choose(d, &desc, op->u.fft.inverse, X, O, &use_sk, &sk, ctx)) ==
           DSPK_ECANCELED || r == 1))
    return r == 1 ? 0 : r; /* 1: a candidate's run left the transform in O */
  if (oop && forced >= 0 && forced < NTUNES)
    desc.tune = tunes[forced].t;
  if (oop && forced == NTUNES && !dbl && dspk__vk_sfft_valid(d, n, batch, &sk))
    use_sk = 1;
  if (use_sk)
    return dspk__vk_sfft(d, &sk, n, batch, op->u.fft.inverse, &bx, ex, &bo, eo, NULL, ctx);
  struct fplan *p = NULL;
  r = get_plan(d, &desc, &p, ctx);
  if ((r || p->split) && memcmp(&desc.tune, &(struct dspk__vkfft_tune){0}, sizeof desc.tune)) {
    /* The tuned configuration does not plan here, or splits: VkFFT's
     * defaults (which fit_rows checked). */
    memset(&desc.tune, 0, sizeof desc.tune);
    r = get_plan(d, &desc, &p, ctx);
  }
  if (r)
    return r;
  return fft_launch(d, p, op->u.fft.inverse, O->mem->buf, ooff, desc.inbuf, xoff, ctx);
}
