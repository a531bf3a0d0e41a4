/*
 * The description of one compute task as every backend receives it, and the
 * shared, backend-independent validation of its operands.
 *
 * The daemon decodes task.run into a struct dspk__op, places every operand in
 * device memory, and calls dspk__op_infer() once: it checks dtypes, ranks and
 * shapes (naming the operand and axis in its message on a mismatch) and fills
 * in the dtype and shape of every output.  Backends therefore receive only
 * valid ops, and all backends agree on semantics and errors.
 */
#ifndef DSPK_BACKENDS_OP_H
#define DSPK_BACKENDS_OP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dspk/errors.h"
#include "dspk/types.h"
#include "proto/dtype.h"
#include "proto/options.h"

#define DSPK__OP_MAX_IN 4
/* The most results an op computes: every op has one ("kernel" none of its
 * own, its results being its inputs); task.run's outputs takes at most this
 * many entries (proto/schema.c). */
#define DSPK__OP_MAX_OUT 1

struct dspk__mem; /* a block of device memory, owned by its backend */

/* A tensor placed in device memory: C order, contiguous, starting `offset`
 * bytes into `mem`. */
struct dspk__tensor {
  dspk_dtype dtype;
  int rank;
  int64_t shape[DSPK_MAX_RANK];
  struct dspk__mem *mem;
  size_t offset;
};

/*
 * The sizes of t with overflow-checked arithmetic: *numel, the number of
 * elements (the product of the shape; 1 for rank 0, 0 when a dimension is 0)
 * and *nbytes, their size in bytes.  Returns 0, or -1 when a dimension is
 * negative, the dtype unknown, or the tensor's extent does not fit: the
 * product of its dimensions with every 0 counted as 1, times the item size,
 * must fit in an int64, so every stride, batch count and byte offset a
 * backend derives from the shape is representable even for a tensor with
 * zero elements.  Either output pointer may be NULL.
 */
int dspk__tensor_size(const struct dspk__tensor *t, int64_t *numel, size_t *nbytes);
/* Number of elements (product of the shape; 1 for rank 0); INT64_MAX when
 * dspk__tensor_size() refuses the shape. */
int64_t dspk__tensor_numel(const struct dspk__tensor *t);
/* Size in bytes of the elements; SIZE_MAX when dspk__tensor_size() refuses
 * the shape, so a bounds check made with it fails safe. */
size_t dspk__tensor_nbytes(const struct dspk__tensor *t);

struct dspk__op {
  dspk_op kind;
  int nin;
  struct dspk__tensor in[DSPK__OP_MAX_IN];
  int nout; /* set by dspk__op_infer(), except for "kernel" (0) */
  struct dspk__tensor out[DSPK__OP_MAX_OUT];
  union dspk__op_options u; /* proto/schema.h: decoded by its table */
};

/*
 * What an op may cost, as the daemon configures it (UINT64_MAX: no limit).
 * Zero-element tensors count 0 elements whatever their shape.
 */
struct dspk__op_limits {
  uint64_t max_elements; /* elements in one input or one result */
  uint64_t max_rank;     /* rank of one result (inputs: checked when decoded) */
  uint64_t max_bytes;    /* bytes the task allocates on its device: inline
                            inputs plus results not written into a buffer */
  uint64_t max_inline;   /* bytes of the results sent back inline, together */
};

/* Sets every limit of *l to UINT64_MAX (none). */
void dspk__op_limits_none(struct dspk__op_limits *l);

/*
 * Validates op's inputs and options and fills op->nout and the dtype, rank
 * and shape of each output (mem/offset are left for the caller to place).
 * Every shape product and byte count is computed with overflow checks
 * (dspk__tensor_size), so after a 0 return dspk__tensor_numel/nbytes of every
 * input and output are exact.  Returns 0, or a negative dspk_errno with a
 * one-line explanation in msg that names the operand and axis at fault
 * (ELIMIT for a size that does not fit).  dspk__op_infer applies no limit
 * beyond representability; dspk__op_infer_lim also refuses an input or
 * result of more than lim->max_elements elements (ELIMIT).
 */
