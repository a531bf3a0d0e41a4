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

struct jbuf {
  char *p;
  size_t len, cap;
  int err;
};

static void jput(struct jbuf *j, const char *s, size_t n) {
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

static void jputs(struct jbuf *j, const char *s) { jput(j, s, strlen(s)); }

static void jstr(struct jbuf *j, const char *s, size_t n) {
  jput(j, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[8];
    switch (ch) {
    case '"': jput(j, "\\\"", 2); break;
    case '\\': jput(j, "\\\\", 2); break;
    case '\n': jput(j, "\\n", 2); break;
    case '\r': jput(j, "\\r", 2); break;
    case '\t': jput(j, "\\t", 2); break;
    default:
      if (ch < 0x20) {
        snprintf(esc, sizeof esc, "\\u%04x", ch);
        jput(j, esc, 6);
      } else {
        jput(j, (const char *)&s[i], 1);
      }
    }
  }
  jput(j, "\"", 1);
}

static void jbase64(struct jbuf *j, const unsigned char *p, size_t n) {
  static const char tab[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char q[4];
  jput(j, "\"", 1);
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
    jput(j, q, 4);
  }
  jput(j, "\"", 1);
}

static void jval(struct jbuf *j, const msgpack_object *o) {
  char num[64];

  switch (o->type) {
  case MSGPACK_OBJECT_NIL: jputs(j, "null"); break;
  case MSGPACK_OBJECT_BOOLEAN: jputs(j, o->via.boolean ? "true" : "false");
    break;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    snprintf(num, sizeof num, "%" PRIu64, o->via.u64);
    jputs(j, num);
    break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    snprintf(num, sizeof num, "%" PRId64, o->via.i64);
    jputs(j, num);
    break;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    if (isfinite(o->via.f64)) {
      snprintf(num, sizeof num, "%.17g", o->via.f64);
      jputs(j, num);
    } else {
      jputs(j, "null");
    }
    break;
  case MSGPACK_OBJECT_STR: jstr(j, o->via.str.ptr, o->via.str.size); break;
  case MSGPACK_OBJECT_BIN:
    jbase64(j, (const unsigned char *)o->via.bin.ptr, o->via.bin.size);
    break;
  case MSGPACK_OBJECT_ARRAY:
    jput(j, "[", 1);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      if (i)
        jput(j, ",", 1);
      jval(j, &o->via.array.ptr[i]);
    }
    jput(j, "]", 1);
    break;
  case MSGPACK_OBJECT_MAP:
    jput(j, "{", 1);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      if (i)
        jput(j, ",", 1);
      if (kv->key.type == MSGPACK_OBJECT_STR) {
        jstr(j, kv->key.via.str.ptr, kv->key.via.str.size);
      } else {
        struct jbuf k = {0};
        jval(&k, &kv->key);
        if (k.err)
          j->err = k.err;
        jstr(j, k.p ? k.p : "", k.len);
        free(k.p);
      }
      jput(j, ":", 1);
      jval(j, &kv->val);
    }
    jput(j, "}", 1);
    break;
  default: /* ext: never accepted by the scanner */
    jputs(j, "null");
  }
}

int dspk__to_json(const msgpack_object *o, char **out) {
  struct jbuf j = {0};
  if (o)
    jval(&j, o);
  else
    jputs(&j, "null");
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
    memcpy(buf, o->via.str.ptr, n);
  }
  buf[n] = '\0';
}
