/* A client's kernel compiled in a child process under limits (kcompile.h). */
#include "backends/common/kcompile.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dspk/errors.h"
#include "proto/utf8.h"

extern char **environ;

/* Writes all of p to fd; 0 or -1. */
static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts `exe --kernel-compile lang` into *s (its stdin a socket, so that
 * a write to a dead child is an error, not SIGPIPE; its stderr /dev/null:
 * a compiler's crash report is not the daemon's log line to write).
 * Returns 0 or a positive errno. */
static int spawn(struct dspk__kcompile_spare *s, const char *exe, const char *lang) {
  char *argv[] = {"dspkd-kernel-compile", "--kernel-compile", (char *)lang, NULL};
  posix_spawn_file_actions_t fa;
  int sv[2], p[2], rc;
  pid_t pid;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return errno;
  if (pipe2(p, O_CLOEXEC) != 0) {
    rc = errno;
    close(sv[0]);
    close(sv[1]);
    return rc;
  }
  /* dup2 onto 0 and 1 clears close-on-exec there.  The child starts with
   * no signal blocked (the runner thread that spawns it blocks the
   * daemon's): a compiler's or driver's own raise() of SIGSEGV or SIGABRT,
   * and RLIMIT_CPU's SIGXCPU, end it as they would any process. */
  posix_spawnattr_t at;
  sigset_t none;
  sigemptyset(&none);
  rc = posix_spawnattr_init(&at);
  if (rc == 0 && ((rc = posix_spawnattr_setsigmask(&at, &none)) != 0 ||
                  (rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK)) != 0))
    posix_spawnattr_destroy(&at);
  if (rc == 0 && (rc = posix_spawn_file_actions_init(&fa)) != 0)
    posix_spawnattr_destroy(&at);
  if (rc == 0) {
    rc = posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
    if (rc == 0)
      rc = posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    if (rc == 0)
      rc = posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    if (rc == 0)
      rc = posix_spawn(&pid, exe, &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
  }
  close(sv[1]);
  close(p[1]);
  if (rc != 0) {
    close(sv[0]);
    close(p[0]);
    return rc;
  }
  s->pid = (int)pid;
  s->in = sv[0];
  s->out = p[0];
  snprintf(s->lang, sizeof s->lang, "%s", lang);
  return 0;
}

void dspk__kcompile_spare_start(struct dspk__kcompile_spare *s, const char *exe,
                                const char *lang) {
  if (s->pid > 0)
    return;
  if (spawn(s, exe, lang) != 0)
    memset(s, 0, sizeof *s);
}

void dspk__kcompile_spare_end(struct dspk__kcompile_spare *s) {
  int st;
  if (!s || s->pid <= 0)
    return;
  close(s->in);
  close(s->out);
  kill((pid_t)s->pid, SIGKILL);
  while (waitpid((pid_t)s->pid, &st, 0) < 0 && errno == EINTR)
    ;
  memset(s, 0, sizeof *s);
}

