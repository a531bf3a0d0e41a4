/*
 * bench_core: the foundation's benchmarks, side by side in one run.
 *
 *   1. Round trip: dspk_ping() through libdspkclient against a raw
 *      Unix-socket ping-pong of the same byte counts with a forked echo
 *      process (the floor any client pays).  The two are interleaved in
 *      rounds so machine noise hits both alike.
 *   2. gemm 2048x2048 f32 and fft of 2^20 c64 on cpu:0 through dspkd with
 *      the operands in daemon buffers, against OpenBLAS / FFTW called
 *      in-process on the same data (same planner flags: FFTW_MEASURE, as the
 *      daemon uses with a cache).  Also the inline variant, where the data
 *      travels over the socket with each task.
 *
 * Usage: bench_core PATH/TO/dspkd [rounds]   (rounds 0: the round trip only)
 * Prints a markdown table of medians and ratios.
 */
#include <fftw3.h> /* before cblas.h: OpenBLAS's cblas.h includes complex.h */
#include <cblas.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench_daemon.h"
#include "bench/common/bench_fftw.h"
#include "bench/common/bench_task.h"
#include "bench/common/bench_util.h"
#include "dspk/dspk.h"

static double pct(double *v, size_t n, double p) {
  qsort(v, n, sizeof *v, dspk_bench_cmp_d);
  size_t i = (size_t)(p * (n - 1) + 0.5);
  return v[i];
}

static void die(const char *what, int err) {
  fprintf(stderr, "bench_core: %s: %s\n", what, err < 0 ? dspk_strerror(err) : strerror(errno));
  exit(1);
}

/* ---- raw ping-pong floor ------------------------------------------------- */

/* Echo server: reads a request of req bytes, answers resp bytes. */
static pid_t start_echo(const char *path, size_t req, size_t resp) {
  int ls = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    die("socket path too long", DSPK_ELIMIT);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  unlink(path);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0)
    die("echo socket", 0);
  pid_t pid = fork();
  if (pid == 0) {
    int c = accept(ls, NULL, NULL);
    char buf[4096];
    for (;;) {
      size_t got = 0;
      while (got < req) {
        ssize_t n = read(c, buf, req - got);
        if (n <= 0)
          _exit(0);
        got += (size_t)n;
      }
      if (write(c, buf, resp) != (ssize_t)resp)
        _exit(0);
    }
  }
  close(ls);
  return pid;
}

static int connect_raw(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    die("socket path too long", DSPK_ELIMIT);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0)
    die("connect echo", 0);
  return s;
}

static double raw_round(int s, size_t req, size_t resp) {
  char buf[4096] = {0};
  double t0 = dspk_bench_now_us();
  if (write(s, buf, req) != (ssize_t)req)
    die("raw write", 0);
  size_t got = 0;
  while (got < resp) {
    ssize_t n = read(s, buf, resp - got);
    if (n <= 0)
      die("raw read", 0);
    got += (size_t)n;
  }
  return dspk_bench_now_us() - t0;
}

/* ---- helpers for tasks --------------------------------------------------- */

static void *xmalloc(size_t n) { return dspk_bench_alloc("bench_core", n); }

static double run_ref(dspk_client *c, dspk_task *t) { return dspk_bench_run("bench_core", c, t); }

/* OpenBLAS's worker threads spin for a while after each call; on a small
 * machine a spinning pool in one process slows the other's gemm.  A pause
 * (1 s) between the in-process and the daemon's runs lets them park, so each side
 * is timed alone. */
static void settle(void) {
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
}

