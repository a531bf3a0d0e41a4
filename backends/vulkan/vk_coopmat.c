/*
 * The cooperative-matrix path of Vulkan gemm: f16 A and B, f32 accumulation
 * and output, on the tensor cores of devices that offer
 * VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix.
 *
 * At open, dspk__vk_coopmat_setup() picks the extension (KHR first; the
 * environment variable DSPK_VK_COOPMAT=auto|khr|nv|off|emulate overrides)
 * and a fragment shape lm x ln x lk among the device's (f16, f16, f32, f32,
 * subgroup) properties, and enables the extension and its feature.
 *
 * The kernel is one GLSL source written with GL_NV_cooperative_matrix (the
 * only cooperative-matrix GLSL extension glslang 12 compiles).  A workgroup
 * of wm x wn subgroups computes a tile of C (128 x 128 by default: 2 x 2
 * subgroups of 64 x 64, i.e. 4 x 8 fragments of 16 x 8 each) from bk-deep
 * slices of A and B staged in shared memory, as uvec4s where the layout
 * allows; the next slice is read into registers while the current one is
 * multiplied, with one or two shared buffers.  The staging reads every
 * layout (transposed or not, strided batches) and zero-fills outside the
 * matrices, and results leave through a small per-subgroup scratch with
 * bounds checks, alpha, beta and a broadcast C, so every shape is handled,
 * ragged or not.  For large gemms the shared autotuner picks the tile among
 * the candidates below (decisions kept in the cache).
 *
 * For the KHR extension the NV SPIR-V is rewritten here
 * (dspk__vk_coopmat_nv_to_khr), so both paths run the same code.  Where the
 * device also offers VK_KHR_shader_bfloat16 with bf16 matrices of the same
 * shape, bf16 gemm runs on the KHR kernel with its 16-bit floats rewritten
 * to bfloat16 (dspk__vk_coopmat_bf16): they are only moved and multiplied.  The NV
 * SPIR-V goes through the persistent kernel cache and every pipeline
 * through the VkPipelineCache (vk_shader.c); the rewrite is one pass over
 * the words.  A kernel the driver rejects turns the path off on that device
 * and the gemm runs on the scalar kernel.
 *
 * The "emulate" mode is for tests on devices without cooperative matrices
 * (lavapipe): the same tiling, staging and epilogue, with fragments standing
 * for places in shared memory and multiplied by plain loops.
 *
 * Batches go into the z dimension when every operand's batch axes are whole
 * or broadcast; other gemms, and non-f16 ones, take the scalar kernel.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/vulkan/vk.h"
#include "proto/testhook.h"

/* Workgroup tiles: wm x wn subgroups, each wtm x wtn of C, bk deep.  The
 * first is the default; for large gemms the autotuner chooses (per shape
 * class, kept in the cache).  Emulated accumulators live in shared memory:
 * smaller tiles.  DSPK_VK_COOPMAT_TILE=wmxwnxwtmxwtnxbkxnbuf forces one. */
struct tiledef {
  const char *name;
  uint32_t wm, wn, wtm, wtn, bk, nbuf; /* nbuf: shared buffers (1 or 2) */
};
static const struct tiledef hw_tiles[DSPK__VK_CM_TILES] = {
    {"2x2x64x64x32x2", 2, 2, 64, 64, 32, 2}, {"2x4x64x32x32x1", 2, 4, 64, 32, 32, 1},
    {"2x4x64x32x64x1", 2, 4, 64, 32, 64, 1}, {"2x2x64x64x32x1", 2, 2, 64, 64, 32, 1},
    {"2x4x64x64x32x1", 2, 4, 64, 64, 32, 1}, {"2x2x64x64x64x1", 2, 2, 64, 64, 64, 1},
    {"2x4x64x32x32x2", 2, 4, 64, 32, 32, 2}, {"4x2x32x64x32x2", 4, 2, 32, 64, 32, 2},
    {"2x4x64x64x16x2", 2, 4, 64, 64, 16, 2}, {"4x2x64x64x16x2", 4, 2, 64, 64, 16, 2},
    {"2x2x64x64x16x2", 2, 2, 64, 64, 16, 2},
};
static const struct tiledef emu_tiles[] = {
    {"emu-2x4x32x16x32x1", 2, 4, 32, 16, 32, 1},
    {"emu-2x2x32x16x64x2", 2, 2, 32, 16, 64, 2},
};
#define NEMU ((int)(sizeof emu_tiles / sizeof emu_tiles[0]))
/* Gemms of at least this many multiply-adds are tuned. */
#define TUNE_MIN ((uint64_t)1 << 27)

/* Number of tile candidates of cm (1 when one is forced). */
static int ntiles(const struct dspk__vk_coopmat *cm) {
  if (cm->wm)
    return 1;
  return cm->kind == DSPK__VK_CM_EMU ? NEMU : DSPK__VK_CM_TILES;
}
static const char *tile_name(const struct dspk__vk_coopmat *cm, int i) {
  if (cm->wm)
    return "forced";
  return cm->kind == DSPK__VK_CM_EMU ? emu_tiles[i].name : hw_tiles[i].name;
}

/* Tile i of cm: subgroups wm x wn, fragments fm x fn per subgroup, bk,
 * nbuf. */
struct tilep {
  uint32_t wm, wn, fm, fn, bk, nbuf;
};
/* The fragment shape of a kernel variant: bf16 has its own (the driver
 * may offer bf16 in other shapes than f16). */
struct cmshape {
  uint32_t lm, ln, lk;
};
static struct cmshape shape_of(const struct dspk__vk_coopmat *cm, unsigned flags) {
  if (flags & DSPK__VK_CM_F_BF16)
    return (struct cmshape){cm->blm, cm->bln, cm->blk};
  return (struct cmshape){cm->lm, cm->ln, cm->lk};
}

static struct tilep tile_params(const struct dspk__vk_coopmat *cm, struct cmshape sh, int i) {
  if (sh.lm == 0 || sh.ln == 0 || i < 0 || i >= ntiles(cm)) /* no path */
    return (struct tilep){0, 0, 0, 0, 0, 0};
  struct tiledef t = {"forced", cm->wm, cm->wn, cm->wtm, cm->wtn, cm->bk, cm->nbuf};
  if (!cm->wm)
    t = cm->kind == DSPK__VK_CM_EMU ? emu_tiles[i] : hw_tiles[i];
  struct tilep p = {t.wm, t.wn, t.wtm / sh.lm, t.wtn / sh.ln, t.bk, t.nbuf ? t.nbuf : 1};
  if (p.fm == 0)
    p.fm = 1;
  if (p.fn == 0)
    p.fn = 1;
  return p;
}

const char *dspk__vk_coopmat_tile_name(int i) {
  return i >= 0 && i < DSPK__VK_CM_TILES ? hw_tiles[i].name : NULL;
}

void dspk__vk_coopmat_tile(const struct dspk__vk_coopmat *cm, uint32_t *bm, uint32_t *bn,
                           uint32_t *bk) {
  struct tilep t = tile_params(cm, shape_of(cm, 0), 0);
  *bm = t.wm * t.fm * cm->lm;
  *bn = t.wn * t.fn * cm->ln;
  *bk = t.bk;
}

/* SPIR-V opcodes and enumerants (SPIR-V registry, spirv.core.grammar.json). */
enum {
  SPV_MAGIC = 0x07230203,
  OP_EXTENSION = 10,
  OP_CAPABILITY = 17,
  OP_TYPE_INT = 21,
  OP_TYPE_FLOAT = 22,
  OP_CONSTANT_TRUE = 41,
  OP_CONSTANT_FALSE = 42,
  OP_CONSTANT = 43,
  OP_CONSTANT_COMPOSITE = 44,
  OP_VARIABLE = 59,
  OP_LOAD = 61,
  OP_COMPOSITE_CONSTRUCT = 80,
  OP_COMPOSITE_EXTRACT = 81,
  OP_CONVERT_F = 115,
  OP_FNEGATE = 127,
  OP_FADD = 129,
  OP_FMUL = 133,
  OP_MATRIX_TIMES_SCALAR = 143,
  OP_SELECT = 169,
  OP_PHI = 245,
  OP_UNDEF = 1,
  CAP_COOPMAT_NV = 5357,
  CAP_COOPMAT_KHR = 6022,
  CAP_BF16_TYPE = 5116,    /* SPV_KHR_bfloat16 */
  CAP_BF16_COOPMAT = 5118,
  FP_ENCODING_BF16 = 0,    /* OpTypeFloat's encoding operand: BFloat16KHR */
  OP_TYPE_COOPMAT_NV = 5358,
  OP_COOPMAT_LOAD_NV = 5359,
  OP_COOPMAT_STORE_NV = 5360,
  OP_COOPMAT_MULADD_NV = 5361,
  OP_COOPMAT_LENGTH_NV = 5362,
  OP_TYPE_COOPMAT_KHR = 4456,
  OP_COOPMAT_LOAD_KHR = 4457,
  OP_COOPMAT_STORE_KHR = 4458,
  OP_COOPMAT_MULADD_KHR = 4459,
  OP_COOPMAT_LENGTH_KHR = 4460,
  USE_A = 0,
  USE_B = 1,
  USE_ACC = 2,
  LAYOUT_ROW = 0,
  LAYOUT_COL = 1,
};

