/*
 * libdspkclient: the C client library of dspkd, the dspk compute daemon.
 *
 * This is the library's one public header.  It speaks the msgpack-RPC
 * protocol of docs/protocol.md over the daemon's Unix socket with blocking
 * I/O: synchronous calls (dspk_run, dspk_ping, ...) and, for several
 * requests in flight on one connection, dspk_submit / dspk_wait.
 *
 * Conventions:
 *  - Every function that can fail returns 0 or a negative code of
 *    include/dspk/errors.h (DSPK_EINVAL, ...); dspk_strerror() and
 *    dspk_err_name() describe a code, dspk_last_error() gives the detail of
 *    the last failure on a connection (the daemon's message, which names the
 *    operand and axis at fault).
 *  - A NULL client, or NULL for a pointer a call needs (an output
 *    parameter, data of n > 0 bytes), is DSPK_EINVAL before anything is
 *    sent; with a client, dspk_last_error() then names the parameter.
 *  - Output parameters are written only on success.  Memory the library
 *    returns (result tensors, lists, JSON text) belongs to the caller and is
 *    freed with the matching dspk_*_free() function or dspk_free().
 *    Destructors accept NULL.
 *  - Thread safety: a dspk_client is not internally locked.  Use each client
 *    from one thread at a time (or serialize calls on it yourself); distinct
 *    clients are fully independent and may be used concurrently.  The
 *    functions that take no client (dspk_strerror, ...) are thread-safe.
 *    Calls made from the progress callback (dspk_set_progress) run on the
 *    thread of the call that invoked it, so they count as that thread's:
 *    they are allowed on any client, c itself included (see there).
 *  - fork(): a client belongs to the process that connected it.  In a child
 *    of fork() every call of an inherited client that would use its
 *    connection or its shared memory (dspk_ping, dspk_submit, dspk_run,
 *    dspk_wait, dspk_wait_any, dspk_cancel, the buffer and shared memory
 *    calls, dspk_result_to_file, dspk_file_data, ...) fails with
 *    DSPK_ECLOSED and a message naming fork, without reading or writing its
 *    socket or its shared memory (the parent's answers stay the parent's);
 *    connect anew in the child.  (The setters and getters, dspk_set_timeout,
 *    dspk_last_error, ..., only touch the child's copy of c.)  dspk_close
 *    there frees the child's memory and closes its copy of the descriptor
 *    only: it sends nothing and does not shut the connection down, which
 *    the parent goes on using.
 *  - Waiting: a call waits for the daemon (for room to send a request, for
 *    its answer) as long as the daemon takes, unless a timeout is set
 *    (dspk_set_timeout, dspk_connect_timeout): then DSPK_ETIMEDOUT.  A
 *    signal does not end a wait: a handler's EINTR is retried (with or
 *    without SA_RESTART); bound waits with the timeout instead.
 *  - The library never prints, never exits and installs no signal handlers;
 *    it sends with MSG_NOSIGNAL, so a daemon that goes away gives
 *    DSPK_ECLOSED rather than SIGPIPE (whether the stream ended or was
 *    reset), and it grows files on the caller's behalf (its shared memory,
 *    a dspk_result_to_file file) with SIGXFSZ blocked in the calling
 *    thread, so a file size limit (RLIMIT_FSIZE, ulimit -f) makes that
 *    growth fail as each call below says rather than kill the process (a
 *    SIGXFSZ it raised is taken back, one pending before is left); where the daemon sent a protocol.error before closing, the
 *    call gives that error's code and message instead ("daemon closed the
 *    connection: " and the daemon's reason), also when it failed while
 *    sending; every later call on that client fails with the same code and
 *    "connection is no longer usable: " and the first reason.
 */
#ifndef DSPK_DSPK_H
#define DSPK_DSPK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dspk/errors.h"
#include "dspk/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DSPK_EXPORT __attribute__((visibility("default")))
#else
#define DSPK_EXPORT
#endif

/* Version of this library ("0.1.0"). */
DSPK_EXPORT const char *dspk_version(void);

/* ---- errors -------------------------------------------------------------- */

/* One-line description of a code ("shape mismatch"); "unknown error" for a
 * value not in the table, "success" for 0.  Static storage. */
DSPK_EXPORT const char *dspk_strerror(int code);
/* Symbolic name of a code ("ESHAPE"); "EUNKNOWN" for a value not in the
 * table, "OK" for 0.  Static storage. */
DSPK_EXPORT const char *dspk_err_name(int code);

/* ---- connection ---------------------------------------------------------- */

typedef struct dspk_client dspk_client;

/*
 * Writes the default socket path into buf: $DSPK_SOCKET if set and
 * non-empty; else, for root or inside a Slurm job ($SLURM_JOB_ID set and
 * non-empty: the node's daemon, docs/cluster.md), /run/dspk/dspkd.sock;
 * else $XDG_RUNTIME_DIR/dspk/dspkd.sock when it is an absolute path (a
 * relative or empty one is ignored, as the XDG Base Directory specification
 * asks); else /run/dspk/dspkd.sock.
 * Returns 0, DSPK_ELIMIT when buf is too small (buf NULL with buflen 0
 * included), DSPK_EINVAL for buf NULL with buflen > 0.
 */
DSPK_EXPORT int dspk_default_socket(char *buf, size_t buflen);

/*
 * Connects to the daemon at socket_path (NULL: dspk_default_socket(); a
 * leading '@' names the abstract socket of that name, as systemd's
 * ListenStream=@name: docs/protocol.md "Connecting") and
 * says hello with client_name (NULL: "libdspkclient"; at most 63 bytes,
 * a longer one is DSPK_ELIMIT; each byte of it that starts no well-formed
 * UTF-8 character is sent as U+FFFD, the name then cut at a character
 * boundary to 63 bytes) and the Slurm job this process runs in
 * ($DSPK_JOB when set and not empty, else $SLURM_JOB_ID, when a decimal
 * number from 1 to 2^64-1 without leading zeros; docs/cluster.md).  On
 * success *out is a new client, freed with dspk_close().  Returns
 * DSPK_EINVAL when out is NULL or $DSPK_JOB is set, not empty and no such
 * number (dspk_connect_error() names it and its value; $SLURM_JOB_ID is
 * not taken instead, while a $SLURM_JOB_ID that is none names no job),
 * DSPK_EINVAL for an empty socket_path or a lone "@", DSPK_ELIMIT for a
 * socket_path longer than 107 bytes, DSPK_ECONNECT when nothing
 * listens there (when the path is there but is no socket,
 * dspk_connect_error() says what it is, as dspk-submit does: "connect to
 * /tmp/x: /tmp/x is a regular file, not a socket"; a directory, a FIFO, a
 * character or block device likewise; a path in a message is shown with
 * a control character or a backslash in it escaped), DSPK_EVERSION when
 * the daemon speaks another protocol version, the code of the daemon's refusal (DSPK_ELIMIT for max_clients
 * and max_user_clients, DSPK_EPERM for allow_users and allow_groups: its
 * protocol.error, whose message dspk_connect_error() gives after "hello: "),
 * or another negative code.  hello is the one request sent before the
 * daemon's max_message is known: it must fit in it (about 30 bytes and the
 * client name, the job's number too), which a daemon run with a
 * max_message below 100 bytes (dspkd takes 64 and up) may refuse for a
 * long name: DSPK_ELIMIT then, with the daemon's protocol.error in
 * dspk_connect_error() ("hello: daemon closed the connection: str/bin of
 * 63 bytes at offset 27 makes the message at least 92 bytes, more than 64
 * (max_message)" for a 63-byte name and no job).  The reason of a failure cannot be read
 * with dspk_last_error() (there is no client); dspk_connect_error() gives it.
 */
