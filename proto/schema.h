/*
 * The protocol as data: every method of docs/protocol.md with its
 * parameters (name, type, range, default, required or not) and the keys of
 * its result, and every op of task.run with its options.  One generic
 * decoder (dspk__params_decode) checks a request's params map against a
 * method's table and hands the handler typed values indexed by the
 * parameter enums below; one generic encoder (dspk__params_encode) packs a
 * request from the same table in libdspkclient.  dspk__schema_json writes
 * the whole description as JSON (installed as share/dspk/protocol.json) for
 * clients in other languages and for the test that checks
 * docs/protocol.md against it.
 *
 * Adding a parameter: its enum below, its row in proto/schema.c, its
 * documentation in docs/protocol.md (tests/proto/schema_docs.py fails
 * until all three agree).
 */
#ifndef DSPK_PROTO_SCHEMA_H
#define DSPK_PROTO_SCHEMA_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dspk/types.h"
#include "proto/codec.h"
#include "proto/options.h"

/* Value types of a parameter. */
enum dspk__ptype {
  DSPK__T_BOOL,    /* v.b */
  DSPK__T_UINT,    /* v.u, in [min, max] */
  DSPK__T_NUM,     /* v.f: an int or a float */
  DSPK__T_STR,     /* v.s: at most max bytes, no NUL (ELIMIT when longer) */
  DSPK__T_BIN,     /* v.s: bin, or str */
  DSPK__T_ENUM,    /* v.e: index into choices */
  DSPK__T_ENUMS,   /* v.mask: array of choices, bit i for choices[i] */
  DSPK__T_DIM3,    /* v.dim: 1 to 3 ints in [1, 2^32-1], missing ones 1 */
  DSPK__T_ARRAY,   /* v.o: an array of min to max elements (max 0: any),
                      whose elements the handler decodes (e.g. tensors);
                      with .item, each element is checked against it */
  DSPK__T_MAP,     /* v.o: a map, decoded by the handler against another
                      table (task.run's options: dspk__op_desc); with
                      .fields, a map of those fields (checked by the
                      decoder); with .keys and .item, a map from names
                      among keys to values of item */
  DSPK__T_INT,     /* v.i: a signed integer (results: a pid, uid or gid,
                      -1 when unknown) */
};

#define DSPK__P_REQUIRED 1u /* absent or nil is an error */
#define DSPK__P_NIL 2u      /* results: nil is a value of it ("int|nil"),
                               pval.nil */

struct dspk__pval {
  bool set; /* present and not nil (else the value is the default); with
               DSPK__P_NIL: present */
  bool nil; /* DSPK__P_NIL: the value is nil */
  union {
    bool b;
    uint64_t u;
    int64_t i;
    double f;
    struct { const char *p; size_t n; } s; /* not NUL-terminated */
    int e;
    unsigned mask;
    uint32_t dim[3];
    const msgpack_object *o;
    /* encoder only (ARRAY, MAP): packs the value */
    struct { void (*fn)(const void *ud, struct dspk__wbuf *w); const void *ud; } pack;
  } v;
  /* encoder only (BIN): called with release_ud once the bytes are written
   * (dspk__wbuf_bin_ref); NULL: the bytes outlive the frame. */
  void (*release)(void *ud);
  void *release_ud;
  /* decoder only (NUM): the object the value came from, so that a message
   * can name it as sent (an integer exactly: dspk__obj_num_str); NULL for
   * a default. */
  const msgpack_object *src;
};

