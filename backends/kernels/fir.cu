/*
 * Causal FIR filter (op "fir"), scipy.signal.lfilter(h, 1, x) along the
 * last axis: y[r, j] = sum_{t <= min(k-1, j)} h[t] * x[r, j - t].  One
 * thread per output element; the taps are staged through shared memory in
 * tiles so a block reads each tap once per tile.
 */
#define DSPK_FIR_TILE 512

/* The direct sum of output j of a row: sum_{t <= min(k-1, j)} h[t] *
 * row[j - t], in order.  Every thread of the block calls it the same number
 * of times (it synchronizes on the taps' tiles); only a live thread reads
 * row and sums (its result is zero otherwise).  dspk_fir and dspk_fir_fix
 * both use it, so the repaired outputs are the direct path's to the bit. */
__device__ inline DSPK_ACC dspk_fir_sum(const DSPK_T *row, const DSPK_T *h, dspk_i64 j, int k,
                                        bool live) {
  __shared__ DSPK_T taps[DSPK_FIR_TILE];
  DSPK_ACC acc;
  dspk_zero(&acc);
  for (int t0 = 0; t0 < k; t0 += DSPK_FIR_TILE) {
    int m = k - t0 < DSPK_FIR_TILE ? k - t0 : DSPK_FIR_TILE;
    __syncthreads();
    for (int t = threadIdx.x; t < m; t += blockDim.x)
      taps[t] = h[t0 + t];
    __syncthreads();
    if (live) {
      dspk_i64 lim = j - t0 + 1; /* taps t0+t with j-(t0+t) >= 0 */
      int mm = lim < (dspk_i64)m ? (int)(lim > 0 ? lim : 0) : m;
      for (int t = 0; t < mm; t++)
        acc = dspk_add(acc, dspk_mul(dspk_acc(taps[t]), dspk_acc(row[j - t0 - t])));
    }
  }
  return acc;
}

extern "C" __global__ void dspk_fir(const DSPK_T *x, const DSPK_T *h, DSPK_T *y, dspk_i64 n, int k, dspk_i64 total) {
  dspk_i64 first = (dspk_i64)blockIdx.x * blockDim.x;
  for (; first < total; first += (dspk_i64)blockDim.x * gridDim.x) {
    dspk_i64 i = first + threadIdx.x;
    dspk_i64 j = i < total ? i % n : 0;
    DSPK_ACC acc = dspk_fir_sum(x + (i - j), h, j, k, i < total);
    if (i < total)
      dspk_store(&y[i], acc);
  }
}

/*
 * The FFT (overlap-save) path of fir (backends/gpurt/fir_fft.c): the
 * signal is cut into blocks of L = 2^lg samples that overlap by k-1; block
 * g of a row starts at sample g*S - (k-1), S = L-k+1 (samples before 0 or
 * after n read as zero).  The gather writes the blocks as rows and, after
 * them (block nblk), the filter zero-padded and scaled, so that one batched
 * transform makes the filter's spectrum too; the blocks' spectra are
 * multiplied by the filter's, transformed back, and the scatter keeps the
 * last S samples of each block.  Real signals (f32, f64) are real rows
 * with R2C / C2R transforms (half spectra of m2 = L/2+1 values a row),
 * complex ones complex rows with C2C transforms.
 *
 * The scatter lists each segment (block) in which it writes a NaN or an
 * infinite output, by the exponent's bits (no fast-math option folds them
 * away), in fl: [0] the count, [1, 1+nblk) a flag per block (atomicOr, so
 * that only the first appends), [1+nblk, 1+nblk+count) the blocks; the
 * host clears the count and flags first.  dspk_fir_fix then computes the
 * listed segments again by the direct sum.
 *
 * Each kernel comes with 32-bit indices (name ending in 32) and 64-bit
 * ones; the host takes the 64-bit ones only where a size needs them: on
 * the H200 the scatter took 0.088 ms with 64-bit index arithmetic against
 * 0.052 ms with 32-bit (2^24 samples, blocks of 16384).
 */
struct dspk_firc { DSPK_R x, y; }; /* the layout of cufftComplex / cufftDoubleComplex */

/* a / b, in 32 bits when both fit (64-bit division is slow on GPUs). */
__device__ inline dspk_i64 dspk_fir_div(dspk_i64 a, dspk_i64 b) {
  return (a < 4294967296LL && b < 4294967296LL) ? (dspk_i64)((unsigned)a / (unsigned)b) : a / b;
}
__device__ inline dspk_i64 dspk_fir_q(dspk_i64 a, dspk_i64 b) { return dspk_fir_div(a, b); }
__device__ inline unsigned dspk_fir_q(unsigned a, unsigned b) { return a / b; }

