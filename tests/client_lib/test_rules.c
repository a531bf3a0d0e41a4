/*
 * libdspkclient's rules where an outside tester found the library and
 * dspk.h apart, against a real dspkd (argv[1]):
 *  - fork(): an inherited client fails with DSPK_ECLOSED in the child
 *    (nothing read or written), its dspk_close there is quiet, and the
 *    parent's request in flight still gets its answer;
 *  - dspk_submit never waits for an answer (large operands and results
 *    behind a device's earlier work go inline when no idle temporary fits);
 *  - dspk_result_to_file after answers were buffered (a grown receive
 *    buffer), and for results that come through a shared temporary;
 *  - dspk_file_data ranges take the sendfile path whatever their size;
 *    several at one address: the same len replaces, another adds, the
 *    last registered that holds an operand sends it, len 0 forgets all;
 *  - kernel.entry NULL is "main", a bad kernel field is named;
 *  - dspk_buffer_read of 0 bytes is a buffer.read;
 *  - a shared allocation on another device than the task's is an error
 *    naming that device.
 * Every result is checked against a plain C loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/lib_internal.h"
#include "daemon_spawn.h"
#include "dspk/dspk.h"

static const char *dspkd_path;
static char tmpdir[64];
static char sockpath[128];
static pid_t daemon_pid = -1;
static pid_t small_pid = -1; /* a daemon of --max-objects 20 */
static pid_t big_pid = -1;   /* test_submit_too_big_inline's (--max-message 1M) */
static char small_sock[160];
static dspk_client *C;

static int start_daemon(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/dspk-rules-XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  snprintf(sockpath, sizeof sockpath, "%s/dspkd.sock", tmpdir);
  const char *args[] = {"--backends", "cpu,vulkan", "--log-level", "warn", "--no-cache", NULL};
  if ((daemon_pid = daemon_spawn(dspkd_path, sockpath, args)) < 0)
    return -1;
  const char *small[] = {"--backends", "cpu", "--log-level", "error", "--no-cache",
                         "--max-objects", "20", NULL};
  snprintf(small_sock, sizeof small_sock, "%s/small.sock", tmpdir);
  if ((small_pid = daemon_spawn(dspkd_path, small_sock, small)) < 0)
    return -1;
  return dspk_connect(sockpath, "test_rules", &C) == 0 ? 0 : -1;
}

