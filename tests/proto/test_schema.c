/*
 * Unit tests of the protocol's table and its generic decoder and encoder
 * (proto/schema.c): defaults for absent and nil keys, every type's wrong
 * value with its code and message, ranges at and one past their bounds,
 * enums and enum lists, what an encoded request decodes back to, the name
 * lookups, nested result maps (the bytes of dspk__map_encode, the decoder's
 * checks at any depth), and that the table is well formed (indices match
 * names, no method or op over DSPK__MAX_PARAMS, the JSON export parses as
 * one document).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <cmocka.h>
#include <msgpack.h>

#include "proto/schema.h"

/* Unpacks the JSON-ish description of a params map built by fn. */
struct pm {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_unpacked up;
};

static msgpack_packer *pm_begin(struct pm *m) {
  msgpack_sbuffer_init(&m->sb);
  msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
  msgpack_unpacked_init(&m->up);
  return &m->pk;
}

static const msgpack_object *pm_end(struct pm *m) {
  size_t off = 0;
  assert_int_equal(msgpack_unpack_next(&m->up, m->sb.data, m->sb.size, &off),
                   MSGPACK_UNPACK_SUCCESS);
  return &m->up.data;
}

static void pm_free(struct pm *m) {
  msgpack_unpacked_destroy(&m->up);
  msgpack_sbuffer_destroy(&m->sb);
}

static void kv_str(msgpack_packer *pk, const char *k, const char *v) {
  dspk__pack_str(pk, k);
  dspk__pack_str(pk, v);
}

static const struct dspk__method *M(enum dspk__method_id id) { return &dspk__methods[id]; }

/* Decodes a map with one key k packed by the caller after pm_begin. */
static int decode(const struct dspk__method *m, const msgpack_object *map,
                  struct dspk__pval *v, char *msg) {
  msg[0] = '\0';
  return dspk__params_decode(m->params, m->nparams, map, NULL, v, msg, 256);
}

