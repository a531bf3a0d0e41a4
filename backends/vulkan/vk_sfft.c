/*
 * Our own FFT kernels (see vk_sfft.h for what they compute).
 *
 * One pass transforms, per workgroup, C transforms of length L (a power of
 * two up to DSPK__SK_MAXL), each by T = L/E threads holding E values:
 *   - load: the first stage's inputs straight from global memory.  The
 *     column pass (transforms adjacent in memory) numbers its threads
 *     transform-fastest, so a warp reads C adjacent values per row; row
 *     passes number them thread-fastest (rows are contiguous);
 *   - stages: Stockham radix-R steps; each thread takes R values (stride
 *     L/R) of its transform, multiplies them by the stage's twiddles, does
 *     an R-point DFT in registers (radix-2 steps, unrolled, constants
 *     inline) and writes them back in sorted order through shared memory
 *     (the exchange), so the result needs no bit reversal;
 *   - store: the last stage's outputs straight to global memory, except in
 *     the row pass of two, whose outputs go to columns: it stores through
 *     shared memory, transform-fastest.  The first of two passes multiplies
 *     by the four-step twiddle W_n^(column x k), the last scales (1/n for
 *     the inverse).
 * With H groups, shared memory holds C/H transforms and the groups take
 * turns at each exchange (more transforms per workgroup, so wider
 * contiguous pieces, in the 48 KiB the H200 offers).  Shared memory is
 * padded (one slot in 16, and a shift per transform) so that strided
 * accesses fall into different banks.
 *
 * Twiddles come from tables computed on the host in double precision:
 * W_L^i for each pass's L, and W_n^m = W_n^(m mod 2^a) * W_n^(2^a (m div
 * 2^a)) from two tables of about sqrt(n) values each, so no angle is ever
 * rounded through sin/cos in single precision on the device.  A thread's
 * twiddles W^(4a + b) are products W^(4a) W^b of table values (about a
 * quarter of the reads; one more rounded product, so an error of about 2
 * ulps by estimate: the fft tests' tolerances hold).  Twiddles are stored for the
 * forward sign; the inverse conjugates them.
 *
 * The configurations offered to the tuner and the choices above come from
 * per-pass GPU profiles on the H200 (bench_vulkan fftsk; figures in
 * docs/performance.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "backends/vulkan/vk_sfft.h"

#define SK_SRC 131072 /* bytes of generated GLSL per kernel, at most (55 KB seen) */
#define SK_MAXE 32u  /* values per thread, at most */

struct pass {
  uint32_t L, C, E, H; /* H: groups of C/H transforms taking turns in shared memory */
  uint32_t s_in, cs_in, bs_in, s_out, cs_out, bs_out; /* strides, elements */
  uint32_t M, rows; /* transforms per row, rows (batch) */
  uint32_t twl;     /* this pass's W_L table in the twiddle buffer */
  int twid, last;   /* four-step twiddle on output; the last pass */
};

struct splan {
  int kind; /* 4 (see plan_evict in vk_backend.c) */
  struct dspk__vk_sfft_cfg cfg;
  uint64_t n, batch;
  int np;
  struct pass p[2];
  uint32_t ta, tb, abits; /* the four-step twiddle tables */
  struct dspk__mem *tw, *tmp;
  /* [variant][pass], made when first needed; variant: inverse + 2 when
   * the pass carries a fir hook (see hooks()). */
  char *src[4][2];
  /* Their kernels (hashing tens of KB of source per launch is too slow). */
  struct dspk__vk_kmemo kern[4][2];
};

static int is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

static int ilog2(uint64_t v) {
  int l = 0;
  while (((uint64_t)1 << l) < v)
    l++;
  return l;
}

/* Shared-memory slots per transform: padded by one in 16, plus a shift
 * that puts the C transforms' j-th values in different banks. */
static uint32_t slots(uint32_t L, uint32_t C) {
  return L + (L >> 4) + (C < 16 ? 16 / C : 1) % 16;
}

/* The passes of cfg for n x batch (no checks). */
static int layout(uint64_t n, uint64_t batch, const struct dspk__vk_sfft_cfg *cfg,
                  struct pass p[2], uint32_t *ta, uint32_t *tb, uint32_t *abits,
                  uint32_t *twlen) {
  memset(p, 0, 2 * sizeof *p);
  if (cfg->l1 <= 1) {
    p[0] = (struct pass){.L = (uint32_t)n, .C = cfg->c[0], .E = cfg->e[0],
                         .H = cfg->h[0] ? cfg->h[0] : 1, .s_in = 1,
                         .cs_in = (uint32_t)n, .s_out = 1, .cs_out = (uint32_t)n,
                         .M = (uint32_t)batch, .rows = 1, .last = 1};
    *ta = *tb = *abits = 0;
    *twlen = (uint32_t)n;
    return 1;
  }
  uint32_t n1 = cfg->l1, n2 = (uint32_t)(n / n1), N = (uint32_t)n;
  p[0] = (struct pass){.L = n1, .C = cfg->c[0], .E = cfg->e[0],
                       .H = cfg->h[0] ? cfg->h[0] : 1, .s_in = n2, .cs_in = 1,
                       .bs_in = N, .s_out = n2, .cs_out = 1, .bs_out = N, .M = n2,
                       .rows = (uint32_t)batch, .twl = 0, .twid = 1};
  p[1] = (struct pass){.L = n2, .C = cfg->c[1], .E = cfg->e[1],
                       .H = cfg->h[1] ? cfg->h[1] : 1, .s_in = 1, .cs_in = n2,
                       .bs_in = N, .s_out = n1, .cs_out = 1, .bs_out = N, .M = n1,
                       .rows = (uint32_t)batch, .twl = n1, .last = 1};
  *abits = (uint32_t)(ilog2(n) + 1) / 2;
  *ta = n1 + n2;
  *tb = *ta + (1u << *abits);
  *twlen = *tb + (uint32_t)(n >> *abits);
  return 2;
}

