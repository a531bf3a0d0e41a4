/*
 * dspkd's log (daemon/log.h): formats one line into a stack buffer and
 * writes it to stderr with a single write, so lines of the loop thread and
 * of the device runners never interleave.
 *
 * A log write never blocks the caller (the loop serves every client): it is
 * made non-blocking (a socket, the journal's stream: MSG_DONTWAIT; a pipe,
 * a FIFO or a terminal: a descriptor of its own opened on it with
 * O_NONBLOCK, so that the flag reaches no other process; a regular file
 * takes writes at once).  What the reader does not take now waits in a
 * queue of LOG_QUEUE bytes, in order, and a thread of its own ("dspk-log",
 * started at the first such wait) writes it as the reader takes it; a line
 * that finds the queue full is dropped and counted, and once the queue
 * has drained a warning says how many were ("N log lines dropped").  At
 * exit the queue is given up to LOG_EXIT_MS to drain.
 *
 * Client-caused lines (dspkd_log_client_ok): at most LOG_CLIENT_BURST a
 * minute per uid, in a table of LOG_CLIENT_UIDS uids (the least recent
 * one's summary is written when another needs its slot).
 *
 * A daemon that detached (no --foreground) keeps a stderr that is a
 * regular file; any other (the caller's pipe or terminal, which would
 * keep `$(dspkd)` or an ssh session waiting until it exits) is replaced by
 * a datagram socket to syslog's /dev/log, or /dev/null where there is none
 * (dspkd_log_detached).
 *
 * Whether stderr is the journal is decided once, at the first line: systemd
 * sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it connected, and
 * only when stderr's fstat(2) matches both is the line written with a
 * "<N>" syslog priority prefix (systemd.exec(5), sd-daemon(3)); a
 * JOURNAL_STREAM inherited by a dspkd whose stderr was redirected
 * elsewhere keeps the terminal format.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/utf8.h"

#define NLEVELS 5

static atomic_int log_level = DSPKD_INFO;
static const char *const level_names[NLEVELS] = {"error", "warn", "notice", "info", "debug"};
/* syslog(3) priorities: LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO, LOG_DEBUG. */
static const int level_prio[NLEVELS] = {3, 4, 5, 6, 7};

static pthread_once_t sink_once = PTHREAD_ONCE_INIT;
static bool to_journal;
/* Detached with stderr not a file: lines go to syslog's /dev/log as
 * "<N>dspkd[PID]: text" (dspkd_log_detached). */
static atomic_bool to_devlog;

/* How a line is written without blocking: send(MSG_DONTWAIT) on a socket,
 * write() on sink_fd (stderr itself for a regular file or when no
 * non-blocking descriptor could be had, else one opened with O_NONBLOCK). */
static bool sink_socket;
static int sink_fd = STDERR_FILENO;

#define LOG_QUEUE ((size_t)256 << 10) /* bytes of lines waiting for the reader */
#define LOG_EXIT_MS 2000              /* at exit, how long the queue may drain */

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;     /* the writer: work */
static pthread_cond_t q_empty = PTHREAD_COND_INITIALIZER;  /* the queue drained */
static char q_buf[LOG_QUEUE];  /* a ring: q_len bytes from q_head */
static size_t q_head, q_len;
static uint64_t q_dropped;     /* lines dropped since the last warning */
static pid_t q_writer_pid;     /* the process whose writer thread runs (0: none) */

static void sink_detect(void) {
  const char *e = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;
  char tail;

  if (fstat(STDERR_FILENO, &st) != 0)
    return;
  if (S_ISSOCK(st.st_mode)) {
    sink_socket = true;
  } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    /* A description of its own: O_NONBLOCK on stderr's would reach every
     * process sharing it (a terminal's shell, a pipe's other writers). */
    int fd = open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0)
      sink_fd = fd;
  }
  if (!e || sscanf(e, "%llu:%llu%c", &dev, &ino, &tail) != 2)
    return;
  to_journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* One non-blocking write of p[0..n): the bytes taken, 0 when none could be
 * now, -1 on an error (the line is then given up, as before). */
