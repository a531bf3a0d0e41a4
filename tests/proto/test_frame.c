/*
 * Unit tests of the frame scanner (proto/frame.c): complete frames are
 * measured exactly, every prefix of a valid frame is "incomplete", every
 * named limit holds exactly at its bound and fails one past it, malformed
 * bytes are refused, the huge-header case is refused without waiting, and
 * a deterministic mutation loop checks that the scanner never reads past
 * len (each input sits in its own exact-size heap block, so ASan catches an
 * over-read) and that whatever it accepts msgpack-c unpacks to exactly that
 * length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/frame.h"

/* ---- helpers ------------------------------------------------------------ */

static struct dspk__limits deflim(void) {
  struct dspk__limits l;
  dspk__limits_default(&l);
  return l;
}

/* Scans a copy of buf[0..len) in an exact-size block. */
static ssize_t scan(const void *buf, size_t len, const struct dspk__limits *l) {
  char msg[256];
  void *p = malloc(len ? len : 1);
  ssize_t n;
  assert_non_null(p);
  if (len)
    memcpy(p, buf, len);
  msg[0] = '\0';
  n = dspk__frame_scan(p, len, l, msg, sizeof msg);
  if (n < 0)
    assert_true(msg[0] != '\0'); /* a refusal always says why */
  free(p);
  return n;
}

/* Unpacks buf[0..n) with msgpack-c and checks that it consumes exactly n. */
static void assert_unpacks_to(const char *buf, size_t n) {
  msgpack_unpacked up;
  size_t off = 0;
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, buf, n, &off),
                   MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(off, n);
  msgpack_unpacked_destroy(&up);
}

/* A request frame like the ones a client sends: nested maps, strings, a bin,
 * floats, negative ints, booleans and nil. */
static void build_request(msgpack_sbuffer *sb, size_t binlen) {
  msgpack_packer pk;
  char *data = malloc(binlen ? binlen : 1);
  for (size_t i = 0; i < binlen; i++)
    data[i] = (char)(i * 7);
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  dspk__pack_request_head(&pk, 42, "task.run", true);
  msgpack_pack_map(&pk, 4);
  dspk__pack_str(&pk, "op");
  dspk__pack_str(&pk, "gemm");
  dspk__pack_str(&pk, "inputs");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 3);
  int64_t shape[2] = {2, 3};
  dspk__pack_tensor_meta(&pk, DSPK_F32, 2, shape);
  dspk__pack_str(&pk, "data");
  msgpack_pack_bin(&pk, binlen);
  msgpack_pack_bin_body(&pk, data, binlen);
  dspk__pack_str(&pk, "options");
  msgpack_pack_map(&pk, 4);
  dspk__pack_str(&pk, "alpha");
  msgpack_pack_double(&pk, 1.5);
  dspk__pack_str(&pk, "beta");
  msgpack_pack_float(&pk, -0.25f);
  dspk__pack_str(&pk, "trans_a");
  msgpack_pack_true(&pk);
  dspk__pack_str(&pk, "x");
  msgpack_pack_array(&pk, 5);
  msgpack_pack_int64(&pk, -70000);
  msgpack_pack_int8(&pk, -3);
  msgpack_pack_uint64(&pk, UINT64_MAX);
  msgpack_pack_nil(&pk);
  msgpack_pack_false(&pk);
  dspk__pack_str(&pk, "device");
  dspk__pack_str(&pk, "cpu:0");
  free(data);
}

/* n nested arrays: [[[...[]...]]] */
static size_t nested(unsigned char *buf, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    buf[i] = i + 1 < n ? 0x91 : 0x90;
  return n;
}

/* ---- complete and incomplete frames ------------------------------------- */

static void test_complete_frames(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  size_t sizes[] = {0, 1, 31, 32, 255, 256, 65535, 65536, 100000};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    msgpack_sbuffer sb;
    build_request(&sb, sizes[k]);
    assert_int_equal(scan(sb.data, sb.size, &l), (ssize_t)sb.size);
    assert_unpacks_to(sb.data, sb.size);
    /* Trailing bytes (the next frame) are not part of this one. */
    char *two = malloc(2 * sb.size);
    memcpy(two, sb.data, sb.size);
    memcpy(two + sb.size, sb.data, sb.size);
    assert_int_equal(scan(two, 2 * sb.size, &l), (ssize_t)sb.size);
    free(two);
    msgpack_sbuffer_destroy(&sb);
  }
}

static void test_every_prefix_incomplete(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  msgpack_sbuffer sb;
  build_request(&sb, 300);
  for (size_t k = 0; k < sb.size; k++)
    assert_int_equal(scan(sb.data, k, &l), 0);
  msgpack_sbuffer_destroy(&sb);

  /* Every scalar encoding, cut at every point. */
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_uint8(&pk, 200);
  msgpack_pack_uint16(&pk, 60000);
  msgpack_pack_uint32(&pk, 4000000000u);
  msgpack_pack_uint64(&pk, UINT64_MAX);
  msgpack_pack_int8(&pk, -100);
  msgpack_pack_int16(&pk, -30000);
  msgpack_pack_int32(&pk, -2000000000);
  msgpack_pack_int64(&pk, INT64_MIN);
  msgpack_pack_float(&pk, 1.0f);
  msgpack_pack_double(&pk, 2.0);
  size_t pos = 0;
  while (pos < sb.size) {
    ssize_t n = scan(sb.data + pos, sb.size - pos, &l);
    assert_true(n > 0);
    for (ssize_t k = 0; k < n; k++)
      assert_int_equal(scan(sb.data + pos, (size_t)k, &l), 0);
    pos += (size_t)n;
  }
  msgpack_sbuffer_destroy(&sb);
}