static int stop_daemon(void **state) {
  int st = 0;
  (void)state;
  dspk_close(C);
  if (big_pid > 0) /* its test failed before it stopped it */
    (void)daemon_stop(big_pid, &st);
  if (small_pid > 0 && daemon_stop(small_pid, &st) != 0)
    return -1;
  unlink(small_sock);
  if (daemon_pid > 0 && daemon_stop(daemon_pid, &st) != 0)
    return -1;
  unlink(sockpath);
  rmdir(tmpdir);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* A map scale of x[0..n) by alpha on device. */
static void map_task(dspk_task *t, dspk_tensor *in, const float *x, int64_t n, double alpha,
                     const char *device) {
  dspk_tensor_inline(in, DSPK_F32, 1, &n, x);
  dspk_task_init(t, DSPK_OP_MAP);
  t->device = device;
  t->map.fn = DSPK_MAP_SCALE;
  t->map.alpha = alpha;
  t->inputs = in;
  t->ninputs = 1;
}

static void check_scaled(const dspk_result *r, const float *x, int64_t n, float alpha) {
  assert_int_equal(r->nout, 1);
  assert_false(r->out[0].is_ref);
  assert_int_equal(r->out[0].nbytes, (size_t)n * 4);
  const float *y = r->out[0].data;
  for (int64_t i = 0; i < n; i++)
    if (y[i] != x[i] * alpha)
      fail_msg("out[%lld] = %g, want %g", (long long)i, (double)y[i], (double)(x[i] * alpha));
}

/* dspk_submit of an operand (and a result) too large to cross the socket in
 * one message: it makes the temporaries, as dspk_run does (dspk.h), instead
 * of failing with DSPK_ELIMIT. */
static void test_submit_too_big_inline(void **state) {
  const int64_t m = 1 << 19; /* 2 MiB of f32 against a max_message of 1 MiB */
  const char *args[] = {"--backends", "cpu", "--log-level", "warn", "--no-cache",
                        "--max-message", "1M", NULL};
  char sock[192];
  int st = 0;
  dspk_client *k = NULL;
  dspk_tensor xi;
  dspk_task u;
  dspk_result r;
  uint32_t tu;
  float *x = malloc(sizeof(float) * (size_t)m);
  (void)state;
  assert_non_null(x);
  for (int64_t i = 0; i < m; i++)
    x[i] = (float)(i % 1000) - 500.0f;
  snprintf(sock, sizeof sock, "%s/big.sock", tmpdir);
  assert_true((big_pid = daemon_spawn(dspkd_path, sock, args)) > 0);
  assert_int_equal(dspk_connect(sock, "submit_big", &k), 0);
  dspk_tensor_inline(&xi, DSPK_F32, 1, &m, x);
  dspk_task_init(&u, DSPK_OP_MAP);
  u.device = "cpu:0";
  u.map.fn = DSPK_MAP_ABS;
  u.inputs = &xi;
  u.ninputs = 1;
  if (dspk_submit(k, &u, &tu) != 0)
    fail_msg("submit: %s", dspk_last_error(k));
  assert_int_equal(dspk_wait(k, tu, &r), 0);
  assert_int_equal(r.out[0].nbytes, sizeof(float) * (size_t)m);
  for (int64_t i = 0; i < m; i++)
    if (((const float *)r.out[0].data)[i] != fabsf(x[i]))
      fail_msg("abs[%lld] = %g", (long long)i, (double)((const float *)r.out[0].data)[i]);
  dspk_result_free(&r);
  dspk_close(k);
  assert_int_equal(daemon_stop(big_pid, &st), 0);
  big_pid = -1;
  unlink(sock);
  free(x);
}

/* ---- fork ------------------------------------------------------------------ */

static void test_fork_child(void **state) {
  float x[1000];
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t tk;
  int st = 0;
  (void)state;
  for (int i = 0; i < 1000; i++)
    x[i] = (float)i;
  map_task(&t, &in, x, 1000, 2, "cpu:0");
  assert_int_equal(dspk_submit(C, &t, &tk), 0);
  pid_t p = fork();
  assert_true(p >= 0);
  if (p == 0) {
    /* Each failure is a bit of the exit status. */
    int bad = 0, rc;
    uint32_t any = 0;
    char b[8];
    if ((rc = dspk_ping(C, NULL, 0)) != DSPK_ECLOSED || !strstr(dspk_last_error(C), "fork"))
      bad |= 1;
    if (dspk_run(C, &t, &r) != DSPK_ECLOSED)
      bad |= 2;
    if (dspk_wait(C, tk, &r) != DSPK_ECLOSED)
      bad |= 4;
    if (dspk_wait_any(C, &any, &r) != DSPK_ECLOSED || any != 0)
      bad |= 8;
    if (dspk_buffer_read(C, 1, 0, b, sizeof b) != DSPK_ECLOSED)
      bad |= 16;
    dspk_close(C); /* quiet: the parent's connection goes on */
    _exit(bad);
  }
  assert_int_equal(waitpid(p, &st, 0), p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(dspk_set_timeout(C, 20000), 0); /* a failure, not a hang */
  assert_int_equal(dspk_wait(C, tk, &r), 0);
  check_scaled(&r, x, 1000, 2);
  dspk_result_free(&r);
  assert_int_equal(dspk_ping(C, "abc", 3), 0);
  assert_int_equal(dspk_set_timeout(C, 0), 0);
}

/* ---- dspk_submit never waits ------------------------------------------------ */

/* Long gemms on cpu:0 (operands and result in daemon buffers), then a task
 * whose operand and result are above the shared threshold on a fresh client
 * (no idle temporary): dspk_submit returns while the gemms still run -- none
 * of their answers has arrived, which a buffer.import queued behind them
 * would have waited for. */
static void test_submit_no_wait(void **state) {
  const int64_t n = 3072, m = 512 * 1024; /* a gemm of 58 GFLOP: long even on many cores */
  dspk_client *k = NULL;
  uint64_t ab, ob;
  float *ones = malloc(sizeof(float) * (size_t)(n * n)), *x = malloc(sizeof(float) * (size_t)m);
  dspk_tensor g[2], xi;
  dspk_task t, u;
  dspk_result r;
  uint32_t tk[2], tu;
  (void)state;
  assert_non_null(ones);
  assert_non_null(x);
  for (int64_t i = 0; i < n * n; i++)
    ones[i] = 1.0f;
  for (int64_t i = 0; i < m; i++)
    x[i] = (float)(i % 1000) - 500.0f;
  assert_int_equal(dspk_connect(sockpath, "submit_no_wait", &k), 0);
  assert_int_equal(dspk_buffer_create(k, "cpu:0", sizeof(float) * (size_t)(n * n), &ab), 0);
  assert_int_equal(dspk_buffer_write(k, ab, 0, ones, sizeof(float) * (size_t)(n * n)), 0);
  assert_int_equal(dspk_buffer_create(k, "cpu:0", sizeof(float) * (size_t)(n * n), &ob), 0);
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  for (int i = 0; i < 2; i++) {
    memset(&g[i], 0, sizeof g[i]);
    g[i].dtype = DSPK_F32;
    g[i].rank = 2;
    g[i].shape[0] = g[i].shape[1] = n;
    g[i].is_ref = true;
    g[i].buffer = ab;
  }
  t.inputs = g;
  t.ninputs = 2;
  t.nout_refs = 1;
  t.out_refs[0].buffer = ob;
  for (int i = 0; i < 2; i++)
    assert_int_equal(dspk_submit(k, &t, &tk[i]), 0);
  dspk_tensor_inline(&xi, DSPK_F32, 1, &m, x);
  dspk_task_init(&u, DSPK_OP_MAP);
  u.device = "cpu:0";
  u.map.fn = DSPK_MAP_ABS;
  u.inputs = &xi;
  u.ninputs = 1;
  assert_int_equal(dspk_submit(k, &u, &tu), 0);
  {
    struct pollfd pfd = {.fd = dspk_fd(k), .events = POLLIN};
    /* nothing answered yet: the gemms still run */
    assert_int_equal(k->ndone, 0);
    assert_int_equal(poll(&pfd, 1, 0), 0);
  }
  for (size_t i = 0; i < k->nshm; i++) /* no temporary was made */
    assert_int_equal(k->shm[i].state, 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(dspk_wait(k, tk[i], &r), 0);
    dspk_result_free(&r);
  }
  assert_int_equal(dspk_wait(k, tu, &r), 0);
  assert_int_equal(r.out[0].nbytes, sizeof(float) * (size_t)m);
  for (int64_t i = 0; i < m; i++)
    if (((const float *)r.out[0].data)[i] != fabsf(x[i]))
      fail_msg("abs[%lld] = %g", (long long)i, (double)((const float *)r.out[0].data)[i]);
  dspk_result_free(&r);
  {
    float c[4];
    assert_int_equal(dspk_buffer_read(k, ob, 4 * (uint64_t)(n * n / 2), c, sizeof c), 0);
    for (int i = 0; i < 4; i++)
      assert_true(c[i] == (float)n);
  }
  dspk_close(k);
  free(ones);
  free(x);
}

/* ---- dspk_result_to_file ------------------------------------------------------ */

/* A file in tmpdir, empty, open for reading and writing. */
static int tmpfile_rw(const char *name) {
  char path[160];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  unlink(path);
  return fd;
}

/* Submits x * alpha on cpu:0 with its result to fd at off, waits, and checks
 * that it went there: written, the file's bytes and the result's. */
static void to_file_once(dspk_client *k, const float *x, int64_t n, float alpha, int fd,
                         uint64_t off, bool *temp) {
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t tk;
  bool written = false;
  float *back = malloc(sizeof(float) * (size_t)n);
  assert_non_null(back);
  map_task(&t, &in, x, n, alpha, "cpu:0");
  assert_int_equal(dspk_submit(k, &t, &tk), 0);
  if (temp) { /* whether the result comes through a shared temporary */
    *temp = false;
    for (size_t i = 0; i < k->nshm; i++)
      *temp |= k->shm[i].state == 1;
  }
  assert_int_equal(dspk_result_to_file(k, tk, fd, off, &written), 0);
  assert_int_equal(dspk_wait(k, tk, &r), 0);
  assert_true(written);
  check_scaled(&r, x, n, alpha);
  assert_int_equal(pread(fd, back, sizeof(float) * (size_t)n, (off_t)off),
                   (ssize_t)(sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++)
    if (back[i] != x[i] * alpha)
      fail_msg("file[%lld] = %g, want %g", (long long)i, (double)back[i],
               (double)(x[i] * alpha));
  dspk_result_free(&r);
  free(back);
}

/* After answers were read out of order (the receive buffer grew to hold
 * them), later to-file answers still go to the file; and one read while
 * another ticket was waited for goes there from memory. */
static void test_to_file_after_buffered(void **state) {
  const int64_t n = 200000; /* 800 KB: inline, below the shared threshold */
  float *x = malloc(sizeof(float) * (size_t)n);
  dspk_client *k = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t a, b;
  bool written = false;
  int fd = tmpfile_rw("tofile3.bin");
  (void)state;
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(i % 4096);
  assert_int_equal(dspk_connect(sockpath, "to_file_buffered", &k), 0);
  to_file_once(k, x, n, 3, fd, 0, NULL);
  map_task(&t, &in, x, n, 2, "cpu:0");
  assert_int_equal(dspk_submit(k, &t, &a), 0);
  assert_int_equal(dspk_submit(k, &t, &b), 0);
  assert_int_equal(dspk_wait(k, b, &r), 0); /* a's answer is read and kept first */
  check_scaled(&r, x, n, 2);
  dspk_result_free(&r);
  assert_int_equal(dspk_wait(k, a, &r), 0);
  check_scaled(&r, x, n, 2);
  dspk_result_free(&r);
  to_file_once(k, x, n, 5, fd, 0, NULL);
  to_file_once(k, x, n, 7, fd, 4096 + 64, NULL);
  /* a to-file answer read while another ticket is waited for */
  map_task(&t, &in, x, n, 11, "cpu:0");
  assert_int_equal(dspk_submit(k, &t, &a), 0);
  assert_int_equal(dspk_result_to_file(k, a, fd, 8, &written), 0);
  assert_int_equal(dspk_submit(k, &t, &b), 0);
  assert_int_equal(dspk_wait(k, b, &r), 0);
  dspk_result_free(&r);
  assert_false(written);
  assert_int_equal(dspk_wait(k, a, &r), 0);
  assert_true(written);
  check_scaled(&r, x, n, 11);
  {
    float v;
    assert_int_equal(pread(fd, &v, 4, 8 + 4 * 777), 4);
    assert_true(v == x[777] * 11);
  }
  dspk_result_free(&r);
  dspk_close(k);
  close(fd);
  free(x);
}

/* A first output of 1 MiB and more, which comes through a shared temporary,
 * goes to the file too. */
static void test_to_file_big(void **state) {
  const int64_t n = 512 * 1024; /* 2 MiB */
  float *x = malloc(sizeof(float) * (size_t)n);
  dspk_client *k = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  bool temp = false;
  int fd = tmpfile_rw("tofile_big.bin");
  (void)state;
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(i % 1000) - 3.0f;
  assert_int_equal(dspk_connect(sockpath, "to_file_big", &k), 0);
  map_task(&t, &in, x, n, 2, "cpu:0");
  assert_int_equal(dspk_run(k, &t, &r), 0); /* makes the temporaries */
  dspk_result_free(&r);
  to_file_once(k, x, n, 3, fd, 0, &temp);
  assert_true(temp);
  to_file_once(k, x, n, 5, fd, 100 * 4, &temp);
  assert_true(temp);
  dspk_close(k);
  close(fd);
  free(x);
}

/* ---- dspk_file_data ------------------------------------------------------------- */

/* An operand of 4 MiB (above the shared threshold) in a registered file
 * mapping goes with sendfile: no temporary is made (a copy into one faulted
 * every page of the mapping in), and the daemon gets every byte. */
static void test_file_data_big(void **state) {
  const int64_t n = 1 << 20;
  const size_t nb = sizeof(float) * (size_t)n;
  float *x = malloc(nb);
  dspk_client *k = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  int fd = tmpfile_rw("file_data.bin");
  float want = 0;
  (void)state;
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)((i * 7919) % 100003) - 50000.0f;
  x[n - 3] = -77777.0f;
  for (int64_t i = 0; i < n; i++)
    want = i == 0 || x[i] < want ? x[i] : want;
  assert_int_equal(write(fd, x, nb), (ssize_t)nb);
  float *m = mmap(NULL, nb, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  assert_int_equal(dspk_connect(sockpath, "file_data_big", &k), 0);
  assert_int_equal(dspk_file_data(k, m, nb, fd, 0), 0);
  dspk_tensor_inline(&in, DSPK_F32, 1, &n, m);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_MIN;
  t.inputs = &in;
  t.ninputs = 1;
  assert_int_equal(dspk_run(k, &t, &r), 0);
  assert_int_equal(k->nshm, 0); /* no temporary */
  assert_true(*(const float *)r.out[0].data == want);
  dspk_result_free(&r);
  assert_int_equal(dspk_file_data(k, m, 0, fd, 0), 0);
  dspk_close(k);
  munmap(m, nb);
  close(fd);
  free(x);
}

/* Ranges at one address (dspk.h): the same addr and len again replaces the
 * range's file and offset; another len adds a range, the first staying; an
 * operand goes from the last registered range that holds all of it; len 0
 * forgets every range at addr.  The two files differ, so the sum says
 * which one the daemon got: A (ones, also the mapping's bytes) or B
 * (twos). */
static void test_file_data_same_addr(void **state) {
  const int64_t n = 1 << 16, half = n / 2;
  const size_t nb = sizeof(float) * (size_t)n;
  float *x = malloc(nb);
  dspk_client *k = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  int fa = tmpfile_rw("same_addr_a.bin"), fb = tmpfile_rw("same_addr_b.bin");
  (void)state;
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++)
    x[i] = 1.0f;
  assert_int_equal(write(fa, x, nb), (ssize_t)nb);
  for (int64_t i = 0; i < n; i++)
    x[i] = 2.0f;
  assert_int_equal(write(fb, x, nb), (ssize_t)nb);
  float *m = mmap(NULL, nb, PROT_READ, MAP_SHARED, fa, 0);
  assert_true(m != MAP_FAILED);
  assert_int_equal(dspk_connect(sockpath, "file_data_same_addr", &k), 0);
  dspk_tensor_inline(&in, DSPK_F32, 1, &n, m);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_SUM;
  t.inputs = &in;
  t.ninputs = 1;
#define SUM_IS(len, want)                                     \
  do {                                                        \
    in.shape[0] = (len);                                      \
    in.nbytes = sizeof(float) * (size_t)(len);                \
    assert_int_equal(dspk_run(k, &t, &r), 0);                 \
    assert_true(*(const float *)r.out[0].data == (float)(want)); \
    dspk_result_free(&r);                                     \
  } while (0)
  assert_int_equal(dspk_file_data(k, m, nb, fa, 0), 0);
  assert_int_equal(dspk_file_data(k, m, nb / 2, fb, 0), 0); /* added */
  assert_int_equal(k->nfmaps, 2);
  SUM_IS(n, n);            /* only A's range holds it */
  SUM_IS(half, 2 * half);  /* both do: B's, the last */
  assert_int_equal(dspk_file_data(k, m, nb, fb, 0), 0); /* replaces A's range */
  assert_int_equal(k->nfmaps, 2);
  SUM_IS(n, 2 * n);
  assert_int_equal(dspk_file_data(k, m, nb / 2, fa, 0), 0); /* replaces, now the last */
  assert_int_equal(k->nfmaps, 2);
  SUM_IS(half, half);
  SUM_IS(n, 2 * n);
  assert_int_equal(dspk_file_data(k, m, 0, -1, 0), 0); /* forgets both */
  assert_int_equal(k->nfmaps, 0);
  SUM_IS(n, n); /* from the mapping: A's bytes */
#undef SUM_IS
  dspk_close(k);
  munmap(m, nb);
  close(fa);
  close(fb);
  free(x);
}

/* ---- kernel fields -------------------------------------------------------------- */

static const char GLSL_INC[] = "#version 450\nlayout(local_size_x=1) in;\n"
                               "layout(std430, binding=0) buffer A { float a[]; };\n"
                               "void main(){ a[0] += 1.0; }\n";

/* Whether the daemon has device id. */
static bool has_device(const char *id) {
  dspk_device_list *l = NULL;
  bool yes = false;
  if (dspk_devices(C, false, &l) != 0)
    return false;
  for (size_t i = 0; i < l->ndevices; i++)
    yes |= strcmp(l->devices[i].id, id) == 0;
  dspk_device_list_free(l);
  return yes;
}

static void kernel_task(dspk_task *t, dspk_tensor *in, float *a) {
  int64_t one = 1;
  dspk_tensor_inline(in, DSPK_F32, 1, &one, a);
  dspk_task_init(t, DSPK_OP_KERNEL);
  t->device = "vulkan:0";
  t->inputs = in;
  t->ninputs = 1;
  t->kernel.lang = "glsl";
  t->kernel.source = GLSL_INC;
  t->kernel.source_len = strlen(GLSL_INC);
  t->kernel.nargs = 1;
  t->kernel.args[0].kind = DSPK_KARG_TENSOR;
  t->kernel.args[0].v.tensor = 0;
}

/* Each bad field is named; entry NULL (dspk_task_init) is "main". */
static void test_kernel_fields(void **state) {
  float a[1] = {41};
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t tk;
  (void)state;
  kernel_task(&t, &in, a);
  t.kernel.lang = NULL;
  assert_int_equal(dspk_submit(C, &t, &tk), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "kernel.lang"));
  t.kernel.lang = "opencl";
  assert_int_equal(dspk_submit(C, &t, &tk), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "kernel.lang"));
  assert_non_null(strstr(dspk_last_error(C), "opencl"));
  /* Echoed by protocol.md's rule, as the daemon echoes a client's string:
   * one line, no terminal sequence, U+200B told apart from the six
   * characters \u200b (probe 21 D-2: copied raw). */
  static const struct { const char *lang, *shown; } odd[] = {
      {"cu\nda\x1b[31m", "\"cu\\nda\\x1b[31m\""},
      {"\xe2\x80\x8b" "cuda", "\"\\u200bcuda\""},
      {"\\u200bcuda", "\"\\\\u200bcuda\""},
      {"cuda\t", "\"cuda\\t\""},
      {"cuda ", "\"cuda \""},
      {"\xff", "\"\\xff\""},
  };
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    char want[128];
    t.kernel.lang = odd[i].lang;
    assert_int_equal(dspk_submit(C, &t, &tk), DSPK_EINVAL);
    snprintf(want, sizeof want, "kernel.lang: unknown language %s (one of cuda, glsl, spirv, "
             "hip)", odd[i].shown);
    assert_string_equal(dspk_last_error(C), want);
  }
  t.kernel.lang = "glsl";
  t.kernel.source = NULL;
  assert_int_equal(dspk_submit(C, &t, &tk), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "kernel.source"));
  t.kernel.source = GLSL_INC;
  t.kernel.nargs = DSPK_KERNEL_MAX_ARGS + 1;
  assert_int_equal(dspk_submit(C, &t, &tk), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "kernel.nargs"));
  if (!has_device("vulkan:0")) {
    skip();
    return;
  }
  kernel_task(&t, &in, a);
  assert_null(t.kernel.entry);
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("entry NULL: %s", dspk_last_error(C));
  assert_true(*(const float *)r.out[0].data == 42.0f);
  dspk_result_free(&r);
}

