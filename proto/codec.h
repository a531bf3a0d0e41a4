/*
 * Encoding and decoding of dspk messages (docs/protocol.md) over msgpack-c
 * objects, shared by the daemon and libdspkclient.  Decoders take a
 * msgpack_object from a frame that dspk__frame_scan() accepted; they never
 * allocate and return pointers into that frame (bin/str data is unaligned:
 * copy it with memcpy).  Encoders write through a dspk__wbuf, which keeps big
 * bin payloads by reference (zero copy) as separate iovec segments.
 */
#ifndef DSPK_PROTO_CODEC_H
#define DSPK_PROTO_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dspk/errors.h"
#include "dspk/types.h"
#include "proto/dtype.h"
#include "proto/frame.h"
#include "proto/utf8.h"

#define DSPK_PROTOCOL_VERSION 1

/* What a wrong value of a parameter is told it should be ("size: expected
 * a byte count, got ..."), one wording for each kind of uint whatever the
 * method or where it sits (docs/protocol.md, "Parameters of each method";
 * probe 22 A2: buffer.read's size and every offset said "a non-negative
 * integer", outputs[].buffer too). */
#define DSPK__EXPECT_BYTES "a byte count"   /* every size, kernel's shared */
#define DSPK__EXPECT_OFFSET "a byte offset" /* every offset, a tensor's too */
#define DSPK__EXPECT_BUFFER "a buffer id"   /* every buffer, a tensor's too */
/* Every bin parameter (ping's and buffer.write's data, kernel's source, an
 * inline tensor's data): a str is taken as its bytes, so the message says
 * so (probe 22 A2: "expected bin" for two, "str or bin" for the third). */
#define DSPK__EXPECT_BIN "binary data or a string"
/* trace's seconds, of the wrong type or out of its range (daemon/trace.c's
 * TRACE_MAX_S is the 600): one wording for both. */
#define DSPK__EXPECT_TRACE_SECONDS "a number in (0, 600]"

enum dspk__msgtype { DSPK__REQUEST = 0, DSPK__RESPONSE = 1, DSPK__NOTIFY = 2 };

/* A decoded message envelope.  Pointers refer into the unpacked frame. */
struct dspk__msg {
  enum dspk__msgtype type;
  uint32_t msgid;              /* request, response */
  const char *method;          /* request, notification; not NUL-terminated */
  size_t method_len;
  const msgpack_object *args;  /* request/notify: the params map, or NULL for [] */
  const msgpack_object *error; /* response: NULL when nil */
  const msgpack_object *result;/* response: NULL when nil */
};

/* Returns 0 and fills *out, or DSPK_EPROTO with a reason in msg.  When the
 * envelope is an array whose second element is a uint32 msgid, *msgid_out
 * (may be NULL) gets it even on failure and *has_msgid is set, so the
 * caller can answer the bad request. */
int dspk__msg_parse(const msgpack_object *root, struct dspk__msg *out,
                    uint32_t *msgid_out, bool *has_msgid, char *msg,
                    size_t msglen);

/* Map access.  dspk__map_get returns the value for a string key, or NULL. */
const msgpack_object *dspk__map_get(const msgpack_object *map, const char *key);
/* Typed getters: 0 on success, DSPK_EINVAL on a wrong type or range. */
int dspk__obj_u64(const msgpack_object *o, uint64_t *out);
int dspk__obj_i64(const msgpack_object *o, int64_t *out);
int dspk__obj_f64(const msgpack_object *o, double *out); /* int or float */
/* An int or float rounded once to the nearest f32 (ties to even) from its
 * exact value: an integer not through a double first (2^53 + 2^29 + 1
 * would become the tie 2^53 + 2^29, then 2^53). */
int dspk__obj_f32(const msgpack_object *o, float *out);
int dspk__obj_bool(const msgpack_object *o, bool *out);
int dspk__obj_str(const msgpack_object *o, const char **s, size_t *len);
int dspk__obj_bin(const msgpack_object *o, const void **p, size_t *len); /* bin or str */
/* What o is, in a few words for an error message ("an array of 3", "the
 * integer -1", "a string of 4 bytes", "nil"), written into buf (at most
 * n bytes); returns buf.  Never echoes a string's bytes. */
const char *dspk__obj_what(const msgpack_object *o, char *buf, size_t n);
/* The number o as the client sent it (proto/dtype.h): 0, or DSPK_EINVAL
 * when o is not a number. */
