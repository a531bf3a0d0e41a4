/*
 * Tests of the cooperative-matrix gemm path of the Vulkan backend
 * (backends/vulkan/vk_coopmat.c).
 *
 * Everywhere: the path's selection (on a device without cooperative
 * matrices, lavapipe, it says "not offered" and f16 gemm stays right through
 * the scalar kernel); the generated NV SPIR-V passes spirv-val (when the
 * build found it); the NV -> KHR SPIR-V rewrite (opcodes, operand order,
 * Use and MemoryLayout constants, id bound) on real kernels; and the
 * kernel's tiling, staging and epilogue run in the "emulate" mode (plain
 * arrays in place of fragments) against naive double references on many
 * shapes.  On a device that offers VK_NV_cooperative_matrix and/or
 * VK_KHR_cooperative_matrix (the H200), the same f16 gemms run on the
 * tensor cores through each extension it offers, on shapes that are
 * multiples of the tile and ragged ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/vulkan/vk.h"
#include "cache/cache.h"
#include "tests/vulkan/vk_harness.h"

static struct dspk__devinfo INFO[16];
static int NDEV, DEV;

static int setup(void **state) {
  (void)state;
  char why[256];
  NDEV = VKB->probe(INFO, 16, why, sizeof why);
  if (NDEV <= 0) {
    fprintf(stderr, "no vulkan device: %s\n", why);
    return -1;
  }
  DEV = getenv("DSPK_VK_TEST_DEVICE") ? atoi(getenv("DSPK_VK_TEST_DEVICE")) : 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  VKB->shutdown();
  return 0;
}

/* Opens the test device with DSPK_VK_COOPMAT=mode (NULL: unset). */
static struct dspk__dev *open_with(const char *mode) {
  if (mode)
    setenv("DSPK_VK_COOPMAT", mode, 1);
  else
    unsetenv("DSPK_VK_COOPMAT");
  struct dspk__devenv env = {0};
  struct dspk__dev *d = NULL;
  int r = VKB->open(DEV, &env, &d);
  unsetenv("DSPK_VK_COOPMAT");
  if (r)
    fail_msg("open vulkan:%d with DSPK_VK_COOPMAT=%s: %d", DEV, mode ? mode : "(unset)", r);
  return d;
}

/* Offset of the batch-b matrix of x (its last `keep` axes are the matrix;
 * batch axes right-aligned against the output's nbd axes os[], broadcast
 * where x has 1). */
static int64_t batch_off(const struct htensor *x, int keep, const int64_t *os, int nbd,
                         int64_t b) {
  int64_t stride = 1, off = 0;
  for (int i = x->rank - keep; i < x->rank; i++)
    stride *= x->shape[i];
  for (int i = nbd - 1; i >= 0; i--) {
    int64_t c = b % os[i];
    b /= os[i];
    int ix = i - (nbd - (x->rank - keep));
    if (ix >= 0) {
      off += (x->shape[ix] == 1 ? 0 : c) * stride;
      stride *= x->shape[ix];
    }
  }
  return off;
}

/* One f16 gemm on d against a naive double reference: A (as), B (bs),
 * optional C (crank >= 0, shape cs), inputs placed `pad` bytes into their
 * blocks.  Returns the relative error. */
/* The dtype of gemm_case's A and B (f16, or bf16 for the KHR path's bf16). */
static dspk_dtype gemm_dt = DSPK_F16;