#define DSPK_FIR_LOOP(I, i, n)                                                   \
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (I)blockDim.x * gridDim.x)

/* Sample j of block g (< nblk) of the signal, or zero. */
template <typename I>
__device__ inline DSPK_T dspk_fir_at(const DSPK_T *x, I n, I k, I S, I nb, I g, I j) {
  I row = g < nb ? 0 : dspk_fir_q(g, nb), t = (g - row * nb) * S + j;
  if (t >= k - 1 && t - (k - 1) < n)
    return x[row * n + t - (k - 1)];
  return DSPK_T(); /* zero */
}

/* The output sample i (of total = rows*n) from the filtered blocks; *seg
 * gets its segment (block) row*nb + blk. */
template <typename I>
__device__ inline I dspk_fir_src(I i, I n, I k, I S, int lg, I nb, I *seg) {
  I row = i < n ? 0 : dspk_fir_q(i, n), t = i - row * n, blk = dspk_fir_q(t, S);
  *seg = row * nb + blk;
  return (*seg << lg) + (k - 1) + (t - blk * S);
}

/* Whether v is NaN or infinite. */
__device__ inline bool dspk_fir_bad(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}
__device__ inline bool dspk_fir_bad(double v) {
  return ((unsigned)__double2hiint(v) & 0x7ff00000u) == 0x7ff00000u;
}

/* Lists segment seg of nblk in fl (see above). */
template <typename I>
__device__ inline void dspk_fir_list(unsigned *fl, I seg, I nblk) {
  if (atomicOr(&fl[1 + seg], 1u) == 0u)
    fl[1 + nblk + atomicAdd(&fl[0], 1u)] = (unsigned)seg;
}

#if DSPK_COMPLEX
template <typename I>
__device__ void dspk_fir_gather_t(const DSPK_T *x, const DSPK_T *h, dspk_firc *b, I n, I k,
                                  I S, int lg, I nb, I nblk, DSPK_R scale, I total) {
  DSPK_FIR_LOOP(I, i, total) {
    I g = i >> lg, j = i & (((I)1 << lg) - 1);
    dspk_firc v;
    v.x = 0;
    v.y = 0;
    if (g >= nblk) {
      if (j < k) {
        v.x = h[j].x * scale;
        v.y = h[j].y * scale;
      }
    } else {
      DSPK_T s = dspk_fir_at<I>(x, n, k, S, nb, g, j);
      v.x = s.x;
      v.y = s.y;
    }
    b[i] = v;
  }
}

/* b[i] *= hs[i mod L] over the blocks (total = nblk*L). */
template <typename I>
__device__ void dspk_fir_cmul_t(dspk_firc *b, const dspk_firc *hs, int lg, I total) {
  I mask = ((I)1 << lg) - 1;
  DSPK_FIR_LOOP(I, i, total) {
    dspk_firc a = b[i], h = hs[i & mask], r;
    r.x = a.x * h.x - a.y * h.y;
    r.y = a.x * h.y + a.y * h.x;
    b[i] = r;
  }
}

template <typename I>
__device__ void dspk_fir_scatter_t(const dspk_firc *b, DSPK_T *y, unsigned *fl, I n, I k, I S,
                                   int lg, I nb, I nblk, I total) {
  DSPK_FIR_LOOP(I, i, total) {
    I seg;
    dspk_firc v = b[dspk_fir_src<I>(i, n, k, S, lg, nb, &seg)];
    y[i].x = v.x;
    y[i].y = v.y;
    if (dspk_fir_bad(v.x) || dspk_fir_bad(v.y))
      dspk_fir_list<I>(fl, seg, nblk);
  }
}
#define DSPK_FIR_KERNELS(I, SFX)                                                                \
  extern "C" __global__ void dspk_fir_gather##SFX(const DSPK_T *x, const DSPK_T *h,              \
                                                  dspk_firc *b, I n, I k, I S, int lg, I nb,     \
                                                  I nblk, DSPK_R scale, I total) {               \
    dspk_fir_gather_t<I>(x, h, b, n, k, S, lg, nb, nblk, scale, total);                          \
  }                                                                                              \
  extern "C" __global__ void dspk_fir_cmul##SFX(dspk_firc *b, const dspk_firc *hs, int lg,       \
                                                I total) {                                       \
    dspk_fir_cmul_t<I>(b, hs, lg, total);                                                        \
  }                                                                                              \
  extern "C" __global__ void dspk_fir_scatter##SFX(const dspk_firc *b, DSPK_T *y, unsigned *fl,  \
                                                   I n, I k, I S, int lg, I nb, I nblk,          \
                                                   I total) {                                    \
    dspk_fir_scatter_t<I>(b, y, fl, n, k, S, lg, nb, nblk, total);                               \
  }
