/*
 * fir on the Vulkan backend: the direct kernel (vk_ops.c: one invocation
 * per output sample, k multiply-adds each) or FFT convolution by
 * overlap-save through the backend's own fft (vk_fft.c: VkFFT, or our
 * Stockham kernels where the fft tuner measured them faster), chosen by
 * the shared autotune framework per shape class and device.
 *
 * Overlap-save: each row of n samples is cut into blocks of L = 2^lg
 * samples that overlap by k-1 (block b starts at sample b*S - (k-1), S =
 * L-k+1; samples outside the row read as zero).  A gather kernel writes the
 * blocks as complex rows, one block a row (a real signal's with imaginary
 * parts 0; never two blocks to a row, of one signal row or of two: the
 * rounding of a transform scales with all of its values, so the other
 * block's largest sample would bound this one's error, see
 * dspk__fir_geo; a block's outputs depend on that block's samples alone,
 * and a row of zeros filters to exact zeros next to any other); one batched
 * out-of-place transform, a multiplication by the transform of the
 * zero-padded filter, the inverse transform (scaled by 1/L, as
 * numpy.fft.ifft) and a scatter kernel that keeps the last S
 * samples of each block.  Real f32 signals whose blocks our own fft
 * kernels (vk_sfft.c) can transform skip the gather, the filter's own
 * transform, the multiplication and the scatter: the transforms' first
 * and last passes do them, the filter being one row more of the batch
 * (dspk__vk_sfft_fir), four passes over memory fewer.  Temporaries: two
 * (blocks x L) complex buffers and two of L for the filter, and the list
 * below, kept per block layout in the device's plan cache for the next
 * task (get_ws).  Blocks too many for one binding of maxStorageBufferRange
 * go through the unfused path in chunks of rows that fit (one row more
 * kept free, as for the fused filter's); a block that does not fit with
 * one more row is ENOTSUP, and dspk__vk_fir runs the direct kernel, which
 * sees a cancel between its pieces (vk_ops.c).
 *
 * Non-finite values: one NaN or Inf in a block's samples (or in a tap)
 * makes every output of its transforms non-finite, and finite samples
 * whose transforms overflow (3e38 times taps of 1e-6: an exact result of
 * 9e34) do the same, where the direct sum is non-finite only at the
 * outputs the value reaches (x[i] reaches y[i..i+k-1]), or nowhere.  So
 * the scatter (ours, or the fused inverse transform's last pass) lists
 * each segment (the S outputs of one block) in which it writes a NaN or an
 * Inf, by the exponent's bits, which no compiler's fast math folds away
 * (a flag per segment, set by atomicOr, so that the first only appends it
 * to the list; the fused pass notes a thread's at most two segments and
 * lists them at its end), and the direct kernel then runs on the listed
 * segments only (dspk__vk_fir_fixup), all in the same command buffer: no
 * wait on the host.  The list (DSPK__VK_FL_HEAD) is cleared by the path's
 * first pass over the blocks (the gather, or the fused forward
 * transform's first pass), each run for itself, and its head is the
 * repair's indirect dispatch, whose group count the lister raises to
 * min(listed segments x chunks, the cap): zero workgroups when nothing is
 * listed.  The result is the direct sum's wherever that is finite, and
 * non-finite exactly where it is; a NaN sample costs its block's segment,
 * a NaN tap the whole row, and finite data one exponent test per output
 * and an indirect dispatch of no workgroups (per 16384 taps, each with its
 * barrier).  The same design as the cpu's (backends/cpu/fir.c) and the
 * GPU runtimes' (backends/gpurt/fir_fft.c).  The repair reads X after Y is
 * written: the daemon never hands a fir an output that overlaps an input
 * (it computes such an output into a block of its own, daemon/task.c).
 *
 * The choice: filters of at most FIR_DIRECT_MAX_K taps are always direct.
 * For longer ones on a hardware device the candidates are "direct",
 * "ols-x4", "ols-x8" and "ols-x16" (L = 4, 8, 16 times the filter's length
 * rounded up to a power of two, at least 64, at most the row's full
 * convolution length rounded up), timed on the task's own operands the
 * first time a shape class (n = 2^a total samples, row = 2^b, k = 2^c
 * taps; op "fir", layout "path") is seen on a device; the decision and the
 * timings persist in the cache like every other autotune decision.
 * Software devices (lavapipe) and tasks whose output overlaps an input use
 * the heuristic instead: overlap-save ols-x8 from FIR_FFT_MIN_K taps on.
 * dspk__vk_fir_force and dspk__vk_fir_tune_always are the tests' handles.
 *
 * Precision: f32 and c64 transform in single precision (an error at an
 * output of about eps log2(L) max|x| sum|h|, max|x| over the samples of
 * the output's block, against the direct kernel's single-precision sums of
 * k products), f64 and c128 in double.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/fir_tune.h"
#include "backends/vulkan/vk.h"
#include "backends/vulkan/vk_sfft.h"
#include "proto/testhook.h"

#define FIR_DIRECT_MAX_K 32 /* taps: always direct */
#define FIR_FFT_MIN_K 128   /* taps: FFT when no decision is measured */
#define FIR_MAX_LG 28
#define FIR_MAX_ELEMS ((int64_t)1 << 31) /* 32-bit indexing with room */
static _Thread_local const char *fir_last = "";
static _Thread_local int fir_last_fused;
static _Thread_local unsigned fir_timed; /* tuner samples timed by timestamps */
static _Thread_local unsigned fir_repairs; /* repair dispatches recorded */
static _Thread_local size_t fir_ws_h, fir_ws_b, fir_ws_f; /* the last workspace's key */

