/* The raw-kernel source check (srccheck.h). */
#include "backends/common/srccheck.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspk/errors.h"
#include "proto/utf8.h"

/* One logical character stream: splices (backslash-newline, and with
 * trigraphs ??/-newline) removed, ??= read as '#' when trigraphs are on;
 * line numbers of the physical source kept for messages. */
struct lex {
  const char *s;
  size_t n, i;
  unsigned line;
  bool tri, splices;
};

/* Skips splices at the current position. */
static void splice(struct lex *L) {
  while (L->splices) {
    size_t i = L->i, k = 0;
    if (i < L->n && L->s[i] == '\\')
      k = 1;
    else if (L->tri && i + 2 < L->n && L->s[i] == '?' && L->s[i + 1] == '?' &&
             L->s[i + 2] == '/')
      k = 3;
    if (!k)
      return;
    if (i + k < L->n && L->s[i + k] == '\n')
      L->i = i + k + 1;
    else if (i + k + 1 < L->n && L->s[i + k] == '\r' && L->s[i + k + 1] == '\n')
      L->i = i + k + 2;
    else
      return;
    L->line++;
  }
}

/* The current logical character (-1 at the end) and its width in bytes. */
static int peek(struct lex *L, size_t *w) {
  splice(L);
  if (L->i >= L->n)
    return -1;
  if (L->tri && L->i + 2 < L->n && L->s[L->i] == '?' && L->s[L->i + 1] == '?') {
    static const char from[] = "=/'()!<>-", to[] = "#\\^[]|{}~";
    const char *p = strchr(from, L->s[L->i + 2]);
    if (p && *p) {
      *w = 3;
      return (unsigned char)to[p - from];
    }
  }
  *w = 1;
  return (unsigned char)L->s[L->i];
}

static int next(struct lex *L) {
  size_t w;
  int c = peek(L, &w);
  if (c < 0)
    return c;
  L->i += w;
  if (c == '\n')
    L->line++;
  return c;
}

static int look(struct lex *L) {
  size_t w;
  return peek(L, &w);
}

/* Skips a comment when one starts here (after its first '/', already
 * read); returns true when it did. */
static bool comment(struct lex *L) {
  int c = look(L);
  if (c == '/') {
    while ((c = look(L)) >= 0 && c != '\n')
      next(L);
    return true;
  }
  if (c == '*') {
    int prev = 0;
    next(L);
    while ((c = next(L)) >= 0 && !(prev == '*' && c == '/'))
      prev = c;
    return true;
  }
  return false;
}

/* Skips spaces, tabs and comments, not newlines. */
static void blanks(struct lex *L) {
  for (;;) {
    int c = look(L);
    if (c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r') {
      next(L);
      continue;
    }
    if (c == '/') {
      struct lex save = *L;
      next(L);
      if (comment(L))
        continue;
      *L = save;
    }
    return;
  }
}

static bool ident_start(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' || c >= 0x80;
}

static bool ident_char(int c) { return ident_start(c) || (c >= '0' && c <= '9'); }

/* Reads an identifier (its first character already read as c). */
static void ident(struct lex *L, int c, char *buf, size_t cap) {
  size_t k = 0;
  for (;;) {
    if (k + 1 < cap)
      buf[k++] = (char)c;
    if (!ident_char(look(L)))
      break;
    c = next(L);
  }
  buf[k] = 0;
}

/* Skips a string or character literal whose quote q was read. */
static void literal(struct lex *L, int q) {
  int c;
  while ((c = look(L)) >= 0 && c != '\n') {
    next(L);
    if (c == '\\')
      next(L);
    else if (c == q)
      return;
  }
}

/* Skips a raw string R"delim( ... )delim" whose quote was read (CUDA). */
static void raw_string(struct lex *L) {
  char delim[20];
  size_t k = 0, end;
  while (L->i < L->n && L->s[L->i] != '(' && k < 16)
    delim[k++] = L->s[L->i++];
  if (L->i >= L->n || L->s[L->i] != '(') {
    literal(L, '"');
    return;
  }
  L->i++;
  for (end = L->i; end < L->n; end++) {
    if (L->s[end] == '\n')
      L->line++;
    if (L->s[end] == ')' && end + 1 + k < L->n &&
        memcmp(L->s + end + 1, delim, k) == 0 && L->s[end + 1 + k] == '"') {
      L->i = end + k + 2;
      return;
    }
  }
  L->i = L->n;
}

static bool in(const char *w, const char *const *list) {
  for (; *list; list++)
    if (strcmp(w, *list) == 0)
      return true;
  return false;
}

