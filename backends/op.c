/*
 * dspk__op_infer(): the one place where the semantics of every op are
 * checked, shared by all backends.  It validates the number of inputs, their
 * dtypes, ranks and shapes and the op's options, and fills in the dtype and
 * shape of each output, following the numpy/scipy function each op mirrors:
 *
 *   gemm      numpy.matmul with batch broadcasting (A, B rank >= 2)
 *   fft       numpy.fft.fft / ifft / rfft along the last axis
 *   fir       scipy.signal.lfilter(h, 1, x) along the last axis
 *   contract  two-operand numpy.einsum with an explicit "->"
 *   reduce    sum/max/min/mean over a bitmask of axes (keepdims=False)
 *   map       elementwise add/sub/mul/scale/axpy/abs/exp
 *
 * Every error message is one line that starts with the op name and names the
 * operand (A, B, C, X, H) and the axis at fault, so a user can fix the call
 * from the message alone.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backends/op.h"
#include "proto/schema.h"
#include "proto/utf8.h"


static int is_real(dspk_dtype dt) { return dt == DSPK_F32 || dt == DSPK_F64; }
static int is_std(dspk_dtype dt) {
  return dt == DSPK_F32 || dt == DSPK_F64 || dt == DSPK_C64 || dt == DSPK_C128;
}

/* The real dtype of the same precision as a complex one. */
static dspk_dtype real_of(dspk_dtype dt) {
  return dt == DSPK_C64 ? DSPK_F32 : dt == DSPK_C128 ? DSPK_F64 : dt;
}

