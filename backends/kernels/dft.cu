/*
 * Direct discrete Fourier transform along the last axis (the GPU runtimes'
 * fallback when no FFT library is present at run time): out[b][k] =
 * sum_j x[b][j] exp(sign 2 pi i j k / n) for k < nout, one output element
 * per thread, O(n) work each.  Real input (DSPK_COMPLEX 0) gives the first
 * n/2+1 bins (rfft); output is complex of DSPK_R's precision.  Angles are
 * reduced exactly ((j k) mod n) and evaluated in double.
 */
__device__ inline dspk_c128 dspk_toc(double a) { dspk_c128 r; r.x = a; r.y = 0.0; return r; }
__device__ inline dspk_c128 dspk_toc(dspk_c128 a) { return a; }

extern "C" __global__ void dspk_dft(const DSPK_T *x, void *out, dspk_i64 n, dspk_i64 nout,
                                    dspk_i64 batch, double sign) {
  const double two_pi = 6.283185307179586476925286766559;
  DSPK_LOOP(idx, nout * batch) {
    dspk_i64 k = idx % nout, b = idx / nout;
    const DSPK_T *row = x + b * n;
    dspk_c128 acc;
    dspk_zero(&acc);
    for (dspk_i64 j = 0; j < n; j++) {
      double a = sign * two_pi * (double)((j * k) % n) / (double)n;
      dspk_c128 w;
      w.x = cos(a);
      w.y = sin(a);
      acc = dspk_add(acc, dspk_mul(dspk_toc(dspk_acc(row[j])), w));
    }
    if (sizeof(DSPK_R) == 4)
      dspk_store((dspk_c64 *)out + idx, acc);
    else
      dspk_store((dspk_c128 *)out + idx, acc);
  }
}
