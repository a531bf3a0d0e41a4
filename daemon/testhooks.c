/*
 * dspkd's test hooks (daemon/teardown.h): DSPKD_TEST_EXIT makes the daemon
 * take one exit path on purpose, for tests/lifecycle.  Built only with
 * DSPK_TEST_HOOKS (proto/testhook.h; daemon/CMakeLists.txt leaves this file
 * out otherwise), so a production dspkd holds none of it.  DSPKD_TEST_CANCEL_WAIT
 * holds a task's runner until the task is canceled (daemon/sched.h).
 * DSPKD_TEST_START_PAUSE pauses the start at a point, DSPKD_TEST_PEER_STOP
 * stops the daemon before a peer's cgroup is read (daemon/lifecycle.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <signal.h>
#include <stdio.h>

#include "daemon/lifecycle.h"
#include "daemon/log.h"
#include "daemon/sched.h"
#include "daemon/teardown.h"
#include "proto/testhook.h"

static atomic_bool runner_exit; /* DSPKD_TEST_EXIT=runner after SIGHUP */

/* The variable of every test hook in the tree: each DSPK_TEST_HOOK(name),
 * and each DSPK__GPURT_HOOK(drv, name) as DSPK_CUDA_NAME and DSPK_HIP_NAME
 * (tests/lifecycle's hooks group checks the sources against this list). */
static const char *const HOOK_NAMES[] = {
    "DSPKD_TEST_CANCEL_WAIT", "DSPKD_TEST_EXIT", "DSPKD_TEST_SHM_STAGED",
    "DSPKD_TEST_START_PAUSE", "DSPKD_TEST_PEER_STOP", "DSPK_TEST_SHM_FILL_MAP", "DSPK_CUDA_DRIVER",
    "DSPK_HIP_RUNTIME", "DSPK_HIP_BLAS", "DSPK_HIP_FFT", "DSPK_GPURT_FIR_WIDE",
    "DSPK_VK_CONTRACT_RANGE", "DSPK_VK_COOPMAT", "DSPK_VK_COOPMAT_BODY", "DSPK_VK_COOPMAT_TILE", "DSPK_VK_FFT_TUNE",
    "DSPK_CPU_CONTRACT_CANCEL_AFTER", "DSPK_VK_FIR_CANCEL_AFTER", "DSPK_VK_FIR_CHUNK", "DSPK_VK_FIR_FIX_GROUPS",
    "DSPK_VK_FIR_NOFIX", "DSPK_VK_FIR_PIECE",
    "DSPK_VK_FIR_SK", "DSPK_VK_GEMM_CANCEL_AFTER",
    "DSPK_VK_GEMM_NOLIMITS", "DSPK_VK_GEMM_NOSMALL", "DSPK_VK_GEMM_SMALL_PIECE",
    "DSPK_VK_GEMM_NOTUNE", "DSPK_VK_MAX_GROUPS", "DSPK_VK_SPIN_US", "DSPK_VK_TRIAL_FAULT",
    "DSPK_CUDA_STAGE_CHUNKS", "DSPK_CUDA_STAGE_CHUNK_KIB", "DSPK_CUDA_PLAN_CACHE",
    "DSPK_CUDA_RETIRE_CAPACITY", "DSPK_HIP_STAGE_CHUNKS", "DSPK_HIP_STAGE_CHUNK_KIB",
    "DSPK_HIP_PLAN_CACHE", "DSPK_HIP_RETIRE_CAPACITY", "DSPK_CPU_FFTW_TASK_HOLD",
    "DSPK_CPU_FFTW_TASK_GATE", "DSPKD_TEST_MAX_MAP_COUNT", "DSPK_CPU_MEMORY",
    "DSPKD_TEST_MEMFD_ERRNO",
};

void dspkd_test_warn_hooks(void) {
  extern char **environ;
  for (char **e = environ; e && *e; e++)
    for (size_t i = 0; i < sizeof HOOK_NAMES / sizeof HOOK_NAMES[0]; i++) {
      size_t n = strlen(HOOK_NAMES[i]);
      if (strncmp(*e, HOOK_NAMES[i], n) == 0 && (*e)[n] == '=') {
        dspkd_warn("test build: %s is set: a test hook, obeyed by this build only "
                   "(DSPK_TEST_HOOKS; never install it: docs/architecture.md)", *e);
        break;
      }
    }
}

bool dspkd_test_exit_is(const char *what) {
  const char *e = DSPK_TEST_HOOK("DSPKD_TEST_EXIT");
  return e && strcmp(e, what) == 0;
}

