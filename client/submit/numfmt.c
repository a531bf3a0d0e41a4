/* Numbers of a dtype as text for the result line (numfmt.h). */
#include "client/submit/numfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Whether back reads as the same value v of a binary format of prec
 * significant bits whose subnormals are spaced 2^min_s apart (f16: 11,
 * -24; bf16: 8, -133): nearer to v than half the spacing on back's side
 * of it (below a power of two the spacing halves). */
static bool same_small(double back, double v, int prec, int min_s) {
  int e;
  double m = frexp(fabs(v), &e);
  int s = m == 0.5 && fabs(back) < fabs(v) ? e - prec - 1 : e - prec;
  return fabs(back - v) < ldexp(1.0, (s > min_s ? s : min_s) - 1);
}

void dspk__sub_fmt_num(char *buf, size_t cap, double v, dspk_dtype dt, bool sign) {
  bool dbl = dt == DSPK_F64 || dt == DSPK_C128;
  int lo = dt == DSPK_F16 || dt == DSPK_BF16 ? 3 : dbl ? 15 : 6;
  int hi = dt == DSPK_F16 ? 5 : dt == DSPK_BF16 ? 4 : dbl ? 17 : 9;
  const char *fmt = sign ? "%+.*g" : "%.*g";
  if (!isfinite(v)) {
    snprintf(buf, cap, sign ? "%+g" : "%g", v);
    return;
  }
  /* Where "%.*g" writes positional digits at lo (1e-4 <= |v| < 10^lo, all
   * normal numbers of every dtype), trying from lo keeps that notation:
   * there lo digits of a value that fewer digits name are those digits
   * and zeros, which %g drops.  Elsewhere (scientific either way) the
   * search starts at one digit: a subnormal, whose precision is below
   * lo, needs fewer digits than lo (an f64 1e-310 is "1e-310", where
   * 15 digits show 9.99999999999997e-311). */
  double mag = fabs(v);
  int from = mag >= 1e-4 && mag < pow(10.0, lo) ? lo : 1;
  for (int p = from; p < hi; p++) {
    snprintf(buf, cap, fmt, p, v);
    double back = strtod(buf, NULL);
    bool same;
    if (dt == DSPK_F16) {
      same = same_small(back, v, 11, -24);
    } else if (dt == DSPK_BF16) {
      same = same_small(back, v, 8, -133);
    } else if (dt == DSPK_F32 || dt == DSPK_C64) {
      /* strtof: the text read as an f32 directly (going through a
       * double could round twice). */
      same = strtof(buf, NULL) == (float)v;
    } else {
      same = back == v;
    }
    if (same)
      return;
  }
  snprintf(buf, cap, fmt, hi, v);
}