static void test_defaults(void **state) {
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char msg[256];
  struct pm m;
  msgpack_packer *pk = pm_begin(&m);
  (void)state;
  msgpack_pack_map(pk, 2);
  dspk__pack_str(pk, "version");
  msgpack_pack_nil(pk);
  kv_str(pk, "unknown", "ignored");
  assert_int_equal(decode(M(DSPK__M_HELLO), pm_end(&m), v, msg), 0);
  assert_false(v[DSPK__HELLO_VERSION].set);
  assert_int_equal(v[DSPK__HELLO_VERSION].v.u, 1);
  assert_false(v[DSPK__HELLO_CLIENT].set);
  pm_free(&m);
  /* No map at all: every default. */
  assert_int_equal(decode(M(DSPK__M_BUFFER_CREATE), NULL, v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "size: required (a byte count)");
  assert_int_equal(decode(M(DSPK__M_PING), NULL, v, msg), 0);
  assert_int_equal(v[DSPK__PING_DATA].v.s.n, 0);
}

static void test_types(void **state) {
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char msg[256], longname[80];
  struct pm m;
  msgpack_packer *pk;
  (void)state;

  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  dspk__pack_str(pk, "all");
  msgpack_pack_int(pk, 1);
  assert_int_equal(decode(M(DSPK__M_DEVICES), pm_end(&m), v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "all: expected a boolean, got the integer 1");
  pm_free(&m);

  memset(longname, 'x', 64);
  longname[64] = '\0';
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  kv_str(pk, "client", longname);
  assert_int_equal(decode(M(DSPK__M_HELLO), pm_end(&m), v, msg), DSPK_ELIMIT);
  assert_string_equal(msg, "client: longer than 63 bytes");
  pm_free(&m);
  longname[63] = '\0'; /* 63 bytes: accepted */
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  kv_str(pk, "client", longname);
  assert_int_equal(decode(M(DSPK__M_HELLO), pm_end(&m), v, msg), 0);
  assert_true(v[DSPK__HELLO_CLIENT].set);
  assert_int_equal(v[DSPK__HELLO_CLIENT].v.s.n, 63);
  pm_free(&m);

  /* msgid: at the uint32 bound and one past it. */
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  dspk__pack_str(pk, "msgid");
  msgpack_pack_uint64(pk, UINT32_MAX);
  assert_int_equal(decode(M(DSPK__M_TASK_CANCEL), pm_end(&m), v, msg), 0);
  assert_int_equal(v[DSPK__CANCEL_MSGID].v.u, UINT32_MAX);
  pm_free(&m);
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  dspk__pack_str(pk, "msgid");
  msgpack_pack_uint64(pk, (uint64_t)UINT32_MAX + 1);
  assert_int_equal(decode(M(DSPK__M_TASK_CANCEL), pm_end(&m), v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "msgid: expected the uint32 msgid of a request, got the integer 4294967296");
  pm_free(&m);

  /* task.run: unknown op, inputs bounds. */
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 2);
  kv_str(pk, "op", "warp");
  dspk__pack_str(pk, "inputs");
  msgpack_pack_array(pk, 5);
  for (int i = 0; i < 5; i++)
    msgpack_pack_nil(pk);
  assert_int_equal(decode(M(DSPK__M_TASK_RUN), pm_end(&m), v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "op: unknown op \"warp\" (gemm, fft, fir, contract, reduce, map, "
                           "kernel)");
  pm_free(&m);
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 2);
  kv_str(pk, "op", "map");
  dspk__pack_str(pk, "inputs");
  msgpack_pack_array(pk, 5);
  for (int i = 0; i < 5; i++)
    msgpack_pack_nil(pk);
  assert_int_equal(decode(M(DSPK__M_TASK_RUN), pm_end(&m), v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "inputs: expected a non-empty array of at most 4 tensors, got an array of 5 items");
  pm_free(&m);
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 2);
  kv_str(pk, "op", "map");
  dspk__pack_str(pk, "inputs");
  msgpack_pack_array(pk, 4);
  for (int i = 0; i < 4; i++)
    msgpack_pack_nil(pk);
  assert_int_equal(decode(M(DSPK__M_TASK_RUN), pm_end(&m), v, msg), 0);
  assert_int_equal(v[DSPK__RUN_OP].v.e, DSPK_OP_MAP);
  assert_int_equal(v[DSPK__RUN_INPUTS].v.o->via.array.size, 4);
  assert_string_equal(msg, "");
  pm_free(&m);

  /* cache.clear: a kind list; an unknown kind is echoed cut at 32 bytes. */
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  dspk__pack_str(pk, "kinds");
  msgpack_pack_array(pk, 2);
  dspk__pack_str(pk, "blobs");
  dspk__pack_str(pk, "kernels");
  assert_int_equal(decode(M(DSPK__M_CACHE_CLEAR), pm_end(&m), v, msg), 0);
  assert_int_equal(v[DSPK__CCLEAR_KINDS].v.mask, 5u);
  pm_free(&m);
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  dspk__pack_str(pk, "kinds");
  msgpack_pack_array(pk, 1);
  dspk__pack_str(pk, "nope");
  assert_int_equal(decode(M(DSPK__M_CACHE_CLEAR), pm_end(&m), v, msg), DSPK_EINVAL);
  assert_string_equal(msg, "kinds[0]: unknown kind \"nope\" (kernels, autotune, blobs)");
  pm_free(&m);
}

static void test_options(void **state) {
  const struct dspk__op_desc *k = &dspk__ops[DSPK_OP_KERNEL];
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char msg[256];
  struct pm m;
  msgpack_packer *pk;
  (void)state;

  pk = pm_begin(&m);
  msgpack_pack_map(pk, 4);
  kv_str(pk, "lang", "glsl");
  kv_str(pk, "source", "void main() {}");
  dspk__pack_str(pk, "grid");
  msgpack_pack_array(pk, 2);
  msgpack_pack_uint32(pk, 7);
  msgpack_pack_uint32(pk, 9);
  dspk__pack_str(pk, "shared");
  msgpack_pack_uint64(pk, (uint64_t)UINT32_MAX + 1);
  assert_int_equal(dspk__params_decode(k->options, k->noptions, pm_end(&m), "options.", v, msg,
                                       sizeof msg), DSPK_ERANGE);
  assert_string_equal(msg, "options.shared: 4294967296 is out of range [0, 4294967295]");
  pm_free(&m);

  pk = pm_begin(&m);
  msgpack_pack_map(pk, 3);
  kv_str(pk, "lang", "glsl");
  kv_str(pk, "source", "void main() {}");
  dspk__pack_str(pk, "grid");
  msgpack_pack_array(pk, 2);
  msgpack_pack_uint32(pk, 7);
  msgpack_pack_uint32(pk, 9);
  assert_int_equal(dspk__params_decode(k->options, k->noptions, pm_end(&m), "options.", v, msg,
                                       sizeof msg), 0);
  assert_string_equal(dspk__kernel_langs[v[DSPK__KERNEL_LANG].v.e], "glsl");
  assert_int_equal(v[DSPK__KERNEL_GRID].v.dim[0], 7);
  assert_int_equal(v[DSPK__KERNEL_GRID].v.dim[1], 9);
  assert_int_equal(v[DSPK__KERNEL_GRID].v.dim[2], 1);
  assert_int_equal(v[DSPK__KERNEL_BLOCK].v.dim[2], 1);
  assert_int_equal(v[DSPK__KERNEL_ENTRY].v.s.n, 4); /* "main" */
  {
    union dspk__op_options u;
    memset(&u, 0xff, sizeof u);
    dspk__params_store(k->options, k->noptions, v, &u);
    assert_string_equal(u.kernel.entry, "main");
    assert_int_equal(u.kernel.grid[0], 7);
    assert_int_equal(u.kernel.grid[2], 1);
    assert_int_equal(u.kernel.block[0], 1);
    assert_int_equal(u.kernel.shared_bytes, 0);
  }
  pm_free(&m);

  /* gemm: defaults and given values land in the op's options. */
  pk = pm_begin(&m);
  msgpack_pack_map(pk, 2);
  dspk__pack_str(pk, "trans_b");
  msgpack_pack_true(pk);
  dspk__pack_str(pk, "beta");
  msgpack_pack_int(pk, -2);
  {
    const struct dspk__op_desc *g = &dspk__ops[DSPK_OP_GEMM];
    union dspk__op_options u;
    memset(&u, 0xff, sizeof u);
    assert_int_equal(dspk__params_decode(g->options, g->noptions, pm_end(&m), "options.", v,
                                         msg, sizeof msg), 0);
    dspk__params_store(g->options, g->noptions, v, &u);
    assert_int_equal(u.gemm.trans_a, 0);
    assert_int_equal(u.gemm.trans_b, 1);
    assert_true(u.gemm.alpha == 1.0);
    assert_true(u.gemm.beta == -2.0);
  }
  pm_free(&m);

  pk = pm_begin(&m);
  msgpack_pack_map(pk, 1);
  kv_str(pk, "source", "x");
  assert_int_equal(dspk__params_decode(k->options, k->noptions, pm_end(&m), "options.", v, msg,
                                       sizeof msg), DSPK_EINVAL);
  assert_string_equal(msg, "options.lang: required (a string (cuda, glsl, spirv, hip))");
  pm_free(&m);
}

/* An encoded request decodes back to the same values. */
static void pack_two(const void *ud, struct dspk__wbuf *w) {
  (void)ud;
  msgpack_pack_array(&w->pk, 2);
  msgpack_pack_nil(&w->pk);
  msgpack_pack_nil(&w->pk);
}

static void test_roundtrip(void **state) {
  const struct dspk__method *run = M(DSPK__M_TASK_RUN);
  struct dspk__pval in[DSPK__MAX_PARAMS] = {0}, out[DSPK__MAX_PARAMS];
  struct dspk__wbuf w;
  struct iovec *iov;
  size_t niov, pos = 0, off = 0;
  char flat[512], msg[256];
  msgpack_unpacked up;
  (void)state;

  in[DSPK__RUN_OP] = (struct dspk__pval){.set = true, .v = {.e = DSPK_OP_FFT}};
  in[DSPK__RUN_DEVICE] = (struct dspk__pval){.set = true, .v = {.s = {"cpu:0", 5}}};
  in[DSPK__RUN_INPUTS] = (struct dspk__pval){.set = true, .v = {.pack = {pack_two, NULL}}};
  dspk__wbuf_init(&w);
  dspk__params_encode(&w, run->params, run->nparams, in);
  assert_int_equal(dspk__wbuf_iov(&w, &iov, &niov), 0);
  for (size_t i = 0; i < niov; i++) {
    memcpy(flat + pos, iov[i].iov_base, iov[i].iov_len);
    pos += iov[i].iov_len;
  }
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, flat, pos, &off), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(up.data.via.map.size, 3);
  assert_int_equal(dspk__params_decode(run->params, run->nparams, &up.data, NULL, out, msg,
                                       sizeof msg), 0);
  assert_int_equal(out[DSPK__RUN_OP].v.e, DSPK_OP_FFT);
  assert_true(out[DSPK__RUN_DEVICE].set);
  assert_memory_equal(out[DSPK__RUN_DEVICE].v.s.p, "cpu:0", 5);
  assert_int_equal(out[DSPK__RUN_INPUTS].v.o->via.array.size, 2);
  assert_false(out[DSPK__RUN_OPTIONS].set);
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);
}

