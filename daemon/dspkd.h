/*
 * dspkd's internal shapes: the daemon, its client connections, its devices
 * with their runner threads and queues, daemon-side buffers, and the jobs
 * that travel from the loop thread to a runner and back.
 *
 * Ownership and threads (docs/architecture.md has the picture):
 * - The loop thread owns struct dspkd, every struct conn, every buffer's
 *   refcount and every job while it is not queued or running.
 * - A device's mutex guards its ring of per-connection queues, its counters
 *   and each of its jobs' `state`; the runner takes jobs from the ring and is
 *   the only thread that calls the device's backend (open, memory, run,
 *   close).  A buffer's device memory (`mem`) is touched by its runner only.
 * - Finished jobs go on the daemon's done list (done_mu) and the runner wakes
 *   the loop with uv_async_send; the loop writes the response the runner
 *   already encoded.
 */
#ifndef DSPKD_DSPKD_H
#define DSPKD_DSPKD_H

#include <limits.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <uv.h>

#include "backends/backend.h"
#include "daemon/observe.h"
#include "proto/codec.h"
#include "proto/frame.h"
#include "proto/schema.h"
#include "proto/utf8.h"

#ifndef DSPKD_VERSION
#define DSPKD_VERSION "0.0.0"
#endif

#define DSPKD_MAX_DEVICES 64
/* The one message of a task canceled (task.cancel, its connection closed):
 * queued or running, its answer and its log line say it in these words
 * (probe 17 A4: a queued one said "task canceled"). */
#define DSPKD_MSG_CANCELED "the task was canceled"
#define DSPKD_MAX_UNAVAILABLE 16
/* Upper bound of the configuration's device_inflight. */
#define DSPKD_MAX_DEVICE_INFLIGHT 64

/* A list of user or group ids from the configuration's access policy. */
#define DSPKD_MAX_IDS 1024
/* The entry of a name that did not resolve: (uint32_t)-1, which is no
 * process's user or group id ((uid_t)-1 means "no change" to chown(2)). */
#define DSPKD_ID_NOBODY UINT32_MAX
struct dspkd_idlist {
  unsigned n; /* 0: the list is not set */
  uint32_t id[DSPKD_MAX_IDS];
};

/* A quota given as a share of a device's memory ("50%" in the
 * configuration) rather than in bytes. */
#define DSPKD_SHARE(pct) (((uint64_t)1 << 63) | (uint64_t)(pct))
#define DSPKD_SHARE_IS(v) (((v) >> 63) != 0)
#define DSPKD_SHARE_PCT(v) ((v) & 0xff)
/* max_memory's default on cpu:0, a share of the host's RAM: the rest is the
 * system's, the daemon's own (read buffers, answers, the pools' cached
 * blocks, tasks' working memory) and the clients' (daemon/quota.c). */
#define DSPKD_CPU_MEMORY_PCT 75

/* Configuration from the command line (daemon/main.c) and the configuration
 * file (daemon/config.c). */
struct dspkd_config {
  char socket_path[256];
  const char *cache_path;   /* NULL: the default location ("" : none) */
  bool no_cache;            /* --no-cache / no_cache = yes: run without a cache */
  uint64_t cache_max_bytes; /* size bound of the cache; 0: the cache's default */
  const char *backends;     /* comma list, NULL: every backend */
  const char *raw_kernels;  /* "all" (NULL too), "none", or a comma list of device ids */
  bool foreground;
  int ready_fd;             /* -1: none */
  uint64_t end_job;         /* --end-job ID: end job ID in the state file and exit; 0: none */
  struct dspk__limits lim;  /* frame and tensor limits */
  size_t max_inflight;      /* requests in flight per connection */
  size_t max_unsent;        /* bytes of responses not yet written, per connection */
  size_t max_buffers;       /* buffers per connection */
  size_t max_clients;       /* open connections */
  /* Quotas (daemon/quota.c): per user (uid) and per connection. */
  size_t max_user_clients;  /* open connections of one user */
  uint64_t max_user_partial; /* read-buffer bytes (incomplete frames) of one user */
  uint64_t max_user_unsent;  /* answers (unsent + reserved) of one user's connections */
  /* Memory mappings the daemon makes for one user's buffers (daemon/shm.c,
   * dspkd_maps_take); 0 until derive_defaults sets it from maps_clients. */
  uint64_t max_user_maps;
  /* Derived, not a key: vm.max_map_count as read at start or at the last
   * reload, and the share of it that all users' buffers together may map
   * (dspkd_maps_budget). */
  uint64_t max_map_count;
  uint64_t maps_clients;
  uint64_t max_user_memory; /* bytes per device of one user; 0: half the device's */
  uint64_t max_conn_memory; /* bytes per device of one connection; 0: no own bound */
  uint64_t max_job_memory;  /* bytes per device of one Slurm job (daemon/jobs.c) */
  /* Bytes per device of all users together (a share: DSPKD_SHARE); 0:
   * unset, dspkd_quota_total's default for the device. */
  uint64_t max_memory;
  uint64_t shutdown_timeout_ms; /* grace for running tasks at stop */
  uint64_t idle_trim_ms;    /* after the last client left: give cached memory back */
  unsigned device_inflight; /* jobs a runner enqueues on its device ahead of their answers */
  const char *metrics_listen; /* "ADDR:PORT" of the HTTP metrics listener, or NULL */
  const char *job_state;    /* the Slurm jobs' state file (daemon/jobstate.c); NULL:
                               the socket's path, .jobs for .sock */
  /* daemon/config.c: the configuration file's extra settings. */
  int log_level;            /* enum dspkd_level */
  struct dspkd_idlist allow_users, allow_groups; /* may connect (both empty: anyone) */
  struct dspkd_idlist admin_users, admin_groups; /* admin methods (both empty: root
                                                    and the daemon's own user) */
  bool job_required;        /* a connection without a Slurm job gets the cpu only */
};

/* A connection's read buffer.  Frames are scanned and decoded in place; a
 * job whose request carries inline data takes a reference, so those bytes
 * stay alive and unmoved until the job is freed.  Loop thread only, but for
 * pin_dev and pinned: a runner whose task has large inline inputs in a
 * large buffer registers the buffer's pages for DMA (host_register; once,
 * for the buffer's life, daemon/task.c), and only that runner can
 * unregister it, so the loop hands such a buffer to it to be freed
 * (daemon/conn.c). */
struct rchunk {
  int refs;
  size_t cap;   /* bytes of data[] */
  size_t start; /* first byte not yet consumed */
  size_t end;   /* one past the last byte read */
  struct device *_Atomic pin_dev; /* the runner that took the registration */
  atomic_int pinned;              /* 1: pin_dev registered the pages */
  struct rchunk *next_left;       /* in conn.c's list of those left at exit */
  char data[];
};
/* Read buffers above this size are kept for the next large frame (the
 * spare, daemon/conn.c), and only they are registered for DMA. */
#define DSPKD_RCHUNK_KEEP ((size_t)1 << 20)
/* The page-aligned part of k's data that a runner registers. */
void *dspkd_chunk_pin_span(struct rchunk *k, size_t *len);

/* An outgoing frame and the libuv request that writes it.  Allocated by
 * whoever encodes the frame (a runner or the loop); dspkd_conn_send() takes it. */
