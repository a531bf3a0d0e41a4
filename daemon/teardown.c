/*
 * The exit-path guard (daemon/teardown.h).
 *
 * The exit handler runs on whichever thread called exit().  It asks every
 * runner to stop, takes the clients' queued jobs out of the rings (they stay
 * on their connections' lists, so nothing is lost to the leak checker; the
 * runner still runs the internal frees, which return device memory before
 * the device closes), cancels the running tasks when it runs on the loop
 * thread (only that thread may walk the connections), and joins every
 * runner: each closes its own device on its own thread before it exits.
 * Then the backends shut down (shared instances last) and the cache closes.
 * A runner that itself called exit() cannot be joined by itself: that is
 * logged, and its device is left to the driver.
 *
 * An atexit handler alone is not enough: exit() runs handlers last-
 * registered first, and GPU drivers register their own (LLVM's static
 * destructors in lavapipe, for one) when they first compile a pipeline,
 * long after ours.  Those ran while a runner was still compiling, and the
 * process crashed in 8 of 10 runs of scripts/vk-exit-test.sh -m atexit.
 * So dspkd also defines exit() itself: the executable's definition wins
 * over libc's for every caller (it is exported for the libraries dlopen'ed
 * later: see daemon/CMakeLists.txt), closes the devices in order, then
 * hands over to libc's exit(), whose handlers then find no device alive.
 */
#include <dlfcn.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/sched.h"
#include "daemon/teardown.h"

#include "cache/cache.h"

static struct dspkd *armed;
static bool registered;
static pthread_t loop_thread;

bool dspkd_test_exit_is(const char *what) {
  const char *e = getenv("DSPKD_TEST_EXIT");
  return e && strcmp(e, what) == 0;
}

static void on_exit_handler(void) {
  struct dspkd *d = armed;
  bool on_loop;
  int closed = 0;

  if (!d)
    return;
  armed = NULL;
  on_loop = pthread_equal(pthread_self(), loop_thread);
  dspkd_warn("exit() called during operation: closing the devices before the process "
             "ends");
  dspkd_sched_abandon(d, on_loop);
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (!dev->thread_started || dev->joined)
      continue;
    if (pthread_equal(pthread_self(), dev->thread)) {
      dspkd_error("%s: exit() was called on its own runner thread; its device cannot "
                  "be closed in order", dev->id);
      continue;
    }
    pthread_join(dev->thread, NULL);
    dev->joined = true;
    closed++;
  }
  dspkd_backends_shutdown(d);
  dspk__cache_close(d->cache);
  d->cache = NULL;
  dspkd_info("exit handler: %d runner%s joined, every device closed", closed,
             closed == 1 ? "" : "s");
}

/* exit() for the whole process: the ordered teardown, then libc's exit()
 * (found with RTLD_NEXT).  Runs the teardown only while it is armed. */
__attribute__((visibility("default"))) void exit(int status) {
  void (*libc_exit)(int) __attribute__((noreturn));

  on_exit_handler();
  *(void **)&libc_exit = dlsym(RTLD_NEXT, "exit");
  if (libc_exit)
    libc_exit(status);
  _exit(status);
}

void dspkd_teardown_arm(struct dspkd *d) {
  loop_thread = pthread_self();
  armed = d;
  if (!registered && atexit(on_exit_handler) == 0)
    registered = true;
}

void dspkd_teardown_disarm(void) { armed = NULL; }

void dspkd_fatal(struct dspkd *d, const char *fmt, ...) {
  char msg[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dspkd_error("fatal: %s; stopping now", msg);
  d->exit_code = 1;
  dspkd_stop(d);
  dspkd_stop_now(d);
}

/* Counts the process's threads and those named as runners; writes the
 * names of the threads other than the main one into names (may be NULL). */
static int count_threads(int *runners, char *names, size_t len) {
  DIR *dir = opendir("/proc/self/task");
  struct dirent *e;
  size_t used = 0;
  int n = 0;

  *runners = 0;
  if (names && len)
    names[0] = '\0';
  if (!dir)
    return -1;
  while ((e = readdir(dir))) {
    char path[64], comm[32] = "";
    FILE *f;
    if (e->d_name[0] == '.')
      continue;
    n++;
    snprintf(path, sizeof path, "/proc/self/task/%.20s/comm", e->d_name);
    if ((f = fopen(path, "re"))) {
      if (fgets(comm, sizeof comm, f)) {
        comm[strcspn(comm, "\n")] = '\0';
        if (strncmp(comm, "dspk-run:", 9) == 0)
          (*runners)++;
      }
      fclose(f);
    }
    if (names && strtol(e->d_name, NULL, 10) != (long)getpid() && used + 1 < len) {
      int w = snprintf(names + used, len - used, "%s%s", used ? "," : "", comm);
      if (w > 0)
        used = used + (size_t)w < len ? used + (size_t)w : len - 1;
    }
  }
  closedir(dir);
  return n;
}

static int threads_at_start = -1;

void dspkd_teardown_baseline(void) {
  int r;
  if (dspkd_log_enabled(DSPKD_DEBUG))
    threads_at_start = count_threads(&r, NULL, 0);
}

void dspkd_teardown_report(void) {
  char names[256];
  int n, runners;

  if (!dspkd_log_enabled(DSPKD_DEBUG))
    return;
  n = count_threads(&runners, names, sizeof names);
  /* Libraries keep threads of their own (OpenBLAS starts its pool when it
   * is loaded, the CUDA driver keeps helpers until the process ends): only
   * runners must be gone. */
  dspkd_debug("threads at exit: %d (before the devices opened: %d), runners: %d; "
              "others: %s", n, threads_at_start, runners, names[0] ? names : "none");
}
