/*
 * dspk-cuda-worker: runs raw kernels for one CUDA device on behalf of dspkd
 * (see worker.h).  Usage: dspk-cuda-worker ORDINAL, with the socket to the
 * daemon on fd 3.  Answers a ready message once its context exists, then
 * one answer per request until the socket closes or its context dies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cuda/cuda_api.h"
#include "backends/cuda/worker.h"
#include "dspk/errors.h"

#define CU dspk__cu
#define FD 3

static int sticky(CUresult r) {
  return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED ||
         r == CUDA_ERROR_MISALIGNED_ADDRESS || r == CUDA_ERROR_ILLEGAL_INSTRUCTION ||
         r == CUDA_ERROR_HARDWARE_STACK_ERROR || r == CUDA_ERROR_INVALID_PC ||
         r == CUDA_ERROR_INVALID_ADDRESS_SPACE || r == CUDA_ERROR_ASSERT ||
         r == CUDA_ERROR_LAUNCH_TIMEOUT || r == CUDA_ERROR_UNKNOWN;
}

static void cu_fail(struct dspk__wrep *rep, const char *what, CUresult r) {
  const char *name = "?", *text = "?";
  CU.cuGetErrorName(r, &name);
  CU.cuGetErrorString(r, &text);
  rep->status = DSPK_EDEVICE;
  rep->cuerr = (int32_t)r;
  rep->fatal = sticky(r);
  snprintf(rep->msg, sizeof(rep->msg), "%s: %s (%s)", what, name, text);
}

int main(int argc, char **argv) {
  struct dspk__wrep rep;
  CUdevice dev;
  CUcontext ctx;
  CUstream st;
  CUresult r;
  char why[200];
  memset(&rep, 0, sizeof(rep));
  rep.magic = DSPK__WORKER_MAGIC;
  if (argc < 2) {
    fprintf(stderr, "usage: dspk-cuda-worker ORDINAL (socket on fd 3)\n");
    return 2;
  }
  if (dspk__cuda_load_driver(why, sizeof(why)) != 0) {
    rep.status = DSPK_ENODEV;
    snprintf(rep.msg, sizeof(rep.msg), "kernel worker: %s", why);
    dspk__worker_write(FD, &rep, sizeof(rep));
    return 1;
  }
  if ((r = CU.cuInit(0)) || (r = CU.cuDeviceGet(&dev, atoi(argv[1]))) ||
      (r = CU.cuDevicePrimaryCtxRetain(&ctx, dev)) || (r = CU.cuCtxSetCurrent(ctx)) ||
      (r = CU.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING))) {
    cu_fail(&rep, "kernel worker start", r);
    dspk__worker_write(FD, &rep, sizeof(rep));
    return 1;
  }
  dspk__worker_write(FD, &rep, sizeof(rep)); /* ready */
  for (;;) {
    struct dspk__wreq q;
    CUdeviceptr mapped[DSPK__WORKER_MAX_ARGS] = {0}, ptrs[DSPK__WORKER_MAX_ARGS];
    CUdeviceptr owned[DSPK__WORKER_MAX_ARGS] = {0};
    void *host[DSPK__WORKER_MAX_ARGS] = {0}, *kargs[DSPK__WORKER_MAX_ARGS];
    unsigned char *cubin = NULL;
    CUmodule mod = NULL;
    CUfunction fn;
    int ok = 1;
    if (dspk__worker_read(FD, &q, sizeof(q)) != 0 || q.magic != DSPK__WORKER_MAGIC ||
        q.nargs > DSPK__WORKER_MAX_ARGS || q.cubin_len > (256u << 20))
      return 0; /* the daemon closed the socket (or spoke nonsense) */
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
        r = CU.cuIpcOpenMemHandle(&mapped[i], q.args[i].ipc,
                                  CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
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
        if ((r = CU.cuMemAlloc(&owned[i], q.args[i].bytes ? q.args[i].bytes : 1)) ||
            (r = CU.cuMemcpyHtoD(owned[i], host[i], q.args[i].bytes))) {
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
    if (ok && (r = CU.cuModuleLoadData(&mod, cubin))) {
      cu_fail(&rep, "kernel worker: cuModuleLoadData", r);
      ok = 0;
    }
    if (ok && (r = CU.cuModuleGetFunction(&fn, mod, q.entry))) {
      cu_fail(&rep, "kernel worker: cuModuleGetFunction", r);
      ok = 0;
    }
    if (ok && q.shared > 48 * 1024)
      CU.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            (int)q.shared);
    if (ok && (r = CU.cuLaunchKernel(fn, q.grid[0], q.grid[1], q.grid[2], q.block[0],
                                     q.block[1], q.block[2], q.shared, st, kargs, NULL))) {
      cu_fail(&rep, "cuLaunchKernel", r);
      ok = 0;
    }
    if (ok && (r = CU.cuStreamSynchronize(st))) {
      cu_fail(&rep, "kernel", r);
      ok = 0;
    }
    for (uint32_t i = 0; i < q.nargs && ok; i++)
      if (q.args[i].kind == DSPK__WARG_DATA &&
          (r = CU.cuMemcpyDtoH(host[i], owned[i], q.args[i].bytes))) {
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
          CU.cuIpcCloseMemHandle(mapped[i]);
        if (owned[i])
          CU.cuMemFree(owned[i]);
      }
      free(host[i]);
    }
    if (rep.fatal)
      return 3; /* this process's CUDA is poisoned: the daemon starts another */
    if (mod)
      CU.cuModuleUnload(mod);
    free(cubin);
  }
}
