/*
 * Unit tests of dspk-submit's .npy module (client/submit/npy.c).
 *
 * Three kinds of checks: round trips through our own writer and reader for
 * every dtype and several ranks; files written by numpy itself (python3 with
 * numpy is run from the test into a private temporary directory, and numpy
 * also reads back a file we wrote and checks it); and malformed images built
 * byte by byte in memory (bad magic, versions, truncations, every header
 * syntax error the parser names, rank and size limits, data-length
 * mismatches); .npz archives made by numpy and by zipfile (stored and
 * deflated members, broken ones); .npy streams through a pipe.  The python
 * interpreter comes from argv[1] (set by CMake);
 * without it the numpy cases are skipped, the others still run.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/submit/npy.h"
#include "client/submit/numfmt.h"
#include "dspk/errors.h"

static const char *python;
static char tmpdir[256];

/* Value of element i in every generated array (numpy generates the same). */
static double val_re(uint64_t i) { return (double)i * 0.5 - 3.0; }
static double val_im(uint64_t i) { return 1.0 - (double)i * 0.25; }

static void fill(dspk_dtype dt, void *data, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    switch (dt) {
    case DSPK_F32:
      ((float *)data)[i] = (float)val_re(i);
      break;
    case DSPK_F64:
      ((double *)data)[i] = val_re(i);
      break;
    case DSPK_C64:
      ((float *)data)[2 * i] = (float)val_re(i);
      ((float *)data)[2 * i + 1] = (float)val_im(i);
      break;
    case DSPK_C128:
      ((double *)data)[2 * i] = val_re(i);
      ((double *)data)[2 * i + 1] = val_im(i);
      break;
    case DSPK_F16: /* checked separately, by bit pattern */
      ((uint16_t *)data)[i] = (uint16_t)i;
      break;
    default:
      break;
    }
  }
}

static void check_values(const dspk__npy *a) {
  void *buf = calloc(1, a->nbytes + 1);
  assert_non_null(buf);
  fill(a->dtype, buf, a->count);
  assert_memory_equal(a->data, buf, a->nbytes);
  free(buf);
}

/* ---- round trips --------------------------------------------------------- */

static void roundtrip_one(dspk_dtype dt, int rank, const uint64_t *shape) {
  char path[300], err[256];
  dspk__npy a;
  uint64_t n = 1;
  void *data;
  for (int i = 0; i < rank; i++)
    n *= shape[i];
  data = calloc(1, n * dspk__npy_itemsize(dt) + 1);
  assert_non_null(data);
  fill(dt, data, n);
  snprintf(path, sizeof path, "%s/rt.npy", tmpdir);
  assert_int_equal(dspk__npy_save(path, dt, rank, shape, data, err, sizeof err),
                   0);
  assert_int_equal(dspk__npy_load(path, &a, err, sizeof err), 0);
  assert_int_equal(a.dtype, dt);
  assert_int_equal(a.rank, rank);
  assert_int_equal(a.count, n);
  for (int i = 0; i < rank; i++)
    assert_int_equal(a.shape[i], shape[i]);
  assert_int_equal(a.nbytes, n * dspk__npy_itemsize(dt));
  assert_memory_equal(a.data, data, a.nbytes);
  dspk__npy_free(&a);
  dspk__npy_free(&a); /* a zeroed struct is fine */
  dspk__npy_free(NULL);
  free(data);
}

static void test_roundtrip(void **state) {
  (void)state;
  static const uint64_t s0[1] = {0}, s1[1] = {7}, s2[2] = {3, 5},
                        s3[3] = {2, 0, 4}, s8[8] = {1, 2, 1, 2, 1, 2, 1, 3};
  dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128, DSPK_F16};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    roundtrip_one(dts[k], 0, s0);
    roundtrip_one(dts[k], 1, s1);
    roundtrip_one(dts[k], 2, s2);
    roundtrip_one(dts[k], 3, s3);
    roundtrip_one(dts[k], 8, s8);
  }
}

