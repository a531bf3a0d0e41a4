/*
 * The last moments of a connection that the daemon closes after a
 * `protocol.error` (daemon/linger.c): the client gets to read the notice.
 * Loop thread only.
 */
#ifndef DSPKD_LINGER_H
#define DSPKD_LINGER_H

#include <uv.h>

/* At most this many sockets linger at once; beyond, one is closed at once. */
#define DSPKD_LINGER_MAX 64
/* How long one lingers at most, and how many bytes of the client's it reads
 * and drops before it is closed anyway. */
#define DSPKD_LINGER_MS 1000
#define DSPKD_LINGER_BYTES ((size_t)1 << 20)

/* Keeps the socket of fd (a connection about to be closed, its notice
 * written) open apart from the connection: its sending side is shut, and
 * what the client still sends is read and dropped until the client's end of
 * stream or the bounds above.  fd itself is not taken over (a duplicate is),
 * so the caller closes the connection as usual.  Does nothing past
 * DSPKD_LINGER_MAX, after dspkd_linger_stop, or when out of memory or
 * descriptors. */
void dspkd_linger(uv_loop_t *loop, int fd);

/* The stop: every lingering socket is closed now, and no more linger. */
void dspkd_linger_stop(void);

#endif /* DSPKD_LINGER_H */