int dspk__obj_num(const msgpack_object *o, struct dspk__num_sent *out);
/* The number o as every message that echoes a client's number writes it
 * (dspk__num_str: an integer exactly, a float as Python's repr), into buf
 * (at most n bytes); what o is (dspk__obj_what) when not a number.
 * Returns buf. */
const char *dspk__obj_num_str(const msgpack_object *o, char *buf, size_t n);
/* Copies a str into buf (NUL-terminated); DSPK_ELIMIT when it does not fit. */
int dspk__obj_strcpy(const msgpack_object *o, char *buf, size_t buflen);
/* Key lookups with a default: absent key leaves *out as it is and returns 0;
 * present with a wrong type is DSPK_EINVAL with "key: expected ..." in msg. */
int dspk__arg_u64(const msgpack_object *map, const char *key, uint64_t *out, char *msg, size_t msglen);
int dspk__arg_f64(const msgpack_object *map, const char *key, double *out, char *msg, size_t msglen);
int dspk__arg_bool(const msgpack_object *map, const char *key, bool *out, char *msg, size_t msglen);
int dspk__arg_str(const msgpack_object *map, const char *key, char *buf, size_t buflen, char *msg, size_t msglen);

/* A tensor as it travels: inline data, or a reference to a daemon buffer. */
struct dspk__wire_tensor {
  dspk_dtype dtype;
  unsigned rank;
  int64_t shape[DSPK_MAX_RANK];
  bool is_ref;
  const void *data;  /* inline: points into the frame (unaligned) */
  size_t nbytes;     /* numel * itemsize */
  uint64_t buffer;   /* ref */
  uint64_t offset;   /* ref: bytes */
};

/* Decodes a tensor map; checks dtype, rank and element limits, that inline
 * data has exactly numel*itemsize bytes, and a ref's buffer and offset are
 * uints.  0, or DSPK_EINVAL/DSPK_EDTYPE/DSPK_ELIMIT with msg. */
int dspk__tensor_decode(const msgpack_object *o, const struct dspk__limits *lim,
                        struct dspk__wire_tensor *out, char *msg, size_t msglen);
/* A decoded ref's offset must be a multiple of its item size: 0, or
 * DSPK_EINVAL with msg.  Apart from the decode so that the daemon answers
 * ENOBUF for an unknown buffer before this (docs/protocol.md, task.run's
 * order of checks). */
int dspk__tensor_offset_check(const struct dspk__wire_tensor *t, char *msg, size_t msglen);

/* An outgoing frame: a packer writing into small owned chunks, with big bin
 * payloads attached by reference.  Segments are in wire order. */
struct dspk__wbuf_seg {
  const void *base;
  size_t len;
  void (*release)(void *ud); /* called by dspk__wbuf_free for refs; may be NULL */
  void *ud;
};
/* Small frames (pings, errors, most results) live entirely inside the
 * wbuf: its first DSPK__WBUF_INLINE packed bytes, first
 * DSPK__WBUF_INLINE_SEGS segments and iovecs need no allocation.  A wbuf
 * points into itself: never copy or move one after dspk__wbuf_init. */
#define DSPK__WBUF_INLINE 256
#define DSPK__WBUF_INLINE_SEGS 4
struct dspk__wbuf {
  msgpack_packer pk;       /* pack into the buffer with msgpack_pack_* */
  msgpack_sbuffer cur;     /* bytes not yet cut into a segment (data is in
                              inl, or a malloc'd chunk when cur_heap) */
  struct dspk__wbuf_seg *segs;
  size_t nsegs, cap;
  int err;                 /* sticky DSPK_ENOMEM */
  struct iovec *iov;       /* built by dspk__wbuf_iov, owned by w */
  bool cur_heap;           /* cur.data is a malloc'd chunk */
  size_t inl_used;         /* bytes of inl already cut into segments */
  size_t heap;             /* bytes of its chunks and segment array as
                              allocated (dspk__wbuf_held) */
  /* Bins that dspk__wbuf_bin_ref references whatever their size (never
   * copied, not even a short one): those for which this says true (NULL,
   * set by dspk__wbuf_init: none).  libdspkclient's file ranges, whose
   * bytes go with sendfile and must not be read through their mapping. */
  bool (*by_ref)(const void *ud, const void *data, size_t n);
  const void *by_ref_ud;
  struct dspk__wbuf_seg inl_segs[DSPK__WBUF_INLINE_SEGS];
  struct iovec inl_iov[DSPK__WBUF_INLINE_SEGS];
  char inl[DSPK__WBUF_INLINE];
};
void dspk__wbuf_init(struct dspk__wbuf *w);
/* Packs a bin header of n bytes followed by data[0..n) by reference (a
 * short one is copied, unless w->by_ref says otherwise); data must stay
 * valid until release(ud) runs (release may be NULL). */
