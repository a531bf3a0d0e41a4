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
  expect_err(&op, DSPK_EINVAL, "label 'i' repeats in the A term", NULL);
  strcpy(op.u.contract.subscripts, "ij,kl->ikk");
  expect_err(&op, DSPK_EINVAL, "repeats in the output term", NULL);
  strcpy(op.u.contract.subscripts, "ijk,kl->il");
  expect_err(&op, DSPK_ESHAPE, "A has rank 2 but its term \"ijk\" has 3 labels", NULL);
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
  expect_err(&op, DSPK_ESHAPE, "too many elements", NULL);
  op = OP(DSPK_OP_COUNT, 0);
  expect_err(&op, DSPK_EINVAL, "unknown op", NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),   cmocka_unit_test(test_fft),
      cmocka_unit_test(test_fir),    cmocka_unit_test(test_contract),
      cmocka_unit_test(test_reduce), cmocka_unit_test(test_map),
      cmocka_unit_test(test_generic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
