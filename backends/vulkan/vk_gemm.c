/*
 * gemm and contract on the Vulkan backend.
 *
 * gemm is a tiled GLSL kernel, generated per dtype, transposition and tile
 * shape: a workgroup computes a BM x BN tile of C from BK-deep slices of A
 * and B staged in shared memory; each of its threads keeps a TM x TN block
 * of accumulators in registers.  f32 gemms also have the v2 kernel (vec4
 * global and shared loads, double-buffered tiles, register prefetch; an
 * unguarded variant for shapes that are multiples of the tile).  The
 * kernel and tile shape are chosen per shape class by the shared autotune
 * framework (backends/common/autotune.h) among every candidate that fits,
 * whose decisions persist in the cache; small problems take the default.
 * f16/bf16 inputs are read as packed 32-bit words and accumulate in f32.
 * Batches (numpy.matmul broadcasting) are the z dimension of the dispatch
 * when every operand's batch is either whole or fully broadcast, and one
 * dispatch per batch otherwise.
 * Outputs beyond maxComputeWorkGroupCount tiles go in blocks of rows and
 * columns, one dispatch each, and K in slices of GEMM_KSLICE, each adding to
 * what the previous left (lavapipe silently ends an invocation's loops after
 * 65535 iterations in all).  Thin outputs (matrix-vector) take a 256x4 or
 * 4x256 tile.  Batches of small matrices (M x N at most 256, or 1024 with K
 * at most 128) take a kernel of one invocation per output element instead
 * (launch_small), submitted in pieces with a cancel check between them.
 *
 * contract follows the cpu backend: each operand is gathered into a
 * contiguous (batch, M, K) / (batch, K, N) array (summing labels that appear
 * in that operand only), one batched gemm multiplies them, and the result is
 * permuted into the output's label order.  Steps whose layout already fits
 * are skipped.  When there were sums and an operand then holds an infinity
 * or a NaN, the work is done again without them: plain permutations and a
 * kernel adding every product (sum_products), as on the cpu.  Plans (the
 * label analysis) live in the device's plan cache; the temporary arrays are
 * retired behind the work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/autotune.h"
#include "backends/vulkan/vk.h"
#include "proto/testhook.h"

/* A kernel candidate.  v2 = 0: the first kernel (any dtype, strided scalar
 * loads, one shared buffer); v2 = 1: the f32 kernel of gen_gemm2() (vec4
 * global and shared loads where the layout allows, double-buffered shared
 * tiles with a register prefetch of the next k slice, TM x TN micro-tiles
 * in groups of 4 rows/columns).  The first entry is the default for small
 * problems and per-batch dispatches. */
struct tile {
  const char *name;
  int bm, bn, bk, tm, tn;
  int v2; /* 1: v2 kernel; 2: v2 kernel with warp-tiled threads */
};
static const struct tile tiles[] = {
    {"64x64x16", 64, 64, 16, 4, 4, 0},
    {"128x128x8", 128, 128, 8, 8, 8, 0},
    {"64x128x16", 64, 128, 16, 4, 8, 0},
    {"128x64x16", 128, 64, 16, 8, 4, 0},
    {"32x32x16", 32, 32, 16, 2, 2, 0},
    {"v2-128x128x8-t256", 128, 128, 8, 8, 8, 1},
    {"v2-128x128x16-t256", 128, 128, 16, 8, 8, 1},
    {"v2-128x64x8-t128", 128, 64, 8, 8, 8, 1},
    {"v2-64x128x8-t128", 64, 128, 8, 8, 8, 1},
    {"v2-128x64x16-t256", 128, 64, 16, 8, 4, 1},
    {"v2-64x128x16-t256", 64, 128, 16, 4, 8, 1},
    {"v2-64x64x16-t256", 64, 64, 16, 4, 4, 1},
    {"v2-64x64x8-t64", 64, 64, 8, 8, 8, 1},
    {"v2w-128x128x8-t256", 128, 128, 8, 8, 8, 2},
    {"v2w-128x128x16-t256", 128, 128, 16, 8, 8, 2},
    {"v2w-128x64x8-t128", 128, 64, 8, 8, 8, 2},
    {"v2w-64x128x8-t128", 64, 128, 8, 8, 8, 2},
    {"v2-128x128x16-t512", 128, 128, 16, 8, 4, 1},
    {"v2w-128x128x16-t512", 128, 128, 16, 8, 4, 2},
};
#define NTILES ((int)(sizeof tiles / sizeof tiles[0]))
/* Thin outputs (at most 4 columns, or at most 4 rows: matrix-vector
 * products), which the square tiles would cover with mostly idle threads:
 * the first kernel with a tile 256 long on the long side, outside the
 * autotuner's candidates. */
static const struct tile tile_thin_n = {"thin-256x4x8", 256, 4, 8, 4, 1, 0};
static const struct tile tile_thin_m = {"thin-4x256x8", 4, 256, 8, 1, 4, 0};

/* The candidate forced by dspk__vk_gemm_force() (-1: none; a test hook, so
 * a production build has no such global), and the name of the candidate
 * that this thread launched last. */
#ifdef DSPK_TEST_HOOKS
static _Atomic int forced = -1;
#else
#define forced (-1)
#endif
static _Thread_local const char *last_name;

/* One batched gemm on device arrays: o[b] = alpha * A[b] @ B[b] (+ beta *
 * C[b]), with element strides for every axis (0 = broadcast). */
struct gdesc {
  dspk_dtype in_dt, out_dt;
  int has_c;
  struct dspk__vk_bind bind[4]; /* A, B, C (or O again), O */
  uint32_t M, N, K, nbatch;
  uint32_t oa, ob, oc, oo;
  uint32_t sam, sak, sbk, sbn, scm, scn;
  uint32_t bsa, bsb, bsc, bso;
  double alpha, beta;
  /* per-batch offsets when the batch strides cannot express it (NULL:
   * use bs*) */
  uint32_t *boff; /* 4 per batch: a, b, c, o */
  /* With boff, the batch as groups of nb2 x nb1 entries (the two innermost
   * merged batch levels: strides bs* within the inner level of nb1, bs*2
   * along the outer one), boff giving each group's first offsets: for the
   * small-product kernel. */
  uint32_t nb1, nb2, bsa2, bsb2, bsc2;
};

static const char *load_expr(dspk_dtype dt, char which) {
  static char buf[2][160];
  char *s = buf[which == 'b'];
  switch (dt) {
  case DSPK_F16:
    snprintf(s, 160, "unpackHalf2x16(%c[(I) >> 1])[(I) & 1u]", which);
    break;
  case DSPK_BF16:
    snprintf(s, 160, "uintBitsToFloat(((%c[(I) >> 1] >> (16u * ((I) & 1u))) & 0xffffu) << 16)",
             which);
    break;
  default: snprintf(s, 160, "%c[I]", which); break;
  }
  return s;
}

static int gen_gemm(char *src, size_t n, const struct tile *t, dspk_dtype in_dt,
                    dspk_dtype out_dt, int has_c, int a_kfast, int b_nfast) {
  int packed = in_dt == DSPK_F16 || in_dt == DSPK_BF16;
  const char *T = dspk__vk_glsl_type(out_dt);
  const char *TA = packed ? "uint" : dspk__vk_glsl_type(in_dt);
  int dbl = out_dt == DSPK_F64 || out_dt == DSPK_C128;
  int cplx = out_dt == DSPK_C64 || out_dt == DSPK_C128;
  int wgx = t->bn / t->tn, wgy = t->bm / t->tm;
  char la[320], lb[320];
  snprintf(la, sizeof la, "%s", load_expr(in_dt, 'a'));
  snprintf(lb, sizeof lb, "%s", load_expr(in_dt, 'b'));
  return snprintf(
      src, n,
      "#version 450\n"
      "#define BM %d\n#define BN %d\n#define BK %d\n#define TM %d\n#define TN %d\n"
      "#define WGX %d\n#define WGY %d\n#define NT (WGX * WGY)\n"
      "#define T %s\n#define TA %s\n#define R %s\n"
      "layout(local_size_x = WGX, local_size_y = WGY) in;\n"
      "layout(std430, binding = 0) readonly buffer BA { TA a[]; };\n"
      "layout(std430, binding = 1) readonly buffer BB { TA b[]; };\n"
      "layout(std430, binding = 2) readonly buffer BC { T c[]; };\n"
      "layout(std430, binding = 3) buffer BO { T o[]; };\n"
      "layout(push_constant) uniform PC {\n"
      "  uint M, N, K, oa, ob, oc, oo, sam, sak, sbk, sbn, scm, scn, bsa, bsb, bsc,\n"
      "    bso, acc, son, pad; R alpha, beta; } pc;\n"
      "#define LOADA(I) T(%s)\n#define LOADB(I) T(%s)\n"
      "#if %d\n#define MAD(acc, P, Q) acc += T(P.x*Q.x - P.y*Q.y, P.x*Q.y + P.y*Q.x)\n"
      "#else\n#define MAD(acc, x, y) acc = fma(x, y, acc)\n#endif\n"
      "shared T As[BK][BM + 1];\nshared T Bs[BK][BN + 1];\n"
      "void main() {\n"
      "  uint bz = gl_WorkGroupID.z;\n"
      "  uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;\n"
      "  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;\n"
      "  uint tid = ty * WGX + tx;\n"
      "  uint abase = pc.oa + bz * pc.bsa, bbase = pc.ob + bz * pc.bsb;\n"
      "  T acc[TM][TN];\n"
      "  for (int i = 0; i < TM; i++) for (int j = 0; j < TN; j++) acc[i][j] = T(0);\n"
      "  for (uint k0 = 0u; k0 < pc.K; k0 += BK) {\n"
      "    for (uint i = tid; i < BM * BK; i += NT) {\n"
      "#if %d\n      uint mm = i / BK, kk = i %% BK;\n"
      "#else\n      uint kk = i / BM, mm = i %% BM;\n#endif\n"
      "      uint gm = m0 + mm, gk = k0 + kk;\n"
      "      As[kk][mm] = (gm < pc.M && gk < pc.K) ? LOADA(abase + gm * pc.sam + gk * pc.sak) : T(0);\n"
      "    }\n"
      "    for (uint i = tid; i < BN * BK; i += NT) {\n"
      "#if %d\n      uint kk = i / BN, nn = i %% BN;\n"
      "#else\n      uint nn = i / BK, kk = i %% BK;\n#endif\n"
      "      uint gn = n0 + nn, gk = k0 + kk;\n"
      "      Bs[kk][nn] = (gn < pc.N && gk < pc.K) ? LOADB(bbase + gk * pc.sbk + gn * pc.sbn) : T(0);\n"
      "    }\n"
      "    barrier();\n"
      "    for (uint kk = 0u; kk < BK; kk++) {\n"
      "      T ar[TM], br[TN];\n"
      "      for (int i = 0; i < TM; i++) ar[i] = As[kk][ty + uint(i) * WGY];\n"
      "      for (int j = 0; j < TN; j++) br[j] = Bs[kk][tx + uint(j) * WGX];\n"
      "      for (int i = 0; i < TM; i++) for (int j = 0; j < TN; j++) MAD(acc[i][j], ar[i], br[j]);\n"
      "    }\n"
      "    barrier();\n"
      "  }\n"
      "  for (int i = 0; i < TM; i++) {\n"
      "    uint gm = m0 + ty + uint(i) * WGY;\n"
      "    if (gm >= pc.M) continue;\n"
      "    for (int j = 0; j < TN; j++) {\n"
      "      uint gn = n0 + tx + uint(j) * WGX;\n"
      "      if (gn >= pc.N) continue;\n"
      "      T v = pc.K == 0u ? T(0) : pc.alpha * acc[i][j];\n"
      "#if %d\n      if (pc.acc == 0u) {\n"
      "        T w = pc.beta * c[pc.oc + bz * pc.bsc + gm * pc.scm + gn * pc.scn];\n"
      "        v = pc.K == 0u ? w : v + w;\n      }\n#endif\n"
      "      uint oi = pc.oo + bz * pc.bso + gm * pc.son + gn;\n"
      "      if (pc.acc != 0u) v += o[oi];\n"
      "      o[oi] = v;\n"
      "    }\n"
      "  }\n}\n",
      t->bm, t->bn, t->bk, t->tm, t->tn, wgx, wgy, T, TA, dbl ? "double" : "float", la, lb,
      cplx, a_kfast, b_nfast, has_c);
}

/* How the v2 kernel may read and write its operands: vec4 loads of A along
 * k (ak) or m, of B along n (bn) or k, vec4 stores of the output, and
 * whether the tiles need bounds checks. */
struct v2mode {
  int ak, bn;     /* A is k-fast (sak == 1) / B is n-fast (sbn == 1) */
  int va, vb, vo; /* vec4 global access of A, B, the output */
  int guard;      /* M, N or K is not a multiple of the tile */
};

/* The v2 f32 gemm (see struct tile).  Each of the NT = (BN/TN)(BM/TM)
 * threads holds TM x TN accumulators as vec4s: rows ty*4+r of each of the
 * TM/4 row groups (BM/(TM/4) rows apart), columns tx*4+j of each of the
 * TN/4 column groups, so that every k step reads TM/4 + TN/4 vec4s from
 * shared memory.  The A tile is stored k-major (transposed when A is
 * k-fast), padded by one vec4 per row against bank conflicts.  Two shared
 * buffers: while one is read, the next k slice is fetched from global
 * memory into registers and stored into the other, with one barrier per k
 * step.  Warp-tiled (t->v2 == 2): each 32 consecutive threads take an 8 x 4
 * block of (tx, ty), so that a warp's shared reads touch 8 B and 4 A vec4s
 * per k instead of 16 and 2.  Returns snprintf's count (or -1 for a tile the loader cannot
 * split evenly among its threads). */
