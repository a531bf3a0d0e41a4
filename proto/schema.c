/*
 * The protocol's description (proto/schema.h): the table of methods, ops
 * and their parameters, the generic decoder and encoder over it, and its
 * JSON export.  docs/protocol.md documents every row
 * (tests/proto/schema_docs.py checks it).
 */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "proto/schema.h"
#include "proto/units.h"
#include "proto/utf8.h"

/* ---- name lists, built once from include/dspk/types.h ------------------ */

const char *const dspk__op_names[] = {
#define XX(e, name) [DSPK_OP_##e] = name,
    DSPK_OP_MAP(XX)
#undef XX
    [DSPK_OP_COUNT] = NULL};

/* The keys a device's ops map can have: every op but kernel (a device's
 * raw kernels are its kernel_langs), NULL-terminated. */
_Static_assert(DSPK_OP_KERNEL == DSPK_OP_COUNT - 1, "kernel is the last op");
static const char *const dev_op_keys[] = {
#define XX(e, name) [DSPK_OP_##e] = DSPK_OP_##e == DSPK_OP_KERNEL ? NULL : name,
    DSPK_OP_MAP(XX)
#undef XX
};

const char *const dspk__reduce_names[] = {
#define XX(e, name) [DSPK_REDUCE_##e] = name,
    DSPK_REDUCE_MAP(XX)
#undef XX
    [DSPK_REDUCE_COUNT] = NULL};

const char *const dspk__mapfn_names[] = {
#define XX(e, name, nin) [DSPK_MAP_##e] = name,
    DSPK_MAPFN_MAP(XX)
#undef XX
    [DSPK_MAPFN_COUNT] = NULL};

const char *const dspk__kernel_langs[] = {"cuda", "glsl", "spirv", "hip", NULL};

const char *const dspk__cache_kind_names[] = {"kernels", "autotune", "blobs", NULL};

const char *const dspk__dtype_names[] = {
#define XX(e, name, size, cplx) [DSPK_##e] = name,
    DSPK_DTYPE_MAP(XX)
#undef XX
    [DSPK_DTYPE_COUNT] = NULL};

/* ---- the methods -------------------------------------------------------- */

#define REQ DSPK__P_REQUIRED
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define STRDEF(lit) {.v.s = {lit, sizeof(lit) - 1}}
/* A result field, always there (RES) or only in some answers (RES_OPT). */
#define RES(name, type) {name, type, REQ, .max = UINT64_MAX}
#define RES_OPT(name, type) {name, type, .max = UINT64_MAX}
/* Always there, nil or of its type. */
#define RES_NIL(name, type) {name, type, REQ | DSPK__P_NIL, .max = UINT64_MAX}
/* A map of the fields of table f. */
#define RES_MAP(name, f) {name, DSPK__T_MAP, REQ, .max = UINT64_MAX, .fields = f, .nfields = N(f)}
/* An array whose elements are each item (a row of ITEM or ITEM_MAP). */
#define RES_ARR(name, it) {name, DSPK__T_ARRAY, REQ, .max = UINT64_MAX, .item = &(it)}
#define ITEM(type) {"", type, REQ, .max = UINT64_MAX}
#define ITEM_MAP(f) RES_MAP("", f)

/* ---- the nested maps of results (docs/protocol.md, "Results of each
 * method") ---------------------------------------------------------------- */

const struct dspk__param dspk__limits_f[DSPK__LIM_COUNT] = {
    [DSPK__LIM_MAX_MESSAGE] = RES("max_message", DSPK__T_UINT),
    [DSPK__LIM_MAX_DEPTH] = RES("max_depth", DSPK__T_UINT),
    [DSPK__LIM_MAX_OBJECTS] = RES("max_objects", DSPK__T_UINT),
    [DSPK__LIM_MAX_RANK] = RES("max_rank", DSPK__T_UINT),
    [DSPK__LIM_MAX_ELEMENTS] = RES("max_elements", DSPK__T_UINT),
    [DSPK__LIM_MAX_INFLIGHT] = RES("max_inflight", DSPK__T_UINT),
    [DSPK__LIM_MAX_UNSENT] = RES("max_unsent", DSPK__T_UINT),
    [DSPK__LIM_MAX_BUFFERS] = RES("max_buffers", DSPK__T_UINT),
    [DSPK__LIM_MAX_CLIENTS] = RES("max_clients", DSPK__T_UINT),
    [DSPK__LIM_CPU_MEMORY_QUOTA] = RES("cpu_memory_quota", DSPK__T_UINT),
};

static const struct dspk__param str_item = ITEM(DSPK__T_STR);
/* A device's ops: for each op it runs, the dtypes of its first input. */
static const struct dspk__param dtypes_item = {"", DSPK__T_ENUMS, REQ, .choices = dspk__dtype_names,
                                               .noun = "dtype"};

const struct dspk__param dspk__device_f[DSPK__DEV_COUNT] = {
    [DSPK__DEV_ID] = RES("id", DSPK__T_STR),
    [DSPK__DEV_BACKEND] = RES("backend", DSPK__T_STR),
    [DSPK__DEV_NAME] = RES("name", DSPK__T_STR),
    [DSPK__DEV_TYPE] = RES("type", DSPK__T_STR),
    [DSPK__DEV_ARCH] = RES("arch", DSPK__T_STR),
    [DSPK__DEV_DRIVER] = RES("driver", DSPK__T_STR),
    [DSPK__DEV_UUID] = RES("uuid", DSPK__T_STR),
    [DSPK__DEV_MEMORY] = RES("memory", DSPK__T_UINT),
    [DSPK__DEV_MAX_TENSOR_BYTES] = RES("max_tensor_bytes", DSPK__T_UINT),
    [DSPK__DEV_SOFTWARE] = RES("software", DSPK__T_BOOL),
    [DSPK__DEV_OPS] = {"ops", DSPK__T_MAP, REQ, .max = UINT64_MAX, .keys = dev_op_keys,
                       .item = &dtypes_item},
    [DSPK__DEV_KERNEL_LANGS] = {"kernel_langs", DSPK__T_ENUMS, REQ,
                                .choices = dspk__kernel_langs, .noun = "kernel language"},
};
const struct dspk__param dspk__unavail_f[DSPK__UNAV_COUNT] = {
    [DSPK__UNAV_BACKEND] = RES("backend", DSPK__T_STR),
    [DSPK__UNAV_REASON] = RES("reason", DSPK__T_STR),
};
static const struct dspk__param device_item = ITEM_MAP(dspk__device_f);
static const struct dspk__param unavail_item = ITEM_MAP(dspk__unavail_f);