/* Packs w's frames into flat (at most cap bytes) and decodes the one object. */
static void unpack_wbuf(struct dspk__wbuf *w, char *flat, size_t cap, msgpack_unpacked *up) {
  struct iovec *iov;
  size_t niov, pos = 0, off = 0;
  assert_int_equal(dspk__wbuf_iov(w, &iov, &niov), 0);
  for (size_t i = 0; i < niov; i++) {
    assert_true(pos + iov[i].iov_len <= cap);
    memcpy(flat + pos, iov[i].iov_base, iov[i].iov_len);
    pos += iov[i].iov_len;
  }
  msgpack_unpacked_init(up);
  assert_int_equal(msgpack_unpack_next(up, flat, pos, &off), MSGPACK_UNPACK_SUCCESS);
}

static int released;
static void on_release(void *ud) { released += *(int *)ud; }

static void pack_none(const void *ud, struct dspk__wbuf *w);

/* task.run's outputs: two tensors, f32 [] inline and written to buffer 1. */
static void pack_two_outputs(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval t[DSPK__OUT_COUNT] = {
      [DSPK__OUT_DTYPE] = dspk__pv_enum(DSPK_F32),
      [DSPK__OUT_SHAPE] = dspk__pv_pack(pack_none, NULL),
      [DSPK__OUT_DATA] = dspk__pv_bin("\0\0\0\0", 4, NULL, NULL)};
  (void)ud;
  msgpack_pack_array(&w->pk, 2);
  dspk__map_encode(w, dspk__out_tensor_f, DSPK__OUT_COUNT, t);
  t[DSPK__OUT_DATA].set = false;
  t[DSPK__OUT_BUFFER] = dspk__pv_uint(1);
  t[DSPK__OUT_OFFSET] = dspk__pv_uint(0);
  dspk__map_encode(w, dspk__out_tensor_f, DSPK__OUT_COUNT, t);
}

/* The result encoder and decoder: task.run's result packed in two steps
 * (time_us last) decodes with every field and its type; a result without a
 * field the table marks always there is EPROTO naming it; job.end's
 * optional counts may be absent; a bin field's release runs once written;
 * a field of another type is EPROTO naming it. */
static void test_results(void **state) {
  const struct dspk__method *run = M(DSPK__M_TASK_RUN), *end = M(DSPK__M_JOB_END);
  const struct dspk__method *rd = M(DSPK__M_BUFFER_READ);
  struct dspk__pval v[DSPK__MAX_PARAMS] = {0}, out[DSPK__MAX_PARAMS];
  struct dspk__wbuf w;
  char flat[512], msg[256];
  msgpack_unpacked up;
  int one = 1;
  (void)state;

  v[DSPK__R_RUN_DEVICE] = dspk__pv_str("cpu:0");
  v[DSPK__R_RUN_OUTPUTS] = dspk__pv_pack(pack_two_outputs, NULL);
  v[DSPK__R_RUN_TIME_US] = dspk__pv_uint(0);
  dspk__wbuf_init(&w);
  dspk__result_head(&w, run, v);
  dspk__result_fields(&w, run, v, 0, DSPK__R_RUN_TIME_US);
  v[DSPK__R_RUN_TIME_US] = dspk__pv_uint(42);
  dspk__result_fields(&w, run, v, DSPK__R_RUN_TIME_US, DSPK__R_RUN_TIME_US + 1);
  unpack_wbuf(&w, flat, sizeof flat, &up);
  assert_int_equal(up.data.via.map.size, 3);
  assert_int_equal(dspk__result_decode(run, &up.data, out, msg, sizeof msg), 0);
  assert_memory_equal(out[DSPK__R_RUN_DEVICE].v.s.p, "cpu:0", 5);
  assert_int_equal(out[DSPK__R_RUN_OUTPUTS].v.o->via.array.size, 2);
  assert_int_equal(out[DSPK__R_RUN_TIME_US].v.u, 42);
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);

  /* Without time_us. */
  dspk__wbuf_init(&w);
  v[DSPK__R_RUN_TIME_US].set = false;
  dspk__result_encode(&w, run, v);
  unpack_wbuf(&w, flat, sizeof flat, &up);
  assert_int_equal(dspk__result_decode(run, &up.data, out, msg, sizeof msg), DSPK_EPROTO);
  assert_non_null(strstr(msg, "result.time_us"));
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);

  /* job.end of a job never registered: job and ended only. */
  memset(v, 0, sizeof v);
  v[DSPK__R_JEND_JOB] = dspk__pv_uint(7);
  v[DSPK__R_JEND_ENDED] = dspk__pv_bool(false);
  dspk__wbuf_init(&w);
  dspk__result_encode(&w, end, v);
  unpack_wbuf(&w, flat, sizeof flat, &up);
  assert_int_equal(up.data.via.map.size, 2);
  assert_int_equal(dspk__result_decode(end, &up.data, out, msg, sizeof msg), 0);
  assert_int_equal(out[DSPK__R_JEND_JOB].v.u, 7);
  assert_false(out[DSPK__R_JEND_ENDED].v.b);
  assert_false(out[DSPK__R_JEND_BUFFERS].set);
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);

  /* buffer.read's data by reference, released once; a str where the
   * table says uint is EPROTO. */
  memset(v, 0, sizeof v);
  released = 0;
  v[DSPK__R_BREAD_DATA] = dspk__pv_bin("abc", 3, on_release, &one);
  dspk__wbuf_init(&w);
  dspk__result_encode(&w, rd, v);
  unpack_wbuf(&w, flat, sizeof flat, &up);
  assert_int_equal(dspk__result_decode(rd, &up.data, out, msg, sizeof msg), 0);
  assert_int_equal(out[DSPK__R_BREAD_DATA].v.s.n, 3);
  assert_memory_equal(out[DSPK__R_BREAD_DATA].v.s.p, "abc", 3);
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);
  assert_int_equal(released, 1);

  /* hello's daemon (a str) read as status' daemon (a map). */
  memset(v, 0, sizeof v);
  v[DSPK__R_HELLO_DAEMON] = dspk__pv_str("0.1");
  dspk__wbuf_init(&w);
  dspk__result_encode(&w, M(DSPK__M_HELLO), v);
  unpack_wbuf(&w, flat, sizeof flat, &up);
  assert_int_equal(dspk__result_decode(M(DSPK__M_STATUS), &up.data, out, msg, sizeof msg),
                   DSPK_EPROTO);
  assert_non_null(strstr(msg, "result.daemon"));
  msgpack_unpacked_destroy(&up);
  dspk__wbuf_free(&w);
}