DSPK_EXPORT int dspk_connect(const char *socket_path, const char *client_name,
                             dspk_client **out);
/* dspk_connect bounded by timeout_ms (> 0; 0 or less: no limit, which is
 * dspk_connect): connecting (a daemon whose listen backlog is full) and its
 * hello each wait at most timeout_ms, else DSPK_ETIMEDOUT with nothing
 * left behind (dspk_connect_error() says which).  The new client's timeout
 * (dspk_set_timeout) is timeout_ms. */
DSPK_EXPORT int dspk_connect_timeout(const char *socket_path, const char *client_name,
                                     int timeout_ms, dspk_client **out);
/* The detail of this thread's last dspk_connect(): why it failed, "" when
 * it succeeded. */
DSPK_EXPORT const char *dspk_connect_error(void);

/* Closes the connection and frees c.  Requests still in flight are dropped
 * (the daemon cancels them and frees the connection's buffers).  Accepts
 * NULL.  From c's own progress callback (dspk_set_progress) it cannot free
 * c, which the call that invoked the callback still uses: it ends the
 * connection at once (that call, and every later one on c, fails with
 * DSPK_ECLOSED: the first of them to fail, the callback's own call after
 * the close or else the call that invoked it, with "closed by dspk_close
 * from the progress callback", the others with "connection is no longer
 * usable: " before it, as after any connection that broke); call
 * dspk_close(c) again once that call has returned, to free c.  In a child
 * of fork() it only frees the child's copy (see fork() above). */
DSPK_EXPORT void dspk_close(dspk_client *c);

/* The message of the last failed call on c (the daemon's message for an
 * error response, or the library's reason: never "" after a call on c
 * failed, at worst the code's dspk_strerror()); "" when none failed yet.  Read
 * it right after the call that failed: a later call that succeeds may clear
 * it or leave it; the next call that fails replaces it. */
DSPK_EXPORT const char *dspk_last_error(const dspk_client *c);

/*
 * Bounds every wait of the calls on c to ms milliseconds (0, the default:
 * no limit).  Each wait for the daemon -- for room to send one request
 * (a daemon that reads no more), for one answer -- that takes longer ends
 * the call with DSPK_ETIMEDOUT and a dspk_last_error() saying what timed
 * out.  A call that waits more than once (dspk_run: to send, then for the
 * answer; dspk_buffer_write/read in pieces; dspk_shared_from_file) bounds
 * each wait, so it may take a multiple of ms in all; time spent in the
 * progress callback counts towards the wait that called it.  After a
 * timeout:
 *  - a request of which nothing was sent was never sent; the connection
 *    stays usable;
 *  - a request of which a part was sent leaves the stream inside a message:
 *    the connection is unusable (that call and every later one on c fail
 *    with DSPK_ETIMEDOUT, the later ones saying "connection is no longer
 *    usable: " and why);
 *  - a request sent whole whose answer is late (dspk_wait, dspk_run and
 *    every synchronous call alike) is given up on: its ticket is consumed
 *    (dspk_wait of it again is DSPK_ENOENT), its answer is dropped when it
 *    comes, read by a later call, and the connection stays usable.  The
 *    daemon still runs the work (dspk_cancel it before, if it must stop).
 *    A buffer the late answer makes (dspk_buffer_create,
 *    dspk_shared_alloc, dspk_shared_from_file, a temporary) is freed then,
 *    and a task's shared temporaries are reused only after its answer,
 *    and dspk_buffer_read/write of a shared allocation go to the daemon
 *    behind it (no local copy) until then (dspk_shared_alloc);
 *  - dspk_wait_any that times out gives up on no request (all stay in
 *    flight).
 * dspk_shared_free that times out has unmapped the memory all the same.
 * 0, or DSPK_EINVAL for a NULL c or a negative ms. */
DSPK_EXPORT int dspk_set_timeout(dspk_client *c, int ms);

/* The daemon's version string from hello ("0.1.0"); owned by c. */
DSPK_EXPORT const char *dspk_daemon_version(const dspk_client *c);

/* The daemon's max_message from hello, whatever its size (bytes in one
 * message; a request larger than it fails with DSPK_ELIMIT before anything
 * is sent), so that a caller can pass big operands through buffers in time;
 * 0 for NULL.  A hello whose max_message is 0 is DSPK_EPROTO at connect. */
DSPK_EXPORT size_t dspk_max_message(const dspk_client *c);

/* The connected socket's file descriptor (for poll(); do not read from or
 * write to it, do not close it). */
DSPK_EXPORT int dspk_fd(const dspk_client *c);

/* Frees memory returned by the library (JSON text). Accepts NULL. */
DSPK_EXPORT void dspk_free(void *p);

/* ---- simple methods ------------------------------------------------------ */

/* One `ping` round trip carrying n bytes of payload (may be 0, data may be
 * NULL then); checks that the echo is identical (DSPK_EPROTO if not).
 * Any request bigger than the daemon's max_message (from hello) fails with
 * DSPK_ELIMIT before anything is sent; a payload of dspk_ping_max(c) bytes
 * or less never does. */
DSPK_EXPORT int dspk_ping(dspk_client *c, const void *data, size_t n);
/* The largest payload of a dspk_ping that fits the daemon's max_message
 * whatever the call: max_message less the request's framing (21 to 24
 * bytes, as the payload's size needs; counted for the largest request id,
 * so that one of the first calls, whose id is shorter, may fit up to 4
 * bytes more).  0 for NULL. */
DSPK_EXPORT size_t dspk_ping_max(const dspk_client *c);

