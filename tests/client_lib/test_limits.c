/*
 * libdspkclient under the limits a caller's process may run with, and with
 * arguments at the edges of their types, against a real dspkd (argv[1]):
 *  - a file size limit (RLIMIT_FSIZE): the library's growth of its memfds
 *    and of a dspk_result_to_file file fails (DSPK_ELIMIT, the socket, the
 *    result kept in memory) instead of SIGXFSZ killing the process;
 *  - dspk_file_data and dspk_shared_from_file ranges that wrap: DSPK_EINVAL;
 *  - a dspk_file_data file that shrank: DSPK_EIO for an operand of any size
 *    and for dspk_buffer_write's local copy (a short operand, a large one's
 *    temporary and that copy read the mapping: SIGBUS);
 *  - a refused dspk_file_data (each kind of refusal) at a registered
 *    range's start, or a dspk_result_to_file refused for a ticket that has
 *    a file, changes nothing (the range was dropped: SIGBUS);
 *  - many answers read ahead of their waits: each costs O(1) (kept answers
 *    were found by a linear scan and rbuf moved for each frame);
 *  - a 63-byte client name with bytes that are not UTF-8 connects;
 *  - a tensor whose byte size overflows: one refusal, DSPK_ELIMIT, that
 *    never states a wrapped size;
 *  - daemons with a small max_message (64, 1024, 4095, 64 KiB bytes): the
 *    library computes every size from hello's value, and operands and
 *    results that cannot cross the socket take shared temporaries whatever
 *    the shared threshold.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon_spawn.h"
#include "dspk/dspk.h"

static const char *dspkd_path;
static char tmpdir[64];
static char sockpath[128];
static char floodsock[160];
static pid_t daemon_pid = -1, flood_pid = -1;
/* Daemons of spawn_mm still running: a failed test leaves its own, which
 * the group's teardown stops. */
static pid_t mm_pids[4];
/* dspk.h's words for a file range whose file ended before an operand's
 * bytes (on the sendfile path and the copy into a temporary alike). */
static const char FILE_ENDED[] = "an input file ended before its data was sent "
                                 "(changed while in use?)";

static int start_daemons(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/dspk-limits-XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  snprintf(sockpath, sizeof sockpath, "%s/dspkd.sock", tmpdir);
  const char *args[] = {"--backends", "cpu", "--log-level", "warn", "--no-cache", NULL};
  if ((daemon_pid = daemon_spawn(dspkd_path, sockpath, args)) < 0)
    return -1;
  /* Few tasks at once and little room for unsent answers: a client that
   * submits many reads their answers while it waits for room to send, and
   * keeps them for their waits. */
  const char *flood[] = {"--backends", "cpu", "--log-level", "warn", "--no-cache",
                         "--max-unsent", "65536", "--max-inflight", "16",
                         "--max-message", "1M", NULL};
  snprintf(floodsock, sizeof floodsock, "%s/flood.sock", tmpdir);
  if ((flood_pid = daemon_spawn(dspkd_path, floodsock, flood)) < 0)
    return -1;
  return 0;
}

static int stop_daemons(void **state) {
  int st = 0, st2 = 0;
  (void)state;
  for (size_t i = 0; i < 4; i++) /* those a failed test left */
    if (mm_pids[i] > 0 && daemon_stop(mm_pids[i], &st) != 0)
      return -1;
  if (flood_pid > 0 && daemon_stop(flood_pid, &st2) != 0)
    return -1;
  unlink(floodsock);
  if (daemon_pid > 0 && daemon_stop(daemon_pid, &st) != 0)
    return -1;
  unlink(sockpath);
  rmdir(tmpdir);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && WIFEXITED(st2) && WEXITSTATUS(st2) == 0
             ? 0
             : -1;
}

static int tmpfile_rw(const char *name) {
  char path[160];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  unlink(path);
  return fd;
}

/* ---- RLIMIT_FSIZE ------------------------------------------------------- */

/* The child's checks: each failure exits with its own status (the parent
 * names it); 0 when all held.  A SIGXFSZ kills the child instead. */
#define CHILD_CHECK(cond, code) \
  do {                          \
    if (!(cond))                \
      _exit(code);              \
  } while (0)

static void fsize_child(int src) {
  const size_t big = (size_t)4 << 20;
  const int64_t n = (int64_t)(big / sizeof(float)), rn = 65536; /* 256 KiB result */
  struct rlimit rl = {(rlim_t)1 << 20, (rlim_t)1 << 20};
  dspk_client *c = NULL;
  void *p = NULL;
  uint64_t id = 0;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t tk;
  bool written = true;
  float *x = malloc(big);
  int out;

  CHILD_CHECK(x != NULL, 2);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(i % 97);
  out = tmpfile_rw("fsize.out");
  CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, 3);
  CHILD_CHECK(dspk_connect(sockpath, "fsize", &c) == 0, 4);
  /* Shared memory beyond the limit: the library's refusal, naming it. */
  CHILD_CHECK(dspk_shared_alloc(c, NULL, big, &p, &id) == DSPK_ELIMIT, 10);
  CHILD_CHECK(strstr(dspk_last_error(c), "RLIMIT_FSIZE") != NULL, 11);
  CHILD_CHECK(dspk_shared_from_file(c, NULL, src, 0, big, &p, &id) == DSPK_ELIMIT, 12);
  CHILD_CHECK(strstr(dspk_last_error(c), "RLIMIT_FSIZE") != NULL, 13);
  /* A 4 MiB operand above the 1 MiB threshold: no temporary to be had, so
   * it crosses the socket, and its 4 MiB result too. */
  dspk_tensor_inline(&in, DSPK_F32, 1, &n, x);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.map.fn = DSPK_MAP_SCALE;
  t.map.alpha = 2.0;
  t.inputs = &in;
  t.ninputs = 1;
  CHILD_CHECK(dspk_run(c, &t, &r) == 0, 20);
  CHILD_CHECK(r.nout == 1 && r.out[0].nbytes == big, 21);
  for (int64_t i = 0; i < n; i++)
    CHILD_CHECK(((const float *)r.out[0].data)[i] == x[i] * 2.0f, 22);
  dspk_result_free(&r);
  /* A result to a file that may not grow that far: it stays in memory. */
  rl.rlim_cur = (rlim_t)128 << 10;
  CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, 3);
  in.shape[0] = rn;
  in.nbytes = (size_t)rn * sizeof(float);
  CHILD_CHECK(dspk_submit(c, &t, &tk) == 0, 30);
  CHILD_CHECK(dspk_result_to_file(c, tk, out, 0, &written) == 0, 31);
  CHILD_CHECK(dspk_wait(c, tk, &r) == 0, 32);
  CHILD_CHECK(!written, 33);
  for (int64_t i = 0; i < rn; i++)
    CHILD_CHECK(((const float *)r.out[0].data)[i] == x[i] * 2.0f, 34);
  dspk_result_free(&r);
  /* Kept answers read while waiting for another (dspk__sink_write). */
  uint32_t tk2;
  written = true;
  CHILD_CHECK(dspk_submit(c, &t, &tk) == 0, 40);
  CHILD_CHECK(dspk_submit(c, &t, &tk2) == 0, 41);
  CHILD_CHECK(dspk_result_to_file(c, tk2, out, 0, &written) == 0, 42);
  CHILD_CHECK(dspk_wait(c, tk, &r) == 0, 43);
  dspk_result_free(&r);
  CHILD_CHECK(dspk_wait(c, tk2, &r) == 0, 44);
  CHILD_CHECK(!written, 45);
  CHILD_CHECK(((const float *)r.out[0].data)[rn - 1] == x[rn - 1] * 2.0f, 46);
  dspk_result_free(&r);
  CHILD_CHECK(dspk_ping(c, "x", 1) == 0, 50);
  /* No descriptor left (RLIMIT_NOFILE at the lowest free one): shared
   * memory is DSPK_ELIMIT naming the limit, as the Python client says it
   * (probe 20 D4: it was DSPK_ENOMEM), and an operand's temporary falls
   * back to the socket. */
  {
    struct rlimit nf, old_nf;
    int lowest = dup(0);
    CHILD_CHECK(lowest >= 0 && close(lowest) == 0, 60);
    CHILD_CHECK(getrlimit(RLIMIT_NOFILE, &old_nf) == 0, 61);
    nf = old_nf;
    nf.rlim_cur = (rlim_t)lowest;
    CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &nf) == 0, 62);
    CHILD_CHECK(dspk_shared_alloc(c, NULL, 4096, &p, &id) == DSPK_ELIMIT, 63);
    CHILD_CHECK(strstr(dspk_last_error(c), "RLIMIT_NOFILE") != NULL, 64);
    in.shape[0] = n;
    in.nbytes = big;
    CHILD_CHECK(dspk_run(c, &t, &r) == 0, 65);
    CHILD_CHECK(r.nout == 1 && r.out[0].nbytes == big, 66);
    for (int64_t i = 0; i < n; i++)
      CHILD_CHECK(((const float *)r.out[0].data)[i] == x[i] * 2.0f, 67);
    dspk_result_free(&r);
    CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &old_nf) == 0, 68);
  }
  dspk_close(c);
  free(x);
  _exit(0);
}