/* Test hooks (proto/testhook.h): a production build has no such globals. */
#ifdef DSPK_TEST_HOOKS
static int fir_force = -1, fir_tune_always;
void dspk__vk_fir_force(int mode) {
  fir_force = mode >= 0 && mode < DSPK__FIR_NPATHS ? mode : -1;
}
void dspk__vk_fir_tune_always(int always) { fir_tune_always = always; }
#else
#define fir_force (-1)
#define fir_tune_always 0
#endif
const char *dspk__vk_fir_last(void) { return fir_last; }
int dspk__vk_fir_last_fused(void) { return fir_last_fused; }
unsigned dspk__vk_fir_timed(void) { return fir_timed; }
unsigned dspk__vk_fir_repairs(void) { return fir_repairs; }

/* Layout for rows of n samples, k taps (k <= n), mode m (1..3), within
 * 32-bit indexing. */
static int geometry(int64_t n, int64_t k, int64_t rows, int m, struct dspk__fir_geo *g) {
  int r = dspk__fir_geometry(n, k, rows, m, FIR_MAX_LG, g);
  return r ? r : g->nblk * g->L > FIR_MAX_ELEMS ? DSPK_ELIMIT : 0;
}

/* One of the path's kernels for dtype dt: 0 hpad, 1 gather, 2 cmul,
 * 3 scatter. */
