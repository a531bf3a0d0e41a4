/*
 * dspk__npy_view (client/submit/npy.h): dspk-submit maps large .npy inputs
 * read-only instead of reading them.  Each case writes a file with
 * dspk__npy_save (fixed-seed data), then compares the view with
 * dspk__npy_load of the same file (shape, dtype, every byte) and with the
 * data written; small files take the read path (no mapping); a truncated
 * large file and a missing file fail with the same codes as the read path;
 * a view stays valid until freed, and even when the file is replaced under
 * it (dspk__npy_save renames a new file over the old one: outfile.h); and
 * dspk__npy_save over an existing file leaves exactly the new array.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/submit/npy.h"
#include "dspk/errors.h"

static char dir[64], path[128];

static void *pattern(size_t n, uint64_t seed) {
  unsigned char *p = malloc(n ? n : 1);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)(x >> 32);
  }
  return p;
}

/* Saves an array of the shape, views and loads it, and compares. */
static void check(dspk_dtype dt, int rank, const uint64_t *shape, int expect_map) {
  size_t n = dspk__npy_itemsize(dt);
  dspk__npy v, l;
  char err[256];
  void *data;
  for (int i = 0; i < rank; i++)
    n *= shape[i];
  data = pattern(n, n + (uint64_t)dt);
  assert_int_equal(dspk__npy_save(path, dt, rank, shape, data, err, sizeof err), 0);
  memset(&v, 0, sizeof v);
  memset(&l, 0, sizeof l);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), 0);
  assert_int_equal(dspk__npy_load(path, &l, err, sizeof err), 0);
  assert_int_equal(v.dtype, dt);
  assert_int_equal(v.rank, rank);
  assert_int_equal(v.nbytes, n);
  assert_int_equal(v.count, l.count);
  assert_memory_equal(v.shape, l.shape, sizeof v.shape);
  assert_int_equal(v.map != NULL, expect_map);
  assert_null(l.map);
  if (n) {
    assert_memory_equal(v.data, l.data, n);
    assert_memory_equal(v.data, data, n);
  }
  if (v.map) /* data starts inside the mapping, after the header */
    assert_true((char *)v.data > (char *)v.map &&
                (char *)v.data + n == (char *)v.map + v.map_len);
  dspk__npy_free(&v);
  assert_null(v.data);
  dspk__npy_free(&l);
  free(data);
}

static void test_view_matches_load(void **state) {
  uint64_t big[2] = {1024, 1024}, odd[3] = {3, 77, 1001}, small[2] = {4, 5};
  uint64_t vec[1] = {65536}, edge[1] = {(256u << 10) / 8};
  (void)state;
  check(DSPK_F32, 2, big, 1);
  check(DSPK_F64, 3, odd, 1);
  check(DSPK_C64, 1, vec, 1);
  check(DSPK_C128, 1, vec, 1);
  check(DSPK_F16, 3, odd, 1);
  check(DSPK_F32, 2, small, 0); /* below the mapping threshold: read */
  check(DSPK_F64, 1, edge, 1);  /* header + 256 KiB: mapped */
}

static void test_view_errors(void **state) {
  uint64_t big[2] = {512, 512};
  void *data = pattern(512 * 512 * 4, 3);
  char err[256];
  dspk__npy v;
  (void)state;
  memset(&v, 0, sizeof v);
  assert_int_equal(dspk__npy_save(path, DSPK_F32, 2, big, data, err, sizeof err), 0);
  /* One element short: refused like the read path does. */
  assert_int_equal(truncate(path, 128 + 512 * 512 * 4 - 4), 0);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), DSPK_EINVAL);
  assert_non_null(strstr(err, path));
  assert_null(v.data);
  unlink(path);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), DSPK_ENOENT);
  free(data);
}

/* dspk__npy_save replaces an existing file: a smaller array over a larger
 * file, and a larger one over it again, both read back exactly (the reader
 * refuses any stale tail). */
static void test_save_over_existing(void **state) {
  uint64_t big[2] = {700, 900}, small[1] = {1000};
  void *a = pattern(700 * 900 * 8, 7), *b = pattern(1000 * 4, 8);
  char err[256];
  dspk__npy v;
  struct stat st;
  (void)state;
  assert_int_equal(dspk__npy_save(path, DSPK_F64, 2, big, a, err, sizeof err), 0);
  assert_int_equal(dspk__npy_save(path, DSPK_F32, 1, small, b, err, sizeof err), 0);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, 128 + 1000 * 4);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), 0);
  assert_int_equal(v.dtype, DSPK_F32);
  assert_int_equal(v.count, 1000);
  assert_memory_equal(v.data, b, 1000 * 4);
  dspk__npy_free(&v);
  assert_int_equal(dspk__npy_save(path, DSPK_F64, 2, big, a, err, sizeof err), 0);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), 0);
  assert_int_equal(v.count, 700 * 900);
  assert_memory_equal(v.data, a, 700 * 900 * 8);
  dspk__npy_free(&v);
  free(a);
  free(b);
}

static void test_view_then_rewrite(void **state) {
  uint64_t big[1] = {300000};
  void *a = pattern(300000 * 4, 5), *b = pattern(300000 * 4, 6);
  char err[256];
  dspk__npy v;
  (void)state;
  assert_int_equal(dspk__npy_save(path, DSPK_F32, 1, big, a, err, sizeof err), 0);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), 0);
  assert_non_null(v.map);
  assert_memory_equal(v.data, a, 300000 * 4);
  /* The file replaced while the view is held: the view keeps the old
   * data (the old inode), as a mapped input of a command whose output has
   * the input's name does. */
  assert_int_equal(dspk__npy_save(path, DSPK_F32, 1, big, b, err, sizeof err), 0);
  assert_memory_equal(v.data, a, 300000 * 4);
  dspk__npy_free(&v);
  assert_int_equal(dspk__npy_view(path, &v, err, sizeof err), 0);
  assert_memory_equal(v.data, b, 300000 * 4);
  dspk__npy_free(&v);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_view_matches_load),
      cmocka_unit_test(test_view_errors),
      cmocka_unit_test(test_view_then_rewrite),
      cmocka_unit_test(test_save_over_existing),
  };
  int rc;
  snprintf(dir, sizeof dir, "/tmp/dspk-npyview-XXXXXX");
  if (!mkdtemp(dir))
    return 1;
  snprintf(path, sizeof path, "%s/x.npy", dir);
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(path);
  rmdir(dir);
  return rc;
}
