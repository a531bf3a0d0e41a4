/*
 * The autotune framework (see autotune.h): a process-wide table of
 * decisions keyed by the hash of the tuning key, guarded by one mutex, with
 * one condition variable per entry for single-flight tuning; the benchmark
 * loop (warm-up, samples, median, early cut); and the JSON record of every
 * timing stored with the winner in the persistent cache.
 *
 * An entry's epoch ties it to one open cache and one generation of its
 * decisions (dspk__cache_epoch): after `cache clear --autotune` the memo
 * no longer answers and the key is looked up (and tuned) again.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/common/autotune.h"

#define DEFAULT_WARMUP 1
#define DEFAULT_SAMPLES 5
#define DEFAULT_CUT 4.0
#define MAX_SAMPLES 64
#define TABLE_BUCKETS 256
#define TABLE_MAX_ENTRIES 4096
/* Waiters re-check their cancel flag this often (ns): a task waiting for
 * another's tuning sees its cancel within 20 ms, as one waiting for an
 * FFTW plan (docs/protocol.md, task.cancel). */
#define WAIT_SLICE_NS 20000000L

enum state { ST_EMPTY, ST_TUNING, ST_DONE };

struct entry {
  struct entry *next;
  struct dspk__hash key;
  uint64_t epoch;
  enum state state;
  int winner;
  uint64_t excluded; /* candidates that failed at launch */
  int users;         /* threads inside choose() holding this entry */
  pthread_cond_t cv;
};

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table[TABLE_BUCKETS];
static int table_count;

/* ---- keys ------------------------------------------------------------------- */

/* See autotune.h. */
uint64_t dspk__autotune_cands_hash(const struct dspk__autotune_cand *cands,
                                   int ncands) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_u64(&h, (uint64_t)(ncands > 0 ? ncands : 0));
  for (int i = 0; i < ncands; i++)
    dspk__hash_str(&h, cands[i].name);
  return h.hi ^ h.lo;
}

/* See autotune.h. */
int dspk__autotune_pow2(uint64_t n) {
  int e = 0;
  while (e < 64 && (UINT64_C(1) << e) < n)
    e++;
  return e;
}

static int valid(const struct dspk__autotune_req *r);

static void make_tune_key(const struct dspk__autotune_req *r,
                          struct dspk__tune_key *k) {
  k->dev = r->dev;
  k->op = r->op;
  k->shape = r->shape;
  k->dtypes = r->dtypes;
  k->layout = r->layout;
  k->cands_hash = dspk__autotune_cands_hash(r->cands, r->ncands);
}

static struct dspk__hash table_key(const struct dspk__tune_key *k) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_str(&h, k->dev.backend);
  dspk__hash_str(&h, k->dev.name);
  dspk__hash_str(&h, k->dev.arch);
  dspk__hash_str(&h, k->dev.uuid);
  dspk__hash_str(&h, k->dev.driver);
  dspk__hash_str(&h, k->op);
  dspk__hash_str(&h, k->shape);
  dspk__hash_str(&h, k->dtypes);
  dspk__hash_str(&h, k->layout);
  dspk__hash_u64(&h, k->cands_hash);
  return h;
}

/* ---- the table (table_mu held) -------------------------------------------- */

static void drop_idle_entries(void) {
  for (int b = 0; b < TABLE_BUCKETS; b++) {
    struct entry **pp = &table[b];
    while (*pp) {
      struct entry *e = *pp;
      if (e->users == 0 && e->state != ST_TUNING) {
        *pp = e->next;
        pthread_cond_destroy(&e->cv);
        free(e);
        table_count--;
      } else {
        pp = &e->next;
      }
    }
  }
}

static struct entry *find(const struct dspk__hash *k) {
  for (struct entry *e = table[k->lo % TABLE_BUCKETS]; e; e = e->next)
    if (e->key.hi == k->hi && e->key.lo == k->lo)
      return e;
  return NULL;
}

static struct entry *find_or_add(const struct dspk__hash *k) {
  struct entry *e = find(k);
  if (e)
    return e;
  if (table_count >= TABLE_MAX_ENTRIES)
    drop_idle_entries();
  e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  if (pthread_cond_init(&e->cv, NULL) != 0) {
    free(e);
    return NULL;
  }
  e->key = *k;
  e->state = ST_EMPTY;
  e->next = table[k->lo % TABLE_BUCKETS];
  table[k->lo % TABLE_BUCKETS] = e;
  table_count++;
  return e;
}