static int gen_gemm2(char *src, size_t n, const struct tile *t, const struct v2mode *v,
                     int has_c) {
  int wgx = t->bn / t->tn, wgy = t->bm / t->tm, nt = wgx * wgy;
  int wt = t->v2 == 2;
  if (t->tm % 4 || t->tn % 4 || t->bk % 4 || (t->bm * t->bk / 4) % nt ||
      (t->bn * t->bk / 4) % nt || (wt && (wgx % 8 || wgy % 4)))
    return -1;
  return snprintf(
      src, n,
      "#version 450\n"
      "#extension GL_EXT_control_flow_attributes : require\n"
      "#define BM %d\n#define BN %d\n#define BK %d\n#define TM %d\n#define TN %d\n"
      "#define WGX %d\n#define WGY %d\n#define NT (WGX * WGY)\n"
      "#define AK %d\n#define BNF %d\n#define VA %d\n#define VB %d\n#define VO %d\n"
      "#define GUARD %d\n#define HASC %d\n#define WT %d\n"
      "#define LA (BM * BK / 4 / NT)\n#define LB (BN * BK / 4 / NT)\n"
      "layout(local_size_x = WGX, local_size_y = WGY) in;\n"
      "#if VA\n"
      "layout(std430, binding = 0) readonly restrict buffer BA { vec4 a4[]; };\n"
      "#else\n"
      "layout(std430, binding = 0) readonly restrict buffer BA { float a[]; };\n"
      "#endif\n"
      "#if VB\n"
      "layout(std430, binding = 1) readonly restrict buffer BB { vec4 b4[]; };\n"
      "#else\n"
      "layout(std430, binding = 1) readonly restrict buffer BB { float b[]; };\n"
      "#endif\n"
      "layout(std430, binding = 2) readonly buffer BC { float c[]; };\n"
      "#if VO\n"
      "layout(std430, binding = 3) buffer BO { vec4 o4[]; };\n"
      "#else\n"
      "layout(std430, binding = 3) buffer BO { float o[]; };\n"
      "#endif\n"
      "layout(push_constant) uniform PC {\n"
      "  uint M, N, K, oa, ob, oc, oo, sam, sak, sbk, sbn, scm, scn, bsa, bsb, bsc,\n"
      "    bso, acc, son, pad; float alpha, beta; } pc;\n"
      "shared vec4 As[2][BK][BM / 4 + 1];\n"
      "shared vec4 Bs[2][BK][BN / 4 + 1];\n"
      "vec4 ra[LA], rb[LB];\n"
      /* Each thread's loader coordinates: element (lm, lk) of the A tile
       * (lm or lk a multiple of 4, the vec4 running along the fast axis),
       * (lk, ln) of the B tile. */
      "uint am[LA], ak[LA], bk[LB], bn[LB];\n"
      "uint m0, n0, abase, bbase;\n"
      "void fetch(uint k0) {\n"
      "  [[unroll]] for (int i = 0; i < LA; i++) {\n"
      "    uint gm = m0 + am[i], gk = k0 + ak[i];\n"
      "#if VA\n"
      "#if AK\n"
      "    uint e = abase + gm * pc.sam + gk;\n"
      "#else\n"
      "    uint e = abase + gm + gk * pc.sak;\n"
      "#endif\n"
      "    ra[i] = (GUARD == 0 || (gm < pc.M && gk < pc.K)) ? a4[e >> 2] : vec4(0);\n"
      "#else\n"
      "    [[unroll]] for (int j = 0; j < 4; j++) {\n"
      "#if AK\n"
      "      uint m = gm, k = gk + uint(j);\n"
      "#else\n"
      "      uint m = gm + uint(j), k = gk;\n"
      "#endif\n"
      "      ra[i][j] = (GUARD == 0 || (m < pc.M && k < pc.K)) ? a[abase + m * pc.sam + k * pc.sak] : 0.0;\n"
      "    }\n"
      "#endif\n"
      "  }\n"
      "  [[unroll]] for (int i = 0; i < LB; i++) {\n"
      "    uint gn = n0 + bn[i], gk = k0 + bk[i];\n"
      "#if VB\n"
      "#if BNF\n"
      "    uint e = bbase + gk * pc.sbk + gn;\n"
      "#else\n"
      "    uint e = bbase + gk + gn * pc.sbn;\n"
      "#endif\n"
      "    rb[i] = (GUARD == 0 || (gn < pc.N && gk < pc.K)) ? b4[e >> 2] : vec4(0);\n"
      "#else\n"
      "    [[unroll]] for (int j = 0; j < 4; j++) {\n"
      "#if BNF\n"
      "      uint nn = gn + uint(j), k = gk;\n"
      "#else\n"
      "      uint nn = gn, k = gk + uint(j);\n"
      "#endif\n"
      "      rb[i][j] = (GUARD == 0 || (nn < pc.N && k < pc.K)) ? b[bbase + k * pc.sbk + nn * pc.sbn] : 0.0;\n"
      "    }\n"
      "#endif\n"
      "  }\n"
      "}\n"
      "void stash(uint s) {\n"
      "  [[unroll]] for (int i = 0; i < LA; i++) {\n"
      "#if AK\n"
      "    [[unroll]] for (int j = 0; j < 4; j++) As[s][ak[i] + uint(j)][am[i] >> 2][am[i] & 3u] = ra[i][j];\n"
      "#else\n"
      "    As[s][ak[i]][am[i] >> 2] = ra[i];\n"
      "#endif\n"
      "  }\n"
      "  [[unroll]] for (int i = 0; i < LB; i++) {\n"
      "#if BNF\n"
      "    Bs[s][bk[i]][bn[i] >> 2] = rb[i];\n"
      "#else\n"
      "    [[unroll]] for (int j = 0; j < 4; j++) Bs[s][bk[i] + uint(j)][bn[i] >> 2][bn[i] & 3u] = rb[i][j];\n"
      "#endif\n"
      "  }\n"
      "}\n"
      "void main() {\n"
      "  uint tid = gl_LocalInvocationID.y * WGX + gl_LocalInvocationID.x;\n"
      "#if WT\n"
      "  uint tx = ((tid >> 5) %% (WGX / 8)) * 8u + (tid & 7u);\n"
      "  uint ty = ((tid >> 5) / (WGX / 8)) * 4u + ((tid >> 3) & 3u);\n"
      "#else\n"
      "  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;\n"
      "#endif\n"
      "  uint bz = gl_WorkGroupID.z;\n"
      "  m0 = gl_WorkGroupID.y * BM;\n"
      "  n0 = gl_WorkGroupID.x * BN;\n"
      "  abase = pc.oa + bz * pc.bsa;\n"
      "  bbase = pc.ob + bz * pc.bsb;\n"
      "  [[unroll]] for (int i = 0; i < LA; i++) {\n"
      "    uint x = tid + uint(i) * NT;\n"
      "#if AK\n"
      "    am[i] = x / (BK / 4); ak[i] = (x %% (BK / 4)) * 4u;\n"
      "#else\n"
      "    ak[i] = x / (BM / 4); am[i] = (x %% (BM / 4)) * 4u;\n"
      "#endif\n"
      "  }\n"
      "  [[unroll]] for (int i = 0; i < LB; i++) {\n"
      "    uint x = tid + uint(i) * NT;\n"
      "#if BNF\n"
      "    bk[i] = x / (BN / 4); bn[i] = (x %% (BN / 4)) * 4u;\n"
      "#else\n"
      "    bn[i] = x / (BK / 4); bk[i] = (x %% (BK / 4)) * 4u;\n"
      "#endif\n"
      "  }\n"
      "  vec4 acc[TM][TN / 4];\n"
      "  [[unroll]] for (int i = 0; i < TM; i++)\n"
      "    [[unroll]] for (int j = 0; j < TN / 4; j++) acc[i][j] = vec4(0);\n"
      "  uint nk = (pc.K + BK - 1) / BK;\n"
      "  fetch(0u);\n"
      "  stash(0u);\n"
      "  barrier();\n"
      "  for (uint t = 0u; t < nk; t++) {\n"
      "    uint s = t & 1u;\n"
      "    if (t + 1u < nk) fetch((t + 1u) * BK);\n"
      "    [[unroll]] for (uint kk = 0u; kk < BK; kk++) {\n"
      "      vec4 av[TM / 4], bv[TN / 4];\n"
      "      [[unroll]] for (int g = 0; g < TM / 4; g++) av[g] = As[s][kk][uint(g) * (BM / TM) + ty];\n"
      "      [[unroll]] for (int h = 0; h < TN / 4; h++) bv[h] = Bs[s][kk][uint(h) * (BN / TN) + tx];\n"
      "      [[unroll]] for (int g = 0; g < TM / 4; g++)\n"
      "        [[unroll]] for (int r = 0; r < 4; r++)\n"
      "          [[unroll]] for (int h = 0; h < TN / 4; h++)\n"
      "            acc[g * 4 + r][h] = fma(vec4(av[g][r]), bv[h], acc[g * 4 + r][h]);\n"
      "    }\n"
      "    if (t + 1u < nk) stash(s ^ 1u);\n"
      "    barrier();\n"
      "  }\n"
      "  uint obase = pc.oo + bz * pc.bso;\n"
      "  [[unroll]] for (int g = 0; g < TM / 4; g++)\n"
      "    [[unroll]] for (int r = 0; r < 4; r++) {\n"
      "      uint gm = m0 + uint(g) * (BM / (TM / 4)) + ty * 4u + uint(r);\n"
      "      if (GUARD != 0 && gm >= pc.M) continue;\n"
      "      [[unroll]] for (int h = 0; h < TN / 4; h++) {\n"
      "        uint gn = n0 + uint(h) * (BN / (TN / 4)) + tx * 4u;\n"
      "        vec4 v = pc.K == 0u ? vec4(0) : pc.alpha * acc[g * 4 + r][h];\n"
      "#if HASC\n"
      "        if (pc.acc == 0u)\n"
      "        [[unroll]] for (int j = 0; j < 4; j++)\n"
      "          if (GUARD == 0 || gn + uint(j) < pc.N) {\n"
      "            float w = pc.beta * c[pc.oc + bz * pc.bsc + gm * pc.scm + (gn + uint(j)) * pc.scn];\n"
      "            v[j] = pc.K == 0u ? w : v[j] + w;\n"
      "          }\n"
      "#endif\n"
      "#if VO\n"
      "        if (GUARD == 0 || gn < pc.N) {\n"
      "          uint oi = (obase + gm * pc.son + gn) >> 2;\n"
      "          if (pc.acc != 0u) v += o4[oi];\n"
      "          o4[oi] = v;\n"
      "        }\n"
      "#else\n"
      "        [[unroll]] for (int j = 0; j < 4; j++)\n"
      "          if (GUARD == 0 || gn + uint(j) < pc.N) {\n"
      "            uint oi = obase + gm * pc.son + gn + uint(j);\n"
      "            o[oi] = pc.acc != 0u ? v[j] + o[oi] : v[j];\n"
      "          }\n"
      "#endif\n"
      "      }\n"
      "    }\n"
      "}\n",
      t->bm, t->bn, t->bk, t->tm, t->tn, wgx, wgy, v->ak, v->bn, v->va, v->vb, v->vo,
      v->guard, has_c, wt);
}

/* The v2 kernel's access modes for g with tile t; returns 0 when t may
 * run g at all (f32 in and out), DSPK_ENOTSUP otherwise.  vec4 access needs
 * the operand's fast stride to be 1, its other stride, its extent along the
 * vec4 and every offset (binding, element, batch) to be multiples of 4
 * floats. */
static int v2_mode(const struct gdesc *g, const struct tile *t, struct v2mode *v) {
  if (g->in_dt != DSPK_F32 || g->out_dt != DSPK_F32)
    return DSPK_ENOTSUP;
  int al[4]; /* A, B, C, O offsets all multiples of 4 floats */
  uint32_t off[4] = {g->oa, g->ob, g->oc, g->oo}, bs[4] = {g->bsa, g->bsb, g->bsc, g->bso};
  for (int i = 0; i < 4; i++) {
    al[i] = g->bind[i].off % 16 == 0 && off[i] % 4 == 0 && (g->nbatch <= 1 || bs[i] % 4 == 0);
    for (uint32_t b = 0; g->boff && b < g->nbatch; b++)
      al[i] = al[i] && g->boff[4 * b + (uint32_t)i] % 4 == 0;
  }
  v->ak = g->sak == 1;
  v->bn = g->sbn == 1;
  v->va = al[0] && (v->ak ? g->sam % 4 == 0 && g->K % 4 == 0
                          : g->sam == 1 && g->sak % 4 == 0 && g->M % 4 == 0);
  v->vb = al[1] && (v->bn ? g->sbk % 4 == 0 && g->N % 4 == 0
                          : g->sbk == 1 && g->sbn % 4 == 0 && g->K % 4 == 0);
  v->vo = al[3] && g->N % 4 == 0;
  /* (K == 0 too: the kernel fetches its first k slice before the loop.) */
  v->guard = g->M % (uint32_t)t->bm || g->N % (uint32_t)t->bn ||
             g->K % (uint32_t)t->bk || g->K == 0;
  return 0;
}

