/*
 * libdspkclient against a real dspkd, where the caller does unusual things:
 *  - calls the library from inside the progress callback (cancel, ping, a
 *    device job queued behind the task, dspk_wait of the very ticket): the
 *    call that invoked the callback still gets its answer, read by the
 *    nested call and kept; the callback is never entered twice at once;
 *  - a daemon that stops answering (SIGSTOP): dspk_set_timeout and
 *    dspk_connect_timeout bound every wait (signals do not end them), late
 *    answers are dropped and the connection stays usable, a request cut
 *    in the middle leaves it unusable;
 *  - every failing call leaves a message in dspk_last_error();
 *  - dspk_wait_any's *ticket on failure, dspk_tensor_numel's rules.
 * The progress notifications come from a fir on cpu:0 that autotunes (the
 * daemon has a fresh cache; the autotune decisions are cleared before each).
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/lib_internal.h"
#include "daemon_spawn.h"
#include "dspk/dspk.h"

static const char *dspkd_path;
static char tmpdir[64];
static char sockpath[128];
static pid_t daemon_pid = -1;
static dspk_client *C;

/* Starts dspkd on sock (with a cache in tmpdir when cache is set) and waits
 * for its READY line: its pid, or -1. */
static pid_t spawn_daemon(const char *sock, bool cache) {
  char db[160];
  snprintf(db, sizeof db, "%s/cache.db", tmpdir);
  const char *args[] = {"--backends", "cpu", "--log-level", "warn",
                        cache ? "--cache" : "--no-cache", cache ? db : NULL, NULL};
  return daemon_spawn(dspkd_path, sock, args);
}

static int start_daemon(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/dspk-test-XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  snprintf(sockpath, sizeof sockpath, "%s/dspkd.sock", tmpdir);
  if ((daemon_pid = spawn_daemon(sockpath, true)) < 0)
    return -1;
  if (dspk_connect(sockpath, "test_robust", &C) != 0) {
    fprintf(stderr, "connect: %s\n", dspk_connect_error());
    return -1;
  }
  return 0;
}

static int stop_daemon(void **state) {
  (void)state;
  int st = 0;
  char db[160];
  dspk_close(C);
  C = NULL;
  if (daemon_pid > 0 && daemon_stop(daemon_pid, &st) != 0)
    return -1;
  unlink(sockpath);
  snprintf(db, sizeof db, "%s/cache.db", tmpdir);
  unlink(db);
  for (const char *sfx = "-wal"; sfx; sfx = sfx[1] == 'w' ? "-shm" : NULL) {
    char f[200];
    snprintf(f, sizeof f, "%s%s", db, sfx);
    unlink(f);
  }
  rmdir(tmpdir);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "dspkd exited with status %#x\n", st);
    return -1;
  }
  return 0;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- a fir that autotunes, and its reference ------------------------------ */

#define FIR_B 8
#define FIR_N 4096
#define FIR_K 129

static float fir_x[FIR_B * FIR_N], fir_h[FIR_K];
static dspk_tensor fir_in[2];

/* A fir task on cpu:0 whose path is tuned afresh (autotune decisions
 * cleared), so that the daemon sends task.progress notifications. */
static void fir_task(dspk_task *t) {
  int64_t sx[2] = {FIR_B, FIR_N}, sh[1] = {FIR_K};
  uint32_t s = 12345;
  for (size_t i = 0; i < FIR_B * FIR_N; i++) {
    s = s * 1103515245u + 12345u;
    fir_x[i] = (float)((s >> 8) % 2001) / 1000.0f - 1.0f;
  }
  for (size_t i = 0; i < FIR_K; i++) {
    s = s * 1103515245u + 12345u;
    fir_h[i] = (float)((s >> 8) % 2001) / 1000.0f - 1.0f;
  }
  assert_int_equal(dspk_cache_clear(C, DSPK_CACHE_AUTOTUNE, NULL), 0);
  dspk_task_init(t, DSPK_OP_FIR);
  t->device = "cpu:0";
  dspk_tensor_inline(&fir_in[0], DSPK_F32, 2, sx, fir_x);
  dspk_tensor_inline(&fir_in[1], DSPK_F32, 1, sh, fir_h);
  t->ninputs = 2;
  t->inputs = fir_in;
}

