/*
 * The simple ops of the Vulkan backend, with the semantics of the cpu
 * backend (backends/op.c documents them): map, reduce and fir's direct
 * kernel (vk_fir.c has its FFT path and the choice) as GLSL
 * generated per dtype and function, and raw kernels (GLSL source or SPIR-V)
 * with buffer bindings and push constants.  Also the op dispatcher.
 *
 * Generated kernels share one preamble (types and complex helpers; map's
 * exp adds its own exp, sin and cos: EXP_GLSL) and take every element
 * offset as a push constant, so tensors may start anywhere their element
 * size allows.  map's loop is grid-stride, so any size fits in the
 * dispatch limits (at most DSPK__VK_MAX_GROUPS workgroups); reduce and fir
 * put their outputs on a 2-D grid and their reduced elements (taps) in
 * slices over several dispatches, so that no invocation loops long (lavapipe silently ends an
 * invocation's loops after 65535 iterations in all).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "proto/testhook.h"

#define DSPK__VK_MAX_GROUPS 65535u
/* Elements one reduce dispatch folds per output: 2048 loop iterations per
 * invocation (see dspk__vk_reduce). */
#define RED_SLICE (2048u * DSPK__VK_WG)
/* Reductions shorter than this run one invocation per output, folding at
 * most RED_THREAD_SLICE elements per dispatch. */
#define RED_THREAD_MAX 4096u
/* Taps one direct fir dispatch applies (a multiple of DSPK__VK_WG). */
#define FIR_TAP_SLICE 16384u
#define RED_THREAD_SLICE 2048u

const char *dspk__vk_glsl_type(dspk_dtype dt) {
  switch (dt) {
  case DSPK_F32: return "float";
  case DSPK_F64: return "double";
  case DSPK_C64: return "vec2";
  case DSPK_C128: return "dvec2";
  default: return NULL;
  }
}

static int is_dbl(dspk_dtype dt) { return dt == DSPK_F64 || dt == DSPK_C128; }
static int is_cplx(dspk_dtype dt) { return dt == DSPK_C64 || dt == DSPK_C128; }

/* |a| of a complex (map abs), appended to the preamble of a complex kernel:
 * within 1 ulp everywhere, and correctly rounded but for a few in 10^5
 * (tests/vulkan/test_vk_exp.c measures it against hypotl; probe 19 B2: a
 * quotient y/x in the old form cost up to 1.9 ulps, Vulkan's division being
 * within 2.5 ulps only).  Only additions, multiplications and integer
 * operations, which Vulkan rounds correctly, and one sqrt, whose error a
 * Newton step removes:
 *  - x >= y >= 0 are scaled by a power of two (exactly: no division) so
 *    that x is in [1, 2), and prescaled by 2^24 (f32) or 2^54 (f64) first
 *    when x is subnormal; y may then go below the normal range, where its
 *    square is far below x's last bit anyway;
 *  - h = sqrt(x^2 + y^2), then h -= d/(2h) with d = h^2 - x^2 - y^2
 *    computed with exact products (Veltkamp's split: no fma, which Vulkan
 *    does not promise to fuse) and h^2 - x^2 exact (Sterbenz: x <= h <=
 *    x sqrt 2);
 *  - the result h 2^e applied in two power-of-two factors, so that it
 *    rounds once where it is subnormal (h itself rounded before: within an
 *    ulp there) and is inf where it passes the range.
 * precise keeps the compiler from fusing or reordering that arithmetic. */
#define CABS_GLSL                                                              \
  "#if DBL\n"                                                                  \
  "#define CA_SPLIT 134217729.0LF\n"                                           \
  "#define CA_PRE 54\n"                                                        \
  "R ca_pow2(int k) { return packDouble2x32(uvec2(0u, uint(k + 1023) << 20)); }\n" \
  "int ca_exp(R m) { return int(unpackDouble2x32(m).y >> 20) - 1023; }\n"      \
  "#else\n"                                                                    \
  "#define CA_SPLIT 4097.0\n"                                                  \
  "#define CA_PRE 24\n"                                                        \
  "R ca_pow2(int k) { return uintBitsToFloat(uint(k + 127) << 23); }\n"        \
  "int ca_exp(R m) { return int(floatBitsToUint(m) >> 23) - 127; }\n"          \
  "#endif\n"                                                                   \
  /* a*a = p + the returned error, exactly (|a| < 2^60: no overflow). */       \
  "R ca_sqerr(R a, R p) {\n"                                                   \
  "  precise R c = CA_SPLIT * a;\n"                                            \
  "  precise R hi = c - (c - a);\n"                                            \
  "  precise R lo = a - hi;\n"                                                 \
  "  precise R e = ((hi * hi - p) + R(2) * hi * lo) + lo * lo;\n"             \
  "  return e;\n"                                                              \
  "}\n"                                                                        \
  "R cabs(T a) {\n"                                                            \
  "  R x = abs(a.x), y = abs(a.y);\n"                                          \
  "  if (isinf(x) || isinf(y)) return R(uintBitsToFloat(0x7f800000u));\n"     \
  "  if (isnan(x) || isnan(y)) return x + y;\n"                                \
  "  R m = max(x, y), n = min(x, y);\n"                                        \
  "  if (!(n > R(0))) return m;\n"                                             \
  "  int pre = 0;\n"                                                           \
  "  if (ca_exp(m) < -100) {\n"                                                \
  "    m = m * ca_pow2(CA_PRE);\n"                                             \
  "    n = n * ca_pow2(CA_PRE);\n"                                             \
  "    pre = CA_PRE;\n"                                                        \
  "  }\n"                                                                      \
  "  int e = ca_exp(m);\n"                                                     \
  "  int e1 = e / 2;\n"                                                        \
  "  precise R X = (m * ca_pow2(-e1)) * ca_pow2(e1 - e);\n"                   \
  "  precise R Y = (n * ca_pow2(-e1)) * ca_pow2(e1 - e);\n"                   \
  "  precise R xx = X * X;\n"                                                  \
  "  precise R yy = Y * Y;\n"                                                  \
  "  precise R h = sqrt(xx + yy);\n"                                           \
  "  precise R hh = h * h;\n"                                                  \
  "  precise R d = (((hh - xx) - yy) - ca_sqerr(Y, yy)) + ca_sqerr(h, hh)\n"  \
  "                - ca_sqerr(X, xx);\n"                                       \
  "  h = h - d / (R(2) * h);\n"                                                \
  "  int k = e - pre, k1 = k / 2;\n"                                           \
  "  precise R r = (h * ca_pow2(k1)) * ca_pow2(k - k1);\n"                    \
  "  return r;\n"                                                              \
  "}\n"

/* The common preamble: T the element type, R its real type, and helpers. */
static int preamble(char *s, size_t n, dspk_dtype dt) {
  const char *T = dspk__vk_glsl_type(dt);
  const char *R = is_dbl(dt) ? "double" : "float";
  return snprintf(
      s, n,
      "#version 450\n"
      "layout(local_size_x = %d) in;\n"
      "#define T %s\n#define R %s\n#define CPLX %d\n#define DBL %d\n"
      "T cmul(T a, T b) {\n#if CPLX\n"
      "  return T(a.x*b.x - a.y*b.y, a.x*b.y + a.y*b.x);\n#else\n"
      "  return a*b;\n#endif\n}\n"
      /* map mul's product: each part's two products and their sum rounded,
       * no fused multiply-add (precise), as cpu:0's and fir's one tap */
      "T pmul(T a, T b) {\n#if CPLX\n"
      "  precise R p = a.x * b.x, q = a.y * b.y, u = a.x * b.y, v = a.y * b.x;\n"
      "  return T(p - q, u + v);\n#else\n"
      "  return a*b;\n#endif\n}\n"
      "#if CPLX\n" CABS_GLSL "#endif\n",
      DSPK__VK_WG, T, R, is_cplx(dt), is_dbl(dt));
}

/* exp for map, appended to its kernel's preamble (R the real type, T the
 * element type): rexp(x) of a real, cexp_(z) of a complex.  GLSL's own exp,
 * sin and cos are unfit: Vulkan bounds their error only loosely (sin and cos
 * only on [-pi, pi]), lavapipe's f32 exp flushes subnormal results to zero,
 * and GLSL has none in double.  So everything is arithmetic and integer
 * operations, which Vulkan rounds correctly:
 *  - exp(x) = s 2^k, s a polynomial on |r| <= ln2/2, 2^k applied in three
 *    power-of-two factors so that subnormal and overflowing results round
 *    once;
 *  - sin and cos reduce y by pi/2 with Cody-Waite (three parts of pi/2, the
 *    first two exact in q) for |y| up to 6000 (f32) or 1e6 (f64), and above
 *    with Payne-Hanek on 32-bit integers (umulExtended) against 1280 bits of
 *    2/pi (enough for any f64); the f32 path needs no f64;
 *  - C99's special values (Annex G), as glibc's cexp, which numpy uses.
 * tests/vulkan/test_vk_exp.c measures the error against long double.  A GPU
 * skips the Payne-Hanek branch where a subgroup has no large argument;
 * lavapipe runs both sides of every branch, so there complex exp takes two
 * to three times as long as it did with GLSL's exp, sin and cos. */
