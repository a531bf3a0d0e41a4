/*
 * Unit tests of dspk-submit's terminal escaping (client/submit/escape.c):
 * each style against a table of expected forms (controls, DEL, C1, escape
 * sequences, ill-formed UTF-8, characters that must pass unchanged); no
 * escaped form holds a byte a terminal acts on; output cut to a buffer
 * never splits an escape or a character; JSON stays JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/submit/escape.h"
#include "proto/utf8.h"

static void expect(const char *in, enum dspk__sub_esc_style st, const char *want) {
  char buf[256];
  size_t n = dspk__sub_escape(buf, sizeof buf, in, st);
  assert_string_equal(buf, want);
  assert_int_equal(n, strlen(want));
}

/* No C0 control, DEL, C1 control or ill-formed byte. */
static void assert_inert(const char *s) {
  size_t n = strlen(s);
  assert_true(dspk__utf8_valid(s, n));
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    assert_false(c < 0x20 || c == 0x7f);
    if (c == 0xC2 && i + 1 < n)
      assert_false((unsigned char)s[i + 1] < 0xA0);
  }
}

static void test_text(void **st) {
  (void)st;
  expect("plain name", DSPK__SUB_ESC_TEXT, "plain name");
  expect("caf\xc3\xa9 \xe2\x82\xac", DSPK__SUB_ESC_TEXT, "caf\xc3\xa9 \xe2\x82\xac");
  expect("a\nb\tc\rd", DSPK__SUB_ESC_TEXT, "a\\nb\\tc\\rd");
  expect("\x1b[2J\x1b]0;owned\x07", DSPK__SUB_ESC_TEXT, "\\x1b[2J\\x1b]0;owned\\x07");
  expect("del\x7f", DSPK__SUB_ESC_TEXT, "del\\x7f");
  expect("csi\xc2\x9b" "31m", DSPK__SUB_ESC_TEXT, "csi\\u009b31m");
  expect("nbsp\xc2\xa0", DSPK__SUB_ESC_TEXT, "nbsp\xc2\xa0");
  expect("bad\xff\xc3", DSPK__SUB_ESC_TEXT, "bad\\xff\\xc3");
  expect("", DSPK__SUB_ESC_TEXT, "");
  expect(NULL, DSPK__SUB_ESC_TEXT, "");
}

static void test_line(void **st) {
  (void)st;
  expect("error: x\nline 2\tend", DSPK__SUB_ESC_LINE, "error: x; line 2 end");
  expect("\x1b[1A\rspoof", DSPK__SUB_ESC_LINE, "\\x1b[1A\\rspoof");
  /* An error line hides nothing, whoever wrote it (docs/cli.md): what
   * prints as nothing is \uNNNN, a combining mark too where it has no
   * base; a table's text keeps them (probe 15 D 2). */
  expect("x\xe2\x80\x8by \xe2\x80\xae\xef\xbb\xbf\xc2\xa0", DSPK__SUB_ESC_LINE,
         "x\\u200by \\u202e\\ufeff\\u00a0");
  expect("'\xcc\x81' e\xcc\x81 \xee\x80\x80\xf4\x8f\xbf\xbf", DSPK__SUB_ESC_LINE,
         "'\\u0301' e\xcc\x81 \\ue000\\U0010ffff");
  expect("x\xe2\x80\x8by", DSPK__SUB_ESC_TEXT, "x\xe2\x80\x8by");
}

static void test_json(void **st) {
  (void)st;
  expect("{\"name\":\"a\\u001b\"}", DSPK__SUB_ESC_JSON, "{\"name\":\"a\\u001b\"}");
  expect("{\"name\":\"\x7f\xc2\x85\xff\"}", DSPK__SUB_ESC_JSON,
         "{\"name\":\"\\u007f\\u0085\\ufffd\"}");
}

/* Every byte value, alone and after a lead byte: the result is inert. */
static void test_all_bytes(void **st) {
  (void)st;
  char in[4], out[64];
  for (int style = 0; style < 3; style++)
    for (int a = 1; a < 256; a++)
      for (int b = 0; b < 256; b += 1) {
        in[0] = (char)a;
        in[1] = (char)b;
        in[2] = 0;
        dspk__sub_escape(out, sizeof out, in, (enum dspk__sub_esc_style)style);
        assert_inert(out);
      }
}

/* Cut to a small buffer: a prefix of the whole form, ending between
 * pieces, never inside an escape or a character. */
static void test_cut(void **st) {
  (void)st;
  const char *in = "ab\x1b\xc3\xa9\ncd";
  const char *whole = "ab\\x1b\xc3\xa9\\ncd";
  static const size_t ends[] = {0, 1, 2, 6, 8, 10, 11, 12};
  char buf[32];
  for (size_t cap = 1; cap <= strlen(whole) + 1; cap++) {
    size_t n = dspk__sub_escape(buf, cap, in, DSPK__SUB_ESC_TEXT);
    size_t k = strlen(buf), best = 0;
    assert_int_equal(n, strlen(whole));
    assert_memory_equal(buf, whole, k);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
      if (ends[i] < cap)
        best = ends[i];
    assert_int_equal(k, best);
  }
  assert_int_equal(dspk__sub_escape(NULL, 0, in, DSPK__SUB_ESC_TEXT), strlen(whole));
}

/* dspk__sub_json_strn: a quoted JSON string whatever the bytes (a file name
 * from the command line): quotes and backslashes escaped, controls C0, DEL
 * and C1 as \u00NN, ill-formed bytes as \ufffd, NUL included. */
static void test_json_str(void **st) {
  static const struct {
    const char *in;
    size_t n;
    const char *want;
  } cases[] = {
      {"a.npy", 5, "\"a.npy\""},
      {"x\xff\xc2\x85.npy", 8, "\"x\\ufffd\\u0085.npy\""},
      {"q\"b\\", 4, "\"q\\\"b\\\\\""},
      {"\x1b[31m\x07\x7f", 7, "\"\\u001b[31m\\u0007\\u007f\""},
      {"n\0z", 3, "\"n\\u0000z\""},
      {"\xc3\xa9\xe2\x82\xac", 5, "\"\xc3\xa9\xe2\x82\xac\""},
      {"\xc3", 1, "\"\\ufffd\""},
  };
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    dspk__sub_json_strn(f, cases[i].in, cases[i].n);
    fclose(f);
    assert_string_equal(buf, cases[i].want);
    assert_inert(buf);
    free(buf);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text),   cmocka_unit_test(test_line),
      cmocka_unit_test(test_json),   cmocka_unit_test(test_all_bytes),
      cmocka_unit_test(test_cut),   cmocka_unit_test(test_json_str),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