static int pass_ok(const struct dspk__dev *d, const struct pass *p) {
  const VkPhysicalDeviceLimits *lim = &d->props.limits;
  if (!is_pow2(p->C) || !is_pow2(p->E) || !is_pow2(p->H) || p->E < 2 || p->E > SK_MAXE ||
      p->E > p->L || p->C > p->M || p->L > DSPK__SK_MAXL || p->H > p->C || p->H > p->E ||
      p->H > 4)
    return 0;
  uint64_t wg = (uint64_t)p->C * p->L / p->E, ch = p->C / p->H;
  return wg <= lim->maxComputeWorkGroupInvocations && wg <= lim->maxComputeWorkGroupSize[0] &&
         ch * slots(p->L, (uint32_t)ch) * 8 <= lim->maxComputeSharedMemorySize;
}

/* Whether pass i of cfg (all passes when i < 0) can run n x batch on d. */
static int valid_pass(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                      const struct dspk__vk_sfft_cfg *cfg, int i);

int dspk__vk_sfft_valid(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                        const struct dspk__vk_sfft_cfg *cfg) {
  return valid_pass(d, n, batch, cfg, -1);
}

static int valid_pass(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                      const struct dspk__vk_sfft_cfg *cfg, int which) {
  if (!is_pow2(n) || n < 4 || batch == 0 || n * batch > ((uint64_t)1 << 31) ||
      n * batch * 8 > d->props.limits.maxStorageBufferRange)
    return 0;
  if (cfg->l1 <= 1 ? n > DSPK__SK_MAXL
                   : !is_pow2(cfg->l1) || cfg->l1 < 4 || n / cfg->l1 < 4 ||
                         cfg->l1 > DSPK__SK_MAXL || n / cfg->l1 > DSPK__SK_MAXL)
    return 0;
  struct pass p[2];
  uint32_t ta, tb, ab, tl;
  int np = layout(n, batch, cfg, p, &ta, &tb, &ab, &tl);
  for (int i = 0; i < np; i++)
    if ((which < 0 || which == i) && !pass_ok(d, &p[i]))
      return 0;
  return 1;
}

/* Sets pass i of cfg to c transforms per workgroup with the fewest
 * groups, at least hmin, that fit (up to 4); 0 when none does. */
static int fit(const struct dspk__dev *d, uint64_t n, uint64_t batch,
               struct dspk__vk_sfft_cfg *cfg, int i, uint32_t c, uint32_t hmin) {
  cfg->c[i] = c;
  for (uint32_t h = hmin; h <= 4; h *= 2) {
    cfg->h[i] = h;
    if (valid_pass(d, n, batch, cfg, i))
      return 1;
  }
  return 0;
}

/* Pass i of cfg with e values per thread and, from c down, the most
 * transforms per workgroup that fit (groups from hmin up). */
static int fit_down(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                    struct dspk__vk_sfft_cfg *cfg, int i, uint32_t c, uint32_t e,
                    uint32_t hmin) {
  for (; c >= 1; c /= 2) {
    uint32_t L = i == 0 ? (cfg->l1 > 1 ? cfg->l1 : (uint32_t)n) : (uint32_t)(n / cfg->l1);
    cfg->e[i] = e < L ? e : L;
    if (fit(d, n, batch, cfg, i, c, c >= hmin ? hmin : 1))
      return 1;
  }
  return 0;
}

/* The tuner's short list, from the per-pass profiles on the H200
 * (docs/performance.md).  One pass, where n fits, with 1 or 2 transforms
 * per workgroup (rows are contiguous), 32 or 16 values per thread.
 * Else two passes, 32 values per thread, split at sqrt(n) and a factor
 * of 2 either side: the column pass with 4096/L (4 to 16) transforms per
 * workgroup in at least 2 groups (wide contiguous pieces, little shared
 * memory), the row pass, whose writes are strided, with up to 8 in the
 * fewest groups or up to 4; then the even split with 16 values. */
int dspk__vk_sfft_cands(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                        struct dspk__vk_sfft_cfg *out, int max) {
  int k = 0;
  if (!is_pow2(n) || n < 4 || n > (uint64_t)DSPK__SK_MAXL * DSPK__SK_MAXL)
    return 0;
  int lg = ilog2(n);
  for (uint32_t e = 32; e >= 16 && n <= DSPK__SK_MAXL; e /= 2)
    for (uint32_t c = 1; c <= 2 && k < max; c++) {
      struct dspk__vk_sfft_cfg cf = {1, {0, 0}, {0, 0}, {0, 0}};
      if (fit_down(d, n, batch, &cf, 0, c, e, 1))
        out[k++] = cf;
    }
  for (int v = 0; v < 3 && n > DSPK__SK_MAXL; v++)
    for (int l = lg / 2 - (v < 2); l <= lg / 2 + (v < 2) && k < max; l++) {
      if (l < 2 || lg - l < 2)
        continue;
      uint32_t l1 = 1u << l, c0 = 4096 / l1 > 16 ? 16 : 4096 / l1 > 4 ? 4096 / l1 : 4;
      uint32_t e = v < 2 ? 32 : 16, c1 = v == 0 ? 8 : 4;
      struct dspk__vk_sfft_cfg cf = {l1, {0, 0}, {0, 0}, {0, 0}};
      if (fit_down(d, n, batch, &cf, 0, c0, e, 2) && fit_down(d, n, batch, &cf, 1, c1, e, 1))
        out[k++] = cf;
    }
  /* no configuration twice (small n reach the same one by several roads) */
  for (int i = 0; i < k; i++)
    for (int j = i + 1; j < k; j++)
      if (!memcmp(&out[i], &out[j], sizeof out[i]))
        out[j--] = out[--k];
  return k;
}

/* "C/E", or "C/E/H" when the pass has groups. */
static int pass_name(char *buf, size_t len, uint32_t c, uint32_t e, uint32_t h) {
  return h > 1 ? snprintf(buf, len, "%u/%u/%u", c, e, h) : snprintf(buf, len, "%u/%u", c, e);
}

void dspk__vk_sfft_name(const struct dspk__vk_sfft_cfg *cfg, char *buf, size_t len) {
  char a[32], b[32] = "";
  pass_name(a, sizeof a, cfg->c[0], cfg->e[0], cfg->h[0]);
  if (cfg->l1 > 1)
    pass_name(b, sizeof b, cfg->c[1], cfg->e[1], cfg->h[1]);
  snprintf(buf, len, "sk:%u:%s%s%s", cfg->l1 > 1 ? cfg->l1 : 1, a, cfg->l1 > 1 ? ":" : "", b);
}

