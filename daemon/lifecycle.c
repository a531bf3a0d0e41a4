/*
 * dspkd's signals (daemon/lifecycle.h).  These are the only watchers of
 * SIGTERM and SIGINT: each delivery is logged ("received SIGTERM") before
 * anything of the stop, so that the log says why the daemon stops before it
 * says "stopping"; the first starts the stop, the second makes it fast.
 * SIGHUP reloads the configuration, or, under the test hook
 * DSPKD_TEST_EXIT (daemon/teardown.h), takes the exit path under test.
 * The stop sequence itself is here too (dspkd_stop and what follows it).
 *
 * Before the watchers exist, from the first lines of main, a handler that
 * only records SIGTERM/SIGINT/SIGHUP is installed (dspkd_lifecycle_early):
 * blocking them in main is not enough, since a library's constructor may
 * have started a thread before main ran (with the default mask), and the
 * kernel gives a process's signal to any thread that does not block it.
 * Once the watchers are started, what was recorded is raised again for
 * them.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/lifecycle.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/sched.h"
#include "daemon/teardown.h"

static struct {
  bool started;
  uv_signal_t term, intr, hup;
  int stops; /* SIGTERM + SIGINT received */
} s;

/* ---- before the watchers: record, act later ------------------------------ */

/* What the recording handler saw (any thread: a library's thread created
 * before main blocked these signals takes them as readily as main). */
static volatile sig_atomic_t early_term, early_int, early_hup;

static void early_record(int signum) {
  if (signum == SIGTERM)
    early_term++;
  else if (signum == SIGINT)
    early_int++;
  else
    early_hup++;
}

