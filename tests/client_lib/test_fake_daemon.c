/*
 * libdspkclient against a scripted fake daemon: a thread that accepts one
 * connection per test and answers with exactly the bytes the test wants,
 * so the library's handling of a misbehaving or dying daemon is checked
 * deterministically: protocol version mismatch, garbage and oversized
 * frames (refused by the scanner, nothing allocated from their counts),
 * a protocol.error notice before the close (also when the client's send
 * fails first), a close in the middle of a frame, answers to unknown
 * msgids, progress notifications, and malformed task results.  Every
 * failure must be a clear code, never a hang or crash.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "client/lib_internal.h"
#include "dspk/dspk.h"
#include "proto/codec.h"
#include "proto/schema.h"

static char dir[64], path[128];
static int lfd = -1;

/* ---- the fake daemon's side --------------------------------------------- */

struct srv {
  int fd;
  char buf[1 << 16];
  size_t len;
};

/* Reads one request; returns its msgid and copies its method. */
static uint32_t srv_read(struct srv *s, char *method, size_t mlen) {
  struct dspk__limits l;
  dspk__limits_default(&l);
  for (;;) {
    ssize_t n = dspk__frame_scan(s->buf, s->len, &l, NULL, 0);
    if (n > 0) {
      msgpack_unpacked up;
      struct dspk__msg m;
      size_t off = 0;
      msgpack_unpacked_init(&up);
      msgpack_unpack_next(&up, s->buf, (size_t)n, &off);
      if (dspk__msg_parse(&up.data, &m, NULL, NULL, NULL, 0) != 0)
        abort();
      snprintf(method, mlen, "%.*s", (int)m.method_len, m.method);
      uint32_t id = m.msgid;
      msgpack_unpacked_destroy(&up);
      memmove(s->buf, s->buf + n, s->len - (size_t)n);
      s->len -= (size_t)n;
      return id;
    }
    if (n < 0)
      abort();
    ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (k <= 0)
      return UINT32_MAX; /* client gone */
    s->len += (size_t)k;
  }
}

static void srv_send(struct srv *s, const void *p, size_t n) {
  while (n) {
    ssize_t k = send(s->fd, p, n, MSG_NOSIGNAL);
    if (k <= 0)
      return;
    p = (const char *)p + k;
    n -= (size_t)k;
  }
}

/* Packs into sb and sends it. */
struct pk {
  msgpack_sbuffer sb;
  msgpack_packer p;
};
static msgpack_packer *pk_begin(struct pk *k) {
  msgpack_sbuffer_init(&k->sb);
  msgpack_packer_init(&k->p, &k->sb, msgpack_sbuffer_write);
  return &k->p;
}
static void pk_send(struct srv *s, struct pk *k) {
  srv_send(s, k->sb.data, k->sb.size);
  msgpack_sbuffer_destroy(&k->sb);
}

/* Reads a request, which must be of method (no cmocka asserts off the main
 * thread: abort), and starts its result in k. */
static msgpack_packer *begin_result(struct srv *s, const char *method, struct pk *k) {
  char m[64];
  uint32_t id = srv_read(s, m, sizeof m);
  if (strcmp(m, method) != 0)
    abort();
  msgpack_packer *p = pk_begin(k);
  dspk__pack_result_head(p, id);
  return p;
}

/* hello's answer with max_message mm (the library takes it whatever its
 * size) and every other limit 1. */
static void answer_hello_mm(struct srv *s, unsigned protocol, uint32_t mm) {
  struct pk k;
  msgpack_packer *p = begin_result(s, "hello", &k);
  /* Every field of hello's result (the library decodes it by the table). */
  msgpack_pack_map(p, 5);
  dspk__pack_str(p, "protocol");
  msgpack_pack_uint32(p, protocol);
  dspk__pack_str(p, "daemon");
  dspk__pack_str(p, "fake-1.0");
  dspk__pack_str(p, "server");
  dspk__pack_str(p, "dspkd");
  dspk__pack_str(p, "client_id");
  msgpack_pack_uint32(p, 1);
  dspk__pack_str(p, "limits"); /* every limit: the library checks them */
  msgpack_pack_map(p, DSPK__LIM_COUNT);
  for (int i = 0; i < DSPK__LIM_COUNT; i++) {
    dspk__pack_str(p, dspk__limits_f[i].name);
    msgpack_pack_uint32(p, strcmp(dspk__limits_f[i].name, "max_message") == 0 ? mm : 1);
  }
  pk_send(s, &k);
}

