/*
 * Unit tests of the UTF-8 helpers (proto/utf8.c) and of dspk__pack_str,
 * which packs every str the daemon sends: the validator against a second,
 * arithmetic decoder over every string of up to three bytes drawn from the
 * bytes where the rules change; cutting and formatting never leave part of
 * a character at any budget; the sanitized form is well-formed, replaces
 * exactly the ill-formed bytes, and is what dspk__pack_str packs; the
 * characters escaped as invisible are those the Unicode Character Database
 * (Debian's unicode-data) says print as nothing or as a space, are
 * noncharacters or private use, or are combining marks with no base
 * character before them; the same set is escaped in an echo and in every
 * message line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "proto/codec.h"
#include "proto/utf8.h"

/* Reference: decodes by the bit patterns, then rejects overlong forms,
 * surrogates and code points above U+10FFFF.  Returns the length or 0. */
static size_t ref_seq(const unsigned char *u, size_t n) {
  size_t len;
  uint32_t cp;
  if (n == 0)
    return 0;
  if (u[0] < 0x80)
    return 1;
  if ((u[0] & 0xE0) == 0xC0)
    len = 2, cp = u[0] & 0x1F;
  else if ((u[0] & 0xF0) == 0xE0)
    len = 3, cp = u[0] & 0x0F;
  else if ((u[0] & 0xF8) == 0xF0)
    len = 4, cp = u[0] & 0x07;
  else
    return 0;
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((u[i] & 0xC0) != 0x80)
      return 0;
    cp = cp << 6 | (u[i] & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
    return 0;
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    return 0;
  return len;
}

static int ref_valid(const unsigned char *u, size_t n) {
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = ref_seq(u + i, n - i)))
      return 0;
  return 1;
}

static const unsigned char edges[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                      0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC,
                                      0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5,
                                      0xFF};
#define NE (sizeof edges)

static void test_valid_against_reference(void **st) {
  (void)st;
  unsigned char b[4];
  size_t checked = 0;
  for (size_t n = 1; n <= 4; n++) {
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
      total *= NE;
    for (size_t x = 0; x < total; x++) {
      size_t y = x;
      for (size_t i = 0; i < n; i++, y /= NE)
        b[i] = edges[y % NE];
      assert_int_equal(dspk__utf8_seq((const char *)b, n), ref_seq(b, n));
      assert_int_equal(dspk__utf8_valid((const char *)b, n), ref_valid(b, n));
      checked++;
    }
  }
  assert_true(checked > 390000);
  /* Known strings. */
  assert_true(dspk__utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14));
  assert_false(dspk__utf8_valid("\xed\xa0\x80", 3)); /* U+D800 */
  assert_false(dspk__utf8_valid("\xc0\xaf", 2));     /* overlong '/' */
  assert_false(dspk__utf8_valid("\xf4\x90\x80\x80", 4));
  assert_false(dspk__utf8_valid("\xe2\x82", 2)); /* cut short */
}

/* A string of every character length, repeated. */
static const char mixed[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                            "b\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";

static void test_cut(void **st) {
  (void)st;
  size_t n = strlen(mixed);
  for (size_t max = 0; max <= n + 2; max++) {
    size_t k = dspk__utf8_cut(mixed, n, max);
    assert_true(k <= max && k <= n);
    assert_true(k + 3 >= (max < n ? max : n)); /* never more than a character lost */
    assert_true(dspk__utf8_valid(mixed, k));
    /* And it is the longest such prefix. */
    for (size_t j = k + 1; j <= max && j <= n; j++)
      assert_false(dspk__utf8_valid(mixed, j));
  }
  assert_int_equal(dspk__utf8_cut("ab\xc3\xa9", 4, 3), 2);
  assert_int_equal(dspk__utf8_cut("ab\xc3\xa9", 4, 4), 4);
  /* Ill-formed input is cut at the byte count (nothing to keep whole). */
  assert_int_equal(dspk__utf8_cut("\x80\x80\x80\x80\x80", 5, 3), 3);
}

/* A client's string echoed in a message: a NUL byte as \x00, cut at a
 * character boundary, to the buffer, a cut marked "..." (probe 16 A#3:
 * "float32_little_endian" was echoed "float32_little_e", unmarked). */
static void test_echo(void **st) {
  char buf[32];
  (void)st;
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "ping\0x", 6, 64), "ping\\x00x");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "\xc3\xa9\xc3\xa9", 4, 3),
                      "\xc3\xa9...");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "\xc3\xa9\xc3\xa9", 4, 4),
                      "\xc3\xa9\xc3\xa9");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "float32_little_endian", 21, 16),
                      "float32_little_e...");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "float32_little_e", 16, 16),
                      "float32_little_e");
  /* Cut for the room (cap, the mark's 3 bytes kept from it), marked too. */
  assert_string_equal(dspk__utf8_echo(buf, 11, "abcd\0", 5, 64), "abcd...");
  assert_string_equal(dspk__utf8_echo(buf, 12, "abcd\0", 5, 64), "abcd\\x00");
  assert_string_equal(dspk__utf8_echo(buf, 3, "abcd", 4, 64), "");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "", 0, 64), "");
  /* The whole of DSPK__ECHO_CAP(max) holds max bytes and the mark. */
  char cap[DSPK__ECHO_CAP(4)];
  assert_string_equal(dspk__utf8_echo(cap, sizeof cap, "\xcc\x81\xcc\x81x", 5, 4),
                      "\\u0301\\u0301...");
}