void dspk__wbuf_bin_ref(struct dspk__wbuf *w, const void *data, size_t n,
                        void (*release)(void *ud), void *ud);
/* Cuts the frame into iovecs (*iov is owned by w).  0 or DSPK_ENOMEM. */
int dspk__wbuf_iov(struct dspk__wbuf *w, struct iovec **iov, size_t *n);
/* Total bytes of the frame. */
size_t dspk__wbuf_len(const struct dspk__wbuf *w);
/* Bytes the frame holds beyond the struct itself: its chunks, segment and
 * iovec arrays at their allocated size (plus DSPK__ALLOC_OVERHEAD each),
 * and the bytes of the data it references (dspk__wbuf_bin_ref), which stay
 * alive for it.  What a queue of frames costs is the sum of these and of
 * the structs. */
size_t dspk__wbuf_held(const struct dspk__wbuf *w);
/* What the C library's allocator takes per allocation beyond its size (its
 * header and alignment), as the accounting above counts it. */
#define DSPK__ALLOC_OVERHEAD 16
/* Frees owned chunks and calls the release of each ref.  Accepts a zeroed w. */
void dspk__wbuf_free(struct dspk__wbuf *w);

/* Packing helpers.  A str: each byte of s that starts no UTF-8 character
 * becomes U+FFFD (the str stays valid). */
void dspk__pack_str(msgpack_packer *pk, const char *s);
void dspk__pack_strn(msgpack_packer *pk, const char *s, size_t n);
/* A map entry: the key k (a str), then the value. */
void dspk__pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void dspk__pack_kv_u64(msgpack_packer *pk, const char *k, uint64_t v);
void dspk__pack_kv_i64(msgpack_packer *pk, const char *k, int64_t v);
void dspk__pack_kv_bool(msgpack_packer *pk, const char *k, bool v);
/* s as one line: each line's blanks at its ends and every empty line dropped,
 * the lines joined with "; ", any other control character (dspk__utf8_ctl:
 * C0, DEL, C1, U+2028, U+2029) a space, and every character that prints
 * as nothing (dspk__utf8_hidden: a bidirectional control, a zero-width
 * character, a combining mark with no base...) as \uNNNN, whoever wrote
 * the text (an echoed string already has them escaped; a compiler's log
 * quoting a kernel's source may not); writes it into dst (not terminated)
 * when dst is not NULL and returns its length (at most three times
 * strlen(s)). */
size_t dspk__one_line(char *dst, const char *s);
/* The error map {code, name, message}; message (one line, see
 * dspk__one_line; empty or NULL: the table's text) as a valid UTF-8 str. */
void dspk__pack_error(msgpack_packer *pk, int code, const char *message);
/* [0, msgid, method, [  ...caller packs one map, or nothing when nargs=0 ] */
void dspk__pack_request_head(msgpack_packer *pk, uint32_t msgid, const char *method, bool has_args);
/* [1, msgid, nil, ...caller packs the result] */
void dspk__pack_result_head(msgpack_packer *pk, uint32_t msgid);
/* [1, msgid, {code,name,message}, nil] */
void dspk__pack_error_response(msgpack_packer *pk, uint32_t msgid, int code, const char *message);
/* [2, method, [ ...caller packs one map ] */
void dspk__pack_notify_head(msgpack_packer *pk, const char *method);
/* {dtype, shape} entries of a tensor map; caller packs the map header
 * with the right count and the data or buffer entries. */
void dspk__pack_tensor_meta(msgpack_packer *pk, dspk_dtype dt, unsigned rank, const int64_t *shape);

/* The error table (include/dspk/errors.h): name ("EINVAL") and message for a
 * code; "EUNKNOWN"/"unknown error" for any other value. */
const char *dspk__err_name(int code);
const char *dspk__strerror(int code);
/* Maps a wire name back to a code; DSPK_EINTERNAL when unknown. */
int dspk__err_from_name(const char *name, size_t len);

#endif /* DSPK_PROTO_CODEC_H */