/*
 * Calls `method` with no arguments and returns its result as JSON text in
 * *json_out (NUL-terminated, free with dspk_free()).  bin values become
 * base64 strings.  Useful for `status` and for scripting.  In the JSON text
 * of this and every other call, strings escape control characters (C0,
 * DEL and C1: U+0000..U+001F, U+007F..U+009F; TAB, LF and CR too, never
 * as \t \n \r) as \u00NN and a byte that
 * starts no well-formed UTF-8 character as \ufffd: the text is valid JSON
 * and carries no terminal control sequence.  A float is written in the
 * fewest significant digits that read back as the same value (a msgpack
 * float32 as a float32), ".0" after an integral one, by protocol.md's rule
 * (Malformed input): 0.1, 5.0, 1e-05; a NaN or an infinity as null.
 */
DSPK_EXPORT int dspk_call_json(dspk_client *c, const char *method,
                               char **json_out);

/*
 * Slurm jobs (admin; docs/cluster.md): the prolog of a job registers it with
 * the node's daemon, the epilog ends it.  dspk_job_register gives the job's
 * uid and the UUIDs of the GPUs Slurm allocated to it on this node (n may be
 * 0: the cpu only); its clients then see and use those devices and the cpu.
 * dspk_job_end closes the job's connections (their work canceled, their
 * buffers freed) and returns once they are gone.  Both return the daemon's
 * answer as JSON in *json_out (free with dspk_free()); DSPK_EPERM for a
 * caller that is not an admin of the daemon.  n is at most 64 (more is
 * DSPK_ELIMIT, "dspk_job_register: n 65 is more than 64 UUIDs, the most a
 * job registers", before anything is sent), each UUID as
 * protocol.md's job.register takes it (an optional GPU- prefix, then hex
 * digits and dashes, 1 to 39 digits: the daemon's DSPK_EINVAL otherwise).
 */
DSPK_EXPORT int dspk_job_register(dspk_client *c, uint64_t job, uint32_t uid,
                                  const char *const *uuids, size_t n, char **json_out);
DSPK_EXPORT int dspk_job_end(dspk_client *c, uint64_t job, char **json_out);

typedef struct dspk_device {
  char id[32];       /* "cpu:0", "cuda:1": what task.device takes */
  char backend[16];  /* "cpu", "cuda", "vulkan" */
  char name[128];
  char type[16];     /* "cpu", "gpu", ... */
  char arch[64];
  char driver[64];
  char uuid[64];
  uint64_t memory;   /* bytes */
  /* max_tensor_bytes, the largest operand or result a task on the device can
     bind (protocol.md), is in the list's json */
  bool software;     /* a software renderer of a GPU API (lavapipe), which
                        "any" avoids; false for the cpu backend (type "cpu") */
} dspk_device;

typedef struct dspk_unavailable {
  char backend[16];
  char reason[256];
} dspk_unavailable;

typedef struct dspk_device_list {
  size_t ndevices;
  dspk_device *devices;
  size_t nunavailable;         /* filled only when asked with all */
  dspk_unavailable *unavailable;
  char *json;                  /* the whole result as JSON text */
} dspk_device_list;

/* The daemon's devices (`devices` method); with all, also the backends that
 * are not available and why.  *out is freed with dspk_device_list_free(). */
DSPK_EXPORT int dspk_devices(dspk_client *c, bool all, dspk_device_list **out);
DSPK_EXPORT void dspk_device_list_free(dspk_device_list *l);

typedef struct dspk_status_client {
  uint64_t id;
  int64_t pid;
  int64_t uid, gid;
  /* The client's hello name as the daemon shows it (protocol.md, "Errors":
   * a backslash as \\, a character that prints as nothing as \uNNNN...).
   * That form may pass 63 bytes (a 63-byte name of zero-width spaces is
   * 126): it is then cut after a whole character or escape, at most 59
   * bytes, and ends in the mark \... (a lone backslash, which no whole
   * name shows), so a cut name never looks like another whole one.  The
   * whole form is in dspk_status's json. */
  char name[64];
  uint64_t inflight, buffers;
} dspk_status_client;

typedef struct dspk_status_device {
  char id[32];
  uint64_t queued, running, completed, failed;
} dspk_status_device;

/* What a device is doing (status's busy, clients, memory, running_op and
 * pool statistics), for live views such as dspk-submit top. */
typedef struct dspk_device_activity {
  double busy;               /* fraction of the last 4 to 5 s spent running jobs */
  uint64_t clients;          /* connections with jobs queued or running on it */
  uint64_t memory;           /* the device's memory, bytes (0: unknown) */
  uint64_t memory_in_use;    /* bytes the daemon's pool has handed out */
  uint64_t memory_cached;    /* bytes the pool keeps for reuse */
  bool running;              /* a job runs now: */
  char running_op[32];       /*   its op ("gemm") or method ("buffer.write") */
  double running_age_s;      /*   for how long */
} dspk_device_activity;

/* A Slurm job registered on the node, as status' jobs shows it to the
 * caller (its own uid's; an admin every one). */
typedef struct dspk_status_job {
  uint64_t job;
  int64_t uid;
  size_t ngpus;        /* the UUIDs it was registered with (in the json) */
  uint64_t connections, inflight, buffers, buffer_bytes;
  bool ended;          /* job.end ran; waiting for its last connection */
} dspk_status_job;

typedef struct dspk_status {
  char version[32];    /* daemon version */
  int64_t pid;
  double uptime_s;
  char socket[256];
  size_t nclients;
  dspk_status_client *clients;
  size_t ndevices;
  dspk_status_device *devices;
  char *json;          /* the whole result as JSON text (incl. stats) */
  uint64_t connections;           /* connections open now */
  dspk_device_activity *activity; /* [ndevices], parallel to devices */
  /* Slurm jobs (after the fields above, so that a program built against
   * an older header reads the rest as before): */
  uint64_t *client_job;  /* [nclients], parallel to clients: the client's
                          * Slurm job, 0 for none (or not decided yet) */
  int64_t self;          /* the index in clients of the connection that
                          * asked, -1 when not listed */
  size_t njobs;
  dspk_status_job *jobs; /* by increasing job id */
} dspk_status;

/* The `status` method.  *out is freed with dspk_status_free(). */
DSPK_EXPORT int dspk_status_get(dspk_client *c, dspk_status **out);
DSPK_EXPORT void dspk_status_free(dspk_status *s);

/* ---- metrics and traces -------------------------------------------------- */

/* The `metrics` method: the daemon's counters as Prometheus text
 * (exposition format 0.0.4) in *text_out (free with dspk_free()). */