static ssize_t sink_write(const char *p, size_t n) {
  ssize_t w;
  do
    w = sink_socket ? send(STDERR_FILENO, p, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                    : write(sink_fd, p, n);
  while (w < 0 && errno == EINTR);
  if (w < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
  return w;
}

/* Appends p[0..n) to the queue (q_mu held); false when it does not fit. */
static bool q_push(const char *p, size_t n) {
  if (n > LOG_QUEUE - q_len)
    return false;
  for (size_t i = 0; i < n; i++)
    q_buf[(q_head + q_len + i) % LOG_QUEUE] = p[i];
  q_len += n;
  return true;
}

/* Writes what the reader takes now from the queue (q_mu held); -1 when the
 * sink failed (the queue is then given up). */
static int q_drain(void) {
  while (q_len) {
    size_t run = q_len < LOG_QUEUE - q_head ? q_len : LOG_QUEUE - q_head;
    ssize_t w = sink_write(q_buf + q_head, run);
    if (w <= 0) {
      if (w < 0) {
        q_len = 0;
        return -1;
      }
      return 0;
    }
    q_head = (q_head + (size_t)w) % LOG_QUEUE;
    q_len -= (size_t)w;
  }
  q_head = 0;
  return 0;
}

static size_t format_line(char *line, size_t cap, enum dspkd_level level, const char *msg);

static void *writer_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&q_mu);
  for (;;) {
    while (!q_len && !q_dropped)
      pthread_cond_wait(&q_cv, &q_mu);
    if (q_drain() == 0 && q_len) {
      /* The reader is behind: wait until it takes more (without the lock,
       * so that other threads queue or drop meanwhile). */
      struct pollfd pf = {.fd = sink_socket ? STDERR_FILENO : sink_fd, .events = POLLOUT};
      pthread_mutex_unlock(&q_mu);
      (void)poll(&pf, 1, 1000);
      pthread_mutex_lock(&q_mu);
      continue;
    }
    if (!q_len && q_dropped) {
      char msg[160], line[256];
      snprintf(msg, sizeof msg, "%llu log line%s dropped: the log's reader did not keep up "
               "(docs/admin.md, \"Logs\")", (unsigned long long)q_dropped, dspk__s(q_dropped));
      q_dropped = 0;
      size_t n = format_line(line, sizeof line, DSPKD_WARN, msg);
      if (n)
        (void)q_push(line, n);
      continue;
    }
    pthread_cond_broadcast(&q_empty);
  }
  return NULL;
}

/* Gives the queue up to LOG_EXIT_MS to drain (atexit: the last lines,
 * "stopped" among them). */
static void q_flush_at_exit(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += LOG_EXIT_MS / 1000;
  ts.tv_nsec += (LOG_EXIT_MS % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&q_mu);
  while ((q_len || q_dropped) && q_writer_pid == getpid())
    if (pthread_cond_timedwait(&q_empty, &q_mu, &ts) != 0)
      break;
  pthread_mutex_unlock(&q_mu);
}

/* Writes one whole line without blocking: at once when nothing waits and
 * the reader takes it, else queued behind what waits (or dropped and
 * counted when the queue is full). */
static void sink_line(const char *line, size_t n) {
  static bool exit_hook;
  pthread_mutex_lock(&q_mu);
  if (!q_len && !q_dropped) {
    ssize_t w = sink_write(line, n);
    if (w < 0 || (size_t)w == n) {
      pthread_mutex_unlock(&q_mu);
      return; /* written, or a failed write of a log line: given up */
    }
    line += w;
    n -= (size_t)w;
  }
  if (!q_push(line, n))
    q_dropped++;
  if (q_writer_pid != getpid()) { /* none yet (or a forked child) */
    pthread_t th;
    pthread_attr_t a;
    if (pthread_attr_init(&a) == 0) {
      pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
      if (pthread_create(&th, &a, writer_main, NULL) == 0) {
        pthread_setname_np(th, "dspk-log");
        q_writer_pid = getpid();
        if (!exit_hook)
          exit_hook = atexit(q_flush_at_exit) == 0;
      }
      pthread_attr_destroy(&a);
    }
  }
  pthread_cond_signal(&q_cv);
  pthread_mutex_unlock(&q_mu);
}