/* Reads "C/E" or "C/E/H" at *s, moving past it. */
static int parse_pass(const char **s, uint32_t *c, uint32_t *e, uint32_t *h) {
  char *end;
  unsigned long v[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) {
    if (i > 0 && **s != '/')
      break;
    if (i > 0)
      (*s)++;
    if (**s < '0' || **s > '9')
      return -1;
    v[i] = strtoul(*s, &end, 10);
    if (v[i] > 65536)
      return -1;
    *s = end;
  }
  *c = (uint32_t)v[0];
  *e = (uint32_t)v[1];
  *h = (uint32_t)v[2];
  return v[1] ? 0 : -1;
}

int dspk__vk_sfft_parse(const char *s, struct dspk__vk_sfft_cfg *cfg) {
  const char *at = s;
  char *end;
  char back[64];
  memset(cfg, 0, sizeof *cfg);
  if (strncmp(at, "sk:", 3) || at[3] < '0' || at[3] > '9')
    return -1;
  unsigned long l1 = strtoul(at + 3, &end, 10);
  at = end;
  if (l1 > 65536 || *at++ != ':' || parse_pass(&at, &cfg->c[0], &cfg->e[0], &cfg->h[0]))
    return -1;
  cfg->l1 = (uint32_t)l1;
  if (l1 > 1 && (*at++ != ':' || parse_pass(&at, &cfg->c[1], &cfg->e[1], &cfg->h[1])))
    return -1;
  if (*at)
    return -1;
  dspk__vk_sfft_name(cfg, back, sizeof back);
  return strcmp(back, s) == 0 ? 0 : -1; /* the canonical spelling only */
}

/* ---- code generation ----------------------------------------------------- */

/* Sources are built with dspk__vk_ap (vk_shader.c). */
#define ap dspk__vk_ap

static uint32_t bitrev(uint32_t i, int bits) {
  uint32_t r = 0;
  for (int k = 0; k < bits; k++)
    r |= ((i >> k) & 1u) << (bits - 1 - k);
  return r;
}

/* An R-point DFT of v[base..base+R) in registers, radix-2 decimation in
 * time on the bit-reversed view: X[k] ends in v[base + bitrev(k)]. */
static void gen_dft(struct dspk__vk_sbuf *b, uint32_t base, uint32_t R, int inverse) {
  int bits = ilog2(R);
  double sg = inverse ? 1.0 : -1.0;
  for (uint32_t m = 2; m <= R; m *= 2)
    for (uint32_t k0 = 0; k0 < R; k0 += m)
      for (uint32_t j = 0; j < m / 2; j++) {
        uint32_t i0 = base + bitrev(k0 + j, bits), i1 = base + bitrev(k0 + j + m / 2, bits);
        if (j == 0) {
        } else if (4 * j == m) {
          ap(b, "      v[%u] = vec2(%sv[%u].y, %sv[%u].x);\n", i1, inverse ? "-" : "", i1,
             inverse ? "" : "-", i1);
        } else {
          double a = sg * 2.0 * M_PI * (double)j / (double)m;
          ap(b, "      v[%u] = cmul(v[%u], vec2(%.9e, %.9e));\n", i1, i1, cos(a), sin(a));
        }
        ap(b, "      { vec2 a = v[%u]; v[%u] = a + v[%u]; v[%u] = a - v[%u]; }\n", i0, i0, i1,
           i1, i1);
      }
}

/* The radix of each stage of a transform of L with E values per thread:
 * E while it divides what is left, then the rest.  Returns the count. */
static int radices(uint32_t L, uint32_t E, uint32_t *rad) {
  int n = 0;
  for (uint32_t rem = L; rem > 1; rem /= rad[n++])
    rad[n] = rem >= E ? E : rem;
  return n;
}

/* "if (grp == h) " when the pass has groups (their turns in shared
 * memory), else nothing. */
static void turn(struct dspk__vk_sbuf *b, const struct pass *p, uint32_t h) {
  if (p->H > 1)
    ap(b, "  if (grp == %uu)\n", h);
}

/* The shared-memory slot of value base + K of a transform: P(base + K),
 * or basep + P(K) (basep = P(base) in GLSL) when K or base (aligned set)
 * is a multiple of 16, so that the constant folds into the instruction. */
static void slot(char *buf, size_t len, const char *base, const char *basep, uint32_t K,
                 int aligned) {
  if (K % 16 == 0 || aligned)
    snprintf(buf, len, "sb + %s + %uu", basep, K + K / 16);
  else
    snprintf(buf, len, "sb + P(%s + %uu)", base, K);
}

/* The thread's reads of a stage's inputs (radix R) from shared memory. */
static void gen_read(struct dspk__vk_sbuf *b, const struct pass *p, uint32_t R) {
  uint32_t T = p->L / p->E;
  char ix[64];
  ap(b, "  {\n");
  for (uint32_t q = 0; q < p->E / R; q++)
    for (uint32_t r = 0; r < R; r++) {
      slot(ix, sizeof ix, "t", "tp", q * T + r * (p->L / R), 0);
      ap(b, "    v[%u] = s[%s];\n", q * R + r, ix);
    }
  ap(b, "  }\n");
}

/* The thread's writes of a stage's outputs (radix R, after ns values were
 * combined) to their sorted places in shared memory. */
static void gen_write(struct dspk__vk_sbuf *b, const struct pass *p, uint32_t R, uint32_t ns) {
  uint32_t T = p->L / p->E;
  char ix[64];
  ap(b, "  {\n");
  for (uint32_t q = 0; q < p->E / R; q++) {
    ap(b, "    { uint j = t + %uu; uint d = (j / %uu) * %uu + (j %% %uu), dp = P(d);\n",
       q * T, ns, ns * R, ns);
    for (uint32_t r = 0; r < R; r++) {
      slot(ix, sizeof ix, "d", "dp", r * ns, ns == 1 && R % 16 == 0);
      ap(b, "      s[%s] = v[%u];\n", ix, q * R + bitrev(r, ilog2(R)));
    }
    ap(b, "    }\n");
  }
  ap(b, "  }\n");
}

/* The value going to output k (GLSL expression kexpr) of transform m0+cexpr
 * in `val`: the four-step twiddle on the first of two passes, the scale on
 * the last. */
