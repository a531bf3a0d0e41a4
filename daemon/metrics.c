/*
 * Metrics (daemon/observe.h): what each runner records about its jobs, the
 * activity that `status` reports per device, and the Prometheus text of the
 * `metrics` method and of the optional HTTP listener (--metrics-listen).
 *
 * The text is rendered on the loop thread only, from the loop's own
 * counters, each device's record copied under its mutex, and the cache's
 * atomic counters.  The HTTP listener is libmicrohttpd with its own polling
 * thread; for each scrape that thread wakes the loop (uv_async_send), waits
 * for the loop to render the text, and serves it: it never reads the
 * daemon's state itself, so the loop stays the only owner of connections
 * and devices.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef DSPKD_HAVE_MHD
#include <microhttpd.h>
#endif

#include "cache/cache.h"
#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/dspkd.h"
#include "daemon/log.h"
#include "daemon/sched.h"

#define NS 1000000000ull
#define BUSY_WINDOW_S 5 /* the busy fraction covers the last 4 to 5 seconds */

uint64_t dspkd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

static const char *const result_names[3] = {"ok", "error", "canceled"};

const char *dspkd_obs_job_name(int kind, int op) {
  switch (kind) {
  case JOB_TASK:
    return op >= 0 && op < DSPK_OP_COUNT ? dspk__op_names[op] : "task";
  case JOB_BUF_CREATE:
    return "buffer.create";
  case JOB_BUF_WRITE:
    return "buffer.write";
  case JOB_BUF_READ:
    return "buffer.read";
  default:
    return "buffer.free";
  }
}

/* ---- runner side ------------------------------------------------------ */

static void hist_add(struct dspkd_hist *h, uint64_t ns) {
  static const double bounds[DSPKD_HIST_N] = DSPKD_HIST_BOUNDS;
  double s = (double)ns / (double)NS;
  int i = 0;
  while (i < DSPKD_HIST_N && s > bounds[i])
    i++;
  h->bucket[i]++;
  h->count++;
  h->sum_ns += ns;
}

/* Adds the busy interval [t0, t1) to the total and to the one-second slots
 * (only the last DSPKD_BUSY_SLOTS seconds of it can still be read). */
static void busy_add(struct dev_obs *o, uint64_t t0, uint64_t t1) {
  uint64_t lo = t0;
  if (t1 <= t0)
    return;
  o->busy_ns += t1 - t0;
  if (t1 / NS >= DSPKD_BUSY_SLOTS && lo < (t1 / NS - DSPKD_BUSY_SLOTS + 1) * NS)
    lo = (t1 / NS - DSPKD_BUSY_SLOTS + 1) * NS;
  for (uint64_t s = lo / NS; s <= t1 / NS; s++) {
    uint64_t a = s * NS > lo ? s * NS : lo, b = (s + 1) * NS < t1 ? (s + 1) * NS : t1;
    int i = (int)(s % DSPKD_BUSY_SLOTS);
    if (b <= a)
      continue;
    if (o->slot_sec[i] != s) {
      o->slot_sec[i] = s;
      o->slot_ns[i] = 0;
    }
    o->slot_ns[i] += b - a;
  }
}

/* The device's "running job" is the oldest one taken and not yet finished
 * on the device (with several enqueued ahead of their answers, the others
 * wait behind it); run_start is when its turn began: when it was taken, or
 * when the job before it finished, whichever is later.  So the busy
 * intervals of successive jobs never overlap. */
static void run_set(struct dev_obs *o, const struct job *j, uint64_t start) {
  o->run_start = start;
  o->run_queued = j->t.queued;
  o->run_kind = (uint8_t)j->kind;
  o->run_op = (uint8_t)j->op.kind;
  o->run_client = j->conn ? j->conn->id : 0;
  o->run_job = j->slurm_job;
  o->run_uid = j->uid;
  o->run_msgid = j->msgid;
  o->run_q = j->q;
}

void dspkd_obs_job_start(struct device *dev, struct job *j) {
  struct dev_obs *o = &dev->obs;
  uint64_t now = dspkd_now_ns();

  j->t.start = now;
  if (j->conn && j->t.queued && now >= j->t.queued)
    hist_add(&o->queue, now - j->t.queued);
  if (!o->run_start)
    run_set(o, j, now);
}

/* Keeps the job in the trace ring while a trace is in progress. */
static void trace_keep(struct dev_obs *o, const struct job *j, uint64_t start, uint64_t end) {
  struct trace_rec *r;
  if (!o->tracers || !o->rec)
    return;
  r = &o->rec[o->seq++ % DSPKD_TRACE_RING];
  memset(r, 0, sizeof *r);
  r->t = j->t;
  r->err = j->err;
  r->msgid = j->msgid;
  r->t.start = start;
  r->t.end = end;
  r->client = j->conn ? j->conn->id : 0;
  r->slurm_job = j->slurm_job;
  r->uid = j->uid;
  r->kind = (uint8_t)j->kind;
  r->op = (uint8_t)j->op.kind;
}