/* ---- the first call that meets protocol.error -------------------------------------- */

/* A daemon that allows 20 msgpack objects a message closes the connection
 * on a gemm request with a protocol.error: the call that meets it says
 * "daemon closed the connection: " and the reason, only later calls "connection
 * is no longer usable: " -- also when the request was sent by dspk_submit
 * and the error met by dspk_wait. */
static void test_protocol_error_first(void **state) {
  char first[1024];
  float a[4] = {1, 2, 3, 4};
  int64_t sh[2] = {2, 2};
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  uint32_t tk;
  int rc;
  (void)state;
  dspk_tensor_inline(&in[0], DSPK_F32, 2, sh, a);
  in[1] = in[0];
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  t.inputs = in;
  t.ninputs = 2;
  for (int mode = 0; mode < 2; mode++) {
    dspk_client *k = NULL;
    assert_int_equal(dspk_connect(small_sock, "perr", &k), 0);
    if (mode == 0) {
      rc = dspk_run(k, &t, &r);
    } else {
      assert_int_equal(dspk_submit(k, &t, &tk), 0);
      rc = dspk_wait(k, tk, &r);
    }
    assert_true(rc < 0);
    snprintf(first, sizeof first, "%s", dspk_last_error(k));
    if (strncmp(first, "daemon closed the connection: ", 30) != 0)
      fail_msg("mode %d, first failure: \"%s\"", mode, first);
    assert_int_equal(dspk_ping(k, NULL, 0), rc);
    if (strncmp(dspk_last_error(k), "connection is no longer usable: ", 32) != 0 ||
        strcmp(dspk_last_error(k) + 32, first) != 0)
      fail_msg("mode %d, later failure: \"%s\"", mode, dspk_last_error(k));
    dspk_close(k);
  }
}

