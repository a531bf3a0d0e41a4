/*
 * The backend interface: one small table of functions per kind of device
 * (cpu, cuda, vulkan, hip).  It is shaped for asynchronous GPUs: ops are
 * enqueued on the device's stream/queue and may still run when a call
 * returns; fences order host work after device work; memory given back with
 * free() is released only once the device is done with it (the retirement
 * queue of backends/common/retire.h), never by draining the stream.
 *
 * Threads.  probe() runs once on the daemon's main thread before any device
 * opens.  Every other member runs on the device's own runner thread, the
 * only thread that ever touches that device; a backend therefore needs no
 * locking for per-device state.  Shared, process-wide state (a VkInstance, a
 * dlopen'd library) is created in probe() and destroyed by shutdown().
 *
 * Errors.  Members return 0 or a negative dspk_errno and never log above
 * debug, print or exit; details go into ctx->errmsg.
 */
#ifndef DSPK_BACKENDS_BACKEND_H
#define DSPK_BACKENDS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "op.h"

struct dspk__dev;   /* one open device: backend-private */
struct dspk__fence; /* a point in a device's stream: backend-private */
struct dspk__cache; /* cache/cache.h: the persistent SQLite cache */

/* What probe() reports of each device. */
struct dspk__devinfo {
  char name[128];    /* "NVIDIA H200", "cpu (AMD EPYC 7B13, 2 threads)" */
  char type[16];     /* "cpu", "discrete", "integrated", "virtual", "software" */
  char arch[32];     /* "sm_90", "x86_64" */
  char driver[64];   /* driver version, "" when none */
  char uuid[40];     /* "" when unknown */
  uint64_t memory;   /* bytes of device memory (host memory for cpu) */
  uint64_t max_tensor_bytes; /* the largest tensor a task can bind (0: memory) */
  int software;      /* 1 for a software rasteriser (lavapipe): "any" avoids it */
};

/* What the daemon hands a device when it opens it. */
struct dspk__devenv {
  struct dspk__cache *cache; /* may be NULL: no persistent cache */
  void (*log)(void *ud, int level, const char *msg); /* debug messages */
  void *log_ud;
  /* An executable that runs `EXE --fftw-measure SPEC` (dspkd: itself, as
   * "/proc/self/exe"), where the cpu backend measures large FFTW plans in a
   * process of their own, so that its planner (one per process, not
   * thread-safe) stays free for other tasks meanwhile; NULL: measured in a
   * thread of this process, holding the planner. */
  const char *measure_exe;
  /* An executable that runs `EXE --kernel-compile LANG` (dspkd: itself),
   * where a client's raw-kernel source is compiled under the memory and time
   * limits of backends/common/kcompile.h, and where a software Vulkan device
   * first makes a raw kernel's pipeline under them; NULL: compiled and made
   * in this process, without them (for tests and tools, never the daemon). */
  const char *compile_exe;
};

/* The child's side of measure_exe: `EXE --fftw-measure SPEC` calls this with
 * SPEC (written by the cpu backend's background measuring,
 * backends/cpu/fft.c); it measures that FFTW plan and prints its wisdom on
 * stdout.  Returns the process's exit status: 0, 1 (no plan or no wisdom)
 * or 2 (a bad SPEC, or the process that asked is gone). */
int dspk__cpu_fft_measure_main(const char *spec);

/* The child's side of compile_exe: `EXE --kernel-compile LANG` calls this
 * (backends/registry.c): it compiles the source on stdin with LANG's
 * compiler under the limits of backends/common/kcompile.h and writes the
 * answer on stdout.  Returns the process's exit status: 0 (an answer
 * written), 2 (a LANG this build cannot compile, or I/O failed), 3 (out of
 * memory before the compiler ran). */
int dspk__kernel_compile_main(const char *lang);

/*
 * What one device runs, as its backend reports it once, right after open
 * (the caps member): the daemon checks every task against it before it
 * queues anything, so "any" goes only to a device that can run the task and
 * a named device that cannot answers ENOTSUP at once.  Build it with the
 * helpers below (backends/caps.c).
 */
struct dspk__devcaps {
  /* Per op (dspk_op): bit (1u << dtype) for each dtype of the op's first
   * input (gemm's A, fft's X, ...) the device runs; 0: not the op at all.
   * For "kernel", any nonzero value: raw kernels in the languages below. */
  uint32_t dtypes[DSPK_OP_COUNT];
  /* Bit i: raw kernels in dspk__kernel_langs[i] (proto/schema.h). */
  uint32_t langs;
};