const struct dspk__param dspk__st_daemon_f[DSPK__SD_COUNT] = {
    [DSPK__SD_VERSION] = RES("version", DSPK__T_STR),
    [DSPK__SD_PID] = RES("pid", DSPK__T_INT),
    [DSPK__SD_UPTIME_S] = RES("uptime_s", DSPK__T_UINT),
    [DSPK__SD_SOCKET] = RES("socket", DSPK__T_STR),
    [DSPK__SD_CONNECTIONS] = RES("connections", DSPK__T_UINT),
    [DSPK__SD_STOPPING] = RES("stopping", DSPK__T_BOOL),
    [DSPK__SD_LIMITS] = RES_MAP("limits", dspk__limits_f),
};
const struct dspk__param dspk__st_client_f[DSPK__SC_COUNT] = {
    [DSPK__SC_ID] = RES("id", DSPK__T_UINT),
    [DSPK__SC_PID] = RES("pid", DSPK__T_INT),
    [DSPK__SC_UID] = RES("uid", DSPK__T_INT),
    [DSPK__SC_GID] = RES("gid", DSPK__T_INT),
    [DSPK__SC_NAME] = RES("name", DSPK__T_STR),
    [DSPK__SC_INFLIGHT] = RES("inflight", DSPK__T_UINT),
    [DSPK__SC_BUFFERS] = RES("buffers", DSPK__T_UINT),
    [DSPK__SC_BUFFER_BYTES] = RES("buffer_bytes", DSPK__T_UINT),
    [DSPK__SC_UNSENT] = RES("unsent", DSPK__T_UINT),
    [DSPK__SC_REQUESTS] = RES("requests", DSPK__T_UINT),
    [DSPK__SC_SELF] = RES("self", DSPK__T_BOOL),
    [DSPK__SC_JOB] = RES_NIL("job", DSPK__T_UINT),
};
const struct dspk__param dspk__st_other_f[DSPK__SO_COUNT] = {
    [DSPK__SO_CONNECTIONS] = RES("connections", DSPK__T_UINT),
    [DSPK__SO_INFLIGHT] = RES("inflight", DSPK__T_UINT),
    [DSPK__SO_BUFFERS] = RES("buffers", DSPK__T_UINT),
};
const struct dspk__param dspk__st_job_f[DSPK__SJ_COUNT] = {
    [DSPK__SJ_JOB] = RES("job", DSPK__T_UINT),
    [DSPK__SJ_UID] = RES("uid", DSPK__T_INT),
    [DSPK__SJ_DEVICES] = RES_ARR("devices", str_item),
    [DSPK__SJ_CONNECTIONS] = RES("connections", DSPK__T_UINT),
    [DSPK__SJ_INFLIGHT] = RES("inflight", DSPK__T_UINT),
    [DSPK__SJ_BUFFERS] = RES("buffers", DSPK__T_UINT),
    [DSPK__SJ_BUFFER_BYTES] = RES("buffer_bytes", DSPK__T_UINT),
    [DSPK__SJ_ENDED] = RES("ended", DSPK__T_BOOL),
};
/* client: only to whom status' clients shows that connection. */
const struct dspk__param dspk__running_op_f[DSPK__RO_COUNT] = {
    [DSPK__RO_NAME] = RES("name", DSPK__T_STR),
    [DSPK__RO_AGE_MS] = RES("age_ms", DSPK__T_UINT),
    [DSPK__RO_CLIENT] = RES_OPT("client", DSPK__T_UINT),
    /* with client: its connection has closed, the task runs to its end. */
    [DSPK__RO_CLOSED] = RES_OPT("closed", DSPK__T_BOOL),
};
const struct dspk__param dspk__devstats_f[DSPK__DS_COUNT] = {
    [DSPK__DS_POOL_BYTES_IN_USE] = RES("pool_bytes_in_use", DSPK__T_UINT),
    [DSPK__DS_POOL_BYTES_CACHED] = RES("pool_bytes_cached", DSPK__T_UINT),
    [DSPK__DS_POOL_HITS] = RES("pool_hits", DSPK__T_UINT),
    [DSPK__DS_POOL_MISSES] = RES("pool_misses", DSPK__T_UINT),
    [DSPK__DS_RETIRE_DEFERRED] = RES("retire_deferred", DSPK__T_UINT),
    [DSPK__DS_RETIRE_RELEASED] = RES("retire_released", DSPK__T_UINT),
    [DSPK__DS_RETIRE_BARRIER_FALLBACKS] = RES("retire_barrier_fallbacks", DSPK__T_UINT),
    [DSPK__DS_RETIRE_LEAKED] = RES("retire_leaked", DSPK__T_UINT),
    [DSPK__DS_RETIRE_IN_FLIGHT] = RES("retire_in_flight", DSPK__T_UINT),
    [DSPK__DS_RETIRE_MAX_IN_FLIGHT] = RES("retire_max_in_flight", DSPK__T_UINT),
    [DSPK__DS_KERNELS_COMPILED] = RES("kernels_compiled", DSPK__T_UINT),
    [DSPK__DS_KERNEL_CACHE_HITS] = RES("kernel_cache_hits", DSPK__T_UINT),
};
const struct dspk__param dspk__st_device_f[DSPK__SV_COUNT] = {
    [DSPK__SV_ID] = RES("id", DSPK__T_STR),
    [DSPK__SV_QUEUED] = RES("queued", DSPK__T_UINT),
    [DSPK__SV_RUNNING] = RES("running", DSPK__T_UINT),
    [DSPK__SV_COMPLETED] = RES("completed", DSPK__T_UINT),
    [DSPK__SV_FAILED] = RES("failed", DSPK__T_UINT),
    [DSPK__SV_BUSY] = RES("busy", DSPK__T_NUM),
    [DSPK__SV_CLIENTS] = RES("clients", DSPK__T_UINT),
    [DSPK__SV_MEMORY] = RES("memory", DSPK__T_UINT),
    [DSPK__SV_RUNNING_OP] = {"running_op", DSPK__T_MAP, REQ | DSPK__P_NIL, .max = UINT64_MAX,
                             .fields = dspk__running_op_f, .nfields = DSPK__RO_COUNT},
    [DSPK__SV_STATS] = RES_MAP("stats", dspk__devstats_f),
};
static const struct dspk__param st_client_item = ITEM_MAP(dspk__st_client_f);
static const struct dspk__param st_job_item = ITEM_MAP(dspk__st_job_f);
static const struct dspk__param st_device_item = ITEM_MAP(dspk__st_device_f);

const struct dspk__param dspk__cache_kind_f[DSPK__CK_COUNT] = {
    [DSPK__CK_ENTRIES] = RES("entries", DSPK__T_UINT),
    [DSPK__CK_BYTES] = RES("bytes", DSPK__T_UINT),
    [DSPK__CK_STORED_HITS] = RES("stored_hits", DSPK__T_UINT),
    [DSPK__CK_HITS] = RES("hits", DSPK__T_UINT),
    [DSPK__CK_MISSES] = RES("misses", DSPK__T_UINT),
    [DSPK__CK_PUTS] = RES("puts", DSPK__T_UINT),
    [DSPK__CK_EVICTIONS] = RES("evictions", DSPK__T_UINT),
    [DSPK__CK_PUT_ERRORS] = RES("put_errors", DSPK__T_UINT),
};
static const struct dspk__param cache_kind_item = ITEM_MAP(dspk__cache_kind_f);
static const struct dspk__param cache_kind_name_item = {"", DSPK__T_ENUM, REQ,
                                                        .choices = dspk__cache_kind_names,
                                                        .noun = "kind"};