/* ---- setup at open ------------------------------------------------------- */

/* Rank of a fragment shape: 16x8x16 (A and B of distinct shapes, the
 * native mma shape of NVIDIA GPUs) first, then 16x16x16, then any other
 * whose sides are 8, 16 or 32; 0: unusable by this kernel. */
static int shape_rank(uint32_t m, uint32_t n, uint32_t k) {
  int ok = (m == 8 || m == 16 || m == 32) && (n == 8 || n == 16 || n == 32) &&
           (k == 8 || k == 16 || k == 32);
  if (!ok)
    return 0;
  if (m == 16 && n == 8 && k == 16)
    return 4;
  if (m == 16 && n == 16 && k == 16)
    return 3;
  return k >= 16 ? 2 : 1;
}

/* Keeps the fragment shape m x n x k in d->cm when it ranks above best
 * (shape_rank); returns the better rank. */
static int consider(struct dspk__dev *d, int best, uint32_t m, uint32_t n, uint32_t k) {
  int r = shape_rank(m, n, k);
  if (r <= best)
    return best;
  d->cm.lm = m;
  d->cm.ln = n;
  d->cm.lk = k;
  return r;
}

/* The device's VK_KHR_cooperative_matrix property list (calloc'd, *n
 * entries), or NULL. */
static VkCooperativeMatrixPropertiesKHR *khr_props(struct dspk__dev *d, uint32_t *n) {
  PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR get =
      (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)VK(GetInstanceProcAddr)(
          dspk__vk_instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
  *n = 0;
  if (!get || get(d->pd, n, NULL) != VK_SUCCESS || *n == 0)
    return NULL;
  VkCooperativeMatrixPropertiesKHR *p = calloc(*n, sizeof *p);
  if (!p)
    return NULL;
  for (uint32_t i = 0; i < *n; i++)
    p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
  if (get(d->pd, n, p) != VK_SUCCESS) {
    free(p);
    return NULL;
  }
  return p;
}

/* Whether entry p is (ab, ab, f32, f32) at subgroup scope. */
static int khr_fits(const VkCooperativeMatrixPropertiesKHR *p, VkComponentTypeKHR ab) {
  return p->AType == ab && p->BType == ab && p->CType == VK_COMPONENT_TYPE_FLOAT32_KHR &&
         p->ResultType == VK_COMPONENT_TYPE_FLOAT32_KHR && p->scope == VK_SCOPE_SUBGROUP_KHR &&
         !p->saturatingAccumulation;
}

/* Picks the best (f16, f16, f32, f32, subgroup) shape of the KHR list. */
static int pick_khr(struct dspk__dev *d) {
  uint32_t n;
  VkCooperativeMatrixPropertiesKHR *p = khr_props(d, &n);
  int best = 0;
  for (uint32_t i = 0; p && i < n; i++)
    if (khr_fits(&p[i], VK_COMPONENT_TYPE_FLOAT16_KHR))
      best = consider(d, best, p[i].MSize, p[i].NSize, p[i].KSize);
  free(p);
  return best > 0;
}

/* The KHR path's bf16 gemm: where the device offers VK_KHR_shader_bfloat16
 * with bf16 cooperative matrices of the f16 path's shape, enables them
 * (the extension and its feature) and sets cm->bf16. */
static void bf16_setup(struct dspk__dev *d, const char **exts, uint32_t *next, void **pnext) {
  struct dspk__vk_coopmat *cm = &d->cm;
  if (!dspk__vk_has_ext(d->pd, DSPK__VK_BF16_EXT)) {
    snprintf(cm->bf16_why, sizeof cm->bf16_why, "no %s", DSPK__VK_BF16_EXT);
    return;
  }
  struct dspk__vk_bf16_features f = {.sType = DSPK__VK_STYPE_BF16_FEATURES};
  VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                  .pNext = &f};
  VK(GetPhysicalDeviceFeatures2)(d->pd, &f2);
  if (!f.shaderBFloat16Type || !f.shaderBFloat16CooperativeMatrix) {
    snprintf(cm->bf16_why, sizeof cm->bf16_why,
             "shaderBFloat16Type %u, shaderBFloat16CooperativeMatrix %u",
             f.shaderBFloat16Type, f.shaderBFloat16CooperativeMatrix);
    return;
  }
  /* The best bf16 shape the kernel can use (shape_rank), which need not be
   * the f16 one: the H200's driver offers bf16 at 16x16x16 only. */
  uint32_t n;
  VkCooperativeMatrixPropertiesKHR *p = khr_props(d, &n);
  int best = 0;
  for (uint32_t i = 0; p && i < n; i++) {
    int r = khr_fits(&p[i], DSPK__VK_COMPONENT_BF16)
                ? shape_rank(p[i].MSize, p[i].NSize, p[i].KSize)
                : 0;
    if (r > best) {
      best = r;
      cm->blm = p[i].MSize;
      cm->bln = p[i].NSize;
      cm->blk = p[i].KSize;
    }
  }
  free(p);
  if (!best) {
    snprintf(cm->bf16_why, sizeof cm->bf16_why, "no bf16 x bf16 + f32 subgroup shape of "
                                                "8, 16 or 32");
    return;
  }
  cm->bf16 = 1;
  cm->bf16_why[0] = 0;
  exts[(*next)++] = DSPK__VK_BF16_EXT;
  cm->fbf16 = (struct dspk__vk_bf16_features){.sType = DSPK__VK_STYPE_BF16_FEATURES,
                                              .pNext = *pnext,
                                              .shaderBFloat16Type = VK_TRUE,
                                              .shaderBFloat16CooperativeMatrix = VK_TRUE};
  *pnext = &cm->fbf16;
}

/* The same over the NV list. */
static int pick_nv(struct dspk__dev *d) {
  PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV get =
      (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)VK(GetInstanceProcAddr)(
          dspk__vk_instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
  if (!get)
    return 0;
  uint32_t n = 0;
  if (get(d->pd, &n, NULL) != VK_SUCCESS || n == 0)
    return 0;
  VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
  if (!p)
    return 0;
  for (uint32_t i = 0; i < n; i++)
    p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
  int best = 0;
  if (get(d->pd, &n, p) == VK_SUCCESS)
    for (uint32_t i = 0; i < n; i++) {
      if (p[i].AType != VK_COMPONENT_TYPE_FLOAT16_NV ||
          p[i].BType != VK_COMPONENT_TYPE_FLOAT16_NV ||
          p[i].CType != VK_COMPONENT_TYPE_FLOAT32_NV ||
          p[i].DType != VK_COMPONENT_TYPE_FLOAT32_NV || p[i].scope != VK_SCOPE_SUBGROUP_NV)
        continue;
      best = consider(d, best, p[i].MSize, p[i].NSize, p[i].KSize);
    }
  free(p);
  return best > 0;
}

/* Whether the KHR (khr=1) or NV extension, its feature and a shape are
 * there, and the compute stage is among its supported stages. */
static int offered(struct dspk__dev *d, int khr) {
  if (!dspk__vk_has_ext(d->pd, khr ? VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME
                          : VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME))
    return 0;
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fk = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fn = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                  .pNext = khr ? (void *)&fk : (void *)&fn};
  VK(GetPhysicalDeviceFeatures2)(d->pd, &f2);
  if (!(khr ? fk.cooperativeMatrix : fn.cooperativeMatrix))
    return 0;
  VkPhysicalDeviceCooperativeMatrixPropertiesKHR pk = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR};
  VkPhysicalDeviceCooperativeMatrixPropertiesNV pn = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
  VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                    .pNext = khr ? (void *)&pk : (void *)&pn};
  VK(GetPhysicalDeviceProperties2)(d->pd, &p2);
  VkShaderStageFlags st = khr ? pk.cooperativeMatrixSupportedStages
                              : pn.cooperativeMatrixSupportedStages;
  if (!(st & VK_SHADER_STAGE_COMPUTE_BIT))
    return 0;
  return khr ? pick_khr(d) : pick_nv(d);
}

/* DSPK_VK_COOPMAT_TILE=wmxwnxwtmxwtnxbk[xnbuf]: one tile, for
 * measurements. */
