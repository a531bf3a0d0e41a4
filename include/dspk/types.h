/*
 * dspk value types shared by the wire protocol, the daemon, the backends and
 * the public C API: element types (dtypes), the op names of task.run, and the
 * limits on tensor rank.  One X-macro per table, so every layer agrees on the
 * names that travel on the wire.
 */
#ifndef DSPK_TYPES_H
#define DSPK_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Highest tensor rank any layer accepts.  The daemon's configured limit
 * (max_rank) may be lower, never higher. */
#define DSPK_MAX_RANK 8

/* XX(enum suffix, wire name, element size in bytes, is_complex) */
#define DSPK_DTYPE_MAP(XX)                                                     \
  XX(F32, "f32", 4, 0)                                                         \
  XX(F64, "f64", 8, 0)                                                         \
  XX(C64, "c64", 8, 1)                                                         \
  XX(C128, "c128", 16, 1)                                                      \
  XX(F16, "f16", 2, 0)                                                         \
  XX(BF16, "bf16", 2, 0)

typedef enum dspk_dtype {
#define DSPK__DT_ENUM(e, name, size, cplx) DSPK_##e,
  DSPK_DTYPE_MAP(DSPK__DT_ENUM)
#undef DSPK__DT_ENUM
  DSPK_DTYPE_COUNT
} dspk_dtype;

/* XX(enum suffix, wire name) : the ops of task.run */
#define DSPK_OP_MAP(XX)                                                        \
  XX(GEMM, "gemm")                                                             \
  XX(FFT, "fft")                                                               \
  XX(FIR, "fir")                                                               \
  XX(CONTRACT, "contract")                                                     \
  XX(REDUCE, "reduce")                                                         \
  XX(MAP, "map")                                                               \
  XX(KERNEL, "kernel")

typedef enum dspk_op {
#define DSPK__OP_ENUM(e, name) DSPK_OP_##e,
  DSPK_OP_MAP(DSPK__OP_ENUM)
#undef DSPK__OP_ENUM
  DSPK_OP_COUNT
} dspk_op;

/* XX(enum suffix, wire name) : reductions of op "reduce" */
#define DSPK_REDUCE_MAP(XX)                                                    \
  XX(SUM, "sum")                                                               \
  XX(MAX, "max")                                                               \
  XX(MIN, "min")                                                               \
  XX(MEAN, "mean")

typedef enum dspk_reduce {
#define DSPK__RED_ENUM(e, name) DSPK_REDUCE_##e,
  DSPK_REDUCE_MAP(DSPK__RED_ENUM)
#undef DSPK__RED_ENUM
  DSPK_REDUCE_COUNT
} dspk_reduce;

/* XX(enum suffix, wire name, number of tensor inputs) : functions of op "map".
 * add/sub/mul: out = a (op) b, same shapes.  scale: out = alpha*a.
 * axpy: out = alpha*a + b.  abs, exp: elementwise on a. */
#define DSPK_MAPFN_MAP(XX)                                                     \
  XX(ADD, "add", 2)                                                            \
  XX(SUB, "sub", 2)                                                            \
  XX(MUL, "mul", 2)                                                            \
  XX(SCALE, "scale", 1)                                                        \
  XX(AXPY, "axpy", 2)                                                          \
  XX(ABS, "abs", 1)                                                            \
  XX(EXP, "exp", 1)

typedef enum dspk_mapfn {
#define DSPK__MAP_ENUM(e, name, nin) DSPK_MAP_##e,
  DSPK_MAPFN_MAP(DSPK__MAP_ENUM)
#undef DSPK__MAP_ENUM
  DSPK_MAPFN_COUNT
} dspk_mapfn;

#endif /* DSPK_TYPES_H */