static double gemm_case(struct dspk__dev *d, int ra, const int64_t *as, int rb,
                        const int64_t *bs, int ta, int tb, int crank, const int64_t *cs,
                        double alpha, double beta, size_t pad) {
  char msg[512];
  struct htensor A = h_make(gemm_dt, ra, as, 1), B = h_make(gemm_dt, rb, bs, 1);
  struct htensor C = {0}, out = {0};
  struct dspk__op op = {.kind = DSPK_OP_GEMM, .nin = crank >= 0 ? 3 : 2};
  op.u.gemm.trans_a = ta;
  op.u.gemm.trans_b = tb;
  op.u.gemm.alpha = alpha;
  op.u.gemm.beta = beta;
  assert_int_equal(h_upload(d, &A, pad, &op.in[0]), 0);
  assert_int_equal(h_upload(d, &B, pad, &op.in[1]), 0);
  if (crank >= 0) {
    C = h_make(DSPK_F32, crank, cs, 1);
    assert_int_equal(h_upload(d, &C, 0, &op.in[2]), 0);
  }
  int r = h_run(d, &op, &out, msg, sizeof msg);
  if (r)
    fail_msg("gemm: %d %s", r, msg);
  int ro = out.rank, nbd = ro - 2;
  int64_t M = out.shape[ro - 2], N = out.shape[ro - 1], K = ta ? as[ra - 2] : as[ra - 1];
  int64_t nb = 1;
  for (int i = 0; i < nbd; i++)
    nb *= out.shape[i];
  double complex *want = calloc((size_t)(out.n ? out.n : 1), sizeof *want);
  for (int64_t b = 0; b < nb; b++) {
    int64_t ao = batch_off(&A, 2, out.shape, nbd, b), bo = batch_off(&B, 2, out.shape, nbd, b);
    int ck = crank < 2 ? crank : 2;
    int64_t co = crank >= 0 ? batch_off(&C, ck, out.shape, nbd, b) : 0;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += creal(A.v[ao + (ta ? k * M + m : m * K + k)]) *
               creal(B.v[bo + (tb ? n * K + k : k * N + n)]);
        double v = alpha * s;
        if (crank >= 0) {
          int64_t cn = crank >= 1 ? C.shape[crank - 1] : 1;
          int64_t cm = crank >= 2 ? C.shape[crank - 2] : 1;
          v += beta * creal(C.v[co + (cm == 1 ? 0 : m) * cn + (cn == 1 ? 0 : n)]);
        }
        want[(b * M + m) * N + n] = v;
      }
  }
  double e = h_relerr(&out, want, out.n);
  free(want);
  h_free(&A);
  h_free(&B);
  h_free(&C);
  h_free(&out);
  return e;
}

/* The shapes every path must get right: whole tiles, ragged edges,
 * transposes, batches with broadcasting, C broadcast, alpha/beta, operands
 * off the 16-byte grid.  tile_m/n: the device's workgroup tile. */
static void gemm_suite(struct dspk__dev *d, const char *what, int64_t tile_m, int64_t tile_n,
                       double tol) {
  struct {
    int64_t M, N, K;
    int ta, tb, batch, crank;
    double alpha, beta;
    size_t pad;
  } cs[] = {
      {tile_m * 2, tile_n * 2, 64, 0, 0, 0, -1, 1, 0, 0},   /* whole tiles, uvec4 reads */
      {tile_m, tile_n, 96, 0, 0, 0, 2, 1.5, -0.5, 0},       /* + C */
      {tile_m + 37, tile_n + 21, 70, 0, 0, 0, -1, 1, 0, 0}, /* ragged M, N, K%32 */
      {37, 45, 29, 0, 0, 0, -1, 1, 0, 0},                   /* small, odd K: scalar reads */
      {50, 40, 48, 1, 0, 0, 1, 2, 1, 0},                    /* A transposed, C row */
      {33, 24, 40, 0, 1, 0, 0, 1, 3, 0},                    /* B transposed, C scalar */
      {29, 31, 17, 1, 1, 0, -1, -1, 0, 0},                  /* both */
      {40, 24, 32, 0, 0, 1, 2, 1, 1, 0},                    /* batch, B broadcast */
      {16, 8, 16, 0, 0, 0, -1, 1, 0, 2},                    /* one fragment, unaligned */
      {24, 32, 40, 0, 0, 0, -1, 1, 0, 16},                  /* 16-byte offset: uvec4 */
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    int64_t M = cs[i].M, N = cs[i].N, K = cs[i].K;
    int64_t as[4], bs[4], c[4] = {0};
    int ra = 2, rb = 2, crank = cs[i].crank;
    if (cs[i].batch) { /* A (3, M, K), B (K, N) broadcast over 3 */
      as[0] = 3;
      ra = 3;
    }
    as[ra - 2] = cs[i].ta ? K : M;
    as[ra - 1] = cs[i].ta ? M : K;
    bs[0] = cs[i].tb ? N : K;
    bs[1] = cs[i].tb ? K : N;
    if (crank == 2) {
      c[0] = M;
      c[1] = N;
    } else if (crank == 1) {
      c[0] = N;
    }
    uint64_t before = d->cm.ngemm;
    double e = gemm_case(d, ra, as, rb, bs, cs[i].ta, cs[i].tb, crank, c, cs[i].alpha,
                         cs[i].beta, cs[i].pad);
    /* Every case of the suite is one the path takes, when it is on. */
    if (d->cm.kind != DSPK__VK_CM_NONE && d->cm.ngemm != before + 1) {
      char now[256];
      dspk__vk_coopmat_describe(d, now, sizeof now);
      fail_msg("%s: gemm %lldx%lldx%lld did not take the cooperative-matrix path (now: %s)",
               what, (long long)M, (long long)N, (long long)K, now);
    }
    if (!(e <= tol))
      fail_msg("%s: gemm %s %lldx%lldx%lld ta %d tb %d batch %d crank %d pad %zu: rel err %g "
               "(tol %g)",
               what, dspk__dtype_name(gemm_dt), (long long)M, (long long)N, (long long)K,
               cs[i].ta, cs[i].tb, cs[i].batch, crank, cs[i].pad, e, tol);
  }
  /* A batch of small matrices (at most 256 outputs each) takes the
   * small-product kernel, not a cooperative-matrix tile per batch entry. */
  int64_t as[3] = {2000, 4, 8}, bs[3] = {2000, 8, 4};
  uint64_t before = d->cm.ngemm;
  double e = gemm_case(d, 3, as, 3, bs, 0, 0, -1, NULL, 1, 0, 0);
  if (!(e <= tol))
    fail_msg("%s: small batched gemm: rel err %g", what, e);
  assert_true(d->cm.ngemm == before);
  assert_string_equal(dspk__vk_gemm_last(), "small-batched");
}