/* dspk__frame_need: a lower bound of the frame's size, more than what is
 * there, exact once the header of a trailing bin has come. */
static void test_need(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  msgpack_sbuffer sb;
  build_request(&sb, 300);
  for (size_t k = 0; k < sb.size; k++) {
    uint64_t need = dspk__frame_need(sb.data, k, &l);
    assert_true(need > k);
    assert_true(need <= sb.size);
  }
  assert_int_equal(dspk__frame_need(sb.data, sb.size, &l), sb.size);
  msgpack_sbuffer_destroy(&sb);

  /* [0, 1, "ping", [{"data": bin}]]: the bin ends the frame. */
  msgpack_packer pk;
  size_t binlen = 200000;
  char *data = calloc(1, binlen);
  assert_non_null(data);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  dspk__pack_request_head(&pk, 1, "ping", true);
  msgpack_pack_map(&pk, 1);
  dspk__pack_str(&pk, "data");
  msgpack_pack_bin(&pk, binlen);
  msgpack_pack_bin_body(&pk, data, binlen);
  free(data);
  size_t head = sb.size - binlen;
  for (size_t k = head; k < sb.size; k += 9999)
    assert_int_equal(dspk__frame_need(sb.data, k, &l), sb.size);
  assert_int_equal(dspk__frame_need(sb.data, sb.size - 1, &l), sb.size);
  /* Before the bin's length has come: its header; before its first byte,
   * one byte for it. */
  assert_int_equal(dspk__frame_need(sb.data, head - 4, &l), head);
  assert_int_equal(dspk__frame_need(sb.data, head - 5, &l), head - 4);
  assert_int_equal(dspk__frame_need(sb.data, 0, &l), 1);
  /* A refused frame: its length as given. */
  unsigned char bad[3] = {0x93, 0xc1, 0x00};
  assert_int_equal(dspk__frame_need(bad, 3, &l), 3);
  msgpack_sbuffer_destroy(&sb);
}

static void test_all_header_forms(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  /* str8/16/32, bin8/16/32, array16/32, map16/32 with tiny contents. */
  const unsigned char f[][16] = {
      {0xd9, 0x01, 'a'},
      {0xda, 0x00, 0x01, 'a'},
      {0xdb, 0x00, 0x00, 0x00, 0x01, 'a'},
      {0xc4, 0x01, 0x00},
      {0xc5, 0x00, 0x01, 0x00},
      {0xc6, 0x00, 0x00, 0x00, 0x01, 0x00},
      {0xdc, 0x00, 0x01, 0xc0},
      {0xdd, 0x00, 0x00, 0x00, 0x01, 0xc0},
      {0xde, 0x00, 0x01, 0xa1, 'k', 0xc3},
      {0xdf, 0x00, 0x00, 0x00, 0x01, 0xa1, 'k', 0xc2},
  };
  const size_t len[] = {3, 4, 6, 3, 4, 6, 4, 6, 6, 8};
  for (size_t i = 0; i < sizeof len / sizeof len[0]; i++) {
    assert_int_equal(scan(f[i], len[i], &l), (ssize_t)len[i]);
    assert_unpacks_to((const char *)f[i], len[i]);
    for (size_t k = 0; k < len[i]; k++)
      assert_int_equal(scan(f[i], k, &l), 0);
  }
}

/* ---- limits ------------------------------------------------------------- */

static void test_max_message(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  msgpack_sbuffer sb;
  build_request(&sb, 1000);
  l.max_message = sb.size;
  assert_int_equal(scan(sb.data, sb.size, &l), (ssize_t)sb.size);
  l.max_message = sb.size - 1;
  assert_int_equal(scan(sb.data, sb.size, &l), DSPK_ELIMIT);
  /* A bin that cannot fit is refused from its header on, before its bytes
   * arrive; one that could still fit is waited for. */
  size_t h = 0;
  while (memcmp(sb.data + h, "\xc5\x03\xe8", 3) != 0) /* bin16 of 1000 */
    h++;
  h += 3;
  l.max_message = h + 999;
  assert_int_equal(scan(sb.data, h, &l), DSPK_ELIMIT);
  l.max_message = h + 1000 + (sb.size - h - 1000) - 1;
  assert_int_equal(scan(sb.data, h, &l), 0);
  assert_int_equal(scan(sb.data, sb.size, &l), DSPK_ELIMIT);
  msgpack_sbuffer_destroy(&sb);

  /* An object still open when the stream already holds more bytes than
   * max_message is refused, whatever it would announce later. */
  const unsigned char cut[] = {0x91, 0xdd, 0x00};
  l.max_message = 3;
  assert_int_equal(scan(cut, 3, &l), 0);
  l.max_message = 2;
  assert_int_equal(scan(cut, 3, &l), DSPK_ELIMIT);
  /* Counts beyond what max_message leaves are refused at the header. */
  unsigned char big[33];
  big[0] = 0xdc; /* array16 of 30 nils */
  big[1] = 0;
  big[2] = 30;
  memset(big + 3, 0xc0, sizeof big - 3);
  l.max_message = 33;
  assert_int_equal(scan(big, 33, &l), 33);
  l.max_message = 32;
  assert_int_equal(scan(big, 33, &l), DSPK_ELIMIT);
  assert_int_equal(scan(big, 3, &l), DSPK_ELIMIT);
}

