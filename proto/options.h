/*
 * The options of each op of task.run, all in this one file: the struct the
 * backends receive (struct dspk__op's u, backends/op.h), the indices of
 * its parameters (for libdspkclient's encoder), and, for proto/schema.c
 * only (DSPK__OPTIONS_TABLE), each op's table of options: name, type,
 * range, default, and where the decoder stores the value.  The first part
 * is plain C: the backends include it without the codec.
 */
#ifndef DSPK_PROTO_OPTIONS_H
#define DSPK_PROTO_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "dspk/types.h"
#include "proto/dtype.h"

#define DSPK__SUBSCRIPTS_MAX 64 /* bytes with the NUL */
#define DSPK__ENTRY_MAX 64
#define DSPK__KERNEL_MAX_ARGS 16

/* A raw kernel argument: a tensor (by index into op.in) or a scalar. */
enum dspk__karg_kind { DSPK__KARG_TENSOR, DSPK__KARG_I32, DSPK__KARG_U32,
                       DSPK__KARG_I64, DSPK__KARG_F32, DSPK__KARG_F64 };
struct dspk__karg {
  enum dspk__karg_kind kind;
  union { int tensor; int32_t i32; uint32_t u32; int64_t i64; float f32; double f64; } v;
};

/* The options of each op (struct dspk__op's u, backends/op.h).  A row of
 * an op's table with .at stores its decoded value here
 * (dspk__params_store): bool as int, number as double, enum as its enum,
 * str as a NUL-terminated array, uint as uint32_t when its max fits, else
 * uint64_t, dim3 as uint32_t[3]; the handler fills the rest. */
union dspk__op_options {
  /* in: A (..., M, K), B (..., K, N), optional C broadcastable to the
   * output.  out = alpha*op(A)@op(B) + beta*C (numpy.matmul batch rules;
   * trans_x transposes the last two axes of X).  f32, f64; f16/bf16 inputs
   * give an f32 output where a backend offers them. */
  struct {
    int trans_a, trans_b;
    double alpha, beta;
    struct dspk__num_sent alpha_sent, beta_sent; /* as sent, for messages */
  } gemm;
  /* in: X (..., N).  Complex X: numpy.fft.fft, or numpy.fft.ifft when
   * inverse.  Real X: numpy.fft.rfft, out (..., N/2+1) complex. */
  struct { int inverse; } fft;
  /* in: X (..., N), H (K,) same dtype.  out = scipy.signal.lfilter(H,1,X). */
  struct { int unused; } fir;
  /* in: A, B.  numpy.einsum(subscripts, A, B) with explicit "->". */
  struct { char subscripts[DSPK__SUBSCRIPTS_MAX]; } contract;
  /* in: X.  Reduce over the axes whose bits are set (all when 0). */
  struct { dspk_reduce fn; uint32_t axes; } reduce;
  /* in: A [, B].  Elementwise; binary functions need equal shapes. */
  struct { dspk_mapfn fn; double alpha; struct dspk__num_sent alpha_sent; } map;
  /* Raw kernel in a backend's source language.  Tensor args refer to
   * op.in[]; kernels write their results into those tensors in place. */
  struct {
    const char *lang; /* "cuda", "glsl", "spirv", "hip" */
    const void *source;
    size_t source_len;
    char entry[DSPK__ENTRY_MAX];
    uint32_t grid[3], block[3], shared_bytes;
    int nargs;
    struct dspk__karg args[DSPK__KERNEL_MAX_ARGS];
  } kernel;
};

/* The index of each option in its op's table. */
enum { DSPK__GEMM_TRANS_A, DSPK__GEMM_TRANS_B, DSPK__GEMM_ALPHA, DSPK__GEMM_BETA };
enum { DSPK__FFT_INVERSE };
enum { DSPK__CONTRACT_SUBSCRIPTS };
enum { DSPK__REDUCE_FN, DSPK__REDUCE_AXES };
enum { DSPK__MAP_FN, DSPK__MAP_ALPHA };
enum {
  DSPK__KERNEL_LANG, DSPK__KERNEL_SOURCE, DSPK__KERNEL_ENTRY, DSPK__KERNEL_GRID,
  DSPK__KERNEL_BLOCK, DSPK__KERNEL_SHARED, DSPK__KERNEL_ARGS
};

#endif /* DSPK_PROTO_OPTIONS_H */

#ifdef DSPK__OPTIONS_TABLE
/* Included once, by proto/schema.c (after proto/schema.h): the tables. */

