/*
 * Unit tests of the caching pool (backends/common/pool.c) over a fake raw
 * allocator that counts live bytes and can run out of memory, and of the
 * pool used as the retirement queue's release function.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/common/pool.h"

struct raw { size_t live, limit; int allocs, frees; };

static int r_alloc(void *ud, size_t n, uint64_t *h) {
  struct raw *r = ud;
  void *p;
  if (r->limit && r->live + n > r->limit)
    return DSPK_ENOMEM;
  p = malloc(n);
  if (!p)
    return DSPK_ENOMEM;
  ((size_t *)p)[0] = n;
  r->live += n;
  r->allocs++;
  *h = (uint64_t)(uintptr_t)p;
  return 0;
}

static void r_free(void *ud, uint64_t h) {
  struct raw *r = ud;
  void *p = (void *)(uintptr_t)h;
  r->live -= ((size_t *)p)[0];
  r->frees++;
  free(p);
}

static const struct dspk__pool_ops raw_ops = {r_alloc, r_free};

static void test_round(void **state) {
  (void)state;
  assert_int_equal(dspk__pool_round(0), 512);
  assert_int_equal(dspk__pool_round(512), 512);
  assert_int_equal(dspk__pool_round(513), 640);
  assert_int_equal(dspk__pool_round(1023), 1024);
  assert_int_equal(dspk__pool_round(1024), 1024);
  assert_int_equal(dspk__pool_round(1025), 1280);
  assert_int_equal(dspk__pool_round((size_t)256 << 20), (size_t)256 << 20);
  for (size_t n = 1; n < 100000; n = n * 3 + 7) {
    size_t s = dspk__pool_round(n);
    assert_true(s >= n);
    assert_true(n <= 512 || (double)s <= 1.25 * (double)n + 1);
  }
}

static void test_reuse_and_stats(void **state) {
  struct raw r = {0};
  struct dspk__pool p;
  struct dspk__pool_block *a, *b, *c;
  struct dspk__devstats ds = {0};
  (void)state;
  dspk__pool_init(&p, &raw_ops, &r, 0);
  assert_int_equal(dspk__pool_get(&p, 1000, &a), 0);
  assert_true(a->size >= 1000);
  assert_int_equal(dspk__pool_get(&p, 5000, &b), 0);
  assert_int_equal(p.st.misses, 2);
  dspk__pool_put(&p, a);
  assert_int_equal(p.st.bytes_cached, 1024);
  assert_int_equal(dspk__pool_get(&p, 900, &c), 0); /* same bucket: a hit */
  assert_ptr_equal(c, a);
  assert_int_equal(p.st.hits, 1);
  assert_int_equal(r.allocs, 2);
  dspk__pool_put(&p, b);
  dspk__pool_put(&p, c);
  dspk__pool_put(&p, NULL);
  dspk__pool_stats_fill(&p, &ds);
  assert_int_equal(ds.pool_bytes_in_use, 0);
  assert_int_equal(ds.pool_bytes_cached, 1024 + dspk__pool_round(5000));
  assert_int_equal(ds.pool_hits, 1);
  assert_int_equal(ds.pool_misses, 2);
  dspk__pool_fini(&p);
  assert_int_equal(r.live, 0);
  assert_int_equal(r.frees, 2);
}

static void test_oom_trims_and_retries(void **state) {
  struct raw r = {0, 4096, 0, 0};
  struct dspk__pool p;
  struct dspk__pool_block *a, *b;
  (void)state;
  dspk__pool_init(&p, &raw_ops, &r, 0);
  assert_int_equal(dspk__pool_get(&p, 3000, &a), 0);
  dspk__pool_put(&p, a); /* 3072 cached */
  /* A different bucket does not fit next to the cached block: the pool
   * trims its cache and retries. */
  assert_int_equal(dspk__pool_get(&p, 2000, &b), 0);
  assert_int_equal(p.st.trims, 1);
  assert_int_equal(p.st.bytes_cached, 0);
  assert_int_equal(dspk__pool_get(&p, 4000, &a), DSPK_ENOMEM);
  dspk__pool_put(&p, b);
  dspk__pool_fini(&p);
  assert_int_equal(r.live, 0);
}

static void test_max_cached(void **state) {
  struct raw r = {0};
  struct dspk__pool p;
  struct dspk__pool_block *a, *b;
  (void)state;
  dspk__pool_init(&p, &raw_ops, &r, 1500);
  assert_int_equal(dspk__pool_get(&p, 1024, &a), 0);
  assert_int_equal(dspk__pool_get(&p, 1024, &b), 0);
  dspk__pool_put(&p, a);
  dspk__pool_put(&p, b); /* over the bound: freed */
  assert_int_equal(p.st.bytes_cached, 1024);
  assert_int_equal(r.frees, 1);
  dspk__pool_fini(&p);
  assert_int_equal(r.live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round),
      cmocka_unit_test(test_reuse_and_stats),
      cmocka_unit_test(test_oom_trims_and_retries),
      cmocka_unit_test(test_max_cached),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