static int fir_kernel(struct dspk__dev *d, dspk_dtype dt, int which,
                      struct dspk__vk_kernel **out, struct dspk__opctx *ctx) {
  static const char *const names[4] = {"fir.hpad", "fir.gather", "fir.cmul", "fir.scatter"};
  static const int nbind[4] = {2, 3, 2, 3};
  static const uint32_t pcs[4] = {12, 40, 8, 40};
  static const char *const body[4] = {
      /* hp = h zero-padded to L, as complex */
      "layout(std430, binding = 0) readonly buffer BH { T h[]; };\n"
      "layout(std430, binding = 1) writeonly buffer BP { C hp[]; };\n"
      "layout(push_constant) uniform PC { uint L, k, oh; } pc;\n"
      "void main() {\n"
      "  for (uint i = gl_GlobalInvocationID.x; i < pc.L; i += STRIDE)\n"
      "    hp[i] = i < pc.k ? TOC(h[pc.oh + i]) : C(0);\n}\n",
      /* the blocks, and fl cleared for the scatter (see the top) */
      "layout(std430, binding = 0) readonly buffer BX { T x[]; };\n"
      "layout(std430, binding = 1) writeonly buffer BB { C b[]; };\n"
      "layout(std430, binding = 2) buffer BF { uint fl[]; };\n"
      "layout(push_constant) uniform PC { uint total, n, km1, S, lg, nb, nblk, ox, c0, clr; } pc;\n"
      "FL_GLSL"
      "void main() {\n"
      "  uint mask = (1u << pc.lg) - 1u;\n"
      "  for (uint i = gl_GlobalInvocationID.x; pc.clr != 0u && i < 4u + pc.nblk; i += STRIDE)\n"
      "    fl_clear(i, pc.nblk);\n"
      "  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += STRIDE) {\n"
      "    uint c = pc.c0 + (i >> pc.lg), j = i & mask;\n"
      "    uint row = c / pc.nb, t = (c - row * pc.nb) * pc.S + j;\n"
      "    b[i] = t >= pc.km1 && t - pc.km1 < pc.n ? TOC(x[pc.ox + row * pc.n + t - pc.km1])\n"
      "                                           : C(0);\n"
      "  }\n}\n",
      /* f *= hs, per block */
      "layout(std430, binding = 0) buffer BF { C f[]; };\n"
      "layout(std430, binding = 1) readonly buffer BS { C hs[]; };\n"
      "layout(push_constant) uniform PC { uint total, lg; } pc;\n"
      "void main() {\n"
      "  uint mask = (1u << pc.lg) - 1u;\n"
      "  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += STRIDE) {\n"
      "    C a = f[i], h = hs[i & mask];\n"
      "    f[i] = C(a.x * h.x - a.y * h.y, a.x * h.y + a.y * h.x);\n"
      "  }\n}\n",
      /* y from the last S samples of each block of the chunk (blocks c0
       * on, b from its first), one output per invocation (total = blocks x
       * S; a real signal's in the real part); a segment that gets a
       * non-finite output is listed in fl (see the top) */
      "layout(std430, binding = 0) readonly buffer BB { C b[]; };\n"
      "layout(std430, binding = 1) writeonly buffer BY { T y[]; };\n"
      "layout(std430, binding = 2) buffer BF { uint fl[]; };\n"
      "layout(push_constant) uniform PC { uint total, n, km1, S, lg, nb, nblk, oy, cap, c0; } pc;\n"
      "FL_GLSL"
      "#if DBL\n"
      "bool bad(double v) { return (unpackDouble2x32(v).y & 0x7ff00000u) == 0x7ff00000u; }\n"
      "#else\n"
      "bool bad(float v) { return (floatBitsToUint(v) & 0x7f800000u) == 0x7f800000u; }\n"
      "#endif\n"
      "void list(uint g) { fl_list(g, pc.nblk, pc.S, pc.cap); }\n"
      "void main() {\n"
      "  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += STRIDE) {\n"
      "    uint cl = i / pc.S, j = i - cl * pc.S, c = pc.c0 + cl, row = c / pc.nb;\n"
      "    uint t = (c - row * pc.nb) * pc.S + j;\n"
      "    if (t >= pc.n) continue;\n"
      "    C v = b[(cl << pc.lg) + pc.km1 + j];\n"
      "#if CPLX\n"
      "    y[pc.oy + row * pc.n + t] = v;\n"
      "    if (bad(v.x) || bad(v.y)) list(c);\n"
      "#else\n"
      "    y[pc.oy + row * pc.n + t] = v.x;\n"
      "    if (bad(v.x)) list(c);\n"
      "#endif\n"
      "  }\n}\n"};
  int cplx = dt == DSPK_C64 || dt == DSPK_C128, dbl = dt == DSPK_F64 || dt == DSPK_C128;
  char src[4096], bod[3072];
  const char *fl = strstr(body[which], "FL_GLSL");
  if (fl) /* the helpers of the list, dspk__vk_fl_glsl, in its place */
    snprintf(bod, sizeof bod, "%.*s%s%s", (int)(fl - body[which]), body[which],
             dspk__vk_fl_glsl, fl + 7);
  else
    snprintf(bod, sizeof bod, "%s", body[which]);
  snprintf(src, sizeof src,
           "#version 450\n"
           "layout(local_size_x = %d) in;\n"
           "#define T %s\n#define C %s\n#define CPLX %d\n#define DBL %d\n"
           "#define STRIDE (gl_NumWorkGroups.x * %du)\n"
           "#if CPLX\n#define TOC(v) (v)\n#else\n#define TOC(v) C(v, 0)\n#endif\n%s",
           DSPK__VK_WG, dspk__vk_glsl_type(dt), dbl ? "dvec2" : "vec2", cplx, dbl, DSPK__VK_WG,
           bod);
  return dspk__vk_kernel(d, names[which], src, NULL, 0, "main", nbind[which], pcs[which],
                         out, ctx);
}

static uint32_t groups(int64_t n) {
  int64_t g = (n + DSPK__VK_WG - 1) / DSPK__VK_WG;
  return g < 1 ? 1 : g > 65535 ? 65535 : (uint32_t)g;
}

