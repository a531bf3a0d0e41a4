/*
 * The kernel worker process of a GPU runtime (dspk-cuda-worker,
 * dspk-hip-worker): runs raw kernels for one device on behalf of dspkd
 * (see worker.h), through the runtime's driver table.  Usage: WORKER ORDINAL, with the socket to the
 * daemon on fd 3.  Answers a ready message once its context exists, then
 * one answer per request until the socket closes or its context dies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/gpurt/gpurt.h"
#include "backends/gpurt/worker.h"
#include "dspk/errors.h"

#define FD 3

static const struct dspk__gpurt_driver *D;

static void cu_fail(struct dspk__wrep *rep, const char *what, int r) {
  const char *name = NULL, *text = NULL;
  char api[96];
  if (strncmp(what, "kernel worker: ", 15) == 0)
    snprintf(api, sizeof(api), "kernel worker: %s",
             dspk__gpurt_api(D, what + 15, (char[96]){0}, 96));
  else
    snprintf(api, sizeof(api), "%s", dspk__gpurt_api(D, what, (char[96]){0}, 96));
  what = api;
  D->errname(r, &name, &text);
  rep->status = DSPK_EDEVICE;
  rep->cuerr = (int32_t)r;
  rep->fatal = D->classify(r) == DSPK__G_STICKY;
  snprintf(rep->msg, sizeof(rep->msg), "%s: %s (%s)", what, name ? name : "error",
           text ? text : "?");
}

/* The bytes the worker allocates for a tensor of n bytes passed as data. */
static size_t data_alloc(uint64_t n) { return n ? (size_t)((n + 255) & ~(uint64_t)255) : 256; }

