/*
 * dspk__op_infer(): output shapes and dtypes of valid ops, and the error
 * code and one-line message (naming the operand and axis) of invalid ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "backends/op.h"

static struct dspk__tensor T(dspk_dtype dt, int rank, ...) {
  struct dspk__tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++)
    t.shape[i] = va_arg(ap, int);
  va_end(ap);
  return t;
}

static struct dspk__op OP(dspk_op kind, int nin, ...) {
  struct dspk__op op;
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.nin = nin;
  va_list ap;
  va_start(ap, nin);
  for (int i = 0; i < nin; i++)
    op.in[i] = va_arg(ap, struct dspk__tensor);
  va_end(ap);
  return op;
}

static char msg[256];

/* Expects code and every needle in the message. */
static void expect_err(struct dspk__op *op, int code, const char *n1,
                       const char *n2) {
  int rc = dspk__op_infer(op, msg, sizeof msg);
  if (rc != code || (n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2)))
    fail_msg("got %d \"%s\", want %d with \"%s\" \"%s\"", rc, msg, code,
             n1 ? n1 : "", n2 ? n2 : "");
  assert_null(strchr(msg, '\n'));
}

static void expect_shape(struct dspk__op *op, dspk_dtype dt, int rank, ...) {
  int rc = dspk__op_infer(op, msg, sizeof msg);
  if (rc)
    fail_msg("unexpected error %d: %s", rc, msg);
  assert_int_equal(op->nout, 1);
  assert_int_equal(op->out[0].dtype, dt);
  assert_int_equal(op->out[0].rank, rank);
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(op->out[0].shape[i], va_arg(ap, int));
  va_end(ap);
}

static void test_gemm(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 2, 4, 5));
  expect_err(&op, DSPK_ESHAPE, "gemm: A has K=3 (axis 1) but B has K=4 (axis 0)", NULL);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 2, 3, 2), T(DSPK_F32, 2, 4, 5));
  op.u.gemm.trans_a = 1;
  expect_err(&op, DSPK_ESHAPE, "A has K=3 (axis 0, trans_a)", "B has K=4 (axis 0)");
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 1, 3), T(DSPK_F32, 2, 3, 5));
  expect_err(&op, DSPK_ESHAPE, "A has rank 1", "not promoted");
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 2, 3, 3), T(DSPK_F32, 0));
  expect_err(&op, DSPK_ESHAPE, "B has rank 0", NULL);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_C64, 2, 3, 3), T(DSPK_C64, 2, 3, 3));
  expect_err(&op, DSPK_EDTYPE, "A has dtype c64", NULL);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 2, 3, 3), T(DSPK_F64, 2, 3, 3));
  expect_err(&op, DSPK_EDTYPE, "A has dtype f32 but B has dtype f64", NULL);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 3, 2, 3, 4), T(DSPK_F32, 3, 3, 4, 5));
  expect_err(&op, DSPK_ESHAPE, "A has 2 (axis 0)", "B has 3 (axis 0)");
  op = OP(DSPK_OP_GEMM, 1, T(DSPK_F32, 2, 3, 3));
  expect_err(&op, DSPK_EINVAL, "gemm: takes 2 to 3 inputs, got 1", NULL);
  op = OP(DSPK_OP_GEMM, 3, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 2, 3, 4), T(DSPK_F32, 2, 3, 4));
  expect_err(&op, DSPK_ESHAPE, "C has 3 (axis 0)", "output has 2 (axis 0)");
  op = OP(DSPK_OP_GEMM, 3, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 2, 3, 4), T(DSPK_F64, 1, 4));
  expect_err(&op, DSPK_EDTYPE, "C has dtype f64", NULL);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F32, 2, -1, 3), T(DSPK_F32, 2, 3, 4));
  expect_err(&op, DSPK_ESHAPE, "A has a negative size -1 (axis 0)", NULL);

  /* Valid: broadcasting batch dims, transposes, C broadcast, f16 -> f32. */
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F64, 4, 2, 1, 3, 4), T(DSPK_F64, 3, 5, 4, 6));
  expect_shape(&op, DSPK_F64, 4, 2, 5, 3, 6);
  op = OP(DSPK_OP_GEMM, 3, T(DSPK_F32, 2, 4, 3), T(DSPK_F32, 2, 6, 4), T(DSPK_F32, 1, 6));
  op.u.gemm.trans_a = op.u.gemm.trans_b = 1;
  expect_shape(&op, DSPK_F32, 2, 3, 6);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_F16, 2, 2, 3), T(DSPK_F16, 2, 3, 4));
  expect_shape(&op, DSPK_F32, 2, 2, 4);
  op = OP(DSPK_OP_GEMM, 2, T(DSPK_BF16, 3, 7, 2, 3), T(DSPK_BF16, 2, 3, 4));
  expect_shape(&op, DSPK_F32, 3, 7, 2, 4);
}

