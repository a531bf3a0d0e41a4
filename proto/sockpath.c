/*
 * Socket addresses as text (sockpath.h): the '@' rule of the abstract
 * namespace for every client and the daemon's log, and the explanation of
 * a socket path that is there but is no socket, one text for the
 * library's dspk_connect() and for dspk-submit's ECONNECT line.
 */
#include "sockpath.h"

#include <stddef.h>
#include <string.h>
#include <sys/stat.h>

#include "dspk/errors.h"
#include "utf8.h"

int dspk__sockaddr_parse(const char *spec, struct sockaddr_un *sa, socklen_t *len, char *why,
                         size_t cap) {
  size_t n = strlen(spec);
  char shown[512];

  if (n == 0)
    return dspk__fail(why, cap, DSPK_EINVAL, "socket path is empty");
  if (spec[0] == '@' && n == 1)
    return dspk__fail(why, cap, DSPK_EINVAL,
                      "abstract socket name after '@' is empty (@NAME names an abstract "
                      "socket)");
  if (n > DSPK__SOCKET_TEXT_MAX) {
    if (spec[0] != '@')
      return dspk__fail(why, cap, DSPK_ELIMIT, "socket path longer than %zu bytes",
                        DSPK__SOCKET_TEXT_MAX);
    dspk__utf8_visible(shown, sizeof shown, spec, n > 200 ? 200 : n);
    return dspk__fail(why, cap, DSPK_ELIMIT,
                      "abstract socket %s%s longer than %zu bytes with its '@' (%zu bytes)",
                      shown, n > 200 ? "..." : "", DSPK__SOCKET_TEXT_MAX, n);
  }
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (spec[0] == '@') {
    /* sun_path[0] stays NUL; the name's bytes follow, and the length ends
     * the address (no NUL after it: systemd binds @name so). */
    memcpy(sa->sun_path + 1, spec + 1, n - 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  } else {
    memcpy(sa->sun_path, spec, n + 1);
    *len = (socklen_t)sizeof *sa;
  }
  return 0;
}

const char *dspk__sockaddr_show(char *dst, size_t cap, const struct sockaddr_un *sa,
                                socklen_t len) {
  size_t off = offsetof(struct sockaddr_un, sun_path), n;
  char name[sizeof sa->sun_path + 1];

  n = len > off ? (size_t)len - off : 0;
  if (n > sizeof sa->sun_path)
    n = sizeof sa->sun_path;
  if (n == 0) {
    dst[0] = '\0';
    return dst;
  }
  if (sa->sun_path[0] != '\0')
    return dspk__utf8_visible(dst, cap, sa->sun_path, strnlen(sa->sun_path, n));
  /* Abstract: '@' for the leading NUL and for each NUL in the name. */
  for (size_t i = 0; i < n; i++)
    name[i] = sa->sun_path[i] ? sa->sun_path[i] : '@';
  return dspk__utf8_visible(dst, cap, name, n);
}

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