/* The result against direct convolution, y[n] = sum_{k<=n} h[k] x[n-k]. */
static void fir_check(const dspk_result *r) {
  assert_int_equal(r->nout, 1);
  assert_int_equal(r->out[0].nbytes, sizeof fir_x);
  const float *y = r->out[0].data;
  for (size_t b = 0; b < FIR_B; b++)
    for (size_t n = 0; n < FIR_N; n += 37) {
      double acc = 0;
      for (size_t k = 0; k < FIR_K && k <= n; k++)
        acc += (double)fir_h[k] * fir_x[b * FIR_N + n - k];
      if (fabs(acc - y[b * FIR_N + n]) > 1e-3 * (1 + fabs(acc)))
        fail_msg("fir[%zu][%zu] = %g, expected %g", b, n, y[b * FIR_N + n], acc);
    }
}

/* ---- calls from the progress callback ------------------------------------ */

struct cb_state {
  int mode;             /* what the first call does (below) */
  int calls, depth, max_depth;
  bool after_first;     /* a notification came after the first call returned */
  bool first_done;
  double last_fraction;
  char last_what[64];
  bool fractions_ordered;
  uint32_t ticket;      /* the task's, from the notification */
  int nested_rc, nested_rc2;
  char nested_msg[256]; /* CB_CLOSE: dspk_last_error of its call after the close */
  size_t kept;          /* answers kept by the nested calls (C->ndone) */
  bool canceled;
  dspk_result nested_res;
};

enum { CB_DEVICE_JOB, CB_CANCEL, CB_PING, CB_WAIT_SAME, CB_CLOSE };

static void cb(void *ud, uint32_t ticket, const char *what, double fraction) {
  struct cb_state *s = ud;
  s->calls++;
  if (++s->depth > s->max_depth)
    s->max_depth = s->depth;
  if (s->first_done)
    s->after_first = true;
  /* Within a step (one what) fractions only grow; a 0 starts the next step
   * (protocol.md, task.progress: a 0 and a 1 for each FFTW plan, then the
   * fir's own choice). */
  if (strcmp(what, s->last_what) != 0)
    s->last_fraction = 0;
  if (fraction < s->last_fraction && fraction != 0 && ticket == s->ticket)
    s->fractions_ordered = false;
  s->last_fraction = fraction;
  snprintf(s->last_what, sizeof s->last_what, "%s", what);
  if (s->calls == 1) {
    s->ticket = ticket;
    switch (s->mode) {
    case CB_DEVICE_JOB: {
      /* A job on cpu:0 starts after the fir (requests of one connection on
       * one device start in order), so its answer comes after the fir's:
       * this call reads the fir's answer (and its later notifications). */
      uint64_t id = 0;
      s->nested_rc = dspk_buffer_create(C, "cpu:0", 64, &id);
      s->kept = C->ndone;
      if (s->nested_rc == 0)
        s->nested_rc2 = dspk_buffer_free(C, id);
      break;
    }
    case CB_CANCEL:
      s->nested_rc = dspk_cancel(C, ticket, &s->canceled);
      s->nested_rc2 = dspk_ping(C, "x", 1);
      break;
    case CB_PING:
      s->nested_rc = dspk_ping(C, "inside", 6);
      break;
    case CB_CLOSE: /* its own client: ended now, freed later */
      dspk_close(C);
      s->nested_rc = dspk_ping(C, "x", 1);
      snprintf(s->nested_msg, sizeof s->nested_msg, "%s", dspk_last_error(C));
      break;
    case CB_WAIT_SAME: /* the ticket the outer dspk_wait waits for */
      s->nested_rc = dspk_wait(C, ticket, &s->nested_res);
      break;
    }
    s->first_done = true;
  }
  s->depth--;
}