static void test_fft(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_FFT, 1, T(DSPK_F32, 2, 3, 8));
  op.u.fft.inverse = 1;
  expect_err(&op, DSPK_EINVAL, "X is real (f32)", "inverse");
  op = OP(DSPK_OP_FFT, 1, T(DSPK_C64, 0));
  expect_err(&op, DSPK_ESHAPE, "X has rank 0", NULL);
  op = OP(DSPK_OP_FFT, 1, T(DSPK_C64, 2, 3, 0));
  expect_err(&op, DSPK_ESHAPE, "X has length 0 along axis 1", NULL);
  op = OP(DSPK_OP_FFT, 1, T(DSPK_F16, 1, 8));
  expect_err(&op, DSPK_EDTYPE, "X has dtype f16", NULL);
  op = OP(DSPK_OP_FFT, 2, T(DSPK_C64, 1, 8), T(DSPK_C64, 1, 8));
  expect_err(&op, DSPK_EINVAL, "fft: takes 1 input, got 2", NULL);
  op = OP(DSPK_OP_FFT, 1, T(DSPK_F32, 2, 3, 9));
  expect_shape(&op, DSPK_C64, 2, 3, 5);
  op = OP(DSPK_OP_FFT, 1, T(DSPK_F64, 1, 8));
  expect_shape(&op, DSPK_C128, 1, 5);
  op = OP(DSPK_OP_FFT, 1, T(DSPK_C128, 3, 2, 3, 7));
  op.u.fft.inverse = 1;
  expect_shape(&op, DSPK_C128, 3, 2, 3, 7);
}

static void test_fir(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_FIR, 2, T(DSPK_F32, 2, 3, 100), T(DSPK_F32, 2, 1, 5));
  expect_err(&op, DSPK_ESHAPE, "H has rank 2", NULL);
  op = OP(DSPK_OP_FIR, 2, T(DSPK_F32, 1, 100), T(DSPK_F64, 1, 5));
  expect_err(&op, DSPK_EDTYPE, "H has dtype f64 but X has dtype f32", NULL);
  op = OP(DSPK_OP_FIR, 2, T(DSPK_F32, 1, 100), T(DSPK_F32, 1, 0));
  expect_err(&op, DSPK_ESHAPE, "H has length 0 (axis 0)", NULL);
  op = OP(DSPK_OP_FIR, 2, T(DSPK_F32, 0), T(DSPK_F32, 1, 3));
  expect_err(&op, DSPK_ESHAPE, "X has rank 0", NULL);
  op = OP(DSPK_OP_FIR, 2, T(DSPK_BF16, 1, 10), T(DSPK_BF16, 1, 3));
  expect_err(&op, DSPK_EDTYPE, "X has dtype bf16", NULL);
  op = OP(DSPK_OP_FIR, 2, T(DSPK_C64, 3, 2, 3, 50), T(DSPK_C64, 1, 7));
  expect_shape(&op, DSPK_C64, 3, 2, 3, 50);
}