/* An FFT (the backend's fft op) of rows of L complex values from a to b. */
static int fft_rows(struct dspk__dev *d, dspk_dtype cdt, struct dspk__mem *a,
                    struct dspk__mem *b, int64_t rows, int64_t L, int inverse,
                    struct dspk__opctx *ctx) {
  struct dspk__op f;
  memset(&f, 0, sizeof f);
  f.kind = DSPK_OP_FFT;
  f.nin = f.nout = 1;
  f.in[0].dtype = f.out[0].dtype = cdt;
  f.in[0].rank = f.out[0].rank = 2;
  f.in[0].shape[0] = f.out[0].shape[0] = rows;
  f.in[0].shape[1] = f.out[0].shape[1] = L;
  f.in[0].mem = a;
  f.out[0].mem = b;
  f.u.fft.inverse = inverse;
  return dspk__vk_fft(d, &f, ctx);
}

static struct dspk__vk_bind whole(const struct dspk__mem *m, VkDeviceSize bytes) {
  return (struct dspk__vk_bind){m->buf, m->off, bytes};
}

/* The temporaries of one block layout, kept in the device's plan cache
 * (kind 5) from task to task: the fft's VkFFT instances stay bound to the
 * same buffers, so a stream of tasks never waits for one to finish (one
 * queue, every command buffer opened by a full barrier: reuse is ordered). */
struct fir_ws {
  int kind; /* 5 (see plan_evict in vk_backend.c) */
  int busy, evicted; /* evicted while a task records with it: freed after */
  struct dspk__mem *hp, *hs, *bb, *ff;
  struct dspk__mem *fl; /* the list of non-finite segments (see the top) */
};

void dspk__vk_fir_ws_free(struct dspk__dev *d, void *ws) {
  struct fir_ws *w = ws;
  if (w->busy) {
    w->evicted = 1;
    return;
  }
  /* through the retirement queue: released once the device is done */
  dspk__vk_free(d, w->hp);
  dspk__vk_free(d, w->hs);
  dspk__vk_free(d, w->bb);
  dspk__vk_free(d, w->ff);
  dspk__vk_free(d, w->fl);
  free(w);
}

/* The bytes of the list of non-finite segments of nblk blocks: a count, a
 * flag per block and a slot per block. */
static size_t fl_bytes(int64_t nblk) { return 4 * (size_t)DSPK__VK_FL_WORDS(nblk); }

static int ws_key(char *key, size_t len, size_t hbytes, size_t bbytes, size_t flb) {
  return snprintf(key, len, "firws|%zu|%zu|%zu", hbytes, bbytes, flb);
}

static int get_ws(struct dspk__dev *d, size_t hbytes, size_t bbytes, size_t flb,
                  struct fir_ws **out) {
  char key[96];
  int klen = ws_key(key, sizeof key, hbytes, bbytes, flb);
  struct fir_ws *w = dspk__plancache_get(&d->plans, key, (size_t)klen);
  int r;
  if (w) {
    *out = w;
    return 0;
  }
  w = calloc(1, sizeof *w);
  if (!w)
    return DSPK_ENOMEM;
  w->kind = 5;
  if ((r = dspk__vk_alloc(d, hbytes, &w->hp)) || (r = dspk__vk_alloc(d, hbytes, &w->hs)) ||
      (r = dspk__vk_alloc(d, bbytes, &w->bb)) || (r = dspk__vk_alloc(d, bbytes, &w->ff)) ||
      (r = dspk__vk_alloc(d, flb, &w->fl)) ||
      (r = dspk__plancache_put(&d->plans, key, (size_t)klen, w))) {
    dspk__vk_fir_ws_free(d, w);
    return r;
  }
  *out = w;
  return 0;
}

#ifdef DSPK_TEST_HOOKS
int dspk__vk_fir_list_head(struct dspk__dev *d, uint32_t head[4]) {
  char key[96];
  int klen = ws_key(key, sizeof key, fir_ws_h, fir_ws_b, fir_ws_f);
  struct fir_ws *w = dspk__plancache_get(&d->plans, key, (size_t)klen);
  return w ? dspk__vk_read(d, w->fl, 0, head, 16) : DSPK_ENOENT;
}
#endif

/* The configuration of our fft kernels (vk_sfft.c) for the fused path of
 * real f32 signals: nc rows of L; 0 when none can run them.  The test hook
 * DSPK_VK_FIR_SK names one ("sk:...") or turns the fused path off ("off"). */