/* trace: a job record.  error: nil, or the error's name. */
const struct dspk__param dspk__trace_job_f[DSPK__TJ_COUNT] = {
    [DSPK__TJ_DEVICE] = RES("device", DSPK__T_STR),
    [DSPK__TJ_KIND] = RES("kind", DSPK__T_STR),
    [DSPK__TJ_NAME] = RES("name", DSPK__T_STR),
    [DSPK__TJ_CLIENT] = RES("client", DSPK__T_UINT),
    [DSPK__TJ_JOB] = RES_NIL("job", DSPK__T_UINT),
    [DSPK__TJ_MSGID] = RES("msgid", DSPK__T_UINT),
    [DSPK__TJ_ERROR] = RES_NIL("error", DSPK__T_STR),
    [DSPK__TJ_RUNNING] = RES("running", DSPK__T_BOOL),
    [DSPK__TJ_QUEUED_US] = RES("queued_us", DSPK__T_UINT),
    [DSPK__TJ_START_US] = RES("start_us", DSPK__T_UINT),
    [DSPK__TJ_END_US] = RES("end_us", DSPK__T_UINT),
    [DSPK__TJ_UPLOAD_END_US] = RES_OPT("upload_end_us", DSPK__T_UINT),
    [DSPK__TJ_COMPUTE_END_US] = RES_OPT("compute_end_us", DSPK__T_UINT),
    [DSPK__TJ_TUNE_START_US] = RES_OPT("tune_start_us", DSPK__T_UINT),
    [DSPK__TJ_TUNE_END_US] = RES_OPT("tune_end_us", DSPK__T_UINT),
};
static const struct dspk__param trace_job_item = ITEM_MAP(dspk__trace_job_f);

/* task.run: a result tensor, inline {dtype, shape, data} or
 * {dtype, shape, buffer, offset} (the tensor checks, e.g. data's size, are
 * dspk__tensor_decode's). */
static const struct dspk__param uint_item = ITEM(DSPK__T_UINT);
const struct dspk__param dspk__out_tensor_f[DSPK__OUT_COUNT] = {
    [DSPK__OUT_DTYPE] = {"dtype", DSPK__T_ENUM, REQ, .choices = dspk__dtype_names,
                         .noun = "dtype"},
    [DSPK__OUT_SHAPE] = RES_ARR("shape", uint_item),
    [DSPK__OUT_DATA] = RES_OPT("data", DSPK__T_BIN),
    [DSPK__OUT_BUFFER] = RES_OPT("buffer", DSPK__T_UINT),
    [DSPK__OUT_OFFSET] = RES_OPT("offset", DSPK__T_UINT),
};
static const struct dspk__param out_tensor_item = ITEM_MAP(dspk__out_tensor_f);

/* task.run's request: an entry of outputs, {buffer, offset?: 0} for a result
 * written into that buffer, or nil for one that comes back inline. */
const struct dspk__param dspk__out_ref_f[DSPK__OREF_COUNT] = {
    [DSPK__OREF_BUFFER] = {"buffer", DSPK__T_UINT, REQ, .max = UINT64_MAX,
                           .expect = DSPK__EXPECT_BUFFER},
    [DSPK__OREF_OFFSET] = {"offset", DSPK__T_UINT, .max = UINT64_MAX,
                           .expect = DSPK__EXPECT_OFFSET, .def_doc = "0"},
};
static const struct dspk__param out_ref_item = {
    "", DSPK__T_MAP, REQ | DSPK__P_NIL, .max = UINT64_MAX, .fields = dspk__out_ref_f,
    .nfields = N(dspk__out_ref_f), .expect = "{buffer, offset} or nil"};

static const struct dspk__param hello_p[] = {
    [DSPK__HELLO_VERSION] = {"version", DSPK__T_UINT, .max = UINT64_MAX, .def = {.v.u = 1},
                             .def_doc = "1"},
    [DSPK__HELLO_CLIENT] = {"client", DSPK__T_STR, .max = DSPK__CLIENT_NAME_MAX},
    /* A Slurm job id is positive, as job.register's (JOB_P): 0 is refused,
     * never read as "no job named" (leave the key out for that). */
    [DSPK__HELLO_JOB] = {"job", DSPK__T_UINT, .min = 1, .max = UINT64_MAX,
                         .expect = "the Slurm job id (a positive integer)"},
};
static const struct dspk__param hello_r[] = {
    [DSPK__R_HELLO_PROTOCOL] = RES("protocol", DSPK__T_UINT),
    [DSPK__R_HELLO_DAEMON] = RES("daemon", DSPK__T_STR),
    [DSPK__R_HELLO_SERVER] = RES("server", DSPK__T_STR),
    [DSPK__R_HELLO_CLIENT_ID] = RES("client_id", DSPK__T_UINT),
    [DSPK__R_HELLO_LIMITS] = RES_MAP("limits", dspk__limits_f),
};

static const struct dspk__param ping_p[] = {
    [DSPK__PING_DATA] = {"data", DSPK__T_BIN, .def = STRDEF(""), .def_doc = "empty"},
};
static const struct dspk__param ping_r[] = {
    [DSPK__R_PING_DATA] = RES("data", DSPK__T_BIN),
};

static const struct dspk__param devices_p[] = {
    [DSPK__DEVICES_ALL] = {"all", DSPK__T_BOOL, .def_doc = "false"},
};
static const struct dspk__param devices_r[] = {
    [DSPK__R_DEVICES_DEVICES] = RES_ARR("devices", device_item),
    [DSPK__R_DEVICES_UNAVAILABLE] = RES_ARR("unavailable", unavail_item),
};

static const struct dspk__param status_r[] = {
    [DSPK__R_STATUS_DAEMON] = RES_MAP("daemon", dspk__st_daemon_f),
    [DSPK__R_STATUS_CLIENTS] = RES_ARR("clients", st_client_item),
    [DSPK__R_STATUS_OTHER_CLIENTS] = RES_MAP("other_clients", dspk__st_other_f),
    [DSPK__R_STATUS_JOBS] = RES_ARR("jobs", st_job_item),
    [DSPK__R_STATUS_DEVICES] = RES_ARR("devices", st_device_item),
};

/* "device?: any": an id from devices, or "any" (the handler resolves it). */
#define DEVICE_P {"device", DSPK__T_STR, .max = DSPK__DEVICE_NAME_MAX, .def = STRDEF("any"), \
                  .def_doc = "\"any\""}