static void test_max_depth(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  unsigned char buf[200];
  for (unsigned d = 1; d <= 20; d++) {
    size_t n = nested(buf, d);
    l.max_depth = d;
    assert_int_equal(scan(buf, n, &l), (ssize_t)n);
    assert_unpacks_to((const char *)buf, n);
    l.max_depth = d - 1;
    assert_int_equal(scan(buf, n, &l), DSPK_ELIMIT);
  }
  /* Default depth 16: 16 ok, 17 refused. */
  l = deflim();
  assert_int_equal(scan(buf, nested(buf, 16), &l), 16);
  assert_int_equal(scan(buf, nested(buf, 17), &l), DSPK_ELIMIT);
  /* Refused as soon as the 17th header is seen, incomplete or not. */
  memset(buf, 0x91, 17);
  assert_int_equal(scan(buf, 17, &l), DSPK_ELIMIT);
  assert_int_equal(scan(buf, 16, &l), 0);
  /* Maps count too: {0: {0: ... {0: nil}}}, 16 levels then 17. */
  for (int i = 0; i < 17; i++) {
    buf[2 * i] = 0x81;
    buf[2 * i + 1] = 0x00;
  }
  buf[34] = 0xc0;
  assert_int_equal(scan(buf, 35, &l), DSPK_ELIMIT);
  buf[32] = 0xc0;
  assert_int_equal(scan(buf, 33, &l), 33);
  /* A configured depth above what msgpack-c decodes (32 levels) is
   * clamped: every frame the scanner accepts unpacks (a 33-deep frame once
   * passed and failed in msgpack_unpack as "out of memory"). */
  l.max_depth = 100000;
  assert_int_equal(scan(buf, nested(buf, 32), &l), 32);
  assert_unpacks_to((const char *)buf, 32);
  assert_int_equal(scan(buf, nested(buf, 33), &l), DSPK_ELIMIT);
  l.max_depth = 64;
  assert_int_equal(scan(buf, nested(buf, 33), &l), DSPK_ELIMIT);
  /* Deep but bounded: 10000 nested arrays are refused at 17. */
  unsigned char *deep = malloc(10000);
  l = deflim();
  assert_int_equal(scan(deep, nested(deep, 10000), &l), DSPK_ELIMIT);
  free(deep);
}

static void test_max_objects(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  unsigned char buf[3 + 100];
  buf[0] = 0xdc;
  buf[1] = 0;
  buf[2] = 100;
  memset(buf + 3, 0x01, 100);
  l.max_objects = 101; /* the array and its 100 elements */
  assert_int_equal(scan(buf, sizeof buf, &l), (ssize_t)sizeof buf);
  l.max_objects = 100;
  assert_int_equal(scan(buf, sizeof buf, &l), DSPK_ELIMIT);
  assert_int_equal(scan(buf, 3, &l), DSPK_ELIMIT); /* from the header on */
  /* The message counts what the limit counts: objects. */
  char msg[256];
  assert_int_equal(dspk__frame_scan(buf, 3, &l, msg, sizeof msg), DSPK_ELIMIT);
  assert_string_equal(msg, "array at offset 0 announces 100 objects, which make the message "
                           "at least 101 objects, more than 100 (max_objects)");
  const unsigned char m3[] = {0x91, 0x83};
  l.max_objects = 6;
  assert_int_equal(dspk__frame_scan(m3, sizeof m3, &l, msg, sizeof msg), DSPK_ELIMIT);
  assert_string_equal(msg, "map at offset 1 announces 6 objects (two per entry), which make "
                           "the message at least 8 objects, more than 6 (max_objects)");
  l.max_objects = 100;
  /* Scalars only count once seen: [1, [2, 3]] is 5 objects. */
  const unsigned char nest[] = {0x92, 0x01, 0x92, 0x02, 0x03};
  l.max_objects = 5;
  assert_int_equal(scan(nest, sizeof nest, &l), 5);
  l.max_objects = 4;
  assert_int_equal(scan(nest, sizeof nest, &l), DSPK_ELIMIT);
  /* A map entry is two objects. */
  const unsigned char map[] = {0x82, 0x01, 0x02, 0x03, 0x04};
  l.max_objects = 5;
  assert_int_equal(scan(map, sizeof map, &l), 5);
  l.max_objects = 4;
  assert_int_equal(scan(map, sizeof map, &l), DSPK_ELIMIT);
  /* A lone scalar is one object. */
  l.max_objects = 1;
  assert_int_equal(scan("\x05", 1, &l), 1);
  l.max_objects = 0;
  assert_int_equal(scan("\x05", 1, &l), DSPK_ELIMIT);
}