static const char EXP_GLSL[] =
    "#if DBL\n"
    "double pow2(int k) { return packDouble2x32(uvec2(0u, uint(k + 1023) << 20)); }\n"
    "R csign(R a, R b) {\n"
    "  uvec2 u = unpackDouble2x32(a);\n"
    "  u.y = (u.y & 0x7fffffffu) | (unpackDouble2x32(b).y & 0x80000000u);\n"
    "  return packDouble2x32(u);\n"
    "}\n"
    "#else\n"
    "float pow2(int k) { return uintBitsToFloat(uint(k + 127) << 23); }\n"
    "R csign(R a, R b) {\n"
    "  uint m = floatBitsToUint(b) & 0x80000000u;\n"
    "  return uintBitsToFloat((floatBitsToUint(a) & 0x7fffffffu) | m);\n"
    "}\n"
    "#endif\n"
    /* s 2^k with k split in three factors of k's sign, so that an intermediate
     * overflows or goes subnormal only when the result does: one rounding. */
    "R scale2(R s, int k) {\n"
    "  int k1 = k / 3, k2 = (k - k1) / 2;\n"
    "  precise R t = s * pow2(k1);\n"
    "  t = t * pow2(k2);\n"
    "  return t * pow2(k - k1 - k2);\n"
    "}\n"
    /* exp(x) = s 2^k with x = k ln2 + r, |r| <= ln2/2 (ln2's head has trailing
     * zeros, so k ln2hi is exact): x finite and clamped to [XLO, XHI]. */
    "#if DBL\n"
    "#define XLO -800.0LF\n"
    "#define XHI 1500.0LF\n"
    "R exp_red(R x, out int k) {\n"
    "  R kf = floor(x * 1.4426950408889634LF + 0.5LF);\n"
    "  precise R r = (x - kf * 6.93147180369123816490e-01LF) - kf * 1.90821492927058770002e-10LF;\n"
    "  k = int(kf);\n"
    "  R p = 1.6059043836821613e-10LF;\n"
    "  p = p * r + 2.0876756987868099e-09LF;\n"
    "  p = p * r + 2.5052108385441720e-08LF;\n"
    "  p = p * r + 2.7557319223985893e-07LF;\n"
    "  p = p * r + 2.7557319223985888e-06LF;\n"
    "  p = p * r + 2.4801587301587302e-05LF;\n"
    "  p = p * r + 1.9841269841269841e-04LF;\n"
    "  p = p * r + 1.3888888888888889e-03LF;\n"
    "  p = p * r + 8.3333333333333332e-03LF;\n"
    "  p = p * r + 4.1666666666666664e-02LF;\n"
    "  p = p * r + 1.6666666666666666e-01LF;\n"
    "  p = p * r + 0.5LF;\n"
    "  return 1.0LF + (r + (r * r) * p);\n"
    "}\n"
    "#else\n"
    "#define XLO -120.0\n"
    "#define XHI 200.0\n"
    "R exp_red(R x, out int k) {\n"
    "  R kf = floor(x * 1.44269504 + 0.5);\n"
    "  precise R r = (x - kf * 0.693359375) - kf * -2.12194440e-4;\n"
    "  k = int(kf);\n"
    "  R p = ((((1.9875691500e-4 * r + 1.3981999507e-3) * r + 8.3334519073e-3) * r\n"
    "          + 4.1665795894e-2) * r + 1.6666665459e-1) * r + 5.0000001201e-1;\n"
    "  return p * (r * r) + r + 1.0;\n"
    "}\n"
    "#endif\n"
    "R rexp(R x) {\n"
    "  if (isnan(x)) return x;\n"
    "  int k;\n"
    "  R s = exp_red(clamp(x, XLO, XHI), k);\n"
    "  return scale2(s, k);\n"
    "}\n"
    "#if CPLX\n"
    /* sin and cos of x, |x| <= pi/4 (a little more is harmless): minimax
     * polynomials (fdlibm's for double, Cephes' for float). */
    "#if DBL\n"
    "T sincos_k(R x) {\n"
    "  R z = x * x, w = z * z;\n"
    "  R rs = 8.33333333332248946124e-03LF + z * (-1.98412698298579493134e-04LF\n"
    "         + z * 2.75573137070700676789e-06LF) + z * w * (-2.50507602534068634195e-08LF\n"
    "         + z * 1.58969099521155010221e-10LF);\n"
    "  R s = x + (z * x) * (-1.66666666666666324348e-01LF + z * rs);\n"
    "  R rc = z * (4.16666666666666019037e-02LF + z * (-1.38888888888741095749e-03LF\n"
    "         + z * 2.48015872894767294178e-05LF)) + w * w * (-2.75573143513906633035e-07LF\n"
    "         + z * (2.08757232129817482790e-09LF + z * -1.13596475577881948265e-11LF));\n"
    "  precise R hz = 0.5LF * z, wc = 1.0LF - hz;\n"
    "  precise R c = wc + (((1.0LF - wc) - hz) + z * rc);\n"
    "  return T(s, c);\n"
    "}\n"
    "#else\n"
    "T sincos_k(R x) {\n"
    "  R z = x * x;\n"
    "  R s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * x + x;\n"
    "  R c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2)\n"
    "        * z * z - 0.5 * z + 1.0;\n"
    "  return T(s, c);\n"
    "}\n"
    "#endif\n"
    /* Word j of the bits of 2/pi (32 a word, most significant first; 0 for j < 0)
     * from a tree of selects: a constant array indexed by a variable costs a
     * private copy per invocation on some drivers, a table in shared memory a
     * barrier, and a switch an if-chain, which lavapipe all makes costly (several
     * times the whole kernel's time there). */
    "uint b2pi(int j) {\n"
    "  if (j < 0) return 0u;\n"
    "  return\n"
    "#if DBL\n"
    "    (j < 20\n"
    "      ? (j < 10\n"
    "        ? (j < 5\n"
    "          ? (j < 2\n"
    "            ? (j < 1 ? 0xa2f9836eu : 0x4e441529u)\n"
    "            : (j < 3 ? 0xfc2757d1u : (j < 4 ? 0xf534ddc0u : 0xdb629599u)))\n"
    "          : (j < 7\n"
    "            ? (j < 6 ? 0x3c439041u : 0xfe5163abu)\n"
    "            : (j < 8 ? 0xdebbc561u : (j < 9 ? 0xb7246e3au : 0x424dd2e0u))))\n"
    "        : (j < 15\n"
    "          ? (j < 12\n"
    "            ? (j < 11 ? 0x06492eeau : 0x09d1921cu)\n"
    "            : (j < 13 ? 0xfe1deb1cu : (j < 14 ? 0xb129a73eu : 0xe88235f5u)))\n"
    "          : (j < 17\n"
    "            ? (j < 16 ? 0x2ebb4484u : 0xe99c7026u)\n"
    "            : (j < 18 ? 0xb45f7e41u : (j < 19 ? 0x3991d639u : 0x835339f4u)))))\n"
    "      : (j < 30\n"
    "        ? (j < 25\n"
    "          ? (j < 22\n"
    "            ? (j < 21 ? 0x9c845f8bu : 0xbdf9283bu)\n"
    "            : (j < 23 ? 0x1ff897ffu : (j < 24 ? 0xde05980fu : 0xef2f118bu)))\n"
    "          : (j < 27\n"
    "            ? (j < 26 ? 0x5a0a6d1fu : 0x6d367ecfu)\n"
    "            : (j < 28 ? 0x27cb09b7u : (j < 29 ? 0x4f463f66u : 0x9e5fea2du))))\n"
    "        : (j < 35\n"
    "          ? (j < 32\n"
    "            ? (j < 31 ? 0x7527bac7u : 0xebe5f17bu)\n"
    "            : (j < 33 ? 0x3d0739f7u : (j < 34 ? 0x8a5292eau : 0x6bfb5fb1u)))\n"
    "          : (j < 37\n"
    "            ? (j < 36 ? 0x1f8d5d08u : 0x56033046u)\n"
    "            : (j < 38 ? 0xfc7b6babu : (j < 39 ? 0xf0cfbc20u : 0x9af4361du))))));\n"
    "#else  // f32 needs words 0 to 6\n"
    "    (j < 3\n"
    "      ? (j < 1 ? 0xa2f9836eu : (j < 2 ? 0x4e441529u : 0xfc2757d1u))\n"
    "      : (j < 5\n"
    "        ? (j < 4 ? 0xf534ddc0u : 0xdb629599u)\n"
    "        : (j < 6 ? 0x3c439041u : 0xfe5163abu)));\n"
    "#endif\n"
    "}\n"
    /* Payne-Hanek reduction of a = m 2^e (m = m1:m0 < 2^53, a >= 2^12): returns q
     * mod 4 and r (|r| <= pi/4) with a = q pi/2 + r + 2 pi n. The product of m by
     * 192 bits of 2/pi (128 for f32) taken from where the bits above only add
     * multiples of 4 leaves an error under 2^-71 quadrant in r. Scalars only:
     * arrays indexed in loops end in private memory on some drivers. mac: (h:r) = w
     * m + hin, h the next word's carry-in. */
    "void mac(uint w, uint m, uint hin, out uint r, out uint h) {\n"
    "  uint l, c;\n"
    "  umulExtended(w, m, h, l);\n"
    "  r = uaddCarry(l, hin, c);\n"
    "  h += c;\n"
    "}\n"
    /* adc: r = a + b + c, c then the carry out (0 or 1). */
    "void adc(uint a, uint b, out uint r, inout uint c) {\n"
    "  uint c1, c2;\n"
    "  r = uaddCarry(a, b, c1);\n"
    "  r = uaddCarry(r, c, c2);\n"
    "  c = c1 + c2;\n"
    "}\n"
    /* Word k of (x shifted left by s bits, 0 <= s < 32), x_k and x_(k-1) given. */
    "#define SHL(xk, xk1, s) (((xk) << (s)) | (((xk1) >> 1) >> (31 - (s))))\n"
    "int reduce_big(uint m1, uint m0, int e, out R r) {\n"
    "  int j0 = (e - 2) >> 5, sh = e - 32 * j0;\n"
    "#if DBL\n"
    "  uint w0 = b2pi(j0 + 5), w1 = b2pi(j0 + 4);\n"
    "#else\n"
    "  uint w0 = 0u, w1 = 0u;  // m < 2^24\n"
    "#endif\n"
    "  uint w2 = b2pi(j0 + 3), w3 = b2pi(j0 + 2), w4 = b2pi(j0 + 1), w5 = b2pi(j0);\n"
    /* a = m0 w, b = m1 w (7 words each), p = a + b 2^32 (8 words). */
    "  uint a0, a1, a2, a3, a4, a5, a6, b0, b1, b2, b3, b4, b5, b6;\n"
    "  mac(w0, m0, 0u, a0, a1); mac(w1, m0, a1, a1, a2); mac(w2, m0, a2, a2, a3);\n"
    "  mac(w3, m0, a3, a3, a4); mac(w4, m0, a4, a4, a5); mac(w5, m0, a5, a5, a6);\n"
    "  mac(w0, m1, 0u, b0, b1); mac(w1, m1, b1, b1, b2); mac(w2, m1, b2, b2, b3);\n"
    "  mac(w3, m1, b3, b3, b4); mac(w4, m1, b4, b4, b5); mac(w5, m1, b5, b5, b6);\n"
    "  uint c = 0u, p1, p2, p3, p4, p5, p6;\n"
    "  adc(a1, b0, p1, c); adc(a2, b1, p2, c); adc(a3, b2, p3, c);\n"
    "  adc(a4, b3, p4, c); adc(a5, b4, p5, c); adc(a6, b5, p6, c);\n"
    /* p 2^(sh - 192): shift left by sh (2..33) puts the point at bit 192; words
     * 2..6 of the result are enough. */
    "  bool ws = sh >= 32;\n"
    "  int s = sh & 31;\n"
    "  uint u1 = ws ? a0 : p1, u2 = ws ? p1 : p2, u3 = ws ? p2 : p3, u4 = ws ? p3 : p4,\n"
    "       u5 = ws ? p4 : p5, u6 = ws ? p5 : p6;\n"
    "  int q = int(SHL(u6, u5, s) & 3u);\n"
    "  uint f3 = SHL(u5, u4, s), f2 = SHL(u4, u3, s), f1 = SHL(u3, u2, s), f0 = SHL(u2, u1, s);\n"
    "  bool neg = (f3 & 0x80000000u) != 0u;\n"
    "  if (neg) { // round to the nearest quadrant: the fraction minus 1\n"
    "    q++;\n"
    "    uint k = 1u;\n"
    "    f0 = uaddCarry(~f0, k, k); f1 = uaddCarry(~f1, k, k);\n"
    "    f2 = uaddCarry(~f2, k, k); f3 = ~f3 + k;\n"
    "  }\n"
    /* Normalize the 128-bit fraction, then multiply its top 64 bits by pi/2 2^62
     * (the integer 0x6487ed5110b4611a): r = that 2^(-62-lz). */
    "  int lz = 0;\n"
    "  if (f3 == 0u) { f3 = f2; f2 = f1; f1 = f0; f0 = 0u; lz = 32; }\n"
    "  if (f3 == 0u) { f3 = f2; f2 = f1; f1 = 0u; lz = 64; }\n"
    "  if (f3 == 0u) { r = R(0); return q & 3; }\n"
    "  int bz = 31 - findMSB(f3);\n"
    "  uint n1 = SHL(f3, f2, bz), n0 = SHL(f2, f1, bz);\n"
    "  lz += bz;\n"
    "  uint h00, l00, h01, l01, h10, l10, h11, l11, ca, cb, cc, cd, ce;\n"
    "  umulExtended(n0, 0x10b4611au, h00, l00);\n"
    "  umulExtended(n0, 0x6487ed51u, h01, l01);\n"
    "  umulExtended(n1, 0x10b4611au, h10, l10);\n"
    "  umulExtended(n1, 0x6487ed51u, h11, l11);\n"
    "  uint t1 = uaddCarry(h00, l01, ca);\n"
    "  t1 = uaddCarry(t1, l10, cb);\n"
    "  uint t2 = uaddCarry(h01, h10, cc);\n"
    "  t2 = uaddCarry(t2, l11, cd);\n"
    "  t2 = uaddCarry(t2, ca + cb, ce);\n"
    "  uint t3 = h11 + cc + cd + ce;\n"
    "#if DBL\n"
    "  r = (double(t3) * 4294967296.0LF + double(t2)) * pow2(-62 - lz);\n"
    "#else\n"
    "  r = float(t3) * pow2(-30 - lz);\n"
    "#endif\n"
    "  if (neg) r = -r;\n"
    "  return q & 3;\n"
    "}\n"
    /* (sin y, cos y) for finite y: Cody-Waite reduction by pi/2 in three parts (the
     * first two exact in q up to MEDIUM), Payne-Hanek above. */
    "#if DBL\n"
    "#define MEDIUM 1.0e6LF\n"
    "#else\n"
    "#define MEDIUM 6000.0\n"
    "#endif\n"
    "T sincos_r(R y) {\n"
    "  int q;\n"
    "  precise R r;\n"
    "  if (abs(y) <= MEDIUM) {\n"
    "#if DBL\n"
    "    R qf = floor(y * 0.63661977236758134LF + 0.5LF);\n"
    "    r = ((y - qf * 1.57079632673412561417LF) - qf * 6.07710050630396597660e-11LF)\n"
    "        - qf * 2.02226624879595063154e-21LF;\n"
    "#else\n"
    "    R qf = floor(y * 0.63661977 + 0.5);\n"
    "    r = ((y - qf * 1.57080078125) - qf * -4.45358455181121826171875e-6)\n"
    "        - qf * -8.705516e-10;\n"
    "#endif\n"
    "    q = int(qf);\n"
    "  } else {\n"
    "#if DBL\n"
    "    uvec2 u = unpackDouble2x32(abs(y));\n"
    "    q = reduce_big((u.y & 0xfffffu) | 0x100000u, u.x, int(u.y >> 20) - 1075, r);\n"
    "#else\n"
    "    uint u = floatBitsToUint(abs(y));\n"
    "    q = reduce_big(0u, (u & 0x7fffffu) | 0x800000u, int(u >> 23) - 150, r);\n"
    "#endif\n"
    "    if (y < R(0)) { q = -q; r = -r; }\n"
    "  }\n"
    "  T sc = sincos_k(r);\n"
    "  switch (q & 3) {\n"
    "  case 0: return sc;\n"
    "  case 1: return T(sc.y, -sc.x);\n"
    "  case 2: return -sc;\n"
    "  default: return T(-sc.y, sc.x);\n"
    "  }\n"
    "}\n"
    /* s c 2^k rounded once: a tiny c (sin of a tiny y) is scaled up first. */
    "R mulscale(R s, R c, int k) {\n"
    "#if DBL\n"
    "  if (abs(c) < pow2(-500)) { c *= pow2(550); k -= 550; }\n"
    "#else\n"
    "  if (abs(c) < pow2(-60)) { c *= pow2(64); k -= 64; }\n"
    "#endif\n"
    "  return scale2(s * c, k);\n"
    "}\n"
    "#define NAN R(uintBitsToFloat(0x7fc00000u))\n"
    /* exp of a complex, with C99's (Annex G) special values, as glibc's cexp. */
    "T cexp_(T z) {\n"
    "  R x = z.x, y = z.y;\n"
    "  if (y == R(0)) return T(rexp(x), y);\n"
    "  T sc = sincos_r(y);  // once: lavapipe runs both sides of a branch\n"
    "  if (isinf(x)) {\n"
    "    if (isinf(y) || isnan(y)) return x < R(0) ? T(R(0), csign(R(0), y)) : T(x, NAN);\n"
    "    R v = x < R(0) ? R(0) : x;\n"
    "    return T(csign(v, sc.y), csign(v, sc.x));\n"
    "  }\n"
    "  if (isnan(x) || isnan(y) || isinf(y)) return T(NAN);\n"
    "  int k;\n"
    "  R s = exp_red(clamp(x, XLO, XHI), k);\n"
    "  return T(mulscale(s, sc.y, k), mulscale(s, sc.x, k));\n"
    "}\n"
    "#endif\n";

