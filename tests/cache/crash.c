/*
 * Crash test of cache/: a child process writes many entries into the cache
 * file and reports each committed count through a pipe; the parent kills it
 * with SIGKILL at a varying point (when the child has reported a target
 * count that changes every round, so the kill lands somewhere inside a
 * later write), then reopens the file and checks that it opens without a
 * warning, passes quick_check, holds every entry the child reported as
 * committed, and that every entry present is intact.  Repeated for several
 * rounds on the same file, so later rounds start from a file that already
 * survived kills.
 *
 * Usage: cache-crash DIR [ROUNDS].  Exits 0 on success; prints the first
 * failure and exits 1 otherwise.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "cache-crash: " __VA_ARGS__);                              \
    fputc('\n', stderr);                                                       \
    exit(1);                                                                   \
  } while (0)

/* Entry i of round r: name and deterministic content of a varying size. */
static size_t entry(int r, int i, char *name, size_t nlen, unsigned char *buf) {
  snprintf(name, nlen, "r%d-e%d", r, i);
  size_t n = 200 + (size_t)((i * 7919 + r * 104729) % 30000);
  uint32_t x = (uint32_t)(r * 1000003 + i * 7 + 1);
  for (size_t j = 0; j < n; j++) {
    x = x * 1664525u + 1013904223u;
    buf[j] = (unsigned char)(x >> 24);
  }
  return n;
}

static void child(const char *path, int r, int out) {
  struct dspk__cache *c = NULL;
  char warn[512];
  static unsigned char buf[40000];
  if (dspk__cache_open(path, NULL, &c, warn, sizeof warn) != 0 || warn[0])
    _exit(2);
  for (int i = 0;; i++) {
    char name[64];
    size_t n = entry(r, i, name, sizeof name, buf);
    if (dspk__cache_blob_put(c, name, buf, n) != 0)
      _exit(3);
    /* Also a decision per entry, so two tables are written. */
    struct dspk__tune_key k = {.dev = {"cpu", "crash", "x86_64", "", ""},
                               .op = "crash", .shape = name, .dtypes = "f32",
                               .layout = "", .cands_hash = 1};
    if (dspk__cache_tune_put(c, &k, name, "{}") != 0)
      _exit(4);
    int32_t done = i + 1;
    if (write(out, &done, sizeof done) != sizeof done)
      _exit(5);
  }
}

int main(int argc, char **argv) {
  if (argc < 2)
    FAIL("usage: cache-crash DIR [ROUNDS]");
  int rounds = argc > 2 ? atoi(argv[2]) : 12;
  char path[4096];
  snprintf(path, sizeof path, "%s/crash.db", argv[1]);
  static unsigned char want[40000];
  for (int r = 0; r < rounds; r++) {
    int p[2];
    if (pipe(p) != 0)
      FAIL("pipe");
    pid_t pid = fork();
    if (pid < 0)
      FAIL("fork");
    if (pid == 0) {
      close(p[0]);
      child(path, r, p[1]);
    }
    close(p[1]);
    /* A target that varies per round; the kill then lands while the child
     * is inside one of its next writes. */
    int target = 1 + (r * 37) % 61;
    int32_t done = 0, v;
    while (done < target) {
      ssize_t got = read(p[0], &v, sizeof v);
      if (got != sizeof v) {
        int st = 0;
        waitpid(pid, &st, 0);
        FAIL("round %d: child stopped early (status %d)", r, st);
      }
      done = v;
    }
    kill(pid, SIGKILL);
    /* Drain reports sent between the read and the kill: they were
     * committed too. */
    while (read(p[0], &v, sizeof v) == sizeof v)
      done = v;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
      FAIL("round %d: child was not killed (status %d)", r, st);

    struct dspk__cache *c = NULL;
    char warn[512];
    struct dspk__cache_opts o = {.no_fallback = 1};
    int rc = dspk__cache_open(path, &o, &c, warn, sizeof warn);
    if (rc != 0)
      FAIL("round %d: reopen failed: %d", r, rc);
    if (warn[0])
      FAIL("round %d: reopen warned: %s", r, warn);
    if (dspk__cache_check(c) != 0)
      FAIL("round %d: quick_check failed", r);
    for (int rr = 0; rr <= r; rr++) {
      for (int i = 0; i < (rr == r ? done + 1 : 64); i++) {
        char name[64];
        size_t n = entry(rr, i, name, sizeof name, want);
        void *got = NULL;
        size_t len = 0;
        rc = dspk__cache_blob_get(c, name, &got, &len);
        if (rc == DSPK_ENOENT) {
          if (rr == r && i < done)
            FAIL("round %d: committed entry %s is missing", r, name);
          continue;
        }
        if (rc != 0)
          FAIL("round %d: get %s: %d", r, name, rc);
        if (len != n || memcmp(got, want, n) != 0)
          FAIL("round %d: entry %s is damaged", r, name);
        free(got);
      }
    }
    dspk__cache_close(c);
  }
  printf("cache-crash: %d rounds ok\n", rounds);
  return 0;
}