static void test_contract(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_CONTRACT, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 2, 4, 5));
  strcpy(op.u.contract.subscripts, "ij,jk->ik");
  expect_err(&op, DSPK_ESHAPE, "label 'j' has size 3 in A (axis 1) but 4 in B (axis 0)", NULL);
  strcpy(op.u.contract.subscripts, "ij,jk");
  expect_err(&op, DSPK_EINVAL, "explicit output", NULL);
  strcpy(op.u.contract.subscripts, "...j,jk->k");
  expect_err(&op, DSPK_EINVAL, "ellipsis", NULL);
  strcpy(op.u.contract.subscripts, "ii,jk->jk");
  expect_err(&op, DSPK_EINVAL, "label 'i' repeats in the A term", "diagonals/traces");
  /* The output is no operand: its message said "diagonals/traces within one
   * operand" (probe round 13, B). */
  strcpy(op.u.contract.subscripts, "ij,kl->ikk");
  expect_err(&op, DSPK_EINVAL, "repeats in the output term (an output label names one axis",
             NULL);
  if (strstr(msg, "operand"))
    fail_msg("the output term's message names an operand: %s", msg);
  strcpy(op.u.contract.subscripts, "ijk,kl->il");
  expect_err(&op, DSPK_ESHAPE, "A has rank 2 but its term \"ijk\" has 3 labels", NULL);
  /* One label, said so ("has 1 labels" before; probe round 13). */
  strcpy(op.u.contract.subscripts, "i,jk->ik");
  expect_err(&op, DSPK_ESHAPE, "A has rank 2 but its term \"i\" has 1 label", NULL);
  assert_string_equal(msg + strlen(msg) - strlen("has 1 label"), "has 1 label");
  strcpy(op.u.contract.subscripts, "ij,kl->iz");
  expect_err(&op, DSPK_EINVAL, "output label 'z'", NULL);
  strcpy(op.u.contract.subscripts, "ij,kl,m->i");
  expect_err(&op, DSPK_EINVAL, "exactly two operands", NULL);
  strcpy(op.u.contract.subscripts, "i1,kl->i");
  expect_err(&op, DSPK_EINVAL, "'1' is not a letter", NULL);
  op = OP(DSPK_OP_CONTRACT, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F64, 2, 3, 5));
  strcpy(op.u.contract.subscripts, "ij,jk->ik");
  expect_err(&op, DSPK_EDTYPE, "B has dtype f64", NULL);

  op = OP(DSPK_OP_CONTRACT, 2, T(DSPK_C64, 3, 2, 3, 4), T(DSPK_C64, 2, 4, 5));
  strcpy(op.u.contract.subscripts, "abc, cd -> dba");
  expect_shape(&op, DSPK_C64, 3, 5, 3, 2);
  op = OP(DSPK_OP_CONTRACT, 2, T(DSPK_F64, 2, 2, 3), T(DSPK_F64, 2, 2, 3));
  strcpy(op.u.contract.subscripts, "ij,ij->");
  expect_shape(&op, DSPK_F64, 0);
  op = OP(DSPK_OP_CONTRACT, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 1, 7));
  strcpy(op.u.contract.subscripts, "iJ,K->KJ");
  expect_shape(&op, DSPK_F32, 2, 7, 3);
}

static void test_reduce(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_REDUCE, 1, T(DSPK_F32, 3, 2, 3, 4));
  op.u.reduce.axes = 1u << 3;
  expect_err(&op, DSPK_EINVAL, "axis 3 out of range for X of rank 3", NULL);
  op = OP(DSPK_OP_REDUCE, 1, T(DSPK_C64, 1, 4));
  op.u.reduce.fn = DSPK_REDUCE_MAX;
  expect_err(&op, DSPK_EDTYPE, "max needs real X", NULL);
  op = OP(DSPK_OP_REDUCE, 1, T(DSPK_F32, 2, 3, 0));
  op.u.reduce.fn = DSPK_REDUCE_MIN;
  op.u.reduce.axes = 2;
  expect_err(&op, DSPK_ESHAPE, "axis 1 of length 0", NULL);
  op = OP(DSPK_OP_REDUCE, 1, T(DSPK_F32, 3, 2, 3, 4));
  op.u.reduce.axes = 0;
  expect_shape(&op, DSPK_F32, 0);
  op.u.reduce.axes = 5;
  expect_shape(&op, DSPK_F32, 1, 3);
  op = OP(DSPK_OP_REDUCE, 1, T(DSPK_C128, 0));
  op.u.reduce.fn = DSPK_REDUCE_MEAN;
  expect_shape(&op, DSPK_C128, 0);
}