DSPK_EXPORT int dspk_metrics(dspk_client *c, char **text_out);

/* The `trace` method: records the jobs of the devices `status` shows the
 * caller for `seconds` (0 < seconds <= 600; the call blocks that long;
 * another, NaN too, is DSPK_EINVAL before anything is sent: "dspk_trace:
 * seconds 600.5 is not in (0, 600]", the value written as every message
 * writes a float, docs/protocol.md "Malformed input": 0 as 0.0);
 * another user's jobs, unless the caller is an admin, only as anonymous
 * slices named "other" (docs/protocol.md, trace).  Returns it as Chrome
 * trace-event JSON in *json_out (free with dspk_free()), which Perfetto and
 * chrome://tracing open: {"traceEvents": [...], "displayTimeUnit": "ms",
 * "otherData": {...}}.  One process (pid) per device; on thread 1 each job
 * is an "X" event (category "task", "buffer", or "other" for another
 * user's anonymous job) with its phases nested in
 * it (category "phase": upload, compute, tuning inside compute, download);
 * the time each job waited in the queue is an "X" event of category
 * "queue" on a thread of its client.  Timestamps are microseconds from the
 * start of the recording, or from the earliest time a job shown was queued
 * when that came first (a job queued before the recording began); otherData
 * holds start_us and end_us (the recording's span on that scale), dropped
 * and jobs.  DSPK_EBUSY at once when too many traces record already (a
 * user who is not an admin: 2 of its own, 8 of such users together; admins
 * 8 of their own: docs/protocol.md, trace). */
DSPK_EXPORT int dspk_trace(dspk_client *c, double seconds, char **json_out);

/* ---- daemon-side buffers ------------------------------------------------- */

/* Buffers belong to the connection and are freed when it closes.  device
 * NULL: "cpu:0"; size may be 0 (an empty buffer). */
DSPK_EXPORT int dspk_buffer_create(dspk_client *c, const char *device,
                                   size_t size, uint64_t *id_out);
/* Writes n bytes at offset.  data is sent in place (not copied), in pieces
 * of at most 4 MiB and of max_message - 64 bytes (dspk_max_message: 64 are
 * room for the request's framing; DSPK_ELIMIT, nothing sent, when
 * max_message is 64 or less and n is not 0) with up to 8 in flight,
 * so the daemon stores one while the next arrives; on a failure (the first
 * failing piece's code; its message names the call's range and the piece's)
 * other pieces may have been written.  A range that runs past byte offset
 * 2^64 - 1 is DSPK_ERANGE with nothing sent (the same for dspk_buffer_read).
 * Data that lies
 * in the shared allocation of id itself (dspk_shared_alloc) and takes more
 * than one piece is copied first, so that a piece stored cannot change the
 * bytes of one still to be sent. */
DSPK_EXPORT int dspk_buffer_write(dspk_client *c, uint64_t id,
                                  uint64_t offset, const void *data, size_t n);
/* Reads exactly n bytes at offset into dst (DSPK_EPROTO if the daemon sends
 * another amount), in pipelined pieces as dspk_buffer_write (of at most
 * max_message - 64 bytes, what a buffer.read answer may carry, protocol.md;
 * the same DSPK_ELIMIT at a max_message of 64); each answer's
 * data is read from the socket straight into dst (into memory of its own
 * first, when dst lies in the shared allocation of id itself and the read
 * takes more than one piece). */
DSPK_EXPORT int dspk_buffer_read(dspk_client *c, uint64_t id, uint64_t offset,
                                 void *dst, size_t n);
/* Frees buffer id (DSPK_ENOBUF when c has none such).  The id of a shared
 * allocation or temporary may be given too: see dspk_shared_alloc for what
 * stays of the allocation. */
DSPK_EXPORT int dspk_buffer_free(dspk_client *c, uint64_t id);

/* ---- shared memory ------------------------------------------------------- */

/*
 * Memory shared with the daemon (docs/protocol.md, "Shared memory"): a
 * memfd sealed against shrinking and growing, mapped here and imported by
 * the daemon as a buffer (buffer.import).  *ptr_out is the caller's mapping
 * (page-aligned, bytes long, zero-filled), *id_out its buffer id on device
 * (NULL: "cpu:0"; on the cpu the daemon's ops read and write these very
 * pages).  Fill it and pass it to tasks with no copy at all: an inline
 * dspk_tensor whose data lies inside a shared allocation of the same client
 * is sent as a reference to it (whatever its size; not in a kernel task,
 * whose inline inputs go inline), and a result written with out_refs to
 * {id_out, offset} lands in it.  A task on "any" runs on the device of
 * its first such operand (and its temporaries, dspk_set_shared_threshold,
 * are made there); a task on "any" with a buffer reference (is_ref, or
 * out_refs) runs on that buffer's device, and its temporaries are made
 * there (for a buffer of another client's making, whose device c does
 * not know, its operands and result go inline).  Where no reference can stand for the operand (the task
 * runs on another device than the allocation's, or the operand starts
 * between two items) its bytes are sent as any other operand's: the task
 * works, with a copy.  dspk_buffer_read/write
 * of the id work too: while the daemon works on no request of c they are a
 * memmove in this process (the daemon holds the same pages; data or dst may
 * lie in them; a write whose data lies in a dspk_file_data range goes to
 * the daemon instead, sent from the file), else they go to the daemon in order behind the requests
 * in flight, a request given up on after a timeout (dspk_set_timeout)
 * counting as in flight until its late answer is read; either way as if
 * the bytes were all read before any is written.  Writing the memory
 * while a task uses it gives that task undefined results (never a crash).
 * dspk_buffer_free of the id
 * frees the daemon's buffer only: the mapping stays until dspk_shared_free
 * (which then answers DSPK_ENOBUF), an inline tensor in it is sent as
 * bytes, and dspk_buffer_read/write of the id are DSPK_ENOBUF.  Freed by dspk_shared_free() or
 * dspk_close().  The daemon answers the import before any page is made, so
 * a size beyond its device's memory or the user's quota is DSPK_ENOMEM or
 * DSPK_ELIMIT without committing memory here; the memory is a file (a
 * memfd), so a size beyond this process's file size limit (RLIMIT_FSIZE)
 * is DSPK_ELIMIT too, with a dspk_last_error() that names it, and so is no
 * descriptor left for the memfd (EMFILE: "... (this process's open file
 * limit, RLIMIT_NOFILE)", ENFILE: the system's).  Where this process can
 * have no memfd it is DSPK_ENOTSUP ("shared memory is unavailable on this
 * system (memfd_create: Function not implemented)": a kernel without
 * memfd_create or sealing, ENOSYS, EINVAL, EOPNOTSUPP) or DSPK_EPERM
 * ("shared memory is unavailable to this process (memfd_create:
 * Operation not permitted; ...)": a seccomp filter or security policy
 * that forbids it, EPERM, EACCES), never DSPK_ENOMEM.  bytes above
 * 2^63-1 (a file's largest size) are DSPK_EINVAL ("dspk_shared_alloc:
 * bytes N passes a file's largest size (2^63-1)"), and a size this process
 * cannot map (its address space: 2^47 bytes on x86-64 with 4-level page
 * tables, less what is mapped already; RLIMIT_AS) is DSPK_ENOMEM ("shared
 * memory of N bytes: more than this process can map (mmap: ...)") before
 * the daemon is asked.  An empty device name is no
 * device (DSPK_ENODEV), as in every call that names one.  bytes 0 is
 * DSPK_EINVAL ("dspk_shared_alloc: bytes must be > 0": a mapping cannot be
 * empty; dspk_buffer_create takes 0).
 */
