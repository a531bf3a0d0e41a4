/*
 * Op inference (dspk__op_infer_lim, dspk__op_check_results) and tensor
 * decoding (dspk__tensor_decode) with random shapes, dtypes, options and
 * limits.  The input is a compact op description, read front to back (a
 * short input leaves the rest zero):
 *
 *   byte 0       op kind (mod DSPK_OP_COUNT + 1: one invalid kind)
 *   byte 1       number of inputs (mod DSPK__OP_MAX_IN + 2: one too many)
 *   byte 2       limits: bits 0-2 pick max_elements, 3-5 max_inline,
 *                6-7 max_bytes, from tables of edge values
 *   byte 3, 4    inline_mask, inline_in for dspk__op_check_results
 *   bytes 5-12   options: trans_a/b, inverse, reduce fn and axes, map fn
 *   per input    dtype byte (mod DSPK_DTYPE_COUNT + 1), rank byte (mod
 *                DSPK_MAX_RANK + 2), then per dimension one byte: values
 *                0..239 index a table of edge sizes (0, 1, 2^k, 2^k-1,
 *                2^31-1, 2^62, INT64_MAX ...), 240..255 read the next 8
 *                bytes as a raw int64 (negative ones included)
 *   the rest     contract: subscripts (at most 63 bytes); gemm: alpha then
 *                beta, map: alpha, each a selector byte and 8 raw bytes
 *                (num() below)
 *
 * Oracles: nothing crashes or overflows (ASan, UBSan); after a successful
 * inference every input and result has a representable size, obeys
 * max_elements, and its byte count is numel times the item size (checked
 * in 128 bits); dspk__op_check_results accepts exactly when the inline bytes
 * fit max_inline and the temporaries fit max_bytes; each input packed as a
 * msgpack buffer reference decodes with dspk__tensor_decode exactly when its
 * size is representable and within the limits, with the same byte count.
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/op.h"
#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/dtype.h"
#include "proto/frame.h"

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "%s:%d: oracle failed: %s\n", __FILE__, __LINE__, #c);   \
      abort();                                                                 \
    }                                                                          \
  } while (0)

struct rd {
  const uint8_t *p;
  size_t n;
};

static uint8_t u8(struct rd *r) {
  if (!r->n)
    return 0;
  r->n--;
  return *r->p++;
}

static uint64_t u64(struct rd *r) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | u8(r);
  return v;
}

/* An option's number (gemm's alpha, beta; map's alpha) and how it was sent:
 * a selector byte (bits 0-1 the kind, bit 2 a float32, bit 3 a sent value
 * that differs from the option's, as for an op built without the decoder),
 * then the raw 8 bytes of the double (any NaN, infinity, subnormal); dflt
 * when the input has ended. */
static double num(struct rd *r, double dflt, struct dspk__num_sent *s) {
  if (!r->n)
    return dflt; /* kind NONE: not sent */
  uint8_t sel = u8(r);
  uint64_t bits = u64(r);
  double v;
  memcpy(&v, &bits, sizeof v);
  s->kind = (enum dspk__num_kind)(sel & 3);
  s->f32 = (sel >> 2) & 1;
  if (s->kind == DSPK__NUM_UINT)
    s->v.u = (sel >> 3) & 1 ? bits : (uint64_t)(v >= 0 && v < 0x1p64 ? v : 0);
  else if (s->kind == DSPK__NUM_INT)
    s->v.i = (sel >> 3) & 1 ? (int64_t)bits
                            : (v >= -0x1p63 && v < 0x1p63 ? (int64_t)v : 0);
  else
    s->v.f = (sel >> 3) & 1 ? -v : v;
  return v;
}