/* The workgroup tile the kernel uses on d. */
static void tile_of(struct dspk__dev *d, int64_t *tm, int64_t *tn) {
  uint32_t bm, bn, bk;
  dspk__vk_coopmat_tile(&d->cm, &bm, &bn, &bk);
  *tm = bm;
  *tn = bn;
}

static void t_selection(void **state) {
  (void)state;
  char desc[256];
  struct dspk__dev *d = open_with(NULL);
  int kind = dspk__vk_coopmat_describe(d, desc, sizeof desc);
  print_message("vulkan:%d %s: f16 gemm path: %s\n", DEV, INFO[DEV].name, desc);
  if (INFO[DEV].software) {
    assert_int_equal(kind, DSPK__VK_CM_NONE);
    assert_non_null(strstr(desc, "not offered"));
  } else if (kind != DSPK__VK_CM_NONE) {
    assert_true(kind == DSPK__VK_CM_KHR || kind == DSPK__VK_CM_NV);
    assert_true(d->cm.lm > 0 && d->cm.ln > 0 && d->cm.lk > 0);
  }
  /* f16 stays right on whichever path was chosen. */
  int64_t tm, tn;
  tile_of(d, &tm, &tn);
  gemm_suite(d, desc, tm, tn, kind == DSPK__VK_CM_NONE ? 1e-5 : 1e-4);
  VKB->close(d);
  d = open_with("off");
  assert_int_equal(dspk__vk_coopmat_describe(d, desc, sizeof desc), DSPK__VK_CM_NONE);
  assert_non_null(strstr(desc, "DSPK_VK_COOPMAT=off"));
  VKB->close(d);
}

/* ---- SPIR-V ---------------------------------------------------------------- */

struct spv_count {
  int nv_ops, cap_nv, cap_khr, ext_nv, ext_khr, khr_types, khr_loads, khr_stores, khr_muladd;
  int use_seen[3];
  int bad_layout; /* a KHR load/store whose layout is not a 0/1 constant */
  int bad_use;    /* a KHR type whose Use is not a 0..2 constant */
};

/* The value of OpConstant id (or -1). */
static int64_t const_of(const uint32_t *w, size_t n, uint32_t id) {
  for (size_t i = 5; i < n; i += w[i] >> 16)
    if ((w[i] & 0xffff) == 43 && (w[i] >> 16) == 4 && w[i + 2] == id)
      return w[i + 3];
  return -1;
}

