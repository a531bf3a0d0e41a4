/*
 * The in-process FFTW reference of the cpu benchmarks, on the daemon's own
 * plan: the wisdom dspkd stored in its cache file is imported here, so both
 * sides run the same algorithm (FFTW_MEASURE picks among near-equal plans
 * differently from run to run).
 */
#ifndef DSPK_BENCH_FFTW_H
#define DSPK_BENCH_FFTW_H

#include <fftw3.h>

/* A forward c64 plan of n points from X to Y, made from the wisdom in the
 * cache file CACHE (FFTW_MEASURE | FFTW_WISDOM_ONLY); when the cache has
 * none for it, measured here (FFTW_MEASURE, said on stderr), which
 * overwrites X and Y.  Exits 1 when FFTW makes no plan. */
fftwf_plan dspk_bench_fftwf_daemon_plan(const char *prog, const char *cache, int n,
                                        fftwf_complex *X, fftwf_complex *Y);

#endif /* DSPK_BENCH_FFTW_H */
