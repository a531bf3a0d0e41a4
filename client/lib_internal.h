/*
 * Internals of libdspkclient shared by its source files: the client
 * structure, the blocking request/response machinery of lib_conn.c, and the
 * msgpack-to-JSON converter of lib_json.c.  Nothing here is exported.
 */
#ifndef DSPK_CLIENT_LIB_INTERNAL_H
#define DSPK_CLIENT_LIB_INTERNAL_H

#include <msgpack.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "dspk/dspk.h"
#include "proto/codec.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it (advice only) */
#endif

/* A complete response frame, kept until its ticket is waited for. */
struct dspk__frame {
  uint32_t msgid;
  char *buf;   /* owned */
  size_t len;
  size_t older, newer; /* neighbours in arrival order: 1 + index in done; 0: none */
};

/* Idle shared temporaries kept by a client, together, at most (lib_shm.c;
 * less under a small memory quota: dspk_client.shm_idle_bytes). */
#define SHM_IDLE_BYTES ((size_t)256 << 20)

struct dspk_client {
  int fd;
  pid_t pid;              /* the process that connected (dspk__forked) */
  bool broken;            /* the stream is unusable; every call fails */
  int broken_code;
  char broken_why[1024];  /* c->err when it broke: later calls quote it */
  bool broken_unseen;     /* the daemon's protocol.error was read but no call
                             failed with it yet: the first to does so as it is
                             (dspk.h), without "no longer usable" */
  uint32_t next_id;
  struct dspk__limits lim; /* applied to what the daemon sends */
  size_t send_max;          /* the daemon's max_message (from hello) */
  size_t shm_idle_bytes;    /* idle shared temporaries kept, together, at most:
                               SHM_IDLE_BYTES and an eighth of hello's
                               cpu_memory_quota (they count toward it) */
  char err[1024];
  char daemon_version[64];
  dspk_progress_fn progress;
  void *progress_ud;
  /* The progress callback is running (calls made from it may read
   * notifications: they are queued here and delivered, in order, once it
   * returns, so that the callback is never entered twice at once). */
  bool in_progress;
  bool closed;            /* dspk_close from the callback: every wait fails */
  struct dspk__prog {
    uint32_t ticket;
    double fraction;
    char what[128];
  } *pq;
  size_t npq, cappq;
  /* dspk_set_timeout: the longest one wait for the daemon may take, in ms
   * (0: no limit), and the call that set it, which a timeout names
   * ("dspk_connect_timeout" until dspk_set_timeout). */
  int timeout_ms;
  const char *timeout_by;
  /* Bytes still to be dropped from the stream before the next frame's: the
   * rest of an answer whose reading timed out after it began. */
  size_t skip;
  /* Requests given up on (a synchronous call that timed out): their late
   * answers are dropped (frees_buffer: the buffer the answer names is freed
   * with a buffer.free of its own). */
  struct dspk__abandoned {
    uint32_t msgid;
    bool frees_buffer;
  } *abandoned;
  size_t nabandoned, capabandoned;
  /* A request was given up on that c->abandoned could not hold (out of
   * memory): the daemon may run it still, and c never learns when it ends,
   * so for the rest of the connection something counts as in flight
   * (dspk__daemon_busy). */
  bool abandoned_lost;
  /* Received bytes not yet consumed: rlen of them at rbuf, which lies
   * inside the allocation at rbase (the bytes between were consumed), with
   * rcap bytes from rbuf to its end. */
  char *rbuf, *rbase;
  size_t rlen, rcap;
  /* A large rbuf handed over with its frame comes back here when the
   * response is freed, so the next large frame does not grow a fresh
   * buffer again (realloc copies, page faults). */
  char *spare;
  size_t spare_cap;
  /* The first output's data of the task.run answer now arriving, received
   * straight into memory of its own (dspk__run_head_scan): the frame in
   * rbuf has that bin emptied, and decode() puts land back in its place.
   * NULL when none. */
  void *land;
  size_t land_len;
  /* Requests sent and not yet waited for: an open-addressing hash table
   * of capinflight slots (a power of two, at most half full; msgid 0, which
   * no request has, is an empty slot), each with its kept answer (1 + its
   * index in done; 0: none), so that finding a ticket and its answer costs
   * the same with any number in flight (lib_conn.c). */
  struct dspk__inflight {
    uint32_t msgid;
    uint32_t kept;
  } *inflight;
  size_t ninflight, capinflight;
  /* Responses that arrived before their wait, linked in arrival order
   * (done_oldest, done_newest: 1 + index; 0 when none), so that
   * dspk_wait_any takes them first come, first served. */
  struct dspk__frame *done;
  size_t ndone, capdone, done_oldest, done_newest;
  /* The devices of the buffers dspk_buffer_create made (until freed): a
   * reference pins a task on "any" to its buffer's device, where its
   * temporaries must be made too (lib_calls.c, submit). */
  struct dspk__bufdev {
    uint64_t id;
    char device[48];
  } *bufdev;
  size_t nbufdev, capbufdev;
  /* Reused for each response, so a small answer costs no allocation: a
   * zone for its unpacked objects and a buffer for its bytes, each lent to
   * one dspk__resp at a time (a second live response gets its own). */
  msgpack_zone zone;
  bool zone_ready, zone_busy;
  bool fbuf_busy;
  char fbuf[4096];
  /* Ranges of memory that are a file's bytes (dspk_file_data): sent with
   * sendfile from the file. */
  struct dspk__fmap {
    const char *addr;
    size_t len;
    int fd;         /* owned (a dup) */
    uint64_t off;   /* of addr in the file */
    bool no;        /* sendfile refused it: sent from memory */
  } *fmaps;
  size_t nfmaps, capfmaps;
  /* dspk_result_to_file: answers whose first output goes to a file (fd a
   * dup, closed when the answer comes or the client closes), and the pipe
   * that splice(2) moves it through. */
  struct dspk__sink {
    uint32_t ticket;
    int fd;
    uint64_t off;
    bool *written;
  } *sinks;
  size_t nsinks, capsinks;
  int sink_pipe[2];
  bool sink_pipe_ok;
  /* lib_shm.c: shared allocations (the caller's and temporaries). */
  struct dspk__shm *shm;
  size_t nshm, capshm;
  uint64_t shm_clock;       /* counts temporaries made idle (their `used`) */
  size_t shm_threshold;     /* inline operands from this size go shared; 0: off */
  int shm_any;              /* "any" is cpu:0 (the daemon has no hardware device):
                               0 not known yet, 1 yes, 2 no */
  uint64_t cpu_quota;       /* hello's cpu_memory_quota: what this connection's
                               buffers on cpu:0 may hold (UINT64_MAX: none) */
};