static void tile_env(struct dspk__vk_coopmat *cm) {
  const char *e = DSPK_TEST_HOOK("DSPK_VK_COOPMAT_TILE");
  unsigned wm, wn, wtm, wtn, bk, nbuf = 1;
  if (!e || sscanf(e, "%ux%ux%ux%ux%ux%u", &wm, &wn, &wtm, &wtn, &bk, &nbuf) < 5 ||
      nbuf < 1 || nbuf > 2)
    return;
  if (wm < 1 || wm > 8 || wn < 1 || wn > 8 || wtm < cm->lm || wtm > 128 || wtm % cm->lm ||
      wtn < cm->ln || wtn > 128 || wtn % cm->ln || bk < 8 || bk > 128 || bk % cm->lk ||
      bk % 8)
    return;
  cm->wm = wm;
  cm->wn = wn;
  cm->wtm = wtm;
  cm->wtn = wtn;
  cm->bk = bk;
  cm->nbuf = nbuf;
}

void dspk__vk_coopmat_setup(struct dspk__dev *d, int base_ok, const char **exts,
                            uint32_t *next, void **pnext) {
  struct dspk__vk_coopmat *cm = &d->cm;
  memset(cm, 0, sizeof *cm);
  const char *env = DSPK_TEST_HOOK("DSPK_VK_COOPMAT");
  int want_khr = 1, want_nv = 1, emulate = 0;
  if (env && strcmp(env, "off") == 0) {
    snprintf(cm->why, sizeof cm->why, "off (DSPK_VK_COOPMAT=off)");
    return;
  }
  if (env && strcmp(env, "khr") == 0)
    want_nv = 0;
  else if (env && strcmp(env, "nv") == 0)
    want_khr = 0;
  else if (env && strcmp(env, "emulate") == 0)
    emulate = 1;
  VkPhysicalDeviceSubgroupProperties sp = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                    .pNext = &sp};
  VK(GetPhysicalDeviceProperties2)(d->pd, &p2);
  cm->sgsize = sp.subgroupSize;
  if (!base_ok) {
    snprintf(cm->why, sizeof cm->why,
             "not offered (needs shaderFloat16, storageBuffer16BitAccess, "
             "vulkanMemoryModel)");
    return;
  }
  if (!(sp.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
      !(sp.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) || sp.subgroupSize < 4 ||
      sp.subgroupSize > 128 || (sp.subgroupSize & (sp.subgroupSize - 1))) {
    snprintf(cm->why, sizeof cm->why,
             "not offered (needs basic subgroup operations in compute, subgroup size "
             "4..128; has %u)",
             sp.subgroupSize);
    return;
  }
  if (emulate) {
    cm->kind = DSPK__VK_CM_EMU;
    cm->lm = 16;
    cm->ln = 8;
    cm->lk = 16;
    tile_env(cm);
    return;
  }
  if (want_khr && offered(d, 1)) {
    cm->kind = DSPK__VK_CM_KHR;
    exts[(*next)++] = VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME;
    cm->fkhr.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR;
    cm->fkhr.cooperativeMatrix = VK_TRUE;
    cm->fkhr.pNext = *pnext;
    *pnext = &cm->fkhr;
    bf16_setup(d, exts, next, pnext);
    tile_env(cm);
    return;
  }
  if (want_nv && offered(d, 0)) {
    cm->kind = DSPK__VK_CM_NV;
    exts[(*next)++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    cm->fnv.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    cm->fnv.cooperativeMatrix = VK_TRUE;
    cm->fnv.pNext = *pnext;
    *pnext = &cm->fnv;
    tile_env(cm);
    return;
  }
  snprintf(cm->why, sizeof cm->why,
           "not offered (no %s with an f16 x f16 + f32 subgroup shape for compute)",
           want_khr && want_nv ? "VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix"
           : want_khr          ? "VK_KHR_cooperative_matrix (DSPK_VK_COOPMAT=khr)"
                               : "VK_NV_cooperative_matrix (DSPK_VK_COOPMAT=nv)");
}

int dspk__vk_coopmat_describe(struct dspk__dev *d, char *buf, size_t len) {
  static const char *names[] = {"scalar", "coopmat nv", "coopmat khr", "coopmat emulated"};
  const struct dspk__vk_coopmat *cm = &d->cm;
  if (cm->kind == DSPK__VK_CM_NONE)
    snprintf(buf, len, "scalar: cooperative matrices %s", cm->why);
  else
  {
    struct tilep t = tile_params(cm, shape_of(cm, 0), 0);
    char bfdesc[48];
    snprintf(bfdesc, sizeof bfdesc, " (bf16 %ux%ux%u)", cm->blm, cm->bln, cm->blk);
    snprintf(buf, len,
             "%s %ux%ux%u%s, tile %ux%ux%u (%ux%u subgroups of %u, %u shared buffer%s)%s%s%s%s",
             names[cm->kind], cm->lm, cm->ln, cm->lk, cm->bf16 ? bfdesc : "",
             t.wm * t.fm * cm->lm,
             t.wn * t.fn * cm->ln, t.bk, t.wm, t.wn, cm->sgsize, t.nbuf, t.nbuf > 1 ? "s" : "",
             cm->wm ? " forced" : ", tuned for large gemms",
             cm->kind == DSPK__VK_CM_KHR && !cm->bf16 ? "; bf16 on the scalar kernel (" : "",
             cm->kind == DSPK__VK_CM_KHR && !cm->bf16 ? cm->bf16_why : "",
             cm->kind == DSPK__VK_CM_KHR && !cm->bf16 ? ")" : "");
  }
  return (int)cm->kind;
}

/* ---- the kernel ------------------------------------------------------------ */

/* The kernel body; the #defines before it set the shape and variant. */
static const char body[] =
    "#define BM (WM * FM * LM)\n"
    "#define BN (WN * FN * LN)\n"
    "#define NT (WM * WN * SGS)\n"
    "#define ASTR (BK + 8)\n"
    "#define BSTR (BN + 8)\n"
    "layout(local_size_x = NT) in;\n"
    "layout(constant_id = 0) const uint KB = LK;\n"
    "#if AVEC\n"
    "layout(std430, binding = 0) readonly buffer BA { uvec4 a[]; };\n"
    "#define NLA (BM * BK / 8 / NT)\n"
    "uvec4 ra[NLA];\n"
    "#else\n"
    "layout(std430, binding = 0) readonly buffer BA { float16_t a[]; };\n"
    "#define NLA (BM * BK / NT)\n"
    "float16_t ra[NLA];\n"
    "#endif\n"
    "#if BVEC\n"
    "layout(std430, binding = 1) readonly buffer BB { uvec4 b[]; };\n"
    "#define NLB (BK * BN / 8 / NT)\n"
    "uvec4 rb[NLB];\n"
    "#else\n"
    "layout(std430, binding = 1) readonly buffer BB { float16_t b[]; };\n"
    "#define NLB (BK * BN / NT)\n"
    "float16_t rb[NLB];\n"
    "#endif\n"
    "layout(std430, binding = 2) readonly buffer BC { float c[]; };\n"
    "layout(std430, binding = 3) writeonly buffer BO { float o[]; };\n"
    "layout(push_constant) uniform PC {\n"
    "  uint M, N, K, oa, ob, oc, oo, sam, sak, sbk, sbn, scm, scn, bsa, bsb, bsc, bso;\n"
    "  float alpha, beta; } pc;\n"
    "#if AVEC\n"
    "shared uvec4 As4[NBUF * BM * ASTR / 8];\n"
    "#define SH_A As4\n#define SH_AU 8u\n"
    "float getA(uint i) { return float(unpackFloat2x16(As4[i >> 3u][(i >> 1u) & 3u])[i & 1u]); }\n"
    "#else\n"
    "shared float16_t As[NBUF * BM * ASTR];\n"
    "#define SH_A As\n#define SH_AU 1u\n"
    "float getA(uint i) { return float(As[i]); }\n"
    "#endif\n"
    "#if BVEC\n"
    "shared uvec4 Bs4[NBUF * BK * BSTR / 8];\n"
    "#define SH_B Bs4\n#define SH_BU 8u\n"
    "float getB(uint i) { return float(unpackFloat2x16(Bs4[i >> 3u][(i >> 1u) & 3u])[i & 1u]); }\n"
    "#else\n"
    "shared float16_t Bs[NBUF * BK * BSTR];\n"
    "#define SH_B Bs\n#define SH_BU 1u\n"
    "float getB(uint i) { return float(Bs[i]); }\n"
    "#endif\n"
    "shared float Cs[WM * WN * LM * LN];\n"
    "#if EMU\n"
    /* Fragments stand for places: A and B ones for (offset, stride) in
     * As/Bs, accumulators for this subgroup's slots of Acc, each element
     * always handled by the same lane. */
    "#define UNROLL\n"
    "shared float Acc[WM * WN * FM * FN * LM * LN];\n"
    "#define FA uvec2\n"
    "#define FB uvec2\n"
    "#define FC uint\n"
    "uint cmZero(uint i, uint j) {\n"
    "  uint h = (gl_SubgroupID * (FM * FN) + i * FN + j) * (LM * LN);\n"
    "  for (uint e = gl_SubgroupInvocationID; e < LM * LN; e += SGS) Acc[h + e] = 0.0;\n"
    "  return h; }\n"
    "uint cmMulAdd(uvec2 x, uvec2 y, uint h) {\n"
    "  for (uint e = gl_SubgroupInvocationID; e < LM * LN; e += SGS) {\n"
    "    uint r = e / LN, q = e % LN;\n"
    "    float s = Acc[h + e];\n"
    "    for (uint t = 0u; t < LK; t++)\n"
    "      s = fma(getA(x.x + r * x.y + t), getB(y.x + t * y.y + q), s);\n"
    "    Acc[h + e] = s; }\n"
    "  return h; }\n"
    "void cmStore(uint h, uint off, uint str) {\n"
    "  for (uint e = gl_SubgroupInvocationID; e < LM * LN; e += SGS)\n"
    "    Cs[off + (e / LN) * str + e % LN] = Acc[h + e]; }\n"
    "#define CM_ZERO(i, j) cmZero(i, j)\n"
    "#define CM_LOADA(m, off, str) m = uvec2(off, str)\n"
    "#define CM_LOADB(m, off, str) m = uvec2(off, str)\n"
    "#define CM_MULADD(x, y, z) cmMulAdd(x, y, z)\n"
    "#define CM_STORE(m, off, str) cmStore(m, off, str)\n"
    "#else\n"
    "#define UNROLL [[unroll]]\n"
    "#define FA fcoopmatNV<16, gl_ScopeSubgroup, LM, LK>\n"
    "#define FB fcoopmatNV<16, gl_ScopeSubgroup, KB, LN>\n"
    "#define FC fcoopmatNV<32, gl_ScopeSubgroup, LM, LN>\n"
    "#define CM_ZERO(i, j) FC(0.0)\n"
    /* Offsets and strides in units of the shared arrays' elements. */
    "#define CM_LOADA(m, off, str) coopMatLoadNV(m, SH_A, (off) / SH_AU, (str) / SH_AU, false)\n"
    "#define CM_LOADB(m, off, str) coopMatLoadNV(m, SH_B, (off) / SH_BU, (str) / SH_BU, false)\n"
    "#define CM_MULADD(x, y, z) coopMatMulAddNV(x, y, z)\n"
    "#define CM_STORE(m, off, str) coopMatStoreNV(m, Cs, off, str, false)\n"
    "#endif\n"
    /* Global -> registers: the slice of A rows m0.., columns k0.. */
    "void loadA(uint base, uint m0, uint k0) {\n"
    "  UNROLL for (uint i = 0u; i < NLA; i++) {\n"
    "    uint e = gl_LocalInvocationIndex + i * NT;\n"
    "#if AVEC\n"
    "    uint row = e / (BK / 8), kk = (e % (BK / 8)) * 8u;\n"
    "#elif AKC\n"
    "    uint row = e / BK, kk = e % BK;\n"
    "#else\n"
    "    uint row = e % BM, kk = e / BM;\n"
    "#endif\n"
    "    uint gm = m0 + row, gk = k0 + kk;\n"
    "#if AVEC\n"
    "    ra[i] = uvec4(0u);\n"
    "    if (gm < pc.M && gk < pc.K) ra[i] = a[(base + gm * pc.sam + gk) >> 3];\n"
    "#else\n"
    "    ra[i] = float16_t(0.0);\n"
    "    if (gm < pc.M && gk < pc.K) ra[i] = a[base + gm * pc.sam + gk * pc.sak];\n"
    "#endif\n"
    "  }\n"
    "}\n"
    "void loadB(uint base, uint n0, uint k0) {\n"
    "  UNROLL for (uint i = 0u; i < NLB; i++) {\n"
    "    uint e = gl_LocalInvocationIndex + i * NT;\n"
    "#if BVEC\n"
    "    uint kk = e / (BN / 8), col = (e % (BN / 8)) * 8u;\n"
    "#elif BNC\n"
    "    uint kk = e / BN, col = e % BN;\n"
    "#else\n"
    "    uint kk = e % BK, col = e / BK;\n"
    "#endif\n"
    "    uint gn = n0 + col, gk = k0 + kk;\n"
    "#if BVEC\n"
    "    rb[i] = uvec4(0u);\n"
    "    if (gn < pc.N && gk < pc.K) rb[i] = b[(base + gk * pc.sbk + gn) >> 3];\n"
    "#else\n"
    "    rb[i] = float16_t(0.0);\n"
    "    if (gn < pc.N && gk < pc.K) rb[i] = b[base + gk * pc.sbk + gn * pc.sbn];\n"
    "#endif\n"
    "  }\n"
    "}\n"
    /* Registers -> shared buffer buf: As[m][k], Bs[k][n], rows padded. */
    "void storeAB(uint buf) {\n"
    "  uint ao = buf * (BM * ASTR), bo = buf * (BK * BSTR);\n"
    "  UNROLL for (uint i = 0u; i < NLA; i++) {\n"
    "    uint e = gl_LocalInvocationIndex + i * NT;\n"
    "#if AVEC\n"
    "    As4[(ao + (e / (BK / 8)) * ASTR) / 8u + e % (BK / 8)] = ra[i];\n"
    "#elif AKC\n"
    "    As[ao + (e / BK) * ASTR + e % BK] = ra[i];\n"
    "#else\n"
    "    As[ao + (e % BM) * ASTR + e / BM] = ra[i];\n"
    "#endif\n"
    "  }\n"
    "  UNROLL for (uint i = 0u; i < NLB; i++) {\n"
    "    uint e = gl_LocalInvocationIndex + i * NT;\n"
    "#if BVEC\n"
    "    Bs4[(bo + (e / (BN / 8)) * BSTR) / 8u + e % (BN / 8)] = rb[i];\n"
    "#elif BNC\n"
    "    Bs[bo + (e / BN) * BSTR + e % BN] = rb[i];\n"
    "#else\n"
    "    Bs[bo + (e % BK) * BSTR + e / BK] = rb[i];\n"
    "#endif\n"
    "  }\n"
    "}\n"
    /* The epilogue of one fragment, from this subgroup's scratch at cb: the
     * rows gm0.. and columns gn0.. of C. */
    "void epilogue(uint cb, uint gm0, uint gn0, uint bz) {\n"
    "  for (uint e = gl_SubgroupInvocationID; e < LM * LN; e += SGS) {\n"
    "    uint gm = gm0 + e / LN, gn = gn0 + e % LN;\n"
    "    if (gm < pc.M && gn < pc.N) {\n"
    "      float v = pc.alpha * Cs[cb + e];\n"
    "#if HASC\n"
    "      v += pc.beta * c[pc.oc + bz * pc.bsc + gm * pc.scm + gn * pc.scn];\n"
    "#endif\n"
    "      o[pc.oo + bz * pc.bso + gm * pc.N + gn] = v;\n"
    "    }\n"
    "  }\n"
    "}\n";

/* Appends main(): each subgroup's fm x fn accumulators and its A and B
 * fragments are named variables (c<i>_<j>, a<i>, b<j>), every loop over
 * them written out.  Arrays of cooperative matrices, even indexed only in
 * unrolled loops, went to local memory on NVIDIA's driver: the same kernel
 * ran at 35 TFLOP/s with arrays and 113 with names on the H200, and its
 * multiply-adds alone at 37 against 454 (docs/performance.md). */
static void emit_main(struct dspk__vk_sbuf *t, uint32_t fm, uint32_t fn) {
  dspk__vk_ap(t, "void main() {\n"
         "  uint sg = gl_SubgroupID;\n"
         "  uint wm = sg / WN, wn = sg %% WN;\n"
         "  uint bz = gl_WorkGroupID.z;\n"
         "  uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;\n"
         "  uint abase = pc.oa + bz * pc.bsa, bbase = pc.ob + bz * pc.bsb;\n");
  for (uint32_t i = 0; i < fm; i++)
    for (uint32_t j = 0; j < fn; j++)
      dspk__vk_ap(t, "  FC c%u_%u = CM_ZERO(%uu, %uu);\n", i, j, i, j);
  for (uint32_t i = 0; i < fm; i++)
    dspk__vk_ap(t, "  FA a%u;\n", i);
  for (uint32_t j = 0; j < fn; j++)
    dspk__vk_ap(t, "  FB b%u;\n", j);
  /* One shared buffer: barrier, store, barrier, fetch the next slice,
   * multiply.  Two: the next slice is stored into the other buffer while
   * this one is multiplied, one barrier per slice. */
  dspk__vk_ap(t, "  loadA(abase, m0, 0u);\n"
         "  loadB(bbase, n0, 0u);\n"
         "#if NBUF == 2\n"
         "  storeAB(0u);\n"
         "  barrier();\n"
         "#endif\n"
         "  uint cur = 0u;\n"
         "  for (uint k0 = 0u; k0 < pc.K; k0 += BK) {\n"
         "    bool more = k0 + BK < pc.K;\n"
         "#if NBUF == 1\n"
         "    barrier();\n"
         "    storeAB(0u);\n"
         "    barrier();\n"
         "#endif\n"
         "    if (more) {\n"
         "      loadA(abase, m0, k0 + BK);\n"
         "      loadB(bbase, n0, k0 + BK);\n"
         "    }\n"
         "    uint ao = cur * (BM * ASTR) + wm * (FM * LM) * ASTR;\n"
         "    uint bo = cur * (BK * BSTR) + wn * (FN * LN);\n"
         "    UNROLL for (uint kk = 0u; kk < BK; kk += LK) {\n");
  for (uint32_t i = 0; i < fm; i++)
    dspk__vk_ap(t, "      CM_LOADA(a%u, ao + %uu * LM * ASTR + kk, ASTR);\n", i, i);
  for (uint32_t j = 0; j < fn; j++)
    dspk__vk_ap(t, "      CM_LOADB(b%u, bo + kk * BSTR + %uu * LN, BSTR);\n", j, j);
  for (uint32_t j = 0; j < fn; j++)
    for (uint32_t i = 0; i < fm; i++)
      dspk__vk_ap(t, "      c%u_%u = CM_MULADD(a%u, b%u, c%u_%u);\n", i, j, i, j, i, j);
  dspk__vk_ap(t, "    }\n"
         "#if NBUF == 2\n"
         "    if (more) storeAB(cur ^ 1u);\n"
         "    barrier();\n"
         "    cur ^= 1u;\n"
         "#endif\n"
         "  }\n"
         /* Out through this subgroup's scratch, one fragment at a time. */
         "  uint cb = sg * (LM * LN);\n"
         "  uint gm0 = m0 + wm * (FM * LM), gn0 = n0 + wn * (FN * LN);\n");
  for (uint32_t i = 0; i < fm; i++)
    for (uint32_t j = 0; j < fn; j++)
      dspk__vk_ap(t, "  CM_STORE(c%u_%u, cb, LN); subgroupBarrier();"
             " epilogue(cb, gm0 + %uu * LM, gn0 + %uu * LN, bz); subgroupBarrier();\n",
          i, j, i, j);
  dspk__vk_ap(t, "}\n");
}

/* Test hook DSPK_VK_COOPMAT_BODY=FILE (proto/testhook.h): the kernel body
 * read from FILE instead of `body` (same #defines before it; main() is
 * still generated unless the file has its own), so that a benchmark can
 * time kernel variants without a rebuild.  Not in a production build. */
#ifdef DSPK_TEST_HOOKS
static const char *body_override;
static void load_body_override(void) {
  const char *f = DSPK_TEST_HOOK("DSPK_VK_COOPMAT_BODY");
  FILE *fp = f ? fopen(f, "r") : NULL;
  if (!fp)
    return;
  static char text[24576];
  size_t n = fread(text, 1, sizeof text - 1, fp);
  fclose(fp);
  text[n] = 0;
  body_override = text;
}
#else
#define body_override ((const char *)NULL)
static void load_body_override(void) {}
#endif

int dspk__vk_coopmat_source(char *buf, size_t len, const struct dspk__vk_coopmat *cm,
                            int tile, unsigned flags) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, load_body_override);
  int emu = cm->kind == DSPK__VK_CM_EMU;
  struct cmshape sh = shape_of(cm, flags);
  struct tilep t = tile_params(cm, sh, tile);
  if (t.wm == 0)
    return snprintf(buf, len, "#error no tile %d\n", tile);
  struct dspk__vk_sbuf out = {buf, len, 0, 0};
  const char *b = body_override ? body_override : body;
  dspk__vk_ap(&out,
                  "#version 450\n"
                  "#pragma use_vulkan_memory_model\n"
                  "%s"
                  "#extension GL_KHR_memory_scope_semantics : require\n"
                  "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
                  "#extension GL_EXT_shader_16bit_storage : require\n"
                  "#extension GL_KHR_shader_subgroup_basic : require\n"
                  "#extension GL_EXT_control_flow_attributes : require\n"
                  "#define EMU %d\n#define LM %uu\n#define LN %uu\n#define LK %uu\n"
                  "#define FM %uu\n#define FN %uu\n#define WM %uu\n#define WN %uu\n"
                  "#define BK %uu\n#define SGS %uu\n#define NBUF %u\n"
                  "#define AVEC %d\n#define BVEC %d\n#define AKC %d\n#define BNC %d\n"
                  "#define HASC %d\n"
                  "%s",
                  emu ? "" : "#extension GL_NV_cooperative_matrix : require\n", emu,
                  sh.lm, sh.ln, sh.lk, t.fm, t.fn, t.wm, t.wn, t.bk, cm->sgsize, t.nbuf,
                  !!(flags & DSPK__VK_CM_F_AVEC), !!(flags & DSPK__VK_CM_F_BVEC),
                  !!(flags & DSPK__VK_CM_F_AKC), !!(flags & DSPK__VK_CM_F_BNC),
                  !!(flags & DSPK__VK_CM_F_HASC), b);
  if (!strstr(b, "void main("))
    emit_main(&out, t.fm, t.fn);
  return out.over || out.at > INT_MAX ? (int)(len > INT_MAX ? INT_MAX : len) : (int)out.at;
}