static int fused_cfg(struct dspk__dev *d, int64_t L, int64_t nc, struct dspk__vk_sfft_cfg *sk) {
  const char *e = DSPK_TEST_HOOK("DSPK_VK_FIR_SK");
  struct dspk__vk_sfft_cfg c[8];
  if (e && strcmp(e, "off") == 0)
    return 0;
  if (e && *e)
    return dspk__vk_sfft_parse(e, sk) == 0 && dspk__vk_sfft_valid(d, (uint64_t)L, (uint64_t)nc, sk);
  int nc8 = dspk__vk_sfft_cands(d, (uint64_t)L, (uint64_t)nc, c, 8), best = 0;
  if (nc8 < 1)
    return 0;
  /* The fused passes hold more live values than plain ones (the gather's
   * and the scatter's indices): of the fft tuner's short list, the
   * configuration with the fewest values per thread.  On the H200 (2^24
   * samples, 4096 taps) it was the fastest for each block size, 0.295 to
   * 0.330 ms of GPU time against 0.329 to 0.533 ms for the others
   * (bench_vulkan fir, docs/performance.md). */
  for (int i = 1; i < nc8; i++)
    if (c[i].e[0] + c[i].e[1] < c[best].e[0] + c[best].e[1])
      best = i;
  *sk = c[best];
  return 1;
}