/* Writes "[d0, d1, ...]" into buf (cut with "..." when it does not fit). */
static const char *shape_str(const struct dspk__tensor *t, char *buf, size_t len) {
  size_t n = 0;
  int rank = t->rank < 0 ? 0 : t->rank > DSPK_MAX_RANK ? DSPK_MAX_RANK : t->rank;
  n += (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < rank && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (n < len)
    snprintf(buf + n, len - n, "]");
  else if (len > 4)
    memcpy(buf + len - 4, "...", 4);
  return buf;
}

/* Generic checks of one input: known dtype, rank in range, sizes >= 0 and
 * an extent (dspk__tensor_size) that fits an int64. */
static int check_tensor(const char *op, const char *name,
                        const struct dspk__tensor *t, char *msg, size_t len) {
  char sh[96];
  if ((unsigned)t->dtype >= DSPK_DTYPE_COUNT)
    return dspk__fail(msg, len, DSPK_EDTYPE, "%s: %s has an unknown dtype (%d)", op,
                name, (int)t->dtype);
  if (t->rank < 0 || t->rank > DSPK_MAX_RANK)
    return dspk__fail(msg, len, DSPK_ESHAPE, "%s: %s has rank %d (allowed 0..%d)", op,
                name, t->rank, DSPK_MAX_RANK);
  for (int i = 0; i < t->rank; i++)
    if (t->shape[i] < 0)
      return dspk__fail(msg, len, DSPK_ESHAPE, "%s: %s has a negative size %lld (axis %d)",
                  op, name, (long long)t->shape[i], i);
  if (dspk__tensor_size(t, NULL, NULL) != 0)
    return dspk__fail(msg, len, DSPK_ELIMIT,
                "%s: %s %s is too large: the product of its dimensions (each 0 counted "
                "as 1) times its item size passes 2^63-1 bytes", op,
                name, shape_str(t, sh, sizeof sh));
  return 0;
}

static int check_nin(const struct dspk__op *op, int lo, int hi, char *msg,
                     size_t len) {
  if (op->nin < lo || op->nin > hi) {
    if (lo == hi)
      return dspk__fail(msg, len, DSPK_EINVAL, "%s: takes %d input%s, got %d",
                  dspk__op_name(op->kind), lo, lo == 1 ? "" : "s", op->nin);
    return dspk__fail(msg, len, DSPK_EINVAL, "%s: takes %d to %d inputs, got %d",
                dspk__op_name(op->kind), lo, hi, op->nin);
  }
  return 0;
}

static void set_out(struct dspk__op *op, int i, dspk_dtype dt, int rank,
                    const int64_t *shape) {
  struct dspk__tensor *o = &op->out[i];
  o->dtype = dt;
  o->rank = rank;
  for (int k = 0; k < DSPK_MAX_RANK; k++)
    o->shape[k] = k < rank ? shape[k] : 0;
  o->mem = NULL;
  o->offset = 0;
}

/* ---- gemm --------------------------------------------------------------- */

/* An option's number v as the client sent it (sent, stored by the table:
 * an integer exactly, a float as a float, proto/dtype.h), or v as a float
 * when sent does not hold it (an op built without the decoder). */
static const char *sent_str(char *buf, size_t n, double v, const struct dspk__num_sent *sent) {
  double back = sent->kind == DSPK__NUM_UINT  ? (double)sent->v.u
                : sent->kind == DSPK__NUM_INT ? (double)sent->v.i
                                              : sent->v.f;
  if (sent->kind != DSPK__NUM_NONE && (back == v || (back != back && v != v)))
    return dspk__num_str(buf, n, sent);
  return dspk__float_str(buf, n, v, false);
}

/* An option (alpha, beta) of an op that computes in f32: rounded to the
 * nearest f32 as the kernel argument {f32: v} is, so a finite value that
 * would become an infinity is ERANGE in the same words, naming the value as
 * given. */
static int check_f32_scalar(const char *opname, const char *name, double v,
                            const struct dspk__num_sent *sent, char *msg, size_t len) {
  if (dspk__f64_fits_f32(v))
    return 0;
  char text[40];
  return dspk__fail(msg, len, DSPK_ERANGE, "%s: options.%s: %s is out of f32 range (it "
                    "would round to an infinity; the op computes in f32)", opname, name,
                    sent_str(text, sizeof text, v, sent));
}

/* v as an f32 holds it (dspk__f64_fits_f32(v): no overflow). */
static double round_f32(double v) { return (double)(float)v; }

void dspk__op_gemm_scalars(const struct dspk__op *op, double *alpha, double *beta) {
  int f32 = op->in[0].dtype != DSPK_F64;
  *alpha = f32 ? round_f32(op->u.gemm.alpha) : op->u.gemm.alpha;
  *beta = op->nin < 3 ? 0.0 : f32 ? round_f32(op->u.gemm.beta) : op->u.gemm.beta;
  /* A zero of either sign reads nothing (BLAS), so it is handed on as +0:
   * cuBLAS read C with beta -0 (a -1e-50 rounded to f32 on the H200). */
  if (*alpha == 0)
    *alpha = 0.0;
  if (*beta == 0)
    *beta = 0.0;
}

double dspk__op_map_alpha(const struct dspk__op *op) {
  dspk_dtype dt = op->in[0].dtype;
  return dt == DSPK_F32 || dt == DSPK_C64 ? round_f32(op->u.map.alpha) : op->u.map.alpha;
}

static int infer_gemm(struct dspk__op *op, char *msg, size_t len) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  int r = check_nin(op, 2, 3, msg, len);
  if (r) return r;
  static const char *names[] = {"A", "B", "C"};
  for (int i = 0; i < op->nin; i++)
    if ((r = check_tensor("gemm", names[i], &op->in[i], msg, len)))
      return r;
  for (int i = 0; i < 2; i++) {
    dspk_dtype dt = op->in[i].dtype;
    if (!(is_real(dt) || dt == DSPK_F16 || dt == DSPK_BF16))
      return dspk__fail(msg, len, DSPK_EDTYPE,
                  "gemm: %s has dtype %s (supported: f32, f64, f16, bf16)",
                  names[i], dspk__dtype_name(dt));
  }
  if (A->dtype != B->dtype)
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "gemm: A has dtype %s but B has dtype %s (must be equal)",
                dspk__dtype_name(A->dtype), dspk__dtype_name(B->dtype));
  for (int i = 0; i < 2; i++)
    if (op->in[i].rank < 2)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "gemm: %s has rank %d, needs rank >= 2 (1-D vectors are not "
                  "promoted: reshape to (1,K) or (K,1))",
                  names[i], op->in[i].rank);
  int ra = A->rank, rb = B->rank;
  int ta = op->u.gemm.trans_a != 0, tb = op->u.gemm.trans_b != 0;
  int am = ta ? ra - 1 : ra - 2, ak = ta ? ra - 2 : ra - 1;
  int bk = tb ? rb - 1 : rb - 2, bn = tb ? rb - 2 : rb - 1;
  if (A->shape[ak] != B->shape[bk])
    return dspk__fail(msg, len, DSPK_ESHAPE,
                "gemm: A has K=%lld (axis %d%s) but B has K=%lld (axis %d%s)",
                (long long)A->shape[ak], ak, ta ? ", trans_a" : "",
                (long long)B->shape[bk], bk, tb ? ", trans_b" : "");
  dspk_dtype odt = (A->dtype == DSPK_F64) ? DSPK_F64 : DSPK_F32;
  /* beta scales C: one without C is the client's mistake, not a no-op (a
   * zero, or an f32 product's beta that rounds to one, reads nothing). */
  double beta = op->u.gemm.beta;
  if (op->nin < 3 && !(beta == 0) &&
      !(odt == DSPK_F32 && dspk__f64_fits_f32(beta) && round_f32(beta) == 0)) {
    char text[40];
    return dspk__fail(msg, len, DSPK_EINVAL, "gemm: options.beta is %s without C (beta "
                      "scales C, the third input: send C, or leave beta out)",
                      sent_str(text, sizeof text, beta, &op->u.gemm.beta_sent));
  }
  if (odt == DSPK_F32 && (r = check_f32_scalar("gemm", "alpha", op->u.gemm.alpha,
                                                     &op->u.gemm.alpha_sent, msg, len)))
    return r;
  if (odt == DSPK_F32 && (r = check_f32_scalar("gemm", "beta", op->u.gemm.beta,
                                                     &op->u.gemm.beta_sent, msg, len)))
    return r;
  int ro = ra > rb ? ra : rb;
  int64_t shape[DSPK_MAX_RANK];
  /* Batch dimensions broadcast right-aligned, as numpy.matmul does. */
  for (int i = 0; i < ro - 2; i++) {
    int ia = i - (ro - ra), ib = i - (ro - rb);
    int64_t da = ia >= 0 ? A->shape[ia] : 1, db = ib >= 0 ? B->shape[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "gemm: batch dimensions do not broadcast: A has %lld (axis %d) "
                  "but B has %lld (axis %d)",
                  (long long)da, ia, (long long)db, ib);
    shape[i] = da == 1 ? db : da;
  }
  shape[ro - 2] = A->shape[am];
  shape[ro - 1] = B->shape[bn];
  if (op->nin == 3) {
    const struct dspk__tensor *C = &op->in[2];
    if (C->dtype != odt)
      return dspk__fail(msg, len, DSPK_EDTYPE,
                  "gemm: C has dtype %s but the output is %s (must be equal)",
                  dspk__dtype_name(C->dtype), dspk__dtype_name(odt));
    if (C->rank > ro)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "gemm: C has rank %d, more than the output's rank %d",
                  C->rank, ro);
    for (int i = 0; i < C->rank; i++) {
      int io = i + (ro - C->rank);
      if (C->shape[i] != 1 && C->shape[i] != shape[io])
        return dspk__fail(msg, len, DSPK_ESHAPE,
                    "gemm: C has %lld (axis %d) but the output has %lld (axis "
                    "%d): C must broadcast to the output",
                    (long long)C->shape[i], i, (long long)shape[io], io);
    }
  }
  op->nout = 1;
  set_out(op, 0, odt, ro, shape);
  return 0;
}