void dspkd_obs_job_end(struct device *dev, struct job *j, uint64_t start, uint64_t now,
                       const struct job *next) {
  struct dev_obs *o = &dev->obs;

  j->t.end = now;
  if (j->kind == JOB_TASK && j->op.kind < DSPK_OP_COUNT) {
    int res = j->err == 0 ? 0 : j->err == DSPK_ECANCELED ? 2 : 1;
    o->tasks[j->op.kind][res]++;
    hist_add(&o->run[j->op.kind], now - j->t.start); /* as its time_us */
  }
  busy_add(o, start, now);
  trace_keep(o, j, start, now);
  o->run_start = 0;
  if (next)
    run_set(o, next, now);
}

/* ---- activity (status, top) ------------------------------------------- */

void dspkd_obs_activity(struct device *dev, struct dev_activity *a) {
  struct dev_obs *o = &dev->obs;
  uint64_t now = dspkd_now_ns(), s_now = now / NS, busy = 0, win;
  uint64_t s_lo = s_now >= BUSY_WINDOW_S - 1 ? s_now - (BUSY_WINDOW_S - 1) : 0;
  uint64_t win_start = s_lo * NS;

  memset(a, 0, sizeof *a);
  pthread_mutex_lock(&dev->mu);
  if (o->start_ns > win_start)
    win_start = o->start_ns;
  for (uint64_t s = s_lo; s <= s_now; s++) {
    int i = (int)(s % DSPKD_BUSY_SLOTS);
    if (o->slot_sec[i] == s)
      busy += o->slot_ns[i];
  }
  if (o->run_start) {
    busy += now - (o->run_start > win_start ? o->run_start : win_start);
    a->running = true;
    a->what = dspkd_obs_job_name(o->run_kind, o->run_op);
    a->age_ns = now - o->run_start;
    a->client = o->run_client;
    a->uid = o->run_uid;
  }
  /* Connections with queued jobs here (the ring holds one queue per
   * connection, plus the internal one), and the running job's. */
  a->clients = dspkd_sched_clients_locked(dev, o->run_start ? o->run_q : NULL);
  pthread_mutex_unlock(&dev->mu);
  win = now > win_start ? now - win_start : 0;
  a->busy = win ? (double)busy / (double)win : 0;
  if (a->busy > 1)
    a->busy = 1;
}

/* ---- the Prometheus text ---------------------------------------------- */

struct tbuf {
  char *p;
  size_t len, cap;
  int err;
};

__attribute__((format(printf, 2, 3)))
static void tput(struct tbuf *t, const char *fmt, ...) {
  va_list ap;
  int n;
  if (t->err)
    return;
  for (;;) {
    va_start(ap, fmt);
    n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->err = DSPK_EINTERNAL;
      return;
    }
    if (t->p && (size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap : 16384;
    while (cap - t->len <= (size_t)n)
      cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p) {
      t->err = DSPK_ENOMEM;
      return;
    }
    t->p = p;
    t->cap = cap;
  }
}

