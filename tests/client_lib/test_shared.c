/*
 * Shared memory through libdspkclient against a real dspkd (argv[1]):
 * dspk_shared_alloc operands and results (zero copy, checked against plain C
 * loops), the automatic route of big inline operands through reused
 * temporary shared buffers, large results back through them, the same tasks
 * over the plain socket (threshold
 * 0), buffer.read/write of a shared buffer, a memfd without F_SEAL_SHRINK
 * or too small (EINVAL), the client's truncation refused by the seal, a
 * client that unmaps or exits while its task runs, and results lent their
 * temporaries (no copy; the same pages again for the next task; copied past
 * the lending limit; valid after dspk_close, unmapped by dspk_result_free),
 * and every descriptor sent in a sendmsg whose data starts with its
 * buffer.import frame, also right after big requests (protocol.md, Passing
 * descriptors: the kernel gives the descriptors to the first part of a
 * call's data only).  The library's view of the daemon's buffers: an id
 * freed with dspk_buffer_free (read, write, operands, temporaries), read
 * and write from or into the allocation's own pages (memmove semantics,
 * locally and in pieces), a task given up on after a timeout still ordering
 * the reads and writes behind it, and temporaries the daemon refuses.
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
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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

/* Starts dspkd on sock with the backends given and an extra option pair
 * (or NULL); its pid, or -1 when it did not become ready. */
static pid_t spawn_daemon(const char *sock, const char *backends, const char *opt,
                          const char *val) {
  const char *args[] = {"--backends", backends, "--log-level", "warn", "--no-cache",
                        opt, val, NULL};
  return daemon_spawn(dspkd_path, sock, args);
}

static int start_daemon(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/dspk-shm-XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  snprintf(sockpath, sizeof sockpath, "%s/dspkd.sock", tmpdir);
  if ((daemon_pid = spawn_daemon(sockpath, "cpu,vulkan", NULL, NULL)) < 0)
    return -1;
  return dspk_connect(sockpath, "test_shared", &C) == 0 ? 0 : -1;
}

static int stop_daemon(void **state) {
  int st = 0;
  (void)state;
  dspk_close(C);
  if (daemon_pid > 0 && daemon_stop(daemon_pid, &st) != 0)
    return -1;
  unlink(sockpath);
  rmdir(tmpdir);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static uint64_t rs = 7;
static float frand(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (float)((double)(rs % 2000001) / 1000000.0 - 1.0);
}

/* Fills gemm operands A (m x k) and B (k x n) with frand(). */
static void fill_ab(float *a, float *b, int m, int k, int n) {
  for (int i = 0; i < m * k; i++)
    a[i] = frand();
  for (int i = 0; i < k * n; i++)
    b[i] = frand();
}

/* C = A(MxK) B(KxN) in double, the reference. */
static void ref_gemm(const float *a, const float *b, double *c, int m, int k, int n) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int l = 0; l < k; l++)
        s += (double)a[i * k + l] * b[l * n + j];
      c[i * n + j] = s;
    }
}

static void check_gemm(const float *got, const float *a, const float *b, int m, int k,
                       int n) {
  double *want = malloc(sizeof(double) * (size_t)m * (size_t)n);
  assert_non_null(want);
  ref_gemm(a, b, want, m, k, n);
  for (int i = 0; i < m * n; i++)
    if (fabs(got[i] - want[i]) > 1e-3 * (1 + fabs(want[i])))
      fail_msg("gemm[%d]: %g, want %g", i, (double)got[i], want[i]);
  free(want);
}

/* A 2-D f32 tensor over data (inline; the library sees whether it is shared). */
static dspk_tensor t2(const float *data, int r, int c) {
  dspk_tensor t;
  int64_t shape[2] = {r, c};
  dspk_tensor_inline(&t, DSPK_F32, 2, shape, data);
  return t;
}

static int run_gemm_on(dspk_client *c, const char *device, const float *a, const float *b,
                       int m, int k, int n, const uint64_t *out_id, dspk_result *res) {
  dspk_tensor in[2] = {t2(a, m, k), t2(b, k, n)};
  dspk_task t;
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = device;
  t.ninputs = 2;
  t.inputs = in;
  if (out_id) {
    t.nout_refs = 1;
    t.out_refs[0].buffer = *out_id;
    t.out_refs[0].offset = 0;
  }
  return dspk_run(c, &t, res);
}

static int run_gemm(dspk_client *c, const float *a, const float *b, int m, int k, int n,
                    const uint64_t *out_id, dspk_result *res) {
  return run_gemm_on(c, "cpu:0", a, b, m, k, n, out_id, res);
}

static size_t count_state(int state) {
  size_t n = 0;
  for (size_t i = 0; i < C->nshm; i++)
    n += C->shm[i].state == state;
  return n;
}

/* sendmsg of this process (the library is linked in statically: this
 * definition is the one it calls), forwarded to the kernel.  Each call that
 * carries SCM_RIGHTS is checked: its data must start with a buffer.import
 * request frame ([0, msgid, "buffer.import", ...]), nothing of another frame
 * before it.  fd_calls counts them, fd_bad those that did not. */
static int fd_calls, fd_bad;

ssize_t sendmsg(int fd, const struct msghdr *mh, int flags) {
  if (mh->msg_controllen > 0) {
    unsigned char head[32];
    size_t got = 0, at = 2;
    for (size_t i = 0; i < (size_t)mh->msg_iovlen && got < sizeof head; i++) {
      size_t take = mh->msg_iov[i].iov_len;
      if (take > sizeof head - got)
        take = sizeof head - got;
      memcpy(head + got, mh->msg_iov[i].iov_base, take);
      got += take;
    }
    fd_calls++;
    if (got > 2 && head[0] == 0x94 && head[1] == 0x00) {
      if (head[2] < 0x80)
        at = 3;
      else if (head[2] == 0xcc || head[2] == 0xcd || head[2] == 0xce)
        at = 3 + ((size_t)1 << (head[2] - 0xcc));
    }
    if (at == 2 || got < at + 14 || memcmp(head + at, "\xad" "buffer.import", 14) != 0)
      fd_bad++;
  }
  return syscall(SYS_sendmsg, fd, mh, flags);
}

/* An import right after big requests (a buffer.write of 48 MiB in pieces,
 * a task of 8 MiB inline still in flight): its descriptor goes in a sendmsg
 * of its own that starts with the import frame, and the daemon imports it
 * (a descriptor sent with the tail of what came before would be stray past
 * the first 36 KiB of that call: EINVAL). */
static void test_import_after_big(void **state) {
  const size_t big = (size_t)48 << 20;
  const int m = 1024, k = 2048, n = 4; /* A is 8 MiB */
  char *data = malloc(big);
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
  uint64_t id, sid;
  void *p;
  dspk_result r;
  uint32_t tk;
  (void)state;
  assert_non_null(data);
  assert_non_null(a);
  assert_non_null(b);
  memset(data, 0x5a, big);
  fill_ab(a, b, m, k, n);
  fd_calls = fd_bad = 0;
  dspk_set_shared_threshold(C, 0); /* big operands inline, on the socket */
  assert_int_equal(dspk_buffer_create(C, "cpu:0", big, &id), 0);
  assert_int_equal(dspk_buffer_write(C, id, 0, data, big), 0);
  assert_int_equal(dspk_shared_alloc(C, "cpu:0", 4096, &p, &sid), 0);
  ((char *)p)[0] = 7;
  assert_int_equal(dspk_shared_free(C, p), 0);
  {
    dspk_tensor in[2] = {t2(a, m, k), t2(b, k, n)};
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = "cpu:0";
    t.ninputs = 2;
    t.inputs = in;
    assert_int_equal(dspk_submit(C, &t, &tk), 0);
    assert_int_equal(dspk_shared_alloc(C, "cpu:0", 4096, &p, &sid), 0);
    assert_int_equal(dspk_wait(C, tk, &r), 0);
    check_gemm(r.out[0].data, a, b, m, k, n);
    dspk_result_free(&r);
    assert_int_equal(dspk_shared_free(C, p), 0);
  }
  assert_int_equal(dspk_buffer_free(C, id), 0);
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  assert_int_equal(fd_calls, 2);
  assert_int_equal(fd_bad, 0);
  free(data);
  free(a);
  free(b);
}

