/*
 * bench_cache: time to first result of tasks that need tuning, with a cold
 * cache and with a warm one after a daemon restart, side by side in one run
 * (issue 3 §6).
 *
 * Two daemon lifetimes on one fresh cache file:
 *   cold: the first fft of 2^20 c64 (no wisdom: planned with FFTW_ESTIMATE
 *         while FFTW_MEASURE runs in the background, which the rest of the
 *         lifetime waits for) and the first fir of one shape (direct vs FFT
 *         measured, FFT plans measured);
 *   warm: the daemon is restarted on the same file and the same tasks run
 *         again: wisdom and the stored decision make them fast.
 * Each lifetime also times further runs of the same tasks (steady state,
 * median).  The warm lifetime is repeated (3 restarts) and the medians of
 * its figures are shown.  The operands travel inline, the same in every
 * column, so every figure includes moving 8 MiB each way for the fft.
 *
 * Besides the client's wall time, each task's time inside the daemon is
 * taken from the result's time_us (the runner's time: upload, planning or
 * autotuning, compute, readback; no queueing, no socket) and shown in a
 * table of its own, with the same ratios.
 *
 * Usage: bench_cache PATH/TO/dspkd [steady-runs]
 * Prints markdown tables; the goals are cold/warm >= 100 and
 * warm/steady <= 2.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "bench/common/bench_daemon.h"
#include "dspk/dspk.h"

#define FFT_N (1 << 20)
#define FIR_N (1 << 18)
#define FIR_K 200
#define WARM_RESTARTS 3

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what, int err) {
  fprintf(stderr, "bench_cache: %s: %s\n", what,
          err < 0 ? dspk_strerror(err) : strerror(errno));
  exit(1);
}

struct progress {
  int notes;
  double last;
};

static void on_progress(void *ud, uint32_t ticket, const char *what,
                        double fraction) {
  struct progress *p = ud;
  (void)ticket;
  (void)what;
  p->notes++;
  p->last = fraction;
}

/* The daemon's page-fault counters (minor, major) from /proc/PID/stat;
 * zeros when unreadable.  Unlike wall time they do not depend on the load
 * of the machine. */
struct faults {
  unsigned long long minflt, majflt;
  double cpu_ms; /* on-cpu time of all the daemon's threads */
};

static pid_t g_daemon; /* the daemon whose faults run_ms() counts */
static struct faults g_last; /* faults taken during the last run_ms() */
static double g_last_us;     /* the daemon's time_us of the last run_ms() */

static struct faults read_faults(pid_t pid) {
  struct faults f = {0, 0, 0};
  char path[300], buf[1024];
  /* Sum of the threads' run times (ns) from /proc/PID/task/TID/schedstat. */
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.')
        continue;
      snprintf(path, sizeof path, "/proc/%d/task/%.32s/schedstat", (int)pid,
               e->d_name);
      FILE *fs = fopen(path, "r");
      unsigned long long ns;
      if (fs && fscanf(fs, "%llu", &ns) == 1)
        f.cpu_ms += (double)ns / 1e6;
      if (fs)
        fclose(fs);
    }
    closedir(d);
  }
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *fp = fopen(path, "r");
  if (!fp)
    return f;
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  /* Fields after the ")" that closes comm: state ppid pgrp session tty_nr
   * tpgid flags minflt cminflt majflt. */
  char *p = strrchr(buf, ')');
  if (!p)
    return f;
  unsigned long long cmin, skip;
  char state;
  if (sscanf(p + 1, " %c %llu %llu %llu %llu %llu %llu %llu %llu %llu", &state,
             &skip, &skip, &skip, &skip, &skip, &skip, &f.minflt, &cmin,
             &f.majflt) != 10)
    f.minflt = f.majflt = 0;
  return f;
}

/* Runs t once; returns the wall time in ms and leaves the daemon's page
 * faults during the task in g_last. */
static double run_ms(dspk_client *c, const dspk_task *t) {
  dspk_result r;
  struct faults f0 = read_faults(g_daemon);
  double t0 = now_ms();
  int err = dspk_run(c, t, &r);
  double t1 = now_ms();
  struct faults f1 = read_faults(g_daemon);
  g_last.minflt = f1.minflt - f0.minflt;
  g_last.majflt = f1.majflt - f0.majflt;
  g_last.cpu_ms = f1.cpu_ms - f0.cpu_ms;
  if (err < 0) {
    fprintf(stderr, "bench_cache: task: %s (%s)\n", dspk_strerror(err),
            dspk_last_error(c));
    exit(1);
  }
  g_last_us = (double)r.time_us;
  dspk_result_free(&r);
  return t1 - t0;
}

