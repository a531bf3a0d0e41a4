/*
 * End-to-end tests of the persistent cache through a real dspkd (issue 3):
 * daemons started with --cache in a private temporary directory, driven
 * through libdspkclient and dspk-submit.
 *
 *   wisdom_restart   an fft of 2^14 c64 (planned with FFTW_MEASURE) stores a
 *                    wisdom blob; after a restart on the same file the
 *                    wisdom is read at start (blobs.hits) and the same fft
 *                    plans from it: no new wisdom is stored (blobs.puts 0);
 *                    the plan served again from memory counts as a use of
 *                    the wisdom (blobs.stored_hits)
 *   progress         a fir whose shape needs tuning sends task.progress
 *                    notifications to the client (dspk_set_progress); the
 *                    same shape again is decided from memory (no progress)
 *   two_daemons      two daemons on one cache file (different sockets)
 *                    serve tuned tasks at the same time without an error
 *   clear_root       cache.clear by this user (root or the daemon's own
 *                    user) through the library and the CLI; cache stats
 *                    --json is valid JSON
 *   locations        --no-cache (ENOENT), $XDG_CACHE_HOME/dspk/cache.db by
 *                    default, $CACHE_DIRECTORY/cache.db under systemd, an
 *                    unusable path (in memory, one warning in the log),
 *                    --cache-max-bytes
 *   foreign_file     --cache naming another program's SQLite database: the
 *                    file is unchanged byte for byte (no -wal/-shm), one
 *                    warning, an in-memory cache
 *   file_deleted     the cache file deleted while the daemon runs: the next
 *                    put makes a new one at the path (one warning), and it
 *                    holds what was stored after the deletion
 *   other_uid        (run with the argument "other-uid"; root only, else
 *                    exit 77 = skipped) uid 65534 gets EPERM from
 *                    dspk-submit cache clear: exit 1, one clear line
 *
 * Results are checked against naive double-precision loops.  Nothing waits
 * by sleeping: daemons report READY on a pipe, children are waited for.
 *
 * Usage: test_cache_e2e DSPKD DSPK-SUBMIT [other-uid]
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "dspk/dspk.h"

#define NOBODY 65534
#define READY_TIMEOUT_MS 120000

static const char *dspkd_path, *submit_path;
static char tmpdir[64];

/* ---- small helpers ------------------------------------------------------- */

