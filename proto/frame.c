/*
 * The frame scanner of proto/frame.h: walks one msgpack object in a byte
 * buffer without allocating and without recursion, and decides whether it is
 * complete, still incomplete, or must be refused.  msgpack-c sizes its
 * allocations from the counts it reads, so nothing reaches msgpack_unpack()
 * before this scanner accepted it.
 *
 * The walk keeps a small fixed stack: for each open array/map, how many
 * objects it still owes.  Bounds are checked the moment a header is read,
 * before the bytes it announces have arrived, so that a 5-byte header
 * claiming 10^8 elements is refused at once instead of being waited for:
 *  - every object takes at least one byte, so the objects still owed (in all
 *    open containers) can never exceed the bytes that may still follow in
 *    this message (max_message - position);
 *  - str/bin payloads must fit in what remains of max_message;
 *  - declared plus scanned objects must stay within max_objects;
 *  - containers may not nest deeper than max_depth (clamped to
 *    DSPK__SCAN_DEPTH_MAX, the size of the stack);
 *  - an object still incomplete when len already exceeds max_message, or a
 *    complete one longer than max_message, is refused.
 * When the whole message is in the buffer these bounds are the tight ones of
 * the remaining bytes; before it is, the scanner answers "incomplete" (0) and
 * the caller reads more, never more than max_message in total.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <stdarg.h>
#include <stdio.h>

#include <msgpack.h>
#include <msgpack/unpack_define.h> /* MSGPACK_EMBED_STACK_SIZE */

#include "dspk/errors.h"
#include "proto/frame.h"
#include "proto/utf8.h"

_Static_assert(DSPK__SCAN_DEPTH_MAX <= MSGPACK_EMBED_STACK_SIZE,
               "the scanner must not accept what msgpack_unpack() cannot decode");

void dspk__limits_default(struct dspk__limits *l) {
  l->max_message = (size_t)256 << 20;
  l->max_depth = 16;
  l->max_objects = 65536;
  l->max_rank = 8;
  l->max_elements = (uint64_t)1 << 31;
}