/* What prints as nothing is written as its code point, a backslash doubled
 * (so that the escapes cannot be forged), a combining mark escaped where
 * it has no base of its own: at the start, after a blank, a quote or an
 * escape (probe 15 E 3 and E 10). */
static void test_echo_hidden(void **st) {
  static const struct { const char *in, *out; } cases[] = {
      {"cpu:0\xe2\x80\xae" "0=diu", "cpu:0\\u202e0=diu"},          /* RLO */
      {"x\xe2\x80\x8b\xe2\x81\xa6y\xef\xbb\xbf", "x\\u200b\\u2066y\\ufeff"},
      {"a\\b", "a\\\\b"},                                       /* a backslash */
      {"\\0\0", "\\\\0\\x00"},       /* typed \0 and a NUL: told apart */
      {"\xcc\x81x", "\\u0301x"},                         /* a mark first */
      {"e\xcc\x81", "e\xcc\x81"},                        /* on a letter */
      {"\xc3\xa9\xcc\x81", "\xc3\xa9\xcc\x81"},              /* on another one */
      {"a \xcc\x81", "a \\u0301"},                       /* after a blank */
      {"\"\xcc\x81", "\"\\u0301"},                       /* after a quote */
      {"\xcc\x81\xcc\x82", "\\u0301\\u0302"},           /* a mark on an escape */
      {"a\n\xcc\x81", "a\\n\\u0301"},                  /* after an escape */
      {"\xef\xbf\xbe\xef\xb7\x90", "\\ufffe\\ufdd0"},    /* noncharacters */
      {"\xee\x80\x80\xf3\xb0\x80\x80", "\\ue000\\U000f0000"}, /* private use */
      {"\xed\x9f\xbf", "\xed\x9f\xbf"},  /* U+D7FF, unassigned: as it is */
  };
  char buf[64];
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    assert_string_equal(dspk__utf8_echo(buf, sizeof buf, cases[i].in, strlen(cases[i].in) +
                                        (strcmp(cases[i].in, "\\0") == 0), 32),
                        cases[i].out);
  /* The growth fits DSPK__ECHO_CAP(max): a two-byte mark is six. */
  char big[DSPK__ECHO_CAP(4)];
  assert_string_equal(dspk__utf8_echo(big, sizeof big, "\xcc\x81\xcc\x81", 4, 4),
                      "\\u0301\\u0301");
  /* Cut before an escape that does not fit, never inside it. */
  assert_string_equal(dspk__utf8_echo(buf, 11, "ab\xe2\x80\x8b", 5, 32), "ab...");
}

/* Every control character escaped, so that different strings give
 * different echoes and the echo stays one line (probe 21 D-1: "cpu:0\n",
 * "\ncpu:0" and "cpu:0\r\n\r\n" were all echoed as "cpu:0", "cpu:0\t" as
 * "cpu:0 ", "cpu\n:0" as "cpu; :0"): tab, LF and CR as \t, \n, \r, the
 * other C0 controls and DEL as \xNN, the C1 controls and U+2028, U+2029
 * as \uNNNN, an ill-formed byte as \xNN, blanks kept as they are. */
