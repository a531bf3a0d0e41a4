/*
 * What a socket path that names something other than a socket is, in the
 * words the client library's dspk_connect() and dspk-submit both use
 * ("/tmp/x is a regular file, not a socket"), so that the two never
 * explain the same mistake differently.  Pure: the caller stats the path.
 */
#ifndef DSPK_PROTO_SOCKPATH_H
#define DSPK_PROTO_SOCKPATH_H

#include <stddef.h>
#include <sys/types.h>

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
