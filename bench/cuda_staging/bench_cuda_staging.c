/*
 * bench_cuda_staging: what the CUDA backend's pinned staging ring
 * (backends/cuda/cuda.c) gains over copies from pageable memory, through
 * the backend table exactly as a dspkd runner calls it.
 *
 *   1. write() and read() throughput for sizes from 64 KiB to 256 MiB, with
 *      the default ring (16 x 2 MiB), other ring shapes, and staging off;
 *      a write is timed up to a sync() (its DMA done), a read as it returns.
 *   2. The runner's path of one task "gemm 1024x1024 f32" with inline
 *      operands (what dspk-submit's first result pays in the daemon):
 *      alloc A, B, C from the pool, write A and B, run, read C, free; wall
 *      time per task, staging on vs off.
 *
 * Host buffers are touched before timing (no page faults in the numbers).
 * Prints markdown; medians over repetitions.  Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"
#include "bench/common/bench_util.h"

static const struct dspk__backend *GPU = &dspk__backend_cuda;
static struct dspk__dev *dev;

#define CK(x) DSPK_BENCH_CK("bench_cuda_staging", x)

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), dspk_bench_cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct ring { const char *name; int n; size_t chunk; };

/* Median ms of one write (to completion) and one read of n bytes. */
static void copy_times(size_t n, double *w_ms, double *r_ms) {
  enum { REPS = 9 };
  double w[REPS], r[REPS];
  struct dspk__mem *m;
  unsigned char *h = malloc(n);
  if (!h)
    dspk_bench_die("bench_cuda_staging", "malloc", 1);
  memset(h, 1, n);
  CK(GPU->alloc(dev, n, &m));
  CK(GPU->write(dev, m, 0, h, n)); /* warm-up */
  CK(GPU->sync(dev));
  CK(GPU->read(dev, m, 0, h, n));
  for (int i = 0; i < REPS; i++) {
    double t0 = dspk_bench_now_ms();
    CK(GPU->write(dev, m, 0, h, n));
    CK(GPU->sync(dev));
    double t1 = dspk_bench_now_ms();
    CK(GPU->read(dev, m, 0, h, n));
    w[i] = t1 - t0;
    r[i] = dspk_bench_now_ms() - t1;
  }
  GPU->free(dev, m);
  free(h);
  *w_ms = median(w, REPS);
  *r_ms = median(r, REPS);
}

static double gemm_task_ms(void) {
  enum { N = 1024, REPS = 21 };
  size_t bytes = (size_t)N * N * 4;
  float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
  double t[REPS];
  char err[256];
  atomic_int cancel = 0;
  struct dspk__opctx ctx = {&cancel, NULL, NULL, err, sizeof(err), 0};
  if (!a || !b || !c)
    dspk_bench_die("bench_cuda_staging", "malloc", 1);
  for (size_t i = 0; i < (size_t)N * N; i++) {
    a[i] = (float)(i % 17) * 0.25f;
    b[i] = (float)(i % 13) * 0.5f;
  }
  memset(c, 0, bytes);
  for (int it = -2; it < REPS; it++) {
    struct dspk__op op;
    struct dspk__mem *ma, *mb, *mc;
    char msg[256];
    double t0 = dspk_bench_now_ms();
    memset(&op, 0, sizeof(op));
    op.kind = DSPK_OP_GEMM;
    op.nin = 2;
    op.u.gemm.alpha = 1.0;
    for (int k = 0; k < 2; k++) {
      op.in[k].dtype = DSPK_F32;
      op.in[k].rank = 2;
      op.in[k].shape[0] = op.in[k].shape[1] = N;
    }
    CK(dspk__op_infer(&op, msg, sizeof(msg)));
    CK(GPU->alloc(dev, bytes, &ma));
    CK(GPU->write(dev, ma, 0, a, bytes));
    CK(GPU->alloc(dev, bytes, &mb));
    CK(GPU->write(dev, mb, 0, b, bytes));
    CK(GPU->alloc(dev, bytes, &mc));
    op.in[0].mem = ma;
    op.in[1].mem = mb;
    op.out[0].mem = mc;
    CK(GPU->run(dev, &op, &ctx));
    CK(GPU->read(dev, mc, 0, c, bytes));
    GPU->free(dev, ma);
    GPU->free(dev, mb);
    GPU->free(dev, mc);
    if (it >= 0)
      t[it] = dspk_bench_now_ms() - t0;
  }
  /* c[0] = sum_k a[k] b[k*N]: a check that the gemm ran. */
  {
    double ref = 0;
    for (int k = 0; k < N; k++)
      ref += (double)a[k] * b[(size_t)k * N];
    if (c[0] < ref * 0.999 || c[0] > ref * 1.001)
      dspk_bench_die("bench_cuda_staging", "gemm result check", 1);
  }
  free(a);
  free(b);
  free(c);
  return median(t, REPS);
}

int main(void) {
  static const size_t sizes[] = {64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
  static const struct ring rings[] = {
      {"16 x 2 MiB (default)", 16, (size_t)2 << 20},
      {"4 x 8 MiB", 4, (size_t)8 << 20},
      {"32 x 1 MiB", 32, (size_t)1 << 20},
      {"off (pageable)", 0, 0},
  };
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  char why[256];
  if (GPU->probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why)) <= 0) {
    printf("skipped: %s\n", why);
    return 77;
  }
  CK(GPU->open(0, NULL, &dev));
  printf("# CUDA staging on %s (%s)\n\n", info[0].name, info[0].driver);
  printf("| staging | size | write GB/s | read GB/s |\n|---|---|---|---|\n");
  for (size_t r = 0; r < sizeof(rings) / sizeof(rings[0]); r++) {
    CK(dspk__cuda_stage_config(dev, rings[r].n, rings[r].chunk));
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
      double w, rd;
      copy_times(sizes[s], &w, &rd);
      printf("| %s | %zu KiB | %.2f | %.2f |\n", rings[r].name, sizes[s] >> 10,
             sizes[s] / w / 1e6, sizes[s] / rd / 1e6);
    }
  }
  printf("\n| staging | gemm 1024^2 f32 task: alloc, write A B, run, read C (ms) |\n|---|---|\n");
  CK(dspk__cuda_stage_config(dev, 0, 0));
  printf("| off (pageable) | %.3f |\n", gemm_task_ms());
  CK(dspk__cuda_stage_config(dev, 16, (size_t)2 << 20));
  printf("| 16 x 2 MiB (default) | %.3f |\n", gemm_task_ms());
  printf("\nstaging chunks: %llu h2d, %llu d2h, %llu waits for a busy chunk\n",
         (unsigned long long)dev->stage.chunks_h2d, (unsigned long long)dev->stage.chunks_d2h,
         (unsigned long long)dev->stage.waits);
  GPU->close(dev);
  GPU->shutdown();
  return 0;
}