static void answer_hello(struct srv *s, unsigned protocol) {
  answer_hello_mm(s, protocol, 1 << 20);
}

static void answer_ping(struct srv *s, uint32_t id) {
  struct pk k;
  msgpack_packer *p = pk_begin(&k);
  dspk__pack_result_head(p, id);
  msgpack_pack_map(p, 1);
  dspk__pack_str(p, "data");
  msgpack_pack_bin(p, 0);
  pk_send(s, &k);
}

typedef void (*script_fn)(struct srv *s);

static void *srv_thread(void *arg) {
  script_fn fn = (script_fn)(uintptr_t)arg;
  static struct srv s;
  memset(&s, 0, sizeof s);
  s.fd = accept(lfd, NULL, NULL);
  if (s.fd < 0)
    return NULL;
  fn(&s);
  close(s.fd);
  return NULL;
}

static pthread_t run_script(script_fn fn) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, srv_thread, (void *)(uintptr_t)fn),
                   0);
  return t;
}

/* ---- scripts and tests -------------------------------------------------- */

static void s_version2(struct srv *s) { answer_hello(s, 2); }

static void test_version_mismatch(void **state) {
  (void)state;
  pthread_t t = run_script(s_version2);
  dspk_client *c = NULL;
  assert_int_equal(dspk_connect(path, NULL, &c), DSPK_EVERSION);
  assert_null(c);
  assert_non_null(strstr(dspk_connect_error(), "protocol 2"));
  pthread_join(t, NULL);
}

/* A max_message of 0 could carry no request: no hello of this protocol
 * (it was taken as "no limit given", 256 MiB). */
static void s_max_message_0(struct srv *s) { answer_hello_mm(s, DSPK_PROTOCOL_VERSION, 0); }

static void test_max_message_0(void **state) {
  (void)state;
  pthread_t t = run_script(s_max_message_0);
  dspk_client *c = NULL;
  assert_int_equal(dspk_connect(path, NULL, &c), DSPK_EPROTO);
  assert_null(c);
  assert_non_null(strstr(dspk_connect_error(), "max_message is 0"));
  pthread_join(t, NULL);
}

/* Another protocol's hello with other fields than this one's (no limits, a
 * limits map of other names): still DSPK_EVERSION, the version read first. */
static void s_version2_other_fields(struct srv *s) {
  for (int round = 0; round < 2; round++) {
    struct pk k;
    msgpack_packer *p;
    if (round)
      s->fd = accept(lfd, NULL, NULL);
    p = begin_result(s, "hello", &k);
    msgpack_pack_map(p, round ? 5 : 4);
    dspk__pack_str(p, "protocol");
    msgpack_pack_uint32(p, 2);
    dspk__pack_str(p, "daemon");
    dspk__pack_str(p, "fake-2.0");
    dspk__pack_str(p, "server");
    dspk__pack_str(p, "dspkd");
    dspk__pack_str(p, "client_id");
    msgpack_pack_uint32(p, 1);
    if (round) {
      dspk__pack_str(p, "limits");
      msgpack_pack_map(p, 1);
      dspk__pack_str(p, "max_frames");
      msgpack_pack_uint32(p, 1);
    }
    pk_send(s, &k);
    if (!round)
      close(s->fd);
  }
}

static void test_version_mismatch_other_fields(void **state) {
  (void)state;
  pthread_t t = run_script(s_version2_other_fields);
  for (int round = 0; round < 2; round++) {
    dspk_client *c = NULL;
    assert_int_equal(dspk_connect(path, NULL, &c), DSPK_EVERSION);
    assert_null(c);
    assert_non_null(strstr(dspk_connect_error(), "protocol 2"));
  }
  pthread_join(t, NULL);
}