static void gen_out(struct dspk__vk_sbuf *b, const struct pass *p, const char *cexpr,
                    const char *kexpr) {
  if (p->twid)
    ap(b, "      val = cmul(val, wn((m0 + %s) * (%s)));\n", cexpr, kexpr);
  if (p->last)
    ap(b, "      val *= pc.scale;\n");
}

/* The twiddles of stage st (radix R after ns values were combined), for
 * each of the thread's butterflies q: u<st>_<q>_<b> = W_L^(tb b), b < 4,
 * and z<st>_<q>_<4a> = W_L^(tb 4a). */
static void gen_stage_tw(struct dspk__vk_sbuf *b, const struct pass *p, int st, uint32_t R,
                         uint32_t ns) {
  uint32_t T = p->L / p->E;
  for (uint32_t q = 0; q < p->E / R; q++) {
    ap(b, "  uint tb%d_%u = ((t + %uu) %% %uu) * %uu;\n", st, q, q * T, ns, p->L / (ns * R));
    for (uint32_t r = 1; r < R && r < 4; r++)
      ap(b, "  vec2 u%d_%u_%u = tww(%uu + tb%d_%u * %uu);\n", st, q, r, p->twl, st, q, r);
    for (uint32_t a = 4; a < R; a += 4)
      ap(b, "  vec2 z%d_%u_%u = tww(%uu + tb%d_%u * %uu);\n", st, q, a, p->twl, st, q, a);
  }
}

/* The four-step twiddles W_n^(mc (t + qT + r nl)) of the thread's outputs,
 * r = 4a + b, as f<q>_<b> = W_n^(mc (t + qT)) W_n^(mc nl b) times
 * y<4a> = W_n^(mc nl 4a): about RL/2 table reads instead of 2 RL. */
static void gen_fourstep_tw(struct dspk__vk_sbuf *b, const struct pass *p, uint32_t T, uint32_t RL,
                            uint32_t nl) {
  ap(b, "  uint mc = m0 + c, ms = mc * %uu;\n", nl);
  for (uint32_t r = 4; r < RL; r += 4)
    ap(b, "  vec2 y%u = wn(ms * %uu);\n", r, r);
  for (uint32_t q = 0; q < p->E / RL; q++) {
    ap(b, "  vec2 f%u_0 = wn(mc * (t + %uu));\n", q, q * T);
    for (uint32_t r = 1; r < 4 && r < RL; r++)
      ap(b, "  vec2 f%u_%u = cmul(f%u_0, wn(ms * %uu));\n", q, r, q, r);
  }
}

/* The fir hooks of pass i of pl (see dspk__vk_sfft_fir): HK_LD, the
 * forward transform's first pass reads the blocks straight from the
 * signal, and the filter as the last row; HK_MUL, the inverse's first
 * pass multiplies each value by the filter's spectrum as it reads it;
 * HK_SCT, the inverse's last pass writes the outputs it keeps straight
 * into y. */
enum { HK_LD = 1, HK_MUL = 2, HK_SCT = 4 };
static int hooks(const struct splan *pl, int i, int inverse) {
  int last = i == pl->np - 1;
  return inverse ? (i == 0 ? HK_MUL : 0) | (last ? HK_SCT : 0) : (i == 0 ? HK_LD : 0);
}

/* The declarations of a pass with fir hooks hk: the signal (or y), the
 * filter (or its spectrum), the block layout in the push constants, and
 * LD / ST (for the plain passes: the buffers' elements). */
static void gen_hooks(struct dspk__vk_sbuf *b, const struct splan *pl, int hk) {
  uint32_t mask = (uint32_t)(pl->n - 1);
  int lg = ilog2(pl->n);
  if (!hk) {
    ap(b, "layout(push_constant) uniform PC { uint xoff, ooff, ngroups; float scale; } pc;\n"
          "#define LD(i) x[i]\n#define ST(i, v) o[i] = (v)\n"
          "#define FL_BEGIN(g, tid)\n#define FL_END()\n");
    return;
  }
  ap(b, "layout(push_constant) uniform PC { uint xoff, ooff, ngroups; float scale;\n"
        "  uint n, km1, S, nb, nblk, aoff, hoff, cap; } pc;\n"
        "layout(std430, binding = 3) buffer BA { float a[]; };\n"
        "layout(std430, binding = 4) readonly buffer BH { %s hs[]; };\n",
     hk & HK_MUL ? "vec2" : "float");
  /* Row c < nblk holds block bi = c - row nb of signal row row = c / nb
   * in its real parts (imaginary parts 0; one block a row, never two, see
   * dspk__fir_geo), and sample j of block bi of row row is signal sample
   * bi S + j - (k-1) of that row; row nblk, after the blocks, is the
   * filter. */
  if (hk & HK_LD)
    ap(b,
       "vec2 LD(uint i) {\n"
       "  uint q = i - pc.xoff, c = q >> %du, j = q & %uu;\n"
       "  if (c >= pc.nblk) return vec2(j <= pc.km1 ? hs[pc.hoff + j] : 0.0, 0.0);\n"
       "  uint row = c / pc.nb, t = (c - row * pc.nb) * pc.S + j;\n"
       "  return vec2(t >= pc.km1 && t - pc.km1 < pc.n ? a[pc.aoff + row * pc.n + t - pc.km1]\n"
       "                                               : 0.0, 0.0);\n"
       "}\n",
       lg, mask);
  else if (hk & HK_MUL)
    ap(b, "#define LD(i) cmul(x[i], hs[pc.hoff + (((i) - pc.xoff) & %uu)])\n", mask);
  else
    ap(b, "#define LD(i) x[i]\n");
  /* The list of blocks that get a NaN or an Inf output (vk_fir.c,
   * DSPK__VK_FL_HEAD), for the direct kernel to compute them again: the
   * forward transform's first pass clears it (FL_BEGIN, before anything
   * else), the inverse's last pass lists a block by the exponent's bits of
   * its outputs.  All of a thread's outputs belong to one row, one block
   * (its transform), so it only notes that it got one (nf_c: the block + 1)
   * and lists it once, at its end (FL_END); an output of another block,
   * were there one, is listed at once. */
  if (hk & (HK_LD | HK_SCT))
    ap(b, "layout(std430, binding = 5) buffer BL { uint fl[]; };\n%s", dspk__vk_fl_glsl);
  if (hk & HK_LD)
    ap(b, "#define FL_BEGIN(g, tid) for (uint i_ = g * gl_WorkGroupSize.x + tid; "
          "i_ < 4u + pc.nblk; i_ += pc.ngroups * gl_WorkGroupSize.x) fl_clear(i_, pc.nblk)\n");
  else
    ap(b, "#define FL_BEGIN(g, tid)\n");
  if (!(hk & HK_SCT))
    ap(b, "#define FL_END()\n");
  if (hk & HK_SCT)
    ap(b,
       "uint nf_c = 0u;\n"
       "void ST(uint i, vec2 v) {\n"
       "  uint q = i - pc.ooff, c = q >> %du, j = q & %uu;\n"
       "  if (j < pc.km1 || c >= pc.nblk) return; /* not kept, or the filter's row */\n"
       "  uint row = c / pc.nb, t = (c - row * pc.nb) * pc.S + j - pc.km1;\n"
       "  if (t >= pc.n) return;\n"
       "  a[pc.aoff + row * pc.n + t] = v.x;\n"
       "  if ((floatBitsToUint(v.x) & 0x7f800000u) == 0x7f800000u) {\n"
       "    if (nf_c != 0u && nf_c != c + 1u) fl_list(c, pc.nblk, pc.S, pc.cap);\n"
       "    else nf_c = c + 1u;\n"
       "  }\n"
       "}\n"
       "void FL_END() {\n"
       "  if (nf_c != 0u) fl_list(nf_c - 1u, pc.nblk, pc.S, pc.cap);\n"
       "}\n",
       lg, mask);
  else
    ap(b, "#define ST(i, v) o[i] = (v)\n");
}