/* Walks a module; fails the test when its word counts do not add up. */
static void spv_walk(const uint32_t *w, size_t n, struct spv_count *c) {
  memset(c, 0, sizeof *c);
  assert_true(n > 5);
  assert_int_equal(w[0], 0x07230203);
  size_t i = 5;
  while (i < n) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    assert_true(wc > 0 && i + wc <= n);
    if (op >= 5358 && op <= 5362)
      c->nv_ops++;
    if (op == 17 && w[i + 1] == 5357)
      c->cap_nv++;
    if (op == 17 && w[i + 1] == 6022)
      c->cap_khr++;
    if (op == 10 && strcmp((const char *)&w[i + 1], "SPV_NV_cooperative_matrix") == 0)
      c->ext_nv++;
    if (op == 10 && strcmp((const char *)&w[i + 1], "SPV_KHR_cooperative_matrix") == 0)
      c->ext_khr++;
    if (op == 4456) {
      assert_int_equal(wc, 7);
      int64_t u = const_of(w, n, w[i + 6]);
      if (u < 0 || u > 2)
        c->bad_use++;
      else
        c->use_seen[u]++;
      c->khr_types++;
    }
    if (op == 4457 || op == 4458) {
      /* load: op rt res ptr layout stride ...; store: op ptr obj layout stride ... */
      int64_t l = const_of(w, n, w[i + 4 - (op == 4458)]);
      if (l != 0 && l != 1)
        c->bad_layout++;
      if (op == 4457)
        c->khr_loads++;
      else
        c->khr_stores++;
    }
    if (op == 4459) {
      assert_int_equal(wc, 6);
      c->khr_muladd++;
    }
    i += wc;
  }
  assert_int_equal(i, n);
}

/* The bf16 rewrite of a KHR module (dspk__vk_coopmat_bf16): each 16-bit
 * OpTypeFloat gains the BFloat16KHR encoding, the two capabilities come
 * after the module's own and the extension after its extensions, and
 * nothing else changes.  (Debian 12's SPIRV-Tools predates SPV_KHR_bfloat16,
 * so the result is checked word by word, not validated; the driver takes
 * it on the H200: t_hardware_khr.) */
static void check_bf16(const uint32_t *khr, size_t kw) {
  uint32_t *bf = NULL;
  size_t bw = 0, nhalf = 0, nbfloat = 0, caps[2] = {0, 0}, ext = 0, i, j;
  assert_int_equal(dspk__vk_coopmat_bf16(khr, kw, &bf, &bw), 0);
  for (i = 5; i < kw; i += khr[i] >> 16)
    nhalf += (khr[i] & 0xffff) == 22 && (khr[i] >> 16) == 3 && khr[i + 2] == 16;
  assert_true(nhalf > 0);
  int phase = 0; /* 0 capabilities, 1 extensions, 2 the rest */
  for (i = 5, j = 5; i < bw; i += bf[i] >> 16) {
    uint32_t op = bf[i] & 0xffff, wc = bf[i] >> 16;
    int ph = op == 17 ? 0 : op == 10 ? 1 : 2;
    assert_true(ph >= phase); /* the module's layout is kept */
    phase = ph;
    if (op == 17 && (bf[i + 1] == 5116 || bf[i + 1] == 5118)) {
      caps[bf[i + 1] == 5118]++;
      continue;
    }
    if (op == 10 && strcmp((const char *)&bf[i + 1], "SPV_KHR_bfloat16") == 0) {
      ext++;
      continue;
    }
    if (op == 22 && bf[i + 2] == 16) {
      assert_int_equal(wc, 4);
      assert_int_equal(bf[i + 3], 0); /* BFloat16KHR */
      assert_int_equal(khr[j + 1], bf[i + 1]);
      nbfloat++;
      j += khr[j] >> 16;
      continue;
    }
    /* Any other instruction: the same words as in the KHR module. */
    assert_int_equal(khr[j], bf[i]);
    assert_memory_equal(&khr[j], &bf[i], wc * 4);
    j += wc;
  }
  assert_int_equal(j, kw);
  assert_int_equal(caps[0], 1);
  assert_int_equal(caps[1], 1);
  assert_int_equal(ext, 1);
  assert_int_equal(nbfloat, nhalf);
  assert_int_equal(bw, kw + 4 + 1 + 5 + nhalf); /* 2 capabilities, extension, encodings */
  free(bf);
}

/* Counts the NV instructions of a module by opcode. */
static void nv_counts(const uint32_t *w, size_t n, int *types, int *loads, int *stores,
                      int *muladd) {
  *types = *loads = *stores = *muladd = 0;
  for (size_t i = 5; i < n; i += w[i] >> 16) {
    uint32_t op = w[i] & 0xffff;
    *types += op == 5358;
    *loads += op == 5359;
    *stores += op == 5360;
    *muladd += op == 5361;
  }
}

