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
};

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
  const char *const *results;    /* the result map's keys; NULL-terminated;
                                    NULL when the result is not a map */
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

/* Writes the whole description as one JSON document.  0 or -1 (I/O). */
int dspk__schema_json(FILE *f);

#endif /* DSPK_PROTO_SCHEMA_H */
