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
 * Complex operands holding an infinity or a NaN go through a plain loop
 * instead of BLAS: OpenBLAS's cgemm/zgemm scale their sums by alpha = 1+0j
 * as a complex product, which turns an infinite sum such as inf+nanj into
 * nan+nanj, where numpy's einsum keeps the infinite part; and so does a
 * BLAS result of finite complex operands that holds an infinity or a NaN
 * (a product or a sum that overflowed: inf+2j came back inf+nanj).
 *
 * Summing the summed-only labels first (distributivity) is exact only in
 * real arithmetic: a partial sum may overflow where every product and the
 * result are finite (f32 [[3e38, 3e38]] summed is inf; times 0.25 it should
 * be 3e38), and an infinity met by values of both signs in the other
 * operand gives inf - inf = NaN in numpy's sum of products, but
 * inf * (their sum) after the pre-sum.  So when an operand, after its
 * pre-sum, holds an infinity or a NaN (either cause), the contraction is
 * made again without pre-sums: each operand permuted with its summed-only
 * labels as the innermost axes, and a plain loop adding every product as
 * numpy does (sum_products).  Finite data whose pre-sums stay finite (the
 * common case) keeps the pre-sum and BLAS.
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

/* The batched complex product C = A @ B (batch x M x K by batch x K x N,
 * contiguous) as numpy's einsum computes it: each term the plain complex
 * product (ar*br - ai*bi, ar*bi + ai*br) in the dtype, summed in K order,
 * with no further scaling.  0, or DSPK_ECANCELED. */
static int plain_cgemm(int dbl, int64_t nb, int64_t M, int64_t N, int64_t K,
                       const char *A, const char *B, char *C,
                       const struct dspk__opctx *ctx) {
  int64_t since = 0;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < M; i++) {
      if ((since += N * K) >= GATHER_CHECK) {
        since = 0;
        if (dspk__cpu_canceled(ctx))
          return DSPK_ECANCELED;
      }
      for (int64_t j = 0; j < N; j++) {
        int64_t ia = 2 * (b * M + i) * K, ib = 2 * (b * K * N + j), ic = 2 * ((b * M + i) * N + j);
        if (dbl) {
          const double *a = (const double *)A + ia, *x = (const double *)B + ib;
          double re = 0, im = 0;
          for (int64_t k = 0; k < K; k++, a += 2, x += 2 * N) {
            re += a[0] * x[0] - a[1] * x[1];
            im += a[0] * x[1] + a[1] * x[0];
          }
          ((double *)C)[ic] = re;
          ((double *)C)[ic + 1] = im;
        } else {
          const float *a = (const float *)A + ia, *x = (const float *)B + ib;
          float re = 0, im = 0;
          for (int64_t k = 0; k < K; k++, a += 2, x += 2 * N) {
            re += a[0] * x[0] - a[1] * x[1];
            im += a[0] * x[1] + a[1] * x[0];
          }
          ((float *)C)[ic] = re;
          ((float *)C)[ic + 1] = im;
        }
      }
    }
  return 0;
}

/* C = the plain sums of products, as numpy's einsum: C[b,m,n] (batch x M x
 * N, contiguous) = sum over k, s, t of A[b,m,k,s] * B[b,k,t,n] (A batch x M
 * x K x S, B batch x K x T x N, contiguous), each product (complex: ar*br -
 * ai*bi, ar*bi + ai*br) and the running sum in the dtype.  0, or
 * DSPK_ECANCELED. */
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

/* Real dtypes: C[b,m,n] = the sum over k, s, t of A[b,m,k,s] * B[b,k,t,n]
 * (both contiguous), in K * (S + T) steps per output instead of K * S * T:
 * sum_{s,t} a_s b_t is (sum a_s)(sum b_t) but for what IEEE adds, which the
 * kinds of values in each group decide (an infinity times a zero, infinite
 * products of both signs: NaN; else an infinite product gives its sign).
 * With none of those every value is finite, and the sums, their products
 * and the sum over k are made in long double, whose range holds them
 * (|values| < 2^1024, at most 2^63 of them, squared: far below 2^16384),
 * rounded once to the dtype (an infinity when the value is past its
 * range, as the exact sum would be). */