/* Flattens w's frames into flat (at most cap bytes): the bytes written. */
static size_t wbuf_flat(struct dspk__wbuf *w, char *flat, size_t cap) {
  struct iovec *iov;
  size_t niov, pos = 0;
  assert_int_equal(dspk__wbuf_iov(w, &iov, &niov), 0);
  for (size_t i = 0; i < niov; i++) {
    assert_true(pos + iov[i].iov_len <= cap);
    memcpy(flat + pos, iov[i].iov_base, iov[i].iov_len);
    pos += iov[i].iov_len;
  }
  return pos;
}

/* A device of devices: ops {gemm: [f32, f64]}, memory from ud (NULL: a
 * str, of the wrong type). */
static void pack_ops(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval dt = dspk__pv_mask((1u << DSPK_F32) | (1u << DSPK_F64));
  (void)ud;
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "gemm");
  dspk__value_encode(w, dspk__device_f[DSPK__DEV_OPS].item, &dt);
}

static void pack_devices(const void *ud, struct dspk__wbuf *w) {
  const uint64_t *memory = ud;
  struct dspk__pval v[DSPK__DEV_COUNT];
  v[DSPK__DEV_ID] = dspk__pv_str("cpu:0");
  v[DSPK__DEV_BACKEND] = dspk__pv_str("cpu");
  v[DSPK__DEV_NAME] = dspk__pv_str("x86");
  v[DSPK__DEV_TYPE] = dspk__pv_str("cpu");
  v[DSPK__DEV_ARCH] = dspk__pv_str("");
  v[DSPK__DEV_DRIVER] = dspk__pv_str("");
  v[DSPK__DEV_UUID] = dspk__pv_str("");
  v[DSPK__DEV_MEMORY] = memory ? dspk__pv_uint(*memory) : (struct dspk__pval){0};
  v[DSPK__DEV_MAX_TENSOR_BYTES] = dspk__pv_uint(1u << 27);
  v[DSPK__DEV_SOFTWARE] = dspk__pv_bool(false);
  v[DSPK__DEV_OPS] = dspk__pv_pack(pack_ops, NULL);
  v[DSPK__DEV_KERNEL_LANGS] = dspk__pv_mask(1u << 1); /* glsl */
  msgpack_pack_array(&w->pk, 1);
  if (!memory) {
    /* memory of another type, packed by hand */
    msgpack_pack_map(&w->pk, DSPK__DEV_COUNT);
    for (int i = 0; i < DSPK__DEV_COUNT; i++) {
      dspk__pack_str(&w->pk, dspk__device_f[i].name);
      if (i == DSPK__DEV_MEMORY)
        dspk__pack_str(&w->pk, "lots");
      else
        dspk__value_encode(w, &dspk__device_f[i], &v[i]);
    }
    return;
  }
  dspk__map_encode(w, dspk__device_f, DSPK__DEV_COUNT, v);
}

static void pack_none(const void *ud, struct dspk__wbuf *w) {
  (void)ud;
  msgpack_pack_array(&w->pk, 0);
}

/* One status client: uid -1 (an int), job nil or a str (wrong). */
static void pack_clients(const void *ud, struct dspk__wbuf *w) {
  bool bad = ud != NULL;
  struct dspk__pval v[DSPK__SC_COUNT];
  for (int i = 0; i < DSPK__SC_COUNT; i++)
    v[i] = dspk__pv_uint(3);
  v[DSPK__SC_PID] = dspk__pv_int(-1);
  v[DSPK__SC_UID] = dspk__pv_int(-1);
  v[DSPK__SC_GID] = dspk__pv_int(-1);
  v[DSPK__SC_NAME] = dspk__pv_str("");
  v[DSPK__SC_SELF] = dspk__pv_bool(true);
  v[DSPK__SC_JOB] = dspk__pv_nil();
  msgpack_pack_array(&w->pk, 1);
  if (!bad) {
    dspk__map_encode(w, dspk__st_client_f, DSPK__SC_COUNT, v);
    return;
  }
  msgpack_pack_map(&w->pk, DSPK__SC_COUNT);
  for (int i = 0; i < DSPK__SC_COUNT; i++) {
    dspk__pack_str(&w->pk, dspk__st_client_f[i].name);
    if (i == DSPK__SC_JOB)
      dspk__pack_str(&w->pk, "slurm");
    else
      dspk__value_encode(w, &dspk__st_client_f[i], &v[i]);
  }
}

