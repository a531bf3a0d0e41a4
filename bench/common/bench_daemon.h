/*
 * Starting and stopping the dspkd a benchmark measures: a child process on
 * the cpu backend, with its own socket and cache file, waited for through
 * --ready-fd (an event, not a sleep).
 */
#ifndef DSPK_BENCH_DAEMON_H
#define DSPK_BENCH_DAEMON_H

#include <sys/types.h>

/* Starts dspkd (--backends cpu --cache CACHE --socket SOCK) and returns its
 * pid once it listens; prints "PROG: dspkd did not start" and exits 1 when
 * it does not. */
pid_t dspk_bench_start_daemon(const char *prog, const char *dspkd,
                              const char *sock, const char *cache);
/* SIGTERM, then waits: the exit status, or -1 when it did not exit. */
int dspk_bench_stop_daemon(pid_t pid);
/* Waits (up to 300 s) until dspkd pid has no "dspk-fftw-plan" thread: the
 * background FFTW measuring of a large plan (backends/cpu/fft.c) is done,
 * and the next task swaps the measured plan in. */
void dspk_bench_wait_fftw(pid_t pid);

#endif /* DSPK_BENCH_DAEMON_H */