static void s_hello_error(struct srv *s) {
  char m[64];
  struct pk k;
  uint32_t id = srv_read(s, m, sizeof m);
  dspk__pack_error_response(pk_begin(&k), id, DSPK_EVERSION, "too new");
  pk_send(s, &k);
}

static void test_hello_error(void **state) {
  (void)state;
  pthread_t t = run_script(s_hello_error);
  dspk_client *c = NULL;
  assert_int_equal(dspk_connect(path, "x", &c), DSPK_EVERSION);
  assert_non_null(strstr(dspk_connect_error(), "too new"));
  pthread_join(t, NULL);
}

static void s_garbage(struct srv *s) {
  char m[64];
  answer_hello(s, 1);
  srv_read(s, m, sizeof m);
  srv_send(s, "\xc1\x00\x00", 3);
  srv_read(s, m, sizeof m); /* until the client closes */
}

static void test_garbage_answer(void **state) {
  (void)state;
  pthread_t t = run_script(s_garbage);
  dspk_client *c;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_string_equal(dspk_daemon_version(c), "fake-1.0");
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_EPROTO);
  assert_non_null(strstr(dspk_last_error(c), "0xc1"));
  /* The connection is unusable now: a clear error, no hang. */
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_EPROTO);
  dspk_close(c);
  pthread_join(t, NULL);
}

static void s_huge(struct srv *s) {
  char m[64];
  answer_hello(s, 1);
  uint32_t id = srv_read(s, m, sizeof m);
  unsigned char f[] = {0x94, 0x01, 0x00, 0xc0, 0xdd, 0x05, 0xf5, 0xe1, 0x00};
  f[2] = (unsigned char)id; /* msgid < 128 */
  srv_send(s, f, sizeof f);
  srv_read(s, m, sizeof m);
}

static void test_huge_header_answer(void **state) {
  (void)state;
  pthread_t t = run_script(s_huge);
  dspk_client *c;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ELIMIT);
  dspk_close(c);
  pthread_join(t, NULL);
}

static void s_protocol_error(struct srv *s) {
  char m[64];
  struct pk k;
  answer_hello(s, 1);
  srv_read(s, m, sizeof m);
  msgpack_packer *p = pk_begin(&k);
  dspk__pack_notify_head(p, "protocol.error");
  dspk__pack_error(p, DSPK_ELIMIT, "message longer than 10 bytes");
  pk_send(s, &k);
}

static void test_protocol_error_notice(void **state) {
  (void)state;
  pthread_t t = run_script(s_protocol_error);
  dspk_client *c;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c), "longer than 10 bytes"));
  pthread_join(t, NULL);
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ELIMIT);
  dspk_close(c);
}

/* A daemon that sent a protocol.error and closed before the client's next
 * send (an older dspkd that closed a refused connection at once; one past
 * its bound of lingering connections): the send fails with EPIPE, and the
 * call gives the notice's error, not ECLOSED (it was "sending to the daemon:
 * Broken pipe", the notice never read). */
static void s_notice_then_close(struct srv *s) {
  struct pk k;
  answer_hello(s, 1);
  msgpack_packer *p = pk_begin(&k);
  dspk__pack_notify_head(p, "protocol.error");
  dspk__pack_error(p, DSPK_ELIMIT, "this user has 2 connections already (max_user_clients)");
  pk_send(s, &k);
}

static void test_notice_read_after_a_failed_send(void **state) {
  (void)state;
  for (int i = 0; i < 20; i++) {
    pthread_t t = run_script(s_notice_then_close);
    dspk_client *c;
    assert_int_equal(dspk_connect(path, NULL, &c), 0);
    pthread_join(t, NULL); /* closed: the ping's send fails */
    assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ELIMIT);
    assert_non_null(strstr(dspk_last_error(c), "daemon closed the connection: this user "
                           "has 2 connections already (max_user_clients)"));
    assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ELIMIT);
    dspk_close(c);
  }
}

static void s_cut(struct srv *s) {
  char m[64];
  answer_hello(s, 1);
  srv_read(s, m, sizeof m);
  srv_send(s, "\x94\x01", 2); /* half a response, then gone */
}

