/*
 * fft on the cpu through FFTW, and the device's FFTW plan cache (also used by
 * fir's FFT convolution).
 *
 * Plans are made once per (kind, precision, n, batch, in-place, alignment)
 * and reused: planning per task would cost more than the transform.  They
 * are made on scratch arrays, never on the task's data, so the planning
 * flags (dspk__cpu_fft_flags, the autotuner's choice point) may be
 * FFTW_MEASURE, which overwrites its arrays.  The task's arrays are then
 * passed to the new-array execute functions, which need the same alignment
 * as the planning arrays: unaligned operands (an offset into a buffer) get
 * plans made with FFTW_UNALIGNED.  FFTW's planner is not thread-safe, and
 * several devices or tests may plan at once, so every plan creation and
 * destruction holds one process-wide mutex; execution needs no lock.
 *
 * Background measuring.  FFTW_MEASURE planning of a large transform takes
 * seconds (2^20 c64: 3.5-5 s on the 2-core development VM) and cannot be
 * interrupted.  Measuring it inside the task would delay a cancel by that
 * long; measuring it under a time limit (what this file did, 0.1 s) gives
 * a plan cut short, which made no wisdom and ran slower than even
 * FFTW_ESTIMATE's (2^20 c64: 14-17 ms against 7.2 ms for the full
 * measure, 11 ms estimated).  So a plan of PLAN_BG_POINTS points or more
 * that stored wisdom does not answer is made with FFTW_ESTIMATE (about a
 * millisecond) for the task at hand, and a thread of the device
 * ("dspk-fftw-plan") measures it in full (REFINE_TIMELIMIT_S at most)
 * holding the planner lock; the runner swaps the measured plan in at the
 * start of its next op (dspk__cpu_fft_adopt), when no plan is in use, and
 * stores the wisdom, so the measuring happens once per transform and
 * cache.  A plan the runner needs meanwhile waits for the lock, polling
 * its task's cancel flag.  The thread exits when it has nothing to do.
 *
 * Smaller plans are measured for the task that needs them, completely, but
 * by a thread of their own ("dspk-fftw-task", holding the planner) while
 * the runner waits, looking at the task's cancel flag every 20 ms: most
 * take milliseconds, yet some sizes take seconds (fir's blocks of
 * 2^a 3^b 5^c 7^d points, 16-24K of them for 2-3K taps: 0.3-2.4 s) and
 * FFTW's planner cannot be interrupted.  A canceled task leaves at once;
 * the measuring goes on and its wisdom stays in the process (stored with
 * the next), so the plan comes from it when asked again.  The wait is a
 * tuning step of the task: progress "autotune fir: fftw plan" (or fft), 0
 * then 1 (its
 * task.progress notifications and its trace's tune phase); so is a wait
 * for the planner lock that such a measuring (or a background one) holds.
 * The runner never waits for that lock without watching the cancel flag:
 * the wisdom is stored, background plans adopted and a measured plan's
 * cache slot freed only when the lock is free at once (or the slot taken
 * before the measuring), and a closing device leaves its plans to the
 * lock's holder (dspk__cpu_fftw_unlock destroys them).
 *
 * numpy's conventions: the forward transform is unnormalised, the inverse
 * divides by n; real input gives the n/2+1 non-negative frequencies.  Large
 * batches run in chunks so a cancel request is seen between chunks.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fftw3.h>

#include "backends/cpu/cpu.h"
#include "backends/cpu/fftw_wisdom.h"
#include "backends/cpu/tune.h"
#include "proto/testhook.h"

/* Rows per execute call are chosen so a chunk is about this many elements
 * (a cancel is seen between chunks): 2^20 c128 points, 4 transforms of
 * 2^18, take about 45 ms at a load of 10 on the 2-core development VM; at
 * 2^22, 16 of them took 181 ms there, and 4 of 2^20 about 240. */
#define CHUNK_ELEMS ((int64_t)1 << 20)
/* Transforms of this many points (n * batch) or more are measured in the
 * background (see above); smaller ones at once, completely. */
#define PLAN_BG_POINTS ((int64_t)1 << 16)
/* Seconds a background measuring may take (fftw_set_timelimit).  A device
 * close does not wait for it: the thread is left to finish and clean up. */
#define REFINE_TIMELIMIT_S 60.0
/* Plans queued for background measuring or measured and not yet adopted. */
#define REFINE_MAX 8

static pthread_mutex_t fftw_mu = PTHREAD_MUTEX_INITIALIZER;

/* Plans whose owner could not wait for the planner lock (a runner closing
 * its device while a measuring holds the lock: the daemon's stop must not
 * wait for it), destroyed by the next holder as it unlocks.  grave_mu
 * guards the list; it is taken inside fftw_mu or alone, never around it. */
static pthread_mutex_t grave_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dspk__cpu_plan *grave;
static int ngrave, grave_cap;

static void destroy_plan(struct dspk__cpu_plan *p);

void dspk__cpu_fftw_lock(void) { pthread_mutex_lock(&fftw_mu); }

/* Destroys the plans left to the holder, then unlocks; plans left after
 * its look but before it unlocked are destroyed by taking the lock again
 * when nobody else holds it (else that holder destroys them). */
void dspk__cpu_fftw_unlock(void) {
  for (;;) {
    pthread_mutex_lock(&grave_mu);
    for (int i = 0; i < ngrave; i++)
      destroy_plan(&grave[i]);
    ngrave = 0;
    pthread_mutex_unlock(&grave_mu);
    pthread_mutex_unlock(&fftw_mu);
    pthread_mutex_lock(&grave_mu);
    int left = ngrave;
    pthread_mutex_unlock(&grave_mu);
    if (!left || pthread_mutex_trylock(&fftw_mu) != 0)
      return;
  }
}