/* ---- SPIR-V: SPV_NV_cooperative_matrix -> SPV_KHR_cooperative_matrix ------ */

/* Words of a literal string operand (with its NUL, padded to a word). */
static size_t str_words(const char *s) { return strlen(s) / 4 + 1; }

/* Type id of the result of each instruction (0: none). */
static int result_types(const uint32_t *w, size_t n, uint32_t bound, uint32_t **out) {
  uint32_t *ty = calloc(bound, sizeof *ty);
  if (!ty)
    return DSPK_ENOMEM;
  for (size_t i = 5; i < n;) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    /* These carry a result type and a result id in words 1 and 2: the
     * instructions that can produce a cooperative matrix (or a pointer). */
    if (wc >= 3 &&
        (op == OP_COOPMAT_LOAD_NV || op == OP_COOPMAT_MULADD_NV || op == OP_LOAD ||
         op == OP_PHI || op == OP_COMPOSITE_CONSTRUCT || op == OP_CONSTANT_COMPOSITE ||
         op == OP_COMPOSITE_EXTRACT || op == OP_FNEGATE || op == OP_FADD || op == OP_FMUL ||
         op == OP_MATRIX_TIMES_SCALAR || op == OP_CONVERT_F || op == OP_SELECT ||
         op == OP_UNDEF || op == OP_VARIABLE))
      if (w[i + 2] < bound)
        ty[w[i + 2]] = w[i + 1];
    i += wc;
  }
  *out = ty;
  return 0;
}

