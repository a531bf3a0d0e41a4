/*
 * dspkd's signals (daemon/lifecycle.h).  These watchers sit beside the ones
 * daemon/main.c installs for the stop; libuv calls every watcher of a signal,
 * so this file counts SIGTERM/SIGINT itself: the first delivery starts the
 * stop (dspkd_stop() is idempotent, whoever runs first), the second makes it
 * fast.  SIGHUP reloads the configuration, or, under the test hook
 * DSPKD_TEST_EXIT (daemon/teardown.h), takes the exit path under test.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/config.h"
#include "daemon/lifecycle.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/teardown.h"

static struct {
  bool started;
  uv_signal_t term, intr, hup;
  int stops; /* SIGTERM + SIGINT received */
} s;

static void on_stop_signal(uv_signal_t *h, int signum) {
  struct dspkd *d = h->data;
  s.stops++;
  if (s.stops == 1) {
    dspkd_stop(d);
    return;
  }
  dspkd_warn("second %s: stopping now (running tasks are canceled)",
             signum == SIGTERM ? "SIGTERM" : "SIGINT");
  dspkd_stop(d);
  dspkd_stop_now(d);
}

static void on_hup(uv_signal_t *h, int signum) {
  struct dspkd *d = h->data;
  struct timespec ts;
  char msg[96];
  (void)signum;
  if (dspkd_test_exit_is("atexit")) {
    dspkd_warn("test: calling exit(3) from the loop (DSPKD_TEST_EXIT=atexit)");
    exit(3);
  }
  if (dspkd_test_exit_is("fatal")) {
    dspkd_fatal(d, "test: a fatal error in the loop (DSPKD_TEST_EXIT=fatal)");
    return;
  }
  if (d->stopping) {
    dspkd_info("SIGHUP during the stop: not reloading");
    return;
  }
  dspkd_info("SIGHUP: reloading the configuration");
  /* systemd's reload protocol: RELOADING=1 (with the monotonic time), then
   * READY=1 once done, whether the new file was taken or refused. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu",
           (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
  dspkd_notify_send(msg);
  if (dspkd_config_reload(d, NULL, 0) < 0)
    dspkd_notify_send("READY=1\nSTATUS=configuration reload failed: running with the "
                      "previous one (see the log)");
  else
    dspkd_notify_send("READY=1");
}

int dspkd_lifecycle_start(struct dspkd *d) {
  int r;
  if (s.started)
    return 0;
  dspkd_teardown_baseline();
  uv_signal_init(d->loop, &s.term);
  uv_signal_init(d->loop, &s.intr);
  uv_signal_init(d->loop, &s.hup);
  s.term.data = s.intr.data = s.hup.data = d;
  s.started = true;
  if ((r = uv_signal_start(&s.term, on_stop_signal, SIGTERM)) < 0 ||
      (r = uv_signal_start(&s.intr, on_stop_signal, SIGINT)) < 0 ||
      (r = uv_signal_start(&s.hup, on_hup, SIGHUP)) < 0) {
    dspkd_error("cannot watch signals: %s", uv_strerror(r));
    return DSPK_EIO;
  }
  uv_unref((uv_handle_t *)&s.term);
  uv_unref((uv_handle_t *)&s.intr);
  uv_unref((uv_handle_t *)&s.hup);
  return 0;
}

void dspkd_lifecycle_ready(struct dspkd *d) {
  dspkd_notify_start(d);
  dspkd_notify_ready(d);
}

void dspkd_lifecycle_close(struct dspkd *d) {
  sigset_t set;
  if (!s.started)
    return;
  s.started = false;
  /* From here on a stop signal stays pending (runners block every signal)
   * and dies with the process: the teardown is not cut short. */
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  uv_close((uv_handle_t *)&s.term, NULL);
  uv_close((uv_handle_t *)&s.intr, NULL);
  uv_close((uv_handle_t *)&s.hup, NULL);
  dspkd_notify_close(d);
  uv_run(d->loop, UV_RUN_DEFAULT);
}
