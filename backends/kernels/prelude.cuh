/*
 * dspk kernel prelude, prepended to every generated kernel source after the
 * dtype block (DSPK_T storage type, DSPK_R real type of the same precision,
 * DSPK_ACC accumulator type, DSPK_COMPLEX 0/1).  Written in the subset of
 * CUDA C++ that both NVRTC and HIP's hiprtc compile: no headers, no
 * CUDA-only intrinsics, extern "C" entry points, plain structs for complex
 * numbers.  Arithmetic happens in the accumulator type (double, or a double
 * complex) and is rounded once on store.
 */
typedef long long dspk_i64;
struct dspk_c64 { float x, y; };
struct dspk_c128 { double x, y; };

__device__ inline double dspk_acc(float a) { return (double)a; }
__device__ inline double dspk_acc(double a) { return a; }
__device__ inline dspk_c128 dspk_acc(dspk_c64 a) {
  dspk_c128 r; r.x = a.x; r.y = a.y; return r;
}
__device__ inline dspk_c128 dspk_acc(dspk_c128 a) { return a; }

__device__ inline void dspk_store(float *p, double v) { *p = (float)v; }
__device__ inline void dspk_store(double *p, double v) { *p = v; }
__device__ inline void dspk_store(dspk_c64 *p, dspk_c128 v) {
  dspk_c64 r; r.x = (float)v.x; r.y = (float)v.y; *p = r;
}
__device__ inline void dspk_store(dspk_c128 *p, dspk_c128 v) { *p = v; }

__device__ inline void dspk_zero(double *a) { *a = 0.0; }
__device__ inline void dspk_zero(dspk_c128 *a) { a->x = 0.0; a->y = 0.0; }

__device__ inline double dspk_add(double a, double b) { return a + b; }
__device__ inline dspk_c128 dspk_add(dspk_c128 a, dspk_c128 b) {
  dspk_c128 r; r.x = a.x + b.x; r.y = a.y + b.y; return r;
}
__device__ inline double dspk_sub(double a, double b) { return a - b; }
__device__ inline dspk_c128 dspk_sub(dspk_c128 a, dspk_c128 b) {
  dspk_c128 r; r.x = a.x - b.x; r.y = a.y - b.y; return r;
}
__device__ inline double dspk_mul(double a, double b) { return a * b; }
__device__ inline dspk_c128 dspk_mul(dspk_c128 a, dspk_c128 b) {
  dspk_c128 r; r.x = a.x * b.x - a.y * b.y; r.y = a.x * b.y + a.y * b.x; return r;
}
__device__ inline double dspk_scale(double a, double s) { return a * s; }
__device__ inline dspk_c128 dspk_scale(dspk_c128 a, double s) {
  dspk_c128 r; r.x = a.x * s; r.y = a.y * s; return r;
}
__device__ inline double dspk_abs(double a) { return fabs(a); }
__device__ inline double dspk_abs(dspk_c128 a) { return hypot(a.x, a.y); }
__device__ inline double dspk_exp(double a) { return exp(a); }
/* exp(x + iy) with C99's special values (Annex G, as C's cexp and numpy's
 * exp): y = +-0 gives exp(x) + iy (so exp(inf+0i) is inf+0i, not inf*0 =
 * nan); an infinite or NaN y gives inf+i nan at x = +inf, 0 + i0 (y's sign)
 * at x = -inf, and nan+i nan otherwise; exp(x) beyond double's range is
 * applied in two halves, so exp(x)*cos(y) stays finite where it is. */
__device__ inline dspk_c128 dspk_exp(dspk_c128 a) {
  double x = a.x, y = a.y;
  dspk_c128 r;
  if (y == 0.0) { r.x = exp(x); r.y = y; return r; }
  if (y - y != 0.0) { /* y infinite or NaN */
    double nan = y - y;
    if (x - x != 0.0 && x == x) { /* x infinite */
      if (x > 0.0) { r.x = x; r.y = nan; }
      else { r.x = 0.0; r.y = copysign(0.0, y); }
    } else {
      r.x = nan; r.y = nan;
    }
    return r;
  }
  double c = cos(y), s = sin(y);
  if (x > 709.0) {
    double h = exp(0.5 * x);
    r.x = (h * c) * h; r.y = (h * s) * h; return r;
  }
  double m = exp(x);
  r.x = m * c; r.y = m * s; return r;
}
/* max/min are only asked of real data; the complex forms compare real parts
 * so every dtype compiles. */
__device__ inline double dspk_max(double a, double b) { return a != a ? a : (b > a || b != b ? b : a); }
__device__ inline dspk_c128 dspk_max(dspk_c128 a, dspk_c128 b) { return b.x > a.x ? b : a; }
__device__ inline double dspk_min(double a, double b) { return a != a ? a : (b < a || b != b ? b : a); }
__device__ inline dspk_c128 dspk_min(dspk_c128 a, dspk_c128 b) { return b.x < a.x ? b : a; }

/* A grid-stride loop over [0, n). */
#define DSPK_LOOP(i, n)                                                        \
  for (dspk_i64 i = (dspk_i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (dspk_i64)blockDim.x * gridDim.x)

#define DSPK_MAXRANK 8
