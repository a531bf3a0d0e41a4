/*
 * Unit tests of the UTF-8 helpers (proto/utf8.c) and of dspk__pack_str,
 * which packs every str the daemon sends: the validator against a second,
 * arithmetic decoder over every string of up to three bytes drawn from the
 * bytes where the rules change; cutting and formatting never leave part of
 * a character at any budget; the sanitized form is well-formed, replaces
 * exactly the ill-formed bytes, and is what dspk__pack_str packs; the
 * characters escaped as invisible are those the Unicode Character Database
 * (Debian's unicode-data) says print as nothing or as a space.
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

/* A client's string echoed in a message: a NUL byte as \0, cut at a
 * character boundary, to the buffer. */
static void test_echo(void **st) {
  char buf[16];
  (void)st;
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "ping\0x", 6, 64), "ping\\0x");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "\xc3\xa9\xc3\xa9", 4, 3), "\xc3\xa9");
  assert_string_equal(dspk__utf8_echo(buf, 6, "abcd\0", 5, 64), "abcd");
  assert_string_equal(dspk__utf8_echo(buf, 7, "abcd\0", 5, 64), "abcd\\0");
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "", 0, 64), "");
}

/* Its lines joined with "; ", blank lines dropped, a leading or trailing
 * line break too ("gemm\n" was echoed as "gemm; "), the blanks next to a
 * break with it, other controls as one space, the string's own leading and
 * trailing blanks kept. */
static void test_echo_lines(void **st) {
  static const struct { const char *in, *out; } cases[] = {
      {"abc\n", "abc"},          {"\nabc", "abc"},       {"a\r", "a"},
      {"\n\n", ""},              {"a\n\nb", "a; b"},     {"a\r\nb", "a; b"},
      {"a \n b", "a; b"},        {" \t\n a\n\t", "a"},  {"\n \n", ""},
      {" a ", " a "},           {"a\tb", "a b"},        {"a\xc2\x85" "b", "a b"},
      {"\xe2\x80\xa8" "x", " x"}, {"x\xe2\x80\xa9\n", "x"}, {"a\n\xc2\x9b\nb", "a; b"},
      {"\xc3\xa9\n\xc3\xa9", "\xc3\xa9; \xc3\xa9"}, {"ij, jk -> ik", "ij, jk -> ik"},
  };
  char buf[64];
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    assert_string_equal(dspk__utf8_echo(buf, sizeof buf, cases[i].in, strlen(cases[i].in), 32),
                        cases[i].out);
  /* A NUL is text: "\0" after a break is a line. */
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "\n\0\n", 3, 32), "\\0");
  /* The growth fits 2 * max + 1; cut to cap whole ("; " is not split). */
  assert_string_equal(dspk__utf8_echo(buf, sizeof buf, "a\na\na", 5, 32), "a; a; a");
  assert_string_equal(dspk__utf8_echo(buf, 5, "a\nb", 3, 32), "a; b");
  assert_string_equal(dspk__utf8_echo(buf, 4, "a\nb", 3, 32), "a");
  assert_string_equal(dspk__utf8_echo(buf, 3, "a\nb", 3, 32), "a");
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
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xc2\xa0", 2),
                      "'\xc2\xa0' (U+00A0)");
  assert_string_equal(dspk__utf8_char_name(buf, sizeof buf, "\xf0\x9f\x98\x80", 4),
                      "'\xf0\x9f\x98\x80' (U+1F600)");
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
  assert_string_equal(msg, "unknown dtype \"fffffffffffffff\"");
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
  char in[8], out[16];
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
 * reference for proto/utf8.c's table, not a copy of it): every
 * Default_Ignorable_Code_Point of DerivedCoreProperties.txt, every
 * character of General_Category Cf, Zs, Zl or Zp in UnicodeData.txt but
 * U+0020, and the Braille blank U+2800 (dspk.conf(5) lists it).  NULL,
 * with the reason in why, when a file cannot be read. */
#define UCD_DIR "/usr/share/unicode"
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
    bool hide = (gc[1] == 'C' && gc[2] == 'f') ||
                (gc[1] == 'Z' && (gc[2] == 's' || gc[2] == 'l' || gc[2] == 'p'));
    bool last = strstr(name, ", Last>;") != NULL;
    if (strstr(name, ", First>;"))
      first = cp;
    if (hide && cp != 0x20)
      for (unsigned c = last ? first : cp; c <= cp; c++, n++)
        set[c] = 1;
  }
  fclose(f);
  if (n == 0) {
    snprintf(why, whylen, "%s/UnicodeData.txt: no character of category Cf, Zs, Zl or Zp",
             UCD_DIR);
    free(set);
    return NULL;
  }
  set[0x2800] = 1;
  return set;
fail:
  if (f)
    fclose(f);
  free(set);
  return NULL;
}

/* dspk__utf8_visible escapes exactly the characters the database above
 * says are hidden, and the C1 controls, over every code point from U+0080
 * to U+10FFFF (the C0 controls and DEL: test_visible). */
static void test_visible_invisibles(void **state) {
  char why[256], in[8], b[32], want[32];
  unsigned char *hidden = ucd_hidden(why, sizeof why);
  unsigned wrong = 0, hidden_n = 0;
  (void)state;
  if (!hidden)
    fail_msg("%s", why);
  for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF)
      continue; /* surrogates: not UTF-8 */
    bool esc = hidden[cp] || cp <= 0x9F;
    size_t n = put_utf8(in, cp);
    hidden_n += esc;
    if (esc)
      snprintf(want, sizeof want, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", (unsigned)cp);
    else {
      memcpy(want, in, n);
      want[n] = '\0';
    }
    const char *got = dspk__utf8_visible(b, sizeof b, in, n);
    if (strcmp(got, want) != 0 && wrong++ < 20)
      print_error("U+%04X: escaped as \"%s\", want \"%s\" (%s)\n", (unsigned)cp, got, want,
                  esc ? "hidden by the UCD" : "visible by the UCD");
  }
  free(hidden);
  if (wrong)
    fail_msg("%u code points escaped otherwise than the UCD says", wrong);
  /* Not a vacuous pass: the database's set is several thousand code points. */
  assert_true(hidden_n > 4000);
  /* The examples of probe 14: U+FE0F after a digit, a tag after a word. */
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "3\xef\xb8\x8f", 4), "3\\ufe0f");
  assert_string_equal(dspk__utf8_visible(b, sizeof b, "info\xf3\xa0\x80\x81", 8),
                      "info\\U000e0001");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_visible_invisibles),
      cmocka_unit_test(test_valid_against_reference),
      cmocka_unit_test(test_cut),
      cmocka_unit_test(test_copy),
      cmocka_unit_test(test_echo),
      cmocka_unit_test(test_echo_lines),
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