/* 0 with the planner lock held, or nonzero when another thread holds it. */
static int fftw_trylock(void) { return pthread_mutex_trylock(&fftw_mu); }

/* Destroys the n plans at ps now when the planner lock is free, else
 * leaves them to its holder (dspk__cpu_fftw_unlock): never waits for a
 * measuring.  Waits only when out of memory for the list. */
static void destroy_plans_soon(struct dspk__cpu_plan *ps, int n) {
  int i = 0;
  if (n <= 0)
    return;
  if (fftw_trylock() != 0) {
    pthread_mutex_lock(&grave_mu);
    if (ngrave + n > grave_cap) {
      int cap = (ngrave + n) * 2;
      struct dspk__cpu_plan *g = realloc(grave, (size_t)cap * sizeof *g);
      if (g) {
        grave = g;
        grave_cap = cap;
      }
    }
    for (; i < n && ngrave < grave_cap; i++)
      if (ps[i].plan)
        grave[ngrave++] = ps[i];
    pthread_mutex_unlock(&grave_mu);
    if (i == n && fftw_trylock() != 0)
      return; /* its holder destroys them as it unlocks */
    if (i < n)
      dspk__cpu_fftw_lock(); /* no memory for the list: wait */
  }
  for (; i < n; i++)
    destroy_plan(&ps[i]);
  dspk__cpu_fftw_unlock();
}

/* A plan's tuning step of the running op (task.progress "autotune fir:
 * fftw plan", 0 when the task starts to wait for a plan, 1 when it has
 * it): waiting for the planner lock that another measuring holds (a
 * canceled task's, or a background one) is the same step as measuring
 * the plan itself, so a task gets one 0 and one 1 a plan either way. */
struct plan_step {
  struct dspk__dev *dev;
  int open;
  char what[48];
};

static void step_open(struct plan_step *st) {
  struct dspk__opctx *ctx = st->dev->ctx;
  if (st->open)
    return;
  st->open = 1;
  /* "autotune fir: fftw plan": the op's name, as every tuning step's. */
  snprintf(st->what, sizeof st->what, "autotune %s: fftw plan",
           st->dev->op_kind == DSPK_OP_FIR ? "fir" : "fft");
  if (ctx && ctx->progress)
    ctx->progress(ctx->progress_ud, st->what, 0.0);
}

static void step_close(struct plan_step *st) {
  struct dspk__opctx *ctx = st->dev->ctx;
  if (st->open && ctx && ctx->progress)
    ctx->progress(ctx->progress_ud, st->what, 1.0);
  st->open = 0;
}

/* The planner lock for the runner: polls the running op's cancel flag
 * every 20 ms while another thread (a measuring, in the background or
 * for a canceled task) holds the lock, the wait a step of the op (st).
 * 0 or DSPK_ECANCELED. */
static int fftw_lock_op(struct dspk__dev *dev, struct plan_step *st) {
  if (fftw_trylock() == 0)
    return 0;
  if (dev->ctx)
    step_open(st);
  for (;;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_mutex_timedlock(&fftw_mu, &ts);
    if (rc == 0)
      return 0;
    if (rc != ETIMEDOUT) {
      pthread_mutex_lock(&fftw_mu);
      return 0;
    }
    if (dspk__cpu_canceled(dev->ctx))
      return DSPK_ECANCELED;
  }
}

/* What identifies a plan of the cache, and the flags it is measured with. */
struct plan_key {
  int kind, dbl, n, batch, inplace, aligned;
  unsigned flags;
};

struct dspk__cpu_refine {
  const char *exe; /* dev->env.measure_exe: measure in a child process; NULL: here */
  pid_t child;     /* the child measuring now, or 0 */
  pthread_mutex_t mu;
  pthread_cond_t idle; /* signaled when the thread exits */
  pthread_t thread;
  int running; /* the thread has work or is measuring */
  int joinable;
  int stop;
  int abandoned; /* the device let go of it while it ran: it frees itself */
  /* The device's cached plans at that release, destroyed by the thread
   * when it is done (their destruction needs the planner lock). */
  struct dspk__cpu_plan orphans[DSPK__CPU_PLANS];
  int norphans;
  struct plan_key todo[REFINE_MAX];
  int ntodo;
  struct {
    struct plan_key k;
    void *plan;
  } done[REFINE_MAX];
  int ndone;
};

unsigned dspk__cpu_fft_flags(struct dspk__dev *dev, int kind, int dbl, int n,
                             int batch) {
  (void)kind;
  (void)dbl;
  if (dev->fft_flags)
    return dev->fft_flags;
  return dspk__cpu_tune_fft_flags(dev, n, batch);
}

/* Caller holds the FFTW lock. */
static void destroy_plan(struct dspk__cpu_plan *p) {
  if (!p->plan)
    return;
  if (p->dbl)
    fftw_destroy_plan(p->plan);
  else
    fftwf_destroy_plan(p->plan);
  p->plan = NULL;
}

static int refine_release(struct dspk__dev *dev);

void dspk__cpu_fft_release(struct dspk__dev *dev) {
  if (!dev)
    return;
  if (refine_release(dev)) { /* the measuring thread destroys them */
    dev->nplans = 0;
    return;
  }
  /* A measuring for a canceled task may hold the planner for seconds:
   * the close (the daemon's stop) does not wait for it. */
  destroy_plans_soon(dev->plans, dev->nplans);
  dev->nplans = 0;
}

/* One FFTW planner call for kind/precision; in and out are the planning
 * arrays.  The plan, or NULL. */