static uint64_t rng_state;
static double rnd(void) { /* uniform in [-1, 1), fixed sequence */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void path_in_tmp(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", tmpdir, name);
}

struct daemon {
  pid_t pid;
  char sock[128];
};

/* Starts dspkd (cpu only) on tmpdir/<sockname> with the cache arguments
 * cache_args (NULL-terminated, e.g. {"--cache", path, NULL}) and the
 * environment changes env ("NAME=value", "NAME" to unset; NULL-terminated),
 * and waits for its READY line.  Its stderr goes to tmpdir/<sockname>.log. */
static void daemon_start_ex(struct daemon *d, const char *sockname,
                            const char *const *cache_args, const char *const *env) {
  char log[128], fdarg[16], buf[16] = "";
  const char *argv[32];
  int p[2], n = 0;
  size_t got = 0;

  path_in_tmp(d->sock, sizeof d->sock, sockname);
  snprintf(log, sizeof log, "%s/%s.log", tmpdir, sockname);
  unlink(log);
  assert_int_equal(pipe(p), 0);
  d->pid = fork();
  assert_true(d->pid >= 0);
  if (d->pid == 0) {
    /* A failed assertion leaves no daemon behind (it would hold the test's
     * output open, and ctest would report a timeout, not the failure). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0)
      dup2(fd, STDERR_FILENO);
    close(p[0]);
    snprintf(fdarg, sizeof fdarg, "%d", p[1]);
    for (int i = 0; env && env[i]; i++) {
      const char *eq = strchr(env[i], '=');
      if (eq) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
        setenv(name, eq + 1, 1);
      } else {
        unsetenv(env[i]);
      }
    }
    {
      const char *fixed[] = {dspkd_path, "--socket", d->sock, "--foreground", "--backends",
                             "cpu", "--config", "", "--log-level", "info", "--ready-fd",
                             fdarg};
      for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    }
    for (int i = 0; cache_args && cache_args[i] && n < 31; i++)
      argv[n++] = cache_args[i];
    argv[n] = NULL;
    execv(dspkd_path, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  for (;;) {
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    ssize_t n;
    if (poll(&pf, 1, READY_TIMEOUT_MS) <= 0)
      break;
    n = read(p[0], buf + got, sizeof buf - 1 - got);
    if (n <= 0)
      break;
    got += (size_t)n;
    if (got == sizeof buf - 1 || memchr(buf, '\n', got))
      break;
  }
  close(p[0]);
  buf[got] = '\0';
  if (strcmp(buf, "READY\n") != 0)
    fail_msg("dspkd did not become ready (got \"%s\"); see %s", buf, log);
}

/* daemon_start_ex with --cache tmpdir/<cachename>. */
static void daemon_start(struct daemon *d, const char *sockname, const char *cachename) {
  char cache[128];
  const char *args[] = {"--cache", cache, NULL};
  path_in_tmp(cache, sizeof cache, cachename);
  daemon_start_ex(d, sockname, args, NULL);
}

/* The daemon's log so far (NUL-terminated, static). */
static const char *daemon_log(const struct daemon *d) {
  static char text[16384];
  char log[160];
  size_t k = 0;
  FILE *f;
  snprintf(log, sizeof log, "%s.log", d->sock);
  f = fopen(log, "r");
  if (f) {
    k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
  }
  text[k] = '\0';
  return text;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* SIGTERM, and the daemon must exit 0. */
static void daemon_stop(struct daemon *d) {
  int status;
  assert_int_equal(kill(d->pid, SIGTERM), 0);
  assert_int_equal(waitpid(d->pid, &status, 0), d->pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  d->pid = 0;
}

static dspk_client *connect_to(const struct daemon *d) {
  dspk_client *c = NULL;
  int rc = dspk_connect(d->sock, "test_cache_e2e", &c);
  if (rc != 0)
    fail_msg("connect %s: %s", d->sock, dspk_connect_error());
  return c;
}

/* Reads kinds.<kind>.<field> from a cache.stats JSON text (the daemon's
 * fixed layout: "kind":{"field":N,...}). */
static uint64_t json_field(const char *json, const char *kind, const char *field) {
  char key[64];
  const char *p, *end;
  snprintf(key, sizeof key, "\"%s\":{", kind);
  p = strstr(json, key);
  if (!p)
    fail_msg("no %s in %s", kind, json);
  end = strchr(p, '}');
  snprintf(key, sizeof key, "\"%s\":", field);
  p = strstr(p, key);
  if (!p || p > end)
    fail_msg("no %s.%s in %s", kind, field, json);
  return strtoull(p + strlen(key), NULL, 10);
}

/* Copies the top-level string "key":"..." of a JSON text into out. */
static void json_str(const char *json, const char *key, char *out, size_t len) {
  char k[64];
  const char *p, *e;
  snprintf(k, sizeof k, "\"%s\":\"", key);
  p = strstr(json, k);
  if (!p)
    fail_msg("no %s in %s", key, json);
  p += strlen(k);
  e = strchr(p, '"');
  assert_non_null(e);
  snprintf(out, len, "%.*s", (int)(e - p), p);
}

static char *stats_json(dspk_client *c) {
  char *json = NULL;
  int rc = dspk_call_json(c, "cache.stats", &json);
  if (rc != 0)
    fail_msg("cache.stats: %s: %s", dspk_err_name(rc), dspk_last_error(c));
  return json;
}

static uint64_t stat_of(dspk_client *c, const char *kind, const char *field) {
  char *json = stats_json(c);
  uint64_t v = json_field(json, kind, field);
  dspk_free(json);
  return v;
}

/* Runs `dspk-submit --socket SOCK args...` (as uid when uid >= 0) and
 * returns its exit status; its stdout and stderr go to out and err. */
static int run_cli(const char *sock, int uid, char *out, size_t outlen, char *err,
                   size_t errlen, ...) {
  char outf[128], errf[128];
  const char *argv[16];
  int n = 0, status;
  va_list ap;
  pid_t pid;

  path_in_tmp(outf, sizeof outf, "cli.out");
  path_in_tmp(errf, sizeof errf, "cli.err");
  argv[n++] = submit_path;
  argv[n++] = "--socket";
  argv[n++] = sock;
  va_start(ap, errlen);
  for (const char *a; n < 15 && (a = va_arg(ap, const char *));)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  unlink(outf);
  unlink(errf);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fo = open(outf, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int fe = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fo < 0 || fe < 0)
      _exit(126);
    dup2(fo, STDOUT_FILENO);
    dup2(fe, STDERR_FILENO);
    if (uid >= 0 && (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 ||
                     setuid((uid_t)uid) != 0))
      _exit(125);
    execv(submit_path, (char *const *)argv);
    _exit(127);
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  {
    FILE *f = fopen(outf, "r");
    size_t k = f ? fread(out, 1, outlen - 1, f) : 0;
    out[k] = '\0';
    if (f)
      fclose(f);
    f = fopen(errf, "r");
    k = f ? fread(err, 1, errlen - 1, f) : 0;
    err[k] = '\0';
    if (f)
      fclose(f);
  }
  return WEXITSTATUS(status);
}

/* ---- the ops, checked against naive loops -------------------------------- */

#define FFT_N (1 << 14)

/* fft of FFT_N c64 on cpu:0; checks 64 bins against a naive DFT. */
static void fft_check(dspk_client *c, uint64_t seed) {
  float *x = malloc(sizeof(float) * 2 * FFT_N);
  int64_t shape[1] = {FFT_N};
  dspk_tensor in;
  dspk_task t;
  dspk_result r;
  double norm = 0;
  int rc;

  assert_non_null(x);
  rng_state = seed;
  for (int i = 0; i < 2 * FFT_N; i++) {
    x[i] = (float)rnd();
    norm += (double)x[i] * x[i];
  }
  dspk_tensor_inline(&in, DSPK_C64, 1, shape, x);
  dspk_task_init(&t, DSPK_OP_FFT);
  t.device = "cpu:0";
  t.ninputs = 1;
  t.inputs = &in;
  rc = dspk_run(c, &t, &r);
  if (rc != 0)
    fail_msg("fft: %s: %s", dspk_err_name(rc), dspk_last_error(c));
  assert_int_equal(r.nout, 1);
  assert_int_equal(r.out[0].dtype, DSPK_C64);
  assert_int_equal(r.out[0].shape[0], FFT_N);
  {
    const float *y = r.out[0].data;
    for (int b = 0; b < 64; b++) {
      int k = (b * 257 + 3) % FFT_N;
      double re = 0, im = 0;
      for (int n = 0; n < FFT_N; n++) {
        double a = -2.0 * M_PI * (double)(((int64_t)k * n) % FFT_N) / FFT_N;
        re += x[2 * n] * cos(a) - x[2 * n + 1] * sin(a);
        im += x[2 * n] * sin(a) + x[2 * n + 1] * cos(a);
      }
      if (hypot(y[2 * k] - re, y[2 * k + 1] - im) > 1e-4 * sqrt(norm) * 10)
        fail_msg("fft bin %d: (%g, %g) want (%g, %g)", k, y[2 * k], y[2 * k + 1], re, im);
    }
  }
  dspk_result_free(&r);
  free(x);
}

/* Builds a fir task over f32 x (1, n) and h (k,) from seed. */
struct fir {
  float *x, *h;
  int64_t xs[2], hs[1];
  dspk_tensor in[2];
  dspk_task t;
};

static void fir_make(struct fir *f, int n, int k, uint64_t seed) {
  f->x = malloc(sizeof(float) * (size_t)n);
  f->h = malloc(sizeof(float) * (size_t)k);
  assert_non_null(f->x);
  assert_non_null(f->h);
  rng_state = seed;
  for (int i = 0; i < n; i++)
    f->x[i] = (float)rnd();
  for (int i = 0; i < k; i++)
    f->h[i] = (float)rnd() / (float)k;
  f->xs[0] = 1;
  f->xs[1] = n;
  f->hs[0] = k;
  dspk_tensor_inline(&f->in[0], DSPK_F32, 2, f->xs, f->x);
  dspk_tensor_inline(&f->in[1], DSPK_F32, 1, f->hs, f->h);
  dspk_task_init(&f->t, DSPK_OP_FIR);
  f->t.device = "cpu:0";
  f->t.ninputs = 2;
  f->t.inputs = f->in;
}

/* lfilter(h, 1, x) in double, compared with the result. */
static void fir_verify(const struct fir *f, const dspk_result *r) {
  int n = (int)f->xs[1], k = (int)f->hs[0];
  const float *y;
  assert_int_equal(r->nout, 1);
  assert_int_equal(r->out[0].dtype, DSPK_F32);
  assert_int_equal(r->out[0].shape[1], n);
  y = r->out[0].data;
  for (int i = 0; i < n; i++) {
    double s = 0;
    for (int j = 0; j < k && j <= i; j++)
      s += (double)f->h[j] * f->x[i - j];
    if (fabs(y[i] - s) > 1e-4)
      fail_msg("fir y[%d] = %g, want %g", i, y[i], s);
  }
}

static void fir_free(struct fir *f) {
  free(f->x);
  free(f->h);
}

static void fir_check(dspk_client *c, int n, int k, uint64_t seed) {
  struct fir f;
  dspk_result r;
  int rc;
  fir_make(&f, n, k, seed);
  rc = dspk_run(c, &f.t, &r);
  if (rc != 0)
    fail_msg("fir: %s: %s", dspk_err_name(rc), dspk_last_error(c));
  fir_verify(&f, &r);
  dspk_result_free(&r);
  fir_free(&f);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_wisdom_restart(void **state) {
  struct daemon d;
  dspk_client *c;
  (void)state;

  daemon_start(&d, "w.sock", "wisdom.db");
  c = connect_to(&d);
  assert_int_equal(stat_of(c, "blobs", "entries"), 0);
  fft_check(c, 1);
  /* FFTW_MEASURE made a plan; its wisdom is a blob now. */
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  assert_true(stat_of(c, "blobs", "puts") >= 1);
  dspk_close(c);
  daemon_stop(&d);

  daemon_start(&d, "w.sock", "wisdom.db");
  c = connect_to(&d);
  /* The wisdom was read when cpu:0 opened ... */
  assert_true(stat_of(c, "blobs", "hits") >= 1);
  fft_check(c, 2);
  /* ... and the plan came from it: nothing new to store. */
  assert_int_equal(stat_of(c, "blobs", "puts"), 0);
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  /* The plan again, from the daemon's memory: a use of the wisdom, counted
   * in the file (the size bound evicts what was least recently used). */
  {
    uint64_t before = stat_of(c, "blobs", "stored_hits");
    fft_check(c, 3);
    assert_true(stat_of(c, "blobs", "stored_hits") >= before + 1);
  }
  dspk_close(c);
  daemon_stop(&d);
}

struct progress {
  uint32_t ticket;
  int calls, bad;
  double last;
};

static void on_progress(void *ud, uint32_t ticket, const char *what, double fraction) {
  struct progress *p = ud;
  p->calls++;
  if (ticket != p->ticket || !what || !strstr(what, "autotune") || fraction < 0 ||
      fraction > 1)
    p->bad++;
  p->last = fraction;
}

static void test_progress(void **state) {
  struct daemon d;
  struct progress pr = {0};
  struct fir f;
  dspk_result r;
  dspk_client *c;
  int rc;
  (void)state;

  daemon_start(&d, "p.sock", "progress.db");
  c = connect_to(&d);
  dspk_set_progress(c, on_progress, &pr);
  /* n = 2^14, k = 64: between the always-direct and always-FFT sizes, so
   * the first task measures direct against FFT overlap-add. */
  fir_make(&f, 1 << 14, 64, 7);
  rc = dspk_submit(c, &f.t, &pr.ticket);
  assert_int_equal(rc, 0);
  rc = dspk_wait(c, pr.ticket, &r);
  if (rc != 0)
    fail_msg("fir: %s: %s", dspk_err_name(rc), dspk_last_error(c));
  fir_verify(&f, &r);
  dspk_result_free(&r);
  assert_true(pr.calls >= 1);
  assert_int_equal(pr.bad, 0);
  assert_true(stat_of(c, "autotune", "puts") >= 1);
  /* The same shape again: decided from memory, no tuning, no progress. */
  pr.calls = 0;
  rc = dspk_submit(c, &f.t, &pr.ticket);
  assert_int_equal(rc, 0);
  assert_int_equal(dspk_wait(c, pr.ticket, &r), 0);
  fir_verify(&f, &r);
  dspk_result_free(&r);
  assert_int_equal(pr.calls, 0);
  fir_free(&f);
  dspk_close(c);
  daemon_stop(&d);
}

static void test_two_daemons(void **state) {
  struct daemon a, b;
  dspk_client *ca, *cb;
  struct fir fa, fb;
  dspk_result r;
  uint32_t ta, tb;
  (void)state;

  daemon_start(&a, "a.sock", "shared.db");
  daemon_start(&b, "b.sock", "shared.db");
  ca = connect_to(&a);
  cb = connect_to(&b);
  /* Both tune (the same key and another one) at the same time. */
  for (int round = 0; round < 2; round++) {
    fir_make(&fa, 1 << 13, 32, 11 + (uint64_t)round);
    fir_make(&fb, 1 << 13, round ? 128 : 32, 21 + (uint64_t)round);
    assert_int_equal(dspk_submit(ca, &fa.t, &ta), 0);
    assert_int_equal(dspk_submit(cb, &fb.t, &tb), 0);
    if (dspk_wait(ca, ta, &r) != 0)
      fail_msg("daemon a: %s", dspk_last_error(ca));
    fir_verify(&fa, &r);
    dspk_result_free(&r);
    if (dspk_wait(cb, tb, &r) != 0)
      fail_msg("daemon b: %s", dspk_last_error(cb));
    fir_verify(&fb, &r);
    dspk_result_free(&r);
    fir_free(&fa);
    fir_free(&fb);
  }
  fft_check(ca, 3);
  fft_check(cb, 4);
  /* One file, seen alike by both. */
  assert_true(stat_of(ca, "autotune", "entries") >= 2);
  assert_int_equal(stat_of(ca, "autotune", "entries"), stat_of(cb, "autotune", "entries"));
  assert_int_equal(stat_of(ca, "blobs", "entries"), stat_of(cb, "blobs", "entries"));
  dspk_close(ca);
  dspk_close(cb);
  daemon_stop(&a);
  daemon_stop(&b);
}

static void test_clear_root(void **state) {
  struct daemon d;
  dspk_client *c;
  char out[8192], err[1024];
  unsigned cleared = 0;
  int rc;
  (void)state;

  daemon_start(&d, "c.sock", "clear.db");
  c = connect_to(&d);
  fft_check(c, 5);
  fir_check(c, 1 << 14, 64, 6);
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  assert_true(stat_of(c, "autotune", "entries") >= 1);

  /* One kind through the library. */
  rc = dspk_cache_clear(c, DSPK_CACHE_AUTOTUNE, &cleared);
  if (rc != 0)
    fail_msg("cache.clear: %s: %s", dspk_err_name(rc), dspk_last_error(c));
  assert_int_equal(cleared, DSPK_CACHE_AUTOTUNE);
  assert_int_equal(stat_of(c, "autotune", "entries"), 0);
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  assert_int_equal(dspk_cache_clear(c, 8u, NULL), DSPK_EINVAL);

  /* The rest through the CLI. */
  rc = run_cli(d.sock, -1, out, sizeof out, err, sizeof err, "cache", "clear", "--blobs",
               "--kernels", (char *)NULL);
  if (rc != 0)
    fail_msg("cache clear: exit %d: %s", rc, err);
  assert_string_equal(out, "cleared kernels blobs\n");
  assert_int_equal(stat_of(c, "blobs", "entries"), 0);
  rc = run_cli(d.sock, -1, out, sizeof out, err, sizeof err, "cache", "clear", (char *)NULL);
  assert_int_equal(rc, 0);
  assert_string_equal(out, "cleared kernels autotune blobs\n");

  /* A cleared decision is tuned again (and still correct). */
  fir_check(c, 1 << 14, 64, 6);
  assert_true(stat_of(c, "autotune", "entries") >= 1);

  /* cache stats --json is JSON with the documented fields. */
  rc = run_cli(d.sock, -1, out, sizeof out, err, sizeof err, "cache", "stats", "--json",
               (char *)NULL);
  if (rc != 0)
    fail_msg("cache stats --json: exit %d: %s", rc, err);
  {
    char jf[128], cmd[512];
    FILE *f;
    path_in_tmp(jf, sizeof jf, "stats.json");
    f = fopen(jf, "w");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); "
             "assert j[\"path\"].endswith(\"clear.db\") and j[\"in_memory\"] is False; "
             "assert set(j[\"kinds\"]) == {\"kernels\",\"autotune\",\"blobs\"}; "
             "assert all(set(k) == {\"entries\",\"bytes\",\"stored_hits\",\"hits\","
             "\"misses\",\"puts\",\"evictions\",\"put_errors\"} "
             "for k in j[\"kinds\"].values())' %s",
             jf);
    if (system("python3 -c '' 2>/dev/null") == 0)
      assert_int_equal(system(cmd), 0);
    else
      assert_true(out[0] == '{' && json_field(out, "autotune", "entries") >= 1);
  }
  dspk_close(c);
  daemon_stop(&d);
}

/* Where the cache lives: --no-cache, the XDG default, systemd's
 * CACHE_DIRECTORY, an unusable location (in memory, one warning), and the
 * size bound. */
static void test_locations(void **state) {
  struct daemon d;
  dspk_client *c;
  char *json = NULL, path[256], want[256], out[1024], err[1024];
  struct stat st;
  int rc;
  (void)state;

  { /* --no-cache: both methods say ENOENT, the CLI fails with one line. */
    const char *args[] = {"--no-cache", NULL};
    daemon_start_ex(&d, "n.sock", args, NULL);
    c = connect_to(&d);
    assert_int_equal(dspk_call_json(c, "cache.stats", &json), DSPK_ENOENT);
    assert_non_null(strstr(dspk_last_error(c), "without a cache"));
    assert_int_equal(dspk_cache_clear(c, 0, NULL), DSPK_ENOENT);
    rc = run_cli(d.sock, -1, out, sizeof out, err, sizeof err, "cache", "stats", (char *)NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "ENOENT"));
    fft_check(c, 9); /* and tasks run */
    dspk_close(c);
    daemon_stop(&d);
  }
  { /* No flag: $XDG_CACHE_HOME/dspk/cache.db (created). */
    char xdg[160], env0[200];
    const char *env[] = {env0, "CACHE_DIRECTORY", NULL};
    path_in_tmp(xdg, sizeof xdg, "xdg");
    snprintf(env0, sizeof env0, "XDG_CACHE_HOME=%s", xdg);
    daemon_start_ex(&d, "x.sock", NULL, env);
    c = connect_to(&d);
    json = stats_json(c);
    json_str(json, "path", path, sizeof path);
    snprintf(want, sizeof want, "%s/dspk/cache.db", xdg);
    assert_string_equal(path, want);
    assert_non_null(strstr(json, "\"in_memory\":false"));
    assert_int_equal(stat(want, &st), 0);
    dspk_free(json);
    dspk_close(c);
    daemon_stop(&d);
  }
  { /* Under systemd: $CACHE_DIRECTORY/cache.db wins over XDG. */
    char sd[160], env0[200], env1[200];
    const char *env[] = {env0, env1, NULL};
    path_in_tmp(sd, sizeof sd, "sd");
    assert_int_equal(mkdir(sd, 0750), 0);
    snprintf(env0, sizeof env0, "CACHE_DIRECTORY=%s", sd);
    snprintf(env1, sizeof env1, "XDG_CACHE_HOME=%s/xdg-unused", tmpdir);
    daemon_start_ex(&d, "s.sock", NULL, env);
    c = connect_to(&d);
    json = stats_json(c);
    json_str(json, "path", path, sizeof path);
    snprintf(want, sizeof want, "%s/cache.db", sd);
    assert_string_equal(path, want);
    dspk_free(json);
    dspk_close(c);
    daemon_stop(&d);
  }
  { /* Unusable (its "directory" is a regular file, so even root cannot
     * create it): in-memory cache, exactly one warning, tuned tasks run. */
    char file[160], bad[200];
    const char *args[] = {"--cache", bad, "--cache-max-bytes", "65536", NULL};
    FILE *f;
    path_in_tmp(file, sizeof file, "notadir");
    f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(bad, sizeof bad, "%s/cache.db", file);
    daemon_start_ex(&d, "u.sock", args, NULL);
    c = connect_to(&d);
    json = stats_json(c);
    json_str(json, "path", path, sizeof path);
    assert_string_equal(path, ":memory:");
    assert_non_null(strstr(json, "\"in_memory\":true"));
    assert_non_null(strstr(json, "\"max_bytes\":65536"));
    dspk_free(json);
    fir_check(c, 1 << 14, 64, 10);
    assert_true(stat_of(c, "autotune", "entries") >= 1);
    dspk_close(c);
    daemon_stop(&d);
    if (count_of(daemon_log(&d), "warn: cache:") != 1)
      fail_msg("want one cache warning in the log:\n%s", daemon_log(&d));
  }
}

/* The whole file (malloc'd) and its size; NULL when it cannot be read. */
static char *slurp(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  char *buf = NULL;
  long size;
  if (!fp)
    return NULL;
  if (fseek(fp, 0, SEEK_END) == 0 && (size = ftell(fp)) >= 0) {
    rewind(fp);
    buf = malloc((size_t)size + 1);
    if (buf && fread(buf, 1, (size_t)size, fp) != (size_t)size) {
      free(buf);
      buf = NULL;
    }
    *n = (size_t)size;
  }
  fclose(fp);
  return buf;
}

/* --cache naming another program's SQLite database: the file stays byte
 * for byte as it was (no -wal or -shm beside it), one warning says why, and
 * the daemon runs with an in-memory cache. */
static void test_foreign_file(void **state) {
  struct daemon d;
  dspk_client *c;
  char app[160], side[200], *json, path[256], *before, *after;
  size_t n0 = 0, n1 = 0;
  int in_memory;
  sqlite3 *db;
  const char *args[] = {"--cache", app, NULL};
  (void)state;

  path_in_tmp(app, sizeof app, "app.db");
  assert_int_equal(sqlite3_open(app, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "CREATE TABLE users(name TEXT);"
                                    " INSERT INTO users VALUES('alice');",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  before = slurp(app, &n0);
  assert_non_null(before);
  daemon_start_ex(&d, "f.sock", args, NULL);
  c = connect_to(&d);
  json = stats_json(c);
  json_str(json, "path", path, sizeof path);
  in_memory = strstr(json, "\"in_memory\":true") != NULL;
  dspk_free(json);
  fft_check(c, 12); /* tasks run */
  dspk_close(c);
  daemon_stop(&d); /* before any check, so that a failure leaves no daemon */
  assert_string_equal(path, ":memory:");
  assert_true(in_memory);
  if (count_of(daemon_log(&d), "warn: cache:") != 1 ||
      !strstr(daemon_log(&d), "is an SQLite database of another program (table users):"
                              " leaving it alone; using an in-memory cache"))
    fail_msg("want one warning about another program's database:\n%s", daemon_log(&d));
  after = slurp(app, &n1);
  assert_non_null(after);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  snprintf(side, sizeof side, "%s-wal", app);
  assert_int_equal(access(side, F_OK), -1);
  snprintf(side, sizeof side, "%s-shm", app);
  assert_int_equal(access(side, F_OK), -1);
  free(before);
  free(after);
}

/* The cache file deleted while the daemon runs: the next put makes a new
 * file at the path (one warning), stats show it, and what was stored after
 * the deletion is there after a restart. */
static void test_file_deleted(void **state) {
  struct daemon d;
  dspk_client *c;
  char db[160], side[200], *json, path[256];
  struct stat st;
  uint64_t entries;
  int there, in_memory;
  (void)state;

  path_in_tmp(db, sizeof db, "deleted.db");
  daemon_start(&d, "d.sock", "deleted.db");
  c = connect_to(&d);
  fir_check(c, 1 << 14, 64, 13);
  assert_true(stat_of(c, "autotune", "entries") >= 1);
  assert_int_equal(unlink(db), 0);
  snprintf(side, sizeof side, "%s-wal", db);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", db);
  unlink(side);
  /* Another shape: tuned and stored (a put). */
  fir_check(c, 1 << 14, 256, 14);
  there = stat(db, &st) == 0;
  json = stats_json(c);
  json_str(json, "path", path, sizeof path);
  in_memory = strstr(json, "\"in_memory\":false") == NULL;
  dspk_free(json);
  entries = stat_of(c, "autotune", "entries");
  dspk_close(c);
  daemon_stop(&d); /* before the checks, so that a failure leaves no daemon */
  assert_true(there);
  assert_string_equal(path, db);
  assert_false(in_memory);
  assert_true(entries >= 1);
  if (count_of(daemon_log(&d), "warn: cache:") != 1 ||
      !strstr(daemon_log(&d), "is no longer there (deleted or moved away, or its directory "
                             "was); made a new one at that path"))
    fail_msg("want one warning about the deleted file:\n%s", daemon_log(&d));

  daemon_start(&d, "d.sock", "deleted.db");
  c = connect_to(&d);
  entries = stat_of(c, "autotune", "entries");
  dspk_close(c);
  daemon_stop(&d);
  assert_true(entries >= 1);
  assert_int_equal(count_of(daemon_log(&d), "warn: cache:"), 0);
}

/* As uid 65534: cache.clear is refused with one clear line, stats works,
 * nothing was cleared. */
static void test_other_uid(void **state) {
  struct daemon d;
  dspk_client *c;
  char out[8192], err[1024];
  int rc;
  (void)state;

  daemon_start(&d, "o.sock", "other.db");
  c = connect_to(&d);
  fft_check(c, 8);
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  /* Let the other user reach the socket. */
  assert_int_equal(chmod(tmpdir, 0711), 0);
  assert_int_equal(chmod(d.sock, 0666), 0);

  rc = run_cli(d.sock, NOBODY, out, sizeof out, err, sizeof err, "cache", "clear",
               (char *)NULL);
  assert_int_equal(rc, 1);
  assert_string_equal(out, "");
  assert_non_null(strstr(err, "EPERM"));
  assert_non_null(strstr(err, "permission denied"));
  {
    int lines = 0;
    for (const char *q = err; *q; q++)
      lines += *q == '\n';
    if (lines != 1)
      fail_msg("want one line on stderr, got: %s", err);
  }
  rc = run_cli(d.sock, NOBODY, out, sizeof out, err, sizeof err, "cache", "clear",
               "--autotune", (char *)NULL);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "EPERM"));
  /* Reading the statistics is not restricted. */
  rc = run_cli(d.sock, NOBODY, out, sizeof out, err, sizeof err, "cache", "stats",
               (char *)NULL);
  if (rc != 0)
    fail_msg("cache stats as nobody: exit %d: %s", rc, err);
  assert_true(stat_of(c, "blobs", "entries") >= 1);
  dspk_close(c);
  daemon_stop(&d);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dspk-cache-e2e-XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  (void)state;
  if (!getenv("DSPK_TEST_KEEP")) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
      return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wisdom_restart),
      cmocka_unit_test(test_progress),
      cmocka_unit_test(test_two_daemons),
      cmocka_unit_test(test_clear_root),
      cmocka_unit_test(test_locations),
      cmocka_unit_test(test_foreign_file),
      cmocka_unit_test(test_file_deleted),
  };
  const struct CMUnitTest other[] = {
      cmocka_unit_test(test_other_uid),
  };
  if (argc < 3) {
    fprintf(stderr, "usage: %s DSPKD DSPK-SUBMIT [other-uid]\n", argv[0]);
    return 2;
  }
  dspkd_path = argv[1];
  submit_path = argv[2];
  signal(SIGPIPE, SIG_IGN);
  if (argc > 3 && strcmp(argv[3], "other-uid") == 0) {
    if (geteuid() != 0) {
      fprintf(stderr, "skipped: switching to uid %d needs root\n", NOBODY);
      return 77;
    }
    return cmocka_run_group_tests_name("cache_e2e.other_uid", other, setup, teardown);
  }
  return cmocka_run_group_tests_name("cache_e2e", tests, setup, teardown);
}