/* Zero copies: operands and the result in shared allocations. */
static void test_shared_alloc_gemm(void **state) {
  const int m = 200, k = 300, n = 150;
  float *a, *b, *o;
  uint64_t ia, ib, io;
  dspk_result r;
  (void)state;
  assert_int_equal(dspk_shared_alloc(C, NULL, sizeof(float) * m * k, (void **)&a, &ia), 0);
  assert_int_equal(dspk_shared_alloc(C, "cpu:0", sizeof(float) * k * n, (void **)&b, &ib), 0);
  assert_int_equal(dspk_shared_alloc(C, NULL, sizeof(float) * m * n, (void **)&o, &io), 0);
  fill_ab(a, b, m, k, n);
  assert_int_equal(run_gemm(C, a, b, m, k, n, &io, &r), 0);
  assert_true(r.out[0].is_ref);
  assert_int_equal(r.out[0].buffer, io);
  dspk_result_free(&r);
  check_gemm(o, a, b, m, k, n); /* the daemon wrote into our pages */
  /* read/write of the shared buffer's id go through the same pages */
  float v[4] = {1, 2, 3, 4}, w[4];
  assert_int_equal(dspk_buffer_write(C, ia, 16, v, sizeof v), 0);
  assert_memory_equal(a + 4, v, sizeof v);
  a[100] = 42.0f;
  assert_int_equal(dspk_buffer_read(C, ia, 400, w, sizeof w), 0);
  assert_true(w[0] == 42.0f);
  /* 0 bytes with no pointer, as dspk.h allows (UBSan: no memcpy from NULL) */
  assert_int_equal(dspk_buffer_write(C, ia, 0, NULL, 0), 0);
  assert_int_equal(dspk_buffer_read(C, ia, 0, NULL, 0), 0);
  /* an operand that is a slice of a shared allocation is a reference too */
  assert_int_equal(run_gemm(C, a + 10 * k, b, 20, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a + 10 * k, b, 20, k, n);
  dspk_result_free(&r);
  /* Inline data in a shared allocation that no reference can stand for goes
   * as any other bytes (dspk.h): an operand that starts between two f32
   * items, and a task on another device than the allocation's. */
  float *odd = (float *)((char *)o + 2);
  memcpy(odd, a, sizeof(float) * 20 * k);
  assert_int_equal(run_gemm(C, odd, b, 20, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a, b, 20, k, n);
  dspk_result_free(&r);
  assert_int_equal(run_gemm_on(C, "vulkan:0", a, b, 20, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a, b, 20, k, n);
  dspk_result_free(&r);
  assert_int_equal(dspk_shared_free(C, a), 0);
  assert_int_equal(dspk_shared_free(C, b), 0);
  assert_int_equal(dspk_shared_free(C, o), 0);
  assert_int_equal(dspk_shared_free(C, o), DSPK_EINVAL);
  assert_int_equal(dspk_buffer_free(C, ia), DSPK_ENOBUF);
}

/* The selected mode of transparent_hugepage/shmem_enabled ("never" when
 * the file cannot be read). */
static void shmem_thp_mode(char *mode, size_t n) {
  char line[256], *a, *b;
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  snprintf(mode, n, "never");
  if (!f)
    return;
  if (fgets(line, sizeof line, f) && (a = strchr(line, '[')) && (b = strchr(a, ']'))) {
    *b = '\0';
    snprintf(mode, n, "%s", a + 1);
  }
  fclose(f);
}

/* kB of the mapping that holds p mapped by 2 MiB entries (smaps'
 * ShmemPmdMapped), or -1 when it is not found. */
static long pmd_mapped_kb(const void *p) {
  char line[256];
  long kb = -1;
  bool in = false;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f)
    return -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
      continue;
    }
    if (in && sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1)
      break;
  }
  fclose(f);
  return kb;
}

/* Where the host allows huge pages for shared memory only on request
 * (shmem_enabled "advise"), shared allocations ask before their first
 * fault: a 16 MiB allocation, and 16 MiB filled from a file, are mapped,
 * at least in part, by 2 MiB pages.
 * (A mapping populated before its madvise held only 4 KiB pages, and gemm
 * on them ran a fifth to a quarter slower: docs/performance.md.) */
static void test_huge_pages(void **state) {
  char mode[32];
  const size_t n = 16u << 20;
  void *p;
  uint64_t id;
  (void)state;
  shmem_thp_mode(mode, sizeof mode);
  if (strcmp(mode, "never") == 0 || strcmp(mode, "deny") == 0) {
    print_message("shmem_enabled is %s here: no huge pages to check\n", mode);
    skip();
  }
  assert_int_equal(dspk_shared_alloc(C, NULL, n, &p, &id), 0);
  assert_true(pmd_mapped_kb(p) >= 2048);
  assert_int_equal(dspk_shared_free(C, p), 0);
  /* and memory filled from a file (dspk-submit's .npy operands) */
  char path[] = "/tmp/dspk-huge-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  assert_int_equal(ftruncate(fd, (off_t)n), 0);
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, 0, n, &p, &id), 0);
  assert_true(pmd_mapped_kb(p) >= 2048);
  assert_int_equal(dspk_shared_free(C, p), 0);
  close(fd);
}

/* dspk_shared_from_file: the file's bytes from an offset, filled by the
 * kernel; used as a gemm operand; a file shorter than asked is EIO. */
static void test_shared_from_file(void **state) {
  const int m = 64, k = 48, n = 32;
  const size_t hdr = 128, nb = sizeof(float) * (size_t)m * k;
  float *b, *fa = malloc(nb), *a;
  uint64_t ia, ib;
  dspk_result r;
  char path[] = "/tmp/dspk-fromfile-XXXXXX";
  (void)state;
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  for (int i = 0; i < m * k; i++)
    fa[i] = frand();
  char junk[128];
  memset(junk, 'x', sizeof junk);
  assert_int_equal(write(fd, junk, hdr), (ssize_t)hdr);
  assert_int_equal(write(fd, fa, nb), (ssize_t)nb);
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, hdr, nb, (void **)&a, &ia), 0);
  assert_memory_equal(a, fa, nb);
  assert_int_equal(dspk_shared_alloc(C, NULL, sizeof(float) * k * n, (void **)&b, &ib), 0);
  for (int i = 0; i < k * n; i++)
    b[i] = frand();
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, fa, b, m, k, n);
  dspk_result_free(&r);
  /* more than the file holds past the offset */
  void *p;
  uint64_t id;
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, hdr + 8, nb, &p, &id), DSPK_EIO);
  assert_int_equal(dspk_shared_from_file(C, NULL, -1, 0, nb, &p, &id), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(C), "dspk_shared_from_file: fd -1 is no file");
  /* 0 bytes: no mapping (dspk.h) */
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, 0, 0, &p, &id), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(C), "dspk_shared_from_file: bytes must be > 0");
  assert_int_equal(dspk_shared_alloc(C, NULL, 0, &p, &id), DSPK_EINVAL);
  assert_string_equal(dspk_last_error(C), "dspk_shared_alloc: bytes must be > 0");
  assert_int_equal(dspk_shared_free(C, a), 0);
  /* the same by pread into the mapping, the path of hosts whose shared
   * memory gets huge pages only on advice (test hook: on any host) */
  setenv("DSPK_TEST_SHM_FILL_MAP", "1", 1);
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, hdr, nb, (void **)&a, &ia), 0);
  assert_memory_equal(a, fa, nb);
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, fa, b, m, k, n);
  dspk_result_free(&r);
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, hdr + 8, nb, &p, &id), DSPK_EIO);
  unsetenv("DSPK_TEST_SHM_FILL_MAP");
  assert_int_equal(dspk_shared_free(C, a), 0);
  assert_int_equal(dspk_shared_free(C, b), 0);
  close(fd);
  free(fa);
}

/* dspk_shared_from_file takes a descriptor open for reading of a file that
 * reads at an offset; every other kind is DSPK_EINVAL naming it, before
 * anything is made (it was DSPK_EIO with the kernel's words, "Illegal
 * seek" for a pipe, "Bad file descriptor" for a write-only one: probe 23
 * B2).  A 1-byte read past the end says "1 byte". */
static void test_from_file_kinds(void **state) {
  char path[] = "/tmp/dspk-fromkind-XXXXXX", dir[] = "/tmp/dspk-fromdir-XXXXXX";
  int pfd[2], sv[2], fd, wfd, opath, dfd, shut;
  size_t nshm = C->nshm;
  void *p = NULL;
  uint64_t id = 0;
  (void)state;
  fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 8192), 0);
  assert_true((wfd = open(path, O_WRONLY | O_CLOEXEC)) >= 0);
  assert_true((opath = open(path, O_PATH | O_CLOEXEC)) >= 0);
  unlink(path);
  assert_non_null(mkdtemp(dir));
  assert_true((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0);
  rmdir(dir);
  assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  assert_true((shut = dup(fd)) >= 0);
  close(shut); /* a number that names no open descriptor now */
  const struct {
    int fd;
    const char *says;
  } bad[] = {
      {pfd[0], "is a pipe or FIFO"},
      {sv[0], "is a socket"},
      {dfd, "is a directory"},
      {wfd, "is open for writing only"},
      {opath, "was opened with O_PATH"},
      {shut, "is not an open file descriptor"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char want[96];
    snprintf(want, sizeof want, "dspk_shared_from_file: fd %d %s", bad[i].fd, bad[i].says);
    if (dspk_shared_from_file(C, NULL, bad[i].fd, 0, 4096, &p, &id) != DSPK_EINVAL)
      fail_msg("fd %d (%s): %s", bad[i].fd, bad[i].says, dspk_last_error(C));
    if (strncmp(dspk_last_error(C), want, strlen(want)) != 0)
      fail_msg("fd %d: \"%s\", expected it to start \"%s\"", bad[i].fd,
               dspk_last_error(C), want);
    /* and says what is taken */
    assert_non_null(strstr(dspk_last_error(C), "open for reading"));
    assert_null(p);
    assert_int_equal(C->nshm, nshm); /* nothing made, nothing asked of the daemon */
  }
  /* a device that reads at no offset (a pseudo-terminal's master): found
   * out by the copy, after the import, which is freed */
  int tty = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (tty >= 0) {
    assert_int_equal(dspk_shared_from_file(C, NULL, tty, 0, 4096, &p, &id), DSPK_EINVAL);
    assert_non_null(strstr(dspk_last_error(C), "cannot be read at an offset"));
    assert_int_equal(C->nshm, nshm);
    close(tty);
  }
  /* a regular file: 1 byte past its end, "1 byte" */
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, 8192, 1, &p, &id), DSPK_EIO);
  assert_non_null(strstr(dspk_last_error(C), "reading 1 byte at offset 8192"));
  assert_int_equal(dspk_shared_from_file(C, NULL, fd, 4096, 4096, &p, &id), 0);
  assert_int_equal(dspk_shared_free(C, p), 0);
  close(fd);
  close(wfd);
  close(opath);
  close(dfd);
  close(pfd[0]);
  close(pfd[1]);
  close(sv[0]);
  close(sv[1]);
}