static void spirv_val(const uint32_t *w, size_t n, const char *what) {
#ifdef DSPK_SPIRV_VAL
  if (access(DSPK_SPIRV_VAL, X_OK) != 0) {
    print_message("spirv-val (%s) not here: %s not validated\n", DSPK_SPIRV_VAL, what);
    return;
  }
  char path[] = "/tmp/dspk-coopmat-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, w, n * 4), (ssize_t)(n * 4));
  close(fd);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s --target-env vulkan1.2 %s", DSPK_SPIRV_VAL, path);
  int r = system(cmd);
  unlink(path);
  if (r != 0)
    fail_msg("spirv-val rejects the %s module (exit %d)", what, r);
#else
  (void)w;
  (void)n;
  print_message("spirv-val not found at build time: %s not validated\n", what);
#endif
}

static void t_spirv(void **state) {
  (void)state;
  struct dspk__dev *d = open_with("off");
  static const uint32_t shapes[][3] = {{16, 8, 16}, {16, 16, 16}, {16, 8, 8}, {32, 8, 16}};
  static const unsigned variants[] = {
      0, DSPK__VK_CM_F_AKC | DSPK__VK_CM_F_BNC,
      DSPK__VK_CM_F_AKC | DSPK__VK_CM_F_BNC | DSPK__VK_CM_F_AVEC | DSPK__VK_CM_F_BVEC |
          DSPK__VK_CM_F_HASC};
  char *src = malloc(32768), log[2048];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
      if (s > 0 && v != 2)
        continue; /* every variant on the main shape, one on the others */
      struct dspk__vk_coopmat cm = {.kind = DSPK__VK_CM_NV,
                                    .lm = shapes[s][0],
                                    .ln = shapes[s][1],
                                    .lk = shapes[s][2],
                                    .sgsize = 32};
      assert_true(dspk__vk_coopmat_source(src, 32768, &cm, 0, variants[v]) < 32768);
      uint32_t *nv = NULL, *khr = NULL;
      size_t nw = 0, kw = 0;
      int r = dspk__vk_glsl_to_spirv(d, "gemm_coopmat", src, NULL, &nv, &nw, log, sizeof log, NULL);
      if (r)
        fail_msg("coopmat %ux%ux%u variant %u does not compile: %s", cm.lm, cm.ln, cm.lk,
                 variants[v], log);
      char what[64];
      snprintf(what, sizeof what, "NV %ux%ux%u variant %u", cm.lm, cm.ln, cm.lk, variants[v]);
      spirv_val(nv, nw, what);
      int nt, nl, ns, nm;
      nv_counts(nv, nw, &nt, &nl, &ns, &nm);
      assert_int_equal(nt, 3); /* A, B (rows a spec constant: distinct), C */
      assert_true(nl >= 2 && ns >= 1 && nm >= 1);
      assert_int_equal(dspk__vk_coopmat_nv_to_khr(nv, nw, &khr, &kw), 0);
      struct spv_count c;
      spv_walk(khr, kw, &c);
      assert_int_equal(c.nv_ops, 0);
      assert_int_equal(c.cap_nv, 0);
      assert_int_equal(c.cap_khr, 1);
      assert_int_equal(c.ext_nv, 0);
      assert_int_equal(c.ext_khr, 1);
      assert_int_equal(c.khr_types, nt);
      assert_int_equal(c.khr_loads, nl);
      assert_int_equal(c.khr_stores, ns);
      assert_int_equal(c.khr_muladd, nm);
      assert_int_equal(c.bad_use, 0);
      assert_int_equal(c.bad_layout, 0);
      for (int u = 0; u < 3; u++)
        assert_int_equal(c.use_seen[u], 1); /* one type each for A, B, C */
      assert_int_equal(khr[3], nv[3] + 3);  /* three new constants */
      assert_int_equal(kw, nw + 12 + 3);    /* 3 OpConstant, 1 word per type */
      free(khr);
      free(nv);
    }
  /* Every tile candidate of the main shape (double-buffered ones too). */
  for (int t = 0; dspk__vk_coopmat_tile_name(t); t++) {
    struct dspk__vk_coopmat cm = {.kind = DSPK__VK_CM_NV, .lm = 16, .ln = 8, .lk = 16,
                                  .sgsize = 32};
    assert_true(dspk__vk_coopmat_source(src, 32768, &cm, t, variants[2]) < 32768);
    uint32_t *nv = NULL, *khr = NULL;
    size_t nw = 0, kw = 0;
    if (dspk__vk_glsl_to_spirv(d, "gemm_coopmat", src, NULL, &nv, &nw, log, sizeof log, NULL))
      fail_msg("coopmat tile %s does not compile: %s", dspk__vk_coopmat_tile_name(t), log);
    spirv_val(nv, nw, dspk__vk_coopmat_tile_name(t));
    assert_int_equal(dspk__vk_coopmat_nv_to_khr(nv, nw, &khr, &kw), 0);
    check_bf16(khr, kw);
    free(khr);
    free(nv);
    /* The bf16 variant, in the bf16 shape the H200 offers (16x16x16). */
    cm.bf16 = 1;
    cm.blm = cm.bln = cm.blk = 16;
    assert_true(dspk__vk_coopmat_source(src, 32768, &cm, t, variants[2] | DSPK__VK_CM_F_BF16) <
                32768);
    assert_non_null(strstr(src, "#define LN 16u"));
    if (dspk__vk_glsl_to_spirv(d, "gemm_coopmat", src, NULL, &nv, &nw, log, sizeof log, NULL))
      fail_msg("bf16 coopmat tile %s does not compile: %s", dspk__vk_coopmat_tile_name(t), log);
    spirv_val(nv, nw, dspk__vk_coopmat_tile_name(t));
    assert_int_equal(dspk__vk_coopmat_nv_to_khr(nv, nw, &khr, &kw), 0);
    check_bf16(khr, kw);
    free(khr);
    free(nv);
  }
  /* Not NV modules. */
  uint32_t junk[8] = {0x12345678, 0x10500, 0, 100, 0, (2u << 16) | 17, 1, 0};
  uint32_t *o = NULL;
  size_t on = 0;
  assert_int_equal(dspk__vk_coopmat_nv_to_khr(junk, 8, &o, &on), DSPK_EINVAL);
  junk[0] = 0x07230203;
  junk[7] = 0xffff0000; /* word count past the end */
  assert_int_equal(dspk__vk_coopmat_nv_to_khr(junk, 8, &o, &on), DSPK_EINVAL);
  struct dspk__vk_coopmat emu = {.kind = DSPK__VK_CM_EMU, .lm = 16, .ln = 8, .lk = 16,
                                 .sgsize = 32};
  assert_true(dspk__vk_coopmat_source(src, 32768, &emu, 0, 0) < 32768);
  uint32_t *spv = NULL;
  size_t sw = 0;
  assert_int_equal(dspk__vk_glsl_to_spirv(d, "gemm_coopmat", src, NULL, &spv, &sw, log, sizeof log, NULL), 0);
  spirv_val(spv, sw, "emulated");
  assert_int_equal(dspk__vk_coopmat_nv_to_khr(spv, sw, &o, &on), DSPK_EINVAL);
  /* bf16: malformed, and a module without a 16-bit float, are refused. */
  assert_int_equal(dspk__vk_coopmat_bf16(junk, 8, &o, &on), DSPK_EINVAL);
  uint32_t nohalf[7] = {0x07230203, 0x10500, 0, 10, 0, (2u << 16) | 17, 1};
  assert_int_equal(dspk__vk_coopmat_bf16(nohalf, 7, &o, &on), DSPK_EINVAL);
  free(spv);
  free(src);
  VKB->close(d);
}

