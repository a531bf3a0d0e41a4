/*
 * bench_datapath: the data path and per-task overhead on cpu:0 through
 * libdspkclient, each next to its floor, interleaved in rounds so that
 * machine noise hits both sides alike.
 *
 *   xfer   dspk_buffer_write / dspk_buffer_read of 1..256 MiB against the
 *          same bytes through a raw Unix socket (a forked peer that reads or
 *          writes them) and against memcpy.
 *   gemm   f32 N x N, operands inline (client memory) and resident (daemon
 *          buffers, output to a buffer), against cblas_sgemm in-process.
 *   fft    c64 2^20 inline against FFTW in-process with the same plan: the
 *          daemon (with a cache, FFTW_MEASURE) measures its plan in the
 *          background after its first fft; when it is done, this process
 *          imports the wisdom the daemon stored in its cache and makes its
 *          plan from it (FFTW_MEASURE | FFTW_WISDOM_ONLY; its own full
 *          measure when that fails, said on stderr).
 *   tiny   map abs on 16 floats against dspk_ping.
 *   reduce sum of 2^26 f32 in a buffer (numpy's side: bench_numpy.py).
 *
 * Usage: bench_datapath PATH/TO/dspkd [rounds [samples.json]]
 * Prints a markdown table (median ms, p10-p90 spread, ratio of medians);
 * the json file gets every sample for docs/plot (bench/datapath/plot.py).
 */
#include <fftw3.h> /* before cblas.h: OpenBLAS's cblas.h includes complex.h */
#include <cblas.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
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

#define MIB ((size_t)1 << 20)
#define MAXR 64

static void die(const char *what, int err) {
  fprintf(stderr, "bench_datapath: %s: %s\n", what, err < 0 ? dspk_strerror(err) : strerror(errno));
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = dspk_bench_alloc("bench_datapath", n);
  memset(p, 1, n); /* resident, like a user's data */
  return p;
}

/* ---- samples and the table --------------------------------------------- */

struct series {
  char name[64];
  double v[MAXR * 64];
  int n;
};
static struct series S[128];
static int nseries;

static struct series *ser(const char *name) {
  for (int i = 0; i < nseries; i++)
    if (strcmp(S[i].name, name) == 0)
      return &S[i];
  snprintf(S[nseries].name, sizeof S[nseries].name, "%s", name);
  return &S[nseries++];
}

static void add(const char *name, double us) {
  struct series *s = ser(name);
  if (s->n < (int)(sizeof s->v / sizeof s->v[0]))
    s->v[s->n++] = us;
}

static double q(const char *name, double p) {
  struct series *s = ser(name);
  double t[sizeof s->v / sizeof s->v[0]];
  if (!s->n)
    return 0;
  memcpy(t, s->v, sizeof(double) * (size_t)s->n);
  qsort(t, (size_t)s->n, sizeof *t, dspk_bench_cmp_d);
  return t[(size_t)(p * (s->n - 1) + 0.5)];
}

/* One row: dspk's series against the reference; ratio = ref / dspk (higher
 * is better for dspk; for bandwidth the same as dspk's GB/s over ref's). */
static void row(const char *what, const char *a, const char *b, const char *goal) {
  printf("| %s | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.3f | %s |\n", what,
         q(a, .5) / 1e3, q(a, .1) / 1e3, q(a, .9) / 1e3, q(b, .5) / 1e3, q(b, .1) / 1e3,
         q(b, .9) / 1e3, q(b, .5) / q(a, .5), goal);
}

/* ---- the raw socket peer ------------------------------------------------ */

/* A forked peer on path: for each 9-byte command ('W' or 'R', 8-byte size)
 * it reads size bytes and answers one byte, or writes size bytes. */
static pid_t start_peer(const char *path, size_t max) {
  int ls = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  unlink(path);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0)
    die("peer socket", 0);
  pid_t pid = fork();
  if (pid == 0) {
    int c = accept(ls, NULL, NULL);
    char *buf = xmalloc(max);
    for (;;) {
      unsigned char cmd[9];
      size_t got = 0, n = 0;
      while (got < 9) {
        ssize_t k = read(c, cmd + got, 9 - got);
        if (k <= 0)
          _exit(0);
        got += (size_t)k;
      }
      memcpy(&n, cmd + 1, 8);
      for (got = 0; got < n;) {
        ssize_t k = cmd[0] == 'W' ? read(c, buf + got, n - got) : write(c, buf + got, n - got);
        if (k <= 0)
          _exit(1);
        got += (size_t)k;
      }
      if (cmd[0] == 'W' && write(c, "k", 1) != 1)
        _exit(1);
    }
  }
  close(ls);
  return pid;
}