/* Big inline operands through temporaries, reused; and the plain socket. */
static void test_auto_threshold(void **state) {
  const int m = 512, k = 1024, n = 64; /* A is 2 MiB, B 256 KiB */
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
  dspk_result r;
  (void)state;
  fill_ab(a, b, m, k, n);
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  assert_int_equal(count_state(2) + count_state(1), 0);
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a, b, m, k, n);
  dspk_result_free(&r);
  assert_int_equal(count_state(2), 1); /* A went shared, B (small) inline */
  for (int i = 0; i < 64; i++)
    a[i] = frand();
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a, b, m, k, n);
  dspk_result_free(&r);
  assert_int_equal(count_state(2), 1); /* the same temporary again */
  /* "any" on a daemon without a hardware device is cpu:0: the same again */
  {
    dspk_tensor in[2] = {t2(a, m, k), t2(b, k, n)};
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.ninputs = 2;
    t.inputs = in;
    assert_int_equal(dspk_run(C, &t, &r), 0);
    check_gemm(r.out[0].data, a, b, m, k, n);
    assert_string_equal(r.out[0].is_ref ? "" : r.device, "cpu:0");
    dspk_result_free(&r);
    assert_int_equal(C->shm_any, 1);
    assert_int_equal(count_state(2), 1);
  }
  /* two in flight: one temporary (dspk_submit makes none), idle after the waits */
  {
    dspk_tensor in[2] = {t2(a, m, k), t2(b, k, n)};
    dspk_task t;
    uint32_t t1, t2_;
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = "cpu:0";
    t.ninputs = 2;
    t.inputs = in;
    /* dspk_submit never makes a temporary (that waits for buffer.import):
     * the idle one goes to the first, the second's A goes inline */
    assert_int_equal(count_state(2), 1);
    assert_int_equal(dspk_submit(C, &t, &t1), 0);
    assert_int_equal(dspk_submit(C, &t, &t2_), 0);
    assert_int_equal(count_state(1), 1);
    assert_int_equal(dspk_wait(C, t2_, &r), 0);
    check_gemm(r.out[0].data, a, b, m, k, n);
    dspk_result_free(&r);
    assert_int_equal(dspk_wait(C, t1, &r), 0);
    check_gemm(r.out[0].data, a, b, m, k, n);
    dspk_result_free(&r);
    assert_int_equal(count_state(2), 1);
  }
  /* the socket path: threshold 0 */
  dspk_set_shared_threshold(C, 0);
  a[5] = 3.0f;
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  check_gemm(r.out[0].data, a, b, m, k, n);
  dspk_result_free(&r);
  assert_int_equal(count_state(1), 0);
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  free(a);
  free(b);
}

/* Operands of 8 MiB and more are copied into their temporaries on several
 * threads: every split (1 to 4 threads, more asked than allowed, sizes that
 * are not a multiple of the 4 KiB part alignment, too small to split) copies
 * every byte and nothing past the end; and a 12 MiB + 12 bytes inline map
 * through a temporary gives every element back. */
static void test_wide_copy(void **state) {
  const size_t sizes[] = {1, 4095, ((size_t)8 << 20) - 1, (size_t)8 << 20,
                          ((size_t)12 << 20) + 4097, ((size_t)17 << 20) + 3};
  const size_t cap = ((size_t)17 << 20) + 3 + 64;
  unsigned char *src = malloc(cap), *dst = malloc(cap);
  (void)state;
  for (size_t i = 0; i < cap; i++)
    src[i] = (unsigned char)(i * 2654435761u >> 13);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int threads = 0; threads <= 6; threads++) {
      memset(dst, 0xa5, cap);
      dspk__copy_wide(dst, src, sizes[s], threads);
      assert_memory_equal(dst, src, sizes[s]);
      for (size_t i = sizes[s]; i < sizes[s] + 64; i++)
        assert_int_equal(dst[i], 0xa5);
    }
  free(src);
  free(dst);

  const size_t n = ((size_t)3 << 20) + 3; /* f32: 12 MiB + 12 bytes */
  float *x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = (i % 3 ? -1.0f : 1.0f) * (float)(i % 1000003);
  dspk_tensor in = {.dtype = DSPK_F32, .rank = 1, .shape = {(int64_t)n}, .data = x,
                    .nbytes = n * sizeof(float)};
  dspk_task t;
  dspk_result r;
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.inputs = &in;
  t.ninputs = 1;
  t.map.fn = DSPK_MAP_ABS;
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  size_t temps = count_state(2);
  assert_int_equal(dspk_run(C, &t, &r), 0);
  assert_true(count_state(2) + count_state(4) > temps); /* it went by a temporary */
  assert_int_equal(r.out[0].nbytes, n * sizeof(float));
  const float *y = r.out[0].data;
  for (size_t i = 0; i < n; i++)
    if (y[i] != fabsf(x[i]))
      fail_msg("element %zu: %g, not %g", i, (double)y[i], (double)fabsf(x[i]));
  dspk_result_free(&r);
  free(x);
}

/* $DSPK_SHARED_THRESHOLD at dspk_connect: a size with the units every size
 * takes; anything else leaves the default. */
static void test_threshold_env(void **state) {
  static const struct {
    const char *env;
    size_t want;
  } cases[] = {{"64K", 65536},
               {"2MiB", 2u << 20},
               {"4096", 4096},
               {"0", 0},
               {"12 apples", DSPK_SHARED_THRESHOLD},
               {"-1", DSPK_SHARED_THRESHOLD},
               {"", DSPK_SHARED_THRESHOLD}};
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dspk_client *k = NULL;
    assert_int_equal(setenv("DSPK_SHARED_THRESHOLD", cases[i].env, 1), 0);
    assert_int_equal(dspk_connect(sockpath, "env", &k), 0);
    if (k->shm_threshold != cases[i].want)
      fail_msg("DSPK_SHARED_THRESHOLD=\"%s\": %zu, want %zu", cases[i].env,
               k->shm_threshold, cases[i].want);
    dspk_close(k);
  }
  unsetenv("DSPK_SHARED_THRESHOLD");
}

/* Large results come back through a temporary shared buffer (as inline
 * memory of the result, the caller sees no difference); small ones and
 * those with threshold 0 through the socket. */
static void test_auto_result(void **state) {
  const int m = 512, k = 64, n = 1024; /* A 128 KiB, B 256 KiB: inline; C 2 MiB */
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  uint32_t ticket;
  (void)state;
  fill_ab(a, b, m, k, n);
  in[0] = t2(a, m, k);
  in[1] = t2(b, k, n);
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  t.ninputs = 2;
  t.inputs = in;
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  /* dspk_run makes the temporaries (dspk_submit only takes idle ones) */
  assert_int_equal(dspk_run(C, &t, &r), 0);
  check_gemm(r.out[0].data, a, b, m, k, n);
  dspk_result_free(&r);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(dspk_submit(C, &t, &ticket), 0);
    assert_int_equal(count_state(1), 1); /* the result's temporary, nothing else */
    assert_int_equal(dspk_wait(C, ticket, &r), 0);
    assert_int_equal(count_state(1), 0);
    assert_int_equal(r.nout, 1);
    assert_false(r.out[0].is_ref);
    assert_int_equal(r.out[0].nbytes, sizeof(float) * m * n);
    assert_int_equal((uintptr_t)r.out[0].data % 64, 0);
    check_gemm(r.out[0].data, a, b, m, k, n);
    dspk_result_free(&r);
  }
  /* fft of a real 1 MiB signal (c64 result of n/2+1): input and result shared */
  {
    const int64_t nf = (int64_t)1 << 18;
    float *x = malloc(sizeof(float) * (size_t)nf);
    dspk_tensor xt;
    for (int64_t i = 0; i < nf; i++)
      x[i] = 1.0f;
    dspk_tensor_inline(&xt, DSPK_F32, 1, &nf, x);
    dspk_task_init(&t, DSPK_OP_FFT);
    t.device = "cpu:0";
    t.ninputs = 1;
    t.inputs = &xt;
    assert_int_equal(dspk_run(C, &t, &r), 0); /* makes both temporaries */
    dspk_result_free(&r);
    assert_int_equal(dspk_submit(C, &t, &ticket), 0);
    assert_int_equal(count_state(1), 2);
    assert_int_equal(dspk_wait(C, ticket, &r), 0);
    assert_false(r.out[0].is_ref);
    assert_int_equal(r.out[0].dtype, DSPK_C64);
    assert_int_equal(r.out[0].shape[0], nf / 2 + 1);
    {
      const float *y = r.out[0].data;
      assert_true(fabs(y[0] - (double)nf) < 1e-3 * (double)nf && fabs(y[1]) < 1e-3);
      for (int64_t i = 2; i < 2 * (nf / 2 + 1); i++)
        if (fabs(y[i]) > 1e-2)
          fail_msg("fft[%lld] = %g, want 0", (long long)i, (double)y[i]);
    }
    dspk_result_free(&r);
    free(x);
  }
  /* the socket path: threshold 0 */
  in[0] = t2(a, m, k);
  in[1] = t2(b, k, n);
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  t.ninputs = 2;
  t.inputs = in;
  dspk_set_shared_threshold(C, 0);
  assert_int_equal(dspk_submit(C, &t, &ticket), 0);
  assert_int_equal(count_state(1), 0);
  assert_int_equal(dspk_wait(C, ticket, &r), 0);
  check_gemm(r.out[0].data, a, b, m, k, n);
  dspk_result_free(&r);
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  free(a);
  free(b);
}

