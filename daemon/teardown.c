/*
 * The exit-path guard (daemon/teardown.h).
 *
 * The exit handler runs on whichever thread called exit(), and is safe
 * from any of them.  It asks every runner to stop, takes the clients'
 * queued jobs out of the rings (they stay on their connections' lists, so
 * nothing is lost to the leak checker; the runner still runs the internal
 * frees, which return device memory before the device closes), cancels the
 * task each runner executes (dev->current, under the device's mutex: no
 * walk of the loop's connections), and joins every runner: each closes its
 * own device on its own thread before it exits.  A runner that called
 * exit() itself closes its own device in the handler (the backend call that
 * led there never returns).  Then the backends shut down (shared instances
 * last) and, on the loop thread, the cache closes.  A second exit() while
 * the teardown runs: from a runner, it closes its device and ends its
 * thread (the teardown joins it); from another thread, it waits for the
 * process to end.
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
#include <pthread.h>
#include <stdatomic.h>
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

static _Atomic(struct dspkd *) armed;
static _Atomic(struct dspkd *) tearing; /* the teardown under way, or NULL */
static pthread_t tearing_thread;
static bool registered;
static pthread_t loop_thread;

/* The device whose runner is the calling thread, or NULL. */
static struct device *own_device(struct dspkd *d) {
  for (int i = 0; i < d->ndevs; i++)
    if (d->devs[i].thread_started && pthread_equal(pthread_self(), d->devs[i].thread))
      return &d->devs[i];
  return NULL;
}

/* Closes the calling runner's own device (it cannot join itself): the
 * backend call that ended in exit() never returns, so nothing uses it after. */
static void close_own_device(struct device *dev) {
  if (dev->bdev) {
    dev->be->close(dev->bdev);
    dev->bdev = NULL;
    dspkd_info("%s: device closed", dev->id);
  }
}

static void on_exit_handler(void) {
  struct dspkd *d = atomic_exchange(&armed, NULL);
  struct device *self;
  bool on_loop;
  int closed = 0, canceled = 0;

  if (!d)
    return;
  tearing_thread = pthread_self();
  atomic_store(&tearing, d);
  on_loop = pthread_equal(pthread_self(), loop_thread);
  self = own_device(d);
  dspkd_warn("exit() called during operation (%s): closing the devices before the process "
             "ends", on_loop ? "loop thread" : self ? self->id : "another thread");
  /* Any thread may do this: the queues and the running job of each device
   * are under its mutex, not the loop's. */
  canceled = dspkd_sched_abandon(d, self);
  if (canceled)
    dspkd_info("exit handler: canceled %d running task%s", canceled, canceled == 1 ? "" : "s");
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (!dev->thread_started || dev->joined || dev == self)
      continue;
    pthread_join(dev->thread, NULL);
    dev->joined = true;
    closed++;
  }
  if (self)
    close_own_device(self);
  dspkd_backends_shutdown(d);
  /* Only the loop thread uses the cache: from another thread it stays open
   * (what it committed is on disk already). */
  if (on_loop) {
    dspk__cache_close(d->cache);
    d->cache = NULL;
  }
  dspkd_info("exit handler: %d runner%s joined%s, every device closed", closed,
             closed == 1 ? "" : "s", self ? " and the calling runner's device closed" : "");
}

/* exit() for the whole process: the ordered teardown, then libc's exit()
 * (found with RTLD_NEXT).  Runs the teardown only while it is armed; the
 * first caller does it.  A runner that calls exit() while another thread
 * tears down closes its own device and ends its thread (the teardown joins
 * it); any other thread waits for the process to end. */
__attribute__((visibility("default"))) void exit(int status) {
  void (*libc_exit)(int) __attribute__((noreturn));
  struct dspkd *t;

  if (!atomic_load(&armed) && (t = atomic_load(&tearing)) &&
      !pthread_equal(pthread_self(), tearing_thread)) {
    struct device *self = own_device(t);
    if (self) {
      close_own_device(self);
      pthread_exit(NULL);
    }
    for (;;)
      pause();
  }
  on_exit_handler();
  *(void **)&libc_exit = dlsym(RTLD_NEXT, "exit");
  if (libc_exit)
    libc_exit(status);
  _exit(status);
}

void dspkd_teardown_arm(struct dspkd *d) {
  loop_thread = pthread_self();
  atomic_store(&armed, d);
  if (!registered && atexit(on_exit_handler) == 0)
    registered = true;
}

void dspkd_teardown_disarm(void) { atomic_store(&armed, NULL); }

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

/* Counted whatever the log level: a reload may raise it to debug before
 * the report (one read of /proc/self/task). */
void dspkd_teardown_baseline(void) {
  int r;
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
