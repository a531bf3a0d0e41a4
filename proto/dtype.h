/*
 * dtype helpers derived from the one table in include/dspk/types.h: item
 * size, wire name, complexness, and the name lookup.  Shared by the wire
 * codec, the client library, the daemon and the backends (proto/dtype.c).
 */
#ifndef DSPK_PROTO_DTYPE_H
#define DSPK_PROTO_DTYPE_H

#include <stddef.h>

#include "dspk/types.h"

/* Bytes per element; 0 for a value outside the table. */
size_t dspk__dtype_size(dspk_dtype dt);
/* 1 for c64/c128, else 0. */
int dspk__dtype_is_complex(dspk_dtype dt);
/* The wire name ("f32"); "?" for a value outside the table. */
const char *dspk__dtype_name(dspk_dtype dt);
/* Returns 0 and writes *out, or DSPK_EDTYPE for an unknown name. */
int dspk__dtype_from_name(const char *name, size_t len, dspk_dtype *out);

#endif /* DSPK_PROTO_DTYPE_H */