/* Adds the ops of mask (bit 1u << op) to *c with every dtype
 * dspk__op_infer() accepts for them (dspk__op_dtypes); a backend then takes
 * away what it lacks.  Raw kernels need a language too (add_lang). */
void dspk__caps_add_ops(struct dspk__devcaps *c, uint32_t mask);
#define DSPK__CAPS_OP(op) (1u << (DSPK_OP_##op))
/* Every op but raw kernels. */
#define DSPK__CAPS_ALL_OPS (((1u << DSPK_OP_COUNT) - 1) & ~DSPK__CAPS_OP(KERNEL))
/* Removes dtype dt from every op of *c. */
void dspk__caps_drop_dtype(struct dspk__devcaps *c, dspk_dtype dt);
/* Adds raw kernels in language lang (a name of dspk__kernel_langs). */
void dspk__caps_add_lang(struct dspk__devcaps *c, const char *lang);
/* 0 when *c covers op (its kind, the dtype of its first input, a kernel's
 * language); else DSPK_ENOTSUP with a sentence naming who (the device id)
 * and what it runs instead in msg. */
int dspk__caps_check(const struct dspk__devcaps *c, const struct dspk__op *op,
                     const char *who, char *msg, size_t msglen);

/* Counters a device reports in `status`; unused fields stay 0. */
struct dspk__devstats {
  uint64_t pool_bytes_in_use, pool_bytes_cached, pool_hits, pool_misses;
  uint64_t retire_deferred, retire_released, retire_barrier_fallbacks,
      retire_leaked, retire_in_flight, retire_max_in_flight;
  uint64_t kernels_compiled, kernel_cache_hits;
};

struct dspk__backend {
  const char *name; /* "cpu", "cuda", ...: the prefix of device ids */

  /* Main thread, once.  Writes up to max entries of info and returns how
   * many devices there are (>= 0).  When there are none, writes the reason
   * (library missing, no driver, no device) into why.  Never fails the
   * daemon: a missing library is 0 devices. */
  int (*probe)(struct dspk__devinfo *info, int max, char *why, size_t whylen);
  /* Optional.  Main thread, after every device of this backend closed:
   * destroys process-wide state made by probe(). */
  void (*shutdown)(void);

  /* Runner thread.  Opens device `index` (of probe's list). */
  int (*open)(int index, const struct dspk__devenv *env,
              struct dspk__dev **out);
  /* Runner thread.  The ordered teardown: wait for the device, drain the
   * retirement queue, free the pool, unload modules/pipelines, destroy
   * library handles, streams and the context.  Accepts NULL. */
  void (*close)(struct dspk__dev *dev);

  /* Memory.  alloc returns a block of at least n bytes (n may be 0).
   * free gives a block back: it is released once every piece of work
   * enqueued so far has finished with it (immediately on the cpu), so a
   * block may be freed while enqueued work still uses it.  Each block is
   * freed once: from free on, the caller must not pass it to any member
   * again (an op, write, read, clear, host_ptr, a second free), as the
   * next alloc may hand out the same memory.  (A second free would put it
   * where the next two allocs both get it; the Vulkan backend ignores a
   * second free of a block it has not handed out again, but no backend can
   * tell a stale pointer from a block handed out again.) */
  int (*alloc)(struct dspk__dev *dev, size_t n, struct dspk__mem **out);
  void (*free)(struct dspk__dev *dev, struct dspk__mem *mem);
  /* Host to device: ordered before work enqueued later; src may be reused
   * when it returns, except inside a mapping given to host_register: the
   * device reads those pages when the copy runs (DMA, asynchronous), so they
   * must stay unchanged until later work has finished (sync, or a task
   * enqueued after it).  src need not be aligned. */
  int (*write)(struct dspk__dev *dev, struct dspk__mem *mem, size_t off,
               const void *src, size_t n);
  /* Device to host: ordered after all work enqueued so far; dst is filled
   * when it returns. */
  int (*read)(struct dspk__dev *dev, struct dspk__mem *mem, size_t off,
              void *dst, size_t n);

  /* Fences: a point in the device's work.  record marks "everything
   * enqueued so far"; query returns 1 when reached, 0 when not yet, or a
   * negative error; wait blocks until reached.  sync waits for all work (the
   * barrier fallback). */
  int (*fence_record)(struct dspk__dev *dev, struct dspk__fence **out);
  int (*fence_query)(struct dspk__dev *dev, struct dspk__fence *f);
  int (*fence_wait)(struct dspk__dev *dev, struct dspk__fence *f);
  void (*fence_destroy)(struct dspk__dev *dev, struct dspk__fence *f);
  int (*sync)(struct dspk__dev *dev);