static void test_progress_device_job(void **state) {
  (void)state;
  struct cb_state s = {.mode = CB_DEVICE_JOB, .fractions_ordered = true};
  dspk_task t;
  dspk_result r;
  fir_task(&t);
  assert_int_equal(dspk_set_timeout(C, 60000), 0); /* a hang fails, not blocks */
  dspk_set_progress(C, cb, &s);
  assert_int_equal(dspk_run(C, &t, &r), 0);
  dspk_set_progress(C, NULL, NULL);
  fir_check(&r);
  dspk_result_free(&r);
  assert_true(s.calls >= 2); /* the tuning's steps: at least its end (1.0) */
  assert_int_equal(s.nested_rc, 0);
  assert_int_equal(s.nested_rc2, 0);
  /* The nested call read the fir's answer and kept it for dspk_run. */
  assert_int_equal(s.kept, 1);
  /* Later notifications, read by the nested call, came after it returned. */
  assert_int_equal(s.max_depth, 1);
  assert_true(s.after_first);
  assert_true(s.fractions_ordered);
  assert_int_equal(C->ndone, 0);
  assert_int_equal(C->ninflight, 0);
  assert_int_equal(dspk_ping(C, "after", 5), 0);
  assert_int_equal(dspk_set_timeout(C, 0), 0);
}

static void test_progress_cancel(void **state) {
  (void)state;
  struct cb_state s = {.mode = CB_CANCEL, .fractions_ordered = true};
  dspk_task t;
  dspk_result r;
  int rc;
  fir_task(&t);
  assert_int_equal(dspk_set_timeout(C, 60000), 0);
  dspk_set_progress(C, cb, &s);
  rc = dspk_run(C, &t, &r);
  dspk_set_progress(C, NULL, NULL);
  /* Canceled, or done first (a running task may finish) */
  assert_true(rc == 0 || rc == DSPK_ECANCELED);
  if (rc == 0) {
    assert_false(s.canceled);
    fir_check(&r);
    dspk_result_free(&r);
  } else {
    assert_true(s.canceled);
  }
  assert_int_equal(s.nested_rc, 0);
  assert_int_equal(s.nested_rc2, 0);
  assert_int_equal(s.max_depth, 1);
  assert_int_equal(C->ninflight, 0);
  assert_int_equal(dspk_ping(C, "after", 5), 0);
  assert_int_equal(dspk_set_timeout(C, 0), 0);
}

static void test_progress_ping_submit_wait(void **state) {
  (void)state;
  struct cb_state s = {.mode = CB_PING, .fractions_ordered = true};
  dspk_task t;
  dspk_result r;
  uint32_t ticket;
  fir_task(&t);
  assert_int_equal(dspk_set_timeout(C, 60000), 0);
  dspk_set_progress(C, cb, &s);
  assert_int_equal(dspk_submit(C, &t, &ticket), 0);
  assert_int_equal(dspk_wait(C, ticket, &r), 0);
  dspk_set_progress(C, NULL, NULL);
  fir_check(&r);
  dspk_result_free(&r);
  assert_int_equal(s.ticket, ticket);
  assert_int_equal(s.nested_rc, 0);
  assert_int_equal(s.max_depth, 1);
  assert_int_equal(dspk_set_timeout(C, 0), 0);
}

/* The callback waits for the ticket the outer dspk_wait waits for: the
 * nested wait gets the result, the outer one DSPK_ENOENT (consumed). */
static void test_progress_wait_same_ticket(void **state) {
  (void)state;
  struct cb_state s = {.mode = CB_WAIT_SAME, .fractions_ordered = true};
  dspk_task t;
  dspk_result r;
  uint32_t ticket;
  fir_task(&t);
  assert_int_equal(dspk_set_timeout(C, 60000), 0);
  dspk_set_progress(C, cb, &s);
  assert_int_equal(dspk_submit(C, &t, &ticket), 0);
  assert_int_equal(dspk_wait(C, ticket, &r), DSPK_ENOENT);
  assert_non_null(strstr(dspk_last_error(C), "progress callback"));
  dspk_set_progress(C, NULL, NULL);
  assert_int_equal(s.nested_rc, 0);
  fir_check(&s.nested_res);
  dspk_result_free(&s.nested_res);
  assert_int_equal(s.max_depth, 1);
  assert_int_equal(dspk_ping(C, "after", 5), 0);
  assert_int_equal(dspk_set_timeout(C, 0), 0);
}

