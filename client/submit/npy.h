/*
 * Reading and writing numpy .npy files for dspk-submit.
 *
 * Only what the daemon computes on is accepted: little-endian (or '|')
 * f2/f4/f8/c8/c16 arrays in C order, format versions 1.0, 2.0 and 3.0.
 * The header is parsed by a strict, bounded parser (a small subset of a
 * Python dict literal); anything else (Fortran order, big-endian data,
 * structured or integer dtypes, a data size that does not match the file
 * length) is refused with a message that names the file.  No part of this
 * module prints: errors come back as a negative dspk code plus one line of
 * text in a caller-supplied buffer.
 */
#ifndef DSPK_CLIENT_SUBMIT_NPY_H
#define DSPK_CLIENT_SUBMIT_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "dspk/types.h"

/* Longest header (the dict text) accepted on reading.  numpy itself refuses
 * headers above 10000 bytes by default; anything this module writes is far
 * below that. */
#define DSPK__NPY_MAX_HEADER 65536

/* One array in memory.  data is owned by the struct (free with
 * dspk__npy_free) and holds nbytes = count * itemsize bytes, C order.
 * map is NULL, or the read-only mapping of the file that data points
 * into (dspk__npy_view), with the file still open as map_fd, so that its
 * data can be sent from the file (dspk_file_data). */
typedef struct dspk__npy {
  dspk_dtype dtype;
  int rank;
  uint64_t shape[DSPK_MAX_RANK];
  uint64_t count;  /* product of shape (1 for a scalar) */
  size_t nbytes;
  void *data;
  void *map;
  size_t map_len;
  int map_fd; /* with map: the file, open read-only (closed by dspk__npy_free) */
} dspk__npy;

/* Where the bytes of a .npy image come from, for the message that says
 * what to give instead when they are a zip archive (an .npz): a file named
 * as one .npy (or an image in memory), a stream read to its end (standard
 * input, a pipe, a device), or a member of an .npz. */
typedef enum dspk__npy_from {
  DSPK__NPY_FROM_FILE,
  DSPK__NPY_FROM_STREAM,
  DSPK__NPY_FROM_MEMBER
} dspk__npy_from;

/* Header fields as parsed from the text of a .npy header. */
typedef struct dspk__npy_header {
  dspk_dtype dtype;
  int rank;
  uint64_t shape[DSPK_MAX_RANK];
} dspk__npy_header;

/* Parses the dict text of a .npy header (txt, len bytes, not necessarily
 * NUL-terminated).  Returns 0 and fills *out, or a negative dspk code
 * (DSPK_EINVAL for a malformed header, DSPK_EDTYPE for an unsupported
 * dtype, DSPK_ENOTSUP for fortran_order True, DSPK_ELIMIT for a rank above
 * DSPK_MAX_RANK) and writes one line into err (errlen bytes, may be 0). */
int dspk__npy_parse_header(const char *txt, size_t len, dspk__npy_header *out,
                           char *err, size_t errlen);

/* Parses a whole .npy image held in memory (buf, len bytes).  Returns 0 and
 * fills *out with a freshly allocated copy of the data (caller frees with
 * dspk__npy_free), or a negative dspk code with a message in err; name is
 * used in messages (a path, or "<memory>"). */
int dspk__npy_load_mem(const void *buf, size_t len, const char *name,
                       dspk__npy *out, char *err, size_t errlen);

/* Reads the .npy file at path.  Returns 0 and fills *out (caller frees with
 * dspk__npy_free), or a negative dspk code (DSPK_ENOENT if the file is
 * missing, DSPK_EIO on read errors, else as dspk__npy_load_mem) with a
 * message naming the file in err. */
int dspk__npy_load(const char *path, dspk__npy *out, char *err, size_t errlen);

/* Like dspk__npy_load, but a large regular file is mapped read-only
 * instead of read: data points into the mapping, must not be written, and
 * stays valid until dspk__npy_free (callers free it before anything may
 * rewrite the file, e.g. an output of the same name; a file that another
 * process truncates meanwhile makes reading the view fault, which a
 * command-line tool reading its own inputs accepts).  The mapping is not
 * populated: only the header's page is read here, the data is meant to be
 * sent from map_fd.  Small files and anything that cannot be mapped take
 * dspk__npy_load's path.  Same returns and messages as dspk__npy_load. */
int dspk__npy_view(const char *path, dspk__npy *out, char *err, size_t errlen);