/* The shared temporary (state) that holds p, or NULL. */
static struct dspk__shm *temp_of(const void *p, int state) {
  for (size_t i = 0; i < C->nshm; i++)
    if (C->shm[i].state == state && C->shm[i].ptr == p)
      return &C->shm[i];
  return NULL;
}

/* A large result is lent its temporary: no copy, and the next task's result
 * lands in the same pages (nothing new mapped); past SHM_LENT_MAX results
 * held at once they are copied; a result outlives its client. */
static void test_lent_result(void **state) {
  const int m = 512, k = 64, n = 1024; /* the result: 2 MiB */
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
  dspk_result r, held[5];
  (void)state;
  fill_ab(a, b, m, k, n);
  dspk_set_shared_threshold(C, DSPK_SHARED_THRESHOLD);
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  const void *first = r.out[0].data;
  assert_non_null(temp_of(first, 4)); /* lent, not copied */
  check_gemm(first, a, b, m, k, n);
  size_t nshm = C->nshm;
  dspk_result_free(&r);
  for (int round = 0; round < 3; round++) {
    assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
    assert_ptr_equal(r.out[0].data, first); /* the same pages again */
    assert_int_equal(C->nshm, nshm);        /* no new temporary */
    dspk_result_free(&r);
  }
  /* Held results: four lent, the fifth copied; all right. */
  for (int i = 0; i < 5; i++)
    assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &held[i]), 0);
  for (int i = 0; i < 4; i++)
    assert_non_null(temp_of(held[i].out[0].data, 4));
  assert_null(temp_of(held[4].out[0].data, 4));
  assert_int_equal(count_state(4), 4);
  /* and no temporary was made for the fifth, which would not be lent (one
   * was, then idle beside the four: probe 14 D5) */
  assert_int_equal(count_state(2), 0);
  check_gemm(held[0].out[0].data, a, b, m, k, n);
  check_gemm(held[4].out[0].data, a, b, m, k, n);
  for (int i = 0; i < 5; i++)
    dspk_result_free(&held[i]);
  assert_int_equal(run_gemm(C, a, b, m, k, n, NULL, &r), 0);
  assert_int_equal(count_state(4), 1); /* the others given back, idle */
  dspk_result_free(&r);
  /* A result freed after its client's close: still there, then unmapped. */
  {
    dspk_client *c2;
    assert_int_equal(dspk_connect(sockpath, "test_shared_2", &c2), 0);
    assert_int_equal(run_gemm(c2, a, b, m, k, n, NULL, &r), 0);
    void *p = (void *)r.out[0].data;
    dspk_close(c2);
    check_gemm(p, a, b, m, k, n);
    assert_int_equal(msync(p, 4096, MS_ASYNC), 0); /* mapped */
    dspk_result_free(&r);
    assert_int_equal(msync(p, 4096, MS_ASYNC), -1); /* unmapped */
    assert_int_equal(errno, ENOMEM);
  }
  free(a);
  free(b);
}

static int sealed_memfd(size_t n, unsigned seals) {
  int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)n), 0);
  if (seals)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
  return fd;
}

/* buffer.import of fd with size: the daemon's answer code. */
static int import(int fd, uint64_t size) {
  struct dspk__wbuf w;
  struct dspk__resp r;
  uint32_t id = dspk__next_id(C);
  int rc;
  dspk__wbuf_init(&w);
  dspk__pack_request_head(&w.pk, id, "buffer.import", true);
  msgpack_pack_map(&w.pk, 1);
  dspk__pack_str(&w.pk, "size");
  msgpack_pack_uint64(&w.pk, size);
  rc = dspk__send_fd(C, &w, id, fd);
  dspk__wbuf_free(&w);
  if (rc == 0 && (rc = dspk__wait(C, id, &r)) == 0) {
    uint64_t b;
    assert_int_equal(dspk__obj_u64(dspk__map_get(r.msg.result, "buffer"), &b), 0);
    dspk__resp_free(&r);
    assert_int_equal(dspk_buffer_free(C, b), 0);
  }
  return rc;
}

static void test_seals(void **state) {
  int fd;
  (void)state;
  fd = sealed_memfd(65536, 0);
  assert_int_equal(import(fd, 65536), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "F_SEAL_SHRINK"));
  close(fd);
  fd = sealed_memfd(4096, F_SEAL_SHRINK);
  assert_int_equal(import(fd, 8192), DSPK_EINVAL);
  assert_non_null(strstr(dspk_last_error(C), "fewer than size"));
  assert_int_equal(import(fd, 4096), 0);
  assert_int_equal(ftruncate(fd, 0), -1); /* the seal refuses the truncation */
  assert_int_equal(errno, EPERM);
  assert_int_equal(ftruncate(fd, 1 << 20), 0); /* growing is allowed, harmless */
  close(fd);
  assert_int_equal(dspk_ping(C, "x", 1), 0);
}

/* A shared allocation the daemon refuses (over the user's memory quota)
 * commits no memory in the caller: the daemon answers before the pages are
 * made (they were all made first, so a size beyond the host's memory
 * brought the out-of-memory killer instead of ENOMEM). */
/* test_refused_alloc's own daemon, stopped by its teardown when the test
 * fails before it stops the daemon itself. */
static pid_t quota_pid;

static int stop_quota_daemon(void **state) {
  (void)state;
  if (quota_pid > 0) {
    kill(quota_pid, SIGKILL);
    waitpid(quota_pid, NULL, 0);
    quota_pid = 0;
  }
  return 0;
}

static void test_refused_alloc(void **state) {
  char sock[160];
  dspk_client *c2;
  struct rusage r0, r1;
  void *p = NULL;
  uint64_t id = 0;
  int st;
  (void)state;
  snprintf(sock, sizeof sock, "%s/quota.sock", tmpdir);
  quota_pid = spawn_daemon(sock, "cpu", "--max-user-memory", "64M");
  assert_true(quota_pid > 0);
  assert_int_equal(dspk_connect(sock, "test_refused_alloc", &c2), 0);
  assert_int_equal(getrusage(RUSAGE_SELF, &r0), 0);
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", (size_t)512 << 20, &p, &id), DSPK_ELIMIT);
  assert_null(p);
  assert_int_equal(getrusage(RUSAGE_SELF, &r1), 0);
  /* ru_maxrss in KiB: far below the 512 MiB asked for */
  assert_true(r1.ru_maxrss - r0.ru_maxrss < 64 * 1024);
  /* an empty device name is the daemon's ENODEV, not a default device */
  assert_int_equal(dspk_shared_alloc(c2, "", 4096, &p, &id), DSPK_ENODEV);
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", 4096, &p, &id), 0);
  assert_int_equal(dspk_shared_free(c2, p), 0);
  dspk_close(c2);
  assert_int_equal(daemon_stop(quota_pid, &st), 0);
  quota_pid = 0;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(sock);
}

/* A map "scale" of n f32 through temporaries on c; checks the result.
 * Returns where the result's data was (freed). */
static uintptr_t scale_on(dspk_client *c, size_t n) {
  uintptr_t at;
  float *x = malloc(n * sizeof(float));
  assert_non_null(x);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(i % 1000);
  dspk_tensor in = {.dtype = DSPK_F32, .rank = 1, .shape = {(int64_t)n}, .data = x,
                    .nbytes = n * sizeof(float)};
  dspk_task t;
  dspk_result r;
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.inputs = &in;
  t.ninputs = 1;
  t.map.fn = DSPK_MAP_SCALE;
  t.map.alpha = 2.0;
  assert_int_equal(dspk_run(c, &t, &r), 0);
  assert_int_equal(r.out[0].nbytes, n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    if (((const float *)r.out[0].data)[i] != 2.0f * x[i])
      fail_msg("element %zu", i);
  at = (uintptr_t)r.out[0].data;
  dspk_result_free(&r);
  free(x);
  return at;
}

/* Whether the page at address a is mapped in this process. */
static bool mapped(uintptr_t a) {
  long pg = sysconf(_SC_PAGESIZE);
  return msync((void *)(a & ~(uintptr_t)(pg - 1)), (size_t)pg, MS_ASYNC) == 0;
}

static size_t count_state_of(dspk_client *c, int state) {
  size_t n = 0;
  for (size_t i = 0; i < c->nshm; i++)
    n += c->shm[i].state == state;
  return n;
}

/* Idle shared temporaries are daemon buffers of the user's: after one map
 * of 20 MiB they held 20 MiB (and the result's 20 more) of a 64 MiB
 * max_user_memory, and a 32 MiB dspk_buffer_create failed ELIMIT.  Now one
 * beyond the bound (an eighth of the quota, 8 MiB, of idle ones) is freed once its answer is
 * consumed, and an allocation refused for a limit frees the idle ones and
 * is tried once more. */
static void test_idle_temps_quota(void **state) {
  char sock[160];
  dspk_client *c2;
  uint64_t id = 0;
  void *p = NULL;
  int st;
  (void)state;
  snprintf(sock, sizeof sock, "%s/idle.sock", tmpdir);
  quota_pid = spawn_daemon(sock, "cpu", "--max-user-memory", "64M");
  assert_true(quota_pid > 0);
  assert_int_equal(dspk_connect(sock, "test_idle_temps_quota", &c2), 0);
  dspk_set_shared_threshold(c2, DSPK_SHARED_THRESHOLD);
  uintptr_t res = scale_on(c2, (size_t)5 << 20); /* 20 MiB */
  assert_int_equal(count_state_of(c2, 2), 0); /* the operand's: freed at the wait */
  assert_false(mapped(res)); /* the result's: unmapped by dspk_result_free */
  assert_int_equal(dspk_buffer_create(c2, "cpu:0", (size_t)32 << 20, &id), 0);
  assert_int_equal(dspk_buffer_free(c2, id), 0);
  /* small ones are kept (4 MiB each), then yield to a refused allocation */
  scale_on(c2, (size_t)1 << 20);
  scale_on(c2, (size_t)1 << 20);
  assert_true(count_state_of(c2, 2) >= 1);
  assert_int_equal(dspk_buffer_create(c2, "cpu:0", (size_t)60 << 20, &id), 0);
  assert_int_equal(count_state_of(c2, 2), 0);
  assert_int_equal(dspk_buffer_free(c2, id), 0);
  scale_on(c2, (size_t)1 << 20);
  assert_true(count_state_of(c2, 2) >= 1);
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", (size_t)60 << 20, &p, &id), 0);
  assert_int_equal(count_state_of(c2, 2), 0);
  assert_int_equal(dspk_shared_free(c2, p), 0);
  dspk_close(c2);
  assert_int_equal(daemon_stop(quota_pid, &st), 0);
  quota_pid = 0;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(sock);
}

/* The temporaries of c (not the caller's allocations), whatever their state. */
static size_t temps_of(const dspk_client *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->nshm; i++)
    n += c->shm[i].state != 0;
  return n;
}