/* ---- the kernel, emulated (every device) and on the tensor cores ----------- */

static void t_emulated(void **state) {
  (void)state;
  char desc[256];
  struct dspk__dev *d = open_with("emulate");
  int kind = dspk__vk_coopmat_describe(d, desc, sizeof desc);
  if (kind != DSPK__VK_CM_EMU) {
    print_message("emulated coopmat path not available here: %s\n", desc);
    VKB->close(d);
    skip();
  }
  int64_t tm, tn;
  tile_of(d, &tm, &tn);
  gemm_suite(d, desc, tm, tn, 1e-5);
  VKB->close(d);
  /* The autotuner's choice between the emulated tiles (every candidate
   * runs; the winner's result is checked). */
  d = open_with("emulate");
  dspk__vk_coopmat_tune_min(1);
  int64_t ta[2] = {96, 72}, tb[2] = {72, 80};
  uint64_t before0 = d->cm.ngemm;
  double e0 = gemm_case(d, 2, ta, 2, tb, 0, 0, -1, NULL, 1, 0, 0);
  dspk__vk_coopmat_tune_min(0);
  print_message("emulated, tuned: %llu launches, rel err %.3g\n",
                (unsigned long long)(d->cm.ngemm - before0), e0);
  assert_true(e0 <= 1e-5);
  assert_true(d->cm.ngemm >= before0 + 3); /* both candidates, then the winner */
  VKB->close(d);
  /* A kernel the driver rejects: the path turns off, the gemm still runs
   * (on the scalar kernel) and is right. */
  d = open_with("emulate");
  dspk__vk_coopmat_fault(1);
  int64_t as[2] = {40, 24}, bs[2] = {24, 56};
  uint64_t before = d->cm.ngemm;
  double e = gemm_case(d, 2, as, 2, bs, 0, 0, -1, NULL, 1, 0, 0);
  dspk__vk_coopmat_fault(0);
  assert_true(e <= 1e-5);
  assert_int_equal(d->cm.ngemm, before);
  assert_int_equal(dspk__vk_coopmat_describe(d, desc, sizeof desc), DSPK__VK_CM_NONE);
  assert_non_null(strstr(desc, "injected failure"));
  VKB->close(d);
  /* Another tile (2 x 2 subgroups, two shared buffers), forced. */
  setenv("DSPK_VK_COOPMAT_TILE", "2x2x32x16x32x2", 1);
  d = open_with("emulate");
  unsetenv("DSPK_VK_COOPMAT_TILE");
  dspk__vk_coopmat_describe(d, desc, sizeof desc);
  assert_non_null(strstr(desc, "forced"));
  assert_non_null(strstr(desc, "2 shared buffers"));
  tile_of(d, &tm, &tn);
  assert_int_equal(tm, 64);
  assert_int_equal(tn, 32);
  gemm_suite(d, desc, tm, tn, 1e-5);
  VKB->close(d);
}