/* status' daemon (with its limits) and other_clients. */
static void pack_limits(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval v[DSPK__LIM_COUNT];
  (void)ud;
  for (int i = 0; i < DSPK__LIM_COUNT; i++)
    v[i] = dspk__pv_uint(1);
  dspk__map_encode(w, dspk__limits_f, DSPK__LIM_COUNT, v);
}

static void pack_daemon(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval v[DSPK__SD_COUNT];
  (void)ud;
  v[DSPK__SD_VERSION] = dspk__pv_str("0.1");
  v[DSPK__SD_PID] = dspk__pv_int(12);
  v[DSPK__SD_UPTIME_S] = dspk__pv_uint(3);
  v[DSPK__SD_SOCKET] = dspk__pv_str("/run/dspk.sock");
  v[DSPK__SD_CONNECTIONS] = dspk__pv_uint(1);
  v[DSPK__SD_STOPPING] = dspk__pv_bool(false);
  v[DSPK__SD_LIMITS] = dspk__pv_pack(pack_limits, NULL);
  dspk__map_encode(w, dspk__st_daemon_f, DSPK__SD_COUNT, v);
}

static void pack_other(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval v[DSPK__SO_COUNT] = {dspk__pv_uint(0), dspk__pv_uint(0), dspk__pv_uint(0)};
  (void)ud;
  dspk__map_encode(w, dspk__st_other_f, DSPK__SO_COUNT, v);
}

/* cache.stats' kinds: blobs with entries a str when ud is not NULL. */
static void pack_kinds(const void *ud, struct dspk__wbuf *w) {
  struct dspk__pval v[DSPK__CK_COUNT];
  msgpack_pack_map(&w->pk, 1);
  dspk__pack_str(&w->pk, "blobs");
  for (int i = 0; i < DSPK__CK_COUNT; i++)
    v[i] = dspk__pv_uint((uint64_t)i);
  if (ud)
    v[DSPK__CK_ENTRIES] = dspk__pv_str("many");
  else
    v[DSPK__CK_ENTRIES] = dspk__pv_uint(0);
  /* entries as str through a STR row of the same name (bad case) */
  if (ud) {
    static const struct dspk__param as_str[DSPK__CK_COUNT] = {
        [DSPK__CK_ENTRIES] = {"entries", DSPK__T_STR}, [DSPK__CK_BYTES] = {"bytes", DSPK__T_UINT},
        [DSPK__CK_STORED_HITS] = {"stored_hits", DSPK__T_UINT},
        [DSPK__CK_HITS] = {"hits", DSPK__T_UINT}, [DSPK__CK_MISSES] = {"misses", DSPK__T_UINT},
        [DSPK__CK_PUTS] = {"puts", DSPK__T_UINT},
        [DSPK__CK_EVICTIONS] = {"evictions", DSPK__T_UINT},
        [DSPK__CK_PUT_ERRORS] = {"put_errors", DSPK__T_UINT}};
    dspk__map_encode(w, as_str, DSPK__CK_COUNT, v);
    return;
  }
  dspk__map_encode(w, dspk__cache_kind_f, DSPK__CK_COUNT, v);
}

/* Method m's result encoded with vals, decoded back (it must decode), and
 * item 0 of its array field r read against fields into f (valid until
 * decoded_free). */
struct decoded {
  struct dspk__wbuf w;
  char flat[2048];
  msgpack_unpacked up;
};

static void encode_unpack(struct decoded *d, const struct dspk__method *m,
                          const struct dspk__pval *vals) {
  dspk__wbuf_init(&d->w);
  dspk__result_encode(&d->w, m, vals);
  unpack_wbuf(&d->w, d->flat, sizeof d->flat, &d->up);
}

static void decode_item0(struct decoded *d, const struct dspk__method *m,
                         const struct dspk__pval *vals, int r, const struct dspk__param *fields,
                         int n, struct dspk__pval *f) {
  struct dspk__pval out[DSPK__MAX_PARAMS];
  char msg[256];
  encode_unpack(d, m, vals);
  assert_int_equal(dspk__result_decode(m, &d->up.data, out, msg, sizeof msg), 0);
  assert_int_equal(dspk__params_decode(fields, n, &out[r].v.o->via.array.ptr[0], NULL, f, msg,
                                       sizeof msg), 0);
}

static void decoded_free(struct decoded *d) {
  msgpack_unpacked_destroy(&d->up);
  dspk__wbuf_free(&d->w);
}

/* Encodes method m's result with vals and decodes it back: the code, with
 * the message in msg (256 bytes). */
static int nested_roundtrip(const struct dspk__method *m, const struct dspk__pval *vals,
                            struct dspk__pval *out, char *msg) {
  struct decoded d;
  int rc;
  encode_unpack(&d, m, vals);
  rc = dspk__result_decode(m, &d.up.data, out, msg, 256);
  decoded_free(&d);
  return rc;
}

/* Nested result maps: dspk__map_encode packs the same bytes as the
 * hand-written packing it replaces (keys, order, types); the decoder checks
 * fields at any depth (in array items, in the values of a map keyed by
 * names) and names the path of a wrong one; nil where the table allows it;
 * a negative int; a field missing from a nested map. */