struct wreq {
  uv_write_t req;
  struct conn *c;
  size_t len;
  size_t cost;         /* what it holds while queued (counted in unsent and
                          the user's answers: max_unsent, max_user_unsent):
                          the struct, its frame's allocations and referenced
                          data, libuv's copy of its buffers, its fd's handle */
  uv_buf_t *bufs;
  int fd;              /* >= 0: sent with the frame's first byte (SCM_RIGHTS),
                          then closed (daemon/shm.c); -1: none */
  uv_pipe_t *fd_pipe;  /* the handle libuv sends fd through */
  struct conn *share_conn; /* an answer with fd: counted in that connection's
                              share_fds until the client reads it (the count
                              passes to c->fds_written once fd is out, else it
                              is given back when wr is freed; loop only), or NULL */
  uint32_t fd_msgid;   /* an answer with fd: the request it answers, and the */
  uint64_t fd_buf;     /* buffer (its id) whose memfd fd is, dropped with an
                          error answer when fd cannot be sent (daemon/shm.c) */
  struct wreq *fd_prev, *fd_next; /* in c->fd_writes while libuv writes it */
  struct dspk__wbuf w;
};
/* Returns a new wreq with an initialised wbuf, or NULL. */
struct wreq *dspkd_wreq_new(void);
/* What any queued answer costs the daemon at least (its struct): the unit
 * that the answer quotas count besides the frame's own allocations. */
#define DSPKD_WREQ_COST (sizeof(struct wreq) + DSPK__ALLOC_OVERHEAD)
/* Frees the frame (runs the release of each referenced payload).  Accepts NULL. */
void dspkd_wreq_free(struct wreq *wr);

/* A block of device memory that answers are sent from (daemon/task.c):
 * buffer.read answers and large inline results go to the socket straight
 * from the block (backend host_ptr) instead of a copy.  The runner counts
 * each such answer in `sending` and the loop counts it down when the answer
 * is written or dropped (the frame's release).  Until then the block is
 * neither freed nor written: a buffer.write or task output to its buffer
 * moves the buffer to a new block first, and the old block, like a freed
 * buffer's or a task's temporary result, waits on the device's retired
 * list until its answers are out (freed by the runner at its next job). */
struct mpin {
  atomic_int sending;     /* answers still being written from mem */
  struct device *dev;     /* set when made: whose runner frees it once retired
                             (the last answer out wakes it: dspkd_sched_sweep) */
  struct dspk__mem *mem;  /* set when retired */
  void *host;             /* or the backend's host_alloc block sent from */
  struct mpin *next;      /* in the device's retired list (runner) */
};

/* Answers of this many bytes or more are sent from the device's host block
 * itself where the backend has one (host_ptr), without a copy; smaller ones
 * are copied: a copy that small costs less than keeping the block. */
#define DSPKD_SEND_IN_PLACE_MIN ((size_t)64 << 10)

/* The hold of a buffer.read answer sent from its buffer's block (the
 * frame's release, daemon/task.c unpin_read): pin counts the answer as
 * sending (runner); b and c, set by the loop when the answer is queued,
 * are references to the buffer (one of its reads, dbuf.reads) and to its
 * connection, given back when the answer is written or dropped. */
struct rdpin {
  struct mpin *pin;
  struct dbuf *b;
  struct conn *c;
};

/* A daemon-side buffer: device memory owned by one connection. */
struct dbuf {
  uint64_t id;
  struct device *dev;
  uint64_t size;
  struct dspk__mem *mem; /* runner only: set by the create job */
  int refs;              /* loop only: the connection's table + each job */
  struct job *free_job;  /* the JOB_BUF_FREE that releases it, allocated with
                            it, so that releasing never needs memory */
  struct djob *qjob;     /* daemon/quota.c: the Slurm job it is charged to */
  /* Shared memory (daemon/shm.c): the daemon's own MAP_SHARED mapping of a
   * memfd (buffer.import, buffer.share), or NULL.  host_direct: mem is that
   * mapping itself (backend import_host), else the runner copies between it
   * and mem around each task.  Runner only once created. */
  void *host;
  /* The memfd host maps (from its start), by identity: buffers of one file
   * (two buffer.import of one memfd, or a buffer.share's imported again)
   * share memory where their offsets meet (dspkd_out_aliases).  Set before
   * the create job is queued, then read-only. */
  bool has_file;
  dev_t file_dev;
  ino_t file_ino;
  bool host_direct;
  bool host_registered;  /* backend host_register succeeded */
  int share_fd;          /* buffer.share: the memfd until its answer takes it */
  /* The memory mapping made for it (daemon/shm.c, dspkd_maps_take): its
   * user, whose count and the daemon's the runner lowers once it is unmapped
   * (dspkd_maps_put), or NULL when none is counted.  Set before the create
   * job is queued. */
  struct duser *map_user;
  struct mpin *pin;      /* runner only: answers sent from mem, or NULL */
  int landing;           /* loop only: its refs held by buffer.write jobs whose
                            data the loop received into mem itself (landed) */
  /* Loop only: the connection whose table held it, once freed (buffer.free,
   * a failed buffer.share, the connection's close) while jobs still hold it:
   * in that connection's held list (held_prev, held_next), it counts as the
   * connection's in status, the metrics and the memory quotas until the
   * last job lets go (dspkd_dbuf_unref). */
  struct conn *held_by;
  struct dbuf *held_prev, *held_next;
  /* Loop only: its buffer.read jobs in flight that may answer from its
   * block (64 KiB or more, not shared memory) and such answers not written
   * yet (daemon/task.c, exec_read).  A write meanwhile moves the buffer to
   * a new block while the answers keep the old one: a job that writes it
   * while reads > 0 counts a second block in the memory quotas
   * (job->move_mem), kept after it as `moved` bytes charged to moved_c
   * (and its user and Slurm job, moved_job) until reads is 0 again
   * (daemon/quota.c, dspkd_quota_reads_done). */
  int reads;
  uint64_t moved;
  struct conn *moved_c;
  struct djob *moved_job;
};

/* One connection's FIFO of jobs for one device (daemon/sched.c). */
struct cqueue;

/* JOB_TRIM: internal, gives the device's cached memory back (idle trim).
 * JOB_UNPIN: internal, unregisters a read buffer (job->unpin) that this
 * device registered for DMA and frees it. */
enum job_kind { JOB_TASK, JOB_BUF_CREATE, JOB_BUF_WRITE, JOB_BUF_READ, JOB_BUF_FREE,
                JOB_TRIM, JOB_UNPIN };
enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct job {
  struct job *next;          /* in a cqueue, then in the done list */
  struct job *cprev, *cnext; /* in the connection's in-flight list (loop) */
  enum job_kind kind;
  enum job_state state;      /* guarded by dev->mu until it is done */
  struct device *dev;
  struct cqueue *q;          /* where it is queued */
  struct conn *conn;         /* loop only; NULL for internal jobs */
  bool share_counted;        /* buffer.share: its memfd counts in conn's share_fds */
  uint32_t msgid;
  atomic_int cancel;         /* set by the loop: stop a running task */
  struct rchunk *chunk;      /* keeps inline request data alive, or NULL */
  struct rchunk *unpin;      /* JOB_UNPIN's read buffer */
  struct dbuf *refs[DSPK__OP_MAX_IN + DSPK__OP_MAX_OUT + 1]; /* held refs */
  int nrefs;

  /* task */
  struct dspk__op op;
  const void *in_data[DSPK__OP_MAX_IN];     /* inline input, or NULL */
  struct dbuf *in_buf[DSPK__OP_MAX_IN];     /* referenced input, or NULL */
  struct dbuf *out_buf[DSPK__OP_MAX_OUT];   /* requested output, or NULL */

  /* buffer.create/write/read/free */
  struct dbuf *buf;
  uint64_t off, size;
  const void *data;
  bool landed;               /* buffer.write: the data is in the buffer already
                                (received in place, daemon/conn.c) */
  bool reading;              /* buffer.read counted in buf->reads (loop) */
  uint64_t move_mem;         /* a second block for each buffer it writes whose
                                reads were > 0 when it came (dbuf.reads) */
  struct rdpin *rdpin;       /* buffer.read answered from the buffer's block:
                                its answer's hold (runner sets, loop takes) */

  /* result: the encoded response frame (runner), or NULL */
  struct wreq *resp;
  int err;
  char *errmsg;              /* task: the failure's message (malloc'd), or NULL */
  uint64_t progress_ms;      /* runner: when task.progress was last sent */
  /* daemon/quota.c: what dspkd_sched_submit charged to its connection and user,
   * given back when the job leaves the connection's in-flight list. */
  size_t resv_answer;        /* bytes its answer may take (max_unsent) */
  uint64_t resv_mem;         /* device memory it may take on resv_dev */
  struct device *resv_dev;
  struct djob *resv_job;     /* the Slurm job charged with resv_mem, or NULL */
  uint64_t slurm_job;        /* its connection's Slurm job id (traces), 0: none */
  uint32_t uid;              /* whose work it is, for trace and status: its
                                connection's uid, a buffer's free its owner's;
                                (uint32_t)-1: the daemon's own or unknown */
  struct job_times t;        /* daemon/observe.h */
  /* runner: the fence recorded after its work was enqueued (NULL: none,
   * its work is done once the jobs before it are), and its place in the
   * device's in-flight list */
  struct dspk__fence *fence;
  struct job *inext;
};

