/*
 * contract on the cpu: two-operand numpy.einsum by permutation + gemm.
 *
 * Each label is one of: batch (in A, B and the output), contracted (A and B,
 * not the output), free-A / free-B (one operand and the output), or
 * summed-only (one operand, nowhere else).  A is gathered into a contiguous
 * (batch, M, K) array, summing its summed-only labels on the way, B into
 * (batch, K, N); a batched gemm gives (batch, M, N), which is permuted into
 * the output's label order.  An operand already in the wanted order is used
 * in place, and a result already in the output's order is written straight
 * into the output, so "ik,kj->ij" is one plain BLAS call.
 *
 * BLAS's sums are made in the dtype, in its own order: a running sum may
 * overflow where every product and the result are finite, or meet an
 * infinity after it overflowed (f32 -2e38, -2e38, inf: NaN, where the
 * products' rule gives inf), and OpenBLAS's cgemm/zgemm scale their sums by
 * alpha = 1+0j as a complex product, which turns inf+2j into inf+nanj.
 * Summing the summed-only labels first (distributivity) is exact only in
 * real arithmetic: a partial sum may overflow (f32 [[3e38, 3e38]] summed is
 * inf; times 0.25 it should be 3e38), and an infinity met by values of both
 * signs in the other operand gives inf - inf = NaN in the sum of products,
 * but inf * (their sum) after the pre-sum.  So when an operand, after its
 * pre-sums, holds an infinity or a NaN (either cause), or the BLAS result
 * does, the contraction is made again without pre-sums: each operand
 * permuted with its summed-only labels as the innermost axes, and
 * sum_products adding the finite products in long double apart from the
 * infinite and NaN ones, which decide the result by the kinds of products
 * there are, whatever their order.  Finite data whose pre-sums and result
 * stay finite (the common case) keeps the pre-sum and BLAS.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu.h"
#include "proto/testhook.h"

/* A strided view: element (i0..i{nd-1}) of the destination, contiguous in
 * that order, is the sum over the summed indices of src at sum(i*str). */
struct view {
  int nd, ns;
  int64_t dim[DSPK_MAX_RANK], str[DSPK_MAX_RANK];
  int64_t sdim[DSPK_MAX_RANK], sstr[DSPK_MAX_RANK];
};

/* Sums src over v's summed indices starting at off (double precision). */
static void sum_at(const struct view *v, const char *src, int64_t off, int dbl,
                   int W, double acc[2]) {
  int64_t idx[DSPK_MAX_RANK] = {0}, n = 1;
  for (int i = 0; i < v->ns; i++)
    n *= v->sdim[i];
  acc[0] = acc[1] = 0;
  for (int64_t t = 0; t < n; t++) {
    for (int w = 0; w < W; w++)
      acc[w] += dbl ? ((const double *)src)[off * W + w]
                    : (double)((const float *)src)[off * W + w];
    for (int i = v->ns - 1; i >= 0; i--) {
      off += v->sstr[i];
      if (++idx[i] < v->sdim[i])
        break;
      off -= v->sstr[i] * v->sdim[i];
      idx[i] = 0;
    }
  }
}

/* gather sees a cancel after reading about this many elements (a few ms):
 * a permuted copy, or the sums of an operand's summed-only labels, reads
 * all of an operand, which can take seconds. */
#define GATHER_CHECK ((int64_t)1 << 20)

/* Writes the view of src into dst (contiguous): 0, or DSPK_ECANCELED. */
static int gather(const struct view *v, const char *src, char *dst, dspk_dtype dt,
                  const struct dspk__opctx *ctx) {
  size_t es = dspk__dtype_size(dt);
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  int W = dspk__dtype_is_complex(dt) ? 2 : 1;
  int64_t idx[DSPK_MAX_RANK] = {0}, n = 1, off = 0, per = 1, since = 0;
  for (int i = 0; i < v->nd; i++)
    n *= v->dim[i];
  for (int i = 0; i < v->ns; i++)
    per *= v->sdim[i]; /* elements read per element written */
  for (int64_t t = 0; t < n; t++) {
    if ((since += per) >= GATHER_CHECK) {
      since = 0;
      if (dspk__cpu_canceled(ctx))
        return DSPK_ECANCELED;
    }
    if (v->ns == 0) {
      switch (es) {
      case 4: ((float *)dst)[t] = ((const float *)src)[off]; break;
      case 8: ((double *)dst)[t] = ((const double *)src)[off]; break;
      default: memcpy(dst + t * es, src + off * es, es); break;
      }
    } else {
      double acc[2];
      sum_at(v, src, off, dbl, W, acc);
      for (int w = 0; w < W; w++) {
        if (dbl)
          ((double *)dst)[t * W + w] = acc[w];
        else
          ((float *)dst)[t * W + w] = (float)acc[w];
      }
    }
    for (int i = v->nd - 1; i >= 0; i--) {
      off += v->str[i];
      if (++idx[i] < v->dim[i])
        break;
      off -= v->str[i] * v->dim[i];
      idx[i] = 0;
    }
  }
  return 0;
}