/* Under a file size limit no call of the library raises SIGXFSZ (whose
 * default action ends the process): shared memory beyond it is
 * DSPK_ELIMIT naming RLIMIT_FSIZE, an operand's temporary falls back to
 * the socket, a result the file cannot take stays in memory. */
static void test_file_size_limit(void **state) {
  const size_t big = (size_t)4 << 20;
  char *buf = calloc(1, big);
  int src = tmpfile_rw("fsize.src"), st = 0;
  pid_t pid;
  (void)state;
  assert_non_null(buf);
  assert_int_equal(write(src, buf, big), (ssize_t)big);
  free(buf);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    fsize_child(src);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  close(src);
  if (WIFSIGNALED(st))
    fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 0)
    fail_msg("the child's check %d failed", WEXITSTATUS(st));
}

/* ---- ranges ------------------------------------------------------------ */

/* A range whose end wraps (the address space, a file's largest offset) is
 * no range: DSPK_EINVAL, and operands outside what was registered still go
 * from memory. */
static void test_wrapping_ranges(void **state) {
  const int64_t n = 1000;
  float x[1000];
  dspk_client *c = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  void *p = NULL;
  uint64_t id = 0;
  int fd = tmpfile_rw("wrap.bin");
  char page[4096] = {0};
  (void)state;
  for (int i = 0; i < n; i++)
    x[i] = 2.0f;
  assert_int_equal(write(fd, page, sizeof page), (ssize_t)sizeof page);
  void *m = mmap(NULL, sizeof page, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  assert_int_equal(dspk_connect(sockpath, "wrap", &c), 0);
  assert_int_equal(dspk_file_data(c, m, SIZE_MAX, fd, 0), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(c), "wraps"));
  assert_int_equal(dspk_file_data(c, (void *)(uintptr_t)-16, 100, fd, 0), DSPK_EINVAL);
  assert_int_equal(dspk_file_data(c, m, (size_t)INT64_MAX + 1, fd, 0), DSPK_EINVAL);
  assert_int_equal(dspk_file_data(c, m, 16, fd, (uint64_t)INT64_MAX), DSPK_EINVAL);
  assert_int_equal(dspk_shared_from_file(c, NULL, fd, (uint64_t)INT64_MAX, 2, &p, &id),
                   DSPK_EINVAL);
  assert_int_equal(dspk_shared_from_file(c, NULL, fd, 0, SIZE_MAX, &p, &id), DSPK_EINVAL);
  /* The heap operand is no file's: sent from memory. */
  dspk_tensor_inline(&in, DSPK_F32, 1, &n, x);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_SUM;
  t.inputs = &in;
  t.ninputs = 1;
  assert_int_equal(dspk_run(c, &t, &r), 0);
  assert_true(*(const float *)r.out[0].data == 2000.0f);
  dspk_result_free(&r);
  dspk_close(c);
  munmap(m, sizeof page);
  close(fd);
}

/* A file range's bytes go with sendfile whatever their size (dspk.h): a
 * file that shrank under an operand of 100 floats, or a ping's 100 bytes,
 * is DSPK_EIO, as for a large one, not a SIGBUS from reading the mapping. */