int dspk__vk_coopmat_nv_to_khr(const uint32_t *w, size_t n, uint32_t **out, size_t *nout) {
  static const char nv_ext[] = "SPV_NV_cooperative_matrix";
  static const char khr_ext[] = "SPV_KHR_cooperative_matrix";
  if (!w || n < 5 || w[0] != SPV_MAGIC || w[3] == 0 || w[3] > (1u << 22))
    return DSPK_EINVAL;
  uint32_t bound = w[3];
  /* Pass 1: the walk is well formed; find the 32-bit int type, the bool
   * constants, the cooperative matrix types and what each is used as. */
  uint32_t int32 = 0, first_cm = 0;
  size_t int_at = 0, cm_at = 0;
  int ntypes = 0;
  for (size_t i = 5; i < n;) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    if (wc == 0 || i + wc > n)
      return DSPK_EINVAL;
    if (op == OP_TYPE_INT && wc == 4 && w[i + 2] == 32 && !int32) {
      int32 = w[i + 1];
      int_at = i;
    }
    if (op == OP_TYPE_COOPMAT_NV) {
      if (wc != 6 || w[i + 1] >= bound)
        return DSPK_EINVAL;
      if (!first_cm) {
        first_cm = w[i + 1];
        cm_at = i;
      }
      ntypes++;
    }
    if ((op == OP_COOPMAT_LOAD_NV && wc < 6) || (op == OP_COOPMAT_STORE_NV && wc < 5) ||
        (op == OP_COOPMAT_MULADD_NV && wc != 6) || (op == OP_COOPMAT_LENGTH_NV && wc != 4))
      return DSPK_EINVAL;
    i += wc;
  }
  if (!first_cm)
    return DSPK_EINVAL; /* nothing to rewrite: not an NV module */
  if (!int32 || int_at > cm_at)
    return DSPK_ENOTSUP;
  uint32_t *ty = NULL;
  uint8_t *use = NULL, *bval = NULL;
  uint32_t *o = NULL;
  int r = result_types(w, n, bound, &ty);
  if (r)
    return r;
  r = DSPK_ENOMEM;
  use = calloc(bound, 1);  /* per type id: 1 + Use, 0 unknown */
  bval = calloc(bound, 1); /* per id: 1 false, 2 true constant */
  if (!use || !bval)
    goto out;
  for (size_t i = 5; i < n; i += w[i] >> 16) {
    uint32_t op = w[i] & 0xffff;
    if ((op == OP_CONSTANT_TRUE || op == OP_CONSTANT_FALSE) && (w[i] >> 16) == 3 &&
        w[i + 2] < bound)
      bval[w[i + 2]] = op == OP_CONSTANT_TRUE ? 2 : 1;
    if (op != OP_COOPMAT_MULADD_NV)
      continue;
    /* words: op, result type, result, A, B, C */
    uint32_t t[4] = {w[i + 1], 0, 0, 0}, u[4] = {USE_ACC, USE_A, USE_B, USE_ACC};
    for (int k = 1; k < 4; k++)
      t[k] = w[i + 2 + k] < bound ? ty[w[i + 2 + k]] : 0;
    for (int k = 0; k < 4; k++) {
      if (t[k] == 0 || t[k] >= bound) {
        r = DSPK_ENOTSUP; /* an operand whose type we did not track */
        goto out;
      }
      if (use[t[k]] && use[t[k]] != u[k] + 1) {
        r = DSPK_ENOTSUP; /* one type used as two of A, B, C */
        goto out;
      }
      use[t[k]] = (uint8_t)(u[k] + 1);
    }
  }
  /* Pass 2: write.  Three new constants (0, 1, 2 of the int type) come
   * just before the first matrix type; the KHR type is one word longer,
   * the extension string may be longer. */
  size_t extra = 3 * 4 + (size_t)ntypes + str_words(khr_ext) + 2;
  o = malloc((n + extra) * sizeof *o);
  if (!o)
    goto out;
  uint32_t c[3] = {bound, bound + 1, bound + 2};
  memcpy(o, w, 5 * sizeof *o);
  o[3] = bound + 3;
  size_t j = 5;
  for (size_t i = 5; i < n;) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    if (i == cm_at)
      for (uint32_t v = 0; v < 3; v++) {
        o[j++] = (4u << 16) | OP_CONSTANT;
        o[j++] = int32;
        o[j++] = c[v];
        o[j++] = v;
      }
    switch (op) {
    case OP_CAPABILITY:
      o[j++] = w[i];
      o[j++] = w[i + 1] == CAP_COOPMAT_NV ? CAP_COOPMAT_KHR : w[i + 1];
      break;
    case OP_EXTENSION:
      if (wc - 1 == str_words(nv_ext) && strncmp((const char *)&w[i + 1], nv_ext, sizeof nv_ext) == 0) {
        size_t sw = str_words(khr_ext);
        o[j++] = ((uint32_t)(sw + 1) << 16) | OP_EXTENSION;
        memset(&o[j], 0, sw * 4);
        memcpy(&o[j], khr_ext, sizeof khr_ext - 1);
        j += sw;
      } else {
        memcpy(&o[j], &w[i], wc * 4);
        j += wc;
      }
      break;
    case OP_TYPE_COOPMAT_NV: {
      uint32_t id = w[i + 1];
      uint32_t u = use[id] ? use[id] - 1u : (uint32_t)USE_ACC;
      o[j++] = (7u << 16) | OP_TYPE_COOPMAT_KHR;
      memcpy(&o[j], &w[i + 1], 5 * 4); /* result, component, scope, rows, cols */
      j += 5;
      o[j++] = c[u];
      break;
    }
    case OP_COOPMAT_LOAD_NV:
    case OP_COOPMAT_STORE_NV: {
      /* NV: [rt, res,] ptr, stride, colmajor, memops...
       * KHR: [rt, res,] ptr, layout, stride, memops... */
      size_t p = op == OP_COOPMAT_LOAD_NV ? 4 : 3; /* index of Stride */
      uint32_t cmaj = w[i + p + 1];
      if (cmaj >= bound || !bval[cmaj]) {
        r = DSPK_ENOTSUP; /* ColumnMajor not a constant */
        goto out;
      }
      memcpy(&o[j], &w[i], wc * 4);
      o[j] = (wc << 16) | (op == OP_COOPMAT_LOAD_NV ? OP_COOPMAT_LOAD_KHR : OP_COOPMAT_STORE_KHR);
      o[j + p] = c[bval[cmaj] == 2 ? LAYOUT_COL : LAYOUT_ROW];
      o[j + p + 1] = w[i + p];
      j += wc;
      break;
    }
    case OP_COOPMAT_MULADD_NV:
    case OP_COOPMAT_LENGTH_NV:
      memcpy(&o[j], &w[i], wc * 4);
      o[j] = (wc << 16) |
             (op == OP_COOPMAT_MULADD_NV ? OP_COOPMAT_MULADD_KHR : OP_COOPMAT_LENGTH_KHR);
      j += wc;
      break;
    default:
      memcpy(&o[j], &w[i], wc * 4);
      j += wc;
      break;
    }
    i += wc;
  }
  *out = o;
  *nout = j;
  o = NULL;
  r = 0;
