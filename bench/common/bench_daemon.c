/*
 * Starting and stopping the dspkd a benchmark measures (bench_daemon.h).
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bench_daemon.h"

pid_t dspk_bench_start_daemon(const char *prog, const char *dspkd,
                              const char *sock, const char *cache) {
  int fds[2];
  if (pipe(fds) != 0) {
    perror(prog);
    exit(1);
  }
  pid_t pid = fork();
  if (pid == 0) {
    char fdarg[16];
    close(fds[0]);
    snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
    execl(dspkd, dspkd, "--socket", sock, "--backends", "cpu", "--cache",
          cache, "--foreground", "--log-level", "warn", "--ready-fd", fdarg,
          (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[16];
  ssize_t n = pid > 0 ? read(fds[0], buf, sizeof buf) : -1; /* READY, or EOF */
  close(fds[0]);
  if (n <= 0) {
    fprintf(stderr, "%s: dspkd did not start\n", prog);
    exit(1);
  }
  return pid;
}

int dspk_bench_stop_daemon(pid_t pid) {
  int st;
  kill(pid, SIGTERM);
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
    return -1;
  return WEXITSTATUS(st);
}

/* See bench_daemon.h. */
void dspk_bench_wait_fftw(pid_t pid) {
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
  for (int i = 0; i < 3000; i++) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int busy = 0;
    while (d && (e = readdir(d)) != NULL) {
      char path[384], comm[32] = "";
      snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
      FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
      if (f) {
        busy |= fgets(comm, sizeof comm, f) && strncmp(comm, "dspk-fftw-plan", 14) == 0;
        fclose(f);
      }
    }
    if (d)
      closedir(d);
    if (!busy)
      return;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}