static void test_close_mid_frame(void **state) {
  (void)state;
  pthread_t t = run_script(s_cut);
  dspk_client *c;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ECLOSED);
  assert_true(strlen(dspk_last_error(c)) > 0);
  pthread_join(t, NULL);
  /* Sending to a closed peer: ECLOSED, no SIGPIPE. */
  assert_true(dspk_ping(c, NULL, 0) < 0);
  dspk_close(c);
}

/* A daemon that dies with the client's request unread: the kernel resets
 * the stream, and recv fails with ECONNRESET instead of returning 0. */
static void s_reset(struct srv *s) {
  char b;
  answer_hello(s, 1);
  if (recv(s->fd, &b, 1, MSG_PEEK) != 1) /* the ping is there, unread */
    return;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
    n++;
  return n;
}

static void test_reset_is_closed(void **state) {
  (void)state;
  pthread_t t = run_script(s_reset);
  dspk_client *c;
  char first[1024];
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  /* The daemon went away: ECLOSED as for a plain close (was EIO). */
  assert_int_equal(dspk_ping(c, "x", 1), DSPK_ECLOSED);
  pthread_join(t, NULL);
  snprintf(first, sizeof first, "%s", dspk_last_error(c));
  assert_true(strlen(first) > 0);
  /* Every later call says why once: the reason was quoted into itself,
   * growing by a prefix per call until it was cut. */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(dspk_ping(c, NULL, 0), DSPK_ECLOSED);
    assert_int_equal(count_of(dspk_last_error(c), "no longer usable"), 1);
    assert_non_null(strstr(dspk_last_error(c), first));
  }
  /* The waits too (they said ENOENT, "not in flight"). */
  dspk_result r;
  uint32_t ticket;
  assert_int_equal(dspk_wait(c, 5, &r), DSPK_ECLOSED);
  assert_non_null(strstr(dspk_last_error(c), first));
  assert_int_equal(count_of(dspk_last_error(c), "no longer usable"), 1);
  assert_int_equal(dspk_wait_any(c, &ticket, &r), DSPK_ECLOSED);
  assert_non_null(strstr(dspk_last_error(c), first));
  assert_int_equal(count_of(dspk_last_error(c), "no longer usable"), 1);
  dspk_close(c);
}

static int progress_calls;
static uint32_t progress_ticket;
static double progress_frac;
static char progress_what[64];
static void on_progress(void *ud, uint32_t ticket, const char *what,
                        double fraction) {
  (void)ud;
  progress_calls++;
  progress_ticket = ticket;
  progress_frac = fraction;
  snprintf(progress_what, sizeof progress_what, "%s", what);
}

static void s_stray_and_progress(struct srv *s) {
  char m[64];
  struct pk k;
  answer_hello(s, 1);
  uint32_t a = srv_read(s, m, sizeof m); /* task.run */
  if (strcmp(m, "task.run") != 0)
    abort();
  uint32_t b = srv_read(s, m, sizeof m); /* ping */
  /* An answer nobody asked for, then progress, then the answers in the
   * opposite order. */
  answer_ping(s, 424242);
  msgpack_packer *p = pk_begin(&k);
  dspk__pack_notify_head(p, "task.progress");
  msgpack_pack_map(p, 3);
  dspk__pack_str(p, "msgid");
  msgpack_pack_uint32(p, a);
  dspk__pack_str(p, "what");
  dspk__pack_str(p, "autotune gemm");
  dspk__pack_str(p, "fraction");
  msgpack_pack_double(p, 0.25);
  pk_send(s, &k);
  answer_ping(s, b);
  /* task result: one f32 (2,) output, plus a second malformed task. */
  p = pk_begin(&k);
  dspk__pack_result_head(p, a);
  msgpack_pack_map(p, 3);
  dspk__pack_str(p, "time_us");
  msgpack_pack_uint32(p, 0);
  dspk__pack_str(p, "device");
  dspk__pack_str(p, "cpu:0");
  dspk__pack_str(p, "outputs");
  msgpack_pack_array(p, 1);
  msgpack_pack_map(p, 3);
  int64_t shape[1] = {2};
  dspk__pack_tensor_meta(p, DSPK_F32, 1, shape);
  dspk__pack_str(p, "data");
  float v[2] = {1.5f, -2.0f};
  msgpack_pack_bin_with_body(p, v, sizeof v);
  pk_send(s, &k);
  uint32_t c = srv_read(s, m, sizeof m);
  p = pk_begin(&k);
  dspk__pack_result_head(p, c);
  msgpack_pack_map(p, 3);
  dspk__pack_str(p, "time_us");
  msgpack_pack_uint32(p, 0);
  dspk__pack_str(p, "device");
  dspk__pack_str(p, "cpu:0");
  dspk__pack_str(p, "outputs");
  msgpack_pack_array(p, 1);
  msgpack_pack_map(p, 3);
  dspk__pack_tensor_meta(p, DSPK_F32, 1, shape);
  dspk__pack_str(p, "data");
  msgpack_pack_bin_with_body(p, v, 7); /* 7 bytes for 8 */
  pk_send(s, &k);
  srv_read(s, m, sizeof m);
}