static void test_nested(void **state) {
  struct dspk__pval v[DSPK__MAX_PARAMS] = {0}, out[DSPK__MAX_PARAMS];
  struct dspk__pval f[DSPK__MAX_FIELDS];
  struct dspk__wbuf w;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  char flat[1024], msg[256];
  uint64_t memory = 1ull << 40;
  size_t n;
  struct decoded d;
  (void)state;

  /* The bytes of hello's limits, by the table and by hand. */
  for (int i = 0; i < DSPK__LIM_COUNT; i++)
    f[i] = dspk__pv_uint(1000u * (unsigned)i + 7);
  dspk__wbuf_init(&w);
  dspk__map_encode(&w, dspk__limits_f, DSPK__LIM_COUNT, f);
  n = wbuf_flat(&w, flat, sizeof flat);
  dspk__wbuf_free(&w);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 10);
  dspk__pack_kv_u64(&pk, "max_message", 7);
  dspk__pack_kv_u64(&pk, "max_depth", 1007);
  dspk__pack_kv_u64(&pk, "max_objects", 2007);
  dspk__pack_kv_u64(&pk, "max_rank", 3007);
  dspk__pack_kv_u64(&pk, "max_elements", 4007);
  dspk__pack_kv_u64(&pk, "max_inflight", 5007);
  dspk__pack_kv_u64(&pk, "max_unsent", 6007);
  dspk__pack_kv_u64(&pk, "max_buffers", 7007);
  dspk__pack_kv_u64(&pk, "max_clients", 8007);
  dspk__pack_kv_u64(&pk, "cpu_memory_quota", 9007);
  assert_int_equal(n, sb.size);
  assert_memory_equal(flat, sb.data, n);
  msgpack_sbuffer_destroy(&sb);

  /* A status client by the table and by hand: ints, a nil. */
  dspk__wbuf_init(&w);
  pack_clients(NULL, &w);
  n = wbuf_flat(&w, flat, sizeof flat);
  dspk__wbuf_free(&w);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 12);
  dspk__pack_kv_u64(&pk, "id", 3);
  dspk__pack_kv_i64(&pk, "pid", -1);
  dspk__pack_kv_i64(&pk, "uid", -1);
  dspk__pack_kv_i64(&pk, "gid", -1);
  dspk__pack_kv_str(&pk, "name", "");
  dspk__pack_kv_u64(&pk, "inflight", 3);
  dspk__pack_kv_u64(&pk, "buffers", 3);
  dspk__pack_kv_u64(&pk, "buffer_bytes", 3);
  dspk__pack_kv_u64(&pk, "unsent", 3);
  dspk__pack_kv_u64(&pk, "requests", 3);
  dspk__pack_kv_bool(&pk, "self", true);
  dspk__pack_str(&pk, "job");
  msgpack_pack_nil(&pk);
  assert_int_equal(n, sb.size);
  assert_memory_equal(flat, sb.data, n);
  msgpack_sbuffer_destroy(&sb);

  /* A str field packs as dspk__pack_str: a byte that starts no UTF-8
   * character becomes U+FFFD. */
  f[0] = dspk__pv_str("a\xff\xc3\xa9");
  dspk__wbuf_init(&w);
  dspk__value_encode(&w, &dspk__device_f[DSPK__DEV_NAME], &f[0]);
  n = wbuf_flat(&w, flat, sizeof flat);
  dspk__wbuf_free(&w);
  assert_int_equal(n, 1 + 6);
  assert_memory_equal(flat, "\xa6" "a\xef\xbf\xbd\xc3\xa9", n);

  /* devices: a device decodes, its fields typed; memory a str is EPROTO
   * naming its path. */
  v[DSPK__R_DEVICES_DEVICES] = dspk__pv_pack(pack_devices, &memory);
  v[DSPK__R_DEVICES_UNAVAILABLE] = dspk__pv_pack(pack_none, NULL);
  decode_item0(&d, M(DSPK__M_DEVICES), v, DSPK__R_DEVICES_DEVICES, dspk__device_f,
               DSPK__DEV_COUNT, f);
  assert_int_equal(f[DSPK__DEV_MEMORY].v.u, memory);
  assert_memory_equal(f[DSPK__DEV_ID].v.s.p, "cpu:0", 5);
  assert_int_equal(f[DSPK__DEV_KERNEL_LANGS].v.mask, 1u << 1);
  assert_int_equal(f[DSPK__DEV_OPS].v.o->via.map.size, 1);
  decoded_free(&d);
  v[DSPK__R_DEVICES_DEVICES] = dspk__pv_pack(pack_devices, NULL);
  assert_int_equal(nested_roundtrip(M(DSPK__M_DEVICES), v, out, msg), DSPK_EPROTO);
  assert_string_equal(msg, "result.devices[0].memory: expected a non-negative integer, got a string of 4 bytes");

  /* status: without daemon, EPROTO naming it; clients[0].job nil and
   * uid -1 decode as such; job a str is EPROTO naming its path. */
  memset(v, 0, sizeof v);
  v[DSPK__R_STATUS_CLIENTS] = dspk__pv_pack(pack_clients, NULL);
  v[DSPK__R_STATUS_OTHER_CLIENTS] = dspk__pv_pack(pack_other, NULL);
  v[DSPK__R_STATUS_JOBS] = dspk__pv_pack(pack_none, NULL);
  v[DSPK__R_STATUS_DEVICES] = dspk__pv_pack(pack_none, NULL);
  assert_int_equal(nested_roundtrip(M(DSPK__M_STATUS), v, out, msg), DSPK_EPROTO);
  assert_string_equal(msg, "result.daemon: required (a map)");
  v[DSPK__R_STATUS_DAEMON] = dspk__pv_pack(pack_daemon, NULL);
  decode_item0(&d, M(DSPK__M_STATUS), v, DSPK__R_STATUS_CLIENTS, dspk__st_client_f,
               DSPK__SC_COUNT, f);
  assert_true(f[DSPK__SC_JOB].set && f[DSPK__SC_JOB].nil);
  assert_int_equal(f[DSPK__SC_UID].v.i, -1);
  assert_false(f[DSPK__SC_ID].nil);
  decoded_free(&d);
  v[DSPK__R_STATUS_CLIENTS] = dspk__pv_pack(pack_clients, "bad");
  assert_int_equal(nested_roundtrip(M(DSPK__M_STATUS), v, out, msg), DSPK_EPROTO);
  assert_string_equal(msg, "result.clients[0].job: expected a non-negative integer, got a string of 5 bytes");

  /* cache.stats: kinds.blobs.entries of another type is named. */
  memset(v, 0, sizeof v);
  v[DSPK__R_CSTATS_PATH] = dspk__pv_str(":memory:");
  v[DSPK__R_CSTATS_IN_MEMORY] = dspk__pv_bool(true);
  v[DSPK__R_CSTATS_MAX_BYTES] = dspk__pv_uint(1);
  v[DSPK__R_CSTATS_FILE_BYTES] = dspk__pv_uint(0);
  v[DSPK__R_CSTATS_KINDS] = dspk__pv_pack(pack_kinds, NULL);
  assert_int_equal(nested_roundtrip(M(DSPK__M_CACHE_STATS), v, out, msg), 0);
  v[DSPK__R_CSTATS_KINDS] = dspk__pv_pack(pack_kinds, "bad");
  assert_int_equal(nested_roundtrip(M(DSPK__M_CACHE_STATS), v, out, msg), DSPK_EPROTO);
  assert_string_equal(msg, "result.kinds.blobs.entries: expected a non-negative integer, got a string of 4 bytes");
}