void dspkd_log_detached(void) {
  struct sockaddr_un a = {.sun_family = AF_UNIX, .sun_path = "/dev/log"};
  struct stat st;
  bool ok;
  int s;

  pthread_once(&sink_once, sink_detect);
  if (fstat(STDERR_FILENO, &st) == 0 && S_ISREG(st.st_mode))
    return; /* a log file: kept */
  s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ok = s >= 0 && connect(s, (const struct sockaddr *)&a, sizeof a) == 0;
  if (!ok) {
    dspkd_log(DSPKD_WARN, "detached: no syslog socket at /dev/log (%s): log lines are dropped "
              "from now on (run dspkd with --foreground under a supervisor, or with stderr "
              "a file)", strerror(errno));
    if (s >= 0)
      close(s);
    s = open("/dev/null", O_WRONLY | O_CLOEXEC);
  }
  pthread_mutex_lock(&q_mu);
  q_head = q_len = 0; /* lines still waiting were for the caller's stream */
  if (s >= 0) {
    dup2(s, STDERR_FILENO);
    close(s);
  }
  if (sink_fd != STDERR_FILENO)
    close(sink_fd);
  sink_fd = STDERR_FILENO;
  sink_socket = ok;
  atomic_store(&to_devlog, ok);
  pthread_mutex_unlock(&q_mu);
}

void dspkd_log_set_level(enum dspkd_level level) { atomic_store(&log_level, (int)level); }

int dspkd_log_parse_level(const char *s, enum dspkd_level *out) {
  for (int i = 0; i < NLEVELS; i++) {
    if (strcmp(s, level_names[i]) == 0) {
      *out = (enum dspkd_level)i;
      return 0;
    }
  }
  return -1;
}

int dspkd_log_enabled(enum dspkd_level level) {
  return (int)level <= atomic_load(&log_level);
}

/* The line of msg at level, prefixed and cleaned, with its newline, into
 * line (cap bytes, at least 64); its length (0: nothing to write). */
static size_t format_line(char *line, size_t cap, enum dspkd_level level, const char *msg) {
  /* Each byte of msg (at most 1023) becomes at most 3 here: a two-byte
   * character written as \uNNNN (dspk__one_line), or an ill-formed byte
   * kept by dspk__one_line and made U+FFFD. */
  char folded[3 * 1024], valid[3 * 1024];
  size_t n, v;
  int h;

  if (atomic_load(&to_devlog))
    h = snprintf(line, cap, "<%d>dspkd[%ld]: ", level_prio[level], (long)getpid());
  else if (to_journal)
    h = snprintf(line, cap, "<%d>", level_prio[level]);
  else
    h = snprintf(line, cap, "dspkd[%ld]: %s: ", (long)getpid(), level_names[level]);
  if (h < 0 || (size_t)h >= cap)
    return 0;
  /* A line's text is cleaned as an answer's message is (client text quoted
   * in either is the same): one line (dspk__one_line: the lines joined with
   * "; ", each other control character a space, each character that prints
   * as nothing \uNNNN, so that no client's bidirectional control reorders
   * an admin's view of the line), then valid UTF-8 (each ill-formed byte
   * U+FFFD), so that journald stores it as text. */
  n = dspk__one_line(folded, msg);
  v = dspk__utf8_sanitized_len(folded, n);
  dspk__utf8_sanitize(valid, folded, n);
  v = dspk__utf8_cut(valid, v, cap - 1 - (size_t)h);
  memcpy(line + h, valid, v);
  n = (size_t)h + v;
  line[n++] = '\n';
  return n;
}

