/*
 * The message decoder as the daemon runs it on a request (daemon/conn.c's
 * conn_frame): frame scan, msgpack_unpack, dspk__msg_parse, then every
 * typed getter and dspk__tensor_decode on every params value (and on every
 * element of an array value, as task.run's inputs), the schema decoder of
 * proto/schema.c with every method's table and every op's options table,
 * and the answer packed
 * back through a dspk__wbuf.  Oracles: accepted envelopes are well formed;
 * decoded pointers stay inside the frame; the packed answer is a frame the
 * scanner and dspk__msg_parse accept, with the request's msgid.
 */
#include <msgpack.h>
#include <string.h>

#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/frame.h"
#include "proto/schema.h"
#include "tests/fuzz/fuzz_common.h"

static const uint8_t *frame_lo, *frame_hi;

static void check_inside(const void *p, size_t n) {
  if (!n)
    return;
  FUZZ_CHECK((const uint8_t *)p >= frame_lo && (const uint8_t *)p + n <= frame_hi);
}

static void visit_value(const msgpack_object *v, const struct dspk__limits *lim) {
  struct dspk__wire_tensor t;
  char msg[256];
  uint64_t u;
  int64_t i;
  double f;
  bool b;
  const char *s;
  const void *p;
  size_t n;
  char buf[64];

  (void)dspk__obj_u64(v, &u);
  (void)dspk__obj_i64(v, &i);
  (void)dspk__obj_f64(v, &f);
  (void)dspk__obj_bool(v, &b);
  if (dspk__obj_str(v, &s, &n) == 0)
    check_inside(s, n);
  if (dspk__obj_bin(v, &p, &n) == 0)
    check_inside(p, n);
  if (dspk__obj_strcpy(v, buf, sizeof buf) == 0)
    FUZZ_CHECK(memchr(buf, 0, sizeof buf) != NULL);
  msg[0] = '\0';
  if (dspk__tensor_decode(v, lim, &t, msg, sizeof msg) == 0) {
    uint64_t numel = 1;
    FUZZ_CHECK(t.rank <= lim->max_rank && t.rank <= DSPK_MAX_RANK);
    for (unsigned k = 0; k < t.rank; k++) {
      FUZZ_CHECK(t.shape[k] >= 0);
      numel *= (uint64_t)t.shape[k];
    }
    FUZZ_CHECK(numel <= lim->max_elements);
    FUZZ_CHECK(t.nbytes == numel * dspk__dtype_size(t.dtype));
    if (t.is_ref)
      FUZZ_CHECK((dspk__tensor_offset_check(&t, msg, sizeof msg) == 0) ==
                 (t.offset % dspk__dtype_size(t.dtype) == 0));
    else
      check_inside(t.data, t.nbytes);
  } else {
    FUZZ_CHECK(strlen(msg) < sizeof msg);
  }
}

/* Decodes map against a table as dspkd_dispatch does; checks what every
 * accepted value promises its handler. */
static void visit_schema(const struct dspk__param *ps, int n, const msgpack_object *map) {
  struct dspk__pval v[DSPK__MAX_PARAMS];
  char msg[256];
  msg[0] = '\0';
  FUZZ_CHECK(n <= DSPK__MAX_PARAMS);
  if (dspk__params_decode(ps, n, map, "options.", v, msg, sizeof msg) != 0) {
    FUZZ_CHECK(msg[0] && strlen(msg) < sizeof msg);
    return;
  }
  for (int i = 0; i < n; i++) {
    if (!v[i].set) {
      FUZZ_CHECK(!(ps[i].flags & DSPK__P_REQUIRED));
      continue;
    }
    switch (ps[i].type) {
    case DSPK__T_UINT:
      FUZZ_CHECK(v[i].v.u >= ps[i].min && v[i].v.u <= ps[i].max);
      break;
    case DSPK__T_STR:
      FUZZ_CHECK(v[i].v.s.n <= ps[i].max && !memchr(v[i].v.s.p, 0, v[i].v.s.n));
      /* fall through */
    case DSPK__T_BIN:
      check_inside(v[i].v.s.p, v[i].v.s.n);
      break;
    case DSPK__T_ENUM:
      FUZZ_CHECK(v[i].v.e >= 0 && ps[i].choices[v[i].v.e]);
      break;
    case DSPK__T_DIM3:
      for (int k = 0; k < 3; k++)
        FUZZ_CHECK(v[i].v.dim[k] >= 1);
      break;
    case DSPK__T_ARRAY:
      FUZZ_CHECK(v[i].v.o->type == MSGPACK_OBJECT_ARRAY &&
                 v[i].v.o->via.array.size >= ps[i].min &&
                 (!ps[i].max || v[i].v.o->via.array.size <= ps[i].max));
      break;
    default:
      break;
    }
  }
}