static uint32_t groups_for(uint64_t n, uint32_t per) {
  uint64_t g = (n + per - 1) / per;
  if (g == 0)
    g = 1;
  return g > DSPK__VK_MAX_GROUPS ? DSPK__VK_MAX_GROUPS : (uint32_t)g;
}

static int need_dtype(struct dspk__dev *d, dspk_dtype dt, struct dspk__opctx *ctx,
                      const char *op) {
  if (!dspk__vk_glsl_type(dt))
    return dspk__vk_fail(ctx, DSPK_EDTYPE, "%s: dtype %s is not supported on vulkan",
                         op, dspk__dtype_name(dt));
  if (is_dbl(dt) && !d->has_f64)
    return dspk__vk_fail(ctx, DSPK_EDTYPE,
                         "%s: this Vulkan device lacks shaderFloat64 (dtype %s)", op,
                         dspk__dtype_name(dt));
  return 0;
}

/* Binds the n tensors t, or fails the op naming the first that cannot be
 * bound by names[i], its name in protocol.md ("map's A", "fir's H"). */
static int bind_all(struct dspk__dev *d, const struct dspk__tensor *const *t,
                    const char *const *names, int n, struct dspk__vk_bind *b, uint32_t *elem,
                    struct dspk__opctx *ctx) {
  for (int i = 0; i < n; i++) {
    int r = dspk__vk_bind_named(d, t[i], &b[i], &elem[i], ctx, names[i]);
    if (r)
      return r;
  }
  return 0;
}