/* ---- fft ---------------------------------------------------------------- */

static int infer_fft(struct dspk__op *op, char *msg, size_t len) {
  const struct dspk__tensor *X = &op->in[0];
  int r = check_nin(op, 1, 1, msg, len);
  if (r || (r = check_tensor("fft", "X", X, msg, len)))
    return r;
  if (!is_std(X->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "fft: X has dtype %s (supported: c64, c128, and f32, f64 for rfft)",
                dspk__dtype_name(X->dtype));
  if (X->rank < 1)
    return dspk__fail(msg, len, DSPK_ESHAPE, "fft: X has rank 0, needs rank >= 1");
  int last = X->rank - 1;
  if (X->shape[last] < 1)
    return dspk__fail(msg, len, DSPK_ESHAPE,
                "fft: X has length 0 along axis %d (the transform axis)", last);
  /* Every backend's transforms index a row with 32 bits (FFTW's int
   * lengths, cuFFT's and VkFFT's plans).  A batch of no rows runs no
   * transform: an empty result, as every op gives for an empty tensor. */
  if (X->shape[last] > INT32_MAX && dspk__tensor_numel(X) > 0)
    return dspk__fail(msg, len, DSPK_ESHAPE,
                "fft: X has length %lld along axis %d, above 2^31-1",
                (long long)X->shape[last], last);

  int64_t shape[DSPK_MAX_RANK];
  memcpy(shape, X->shape, sizeof shape);
  dspk_dtype odt = X->dtype;
  if (!dspk__dtype_is_complex(X->dtype)) {
    if (op->u.fft.inverse)
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "fft: X is real (%s): the inverse transform needs complex input "
                  "(real input gives rfft)",
                  dspk__dtype_name(X->dtype));
    odt = X->dtype == DSPK_F32 ? DSPK_C64 : DSPK_C128;
    shape[last] = X->shape[last] / 2 + 1;
  }
  op->nout = 1;
  set_out(op, 0, odt, X->rank, shape);
  return 0;
}