/* Bytes of shared memory tile t's kernel uses for out_dt. */
static uint32_t tile_shared(const struct tile *t, dspk_dtype out_dt) {
  if (t->v2)
    return (uint32_t)(2 * t->bk * (t->bm / 4 + 1 + t->bn / 4 + 1) * 16);
  return (uint32_t)(t->bk * (t->bm + 1 + t->bn + 1) * dspk__dtype_size(out_dt));
}

/* The summed length one gemm dispatch covers: longer K goes in slices, each
 * adding to the output the previous one left.  Every invocation thus loops
 * a bounded number of times whatever K is (lavapipe stops a shader
 * invocation's loops after 65535 iterations in all, silently); a multiple
 * of every tile's BK, so slices keep the v2 kernel's alignment.  Only CPU
 * devices (lavapipe) need it: a GPU's slices are of GEMM_KSLICE_GPU, so its
 * gemm reads and writes its output once (8192^3 was two slices). */
#define GEMM_KSLICE 4096u
#define GEMM_KSLICE_GPU ((uint64_t)1 << 30)

/* Dispatches the recorded kernel k over g's output (the batches from the
 * offsets base (A, B, C, O), nb of them on the z axis): in blocks of rows
 * and columns that fit maxComputeWorkGroupCount, and K in GEMM_KSLICE
 * slices.  u is the push-constant words inside pc. */
static int dispatch_tiles(struct dspk__dev *d, struct dspk__vk_kernel *k, const struct gdesc *g,
                          const struct tile *t, const void *pc, uint32_t *u, uint32_t pcsize,
                          const uint32_t base[4], uint32_t nb) {
  uint32_t mx[2] = {dspk__vk_max_groups(d, 0), dspk__vk_max_groups(d, 1)};
  uint64_t mstep = (uint64_t)mx[1] * (uint32_t)t->bm, nstep = (uint64_t)mx[0] * (uint32_t)t->bn;
  uint64_t ks = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? GEMM_KSLICE : GEMM_KSLICE_GPU;
  for (uint64_t m0 = 0; m0 < g->M; m0 += mstep)
    for (uint64_t n0 = 0; n0 < g->N; n0 += nstep) {
      uint64_t k0 = 0;
      do {
        uint64_t mc = g->M - m0 < mstep ? g->M - m0 : mstep;
        uint64_t nc = g->N - n0 < nstep ? g->N - n0 : nstep;
        uint64_t kc = g->K - k0 < ks ? g->K - k0 : ks;
        u[0] = (uint32_t)mc;
        u[1] = (uint32_t)nc;
        u[2] = (uint32_t)kc;
        u[3] = (uint32_t)(base[0] + m0 * g->sam + k0 * g->sak);
        u[4] = (uint32_t)(base[1] + k0 * g->sbk + n0 * g->sbn);
        u[5] = (uint32_t)(base[2] + m0 * g->scm + n0 * g->scn);
        u[6] = (uint32_t)(base[3] + m0 * g->N + n0);
        u[17] = k0 != 0; /* acc: add to the previous slices' sum */
        u[18] = g->N;    /* son: the output's row stride */
        int r = dspk__vk_dispatch(d, k, g->bind, 4, pc, pcsize,
                                  (uint32_t)((nc + (uint32_t)t->bn - 1) / (uint32_t)t->bn),
                                  (uint32_t)((mc + (uint32_t)t->bm - 1) / (uint32_t)t->bm), nb);
        if (r)
          return r;
        k0 += kc;
      } while (k0 < g->K);
    }
  return 0;
}


/* The push-constant block's alpha and beta, after its uints: doubles for an
 * f64/c128 output, else two floats right after the uints (std430: 4-byte
 * aligned), both inside alpha's 8 bytes. */
union gscal {
  float f;
  double d;
};
static void put_scalars(const struct gdesc *g, int dbl, union gscal *alpha, union gscal *beta) {
  if (dbl) {
    alpha->d = g->alpha;
    beta->d = g->beta;
  } else {
    float f[2] = {(float)g->alpha, (float)g->beta};
    memcpy(alpha, f, sizeof f);
  }
}

/* Records the gemm g with tile t.  DSPK_ENOTSUP when t cannot run g (a v2
 * tile for other dtypes than f32, or a tile above the device's shared
 * memory or workgroup limits). */
static int launch(struct dspk__dev *d, const struct gdesc *g, const struct tile *t,
                  struct dspk__opctx *ctx) {
  char src[16384];
  const VkPhysicalDeviceLimits *lim = &d->props.limits;
  uint32_t nthreads = (uint32_t)((t->bm / t->tm) * (t->bn / t->tn));
  /* (The first kernel's tiles were never checked, and drivers that
   * understate the limit run them: they stay unchecked.  Tests on such a
   * driver (lavapipe: shared memory is host memory) lift the check for a
   * forced candidate with DSPK_VK_GEMM_NOLIMITS.) */
  int checked = t->v2 && !(forced >= 0 && DSPK_TEST_HOOK("DSPK_VK_GEMM_NOLIMITS"));
  if (checked && (tile_shared(t, g->out_dt) > lim->maxComputeSharedMemorySize ||
                  nthreads > lim->maxComputeWorkGroupInvocations))
    return dspk__vk_fail(ctx, DSPK_ENOTSUP, "gemm: tile %s exceeds this device's limits",
                         t->name);
  if (t->v2) {
    struct v2mode v;
    if (v2_mode(g, t, &v) || gen_gemm2(src, sizeof src, t, &v, g->has_c) < 0)
      return dspk__vk_fail(ctx, DSPK_ENOTSUP, "gemm: tile %s does not fit %s", t->name,
                           dspk__dtype_name(g->in_dt));
  } else {
    gen_gemm(src, sizeof src, t, g->in_dt, g->out_dt, g->has_c, g->sak == 1, g->sbn == 1);
  }
  struct dspk__vk_kernel *k;
  int dbl = g->out_dt == DSPK_F64 || g->out_dt == DSPK_C128;
  struct {
    uint32_t u[20];
    union gscal alpha, beta;
  } pc;
  uint32_t pcsize = dbl ? 20 * 4 + 16 : 20 * 4 + 8;
  int r = dspk__vk_kernel(d, "gemm", src, NULL, 0, "main", 4, pcsize, &k, ctx);
  if (r)
    return r;
  memset(&pc, 0, sizeof pc);
  uint32_t u[20] = {g->M,   g->N,   g->K,   g->oa,  g->ob,  g->oc,  g->oo,
                    g->sam, g->sak, g->sbk, g->sbn, g->scm, g->scn, g->bsa,
                    g->bsb, g->bsc, g->bso, 0,      g->N,   0};
  memcpy(pc.u, u, sizeof u);
  put_scalars(g, dbl, &pc.alpha, &pc.beta);
  if (g->M == 0 || g->N == 0)
    return 0;
  uint32_t mz = dspk__vk_max_groups(d, 2);
  if (!g->boff) {
    for (uint32_t b0 = 0; b0 < g->nbatch; b0 += mz) {
      uint32_t nb = g->nbatch - b0 < mz ? g->nbatch - b0 : mz;
      uint32_t base[4] = {g->oa + b0 * g->bsa, g->ob + b0 * g->bsb, g->oc + b0 * g->bsc,
                          g->oo + b0 * g->bso};
      if ((r = dispatch_tiles(d, k, g, t, &pc, pc.u, pcsize, base, nb)))
        return r;
    }
    last_name = t->name;
    return 0;
  }
  for (uint32_t b = 0; b < g->nbatch; b++) {
    uint32_t base[4] = {g->oa + g->boff[4 * b], g->ob + g->boff[4 * b + 1],
                        g->oc + g->boff[4 * b + 2], g->oo + g->boff[4 * b + 3]};
    if ((r = dispatch_tiles(d, k, g, t, &pc, pc.u, pcsize, base, 1)))
      return r;
  }
  last_name = t->name;
  return 0;
}

/* ---- small batched products ------------------------------------------------ */

/* Batched products whose matrices are small (M x N well under a tile) cost
 * a whole tile's workgroup per batch entry in the tiled kernels (shared
 * staging, barriers, mostly idle threads): ~100 us per 1x1 product on
 * lavapipe.  They take this kernel instead: one invocation per output
 * element (b, m, n), with its own loop over k, (b, m, n) flattened over a
 * 2-D grid of 256-wide workgroups, so that such a product costs about what
 * an elementwise map over its output costs (times K).  The batch index is
 * split in two levels (inner nb1 with strides bs*, outer with bs*2), which
 * covers every simple batch and every broadcast whose batch dims merge into
 * two; the other broadcasts go in one dispatch per group of the two inner
 * levels. */
#define SMALL_NAME "small-batched"
/* The rule (measured on lavapipe with bench_vulkan small; see
 * docs/performance.md): more than one batch entry and an output matrix of
 * at most SMALL_MN elements (the 64x64 tile is then at least 15/16 idle:
 * the kernel won 8-14x at 8x8x4096 and 16x16x2048, 280x at 2x2x8192), or
 * of at most SMALL_MN_SHORTK with K at most SMALL_K (32x32: 2.4x faster at
 * K = 32, 1.3x at 128, but the tuned tiles, which share each k slice among
 * a tile's threads, were 3.7x faster at K = 256). */
#define SMALL_MN 256u
#define SMALL_MN_SHORTK 1024u
#define SMALL_K 128u
/* Outputs one dispatch covers at most. */
#define SMALL_CHUNK ((uint64_t)1 << 22)
/* Multiply-adds of one submission (a piece), after which the next piece
 * is recorded once the one before has run, and a cancel is seen: about
 * 25-60 ms on lavapipe (a 2-core machine), well under 1 ms on a GPU, whose
 * pieces are larger so that it never idles between them. */

#define SMALL_PIECE_CPU ((uint64_t)1 << 24)
#define SMALL_PIECE_GPU ((uint64_t)1 << 28)

static int small_shape(uint64_t M, uint64_t N, uint64_t K, uint64_t nbatch) {
  /* (DSPK_VK_GEMM_NOSMALL: a test hook, for benchmarks of the tiles.) */
  uint64_t mn = M * N;
  return nbatch > 1 && (mn <= SMALL_MN || (mn <= SMALL_MN_SHORTK && K <= SMALL_K)) &&
         !DSPK_TEST_HOOK("DSPK_VK_GEMM_NOSMALL");
}
static int use_small(const struct gdesc *g) {
  return small_shape(g->M, g->N, g->K, g->nbatch);
}

static int gen_small(char *src, size_t n, dspk_dtype in_dt, dspk_dtype out_dt, int has_c) {
  int packed = in_dt == DSPK_F16 || in_dt == DSPK_BF16;
  const char *T = dspk__vk_glsl_type(out_dt);
  const char *TA = packed ? "uint" : dspk__vk_glsl_type(in_dt);
  int dbl = out_dt == DSPK_F64 || out_dt == DSPK_C128;
  int cplx = out_dt == DSPK_C64 || out_dt == DSPK_C128;
  char la[320], lb[320];
  snprintf(la, sizeof la, "%s", load_expr(in_dt, 'a'));
  snprintf(lb, sizeof lb, "%s", load_expr(in_dt, 'b'));
  return snprintf(
      src, n,
      "#version 450\n"
      "#define T %s\n#define TA %s\n#define R %s\n"
      "layout(local_size_x = %d) in;\n"
      "layout(std430, binding = 0) readonly buffer BA { TA a[]; };\n"
      "layout(std430, binding = 1) readonly buffer BB { TA b[]; };\n"
      "layout(std430, binding = 2) readonly buffer BC { T c[]; };\n"
      "layout(std430, binding = 3) buffer BO { T o[]; };\n"
      "layout(push_constant) uniform PC {\n"
      "  uint M, N, K, oa, ob, oc, oo, sam, sak, sbk, sbn, scm, scn, bsa, bsb, bsc,\n"
      "    bso, acc, nb1, bsa2, bsb2, bsc2, total, gx, i0, pad; R alpha, beta; } pc;\n"
      "#define LOADA(I) T(%s)\n#define LOADB(I) T(%s)\n"
      "#if %d\n#define MAD(acc, P, Q) acc += T(P.x*Q.x - P.y*Q.y, P.x*Q.y + P.y*Q.x)\n"
      "#else\n#define MAD(acc, x, y) acc = fma(x, y, acc)\n#endif\n"
      "void main() {\n"
      "  uint i = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du + gl_LocalInvocationID.x;\n"
      "  if (i >= pc.total) return;\n"
      "  i += pc.i0;\n"
      "  uint mn = pc.M * pc.N;\n"
      "  uint bi = i / mn, r = i - bi * mn;\n"
      "  uint m = r / pc.N, n = r - m * pc.N;\n"
      "  uint b2 = bi / pc.nb1, b1 = bi - b2 * pc.nb1;\n"
      "  uint ia = pc.oa + b1 * pc.bsa + b2 * pc.bsa2 + m * pc.sam;\n"
      "  uint ib = pc.ob + b1 * pc.bsb + b2 * pc.bsb2 + n * pc.sbn;\n"
      "  T s = T(0);\n"
      "  for (uint k = 0u; k < pc.K; k++) {\n"
      "    T x = LOADA(ia), y = LOADB(ib);\n"
      "    MAD(s, x, y);\n"
      "    ia += pc.sak; ib += pc.sbk;\n"
      "  }\n"
      "  T v = pc.K == 0u ? T(0) : pc.alpha * s;\n"
      "#if %d\n  if (pc.acc == 0u) {\n"
      "    T w = pc.beta * c[pc.oc + b1 * pc.bsc + b2 * pc.bsc2 + m * pc.scm + n * pc.scn];\n"
      "    v = pc.K == 0u ? w : v + w;\n  }\n#endif\n"
      "  uint oi = pc.oo + bi * pc.bso + m * pc.N + n;\n"
      "  if (pc.acc != 0u) v += o[oi];\n"
      "  o[oi] = v;\n"
      "}\n",
      T, TA, dbl ? "double" : "float", DSPK__VK_WG, la, lb, cplx, DSPK__VK_WG, has_c);
}

