/*
 * Reductions (op "reduce"): sum, max, min, mean over a set of axes.  The
 * host splits the input's axes into kept ones (the output, C order) and
 * reduced ones, with their element strides.  dspk_reduce_block uses one
 * block per output element (long reductions), dspk_reduce_warp one warp
 * (medium ones), dspk_reduce_thread one thread (short reductions, many
 * outputs); all three take the same arguments, and the CUDA backend's
 * autotuning (backends/cuda/tune.c) picks the kernel and its block size per
 * shape class.  fn: 0 sum, 1 max, 2 min, 3 mean.
 */
struct dspk_rdesc {
  int nkeep, nred;
  dspk_i64 keep_shape[DSPK_MAXRANK], keep_stride[DSPK_MAXRANK];
  dspk_i64 red_shape[DSPK_MAXRANK], red_stride[DSPK_MAXRANK];
  dspk_i64 nout, nred_total;
};

__device__ inline dspk_i64 dspk_offset(dspk_i64 i, int n, const dspk_i64 *shape, const dspk_i64 *stride) {
  dspk_i64 off = 0;
  for (int k = n - 1; k >= 0; k--) {
    dspk_i64 s = shape[k];
    off += (i % s) * stride[k];
    i /= s;
  }
  return off;
}

__device__ inline DSPK_ACC dspk_combine(int fn, DSPK_ACC a, DSPK_ACC b) {
  return fn == 1 ? dspk_max(a, b) : fn == 2 ? dspk_min(a, b) : dspk_add(a, b);
}

__device__ inline DSPK_ACC dspk_finish(int fn, DSPK_ACC a, dspk_i64 count) {
  return fn == 3 ? dspk_scale(a, 1.0 / (double)count) : a;
}

/* Partial results of a block, in dynamic shared memory: blockDim.x
 * accumulators (the host passes blockDim.x * sizeof(dspk_c128) bytes). */
extern __shared__ dspk_c128 dspk_rsmem[];

/* Combines buf[0 .. valid) into buf[0], for a power-of-two width of
 * threads t = 0 .. width-1 (sequential addressing: no bank conflicts, and
 * entries at or above valid, which hold nothing, never enter).  Every
 * thread of the block calls it: it synchronizes the block. */
__device__ inline void dspk_tree(DSPK_ACC *buf, int t, int width, int valid, int fn) {
  for (int s = width / 2; s > 0; s /= 2) {
    if (t < s && t + s < valid)
      buf[t] = dspk_combine(fn, buf[t], buf[t + s]);
    __syncthreads();
  }
}

/* One block per output element (long reductions); blockDim.x is a power of
 * two up to 1024 (the launch bound keeps registers within what 1024
 * threads may use, so no block size fails to launch). */
extern "C" __global__ void __launch_bounds__(1024) dspk_reduce_block(const DSPK_T *x, DSPK_T *out, dspk_rdesc d, int fn) {
  DSPK_ACC *buf = (DSPK_ACC *)dspk_rsmem;
  int valid = (int)(d.nred_total < (dspk_i64)blockDim.x ? d.nred_total : (dspk_i64)blockDim.x);
  for (dspk_i64 o = blockIdx.x; o < d.nout; o += gridDim.x) {
    dspk_i64 base = dspk_offset(o, d.nkeep, d.keep_shape, d.keep_stride);
    DSPK_ACC acc;
    int have = 0;
    dspk_zero(&acc);
    for (dspk_i64 r = threadIdx.x; r < d.nred_total; r += blockDim.x) {
      DSPK_ACC v = dspk_acc(x[base + dspk_offset(r, d.nred, d.red_shape, d.red_stride)]);
      acc = have ? dspk_combine(fn, acc, v) : v;
      have = 1;
    }
    buf[threadIdx.x] = acc;
    __syncthreads();
    dspk_tree(buf, (int)threadIdx.x, (int)blockDim.x, valid, fn);
    if (threadIdx.x == 0)
      dspk_store(&out[o], dspk_finish(fn, buf[0], d.nred_total));
    __syncthreads();
  }
}

/* One warp (32 threads) per output element (medium reductions, many
 * outputs); blockDim.x is a multiple of 32.  The warps of a block step
 * through the outputs together, so every thread meets every barrier. */