/* ---- fir ---------------------------------------------------------------- */

static int infer_fir(struct dspk__op *op, char *msg, size_t len) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1];
  int r = check_nin(op, 2, 2, msg, len);
  if (r || (r = check_tensor("fir", "X", X, msg, len)) ||
      (r = check_tensor("fir", "H", H, msg, len)))
    return r;
  if (!is_std(X->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "fir: X has dtype %s (supported: f32, f64, c64, c128)",
                dspk__dtype_name(X->dtype));
  if (H->dtype != X->dtype)
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "fir: H has dtype %s but X has dtype %s (must be equal)",
                dspk__dtype_name(H->dtype), dspk__dtype_name(X->dtype));
  if (X->rank < 1)
    return dspk__fail(msg, len, DSPK_ESHAPE, "fir: X has rank 0, needs rank >= 1");
  if (H->rank != 1)
    return dspk__fail(msg, len, DSPK_ESHAPE, "fir: H has rank %d, must be 1-D (K,)",
                H->rank);
  if (H->shape[0] < 1)
    return dspk__fail(msg, len, DSPK_ESHAPE, "fir: H has length 0 (axis 0), needs >= 1 tap");
  op->nout = 1;
  set_out(op, 0, X->dtype, X->rank, X->shape);
  return 0;
}

/* ---- contract ----------------------------------------------------------- */

/* Splits "ab,bc->ac" (spaces ignored) into three label strings; checks
 * letters, ranks, repeats and sizes, and returns the size of each label in
 * size[128] (indexed by the letter).  Shared by backends through
 * dspk__contract_parse() in op.h. */