struct phase {
  double fft_first, fir_first, fft_steady, fir_steady;
  int fir_progress;
  /* daemon minor page faults: first task, and the last steady run */
  double fft_first_flt, fir_first_flt, fft_steady_flt, fir_steady_flt;
  /* daemon cpu time (ms, all threads): same tasks */
  double fft_first_cpu, fir_first_cpu, fft_steady_cpu, fir_steady_cpu;
  /* time_us inside the daemon: first tasks, and medians of the steady runs */
  double fft_first_us, fir_first_us, fft_steady_us, fir_steady_us;
};

static void lifetime(const char *dspkd, const char *sock, const char *cache,
                     const dspk_task *fft, const dspk_task *fir, int steady,
                     struct phase *out) {
  pid_t pid = dspk_bench_start_daemon("bench_cache", dspkd, sock, cache);
  g_daemon = pid;
  dspk_client *c;
  if (dspk_connect(sock, "bench_cache", &c) < 0) {
    fprintf(stderr, "bench_cache: connect: %s\n", dspk_connect_error());
    exit(1);
  }
  struct progress p = {0};
  dspk_set_progress(c, on_progress, &p);
  out->fft_first = run_ms(c, fft);
  out->fft_first_flt = (double)g_last.minflt;
  out->fft_first_cpu = g_last.cpu_ms;
  out->fft_first_us = g_last_us;
  /* Cold, the fft ran with an estimated plan while the daemon measures one
   * in the background: the rest waits for that (and stores its wisdom). */
  dspk_bench_wait_fftw(pid);
  p.notes = 0;
  out->fir_first = run_ms(c, fir);
  out->fir_first_flt = (double)g_last.minflt;
  out->fir_first_cpu = g_last.cpu_ms;
  out->fir_first_us = g_last_us;
  out->fir_progress = p.notes;
  double *v = calloc((size_t)steady, sizeof *v);
  double *us = calloc((size_t)steady, sizeof *us);
  if (!v || !us)
    die("calloc", DSPK_ENOMEM);
  for (int i = 0; i < steady; i++) {
    v[i] = run_ms(c, fft);
    us[i] = g_last_us;
  }
  out->fft_steady_flt = (double)g_last.minflt;
  out->fft_steady_cpu = g_last.cpu_ms;
  qsort(v, (size_t)steady, sizeof *v, cmp_d);
  qsort(us, (size_t)steady, sizeof *us, cmp_d);
  out->fft_steady = v[steady / 2];
  out->fft_steady_us = us[steady / 2];
  for (int i = 0; i < steady; i++) {
    v[i] = run_ms(c, fir);
    us[i] = g_last_us;
  }
  out->fir_steady_flt = (double)g_last.minflt;
  out->fir_steady_cpu = g_last.cpu_ms;
  qsort(v, (size_t)steady, sizeof *v, cmp_d);
  qsort(us, (size_t)steady, sizeof *us, cmp_d);
  out->fir_steady = v[steady / 2];
  out->fir_steady_us = us[steady / 2];
  free(v);
  free(us);
  dspk_close(c);
  if (dspk_bench_stop_daemon(pid) != 0) {
    fprintf(stderr, "bench_cache: dspkd did not exit cleanly\n");
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_cache PATH/TO/dspkd [steady-runs]\n");
    return 2;
  }
  int steady = argc > 2 ? atoi(argv[2]) : 7;
  if (steady < 1)
    steady = 1;
  char dir[] = "/tmp/dspk-bench-cache-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", 0);
  char sock[256], cache[256];
  snprintf(sock, sizeof sock, "%s/d.sock", dir);
  snprintf(cache, sizeof cache, "%s/cache.db", dir);
  signal(SIGPIPE, SIG_IGN);

  /* Operands: fixed-seed pseudo-random data. */
  float *x = malloc(sizeof(float) * 2 * FFT_N);
  float *s = malloc(sizeof(float) * FIR_N);
  float *h = malloc(sizeof(float) * FIR_K);
  if (!x || !s || !h)
    die("malloc", DSPK_ENOMEM);
  uint32_t r = 7;
#define RND() ((r = r * 1664525u + 1013904223u), (float)(r >> 8) / (1 << 23) - 1.0f)
  for (int i = 0; i < 2 * FFT_N; i++)
    x[i] = RND();
  for (int i = 0; i < FIR_N; i++)
    s[i] = RND();
  for (int i = 0; i < FIR_K; i++)
    h[i] = RND() / FIR_K;

  dspk_tensor fin, sin2[2];
  int64_t fshape[1] = {FFT_N}, sshape[2] = {1, FIR_N}, hshape[1] = {FIR_K};
  dspk_tensor_inline(&fin, DSPK_C64, 1, fshape, x);
  dspk_tensor_inline(&sin2[0], DSPK_F32, 2, sshape, s);
  dspk_tensor_inline(&sin2[1], DSPK_F32, 1, hshape, h);
  dspk_task fft, fir;
  dspk_task_init(&fft, DSPK_OP_FFT);
  fft.device = "cpu:0";
  fft.ninputs = 1;
  fft.inputs = &fin;
  dspk_task_init(&fir, DSPK_OP_FIR);
  fir.device = "cpu:0";
  fir.ninputs = 2;
  fir.inputs = sin2;

  /* One cold lifetime, then WARM_RESTARTS warm ones; medians over the warm
   * lifetimes, since one first run is one sample on a noisy machine. */
  struct phase cold, w[WARM_RESTARTS], warm;
  lifetime(argv[1], sock, cache, &fft, &fir, steady, &cold);
  for (int i = 0; i < WARM_RESTARTS; i++)
    lifetime(argv[1], sock, cache, &fft, &fir, steady, &w[i]);
  double v[WARM_RESTARTS];