/* # HELP and # TYPE of a family. */
static void family(struct tbuf *t, const char *name, const char *type, const char *help) {
  tput(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one sample without labels. */
static void scalar(struct tbuf *t, const char *name, const char *type, const char *help,
                   unsigned long long v) {
  family(t, name, type, help);
  tput(t, "%s %llu\n", name, v);
}

/* A label value with \, " and newlines escaped (the format's rules). */
static const char *lv(const char *s, char *buf, size_t cap) {
  size_t n = 0;
  for (; *s && n + 2 < cap; s++) {
    if (*s == '\\' || *s == '"' || *s == '\n') {
      buf[n++] = '\\';
      buf[n++] = *s == '\n' ? 'n' : *s;
    } else {
      buf[n++] = *s;
    }
  }
  buf[n] = '\0';
  return buf;
}

/* What the text shows of one device, copied under its mutex. */
struct devsnap {
  const struct device *dev;
  char id[96];
  uint64_t queued, running, completed, failed;
  struct dspk__devstats stats;
  struct dev_obs obs;
  struct dev_activity act;
  uint64_t busy_ns; /* obs.busy_ns and the running job's time so far */
};

static void hist_lines(struct tbuf *t, const char *name, const char *labels,
                       const struct dspkd_hist *h) {
  static const double bounds[DSPKD_HIST_N] = DSPKD_HIST_BOUNDS;
  uint64_t cum = 0;
  for (int i = 0; i < DSPKD_HIST_N; i++) {
    cum += h->bucket[i];
    tput(t, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, bounds[i], (unsigned long long)cum);
  }
  tput(t, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
  tput(t, "%s_sum{%s} %.9f\n", name, labels, (double)h->sum_ns / (double)NS);
  tput(t, "%s_count{%s} %llu\n", name, labels, (unsigned long long)h->count);
}

/* One gauge or counter family with one sample per device. */
#define PER_DEVICE(t, snaps, n, name, type, help, fmt, expr)                                 \
  do {                                                                                     \
    family(t, name, type, help);                                                           \
    for (int i_ = 0; i_ < (n); i_++) {                                                     \
      const struct devsnap *s = &(snaps)[i_];                                              \
      tput(t, name "{device=\"%s\"} " fmt "\n", s->id, expr);                              \
    }                                                                                      \
  } while (0)

/* The backend's counters of a device (struct dspk__devstats): a family
 * each, a sample per device. */
#define DEVSTAT(name, type, field, help) {name, type, help, offsetof(struct dspk__devstats, field)}
static const struct {
  const char *name, *type, *help;
  size_t off; /* of a uint64_t in struct dspk__devstats */
} devstat_families[] = {
    DEVSTAT("dspk_memory_in_use_bytes", "gauge", pool_bytes_in_use,
            "Device memory the daemon's pool has handed out."),
    DEVSTAT("dspk_memory_cached_bytes", "gauge", pool_bytes_cached,
            "Device memory the daemon's pool keeps for reuse."),
    DEVSTAT("dspk_pool_hits_total", "counter", pool_hits,
            "Allocations served from the pool's cached blocks."),
    DEVSTAT("dspk_pool_misses_total", "counter", pool_misses,
            "Allocations that needed new device memory."),
    DEVSTAT("dspk_retire_deferred_total", "counter", retire_deferred,
            "Frees deferred until the device finished with the memory."),
    DEVSTAT("dspk_retire_released_total", "counter", retire_released,
            "Deferred frees released."),
    DEVSTAT("dspk_retire_barrier_fallbacks_total", "counter", retire_barrier_fallbacks,
            "Deferred frees that had to wait for the whole device."),
    DEVSTAT("dspk_retire_leaked_total", "counter", retire_leaked,
            "Deferred frees that could not be released."),
    DEVSTAT("dspk_retire_in_flight", "gauge", retire_in_flight,
            "Deferred frees not yet released."),
    DEVSTAT("dspk_retire_max_in_flight", "gauge", retire_max_in_flight,
            "Most deferred frees outstanding at once."),
    DEVSTAT("dspk_kernels_compiled_total", "counter", kernels_compiled,
            "Kernels the device's backend compiled."),
    DEVSTAT("dspk_kernel_cache_hits_total", "counter", kernel_cache_hits,
            "Kernels the device's backend found already compiled."),
};
#undef DEVSTAT

static void render_devices(struct tbuf *t, const struct devsnap *sn, int n) {
  char labels[256];

  family(t, "dspk_tasks_total", "counter",
         "task.run requests finished, by device, op and result (ok, error, canceled).");
  for (int i = 0; i < n; i++)
    for (int op = 0; op < DSPK_OP_COUNT; op++)
      for (int r = 0; r < 3; r++)
        if (sn[i].obs.tasks[op][r] || r == 0)
          tput(t, "dspk_tasks_total{device=\"%s\",op=\"%s\",result=\"%s\"} %llu\n", sn[i].id,
               dspk__op_names[op], result_names[r], (unsigned long long)sn[i].obs.tasks[op][r]);

  family(t, "dspk_task_queue_seconds", "histogram",
         "Time client jobs (tasks and buffer transfers) waited in the device's queue.");
  for (int i = 0; i < n; i++) {
    snprintf(labels, sizeof labels, "device=\"%s\"", sn[i].id);
    hist_lines(t, "dspk_task_queue_seconds", labels, &sn[i].obs.queue);
  }
  family(t, "dspk_task_run_seconds", "histogram",
         "Time task.run requests ran on the device (upload, tuning, compute, download).");
  for (int i = 0; i < n; i++)
    for (int op = 0; op < DSPK_OP_COUNT; op++) {
      if (!sn[i].obs.run[op].count)
        continue;
      snprintf(labels, sizeof labels, "device=\"%s\",op=\"%s\"", sn[i].id, dspk__op_names[op]);
      hist_lines(t, "dspk_task_run_seconds", labels, &sn[i].obs.run[op]);
    }

  PER_DEVICE(t, sn, n, "dspk_queue_depth", "gauge", "Client jobs queued on the device.", "%llu",
             (unsigned long long)s->queued);
  PER_DEVICE(t, sn, n, "dspk_running_jobs", "gauge", "Jobs running on the device (0 or 1).",
             "%llu", (unsigned long long)s->running);
  family(t, "dspk_jobs_total", "counter",
         "Client jobs (tasks and buffer transfers) finished on the device, by result.");
  for (int i = 0; i < n; i++) {
    tput(t, "dspk_jobs_total{device=\"%s\",result=\"ok\"} %llu\n", sn[i].id,
         (unsigned long long)sn[i].completed);
    tput(t, "dspk_jobs_total{device=\"%s\",result=\"error\"} %llu\n", sn[i].id,
         (unsigned long long)sn[i].failed);
  }
  PER_DEVICE(t, sn, n, "dspk_device_busy_ratio", "gauge",
             "Fraction of the last 4 to 5 seconds the device spent running jobs.", "%.4f",
             s->act.busy);
  PER_DEVICE(t, sn, n, "dspk_device_busy_seconds_total", "counter",
             "Time the device spent running jobs.", "%.6f",
             (double)s->busy_ns / (double)NS);
  PER_DEVICE(t, sn, n, "dspk_device_memory_bytes", "gauge", "The device's memory.", "%llu",
             (unsigned long long)s->dev->info.memory);
  for (size_t f = 0; f < sizeof devstat_families / sizeof devstat_families[0]; f++) {
    const char *name = devstat_families[f].name;
    family(t, name, devstat_families[f].type, devstat_families[f].help);
    for (int i = 0; i < n; i++)
      tput(t, "%s{device=\"%s\"} %llu\n", name, sn[i].id,
           (unsigned long long)*(const uint64_t *)((const char *)&sn[i].stats +
                                                   devstat_families[f].off));
  }
}

/* One job id's row of the dspk_slurm_job_* families. */
struct jrow {
  uint64_t id;
  bool shown; /* a registration of the id is one the viewer sees */
  uint64_t v[4];
};

static int jrow_cmp(const void *a, const void *b) {
  uint64_t x = ((const struct jrow *)a)->id, y = ((const struct jrow *)b)->id;
  return x < y ? -1 : x > y;
}

/* The Slurm jobs registered here (daemon/jobs.c), labelled by job id in
 * increasing order: the count of all, the series of those viewer sees
 * (NULL: all).  A job registered again while its earlier registration
 * still ends (a requeued job's prolog before its old epilog's job.end is
 * answered) has two registrations: one series for the id, the sum of both
 * (Prometheus refuses a scrape with one label set twice in a family).
 * Sorted rows and a binary search per connection: a scrape of MAX_JOBS
 * registrations and max_clients connections costs n log n, not n^2, on
 * the loop thread. */
static void render_jobs(struct tbuf *t, const struct dspkd *d, const struct conn *viewer,
                        bool admin) {
  static const char *const names[4] = {"connections", "inflight", "buffers", "buffer_bytes"};
  static const char *const helps[4] = {
      "Connections of the Slurm job open now.", "Requests of the Slurm job in flight.",
      "Buffers the Slurm job holds.", "Bytes of the buffers the Slurm job holds."};
  size_t nreg = 0, nrows = 0;
  for (const struct djob *j = d->jobs; j; j = j->next)
    nreg++;
  struct jrow *rows = nreg ? calloc(nreg, sizeof *rows) : NULL;
  if (nreg && !rows) {
    t->err = DSPK_ENOMEM;
    return;
  }
  size_t i = 0;
  for (const struct djob *j = d->jobs; j; j = j->next, i++) {
    rows[i].id = j->id;
    rows[i].shown = !viewer || dspkd_sees_uid(viewer, admin, (uint32_t)j->uid);
  }
  if (nreg)
    qsort(rows, nreg, sizeof *rows, jrow_cmp);
  for (i = 0; i < nreg; i++) {
    if (nrows && rows[nrows - 1].id == rows[i].id) {
      rows[nrows - 1].shown |= rows[i].shown;
      continue;
    }
    rows[nrows++] = rows[i];
  }
  scalar(t, "dspk_slurm_jobs", "gauge",
         "Slurm jobs registered on this node (job.register), those ending included.", nrows);
  for (const struct conn *c = d->conns; c; c = c->next) {
    const struct djob *cj = c->job;
    if (!cj || (viewer && !dspkd_sees_uid(viewer, admin, (uint32_t)cj->uid)))
      continue;
    struct jrow key = {.id = cj->id};
    struct jrow *r = nrows ? bsearch(&key, rows, nrows, sizeof *rows, jrow_cmp) : NULL;
    if (!r)
      continue;
    r->v[0]++;
    r->v[1] += dspkd_conn_inflight(c);
    r->v[2] += c->nbufs + c->held_bufs;
    r->v[3] += c->buf_bytes + c->held_bytes;
  }
  for (int k = 0; k < 4; k++) {
    char name[48];
    snprintf(name, sizeof name, "dspk_slurm_job_%s", names[k]);
    family(t, name, "gauge", helps[k]);
    for (i = 0; i < nrows; i++)
      if (rows[i].shown)
        tput(t, "%s{job=\"%llu\"} %llu\n", name, (unsigned long long)rows[i].id,
             (unsigned long long)rows[i].v[k]);
  }
  free(rows);
}

/* The persistent cache's counters (struct dspk__cache_kstats), a family
 * each, a sample per kind. */
static const struct {
  const char *name, *help;
  size_t off; /* of a uint64_t in struct dspk__cache_kstats */
} cache_families[] = {
    {"dspk_cache_hits_total",
     "Lookups the persistent cache answered, by kind (kernels, autotune, blobs).",
     offsetof(struct dspk__cache_kstats, hits)},
    {"dspk_cache_misses_total", "Lookups the persistent cache missed.",
     offsetof(struct dspk__cache_kstats, misses)},
    {"dspk_cache_puts_total",
     "Entries stored in the persistent cache (compiled kernels, tunings, blobs).",
     offsetof(struct dspk__cache_kstats, puts)},
    {"dspk_cache_evictions_total", "Entries the persistent cache evicted to stay within its size.",
     offsetof(struct dspk__cache_kstats, evictions)},
    {"dspk_cache_put_errors_total",
     "Entries the persistent cache failed to store (disk full, I/O error); not kept.",
     offsetof(struct dspk__cache_kstats, put_errors)},
};

int dspkd_metrics_render(struct dspkd *d, struct conn *viewer, char **text, size_t *len) {
  struct tbuf t = {0};
  struct devsnap *sn;
  struct dspk__cache_kstats ks[DSPK__CACHE_NKINDS];
  bool admin = !viewer || dspkd_admin_is(viewer);
  bool shown[DSPKD_MAX_DEVICES];
  char ver[64];
  int n = 0;

  sn = calloc(d->ndevs ? (size_t)d->ndevs : 1, sizeof *sn);
  if (!sn)
    return DSPK_ENOMEM;
  if (viewer)
    dspkd_devices_shown(viewer, admin, shown);
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    struct devsnap *s = &sn[n];
    if (dev->open_state != 1 || (viewer && !shown[i]))
      continue;
    s->dev = dev;
    lv(dev->id, s->id, sizeof s->id);
    dspkd_obs_activity(dev, &s->act);
    pthread_mutex_lock(&dev->mu);
    s->queued = dev->queued;
    s->running = dev->running;
    s->completed = dev->completed;
    s->failed = dev->failed;
    s->stats = dev->stats;
    s->obs = dev->obs;
    /* The running job's time so far, read with the total it will join, so
     * the busy counter never goes back. */
    s->busy_ns = s->obs.busy_ns + (s->obs.run_start ? dspkd_now_ns() - s->obs.run_start : 0);
    pthread_mutex_unlock(&dev->mu);
    n++;
  }

  family(&t, "dspk_info", "gauge", "The daemon's version.");
  tput(&t, "dspk_info{version=\"%s\"} 1\n", lv(DSPKD_VERSION, ver, sizeof ver));
  family(&t, "dspk_uptime_seconds", "gauge", "Seconds since the daemon started.");
  tput(&t, "dspk_uptime_seconds %.3f\n", (double)(dspkd_now_ms() - d->start_ms) / 1000.0);
  scalar(&t, "dspk_connections", "gauge", "Client connections open now.", d->nconns);
  scalar(&t, "dspk_connections_total", "counter", "Client connections accepted.",
         d->obs.conns_total);
  scalar(&t, "dspk_received_bytes_total", "counter", "Bytes read from clients.", d->obs.bytes_in);
  scalar(&t, "dspk_received_in_place_bytes_total", "counter",
         "Of the bytes read from clients, buffer.write data read straight into its buffer.",
         d->obs.bytes_in_place);
  scalar(&t, "dspk_sent_bytes_total", "counter", "Bytes written to clients.", d->obs.bytes_out);

  render_jobs(&t, d, viewer, admin);

  {
    unsigned k = 0;
    for (const struct trace_sess *ts = d->obs.traces; ts; ts = dspkd_trace_next(ts))
      k++;
    scalar(&t, "dspk_traces_in_progress", "gauge", "trace requests recording now.", k);
  }

  render_devices(&t, sn, n);

  dspk__cache_counts(d->cache, ks);
  for (size_t f = 0; f < sizeof cache_families / sizeof cache_families[0]; f++) {
    const char *name = cache_families[f].name;
    family(&t, name, "counter", cache_families[f].help);
    for (int k = 0; k < DSPK__CACHE_NKINDS; k++)
      tput(&t, "%s{kind=\"%s\"} %llu\n", name, dspk__cache_kind_name(k),
           (unsigned long long)*(const uint64_t *)((const char *)&ks[k] +
                                                   cache_families[f].off));
  }
  free(sn);
  if (t.err) {
    free(t.p);
    return t.err;
  }
  *text = t.p;
  *len = t.len;
  return 0;
}

int dspkd_m_metrics(struct req *r) {
  struct wreq *wr;
  char *text;
  size_t len;
  int err = dspkd_metrics_render(r->c->d, r->c, &text, &len);
  if (err < 0)
    return err;
  if (!(wr = dspkd_wreq_new())) {
    free(text);
    return DSPK_ENOMEM;
  }
  dspk__pack_result_head(&wr->w.pk, r->msgid);
  msgpack_pack_str(&wr->w.pk, len);
  msgpack_pack_str_body(&wr->w.pk, text, len);
  free(text);
  dspkd_conn_send(r->c, wr);
  return 0;
}

/* ---- the HTTP listener ------------------------------------------------- */

#ifdef DSPKD_HAVE_MHD

#define SCRAPE_WAIT_S 5 /* a scrape the loop did not answer by then gets 503 */
/* Idle or slow clients must not starve scrapes: up to HTTP_MAX_CONNS
 * connections at once (more wait in the listen backlog), each closed after
 * HTTP_IDLE_S seconds without progress (docs/admin.md). */
#define HTTP_MAX_CONNS 256
#define HTTP_IDLE_S 5

struct metrics_http {
  struct dspkd *d;
  struct MHD_Daemon *mhd;
  uv_async_t async;     /* wakes the loop to render */
  pthread_mutex_t mu;
  pthread_cond_t cv;    /* on CLOCK_MONOTONIC */
  /* Guarded by mu. */
  bool closed;
  uint64_t asked, served; /* scrape numbers */
  char *text;             /* the text of scrape `served` */
  size_t len;
  int err;
};

/* Loop thread: renders the text a scrape waits for. */
static void on_scrape(uv_async_t *a) {
  struct metrics_http *h = a->data;
  uint64_t want;
  char *text = NULL;
  size_t len = 0;
  int err;

  pthread_mutex_lock(&h->mu);
  want = h->asked;
  pthread_mutex_unlock(&h->mu);
  /* From the moment the stop begins (the grace period included) the
   * listener answers 503 (docs/protocol.md, "metrics"). */
  err = h->d->stopping ? DSPK_ESHUTDOWN : dspkd_metrics_render(h->d, NULL, &text, &len);
  pthread_mutex_lock(&h->mu);
  free(h->text);
  h->text = text;
  h->len = len;
  h->err = err;
  h->served = want;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, char *body,
                               size_t len, const char *type) {
  struct MHD_Response *resp;
  enum MHD_Result ret;
  resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, "Allow", "GET, HEAD");
  ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static enum MHD_Result respond_msg(struct MHD_Connection *conn, unsigned status,
                                   const char *msg) {
  char *body = strdup(msg);
  if (!body)
    return MHD_NO;
  return respond(conn, status, body, strlen(body), "text/plain; charset=utf-8");
}

/* The request's header lines that matter to a GET without a body. */
struct hdr_count {
  int content_length, host;
  bool body;     /* a Content-Length other than 0 (an empty one too), a Transfer-Encoding */
  bool bad_name; /* a field name that is no token (RFC 9110 5.1): a folded line */
  const char *host_like; /* a name longer than "Host" that begins with it */
};

/* Whether s is a token of RFC 9110 5.6.2, as every field name must be. */
static bool is_token(const char *s) {
  static const char extra[] = "!#$%&'*+-.^_`|~";
  if (!*s)
    return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
      return false;
  return true;
}

/* Whether the running libmicrohttpd is 0.9.75 or earlier, whose header
 * parser folded_line() knows (read once, at the listener's start). */
static bool mhd_old_parser;

/* Whether libmicrohttpd 0.9 (up to 0.9.75) joined a folded line (obs-fold)
 * to this field.  Its parser ends the name in place, where the ':' was,
 * and points the value into the same line after the blanks that follow;
 * a folded line makes it copy the name elsewhere in its memory pool (or
 * grow it over the value) to append the folded text, even a blank one:
 * "X-A: b" then " c" comes as the field "X-Ac" with the value "b", a name
 * that is a token, which is_token() alone cannot tell from a real one.
 * So the name is this field's own, unfolded, only where the value lies
 * just after it: the name's terminator, then blanks only, then the value.
 * Pointers of one pool, compared; the bytes read lie between them. */
static bool folded_line(const char *key, size_t ks, const char *value) {
  if (!mhd_old_parser || !value)
    return false;
  if ((uintptr_t)value <= (uintptr_t)key || (uintptr_t)value - (uintptr_t)key < ks + 1)
    return true;
  if (key[ks] != '\0')
    return true;
  for (const char *c = key + ks + 1; c < value; c++)
    if (*c != ' ' && *c != '\t' && *c != '\0')
      return true;
  return false;
}

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size) {
  struct hdr_count *hc = cls;
  (void)kind;
  (void)value_size;
  /* A fold onto Host that leaves a token ("Hostz") gets its own message
   * below (host_like); any other fold is a malformed line. */
  if (folded_line(key, key_size, value) &&
      !(strncasecmp(key, MHD_HTTP_HEADER_HOST, 4) == 0 && key[4] && is_token(key)))
    hc->bad_name = true;
  /* libmicrohttpd 0.9 joins a folded line (obs-fold, a line that begins
   * with a space or a tab) to the name of the field before it, not to its
   * value: "Host: x" then " Folded: y" comes as the field "HostFolded: y"
   * with the value "x".  A name with a space or a ':' in it is that, or a
   * malformed line: refused as one (RFC 9112 5.2 allows a 400), rather
   * than reported as the Host line it hid. */
  hc->bad_name |= !is_token(key);
  if (strncasecmp(key, MHD_HTTP_HEADER_HOST, 4) == 0 && key[4] && !hc->host_like)
    hc->host_like = key; /* "Host" and a folded word: "Hostz" */
  if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
    hc->content_length++;
    hc->body |= !value || !*value || strspn(value, "0") != strlen(value);
  } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
    hc->host++;
  } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
    hc->body = true;
  }
  return MHD_YES;
}

