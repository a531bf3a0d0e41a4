/*
 * The explanation of a socket path that is there but is no socket
 * (sockpath.h): one text for the library's dspk_connect() and for
 * dspk-submit's ECONNECT line.
 */
#include "sockpath.h"

#include <sys/stat.h>

#include "utf8.h"

const char *dspk__file_kind(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISREG(m)  ? "a regular file"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "a file of another kind";
}

const char *dspk__not_socket(char *dst, size_t cap, const char *path, size_t n, mode_t m) {
  char shown[512];
  dspk__utf8_visible(shown, sizeof shown, path, n);
  dspk__format(dst, cap, "%s is %s, not a socket", shown, dspk__file_kind(m));
  return dst;
}