/* Big-endian read of n (1, 2, 4 or 8) bytes. */
static uint64_t be(const unsigned char *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

/* dspk__frame_scan(), and when it answers 0 the least length the frame can
 * have (*need, > len): what the headers read so far announce (a str/bin
 * payload's length, one byte per object still owed), or len + 1. */
static ssize_t scan(const void *buf, size_t len, const struct dspk__limits *lim,
                    char *msg, size_t msglen, uint64_t *need) {
  const unsigned char *p = buf;
  uint64_t stack[DSPK__SCAN_DEPTH_MAX]; /* objects still owed per level */
  unsigned depth = 0;
  unsigned max_depth = lim->max_depth < DSPK__SCAN_DEPTH_MAX
                           ? lim->max_depth : DSPK__SCAN_DEPTH_MAX;
  size_t maxmsg = lim->max_message;
  size_t pos = 0;
  uint64_t owed = 0;    /* sum of stack[] */
  uint64_t objects = 0; /* objects started so far */

  if (maxmsg > (size_t)SSIZE_MAX)
    maxmsg = (size_t)SSIZE_MAX;

  for (;;) {
    /* One object starts at pos.  It is taken off its parent's count now, so
     * owed is what must still follow once this object is complete. */
    if (pos >= len) {
      /* This object (still in owed: it is taken off below) and the rest. */
      *need = pos + (owed ? owed : 1);
      goto incomplete;
    }
    unsigned char c = p[pos];
    size_t hdr = 1;       /* header bytes including c */
    uint64_t payload = 0; /* raw bytes following the header */
    uint64_t children = 0;
    int container = 0;    /* 1 array, 2 map */
    unsigned lenbytes = 0;

    if (depth > 0) {
      stack[depth - 1]--;
      owed--;
    }
    objects++;
    if (objects > lim->max_objects)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "message has more than %zu objects (max_objects)",
                  lim->max_objects);

    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
      /* fixint, nil, bool */
    } else if (c <= 0x8f) {
      container = 2, children = c & 0x0f;
    } else if (c <= 0x9f) {
      container = 1, children = c & 0x0f;
    } else if (c <= 0xbf) {
      payload = c & 0x1f;
    } else {
      switch (c) {
      case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
        lenbytes = 1u << (c - 0xc4);
        break;
      case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
        lenbytes = 1u << (c - 0xd9);
        break;
      case 0xca: payload = 4; break;
      case 0xcb: payload = 8; break;
      case 0xcc: case 0xcd: case 0xce: case 0xcf:
        payload = 1u << (c - 0xcc);
        break;
      case 0xd0: case 0xd1: case 0xd2: case 0xd3:
        payload = 1u << (c - 0xd0);
        break;
      case 0xdc: case 0xdd:
        container = 1, lenbytes = c == 0xdc ? 2 : 4;
        break;
      case 0xde: case 0xdf:
        container = 2, lenbytes = c == 0xde ? 2 : 4;
        break;
      case 0xc1:
        return dspk__fail(msg, msglen, DSPK_EPROTO,
                    "byte 0xc1 (never used in msgpack) at offset %zu", pos);
      default: { /* 0xc7-0xc9 ext 8/16/32, 0xd4-0xd8 fixext 1-16 */
        /* Refused at once, before its type byte (which follows the
         * format byte of a fixext, and the length of an ext 8/16/32) has
         * perhaps arrived: the message names the type when it has. */
        size_t at = pos + 1 + (c <= 0xc9 ? (1u << (c - 0xc7)) : 0);
        if (at < len)
          return dspk__fail(msg, msglen, DSPK_EPROTO,
                      "msgpack ext (format byte 0x%02x, ext type %d) at "
                      "offset %zu: the protocol uses no ext types",
                      c, (int)(signed char)p[at], pos);
        return dspk__fail(msg, msglen, DSPK_EPROTO,
                    "msgpack ext (format byte 0x%02x) at offset %zu: the "
                    "protocol uses no ext types", c, pos);
      }
      }
    }

    if (lenbytes) {
      hdr += lenbytes;
      if (len - pos < hdr) {
        *need = pos + hdr + owed;
        goto incomplete;
      }
      uint64_t n = be(p + pos + 1, lenbytes);
      if (container)
        children = n;
      else
        payload = n;
    }
    if (container == 2)
      children *= 2; /* n <= 2^32-1, so no overflow */

    /* Everything announced so far must fit in what max_message leaves:
     * this object's payload or children, and the objects its enclosing
     * containers still owe after it (each at least one byte). */
    if (pos + hdr > maxmsg)
      goto toolong;
    uint64_t room = maxmsg - pos - hdr;
    /* What is refused is the message, not the str/bin or container: the
     * texts say how long the message would at least be (room < maxmsg,
     * so the sums cannot overflow). */
    if (payload + owed > room)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "str/bin of %" PRIu64 " byte%s at offset %zu makes the "
                  "message at least %" PRIu64 " bytes, more than %zu "
                  "(max_message)", payload, payload == 1 ? "" : "s", pos,
                  (uint64_t)(pos + hdr) + payload + owed, maxmsg);
    if (children + owed > room)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "container at offset %zu announces %" PRIu64
                  " element%s, which make%s the message at least %" PRIu64
                  " bytes, more than %zu (max_message)", pos, children, dspk__s(children),
                  children == 1 ? "s" : "", (uint64_t)(pos + hdr) + children + owed, maxmsg);
    if (children + owed + objects > lim->max_objects)
      return dspk__fail(msg, msglen, DSPK_ELIMIT,
                  "%s at offset %zu announces %" PRIu64 " object%s%s, which make%s the "
                  "message at least %" PRIu64 " objects, more than %zu (max_objects)",
                  container == 2 ? "map" : "array", pos, children, dspk__s(children),
                  container == 2 ? " (two per entry)" : "", children == 1 ? "s" : "",
                  children + owed + objects,
                  lim->max_objects);

    if (container) {
      if (depth + 1 > max_depth)
        return dspk__fail(msg, msglen, DSPK_ELIMIT,
                    "nesting deeper than %u at offset %zu (max_depth)",
                    max_depth, pos);
      pos += hdr;
      if (children) {
        stack[depth++] = children;
        owed += children;
        continue; /* the next object is its first element */
      }
    } else {
      if (len - pos < hdr || len - pos - hdr < payload) {
        *need = pos + hdr + payload + owed;
        goto incomplete;
      }
      pos += hdr + (size_t)payload;
    }

    /* The object that started this iteration is complete: close every
     * container that has no element left. */
    while (depth > 0 && stack[depth - 1] == 0)
      depth--;
    if (depth == 0)
      return (ssize_t)pos;
  }

incomplete:
  if (len > maxmsg)
    goto toolong;
  if (*need <= len)
    *need = (uint64_t)len + 1;
  return 0;