static void test_header_layout(void **state) {
  (void)state;
  static const uint64_t shape[2] = {3, 4};
  unsigned char *h;
  size_t len;
  assert_int_equal(dspk__npy_header_build(DSPK_F32, 2, shape, &h, &len), 0);
  assert_int_equal(len % 64, 0);
  assert_memory_equal(h, "\x93NUMPY\x01\x00", 8);
  assert_int_equal((size_t)h[8] | (size_t)h[9] << 8, len - 10);
  assert_int_equal(h[len - 1], '\n');
  assert_memory_equal(h + 10,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (3, "
                      "4), }",
                      56);
  free(h);
  assert_int_equal(dspk__npy_header_build(DSPK_BF16, 2, shape, &h, &len),
                   DSPK_EDTYPE);
}

static void test_save_errors(void **state) {
  (void)state;
  char err[256];
  uint64_t shape[1] = {1};
  float x = 1;
  assert_int_equal(dspk__npy_save("/nonexistent-dir/x.npy", DSPK_F32, 1, shape,
                                  &x, err, sizeof err),
                   DSPK_ENOENT);
  assert_non_null(strstr(err, "/nonexistent-dir/x.npy"));
  assert_int_equal(
      dspk__npy_save("/tmp/x.npy", DSPK_BF16, 1, shape, &x, err, sizeof err),
      DSPK_EDTYPE);
  assert_int_equal(dspk__npy_save("/tmp/x.npy", DSPK_F32, DSPK_MAX_RANK + 1,
                                  shape, &x, err, sizeof err),
                   DSPK_ELIMIT);
}

/* ---- files written by numpy ---------------------------------------------- */

static int run_python(const char *code) {
  char script[300];
  FILE *f;
  pid_t pid;
  int st;
  snprintf(script, sizeof script, "%s/gen.py", tmpdir);
  f = fopen(script, "w");
  assert_non_null(f);
  fputs(code, f);
  fclose(f);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl(python, python, script, tmpdir, (char *)NULL);
    _exit(127);
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static const char gen_py[] =
    "import sys, numpy as np\n"
    "d = sys.argv[1]\n"
    "def v(shape, dt):\n"
    "    n = int(np.prod(shape))\n"
    "    i = np.arange(n, dtype=np.float64)\n"
    "    x = i * 0.5 - 3.0\n"
    "    if np.dtype(dt).kind == 'c':\n"
    "        x = x + 1j * (1.0 - i * 0.25)\n"
    "    return x.astype(dt).reshape(shape)\n"
    "np.save(d + '/f4.npy', v((2, 3), '<f4'))\n"
    "np.save(d + '/f8.npy', v((), '<f8'))\n"
    "np.save(d + '/c8.npy', v((4,), '<c8'))\n"
    "np.save(d + '/c16.npy', v((2, 2, 2), '<c16'))\n"
    "np.save(d + '/f2.npy', np.array([0.5, -2.0, 1024.0], dtype='<f2'))\n"
    "np.save(d + '/empty.npy', v((0, 3), '<f4'))\n"
    "np.save(d + '/fortran.npy', np.asfortranarray(v((2, 3), '<f8')))\n"
    "np.save(d + '/big.npy', v((5,), '>f4'))\n"
    "np.save(d + '/i4.npy', np.arange(4, dtype='<i4'))\n"
    "np.save(d + '/struct.npy', np.zeros(2, dtype=[('a', '<f4'), ('b', "
    "'<f8')]))\n"
    "for ver in ((1, 0), (2, 0), (3, 0)):\n"
    "    with open(d + '/v%d.npy' % ver[0], 'wb') as f:\n"
    "        np.lib.format.write_array(f, v((3, 2), '<f8'), version=ver)\n";

static void load_ok(const char *name, dspk_dtype dt, int rank,
                    const uint64_t *shape, dspk__npy *a) {
  char path[300], err[256] = "";
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  if (dspk__npy_load(path, a, err, sizeof err) != 0)
    fail_msg("%s: %s", name, err);
  assert_int_equal(a->dtype, dt);
  assert_int_equal(a->rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(a->shape[i], shape[i]);
}

static void load_fail(const char *name, int code, const char *needle) {
  char path[300], err[256] = "";
  dspk__npy a;
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  assert_int_equal(dspk__npy_load(path, &a, err, sizeof err), code);
  if (strstr(err, path) == NULL || strstr(err, needle) == NULL)
    fail_msg("%s: message '%s' lacks the path or '%s'", name, err, needle);
}

/* Reads the whole file at p into buf (cap bytes); returns its length. */
static size_t slurp(const char *p, char *buf, size_t cap) {
  FILE *f = fopen(p, "rb");
  size_t n;
  assert_non_null(f);
  n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

/* The temporaries of outfile.c left in tmpdir. */
static int leftovers(void) {
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  int n = 0;
  assert_non_null(d);
  while ((e = readdir(d)) != NULL)
    n += strncmp(e->d_name, ".dspk-submit-", 13) == 0;
  closedir(d);
  return n;
}

/* dspk__npy_save replaces a file whole or not at all (outfile.h): a write
 * that fails past the file size limit leaves an existing file, and a
 * symlink to it, as they were, and no temporary; a complete one replaces
 * the link's target, keeping its mode and the link. */
static void test_save_replaces(void **state) {
  static const char old[] = "the old contents\n";
  char file[300], link[300], buf[64], err[256];
  uint64_t shape[1] = {20000};
  float *x = calloc(20000, sizeof *x);
  struct rlimit saved, low;
  struct stat st;
  FILE *f;
  (void)state;
  assert_non_null(x);
  snprintf(file, sizeof file, "%s/keep.npy", tmpdir);
  snprintf(link, sizeof link, "%s/link.npy", tmpdir);
  f = fopen(file, "wb");
  assert_non_null(f);
  fputs(old, f);
  fclose(f);
  assert_int_equal(chmod(file, 0640), 0);
  assert_int_equal(symlink("keep.npy", link), 0);

  signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
  low = saved;
  low.rlim_cur = 4096;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &low), 0);
  assert_int_equal(dspk__npy_save(file, DSPK_F32, 1, shape, x, err, sizeof err),
                   DSPK_EIO);
  assert_non_null(strstr(err, "File too large"));
  assert_int_equal(dspk__npy_save(link, DSPK_F32, 1, shape, x, err, sizeof err),
                   DSPK_EIO);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, SIG_DFL);
  assert_int_equal(slurp(file, buf, sizeof buf), strlen(old));
  assert_memory_equal(buf, old, strlen(old));
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(leftovers(), 0);

  assert_int_equal(dspk__npy_save(link, DSPK_F32, 1, shape, x, err, sizeof err), 0);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(stat(file, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0640);
  assert_int_equal(st.st_size, 128 + 20000 * 4);
  assert_int_equal(leftovers(), 0);
  unlink(link);
  unlink(file);
  free(x);
}

static void test_numpy_files(void **state) {
  (void)state;
  static const uint64_t sf4[2] = {2, 3}, sc8[1] = {4}, sc16[3] = {2, 2, 2},
                        sf2[1] = {3}, sempty[2] = {0, 3}, sv[2] = {3, 2};
  char name[16];
  dspk__npy a;
  if (python == NULL)
    skip();
  assert_int_equal(run_python(gen_py), 0);

  load_ok("f4.npy", DSPK_F32, 2, sf4, &a);
  check_values(&a);
  dspk__npy_free(&a);
  load_ok("f8.npy", DSPK_F64, 0, NULL, &a);
  assert_int_equal(a.count, 1);
  check_values(&a);
  dspk__npy_free(&a);
  load_ok("c8.npy", DSPK_C64, 1, sc8, &a);
  check_values(&a);
  dspk__npy_free(&a);
  load_ok("c16.npy", DSPK_C128, 3, sc16, &a);
  check_values(&a);
  dspk__npy_free(&a);
  load_ok("f2.npy", DSPK_F16, 1, sf2, &a);
  /* IEEE half: 0.5 = 0x3800, -2.0 = 0xc000, 1024.0 = 0x6400 */
  assert_int_equal(((uint16_t *)a.data)[0], 0x3800);
  assert_int_equal(((uint16_t *)a.data)[1], 0xc000);
  assert_int_equal(((uint16_t *)a.data)[2], 0x6400);
  dspk__npy_free(&a);
  load_ok("empty.npy", DSPK_F32, 2, sempty, &a);
  assert_int_equal(a.count, 0);
  assert_int_equal(a.nbytes, 0);
  dspk__npy_free(&a);
  for (int v = 1; v <= 3; v++) {
    snprintf(name, sizeof name, "v%d.npy", v);
    load_ok(name, DSPK_F64, 2, sv, &a);
    check_values(&a);
    dspk__npy_free(&a);
  }
  load_fail("fortran.npy", DSPK_ENOTSUP, "Fortran");
  load_fail("big.npy", DSPK_EDTYPE, "big-endian");
  load_fail("i4.npy", DSPK_EDTYPE, "'<i4'");
  load_fail("struct.npy", DSPK_EDTYPE, "structured");
  load_fail("missing.npy", DSPK_ENOENT, "No such file");
  load_fail(".", DSPK_EINVAL, "not a regular file");
}

/* numpy reads what we write, with the same values and shapes. */
static void test_numpy_reads_ours(void **state) {
  (void)state;
  static const uint64_t s2[2] = {3, 5}, s0[1] = {0}, s3[3] = {2, 1, 3};
  char path[300], err[256];
  double d[15];
  float c[12];
  if (python == NULL)
    skip();
  fill(DSPK_F64, d, 15);
  fill(DSPK_C64, c, 6);
  snprintf(path, sizeof path, "%s/ours_f8.npy", tmpdir);
  assert_int_equal(dspk__npy_save(path, DSPK_F64, 2, s2, d, err, sizeof err),
                   0);
  snprintf(path, sizeof path, "%s/ours_scalar.npy", tmpdir);
  assert_int_equal(dspk__npy_save(path, DSPK_F64, 0, s0, d, err, sizeof err),
                   0);
  snprintf(path, sizeof path, "%s/ours_c8.npy", tmpdir);
  assert_int_equal(dspk__npy_save(path, DSPK_C64, 3, s3, c, err, sizeof err),
                   0);
  assert_int_equal(
      run_python("import sys, numpy as np\n"
                 "d = sys.argv[1]\n"
                 "a = np.load(d + '/ours_f8.npy')\n"
                 "i = np.arange(15.0)\n"
                 "assert a.dtype == np.float64 and a.shape == (3, 5)\n"
                 "assert (a.ravel() == i * 0.5 - 3.0).all()\n"
                 "s = np.load(d + '/ours_scalar.npy')\n"
                 "assert s.shape == () and s == -3.0\n"
                 "c = np.load(d + '/ours_c8.npy')\n"
                 "assert c.dtype == np.complex64 and c.shape == (2, 1, 3)\n"
                 "i = np.arange(6.0)\n"
                 "assert (c.ravel() == (i*0.5-3.0) + 1j*(1.0-i*0.25)).all()\n"),
      0);
}

/* ---- malformed images in memory ----------------------------------------- */

/* Builds a v1 (or v2 when ver == 2) image with header text hdr and ndata
 * zero bytes of data; returns its length. */
static size_t image(unsigned char *buf, int ver, const char *hdr,
                    size_t ndata) {
  size_t hl = strlen(hdr), off = ver == 1 ? 10 : 12;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)ver;
  buf[7] = 0;
  buf[8] = (unsigned char)(hl & 0xff);
  buf[9] = (unsigned char)(hl >> 8);
  if (ver != 1) {
    buf[10] = (unsigned char)(hl >> 16);
    buf[11] = (unsigned char)(hl >> 24);
  }
  memcpy(buf + off, hdr, hl);
  memset(buf + off + hl, 0, ndata);
  return off + hl + ndata;
}

static int mem_load(const unsigned char *buf, size_t len, char *err) {
  dspk__npy a;
  int rc = dspk__npy_load_mem(buf, len, "mem.npy", &a, err, 256);
  if (rc == 0)
    dspk__npy_free(&a);
  return rc;
}

static void expect_mem(int ver, const char *hdr, size_t ndata, int code,
                       const char *needle) {
  static unsigned char buf[4096];
  char err[256] = "";
  size_t len = image(buf, ver, hdr, ndata);
  int rc = mem_load(buf, len, err);
  if (rc != code)
    fail_msg("header %s: got %d (%s), want %d", hdr, rc, err, code);
  if (code != 0 && (strstr(err, "mem.npy: ") != err || !strstr(err, needle)))
    fail_msg("header %s: message '%s' lacks '%s'", hdr, err, needle);
}

static void test_malformed_headers(void **state) {
  (void)state;
  /* Accepted variants: what numpy writes, double quotes, any key order,
   * no trailing comma, the '|' byte-order mark, extra whitespace. */
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
             48, 0, "");
  expect_mem(1, "{\"shape\": (2,), \"descr\": \"<f8\", \"fortran_order\": False}",
             16, 0, "");
  expect_mem(1, "{'descr':'|c8','fortran_order':False,'shape':(1,2,)}   \n", 16,
             0, "");
  expect_mem(2, "{'descr': '<c16', 'fortran_order': False, 'shape': ()}\n", 16,
             0, "");

  /* Syntax errors. */
  expect_mem(1, "", 0, DSPK_EINVAL, "expected '{'");
  expect_mem(1, "[]", 0, DSPK_EINVAL, "expected '{'");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", 12,
             DSPK_EINVAL, "expected ',' or '}'");
  expect_mem(1, "{'descr' '<f4', 'fortran_order': False, 'shape': (3,)}", 12,
             DSPK_EINVAL, "expected ':'");
  expect_mem(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}", 12,
             DSPK_EINVAL, "");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': false, 'shape': (3,)}", 12,
             DSPK_EINVAL, "True or False");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", 12,
             DSPK_EINVAL, "trailing comma");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", 0,
             DSPK_EINVAL, "non-negative");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3 4)}", 0,
             DSPK_EINVAL, "expected ',' or ')'");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", 0,
             DSPK_EINVAL, "expected '('");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False}", 0, DSPK_EINVAL,
             "missing key 'shape'");
  expect_mem(1, "{'descr': '<f4', 'descr': '<f4', 'shape': (1,)}", 4,
             DSPK_EINVAL, "repeated key 'descr'");
  expect_mem(1,
             "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
             4, DSPK_EINVAL, "unexpected or repeated key 'x'");
  expect_mem(1,
             "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk",
             4, DSPK_EINVAL, "trailing bytes");
  expect_mem(1, "{'descr': '<\\f4', 'fortran_order': False, 'shape': (1,)}",
             4, DSPK_EINVAL, "unsupported character");
  expect_mem(1,
             "{'descr': '<ffffffffffffffffffffffffffffffffffffffff4', "
             "'fortran_order': False, 'shape': (1,)}",
             4, DSPK_EINVAL, "string too long");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,", 4,
             DSPK_EINVAL, "expected a non-negative integer");
  /* A dimension as numpy writes it: no leading zero (numpy.load refuses
   * "06"; "00" is none of numpy's either), at most 2^63-1 (numpy's intp, a
   * dspk tensor's int64), ELIMIT with its digits beyond, whatever the other
   * axes (probe 20 D1, D3). */
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (06,)}", 24,
             DSPK_EINVAL, "malformed .npy header: dimension with a leading zero at offset 51");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 00)}", 0,
             DSPK_EINVAL, "dimension with a leading zero");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3)}", 0, 0, "");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(12345678901234567890,)}",
             4, DSPK_ELIMIT, "shape[0]: 12345678901234567890 is more than 2^63-1");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(0, 9223372036854775808)}",
             0, DSPK_ELIMIT, "shape[1]: 9223372036854775808 is more than 2^63-1, the "
             "largest dimension numpy or a dspk tensor takes");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(18446744073709551615, 0)}",
             0, DSPK_ELIMIT, "shape[0]: 18446744073709551615 is more than 2^63-1");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(0, 123456789012345678901234567890123456789012345678901234567890)}",
             0, DSPK_ELIMIT, "shape[1]: 1234567890123456789012345678901234567890... is more");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(0, 9223372036854775807)}",
             0, DSPK_ELIMIT, "array too large: shape (0, 9223372036854775807) of f32 has no "
             "elements, but the product of its dimensions (0 as 1) times the item size 4 is "
             "3.69e+19 bytes, over the limit of 2^63-1 bytes that holds even with no elements");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(4294967296, 4294967296, 0)}",
             0, DSPK_ELIMIT, "shape (4294967296, 4294967296, 0) of f32 has no elements, but "
             "the product of its dimensions (0 as 1) times the item size 4 is 7.38e+19 bytes");
  /* The largest extent that holds: (0 as 1) * 2^61 * 4 = 2^63 passes, 2^61 - 1 holds. */
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(0, 2305843009213693952)}",
             0, DSPK_ELIMIT, "over the limit of 2^63-1 bytes");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(0, 2305843009213693951)}",
             0, 0, "");

  /* Semantics: dtype, order, limits. */
  expect_mem(1, "{'descr': '>f8', 'fortran_order': False, 'shape': (1,)}", 8,
             DSPK_EDTYPE, "big-endian");
  expect_mem(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1,)}", 8,
             DSPK_EDTYPE, "unsupported dtype '<i8'");
  expect_mem(1, "{'descr': 'f4', 'fortran_order': False, 'shape': (1,)}", 4,
             DSPK_EDTYPE, "unsupported dtype 'f4'");
  expect_mem(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': "
                "(1,)}",
             4, DSPK_EDTYPE, "structured");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}",
             16, DSPK_ENOTSUP, "Fortran");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(1,1,1,1,1,1,1,1,1)}",
             4, DSPK_ELIMIT, "more than 8");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': "
                "(4294967296, 4294967296, 16)}",
             4, DSPK_ELIMIT,
             "array too large: shape (4294967296, 4294967296, 16) of f32 is 1.18e+21 bytes, "
             "over the limit of 2^63-1 bytes (protocol.md, Tensors)");
  expect_mem(1, "{'descr': '<c16', 'fortran_order': False, 'shape': "
                "(1152921504606846976,)}",
             4, DSPK_ELIMIT,
             "array too large: shape (1152921504606846976,) of c128 is 1.84e+19 bytes");

  /* Data length must match exactly. */
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)}",
             47, DSPK_EINVAL, "needs 48 bytes, file has 47");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)}",
             49, DSPK_EINVAL, "needs 48 bytes, file has 49");
  expect_mem(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,)}", 0,
             0, "");
}