static void test_map(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_MAP, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 2, 2, 4));
  op.u.map.fn = DSPK_MAP_ADD;
  expect_err(&op, DSPK_ESHAPE, "A has 3 (axis 1) but B has 4 (axis 1)", NULL);
  op = OP(DSPK_OP_MAP, 2, T(DSPK_F32, 2, 2, 3), T(DSPK_F32, 1, 3));
  op.u.map.fn = DSPK_MAP_MUL;
  expect_err(&op, DSPK_ESHAPE, "A has rank 2 but B has rank 1", NULL);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_F32, 2, 2, 3));
  op.u.map.fn = DSPK_MAP_AXPY;
  expect_err(&op, DSPK_EINVAL, "axpy takes 2 inputs, got 1", NULL);
  op = OP(DSPK_OP_MAP, 2, T(DSPK_F32, 1, 3), T(DSPK_C64, 1, 3));
  op.u.map.fn = DSPK_MAP_SUB;
  expect_err(&op, DSPK_EDTYPE, "B has dtype c64", NULL);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_C64, 2, 2, 3));
  op.u.map.fn = DSPK_MAP_ABS;
  expect_shape(&op, DSPK_F32, 2, 2, 3);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_C128, 0));
  op.u.map.fn = DSPK_MAP_EXP;
  expect_shape(&op, DSPK_C128, 0);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_F64, 1, 3));
  op.u.map.fn = DSPK_MAPFN_COUNT;
  expect_err(&op, DSPK_EINVAL, "unknown function", NULL);
}

static void test_generic(void **state) {
  (void)state;
  struct dspk__op op = OP(DSPK_OP_MAP, 1, T(DSPK_F32, 1, 3));
  op.u.map.fn = DSPK_MAP_EXP;
  op.in[0].rank = DSPK_MAX_RANK + 1;
  expect_err(&op, DSPK_ESHAPE, "A has rank 9", NULL);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_F32, 1, 3));
  op.u.map.fn = DSPK_MAP_EXP;
  op.in[0].dtype = DSPK_DTYPE_COUNT;
  expect_err(&op, DSPK_EDTYPE, "A has an unknown dtype", NULL);
  op = OP(DSPK_OP_MAP, 1, T(DSPK_F32, 2, 1 << 30, 1 << 30));
  op.u.map.fn = DSPK_MAP_EXP;
  op.in[0].shape[1] = INT64_MAX / 2;
  expect_err(&op, DSPK_ELIMIT, "too large: the product of its dimensions", NULL);
  op = OP(DSPK_OP_COUNT, 0);
  expect_err(&op, DSPK_EINVAL, "unknown op", NULL);
}

/* ---- result sizes (issue 11) ------------------------------------------- */

static struct dspk__tensor T64(dspk_dtype dt, int rank, const int64_t *shape) {
  struct dspk__tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++)
    t.shape[i] = shape[i];
  return t;
}

static struct dspk__op_limits LIM(uint64_t max_elements, uint64_t max_bytes,
                                  uint64_t max_inline) {
  struct dspk__op_limits l = {.max_elements = max_elements, .max_rank = UINT64_MAX,
                              .max_bytes = max_bytes, .max_inline = max_inline};
  return l;
}

static int infer_lim(struct dspk__op *op, struct dspk__op_limits l) {
  msg[0] = 0;
  int rc = dspk__op_infer_lim(op, &l, msg, sizeof msg);
  if (rc)
    assert_true(msg[0] != 0);
  return rc;
}