out:
  free(o);
  free(ty);
  free(use);
  free(bval);
  return r;
}

/* ---- SPIR-V: 16-bit floats -> bfloat16 (SPV_KHR_bfloat16) ----------------- */

int dspk__vk_coopmat_bf16(const uint32_t *w, size_t n, uint32_t **out, size_t *nout) {
  static const char ext[] = "SPV_KHR_bfloat16";
  static const uint32_t caps[] = {CAP_BF16_TYPE, CAP_BF16_COOPMAT};
  if (!w || n < 5 || w[0] != SPV_MAGIC)
    return DSPK_EINVAL;
  /* The module's layout: capabilities, then extensions, then the rest. */
  size_t cap_end = 0, ext_end = 0, nhalf = 0;
  for (size_t i = 5; i < n;) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    if (wc == 0 || i + wc > n)
      return DSPK_EINVAL;
    if (op != OP_CAPABILITY && !cap_end)
      cap_end = i;
    if (op != OP_CAPABILITY && op != OP_EXTENSION && !ext_end)
      ext_end = i;
    nhalf += op == OP_TYPE_FLOAT && wc == 3 && w[i + 2] == 16;
    i += wc;
  }
  if (!nhalf || !cap_end || !ext_end)
    return DSPK_EINVAL;
  size_t sw = str_words(ext);
  uint32_t *o = malloc((n + 2 * 2 + 1 + sw + nhalf) * sizeof *o);
  if (!o)
    return DSPK_ENOMEM;
  memcpy(o, w, 5 * sizeof *o);
  size_t j = 5;
  for (size_t i = 5; i < n;) {
    uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
    if (i == cap_end)
      for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        o[j++] = (2u << 16) | OP_CAPABILITY;
        o[j++] = caps[c];
      }
    if (i == ext_end) {
      o[j++] = ((uint32_t)(sw + 1) << 16) | OP_EXTENSION;
      memset(&o[j], 0, sw * 4);
      memcpy(&o[j], ext, sizeof ext - 1);
      j += sw;
    }
    if (op == OP_TYPE_FLOAT && wc == 3 && w[i + 2] == 16) {
      o[j++] = (4u << 16) | OP_TYPE_FLOAT; /* result, width 16, encoding */
      o[j++] = w[i + 1];
      o[j++] = 16;
      o[j++] = FP_ENCODING_BF16;
    } else {
      memcpy(&o[j], &w[i], wc * 4);
      j += wc;
    }
    i += wc;
  }
  *out = o;
  *nout = j;
  return 0;
}

/* ---- gemm ------------------------------------------------------------------- */

/* One gemm as the kernel sees it. */
struct cmplan {
  struct dspk__vk_bind bind[4]; /* A, B, C (or O again), O */
  struct {
    uint32_t M, N, K, oa, ob, oc, oo, sam, sak, sbk, sbn, scm, scn, bsa, bsb, bsc, bso;
    float alpha, beta;
  } pc;
  uint32_t nbatch, bm, bn;
  unsigned flags;
};
#define PC_SIZE 76u

/* 0: X's batch axes (right-aligned against the output's nbd) are all 1;
 * 1: all equal to the output's; -1: a mix (not expressible by a stride). */