/* ---- buffer calls of 0 bytes ------------------------------------------------------ */

/* dspk_buffer_read of 0 bytes into NULL is a buffer.read like one into
 * memory: the same answer (past the end: the same error and message), and
 * dspk_buffer_write of 0 bytes from NULL a buffer.write like one from memory. */
static void test_zero_byte_calls(void **state) {
  char x[4], msg[1024];
  uint64_t b;
  int want;
  (void)state;
  assert_int_equal(dspk_buffer_create(C, "cpu:0", 16, &b), 0);
  assert_int_equal(dspk_buffer_read(C, b, 16, NULL, 0), 0);
  assert_int_equal(dspk_buffer_write(C, b, 16, NULL, 0), 0);
  want = dspk_buffer_read(C, b, 17, x, 0);
  assert_true(want < 0);
  snprintf(msg, sizeof msg, "%s", dspk_last_error(C));
  assert_int_equal(dspk_buffer_read(C, b, 17, NULL, 0), want);
  assert_string_equal(dspk_last_error(C), msg);
  want = dspk_buffer_write(C, b, 17, x, 0);
  assert_true(want < 0);
  snprintf(msg, sizeof msg, "%s", dspk_last_error(C));
  assert_int_equal(dspk_buffer_write(C, b, 17, NULL, 0), want);
  assert_string_equal(dspk_last_error(C), msg);
  assert_int_equal(dspk_buffer_free(C, b), 0);
}