/* The f16 gemms on the tensor cores through DSPK_VK_COOPMAT=modes[i]. */
static void hardware(int i) {
  static const char *modes[] = {"nv", "khr"};
  static const int kinds[] = {DSPK__VK_CM_NV, DSPK__VK_CM_KHR};
  int ran = 0;
  {
    char desc[256];
    struct dspk__dev *d = open_with(modes[i]);
    int kind = dspk__vk_coopmat_describe(d, desc, sizeof desc);
    print_message("DSPK_VK_COOPMAT=%s: %s\n", modes[i], desc);
    if (kind == kinds[i]) {
      int64_t tm, tn;
      tile_of(d, &tm, &tn);
      gemm_suite(d, desc, tm, tn, 1e-4);
      /* Larger: multiple of the tile, and ragged in every dimension. */
      int64_t as[2] = {512, 384}, bs[2] = {384, 256};
      double e = gemm_case(d, 2, as, 2, bs, 0, 0, -1, NULL, 1, 0, 0);
      print_message("  512x256x384: rel err %.3g\n", e);
      assert_true(e <= 1e-4);
      int64_t as2[2] = {300, 250}, bs2[2] = {250, 170};
      e = gemm_case(d, 2, as2, 2, bs2, 0, 0, -1, NULL, 1, 0, 0);
      print_message("  300x170x250: rel err %.3g\n", e);
      assert_true(e <= 1e-4);
      /* Large enough for the autotuner (every tile runs, the winner is
       * checked). */
      uint64_t before = d->cm.ngemm;
      int64_t as3[2] = {1024, 1024}, bs3[2] = {1024, 1000};
      e = gemm_case(d, 2, as3, 2, bs3, 0, 0, -1, NULL, 1, 0, 0);
      print_message("  1024x1000x1024 (tuned, %llu launches): rel err %.3g\n",
                    (unsigned long long)(d->cm.ngemm - before), e);
      assert_true(e <= 1e-4);
      assert_true(d->cm.ngemm > before);
      /* bf16 where the KHR path offers it (VK_KHR_shader_bfloat16): the
       * same shapes, on the tensor cores (counted launches). */
      if (d->cm.bf16) {
        gemm_dt = DSPK_BF16;
        before = d->cm.ngemm;
        gemm_suite(d, "bf16", tm, tn, 1e-4);
        e = gemm_case(d, 2, as3, 2, bs3, 0, 0, -1, NULL, 1, 0, 0);
        print_message("  bf16 1024x1000x1024 (tuned, %llu launches): rel err %.3g\n",
                      (unsigned long long)(d->cm.ngemm - before), e);
        gemm_dt = DSPK_F16;
        assert_true(e <= 1e-4);
        assert_true(d->cm.ngemm > before);
        assert_true(d->cm.bf16); /* no kernel was rejected */
      } else {
        print_message("  bf16: on the scalar kernel (%s)\n",
                      d->cm.kind == DSPK__VK_CM_KHR ? d->cm.bf16_why : "the NV path has none");
      }
      ran++;
    }
    VKB->close(d);
    if (kind != kinds[i])
      skip();
    /* Every tile candidate, forced, on a ragged shape and a batch. */
    for (int t = 0; dspk__vk_coopmat_tile_name(t); t++) {
      setenv("DSPK_VK_COOPMAT_TILE", dspk__vk_coopmat_tile_name(t), 1);
      d = open_with(modes[i]);
      unsetenv("DSPK_VK_COOPMAT_TILE");
      dspk__vk_coopmat_describe(d, desc, sizeof desc);
      uint64_t before = d->cm.ngemm;
      int64_t as4[3] = {2, 300, 250}, bs4[2] = {250, 170}, cs4[2] = {300, 170};
      double e = gemm_case(d, 3, as4, 2, bs4, 0, 0, 2, cs4, 1.5, -0.5, 0);
      int64_t as5[2] = {77, 40}, bs5[2] = {90, 77};
      double e2 = gemm_case(d, 2, as5, 2, bs5, 1, 1, -1, NULL, 1, 0, 2);
      print_message("  %s: rel err %.3g, %.3g\n", desc, e, e2);
      if (!(e <= 1e-4 && e2 <= 1e-4) || d->cm.ngemm != before + 2) {
        char now[256];
        dspk__vk_coopmat_describe(d, now, sizeof now);
        fail_msg("%s: rel err %g, %g; %llu coopmat launches (now: %s)", desc, e, e2,
                 (unsigned long long)(d->cm.ngemm - before), now);
      }
      VKB->close(d);
    }
  }
  if (!ran)
    skip();
}

