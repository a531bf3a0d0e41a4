/*
 * What dspkd records about its own work for the `metrics`, `status` and
 * `trace` methods (daemon/metrics.c, daemon/trace.c): per device, counters
 * and latency histograms of its jobs, the job it runs now, its busy time,
 * and while someone traces, a bounded ring of finished jobs with the times
 * of their phases.
 *
 * Threads: a device's record (struct dev_obs) is guarded by the device's
 * mutex; its runner updates it when it takes a job and when the job ends,
 * the loop thread reads it.  The daemon's record (struct dspkd_obs) belongs
 * to the loop thread.  The HTTP listener (daemon/metrics.c) never reads
 * either: it asks the loop for the text and waits for it.
 */
#ifndef DSPKD_OBSERVE_H
#define DSPKD_OBSERVE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dspk/types.h"

struct dspkd;
struct device;
struct job;
struct req;
struct trace_sess;
struct cqueue;
struct conn;
struct metrics_http;

/* CLOCK_MONOTONIC times of a job's phases, in nanoseconds; 0: not reached.
 * queued is set by dspkd_sched_submit (loop), the rest by the runner. */
struct job_times {
  uint64_t queued, start;
  uint64_t upload_end;  /* task: inputs copied to the device */
  uint64_t compute_end; /* task: the backend's run returned */
  uint64_t tune_start, tune_end; /* task: autotuning inside the run, if any */
  uint64_t end;
};

/* Upper bounds (seconds) of the latency histograms' buckets; +Inf follows. */
#define DSPKD_HIST_BOUNDS                                                                  \
  {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  \
   2.5, 5, 10, 30, 60}
#define DSPKD_HIST_N 18

struct dspkd_hist {
  uint64_t bucket[DSPKD_HIST_N + 1]; /* not cumulative; the last is +Inf */
  uint64_t count, sum_ns;
};

/* Busy time in one-second slots, for the busy fraction of the last few
 * seconds without a timer: slot[s % N] holds second s when sec[s % N] == s. */
#define DSPKD_BUSY_SLOTS 8

/* A finished (or, at a trace's end, running) job as the trace keeps it. */
struct trace_rec {
  struct job_times t;
  uint64_t client;  /* connection id; 0: internal */
  uint64_t slurm_job; /* its connection's Slurm job (daemon/jobs.c), 0: none */
  uint32_t uid;     /* whose work (struct job's uid): who sees it in full */
  uint32_t msgid;
  int32_t err;      /* 0 or a negative code */
  uint8_t kind;     /* enum job_kind */
  uint8_t op;       /* dspk_op, for tasks */
  bool running;     /* still running when the trace ended */
};

#define DSPKD_TRACE_RING 4096 /* jobs per device kept while tracing */

/* The name status's running_op and trace's records give work the caller
 * may not see in full (another user's, or the daemon's own to a non-admin:
 * daemon/admin.h, dspkd_sees_uid). */
#define DSPKD_OTHER_WORK "other"


struct dev_obs {
  /* results of task.run jobs: [op][0 ok, 1 error, 2 canceled] */
  uint64_t tasks[DSPK_OP_COUNT][3];
  struct dspkd_hist queue;              /* queue time of every client job */
  struct dspkd_hist run[DSPK_OP_COUNT]; /* run time of task.run jobs */
  uint64_t busy_ns;                     /* jobs finished, total */
  uint64_t slot_sec[DSPKD_BUSY_SLOTS], slot_ns[DSPKD_BUSY_SLOTS];
  uint64_t start_ns;                    /* when the device opened */
  /* The job running now (run_start == 0: idle). */
  uint64_t run_start, run_queued;
  uint64_t run_client;
  uint64_t run_job;     /* its Slurm job, 0: none */
  uint32_t run_msgid, run_uid;
  uint8_t run_kind, run_op;
  struct cqueue *run_q; /* its connection's queue (alive while it runs) */
  /* Tracing: rec[seq % DSPKD_TRACE_RING] holds job number seq. */
  unsigned tracers;  /* traces in progress */
  struct trace_rec *rec;
  uint64_t seq;      /* jobs recorded so far */
};

