/*
 * Numbers of a dtype as text: the result line of dspk-submit shows each value
 * in the fewest significant digits that read back as the same value of its
 * dtype, as numpy's repr does ("%.7g" showed an f32 1/3 as 0.3333333, which
 * reads back as another f32).  Kept apart from the commands so tests/cli can
 * unit-test it.
 */
#ifndef DSPK_CLIENT_SUBMIT_NUMFMT_H
#define DSPK_CLIENT_SUBMIT_NUMFMT_H

#include <stdbool.h>
#include <stddef.h>

#include "dspk/dspk.h"

/* Writes v (a value of dtype dt: f16, bf16, f32 or f64; c64 and c128 mean
 * each part's f32 or f64) into buf (cap bytes, 40 are enough), with a sign
 * always when sign is true (the imaginary part of "RE+IMj").  A NaN or an
 * infinity is written as "%g" writes it. */
void dspk__sub_fmt_num(char *buf, size_t cap, double v, dspk_dtype dt, bool sign);

#endif