static void test_file_data_shrunk_small(void **state) {
  const size_t n = 1 << 16, nb = n * sizeof(float);
  const int64_t k = 100;
  float *ones = malloc(nb);
  dspk_client *c = NULL, *c2 = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  int fd = tmpfile_rw("shrink.bin");
  (void)state;
  assert_non_null(ones);
  for (size_t i = 0; i < n; i++)
    ones[i] = 1.0f;
  assert_int_equal(write(fd, ones, nb), (ssize_t)nb);
  free(ones);
  float *m = mmap(NULL, nb, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  assert_int_equal(dspk_connect(sockpath, "shrink", &c), 0);
  assert_int_equal(dspk_connect(sockpath, "shrink2", &c2), 0);
  assert_int_equal(dspk_file_data(c, m, nb, fd, 0), 0);
  assert_int_equal(dspk_file_data(c2, m, nb, fd, 0), 0);
  dspk_tensor_inline(&in, DSPK_F32, 1, &k, m + n / 2 + 1024);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_SUM;
  t.inputs = &in;
  t.ninputs = 1;
  assert_int_equal(dspk_run(c, &t, &r), 0);
  assert_true(*(const float *)r.out[0].data == 100.0f);
  dspk_result_free(&r);
  assert_int_equal(ftruncate(fd, (off_t)(nb / 2)), 0); /* ends inside the range */
  assert_int_equal(dspk_run(c, &t, &r), DSPK_EIO);
  assert_string_equal(dspk_last_error(c), FILE_ENDED);
  assert_int_equal(dspk_ping(c2, m + n / 2 + 1024, 100), DSPK_EIO);
  assert_string_equal(dspk_last_error(c2), FILE_ENDED);
  dspk_close(c);
  dspk_close(c2);
  munmap(m, nb);
  close(fd);
}

/* The other ways a file range's bytes leave: dspk_buffer_write into a
 * shared allocation while nothing is in flight (a memmove here) and an
 * operand too large for the socket (copied into a temporary) read the file,
 * not the mapping: DSPK_EIO once the file shrank, not SIGBUS. */
static void test_file_data_shrunk_copies(void **state) {
  const size_t n = 1 << 18, nb = n * sizeof(float); /* 1 MiB */
  const int64_t k = 160 << 10;                       /* 640 KiB: half max_message or more */
  float *ones = malloc(nb);
  dspk_client *c = NULL, *c2 = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  void *sp = NULL;
  uint64_t sid = 0;
  int fd = tmpfile_rw("shrink2.bin");
  (void)state;
  assert_non_null(ones);
  for (size_t i = 0; i < n; i++)
    ones[i] = 1.0f;
  assert_int_equal(write(fd, ones, nb), (ssize_t)nb);
  free(ones);
  float *m = mmap(NULL, nb, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  assert_int_equal(dspk_connect(floodsock, "shrink-big", &c), 0); /* max_message 1 MiB */
  assert_int_equal(dspk_connect(sockpath, "shrink-write", &c2), 0);
  assert_int_equal(dspk_file_data(c, m, nb, fd, 0), 0);
  assert_int_equal(dspk_file_data(c2, m, nb, fd, 0), 0);
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", 4096, &sp, &sid), 0);
  dspk_tensor_inline(&in, DSPK_F32, 1, &k, m + 1024);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_SUM;
  t.inputs = &in;
  t.ninputs = 1;
  assert_int_equal(dspk_run(c, &t, &r), 0);
  assert_true(*(const float *)r.out[0].data == (float)k);
  dspk_result_free(&r);
  assert_int_equal(dspk_buffer_write(c2, sid, 0, m + n / 2, 100), 0);
  assert_true(((const float *)sp)[24] == 1.0f);
  assert_int_equal(ftruncate(fd, 4096), 0); /* both now end inside the range */
  assert_int_equal(dspk_run(c, &t, &r), DSPK_EIO);
  assert_string_equal(dspk_last_error(c), FILE_ENDED);
  assert_int_equal(dspk_buffer_write(c2, sid, 0, m + n / 2, 100), DSPK_EIO);
  assert_string_equal(dspk_last_error(c2), FILE_ENDED);
  dspk_close(c);
  dspk_close(c2);
  munmap(m, nb);
  close(fd);
}

/* ---- refused registrations ------------------------------------------------ */

/* Occupies every descriptor number below 64 (fds: those it took; the
 * count, or -1): a descriptor the library makes while they are held is 64
 * or more, and fds_limit then makes its next dup fail (EMFILE) even where
 * it closes one of its own first.  fds_give_back returns them and the
 * limit. */
static int fds_fill(int src, int *fds) {
  int n = 0, f;
  while ((f = dup(src)) >= 0 && f < 64)
    fds[n++] = f;
  if (f >= 64)
    close(f);
  return f >= 0 ? n : -1;
}

/* A soft RLIMIT_NOFILE of 64 (old: the limit before). */
static int fds_limit(struct rlimit *old) {
  struct rlimit low;
  if (getrlimit(RLIMIT_NOFILE, old) != 0)
    return -1;
  low = *old;
  low.rlim_cur = 64;
  return setrlimit(RLIMIT_NOFILE, &low);
}

static void fds_give_back(int *fds, int n, const struct rlimit *old) {
  (void)setrlimit(RLIMIT_NOFILE, old);
  while (n > 0)
    close(fds[--n]);
}

/* A child of these tests ends at its first failed check, or by a signal:
 * not through cmocka's handlers, which would go on with the parent's tests
 * in the child. */
static void child_signals(void) {
  static const int sigs[] = {SIGBUS, SIGSEGV, SIGILL, SIGFPE, SIGABRT, SIGSYS};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    signal(sigs[i], SIG_DFL);
}

/* The child of test_file_data_refused for one way out of a file range
 * (way 0: 100 floats, sent with sendfile; 1: all 4 MiB, above the shared
 * threshold, sent with sendfile too; 2: 640 KiB to a daemon of max_message
 * 1 MiB, read from the file into a temporary): every kind of refused
 * dspk_file_data at the range's start, then a successful one of another
 * length there, leave the range registered, so that once the file shrank
 * the operand is DSPK_EIO saying so (a dropped range sent it from the
 * mapping: SIGBUS, or EIO "Bad address"). */
static void refused_child(int fd, int way) {
  const size_t n = 1 << 20, nb = n * sizeof(float);
  const int64_t k = way == 0 ? 100 : way == 1 ? (int64_t)n : 160 << 10;
  const float *at;
  dspk_client *c = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  struct rlimit old;
  int spare[64], ns, closed, rc;
  float *m = mmap(NULL, nb, PROT_READ, MAP_SHARED, fd, 0);

  child_signals();
  CHILD_CHECK(m != MAP_FAILED, 2);
  at = way == 0 ? m + n / 2 + 1024 : way == 1 ? m : m + 1024;
  CHILD_CHECK(dspk_connect(way == 2 ? floodsock : sockpath, "refused", &c) == 0, 3);
  CHILD_CHECK((ns = fds_fill(fd, spare)) >= 0, 4);
  CHILD_CHECK(dspk_file_data(c, m, nb, fd, 0) == 0, 5);
  /* Refused: no descriptor left for the dup (the range's own, which the
   * call dropped first, freed none below the limit), a bad fd, an offset
   * past a file's largest, a wrapping range, an fd that is not open. */
  CHILD_CHECK(fds_limit(&old) == 0, 6);
  rc = dspk_file_data(c, m, 10, fd, 0);
  fds_give_back(spare, ns, &old);
  CHILD_CHECK(rc == DSPK_EIO, 10);
  CHILD_CHECK(dspk_file_data(c, m, 10, -1, 0) == DSPK_EINVAL, 11);
  CHILD_CHECK(dspk_file_data(c, m, 10, fd, (uint64_t)INT64_MAX) == DSPK_EINVAL, 12);
  CHILD_CHECK(dspk_file_data(c, m, SIZE_MAX, fd, 0) == DSPK_EINVAL, 13);
  closed = dup(fd); /* a number no descriptor has (none is opened below) */
  CHILD_CHECK(closed >= 0 && close(closed) == 0, 14);
  CHILD_CHECK(dspk_file_data(c, m, 10, closed, 0) == DSPK_EIO, 15);
  /* Another range at m, 10 bytes: the 4 MiB one stays and holds the operand. */
  CHILD_CHECK(dspk_file_data(c, m, 10, fd, 0) == 0, 16);
  dspk_tensor_inline(&in, DSPK_F32, 1, &k, at);
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.device = "cpu:0";
  t.reduce.fn = DSPK_REDUCE_SUM;
  t.inputs = &in;
  t.ninputs = 1;
  CHILD_CHECK(dspk_run(c, &t, &r) == 0, 20);
  CHILD_CHECK(*(const float *)r.out[0].data == (float)k, 21);
  dspk_result_free(&r);
  CHILD_CHECK(ftruncate(fd, 4096) == 0, 22); /* ends inside the operand */
  CHILD_CHECK(dspk_run(c, &t, &r) == DSPK_EIO, 30);
  CHILD_CHECK(strcmp(dspk_last_error(c), FILE_ENDED) == 0, 31);
  dspk_close(c);
  _exit(0);
}

/* A dspk_file_data call that fails changes nothing (dspk.h): the range
 * registered at the same address stays, on each way its bytes leave. */
static void test_file_data_refused(void **state) {
  static const char *const ways[] = {"a short operand (sendfile)",
                                     "an operand above the shared threshold (sendfile)",
                                     "an operand too large for the socket (read into a "
                                     "temporary)"};
  const size_t nb = (size_t)4 << 20;
  float *ones = malloc(nb);
  char why[512] = "";
  size_t at = 0;
  (void)state;
  assert_non_null(ones);
  for (size_t i = 0; i < nb / sizeof(float); i++)
    ones[i] = 1.0f;
  for (int way = 0; way < 3; way++) {
    int fd = tmpfile_rw("refused.bin"), st = 0;
    pid_t pid;
    assert_int_equal(write(fd, ones, nb), (ssize_t)nb);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
      refused_child(fd, way);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    close(fd);
    if (WIFSIGNALED(st))
      at += (size_t)snprintf(why + at, sizeof why - at, "%s: killed by signal %d (%s); ",
                             ways[way], WTERMSIG(st), strsignal(WTERMSIG(st)));
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      at += (size_t)snprintf(why + at, sizeof why - at, "%s: check %d failed; ", ways[way],
                             WEXITSTATUS(st));
  }
  free(ones);
  if (at)
    fail_msg("%s", why);
}

/* A dspk_result_to_file call that fails (no descriptor left for its dup)
 * leaves the ticket's earlier file registered: the answer goes there. */
static void refused_to_file_child(int outa, int outb) {
  const int64_t n = 65536; /* 256 KiB: at least 64 KiB */
  float *x = malloc(sizeof(float) * (size_t)n), back[4];
  dspk_client *c = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  struct rlimit old;
  uint32_t tk;
  bool wa = false, wb = true;
  int spare[64], ns, rc;

  child_signals();
  CHILD_CHECK(x != NULL, 2);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(i % 251);
  CHILD_CHECK(dspk_connect(sockpath, "refused_to_file", &c) == 0, 3);
  dspk_tensor_inline(&in, DSPK_F32, 1, &n, x);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.map.fn = DSPK_MAP_SCALE;
  t.map.alpha = 3.0;
  t.inputs = &in;
  t.ninputs = 1;
  CHILD_CHECK((ns = fds_fill(outb, spare)) >= 0, 4);
  CHILD_CHECK(dspk_submit(c, &t, &tk) == 0, 5);
  CHILD_CHECK(dspk_result_to_file(c, tk, outa, 0, &wa) == 0, 6);
  /* Refused: no descriptor left for the dup (the ticket's own, which the
   * call dropped first, freed none below the limit), an offset too large. */
  CHILD_CHECK(fds_limit(&old) == 0, 7);
  rc = dspk_result_to_file(c, tk, outb, 0, &wb);
  fds_give_back(spare, ns, &old);
  CHILD_CHECK(rc == DSPK_EIO, 10);
  CHILD_CHECK(dspk_result_to_file(c, tk, outb, (uint64_t)1 << 62, &wb) == DSPK_EINVAL, 11);
  CHILD_CHECK(dspk_wait(c, tk, &r) == 0, 20);
  CHILD_CHECK(wa, 21);
  CHILD_CHECK(wb, 22); /* untouched */
  CHILD_CHECK(((const float *)r.out[0].data)[n - 1] == x[n - 1] * 3.0f, 23);
  CHILD_CHECK(pread(outa, back, sizeof back, (off_t)(sizeof(float) * 1000)) == sizeof back, 24);
  for (int i = 0; i < 4; i++)
    CHILD_CHECK(back[i] == x[1000 + i] * 3.0f, 25);
  CHILD_CHECK(lseek(outb, 0, SEEK_END) == 0, 26); /* nothing went to the refused one */
  dspk_result_free(&r);
  dspk_close(c);
  free(x);
  _exit(0);
}

static void test_result_to_file_refused(void **state) {
  int outa = tmpfile_rw("to_file_a.bin"), outb = tmpfile_rw("to_file_b.bin"), st = 0;
  pid_t pid;
  (void)state;
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    refused_to_file_child(outa, outb);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  close(outa);
  close(outb);
  if (WIFSIGNALED(st))
    fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 0)
    fail_msg("the child's check %d failed", WEXITSTATUS(st));
}

/* ---- many answers kept --------------------------------------------------- */

/* Client CPU seconds of n tasks submitted at once, then waited for in
 * reverse order: each answer's data (x * i) is its own ticket's. */
static double flood(int n) {
  float x[1024];
  const int64_t len = 1024;
  dspk_client *c = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  uint32_t *tk = calloc((size_t)n, sizeof *tk);
  int *val = calloc((size_t)n, sizeof *val); /* the alpha of tk[i]'s task */
  struct timespec a, b;
  assert_non_null(tk);
  assert_non_null(val);
  for (int i = 0; i < 1024; i++)
    x[i] = 1.0f;
  assert_int_equal(dspk_connect(floodsock, "flood", &c), 0);
  dspk_tensor_inline(&in, DSPK_F32, 1, &len, x);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.map.fn = DSPK_MAP_SCALE;
  t.inputs = &in;
  t.ninputs = 1;
  for (int i = 0; i < n; i++) {
    t.map.alpha = (double)i;
    val[i] = i;
    assert_int_equal(dspk_submit(c, &t, &tk[i]), 0);
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  for (int i = n - 1; i >= 0; i--) {
    uint32_t any = 0;
    if (i % 7 == 3) { /* now and then whichever answer comes first */
      assert_int_equal(dspk_wait_any(c, &any, &r), 0);
      int j = 0;
      while (j <= i && tk[j] != any)
        j++;
      assert_true(j <= i);
      assert_true(((const float *)r.out[0].data)[1023] == (float)val[j]);
      tk[j] = tk[i]; /* slot i is waited for: its ticket takes j's place */
      val[j] = val[i];
    } else {
      assert_int_equal(dspk_wait(c, tk[i], &r), 0);
      assert_true(((const float *)r.out[0].data)[1023] == (float)val[i]);
    }
    dspk_result_free(&r);
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  dspk_close(c);
  free(tk);
  free(val);
  return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
}

/* Waiting for n answers that were read ahead costs O(n), not O(n^2): four
 * times the tickets take well under 16 times the client's CPU (quadratic:
 * about 30 times, 8000 tickets several seconds). */
static void test_many_kept_answers(void **state) {
  (void)state;
  double small = flood(2000), large = flood(8000);
  if (large > 0.05 && large > 8 * (small > 0.005 ? small : 0.005))
    fail_msg("waits for 2000 answers took %.3f s of CPU, for 8000 %.3f s", small, large);
}

/* ---- client name, tensor sizes --------------------------------------- */

/* A name of 63 bytes is within dspk_connect's limit whatever its bytes: one
 * that is not UTF-8 connects (sent with U+FFFD, cut to 63 bytes); 64 bytes
 * are DSPK_ELIMIT. */
static void test_client_name_63(void **state) {
  char name[65];
  dspk_client *c = NULL;
  (void)state;
  memset(name, 0xff, 63);
  name[63] = '\0';
  assert_int_equal(dspk_connect(sockpath, name, &c), 0);
  dspk_close(c);
  memset(name, 'a', 63);
  name[0] = (char)0xff;
  assert_int_equal(dspk_connect(sockpath, name, &c), 0);
  dspk_close(c);
  memset(name, 'a', 63);
  name[62] = (char)0xc3; /* a character cut short */
  assert_int_equal(dspk_connect(sockpath, name, &c), 0);
  dspk_close(c);
  memset(name, 'a', 64);
  name[64] = '\0';
  assert_int_equal(dspk_connect(sockpath, name, &c), DSPK_ELIMIT);
}

/* A shape whose byte size passes 2^63-1 is DSPK_ELIMIT, as the daemon
 * refuses it, with a message that states no wrapped size, whatever nbytes
 * says (dspk_tensor_inline's SIZE_MAX, or the wrapped product). */
static void test_tensor_size_overflow(void **state) {
  static const struct {
    int64_t shape[3];
    unsigned rank;
    dspk_dtype dt;
    size_t nbytes;
    int want;
    const char *msg; /* a part of dspk_last_error() */
  } cases[] = {
      {{INT64_MAX, 4}, 2, DSPK_F32, SIZE_MAX, DSPK_ELIMIT, "passes 2^63-1 bytes"},
      {{(int64_t)1 << 61, 2}, 2, DSPK_F64, SIZE_MAX, DSPK_ELIMIT, "passes 2^63-1 bytes"},
      {{(int64_t)1 << 61, 2}, 2, DSPK_F64, 0, DSPK_ELIMIT, "passes 2^63-1 bytes"},
      {{((int64_t)1 << 61) + 1, 2}, 2, DSPK_F64, 16, DSPK_ELIMIT, "passes 2^63-1 bytes"},
      {{(int64_t)1 << 62, (int64_t)1 << 62, 0}, 3, DSPK_F32, 0, DSPK_ELIMIT,
       "passes 2^63-1 bytes"},
      /* The whole shape is named, not the dimension where the product
       * passed the limit (probe 20 A1: 2^62 alone is fine). */
      {{(int64_t)1 << 62, (int64_t)1 << 62, 0}, 3, DSPK_F32, 0, DSPK_ELIMIT,
       "input 0: tensor shape [4611686018427387904, 4611686018427387904, 0]: product of "
       "dimensions (0 as 1) times item size 4 passes 2^63-1 bytes, the limit even with no "
       "elements"},
      {{INT64_MAX, 4}, 2, DSPK_F32, SIZE_MAX, DSPK_ELIMIT,
       "input 0: tensor shape [9223372036854775807, 4]: product of dimensions (0 as 1) "
       "times item size 4 passes 2^63-1 bytes"},
      /* A negative axis is an invalid shape (EINVAL), not a size (dspk.h,
       * dspk_tensor_numel), whatever the other axes: {-1, 0} too. */
      {{-1, 0}, 2, DSPK_F32, 0, DSPK_EINVAL, "input 0: negative shape[0]"},
  };
  dspk_client *c = NULL;
  float one = 1.0f;
  (void)state;
  assert_int_equal(dspk_connect(sockpath, "overflow", &c), 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dspk_tensor in;
    dspk_task t;
    dspk_result r;
    uint32_t ticket;
    dspk_tensor_inline(&in, cases[i].dt, cases[i].rank, cases[i].shape, &one);
    in.nbytes = cases[i].nbytes;
    dspk_task_init(&t, DSPK_OP_MAP);
    t.device = "cpu:0";
    t.map.fn = DSPK_MAP_ABS;
    t.inputs = &in;
    t.ninputs = 1;
    assert_int_equal(dspk_run(c, &t, &r), cases[i].want);
    assert_non_null(strstr(dspk_last_error(c), cases[i].msg));
    assert_null(strstr(dspk_last_error(c), "needs"));
    assert_int_equal(dspk_submit(c, &t, &ticket), cases[i].want);
    assert_non_null(strstr(dspk_last_error(c), cases[i].msg));
  }
  assert_int_equal(dspk_ping(c, "x", 1), 0);
  dspk_close(c);
}

/* ---- a small max_message ------------------------------------------------- */

/* Starts a daemon with --max-message mm (and extra, NULL or one option and
 * its value) on tmpdir/<tag>.sock, its path in sock. */
static pid_t spawn_mm(const char *tag, const char *mm, const char *extra, const char *val,
                      char *sock, size_t len) {
  snprintf(sock, len, "%s/%s.sock", tmpdir, tag);
  const char *args[] = {"--backends", "cpu", "--log-level", "warn", "--no-cache",
                        "--max-message", mm, extra, val, NULL};
  pid_t pid = daemon_spawn(dspkd_path, sock, args);
  for (size_t i = 0; pid > 0 && i < 4; i++)
    if (mm_pids[i] <= 0) {
      mm_pids[i] = pid;
      break;
    }
  return pid;
}

static void stop_mm(pid_t pid, const char *sock) {
  int st = 0;
  for (size_t i = 0; i < 4; i++)
    if (mm_pids[i] == pid)
      mm_pids[i] = -1;
  assert_int_equal(daemon_stop(pid, &st), 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(sock);
}

/* dspkd takes a max_message from 64 bytes: the library trusts hello's value
 * below 4096 too (it took 256 MiB instead), so dspk_buffer_write and
 * dspk_buffer_read go in pieces that fit and a ping too large for it fails
 * before it is sent, the connection still usable. */
static void test_small_max_message(void **state) {
  static const char *const mms[] = {"1024", "4095"};
  static char data[100000], back[100000];
  char sock[192];
  (void)state;
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (char)(i * 7 + 3);
  for (size_t k = 0; k < 2; k++) {
    dspk_client *c = NULL;
    uint64_t id = 0;
    pid_t pid = spawn_mm(mms[k], mms[k], NULL, NULL, sock, sizeof sock);
    assert_true(pid > 0);
    assert_int_equal(dspk_connect(sock, "small-mm", &c), 0);
    assert_int_equal(dspk_max_message(c), (size_t)atoi(mms[k]));
    assert_int_equal(dspk_buffer_create(c, NULL, sizeof data, &id), 0);
    assert_int_equal(dspk_buffer_write(c, id, 0, data, sizeof data), 0);
    memset(back, 0, sizeof back);
    assert_int_equal(dspk_buffer_read(c, id, 0, back, sizeof back), 0);
    assert_memory_equal(back, data, sizeof data);
    /* A range past the largest offset: its later pieces' offsets would
     * wrap to the buffer's start; refused before any piece goes. */
    static char zeros[100000];
    assert_int_equal(dspk_buffer_write(c, id, UINT64_MAX - 10, zeros, sizeof zeros),
                     DSPK_ERANGE);
    assert_non_null(strstr(dspk_last_error(c), "run past the largest byte offset"));
    assert_int_equal(dspk_buffer_read(c, id, UINT64_MAX - 10, back, sizeof back), DSPK_ERANGE);
    memset(back, 0, sizeof back);
    assert_int_equal(dspk_buffer_read(c, id, 0, back, sizeof back), 0);
    assert_memory_equal(back, data, sizeof data);
    /* A range that overruns the buffer in a later piece: the error names
     * the caller's range and the piece's. */
    assert_int_equal(dspk_buffer_write(c, id, 50000, zeros, sizeof zeros), DSPK_ERANGE);
    assert_non_null(strstr(dspk_last_error(c),
                           "dspk_buffer_write of 100000 bytes at offset 50000: the piece of"));
    assert_int_equal(dspk_buffer_read(c, id, 50000, back, sizeof back), DSPK_ERANGE);
    assert_non_null(strstr(dspk_last_error(c),
                           "dspk_buffer_read of 100000 bytes at offset 50000: the piece of"));
    assert_int_equal(dspk_buffer_write(c, id, 0, data, sizeof data), 0);
    assert_int_equal(dspk_ping(c, data, (size_t)atoi(mms[k])), DSPK_ELIMIT);
    assert_non_null(strstr(dspk_last_error(c), "max_message"));
    assert_int_equal(dspk_ping(c, "x", 1), 0);
    assert_int_equal(dspk_buffer_free(c, id), 0);
    dspk_close(c);
    stop_mm(pid, sock);
  }
}

/* At 64 bytes no buffer.write request nor buffer.read answer has room for
 * data: refused before anything is sent, the connection still usable (the
 * 0-byte ones still go). */
static void test_tiny_max_message(void **state) {
  char sock[192], b[16] = "0123456789abcdef";
  dspk_client *c = NULL;
  uint64_t id = 0;
  (void)state;
  pid_t pid = spawn_mm("tiny", "64", NULL, NULL, sock, sizeof sock);
  assert_true(pid > 0);
  assert_int_equal(dspk_connect(sock, "t", &c), 0);
  assert_int_equal(dspk_max_message(c), 64);
  assert_int_equal(dspk_buffer_create(c, NULL, sizeof b, &id), 0);
  assert_int_equal(dspk_buffer_write(c, id, 0, b, sizeof b), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c), "leaves no room"));
  assert_int_equal(dspk_buffer_read(c, id, 0, b, sizeof b), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c), "leaves no room"));
  assert_int_equal(dspk_buffer_write(c, id, 0, NULL, 0), 0);
  assert_int_equal(dspk_buffer_read(c, id, 0, NULL, 0), 0);
  assert_int_equal(dspk_ping(c, "x", 1), 0);
  dspk_close(c);
  /* A hello too long for it: ELIMIT with the daemon's words (dspk.h,
   * dspk_connect). */
  {
    char name[64];
    memset(name, 'n', 63);
    name[63] = '\0';
    unsetenv("DSPK_JOB");
    unsetenv("SLURM_JOB_ID");
    assert_int_equal(dspk_connect(sock, name, &c), DSPK_ELIMIT);
    assert_string_equal(dspk_connect_error(),
                        "hello: daemon closed the connection: str/bin of 63 bytes at "
                        "offset 27 makes the message at least 92 bytes, more than 64 "
                        "(max_message)");
  }
  stop_mm(pid, sock);
}

