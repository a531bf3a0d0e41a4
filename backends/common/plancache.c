/*
 * The LRU plan cache (see plancache.h).  Each entry keeps a 64-bit FNV-1a
 * hash of its key so the linear scan compares bytes only on a hash match,
 * and a use stamp from a counter; the victim is the smallest stamp.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/common/plancache.h"
#include "dspk/errors.h"

static uint64_t fnv1a(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

int dspk__plancache_init(struct dspk__plancache *c, unsigned cap,
                         dspk__plan_evict_fn evict, void *ud) {
  if (cap == 0)
    cap = DSPK__PLANCACHE_DEFAULT_CAPACITY;
  memset(c, 0, sizeof(*c));
  c->e = calloc(cap, sizeof(*c->e));
  if (!c->e)
    return DSPK_ENOMEM;
  c->cap = cap;
  c->evict = evict;
  c->ud = ud;
  return 0;
}

void *dspk__plancache_get(struct dspk__plancache *c, const void *key,
                          size_t keylen) {
  uint64_t h = fnv1a(key, keylen);
  for (unsigned i = 0; i < c->n; i++) {
    struct dspk__plancache_entry *e = &c->e[i];
    if (e->hash == h && e->keylen == keylen && memcmp(e->key, key, keylen) == 0) {
      e->stamp = ++c->tick;
      c->hits++;
      return e->plan;
    }
  }
  c->misses++;
  return NULL;
}

int dspk__plancache_put(struct dspk__plancache *c, const void *key,
                        size_t keylen, void *plan) {
  struct dspk__plancache_entry *e;
  if (keylen > DSPK__PLANCACHE_KEY_MAX)
    return DSPK_ELIMIT;
  if (c->n < c->cap) {
    e = &c->e[c->n++];
  } else {
    e = &c->e[0];
    for (unsigned i = 1; i < c->n; i++)
      if (c->e[i].stamp < e->stamp)
        e = &c->e[i];
    c->evictions++;
    if (c->evict)
      c->evict(c->ud, e->plan);
  }
  memcpy(e->key, key, keylen);
  e->keylen = keylen;
  e->hash = fnv1a(key, keylen);
  e->stamp = ++c->tick;
  e->plan = plan;
  return 0;
}

void dspk__plancache_clear(struct dspk__plancache *c) {
  for (unsigned i = 0; i < c->n; i++)
    if (c->evict)
      c->evict(c->ud, c->e[i].plan);
  c->n = 0;
}

void dspk__plancache_fini(struct dspk__plancache *c) {
  if (!c || !c->e)
    return;
  dspk__plancache_clear(c);
  free(c->e);
  c->e = NULL;
}