static void test_counts_bounded_by_remaining(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  unsigned char buf[3 + 2 * 50];
  /* array16 of 50: needs >= 50 more bytes. */
  buf[0] = 0xdc;
  buf[1] = 0;
  buf[2] = 50;
  memset(buf + 3, 0xc0, 100);
  l.max_message = 53;
  assert_int_equal(scan(buf, 53, &l), 53);
  l.max_message = 52;
  assert_int_equal(scan(buf, 3, &l), DSPK_ELIMIT);
  /* map16 of 50: needs >= 100 more bytes. */
  buf[0] = 0xde;
  l.max_message = 103;
  assert_int_equal(scan(buf, 103, &l), 103);
  l.max_message = 102;
  assert_int_equal(scan(buf, 3, &l), DSPK_ELIMIT);
  /* Siblings still owed count: [[x,x,x], nil] with room for only the
   * inner array's elements and not the trailing nil. */
  const unsigned char sib[] = {0x92, 0x93, 0xc0, 0xc0, 0xc0, 0xc0};
  l.max_message = 6;
  assert_int_equal(scan(sib, 6, &l), 6);
  l.max_message = 5;
  assert_int_equal(scan(sib, 2, &l), DSPK_ELIMIT);
  /* str/bin lengths: bin8 of 10 at the bound and one past. */
  unsigned char bin[12] = {0xc4, 10};
  l.max_message = 12;
  assert_int_equal(scan(bin, 12, &l), 12);
  assert_int_equal(scan(bin, 2, &l), 0);
  l.max_message = 11;
  assert_int_equal(scan(bin, 2, &l), DSPK_ELIMIT);
  unsigned char str[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
  l = deflim();
  assert_int_equal(scan(str, sizeof str, &l), DSPK_ELIMIT); /* 4 GiB str */
}

static void test_huge_header(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  /* array32 claiming 10^8 elements. */
  const unsigned char h[] = {0xdd, 0x05, 0xf5, 0xe1, 0x00};
  /* Default limits: 10^8 > max_objects, refused at once. */
  assert_int_equal(scan(h, sizeof h, &l), DSPK_ELIMIT);
  /* With room in every limit it is merely incomplete (nothing allocated:
   * the scanner has no allocator to call). */
  l.max_objects = (size_t)1 << 30;
  assert_int_equal(scan(h, sizeof h, &l), 0);
  /* With max_message smaller than the elements need, refused. */
  l.max_message = 1 << 20;
  assert_int_equal(scan(h, sizeof h, &l), DSPK_ELIMIT);
  /* Same for map32 (two objects per entry) and array32 inside a request. */
  const unsigned char m[] = {0xdf, 0x7f, 0xff, 0xff, 0xff};
  l = deflim();
  assert_int_equal(scan(m, sizeof m, &l), DSPK_ELIMIT);
  const unsigned char r[] = {0x94, 0x00, 0x01, 0xa1, 'x',
                             0xdd, 0x05, 0xf5, 0xe1, 0x00};
  assert_int_equal(scan(r, sizeof r, &l), DSPK_ELIMIT);
}

/* ---- malformed ---------------------------------------------------------- */

static void test_malformed(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  const unsigned char c1[] = {0xc1};
  assert_int_equal(scan(c1, 1, &l), DSPK_EPROTO);
  const unsigned char c1n[] = {0x93, 0x01, 0x02, 0xc1};
  assert_int_equal(scan(c1n, sizeof c1n, &l), DSPK_EPROTO);
  assert_int_equal(scan(c1n, 3, &l), 0); /* not seen yet */
  /* Every ext form, alone and nested. */
  const unsigned char ext[] = {0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8};
  for (size_t i = 0; i < sizeof ext; i++) {
    unsigned char b[24] = {0};
    b[0] = ext[i];
    assert_int_equal(scan(b, sizeof b, &l), DSPK_EPROTO);
    assert_int_equal(scan(b, 1, &l), DSPK_EPROTO);
    b[0] = 0x91;
    b[1] = ext[i];
    assert_int_equal(scan(b, sizeof b, &l), DSPK_EPROTO);
  }
  /* Empty input is incomplete, not an error. */
  assert_int_equal(scan("", 0, &l), 0);
}

/* The refusal texts say what was wrong: an ext by its format byte and, once
 * it has arrived, its type (not the format byte called a type); a str/bin
 * that fits max_message but makes the message too long by what it reaches,
 * not as if it exceeded the limit by itself. */
static void test_refusal_texts(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  char msg[256];
  const unsigned char fix1[] = {0xd4, 0x05, 0x00};
  assert_int_equal(dspk__frame_scan(fix1, sizeof fix1, &l, msg, sizeof msg),
                   DSPK_EPROTO);
  assert_non_null(strstr(msg, "format byte 0xd4, ext type 5)"));
  assert_null(strstr(msg, "type 0xd4"));
  assert_int_equal(dspk__frame_scan(fix1, 1, &l, msg, sizeof msg), DSPK_EPROTO);
  assert_non_null(strstr(msg, "(format byte 0xd4)"));
  const unsigned char ext8[] = {0x91, 0xc7, 0x01, 0xff, 0x00};
  assert_int_equal(dspk__frame_scan(ext8, sizeof ext8, &l, msg, sizeof msg),
                   DSPK_EPROTO);
  assert_non_null(strstr(msg, "format byte 0xc7, ext type -1) at offset 1"));
  const unsigned char ext32[] = {0xc9, 0, 0, 0, 1, 0x07, 0x00};
  assert_int_equal(dspk__frame_scan(ext32, sizeof ext32, &l, msg, sizeof msg),
                   DSPK_EPROTO);
  assert_non_null(strstr(msg, "format byte 0xc9, ext type 7)"));
  assert_int_equal(dspk__frame_scan(ext32, 5, &l, msg, sizeof msg), DSPK_EPROTO);
  assert_non_null(strstr(msg, "(format byte 0xc9)"));
  /* [bin8 of 10] is a 13-byte message, max_message 12: the bin (10 bytes)
   * is within the limit, the message it makes is not. */
  unsigned char bin[13] = {0x91, 0xc4, 10};
  l.max_message = 12;
  assert_int_equal(dspk__frame_scan(bin, 3, &l, msg, sizeof msg), DSPK_ELIMIT);
  assert_non_null(strstr(msg, "str/bin of 10 bytes at offset 1 makes the "
                              "message at least 13 bytes, more than 12 "
                              "(max_message)"));
  const unsigned char arr16[] = {0x92, 0xdc, 0x00, 0x0a};
  assert_int_equal(dspk__frame_scan(arr16, sizeof arr16, &l, msg, sizeof msg),
                   DSPK_ELIMIT);
  assert_non_null(strstr(msg, "announces 10 elements, which make the message "
                              "at least 15 bytes, more than 12 (max_message)"));
  /* One element: its noun singular (probe 16 A#4's class). */
  const unsigned char arr1[] = {0x92, 0xdc, 0x00, 0x01};
  l.max_message = 5;
  assert_int_equal(dspk__frame_scan(arr1, sizeof arr1, &l, msg, sizeof msg), DSPK_ELIMIT);
  assert_non_null(strstr(msg, "announces 1 element, which makes the message "
                              "at least 6 bytes, more than 5 (max_message)"));
}

/* ---- random valid objects and mutations --------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static void gen(msgpack_packer *pk, int depth) {
  unsigned k = (unsigned)(rnd() % (depth < 6 ? 10 : 7));
  char s[300];
  size_t n;
  switch (k) {
  case 0: msgpack_pack_nil(pk); break;
  case 1: msgpack_pack_int64(pk, (int64_t)rnd() >> (rnd() % 64)); break;
  case 2: msgpack_pack_uint64(pk, rnd() >> (rnd() % 64)); break;
  case 3: msgpack_pack_double(pk, (double)(rnd() % 1000) / 7.0); break;
  case 4: msgpack_pack_float(pk, (float)(rnd() % 1000) / 3.0f); break;
  case 5:
    n = rnd() % sizeof s;
    memset(s, 'a' + (int)(rnd() % 26), n);
    msgpack_pack_str_with_body(pk, s, n);
    break;
  case 6:
    n = rnd() % sizeof s;
    memset(s, (int)rnd(), n);
    msgpack_pack_bin_with_body(pk, s, n);
    break;
  case 7: case 8:
    n = rnd() % 20;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
      gen(pk, depth + 1);
    break;
  default:
    n = rnd() % 10;
    msgpack_pack_map(pk, n);
    for (size_t i = 0; i < 2 * n; i++)
      gen(pk, depth + 1);
  }
}

static void test_random_valid(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  rng_state = 12345;
  for (int it = 0; it < 300; it++) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    gen(&pk, 0);
    assert_int_equal(scan(sb.data, sb.size, &l), (ssize_t)sb.size);
    assert_unpacks_to(sb.data, sb.size);
    assert_int_equal(scan(sb.data, sb.size - 1, &l), 0);
    msgpack_sbuffer_destroy(&sb);
  }
}

static void test_mutations(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  char msg[256];
  unsigned accepted = 0, refused = 0, incomplete = 0;
  rng_state = 777;
  for (int it = 0; it < 10000; it++) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (it % 2)
      gen(&pk, 0);
    else
      build_request(&sb, rnd() % 64);
    size_t len = sb.size;
    char *buf = malloc(len + 4 * 16);
    memcpy(buf, sb.data, len);
    /* Mutate: flip bytes, overwrite with header bytes, cut or extend. */
    unsigned nmut = 1 + (unsigned)(rnd() % 4);
    for (unsigned m = 0; m < nmut && len; m++) {
      size_t at = rnd() % len;
      static const unsigned char hot[] = {0xc1, 0xc4, 0xc5, 0xc6, 0xd9, 0xda,
                                          0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xff,
                                          0x9f, 0x8f, 0xbf, 0xc7, 0xd4, 0x00};
      switch (rnd() % 4) {
      case 0: buf[at] = (char)rnd(); break;
      case 1: buf[at] = (char)hot[rnd() % sizeof hot]; break;
      case 2: len = at; break;
      default: {
        size_t extra = rnd() % 16;
        for (size_t e = 0; e < extra; e++)
          buf[len + e] = (char)rnd();
        len += extra;
      }
      }
    }
    /* Exact-size copy: an over-read is an ASan error. */
    char *exact = malloc(len ? len : 1);
    memcpy(exact, buf, len);
    ssize_t n = dspk__frame_scan(exact, len, &l, msg, sizeof msg);
    if (n > 0) {
      assert_true((size_t)n <= len);
      assert_unpacks_to(exact, (size_t)n);
      accepted++;
    } else if (n == 0) {
      incomplete++;
    } else {
      assert_true(n == DSPK_EPROTO || n == DSPK_ELIMIT);
      refused++;
    }
    free(exact);
    free(buf);
    msgpack_sbuffer_destroy(&sb);
  }
  /* The loop exercised all three outcomes. */
  assert_true(accepted > 100);
  assert_true(refused > 100);
  assert_true(incomplete > 100);
}

