/*
 * dspkd's log: one line per event on stderr, prefixed with the daemon's
 * name, pid and severity ("dspkd[42]: warn: ...").  Only daemon/ logs; the
 * libraries it calls return codes and messages and the daemon decides, once,
 * at the boundary, what to log.  Thread-safe: one write(2) per line.
 */
#ifndef DSPKD_LOG_H
#define DSPKD_LOG_H

enum dspkd_level { DSPKD_ERROR = 0, DSPKD_WARN = 1, DSPKD_INFO = 2, DSPKD_DEBUG = 3 };

/* Sets the most verbose level that is written (default DSPKD_INFO). */
void dspkd_log_set_level(enum dspkd_level level);
/* Parses "error", "warn", "info" or "debug"; 0 and *out, or -1 when unknown. */
int dspkd_log_parse_level(const char *s, enum dspkd_level *out);
/* Returns 1 when messages of this level are written. */
int dspkd_log_enabled(enum dspkd_level level);
/* Writes one line (printf format, no trailing newline needed). */
void dspkd_log(enum dspkd_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define dspkd_error(...) dspkd_log(DSPKD_ERROR, __VA_ARGS__)
#define dspkd_warn(...) dspkd_log(DSPKD_WARN, __VA_ARGS__)
#define dspkd_info(...) dspkd_log(DSPKD_INFO, __VA_ARGS__)
#define dspkd_debug(...)                                                       \
  do {                                                                         \
    if (dspkd_log_enabled(DSPKD_DEBUG))                                        \
      dspkd_log(DSPKD_DEBUG, __VA_ARGS__);                                     \
  } while (0)

#endif /* DSPKD_LOG_H */
