/*
 * The exit-path guard of dspkd: whatever ends the process, every device is
 * closed on its own runner thread and every runner is joined first (GPU
 * drivers crash when a process exits with a device alive on another thread:
 * ../shared/repro/vk-exit-race).  The normal stop does this in order
 * (daemon/conn.c, daemon/main.c); this file covers the rest: exit() called
 * from anywhere (an atexit handler registered after the devices opened, so
 * it runs before the handlers the drivers registered while opening), and a
 * fatal error in the loop (a fast, ordered stop with exit status 1).
 *
 * The test hook DSPKD_TEST_EXIT (daemon/testhooks.c, test builds only:
 * proto/testhook.h) makes the daemon take one exit path on purpose so
 * tests/lifecycle can check each one:
 *   startup-fail  fail the start after the devices opened
 *   atexit        call exit(3) from the loop on SIGHUP
 *   thread        call exit(4) from a thread of its own on SIGHUP
 *   runner        on SIGHUP, the runner of the next task calls exit(5)
 *   fatal         take the fatal-error path on SIGHUP
 */
#ifndef DSPKD_TEARDOWN_H
#define DSPKD_TEARDOWN_H

#include <stdbool.h>

#include "daemon/dspkd.h"

/* Registers the exit handler (once) for d's devices; call on the loop
 * thread right after they opened. */
void dspkd_teardown_arm(struct dspkd *d);
/* Tells the exit handler that main joined every runner itself (call after
 * the last join, before the backends shut down). */
void dspkd_teardown_disarm(void);

/* A fatal error on the loop thread: logs it, sets exit status 1 and stops
 * at once, still in order (running tasks canceled, devices closed). */
void dspkd_fatal(struct dspkd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Counts the threads before any device opens (debug log level only). */
void dspkd_teardown_baseline(void);
/* Logs (debug) how many threads the process still has, against the count
 * before the devices opened, and how many of them are runners (at the end
 * of main: none). */
void dspkd_teardown_report(void);

#ifdef DSPK_TEST_HOOKS
/* daemon/testhooks.c: true when $DSPKD_TEST_EXIT names this path. */
bool dspkd_test_exit_is(const char *what);
/* SIGHUP under DSPKD_TEST_EXIT: takes the path; true when it did. */
bool dspkd_test_exit_on_hup(struct dspkd *d);
/* A runner about to execute a job (DSPKD_TEST_EXIT=runner). */
void dspkd_test_runner_job(struct device *dev);
#endif

#endif /* DSPKD_TEARDOWN_H */
