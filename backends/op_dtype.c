/*
 * Tensor sizes of backends/op.h (the dtype helpers themselves are in
 * proto/dtype.c), computed with overflow checks: every size the daemon and
 * the backends derive from a client's shape goes through dspk__tensor_size.
 */
#include <string.h>

#include "backends/op.h"

int dspk__tensor_size(const struct dspk__tensor *t, int64_t *numel, size_t *nbytes) {
  size_t isz = (unsigned)t->dtype < DSPK_DTYPE_COUNT ? dspk__dtype_size(t->dtype) : 0;
  int64_t n = 1, extent = (int64_t)isz;
  if (!isz || t->rank < 0 || t->rank > DSPK_MAX_RANK)
    return -1;
  for (int i = 0; i < t->rank; i++) {
    int64_t d = t->shape[i];
    if (d < 0)
      return -1;
    /* The extent (zeros counted as 1) bounds every partial product, so n
     * cannot overflow once the extent did not. */
    if (d > 0 && __builtin_mul_overflow(extent, d, &extent))
      return -1;
    n *= d;
  }
  if (numel)
    *numel = n;
  if (nbytes)
    *nbytes = (size_t)n * isz; /* <= extent <= INT64_MAX */
  return 0;
}

int64_t dspk__tensor_numel(const struct dspk__tensor *t) {
  int64_t n;
  return dspk__tensor_size(t, &n, NULL) == 0 ? n : INT64_MAX;
}

size_t dspk__tensor_nbytes(const struct dspk__tensor *t) {
  size_t n;
  return dspk__tensor_size(t, NULL, &n) == 0 ? n : SIZE_MAX;
}