static void test_out_of_order_progress(void **state) {
  (void)state;
  pthread_t t = run_script(s_stray_and_progress);
  dspk_client *c;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  dspk_set_progress(c, on_progress, NULL);
  int64_t shape[1] = {2};
  float x[2] = {0};
  dspk_tensor in;
  dspk_tensor_inline(&in, DSPK_F32, 1, shape, x);
  dspk_task task;
  dspk_task_init(&task, DSPK_OP_MAP);
  task.map.fn = DSPK_MAP_ABS;
  task.inputs = &in;
  task.ninputs = 1;
  uint32_t tk;
  assert_int_equal(dspk_submit(c, &task, &tk), 0);
  assert_int_equal(dspk_ping(c, NULL, 0), 0);
  assert_int_equal(progress_calls, 1);
  assert_int_equal(progress_ticket, tk);
  assert_true(progress_frac == 0.25);
  assert_string_equal(progress_what, "autotune gemm");
  dspk_result r;
  assert_int_equal(dspk_wait(c, tk, &r), 0);
  assert_int_equal(r.nout, 1);
  assert_int_equal(r.out[0].dtype, DSPK_F32);
  assert_true(((const float *)r.out[0].data)[1] == -2.0f);
  assert_int_equal((uintptr_t)r.out[0].data % 64, 0);
  dspk_result_free(&r);
  /* A result whose data does not match its shape. */
  assert_int_equal(dspk_run(c, &task, &r), DSPK_EPROTO);
  assert_non_null(strstr(dspk_last_error(c), "output 0"));
  dspk_close(c);
  pthread_join(t, NULL);
}

/* A trace answer with known jobs: overlapping queue waits of one client,
 * a tuned task, a failed buffer job on a second device, a running task. */
struct fjob {
  const char *dev, *kind, *name, *err;
  uint64_t client, msgid, q, s, e, up, comp, t0, t1;
  bool running;
};

static void pack_kv(msgpack_packer *p, const char *k, uint64_t v) {
  dspk__pack_str(p, k);
  msgpack_pack_uint64(p, v);
}

