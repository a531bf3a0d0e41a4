/*
 * Daemon-side buffers: each connection's table of the buffers it created
 * (sorted by id, ids grow, so appending keeps the order), and the loop-side
 * refcount of a buffer.  The table holds one reference and every job that
 * uses the buffer holds one, so buffer.free or a disconnect while a task
 * still reads the buffer is safe: the last reference queues the release of
 * its device memory on the device's runner, which alone touches that memory.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/dspkd.h"
#include "daemon/sched.h"
#include "daemon/log.h"

static ssize_t find_index(const struct conn *c, uint64_t id) {
  size_t lo = 0, hi = c->nbufs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->bufs[mid]->id == id)
      return (ssize_t)mid;
    if (c->bufs[mid]->id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

struct dbuf *dspkd_conn_buf_find(struct conn *c, uint64_t id) {
  ssize_t i = find_index(c, id);
  return i < 0 ? NULL : c->bufs[i];
}

int dspkd_conn_buf_add(struct conn *c, struct dbuf *b) {
  size_t i;
  if (c->nbufs == c->capbufs) {
    size_t cap = c->capbufs ? 2 * c->capbufs : 16;
    struct dbuf **nb = realloc(c->bufs, cap * sizeof(*nb));
    if (!nb)
      return DSPK_ENOMEM;
    c->bufs = nb;
    c->capbufs = cap;
  }
  /* Ids grow, but a create that finished late may insert before others. */
  i = c->nbufs;
  while (i > 0 && c->bufs[i - 1]->id > b->id) {
    c->bufs[i] = c->bufs[i - 1];
    i--;
  }
  c->bufs[i] = b;
  c->nbufs++;
  c->buf_bytes += b->size;
  dspkd_quota_buf(c, b, 1);
  dspkd_dbuf_ref(b);
  return 0;
}

void dspkd_conn_buf_hold(struct conn *c, struct dbuf *b) {
  b->held_by = c;
  b->held_prev = NULL;
  if ((b->held_next = c->held_list) != NULL)
    c->held_list->held_prev = b;
  c->held_list = b;
  c->held_bufs++;
  c->held_bytes += b->size;
}

void dspkd_conn_buf_unhold(struct dbuf *b) {
  struct conn *c = b->held_by;
  if (!c)
    return;
  if (b->held_prev)
    b->held_prev->held_next = b->held_next;
  else
    c->held_list = b->held_next;
  if (b->held_next)
    b->held_next->held_prev = b->held_prev;
  b->held_prev = b->held_next = NULL;
  b->held_by = NULL;
  c->held_bufs--;
  c->held_bytes -= b->size;
  dspkd_quota_buf(c, b, -1);
}

struct dbuf *dspkd_conn_buf_remove(struct conn *c, uint64_t id) {
  ssize_t i = find_index(c, id);
  struct dbuf *b;
  if (i < 0)
    return NULL;
  b = c->bufs[i];
  memmove(&c->bufs[i], &c->bufs[i + 1], (c->nbufs - (size_t)i - 1) * sizeof(*c->bufs));
  c->nbufs--;
  c->buf_bytes -= b->size;
  /* Its memory stays charged to c until the last job that uses it lets go
   * (probe 16 A#1: freed under queued tasks, it was allocated but counted
   * by no quota). */
  dspkd_conn_buf_hold(c, b);
  return b; /* the caller drops the table's reference */
}

void dspkd_dbuf_ref(struct dbuf *b) { b->refs++; }

void dspkd_dbuf_unref(struct dspkd *d, struct dbuf *b) {
  struct job *j;
  if (!b || --b->refs > 0)
    return;
  /* Its connection counts it no more, in status nor in the quotas: its
   * memory goes to the runner now, which frees it before its next job. */
  dspkd_conn_buf_unhold(b);
  /* The memory belongs to the runner: it frees it and this struct, with
   * the job reserved at creation (found by tests/oom: a failed allocation
   * here leaked the buffer). */
  j = b->free_job;
  b->free_job = NULL;
  if (!j)
    j = dspkd_job_new(NULL, JOB_BUF_FREE, 0, b->dev);
  if (!j) {
    /* Without a job the memory cannot reach its runner: it is leaked (the
     * backend's close still releases it), never freed from this thread. */
    dspkd_error("out of memory: leaking buffer %llu until its device closes",
                (unsigned long long)b->id);
    return;
  }
  (void)d;
  j->buf = b;
  dspkd_sched_submit(j);
}