static void test_echo_controls(void **st) {
  static const struct { const char *in, *out; } cases[] = {
      {"cpu:0\n", "cpu:0\\n"},          {"\ncpu:0", "\\ncpu:0"},
      {"cpu:0\r\n\r\n", "cpu:0\\r\\n\\r\\n"},
      {"cpu:0\t", "cpu:0\\t"},          {"cpu:0 ", "cpu:0 "},
      {"cpu\n:0", "cpu\\n:0"},          {"a \n b", "a \\n b"},
      {" a ", " a "},                    {"\x1b[2J", "\\x1b[2J"},
      {"a\x7f", "a\\x7f"},              {"a\xc2\x85" "b", "a\\u0085b"},
      {"\xe2\x80\xa8" "x", "\\u2028x"}, {"x\xe2\x80\xa9", "x\\u2029"},
      {"a\xff" "b", "a\\xffb"},            {"\xc3\xa9\n\xc3\xa9", "\xc3\xa9\\n\xc3\xa9"},
      {"\xe2\x80\x8b" "a", "\\u200ba"},  {"\\u200ba", "\\\\u200ba"},
      {"ij, jk -> ik", "ij, jk -> ik"},
  };
  char buf[64];
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    assert_string_equal(dspk__utf8_echo(buf, sizeof buf, cases[i].in, strlen(cases[i].in), 32),
                        cases[i].out);
  /* Every pair of different strings of up to two bytes from the edges
   * echoes differently, and no echo holds a control character. */
  static char seen[NE * NE + NE + 1][DSPK__ECHO_CAP(2)];
  size_t ns = 0;
  for (size_t len = 0; len <= 2; len++)
    for (size_t x = 0; x < (len == 0 ? 1 : len == 1 ? NE : NE * NE); x++) {
      char in[2] = {(char)edges[x % NE], (char)edges[x / NE % NE]};
      char *e = seen[ns++];
      dspk__utf8_echo(e, DSPK__ECHO_CAP(2), in, len, 2);
      for (size_t j = 0, k; e[j]; j += k ? k : 1) {
        k = dspk__utf8_seq(e + j, strlen(e + j));
        assert_int_not_equal(k, 0);
        assert_int_equal(dspk__utf8_ctl(e + j, k), 0);
      }
      for (size_t j = 0; j + 1 < ns; j++)
        assert_string_not_equal(seen[j], e);
    }
  /* The growth fits DSPK__ECHO_CAP(max): a control byte is four. */
  char big[DSPK__ECHO_CAP(4)];
  assert_string_equal(dspk__utf8_echo(big, sizeof big, "\n\n\n\n\n", 5, 4),
                      "\\n\\n\\n\\n...");
  assert_string_equal(dspk__utf8_echo(big, sizeof big, "\x01\x01\x01\x01", 4, 4),
                      "\\x01\\x01\\x01\\x01");
  /* Cut to cap before an escape, never inside it. */
  assert_string_equal(dspk__utf8_echo(buf, 8, "a\nb", 3, 32), "a\\nb");
  assert_string_equal(dspk__utf8_echo(buf, 7, "a\nb", 3, 32), "a\\n...");
  assert_string_equal(dspk__utf8_echo(buf, 6, "a\nb", 3, 32), "a...");
}

/* One character named for a message, in a form the echo keeps. */
static void test_char_name(void **st) {
  char buf[32];
  (void)st;
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xc2\x85k", 3), "U+0085");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xe2\x80\xa8", 3), "U+2028");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xe2\x80\xa9", 3), "U+2029");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\t", 1), "U+0009");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\x7f", 1), "U+007F");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "", 1), "U+0000");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, " ", 1), "U+0020");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "+x", 2), "'+'");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xc2\xa0", 2), "U+00A0");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xc3\xa9", 2),
                      "'\xc3\xa9' (U+00E9)");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xf0\x9f\x98\x80", 4),
                      "'\xf0\x9f\x98\x80' (U+1F600)");
  /* What prints as nothing: by its code point alone, as a control is. */
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xe2\x80\xae", 3), "U+202E");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xcc\x81", 2), "U+0301");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xee\x80\x80", 3), "U+E000");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xff", 1), "byte 0xff");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xc2", 1), "byte 0xc2");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "", 0), "end of text");
}

static void test_copy(void **st) {
  (void)st;
  char buf[8];
  size_t n = strlen(mixed);
  for (size_t cap = 1; cap <= sizeof buf; cap++) {
    size_t k = dspk__utf8_copy(buf, cap, mixed, n);
    assert_int_equal(strlen(buf), k);
    assert_true(k < cap);
    assert_memory_equal(buf, mixed, k);
    assert_true(dspk__utf8_valid(buf, k));
  }
  assert_int_equal(dspk__utf8_copy(buf, 0, mixed, n), 0);
}

