/*
 * Elementwise maps (op "map"): out = f(a[, b]).  One entry per function,
 * grid-stride loops, in-place allowed (no __restrict__).  abs writes the
 * real type DSPK_R.
 */
extern "C" __global__ void dspk_map_add(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_add(dspk_acc(a[i]), dspk_acc(b[i])));
}
extern "C" __global__ void dspk_map_sub(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_sub(dspk_acc(a[i]), dspk_acc(b[i])));
}
extern "C" __global__ void dspk_map_mul(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_mul(dspk_acc(a[i]), dspk_acc(b[i])));
}
extern "C" __global__ void dspk_map_scale(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_scale(dspk_acc(a[i]), alpha));
}
extern "C" __global__ void dspk_map_axpy(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_add(dspk_scale(dspk_acc(a[i]), alpha), dspk_acc(b[i])));
}
extern "C" __global__ void dspk_map_abs(const DSPK_T *a, const DSPK_T *b, DSPK_R *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_abs(dspk_acc(a[i])));
}
extern "C" __global__ void dspk_map_exp(const DSPK_T *a, const DSPK_T *b, DSPK_T *o, dspk_i64 n, double alpha) {
  DSPK_LOOP(i, n) dspk_store(&o[i], dspk_exp(dspk_acc(a[i])));
}