/* See autotune.h. */
int dspk__autotune_peek(struct dspk__cache *cache, const struct dspk__autotune_req *req,
                        int *winner) {
  struct dspk__tune_key k;
  int rc = DSPK_ENOENT;
  if (!valid(req) || !winner)
    return DSPK_EINVAL;
  make_tune_key(req, &k);
  struct dspk__hash hk = table_key(&k);
  uint64_t epoch = dspk__cache_epoch(cache);
  pthread_mutex_lock(&table_mu);
  struct entry *e = find(&hk);
  if (e && e->state == ST_DONE && e->epoch == epoch) {
    *winner = e->winner;
    rc = 0;
  }
  pthread_mutex_unlock(&table_mu);
  return rc;
}

/* See autotune.h. */
void dspk__autotune_forget_all(void) {
  pthread_mutex_lock(&table_mu);
  drop_idle_entries();
  pthread_mutex_unlock(&table_mu);
}

/* ---- benchmarking --------------------------------------------------------- */

static uint64_t mono_ns(void *ud) {
  (void)ud;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int cancelled(const struct dspk__autotune_req *r) {
  return r->cancel && atomic_load(r->cancel);
}

/* A growing text buffer for the timings JSON. */
struct text {
  char *p;
  size_t len, cap;
  int oom;
};

static void add(struct text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void add(struct text *t, const char *fmt, ...) {
  va_list ap;
  if (t->oom)
    return;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->oom = 1;
      return;
    }
    if (t->p && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 256) + (size_t)n;
    char *np = realloc(t->p, cap);
    if (!np) {
      t->oom = 1;
      return;
    }
    t->p = np;
    t->cap = cap;
  }
}

/* Appends s as a JSON string (names are plain identifiers, but escape
 * anyway). */
static void add_json_str(struct text *t, const char *s) {
  add(t, "\"");
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      add(t, "\\%c", ch);
    else if (ch < 0x20)
      add(t, "\\u%04x", ch);
    else
      add(t, "%c", ch);
  }
  add(t, "\"");
}

static uint64_t median_u64(const uint64_t *ns, int n) {
  uint64_t sorted[MAX_SAMPLES];
  memcpy(sorted, ns, sizeof ns[0] * (size_t)n);
  qsort(sorted, (size_t)n, sizeof sorted[0], cmp_u64);
  return n % 2 ? sorted[n / 2]
               : sorted[n / 2 - 1] / 2 + sorted[n / 2] / 2 +
                     (sorted[n / 2 - 1] % 2 + sorted[n / 2] % 2) / 2;
}

/* The winner of a benchmark: best (the fastest median, best_ns), or the
 * request's preferred candidate when it ran (its median prefer_ns) within
 * prefer_margin of the best. */
static int pick(const struct dspk__autotune_req *r, int best, uint64_t best_ns,
                uint64_t prefer_ns) {
  if (best >= 0 && r->prefer_margin > 0 && prefer_ns != UINT64_MAX &&
      (double)prefer_ns <= (double)best_ns * (1.0 + r->prefer_margin))
    return r->prefer;
  return best;
}

/* One sample of candidate i, which has just run in clock_ns: its own
 * measure of that run where the request offers one (ran_ns). */
static uint64_t sample_ns(const struct dspk__autotune_req *r, int i, uint64_t clock_ns) {
  uint64_t own;
  if (r->ran_ns && r->ran_ns(r->ud, i, &own) == 0)
    return own;
  return clock_ns;
}

/* benchmark() with o->interleave: rounds in which each candidate in turn
 * runs its warm-up and then `burst` timed runs, until each has `samples`. */
/* The end of a benchmark: the winner and the timings JSON t (NULL when
 * out of memory), or first_err (DSPK_ENOENT) when no candidate ran. */
static int finish(const struct dspk__autotune_req *r, const char *what, struct text *t,
                  int best, int first_err, int *winner, char **timings) {
  if (best < 0) {
    free(t->p);
    return first_err ? first_err : DSPK_ENOENT;
  }
  if (r->progress)
    r->progress(r->progress_ud, what, 1.0);
  *winner = best;
  if (t->oom) {
    free(t->p);
    t->p = NULL;
  }
  *timings = t->p;
  return 0;
}

/* Runs candidate i once, recording its outcome in *r->ran_ok. */
static int run_cand(const struct dspk__autotune_req *r, int i) {
  int rc = r->cands[i].run(r->ud, i);
  if (r->ran_ok)
    *r->ran_ok = rc == 0;
  return rc;
}

