/*
 * Our own gemm (the GPU runtimes' fallback when no BLAS library is present
 * at run time, and their path for small products), in BLAS's column-major
 * terms: C[b] (m x n, leading dimension ldc) = alpha * op(X[b]) op(Y[b]) +
 * beta * C[b], op transposing when tx/ty is set; batch strides in elements.
 * Accumulated in the accumulator type; C is not read when beta is 0 (it may
 * hold NaN).
 *
 * Each block makes 32x32 tiles of C (a grid-stride loop over the tiles of
 * every batch entry).  Its threads form DSPK_GS groups of 64; each group
 * takes one slice of k, staging 8 columns of op(X) and 8 rows of op(Y) at a
 * time in shared memory, and each thread accumulates a 4x4 patch; the
 * groups then add their patches through shared memory.  Splitting k inside
 * the block keeps one launch and no workspace while giving a small product
 * the parallelism of a split-k one: on the H200 the products of the small
 * eviction trace (64..456 x 256 x 256, f32) take 10.4 us each on the
 * device on average (cuBLAS: 8.4 us), for one launch of host work (3.8-4.9
 * us there) against cuBLAS's 12-17 us (two launches).  The runtimes take it for small
 * products (docs/backends.md).  Launch with DSPK_GEMM_THREADS threads.
 */
#define DSPK_GT 32 /* tile edge */
#define DSPK_GK 8  /* k step */
#define DSPK_GP 4  /* patch edge per thread */
#define DSPK_GD (DSPK_GT / DSPK_GP) /* threads per tile edge in a group: 8 */
#define DSPK_GN (DSPK_GD * DSPK_GD) /* threads per group: 64 */
#define DSPK_GS (sizeof(DSPK_ACC) > 8 ? 4 : 8) /* groups (shared memory: 34 KiB) */
/* 512 threads (real) or 256 (complex): the launch bound keeps registers
 * within what 512 threads of one block may hold. */
extern "C" __global__ void __launch_bounds__(DSPK_COMPLEX ? 256 : 512) dspk_gemm_tile(const DSPK_T *X, const DSPK_T *Y, DSPK_T *C,
                                          dspk_i64 m, dspk_i64 n, dspk_i64 k, dspk_i64 ldx,
                                          dspk_i64 ldy, dspk_i64 ldc, dspk_i64 sx,
                                          dspk_i64 sy, dspk_i64 sc, dspk_i64 batch, int tx,
                                          int ty, double alpha, double beta) {
  __shared__ DSPK_ACC xs[DSPK_GS][DSPK_GK][DSPK_GT + 1]; /* xs[g][l][i] = op(X)[i][l] */
  __shared__ DSPK_ACC ys[DSPK_GS][DSPK_GK][DSPK_GT + 1]; /* ys[g][l][j] = op(Y)[l][j] */
  DSPK_ACC *red = &xs[0][0][0]; /* the groups' patches, after the products */
  const int g = (int)threadIdx.x / DSPK_GN, t = (int)threadIdx.x % DSPK_GN;
  const int ti = t % DSPK_GD, tj = t / DSPK_GD;
  const dspk_i64 tm = (m + DSPK_GT - 1) / DSPK_GT, tn = (n + DSPK_GT - 1) / DSPK_GT;
  /* Group g's slice of k: [ks, ke), a whole number of steps long. */
  const dspk_i64 kc = ((k + DSPK_GS - 1) / DSPK_GS + DSPK_GK - 1) / DSPK_GK * DSPK_GK;
  const dspk_i64 ks = g * kc, ke = ks + kc < k ? ks + kc : k;
  for (dspk_i64 tile = blockIdx.x; tile < tm * tn * batch; tile += gridDim.x) {
    const dspk_i64 b = tile / (tm * tn), r = tile % (tm * tn);
    const dspk_i64 i0 = (r % tm) * DSPK_GT, j0 = (r / tm) * DSPK_GT;
    const DSPK_T *x = X + b * sx, *y = Y + b * sy;
    DSPK_ACC acc[DSPK_GP][DSPK_GP];
    for (int p = 0; p < DSPK_GP; p++)
      for (int q = 0; q < DSPK_GP; q++)
        dspk_zero(&acc[p][q]);
    for (dspk_i64 l0 = ks; l0 < ks + kc; l0 += DSPK_GK) {
      /* Consecutive threads read consecutive addresses when the operand
       * is not transposed. */
      for (int e = t; e < DSPK_GT * DSPK_GK; e += DSPK_GN) {
        const int ii = tx ? e / DSPK_GK : e % DSPK_GT, ll = tx ? e % DSPK_GK : e / DSPK_GT;
        const dspk_i64 i = i0 + ii, l = l0 + ll;
        DSPK_ACC v;
        dspk_zero(&v);
        if (i < m && l < ke)
          v = dspk_acc(tx ? x[l + i * ldx] : x[i + l * ldx]);
        xs[g][ll][ii] = v;
      }
      for (int e = t; e < DSPK_GT * DSPK_GK; e += DSPK_GN) {
        const int ll = ty ? e / DSPK_GT : e % DSPK_GK, jj = ty ? e % DSPK_GT : e / DSPK_GK;
        const dspk_i64 j = j0 + jj, l = l0 + ll;
        DSPK_ACC v;
        dspk_zero(&v);
        if (j < n && l < ke)
          v = dspk_acc(ty ? y[j + l * ldy] : y[l + j * ldy]);
        ys[g][ll][jj] = v;
      }
      __syncthreads();
      for (int ll = 0; ll < DSPK_GK; ll++) {
        DSPK_ACC a[DSPK_GP], bv[DSPK_GP];
        for (int p = 0; p < DSPK_GP; p++) {
          a[p] = xs[g][ll][ti + DSPK_GD * p];
          bv[p] = ys[g][ll][tj + DSPK_GD * p];
        }
        for (int p = 0; p < DSPK_GP; p++)
          for (int q = 0; q < DSPK_GP; q++)
            acc[p][q] = dspk_add(acc[p][q], dspk_mul(a[p], bv[q]));
      }
      __syncthreads();
    }
    for (int o = 1; o < (int)DSPK_GS; o++) {
      if (g == o)
        for (int p = 0; p < DSPK_GP; p++)
          for (int q = 0; q < DSPK_GP; q++)
            red[(p * DSPK_GP + q) * DSPK_GN + t] = acc[p][q];
      __syncthreads();
      if (g == 0)
        for (int p = 0; p < DSPK_GP; p++)
          for (int q = 0; q < DSPK_GP; q++)
            acc[p][q] = dspk_add(acc[p][q], red[(p * DSPK_GP + q) * DSPK_GN + t]);
      __syncthreads();
    }
    if (g == 0)
      for (int p = 0; p < DSPK_GP; p++)
        for (int q = 0; q < DSPK_GP; q++) {
          const dspk_i64 i = i0 + ti + DSPK_GD * p, j = j0 + tj + DSPK_GD * q;
          if (i < m && j < n) {
            DSPK_T *c = &C[b * sc + i + j * ldc];
            DSPK_ACC v = dspk_scale(acc[p][q], alpha);
            if (beta != 0.0)
              v = dspk_add(v, dspk_scale(dspk_acc(*c), beta));
            dspk_store(c, v);
          }
        }
  }
}
