/*
 * Unit tests of the size parser (proto/units.c) that every size flag and
 * size key goes through: plain byte counts, each binary unit in both
 * spellings, the largest values that fit in 64 bits and the first ones
 * that do not, and the spellings it must refuse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "proto/units.h"

static void ok(const char *s, uint64_t want) {
  uint64_t v = 12345;
  if (dspk__parse_size(s, &v) != 0)
    fail_msg("'%s' refused", s);
  if (v != want)
    fail_msg("'%s' gave %llu, want %llu", s, (unsigned long long)v,
             (unsigned long long)want);
}

static void bad(const char *s) {
  uint64_t v = 12345;
  if (dspk__parse_size(s, &v) != -1)
    fail_msg("'%s' accepted as %llu", s ? s : "(null)", (unsigned long long)v);
  assert_int_equal(v, 12345); /* untouched */
}

static void test_plain(void **state) {
  (void)state;
  ok("0", 0);
  ok("1", 1);
  ok("4096", 4096);
  ok("007", 7);
  ok("18446744073709551615", UINT64_MAX);
}

static void test_units(void **state) {
  (void)state;
  ok("1K", 1024);
  ok("1KiB", 1024);
  ok("2M", 2097152);
  ok("2MiB", 2097152);
  ok("64KiB", 65536);
  ok("3G", (uint64_t)3 << 30);
  ok("3GiB", (uint64_t)3 << 30);
  ok("1T", (uint64_t)1 << 40);
  ok("5TiB", (uint64_t)5 << 40);
  ok("0M", 0);
  /* The largest count each unit can scale, and one more. */
  ok("16777215T", (uint64_t)16777215 << 40);
  bad("16777216T");
  ok("17179869183G", (uint64_t)17179869183 << 30);
  bad("17179869184G");
  ok("17592186044415M", (uint64_t)17592186044415 << 20);
  bad("17592186044416MiB");
  ok("18014398509481983K", (uint64_t)18014398509481983 << 10);
  bad("18014398509481984K");
}

static void test_refused(void **state) {
  (void)state;
  bad(NULL);
  bad("");
  bad("M");
  bad("KiB");
  bad("-1");
  bad("+1");
  bad(" 1");
  bad("1 ");
  bad("1 M");
  bad("1.5M");
  bad("1k");
  bad("1m");
  bad("1MB");
  bad("1Mi");
  bad("1B");
  bad("1KK");
  bad("0x10");
  bad("18446744073709551616");
  bad("99999999999999999999999");
  /* What Python's str.strip(), .upper() and .isdigit() took (python/tests reads
   * this table too: the Python client must read sizes exactly so). */
  bad(" 5");
  bad("5 ");
  bad("5\n");
  bad("\t7");
  bad("2m");
  bad("2kib");
  bad("2KIB");
  bad("3g");
  bad("4t");
  bad("1Kib");
  bad("1kiB");
  bad("\xd9\xa3");         /* ARABIC-INDIC DIGIT THREE, a digit to isdigit() */
  bad("1\xef\xbc\x90");     /* 1 and FULLWIDTH DIGIT ZERO */
  bad("\xc2\xb2");          /* SUPERSCRIPT TWO */
  bad("1_000");
  bad("1e3");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain),
      cmocka_unit_test(test_units),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