DSPK_EXPORT int dspk_shared_alloc(dspk_client *c, const char *device,
                                  size_t bytes, void **ptr_out,
                                  uint64_t *id_out);
/* Like dspk_shared_alloc, holding bytes [offset, offset + bytes) of the
 * open file fd, copied by the kernel (sendfile into the memfd; pread into
 * the mapping where shared memory gets huge pages only on request,
 * transparent_hugepage/shmem_enabled "advise") instead of by this process:
 * the fast way to pass a large file's data (dspk-submit does so for .npy
 * inputs).  fd must be open for reading (not O_WRONLY, not O_PATH) on a
 * file that can be read at an offset: a regular file, or a device such as
 * /dev/zero or a disk.  DSPK_EINVAL, before anything is made, when fd is
 * negative ("dspk_shared_from_file: fd -1 is no file") or names no open
 * descriptor ("... fd N is not an open file descriptor; ..."), was opened
 * with O_PATH or O_WRONLY, or is a directory, a pipe or FIFO, or a socket
 * (each named: "dspk_shared_from_file: fd N is a pipe or FIFO, which
 * cannot be read at an offset; it takes a descriptor open for reading of
 * a file that can be read at an offset (a regular file, or a device such
 * as /dev/zero)"), and when a device cannot be read at an offset after
 * all ("... fd N cannot be read at an offset (Illegal seek); ...": a
 * terminal).  DSPK_EIO when the file is shorter ("reading N bytes at
 * offset O of file descriptor N into shared memory: the file ends before
 * offset E") or its read fails (the system's reason), DSPK_EINVAL when
 * offset + bytes passes 2^63-1 (a file's largest offset) and when bytes
 * is 0 (as for dspk_shared_alloc), DSPK_ELIMIT beyond RLIMIT_FSIZE, and
 * the other codes, as for dspk_shared_alloc.  Freed by
 * dspk_shared_free(). */
DSPK_EXPORT int dspk_shared_from_file(dspk_client *c, const char *device, int fd,
                                      uint64_t offset, size_t bytes, void **ptr_out,
                                      uint64_t *id_out);
/* Says that the bytes [addr, addr + len) of this process are the bytes
 * [offset, offset + len) of the open file fd (a mapping of it, read-only
 * or not yet written): inline operands that lie there (and the data of a
 * dspk_buffer_write or dspk_ping that does) are then sent with sendfile(2)
 * from fd, the kernel passing the file's cached pages to the socket,
 * instead of copied from memory (which would fault every page of the
 * mapping in), whatever their size: the shared threshold
 * (dspk_set_shared_threshold) does not apply to them, except to one of half
 * the daemon's max_message or more, which could not go inline at all and
 * is read from fd (pread) into its temporary.  The library never reads
 * such bytes through the mapping, so a file that shrank is an error, not a
 * SIGBUS: fd
 * is duplicated (the caller may close its own); the file must not change
 * while a request using it is sent (a file that ends inside the range
 * breaks the connection: DSPK_EIO; DSPK_EIO too, the connection intact,
 * for the large operand whose temporary it cannot fill; both say "an input
 * file ended before its data was sent (changed while in use?)").  Where
 * sendfile cannot be used (fd is a pipe, or the kernel cannot send a file
 * to this socket) the memory is sent as before.  Ranges may overlap: an
 * operand is sent from the range registered last of those that hold all of
 * it (one only partly in ranges is sent from memory).  A call with the
 * addr and len of a registered range replaces that range (its fd and
 * offset); one with the same addr and another len adds a range, the
 * registered one staying.  len 0 forgets every range that starts at addr
 * (do so before unmapping it; fd and offset are then ignored); dspk_close
 * forgets all.  A call that fails changes nothing: every range registered
 * before stays.  0, DSPK_EINVAL (also for a range whose addr + len wraps
 * around the address space, or whose offset + len passes 2^63-1),
 * DSPK_ENOMEM or DSPK_EIO (dup failed, as for an fd that is not open). */
DSPK_EXPORT int dspk_file_data(dspk_client *c, const void *addr, size_t len, int fd,
                               uint64_t offset);
/* Has the first output of ticket's answer written to the open file fd at
 * offset instead of into this process's memory, when it is not a reference
 * (out_refs) and holds at least 64 KiB: the bytes go from the socket to the
 * file through a pipe with splice(2), the kernel copying them once into the
 * file's pages (the way dspk-submit writes a large result to its .npy
 * file).  An answer that cannot take that way is written to the file from
 * where it is by the wait that returns it: one read while c waited for
 * another ticket (or while a dspk_wait_any with a timeout read it), which
 * had to be kept in memory, and a result of at least the shared threshold,
 * which comes through a shared temporary (dspk_set_shared_threshold).  The
 * dspk_wait (or dspk_wait_any) that returns the answer then gives that
 * output as usual, its data a read-only shared mapping of the file's bytes
 * [offset, offset + nbytes) (unmapped by dspk_result_free; the file must not
 * shrink while it is used; aligned for its dtype only when offset is), and
 * sets *written (may be NULL; set false by a successful
 * dspk_result_to_file, untouched by a failed one) to true.  It stays false, the output then in
 * memory as usual, when the answer is an error, its first output is a
 * reference or smaller than 64 KiB, or the file takes no more bytes (a full
 * disk, or the offset reached this process's file size limit, RLIMIT_FSIZE:
 * what was written is read back, and the caller's own write of the
 * file then reports the error).  fd must be a regular file open for reading and writing (not
 * O_APPEND); it is duplicated, and the file grows as needed; bytes outside
 * the range are not touched.  A second call for a ticket replaces the
 * first's file; a call that fails changes nothing (the ticket's earlier
 * file, if any, stays).  Call it after dspk_submit and before the
 * dspk_wait that returns the answer.  offset is at most 2^62-1 (so that the
 * output's bytes always end before a file's largest offset, 2^63-1): a
 * larger one is DSPK_EINVAL, its message naming that limit.  0, DSPK_EINVAL,
 * DSPK_ENOENT (ticket not in flight), DSPK_ENOMEM or DSPK_EIO (dup failed). */