static int connect_path(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0)
    die("connect peer", 0);
  return s;
}

static double raw_xfer(int s, char op, void *p, size_t n) {
  unsigned char cmd[9] = {(unsigned char)op};
  char k;
  memcpy(cmd + 1, &n, 8);
  double t0 = dspk_bench_now_us();
  if (write(s, cmd, 9) != 9)
    die("raw cmd", 0);
  for (size_t got = 0; got < n;) {
    ssize_t r = op == 'W' ? write(s, (char *)p + got, n - got) : read(s, (char *)p + got, n - got);
    if (r <= 0)
      die("raw xfer", 0);
    got += (size_t)r;
  }
  if (op == 'W' && read(s, &k, 1) != 1)
    die("raw ack", 0);
  return dspk_bench_now_us() - t0;
}

/* ---- tasks -------------------------------------------------------------- */

static double run(dspk_client *c, dspk_task *t) { return dspk_bench_run("bench_datapath", c, t); }


/* Mean us per task of n copies of t kept `depth` in flight (dspk_submit,
 * dspk_wait_any): the cost of each task in a stream, where the daemon
 * takes the next while it answers the last. */
static double stream_us(dspk_client *c, const dspk_task *t, int n, int depth) {
  uint32_t tk;
  dspk_result res;
  int sent = 0, done = 0, err;
  double t0 = dspk_bench_now_us();
  while (done < n) {
    while (sent < n && sent - done < depth) {
      if ((err = dspk_submit(c, t, &tk)) < 0)
        die("dspk_submit", err);
      sent++;
    }
    if ((err = dspk_wait_any(c, &tk, &res)) < 0)
      die("dspk_wait_any", err);
    dspk_result_free(&res);
    done++;
  }
  return (dspk_bench_now_us() - t0) / n;
}

static dspk_tensor inl(dspk_dtype dt, unsigned rank, int64_t a, int64_t b, const void *p,
                       size_t nbytes) {
  dspk_tensor t = {.dtype = dt, .rank = rank, .shape = {a, b}, .data = p, .nbytes = nbytes};
  return t;
}

static dspk_tensor ref(dspk_dtype dt, unsigned rank, int64_t a, int64_t b, uint64_t buf) {
  dspk_tensor t = {.dtype = dt, .rank = rank, .shape = {a, b}, .is_ref = true, .buffer = buf};
  return t;
}

/* OpenBLAS's workers spin a while after a call; a pause (1 s, as in
 * bench_core) lets them park so each side is timed alone. */
static void settle(void) {
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
}