/* A notification a runner encoded for a job's client (task.progress).  It
 * reaches the loop before its job's completion, so the connection is alive. */
struct note {
  struct note *next;
  struct conn *c;
  struct wreq *wr;
};

struct device {
  struct dspkd *d;
  int idx;
  const struct dspk__backend *be;
  int bindex;
  char id[48];
  struct dspk__devinfo info;
  /* What it runs (the backend's caps, written by the runner before
   * open_state becomes 1, read-only after): tasks are routed with it. */
  struct dspk__devcaps caps;
  bool kernels_off;         /* its backend runs raw kernels, raw_kernels leaves it out */
  pthread_t thread;
  bool thread_started;
  bool joined;
  struct dspk__dev *bdev; /* runner only */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* The scheduler's (daemon/sched.c), guarded by mu: the ring of queues
   * with jobs, the queue of internal jobs, and the request to stop. */
  struct cqueue *ring_head, *ring_tail;
  uint64_t turns;            /* queues served so far (the users' turns) */
  struct cqueue *sysq; /* internal jobs: buffer frees */
  bool stop;           /* exit once the ring is empty */
  struct job *current; /* the job whose work the runner (or run_inline on
                          the loop) enqueues now, or NULL: the exit handler
                          cancels it from any thread */
  /* Guarded by mu. */
  int open_state;      /* 0: opening, 1: open, < 0: open failed */
  char open_err[256];
  bool exited;
  bool busy;           /* a job runs or is in flight on the device, or the
                          idle runner settles or sweeps (sched.c) */
  bool sweep;          /* an answer sent from a block is out: the runner
                          frees what was retired behind it (dspkd_sched_sweep) */
  /* The scheduler's, runner only: jobs taken whose work may still run on
   * the device, oldest first, answered in that order as their fences
   * complete (at most `depth`, the configuration's device_inflight); and
   * when the last of them finished. */
  struct job *ifl_head, *ifl_tail;
  unsigned nifl, depth;
  uint64_t last_done_ns;
  /* Runner only: blocks that answers are still sent from (struct mpin). */
  struct mpin *retired;
  /* Guarded by mu. */
  uint64_t queued, running, completed, failed;
  struct dspk__devstats stats;
  struct dev_obs obs;  /* daemon/observe.h */
  /* Loop thread only (daemon/quota.c): what the memory quotas count on it
   * over every connection, bounded by max_memory. */
  uint64_t clients_mem;
};

struct unavailable {
  char backend[32];
  char reason[320];
};

/* A Slurm job registered by the prolog (daemon/jobs.c, job.register): the
 * uid it runs as and the UUIDs of the GPUs Slurm gave it on this node.  Its
 * connections may use those devices and the cpu only.  Freed after job.end
 * once no connection refers to it.  Loop thread only. */
#define DSPKD_JOB_MAX_DEVICES 64
#define DSPKD_UUID_LEN 40 /* a normalised UUID: lower-case hex digits only */
#define DSPKD_ENDED_SLOTS 256 /* the ended jobs remembered (struct dspkd's list) */
/* A job.end waiting for its job's connections to be gone: its caller
 * (dspkd_conn_owe holds it) and the request's msgid. */
struct jend_wait {
  struct conn *c;
  uint32_t msgid;
};

struct djob {
  struct djob *next;
  uint64_t id;
  uid_t uid;
  int ndevs;
  char uuid[DSPKD_JOB_MAX_DEVICES][DSPKD_UUID_LEN];
  size_t nconns;                      /* connections bound to it (until freed) */
  bool ended;                         /* job.end came: no new connections */
  struct jend_wait *ends;             /* job.end calls answered when nconns is 0 */
  size_t nends;
  uint64_t end_conns, end_inflight, end_buffers; /* what job.end closed */
  /* Requests of its closed connections done since job.end: canceled (or
   * dropped from their queue), or run to their end (work handed to a device
   * that a cancel does not stop), for the log line of the end's end. */
  uint64_t end_canceled, end_ran;
  uint64_t mem[DSPKD_MAX_DEVICES];    /* device memory of its connections */
};

/* One user's (uid's) share of the daemon, for the quotas: counted over
 * every connection of that uid.  Loop thread only. */
struct duser {
  struct duser *next;
  uid_t uid;
  size_t nconns;                      /* connections (until freed) */
  uint64_t rbytes;                    /* bytes of their read buffers */
  uint64_t answers;                   /* their unsent + reserved answer bytes */
  size_t nfds;                        /* received descriptors not yet claimed, beyond
                                       * the first of each connection (shm.c) */
  size_t share_fds;                   /* buffer.share memfds not yet read (shm.c) */
  /* Memory mappings made for its buffers (shm.c, dspkd_maps_take): raised
   * on the loop, lowered by a runner once unmapped; the struct is kept while
   * it is above 0 (dspkd_user_gc). */
  _Atomic uint64_t maps;
  /* Bytes and messages handled in this turn of the loop, and the loop's
   * time spent on them (daemon/conn.c); turn_over: the turn is used up. */
  uint64_t turn_bytes, turn_msgs, turn_ns, turn_ms, turn_gen;
  bool turn_over;
  uint64_t turn[DSPKD_MAX_DEVICES];   /* device's `turns` when last served (its mu) */
  uint64_t mem[DSPKD_MAX_DEVICES];    /* device memory: buffers + jobs in flight */
};

