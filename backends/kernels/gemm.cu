/*
 * Plain gemm (the GPU runtimes' fallback when no BLAS library is present at
 * run time), in BLAS's column-major terms: C[b] (m x n, leading dimension
 * ldc) = alpha * op(X[b]) op(Y[b]) + beta * C[b], op transposing when tx/ty
 * is set; batch strides in elements.  One output element per thread of a
 * grid-stride loop, accumulated in the accumulator type.  C is not read
 * when beta is 0 (it may hold NaN).
 */
extern "C" __global__ void dspk_gemm(const DSPK_T *X, const DSPK_T *Y, DSPK_T *C, dspk_i64 m,
                                     dspk_i64 n, dspk_i64 k, dspk_i64 ldx, dspk_i64 ldy,
                                     dspk_i64 ldc, dspk_i64 sx, dspk_i64 sy, dspk_i64 sc,
                                     dspk_i64 batch, int tx, int ty, double alpha, double beta) {
  DSPK_LOOP(idx, m * n * batch) {
    dspk_i64 i = idx % m, j = (idx / m) % n, b = idx / (m * n);
    const DSPK_T *x = X + b * sx, *y = Y + b * sy;
    DSPK_ACC acc;
    dspk_zero(&acc);
    for (dspk_i64 l = 0; l < k; l++) {
      DSPK_T xv = tx ? x[l + i * ldx] : x[i + l * ldx];
      DSPK_T yv = ty ? y[j + l * ldy] : y[l + j * ldy];
      acc = dspk_add(acc, dspk_mul(dspk_acc(xv), dspk_acc(yv)));
    }
    acc = dspk_scale(acc, alpha);
    if (beta != 0.0)
      acc = dspk_add(acc, dspk_scale(dspk_acc(C[b * sc + i + j * ldc]), beta));
    dspk_store(&C[b * sc + i + j * ldc], acc);
  }
}
