/*
 * What the client-side benchmarks (bench_core, bench_shm, bench_datapath)
 * share (header only): a monotonic clock in µs, aligned buffers (2 MiB pages
 * for large ones), reproducible f32 data, and a task timed through
 * libdspkclient.
 */
#ifndef DSPK_BENCH_COMMON_BENCH_TASK_H
#define DSPK_BENCH_COMMON_BENCH_TASK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench/common/bench_util.h"
#include "dspk/dspk.h"

static inline double dspk_bench_now_us(void) { return dspk_bench_now_ms() * 1e3; }

/* n bytes, 64-byte aligned; from 4 MiB on, 2 MiB-aligned and advised to get
 * 2 MiB pages, as numpy does for its arrays (the in-process references then
 * run on the best memory a process gets where transparent huge pages are
 * "madvise"); "PROG: malloc failed" and exit 1 when there is no memory. */
static inline void *dspk_bench_alloc(const char *prog, size_t n) {
  size_t align = n >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
  size_t len = (n + align - 1) / align * align;
  void *p = aligned_alloc(align, len);
  if (!p) {
    fprintf(stderr, "%s: malloc: %s\n", prog, dspk_strerror(DSPK_ENOMEM));
    exit(1);
  }
  if (align > 64)
    (void)madvise(p, len, MADV_HUGEPAGE);
  return p;
}

/* n floats in [-0.5, 0.5) from seed (a linear congruential sequence). */
static inline void dspk_bench_fill(float *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
}

/* Runs t through c and returns the time dspk_run took in µs, adding the
 * daemon's own time for it (time_us) to *daemon_us when that is not NULL;
 * a failing task prints "PROG: task: ERROR: DETAIL" and exits 1. */
static inline double dspk_bench_run_us(const char *prog, dspk_client *c, dspk_task *t,
                                       double *daemon_us) {
  dspk_result r;
  double t0 = dspk_bench_now_us();
  int err = dspk_run(c, t, &r);
  double dt = dspk_bench_now_us() - t0;
  if (err < 0) {
    fprintf(stderr, "%s: task: %s: %s\n", prog, dspk_strerror(err), dspk_last_error(c));
    exit(1);
  }
  if (daemon_us)
    *daemon_us += (double)r.time_us;
  dspk_result_free(&r);
  return dt;
}

static inline double dspk_bench_run(const char *prog, dspk_client *c, dspk_task *t) {
  return dspk_bench_run_us(prog, c, t, NULL);
}

#endif /* DSPK_BENCH_COMMON_BENCH_TASK_H */
