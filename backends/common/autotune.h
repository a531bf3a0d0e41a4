/*
 * The autotune framework shared by every backend: an op declares its
 * candidates (names and a run function) and a key (op, shape class, dtypes,
 * layout, device identity; the hash of the candidate-name list is added
 * here), and dspk__autotune_choose() returns the winner.
 *
 * A decision is looked up in an in-process memo, then in the persistent
 * cache (cache/cache.h); on a miss the calling runner thread benchmarks
 * the candidates (warm-up runs, several timed samples, the median; a
 * candidate whose fastest sample is far slower than the best median so far
 * is cut early), stores every timing and the winner, and returns it.
 * Concurrent requests for the same key tune once: the others wait for the
 * result (a process-wide table keyed by the key hash).  A winner that fails
 * at launch is reported with dspk__autotune_failed(): it is excluded for
 * this key in this process, the stored decision is dropped, and the next
 * dspk__autotune_choose() re-tunes among the remaining candidates.
 *
 * Typical use on a runner thread:
 *
 *   for (;;) {
 *     int w, rc = dspk__autotune_choose(cache, &req, NULL, &w, NULL);
 *     if (rc < 0) return rc;
 *     rc = cands[w].run(ud, w);                  // the real launch
 *     if (rc == 0 || rc == DSPK_ECANCELED) return rc;
 *     dspk__autotune_failed(cache, &req, w);      // fall back, re-tune
 *   }
 */
#ifndef DSPK_BACKENDS_COMMON_AUTOTUNE_H
#define DSPK_BACKENDS_COMMON_AUTOTUNE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"

#define DSPK__AUTOTUNE_MAX_CANDS 64

/* One way of doing the op. */
struct dspk__autotune_cand {
  const char *name; /* unique in the list; stored as the winner */
  /* Runs candidate `index` once, to completion (a GPU candidate waits for
   * its work), on the calling thread.  Returns 0, or a negative dspk_errno:
   * a failing candidate is left out of this tuning. */
  int (*run)(void *ud, int index);
};

/* What to choose for.  Every string is part of the key (NULL differs from
 * ""); nothing is kept after the call returns. */
struct dspk__autotune_req {
  const char *op;     /* "fir" */
  const char *shape;  /* shape class, e.g. from dspk__autotune_pow2() */
  const char *dtypes; /* "f32" */
  const char *layout; /* "" when irrelevant */
  struct dspk__cache_devid dev;
  const struct dspk__autotune_cand *cands;
  int ncands; /* 1..DSPK__AUTOTUNE_MAX_CANDS */
  void *ud;   /* passed to each run */
  /* Optional: progress of a tuning in [0, 1], with what = "autotune <op>"
   * (the opctx's progress callback fits). */
  void (*progress)(void *ud, const char *what, double fraction);
  void *progress_ud;
  /* Optional: set by another thread to stop a tuning or a wait early. */
  atomic_int *cancel;
  /* Optional: the outcome of the last candidate run of this call, 1 when it
   * returned 0 and 0 when it failed (left as it was when none ran).  A
   * caller whose every run is the whole op on the task's own operands,
   * waited for, has the op's complete result in its outputs when this is 1
   * after DSPK_ECANCELED: the task then answers with it (protocol.md,
   * task.cancel: ECANCELED only for work that stopped). */
  int *ran_ok;
  /* Optional: the time of the run of candidate `index` that has just
   * returned 0, as the candidate measured it itself (a GPU's timestamps
   * around its work: what a wait adds to the clock's time varies more than
   * the paths differ), in ns.  Returns 0, or nonzero when that run has no
   * such time: its sample is then the clock's time around run(). */
  int (*ran_ns)(void *ud, int index, uint64_t *ns);
  /* Optional (prefer_margin > 0): candidate `prefer` wins unless another
   * one's median is faster by more than that share (0.1: 10%), so that a
   * choice between near equals is not made by noise. */
  int prefer;
  double prefer_margin;
};

/* Benchmark settings; NULL or 0 fields take the defaults. */
struct dspk__autotune_opts {
  int warmup;       /* untimed runs per candidate (default 1; <0: none) */
  int samples;      /* timed runs per candidate (default 5) */
  double cut_ratio; /* cut when the fastest sample > ratio x best (4.0) */
  /* Interleaved (> 0): rounds in which each candidate in turn runs its
   * warm-up and then this many timed runs (each round starting one
   * candidate later than the last), until each has its samples; no early
   * cut.  A while of load on the machine then falls on every candidate
   * alike instead of on the one measured then.  For candidates of a
   * millisecond or so, whose samples a moment of load easily decides. */
  int interleave;
  /* Clock in nanoseconds; default CLOCK_MONOTONIC.  Tests inject a fake. */
  uint64_t (*now_ns)(void *clock_ud);
  void *clock_ud;
};

/* How dspk__autotune_choose() found its answer. */
enum dspk__autotune_how {
  DSPK__AUTOTUNE_MEMO,   /* the in-process memo */
  DSPK__AUTOTUNE_CACHE,  /* the persistent cache */
  DSPK__AUTOTUNE_TUNED,  /* this call benchmarked */
  DSPK__AUTOTUNE_WAITED  /* another thread benchmarked; this one waited */
};

/*
 * Returns 0 and writes the winner's index into *winner (and how it was
 * found into *how, which may be NULL), or a negative dspk_errno:
 * DSPK_EINVAL for a bad request, DSPK_ECANCELED when *cancel was set, or
 * the error of the candidates when every remaining one failed (DSPK_ENOENT
 * when all were excluded by dspk__autotune_failed).  cache may be NULL
 * (the decision then lives in the process only).
 */
int dspk__autotune_choose(struct dspk__cache *cache,
                          const struct dspk__autotune_req *req,
                          const struct dspk__autotune_opts *opts, int *winner,
                          enum dspk__autotune_how *how);

/* The decision dspk__autotune_choose() would take from the in-process memo
 * now, without a look in the cache and without tuning: 0 and *winner, or
 * DSPK_ENOENT (not decided in this process yet, or being tuned).  Any
 * thread; req's run functions are not called. */
int dspk__autotune_peek(struct dspk__cache *cache, const struct dspk__autotune_req *req,
                        int *winner);

/* Reports that candidate `failed` (an index) failed at launch for this key:
 * excludes it in this process, drops the stored decision, so that the next
 * dspk__autotune_choose() re-tunes.  Returns 0 or a negative dspk_errno. */
int dspk__autotune_failed(struct dspk__cache *cache,
                          const struct dspk__autotune_req *req, int failed);

/* The hash of the candidate-name list (order matters), part of the key. */
uint64_t dspk__autotune_cands_hash(const struct dspk__autotune_cand *cands,
                                   int ncands);

/* Shape-class helper: the exponent of the smallest power of two >= n
 * (0 for n <= 1).  Use "n=2^%d" where sizes may be bucketed and the exact
 * size where it decides the choice. */
int dspk__autotune_pow2(uint64_t n);

/* Forgets every in-process decision and exclusion (tests; a daemon does
 * not need it: clearing the cache's decisions changes its epoch).  Must not
 * be called while a tuning is in progress. */
void dspk__autotune_forget_all(void);

#endif /* DSPK_BACKENDS_COMMON_AUTOTUNE_H */
