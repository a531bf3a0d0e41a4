/*
 * Reductions (op "reduce"): sum, max, min, mean over a set of axes.  The
 * host splits the input's axes into kept ones (the output, C order) and
 * reduced ones, with their element strides.  dspk_reduce_block uses one
 * block per output element (long reductions); dspk_reduce_thread one thread
 * per output element (short reductions, many outputs).  fn: 0 sum, 1 max,
 * 2 min, 3 mean.
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

extern "C" __global__ void dspk_reduce_block(const DSPK_T *x, DSPK_T *out, dspk_rdesc d, int fn) {
  __shared__ DSPK_ACC buf[256];
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
    /* Threads without an element hold 0, which only sums may combine. */
    int valid = (int)(d.nred_total < (dspk_i64)blockDim.x ? d.nred_total : (dspk_i64)blockDim.x);
    for (int s = 1; s < (int)blockDim.x; s *= 2) {
      int t = (int)threadIdx.x;
      if (t % (2 * s) == 0 && t + s < valid)
        buf[t] = dspk_combine(fn, buf[t], buf[t + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0)
      dspk_store(&out[o], dspk_finish(fn, buf[0], d.nred_total));
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