/* A trace's answer; bad: the second job's msgid a str (EPROTO). */
static void answer_trace(struct srv *s, bool bad) {
  static const struct fjob jobs[] = {
      {"cpu:0", "task", "gemm", NULL, 3, 1, 1000, 1100, 2000, 1150, 1900, 1200, 1800, false},
      {"cpu:0", "task", "fft", NULL, 3, 2, 1010, 2000, 2100, 2010, 2090, 0, 0, false},
      {"vulkan:0", "buffer.write", "buffer.write", "EIO", 4, 5, 1500, 1500, 1600, 0, 0, 0, 0,
       false},
      {"cpu:0", "task", "reduce", NULL, 3, 3, 2100, 2100, 2500, 0, 0, 0, 0, true},
      /* another user's job as a non-admin sees it (docs/protocol.md, trace) */
      {"vulkan:0", "other", "other", NULL, 0, 0, 1700, 1700, 1800, 0, 0, 0, 0, false},
  };
  const int njobs = (int)(sizeof jobs / sizeof jobs[0]);
  struct pk k;
  msgpack_packer *p = begin_result(s, "trace", &k);
  msgpack_pack_map(p, 5);
  pack_kv(p, "start_us", 1050);
  pack_kv(p, "end_us", 2500);
  pack_kv(p, "dropped", 2);
  dspk__pack_str(p, "devices");
  msgpack_pack_array(p, 2);
  dspk__pack_str(p, "cpu:0");
  dspk__pack_str(p, "vulkan:0");
  dspk__pack_str(p, "jobs");
  msgpack_pack_array(p, (size_t)njobs);
  for (int i = 0; i < njobs; i++) {
    const struct fjob *j = &jobs[i];
    msgpack_pack_map(p, 11 + (j->up != 0) + (j->comp != 0) + 2 * (j->t0 != 0));
    dspk__pack_str(p, "device");
    dspk__pack_str(p, j->dev);
    dspk__pack_str(p, "kind");
    dspk__pack_str(p, j->kind);
    dspk__pack_str(p, "name");
    dspk__pack_str(p, j->name);
    pack_kv(p, "client", j->client);
    dspk__pack_str(p, "job"); /* no Slurm job */
    msgpack_pack_nil(p);
    if (bad && i == 1)
      dspk__pack_kv_str(p, "msgid", "2");
    else
      pack_kv(p, "msgid", j->msgid);
    dspk__pack_str(p, "error");
    if (j->err)
      dspk__pack_str(p, j->err);
    else
      msgpack_pack_nil(p);
    dspk__pack_str(p, "running");
    if (j->running)
      msgpack_pack_true(p);
    else
      msgpack_pack_false(p);
    pack_kv(p, "queued_us", j->q);
    pack_kv(p, "start_us", j->s);
    pack_kv(p, "end_us", j->e);
    if (j->up)
      pack_kv(p, "upload_end_us", j->up);
    if (j->comp)
      pack_kv(p, "compute_end_us", j->comp);
    if (j->t0) {
      pack_kv(p, "tune_start_us", j->t0);
      pack_kv(p, "tune_end_us", j->t1);
    }
  }
  pk_send(s, &k);
}

/* hello, then answer(s, false) and answer(s, true) to the next two
 * requests, then waits until the client closes. */
static void good_then_bad(struct srv *s, void (*answer)(struct srv *s, bool bad)) {
  char m[64];
  answer_hello(s, 1);
  answer(s, false);
  answer(s, true);
  srv_read(s, m, sizeof m);
}

static void s_trace(struct srv *s) { good_then_bad(s, answer_trace); }

/* The daemon's records as Chrome trace-event JSON; a record the table
 * (dspk__trace_job_f) does not describe is EPROTO naming its path. */
/* Library JSON strings (trace, status, cache answers): every control
 * character as \u00NN (TAB, LF and CR too, as dspk.h says: they came out as
 * \t \n \r) so the text is safe on a terminal, an ill-formed byte as
 * \ufffd so it stays JSON; other UTF-8 kept.  (DEL, U+0085 and a stray
 * 0xff went through raw.) */
static void test_json_string_escapes(void **state) {
  (void)state;
  static const char in[] = "a\x7f\xc2\x85\xc2\x9b\xff\"\\\n\x01\xc2\xa0\xc3\xa9\xe2\x80\xa8"
                           "\t\r\b\f";
  static const char want[] = "\"a\\u007f\\u0085\\u009b\\ufffd\\\"\\\\\\u000a\\u0001\xc2\xa0\xc3\xa9\xe2\x80\xa8"
                             "\\u0009\\u000d\\u0008\\u000c\"";
  struct dspk__jbuf j = {0};
  dspk__jstr(&j, in, sizeof in - 1);
  assert_int_equal(j.err, 0);
  assert_string_equal(j.p, want);
  free(j.p);
}

