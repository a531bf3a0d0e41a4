/*
 * The one escaping function of dspk-submit: every string that came from the
 * daemon (error messages, device and client names, status and cache fields,
 * progress text, JSON answers) goes through it before it reaches the
 * terminal, so a client name or message can carry no newline, escape
 * sequence or other control character to an admin's screen.  Kept apart
 * from the commands so tests/cli can unit-test it.
 */
#ifndef DSPK_CLIENT_SUBMIT_ESCAPE_H
#define DSPK_CLIENT_SUBMIT_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

enum dspk__sub_esc_style {
  /* C0 controls, DEL and C1 controls (U+0080..U+009F) as \xNN, \t, \n,
   * \r, \uNNNN; bytes that start no well-formed UTF-8 character as \xNN. */
  DSPK__SUB_ESC_TEXT,
  /* Like TEXT, but a newline becomes "; " and a tab a space: one line;
   * and, as an error line (docs/cli.md), every character that prints as
   * nothing (dspk__utf8_hidden: a zero-width or bidirectional control, a
   * no-break space, a combining mark with no base...) as \uNNNN, whoever
   * wrote it (an argument, the daemon). */
  DSPK__SUB_ESC_LINE,
  /* For JSON text (whose strings libdspkclient already escapes below
   * U+0020): the same characters as \u00NN, ill-formed bytes as \ufffd,
   * so the JSON stays valid. */
  DSPK__SUB_ESC_JSON,
};

/* Writes the escaped form of s into dst (cap bytes, NUL-terminated when
 * cap > 0; cut before an escape or character that would not fit) and
 * returns the length of the whole escaped form. */
size_t dspk__sub_escape(char *dst, size_t cap, const char *s, enum dspk__sub_esc_style st);

/* The TEXT form of s (NULL prints as ""), in one of 8 rotating buffers of
 * 1 KiB: several may appear in one printf. */
const char *dspk__sub_esc(const char *s);

/* A command-line argument (a file name, an option as typed) as a message
 * echoes it: what cannot be seen made visible (dspk__utf8_visible: a tab
 * as \\t, U+200B as \\u200b, a byte that is not UTF-8 as \\xNN, a backslash
 * as \\\\), in one of 8 rotating buffers of 1 KiB (cut to fit). */
const char *dspk__sub_arg(const char *s);
/* The same for s[0..n). */
const char *dspk__sub_arg_n(const char *s, size_t n);

/* Writes the escaped form of s to f, whatever its length. */
void dspk__sub_put(FILE *f, const char *s, enum dspk__sub_esc_style st);

/* Writes s[0..n) (which may hold any bytes) as one quoted JSON string on
 * f: '"' and '\\' escaped, C0 controls, DEL and C1 controls as \u00NN,
 * bytes that start no well-formed UTF-8 character as \ufffd; so the JSON
 * is valid and inert whatever the string is (a file name from the command
 * line, a label from the daemon). */
void dspk__sub_json_strn(FILE *f, const char *s, size_t n);
/* The same for a NUL-terminated s (NULL as ""). */
void dspk__sub_json_str(FILE *f, const char *s);

#endif
