/*
 * dtype helpers derived from the one table in include/dspk/types.h: item
 * size, wire name, complexness, and the name lookup.  Shared by the wire
 * codec, the client library, the daemon and the backends (proto/dtype.c).
 */
#ifndef DSPK_PROTO_DTYPE_H
#define DSPK_PROTO_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
/*
 * A client's number as a message names it (docs/protocol.md, "Malformed
 * input"), the one rule of every message that echoes one:
 * - an integer (kind UINT or INT) in exact decimal ("18446744073709551615",
 *   "-1"; a double holds only 53 bits, so it is kept as sent);
 * - a float (kind FLOAT, or NONE: a value not from the wire, a double) as
 *   Python's repr writes it: the fewest significant digits (at most 17; 9
 *   when f32, a msgpack float32) that read back as the same value (as a
 *   float when f32), positional with ".0" after an integral value when
 *   1e-4 <= |v| < 1e16 ("0.1", "1.0", "1000.0", "-0.0", "0.0001"), else in
 *   exponent form, at least two exponent digits ("1e+16", "1.5e-05",
 *   "1e+300"); "inf", "-inf", "nan".
 */
enum dspk__num_kind { DSPK__NUM_NONE, DSPK__NUM_FLOAT, DSPK__NUM_UINT, DSPK__NUM_INT };
struct dspk__num_sent {
  enum dspk__num_kind kind;
  bool f32; /* FLOAT: a msgpack float32 */
  union { double f; uint64_t u; int64_t i; } v;
};
/* The float v by the rule above into buf (at most n bytes); returns buf. */
const char *dspk__float_str(char *buf, size_t n, double v, bool f32);
/* The number *s by the rule above into buf; NONE is the double f, written
 * as a float. Returns buf. */
const char *dspk__num_str(char *buf, size_t n, const struct dspk__num_sent *s);

#endif /* DSPK_PROTO_DTYPE_H */