/* A decoded response: the frame and its unpacked envelope. */
struct dspk__resp {
  char *buf;                 /* frame bytes: owned, or the client's fbuf */
  size_t len;
  msgpack_unpacked up;       /* used when zone is NULL */
  msgpack_zone *zone;        /* the client's zone when borrowed, else NULL */
  dspk_client *owner;        /* lender of fbuf/zone */
  size_t cap;                /* bytes of buf when it was the client's rbuf, else 0 */
  void *land;                /* the first output's data received apart (64-byte
                                aligned, malloc'd; the unpacked bin points at
                                it), or NULL; freed with the response unless
                                taken (set to NULL) */
  struct dspk__msg msg;
};

/* Sets c->err from a format (the code's description when that comes out
 * empty) and returns code. */
int dspk__cerr(dspk_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A bad argument of a public function: DSPK_EINVAL, with the reason in
 * c->err when there is a client to hold it (NULL c: none, and the code
 * alone says it), so that dspk_last_error() is never "" after a failure. */
int dspk__argerr(dspk_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A call on c made in another process than the one that connected (a
 * child of fork() using an inherited client): DSPK_ECLOSED with a message
 * naming fork, nothing read or written; 0 in the connecting process. */
int dspk__forked(dspk_client *c);

/* Whether [p, p + n) lies in a range of a file (dspk_file_data) that is
 * sent with sendfile (not one sendfile refused). */
bool dspk__file_range(const dspk_client *c, const void *p, size_t n);
/* That range (its file and offset), or NULL. */
const struct dspk__fmap *dspk__fmap_of(const dspk_client *c, const void *p, size_t n);

/* Calls that may grow a file on the caller's behalf (ftruncate of a memfd,
 * sendfile into one, pwrite and splice into a dspk_result_to_file file)
 * run between these two: SIGXFSZ blocked in the calling thread, so that a
 * file size limit (RLIMIT_FSIZE) makes the call fail with EFBIG instead of
 * killing the process, and a SIGXFSZ it raised taken back (one pending
 * before is left alone).  The library installs no signal handler; this
 * keeps it from leaving signals behind too. */
struct dspk__nofsz {
  sigset_t old;
  bool pending; /* SIGXFSZ was pending already */
};
void dspk__nofsz_begin(struct dspk__nofsz *g);
void dspk__nofsz_end(struct dspk__nofsz *g);

/* Has w reference every bin whose bytes lie in a file range of c
 * (dspk_file_data), short ones too, instead of copying them: they are
 * sent with sendfile and never read through the caller's mapping, which
 * faults (SIGBUS) where the file shrank. */
void dspk__wbuf_files(const dspk_client *c, struct dspk__wbuf *w);

/* A fresh msgid for a request (never one still in flight). */
uint32_t dspk__next_id(dspk_client *c);
/* Sends the request frame in w, packed with msgid, and registers msgid as
 * in flight.  Returns 0 or a negative code (message in c->err); when bytes
 * may have been partly sent the connection is marked broken.  w stays owned
 * by the caller. */
int dspk__send(dspk_client *c, struct dspk__wbuf *w, uint32_t msgid);
/* The same, passing fd (SCM_RIGHTS) with the frame's first byte. */
int dspk__send_fd(dspk_client *c, struct dspk__wbuf *w, uint32_t msgid, int fd);

/* lib_shm.c */
struct dspk__shm {
  char *ptr;
  size_t size;
  uint64_t id;
  char device[32];
  int state;        /* 0: the caller's; 1: temporary, in use by `ticket`;
                       2: temporary, idle; 3: temporary, being filled;
                       4: temporary, lent to a dspk_result (`lease`) */
  uint32_t ticket;
  struct dspk__lease *lease;
  uint64_t used;    /* c->shm_clock when it was last made idle */
  bool unmapped;    /* a lent one returned larger than shm_idle_bytes: its
                       pages are gone, its buffer is dropped by the next trim */
  bool freed;       /* its id was freed with dspk_buffer_free (the daemon has no
                       such buffer now): the caller's stays mapped until
                       dspk_shared_free but stands for no operand and takes no
                       local read or write; a temporary is dropped once idle */
};
/* An inline operand of n bytes that cannot go on the socket in a task.run:
 * one of half the daemon's max_message or more (dspk.h).  It goes through a
 * shared temporary whatever the shared threshold, and one that cannot be
 * had fails the task. */
static inline bool dspk__operand_needs_shm(const dspk_client *c, size_t n) {
  return n >= c->send_max / 2;
}
/* The bytes an inline result may carry: max_message - 1024 (protocol.md
 * "Limits"; none at all for a max_message of 1024 bytes or less). */
#define DSPK__RESULT_FRAMING 1024
static inline size_t dspk__result_inline_max(const dspk_client *c) {
  return c->send_max > DSPK__RESULT_FRAMING ? c->send_max - DSPK__RESULT_FRAMING : 0;
}
/* The one result of a task, of at most n bytes, that goes through a shared
 * temporary whatever the shared threshold: of half max_message or more
 * (dspk.h), or more than an inline result may carry.  Only the latter
 * fails the task when its temporary is refused; the other comes inline. */
static inline bool dspk__result_needs_shm(const dspk_client *c, size_t n) {
  return n >= c->send_max / 2 || n > dspk__result_inline_max(c);
}
/* The reference for an inline operand of task `device` (items of isz
 * bytes): 1 with *id, *off when it lies in a shared allocation that can
 * stand for it (its device the task's, or the task's "any"; the offset a
 * multiple of isz) or was copied into a temporary one (state 3 until
 * dspk__shm_sent; without may_wait only an idle one, never a new one,
 * except for an operand that dspk__operand_needs_shm, whatever the
 * threshold), 0 when it goes inline, or a negative code (also when such an
 * operand's temporary was refused).  task_bytes: what the task's inline
 * operands and its result take of the device's memory, these n included
 * (a temporary's room under a quota: lib_shm.c, shm_temp). */
int dspk__shm_operand(dspk_client *c, const char *device, const void *data, size_t n,
                      size_t isz, uint64_t task_bytes, bool may_wait, uint64_t *id,
                      uint64_t *off);
/* The caller's shared allocation (dspk_shared_alloc) that holds
 * [data, data + n), or NULL. */
const struct dspk__shm *dspk__shm_holding(const dspk_client *c, const void *data, size_t n);
/* memcpy on up to `threads` threads (at most 4, each part at least 4 MiB;
 * the caller's thread copies a part too, and a part whose thread cannot
 * start). */
void dspk__copy_wide(void *dst, const void *src, size_t n, int threads);
/* A temporary for the one inline result of a task on `device`, of n bytes
 * (at least the result's): 1 with *id (state 3 until dspk__shm_sent), 0
 * when the result comes back inline (below the threshold, "any" free to
 * choose a hardware device, no idle temporary fits and !may_wait; neither
 * of the first and last for a result that dspk__result_needs_shm), or a
 * negative code (also when the temporary of a result larger than
 * dspk__result_inline_max was refused).  task_bytes: as for
 * dspk__shm_operand. */
int dspk__shm_result(dspk_client *c, const char *device, size_t n, uint64_t task_bytes,
                     bool may_wait, uint64_t *id);
/* Bytes [off, off+n) of temporary id while it belongs to ticket, or NULL. */
const char *dspk__shm_of_ticket(dspk_client *c, uint32_t ticket, uint64_t id,
                                uint64_t off, size_t n);
/* Where buffer id's bytes [off, off+n) are in this process, when id is a
 * live dspk_shared_alloc of c (not freed with dspk_buffer_free) and the daemon
 * works on no request of c (dspk__daemon_busy: so a local copy keeps
 * the order the daemon would give); else NULL. */
char *dspk__shm_local(dspk_client *c, uint64_t id, uint64_t off, size_t n);
/* Whether [p, p + n) overlaps the mapping of c's live shared allocation id
 * (dspk_buffer_write/read from or into its own pages). */
bool dspk__shm_overlaps(const dspk_client *c, uint64_t id, const void *p, size_t n);
/* The result of ticket that the daemon wrote into temporary id: lends the
 * temporary's pages to the result (state 4: no copy; dspk_result_free gives
 * them back for reuse) and returns where its bytes [off, off+n) are, or
 * NULL when the result must be copied (too many lent already). */
char *dspk__shm_lend(dspk_client *c, uint32_t ticket, uint64_t id, uint64_t off, size_t n);
/* dspk_result_free: 1 when p is the start of a lent temporary (now given
 * back, or unmapped when its client is closed), 0 when p is not one. */
int dspk__shm_lease_return(const void *p);
/* Registers data, inside the read-only file mapping [map, map + map_len),
 * as a result's memory: dspk_result_free (dspk__shm_lease_return) unmaps
 * it.  Returns data, or NULL (out of memory: the caller unmaps). */
char *dspk__file_lease(void *map, size_t map_len, char *data);
/* Frees a landed payload: a file mapping's (dspk__file_lease) is unmapped,
 * memory freed. */
void dspk__land_free(void *p);
/* After a submit: temporaries being filled belong to ticket (ok) or are
 * idle again (!ok). */
void dspk__shm_sent(dspk_client *c, uint32_t ticket, bool ok);
/* After ticket's answer: its temporaries are idle (kept for reuse). */
void dspk__shm_done(dspk_client *c, uint32_t ticket);
/* Frees the idle temporaries beyond what is kept for the next tasks
 * (SHM_IDLE_MAX of at most c->shm_idle_bytes together, the most recently used):
 * they are daemon buffers of the user's, counted by max_buffers and the
 * memory quotas.  Called by dspk_wait and dspk_wait_any once an answer is
 * consumed. */
void dspk__shm_trim(dspk_client *c);
/* dspk_buffer_free freed buffer id: a shared allocation or temporary of c
 * with that id is marked freed (lib_shm.c, struct dspk__shm). */
void dspk__shm_freed(dspk_client *c, uint64_t id);
/* Frees every idle temporary (a refused allocation is then tried again):
 * whether there was any. */
bool dspk__shm_drop_idle(dspk_client *c);
/* Whether c holds idle temporaries (those whose lent results were freed
 * included): daemon buffers that count toward the quotas a task may be
 * refused for. */
bool dspk__shm_has_idle(dspk_client *c);
/* Whether "any" can be nothing but cpu:0 (the daemon has no hardware
 * device), where a temporary is made for a task on "any": learned once
 * with a `devices` call (which waits), c->shm_any then. */
bool dspk__shm_any_is_cpu(dspk_client *c);
/* Whether a temporary of n bytes for a task on device (task_bytes: its
 * inline operands and result, these n included) is not made for the
 * connection's quota on cpu:0 (hello's cpu_memory_quota): with the shared
 * memory c holds there, the temporary in whole 2 MiB units and the task's
 * other inline bytes would pass it.  false on any other device. */
bool dspk__shm_quota_stops(const dspk_client *c, const char *device, size_t n,
                           uint64_t task_bytes);
/* The temporaries ticket's task was sent with (in use by it). */
size_t dspk__shm_of_task(const dspk_client *c, uint32_t ticket);
/* dspk_close: unmaps everything (the daemon frees the buffers). */
void dspk__shm_close(dspk_client *c);

/* dspk_result_to_file for ticket's answer that did not go to the file on
 * its way in (read while another ticket was waited for, or a result in a
 * shared temporary): writes the first output's n bytes at data to the
 * file, and returns a read-only mapping of them there (freed as a landed
 * payload, dspk__land_free) with *written set; NULL when ticket has no
 * sink, n is below 64 KiB or the file takes no more bytes (the output
 * stays where it is).  The sink is gone either way. */
char *dspk__sink_write(dspk_client *c, uint32_t ticket, const void *data, size_t n);
/* Forgets ticket's dspk_result_to_file (an error answer, a wait done). */
void dspk__sink_forget(dspk_client *c, uint32_t ticket);

/* Waits for the response to msgid (which must be in flight) and consumes
 * it: 0 with *r filled (free with dspk__resp_free), an error response's code
 * (message in c->err), or a transport error. */
int dspk__wait(dspk_client *c, uint32_t msgid, struct dspk__resp *r);
/* Like dspk__wait for the first in-flight request to complete. */
int dspk__wait_any(dspk_client *c, uint32_t *msgid, struct dspk__resp *r);
void dspk__resp_free(struct dspk__resp *r);
/* Waits for the response to msgid, a buffer.read of n bytes, and puts its
 * data into dst: read from the socket straight into dst when the answer is
 * next in the stream, else through dspk__wait.  0 or a negative code. */
int dspk__wait_into(dspk_client *c, uint32_t msgid, void *dst, size_t n);
/* Packs and sends a request (as dspk__call does) without waiting: its
 * msgid in *id.  0 or a negative code. */
int dspk__send_call(dspk_client *c, const char *method,
                    void (*pack)(void *ud, struct dspk__wbuf *w), void *ud,
                    uint32_t *id);
/* True when msgid is in flight. */
bool dspk__inflight_has(const dspk_client *c, uint32_t msgid);
/* Whether the daemon may still be working on a request of c: one in flight,
 * or one given up on after a timeout (dspk__abandon) whose answer has not
 * come yet, which the daemon still runs.  A local shortcut that must keep
 * the daemon's order of requests (dspk__shm_local) is taken only when it is
 * false. */
bool dspk__daemon_busy(const dspk_client *c);
/* Gives up on request msgid after its wait timed out: no longer in flight,
 * its late answer dropped when it comes (the temporaries of that ticket
 * idle again then; with frees_buffer, the buffer the answer names freed). */
void dspk__abandon(dspk_client *c, uint32_t msgid, bool frees_buffer);

/* Sends a request (packed by pack(ud, pk) as the params map, or no params
 * when pack is NULL) and waits for its result. */
int dspk__call(dspk_client *c, const char *method,
               void (*pack)(void *ud, struct dspk__wbuf *w), void *ud,
               struct dspk__resp *r);

/* A growing JSON text (lib_json.c): p is NUL-terminated, err is the first
 * failure (DSPK_ENOMEM), after which nothing more is written. */
struct dspk__jbuf {
  char *p;
  size_t len, cap;
  int err;
};
void dspk__jput(struct dspk__jbuf *j, const char *s, size_t n);
void dspk__jputs(struct dspk__jbuf *j, const char *s);
/* s[0..n) as a JSON string, quoted and escaped. */
void dspk__jstr(struct dspk__jbuf *j, const char *s, size_t n);

/* Converts o to JSON text (NUL-terminated, malloc'd) in *out.  0 or
 * DSPK_ENOMEM. */
int dspk__to_json(const msgpack_object *o, char **out);

/* Copies a str value into buf, truncating; "" when o is not a str. */
void dspk__strncpy_obj(const msgpack_object *o, char *buf, size_t buflen);

struct dspk__param;
struct dspk__pval;

/* The fields of a nested result map that dspk__result_decode checked,
 * typed, indexed by its table's enum (e.g. dspk__device_f, DSPK__DEV_*);
 * out[] zeroed first (lib_calls.c). */
void dspk__fields(const struct dspk__param *f, int n, const msgpack_object *map,
                  struct dspk__pval *out);
/* Copies a str field into buf as dspk__strncpy_obj does (lib_calls.c). */
void dspk__strncpy_pval(const struct dspk__pval *v, char *buf, size_t buflen);

/* Fills a from one device of the status answer, its fields as dspk__fields
 * gives them against dspk__st_device_f (lib_observe.c). */
void dspk__status_activity(const struct dspk__pval *dev, dspk_device_activity *a);

#endif /* DSPK_CLIENT_LIB_INTERNAL_H */