/* Every header form docs/cli.md says the parser accepts (quotes of either
 * kind, any key order, blanks of every kind or none around any token, a
 * trailing comma or none, '|') is one numpy.load reads too, as the same
 * dtype and shape: the page said the parser takes "only what numpy
 * writes", which these are not (probe 22 D3). */
static void test_numpy_reads_accepted(void **state) {
  static const struct {
    const char *hdr;
    size_t ndata;
    dspk_dtype dt;
    int rank;
    uint64_t shape[2];
    const char *np_descr, *np_shape;
  } acc[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }\n", 48, DSPK_F32, 2,
       {3, 4}, "<f4", "(3, 4)"},
      {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}", 8, DSPK_F32, 1,
       {2, 0}, "<f4", "(2,)"},
      {"{'descr':'<f8','fortran_order':False,'shape':(1,2)}", 16, DSPK_F64, 2, {1, 2},
       "<f8", "(1, 2)"},
      {"{'shape': (2,), 'fortran_order': False, 'descr': '<c8'}", 16, DSPK_C64, 1, {2, 0},
       "<c8", "(2,)"},
      {"{\"shape\": (), \"descr\": \"<c16\", \"fortran_order\": False, }", 16, DSPK_C128,
       0, {0, 0}, "<c16", "()"},
      {"{\t'descr'\n:\r'<f4' ,'fortran_order' : False,\n'shape':( 2 , 3 , ) }   \n", 24,
       DSPK_F32, 2, {2, 3}, "<f4", "(2, 3)"},
      {"{'descr': '|f2', 'fortran_order': False, 'shape': (0, 3)}", 0, DSPK_F16, 2, {0, 3},
       "<f2", "(0, 3)"},
  };
  static unsigned char buf[256];
  char path[300], err[256], py[4096];
  size_t w;
  (void)state;
  if (python == NULL)
    skip();
  w = (size_t)snprintf(py, sizeof py, "import sys, numpy as np\nd = sys.argv[1]\n");
  for (size_t i = 0; i < sizeof acc / sizeof acc[0]; i++) {
    dspk__npy a;
    size_t len = image(buf, 1, acc[i].hdr, acc[i].ndata);
    FILE *f;
    snprintf(path, sizeof path, "%s/acc_%zu.npy", tmpdir, i);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    if (dspk__npy_load(path, &a, err, sizeof err) != 0)
      fail_msg("header %s: %s", acc[i].hdr, err);
    assert_int_equal(a.dtype, acc[i].dt);
    assert_int_equal(a.rank, acc[i].rank);
    for (int k = 0; k < a.rank; k++)
      assert_int_equal(a.shape[k], acc[i].shape[k]);
    dspk__npy_free(&a);
    w += (size_t)snprintf(py + w, sizeof py - w,
                          "a = np.load(d + '/acc_%zu.npy')\n"
                          "assert a.dtype == np.dtype('%s') and a.shape == %s, (%zu, a)\n",
                          i, acc[i].np_descr, acc[i].np_shape, i);
    assert_true(w < sizeof py);
  }
  assert_int_equal(run_python(py), 0);
}