void dspkd_lifecycle_early(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = early_record;
  sigfillset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

int dspkd_lifecycle_early_seen(void) {
  return (int)(early_term + early_int + early_hup);
}

/* Called once libuv's watchers own the signals: each signal the recording
 * handler saw is raised again on this thread (which blocks them until main
 * unblocks them right after), so the watchers act on it as on any other
 * delivery; two or more stop signals count as a second one (the fast stop). */
static void early_replay(void) {
  int stops = (int)(early_term + early_int);
  if (stops > 1)
    s.stops += stops - 1;
  if (early_term)
    raise(SIGTERM);
  else if (early_int)
    raise(SIGINT);
  if (early_hup)
    raise(SIGHUP);
  early_term = early_int = early_hup = 0;
}

static void on_stop_signal(uv_signal_t *h, int signum) {
  struct dspkd *d = h->data;
  dspkd_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
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

int dspkd_reload(struct dspkd *d, char *msg, size_t msglen) {
  struct timespec ts;
  char note[96];
  int err;
  /* systemd's reload protocol: RELOADING=1 (with the monotonic time), then
   * READY=1 once done, whether the new file was taken or refused, with a
   * STATUS= that says which. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  snprintf(note, sizeof note, "RELOADING=1\nMONOTONIC_USEC=%llu",
           (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
  dspkd_notify_send(note);
  err = dspkd_config_reload(d, msg, msglen);
  /* The allow lists admit a peer at its connection and for as long as it
   * stays connected: one the new lists refuse is closed now. */
  if (err == 0) {
    dspkd_admin_reloaded(d);
    dspkd_conn_reloaded(d);
  }
  dspkd_notify_reloaded(d, err >= 0);
  return err;
}

static void on_hup(uv_signal_t *h, int signum) {
  struct dspkd *d = h->data;
  (void)signum;
#ifdef DSPK_TEST_HOOKS
  if (dspkd_test_exit_on_hup(d))
    return;
#endif
  if (d->stopping) {
    dspkd_info("SIGHUP during the stop: not reloading");
    return;
  }
  dspkd_info("SIGHUP: reloading the configuration");
  dspkd_reload(d, NULL, 0);
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
  early_replay();
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
  /* libuv put the default action back with the last watcher: a thread
   * that does not block these signals (a library's) would end the process
   * by it.  Recorded instead, and left unacted on: the teardown goes on. */
  dspkd_lifecycle_early();
}

/* ---- the stop sequence ------------------------------------------------- */

/* The orderly stop, in one place: stop accepting (conn.c closes the
 * listener and removes the socket), refuse what was read but not started,
 * have the scheduler answer every queued job ESHUTDOWN, let running jobs
 * finish within the grace period (then cancel them; close what is still
 * open GRACE_FLUSH_MS later), close each connection once it is owed
 * nothing, then have the scheduler stop and join the runners, and close the
 * loop's handles. */

/* The grace timer fires twice: at the deadline it cancels what still runs
 * (each client then gets ECANCELED before its connection closes); if
 * connections remain GRACE_FLUSH_MS later (a task that ignores its cancel
 * flag, a client that stopped reading its answers) it closes them. */
#define GRACE_FLUSH_MS 2000

static void on_grace(uv_timer_t *t) {
  struct dspkd *d = t->data;
  if (!d->grace_expired) {
    size_t tasks = 0, conns = 0;
    d->grace_expired = true;
    /* Said as it is: the tasks that still run, if any (a connection can
     * also be open only for answers its client does not read). */
    for (struct conn *c = d->conns; c; c = c->next) {
      conns++;
      for (struct job *j = c->jobs; j; j = j->cnext)
        tasks++;
    }
    if (tasks)
      dspkd_warn("%zu task%s still running at the stop deadline: canceling %s", tasks,
                 tasks == 1 ? "" : "s", tasks == 1 ? "it" : "them");
    else if (conns)
      dspkd_info("no task running at the stop deadline; %zu connection%s still open (answers "
                 "not yet read by their clients): closed in %d ms if still open",
                 conns, conns == 1 ? "" : "s", GRACE_FLUSH_MS);
    dspkd_sched_cancel_all(d, NULL);
    uv_timer_start(&d->grace_timer, on_grace, GRACE_FLUSH_MS, 0);
    return;
  }
  {
    /* Said as it is (probe 22 F3): connections whose client is still
     * there, and tasks that still run for clients already gone (a raw
     * kernel runs to its end; the process exits once they end). */
    size_t open = 0, orphans = 0;
    for (struct conn *c = d->conns; c; c = c->next) {
      if (!c->closing)
        open++;
      else
        for (struct job *j = c->jobs; j; j = j->cnext)
          orphans++;
    }
    if (open)
      dspkd_warn("connections still open %d ms after the deadline: closing them",
                 GRACE_FLUSH_MS);
    if (orphans)
      dspkd_warn("%zu task%s of closed connections still running %d ms after the deadline "
                 "(%s not stopped by its cancel): the daemon exits when %s",
                 orphans, orphans == 1 ? "" : "s", GRACE_FLUSH_MS,
                 orphans == 1 ? "it is" : "they are", orphans == 1 ? "it ends" : "they end");
  }
  /* A job.end still waiting for its job's connections, closed here, is
   * answered first (with them its answer would be lost). */
  dspkd_jobs_answer_ends(d);
  for (struct conn *c = d->conns, *next; c; c = next) {
    next = c->next;
    dspkd_conn_ref(c);
    /* Every request gets its answer: a task still running now (its work
     * did not look at the cancel flag) is answered ECANCELED here, and its
     * own result, when it comes, is dropped with the connection.  In the
     * words of a cancel (task.cancel, sched.c): "the task was canceled" of
     * a task.run, "the request was canceled" of a buffer request. */
    for (struct job *j = c->jobs; j; j = j->cnext) {
      atomic_store(&j->cancel, 1);
      dspkd_conn_send_error(c, j->msgid, DSPK_ECANCELED,
                            j->kind == JOB_TASK
                                ? "the daemon is stopping: " DSPKD_MSG_CANCELED
                                : "the daemon is stopping: the request was canceled");
    }
    dspkd_conn_close(c, "daemon stopping");
    dspkd_conn_unref(c);
  }
}

void dspkd_stop(struct dspkd *d) {
  if (d->stopping)
    return;
  d->stopping = true;
  dspkd_info("stopping");
  dspkd_notify_stopping(d);
  dspkd_listen_stop(d);
  for (struct conn *c = d->conns; c; c = c->next) {
    dspkd_conn_refuse_buffered(c);
    dspkd_conn_update_read(c);
  }
  dspkd_sched_drop(d, NULL, DSPK_ESHUTDOWN);
  dspkd_trace_stop_all(d); /* answered now, before the connections close */
  uv_timer_start(&d->grace_timer, on_grace, d->cfg.shutdown_timeout_ms, 0);
  dspkd_stop_progress(d);
}

void dspkd_stop_now(struct dspkd *d) {
  if (!d->stopping || d->grace_expired || d->handles_closed)
    return;
  uv_timer_start(&d->grace_timer, on_grace, 0, 0);
}

void dspkd_stop_progress(struct dspkd *d) {
  if (!d->stopping)
    return;
  for (struct conn *c = d->conns, *next; c; c = next) {
    next = c->next;
    /* Not yet one owed an answer (a job.end waiting for its job's
     * connections): it is closed once that answer is written. */
    if (c->closing || c->jobs || c->owed)
      continue;
    if (c->unsent == 0) {
      dspkd_conn_close(c, "daemon stopping");
    } else if (!c->close_after_flush) {
      c->close_after_flush = true;
      dspkd_conn_update_read(c);
    }
  }
  if (d->nconns == 0 && !d->runners_stopped) {
    d->runners_stopped = true;
    dspkd_sched_stop(d);
  }
  if (d->runners_stopped && !d->handles_closed && dspkd_sched_join(d, false)) {
    d->handles_closed = true;
    dspkd_conn_handles_close(d);
    uv_close((uv_handle_t *)&d->done_async, NULL);
    uv_close((uv_handle_t *)&d->grace_timer, NULL);
  }
}