static void test_format(void **st) {
  (void)st;
  char buf[64];
  for (size_t cap = 1; cap <= sizeof buf; cap++) {
    memset(buf, 'x', sizeof buf);
    int r = dspk__format(buf, cap, "unknown method \"%s\"", mixed);
    assert_int_equal(r, (int)(16 + strlen(mixed) + 1));
    size_t k = strlen(buf);
    assert_true(k < cap);
    assert_true(k + 3 >= (cap - 1 < (size_t)r ? cap - 1 : (size_t)r));
    assert_true(dspk__utf8_valid(buf, k));
    assert_memory_equal(buf, "unknown method \"", k < 16 ? k : 16);
  }
  /* Not cut: exactly vsnprintf. */
  assert_int_equal(dspk__format(buf, sizeof buf, "%s!", "\xc3\xa9"), 3);
  assert_string_equal(buf, "\xc3\xa9!");
}

static void test_sanitize(void **st) {
  (void)st;
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"plain", "plain"},
      {"caf\xc3\xa9", "caf\xc3\xa9"},
      {"a\xff" "b", "a\xef\xbf\xbd" "b"},
      {"\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd"}, /* cut short: each byte */
      {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xc3\xa9\x80", "\xc3\xa9\xef\xbf\xbd"},
  };
  char out[64];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = strlen(cases[i].in);
    size_t m = dspk__utf8_sanitized_len(cases[i].in, n);
    assert_int_equal(m, strlen(cases[i].out));
    dspk__utf8_sanitize(out, cases[i].in, n);
    assert_memory_equal(out, cases[i].out, m);
    assert_true(dspk__utf8_valid(out, m));
  }
}

/* dspk__pack_str packs the sanitized form, so a strict decoder reads it. */
static void test_pack_str(void **st) {
  (void)st;
  static const char *const ins[] = {"ok", "a\xff\xfe" "b\xc3", "caf\xc3\xa9", ""};
  for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    size_t off = 0, n = strlen(ins[i]);
    char want[64];
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    dspk__pack_str(&pk, ins[i]);
    msgpack_unpacked_init(&up);
    assert_int_equal(msgpack_unpack_next(&up, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, sb.size);
    assert_int_equal(up.data.type, MSGPACK_OBJECT_STR);
    dspk__utf8_sanitize(want, ins[i], n);
    assert_int_equal(up.data.via.str.size, dspk__utf8_sanitized_len(ins[i], n));
    assert_memory_equal(up.data.via.str.ptr, want, up.data.via.str.size);
    assert_true(dspk__utf8_valid(up.data.via.str.ptr, up.data.via.str.size));
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
  }
}

/* A client's dtype name is echoed cut to 16 bytes: never mid-character. */
static void test_codec_echo(void **st) {
  (void)st;
  char msg[256];
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_unpacked up;
  size_t off = 0;
  struct dspk__wire_tensor t;
  /* 15 ASCII bytes, then a two-byte character across the 16-byte cut. */
  const char *name = "fffffffffffffff\xc3\xa9";
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  dspk__pack_str(&pk, "dtype");
  dspk__pack_str(&pk, name);
  dspk__pack_str(&pk, "shape");
  msgpack_pack_array(&pk, 0);
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(dspk__tensor_decode(&up.data, NULL, &t, msg, sizeof msg), DSPK_EDTYPE);
  assert_string_equal(msg, "unknown dtype \"fffffffffffffff...\"");
  msgpack_unpacked_destroy(&up);
  msgpack_sbuffer_destroy(&sb);
}

/* Encodes the code point cp (no surrogate) as UTF-8; returns its length. */
static size_t enc(uint32_t cp, char *o) {
  if (cp < 0x80)
    return o[0] = (char)cp, 1;
  if (cp < 0x800)
    return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
  if (cp < 0x10000)
    return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
           o[2] = (char)(0x80 | (cp & 0x3F)), 3;
  return o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
         o[2] = (char)(0x80 | (cp >> 6 & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F)), 4;
}

/* protocol.md, Errors: the characters a message never holds, by code point. */
static int ref_ctl(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029;
}

