/*
 * dspk's socket addresses as text, one rule for every client (the library's
 * dspk_connect(), dspk-submit) and the daemon's log: a leading '@' names the
 * abstract namespace (systemd's ListenStream=@name, as ss(8) prints it),
 * anything else a file path.  And what a socket path that names something
 * other than a socket is, in the words the library and dspk-submit both use
 * ("/tmp/x is a regular file, not a socket"), so that the two never explain
 * the same mistake differently.  Pure: the caller stats the path.
 */
#ifndef DSPK_PROTO_SOCKPATH_H
#define DSPK_PROTO_SOCKPATH_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* The longest socket given as text, in bytes: sun_path (108) less one,
 * the path's terminating NUL or, for "@name", the NUL that starts an
 * abstract address (so an abstract name has at most 106 bytes). */
#define DSPK__SOCKET_TEXT_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

/* The address of the socket spec names: "@name" an abstract socket (the
 * address a NUL and name's bytes, without a trailing NUL, as systemd binds
 * ListenStream=@name), else the file path spec.  On success fills *sa and
 * *len (the length to pass to connect(2)) and returns 0; else leaves them
 * and returns DSPK_EINVAL for an empty spec ("socket path is empty") or a
 * lone "@" ("abstract socket name after '@' is empty"), DSPK_ELIMIT for
 * one longer than DSPK__SOCKET_TEXT_MAX bytes ("socket path longer than
 * 107 bytes", "abstract socket @NAME longer than 107 bytes with its '@'"),
 * the reason written into why (cap > 0). */
int dspk__sockaddr_parse(const char *spec, struct sockaddr_un *sa, socklen_t *len, char *why,
                         size_t cap);

/* Whether spec names an abstract socket (starts with '@'). */
static inline int dspk__sock_is_abstract(const char *spec) { return spec && spec[0] == '@'; }

/* Writes the text of an address that getsockname(2) or accept(2) gave
 * (len its length) into dst (cap > 0): its path; "@name" for an abstract
 * one, a NUL inside the name written as '@' as ss(8) does, the other bytes
 * as dspk__utf8_visible shows them; "" for an unnamed one.  Returns dst. */
const char *dspk__sockaddr_show(char *dst, size_t cap, const struct sockaddr_un *sa,
                                socklen_t len);

/* The kind of file that st_mode m describes, with its article: "a
 * directory", "a FIFO", "a regular file", "a character device", "a block
 * device", "a socket" or "a file of another kind".  A static string. */
const char *dspk__file_kind(mode_t m);

/* Writes "PATH is KIND, not a socket" into dst (cap > 0, cut by
 * dspk__format's rule), PATH as dspk__utf8_visible shows the n bytes of
 * path (a newline or an escape sequence in it is written as an escape, so
 * the message stays one line), KIND as dspk__file_kind(m).  Returns dst. */
const char *dspk__not_socket(char *dst, size_t cap, const char *path, size_t n, mode_t m);

#endif
