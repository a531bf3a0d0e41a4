/*
 * Unit test of dspkd's log (daemon/log.c): the level of a failed task by
 * its error code (device and internal errors at error, resource pressure
 * at warn, the client's mistakes at notice, cancellations at info), and the
 * lines themselves, with stderr pointed at a file: the "<N>" syslog
 * priority when JOURNAL_STREAM names that file (as systemd does for the
 * journal), the failed-task line with its fields, a multi-line message
 * folded onto one line, control characters (C1 and U+2028/U+2029 too) a
 * space each, characters that print as nothing \uNNNN (a client's
 * bidirectional controls too), levels above the threshold left out.
 */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/log.h"
#include "dspk/errors.h"

/* The one rule of whose fault a failed request is, and its level (probe 18
 * E1: a client's own mistakes were notices "task failed" though admin.md
 * and dspkd(8) say they are debug lines only). */
static void test_task_levels(void **state) {
  static const int err[] = {DSPK_EDEVICE, DSPK_EIO, DSPK_EINTERNAL, DSPK_ETIMEDOUT, -999};
  static const int warn[] = {DSPK_ENOMEM, DSPK_EBUSY};
  static const int mistake[] = {DSPK_EINVAL,  DSPK_ESHAPE, DSPK_EDTYPE,  DSPK_ENODEV,
                                DSPK_ENOBUF,  DSPK_ERANGE, DSPK_ELIMIT,  DSPK_ENOTSUP,
                                DSPK_EPERM,   DSPK_EPROTO, DSPK_ENOENT,  DSPK_ENOMETHOD,
                                DSPK_EVERSION};
  static const int info[] = {DSPK_ECANCELED, DSPK_ESHUTDOWN, DSPK_ECLOSED};
  (void)state;
  for (int k = 0; k < 2; k++) {
    bool user = k == 1;
    for (size_t i = 0; i < sizeof err / sizeof err[0]; i++) {
      assert_int_equal(dspkd_log_fail_level(err[i], user), DSPKD_ERROR);
      assert_false(dspkd_log_client_mistake(err[i], user));
    }
    for (size_t i = 0; i < sizeof warn / sizeof warn[0]; i++)
      assert_int_equal(dspkd_log_fail_level(warn[i], user), DSPKD_WARN);
    for (size_t i = 0; i < sizeof mistake / sizeof mistake[0]; i++) {
      assert_int_equal(dspkd_log_fail_level(mistake[i], user), DSPKD_DEBUG);
      assert_true(dspkd_log_client_mistake(mistake[i], user));
    }
    for (size_t i = 0; i < sizeof info / sizeof info[0]; i++)
      assert_int_equal(dspkd_log_fail_level(info[i], user), DSPKD_INFO);
  }
  /* A user's raw kernel that does not compile is its mistake; a built-in
   * op's shader that does not compile is the daemon's failure. */
  assert_int_equal(dspkd_log_fail_level(DSPK_ECOMPILE, true), DSPKD_DEBUG);
  assert_int_equal(dspkd_log_fail_level(DSPK_ECOMPILE, false), DSPKD_ERROR);
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
  dspkd_log_task_failed(1000, "cuda:0", "fft", 7, 5120, DSPK_EDEVICE, false,
                        "cufft failed\nat plan 2\n");
  /* A client's own mistake is a debug line: not written at info. */
  dspkd_log_task_failed(1000, "cpu:0", "gemm", 3, 42, DSPK_ESHAPE, false, "gemm: A has K=4");
  dspkd_log_task_failed(1000, "vulkan:0", "kernel", 3, 42, DSPK_ECOMPILE, true, "x.comp:1");
  dspkd_log_task_failed(1000, "vulkan:0", "gemm", 3, 42, DSPK_ECOMPILE, false, "coopmat");
  dspkd_log_task_failed(1000, "cpu:0", "map", 3, 42, DSPK_ECANCELED, false, NULL);
  dspkd_log_task_failed(1000, "vulkan:0", "fft", 1, 9, DSPK_ENOMEM, false, "");
  dspkd_info("listening on %s", "/run/dspk/dspkd.sock");
  /* C0, DEL, C1 (NEL, CSI) and U+2028/U+2029 a space each, as in errors */
  dspkd_info("name a\x1b\x7f" "b\xc2\x85" "c\xc2\x9b" "d\xe2\x80\xa8" "e\xe2\x80\xa9" "f\xc2\xa0g");
  dspkd_debug("not written at info");
  /* A client's text: ill-formed UTF-8 becomes U+FFFD, as in its answer, and
   * a device or op that is not a plain token is quoted, so that it can
   * neither be forged into fields nor hide the line from journalctl. */
  dspkd_log_task_failed(1000, "cpu:\xff\xfe", "gemm", 1, 2, DSPK_EIO, false,
                        "no device \"cpu:\xff\xfe\"");
  dspkd_log_task_failed(1000, "x op=kernel client=99 pid=1: EDEVICE: fake", "gemm", 1, 16000,
                        DSPK_EIO, false, "m");
  dspkd_log_task_failed(1000, "cpu x\"\\", "a\xe2\x80\xa8" "b", 1, 2, DSPK_EIO, false, "m");
  dspkd_info("cut \xc3");
  /* A client's bidirectional control, zero-width characters, byte order
   * mark and a combining mark with no base (on the opening quote), in the
   * fields and in the message: \uNNNN each, so that none reorders or
   * hides a part of the admin's line (probe 15 E 3). */
  dspkd_log_task_failed(1000, "cpu:0\xe2\x80\xae" "0=diu", "\xcc\x81gemm", 1, 2, DSPK_EIO, false,
                        "no device \"x\xe2\x80\x8b\xe2\x81\xa6y\xef\xbb\xbf\"");

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
           "<3>task failed: device=vulkan:0 op=gemm client=3 pid=42: ECOMPILE: coopmat\n"
           "<6>task failed: device=cpu:0 op=map client=3 pid=42: ECANCELED: task canceled\n"
           "<4>task failed: device=vulkan:0 op=fft client=1 pid=9: ENOMEM: out of memory\n"
           "<6>listening on /run/dspk/dspkd.sock\n"
           "<6>name a  b c d e f\\u00a0g\n"
           "<3>task failed: device=\"cpu:\xef\xbf\xbd\xef\xbf\xbd\" op=gemm client=1 pid=2: "
           "EIO: no device \"cpu:\xef\xbf\xbd\xef\xbf\xbd\"\n"
           "<3>task failed: device=\"x op\\=kernel client\\=99 pid\\=1: EDEVICE: fake\" op=gemm "
           "client=1 pid=16000: EIO: m\n"
           "<3>task failed: device=\"cpu x\\\"\\\\\" op=\"a b\" client=1 pid=2: EIO: m\n"
           "<6>cut \xef\xbf\xbd\n"
           "<3>task failed: device=\"cpu:0\\u202e0\\=diu\" op=\"\\u0301gemm\" client=1 pid=2: "
           "EIO: no device \"x\\u200b\\u2066y\\ufeff\"\n");
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