/* A set value of each type, for the encoders. */
static inline struct dspk__pval dspk__pv_uint(uint64_t u) {
  struct dspk__pval p = {.set = true};
  p.v.u = u;
  return p;
}
static inline struct dspk__pval dspk__pv_int(int64_t i) {
  struct dspk__pval p = {.set = true};
  p.v.i = i;
  return p;
}
/* nil, for a field of DSPK__P_NIL. */
static inline struct dspk__pval dspk__pv_nil(void) {
  struct dspk__pval p = {.set = true, .nil = true};
  return p;
}
/* An ENUMS value: bit i for choices[i]. */
static inline struct dspk__pval dspk__pv_mask(unsigned mask) {
  struct dspk__pval p = {.set = true};
  p.v.mask = mask;
  return p;
}
static inline struct dspk__pval dspk__pv_bool(bool b) {
  struct dspk__pval p = {.set = true};
  p.v.b = b;
  return p;
}
static inline struct dspk__pval dspk__pv_enum(int e) {
  struct dspk__pval p = {.set = true};
  p.v.e = e;
  return p;
}
static inline struct dspk__pval dspk__pv_num(double f) {
  struct dspk__pval p = {.set = true};
  p.v.f = f;
  return p;
}
/* s is NUL-terminated and outlives the encoding. */
static inline struct dspk__pval dspk__pv_str(const char *s) {
  struct dspk__pval p = {.set = true};
  p.v.s.p = s;
  p.v.s.n = strlen(s);
  return p;
}
/* release(ud) once the bytes were written (NULL: they outlive the frame). */
static inline struct dspk__pval dspk__pv_bin(const void *b, size_t n, void (*release)(void *),
                                             void *ud) {
  struct dspk__pval p = {.set = true, .release = release, .release_ud = ud};
  p.v.s.p = (const char *)b;
  p.v.s.n = n;
  return p;
}
/* An ARRAY or MAP: fn(ud, w) packs it. */
static inline struct dspk__pval dspk__pv_pack(void (*fn)(const void *ud, struct dspk__wbuf *w),
                                              const void *ud) {
  struct dspk__pval p = {.set = true};
  p.v.pack.fn = fn;
  p.v.pack.ud = ud;
  return p;
}

struct dspk__param {
  const char *name;
  enum dspk__ptype type;
  unsigned flags;                /* DSPK__P_REQUIRED */
  uint64_t min, max;             /* UINT: range; STR: max bytes; ARRAY: count */
  int range_err;                 /* UINT out of range, ARRAY over max: this
                                    code (0: as a wrong type, EINVAL
                                    "expected ...") */
  const char *const *choices;    /* ENUM, ENUMS: NULL-terminated */
  const char *noun;              /* ENUM: 'unknown <noun> "x"' */
  const char *expect;            /* what a wrong value gets told it should be
                                    ("a byte count"); NULL: from the type */
  struct dspk__pval def;         /* the default (def.v), when not required */
  const char *def_doc;           /* the default as docs/protocol.md writes it;
                                    NULL: none, or the zero of the type */
  const char *values_doc;        /* NUM: its range as docs/protocol.md
                                    writes it (NULL: any number) */
  size_t at;                     /* op options: 1 + the offset in
                                    union dspk__op_options where
                                    dspk__params_store puts the value; 0:
                                    not stored */
  size_t at_sent;                /* op options, NUM: 1 + the offset of a
                                    struct dspk__num_sent where
                                    dspk__params_store puts the number as
                                    sent, for messages that name it; 0: none */
  /* Results: what a MAP or ARRAY holds (NULL: not described, the handler's
   * own).  A MAP of fields[0..nfields) (name, type, DSPK__P_REQUIRED:
   * always there), packed by dspk__map_encode in that order; a MAP whose
   * keys are names among keys (NULL-terminated) and whose values are each
   * an item; an ARRAY whose elements are each an item (an unnamed row). */
  const struct dspk__param *fields;
  int nfields;
  const char *const *keys;
  const struct dspk__param *item;
};

struct dspk__method {
  const char *name;
  const struct dspk__param *params;
  int nparams;
  const struct dspk__param *results; /* the result map's fields (name,
                                    type; DSPK__P_REQUIRED: always there),
                                    indexed by the result enums below;
                                    NULL when the result is a str */
  int nresults;
  unsigned char admin;           /* enum dspk__admin */
};

/* Who may call a method (protocol.json's "admin": true unless _NO).  The
 * daemon refuses a non-admin EPERM: before looking at the arguments
 * (_FIRST), or once they are checked, so that a malformed call says so
 * whoever sends it (_AFTER_PARAMS; protocol.json's "admin_after_params"). */
enum dspk__admin {
  DSPK__ADMIN_NO,
  DSPK__ADMIN_FIRST,
  DSPK__ADMIN_AFTER_PARAMS,
};

/* ---- the methods: ids and parameter indices ---------------------------- */