int dspk__gpurt_worker_main(const struct dspk__gpurt_driver *drv, int argc, char **argv) {
  struct dspk__wrep rep;
  void *ctx;
  dspk__gstream st;
  int r;
  char why[200];
  D = drv;
  memset(&rep, 0, sizeof(rep));
  rep.magic = DSPK__WORKER_MAGIC;
  if (argc < 2) {
    fprintf(stderr, "usage: %s ORDINAL (socket on fd 3)\n", drv->worker);
    return 2;
  }
  if (drv->load(why, sizeof(why)) != 0) {
    rep.status = DSPK_ENODEV;
    snprintf(rep.msg, sizeof(rep.msg), "kernel worker: %s", why);
    dspk__worker_write(FD, &rep, sizeof(rep));
    return 1;
  }
  if ((r = drv->ctx_open(atoi(argv[1]), &ctx, &st))) {
    cu_fail(&rep, "kernel worker start", r);
    dspk__worker_write(FD, &rep, sizeof(rep));
    return 1;
  }
  dspk__worker_write(FD, &rep, sizeof(rep)); /* ready */
  for (;;) {
    struct dspk__wreq q;
    dspk__gptr mapped[DSPK__WORKER_MAX_ARGS] = {0}, ptrs[DSPK__WORKER_MAX_ARGS];
    dspk__gptr owned[DSPK__WORKER_MAX_ARGS] = {0};
    void *host[DSPK__WORKER_MAX_ARGS] = {0}, *kargs[DSPK__WORKER_MAX_ARGS];
    unsigned char *cubin = NULL;
    dspk__gmodule mod = NULL;
    dspk__gfunc fn = NULL;
    int ok = 1;
    if (dspk__worker_read(FD, &q, sizeof(q)) != 0 || q.magic != DSPK__WORKER_MAGIC ||
        q.nargs > DSPK__WORKER_MAX_ARGS || q.cubin_len > (256u << 20)) {
      drv->ctx_close(atoi(argv[1]), ctx, st, 0);
      return 0; /* the daemon closed the socket (or spoke nonsense) */
    }
    memset(&rep, 0, sizeof(rep));
    rep.magic = DSPK__WORKER_MAGIC;
    q.entry[sizeof(q.entry) - 1] = 0;
    cubin = malloc(q.cubin_len + 1);
    if (!cubin || dspk__worker_read(FD, cubin, q.cubin_len) != 0)
      return 1;
    for (uint32_t i = 0; i < q.nargs; i++) {
      if (q.args[i].kind == DSPK__WARG_DATA) {
        host[i] = malloc(q.args[i].bytes ? q.args[i].bytes : 1);
        if (!host[i] || dspk__worker_read(FD, host[i], q.args[i].bytes) != 0)
          return 1;
      }
    }
    for (uint32_t i = 0; i < q.nargs && ok; i++) {
      switch (q.args[i].kind) {
      case DSPK__WARG_IPC:
        r = D->ipc_open(&mapped[i], q.args[i].ipc);
        if (r) {
          cu_fail(&rep, "kernel worker: cuIpcOpenMemHandle", r);
          rep.ipc_failed = 1;
          rep.fatal = 0;
          ok = 0;
          break;
        }
        ptrs[i] = mapped[i] + q.args[i].offset;
        kargs[i] = &ptrs[i];
        break;
      case DSPK__WARG_DATA:
        /* A whole number of 256-byte units, zeroed before the tensor's bytes
         * come: the kernel may read past them (CUDA has no bounds), and
         * must find zeros there, not an earlier task's bytes. */
        if ((r = D->mem_alloc(&owned[i], data_alloc(q.args[i].bytes))) ||
            (r = D->memset_async(owned[i], 0, data_alloc(q.args[i].bytes), st)) ||
            (r = D->stream_sync(st)) ||
            (r = D->htod(owned[i], host[i], q.args[i].bytes))) {
          cu_fail(&rep, "kernel worker: staging a tensor", r);
          ok = 0;
          break;
        }
        ptrs[i] = owned[i];
        kargs[i] = &ptrs[i];
        break;
      default:
        kargs[i] = q.args[i].value;
        break;
      }
    }
    if (ok && (r = D->module_load(&mod, cubin))) {
      cu_fail(&rep, "kernel worker: cuModuleLoadData", r);
      ok = 0;
    }
    if (ok && (r = D->module_func(&fn, mod, q.entry))) {
      cu_fail(&rep, "kernel worker: cuModuleGetFunction", r);
      ok = 0;
    }
    if (ok && q.shared > 48 * 1024 && D->func_set_shared)
      D->func_set_shared(fn, (int)q.shared);
    if (ok && (r = D->launch(fn, q.grid[0], q.grid[1], q.grid[2], q.block[0], q.block[1],
                             q.block[2], q.shared, st, kargs))) {
      cu_fail(&rep, "cuLaunchKernel", r);
      ok = 0;
    }
    if (ok && (r = D->stream_sync(st))) {
      cu_fail(&rep, "kernel", r);
      ok = 0;
    }
    for (uint32_t i = 0; i < q.nargs && ok; i++)
      if (q.args[i].kind == DSPK__WARG_DATA &&
          (r = D->dtoh(host[i], owned[i], q.args[i].bytes))) {
        cu_fail(&rep, "kernel worker: reading a tensor back", r);
        ok = 0;
      }
    if (dspk__worker_write(FD, &rep, sizeof(rep)) != 0)
      return 1;
    for (uint32_t i = 0; i < q.nargs; i++) {
      if (ok && q.args[i].kind == DSPK__WARG_DATA &&
          dspk__worker_write(FD, host[i], q.args[i].bytes) != 0)
        return 1;
      if (!rep.fatal) {
        if (mapped[i])
          D->ipc_close(mapped[i]);
        /* Zeroed before it goes back to the driver, which may hand its
         * memory to a later task's (another user's) allocation. */
        if (owned[i] && (D->memset_async(owned[i], 0, data_alloc(q.args[i].bytes), st) ||
                         D->stream_sync(st))) {
          drv->ctx_close(atoi(argv[1]), ctx, st, 1);
          return 3;
        }
        if (owned[i])
          D->mem_free(owned[i]);
      }
      free(host[i]);
    }
    free(cubin);
    if (rep.fatal) {
      /* This process's runtime is poisoned: the reset releases what the
       * context held, and the daemon starts another worker. */
      drv->ctx_close(atoi(argv[1]), ctx, st, 1);
      return 3;
    }
    if (mod)
      D->module_unload(mod);
  }
}