static void *plan_dft(int kind, int dbl, int n, int batch, void *in, void *out,
                      int idist, int odist, unsigned flags) {
  int nn = n, sign = kind == DSPK__CPU_FFT_FWD ? FFTW_FORWARD : FFTW_BACKWARD;
  /* The same calls in both precisions: pfx is fftw (double) or fftwf. */
#define PLAN_MANY(pfx)                                                         \
  switch (kind) {                                                              \
  case DSPK__CPU_FFT_R2C:                                                      \
    return pfx##_plan_many_dft_r2c(1, &nn, batch, in, NULL, 1, idist, out,     \
                                   NULL, 1, odist, flags);                     \
  case DSPK__CPU_FFT_C2R:                                                      \
    return pfx##_plan_many_dft_c2r(1, &nn, batch, in, NULL, 1, idist, out,     \
                                   NULL, 1, odist, flags);                     \
  default:                                                                     \
    return pfx##_plan_many_dft(1, &nn, batch, in, NULL, 1, idist, out, NULL,   \
                               1, odist, sign, flags);                         \
  }
  if (dbl)
    PLAN_MANY(fftw)
  PLAN_MANY(fftwf)
#undef PLAN_MANY
}

/* Makes a plan on scratch arrays; NULL when out of memory or FFTW fails.
 * With MEASURE flags: from stored wisdom when it answers, else, when
 * `estimate_big` is set and the transform has PLAN_BG_POINTS points or
 * more, with FFTW_ESTIMATE (*need_measure set), else measured for at most
 * `limit` seconds (*measured set: new wisdom), or, when `apart` is not
 * NULL, not at all: NULL and *apart set (the caller has it measured by a
 * thread of its own, measure_for_task).  Caller holds the lock. */
static void *make_plan(int kind, int dbl, int n, int batch, int inplace,
                       int aligned, unsigned flags, int estimate_big, double limit,
                       int *measured, int *need_measure, int *apart) {
  size_t cs = dbl ? 16 : 8, rs = dbl ? 8 : 4;
  int nh = n / 2 + 1, r2c = kind == DSPK__CPU_FFT_R2C, c2r = kind == DSPK__CPU_FFT_C2R;
  /* r2c: n reals in, nh complex out; c2r the other way round; else n
   * complex both sides. */
  size_t real_bytes = (size_t)n * batch * rs, half_bytes = (size_t)nh * batch * cs;
  size_t cplx_bytes = (size_t)n * batch * cs;
  size_t in_bytes = r2c ? real_bytes : c2r ? half_bytes : cplx_bytes;
  size_t out_bytes = r2c ? half_bytes : c2r ? real_bytes : cplx_bytes;
  int idist = c2r ? nh : n, odist = r2c ? nh : n;
  if (r2c || c2r)
    inplace = 0; /* the padded in-place real layout is never used here */
  if (!aligned)
    flags |= FFTW_UNALIGNED;
  void *in = dbl ? fftw_malloc(in_bytes) : fftwf_malloc(in_bytes);
  void *out = inplace ? in : dbl ? fftw_malloc(out_bytes) : fftwf_malloc(out_bytes);
  void *plan = NULL;
  if (!in || !out)
    goto done;
  /* A cold FFTW_MEASURE plan cannot be interrupted: large ones are made
   * with FFTW_ESTIMATE for now and measured in the background (see the top
   * of this file), under `limit` (a plan cut short makes no wisdom). */
  if (dbl)
    fftw_set_timelimit(limit);
  else
    fftwf_set_timelimit(limit);
  /* With MEASURE (FFTW_ESTIMATE unset), a plan that stored wisdom already
   * answers is made without measuring and adds no wisdom: only a measured
   * plan makes the device's wisdom worth saving again. */
  if (!(flags & FFTW_ESTIMATE))
    plan = plan_dft(kind, dbl, n, batch, in, out, idist, odist,
                    flags | FFTW_WISDOM_ONLY);
  if (!plan && !(flags & FFTW_ESTIMATE) && estimate_big &&
      (int64_t)n * batch >= PLAN_BG_POINTS) {
    unsigned ef = (flags & ~(unsigned)(FFTW_PATIENT | FFTW_EXHAUSTIVE)) | FFTW_ESTIMATE;
    plan = plan_dft(kind, dbl, n, batch, in, out, idist, odist, ef);
    *need_measure = plan != NULL;
  } else if (!plan && apart && !(flags & FFTW_ESTIMATE)) {
    *apart = 1;
  } else if (!plan) {
    plan = plan_dft(kind, dbl, n, batch, in, out, idist, odist, flags);
    *measured = plan && !(flags & FFTW_ESTIMATE);
  }
done:
  if (dbl) {
    if (out && out != in)
      fftw_free(out);
    fftw_free(in);
  } else {
    if (out && out != in)
      fftwf_free(out);
    fftwf_free(in);
  }
  return plan;
}

/* Caller holds the FFTW lock.  Frees a plan in slot when the cache is full
 * (least recently used); NULL when nothing could be freed. */
static struct dspk__cpu_plan *plan_slot(struct dspk__dev *dev) {
  if (dev->nplans < DSPK__CPU_PLANS)
    return &dev->plans[dev->nplans++];
  struct dspk__cpu_plan *slot = &dev->plans[0];
  for (int i = 1; i < dev->nplans; i++)
    if (dev->plans[i].last_use < slot->last_use)
      slot = &dev->plans[i];
  destroy_plan(slot);
  return slot;
}

/* ---- background measuring ------------------------------------------------ */

/* Frees r and the plans it measured; its thread is done or is the caller.
 * Does not wait for the planner lock (destroy_plans_soon). */
static void refine_free(struct dspk__cpu_refine *r) {
  struct dspk__cpu_plan ps[REFINE_MAX + DSPK__CPU_PLANS];
  int n = 0;
  for (int i = 0; i < r->ndone; i++)
    ps[n++] = (struct dspk__cpu_plan){.dbl = r->done[i].k.dbl, .plan = r->done[i].plan};
  for (int i = 0; i < r->norphans; i++)
    ps[n++] = r->orphans[i];
  destroy_plans_soon(ps, n);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->idle);
  free(r);
}