static int too_big(int64_t n, struct dspk__opctx *ctx, const char *op) {
  if (n > (int64_t)UINT32_MAX - 1024)
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "%s: %lld elements (the vulkan backend indexes "
                                           "with 32 bits)",
                         op, (long long)n);
  return 0;
}

/* One of the kernels below, ready to dispatch: compiled (or found in the
 * cache) with its tensors bound; e holds each tensor's first element. */
struct ready {
  struct dspk__vk_kernel *kern;
  struct dspk__vk_bind b[3];
  uint32_t e[3];
  int nb;
};

/* Readies the kernel name: the preamble of dt, then fmt's GLSL; nb (at most
 * 3) storage buffers bound to the tensors t (named by tn in an error, as
 * bind_all), pclen bytes of push constants. */
static int prepare(struct dspk__dev *d, struct dspk__opctx *ctx, struct ready *k,
                   const char *name, dspk_dtype dt, const struct dspk__tensor *const *t,
                   const char *const *tn, int nb, size_t pclen, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));
static int prepare(struct dspk__dev *d, struct dspk__opctx *ctx, struct ready *k,
                   const char *name, dspk_dtype dt, const struct dspk__tensor *const *t,
                   const char *const *tn, int nb, size_t pclen, const char *fmt, ...) {
  char src[16384];
  int n = preamble(src, sizeof src, dt), r;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(src + n, sizeof src - n, fmt, ap);
  va_end(ap);
  if (m < 0 || (size_t)m >= sizeof src - n)
    return dspk__vk_fail(ctx, DSPK_EINTERNAL, "%s: kernel source too long", name);
  k->nb = nb;
  if ((r = dspk__vk_kernel(d, name, src, NULL, 0, "main", nb, pclen, &k->kern, ctx)))
    return r;
  return bind_all(d, t, tn, nb, k->b, k->e, ctx);
}

/* ---- map ------------------------------------------------------------------ */

int dspk__vk_map(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  dspk_dtype dt = op->in[0].dtype;
  int r = need_dtype(d, dt, ctx, "map");
  int64_t n = dspk__tensor_numel(&op->in[0]);
  if (r || (r = too_big(n, ctx, "map")))
    return r;
  int bin = op->nin == 2, is_exp = op->u.map.fn == DSPK_MAP_EXP;
  const char *expr;
  switch (op->u.map.fn) {
  case DSPK_MAP_ADD: expr = "a[pc.oa+i] + b[pc.ob+i]"; break;
  case DSPK_MAP_SUB: expr = "a[pc.oa+i] - b[pc.ob+i]"; break;
  case DSPK_MAP_MUL: expr = "pmul(a[pc.oa+i], b[pc.ob+i])"; break;
  case DSPK_MAP_SCALE: expr = "pc.alpha * a[pc.oa+i]"; break;
  case DSPK_MAP_AXPY: expr = "pc.alpha * a[pc.oa+i] + b[pc.ob+i]"; break;
  case DSPK_MAP_ABS: expr = is_cplx(dt) ? "cabs(a[pc.oa+i])" : "abs(a[pc.oa+i])"; break;
  case DSPK_MAP_EXP:
    expr = is_cplx(dt) ? "cexp_(a[pc.oa+i])" : "rexp(a[pc.oa+i])";
    break;
  default: return dspk__vk_fail(ctx, DSPK_ENOTSUP, "map: unknown function");
  }
  const struct dspk__tensor *t[3] = {&op->in[0], bin ? &op->in[1] : &op->out[0],
                                     &op->out[0]};
  const char *tn[3] = {"map's A", bin ? "map's B" : "map's output", "map's output"};
  struct ready kr;
  r = prepare(d, ctx, &kr, "map", dt, t, tn, bin ? 3 : 2, 24,
              "%s"
              "layout(std430, binding = 0) buffer BA { T a[]; };\n"
              "%s"
              "layout(std430, binding = %d) buffer BO { %s o[]; };\n"
              "layout(push_constant) uniform PC { uint n, oa, ob, oo; R alpha; } pc;\n"
              "void main() {\n"
              "  uint stride = gl_NumWorkGroups.x * %du;\n"
              "  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride)\n"
              "    o[pc.oo+i] = %s;\n}\n",
              is_exp ? EXP_GLSL : "",
              bin ? "layout(std430, binding = 1) buffer BB { T b[]; };\n" : "", bin ? 2 : 1,
              op->u.map.fn == DSPK_MAP_ABS ? (is_dbl(dt) ? "double" : "float") : "T",
              DSPK__VK_WG, expr);
  if (r)
    return r;
  struct {
    uint32_t n, oa, ob, oo;
    union { float f; double d; } alpha;
  } pc = {(uint32_t)n, kr.e[0], bin ? kr.e[1] : 0, bin ? kr.e[2] : kr.e[1], {0}};
  if (is_dbl(dt))
    pc.alpha.d = op->u.map.alpha;
  else
    pc.alpha.f = (float)op->u.map.alpha;
  if (n == 0)
    return 0;
  return dspk__vk_dispatch(d, kr.kern, kr.b, kr.nb, &pc, sizeof pc,
                           groups_for((uint64_t)n, DSPK__VK_WG), 1, 1);
}

/* ---- reduce ------------------------------------------------------------- */

/* How an invocation folds its elements into (v, c): max and min with
 * COMB; sum and mean with compensated summation (Knuth's TwoSum: c gathers
 * the rounding error of every addition, added back at the end), so that a
 * long run of small addends after a large one is not lost, as it was when
 * each invocation kept one running total in the dtype ([2^24, 1 x 1000] in
 * f32 summed to 2^24).  `precise` keeps the compiler from simplifying the
 * error terms away.  kfin gives v + c, or v alone where that is NaN: an
 * infinite or NaN v has NaN error terms (c is finite while v is, since v
 * stays infinite or NaN once it is), and an infinite v must stay one.
 * Each invocation's compensated total is then combined pairwise across the
 * workgroup (a tree of log2(DSPK__VK_WG) levels) and with the partial the
 * previous slice left, so the error of a sum of n values is about
 * (log2(DSPK__VK_WG) + 2 + n / RED_SLICE) units of rounding of the sum of
 * their magnitudes (docs/protocol.md, reduce). */
static const char RED_PLAIN[] =
    "void kadd(inout T v, inout T c, T x) { v = COMB(v, x); }\n"
    "T kfin(T v, T c) { return v; }\n";
static const char RED_KAHAN[] =
    "void kadd(inout T v, inout T c, T x) {\n"
    "  precise T t = v + x;\n"
    "  precise T z = t - v;\n"
    "  precise T e = (v - (t - z)) + (x - z);\n"
    "  c += e; v = t;\n"
    "}\n"
    "T kfin(T v, T c) { precise T r = v + c; return mix(r, v, isnan(r)); }\n";

/* The reduce kernels' push constants. */
struct red_pc {
  uint32_t nout, nred, rk, rr, ox, oo, r0, rn, gx, first, last, pad;
  uint32_t dim[DSPK_MAX_RANK], str[DSPK_MAX_RANK];
};

static void red_slice(void *pc_, uint64_t r0, uint64_t rn, uint64_t n) {
  struct red_pc *pc = pc_;
  pc->r0 = (uint32_t)r0;
  pc->rn = (uint32_t)rn;
  pc->first = r0 == 0;
  pc->last = r0 + rn >= n;
}

