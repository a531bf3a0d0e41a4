/*
 * A caching device-memory pool over a backend's raw alloc/free (cuMemAlloc,
 * vkAllocateMemory, hipMalloc), shared by the GPU backends.  Requests are
 * rounded up to size buckets (four per power of two, at least 512 bytes);
 * blocks given back stay cached in their bucket's free list for the next
 * request of that bucket, up to max_cached bytes.  When the raw allocator
 * runs out of memory, the cache is emptied and the allocation retried once.
 *
 * The pool never waits for the device: a block must be put back only once
 * the device is done with it, which is what the retirement queue
 * (retire.h) ensures.  Not thread-safe: one pool per device, used on its
 * runner thread.
 */
#ifndef DSPK_BACKENDS_COMMON_POOL_H
#define DSPK_BACKENDS_COMMON_POOL_H

#include <stddef.h>
#include <stdint.h>

#define DSPK__POOL_MIN_BLOCK 512u
#define DSPK__POOL_NBUCKETS 256

struct dspk__devstats;

/* The raw allocator.  alloc writes a handle (a device address, or a pointer
 * cast to an integer) of at least n bytes and returns 0, DSPK_ENOMEM when
 * the device is out of memory, or another negative dspk_errno. */
struct dspk__pool_ops {
  int (*alloc)(void *ud, size_t n, uint64_t *handle);
  void (*free)(void *ud, uint64_t handle);
};

struct dspk__pool_block {
  uint64_t handle;
  size_t size; /* the bucket's size: usable bytes */
  unsigned bucket;
  struct dspk__pool_block *next; /* free list link while cached */
};

struct dspk__pool_stats {
  uint64_t bytes_in_use, bytes_cached, hits, misses, raw_allocs, raw_frees,
      trims;
};

struct dspk__pool {
  const struct dspk__pool_ops *ops;
  void *ud;
  size_t max_cached;
  struct dspk__pool_block *cached[DSPK__POOL_NBUCKETS];
  struct dspk__pool_stats st;
};

/* Initialises p.  ops and ud are borrowed.  max_cached bounds the bytes kept
 * in free lists (0: no bound). */
void dspk__pool_init(struct dspk__pool *p, const struct dspk__pool_ops *ops,
                     void *ud, size_t max_cached);

/* The bucket size a request of n bytes is rounded to. */
size_t dspk__pool_round(size_t n);

/* Writes a block of at least n bytes (cached when one is, otherwise fresh
 * from the raw allocator) and returns 0, or the raw allocator's error.  The
 * caller owns the block until dspk__pool_put(). */
int dspk__pool_get(struct dspk__pool *p, size_t n,
                   struct dspk__pool_block **out);

/* Gives a block back (the device must be done with it): cached, or freed
 * when the cache is full.  Accepts NULL.  Usable as a retirement release
 * function: dspk__pool_put_cb(pool, block). */
void dspk__pool_put(struct dspk__pool *p, struct dspk__pool_block *b);
void dspk__pool_put_cb(void *pool, void *block);
/* 1 when dspk__pool_get(p, n) would be answered from the cache. */
int dspk__pool_has_cached(const struct dspk__pool *p, size_t n);

/* Frees every cached block through the raw allocator. */
void dspk__pool_trim(struct dspk__pool *p);

/* Trims.  Blocks still in use stay the caller's (the counter says how many
 * bytes); their memory usually goes with the device context. */
void dspk__pool_fini(struct dspk__pool *p);

/* Copies the counters into the pool_* fields of a struct dspk__devstats. */
void dspk__pool_stats_fill(const struct dspk__pool *p,
                           struct dspk__devstats *out);

#endif /* DSPK_BACKENDS_COMMON_POOL_H */