/* ---- the head of a buffer.write (dspk__write_head_scan) ------------------ */

/* A buffer.write frame as libdspkclient packs it (keys in schema order),
 * with a payload of binlen bytes; offset < 0: no offset key. */
static void build_write(msgpack_sbuffer *sb, uint32_t msgid, uint64_t buffer,
                        int64_t offset, size_t binlen) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  dspk__pack_request_head(&pk, msgid, "buffer.write", true);
  msgpack_pack_map(&pk, offset < 0 ? 2 : 3);
  dspk__pack_str(&pk, "buffer");
  msgpack_pack_uint64(&pk, buffer);
  if (offset >= 0) {
    dspk__pack_str(&pk, "offset");
    msgpack_pack_uint64(&pk, (uint64_t)offset);
  }
  dspk__pack_str(&pk, "data");
  msgpack_pack_bin(&pk, binlen);
  for (size_t i = 0; i < binlen; i++)
    msgpack_pack_bin_body(&pk, (const char[]){(char)(i * 13)}, 1);
}

/* Runs a head scanner (dspk__write_head_scan or _find) on a copy of
 * buf[0..len) of exactly that size: ASan sees an over-read. */
static int head_run(int (*scan)(const void *, size_t, const struct dspk__limits *,
                                struct dspk__write_head *),
                    const void *buf, size_t len, const struct dspk__limits *l,
                    struct dspk__write_head *h) {
  void *p = malloc(len ? len : 1);
  int r;
  assert_non_null(p);
  if (len)
    memcpy(p, buf, len);
  r = scan(p, len, l, h);
  free(p);
  return r;
}

