/*
 * Permuted copy (contract, gemm's C broadcast): out is contiguous in C order
 * with d.shape; element i of out comes from in[sum(idx_k * d.stride[k])],
 * where a stride of 0 broadcasts.  One entry per element size; the data is
 * moved, never interpreted, so no dtype block is needed.
 */
struct dspk_pdesc {
  int rank;
  dspk_i64 shape[DSPK_MAXRANK], stride[DSPK_MAXRANK];
  dspk_i64 n;
};
struct dspk_b16 { unsigned long long a, b; };

__device__ inline dspk_i64 dspk_poffset(dspk_i64 i, const dspk_pdesc &d) {
  dspk_i64 off = 0;
  for (int k = d.rank - 1; k >= 0; k--) {
    off += (i % d.shape[k]) * d.stride[k];
    i /= d.shape[k];
  }
  return off;
}

extern "C" __global__ void dspk_permute_2(const unsigned short *in, unsigned short *out, dspk_pdesc d) {
  DSPK_LOOP(i, d.n) out[i] = in[dspk_poffset(i, d)];
}
extern "C" __global__ void dspk_permute_4(const unsigned int *in, unsigned int *out, dspk_pdesc d) {
  DSPK_LOOP(i, d.n) out[i] = in[dspk_poffset(i, d)];
}
extern "C" __global__ void dspk_permute_8(const unsigned long long *in, unsigned long long *out, dspk_pdesc d) {
  DSPK_LOOP(i, d.n) out[i] = in[dspk_poffset(i, d)];
}
extern "C" __global__ void dspk_permute_16(const dspk_b16 *in, dspk_b16 *out, dspk_pdesc d) {
  DSPK_LOOP(i, d.n) out[i] = in[dspk_poffset(i, d)];
}