/* Operands of half max_message or more, and results that cannot come back
 * inline, go through shared temporaries whatever the shared threshold
 * (above them by default, SIZE_MAX, 0), for dspk_run and dspk_submit, and
 * for a dspk_file_data operand: the library sent them inline (ELIMIT). */
static void test_half_max_message_temporaries(void **state) {
  static float ones[16384], col[128];
  const int64_t n = 16384, sa[2] = {128, 1}, sb[2] = {1, 128};
  static const size_t thr[] = {DSPK_SHARED_THRESHOLD, SIZE_MAX, 0};
  char sock[192];
  dspk_client *c = NULL;
  dspk_tensor x[2], fx;
  dspk_task red, gemm, fred;
  dspk_result r;
  uint32_t tk;
  (void)state;
  for (int i = 0; i < 16384; i++)
    ones[i] = 1.0f;
  for (int i = 0; i < 128; i++)
    col[i] = (float)i;
  int fd = tmpfile_rw("half.bin");
  assert_int_equal(write(fd, ones, sizeof ones), (ssize_t)sizeof ones);
  float *m = mmap(NULL, sizeof ones, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  pid_t pid = spawn_mm("half", "65536", NULL, NULL, sock, sizeof sock);
  assert_true(pid > 0);
  assert_int_equal(dspk_connect(sock, "half-mm", &c), 0);
  assert_int_equal(dspk_file_data(c, m, sizeof ones, fd, 0), 0);
  dspk_task_init(&red, DSPK_OP_REDUCE); /* a 65536-byte operand */
  red.device = "cpu:0";
  red.reduce.fn = DSPK_REDUCE_SUM;
  dspk_tensor_inline(&x[0], DSPK_F32, 1, &n, ones);
  red.inputs = x;
  red.ninputs = 1;
  fred = red; /* the same from the file range */
  dspk_tensor_inline(&fx, DSPK_F32, 1, &n, m);
  fred.inputs = &fx;
  dspk_task_init(&gemm, DSPK_OP_GEMM); /* (128,1) @ (1,128): a 65536-byte result */
  gemm.device = "cpu:0";
  dspk_tensor gx[2];
  dspk_tensor_inline(&gx[0], DSPK_F32, 2, sa, col);
  dspk_tensor_inline(&gx[1], DSPK_F32, 2, sb, col);
  gemm.inputs = gx;
  gemm.ninputs = 2;
  for (size_t k = 0; k < 3; k++) {
    dspk_set_shared_threshold(c, thr[k]);
    assert_int_equal(dspk_run(c, &red, &r), 0);
    assert_true(*(const float *)r.out[0].data == 16384.0f);
    dspk_result_free(&r);
    assert_int_equal(dspk_submit(c, &red, &tk), 0);
    assert_int_equal(dspk_wait(c, tk, &r), 0);
    assert_true(*(const float *)r.out[0].data == 16384.0f);
    dspk_result_free(&r);
    assert_int_equal(dspk_run(c, &fred, &r), 0);
    assert_true(*(const float *)r.out[0].data == 16384.0f);
    dspk_result_free(&r);
    assert_int_equal(dspk_run(c, &gemm, &r), 0);
    assert_int_equal(r.out[0].nbytes, 65536);
    assert_true(((const float *)r.out[0].data)[127 * 128 + 5] == 127.0f * 5.0f);
    dspk_result_free(&r);
    assert_int_equal(dspk_submit(c, &gemm, &tk), 0);
    assert_int_equal(dspk_wait(c, tk, &r), 0);
    assert_true(((const float *)r.out[0].data)[3 * 128 + 7] == 21.0f);
    dspk_result_free(&r);
  }
  dspk_close(c);
  stop_mm(pid, sock);
  munmap(m, sizeof ones);
  close(fd);
}

/* A result that cannot come back inline whose temporary the daemon refuses
 * (max_buffers, the one buffer taken) fails the task before it is sent,
 * saying so, as an operand does: it was sent anyway and the daemon refused
 * the inline result.  One of half max_message that an answer can carry
 * comes inline then. */
static void test_result_temporary_refused(void **state) {
  static float col[128];
  const int64_t sa[2] = {128, 1}, sb[2] = {1, 128};
  char sock[192];
  dspk_client *c = NULL;
  dspk_tensor gx[2];
  dspk_task gemm;
  dspk_result r;
  uint64_t id = 0;
  (void)state;
  pid_t pid = spawn_mm("refused", "65536", "--max-buffers", "1", sock, sizeof sock);
  assert_true(pid > 0);
  assert_int_equal(dspk_connect(sock, "refused", &c), 0);
  assert_int_equal(dspk_buffer_create(c, NULL, 16, &id), 0);
  dspk_task_init(&gemm, DSPK_OP_GEMM);
  gemm.device = "cpu:0";
  dspk_tensor_inline(&gx[0], DSPK_F32, 2, sa, col);
  dspk_tensor_inline(&gx[1], DSPK_F32, 2, sb, col);
  gemm.inputs = gx;
  gemm.ninputs = 2;
  assert_int_equal(dspk_run(c, &gemm, &r), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c), "shared temporary"));
  assert_int_equal(dspk_ping(c, "x", 1), 0);
  /* Half max_message, which could come inline: it does, its temporary
   * refused ((64,1) @ (1,128), 32768 bytes). */
  const int64_t sa2[2] = {64, 1};
  dspk_tensor_inline(&gx[0], DSPK_F32, 2, sa2, col);
  assert_int_equal(dspk_run(c, &gemm, &r), 0);
  assert_int_equal(r.out[0].nbytes, 32768);
  dspk_result_free(&r);
  dspk_close(c);
  stop_mm(pid, sock);
}