static int benchmark_interleaved(const struct dspk__autotune_req *r, int warmup,
                                 int samples, int burst, uint64_t (*now)(void *),
                                 void *cud, uint64_t excluded, int *winner,
                                 char **timings) {
  int rcs[DSPK__AUTOTUNE_MAX_CANDS] = {0}, n[DSPK__AUTOTUNE_MAX_CANDS] = {0};
  int nc = r->ncands, best = -1, first_err = 0, any = 0, active = 0;
  uint64_t prefer_ns = UINT64_MAX;
  int rounds = (samples + burst - 1) / burst;
  uint64_t best_ns = UINT64_MAX;
  double total, done = 0;
  char what[96];
  struct text t = {0};

  snprintf(what, sizeof what, "autotune %s", r->op ? r->op : "");
  for (int i = 0; i < nc; i++)
    active += !(excluded >> i & 1);
  total = (double)active * (warmup * rounds + samples);
  uint64_t(*times)[MAX_SAMPLES] = calloc((size_t)nc, sizeof *times);
  if (!times)
    return DSPK_ENOMEM;
  for (int round = 0; round < rounds; round++) {
    for (int k = 0; k < nc; k++) {
      int i = (k + round) % nc;
      if (excluded >> i & 1)
        continue;
      for (int w = 0; w < warmup + burst && rcs[i] == 0 && n[i] < samples; w++) {
        if (cancelled(r)) {
          free(times);
          return DSPK_ECANCELED;
        }
        uint64_t t0 = now(cud);
        rcs[i] = run_cand(r, i);
        uint64_t t1 = now(cud);
        done++;
        if (r->progress)
          r->progress(r->progress_ud, what, done / total);
        if (rcs[i] == 0 && w >= warmup)
          times[i][n[i]++] = sample_ns(r, i, t1 - t0);
      }
    }
  }
  add(&t, "{");
  for (int i = 0; i < nc; i++) {
    if (excluded >> i & 1)
      continue;
    add(&t, "%s", any++ ? "," : "");
    add_json_str(&t, r->cands[i].name);
    if (rcs[i] != 0) {
      if (!first_err)
        first_err = rcs[i];
      add(&t, ":{\"error\":%d}", rcs[i]);
      continue;
    }
    uint64_t med = median_u64(times[i], n[i]);
    add(&t, ":{\"median_ns\":%llu,\"ns\":[", (unsigned long long)med);
    for (int s = 0; s < n[i]; s++)
      add(&t, "%s%llu", s ? "," : "", (unsigned long long)times[i][s]);
    add(&t, "]}");
    if (i == r->prefer)
      prefer_ns = med;
    if (med < best_ns) {
      best_ns = med;
      best = i;
    }
  }
  add(&t, "}");
  free(times);
  return finish(r, what, &t, pick(r, best, best_ns, prefer_ns), first_err, winner, timings);
}

/*
 * Benchmarks every candidate not in `excluded`.  Returns 0 and writes the
 * winner and the timings JSON (malloc'd, may be NULL when out of memory),
 * DSPK_ECANCELED, or the first candidate error when none succeeded.
 */
