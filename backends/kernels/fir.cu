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