/* dspk.h: while 4 results hold temporaries the next is copied, and at most
 * 6 idle ones are kept once an answer is consumed.  A map add of two
 * operands through temporaries (threshold 1), 7 results held: a 5th result
 * temporary was made (7 buffers), and after the results were freed 7 stayed
 * idle (probe 14 D5).  With one operand, 6 (1 + 5). */
static void test_temps_bound(void **state) {
  enum { N = 1000, HELD = 7 };
  float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
  int64_t shape[1] = {N};
  dspk_tensor in[2];
  dspk_result r[HELD];
  dspk_client *c2;
  (void)state;
  for (int i = 0; i < N; i++)
    a[i] = (float)i, b[i] = 1.0f;
  dspk_tensor_inline(&in[0], DSPK_F32, 1, shape, a);
  dspk_tensor_inline(&in[1], DSPK_F32, 1, shape, b);
  for (unsigned nin = 2; nin >= 1; nin--) {
    dspk_task t;
    assert_int_equal(dspk_connect(sockpath, "test_temps_bound", &c2), 0);
    dspk_set_shared_threshold(c2, 1);
    dspk_task_init(&t, DSPK_OP_MAP);
    t.device = "cpu:0";
    t.map.fn = nin == 2 ? DSPK_MAP_ADD : DSPK_MAP_ABS;
    t.ninputs = nin;
    t.inputs = in;
    for (int i = 0; i < HELD; i++) {
      assert_int_equal(dspk_run(c2, &t, &r[i]), 0);
      assert_true(temps_of(c2) <= nin + 4); /* its operands' and 4 results' */
      for (int j = 0; j < N; j++)
        if (((const float *)r[i].out[0].data)[j] != (nin == 2 ? a[j] + 1.0f : a[j]))
          fail_msg("run %d, element %d", i, j);
    }
    assert_int_equal(count_state_of(c2, 4), 4);
    for (int i = 0; i < HELD; i++)
      dspk_result_free(&r[i]);
    assert_int_equal(dspk_run(c2, &t, &r[0]), 0);
    dspk_result_free(&r[0]);
    assert_true(temps_of(c2) <= 6); /* all idle now: at most 6 */
    assert_int_equal(dspk_ping(c2, NULL, 0), 0);
    dspk_close(c2);
  }
  free(a);
  free(b);
}

/* A map add of two n-element f32 operands on cpu:0 through c (its result
 * checked): dspk_run's code. */
static int add_on(dspk_client *c, size_t n) {
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  int64_t shape[1] = {(int64_t)n};
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  int rc;
  assert_non_null(a);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++)
    a[i] = (float)(i % 1000), b[i] = 1.0f;
  dspk_tensor_inline(&in[0], DSPK_F32, 1, shape, a);
  dspk_tensor_inline(&in[1], DSPK_F32, 1, shape, b);
  dspk_task_init(&t, DSPK_OP_MAP);
  t.device = "cpu:0";
  t.map.fn = DSPK_MAP_ADD;
  t.ninputs = 2;
  t.inputs = in;
  if ((rc = dspk_run(c, &t, &r)) == 0) {
    for (size_t i = 0; i < n; i++)
      if (((const float *)r.out[0].data)[i] != a[i] + 1.0f)
        fail_msg("element %zu", i);
    dspk_result_free(&r);
  }
  free(a);
  free(b);
  return rc;
}

/* dspk.h: a temporary that cannot be had is no failure of the task.  Under
 * a memory quota of 4 MiB, the library's own temporaries (whole 2 MiB each)
 * for a map add of two 1.2 MB operands took the whole quota and the task
 * was refused ELIMIT, where threshold 0 runs it (probe 14 D6): none is made
 * that would leave the task no room under hello's cpu_memory_quota.  Where
 * the quota is the user's, shared with another connection that the library
 * cannot see, a task refused ELIMIT while its temporaries held memory runs
 * once more through the socket. */
static void test_temps_quota(void **state) {
  const char *opts[][2] = {{"--max-conn-memory", "4M"}, {"--max-user-memory", "4M"},
                           {"--max-conn-memory", "2M"}, {"--max-user-memory", "8M"}};
  char sock[160];
  int st;
  (void)state;
  for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
    dspk_client *c2, *c3 = NULL;
    uint64_t id = 0;
    snprintf(sock, sizeof sock, "%s/tq.sock", tmpdir);
    quota_pid = spawn_daemon(sock, "cpu", opts[k][0], opts[k][1]);
    assert_true(quota_pid > 0);
    assert_int_equal(dspk_connect(sock, "test_temps_quota", &c2), 0);
    if (k == 3) { /* another connection of the user's holds 3 MiB of 8 */
      assert_int_equal(dspk_connect(sock, "test_temps_quota_3", &c3), 0);
      assert_int_equal(dspk_buffer_create(c3, "cpu:0", (size_t)3 << 20, &id), 0);
    }
    size_t n = k == 2 ? 150000 : 300000; /* 0.6 MB or 1.2 MB each */
    const size_t ths[] = {DSPK_SHARED_THRESHOLD, 1, 0};
    for (size_t i = 0; i < 3; i++) {
      dspk_set_shared_threshold(c2, ths[i]);
      if (add_on(c2, n) != 0)
        fail_msg("%s %s, threshold %zu: %s", opts[k][0], opts[k][1], ths[i],
                 dspk_last_error(c2));
    }
    dspk_close(c2);
    dspk_close(c3);
    assert_int_equal(daemon_stop(quota_pid, &st), 0);
    quota_pid = 0;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(sock);
  }
}

/* The client unmaps its side while its task runs, or exits with tasks in
 * flight: the daemon's own mapping keeps the task's operands valid. */