static void test_tensor_size(void **state) {
  (void)state;
  int64_t n;
  size_t nb;
  int64_t s1[] = {3, 0, 5};
  struct dspk__tensor t = T64(DSPK_C128, 3, s1);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), 0);
  assert_int_equal(n, 0);
  assert_int_equal(nb, 0);
  int64_t s2[] = {(int64_t)1 << 30, (int64_t)1 << 30, 1};
  t = T64(DSPK_F32, 3, s2);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), 0);
  assert_int_equal(n, (int64_t)1 << 60);
  assert_true(nb == (size_t)1 << 62);
  /* 2^61 f32 elements are 2^63 bytes: one past INT64_MAX. */
  t.shape[2] = 2;
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  /* 2^62 elements of 4 bytes: 2^64 bytes, the wrap to 0 of issue 11. */
  int64_t s3[] = {4, (int64_t)1 << 30, (int64_t)1 << 30};
  t = T64(DSPK_F32, 3, s3);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  assert_int_equal(dspk__tensor_numel(&t), INT64_MAX);
  assert_true(dspk__tensor_nbytes(&t) == SIZE_MAX);
  /* A zero dimension does not hide an extent that overflows. */
  int64_t s4[] = {INT64_MAX, 2, 0};
  t = T64(DSPK_F32, 3, s4);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  int64_t s5[] = {INT64_MAX, 0};
  t = T64(DSPK_F32, 2, s5);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  int64_t s6[] = {((int64_t)1 << 61) - 1, 0};
  t = T64(DSPK_F32, 2, s6);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), 0);
  assert_int_equal(n, 0);
  int64_t s7[] = {-1};
  t = T64(DSPK_F32, 1, s7);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  t = T64(DSPK_DTYPE_COUNT, 0, NULL);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), -1);
  t = T64(DSPK_F64, 0, NULL);
  assert_int_equal(dspk__tensor_size(&t, &n, &nb), 0);
  assert_int_equal(n, 1);
  assert_int_equal(nb, 8);
}

static void test_result_overflow(void **state) {
  (void)state;
  struct dspk__op_limits none;
  dspk__op_limits_none(&none);
  /* The 70-byte probe of issue 11: [2^30,0] x [4,0,2^30] would be a
   * [4,2^30,2^30] f32 result whose byte count wraps to 0. */
  int64_t a[] = {(int64_t)1 << 30, 0}, b[] = {4, 0, (int64_t)1 << 30};
  struct dspk__op op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, a), T64(DSPK_F32, 3, b));
  expect_err(&op, DSPK_ELIMIT, "gemm: the result [4, 1073741824, 1073741824]",
             "too large: the product of its dimensions");
  /* Within 64 bits but above max_elements. */
  op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, a), T64(DSPK_F32, 3, b));
  op.in[1].shape[0] = 1;
  assert_int_equal(infer_lim(&op, LIM((uint64_t)1 << 31, UINT64_MAX, UINT64_MAX)),
                   DSPK_ELIMIT);
  assert_non_null(strstr(msg, "more than max_elements (2147483648)"));
  assert_int_equal(infer_lim(&op, none), 0);
  assert_int_equal(op.out[0].shape[1], (int64_t)1 << 30);
  /* int64-sized dimensions: no signed overflow anywhere (UBSan). */
  int64_t h[] = {INT64_MAX / 2, 0}, h2[] = {0, INT64_MAX / 2};
  op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, h), T64(DSPK_F32, 2, h2));
  expect_err(&op, DSPK_ELIMIT, "gemm: A", "too large: the product of its dimensions");
  int64_t g1[] = {(int64_t)1 << 40, 0}, g2[] = {0, (int64_t)1 << 40};
  op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F64, 2, g1), T64(DSPK_F64, 2, g2));
  expect_err(&op, DSPK_ELIMIT, "the result [1099511627776, 1099511627776]", NULL);
  /* contract: an outer product of two large zero-element-free vectors. */
  int64_t v[] = {(int64_t)1 << 32};
  op = OP(DSPK_OP_CONTRACT, 2, T64(DSPK_C128, 1, v), T64(DSPK_C128, 1, v));
  strcpy(op.u.contract.subscripts, "i,j->ij");
  expect_err(&op, DSPK_ELIMIT, "contract: the result", "too large: the product of its dimensions");
  op = OP(DSPK_OP_CONTRACT, 2, T64(DSPK_C128, 1, v), T64(DSPK_C128, 1, v));
  strcpy(op.u.contract.subscripts, "i,i->i");
  assert_int_equal(infer_lim(&op, LIM((uint64_t)1 << 31, UINT64_MAX, UINT64_MAX)),
                   DSPK_ELIMIT);
  assert_non_null(strstr(msg, "input 0 [4294967296]"));
  /* Every dtype: the result's bytes are numel * item size, checked. */
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    int64_t x[] = {(int64_t)1 << 20, (int64_t)1 << 20};
    op = OP(DSPK_OP_MAP, 1, T64(dts[k], 2, x));
    op.u.map.fn = DSPK_MAP_EXP;
    assert_int_equal(infer_lim(&op, none), 0);
    assert_true(dspk__tensor_nbytes(&op.out[0]) ==
                ((size_t)1 << 40) * dspk__dtype_size(dts[k]));
  }
}

