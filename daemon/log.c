/*
 * dspkd's log (daemon/log.h): formats one line into a stack buffer and
 * writes it to stderr with a single write(2), so lines of the loop thread
 * and of the device runners never interleave.
 *
 * Whether stderr is the journal is decided once, at the first line: systemd
 * sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it connected, and
 * only when stderr's fstat(2) matches both is the line written with a
 * "<N>" syslog priority prefix (systemd.exec(5), sd-daemon(3)); a
 * JOURNAL_STREAM inherited by a dspkd whose stderr was redirected
 * elsewhere keeps the terminal format.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

static void sink_detect(void) {
  const char *e = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;
  char tail;

  if (!e || sscanf(e, "%llu:%llu%c", &dev, &ino, &tail) != 2)
    return;
  if (fstat(STDERR_FILENO, &st) != 0)
    return;
  to_journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
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

void dspkd_log(enum dspkd_level level, const char *fmt, ...) {
  char msg[1024], folded[2 * sizeof msg], valid[3 * sizeof folded], line[3 * sizeof msg + 64];
  size_t n;
  int h;
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
  if (to_journal)
    h = snprintf(line, sizeof line, "<%d>", level_prio[level]);
  else
    h = snprintf(line, sizeof line, "dspkd[%ld]: %s: ", (long)getpid(), level_names[level]);
  if (h < 0)
    return;
  /* A line's text is cleaned as an answer's message is (client text quoted
   * in either is the same): one line (dspk__one_line: the lines joined with
   * "; ", each other control character a space), then valid UTF-8 (each
   * ill-formed byte U+FFFD), so that journald stores it as text. */
  n = dspk__one_line(folded, msg); /* at most twice strlen(msg) */
  size_t v = dspk__utf8_sanitized_len(folded, n); /* at most 3 n */
  dspk__utf8_sanitize(valid, folded, n);
  v = dspk__utf8_cut(valid, v, sizeof line - 1 - (size_t)h);
  memcpy(line + h, valid, v);
  n = (size_t)h + v;
  line[n++] = '\n';
  /* One write per line; a short or failed write of a log line is ignored. */
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;
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

enum dspkd_level dspkd_log_task_level(int code) {
  switch (code) {
  case DSPK_ECANCELED:
  case DSPK_ESHUTDOWN:
  case DSPK_ECLOSED:
    return DSPKD_INFO;
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
  case DSPK_ECOMPILE:
  case DSPK_ENOTSUP:
  case DSPK_ENOENT:
  case DSPK_EVERSION:
    return DSPKD_NOTICE;
  case DSPK_ENOMEM:
  case DSPK_EBUSY:
    return DSPKD_WARN;
  default: /* EDEVICE, EIO, EINTERNAL, ETIMEDOUT, anything unknown */
    return DSPKD_ERROR;
  }
}

void dspkd_log_task_failed(const char *device, const char *op, uint64_t client,
                           long pid, int code, const char *msg) {
  char dv[2 * DSPKD_LOG_VALUE_MAX + 3], ov[2 * DSPKD_LOG_VALUE_MAX + 3];
  /* device and op may be what the client sent (a request refused before it
   * reached a device): quoted when not a plain token, so that they cannot
   * add or shadow fields. */
  if (!device || !*device)
    device = "-";
  if (!op || !*op)
    op = "-";
  dspkd_log(dspkd_log_task_level(code),
            "task failed: device=%s op=%s client=%" PRIu64 " pid=%ld: %s: %s",
            dspkd_log_value(dv, sizeof dv, device, strnlen(device, DSPKD_LOG_VALUE_MAX)),
            dspkd_log_value(ov, sizeof ov, op, strnlen(op, DSPKD_LOG_VALUE_MAX)), client, pid,
            dspk__err_name(code), msg && *msg ? msg : dspk__strerror(code));
}
