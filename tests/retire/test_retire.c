/*
 * Unit tests of the retirement queue (backends/common/retire.c), on the CPU,
 * through a fake fence: a fake device whose "completed" counter advances only
 * when the test says so (or when the queue waits), with switches that make
 * record, query, wait or the barrier fail.  Every release checks that the
 * device really finished with the resource, so an early release fails the
 * test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/common/retire.h"

struct fake {
  uint64_t submitted; /* work enqueued so far */
  uint64_t completed; /* work finished so far */
  int fail_record, fail_query, fail_wait, fail_barrier;
  int records, queries, waits, barriers, destroys, live_fences;
  int released;
  uint64_t last_released_id;
};

struct fence { uint64_t target; };

/* A resource: it is in use until work `busy_until` has completed. */
struct res { uint64_t busy_until; uint64_t id; int released; };

static int f_record(void *ud, void **out) {
  struct fake *f = ud;
  struct fence *fe;
  f->records++;
  if (f->fail_record)
    return DSPK_EDEVICE;
  fe = malloc(sizeof(*fe));
  if (!fe)
    return DSPK_ENOMEM;
  fe->target = f->submitted;
  f->live_fences++;
  *out = fe;
  return 0;
}

static int f_query(void *ud, void *fence) {
  struct fake *f = ud;
  f->queries++;
  if (f->fail_query)
    return DSPK_EDEVICE;
  return f->completed >= ((struct fence *)fence)->target;
}

static int f_wait(void *ud, void *fence) {
  struct fake *f = ud;
  struct fence *fe = fence;
  f->waits++;
  if (f->fail_wait)
    return DSPK_EDEVICE;
  if (f->completed < fe->target)
    f->completed = fe->target;
  return 0;
}

static void f_destroy(void *ud, void *fence) {
  struct fake *f = ud;
  f->destroys++;
  f->live_fences--;
  free(fence);
}

static int f_barrier(void *ud) {
  struct fake *f = ud;
  f->barriers++;
  if (f->fail_barrier)
    return DSPK_EDEVICE;
  f->completed = f->submitted;
  return 0;
}

static const struct dspk__retire_ops fake_ops = {
    f_record, f_query, f_wait, f_destroy, f_barrier};

static void release(void *ud, void *r) {
  struct fake *f = ud;
  struct res *x = r;
  assert_int_equal(x->released, 0);              /* released once */
  assert_true(f->completed >= x->busy_until);    /* never early */
  x->released = 1;
  f->released++;
  f->last_released_id = x->id;
}

/* Enqueues one unit of work that uses x, then retires x. */
static int use_and_retire(struct dspk__retire *q, struct fake *f, struct res *x) {
  f->submitted++;
  x->busy_until = f->submitted;
  return dspk__retire_push(q, release, f, x);
}

static void test_deferred_until_fence(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res r[3] = {{0, 0, 0}, {0, 1, 0}, {0, 2, 0}};
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 0), 0);
  assert_int_equal(q.cap, 16);
  for (int i = 0; i < 3; i++)
    assert_int_equal(use_and_retire(&q, &f, &r[i]), 0);
  assert_int_equal(dspk__retire_drain(&q), 0);
  assert_int_equal(f.released, 0);
  assert_int_equal(q.st.deferred, 3);
  assert_int_equal(q.st.in_flight, 3);
  f.completed = 2;
  assert_int_equal(dspk__retire_drain(&q), 2);
  assert_true(r[0].released && r[1].released && !r[2].released);
  assert_int_equal(q.st.in_flight, 1);
  f.completed = 3;
  assert_int_equal(dspk__retire_drain(&q), 1);
  assert_int_equal(q.st.released, 3);
  assert_int_equal(q.st.in_flight, 0);
  assert_int_equal(q.st.max_in_flight, 3);
  assert_int_equal(f.waits, 0);
  assert_int_equal(f.barriers, 0);
  dspk__retire_fini(&q);
  assert_int_equal(f.live_fences, 0);
}

static void test_capacity_waits_on_oldest(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res r[6];
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 4), 0);
  for (int i = 0; i < 6; i++) {
    r[i] = (struct res){0, (uint64_t)i, 0};
    assert_int_equal(use_and_retire(&q, &f, &r[i]), 0);
    assert_true(q.n <= 4);
  }
  /* The 5th and 6th pushes each waited on the oldest fence. */
  assert_int_equal(f.waits, 2);
  assert_true(r[0].released && r[1].released);
  assert_false(r[2].released);
  assert_int_equal(q.st.max_in_flight, 4);
  assert_int_equal(q.st.in_flight, 4);
  assert_int_equal(f.barriers, 0);
  assert_int_equal(dspk__retire_sync(&q), 0);
  assert_int_equal(f.released, 6);
  assert_int_equal(f.last_released_id, 5); /* oldest first */
  assert_int_equal(q.st.in_flight, 0);
  dspk__retire_fini(&q);
  assert_int_equal(f.live_fences, 0);
}

static void test_no_fence_barrier_fallback(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res a = {0, 0, 0}, b = {0, 1, 0};
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 0), 0);
  assert_int_equal(use_and_retire(&q, &f, &a), 0); /* queued */
  f.fail_record = 1;
  assert_int_equal(use_and_retire(&q, &f, &b), 0); /* barrier */
  assert_int_equal(f.barriers, 1);
  assert_true(a.released && b.released);
  assert_int_equal(q.st.barrier_fallbacks, 1);
  assert_int_equal(q.st.released, 2);
  assert_int_equal(q.st.deferred, 1);
  assert_int_equal(q.st.leaked, 0);
  assert_int_equal(q.st.in_flight, 0);
  dspk__retire_fini(&q);
  assert_int_equal(f.live_fences, 0);
}