static void test_zero_dims(void **state) {
  (void)state;
  struct dspk__op_limits l100 = LIM(100, UINT64_MAX, UINT64_MAX);
  /* [200, 0] with max_elements 100: zero elements, accepted (issue 11). */
  int64_t z[] = {200, 0};
  struct dspk__op op = OP(DSPK_OP_MAP, 1, T64(DSPK_F32, 2, z));
  op.u.map.fn = DSPK_MAP_ABS;
  assert_int_equal(infer_lim(&op, l100), 0);
  assert_int_equal(op.out[0].shape[0], 200);
  assert_int_equal(dspk__tensor_nbytes(&op.out[0]), 0);
  /* gemm with K = 0: an M x N result (zeros), bounded by max_elements. */
  int64_t a[] = {16384, 0}, b[] = {0, 16384};
  op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, a), T64(DSPK_F32, 2, b));
  assert_int_equal(infer_lim(&op, l100), DSPK_ELIMIT);
  assert_non_null(strstr(msg, "the result [16384, 16384] has 268435456 elements"));
  int64_t a2[] = {10, 0}, b2[] = {0, 10};
  op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, a2), T64(DSPK_F32, 2, b2));
  assert_int_equal(infer_lim(&op, l100), 0);
  assert_int_equal(dspk__tensor_numel(&op.out[0]), 100);
  /* reduce over an empty axis: sum gives zeros, max has no identity. */
  int64_t x[] = {7, 0};
  op = OP(DSPK_OP_REDUCE, 1, T64(DSPK_F64, 2, x));
  op.u.reduce.fn = DSPK_REDUCE_SUM;
  op.u.reduce.axes = 2;
  assert_int_equal(infer_lim(&op, l100), 0);
  assert_int_equal(op.out[0].rank, 1);
  assert_int_equal(op.out[0].shape[0], 7);
  op.u.reduce.fn = DSPK_REDUCE_MAX;
  assert_int_equal(infer_lim(&op, l100), DSPK_ESHAPE);
  /* fft: length 1 is valid, length 0 is not. */
  int64_t f1[] = {5, 1}, f0[] = {5, 0};
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_C64, 2, f1));
  assert_int_equal(infer_lim(&op, l100), 0);
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_F32, 2, f1));
  assert_int_equal(infer_lim(&op, l100), 0);
  assert_int_equal(op.out[0].shape[1], 1);
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_C64, 2, f0));
  assert_int_equal(infer_lim(&op, l100), DSPK_ESHAPE);
  /* fft: a row of 2^31 samples (within max_elements) is above the
   * transforms' 2^31-1, ESHAPE; a batch of no such rows is an empty result
   * (protocol.md, the fft row). */
  struct dspk__op_limits l31 = LIM((uint64_t)1 << 31, UINT64_MAX, UINT64_MAX);
  int64_t fb[] = {1, (int64_t)1 << 31}, fe[] = {0, (int64_t)1 << 31},
          fm[] = {1, ((int64_t)1 << 31) - 1};
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_C64, 2, fb));
  assert_int_equal(infer_lim(&op, l31), DSPK_ESHAPE);
  assert_non_null(strstr(msg, "fft: X has length 2147483648 along axis 1, above 2^31-1"));
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_C64, 2, fm));
  assert_int_equal(infer_lim(&op, l31), 0);
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_C64, 2, fe));
  assert_int_equal(infer_lim(&op, l31), 0);
  assert_int_equal(op.out[0].dtype, DSPK_C64);
  assert_int_equal(op.out[0].shape[0], 0);
  assert_int_equal(op.out[0].shape[1], (int64_t)1 << 31);
  op = OP(DSPK_OP_FFT, 1, T64(DSPK_F32, 2, fe));
  assert_int_equal(infer_lim(&op, l31), 0);
  assert_int_equal(op.out[0].dtype, DSPK_C64);
  assert_int_equal(op.out[0].shape[1], ((int64_t)1 << 30) + 1);

  /* fir: one tap is valid, zero taps are not; an empty X gives an empty Y. */
  int64_t h1[] = {1}, h0[] = {0}, xe[] = {0, 9};
  op = OP(DSPK_OP_FIR, 2, T64(DSPK_F32, 2, f1), T64(DSPK_F32, 1, h1));
  assert_int_equal(infer_lim(&op, l100), 0);
  op = OP(DSPK_OP_FIR, 2, T64(DSPK_F32, 2, f1), T64(DSPK_F32, 1, h0));
  assert_int_equal(infer_lim(&op, l100), DSPK_ESHAPE);
  op = OP(DSPK_OP_FIR, 2, T64(DSPK_F32, 2, xe), T64(DSPK_F32, 1, h1));
  assert_int_equal(infer_lim(&op, l100), 0);
  assert_int_equal(dspk__tensor_numel(&op.out[0]), 0);
}