static void test_malformed_preamble(void **state) {
  (void)state;
  unsigned char buf[256];
  char err[256];
  size_t len;
  const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}";

  len = image(buf, 1, h, 4);
  buf[0] = 'X';
  assert_int_equal(mem_load(buf, len, err), DSPK_EINVAL);
  assert_non_null(strstr(err, "bad magic"));
  assert_int_equal(mem_load(buf, 5, err), DSPK_EINVAL);

  len = image(buf, 1, h, 4);
  buf[6] = 4;
  assert_int_equal(mem_load(buf, len, err), DSPK_EINVAL);
  assert_non_null(strstr(err, "version 4.0"));
  buf[6] = 1;
  buf[7] = 1;
  assert_int_equal(mem_load(buf, len, err), DSPK_EINVAL);
  buf[7] = 0;
  assert_int_equal(mem_load(buf, len, err), 0);
  /* Every truncation fails cleanly. */
  for (size_t cut = 0; cut < len; cut++)
    assert_true(mem_load(buf, cut, err) < 0);

  /* Header length beyond the image, and beyond the limit (v2). */
  len = image(buf, 1, h, 4);
  buf[8] = 0xff;
  buf[9] = 0x7f;
  assert_int_equal(mem_load(buf, len, err), DSPK_EINVAL);
  assert_non_null(strstr(err, "truncated"));
  len = image(buf, 2, h, 4);
  buf[10] = 0x10; /* ~1 MiB */
  assert_int_equal(mem_load(buf, len, err), DSPK_ELIMIT);
  /* Over the limit, not malformed: its size and the limit (probe 19 D5). */
  if (strstr(err, "header of 1048631 bytes, over the limit of 65536 bytes") == NULL ||
      strstr(err, "malformed") != NULL)
    fail_msg("header over the limit: '%s'", err);
  /* A zip archive (an .npz) where a .npy is read says so and what to give,
   * its end record too (an empty archive); other bytes are a bad magic. */
  static const unsigned char zips[][8] = {{'P', 'K', 3, 4, 20, 0, 0, 0},
                                          {'P', 'K', 5, 6, 0, 0, 0, 0}};
  for (size_t z = 0; z < 2; z++) {
    assert_int_equal(mem_load(zips[z], 8, err), DSPK_EINVAL);
    if (strstr(err, "mem.npy: not a .npy file but a zip archive (an .npz?): give it as "
                    "a file named FILE.npz, with :NAME for one of several arrays") == NULL ||
        strstr(err, "standard input") != NULL) /* not read from it (probe 22 D2) */
      fail_msg("zip %zu: '%s'", z, err);
  }
  assert_int_equal(mem_load((const unsigned char *)"PK\x03\x05" "abcdefgh", 12, err),
                   DSPK_EINVAL);
  assert_non_null(strstr(err, "not a .npy file (bad magic)"));
  len = image(buf, 2, h, 4);
  assert_int_equal(mem_load(buf, len, err), 0);
  assert_int_equal(mem_load(buf, 11, err), DSPK_EINVAL);
}