static int head_scan(const void *buf, size_t len, const struct dspk__limits *l,
                     struct dspk__write_head *h) {
  return head_run(dspk__write_head_scan, buf, len, l, h);
}

static void test_write_head(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  static const size_t lens[] = {1, 31, 256, 65536, 100000};
  static const uint64_t ids[] = {0, 127, 128, 65536, UINT64_MAX};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    for (int withoff = 0; withoff < 2; withoff++) {
      msgpack_sbuffer sb;
      struct dspk__write_head h;
      uint64_t id = ids[i];
      int64_t off = withoff ? (int64_t)(i * 70001) : -1;
      build_write(&sb, (uint32_t)(i * 99991), id, off, lens[i]);
      /* The head is recognised once it is whole, up to the payload, and
       * the payload ends the frame. */
      assert_int_equal(head_scan(sb.data, sb.size - lens[i], &l, &h), 1);
      assert_int_equal(h.msgid, (uint32_t)(i * 99991));
      assert_true(h.buffer == id);
      assert_true(h.offset == (withoff ? (uint64_t)off : 0));
      assert_int_equal(h.len, lens[i]);
      assert_int_equal(h.head + h.len, sb.size);
      assert_int_equal(scan(sb.data, sb.size, &l), (ssize_t)sb.size);
      /* Any prefix of it: not yet. */
      for (size_t k = 0; k < h.head; k++)
        assert_int_equal(head_scan(sb.data, k, &l, &h), 0);
      msgpack_sbuffer_destroy(&sb);
    }
  }
}

static void test_write_head_other_forms(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  struct dspk__write_head h;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  /* Other methods and messages, data not last, a repeated or unknown key,
   * nil, signed ints, a notification: the ordinary path. */
  for (int form = 0; form < 8; form++) {
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (form == 7) {
      msgpack_pack_array(&pk, 3);
      msgpack_pack_uint8(&pk, 2);
      dspk__pack_str(&pk, "buffer.write");
      msgpack_pack_array(&pk, 1);
    } else {
      dspk__pack_request_head(&pk, 7, form == 0 ? "buffer.read" : "buffer.write", true);
    }
    msgpack_pack_map(&pk, 3);
    if (form == 1) { /* data first */
      dspk__pack_str(&pk, "data");
      msgpack_pack_bin(&pk, 4);
      msgpack_pack_bin_body(&pk, "abcd", 4);
    }
    dspk__pack_str(&pk, form == 2 ? "offset" : "buffer");
    if (form == 3)
      msgpack_pack_nil(&pk);
    else if (form == 4)
      msgpack_pack_int8(&pk, -1);
    else
      msgpack_pack_uint8(&pk, 1);
    dspk__pack_str(&pk, form == 5 ? "buffer" : form == 6 ? "offsets" : "offset");
    msgpack_pack_uint8(&pk, 3);
    if (form != 1) {
      dspk__pack_str(&pk, "data");
      msgpack_pack_bin(&pk, 4);
      msgpack_pack_bin_body(&pk, "abcd", 4);
    }
    assert_int_equal(head_scan(sb.data, sb.size, &l, &h), 0);
    msgpack_sbuffer_destroy(&sb);
  }
  /* A payload beyond max_message: refused by the scanner, so not a head. */
  build_write(&sb, 1, 2, 3, 1000);
  assert_int_equal(head_scan(sb.data, sb.size - 1000, &l, &h), 1);
  l.max_message = sb.size - 1;
  assert_int_equal(head_scan(sb.data, sb.size - 1000, &l, &h), 0);
  l = deflim();
  l.max_depth = 1;
  assert_int_equal(head_scan(sb.data, sb.size - 1000, &l, &h), 0);
  msgpack_sbuffer_destroy(&sb);
}

/* dspk__write_head_find: every head of a buffer.write whose data, a bin,
 * is the params map's last key, whatever comes before it; bin_at and head
 * as the frame has them.  Emptying its bin leaves a whole request. */
static int head_find(const void *buf, size_t len, const struct dspk__limits *l,
                     struct dspk__write_head *h) {
  return head_run(dspk__write_head_find, buf, len, l, h);
}