enum dspk__method_id {
  DSPK__M_HELLO,
  DSPK__M_PING,
  DSPK__M_DEVICES,
  DSPK__M_STATUS,
  DSPK__M_BUFFER_CREATE,
  DSPK__M_BUFFER_WRITE,
  DSPK__M_BUFFER_READ,
  DSPK__M_BUFFER_FREE,
  DSPK__M_BUFFER_IMPORT,
  DSPK__M_BUFFER_SHARE,
  DSPK__M_TASK_RUN,
  DSPK__M_TASK_CANCEL,
  DSPK__M_DAEMON_RELOAD,
  DSPK__M_DAEMON_STOP,
  DSPK__M_CACHE_STATS,
  DSPK__M_CACHE_CLEAR,
  DSPK__M_METRICS,
  DSPK__M_TRACE,
  DSPK__M_JOB_REGISTER,
  DSPK__M_JOB_END,
  DSPK__M_COUNT
};

enum { DSPK__HELLO_VERSION, DSPK__HELLO_CLIENT, DSPK__HELLO_JOB };
enum { DSPK__PING_DATA };
enum { DSPK__DEVICES_ALL };
enum { DSPK__BCREATE_DEVICE, DSPK__BCREATE_SIZE };
enum { DSPK__BWRITE_BUFFER, DSPK__BWRITE_OFFSET, DSPK__BWRITE_DATA };
enum { DSPK__BREAD_BUFFER, DSPK__BREAD_OFFSET, DSPK__BREAD_SIZE };
enum { DSPK__BFREE_BUFFER };
enum { DSPK__BSHM_DEVICE, DSPK__BSHM_SIZE }; /* buffer.import, buffer.share */
enum { DSPK__RUN_OP, DSPK__RUN_DEVICE, DSPK__RUN_INPUTS, DSPK__RUN_OPTIONS, DSPK__RUN_OUTPUTS };
enum { DSPK__CANCEL_MSGID };
enum { DSPK__CCLEAR_KINDS };
enum { DSPK__TRACE_SECONDS };
enum { DSPK__JREG_JOB, DSPK__JREG_UID, DSPK__JREG_DEVICES };
enum { DSPK__JEND_JOB };

/* The fields of each method's result (docs/protocol.md), in the order the
 * daemon packs them: indices into dspk__methods[m].results and into the
 * dspk__pval arrays of dspk__result_encode/decode. */
enum { DSPK__R_HELLO_PROTOCOL, DSPK__R_HELLO_DAEMON, DSPK__R_HELLO_SERVER,
       DSPK__R_HELLO_CLIENT_ID, DSPK__R_HELLO_LIMITS };
enum { DSPK__R_PING_DATA };
enum { DSPK__R_DEVICES_DEVICES, DSPK__R_DEVICES_UNAVAILABLE };
enum { DSPK__R_STATUS_DAEMON, DSPK__R_STATUS_CLIENTS, DSPK__R_STATUS_OTHER_CLIENTS,
       DSPK__R_STATUS_JOBS, DSPK__R_STATUS_DEVICES };
/* buffer.create, buffer.import, buffer.share */
enum { DSPK__R_BUF_BUFFER, DSPK__R_BUF_DEVICE, DSPK__R_BUF_SIZE };
enum { DSPK__R_BWRITE_SIZE };
enum { DSPK__R_BREAD_DATA };
enum { DSPK__R_RUN_DEVICE, DSPK__R_RUN_OUTPUTS, DSPK__R_RUN_TIME_US };
enum { DSPK__R_CANCEL_CANCELED };
enum { DSPK__R_RELOAD_RELOADED };
enum { DSPK__R_STOP_STOPPING };
enum { DSPK__R_CSTATS_PATH, DSPK__R_CSTATS_IN_MEMORY, DSPK__R_CSTATS_MAX_BYTES,
       DSPK__R_CSTATS_FILE_BYTES, DSPK__R_CSTATS_KINDS };
enum { DSPK__R_CCLEAR_CLEARED };
enum { DSPK__R_TRACE_START_US, DSPK__R_TRACE_END_US, DSPK__R_TRACE_DROPPED,
       DSPK__R_TRACE_DEVICES, DSPK__R_TRACE_JOBS };
