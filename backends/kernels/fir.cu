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
 * The FFT (overlap-save) path of fir (backends/gpurt/fir_fft.c) for
 * complex signals: the signal is cut into blocks of L = 2^lg samples that
 * overlap by k-1, each block is transformed (cuFFT, complex, in place),
 * multiplied by the transform of the zero-padded filter and transformed
 * back; the last L-k+1 samples of each block are outputs.  Block g of a
 * row starts at sample g*S - (k-1), S = L-k+1 (samples before 0 or after n
 * read as zero).  Real signals take the R2C path below.
 */
struct dspk_firc { DSPK_R x, y; }; /* the layout of cufftComplex / cufftDoubleComplex */

/* a / b, in 32 bits when both fit (64-bit division is slow on GPUs). */
__device__ inline dspk_i64 dspk_fir_div(dspk_i64 a, dspk_i64 b) {
  return (a < 4294967296LL && b < 4294967296LL) ? (dspk_i64)((unsigned)a / (unsigned)b) : a / b;
}

#if DSPK_COMPLEX
/* The blocks: b[g*L + j] for the nblk blocks (nb a row), then in block
 * nblk the filter zero-padded and scaled, so that one batched transform
 * makes the filter's spectrum too (total = (nblk+1)*L). */
extern "C" __global__ void dspk_fir_gather(const DSPK_T *x, const DSPK_T *h, dspk_firc *b,
                                           dspk_i64 n, int k, dspk_i64 S, int lg, dspk_i64 nb,
                                           dspk_i64 nblk, DSPK_R scale, dspk_i64 total) {
  DSPK_LOOP(i, total) {
    dspk_i64 g = i >> lg, j = i & (((dspk_i64)1 << lg) - 1);
    dspk_firc v;
    v.x = 0;
    v.y = 0;
    if (g >= nblk) {
      if (j < k) {
        v.x = h[j].x * scale;
        v.y = h[j].y * scale;
      }
    } else {
      dspk_i64 row = g < nb ? 0 : dspk_fir_div(g, nb), t = (g - row * nb) * S + j - (k - 1);
      if (t >= 0 && t < n) {
        v.x = x[row * n + t].x;
        v.y = x[row * n + t].y;
      }
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

/* y (total = rows*n samples) from the filtered blocks. */
extern "C" __global__ void dspk_fir_scatter(const dspk_firc *b, DSPK_T *y, dspk_i64 n, int k,
                                            dspk_i64 S, int lg, dspk_i64 nb, dspk_i64 total) {
  DSPK_LOOP(i, total) {
    dspk_i64 row = i < n ? 0 : dspk_fir_div(i, n), t = i - row * n;
    dspk_i64 blk = dspk_fir_div(t, S), j = t - blk * S;
    dspk_firc v = b[((row * nb + blk) << lg) + (k - 1) + j];
    y[i].x = v.x;
    y[i].y = v.y;
  }
}
#endif

#if !DSPK_COMPLEX
/*
 * The real path of the FFT fir (f32, f64): the blocks are real rows of L
 * samples (block g of a row starts at sample g*S - (k-1), as above), one
 * batched R2C transform makes their half spectra (L/2+1 values a row), a
 * multiplication by the filter's half spectrum, one batched C2R transform
 * back into the real rows, and the last S samples of each row are outputs.
 * The filter's half spectrum comes from the same transform: the gather
 * writes the filter, zero-padded and scaled, as block nblk.
 */
/* b[g*L + j] for the nblk blocks (nb a row), then the filter as block
 * nblk (total = (nblk+1)*L samples). */
extern "C" __global__ void dspk_fir_rgather(const DSPK_T *x, const DSPK_T *h, DSPK_T *b,
                                            dspk_i64 n, int k, dspk_i64 S, int lg, dspk_i64 nb,
                                            dspk_i64 nblk, DSPK_R scale, dspk_i64 total) {
  DSPK_LOOP(i, total) {
    dspk_i64 g = i >> lg, j = i & (((dspk_i64)1 << lg) - 1);
    if (g >= nblk) {
      b[i] = j < k ? h[j] * scale : (DSPK_T)0;
    } else {
      dspk_i64 row = g < nb ? 0 : dspk_fir_div(g, nb), t = (g - row * nb) * S + j - (k - 1);
      b[i] = t >= 0 && t < n ? x[row * n + t] : (DSPK_T)0;
    }
  }
}

/* f[i] *= hs[i mod m2] over the total = nblk*m2 values of the half spectra. */
extern "C" __global__ void dspk_fir_rcmul(dspk_firc *f, const dspk_firc *hs, dspk_i64 m2, dspk_i64 total) {
  DSPK_LOOP(i, total) {
    dspk_firc a = f[i], h = hs[i - dspk_fir_div(i, m2) * m2], r;
    r.x = a.x * h.x - a.y * h.y;
    r.y = a.x * h.y + a.y * h.x;
    f[i] = r;
  }
}

/* y (total = rows*n samples) from the filtered blocks. */
extern "C" __global__ void dspk_fir_rscatter(const DSPK_T *b, DSPK_T *y, dspk_i64 n, int k,
                                             dspk_i64 S, int lg, dspk_i64 nb, dspk_i64 total) {
  DSPK_LOOP(i, total) {
    dspk_i64 row = i < n ? 0 : dspk_fir_div(i, n), t = i - row * n;
    dspk_i64 blk = dspk_fir_div(t, S), j = t - blk * S;
    y[i] = b[((row * nb + blk) << lg) + (k - 1) + j];
  }
}
#endif
