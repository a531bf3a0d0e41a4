/*
 * Unit test of the memory-mapping budget of clients' buffers
 * (daemon/config.c, dspkd_maps_budget; docs/admin.md, "Memory mappings"):
 * of vm.max_map_count, a reserve of a quarter stays the daemon's own, at
 * least 16384 but at most half; the rest is what all users' buffers may map,
 * and max_user_maps defaults to a quarter of that, at least 1.  Expected
 * values are worked out by hand from that rule (probe 19 H1).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "daemon/config.h"

static void check(uint64_t mmc, uint64_t clients, uint64_t user) {
  uint64_t c = 0, u = 0;
  dspkd_maps_budget(mmc, &c, &u);
  assert_int_equal(c, clients);
  assert_int_equal(u, user);
}

static void test_budget(void **state) {
  (void)state;
  /* The kernel's default: 65530 / 4 = 16382 < 16384, so 16384 reserved. */
  check(65530, 49146, 12286);
  /* Large: a quarter reserved. */
  check(1048576, 786432, 196608);
  check(262144, 196608, 49152);
  /* 65536 / 4 is exactly the least reserve. */
  check(65536, 49152, 12288);
  /* Small: the reserve is at most half. */
  check(32768, 16384, 4096);
  check(40, 20, 5);
  check(3, 2, 1);
  check(1, 1, 1);
}

/* The reader: the test hook's value when set (test builds), else the
 * kernel's file. */
static void test_read(void **state) {
  (void)state;
  assert_true(dspkd_max_map_count() > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget),
      cmocka_unit_test(test_read),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