/* Records g with the small-product kernel: per group of nb1 * nb2 batch
 * entries (one group when g->boff is NULL), in dispatches of at most
 * SMALL_CHUNK outputs and K in slices as dispatch_tiles(); between
 * submissions of about SMALL_CHUNK outputs each it sees a cancel. */
static int launch_small(struct dspk__dev *d, const struct gdesc *g, struct dspk__opctx *ctx) {
  char src[8192];
  gen_small(src, sizeof src, g->in_dt, g->out_dt, g->has_c);
  struct dspk__vk_kernel *k;
  int dbl = g->out_dt == DSPK_F64 || g->out_dt == DSPK_C128;
  struct {
    uint32_t u[26];
    union gscal alpha, beta;
  } pc;
  uint32_t pcsize = dbl ? 26 * 4 + 16 : 26 * 4 + 8;
  int r = dspk__vk_kernel(d, "gemm-small", src, NULL, 0, "main", 4, pcsize, &k, ctx);
  if (r)
    return r;
  memset(&pc, 0, sizeof pc);
  put_scalars(g, dbl, &pc.alpha, &pc.beta);
  if (g->M == 0 || g->N == 0 || g->nbatch == 0)
    return 0;
  uint64_t per = (uint64_t)g->nb1 * g->nb2; /* batch entries per group */
  uint64_t ngroups = g->boff ? g->nbatch / per : 1;
  if (!g->boff)
    per = g->nbatch;
  uint64_t total = per * g->M * g->N;
  uint64_t mx = (uint64_t)dspk__vk_max_groups(d, 0) * dspk__vk_max_groups(d, 1) * DSPK__VK_WG;
  uint64_t piece = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? SMALL_PIECE_CPU
                                                                      : SMALL_PIECE_GPU;
  /* Test hooks: the piece's size, and a cancel that comes after the given
   * number of pieces ran (deterministic tests of the cancel check). */
  const char *hp = DSPK_TEST_HOOK("DSPK_VK_GEMM_SMALL_PIECE");
  const char *hc = DSPK_TEST_HOOK("DSPK_VK_GEMM_CANCEL_AFTER");
  if (hp && atoll(hp) > 0)
    piece = (uint64_t)atoll(hp);
  uint64_t ks = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? GEMM_KSLICE : GEMM_KSLICE_GPU;
  uint64_t chunk = SMALL_CHUNK < mx ? SMALL_CHUNK : mx;
  uint64_t kmax = g->K < ks ? g->K : ks;
  if (kmax && piece / kmax < chunk) /* a dispatch is at most a piece */
    chunk = piece / kmax > DSPK__VK_WG ? piece / kmax : DSPK__VK_WG;
  int npieces = 0;
  uint64_t since = 0; /* multiply-adds recorded since the last submission */
  for (uint64_t gi = 0; gi < ngroups; gi++) {
    const uint32_t *bo = g->boff ? g->boff + 4 * gi * per : NULL;
    for (uint64_t i0 = 0; i0 < total; i0 += chunk) {
      uint64_t cnt = total - i0 < chunk ? total - i0 : chunk;
      uint32_t gx, gy;
      if ((r = dspk__vk_grid2d(d, (cnt + DSPK__VK_WG - 1) / DSPK__VK_WG, &gx, &gy, "gemm", cnt,
                               "outputs", ctx)))
        return r;
      uint64_t k0 = 0;
      do {
        uint64_t kc = g->K - k0 < ks ? g->K - k0 : ks;
        uint32_t u[26] = {g->M,
                          g->N,
                          (uint32_t)kc,
                          (uint32_t)(g->oa + (bo ? bo[0] : 0) + k0 * g->sak),
                          (uint32_t)(g->ob + (bo ? bo[1] : 0) + k0 * g->sbk),
                          g->oc + (bo ? bo[2] : 0),
                          g->oo + (bo ? bo[3] : 0),
                          g->sam,
                          g->sak,
                          g->sbk,
                          g->sbn,
                          g->scm,
                          g->scn,
                          g->bsa,
                          g->bsb,
                          g->bsc,
                          g->bso,
                          k0 != 0,
                          g->boff ? g->nb1 : g->nbatch,
                          g->boff ? g->bsa2 : 0,
                          g->boff ? g->bsb2 : 0,
                          g->boff ? g->bsc2 : 0,
                          (uint32_t)cnt,
                          gx,
                          (uint32_t)i0,
                          0};
        memcpy(pc.u, u, sizeof u);
        if ((r = dspk__vk_dispatch(d, k, g->bind, 4, &pc, pcsize, gx, gy, 1)))
          return r;
        k0 += kc;
        since += cnt * (kc ? kc : 1);
        /* A long product goes to the device in pieces, a cancel checked
         * between them (once the piece before the last one submitted has
         * run), so that it stops within about two pieces' time on any
         * driver. */
        if (since < piece || (gi + 1 == ngroups && i0 + cnt >= total && k0 >= g->K))
          continue;
        since = 0;
        if ((r = dspk__vk_piece_end(d, ctx, hc, &npieces)))
          return r;
      } while (k0 < g->K);
    }
  }
  last_name = SMALL_NAME;
  return 0;
}

/* ---- tile choice through the autotune framework -------------------------- */

struct tune_ud {
  struct dspk__dev *d;
  const struct gdesc *g;
  struct dspk__opctx *ctx;
  const int *map; /* candidate index -> tiles[] index */
};
static int tune_run(void *ud, int index) {
  struct tune_ud *u = ud;
  int r = launch(u->d, u->g, &tiles[u->map[index]], u->ctx);
  if (r == 0)
    r = dspk__vk_submit(u->d);
  if (r == 0)
    r = dspk__vk_wait_value(u->d, u->d->submitted);
  return r;
}

static int gemm_exec(struct dspk__dev *d, const struct gdesc *g, struct dspk__opctx *ctx) {
  int f = forced;
  if (f >= 0 && f < NTILES)
    return launch(d, g, &tiles[f], ctx);
  if (use_small(g))
    return launch_small(d, g, ctx);
  if (g->N <= 4 && g->M > 64)
    return launch(d, g, &tile_thin_n, ctx);
  if (g->M <= 4 && g->N > 64)
    return launch(d, g, &tile_thin_m, ctx);
  uint64_t work = (uint64_t)g->M * g->N * g->K * g->nbatch;
  if (work < ((uint64_t)1 << 24) || DSPK_TEST_HOOK("DSPK_VK_GEMM_NOTUNE"))
    return launch(d, g, &tiles[0], ctx);
  /* Candidates: the v2 tiles when they apply (first, so that the slower
   * first-kernel tiles are cut early), then every first-kernel tile, so a
   * tuning can never pick something slower than before. */
  struct dspk__autotune_cand cands[NTILES];
  int map[NTILES], nc = 0;
  struct v2mode v;
  for (int pass = 1; pass >= 0; pass--)
    for (int i = 0; i < NTILES; i++)
      if ((tiles[i].v2 != 0) == pass && (!pass || v2_mode(g, &tiles[i], &v) == 0)) {
        cands[nc].name = tiles[i].name;
        cands[nc].run = tune_run;
        map[nc++] = i;
      }
  char shape[96], dts[32], layout[16];
  snprintf(shape, sizeof shape, "m=2^%d,n=2^%d,k=2^%d,b=2^%d", dspk__autotune_pow2(g->M),
           dspk__autotune_pow2(g->N), dspk__autotune_pow2(g->K),
           dspk__autotune_pow2(g->nbatch));
  snprintf(dts, sizeof dts, "%s,%s", dspk__dtype_name(g->in_dt), dspk__dtype_name(g->out_dt));
  /* The v2 kernel's vec4 access (which the layout decides) is part of the
   * key: the same shape class may be aligned or not. */
  int vec = map[0] < NTILES && tiles[map[0]].v2 && v2_mode(g, &tiles[map[0]], &v) == 0 &&
            v.va && v.vb && v.vo;
  snprintf(layout, sizeof layout, "%c%c%c%c", g->sak == 1 ? 'n' : 't', g->sbn == 1 ? 'n' : 't',
           g->has_c ? 'c' : '-', vec ? 'v' : 's');
  struct tune_ud u = {d, g, ctx, map};
  int ran_ok = 0;
  struct dspk__autotune_req req = {
      .op = "gemm",
      .shape = shape,
      .dtypes = dts,
      .layout = layout,
      .dev = dspk__vk_devid(d),
      .cands = cands,
      .ncands = nc,
      .ud = &u,
      .progress = ctx ? ctx->progress : NULL,
      .progress_ud = ctx ? ctx->progress_ud : NULL,
      .cancel = ctx ? ctx->cancel : NULL,
      .ran_ok = &ran_ok};
  /* Above 2^36 multiply-adds (4096^3) a run is long enough that 3 samples
   * are steady: tuning 8192^3 among every candidate then takes seconds. */
  struct dspk__autotune_opts opts = {.samples = work >= ((uint64_t)1 << 36) ? 3 : 0};
  for (;;) {
    int w, r = dspk__autotune_choose(d->env.cache, &req, &opts, &w, NULL);
    if (r == DSPK_ECANCELED) /* a candidate that completed left the whole product */
      return ran_ok ? 0 : r;
    if (r < 0)
      return launch(d, g, &tiles[0], ctx);
    r = launch(d, g, &tiles[map[w]], ctx);
    if (r == 0 || r == DSPK_ECANCELED)
      return r;
    dspk__autotune_failed(d->env.cache, &req, w);
  }
}

/* Returns the number of gemm kernel candidates (indices for
 * dspk__vk_gemm_force and dspk__vk_gemm_cand_name). */
int dspk__vk_gemm_ncands(void) { return NTILES; }

/* Returns candidate i's name (static storage), or NULL out of range. */
const char *dspk__vk_gemm_cand_name(int i) {
  return i >= 0 && i < NTILES ? tiles[i].name : NULL;
}

/* Makes every later gemm in the process launch candidate i, bypassing the
 * autotuner (a candidate that cannot run the gemm fails it with
 * DSPK_ENOTSUP); i < 0 restores the normal choice.  For tests and
 * benchmarks. */
#ifdef DSPK_TEST_HOOKS
void dspk__vk_gemm_force(int i) { forced = i < NTILES ? i : -1; }
#endif

/* Returns the name of the candidate the calling thread's last gemm launched
 * (static storage), or NULL when it launched none. */
const char *dspk__vk_gemm_last(void) { return last_name; }

/* Records a fill of O with zero bytes. */
static int fill_zero(struct dspk__dev *d, const struct dspk__tensor *O) {
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  size_t nbytes = dspk__tensor_nbytes(O);
  if (nbytes && (O->mem->off + O->offset) % 4 == 0 &&
      O->offset + ((nbytes + 3) & ~(size_t)3) <= O->mem->size)
    VK(CmdFillBuffer)(cb, O->mem->buf, O->mem->off + O->offset, (nbytes + 3) & ~(size_t)3, 0);
  dspk__vk_barrier(d);
  return 0;
}

/* ---- gemm op -------------------------------------------------------------- */

static int bind(struct dspk__dev *d, const struct dspk__tensor *t, struct dspk__vk_bind *b,
                uint32_t *elem, struct dspk__opctx *ctx, const char *name) {
  return dspk__vk_bind_named(d, t, b, elem, ctx, name);
}

/* Batch strides of X (rank rx, batch dims right-aligned against the
 * output's nb batch dims ob[]); *whole = X has every batch dim of the
 * output, *none = all of X's batch dims are 1. */
static void batch_info(const int64_t *xs, int rx, int keep, const int64_t *ob, int nbd,
                       int64_t xstride_batch, int64_t *bstr, int *whole, int *none) {
  int64_t s = xstride_batch;
  *whole = 1;
  *none = 1;
  for (int i = nbd - 1; i >= 0; i--) {
    int ix = i - (nbd - (rx - keep));
    int64_t dx = ix >= 0 ? xs[ix] : 1;
    bstr[i] = dx == 1 ? 0 : s;
    if (dx != ob[i])
      *whole = 0;
    if (dx != 1)
      *none = 0;
    s *= dx;
  }
}