/* The device's activity now, for status and top (loop thread). */
struct dev_activity {
  double busy;           /* fraction of the last few seconds spent running jobs */
  bool running;
  const char *what;      /* the running job: op name or buffer method */
  uint64_t age_ns;       /* how long it has been running */
  uint64_t client;
  uint32_t uid;          /* whose work (struct job's uid) */
  uint64_t clients;      /* connections with jobs queued or running here */
};

struct dspkd_obs {
  uint64_t bytes_in, bytes_out;   /* over every connection, loop only */
  uint64_t bytes_in_place;        /* of bytes_in: buffer.write data received
                                     straight into a buffer (daemon/conn.c) */
  uint64_t conns_total;           /* connections accepted */
  uint64_t rejected_total;        /* connections refused (policy, max_clients) */
  struct trace_sess *traces;      /* traces in progress */
  struct metrics_http *http;      /* NULL: no HTTP listener */
};

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t dspkd_now_ns(void);

/* daemon/metrics.c, runner thread with the device's mutex held: a job was
 * taken from the queue (sets j->t.start); the oldest job taken finished on
 * the device at `now`, its turn having begun at `start` (when it was taken
 * or when the job before it finished, whichever is later; sets j->t.end);
 * next is the job that is oldest now, or NULL. */
void dspkd_obs_job_start(struct device *dev, struct job *j);
void dspkd_obs_job_end(struct device *dev, struct job *j, uint64_t start, uint64_t now,
                       const struct job *next);
/* Loop thread: the device's activity now (takes its mutex). */
void dspkd_obs_activity(struct device *dev, struct dev_activity *a);
/* The name of a job for display: the op of a task, else its method. */
const char *dspkd_obs_job_name(int kind, int op);

/* daemon/metrics.c: the `metrics` method. */
int dspkd_m_metrics(struct req *r);
/* Renders the Prometheus text into a malloc'd string (*len bytes, NUL
 * terminated).  viewer: the connection that asked (the `metrics` method),
 * shown what status shows it: the series of the devices it is shown and
 * of the Slurm jobs of its uid, the rest as counts (an admin: everything);
 * NULL: everything (the HTTP listener, an operator's).  Loop thread.  0 or
 * DSPK_ENOMEM. */
int dspkd_metrics_render(struct dspkd *d, struct conn *viewer, char **text, size_t *len);
/* Starts the HTTP listener on cfg.metrics_listen ("ADDR:PORT"), when set.
 * 0, or a negative code (logged). */
int dspkd_metrics_http_start(struct dspkd *d);
/* Stops it (joins its thread) and closes its loop handle: run the loop
 * once more afterwards for the close.  Does nothing when none runs. */
void dspkd_metrics_http_stop(struct dspkd *d);

/* daemon/trace.c */
int dspkd_m_trace(struct req *r);
/* The next trace in progress after s (d->obs.traces is the first). */
const struct trace_sess *dspkd_trace_next(const struct trace_sess *s);
/* A connection closes (c->closing set): its traces end, unanswered. */
void dspkd_trace_conn_closed(struct conn *c);
/* At the stop: answers every trace in progress with what it recorded. */
void dspkd_trace_stop_all(struct dspkd *d);
/* After a reload that took a new configuration: answers at once, with
 * what it recorded until now, each trace begun as an admin whose caller
 * the new configuration no longer makes one (it showed every user's jobs
 * in full), and logs a notice for each.  Returns how many it ended. */
size_t dspkd_trace_reloaded(struct dspkd *d);
/* Frees the devices' trace rings, after the runners are joined. */
void dspkd_trace_free(struct dspkd *d);

#endif /* DSPKD_OBSERVE_H */
