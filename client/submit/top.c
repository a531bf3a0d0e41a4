/*
 * dspk-submit top: a live view of the daemon, one line per device, like
 * nvidia-smi or ollama ps: how busy it was over the last seconds, its
 * memory (what the daemon's pool hands out and keeps cached, of the
 * device's total), the job running now and for how long, the queue, the
 * clients with work on it; then the connected clients.  Everything comes
 * from the `status` method, asked again every --interval seconds.
 *
 * On a terminal the view takes the alternate screen and reads single keys
 * (q quits); the terminal is restored on every way out: q, SIGINT and
 * SIGTERM end the loop, any other signal that ends the process restores it
 * before the death, and Ctrl-Z gives it back to the shell (taken again on
 * SIGCONT).  --once prints one frame and exits, for scripts; --json prints
 * the status answer it reads (one frame's data) as JSON.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/submit/submit.h"

static volatile sig_atomic_t got_signal, resumed;

static void on_signal(int sig) { got_signal = sig; }

/* The terminal as top found it, and what top changed (raw keys, the
 * alternate screen): the handlers below undo it with async-signal-safe
 * calls only (write, tcsetattr). */
static struct termios term_saved;
static volatile sig_atomic_t term_keys, term_screen;

static void term_restore(void) {
  static const char leave[] = "\033[?25h\033[?1049l";
  if (term_screen && write(STDOUT_FILENO, leave, sizeof leave - 1) < 0) {
    /* nothing more to do on the way out */
  }
  if (term_keys)
    tcsetattr(STDIN_FILENO, TCSANOW, &term_saved);
}

/* Raw keys and the alternate screen, as top wants them. */
static void term_setup(void) {
  if (term_keys) {
    struct termios raw = term_saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  }
  if (term_screen) {
    fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, no cursor */
    fflush(stdout);
  }
}

/* Any other signal that ends the process (SIGQUIT from Ctrl-\, SIGHUP...):
 * the terminal restored, then the death by the signal as before. */
static void on_fatal(int sig) {
  term_restore();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Ctrl-Z: the terminal restored for the shell, then stopped; once
 * continued, the main loop sets it up again and redraws (resumed). */
static void on_tstp(int sig) {
  struct sigaction sa;
  sigset_t set;
  int e = errno;
  term_restore();
  signal(sig, SIG_DFL);
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
  raise(sig); /* stops here until SIGCONT */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tstp;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
  resumed = 1;
  errno = e;
}

static void on_cont(int sig) {
  (void)sig;
  resumed = 1; /* also after a SIGSTOP: the shell may have reset the modes */
}

static const char *bytes(uint64_t b, char *buf, size_t cap) {
  static const char *units[] = {"B", "K", "M", "G", "T"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%.1f%s" : "%.0f%s", v, units[u]);
  return buf;
}

static const char *duration(double s, char *buf, size_t cap) {
  if (s < 10)
    snprintf(buf, cap, "%.1fs", s);
  else if (s < 3600)
    snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
  else
    snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)s % 3600 / 60);
  return buf;
}

