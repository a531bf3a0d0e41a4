/*
 * bench_coopmat: f16 gemm (f32 accumulation and output) on the Vulkan
 * backend through each path the device offers, side by side: the
 * cooperative-matrix kernel through VK_KHR_cooperative_matrix and through
 * VK_NV_cooperative_matrix (backends/vulkan/vk_coopmat.c), and the scalar
 * tiled kernel (DSPK_VK_COOPMAT=off).  For each path and size n (default
 * 2048 4096 8192; `bench_coopmat n...` to choose) it prints the time of the
 * first call (kernel compile), the median time of the following calls, the
 * rate, and the largest relative error of 256 sampled entries against a
 * double-precision reference.  Then the default path again with other
 * workgroup tiles (DSPK_VK_COOPMAT_TILE), to choose the default.
 * `bench_coopmat --only MODE n...` times one path (auto, khr, nv, off) only,
 * e.g. with a kernel variant (DSPK_VK_COOPMAT_BODY).  cuBLAS's
 * figures for the same gemm are in bench_vulkan's table.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "bench/common/bench_util.h"
#include "bench/vulkan/bench_vk.h"

extern const struct dspk__backend dspk__backend_vulkan;
static const struct dspk__backend *V = &dspk__backend_vulkan;
/* backends/vulkan/vk_coopmat.c (vk.h is not included: see bench_vulkan.c). */
int dspk__vk_coopmat_describe(struct dspk__dev *d, char *buf, size_t len);
const char *dspk__vk_coopmat_tile_name(int i);

/* Values k/256, |k| <= 256: exact in f16, products exact in f32. */
static void fill(uint16_t *h, float *f, size_t n, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    int q = (int)(s % 513) - 256;
    f[i] = (float)q / 256.0f;
    uint16_t v = 0;
    if (q) {
      int sgn = q < 0, a = abs(q), e = 0;
      while ((a >> e) > 1)
        e++;
      v = (uint16_t)((sgn << 15) | ((e - 8 + 15) << 10) | ((a << (10 - e)) & 0x3ff));
    }
    h[i] = v;
  }
}

static int run(struct dspk__dev *d, struct dspk__op *op) {
  char msg[512] = "";
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = sizeof msg};
  int r = V->run(d, op, &ctx);
  if (r)
    fprintf(stderr, "bench_coopmat: gemm failed: %d %s\n", r, msg);
  return r;
}

/* One path (mode for DSPK_VK_COOPMAT, NULL: the default choice) on every
 * size.  Returns 0, or 1 when the path is not offered. */
static int coop_only; /* skip the path when it is the scalar kernel */