struct conn {
  uv_pipe_t pipe;
  struct dspkd *d;
  /* The message limits (max_message, max_depth, max_objects, max_rank,
   * max_elements) as they were when it connected: its hello told the
   * client so, and a reload does not change them under it. */
  struct dspk__limits lim;
  struct conn *prev, *next; /* in d->conns */
  uint64_t id;
  int refs;                 /* open socket + pending writes + in-flight jobs */
  bool closing;
  bool reading;
  bool in_process;          /* conn_process() is on the stack */
  bool held;                /* stopped processing frames with some buffered */
  bool close_after_flush;   /* close once every queued write is done */
  /* Closed with a protocol.error while answers waited (daemon/conn.c,
   * notice_flush): the notice written after them, and the bound on it. */
  struct wreq *notice;
  uv_timer_t *notice_timer;
  bool notice_armed;        /* notice_timer's first (0 ms) round is done */
  bool eof;                 /* the client half-closed: answer, then close */
  bool deferred;            /* its user's turn is used up: frames wait for the next */
  bool later;               /* its pause ended inside another frame: d->later takes its frames */
  /* Paused (daemon/conn.c, peek_cancels): the stream position up to which
   * held frames were looked at for a task.cancel, how many of those wait
   * for their turn, and c->requests then. */
  uint64_t pk_pos, pk_req;
  unsigned pk_wait;
  unsigned owed;            /* answers a trace, cache.* or job.end will send later */
  pid_t pid;
  uid_t uid;
  gid_t gid;
  char name[DSPK__ECHO_CAP(DSPK__CLIENT_NAME_MAX)]; /* hello's client, echoed: dspk__utf8_echo */
  struct rchunk *rb;
  size_t unsent;            /* bytes handed to uv_write, not yet written */
  size_t inflight;          /* device jobs not yet answered (c->jobs); with
                             * owed: dspkd_conn_inflight() */
  struct job *jobs;         /* in-flight jobs */
  struct dbuf **bufs;       /* its table, sorted by id */
  size_t nbufs, capbufs;
  uint64_t buf_bytes;
  /* The buffers taken out of its table (buffer.free, its close) that jobs
   * still hold (a list through dbuf.held_next), whose memory is freed when
   * the last job lets go; status, the per-job metrics, job.end and the
   * memory quotas count them as the connection's until then (a 512 MiB
   * buffer under a running FFT stays allocated). */
  struct dbuf *held_list;
  size_t held_bufs;
  uint64_t held_bytes;
  struct cqueue *q;         /* [d->ndevs] */
  /* daemon/quota.c */
  struct duser *user;       /* this uid's counters (NULL until accepted) */
  size_t reserved;          /* answer bytes reserved by jobs in flight */
  size_t creating;          /* buffer.create jobs in flight */
  uint64_t rbytes;          /* bytes of rb counted in user->rbytes */
  bool over_partial;        /* the read buffer could not grow: max_user_partial */
  size_t rb_nomem;          /* the read buffer of this many bytes could not be
                               allocated (the daemon's shortage: on_read answers
                               protocol.error ENOMEM, logged), or 0 */
  bool peek_nomem;          /* paused, a fresh read buffer could not be allocated:
                               not read until the pause ends (daemon/conn.c,
                               peek_alloc) */
  /* Then: the bytes of the message held, the least size the whole message
   * can have (dspk__frame_need), and the user's other read buffers. */
  uint64_t over_pending, over_need, over_others;
  uint64_t *mem;            /* [d->ndevs] device memory: buffers + jobs in flight */
  uint64_t requests;
  /* daemon/jobs.c: the Slurm job of the connection, decided at its first
   * request that needs a device and kept for its life. */
  int job_state;            /* 0: not decided, 1: decided (job may be NULL) */
  struct djob *job;         /* NULL: no job (every device) */
  uint64_t job_claim;       /* hello's job (SLURM_JOB_ID), 0: none */
  int cg_state;             /* its cgroup when it connected: DSPKD_CG_* */
  uint64_t cg_job;          /* DSPKD_CG_JOB: the job its cgroup path names */
  /* daemon/shm.c: file descriptors received (SCM_RIGHTS) and not yet
   * claimed by a buffer.import, with the stream position (bytes received)
   * at the end of the read that brought each; and the position where the
   * frame being handled starts. */
  struct { int fd; uint64_t pos; } fds[8];
  int nfds;
  size_t share_fds;         /* buffer.share memfds made, their answers not yet read */
  size_t fds_written;       /* of those, the ones whose answer (its descriptor) is
                               out: counted until the client has read every byte
                               written to it (daemon/shm.c) */
  struct wreq *fd_writes;   /* answers with a descriptor that libuv writes now */
  uint64_t rx_pos;
  uint64_t frame_pos;
  /* A buffer.write whose data is being received straight into its cpu
   * buffer (daemon/conn.c, "in place"): its job, made before the data came
   * (it holds the buffer), where the data goes, bytes come so far and in
   * all; NULL j: none. */
  struct {
    struct job *j;
    char *dst;
    size_t got, len;
    /* Or a buffer.write refused before its data came (daemon/conn.c): its
     * data is read and dropped, then it is answered err (msg: its text,
     * NULL when out of memory); and the stream position + 1 of the last
     * frame whose head was checked so (0: none). */
    bool discard;
    int err;
    uint32_t msgid;
    char *msg;
    uint64_t checked;
  } land;
};

struct dspkd {
  uv_loop_t *loop;
  struct dspkd_config cfg;
  uv_pipe_t listener;
  bool listening;
  /* The socket as the log and status's daemon.socket name it: the path
   * bound, absolute (a relative --socket is the start directory's, which
   * a foreground daemon binds as given: its absolute form may be longer
   * than a socket's 107 bytes), or what activation passed (probe 22 E3). */
  char socket_name[PATH_MAX];
  /* The socket file bound (not activated): removed at the stop only while
   * the path still names it, never a file another process put there. */
  dev_t sock_dev;
  ino_t sock_ino;
  uv_async_t done_async;
  uv_timer_t grace_timer;   /* shutdown: cancel what still runs after it */
  uv_timer_t trim_timer;    /* idle: give cached memory back (daemon/conn.c) */
  uv_timer_t hup_timer;     /* connections not read: is the client gone? (conn.c) */
  uv_idle_t resume;         /* deferred connections go on (daemon/conn.c) */
  uint64_t turn_gen;        /* turns given by `resume` */
  bool handles_closed;
  pthread_mutex_t done_mu;
  struct job *done_head, *done_tail; /* guarded by done_mu */
  struct note *notes_head, *notes_tail; /* guarded by done_mu */
  msgpack_zone zone;                 /* decode of one frame at a time */
  /* The connection whose frame d->zone holds now (conn_frame), else NULL:
   * no other frame is decoded meanwhile (daemon/conn.c, conn_process). */
  struct conn *frame;
  uv_idle_t later;          /* frames held by a pause that ended inside a frame (conn.c) */

  struct device devs[DSPKD_MAX_DEVICES];
  int ndevs;
  struct unavailable unavail[DSPKD_MAX_UNAVAILABLE];
  int nunavail;

  struct conn *conns;
  size_t nconns;
  struct duser *users;      /* daemon/quota.c */
  size_t share_fds;         /* buffer.share memfds of every user not yet read
                               (daemon/shm.c, DSPKD_MAX_USER_SHARES) */
  struct dspkd_parked *parked; /* connections closed with those unread (shm.c) */
  _Atomic uint64_t client_maps; /* mappings of every user's buffers (shm.c) */
  struct djob *jobs;        /* daemon/jobs.c: registered Slurm jobs */
  size_t njobs;
  /* The last DSPKD_ENDED_SLOTS jobs ended, so that a claim of one fails: a
   * list without holes, oldest first (ended_jobs[0 .. nended-1], each id
   * once).  A job registered again leaves it and the younger ones move
   * down, so that it always holds the last nended ended jobs (a ring whose
   * requeued slots were left empty lost one more each time it wrapped:
   * probe 21 F1).  Only daemon/jobs.c's dspkd_job_* functions change it. */
  uint64_t ended_jobs[DSPKD_ENDED_SLOTS]; /* ids */
  uid_t ended_uids[DSPKD_ENDED_SLOTS];    /* the uid each was registered for, (uid_t)-1: none */
  unsigned nended;                        /* at most DSPKD_ENDED_SLOTS */
  /* daemon/jobstate.c: the file the registered and the ended jobs are kept
   * in across restarts ("" : none could be named), and whether the start
   * could not read it (then a connection without a registered job gets the
   * cpu only, as with job_required, until the daemon stops). */
  char job_state[4096];
  bool jobs_fail_closed;
  /* The lock file it holds (job_state.lock): its inode as locked, which
   * each rewrite of the state file checks is still the one at the path. */
  bool job_lock_held;
  dev_t job_lock_dev;
  ino_t job_lock_ino;
  uint64_t next_conn_id;
  uint64_t next_buf_id;
  bool stopping;
  bool runners_stopped;
  int exit_code;
  uint64_t start_ms;
  struct dspk__cache *cache;
  /* daemon/activation.c: the listening socket systemd passed (> 0), and
   * whether dspkd_listen() used it (then the stop leaves its file alone). */
  int activation_fd;
  bool activated;
  bool grace_expired;       /* the stop's deadline passed: tasks canceled */
  bool inline_done;         /* loop only: a job ran on the loop (daemon/sched.c's
                               run_inline) and is on the done list, unwoken */
  bool in_read;             /* loop only: on_read is processing, and answers
                               inline_done's jobs before it returns */
  struct dspkd_obs obs;     /* daemon/observe.h */
};