int dspk__vk_reduce(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  dspk_dtype dt = X->dtype;
  int r = need_dtype(d, dt, ctx, "reduce");
  if (r || (r = too_big(dspk__tensor_numel(X), ctx, "reduce")))
    return r;
  uint32_t axes = op->u.reduce.axes;
  if (axes == 0)
    axes = X->rank ? (uint32_t)((1ull << X->rank) - 1) : 0;
  struct red_pc pc;
  memset(&pc, 0, sizeof pc);
  int64_t stride[DSPK_MAX_RANK], s = 1;
  for (int i = X->rank - 1; i >= 0; i--) {
    stride[i] = s;
    s *= X->shape[i];
  }
  uint64_t nout = 1, nred = 1;
  int j = 0;
  for (int i = 0; i < X->rank; i++)
    if (!(axes & (1u << i))) {
      pc.dim[j] = (uint32_t)X->shape[i];
      pc.str[j++] = (uint32_t)stride[i];
      nout *= (uint64_t)X->shape[i];
    }
  pc.rk = (uint32_t)j;
  for (int i = 0; i < X->rank; i++)
    if (axes & (1u << i)) {
      pc.dim[j] = (uint32_t)X->shape[i];
      pc.str[j++] = (uint32_t)stride[i];
      nred *= (uint64_t)X->shape[i];
    }
  pc.rr = (uint32_t)j - pc.rk;
  pc.nout = (uint32_t)nout;
  pc.nred = (uint32_t)nred;
  const char *init, *comb, *fin;
  int sum = 0;
  switch (op->u.reduce.fn) {
  case DSPK_REDUCE_SUM: init = "T(0)"; comb = "(A) + (B)"; fin = "v"; sum = 1; break;
  case DSPK_REDUCE_MEAN: init = "T(0)"; comb = "(A) + (B)"; fin = "v / R(pc.nred)"; sum = 1; break;
  case DSPK_REDUCE_MAX:
    init = "T(uintBitsToFloat(0xff800000u))"; comb = "(isnan(A) || (A) >= (B)) ? (A) : (B)"; fin = "v"; break;
  case DSPK_REDUCE_MIN:
    init = "T(uintBitsToFloat(0x7f800000u))"; comb = "(isnan(A) || (A) <= (B)) ? (A) : (B)"; fin = "v"; break;
  default: return dspk__vk_fail(ctx, DSPK_ENOTSUP, "reduce: unknown function");
  }
  const struct dspk__tensor *t[2] = {X, &op->out[0]};
  static const char *const tn[2] = {"reduce's X", "reduce's output"};
  struct ready kr;
  /* Short reductions (fewer than RED_THREAD_MAX elements per output): one
   * invocation per output, which folds them alone; longer ones: one
   * workgroup per output (below). */
  int per_thread = nred < RED_THREAD_MAX;
  if (per_thread)
    r = prepare(d, ctx, &kr, "reduce_t", dt, t, tn, 2, sizeof pc,
                "layout(std430, binding = 0) buffer BX { T x[]; };\n"
                "layout(std430, binding = 1) buffer BO { T o[]; };\n"
                "layout(push_constant) uniform PC { uint nout, nred, rk, rr, ox, oo, r0, rn,\n"
                "  gx, first, last, p0; uint dim[8]; uint str[8]; } pc;\n"
                "#define COMB(A, B) %s\n"
                "%s"
                "void main() {\n"
                "  uint oi = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du +\n"
                "            gl_LocalInvocationID.x;\n"
                "  if (oi >= pc.nout) return;\n"
                "  uint rem = oi, base = pc.ox;\n"
                "  for (int j = int(pc.rk) - 1; j >= 0; j--) {\n"
                "    base += (rem %% pc.dim[j]) * pc.str[j]; rem /= pc.dim[j]; }\n"
                "  T v = %s, c = T(0);\n"
                "  for (uint ri = pc.r0; ri < pc.r0 + pc.rn; ri++) {\n"
                "    uint rr = ri, off = base;\n"
                "    for (int j = int(pc.rk + pc.rr) - 1; j >= int(pc.rk); j--) {\n"
                "      off += (rr %% pc.dim[j]) * pc.str[j]; rr /= pc.dim[j]; }\n"
                "    kadd(v, c, x[off]);\n"
                "  }\n"
                "  v = kfin(v, c);\n"
                "  if (pc.first == 0u) { T p = o[pc.oo + oi]; v = COMB(p, v); }\n"
                "  o[pc.oo + oi] = pc.last != 0u ? %s : v;\n}\n",
                comb, sum ? RED_KAHAN : RED_PLAIN, DSPK__VK_WG, init, fin);
  else
    r = prepare(d, ctx, &kr, "reduce", dt, t, tn, 2, sizeof pc,
                "layout(std430, binding = 0) buffer BX { T x[]; };\n"
                "layout(std430, binding = 1) buffer BO { T o[]; };\n"
                "layout(push_constant) uniform PC { uint nout, nred, rk, rr, ox, oo, r0, rn,\n"
                "  gx, first, last, p0; uint dim[8]; uint str[8]; } pc;\n"
                "#define COMB(A, B) %s\n"
                "%s"
                "shared T s[%d];\n"
                "void main() {\n"
                "  uint lid = gl_LocalInvocationID.x;\n"
                "  uint oi = gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x;\n"
                "  if (oi < pc.nout) {\n"
                "    uint rem = oi, base = pc.ox;\n"
                "    for (int j = int(pc.rk) - 1; j >= 0; j--) {\n"
                "      base += (rem %% pc.dim[j]) * pc.str[j]; rem /= pc.dim[j]; }\n"
                "    T acc = %s, c = T(0);\n"
                "    for (uint ri = pc.r0 + lid; ri < pc.r0 + pc.rn; ri += %du) {\n"
                "      uint rr = ri, off = base;\n"
                "      for (int j = int(pc.rk + pc.rr) - 1; j >= int(pc.rk); j--) {\n"
                "        off += (rr %% pc.dim[j]) * pc.str[j]; rr /= pc.dim[j]; }\n"
                "      kadd(acc, c, x[off]);\n"
                "    }\n"
                "    s[lid] = kfin(acc, c);\n"
                "    barrier();\n"
                "    for (uint st = %du; st > 0u; st >>= 1) {\n"
                "      if (lid < st) s[lid] = COMB(s[lid], s[lid + st]);\n"
                "      barrier();\n"
                "    }\n"
                "    if (lid == 0u) {\n"
                "      T v = s[0];\n"
                "      if (pc.first == 0u) { T p = o[pc.oo + oi]; v = COMB(p, v); }\n"
                "      o[pc.oo + oi] = pc.last != 0u ? %s : v;\n"
                "    }\n"
                "  }\n}\n",
                comb, sum ? RED_KAHAN : RED_PLAIN, DSPK__VK_WG, init, DSPK__VK_WG,
                DSPK__VK_WG / 2, fin);
  if (r)
    return r;
  pc.ox = kr.e[0];
  pc.oo = kr.e[1];
  if (nout == 0)
    return 0;
  /* Workgroups (of outputs, or one per output) on a 2-D grid so that any
   * count fits the dispatch limits; the reduced elements go in slices of at
   * most RED_SLICE (RED_THREAD_SLICE) per dispatch, each combined into the output the previous one
   * left (the mean divides after the last).  Every invocation thus loops a
   * bounded number of times whatever the size: lavapipe (llvmpipe) stops any
   * shader invocation's loops after 65535 iterations in all, silently. */
  uint64_t ng = per_thread ? (nout + DSPK__VK_WG - 1) / DSPK__VK_WG : nout;
  uint32_t gx, gy;
  if ((r = dspk__vk_grid2d(d, ng, &gx, &gy, "reduce", nout, "outputs", ctx)))
    return r;
  pc.gx = gx;
  return dspk__vk_dispatch_sliced(d, kr.kern, kr.b, kr.nb, &pc, sizeof pc, gx, gy, nred,
                                  per_thread ? RED_THREAD_SLICE : RED_SLICE, red_slice);
}

/* ---- fir ---------------------------------------------------------------- */

/* The direct fir kernel's push constants 6, 7 and 9: the taps [c0, c1) of
 * this dispatch, and whether it is the first. */
static void fir_slice(void *pc_, uint64_t r0, uint64_t rn, uint64_t n) {
  uint32_t *pc = pc_;
  (void)n;
  pc[6] = (uint32_t)r0;
  pc[7] = (uint32_t)(r0 + rn);
  pc[9] = r0 == 0;
}

/* fir's tensors X, H and the output, in both of its kernels, as
 * protocol.md names them. */
static const char *const fir_names[3] = {"fir's X", "fir's H", "fir's output"};

#define GLSL_NUM_(x) #x
#define GLSL_NUM(x) GLSL_NUM_(x)
#define WG_U GLSL_NUM(DSPK__VK_WG) "u"

/* The direct sum of fir, in both of its kernels (the direct one and the
 * repair): output t of the row starting at x[pc.ox + o], over the taps
 * [pc.c0, pc.c1) read through the shared hs in chunks of DSPK__VK_WG.
 * Every invocation of the workgroup calls it (its barriers), live or not;
 * only a live one sums. */
#define FIR_SUM_GLSL \
    "T fir_sum(uint lid, uint o, uint t, bool live) {\n" \
    "  T acc = T(0);\n" \
    "  for (uint c = pc.c0; c < pc.c1; c += " WG_U ") {\n" \
    "    barrier();\n" \
    "    if (c + lid < pc.k) hs[lid] = h[pc.oh + c + lid];\n" \
    "    barrier();\n" \
    "    uint kend = min(pc.k - c, " WG_U ");\n" \
    "    if (live && t >= c) {\n" \
    "      uint jmax = min(kend, t - c + 1u);\n" \
    "      for (uint j = 0u; j < jmax; j++)\n" \
    "        acc += cmul(hs[j], x[pc.ox + o + t - c - j]);\n" \
    "    }\n" \
    "  }\n" \
    "  return acc;\n" \
    "}\n"

/* The direct kernel (vk_fir.c chooses between it and FFT convolution). */
/* Multiply-adds of one piece of the direct fir: the outputs go to the
 * device in pieces of about this much work, each submitted once the one
 * before the last has run, and a cancel is seen between them (about 0.1 to
 * 0.5 s of lavapipe on a 2-core machine; a GPU's pieces are larger so that
 * it never idles between them).  The test hooks DSPK_VK_FIR_PIECE (the
 * piece's multiply-adds) and DSPK_VK_FIR_CANCEL_AFTER (a cancel raised once
 * that many pieces were submitted) make the cancel check testable. */
#define FIR_PIECE_CPU ((uint64_t)1 << 28)
#define FIR_PIECE_GPU ((uint64_t)1 << 34)