/* The GLSL of pass p (see the file comment), with the fir hooks hk.
 * Returns 0 or DSPK_ENOMEM.
 *
 * Each thread works on transform c of the workgroup's C, as thread t of
 * its T = L/E.  A pass over columns (transforms adjacent in memory) numbers
 * threads transform-fastest, a pass over rows thread-fastest, so that the
 * first stage reads its inputs straight from global memory in contiguous
 * pieces.  The last stage writes straight to global memory too, except for
 * the row pass of two (its outputs go to columns): it stores through
 * shared memory, transform-fastest.  With H groups, shared memory holds
 * C/H transforms: group h (transforms h*C/H ...) uses it in turn. */
static int gen_pass(const struct splan *pl, const struct pass *p, int inverse, int hk,
                    char **out) {
  struct dspk__vk_sbuf b = {malloc(SK_SRC), SK_SRC, 0, 0};
  if (!b.p)
    return DSPK_ENOMEM;
  uint32_t T = p->L / p->E, WG = p->C * T, CH = p->C / p->H, SL = slots(p->L, CH);
  uint32_t G = (p->M + p->C - 1) / p->C, rad[16];
  int guard = p->M % p->C != 0, nst = radices(p->L, p->E, rad);
  int cf = p->cs_in == 1;                  /* columns: transform-fastest threads */
  int direct_out = cf || p->cs_out != 1;   /* else through shared memory */
  ap(&b,
     "#version 450\n"
     "layout(local_size_x = %u) in;\n"
     "layout(std430, binding = 0) readonly buffer BX { vec2 x[]; };\n"
     "layout(std430, binding = 1) writeonly buffer BO { vec2 o[]; };\n"
     "layout(std430, binding = 2) readonly buffer BW { vec2 tw[]; };\n"
     "shared vec2 s[%u];\n"
     "vec2 cmul(vec2 a, vec2 b) { return vec2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }\n"
     "vec2 tww(uint i) { vec2 w = tw[i]; return vec2(w.x, %sw.y); }\n"
     "uint P(uint i) { return i + (i >> 4); }\n",
     WG, CH * SL, inverse ? "-" : "");
  gen_hooks(&b, pl, hk);
  if (p->twid) /* W_n^m, m < n, from the two four-step tables */
    ap(&b,
       "vec2 wn(uint m) { m &= %uu; return cmul(tww(%uu + (m & %uu)), tww(%uu + (m >> %uu))); }\n",
       (uint32_t)(pl->n - 1), pl->ta, (1u << pl->abits) - 1, pl->tb, pl->abits);
  ap(&b,
     "void main() {\n"
     "  uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;\n"
     "  if (g >= pc.ngroups) return;\n"
     "  uint row = g / %uu, m0 = (g %% %uu) * %uu;\n"
     "  uint tid = gl_LocalInvocationID.x;\n"
     "  FL_BEGIN(g, tid);\n",
     G, G, p->C);
  if (cf)
    ap(&b, "  uint c = tid %% %uu, t = tid / %uu;\n", p->C, p->C);
  else
    ap(&b, "  uint c = tid / %uu, t = tid %% %uu;\n", T, T);
  ap(&b,
     "  uint grp = c / %uu, sb = (c %% %uu) * %uu, tp = P(t);\n"
     "  uint ib = pc.xoff + row * %uu + m0 * %uu, ob = pc.ooff + row * %uu + m0 * %uu;\n"
     "  uint xt = ib + c * %uu + t * %uu, ot = ob + c * %uu + t * %uu;\n"
     "  vec2 v[%u];\n",
     CH, CH, SL, p->bs_in, p->cs_in, p->bs_out, p->cs_out, p->cs_in, p->s_in, p->cs_out,
     p->s_out, p->E);
  /* the first stage's inputs, straight from global memory */
  if (guard)
    ap(&b, "  if (m0 + c < %uu) {\n", p->M);
  for (uint32_t q = 0; q < p->E / rad[0]; q++)
    for (uint32_t r = 0; r < rad[0]; r++)
      ap(&b, "    v[%u] = LD(xt + %uu);\n", q * rad[0] + r,
         (q * T + r * (p->L / rad[0])) * p->s_in);
  if (guard)
    ap(&b, "  }\n");
  /* Stage twiddles are read before the exchange (arriving during it) in
   * two-stage transforms; with three stages the registers that holds
   * cost more than it saves (H200 profiles, docs/performance.md). */
  int hoist = nst == 2;
  uint32_t ns = 1, RL = rad[nst - 1], nl = p->L / RL; /* nl: the last stage's */
  for (int st = 0; st < nst; st++) {
    uint32_t R = rad[st];
    /* W_L^(tb r) = W_L^(tb 4a) W_L^(tb b) for r = 4a + b: 3 + R/4 - 1
     * table reads instead of R - 1, one product each (see the file
     * comment) */
    if (ns > 1 && hoist)
      gen_stage_tw(&b, p, st, R, ns);
    if (st > 0) /* exchange: the previous stage's outputs, this one's inputs */
      for (uint32_t h = 0; h < p->H; h++) {
        turn(&b, p, h);
        gen_write(&b, p, rad[st - 1], ns / rad[st - 1]);
        ap(&b, "  barrier();\n");
        turn(&b, p, h);
        gen_read(&b, p, R);
        ap(&b, "  barrier();\n");
      }
    if (ns > 1 && !hoist)
      gen_stage_tw(&b, p, st, R, ns);
    for (uint32_t q = 0; q < p->E / R; q++) {
      ap(&b, "  {\n");
      if (ns > 1) {
        for (uint32_t r = 1; r < R && r < 4; r++)
          ap(&b, "    v[%u] = cmul(v[%u], u%d_%u_%u);\n", q * R + r, q * R + r, st, q, r);
        for (uint32_t a = 4; a < R; a += 4) {
          ap(&b, "    v[%u] = cmul(v[%u], z%d_%u_%u);\n", q * R + a, q * R + a, st, q, a);
          for (uint32_t r = 1; r < 4; r++)
            ap(&b, "    v[%u] = cmul(v[%u], cmul(z%d_%u_%u, u%d_%u_%u));\n", q * R + a + r,
               q * R + a + r, st, q, a, st, q, r);
        }
      }
      gen_dft(&b, q * R, R, inverse);
      ap(&b, "  }\n");
    }
    ns *= R;
  }
  if (direct_out) {
    if (p->twid) /* (read earlier, they cost more registers than time) */
      gen_fourstep_tw(&b, p, T, RL, nl);
    /* thread t holds outputs k = t + q*T + r*nl of its transform */
    if (guard)
      ap(&b, "  if (m0 + c < %uu) {\n", p->M);
    for (uint32_t q = 0; q < p->E / RL; q++)
      for (uint32_t r = 0; r < RL; r++) {
        uint32_t K = q * T + r * nl;
        ap(&b, "    { vec2 val = v[%u];\n", q * RL + bitrev(r, ilog2(RL)));
        if (p->twid && r < 4)
          ap(&b, "      val = cmul(val, f%u_%u);\n", q, r);
        else if (p->twid)
          ap(&b, "      val = cmul(val, cmul(y%u, f%u_%u));\n", r - r % 4, q, r % 4);
        if (p->last)
          ap(&b, "      val *= pc.scale;\n");
        ap(&b, "      ST(ot + %uu, val); }\n", K * p->s_out);
      }
    if (guard)
      ap(&b, "  }\n");
  } else {
    /* through shared memory, group by group, transform-fastest */
    ap(&b, "  uint cl = tid %% %uu, k0 = tid / %uu, kp = P(k0);\n", CH, CH);
    for (uint32_t h = 0; h < p->H; h++) {
      if (h > 0)
        ap(&b, "  barrier();\n");
      turn(&b, p, h);
      gen_write(&b, p, RL, nl);
      ap(&b, "  barrier();\n");
      char cexpr[48];
      snprintf(cexpr, sizeof cexpr, "%uu + cl", h * CH);
      if (guard)
        ap(&b, "  if (m0 + %s < %uu) {\n", cexpr, p->M);
      for (uint32_t u = 0; u < p->E / p->H; u++) {
        uint32_t K = u * (WG / CH);
        char ix[64], k[48];
        if (K % 16 == 0)
          snprintf(ix, sizeof ix, "cl * %uu + kp + %uu", SL, K + K / 16);
        else
          snprintf(ix, sizeof ix, "cl * %uu + P(k0 + %uu)", SL, K);
        snprintf(k, sizeof k, "k0 + %uu", K);
        ap(&b, "    { vec2 val = s[%s];\n", ix);
        gen_out(&b, p, cexpr, k);
        ap(&b, "      ST(ob + (%s) * %uu + (%s) * %uu, val); }\n", cexpr, p->cs_out, k,
           p->s_out);
      }
      if (guard)
        ap(&b, "  }\n");
    }
  }
  ap(&b, "  FL_END();\n}\n");
  if (b.over) {
    free(b.p);
    return DSPK_ENOMEM;
  }
  *out = b.p;
  return 0;
}