static int sum_products_real(int dbl, int64_t nb, int64_t M, int64_t N, int64_t K, int64_t S,
                             int64_t T, const char *A, const char *B, char *C,
                             struct dspk__opctx *ctx) {
  int64_t na = nb * M * K, nbk = nb * K * N;
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
  for (int64_t r = 0; r < na; r++) {
    long double acc = 0;
    unsigned k = 0;
    for (int64_t x = 0; x < S; x++) {
      double v = AT(A, r * S + x);
      k |= kind_of(v);
      acc += v;
    }
    sa[r] = acc;
    ka[r] = (unsigned char)k;
    if (check_cancel(&since, S, ctx))
      goto canceled;
  }
  for (int64_t bk = 0; bk < nb * K; bk++) {
    long double *row = sb + bk * N;
    unsigned char *krow = kb + bk * N;
    for (int64_t n = 0; n < N; n++)
      row[n] = 0;
    for (int64_t t = 0; t < T; t++) {
      for (int64_t n = 0; n < N; n++) {
        double v = AT(B, (bk * T + t) * N + n);
        krow[n] |= (unsigned char)kind_of(v);
        row[n] += v;
      }
      if (check_cancel(&since, N, ctx))
        goto canceled;
    }
  }
#undef AT
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < M; i++) {
      for (int64_t j = 0; j < N; j++) {
        long double acc = 0;
        bool nan = false, pinf = false, ninf = false;
        for (int64_t k = 0; k < K; k++) {
          unsigned x = ka[(b * M + i) * K + k], y = kb[(b * K + k) * N + j];
          bool xinf = x & (K_PINF | K_NINF), yinf = y & (K_PINF | K_NINF);
          nan |= (x & K_NAN) || (y & K_NAN) || (xinf && (y & K_ZERO)) ||
                 (yinf && (x & K_ZERO));
          pinf |= ((x & K_PINF) && (y & (K_PFIN | K_PINF))) ||
                  ((x & K_NINF) && (y & (K_NFIN | K_NINF))) ||
                  ((y & K_PINF) && (x & K_PFIN)) || ((y & K_NINF) && (x & K_NFIN));
          ninf |= ((x & K_PINF) && (y & (K_NFIN | K_NINF))) ||
                  ((x & K_NINF) && (y & (K_PFIN | K_PINF))) ||
                  ((y & K_PINF) && (x & K_NFIN)) || ((y & K_NINF) && (x & K_PFIN));
          acc += sa[(b * M + i) * K + k] * sb[(b * K + k) * N + j];
        }
        double v = nan || (pinf && ninf) ? NAN : pinf ? INFINITY : ninf ? -INFINITY
                                                                         : (double)acc;
        int64_t ic = (b * M + i) * N + j;
        if (dbl)
          ((double *)C)[ic] = v;
        else
          ((float *)C)[ic] = nan || pinf || ninf ? (float)v : (float)acc;
      }
      if (check_cancel(&since, N * K, ctx))
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

/* Complex dtypes: every product added as numpy's einsum does, K * S * T
 * steps per output, a cancel seen within about GATHER_CHECK of them. */
static int sum_products(dspk_dtype dt, int64_t nb, int64_t M, int64_t N, int64_t K, int64_t S,
                        int64_t T, const char *A, const char *B, char *C,
                        struct dspk__opctx *ctx) {
  int dbl = dt == DSPK_F64 || dt == DSPK_C128;
  struct watch since;
  watch_init(&since);
  if (!dspk__dtype_is_complex(dt))
    return sum_products_real(dbl, nb, M, N, K, S, T, A, B, C, ctx);
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double dre = 0, dim = 0;
        float fre = 0, fim = 0;
        int64_t ic = (b * M + i) * N + j;
        for (int64_t k = 0; k < K; k++)
          for (int64_t s = 0; s < S; s++) {
            if (check_cancel(&since, T, ctx))
              return DSPK_ECANCELED;
            for (int64_t t = 0; t < T; t++) {
              int64_t ia = ((b * M + i) * K + k) * S + s, ib = ((b * K + k) * T + t) * N + j;
              if (dbl) {
                const double *a = (const double *)A + 2 * ia, *x = (const double *)B + 2 * ib;
                dre += a[0] * x[0] - a[1] * x[1];
                dim += a[0] * x[1] + a[1] * x[0];
              } else {
                const float *a = (const float *)A + 2 * ia, *x = (const float *)B + 2 * ib;
                fre += a[0] * x[0] - a[1] * x[1];
                fim += a[0] * x[1] + a[1] * x[0];
              }
            }
          }
        if (dbl) {
          ((double *)C)[2 * ic] = dre;
          ((double *)C)[2 * ic + 1] = dim;
        } else {
          ((float *)C)[2 * ic] = fre;
          ((float *)C)[2 * ic + 1] = fim;
        }
      }
  return 0;
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
  int nonfinite = (dspk__dtype_is_complex(dt) || nsa || nsb) &&
                  (any_nonfinite(pa, dbl, W * nb * M * K) ||
                   any_nonfinite(pb, dbl, W * nb * K * N));
  if (!nonfinite) {
    rc = dspk__cpu_gemm_batched(dev, dt, nb, M, N, K, pa, pb, pc, ctx);
    /* Finite complex operands whose products or sums overflow: the BLAS's
     * scaling by 1+0j makes the other part of an infinite one NaN (inf+2j
     * becomes inf+nanj), so such a result is made again as numpy's. */
    if (rc == 0 && dspk__dtype_is_complex(dt) && any_nonfinite(pc, dbl, W * nb * M * N))
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
    rc = plain_cgemm(dt == DSPK_C128, nb, M, N, K, pa, pb, pc, ctx);
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