/* One frame of the view into f. */
static void frame(FILE *f, const dspk_status *s, bool interactive) {
  char up[32], clock[16], mem[3][16], age[32], run[64];
  time_t now = time(NULL);
  struct tm tm;

  localtime_r(&now, &tm);
  strftime(clock, sizeof clock, "%H:%M:%S", &tm);
  fprintf(f, "dspkd %s  pid %lld  up %s  %llu connection%s  %s\n", dspk__sub_esc(s->version),
          (long long)s->pid, duration(s->uptime_s, up, sizeof up),
          (unsigned long long)s->connections, s->connections == 1 ? "" : "s", clock);
  fprintf(f, "\n%-10s %5s  %-22s %6s %7s %8s %6s  %s\n", "DEVICE", "BUSY",
          "MEM USED/CACHED/TOTAL", "QUEUE", "CLIENTS", "DONE", "FAILED", "RUNNING");
  for (size_t i = 0; i < s->ndevices; i++) {
    const dspk_status_device *d = &s->devices[i];
    const dspk_device_activity *a = &s->activity[i];
    char memcol[48];
    snprintf(memcol, sizeof memcol, "%s/%s/%s", bytes(a->memory_in_use, mem[0], sizeof mem[0]),
             bytes(a->memory_cached, mem[1], sizeof mem[1]),
             a->memory ? bytes(a->memory, mem[2], sizeof mem[2]) : "-");
    if (a->running)
      snprintf(run, sizeof run, "%s %s", dspk__sub_esc(a->running_op),
               duration(a->running_age_s, age, sizeof age));
    else
      snprintf(run, sizeof run, "-");
    fprintf(f, "%-10s %4.0f%%  %-22s %6llu %7llu %8llu %6llu  %s\n", dspk__sub_esc(d->id),
            a->busy * 100,
            memcol, (unsigned long long)d->queued, (unsigned long long)a->clients,
            (unsigned long long)d->completed, (unsigned long long)d->failed, run);
  }
  if (s->nclients) {
    fprintf(f, "\n%-8s %-8s %-6s %8s %8s  %s\n", "CLIENT", "PID", "UID", "INFLIGHT", "BUFFERS",
            "NAME");
    for (size_t i = 0; i < s->nclients; i++) {
      const dspk_status_client *c = &s->clients[i];
      fprintf(f, "%-8llu %-8lld %-6lld %8llu %8llu  %s\n", (unsigned long long)c->id,
              (long long)c->pid, (long long)c->uid, (unsigned long long)c->inflight,
              (unsigned long long)c->buffers, dspk__sub_esc(c->name));
    }
  }
  /* As status says it: a non-admin sees its own uid's connections, the
   * rest only as a count. */
  if (s->connections > s->nclients) {
    unsigned long long more = (unsigned long long)(s->connections - s->nclients);
    fprintf(f, "%sand %llu connection%s of other users (not shown)\n",
            s->nclients ? "" : "\n", more, more == 1 ? "" : "s");
  }
  if (interactive)
    fputs("\nq: quit\n", f);
}

/* Draws a frame over the previous one: home, each line cleared to its end,
 * the rest of the screen cleared. */
static void draw(const dspk_status *s) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (!m)
    return;
  frame(m, s, true);
  fclose(m);
  fputs("\033[H", stdout);
  for (char *p = buf, *nl; p && *p; p = nl ? nl + 1 : NULL) {
    nl = strchr(p, '\n');
    fwrite(p, 1, nl ? (size_t)(nl - p) : strlen(p), stdout);
    fputs(nl ? "\033[K\n" : "\033[K", stdout);
  }
  fputs("\033[J", stdout);
  fflush(stdout);
  free(buf);
}

static const struct option top_opts[] = {{"interval", required_argument, NULL, 'n'},
    {"once", no_argument, NULL, '1'},
                                         DSPK__SUB_OPTS_END};
