/*
 * systemd notifications for dspkd (daemon/notify.h).
 *
 * STATUS= follows the daemon without polling an idle one: a uv_check handle
 * runs after every loop iteration that did something, computes the line and
 * sends it when it changed; sends are at least STATUS_MIN_MS apart, and a
 * change inside that window arms a one-shot timer for the rest of it so the
 * last state is never lost.  The watchdog timer fires every half of
 * WATCHDOG_USEC from the loop itself: a loop stuck in a callback stops the
 * pings.  During the stop a timer keeps sending EXTEND_TIMEOUT_USEC= (systemd
 * wants it repeated within each interval) until the grace period plus
 * STOP_ALLOWANCE_MS has passed; after that systemd's own timeout applies.
 * None of these handles keeps the loop alive (uv_unref).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef DSPKD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "daemon/log.h"
#include "daemon/sched.h"
#include "daemon/notify.h"

#define STATUS_MIN_MS 250          /* at most four STATUS= lines a second */
#define STOP_TICK_MS 1000          /* EXTEND_TIMEOUT_USEC= cadence during the stop */
#define STOP_EXTEND_USEC 5000000   /* each extension: 5 s from now */
#define STOP_ALLOWANCE_MS 30000    /* teardown time granted beyond the grace */

static struct {
  bool on;           /* $NOTIFY_SOCKET is set */
  bool started;
  uv_check_t check;
  uv_timer_t status_timer;
  uv_timer_t watchdog;
  uv_timer_t stop_timer;
  bool watchdog_on, stop_on;
  uint64_t last_status_ms; /* the last time STATUS= was computed */
  uint64_t stop_deadline_ms;
  char last[256];
  struct dspkd *d;
} n;

/* ---- sending -------------------------------------------------------------- */

#ifndef DSPKD_HAVE_SYSTEMD
/* The datagram protocol of sd_notify(3): one message to the AF_UNIX socket
 * named by $NOTIFY_SOCKET (a path, or '@' for the abstract namespace). */
static int send_builtin(const char *msg) {
  const char *e = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa;
  socklen_t salen;
  size_t len;
  ssize_t w;
  int fd;

  if (!e || !*e)
    return 0;
  len = strlen(e);
  if ((e[0] != '/' && e[0] != '@') || len >= sizeof sa.sun_path)
    return DSPK_EINVAL;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, e, len);
  if (e[0] == '@')
    sa.sun_path[0] = '\0';
  salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (e[0] == '/'));
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return DSPK_EIO;
  w = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
  close(fd);
  return w == (ssize_t)strlen(msg) ? 1 : DSPK_EIO;
}
#endif

int dspkd_notify_send(const char *msg) {
#ifdef DSPKD_HAVE_SYSTEMD
  int r = sd_notify(0, msg);
  return r > 0 ? 1 : r == 0 ? 0 : DSPK_EIO;
#else
  return send_builtin(msg);
#endif
}

/* Reads the watchdog interval: > 0 when systemd expects pings (the
 * interval in microseconds), else 0. */
static uint64_t watchdog_usec(void) {
#ifdef DSPKD_HAVE_SYSTEMD
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
#else
  const char *u = getenv("WATCHDOG_USEC"), *p = getenv("WATCHDOG_PID");
  char *end;
  unsigned long long v;
  if (!u || !*u)
    return 0;
  if (p && *p && strtol(p, NULL, 10) != (long)getpid())
    return 0;
  errno = 0;
  v = strtoull(u, &end, 10);
  return errno || *end ? 0 : (uint64_t)v;
#endif
}

/* ---- STATUS= ------------------------------------------------------------- */

static void status_line(struct dspkd *d, char *buf, size_t len) {
  uint64_t queued = 0, running = 0;
  int open = 0;

  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    uint64_t q, r, c, f;
    struct dspk__devstats s;
    if (dev->open_state != 1 || dev->joined)
      continue;
    open++;
    dspkd_sched_counters(dev, &q, &r, &c, &f, &s);
    queued += q;
    running += r;
  }
  /* Fail-closed (daemon/jobstate.c) is for the daemon's whole life and
   * takes every GPU from a connection without a job: systemctl status shows
   * it, not only the journal's one error line. */
  snprintf(buf, len, "STATUS=%s%s%d device%s, %zu client%s, %llu task%s running, %llu queued",
           d->stopping ? "stopping: " : "",
           d->jobs_fail_closed ? "Slurm jobs' state file refused, cpu only without a "
                                 "registered job: " : "",
           open, open == 1 ? "" : "s", d->nconns,
           d->nconns == 1 ? "" : "s", (unsigned long long)running, running == 1 ? "" : "s",
           (unsigned long long)queued);
}

static void status_update(struct dspkd *d, bool force) {
  char line[sizeof n.last];
  uint64_t now = uv_now(d->loop);

  n.last_status_ms = now;
  status_line(d, line, sizeof line);
  if (!force && strcmp(line, n.last) == 0)
    return;
  memcpy(n.last, line, sizeof line);
  dspkd_notify_send(line);
}