static void test_check_results(void **state) {
  (void)state;
  struct dspk__op_limits l = LIM(UINT64_MAX, UINT64_MAX, 1000);
  int64_t a[] = {10, 0}, b[] = {0, 25};
  struct dspk__op op = OP(DSPK_OP_GEMM, 2, T64(DSPK_F32, 2, a), T64(DSPK_F32, 2, b));
  assert_int_equal(infer_lim(&op, l), 0);
  /* 10 x 25 f32 = 1000 bytes: exactly the inline cap. */
  assert_int_equal(dspk__op_check_results(&op, &l, 1, 3, msg, sizeof msg), 0);
  op.in[1].shape[1] = 26;
  assert_int_equal(infer_lim(&op, l), 0);
  assert_int_equal(dspk__op_check_results(&op, &l, 1, 3, msg, sizeof msg), DSPK_ELIMIT);
  assert_non_null(strstr(msg, "1040 bytes"));
  assert_non_null(strstr(msg, "write it into a buffer"));
  /* The same result written into a buffer is not inline. */
  assert_int_equal(dspk__op_check_results(&op, &l, 0, 3, msg, sizeof msg), 0);
  /* Device memory: inline inputs and inline results are temporaries. */
  int64_t x[] = {100};
  op = OP(DSPK_OP_MAP, 1, T64(DSPK_F64, 1, x));
  op.u.map.fn = DSPK_MAP_EXP;
  assert_int_equal(infer_lim(&op, l), 0);
  l = LIM(UINT64_MAX, 1599, UINT64_MAX);
  assert_int_equal(dspk__op_check_results(&op, &l, 1, 1, msg, sizeof msg), DSPK_ENOMEM);
  assert_non_null(strstr(msg, "1600 bytes"));
  assert_int_equal(dspk__op_check_results(&op, &l, 0, 1, msg, sizeof msg), 0);
  assert_int_equal(dspk__op_check_results(&op, &l, 1, 0, msg, sizeof msg), 0);
  /* A kernel's results are its inputs: inline ones count against the cap. */
  op = OP(DSPK_OP_KERNEL, 2, T64(DSPK_F64, 1, x), T64(DSPK_F64, 1, x));
  op.u.kernel.lang = "glsl";
  op.u.kernel.source = "x";
  l = LIM(UINT64_MAX, UINT64_MAX, 1000);
  assert_int_equal(infer_lim(&op, l), 0);
  assert_int_equal(dspk__op_check_results(&op, &l, 1, 1, msg, sizeof msg), 0);
  assert_int_equal(dspk__op_check_results(&op, &l, 3, 3, msg, sizeof msg), DSPK_ELIMIT);
  /* No limits: nothing is refused. */
  assert_int_equal(dspk__op_check_results(&op, NULL, 3, 3, msg, sizeof msg), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),   cmocka_unit_test(test_fft),
      cmocka_unit_test(test_fir),    cmocka_unit_test(test_contract),
      cmocka_unit_test(test_reduce), cmocka_unit_test(test_map),
      cmocka_unit_test(test_generic),
      cmocka_unit_test(test_tensor_size), cmocka_unit_test(test_result_overflow),
      cmocka_unit_test(test_zero_dims), cmocka_unit_test(test_check_results),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
