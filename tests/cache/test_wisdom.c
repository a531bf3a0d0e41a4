/*
 * Tests of backends/cpu/fftw_wisdom.c: wisdom measured in one "process" (an open
 * cache, FFTW's wisdom then forgotten) lets the next one make the same plan
 * from wisdom alone (FFTW_WISDOM_ONLY succeeds only then), saving writes
 * only when FFTW learnt something, and the blob names carry the precision
 * and FFTW's version.  Also the cache's kind-name parser.
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
#include <fftw3.h>

#include "backends/cpu/fftw_wisdom.h"

#define N 4096

static int plan_both(unsigned flags) {
  fftw_complex *a = fftw_malloc(sizeof *a * N);
  fftwf_complex *b = fftwf_malloc(sizeof *b * N);
  fftw_plan p = fftw_plan_dft_1d(N, a, a, FFTW_FORWARD, flags);
  fftwf_plan q = fftwf_plan_dft_1d(N, b, b, FFTW_FORWARD, flags);
  int ok = (p != NULL) + (q != NULL);
  if (p)
    fftw_destroy_plan(p);
  if (q)
    fftwf_destroy_plan(q);
  fftw_free(a);
  fftwf_free(b);
  return ok;
}

static void test_wisdom_round_trip(void **state) {
  (void)state;
  char dir[] = "/tmp/dspk-wisdom-XXXXXX", path[128];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/c.db", dir);
  struct dspk__cache *c = NULL;
  char warn[256];

  fftw_forget_wisdom();
  fftwf_forget_wisdom();
  assert_int_equal(plan_both(FFTW_MEASURE | FFTW_WISDOM_ONLY), 0);
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  assert_int_equal(dspk__fftw_wisdom_load(c), 0); /* nothing stored yet */
  assert_int_equal(plan_both(FFTW_MEASURE), 2);
  assert_int_equal(dspk__fftw_wisdom_save(c), 2);
  assert_int_equal(dspk__fftw_wisdom_save(c), 0); /* nothing new */
  dspk__cache_close(c);

  /* "Restart": FFTW forgets, the cache is reopened. */
  fftw_forget_wisdom();
  fftwf_forget_wisdom();
  assert_int_equal(plan_both(FFTW_MEASURE | FFTW_WISDOM_ONLY), 0);
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  assert_int_equal(dspk__fftw_wisdom_load(c), 2);
  assert_int_equal(plan_both(FFTW_MEASURE | FFTW_WISDOM_ONLY), 2);
  assert_int_equal(dspk__fftw_wisdom_save(c), 0); /* same as loaded */
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 2);
  dspk__cache_close(c);
  assert_int_equal(dspk__fftw_wisdom_load(NULL), 0);
  assert_int_equal(dspk__fftw_wisdom_save(NULL), 0);

  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_names(void **state) {
  (void)state;
  char name[256];
  assert_int_equal(dspk__fftw_wisdom_name(1, name, sizeof name), 0);
  assert_non_null(strstr(name, "fftw-wisdom/f64/"));
  assert_non_null(strstr(name, fftw_version));
  assert_int_equal(dspk__fftw_wisdom_name(0, name, sizeof name), 0);
  assert_non_null(strstr(name, "fftw-wisdom/f32/"));
  assert_int_equal(dspk__fftw_wisdom_name(0, name, 8), DSPK_ERANGE);
  assert_int_equal(dspk__cache_kind_from_name("autotune", 8), DSPK__CACHE_AUTOTUNE);
  assert_int_equal(dspk__cache_kind_from_name("blobs", 5), DSPK__CACHE_BLOBS);
  assert_int_equal(dspk__cache_kind_from_name("kernelsX", 7), DSPK__CACHE_KERNELS);
  assert_int_equal(dspk__cache_kind_from_name("blob", 4), DSPK_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wisdom_round_trip),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