static void *exit_thread(void *arg) {
  (void)arg;
  dspkd_warn("test: calling exit(4) from a thread of its own (DSPKD_TEST_EXIT=thread)");
  exit(4);
}

bool dspkd_test_exit_on_hup(struct dspkd *d) {
  if (dspkd_test_exit_is("atexit")) {
    dspkd_warn("test: calling exit(3) from the loop (DSPKD_TEST_EXIT=atexit)");
    exit(3);
  }
  if (dspkd_test_exit_is("thread")) {
    pthread_t t;
    if (pthread_create(&t, NULL, exit_thread, NULL) != 0)
      dspkd_error("test: cannot start the exit thread");
    else
      pthread_detach(t);
    return true;
  }
  if (dspkd_test_exit_is("runner")) {
    dspkd_warn("test: the next task's runner calls exit(5) (DSPKD_TEST_EXIT=runner)");
    atomic_store(&runner_exit, true);
    return true;
  }
  if (dspkd_test_exit_is("fatal")) {
    dspkd_fatal(d, "test: a fatal error in the loop (DSPKD_TEST_EXIT=fatal)");
    return true;
  }
  return false;
}

void dspkd_test_runner_job(struct device *dev) {
  if (atomic_exchange(&runner_exit, false)) {
    dspkd_warn("test: %s: calling exit(5) from the runner (DSPKD_TEST_EXIT=runner)", dev->id);
    exit(5);
  }
}

void dspkd_test_cancel_wait(struct job *j, const char *when) {
  const char *e = DSPK_TEST_HOOK("DSPKD_TEST_CANCEL_WAIT");
  struct timespec ms = {0, 1000000};
  size_t n = strlen(when);
  const char *file = NULL;
  int i = 0;
  if (!e || strncmp(e, when, n) != 0 || (e[n] != '\0' && e[n] != ':'))
    return;
  if (e[n] == ':')
    file = e + n + 1;
  dspkd_warn("test: the runner waits for the task's cancel %s it runs%s%s "
             "(DSPKD_TEST_CANCEL_WAIT=%s)", strcmp(when, "after") ? "before" : "after",
             file ? ", then for the file " : "", file ? file : "", e);
  for (; i < 30000 && !atomic_load(&j->cancel); i++)
    nanosleep(&ms, NULL);
  if (!file)
    return;
  dspkd_warn("test: the runner saw the task's cancel; it waits for the file %s", file);
  for (; i < 30000 && access(file, F_OK) != 0; i++)
    nanosleep(&ms, NULL);
}

static atomic_bool pause_done;

/* A thread like a library's started before main: the stop and reload
 * signals are not blocked in it, so the kernel may hand them to it. */
static void *pause_thread(void *arg) {
  struct timespec ms = {0, 1000000};
  sigset_t set;
  (void)arg;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  while (!atomic_load(&pause_done))
    nanosleep(&ms, NULL);
  return NULL;
}

void dspkd_test_start_pause(const char *point) {
  const char *e = DSPK_TEST_HOOK("DSPKD_TEST_START_PAUSE");
  struct timespec ms = {0, 1000000};
  pthread_t t;
  if (!e || strcmp(e, point) != 0)
    return;
  atomic_store(&pause_done, false);
  if (pthread_create(&t, NULL, pause_thread, NULL) != 0) {
    dspkd_error("test: cannot start the pause thread");
    return;
  }
  dspkd_warn("test: start paused at %s (DSPKD_TEST_START_PAUSE)", point);
  for (int i = 0; i < 30000 && !dspkd_lifecycle_early_seen(); i++)
    nanosleep(&ms, NULL);
  dspkd_warn("test: start resumes at %s (%d signals recorded)", point,
             dspkd_lifecycle_early_seen());
  atomic_store(&pause_done, true);
  pthread_join(t, NULL);
}

void dspkd_test_peer_pause(pid_t pid) {
  const char *want = DSPK_TEST_HOOK("DSPKD_TEST_PEER_STOP");
  char path[64], comm[64] = "";
  FILE *f;
  if (!want || !*want)
    return;
  snprintf(path, sizeof path, "/proc/%ld/comm", (long)pid);
  if (!(f = fopen(path, "re")))
    return;
  if (!fgets(comm, sizeof comm, f))
    comm[0] = '\0';
  fclose(f);
  comm[strcspn(comm, "\n")] = '\0';
  if (strcmp(comm, want) == 0) {
    dspkd_info("test: stopped before the cgroup of pid %ld (%s) is read", (long)pid, comm);
    raise(SIGSTOP);
  }
}