/* The overlap-save path with blocks of mode m (1..3). */
static int fir_ols(struct dspk__dev *d, struct dspk__op *op, int m, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk_dtype dt = X->dtype;
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  dspk_dtype cdt = dbl ? DSPK_C128 : DSPK_C64;
  size_t cs = dbl ? 16 : 8;
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t rows = total / n, k = H->shape[0] < n ? H->shape[0] : n;
  struct dspk__fir_geo g;
  struct fir_ws *w;
  struct dspk__vk_kernel *kk[4];
  struct dspk__vk_bind bx, bh, by;
  uint32_t ex, eh, ey;
  int r;
  if (dbl && !d->has_f64)
    return dspk__vk_fail(ctx, DSPK_EDTYPE,
                         "fir: this Vulkan device lacks shaderFloat64 (dtype %s)",
                         dspk__dtype_name(dt));
  if (total >= FIR_MAX_ELEMS || geometry(n, k, rows, m, &g))
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "fir: %lld samples with %lld taps are too many for FFT "
                         "convolution on vulkan (32-bit indexing)",
                         (long long)total, (long long)k);
  /* The blocks go in chunks of rows whose buffers (and one row more, the
   * fused path's filter) stay within maxStorageBufferRange; all of them in
   * one chunk when they fit (the fused path's only case).  A block of L
   * values that does not fit with the filter's row is ENOTSUP (the caller
   * runs the direct kernel). */
  uint64_t range = d->props.limits.maxStorageBufferRange, rowb = (uint64_t)g.L * cs;
  int64_t chunk = (int64_t)(range / rowb) - 1;
  if (chunk < 1)
    return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                         "fir: blocks of %lld values (%llu bytes) and the filter's row exceed "
                         "the device's maxStorageBufferRange (%llu bytes)",
                         (long long)g.L, (unsigned long long)rowb,
                         (unsigned long long)range);
  /* (The test hook DSPK_VK_FIR_CHUNK sets the blocks of a chunk.) */
  const char *hc = DSPK_TEST_HOOK("DSPK_VK_FIR_CHUNK");
  if (hc && atoll(hc) > 0 && atoll(hc) < chunk)
    chunk = atoll(hc);
  if (chunk > g.nblk)
    chunk = g.nblk;
  size_t bbytes = (size_t)((chunk + 1) * g.L) * cs, hbytes = (size_t)g.L * cs;
  size_t flbytes = fl_bytes(g.nblk);
  for (int i = 0; i < 4; i++)
    if ((r = fir_kernel(d, dt, i, &kk[i], ctx)))
      return r;
  if ((r = dspk__vk_bind_named(d, X, &bx, &ex, ctx, "fir's X")) ||
      (r = dspk__vk_bind_named(d, H, &bh, &eh, ctx, "fir's H")) ||
      (r = dspk__vk_bind_named(d, Y, &by, &ey, ctx, "fir's output")))
    return r;
  if ((r = get_ws(d, hbytes, bbytes, flbytes, &w)))
    return dspk__vk_fail(ctx, r, "fir: no device memory for %lld blocks of %lld samples",
                         (long long)chunk, (long long)g.L);
  uint32_t L = (uint32_t)g.L;
  uint32_t pad[3] = {L, (uint32_t)k, eh};
  uint32_t cap = dspk__vk_fir_fix_groups(d, (uint32_t)g.S, (uint32_t)g.nblk);
  struct dspk__vk_bind b1[2] = {bh, whole(w->hp, hbytes)};
  struct dspk__vk_bind bf = whole(w->fl, (VkDeviceSize)flbytes);
  struct dspk__vk_bind b2[3] = {bx, whole(w->bb, bbytes), bf};
  struct dspk__vk_bind b3[2] = {whole(w->ff, bbytes), whole(w->hs, hbytes)};
  struct dspk__vk_bind b4[3] = {whole(w->bb, bbytes), by, bf};
  /* The transforms may add plans to the cache and so evict w: while busy,
   * its eviction waits for the end of this recording. */
  struct dspk__vk_sfft_cfg sk;
  fir_last_fused = dt == DSPK_F32 && chunk == g.nblk && fused_cfg(d, g.L, g.nblk + 1, &sk);
  w->busy = 1;
  fir_ws_h = hbytes;
  fir_ws_b = bbytes;
  fir_ws_f = flbytes;
  if (fir_last_fused) {
    /* Our fft kernels with the gather, the filter's transform (one row
     * more), the multiplication and the scatter done by their first and
     * last passes: five dispatches and four passes over memory fewer. */
    struct dspk__vk_bind ff = whole(w->ff, bbytes), bb = whole(w->bb, bbytes);
    uint64_t rows = (uint64_t)g.nblk + 1;
    struct dspk__vk_sfft_fir fw = {&bx, &bh, &bf, ex, eh, (uint32_t)n, (uint32_t)(k - 1),
                                   (uint32_t)g.S, (uint32_t)g.nb, (uint32_t)g.nblk, cap};
    struct dspk__vk_sfft_fir iv = fw;
    iv.sig = &by;
    iv.sigoff = ey;
    iv.hs = &ff;
    iv.hoff = (uint32_t)(g.nblk * g.L);
    if ((r = dspk__vk_sfft_fir(d, &sk, (uint64_t)g.L, rows, 0, &fw, &ff, 0, &ff, 0, ctx)) == 0)
      r = dspk__vk_sfft_fir(d, &sk, (uint64_t)g.L, rows, 1, &iv, &ff, 0, &bb, 0, ctx);
  } else if ((r = dspk__vk_dispatch(d, kk[0], b1, 2, pad, sizeof pad, groups(L), 1, 1)) == 0 &&
             (r = fft_rows(d, cdt, w->hp, w->hs, 1, g.L, 0, ctx)) == 0) {
    /* Each chunk: gather (the first also clears the list), transform,
     * multiply, transform back, scatter. */
    for (int64_t c0 = 0; r == 0 && c0 < g.nblk; c0 += chunk) {
      int64_t cnt = g.nblk - c0 < chunk ? g.nblk - c0 : chunk;
      uint32_t tb = (uint32_t)(cnt * g.L), ts = (uint32_t)(cnt * g.S);
      uint32_t gat[10] = {tb, (uint32_t)n, (uint32_t)(k - 1), (uint32_t)g.S, (uint32_t)g.lg,
                          (uint32_t)g.nb, (uint32_t)g.nblk, ex, (uint32_t)c0, c0 == 0};
      uint32_t mul[2] = {tb, (uint32_t)g.lg};
      uint32_t sct[10] = {ts, (uint32_t)n, (uint32_t)(k - 1), (uint32_t)g.S, (uint32_t)g.lg,
                          (uint32_t)g.nb, (uint32_t)g.nblk, ey, cap, (uint32_t)c0};
      if ((r = dspk__vk_dispatch(d, kk[1], b2, 3, gat, sizeof gat, groups(tb), 1, 1)) == 0 &&
          (r = fft_rows(d, cdt, w->bb, w->ff, cnt, g.L, 0, ctx)) == 0 &&
          (r = dspk__vk_dispatch(d, kk[2], b3, 2, mul, sizeof mul, groups(tb), 1, 1)) == 0 &&
          (r = fft_rows(d, cdt, w->ff, w->bb, cnt, g.L, 1, ctx)) == 0)
        r = dspk__vk_dispatch(d, kk[3], b4, 3, sct, sizeof sct, groups(ts), 1, 1);
    }
  }
  /* the direct kernel on the segments listed (see the top), but for the
   * tuner's samples (see dspk__fir_sampling); the test hook
   * DSPK_VK_FIR_NOFIX leaves it out (bench_vulkan fir: what it costs) */
  if (r == 0 && !dspk__fir_sampling() && !DSPK_TEST_HOOK("DSPK_VK_FIR_NOFIX")) {
    r = dspk__vk_fir_fixup(d, op, &bf, (uint32_t)g.S, (uint32_t)g.nb, (uint32_t)g.nblk, ctx);
    fir_repairs++;
  }
  w->busy = 0;
  if (w->evicted)
    dspk__vk_fir_ws_free(d, w);
  return r;
}

