/*
 * bench_shm: shared-memory buffers (protocol.md "Shared memory") side by
 * side with what they replace, in one run, interleaved round by round so
 * machine noise hits every side alike.
 *
 *   1. 256 MiB into and out of a buffer: dspk_buffer_write / read of a
 *      dspk_shared_alloc buffer, against memcpy of the same bytes between
 *      warm buffers; and dspk_buffer_write / read of an ordinary daemon
 *      buffer over the socket, for reference.
 *   2. gemm 2048² f32 on cpu:0 with the operands and the result in client
 *      shared memory (dspk_shared_alloc, zero copies), and with plain malloc
 *      operands (the library copies them once into reused shared
 *      temporaries; the result comes back inline), against cblas_sgemm
 *      in-process on the same data.
 *   3. fft 2^20 c64 the same ways, against FFTW in-process on the
 *      daemon's plan (its measured wisdom, read from its cache file).
 *
 * Usage: bench_shm PATH/TO/dspkd [rounds]
 * Prints markdown tables: median, min and max per side, and the ratio of
 * medians.
 */
#include <fftw3.h> /* before cblas.h: OpenBLAS's cblas.h includes complex.h */
#include <cblas.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench_daemon.h"
#include "bench/common/bench_fftw.h"
#include "bench/common/bench_task.h"
#include "bench/common/bench_util.h"
#include "dspk/dspk.h"

struct stat3 {
  double med, min, max;
};

static struct stat3 stats(double *v, int n) {
  struct stat3 s;
  qsort(v, (size_t)n, sizeof *v, dspk_bench_cmp_d);
  s.med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v[0];
  s.max = v[n - 1];
  return s;
}

static void die(const char *what, dspk_client *c, int err) {
  fprintf(stderr, "bench_shm: %s: %s%s%s\n", what,
          err < 0 ? dspk_strerror(err) : strerror(errno), c ? ": " : "",
          c ? dspk_last_error(c) : "");
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = dspk_bench_alloc("bench_shm", n);
  memset(p, 0, n); /* resident, as a caller's data would be */
  return p;
}

static double run(dspk_client *c, dspk_task *t) { return dspk_bench_run("bench_shm", c, t); }

/* OpenBLAS's threads spin a while after each call; on a small machine that
 * slows the other process's gemm: let them park between sides. */
static void settle(void) {
  struct timespec ts = {0, 300000000};
  nanosleep(&ts, NULL);
}

static void row_bw(const char *what, double *v, int n, size_t bytes, double ref_med) {
  struct stat3 s = stats(v, n);
  printf("| %s | %.1f | %.1f–%.1f | %.2f | %.3f |\n", what, s.med / 1000, s.min / 1000,
         s.max / 1000, bytes / s.med / 1000, ref_med / s.med);
}

static void row_t(const char *what, double *v, int n, double ref_med) {
  struct stat3 s = stats(v, n);
  printf("| %s | %.1f | %.1f–%.1f | %.3f |\n", what, s.med / 1000, s.min / 1000,
         s.max / 1000, ref_med / s.med);
}

