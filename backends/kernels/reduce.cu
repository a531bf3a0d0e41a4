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

#if !DSPK_COMPLEX
/* Real dtypes: K*(S + T) work per output, not K*S*T (S, T: the sizes of
 * A's and B's own summed labels, K of those in both).  For each index of
 * the labels in both, the products' sum is the product of the two groups'
 * sums, each kept as m * 2^e (no partial sum overflows) with its flags (1
 * NaN, 2 +inf, 4 -inf, 8 zero, 16 positive, 32 negative), from which
 * IEEE's special values follow: a NaN, an infinity times a zero, or
 * infinities of both signs among the products give NaN, else an infinity
 * among them gives it.  The finite part is rounded once on store. */
__device__ inline void dspk_addm(double &m, int &e, double y, int ye) {
  if (y == 0.0)
    return;
  int d = m == 0.0 ? ye : (e > ye ? e : ye);
  m = (m == 0.0 || e - d < -60 ? 0.0 : ldexp(m, e - d)) + (ye - d < -60 ? 0.0 : ldexp(y, ye - d));
  int k;
  m = frexp(m, &k);
  e = m == 0.0 ? 0 : d + k;
}

/* The flags and m * 2^e sum of the values of x at q plus every index of
 * the n labels lab (sizes d.ishape, strides st). */
__device__ inline unsigned dspk_group(const DSPK_T *x, dspk_i64 q, const dspk_sdesc &d,
                                      const dspk_i64 *st, const int *lab, int n, dspk_i64 cnt,
                                      double &m, int &e) {
  unsigned f = 0u;
  m = 0.0;
  e = 0;
  for (dspk_i64 r = 0; r < cnt; r++) {
    dspk_i64 qq = q, u = r;
    for (int j = n - 1; j >= 0; j--) {
      dspk_i64 sz = d.ishape[lab[j]];
      qq += u % sz * st[lab[j]];
      u /= sz;
    }
    double v = dspk_acc(x[qq]);
    if (v != v)
      f |= 1u;
    else if (v - v != 0.0)
      f |= v > 0.0 ? 2u : 4u;
    else if (v == 0.0)
      f |= 8u;
    else {
      f |= v > 0.0 ? 16u : 32u;
      int ve;
      double vm = frexp(v, &ve);
      dspk_addm(m, e, vm, ve);
    }
  }
  return f;
}

__device__ inline unsigned dspk_pairf(unsigned fa, unsigned fb) {
  if ((fa | fb) & 1u)
    return 1u;
  unsigned ia = fa & 6u, ib = fb & 6u;
  if (!ia && !ib)
    return 0u;
  if ((ia && (fb & 8u)) || (ib && (fa & 8u)))
    return 1u;
  unsigned ap = fa & 18u, an = fa & 36u, bp = fb & 18u, bn = fb & 36u, r = 0u;
  if (((fa & 2u) && bp) || ((fa & 4u) && bn) || ((fb & 2u) && ap) || ((fb & 4u) && an))
    r |= 2u;
  if (((fa & 2u) && bn) || ((fa & 4u) && bp) || ((fb & 2u) && an) || ((fb & 4u) && ap))
    r |= 4u;
  return r;
}
#endif

extern "C" __global__ void dspk_sumprod(const DSPK_T *a, const DSPK_T *b, DSPK_T *o,
                                        dspk_sdesc d, const unsigned *flag) {
  if (*flag == 0u)
    return;
#if !DSPK_COMPLEX
  /* The summed labels by kind: in both operands, in A only, in B only. */
  int lc[2 * DSPK_MAXRANK], la[2 * DSPK_MAXRANK], lb[2 * DSPK_MAXRANK], nc = 0, na = 0, nb = 0;
  dspk_i64 K = 1, S = 1, T = 1;
  for (int k = 0; k < d.nin; k++) {
    if (d.ib[k] == 0 && d.ia[k] != 0) {
      la[na++] = k;
      S *= d.ishape[k];
    } else if (d.ia[k] == 0 && d.ib[k] != 0) {
      lb[nb++] = k;
      T *= d.ishape[k];
    } else {
      lc[nc++] = k;
      K *= d.ishape[k];
    }
  }
  DSPK_LOOP(i, d.n) {
    dspk_i64 pa = 0, pb = 0, t = i;
    for (int k = d.nout - 1; k >= 0; k--) {
      dspk_i64 x = t % d.oshape[k];
      t /= d.oshape[k];
      pa += x * d.oa[k];
      pb += x * d.ob[k];
    }
    double m = 0.0;
    int e = 0;
    unsigned f = 0u;
    for (dspk_i64 r = 0; r < K; r++) {
      dspk_i64 qa = pa, qb = pb, u = r;
      for (int j = nc - 1; j >= 0; j--) {
        dspk_i64 sz = d.ishape[lc[j]], x = u % sz;
        u /= sz;
        qa += x * d.ia[lc[j]];
        qb += x * d.ib[lc[j]];
      }
      double ma, mb;
      int ea, eb;
      unsigned fa = dspk_group(a, qa, d, d.ia, la, na, S, ma, ea);
      unsigned fb = dspk_group(b, qb, d, d.ib, lb, nb, T, mb, eb);
      unsigned pf = dspk_pairf(fa, fb);
      if (pf)
        f |= pf;
      else
        dspk_addm(m, e, ma * mb, ea + eb);
    }
    double v;
    if ((f & 1u) || (f & 6u) == 6u)
      v = __longlong_as_double(0x7ff8000000000000LL);
    else if (f)
      v = __longlong_as_double((f & 2u) ? 0x7ff0000000000000LL : (long long)0xfff0000000000000ULL);
    else if (m == 0.0)
      v = 0.0;
    else if (e > 1100)
      v = __longlong_as_double(m > 0.0 ? 0x7ff0000000000000LL : (long long)0xfff0000000000000ULL);
    else if (e < -1100)
      v = 0.0;
    else
      v = ldexp(m, e);
    dspk_store(&o[i], v);
  }
#else
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
#endif
}