/* The packing by the table and the reference bytes packed by hand: equal. */
#define BIG_BYTES 8192 /* inline data sent by reference (proto/codec.c copies less than 1 KiB) */
static void assert_same_bytes(struct dspk__wbuf *w, msgpack_sbuffer *sb) {
  static char flat[BIG_BYTES * 2];
  size_t n = wbuf_flat(w, flat, sizeof flat);
  assert_int_equal(n, sb->size);
  assert_memory_equal(flat, sb->data, n);
}

static void count_release(void *ud) { ++*(int *)ud; }

/* A task.run output tensor's shape [3, 2]. */
static void pack_shape32(const void *ud, struct dspk__wbuf *w) {
  (void)ud;
  msgpack_pack_array(&w->pk, 2);
  msgpack_pack_int64(&w->pk, 3);
  msgpack_pack_int64(&w->pk, 2);
}

/* result decoded from msgpack bytes against method m: the code, msg. */
static int decode_bytes(enum dspk__method_id m, const char *bytes, size_t n, char *msg) {
  struct dspk__pval out[DSPK__MAX_PARAMS];
  msgpack_unpacked up;
  int rc;
  msgpack_unpacked_init(&up);
  assert_int_equal(msgpack_unpack_next(&up, bytes, n, NULL), MSGPACK_UNPACK_SUCCESS);
  rc = dspk__result_decode(&dspk__methods[m], &up.data, out, msg, 256);
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* task.run's output tensors: dspk__map_encode over dspk__out_tensor_f packs
 * the bytes the daemon packed by hand before (dspk__pack_tensor_meta, then
 * data or buffer and offset); large inline data stays a reference to the
 * caller's memory (no copy), released once; the decoder checks each output
 * and names the path of a wrong field. */
static void test_run_outputs(void **state) {
  static char big[BIG_BYTES];
  static const char bad_out[] = "\x83\xa6" "device" "\xa5" "cpu:0" "\xa7" "outputs"
                                "\x91\x83\xa5" "dtype" "\xa3" "f99" "\xa5" "shape" "\x90"
                                "\xa4" "data" "\xc4\x00" "\xa7" "time_us" "\x01";
  const int64_t shape[2] = {3, 2};
  struct dspk__pval f[DSPK__MAX_FIELDS];
  struct dspk__wbuf w;
  struct iovec *iov;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  size_t niov;
  int freed = 0;
  bool by_ref = false;
  char msg[256];
  (void)state;

  /* An inline output: {dtype, shape, data}, data sent from big itself. */
  memset(f, 0, sizeof f);
  f[DSPK__OUT_DTYPE] = dspk__pv_enum(DSPK_C64);
  f[DSPK__OUT_SHAPE] = dspk__pv_pack(pack_shape32, NULL);
  f[DSPK__OUT_DATA] = dspk__pv_bin(big, sizeof big, count_release, &freed);
  dspk__wbuf_init(&w);
  dspk__map_encode(&w, dspk__out_tensor_f, DSPK__OUT_COUNT, f);
  assert_int_equal(dspk__wbuf_iov(&w, &iov, &niov), 0);
  for (size_t i = 0; i < niov; i++)
    by_ref |= iov[i].iov_base == (void *)big && iov[i].iov_len == sizeof big;
  assert_true(by_ref);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  dspk__pack_tensor_meta(&pk, DSPK_C64, 2, shape);
  dspk__pack_str(&pk, "data");
  msgpack_pack_bin(&pk, sizeof big);
  msgpack_pack_bin_body(&pk, big, sizeof big);
  assert_same_bytes(&w, &sb);
  msgpack_sbuffer_destroy(&sb);
  dspk__wbuf_free(&w);
  assert_int_equal(freed, 1);

  /* An output written to a buffer: {dtype, shape, buffer, offset}. */
  memset(f, 0, sizeof f);
  f[DSPK__OUT_DTYPE] = dspk__pv_enum(DSPK_F32);
  f[DSPK__OUT_SHAPE] = dspk__pv_pack(pack_shape32, NULL);
  f[DSPK__OUT_BUFFER] = dspk__pv_uint(7);
  f[DSPK__OUT_OFFSET] = dspk__pv_uint(4096);
  dspk__wbuf_init(&w);
  dspk__map_encode(&w, dspk__out_tensor_f, DSPK__OUT_COUNT, f);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  dspk__pack_tensor_meta(&pk, DSPK_F32, 2, shape);
  dspk__pack_kv_u64(&pk, "buffer", 7);
  dspk__pack_kv_u64(&pk, "offset", 4096);
  assert_same_bytes(&w, &sb);
  msgpack_sbuffer_destroy(&sb);
  dspk__wbuf_free(&w);

  /* An output's dtype outside the list is EPROTO naming its path. */
  assert_int_equal(decode_bytes(DSPK__M_TASK_RUN, bad_out, sizeof bad_out - 1, msg),
                   DSPK_EPROTO);
  assert_non_null(strstr(msg, "result.outputs[0].dtype: unknown dtype \"f99\""));
}

/* trace's job records: dspk__map_encode over dspk__trace_job_f packs the
 * bytes the daemon packed by hand before (nil job, a task's phases only
 * once reached); a record without device is EPROTO naming its path. */
static void test_trace_jobs(void **state) {
  static const char bad_job[] = "\x85\xa8" "start_us" "\x00\xa6" "end_us" "\x00"
                                "\xa7" "dropped" "\x00\xa7" "devices" "\x90"
                                "\xa4" "jobs" "\x91\x80";
  struct dspk__pval f[DSPK__MAX_FIELDS];
  struct dspk__wbuf w;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  char msg[256];
  (void)state;

  /* A task that tuned and failed, of a client without a Slurm job. */
  memset(f, 0, sizeof f);
  f[DSPK__TJ_DEVICE] = dspk__pv_str("cpu:0");
  f[DSPK__TJ_KIND] = dspk__pv_str("task");
  f[DSPK__TJ_NAME] = dspk__pv_str("gemm");
  f[DSPK__TJ_CLIENT] = dspk__pv_uint(3);
  f[DSPK__TJ_JOB] = dspk__pv_nil();
  f[DSPK__TJ_MSGID] = dspk__pv_uint(70000);
  f[DSPK__TJ_ERROR] = dspk__pv_str("ECANCELED");
  f[DSPK__TJ_RUNNING] = dspk__pv_bool(false);
  f[DSPK__TJ_QUEUED_US] = dspk__pv_uint(1000);
  f[DSPK__TJ_START_US] = dspk__pv_uint(1100);
  f[DSPK__TJ_END_US] = dspk__pv_uint(5000000000ull);
  f[DSPK__TJ_UPLOAD_END_US] = dspk__pv_uint(1200);
  f[DSPK__TJ_TUNE_START_US] = dspk__pv_uint(1300);
  f[DSPK__TJ_TUNE_END_US] = dspk__pv_uint(1400);
  dspk__wbuf_init(&w);
  dspk__map_encode(&w, dspk__trace_job_f, DSPK__TJ_COUNT, f);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 14);
  dspk__pack_kv_str(&pk, "device", "cpu:0");
  dspk__pack_kv_str(&pk, "kind", "task");
  dspk__pack_kv_str(&pk, "name", "gemm");
  dspk__pack_kv_u64(&pk, "client", 3);
  dspk__pack_str(&pk, "job");
  msgpack_pack_nil(&pk);
  dspk__pack_kv_u64(&pk, "msgid", 70000);
  dspk__pack_kv_str(&pk, "error", "ECANCELED");
  dspk__pack_kv_bool(&pk, "running", false);
  dspk__pack_kv_u64(&pk, "queued_us", 1000);
  dspk__pack_kv_u64(&pk, "start_us", 1100);
  dspk__pack_kv_u64(&pk, "end_us", 5000000000ull);
  dspk__pack_kv_u64(&pk, "upload_end_us", 1200);
  dspk__pack_kv_u64(&pk, "tune_start_us", 1300);
  dspk__pack_kv_u64(&pk, "tune_end_us", 1400);
  assert_same_bytes(&w, &sb);
  msgpack_sbuffer_destroy(&sb);
  dspk__wbuf_free(&w);

  assert_int_equal(decode_bytes(DSPK__M_TRACE, bad_job, sizeof bad_job - 1, msg), DSPK_EPROTO);
  assert_string_equal(msg, "result.jobs[0].device: required (a string)");
}