/* ---- plans ---------------------------------------------------------------- */

static void splan_release(void *ud, void *res) {
  struct splan *p = res;
  (void)ud;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      free(p->src[i][j]);
  free(p);
}

void dspk__vk_sfft_plan_free(struct dspk__dev *d, void *plan) {
  struct splan *p = plan;
  if (!p)
    return;
  dspk__vk_free(d, p->tw);
  dspk__vk_free(d, p->tmp);
  dspk__retire_push(&d->retire, splan_release, d, p);
}

static int make_plan(struct dspk__dev *d, uint64_t n, uint64_t batch,
                     const struct dspk__vk_sfft_cfg *cfg, struct splan **out) {
  struct splan *p = calloc(1, sizeof *p);
  if (!p)
    return DSPK_ENOMEM;
  p->kind = 4;
  p->cfg = *cfg;
  p->n = n;
  p->batch = batch;
  uint32_t twlen;
  p->np = layout(n, batch, cfg, p->p, &p->ta, &p->tb, &p->abits, &twlen);
  float *tw = malloc((size_t)twlen * 2 * sizeof *tw);
  int r = DSPK_ENOMEM;
  if (!tw)
    goto fail;
  /* W_L tables of the passes, then the four-step tables */
  for (int i = 0; i < p->np; i++)
    for (uint32_t k = 0; k < p->p[i].L; k++) {
      double a = -2.0 * M_PI * (double)k / (double)p->p[i].L;
      tw[2 * (p->p[i].twl + k)] = (float)cos(a);
      tw[2 * (p->p[i].twl + k) + 1] = (float)sin(a);
    }
  if (p->np == 2) {
    for (uint32_t k = 0; k < (1u << p->abits); k++) {
      double a = -2.0 * M_PI * (double)k / (double)n;
      tw[2 * (p->ta + k)] = (float)cos(a);
      tw[2 * (p->ta + k) + 1] = (float)sin(a);
    }
    for (uint32_t k = 0; k < (uint32_t)(n >> p->abits); k++) {
      double a = -2.0 * M_PI * (double)((uint64_t)k << p->abits) / (double)n;
      tw[2 * (p->tb + k)] = (float)cos(a);
      tw[2 * (p->tb + k) + 1] = (float)sin(a);
    }
  }
  if ((r = dspk__vk_alloc(d, (size_t)twlen * 8, &p->tw)) ||
      (r = dspk__vk_write(d, p->tw, 0, tw, (size_t)twlen * 8)))
    goto fail;
  if (p->np == 2 && (r = dspk__vk_alloc(d, (size_t)(n * batch) * 8, &p->tmp)))
    goto fail;
  free(tw);
  *out = p;
  return 0;
fail:
  free(tw);
  dspk__vk_sfft_plan_free(d, p);
  return r;
}