/* dspk_close of the client from its own callback: the run fails with
 * DSPK_ECLOSED, and a second dspk_close frees it (valgrind: no leak, no use
 * after free). */
static void test_progress_close(void **state) {
  (void)state;
  struct cb_state s = {.mode = CB_CLOSE, .fractions_ordered = true};
  dspk_client *keep = C;
  dspk_task t;
  dspk_result r;
  fir_task(&t);
  dspk_set_progress(C, cb, &s);
  assert_int_equal(dspk_run(C, &t, &r), DSPK_ECLOSED);
  /* The first call to fail says it as it is (here the callback's own call
   * after its dspk_close), every later one "connection is no longer usable:
   * " before it (dspk.h); none said it as it is before. */
  assert_int_equal(s.nested_rc, DSPK_ECLOSED);
  assert_string_equal(s.nested_msg, "closed by dspk_close from the progress callback");
  assert_string_equal(dspk_last_error(C), "connection is no longer usable: closed by "
                                          "dspk_close from the progress callback");
  assert_int_equal(dspk_ping(C, "x", 1), DSPK_ECLOSED);
  assert_string_equal(dspk_last_error(C), "connection is no longer usable: closed by "
                                          "dspk_close from the progress callback");
  dspk_close(keep);
  assert_int_equal(dspk_connect(sockpath, "test_robust", &C), 0);
}

/* ---- a daemon that stops answering ---------------------------------------- */

static volatile sig_atomic_t alarms;
static void on_alarm(int sig) {
  (void)sig;
  alarms++;
}

/* The daemon's count of this connection's buffers (status). */
static long my_buffers(dspk_client *c) {
  dspk_status *st;
  long b = -1;
  if (dspk_status_get(c, &st) != 0)
    return -1;
  for (size_t i = 0; i < st->nclients; i++)
    if (st->clients[i].pid == getpid() && strcmp(st->clients[i].name, "stopped") == 0)
      b = (long)st->clients[i].buffers;
  dspk_status_free(st);
  return b;
}

static void expect_timeout(dspk_client *c, int rc, int64_t t0, int ms) {
  int64_t took = mono_ms() - t0;
  assert_int_equal(rc, DSPK_ETIMEDOUT);
  assert_non_null(strstr(dspk_last_error(c), "ms"));
  assert_true(took >= ms - 5);
  assert_true(took < ms + 5000);
}