static int benchmark(const struct dspk__autotune_req *r,
                     const struct dspk__autotune_opts *o, uint64_t excluded,
                     int *winner, char **timings) {
  int warmup = o && o->warmup > 0 ? o->warmup : DEFAULT_WARMUP;
  int samples = o && o->samples > 0 ? o->samples : DEFAULT_SAMPLES;
  double cut = o && o->cut_ratio > 1.0 ? o->cut_ratio : DEFAULT_CUT;
  uint64_t (*now)(void *) = o && o->now_ns ? o->now_ns : mono_ns;
  void *cud = o && o->now_ns ? o->clock_ud : NULL;
  if (samples > MAX_SAMPLES)
    samples = MAX_SAMPLES;
  if (o && o->warmup < 0)
    warmup = 0; /* negative: no warm-up at all */
  if (o && o->interleave)
    return benchmark_interleaved(r, warmup, samples, o->interleave, now, cud, excluded,
                                 winner, timings);

  char what[96];
  snprintf(what, sizeof what, "autotune %s", r->op ? r->op : "");
  int active = 0;
  for (int i = 0; i < r->ncands; i++)
    active += !(excluded >> i & 1);
  double total = (double)active * (warmup + samples), done = 0;

  struct text t = {0};
  int best = -1, first_err = 0;
  uint64_t best_ns = UINT64_MAX, prefer_ns = UINT64_MAX;
  add(&t, "{");
  int any = 0;
  for (int i = 0; i < r->ncands; i++) {
    if (excluded >> i & 1)
      continue;
    uint64_t ns[MAX_SAMPLES];
    int n = 0, rc = 0, was_cut = 0;
    double base = done;
    for (int w = 0; w < warmup && rc == 0; w++) {
      if (cancelled(r)) {
        rc = DSPK_ECANCELED;
        break;
      }
      rc = run_cand(r, i);
      done++;
      if (r->progress)
        r->progress(r->progress_ud, what, done / total);
    }
    uint64_t fastest = UINT64_MAX;
    for (int s = 0; s < samples && rc == 0; s++) {
      if (cancelled(r)) {
        rc = DSPK_ECANCELED;
        break;
      }
      uint64_t t0 = now(cud);
      rc = run_cand(r, i);
      uint64_t t1 = now(cud);
      done++;
      if (r->progress)
        r->progress(r->progress_ud, what, done / total);
      if (rc != 0)
        break;
      ns[n++] = sample_ns(r, i, t1 - t0);
      if (ns[n - 1] < fastest)
        fastest = ns[n - 1];
      /* Even its fastest run is far slower than the best median: no
       * further sample can make it win. */
      if (best >= 0 && (double)fastest > cut * (double)best_ns &&
          s + 1 < samples) {
        was_cut = 1;
        break;
      }
    }
    done = base + warmup + samples;
    if (rc == DSPK_ECANCELED) {
      free(t.p);
      return DSPK_ECANCELED;
    }
    add(&t, "%s", any++ ? "," : "");
    add_json_str(&t, r->cands[i].name);
    if (rc != 0) {
      if (!first_err)
        first_err = rc;
      add(&t, ":{\"error\":%d}", rc);
      continue;
    }
    uint64_t med = median_u64(ns, n);
    add(&t, ":{\"median_ns\":%llu,\"ns\":[", (unsigned long long)med);
    for (int s = 0; s < n; s++)
      add(&t, "%s%llu", s ? "," : "", (unsigned long long)ns[s]);
    add(&t, "]%s}", was_cut ? ",\"cut\":true" : "");
    if (!was_cut && i == r->prefer)
      prefer_ns = med;
    if (!was_cut && med < best_ns) {
      best_ns = med;
      best = i;
    }
  }
  add(&t, "}");
  return finish(r, what, &t, pick(r, best, best_ns, prefer_ns), first_err, winner, timings);
}

/* ---- choose / failed ------------------------------------------------------ */

static int valid(const struct dspk__autotune_req *r) {
  if (!r || !r->cands || r->ncands < 1 ||
      r->ncands > DSPK__AUTOTUNE_MAX_CANDS)
    return 0;
  for (int i = 0; i < r->ncands; i++)
    if (!r->cands[i].name || !r->cands[i].run)
      return 0;
  return 1;
}

static int index_of(const struct dspk__autotune_req *r, const char *name) {
  for (int i = 0; i < r->ncands; i++)
    if (strcmp(r->cands[i].name, name) == 0)
      return i;
  return -1;
}

/* Finishes a tuning: publishes the result (or gives the key back to the
 * next waiter on failure) and releases the entry.  table_mu held. */
static void publish(struct entry *e, int winner) {
  if (winner >= 0) {
    e->state = ST_DONE;
    e->winner = winner;
  } else {
    e->state = ST_EMPTY;
  }
  pthread_cond_broadcast(&e->cv);
}

