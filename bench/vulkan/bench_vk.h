/*
 * What the Vulkan benchmarks share: the device they measure.
 */
#ifndef DSPK_BENCH_VK_H
#define DSPK_BENCH_VK_H

#include <stdio.h>

#include "backends/backend.h"

/* The index of the first hardware Vulkan device (else device 0), after
 * printing its line; -1, after saying why, when there is none. */
static inline int bench_vk_pick(const struct dspk__backend *V) {
  struct dspk__devinfo info[16];
  char why[256];
  int n = V->probe(info, 16, why, sizeof why), idx = 0;
  if (n <= 0) {
    printf("no vulkan device: %s\n", why);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (!info[i].software) {
      idx = i;
      break;
    }
  printf("device vulkan:%d: %s (%s), driver %s\n\n", idx, info[idx].name, info[idx].type,
         info[idx].driver);
  return idx;
}

#endif /* DSPK_BENCH_VK_H */
