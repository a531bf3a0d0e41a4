/*
 * Tensor decoding (dspk__tensor_decode) with fuzzed limits: the first four
 * bytes choose max_rank and max_elements, the rest is one msgpack object.
 * Oracles: a decoded tensor obeys the limits and the int64 size rule of
 * docs/protocol.md, its byte count is numel times the item size, inline
 * data lies inside the input; and a decoded tensor
 * packed again with dspk__pack_tensor_meta decodes to the same tensor.
 */
#include <msgpack.h>
#include <string.h>

#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/frame.h"
#include "tests/fuzz/fuzz_common.h"

static void roundtrip(const struct dspk__wire_tensor *t, const struct dspk__limits *lim) {
  struct dspk__wbuf w;
  struct iovec *iov;
  size_t niov, len, pos = 0, off = 0;
  uint8_t *flat;
  msgpack_zone zone;
  msgpack_object root;
  struct dspk__wire_tensor u;
  char msg[256];

  dspk__wbuf_init(&w);
  msgpack_pack_map(&w.pk, t->is_ref ? 4 : 3);
  dspk__pack_tensor_meta(&w.pk, t->dtype, t->rank, t->shape);
  if (t->is_ref) {
    dspk__pack_str(&w.pk, "buffer");
    msgpack_pack_uint64(&w.pk, t->buffer);
    dspk__pack_str(&w.pk, "offset");
    msgpack_pack_uint64(&w.pk, t->offset);
  } else {
    dspk__pack_str(&w.pk, "data");
    dspk__wbuf_bin_ref(&w, t->data, t->nbytes, NULL, NULL);
  }
  FUZZ_CHECK(dspk__wbuf_iov(&w, &iov, &niov) == 0);
  len = dspk__wbuf_len(&w);
  flat = malloc(len ? len : 1);
  FUZZ_CHECK(flat);
  for (size_t k = 0; k < niov; k++) {
    memcpy(flat + pos, iov[k].iov_base, iov[k].iov_len);
    pos += iov[k].iov_len;
  }
  FUZZ_CHECK(pos == len);
  FUZZ_CHECK(msgpack_zone_init(&zone, 512));
  FUZZ_CHECK(msgpack_unpack((const char *)flat, len, &off, &zone, &root) ==
             MSGPACK_UNPACK_SUCCESS);
  FUZZ_CHECK(dspk__tensor_decode(&root, lim, &u, msg, sizeof msg) == 0);
  FUZZ_CHECK(u.dtype == t->dtype && u.rank == t->rank && u.is_ref == t->is_ref);
  FUZZ_CHECK(memcmp(u.shape, t->shape, t->rank * sizeof t->shape[0]) == 0);
  FUZZ_CHECK(u.nbytes == t->nbytes);
  if (t->is_ref)
    FUZZ_CHECK(u.buffer == t->buffer && u.offset == t->offset);
  else if (t->nbytes)
    FUZZ_CHECK(memcmp(u.data, t->data, t->nbytes) == 0);
  msgpack_zone_destroy(&zone);
  free(flat);
  dspk__wbuf_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct dspk__limits lim;
  msgpack_zone zone;
  msgpack_object root;
  struct dspk__wire_tensor t;
  size_t off = 0;
  char msg[256];
  ssize_t n;
  unsigned shift;

  dspk__limits_default(&lim);
  lim.max_rank = 1 + (unsigned)fuzz_take(&data, &size, 1) % DSPK_MAX_RANK;
  shift = (unsigned)fuzz_take(&data, &size, 1) % 64;
  lim.max_elements = ((uint64_t)1 << shift) + fuzz_take(&data, &size, 2);
  lim.max_message = 1 << 20;
  n = dspk__frame_scan(data, size, &lim, msg, sizeof msg);
  if (n <= 0)
    return 0;
  FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
  if (msgpack_unpack((const char *)data, (size_t)n, &off, &zone, &root) ==
          MSGPACK_UNPACK_SUCCESS &&
      dspk__tensor_decode(&root, &lim, &t, msg, sizeof msg) == 0) {
    /* docs/protocol.md, Tensors: at most max_elements elements (a zero
     * dimension makes 0 whatever the others); every dimension an int64, and
     * the product with each 0 counted as 1, times the item size, at most
     * 2^63-1 bytes.  Checked in 128 bits. */
    unsigned __int128 numel = 1, nonzero = 1;
    FUZZ_CHECK(t.rank <= lim.max_rank);
    for (unsigned k = 0; k < t.rank; k++) {
      FUZZ_CHECK(t.shape[k] >= 0);
      numel *= (uint64_t)t.shape[k];
      nonzero *= t.shape[k] ? (uint64_t)t.shape[k] : 1;
      FUZZ_CHECK(nonzero * dspk__dtype_size(t.dtype) <= (unsigned __int128)INT64_MAX);
    }
    FUZZ_CHECK(numel <= lim.max_elements);
    FUZZ_CHECK(t.nbytes == numel * dspk__dtype_size(t.dtype));
    if (!t.is_ref && t.nbytes)
      FUZZ_CHECK((const uint8_t *)t.data >= data &&
                 (const uint8_t *)t.data + t.nbytes <= data + n);
    roundtrip(&t, &lim);
  }
  msgpack_zone_destroy(&zone);
  return 0;
}
