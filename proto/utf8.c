/* UTF-8 cutting, formatting and sanitizing (proto/utf8.h). */
#include "proto/utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int cont(unsigned char c) { return (c & 0xC0) == 0x80; }

size_t dspk__utf8_seq(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  unsigned char lo = 0x80, hi = 0xBF;
  size_t len;

  if (n == 0)
    return 0;
  if (u[0] < 0x80)
    return 1;
  if (u[0] >= 0xC2 && u[0] <= 0xDF)
    len = 2;
  else if (u[0] >= 0xE0 && u[0] <= 0xEF) {
    len = 3;
    if (u[0] == 0xE0)
      lo = 0xA0; /* overlong below */
    else if (u[0] == 0xED)
      hi = 0x9F; /* surrogates above */
  } else if (u[0] >= 0xF0 && u[0] <= 0xF4) {
    len = 4;
    if (u[0] == 0xF0)
      lo = 0x90;
    else if (u[0] == 0xF4)
      hi = 0x8F; /* above U+10FFFF */
  } else
    return 0;
  if (n < len || u[1] < lo || u[1] > hi)
    return 0;
  for (size_t i = 2; i < len; i++)
    if (!cont(u[i]))
      return 0;
  return len;
}

size_t dspk__utf8_ctl(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;

  if (n == 0)
    return 0;
  if (u[0] < 0x20 || u[0] == 0x7F)
    return 1;
  if (u[0] == 0xC2 && n >= 2 && u[1] >= 0x80 && u[1] <= 0x9F)
    return 2;
  if (u[0] == 0xE2 && n >= 3 && u[1] == 0x80 && (u[2] == 0xA8 || u[2] == 0xA9))
    return 3;
  return 0;
}

bool dspk__utf8_valid(const char *s, size_t n) {
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = dspk__utf8_seq(s + i, n - i)))
      return false;
  return true;
}

size_t dspk__utf8_cut(const char *s, size_t n, size_t max) {
  const unsigned char *u = (const unsigned char *)s;
  size_t p = max;

  if (n <= max)
    return n;
  /* u[max] is the first byte left out: if it continues a character, the
   * cut moves back to that character's lead byte. */
  while (p > 0 && max - p < 3 && cont(u[p]))
    p--;
  if (!cont(u[max]) || u[p] < 0xC0)
    return max;
  return p + (u[p] >= 0xF0 ? 4 : u[p] >= 0xE0 ? 3 : 2) > max ? p : max;
}

const char *dspk__utf8_echo(char *dst, size_t cap, const char *s, size_t n, size_t max) {
  size_t w = 0, blanks = 0, k;
  bool text = false, brk = false, cut = false;

  n = dspk__utf8_cut(s, n, max);
  for (size_t i = 0; i < n; i += k) {
    unsigned char c = (unsigned char)s[i];
    k = 1;
    if (c == '\n' || c == '\r') { /* the blanks before it end a line: dropped */
      brk = true;
      blanks = 0;
      continue;
    }
    if (c != '\0' && ((k = dspk__utf8_ctl(s + i, n - i)) != 0 || c == ' ')) {
      k = k ? k : 1;
      blanks++;
      continue;
    }
    /* Text: a new line's leading blanks dropped, joined after text; then
     * the character (a NUL as \0, an ill-formed byte as it is: packing
     * makes it U+FFFD), all of it or, past cap, nothing more. */
    size_t sep = brk ? (text ? 2 : 0) : blanks;
    k = c == '\0' ? 1 : dspk__utf8_seq(s + i, n - i);
    k = k ? k : 1;
    if (w + sep + (c == '\0' ? 2 : k) >= cap) {
      cut = true;
      break;
    }
    if (brk)
      memcpy(dst + w, "; ", sep);
    else
      memset(dst + w, ' ', sep);
    w += sep;
    if (c == '\0')
      memcpy(dst + w, "\\0", 2), w += 2;
    else
      memcpy(dst + w, s + i, k), w += k;
    brk = false;
    blanks = 0;
    text = true;
  }
  if (!brk && !cut && w + blanks < cap) { /* the string's own trailing blanks */
    memset(dst + w, ' ', blanks);
    w += blanks;
  }
  dst[w] = '\0';
  return dst;
}