/* ---- shared allocations on another device --------------------------------------- */

/* An operand in a shared allocation is sent as a reference to it whatever
 * the task: on another device than the allocation's, or with allocations
 * on two devices on "any", the call is DSPK_EINVAL saying where the operand
 * lies; on "any" it runs on the allocation's device. */
static void test_shared_other_device(void **state) {
  const int64_t n = 1000;
  void *pv, *pc;
  uint64_t iv, ic;
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  (void)state;
  if (!has_device("vulkan:0")) {
    skip();
    return;
  }
  assert_int_equal(dspk_shared_alloc(C, "vulkan:0", 1 << 20, &pv, &iv), 0);
  assert_int_equal(dspk_shared_alloc(C, "cpu:0", 1 << 20, &pc, &ic), 0);
  float *qv = pv, *qc = pc;
  for (int64_t i = 0; i < n; i++) {
    qv[i] = (float)i;
    qc[i] = 1.0f;
  }
  /* another device than the allocation's: the bytes go inline */
  map_task(&t, &in[0], qv, n, 3, "cpu:0");
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("cpu:0: %s", dspk_last_error(C));
  assert_string_equal(r.device, "cpu:0");
  check_scaled(&r, qv, n, 3);
  dspk_result_free(&r);
  /* two devices on "any": the first operand's device runs it, the other
   * operand's bytes go inline */
  dspk_tensor_inline(&in[1], DSPK_F32, 1, &n, qc);
  t.device = NULL;
  t.map.fn = DSPK_MAP_ADD;
  t.ninputs = 2;
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("any, two devices: %s", dspk_last_error(C));
  assert_string_equal(r.device, "vulkan:0");
  for (int64_t i = 0; i < n; i++)
    assert_true(((const float *)r.out[0].data)[i] == (float)i + 1.0f);
  dspk_result_free(&r);
  /* an offset between items: inline too */
  memcpy((char *)pc + 2, qv, (size_t)n * 4);
  dspk_tensor_inline(&in[0], DSPK_F32, 1, &n, (char *)pc + 2);
  t.ninputs = 1;
  t.map.fn = DSPK_MAP_SCALE;
  t.map.alpha = 3;
  t.device = "cpu:0";
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("odd offset: %s", dspk_last_error(C));
  check_scaled(&r, qv, n, 3);
  dspk_result_free(&r);
  /* "any": the allocation's device */
  map_task(&t, &in[0], qv, n, 3, NULL);
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("any: %s", dspk_last_error(C));
  assert_string_equal(r.device, "vulkan:0");
  check_scaled(&r, qv, n, 3);
  dspk_result_free(&r);
  assert_int_equal(dspk_shared_free(C, pv), 0);
  assert_int_equal(dspk_shared_free(C, pc), 0);
}