int dspk__contract_parse(const char *subs, const struct dspk__tensor *A,
                         const struct dspk__tensor *B,
                         char lab[3][DSPK_MAX_RANK + 1], int64_t size[128],
                         char *msg, size_t len) {
  static const char *names[] = {"A", "B", "output"};
  int term = 0, n[3] = {0, 0, 0}, arrow = 0;
  char l[3][DSPK_MAX_RANK + 1];
  size_t slen = strnlen(subs, DSPK__SUBSCRIPTS_MAX);
  if (slen == DSPK__SUBSCRIPTS_MAX)
    return dspk__fail(msg, len, DSPK_EINVAL, "contract: subscripts longer than %d characters",
                DSPK__SUBSCRIPTS_MAX - 1);
  /* The subscripts as the messages echo them (dspk__utf8_echo). */
  char se[DSPK__ECHO_CAP(DSPK__SUBSCRIPTS_MAX)];
  dspk__utf8_echo(se, sizeof se, subs, slen, slen);
  for (size_t i = 0; i < slen; i++) {
    char c = subs[i];
    if (c == ' ')
      continue;
    if (c == ',') {
      if (term != 0)
        return dspk__fail(msg, len, DSPK_EINVAL,
                    "contract: \"%s\": exactly two operands are supported", se);
      term = 1;
      continue;
    }
    if (c == '-' && i + 1 < slen && subs[i + 1] == '>') {
      if (term != 1 || arrow)
        return dspk__fail(msg, len, DSPK_EINVAL,
                    "contract: \"%s\": expected \"A,B->out\"", se);
      arrow = 1;
      term = 2;
      i++;
      continue;
    }
    if (c == '.')
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "contract: \"%s\": ellipsis (...) is not supported", se);
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      /* The whole character, named so that the echo does not turn it
       * into another (a control character by its code point, not as the
       * space it becomes in the echo; a byte that starts none by its
       * value). */
      char cn[32];
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "contract: \"%s\": %s is not a letter (labels are a-z, A-Z)", se,
                  dspk__utf8_char_name(cn, sizeof cn, subs + i, slen - i));
    }
    if (n[term] == DSPK_MAX_RANK)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "contract: \"%s\": the %s term has more than %d labels", se,
                  names[term], DSPK_MAX_RANK);
    for (int k = 0; k < n[term]; k++)
      if (l[term][k] == c)
        return dspk__fail(msg, len, DSPK_EINVAL,
                    "contract: \"%s\": label '%c' repeats in the %s term (%s)", se, c,
                    names[term],
                    term == 2 ? "an output label names one axis of the result"
                              : "diagonals/traces within one operand are not supported");
    l[term][n[term]++] = c;
  }
  if (!arrow && term == 0)
    return dspk__fail(msg, len, DSPK_EINVAL,
                "contract: \"%s\": needs two operands and an explicit output (\"A,B->out\")",
                se);
  if (!arrow) {
    /* The call's own subscripts made explicit, as numpy's implicit mode
     * reads them (the labels that appear once, in the order of their
     * codes: A-Z, then a-z; no label repeats within a term here), so that
     * the hint is this call's exact meaning, not an unrelated example
     * (probe 20 B1). */
    char out[2 * DSPK_MAX_RANK + 1];
    int no = 0;
    for (int c = 'A'; c <= 'z'; c++) {
      int seen = 0;
      for (int t = 0; t < 2; t++)
        seen += memchr(l[t], c, (size_t)n[t]) != NULL;
      if (seen == 1 && ((c >= 'A' && c <= 'Z') || c >= 'a'))
        out[no++] = (char)c;
    }
    out[no] = 0;
    return dspk__fail(msg, len, DSPK_EINVAL,
                "contract: \"%s\": needs an explicit output: \"%s->%s\" for numpy's "
                "implicit one (the labels that appear once, A-Z then a-z)", se, se, out);
  }
  for (int t = 0; t < 3; t++)
    l[t][n[t]] = 0;
  const struct dspk__tensor *T[2] = {A, B};
  for (int t = 0; t < 2; t++)
    if (n[t] != T[t]->rank)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "contract: \"%s\": %s has rank %d but its term \"%s\" has %d label%s",
                  se, names[t], T[t]->rank, l[t], n[t], n[t] == 1 ? "" : "s");
  int64_t sz[128];
  for (int c = 0; c < 128; c++)
    sz[c] = -1;
  int where[128] = {0}; /* operand (1-based) and axis that set the size */
  for (int t = 0; t < 2; t++)
    for (int k = 0; k < n[t]; k++) {
      int c = (unsigned char)l[t][k];
      if (sz[c] >= 0 && sz[c] != T[t]->shape[k]) {
        int ax = where[c] & 0xff;
        return dspk__fail(msg, len, DSPK_ESHAPE,
                    "contract: label '%c' has size %lld in A (axis %d) but %lld "
                    "in B (axis %d)",
                    c, (long long)sz[c], ax, (long long)T[t]->shape[k], k);
      }
      sz[c] = T[t]->shape[k];
      where[c] = ((t + 1) << 8) | k;
    }
  for (int k = 0; k < n[2]; k++)
    if (sz[(unsigned char)l[2][k]] < 0)
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "contract: \"%s\": output label '%c' appears in neither A nor B",
                  se, l[2][k]);
  memcpy(lab, l, sizeof l);
  memcpy(size, sz, sizeof sz);
  return 0;
}

static int infer_contract(struct dspk__op *op, char *msg, size_t len) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  int r = check_nin(op, 2, 2, msg, len);
  if (r || (r = check_tensor("contract", "A", A, msg, len)) ||
      (r = check_tensor("contract", "B", B, msg, len)))
    return r;
  if (!is_std(A->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "contract: A has dtype %s (supported: f32, f64, c64, c128)",
                dspk__dtype_name(A->dtype));
  if (B->dtype != A->dtype)
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "contract: A has dtype %s but B has dtype %s (must be equal)",
                dspk__dtype_name(A->dtype), dspk__dtype_name(B->dtype));
  char lab[3][DSPK_MAX_RANK + 1];
  int64_t size[128];
  if ((r = dspk__contract_parse(op->u.contract.subscripts, A, B, lab, size, msg, len)))
    return r;
  int64_t shape[DSPK_MAX_RANK];
  int ro = (int)strlen(lab[2]);
  for (int k = 0; k < ro; k++)
    shape[k] = size[(unsigned char)lab[2][k]];
  op->nout = 1;
  set_out(op, 0, A->dtype, ro, shape);
  return 0;
}

/* ---- reduce ------------------------------------------------------------- */