/* Two inline operands, each below half max_message, that do not fit one
 * request together: the ELIMIT's remedy is true for the shared threshold
 * in force.  At 0 (off) it advised "a lower dspk_set_shared_threshold",
 * and nothing is lower (probe round 13); it names the threshold that
 * would carry them, which then does. */
static void test_threshold_remedy(void **state) {
  static float a[500], b[500];
  const size_t thr[] = {0, DSPK_SHARED_THRESHOLD, 2001, 2000, 1};
  const char *want[] = {"or a dspk_set_shared_threshold of 1 to 2000 bytes: it is 0, which "
                        "turns temporaries off)",
                        "or a dspk_set_shared_threshold of 1 to 2000 bytes: it is 1048576, "
                        "above every inline operand)",
                        "or a dspk_set_shared_threshold of 1 to 2000 bytes: it is 2001, "
                        "above every inline operand)",
                        NULL, NULL};
  char sock[192];
  dspk_client *c = NULL;
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  (void)state;
  for (int i = 0; i < 500; i++)
    a[i] = (float)i, b[i] = 1.0f;
  pid_t pid = spawn_mm("remedy", "4096", NULL, NULL, sock, sizeof sock);
  assert_true(pid > 0);
  /* (500,1) @ (1,500), whose 1 MB result goes through a temporary
   * whatever the threshold, and (1,500) @ (500,1), whose 4-byte result
   * does not; on cpu:0, on "any" (a fresh client, which has not asked what
   * "any" is: at threshold 0 it said that a temporary is made for "any"
   * only when the daemon has no hardware device, which this one has not,
   * and thresholds 1 to 2000 work), and on a device that does not exist,
   * whose ENODEV (as for small operands) it is at every threshold, not size
   * advice (probe 14 D2). */
  const char *devs[] = {"cpu:0", NULL, "cpu:1"};
  for (int shape = 0; shape < 2; shape++)
    for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++) {
      const int64_t sa[2] = {shape ? 1 : 500, shape ? 500 : 1};
      const int64_t sb[2] = {shape ? 500 : 1, shape ? 1 : 500};
      assert_int_equal(dspk_connect(sock, "remedy", &c), 0);
      dspk_task_init(&t, DSPK_OP_GEMM);
      t.device = devs[d];
      dspk_tensor_inline(&in[0], DSPK_F32, 2, sa, a);
      dspk_tensor_inline(&in[1], DSPK_F32, 2, sb, b);
      t.inputs = in;
      t.ninputs = 2;
      for (size_t k = 0; k < sizeof thr / sizeof thr[0]; k++) {
        dspk_set_shared_threshold(c, thr[k]);
        int rc = dspk_run(c, &t, &r);
        if (d == 2) {
          uint32_t ticket = 0;
          assert_int_equal(rc, DSPK_ENODEV);
          assert_string_equal(dspk_last_error(c), "no device \"cpu:1\" (the devices method "
                                                  "lists them)");
          assert_int_equal(dspk_submit(c, &t, &ticket), DSPK_ENODEV);
          assert_string_equal(dspk_last_error(c), "no device \"cpu:1\" (the devices method "
                                                  "lists them)");
          continue;
        }
        if (want[k] == NULL) {
          assert_int_equal(rc, 0);
          assert_true(((const float *)r.out[0].data)[shape ? 0 : 499 * 500 + 7] ==
                      (shape ? 124750.0f : 499.0f));
          dspk_result_free(&r);
          continue;
        }
        assert_int_equal(rc, DSPK_ELIMIT);
        const char *e = dspk_last_error(c);
        assert_non_null(strstr(e, "(dspk_shared_alloc, "));
        if (!strstr(e, want[k]))
          fail_msg("shape %d, device %s, threshold %zu: %s", shape,
                   devs[d] ? devs[d] : "NULL", thr[k], e);
        assert_null(strstr(e, "lower"));
      }
      dspk_close(c);
    }
  stop_mm(pid, sock);
}

