/*
 * backends/registry.c: every backend dspk knows, the one list the daemon takes
 * backend names from.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "backends/backend.h"

/* Each built backend is a known one; the known names are unique. */
static void test_known_backends(void **state) {
  (void)state;
  for (int i = 0; dspk__backends[i]; i++) {
    int found = 0;
    for (int k = 0; dspk__known_backends[k]; k++)
      found += strcmp(dspk__known_backends[k], dspk__backends[i]->name) == 0;
    assert_int_equal(found, 1);
  }
  for (int a = 0; dspk__known_backends[a]; a++)
    for (int b = a + 1; dspk__known_backends[b]; b++)
      assert_string_not_equal(dspk__known_backends[a], dspk__known_backends[b]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_backends),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