extern "C" __global__ void __launch_bounds__(256) dspk_reduce_warp(const DSPK_T *x, DSPK_T *out, dspk_rdesc d, int fn) {
  DSPK_ACC *buf = (DSPK_ACC *)dspk_rsmem;
  int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32;
  dspk_i64 per = (dspk_i64)(blockDim.x / 32);
  int valid = (int)(d.nred_total < 32 ? d.nred_total : 32);
  for (dspk_i64 first = (dspk_i64)blockIdx.x * per; first < d.nout; first += (dspk_i64)gridDim.x * per) {
    dspk_i64 o = first + warp;
    DSPK_ACC acc;
    dspk_zero(&acc);
    if (o < d.nout) {
      dspk_i64 base = dspk_offset(o, d.nkeep, d.keep_shape, d.keep_stride);
      int have = 0;
      for (dspk_i64 r = lane; r < d.nred_total; r += 32) {
        DSPK_ACC v = dspk_acc(x[base + dspk_offset(r, d.nred, d.red_shape, d.red_stride)]);
        acc = have ? dspk_combine(fn, acc, v) : v;
        have = 1;
      }
    }
    buf[threadIdx.x] = acc;
    __syncthreads();
    dspk_tree(buf + warp * 32, lane, 32, valid, fn);
    if (lane == 0 && o < d.nout)
      dspk_store(&out[o], dspk_finish(fn, buf[threadIdx.x], d.nred_total));
    __syncthreads();
  }
}

extern "C" __global__ void dspk_reduce_thread(const DSPK_T *x, DSPK_T *out, dspk_rdesc d, int fn) {
  DSPK_LOOP(o, d.nout) {
    dspk_i64 base = dspk_offset(o, d.nkeep, d.keep_shape, d.keep_stride);
    DSPK_ACC acc;
    dspk_zero(&acc);
    for (dspk_i64 r = 0; r < d.nred_total; r++) {
      DSPK_ACC v = dspk_acc(x[base + dspk_offset(r, d.nred, d.red_shape, d.red_stride)]);
      acc = r ? dspk_combine(fn, acc, v) : v;
    }
    dspk_store(&out[o], dspk_finish(fn, acc, d.nred_total));
  }
}

/*
 * contract's check and fallback (backends/gpurt/ops.c, contract): a
 * contraction that sums one operand's own labels first, or one whose
 * complex product goes to the vendor's BLAS, scans the operands it
 * multiplies for an infinity or a NaN (dspk_nonfinite sets *flag), and
 * dspk_sumprod, launched after the product, then makes every output again
 * as numpy's einsum does, adding each product of the original operands:
 * no sum of one operand's values that overflows, inf - inf = NaN where
 * the pre-sum gave inf * (their sum).  With *flag 0 it writes nothing.
 */
__device__ inline int dspk_nonfin(double a) { return a - a != 0.0; }
__device__ inline int dspk_nonfin(dspk_c128 a) { return a.x - a.x != 0.0 || a.y - a.y != 0.0; }

extern "C" __global__ void dspk_nonfinite(const DSPK_T *x, dspk_i64 n, unsigned *flag) {
  DSPK_LOOP(i, n) {
    if (dspk_nonfin(dspk_acc(x[i]))) {
      *flag = 1u;
      return;
    }
  }
}

/* The output's labels (C order) with their strides in A and B (0 where a
 * label is not the operand's), and the labels summed over (those of A or B
 * not in the output) likewise; a label repeated in one operand has the sum
 * of its strides. */
struct dspk_sdesc {
  int nout, nin;
  dspk_i64 oshape[DSPK_MAXRANK], oa[DSPK_MAXRANK], ob[DSPK_MAXRANK];
  dspk_i64 ishape[2 * DSPK_MAXRANK], ia[2 * DSPK_MAXRANK], ib[2 * DSPK_MAXRANK];
  dspk_i64 n, ninner;
};

extern "C" __global__ void dspk_sumprod(const DSPK_T *a, const DSPK_T *b, DSPK_T *o,
                                        dspk_sdesc d, const unsigned *flag) {
  if (*flag == 0u)
    return;
  DSPK_LOOP(i, d.n) {
    dspk_i64 pa = 0, pb = 0, t = i;
    for (int k = d.nout - 1; k >= 0; k--) {
      dspk_i64 x = t % d.oshape[k];
      t /= d.oshape[k];
      pa += x * d.oa[k];
      pb += x * d.ob[k];
    }
    DSPK_ACC acc;
    dspk_zero(&acc);
    for (dspk_i64 r = 0; r < d.ninner; r++) {
      dspk_i64 qa = pa, qb = pb, u = r;
      for (int k = d.nin - 1; k >= 0; k--) {
        dspk_i64 x = u % d.ishape[k];
        u /= d.ishape[k];
        qa += x * d.ia[k];
        qb += x * d.ib[k];
      }
      acc = dspk_add(acc, dspk_mul(dspk_acc(a[qa]), dspk_acc(b[qb])));
    }
    dspk_store(&o[i], acc);
  }
}