static int batch_kind(const int64_t *xs, int rx, int keep, const int64_t *os, int nbd) {
  int whole = 1, none = 1;
  for (int i = 0; i < nbd; i++) {
    int ix = i - (nbd - (rx - keep));
    int64_t dx = ix >= 0 ? xs[ix] : 1;
    if (dx != os[i])
      whole = 0;
    if (dx != 1)
      none = 0;
  }
  return none ? 0 : whole ? 1 : -1;
}

/* The workgroup tile `tile` of cm for kernel variant `flags` (rows bm,
 * columns bn); 0 when its shared memory or thread split does not fit the
 * device, or the tile does not divide into the variant's fragments. */
static int tile_of(const struct dspk__dev *d, unsigned flags, int tile, uint32_t *bm,
                   uint32_t *bn) {
  const struct dspk__vk_coopmat *cm = &d->cm;
  struct cmshape sh = shape_of(cm, flags);
  struct tilep t = tile_params(cm, sh, tile);
  if (t.wm == 0)
    return 0;
  *bm = t.wm * t.fm * sh.lm;
  *bn = t.wn * t.fn * sh.ln;
  uint32_t nt = t.wm * t.wn * cm->sgsize, bk = t.bk;
  uint32_t shared =
      t.nbuf * (*bm * (bk + 8) * 2 + bk * (*bn + 8) * 2) + t.wm * t.wn * sh.lm * sh.ln * 4;
  if (cm->kind == DSPK__VK_CM_EMU) /* the accumulators */
    shared += t.wm * t.wn * t.fm * t.fn * sh.lm * sh.ln * 4;
  if (shared > d->props.limits.maxComputeSharedMemorySize ||
      nt > d->props.limits.maxComputeWorkGroupSize[0] ||
      nt > d->props.limits.maxComputeWorkGroupInvocations)
    return 0;
  if ((*bm * bk / 8) % nt || (bk * *bn / 8) % nt || *bm * bk / 8 < nt || bk * *bn / 8 < nt)
    return 0;
  /* A forced tile of whole 16x8 fragments may not be whole 16x16 ones. */
  if (cm->wm && (cm->wtm % sh.lm || cm->wtn % sh.ln))
    return 0;
  return bk % sh.lk == 0;
}

/* Fills p from op, except the bindings and the flags that depend on them.
 * Returns 1 when the path takes op, 0 when it does not. */
static int plan(struct dspk__dev *d, const struct dspk__op *op, struct cmplan *p) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1], *O = &op->out[0];
  const struct dspk__tensor *C = op->nin == 3 ? &op->in[2] : NULL;
  int bf16 = d->cm.bf16 && A->dtype == DSPK_BF16 && B->dtype == DSPK_BF16;
  if (d->cm.kind == DSPK__VK_CM_NONE ||
      !(bf16 || (A->dtype == DSPK_F16 && B->dtype == DSPK_F16)) || O->dtype != DSPK_F32 ||
      (C && C->dtype != DSPK_F32) ||
      !tile_of(d, bf16 ? DSPK__VK_CM_F_BF16 : 0, 0, &p->bm, &p->bn))
    return 0;
  if (dspk__tensor_numel(A) > UINT32_MAX / 2 || dspk__tensor_numel(B) > UINT32_MAX / 2 ||
      dspk__tensor_numel(O) > UINT32_MAX / 2 || (C && dspk__tensor_numel(C) > UINT32_MAX / 2))
    return 0;
  int ta = op->u.gemm.trans_a != 0, tb = op->u.gemm.trans_b != 0;
  int ra = A->rank, rb = B->rank, ro = O->rank, nbd = ro - 2;
  int64_t M = O->shape[ro - 2], N = O->shape[ro - 1];
  int64_t K = ta ? A->shape[ra - 2] : A->shape[ra - 1];
  int ka = batch_kind(A->shape, ra, 2, O->shape, nbd);
  int kb = batch_kind(B->shape, rb, 2, O->shape, nbd);
  int crank = C ? C->rank : 0, ckeep = crank < 2 ? crank : 2;
  int kc = C ? batch_kind(C->shape, crank, ckeep, O->shape, nbd) : 0;
  if (ka < 0 || kb < 0 || kc < 0)
    return 0;
  memset(&p->pc, 0, sizeof p->pc);
  int64_t nbatch = 1;
  for (int i = 0; i < nbd; i++)
    nbatch *= O->shape[i];
  p->nbatch = (uint32_t)nbatch;
  p->pc.M = (uint32_t)M;
  p->pc.N = (uint32_t)N;
  p->pc.K = (uint32_t)K;
  int64_t lda = A->shape[ra - 1], ldb = B->shape[rb - 1];
  p->pc.sam = ta ? 1 : (uint32_t)lda;
  p->pc.sak = ta ? (uint32_t)lda : 1;
  p->pc.sbk = tb ? 1 : (uint32_t)ldb;
  p->pc.sbn = tb ? (uint32_t)ldb : 1;
  p->pc.bsa = ka ? (uint32_t)(M * K) : 0;
  p->pc.bsb = kb ? (uint32_t)(K * N) : 0;
  p->pc.bso = (uint32_t)(M * N);
  if (C) {
    int64_t cn = crank >= 1 ? C->shape[crank - 1] : 1;
    int64_t cm_ = crank >= 2 ? C->shape[crank - 2] : 1;
    p->pc.scn = cn == 1 ? 0 : 1;
    p->pc.scm = cm_ == 1 ? 0 : (uint32_t)cn;
    p->pc.bsc = kc ? (uint32_t)(cn * cm_) : 0;
  }
  double alpha, beta; /* f32-rounded: beta 0 reads no C (1e-50 too) */
  dspk__op_gemm_scalars(op, &alpha, &beta);
  p->pc.alpha = (float)alpha;
  p->pc.beta = (float)beta;
  p->flags = bf16 ? DSPK__VK_CM_F_BF16 : 0;
  if (C && beta != 0)
    p->flags |= DSPK__VK_CM_F_HASC;
  if (!ta)
    p->flags |= DSPK__VK_CM_F_AKC;
  if (!tb)
    p->flags |= DSPK__VK_CM_F_BNC;
  return 1;
}

int dspk__vk_coopmat_usable(struct dspk__dev *d, const struct dspk__op *op) {
  struct cmplan p;
  return plan(d, op, &p) == 1;
}

/* Test hooks: make the next kernel builds fail as a driver rejecting them
 * would; tune smaller gemms.  Not in a production build. */
#ifdef DSPK_TEST_HOOKS
static _Atomic int fault;
static _Atomic uint64_t tune_min = TUNE_MIN;
void dspk__vk_coopmat_fault(int on) { fault = on; }
void dspk__vk_coopmat_tune_min(uint64_t n) { tune_min = n ? n : TUNE_MIN; }
#else
#define fault 0
#define tune_min ((uint64_t)TUNE_MIN)
#endif

/* The kernel of tile `tile` and variant flags: from the device's memo
 * while the kernel table still holds it, else made (for KHR, from the
 * rewritten SPIR-V). */
static int get_kernel(struct dspk__dev *d, int tile, unsigned flags,
                      struct dspk__vk_kernel **out, struct dspk__opctx *ctx) {
  struct dspk__vk_coopmat *cm = &d->cm;
  struct dspk__vk_kernel *k = dspk__vk_kmemo_get(d, &cm->kern[tile][flags]);
  if (k) {
    *out = k;
    return 0;
  }
  if (fault)
    return dspk__vk_fail(ctx, DSPK_ECOMPILE, "gemm: coopmat kernel: injected failure");
  char src[32768];
  if (dspk__vk_coopmat_source(src, sizeof src, cm, tile, flags) >= (int)sizeof src)
    return dspk__vk_fail(ctx, DSPK_EINTERNAL, "gemm: coopmat kernel source too long");
  int r;
  if (cm->kind != DSPK__VK_CM_KHR) {
    r = dspk__vk_kernel(d, "gemm_coopmat", src, NULL, 0, "main", 4, PC_SIZE, &k, ctx);
  } else {
    uint32_t *nv = NULL, *khr = NULL;
    size_t nw = 0, kw = 0;
    char log[2048] = "", cache_id[DSPK__HASH_HEX] = "";
    r = dspk__vk_glsl_to_spirv(d, "gemm_coopmat", src, NULL, &nv, &nw, log, sizeof log,
                               cache_id);
    if (r)
      return dspk__vk_fail(ctx, r, "gemm: coopmat kernel: %s", log);
    r = dspk__vk_coopmat_nv_to_khr(nv, nw, &khr, &kw);
    free(nv);
    if (r)
      return dspk__vk_fail(ctx, r, "gemm: coopmat kernel: SPIR-V NV -> KHR rewrite failed");
    if (flags & DSPK__VK_CM_F_BF16) {
      uint32_t *bf = NULL;
      r = dspk__vk_coopmat_bf16(khr, kw, &bf, &kw);
      free(khr);
      khr = bf;
      if (r)
        return dspk__vk_fail(ctx, r, "gemm: coopmat kernel: SPIR-V bf16 rewrite failed");
    }
    r = dspk__vk_kernel(d, "gemm_coopmat", NULL, khr, kw * 4, "main", 4, PC_SIZE, &k, ctx);
    free(khr);
    if (r == 0) /* made from the rewritten SPIR-V: its uses count for the GLSL's entry */
      memcpy(k->cache_id, cache_id, sizeof cache_id);
  }
  if (r)
    return r;
  dspk__vk_kmemo_set(&cm->kern[tile][flags], k);
  *out = k;
  return 0;
}