/* A reference to a buffer on vulkan:0 pins a task on "any" there: an
 * inline operand above the shared threshold takes its temporary on that
 * device, and so does the result (both went to cpu:0 temporaries, whose
 * references beside the buffer's were EINVAL: operands on two devices).
 * After the buffer is freed, its id stands for no device. */
static void test_ref_pins_temporaries(void **state) {
  const int64_t n = 1 << 19; /* 2 MiB of f32: above the 1 MiB threshold */
  float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
  uint64_t id;
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  (void)state;
  if (!has_device("vulkan:0")) {
    free(x);
    free(y);
    skip();
    return;
  }
  assert_non_null(x);
  assert_non_null(y);
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)(i % 1000);
    y[i] = 0.5f;
  }
  assert_int_equal(dspk_buffer_create(C, "vulkan:0", (size_t)n * 4, &id), 0);
  assert_int_equal(dspk_buffer_write(C, id, 0, x, (size_t)n * 4), 0);
  in[0] = (dspk_tensor){.dtype = DSPK_F32, .rank = 1, .shape = {n}, .is_ref = true,
                        .buffer = id};
  dspk_tensor_inline(&in[1], DSPK_F32, 1, &n, y);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.map.fn = DSPK_MAP_ADD;
  t.inputs = in;
  t.ninputs = 2;
  if (dspk_run(C, &t, &r) != 0)
    fail_msg("any, a buffer on vulkan:0 and a large operand: %s", dspk_last_error(C));
  assert_string_equal(r.device, "vulkan:0");
  assert_int_equal(r.out[0].nbytes, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++)
    if (((const float *)r.out[0].data)[i] != x[i] + 0.5f)
      fail_msg("out[%lld] = %g", (long long)i, (double)((const float *)r.out[0].data)[i]);
  dspk_result_free(&r);
  assert_int_equal(dspk_buffer_free(C, id), 0);
  free(x);
  free(y);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-DSPKD\n", argv[0]);
    return 2;
  }
  dspkd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_child),
      cmocka_unit_test(test_submit_no_wait),
      cmocka_unit_test(test_submit_too_big_inline),
      cmocka_unit_test(test_to_file_after_buffered),
      cmocka_unit_test(test_to_file_big),
      cmocka_unit_test(test_file_data_big),
      cmocka_unit_test(test_file_data_same_addr),
      cmocka_unit_test(test_kernel_fields),
      cmocka_unit_test(test_protocol_error_first),
      cmocka_unit_test(test_zero_byte_calls),
      cmocka_unit_test(test_shared_other_device),
      cmocka_unit_test(test_ref_pins_temporaries),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
