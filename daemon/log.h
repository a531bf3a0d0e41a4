/*
 * dspkd's log: one line per event on stderr.  On a terminal or a file each
 * line is prefixed with the daemon's name, pid and severity
 * ("dspkd[42]: warn: ...").  When stderr is the systemd journal (the
 * JOURNAL_STREAM variable names stderr's device and inode, see
 * systemd.exec(5)), each line instead starts with its syslog priority,
 * "<3>" for an error, "<4>" warn, "<5>" notice, "<6>" info, "<7>" debug,
 * which journald stores as the entry's PRIORITY (name and pid it records
 * itself), so `journalctl -p err` finds the errors.  Every line is cleaned
 * as an answer's message is (dspk__one_line, then each ill-formed UTF-8
 * byte U+FFFD), so an event is always one line of valid UTF-8 whatever
 * client text it quotes.  Only daemon/
 * logs; the libraries it calls return codes and messages and the daemon
 * decides, once, at the boundary, what to log.  Thread-safe: one write
 * per line, which never blocks the caller: what the log's reader (the
 * journal, a pipe) does not take at once waits in a bounded queue that a
 * thread of the log writes from, and a line that finds it full is dropped
 * and counted (a warning says how many once it drains).  So a stalled log
 * never stalls the daemon's loop.
 *
 * Lines a client causes (its failed requests, refusals, protocol errors:
 * whatever a client can repeat at will) are written through
 * dspkd_log_client_ok(), at most 10 a minute per uid, so that no user can
 * flood the log (or use up journald's rate limit, after which the
 * daemon's own errors would be dropped too).
 */
#ifndef DSPKD_LOG_H
#define DSPKD_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dspkd_level {
  DSPKD_ERROR = 0,  /* something the administrator must look at */
  DSPKD_WARN = 1,   /* degraded, or likely to fail later */
  DSPKD_NOTICE = 2, /* normal but significant: a refused admin request */
  DSPKD_INFO = 3,
  DSPKD_DEBUG = 4
};

/* Called once a detached daemon is ready: a stderr that is not a regular
 * file (the starter's pipe or terminal) is given back, log lines going to
 * syslog's /dev/log from then on (to nowhere, after one warning, where it
 * is missing). */
void dspkd_log_detached(void);
/* Sets the most verbose level that is written (default DSPKD_INFO). */
void dspkd_log_set_level(enum dspkd_level level);
/* Parses "error", "warn", "notice", "info" or "debug"; 0 and *out, or -1
 * when unknown. */
int dspkd_log_parse_level(const char *s, enum dspkd_level *out);
/* Returns 1 when messages of this level are written. */
int dspkd_log_enabled(enum dspkd_level level);
/* Writes one line (printf format, no trailing newline needed). */
void dspkd_log(enum dspkd_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether a line that uid's client caused, at level, may be written now:
 * true for the first 10 such lines of each uid in a minute (from its
 * first), false after (counted: the first one held back writes a notice
 * that the rest of the minute's are counted, and the minute's count is
 * written as a notice once it is over, when a later client line of any
 * uid, or dspkd_log_client_flush, comes).  A level not written at all is
 * not counted.  Thread-safe.  _at takes the monotonic time in ms. */
bool dspkd_log_client_ok(long uid, enum dspkd_level level);
bool dspkd_log_client_ok_at(long uid, enum dspkd_level level, uint64_t now_ms);
/* Writes the counts of lines held back so far (at the daemon's stop). */
void dspkd_log_client_flush(void);

/* The one rule of whose fault a failed request is, which every method's
 * log line follows (docs/admin.md "Logs"): true when its error is the
 * client's own mistake, which its answer tells it: EINVAL, EPROTO, ELIMIT,
 * ENOMETHOD, ENODEV, EDTYPE, ESHAPE, ENOBUF, ERANGE, EPERM, ENOTSUP, ENOENT,
 * EVERSION, and ECOMPILE when the source that did not compile is the
 * client's (client_code: a raw kernel; a built-in op's shader that does not
 * compile is the daemon's failure).  False for the failures of the daemon
 * or a device, resource pressure, cancellations and the stop. */
bool dspkd_log_client_mistake(int code, bool client_code);

/* The level a failed request (a task or any other method) is logged at, by
 * its error code: the client's own mistakes (dspkd_log_client_mistake) at
 * debug; cancellations and the stop (ECANCELED, ESHUTDOWN, ECLOSED) at
 * info; resource pressure (ENOMEM, EBUSY) at warn (a refusal by the
 * client's own per-user bound is debug whatever its code: struct req's
 * own_limit, daemon/conn.c); errors of the daemon or
 * a device (EDEVICE, EIO, EINTERNAL, ETIMEDOUT, a built-in op's ECOMPILE,
 * unknown codes) at error.  docs/systemd.md has the table. */
enum dspkd_level dspkd_log_fail_level(int code, bool client_code);

/* Whether a line about uid's client at level is written now: a debug line
 * whenever debug is on (never limited), a line above debug when
 * dspkd_log_client_ok lets it. */
bool dspkd_log_client_line_ok(long uid, enum dspkd_level level);

/* The one line of a task that failed after it reached its device (ran,
 * or was queued there):
 *   task failed: device=cpu:0 op=gemm client=3 pid=1234: EDEVICE: message
 * at dspkd_log_fail_level(code, client_code), when
 * dspkd_log_client_line_ok(uid) lets it (uid: its client's).  device is
 * the device it reached ("-" when NULL); device and op are written by
 * dspkd_log_value (quoted unless a plain token).  A task.run refused
 * before it reached a device is logged as any other failed request, by
 * daemon/conn.c ("client N: task.run #ID: ECODE: message"). */
void dspkd_log_task_failed(long uid, const char *device, const char *op, uint64_t client,
                           long pid, int code, bool client_code, const char *msg);

/* A client's string (s[0..n)) as a log field's value or a quoted name: as
 * it is when it is a plain token (letters, digits and _.:/@+,-), else in
 * double quotes, with a backslash before each '"', '\\' and '=' inside (a
 * NUL a blank), so that it can neither end early nor add or shadow a
 * key=value field, nor match a search for one.  Cut to fit cap (> 0); the
 * rest of the cleaning (valid UTF-8, control characters) is dspkd_log's,
 * for every line.  Returns dst.  A cap of 2 * DSPKD_LOG_VALUE_MAX + 3 holds
 * any value of up to DSPKD_LOG_VALUE_MAX bytes whole. */
#define DSPKD_LOG_VALUE_MAX 64
const char *dspkd_log_value(char *dst, size_t cap, const char *s, size_t n);

#define dspkd_error(...) dspkd_log(DSPKD_ERROR, __VA_ARGS__)
#define dspkd_warn(...) dspkd_log(DSPKD_WARN, __VA_ARGS__)
#define dspkd_notice(...) dspkd_log(DSPKD_NOTICE, __VA_ARGS__)
#define dspkd_info(...) dspkd_log(DSPKD_INFO, __VA_ARGS__)
#define dspkd_debug(...)                                                       \
  do {                                                                         \
    if (dspkd_log_enabled(DSPKD_DEBUG))                                        \
      dspkd_log(DSPKD_DEBUG, __VA_ARGS__);                                     \
  } while (0)

#endif /* DSPKD_LOG_H */
