/*
 * An LRU cache of plans (cuFFT plans, contraction plans with their
 * workspaces, Vulkan pipelines), shared by the GPU backends.  Keys are byte
 * strings the backend builds from what defines a plan (subscripts, shapes,
 * strides, dtype).  When the cache is full, the least recently used plan is
 * evicted through the backend's evict callback, which must not wait for the
 * device: it hands the plan's workspaces to the retirement queue (retire.h).
 *
 * Capacities are small (tens of plans), so lookup is a linear scan over a
 * fixed array.  Not thread-safe: one cache per device, runner thread only.
 */
#ifndef DSPK_BACKENDS_COMMON_PLANCACHE_H
#define DSPK_BACKENDS_COMMON_PLANCACHE_H

#include <stddef.h>
#include <stdint.h>

#define DSPK__PLANCACHE_KEY_MAX 256
#define DSPK__PLANCACHE_DEFAULT_CAPACITY 16

typedef void (*dspk__plan_evict_fn)(void *ud, void *plan);

struct dspk__plancache_entry {
  uint8_t key[DSPK__PLANCACHE_KEY_MAX];
  size_t keylen;
  uint64_t hash, stamp;
  void *plan;
};

struct dspk__plancache {
  struct dspk__plancache_entry *e;
  unsigned cap, n;
  uint64_t tick;
  dspk__plan_evict_fn evict;
  void *ud;
  uint64_t hits, misses, evictions;
};

/* Initialises c with room for cap plans (0: 16).  evict(ud, plan) is called
 * for each plan pushed out (LRU order) or cleared.  Returns 0 or
 * DSPK_ENOMEM. */
int dspk__plancache_init(struct dspk__plancache *c, unsigned cap,
                         dspk__plan_evict_fn evict, void *ud);

/* Returns the plan stored under key (and marks it most recently used), or
 * NULL.  Counts a hit or a miss. */
void *dspk__plancache_get(struct dspk__plancache *c, const void *key,
                          size_t keylen);

/* Stores plan under key (the cache owns it from now on), evicting the least
 * recently used plan when full.  Returns 0, or DSPK_ELIMIT when the key is
 * longer than DSPK__PLANCACHE_KEY_MAX (the plan stays the caller's). */
int dspk__plancache_put(struct dspk__plancache *c, const void *key,
                        size_t keylen, void *plan);

/* Evicts every plan. */
void dspk__plancache_clear(struct dspk__plancache *c);

/* Clears and frees c's storage.  Accepts a zeroed cache. */
void dspk__plancache_fini(struct dspk__plancache *c);

#endif /* DSPK_BACKENDS_COMMON_PLANCACHE_H */
