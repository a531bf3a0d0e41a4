/*
 * Small helpers the benchmark programs share (header only): a monotonic
 * clock in ms, a comparison for qsort of doubles, the median of 3
 * samples, and a check that ends the program on an error code.
 */
#ifndef DSPK_BENCH_COMMON_BENCH_UTIL_H
#define DSPK_BENCH_COMMON_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double dspk_bench_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline int dspk_bench_cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double dspk_bench_median3(const double *v) {
  double a = v[0], b = v[1], c = v[2];
  if ((a <= b && b <= c) || (c <= b && b <= a))
    return b;
  if ((b <= a && a <= c) || (c <= a && a <= b))
    return a;
  return c;
}

/* Prints "who: what failed (rc)" and exits 1. */
static inline void dspk_bench_die(const char *who, const char *what, long rc) {
  fprintf(stderr, "%s: %s failed (%ld)\n", who, what, rc);
  exit(1);
}
/* Evaluates x; a non-zero result ends the program through dspk_bench_die. */
#define DSPK_BENCH_CK(who, x)                                                                      \
  do {                                                                                             \
    long r_ = (long)(x);                                                                           \
    if (r_)                                                                                        \
      dspk_bench_die(who, #x, r_);                                                                 \
  } while (0)

#endif
