/*
 * Unit tests of the protocol's table and its generic decoder and encoder
 * (proto/schema.c): defaults for absent and nil keys, every type's wrong
 * value with its code and message, ranges at and one past their bounds,
 * enums and enum lists, what an encoded request decodes back to, the name
 * lookups, and that the table is well formed (indices match names, no
 * method or op over DSPK__MAX_PARAMS, the JSON export parses as one
 * document).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  assert_string_equal(msg, "all: expected a boolean");
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
  assert_string_equal(msg, "msgid: expected the uint32 msgid of a request");
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
  assert_string_equal(msg, "inputs: expected a non-empty array of at most 4 tensors");
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
  assert_string_equal(msg, "options.lang: required (cuda, glsl, spirv, hip)");
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
  v[DSPK__R_RUN_OUTPUTS] = dspk__pv_pack(pack_two, NULL);
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