static void row(const char *what, double daemon, double inproc) {
  printf("| %s | %.1f | %.1f | %.3f |\n", what, daemon / 1000.0, inproc / 1000.0,
         inproc / daemon);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_core PATH/TO/dspkd [rounds]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  char dir[] = "/tmp/dspk-bench-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", 0);
  char sock[256], cache[256], raw[256];
  snprintf(sock, sizeof sock, "%s/d.sock", dir);
  snprintf(cache, sizeof cache, "%s/cache.db", dir);
  snprintf(raw, sizeof raw, "%s/raw.sock", dir);
  signal(SIGPIPE, SIG_IGN);

  pid_t dpid = dspk_bench_start_daemon("bench_core", argv[1], sock, cache);
  dspk_client *c;
  int err = dspk_connect(sock, "bench_core", &c);
  if (err < 0) {
    fprintf(stderr, "bench_core: connect: %s\n", dspk_connect_error());
    return 1;
  }

  /* 1. ping: the request [0,id,"ping",[{"data": bin 0}]] and the answer
   * [1,id,nil,{"data": bin 0}] are 17 and 12 bytes with a one-byte msgid
   * (seen with strace); the raw floor moves the same counts. */
  const size_t req = 17, resp = 12;
  pid_t epid = start_echo(raw, req, resp);
  int rs = connect_raw(raw);
  enum { PINGS = 2000 };
  static double lib[PINGS], flo[PINGS];
  for (int i = 0; i < 200; i++) { /* warm-up */
    dspk_ping(c, NULL, 0);
    raw_round(rs, req, resp);
  }
  for (int i = 0; i < PINGS; i++) {
    double t0 = dspk_bench_now_us();
    if ((err = dspk_ping(c, NULL, 0)) < 0)
      die("ping", err);
    lib[i] = dspk_bench_now_us() - t0;
    flo[i] = raw_round(rs, req, resp);
  }
  double lmed = pct(lib, PINGS, 0.5), lp99 = pct(lib, PINGS, 0.99);
  double fmed = pct(flo, PINGS, 0.5), fp99 = pct(flo, PINGS, 0.99);
  printf("## round trip (%d pings each, interleaved)\n\n", PINGS);
  printf("| path | median us | p99 us |\n| --- | --- | --- |\n");
  printf("| dspk_ping via dspkd | %.1f | %.1f |\n", lmed, lp99);
  printf("| raw Unix socket ping-pong | %.1f | %.1f |\n", fmed, fp99);
  printf("\nmedian ratio dspk/raw: %.3f\n\n", lmed / fmed);
  close(rs);
  kill(epid, SIGTERM);
  waitpid(epid, NULL, 0);

  if (rounds == 0) /* round trip only */
    goto done;

  /* 2. gemm 2048^2 f32. */
  const int64_t n = 2048;
  size_t mbytes = (size_t)(n * n) * sizeof(float);
  float *A = xmalloc(mbytes), *B = xmalloc(mbytes), *C = xmalloc(mbytes);
  dspk_bench_fill(A, (size_t)(n * n), 1);
  dspk_bench_fill(B, (size_t)(n * n), 2);
  uint64_t ba, bb, bc;
  if ((err = dspk_buffer_create(c, "cpu:0", mbytes, &ba)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", mbytes, &bb)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", mbytes, &bc)) < 0 ||
      (err = dspk_buffer_write(c, ba, 0, A, mbytes)) < 0 ||
      (err = dspk_buffer_write(c, bb, 0, B, mbytes)) < 0)
    die("buffers", err);
  int64_t shp[2] = {n, n};
  dspk_tensor in[2];
  dspk_task t;
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  for (int i = 0; i < 2; i++) {
    memset(&in[i], 0, sizeof in[i]);
    in[i].dtype = DSPK_F32;
    in[i].rank = 2;
    memcpy(in[i].shape, shp, sizeof shp);
    in[i].is_ref = true;
    in[i].buffer = i ? bb : ba;
  }
  t.ninputs = 2;
  t.inputs = in;
  t.nout_refs = 1;
  t.out_refs[0].buffer = bc;

  double *dg = calloc((size_t)rounds, sizeof *dg), *ig = calloc((size_t)rounds, sizeof *ig);
  double *dgi = calloc((size_t)rounds, sizeof *dgi);
  run_ref(c, &t); /* warm-up */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
  dspk_task ti = t; /* inline variant: data travels both ways */
  dspk_tensor inl[2];
  dspk_tensor_inline(&inl[0], DSPK_F32, 2, shp, A);
  dspk_tensor_inline(&inl[1], DSPK_F32, 2, shp, B);
  ti.inputs = inl;
  ti.nout_refs = 0;
  for (int r = 0; r < rounds; r++) {
    settle();
    dg[r] = run_ref(c, &t);
    settle();
    double t0 = dspk_bench_now_us();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    ig[r] = dspk_bench_now_us() - t0;
    settle();
    dgi[r] = run_ref(c, &ti);
  }

  /* 3. fft 2^20 c64. */
  const int64_t nf = 1 << 20;
  size_t fbytes = (size_t)nf * 8;
  /* the bench's allocator: aligned for FFTW's SIMD, 2 MiB pages like the daemon's blocks */
  fftwf_complex *X = xmalloc(fbytes), *Y = xmalloc(fbytes);
  dspk_bench_fill((float *)X, (size_t)nf * 2, 3);
  float *Xsave = xmalloc(fbytes);
  memcpy(Xsave, X, fbytes);
  uint64_t bx, by;
  if ((err = dspk_buffer_create(c, "cpu:0", fbytes, &bx)) < 0 ||
      (err = dspk_buffer_create(c, "cpu:0", fbytes, &by)) < 0 ||
      (err = dspk_buffer_write(c, bx, 0, Xsave, fbytes)) < 0)
    die("fft buffers", err);
  dspk_tensor fin;
  memset(&fin, 0, sizeof fin);
  fin.dtype = DSPK_C64;
  fin.rank = 1;
  fin.shape[0] = nf;
  fin.is_ref = true;
  fin.buffer = bx;
  dspk_task ft;
  dspk_task_init(&ft, DSPK_OP_FFT);
  ft.device = "cpu:0";
  ft.ninputs = 1;
  ft.inputs = &fin;
  ft.nout_refs = 1;
  ft.out_refs[0].buffer = by;
  dspk_tensor finl;
  dspk_tensor_inline(&finl, DSPK_C64, 1, &nf, Xsave);
  dspk_task fti = ft;
  fti.inputs = &finl;
  fti.nout_refs = 0;
  double *df = calloc((size_t)rounds * 5, sizeof *df), *iff = calloc((size_t)rounds * 5, sizeof *iff);
  double *dfi = calloc((size_t)rounds * 5, sizeof *dfi);
  /* The daemon's first 2^20 transform runs on a provisional plan while a
   * child measures the real one (backends/cpu/fft.c): wait for it, let the
   * next task swap it in, and time in-process FFTW on that same plan (its
   * wisdom, from the daemon's cache file), as bench_datapath and bench_shm
   * do; a plan measured here would be another of FFTW's near-equal choices. */
  run_ref(c, &ft);
  dspk_bench_wait_fftw(dpid);
  run_ref(c, &ft);
  run_ref(c, &fti);
  fftwf_plan p = dspk_bench_fftwf_daemon_plan("bench_core", cache, (int)nf, X, Y);
  memcpy(X, Xsave, fbytes); /* in case it measured */
  for (int r = 0; r < rounds * 5; r++) {
    df[r] = run_ref(c, &ft);
    double t0 = dspk_bench_now_us();
    fftwf_execute(p);
    iff[r] = dspk_bench_now_us() - t0;
    dfi[r] = run_ref(c, &fti);
  }

  double dgm = pct(dg, (size_t)rounds, 0.5), igm = pct(ig, (size_t)rounds, 0.5);
  double dgim = pct(dgi, (size_t)rounds, 0.5);
  double dfm = pct(df, (size_t)rounds * 5, 0.5), ifm = pct(iff, (size_t)rounds * 5, 0.5);
  double dfim = pct(dfi, (size_t)rounds * 5, 0.5);
  printf("## compute on cpu:0 (medians of %d gemm / %d fft rounds, interleaved)\n\n", rounds,
         rounds * 5);
  printf("| task | via dspkd ms | in-process ms | throughput ratio (in-process time / daemon time) |\n");
  printf("| --- | --- | --- | --- |\n");
  row("gemm 2048² f32, daemon buffers", dgm, igm);
  row("gemm 2048² f32, inline data", dgim, igm);
  row("fft 2^20 c64, daemon buffers", dfm, ifm);
  row("fft 2^20 c64, inline data", dfim, ifm);

  fftwf_destroy_plan(p);
  free(X);
  free(Y);
done:
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