static void test_barrier_failure_leaks(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res a = {0, 0, 0}, b = {0, 1, 0};
  struct dspk__devstats ds = {0};
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 0), 0);
  assert_int_equal(use_and_retire(&q, &f, &a), 0);
  f.fail_record = 1;
  f.fail_barrier = 1;
  assert_int_equal(use_and_retire(&q, &f, &b), DSPK_EDEVICE);
  assert_false(b.released);
  assert_false(a.released); /* still behind its fence */
  assert_int_equal(q.st.leaked, 1);
  assert_int_equal(q.st.barrier_fallbacks, 0);
  /* The wait fails too now: a is leaked, never released early. */
  f.fail_wait = 1;
  assert_int_equal(dspk__retire_sync(&q), DSPK_EDEVICE);
  assert_false(a.released);
  assert_int_equal(q.st.leaked, 2);
  assert_int_equal(q.st.in_flight, 0);
  dspk__retire_stats_fill(&q, &ds);
  assert_int_equal(ds.retire_leaked, 2);
  assert_int_equal(ds.retire_deferred, 1);
  assert_int_equal(ds.retire_released, 0);
  assert_int_equal(ds.retire_max_in_flight, 1);
  dspk__retire_fini(&q);
  assert_int_equal(f.live_fences, 0);
}

static void test_query_error_falls_back(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res r[5];
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 0), 0);
  for (int i = 0; i < 5; i++) {
    r[i] = (struct res){0, (uint64_t)i, 0};
    assert_int_equal(use_and_retire(&q, &f, &r[i]), 0);
  }
  f.completed = 1; /* r[0] done */
  f.fail_query = 1;
  assert_int_equal(dspk__retire_drain(&q), 5);
  assert_int_equal(f.barriers, 1);
  assert_int_equal(q.st.barrier_fallbacks, 1);
  assert_int_equal(q.st.released, 5);
  assert_int_equal(q.st.in_flight, 0);
  dspk__retire_fini(&q);
  assert_int_equal(f.live_fences, 0);
}

static void test_wait_error_at_capacity(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct res r[3];
  (void)state;
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 2), 0);
  for (int i = 0; i < 3; i++) {
    r[i] = (struct res){0, (uint64_t)i, 0};
    if (i == 2)
      f.fail_wait = 1;
    assert_int_equal(use_and_retire(&q, &f, &r[i]), 0);
  }
  /* The failed wait turned into a barrier that released both old entries;
   * the new one is queued behind its fence. */
  assert_int_equal(q.st.barrier_fallbacks, 1);
  assert_true(r[0].released && r[1].released && !r[2].released);
  assert_int_equal(q.st.in_flight, 1);
  f.fail_wait = 0;
  dspk__retire_fini(&q);
  assert_true(r[2].released);
  assert_int_equal(f.live_fences, 0);
}

static void test_null_release_and_fini_null(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  struct dspk__retire zero = {0};
  int x;
  (void)state;
  dspk__retire_fini(NULL);
  dspk__retire_fini(&zero);
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 1), 0);
  f.submitted++;
  assert_int_equal(dspk__retire_push(&q, NULL, NULL, &x), 0);
  dspk__retire_fini(&q);
  assert_int_equal(q.st.released, 1);
  assert_int_equal(f.live_fences, 0);
}

/* A fixed-seed random interleaving of work, pushes, drains, syncs and
 * progress, with occasional failures: the counters must always balance and
 * no release may come early (checked inside release()). */
static void test_random_trace(void **state) {
  struct fake f = {0};
  struct dspk__retire q;
  enum { N = 4000 };
  struct res *r = calloc(N, sizeof(*r));
  uint32_t s = 12345;
  uint64_t pushed = 0;
  (void)state;
  assert_non_null(r);
  assert_int_equal(dspk__retire_init(&q, &fake_ops, &f, 8), 0);
  for (int i = 0; i < N; i++) {
    uint32_t c;
    s = s * 1664525u + 1013904223u;
    c = (s >> 8) % 100;
    f.fail_record = c < 3;
    f.fail_barrier = c < 1;
    f.fail_query = c >= 97;
    r[i].id = (uint64_t)i;
    use_and_retire(&q, &f, &r[i]);
    pushed++;
    f.fail_record = f.fail_barrier = f.fail_query = 0;
    if (c % 7 == 0 && f.completed < f.submitted)
      f.completed += 1 + (s >> 20) % (f.submitted - f.completed);
    if (c % 11 == 0)
      dspk__retire_drain(&q);
    if (c == 50)
      assert_int_equal(dspk__retire_sync(&q), 0);
    assert_int_equal(q.st.released + q.st.leaked + q.st.in_flight, pushed);
    assert_true(q.st.in_flight <= 8);
  }
  dspk__retire_fini(&q);
  assert_int_equal(q.st.released + q.st.leaked, pushed);
  assert_true(q.st.leaked > 0 && q.st.barrier_fallbacks > 0);
  assert_int_equal(q.st.max_in_flight, 8);
  assert_int_equal(f.live_fences, 0);
  free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deferred_until_fence),
      cmocka_unit_test(test_capacity_waits_on_oldest),
      cmocka_unit_test(test_no_fence_barrier_fallback),
      cmocka_unit_test(test_barrier_failure_leaks),
      cmocka_unit_test(test_query_error_falls_back),
      cmocka_unit_test(test_wait_error_at_capacity),
      cmocka_unit_test(test_null_release_and_fini_null),
      cmocka_unit_test(test_random_trace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
