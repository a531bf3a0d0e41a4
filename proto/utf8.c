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

/* dspk__utf8_visible's rule over s[0..n), into dst[0..cap) (cap > 0):
 * stops before an escape or a character that would not fit.  Writes the
 * NUL; returns the input bytes written (n when all of them were). */
static size_t visible_into(char *dst, size_t cap, const char *s, size_t n);

const char *dspk__utf8_echo(char *dst, size_t cap, const char *s, size_t n, size_t max) {
  size_t keep, done;

  /* Room for the mark of a cut ("..."), kept from the start. */
  if (cap < 4) {
    dst[0] = '\0';
    return dst;
  }
  keep = dspk__utf8_cut(s, n, max);
  done = visible_into(dst, cap - 3, s, keep);
  /* A cut is marked, so that the echo is never taken for the whole
   * string (probe 16 A#3: "float32_little_endian" read "float32_little_e"). */
  if (done < n)
    strcat(dst, "...");
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
  if (dspk__utf8_ctl(s, n) != 0 || cp == ' ' || dspk__utf8_hidden(s, n, false, NULL))
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

static bool in_ranges(const uint32_t (*r)[2], size_t nr, uint32_t cp) {
  size_t lo = 0, hi = nr;
  while (lo < hi) { /* the first range that ends at or after cp */
    size_t mid = lo + (hi - lo) / 2;
    if (r[mid][1] < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < nr && r[lo][0] <= cp;
}

/* The combining marks (General_Category Mn and Me of Unicode 15.1, from
 * its UnicodeData.txt): each prints on the character before it, so one
 * that has none of its own (at the start of a text, after a quote or an
 * escape) prints as nothing, or over the quote. */
static const uint32_t marks[][2] = {
    {0x0300, 0x036F}, {0x0483, 0x0489}, {0x0591, 0x05BD}, {0x05BF, 0x05BF}, {0x05C1, 0x05C2},
    {0x05C4, 0x05C5}, {0x05C7, 0x05C7}, {0x0610, 0x061A}, {0x064B, 0x065F}, {0x0670, 0x0670},
    {0x06D6, 0x06DC}, {0x06DF, 0x06E4}, {0x06E7, 0x06E8}, {0x06EA, 0x06ED}, {0x0711, 0x0711},
    {0x0730, 0x074A}, {0x07A6, 0x07B0}, {0x07EB, 0x07F3}, {0x07FD, 0x07FD}, {0x0816, 0x0819},
    {0x081B, 0x0823}, {0x0825, 0x0827}, {0x0829, 0x082D}, {0x0859, 0x085B}, {0x0898, 0x089F},
    {0x08CA, 0x08E1}, {0x08E3, 0x0902}, {0x093A, 0x093A}, {0x093C, 0x093C}, {0x0941, 0x0948},
    {0x094D, 0x094D}, {0x0951, 0x0957}, {0x0962, 0x0963}, {0x0981, 0x0981}, {0x09BC, 0x09BC},
    {0x09C1, 0x09C4}, {0x09CD, 0x09CD}, {0x09E2, 0x09E3}, {0x09FE, 0x09FE}, {0x0A01, 0x0A02},
    {0x0A3C, 0x0A3C}, {0x0A41, 0x0A42}, {0x0A47, 0x0A48}, {0x0A4B, 0x0A4D}, {0x0A51, 0x0A51},
    {0x0A70, 0x0A71}, {0x0A75, 0x0A75}, {0x0A81, 0x0A82}, {0x0ABC, 0x0ABC}, {0x0AC1, 0x0AC5},
    {0x0AC7, 0x0AC8}, {0x0ACD, 0x0ACD}, {0x0AE2, 0x0AE3}, {0x0AFA, 0x0AFF}, {0x0B01, 0x0B01},
    {0x0B3C, 0x0B3C}, {0x0B3F, 0x0B3F}, {0x0B41, 0x0B44}, {0x0B4D, 0x0B4D}, {0x0B55, 0x0B56},
    {0x0B62, 0x0B63}, {0x0B82, 0x0B82}, {0x0BC0, 0x0BC0}, {0x0BCD, 0x0BCD}, {0x0C00, 0x0C00},
    {0x0C04, 0x0C04}, {0x0C3C, 0x0C3C}, {0x0C3E, 0x0C40}, {0x0C46, 0x0C48}, {0x0C4A, 0x0C4D},
    {0x0C55, 0x0C56}, {0x0C62, 0x0C63}, {0x0C81, 0x0C81}, {0x0CBC, 0x0CBC}, {0x0CBF, 0x0CBF},
    {0x0CC6, 0x0CC6}, {0x0CCC, 0x0CCD}, {0x0CE2, 0x0CE3}, {0x0D00, 0x0D01}, {0x0D3B, 0x0D3C},
    {0x0D41, 0x0D44}, {0x0D4D, 0x0D4D}, {0x0D62, 0x0D63}, {0x0D81, 0x0D81}, {0x0DCA, 0x0DCA},
    {0x0DD2, 0x0DD4}, {0x0DD6, 0x0DD6}, {0x0E31, 0x0E31}, {0x0E34, 0x0E3A}, {0x0E47, 0x0E4E},
    {0x0EB1, 0x0EB1}, {0x0EB4, 0x0EBC}, {0x0EC8, 0x0ECE}, {0x0F18, 0x0F19}, {0x0F35, 0x0F35},
    {0x0F37, 0x0F37}, {0x0F39, 0x0F39}, {0x0F71, 0x0F7E}, {0x0F80, 0x0F84}, {0x0F86, 0x0F87},
    {0x0F8D, 0x0F97}, {0x0F99, 0x0FBC}, {0x0FC6, 0x0FC6}, {0x102D, 0x1030}, {0x1032, 0x1037},
    {0x1039, 0x103A}, {0x103D, 0x103E}, {0x1058, 0x1059}, {0x105E, 0x1060}, {0x1071, 0x1074},
    {0x1082, 0x1082}, {0x1085, 0x1086}, {0x108D, 0x108D}, {0x109D, 0x109D}, {0x135D, 0x135F},
    {0x1712, 0x1714}, {0x1732, 0x1733}, {0x1752, 0x1753}, {0x1772, 0x1773}, {0x17B4, 0x17B5},
    {0x17B7, 0x17BD}, {0x17C6, 0x17C6}, {0x17C9, 0x17D3}, {0x17DD, 0x17DD}, {0x180B, 0x180D},
    {0x180F, 0x180F}, {0x1885, 0x1886}, {0x18A9, 0x18A9}, {0x1920, 0x1922}, {0x1927, 0x1928},
    {0x1932, 0x1932}, {0x1939, 0x193B}, {0x1A17, 0x1A18}, {0x1A1B, 0x1A1B}, {0x1A56, 0x1A56},
    {0x1A58, 0x1A5E}, {0x1A60, 0x1A60}, {0x1A62, 0x1A62}, {0x1A65, 0x1A6C}, {0x1A73, 0x1A7C},
    {0x1A7F, 0x1A7F}, {0x1AB0, 0x1ACE}, {0x1B00, 0x1B03}, {0x1B34, 0x1B34}, {0x1B36, 0x1B3A},
    {0x1B3C, 0x1B3C}, {0x1B42, 0x1B42}, {0x1B6B, 0x1B73}, {0x1B80, 0x1B81}, {0x1BA2, 0x1BA5},
    {0x1BA8, 0x1BA9}, {0x1BAB, 0x1BAD}, {0x1BE6, 0x1BE6}, {0x1BE8, 0x1BE9}, {0x1BED, 0x1BED},
    {0x1BEF, 0x1BF1}, {0x1C2C, 0x1C33}, {0x1C36, 0x1C37}, {0x1CD0, 0x1CD2}, {0x1CD4, 0x1CE0},
    {0x1CE2, 0x1CE8}, {0x1CED, 0x1CED}, {0x1CF4, 0x1CF4}, {0x1CF8, 0x1CF9}, {0x1DC0, 0x1DFF},
    {0x20D0, 0x20F0}, {0x2CEF, 0x2CF1}, {0x2D7F, 0x2D7F}, {0x2DE0, 0x2DFF}, {0x302A, 0x302D},
    {0x3099, 0x309A}, {0xA66F, 0xA672}, {0xA674, 0xA67D}, {0xA69E, 0xA69F}, {0xA6F0, 0xA6F1},
    {0xA802, 0xA802}, {0xA806, 0xA806}, {0xA80B, 0xA80B}, {0xA825, 0xA826}, {0xA82C, 0xA82C},
    {0xA8C4, 0xA8C5}, {0xA8E0, 0xA8F1}, {0xA8FF, 0xA8FF}, {0xA926, 0xA92D}, {0xA947, 0xA951},
    {0xA980, 0xA982}, {0xA9B3, 0xA9B3}, {0xA9B6, 0xA9B9}, {0xA9BC, 0xA9BD}, {0xA9E5, 0xA9E5},
    {0xAA29, 0xAA2E}, {0xAA31, 0xAA32}, {0xAA35, 0xAA36}, {0xAA43, 0xAA43}, {0xAA4C, 0xAA4C},
    {0xAA7C, 0xAA7C}, {0xAAB0, 0xAAB0}, {0xAAB2, 0xAAB4}, {0xAAB7, 0xAAB8}, {0xAABE, 0xAABF},
    {0xAAC1, 0xAAC1}, {0xAAEC, 0xAAED}, {0xAAF6, 0xAAF6}, {0xABE5, 0xABE5}, {0xABE8, 0xABE8},
    {0xABED, 0xABED}, {0xFB1E, 0xFB1E}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F}, {0x101FD, 0x101FD},
    {0x102E0, 0x102E0}, {0x10376, 0x1037A}, {0x10A01, 0x10A03}, {0x10A05, 0x10A06},
    {0x10A0C, 0x10A0F}, {0x10A38, 0x10A3A}, {0x10A3F, 0x10A3F}, {0x10AE5, 0x10AE6},
    {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11001, 0x11001}, {0x11038, 0x11046}, {0x11070, 0x11070},
    {0x11073, 0x11074}, {0x1107F, 0x11081}, {0x110B3, 0x110B6}, {0x110B9, 0x110BA},
    {0x110C2, 0x110C2}, {0x11100, 0x11102}, {0x11127, 0x1112B}, {0x1112D, 0x11134},
    {0x11173, 0x11173}, {0x11180, 0x11181}, {0x111B6, 0x111BE}, {0x111C9, 0x111CC},
    {0x111CF, 0x111CF}, {0x1122F, 0x11231}, {0x11234, 0x11234}, {0x11236, 0x11237},
    {0x1123E, 0x1123E}, {0x11241, 0x11241}, {0x112DF, 0x112DF}, {0x112E3, 0x112EA},
    {0x11300, 0x11301}, {0x1133B, 0x1133C}, {0x11340, 0x11340}, {0x11366, 0x1136C},
    {0x11370, 0x11374}, {0x11438, 0x1143F}, {0x11442, 0x11444}, {0x11446, 0x11446},
    {0x1145E, 0x1145E}, {0x114B3, 0x114B8}, {0x114BA, 0x114BA}, {0x114BF, 0x114C0},
    {0x114C2, 0x114C3}, {0x115B2, 0x115B5}, {0x115BC, 0x115BD}, {0x115BF, 0x115C0},
    {0x115DC, 0x115DD}, {0x11633, 0x1163A}, {0x1163D, 0x1163D}, {0x1163F, 0x11640},
    {0x116AB, 0x116AB}, {0x116AD, 0x116AD}, {0x116B0, 0x116B5}, {0x116B7, 0x116B7},
    {0x1171D, 0x1171F}, {0x11722, 0x11725}, {0x11727, 0x1172B}, {0x1182F, 0x11837},
    {0x11839, 0x1183A}, {0x1193B, 0x1193C}, {0x1193E, 0x1193E}, {0x11943, 0x11943},
    {0x119D4, 0x119D7}, {0x119DA, 0x119DB}, {0x119E0, 0x119E0}, {0x11A01, 0x11A0A},
    {0x11A33, 0x11A38}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47}, {0x11A51, 0x11A56},
    {0x11A59, 0x11A5B}, {0x11A8A, 0x11A96}, {0x11A98, 0x11A99}, {0x11C30, 0x11C36},
    {0x11C38, 0x11C3D}, {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7}, {0x11CAA, 0x11CB0},
    {0x11CB2, 0x11CB3}, {0x11CB5, 0x11CB6}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A},
    {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D90, 0x11D91},
    {0x11D95, 0x11D95}, {0x11D97, 0x11D97}, {0x11EF3, 0x11EF4}, {0x11F00, 0x11F01},
    {0x11F36, 0x11F3A}, {0x11F40, 0x11F40}, {0x11F42, 0x11F42}, {0x13440, 0x13440},
    {0x13447, 0x13455}, {0x16AF0, 0x16AF4}, {0x16B30, 0x16B36}, {0x16F4F, 0x16F4F},
    {0x16F8F, 0x16F92}, {0x16FE4, 0x16FE4}, {0x1BC9D, 0x1BC9E}, {0x1CF00, 0x1CF2D},
    {0x1CF30, 0x1CF46}, {0x1D167, 0x1D169}, {0x1D17B, 0x1D182}, {0x1D185, 0x1D18B},
    {0x1D1AA, 0x1D1AD}, {0x1D242, 0x1D244}, {0x1DA00, 0x1DA36}, {0x1DA3B, 0x1DA6C},
    {0x1DA75, 0x1DA75}, {0x1DA84, 0x1DA84}, {0x1DA9B, 0x1DA9F}, {0x1DAA1, 0x1DAAF},
    {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024},
    {0x1E026, 0x1E02A}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
    {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1E8D0, 0x1E8D6}, {0x1E944, 0x1E94A},
    {0xE0100, 0xE01EF},
};