/* Records the planned gemm p with tile `tile`.  DSPK_ENOTSUP when that tile
 * does not fit the device. */
static int launch(struct dspk__dev *d, struct cmplan *p, int tile, struct dspk__opctx *ctx) {
  uint32_t bm, bn;
  if (!tile_of(d, p->flags, tile, &bm, &bn))
    return DSPK_ENOTSUP;
  uint32_t gx = (p->pc.N + bn - 1) / bn, gy = (p->pc.M + bm - 1) / bm;
  if (gx == 0 || gy == 0 || p->nbatch == 0)
    return 0;
  const uint32_t *mx = d->props.limits.maxComputeWorkGroupCount;
  if (gx > mx[0] || gy > mx[1])
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "gemm: %ux%u output too large for one dispatch",
                         p->pc.M, p->pc.N);
  struct dspk__vk_kernel *k;
  int r = get_kernel(d, tile, p->flags, &k, ctx);
  if (r)
    return r;
  d->cm.ngemm++;
  uint32_t oa = p->pc.oa, ob = p->pc.ob, oc = p->pc.oc, oo = p->pc.oo;
  for (uint32_t b0 = 0; b0 < p->nbatch && r == 0; b0 += mx[2]) {
    uint32_t nb = p->nbatch - b0 < mx[2] ? p->nbatch - b0 : mx[2];
    p->pc.oa = oa + b0 * p->pc.bsa;
    p->pc.ob = ob + b0 * p->pc.bsb;
    p->pc.oc = oc + b0 * p->pc.bsc;
    p->pc.oo = oo + b0 * p->pc.bso;
    r = dspk__vk_dispatch(d, k, p->bind, 4, &p->pc, PC_SIZE, gx, gy, nb);
  }
  p->pc.oa = oa;
  p->pc.ob = ob;
  p->pc.oc = oc;
  p->pc.oo = oo;
  return r;
}

/* The autotuner's view of one gemm: each candidate is a tile, run to
 * completion. */
struct tune_ud {
  struct dspk__dev *d;
  struct cmplan *p;
  struct dspk__opctx *ctx;
};
static int tune_run(void *ud, int index) {
  struct tune_ud *u = ud;
  int r = launch(u->d, u->p, index, u->ctx);
  if (r == 0)
    r = dspk__vk_submit(u->d);
  if (r == 0)
    r = dspk__vk_wait_value(u->d, u->d->submitted);
  return r;
}

/* After a kernel of the path failed to compile or to become a pipeline
 * (r): turns the path off on d, with the reason in describe, and runs op
 * through the scalar kernel instead.  A driver that rejects the kernels
 * thus costs the path, not f16 gemm. */
static int disable_and_fall_back(struct dspk__dev *d, struct dspk__op *op,
                                 struct dspk__opctx *ctx, int r) {
  /* A bf16 kernel the driver rejects costs bf16 only (describe says why). */
  int bf16 = op->in[0].dtype == DSPK_BF16;
  char *why = bf16 ? d->cm.bf16_why : d->cm.why;
  size_t wlen = bf16 ? sizeof d->cm.bf16_why : sizeof d->cm.why;
  snprintf(why, wlen, "disabled: a kernel failed (%d%s%.*s)", r,
           ctx && ctx->errmsg && ctx->errmsg[0] ? ": " : "", bf16 ? 50 : 100,
           ctx && ctx->errmsg ? ctx->errmsg : "");
  if (bf16)
    d->cm.bf16 = 0;
  else
    d->cm.kind = DSPK__VK_CM_NONE;
  if (ctx && ctx->errmsg && ctx->errmsg_len)
    ctx->errmsg[0] = 0;
  return dspk__vk_gemm(d, op, ctx);
}

static int is_kernel_error(int r) {
  return r == DSPK_ECOMPILE || r == DSPK_EINVAL || r == DSPK_ENOTSUP || r == DSPK_EINTERNAL;
}

int dspk__vk_coopmat_gemm(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  struct cmplan p;
  if (plan(d, op, &p) != 1)
    return dspk__vk_fail(ctx, DSPK_EINTERNAL, "gemm: not a cooperative-matrix gemm");
  const struct dspk__tensor *C = op->nin == 3 ? &op->in[2] : NULL;
  static const char *names[4] = {"gemm's A", "gemm's B", "gemm's C", "gemm's output"};
  const struct dspk__tensor *t[4] = {&op->in[0], &op->in[1], C, &op->out[0]};
  uint32_t *elem[4] = {&p.pc.oa, &p.pc.ob, &p.pc.oc, &p.pc.oo};
  for (int i = 0; i < 4; i++) {
    if (!t[i])
      continue;
    int r = dspk__vk_bind_named(d, t[i], &p.bind[i], elem[i], ctx, names[i]);
    if (r)
      return r;
  }
  if (!C)
    p.bind[2] = p.bind[3];
  /* uvec4 reads of 8 halves: rows, batches and the start on 8-element
   * boundaries, and the read axis a multiple of 8 (no partial vectors). */
  if ((p.flags & DSPK__VK_CM_F_AKC) && p.pc.sam % 8 == 0 && p.pc.oa % 8 == 0 &&
      p.pc.bsa % 8 == 0 && p.pc.K % 8 == 0)
    p.flags |= DSPK__VK_CM_F_AVEC;
  if ((p.flags & DSPK__VK_CM_F_BNC) && p.pc.sbk % 8 == 0 && p.pc.ob % 8 == 0 &&
      p.pc.bsb % 8 == 0 && p.pc.N % 8 == 0)
    p.flags |= DSPK__VK_CM_F_BVEC;
  uint64_t work = (uint64_t)p.pc.M * p.pc.N * p.pc.K * p.nbatch;
  int n = ntiles(&d->cm);
  int r;
  if (n == 1 || work < tune_min) {
    r = launch(d, &p, 0, ctx);
    return is_kernel_error(r) ? disable_and_fall_back(d, op, ctx, r) : r;
  }
  struct dspk__autotune_cand cands[DSPK__VK_CM_TILES]; /* one per runner thread */
  int e = d->cm.kind == DSPK__VK_CM_EMU;
  for (int i = 0; i < n; i++) {
    cands[i].name = tile_name(&d->cm, i);
    cands[i].run = tune_run;
  }
  char shape[96], layout[16], dts[64];
  snprintf(shape, sizeof shape, "m=2^%d,n=2^%d,k=2^%d,b=2^%d", dspk__autotune_pow2(p.pc.M),
           dspk__autotune_pow2(p.pc.N), dspk__autotune_pow2(p.pc.K),
           dspk__autotune_pow2(p.nbatch));
  snprintf(layout, sizeof layout, "%02x", p.flags);
  struct cmshape sh = shape_of(&d->cm, p.flags);
  snprintf(dts, sizeof dts, "%s,f32,%s,%ux%ux%u", p.flags & DSPK__VK_CM_F_BF16 ? "bf16" : "f16",
           d->cm.kind == DSPK__VK_CM_KHR ? "khr" : e ? "emu" : "nv", sh.lm, sh.ln, sh.lk);
  struct tune_ud u = {d, &p, ctx};
  int ran_ok = 0;
  struct dspk__autotune_req req = {
      .op = "gemm_coopmat",
      .shape = shape,
      .dtypes = dts,
      .layout = layout,
      .dev = dspk__vk_devid(d),
      .cands = cands,
      .ncands = n,
      .ud = &u,
      .progress = ctx ? ctx->progress : NULL,
      .progress_ud = ctx ? ctx->progress_ud : NULL,
      .cancel = ctx ? ctx->cancel : NULL,
      .ran_ok = &ran_ok};
  for (;;) {
    int w;
    r = dspk__autotune_choose(d->env.cache, &req, NULL, &w, NULL);
    if (r == DSPK_ECANCELED) /* a candidate that completed left the whole product */
      return ran_ok ? 0 : r;
    if (r < 0) {
      r = launch(d, &p, 0, ctx);
      return is_kernel_error(r) ? disable_and_fall_back(d, op, ctx, r) : r;
    }
    r = launch(d, &p, w, ctx);
    if (r == 0 || r == DSPK_ECANCELED)
      return r;
    dspk__autotune_failed(d->env.cache, &req, w);
  }
}