toolong:
  return dspk__fail(msg, msglen, DSPK_ELIMIT,
              "message longer than %zu bytes (max_message)", maxmsg);
}

ssize_t dspk__frame_scan(const void *buf, size_t len,
                         const struct dspk__limits *lim, char *msg,
                         size_t msglen) {
  uint64_t need = 0;
  return scan(buf, len, lim, msg, msglen, &need);
}

uint64_t dspk__frame_need(const void *buf, size_t len, const struct dspk__limits *lim) {
  char msg[160];
  uint64_t need = 0;
  ssize_t n = scan(buf, len, lim, msg, sizeof msg, &need);
  return n == 0 ? need : n > 0 ? (uint64_t)n : len;
}

/* ---- the head of a buffer.write (dspk__write_head_scan) ------------------ */

/* A cursor over the head: each reader takes one object's header or returns
 * false (not there yet, or not the expected form). */
struct cur {
  const unsigned char *p;
  size_t len, pos;
};

static bool cur_uint(struct cur *c, uint64_t *v) {
  unsigned n;
  if (c->pos >= c->len)
    return false;
  unsigned char b = c->p[c->pos];
  if (b <= 0x7f) {
    *v = b;
    c->pos++;
    return true;
  }
  if (b < 0xcc || b > 0xcf)
    return false;
  n = 1u << (b - 0xcc);
  if (c->len - c->pos < 1 + (size_t)n)
    return false;
  *v = be(c->p + c->pos + 1, n);
  c->pos += 1 + n;
  return true;
}

/* A header of the kind given: str (payload length), array or map (count). */
enum hkind { H_STR, H_BIN, H_ARRAY, H_MAP };

static bool cur_head(struct cur *c, enum hkind k, uint64_t *n) {
  unsigned lb = 0;
  if (c->pos >= c->len)
    return false;
  unsigned char b = c->p[c->pos];
  switch (k) {
  case H_STR:
    if (b >= 0xa0 && b <= 0xbf) {
      *n = b & 0x1f;
      c->pos++;
      return true;
    }
    if (b >= 0xd9 && b <= 0xdb)
      lb = 1u << (b - 0xd9);
    break;
  case H_BIN:
    if (b >= 0xc4 && b <= 0xc6)
      lb = 1u << (b - 0xc4);
    break;
  case H_ARRAY:
  case H_MAP:
    if (b >= (k == H_ARRAY ? 0x90 : 0x80) && b <= (k == H_ARRAY ? 0x9f : 0x8f)) {
      *n = b & 0x0f;
      c->pos++;
      return true;
    }
    if (b == (k == H_ARRAY ? 0xdc : 0xde))
      lb = 2;
    break;
  }
  if (!lb || c->len - c->pos < 1 + (size_t)lb)
    return false;
  *n = be(c->p + c->pos + 1, lb);
  c->pos += 1 + lb;
  return true;
}

/* A str equal to s. */
static bool cur_str_is(struct cur *c, const char *s, size_t slen) {
  uint64_t n;
  size_t at = c->pos;
  if (!cur_head(c, H_STR, &n) || n != slen || c->len - c->pos < slen ||
      memcmp(c->p + c->pos, s, slen) != 0) {
    c->pos = at;
    return false;
  }
  c->pos += slen;
  return true;
}

int dspk__write_head_scan(const void *buf, size_t len, const struct dspk__limits *lim,
                          struct dspk__write_head *h) {
  static const char method[] = "buffer.write";
  struct cur c = {buf, len, 0};
  uint64_t n, type, msgid, v, entries;
  bool have_buffer = false, have_offset = false;
  char msg[8];

  if (!cur_head(&c, H_ARRAY, &n) || n != 4 || !cur_uint(&c, &type) || type != 0 ||
      !cur_uint(&c, &msgid) || msgid > UINT32_MAX ||
      !cur_str_is(&c, method, sizeof method - 1) || !cur_head(&c, H_ARRAY, &n) || n != 1 ||
      !cur_head(&c, H_MAP, &entries) || entries < 2 || entries > 3)
    return 0;
  h->msgid = (uint32_t)msgid;
  h->offset = 0;
  for (uint64_t i = 0; i + 1 < entries; i++) {
    if (!have_buffer && cur_str_is(&c, "buffer", 6)) {
      if (!cur_uint(&c, &h->buffer))
        return 0;
      have_buffer = true;
    } else if (!have_offset && cur_str_is(&c, "offset", 6)) {
      if (!cur_uint(&c, &h->offset))
        return 0;
      have_offset = true;
    } else {
      return 0;
    }
  }
  if (!have_buffer || !cur_str_is(&c, "data", 4))
    return 0;
  h->bin_at = c.pos;
  if (!cur_head(&c, H_BIN, &v))
    return 0;
  h->head = c.pos;
  h->len = (size_t)v;
  /* The scanner's verdict on the head (limits: max_message, max_depth,
   * max_objects): an incomplete frame, not a refused one. */
  if (dspk__frame_scan(buf, c.pos, lim, msg, sizeof msg) != 0)
    return 0;
  return 1;
}