static void test_timeout_stopped_daemon(void **state) {
  (void)state;
  char sock[160];
  dspk_client *c, *c2;
  pid_t pid;
  int64_t t0;
  void *p;
  uint64_t id;
  struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
  struct itimerval it = {{0, 50000}, {0, 50000}};
  dspk_task t;
  dspk_result r;
  uint32_t ticket, got = 0;
  float v[4] = {-1, 2, -3, 4};
  int64_t sh[1] = {4};
  dspk_tensor in;

  snprintf(sock, sizeof sock, "%s/stopped.sock", tmpdir);
  pid = spawn_daemon(sock, false);
  assert_true(pid > 0);
  assert_int_equal(dspk_connect_timeout(sock, "stopped", 2000, &c), 0);
  assert_int_equal(dspk_set_timeout(c, -1), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(c), "dspk_set_timeout"));
  assert_int_equal(dspk_set_timeout(NULL, 5), DSPK_EINVAL);
  assert_int_equal(dspk_set_timeout(c, 300), 0);
  assert_int_equal(dspk_shared_alloc(c, NULL, 4096, &p, &id), 0);
  assert_int_equal(my_buffers(c), 1);

  assert_int_equal(kill(pid, SIGSTOP), 0);
  /* A ping waits 300 ms, interrupted every 50 ms by a handler without
   * SA_RESTART: the signals do not end it, the timeout does. */
  sigaction(SIGALRM, &sa, NULL);
  setitimer(ITIMER_REAL, &it, NULL);
  t0 = mono_ms();
  expect_timeout(c, dspk_ping(c, "a", 1), t0, 300);
  assert_non_null(strstr(dspk_last_error(c), "within 300 ms (dspk_set_timeout)"));
  memset(&it, 0, sizeof it);
  setitimer(ITIMER_REAL, &it, NULL);
  signal(SIGALRM, SIG_DFL);
  assert_true(alarms >= 2);
  /* dspk_connect's hello */
  t0 = mono_ms();
  c2 = NULL;
  assert_int_equal(dspk_connect_timeout(sock, "stopped2", 300, &c2), DSPK_ETIMEDOUT);
  assert_null(c2);
  assert_true(mono_ms() - t0 >= 295);
  assert_non_null(strstr(dspk_connect_error(), "hello"));
  /* The timeout is named by the call that set it. */
  assert_non_null(strstr(dspk_connect_error(), "within 300 ms (dspk_connect_timeout)"));
  /* Buffers made late are freed when their answers come; a shared free
   * unmaps at once; a task's answer is given up on. */
  t0 = mono_ms();
  expect_timeout(c, dspk_buffer_create(c, NULL, 64, &id), t0, 300);
  t0 = mono_ms();
  expect_timeout(c, dspk_shared_alloc(c, NULL, 8192, &p, &id) , t0, 300);
  t0 = mono_ms();
  expect_timeout(c, dspk_shared_free(c, c->shm[0].ptr), t0, 300);
  assert_int_equal(c->nshm, 0);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.map.fn = DSPK_MAP_ABS;
  t.device = "cpu:0";
  dspk_tensor_inline(&in, DSPK_F32, 1, sh, v);
  t.ninputs = 1;
  t.inputs = &in;
  assert_int_equal(dspk_submit(c, &t, &ticket), 0);
  t0 = mono_ms();
  expect_timeout(c, dspk_wait(c, ticket, &r), t0, 300);
  assert_int_equal(dspk_wait(c, ticket, &r), DSPK_ENOENT); /* consumed */
  /* dspk_wait_any gives up on nothing */
  assert_int_equal(dspk_submit(c, &t, &ticket), 0);
  t0 = mono_ms();
  expect_timeout(c, dspk_wait_any(c, &got, &r), t0, 300);
  assert_int_equal(got, 0); /* not written: no request was answered */
  t0 = mono_ms();
  expect_timeout(c, dspk_run(c, &t, &r), t0, 300);

  /* The daemon answers again: the late answers are dropped, the buffers
   * they made freed; the connection works. */
  assert_int_equal(kill(pid, SIGCONT), 0);
  assert_int_equal(dspk_set_timeout(c, 10000), 0);
  assert_int_equal(dspk_wait(c, ticket, &r), 0); /* the wait_any's request */
  assert_int_equal(r.nout, 1);
  assert_true(((const float *)r.out[0].data)[2] == 3.0f);
  dspk_result_free(&r);
  /* A task on cpu:0 answers after every earlier one (the given-up run's
   * too); status, answered in order after the buffer.free requests sent for
   * the late buffers, then counts none of them. */
  assert_int_equal(dspk_run(c, &t, &r), 0);
  dspk_result_free(&r);
  assert_int_equal(my_buffers(c), 0);
  assert_int_equal(c->nabandoned, 0); /* every late answer was read */
  assert_int_equal(c->ninflight, 0);
  assert_int_equal(dspk_ping(c, "b", 1), 0);

  /* A request cut in the middle: the connection is unusable after. */
  {
    size_t n = (size_t)64 << 20;
    char *big = calloc(1, n);
    assert_non_null(big);
    assert_int_equal(dspk_buffer_create(c, NULL, n, &id), 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_int_equal(dspk_set_timeout(c, 300), 0);
    t0 = mono_ms();
    expect_timeout(c, dspk_buffer_write(c, id, 0, big, n), t0, 300);
    assert_non_null(strstr(dspk_last_error(c), "unusable"));
    assert_int_equal(dspk_ping(c, "d", 1), DSPK_ETIMEDOUT);
    assert_non_null(strstr(dspk_last_error(c), "no longer usable"));
    free(big);
  }
  dspk_close(c);
  kill(pid, SIGCONT);
  kill(pid, SIGTERM);
  assert_int_equal(waitpid(pid, NULL, 0), pid);
  unlink(sock);
}