/* A log whose reader stalls never blocks the logger (first of the tests:
 * the child must be the first to write a line, so that it finds stderr a
 * pipe).  A child logs 5000 lines of about 150 bytes into a pipe nobody
 * reads (64 KiB of pipe, 256 KiB of queue): it must get through them and
 * say so within 10 s; then the parent reads, and finds the first lines
 * in order and, once the queue drained, the count of those dropped. */
static void test_stalled_reader(void **state) {
  int logp[2], sync[2], st;
  char c, buf[1 << 16];
  struct pollfd pf;
  size_t have = 0, lines = 0;
  (void)state;
  assert_int_equal(pipe(logp), 0);
  assert_int_equal(pipe(sync), 0);
  pid_t kid = fork();
  assert_true(kid >= 0);
  if (kid == 0) {
    close(logp[0]);
    close(sync[0]);
    unsetenv("JOURNAL_STREAM");
    if (dup2(logp[1], STDERR_FILENO) != STDERR_FILENO)
      _exit(100);
    dspkd_log_set_level(DSPKD_INFO);
    for (int i = 0; i < 5000; i++)
      dspkd_info("line %04d %0120d", i, 0);
    if (write(sync[1], "x", 1) != 1)
      _exit(101);
    exit(0); /* the queue drains at exit (up to 2 s) */
  }
  close(logp[1]);
  close(sync[1]);
  pf = (struct pollfd){.fd = sync[0], .events = POLLIN};
  assert_int_equal(poll(&pf, 1, 10000), 1); /* it never waited for a reader */
  assert_int_equal(read(sync[0], &c, 1), 1);
  close(sync[0]);
  /* Read it all (the writer thread now writes the queue, then the warning). */
  char *all = malloc(1 << 20);
  assert_non_null(all);
  for (;;) {
    ssize_t n = read(logp[0], buf, sizeof buf);
    if (n <= 0)
      break;
    assert_true(have + (size_t)n < (1 << 20));
    memcpy(all + have, buf, (size_t)n);
    have += (size_t)n;
  }
  all[have] = '\0';
  close(logp[0]);
  assert_int_equal(waitpid(kid, &st, 0), kid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (char *p = all; (p = strstr(p, ": info: line ")); p++)
    lines++;
  assert_true(strstr(all, ": info: line 0000 ") != NULL);
  assert_true(lines > 400 && lines < 5000); /* the pipe and the queue, not more */
  const char *w = strstr(all, ": warn: ");
  assert_non_null(w);
  unsigned long long dropped = strtoull(w + 8, NULL, 10);
  assert_int_equal(dropped, 5000 - lines);
  assert_non_null(strstr(w, " log lines dropped: the log's reader did not keep up"));
  free(all);
}

/* Client-caused lines: 10 a minute per uid, then a notice that the rest
 * are counted, and their count once the minute is over. */
static void test_client_rate(void **state) {
  char path[] = "/tmp/dspk-log-XXXXXX", buf[4096];
  int fd, saved, ok = 0;
  size_t n;
  (void)state;
  fd = mkstemp(path);
  assert_true(fd >= 0);
  saved = dup(STDERR_FILENO);
  assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  dspkd_log_set_level(DSPKD_INFO);
  for (int i = 0; i < 15; i++)
    ok += dspkd_log_client_ok_at(4711, DSPKD_NOTICE, 1000 + (uint64_t)i);
  assert_int_equal(ok, 10);
  assert_true(dspkd_log_client_ok_at(4712, DSPKD_NOTICE, 1100)); /* another uid */
  assert_false(dspkd_log_client_ok_at(4711, DSPKD_DEBUG, 1100)); /* not written: not counted */
  assert_true(dspkd_log_client_ok_at(4711, DSPKD_NOTICE, 61000)); /* a new minute */
  /* One line held back: its count's noun singular (probe 16 A#4's class). */
  for (int i = 0; i < 11; i++)
    (void)dspkd_log_client_ok_at(4713, DSPKD_NOTICE, 2000 + (uint64_t)i);
  assert_true(dspkd_log_client_ok_at(4713, DSPKD_NOTICE, 63000));
  assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
  close(saved);
  n = (size_t)pread(fd, buf, sizeof buf - 1, 0);
  buf[n] = '\0';
  close(fd);
  unlink(path);
  assert_string_equal(buf, "<5>uid 4711: more than 10 lines about its clients' requests in a "
                           "minute: the rest of the minute's are counted, not logged\n"
                           "<5>uid 4711: 5 more lines about its clients' requests were not "
                           "logged in the minute after 10 were (at most 10 a minute per uid)\n"
                           "<5>uid 4713: more than 10 lines about its clients' requests in a "
                           "minute: the rest of the minute's are counted, not logged\n"
                           "<5>uid 4713: 1 more line about its clients' requests was not "
                           "logged in the minute after 10 were (at most 10 a minute per uid)\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stalled_reader),
      cmocka_unit_test(test_task_levels),
      cmocka_unit_test(test_levels_parse),
      cmocka_unit_test(test_journal_lines),
      cmocka_unit_test(test_log_value),
      cmocka_unit_test(test_client_rate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