int dspk__write_head_find(const void *buf, size_t len, const struct dspk__limits *lim,
                          struct dspk__write_head *h) {
  static const char method[] = "buffer.write";
  struct cur c = {buf, len, 0};
  uint64_t n, type, msgid, v, entries;
  char msg[8];

  if (!cur_head(&c, H_ARRAY, &n) || n != 4 || !cur_uint(&c, &type) || type != 0 ||
      !cur_uint(&c, &msgid) || msgid > UINT32_MAX ||
      !cur_str_is(&c, method, sizeof method - 1) || !cur_head(&c, H_ARRAY, &n) || n != 1 ||
      !cur_head(&c, H_MAP, &entries) || entries < 1)
    return 0;
  /* Each key and value before the last key: one whole object, whatever
   * it is (the scanner's length of it, which is within lim when the
   * frame is). */
  for (uint64_t i = 0; i + 1 < entries; i++) {
    if (cur_str_is(&c, "data", 4))
      return 0;
    for (int kv = 0; kv < 2; kv++) {
      ssize_t m = dspk__frame_scan(c.p + c.pos, c.len - c.pos, lim, msg, sizeof msg);
      if (m <= 0)
        return 0;
      c.pos += (size_t)m;
    }
  }
  if (!cur_str_is(&c, "data", 4))
    return 0;
  h->bin_at = c.pos;
  if (!cur_head(&c, H_BIN, &v))
    return 0;
  h->msgid = (uint32_t)msgid;
  h->buffer = 0;
  h->offset = 0;
  h->head = c.pos;
  h->len = (size_t)v;
  if (dspk__frame_scan(buf, c.pos, lim, msg, sizeof msg) != 0)
    return 0;
  return 1;
}

/* ---- the head of a task.run answer (dspk__run_head_scan) ----------------- */

int dspk__run_head_scan(const void *buf, size_t len, const struct dspk__limits *lim,
                        struct dspk__run_head *h) {
  struct cur c = {buf, len, 0};
  uint64_t n, type, msgid, entries, nout, v;
  size_t at;
  char msg[8];

  if (!cur_head(&c, H_ARRAY, &n) || n != 4 || !cur_uint(&c, &type) || type != 1 ||
      !cur_uint(&c, &msgid) || msgid > UINT32_MAX || c.pos >= len || c.p[c.pos] != 0xc0)
    return 0;
  c.pos++; /* nil: no error */
  if (!cur_head(&c, H_MAP, &entries) || entries < 2 || !cur_str_is(&c, "device", 6) ||
      !cur_head(&c, H_STR, &n) || c.len - c.pos < n)
    return 0;
  c.pos += (size_t)n;
  if (!cur_str_is(&c, "outputs", 7) || !cur_head(&c, H_ARRAY, &nout) || nout < 1 ||
      !cur_head(&c, H_MAP, &entries) || entries != 3 || !cur_str_is(&c, "dtype", 5) ||
      !cur_head(&c, H_STR, &n) || c.len - c.pos < n)
    return 0;
  c.pos += (size_t)n;
  if (!cur_str_is(&c, "shape", 5) || !cur_head(&c, H_ARRAY, &n) || n > lim->max_rank)
    return 0;
  for (uint64_t i = 0; i < n; i++)
    if (!cur_uint(&c, &v))
      return 0;
  if (!cur_str_is(&c, "data", 4))
    return 0;
  at = c.pos;
  if (!cur_head(&c, H_BIN, &v))
    return 0;
  h->msgid = (uint32_t)msgid;
  h->head = c.pos;
  h->len = (size_t)v;
  h->len_at = at + 1;
  /* As for a buffer.write head: the scanner's verdict on the bytes so far,
   * payload size against max_message included. */
  if (dspk__frame_scan(buf, c.pos, lim, msg, sizeof msg) != 0)
    return 0;
  return 1;
}