/* daemon/conn.c */
/* Refuses a path too long for sockaddr_un, a non-socket file or a live
 * daemon's socket (logged); removes a stale socket.  0 or a negative code. */
int dspkd_socket_check(const char *path);
/* At start, before the devices open: the socket's directory exists and is
 * a directory.  0, or -1 (logged, as a failed listen says it). */
int dspkd_socket_dir_check(const char *path);
/* Binds (created with mode 0660: dspkd_bind_0660) and listens.  0 or a
 * negative code (logged). */
int dspkd_listen(struct dspkd *d);
/* Binds a Unix socket at path under umask 0117, so that it is created with
 * mode 0660, and opens it into p (libuv then never unlinks the path).  0 or
 * a libuv error. */
int dspkd_bind_0660(uv_pipe_t *p, const char *path);
/* Queues a frame for writing and takes wr (freed once written, or at once
 * when the connection is closing or the frame could not be encoded). */
void dspkd_conn_send(struct conn *c, struct wreq *wr);
void dspkd_conn_send_error(struct conn *c, uint32_t msgid, int code, const char *msg);
/* Connections an admin may open beyond max_clients and max_user_clients. */
#define DSPKD_ADMIN_EXTRA_CONNS 8
void dspkd_conn_close(struct conn *c, const char *why);
/* Closes c after a [2, "protocol.error", [error]] notice of code and msg,
 * written when nothing else waits to be written to it (docs/protocol.md,
 * "Notifications from the daemon"). */
void dspkd_conn_close_notice(struct conn *c, int code, const char *msg);
void dspkd_conn_ref(struct conn *c);
void dspkd_conn_unref(struct conn *c);
/* Re-evaluates whether the connection may read (limits, backpressure), and
 * takes the frames it holds once it may; inside another frame's handler
 * those are left to the loop (daemon/conn.c, conn_process). */
void dspkd_conn_update_read(struct conn *c);
/* After a reload: every connection's reading looked at again (limits raised). */
void dspkd_conn_reloaded(struct dspkd *d);
/* A method that answers later (trace, cache.stats, cache.clear, job.end)
 * takes one (with a reference) when it defers, and gives it back once its
 * answer is sent (or dropped): a half-closed connection stays open for it. */
void dspkd_conn_owe(struct conn *c);
void dspkd_conn_paid(struct conn *c);
/* The connection's requests not yet answered: its device jobs and the
 * answers it is owed.  What max_inflight bounds, and the `inflight` that
 * status, job.end and metrics report. */
static inline size_t dspkd_conn_inflight(const struct conn *c) {
  return c->inflight + c->owed;
}
void dspkd_chunk_unref(struct rchunk *k);
/* At the stop: closes the listener and removes the socket's file (unless
 * systemd owns it). */
void dspkd_listen_stop(struct dspkd *d);
/* Frees the transport's spare read buffer and closes its idle-trim timer
 * (the stop sequence's last step). */
void dspkd_conn_handles_close(struct dspkd *d);
/* At the stop: answers each complete request already read but not yet
 * started with ESHUTDOWN. */
void dspkd_conn_refuse_buffered(struct conn *c);

/* daemon/lifecycle.c: the stop sequence. */
/* Starts the orderly stop: no more accepting or reading, queued jobs fail
 * with ESHUTDOWN, connections close once idle, then runners stop. */
void dspkd_stop(struct dspkd *d);
/* Stops now (second SIGTERM, fatal error): cancels running tasks at once
 * instead of at the grace deadline; the stop still goes in order. */
void dspkd_stop_now(struct dspkd *d);
/* Moves the stop forward after a job completed or a connection went away. */
void dspkd_stop_progress(struct dspkd *d);

/* daemon/buffers.c: the connection's buffer table. */
struct dbuf *dspkd_conn_buf_find(struct conn *c, uint64_t id);
int dspkd_conn_buf_add(struct conn *c, struct dbuf *b);
struct dbuf *dspkd_conn_buf_remove(struct conn *c, uint64_t id);
/* Puts b, out of c's table, on c's held list: c's status and quotas count
 * it until dspkd_conn_buf_unhold (by the last dspkd_dbuf_unref). */
void dspkd_conn_buf_hold(struct conn *c, struct dbuf *b);
/* Takes b off its connection's held list and out of its quotas; nothing
 * when it is on none. */
void dspkd_conn_buf_unhold(struct dbuf *b);
void dspkd_dbuf_ref(struct dbuf *b);
/* Drops a reference; the last one queues the release of its memory on the
 * device's runner. */
void dspkd_dbuf_unref(struct dspkd *d, struct dbuf *b);

/* How every log line names a client: its connection number and the peer's
 * credentials (SO_PEERCRED), the same fields in every line, so that an
 * administrator can tell who was refused or did what:
 *   dspkd_notice(DSPKD_PEER_FMT ": ...", DSPKD_PEER_ARGS(c), ...) */
#define DSPKD_PEER_FMT "client %llu (pid %ld uid %ld gid %ld)"
#define DSPKD_PEER_ARGS(c)                                                     \
  (unsigned long long)(c)->id, (long)(c)->pid, (long)(c)->uid, (long)(c)->gid

/* daemon/shm.c: shared-memory buffers (docs/protocol.md "Shared memory"). */
#define DSPKD_MAX_FDS 8
/* Unclaimed received descriptors of all the connections of one uid, besides
 * the first (the oldest kept) of each connection: a client that follows the
 * protocol's rule keeps at most that one on a connection whose requests are
 * held back (daemon/conn.c reads such a connection no further while it keeps
 * one), so that its paused connections cannot make this bound close another
 * of its connections. */
#define DSPKD_MAX_USER_FDS 64
/* buffer.share memfds of one uid's connections whose answers the client has
 * not read (the job queued or running, the answer waiting to be written, or
 * written and not yet read: a descriptor in flight in the client's receive
 * queue, which the kernel charges to the daemon's user against its
 * RLIMIT_NOFILE): more is ELIMIT.  All users' together are bounded by
 * dspkd_shm_share_max(). */
#define DSPKD_MAX_USER_SHARES 256
/* Descriptors kept for the daemon's own files (devices, cache, listener,
 * metrics) in the RLIMIT_NOFILE check at start (daemon/main.c). */
#define DSPKD_NOFILE_RESERVE 256
struct req;
/* Loop: takes the fds libuv received with the last read into c->fds.  0;
 * or a negative code with msg (len bytes) saying why, for a protocol error
 * that closes the connection: DSPK_ELIMIT past DSPKD_MAX_FDS of the
 * connection or DSPKD_MAX_USER_FDS of its user, DSPK_ENOMEM.  A descriptor
 * the daemon has no descriptor left to keep (EMFILE, ENFILE) is kept as a
 * lost entry (fd -1): the buffer.import that claims it is answered ELIMIT. */