/* 1 when one of the n values (parts, for a complex dtype) at p is an
 * infinity or a NaN. */
static int any_nonfinite(const char *p, int dbl, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(dbl ? ((const double *)p)[i] : ((const float *)p)[i]))
      return 1;
  return 0;
}

/* The kinds of value a group of summed-only values holds (one bit each). */
enum { K_NAN = 1, K_PINF = 2, K_NINF = 4, K_ZERO = 8, K_PFIN = 16, K_NFIN = 32 };

static unsigned kind_of(double x) {
  if (isnan(x))
    return K_NAN;
  if (isinf(x))
    return x > 0 ? K_PINF : K_NINF;
  return x == 0 ? K_ZERO : x > 0 ? K_PFIN : K_NFIN;
}

#if LDBL_MAX_EXP <= DBL_MAX_EXP
#error "contract's sums of products need a long double wider than double"
#endif

/* Whether cancel was asked, looked at once per GATHER_CHECK steps.  Test
 * hook: DSPK_CPU_CONTRACT_CANCEL_AFTER=N asks for the cancel at the N-th
 * look (a deterministic test of the looks inside one output). */
struct watch {
  int64_t since, looks, after;
};

static void watch_init(struct watch *w) {
  const char *h = DSPK_TEST_HOOK("DSPK_CPU_CONTRACT_CANCEL_AFTER");
  w->since = w->looks = 0;
  w->after = h ? atoll(h) : 0;
}

static bool check_cancel(struct watch *w, int64_t steps, const struct dspk__opctx *ctx) {
  if ((w->since += steps) < GATHER_CHECK)
    return false;
  w->since = 0;
  if (++w->looks == w->after && ctx && ctx->cancel)
    atomic_store(ctx->cancel, 1);
  return dspk__cpu_canceled(ctx);
}

/* What the products of a group of kinds x by one of kinds y, negated when
 * neg, add to an output part's flags: an infinity times a zero or a NaN is
 * NaN, an infinity times a value of a sign gives an infinity of the
 * product's sign (K_NAN, K_PINF, K_NINF; 0 when every product is finite). */
static unsigned pair_kinds(unsigned x, unsigned y, int neg) {
  unsigned xinf = x & (K_PINF | K_NINF), yinf = y & (K_PINF | K_NINF), r = 0;
  if (!xinf && !yinf && !((x | y) & K_NAN))
    return 0;
  if ((x & K_NAN) || (y & K_NAN) || (xinf && (y & K_ZERO)) || (yinf && (x & K_ZERO)))
    r |= K_NAN;
  if (((x & K_PINF) && (y & (K_PFIN | K_PINF))) || ((x & K_NINF) && (y & (K_NFIN | K_NINF))) ||
      ((y & K_PINF) && (x & K_PFIN)) || ((y & K_NINF) && (x & K_NFIN)))
    r |= neg ? K_NINF : K_PINF;
  if (((x & K_PINF) && (y & (K_NFIN | K_NINF))) || ((x & K_NINF) && (y & (K_PFIN | K_PINF))) ||
      ((y & K_PINF) && (x & K_NFIN)) || ((y & K_NINF) && (x & K_PFIN)))
    r |= neg ? K_PINF : K_NINF;
  return r;
}

/* C[b,m,n] = the sum over k, s, t of A[b,m,k,s] * B[b,k,t,n] (batch x M x
 * K x S and batch x K x T x N, contiguous; C batch x M x N), in K * (S + T)
 * steps per output instead of K * S * T: sum_{s,t} a_s b_t is (sum a_s)(sum
 * b_t) but for what IEEE adds, which the kinds of values in each group
 * decide (an infinity times a zero, or a NaN: NaN; infinite products of
 * both signs: NaN; else an infinite product gives its sign).  A complex
 * product is its four real ones (re: ar*br and -(ai*bi); im: ar*bi and
 * ai*br), each part of C a real sum of them, so (inf+0j)(2+0j) adds inf to
 * the real part and NaN (inf*0) to the imaginary one, as numpy's product.
 * The finite values are summed apart from the flags, whatever their order:
 * the groups' sums, their products and the sum over k in long double, whose
 * range holds them (|values| < 2^1024, at most 2^63 of them, squared: far
 * below 2^16384), rounded once to the dtype at the end (an infinity when
 * the sum is past its range).  S = T = 1 adds the products one by one. */
