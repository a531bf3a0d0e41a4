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
                      whose elements the handler decodes (e.g. tensors) */
  DSPK__T_MAP,     /* v.o: a map, decoded by the handler against another
                      table (task.run's options: dspk__op_desc) */
};

#define DSPK__P_REQUIRED 1u /* absent or nil is an error */

struct dspk__pval {
  bool set; /* present and not nil (else the value is the default) */
  union {
    bool b;
    uint64_t u;
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
};

/* A set value of each type, for the encoders. */
static inline struct dspk__pval dspk__pv_uint(uint64_t u) {
  struct dspk__pval p = {.set = true};
  p.v.u = u;
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
  size_t at;                     /* op options: 1 + the offset in
                                    union dspk__op_options where
                                    dspk__params_store puts the value; 0:
                                    not stored */
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
  bool admin;                    /* only admins may call it */
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
 * map fns, kernel languages, cache kinds (in cache/'s kind order). */
extern const char *const dspk__op_names[];
extern const char *const dspk__reduce_names[];
extern const char *const dspk__mapfn_names[];
extern const char *const dspk__kernel_langs[];
extern const char *const dspk__cache_kind_names[];

/* The method of that name, or NULL. */
const struct dspk__method *dspk__method_find(const char *name, size_t len);
/* Index of name in a NULL-terminated list, or -1. */
int dspk__choice_find(const char *const *list, const char *name, size_t len);
/* The op's wire name ("gemm"), or "?" outside the table. */
const char *dspk__op_name(dspk_op op);

/* Decodes map (the params map, or an options map; NULL or nil: empty)
 * against params[0..n): fills out[i] for every parameter, the default when
 * absent or nil.  Keys the table lacks are ignored.  0, or a negative code
 * with "<prefix><name>: ..." in msg. */
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
 * its row's type) and fills out[] indexed by the result enum.  0, or
 * DSPK_EPROTO with "result.<name>: ..." in msg. */
int dspk__result_decode(const struct dspk__method *m, const msgpack_object *map,
                        struct dspk__pval *out, char *msg, size_t msglen);

/* Writes the whole description as one JSON document.  0 or -1 (I/O). */
int dspk__schema_json(FILE *f);

#endif /* DSPK_PROTO_SCHEMA_H */
