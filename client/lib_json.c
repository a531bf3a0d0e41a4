/*
 * msgpack-to-JSON conversion for libdspkclient's JSON results (status,
 * devices, dspk_call_json).  JSON has no binary type, so bin values become
 * base64 strings; non-finite floats become null; map keys that are not
 * strings are written as their JSON text inside a string.  Recursion depth
 * is bounded by the frame scanner's max_depth.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/lib_internal.h"
#include "proto/dtype.h"
#include "proto/utf8.h"

void dspk__jput(struct dspk__jbuf *j, const char *s, size_t n) {
  if (j->err)
    return;
  if (j->cap - j->len < n + 1) {
    size_t cap = j->cap ? j->cap : 256;
    while (cap - j->len < n + 1)
      cap *= 2;
    char *p = realloc(j->p, cap);
    if (!p) {
      j->err = DSPK_ENOMEM;
      return;
    }
    j->p = p;
    j->cap = cap;
  }
  memcpy(j->p + j->len, s, n);
  j->len += n;
  j->p[j->len] = '\0';
}

void dspk__jputs(struct dspk__jbuf *j, const char *s) { dspk__jput(j, s, strlen(s)); }

/* One JSON string: '"' and '\\' escaped as \" and \\, every control
 * character (C0, DEL and C1: U+0000..U+001F, U+007F..U+009F; TAB, LF and
 * CR too, never the short \t \n \r) as \u00NN, as dspk.h says and as
 * dspk-submit's JSON writes them, so that the text can reach a terminal
 * and a line-oriented filter sees one form, and a byte that starts no
 * well-formed UTF-8 character as \ufffd, so that it stays valid JSON
 * (RFC 8259: UTF-8). */
void dspk__jstr(struct dspk__jbuf *j, const char *s, size_t n) {
  dspk__jput(j, "\"", 1);
  for (size_t i = 0; i < n;) {
    unsigned char ch = (unsigned char)s[i];
    char esc[8];
    size_t k = ch < 0x80 ? 1 : dspk__utf8_seq(s + i, n - i);
    unsigned cp = ch < 0x80 ? ch : k == 2 && ch == 0xC2 ? (unsigned char)s[i + 1] : 0x100;
    switch (cp) {
    case '"': dspk__jput(j, "\\\"", 2); break;
    case '\\': dspk__jput(j, "\\\\", 2); break;
    default:
      if (k == 0) {
        dspk__jput(j, "\\ufffd", 6);
        k = 1;
      } else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) {
        snprintf(esc, sizeof esc, "\\u%04x", cp);
        dspk__jput(j, esc, 6);
      } else {
        dspk__jput(j, s + i, k);
      }
    }
    i += k;
  }
  dspk__jput(j, "\"", 1);
}

static void jbase64(struct dspk__jbuf *j, const unsigned char *p, size_t n) {
  static const char tab[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char q[4];
  dspk__jput(j, "\"", 1);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n)
      v |= p[i + 2];
    q[0] = tab[(v >> 18) & 63];
    q[1] = tab[(v >> 12) & 63];
    q[2] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
    q[3] = i + 2 < n ? tab[v & 63] : '=';
    dspk__jput(j, q, 4);
  }
  dspk__jput(j, "\"", 1);
}

static void jval(struct dspk__jbuf *j, const msgpack_object *o) {
  char num[64];

  switch (o->type) {
  case MSGPACK_OBJECT_NIL: dspk__jputs(j, "null"); break;
  case MSGPACK_OBJECT_BOOLEAN: dspk__jputs(j, o->via.boolean ? "true" : "false");
    break;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    snprintf(num, sizeof num, "%" PRIu64, o->via.u64);
    dspk__jputs(j, num);
    break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    snprintf(num, sizeof num, "%" PRId64, o->via.i64);
    dspk__jputs(j, num);
    break;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    if (isfinite(o->via.f64)) {
      /* The one float rule (proto/dtype.h): the fewest significant digits
       * that read back as the value (a float32 as a float32), not %.17g's
       * "0.10000000000000001"; ".0" after an integral value keeps it a
       * float in the reader's JSON. */
      dspk__float_str(num, sizeof num, o->via.f64, o->type == MSGPACK_OBJECT_FLOAT32);
      dspk__jputs(j, num);
    } else {
      dspk__jputs(j, "null");
    }
    break;
  case MSGPACK_OBJECT_STR: dspk__jstr(j, o->via.str.ptr, o->via.str.size); break;
  case MSGPACK_OBJECT_BIN:
    jbase64(j, (const unsigned char *)o->via.bin.ptr, o->via.bin.size);
    break;
  case MSGPACK_OBJECT_ARRAY:
    dspk__jput(j, "[", 1);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      if (i)
        dspk__jput(j, ",", 1);
      jval(j, &o->via.array.ptr[i]);
    }
    dspk__jput(j, "]", 1);
    break;
  case MSGPACK_OBJECT_MAP:
    dspk__jput(j, "{", 1);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      if (i)
        dspk__jput(j, ",", 1);
      if (kv->key.type == MSGPACK_OBJECT_STR) {
        dspk__jstr(j, kv->key.via.str.ptr, kv->key.via.str.size);
      } else {
        struct dspk__jbuf k = {0};
        jval(&k, &kv->key);
        if (k.err)
          j->err = k.err;
        dspk__jstr(j, k.p ? k.p : "", k.len);
        free(k.p);
      }
      dspk__jput(j, ":", 1);
      jval(j, &kv->val);
    }
    dspk__jput(j, "}", 1);
    break;
  default: /* ext: never accepted by the scanner */
    dspk__jputs(j, "null");
  }
}

int dspk__to_json(const msgpack_object *o, char **out) {
  struct dspk__jbuf j = {0};
  if (o)
    jval(&j, o);
  else
    dspk__jputs(&j, "null");
  if (j.err) {
    free(j.p);
    return j.err;
  }
  *out = j.p;
  return 0;
}

void dspk__strncpy_obj(const msgpack_object *o, char *buf, size_t buflen) {
  size_t n = 0;
  if (!buflen)
    return;
  if (o && o->type == MSGPACK_OBJECT_STR) {
    n = dspk__utf8_cut(o->via.str.ptr, o->via.str.size, buflen - 1);
    if (n) /* an empty str's pointer may be NULL */
      memcpy(buf, o->via.str.ptr, n);
  }
  buf[n] = '\0';
}