/* Every code point between two letters: dspk__utf8_ctl says "control" for
 * exactly the reference's set (with the character's length), and a message
 * (dspk__one_line, what every error map holds) has it as one space, LF and
 * CR as "; ", anything else unchanged. */
static void test_controls(void **st) {
  (void)st;
  char in[8], out[24];
  for (uint32_t cp = 1; cp <= 0x10FFFF; cp++) {
    size_t n, m;
    if (cp >= 0xD800 && cp <= 0xDFFF)
      continue;
    in[0] = 'a';
    n = 1 + enc(cp, in + 1);
    assert_int_equal(dspk__utf8_ctl(in + 1, n - 1), ref_ctl(cp) ? n - 1 : 0);
    in[n++] = 'b';
    in[n] = '\0';
    m = dspk__one_line(out, in);
    if (cp == '\n' || cp == '\r') {
      assert_int_equal(m, 4);
      assert_memory_equal(out, "a; b", 4);
    } else if (ref_ctl(cp)) {
      assert_int_equal(m, 3);
      assert_memory_equal(out, "a b", 3);
    } else if (dspk__utf8_hidden(in + 1, n - 2, true, NULL)) {
      /* What prints as nothing: its escape (which ones: the UCD's,
       * test_visible_invisibles). */
      assert_true(m > n);
      assert_memory_equal(out, cp > 0xFFFF ? "a\\U" : "a\\u", 3);
    } else {
      assert_int_equal(m, n);
      assert_memory_equal(out, in, n);
    }
  }
  /* Cut short or ill-formed: no control (pack_strn makes them U+FFFD). */
  assert_int_equal(dspk__utf8_ctl("\xc2", 1), 0);
  assert_int_equal(dspk__utf8_ctl("\xe2\x80", 2), 0);
  assert_int_equal(dspk__utf8_ctl("\xc2\xa0", 2), 0);
  assert_int_equal(dspk__utf8_ctl("", 0), 0);
  /* Blanks at a line's ends dropped, C1 and separators counting as blanks. */
  assert_int_equal(dspk__one_line(out, "\xc2\x85x\xe2\x80\xa8\n\xe2\x80\xa9y\xc2\x9b"), 4);
  assert_memory_equal(out, "x; y", 4);
}

/* dspk__utf8_visible: what cannot be seen, escaped; the rest as it is. */
static void test_visible(void **state) {
  char b[64];
  (void)state;
  static const char in[] = "a\tb\\c\0d\x01\x7f\xff\xc2\x85\xe2\x80\x8b\xef\xbb\xbf\xc3\xa9 z";
  assert_string_equal(dspk__utf8_visible(b, sizeof b, in, sizeof in - 1),
                      "a\\tb\\\\c\\x00d\\x01\\x7f\\xff\\u0085\\u200b\\ufeff\xc3\xa9 z");
  /* Cut before an escape that would not fit, never inside one. */
  assert_string_equal(dspk__utf8_visible(b, 5, "ab\tcd", 5), "ab\\t");
  assert_string_equal(dspk__utf8_visible(b, 4, "ab\tcd", 5), "ab");
  assert_string_equal(dspk__utf8_visible(b, 1, "ab", 2), "");
}

/* Writes cp as UTF-8 into out; returns its length. */
static size_t put_utf8(char *out, uint32_t cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | cp >> 18);
  out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The code points that print as nothing or as a plain space, from the
 * Unicode Character Database of Debian's unicode-data (an independent
 * reference for proto/utf8.c's tables, not a copy of them): every
 * Default_Ignorable_Code_Point of DerivedCoreProperties.txt, every
 * character of General_Category Cf, Zs, Zl, Zp (but U+0020) or Co (private
 * use) in UnicodeData.txt, every Noncharacter_Code_Point of PropList.txt,
 * and the Braille blank U+2800 (dspk.conf(5) lists it): set[cp] is 1.
 * The combining marks (Mn, Me), escaped only where they have no base:
 * set[cp] is 2 (when not 1).  NULL, with the reason in why, when a file
 * cannot be read. */