static int infer_reduce(struct dspk__op *op, char *msg, size_t len) {
  const struct dspk__tensor *X = &op->in[0];
  int r = check_nin(op, 1, 1, msg, len);
  if (r || (r = check_tensor("reduce", "X", X, msg, len)))
    return r;
  dspk_reduce fn = op->u.reduce.fn;
  if ((unsigned)fn >= DSPK_REDUCE_COUNT)
    return dspk__fail(msg, len, DSPK_EINVAL, "reduce: unknown function %d", (int)fn);
  if (!is_std(X->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "reduce: X has dtype %s (supported: f32, f64, c64, c128)",
                dspk__dtype_name(X->dtype));
  if ((fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN) && !is_real(X->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "reduce: %s needs real X, X has dtype %s",
                fn == DSPK_REDUCE_MAX ? "max" : "min", dspk__dtype_name(X->dtype));
  uint32_t axes = op->u.reduce.axes;
  for (int b = X->rank; b < 32; b++)
    if (axes & (1u << b))
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "reduce: axis %d out of range for X of rank %d", b, X->rank);
  if (axes == 0)
    axes = X->rank ? (uint32_t)((1ull << X->rank) - 1) : 0;
  int64_t shape[DSPK_MAX_RANK];
  int ro = 0;
  for (int i = 0; i < X->rank; i++) {
    if (axes & (1u << i)) {
      if (X->shape[i] == 0 && (fn == DSPK_REDUCE_MAX || fn == DSPK_REDUCE_MIN))
        return dspk__fail(msg, len, DSPK_ESHAPE,
                    "reduce: %s over X's axis %d of length 0 has no identity",
                    fn == DSPK_REDUCE_MAX ? "max" : "min", i);
    } else {
      shape[ro++] = X->shape[i];
    }
  }
  op->nout = 1;
  set_out(op, 0, X->dtype, ro, shape);
  return 0;
}

/* ---- map ---------------------------------------------------------------- */

static int infer_map(struct dspk__op *op, char *msg, size_t len) {
  static const int nin[] = {
#define XX(e, name, n) n,
      DSPK_MAPFN_MAP(XX)
#undef XX
  };
  dspk_mapfn fn = op->u.map.fn;
  if ((unsigned)fn >= DSPK_MAPFN_COUNT)
    return dspk__fail(msg, len, DSPK_EINVAL, "map: unknown function %d", (int)fn);
  if (op->nin != nin[fn])
    return dspk__fail(msg, len, DSPK_EINVAL, "map: %s takes %d input%s, got %d",
                dspk__mapfn_names[fn], nin[fn], nin[fn] == 1 ? "" : "s", op->nin);
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1];
  int r = check_tensor("map", "A", A, msg, len);
  if (r || (op->nin == 2 && (r = check_tensor("map", "B", B, msg, len))))
    return r;
  if (!is_std(A->dtype))
    return dspk__fail(msg, len, DSPK_EDTYPE,
                "map: A has dtype %s (supported: f32, f64, c64, c128)",
                dspk__dtype_name(A->dtype));
  if (op->nin == 2) {
    if (B->dtype != A->dtype)
      return dspk__fail(msg, len, DSPK_EDTYPE,
                  "map: %s: A has dtype %s but B has dtype %s (must be equal)",
                  dspk__mapfn_names[fn], dspk__dtype_name(A->dtype), dspk__dtype_name(B->dtype));
    if (B->rank != A->rank)
      return dspk__fail(msg, len, DSPK_ESHAPE,
                  "map: %s: A has rank %d but B has rank %d (shapes must be equal)",
                  dspk__mapfn_names[fn], A->rank, B->rank);
    for (int i = 0; i < A->rank; i++)
      if (A->shape[i] != B->shape[i])
        return dspk__fail(msg, len, DSPK_ESHAPE,
                    "map: %s: A has %lld (axis %d) but B has %lld (axis %d)",
                    dspk__mapfn_names[fn], (long long)A->shape[i], i, (long long)B->shape[i], i);
  }
  if ((fn == DSPK_MAP_SCALE || fn == DSPK_MAP_AXPY) &&
      (A->dtype == DSPK_F32 || A->dtype == DSPK_C64) &&
      (r = check_f32_scalar("map", "alpha", op->u.map.alpha, &op->u.map.alpha_sent,
                            msg, len)))
    return r;
  dspk_dtype odt = fn == DSPK_MAP_ABS ? real_of(A->dtype) : A->dtype;
  op->nout = 1;
  set_out(op, 0, odt, A->rank, A->shape);
  return 0;
}