#else
template <typename I>
__device__ void dspk_fir_rgather_t(const DSPK_T *x, const DSPK_T *h, DSPK_T *b, I n, I k, I S,
                                   int lg, I nb, I nblk, DSPK_R scale, I total) {
  DSPK_FIR_LOOP(I, i, total) {
    I g = i >> lg, j = i & (((I)1 << lg) - 1);
    if (g >= nblk)
      b[i] = j < k ? h[j] * scale : (DSPK_T)0;
    else
      b[i] = dspk_fir_at<I>(x, n, k, S, nb, g, j);
  }
}

/* f[i] *= hs[i mod m2] over the blocks' half spectra (total = nblk*m2). */
template <typename I>
__device__ void dspk_fir_rcmul_t(dspk_firc *f, const dspk_firc *hs, I m2, I total) {
  DSPK_FIR_LOOP(I, i, total) {
    dspk_firc a = f[i], h = hs[i - dspk_fir_q(i, m2) * m2], r;
    r.x = a.x * h.x - a.y * h.y;
    r.y = a.x * h.y + a.y * h.x;
    f[i] = r;
  }
}

template <typename I>
__device__ void dspk_fir_rscatter_t(const DSPK_T *b, DSPK_T *y, unsigned *fl, I n, I k, I S,
                                    int lg, I nb, I nblk, I total) {
  DSPK_FIR_LOOP(I, i, total) {
    I seg;
    DSPK_T v = b[dspk_fir_src<I>(i, n, k, S, lg, nb, &seg)];
    y[i] = v;
    if (dspk_fir_bad(v))
      dspk_fir_list<I>(fl, seg, nblk);
  }
}
#define DSPK_FIR_KERNELS(I, SFX)                                                                 \
  extern "C" __global__ void dspk_fir_rgather##SFX(const DSPK_T *x, const DSPK_T *h, DSPK_T *b,   \
                                                   I n, I k, I S, int lg, I nb, I nblk,           \
                                                   DSPK_R scale, I total) {                       \
    dspk_fir_rgather_t<I>(x, h, b, n, k, S, lg, nb, nblk, scale, total);                          \
  }                                                                                               \
  extern "C" __global__ void dspk_fir_rcmul##SFX(dspk_firc *f, const dspk_firc *hs, I m2,         \
                                                 I total) {                                       \
    dspk_fir_rcmul_t<I>(f, hs, m2, total);                                                        \
  }                                                                                               \
  extern "C" __global__ void dspk_fir_rscatter##SFX(const DSPK_T *b, DSPK_T *y, unsigned *fl,   \
                                                    I n, I k, I S, int lg, I nb, I nblk,          \
                                                    I total) {                                    \
    dspk_fir_rscatter_t<I>(b, y, fl, n, k, S, lg, nb, nblk, total);                               \
  }
#endif
DSPK_FIR_KERNELS(dspk_i64, )
DSPK_FIR_KERNELS(unsigned, 32)

/* The repair (fir_fft.c): the direct sum (dspk_fir_sum), on the segments
 * listed in fl (see the scatter), each of S outputs of a row (nb segments
 * a row); block w of the grid takes the pairs (listed segment, chunk of
 * blockDim.x outputs) w, w + gridDim.x, ...: with nothing listed every
 * block reads the count and ends. */
extern "C" __global__ void dspk_fir_fix(const DSPK_T *x, const DSPK_T *h, DSPK_T *y, dspk_i64 n,
                                        int k, const unsigned *fl, dspk_i64 S, dspk_i64 nb,
                                        dspk_i64 nblk) {
  dspk_i64 chunks = (S + blockDim.x - 1) / blockDim.x, pairs = (dspk_i64)fl[0] * chunks;
  for (dspk_i64 w = blockIdx.x; w < pairs; w += gridDim.x) {
    dspk_i64 q = w / chunks, seg = fl[1 + nblk + q], r = seg / nb;
    dspk_i64 j0 = (w - q * chunks) * blockDim.x + threadIdx.x;
    dspk_i64 j = (seg - r * nb) * S + j0;
    int live = j0 < S && j < n;
    DSPK_ACC acc = dspk_fir_sum(x + r * n, h, j, k, live);
    if (live)
      dspk_store(&y[r * n + j], acc);
  }
}
