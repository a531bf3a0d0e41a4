/*
 * UTF-8 helpers for every string the wire carries (a msgpack str must be
 * well-formed UTF-8, RFC 3629): cutting a string to a byte budget without
 * splitting a character, formatting into a fixed buffer with the same rule,
 * and measuring the form of a string whose ill-formed bytes are replaced by
 * U+FFFD (dspk__pack_str packs that form, so nothing a client sends can make
 * the daemon emit an invalid str).  Pure functions: no allocation, no I/O.
 */
#ifndef DSPK_PROTO_UTF8_H
#define DSPK_PROTO_UTF8_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The length (1 to 4) of the well-formed sequence that starts s[0..n), or 0
 * when none does (a stray continuation byte, an overlong form, a surrogate,
 * a code point above U+10FFFF, or a sequence cut short by n). */
size_t dspk__utf8_seq(const char *s, size_t n);

/* true when s[0..n) is well-formed UTF-8. */
bool dspk__utf8_valid(const char *s, size_t n);

/* The length of the longest prefix of s[0..n) of at most max bytes that does
 * not end inside a character: n when n <= max, else max moved back to the
 * start of the character it would split. */
size_t dspk__utf8_cut(const char *s, size_t n, size_t max);

/* A client's string made printable for a message (every place a message
 * echoes one uses this, so that it never breaks the message's one line,
 * hides nothing, and two different strings never read the same: probe 21
 * D-1, "cpu:0\n" was echoed as "cpu:0"): its first max bytes (cut at a
 * character boundary, dspk__utf8_cut, and then followed by "..."), each
 * character written by dspk__utf8_visible's rule, as docs/protocol.md
 * "Errors" says: a backslash as \\, tab, LF and CR as \t, \n, \r, the
 * other C0 controls (NUL among them) and DEL as \xNN, each byte that
 * starts no well-formed UTF-8 character as \xNN, the C1 controls and
 * every character that prints as nothing (dspk__utf8_hidden) as \uNNNN
 * (\UNNNNNNNN above U+FFFF); into dst (cap > 0; cut to fit, never inside a
 * character or an escape, then "..." too, NUL-terminated; cap < 4 gives
 * "").  Output at most DSPK__ECHO_CAP(max) - 1 bytes (a byte written as
 * \xNN is the most growth, and "..." may follow).  Returns dst. */
const char *dspk__utf8_echo(char *dst, size_t cap, const char *s, size_t n, size_t max);
#define DSPK__ECHO_CAP(max) (4 * (size_t)(max) + 4)

/* The length (2 to 4) of the character that starts s[0..n) when no text
 * the daemon or dspk-submit writes may hold it as it is, because it prints
 * as nothing, as a plain space or as some font's choice, 0 when it may (or
 * when s starts with ASCII or with a byte that starts no well-formed
 * sequence: the callers' own rules).  Such a character is written as
 * \uNNNN (dspk__utf8_hidden_esc); dspk.conf(5), docs/protocol.md "Errors"
 * and docs/cli.md list them: every default-ignorable code point, format
 * character (Cf) and space separator (Zs) but U+0020, U+2028, U+2029 and
 * U+2800 (the table in utf8.c, Unicode 15.1), the noncharacters
 * (U+FDD0-U+FDEF, U+xFFFE, U+xFFFF), the private-use characters
 * (U+E000-U+F8FF, planes 15 and 16), and, when after_base is false, a
 * combining mark (Mn, Me): one with no character of its own to sit on.
 * after_base: whether what was written just before it is a character
 * written as itself that a mark may sit on (dspk__utf8_base), false at
 * the start of a text and after a blank, a quote or an escape.  An
 * unassigned code point is not hidden: the table would have to follow
 * every new Unicode version.  *cp (when not NULL) gets the code point. */
size_t dspk__utf8_hidden(const char *s, size_t n, bool after_base, uint32_t *cp);

/* Whether the character s[0..k), written as itself, is one a combining
 * mark may sit on: an ASCII letter or digit, or any other character of
 * more than one byte (a letter of another script, a mark on one).  ASCII
 * punctuation and blanks are not. */