static const int64_t dims[] = {
    0, 1, 2, 3, 4, 5, 7, 8, 16, 100, 200, 1000, 1024, 4096, 16384, 65535, 65536,
    (int64_t)1 << 20, (int64_t)1 << 30, ((int64_t)1 << 31) - 1, (int64_t)1 << 31,
    (int64_t)1 << 32, (int64_t)1 << 40, (int64_t)1 << 52, (int64_t)1 << 59,
    (int64_t)1 << 60, (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX / 2,
    INT64_MAX - 1, INT64_MAX, -1, INT64_MIN};
#define NDIMS (sizeof dims / sizeof dims[0])

static const uint64_t elems[] = {1, 100, 1000, (uint64_t)1 << 31, (uint64_t)1 << 40,
                                 (uint64_t)1 << 62, INT64_MAX, UINT64_MAX};
static const uint64_t inl[] = {0, 64, 1000, (uint64_t)255 << 20, (uint64_t)1 << 32,
                               INT64_MAX, UINT64_MAX - 1, UINT64_MAX};
static const uint64_t bytes[] = {0, 4096, (uint64_t)24 << 30, UINT64_MAX};

/* The exact element count and byte count in 128 bits, or -1 for a negative
 * dimension or an extent beyond INT64_MAX (dspk__tensor_size's rule). */
static int exact(const struct dspk__tensor *t, unsigned __int128 *numel,
                 unsigned __int128 *nbytes) {
  unsigned __int128 n = 1, ext;
  size_t isz;
  if ((unsigned)t->dtype >= DSPK_DTYPE_COUNT || t->rank < 0 || t->rank > DSPK_MAX_RANK)
    return -1;
  isz = dspk__dtype_size(t->dtype);
  ext = isz;
  for (int i = 0; i < t->rank; i++) {
    if (t->shape[i] < 0)
      return -1;
    n *= (uint64_t)t->shape[i];
    if (t->shape[i])
      ext *= (uint64_t)t->shape[i];
    if (ext > INT64_MAX)
      return -1;
  }
  *numel = n;
  *nbytes = n * isz;
  return 0;
}

/* Packs t as a buffer reference and decodes it with lim. */
static void check_decode(const struct dspk__tensor *t, const struct dspk__limits *lim) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_zone zone;
  msgpack_object root;
  struct dspk__wire_tensor w;
  unsigned __int128 n, nb;
  size_t off = 0;
  char msg[256];
  int rc, ok;

  if ((unsigned)t->dtype >= DSPK_DTYPE_COUNT || t->rank < 0 || t->rank > DSPK_MAX_RANK)
    return;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  dspk__pack_tensor_meta(&pk, t->dtype, (unsigned)t->rank, t->shape);
  dspk__pack_str(&pk, "buffer");
  msgpack_pack_uint64(&pk, 1);
  dspk__pack_str(&pk, "offset");
  msgpack_pack_uint64(&pk, 0);
  CHECK(msgpack_zone_init(&zone, 512));
  CHECK(msgpack_unpack(sb.data, sb.size, &off, &zone, &root) == MSGPACK_UNPACK_SUCCESS);
  rc = dspk__tensor_decode(&root, lim, &w, msg, sizeof msg);
  ok = exact(t, &n, &nb) == 0 && (unsigned)t->rank <= lim->max_rank &&
       n <= lim->max_elements;
  CHECK((rc == 0) == (ok != 0));
  if (rc == 0) {
    CHECK(w.nbytes == (size_t)nb);
    CHECK(w.rank == (unsigned)t->rank && w.dtype == t->dtype);
  } else {
    CHECK(msg[0] != '\0');
  }
  msgpack_zone_destroy(&zone);
  msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct rd r = {data, size};
  struct dspk__op op;
  struct dspk__op_limits lim;
  struct dspk__limits wl;
  char msg[256];
  unsigned mask_out, mask_in;
  uint8_t b;
  int rc;

  memset(&op, 0, sizeof op);
  op.kind = (dspk_op)(u8(&r) % (DSPK_OP_COUNT + 1));
  op.nin = u8(&r) % (DSPK__OP_MAX_IN + 2);
  b = u8(&r);
  lim.max_elements = elems[b & 7];
  lim.max_inline = inl[(b >> 3) & 7];
  lim.max_bytes = bytes[b >> 6];
  mask_out = u8(&r);
  mask_in = u8(&r);
  b = u8(&r);
  op.u.gemm.trans_a = b & 1;
  op.u.gemm.trans_b = (b >> 1) & 1;
  op.u.gemm.alpha = 1.0;
  if (op.kind == DSPK_OP_FFT)
    op.u.fft.inverse = b & 1;
  b = u8(&r);
  uint32_t axes = (uint32_t)u8(&r) | (uint32_t)u8(&r) << 8;
  uint8_t fn = u8(&r);
  (void)u8(&r);
  (void)u8(&r);
  (void)u8(&r);
  if (op.kind == DSPK_OP_REDUCE) {
    op.u.reduce.fn = (dspk_reduce)(b % (DSPK_REDUCE_COUNT + 1));
    op.u.reduce.axes = (fn & 0x80) ? axes | 0x10000 : axes;
  } else if (op.kind == DSPK_OP_MAP) {
    op.u.map.fn = (dspk_mapfn)(fn % (DSPK_MAPFN_COUNT + 1));
  } else if (op.kind == DSPK_OP_KERNEL) {
    op.u.kernel.lang = "glsl";
    op.u.kernel.source = (b & 1) ? "void main() {}" : NULL;
    op.u.kernel.nargs = fn % (DSPK__KERNEL_MAX_ARGS + 2);
    for (int i = 0; i < op.u.kernel.nargs && i < DSPK__KERNEL_MAX_ARGS; i++) {
      op.u.kernel.args[i].kind = (enum dspk__karg_kind)(u8(&r) % 7);
      op.u.kernel.args[i].v.tensor = (int)(int8_t)u8(&r);
    }
  }
  for (int i = 0; i < DSPK__OP_MAX_IN; i++) {
    struct dspk__tensor *t = &op.in[i];
    t->dtype = (dspk_dtype)(u8(&r) % (DSPK_DTYPE_COUNT + 1));
    t->rank = u8(&r) % (DSPK_MAX_RANK + 2);
    for (int k = 0; k < t->rank && k < DSPK_MAX_RANK; k++) {
      uint8_t sel = u8(&r);
      t->shape[k] = sel < 240 ? dims[sel % NDIMS] : (int64_t)u64(&r);
    }
  }
  if (op.kind == DSPK_OP_CONTRACT) {
    /* Only a contraction's: the union's other members hold bools and
     * enums that arbitrary bytes would make invalid values (UBSan). */
    size_t n = r.n < DSPK__SUBSCRIPTS_MAX - 1 ? r.n : DSPK__SUBSCRIPTS_MAX - 1;
    memcpy(op.u.contract.subscripts, r.p, n);
    op.u.contract.subscripts[n] = '\0';
    if (n == 0)
      strcpy(op.u.contract.subscripts, "ij,jk->ik");
  } else if (op.kind == DSPK_OP_GEMM) {
    op.u.gemm.alpha = num(&r, 1.0, &op.u.gemm.alpha_sent);
    op.u.gemm.beta = num(&r, 0.0, &op.u.gemm.beta_sent);
  } else if (op.kind == DSPK_OP_MAP) {
    op.u.map.alpha = num(&r, 1.0, &op.u.map.alpha_sent);
  }
  if (op.kind == DSPK_OP_KERNEL && op.u.kernel.nargs > DSPK__KERNEL_MAX_ARGS)
    op.u.kernel.nargs = DSPK__KERNEL_MAX_ARGS + 1; /* invalid: refused */

  /* Tensor decoding agrees with dspk__tensor_size on every input. */
  dspk__limits_default(&wl);
  wl.max_elements = lim.max_elements;
  for (int i = 0; i < DSPK__OP_MAX_IN; i++)
    check_decode(&op.in[i], &wl);

  msg[0] = '\0';
  rc = dspk__op_infer_lim(&op, &lim, msg, sizeof msg);
  CHECK(rc <= 0);
  CHECK(memchr(msg, '\0', sizeof msg) != NULL);
  if (rc != 0) {
    CHECK(msg[0] != '\0');
    return 0;
  }
  CHECK(op.nout >= 0 && op.nout <= DSPK__OP_MAX_OUT);
  CHECK(op.kind != DSPK_OP_KERNEL || op.nout == 0);
  for (int i = 0; i < op.nin + op.nout; i++) {
    const struct dspk__tensor *t = i < op.nin ? &op.in[i] : &op.out[i - op.nin];
    unsigned __int128 n, nb;
    int64_t n2;
    size_t nb2;
    CHECK(exact(t, &n, &nb) == 0);
    CHECK(dspk__tensor_size(t, &n2, &nb2) == 0);
    CHECK((unsigned __int128)n2 == n && (unsigned __int128)nb2 == nb);
    CHECK(n <= lim.max_elements);
    CHECK(dspk__tensor_numel(t) == n2 && dspk__tensor_nbytes(t) == nb2);
  }

  /* The inline cap and the device memory. */
  {
    int kernel = op.kind == DSPK_OP_KERNEL;
    const struct dspk__tensor *res = kernel ? op.in : op.out;
    int nres = kernel ? op.nin : op.nout;
    unsigned __int128 inl_b = 0, tmp = 0;
    for (int i = 0; i < nres; i++)
      if (mask_out & (1u << i))
        inl_b += dspk__tensor_nbytes(&res[i]);
    for (int i = 0; i < op.nin; i++)
      if (mask_in & (1u << i))
        tmp += dspk__tensor_nbytes(&op.in[i]);
    if (!kernel)
      tmp += inl_b;
    rc = dspk__op_check_results(&op, &lim, mask_out, mask_in, msg, sizeof msg);
    if (inl_b > lim.max_inline)
      CHECK(rc == DSPK_ELIMIT);
    else if (tmp > lim.max_bytes)
      CHECK(rc == DSPK_ENOMEM);
    else
      CHECK(rc == 0);
  }
  return 0;
}