  /* Runner thread, once, right after a successful open: fills *out (zeroed
   * by the caller) with what this device runs.  The daemon never hands run()
   * an op the caps exclude. */
  void (*caps)(struct dspk__dev *dev, struct dspk__devcaps *out);

  /* Enqueues op (validated by dspk__op_infer, covered by caps, every
   * operand placed in this device's memory).  May return before the device
   * finishes; read() and fences order later host work.  DSPK_ENOTSUP only
   * for what the caps cannot say and the work itself shows (an operand's
   * alignment, a size past a library's limit, a missing worker binary): the
   * task fails with it, it is not run elsewhere. */
  int (*run)(struct dspk__dev *dev, struct dspk__op *op,
             struct dspk__opctx *ctx);

  /* Optional.  Gives cached memory back (the pool's free lists): the daemon
   * calls it when no client has been connected for a while. */
  void (*trim)(struct dspk__dev *dev);
  /* Optional.  Runner thread, when it has nothing queued and nothing in
   * flight: releases every resource the retirement queue still holds,
   * waiting on their fences (recorded behind work enqueued already, so the
   * wait ends with that work; never a sleep).  Without it memory freed last
   * would stay "in use" until the next job drains the queue. */
  void (*settle)(struct dspk__dev *dev);

  /* Optional: host memory the daemon maps from a client (shared-memory
   * buffers, docs/protocol.md "Shared memory").  ptr is page-aligned and
   * stays mapped until free() of the block returned (or host_unregister)
   * has returned.
   * import_host makes ptr itself a block of this device: ops read and write
   * it in place, no copy (cpu; a GPU that can map host memory).  free()
   * releases only the block's bookkeeping, never the memory.  DSPK_ENOTSUP
   * (or NULL): the daemon allocates a block of its own and copies between
   * ptr and it around each task (one staging copy).
   * host_register pins ptr for DMA (cuMemHostRegister), so those copies go
   * straight from and to the client's pages; host_unregister undoes it
   * before the daemon unmaps ptr.  A failed register only costs speed. */
  int (*import_host)(struct dspk__dev *dev, void *ptr, size_t n,
                     struct dspk__mem **out);
  int (*host_register)(struct dspk__dev *dev, void *ptr, size_t n);
  void (*host_unregister)(struct dspk__dev *dev, void *ptr);
  /* Optional: page-locked host memory of at least n bytes that read() fills
   * by DMA, for the results the daemon reads back and sends from there
   * (inline task results, buffer.read answers); NULL when there is none
   * (the daemon then uses malloc'd memory).  host_free gives it back: the
   * backend keeps some for the next results and gives that back in trim()
   * and close(); close() also releases blocks never given back.  Runner
   * thread. */
  void *(*host_alloc)(struct dspk__dev *dev, size_t n);
  void (*host_free)(struct dspk__dev *dev, void *p);

  /* Optional: the address of a block's bytes when they are plain host
   * memory that any thread may read until free() of the block, and write
   * while no op uses it (the cpu, whose work is done when run returns),
   * else NULL.  The daemon then sends buffer.read answers and large inline
   * results straight from the block instead of copying them out first
   * (daemon/task.c), and receives buffer.write data into it on the loop
   * thread (daemon/conn.c). */
  void *(*host_ptr)(struct dspk__dev *dev, struct dspk__mem *mem);

  /* Optional.  Sets the first n bytes of a block alloc returned to zero,
   * ordered like write (it may skip memory it knows to be zero: pages fresh
   * from the kernel).  Without it the daemon writes zeros (write). */
  int (*clear)(struct dspk__dev *dev, struct dspk__mem *mem, size_t n);

  /* Optional: nonzero when `op` (validated, as run gets it) would run to
   * its end at once on the calling thread, in about a quarter of a
   * millisecond or less, with no plan to make and nothing to tune first (on
   * the cpu: a small gemm whose thread count is decided).  The daemon may
   * then run it on its loop thread while the runner is idle, sparing the
   * hand-off to the runner and back (daemon/sched.c).  Called from any
   * thread, also while the runner runs another op: it must only look. */
  int (*quick)(struct dspk__dev *dev, const struct dspk__op *op);

  /* Optional.  Fills the counters shown by `status`. */
  void (*stats)(struct dspk__dev *dev, struct dspk__devstats *out);
};

/* The backends compiled into this build, in probe order (backends/registry.c). */
extern const struct dspk__backend *const dspk__backends[];
/* Every backend dspk knows, built into this binary or not, NULL-terminated
 * (backends/registry.c): the daemon takes the names it reports as "not
 * built into this dspkd" from here, never from a list of its own. */
extern const char *const dspk__known_backends[];

#endif /* DSPK_BACKENDS_BACKEND_H */
