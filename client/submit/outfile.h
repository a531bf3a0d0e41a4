/*
 * Output files of dspk-submit, replaced whole or not at all.
 *
 * An output that is a regular file, a symbolic link to one (followed to its
 * final target, however many links deep) or a path that does not exist yet
 * is written to a temporary file in the target's directory, flushed to disk
 * and renamed over the target only once complete.  A failed write (a full
 * disk, ulimit -f, an error of the daemon after the file was opened) leaves
 * the old file and any link to it as they were, and the temporary is
 * removed.  A new file gets the mode a plain open(2) would have given it
 * (0666 less the umask); a replaced one keeps its mode (and, where the
 * process may set them, its owner and group).  Anything else (standard
 * output as "-", a FIFO, a terminal, a character device) is written
 * directly, as it cannot be replaced by a rename; a link to an open
 * descriptor (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) is
 * written through that descriptor, at its offset, whatever it is open on.
 * An existing file that the rename could not replace (a sticky directory,
 * /tmp, where neither it nor the directory is the caller's) is refused
 * when opened (EPERM), before any work.  A signal whose
 * default action ends the process and that can be caught (SIGINT, SIGTERM,
 * SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGVTALRM, SIGPROF,
 * SIGXCPU, SIGXFSZ, SIGIO, SIGPWR, SIGSYS, SIGABRT, the faults, the
 * real-time signals), at its default disposition, while a temporary is
 * open removes it before the process dies of the signal.
 */
#ifndef DSPK_CLIENT_SUBMIT_OUTFILE_H
#define DSPK_CLIENT_SUBMIT_OUTFILE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct dspk__outfile {
  int fd;       /* where to write; -1 once closed */
  char *target; /* the final path when fd is a temporary, else NULL */
  char *tmp;    /* the temporary's path, else NULL */
  bool to_stdout; /* fd writes to standard output (-, /dev/stdout...) */
} dspk__outfile;

/* The dspk code for errno e of opening or creating a file by its path,
 * the one rule of every input and output (cli.md ARRAYS): DSPK_ENOENT when
 * the path leads to no file (ENOENT, ENOTDIR: a part of it is not a
 * directory, ELOOP: a loop of symbolic links, ENAMETOOLONG), DSPK_EPERM
 * when access is refused (EACCES, EPERM, EROFS), DSPK_EIO otherwise. */
int dspk__path_code(int e);

/* Opens path for writing ("-": standard output, which is never closed
 * here).  Returns 0, or a negative dspk code (dspk__path_code's, or
 * DSPK_EPERM for a file the rename could not replace) with strerror's
 * text in err; nothing is left open or created on failure. */
int dspk__outfile_open(dspk__outfile *o, const char *path, char *err,
                       size_t errlen);

/* Writes n bytes of buf to o (retrying short writes and EINTR).  Returns 0,
 * or -1 with errno set. */
int dspk__outfile_write(dspk__outfile *o, const void *buf, size_t n);

/* Completes what was written: a temporary is closed (not synced) and
 * renamed over its target; a direct output is closed.  Returns 0, or
 * DSPK_EIO (DSPK_EPERM, DSPK_ENOENT for a refused rename, as for open)
 * with strerror's text in err, the temporary removed and the
 * target untouched.  o is closed either way. */
int dspk__outfile_commit(dspk__outfile *o, char *err, size_t errlen);

/* Abandons what was written: closes o and removes its temporary, leaving
 * the target as it was.  Accepts an o already committed or abandoned. */
void dspk__outfile_abort(dspk__outfile *o);

/* 1 when the output paths a and b write to one file however spelled
 * ("-" and /dev/stdout; k.npy, ./k.npy, a link to it, a hard link; a
 * file not there yet by its directory and name), else 0. */
int dspk__outfile_same(const char *a, const char *b);

/* Standard descriptors (0, 1, 2) that were closed when the command started:
 * main.c holds each open on /dev/null meanwhile, so that no file or socket
 * takes it, and marks it here.  A path that names one ("-", /dev/stdin,
 * /dev/stdout, /dev/fd/0, ...) is then a descriptor that is not open
 * (DSPK_ENOENT), as cli.md says, not the placeholder's empty input or
 * refused write. */
void dspk__std_mark_closed(int fd);
bool dspk__std_closed(int fd);

/* The name messages give standard descriptor fd, however the command line
 * named it: "<stdin>", "<stdout>", "<stderr>" (fd 0, 1, 2). */
const char *dspk__std_name(int fd);

/* For an input path: the descriptor of this process it names, "-" (0) or
 * a link to one followed as outputs follow it (/dev/stdin, /dev/fd/N,
 * /proc/self/fd/N); -1 for any other path. */
int dspk__fd_alias(const char *path);

/* The signals above (every one that can be caught and whose default action
 * ends the process, the real-time ones included) into *set: what any state
 * to undo before dying (a temporary, the terminal of top) must handle. */
void dspk__fatal_signals(sigset_t *set);

#endif /* DSPK_CLIENT_SUBMIT_OUTFILE_H */