const char *dspk__utf8_char_name(char *dst, size_t cap, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t k = dspk__utf8_seq(s, n);
  uint32_t cp;

  if (n == 0) {
    snprintf(dst, cap, "end of text");
    return dst;
  }
  if (k == 0) {
    snprintf(dst, cap, "byte 0x%02x", (unsigned)u[0]);
    return dst;
  }
  if (k == 1)
    cp = u[0];
  else if (k == 2)
    cp = (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
  else if (k == 3)
    cp = (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
  else
    cp = (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
         (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
  if (dspk__utf8_ctl(s, n) != 0 || cp == ' ')
    snprintf(dst, cap, "U+%04X", (unsigned)cp);
  else if (cp < 0x80)
    snprintf(dst, cap, "'%c'", (char)cp);
  else
    snprintf(dst, cap, "'%.*s' (U+%04X)", (int)k, s, (unsigned)cp);
  return dst;
}

size_t dspk__utf8_copy(char *dst, size_t cap, const char *s, size_t n) {
  size_t k;
  if (cap == 0)
    return 0;
  k = dspk__utf8_cut(s, n, cap - 1);
  memmove(dst, s, k);
  dst[k] = '\0';
  return k;
}

/* n once a character cut short at the end of s[0..n) is dropped. */
static size_t trim_incomplete(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t p = n, want;
  while (p > 0 && n - p < 3 && cont(u[p - 1]))
    p--;
  if (p == 0 || u[p - 1] < 0xC0)
    return n;
  want = u[p - 1] >= 0xF0 ? 4 : u[p - 1] >= 0xE0 ? 3 : 2;
  return n - (p - 1) < want ? p - 1 : n;
}

int dspk__vformat(char *buf, size_t cap, const char *fmt, va_list ap) {
  int r = vsnprintf(buf, cap, fmt, ap);
  if (r >= 0 && cap > 0 && (size_t)r >= cap)
    buf[trim_incomplete(buf, cap - 1)] = '\0';
  return r;
}

int dspk__format(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  int r;
  va_start(ap, fmt);
  r = dspk__vformat(buf, cap, fmt, ap);
  va_end(ap);
  return r;
}

int dspk__fail(char *msg, size_t msglen, int code, const char *fmt, ...) {
  if (msg && msglen) {
    va_list ap;
    va_start(ap, fmt);
    dspk__vformat(msg, msglen, fmt, ap);
    va_end(ap);
  }
  return code;
}

size_t dspk__utf8_sanitized_len(const char *s, size_t n) {
  size_t out = 0;
  for (size_t i = 0, k; i < n; i += k ? k : 1)
    out += (k = dspk__utf8_seq(s + i, n - i)) ? k : sizeof replacement;
  return out;
}

void dspk__utf8_sanitize(char *dst, const char *s, size_t n) {
  for (size_t i = 0, k; i < n; i += k ? k : 1) {
    k = dspk__utf8_seq(s + i, n - i);
    memcpy(dst, k ? s + i : replacement, k ? k : sizeof replacement);
    dst += k ? k : sizeof replacement;
  }
}

/* Characters that print as nothing (or as a plain space) and so hide in a
 * message, as ranges of code points in order: every default-ignorable
 * code point (Unicode's Default_Ignorable_Code_Point: the soft hyphen,
 * the combining grapheme joiner, the Hangul fillers, the zero-width and
 * joiner characters, bidirectional controls, invisible operators,
 * variation selectors, tags, musical beams, the reserved ones among them),
 * every format character (General_Category Cf: the Arabic number signs,
 * the byte order mark, the interlinear annotation controls, the Egyptian
 * hieroglyph format controls...), every space separator but U+0020 (Zs:
 * the no-break spaces, the ogham space mark, U+2000-U+200A, the
 * ideographic space), the line and paragraph separators (U+2028, U+2029),
 * and the Braille blank (U+2800).  Unicode 15.1. */
static const uint32_t invisible[][2] = {
    {0x00A0, 0x00A0},   {0x00AD, 0x00AD},   {0x034F, 0x034F},   {0x0600, 0x0605},
    {0x061C, 0x061C},   {0x06DD, 0x06DD},   {0x070F, 0x070F},   {0x0890, 0x0891},
    {0x08E2, 0x08E2},   {0x115F, 0x1160},   {0x1680, 0x1680},   {0x17B4, 0x17B5},
    {0x180B, 0x180F},   {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x206F},
    {0x2800, 0x2800},   {0x3000, 0x3000},   {0x3164, 0x3164},   {0xFE00, 0xFE0F},
    {0xFEFF, 0xFEFF},   {0xFFA0, 0xFFA0},   {0xFFF0, 0xFFFB},   {0x110BD, 0x110BD},
    {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
    {0xE0000, 0xE0FFF},
};

static bool invisible_cp(uint32_t cp) {
  size_t lo = 0, hi = sizeof invisible / sizeof invisible[0];
  while (lo < hi) { /* the first range that ends at or after cp */
    size_t mid = lo + (hi - lo) / 2;
    if (invisible[mid][1] < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < sizeof invisible / sizeof invisible[0] && invisible[lo][0] <= cp;
}

static uint32_t decode(const unsigned char *u, size_t k) {
  if (k == 1)
    return u[0];
  if (k == 2)
    return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
  if (k == 3)
    return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
  return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
         (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

const char *dspk__utf8_visible(char *dst, size_t cap, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t o = 0;
  if (cap == 0)
    return dst;
  for (size_t i = 0, k; i < n; i += k) {
    char esc[16];
    const char *piece = esc;
    size_t plen;
    k = dspk__utf8_seq(s + i, n - i);
    uint32_t cp = k ? decode(u + i, k) : 0;
    if (k == 0) { /* not UTF-8: the byte */
      k = 1;
      plen = (size_t)snprintf(esc, sizeof esc, "\\x%02x", u[i]);
    } else if (cp == '\\') {
      plen = (size_t)snprintf(esc, sizeof esc, "\\\\");
    } else if (cp == '\t' || cp == '\n' || cp == '\r') {
      plen = (size_t)snprintf(esc, sizeof esc, "\\%c", cp == '\t' ? 't' : cp == '\n' ? 'n' : 'r');
    } else if (cp < 0x20 || cp == 0x7F) {
      plen = (size_t)snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
    } else if ((cp >= 0x80 && cp <= 0x9F) || invisible_cp(cp)) {
      plen = (size_t)snprintf(esc, sizeof esc, cp > 0xFFFF ? "\\U%08x" : "\\u%04x",
                              (unsigned)cp);
    } else {
      piece = s + i;
      plen = k;
    }
    if (o + plen >= cap)
      break;
    memcpy(dst + o, piece, plen);
    o += plen;
  }
  dst[o] = '\0';
  return dst;
}
