/*
 * The caching size-bucket pool (see pool.h).  Bucket b covers sizes
 * 2^k * (1 + j/4) for b = 4k + j, so rounding wastes at most 25%; block
 * records live on the host heap and carry their bucket, so a put needs no
 * lookup.
 */
#include <stdlib.h>

#include "backends/backend.h"
#include "backends/common/pool.h"
#include "dspk/errors.h"

/* Bucket index and size for n bytes. */
static unsigned bucket_of(size_t n, size_t *size) {
  unsigned k = 0, j;
  size_t base, step;
  if (n <= DSPK__POOL_MIN_BLOCK)
    n = DSPK__POOL_MIN_BLOCK;
  while (k < 63 && ((size_t)1 << (k + 1)) <= n)
    k++;
  base = (size_t)1 << k;
  step = base / 4;
  j = (unsigned)((n - base + step - 1) / step);
  if (j == 4) {
    k++;
    j = 0;
    base <<= 1;
    step <<= 1;
  }
  *size = base + j * step;
  return 4 * k + j;
}

size_t dspk__pool_round(size_t n) {
  size_t s;
  bucket_of(n, &s);
  return s;
}

void dspk__pool_init(struct dspk__pool *p, const struct dspk__pool_ops *ops,
                     void *ud, size_t max_cached) {
  *p = (struct dspk__pool){0};
  p->ops = ops;
  p->ud = ud;
  p->max_cached = max_cached;
}

static void raw_free(struct dspk__pool *p, struct dspk__pool_block *b) {
  p->ops->free(p->ud, b->handle);
  p->st.raw_frees++;
  free(b);
}

int dspk__pool_has_cached(const struct dspk__pool *p, size_t n) {
  size_t size;
  unsigned bk = bucket_of(n, &size);
  return bk < DSPK__POOL_NBUCKETS && size >= n && p->cached[bk] != NULL;
}

int dspk__pool_get(struct dspk__pool *p, size_t n,
                   struct dspk__pool_block **out) {
  size_t size;
  unsigned bk = bucket_of(n, &size);
  struct dspk__pool_block *b;
  uint64_t h;
  int rc;
  if (bk >= DSPK__POOL_NBUCKETS || size < n)
    return DSPK_ENOMEM;
  b = p->cached[bk];
  if (b) {
    p->cached[bk] = b->next;
    b->next = NULL;
    p->st.bytes_cached -= b->size;
    p->st.bytes_in_use += b->size;
    p->st.hits++;
    *out = b;
    return 0;
  }
  b = calloc(1, sizeof(*b));
  if (!b)
    return DSPK_ENOMEM;
  rc = p->ops->alloc(p->ud, size, &h);
  if (rc == DSPK_ENOMEM && p->st.bytes_cached > 0) {
    dspk__pool_trim(p);
    rc = p->ops->alloc(p->ud, size, &h);
  }
  if (rc != 0) {
    free(b);
    return rc;
  }
  p->st.raw_allocs++;
  p->st.misses++;
  b->handle = h;
  b->size = size;
  b->bucket = bk;
  p->st.bytes_in_use += size;
  *out = b;
  return 0;
}

void dspk__pool_put(struct dspk__pool *p, struct dspk__pool_block *b) {
  if (!b)
    return;
  p->st.bytes_in_use -= b->size;
  if (p->max_cached && p->st.bytes_cached + b->size > p->max_cached) {
    raw_free(p, b);
    return;
  }
  b->next = p->cached[b->bucket];
  p->cached[b->bucket] = b;
  p->st.bytes_cached += b->size;
}

void dspk__pool_put_cb(void *pool, void *block) {
  dspk__pool_put(pool, block);
}

void dspk__pool_trim(struct dspk__pool *p) {
  for (unsigned i = 0; i < DSPK__POOL_NBUCKETS; i++) {
    while (p->cached[i]) {
      struct dspk__pool_block *b = p->cached[i];
      p->cached[i] = b->next;
      p->st.bytes_cached -= b->size;
      raw_free(p, b);
    }
  }
  p->st.trims++;
}

void dspk__pool_fini(struct dspk__pool *p) {
  if (!p || !p->ops)
    return;
  dspk__pool_trim(p);
}

void dspk__pool_stats_fill(const struct dspk__pool *p,
                           struct dspk__devstats *out) {
  out->pool_bytes_in_use = p->st.bytes_in_use;
  out->pool_bytes_cached = p->st.bytes_cached;
  out->pool_hits = p->st.hits;
  out->pool_misses = p->st.misses;
}
