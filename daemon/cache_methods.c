/*
 * The cache methods of docs/protocol.md: cache.stats (what the persistent
 * cache holds and how it was used since the daemon started) and
 * cache.clear (delete entries of some kinds; admins only: root, the
 * daemon's own user, admin_users/admin_groups, by the peer credentials the
 * connection recorded: dspkd_admin_is).
 *
 * Both calls take the cache's mutex and may wait for another process's
 * lock on the file (100 ms at most: another daemon sharing the file may be
 * writing), so they run on libuv's
 * thread pool (uv_queue_work), never on the loop thread.  The connection is
 * referenced while the work is out; when it closed meanwhile the answer is
 * dropped.  The loop does not end while a work request is pending, so the
 * cache (closed after the loop) outlives every call; only an exit() from
 * elsewhere (daemon/teardown.c closes the cache in its exit handler) could
 * race a call in flight, as it races the runners.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/admin.h"
#include "daemon/dspkd.h"
#include "daemon/log.h"

#include "cache/cache.h"

struct cwork {
  uv_work_t w;
  struct conn *c;
  struct dspk__cache *cache;
  uint32_t msgid;
  bool clear;         /* cache.clear, else cache.stats */
  unsigned mask;      /* clear: DSPK__CACHE_MASK bits */
  int err;
  char why[256]; /* clear: what failed in the database, and SQLite's reason */
  struct dspk__cache_stats st;
};

static void work_cb(uv_work_t *w) {
  struct cwork *cw = w->data;
  if (cw->clear)
    cw->err = dspk__cache_clear(cw->cache, cw->mask, cw->why, sizeof cw->why);
  else
    cw->err = dspk__cache_stats(cw->cache, &cw->st);
}

/* cache.stats' kinds: per kind of entry its counters. */
static void pack_kinds(const void *ud, struct dspk__wbuf *w) {
  const struct dspk__cache_stats *s = ud;
  msgpack_pack_map(&w->pk, DSPK__CACHE_NKINDS);
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    const struct dspk__cache_kstats *ks = &s->kind[k];
    struct dspk__pval v[DSPK__CK_COUNT];
    v[DSPK__CK_ENTRIES] = dspk__pv_uint(ks->entries);
    v[DSPK__CK_BYTES] = dspk__pv_uint(ks->bytes);
    v[DSPK__CK_STORED_HITS] = dspk__pv_uint(ks->stored_hits);
    v[DSPK__CK_HITS] = dspk__pv_uint(ks->hits);
    v[DSPK__CK_MISSES] = dspk__pv_uint(ks->misses);
    v[DSPK__CK_PUTS] = dspk__pv_uint(ks->puts);
    v[DSPK__CK_EVICTIONS] = dspk__pv_uint(ks->evictions);
    v[DSPK__CK_PUT_ERRORS] = dspk__pv_uint(ks->put_errors);
    dspk__pack_str(&w->pk, dspk__cache_kind_name(k));
    dspk__map_encode(w, dspk__cache_kind_f, DSPK__CK_COUNT, v);
  }
}

/* cache.clear's cleared: the names of the kinds of mask. */
static void pack_cleared(const void *ud, struct dspk__wbuf *w) {
  unsigned mask = *(const unsigned *)ud;
  int n = 0;
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++)
    n += (mask & DSPK__CACHE_MASK(k)) != 0;
  msgpack_pack_array(&w->pk, (size_t)n);
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++)
    if (mask & DSPK__CACHE_MASK(k))
      dspk__pack_str(&w->pk, dspk__cache_kind_name(k));
}

/* The call's result (NULL when out of memory). */
static struct wreq *result(const struct cwork *cw) {
  struct dspk__pval v[5];
  if (cw->clear) {
    v[DSPK__R_CCLEAR_CLEARED] = dspk__pv_pack(pack_cleared, &cw->mask);
    return dspkd_result(cw->msgid, DSPK__M_CACHE_CLEAR, v);
  }
  v[DSPK__R_CSTATS_PATH] = dspk__pv_str(dspk__cache_path(cw->cache));
  v[DSPK__R_CSTATS_IN_MEMORY] = dspk__pv_bool(cw->st.in_memory);
  v[DSPK__R_CSTATS_MAX_BYTES] = dspk__pv_uint(cw->st.max_bytes);
  v[DSPK__R_CSTATS_FILE_BYTES] = dspk__pv_uint(cw->st.file_bytes);
  v[DSPK__R_CSTATS_KINDS] = dspk__pv_pack(pack_kinds, &cw->st);
  return dspkd_result(cw->msgid, DSPK__M_CACHE_STATS, v);
}