enum { DSPK__R_JREG_JOB, DSPK__R_JREG_UID, DSPK__R_JREG_DEVICES };
enum { DSPK__R_JEND_JOB, DSPK__R_JEND_ENDED, DSPK__R_JEND_CONNECTIONS, DSPK__R_JEND_INFLIGHT,
       DSPK__R_JEND_BUFFERS };

/* The fields of the nested maps of results (docs/protocol.md, "Results of
 * each method"), in the order the daemon packs them: indices into their
 * tables below and into the dspk__pval arrays of dspk__map_encode and
 * dspk__params_decode.  hello's limits and status' daemon.limits: */
enum { DSPK__LIM_MAX_MESSAGE, DSPK__LIM_MAX_DEPTH, DSPK__LIM_MAX_OBJECTS, DSPK__LIM_MAX_RANK,
       DSPK__LIM_MAX_ELEMENTS, DSPK__LIM_MAX_INFLIGHT, DSPK__LIM_MAX_UNSENT,
       DSPK__LIM_MAX_BUFFERS, DSPK__LIM_MAX_CLIENTS, DSPK__LIM_CPU_MEMORY_QUOTA,
       DSPK__LIM_COUNT };
/* devices: each of devices[] and of unavailable[]. */
enum { DSPK__DEV_ID, DSPK__DEV_BACKEND, DSPK__DEV_NAME, DSPK__DEV_TYPE, DSPK__DEV_ARCH,
       DSPK__DEV_DRIVER, DSPK__DEV_UUID, DSPK__DEV_MEMORY, DSPK__DEV_MAX_TENSOR_BYTES,
       DSPK__DEV_SOFTWARE, DSPK__DEV_OPS,
       DSPK__DEV_KERNEL_LANGS, DSPK__DEV_COUNT };
enum { DSPK__UNAV_BACKEND, DSPK__UNAV_REASON, DSPK__UNAV_COUNT };
/* status: daemon, each of clients[], other_clients, each of jobs[], each of
 * devices[], a device's running_op and stats. */
enum { DSPK__SD_VERSION, DSPK__SD_PID, DSPK__SD_UPTIME_S, DSPK__SD_SOCKET,
       DSPK__SD_CONNECTIONS, DSPK__SD_STOPPING, DSPK__SD_LIMITS, DSPK__SD_COUNT };
enum { DSPK__SC_ID, DSPK__SC_PID, DSPK__SC_UID, DSPK__SC_GID, DSPK__SC_NAME,
       DSPK__SC_INFLIGHT, DSPK__SC_BUFFERS, DSPK__SC_BUFFER_BYTES, DSPK__SC_UNSENT,
       DSPK__SC_REQUESTS, DSPK__SC_SELF, DSPK__SC_JOB, DSPK__SC_COUNT };
enum { DSPK__SO_CONNECTIONS, DSPK__SO_INFLIGHT, DSPK__SO_BUFFERS, DSPK__SO_COUNT };
enum { DSPK__SJ_JOB, DSPK__SJ_UID, DSPK__SJ_DEVICES, DSPK__SJ_CONNECTIONS, DSPK__SJ_INFLIGHT,
       DSPK__SJ_BUFFERS, DSPK__SJ_BUFFER_BYTES, DSPK__SJ_ENDED, DSPK__SJ_COUNT };
enum { DSPK__SV_ID, DSPK__SV_QUEUED, DSPK__SV_RUNNING, DSPK__SV_COMPLETED, DSPK__SV_FAILED,
       DSPK__SV_BUSY, DSPK__SV_CLIENTS, DSPK__SV_MEMORY, DSPK__SV_RUNNING_OP, DSPK__SV_STATS,
       DSPK__SV_COUNT };
