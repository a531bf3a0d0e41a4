/*
 * Frame validation: a non-allocating scanner that finds where the next
 * msgpack object in a byte stream ends and checks it against the named
 * limits before msgpack-c ever sees it.  msgpack-c's unpacker allocates from
 * the counts it reads (a 5-byte array32 header made it reserve 4 GB), so
 * every count is bounded here by the bytes that remain, nesting depth and
 * total size are bounded, and only a frame that passes is unpacked.
 *
 * Pure functions: no I/O, no threads, no allocation.
 */
#ifndef DSPK_PROTO_FRAME_H
#define DSPK_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Deepest nesting the scanner accepts; a configured max_depth above this
 * is treated as this value (and reported as it: hello's limits are the
 * values in force).  It is the depth msgpack-c's unpacker can decode (its
 * stack, MSGPACK_EMBED_STACK_SIZE): a deeper frame passed to
 * msgpack_unpack() fails as "out of memory" (found by tests/fuzz). */
#define DSPK__SCAN_DEPTH_MAX 32

struct dspk__limits {
  size_t max_message;    /* bytes in one message */
  unsigned max_depth;    /* nesting of arrays/maps (top-level array is 1);
                            msgpack-c decodes at most 32 levels, so a larger
                            value acts as 32 */
  size_t max_objects;    /* msgpack objects in one message */
  unsigned max_rank;     /* tensor rank (<= DSPK_MAX_RANK) */
  uint64_t max_elements; /* elements in one tensor */
};

/* Writes the documented defaults (docs/protocol.md) into *l. */
void dspk__limits_default(struct dspk__limits *l);

/*
 * Scans buf[0..len) for one complete msgpack object.  Returns its length in
 * bytes (> 0) when buf starts with a complete, valid object; 0 when more
 * bytes are needed (and len is still within max_message); DSPK_EPROTO for
 * bytes that are not msgpack (reserved 0xc1, ext types) or DSPK_ELIMIT for a
 * broken limit, with a one-line reason in msg.  Never reads past len.
 */
ssize_t dspk__frame_scan(const void *buf, size_t len,
                         const struct dspk__limits *lim, char *msg,
                         size_t msglen);

/*
 * For buf[0..len) that dspk__frame_scan() answers 0 (incomplete): the least
 * length in bytes the whole frame can have, more than len: what the headers
 * read so far announce (a str/bin's payload, at least one byte for each
 * object still owed), or len + 1 when they announce nothing further.  For a
 * complete frame, its length; for one the scanner refuses, len.  Never reads
 * past len.
 */
uint64_t dspk__frame_need(const void *buf, size_t len, const struct dspk__limits *lim);

/*
 * The head of a buffer.write request whose data can be received straight
 * into the buffer: [0, msgid, "buffer.write", [{buffer: uint, offset?: uint,
 * data: bin}]] with "data" the map's last key, so that the bin's payload ends
 * the frame.  `head` is the length of everything before the payload.
 */
struct dspk__write_head {
  uint32_t msgid;
  uint64_t buffer;
  uint64_t offset; /* 0 when absent */
  size_t head;     /* bytes before the payload */
  size_t len;      /* payload bytes */
  size_t bin_at;   /* where the bin's header starts (head less its size) */
};

/*
 * Returns 1 and fills *h when buf[0..len) starts with such a head, complete
 * up to its payload, that dspk__frame_scan() accepts as the start of a frame
 * within lim (so the whole frame, head + payload, is valid and within
 * max_message once the payload has come); 0 otherwise: another message, the
 * same request in any other form (keys in another order or repeated, other
 * keys, nil, ints in a signed encoding), a head not complete yet, or one
 * that breaks a limit.  Those take the ordinary path, which decodes the
 * whole frame (and answers its errors).  Never reads past len.
 */
int dspk__write_head_scan(const void *buf, size_t len, const struct dspk__limits *lim,
                          struct dspk__write_head *h);

/*
 * The head of any buffer.write request whose params map ends with the key
 * "data" and a bin, so that the bin's payload ends the frame: [0, msgid,
 * "buffer.write", [{..., data: bin}]], the entries before "data" of any
 * keys and values but the key "data" (which would be the one that counts),
 * in any order, as dspk__write_head_scan() would not take them (nil, a
 * negative or float offset, an unknown key, no buffer).  Returns 1 and
 * fills *h but h->buffer and h->offset (0) when buf[0..len) starts with such
 * a head, complete up to its payload, that dspk__frame_scan() accepts as the
 * start of a frame within lim; 0 otherwise.  The daemon decodes such a head
 * (its bin emptied) to refuse a bad request before its data has come.
 * Never reads past len.
 */
int dspk__write_head_find(const void *buf, size_t len, const struct dspk__limits *lim,
                          struct dspk__write_head *h);

/*
 * The head of a task.run answer whose first output's data a client can
 * receive straight into the output's own memory: [1, msgid, nil,
 * {"device": str, "outputs": [{"dtype": str, "shape": [uint...],
 * "data": bin} ...] ...}] with "device" and "outputs" the result map's
 * first keys and the output's keys in that order (as dspkd packs it).
 * `head` is the length of everything before that payload, `len` its
 * length, and the bin's length field is the bytes [len_at, head); the frame
 * goes on after the payload (other outputs, time_us).
 */
struct dspk__run_head {
  uint32_t msgid;
  size_t head;   /* bytes before the payload */
  size_t len;    /* payload bytes */
  size_t len_at; /* where the bin's big-endian length field starts */
};

/*
 * Returns 1 and fills *h when buf[0..len) starts with such a head, complete
 * up to the payload, that dspk__frame_scan() accepts as the start of a frame
 * within lim (the payload within max_message); 0 otherwise (another message,
 * an error answer, another order of keys, an output by reference, a head not
 * complete yet, a broken limit): those take the ordinary path.  Never reads
 * past len.
 */
int dspk__run_head_scan(const void *buf, size_t len, const struct dspk__limits *lim,
                        struct dspk__run_head *h);

#endif /* DSPK_PROTO_FRAME_H */
