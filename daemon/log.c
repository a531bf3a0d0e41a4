/*
 * dspkd's log (daemon/log.h): formats one line into a stack buffer and
 * writes it to stderr with a single write(2), so lines of the loop thread
 * and of the device runners never interleave.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"

static atomic_int log_level = DSPKD_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void dspkd_log_set_level(enum dspkd_level level) { atomic_store(&log_level, (int)level); }

int dspkd_log_parse_level(const char *s, enum dspkd_level *out) {
  for (int i = 0; i < 4; i++) {
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
  char line[1024];
  int n, m;
  va_list ap;

  if (!dspkd_log_enabled(level))
    return;
  n = snprintf(line, sizeof line, "dspkd[%ld]: %s: ", (long)getpid(),
               level_names[level]);
  if (n < 0)
    return;
  va_start(ap, fmt);
  m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0)
    m = 0;
  n += m;
  if ((size_t)n > sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  /* One write per line; a short or failed write of a log line is ignored. */
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