enum { DSPK__RO_NAME, DSPK__RO_AGE_MS, DSPK__RO_CLIENT, DSPK__RO_CLOSED, DSPK__RO_COUNT };
enum { DSPK__DS_POOL_BYTES_IN_USE, DSPK__DS_POOL_BYTES_CACHED, DSPK__DS_POOL_HITS,
       DSPK__DS_POOL_MISSES, DSPK__DS_RETIRE_DEFERRED, DSPK__DS_RETIRE_RELEASED,
       DSPK__DS_RETIRE_BARRIER_FALLBACKS, DSPK__DS_RETIRE_LEAKED, DSPK__DS_RETIRE_IN_FLIGHT,
       DSPK__DS_RETIRE_MAX_IN_FLIGHT, DSPK__DS_KERNELS_COMPILED, DSPK__DS_KERNEL_CACHE_HITS,
       DSPK__DS_COUNT };
/* cache.stats: each kind of kinds. */
enum { DSPK__CK_ENTRIES, DSPK__CK_BYTES, DSPK__CK_STORED_HITS, DSPK__CK_HITS, DSPK__CK_MISSES,
       DSPK__CK_PUTS, DSPK__CK_EVICTIONS, DSPK__CK_PUT_ERRORS, DSPK__CK_COUNT };

/* trace: each of jobs[] (upload_end_us to tune_end_us: a task's phases
 * reached). */
enum { DSPK__TJ_DEVICE, DSPK__TJ_KIND, DSPK__TJ_NAME, DSPK__TJ_CLIENT, DSPK__TJ_JOB,
       DSPK__TJ_MSGID, DSPK__TJ_ERROR, DSPK__TJ_RUNNING, DSPK__TJ_QUEUED_US,
       DSPK__TJ_START_US, DSPK__TJ_END_US, DSPK__TJ_UPLOAD_END_US, DSPK__TJ_COMPUTE_END_US,
       DSPK__TJ_TUNE_START_US, DSPK__TJ_TUNE_END_US, DSPK__TJ_COUNT };
/* task.run: each of outputs[], a tensor: inline (data) or written to a
 * buffer (buffer, offset). */
enum { DSPK__OUT_DTYPE, DSPK__OUT_SHAPE, DSPK__OUT_DATA, DSPK__OUT_BUFFER, DSPK__OUT_OFFSET,
       DSPK__OUT_COUNT };
/* task.run's request: an entry of outputs (dspk__out_ref_f). */
enum { DSPK__OREF_BUFFER, DSPK__OREF_OFFSET, DSPK__OREF_COUNT };

/* Most fields one nested result map has (sizes a dspk__pval array). */
#define DSPK__MAX_FIELDS 16

extern const struct dspk__param dspk__limits_f[DSPK__LIM_COUNT];
extern const struct dspk__param dspk__device_f[DSPK__DEV_COUNT];
extern const struct dspk__param dspk__unavail_f[DSPK__UNAV_COUNT];
extern const struct dspk__param dspk__st_daemon_f[DSPK__SD_COUNT];
extern const struct dspk__param dspk__st_client_f[DSPK__SC_COUNT];
extern const struct dspk__param dspk__st_other_f[DSPK__SO_COUNT];
extern const struct dspk__param dspk__st_job_f[DSPK__SJ_COUNT];
extern const struct dspk__param dspk__st_device_f[DSPK__SV_COUNT];
extern const struct dspk__param dspk__running_op_f[DSPK__RO_COUNT];
extern const struct dspk__param dspk__devstats_f[DSPK__DS_COUNT];
extern const struct dspk__param dspk__cache_kind_f[DSPK__CK_COUNT];
extern const struct dspk__param dspk__trace_job_f[DSPK__TJ_COUNT];
extern const struct dspk__param dspk__out_tensor_f[DSPK__OUT_COUNT];
extern const struct dspk__param dspk__out_ref_f[DSPK__OREF_COUNT];

/* Most parameters one method or op has (sizes a dspk__pval array). */
#define DSPK__MAX_PARAMS 8

/* The longest value of a string parameter (its buffer needs one byte more). */
#define DSPK__CLIENT_NAME_MAX 63
#define DSPK__DEVICE_NAME_MAX 47

/* An op's options; its name is dspk__op_names[op]. */
struct dspk__op_desc {
  const struct dspk__param *options;
  int noptions;
};

extern const struct dspk__method dspk__methods[DSPK__M_COUNT];
extern const struct dspk__op_desc dspk__ops[DSPK_OP_COUNT];