/* Writes an array as a version 1.0 .npy file (2.0 if the header would not
 * fit), with the data starting at a 64-byte boundary like numpy does.
 * shape has rank entries; data holds product(shape) * itemsize bytes and
 * stays owned by the caller.  Returns 0, or a negative dspk code with a
 * message naming the file in err.  A regular file (or a link to one, or a
 * new path) is written through a temporary renamed over it once complete
 * (outfile.h): on failure the old file stays as it was and nothing is left
 * behind; a device or FIFO is written directly. */
int dspk__npy_save(const char *path, dspk_dtype dtype, int rank,
                   const uint64_t *shape, const void *data, char *err,
                   size_t errlen);

/* Builds the complete header (magic, version, length, dict text, padding)
 * that dspk__npy_save writes, into a malloc'd buffer the caller frees.
 * Returns its length (> 0) in *len and 0, or a negative dspk code. */
int dspk__npy_header_build(dspk_dtype dtype, int rank, const uint64_t *shape,
                           unsigned char **out, size_t *len);

/* Like dspk__npy_load_mem, but takes ownership of buf (malloc'd, len
 * bytes): the data is moved to its start and kept, no copy is made.  buf
 * is freed on failure.  from says where the bytes came from (for the
 * message about a zip archive found instead of a .npy). */
int dspk__npy_adopt(void *buf, size_t len, const char *name, dspk__npy_from from,
                    dspk__npy *out, char *err, size_t errlen);

/* Reads one whole .npy image from the file descriptor fd (a pipe: read to
 * its end) and parses it; name is used in messages ("<stdin>").  Same
 * returns as dspk__npy_load_mem; DSPK_EIO when reading fails. */
int dspk__npy_load_fd(int fd, const char *name, dspk__npy *out, char *err,
                      size_t errlen);

/* Writes an array as .npy (the header dspk__npy_header_build makes, then
 * the data) to the file descriptor fd, e.g. standard output.  Returns 0 or
 * a negative dspk code with a message in err (a write error: strerror's
 * text alone, for the caller to prefix with the name of what fd is). */
int dspk__npy_write_fd(int fd, dspk_dtype dtype, int rank,
                       const uint64_t *shape, const void *data, char *err,
                       size_t errlen);

/* Reads the array named member (NULL: the only one) from the numpy .npz
 * archive at path (numpy.savez, stored, or numpy.savez_compressed,
 * deflated; read with libzip).  member is the name given to savez, the
 * archive entry is member + ".npy" (an entry called exactly member is
 * accepted too).  Returns 0 and fills *out, or a negative dspk code
 * (DSPK_ENOENT for a missing file or member, DSPK_EINVAL for a damaged
 * archive, else as dspk__npy_load_mem) with a message naming the file and
 * member in err. */
int dspk__npz_load(const char *path, const char *member, dspk__npy *out,
                   char *err, size_t errlen);

/* Loads a command-line input: "-" is a .npy on standard input,
 * "FILE.npz:NAME" the array NAME of an archive, "FILE.npz" its only
 * array, anything else a .npy file (mapped when large, dspk__npy_view). */
int dspk__npy_input(const char *spec, dspk__npy *out, char *err,
                    size_t errlen);

/* The length of the archive's path in an input "FILE.npz:NAME" (the last
 * ".npz:" splits: "a.npz:b.npz:c" is member c of a.npz:b.npz), or 0 when
 * spec names no member of an archive: it holds no ".npz:", or it ends in
 * ".npz" and a file of that whole name is there (the archive alone,
 * "a.npz:b.npz"). */
size_t dspk__npz_path_len(const char *spec);

/* A file name or an .npz member as this module's messages name it: as
 * docs/cli.md says an error line echoes an argument (dspk__utf8_visible:
 * a backslash as \\\\, U+200B as \\u200b, a byte that is not UTF-8 as
 * \\xNN...), in one of 8 rotating buffers of 1 KiB (cut to fit). */
const char *dspk__npy_shown(const char *s);

/* Frees the data of a (accepts NULL and a zeroed struct); a is zeroed. */
void dspk__npy_free(dspk__npy *a);

/* Element size in bytes and the numpy descr ("<f4"...) of a dtype; 0 and
 * NULL for dtypes numpy cannot represent (bf16). */
size_t dspk__npy_itemsize(dspk_dtype dt);
const char *dspk__npy_descr(dspk_dtype dt);

/* 0 when a .npy can hold dtype dt, else DSPK_EDTYPE with the reason in err
 * ("a .npy cannot hold bf16: numpy has no bf16 dtype"). */
int dspk__npy_writable(dspk_dtype dt, char *err, size_t errlen);

#endif /* DSPK_CLIENT_SUBMIT_NPY_H */