static int plan_key(uint64_t n, uint64_t batch, const struct dspk__vk_sfft_cfg *cfg,
                    char *key, size_t len) {
  char name[64];
  dspk__vk_sfft_name(cfg, name, sizeof name);
  return snprintf(key, len, "sfft|n=%llu|b=%llu|%s", (unsigned long long)n,
                  (unsigned long long)batch, name);
}

static int get_plan(struct dspk__dev *d, uint64_t n, uint64_t batch,
                    const struct dspk__vk_sfft_cfg *cfg, struct splan **out) {
  char key[DSPK__PLANCACHE_KEY_MAX];
  int klen = plan_key(n, batch, cfg, key, sizeof key);
  struct splan *p = dspk__plancache_get(&d->plans, key, (size_t)klen);
  if (p) {
    *out = p;
    return 0;
  }
  int r = make_plan(d, n, batch, cfg, &p);
  if (r)
    return r;
  if ((r = dspk__plancache_put(&d->plans, key, (size_t)klen, p))) {
    dspk__vk_sfft_plan_free(d, p);
    return r;
  }
  *out = p;
  return 0;
}

void dspk__vk_sfft_keep(struct dspk__dev *d, void *plan) {
  struct splan *p = plan;
  char key[DSPK__PLANCACHE_KEY_MAX];
  if (!p)
    return;
  int klen = plan_key(p->n, p->batch, &p->cfg, key, sizeof key);
  if (dspk__plancache_get(&d->plans, key, (size_t)klen) ||
      dspk__plancache_put(&d->plans, key, (size_t)klen, p))
    dspk__vk_sfft_plan_free(d, p);
}

/* Records pass i of plan pl (with the fir hooks when f is not NULL). */
static int run_pass(struct dspk__dev *d, struct splan *pl, int i, int inverse,
                    const struct dspk__vk_bind *x, uint32_t xelem,
                    const struct dspk__vk_bind *o, uint32_t oelem,
                    const struct dspk__vk_sfft_fir *f, struct dspk__opctx *ctx) {
  const struct pass *p = &pl->p[i];
  int hk = f ? hooks(pl, i, inverse) : 0, v = inverse + (hk ? 2 : 0), r;
  if (!pl->src[v][i] && (r = gen_pass(pl, p, inverse, hk, &pl->src[v][i])))
    return r;
  struct {
    uint32_t xoff, ooff, ngroups;
    float scale;
    uint32_t n, km1, S, nb, nblk, aoff, hoff, cap;
  } pc;
  struct dspk__vk_kernel *k = dspk__vk_kmemo_get(d, &pl->kern[v][i]);
  if (!k) {
    if ((r = dspk__vk_kernel(d, "sfft", pl->src[v][i], NULL, 0, "main", hk ? 6 : 3,
                             hk ? (uint32_t)sizeof pc : 16, &k, ctx)))
      return r;
    dspk__vk_kmemo_set(&pl->kern[v][i], k);
  }
  struct dspk__vk_bind tmp = {0}, b[6];
  if (pl->tmp)
    tmp = dspk__vk_bind_temp(pl->tmp);
  b[0] = i == 0 ? *x : tmp;
  b[1] = i == pl->np - 1 ? *o : tmp;
  b[2] = dspk__vk_bind_temp(pl->tw);
  if (hk) {
    b[3] = *f->sig;
    b[4] = *f->hs;
    b[5] = *f->fl;
  }
  uint32_t groups = p->rows * ((p->M + p->C - 1) / p->C);
  pc.xoff = i == 0 ? xelem : 0;
  pc.ooff = i == pl->np - 1 ? oelem : 0;
  pc.ngroups = groups;
  pc.scale = inverse ? (float)(1.0 / (double)pl->n) : 1.0f;
  if (hk) {
    pc.n = f->n;
    pc.km1 = f->km1;
    pc.S = f->S;
    pc.nb = f->nb;
    pc.nblk = f->nblk;
    pc.aoff = f->sigoff;
    pc.hoff = f->hoff;
    pc.cap = f->cap;
  }
  uint32_t mx = d->props.limits.maxComputeWorkGroupCount[0];
  uint32_t gx = groups < mx ? groups : mx;
  if (gx > 65535)
    gx = 65535;
  return dspk__vk_dispatch(d, k, b, hk ? 6 : 3, &pc, hk ? sizeof pc : 16, gx,
                           (groups + gx - 1) / gx, 1);
}

int dspk__vk_sfft(struct dspk__dev *d, const struct dspk__vk_sfft_cfg *cfg, uint64_t n,
                  uint64_t batch, int inverse, const struct dspk__vk_bind *x, uint32_t xelem,
                  const struct dspk__vk_bind *o, uint32_t oelem, void **own,
                  struct dspk__opctx *ctx) {
  if (!dspk__vk_sfft_valid(d, n, batch, cfg)) {
    char name[64];
    dspk__vk_sfft_name(cfg, name, sizeof name);
    return dspk__vk_fail(ctx, DSPK_EINVAL, "fft: configuration %s cannot run n=%llu x %llu",
                         name, (unsigned long long)n, (unsigned long long)batch);
  }
  struct splan *pl = own ? *own : NULL;
  int r = 0;
  if (!own)
    r = get_plan(d, n, batch, cfg, &pl);
  else if (!pl && (r = make_plan(d, n, batch, cfg, &pl)) == 0)
    *own = pl;
  for (int i = 0; r == 0 && i < pl->np; i++)
    r = run_pass(d, pl, i, inverse != 0, x, xelem, o, oelem, NULL, ctx);
  return r;
}