/* The same malformed images through the file reader. */
static void test_malformed_files(void **state) {
  (void)state;
  unsigned char buf[256];
  char path[300], err[256];
  const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}";
  dspk__npy a;
  size_t len = image(buf, 1, h, 8);
  snprintf(path, sizeof path, "%s/trunc.npy", tmpdir);
  for (size_t cut = 0; cut <= len; cut++) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, cut, f), cut);
    fclose(f);
    int rc = dspk__npy_load(path, &a, err, sizeof err);
    if (cut == len) {
      assert_int_equal(rc, 0);
      assert_int_equal(a.count, 2);
      dspk__npy_free(&a);
    } else {
      assert_true(rc < 0);
      assert_non_null(strstr(err, path));
    }
  }
  /* A v1 header of one byte. */
  len = image(buf, 1, "{", 1);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fwrite(buf, 1, len, f);
  fclose(f);
  assert_int_equal(dspk__npy_load(path, &a, err, sizeof err), DSPK_EINVAL);
}

/* ---- .npz archives, standard input and output ---------------------------- */

/* Archives: numpy.savez (stored) and numpy.savez_compressed (deflated),
 * and the same members written with zipfile by hand, stored and deflated
 * explicitly; plus broken ones (a flipped data byte fails the CRC). */
static const char npz_py[] =
    "import sys, zipfile, io, numpy as np\n"
    "d = sys.argv[1]\n"
    "def v(shape, dt):\n"
    "    n = int(np.prod(shape))\n"
    "    i = np.arange(n, dtype=np.float64)\n"
    "    x = i * 0.5 - 3.0\n"
    "    if np.dtype(dt).kind == 'c':\n"
    "        x = x + 1j * (1.0 - i * 0.25)\n"
    "    return x.astype(dt).reshape(shape)\n"
    "a, b, c = v((2, 3), '<f4'), v((4,), '<c8'), v((60, 50), '<f8')\n"
    "np.savez(d + '/stored.npz', a=a, b=b, c=c)\n"
    "np.savez_compressed(d + '/deflated.npz', a=a, b=b, c=c)\n"
    "np.savez(d + '/one.npz', only=c)\n"
    "def npy(x):\n"
    "    f = io.BytesIO(); np.save(f, x); return f.getvalue()\n"
    "for name, method in (('zs', zipfile.ZIP_STORED), ('zd', zipfile.ZIP_DEFLATED)):\n"
    "    with zipfile.ZipFile(d + '/' + name + '.npz', 'w', method) as z:\n"
    "        z.writestr('a.npy', npy(a))\n"
    "        z.writestr('c.npy', npy(c))\n"
    "        z.writestr('raw', npy(b))\n"
    "        z.writestr('bad.npy', b'not an npy at all')\n"
    "# numpy itself reads what the test expects.\n"
    "for f in ('stored', 'deflated', 'zs', 'zd'):\n"
    "    z = np.load(d + '/' + f + '.npz')\n"
    "    assert (z['a'] == a).all() and (z['c'] == c).all()\n"
    "raw = bytearray(open(d + '/zs.npz', 'rb').read())\n"
    "k = raw.find(npy(c)) + 200\n"
    "raw[k] ^= 0xff\n"
    "open(d + '/crc.npz', 'wb').write(bytes(raw))\n"
    "open(d + '/notzip.npz', 'wb').write(b'PK but not really a zip file' * 4)\n"
    "# Edge cases of the zip format, as numpy reads them: of two entries with\n"
    "# one name the last (an update appended to the archive), and NAME itself\n"
    "# before NAME.npy.\n"
    "import warnings\n"
    "with warnings.catch_warnings():\n"
    "    warnings.simplefilter('ignore')\n"
    "    with zipfile.ZipFile(d + '/dup.npz', 'w') as z:\n"
    "        z.writestr('x.npy', npy(a))\n"
    "        z.writestr('x.npy', npy(c))\n"
    "    with zipfile.ZipFile(d + '/both.npz', 'w') as z:\n"
    "        z.writestr('y.npy', npy(a))\n"
    "        z.writestr('y', npy(b))\n"
    "# The only member, not a .npy (probe 19 D5: its error names it).\n"
    "with zipfile.ZipFile(d + '/txt.npz', 'w') as z:\n"
    "    z.writestr('x.npy', b'hello, no npy here')\n"
    "# An archive inside the archive (probe 22 D2), with a .npy beside it,\n"
    "# stored and deflated, and as the only member.\n"
    "inner = open(d + '/one.npz', 'rb').read()\n"
    "for name, method in (('nest', zipfile.ZIP_STORED), ('nestd', zipfile.ZIP_DEFLATED)):\n"
    "    with zipfile.ZipFile(d + '/' + name + '.npz', 'w', method) as z:\n"
    "        z.writestr('a.npy', npy(a))\n"
    "        z.writestr('inner.npz', inner)\n"
    "with zipfile.ZipFile(d + '/nest1.npz', 'w') as z:\n"
    "    z.writestr('inner.npy', inner)\n"
    "z = np.load(d + '/dup.npz')\n"
    "assert z['x'].dtype == c.dtype and (z['x'] == c).all()\n"
    "z = np.load(d + '/both.npz')\n"
    "assert z['y'].dtype == b.dtype and (z['y'] == b).all()\n";