/* Where a row's value goes in union dspk__op_options. */
#define AT(field) .at = offsetof(union dspk__op_options, field) + 1
/* And where a NUM row's number as sent goes (dspk__num_sent). */
#define SENT(field) .at_sent = offsetof(union dspk__op_options, field) + 1

static const struct dspk__param gemm_o[] = {
    [DSPK__GEMM_TRANS_A] = {"trans_a", DSPK__T_BOOL, .def_doc = "false", AT(gemm.trans_a)},
    [DSPK__GEMM_TRANS_B] = {"trans_b", DSPK__T_BOOL, .def_doc = "false", AT(gemm.trans_b)},
    [DSPK__GEMM_ALPHA] = {"alpha", DSPK__T_NUM, .def = {.v.f = 1.0}, .def_doc = "1",
                          AT(gemm.alpha), SENT(gemm.alpha_sent)},
    [DSPK__GEMM_BETA] = {"beta", DSPK__T_NUM, .def_doc = "0", AT(gemm.beta),
                         SENT(gemm.beta_sent)},
};
static const struct dspk__param fft_o[] = {
    [DSPK__FFT_INVERSE] = {"inverse", DSPK__T_BOOL, .def_doc = "false", AT(fft.inverse)},
};
static const struct dspk__param contract_o[] = {
    [DSPK__CONTRACT_SUBSCRIPTS] = {"subscripts", DSPK__T_STR, REQ,
                                   .max = DSPK__SUBSCRIPTS_MAX - 1,
                                   .expect = "a string, e.g. \"ik,kj->ij\"",
                                   AT(contract.subscripts)},
};
static const struct dspk__param reduce_o[] = {
    [DSPK__REDUCE_FN] = {"fn", DSPK__T_ENUM, .choices = dspk__reduce_names,
                         .noun = "reduction", .def_doc = "sum", AT(reduce.fn)},
    [DSPK__REDUCE_AXES] = {"axes", DSPK__T_ARRAY, .min = 1,
                           .expect = "a non-empty array of integers (omit it to reduce over "
                                     "every axis)",
                           .def_doc = "all axes"},
};
static const struct dspk__param map_o[] = {
    [DSPK__MAP_FN] = {"fn", DSPK__T_ENUM, REQ, .choices = dspk__mapfn_names,
                      .noun = "function", AT(map.fn)},
    [DSPK__MAP_ALPHA] = {"alpha", DSPK__T_NUM, .def = {.v.f = 1.0}, .def_doc = "1",
                         AT(map.alpha), SENT(map.alpha_sent)},
};
static const struct dspk__param kernel_o[] = {
    [DSPK__KERNEL_LANG] = {"lang", DSPK__T_ENUM, REQ, .choices = dspk__kernel_langs,
                           .noun = "language"},
    [DSPK__KERNEL_SOURCE] = {"source", DSPK__T_BIN, REQ},
    [DSPK__KERNEL_ENTRY] = {"entry", DSPK__T_STR, .max = DSPK__ENTRY_MAX - 1,
                            .def = STRDEF("main"), .def_doc = "\"main\"", AT(kernel.entry)},
    [DSPK__KERNEL_GRID] = {"grid", DSPK__T_DIM3, .def = {.v.dim = {1, 1, 1}},
                           .def_doc = "[1, 1, 1]", AT(kernel.grid)},
    [DSPK__KERNEL_BLOCK] = {"block", DSPK__T_DIM3, .def = {.v.dim = {1, 1, 1}},
                            .def_doc = "[1, 1, 1]", AT(kernel.block)},
    [DSPK__KERNEL_SHARED] = {"shared", DSPK__T_UINT, .max = UINT32_MAX,
                             .range_err = DSPK_ERANGE, .expect = DSPK__EXPECT_BYTES,
                             .def_doc = "0", AT(kernel.shared_bytes)},
    [DSPK__KERNEL_ARGS] = {"args", DSPK__T_ARRAY, .max = DSPK__KERNEL_MAX_ARGS,
                           .expect = "an array of at most 16 maps", .def_doc = "[]"},
};

#define OP(e, o) [DSPK_OP_##e] = {o, N(o)}
#define OP0(e) [DSPK_OP_##e] = {NULL, 0}

const struct dspk__op_desc dspk__ops[DSPK_OP_COUNT] = {
    OP(GEMM, gemm_o),
    OP(FFT, fft_o),
    OP0(FIR),
    OP(CONTRACT, contract_o),
    OP(REDUCE, reduce_o),
    OP(MAP, map_o),
    OP(KERNEL, kernel_o),
};

#endif /* DSPK__OPTIONS_TABLE */