int dspk__vk_sfft_fir(struct dspk__dev *d, const struct dspk__vk_sfft_cfg *cfg, uint64_t L,
                      uint64_t batch, int inverse, const struct dspk__vk_sfft_fir *f,
                      const struct dspk__vk_bind *x, uint32_t xelem,
                      const struct dspk__vk_bind *o, uint32_t oelem, struct dspk__opctx *ctx) {
  struct splan *pl;
  if (!dspk__vk_sfft_valid(d, L, batch, cfg))
    return dspk__vk_fail(ctx, DSPK_EINVAL, "fir: no transform of our kernels for %llu x %llu",
                         (unsigned long long)L, (unsigned long long)batch);
  int r = get_plan(d, L, batch, cfg, &pl);
  for (int i = 0; r == 0 && i < pl->np; i++)
    r = run_pass(d, pl, i, inverse != 0, x, xelem, o, oelem, f, ctx);
  return r;
}

/* ---- profile (benchmarks) -------------------------------------------------- */

struct prof_ud {
  struct dspk__dev *d;
  struct splan *pl;
  int pass; /* -1: the whole transform */
  struct dspk__vk_bind x, o;
};

static int rec_pass(void *ud, int i) {
  struct prof_ud *u = ud;
  (void)i;
  int r = 0;
  for (int p = u->pass < 0 ? 0 : u->pass; r == 0 && p <= (u->pass < 0 ? u->pl->np - 1 : u->pass);
       p++)
    r = run_pass(u->d, u->pl, p, 0, &u->x, 0, &u->o, 0, NULL, NULL);
  return r;
}

/* GPU ms of pass `pass` (-1: all) of cfg, or a negative error. */
static int time_cfg(struct prof_ud *u, uint64_t n, uint64_t batch,
                    const struct dspk__vk_sfft_cfg *cfg, int pass, double *ms) {
  int r = make_plan(u->d, n, batch, cfg, &u->pl);
  if (r)
    return r;
  u->pass = pass;
  r = dspk__vk_gpu_ms(u->d, 10, rec_pass, u, ms);
  dspk__vk_sfft_plan_free(u->d, u->pl);
  u->pl = NULL;
  return r;
}

int dspk__vk_sfft_profile(struct dspk__dev *d, uint64_t n, uint64_t batch, char *buf,
                          size_t len) {
  /* (2 and 4 values per thread never measured best) */
  static const uint32_t es[] = {8, 16, 32}, cs[] = {1, 2, 4, 8, 16, 32};
  struct prof_ud u = {.d = d};
  struct dspk__mem *x = NULL, *y = NULL;
  size_t bytes = (size_t)(n * batch) * 8;
  struct dspk__vk_sbuf b = {buf, len, 0, 0};
  int r;
  buf[0] = 0;
  if (!is_pow2(n) || n < 16)
    return DSPK_EINVAL;
  if ((r = dspk__vk_alloc(d, bytes, &x)) || (r = dspk__vk_alloc(d, bytes, &y)))
    goto out;
  VkCommandBuffer cb;
  if ((r = dspk__vk_cmd(d, &cb)))
    goto out;
  VK(CmdFillBuffer)(cb, x->buf, x->off, bytes, 0);
  dspk__vk_barrier(d);
  u.x = (struct dspk__vk_bind){x->buf, x->off, bytes};
  u.o = (struct dspk__vk_bind){y->buf, y->off, bytes};
  double best_all = 1e30;
  char best_name[64] = "";
  for (uint32_t l1 = 1; l1 < n; l1 = l1 == 1 ? 4 : 2 * l1) {
    if (l1 == 1 ? n > DSPK__SK_MAXL : l1 > DSPK__SK_MAXL || n / l1 > DSPK__SK_MAXL || n / l1 < 4)
      continue;
    /* the pass not being varied: 16 values per thread (or its length) */
    uint32_t L0 = l1 == 1 ? (uint32_t)n : l1, L1 = l1 == 1 ? 16 : (uint32_t)(n / l1);
    struct dspk__vk_sfft_cfg cfg = {
        l1, {1, 1}, {L0 < 16 ? L0 : 16, L1 < 16 ? L1 : 16}, {1, 1}};
    int np = l1 == 1 ? 1 : 2;
    struct dspk__vk_sfft_cfg best = cfg;
    double sum = 0;
    for (int p = 0; p < np; p++) {
      double bms = 1e30;
      ap(&b, "%ssplit %u pass %d:", b.at ? "\n" : "", l1, p);
      for (size_t c = 0; c < 6; c++)
        for (size_t e = 0; e < 3; e++)
          for (uint32_t h = 1; h <= 4; h *= 2) {
            struct dspk__vk_sfft_cfg t = best;
            t.c[p] = cs[c];
            t.e[p] = es[e];
            t.h[p] = h;
            if (!valid_pass(d, n, batch, &t, p))
              continue;
            double ms;
            if ((r = time_cfg(&u, n, batch, &t, p, &ms)))
              goto out;
            char pn[32];
            pass_name(pn, sizeof pn, cs[c], es[e], h);
            ap(&b, " %s %.4f", pn, ms);
            if (ms < bms) {
              bms = ms;
              cfg.c[p] = cs[c];
              cfg.e[p] = es[e];
              cfg.h[p] = h;
            }
          }
      best.c[p] = cfg.c[p];
      best.e[p] = cfg.e[p];
      best.h[p] = cfg.h[p];
      sum += bms;
    }
    double ms;
    if (sum >= 1e30 || !dspk__vk_sfft_valid(d, n, batch, &best))
      continue; /* a pass with no configuration measured */
    if ((r = time_cfg(&u, n, batch, &best, -1, &ms)))
      goto out;
    char name[64];
    dspk__vk_sfft_name(&best, name, sizeof name);
    ap(&b, "\nsplit %u best %s: %.4f ms (passes alone %.4f)", l1, name, ms, sum);
    if (ms < best_all) {
      best_all = ms;
      snprintf(best_name, sizeof best_name, "%s", name);
    }
  }
  ap(&b, "\nbest %s %.4f ms", best_name, best_all);
out:
  dspk__vk_submit(d);
  dspk__vk_wait_value(d, d->submitted);
  dspk__vk_free(d, x);
  dspk__vk_free(d, y);
  return r;
}