/* Loop thread: answers the call (unless its connection closed meanwhile). */
static void after_cb(uv_work_t *w, int status) {
  struct cwork *cw = w->data;
  struct conn *c = cw->c;
  int err = status < 0 ? DSPK_ECANCELED : cw->err;

  if (cw->clear && err == 0)
    dspkd_info(DSPKD_PEER_FMT ": cache.clear: done (mask %u)", DSPKD_PEER_ARGS(c), cw->mask);
  /* A clear the database refused (a full disk, an I/O error): the cache
   * is not what the admin asked for, which the log says too. */
  if (cw->clear && err < 0 && err != DSPK_ECANCELED)
    dspkd_warn(DSPKD_PEER_FMT ": cache.clear failed: %s: %s%s%s; nothing was removed",
               DSPKD_PEER_ARGS(c), dspk__err_name(err),
               dspk__strerror(err), cw->why[0] ? ": " : "", cw->why);
  if (!c->closing) {
    if (err < 0) {
      char msg[400];
      snprintf(msg, sizeof msg, "%s: %s%s%s%s", cw->clear ? "cache.clear" : "cache.stats",
               dspk__strerror(err), cw->why[0] ? ": " : "", cw->why,
               cw->clear && err != DSPK_ECANCELED ? " (nothing was removed)" : "");
      dspkd_conn_send_error(c, cw->msgid, err, msg);
    } else {
      struct wreq *wr = result(cw);
      if (!wr)
        dspkd_conn_send_error(c, cw->msgid, DSPK_ENOMEM, "out of memory");
      else
        dspkd_conn_send(c, wr);
    }
  }
  struct dspkd *d = c->d;
  dspkd_conn_paid(c);
  free(cw);
  dspkd_stop_progress(d); /* a stop waits for this answer (lifecycle.c) */
}

/* Queues the call on the thread pool.  0, or a negative code for the
 * caller to answer. */
static int queue(struct req *r, bool clear, unsigned mask) {
  struct cwork *cw = calloc(1, sizeof *cw);
  int err;
  if (!cw)
    return DSPK_ENOMEM;
  cw->w.data = cw;
  cw->c = r->c;
  cw->cache = r->c->d->cache;
  cw->msgid = r->msgid;
  cw->clear = clear;
  cw->mask = mask;
  err = uv_queue_work(r->c->d->loop, &cw->w, work_cb, after_cb);
  if (err < 0) {
    free(cw);
    snprintf(r->msg, sizeof r->msg, "cannot queue the call: %s", uv_strerror(err));
    return DSPK_EIO;
  }
  dspkd_conn_owe(r->c);
  return 0;
}

static int no_cache(struct req *r) {
  snprintf(r->msg, sizeof r->msg, "the daemon runs without a cache (no_cache, --no-cache or --cache \"\")");
  return DSPK_ENOENT;
}

int dspkd_m_cache_stats(struct req *r) {
  if (!r->c->d->cache)
    return no_cache(r);
  return queue(r, false, 0);
}

int dspkd_m_cache_clear(struct req *r) {
  struct conn *c = r->c;
  unsigned mask = 0;

  /* The arguments were checked before (a malformed call says so whoever
   * sends it); bit i of the list is dspk__cache_kind_names[i]. */
  for (int k = 0; dspk__cache_kind_names[k]; k++)
    if (r->v[DSPK__CCLEAR_KINDS].v.mask & (1u << k))
      mask |= DSPK__CACHE_MASK(dspk__cache_kind_from_name(
          dspk__cache_kind_names[k], strlen(dspk__cache_kind_names[k])));
  if (!mask)
    mask = DSPK__CACHE_ALL;
  /* A non-admin was refused by dspkd_dispatch() (DSPK__ADMIN_AFTER_PARAMS). */
  if (!c->d->cache)
    return no_cache(r);
  return queue(r, true, mask);
}