int dspkd_shm_take_fds(struct conn *c, char *msg, size_t len);
/* Loop: closes the fds that came with bytes before the frame starting at
 * c->frame_pos (stray: no buffer.import claimed them). */
void dspkd_shm_drop_stale(struct conn *c);
/* Loop: closes the fds that came with bytes up to stream position pos
 * (the end of the frame just handled: no later frame can take them). */
void dspkd_shm_drop_upto(struct conn *c, uint64_t pos);
/* Loop: closes every unclaimed fd (the connection closes). */
void dspkd_shm_conn_closed(struct conn *c);
/* Loop: a buffer.import refused before its handler ran (its arguments):
 * closes the descriptor it would have taken, if any. */
void dspkd_shm_import_refused(struct conn *c);
/* Loop: counts a buffer.share memfd of c as held (+1) or given up (-1),
 * on c, its user (DSPKD_MAX_USER_SHARES) and the daemon. */
void dspkd_shm_share_count(struct conn *c, int delta);
/* Loop: the descriptor of an answer of c counted by dspkd_shm_share_count
 * went out: it stays counted (c->fds_written) until the client has read
 * what was written to it, or closed its end. */
void dspkd_shm_fd_written(struct conn *c);
/* Loop: the answer wr (with its descriptor, counted on c) cannot be sent
 * (status: the libuv code, a negative errno, of the failed send or setup):
 * frees wr, drops the buffer whose memfd it carried and answers its request
 * with an error instead (ELIMIT for ETOOMANYREFS, the daemon's user has too
 * many descriptors in flight; ENOMEM; else EIO; logged). */
void dspkd_shm_answer_failed(struct conn *c, struct wreq *wr, int status);
/* Loop: c closes: descriptors of its answers that are out and not yet read
 * stay counted, on a duplicate of its socket kept until the client has read
 * them or closed its end ("parked"). */
void dspkd_shm_conn_park(struct conn *c);
/* The stop: closes every parked socket. */
void dspkd_shm_parked_close(struct dspkd *d);
/* Descriptors the daemon may need besides buffer.share's: max_clients
 * connections with their pending buffer.import descriptors, the lingering
 * ones and a reserve for its own files (daemon/config.c: checked at start
 * and at a reload that changes max_clients). */
uint64_t dspkd_fds_need(const struct dspkd_config *cfg);
/* How many buffer.share memfds all users together may have not yet read:
 * what RLIMIT_NOFILE leaves beyond dspkd_fds_need, at least
 * DSPKD_MAX_USER_SHARES. */
uint64_t dspkd_shm_share_max(const struct dspkd *d);
/* Memory mappings made for clients' buffers (docs/protocol.md, "Quotas",
 * max_user_maps): the kernel bounds a process's mappings (vm.max_map_count)
 * and a full count fails every later mmap and brk of the daemon, for every
 * user.  Loop: whether a buffer of size bytes on dev, of shared memory or
 * not (shared), takes a mapping of its own (an imported or shared buffer;
 * a cpu buffer of DSPKD_CPU_MAP_MIN and up, backends/cpu/cpu.c). */
#define DSPKD_CPU_MAP_MIN ((uint64_t)2 << 20) /* DSPK__CPU_BIG_BLOCK */
bool dspkd_maps_needed(const struct device *dev, uint64_t size, bool shared);
/* Loop: 0 when r's user may have one more mapping made for its buffers;
 * else ELIMIT with r->msg saying which bound (max_user_maps: the user's;
 * the clients' share of vm.max_map_count: the daemon's shortage, logged),
 * what names the request (method). */
int dspkd_maps_check(struct req *r, const char *method);
/* A refusal for a shortage of the daemon's (what: its words; section: the
 * docs/admin.md section that explains it), logged as a warning naming the
 * peer at most once a minute per rl, the others at debug with a count in
 * the next warning, so that clients cannot flood the log.  Loop thread. */
struct dspkd_ratelog {
  uint64_t last_ms, unlogged;
};
void dspkd_log_shortage(struct dspkd_ratelog *rl, const struct conn *c, const char *what,
                        const char *section);
/* Loop: counts b's mapping on its connection's user and the daemon. */
void dspkd_maps_take(struct conn *c, struct dbuf *b);
/* Runner (or loop): b's mapping is gone: its count is lowered. */
void dspkd_maps_put(struct dspkd *d, struct dbuf *b);
/* Logs (info) the mappings rule in force: vm.max_map_count, the clients'
 * share and max_user_maps. */
void dspkd_shm_report_maps(const struct dspkd_config *cfg);
/* Logs (info) whether shared buffers can get 2 MiB pages on this host. */
void dspkd_shm_report_pages(void);
int dspkd_m_buffer_import(struct req *r);
int dspkd_m_buffer_share(struct req *r);
/* Runner: places a shared buffer on its device (import_host, else a block
 * of its own, pinned with host_register where offered).  0 or a code. */
int dspkd_shm_create(struct device *dev, struct dbuf *b);
/* Runner: undoes dspkd_shm_create after be->free (unregister, unmap). */
void dspkd_shm_release(struct device *dev, struct dbuf *b);
/* Runner, task.run: copies a tensor's bytes from a staged shared buffer's
 * mapping to its block (to_dev) or back.  0 or a code. */
int dspkd_shm_sync(struct device *dev, struct dbuf *b, uint64_t off, size_t n,
                   bool to_dev);

/* daemon/device.c */
/* Probes every backend (filtered by cfg.backends), starts one runner per
 * device and waits until each opened its device.  0 or a negative code. */
int dspkd_devices_start(struct dspkd *d);
void dspkd_backends_shutdown(struct dspkd *d);
struct device *dspkd_device_find(struct dspkd *d, const char *id, size_t len);
/* Picks the device for "any" among those connection c may use (its Slurm
 * job's; c NULL: all) that can run op (its caps; op NULL: any device):
 * the least-loaded hardware device (each GPU through the first backend that
 * has it and runs op), else cpu:0, else a software device.  NULL: none. */
struct device *dspkd_device_any(struct dspkd *d, struct conn *c, const struct dspk__op *op);
/* Whether dev runs op: 0, or ENOTSUP with why in msg: raw kernels turned off
 * on it by raw_kernels ("kernel: raw kernels are turned off on vulkan:0
 * (raw_kernels in the daemon's configuration)"), else dspk__caps_check's
 * reason.  For a device named in a task and, for "any", each device's. */
int dspkd_device_caps_check(const struct device *dev, const struct dspk__op *op, char *msg,
                            size_t len);
/* Why no device connection c may use runs op: each one's reason
 * (dspkd_device_caps_check), joined with "; ", into buf (cut to len). */
void dspkd_device_none_why(struct dspkd *d, struct conn *c, const struct dspk__op *op,
                           char *buf, size_t len);

/* daemon/quota.c: the quotas of docs/protocol.md ("Quotas"). */
/* Finds or makes the user's counters and counts one more connection of it;
 * NULL when out of memory. */
struct duser *dspkd_user_get(struct dspkd *d, uid_t uid);
/* Counts one connection of the user less (frees it after the last, unless
 * parked descriptors still count on it: dspkd_user_gc). */
void dspkd_user_put(struct dspkd *d, struct duser *u);
/* Frees the user's counters when neither a connection nor a buffer.share
 * memfd not yet read (parked, daemon/shm.c) counts on them. */
void dspkd_user_gc(struct dspkd *d, struct duser *u);
/* Charges a buffer of the connection's table to it and its user (sign 1),
 * or gives it back (-1). */
void dspkd_quota_buf(struct conn *c, struct dbuf *b, int sign);
/* A second block for each buffer job j writes while answers may still be
 * sent from its block (dbuf.reads): its move_mem, set before the quota
 * check; dspkd_quota_keep_moved, once j is done, keeps that charge for the
 * buffers whose reads are still > 0; dspkd_quota_reads_done counts one read
 * of b done and drops b's kept charge at the last. */