int dspk__vk_gemm(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1], *O = &op->out[0];
  const struct dspk__tensor *C = op->nin == 3 ? &op->in[2] : NULL;
  last_name = NULL; /* set again by launch() */
  /* f16 (and bf16 on the KHR path) on the tensor cores where the device
   * offers them (vk_coopmat.c). */
  /* alpha 0 reads neither A nor B, as BLAS (and the cpu): the kernels'
   * empty sum (K = 0) gives beta*C exactly, or +0 without C (no alpha*0
   * added: alpha -0 or -1 gives no -0), so an inf or NaN in A or B does not
   * reach the result.  Decided on the alpha the op computes with (1e-50 of
   * an f32 product is 0); K = 0 takes the same path. */
  double alpha, beta;
  dspk__op_gemm_scalars(op, &alpha, &beta);
  int64_t K0 = op->u.gemm.trans_a ? A->shape[A->rank - 2] : A->shape[A->rank - 1];
  int no_ab = alpha == 0 || K0 == 0;
  /* (Outputs whose tiles might not fit one dispatch take the scalar kernel,
   * which splits them: a cooperative-matrix tile is at least 8 wide.) */
  int fits = (uint64_t)O->shape[O->rank - 2] <= (uint64_t)dspk__vk_max_groups(d, 1) * 8 &&
             (uint64_t)O->shape[O->rank - 1] <= (uint64_t)dspk__vk_max_groups(d, 0) * 8;
  /* (Batches of matrices of at most SMALL_MN outputs take the small-product
   * kernel instead: a cooperative-matrix tile per batch entry, mostly idle,
   * is the cost it avoids.  Up to SMALL_MN_SHORTK, where the scalar tiles
   * lose to it, the tensor cores' tiles are kept.) */
  int64_t nbt = 1;
  for (int i = 0; i < O->rank - 2; i++)
    nbt *= O->shape[i];
  int small = small_shape((uint64_t)O->shape[O->rank - 2], (uint64_t)O->shape[O->rank - 1],
                          (uint64_t)K0, (uint64_t)nbt) &&
              (uint64_t)O->shape[O->rank - 2] * (uint64_t)O->shape[O->rank - 1] <= SMALL_MN &&
              forced < 0;
  if ((A->dtype == DSPK_F16 || A->dtype == DSPK_BF16) && !no_ab && fits && !small &&
      dspk__vk_coopmat_usable(d, op))
    return dspk__vk_coopmat_gemm(d, op, ctx);
  struct gdesc g;
  memset(&g, 0, sizeof g);
  g.in_dt = A->dtype;
  g.out_dt = O->dtype;
  if (g.out_dt == DSPK_F64 && !d->has_f64)
    return dspk__vk_fail(ctx, DSPK_EDTYPE, "gemm: this Vulkan device lacks shaderFloat64");
  int ta = op->u.gemm.trans_a != 0, tb = op->u.gemm.trans_b != 0;
  int ra = A->rank, rb = B->rank, ro = O->rank;
  int64_t M = O->shape[ro - 2], N = O->shape[ro - 1];
  int64_t K = ta ? A->shape[ra - 2] : A->shape[ra - 1];
  if (dspk__tensor_numel(A) > UINT32_MAX / 2 || dspk__tensor_numel(B) > UINT32_MAX / 2 ||
      dspk__tensor_numel(O) > UINT32_MAX / 2)
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "gemm: operands above 2^31 elements");
  /* Reading neither A nor B, nor C (beta 0 or none): +0 everywhere, a fill
   * that binds nothing, so it works for an output of any size. */
  if (no_ab && (!C || beta == 0))
    return fill_zero(d, O);
  int r;
  if (!no_ab && ((r = bind(d, A, &g.bind[0], &g.oa, ctx, "gemm's A")) ||
                 (r = bind(d, B, &g.bind[1], &g.ob, ctx, "gemm's B"))))
    return r;
  if ((r = bind(d, O, &g.bind[3], &g.oo, ctx, "gemm's output")))
    return r;
  if (no_ab) /* not read (K = 0 in the kernel): no binding of their own */
    g.bind[0] = g.bind[1] = g.bind[3];
  if (C && beta != 0) { /* beta 0 reads no C: no binding either */
    if ((r = bind(d, C, &g.bind[2], &g.oc, ctx, "gemm's C")))
      return r;
    g.has_c = 1;
  } else {
    g.bind[2] = g.bind[3];
  }
  g.M = (uint32_t)M;
  g.N = (uint32_t)N;
  g.K = no_ab ? 0 : (uint32_t)K;
  g.alpha = alpha;
  g.beta = beta;
  /* A is (.., M, K) or (.., K, M) when transposed; likewise B. */
  int64_t lda = A->shape[ra - 1], ldb = B->shape[rb - 1];
  g.sam = ta ? 1 : (uint32_t)lda;
  g.sak = ta ? (uint32_t)lda : 1;
  g.sbk = tb ? 1 : (uint32_t)ldb;
  g.sbn = tb ? (uint32_t)ldb : 1;
  int64_t ctr[2] = {0, 0}; /* C's strides along m, n */
  int crank = C ? C->rank : 0;
  if (C) {
    int64_t cn = crank >= 1 ? C->shape[crank - 1] : 1;
    int64_t cm = crank >= 2 ? C->shape[crank - 2] : 1;
    ctr[1] = cn == 1 ? 0 : 1;
    ctr[0] = cm == 1 ? 0 : cn;
  }
  g.scm = (uint32_t)ctr[0];
  g.scn = (uint32_t)ctr[1];
  int nbd = ro - 2;
  int64_t nbatch = 1;
  for (int i = 0; i < nbd; i++)
    nbatch *= O->shape[i];
  g.nbatch = (uint32_t)nbatch;
  int64_t bsa[DSPK_MAX_RANK], bsb[DSPK_MAX_RANK], bsc[DSPK_MAX_RANK], bso[DSPK_MAX_RANK];
  int wa, na, wb, nbb, wc = 1, nc = 1, wo, no;
  batch_info(A->shape, ra, 2, O->shape, nbd, A->shape[ra - 1] * A->shape[ra - 2], bsa, &wa, &na);
  batch_info(B->shape, rb, 2, O->shape, nbd, B->shape[rb - 1] * B->shape[rb - 2], bsb, &wb, &nbb);
  batch_info(O->shape, ro, 2, O->shape, nbd, M * N, bso, &wo, &no);
  if (C) {
    int keep = crank < 2 ? crank : 2;
    int64_t cmat = 1;
    for (int i = crank - keep; i < crank; i++)
      cmat *= C->shape[i];
    batch_info(C->shape, crank, keep, O->shape, nbd, cmat, bsc, &wc, &nc);
  } else {
    memset(bsc, 0, sizeof bsc);
  }
  int simple = (wa || na) && (wb || nbb) && (wc || nc);
  if (simple) {
    g.bsa = na ? 0 : (uint32_t)(M * K);
    g.bsb = nbb ? 0 : (uint32_t)(K * N);
    g.bso = (uint32_t)(M * N);
    if (C && !nc) {
      int64_t cmat = 1;
      for (int i = crank - (crank < 2 ? crank : 2); i < crank; i++)
        cmat *= C->shape[i];
      g.bsc = (uint32_t)cmat;
    }
    return gemm_exec(d, &g, ctx);
  }
  g.boff = malloc(sizeof(uint32_t) * 4 * (size_t)nbatch);
  if (!g.boff)
    return DSPK_ENOMEM;
  for (int64_t b = 0; b < nbatch; b++) {
    int64_t rem = b, oa = 0, ob = 0, oc = 0;
    for (int i = nbd - 1; i >= 0; i--) {
      int64_t c = rem % O->shape[i];
      rem /= O->shape[i];
      oa += c * bsa[i];
      ob += c * bsb[i];
      oc += c * bsc[i];
    }
    g.boff[4 * b] = (uint32_t)oa;
    g.boff[4 * b + 1] = (uint32_t)ob;
    g.boff[4 * b + 2] = (uint32_t)oc;
    g.boff[4 * b + 3] = (uint32_t)(b * M * N);
  }
  int f = forced;
  if (f < 0 && use_small(&g)) {
    /* The batch dims merged where every operand's strides allow (size-1
     * dims dropped); the innermost two levels go in one dispatch. */
    int nl = 0;
    int64_t ld[DSPK_MAX_RANK], la[DSPK_MAX_RANK], lb[DSPK_MAX_RANK], lc[DSPK_MAX_RANK];
    for (int i = 0; i < nbd; i++) {
      if (O->shape[i] == 1)
        continue;
      if (nl && la[nl - 1] == bsa[i] * O->shape[i] && lb[nl - 1] == bsb[i] * O->shape[i] &&
          lc[nl - 1] == bsc[i] * O->shape[i]) {
        ld[nl - 1] *= O->shape[i];
      } else {
        ld[nl] = O->shape[i];
        nl++;
      }
      la[nl - 1] = bsa[i];
      lb[nl - 1] = bsb[i];
      lc[nl - 1] = bsc[i];
    }
    g.nb1 = nl ? (uint32_t)ld[nl - 1] : 1;
    g.bsa = nl ? (uint32_t)la[nl - 1] : 0;
    g.bsb = nl ? (uint32_t)lb[nl - 1] : 0;
    g.bsc = nl ? (uint32_t)lc[nl - 1] : 0;
    g.nb2 = nl > 1 ? (uint32_t)ld[nl - 2] : 1;
    g.bsa2 = nl > 1 ? (uint32_t)la[nl - 2] : 0;
    g.bsb2 = nl > 1 ? (uint32_t)lb[nl - 2] : 0;
    g.bsc2 = nl > 1 ? (uint32_t)lc[nl - 2] : 0;
    g.bso = (uint32_t)(M * N);
    r = launch_small(d, &g, ctx);
  } else {
    r = launch(d, &g, &tiles[f >= 0 && f < NTILES ? f : 0], ctx);
  }
  free(g.boff);
  return r;
}

/* ---- gather (permute, summing operand-only labels) ------------------------ */

/* Summed elements one gather dispatch adds per output. */
#define GATHER_SLICE 2048u

/* The gather kernel's push constants. */
struct gather_pc {
  uint32_t nout, nred, rk, rr, ox, oo, r0, rn, gx, first, pad[2];
  uint32_t dim[DSPK_MAX_RANK], str[DSPK_MAX_RANK];
};

static void gather_slice(void *pc_, uint64_t r0, uint64_t rn, uint64_t n) {
  struct gather_pc *pc = pc_;
  (void)n;
  pc->r0 = (uint32_t)r0;
  pc->rn = (uint32_t)rn;
  pc->first = r0 == 0;
}

/* dst[i] for i over the kept dims (in the given order, contiguous) =
 * sum over the summed dims of src at the strided offset.  Uses the reduce
 * machinery's layout: dims/strides of kept dims, then summed ones. */
static int gather(struct dspk__dev *d, dspk_dtype dt, const struct dspk__vk_bind *src,
                  uint32_t soff, const struct dspk__vk_bind *dst, uint32_t doff, int nk,
                  const int64_t *kdim, const int64_t *kstr, int ns, const int64_t *sdim,
                  const int64_t *sstr, struct dspk__opctx *ctx) {
  struct gather_pc pc;
  memset(&pc, 0, sizeof pc);
  uint64_t nout = 1, nred = 1;
  for (int i = 0; i < nk; i++) {
    pc.dim[i] = (uint32_t)kdim[i];
    pc.str[i] = (uint32_t)kstr[i];
    nout *= (uint64_t)kdim[i];
  }
  for (int i = 0; i < ns; i++) {
    pc.dim[nk + i] = (uint32_t)sdim[i];
    pc.str[nk + i] = (uint32_t)sstr[i];
    nred *= (uint64_t)sdim[i];
  }
  pc.nout = (uint32_t)nout;
  pc.nred = (uint32_t)nred;
  pc.rk = (uint32_t)nk;
  pc.rr = (uint32_t)ns;
  pc.ox = soff;
  pc.oo = doff;
  if (nout == 0)
    return 0;
  char src_[4096];
  /* A permutation (nothing summed) copies each value's bits: a float
   * copy as 0 + x would lose subnormals where the device flushes them in
   * arithmetic (NVIDIA's f32), and contract's remaking keeps them
   * (protocol.md). */
  static const char *const bits[17] = {[4] = "uint", [8] = "uvec2", [16] = "uvec4"};
  size_t es = dspk__dtype_size(dt);
  int copy = ns == 0 && es <= 16 && bits[es];
  snprintf(src_, sizeof src_,
           "#version 450\n"
           "layout(local_size_x = %d) in;\n"
           "#define T %s\n"
           "layout(std430, binding = 0) readonly buffer BX { T x[]; };\n"
           "layout(std430, binding = 1) buffer BO { T o[]; };\n"
           "layout(push_constant) uniform PC { uint nout, nred, rk, rr, ox, oo, r0, rn,\n"
           "  gx, first, p0, p1; uint dim[8]; uint str[8]; } pc;\n"
           "void main() {\n"
           "  uint oi = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du +\n"
           "            gl_LocalInvocationID.x;\n"
           "  if (oi < pc.nout) {\n"
           "    uint rem = oi, base = pc.ox;\n"
           "    for (int j = int(pc.rk) - 1; j >= 0; j--) {\n"
           "      base += (rem %% pc.dim[j]) * pc.str[j]; rem /= pc.dim[j]; }\n"
           "%s"
           "  }\n}\n",
           DSPK__VK_WG, copy ? bits[es] : dspk__vk_glsl_type(dt), DSPK__VK_WG,
           copy ? "    o[pc.oo + oi] = x[base];\n"
                : "    T acc = pc.first != 0u ? T(0) : o[pc.oo + oi];\n"
                  "    for (uint ri = pc.r0; ri < pc.r0 + pc.rn; ri++) {\n"
                  "      uint rr = ri, off = base;\n"
                  "      for (int j = int(pc.rk + pc.rr) - 1; j >= int(pc.rk); j--) {\n"
                  "        off += (rr % pc.dim[j]) * pc.str[j]; rr /= pc.dim[j]; }\n"
                  "      acc += x[off];\n"
                  "    }\n"
                  "    o[pc.oo + oi] = acc;\n");
  struct dspk__vk_kernel *k;
  int r = dspk__vk_kernel(d, "gather", src_, NULL, 0, "main", 2, sizeof pc, &k, ctx);
  if (r)
    return r;
  struct dspk__vk_bind b[2] = {*src, *dst};
  /* One invocation per output on a 2-D grid (any count fits the dispatch
   * limits), the summed elements in slices of GATHER_SLICE per dispatch,
   * each adding to what the previous one left: every invocation loops a
   * bounded number of times (lavapipe stops a shader invocation's loops
   * after 65535 iterations in all, silently). */
  uint32_t gx, gy;
  if ((r = dspk__vk_grid2d(d, (nout + DSPK__VK_WG - 1) / DSPK__VK_WG, &gx, &gy, "contract",
                           nout, "elements", ctx)))
    return r;
  pc.gx = gx;
  return dspk__vk_dispatch_sliced(d, k, b, 2, &pc, sizeof pc, gx, gy, nred, GATHER_SLICE,
                                  gather_slice);
}