int dspk__vk_fir_direct(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  dspk_dtype dt = X->dtype;
  int r = need_dtype(d, dt, ctx, "fir");
  int64_t total = dspk__tensor_numel(X);
  if (r || (r = too_big(total, ctx, "fir")))
    return r;
  const struct dspk__tensor *t[3] = {X, H, &op->out[0]};
  struct ready kr;
  /* One output sample per invocation, on a 2-D grid of workgroups (any
   * count fits the dispatch limits), the outputs [i0, end) of a piece per
   * dispatch; the taps go through shared memory in chunks so each
   * workgroup reads them once per chunk, and in slices of FIR_TAP_SLICE
   * per dispatch, each adding to the output the previous left, so that no
   * invocation loops long (lavapipe silently ends an invocation's loops
   * after 65535 iterations in all). */
  r = prepare(d, ctx, &kr, "fir", dt, t, fir_names, 3, 44,
              "layout(std430, binding = 0) buffer BX { T x[]; };\n"
              "layout(std430, binding = 1) buffer BH { T h[]; };\n"
              "layout(std430, binding = 2) buffer BY { T y[]; };\n"
              "layout(push_constant) uniform PC { uint total, n, k, ox, oh, oy, c0, c1, gx,\n"
              "  first, i0; } pc;\n"
              "shared T hs[%d];\n"
              "%s"
              /* one tap: H[0]*X exactly, each part's products and sum rounded (no fused
               * multiply-add, no sum from +0: a -0 tap gives -0) */
              "T mul1(T a, T b) {\n#if CPLX\n"
              "  precise R p = a.x * b.x, q = a.y * b.y, u = a.x * b.y, v = a.y * b.x;\n"
              "  return T(p - q, u + v);\n#else\n"
              "  return a * b;\n#endif\n}\n"
              "void main() {\n"
              "  uint lid = gl_LocalInvocationID.x;\n"
              "  uint i = pc.i0 + (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * %du + lid;\n"
              "  bool live = i < pc.total;\n"
              "  uint t = live ? i %% pc.n : 0u, row = live ? i - t : 0u;\n"
              "  T acc = fir_sum(lid, row, t, live);\n"
              "  if (live) y[pc.oy + i] = pc.k == 1u ? mul1(h[pc.oh], x[pc.ox + i])\n"
              "                         : pc.first != 0u ? acc : y[pc.oy + i] + acc;\n"
              "}\n",
              DSPK__VK_WG, FIR_SUM_GLSL, DSPK__VK_WG);
  if (r)
    return r;
  /* (Taps past the row's length never reach an output.)  k is 1 for one
   * tap only (the kernel's H[0]*X): a row of one sample under more taps
   * keeps 2, its output a sum as any other. */
  int64_t n = X->shape[X->rank - 1];
  uint32_t k = (uint32_t)(H->shape[0] < n ? H->shape[0] : n);
  if (k == 1 && H->shape[0] > 1)
    k = 2;
  uint32_t pc[11] = {0, (uint32_t)n, k, kr.e[0], kr.e[1], kr.e[2], 0, 0, 0, 0, 0};
  if (total == 0)
    return 0;
  uint64_t piece = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? FIR_PIECE_CPU
                                                                      : FIR_PIECE_GPU;
  const char *hp = DSPK_TEST_HOOK("DSPK_VK_FIR_PIECE");
  const char *hc = DSPK_TEST_HOOK("DSPK_VK_FIR_CANCEL_AFTER");
  if (hp && atoll(hp) > 0)
    piece = (uint64_t)atoll(hp);
  /* The outputs of a piece: about piece / k (each output k multiply-adds
   * at most), whole workgroups, at least one. */
  uint64_t per = piece / (k ? k : 1) / DSPK__VK_WG * DSPK__VK_WG;
  if (per < DSPK__VK_WG)
    per = DSPK__VK_WG;
  int npieces = 0;
  for (uint64_t i0 = 0; i0 < (uint64_t)total; i0 += per) {
    uint64_t cnt = (uint64_t)total - i0 < per ? (uint64_t)total - i0 : per;
    uint32_t gx, gy;
    if ((r = dspk__vk_grid2d(d, (cnt + DSPK__VK_WG - 1) / DSPK__VK_WG, &gx, &gy, "fir",
                             (uint64_t)total, "outputs", ctx)))
      return r;
    pc[0] = (uint32_t)(i0 + cnt);
    pc[8] = gx;
    pc[10] = (uint32_t)i0;
    if ((r = dspk__vk_dispatch_sliced(d, kr.kern, kr.b, kr.nb, pc, sizeof pc, gx, gy, k,
                                      FIR_TAP_SLICE, fir_slice)))
      return r;
    if (i0 + cnt >= (uint64_t)total)
      break;
    /* The piece to the device, a cancel seen once the one before it ran. */
    if ((r = dspk__vk_piece_end(d, ctx, hc, &npieces)))
      return r;
  }
  return 0;
}

/* The repair of fir's overlap-save output (vk_fir.c): the direct sum on
 * the segments listed in fl (see DSPK__VK_FL_HEAD: each segment, row*nb +
 * block, S outputs), overwriting them.  Workgroup w of G takes the pairs
 * (listed segment, chunk of DSPK__VK_WG outputs) w, w+G, ..., G being
 * min(pairs, cap) as the lister left it in fl[0] for an indirect
 * dispatch: none at all when nothing is listed.  The cap stays small on
 * hardware (FIX_GROUPS); lavapipe, which silently ends an invocation's
 * loops after 65535 iterations in all, gets up to 65535 and fewer taps per
 * dispatch when a workgroup may have more than one pair (counted for every
 * segment listed, the most there can be).  The test hook
 * DSPK_VK_FIR_FIX_GROUPS sets a smaller cap (tests: workgroups that take
 * several pairs, taps in several dispatches). */
#define FIX_GROUPS 512u
const char dspk__vk_fl_glsl[] =
    "void fl_clear(uint i, uint nblk) {\n"
    "  if (i < 4u + nblk) fl[i] = i == 1u || i == 2u ? 1u : 0u;\n"
    "}\n"
    "void fl_list(uint g, uint nblk, uint S, uint cap) {\n"
    "  if (atomicOr(fl[4u + g], 1u) != 0u) return;\n"
    "  uint q = atomicAdd(fl[3], 1u);\n"
    "  fl[4u + nblk + q] = g;\n"
    "  atomicMax(fl[0], min((q + 1u) * ((S + 255u) / 256u), cap));\n"
    "}\n";
_Static_assert(DSPK__VK_WG == 256, "dspk__vk_fl_glsl's chunks of DSPK__VK_WG outputs");

uint32_t dspk__vk_fir_fix_groups(const struct dspk__dev *d, uint32_t S, uint32_t nblk) {
  uint64_t pairs = (uint64_t)nblk * ((S + DSPK__VK_WG - 1) / DSPK__VK_WG);
  uint64_t g = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? DSPK__VK_MAX_GROUPS
                                                                   : FIX_GROUPS;
  const char *hook = DSPK_TEST_HOOK("DSPK_VK_FIR_FIX_GROUPS");
  if (hook && atoi(hook) > 0)
    g = (uint64_t)atoi(hook);
  if (g > pairs)
    g = pairs ? pairs : 1;
  return (uint32_t)g;
}

/* The repair kernel's source after the preamble: the same for every dtype
 * (the preamble defines T), made once. */
static const char fir_fix_glsl[] =
    "layout(std430, binding = 0) readonly buffer BX { T x[]; };\n"
    "layout(std430, binding = 1) readonly buffer BH { T h[]; };\n"
    "layout(std430, binding = 2) buffer BY { T y[]; };\n"
    "layout(std430, binding = 3) readonly buffer BF { uint fl[]; };\n"
    "layout(push_constant) uniform PC { uint total, n, k, ox, oh, oy, c0, c1, chunks,\n"
    "  first, S, nb, nblk; } pc;\n"
    "shared T hs[" GLSL_NUM(DSPK__VK_WG) "];\n"
    FIR_SUM_GLSL
    "void main() {\n"
    "  uint lid = gl_LocalInvocationID.x, pairs = fl[3] * pc.chunks;\n"
    "  for (uint w = gl_WorkGroupID.x; w < pairs; w += gl_NumWorkGroups.x) {\n"
    "    uint q = w / pc.chunks, seg = fl[4u + pc.nblk + q];\n"
    "    uint row = seg / pc.nb, j0 = (w - q * pc.chunks) * " WG_U " + lid;\n"
    "    uint t = (seg - row * pc.nb) * pc.S + j0, o = row * pc.n;\n"
    "    bool live = j0 < pc.S && t < pc.n;\n"
    "    T acc = fir_sum(lid, o, t, live);\n"
    "    if (live) y[pc.oy + o + t] = pc.first != 0u ? acc : y[pc.oy + o + t] + acc;\n"
    "  }\n"
    "}\n";

int dspk__vk_fir_fixup(struct dspk__dev *d, struct dspk__op *op, const struct dspk__vk_bind *fl,
                       uint32_t S, uint32_t nb, uint32_t nblk, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  const struct dspk__tensor *t[3] = {X, H, &op->out[0]};
  dspk_dtype dt = X->dtype;
  struct dspk__vk_kmemo *memo = &d->fir_fix[dt];
  struct dspk__vk_kernel *kern = dspk__vk_kmemo_get(d, memo);
  struct dspk__vk_bind b[4];
  uint32_t e[3];
  int r;
  /* The kernel is looked for in the device's table (its source made and
   * hashed) only the first time, or when the table evicted it. */
  if (!kern) {
    char src[8192];
    int at = preamble(src, sizeof src, dt);
    snprintf(src + at, sizeof src - (size_t)at, "%s", fir_fix_glsl);
    if ((r = dspk__vk_kernel(d, "fir.fix", src, NULL, 0, "main", 4, 52, &kern, ctx)))
      return r;
    dspk__vk_kmemo_set(memo, kern);
  }
  if ((r = bind_all(d, t, fir_names, 3, b, e, ctx)))
    return r;
  b[3] = *fl;
  int64_t n = X->shape[X->rank - 1];
  uint32_t k = (uint32_t)(H->shape[0] < n ? H->shape[0] : n);
  uint32_t chunks = (S + DSPK__VK_WG - 1) / DSPK__VK_WG;
  uint64_t pairs = (uint64_t)nblk * chunks, g = dspk__vk_fir_fix_groups(d, S, nblk);
  uint64_t per = (pairs + g - 1) / g, slice = FIR_TAP_SLICE;
  if (d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU && per > 1)
    slice = FIR_TAP_SLICE / per / DSPK__VK_WG * DSPK__VK_WG;
  if (slice < DSPK__VK_WG)
    slice = DSPK__VK_WG;
  uint32_t pc[13] = {0, (uint32_t)n, k, e[0], e[1], e[2], 0, 0, chunks, 0, S, nb, nblk};
  struct dspk__vk_bind args = {fl->buf, fl->off, 12};
  /* (as dspk__vk_dispatch_sliced, with the groups the lister counted) */
  for (uint64_t r0 = 0; r0 < k; r0 += slice) {
    fir_slice(pc, r0, k - r0 < slice ? k - r0 : slice, k);
    if ((r = dspk__vk_dispatch_indirect(d, kern, b, 4, pc, sizeof pc, &args)))
      return r;
  }
  return 0;
}

