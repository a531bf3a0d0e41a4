/*
 * Tensor sizes of backends/op.h (the dtype helpers themselves are in
 * proto/dtype.c).
 */
#include <string.h>

#include "backends/op.h"

int64_t dspk__tensor_numel(const struct dspk__tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    n *= t->shape[i];
  return n;
}

size_t dspk__tensor_nbytes(const struct dspk__tensor *t) {
  return (size_t)dspk__tensor_numel(t) * dspk__dtype_size(t->dtype);
}