static void t_hardware_nv(void **state) {
  (void)state;
  hardware(0);
}

static void t_hardware_khr(void **state) {
  (void)state;
  hardware(1);
}

/* A restarted device with the same cache file compiles none of the path's
 * kernels (emulated everywhere; KHR and NV where offered). */
static void t_cache_restart(void **state) {
  (void)state;
  static const char *modes[] = {"emulate", "khr", "nv"};
  static const int kinds[] = {DSPK__VK_CM_EMU, DSPK__VK_CM_KHR, DSPK__VK_CM_NV};
  for (int m = 0; m < 3; m++) {
    char path[] = "/tmp/dspk-coopmat-cache-XXXXXX";
    assert_int_equal(h_cache_path(path), 0);
    int skipped = 0;
    for (int round = 0; round < 2 && !skipped; round++) {
      struct dspk__cache *c;
      assert_int_equal(dspk__cache_open(path, NULL, &c, NULL, 0), 0);
      setenv("DSPK_VK_COOPMAT", modes[m], 1);
      struct dspk__devenv env = {.cache = c};
      struct dspk__dev *d;
      assert_int_equal(VKB->open(DEV, &env, &d), 0);
      unsetenv("DSPK_VK_COOPMAT");
      if ((int)d->cm.kind != kinds[m]) {
        skipped = 1;
      } else {
        int64_t as[2] = {40, 64}, bs[2] = {64, 24};
        uint64_t before = d->cm.ngemm;
        assert_true(gemm_case(d, 2, as, 2, bs, 0, 0, -1, NULL, 1, 0, 0) <= 1e-4);
        assert_int_equal(d->cm.ngemm, before + 1);
        struct dspk__devstats st;
        memset(&st, 0, sizeof st);
        VKB->stats(d, &st);
        print_message("%s round %d: %llu compiled, %llu cache hits\n", modes[m], round,
                      (unsigned long long)st.kernels_compiled,
                      (unsigned long long)st.kernel_cache_hits);
        if (round == 0)
          assert_true(st.kernels_compiled >= 1);
        else {
          assert_int_equal(st.kernels_compiled, 0);
          assert_true(st.kernel_cache_hits >= 1);
        }
      }
      VKB->close(d);
      dspk__cache_close(c);
    }
    h_cache_unlink(path);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_selection),
      cmocka_unit_test(t_spirv),
      cmocka_unit_test(t_emulated),
      cmocka_unit_test(t_cache_restart),
      cmocka_unit_test(t_hardware_nv),
      cmocka_unit_test(t_hardware_khr),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