/* A listener that never accepts, its backlog full: connect(2) itself would
 * block; dspk_connect_timeout ends it. */
static void test_connect_timeout_backlog(void **state) {
  (void)state;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int l, fill[4], nfill = 0;
  dspk_client *c = NULL;
  int64_t t0;

  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/full.sock", tmpdir);
  l = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(l >= 0);
  assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(l, 0), 0);
  /* Fill the backlog: non-blocking connects until one is refused. */
  for (;;) {
    int f = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    assert_true(f >= 0);
    if (connect(f, (struct sockaddr *)&sa, sizeof sa) != 0) {
      assert_int_equal(errno, EAGAIN);
      close(f);
      break;
    }
    assert_true(nfill < 4);
    fill[nfill++] = f;
  }
  t0 = mono_ms();
  assert_int_equal(dspk_connect_timeout(sa.sun_path, "full", 300, &c), DSPK_ETIMEDOUT);
  assert_null(c);
  assert_true(mono_ms() - t0 >= 295);
  assert_non_null(strstr(dspk_connect_error(), "accepted no connection"));
  for (int i = 0; i < nfill; i++)
    close(fill[i]);
  close(l);
  unlink(sa.sun_path);
}

/* ---- every failing call leaves a message --------------------------------- */

static void test_failures_have_messages(void **state) {
  (void)state;
  char path[200], dir[200];
  int pfd[2], fds[8], nf = 0, rc;
  void *p = NULL;
  uint64_t id = 0;
  uint32_t tk = 0;
  dspk_result r;
  char *json = NULL;
  char buf[16] = {0};

  snprintf(path, sizeof path, "%s/short.bin", tmpdir);
  snprintf(dir, sizeof dir, "%s/d", tmpdir);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "0123456789", 10), 10);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_int_equal(pipe(pfd), 0);
  fds[nf++] = fd;
  fds[nf++] = pfd[0];
  fds[nf++] = open(dir, O_RDONLY | O_DIRECTORY);
  fds[nf++] = open(path, O_WRONLY);
  fds[nf++] = 999;

#define FAILS(call)                                                                    \
  do {                                                                                 \
    assert_int_equal(dspk_ping(C, "ok", 2), 0); /* clears the message */               \
    rc = (call);                                                                       \
    if (rc >= 0 || dspk_last_error(C)[0] == '\0')                                      \
      fail_msg("%s -> %d, dspk_last_error \"%s\"", #call, rc, dspk_last_error(C));   \
  } while (0)

  /* dspk_shared_from_file: short file, offset past the end, a pipe, a
   * directory, a write-only descriptor, no descriptor */
  FAILS(dspk_shared_from_file(C, NULL, fd, 0, 4096, &p, &id));
  assert_int_equal(rc, DSPK_EIO);
  assert_non_null(strstr(dspk_last_error(C), "ends before"));
  FAILS(dspk_shared_from_file(C, NULL, fd, 100, 4, &p, &id));
  for (int i = 1; i < nf; i++)
    FAILS(dspk_shared_from_file(C, NULL, fds[i], 0, 4096, &p, &id));
  FAILS(dspk_shared_from_file(C, NULL, -1, 0, 4096, &p, &id));
  FAILS(dspk_shared_from_file(C, NULL, fd, 0, 0, &p, &id));
  FAILS(dspk_shared_from_file(C, "nodev:7", fd, 0, 4, &p, &id));
  FAILS(dspk_shared_alloc(C, "", 64, &p, &id));
  FAILS(dspk_shared_alloc(C, NULL, 0, &p, &id));
  FAILS(dspk_shared_free(C, buf));
  FAILS(dspk_buffer_create(C, "nodev:7", 64, &id));
  FAILS(dspk_buffer_free(C, 987654));
  FAILS(dspk_buffer_read(C, 987654, 0, buf, 4));
  FAILS(dspk_buffer_write(C, 987654, 0, buf, 4));
  FAILS(dspk_file_data(C, NULL, 4, fd, 0));
  FAILS(dspk_file_data(C, buf, 4, -1, 0));
  FAILS(dspk_call_json(C, "no.such.method", &json));
  FAILS(dspk_trace(C, 0, &json));
  FAILS(dspk_cache_clear(C, 64, NULL));
  FAILS(dspk_wait(C, 4242, &r));
  FAILS(dspk_wait_any(C, &tk, &r));
  FAILS(dspk_set_timeout(C, -5));
  FAILS(dspk_ping(C, NULL, 4));
  FAILS(dspk_devices(C, false, NULL));
  FAILS(dspk_status_get(C, NULL));
  FAILS(dspk_metrics(C, NULL));
  {
    dspk_task t;
    dspk_tensor in;
    int64_t sh[1] = {-1};
    float v[1] = {0};
    dspk_task_init(&t, DSPK_OP_MAP);
    t.map.fn = DSPK_MAP_ABS;
    dspk_tensor_inline(&in, DSPK_F32, 1, sh, v);
    t.ninputs = 1;
    t.inputs = &in;
    FAILS(dspk_run(C, &t, &r));
    FAILS(dspk_submit(C, &t, &tk));
    FAILS(dspk_run(C, NULL, &r));
  }
  for (int i = 0; i < nf; i++)
    if (fds[i] != 999)
      close(fds[i]);
  close(pfd[1]);
  unlink(path);
  rmdir(dir);
  assert_int_equal(C->nshm, 0); /* nothing left mapped */
#undef FAILS
}

