/*
 * Helpers shared by the libFuzzer harnesses of tests/fuzz (see
 * tests/fuzz/CMakeLists.txt).  A broken oracle aborts, so libFuzzer keeps
 * the input as a crash like any sanitizer report.
 */
#ifndef DSPK_TESTS_FUZZ_COMMON_H
#define DSPK_TESTS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: oracle broken: %s\n", __FILE__, __LINE__, #cond);\
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* Consumes up to n bytes from the front of the input (little-endian). */
static inline uint64_t fuzz_take(const uint8_t **d, size_t *n, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes && *n; i++) {
    v |= (uint64_t)**d << (8 * i);
    (*d)++;
    (*n)--;
  }
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