void dspkd_log(enum dspkd_level level, const char *fmt, ...) {
  char msg[1024], line[3 * sizeof msg + 64];
  size_t n;
  va_list ap;

  if (!dspkd_log_enabled(level))
    return;
  if ((int)level < 0 || (int)level >= NLEVELS)
    level = DSPKD_ERROR;
  pthread_once(&sink_once, sink_detect);
  va_start(ap, fmt);
  if (dspk__vformat(msg, sizeof msg, fmt, ap) < 0)
    msg[0] = '\0';
  va_end(ap);
  n = format_line(line, sizeof line, level, msg);
  if (n)
    sink_line(line, n);
}

/* ---- client-caused lines -------------------------------------------------- */

#define LOG_CLIENT_BURST 10   /* lines per uid and minute */
#define LOG_CLIENT_UIDS 64    /* uids followed at once */
#define LOG_CLIENT_WINDOW_MS 60000

static pthread_mutex_t cl_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  long uid;
  bool used;
  uint64_t start;      /* the minute's first line, ms */
  unsigned lines;      /* written in it */
  uint64_t suppressed; /* not written in it */
} cl[LOG_CLIENT_UIDS];

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The summary of slot i's minute, when it held back lines (cl_mu held). */
static void cl_summary(int i) {
  if (cl[i].suppressed)
    dspkd_log(DSPKD_NOTICE, "uid %ld: %llu more line%s about its clients' requests %s not "
              "logged in the minute after %u were (at most %d a minute per uid)", cl[i].uid,
              (unsigned long long)cl[i].suppressed, dspk__s(cl[i].suppressed),
              cl[i].suppressed == 1 ? "was" : "were", cl[i].lines, LOG_CLIENT_BURST);
  cl[i].suppressed = 0;
}

bool dspkd_log_client_ok_at(long uid, enum dspkd_level level, uint64_t now_ms) {
  int i, free_i = -1, oldest = -1;
  bool ok;

  if (!dspkd_log_enabled(level))
    return false; /* not written anyway: not counted */
  pthread_mutex_lock(&cl_mu);
  for (i = 0; i < LOG_CLIENT_UIDS; i++) {
    if (cl[i].used && now_ms - cl[i].start >= LOG_CLIENT_WINDOW_MS) {
      cl_summary(i); /* its minute is over */
      cl[i].used = false;
    }
    if (cl[i].used && cl[i].uid == uid)
      break;
    if (!cl[i].used && free_i < 0)
      free_i = i;
    if (cl[i].used && (oldest < 0 || cl[i].start < cl[oldest].start))
      oldest = i;
  }
  if (i == LOG_CLIENT_UIDS) {
    i = free_i >= 0 ? free_i : oldest;
    if (free_i < 0)
      cl_summary(i); /* its slot is taken by another uid: told now */
    cl[i].used = true;
    cl[i].uid = uid;
    cl[i].start = now_ms;
    cl[i].lines = 0;
    cl[i].suppressed = 0;
  }
  ok = cl[i].lines < LOG_CLIENT_BURST;
  if (ok) {
    cl[i].lines++;
  } else if (cl[i].suppressed++ == 0) {
    dspkd_log(DSPKD_NOTICE, "uid %ld: more than %d lines about its clients' requests in a "
              "minute: the rest of the minute's are counted, not logged", uid,
              LOG_CLIENT_BURST);
  }
  pthread_mutex_unlock(&cl_mu);
  return ok;
}

bool dspkd_log_client_ok(long uid, enum dspkd_level level) {
  return dspkd_log_client_ok_at(uid, level, mono_ms());
}

void dspkd_log_client_flush(void) {
  pthread_mutex_lock(&cl_mu);
  for (int i = 0; i < LOG_CLIENT_UIDS; i++)
    if (cl[i].used)
      cl_summary(i);
  pthread_mutex_unlock(&cl_mu);
}