static void test_unmap_and_exit(void **state) {
  const int m = 768;
  float *a;
  uint64_t ia;
  uint32_t tk;
  dspk_result r;
  dspk_status *s;
  pid_t pid;
  int st;
  (void)state;
  assert_int_equal(dspk_shared_alloc(C, NULL, sizeof(float) * m * m, (void **)&a, &ia), 0);
  for (int i = 0; i < m * m; i++)
    a[i] = 1.0f;
  {
    dspk_tensor in[2] = {t2(a, m, m), t2(a, m, m)};
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = "cpu:0";
    t.ninputs = 2;
    t.inputs = in;
    assert_int_equal(dspk_submit(C, &t, &tk), 0);
  }
  assert_int_equal(munmap(a, sizeof(float) * m * m), 0); /* behind the library's back */
  for (size_t i = 0; i < C->nshm; i++)
    if (C->shm[i].id == ia) /* so that dspk_close does not unmap it again */
      C->shm[i].ptr = mmap(NULL, C->shm[i].size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
  assert_int_equal(dspk_wait(C, tk, &r), 0);
  for (int i = 0; i < m * m; i += 997)
    assert_true(((const float *)r.out[0].data)[i] == (float)m);
  dspk_result_free(&r);

  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dspk_client *k;
    float *p;
    uint64_t id;
    uint32_t tt;
    if (dspk_connect(sockpath, "exits", &k) != 0 ||
        dspk_shared_alloc(k, NULL, sizeof(float) * m * m, (void **)&p, &id) != 0)
      _exit(1);
    for (int i = 0; i < m * m; i++)
      p[i] = 1.0f;
    dspk_tensor in[2] = {t2(p, m, m), t2(p, m, m)};
    dspk_task t;
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = "cpu:0";
    t.ninputs = 2;
    t.inputs = in;
    for (int i = 0; i < 3; i++)
      if (dspk_submit(k, &t, &tt) != 0)
        _exit(2);
    _exit(0); /* tasks in flight, buffers mapped */
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (int tries = 0;; tries++) {
    struct timespec ts = {0, 20000000};
    uint64_t conns, inuse = 0;
    assert_int_equal(dspk_status_get(C, &s), 0);
    conns = s->connections;
    if (s->ndevices)
      inuse = s->activity[0].memory_in_use;
    dspk_status_free(s);
    if (conns == 1 && inuse == 0)
      break;
    assert_true(tries < 1500); /* 30 s */
    nanosleep(&ts, NULL);
  }
  assert_int_equal(dspk_ping(C, NULL, 0), 0);
}

/* ---- the library's view of the daemon's buffers (round 6) ---------------- */

/* map abs of n f32 at x on cpu:0 (inline: the library sees whether it is
 * shared), its result into out_id when given. */
static void abs_task_of(dspk_task *t, dspk_tensor *in, const float *x, size_t n,
                        const uint64_t *out_id) {
  int64_t shape[1] = {(int64_t)n};
  dspk_tensor_inline(in, DSPK_F32, 1, shape, x);
  dspk_task_init(t, DSPK_OP_MAP);
  t->device = "cpu:0";
  t->inputs = in;
  t->ninputs = 1;
  t->map.fn = DSPK_MAP_ABS;
  if (out_id) {
    t->nout_refs = 1;
    t->out_refs[0].buffer = *out_id;
  }
}

/* dspk_buffer_free of a shared allocation's id: the client forgets the id
 * (it stays mapped until dspk_shared_free): read and write of it are the
 * daemon's ENOBUF, also with nothing in flight (they were a memcpy into the
 * mapping, answering 0), an inline operand in it goes as bytes (it went as a
 * reference to the freed buffer: ENOBUF), and dspk_shared_free answers
 * ENOBUF.  A temporary whose id the caller frees is not used again (the next
 * task that would reuse it failed ENOBUF). */
static void test_freed_shared_id(void **state) {
  float *p, sum;
  char got[4] = {0};
  uint64_t id;
  dspk_result r;
  dspk_tensor in;
  dspk_task t;
  (void)state;
  assert_int_equal(dspk_shared_alloc(C, "cpu:0", 4096, (void **)&p, &id), 0);
  for (int i = 0; i < 10; i++)
    p[i] = 1.0f;
  assert_int_equal(dspk_buffer_free(C, id), 0);
  assert_int_equal(dspk_buffer_write(C, id, 0, "abcd", 4), DSPK_ENOBUF);
  assert_int_equal(dspk_buffer_read(C, id, 0, got, 4), DSPK_ENOBUF);
  assert_true(p[0] == 1.0f); /* nothing written into the mapping */
  {
    int64_t shape[1] = {10};
    dspk_tensor_inline(&in, DSPK_F32, 1, shape, p);
    dspk_task_init(&t, DSPK_OP_REDUCE);
    t.device = "cpu:0";
    t.inputs = &in;
    t.ninputs = 1;
    t.reduce.fn = DSPK_REDUCE_SUM;
    if (dspk_run(C, &t, &r) != 0)
      fail_msg("reduce of an operand in a freed allocation: %s", dspk_last_error(C));
    memcpy(&sum, r.out[0].data, sizeof sum);
    assert_true(sum == 10.0f);
    dspk_result_free(&r);
  }
  assert_int_equal(dspk_shared_free(C, p), DSPK_ENOBUF);
  /* A temporary's id freed by the caller (on a connection of its own: the
   * operand's and the result's temporaries, 4 MiB each). */
  {
    const size_t n = (size_t)1 << 20;
    float *x = malloc(n * sizeof(float));
    uint64_t tid = 0;
    dspk_client *c3;
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
      x[i] = -(float)(i % 100);
    assert_int_equal(dspk_connect(sockpath, "freed_temp", &c3), 0);
    dspk_set_shared_threshold(c3, DSPK_SHARED_THRESHOLD);
    abs_task_of(&t, &in, x, n, NULL);
    assert_int_equal(dspk_run(c3, &t, &r), 0);
    dspk_result_free(&r);
    assert_int_equal(c3->nshm, 2);
    for (size_t i = 0; i < c3->nshm; i++)
      if (c3->shm[i].state == 2) /* the operand's (the result's is lent) */
        tid = c3->shm[i].id;
    assert_true(tid != 0);
    assert_int_equal(dspk_buffer_free(c3, tid), 0);
    for (int k = 0; k < 3; k++) {
      if (dspk_run(c3, &t, &r) != 0)
        fail_msg("run %d after a temporary's id was freed: %s", k, dspk_last_error(c3));
      assert_true(((const float *)r.out[0].data)[n - 1] == (float)((n - 1) % 100));
      dspk_result_free(&r);
    }
    for (size_t i = 0; i < c3->nshm; i++) /* dropped, never used again */
      assert_true(c3->shm[i].id != tid);
    dspk_close(c3);
    free(x);
  }
}

/* dspk_buffer_write/read of a shared id from or into its own mapping: as
 * memmove, on the local path (a memcpy there was undefined: ASan's
 * memcpy-param-overlap) and on the socket path in several pieces (with a
 * request in flight), where a piece stored could change bytes of one still
 * to be sent. */
static void test_shared_rw_overlap(void **state) {
  const size_t size = (size_t)24 << 20, big = (size_t)20 << 20, shift = (size_t)3 << 20;
  unsigned char *p, *want = malloc(size);
  uint64_t id;
  uint32_t tk;
  float x[4] = {-1, 2, -3, 4};
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  (void)state;
  assert_non_null(want);
  assert_int_equal(dspk_shared_alloc(C, "cpu:0", size, (void **)&p, &id), 0);
  for (size_t i = 0; i < size; i++)
    p[i] = want[i] = (unsigned char)(i * 7 + i / 251);
  assert_int_equal(C->ninflight, 0); /* the local path */
  assert_int_equal(dspk_buffer_write(C, id, 4, p, 100), 0);
  memmove(want + 4, want, 100);
  assert_memory_equal(p, want, 256);
  assert_int_equal(dspk_buffer_read(C, id, 0, p + 8, 200), 0);
  memmove(want + 8, want, 200);
  assert_memory_equal(p, want, 256);
  /* the socket path: a task in flight, pieces of 4 MiB, each stored over
   * the next one's source (3 MiB on) */
  abs_task_of(&t, &in, x, 4, NULL);
  assert_int_equal(dspk_submit(C, &t, &tk), 0);
  assert_int_equal(dspk_buffer_write(C, id, shift, p, big), 0);
  memmove(want + shift, want, big);
  assert_int_equal(dspk_wait(C, tk, &r), 0);
  dspk_result_free(&r);
  assert_memory_equal(p, want, size);
  assert_int_equal(dspk_submit(C, &t, &tk), 0);
  assert_int_equal(dspk_buffer_read(C, id, 0, p + shift, big), 0);
  memmove(want + shift, want, big);
  assert_int_equal(dspk_wait(C, tk, &r), 0);
  dspk_result_free(&r);
  assert_memory_equal(p, want, size);
  assert_int_equal(dspk_shared_free(C, p), 0);
  free(want);
}

static pid_t own_pid;

static int stop_own_daemon(void **state) {
  (void)state;
  if (own_pid > 0) {
    kill(own_pid, SIGKILL);
    waitpid(own_pid, NULL, 0);
    own_pid = 0;
  }
  return 0;
}

/* Starts own_pid's dspkd (cpu) at sock with the options in args (after
 * --backends cpu) and connects *c to it. */
static void own_daemon(const char *name, const char *const *extra, char *sock, size_t socklen,
                       dspk_client **c) {
  const char *args[16] = {"--backends", "cpu", "--log-level", "error", "--no-cache"};
  int a = 5;
  while (*extra && a < 15)
    args[a++] = *extra++;
  args[a] = NULL;
  snprintf(sock, socklen, "%s/%s.sock", tmpdir, name);
  own_pid = daemon_spawn(dspkd_path, sock, args);
  assert_true(own_pid > 0);
  assert_int_equal(dspk_connect(sock, name, c), 0);
}

static void own_daemon_stop(dspk_client *c, const char *sock) {
  int st;
  dspk_close(c);
  assert_int_equal(daemon_stop(own_pid, &st), 0);
  own_pid = 0;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(sock);
}

/* A task given up on by a dspk_wait timeout still runs in the daemon: until
 * its answer comes, dspk_buffer_read/write of a shared allocation go to the
 * daemon behind it, not a memcpy at once (which read the result half
 * written, and had a write mixed into it).  The test hook holds the task
 * before it runs until it is canceled: a write behind it times out too,
 * leaving the memory alone; after the cancel a read waits for both and
 * gives the write's value; once every late answer is read the local path
 * is back. */
static void test_timeout_keeps_order(void **state) {
  char sock[160];
  const char *const extra[] = {NULL};
  dspk_client *c2;
  float x[16], *o, five = 5.0f, got = 0;
  uint64_t oid;
  uint32_t tk;
  bool canceled = false;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  (void)state;
  for (int i = 0; i < 16; i++)
    x[i] = -(float)i - 1;
  setenv("DSPKD_TEST_CANCEL_WAIT", "before", 1);
  own_daemon("order", extra, sock, sizeof sock, &c2);
  unsetenv("DSPKD_TEST_CANCEL_WAIT");
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", 4096, (void **)&o, &oid), 0);
  o[0] = -7.0f;
  abs_task_of(&t, &in, x, 16, &oid);
  assert_int_equal(dspk_submit(c2, &t, &tk), 0);
  assert_int_equal(dspk_set_timeout(c2, 50), 0);
  assert_int_equal(dspk_wait(c2, tk, &r), DSPK_ETIMEDOUT);
  assert_false(dspk__inflight_has(c2, tk));
  assert_true(dspk__daemon_busy(c2));
  assert_null(dspk__shm_local(c2, oid, 0, sizeof five));
  assert_int_equal(dspk_buffer_write(c2, oid, 0, &five, sizeof five), DSPK_ETIMEDOUT);
  assert_true(o[0] == -7.0f); /* queued behind the held task, not written here */
  assert_int_equal(dspk_set_timeout(c2, 0), 0);
  assert_int_equal(dspk_cancel(c2, tk, &canceled), 0);
  assert_int_equal(dspk_buffer_read(c2, oid, 0, &got, sizeof got), 0);
  assert_true(got == 5.0f); /* the write came after the task, whatever it did */
  assert_true(o[0] == 5.0f);
  assert_int_equal(c2->nabandoned, 0);
  assert_false(dspk__daemon_busy(c2));
  assert_non_null(dspk__shm_local(c2, oid, 0, sizeof five));
  assert_int_equal(dspk_shared_free(c2, o), 0);
  own_daemon_stop(c2, sock);
}

/* A shared temporary is the library's choice: one the daemon refuses (its
 * max_buffers taken by the caller's 3 buffers) leaves the operand and the
 * result to the socket, and dspk_run works as dspk_submit does (it failed
 * ELIMIT naming max_buffers).  Only an operand that cannot cross the socket
 * (a 1 MiB max_message) fails, saying that a shared temporary was refused. */
static void test_temp_refused(void **state) {
  char sock[160];
  const char *const three[] = {"--max-buffers", "3", NULL};
  const char *const small[] = {"--max-buffers", "3", "--max-message", "1M", NULL};
  const size_t n = (size_t)512 << 10; /* 2 MiB of f32 */
  float *x = malloc(n * sizeof(float));
  dspk_client *c2;
  uint64_t b[3];
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  (void)state;
  assert_non_null(x);
  for (size_t i = 0; i < n; i++)
    x[i] = -(float)(i % 1000);
  abs_task_of(&t, &in, x, n, NULL);
  own_daemon("refused", three, sock, sizeof sock, &c2);
  for (int i = 0; i < 3; i++)
    assert_int_equal(dspk_buffer_create(c2, "cpu:0", 16, &b[i]), 0);
  dspk_set_shared_threshold(c2, DSPK_SHARED_THRESHOLD);
  if (dspk_run(c2, &t, &r) != 0)
    fail_msg("dspk_run with every buffer taken: %s", dspk_last_error(c2));
  for (size_t i = 0; i < n; i++)
    if (((const float *)r.out[0].data)[i] != (float)(i % 1000))
      fail_msg("element %zu", i);
  dspk_result_free(&r);
  assert_int_equal(c2->nshm, 0);
  /* a buffer freed: the next run makes its temporary again */
  assert_int_equal(dspk_buffer_free(c2, b[2]), 0);
  assert_int_equal(dspk_run(c2, &t, &r), 0);
  assert_true(((const float *)r.out[0].data)[999] == 999.0f);
  dspk_result_free(&r);
  assert_int_equal(c2->nshm, 1);
  own_daemon_stop(c2, sock);

  own_daemon("small", small, sock, sizeof sock, &c2);
  for (int i = 0; i < 3; i++)
    assert_int_equal(dspk_buffer_create(c2, "cpu:0", 16, &b[i]), 0);
  assert_int_equal(dspk_run(c2, &t, &r), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c2), "shared temporary"));
  assert_non_null(strstr(dspk_last_error(c2), "max_buffers"));
  assert_int_equal(dspk_ping(c2, NULL, 0), 0); /* the connection is fine */
  own_daemon_stop(c2, sock);
  free(x);
}