int dspk__op_infer(struct dspk__op *op, char *msg, size_t msglen);
int dspk__op_infer_lim(struct dspk__op *op, const struct dspk__op_limits *lim,
                       char *msg, size_t msglen);

/*
 * After dspk__op_infer, once the caller knows where the results go: bit i of
 * inline_mask set means result i comes back inline (for "kernel", whose
 * results are its inputs, bit i is input i).  Bit i of inline_in set means
 * input i is sent inline (copied into a temporary on the device).  Refuses,
 * with a message naming the result and the limit: inline results of more
 * than lim->max_inline bytes together (ELIMIT, with the hint to write the
 * result into a buffer with `outputs`), and more than lim->max_bytes of
 * temporaries on the device (ENOMEM).  Returns 0 or the negative code.
 */
int dspk__op_check_results(const struct dspk__op *op, const struct dspk__op_limits *lim,
                           unsigned inline_mask, unsigned inline_in, char *msg,
                           size_t msglen);

/*
 * The scalars an op computes with (docs/protocol.md, task.run): an option
 * of an op that computes in f32 (gemm of f32, f16 or bf16 A and B; map of
 * an f32 or c64 A) rounded to the nearest f32, any other as given.
 * dspk__op_infer() checked that the rounding stays finite.  Every backend
 * computes with these, and decides on them what BLAS decides on its
 * arguments: gemm's "alpha 0 reads neither A nor B" and "beta 0 reads no C"
 * (alpha 1e-50 of an f32 product is 0).  *beta is 0 without C; a zero
 * of either sign comes out +0 (cuBLAS read C with beta -0).
 */
void dspk__op_gemm_scalars(const struct dspk__op *op, double *alpha, double *beta);
double dspk__op_map_alpha(const struct dspk__op *op);

/*
 * Parses contract subscripts ("ab,bc->ac", spaces ignored) against A and B,
 * as dspk__op_infer() does, for backends that lower einsum themselves.
 * Writes the NUL-terminated labels of A, B and the output into lab[0..2] and
 * the size of every label into size[] indexed by the letter (-1 when
 * unused).  Returns 0, or DSPK_EINVAL/DSPK_ESHAPE with a message.
 */
int dspk__contract_parse(const char *subs, const struct dspk__tensor *A,
                         const struct dspk__tensor *B,
                         char lab[3][DSPK_MAX_RANK + 1], int64_t size[128],
                         char *msg, size_t len);

/* The dtypes of each op's first input (gemm's A, fft's X, ...) that
 * dspk__op_infer() accepts, bit (1u << dtype); every dtype for "kernel".
 * The row of a new op goes here, next to its case in dspk__op_infer(). */
extern const uint32_t dspk__op_dtypes[DSPK_OP_COUNT];

/* Per-call context a backend receives with each op (runner thread only). */
struct dspk__opctx {
  /* Set by the loop thread to ask a running op to stop early; backends poll
   * it between chunks of work and return DSPK_ECANCELED. */
  atomic_int *cancel;
  /* Optional: reports progress of long work (autotuning) to the client.
   * May be NULL. */
  void (*progress)(void *ud, const char *what, double fraction);
  void *progress_ud;
  /* A backend writes the detail of a failure here (compiler log, axis
   * names); the daemon sends it as the error message. */
  char *errmsg;
  size_t errmsg_len;
  /* The uid whose task this is (the daemon sets it; 0 elsewhere).  A
   * client's raw kernel is compiled and cached for its owner alone
   * (docs/security.md): another uid running the same source compiles it
   * anew, so no user can tell from counters or timing whether another ran a
   * given source; the daemon's own kernels are shared.  The GPU runtimes
   * run raw kernels in one worker process per device, whose context keeps
   * shared memory, registers and local memory from one kernel to the next:
   * a raw kernel of another uid than the worker's last one gets a fresh
   * worker (backends/gpurt/worker.c). */
  uint32_t owner;
};

/* Writes a one-line message into ctx->errmsg (when ctx has one) and returns
 * code: how every backend fails an op with detail for the client. */
int dspk__op_fail(struct dspk__opctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* DSPK_BACKENDS_OP_H */
