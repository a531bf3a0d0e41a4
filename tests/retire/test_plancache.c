/*
 * Unit tests of the LRU plan cache (backends/common/plancache.c): hits,
 * least-recently-used eviction order through the callback, clear and the key
 * length limit; and an eviction trace in which every evicted plan's
 * workspace goes through the retirement queue (fake fence), never through a
 * barrier.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/common/plancache.h"
#include "dspk/errors.h"
#include "backends/common/retire.h"

struct log { int evicted[64]; int n; };

static void on_evict(void *ud, void *plan) {
  struct log *l = ud;
  l->evicted[l->n++] = (int)(intptr_t)plan;
}

static void test_lru(void **state) {
  struct dspk__plancache c;
  struct log l = {{0}, 0};
  char big[DSPK__PLANCACHE_KEY_MAX + 1] = {0};
  (void)state;
  assert_int_equal(dspk__plancache_init(&c, 3, on_evict, &l), 0);
  assert_null(dspk__plancache_get(&c, "a", 1));
  assert_int_equal(dspk__plancache_put(&c, "a", 1, (void *)1), 0);
  assert_int_equal(dspk__plancache_put(&c, "b", 1, (void *)2), 0);
  assert_int_equal(dspk__plancache_put(&c, "c", 1, (void *)3), 0);
  assert_ptr_equal(dspk__plancache_get(&c, "a", 1), (void *)1); /* a fresh */
  assert_int_equal(dspk__plancache_put(&c, "d", 1, (void *)4), 0);
  assert_int_equal(l.n, 1);
  assert_int_equal(l.evicted[0], 2); /* b was least recently used */
  assert_null(dspk__plancache_get(&c, "b", 1));
  assert_ptr_equal(dspk__plancache_get(&c, "c", 1), (void *)3);
  assert_int_equal(dspk__plancache_put(&c, big, sizeof(big), (void *)9),
                   DSPK_ELIMIT);
  assert_int_equal(c.hits, 2);
  assert_int_equal(c.misses, 2);
  assert_int_equal(c.evictions, 1);
  dspk__plancache_fini(&c);
  assert_int_equal(l.n, 4);
  dspk__plancache_fini(&c); /* twice is harmless */
}

/* The eviction trace of the benchmark, on a fake device: 200 uses over 50
 * shapes with 16 cached plans; each evicted plan's workspace is retired. */
struct dev { uint64_t submitted, completed; int barriers, live_ws; };
struct fence { uint64_t t; };
static int d_record(void *ud, void **f) {
  struct fence *x = malloc(sizeof(*x));
  if (!x)
    return -2;
  x->t = ((struct dev *)ud)->submitted;
  *f = x;
  return 0;
}
static int d_query(void *ud, void *f) {
  return ((struct dev *)ud)->completed >= ((struct fence *)f)->t;
}
static int d_wait(void *ud, void *f) {
  struct dev *d = ud;
  if (d->completed < ((struct fence *)f)->t)
    d->completed = ((struct fence *)f)->t;
  return 0;
}
static void d_destroy(void *ud, void *f) { (void)ud; free(f); }
static int d_barrier(void *ud) {
  struct dev *d = ud;
  d->barriers++;
  d->completed = d->submitted;
  return 0;
}
static const struct dspk__retire_ops dops = {d_record, d_query, d_wait,
                                             d_destroy, d_barrier};
struct ctx { struct dev *d; struct dspk__retire *q; };
static void ws_release(void *ud, void *ws) {
  (void)ws;
  ((struct dev *)ud)->live_ws--;
}
static void evict_ws(void *ud, void *plan) {
  struct ctx *x = ud;
  dspk__retire_push(x->q, ws_release, x->d, plan);
}

static void test_eviction_trace(void **state) {
  struct dev d = {0};
  struct dspk__retire q;
  struct dspk__plancache c;
  struct ctx x = {&d, &q};
  uint32_t s = 7;
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &dops, &d, 0), 0);
  assert_int_equal(dspk__plancache_init(&c, 16, evict_ws, &x), 0);
  for (int i = 0; i < 200; i++) {
    char key[32];
    int shape;
    s = s * 1664525u + 1013904223u;
    shape = (int)((s >> 8) % 50);
    snprintf(key, sizeof(key), "ij,jk->ik:%d", shape);
    if (!dspk__plancache_get(&c, key, strlen(key))) {
      d.live_ws++;
      assert_int_equal(dspk__plancache_put(&c, key, strlen(key), (void *)key), 0);
    }
    d.submitted++; /* the contraction's work */
    if (i % 3 == 0)
      d.completed++; /* the device lags behind */
  }
  assert_true(c.evictions > 100);
  assert_int_equal(d.barriers, 0);
  assert_true(q.st.deferred == c.evictions);
  dspk__plancache_fini(&c);
  dspk__retire_fini(&q);
  assert_int_equal(d.live_ws, 0);
  assert_int_equal(q.st.barrier_fallbacks, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lru),
      cmocka_unit_test(test_eviction_trace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