/* libmicrohttpd's thread: GET /metrics. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state) {
  struct metrics_http *h = cls;
  struct timespec deadline;
  uint64_t mine;
  char *text = NULL;
  size_t len = 0;
  int err = DSPK_ETIMEDOUT;

  (void)upload;
  /* Every answer is decided at the first call, which has the headers only:
   * a response queued then is sent without "100 Continue" and without
   * reading a body (libmicrohttpd closes the connection after it), so a
   * request that is refused never gets to upload one.  Later calls come
   * only with a body no answer asked for: dropped. */
  if (*state) {
    *upload_size = 0;
    return MHD_YES;
  }
  *state = h;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return respond_msg(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n");
  /* url is the target as sent, up to a '?' (the query, ignored):
   * keep_escaped leaves percent-escapes as they are, so that only /metrics
   * itself matches (libmicrohttpd decoded /%6detrics to /metrics, and
   * /metrics%00 to a string that ends there). */
  if (strcmp(url, "/metrics") != 0)
    return respond_msg(conn, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
  {
    /* Every header line is looked at, not the first of a name: two
     * Content-Length (or Host) lines are a malformed request (RFC 9112
     * 6.3, RFC 9110 7.2) that a proxy in front may read otherwise. */
    struct hdr_count hc = {0, 0, false, false, NULL};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, count_header, &hc);
    if (hc.bad_name)
      return respond_msg(conn, MHD_HTTP_BAD_REQUEST,
                         "malformed header line (a line folded onto the one before it, "
                         "obs-fold, or a field name that is no token)\n");
    if (hc.content_length > 1)
      return respond_msg(conn, MHD_HTTP_BAD_REQUEST, "duplicate Content-Length header\n");
    if (hc.host > 1)
      return respond_msg(conn, MHD_HTTP_BAD_REQUEST, "duplicate Host header\n");
    /* RFC 9112 3.2: an HTTP/1.1 request without Host is a 400 (HTTP/1.0
     * has none to give; libmicrohttpd refuses other versions itself). */
    if (hc.host == 0 && strcmp(version, MHD_HTTP_VERSION_1_0) != 0) {
      char msg[256];
      if (!hc.host_like)
        return respond_msg(conn, MHD_HTTP_BAD_REQUEST, "no Host header (HTTP/1.1 needs one)\n");
      /* The name is a token (bad_name above): nothing to escape. */
      snprintf(msg, sizeof msg,
               "no Host header (HTTP/1.1 needs one; the field \"%.64s\" may be a Host line "
               "with a line folded onto it, obs-fold, which is not accepted)\n",
               hc.host_like);
      return respond_msg(conn, MHD_HTTP_BAD_REQUEST, msg);
    }
    if (hc.body)
      return respond_msg(conn, MHD_HTTP_BAD_REQUEST, "GET /metrics takes no body\n");
  }

  pthread_mutex_lock(&h->mu);
  if (h->closed) {
    pthread_mutex_unlock(&h->mu);
    return respond_msg(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "dspkd is stopping\n");
  }
  mine = ++h->asked;
  pthread_mutex_unlock(&h->mu);
  uv_async_send(&h->async);
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += SCRAPE_WAIT_S;
  pthread_mutex_lock(&h->mu);
  while (h->served < mine && !h->closed)
    if (pthread_cond_timedwait(&h->cv, &h->mu, &deadline) != 0)
      break;
  if (h->served >= mine) {
    text = h->text;
    len = h->len;
    err = h->err;
    h->text = NULL;
  }
  pthread_mutex_unlock(&h->mu);
  if (!text && err == DSPK_ESHUTDOWN)
    return respond_msg(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "dspkd is stopping\n");
  if (!text) {
    char msg[128];
    snprintf(msg, sizeof msg, "metrics not available: %s\n", dspk__strerror(err));
    return respond_msg(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
  }
  return respond(conn, MHD_HTTP_OK, text, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* libmicrohttpd's unescape callback: nothing is decoded, neither the path
 * (compared as sent) nor the query (ignored).  The length of s. */
static size_t keep_escaped(void *cls, struct MHD_Connection *conn, char *s) {
  (void)cls;
  (void)conn;
  return strlen(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  (void)cls;
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  /* libmicrohttpd's own messages ("Connection was closed by remote side
   * with incomplete request", a timed-out client) are about clients, not
   * the daemon: debug.  What stops the listener is logged by dspkd. */
  dspkd_debug("metrics listener: %s", msg);
}

/* "ADDR:PORT" ("[V6]:PORT") of a bound socket, for the log. */
static void sock_name(int fd, char *out, size_t outlen) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    }
  }
  snprintf(out, outlen, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}

/* Splits "ADDR:PORT" ("[V6]:PORT", ":PORT" for every address) and resolves
 * it; ":PORT" is the IPv6 any address ([::]), which the listener opens
 * dual-stack (open_listener), *any set.  0 or DSPK_EINVAL with msg set. */
static int parse_listen(const char *spec, struct sockaddr_storage *sa, socklen_t *salen,
                        bool *any, char *msg, size_t msglen) {
  struct addrinfo hints, *res = NULL;
  char host[256];
  const char *colon = strrchr(spec, ':'), *port;
  size_t n;
  int r;

  if (!colon || !colon[1]) {
    snprintf(msg, msglen, "expected ADDR:PORT, e.g. 127.0.0.1:9464");
    return DSPK_EINVAL;
  }
  port = colon + 1;
  n = (size_t)(colon - spec);
  if (n >= 2 && spec[0] == '[' && spec[n - 1] == ']') {
    spec++;
    n -= 2;
  }
  if (n >= sizeof host) {
    snprintf(msg, msglen, "address too long");
    return DSPK_EINVAL;
  }
  memcpy(host, spec, n);
  host[n] = '\0';
  *any = n == 0;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (*any)
    hints.ai_family = AF_INET6; /* [::], dual-stack; 0.0.0.0 without IPv6 */
  r = getaddrinfo(n ? host : NULL, port, &hints, &res);
  if (r != 0) {
    snprintf(msg, msglen, "cannot resolve the address \"%s\": %s", host, gai_strerror(r));
    return DSPK_EINVAL;
  }
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *salen = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

/* 1 when sa is IPv6's any address ([::]), which open_listener opens
 * dual-stack: every address, IPv4 too, whether spelled ":PORT" or
 * "[::]:PORT". */
static bool every_address(const struct sockaddr_storage *sa) {
  return sa->ss_family == AF_INET6 &&
         IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* A listening TCP socket on sa; for the any address of IPv6 with
 * IPV6_V6ONLY off, so that IPv4 clients reach it too (as ::ffff:a.b.c.d).
 * The fd, or -1 with errno set and *step the call that failed. */
static int open_listener(const struct sockaddr_storage *sa, socklen_t salen,
                         const char **step) {
  bool any = every_address(sa);
  int one = 1, zero = 0, e;
  int lfd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  *step = "socket";
  if (lfd < 0)
    return -1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  *step = "setsockopt(IPV6_V6ONLY)";
  if (any && setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0)
    goto fail;
  *step = "bind";
  if (bind(lfd, (const struct sockaddr *)sa, salen) != 0)
    goto fail;
  *step = "listen";
  if (listen(lfd, 64) != 0)
    goto fail;
  *step = NULL;
  return lfd;
fail:
  e = errno;
  close(lfd);
  errno = e;
  return -1;
}

/* Whether version ("0.9.75") is 0.9.75 or earlier. */
static bool mhd_version_old(const char *version) {
  unsigned a, b, c;
  return version && sscanf(version, "%u.%u.%u", &a, &b, &c) == 3 &&
         (a == 0 && (b < 9 || (b == 9 && c <= 75)));
}

int dspkd_metrics_http_start(struct dspkd *d) {
  const char *spec = d->cfg.metrics_listen;
  struct metrics_http *h;
  struct sockaddr_storage sa;
  socklen_t salen;
  pthread_condattr_t ca;
  sigset_t all, old;
  char msg[320], name[PATH_MAX + 64];
  bool any = false;
  /* epoll or poll, never select: the daemon's descriptors may pass
   * FD_SETSIZE with many clients. */
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;

  if (!spec || !*spec)
    return 0;
  if (parse_listen(spec, &sa, &salen, &any, msg, sizeof msg) != 0) {
    dspkd_error("%s %s: %s", dspkd_config_name("metrics_listen", name, sizeof name), spec,
                msg);
    return DSPK_EINVAL;
  }
  mhd_old_parser = mhd_version_old(MHD_get_version());
  h = calloc(1, sizeof *h);
  if (!h)
    return DSPK_ENOMEM;
  h->d = d;
  pthread_mutex_init(&h->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  uv_async_init(d->loop, &h->async, on_scrape);
  h->async.data = h;
  uv_unref((uv_handle_t *)&h->async); /* scrapes never keep the loop alive */
  /* Its thread takes none of the daemon's signals: those reach the loop. */
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  /* The socket is dspkd's own, so that a failure names its real cause
   * (libmicrohttpd says "Failed to bind to port 0" for any address).
   * ":PORT" is every address: [::] dual-stack, or 0.0.0.0 where the host
   * (or the unit's RestrictAddressFamilies=) has no IPv6. */
  const char *step;
  int lfd = open_listener(&sa, salen, &step);
  if (lfd < 0 && any &&
      (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL || errno == EPROTONOSUPPORT ||
       errno == EPERM || errno == EACCES || errno == ENOPROTOOPT)) {
    struct sockaddr_in *v4 = (struct sockaddr_in *)&sa;
    in_port_t port = ((struct sockaddr_in6 *)&sa)->sin6_port;
    memset(&sa, 0, sizeof sa);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = port;
    salen = sizeof *v4;
    dspkd_debug("metrics_listen %s: no IPv6 (%s: %s); listening on IPv4 only", spec, step,
                strerror(errno));
    lfd = open_listener(&sa, salen, &step);
  }
  if (sa.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  if (lfd < 0) {
    int e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    d->obs.http = h;
    dspkd_error("%s %s: cannot listen: %s: %s%s",
                dspkd_config_name("metrics_listen", name, sizeof name), spec, step, strerror(e),
                e == EADDRNOTAVAIL ? " (not an address of this host)"
                : e == EADDRINUSE  ? " (another program listens there)"
                : e == EACCES      ? " (a port below 1024 needs privileges)"
                : e == EAFNOSUPPORT || e == EPERM
                    ? " (network sockets not allowed here: see \"Metrics over HTTP\" in systemd.md)"
                    : "");
    return DSPK_EIO;
  }
  char where[INET6_ADDRSTRLEN + 16];
  sock_name(lfd, where, sizeof where);
  h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped, NULL,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)lfd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
                            MHD_OPTION_END);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  d->obs.http = h;
  if (!h->mhd) {
    close(lfd);
    dspkd_error("%s %s: cannot start the HTTP listener (libmicrohttpd failed)",
                dspkd_config_name("metrics_listen", name, sizeof name), spec);
    return DSPK_EIO;
  }
  /* The address and port bound (the port the system chose for port 0;
   * [::] for every address, IPv4 too, or 0.0.0.0 on a host without IPv6). */
  dspkd_info("metrics: serving http://%s/metrics%s", where,
             every_address(&sa) ? " (every address, IPv6 and IPv4)" : "");
  return 0;
}

static void on_http_close(uv_handle_t *a) {
  struct metrics_http *h = a->data;
  free(h->text);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h);
}

void dspkd_metrics_http_stop(struct dspkd *d) {
  struct metrics_http *h = d->obs.http;
  if (!h)
    return;
  pthread_mutex_lock(&h->mu);
  h->closed = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  if (h->mhd)
    MHD_stop_daemon(h->mhd); /* joins its thread */
  d->obs.http = NULL;
  uv_close((uv_handle_t *)&h->async, on_http_close);
}

#else /* !DSPKD_HAVE_MHD */

int dspkd_metrics_http_start(struct dspkd *d) {
  char name[PATH_MAX + 64];
  if (!d->cfg.metrics_listen || !*d->cfg.metrics_listen)
    return 0;
  dspkd_error("%s %s: this dspkd was built without libmicrohttpd",
              dspkd_config_name("metrics_listen", name, sizeof name), d->cfg.metrics_listen);
  return DSPK_ENOTSUP;
}

void dspkd_metrics_http_stop(struct dspkd *d) { (void)d; }

#endif