static void npz_ok(const char *spec, dspk_dtype dt, int rank,
                   const uint64_t *shape) {
  char full[400], err[512] = "";
  dspk__npy a;
  snprintf(full, sizeof full, "%s/%s", tmpdir, spec);
  if (dspk__npy_input(full, &a, err, sizeof err) != 0)
    fail_msg("%s: %s", spec, err);
  assert_int_equal(a.dtype, dt);
  assert_int_equal(a.rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(a.shape[i], shape[i]);
  check_values(&a);
  dspk__npy_free(&a);
}

static void npz_fail(const char *spec, int code, const char *needle) {
  char full[400], err[512] = "";
  dspk__npy a;
  snprintf(full, sizeof full, "%s/%s", tmpdir, spec);
  assert_int_equal(dspk__npy_input(full, &a, err, sizeof err), code);
  if (strstr(err, needle) == NULL)
    fail_msg("%s: message '%s' lacks '%s'", spec, err, needle);
}

/* As npz_fail, and the message lacks absent. */
static void npz_fail_not(const char *spec, int code, const char *needle, const char *absent) {
  char full[400], err[512] = "";
  dspk__npy a;
  snprintf(full, sizeof full, "%s/%s", tmpdir, spec);
  assert_int_equal(dspk__npy_input(full, &a, err, sizeof err), code);
  if (strstr(err, needle) == NULL || strstr(err, absent) != NULL)
    fail_msg("%s: message '%s' lacks '%s' or has '%s'", spec, err, needle, absent);
}

static void test_npz(void **state) {
  static const uint64_t sa[2] = {2, 3}, sb[1] = {4}, sc[2] = {60, 50};
  static const char *const kinds[] = {"stored", "deflated", "zs", "zd"};
  char spec[64];
  (void)state;
  if (python == NULL)
    skip();
  assert_int_equal(run_python(npz_py), 0);
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    snprintf(spec, sizeof spec, "%s.npz:a", kinds[k]);
    npz_ok(spec, DSPK_F32, 2, sa);
    snprintf(spec, sizeof spec, "%s.npz:c", kinds[k]);
    npz_ok(spec, DSPK_F64, 2, sc);
    snprintf(spec, sizeof spec, "%s.npz:zz", kinds[k]);
    npz_fail(spec, DSPK_ENOENT, "no array 'zz'");
    snprintf(spec, sizeof spec, "%s.npz", kinds[k]);
    npz_fail(spec, DSPK_EINVAL, "name one as");
  }
  npz_ok("stored.npz:b", DSPK_C64, 1, sb);
  npz_ok("deflated.npz:b", DSPK_C64, 1, sb);
  npz_ok("zd.npz:raw", DSPK_C64, 1, sb); /* an entry named exactly */
  npz_ok("one.npz", DSPK_F64, 2, sc);    /* the only array */
  npz_ok("one.npz:only", DSPK_F64, 2, sc);
  npz_fail("zs.npz:bad", DSPK_EINVAL, "zs.npz:bad: not a .npy file");
  npz_fail("zd.npz:bad", DSPK_EINVAL, "bad magic");
  /* FILE.npz alone: the error names its only member as FILE.npz:NAME. */
  npz_fail("txt.npz", DSPK_EINVAL, "txt.npz:x: not a .npy file");
  npz_fail("crc.npz:c", DSPK_EINVAL, "crc.npz:c: CRC");
  npz_fail("notzip.npz:a", DSPK_EINVAL, "zip archive");
  /* A member that is itself an archive is told as one, with what to do
   * about a member: it was told standard input's advice (probe 22 D2). */
  static const char nested[] =
      "not a .npy file but a zip archive (an .npz inside the .npz?): a member must be "
      "one .npy, an archive inside an archive is not read: extract the inner archive to a "
      "file named FILE.npz and give FILE.npz:NAME";
  char want[512];
  npz_ok("nest.npz:a", DSPK_F32, 2, sa);
  snprintf(want, sizeof want, "nest.npz:inner.npz: %s", nested);
  npz_fail_not("nest.npz:inner.npz", DSPK_EINVAL, want, "standard input");
  snprintf(want, sizeof want, "nestd.npz:inner.npz: %s", nested);
  npz_fail_not("nestd.npz:inner.npz", DSPK_EINVAL, want, "standard input");
  snprintf(want, sizeof want, "nest1.npz:inner: %s", nested);
  npz_fail_not("nest1.npz", DSPK_EINVAL, want, "standard input");
  npz_fail_not("nest1.npz:inner", DSPK_EINVAL, want, "standard input");
  npz_fail("missing.npz:a", DSPK_ENOENT, "missing.npz");
  npz_fail("stored.npz:", DSPK_EINVAL, "empty array name");
  npz_fail("zs.npz:zz", DSPK_ENOENT, "it has: a, c, raw, bad");
  npz_ok("dup.npz:x", DSPK_F64, 2, sc); /* the last of two x.npy, as numpy */
  npz_ok("dup.npz", DSPK_F64, 2, sc);   /* one array (twice): the last */
  npz_ok("both.npz:y", DSPK_C64, 1, sb); /* "y" before "y.npy", as numpy */
  npz_ok("both.npz:y.npy", DSPK_F32, 2, sa);
  /* An archive whose own path holds ".npz:": named alone, the file that
   * is there (probe 21 D-6: it was read as member "x/in.npz" of d.npz,
   * ENOENT d.npz), and with :NAME as before.  One that is not there still
   * splits at the last ".npz:". */
  char dir[400], from[400], to[420];
  snprintf(dir, sizeof dir, "%s/d.npz:x", tmpdir);
  snprintf(from, sizeof from, "%s/one.npz", tmpdir);
  snprintf(to, sizeof to, "%s/in.npz", dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(link(from, to), 0);
  npz_ok("d.npz:x/in.npz", DSPK_F64, 2, sc);
  npz_ok("./d.npz:x/in.npz", DSPK_F64, 2, sc);
  npz_ok("d.npz:x/in.npz:only", DSPK_F64, 2, sc);
  npz_fail("d.npz:x/none.npz", DSPK_ENOENT, "/d.npz: ");
}

/* A .npy read from a pipe to its end, and written to a descriptor. */
static void test_fd_streams(void **state) {
  static const uint64_t shape[2] = {3, 5};
  unsigned char *hdr;
  size_t hlen;
  char path[300], err[256] = "";
  double data[15];
  int fds[2];
  pid_t pid;
  dspk__npy a, b;
  (void)state;
  fill(DSPK_F64, data, 15);
  /* Written through write_fd: the same bytes as a saved file. */
  snprintf(path, sizeof path, "%s/fd.npy", tmpdir);
  {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(dspk__npy_write_fd(fileno(f), DSPK_F64, 2, shape, data,
                                        err, sizeof err),
                     0);
    fclose(f);
  }
  assert_int_equal(dspk__npy_load(path, &a, err, sizeof err), 0);
  check_values(&a);
  assert_int_equal(dspk__npy_header_build(DSPK_F64, 2, shape, &hdr, &hlen), 0);
  /* Through a pipe, in small writes by another process. */
  assert_int_equal(pipe(fds), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    for (size_t i = 0; i < hlen; i += 7)
      if (write(fds[1], hdr + i, hlen - i < 7 ? hlen - i : 7) < 0)
        _exit(1);
    if (write(fds[1], data, sizeof data) != (ssize_t)sizeof data)
      _exit(1);
    _exit(0);
  }
  close(fds[1]);
  assert_int_equal(dspk__npy_load_fd(fds[0], "<pipe>", &b, err, sizeof err), 0);
  close(fds[0]);
  assert_int_equal(waitpid(pid, NULL, 0), pid);
  assert_int_equal(b.rank, 2);
  assert_int_equal(b.shape[0], 3);
  assert_int_equal(b.shape[1], 5);
  check_values(&b);
  dspk__npy_free(&a);
  dspk__npy_free(&b);
  /* A truncated stream names the source. */
  assert_int_equal(pipe(fds), 0);
  assert_int_equal(write(fds[1], hdr, hlen), (ssize_t)hlen);
  close(fds[1]);
  assert_int_equal(dspk__npy_load_fd(fds[0], "<stdin>", &b, err, sizeof err),
                   DSPK_EINVAL);
  close(fds[0]);
  if (strstr(err, "<stdin>") == NULL || strstr(err, "data size") == NULL)
    fail_msg("truncated stream: '%s'", err);
  /* An .npz on standard input, even one byte at a time, is told as a zip
   * archive (probe 19 D5), as is one that ends inside the zip magic not. */
  for (int step = 1; step <= 8; step += 7) {
    static const unsigned char zip[8] = {'P', 'K', 3, 4, 20, 0, 0, 0};
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      for (int i = 0; i < 8; i += step)
        if (write(fds[1], zip + i, (size_t)step) < 0)
          _exit(1);
      _exit(0);
    }
    close(fds[1]);
    assert_int_equal(dspk__npy_load_fd(fds[0], "<stdin>", &b, err, sizeof err),
                     DSPK_EINVAL);
    close(fds[0]);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    /* What a stream takes, not a file's renaming (probe 22 D2). */
    if (strstr(err, "<stdin>: not a .npy file but a zip archive (an .npz?): a stream "
                    "(standard input, a pipe, a device) carries one .npy, never an "
                    "archive: save the archive as a file named FILE.npz and give "
                    "FILE.npz:NAME (FILE.npz alone for its only array)") == NULL)
      fail_msg("zip stream, step %d: '%s'", step, err);
  }
  assert_int_equal(pipe(fds), 0);
  assert_int_equal(write(fds[1], "PK", 2), 2);
  close(fds[1]);
  assert_int_equal(dspk__npy_load_fd(fds[0], "<stdin>", &b, err, sizeof err), DSPK_EINVAL);
  close(fds[0]);
  if (strstr(err, "<stdin>: not a .npy file (bad magic)") == NULL)
    fail_msg("'PK' alone: '%s'", err);
  free(hdr);
}