static void tensor2(dspk_tensor *t, dspk_dtype dt, int64_t r, int64_t c, const void *p) {
  int64_t shape[2] = {r, c};
  dspk_tensor_inline(t, dt, 2, shape, p);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_shm PATH/TO/dspkd [rounds]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (rounds < 1)
    rounds = 1;
  char dir[] = "/tmp/dspk-bshm-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", NULL, 0);
  char sock[256], cache[256];
  snprintf(sock, sizeof sock, "%s/d.sock", dir);
  snprintf(cache, sizeof cache, "%s/cache.db", dir);
  signal(SIGPIPE, SIG_IGN);
  pid_t dpid = dspk_bench_start_daemon("bench_shm", argv[1], sock, cache);
  dspk_client *c;
  int err = dspk_connect(sock, "bench_shm", &c);
  if (err < 0) {
    fprintf(stderr, "bench_shm: connect: %s\n", dspk_connect_error());
    return 1;
  }

  /* ---- 1. transfers of 256 MiB ---- */
  const size_t big = (size_t)256 << 20;
  char *src = xmalloc(big), *dst = xmalloc(big);
  dspk_bench_fill((float *)src, big / 4, 9);
  void *sh;
  uint64_t shid, plain;
  if ((err = dspk_shared_alloc(c, "cpu:0", big, &sh, &shid)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", big, &plain)) < 0)
    die("transfer buffers", c, err);
  memset(sh, 0, big);
  double *tm = calloc((size_t)rounds, sizeof(double)), *tw = calloc((size_t)rounds, sizeof(double));
  double *tr = calloc((size_t)rounds, sizeof(double)), *tsw = calloc((size_t)rounds, sizeof(double));
  double *tsr = calloc((size_t)rounds, sizeof(double));
  if ((err = dspk_buffer_write(c, plain, 0, src, big)) < 0) /* warm-up */
    die("buffer.write", c, err);
  for (int r = 0; r < rounds; r++) {
    double t0 = dspk_bench_now_us();
    memcpy(dst, src, big);
    tm[r] = dspk_bench_now_us() - t0;
    t0 = dspk_bench_now_us();
    if ((err = dspk_buffer_write(c, shid, 0, src, big)) < 0)
      die("shared write", c, err);
    tw[r] = dspk_bench_now_us() - t0;
    t0 = dspk_bench_now_us();
    if ((err = dspk_buffer_read(c, shid, 0, dst, big)) < 0)
      die("shared read", c, err);
    tr[r] = dspk_bench_now_us() - t0;
    if (memcmp(dst, src, 4096) != 0)
      die("shared read: wrong bytes", NULL, DSPK_EPROTO);
    t0 = dspk_bench_now_us();
    if ((err = dspk_buffer_write(c, plain, 0, src, big)) < 0)
      die("socket write", c, err);
    tsw[r] = dspk_bench_now_us() - t0;
    t0 = dspk_bench_now_us();
    if ((err = dspk_buffer_read(c, plain, 0, dst, big)) < 0)
      die("socket read", c, err);
    tsr[r] = dspk_bench_now_us() - t0;
  }
  double mm = stats(tm, rounds).med;
  printf("## 256 MiB into and out of a buffer on cpu:0 (%d rounds, interleaved)\n\n", rounds);
  printf("| path | median ms | min–max ms | GB/s | ratio to memcpy |\n| --- | --- | --- | --- | --- |\n");
  row_bw("memcpy (in-process, warm)", tm, rounds, big, mm);
  row_bw("dspk_buffer_write, shared buffer", tw, rounds, big, mm);
  row_bw("dspk_buffer_read, shared buffer", tr, rounds, big, mm);
  row_bw("dspk_buffer_write, daemon buffer over the socket", tsw, rounds, big, mm);
  row_bw("dspk_buffer_read, daemon buffer over the socket", tsr, rounds, big, mm);
  printf("\n");
  dspk_buffer_free(c, plain);
  dspk_shared_free(c, sh);
  free(src);
  free(dst);

  /* ---- 2. gemm 2048² f32 ---- */
  const int64_t n = 2048;
  size_t mb = (size_t)(n * n) * sizeof(float);
  float *A = xmalloc(mb), *B = xmalloc(mb), *C = xmalloc(mb);
  float *SA, *SB, *SC;
  uint64_t ia, ib, ic;
  dspk_bench_fill(A, (size_t)(n * n), 1);
  dspk_bench_fill(B, (size_t)(n * n), 2);
  if ((err = dspk_shared_alloc(c, "cpu:0", mb, (void **)&SA, &ia)) < 0 ||
      (err = dspk_shared_alloc(c, "cpu:0", mb, (void **)&SB, &ib)) < 0 ||
      (err = dspk_shared_alloc(c, "cpu:0", mb, (void **)&SC, &ic)) < 0)
    die("gemm shared", c, err);
  memcpy(SA, A, mb);
  memcpy(SB, B, mb);
  memset(SC, 0, mb);
  dspk_tensor gs[2], gi[2];
  tensor2(&gs[0], DSPK_F32, n, n, SA);
  tensor2(&gs[1], DSPK_F32, n, n, SB);
  tensor2(&gi[0], DSPK_F32, n, n, A);
  tensor2(&gi[1], DSPK_F32, n, n, B);
  dspk_task ts, ti;
  dspk_task_init(&ts, DSPK_OP_GEMM);
  ts.device = "cpu:0";
  ts.ninputs = 2;
  ts.inputs = gs;
  ts.nout_refs = 1;
  ts.out_refs[0].buffer = ic;
  ti = ts;
  ti.inputs = gi;
  ti.nout_refs = 0;
  /* the daemon's own buffers (buffer.create, written once): the parity
   * reference of the daemon's gemm itself */
  uint64_t da, db, dc;
  dspk_tensor gd[2];
  if ((err = dspk_buffer_create(c, "cpu:0", mb, &da)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", mb, &db)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", mb, &dc)) < 0 ||
      (err = dspk_buffer_write(c, da, 0, A, mb)) < 0 ||
      (err = dspk_buffer_write(c, db, 0, B, mb)) < 0)
    die("gemm daemon buffers", c, err);
  gd[0] = gs[0];
  gd[1] = gs[1];
  gd[0].is_ref = gd[1].is_ref = true;
  gd[0].buffer = da;
  gd[1].buffer = db;
  gd[0].offset = gd[1].offset = 0;
  dspk_task td = ts;
  td.inputs = gd;
  td.out_refs[0].buffer = dc;
  double *gdb = calloc((size_t)rounds, sizeof(double));
  double *gsh = calloc((size_t)rounds, sizeof(double)), *gin = calloc((size_t)rounds, sizeof(double));
  double *gref = calloc((size_t)rounds, sizeof(double));
  run(c, &ts); /* warm-up: tuning, pages */
  run(c, &ti);
  run(c, &td);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
  for (int r = 0; r < rounds; r++) {
    settle();
    gsh[r] = run(c, &ts);
    settle();
    double t0 = dspk_bench_now_us();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C,
                n);
    gref[r] = dspk_bench_now_us() - t0;
    settle();
    gin[r] = run(c, &ti);
    settle();
    gdb[r] = run(c, &td);
  }
  for (size_t i = 0; i < (size_t)(n * n); i += 4099)
    if (SC[i] != C[i] && (SC[i] - C[i]) * (SC[i] - C[i]) > 1e-6f * (1 + C[i] * C[i]))
      die("gemm: shared result differs from cblas", NULL, DSPK_EPROTO);

  /* ---- 3. fft 2^20 c64 ---- */
  const int64_t nf = 1 << 20;
  size_t fb = (size_t)nf * 8;
  fftwf_complex *X = fftwf_alloc_complex((size_t)nf), *Y = fftwf_alloc_complex((size_t)nf);
  float *Xs = xmalloc(fb), *FX, *FY;
  uint64_t ix, iy;
  dspk_bench_fill(Xs, (size_t)nf * 2, 3);
  if ((err = dspk_shared_alloc(c, "cpu:0", fb, (void **)&FX, &ix)) < 0 ||
      (err = dspk_shared_alloc(c, "cpu:0", fb, (void **)&FY, &iy)) < 0)
    die("fft shared", c, err);
  memcpy(FX, Xs, fb);
  memset(FY, 0, fb);
  dspk_tensor fs, fi;
  dspk_tensor_inline(&fs, DSPK_C64, 1, &nf, FX);
  dspk_tensor_inline(&fi, DSPK_C64, 1, &nf, Xs);
  dspk_task fts, fti;
  dspk_task_init(&fts, DSPK_OP_FFT);
  fts.device = "cpu:0";
  fts.ninputs = 1;
  fts.inputs = &fs;
  fts.nout_refs = 1;
  fts.out_refs[0].buffer = iy;
  fti = fts;
  fti.inputs = &fi;
  fti.nout_refs = 0;
  int fr = rounds * 5;
  double *fsh = calloc((size_t)fr, sizeof(double)), *fin = calloc((size_t)fr, sizeof(double));
  double *fref = calloc((size_t)fr, sizeof(double));
  run(c, &fts); /* the daemon's first 2^20 plan: measured in the background */
  dspk_bench_wait_fftw(dpid);
  run(c, &fts); /* the measured plan swapped in, its wisdom stored */
  run(c, &fti);
  fftwf_plan p = dspk_bench_fftwf_daemon_plan("bench_shm", cache, (int)nf, X, Y);
  memcpy(X, Xs, fb); /* in case it measured */
  for (int r = 0; r < fr; r++) {
    fsh[r] = run(c, &fts);
    double t0 = dspk_bench_now_us();
    fftwf_execute(p);
    fref[r] = dspk_bench_now_us() - t0;
    fin[r] = run(c, &fti);
  }
  for (size_t i = 0; i < (size_t)nf * 2; i += 4099) {
    float d = FY[i] - ((float *)Y)[i];
    if (d * d > 1e-4f * (1 + ((float *)Y)[i] * ((float *)Y)[i]))
      die("fft: shared result differs from FFTW", NULL, DSPK_EPROTO);
  }

  double gm = stats(gref, rounds).med, fm = stats(fref, fr).med;
  printf("## compute on cpu:0 (%d gemm rounds, %d fft rounds, interleaved)\n\n", rounds, fr);
  printf("| task | median ms | min–max ms | ratio (in-process median / this median) |\n");
  printf("| --- | --- | --- | --- |\n");
  row_t("gemm 2048² f32, in-process cblas_sgemm", gref, rounds, gm);
  row_t("gemm 2048² f32, operands and result in shared memory", gsh, rounds, gm);
  row_t("gemm 2048² f32, malloc operands (shared temporaries), result inline", gin, rounds,
        gm);
  row_t("gemm 2048² f32, operands and result in daemon buffers (buffer.create)", gdb, rounds,
        gm);
  row_t("fft 2^20 c64, in-process FFTW (the daemon's plan)", fref, fr, fm);
  row_t("fft 2^20 c64, input and result in shared memory", fsh, fr, fm);
  row_t("fft 2^20 c64, malloc input (shared temporary), result inline", fin, fr, fm);

  fftwf_destroy_plan(p);
  fftwf_free(X);
  fftwf_free(Y);
  dspk_close(c);
  printf("\ndspkd exit status %d\n", dspk_bench_stop_daemon(dpid));
  unlink(cache);
  char wal[300];
  snprintf(wal, sizeof wal, "%s-wal", cache);
  unlink(wal);
  snprintf(wal, sizeof wal, "%s-shm", cache);
  unlink(wal);
  rmdir(dir);
  return 0;
}