DSPK_EXPORT int dspk_result_to_file(dspk_client *c, uint32_t ticket, int fd, uint64_t offset,
                                    bool *written);
/* Frees an allocation of dspk_shared_alloc (ptr: its start): buffer.free,
 * then unmaps.  Tasks already sent still see the daemon's mapping.  The
 * mapping is gone whatever buffer.free answered (DSPK_ENOBUF when its id
 * was already freed with dspk_buffer_free; 0 without asking when the
 * connection is broken); DSPK_EINVAL, with nothing freed, for a ptr that
 * is not the start of a live allocation of c (NULL, or freed before). */
DSPK_EXPORT int dspk_shared_free(dspk_client *c, void *ptr);

/* Inline operands of at least this many bytes that are not in shared memory
 * (nor in a file range of dspk_file_data, sent with sendfile) go through a
 * temporary shared buffer (one copy, into memory this client reuses; from
 * 8 MiB on, the copy is split over short-lived threads, one
 * per online CPU up to 4) instead of the socket, on the task's device; 0
 * turns it off (but for an operand or result that cannot cross the
 * socket, below).
 * So does the one result of a gemm, fft, fir or map task without out_refs
 * when it is at least that large: the daemon writes it into a temporary,
 * which dspk_wait lends to the result (still inline, no copy: out[0].data
 * points into the temporary's pages until dspk_result_free, which gives
 * them back for a later task; while 4 results of c hold temporaries, the
 * next comes into memory of its own: through the socket, no temporary made
 * for it, or copied out of one where it could not cross the socket).  Either way the memory is the
 * result's, valid until dspk_result_free, also after dspk_close.
 * For a task on "any" only when the daemon has no hardware device ("any"
 * is then cpu:0), so that the daemon's choice of device stays free.
 * dspk_submit does not wait for an answer (it returns at once, also behind
 * a device's long queue): it uses an idle temporary of c's that fits (on
 * the task's device) and otherwise sends the operand inline on the socket,
 * and has such a result come back inline; it makes no temporary (a
 * buffer.import round trip, answered behind the device's earlier work) nor
 * asks what "any" is, except for an operand or result of half
 * dspk_max_message or more, which could not cross the socket in one
 * message: for that one it waits as dspk_run does.  Such an operand or
 * result (and a result of more than dspk_max_message - 1024 bytes, what an
 * inline result may carry, protocol.md "Limits"; any result when
 * max_message is 1024 or less) goes through a temporary whatever the
 * threshold, 0 and SIZE_MAX included, for dspk_run and dspk_submit alike.  dspk_run, which waits
 * anyway, makes them (and learns what "any" is with a `devices` call), and
 * leaves them idle for the next tasks, dspk_submit's included.
 * Temporaries are daemon buffers of the user's: they count toward
 * max_buffers and the memory quotas (max_user_memory... , protocol.md
 * "Quotas") while they exist.  Once a task's answer is consumed (dspk_wait,
 * dspk_wait_any, dspk_run) at most 6 idle ones are kept for later tasks,
 * less one for each lent to a result then (idle once the result is freed:
 * at most 6 idle, also after the results are freed), of
 * at most 256 MiB together and at most an eighth of the connection's memory
 * quota on cpu:0 (hello's cpu_memory_quota, protocol.md), the most recently
 * used, and the others freed; a result's temporary is the result's until
 * dspk_result_free, which unmaps one larger than that bound at once (its daemon buffer goes at c's next
 * dspk_wait, dspk_wait_any or dspk_run).  A dspk_buffer_create, dspk_shared_alloc or temporary that the
 * daemon refuses with DSPK_ELIMIT or DSPK_ENOMEM while c holds idle
 * temporaries frees them and is tried once more.  A temporary that cannot
 * be had all the same (refused by the daemon: max_buffers, a quota; or no
 * shared memory here, RLIMIT_FSIZE below its size and no memfd_create
 * included) is no failure of the task: its operand or result
 * crosses the socket instead, as with threshold 0.  Only one that cannot
 * (an operand of half dspk_max_message or more, a result of more than
 * dspk_max_message - 1024 bytes) fails then, before anything is sent,
 * with the refusal's code (dspk_shared_alloc's: DSPK_ENOTSUP or DSPK_EPERM
 * where no memfd can be had) and a dspk_last_error() that says a shared
 * temporary was refused, and why.
 * None is made (the bytes cross the socket) where it, whole 2 MiB units,
 * would pass, with c's shared memory on cpu:0 and the task's own inline
 * operands and result, what hello's cpu_memory_quota lets the connection
 * hold on cpu:0.  And where the daemon refuses dspk_run's task with
 * DSPK_ELIMIT (a quota that other connections of the user share, say)
 * while temporaries held memory, the task's or c's idle ones, the idle ones
 * are freed and the task is sent once more with its operands and result
 * through the socket, as with threshold 0; its answer is dspk_run's.  A
 * task of dspk_submit is not sent again: its dspk_wait returns the refusal.
 * A broken connection or a timeout (dspk_set_timeout) while one is made is
 * the call's failure as any other.
 * The default is DSPK_SHARED_THRESHOLD, or $DSPK_SHARED_THRESHOLD at
 * dspk_connect when it is a size ("1048576", "1M", "64KiB"; 0: off). */
#define DSPK_SHARED_THRESHOLD ((size_t)1 << 20)
DSPK_EXPORT void dspk_set_shared_threshold(dspk_client *c, size_t bytes);

/* ---- tasks --------------------------------------------------------------- */

/*
 * A tensor: C order, contiguous, little-endian.  Either inline data
 * (is_ref false: data/nbytes, nbytes == product(shape) * dtype size) or a
 * reference to a daemon buffer (is_ref true: buffer/offset; data ignored).
 * In a dspk_result, inline data is owned by the result.
 */
typedef struct dspk_tensor {
  dspk_dtype dtype;
  unsigned rank;                 /* 0 for a scalar */
  int64_t shape[DSPK_MAX_RANK];
  const void *data;
  size_t nbytes;
  bool is_ref;
  uint64_t buffer;
  uint64_t offset;               /* bytes, multiple of the item size */
} dspk_tensor;

