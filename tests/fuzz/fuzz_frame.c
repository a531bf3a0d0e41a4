/*
 * The frame scanner (proto/frame.c) against msgpack-c: the first four input
 * bytes pick the limits, the rest is the byte stream.  Oracles: a frame the
 * scanner accepts (n > 0) is exactly one object that msgpack-c unpacks in
 * n bytes, within max_depth and max_objects; no proper prefix of it is
 * complete; the scanner never claims more bytes than it was given.  And
 * dspk__write_head_scan: a head it finds is an incomplete frame to the
 * scanner, and once its data is all there the scanner's frame ends with the
 * data and msgpack-c decodes the same msgid, buffer, offset and data length.
 * dspk__write_head_find: its head with the bin emptied is a whole request.
 * dspk__run_head_scan likewise: its head is incomplete to the scanner, and in
 * the complete frame msgpack-c finds the first output's data where it said.
 */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "dspk/errors.h"
#include "proto/frame.h"
#include "tests/fuzz/fuzz_common.h"

/* Depth (top level is 1) and object count of an unpacked tree. */
static void measure(const msgpack_object *o, unsigned depth, unsigned *maxd,
                    size_t *count) {
  (*count)++;
  if (o->type == MSGPACK_OBJECT_ARRAY || o->type == MSGPACK_OBJECT_MAP) {
    if (depth > *maxd)
      *maxd = depth;
  }
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++)
      measure(&o->via.array.ptr[i], depth + 1, maxd, count);
  } else if (o->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      measure(&o->via.map.ptr[i].key, depth + 1, maxd, count);
      measure(&o->via.map.ptr[i].val, depth + 1, maxd, count);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct dspk__limits lim;
  char msg[128];
  ssize_t n;

  dspk__limits_default(&lim);
  /* Small limits so that every bound is reachable with short inputs. */
  lim.max_message = 16 + fuzz_take(&data, &size, 2) % 8192;
  lim.max_depth = 1 + (unsigned)fuzz_take(&data, &size, 1) % 70;
  lim.max_objects = 1 + fuzz_take(&data, &size, 1) * 16;

  n = dspk__frame_scan(data, size, &lim, msg, sizeof msg);
  FUZZ_CHECK(n == 0 || n == DSPK_EPROTO || n == DSPK_ELIMIT || n > 0);
  {
    struct dspk__write_head h;
    if (dspk__write_head_scan(data, size, &lim, &h)) {
      FUZZ_CHECK(h.head <= size && h.len > 0);
      FUZZ_CHECK(dspk__frame_scan(data, h.head, &lim, msg, sizeof msg) == 0);
      if (size >= h.head + h.len) {
        msgpack_zone zone;
        msgpack_object root;
        const msgpack_object *p;
        size_t off = 0;
        int seen = 0;
        FUZZ_CHECK(n == (ssize_t)(h.head + h.len));
        FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
        FUZZ_CHECK(msgpack_unpack((const char *)data, (size_t)n, &off, &zone, &root) ==
                   MSGPACK_UNPACK_SUCCESS);
        FUZZ_CHECK(h.msgid == root.via.array.ptr[1].via.u64);
        p = &root.via.array.ptr[3].via.array.ptr[0];
        FUZZ_CHECK(p->type == MSGPACK_OBJECT_MAP);
        for (uint32_t i = 0; i < p->via.map.size; i++) {
          const msgpack_object *k = &p->via.map.ptr[i].key, *v = &p->via.map.ptr[i].val;
          if (k->via.str.size == 6 && memcmp(k->via.str.ptr, "buffer", 6) == 0) {
            FUZZ_CHECK(v->via.u64 == h.buffer);
            seen |= 1;
          } else if (k->via.str.size == 6 && memcmp(k->via.str.ptr, "offset", 6) == 0) {
            FUZZ_CHECK(v->via.u64 == h.offset);
          } else {
            FUZZ_CHECK(v->type == MSGPACK_OBJECT_BIN && v->via.bin.size == h.len &&
                       i + 1 == p->via.map.size);
          }
        }
        FUZZ_CHECK(seen == 1);
        msgpack_zone_destroy(&zone);
      }
    }
  }
  {
    /* dspk__write_head_find: the head is a prefix the scanner takes as
     * incomplete, a bin header at bin_at, and with that bin emptied it is a
     * whole request msgpack-c decodes, a map of params whose last value is
     * that empty bin. */
    struct dspk__write_head h;
    if (dspk__write_head_find(data, size, &lim, &h)) {
      FUZZ_CHECK(h.bin_at < h.head && h.head <= size && h.head - h.bin_at <= 5);
      FUZZ_CHECK(data[h.bin_at] >= 0xc4 && data[h.bin_at] <= 0xc6);
      FUZZ_CHECK(dspk__frame_scan(data, h.head, &lim, msg, sizeof msg) == 0);
      {
        char *f = malloc(h.bin_at + 2);
        msgpack_zone zone;
        msgpack_object root;
        const msgpack_object *p;
        size_t off = 0;
        FUZZ_CHECK(f != NULL);
        memcpy(f, data, h.bin_at);
        f[h.bin_at] = (char)0xc4;
        f[h.bin_at + 1] = 0;
        FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
        FUZZ_CHECK(msgpack_unpack(f, h.bin_at + 2, &off, &zone, &root) ==
                       MSGPACK_UNPACK_SUCCESS &&
                   off == h.bin_at + 2);
        FUZZ_CHECK(h.msgid == root.via.array.ptr[1].via.u64);
        p = &root.via.array.ptr[3].via.array.ptr[0];
        FUZZ_CHECK(p->type == MSGPACK_OBJECT_MAP && p->via.map.size >= 1);
        p = &p->via.map.ptr[p->via.map.size - 1].val;
        FUZZ_CHECK(p->type == MSGPACK_OBJECT_BIN && p->via.bin.size == 0);
        msgpack_zone_destroy(&zone);
        free(f);
      }
    }
  }
  {
    /* dspk__run_head_scan: the head is a prefix the scanner takes as
     * incomplete, its bin's length field says len, and when the frame is
     * complete msgpack-c finds that bin as the first output's data. */
    struct dspk__run_head h;
    if (dspk__run_head_scan(data, size, &lim, &h)) {
      uint64_t v = 0;
      FUZZ_CHECK(h.len_at < h.head && h.head <= size && h.head - h.len_at <= 4);
      for (size_t k = h.len_at; k < h.head; k++)
        v = v << 8 | data[k];
      FUZZ_CHECK(v == h.len);
      FUZZ_CHECK(dspk__frame_scan(data, h.head, &lim, msg, sizeof msg) == 0);
      if (n > 0) {
        msgpack_zone zone;
        msgpack_object root;
        const msgpack_object *p;
        size_t off = 0;
        /* (the bin may end the frame: nothing after it is required) */
        FUZZ_CHECK((size_t)n >= h.head + h.len);
        FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
        FUZZ_CHECK(msgpack_unpack((const char *)data, (size_t)n, &off, &zone, &root) ==
                   MSGPACK_UNPACK_SUCCESS);
        FUZZ_CHECK(h.msgid == root.via.array.ptr[1].via.u64);
        p = &root.via.array.ptr[3].via.map.ptr[1].val.via.array.ptr[0].via.map.ptr[2].val;
        /* (an empty bin's pointer is msgpack-c's to choose) */
        FUZZ_CHECK(p->type == MSGPACK_OBJECT_BIN && p->via.bin.size == h.len &&
                   (h.len == 0 || (const uint8_t *)p->via.bin.ptr == data + h.head));
        msgpack_zone_destroy(&zone);
      }
    }
  }
  if (n == 0)
    FUZZ_CHECK(size <= lim.max_message);
  if (n <= 0)
    return 0;
  FUZZ_CHECK((size_t)n <= size && (size_t)n <= lim.max_message);

  /* The same frame alone scans to the same length; its prefixes are
   * incomplete or refused, never complete. */
  FUZZ_CHECK(dspk__frame_scan(data, (size_t)n, &lim, msg, sizeof msg) == n);
  FUZZ_CHECK(dspk__frame_scan(data, (size_t)n - 1, &lim, msg, sizeof msg) <= 0);

  {
    msgpack_zone zone;
    msgpack_object root;
    size_t off = 0;
    unsigned maxd = 0;
    size_t count = 0;
    unsigned depth_lim = lim.max_depth < 64 ? lim.max_depth : 64;

    FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
    FUZZ_CHECK(msgpack_unpack((const char *)data, (size_t)n, &off, &zone, &root) ==
               MSGPACK_UNPACK_SUCCESS);
    FUZZ_CHECK(off == (size_t)n);
    measure(&root, 1, &maxd, &count);
    FUZZ_CHECK(maxd <= depth_lim);
    FUZZ_CHECK(count <= lim.max_objects);
    msgpack_zone_destroy(&zone);
  }
  return 0;
}