int dspk__kcompile_run(struct dspk__kcompile_spare *spare, const char *exe, const char *lang,
                       const char *src, size_t len, atomic_int *cancel, void **bin,
                       size_t *binlen, char *log, size_t loglen) {
  struct dspk__kcompile_spare c = {0};
  char *buf = NULL;
  size_t n = 0, cap = 0, sent = 0;
  int st = 0, rc, timed_out = 0, canceled = 0, too_long = 0;
  if (log && loglen)
    log[0] = 0;
  if (spare && spare->pid > 0 && strcmp(spare->lang, lang) == 0) {
    c = *spare;
    memset(spare, 0, sizeof *spare);
  } else {
    dspk__kcompile_spare_end(spare); /* another language's */
    if ((rc = spawn(&c, exe, lang)) != 0) {
      dspk__format(log, loglen, "kernel: cannot start the compiler's process: %s",
                   strerror(rc));
      return rc == ENOMEM ? DSPK_ENOMEM : DSPK_EIO;
    }
  }
  /* The child's set-up (its start, a device opened, a warm-up compile) is
   * not the source's: the deadline starts once it says it is ready. */
  int ready = 0, setup_late = 0;
  int64_t setup_end = now_ms() + (int64_t)DSPK__KCOMPILE_SETUP_S * 1000;
  while (!ready) {
    int64_t left = setup_end - now_ms();
    if (cancel && atomic_load(cancel)) {
      canceled = 1;
      break;
    }
    if (left <= 0) {
      setup_late = 1;
      break;
    }
    struct pollfd pf = {.fd = c.out, .events = POLLIN};
    int pr = poll(&pf, 1, left < 50 ? (int)left : 50);
    if (pr < 0 && errno != EINTR)
      break;
    if (pr <= 0)
      continue;
    char b;
    ssize_t r = read(c.out, &b, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r != 1 || b != 'R')
      break; /* gone before it was ready: its status says why, below */
    ready = 1;
  }
  /* The source goes in as the answer comes out: neither side waits on the
   * other, and a child that takes no input still meets the deadline. */
  fcntl(c.in, F_SETFL, fcntl(c.in, F_GETFL) | O_NONBLOCK);
  int64_t deadline = now_ms() + (int64_t)DSPK__KCOMPILE_TIME_S * 1000;
  for (; ready;) {
    int64_t left = deadline - now_ms();
    if (cancel && atomic_load(cancel)) {
      canceled = 1;
      break;
    }
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pf[2] = {{.fd = c.out, .events = POLLIN}, {.fd = c.in, .events = POLLOUT}};
    /* Wakes at least every 50 ms to see a cancel. */
    int pr = poll(pf, 2, left < 50 ? (int)left : 50); /* fd -1 (source sent): ignored */
    if (pr < 0 && errno != EINTR)
      break;
    if (pr <= 0)
      continue;
    if (c.in >= 0 && (pf[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = sent < len ? send(c.in, src + sent, len - sent, MSG_NOSIGNAL) : 0;
      if (w > 0)
        sent += (size_t)w;
      if (sent == len || (w < 0 && errno != EAGAIN && errno != EINTR)) {
        close(c.in); /* the end of the source (or a child gone) */
        c.in = -1;
      }
    }
    if (!(pf[0].revents & (POLLIN | POLLERR | POLLHUP)))
      continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 65536;
      char *nb = ncap <= DSPK__KCOMPILE_OUT_MAX + 4 ? realloc(buf, ncap) : NULL;
      if (!nb) {
        too_long = 1;
        break;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t r = read(c.out, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  if (c.in >= 0)
    close(c.in);
  close(c.out);
  if (timed_out || canceled || too_long || setup_late || !ready)
    kill((pid_t)c.pid, SIGKILL);
  while (waitpid((pid_t)c.pid, &st, 0) < 0 && errno == EINTR)
    ;
  /* The next compile's child, set up while this device does other work. */
  if (spare && spawn(spare, exe, lang) != 0)
    memset(spare, 0, sizeof *spare);
  rc = 0;
  /* "vkpipe:..." is the trial of a Vulkan pipeline (vk_shader.c), the
   * driver's work; every other language is a compiler's. */
  int trial = strncmp(lang, "vkpipe:", 7) == 0, val = strncmp(lang, "spvval:", 7) == 0;
  const char *doing = trial ? "making the kernel's pipeline"
                      : val ? "validating the SPIR-V module"
                            : "compiling the source";
  if (canceled) {
    rc = DSPK_ECANCELED;
    dspk__format(log, loglen, "the task was canceled");
  } else if (setup_late) {
    rc = DSPK_EIO;
    dspk__format(log, loglen, "kernel: the %s process was not ready within %d s",
                 trial ? "pipeline trial's" : val ? "SPIR-V validator's" : "compiler's",
                 DSPK__KCOMPILE_SETUP_S);
  } else if (timed_out || (WIFSIGNALED(st) && WTERMSIG(st) == SIGXCPU)) {
    rc = DSPK_ELIMIT;
    dspk__format(log, loglen,
                 "kernel: %s took longer than the %d s a client's kernel compile may take",
                 doing, DSPK__KCOMPILE_TIME_S);
  } else if (too_long) {
    rc = DSPK_ELIMIT;
    dspk__format(log, loglen, "kernel: the compiled code is larger than %u MiB",
                 DSPK__KCOMPILE_OUT_MAX >> 20);
  } else if (WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 3)) {
    /* Out of its memory (RLIMIT_DATA): glslang's operator new throws, which
     * ends in abort(); the child's own malloc failures exit with 3; the
     * kernel's OOM killer sends SIGKILL. */
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    rc = sig == 0 || sig == SIGABRT || sig == SIGKILL ? DSPK_ELIMIT : DSPK_ECOMPILE;
    if (rc == DSPK_ELIMIT)
      dspk__format(log, loglen,
                   "kernel: %s needed more than the %d MiB of memory a client's kernel "
                   "compile may use",
                   doing, DSPK__KCOMPILE_MEM_MIB);
    else
      dspk__format(log, loglen, "kernel: the %s failed on this %s (signal %d)",
                   trial ? "driver" : val ? "SPIR-V validator" : "compiler",
                   trial ? "kernel" : val ? "module" : "source", sig);
  } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || n < 4) {
    rc = DSPK_EIO;
    dspk__format(log, loglen, "kernel: the %s process gave no answer",
                 trial ? "pipeline trial's" : val ? "SPIR-V validator's" : "compiler's");
  }
  if (rc) {
    free(buf);
    return rc;
  }
  int32_t code;
  memcpy(&code, buf, 4);
  if (code < 0) {
    size_t m = n - 4 < loglen ? n - 4 : (loglen ? loglen - 1 : 0);
    if (loglen) {
      memcpy(log, buf + 4, m);
      log[m] = 0;
    }
    free(buf);
    return code;
  }
  memmove(buf, buf + 4, n - 4);
  *bin = buf;
  *binlen = n - 4;
  return 0;
}

/* The child's data segment now (VmData: its heap and every private
 * writable mapping, what RLIMIT_DATA bounds), in bytes; 0 when unknown. */
static size_t data_now(void) {
  char line[128];
  unsigned long kib = 0;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmData: %lu kB", &kib) == 1)
      break;
  fclose(f);
  return (size_t)kib << 10;
}

int dspk__kcompile_serve(dspk__kcompile_fn *fn, void *ud, const char *warm) {
  char log[4096] = "";
  char *src = NULL;
  size_t n = 0, cap = 0;
  void *bin = NULL;
  size_t binlen = 0;
  struct rusage ru;
  /* Ends with the daemon's thread that asked. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (warm && fn(ud, warm, strlen(warm), &bin, &binlen, log, sizeof log) == 0) {
    free(bin);
    bin = NULL;
  }
  log[0] = 0;
  /* Set up: the parent's clock for this compile starts now (kcompile.h). */
  if (write_all(1, "R", 1) != 0)
    return 2;
  for (;;) {
    if (n + 1 >= cap) {
      size_t ncap = cap ? 2 * cap : 65536;
      char *nb = realloc(src, ncap);
      if (!nb)
        return 3;
      src = nb;
      cap = ncap;
    }
    ssize_t r = read(0, src + n, cap - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return 2;
    if (r == 0)
      break;
    n += (size_t)r;
  }
  src[n] = 0;
  /* RLIMIT_DATA rather than RLIMIT_AS: a compiler's reserved but unused
   * address space (PROT_NONE arenas, libraries' text) costs nothing. */
  struct rlimit as = {.rlim_cur = data_now() + ((size_t)DSPK__KCOMPILE_MEM_MIB << 20)};
  /* RLIMIT_CPU counts the whole process: the set-up so far, then ours. */
  rlim_t used = getrusage(RUSAGE_SELF, &ru) == 0
                    ? (rlim_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1)
                    : 0;
  struct rlimit cpu = {.rlim_cur = used + DSPK__KCOMPILE_TIME_S + 1,
                       .rlim_max = used + DSPK__KCOMPILE_TIME_S + 2};
  as.rlim_max = as.rlim_cur;
  if (setrlimit(RLIMIT_DATA, &as) != 0 || setrlimit(RLIMIT_CPU, &cpu) != 0)
    return 2;
  int32_t code = fn(ud, src, n, &bin, &binlen, log, sizeof log);
  if (code == DSPK_ENOMEM)
    return 3;
  if (write_all(1, &code, 4) != 0 ||
      (code == 0 ? write_all(1, bin, binlen) : write_all(1, log, strlen(log))) != 0)
    return 2;
  free(bin);
  free(src);
  return 0;
}