/* ---- raw kernels ------------------------------------------------------------ */

/* A tensor argument with no elements cannot be bound as itself: Vulkan
 * has no empty descriptor range, and the smallest range at its place
 * would be bytes past its end (another tensor's, in a shared buffer).  It
 * is bound to 4 bytes of a zeroed scratch block of the op's own (the
 * first of struct kscratch, allocated at the first such argument, freed
 * behind the work): a shader's .length() reads 4 bytes over its array's
 * stride (1 for 32-bit elements, 0 for 64-bit ones), loads read zeros (or
 * what the kernel stored there) and stores land in the scratch block.
 *
 * A buffer imported in place (a client's shared memory, import_host) whose
 * size is not a multiple of 4 cannot be bound as itself either: a binding
 * is rounded up to whole words, and the words past its size in the
 * mapping are the client's file (protocol.md: that rounding is zero, and
 * stores there reach nothing).  The kernel sees such a buffer through a
 * copy of the op's own (its bytes, then zeros to the next word): every
 * argument over that buffer is bound to the copy, so arguments over the
 * same bytes still see each other's stores, and the copy's first `size`
 * bytes go back to the buffer after the dispatch.
 *
 * A tensor whose place is not a multiple of the device's
 * minStorageBufferOffsetAlignment (a slice of a client's shared array at a
 * multiple of its item size, protocol.md) cannot be bound at its first
 * element either: a raw kernel indexes its array from 0, with no offset of
 * ours as the built-in ops take.  It is staged: copied from its buffer into
 * a block of the op's own (zeroed first: the binding's padding to 4 bytes
 * reads zero, never a block's earlier bytes), bound there, and copied back
 * over the tensor after the dispatch, after the padded copies above went
 * back (the kernel may write any of its tensors), all in order on the
 * queue; a tensor named by several arguments is staged once. */
struct kpad {
  struct dspk__mem *buf, *copy;
};
struct kstage {
  int n;
  int tensor[DSPK__VK_MAX_BIND];            /* op->in index */
  struct dspk__mem *mem[DSPK__VK_MAX_BIND]; /* its block, freed behind the work */
};
struct kscratch {
  struct dspk__mem *empty;
  struct dspk__mem *zero; /* 16 zero bytes: the source of zero_padding */
  struct kpad pad[DSPK__VK_MAX_BIND];
  int npad;
  struct kstage st;
};

static int kernel_op(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx,
                     struct kscratch *ks);

/* Records a copy of n bytes from the start of block s to the start of
 * block t into the open command buffer, followed by a barrier. */
static int copy_blocks(struct dspk__dev *d, struct dspk__mem *s, struct dspk__mem *t,
                       size_t n) {
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  VkBufferCopy c = {.srcOffset = s->off, .dstOffset = t->off, .size = n};
  VK(CmdCopyBuffer)(cb, s->buf, t->buf, 1, &c);
  dspk__vk_barrier(d);
  return 0;
}

/* The block a tensor over m is bound to: m, or the padded copy of an
 * imported m of a size not a multiple of 4 (made at its first use). */
static int bind_block(struct dspk__dev *d, struct kscratch *ks, struct dspk__mem *m,
                      struct dspk__mem **out) {
  *out = m;
  if (!m->imported || m->size % 4 == 0)
    return 0;
  for (int i = 0; i < ks->npad; i++)
    if (ks->pad[i].buf == m) {
      *out = ks->pad[i].copy;
      return 0;
    }
  if (ks->npad == DSPK__VK_MAX_BIND)
    return DSPK_ELIMIT; /* not reached: one per binding */
  struct dspk__mem *c;
  size_t words = (m->size + 3) & ~(size_t)3;
  int r = dspk__vk_alloc(d, words, &c);
  if (r)
    return r;
  /* Zeros in its last word, then the buffer's bytes over the rest. */
  if ((r = dspk__vk_zero(d, c, words - 4, 4)) || (r = copy_blocks(d, m, c, m->size))) {
    (void)dspk__vk_submit(d);
    dspk__vk_free(d, c);
    return r;
  }
  ks->pad[ks->npad].buf = m;
  ks->pad[ks->npad++].copy = c;
  *out = c;
  return 0;
}

int dspk__vk_kernel_op(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  struct kscratch ks = {0};
  int r = kernel_op(d, op, ctx, &ks);
  if (ks.empty || ks.zero || ks.npad || ks.st.n) {
    int s = dspk__vk_submit(d); /* the blocks go back behind the work */
    if (ks.empty)
      dspk__vk_free(d, ks.empty);
    if (ks.zero)
      dspk__vk_free(d, ks.zero);
    for (int i = 0; i < ks.npad; i++)
      dspk__vk_free(d, ks.pad[i].copy);
    for (int i = 0; i < ks.st.n; i++)
      dspk__vk_free(d, ks.st.mem[i]);
    if (r == 0)
      r = s;
  }
  return r;
}

/* Whether op->in[ti] would be staged: its first byte off the alignment a
 * binding needs (dspk__vk_bind_tensor). */
static bool off_alignment(const struct dspk__dev *d, const struct dspk__tensor *t) {
  VkDeviceSize es = dspk__dtype_size(t->dtype);
  VkDeviceSize a = d->align > es ? d->align : es;
  return es && (t->mem->off + t->offset) % a != 0;
}

/* Two tensors of a raw kernel over overlapping bytes of one buffer, one of
 * them staged, would each have bytes of their own: the kernel's stores
 * through one would not be seen through the other, and the copy back of
 * the staged one would undo the other's.  Two tensors over the same bytes
 * (same offset and size) share one staged copy; any other overlap with a
 * staged tensor is EINVAL, before anything runs. */
static int check_staged_overlap(struct dspk__dev *d, const struct dspk__op *op,
                                struct dspk__opctx *ctx) {
  for (int i = 0; i < op->u.kernel.nargs; i++) {
    const struct dspk__karg *x = &op->u.kernel.args[i];
    if (x->kind != DSPK__KARG_TENSOR)
      continue;
    const struct dspk__tensor *s = &op->in[x->v.tensor];
    for (int j = i + 1; j < op->u.kernel.nargs; j++) {
      const struct dspk__karg *y = &op->u.kernel.args[j];
      if (y->kind != DSPK__KARG_TENSOR || y->v.tensor == x->v.tensor)
        continue;
      const struct dspk__tensor *t = &op->in[y->v.tensor];
      size_t ns = dspk__tensor_nbytes(s), nt = dspk__tensor_nbytes(t);
      if (s->mem != t->mem || !ns || !nt || s->offset >= t->offset + nt ||
          t->offset >= s->offset + ns || (!off_alignment(d, s) && !off_alignment(d, t)) ||
          (s->offset == t->offset && ns == nt))
        continue;
      return dspk__vk_fail(ctx, DSPK_EINVAL,
                           "kernel: arguments %d and %d (inputs %d and %d) overlap in one "
                           "buffer (bytes %zu..%zu and %zu..%zu) and one starts off this "
                           "device's %llu-byte binding alignment, so it is bound through a "
                           "copy of its own: tensors over the same bytes must have the same "
                           "offset and size, or not overlap",
                           i, j, x->v.tensor, y->v.tensor, s->offset, s->offset + ns,
                           t->offset, t->offset + nt, (unsigned long long)d->align);
    }
  }
  return 0;
}

/* Binds op->in[ti] through a staged copy (above): *b its binding.  A
 * tensor over the same bytes as one staged already shares its copy. */
static int stage_tensor(struct dspk__dev *d, struct dspk__op *op, int ti, struct kstage *st,
                        struct dspk__vk_bind *b) {
  const struct dspk__tensor *t = &op->in[ti];
  struct dspk__mem *m = NULL;
  for (int i = 0; i < st->n && !m; i++) {
    const struct dspk__tensor *u = &op->in[st->tensor[i]];
    if (st->tensor[i] == ti || (u->mem == t->mem && u->offset == t->offset &&
                                dspk__tensor_nbytes(u) == dspk__tensor_nbytes(t)))
      m = st->mem[i];
  }
  size_t n = dspk__tensor_nbytes(t);
  if (!m) {
    size_t n4 = n < 4 ? 4 : (n + 3) & ~(size_t)3;
    VkCommandBuffer cb;
    int r;
    if (st->n == DSPK__VK_MAX_BIND)
      return DSPK_ELIMIT; /* (one binding each: never more than the bindings) */
    if ((r = dspk__vk_alloc(d, n4, &m)))
      return r;
    st->tensor[st->n] = ti;
    st->mem[st->n++] = m;
    if ((r = dspk__vk_zero(d, m, 0, n4)) || (r = dspk__vk_cmd(d, &cb)))
      return r;
    dspk__vk_barrier(d); /* the fill before the copy over it */
    VkBufferCopy c = {.srcOffset = t->mem->off + t->offset, .dstOffset = m->off, .size = n};
    VK(CmdCopyBuffer)(cb, t->mem->buf, m->buf, 1, &c);
    dspk__vk_barrier(d);
  }
  struct dspk__tensor w = *t;
  w.mem = m;
  w.offset = 0;
  uint32_t elem;
  int r = dspk__vk_bind_tensor(d, &w, b, &elem);
  return r ? r : elem ? DSPK_ENOTSUP : 0;
}