/* The remedy names no threshold where the connection's quota leaves no
 * room for the temporary it would make (2 MiB of max_conn_memory, a 2 MiB
 * temporary and the task's other 2004 inline bytes): it advised one of 1
 * to 2000 bytes, and with it the task still failed (outside probe 15 D6).
 * With room for both, the threshold it names works. */
static void test_threshold_remedy_quota(void **state) {
  static float a[500], b[500];
  const int64_t sa[2] = {1, 500}, sb[2] = {500, 1};
  const size_t thr[] = {0, 1, 2000};
  char sock[192];
  dspk_client *c = NULL;
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  (void)state;
  for (int i = 0; i < 500; i++)
    a[i] = (float)i, b[i] = 1.0f;
  for (int room = 0; room < 2; room++) {
    pid_t pid = spawn_mm("remq", "4096", "--max-conn-memory", room ? "2099252" : "2097152",
                         sock, sizeof sock);
    assert_true(pid > 0);
    assert_int_equal(dspk_connect(sock, "remedy_quota", &c), 0);
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = "cpu:0";
    dspk_tensor_inline(&in[0], DSPK_F32, 2, sa, a);
    dspk_tensor_inline(&in[1], DSPK_F32, 2, sb, b);
    t.inputs = in;
    t.ninputs = 2;
    for (size_t k = 0; k < sizeof thr / sizeof thr[0]; k++) {
      dspk_set_shared_threshold(c, thr[k]);
      int rc = dspk_run(c, &t, &r);
      if (room && thr[k] != 0) {
        assert_int_equal(rc, 0);
        assert_true(((const float *)r.out[0].data)[0] == 124750.0f);
        dspk_result_free(&r);
        continue;
      }
      assert_int_equal(rc, DSPK_ELIMIT);
      const char *e = dspk_last_error(c);
      if (room) {
        assert_non_null(strstr(e, "a dspk_set_shared_threshold of 1 to 2000 bytes"));
        continue;
      }
      if (!strstr(e, "no temporary is made for them (dspk_set_shared_threshold), whatever "
                     "the threshold: one of 2000 bytes, in whole 2 MiB units, with the "
                     "task's other inline bytes would pass the 2097152 bytes this "
                     "connection may hold on cpu:0"))
        fail_msg("threshold %zu: %s", thr[k], e);
      assert_null(strstr(e, "1 to 2000"));
    }
    dspk_close(c);
    stop_mm(pid, sock);
  }
}