/* Packs what the daemon would answer and checks that it decodes. */
static void answer(uint32_t msgid, const char *method, size_t method_len, int code) {
  struct dspk__wbuf w;
  struct iovec *iov;
  size_t niov, len, pos = 0;
  char text[300];
  uint8_t *flat;

  snprintf(text, sizeof text, "%.*s: refused", (int)(method_len > 200 ? 200 : method_len),
           method);
  dspk__wbuf_init(&w);
  dspk__pack_error_response(&w.pk, msgid, code, text);
  FUZZ_CHECK(dspk__wbuf_iov(&w, &iov, &niov) == 0);
  len = dspk__wbuf_len(&w);
  flat = malloc(len);
  FUZZ_CHECK(flat);
  for (size_t k = 0; k < niov; k++) {
    memcpy(flat + pos, iov[k].iov_base, iov[k].iov_len);
    pos += iov[k].iov_len;
  }
  FUZZ_CHECK(pos == len);
  {
    struct dspk__limits lim;
    msgpack_zone zone;
    msgpack_object root;
    struct dspk__msg m;
    size_t off = 0;
    char why[128];

    dspk__limits_default(&lim);
    FUZZ_CHECK(dspk__frame_scan(flat, len, &lim, why, sizeof why) == (ssize_t)len);
    FUZZ_CHECK(msgpack_zone_init(&zone, 512));
    FUZZ_CHECK(msgpack_unpack((const char *)flat, len, &off, &zone, &root) ==
               MSGPACK_UNPACK_SUCCESS);
    FUZZ_CHECK(dspk__msg_parse(&root, &m, NULL, NULL, why, sizeof why) == 0);
    FUZZ_CHECK(m.type == DSPK__RESPONSE && m.msgid == msgid && m.error && !m.result);
    msgpack_zone_destroy(&zone);
  }
  free(flat);
  dspk__wbuf_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct dspk__limits lim;
  msgpack_zone zone;
  msgpack_object root;
  struct dspk__msg m;
  uint32_t msgid = 0;
  bool has_msgid = false;
  size_t off = 0;
  char msg[256];
  ssize_t n;
  int err;

  dspk__limits_default(&lim);
  lim.max_message = 1 << 16;
  lim.max_elements = 1 << 12;
  lim.max_objects = 1 << 12;
  n = dspk__frame_scan(data, size, &lim, msg, sizeof msg);
  if (n <= 0)
    return 0;
  frame_lo = data;
  frame_hi = data + n;
  FUZZ_CHECK(msgpack_zone_init(&zone, 2048));
  if (msgpack_unpack((const char *)data, (size_t)n, &off, &zone, &root) !=
      MSGPACK_UNPACK_SUCCESS)
    goto out;
  err = dspk__msg_parse(&root, &m, &msgid, &has_msgid, msg, sizeof msg);
  if (err < 0) {
    FUZZ_CHECK(err == DSPK_EPROTO);
    if (has_msgid)
      answer(msgid, "", 0, err);
    goto out;
  }
  FUZZ_CHECK(m.type <= DSPK__NOTIFY);
  if (m.type == DSPK__RESPONSE)
    goto out;
  check_inside(m.method, m.method_len);
  if (m.args) {
    FUZZ_CHECK(m.args->type == MSGPACK_OBJECT_MAP);
    for (uint32_t k = 0; k < m.args->via.map.size; k++) {
      const msgpack_object *v = &m.args->via.map.ptr[k].val;
      visit_value(v, &lim);
      if (v->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t j = 0; j < v->via.array.size; j++)
          visit_value(&v->via.array.ptr[j], &lim);
    }
    {
      uint64_t u = 7;
      double f = 1.5;
      bool b = false;
      char s[32];
      (void)dspk__arg_u64(m.args, "buffer", &u, msg, sizeof msg);
      (void)dspk__arg_f64(m.args, "scale", &f, msg, sizeof msg);
      (void)dspk__arg_bool(m.args, "inverse", &b, msg, sizeof msg);
      (void)dspk__arg_str(m.args, "op", s, sizeof s, msg, sizeof msg);
    }
    for (int k = 0; k < DSPK__M_COUNT; k++) {
      visit_schema(dspk__methods[k].params, dspk__methods[k].nparams, m.args);
      /* The result rows too, as libdspkclient decodes an answer. */
      visit_schema(dspk__methods[k].results, dspk__methods[k].nresults, m.args);
    }
    for (int k = 0; k < DSPK_OP_COUNT; k++)
      visit_schema(dspk__ops[k].options, dspk__ops[k].noptions,
                   dspk__map_get(m.args, "options"));
  }
  if (m.type == DSPK__REQUEST)
    answer(m.msgid, m.method, m.method_len, DSPK_ENOTSUP);
out:
  msgpack_zone_destroy(&zone);
  return 0;
}