static int sum_products(dspk_dtype dt, int64_t nb, int64_t M, int64_t N, int64_t K, int64_t S,
                        int64_t T, const char *A, const char *B, char *C,
                        struct dspk__opctx *ctx) {
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  int W = dspk__dtype_is_complex(dt) ? 2 : 1;
  int64_t na = nb * M * K * W, nbk = nb * K * N * W;
  struct watch since;
  watch_init(&since);
  long double *sa = malloc((size_t)(na + nbk) * sizeof *sa);
  unsigned char *ka = calloc((size_t)(na + nbk), 1);
  int rc = 0;
  if (!sa || !ka) {
    free(sa);
    free(ka);
    return dspk__cpu_err(ctx, DSPK_ENOMEM, "contract: out of memory for the sums of "
                                           "summed-only labels");
  }
  long double *sb = sa + na;
  unsigned char *kb = ka + na;
#define AT(P, i) (dbl ? ((const double *)(P))[i] : (double)((const float *)(P))[i])
  /* A's groups: (b, m, k) part w sums its S values, W apart. */
  for (int64_t r = 0; r < nb * M * K; r++) {
    for (int w = 0; w < W; w++) {
      long double acc = 0;
      unsigned k = 0;
      for (int64_t x = 0; x < S; x++) {
        double v = AT(A, (r * S + x) * W + w);
        k |= kind_of(v);
        acc += v;
      }
      sa[r * W + w] = acc;
      ka[r * W + w] = (unsigned char)k;
    }
    if (check_cancel(&since, S * W, ctx))
      goto canceled;
  }
  /* B's groups: (b, k, n) part w sums its T values, N * W apart. */
  for (int64_t bk = 0; bk < nb * K; bk++) {
    long double *row = sb + bk * N * W;
    unsigned char *krow = kb + bk * N * W;
    for (int64_t n = 0; n < N * W; n++)
      row[n] = 0;
    for (int64_t t = 0; t < T; t++) {
      for (int64_t n = 0; n < N * W; n++) {
        double v = AT(B, (bk * T + t) * N * W + n);
        krow[n] |= (unsigned char)kind_of(v);
        row[n] += v;
      }
      if (check_cancel(&since, N * W, ctx))
        goto canceled;
    }
  }
#undef AT
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < M; i++) {
      for (int64_t j = 0; j < N; j++) {
        int64_t ic = (b * M + i) * N + j;
        for (int w = 0; w < W; w++) {
          /* Part w of the output: the pairs of parts (x of A, y of B,
           * negated) whose products it adds. */
          static const int pairs[3][2][3] = {{{0, 0, 0}, {0, 0, 0}},
                                             {{0, 0, 0}, {1, 1, 1}},
                                             {{0, 1, 0}, {1, 0, 0}}};
          const int(*pr)[3] = W == 1 ? pairs[0] : pairs[1 + w];
          long double acc = 0, one_a = 0, one_b = 0;
          unsigned f = 0;
          int64_t nz = 0; /* the nonzero finite products (one_a * one_b the last) */
          for (int64_t k = 0; k < K; k++) {
            int64_t ia = ((b * M + i) * K + k) * W, ib = ((b * K + k) * N + j) * W;
            for (int q = 0; q < W; q++) {
              unsigned x = ka[ia + pr[q][0]], y = kb[ib + pr[q][1]];
              unsigned pf = pair_kinds(x, y, pr[q][2]);
              if (pf) {
                f |= pf;
                continue;
              }
              long double u = sa[ia + pr[q][0]], t = sb[ib + pr[q][1]];
              if (u != 0 && t != 0) {
                nz++;
                one_a = pr[q][2] ? -u : u;
                one_b = t;
              }
              if (pr[q][2])
                acc -= u * t;
              else
                acc += u * t;
            }
          }
          /* One nonzero product of two doubles (f64, c128): its exact value
           * rounded once, as numpy's a*b, by the double product itself; the
           * long double one rounds to 64 bits first, and rounding that to
           * 53 gave one unit off near a tie (probe round 14, B1).  An f32
           * product is exact in long double. */
          if (dbl && nz == 1 && (long double)(double)one_a == one_a &&
              (long double)(double)one_b == one_b) {
            acc = (double)one_a * (double)one_b;
          }
          double v = (f & K_NAN) || (f & (K_PINF | K_NINF)) == (K_PINF | K_NINF) ? NAN
                     : f & K_PINF                                               ? INFINITY
                     : f & K_NINF                                               ? -INFINITY
                                                                                : 0;
          if (dbl)
            ((double *)C)[ic * W + w] = f ? v : (double)acc;
          else
            ((float *)C)[ic * W + w] = f ? (float)v : (float)acc;
        }
      }
      if (check_cancel(&since, N * K * W * W, ctx))
        goto canceled;
    }
  goto out;