static int run_path(struct dspk__dev *d, struct dspk__op *op, int c, struct dspk__opctx *ctx) {
  fir_last = dspk__fir_path_names[c];
  fir_last_fused = 0; /* fir_ols says when it fuses */
  return c == 0 ? dspk__vk_fir_direct(d, op, ctx) : fir_ols(d, op, c, ctx);
}

/* Submits what a path recorded and waits for it (the autotune candidates
 * run to completion). */
static int finish(struct dspk__dev *d, int r) {
  int s = dspk__vk_submit(d);
  if (r == 0)
    r = s;
  if (r == 0)
    r = dspk__vk_wait_value(d, d->submitted);
  return r;
}

/* The tuner's timed samples: reps runs of path c recorded between two
 * timestamps (dspk__vk_gpu_ms submits and waits). */
struct timed_ud {
  struct dspk__dev *d;
  struct dspk__op *op;
  int c;
  struct dspk__opctx *ctx;
};
static int rec_path(void *ud, int i) {
  struct timed_ud *u = ud;
  (void)i;
  return run_path(u->d, u->op, u->c, u->ctx);
}
static int timed(struct dspk__dev *d, struct dspk__op *op, int c, int reps,
                 struct dspk__opctx *ctx, uint64_t *ns) {
  struct timed_ud u = {d, op, c, ctx};
  double ms;
  int r;
  if (!dspk__vk_timestamps(d))
    return 1;
  if ((r = dspk__vk_gpu_ms(d, reps, rec_path, &u, &ms)))
    return r;
  *ns = (uint64_t)(ms * reps * 1e6 + 0.5);
  fir_timed++;
  return 0;
}

/* Whether the output shares memory with an input (tuning reruns the op on
 * the task's operands, harmless only when it does not). */
static int overlaps(const struct dspk__op *op) {
  const struct dspk__tensor *Y = &op->out[0];
  VkDeviceSize y = Y->mem->off + Y->offset, ye = y + dspk__tensor_nbytes(Y);
  for (int i = 0; i < 2; i++) {
    const struct dspk__tensor *A = &op->in[i];
    VkDeviceSize a = A->mem->off + A->offset, ae = a + dspk__tensor_nbytes(A);
    if (A->mem->buf == Y->mem->buf && a < ye && y < ae)
      return 1;
  }
  return 0;
}

int dspk__vk_fir(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int64_t k = op->in[1].shape[0] < n ? op->in[1].shape[0] : n;
  /* One tap is H[0]*X exactly: the direct kernel's, whatever is forced. */
  if (total == 0 || !X->mem || !op->out[0].mem || op->in[1].shape[0] == 1)
    return run_path(d, op, 0, ctx);
  if (fir_force >= 0)
    return run_path(d, op, fir_force, ctx);
  if (k <= FIR_DIRECT_MAX_K)
    return run_path(d, op, 0, ctx);
  if ((d->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU || fir_tune_always) && !overlaps(op)) {
    static const struct dspk__fir_ops ops = {.run = run_path, .finish = finish, .timed = timed};
    int r = dspk__fir_tuned(d, op, d->env.cache, dspk__vk_devid(d), &ops, ctx);
    if (r <= 0)
      return r;
  }
  if (k >= FIR_FFT_MIN_K) {
    int r = run_path(d, op, 2, ctx); /* ols-x8 */
    if (r != DSPK_ENOTSUP && r != DSPK_ELIMIT)
      return r;
  }
  return run_path(d, op, 0, ctx);
}
