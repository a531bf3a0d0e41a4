/* Escaping of the daemon's strings for the terminal (escape.h). */
#include "client/submit/escape.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/utf8.h"

size_t dspk__sub_escape(char *dst, size_t cap, const char *s, enum dspk__sub_esc_style st) {
  size_t out = 0, w = 0, n = s ? strlen(s) : 0, i = 0;
  int full = 0;
  bool base = false; /* LINE: what was written last may carry a combining mark */

  while (i < n) {
    const unsigned char c = (unsigned char)s[i];
    size_t k = dspk__utf8_seq(s + i, n - i);
    char esc[12];
    const char *piece = esc;
    size_t plen;
    unsigned cp = 0x100; /* not a control */
    uint32_t hcp;

    if (k == 1 && (c < 0x20 || c == 0x7f))
      cp = c;
    else if (k == 2 && c == 0xC2 && (unsigned char)s[i + 1] < 0xA0)
      cp = (unsigned char)s[i + 1]; /* C1: U+0080..U+009F */
    if (k == 0) {
      snprintf(esc, sizeof esc, st == DSPK__SUB_ESC_JSON ? "\\ufffd" : "\\x%02x", c);
      k = 1;
    } else if (cp == 0x100 && st == DSPK__SUB_ESC_LINE &&
               dspk__utf8_hidden(s + i, n - i, base, &hcp))
      dspk__utf8_hidden_esc(esc, hcp); /* an error line hides nothing */
    else if (cp == 0x100)
      piece = s + i;
    else if (st == DSPK__SUB_ESC_JSON)
      snprintf(esc, sizeof esc, "\\u%04x", cp);
    else if (st == DSPK__SUB_ESC_LINE && cp == '\n')
      snprintf(esc, sizeof esc, "; ");
    else if (st == DSPK__SUB_ESC_LINE && cp == '\t')
      snprintf(esc, sizeof esc, " ");
    else if (cp == '\n' || cp == '\t' || cp == '\r')
      snprintf(esc, sizeof esc, "\\%c", cp == '\n' ? 'n' : cp == '\t' ? 't' : 'r');
    else if (cp < 0x80)
      snprintf(esc, sizeof esc, "\\x%02x", cp);
    else
      snprintf(esc, sizeof esc, "\\u%04x", cp);
    plen = piece == esc ? strlen(esc) : k;
    if (!full && w + plen < cap) {
      memcpy(dst + w, piece, plen);
      w += plen;
    } else
      full = 1;
    out += plen;
    base = piece != esc ? dspk__utf8_base(s + i, k) : false;
    i += k;
  }
  if (cap)
    dst[w] = '\0';
  return out;
}

const char *dspk__sub_esc(const char *s) {
  static char bufs[8][1024];
  static unsigned next;
  char *b = bufs[next++ % 8];
  dspk__sub_escape(b, sizeof bufs[0], s, DSPK__SUB_ESC_TEXT);
  return b;
}

void dspk__sub_put(FILE *f, const char *s, enum dspk__sub_esc_style st) {
  char small[1024], *b = small;
  size_t n = dspk__sub_escape(small, sizeof small, s, st);
  if (n >= sizeof small && (b = malloc(n + 1)) != NULL)
    dspk__sub_escape(b, n + 1, s, st);
  fputs(b ? b : small, f); /* out of memory: the escaped text, cut */
  if (b != small)
    free(b);
}

void dspk__sub_json_strn(FILE *f, const char *s, size_t n) {
  size_t i = 0;
  fputc('"', f);
  while (i < n) {
    const unsigned char c = (unsigned char)s[i];
    size_t k = dspk__utf8_seq(s + i, n - i);
    if (k == 0) {
      fputs("\\ufffd", f); /* a byte that starts no character */
      k = 1;
    } else if (c == '"' || c == '\\') {
      fprintf(f, "\\%c", c);
    } else if (k == 1 && (c < 0x20 || c == 0x7f)) {
      fprintf(f, "\\u%04x", c);
    } else if (k == 2 && c == 0xC2 && (unsigned char)s[i + 1] < 0xA0) {
      fprintf(f, "\\u%04x", (unsigned char)s[i + 1]); /* C1 */
    } else {
      fwrite(s + i, 1, k, f);
    }
    i += k;
  }
  fputc('"', f);
}

void dspk__sub_json_str(FILE *f, const char *s) {
  dspk__sub_json_strn(f, s ? s : "", s ? strlen(s) : 0);
}

const char *dspk__sub_arg_n(const char *s, size_t n) {
  static char bufs[8][1024];
  static unsigned next;
  char *b = bufs[next++ % 8];
  return dspk__utf8_visible(b, sizeof bufs[0], s ? s : "", s ? n : 0);
}

const char *dspk__sub_arg(const char *s) { return dspk__sub_arg_n(s, s ? strlen(s) : 0); }