/* ---- dspk_wait_any's *ticket, dspk_tensor_numel ---------------------------- */

static void test_wait_any_ticket(void **state) {
  (void)state;
  dspk_task t;
  dspk_tensor in;
  dspk_result r;
  float v[4] = {1, 2, 3, 4};
  int64_t sh[1] = {4};
  uint32_t ticket, got = 0;

  dspk_task_init(&t, DSPK_OP_MAP);
  t.map.fn = DSPK_MAP_ADD; /* needs two inputs: the daemon refuses it */
  t.device = "cpu:0";
  dspk_tensor_inline(&in, DSPK_F32, 1, sh, v);
  t.ninputs = 1;
  t.inputs = &in;
  assert_int_equal(dspk_submit(C, &t, &ticket), 0);
  assert_int_equal(dspk_wait_any(C, &got, &r), DSPK_EINVAL);
  assert_int_equal(got, ticket); /* which request failed */
  got = 77;
  assert_int_equal(dspk_wait_any(C, &got, &r), DSPK_ENOENT);
  assert_int_equal(got, 77); /* none answered: left alone */
}

static void test_numel(void **state) {
  (void)state;
  dspk_tensor t;
  int64_t s1[2] = {-1, 0}, s2[2] = {0, -1}, s3[3] = {0, INT64_C(1) << 62, 4},
          s4[2] = {INT64_C(1) << 62, 8}, s5[2] = {3, 5};
  dspk_tensor_inline(&t, DSPK_F32, 2, s1, NULL);
  assert_true(dspk_tensor_numel(&t) == UINT64_MAX);
  dspk_tensor_inline(&t, DSPK_F32, 2, s2, NULL);
  assert_true(dspk_tensor_numel(&t) == UINT64_MAX);
  dspk_tensor_inline(&t, DSPK_F32, 3, s3, NULL);
  assert_true(dspk_tensor_numel(&t) == 0);
  dspk_tensor_inline(&t, DSPK_F32, 2, s4, NULL);
  assert_true(dspk_tensor_numel(&t) == UINT64_MAX);
  dspk_tensor_inline(&t, DSPK_F32, 2, s5, NULL);
  assert_true(dspk_tensor_numel(&t) == 15);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-DSPKD\n", argv[0]);
    return 2;
  }
  dspkd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_progress_device_job),
      cmocka_unit_test(test_progress_cancel),
      cmocka_unit_test(test_progress_ping_submit_wait),
      cmocka_unit_test(test_progress_wait_same_ticket),
      cmocka_unit_test(test_progress_close),
      cmocka_unit_test(test_timeout_stopped_daemon),
      cmocka_unit_test(test_connect_timeout_backlog),
      cmocka_unit_test(test_failures_have_messages),
      cmocka_unit_test(test_wait_any_ticket),
      cmocka_unit_test(test_numel),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