/* ---- contract --------------------------------------------------------------- */

/* Contract's kernel name of GLSL src (nbind bindings, pcsize bytes of push
 * constants) and the 2-D grid of work groups that gives one invocation to
 * each of n elements (any count fits the dispatch limits). */
static int contract_kernel(struct dspk__dev *d, const char *name, const char *src, int nbind,
                           uint32_t pcsize, uint64_t n, struct dspk__vk_kernel **k,
                           uint32_t *gx, uint32_t *gy, struct dspk__opctx *ctx) {
  int r = dspk__vk_kernel(d, name, src, NULL, 0, "main", nbind, pcsize, k, ctx);
  if (r)
    return r;
  return dspk__vk_grid2d(d, (n + DSPK__VK_WG - 1) / DSPK__VK_WG, gx, gy, "contract", n,
                         "elements", ctx);
}

/* The label analysis of one contraction, kept in the plan cache. */
struct cplan {
  int kind;                /* 0: a contract plan (see plan_evict) */
  int nb, nm, nn, nk;      /* batch, A-free, B-free, contracted label counts */
  int64_t B_, M, N, K;     /* their products */
  /* gather of A into (batch, M, K): kept dims/strides in that order, then
   * A-only summed dims */
  int ak, as;
  int64_t akd[DSPK_MAX_RANK], aks[DSPK_MAX_RANK], asd[DSPK_MAX_RANK], ass[DSPK_MAX_RANK];
  int bk, bs;
  int64_t bkd[DSPK_MAX_RANK], bks[DSPK_MAX_RANK], bsd[DSPK_MAX_RANK], bss[DSPK_MAX_RANK];
  int a_ident, b_ident; /* the operand already is (batch, M, K) / (batch, K, N) */
  /* permute of (batch, M, N) into the output's order */
  int ok;
  int64_t okd[DSPK_MAX_RANK], oks[DSPK_MAX_RANK];
  int o_ident;
};

static void strides_of(const struct dspk__tensor *t, int64_t *s) {
  int64_t x = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    s[i] = x;
    x *= t->shape[i];
  }
}

static int is_identity(int n, const int64_t *dim, const int64_t *str) {
  int64_t x = 1;
  for (int i = n - 1; i >= 0; i--) {
    if (dim[i] != 1 && str[i] != x)
      return 0;
    x *= dim[i];
  }
  return 1;
}

static int make_plan(const struct dspk__op *op, struct cplan *p, char *msg, size_t len) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  char lab[3][DSPK_MAX_RANK + 1];
  int64_t size[128];
  int r = dspk__contract_parse(op->u.contract.subscripts, A, B, lab, size, msg, len);
  if (r)
    return r;
  memset(p, 0, sizeof *p);
  int64_t sa[DSPK_MAX_RANK], sb[DSPK_MAX_RANK];
  strides_of(A, sa);
  strides_of(B, sb);
  char bl[DSPK_MAX_RANK], ml[DSPK_MAX_RANK], nl[DSPK_MAX_RANK], kl[DSPK_MAX_RANK];
  int nb = 0, nm = 0, nn = 0, nk = 0;
  /* Label classes, in the output's order for batch/M/N and A's for K. */
  for (const char *c = lab[2]; *c; c++) {
    int ina = strchr(lab[0], *c) != NULL, inb = strchr(lab[1], *c) != NULL;
    if (ina && inb)
      bl[nb++] = *c;
    else if (ina)
      ml[nm++] = *c;
    else
      nl[nn++] = *c;
  }
  for (const char *c = lab[0]; *c; c++)
    if (strchr(lab[1], *c) && !strchr(lab[2], *c))
      kl[nk++] = *c;
  p->nb = nb;
  p->nm = nm;
  p->nn = nn;
  p->nk = nk;
  p->B_ = p->M = p->N = p->K = 1;
  for (int i = 0; i < nb; i++) p->B_ *= size[(int)bl[i]];
  for (int i = 0; i < nm; i++) p->M *= size[(int)ml[i]];
  for (int i = 0; i < nn; i++) p->N *= size[(int)nl[i]];
  for (int i = 0; i < nk; i++) p->K *= size[(int)kl[i]];
  /* Gather orders. */
  const char *aord[3] = {bl, ml, kl}, *bord[3] = {bl, kl, nl};
  int acnt[3] = {nb, nm, nk}, bcnt[3] = {nb, nk, nn};
  for (int part = 0; part < 3; part++)
    for (int i = 0; i < acnt[part]; i++) {
      int ax = (int)(strchr(lab[0], aord[part][i]) - lab[0]);
      p->akd[p->ak] = A->shape[ax];
      p->aks[p->ak++] = sa[ax];
    }
  for (int part = 0; part < 3; part++)
    for (int i = 0; i < bcnt[part]; i++) {
      int ax = (int)(strchr(lab[1], bord[part][i]) - lab[1]);
      p->bkd[p->bk] = B->shape[ax];
      p->bks[p->bk++] = sb[ax];
    }
  for (int ax = 0; lab[0][ax]; ax++)
    if (!strchr(lab[1], lab[0][ax]) && !strchr(lab[2], lab[0][ax])) {
      p->asd[p->as] = A->shape[ax];
      p->ass[p->as++] = sa[ax];
    }
  for (int ax = 0; lab[1][ax]; ax++)
    if (!strchr(lab[0], lab[1][ax]) && !strchr(lab[2], lab[1][ax])) {
      p->bsd[p->bs] = B->shape[ax];
      p->bss[p->bs++] = sb[ax];
    }
  p->a_ident = p->as == 0 && is_identity(p->ak, p->akd, p->aks);
  p->b_ident = p->bs == 0 && is_identity(p->bk, p->bkd, p->bks);
  /* The gemm result is (batch, M, N) in the order bl, ml, nl; the output
   * wants lab[2]'s order: for each output axis, its stride in the result. */
  char rl[3 * DSPK_MAX_RANK + 1];
  int nr = 0;
  for (int i = 0; i < nb; i++) rl[nr++] = bl[i];
  for (int i = 0; i < nm; i++) rl[nr++] = ml[i];
  for (int i = 0; i < nn; i++) rl[nr++] = nl[i];
  int64_t rs[3 * DSPK_MAX_RANK], x = 1;
  for (int i = nr - 1; i >= 0; i--) {
    rs[i] = x;
    x *= size[(int)rl[i]];
  }
  for (int i = 0; lab[2][i]; i++) {
    int j = 0;
    while (rl[j] != lab[2][i])
      j++;
    p->okd[p->ok] = size[(int)lab[2][i]];
    p->oks[p->ok++] = rs[j];
  }
  p->o_ident = is_identity(p->ok, p->okd, p->oks);
  return 0;
}

static void plan_key(const struct dspk__op *op, char *key, size_t *len) {
  int n = snprintf(key, DSPK__PLANCACHE_KEY_MAX, "contract|%s|%d", op->u.contract.subscripts,
                   (int)op->in[0].dtype);
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < op->in[t].rank && n < DSPK__PLANCACHE_KEY_MAX - 24; i++)
      n += snprintf(key + n, DSPK__PLANCACHE_KEY_MAX - n, "%c%lld", i ? ',' : '|',
                    (long long)op->in[t].shape[i]);
  *len = (size_t)n;
}

/* 1 into flag[0] when one of the n real parts of x from part ox on is an
 * infinity or a NaN (flag zeroed before); a single dispatch, one part per
 * invocation. */
struct nonfinite_pc {
  uint32_t n, ox, gx;
};

static int scan_nonfinite(struct dspk__dev *d, dspk_dtype dt, const struct dspk__vk_bind *x,
                          uint32_t ox, uint64_t n, const struct dspk__vk_bind *flag,
                          struct dspk__opctx *ctx) {
  int W = dspk__dtype_is_complex(dt) ? 2 : 1;
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  struct nonfinite_pc pc = {(uint32_t)(n * (uint64_t)W), ox * (uint32_t)W, 0};
  if (n == 0)
    return 0;
  char src[1024];
  snprintf(src, sizeof src,
           "#version 450\n"
           "layout(local_size_x = %d) in;\n"
           "layout(std430, binding = 0) readonly buffer BX { %s x[]; };\n"
           "layout(std430, binding = 1) buffer BF { uint flag[]; };\n"
           "layout(push_constant) uniform PC { uint n, ox, gx; } pc;\n"
           "void main() {\n"
           "  uint i = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du +\n"
           "           gl_LocalInvocationID.x;\n"
           "  if (i < pc.n && (isinf(x[pc.ox + i]) || isnan(x[pc.ox + i])))\n"
           "    flag[0] = 1u;\n"
           "}\n",
           DSPK__VK_WG, dbl ? "double" : "float", DSPK__VK_WG);
  struct dspk__vk_kernel *k;
  uint32_t gx, gy;
  int r = contract_kernel(d, "contract_nonfinite", src, 2, sizeof pc, pc.n, &k, &gx, &gy, ctx);
  if (r)
    return r;
  pc.gx = gx;
  struct dspk__vk_bind b[2] = {*x, *flag};
  return dspk__vk_dispatch(d, k, b, 2, &pc, sizeof pc, gx, gy, 1);
}

/* The linear sums of products for real dtypes (the cpu's contract.c
 * sum_products says how): a group's (or a running total's) finite part as
 * m * 2^e, m in [0.5, 1) or 0, so that no partial sum overflows before the
 * final rounding, and its flags (1 NaN, 2 +inf, 4 -inf, 8 zero, 16 positive,
 * 32 negative).  The values are read and the results written as their bits
 * (B_, by dec and enc, see lin_bits), then %s is that helper text. */
#define LIN_HEAD                                                                \
  "#version 450\n"                                                              \
  "layout(local_size_x = %d) in;\n"                                             \
  "#define T_ %s\n"                                                             \
  "#define MINDIFF %d\n"                                                        \
  "struct G { T_ m; int e; uint f; };\n"                                        \
  "void addm(inout T_ m, inout int e, T_ y, int ye) {\n"                        \
  "  if (y == T_(0)) return;\n"                                                 \
  "  int d = max(e, ye);\n"                                                     \
  "  if (m == T_(0)) d = ye;\n"                                                 \
  "  m = (m == T_(0) || e - d < MINDIFF ? T_(0) : ldexp(m, e - d)) +\n"         \
  "      (ye - d < MINDIFF ? T_(0) : ldexp(y, ye - d));\n"                      \
  "  int k;\n"                                                                  \
  "  m = frexp(m, k);\n"                                                        \
  "  e = m == T_(0) ? 0 : d + k;\n"                                             \
  "}\n"                                                                         \
  "%s"

/* GLSL's frexp and ldexp need not handle subnormals (lavapipe's frexp read
 * 5e-324 as 2^-1023, as if it had the implicit leading 1), and a device may
 * flush them in float arithmetic; so an operand's value is taken apart, and
 * a result put together, in integers, as the bits B_ (uint for float, uvec2
 * (low, high word) for double):
 *   uint dec(B_ v, out T_ m, out int e): v's flag (see LIN_HEAD); for a finite
 *     v other than 0, v = m * 2^e with m in [0.5, 1) (a subnormal v
 *     normalized: no implicit 1, the exponent of the smallest normal);
 *   B_ enc(T_ m, int e, int tie): the bits of m * 2^e (m a normal value or 0)
 *     rounded to the dtype, ties to even, through its subnormals (gradual
 *     underflow, +-0 below half the smallest), +-inf above its range, +0 for
 *     m = 0; tie the sign of what m * 2^e lacks of the exact value (an exact
 *     product's rounding error, lin_products: 1 the exact value is above, -1
 *     below), which decides a tie;
 *   NAN_, PINF, NINF: the bits of NaN, +inf, -inf. */
static const char lin_bits32[] =
    "#define B_ uint\n"
    "#define NAN_ 0x7fc00000u\n"
    "#define PINF 0x7f800000u\n"
    "#define NINF 0xff800000u\n"
    "uint dec(uint v, out float m, out int e) {\n"
    "  uint s = v & 0x80000000u, fr = v & 0x7fffffu;\n"
    "  int E = int((v >> 23) & 0xffu);\n"
    "  m = 0.0; e = 0;\n"
    "  if (E == 255) return fr != 0u ? 1u : (s != 0u ? 4u : 2u);\n"
    "  if (E == 0 && fr == 0u) return 8u;\n"
    "  if (E == 0) { int p = findMSB(fr); fr = (fr << uint(23 - p)) & 0x7fffffu; E = p - 22; }\n"
    "  m = uintBitsToFloat(s | 0x3f000000u | fr);\n"
    "  e = E - 126;\n"
    "  return s != 0u ? 32u : 16u;\n"
    "}\n"
    /* m * 2^e = q * 2^(e - 24), q the 24-bit significand; below the
     * normals, q * 2^(e + 125) units of 2^-149, q shifted right by sh. */
    "uint enc(float m, int e, int tie) {\n"
    "  uint v = floatBitsToUint(m), s = v & 0x80000000u;\n"
    "  if ((v & 0x7fffffffu) == 0u) return 0u;\n"
    "  e += int((v >> 23) & 0xffu) - 126;\n"
    "  uint q = (v & 0x7fffffu) | 0x800000u;\n"
    "  if (e > 128) return s | PINF;\n"
    "  if (e >= -125) return s | (uint(e + 126) << 23) | (q & 0x7fffffu);\n"
    "  int sh = -125 - e;\n"
    "  if (s != 0u) tie = -tie;\n" /* of the magnitude, which q is */
    "  if (sh > 24) return s;\n"
    "  uint r = q >> uint(sh), rem = q & ((1u << uint(sh)) - 1u), hf = 1u << uint(sh - 1);\n"
    "  if (rem > hf || (rem == hf && (tie > 0 || (tie == 0 && (r & 1u) != 0u)))) r++;\n"
    "  return s | r;\n" /* 2^23 units: the smallest normal's bits */
    "}\n";

