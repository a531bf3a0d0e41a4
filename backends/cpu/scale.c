/*
 * Power-of-two scaling of the data FFTW transforms (fft.c, fir.c's FFT
 * path): data whose largest magnitude lies outside [2^-E, 2^E], E being
 * DSPK__CPU_SCALE_EXP, go through the transforms multiplied by an exact
 * power of two that puts that magnitude in [1/2, 1), and the results are
 * multiplied back after.  Below the range, the transforms' intermediates
 * would fall among the subnormals and lose their low bits to gradual
 * underflow, an absolute error of tens to hundreds of units of the smallest
 * subnormal that grows with the length (the 1/L of fir's inverse alone
 * takes log2(L) of them); above it, intermediates within a few times of the
 * dtype's largest value would overflow although the result is in range.
 * Inside the range nothing is scaled, so ordinary data pay only the scan
 * for their largest magnitude (dspk__cpu_absmax, a vectorised pass over
 * the data, small next to a transform's log2(n) of them).
 */
#include <math.h>
#include <string.h>

/* GCC's -O2 vectorises only loops whose trip count needs no epilogue: ask
 * for the dynamic cost model, so the scan's loops vectorise (as fir.c). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

#include "backends/cpu/cpu.h"

int dspk__cpu_scale_exp(double m, int dbl) {
  int e;
  if (!(m > 0) || !isfinite(m) ||
      (m >= ldexp(1.0, -DSPK__CPU_SCALE_EXP(dbl)) && m <= ldexp(1.0, DSPK__CPU_SCALE_EXP(dbl))))
    return 0;
  frexp(m, &e);
  return -e;
}

/* The magnitudes are compared as the integers of their bits without the
 * sign bit (the order of non-negative IEEE values, NaN above inf), so the
 * loop is an integer max, which vectorises without -ffast-math (a float max
 * does not: its NaN and -0 rules), in SCAN_LANES accumulators so that it is
 * not bound by the latency of one.  On x86-64 it is built for AVX2 and for
 * the baseline (SSE2), the loader picking one by the CPU (as reduce.c's
 * sums): 2^21 f32 (a c64 batch of 1024 rows of 1024) took 0.15 ms with
 * AVX2 on the development VM, 0.45 ms with SSE2 (0.9 ms with SSE2 and one
 * accumulator), against 1.5 ms for the transform. */
#define SCAN_LANES 8
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SCAN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SCAN_CLONES
#endif

#define DEFINE_MAX_BITS(NAME, T, MASK)                                         \
  SCAN_CLONES static T NAME(const unsigned char *p, int64_t n) {               \
    T m[SCAN_LANES] = {0}, r = 0;                                              \
    int64_t i = 0;                                                             \
    for (; i + SCAN_LANES <= n; i += SCAN_LANES)                               \
      for (int k = 0; k < SCAN_LANES; k++) {                                   \
        T u;                                                                   \
        memcpy(&u, p + sizeof(T) * (size_t)(i + k), sizeof u);                 \
        u &= MASK;                                                             \
        m[k] = u > m[k] ? u : m[k];                                            \
      }                                                                        \
    for (; i < n; i++) {                                                       \
      T u;                                                                     \
      memcpy(&u, p + sizeof(T) * (size_t)i, sizeof u);                         \
      u &= MASK;                                                               \
      r = u > r ? u : r;                                                       \
    }                                                                          \
    for (int k = 0; k < SCAN_LANES; k++)                                       \
      r = m[k] > r ? m[k] : r;                                                 \
    return r;                                                                  \
  }

DEFINE_MAX_BITS(max_bits32, int32_t, INT32_MAX)
DEFINE_MAX_BITS(max_bits64, int64_t, INT64_MAX)

double dspk__cpu_absmax(const void *v, int64_t n, int dbl) {
  if (dbl) {
    int64_t m = max_bits64(v, n);
    double d;
    memcpy(&d, &m, sizeof d);
    return d;
  }
  int32_t m = max_bits32(v, n);
  float f;
  memcpy(&f, &m, sizeof f);
  return f;
}

void dspk__cpu_scale2(void *v, int64_t n, int dbl, int e) {
  if (dbl) {
    double *d = v;
    for (int64_t i = 0; i < n; i++)
      d[i] = ldexp(d[i], e);
  } else {
    float *f = v;
    for (int64_t i = 0; i < n; i++)
      f[i] = ldexpf(f[i], e);
  }
}