/* See autotune.h. */
int dspk__autotune_choose(struct dspk__cache *cache,
                          const struct dspk__autotune_req *req,
                          const struct dspk__autotune_opts *opts, int *winner,
                          enum dspk__autotune_how *how) {
  struct dspk__tune_key k;
  enum dspk__autotune_how found = DSPK__AUTOTUNE_MEMO;
  int rc = 0, w = -1, waiting = 0, waited = 0;
  char what[96];
  if (!valid(req) || !winner)
    return DSPK_EINVAL;
  snprintf(what, sizeof what, "autotune %s", req->op ? req->op : "");
  make_tune_key(req, &k);
  struct dspk__hash hk = table_key(&k);
  uint64_t epoch = dspk__cache_epoch(cache);
  uint64_t all = req->ncands == 64 ? UINT64_MAX
                                   : (UINT64_C(1) << req->ncands) - 1;

  pthread_mutex_lock(&table_mu);
  struct entry *e = find_or_add(&hk);
  if (!e) {
    pthread_mutex_unlock(&table_mu);
    return DSPK_ENOMEM;
  }
  e->users++;
  for (;;) {
    if (e->epoch != epoch && e->state != ST_TUNING) {
      /* A different cache, or its decisions were cleared. */
      e->epoch = epoch;
      e->state = ST_EMPTY;
      e->excluded = 0;
    }
    if (e->state == ST_DONE) {
      w = e->winner;
      waited = waiting; /* its step ends here */
      break;
    }
    if (e->state == ST_TUNING) {
      /* Another thread benchmarks this key: whatever comes next, this
       * call waited for it (the decision may be published while this
       * thread reports its 0 below, unlocked). */
      found = DSPK__AUTOTUNE_WAITED;
      if (cancelled(req)) {
        rc = DSPK_ECANCELED;
        break;
      }
      if (!waiting && req->progress) {
        /* Waiting for another thread's tuning is this request's tuning
         * step too (task.progress while a task waits for autotuning): its
         * 0 now, its 1 when the decision comes.  Not under the lock. */
        waiting = 1;
        pthread_mutex_unlock(&table_mu);
        req->progress(req->progress_ud, what, 0.0);
        pthread_mutex_lock(&table_mu);
        continue;
      }
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += WAIT_SLICE_NS;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&e->cv, &table_mu, &until);
      continue;
    }
    /* ST_EMPTY: this thread tunes; the others wait. */
    if ((e->excluded & all) == all) {
      rc = DSPK_ENOENT;
      break;
    }
    e->state = ST_TUNING;
    uint64_t excluded = e->excluded;
    pthread_mutex_unlock(&table_mu);

    char name[256];
    int got = -1;
    if (cache && dspk__cache_tune_get(cache, &k, name, sizeof name) == 0) {
      got = index_of(req, name);
      /* The key holds the hash of the candidates' names: a winner that is
       * none of them was damaged in the file.  Dropped; tuned again. */
      if (got < 0)
        (void)dspk__cache_tune_drop(cache, &k, "its winner is none of the op's candidates");
      if (got >= 0 && (excluded >> got & 1))
        got = -1;
    }
    if (got >= 0) {
      found = DSPK__AUTOTUNE_CACHE;
    } else {
      char *timings = NULL;
      rc = benchmark(req, opts, excluded, &got, &timings);
      if (rc == 0 && cache) {
        /* A failed store costs a re-tune in the next process only. */
        (void)dspk__cache_tune_put(cache, &k, req->cands[got].name, timings);
      }
      free(timings);
      found = DSPK__AUTOTUNE_TUNED;
    }
    pthread_mutex_lock(&table_mu);
    publish(e, rc == 0 ? got : -1);
    w = got;
    break;
  }
  e->users--;
  pthread_mutex_unlock(&table_mu);
  /* Canceled during its step after a run that completed the whole op: the
   * caller answers with that result (ran_ok), so the step ends with its 1
   * as every step of a task answered with its result does (protocol.md,
   * task.progress; probe 23 G3: the progress stopped at its last fraction). */
  if (rc == DSPK_ECANCELED && req->ran_ok && *req->ran_ok == 1 && req->progress)
    req->progress(req->progress_ud, what, 1.0);
  if (rc != 0)
    return rc;
  if (waited && req->progress)
    req->progress(req->progress_ud, what, 1.0);
  if (found == DSPK__AUTOTUNE_MEMO)
    dspk__cache_tune_used(cache, &k);
  *winner = w;
  if (how)
    *how = found;
  return 0;
}

/* See autotune.h. */
int dspk__autotune_failed(struct dspk__cache *cache,
                          const struct dspk__autotune_req *req, int failed) {
  struct dspk__tune_key k;
  if (!valid(req) || failed < 0 || failed >= req->ncands)
    return DSPK_EINVAL;
  make_tune_key(req, &k);
  struct dspk__hash hk = table_key(&k);
  pthread_mutex_lock(&table_mu);
  struct entry *e = find_or_add(&hk);
  if (!e) {
    pthread_mutex_unlock(&table_mu);
    return DSPK_ENOMEM;
  }
  uint64_t epoch = dspk__cache_epoch(cache);
  if (e->epoch != epoch && e->state != ST_TUNING) {
    e->epoch = epoch;
    e->state = ST_EMPTY;
    e->excluded = 0;
  }
  e->excluded |= UINT64_C(1) << failed;
  if (e->state == ST_DONE && e->winner == failed)
    e->state = ST_EMPTY;
  pthread_mutex_unlock(&table_mu);
  return cache ? dspk__cache_tune_del(cache, &k) : 0;
}
