/*
 * Causal FIR filter (op "fir"), scipy.signal.lfilter(h, 1, x) along the
 * last axis: y[r, j] = sum_{t <= min(k-1, j)} h[t] * x[r, j - t].  One
 * thread per output element; the taps are staged through shared memory in
 * tiles so a block reads each tap once per tile.
 */
#define DSPK_FIR_TILE 512
extern "C" __global__ void dspk_fir(const DSPK_T *x, const DSPK_T *h, DSPK_T *y, dspk_i64 n, int k, dspk_i64 total) {
  __shared__ DSPK_T taps[DSPK_FIR_TILE];
  dspk_i64 first = (dspk_i64)blockIdx.x * blockDim.x;
  for (; first < total; first += (dspk_i64)blockDim.x * gridDim.x) {
    dspk_i64 i = first + threadIdx.x;
    dspk_i64 j = i < total ? i % n : 0;
    const DSPK_T *row = x + (i - j);
    DSPK_ACC acc;
    dspk_zero(&acc);
    for (int t0 = 0; t0 < k; t0 += DSPK_FIR_TILE) {
      int m = k - t0 < DSPK_FIR_TILE ? k - t0 : DSPK_FIR_TILE;
      __syncthreads();
      for (int t = threadIdx.x; t < m; t += blockDim.x)
        taps[t] = h[t0 + t];
      __syncthreads();
      if (i < total) {
        dspk_i64 lim = j - t0 + 1; /* taps t0+t with j-(t0+t) >= 0 */
        int mm = lim < (dspk_i64)m ? (int)(lim > 0 ? lim : 0) : m;
        for (int t = 0; t < mm; t++)
          acc = dspk_add(acc, dspk_mul(dspk_acc(taps[t]), dspk_acc(row[j - t0 - t])));
      }
    }
    if (i < total)
      dspk_store(&y[i], acc);
  }
}

/*
 * The FFT (overlap-save) path of fir (backends/cuda/fir_fft.c): the signal
 * is cut into blocks of L = 2^lg samples that overlap by k-1, each block is
 * transformed (cuFFT, complex, in place), multiplied by the transform of
 * the zero-padded filter and transformed back; the last L-k+1 samples of
 * each block are outputs.  Block g of a row starts at sample g*S - (k-1),
 * S = L-k+1 (samples before 0 or after n read as zero).  A real signal
 * packs two consecutive blocks (over all rows) into one complex block, the
 * first in the real part and the second in the imaginary part: the filter
 * is real, so their results come back in the same parts.
 */
struct dspk_firc { DSPK_R x, y; }; /* the layout of cufftComplex / cufftDoubleComplex */

__device__ inline void dspk_firc_set(dspk_firc *c, int part, float v) { if (part) c->y = v; else c->x = v; }
__device__ inline void dspk_firc_set(dspk_firc *c, int part, double v) { if (part) c->y = v; else c->x = v; }
__device__ inline void dspk_firc_set(dspk_firc *c, int part, dspk_c64 v) { (void)part; c->x = v.x; c->y = v.y; }
__device__ inline void dspk_firc_set(dspk_firc *c, int part, dspk_c128 v) { (void)part; c->x = v.x; c->y = v.y; }
__device__ inline void dspk_firc_get(float *p, int part, dspk_firc c) { *p = part ? c.y : c.x; }
__device__ inline void dspk_firc_get(double *p, int part, dspk_firc c) { *p = part ? c.y : c.x; }
__device__ inline void dspk_firc_get(dspk_c64 *p, int part, dspk_firc c) { (void)part; p->x = c.x; p->y = c.y; }
__device__ inline void dspk_firc_get(dspk_c128 *p, int part, dspk_firc c) { (void)part; p->x = c.x; p->y = c.y; }

/* a / b, in 32 bits when both fit (64-bit division is slow on GPUs). */
__device__ inline dspk_i64 dspk_fir_div(dspk_i64 a, dspk_i64 b) {
  return (a < 4294967296LL && b < 4294967296LL) ? (dspk_i64)((unsigned)a / (unsigned)b) : a / b;
}

/* hp[0..L) = scale * h zero-padded (complex). */
extern "C" __global__ void dspk_fir_hpad(const DSPK_T *h, dspk_firc *hp, int k, dspk_i64 L, DSPK_R scale) {
  DSPK_LOOP(i, L) {
    dspk_firc v;
    v.x = 0;
    v.y = 0;
    if (i < k) {
      dspk_firc_set(&v, 0, h[i]);
      v.x *= scale;
      v.y *= scale;
    }
    hp[i] = v;
  }
}

/* The blocks: b[c*L + j] for the nc = total/L complex blocks; nblk real or
 * complex blocks in all, nb per row of n samples. */
extern "C" __global__ void dspk_fir_gather(const DSPK_T *x, dspk_firc *b, dspk_i64 n, int k,
                                           dspk_i64 S, int lg, dspk_i64 nb, dspk_i64 nblk,
                                           dspk_i64 total) {
  const int parts = DSPK_COMPLEX ? 1 : 2;
  DSPK_LOOP(i, total) {
    dspk_i64 c = i >> lg, j = i & (((dspk_i64)1 << lg) - 1);
    dspk_firc v;
    v.x = 0;
    v.y = 0;
    for (int p = 0; p < parts; p++) {
      dspk_i64 g = c * parts + p;
      if (g >= nblk)
        break;
      dspk_i64 row = dspk_fir_div(g, nb), t = (g - row * nb) * S + j - (k - 1);
      if (t >= 0 && t < n)
        dspk_firc_set(&v, p, x[row * n + t]);
    }
    b[i] = v;
  }
}

/* b[i] *= hs[i mod L]. */
extern "C" __global__ void dspk_fir_cmul(dspk_firc *b, const dspk_firc *hs, int lg, dspk_i64 total) {
  dspk_i64 mask = ((dspk_i64)1 << lg) - 1;
  DSPK_LOOP(i, total) {
    dspk_firc a = b[i], h = hs[i & mask], r;
    r.x = a.x * h.x - a.y * h.y;
    r.y = a.x * h.y + a.y * h.x;
    b[i] = r;
  }
}

/* y from the filtered blocks: complex signals one output per item (total =
 * rows*n); real ones one complex value per item (total = nc*S), which
 * holds an output of block 2c (real part) and one of block 2c+1
 * (imaginary part), so each value is read once. */
extern "C" __global__ void dspk_fir_scatter(const dspk_firc *b, DSPK_T *y, dspk_i64 n, int k,
                                            dspk_i64 S, int lg, dspk_i64 nb, dspk_i64 nblk,
                                            dspk_i64 total) {
  DSPK_LOOP(i, total) {
#if DSPK_COMPLEX
    dspk_i64 row = dspk_fir_div(i, n), t = i - row * n;
    dspk_i64 blk = dspk_fir_div(t, S), j = t - blk * S;
    dspk_firc_get(&y[i], 0, b[((row * nb + blk) << lg) + (k - 1) + j]);
    (void)nblk;
#else
    dspk_i64 c = dspk_fir_div(i, S), j = i - c * S;
    dspk_firc v = b[(c << lg) + (k - 1) + j];
    for (int p = 0; p < 2; p++) {
      dspk_i64 g = 2 * c + p;
      if (g >= nblk)
        break;
      dspk_i64 row = dspk_fir_div(g, nb), t = (g - row * nb) * S + j;
      if (t < n)
        dspk_firc_get(&y[row * n + t], p, v);
    }
#endif
  }
}
