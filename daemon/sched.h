/*
 * The scheduler (daemon/sched.c): it owns each device's queues, its runner
 * thread and the runner's in-flight list.  The rest of the daemon hands it
 * jobs and asks it to cancel, drop a connection's work or stop; it never
 * touches a queue itself.
 *
 * Per device, one FIFO per connection, linked into the device's ring while
 * it holds jobs; the runner takes one job from the ring's head queue and
 * moves that queue to the tail (round robin), enqueues the job's work on the
 * device, records a fence, and keeps the job in its in-flight list (at most
 * device_inflight jobs); jobs are answered oldest first as their fences
 * complete: the runner encodes the answer, puts the job on the daemon's done
 * list and wakes the loop, whose done callback writes it.
 *
 * Threads: every function here runs on the loop thread, except where said.
 */
#ifndef DSPKD_SCHED_H
#define DSPKD_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/dspkd.h"

/* Main thread, at start: starts the device's runner, which opens the
 * device (dev->open_state says how that went).  0 or a negative code. */
int dspkd_sched_start(struct device *dev);

/* A connection's queues, one per device (freed with the connection, once
 * no job of it is queued or running).  NULL when out of memory. */
struct cqueue *dspkd_sched_conn_new(struct dspkd *d);
void dspkd_sched_conn_free(struct cqueue *q);

/* A new job of the connection (NULL: an internal job) for dev, or NULL. */
struct job *dspkd_job_new(struct conn *c, enum job_kind kind, uint32_t msgid,
                          struct device *dev);
/* Whether a job is a client's request (answered and counted in status),
 * not an internal one (buffer frees, idle trims, unpinned read buffers). */
static inline bool dspkd_job_counted(const struct job *j) {
  return j->kind != JOB_BUF_FREE && j->kind != JOB_TRIM && j->kind != JOB_UNPIN;
}
/* Frees a job the loop owns: drops its buffers, chunk and connection. */
void dspkd_job_free(struct dspkd *d, struct job *j);

/* Queues the job on its device (takes ownership): at the end of its
 * connection's FIFO there, or of the internal queue. */
void dspkd_sched_submit(struct job *j);
/* Loop thread: an answer sent from a device block (struct mpin) is out;
 * the device's runner, when idle, frees the blocks retired behind their
 * answers (daemon/task.c) now rather than at its next job. */
void dspkd_sched_sweep(struct device *dev);
/* Cancels the connection's request msgid: a queued one is answered
 * ECANCELED now, a running one gets its cancel flag.  1 when it was queued
 * or running, 0 when unknown. */
int dspkd_sched_cancel(struct conn *c, uint32_t msgid);
/* Removes every queued job of the connection (of everyone when c is NULL)
 * and answers each with code (drops it unanswered when code is 0). */
void dspkd_sched_drop(struct dspkd *d, struct conn *c, int code);
/* Sets the cancel flag of every job of the connection (of every connection
 * when c is NULL) that is queued or running. */
void dspkd_sched_cancel_all(struct dspkd *d, struct conn *c);
/* Asks every runner to exit once its queues and in-flight list are empty. */
void dspkd_sched_stop(struct dspkd *d);
/* Joins the runners that have exited (every one when wait); 1 when all
 * are joined. */
int dspkd_sched_join(struct dspkd *d, bool wait);
/* Any thread, for the exit path: tells every runner to stop, takes the
 * clients' queued jobs out of the rings (they stay on their connections'
 * lists; the internal frees still run) and cancels the job each device
 * executes (dev->current, under the device's mutex: no walk of the loop's
 * connections) except self's (the runner calling exit(), or NULL).
 * Returns how many it canceled. */
int dspkd_sched_abandon(struct dspkd *d, const struct device *self);

/* The loop's async callback: writes the answers of finished jobs. */
void dspkd_sched_done_cb(uv_async_t *h);
/* Runner thread: hands a notification for the job's client to the loop. */
void dspkd_sched_post_note(struct dspkd *d, struct job *j, struct wreq *wr);

/* A snapshot of a device's counters (takes its mutex). */
void dspkd_sched_counters(struct device *dev, uint64_t *queued, uint64_t *running,
                          uint64_t *completed, uint64_t *failed,
                          struct dspk__devstats *stats);
/* With dev->mu held: the connections with jobs queued on dev, and the one
 * of the job it runs (run_q, its queue, may be NULL). */
uint64_t dspkd_sched_clients_locked(struct device *dev, const struct cqueue *run_q);

#ifdef DSPK_TEST_HOOKS
/* daemon/testhooks.c: under DSPKD_TEST_CANCEL_WAIT=before (or =after), the
 * runner waits, before (after) the backend runs a task, until the task is
 * canceled (at most 30 s), so that tests/daemon can cancel a task at that
 * exact point: "after" is a task whose work completed before its cancel
 * came, "before" one whose work the cancel stops.  =after:PATH (or
 * before:PATH) then goes on waiting until PATH exists (within the same
 * 30 s): a task that a cancel does not stop, still running after its
 * client has gone, for as long as the test wants (tests/cluster). */
void dspkd_test_cancel_wait(struct job *j, const char *when);
#else
#define dspkd_test_cancel_wait(j, when) ((void)0)
#endif

#endif /* DSPKD_SCHED_H */