#define BUFFER_P {"buffer", DSPK__T_UINT, REQ, .max = UINT64_MAX, .expect = DSPK__EXPECT_BUFFER}
#define OFFSET_P {"offset", DSPK__T_UINT, .max = UINT64_MAX, .expect = DSPK__EXPECT_OFFSET, \
                  .def_doc = "0"}

static const struct dspk__param bcreate_p[] = {
    [DSPK__BCREATE_DEVICE] = DEVICE_P,
    [DSPK__BCREATE_SIZE] = {"size", DSPK__T_UINT, REQ, .max = UINT64_MAX,
                            .expect = DSPK__EXPECT_BYTES},
};
static const struct dspk__param bcreate_r[] = {
    [DSPK__R_BUF_BUFFER] = RES("buffer", DSPK__T_UINT),
    [DSPK__R_BUF_DEVICE] = RES("device", DSPK__T_STR),
    [DSPK__R_BUF_SIZE] = RES("size", DSPK__T_UINT),
};

static const struct dspk__param bwrite_p[] = {
    [DSPK__BWRITE_BUFFER] = BUFFER_P,
    [DSPK__BWRITE_OFFSET] = OFFSET_P,
    [DSPK__BWRITE_DATA] = {"data", DSPK__T_BIN, REQ},
};
static const struct dspk__param bwrite_r[] = {
    [DSPK__R_BWRITE_SIZE] = RES("size", DSPK__T_UINT),
};

static const struct dspk__param bread_p[] = {
    [DSPK__BREAD_BUFFER] = BUFFER_P,
    [DSPK__BREAD_OFFSET] = OFFSET_P,
    [DSPK__BREAD_SIZE] = {"size", DSPK__T_UINT, .max = UINT64_MAX,
                          .expect = DSPK__EXPECT_BYTES, .def_doc = "rest of the buffer"},
};
static const struct dspk__param bread_r[] = {
    [DSPK__R_BREAD_DATA] = RES("data", DSPK__T_BIN),
};

static const struct dspk__param bfree_p[] = {
    [DSPK__BFREE_BUFFER] = BUFFER_P,
};
/* A map without fields (nresults 0; the row only gives results non-NULL). */
static const struct dspk__param empty_r[] = {{.name = NULL}};

/* buffer.import and buffer.share: a shared buffer lives on cpu:0 unless
 * asked otherwise. */
static const struct dspk__param bshm_p[] = {
    [DSPK__BSHM_DEVICE] = {"device", DSPK__T_STR, .max = DSPK__DEVICE_NAME_MAX,
                           .def = STRDEF("cpu:0"), .def_doc = "\"cpu:0\""},
    [DSPK__BSHM_SIZE] = {"size", DSPK__T_UINT, REQ, .max = UINT64_MAX,
                         .expect = DSPK__EXPECT_BYTES},
};

static const struct dspk__param run_p[] = {
    [DSPK__RUN_OP] = {"op", DSPK__T_ENUM, REQ, .choices = dspk__op_names, .noun = "op"},
    [DSPK__RUN_DEVICE] = DEVICE_P,
    [DSPK__RUN_INPUTS] = {"inputs", DSPK__T_ARRAY, REQ, .min = 1, .max = 4,
                          .expect = "a non-empty array of at most 4 tensors"},
    [DSPK__RUN_OPTIONS] = {"options", DSPK__T_MAP},
    /* Every op has one result (a kernel none of its own: it returns its
     * inputs, and refuses outputs), so one entry at most: the count is
     * refused here with the params, one wording for any count too many
     * (DSPK__OP_MAX_OUT in backends/op.h, asserted in daemon/methods.c). */
    [DSPK__RUN_OUTPUTS] = {"outputs", DSPK__T_ARRAY, .max = 1, .item = &out_ref_item,
                           .expect = "an array of at most one {buffer, offset} or nil"},
};
static const struct dspk__param run_r[] = {
    [DSPK__R_RUN_DEVICE] = RES("device", DSPK__T_STR),
    [DSPK__R_RUN_OUTPUTS] = RES_ARR("outputs", out_tensor_item),
    [DSPK__R_RUN_TIME_US] = RES("time_us", DSPK__T_UINT),
};

static const struct dspk__param cancel_p[] = {
    [DSPK__CANCEL_MSGID] = {"msgid", DSPK__T_UINT, REQ, .max = UINT32_MAX,
                            .expect = "the uint32 msgid of a request"},
};
static const struct dspk__param cancel_r[] = {
    [DSPK__R_CANCEL_CANCELED] = RES("canceled", DSPK__T_BOOL),
};

static const struct dspk__param reload_r[] = {
    [DSPK__R_RELOAD_RELOADED] = RES("reloaded", DSPK__T_BOOL),
};
static const struct dspk__param stop_r[] = {
    [DSPK__R_STOP_STOPPING] = RES("stopping", DSPK__T_BOOL),
};

static const struct dspk__param cstats_r[] = {
    [DSPK__R_CSTATS_PATH] = RES("path", DSPK__T_STR),
    [DSPK__R_CSTATS_IN_MEMORY] = RES("in_memory", DSPK__T_BOOL),
    [DSPK__R_CSTATS_MAX_BYTES] = RES("max_bytes", DSPK__T_UINT),
    [DSPK__R_CSTATS_FILE_BYTES] = RES("file_bytes", DSPK__T_UINT),
    [DSPK__R_CSTATS_KINDS] = {"kinds", DSPK__T_MAP, REQ, .max = UINT64_MAX,
                              .keys = dspk__cache_kind_names, .item = &cache_kind_item},
};
static const struct dspk__param cclear_p[] = {
    [DSPK__CCLEAR_KINDS] = {"kinds", DSPK__T_ENUMS, .choices = dspk__cache_kind_names,
                            .noun = "kind", .def_doc = "every kind"},
};
static const struct dspk__param cclear_r[] = {
    [DSPK__R_CCLEAR_CLEARED] = RES_ARR("cleared", cache_kind_name_item),
};

static const struct dspk__param trace_p[] = {
    [DSPK__TRACE_SECONDS] = {"seconds", DSPK__T_NUM, REQ, .values_doc = "(0, 600]",
                             .expect = DSPK__EXPECT_TRACE_SECONDS},
};
static const struct dspk__param trace_r[] = {
    [DSPK__R_TRACE_START_US] = RES("start_us", DSPK__T_UINT),
    [DSPK__R_TRACE_END_US] = RES("end_us", DSPK__T_UINT),
    [DSPK__R_TRACE_DROPPED] = RES("dropped", DSPK__T_UINT),
    [DSPK__R_TRACE_DEVICES] = RES_ARR("devices", str_item),
    [DSPK__R_TRACE_JOBS] = RES_ARR("jobs", trace_job_item),
};