static void on_status_timer(uv_timer_t *t) {
  (void)t;
  status_update(n.d, false);
}

static void on_check(uv_check_t *h) {
  uint64_t now = uv_now(n.d->loop);
  (void)h;
  if (now - n.last_status_ms < STATUS_MIN_MS) {
    /* Rate limit: look again when the window ends. */
    if (!uv_is_active((uv_handle_t *)&n.status_timer))
      uv_timer_start(&n.status_timer, on_status_timer,
                     STATUS_MIN_MS - (now - n.last_status_ms), 0);
    return;
  }
  status_update(n.d, false);
}

/* ---- watchdog and stop ---------------------------------------------------- */

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  dspkd_notify_send("WATCHDOG=1");
}

static void on_stop_tick(uv_timer_t *t) {
  char msg[64];
  if (uv_now(n.d->loop) >= n.stop_deadline_ms) {
    uv_timer_stop(t);
    return;
  }
  snprintf(msg, sizeof msg, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)STOP_EXTEND_USEC);
  dspkd_notify_send(msg);
}

int dspkd_notify_start(struct dspkd *d) {
  const char *e = getenv("NOTIFY_SOCKET");
  uint64_t wd;

  n.d = d;
  n.on = e && *e;
  if (!n.on || n.started)
    return 0;
  uv_check_init(d->loop, &n.check);
  uv_timer_init(d->loop, &n.status_timer);
  uv_timer_init(d->loop, &n.watchdog);
  uv_timer_init(d->loop, &n.stop_timer);
  uv_unref((uv_handle_t *)&n.check);
  uv_unref((uv_handle_t *)&n.status_timer);
  uv_unref((uv_handle_t *)&n.watchdog);
  uv_unref((uv_handle_t *)&n.stop_timer);
  n.started = true;
  wd = watchdog_usec();
  if (wd > 0) {
    uint64_t ms = wd / 2000;
    if (ms == 0)
      ms = 1;
    dspkd_info("systemd watchdog: pinging every %llu ms", (unsigned long long)ms);
    uv_timer_start(&n.watchdog, on_watchdog, ms, ms);
    n.watchdog_on = true;
  }
  return 0;
}

void dspkd_notify_ready(struct dspkd *d) {
  char msg[320];
  if (!n.started)
    return;
  status_line(d, n.last, sizeof n.last);
  snprintf(msg, sizeof msg, "READY=1\nMAINPID=%ld\n%s", (long)getpid(), n.last);
  if (dspkd_notify_send(msg) < 0)
    dspkd_warn("cannot notify systemd (NOTIFY_SOCKET=%s)", getenv("NOTIFY_SOCKET"));
  n.last_status_ms = uv_now(d->loop);
  uv_check_start(&n.check, on_check);
}

void dspkd_notify_reloaded(struct dspkd *d, bool ok) {
  char msg[320], line[sizeof n.last];
  if (!ok) {
    dspkd_notify_send("READY=1\nSTATUS=configuration reload failed: running with the "
                      "previous one (see the log)");
    return;
  }
  status_line(d, line, sizeof line);
  if (n.started) {
    /* The plain line: the next change of the counts replaces this one. */
    memcpy(n.last, line, sizeof line);
    n.last_status_ms = uv_now(d->loop);
  }
  /* Says that the file was taken (dspkd(8), SYSTEMD), as a refused one's
   * says it was not; line is "STATUS=...". */
  snprintf(msg, sizeof msg, "READY=1\nSTATUS=configuration reloaded: %s", line + 7);
  dspkd_notify_send(msg);
}

void dspkd_notify_extend(uint64_t usec) {
  char msg[64];
  if (!n.started)
    return;
  snprintf(msg, sizeof msg, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
  dspkd_notify_send(msg);
}

void dspkd_notify_stopping(struct dspkd *d) {
  char msg[384], line[sizeof n.last];
  uint64_t allow_ms;
  if (!n.started || n.stop_on)
    return;
  status_line(d, line, sizeof line);
  memcpy(n.last, line, sizeof line);
  n.last_status_ms = uv_now(d->loop);
  allow_ms = d->cfg.shutdown_timeout_ms + STOP_ALLOWANCE_MS;
  snprintf(msg, sizeof msg, "STOPPING=1\n%s\nEXTEND_TIMEOUT_USEC=%llu", line,
           (unsigned long long)(d->cfg.shutdown_timeout_ms + 10000) * 1000);
  dspkd_notify_send(msg);
  n.stop_deadline_ms = uv_now(d->loop) + allow_ms;
  uv_timer_start(&n.stop_timer, on_stop_tick, STOP_TICK_MS, STOP_TICK_MS);
  n.stop_on = true;
}

void dspkd_notify_close(struct dspkd *d) {
  (void)d;
  if (!n.started)
    return;
  n.started = false;
  uv_close((uv_handle_t *)&n.check, NULL);
  uv_close((uv_handle_t *)&n.status_timer, NULL);
  uv_close((uv_handle_t *)&n.watchdog, NULL);
  uv_close((uv_handle_t *)&n.stop_timer, NULL);
}