static void test_write_head_find(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  struct dspk__write_head h;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  /* The forms dspk__write_head_scan takes: found the same. */
  build_write(&sb, 77, 5, 9, 300);
  assert_int_equal(head_find(sb.data, sb.size - 300, &l, &h), 1);
  assert_int_equal(h.msgid, 77);
  assert_int_equal(h.len, 300);
  assert_int_equal(h.head + h.len, sb.size);
  assert_int_equal(h.bin_at + 3, h.head); /* bin 16 */
  assert_int_equal((unsigned char)sb.data[h.bin_at], 0xc5);
  for (size_t k = 0; k < h.head; k++)
    assert_int_equal(head_find(sb.data, k, &l, &h), 0);
  msgpack_sbuffer_destroy(&sb);
  /* Any entries before data: nil, a negative, a float, a str, nested
   * containers, unknown and non-str keys, no buffer at all. */
  for (int form = 0; form < 6; form++) {
    size_t bin_at;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    dspk__pack_request_head(&pk, 8, "buffer.write", true);
    msgpack_pack_map(&pk, form == 5 ? 1 : 3);
    if (form != 5) {
      dspk__pack_str(&pk, "offset");
      if (form == 0)
        msgpack_pack_nil(&pk);
      else if (form == 1)
        msgpack_pack_int64(&pk, -1);
      else if (form == 2)
        msgpack_pack_double(&pk, 1.0);
      else
        dspk__pack_str(&pk, "zero");
      if (form == 4)
        msgpack_pack_uint8(&pk, 3); /* a key of another type */
      else
        dspk__pack_str(&pk, "junk");
      msgpack_pack_array(&pk, 2);
      msgpack_pack_map(&pk, 1);
      dspk__pack_str(&pk, "data"); /* nested: not the params' key */
      msgpack_pack_bin(&pk, 1);
      msgpack_pack_bin_body(&pk, "x", 1);
      msgpack_pack_true(&pk);
    }
    dspk__pack_str(&pk, "data");
    bin_at = sb.size;
    msgpack_pack_bin(&pk, 70000);
    assert_int_equal(head_find(sb.data, sb.size, &l, &h), 1);
    assert_int_equal(h.msgid, 8);
    assert_int_equal(h.bin_at, bin_at);
    assert_int_equal(h.head, sb.size);
    assert_int_equal(h.len, 70000);
    /* Not the strict form: the in-place scanner leaves it. */
    assert_int_equal(head_scan(sb.data, sb.size, &l, &h), 0);
    for (size_t k = 0; k < sb.size; k++)
      assert_int_equal(head_find(sb.data, k, &l, &h), 0);
    msgpack_sbuffer_destroy(&sb);
  }
  /* Not such a head: data not last, data twice (the first counts), data
   * not a bin, another method, params of 2. */
  for (int form = 0; form < 5; form++) {
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (form == 4) {
      msgpack_pack_array(&pk, 4);
      msgpack_pack_uint8(&pk, 0);
      msgpack_pack_uint8(&pk, 1);
      dspk__pack_str(&pk, "buffer.write");
      msgpack_pack_array(&pk, 2);
    } else {
      dspk__pack_request_head(&pk, 1, form == 3 ? "buffer.read" : "buffer.write", true);
    }
    msgpack_pack_map(&pk, 2);
    dspk__pack_str(&pk, form == 0 || form == 1 ? "data" : "buffer");
    if (form == 0) {
      msgpack_pack_bin(&pk, 4);
      msgpack_pack_bin_body(&pk, "abcd", 4);
      dspk__pack_str(&pk, "buffer");
      msgpack_pack_uint8(&pk, 1);
    } else {
      msgpack_pack_uint8(&pk, 1);
      dspk__pack_str(&pk, "data");
      if (form == 2)
        dspk__pack_str(&pk, "abcd");
      else
        msgpack_pack_bin(&pk, 4);
    }
    assert_int_equal(head_find(sb.data, sb.size, &l, &h), 0);
    msgpack_sbuffer_destroy(&sb);
  }
  /* A payload beyond max_message, or limits the head breaks: not a head. */
  build_write(&sb, 1, 2, 3, 1000);
  l.max_message = sb.size - 1;
  assert_int_equal(head_find(sb.data, sb.size - 1000, &l, &h), 0);
  l = deflim();
  l.max_depth = 1;
  assert_int_equal(head_find(sb.data, sb.size - 1000, &l, &h), 0);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- the head of a task.run answer (dspk__run_head_scan) ----------------- */

/* A task.run answer as dspkd packs it: {device, outputs: [{dtype, shape,
 * data}] (nout outputs of binlen bytes, shape {rank dims}), time_us}. */
static void build_run(msgpack_sbuffer *sb, uint32_t msgid, const char *device, unsigned rank,
                      size_t binlen, unsigned nout) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  dspk__pack_result_head(&pk, msgid);
  msgpack_pack_map(&pk, 3);
  dspk__pack_str(&pk, "device");
  dspk__pack_str(&pk, device);
  dspk__pack_str(&pk, "outputs");
  msgpack_pack_array(&pk, nout);
  for (unsigned k = 0; k < nout; k++) {
    msgpack_pack_map(&pk, 3);
    dspk__pack_str(&pk, "dtype");
    dspk__pack_str(&pk, "f32");
    dspk__pack_str(&pk, "shape");
    msgpack_pack_array(&pk, rank);
    for (unsigned i = 0; i < rank; i++)
      msgpack_pack_uint64(&pk, i == 0 ? binlen / 4 : 1);
    dspk__pack_str(&pk, "data");
    msgpack_pack_bin(&pk, binlen);
    for (size_t i = 0; i < binlen; i++)
      msgpack_pack_bin_body(&pk, (const char[]){(char)(i * 7 + k)}, 1);
  }
  dspk__pack_str(&pk, "time_us");
  msgpack_pack_uint64(&pk, 123456);
}

static int run_scan(const void *buf, size_t len, const struct dspk__limits *l,
                    struct dspk__run_head *h) {
  void *p = malloc(len ? len : 1); /* exact size: ASan sees an over-read */
  int r;
  assert_non_null(p);
  if (len)
    memcpy(p, buf, len);
  r = dspk__run_head_scan(p, len, l, h);
  free(p);
  return r;
}