/* Slurm jobs (daemon/jobs.c). */
#define JOB_P {"job", DSPK__T_UINT, REQ, .min = 1, .max = UINT64_MAX,                \
               .expect = "the Slurm job id (a positive integer)"}
static const struct dspk__param uuid_item = {"", DSPK__T_STR, REQ, .max = UINT64_MAX,
                                             .expect = DSPK__EXPECT_UUID};
static const struct dspk__param jreg_p[] = {
    [DSPK__JREG_JOB] = JOB_P,
    [DSPK__JREG_UID] = {"uid", DSPK__T_UINT, REQ, .max = UINT32_MAX - 1,
                        .expect = "the uid the job runs as"},
    [DSPK__JREG_DEVICES] = {"devices", DSPK__T_ARRAY, .max = DSPK__JOB_MAX_UUIDS,
                            .range_err = DSPK_ELIMIT, .item = &uuid_item,
                            .expect = "an array of device UUIDs", .def_doc = "none"},
};
static const struct dspk__param jreg_r[] = {
    [DSPK__R_JREG_JOB] = RES("job", DSPK__T_UINT),
    [DSPK__R_JREG_UID] = RES("uid", DSPK__T_UINT),
    [DSPK__R_JREG_DEVICES] = RES_ARR("devices", str_item),
};
static const struct dspk__param jend_p[] = {
    [DSPK__JEND_JOB] = JOB_P,
};
/* connections, inflight, buffers: only when the job was registered. */
static const struct dspk__param jend_r[] = {
    [DSPK__R_JEND_JOB] = RES("job", DSPK__T_UINT),
    [DSPK__R_JEND_ENDED] = RES("ended", DSPK__T_BOOL),
    [DSPK__R_JEND_CONNECTIONS] = RES_OPT("connections", DSPK__T_UINT),
    [DSPK__R_JEND_INFLIGHT] = RES_OPT("inflight", DSPK__T_UINT),
    [DSPK__R_JEND_BUFFERS] = RES_OPT("buffers", DSPK__T_UINT),
};

#define M(id, name, p, r, adm) [id] = {name, p, N(p), r, N(r), adm}
#define M0(id, name, r, adm) [id] = {name, NULL, 0, r, N(r), adm}

const struct dspk__method dspk__methods[DSPK__M_COUNT] = {
    M(DSPK__M_HELLO, "hello", hello_p, hello_r, DSPK__ADMIN_NO),
    M(DSPK__M_PING, "ping", ping_p, ping_r, DSPK__ADMIN_NO),
    M(DSPK__M_DEVICES, "devices", devices_p, devices_r, DSPK__ADMIN_NO),
    M0(DSPK__M_STATUS, "status", status_r, DSPK__ADMIN_NO),
    M(DSPK__M_BUFFER_CREATE, "buffer.create", bcreate_p, bcreate_r, DSPK__ADMIN_NO),
    M(DSPK__M_BUFFER_WRITE, "buffer.write", bwrite_p, bwrite_r, DSPK__ADMIN_NO),
    M(DSPK__M_BUFFER_READ, "buffer.read", bread_p, bread_r, DSPK__ADMIN_NO),
    [DSPK__M_BUFFER_FREE] = {"buffer.free", bfree_p, N(bfree_p), empty_r, 0, DSPK__ADMIN_NO},
    M(DSPK__M_BUFFER_IMPORT, "buffer.import", bshm_p, bcreate_r, DSPK__ADMIN_NO),
    M(DSPK__M_BUFFER_SHARE, "buffer.share", bshm_p, bcreate_r, DSPK__ADMIN_NO),
    M(DSPK__M_TASK_RUN, "task.run", run_p, run_r, DSPK__ADMIN_NO),
    M(DSPK__M_TASK_CANCEL, "task.cancel", cancel_p, cancel_r, DSPK__ADMIN_NO),
    M0(DSPK__M_DAEMON_RELOAD, "daemon.reload", reload_r, DSPK__ADMIN_FIRST),
    M0(DSPK__M_DAEMON_STOP, "daemon.stop", stop_r, DSPK__ADMIN_FIRST),
    M0(DSPK__M_CACHE_STATS, "cache.stats", cstats_r, DSPK__ADMIN_NO),
    M(DSPK__M_CACHE_CLEAR, "cache.clear", cclear_p, cclear_r, DSPK__ADMIN_AFTER_PARAMS),
    [DSPK__M_METRICS] = {"metrics", NULL, 0, NULL, 0, DSPK__ADMIN_NO}, /* answers a str */
    M(DSPK__M_TRACE, "trace", trace_p, trace_r, DSPK__ADMIN_NO),
    M(DSPK__M_JOB_REGISTER, "job.register", jreg_p, jreg_r, DSPK__ADMIN_FIRST),
    M(DSPK__M_JOB_END, "job.end", jend_p, jend_r, DSPK__ADMIN_FIRST),
};

/* ---- the ops of task.run and their options: proto/options.h ------------- */

#define DSPK__OPTIONS_TABLE
#include "proto/options.h"

/* ---- lookups ------------------------------------------------------------ */

const struct dspk__method *dspk__method_find(const char *name, size_t len) {
  for (int i = 0; i < DSPK__M_COUNT; i++)
    if (strlen(dspk__methods[i].name) == len && memcmp(dspk__methods[i].name, name, len) == 0)
      return &dspk__methods[i];
  return NULL;
}

int dspk__choice_find(const char *const *list, const char *name, size_t len) {
  for (int i = 0; list[i]; i++)
    if (strlen(list[i]) == len && memcmp(list[i], name, len) == 0)
      return i;
  return -1;
}

const char *dspk__op_name(dspk_op op) {
  return (unsigned)op < DSPK_OP_COUNT ? dspk__op_names[op] : "?";
}

/* ---- the decoder -------------------------------------------------------- */

/* "a, b or c" of a choice list into buf. */
static void choices_text(const char *const *list, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; list[i] && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", list[i]);
}

/* PREFIX, the choices, ")" into buf (cut at size); returns buf. */
static const char *choices_phrase(const char *prefix, const char *const *list, char *buf,
                                  size_t size) {
  size_t used = (size_t)snprintf(buf, size, "%s", prefix);
  if (used < size)
    choices_text(list, buf + used, size - used);
  used = strlen(buf);
  if (used + 1 < size)
    memcpy(buf + used, ")", 2);
  return buf;
}