canceled:
  rc = DSPK_ECANCELED;
out:
  free(sa);
  free(ka);
  return rc;
}

static int has(const char *s, char c) { return c && strchr(s, c) != NULL; }

/* Element strides of a C-order tensor, by label. */
static void label_strides(const char *lab, const int64_t *shape, int64_t str[128]) {
  int r = (int)strlen(lab);
  int64_t s = 1;
  for (int i = r - 1; i >= 0; i--) {
    str[(unsigned char)lab[i]] = s;
    s *= shape[i];
  }
}

/* Builds the view of an operand (labels lab, strides str) in the order of
 * `order`, summing the labels of `summed`. */
static void make_view(struct view *v, const char *order, const char *summed,
                      const int64_t size[128], const int64_t str[128]) {
  v->nd = (int)strlen(order);
  v->ns = (int)strlen(summed);
  for (int i = 0; i < v->nd; i++) {
    v->dim[i] = size[(unsigned char)order[i]];
    v->str[i] = str[(unsigned char)order[i]];
  }
  for (int i = 0; i < v->ns; i++) {
    v->sdim[i] = size[(unsigned char)summed[i]];
    v->sstr[i] = str[(unsigned char)summed[i]];
  }
}

static int64_t prod(const char *labels, const int64_t size[128]) {
  int64_t p = 1;
  for (const char *c = labels; *c; c++)
    p *= size[(unsigned char)*c];
  return p;
}

