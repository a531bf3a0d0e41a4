/*
 * dspk error table.
 *
 * One X-macro yields the C enum of the public API, the names and messages
 * returned by dspk_strerror()/dspk_err_name(), and the codes sent on the wire
 * in error maps {code, name, message}.  The daemon, the client library and the
 * CLI all use this table, so they never disagree.  Codes are negative; 0 is
 * success.  A code's value never changes once released: append new ones.
 */
#ifndef DSPK_ERRORS_H
#define DSPK_ERRORS_H

/* XX(name, value, message) */
#define DSPK_ERRNO_MAP(XX)                                                     \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(EPROTO, -3, "protocol error")                                             \
  XX(ELIMIT, -4, "limit exceeded")                                             \
  XX(ENOMETHOD, -5, "unknown method")                                          \
  XX(ENODEV, -6, "no such device")                                             \
  XX(EDTYPE, -7, "unsupported dtype")                                          \
  XX(ESHAPE, -8, "shape mismatch")                                             \
  XX(ENOBUF, -9, "no such buffer")                                             \
  XX(ERANGE, -10, "out of range")                                              \
  XX(ECANCELED, -11, "task canceled")                                          \
  XX(ESHUTDOWN, -12, "daemon shutting down")                                   \
  XX(EPERM, -13, "permission denied")                                          \
  XX(EIO, -14, "i/o error")                                                    \
  XX(ECLOSED, -15, "connection closed")                                        \
  XX(ECONNECT, -16, "cannot connect to daemon")                                \
  XX(EDEVICE, -17, "device error")                                             \
  XX(ECOMPILE, -18, "kernel compilation failed")                               \
  XX(ENOTSUP, -19, "operation not supported")                                  \
  XX(EBUSY, -20, "resource busy")                                              \
  XX(ETIMEDOUT, -21, "timed out")                                              \
  XX(ENOENT, -22, "not found")                                                 \
  XX(EVERSION, -23, "protocol version mismatch")                               \
  XX(EINTERNAL, -24, "internal error")

typedef enum dspk_errno {
#define DSPK__ERR_ENUM(name, val, msg) DSPK_##name = (val),
  DSPK_ERRNO_MAP(DSPK__ERR_ENUM)
#undef DSPK__ERR_ENUM
  DSPK__ERR_LAST = -25 /* one below the last; not an error code */
} dspk_errno;

#endif /* DSPK_ERRORS_H */