/* Written as \uNNNN wherever it is: the invisible characters above, the
 * noncharacters (U+FDD0-U+FDEF and the last two code points of each plane,
 * U+xFFFE and U+xFFFF) and the private-use characters (U+E000-U+F8FF and
 * planes 15 and 16), which a terminal shows as nothing or as a glyph of
 * some font's choosing. */
static bool hidden_cp(uint32_t cp) {
  return in_ranges(invisible, sizeof invisible / sizeof invisible[0], cp) ||
         (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFE) == 0xFFFE ||
         (cp >= 0xE000 && cp <= 0xF8FF) || cp >= 0xF0000;
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

size_t dspk__utf8_hidden(const char *s, size_t n, bool after_base, uint32_t *cp) {
  size_t k = dspk__utf8_seq(s, n);
  uint32_t c;
  if (k < 2)
    return 0; /* ASCII, or not UTF-8: the callers' own rules */
  c = decode((const unsigned char *)s, k);
  if (!hidden_cp(c) &&
      (after_base || !in_ranges(marks, sizeof marks / sizeof marks[0], c)))
    return 0;
  if (cp)
    *cp = c;
  return k;
}

bool dspk__utf8_base(const char *s, size_t k) {
  unsigned char c = (unsigned char)s[0];
  return k > 1 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

size_t dspk__utf8_hidden_esc(char *dst, uint32_t cp) {
  return (size_t)snprintf(dst, 11, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", (unsigned)cp);
}

static size_t visible_into(char *dst, size_t cap, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t o = 0;
  bool base = false; /* what was written last may carry a combining mark */
  size_t i = 0;
  for (size_t k; i < n; i += k) {
    char esc[16];
    const char *piece = esc;
    size_t plen;
    uint32_t hcp;
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
    } else if (cp >= 0x80 && cp <= 0x9F) {
      plen = dspk__utf8_hidden_esc(esc, cp);
    } else if (dspk__utf8_hidden(s + i, n - i, base, &hcp)) {
      plen = dspk__utf8_hidden_esc(esc, hcp);
    } else {
      piece = s + i;
      plen = k;
    }
    if (o + plen >= cap)
      break;
    memcpy(dst + o, piece, plen);
    o += plen;
    base = piece != esc && dspk__utf8_base(s + i, k);
  }
  dst[o] = '\0';
  return i;
}

const char *dspk__utf8_visible(char *dst, size_t cap, const char *s, size_t n) {
  if (cap > 0)
    visible_into(dst, cap, s, n);
  return dst;
}