const char *dspkd_log_value(char *dst, size_t cap, const char *s, size_t n) {
  size_t w = 0, i;
  bool bare = n > 0;

  for (i = 0; i < n && bare; i++) {
    unsigned char c = (unsigned char)s[i];
    bare = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != 0 && strchr("_.:/@+,-", c) != NULL);
  }
  if (cap < 3) {
    if (cap)
      dst[0] = '\0';
    return dst;
  }
  if (bare) {
    dspk__utf8_copy(dst, cap, s, n); /* ASCII only: a plain cut */
    return dst;
  }
  /* Quoted: a blank, '=' or ':' inside cannot start another field, nor a
   * '"' end the value early.  '"', '\\' and '=' get a backslash, so that
   * a search for key=value never matches inside a value; what is not
   * well-formed UTF-8 or a control character dspkd_log cleans later. */
  dst[w++] = '"';
  for (i = 0; i < n; i++) {
    char c = s[i] == '\0' ? ' ' : s[i];
    bool esc = c == '"' || c == '\\' || c == '=';
    if (w + (esc ? 2 : 1) + 2 > cap)
      break;
    if (esc)
      dst[w++] = '\\';
    dst[w++] = c;
  }
  /* A cut inside a character leaves an ill-formed tail: dspkd_log makes it
   * U+FFFD. */
  dst[w++] = '"';
  dst[w] = '\0';
  return dst;
}

bool dspkd_log_client_mistake(int code, bool client_code) {
  switch (code) {
  case DSPK_EINVAL:
  case DSPK_EPROTO:
  case DSPK_ELIMIT:
  case DSPK_ENOMETHOD:
  case DSPK_ENODEV:
  case DSPK_EDTYPE:
  case DSPK_ESHAPE:
  case DSPK_ENOBUF:
  case DSPK_ERANGE:
  case DSPK_EPERM:
  case DSPK_ENOTSUP:
  case DSPK_ENOENT:
  case DSPK_EVERSION:
    return true;
  case DSPK_ECOMPILE: /* a user's kernel: its mistake; a built-in shader: ours */
    return client_code;
  default:
    return false;
  }
}

enum dspkd_level dspkd_log_fail_level(int code, bool client_code) {
  if (dspkd_log_client_mistake(code, client_code))
    return DSPKD_DEBUG;
  switch (code) {
  case DSPK_ECANCELED:
  case DSPK_ESHUTDOWN:
  case DSPK_ECLOSED:
    return DSPKD_INFO;
  case DSPK_ENOMEM:
  case DSPK_EBUSY:
    return DSPKD_WARN;
  default: /* EDEVICE, EIO, EINTERNAL, ETIMEDOUT, ECOMPILE, anything unknown */
    return DSPKD_ERROR;
  }
}

bool dspkd_log_client_line_ok(long uid, enum dspkd_level level) {
  /* Debug lines are not limited (docs/admin.md): they are off unless asked. */
  if (level == DSPKD_DEBUG)
    return dspkd_log_enabled(DSPKD_DEBUG);
  return dspkd_log_client_ok(uid, level);
}

void dspkd_log_task_failed(long uid, const char *device, const char *op, uint64_t client,
                           long pid, int code, bool client_code, const char *msg) {
  char dv[2 * DSPKD_LOG_VALUE_MAX + 3], ov[2 * DSPKD_LOG_VALUE_MAX + 3];
  enum dspkd_level level = dspkd_log_fail_level(code, client_code);
  if (!dspkd_log_client_line_ok(uid, level))
    return;
  /* device and op are the daemon's names, but quoted all the same when not
   * a plain token, so that no name can add or shadow fields. */
  if (!device || !*device)
    device = "-";
  if (!op || !*op)
    op = "-";
  dspkd_log(level,
            "task failed: device=%s op=%s client=%" PRIu64 " pid=%ld: %s: %s",
            dspkd_log_value(dv, sizeof dv, device, strnlen(device, DSPKD_LOG_VALUE_MAX)),
            dspkd_log_value(ov, sizeof ov, op, strnlen(op, DSPKD_LOG_VALUE_MAX)), client, pid,
            dspk__err_name(code), msg && *msg ? msg : dspk__strerror(code));
}
