/*
 * The retirement queue (see retire.h): a small FIFO of (fence, resource)
 * pairs.  Entries leave the queue when their fence is reached (drain, sync,
 * or a wait at capacity), through a barrier when fences fail, or as counted
 * leaks when the barrier fails too.  Capacity is small (16 by default), so
 * the FIFO is a plain array that is compacted in place.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/common/retire.h"
#include "dspk/errors.h"

static void fence_destroy(struct dspk__retire *q, void *fence) {
  if (fence && q->ops->destroy)
    q->ops->destroy(q->ud, fence);
}

static void release_entry(struct dspk__retire *q, struct dspk__retire_entry *e) {
  fence_destroy(q, e->fence);
  if (e->release)
    e->release(e->release_ud, e->res);
  q->st.released++;
}

static void update_in_flight(struct dspk__retire *q) {
  q->st.in_flight = q->n;
  if (q->n > q->st.max_in_flight)
    q->st.max_in_flight = q->n;
}

/* Takes a barrier; returns 0 when the device is known idle afterwards. */
static int barrier(struct dspk__retire *q) {
  if (!q->ops->barrier || q->ops->barrier(q->ud) != 0)
    return DSPK_EDEVICE;
  q->st.barrier_fallbacks++;
  return 0;
}

/* Fences can no longer be trusted: empty the whole queue through a barrier,
 * or leak everything in it when the barrier fails.  Returns 0 or
 * DSPK_EDEVICE (something leaked). */
static int fallback_all(struct dspk__retire *q) {
  int rc = 0;
  if (q->n == 0)
    return 0;
  if (barrier(q) == 0) {
    for (unsigned i = 0; i < q->n; i++)
      release_entry(q, &q->q[i]);
  } else {
    for (unsigned i = 0; i < q->n; i++)
      fence_destroy(q, q->q[i].fence);
    q->st.leaked += q->n;
    rc = DSPK_EDEVICE;
  }
  q->n = 0;
  update_in_flight(q);
  return rc;
}

int dspk__retire_init(struct dspk__retire *q, const struct dspk__retire_ops *ops,
                      void *ud, unsigned cap) {
  struct dspk__retire_entry *e;
  if (cap == 0)
    cap = DSPK__RETIRE_DEFAULT_CAPACITY;
  e = calloc(cap, sizeof(*e));
  if (!e)
    return DSPK_ENOMEM;
  memset(q, 0, sizeof(*q));
  q->ops = ops;
  q->ud = ud;
  q->q = e;
  q->cap = cap;
  return 0;
}

int dspk__retire_drain(struct dspk__retire *q) {
  unsigned done = 0;
  int released = 0;
  /* Fences complete in the order they were recorded (one stream or queue
   * per device), so the first one not reached ends the scan: a drain costs
   * one query when nothing finished. */
  while (done < q->n) {
    int r = q->ops->query(q->ud, q->q[done].fence);
    if (r < 0) {
      uint64_t before = q->st.released;
      memmove(&q->q[0], &q->q[done], (q->n - done) * sizeof(q->q[0]));
      q->n -= done;
      fallback_all(q);
      return released + (int)(q->st.released - before);
    }
    if (r == 0)
      break;
    release_entry(q, &q->q[done]);
    released++;
    done++;
  }
  if (done) {
    q->n -= done;
    memmove(&q->q[0], &q->q[done], q->n * sizeof(q->q[0]));
  }
  update_in_flight(q);
  return released;
}

/* Waits on the oldest entry and releases it; on a failed wait, empties the
 * queue through the fallback. */
static int retire_oldest(struct dspk__retire *q) {
  if (q->n == 0)
    return 0;
  if (q->ops->wait(q->ud, q->q[0].fence) != 0)
    return fallback_all(q);
  release_entry(q, &q->q[0]);
  q->n--;
  memmove(&q->q[0], &q->q[1], q->n * sizeof(q->q[0]));
  update_in_flight(q);
  return 0;
}

int dspk__retire_push(struct dspk__retire *q, dspk__retire_release_fn release,
                      void *release_ud, void *res) {
  void *fence = NULL;
  dspk__retire_drain(q);
  if (q->n == q->cap)
    retire_oldest(q);
  if (q->ops->record(q->ud, &fence) == 0) {
    struct dspk__retire_entry *e = &q->q[q->n++];
    e->fence = fence;
    e->release = release;
    e->release_ud = release_ud;
    e->res = res;
    q->st.deferred++;
    update_in_flight(q);
    return 0;
  }
  /* No fence: a barrier makes the device idle, so this resource and every
   * queued one can go now. */
  if (barrier(q) == 0) {
    for (unsigned i = 0; i < q->n; i++)
      release_entry(q, &q->q[i]);
    q->n = 0;
    update_in_flight(q);
    if (release)
      release(release_ud, res);
    q->st.released++;
    return 0;
  }
  q->st.leaked++;
  return DSPK_EDEVICE;
}

int dspk__retire_sync(struct dspk__retire *q) {
  uint64_t leaked = q->st.leaked;
  while (q->n > 0)
    retire_oldest(q);
  return q->st.leaked != leaked ? DSPK_EDEVICE : 0;
}

void dspk__retire_abandon(struct dspk__retire *q) {
  for (unsigned i = 0; i < q->n; i++)
    release_entry(q, &q->q[i]);
  q->n = 0;
  update_in_flight(q);
}

void dspk__retire_fini(struct dspk__retire *q) {
  if (!q || !q->q)
    return;
  dspk__retire_sync(q);
  free(q->q);
  q->q = NULL;
  q->cap = 0;
}

void dspk__retire_stats_fill(const struct dspk__retire *q,
                             struct dspk__devstats *out) {
  out->retire_deferred = q->st.deferred;
  out->retire_released = q->st.released;
  out->retire_barrier_fallbacks = q->st.barrier_fallbacks;
  out->retire_leaked = q->st.leaked;
  out->retire_in_flight = q->st.in_flight;
  out->retire_max_in_flight = q->st.max_in_flight;
}