void dspkd_quota_move_mem(struct job *j);
void dspkd_quota_keep_moved(struct job *j);
void dspkd_quota_reads_done(struct dbuf *b);
/* Connection c leaves its Slurm job with buffers still held (by answers
 * not yet written): they no longer count for the job. */
void dspkd_quota_job_leave(struct conn *c);
/* Checks a new job against the memory quotas of its connection, user and
 * Slurm job (DSPK_ELIMIT with msg set), then against all users' memory on
 * its device, max_memory (DSPK_ENOMEM with msg set, logged: *logged set);
 * 0 when it fits.  dspkd_sched_submit charges it. */
int dspkd_quota_check(const struct job *j, char *msg, size_t len, bool *logged);
/* What all users together may hold on dev (max_memory; unset:
 * DSPKD_CPU_MEMORY_PCT of cpu:0's memory, all of another device's;
 * UINT64_MAX where the device's memory is unknown). */
uint64_t dspkd_quota_total(const struct dspkd *d, const struct device *dev);
/* Charges (dspkd_sched_submit) or gives back (when it leaves the in-flight list)
 * what the job may take: its answer's bytes and its device memory. */
/* Adds delta to the answer bytes (unsent + reserved) of c's user; once they
 * are back within max_user_unsent, the user's other connections read again
 * (their held frames taken from the loop when this runs inside a frame's
 * handler: daemon/conn.c, conn_process). */
void dspkd_user_answers(struct conn *c, int64_t delta);
/* Whether raw_kernels (daemon/config.c) lets device id run raw kernels. */
bool dspkd_raw_kernels_on(const struct dspkd_config *cfg, const char *id);
/* What one user's answers may reach through its connections that owe none
 * (twice max_user_unsent): beyond it those pause too. */
uint64_t dspkd_user_unsent_ceiling(const struct dspkd *d);
void dspkd_quota_charge(struct job *j);
void dspkd_quota_release(struct job *j);
/* The memory quota of one user, or one connection (conn true), on dev;
 * UINT64_MAX when none. */
uint64_t dspkd_quota_mem(const struct dspkd *d, const struct device *dev, bool conn);
/* The most that buffers of connection c can hold on dev: the least of
 * max_conn_memory, max_user_memory and, when c belongs to a Slurm job (or
 * would, were its job decided now: hello's claim, its cgroup, its user's
 * only job), max_job_memory.  Decides nothing. */
uint64_t dspkd_quota_conn_cap(struct conn *c, const struct device *dev);

/* daemon/jobs.c: Slurm jobs (docs/cluster.md, docs/protocol.md "Slurm jobs"). */
/* Decides the connection's job if not yet done: 0 (c->job set, or NULL for
 * no job), or DSPK_EPERM with msg set (a claim it may not make, or a uid
 * with several jobs here and no claim). */
/* DSPKD_CG_TWO: the line of Slurm's hierarchy names two jobs, so neither
 * is believed (EPERM while the uid has jobs here).  DSPKD_CG_EXITING: the
 * process was exiting, a zombie, or its main thread had exited when its
 * cgroup was read, which then reads as the root (cgroup v1): not believed
 * either (EPERM while the uid has jobs here). */
enum { DSPKD_CG_NONE, DSPKD_CG_JOB, DSPKD_CG_GONE, DSPKD_CG_TWO, DSPKD_CG_EXITING };
/* Reads the peer's cgroup into c->cg_state and c->cg_job (at accept; fd
 * the connection's socket, for the peer's pidfd). */
void dspkd_job_peer_cgroup(struct conn *c, int fd);
int dspkd_job_resolve(struct conn *c, char *msg, size_t len);
/* The same decision without keeping it (status): 0 with *job (NULL: no
 * job), or DSPK_EPERM with msg set. */
int dspkd_job_decide(struct conn *c, struct djob **job, char *msg, size_t len);
/* 1 when the connection may use dev (its job's allocation, the cpu). */
int dspkd_job_dev_ok(const struct conn *c, const struct device *dev);
/* The same for job j (NULL: none) of a connection whose job is decided or
 * not: the cpu always; a job's GPUs by UUID; without a job every device once
 * decided (unless job_required). */
int dspkd_job_dev_allowed(const struct dspkd *d, const struct djob *j, bool decided,
                          const struct device *dev);
/* Drops the connection's reference to its job (conn.c, when it is freed). */
void dspkd_job_conn_gone(struct conn *c);
/* A request of c is done with err (DSPK_ECANCELED: canceled): counted for
 * its job's end when job.end closed c (the log says what became of the
 * work it found in flight).  Loop thread. */
void dspkd_job_request_done(struct conn *c, int err);
/* The admin methods job.register and job.end (daemon/admin.c). */
int dspkd_m_job_register(struct req *r);
int dspkd_m_job_end(struct req *r);
/* Frees every job (at exit). */
void dspkd_jobs_free(struct dspkd *d);
/* Answers now every job.end still waiting for its job's connections (the
 * stop, before it closes the connections left at its deadline). */
void dspkd_jobs_answer_ends(struct dspkd *d);
/* Whether Slurm job id is in d's list of ended jobs (job.end, and dspkd
 * --end-job on the state file's); *uid (NULL: not wanted): the uid it was
 * registered for ((uid_t)-1: it was not). */
bool dspkd_job_was_ended(const struct dspkd *d, uint64_t id, uid_t *uid);
/* What dspkd_job_end_record (or jobs.c's forget) changed in the list, to
 * put it back. */
struct dspkd_ended_undo {
  bool recorded; /* false: nothing was changed, nothing to put back */
  bool dropped;  /* record: the oldest (id, uid) went to make room */
  unsigned at;   /* forget: where id was */
  uint64_t id;
  uid_t uid;
};
/* Adds Slurm job id, registered for uid ((uid_t)-1: not registered), to d's
 * list of ended jobs as the youngest, the oldest dropped when the list is
 * full, unless it is there already.  Whether it was added; *undo (NULL:
 * not wanted) says how to take it back (dspkd_job_end_unrecord). */
bool dspkd_job_end_record(struct dspkd *d, uint64_t id, uid_t uid,
                          struct dspkd_ended_undo *undo);
/* Takes back the last dspkd_job_end_record, as undo says (nothing else
 * changed the list since). */
void dspkd_job_end_unrecord(struct dspkd *d, const struct dspkd_ended_undo *undo);
/* daemon/jobstate.c: the registered and the ended Slurm jobs kept across a
 * restart (docs/protocol.md, "Slurm jobs").  The file (d->job_state): the
 * job_state setting, else the socket's path with .jobs for .sock.
 * At start, before the state file is read and before the daemon detaches
 * (a relative path is the start directory's): d->job_state (a relative
 * job_state made absolute from the current directory), its directory
 * checked, and the lock beside it (PATH.lock, daemon/jobstate.c) taken
 * for the daemon's whole life, so that dspkd --end-job never writes the
 * file under a running daemon.  0, or -1 (logged: the start is refused,
 * exit 2). */
int dspkd_jobstate_start(struct dspkd *d);
/* At a reload whose file gives job_state path (absolute) for the next
 * start, other than the file d runs on: the checks of dspkd_jobstate_start
 * that a path may fail (its directory, unless dir is false: the default
 * socket's, which the start makes; PATH.lock, looked at and locked
 * without being made, and let go at once: another daemon's; a lock file
 * named as the state file; a file with other hard links).  0, or -1 with
 * the reason in why (the reload keeps the running configuration). */
int dspkd_jobstate_reload_check(const struct dspkd *d, const char *path, bool dir, char *why,
                                size_t len);