int dspk__cpu_contract(struct dspk__dev *dev, struct dspk__op *op,
                       struct dspk__opctx *ctx) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  struct dspk__tensor *O = &op->out[0];
  char lab[3][DSPK_MAX_RANK + 1];
  int64_t size[128];
  char msg[160];
  int rc = dspk__contract_parse(op->u.contract.subscripts, A, B, lab, size, msg,
                                sizeof msg);
  if (rc)
    return dspk__cpu_err(ctx, rc, "%s", msg);
  const char *la = lab[0], *lb = lab[1], *lo = lab[2];

  /* Classify: batch and free labels in output order, contracted in A's. */
  char bat[DSPK_MAX_RANK + 1] = "", fa[DSPK_MAX_RANK + 1] = "",
       fb[DSPK_MAX_RANK + 1] = "", con[DSPK_MAX_RANK + 1] = "",
       sa[DSPK_MAX_RANK + 1] = "", sb[DSPK_MAX_RANK + 1] = "";
  int nbat = 0, nfa = 0, nfb = 0, ncon = 0, nsa = 0, nsb = 0;
  for (const char *c = lo; *c; c++) {
    if (has(la, *c) && has(lb, *c))
      bat[nbat++] = *c;
    else if (has(la, *c))
      fa[nfa++] = *c;
    else
      fb[nfb++] = *c;
  }
  for (const char *c = la; *c; c++) {
    if (has(lo, *c))
      continue;
    if (has(lb, *c))
      con[ncon++] = *c;
    else
      sa[nsa++] = *c;
  }
  for (const char *c = lb; *c; c++)
    if (!has(lo, *c) && !has(la, *c))
      sb[nsb++] = *c;
  bat[nbat] = fa[nfa] = fb[nfb] = con[ncon] = sa[nsa] = sb[nsb] = 0;

  dspk_dtype dt = A->dtype;
  size_t es = dspk__dtype_size(dt);
  int64_t nb = prod(bat, size), M = prod(fa, size), N = prod(fb, size),
          K = prod(con, size);
  if (dspk__tensor_numel(O) == 0)
    return 0;
  if (dspk__tensor_numel(A) == 0 || dspk__tensor_numel(B) == 0) {
    /* Every sum is empty: zeros, without gathering operands whose labels
     * (a contracted one of 2^30, say) could still be large. */
    memset(dspk__cpu_ptr(O), 0, dspk__tensor_nbytes(O));
    return 0;
  }

  char oa[3 * DSPK_MAX_RANK + 1], ob[3 * DSPK_MAX_RANK + 1],
      oc[3 * DSPK_MAX_RANK + 1];
  snprintf(oa, sizeof oa, "%s%s%s", bat, fa, con);
  snprintf(ob, sizeof ob, "%s%s%s", bat, con, fb);
  snprintf(oc, sizeof oc, "%s%s%s", bat, fa, fb);

  int64_t stra[128], strb[128], strc[128];
  int W = dspk__dtype_is_complex(dt) ? 2 : 1;
  label_strides(la, A->shape, stra);
  label_strides(lb, B->shape, strb);
  char *ta = NULL, *tb = NULL, *tc = NULL;
  const char *pa = dspk__cpu_ptr(A), *pb = dspk__cpu_ptr(B);
  char *pc = dspk__cpu_ptr(O);
  struct view v;
  rc = 0;

  if (strcmp(oa, la) != 0 || nsa) {
    if (!(ta = malloc((size_t)(nb * M * K + 1) * es)))
      goto nomem;
    make_view(&v, oa, sa, size, stra);
    if ((rc = gather(&v, pa, ta, dt, ctx)) < 0)
      goto out;
    pa = ta;
  }
  if (strcmp(ob, lb) != 0 || nsb) {
    if (!(tb = malloc((size_t)(nb * K * N + 1) * es)))
      goto nomem;
    make_view(&v, ob, sb, size, strb);
    if ((rc = gather(&v, pb, tb, dt, ctx)) < 0)
      goto out;
    pb = tb;
  }
  if (dspk__cpu_canceled(ctx)) {
    rc = DSPK_ECANCELED;
    goto out;
  }
  int direct_out = strcmp(oc, lo) == 0;
  if (!direct_out) {
    if (!(tc = malloc((size_t)(nb * M * N) * es)))
      goto nomem;
    pc = tc;
  }
  int dbl = dt == DSPK_C128 || dt == DSPK_F64;
  /* An operand (after its pre-sums) holding an infinity or a NaN, or a
   * BLAS result holding one (an operand's, or a product or a running sum
   * that overflowed): made again by sum_products (see the top). */
  int nonfinite = any_nonfinite(pa, dbl, W * nb * M * K) ||
                  any_nonfinite(pb, dbl, W * nb * K * N);
  if (!nonfinite) {
    rc = dspk__cpu_gemm_batched(dev, dt, nb, M, N, K, pa, pb, pc, ctx);
    if (rc == 0 && any_nonfinite(pc, dbl, W * nb * M * N))
      nonfinite = 1;
  }
  if (nonfinite && (nsa || nsb)) {
    /* Again without pre-sums (see the top): A as (batch, M, K, its
     * summed-only labels), B as (batch, K, its summed-only labels, N). */
    int64_t S = prod(sa, size), T = prod(sb, size);
    char oa2[4 * DSPK_MAX_RANK + 1], ob2[4 * DSPK_MAX_RANK + 1];
    snprintf(oa2, sizeof oa2, "%s%s", oa, sa);
    snprintf(ob2, sizeof ob2, "%s%s%s%s", bat, con, sb, fb);
    free(ta);
    free(tb);
    ta = tb = NULL;
    pa = dspk__cpu_ptr(A);
    pb = dspk__cpu_ptr(B);
    if (strcmp(oa2, la) != 0) {
      if (!(ta = malloc((size_t)dspk__tensor_numel(A) * es)))
        goto nomem;
      make_view(&v, oa2, "", size, stra);
      if ((rc = gather(&v, pa, ta, dt, ctx)) < 0)
        goto out;
      pa = ta;
    }
    if (strcmp(ob2, lb) != 0) {
      if (!(tb = malloc((size_t)dspk__tensor_numel(B) * es)))
        goto nomem;
      make_view(&v, ob2, "", size, strb);
      if ((rc = gather(&v, pb, tb, dt, ctx)) < 0)
        goto out;
      pb = tb;
    }
    rc = sum_products(dt, nb, M, N, K, S, T, pa, pb, pc, ctx);
  } else if (nonfinite)
    rc = sum_products(dt, nb, M, N, K, 1, 1, pa, pb, pc, ctx);
  if (rc == 0 && !direct_out) {
    /* Permute (batch, free-A, free-B) into the output's order. */
    int64_t osize[128];
    memcpy(osize, size, sizeof osize);
    int64_t shp[3 * DSPK_MAX_RANK];
    for (int i = 0; oc[i]; i++)
      shp[i] = size[(unsigned char)oc[i]];
    label_strides(oc, shp, strc);
    make_view(&v, lo, "", osize, strc);
    rc = gather(&v, tc, dspk__cpu_ptr(O), dt, ctx);
  }
  goto out;
nomem:
  rc = dspk__cpu_err(ctx, DSPK_ENOMEM, "contract: out of memory for permuted copies");
out:
  free(ta);
  free(tb);
  free(tc);
  return rc;
}
