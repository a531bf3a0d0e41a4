/*
 * CI test of the CUDA backend's probe without a GPU: a host without the
 * driver library lists no device and says why, and nothing crashes; the
 * real probe on this host either lists devices with full information or
 * gives a reason.  Works on a GPU host too (the first case forces a missing
 * driver through DSPK_CUDA_DRIVER).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/cuda/cuda_internal.h"

static void test_missing_driver(void **state) {
  struct dspk__devinfo info[4];
  char why[200] = "unchanged";
  struct dspk__dev *dev = NULL;
  (void)state;
  setenv("DSPK_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  dspk__cuda_unload();
  assert_int_equal(dspk__backend_cuda.probe(info, 4, why, sizeof(why)), 0);
  assert_non_null(strstr(why, "not found"));
  assert_non_null(strstr(why, "libcuda.so.1"));
  /* Opening a device that was not listed fails cleanly. */
  assert_int_equal(dspk__backend_cuda.open(0, NULL, &dev), DSPK_ENODEV);
  assert_null(dev);
  dspk__backend_cuda.close(NULL);
  dspk__backend_cuda.shutdown();
  unsetenv("DSPK_CUDA_DRIVER");
}

static void test_real_probe(void **state) {
  struct dspk__devinfo info[DSPK__CUDA_MAX_DEVICES];
  char why[200];
  int n;
  (void)state;
  dspk__cuda_unload();
  n = dspk__backend_cuda.probe(info, DSPK__CUDA_MAX_DEVICES, why, sizeof(why));
  assert_true(n >= 0);
  if (n == 0) {
    printf("no CUDA device here: %s\n", why);
    assert_true(strlen(why) > 0);
    assert_true(strstr(why, "not found") || strstr(why, "no CUDA device") ||
                strstr(why, "driver too old") || strstr(why, "cuInit failed"));
  }
  for (int i = 0; i < n; i++) {
    printf("cuda:%d %s %s %s mem=%llu uuid=%s\n", i, info[i].name, info[i].arch,
           info[i].driver, (unsigned long long)info[i].memory, info[i].uuid);
    assert_true(strlen(info[i].name) > 0);
    assert_memory_equal(info[i].arch, "sm_", 3);
    assert_true(info[i].memory > 0);
    assert_int_equal(strlen(info[i].uuid), 36);
  }
  dspk__backend_cuda.shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_driver),
      cmocka_unit_test(test_real_probe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