/* A nested table's rows: named (items unnamed), within DSPK__MAX_FIELDS. */
static void check_rows(const struct dspk__param *ps, int n, int depth) {
  assert_true(depth < 6);
  assert_true(n <= DSPK__MAX_FIELDS);
  for (int k = 0; k < n; k++) {
    const struct dspk__param *p = &ps[k];
    assert_non_null(p->name);
    assert_true(*p->name);
    assert_true(!p->fields || p->type == DSPK__T_MAP);
    assert_true(!p->keys || (p->type == DSPK__T_MAP && p->item && !p->fields));
    if (p->fields)
      check_rows(p->fields, p->nfields, depth + 1);
    if (p->item) {
      assert_string_equal(p->item->name, "");
      if (p->item->fields)
        check_rows(p->item->fields, p->item->nfields, depth + 1);
    }
  }
}

static void test_table(void **state) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f;
  (void)state;
  for (int i = 0; i < DSPK__M_COUNT; i++) {
    const struct dspk__method *m = &dspk__methods[i];
    assert_non_null(m->name);
    assert_ptr_equal(dspk__method_find(m->name, strlen(m->name)), m);
    assert_true(m->nparams <= DSPK__MAX_PARAMS);
    for (int k = 0; k < m->nparams; k++)
      assert_non_null(m->params[k].name); /* no hole in the designated rows */
    assert_true(m->nresults <= DSPK__MAX_PARAMS);
    assert_true(m->results || m->nresults == 0);
    for (int k = 0; k < m->nresults; k++)
      assert_non_null(m->results[k].name);
    check_rows(m->results, m->nresults, 0);
  }
  for (int i = 0; i < DSPK_OP_COUNT; i++) {
    assert_true(dspk__ops[i].noptions <= DSPK__MAX_PARAMS);
    for (int k = 0; k < dspk__ops[i].noptions; k++) {
      const struct dspk__param *p = &dspk__ops[i].options[k];
      assert_non_null(p->name);
      /* Stored rows are of a storable type, inside the union. */
      if (p->at)
        assert_true(p->type <= DSPK__T_STR || p->type == DSPK__T_ENUM ||
                    p->type == DSPK__T_DIM3);
      assert_true(p->at <= sizeof(union dspk__op_options));
    }
    assert_int_equal(dspk__choice_find(dspk__op_names, dspk__op_name((dspk_op)i),
                                       strlen(dspk__op_name((dspk_op)i))), i);
  }
  assert_null(dspk__method_find("nope", 4));
  assert_string_equal(dspk__op_name(DSPK_OP_COUNT), "?");
  assert_string_equal(dspk__reduce_names[DSPK_REDUCE_MEAN], "mean");
  assert_string_equal(dspk__mapfn_names[DSPK_MAP_EXP], "exp");
  f = open_memstream(&buf, &len);
  assert_non_null(f);
  assert_int_equal(dspk__schema_json(f), 0);
  fclose(f);
  assert_non_null(strstr(buf, "\"name\": \"task.run\""));
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults), cmocka_unit_test(test_types),
      cmocka_unit_test(test_options),  cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_table),       cmocka_unit_test(test_results),
      cmocka_unit_test(test_nested), cmocka_unit_test(test_trace_jobs),
      cmocka_unit_test(test_run_outputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