/* The name lists (NULL-terminated, in enum order): op names, reduce fns,
 * map fns, kernel languages, cache kinds (in cache/'s kind order), dtypes. */
extern const char *const dspk__op_names[];
extern const char *const dspk__reduce_names[];
extern const char *const dspk__mapfn_names[];
extern const char *const dspk__kernel_langs[];
extern const char *const dspk__cache_kind_names[];
extern const char *const dspk__dtype_names[];

/* The method of that name, or NULL. */
const struct dspk__method *dspk__method_find(const char *name, size_t len);
/* Index of name in a NULL-terminated list, or -1. */
int dspk__choice_find(const char *const *list, const char *name, size_t len);
/* The op's wire name ("gemm"), or "?" outside the table. */
const char *dspk__op_name(dspk_op op);

/* Decodes map (the params map, or an options map; NULL or nil: empty)
 * against params[0..n): fills out[i] for every parameter, the default when
 * absent or nil (nil is a value of a DSPK__P_NIL row: set and nil).  A MAP
 * or ARRAY row with fields, keys or item is checked at every depth.  Keys
 * the table lacks are ignored.  0, or a negative code with
 * "<prefix><name>: ..." in msg. */
int dspk__params_decode(const struct dspk__param *params, int n,
                        const msgpack_object *map, const char *prefix,
                        struct dspk__pval *out, char *msg, size_t msglen);
/* Stores the values of the rows with .at into target (a union
 * dspk__op_options). */
void dspk__params_store(const struct dspk__param *params, int n,
                        const struct dspk__pval *vals, void *target);
/* Copies a STR value (NUL-terminated) into buf of at least max+1 bytes. */
void dspk__pval_str(const struct dspk__pval *v, char *buf, size_t size);

/* Packs a map of the parameters whose value is set, in table order. */
void dspk__params_encode(struct dspk__wbuf *w, const struct dspk__param *params,
                         int n, const struct dspk__pval *vals);
/* The one encoder of nested result maps (a device of devices, status'
 * daemon, ...): a map of the fields[0..n) whose value is set, in table
 * order, each packed as dspk__value_encode packs it. */
void dspk__map_encode(struct dspk__wbuf *w, const struct dspk__param *fields, int n,
                      const struct dspk__pval *vals);
/* Packs v as p's type says: nil when v->nil; ARRAY and MAP through
 * v.pack; ENUM and ENUMS as the names of p->choices; BIN by reference. */
void dspk__value_encode(struct dspk__wbuf *w, const struct dspk__param *p,
                        const struct dspk__pval *v);

/*
 * Results.  The one encoder of every result map (the daemon): packs a map of
 * m's result fields whose value is set (vals indexed by the method's result
 * enum), in table order, a field packed as its row's type says (ARRAY and
 * MAP through v.pack; BIN by reference, release called once written).
 * dspk__result_head and dspk__result_fields do the same in two steps for a
 * result whose last field is known only later (task.run's time_us): the
 * head counts every set field, fields packs those of [from, to).
 */
void dspk__result_encode(struct dspk__wbuf *w, const struct dspk__method *m,
                         const struct dspk__pval *vals);
void dspk__result_head(struct dspk__wbuf *w, const struct dspk__method *m,
                       const struct dspk__pval *vals);
void dspk__result_fields(struct dspk__wbuf *w, const struct dspk__method *m,
                         const struct dspk__pval *vals, int from, int to);
/* The one decoder of result maps (libdspkclient): checks map against m's
 * result rows (a field the table marks always there is required, each of
 * its row's type), nested maps and arrays the table describes included
 * (their fields, items and values, at any depth), and fills out[] indexed
 * by the result enum.  A nested map it checked is read with
 * dspk__params_decode against its table (e.g. dspk__device_f).  0, or
 * DSPK_EPROTO with "result.<path>: ..." in msg
 * ("result.devices[2].memory: expected a non-negative integer"). */
int dspk__result_decode(const struct dspk__method *m, const msgpack_object *map,
                        struct dspk__pval *out, char *msg, size_t msglen);

/* Writes the whole description as one JSON document.  0 or -1 (I/O). */
int dspk__schema_json(FILE *f);

#endif /* DSPK_PROTO_SCHEMA_H */
