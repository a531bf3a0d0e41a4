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
 * does not: its NaN and -0 rules). */
double dspk__cpu_absmax(const void *v, int64_t n, int dbl) {
  if (dbl) {
    const unsigned char *p = v;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t u;
      memcpy(&u, p + 8 * i, 8);
      u &= INT64_MAX;
      m = u > m ? u : m;
    }
    double d;
    memcpy(&d, &m, 8);
    return d;
  }
  const unsigned char *p = v;
  int32_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t u;
    memcpy(&u, p + 4 * i, 4);
    u &= INT32_MAX;
    m = u > m ? u : m;
  }
  float f;
  memcpy(&f, &m, 4);
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
