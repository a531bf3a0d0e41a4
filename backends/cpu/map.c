/*
 * map on the cpu: elementwise add, sub, mul (A, B of equal shapes), scale
 * (alpha*A), axpy (alpha*A + B), abs (complex abs gives the real dtype) and
 * exp, over contiguous arrays in chunks so a cancel request is seen between
 * chunks.  Complex values are interleaved (re, im) pairs, multiplied by hand
 * (C's complex multiply calls a NaN-checking helper per element).
 */
#include <complex.h>
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu.h"

/* Elements per chunk: exp of 2^20 c128 values took 90 ms at a load of 10
 * on the 2-core development VM, too long a wait for a cancel. */
#define CHUNK ((int64_t)1 << 18)

/* Real loops over n elements. */
#define DEFINE_REAL(NAME, R, EXP, ABS)                                         \
  static void NAME(dspk_mapfn fn, R alpha, const R *a, const R *b, R *o,       \
                   int64_t n) {                                                \
    switch (fn) {                                                              \
    case DSPK_MAP_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break; \
    case DSPK_MAP_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; break; \
    case DSPK_MAP_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; break; \
    case DSPK_MAP_SCALE: for (int64_t i = 0; i < n; i++) o[i] = alpha * a[i]; break; \
    case DSPK_MAP_AXPY:                                                        \
      for (int64_t i = 0; i < n; i++) o[i] = alpha * a[i] + b[i];              \
      break;                                                                   \
    case DSPK_MAP_ABS: for (int64_t i = 0; i < n; i++) o[i] = ABS(a[i]); break; \
    case DSPK_MAP_EXP: for (int64_t i = 0; i < n; i++) o[i] = EXP(a[i]); break; \
    default: break;                                                            \
    }                                                                          \
  }

/* Complex loops over n elements (2n values); abs writes n reals.  exp is
 * C's cexp: glibc's handles C99's special values (Annex G) and reduces any
 * finite imaginary part exactly, as numpy's exp does. */
#define DEFINE_CPLX(NAME, R, CEXP, HYPOT)                                      \
  static void NAME(dspk_mapfn fn, R alpha, const R *a, const R *b, R *o,       \
                   int64_t n) {                                                \
    switch (fn) {                                                              \
    case DSPK_MAP_ADD: for (int64_t i = 0; i < 2 * n; i++) o[i] = a[i] + b[i]; break; \
    case DSPK_MAP_SUB: for (int64_t i = 0; i < 2 * n; i++) o[i] = a[i] - b[i]; break; \
    case DSPK_MAP_MUL:                                                         \
      for (int64_t i = 0; i < n; i++) {                                        \
        R ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];  \
        o[2 * i] = ar * br - ai * bi;                                          \
        o[2 * i + 1] = ar * bi + ai * br;                                      \
      }                                                                        \
      break;                                                                   \
    case DSPK_MAP_SCALE: for (int64_t i = 0; i < 2 * n; i++) o[i] = alpha * a[i]; break; \
    case DSPK_MAP_AXPY:                                                        \
      for (int64_t i = 0; i < 2 * n; i++) o[i] = alpha * a[i] + b[i];          \
      break;                                                                   \
    case DSPK_MAP_ABS:                                                         \
      for (int64_t i = 0; i < n; i++) o[i] = HYPOT(a[2 * i], a[2 * i + 1]);    \
      break;                                                                   \
    case DSPK_MAP_EXP:                                                         \
      for (int64_t i = 0; i < n; i++) {                                        \
        R complex z; /* a complex is laid out as its two parts (C11 6.2.5) */  \
        memcpy(&z, &a[2 * i], sizeof z); /* (clang's C has no CMPLX here) */  \
        R complex w = CEXP(z);                                                 \
        o[2 * i] = creal(w);                                                   \
        o[2 * i + 1] = cimag(w);                                               \
      }                                                                        \
      break;                                                                   \
    default: break;                                                            \
    }                                                                          \
  }

DEFINE_REAL(map_f32, float, expf, fabsf)
DEFINE_REAL(map_f64, double, exp, fabs)
DEFINE_CPLX(map_c64, float, cexpf, hypotf)
DEFINE_CPLX(map_c128, double, cexp, hypot)

int dspk__cpu_map(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  (void)dev;
  const struct dspk__tensor *A = &op->in[0];
  const struct dspk__tensor *B = op->nin > 1 ? &op->in[1] : NULL;
  struct dspk__tensor *O = &op->out[0];
  dspk_mapfn fn = op->u.map.fn;
  double alpha = op->u.map.alpha;
  int64_t n = dspk__tensor_numel(A);
  size_t ies = dspk__dtype_size(A->dtype), oes = dspk__dtype_size(O->dtype);
  const char *a = dspk__cpu_ptr(A), *b = B ? dspk__cpu_ptr(B) : NULL;
  char *o = dspk__cpu_ptr(O);
  for (int64_t s = 0; s < n; s += CHUNK) {
    if (s && dspk__cpu_canceled(ctx))
      return DSPK_ECANCELED;
    int64_t m = n - s < CHUNK ? n - s : CHUNK;
    const void *pa = a + s * ies, *pb = b ? b + s * ies : NULL;
    void *po = o + s * oes;
    switch (A->dtype) {
    case DSPK_F32: map_f32(fn, (float)alpha, pa, pb, po, m); break;
    case DSPK_F64: map_f64(fn, alpha, pa, pb, po, m); break;
    case DSPK_C64: map_c64(fn, (float)alpha, pa, pb, po, m); break;
    case DSPK_C128: map_c128(fn, alpha, pa, pb, po, m); break;
    default:
      return dspk__cpu_err(ctx, DSPK_EDTYPE, "map: A has dtype %s",
                           dspk__dtype_name(A->dtype));
    }
  }
  return 0;
}
