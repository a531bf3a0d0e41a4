/*
 * Starting and stopping a real dspkd for the client library's end-to-end
 * tests: see daemon_spawn.h.
 */
#include "daemon_spawn.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t daemon_spawn(const char *exe, const char *sock, const char *const *args) {
  const char *argv[48];
  char fdarg[16], buf[16];
  size_t got = 0;
  ssize_t n;
  int a = 0, p[2];
  pid_t pid;

  if (pipe(p) != 0)
    return -1;
  pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    close(p[0]);
    snprintf(fdarg, sizeof fdarg, "%d", p[1]);
    for (const char *const *x = (const char *const[]){exe, "--socket", sock, "--foreground",
             "--ready-fd", fdarg, NULL}; *x; x++)
      argv[a++] = *x;
    while (*args && a < 46)
      argv[a++] = *args++;
    argv[a] = NULL;
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  while (got < sizeof buf - 1 && (n = read(p[0], buf + got, sizeof buf - 1 - got)) > 0)
    got += (size_t)n;
  close(p[0]);
  buf[got] = '\0';
  if (strcmp(buf, "READY\n") != 0) {
    fprintf(stderr, "dspkd did not become ready (got \"%s\")\n", buf);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

int daemon_stop(pid_t pid, int *status) {
  kill(pid, SIGTERM);
  return waitpid(pid, status, 0) == pid ? 0 : -1;
}