/* After the dispatch: every staged tensor's bytes back over the tensor. */
static int unstage(struct dspk__dev *d, struct dspk__op *op, const struct kstage *st) {
  if (!st->n)
    return 0;
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  for (int i = 0; i < st->n; i++) {
    const struct dspk__tensor *t = &op->in[st->tensor[i]];
    VkBufferCopy c = {.srcOffset = st->mem[i]->off,
                      .dstOffset = t->mem->off + t->offset,
                      .size = dspk__tensor_nbytes(t)};
    VK(CmdCopyBuffer)(cb, st->mem[i]->buf, t->mem->buf, 1, &c);
  }
  dspk__vk_barrier(d);
  return 0;
}

/* A pool block's size is its bucket's, above the bytes asked of it, and a
 * binding is rounded up to whole words within the block: a raw kernel may
 * store past the size its buffer was asked with, into bytes that a larger
 * tensor, a share or the block's next user would see.  After the dispatch
 * the bytes of each binding past its block's asked size (bm[i], the block
 * bound as itself; NULL for the op's own copies) are zeroed again, in order
 * on the queue: the head up to a word from the zero block (a copy has no
 * alignment), the rest filled. */
static int zero_padding(struct dspk__dev *d, struct kscratch *ks, struct dspk__mem *const *bm,
                        const struct dspk__vk_bind *b, int nb) {
  VkCommandBuffer cb = VK_NULL_HANDLE;
  int r;
  for (int i = 0; i < nb; i++) {
    struct dspk__mem *m = bm[i];
    if (!m || m->imported || m->asked >= m->size)
      continue;
    VkDeviceSize from = m->off + m->asked, end = b[i].off + b[i].range;
    if (b[i].buf != m->buf || end <= from)
      continue;
    if (!ks->zero &&
        ((r = dspk__vk_alloc(d, 16, &ks->zero)) || (r = dspk__vk_zero(d, ks->zero, 0, 16))))
      return r;
    if (!cb && (r = dspk__vk_cmd(d, &cb)))
      return r;
    VkDeviceSize word = (from + 3) & ~(VkDeviceSize)3;
    if (word > end)
      word = end;
    if (word > from) {
      VkBufferCopy c = {.srcOffset = ks->zero->off, .dstOffset = from, .size = word - from};
      VK(CmdCopyBuffer)(cb, ks->zero->buf, m->buf, 1, &c);
    }
    if (end > word)
      VK(CmdFillBuffer)(cb, m->buf, word, (end - word) & ~(VkDeviceSize)3, 0);
  }
  if (cb)
    dspk__vk_barrier(d);
  return 0;
}

static int kernel_op(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx,
                     struct kscratch *ks) {
  const char *lang = op->u.kernel.lang;
  int spirv;
  if (strcmp(lang, "glsl") == 0)
    spirv = 0;
  else if (strcmp(lang, "spirv") == 0)
    spirv = 1;
  else
    return dspk__vk_fail(ctx, DSPK_ENOTSUP,
                         "kernel: language \"%s\" is not supported on vulkan (glsl, spirv)",
                         lang);
  /* Tensor arguments are bindings 0, 1, ... in order; scalars are packed
   * into the push-constant block with std430 alignment. */
  struct dspk__vk_bind b[DSPK__VK_MAX_BIND];
  struct dspk__mem *bm[DSPK__VK_MAX_BIND] = {0}; /* the block bound as itself */
  uint8_t pc[DSPK__VK_PC_MAX];
  uint32_t pcsize = 0;
  int nb = 0;
  int cr = check_staged_overlap(d, op, ctx);
  if (cr)
    return cr;
  for (int i = 0; i < op->u.kernel.nargs; i++) {
    const struct dspk__karg *a = &op->u.kernel.args[i];
    if (a->kind == DSPK__KARG_TENSOR) {
      const struct dspk__tensor *t = &op->in[a->v.tensor];
      uint32_t elem;
      if (nb == DSPK__VK_MAX_BIND)
        return dspk__vk_fail(ctx, DSPK_ELIMIT, "kernel: more than %d buffers",
                             DSPK__VK_MAX_BIND);
      int r;
      if (dspk__tensor_numel(t) == 0) {
        if (!ks->empty && (r = dspk__vk_alloc(d, 16, &ks->empty)))
          return r;
        /* Loads read zeros, never a pool block's earlier bytes. */
        if ((r = dspk__vk_zero(d, ks->empty, 0, 16)))
          return r;
        struct dspk__tensor w = {.dtype = DSPK_F32, .rank = 1, .shape = {1}, .mem = ks->empty};
        r = dspk__vk_bind_tensor(d, &w, &b[nb], &elem);
      } else {
        struct dspk__tensor w = *t;
        if ((r = bind_block(d, ks, t->mem, &w.mem)))
          return r;
        char what[48]; /* "kernel's argument " and two ints */
        snprintf(what, sizeof what, "kernel's argument %d (input %d)", i, a->v.tensor);
        /* ENOTSUP names the argument as every op names its tensors */
        if ((r = dspk__vk_bind_named(d, &w, &b[nb], &elem, ctx, what)))
          return r;
        if (elem != 0) /* off the device's alignment: staged */
          r = stage_tensor(d, op, a->v.tensor, &ks->st, &b[nb]);
        else if (w.mem == t->mem)
          bm[nb] = t->mem;
      }
      if (r)
        return dspk__vk_fail(ctx, r, "kernel: argument %d (input %d) cannot be staged",
                             i, a->v.tensor);
      nb++;
      continue;
    }
    uint32_t sz = (a->kind == DSPK__KARG_I64 || a->kind == DSPK__KARG_F64) ? 8 : 4;
    pcsize = (pcsize + sz - 1) / sz * sz;
    if (pcsize + sz > DSPK__VK_PC_MAX)
      return dspk__vk_fail(ctx, DSPK_ELIMIT, "kernel: scalars exceed %d push-constant bytes",
                           DSPK__VK_PC_MAX);
    switch (a->kind) {
    case DSPK__KARG_I32: memcpy(pc + pcsize, &a->v.i32, 4); break;
    case DSPK__KARG_U32: memcpy(pc + pcsize, &a->v.u32, 4); break;
    case DSPK__KARG_F32: memcpy(pc + pcsize, &a->v.f32, 4); break;
    case DSPK__KARG_I64: memcpy(pc + pcsize, &a->v.i64, 8); break;
    case DSPK__KARG_F64: memcpy(pc + pcsize, &a->v.f64, 8); break;
    default: break;
    }
    pcsize += sz;
  }
  const char *entry = op->u.kernel.entry[0] ? op->u.kernel.entry : "main";
  char *glsl = NULL;
  if (!spirv) {
    glsl = malloc(op->u.kernel.source_len + 1);
    if (!glsl)
      return DSPK_ENOMEM;
    memcpy(glsl, op->u.kernel.source, op->u.kernel.source_len);
    glsl[op->u.kernel.source_len] = 0;
    entry = "main"; /* GLSL's entry point is always main */
  }
  struct dspk__vk_kernel *kern;
  int r = dspk__vk_kernel(d, "raw", glsl, spirv ? op->u.kernel.source : NULL,
                          op->u.kernel.source_len, entry, nb, pcsize, &kern, ctx);
  free(glsl);
  if (r)
    return r;
  uint32_t g[3];
  for (int i = 0; i < 3; i++)
    g[i] = op->u.kernel.grid[i] ? op->u.kernel.grid[i] : 1;
  const uint32_t *mx = d->props.limits.maxComputeWorkGroupCount;
  if (g[0] > mx[0] || g[1] > mx[1] || g[2] > mx[2])
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "kernel: grid %ux%ux%u exceeds the device's "
                                           "maxComputeWorkGroupCount %ux%ux%u",
                         g[0], g[1], g[2], mx[0], mx[1], mx[2]);
  if ((r = dspk__vk_dispatch(d, kern, b, nb, pc, pcsize, g[0], g[1], g[2])) ||
      (r = zero_padding(d, ks, bm, b, nb)))
    return r;
  /* What the kernel stored goes back to the imported buffers, within their
   * sizes, then the staged tensors over theirs. */
  for (int i = 0; i < ks->npad; i++)
    if ((r = copy_blocks(d, ks->pad[i].copy, ks->pad[i].buf, ks->pad[i].buf->size)))
      return r;
  return unstage(d, op, &ks->st);
}

/* ---- dispatcher ------------------------------------------------------------- */

int dspk__vk_run(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx) {
  int r;
  if (ctx && ctx->cancel && atomic_load(ctx->cancel))
    return DSPK_ECANCELED;
  switch (op->kind) {
  case DSPK_OP_MAP: r = dspk__vk_map(d, op, ctx); break;
  case DSPK_OP_REDUCE: r = dspk__vk_reduce(d, op, ctx); break;
  case DSPK_OP_FIR: r = dspk__vk_fir(d, op, ctx); break;
  case DSPK_OP_KERNEL: r = dspk__vk_kernel_op(d, op, ctx); break;
  case DSPK_OP_GEMM: r = dspk__vk_gemm(d, op, ctx); break;
  case DSPK_OP_CONTRACT: r = dspk__vk_contract(d, op, ctx); break;
  case DSPK_OP_FFT: r = dspk__vk_fft(d, op, ctx); break;
  default: r = dspk__vk_fail(ctx, DSPK_ENOTSUP, "vulkan: unknown op"); break;
  }
  /* Whatever was recorded goes to the queue now: nothing stays open between
   * calls, so fences and reads always cover it. */
  int s = dspk__vk_submit(d);
  if (r == DSPK_ECANCELED) /* not the message of a failure before it */
    dspk__vk_fail(ctx, r, "the task was canceled");
  return r ? r : s;
}