/* dspk.h: dspk_last_error() is never "" after a failed call.  Each failure
 * that went through the library's own temporaries: a dspk_buffer_create
 * and a dspk_shared_alloc refused while idle temporaries were held (freed,
 * and the call tried once more), a dspk_run whose temporaries the full
 * quota refuses (the task then goes inline and is refused too): each says
 * which limit, read right after the call (outside probe 15 D8 read it after
 * a dspk_status_get, a later call that succeeded, and saw "").  The
 * messages are the daemon's for the same calls without temporaries. */
static void test_retry_message(void **state) {
  char sock[160];
  const char *const quota[] = {"--max-conn-memory", "64M", NULL};
  const size_t big = ((size_t)64 << 20) + 1;
  float *x = calloc((size_t)1 << 20, sizeof(float));
  dspk_client *c2;
  uint64_t id = 0, full = 0;
  void *p = NULL;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  (void)state;
  assert_non_null(x);
  own_daemon("retrymsg", quota, sock, sizeof sock, &c2);
  dspk_set_shared_threshold(c2, DSPK_SHARED_THRESHOLD);
  scale_on(c2, (size_t)1 << 20); /* 4 MiB: its temporaries stay idle */
  assert_true(count_state_of(c2, 2) >= 1);
  assert_int_equal(dspk_buffer_create(c2, "cpu:0", big, &id), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c2), "max_conn_memory"));
  assert_int_equal(count_state_of(c2, 2), 0); /* freed for the second try */
  scale_on(c2, (size_t)1 << 20);
  assert_true(count_state_of(c2, 2) >= 1);
  assert_int_equal(dspk_shared_alloc(c2, "cpu:0", big, &p, &id), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c2), "max_conn_memory"));
  assert_int_equal(count_state_of(c2, 2), 0);
  /* the quota full: the task's temporaries refused, then the task inline */
  scale_on(c2, (size_t)1 << 20);
  assert_int_equal(dspk_buffer_create(c2, "cpu:0", big - 1, &full), 0);
  abs_task_of(&t, &in, x, (size_t)1 << 20, NULL);
  assert_int_equal(dspk_run(c2, &t, &r), DSPK_ELIMIT);
  assert_non_null(strstr(dspk_last_error(c2), "max_conn_memory"));
  assert_int_equal(dspk_buffer_free(c2, full), 0);
  own_daemon_stop(c2, sock);
  free(x);
}

/* dspk.h (dspk_set_shared_threshold): a dspk_run refused ELIMIT while c
 * held idle temporaries is sent once more through the socket, its answer
 * dspk_run's.  Under a 16 MiB max_conn_memory a 4 MiB map leaves one idle
 * 4 MiB temporary (its result's, given back by dspk_result_free); a 6.5 MiB
 * map (13 MiB inline) then passed the quota only for that temporary.  The
 * wait's trim freed it (larger than the idle bound, an eighth of the
 * quota) before dspk_run asked whether idle ones were held, so the task was
 * not sent again and dspk_run returned the refusal, which the identical
 * next call did not get (probe 23 B1).  With the default threshold and with
 * 0 set after the first run: each 6.5 MiB run works, and its result is the
 * retried task's. */
static void test_idle_temps_rerun(void **state) {
  char sock[160];
  const char *const quota[] = {"--max-conn-memory", "16M", NULL};
  const size_t small = (size_t)1 << 20, big = ((size_t)13 << 20) / 8;
  float *x = malloc(big * sizeof(float));
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  (void)state;
  assert_non_null(x);
  for (size_t i = 0; i < big; i++)
    x[i] = -(float)(i % 1000) - 0.5f;
  for (int thr0 = 0; thr0 <= 1; thr0++) {
    dspk_client *c2;
    own_daemon("rerun", quota, sock, sizeof sock, &c2);
    dspk_set_shared_threshold(c2, DSPK_SHARED_THRESHOLD);
    abs_task_of(&t, &in, x, small, NULL);
    assert_int_equal(dspk_run(c2, &t, &r), 0);
    dspk_result_free(&r);
    assert_int_equal(temps_of(c2), 1); /* the idle temporary the next run trips on */
    if (thr0)
      dspk_set_shared_threshold(c2, 0);
    abs_task_of(&t, &in, x, big, NULL);
    for (int run = 0; run < 2; run++) {
      if (dspk_run(c2, &t, &r) != 0)
        fail_msg("threshold %s, run %d: %s", thr0 ? "0" : "default", run,
                 dspk_last_error(c2));
      assert_int_equal(r.out[0].nbytes, big * sizeof(float));
      for (size_t i = 0; i < big; i++)
        if (((const float *)r.out[0].data)[i] != (float)(i % 1000) + 0.5f)
          fail_msg("threshold %s, run %d, element %zu", thr0 ? "0" : "default", run, i);
      dspk_result_free(&r);
    }
    own_daemon_stop(c2, sock);
  }
  free(x);
}

/* Makes memfd_create fail with err in this process from now on (a seccomp
 * filter, as a container's or a systemd unit's can). */
static int block_memfd(int err) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* In a child whose memfd_create fails with err: dspk_shared_alloc, and a
 * dspk_run whose operand (600 KiB under a 1 MiB max_message) cannot cross
 * the socket, fail with want and say that shared memory is unavailable; an
 * operand that can cross it still works.  The child's exit status: 0, or
 * the step that failed (its message on stderr). */
static int memfd_blocked(const char *sock, int err, int want) {
  const size_t big = (size_t)600 << 10, small = (size_t)100 << 10;
  float *x = malloc(big);
  dspk_client *c;
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  void *p = NULL;
  uint64_t id;
  int rc;
  if (!x || dspk_connect(sock, "memfd_blocked", &c) != 0)
    return 1;
  for (size_t i = 0; i < big / sizeof(float); i++)
    x[i] = -(float)(i % 1000);
  if (block_memfd(err) != 0)
    return 2;
  if ((rc = dspk_shared_alloc(c, "cpu:0", 4096, &p, &id)) != want ||
      !strstr(dspk_last_error(c), "shared memory is unavailable") ||
      !strstr(dspk_last_error(c), strerror(err))) {
    fprintf(stderr, "dspk_shared_alloc: %d %s\n", rc, dspk_last_error(c));
    return 3;
  }
  abs_task_of(&t, &in, x, big / sizeof(float), NULL);
  if ((rc = dspk_run(c, &t, &r)) != want ||
      !strstr(dspk_last_error(c), "cannot cross the socket") ||
      !strstr(dspk_last_error(c), "shared memory is unavailable")) {
    fprintf(stderr, "dspk_run of 600 KiB: %d %s\n", rc, dspk_last_error(c));
    return 4;
  }
  dspk_set_shared_threshold(c, 4096); /* a temporary wanted, not needed: the socket */
  abs_task_of(&t, &in, x, small / sizeof(float), NULL);
  if ((rc = dspk_run(c, &t, &r)) != 0) {
    fprintf(stderr, "dspk_run of 100 KiB: %d %s\n", rc, dspk_last_error(c));
    return 5;
  }
  for (size_t i = 0; i < small / sizeof(float); i++)
    if (((const float *)r.out[0].data)[i] != (float)(i % 1000))
      return 6;
  dspk_result_free(&r);
  dspk_close(c);
  free(x);
  return 0;
}