/* ---- kernel ------------------------------------------------------------- */

static int infer_kernel(struct dspk__op *op, char *msg, size_t len) {
  int r = check_nin(op, 0, DSPK__OP_MAX_IN, msg, len);
  if (r) return r;
  for (int i = 0; i < op->nin; i++) {
    char name[24];
    snprintf(name, sizeof name, "input %d", i);
    if ((r = check_tensor("kernel", name, &op->in[i], msg, len)))
      return r;
  }
  if (!op->u.kernel.lang || !op->u.kernel.source)
    return dspk__fail(msg, len, DSPK_EINVAL, "kernel: needs lang and source");
  if (op->u.kernel.nargs < 0 || op->u.kernel.nargs > DSPK__KERNEL_MAX_ARGS)
    return dspk__fail(msg, len, DSPK_EINVAL, "kernel: %d arguments (at most %d)",
                op->u.kernel.nargs, DSPK__KERNEL_MAX_ARGS);
  for (int i = 0; i < op->u.kernel.nargs; i++) {
    const struct dspk__karg *a = &op->u.kernel.args[i];
    if ((unsigned)a->kind > DSPK__KARG_F64)
      return dspk__fail(msg, len, DSPK_EINVAL, "kernel: argument %d has an unknown kind", i);
    if (a->kind == DSPK__KARG_TENSOR && (a->v.tensor < 0 || a->v.tensor >= op->nin))
      return dspk__fail(msg, len, DSPK_EINVAL,
                  "kernel: argument %d refers to input %d, there %s %d input%s", i,
                  a->v.tensor, op->nin == 1 ? "is" : "are", op->nin, op->nin == 1 ? "" : "s");
  }
  op->nout = 0;
  return 0;
}

static int infer_kind(struct dspk__op *op, char *msg, size_t msglen) {
  switch (op->kind) {
  case DSPK_OP_GEMM: return infer_gemm(op, msg, msglen);
  case DSPK_OP_FFT: return infer_fft(op, msg, msglen);
  case DSPK_OP_FIR: return infer_fir(op, msg, msglen);
  case DSPK_OP_CONTRACT: return infer_contract(op, msg, msglen);
  case DSPK_OP_REDUCE: return infer_reduce(op, msg, msglen);
  case DSPK_OP_MAP: return infer_map(op, msg, msglen);
  case DSPK_OP_KERNEL: return infer_kernel(op, msg, msglen);
  default:
    return dspk__fail(msg, msglen, DSPK_EINVAL, "unknown op %d", (int)op->kind);
  }
}

void dspk__op_limits_none(struct dspk__op_limits *l) {
  l->max_elements = UINT64_MAX;
  l->max_rank = UINT64_MAX;
  l->max_bytes = UINT64_MAX;
  l->max_inline = UINT64_MAX;
}

int dspk__op_infer_lim(struct dspk__op *op, const struct dspk__op_limits *lim,
                       char *msg, size_t msglen) {
  const char *name = dspk__op_name(op->kind);
  char sh[96];
  int r;
  if (msg && msglen)
    msg[0] = 0;
  if (op->nin < 0 || op->nin > DSPK__OP_MAX_IN)
    return dspk__fail(msg, msglen, DSPK_EINVAL, "%s: %d inputs (at most %d)",
                dspk__op_name(op->kind), op->nin, DSPK__OP_MAX_IN);
  op->nout = 0;
  if ((r = infer_kind(op, msg, msglen)) != 0)
    return r;
  for (int i = 0; lim && i < op->nin; i++) {
    int64_t n = dspk__tensor_numel(&op->in[i]);
    if ((uint64_t)n > lim->max_elements)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "%s: input %d %s has %lld elements, more than max_elements (%llu)",
                  name, i, shape_str(&op->in[i], sh, sizeof sh), (long long)n,
                  (unsigned long long)lim->max_elements);
  }
  /* Every result's size, checked: an op's result can be far larger than
   * its operands (a gemm of two zero-element operands). */
  for (int i = 0; i < op->nout; i++) {
    int64_t n;
    if (dspk__tensor_size(&op->out[i], &n, NULL) != 0)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "%s: the result %s is too large: the product of its dimensions (each 0 "
                  "counted as 1) times its item size passes 2^63-1 bytes",
                  name, shape_str(&op->out[i], sh, sizeof sh));
    if (lim && (uint64_t)n > lim->max_elements)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "%s: the result %s has %lld elements, more than max_elements (%llu)",
                  name, shape_str(&op->out[i], sh, sizeof sh), (long long)n,
                  (unsigned long long)lim->max_elements);
    if (lim && (uint64_t)op->out[i].rank > lim->max_rank)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "%s: the result %s has rank %u, more than max_rank (%llu)",
                  name, shape_str(&op->out[i], sh, sizeof sh), (unsigned)op->out[i].rank,
                  (unsigned long long)lim->max_rank);
  }
  return 0;
}

