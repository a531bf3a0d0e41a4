/*
 * The options of each op of task.run as the backends receive them (struct
 * dspk__op's u, backends/op.h), filled by the daemon from the op's table
 * in proto/schema.c.  Plain C types only: the backends include this
 * without the codec.
 */
#ifndef DSPK_PROTO_OPTIONS_H
#define DSPK_PROTO_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "dspk/types.h"

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
  struct { int trans_a, trans_b; double alpha, beta; } gemm;
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
  struct { dspk_mapfn fn; double alpha; } map;
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

#endif /* DSPK_PROTO_OPTIONS_H */
