/*
 * The kernel worker: raw kernels (client code) run in a separate process,
 * dspk-cuda-worker, one per device, so that a kernel that faults kills that
 * process's CUDA context and not the daemon's.  CUDA errors such as an
 * illegal address are sticky for the whole process ("to continue using
 * CUDA, the process must be terminated and relaunched"), so isolation by
 * process is the only way the daemon can keep serving after one.
 *
 * The daemon compiles the kernel (NVRTC, through the cache), waits for its
 * own stream, and sends the worker the cubin and the launch over a Unix
 * socket pair (fd 3 in the worker).  Tensor arguments travel as CUDA IPC
 * handles of the daemon's allocations (the worker maps them, so the kernel
 * writes the daemon's buffers directly), or, where IPC is unavailable, as
 * bytes copied through the socket and back.  The worker launches,
 * synchronizes, and answers; after a sticky error it answers and exits, and
 * the daemon starts a fresh worker for the next raw kernel.
 *
 * Messages are fixed-size structs, followed by payloads whose lengths they
 * give, in native byte order (both ends are the same build).
 */
#ifndef DSPK_BACKENDS_GPURT_WORKER_H
#define DSPK_BACKENDS_GPURT_WORKER_H

#include <stdint.h>

#include <stddef.h>

#define DSPK__WORKER_MAGIC 0x64737077u /* "dspw" */
#define DSPK__WORKER_MAX_ARGS 16

enum dspk__warg_kind {
  DSPK__WARG_IPC = 1,  /* a tensor: ipc handle of its allocation + offset */
  DSPK__WARG_DATA = 2, /* a tensor: `bytes` follow the request, and return */
  DSPK__WARG_SCALAR = 3 /* `size` bytes of value */
};

struct dspk__wreq {
  uint32_t magic;
  uint32_t nargs;
  uint64_t cubin_len;
  char entry[64];
  uint32_t grid[3], block[3], shared;
  uint32_t pad;
  struct {
    uint32_t kind, size; /* size: scalar bytes */
    uint64_t offset;     /* IPC: bytes into the allocation */
    uint64_t bytes;      /* DATA: payload bytes */
    unsigned char ipc[64]; /* the runtime's IPC handle */
    unsigned char value[8];
  } args[DSPK__WORKER_MAX_ARGS];
};
/* Followed by cubin_len bytes of cubin, then each DATA argument's bytes in
 * order. */

struct dspk__wrep {
  uint32_t magic;
  int32_t status;  /* 0, or a negative dspk_errno */
  int32_t cuerr;   /* the int behind a failure, 0 if none */
  int32_t fatal;   /* 1: the worker's context is dead and it exits */
  int32_t ipc_failed; /* 1: mapping an IPC handle failed (use DATA) */
  char msg[500];
};
/* On success, followed by each DATA argument's bytes in order. */

struct dspk__gpurt_driver;
/* The worker process's main (worker_main.c) over drv: each runtime's worker
 * binary is a main() that calls it with its driver table. */
int dspk__gpurt_worker_main(const struct dspk__gpurt_driver *drv, int argc, char **argv);

/* Reads exactly n bytes from fd, retrying on EINTR: 0, or -1 at end of
 * stream or on an error (backends/cuda/worker_io.c, used by both sides). */
int dspk__worker_read(int fd, void *p, size_t n);
/* Writes exactly n bytes to the socket fd, retrying on EINTR and never
 * raising SIGPIPE (a dead peer must not take this process with it): 0 or
 * -1. */
int dspk__worker_write(int fd, const void *p, size_t n);

#endif /* DSPK_BACKENDS_GPURT_WORKER_H */