/* Bytes per element of dt (0 for an invalid value), its wire name ("f32";
 * "?" when invalid), number of elements of t (over its first DSPK_MAX_RANK
 * axes; 0 for NULL), and a name lookup (0 or DSPK_EDTYPE, which a NULL
 * name is; out may be NULL to only check the name). */
DSPK_EXPORT size_t dspk_dtype_size(dspk_dtype dt);
DSPK_EXPORT const char *dspk_dtype_name(dspk_dtype dt);
DSPK_EXPORT int dspk_dtype_from_name(const char *name, dspk_dtype *out);
/* The number of elements: the product of the shape over its first
 * min(rank, DSPK_MAX_RANK) axes; UINT64_MAX when an axis is negative (the
 * shape is invalid, whatever the other axes are: {-1, 0} too); else 0 when
 * an axis is 0 (even where the other axes' product would overflow); else
 * UINT64_MAX when the product overflows 64 bits; 0 for NULL.  dspk_run and
 * dspk_submit refuse, before looking at its nbytes, a tensor with a
 * negative axis with DSPK_EINVAL ("input 0: negative shape[1]"), and with
 * DSPK_ELIMIT as the daemon does (protocol.md, Tensors) one whose size,
 * the product of its dimensions (each 0 counted as 1) times the item size,
 * passes 2^63-1 bytes, which every other one whose numel is UINT64_MAX
 * does. */
DSPK_EXPORT uint64_t dspk_tensor_numel(const dspk_tensor *t);

/* Convenience: fills *t as an inline tensor over data (not copied), with
 * nbytes from shape and dtype (SIZE_MAX where they overflow).  The rank is kept as given, so that a rank
 * above DSPK_MAX_RANK is refused by dspk_run/dspk_submit (DSPK_ELIMIT);
 * shape NULL leaves the axes 0; t NULL does nothing. */
DSPK_EXPORT void dspk_tensor_inline(dspk_tensor *t, dspk_dtype dt,
                                    unsigned rank, const int64_t *shape,
                                    const void *data);

/* Outputs of one task: a raw kernel returns each of its (at most 4) tensor
 * arguments, like the daemon's DSPK__OP_MAX_IN. */
#define DSPK_MAX_OUTPUTS 4
#define DSPK_KERNEL_MAX_ARGS 16

typedef enum dspk_karg_kind {
  DSPK_KARG_TENSOR, /* v.tensor: index into task inputs */
  DSPK_KARG_I32, DSPK_KARG_U32, DSPK_KARG_I64, DSPK_KARG_F32, DSPK_KARG_F64
} dspk_karg_kind;

typedef struct dspk_karg {
  dspk_karg_kind kind;
  union { int tensor; int32_t i32; uint32_t u32; int64_t i64; float f32;
          double f64; } v;
} dspk_karg;

/*
 * One task.run request.  Initialize with dspk_task_init() (it sets the
 * documented defaults, alpha = 1 among them), then fill in the fields of
 * the op.  The task's memory (inputs, strings) is only read during
 * dspk_run()/dspk_submit() and may be reused once they return.
 */
typedef struct dspk_task {
  dspk_op op;
  const char *device;          /* "cpu:0", "any" (NULL means "any"; "" is ENODEV) */
  unsigned ninputs;             /* 1 to DSPK_MAX_OUTPUTS (4); more is DSPK_EINVAL,
                                  found before any operand is read */
  const dspk_tensor *inputs;
  /* Optional: put the result into a daemon buffer instead of returning it
   * inline (the result then holds a reference).  nout_refs is 0 or 1: every
   * op has one result (a kernel none of its own: it takes no out_refs);
   * more is DSPK_EINVAL (protocol.md, task.run's outputs). */
  unsigned nout_refs;
  struct { uint64_t buffer, offset; } out_refs[DSPK_MAX_OUTPUTS];

  /* An op computed in f32 (gemm of f32/f16/bf16, map of f32/c64) rounds
   * alpha and beta to f32: a finite one that would become an infinity is
   * DSPK_ERANGE (protocol.md). */
  struct { bool trans_a, trans_b; double alpha, beta; } gemm;
  struct { bool inverse; } fft;
  struct { const char *subscripts; } contract; /* "ik,kj->ij" */
  struct {
    dspk_reduce fn;
    unsigned naxes;            /* 0: all axes */
    int axes[DSPK_MAX_RANK];   /* negative counts from the end */
  } reduce;
  struct { dspk_mapfn fn; double alpha; } map;
  struct {
    const char *lang;          /* "cuda", "glsl", "spirv", "hip" */
    const void *source;
    size_t source_len;
    const char *entry;         /* NULL: "main" (protocol.md's default) */
    uint32_t grid[3], block[3], shared;
    unsigned nargs;
    dspk_karg args[DSPK_KERNEL_MAX_ARGS];
  } kernel;
} dspk_task;

/* Zeroes *t and sets op and the defaults (device "any", gemm alpha 1 /
 * beta 0, map alpha 1, grid and block 1; kernel.entry NULL, which means
 * "main").  t NULL does nothing.  A kernel task whose lang is NULL or not
 * one of the four, whose source is NULL with a source_len, or whose nargs
 * exceeds DSPK_KERNEL_MAX_ARGS is DSPK_EINVAL naming that field.
 * gemm's beta stays 0 when a third input C is given, and beta 0 reads no C
 * (BLAS, protocol.md): for alpha*op(A)@op(B) + C set gemm.beta = 1 (what
 * dspk-submit's --beta and the Python client's beta default to with C);
 * a nonzero beta without C is the daemon's DSPK_EINVAL. */
DSPK_EXPORT void dspk_task_init(dspk_task *t, dspk_op op);

/* The answer of a task.  Inline outputs are in memory owned by the result
 * (aligned to 64 bytes); free it with dspk_result_free(). */
typedef struct dspk_result {
  char device[32];             /* the device that ran the task */
  unsigned nout;
  dspk_tensor out[DSPK_MAX_OUTPUTS];
  uint64_t time_us;            /* the daemon's runner time for the task
                                  (upload, planning, compute, readback; no
                                  queueing, no socket), 0 if not sent */
} dspk_result;

/* Frees the result's tensors (not r itself) and zeroes it.  Accepts NULL.
 * Any thread, also after the result's client was closed: a result lent a
 * shared temporary gives it back to its client (or unmaps it when the
 * client is closed).  Never free() an output's data yourself. */
DSPK_EXPORT void dspk_result_free(dspk_result *r);