const dspk__sub_optset dspk__sub_top_optsets[] = {
    {"top", ":n:h", top_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

int dspk__sub_top(dspk__sub_ctx *ctx, int argc, char **argv) {
  const struct option *opts = top_opts;
  double interval = 1;
  bool once = false, json = false, keys, screen, seen_interval = false;
  struct sigaction sa, old_int, old_term;
  dspk_status *s = NULL;
  int opt, rc, status = DSPK__SUB_EXIT_OK, write_errno = 0;

  while ((opt = getopt_long(argc, argv, dspk__sub_top_optsets[0].shorts, opts, NULL)) != -1) {
    switch (opt) {
    case 'n':
      if ((rc = dspk__sub_once(ctx, &seen_interval, opt, argv)) != 0)
        return rc;
      if (dspk__sub_parse_double(optarg, &interval) < 0 || !(interval >= 0.1 && interval <= 3600))
        return dspk__sub_usage(ctx, "bad --interval '%s' (want 0.1 to 3600 seconds)",
                               dspk__sub_arg(optarg));
      break;
    case '1':
      once = true;
      break;
    case 'j':
      json = once = true;
      break;
    default:
      return dspk__sub_opt_other(ctx, opt, argv, opts);
    }
  }
  /* Every form writes standard output: the screen, the stream of frames
   * (which would otherwise go on for ever into a closed descriptor), one
   * frame. */
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0 ||
      (rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0)) != 0 ||
      (rc = dspk__sub_connect(ctx)) != 0)
    return rc;
  if (once) {
    rc = dspk_status_get(ctx->client, &s);
    if (rc < 0)
      return dspk__sub_fail_client(ctx, rc);
    if (json) {
      dspk__sub_put(stdout, s->json ? s->json : "{}", DSPK__SUB_ESC_JSON);
      putchar('\n');
    }
    else
      frame(stdout, s, false);
    dspk_status_free(s);
    return DSPK__SUB_EXIT_OK;
  }

  keys = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &term_saved) == 0;
  screen = isatty(STDOUT_FILENO);
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  if (keys || screen) {
    /* Every other way the process can end by a signal restores the
     * terminal first, and job control (Ctrl-Z, fg) gives it back to the
     * shell and takes it again, as less and top(1) do.  Only signals at
     * their default action are taken over (SIGXFSZ is ignored, main.c). */
    sigset_t fatal;
    dspk__fatal_signals(&fatal);
    for (int sig = 1; sig < NSIG; sig++) {
      struct sigaction old, h;
      if (sig == SIGINT || sig == SIGTERM || sigismember(&fatal, sig) != 1 ||
          sigaction(sig, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
          old.sa_handler != SIG_DFL)
        continue;
      memset(&h, 0, sizeof h);
      h.sa_handler = on_fatal;
      sigemptyset(&h.sa_mask);
      sigaction(sig, &h, NULL);
    }
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_tstp;
    sigaction(SIGTSTP, &sa, NULL);
    sa.sa_handler = on_cont;
    sigaction(SIGCONT, &sa, NULL);
  }
  term_keys = keys;
  term_screen = screen;
  term_setup();

  while (!got_signal) {
    struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
    double until;
    if (resumed) {
      resumed = 0;
      term_setup();
    }
    rc = dspk_status_get(ctx->client, &s);
    if (rc < 0)
      break;
    if (screen)
      draw(s);
    else {
      frame(stdout, s, false);
      fputs("\n", stdout);
      /* A frame that cannot be written (a full device) ends the stream,
       * as a failed write ends every command (cli.md, EXIT STATUS): it
       * went on for ever. */
      if (fflush(stdout) != 0 || ferror(stdout))
        write_errno = errno ? errno : EIO;
    }
    dspk_status_free(s);
    s = NULL;
    if (write_errno != 0)
      break;
    until = dspk__sub_now_us() + interval * 1e6;
    for (;;) {
      double left = until - dspk__sub_now_us();
      int n;
      char ch;
      if (left <= 0 || got_signal || resumed)
        break;
      n = poll(&pfd, keys ? 1 : 0, (int)(left / 1000) + 1);
      if (n < 0 && errno != EINTR)
        break;
      if (n > 0 && keys) {
        if (read(STDIN_FILENO, &ch, 1) != 1 || ch == 'q' || ch == 'Q') {
          got_signal = -1;
          break;
        }
        if (ch == ' ' || ch == '\n')
          break; /* refresh now */
      }
    }
  }

  fflush(stdout);
  term_restore();
  term_keys = term_screen = 0;
  if (keys || screen) {
    signal(SIGTSTP, SIG_DFL); /* job control as any process has it again */
    signal(SIGCONT, SIG_DFL);
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (write_errno != 0)
    status = dspk__sub_fail(ctx, DSPK_EIO, "<stdout>: %s", strerror(write_errno));
  else if (rc < 0)
    status = dspk__sub_fail_client(ctx, rc);
  return status;
}
