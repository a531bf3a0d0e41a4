/*
 * dtype helpers (proto/dtype.h), all from the one table in
 * include/dspk/types.h.
 */
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

const char *dspk__f64_text(double v, char *buf, size_t len) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, v);
    if (!isfinite(v) || strtod(buf, NULL) == v)
      break;
  }
  return buf;
}