/* Runs a task and waits for its answer: 0 and *res, or a negative code
 * (DSPK_ESHAPE, DSPK_EDTYPE, DSPK_ENODEV, ...) with the daemon's detail in
 * dspk_last_error().  A request that does not fit the daemon's max_message
 * (several operands sent inline, each below half of it and the shared
 * threshold; a long kernel source) is DSPK_ELIMIT before anything is sent,
 * with the remedy in dspk_last_error(): buffer references, dspk_shared_alloc,
 * and, where a temporary would be made for them (for "any": the daemon has
 * no hardware device, asked with a `devices` call where not known yet), the
 * shared threshold that would carry the inline operands (at most the
 * largest's size) when the current one (0: off, or above it) does not;
 * where the connection's quota on cpu:0 (hello's cpu_memory_quota) leaves
 * no room for that temporary (see dspk_set_shared_threshold: none is made
 * then), it says so, with the quota, instead of a threshold.
 * Unless the task's device (not "any") does not exist or is not the Slurm
 * job's: that is DSPK_ENODEV, in the daemon's words, as the task gets it
 * with small operands, since no size would help (asked with a
 * buffer.create that the daemon refuses whatever the device, making
 * nothing); so is a temporary that the daemon refuses with DSPK_ENODEV, and
 * a device name longer than 47 bytes is DSPK_ELIMIT "device: longer than 47
 * bytes", as the daemon says it.  A raw kernel's inline tensors go
 * inline both ways (not through shared memory): together at most
 * max_message - 1024 bytes, what an answer carries (DSPK_ELIMIT before
 * anything is sent otherwise), and in one request with the source; larger
 * ones go as buffer references (is_ref).  Unless its device (for "any":
 * every device) runs no raw kernels, or none of its language: that is the
 * daemon's DSPK_ENOTSUP, in its words for small tensors, at any size
 * (asked with a stand-in of the task, one f32 element and a source that
 * no compiler takes, which never runs). */
DSPK_EXPORT int dspk_run(dspk_client *c, const dspk_task *t, dspk_result *res);

/*
 * Asynchronous use: dspk_submit() sends the request and returns at once
 * with a ticket (the request's msgid), never waiting for an answer (only,
 * like every call, for room to send: see dspk_set_shared_threshold for its
 * large operands; and where the request is too large to be sent at all,
 * for what dspk_run's DSPK_ELIMIT says: whether its device exists, what
 * "any" is, answers the daemon gives at once); any number may be in flight.
 * dspk_wait() blocks until that ticket's answer arrives (answers to other
 * tickets read meanwhile are kept for their own dspk_wait, each found in
 * constant time however many are kept) and consumes the
 * ticket.  dspk_cancel() asks the daemon to cancel it; its dspk_wait()
 * then returns DSPK_ECANCELED when its work stopped before it was complete,
 * else its result (the work completed first).
 */
DSPK_EXPORT int dspk_submit(dspk_client *c, const dspk_task *t,
                            uint32_t *ticket);
DSPK_EXPORT int dspk_wait(dspk_client *c, uint32_t ticket, dspk_result *res);
/* Like dspk_wait() for any one ticket: 0 with *ticket and *res of the first
 * completed request, DSPK_ENOENT when none is in flight.  Answers that
 * arrived while another was waited for are kept and given first, in the
 * order they arrived (first come, first served).
 * An exception to "outputs are written only on success": when the request
 * answered is the one that failed (its error answer, or a result that
 * could not be decoded), *ticket is written with that ticket too (consumed
 * like a successful one), so that the caller knows which request failed;
 * *res is not written.  When no request was answered (DSPK_ENOENT, a
 * broken connection, DSPK_ETIMEDOUT, a bad argument) *ticket is left as it
 * was.  To tell both apart, set *ticket to 0 before the call (tickets are
 * never 0). */
DSPK_EXPORT int dspk_wait_any(dspk_client *c, uint32_t *ticket,
                              dspk_result *res);
/* Sends task.cancel for ticket and waits for that call's answer; *canceled
 * (may be NULL) tells whether the request was still in flight: queued, it
 * was removed and its dspk_wait() returns DSPK_ECANCELED; running, it was
 * asked to stop, and its dspk_wait() returns DSPK_ECANCELED when the work
 * stopped before it was complete, or its result when the work completed
 * (work a GPU has already been given, one BLAS call, completes).  false: the request had already finished (or no request of c
 * has that ticket). */
DSPK_EXPORT int dspk_cancel(dspk_client *c, uint32_t ticket, bool *canceled);

/* Called from dspk_wait()/dspk_run() (and from any call of c that waits
 * for an answer) on the calling thread for each `task.progress`
 * notification (autotuning).  fn NULL removes it.
 * The callback may call the library: any function on any client, c
 * included (dspk_cancel of the ticket, dspk_ping, dspk_run, dspk_wait of
 * another ticket, dspk_set_progress...); dspk_close(c) there ends the
 * connection but frees c only when called again later (see there).  Answers and
 * notifications a call made there reads are kept for whoever waits for
 * them: the call that invoked the callback gets its answer (DSPK_ECANCELED
 * when the callback canceled its task), or DSPK_ENOENT when the callback
 * consumed that very ticket with dspk_wait/dspk_wait_any.  The callback is
 * never entered again while it runs: notifications read by calls made
 * from it are delivered, in order, right after it returns. */
typedef void (*dspk_progress_fn)(void *ud, uint32_t ticket, const char *what,
                                 double fraction);
DSPK_EXPORT void dspk_set_progress(dspk_client *c, dspk_progress_fn fn,
                                   void *ud);

/* ---- the daemon's persistent cache ----------------------------------------- */

/* Kinds of cache entry, as bits (cache.clear's "kinds"). */
#define DSPK_CACHE_KERNELS 1u  /* compiled kernels */
#define DSPK_CACHE_AUTOTUNE 2u /* autotune decisions */
#define DSPK_CACHE_BLOBS 4u    /* named blobs: FFTW wisdom, pipeline caches */
#define DSPK_CACHE_ALL 7u

/*
 * Calls `cache.clear` for the kinds in the mask (0: every kind); *cleared
 * (may be NULL) receives the kinds the daemon cleared.  Returns 0,
 * DSPK_EPERM when the caller is neither root, the daemon's own user nor an
 * admin of the daemon (admin_users, admin_groups: dspkd.conf [policy]),
 * DSPK_ENOENT when the daemon runs without a cache, DSPK_EINVAL for bits
 * outside DSPK_CACHE_ALL.  (Statistics: dspk_call_json(c, "cache.stats").)
 */
DSPK_EXPORT int dspk_cache_clear(dspk_client *c, unsigned kinds,
                                 unsigned *cleared);

#ifdef __cplusplus
}
#endif

#endif /* DSPK_DSPK_H */
