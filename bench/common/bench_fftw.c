/* The in-process FFTW reference on the daemon's plan (bench_fftw.h). */
#include "bench/common/bench_fftw.h"

#include <stdio.h>
#include <stdlib.h>

#include "backends/cpu/fftw_wisdom.h"
#include "cache/cache.h"

fftwf_plan dspk_bench_fftwf_daemon_plan(const char *prog, const char *cache, int n,
                                        fftwf_complex *X, fftwf_complex *Y) {
  struct dspk__cache *wc = NULL;
  if (dspk__cache_open(cache, NULL, &wc, NULL, 0) == 0) {
    fprintf(stderr, "%s: the daemon's FFTW wisdom: %d precision(s)\n", prog,
            dspk__fftw_wisdom_load(wc));
    dspk__cache_close(wc);
  }
  fftwf_plan p = fftwf_plan_dft_1d(n, X, Y, FFTW_FORWARD, FFTW_MEASURE | FFTW_WISDOM_ONLY);
  if (!p) {
    fprintf(stderr, "%s: no daemon wisdom for fft of %d points: measuring here\n", prog, n);
    p = fftwf_plan_dft_1d(n, X, Y, FFTW_FORWARD, FFTW_MEASURE);
  }
  if (!p) {
    fprintf(stderr, "%s: FFTW made no plan for %d points\n", prog, n);
    exit(1);
  }
  return p;
}