static void test_run_head(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  static const size_t lens[] = {0, 4, 252, 65536, 100000};
  static const uint32_t ids[] = {1, 127, 128, 65536, UINT32_MAX};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    msgpack_sbuffer sb;
    struct dspk__run_head h;
    const char *dev = i % 2 ? "cuda:0" : "a-device-name-longer-than-31-bytes:0";
    build_run(&sb, ids[i], dev, (unsigned)(i % 4), lens[i], 1 + (unsigned)(i % 2));
    /* Found once the head is whole up to the first payload; the frame goes
     * on after it. */
    assert_int_equal(run_scan(sb.data, sb.size, &l, &h), 1);
    assert_int_equal(h.msgid, ids[i]);
    assert_int_equal(h.len, lens[i]);
    assert_true(h.head + h.len < sb.size);
    assert_true(h.len_at < h.head && h.head - h.len_at <= 4);
    assert_int_equal((unsigned char)sb.data[h.len_at - 1] & 0xfc, 0xc4); /* bin8/16/32 */
    {
      uint64_t v = 0;
      for (size_t k = h.len_at; k < h.head; k++)
        v = v << 8 | (unsigned char)sb.data[k];
      assert_int_equal(v, lens[i]);
    }
    assert_int_equal(run_scan(sb.data, h.head, &l, &h), 1);
    for (size_t k = 0; k < h.head; k++)
      assert_int_equal(run_scan(sb.data, k, &l, &h), 0);
    /* The frame with that bin emptied (what a client keeps while the payload
     * goes elsewhere) is still one valid frame, the payload shorter. */
    {
      char *cut = malloc(sb.size - h.len);
      assert_non_null(cut);
      memcpy(cut, sb.data, h.head);
      memset(cut + h.len_at, 0, h.head - h.len_at);
      memcpy(cut + h.head, sb.data + h.head + h.len, sb.size - h.head - h.len);
      assert_int_equal(scan(cut, sb.size - h.len, &l), (ssize_t)(sb.size - h.len));
      assert_unpacks_to(cut, sb.size - h.len);
      free(cut);
    }
    msgpack_sbuffer_destroy(&sb);
  }
}

static void test_run_head_other_forms(void **state) {
  (void)state;
  struct dspk__limits l = deflim();
  struct dspk__run_head h;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  /* A request, an error answer, keys in another order, an output by
   * reference, a non-str device, no outputs: the ordinary path. */
  for (int form = 0; form < 7; form++) {
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (form == 0) {
      dspk__pack_request_head(&pk, 7, "task.run", true);
    } else if (form == 1) {
      msgpack_pack_array(&pk, 4);
      msgpack_pack_uint8(&pk, 1);
      msgpack_pack_uint8(&pk, 7);
      msgpack_pack_map(&pk, 1);
      dspk__pack_str(&pk, "code");
      msgpack_pack_int(&pk, -1);
    } else {
      dspk__pack_result_head(&pk, 7);
    }
    msgpack_pack_map(&pk, 2);
    if (form == 2) { /* outputs first */
      dspk__pack_str(&pk, "outputs");
      msgpack_pack_array(&pk, 0);
    }
    dspk__pack_str(&pk, "device");
    if (form == 5)
      msgpack_pack_uint8(&pk, 0);
    else
      dspk__pack_str(&pk, "cpu:0");
    if (form != 2) {
      dspk__pack_str(&pk, "outputs");
      msgpack_pack_array(&pk, form == 6 ? 0 : 1);
      if (form != 6) {
        msgpack_pack_map(&pk, 3);
        dspk__pack_str(&pk, form == 3 ? "shape" : "dtype");
        if (form == 3)
          msgpack_pack_array(&pk, 0);
        else
          dspk__pack_str(&pk, "f32");
        dspk__pack_str(&pk, form == 3 ? "dtype" : "shape");
        if (form == 3)
          dspk__pack_str(&pk, "f32");
        else
          msgpack_pack_array(&pk, 0);
        dspk__pack_str(&pk, form == 4 ? "buffer" : "data");
        if (form == 4) {
          msgpack_pack_uint8(&pk, 3);
        } else {
          msgpack_pack_bin(&pk, 4);
          msgpack_pack_bin_body(&pk, "abcd", 4);
        }
      }
    }
    assert_int_equal(run_scan(sb.data, sb.size, &l, &h), 0);
    msgpack_sbuffer_destroy(&sb);
  }
  /* A payload beyond max_message or a head too deep: refused by the scanner,
   * so not a head. */
  build_run(&sb, 9, "cpu:0", 1, 1000, 1);
  assert_int_equal(run_scan(sb.data, sb.size, &l, &h), 1);
  l.max_message = h.head + 999;
  assert_int_equal(run_scan(sb.data, sb.size, &l, &h), 0);
  l = deflim();
  l.max_depth = 3;
  assert_int_equal(run_scan(sb.data, sb.size, &l, &h), 0);
  msgpack_sbuffer_destroy(&sb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_complete_frames),
      cmocka_unit_test(test_every_prefix_incomplete),
      cmocka_unit_test(test_need),
      cmocka_unit_test(test_all_header_forms),
      cmocka_unit_test(test_max_message),
      cmocka_unit_test(test_max_depth),
      cmocka_unit_test(test_max_objects),
      cmocka_unit_test(test_counts_bounded_by_remaining),
      cmocka_unit_test(test_huge_header),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_refusal_texts),
      cmocka_unit_test(test_random_valid),
      cmocka_unit_test(test_mutations),
      cmocka_unit_test(test_write_head),
      cmocka_unit_test(test_write_head_other_forms),
      cmocka_unit_test(test_write_head_find),
      cmocka_unit_test(test_run_head),
      cmocka_unit_test(test_run_head_other_forms),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