static int has(const char *list, const char *what) {
  return !list || strstr(list, what) != NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_datapath PATH/TO/dspkd [rounds [samples.json]]\n"
                    "  DSPK_BENCH_ONLY=xfer,gemm,fft,tiny,reduce picks parts\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1 || rounds > MAXR)
    rounds = 5;
  const char *only = getenv("DSPK_BENCH_ONLY");
  char dir[] = "/tmp/dspk-bench-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", 0);
  char sock[256], cache[256], raw[256];
  snprintf(sock, sizeof sock, "%s/d.sock", dir);
  snprintf(cache, sizeof cache, "%s/cache.db", dir);
  snprintf(raw, sizeof raw, "%s/raw.sock", dir);
  signal(SIGPIPE, SIG_IGN);

  const size_t xmax = 256 * MIB;
  pid_t ppid = has(only, "xfer") ? start_peer(raw, xmax) : -1;
  pid_t dpid = dspk_bench_start_daemon("bench_datapath", argv[1], sock, cache);
  dspk_client *c;
  int err = dspk_connect(sock, "bench_datapath", &c);
  if (err < 0) {
    fprintf(stderr, "bench_datapath: connect: %s\n", dspk_connect_error());
    return 1;
  }
  char name[64];

  /* ---- transfers ---- */
  static const size_t xs[] = {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB};
  if (has(only, "xfer")) {
    int rs = connect_path(raw);
    char *src = xmalloc(xmax), *dst = xmalloc(xmax);
    uint64_t buf;
    if ((err = dspk_buffer_create(c, "cpu:0", xmax, &buf)) < 0)
      die("buffer.create", err);
    for (int r = -1; r < rounds; r++) { /* round -1: warm-up */
      for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        size_t n = xs[i];
        double t0 = dspk_bench_now_us();
        if ((err = dspk_buffer_write(c, buf, 0, src, n)) < 0)
          die("buffer.write", err);
        double tw = dspk_bench_now_us() - t0;
        t0 = dspk_bench_now_us();
        if ((err = dspk_buffer_read(c, buf, 0, dst, n)) < 0)
          die("buffer.read", err);
        double tr = dspk_bench_now_us() - t0;
        double rw = raw_xfer(rs, 'W', src, n), rr = raw_xfer(rs, 'R', dst, n);
        t0 = dspk_bench_now_us();
        memcpy(dst, src, n);
        double tm = dspk_bench_now_us() - t0;
        if (r < 0)
          continue;
        snprintf(name, sizeof name, "write.dspk.%zu", n / MIB); add(name, tw);
        snprintf(name, sizeof name, "read.dspk.%zu", n / MIB); add(name, tr);
        snprintf(name, sizeof name, "write.raw.%zu", n / MIB); add(name, rw);
        snprintf(name, sizeof name, "read.raw.%zu", n / MIB); add(name, rr);
        snprintf(name, sizeof name, "memcpy.%zu", n / MIB); add(name, tm);
      }
    }
    dspk_buffer_free(c, buf);
    free(src);
    free(dst);
    close(rs);
  }

  /* ---- gemm: inline and resident ---- */
  static const int gn[] = {256, 512, 1024, 2048};
  if (has(only, "gemm")) {
    for (size_t i = 0; i < sizeof gn / sizeof gn[0]; i++) {
      int n = gn[i];
      size_t nb = (size_t)n * n * 4;
      float *A = xmalloc(nb), *B = xmalloc(nb), *C = xmalloc(nb);
      dspk_bench_fill(A, (size_t)n * n, 1);
      dspk_bench_fill(B, (size_t)n * n, 2);
      uint64_t ba, bb, bc;
      if ((err = dspk_buffer_create(c, "cpu:0", nb, &ba)) < 0 ||
          (err = dspk_buffer_create(c, "cpu:0", nb, &bb)) < 0 ||
          (err = dspk_buffer_create(c, "cpu:0", nb, &bc)) < 0)
        die("buffer.create", err);
      dspk_buffer_write(c, ba, 0, A, nb);
      dspk_buffer_write(c, bb, 0, B, nb);
      dspk_tensor in_inl[2] = {inl(DSPK_F32, 2, n, n, A, nb), inl(DSPK_F32, 2, n, n, B, nb)};
      dspk_tensor in_ref[2] = {ref(DSPK_F32, 2, n, n, ba), ref(DSPK_F32, 2, n, n, bb)};
      dspk_task ti, tr;
      dspk_task_init(&ti, DSPK_OP_GEMM);
      ti.device = "cpu:0";
      ti.inputs = in_inl;
      ti.ninputs = 2;
      tr = ti;
      tr.inputs = in_ref;
      tr.nout_refs = 1;
      tr.out_refs[0].buffer = bc;
      int reps = n <= 256 ? 50 : n <= 512 ? 10 : 1;
      for (int r = -1; r < rounds; r++) {
        double a = 0, b = 0, p = 0, ad = 0, st = 0;
        for (int k = 0; k < reps; k++)
          a += dspk_bench_run_us("bench_datapath", c, &ti, &ad);
        settle();
        for (int k = 0; k < reps; k++)
          b += run(c, &tr);
        settle();
        if (n <= 512) {
          st = stream_us(c, &tr, reps, 4);
          settle();
        }
        for (int k = 0; k < reps; k++) {
          double t0 = dspk_bench_now_us();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n,
                      0.0f, C, n);
          p += dspk_bench_now_us() - t0;
        }
        settle();
        if (r < 0)
          continue;
        snprintf(name, sizeof name, "gemm.inline.%d", n); add(name, a / reps);
        snprintf(name, sizeof name, "gemm.inline_daemon.%d", n); add(name, ad / reps);
        snprintf(name, sizeof name, "gemm.resident.%d", n); add(name, b / reps);
        snprintf(name, sizeof name, "gemm.inproc.%d", n); add(name, p / reps);
        if (n <= 512) {
          snprintf(name, sizeof name, "gemm.stream.%d", n); add(name, st);
        }
      }
      dspk_buffer_free(c, ba);
      dspk_buffer_free(c, bb);
      dspk_buffer_free(c, bc);
      free(A);
      free(B);
      free(C);
    }
  }

  /* ---- fft c64 2^20 inline ---- */
  if (has(only, "fft")) {
    size_t nf = (size_t)1 << 20;
    /* the bench's allocator: aligned for FFTW's SIMD, 2 MiB pages like numpy's arrays */
    fftwf_complex *X = xmalloc(nf * sizeof *X), *Y = xmalloc(nf * sizeof *Y);
    dspk_bench_fill((float *)X, 2 * nf, 3);
    dspk_tensor in = {.dtype = DSPK_C64, .rank = 1, .shape = {(int64_t)nf}, .data = X,
                      .nbytes = nf * sizeof *X};
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_FFT);
    t.device = "cpu:0";
    t.inputs = &in;
    t.ninputs = 1;
    run(c, &t); /* the daemon's first 2^20 plan: measured in the background */
    dspk_bench_wait_fftw(dpid);
    run(c, &t); /* the measured plan swapped in, its wisdom stored */
    fftwf_plan p = dspk_bench_fftwf_daemon_plan("bench_datapath", cache, (int)nf, X, Y);
    dspk_bench_fill((float *)X, 2 * nf, 3); /* in case it measured */
    /* five alternating pairs a round: one 2^20 transform is 8-15 ms on the
     * VM, where one pair a round left the medians to its noise */
    for (int r = -1; r < rounds; r++) {
      for (int k = 0; k < 5; k++) {
        double ad = 0, a = dspk_bench_run_us("bench_datapath", c, &t, &ad);
        double t0 = dspk_bench_now_us();
        fftwf_execute(p);
        double b = dspk_bench_now_us() - t0;
        if (r >= 0) {
          add("fft.inline", a);
          add("fft.inline_daemon", ad);
          add("fft.inproc", b);
        }
      }
    }
    fftwf_destroy_plan(p);
    free(X);
    free(Y);
  }

  /* ---- tiny task vs ping ---- */
  if (has(only, "tiny")) {
    float x[16];
    dspk_bench_fill(x, 16, 4);
    dspk_tensor in = inl(DSPK_F32, 1, 16, 0, x, sizeof x);
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_MAP);
    t.device = "cpu:0";
    t.inputs = &in;
    t.ninputs = 1;
    t.map.fn = DSPK_MAP_ABS;
    for (int r = -1; r < rounds; r++) {
      for (int k = 0; k < 200; k++) {
        double t0 = dspk_bench_now_us();
        if ((err = dspk_ping(c, NULL, 0)) < 0)
          die("ping", err);
        double a = dspk_bench_now_us() - t0;
        double b = run(c, &t);
        if (r >= 0) {
          add("ping", a);
          add("tiny", b);
        }
      }
    }
  }

  /* ---- reduce sum 2^26 f32 resident ---- */
  if (has(only, "reduce")) {
    size_t n = (size_t)1 << 26, nb = n * 4;
    float *X = xmalloc(nb);
    dspk_bench_fill(X, n, 5);
    uint64_t bx;
    if ((err = dspk_buffer_create(c, "cpu:0", nb, &bx)) < 0)
      die("buffer.create", err);
    dspk_buffer_write(c, bx, 0, X, nb);
    dspk_tensor in = ref(DSPK_F32, 1, (int64_t)n, 0, bx);
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_REDUCE);
    t.device = "cpu:0";
    t.inputs = &in;
    t.ninputs = 1;
    t.reduce.fn = DSPK_REDUCE_SUM;
    for (int r = -1; r < rounds; r++) {
      double a = run(c, &t);
      double t0 = dspk_bench_now_us();
      double s = 0; /* a plain serial loop, for scale only */
      for (size_t i = 0; i < n; i++)
        s += X[i];
      double b = dspk_bench_now_us() - t0;
      if (s == 12345.678)
        puts("");
      if (r >= 0) {
        add("reduce.resident", a);
        add("reduce.serial_loop", b);
      }
    }
    dspk_buffer_free(c, bx);
    free(X);
  }

  dspk_close(c);
  dspk_bench_stop_daemon(dpid);
  if (ppid > 0) {
    kill(ppid, SIGTERM);
    waitpid(ppid, NULL, 0);
  }

  printf("| what | dspk ms (p10-p90) | reference ms (p10-p90) | ratio | goal |\n");
  printf("|---|---|---|---|---|\n");
  for (size_t i = 0; i < sizeof xs / sizeof xs[0] && has(only, "xfer"); i++) {
    char a[64], b[64], w[64];
    size_t m = xs[i] / MIB;
    snprintf(a, sizeof a, "write.dspk.%zu", m);
    snprintf(b, sizeof b, "write.raw.%zu", m);
    snprintf(w, sizeof w, "buffer_write %zu MiB vs raw socket", m);
    row(w, a, b, m == 256 ? ">= 0.8" : "");
    snprintf(a, sizeof a, "read.dspk.%zu", m);
    snprintf(b, sizeof b, "read.raw.%zu", m);
    snprintf(w, sizeof w, "buffer_read %zu MiB vs raw socket", m);
    row(w, a, b, m == 256 ? ">= 0.8" : "");
    if (m == 256) {
      snprintf(b, sizeof b, "memcpy.%zu", m);
      row("buffer_read 256 MiB vs memcpy", a, b, "(shared memory: h1)");
    }
  }
  for (size_t i = 0; i < sizeof gn / sizeof gn[0] && has(only, "gemm"); i++) {
    char a[64], b[64], w[64];
    snprintf(b, sizeof b, "gemm.inproc.%d", gn[i]);
    snprintf(a, sizeof a, "gemm.inline.%d", gn[i]);
    snprintf(w, sizeof w, "gemm %d^2 f32 inline vs cblas_sgemm", gn[i]);
    row(w, a, b, gn[i] == 2048 ? ">= 0.95" : "");
    snprintf(a, sizeof a, "gemm.inline_daemon.%d", gn[i]);
    snprintf(w, sizeof w, "(its time_us in the daemon)");
    row(w, a, b, "");
    snprintf(a, sizeof a, "gemm.resident.%d", gn[i]);
    snprintf(w, sizeof w, "gemm %d^2 f32 resident vs cblas_sgemm", gn[i]);
    row(w, a, b, gn[i] == 256 ? ">= 0.9" : "");
    if (gn[i] <= 512) {
      snprintf(a, sizeof a, "gemm.stream.%d", gn[i]);
      snprintf(w, sizeof w, "(resident, a stream: 4 in flight)");
      row(w, a, b, "");
    }
  }
  if (has(only, "fft")) {
    row("fft c64 2^20 inline vs FFTW", "fft.inline", "fft.inproc", ">= 0.95");
    row("(its time_us in the daemon)", "fft.inline_daemon", "fft.inproc", "");
  }
  if (has(only, "tiny"))
    row("tiny task (map abs, 16 f32) vs ping", "tiny", "ping", ">= 0.67 (<= 1.5x)");
  if (has(only, "reduce"))
    row("reduce sum 2^26 f32 resident vs serial C loop", "reduce.resident",
        "reduce.serial_loop", "(numpy: bench_numpy.py)");

  if (argc > 3) {
    FILE *f = fopen(argv[3], "w");
    if (!f)
      die(argv[3], 0);
    fprintf(f, "{");
    for (int i = 0; i < nseries; i++) {
      fprintf(f, "%s\n \"%s\": [", i ? "," : "", S[i].name);
      for (int k = 0; k < S[i].n; k++)
        fprintf(f, "%s%.1f", k ? ", " : "", S[i].v[k]);
      fprintf(f, "]");
    }
    fprintf(f, "\n}\n");
    fclose(f);
  }
  return 0;
}