bool dspk__utf8_base(const char *s, size_t k);

/* Writes cp's escape, \uNNNN (\UNNNNNNNN above U+FFFF, lowercase hex),
 * into dst (11 bytes are enough); returns its length. */
size_t dspk__utf8_hidden_esc(char *dst, uint32_t cp);

/* User text (a configuration line, a command-line argument) made visible
 * for a message that echoes it, so that what cannot be seen can be read:
 * a backslash as \\, tab, LF and CR as \t, \n, \r, the other C0 controls,
 * DEL and every byte that starts no well-formed UTF-8 sequence as \xNN, the
 * C1 controls and the characters that print as nothing
 * (dspk__utf8_hidden, the value's start counting as no base) as \uNNNN,
 * or \UNNNNNNNN above U+FFFF; other characters as they are.
 * Into dst (cap > 0; cut before an escape or character that would not fit,
 * NUL-terminated).  Returns dst. */
const char *dspk__utf8_visible(char *dst, size_t cap, const char *s, size_t n);

/* Names the character that starts s[0..n) for a message that points at
 * it (e.g. "U+0085 is not a letter"), in a form that survives
 * dspk__utf8_echo and dspk__one_line: a control character (dspk__utf8_ctl),
 * a space or a character that prints as nothing (dspk__utf8_hidden, with
 * no base: it is quoted) as its code point ("U+0009", "U+2028",
 * "U+202E"), an ASCII character in quotes ("'+'"), another one in quotes
 * and by code point ("'é' (U+00E9)",
 * so that a no-break space is not taken for a space), a byte that starts no
 * well-formed sequence as "byte 0xNN", nothing as "end of text".  Into dst
 * (24 bytes are enough).  Returns dst. */
const char *dspk__utf8_char_name(char *dst, size_t cap, const char *s, size_t n);

/* Copies the longest prefix of s[0..n) that fits in cap - 1 bytes without
 * splitting a character, and a NUL; returns the bytes copied (cap > 0). */
size_t dspk__utf8_copy(char *dst, size_t cap, const char *s, size_t n);

/* vsnprintf, except that output cut at cap is cut at a character boundary
 * (the text is never left ending in part of a character).  Returns what
 * vsnprintf returns. */
int dspk__vformat(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
int dspk__format(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The one "format the detail and return the code" helper of every layer:
 * writes the message into msg (when msg is not NULL, by dspk__vformat's
 * rule) and returns code. */
int dspk__fail(char *msg, size_t msglen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The plural ending of a count's noun in a message: "" for 1, else "s"
 * ("%llu byte%s", n, dspk__s(n)): no message says "1 bytes" (probe 13 #5,
 * 14 #8, 16 A#4). */
static inline const char *dspk__s(unsigned long long n) { return n == 1 ? "" : "s"; }

/* The length (1 to 3) of the control character that starts s[0..n), or 0
 * when none does: the C0 controls U+0000-U+001F, DEL U+007F, the C1
 * controls U+0080-U+009F (C2 80 to C2 9F) and the line and paragraph
 * separators U+2028 and U+2029 (E2 80 A8, E2 80 A9).  These are what no
 * one-line text the daemon writes (an error message, a log line, a name in
 * status) may hold: a reader that splits lines or interprets terminal
 * controls would split or act on them.  Only well-formed sequences count
 * (a C2 not followed by 80 to 9F is no control; dspk__pack_strn makes an
 * ill-formed byte U+FFFD). */
size_t dspk__utf8_ctl(const char *s, size_t n);

/* The length of s[0..n) once every byte that starts no well-formed sequence
 * is replaced by U+FFFD (EF BF BD); n when s is well-formed. */
size_t dspk__utf8_sanitized_len(const char *s, size_t n);

/* Writes that replaced form to dst (dspk__utf8_sanitized_len(s, n) bytes,
 * no NUL added). */
void dspk__utf8_sanitize(char *dst, const char *s, size_t n);

#endif