static const char *expect_text(const struct dspk__param *p, char *buf, size_t size) {
  if (p->expect)
    return p->expect;
  /* One wording for each kind, the same in "expected W, got G" and in
   * "required (W)" (docs/protocol.md, "Parameters of each method"; probe
   * 22 A2: an enum's required said the bare list, an enum list's type
   * error the list quoted, its items' "a string (list)"). */
  switch (p->type) {
  case DSPK__T_BOOL: return "a boolean";
  case DSPK__T_UINT: return "a non-negative integer";
  case DSPK__T_INT: return "an integer";
  case DSPK__T_NUM: return "a number";
  case DSPK__T_STR: return "a string";
  case DSPK__T_BIN: return DSPK__EXPECT_BIN;
  case DSPK__T_DIM3: return "an array of 1 to 3 integers";
  case DSPK__T_MAP: return "a map";
  case DSPK__T_ENUMS: return choices_phrase("an array of strings (", p->choices, buf, size);
  case DSPK__T_ENUM: return choices_phrase("a string (", p->choices, buf, size);
  default: return "an array";
  }
}

/* An enum value: the index of s in p->choices, or EINVAL with a message
 * naming what (e.g. "options.fn" or "kinds[2]"). */
static int enum_value(const struct dspk__param *p, const msgpack_object *o, const char *pre,
                      const char *what, int *out, char *msg, size_t msglen) {
  char list[160];
  const char *s;
  size_t n;
  /* The list of choices is written only for an error (it cost 2% of the
   * daemon's time on a stream of tiny tasks). */
  if (dspk__obj_str(o, &s, &n) != 0) {
    char w[64];
    choices_text(p->choices, list, sizeof list);
    return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: expected a string (%s), got %s", pre,
                      what, list, dspk__obj_what(o, w, sizeof w));
  }
  *out = dspk__choice_find(p->choices, s, n);
  if (*out < 0) {
    char echo[DSPK__ECHO_CAP(32)];
    choices_text(p->choices, list, sizeof list);
    return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: unknown %s \"%s\" (%s)", pre, what,
                      p->noun, dspk__utf8_echo(echo, sizeof echo, s, n, 32), list);
  }
  return 0;
}

static int decode_one(const struct dspk__param *p, const msgpack_object *o, const char *pre,
                      struct dspk__pval *v, char *msg, size_t msglen);

/* An element of an array, or a value of a map keyed by names, against
 * its row (an unnamed item), named "<pre><name><sub>" ("result.devices[2]",
 * "result.kinds.blobs"). */
static int decode_item(const struct dspk__param *item, const msgpack_object *o,
                       const char *pre, const char *name, const char *sub, char *msg,
                       size_t msglen) {
  char path[192];
  struct dspk__pval v = {.set = true};
  if (o->type == MSGPACK_OBJECT_NIL && (item->flags & DSPK__P_NIL))
    return 0;
  snprintf(path, sizeof path, "%s%s%s", pre, name, sub);
  return decode_one(item, o, path, &v, msg, msglen);
}

/* What a MAP or ARRAY row describes of its value o (already of its type):
 * the fields of a map, the values of a map keyed by names, the elements of
 * an array. */
static int decode_nested(const struct dspk__param *p, const msgpack_object *o, const char *pre,
                         char *msg, size_t msglen) {
  char sub[DSPK__ECHO_CAP(32) + 1]; /* "." and a key echoed (dspk__utf8_echo) */
  int err;
  if (p->type == DSPK__T_MAP && p->fields) {
    struct dspk__pval tmp[DSPK__MAX_FIELDS];
    char path[192];
    if (p->nfields > DSPK__MAX_FIELDS)
      return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: more fields than the decoder holds",
                        pre, p->name);
    snprintf(path, sizeof path, "%s%s.", pre, p->name);
    return dspk__params_decode(p->fields, p->nfields, o, path, tmp, msg, msglen);
  }
  if (p->type == DSPK__T_MAP && p->item) {
    /* Keys outside p->keys are checked as the others (a newer daemon's). */
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      const char *k;
      size_t kn;
      if (dspk__obj_str(&kv->key, &k, &kn) != 0) {
        char w[64];
        return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: expected a map keyed by names, "
                          "got a key that is %s", pre, p->name,
                          dspk__obj_what(&kv->key, w, sizeof w));
      }
      char echo[DSPK__ECHO_CAP(32)];
      snprintf(sub, sizeof sub, ".%s", dspk__utf8_echo(echo, sizeof echo, k, kn, 32));
      if ((err = decode_item(p->item, &kv->val, pre, p->name, sub, msg, msglen)) < 0)
        return err;
    }
    return 0;
  }
  if (p->type == DSPK__T_ARRAY && p->item)
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      snprintf(sub, sizeof sub, "[%u]", i);
      if ((err = decode_item(p->item, &o->via.array.ptr[i], pre, p->name, sub, msg,
                             msglen)) < 0)
        return err;
    }
  return 0;
}

static int decode_one(const struct dspk__param *p, const msgpack_object *o, const char *pre,
                      struct dspk__pval *v, char *msg, size_t msglen) {
  char buf[160];
  const char *name = p->name;
  const void *bp;
  uint32_t n;

  switch (p->type) {
  case DSPK__T_BOOL:
    if (dspk__obj_bool(o, &v->v.b) != 0)
      goto expected;
    return 0;
  case DSPK__T_UINT:
    if (dspk__obj_u64(o, &v->v.u) != 0)
      goto expected;
    if (v->v.u < p->min || v->v.u > p->max) {
      if (!p->range_err)
        goto expected;
      return dspk__fail(msg, msglen, p->range_err, "%s%s: %" PRIu64 " is out of range "
                        "[%" PRIu64 ", %" PRIu64 "]", pre, name, v->v.u, p->min, p->max);
    }
    return 0;
  case DSPK__T_INT:
    if (dspk__obj_i64(o, &v->v.i) != 0)
      goto expected;
    return 0;
  case DSPK__T_NUM:
    if (dspk__obj_f64(o, &v->v.f) != 0)
      goto expected;
    v->src = o;
    return 0;
  case DSPK__T_STR:
    if (dspk__obj_str(o, &v->v.s.p, &v->v.s.n) != 0)
      goto expected;
    if (memchr(v->v.s.p, '\0', v->v.s.n))
      return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: the string holds a NUL byte", pre,
                        name);
    if (v->v.s.n > p->max)
      return dspk__fail(msg, msglen, DSPK_ELIMIT, "%s%s: longer than %" PRIu64 " bytes", pre,
                        name, p->max);
    return 0;
  case DSPK__T_BIN:
    if (dspk__obj_bin(o, &bp, &v->v.s.n) != 0)
      goto expected;
    v->v.s.p = bp;
    return 0;
  case DSPK__T_ENUM:
    return enum_value(p, o, pre, name, &v->v.e, msg, msglen);
  case DSPK__T_ENUMS:
    if (o->type != MSGPACK_OBJECT_ARRAY)
      goto expected;
    v->v.mask = 0;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      char what[64];
      int e, err;
      snprintf(what, sizeof what, "%s[%u]", name, i);
      if ((err = enum_value(p, &o->via.array.ptr[i], pre, what, &e, msg, msglen)))
        return err;
      v->v.mask |= 1u << e;
    }
    return 0;
  case DSPK__T_DIM3:
    n = o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size : 0;
    if (n < 1 || n > 3)
      goto expected;
    v->v.dim[0] = v->v.dim[1] = v->v.dim[2] = 1;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t x;
      if (dspk__obj_u64(&o->via.array.ptr[i], &x) != 0 || x == 0 || x > UINT32_MAX)
        return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s[%u]: expected a positive uint32, "
                          "got %s", pre, name, i,
                          dspk__obj_what(&o->via.array.ptr[i], buf, sizeof buf));
      v->v.dim[i] = (uint32_t)x;
    }
    return 0;
  case DSPK__T_ARRAY:
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < p->min)
      goto expected;
    if (p->max && o->via.array.size > p->max) {
      if (!p->range_err)
        goto expected;
      return dspk__fail(msg, msglen, p->range_err, "%s%s: %u item%s, at most %" PRIu64, pre,
                        name, o->via.array.size, dspk__s(o->via.array.size), p->max);
    }
    v->v.o = o;
    return decode_nested(p, o, pre, msg, msglen);
  case DSPK__T_MAP:
    if (o->type != MSGPACK_OBJECT_MAP)
      goto expected;
    v->v.o = o;
    return decode_nested(p, o, pre, msg, msglen);
  }