/* No memfd_create here (ENOSYS: a kernel without it, or a seccomp filter
 * that says so; EPERM: one that forbids it) was DSPK_ENOMEM "memfd_create:
 * Function not implemented", for dspk_shared_alloc and for an operand that
 * needed a temporary (probe 23 B3).  Now DSPK_ENOTSUP and DSPK_EPERM, saying
 * that shared memory is unavailable, as the Python client's NotSupported
 * and PermissionDenied. */
static void test_no_memfd(void **state) {
  char sock[160];
  const char *const small[] = {"--max-message", "1M", NULL};
  const int errs[][2] = {{ENOSYS, DSPK_ENOTSUP}, {EPERM, DSPK_EPERM}, {EACCES, DSPK_EPERM}};
  dspk_client *c2;
  (void)state;
  own_daemon("nomemfd", small, sock, sizeof sock, &c2);
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
    int st;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
      _exit(memfd_blocked(sock, errs[i][0], errs[i][1]));
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      fail_msg("memfd_create failing with %s: step %d failed", strerror(errs[i][0]),
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  assert_int_equal(dspk_ping(c2, NULL, 0), 0);
  own_daemon_stop(c2, sock);
}

/* A kernel task's error for tensors too large for an answer (ELIMIT, or
 * the task too large for max_message), or the refusal the task gets
 * whatever the size: the same small and large. */
static int kernel_err(dspk_client *c, const char *device, const char *lang, int64_t n,
                      char *err, size_t len) {
  static float x[4096];
  static const char src[] = "#version 450\nlayout(local_size_x = 1) in;\n"
                            "layout(binding = 0) buffer A { float a[]; };\n"
                            "void main() { a[gl_GlobalInvocationID.x] *= 2.0; }\n";
  dspk_tensor t;
  dspk_task k;
  dspk_result r;
  int rc;
  dspk_task_init(&k, DSPK_OP_KERNEL);
  dspk_tensor_inline(&t, DSPK_F32, 1, &n, x);
  k.device = device;
  k.kernel.lang = lang;
  k.kernel.source = src;
  k.kernel.source_len = sizeof src - 1;
  k.kernel.entry = "main";
  for (int i = 0; i < 3; i++)
    k.kernel.grid[i] = k.kernel.block[i] = 1;
  k.inputs = &t;
  k.ninputs = 1;
  k.kernel.nargs = 1;
  k.kernel.args[0].kind = DSPK_KARG_TENSOR;
  k.kernel.args[0].v.tensor = 0;
  rc = dspk_run(c, &k, &r);
  if (rc == 0)
    dspk_result_free(&r);
  snprintf(err, len, "%s", dspk_last_error(c));
  return rc;
}

/* A refusal that does not depend on the size is the task's whatever the
 * size, never size advice (outside probe 15 D4, D5): a device name longer
 * than 47 bytes (a gemm whose operands do not fit a 4096-byte max_message
 * advised shared memory and thresholds, one of 5000 bytes "too small a
 * limit"); a raw kernel on a device that runs none, or none of its
 * language (it advised buffer references for tensors larger than an
 * answer).  Where the device takes the kernel the advice stays. */
static void test_size_free_refusals(void **state) {
  static float a[500], b[500];
  char sock[160], small[512], large[512], *name = malloc(5001);
  const int64_t sa[2] = {1, 500}, sb[2] = {500, 1};
  const size_t thr[] = {0, 1, DSPK_SHARED_THRESHOLD};
  dspk_device_list *l = NULL;
  dspk_client *c2;
  dspk_tensor in[2];
  dspk_task t;
  dspk_result r;
  bool vk = false;
  (void)state;
  assert_non_null(name);
  snprintf(sock, sizeof sock, "%s/sizefree.sock", tmpdir);
  quota_pid = spawn_daemon(sock, "cpu,vulkan", "--max-message", "4096");
  assert_true(quota_pid > 0);
  assert_int_equal(dspk_connect(sock, "test_size_free_refusals", &c2), 0);
  for (size_t len = 48; len <= 5000; len += 5000 - 48) {
    memset(name, 'x', len);
    name[len] = '\0';
    dspk_task_init(&t, DSPK_OP_GEMM);
    t.device = name;
    dspk_tensor_inline(&in[0], DSPK_F32, 2, sa, a);
    dspk_tensor_inline(&in[1], DSPK_F32, 2, sb, b);
    t.inputs = in;
    t.ninputs = 2;
    for (size_t k = 0; k < sizeof thr / sizeof thr[0]; k++) {
      dspk_set_shared_threshold(c2, thr[k]);
      assert_int_equal(dspk_run(c2, &t, &r), DSPK_ELIMIT);
      assert_string_equal(dspk_last_error(c2), "device: longer than 47 bytes");
    }
    assert_int_equal(kernel_err(c2, name, "glsl", 16, small, sizeof small), DSPK_ELIMIT);
    assert_int_equal(kernel_err(c2, name, "glsl", 1000, large, sizeof large), DSPK_ELIMIT);
    assert_string_equal(small, "device: longer than 47 bytes");
    assert_string_equal(large, small);
  }
  dspk_set_shared_threshold(c2, 0);
  /* cpu:0 runs no raw kernels: ENOTSUP in the daemon's words, both sizes */
  assert_int_equal(kernel_err(c2, "cpu:0", "glsl", 16, small, sizeof small), DSPK_ENOTSUP);
  assert_int_equal(kernel_err(c2, "cpu:0", "glsl", 1000, large, sizeof large), DSPK_ENOTSUP);
  assert_string_equal(small, "kernel: cpu:0 runs no raw kernels");
  assert_string_equal(large, small);
  assert_int_equal(dspk_devices(c2, false, &l), 0);
  for (size_t i = 0; i < l->ndevices; i++)
    vk = vk || strcmp(l->devices[i].id, "vulkan:0") == 0;
  dspk_device_list_free(l);
  if (!vk) {
    dspk_close(c2);
    free(name);
    print_message("no vulkan:0 here (lavapipe): the kernel cases of a device that takes "
                  "raw kernels are not checked\n");
    skip();
  }
  /* vulkan:0 takes glsl, not cuda: the refusal for cuda at both sizes;
   * glsl too large for an answer keeps its advice. */
  assert_int_equal(kernel_err(c2, "vulkan:0", "cuda", 16, small, sizeof small), DSPK_ENOTSUP);
  assert_int_equal(kernel_err(c2, "vulkan:0", "cuda", 1000, large, sizeof large), DSPK_ENOTSUP);
  assert_string_equal(large, small);
  assert_int_equal(kernel_err(c2, "vulkan:0", "glsl", 1000, large, sizeof large), DSPK_ELIMIT);
  assert_non_null(strstr(large, "kernel: its inline tensors total 4000 bytes"));
  assert_non_null(strstr(large, "pass big tensors as buffer references"));
  assert_int_equal(kernel_err(c2, NULL, "glsl", 1000, large, sizeof large), DSPK_ELIMIT);
  assert_non_null(strstr(large, "pass big tensors as buffer references"));
  dspk_close(c2);
  free(name);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-DSPKD\n", argv[0]);
    return 2;
  }
  dspkd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      /* first: it reads the peak RSS */
      cmocka_unit_test_teardown(test_refused_alloc, stop_quota_daemon),
      cmocka_unit_test(test_shared_alloc_gemm),
      cmocka_unit_test(test_shared_from_file),
      cmocka_unit_test(test_from_file_kinds),
      cmocka_unit_test(test_huge_pages),
      cmocka_unit_test(test_auto_threshold),
      cmocka_unit_test(test_wide_copy),
      cmocka_unit_test(test_threshold_env),
      cmocka_unit_test(test_auto_result),
      cmocka_unit_test(test_lent_result),
      cmocka_unit_test(test_temps_bound),
      cmocka_unit_test(test_seals),
      cmocka_unit_test(test_unmap_and_exit),
      cmocka_unit_test(test_import_after_big),
      cmocka_unit_test_teardown(test_idle_temps_quota, stop_quota_daemon),
      cmocka_unit_test_teardown(test_temps_quota, stop_quota_daemon),
      cmocka_unit_test(test_freed_shared_id),
      cmocka_unit_test(test_shared_rw_overlap),
      cmocka_unit_test_teardown(test_timeout_keeps_order, stop_own_daemon),
      cmocka_unit_test_teardown(test_temp_refused, stop_own_daemon),
      cmocka_unit_test_teardown(test_retry_message, stop_own_daemon),
      cmocka_unit_test_teardown(test_idle_temps_rerun, stop_own_daemon),
      cmocka_unit_test_teardown(test_no_memfd, stop_own_daemon),
      cmocka_unit_test_teardown(test_size_free_refusals, stop_quota_daemon),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