/* Library JSON floats (status, devices, dspk_call_json): the fewest
 * significant digits that read back as the value, a float32 as a float32,
 * ".0" after an integral one (dspk.h; protocol.md's rule, as
 * dspk__float_str writes it); %.17g wrote 0.10000000000000001 and the f32
 * 0.1 as 0.10000000149011612.  Each against the text Python's repr gives
 * the same double (numpy's for the f32). */
static void test_json_floats(void **state) {
  static const struct {
    double v;
    bool f32;
    const char *want;
  } cases[] = {
      {0.1, false, "0.1"},       {5.0, false, "5.0"},        {-0.0, false, "-0.0"},
      {1e-320, false, "1e-320"}, {1e16, false, "1e+16"},     {0.0001, false, "0.0001"},
      {1.0000001, false, "1.0000001"}, {1.0 / 3, false, "0.3333333333333333"},
      {(double)0.1f, true, "0.1"}, {(double)(1.0f / 3), true, "0.33333334"},
      {NAN, false, "null"},      {-INFINITY, true, "null"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    msgpack_object o = {.type = cases[i].f32 ? MSGPACK_OBJECT_FLOAT32 : MSGPACK_OBJECT_FLOAT64,
                        .via.f64 = cases[i].v};
    char *json = NULL;
    assert_int_equal(dspk__to_json(&o, &json), 0);
    if (strcmp(json, cases[i].want) != 0)
      fail_msg("case %zu: %s, want %s", i, json, cases[i].want);
    free(json);
  }
}

static void test_trace_json(void **state) {
  (void)state;
  pthread_t t = run_script(s_trace);
  dspk_client *c;
  char *json = NULL;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_int_equal(dspk_trace(c, 0, &json), DSPK_EINVAL); /* refused before sending */
  assert_int_equal(dspk_trace(c, 1.5, &json), 0);
  /* Times are microseconds from the earliest one (the gemm's queueing, 1000). */
  static const char *const want[] = {
      "{\"traceEvents\":[",
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"cpu:0\"}}",
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"tid\":0,\"args\":{\"name\":\"vulkan:0\"}}",
      /* the gemm waited on its client's first queue thread (1000 + 16 * 3) */
      "{\"name\":\"gemm\",\"ph\":\"X\",\"pid\":1,\"tid\":1048,\"cat\":\"queue\",\"ts\":0,\"dur\":100,"
      "\"args\":{\"client\":3,\"msgid\":1}}",
      "{\"name\":\"gemm\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"task\",\"ts\":100,\"dur\":900,",
      "{\"name\":\"upload\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"phase\",\"ts\":100,\"dur\":50}",
      "{\"name\":\"compute\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"phase\",\"ts\":150,\"dur\":750}",
      "{\"name\":\"tuning\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"phase\",\"ts\":200,\"dur\":600}",
      "{\"name\":\"download\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"phase\",\"ts\":900,\"dur\":100}",
      /* the fft's wait overlaps the gemm's: a second queue thread */
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1049,\"args\":{\"name\":\"client 3 queue 2\"}}",
      "{\"name\":\"fft\",\"ph\":\"X\",\"pid\":1,\"tid\":1049,\"cat\":\"queue\",\"ts\":10,\"dur\":990,",
      "{\"name\":\"buffer.write\",\"ph\":\"X\",\"pid\":2,\"tid\":1,\"cat\":\"buffer\",\"ts\":500,"
      "\"dur\":100,\"args\":{\"client\":4,\"msgid\":5,\"error\":\"EIO\"}}",
      "{\"name\":\"reduce\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"task\",\"ts\":1100,\"dur\":400,"
      "\"args\":{\"client\":3,\"msgid\":3,\"running\":true}}",
      /* an anonymous job of another user: its own category, no queue wait */
      "{\"name\":\"other\",\"ph\":\"X\",\"pid\":2,\"tid\":1,\"cat\":\"other\",\"ts\":700,"
      "\"dur\":100,\"args\":{\"client\":0,\"msgid\":0}}",
      "\"otherData\":{\"start_us\":50,\"end_us\":1500,\"dropped\":2,\"jobs\":5}}",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(json, want[i]))
      fail_msg("missing %s in\n%s", want[i], json);
  /* No queue wait (nor queue thread) for a job that never waited; two
   * downloads (gemm, fft: the running reduce has no phases). */
  assert_null(strstr(json, "\"cat\":\"queue\",\"ts\":500"));
  assert_null(strstr(json, "client 4 queue"));
  int downloads = 0;
  for (const char *p = json; (p = strstr(p, "\"name\":\"download\"")); p++)
    downloads++;
  assert_int_equal(downloads, 2);
  dspk_free(json);
  json = NULL;
  assert_int_equal(dspk_trace(c, 1.5, &json), DSPK_EPROTO);
  assert_null(json);
  assert_non_null(strstr(dspk_last_error(c),
                         "result.jobs[1].msgid: expected a non-negative integer"));
  dspk_close(c);
  pthread_join(t, NULL);
}

/* devices answered with one device whose memory is a str, then (second
 * call) with a device lacking kernel_langs: the library checks the nested
 * maps it reads and says which field is wrong. */
static void answer_devices(struct srv *s, bool no_langs) {
  struct pk k;
  msgpack_packer *p = begin_result(s, "devices", &k);
  msgpack_pack_map(p, 2);
  dspk__pack_str(p, "devices");
  msgpack_pack_array(p, 1);
  msgpack_pack_map(p, DSPK__DEV_COUNT - no_langs);
  for (int i = 0; i < DSPK__DEV_COUNT - no_langs; i++) {
    const struct dspk__param *f = &dspk__device_f[i];
    dspk__pack_str(p, f->name);
    if (f->type == DSPK__T_STR || (i == DSPK__DEV_MEMORY && !no_langs))
      dspk__pack_str(p, "x");
    else if (f->type == DSPK__T_UINT)
      msgpack_pack_uint64(p, 1);
    else if (f->type == DSPK__T_BOOL)
      msgpack_pack_false(p);
    else if (f->type == DSPK__T_MAP)
      msgpack_pack_map(p, 0);
    else
      msgpack_pack_array(p, 0);
  }
  dspk__pack_str(p, "unavailable");
  msgpack_pack_array(p, 0);
  pk_send(s, &k);
}

static void s_bad_devices(struct srv *s) { good_then_bad(s, answer_devices); }

static void test_bad_nested(void **state) {
  (void)state;
  pthread_t t = run_script(s_bad_devices);
  dspk_client *c;
  dspk_device_list *l = NULL;
  assert_int_equal(dspk_connect(path, NULL, &c), 0);
  assert_int_equal(dspk_devices(c, false, &l), DSPK_EPROTO);
  assert_null(l);
  assert_non_null(strstr(dspk_last_error(c),
                         "result.devices[0].memory: expected a non-negative integer"));
  assert_int_equal(dspk_devices(c, false, &l), DSPK_EPROTO);
  assert_non_null(strstr(dspk_last_error(c), "result.devices[0].kernel_langs: required"));
  dspk_close(c);
  pthread_join(t, NULL);
}

static int setup(void **state) {
  (void)state;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(dir, "/tmp/dspk-fake-XXXXXX");
  if (!mkdtemp(dir))
    return -1;
  snprintf(path, sizeof path, "%s/fake.sock", dir);
  strcpy(sa.sun_path, path);
  lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(lfd, 4) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  close(lfd);
  unlink(path);
  rmdir(dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_mismatch),
      cmocka_unit_test(test_max_message_0),
      cmocka_unit_test(test_version_mismatch_other_fields),
      cmocka_unit_test(test_hello_error),
      cmocka_unit_test(test_garbage_answer),
      cmocka_unit_test(test_huge_header_answer),
      cmocka_unit_test(test_protocol_error_notice),
      cmocka_unit_test(test_notice_read_after_a_failed_send),
      cmocka_unit_test(test_close_mid_frame),
      cmocka_unit_test(test_reset_is_closed),
      cmocka_unit_test(test_out_of_order_progress),
      cmocka_unit_test(test_trace_json),
      cmocka_unit_test(test_json_string_escapes),
      cmocka_unit_test(test_json_floats),
      cmocka_unit_test(test_bad_nested),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
