/*
 * Starting and stopping a real dspkd for the client library's end-to-end
 * tests (test_client_lib, test_shared, test_robust): the daemon runs in the
 * foreground and writes READY on --ready-fd when it serves, which the tests
 * wait for (never a sleep), and stops on SIGTERM.
 */
#ifndef DSPK_TESTS_DAEMON_SPAWN_H
#define DSPK_TESTS_DAEMON_SPAWN_H

#include <sys/types.h>

/* Starts the dspkd at exe with --socket sock --foreground --ready-fd and
 * then the options in args (NULL-terminated, at most 40; a NULL among them
 * ends them), and waits for its READY line.  Returns its pid, or -1 when it
 * could not be started or did not become ready (it is then killed and
 * reaped, and stderr says what it wrote instead). */
pid_t daemon_spawn(const char *exe, const char *sock, const char *const *args);

/* Sends pid SIGTERM and reaps it, leaving its wait status in *status.
 * Returns 0, or -1 when waitpid failed. */
int daemon_stop(pid_t pid, int *status);

#endif
