/*
 * Unit test of dspkd's log (daemon/log.c): the level of a failed task by
 * its error code (device and internal errors at error, resource pressure
 * at warn, the client's mistakes at notice, cancellations at info), and the
 * lines themselves, with stderr pointed at a file: the "<N>" syslog
 * priority when JOURNAL_STREAM names that file (as systemd does for the
 * journal), the failed-task line with its fields, a multi-line message
 * folded onto one line, control characters (C1 and U+2028/U+2029 too) a
 * space each, levels above the threshold left out.
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

#include "daemon/log.h"
#include "dspk/errors.h"

static void test_task_levels(void **state) {
  static const int err[] = {DSPK_EDEVICE, DSPK_EIO, DSPK_EINTERNAL, DSPK_ETIMEDOUT, -999};
  static const int warn[] = {DSPK_ENOMEM, DSPK_EBUSY};
  static const int notice[] = {DSPK_EINVAL,  DSPK_ESHAPE, DSPK_EDTYPE,  DSPK_ENODEV,
                               DSPK_ENOBUF,  DSPK_ERANGE, DSPK_ELIMIT,  DSPK_ECOMPILE,
                               DSPK_ENOTSUP, DSPK_EPERM,  DSPK_EPROTO,  DSPK_ENOENT,
                               DSPK_ENOMETHOD, DSPK_EVERSION};
  static const int info[] = {DSPK_ECANCELED, DSPK_ESHUTDOWN, DSPK_ECLOSED};
  (void)state;
  for (size_t i = 0; i < sizeof err / sizeof err[0]; i++)
    assert_int_equal(dspkd_log_task_level(err[i]), DSPKD_ERROR);
  for (size_t i = 0; i < sizeof warn / sizeof warn[0]; i++)
    assert_int_equal(dspkd_log_task_level(warn[i]), DSPKD_WARN);
  for (size_t i = 0; i < sizeof notice / sizeof notice[0]; i++)
    assert_int_equal(dspkd_log_task_level(notice[i]), DSPKD_NOTICE);
  for (size_t i = 0; i < sizeof info / sizeof info[0]; i++)
    assert_int_equal(dspkd_log_task_level(info[i]), DSPKD_INFO);
}

static void test_levels_parse(void **state) {
  static const char *const names[] = {"error", "warn", "notice", "info", "debug"};
  enum dspkd_level l;
  (void)state;
  for (int i = 0; i < 5; i++) {
    assert_int_equal(dspkd_log_parse_level(names[i], &l), 0);
    assert_int_equal((int)l, i);
  }
  assert_int_equal(dspkd_log_parse_level("warning", &l), -1);
}

/* The lines as journald would receive them. */
static void test_journal_lines(void **state) {
  char path[] = "/tmp/dspk-log-XXXXXX", env[64], buf[4096];
  struct stat st;
  size_t n;
  FILE *f;
  int fd, saved;
  (void)state;
  fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(fstat(fd, &st), 0);
  snprintf(env, sizeof env, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
  assert_int_equal(setenv("JOURNAL_STREAM", env, 1), 0);
  saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);

  dspkd_log_set_level(DSPKD_INFO);
  dspkd_log_task_failed("cuda:0", "fft", 7, 5120, DSPK_EDEVICE, "cufft failed\nat plan 2\n");
  dspkd_log_task_failed("any", "gemm", 3, 42, DSPK_ESHAPE, "gemm: A has K=4");
  dspkd_log_task_failed("cpu:0", "map", 3, 42, DSPK_ECANCELED, NULL);
  dspkd_log_task_failed("vulkan:0", "fft", 1, 9, DSPK_ENOMEM, "");
  dspkd_info("listening on %s", "/run/dspk/dspkd.sock");
  /* C0, DEL, C1 (NEL, CSI) and U+2028/U+2029 a space each, as in errors */
  dspkd_info("name a\x1b\x7f" "b\xc2\x85" "c\xc2\x9b" "d\xe2\x80\xa8" "e\xe2\x80\xa9" "f\xc2\xa0g");
  dspkd_debug("not written at info");
  /* A client's text: ill-formed UTF-8 becomes U+FFFD, as in its answer, and
   * a device or op that is not a plain token is quoted, so that it can
   * neither be forged into fields nor hide the line from journalctl. */
  dspkd_log_task_failed("cpu:\xff\xfe", "gemm", 1, 2, DSPK_ENODEV, "no device \"cpu:\xff\xfe\"");
  dspkd_log_task_failed("x op=kernel client=99 pid=1: EDEVICE: fake", "gemm", 1, 16000,
                        DSPK_ENODEV, "m");
  dspkd_log_task_failed("cpu x\"\\", "a\xe2\x80\xa8" "b", 1, 2, DSPK_ENODEV, "m");
  dspkd_info("cut \xc3");

  assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
  close(saved);
  f = fdopen(fd, "r");
  assert_non_null(f);
  rewind(f);
  n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  unlink(path);
  assert_string_equal(
      buf, "<3>task failed: device=cuda:0 op=fft client=7 pid=5120: EDEVICE: cufft failed; "
           "at plan 2\n"
           "<5>task failed: device=any op=gemm client=3 pid=42: ESHAPE: gemm: A has K=4\n"
           "<6>task failed: device=cpu:0 op=map client=3 pid=42: ECANCELED: task canceled\n"
           "<4>task failed: device=vulkan:0 op=fft client=1 pid=9: ENOMEM: out of memory\n"
           "<6>listening on /run/dspk/dspkd.sock\n"
           "<6>name a  b c d e f\xc2\xa0g\n"
           "<5>task failed: device=\"cpu:\xef\xbf\xbd\xef\xbf\xbd\" op=gemm client=1 pid=2: "
           "ENODEV: no device \"cpu:\xef\xbf\xbd\xef\xbf\xbd\"\n"
           "<5>task failed: device=\"x op\\=kernel client\\=99 pid\\=1: EDEVICE: fake\" op=gemm "
           "client=1 pid=16000: ENODEV: m\n"
           "<5>task failed: device=\"cpu x\\\"\\\\\" op=\"a b\" client=1 pid=2: ENODEV: m\n"
           "<6>cut \xef\xbf\xbd\n");
}

/* The value of a field: bare when a plain token, else quoted and escaped,
 * and cut to the buffer without losing the closing quote. */
static void test_log_value(void **state) {
  char b[32];
  (void)state;
  assert_string_equal(dspkd_log_value(b, sizeof b, "cuda:0", 6), "cuda:0");
  assert_string_equal(dspkd_log_value(b, sizeof b, "task.run", 8), "task.run");
  assert_string_equal(dspkd_log_value(b, sizeof b, "", 0), "\"\"");
  assert_string_equal(dspkd_log_value(b, sizeof b, "a b", 3), "\"a b\"");
  assert_string_equal(dspkd_log_value(b, sizeof b, "k=v\"\\", 5), "\"k\\=v\\\"\\\\\"");
  assert_string_equal(dspkd_log_value(b, sizeof b, "a\0b", 3), "\"a b\"");
  assert_string_equal(dspkd_log_value(b, 8, "a b c d e f", 11), "\"a b c\"");
  assert_string_equal(dspkd_log_value(b, 4, "abcdef", 6), "abc");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_task_levels),
      cmocka_unit_test(test_levels_parse),
      cmocka_unit_test(test_journal_lines),
      cmocka_unit_test(test_log_value),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
