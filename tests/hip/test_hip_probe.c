/*
 * CI test of the HIP backend's probe on a host without an AMD GPU: without
 * the runtime library the backend lists no device and says so; with the
 * real runtime (Debian's libamdhip64, installed in CI) and no GPU it lists
 * none and says why (no /dev/kfd, no device); opening a device that was
 * not listed fails cleanly.  On an AMD GPU host the real probe lists each
 * device with a gfx target, a UUID and memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/hip/hip_internal.h"

static void test_missing_runtime(void **state) {
  struct dspk__devinfo info[4];
  char why[200] = "unchanged";
  struct dspk__dev *dev = NULL;
  (void)state;
  setenv("DSPK_HIP_RUNTIME", "/nonexistent/libamdhip64.so.6", 1);
  assert_int_equal(dspk__backend_hip.probe(info, 4, why, sizeof(why)), 0);
  printf("no runtime: %s\n", why);
  assert_non_null(strstr(why, "not found"));
  assert_non_null(strstr(why, "no HIP runtime"));
  assert_int_equal(dspk__backend_hip.open(0, NULL, &dev), DSPK_ENODEV);
  assert_null(dev);
  dspk__backend_hip.close(NULL);
  dspk__backend_hip.shutdown();
  unsetenv("DSPK_HIP_RUNTIME");
}

static void test_real_probe(void **state) {
  struct dspk__devinfo info[DSPK__GPURT_MAX_DEVICES];
  char why[200];
  int n;
  (void)state;
  n = dspk__backend_hip.probe(info, DSPK__GPURT_MAX_DEVICES, why, sizeof(why));
  assert_true(n >= 0);
  if (n == 0) {
    printf("no HIP device here: %s\n", why);
    assert_true(strlen(why) > 0);
    assert_true(strstr(why, "not found") || strstr(why, "no AMD GPU") ||
                strstr(why, "too old") || strstr(why, "hipInit failed"));
    /* CI has Debian's runtime and no GPU: the reason names the missing
     * device, not a missing library. */
    if (access("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5", F_OK) == 0 &&
        access("/dev/kfd", F_OK) != 0)
      assert_non_null(strstr(why, "no AMD GPU: /dev/kfd is absent"));
  }
  for (int i = 0; i < n; i++) {
    printf("hip:%d %s %s %s mem=%llu uuid=%s\n", i, info[i].name, info[i].arch,
           info[i].driver, (unsigned long long)info[i].memory, info[i].uuid);
    assert_memory_equal(info[i].arch, "gfx", 3);
    assert_true(info[i].memory > 0);
    assert_int_equal(strlen(info[i].uuid), 36);
  }
  dspk__backend_hip.shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_runtime),
      cmocka_unit_test(test_real_probe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