/* Directives that open a file, in any language. */
static const char *const opening[] = {"include", "include_next", "import", "embed", NULL};
/* Identifiers that open a file or run a pragma from a string. */
static const char *const opening_ids[] = {"__has_include", "__has_include_next", "__has_embed",
                                          "_Pragma", NULL};
/* CUDA pragmas that are let through: none names a file. */
static const char *const cuda_pragmas[] = {
    "unroll",         "nounroll",         "once",          "pack",
    "push_macro",     "pop_macro",        "nv_diag_suppress", "nv_diag_warning",
    "nv_diag_error",  "nv_diag_default",  "nv_diag_once",  "diag_suppress",
    "diag_warning",   "diag_error",       "diag_default",  NULL};

/* One pass; 0, or the refused thing written to what and its line. */
static int scan(const char *src, size_t len, enum dspk__src_lang lang, bool tri, bool splices,
                char *what, size_t wcap, unsigned *line) {
  struct lex L = {.s = src, .n = len, .line = 1, .tri = tri, .splices = splices};
  bool line_start = true;
  char w[40];
  int c;

  while ((c = next(&L)) >= 0) {
    unsigned at = L.line;
    if (c == '\n') {
      line_start = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r')
      continue;
    if (c == '/' && comment(&L))
      continue;
    if (c == '#' || (c == '%' && look(&L) == ':')) {
      if (c == '%')
        next(&L);
      /* Any '#' followed by a file-opening name is refused, at the start
       * of a line or not (a stray one is never valid code anyway). */
      blanks(&L);
      if (look(&L) == '\\') {
        snprintf(what, wcap, "'#' followed by a backslash");
        *line = at;
        return DSPK_ECOMPILE;
      }
      if (ident_start(c = look(&L))) {
        next(&L);
        ident(&L, c, w, sizeof w);
        if (in(w, opening)) {
          snprintf(what, wcap, "#%s", w);
          *line = at;
          return DSPK_ECOMPILE;
        }
        if (line_start && lang == DSPK__SRC_CUDA && strcmp(w, "pragma") == 0) {
          char p[40] = "";
          blanks(&L);
          if (ident_start(c = look(&L))) {
            next(&L);
            ident(&L, c, p, sizeof p);
          }
          if (!in(p, cuda_pragmas)) {
            snprintf(what, wcap, "#pragma %s", p);
            *line = at;
            return DSPK_ECOMPILE;
          }
        }
      }
      line_start = false;
      continue;
    }
    line_start = false;
    /* GLSL has no string or character literals: quotes are not skipped
     * over, so nothing can hide behind one. */
    if (lang == DSPK__SRC_CUDA && (c == '"' || c == '\'')) {
      literal(&L, c);
      continue;
    }
    /* A universal character name could spell a directive's name or an
     * identifier above; never needed outside literals in a kernel. */
    if (c == '\\' && (look(&L) == 'u' || look(&L) == 'U')) {
      snprintf(what, wcap, "a universal character name outside a literal");
      *line = at;
      return DSPK_ECOMPILE;
    }
    if (ident_start(c)) {
      ident(&L, c, w, sizeof w);
      if (in(w, opening_ids)) {
        snprintf(what, wcap, "%s", w);
        *line = at;
        return DSPK_ECOMPILE;
      }
      /* A raw string literal: R, LR, uR, UR, u8R right before '"'. */
      if (lang == DSPK__SRC_CUDA && look(&L) == '"' &&
          (strcmp(w, "R") == 0 || strcmp(w, "LR") == 0 || strcmp(w, "uR") == 0 ||
           strcmp(w, "UR") == 0 || strcmp(w, "u8R") == 0)) {
        next(&L);
        raw_string(&L);
      }
      continue;
    }
  }
  return 0;
}

int dspk__src_check(const char *src, size_t len, enum dspk__src_lang lang, const char *name,
                    char *msg, size_t msglen) {
  char what[64];
  unsigned line = 0;
  /* Every reading a compiler might make: C++ always splices lines and may
   * or may not read trigraphs; glslang splices only from GLSL 4.20 on (and
   * in a comment only there), so GLSL is read both ways. */
  int rc = scan(src, len, lang, false, true, what, sizeof what, &line);
  if (!rc)
    rc = lang == DSPK__SRC_CUDA ? scan(src, len, lang, true, true, what, sizeof what, &line)
                                : scan(src, len, lang, false, false, what, sizeof what, &line);
  if (rc && msg && msglen)
    dspk__format(msg, msglen,
                 "%s:%u: %s is refused: raw kernels cannot read files (put what the "
                 "file holds into the kernel's source)",
                 name, line, what);
  return rc;
}