static int bench_path(int idx, const char *mode, const int *sizes, int nsizes) {
  if (mode)
    setenv("DSPK_VK_COOPMAT", mode, 1);
  else
    unsetenv("DSPK_VK_COOPMAT");
  struct dspk__devenv env = {0};
  struct dspk__dev *d;
  int r = V->open(idx, &env, &d);
  if (r) {
    printf("| %s | open failed (%d) | | | | |\n", mode ? mode : "auto", r);
    return 1;
  }
  char desc[256];
  int kind = dspk__vk_coopmat_describe(d, desc, sizeof desc);
  int want = !mode || strcmp(mode, "off") == 0 ? -1 : strcmp(mode, "nv") == 0 ? 1 : 2;
  if (coop_only && kind == 0) {
    V->close(d);
    return 1;
  }
  if (want > 0 && kind != want) {
    printf("| %s | %s | - | - | - | - |\n", mode, desc);
    V->close(d);
    return 1;
  }
  for (int si = 0; si < nsizes; si++) {
    int n = sizes[si];
    size_t nn = (size_t)n * n;
    uint16_t *ha = malloc(nn * 2), *hb = malloc(nn * 2);
    float *fa = malloc(nn * 4), *fb = malloc(nn * 4), *out = malloc(nn * 4);
    fill(ha, fa, nn, 88172645463325252ull);
    fill(hb, fb, nn, 1234567891234567ull);
    struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = 2};
    op.u.gemm.alpha = 1;
    for (int i = 0; i < 2; i++) {
      struct dspk__tensor *t = &op.in[i];
      t->dtype = DSPK_F16;
      t->rank = 2;
      t->shape[0] = t->shape[1] = n;
      if (V->alloc(d, nn * 2, &t->mem) || V->write(d, t->mem, 0, i ? hb : ha, nn * 2))
        goto fail;
    }
    char msg[256];
    if (dspk__op_infer(&op, msg, sizeof msg) || V->alloc(d, nn * 4, &op.out[0].mem))
      goto fail;
    double t0 = dspk_bench_now_ms();
    if (run(d, &op) || V->sync(d))
      goto fail;
    double first = dspk_bench_now_ms() - t0;
    int reps = n >= 8192 ? 5 : n >= 4096 ? 10 : 20;
    double v[3];
    for (int k = 0; k < 3; k++) {
      t0 = dspk_bench_now_ms();
      for (int i = 0; i < reps; i++)
        if (run(d, &op))
          goto fail;
      if (V->sync(d))
        goto fail;
      v[k] = (dspk_bench_now_ms() - t0) / reps;
    }
    double a = v[0], b = v[1], c = v[2], t;
    if (a > b) { t = a; a = b; b = t; }
    if (b > c) { t = b; b = c; c = t; }
    if (a > b) { t = a; a = b; b = t; }
    double med = b;
    if (V->read(d, op.out[0].mem, 0, out, nn * 4))
      goto fail;
    double maxe = 0, maxw = 1e-30;
    uint64_t s = 42;
    for (int k = 0; k < 256; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      int64_t m = (int64_t)((s >> 33) % (uint64_t)n), j = (int64_t)((s >> 13) % (uint64_t)n);
      double w = 0;
      for (int64_t q = 0; q < n; q++)
        w += (double)fa[m * n + q] * fb[q * n + j];
      double e = fabs(out[m * n + j] - w);
      if (e > maxe)
        maxe = e;
      if (fabs(w) > maxw)
        maxw = fabs(w);
    }
    printf("| %s | %s | %d^2 | %.0f ms | %.3f ms (%.1f TFLOP/s) | %.2g |\n",
           mode ? mode : "auto", desc, n, first, med, 2.0 * n * (double)n * n / med / 1e9,
           maxe / maxw);
    fflush(stdout);
  fail:
    for (int i = 0; i < 2; i++)
      V->free(d, op.in[i].mem);
    V->free(d, op.out[0].mem);
    free(ha);
    free(hb);
    free(fa);
    free(fb);
    free(out);
  }
  V->close(d);
  return 0;
}

int main(int argc, char **argv) {
  int sizes[16] = {2048, 4096, 8192}, nsizes = 3;
  const char *only = NULL; /* --only MODE: that path alone (auto, khr, nv, off) */
  if (argc > 2 && strcmp(argv[1], "--only") == 0) {
    only = argv[2];
    argc -= 2;
    argv += 2;
  }
  if (argc > 1) {
    nsizes = 0;
    for (int i = 1; i < argc && nsizes < 16; i++)
      if (atoi(argv[i]) > 0)
        sizes[nsizes++] = atoi(argv[i]);
  }
  int idx = bench_vk_pick(V);
  if (idx < 0)
    return 1;
  printf("| DSPK_VK_COOPMAT | path | n | first call | time | max rel err (256 samples) |\n"
         "|---|---|---|---|---|---|\n");
  if (only) {
    int r = bench_path(idx, strcmp(only, "auto") == 0 ? NULL : only, sizes, nsizes);
    V->shutdown();
    return r;
  }
  bench_path(idx, NULL, sizes, nsizes);
  bench_path(idx, "khr", sizes, nsizes);
  bench_path(idx, "nv", sizes, nsizes);
  /* The scalar kernel: the smallest two sizes only (it is ~40x slower). */
  bench_path(idx, "off", sizes, nsizes < 2 ? nsizes : 2);
  /* Every tile candidate (subgroups wm x wn, each wtm x wtn, depth bk,
   * shared buffers) forced on the default path, at the largest two sizes. */
  coop_only = 1;
  for (int i = 0; dspk__vk_coopmat_tile_name(i); i++) {
    setenv("DSPK_VK_COOPMAT_TILE", dspk__vk_coopmat_tile_name(i), 1);
    bench_path(idx, NULL, sizes + (nsizes > 2 ? nsizes - 2 : 0), nsizes < 2 ? nsizes : 2);
  }
  unsetenv("DSPK_VK_COOPMAT_TILE");
  V->shutdown();
  return 0;
}