static const char lin_bits64[] =
    "#define B_ uvec2\n"
    "#define NAN_ uvec2(0u, 0x7ff80000u)\n"
    "#define PINF uvec2(0u, 0x7ff00000u)\n"
    "#define NINF uvec2(0u, 0xfff00000u)\n"
    "uint dec(uvec2 v, out double m, out int e) {\n"
    "  uint s = v.y & 0x80000000u, hi = v.y & 0xfffffu, lo = v.x;\n"
    "  int E = int((v.y >> 20) & 0x7ffu);\n"
    "  m = 0.0LF; e = 0;\n"
    "  if (E == 2047) return (hi | lo) != 0u ? 1u : (s != 0u ? 4u : 2u);\n"
    "  if (E == 0 && (hi | lo) == 0u) return 8u;\n"
    "  if (E == 0) {\n"
    "    int p = hi != 0u ? 32 + findMSB(hi) : findMSB(lo), k = 52 - p;\n"
    "    if (k >= 32) { hi = lo << uint(k - 32); lo = 0u; }\n"
    "    else { hi = (hi << uint(k)) | (lo >> uint(32 - k)); lo <<= uint(k); }\n"
    "    hi &= 0xfffffu;\n"
    "    E = p - 51;\n"
    "  }\n"
    "  m = packDouble2x32(uvec2(lo, s | 0x3fe00000u | hi));\n"
    "  e = E - 1022;\n"
    "  return s != 0u ? 32u : 16u;\n"
    "}\n"
    /* m * 2^e = q * 2^(e - 53), q the 53-bit significand (hi, lo); below
     * the normals, q * 2^(e + 1021) units of 2^-1074: t = q >> (sh - 1)
     * keeps the rounding bit, st whether any below it is set. */
    "uvec2 enc(double m, int e, int tie) {\n"
    "  uvec2 v = unpackDouble2x32(m);\n"
    "  uint s = v.y & 0x80000000u;\n"
    "  if ((v.y & 0x7fffffffu) == 0u && v.x == 0u) return uvec2(0u);\n"
    "  e += int((v.y >> 20) & 0x7ffu) - 1022;\n"
    "  uint hi = (v.y & 0xfffffu) | 0x100000u, lo = v.x;\n"
    "  if (e > 1024) return uvec2(0u, s | PINF.y);\n"
    "  if (e >= -1021) return uvec2(lo, s | (uint(e + 1022) << 20) | (hi & 0xfffffu));\n"
    "  if (s != 0u) tie = -tie;\n" /* of the magnitude, which (hi, lo) is */
    "  int j = -1022 - e;\n" /* sh - 1 */
    "  if (j > 52) return uvec2(0u, s);\n"
    "  uint tl, th; bool st;\n"
    "  if (j >= 32) {\n"
    "    tl = hi >> uint(j - 32); th = 0u;\n"
    "    st = lo != 0u || (hi & ((1u << uint(j - 32)) - 1u)) != 0u;\n"
    "  } else if (j == 0) { tl = lo; th = hi; st = false; }\n"
    "  else {\n"
    "    tl = (lo >> uint(j)) | (hi << uint(32 - j)); th = hi >> uint(j);\n"
    "    st = (lo & ((1u << uint(j)) - 1u)) != 0u;\n"
    "  }\n"
    "  uint rl = (tl >> 1) | (th << 31), rh = th >> 1;\n"
    "  if ((tl & 1u) != 0u && (st || tie > 0 || (tie == 0 && (rl & 1u) != 0u))) {\n"
    "    rl++; if (rl == 0u) rh++;\n"
    "  }\n"
    "  return uvec2(rl, s | rh);\n" /* 2^52 units: the smallest normal's bits */
    "}\n";

/* Flags and m * 2^e sums of n groups of len values, each at
 * (g / inner) * len * inner + g %% inner with step inner, in slices. */
static int lin_groups(struct dspk__dev *d, dspk_dtype dt, const struct dspk__vk_bind *x,
                      const struct dspk__vk_bind *g, uint64_t n, uint64_t len, uint64_t inner,
                      struct dspk__opctx *ctx) {
  int dbl = dt == DSPK_F64;
  char src[8192];
  int ns = snprintf(src, sizeof src,
           LIN_HEAD
           "layout(std430, binding = 0) readonly buffer BX { B_ x[]; };\n"
           "layout(std430, binding = 1) buffer BG { G g[]; };\n"
           "layout(push_constant) uniform PC { uint n, len, inner, l0, rn, gx, first; } pc;\n"
           "void main() {\n"
           "  uint gi = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du +\n"
           "            gl_LocalInvocationID.x;\n"
           "  if (gi >= pc.n) return;\n"
           "  uint base = gi / pc.inner * pc.len * pc.inner + gi %% pc.inner;\n"
           "  T_ m = T_(0); int e = 0; uint f = 0u;\n"
           "  if (pc.first == 0u) { m = g[gi].m; e = g[gi].e; f = g[gi].f; }\n"
           "  T_ sm = T_(0), cm = T_(0); int se = 0, ce = 0;\n"
           "  for (uint i = 0u; i < pc.rn; i++) {\n"
           "    T_ vm; int ve;\n"
           "    uint vf = dec(x[base + (pc.l0 + i) * pc.inner], vm, ve);\n"
           "    f |= vf;\n"
           "    if (vf >= 16u) addm(cm, ce, vm, ve);\n"
           "    if ((i & 63u) == 63u) { addm(sm, se, cm, ce); cm = T_(0); ce = 0; }\n"
           "  }\n"
           "  addm(sm, se, cm, ce);\n"
           "  addm(m, e, sm, se);\n"
           "  g[gi].m = m; g[gi].e = e; g[gi].f = f;\n"
           "}\n",
           DSPK__VK_WG, dbl ? "double" : "float", dbl ? -60 : -30,
           dbl ? lin_bits64 : lin_bits32, DSPK__VK_WG);
  if (ns < 0 || (size_t)ns >= sizeof src)
    return dspk__vk_fail(ctx, DSPK_EINTERNAL, "contract_lingroups: kernel source too long");
  struct {
    uint32_t n, len, inner, l0, rn, gx, first;
  } pc = {(uint32_t)n, (uint32_t)len, (uint32_t)inner, 0, 0, 0, 1};
  struct dspk__vk_kernel *k;
  int r = dspk__vk_kernel(d, "contract_lingroups", src, NULL, 0, "main", 2, sizeof pc, &k, ctx);
  if (r)
    return r;
  uint32_t gx, gy;
  if ((r = dspk__vk_grid2d(d, (n + DSPK__VK_WG - 1) / DSPK__VK_WG, &gx, &gy, "contract", n,
                           "elements", ctx)))
    return r;
  pc.gx = gx;
  struct dspk__vk_bind b[2] = {*x, *g};
  for (uint64_t l0 = 0; l0 < len; l0 += GATHER_SLICE) {
    pc.l0 = (uint32_t)l0;
    pc.rn = (uint32_t)(len - l0 < GATHER_SLICE ? len - l0 : GATHER_SLICE);
    pc.first = l0 == 0;
    if ((r = dspk__vk_dispatch(d, k, b, 2, &pc, sizeof pc, gx, gy, 1)))
      return r;
  }
  return 0;
}

/* C[b,m,n] for real dtypes from A's groups (batch x M x K) and B's (batch x
 * K x N): K work per output, in slices of K, the running total in acc. */
static int lin_products(struct dspk__dev *d, dspk_dtype dt, const struct dspk__vk_bind *ga,
                        const struct dspk__vk_bind *gb, const struct dspk__vk_bind *acc,
                        const struct dspk__vk_bind *c, uint32_t oc, const struct cplan *p,
                        struct dspk__opctx *ctx) {
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  unsigned W = dspk__dtype_is_complex(dt) ? 2 : 1;
  char src[8192];
  int ns = snprintf(src, sizeof src,
           LIN_HEAD
           "#define W %uu\n"
           "#define SPLIT %s\n"
           "layout(std430, binding = 0) readonly buffer BA { G ga[]; };\n"
           "layout(std430, binding = 1) readonly buffer BB { G gb[]; };\n"
           "layout(std430, binding = 2) buffer BC { G acc[]; };\n"
           "layout(std430, binding = 3) buffer BO { B_ o[]; };\n"
           "layout(push_constant) uniform PC { uint nout, M, N, K, k0, rn, gx, first, last,\n"
           "  oc; } pc;\n"
           "uint pairf(uint fa, uint fb) {\n"
           "  if (((fa | fb) & 1u) != 0u) return 1u;\n"
           "  uint ia = fa & 6u, ib = fb & 6u;\n"
           "  if (ia == 0u && ib == 0u) return 0u;\n"
           "  if ((ia != 0u && (fb & 8u) != 0u) || (ib != 0u && (fa & 8u) != 0u)) return 1u;\n"
           "  uint ap = fa & 18u, an = fa & 36u, bp = fb & 18u, bn = fb & 36u, r = 0u;\n"
           "  if (((fa & 2u) != 0u && bp != 0u) || ((fa & 4u) != 0u && bn != 0u) ||\n"
           "      ((fb & 2u) != 0u && ap != 0u) || ((fb & 4u) != 0u && an != 0u)) r |= 2u;\n"
           "  if (((fa & 2u) != 0u && bn != 0u) || ((fa & 4u) != 0u && bp != 0u) ||\n"
           "      ((fb & 2u) != 0u && an != 0u) || ((fb & 4u) != 0u && ap != 0u)) r |= 4u;\n"
           "  return r;\n"
           "}\n"
           /* Part w of output oi (W parts, 2 for a complex dtype): the
            * products of the pairs of parts of A's group and B's (real:
            * a*b; re: ar*br - ai*bi; im: ar*bi + ai*br), a negated one's
            * infinities of the other sign. */
           "uint negf(uint f) { return (f & 1u) | ((f & 2u) << 1) | ((f & 4u) >> 1); }\n"
           /* The rounding error of p = a * b (a, b normal values of
            * magnitude below 1, the groups' m), exactly, by Dekker's
            * product: Veltkamp's split of each into halves whose products
            * are exact; precise: no fused multiply-add may change them. */
           "T_ prod_err(T_ a, T_ b, T_ p) {\n"
           "  precise T_ ca = SPLIT * a;\n"
           "  precise T_ ah = ca - (ca - a);\n"
           "  precise T_ al = a - ah;\n"
           "  precise T_ cb = SPLIT * b;\n"
           "  precise T_ bh = cb - (cb - b);\n"
           "  precise T_ bl = b - bh;\n"
           "  precise T_ r = ((ah * bh - p) + ah * bl + al * bh) + al * bl;\n"
           "  return r;\n"
           "}\n"
           "void main() {\n"
           "  uint id = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du +\n"
           "            gl_LocalInvocationID.x;\n"
           "  if (id >= pc.nout * W) return;\n"
           "  uint oi = id / W, w = id %% W;\n"
           "  uint n = oi %% pc.N, bm = oi / pc.N, bi = bm / pc.M;\n"
           "  T_ m = T_(0); int e = 0; uint f = 0u;\n"
           "  if (pc.first == 0u) { m = acc[id].m; e = acc[id].e; f = acc[id].f; }\n"
           "  T_ sm = T_(0), cm = T_(0); int se = 0, ce = 0;\n"
           "  for (uint i = 0u; i < pc.rn; i++) {\n"
           "    uint k = pc.k0 + i, ia = (bm * pc.K + k) * W, ib = ((bi * pc.K + k) * pc.N + n) * W;\n"
           "    for (uint q = 0u; q < W; q++) {\n"
           "      uint xa = W == 1u ? 0u : q, xb = W == 1u ? 0u : (w == 0u ? q : 1u - q);\n"
           "      bool neg = W == 2u && w == 0u && q == 1u;\n"
           "      G a = ga[ia + xa], b = gb[ib + xb];\n"
           "      uint pf = pairf(a.f, b.f);\n"
           "      if (pf != 0u) { f |= neg ? negf(pf) : pf; continue; }\n"
           "      precise T_ pm = a.m * b.m;\n"
           "      if (pm != T_(0)) {\n"
           /* 64: a nonzero product seen, 128: more than one; 256 / 512:
            * the last one's rounding error (as added) is positive /
            * negative (an output of one product rounds once: enc's lo) */
           "        T_ er = prod_err(a.m, b.m, pm);\n"
           "        if (neg) er = -er;\n"
           "        f |= (f & 64u) << 1;\n"
           "        f = (f & ~768u) | 64u | (er > T_(0) ? 256u : er < T_(0) ? 512u : 0u);\n"
           "      }\n"
           "      addm(cm, ce, neg ? -pm : pm, a.e + b.e);\n"
           "    }\n"
           "    if ((i & 63u) == 63u) { addm(sm, se, cm, ce); cm = T_(0); ce = 0; }\n"
           "  }\n"
           "  addm(sm, se, cm, ce);\n"
           "  addm(m, e, sm, se);\n"
           "  if (pc.last == 0u) { acc[id].m = m; acc[id].e = e; acc[id].f = f; return; }\n"
           "  B_ r;\n"
           "  if ((f & 1u) != 0u || (f & 6u) == 6u) r = NAN_;\n"
           "  else if ((f & 6u) != 0u) r = (f & 2u) != 0u ? PINF : NINF;\n"
           "  else r = enc(m, e, (f & 192u) != 64u ? 0 : (f & 256u) != 0u ? 1 :\n"
           "                 (f & 512u) != 0u ? -1 : 0);\n"
           "  o[(pc.oc + oi) * W + w] = r;\n"
           "}\n",
           DSPK__VK_WG, dbl ? "double" : "float", dbl ? -60 : -30,
           dbl ? lin_bits64 : lin_bits32, W, dbl ? "134217729.0LF" : "4097.0", DSPK__VK_WG);
  if (ns < 0 || (size_t)ns >= sizeof src)
    return dspk__vk_fail(ctx, DSPK_EINTERNAL, "contract_linprod: kernel source too long");
  uint64_t nout = (uint64_t)(p->B_ * p->M * p->N), K = (uint64_t)p->K;
  struct {
    uint32_t nout, M, N, K, k0, rn, gx, first, last, oc;
  } pc = {(uint32_t)nout, (uint32_t)p->M, (uint32_t)p->N, (uint32_t)K, 0, 0, 0, 1, 0, oc};
  struct dspk__vk_kernel *k;
  uint32_t gx, gy;
  int r = contract_kernel(d, "contract_linprod", src, 4, sizeof pc, nout * W, &k, &gx, &gy,
                          ctx);
  if (r)
    return r;
  pc.gx = gx;
  struct dspk__vk_bind b[4] = {*ga, *gb, *acc, *c};
  for (uint64_t k0 = 0; k0 < K; k0 += GATHER_SLICE) {
    pc.k0 = (uint32_t)k0;
    pc.rn = (uint32_t)(K - k0 < GATHER_SLICE ? K - k0 : GATHER_SLICE);
    pc.first = k0 == 0;
    pc.last = k0 + pc.rn == K;
    if ((r = dspk__vk_dispatch(d, k, b, 4, &pc, sizeof pc, gx, gy, 1)))
      return r;
  }
  return 0;
}