expected:;
  char w[64];
  return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: expected %s, got %s", pre, name,
                    expect_text(p, buf, sizeof buf), dspk__obj_what(o, w, sizeof w));
}

int dspk__params_decode(const struct dspk__param *params, int n, const msgpack_object *map,
                        const char *prefix, struct dspk__pval *out, char *msg, size_t msglen) {
  char buf[160];
  const char *pre = prefix ? prefix : "";
  for (int i = 0; i < n; i++) {
    const struct dspk__param *p = &params[i];
    const msgpack_object *o = dspk__map_get(map, p->name);
    int err;
    out[i] = p->def;
    out[i].set = false;
    if (o && o->type == MSGPACK_OBJECT_NIL && (p->flags & DSPK__P_NIL)) {
      out[i].set = out[i].nil = true;
      continue;
    }
    if (!o || o->type == MSGPACK_OBJECT_NIL) {
      if (p->flags & DSPK__P_REQUIRED)
        return dspk__fail(msg, msglen, DSPK_EINVAL, "%s%s: required (%s)", pre, p->name,
                          expect_text(p, buf, sizeof buf));
      continue;
    }
    if ((err = decode_one(p, o, pre, &out[i], msg, msglen)))
      return err;
    out[i].set = true;
  }
  return 0;
}

_Static_assert(sizeof(dspk_reduce) == sizeof(int) && sizeof(dspk_mapfn) == sizeof(int),
               "enums are stored as int");

void dspk__params_store(const struct dspk__param *params, int n,
                        const struct dspk__pval *vals, void *target) {
  for (int i = 0; i < n; i++) {
    const struct dspk__param *p = &params[i];
    char *at = (char *)target + p->at - 1;
    int x;
    uint32_t u32;
    if (!p->at)
      continue;
    switch (p->type) {
    case DSPK__T_BOOL:
      x = vals[i].v.b;
      memcpy(at, &x, sizeof x);
      break;
    case DSPK__T_ENUM:
      memcpy(at, &vals[i].v.e, sizeof vals[i].v.e);
      break;
    case DSPK__T_NUM:
      memcpy(at, &vals[i].v.f, sizeof vals[i].v.f);
      if (p->at_sent) {
        struct dspk__num_sent sent = {.kind = DSPK__NUM_NONE, .v.f = vals[i].v.f};
        if (vals[i].src)
          (void)dspk__obj_num(vals[i].src, &sent);
        memcpy((char *)target + p->at_sent - 1, &sent, sizeof sent);
      }
      break;
    case DSPK__T_UINT:
      if (p->max <= UINT32_MAX) {
        u32 = (uint32_t)vals[i].v.u;
        memcpy(at, &u32, sizeof u32);
      } else {
        memcpy(at, &vals[i].v.u, sizeof vals[i].v.u);
      }
      break;
    case DSPK__T_STR:
      dspk__pval_str(&vals[i], at, p->max + 1);
      break;
    case DSPK__T_DIM3:
      memcpy(at, vals[i].v.dim, sizeof vals[i].v.dim);
      break;
    default: /* bin, arrays, maps: the handler's */
      break;
    }
  }
}

void dspk__pval_str(const struct dspk__pval *v, char *buf, size_t size) {
  size_t n = v->v.s.n < size ? v->v.s.n : size - 1;
  if (n)
    memcpy(buf, v->v.s.p, n);
  buf[n] = '\0';
}

/* ---- the encoder -------------------------------------------------------- */

/* Packs a map header counting the set values of params[0..n). */
static void encode_head(struct dspk__wbuf *w, int n, const struct dspk__pval *vals) {
  size_t count = 0;
  for (int i = 0; i < n; i++)
    count += vals[i].set;
  msgpack_pack_map(&w->pk, count);
}

void dspk__value_encode(struct dspk__wbuf *w, const struct dspk__param *p,
                        const struct dspk__pval *v) {
  msgpack_packer *pk = &w->pk;
  if (v->nil) {
    msgpack_pack_nil(pk);
    return;
  }
  switch (p->type) {
  case DSPK__T_BOOL:
    if (v->v.b)
      msgpack_pack_true(pk);
    else
      msgpack_pack_false(pk);
    break;
  case DSPK__T_UINT:
    msgpack_pack_uint64(pk, v->v.u);
    break;
  case DSPK__T_INT:
    msgpack_pack_int64(pk, v->v.i);
    break;
  case DSPK__T_NUM:
    msgpack_pack_double(pk, v->v.f);
    break;
  case DSPK__T_STR:
    dspk__pack_strn(pk, v->v.s.p, v->v.s.n); /* as dspk__pack_str: valid UTF-8 */
    break;
  case DSPK__T_BIN:
    dspk__wbuf_bin_ref(w, v->v.s.p, v->v.s.n, v->release, v->release_ud);
    break;
  case DSPK__T_ENUM:
    dspk__pack_str(pk, p->choices[v->v.e]);
    break;
  case DSPK__T_ENUMS: {
    size_t k = 0;
    for (int c = 0; p->choices[c]; c++)
      k += (v->v.mask >> c) & 1u;
    msgpack_pack_array(pk, k);
    for (int c = 0; p->choices[c]; c++)
      if ((v->v.mask >> c) & 1u)
        dspk__pack_str(pk, p->choices[c]);
    break;
  }
  case DSPK__T_DIM3:
    msgpack_pack_array(pk, 3);
    for (int k = 0; k < 3; k++)
      msgpack_pack_uint32(pk, v->v.dim[k]);
    break;
  case DSPK__T_ARRAY:
  case DSPK__T_MAP:
    v->v.pack.fn(v->v.pack.ud, w);
    break;
  }
}