static int setup(void **state) {
  (void)state;
  const char *t = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/dspk-npy-XXXXXX", t ? t : "/tmp");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[300];
  (void)state;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* The result line's numbers: the fewest digits that read back as the same
 * value of the dtype.  The expected strings have the digits of numpy's
 * shortest repr of the same values (np.float16/np.float32/float) in
 * printf's %g notation, written down here. */
static void test_fmt_num(void **state) {
  (void)state;
  static const struct {
    double v;
    dspk_dtype dt;
    bool sign;
    const char *want;
  } cases[] = {
      {(double)(float)(1.0 / 3), DSPK_F32, false, "0.33333334"},
      {16777216.0, DSPK_F32, false, "16777216"},
      {3.4028234663852886e+38, DSPK_F32, false, "3.4028235e+38"},
      {(double)0.1f, DSPK_F32, false, "0.1"},
      /* Subnormals: the fewest digits too, not the digits of the normal
       * range (15 for f64 showed 1e-310 as 9.99999999999997e-311). */
      {1.401298464324817e-45, DSPK_F32, false, "1e-45"},
      {2.802596928649634e-45, DSPK_F32, false, "3e-45"},
      {(double)1e-40f, DSPK_F32, false, "1e-40"},
      {(double)3e-39f, DSPK_F32, false, "3e-39"},
      {1.1754943508222875e-38, DSPK_F32, false, "1.1754944e-38"}, /* FLT_MIN */
      {4.9406564584124654e-324, DSPK_F64, false, "5e-324"},
      {1e-310, DSPK_F64, false, "1e-310"},
      {2.5e-320, DSPK_F64, true, "+2.5e-320"},
      {2.225073858507201e-308, DSPK_F64, false, "2.225073858507201e-308"},
      {2.2250738585072014e-308, DSPK_F64, false, "2.2250738585072014e-308"},
      {1e23, DSPK_F64, false, "1e+23"},
      {1.0013580322265625e-05, DSPK_F16, false, "1e-05"},                     /* f16 subnormal */
      {1.7881393432617188e-07, DSPK_F16, false, "2e-07"},     /* 3 * 2^-24 */
      {(double)-2.5e-8f, DSPK_F32, false, "-2.5e-08"},
      {(double)0.1f, DSPK_C64, true, "+0.1"},
      {-0.0, DSPK_F32, true, "-0"},
      {0.333251953125, DSPK_F16, false, "0.3333"},          /* f16(1/3) */
      {65504.0, DSPK_F16, false, "6.55e+04"},
      {0.0999755859375, DSPK_F16, false, "0.1"},            /* f16(0.1) */
      {5.9604644775390625e-08, DSPK_F16, false, "6e-08"}, /* 2^-24 */
      {-2048.0, DSPK_F16, false, "-2048"},
      {2050.0, DSPK_F16, false, "2.05e+03"},
      {0.1 + 0.2, DSPK_F64, false, "0.30000000000000004"},
      {0.1, DSPK_C128, false, "0.1"},
      {1e300, DSPK_F64, false, "1e+300"},
      {INFINITY, DSPK_F32, false, "inf"},
      {-INFINITY, DSPK_F64, true, "-inf"},
      {NAN, DSPK_F64, false, "nan"},
      /* bf16 (8 significant bits): the fewest digits that read back as the
       * same bf16, as for the other dtypes. */
      {0.333984375, DSPK_BF16, false, "0.334"},             /* bf16(1/3) */
      {0.10009765625, DSPK_BF16, false, "0.1"},             /* bf16(0.1) */
      {-2.5, DSPK_BF16, false, "-2.5"},
      {1024.0, DSPK_BF16, false, "1024"},
      {3.3895313892515355e+38, DSPK_BF16, false, "3.39e+38"}, /* largest */
      {9.183549615799121e-41, DSPK_BF16, false, "9e-41"},   /* 2^-133 */
      {1.1754943508222875e-38, DSPK_BF16, false, "1.18e-38"}, /* 2^-126 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[40];
    dspk__sub_fmt_num(buf, sizeof buf, cases[i].v, cases[i].dt, cases[i].sign);
    if (strcmp(buf, cases[i].want) != 0)
      fail_msg("case %zu: %.17g (dtype %d) gave %s, want %s", i, cases[i].v,
               (int)cases[i].dt, buf, cases[i].want);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_fmt_num),
      cmocka_unit_test(test_header_layout),
      cmocka_unit_test(test_save_errors),
      cmocka_unit_test(test_save_replaces),
      cmocka_unit_test(test_numpy_files),
      cmocka_unit_test(test_numpy_reads_ours),
      cmocka_unit_test(test_malformed_headers),
      cmocka_unit_test(test_numpy_reads_accepted),
      cmocka_unit_test(test_malformed_preamble),
      cmocka_unit_test(test_malformed_files),
      cmocka_unit_test(test_npz),
      cmocka_unit_test(test_fd_streams),
  };
  if (argc > 1 && argv[1][0] != '\0')
    python = argv[1];
  return cmocka_run_group_tests(tests, setup, teardown);
}