/* C[b,m,n] (batch x M x N, contiguous) = the sum over k, s, t of
 * A[b,m,k,s] * B[b,k,t,n] (both contiguous, from element 0), every dtype:
 * the cpu's contract.c sum_products says how (a complex product as its four
 * real ones, the finite ones summed apart from the infinite and NaN ones),
 * K * (S + T) work per output. */
static int lin_sum_products(struct dspk__dev *d, dspk_dtype dt, const struct dspk__vk_bind *a,
                            const struct dspk__vk_bind *bb, const struct dspk__vk_bind *c,
                            uint32_t oc, const struct cplan *p, int64_t S, int64_t T,
                            struct dspk__opctx *ctx) {
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  uint64_t W = dspk__dtype_is_complex(dt) ? 2 : 1;
  dspk_dtype rt = dbl ? DSPK_F64 : DSPK_F32; /* the parts' dtype */
  size_t gs = dbl ? 16 : 12;                 /* struct G in std430 */
  uint64_t na = (uint64_t)(p->B_ * p->M * p->K) * W, nbg = (uint64_t)(p->B_ * p->K * p->N) * W,
           nout = (uint64_t)(p->B_ * p->M * p->N) * W;
  struct dspk__mem *ta = NULL, *tb = NULL, *tc = NULL;
  int r;
  /* Its temporaries hold gs bytes a part (2 gs a complex value), up to
   * three times the operands' own bytes (f32: 12 for 4, c64: 24 for 8),
   * each one binding. */
  uint64_t most = na > nbg ? na : nbg;
  most = most > nout ? most : nout;
  /* (The test hook DSPK_VK_CONTRACT_RANGE stands for the range here only:
   * the limit of each dtype tested at small sizes.) */
  uint64_t range = d->props.limits.maxStorageBufferRange;
  const char *hr = DSPK_TEST_HOOK("DSPK_VK_CONTRACT_RANGE");
  if (hr && atoll(hr) > 0)
    range = (uint64_t)atoll(hr);
  if (most * gs > range)
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "contract: a product holds an infinity or a NaN: its sums made apart "
                         "need a temporary of %llu bytes (%zu a %s value%s), more than this "
                         "device's maxStorageBufferRange %llu",
                         (unsigned long long)(most * gs), (size_t)(gs * W),
                         dspk__dtype_name(dt), W == 2 ? (dbl ? ": 16 a part" : ": 12 a part") : "",
                         (unsigned long long)range);
  if ((r = dspk__vk_alloc(d, na * gs, &ta)) || (r = dspk__vk_alloc(d, nbg * gs, &tb)) ||
      (r = dspk__vk_alloc(d, nout * gs, &tc)))
    goto out;
  struct dspk__vk_bind ba = dspk__vk_bind_temp(ta), bg = dspk__vk_bind_temp(tb),
                       bc = dspk__vk_bind_temp(tc);
  /* A's groups: each part of (b, m, k) over its S values, W parts apart;
   * B's: each part of (b, k, n) over its T values, N * W parts apart. */
  if ((r = lin_groups(d, rt, a, &ba, na, (uint64_t)S, W, ctx)) ||
      (r = lin_groups(d, rt, bb, &bg, nbg, (uint64_t)T, (uint64_t)p->N * W, ctx)))
    goto out;
  r = lin_products(d, dt, &ba, &bg, &bc, c, oc, p, ctx);
out:
  dspk__vk_free(d, ta);
  dspk__vk_free(d, tb);
  dspk__vk_free(d, tc);
  return r;
}

int dspk__vk_contract(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1], *O = &op->out[0];
  dspk_dtype dt = A->dtype;
  if ((dt == DSPK_F64 || dt == DSPK_C128) && !d->has_f64)
    return dspk__vk_fail(ctx, DSPK_EDTYPE, "contract: this Vulkan device lacks shaderFloat64");
  if (dspk__tensor_numel(A) > UINT32_MAX / 2 || dspk__tensor_numel(B) > UINT32_MAX / 2 ||
      dspk__tensor_numel(O) > UINT32_MAX / 2)
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "contract: operands above 2^31 elements");
  /* An empty operand: every sum is empty, the output is zero; no plan, as
   * its gathers are sized by labels that can still be large. */
  if (dspk__tensor_numel(A) == 0 || dspk__tensor_numel(B) == 0) {
    if (dspk__tensor_numel(O) == 0)
      return 0;
    return fill_zero(d, O);
  }
  char key[DSPK__PLANCACHE_KEY_MAX];
  size_t klen;
  plan_key(op, key, &klen);
  struct cplan *p = dspk__plancache_get(&d->plans, key, klen);
  int r;
  if (!p) {
    p = malloc(sizeof *p);
    if (!p)
      return DSPK_ENOMEM;
    char msg[256];
    if ((r = make_plan(op, p, msg, sizeof msg))) {
      free(p);
      return dspk__vk_fail(ctx, r, "%s", msg);
    }
    p->kind = 0; /* not an FFT plan: the evict callback frees it */
    if (dspk__plancache_put(&d->plans, key, klen, p) != 0) {
      free(p);
      return DSPK_EINTERNAL;
    }
  }
  size_t es = dspk__dtype_size(dt);
  struct dspk__vk_bind ba, bb, bo;
  uint32_t ea, eb, eo;
  if ((r = bind(d, A, &ba, &ea, ctx, "contract's A")) ||
      (r = bind(d, B, &bb, &eb, ctx, "contract's B")) ||
      (r = bind(d, O, &bo, &eo, ctx, "contract's output")))
    return r;
  struct dspk__mem *ta = NULL, *tb = NULL, *tc = NULL, *tf = NULL, *ta2 = NULL, *tb2 = NULL;
  struct gdesc g;
  memset(&g, 0, sizeof g);
  g.in_dt = g.out_dt = dt;
  g.M = (uint32_t)p->M;
  g.N = (uint32_t)p->N;
  g.K = (uint32_t)p->K;
  g.nbatch = (uint32_t)p->B_;
  g.alpha = 1;
  g.sam = (uint32_t)p->K;
  g.sak = 1;
  g.sbk = (uint32_t)p->N;
  g.sbn = 1;
  g.bsa = (uint32_t)(p->M * p->K);
  g.bsb = (uint32_t)(p->K * p->N);
  g.bso = (uint32_t)(p->M * p->N);
  if (p->a_ident) {
    g.bind[0] = ba;
    g.oa = ea;
  } else {
    if ((r = dspk__vk_alloc(d, (size_t)(p->B_ * p->M * p->K) * es, &ta)))
      goto out;
    g.bind[0] = dspk__vk_bind_temp(ta);
    if ((r = gather(d, dt, &ba, ea, &g.bind[0], 0, p->ak, p->akd, p->aks, p->as, p->asd,
                    p->ass, ctx)))
      goto out;
  }
  if (p->b_ident) {
    g.bind[1] = bb;
    g.ob = eb;
  } else {
    if ((r = dspk__vk_alloc(d, (size_t)(p->B_ * p->K * p->N) * es, &tb)))
      goto out;
    g.bind[1] = dspk__vk_bind_temp(tb);
    if ((r = gather(d, dt, &bb, eb, &g.bind[1], 0, p->bk, p->bkd, p->bks, p->bs, p->bsd,
                    p->bss, ctx)))
      goto out;
  }
  if (p->o_ident) {
    g.bind[3] = bo;
    g.oo = eo;
  } else {
    if ((r = dspk__vk_alloc(d, (size_t)(p->B_ * p->M * p->N) * es, &tc)))
      goto out;
    g.bind[3] = dspk__vk_bind_temp(tc);
  }
  g.bind[2] = g.bind[3];
  if (p->K == 0 || p->M * p->N * p->B_ == 0) {
    /* Empty sums: the output is zero. */
    r = fill_zero(d, O);
    goto out;
  }
  if ((r = gemm_exec(d, &g, ctx)))
    goto out;
  /* A product holding an infinity or a NaN (an operand's own, a pre-sum
   * that overflowed, or a product or running sum of the gemm that did):
   * made again without pre-sums by lin_sum_products (the cpu's contract.c
   * says why), after a wait for the check.  An infinity or a NaN in an
   * operand or a pre-sum always reaches the product, so its check is
   * enough. */
  uint32_t flag = 0;
  if ((r = dspk__vk_alloc(d, 4, &tf)) || (r = dspk__vk_zero(d, tf, 0, 4)))
    goto out;
  struct dspk__vk_bind bf = dspk__vk_bind_temp(tf);
  if ((r = scan_nonfinite(d, dt, &g.bind[3], g.oo, (uint64_t)(p->B_ * p->M * p->N), &bf,
                          ctx)) ||
      (r = dspk__vk_read(d, tf, 0, &flag, 4)))
    goto out;
  if (flag) {
    /* A as (batch, M, K, its summed-only labels), B as (batch, K, its
     * summed-only labels, N): plain permutations, no sums. */
    int64_t kd[DSPK_MAX_RANK], ks[DSPK_MAX_RANK], S = 1, T = 1;
    int n = 0, split = p->nb + p->nk;
    for (int i = 0; i < p->as; i++)
      S *= p->asd[i];
    for (int i = 0; i < p->bs; i++)
      T *= p->bsd[i];
    if ((r = dspk__vk_alloc(d, (size_t)dspk__tensor_numel(A) * es, &ta2)) ||
        (r = dspk__vk_alloc(d, (size_t)dspk__tensor_numel(B) * es, &tb2)))
      goto out;
    struct dspk__vk_bind b2a = dspk__vk_bind_temp(ta2),
                         b2b = dspk__vk_bind_temp(tb2);
    for (int i = 0; i < p->ak; i++, n++)
      kd[n] = p->akd[i], ks[n] = p->aks[i];
    for (int i = 0; i < p->as; i++, n++)
      kd[n] = p->asd[i], ks[n] = p->ass[i];
    if ((r = gather(d, dt, &ba, ea, &b2a, 0, n, kd, ks, 0, NULL, NULL, ctx)))
      goto out;
    n = 0;
    for (int i = 0; i < split; i++, n++)
      kd[n] = p->bkd[i], ks[n] = p->bks[i];
    for (int i = 0; i < p->bs; i++, n++)
      kd[n] = p->bsd[i], ks[n] = p->bss[i];
    for (int i = split; i < p->bk; i++, n++)
      kd[n] = p->bkd[i], ks[n] = p->bks[i];
    if ((r = gather(d, dt, &bb, eb, &b2b, 0, n, kd, ks, 0, NULL, NULL, ctx)))
      goto out;
    if ((r = lin_sum_products(d, dt, &b2a, &b2b, &g.bind[3], g.oo, p, S, T, ctx)))
      goto out;
  }
  if (!p->o_ident)
    r = gather(d, dt, &g.bind[3], 0, &bo, eo, p->ok, p->okd, p->oks, 0, NULL, NULL, ctx);
out:
  /* Temporaries go back once the queue is past this work. */
  dspk__vk_submit(d);
  dspk__vk_free(d, ta);
  dspk__vk_free(d, tb);
  dspk__vk_free(d, tc);
  dspk__vk_free(d, tf);
  dspk__vk_free(d, ta2);
  dspk__vk_free(d, tb2);
  return r;
}
