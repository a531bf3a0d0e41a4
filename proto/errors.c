/*
 * The error table's strings: names and messages of the codes in
 * include/dspk/errors.h, used by the daemon (error maps on the wire), the
 * client library (dspk_strerror) and the CLI.
 */
#include <string.h>

#include "proto/codec.h"

const char *dspk__err_name(int code) {
  switch (code) {
#define XX(name, val, msg) case val: return #name;
    DSPK_ERRNO_MAP(XX)
#undef XX
  case 0: return "OK";
  default: return "EUNKNOWN";
  }
}

const char *dspk__strerror(int code) {
  switch (code) {
#define XX(name, val, msg) case val: return msg;
    DSPK_ERRNO_MAP(XX)
#undef XX
  case 0: return "success";
  default: return "unknown error";
  }
}

int dspk__err_from_name(const char *name, size_t len) {
#define XX(n, val, msg)                                                        \
  if (len == sizeof(#n) - 1 && memcmp(name, #n, len) == 0)                     \
    return val;
  DSPK_ERRNO_MAP(XX)
#undef XX
  return DSPK_EINTERNAL;
}