#ifdef DSPK_TEST_HOOKS
static atomic_int refine_gate;
void dspk__cpu_fft_refine_gate(int closed) { atomic_store(&refine_gate, closed); }
static void gate_wait(void) {
  while (atomic_load(&refine_gate)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}
#else
static void gate_wait(void) {}
#endif

/* Measures k in a child process (`EXE --fftw-measure SPEC`, which runs
 * dspk__cpu_fft_measure_main) and returns the wisdom it printed (malloc'd,
 * NUL-terminated), or NULL: *spawned tells whether a child ran at all.
 * Meanwhile this process's planner stays free for other tasks. */
static char *measure_in_child(struct dspk__cpu_refine *r, const struct plan_key *k,
                              int *spawned) {
  enum { WISDOM_MAX = 4 << 20 };
  extern char **environ;
  char spec[192], *buf = NULL, *argv[4];
  size_t len = 0, cap = 0;
  posix_spawn_file_actions_t fa;
  int p[2], st = 0;
  pid_t pid;

  *spawned = 0;
  snprintf(spec, sizeof spec, "%d,%d,%d,%d,%d,%d,%u,%ld", k->kind, k->dbl, k->n, k->batch,
           k->inplace, k->aligned, k->flags, (long)getpid());
  argv[0] = "dspkd-fftw-measure";
  argv[1] = "--fftw-measure";
  argv[2] = spec;
  argv[3] = NULL;
  if (pipe2(p, O_CLOEXEC) != 0)
    return NULL;
  if (posix_spawn_file_actions_init(&fa) != 0) {
    close(p[0]);
    close(p[1]);
    return NULL;
  }
  /* dup2 onto stdout clears close-on-exec there; stdin and stderr are
   * inherited (the daemon's journal). */
  int rc = posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  pthread_mutex_lock(&r->mu);
  if (rc == 0 && !r->stop)
    rc = posix_spawn(&pid, r->exe, &fa, NULL, argv, environ);
  else if (rc == 0)
    rc = ECANCELED;
  if (rc == 0)
    r->child = pid;
  pthread_mutex_unlock(&r->mu);
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  if (rc != 0) {
    close(p[0]);
    *spawned = rc == ECANCELED; /* stopping: nothing to measure here either */
    return NULL;
  }
  *spawned = 1;
  for (;;) {
    if (len + 1 >= cap) {
      size_t ncap = cap ? 2 * cap : 65536;
      char *nb = ncap <= WISDOM_MAX ? realloc(buf, ncap) : NULL;
      if (!nb) {
        kill(pid, SIGKILL); /* no room for its answer: stop it */
        break;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t n = read(p[0], buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += (size_t)n;
  }
  close(p[0]);
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  pthread_mutex_lock(&r->mu);
  r->child = 0;
  pthread_mutex_unlock(&r->mu);
  if (!buf || len == 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    free(buf);
    return NULL;
  }
  buf[len] = '\0';
  return buf;
}

int dspk__cpu_fft_measure_main(const char *spec) {
  struct plan_key k;
  long ppid;
  int measured = 0, unused = 0;
  /* Ends with the daemon that asked (it may exit while this measures). */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (sscanf(spec, "%d,%d,%d,%d,%d,%d,%u,%ld", &k.kind, &k.dbl, &k.n, &k.batch, &k.inplace,
             &k.aligned, &k.flags, &ppid) != 8 || (long)getppid() != ppid ||
      k.kind < DSPK__CPU_FFT_FWD || k.kind > DSPK__CPU_FFT_C2R || (k.dbl != 0 && k.dbl != 1) ||
      k.n < 1 || k.batch < 1 || (int64_t)k.n * k.batch > ((int64_t)1 << 34))
    return 2;
  void *plan = make_plan(k.kind, k.dbl, k.n, k.batch, k.inplace, k.aligned, k.flags, 0,
                         REFINE_TIMELIMIT_S, &measured, &unused, NULL);
  if (!plan || !measured)
    return 1;
  char *w = k.dbl ? fftw_export_wisdom_to_string() : fftwf_export_wisdom_to_string();
  struct dspk__cpu_plan p = {.dbl = k.dbl, .plan = plan};
  destroy_plan(&p); /* nothing left behind for a leak checker */
  size_t len = w ? strlen(w) : 0, off = 0;
  while (off < len) {
    ssize_t n = write(1, w + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    off += (size_t)n;
  }
  free(w);
  return len && off == len ? 0 : 1;
}

static void *refine_main(void *arg) {
  struct dspk__cpu_refine *r = arg;
  gate_wait();
  pthread_mutex_lock(&r->mu);
  while (!r->stop && r->ntodo > 0 && r->ndone < REFINE_MAX) {
    struct plan_key k = r->todo[0];
    memmove(&r->todo[0], &r->todo[1], (size_t)(r->ntodo - 1) * sizeof r->todo[0]);
    r->ntodo--;
    pthread_mutex_unlock(&r->mu);
    int measured = 0, unused = 0, spawned = 0;
    void *plan = NULL;
    char *wisdom = r->exe ? measure_in_child(r, &k, &spawned) : NULL;
    if (wisdom) {
      /* Measured there: here the plan comes from its wisdom at once. */
      dspk__cpu_fftw_lock();
      if (k.dbl ? fftw_import_wisdom_from_string(wisdom)
                : fftwf_import_wisdom_from_string(wisdom))
        plan = make_plan(k.kind, k.dbl, k.n, k.batch, k.inplace, k.aligned,
                         k.flags | FFTW_WISDOM_ONLY, 0, REFINE_TIMELIMIT_S, &measured,
                         &unused, NULL);
      dspk__cpu_fftw_unlock();
      free(wisdom);
    } else if (!spawned) {
      /* No child process to be had (or none asked for): measured here,
       * holding the planner. */
      dspk__cpu_fftw_lock();
      plan = make_plan(k.kind, k.dbl, k.n, k.batch, k.inplace, k.aligned, k.flags, 0,
                       REFINE_TIMELIMIT_S, &measured, &unused, NULL);
      dspk__cpu_fftw_unlock();
    }
    pthread_mutex_lock(&r->mu);
    if (plan) {
      r->done[r->ndone].k = k;
      r->done[r->ndone].plan = plan;
      r->ndone++;
    }
  }
  r->ntodo = 0; /* stopping, or adoption lags: dropped (asked again later) */
  r->running = 0;
  int abandoned = r->abandoned;
  pthread_cond_broadcast(&r->idle);
  pthread_mutex_unlock(&r->mu);
  if (abandoned)
    refine_free(r);
  return NULL;
}

/* Queues k for background measuring (best effort: a full queue, a thread
 * that cannot start, or no memory leave the estimated plan in use). */
static void refine_request(struct dspk__dev *dev, const struct plan_key *k) {
  struct dspk__cpu_refine *r = dev->refine;
  if (!r) {
    if (!(r = calloc(1, sizeof *r)))
      return;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->idle, NULL);
    r->exe = dev->env.measure_exe;
    dev->refine = r;
  }
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->ntodo; i++)
    if (memcmp(&r->todo[i], k, sizeof *k) == 0)
      goto out;
  if (r->ntodo + r->ndone >= REFINE_MAX)
    goto out;
  r->todo[r->ntodo++] = *k;
  if (!r->running) {
    if (r->joinable) /* exited: running was cleared as its last step */
      pthread_join(r->thread, NULL);
    r->joinable = 0;
    r->running = 1;
    if (pthread_create(&r->thread, NULL, refine_main, r) == 0) {
      pthread_setname_np(r->thread, "dspk-fftw-plan"); /* named before it runs */
      r->joinable = 1;
    } else {
      r->running = 0;
      r->ntodo = 0;
    }
  }
out:
  pthread_mutex_unlock(&r->mu);
}

int dspk__cpu_fft_refine_wait(struct dspk__dev *dev) {
  struct dspk__cpu_refine *r = dev ? dev->refine : NULL;
  if (!r)
    return 0;
  pthread_mutex_lock(&r->mu);
  while (r->running)
    pthread_cond_wait(&r->idle, &r->mu);
  int n = r->ndone;
  pthread_mutex_unlock(&r->mu);
  return n;
}

void dspk__cpu_fft_adopt(struct dspk__dev *dev) {
  struct dspk__cpu_refine *r = dev->refine;
  struct plan_key keys[REFINE_MAX];
  void *plans[REFINE_MAX];
  int n, adopted = 0;
  if (!r)
    return;
  pthread_mutex_lock(&r->mu);
  n = r->ndone;
  pthread_mutex_unlock(&r->mu);
  /* The planner held (a measuring for a canceled task): adopted after a
   * later op, for this op's cancel is not looked at here. */
  if (n == 0 || fftw_trylock() != 0)
    return;
  pthread_mutex_lock(&r->mu);
  n = r->ndone;
  for (int i = 0; i < n; i++) {
    keys[i] = r->done[i].k;
    plans[i] = r->done[i].plan;
  }
  r->ndone = 0;
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < n; i++) {
    struct plan_key *k = &keys[i];
    struct dspk__cpu_plan *slot = NULL;
    for (int j = 0; j < dev->nplans && !slot; j++) {
      struct dspk__cpu_plan *p = &dev->plans[j];
      if (p->kind == k->kind && p->dbl == k->dbl && p->n == k->n && p->batch == k->batch &&
          p->inplace == k->inplace && p->aligned == k->aligned)
        slot = p;
    }
    if (!slot) /* evicted meanwhile: keep it anyway, it is the better plan */
      slot = plan_slot(dev);
    else
      destroy_plan(slot);
    *slot = (struct dspk__cpu_plan){.kind = k->kind, .dbl = k->dbl, .inplace = k->inplace,
                                    .aligned = k->aligned, .n = k->n, .batch = k->batch,
                                    .plan = plans[i], .last_use = ++dev->plan_clock};
    adopted++;
  }
  dspk__cpu_fftw_unlock();
  if (adopted && dev->env.log) {
    char m[96];
    snprintf(m, sizeof m, "fftw: %d plan(s) measured in the background taken in", adopted);
    dev->env.log(dev->env.log_ud, 3, m); /* debug */
  }
  dev->plans_refined += (uint64_t)adopted;
  dev->wisdom_dirty = 1;
  dspk__cpu_fft_wisdom_flush(dev);
}

/* 1 when a measuring was in progress: its thread took dev's cached plans
 * (it holds the planner lock that destroying them needs) and frees them
 * with its own when done; 0 when the caller destroys them. */
static int refine_release(struct dspk__dev *dev) {
  struct dspk__cpu_refine *r = dev->refine;
  if (!r)
    return 0;
  dev->refine = NULL;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  r->ntodo = 0;
  int busy = r->running, joinable = r->joinable;
  pthread_t th = r->thread;
  if (busy) {
    memcpy(r->orphans, dev->plans, (size_t)dev->nplans * sizeof dev->plans[0]);
    r->norphans = dev->nplans;
    r->abandoned = 1;
    if (r->child > 0) /* its plan would be dropped: stop its measuring now */
      kill(r->child, SIGKILL);
  }
  pthread_mutex_unlock(&r->mu);
  if (busy) { /* measuring (up to REFINE_TIMELIMIT_S): it frees r when done */
    pthread_detach(th);
    return 1;
  }
  if (joinable)
    pthread_join(th, NULL);
  refine_free(r);
  return 0;
}

/* ---- measuring for a task ------------------------------------------------- */

/* A plan measured for a task by a thread of its own (see the top of this
 * file).  Two references: the runner's and the thread's. */
struct for_task {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs, done, abandoned, measured;
  int kind, dbl, n, batch, inplace, aligned;
  unsigned flags;
  void *plan;
};

/* Set when a measuring whose task was canceled made wisdom: the runner's
 * next plan marks the device's wisdom to be stored. */
static atomic_int for_task_wisdom;

static void for_task_unref(struct for_task *a) {
  pthread_mutex_lock(&a->mu);
  int last = --a->refs == 0;
  pthread_mutex_unlock(&a->mu);
  if (last) {
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
  }
}

#ifdef DSPK_TEST_HOOKS
/* Test builds, DSPK_CPU_FFTW_TASK_GATE=DIR: the k-th measuring for a task
 * (counted from 1 as their threads start) holds the planner lock, before
 * it measures, until the file DIR/k exists, so that a test keeps a
 * measuring going as long as it likes (tests/daemon planwait). */
static atomic_int gate_count;
static void task_gate(void) {
  const char *dir = DSPK_TEST_HOOK("DSPK_CPU_FFTW_TASK_GATE");
  if (!dir)
    return;
  char path[4096];
  snprintf(path, sizeof path, "%s/%d", dir, atomic_fetch_add(&gate_count, 1) + 1);
  while (access(path, F_OK) != 0) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}
#else
static void task_gate(void) {}
#endif

static void *for_task_main(void *arg) {
  struct for_task *a = arg;
  int measured = 0, unused = 0;
  if (DSPK_TEST_HOOK("DSPK_CPU_FFTW_TASK_HOLD")) {
    /* Test builds: the measuring starts only once its task let go of it
     * (a cancel), so that a test cancels while it is measured. */
    pthread_mutex_lock(&a->mu);
    while (!a->abandoned)
      pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
  }
  dspk__cpu_fftw_lock();
  task_gate();
  void *plan = make_plan(a->kind, a->dbl, a->n, a->batch, a->inplace, a->aligned, a->flags, 0,
                         FFTW_NO_TIMELIMIT, &measured, &unused, NULL);
  /* The planner lock goes before the task hears of its plan: the runner
   * stores the wisdom right after its op with a trylock (it never waits for
   * a measuring), which would find the lock still this thread's and leave
   * the wisdom unstored until a later op. */
  dspk__cpu_fftw_unlock();
  pthread_mutex_lock(&a->mu);
  int orphan = a->abandoned;
  if (!orphan) {
    a->plan = plan;
    a->measured = measured;
  }
  a->done = 1;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  if (orphan) { /* its task was canceled: the wisdom stays, not the plan */
    struct dspk__cpu_plan p = {.dbl = a->dbl, .plan = plan};
    dspk__cpu_fftw_lock();
    destroy_plan(&p);
    if (measured)
      atomic_store(&for_task_wisdom, 1);
    dspk__cpu_fftw_unlock();
  }
  for_task_unref(a);
  return NULL;
}

/* Measures a plan for the running op (dev->ctx), without the planner lock
 * (its thread takes it): the plan, *measured set when it made wisdom; NULL
 * when FFTW failed or the op was canceled meanwhile. */
static void *measure_for_task(struct dspk__dev *dev, int kind, int dbl, int n, int batch,
                              int inplace, int aligned, unsigned flags, int *measured,
                              struct plan_step *st) {
  struct dspk__opctx *ctx = dev->ctx;
  struct for_task *a;
  pthread_attr_t attr;
  pthread_t th;
  void *plan = NULL;
  int started = 0;

  if (dspk__cpu_canceled(ctx))
    return NULL; /* canceled while it waited for the planner: nothing to start */
  a = calloc(1, sizeof *a);
  if (a) {
    *a = (struct for_task){.refs = 2, .kind = kind, .dbl = dbl, .n = n, .batch = batch,
                           .inplace = inplace, .aligned = aligned, .flags = flags};
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_attr_init(&attr) == 0) {
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      started = pthread_create(&th, &attr, for_task_main, a) == 0;
      pthread_attr_destroy(&attr);
    }
    if (started)
      pthread_setname_np(th, "dspk-fftw-task");
  }
  if (!started) { /* no thread to be had: measured here, as before */
    int unused = 0;
    if (a) {
      pthread_mutex_destroy(&a->mu);
      pthread_cond_destroy(&a->cv);
      free(a);
    }
    dspk__cpu_fftw_lock();
    plan = make_plan(kind, dbl, n, batch, inplace, aligned, flags, 1, FFTW_NO_TIMELIMIT,
                     measured, &unused, NULL);
    dspk__cpu_fftw_unlock();
    return plan;
  }
  step_open(st);
  pthread_mutex_lock(&a->mu);
  while (!a->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    if (!a->done && dspk__cpu_canceled(ctx)) {
      a->abandoned = 1;
      pthread_cond_broadcast(&a->cv); /* a test hook's hold waits for it */
      break;
    }
  }
  plan = a->plan;
  *measured = a->measured;
  a->plan = NULL;
  pthread_mutex_unlock(&a->mu);
  for_task_unref(a);
  return plan;
}

/* ---- the plan cache ------------------------------------------------------- */

void *dspk__cpu_fft_plan(struct dspk__dev *dev, int kind, int dbl, int n,
                         int batch, int inplace, int aligned) {
  if (kind == DSPK__CPU_FFT_R2C || kind == DSPK__CPU_FFT_C2R)
    inplace = 0;
  uint64_t now = ++dev->plan_clock;
  for (int i = 0; i < dev->nplans; i++) {
    struct dspk__cpu_plan *p = &dev->plans[i];
    if (p->kind == kind && p->dbl == dbl && p->n == n && p->batch == batch &&
        p->inplace == inplace && p->aligned == aligned) {
      p->last_use = now;
      dev->plan_hits++;
      dspk__fftw_wisdom_used(dev->env.cache, dbl);
      return p->plan;
    }
  }
  unsigned flags = dspk__cpu_fft_flags(dev, kind, dbl, n, batch);
  struct plan_step st = {.dev = dev};
  if (fftw_lock_op(dev, &st) != 0)
    return NULL; /* canceled while another measuring held the planner */
  int measured = 0, need_measure = 0, apart = 0;
  if (atomic_exchange(&for_task_wisdom, 0))
    dev->wisdom_dirty = 1; /* a canceled task's measuring: store its wisdom */
  /* Inside an op (dev->ctx), a plan to measure is measured apart, so
   * that the op's cancel is seen meanwhile. */
  void *plan = make_plan(kind, dbl, n, batch, inplace, aligned, flags, 1,
                         FFTW_NO_TIMELIMIT, &measured, &need_measure, dev->ctx ? &apart : NULL);
  struct dspk__cpu_plan *slot = NULL;
  if (!plan && apart) {
    /* Its slot taken now, under the lock (a plan evicted is destroyed):
     * after the measuring the lock may be another measuring's for
     * seconds, which the task does not wait for.  An empty slot (n 0)
     * matches no plan and is the first one evicted. */
    slot = plan_slot(dev);
    *slot = (struct dspk__cpu_plan){.plan = NULL};
    dspk__cpu_fftw_unlock();
    plan = measure_for_task(dev, kind, dbl, n, batch, inplace, aligned, flags, &measured,
                            &st);
    if (!plan)
      return NULL; /* canceled (the caller checks), or FFTW failed */
  } else {
    slot = plan ? plan_slot(dev) : NULL;
    dspk__cpu_fftw_unlock();
  }
  if (!plan)
    return NULL;
  step_close(&st);
  *slot = (struct dspk__cpu_plan){.kind = kind, .dbl = dbl, .inplace = inplace,
                                  .aligned = aligned, .n = n, .batch = batch,
                                  .plan = plan, .last_use = now};
  dev->plans_made++;
  if (measured)
    dev->wisdom_dirty = 1; /* new wisdom to store after the op */
  if (need_measure) {
    struct plan_key k = {kind, dbl, n, batch, inplace, aligned, flags};
    refine_request(dev, &k);
  }
  return plan;
}

void dspk__cpu_fft_exec(int kind, int dbl, void *plan, void *in, void *out) {
  if (dbl) {
    switch (kind) {
    case DSPK__CPU_FFT_R2C: fftw_execute_dft_r2c(plan, in, out); break;
    case DSPK__CPU_FFT_C2R: fftw_execute_dft_c2r(plan, in, out); break;
    default: fftw_execute_dft(plan, in, out); break;
    }
  } else {
    switch (kind) {
    case DSPK__CPU_FFT_R2C: fftwf_execute_dft_r2c(plan, in, out); break;
    case DSPK__CPU_FFT_C2R: fftwf_execute_dft_c2r(plan, in, out); break;
    default: fftwf_execute_dft(plan, in, out); break;
    }
  }
}

void dspk__cpu_fft_wisdom_flush(struct dspk__dev *dev) {
  if (!dev->wisdom_dirty || !dev->env.cache)
    return;
  if (dev->refine) { /* the planner lock is the measuring's: store after a later op */
    pthread_mutex_lock(&dev->refine->mu);
    int busy = dev->refine->running;
    pthread_mutex_unlock(&dev->refine->mu);
    if (busy)
      return;
  }
  /* Nor does it wait for a measuring for a canceled task, which holds the
   * lock for seconds: a canceled op's answer, and the next task, would
   * wait for it (probe 21 A1).  Stored after a later op. */
  if (fftw_trylock() != 0)
    return;
  dev->wisdom_dirty = 0;
  dspk__cpu_tune_wisdom_save_locked(dev); /* best effort: a failure costs a re-plan */
  dspk__cpu_fftw_unlock();
}

int dspk__cpu_fft_aligned(int dbl, const void *p) {
  return dbl ? fftw_alignment_of((double *)p) == 0
             : fftwf_alignment_of((float *)p) == 0;
}

/* The inverse's 1/n, on the m values of po. */
static void normalise(void *po, int64_t m, int dbl, int64_t n) {
  if (dbl) {
    double *f = po, s = 1.0 / (double)n;
    for (int64_t i = 0; i < m; i++)
      f[i] *= s;
  } else {
    float *f = po, s = (float)(1.0 / (double)n);
    for (int64_t i = 0; i < m; i++)
      f[i] *= s;
  }
}

/* The power of two row i of the chunk at pi is transformed scaled by
 * (dspk__cpu_scale_exp: 0 for ordinary rows). */
static int row_exp(const char *pi, int64_t i, int64_t vals, int dbl) {
  size_t rs = dbl ? 8 : 4;
  return dspk__cpu_scale_exp(dspk__cpu_absmax(pi + (size_t)(i * vals) * rs, vals, dbl), dbl);
}

/* Rows whose largest part lies outside [2^-E, 2^E] (DSPK__CPU_SCALE_EXP,
 * as fir's FFT path): the transform of such a row is made again from the
 * row multiplied by the power of two that puts that part in [1/2, 1), and
 * multiplied back after (the inverse's 1/n applied first, so the result is
 * rounded once to the subnormals).  Unscaled, a row of subnormal values
 * loses the low bits of its intermediates (tens to hundreds of units of the
 * smallest subnormal, growing with n), and one within a few times of the
 * dtype's largest value overflows in them although its transform is in
 * range.  The chunk of cb rows at pi was transformed into po already (for
 * an in-place chunk, pi == po, the caller scaled those rows before the
 * transform instead, see below); `from` is the first row that needs it.
 * Runs each such row through a scaled copy and a plan of one row. */
static int rescale_rows(struct dspk__dev *dev, int kind, int dbl, int64_t n, int64_t on,
                        const char *pi, char *po, int64_t from, int64_t cb, int64_t ivals,
                        struct dspk__opctx *ctx) {
  size_t rs = dbl ? 8 : 4, ib = (size_t)ivals * rs;
  void *tmp = dbl ? fftw_malloc(ib) : fftwf_malloc(ib);
  int rc = 0;
  if (!tmp)
    return dspk__cpu_err(ctx, DSPK_ENOMEM, "fft: out of memory for a row of length %lld",
                         (long long)n);
  for (int64_t i = from; i < cb; i++) {
    int e = row_exp(pi, i, ivals, dbl);
    if (!e)
      continue;
    char *o = po + (size_t)(i * 2 * on) * rs;
    void *plan = dspk__cpu_fft_plan(dev, kind, dbl, (int)n, 1, 0, dspk__cpu_fft_aligned(dbl, o));
    if (!plan) {
      rc = dspk__cpu_canceled(ctx) ? DSPK_ECANCELED
                                   : dspk__cpu_err(ctx, DSPK_ENOMEM,
                                                   "fft: FFTW could not plan a transform of "
                                                   "length %lld",
                                                   (long long)n);
      break;
    }
    memcpy(tmp, pi + (size_t)i * ib, ib);
    dspk__cpu_scale2(tmp, ivals, dbl, e);
    dspk__cpu_fft_exec(kind, dbl, plan, tmp, o);
    if (kind == DSPK__CPU_FFT_BWD)
      normalise(o, 2 * on, dbl, n);
    dspk__cpu_scale2(o, 2 * on, dbl, -e);
  }
  if (dbl)
    fftw_free(tmp);
  else
    fftwf_free(tmp);
  return rc;
}

int dspk__cpu_fft(struct dspk__dev *dev, struct dspk__op *op,
                  struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  struct dspk__tensor *Y = &op->out[0];
  int cplx = dspk__dtype_is_complex(X->dtype);
  int dbl = X->dtype == DSPK_F64 || X->dtype == DSPK_C128;
  int kind = !cplx ? DSPK__CPU_FFT_R2C
             : op->u.fft.inverse ? DSPK__CPU_FFT_BWD : DSPK__CPU_FFT_FWD;
  int64_t n = X->shape[X->rank - 1];
  int64_t rows = dspk__tensor_numel(X) / n;
  int64_t on = Y->shape[Y->rank - 1];
  int64_t ivals = cplx ? 2 * n : n; /* reals a row of X */
  size_t ies = dspk__dtype_size(X->dtype), oes = dspk__dtype_size(Y->dtype);
  int64_t chunk = CHUNK_ELEMS / n;
  if (chunk < 1)
    chunk = 1;
  if (chunk > rows)
    chunk = rows;
  if (chunk > INT32_MAX)
    chunk = INT32_MAX;
  char *in = dspk__cpu_ptr(X), *out = dspk__cpu_ptr(Y);
  for (int64_t r = 0; r < rows; r += chunk) {
    if (r && dspk__cpu_canceled(ctx))
      return DSPK_ECANCELED;
    int64_t cb = rows - r < chunk ? rows - r : chunk;
    char *pi = in + r * n * ies, *po = out + r * on * oes;
    int inplace = pi == po;
    int aligned = dspk__cpu_fft_aligned(dbl, pi) && dspk__cpu_fft_aligned(dbl, po);
    /* The first row to be scaled (see rescale_rows), cb when none: one
     * scan of the chunk, all that ordinary data pay. */
    int64_t first = 0;
    while (first < cb && !row_exp(pi, first, ivals, dbl))
      first++;
    /* In place, the rows are scaled before the transform overwrites them,
     * and their exponents kept for after. */
    int *ex = NULL;
    if (inplace && first < cb) {
      if (!(ex = calloc((size_t)cb, sizeof *ex)))
        return dspk__cpu_err(ctx, DSPK_ENOMEM, "fft: out of memory for %lld rows",
                             (long long)cb);
      for (int64_t i = first; i < cb; i++)
        if ((ex[i] = row_exp(pi, i, ivals, dbl)))
          dspk__cpu_scale2(pi + i * n * ies, ivals, dbl, ex[i]);
    }
    void *plan = dspk__cpu_fft_plan(dev, kind, dbl, (int)n, (int)cb, inplace, aligned);
    if (!plan) {
      /* The rows scaled in place are the output's (their input is gone
       * either way with the error). */
      free(ex);
      if (dspk__cpu_canceled(ctx))
        return DSPK_ECANCELED;
      return dspk__cpu_err(ctx, DSPK_ENOMEM,
                           "fft: FFTW could not plan a transform of length %lld",
                           (long long)n);
    }
    dspk__cpu_fft_exec(kind, dbl, plan, pi, po);
    dspk__cpu_fft_wisdom_flush(dev);
    if (kind == DSPK__CPU_FFT_BWD)
      normalise(po, 2 * cb * n, dbl, n);
    if (ex) {
      for (int64_t i = first; i < cb; i++)
        if (ex[i])
          dspk__cpu_scale2(po + i * on * oes, 2 * on, dbl, -ex[i]);
      free(ex);
    } else if (first < cb) {
      int rc = rescale_rows(dev, kind, dbl, n, on, pi, po, first, cb, ivals, ctx);
      if (rc)
        return rc;
    }
  }
  return 0;
}