/* A $DSPK_JOB that is set but no job id is DSPK_EINVAL at dspk_connect,
 * naming the variable and its value, before any connection; it was
 * dropped in silence (no job sent, $SLURM_JOB_ID not taken either, and
 * the daemon's EPERM then named SLURM_JOB_ID: probe round 13).  Empty is
 * unset; a $SLURM_JOB_ID that is no job id names none. */
static void test_bad_job_env(void **state) {
  const char *bad[] = {"043", " 43", "43x", "0", "-4", "+4", "18446744073709551616", "4 "};
  char sock[192];
  dspk_client *c = NULL;
  (void)state;
  snprintf(sock, sizeof sock, "%s/none.sock", tmpdir);
  setenv("SLURM_JOB_ID", "43", 1);
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char want[64];
    setenv("DSPK_JOB", bad[k], 1);
    assert_int_equal(dspk_connect(sock, NULL, &c), DSPK_EINVAL);
    assert_null(c);
    snprintf(want, sizeof want, "$DSPK_JOB '%s' is not a Slurm job id", bad[k]);
    assert_non_null(strstr(dspk_connect_error(), want));
  }
  setenv("DSPK_JOB", "a\\b\001", 1);
  assert_int_equal(dspk_connect(sock, NULL, &c), DSPK_EINVAL);
  assert_non_null(strstr(dspk_connect_error(), "$DSPK_JOB 'a\\x5cb\\x01' is not"));
  /* Well formed, empty, unset: on to the socket (nothing listens there). */
  const char *good[] = {"43", "18446744073709551615", ""};
  for (size_t k = 0; k < 4; k++) {
    if (k < 3)
      setenv("DSPK_JOB", good[k], 1);
    else
      unsetenv("DSPK_JOB");
    assert_int_equal(dspk_connect(sock, NULL, &c), DSPK_ECONNECT);
  }
  setenv("SLURM_JOB_ID", "043", 1);
  assert_int_equal(dspk_connect(sock, NULL, &c), DSPK_ECONNECT);
  unsetenv("SLURM_JOB_ID");
}

/* ---- probe 16 D ---------------------------------------------------------- */

/* Connects with name and returns its name as dspk_status_get gives it (the
 * daemon's escaped form, cut to fit char name[64] after a whole character
 * or escape and marked "\..."). */
static void status_name(const char *name, char out[64]) {
  dspk_client *c = NULL, *o = NULL;
  dspk_status *st = NULL;
  assert_int_equal(dspk_connect(sockpath, name, &c), 0);
  assert_int_equal(dspk_connect(sockpath, "observer", &o), 0);
  assert_int_equal(dspk_status_get(o, &st), 0);
  out[0] = '\0';
  for (size_t i = 0; i < st->nclients; i++)
    if (st->clients[i].pid == (int64_t)getpid() && strcmp(st->clients[i].name, "observer") != 0)
      strcpy(out, st->clients[i].name);
  dspk_status_free(st);
  dspk_close(o);
  dspk_close(c);
}

/* D2: a name whose escaped form passes 63 bytes was cut inside an escape
 * ("\u2", a lone backslash); it is cut after a whole escape or character
 * and ends in the mark "\...", which no whole name shows. */
static void test_status_name_cut(void **state) {
  char name[64], got[64], want[64];
  (void)state;
  /* 21 zero-width spaces (63 bytes): 21 escapes of 6 bytes; 9 fit in 59. */
  name[0] = '\0';
  for (int i = 0; i < 21; i++)
    strcat(name, "\xe2\x80\x8b");
  status_name(name, got);
  want[0] = '\0';
  for (int i = 0; i < 9; i++)
    strcat(want, "\\u200b");
  strcat(want, "\\...");
  assert_string_equal(got, want);
  /* 61 backslashes and an e-acute: 29 pairs fit, then the mark (an odd
   * run of backslashes: the last one alone). */
  memset(name, '\\', 61);
  strcpy(name + 61, "\xc3\xa9");
  status_name(name, got);
  memset(want, '\\', 59);
  strcpy(want + 59, "...");
  assert_string_equal(got, want);
  /* 40 letters, 7 right-to-left overrides, a letter: 40 + 3 escapes. */
  memset(name, 'a', 40);
  name[40] = '\0';
  for (int i = 0; i < 7; i++)
    strcat(name, "\xe2\x80\xae");
  strcat(name, "b");
  status_name(name, got);
  memset(want, 'a', 40);
  strcpy(want + 40, "\\u202e\\u202e\\u202e\\...");
  assert_string_equal(got, want);
  /* A name whose escaped form fits is whole. */
  status_name("a\\b", got);
  assert_string_equal(got, "a\\\\b");
  memset(name, 'x', 63);
  name[63] = '\0';
  status_name(name, got);
  assert_string_equal(got, name);
}

/* D1: a subscript byte that starts no UTF-8 character is named by its
 * value in the daemon's words ("byte 0xff"), not as the U+FFFD packing
 * would make of it. */