#define UCD_DIR "/usr/share/unicode"
#define UCD_HIDDEN 1
#define UCD_MARK 2
static unsigned char *ucd_hidden(char *why, size_t whylen) {
  unsigned char *set = calloc(0x110000, 1);
  char line[512];
  FILE *f = fopen(UCD_DIR "/DerivedCoreProperties.txt", "r");
  unsigned first = 0;
  size_t n = 0;
  if (!set || !f) {
    snprintf(why, whylen, "%s/DerivedCoreProperties.txt: cannot read it (install unicode-data: "
             "scripts/deps.sh)", UCD_DIR);
    goto fail;
  }
  while (fgets(line, sizeof line, f)) {
    unsigned lo, hi;
    char prop[64];
    if (sscanf(line, "%x..%x ; %63s", &lo, &hi, prop) == 3 ||
        (sscanf(line, "%x ; %63s", &lo, prop) == 2 && (hi = lo, 1))) {
      if (strcmp(prop, "Default_Ignorable_Code_Point") == 0 && hi < 0x110000)
        for (unsigned cp = lo; cp <= hi; cp++, n++)
          set[cp] = 1;
    }
  }
  fclose(f);
  f = fopen(UCD_DIR "/UnicodeData.txt", "r");
  if (!f || n == 0) {
    snprintf(why, whylen, "%s: %s", UCD_DIR,
             f ? "no Default_Ignorable_Code_Point in DerivedCoreProperties.txt"
               : "UnicodeData.txt: cannot read it (install unicode-data: scripts/deps.sh)");
    goto fail;
  }
  n = 0;
  while (fgets(line, sizeof line, f)) {
    /* code;name;General_Category;...  (ranges: "<..., First>" then "<..., Last>") */
    unsigned cp;
    char *name = strchr(line, ';'), *gc = name ? strchr(name + 1, ';') : NULL;
    if (!gc || sscanf(line, "%x", &cp) != 1 || cp >= 0x110000)
      continue;
    bool hide = (gc[1] == 'C' && (gc[2] == 'f' || gc[2] == 'o')) ||
                (gc[1] == 'Z' && (gc[2] == 's' || gc[2] == 'l' || gc[2] == 'p'));
    bool mark = gc[1] == 'M' && (gc[2] == 'n' || gc[2] == 'e');
    bool last = strstr(name, ", Last>;") != NULL;
    if (strstr(name, ", First>;"))
      first = cp;
    if ((hide && cp != 0x20) || mark)
      for (unsigned c = last ? first : cp; c <= cp; c++, n++)
        set[c] |= hide ? UCD_HIDDEN : UCD_MARK;
  }
  fclose(f);
  f = fopen(UCD_DIR "/PropList.txt", "r");
  if (!f) {
    snprintf(why, whylen, "%s/PropList.txt: cannot read it (install unicode-data: "
             "scripts/deps.sh)", UCD_DIR);
    goto fail;
  }
  while (fgets(line, sizeof line, f)) {
    unsigned lo, hi;
    char prop[64];
    if (sscanf(line, "%x..%x ; %63s", &lo, &hi, prop) == 3 ||
        (sscanf(line, "%x ; %63s", &lo, prop) == 2 && (hi = lo, 1))) {
      if (strcmp(prop, "Noncharacter_Code_Point") == 0 && hi < 0x110000)
        for (unsigned cp = lo; cp <= hi; cp++)
          set[cp] |= UCD_HIDDEN;
    }
  }
  fclose(f);
  f = NULL;
  for (unsigned cp = 0; cp < 0x110000; cp++)
    if (set[cp] & UCD_HIDDEN)
      set[cp] = UCD_HIDDEN; /* hidden wherever it is, mark or not */
  if (n == 0) {
    snprintf(why, whylen, "%s/UnicodeData.txt: no character of category Cf, Zs, Zl or Zp",
             UCD_DIR);
    free(set);
    return NULL;
  }
  set[0x2800] = UCD_HIDDEN;
  return set;
fail:
  if (f)
    fclose(f);
  free(set);
  return NULL;
}