#define MEDIAN(field)                                                          \
  do {                                                                         \
    for (int i = 0; i < WARM_RESTARTS; i++)                                    \
      v[i] = w[i].field;                                                       \
    qsort(v, WARM_RESTARTS, sizeof v[0], cmp_d);                               \
    warm.field = v[WARM_RESTARTS / 2];                                         \
  } while (0)
  MEDIAN(fft_first);
  MEDIAN(fir_first);
  MEDIAN(fft_steady);
  MEDIAN(fir_steady);
  MEDIAN(fft_first_flt);
  MEDIAN(fft_first_cpu);
  MEDIAN(fir_first_flt);
  MEDIAN(fir_first_cpu);
  MEDIAN(fft_steady_flt);
  MEDIAN(fft_steady_cpu);
  MEDIAN(fir_steady_flt);
  MEDIAN(fir_steady_cpu);
  MEDIAN(fft_first_us);
  MEDIAN(fir_first_us);
  MEDIAN(fft_steady_us);
  MEDIAN(fir_steady_us);
  warm.fir_progress = w[0].fir_progress;

  printf("| task | cold first (ms) | warm first after restart (ms, median of %d) "
         "| steady (ms) ", WARM_RESTARTS);
  printf("| cold / warm | warm / steady |\n|---|---|---|---|---|---|\n");
  printf("| fft 2^20 c64 | %.1f | %.1f | %.1f | %.0fx | %.2fx |\n",
         cold.fft_first, warm.fft_first, warm.fft_steady,
         cold.fft_first / warm.fft_first, warm.fft_first / warm.fft_steady);
  printf("| fir f32 (1, 2^18), 200 taps | %.1f | %.1f | %.1f | %.0fx | %.2fx |\n",
         cold.fir_first, warm.fir_first, warm.fir_steady,
         cold.fir_first / warm.fir_first, warm.fir_first / warm.fir_steady);
  printf("\ndaemon per task: minor page faults (4 KiB pages) and cpu time of "
         "all its threads (ms); medians over the warm lifetimes; steady: the "
         "last run:\n\n"
         "| task | cold first | warm first | warm steady |\n|---|---|---|---|\n");
  printf("| fft 2^20 c64 | %.0f flt, %.1f ms | %.0f flt, %.1f ms | %.0f flt, "
         "%.1f ms |\n", cold.fft_first_flt, cold.fft_first_cpu,
         warm.fft_first_flt, warm.fft_first_cpu, warm.fft_steady_flt,
         warm.fft_steady_cpu);
  printf("| fir f32 (1, 2^18), 200 taps | %.0f flt, %.1f ms | %.0f flt, %.1f "
         "ms | %.0f flt, %.1f ms |\n", cold.fir_first_flt, cold.fir_first_cpu,
         warm.fir_first_flt, warm.fir_first_cpu, warm.fir_steady_flt,
         warm.fir_steady_cpu);
  printf("\ninside the daemon: the results' time_us in ms (the runner's time "
         "per task: upload, planning/autotuning, compute, readback; no "
         "queueing, no socket); warm: medians over the warm lifetimes; "
         "steady: median of the steady runs:\n\n"
         "| task | cold first (ms) | warm first (ms) | steady (ms) "
         "| cold / warm | warm / steady |\n|---|---|---|---|---|---|\n");
  printf("| fft 2^20 c64 | %.2f | %.2f | %.2f | %.0fx | %.2fx |\n",
         cold.fft_first_us / 1e3, warm.fft_first_us / 1e3,
         warm.fft_steady_us / 1e3, cold.fft_first_us / warm.fft_first_us,
         warm.fft_first_us / warm.fft_steady_us);
  printf("| fir f32 (1, 2^18), 200 taps | %.2f | %.2f | %.2f | %.0fx | %.2fx "
         "|\n", cold.fir_first_us / 1e3, warm.fir_first_us / 1e3,
         warm.fir_steady_us / 1e3, cold.fir_first_us / warm.fir_first_us,
         warm.fir_first_us / warm.fir_steady_us);
  printf("\nprogress notifications during the cold fir: %d; during the warm "
         "one: %d\n", cold.fir_progress, warm.fir_progress);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "bench_cache: could not remove %s\n", dir);
  free(x);
  free(s);
  free(h);
  return 0;
}