#define DT(d) (1u << DSPK_##d)
#define STD_DT (DT(F32) | DT(F64) | DT(C64) | DT(C128))
const uint32_t dspk__op_dtypes[DSPK_OP_COUNT] = {
    [DSPK_OP_GEMM] = DT(F32) | DT(F64) | DT(F16) | DT(BF16),
    [DSPK_OP_FFT] = STD_DT,
    [DSPK_OP_FIR] = STD_DT,
    [DSPK_OP_CONTRACT] = STD_DT,
    [DSPK_OP_REDUCE] = STD_DT,
    [DSPK_OP_MAP] = STD_DT,
    [DSPK_OP_KERNEL] = (1u << DSPK_DTYPE_COUNT) - 1,
};
#undef DT
#undef STD_DT

int dspk__op_infer(struct dspk__op *op, char *msg, size_t msglen) {
  return dspk__op_infer_lim(op, NULL, msg, msglen);
}

/* *sum += b; an overflow sets *over (a sum beyond 2^64 breaks any limit). */
static void add_chk(uint64_t *sum, uint64_t b, int *over) {
  if (__builtin_add_overflow(*sum, b, sum))
    *over = 1;
}

int dspk__op_check_results(const struct dspk__op *op, const struct dspk__op_limits *lim,
                           unsigned inline_mask, unsigned inline_in, char *msg,
                           size_t msglen) {
  const char *name = dspk__op_name(op->kind);
  int kernel = op->kind == DSPK_OP_KERNEL;
  const struct dspk__tensor *res = kernel ? op->in : op->out;
  int nres = kernel ? op->nin : op->nout;
  uint64_t inl = 0, tmp = 0;
  int inl_over = 0, tmp_over = 0;
  if (!lim)
    return 0;
  for (int i = 0; i < nres; i++)
    if (inline_mask & (1u << i))
      add_chk(&inl, dspk__tensor_nbytes(&res[i]), &inl_over);
  if ((inl_over || inl > lim->max_inline) && lim->max_inline == 0)
    return dspk__fail(msg, msglen, DSPK_ELIMIT,
                "%s: the inline result would be %llu byte%s, and no response of this daemon "
                "may carry an inline result (its max_message leaves 1024 bytes or less, "
                "all for framing): write it into a buffer (task.run outputs: [{buffer, "
                "offset}])", name, (unsigned long long)inl, dspk__s(inl));
  if (inl_over || inl > lim->max_inline)
    return dspk__fail(msg, msglen, DSPK_ELIMIT,
                "%s: the inline result would be %llu byte%s, more than the %llu byte%s a "
                "response may carry (max_message less 1024 bytes of framing): write it into "
                "a buffer (task.run outputs: [{buffer, offset}])",
                name, (unsigned long long)inl, dspk__s(inl), (unsigned long long)lim->max_inline,
                dspk__s(lim->max_inline));
  /* Temporaries on the device: inline inputs, and results not written into
   * a buffer (a kernel's results are its inputs). */
  for (int i = 0; i < op->nin; i++)
    if (inline_in & (1u << i))
      add_chk(&tmp, dspk__tensor_nbytes(&op->in[i]), &tmp_over);
  if (!kernel)
    add_chk(&tmp, inl, &tmp_over);
  if (tmp_over || tmp > lim->max_bytes)
    return dspk__fail(msg, msglen, DSPK_ENOMEM,
                "%s: needs %llu byte%s of device memory for its inline operands and "
                "results, more than the device has (%llu)",
                name, (unsigned long long)tmp, dspk__s(tmp), (unsigned long long)lim->max_bytes);
  return 0;
}

int dspk__op_fail(struct dspk__opctx *ctx, int code, const char *fmt, ...) {
  if (ctx && ctx->errmsg && ctx->errmsg_len) {
    va_list ap;
    va_start(ap, fmt);
    dspk__vformat(ctx->errmsg, ctx->errmsg_len, fmt, ap);
    va_end(ap);
  }
  return code;
}