/* dspkd --end-job ID (no daemon is started): marks job id ended in the
 * state file the daemon would use, as job.end does, keeping the file's
 * owner, group and mode.  The exit status: 0 (the job is ended in the
 * file: done now, or before), DSPKD_EXIT_NOFILE (there is no state file,
 * nor perhaps its directory: nothing is registered in it), each with the
 * outcome, naming the absolute path, in said (len bytes) for the caller to
 * print; 1 (logged: the file is refused as the start refuses it, a path
 * that is not a regular file included, or cannot be read or written),
 * DSPKD_EXIT_LOCKED (logged: a running dspkd holds the lock: end the job
 * through it), 2 (logged: no state file can be named, or a path to its
 * directory that is not one). */
int dspkd_jobstate_end_offline(struct dspkd *d, uint64_t id, char *said, size_t len);
#define DSPKD_EXIT_LOCKED 3
#define DSPKD_EXIT_NOFILE 4
/* At start, after the devices opened and before the socket listens:
 * registers the file's jobs again and remembers its ended ones.  A file
 * that is unsafe (a symlink, another owner, writable by others) or cannot
 * be read or parsed is logged as an error, nothing of it is taken, and
 * jobs_fail_closed is set.  No file: nothing to do. */
void dspkd_jobstate_load(struct dspkd *d);
/* Writes the registered jobs (not ended) and the ended ones to the file
 * anew: a temporary file beside it, fsync, rename, fsync of the directory.
 * 0, or DSPK_EIO with msg naming the file and the reason. */
int dspkd_jobstate_save(const struct dspkd *d, char *msg, size_t len);
/* Whether a connection without a registered job gets the cpu only:
 * job_required, or the state file could not be read at start. */
bool dspkd_jobs_required(const struct dspkd *d);
/* Normalises a UUID for comparison (hex digits, lower case: "GPU-" and
 * dashes dropped).  0, or -1 when it has no hex digit or is too long. */
int dspkd_uuid_norm(const char *in, size_t len, char out[DSPKD_UUID_LEN]);

/* daemon/task.c: runner side of each job kind; encodes j->resp.  The
 * job's work may still run on the device when it returns. */
void dspkd_job_execute(struct device *dev, struct job *j);
/* Whether output i of the task j is written into a buffer that one of its
 * inputs reads, or into one sharing its memory (a mapping of the same memfd),
 * in an overlapping byte range (but for a map's output that is
 * exactly its input: elementwise, each element is read before it is
 * written).  Such an output is computed into a block of its own and copied
 * into the buffer afterwards, so the result is as if every input were read
 * first; the quota counts that block. */
bool dspkd_out_aliases(const struct job *j, int i);
/* The input that output i overlaps so (dspkd_out_aliases), the first one,
 * or -1. */
int dspkd_out_alias_input(const struct job *j, int i);
/* Runner: frees the retired blocks (struct mpin) no answer is sent from
 * any more; exiting: forgets the others too (the backend's close releases
 * them). */
void dspkd_retired_sweep(struct device *dev, bool exiting);
/* Runner: the job's work finished on the device.  err < 0: the device
 * reported that error for it (the answer becomes that error); else a task's
 * answer gets time_us = ns (rounded up to microseconds). */
void dspkd_job_finish(struct device *dev, struct job *j, int err, uint64_t ns);

/* daemon/methods.c */
struct req {
  struct conn *c;
  uint32_t msgid;
  const msgpack_object *args; /* the params map, or NULL */
  struct dspk__pval v[DSPK__MAX_PARAMS]; /* the params decoded by
                                           proto/schema.c's table */
  struct rchunk *chunk;       /* the frame's bytes */
  char msg[512];              /* error detail for the response */
  /* The method logged its failure itself, in the one line its docs name
   * (daemon.reload's "reload: ..."): conn.c then writes no generic
   * "client N: METHOD #ID: ECODE" line, which would repeat it (probe 19
   * E2: a reload refused with EIO was two err lines). */
  bool logged;
  /* The refusal is the client's own per-user bound, whose code is not one
   * of the client's mistakes by itself (a trace slot of its uid: EBUSY, as
   * a shortage of all users' slots is): a debug line as every exceeded
   * limit of the client's own (docs/admin.md, "Logs"; probe 20 E3: it was
   * a warn line any user could write). */
  bool own_limit;
};
/* A result response of method (proto/schema.h's DSPK__M_*) to msgid, its
 * fields vals (indexed by the method's DSPK__R_* enum) packed by the
 * protocol table's one encoder; NULL when out of memory (daemon/methods.c). */
struct wreq *dspkd_result(uint32_t msgid, int method, const struct dspk__pval *vals);
/* Runs the request's method: returns 0 when it answered or queued a job,
 * or a negative code that the caller answers with r->msg. */
int dspkd_dispatch(struct req *r, const char *method, size_t len);
/* buffer.write in place (daemon/conn.c): for the head of a buffer.write
 * whose data is still to come, the address in the buffer's memory where the
 * loop may receive that data itself, with c->land set (its job made, which
 * holds the buffer); NULL when it takes the ordinary path (not a cpu buffer
 * whose memory only this request would touch now, a request the ordinary
 * path answers with an error, or no memory for the job).
 * dspkd_land_end: all of the data came; queues the job, which only
 * answers.  A connection closed before frees the job unanswered. */
char *dspkd_land_begin(struct conn *c, const struct dspk__write_head *h);
void dspkd_land_end(struct conn *c);
/* The error the ordinary path would answer a buffer.write with (its
 * arguments' decoding, ENOBUF, ENODEV, ERANGE: the checks it makes before
 * it queues a job), r->args being its params with len bytes of data, the
 * data itself not there yet (daemon/conn.c, "refused before its data");
 * r->msg tells it.  0: the request is good. */
int dspkd_write_refused(struct req *r, uint64_t len);
/* Resolves a task's or buffer's device name ("any" or an id) for the
 * connection (its Slurm job's devices): NULL with *err and r->msg set. */
struct device *dspkd_resolve_device(struct req *r, const char *name, int *err);
/* Whether a new buffer of size bytes fits dev's memory, the size limit and
 * the connection's max_buffers: 0, or a code with r->msg set. */
int dspkd_buffer_fits(struct req *r, struct device *dev, uint64_t size);
/* Queues the create job of a new buffer of size bytes on dev, answering r
 * (buffer.create; buffer.import and buffer.share, daemon/shm.c, with host,
 * file and share_fd: the shared mapping, the fstat of the memfd it maps from
 * its start, and the memfd for the answer or -1; else NULL, NULL and -1).
 * It takes host and share_fd: unmapped and closed here when out of memory,
 * else by the buffer's release.  0, or a code with r->msg set. */
int dspkd_buffer_submit(struct req *r, struct device *dev, uint64_t size, void *host,
                        const struct stat *file, int share_fd);

/* daemon/cache_methods.c: the cache.stats and cache.clear handlers of
 * dspkd_dispatch (same contract: 0 when answered or queued, else a negative
 * code with r->msg). */
int dspkd_m_cache_stats(struct req *r);
int dspkd_m_cache_clear(struct req *r);

uint64_t dspkd_now_ms(void);

/* Touches DSPKD_HEAP_WARM_MB of the calling thread's malloc arena once, at
 * start, so the first tasks after a (re)start reuse resident pages instead
 * of faulting in fresh ones: the loop thread (read buffers, answers) and
 * each runner (operands, work buffers) have arenas of their own.  With the
 * trim threshold of main() the pages stay in the arena after the free. */
#define DSPKD_HEAP_WARM_MB 16
void dspkd_heap_warm(void);

#endif /* DSPKD_DSPKD_H */
