/*
 * dtype helpers (proto/dtype.h), all from the one table in
 * include/dspk/types.h.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspk/errors.h"
#include "proto/dtype.h"

size_t dspk__dtype_size(dspk_dtype dt) {
  switch (dt) {
#define XX(e, name, size, cplx) case DSPK_##e: return size;
    DSPK_DTYPE_MAP(XX)
#undef XX
  default: return 0;
  }
}

int dspk__dtype_is_complex(dspk_dtype dt) {
  switch (dt) {
#define XX(e, name, size, cplx) case DSPK_##e: return cplx;
    DSPK_DTYPE_MAP(XX)
#undef XX
  default: return 0;
  }
}

const char *dspk__dtype_name(dspk_dtype dt) {
  switch (dt) {
#define XX(e, name, size, cplx) case DSPK_##e: return name;
    DSPK_DTYPE_MAP(XX)
#undef XX
  default: return "?";
  }
}

int dspk__dtype_from_name(const char *name, size_t len, dspk_dtype *out) {
#define XX(e, n, size, cplx)                                                   \
  if (len == sizeof(n) - 1 && memcmp(name, n, len) == 0) {                     \
    *out = DSPK_##e;                                                           \
    return 0;                                                                  \
  }
  DSPK_DTYPE_MAP(XX)
#undef XX
  return DSPK_EDTYPE;
}

int dspk__f64_fits_f32(double v) {
  return !isfinite(v) || fabs(v) < 0x1.ffffffp127; /* 2^128 - 2^103 */
}

const char *dspk__float_str(char *buf, size_t n, double v, bool f32) {
  char t[40];
  int p, last = f32 ? 9 : 17, exp;
  if (isnan(v)) {
    snprintf(buf, n, "nan");
    return buf;
  }
  if (isinf(v)) {
    snprintf(buf, n, "%sinf", v < 0 ? "-" : "");
    return buf;
  }
  /* C has no shortest round-trip format: the first count of significant
   * digits that reads back as v (as a float when f32) is it. */
  for (p = 1; p < last; p++) {
    snprintf(t, sizeof t, "%.*e", p - 1, v);
    if (f32 ? strtof(t, NULL) == (float)v : strtod(t, NULL) == v)
      break;
  }
  snprintf(t, sizeof t, "%.*e", p - 1, v);
  exp = atoi(strchr(t, 'e') + 1);
  if (exp < -4 || exp >= 16) {
    /* Exponent form, as %e writes it ("1e+16", "-2.5e-07"). */
    snprintf(buf, n, "%s", t);
    return buf;
  }
  /* Positional: those p digits around the point, zeros added (not %f,
   * which would write an f32's exact binary value: 999999986991104 for
   * the f32 1e15), and ".0" after an integral value so that it reads as a
   * float. */
  char d[20], out[48];
  int nd = 0, at = 0;
  for (const char *c = t; *c && *c != 'e'; c++)
    if (*c >= '0' && *c <= '9')
      d[nd++] = *c;
  if (v < 0 || (v == 0 && signbit(v)))
    out[at++] = '-';
  if (exp < 0) {
    out[at++] = '0';
    out[at++] = '.';
    for (int i = 0; i < -exp - 1; i++)
      out[at++] = '0';
    for (int i = 0; i < nd; i++)
      out[at++] = d[i];
  } else {
    for (int i = 0; i <= exp || i < nd; i++) {
      if (i == exp + 1)
        out[at++] = '.';
      out[at++] = i < nd ? d[i] : '0';
    }
    if (nd <= exp + 1) {
      out[at++] = '.';
      out[at++] = '0';
    }
  }
  out[at] = '\0';
  snprintf(buf, n, "%s", out);
  return buf;
}

const char *dspk__num_str(char *buf, size_t n, const struct dspk__num_sent *s) {
  switch (s->kind) {
  case DSPK__NUM_UINT: snprintf(buf, n, "%" PRIu64, s->v.u); return buf;
  case DSPK__NUM_INT: snprintf(buf, n, "%" PRId64, s->v.i); return buf;
  case DSPK__NUM_FLOAT: return dspk__float_str(buf, n, s->v.f, s->f32);
  default: return dspk__float_str(buf, n, s->v.f, false);
  }
}
