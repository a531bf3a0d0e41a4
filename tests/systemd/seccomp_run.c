/* seccomp_run: runs a command under a seccomp filter shaped like the one
 * systemd builds from a unit's SystemCallFilter= allow list,
 * SystemCallErrorNumber=, SystemCallArchitectures=native and
 * RestrictAddressFamilies=AF_UNIX, for tests/systemd/seccomp_unit.py (PID 1
 * is not systemd in CI, so systemd-run is not available).  Raw BPF, no
 * libseccomp.
 *
 *   seccomp_run ACTION NR,NR,... [--af-unix] -- COMMAND ARGS...
 *
 * ACTION is "kill" (SECCOMP_RET_KILL_PROCESS, systemd's default) or an errno
 * number; the listed syscall numbers are allowed, everything else gets
 * ACTION; with --af-unix, socket() for a family other than AF_UNIX fails with
 * EAFNOSUPPORT. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "seccomp_run: unknown architecture"
#endif

#define MAXF 4000

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: seccomp_run ACTION NR,NR,... [--af-unix] -- COMMAND...\n");
    return 2;
  }
  unsigned deny = SECCOMP_RET_KILL_PROCESS;
  if (strcmp(argv[1], "kill") != 0)
    deny = SECCOMP_RET_ERRNO | ((unsigned)atoi(argv[1]) & SECCOMP_RET_DATA);
  int i = 3, afunix = 0;
  if (strcmp(argv[i], "--af-unix") == 0) {
    afunix = 1;
    i++;
  }
  if (strcmp(argv[i], "--") != 0 || i + 1 >= argc) {
    fprintf(stderr, "seccomp_run: expected -- COMMAND\n");
    return 2;
  }
  static struct sock_filter f[MAXF];
  int n = 0;
  f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, deny);
  f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#ifdef __x86_64__
  /* x32 calls are not native */
  f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1);
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, deny);
#endif
  if (afunix) {
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 5);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 1);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  }
  char *list = argv[2];
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    if (n + 3 >= MAXF) {
      fprintf(stderr, "seccomp_run: too many syscalls\n");
      return 2;
    }
    unsigned nr = (unsigned)strtoul(tok, NULL, 10);
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  }
  f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, deny);
  struct sock_fprog prog = {(unsigned short)n, f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    perror("seccomp_run: PR_SET_NO_NEW_PRIVS");
    return 2;
  }
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("seccomp_run: PR_SET_SECCOMP");
    return 2;
  }
  execv(argv[i + 1], argv + i + 1);
  perror("seccomp_run: execv");
  return 127;
}