static void test_contract_bad_byte(void **state) {
  dspk_client *c = NULL;
  float x[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  (void)state;
  assert_int_equal(dspk_connect(sockpath, "contract", &c), 0);
  dspk_tensor_inline(&in[0], DSPK_F32, 2, shape, x);
  dspk_tensor_inline(&in[1], DSPK_F32, 2, shape, x);
  dspk_task_init(&t, DSPK_OP_CONTRACT);
  t.device = "cpu:0";
  t.inputs = in;
  t.ninputs = 2;
  t.contract.subscripts = "ik,kj->ij\xff";
  assert_int_equal(dspk_run(c, &t, &r), DSPK_EINVAL);
  /* Echoed as the daemon echoes the byte (protocol.md "Errors": \xff). */
  assert_string_equal(dspk_last_error(c), "contract: \"ik,kj->ij\\xff\": byte 0xff is not "
                                          "a letter (labels are a-z, A-Z)");
  /* A valid character: the daemon's own message names it. */
  t.contract.subscripts = "ik,kj->i\xc3\xa9";
  assert_int_equal(dspk_run(c, &t, &r), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(c), "'\xc3\xa9' (U+00E9) is not a letter"));
  t.contract.subscripts = "ik,kj->ij";
  assert_int_equal(dspk_run(c, &t, &r), 0);
  dspk_result_free(&r);
  dspk_close(c);
}

/* D3: the limits of sizes, offsets and counts are stated in the message. */
static void test_limits_stated(void **state) {
  dspk_client *c = NULL;
  void *p = NULL;
  uint64_t id = 0;
  float x[4] = {0};
  int64_t n4 = 4;
  dspk_tensor in[8];
  dspk_task t;
  dspk_result r;
  uint32_t tk = 0;
  bool written = false;
  int fd = tmpfile_rw("offset.out");
  (void)state;
  assert_int_equal(dspk_connect(sockpath, "limits", &c), 0);
  /* dspk_result_to_file: 2^62-1 taken, 2^62 refused naming the limit. */
  dspk_tensor_inline(&in[0], DSPK_F32, 1, &n4, x);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.map.fn = DSPK_MAP_ABS;
  t.inputs = in;
  t.ninputs = 1;
  assert_int_equal(dspk_submit(c, &t, &tk), 0);
  assert_int_equal(dspk_result_to_file(c, tk, fd, (uint64_t)1 << 62, &written), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(c), "dspk_result_to_file: offset 4611686018427387904 is "
                                          "more than 2^62-1 (4611686018427387903), the largest "
                                          "this call takes");
  assert_int_equal(dspk_result_to_file(c, tk, fd, ((uint64_t)1 << 62) - 1, &written), 0);
  assert_int_equal(dspk_wait(c, tk, &r), 0);
  dspk_result_free(&r);
  close(fd);
  /* dspk_shared_alloc: past a file's largest size, EINVAL saying so (was
   * ENOMEM "File too large"); too much to map, ENOMEM naming mmap. */
  assert_int_equal(dspk_shared_alloc(c, NULL, (size_t)1 << 63, &p, &id), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(c), "dspk_shared_alloc: bytes 9223372036854775808 passes "
                                          "a file's largest size (2^63-1)");
  assert_int_equal(dspk_shared_alloc(c, NULL, SIZE_MAX, &p, &id), DSPK_EINVAL);
  assert_int_equal(dspk_shared_alloc(c, NULL, (size_t)INT64_MAX, &p, &id), DSPK_ENOMEM);
  assert_non_null(strstr(dspk_last_error(c), "more than this process can map (mmap: "));
  /* dspk_run: more than 4 inputs, refused before any is read (inputs[4]
   * on is garbage here: a NULL data with a size). */
  for (int i = 1; i < 8; i++)
    dspk_tensor_inline(&in[i], DSPK_F32, 1, &n4, i < 4 ? x : NULL);
  t.ninputs = 8;
  assert_int_equal(dspk_run(c, &t, &r), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(c), "inputs: expected a non-empty array of at most 4 "
                                          "tensors, got an array of 8 items");
  /* More than one output buffer: every op has one result, so any count
   * too many is refused in the daemon's words (it was the daemon's
   * "outputs[1]: map has only 1 output(s)" for 2 to 4, and "more than 4
   * output buffers" past 4; probe 18 A2). */
  t.ninputs = 1;
  for (unsigned k = 2; k <= DSPK_MAX_OUTPUTS + 1; k++) {
    char want[160];
    t.nout_refs = k;
    assert_int_equal(dspk_run(c, &t, &r), DSPK_EINVAL);
    snprintf(want, sizeof want, "outputs: expected an array of at most one {buffer, offset} "
             "or nil, got an array of %u items", k);
    assert_string_equal(dspk_last_error(c), want);
  }
  t.nout_refs = 0;
  /* dspk_job_register: at most 64 UUIDs, said before any is read (the
   * 65th is NULL here) or the caller's rights are asked. */
  const char *uu[65];
  char *json = NULL;
  for (int i = 0; i < 64; i++)
    uu[i] = "GPU-0";
  uu[64] = NULL;
  assert_int_equal(dspk_job_register(c, 1, 0, uu, 65, &json), DSPK_ELIMIT);
  assert_string_equal(dspk_last_error(c), "dspk_job_register: n 65 is more than 64 UUIDs, the "
                                          "most a job registers");
  dspk_close(c);
}

/* D7: a path that is no socket is named as dspk-submit names it; an empty
 * one is DSPK_EINVAL; a newline in a path is shown escaped. */
static void test_connect_not_socket(void **state) {
  dspk_client *c = NULL;
  char path[160], want[400];
  (void)state;
  assert_int_equal(dspk_connect("", NULL, &c), DSPK_EINVAL);
  assert_string_equal(dspk_connect_error(), "socket path is empty");
  snprintf(path, sizeof path, "%s/file", tmpdir);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(dspk_connect(path, NULL, &c), DSPK_ECONNECT);
  snprintf(want, sizeof want, "connect to %s: %s is a regular file, not a socket", path, path);
  assert_string_equal(dspk_connect_error(), want);
  unlink(path);
  assert_int_equal(dspk_connect(tmpdir, NULL, &c), DSPK_ECONNECT);
  snprintf(want, sizeof want, "connect to %s: %s is a directory, not a socket", tmpdir, tmpdir);
  assert_string_equal(dspk_connect_error(), want);
  assert_int_equal(dspk_connect("/dev/null", NULL, &c), DSPK_ECONNECT);
  assert_string_equal(dspk_connect_error(),
                      "connect to /dev/null: /dev/null is a character device, not a socket");
  snprintf(path, sizeof path, "%s/a\nb", tmpdir);
  fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(dspk_connect(path, NULL, &c), DSPK_ECONNECT);
  assert_null(strchr(dspk_connect_error(), '\n'));
  assert_non_null(strstr(dspk_connect_error(), "a\\nb is a regular file, not a socket"));
  unlink(path);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-DSPKD\n", argv[0]);
    return 2;
  }
  dspkd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_file_size_limit),
      cmocka_unit_test(test_wrapping_ranges),
      cmocka_unit_test(test_file_data_shrunk_small),
      cmocka_unit_test(test_file_data_shrunk_copies),
      cmocka_unit_test(test_file_data_refused),
      cmocka_unit_test(test_result_to_file_refused),
      cmocka_unit_test(test_many_kept_answers),
      cmocka_unit_test(test_client_name_63),
      cmocka_unit_test(test_tensor_size_overflow),
      cmocka_unit_test(test_small_max_message),
      cmocka_unit_test(test_tiny_max_message),
      cmocka_unit_test(test_half_max_message_temporaries),
      cmocka_unit_test(test_result_temporary_refused),
      cmocka_unit_test(test_threshold_remedy),
      cmocka_unit_test(test_threshold_remedy_quota),
      cmocka_unit_test(test_bad_job_env),
      cmocka_unit_test(test_status_name_cut),
      cmocka_unit_test(test_contract_bad_byte),
      cmocka_unit_test(test_limits_stated),
      cmocka_unit_test(test_connect_not_socket),
  };
  return cmocka_run_group_tests(tests, start_daemons, stop_daemons);
}