/* Packs the set values of params[from..to) as key and value. */
static void encode_fields(struct dspk__wbuf *w, const struct dspk__param *params,
                          const struct dspk__pval *vals, int from, int to) {
  for (int i = from; i < to; i++) {
    if (!vals[i].set)
      continue;
    dspk__pack_str(&w->pk, params[i].name);
    dspk__value_encode(w, &params[i], &vals[i]);
  }
}

void dspk__map_encode(struct dspk__wbuf *w, const struct dspk__param *fields, int n,
                      const struct dspk__pval *vals) {
  encode_head(w, n, vals);
  encode_fields(w, fields, vals, 0, n);
}

void dspk__params_encode(struct dspk__wbuf *w, const struct dspk__param *params, int n,
                         const struct dspk__pval *vals) {
  encode_head(w, n, vals);
  encode_fields(w, params, vals, 0, n);
}

void dspk__result_head(struct dspk__wbuf *w, const struct dspk__method *m,
                       const struct dspk__pval *vals) {
  encode_head(w, m->nresults, vals);
}

void dspk__result_fields(struct dspk__wbuf *w, const struct dspk__method *m,
                         const struct dspk__pval *vals, int from, int to) {
  encode_fields(w, m->results, vals, from, to < m->nresults ? to : m->nresults);
}

void dspk__result_encode(struct dspk__wbuf *w, const struct dspk__method *m,
                         const struct dspk__pval *vals) {
  encode_head(w, m->nresults, vals);
  encode_fields(w, m->results, vals, 0, m->nresults);
}

int dspk__result_decode(const struct dspk__method *m, const msgpack_object *map,
                        struct dspk__pval *out, char *msg, size_t msglen) {
  if (!m->results || !map || map->type != MSGPACK_OBJECT_MAP)
    return dspk__fail(msg, msglen, DSPK_EPROTO, "%s: the result is not a map", m->name);
  return dspk__params_decode(m->results, m->nresults, map, "result.", out, msg, msglen) < 0
             ? DSPK_EPROTO
             : 0;
}

/* ---- JSON export ---------------------------------------------------------- */

static const char *type_name(enum dspk__ptype t) {
  switch (t) {
  case DSPK__T_BOOL: return "bool";
  case DSPK__T_UINT: return "uint";
  case DSPK__T_INT: return "int";
  case DSPK__T_NUM: return "number";
  case DSPK__T_STR: return "str";
  case DSPK__T_BIN: return "bin";
  case DSPK__T_ENUM: return "enum";
  case DSPK__T_ENUMS: return "enum_list";
  case DSPK__T_DIM3: return "dim3";
  case DSPK__T_ARRAY: return "array";
  case DSPK__T_MAP: return "map";
  }
  return "?";
}

/* A JSON string (the table's strings are ASCII without control bytes). */
static void jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static void jlist(FILE *f, const char *const *l) {
  fputc('[', f);
  for (int i = 0; l && l[i]; i++) {
    if (i)
      fputs(", ", f);
    jstr(f, l[i]);
  }
  fputc(']', f);
}

static void jparams(FILE *f, const struct dspk__param *ps, int n, const char *indent);

/* One row: {"name": ..., "type": ..., ...}, with what a nested map or array
 * holds ("fields", "keys" and "item"). */
static void jparam(FILE *f, const struct dspk__param *p, const char *indent) {
  char deeper[64];
  snprintf(deeper, sizeof deeper, "%s  ", indent);
  fputs("{\"name\": ", f);
  jstr(f, p->name);
  fprintf(f, ", \"type\": \"%s\", \"required\": %s", type_name(p->type),
          p->flags & DSPK__P_REQUIRED ? "true" : "false");
  if (p->flags & DSPK__P_NIL)
    fputs(", \"nil\": true", f);
  if (p->type == DSPK__T_UINT && (p->min || p->max != UINT64_MAX))
    fprintf(f, ", \"min\": %" PRIu64 ", \"max\": %" PRIu64, p->min, p->max);
  if (p->type == DSPK__T_STR && p->max != UINT64_MAX)
    fprintf(f, ", \"max_bytes\": %" PRIu64, p->max);
  if (p->type == DSPK__T_ARRAY) {
    fprintf(f, ", \"min_items\": %" PRIu64, p->min);
    if (p->max && p->max != UINT64_MAX)
      fprintf(f, ", \"max_items\": %" PRIu64, p->max);
  }
  if (p->choices) {
    fputs(", \"choices\": ", f);
    jlist(f, p->choices);
  }
  if (p->def_doc) {
    fputs(", \"default\": ", f);
    jstr(f, p->def_doc);
  }
  if (p->values_doc) {
    fputs(", \"values\": ", f);
    jstr(f, p->values_doc);
  }
  if (p->fields) {
    fputs(", \"fields\": ", f);
    jparams(f, p->fields, p->nfields, deeper);
  }
  if (p->keys) {
    fputs(", \"keys\": ", f);
    jlist(f, p->keys);
  }
  if (p->item) {
    fputs(", \"item\": ", f);
    jparam(f, p->item, deeper);
  }
  fputc('}', f);
}

static void jparams(FILE *f, const struct dspk__param *ps, int n, const char *indent) {
  fputc('[', f);
  for (int i = 0; i < n; i++) {
    fprintf(f, "%s\n%s  ", i ? "," : "", indent);
    jparam(f, &ps[i], indent);
  }
  if (n)
    fprintf(f, "\n%s", indent);
  fputc(']', f);
}

int dspk__schema_json(FILE *f) {
  fprintf(f, "{\"protocol\": %d,\n \"methods\": [", DSPK_PROTOCOL_VERSION);
  for (int i = 0; i < DSPK__M_COUNT; i++) {
    const struct dspk__method *m = &dspk__methods[i];
    fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
    jstr(f, m->name);
    fprintf(f, ", \"admin\": %s,", m->admin != DSPK__ADMIN_NO ? "true" : "false");
    if (m->admin == DSPK__ADMIN_AFTER_PARAMS)
      fputs(" \"admin_after_params\": true,", f);
    fputs("\n   \"result\": ", f);
    if (m->results)
      jparams(f, m->results, m->nresults, "   ");
    else
      fputs("\"str\"", f);
    fputs(",\n   \"params\": ", f);
    jparams(f, m->params, m->nparams, "   ");
    fputc('}', f);
  }
  fputs("],\n \"ops\": [", f);
  for (int i = 0; i < DSPK_OP_COUNT; i++) {
    fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
    jstr(f, dspk__op_names[i]);
    fputs(", \"options\": ", f);
    jparams(f, dspk__ops[i].options, dspk__ops[i].noptions, "   ");
    fputc('}', f);
  }
  fputs("]}\n", f);
  return ferror(f) ? -1 : 0;
}
