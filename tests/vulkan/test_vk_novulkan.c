/*
 * The "no Vulkan" path: run with VK_DRIVER_FILES (and VK_ICD_FILENAMES)
 * naming a file that does not exist, probe finds 0 devices, says why, and
 * nothing crashes; opening a device is refused; shutdown is safe.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "backends/backend.h"

extern const struct dspk__backend dspk__backend_vulkan;

static void t_none(void **state) {
  (void)state;
  struct dspk__devinfo info[4];
  char why[256] = "unset";
  assert_int_equal(dspk__backend_vulkan.probe(info, 4, why, sizeof why), 0);
  assert_true(why[0] != 0 && strcmp(why, "unset") != 0);
  print_message("reason: %s\n", why);
  struct dspk__dev *d = NULL;
  assert_true(dspk__backend_vulkan.open(0, NULL, &d) < 0);
  assert_null(d);
  dspk__backend_vulkan.shutdown();
  /* A second probe is just as safe. */
  assert_int_equal(dspk__backend_vulkan.probe(info, 4, why, sizeof why), 0);
  dspk__backend_vulkan.shutdown();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_none)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