/* The escape of cp, or cp itself, into want. */
static void want_of(char *want, size_t cap, uint32_t cp, bool esc) {
  if (esc)
    snprintf(want, cap, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", (unsigned)cp);
  else
    want[put_utf8(want, cp)] = '\0';
}

/* dspk__utf8_visible, dspk__utf8_echo and dspk__one_line (every message
 * and log line) escape exactly the characters the database above says are
 * hidden (and visible the C1 controls, which the others make spaces), a
 * combining mark only where nothing it may sit on comes before it (the
 * start, a quote); over every code point from U+0080 to U+10FFFF (the C0
 * controls and DEL: test_visible).  An unassigned code point is written
 * as it is, as the database's "visible" says of it. */
static void test_visible_invisibles(void **state) {
  char why[256], in[16], b[64], want[64], want2[72];
  unsigned char *hidden = ucd_hidden(why, sizeof why);
  unsigned wrong = 0, hidden_n = 0, marks_n = 0;
  (void)state;
  if (!hidden)
    fail_msg("%s", why);
  for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF)
      continue; /* surrogates: not UTF-8 */
    bool c1 = cp <= 0x9F, esc = hidden[cp] == UCD_HIDDEN, mark = hidden[cp] == UCD_MARK;
    size_t n = put_utf8(in, cp);
    const char *got;
    hidden_n += esc;
    marks_n += mark;
    /* Alone (a value's start): a mark has no base. */
    want_of(want, sizeof want, cp, esc || mark || c1);
    got = dspk__utf8_visible(b, sizeof b, in, n);
    if (strcmp(got, want) != 0 && wrong++ < 20)
      print_error("U+%04X alone: visible as \"%s\", want \"%s\"\n", (unsigned)cp, got, want);
    if (!ref_ctl(cp)) {
      got = dspk__utf8_echo(b, sizeof b, in, n, 16);
      if (strcmp(got, want) != 0 && wrong++ < 20)
        print_error("U+%04X alone: echoed as \"%s\", want \"%s\"\n", (unsigned)cp, got, want);
      /* After a quote, in a message line. */
      in[n] = '\0';
      snprintf(want2, sizeof want2, "\"%s", want);
      memmove(in + 1, in, n + 1);
      in[0] = '"';
      size_t m = dspk__one_line(b, in);
      b[m] = '\0';
      if (strcmp(b, want2) != 0 && wrong++ < 20)
        print_error("U+%04X after a quote: line \"%s\", want \"%s\"\n", (unsigned)cp, b, want2);
      memmove(in, in + 1, n + 1);
    }
    /* After a letter: a mark sits on it. */
    want[0] = 'a';
    want_of(want + 1, sizeof want - 1, cp, esc || c1);
    memmove(in + 1, in, n);
    in[0] = 'a';
    got = dspk__utf8_visible(b, sizeof b, in, n + 1);
    if (strcmp(got, want) != 0 && wrong++ < 20)
      print_error("U+%04X after a letter: visible as \"%s\", want \"%s\" (%s)\n", (unsigned)cp,
                  got, want, esc ? "hidden by the UCD" : "visible by the UCD");
    if (!ref_ctl(cp)) {
      got = dspk__utf8_echo(b, sizeof b, in, n + 1, 16);
      if (strcmp(got, want) != 0 && wrong++ < 20)
        print_error("U+%04X after a letter: echoed as \"%s\", want \"%s\"\n", (unsigned)cp,
                    got, want);
      in[n + 1] = '\0';
      size_t m = dspk__one_line(b, in);
      b[m] = '\0';
      if (strcmp(b, want) != 0 && wrong++ < 20)
        print_error("U+%04X after a letter: line \"%s\", want \"%s\"\n", (unsigned)cp, b, want);
    }
  }
  free(hidden);
  if (wrong)
    fail_msg("%u code points escaped otherwise than the UCD says", wrong);
  /* Not a vacuous pass: the database's sets are thousands of code points
   * (with the private use planes, over 130000). */
  assert_true(hidden_n > 130000);
  assert_true(marks_n > 1500); /* those not default-ignorable too */
  /* The examples of probe 14: U+FE0F after a digit, a tag after a word. */
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "3\xef\xb8\x8f", 4), "3\\ufe0f");
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "info\xf3\xa0\x80\x81", 8),
                      "info\\U000e0001");
  /* Probe 15's: a mark first, or after an escape or a quote. */
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "\xcc\x81", 2), "\\u0301");
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "\t\xe2\x83\xa3", 4), "\\t\\u20e3");
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "'\xe1\xaa\xb0", 4), "'\\u1ab0");
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "x\xcc\x81", 3), "x\xcc\x81");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_visible_invisibles),
      cmocka_unit_test(test_valid_against_reference),
      cmocka_unit_test(test_cut),
      cmocka_unit_test(test_copy),
      cmocka_unit_test(test_echo),
      cmocka_unit_test(test_echo_hidden),
      cmocka_unit_test(test_echo_controls),
      cmocka_unit_test(test_char_name),
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_sanitize),
      cmocka_unit_test(test_pack_str),
      cmocka_unit_test(test_codec_echo),
      cmocka_unit_test(test_controls),
      cmocka_unit_test(test_visible),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
