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
/* 1 when the double v becomes a finite f32 when rounded to nearest (ties
 * to even), as (float)v does: |v| < 2^128 - 2^103, the midpoint between
 * FLT_MAX and 2^128 (a tie rounds up, to an infinity, as FLT_MAX's last
 * bit is odd); also 1 for infinities and NaN, which are f32 values too.
 * 0 for a finite v that would become an infinity. */
int dspk__f64_fits_f32(double v);
/* The shortest decimal form of v that reads back as v (as Python's repr:
 * 1e+39, not 9.9999999999999994e+38), in buf; returns buf. */
const char *dspk__f64_text(double v, char *buf, size_t len);

#endif /* DSPK_PROTO_DTYPE_H */
