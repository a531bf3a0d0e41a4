/*
 * The retirement queue of DESIGN.md, shared by every GPU backend: memory (or
 * any other resource: a workspace, an FFT plan) that the device may still be
 * using is handed to the queue together with a fence recorded behind the work
 * enqueued so far, and is released only once that fence has been reached.
 * The stream is never drained to free memory, except as a fallback.
 *
 * Rules:
 *  - bounded (capacity, default 16 entries);
 *  - dspk__retire_drain() (call it before allocations and on sync) queries
 *    the fences, oldest first, and releases every entry whose fence was
 *    reached, stopping at the first that was not: fences must complete in
 *    the order they were recorded (one stream or queue per device);
 *  - at capacity, dspk__retire_push() first waits on the oldest fence;
 *  - when no fence can be recorded (or a wait/query fails) the queue falls
 *    back to a barrier (stream synchronize) and then releases;
 *  - when even the barrier fails, the resource is leaked and counted, never
 *    released early.
 *
 * The queue is backend-neutral: fences come from a small vtable
 * (struct dspk__retire_ops), which the CUDA backend fills with events, Vulkan
 * with timeline-semaphore values and the unit tests with a fake.  Not
 * thread-safe: a queue belongs to one device and is used on its runner thread.
 */
#ifndef DSPK_BACKENDS_COMMON_RETIRE_H
#define DSPK_BACKENDS_COMMON_RETIRE_H

#include <stddef.h>
#include <stdint.h>

#define DSPK__RETIRE_DEFAULT_CAPACITY 16

struct dspk__devstats;

/* Fences, as the device provides them.  ud is the queue's user data.
 * record: writes a new fence behind all work enqueued so far; 0 or negative.
 * query:  1 reached, 0 not yet, negative on error.
 * wait:   blocks until reached; 0 or negative.
 * destroy: frees a fence (reached or not); may be NULL.
 * barrier: waits for all work of the device (stream synchronize); 0 or
 *          negative.  May be NULL: no barrier, the fallback leaks. */
struct dspk__retire_ops {
  int (*record)(void *ud, void **fence);
  int (*query)(void *ud, void *fence);
  int (*wait)(void *ud, void *fence);
  void (*destroy)(void *ud, void *fence);
  int (*barrier)(void *ud);
};

/* What to do with a resource once the device is done with it. */
typedef void (*dspk__retire_release_fn)(void *release_ud, void *res);

struct dspk__retire_entry {
  void *fence;
  dspk__retire_release_fn release;
  void *release_ud;
  void *res;
};

struct dspk__retire_stats {
  uint64_t deferred;          /* entries queued behind a fence */
  uint64_t released;          /* resources released (any path) */
  uint64_t barrier_fallbacks; /* barriers taken instead of fences */
  uint64_t leaked;            /* resources never released */
  uint64_t in_flight;         /* entries queued now */
  uint64_t max_in_flight;     /* most entries ever queued at once */
};

struct dspk__retire {
  const struct dspk__retire_ops *ops;
  void *ud;
  struct dspk__retire_entry *q; /* FIFO, oldest first */
  unsigned cap, n;
  struct dspk__retire_stats st;
};

/* Initialises q with capacity cap entries (0: the default, 16).  ops and ud
 * are borrowed and must outlive q.  Returns 0 or DSPK_ENOMEM. */
int dspk__retire_init(struct dspk__retire *q, const struct dspk__retire_ops *ops,
                      void *ud, unsigned cap);

/* Hands res to the queue: release(release_ud, res) is called once all work
 * enqueued before this call has finished (possibly before this returns, on
 * the barrier path).  At capacity, waits on the oldest fence first.  Returns
 * 0 when res was queued or released, DSPK_EDEVICE when it had to be leaked
 * (the leak is counted); res belongs to the queue either way. */
int dspk__retire_push(struct dspk__retire *q, dspk__retire_release_fn release,
                      void *release_ud, void *res);

/* Releases, oldest first and without waiting, the entries whose fences
 * were reached, up to the first that was not.  Returns the number released
 * (>= 0). */
int dspk__retire_drain(struct dspk__retire *q);

/* Waits on every queued fence, oldest first, and releases everything.
 * Returns 0, or DSPK_EDEVICE when something had to be leaked. */
int dspk__retire_sync(struct dspk__retire *q);

/* Releases every entry at once without waiting: only for a device whose
 * context was destroyed (a fault), so nothing can still use the resources.
 * Counted as released. */
void dspk__retire_abandon(struct dspk__retire *q);

/* Syncs (as dspk__retire_sync) and frees q's storage.  Accepts a queue that
 * was never initialised only if it was zeroed. */
void dspk__retire_fini(struct dspk__retire *q);

/* Copies the counters into the retire_* fields of a struct dspk__devstats. */
void dspk__retire_stats_fill(const struct dspk__retire *q,
                             struct dspk__devstats *out);

#endif /* DSPK_BACKENDS_COMMON_RETIRE_H */
