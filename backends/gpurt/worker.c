/*
 * The daemon's side of the kernel worker (see worker.h): starts the
 * runtime's worker (dspk-cuda-worker, dspk-hip-worker) for a device on
 * first use, hands it raw kernels, and reaps and replaces it when a kernel
 * kills its context.
 *
 * The worker binary is looked for in $<env>_WORKER (DSPK_CUDA_WORKER,
 * DSPK_HIP_WORKER), then where the build put it, then where `cmake
 * --install` puts it, then beside the running executable.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/gpurt/gpurt.h"
#include "backends/gpurt/worker.h"

extern char **environ;

#define DRV (dev->drv)

static int find_worker(const struct dspk__gpurt_driver *drv, char *out, size_t len) {
  char var[96];
  const char *env;
  char self[4096];
  ssize_t n;
  snprintf(var, sizeof(var), "%s_WORKER", drv->env);
  env = getenv(var);
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return access(out, X_OK) == 0 ? 0 : DSPK_ENOENT;
  }
  if (drv->worker_build && access(drv->worker_build, X_OK) == 0) {
    snprintf(out, len, "%s", drv->worker_build);
    return 0;
  }
  if (drv->worker_install && access(drv->worker_install, X_OK) == 0) {
    snprintf(out, len, "%s", drv->worker_install);
    return 0;
  }
  n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    char *slash;
    self[n] = 0;
    slash = strrchr(self, '/');
    if (slash) {
      size_t dl = (size_t)(slash - self);
      if (dl + strlen(drv->worker) + 2 <= len) {
        memcpy(out, self, dl);
        snprintf(out + dl, len - dl, "/%s", drv->worker);
        if (access(out, X_OK) == 0)
          return 0;
      }
    }
  }
  return DSPK_ENOENT;
}

/* Describes how the worker ended into buf. */
static void reap(struct dspk__dev *dev, char *buf, size_t len) {
  int st = 0;
  if (dev->worker_fd >= 0)
    close(dev->worker_fd);
  dev->worker_fd = -1;
  if (dev->worker_pid > 0 && waitpid(dev->worker_pid, &st, 0) == dev->worker_pid) {
    if (buf && WIFSIGNALED(st))
      snprintf(buf, len, "killed by signal %d", WTERMSIG(st));
    else if (buf)
      snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
  } else if (buf) {
    snprintf(buf, len, "gone");
  }
  dev->worker_pid = 0;
}

void dspk__gpurt_worker_stop(struct dspk__dev *dev) {
  if (dev->worker_pid > 0)
    reap(dev, NULL, 0); /* closing the socket ends it */
}

static int start(struct dspk__dev *dev, struct dspk__opctx *ctx) {
  char path[4096], ord[16], how[64];
  char *argv[3];
  int sv[2], fd;
  posix_spawn_file_actions_t fa;
  struct dspk__wrep rep;
  pid_t pid;
  int rc;
  if (find_worker(DRV, path, sizeof(path)) != 0)
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP,
                          "kernel: %s not found (set %s_WORKER); raw kernels run in it so "
                          "a faulting kernel cannot take down the device",
                          DRV->worker, DRV->env);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return dspk__gpurt_msg(ctx, DSPK_EIO, "kernel: socketpair: %s", strerror(errno));
  fd = sv[1];
  if (fd == 3) { /* dup2(3, 3) would keep FD_CLOEXEC */
    fd = fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
    close(sv[1]);
  }
  snprintf(ord, sizeof(ord), "%d", dev->index);
  argv[0] = path;
  argv[1] = ord;
  argv[2] = NULL;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 3);
  rc = posix_spawn(&pid, path, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd);
  if (rc != 0) {
    close(sv[0]);
    return dspk__gpurt_msg(ctx, DSPK_EIO, "kernel: cannot start %s: %s", path, strerror(rc));
  }
  dev->worker_pid = pid;
  dev->worker_fd = sv[0];
  if (dspk__worker_read(dev->worker_fd, &rep, sizeof(rep)) != 0 || rep.magic != DSPK__WORKER_MAGIC) {
    reap(dev, how, sizeof(how));
    return dspk__gpurt_msg(ctx, DSPK_EDEVICE, "kernel: the kernel worker did not start (%s)",
                          how);
  }
  if (rep.status != 0) {
    rep.msg[sizeof(rep.msg) - 1] = 0;
    reap(dev, NULL, 0);
    return dspk__gpurt_msg(ctx, DSPK_EDEVICE, "kernel: %s", rep.msg);
  }
  dev->worker_starts++;
  dev->worker_uid = ctx ? ctx->owner : 0;
  return 0;
}

/* One attempt; *ipc_failed tells the caller to retry with copies. */
static int attempt(struct dspk__dev *dev, struct dspk__op *op, const void *cubin,
                   size_t cubin_len, int use_ipc, int *ipc_failed,
                   struct dspk__opctx *ctx) {
  struct dspk__wreq q;
  struct dspk__wrep rep;
  void *host[DSPK__WORKER_MAX_ARGS] = {0};
  const char *entry = op->u.kernel.entry;
  char how[64];
  int r;
  int rc = 0;
  memset(&q, 0, sizeof(q));
  q.magic = DSPK__WORKER_MAGIC;
  q.nargs = (uint32_t)op->u.kernel.nargs;
  q.cubin_len = cubin_len;
  snprintf(q.entry, sizeof(q.entry), "%s", entry);
  memcpy(q.grid, op->u.kernel.grid, sizeof(q.grid));
  memcpy(q.block, op->u.kernel.block, sizeof(q.block));
  q.shared = op->u.kernel.shared_bytes;
  for (int i = 0; i < op->u.kernel.nargs; i++) {
    const struct dspk__karg *a = &op->u.kernel.args[i];
    if (a->kind == DSPK__KARG_TENSOR) {
      const struct dspk__tensor *t = &op->in[a->v.tensor];
      size_t n = dspk__tensor_nbytes(t);
      if (use_ipc && t->mem) {
        q.args[i].kind = DSPK__WARG_IPC;
        q.args[i].offset = t->offset;
        if ((r = DRV->ipc_get(q.args[i].ipc, t->mem->ptr)) != 0) {
          *ipc_failed = 1;
          rc = DSPK_ENOTSUP;
          goto out;
        }
      } else {
        q.args[i].kind = DSPK__WARG_DATA;
        q.args[i].bytes = n;
        host[i] = malloc(n ? n : 1);
        if (!host[i]) {
          rc = DSPK_ENOMEM;
          goto out;
        }
        /* Through the pinned staging ring, like every copy of the backend. */
        if (n && (rc = dspk__gpurt_stage_read(dev, host[i], dspk__gpurt_ptr(t), n))) {
          dspk__gpurt_msg(ctx, rc, "kernel: staging a tensor failed");
          goto out;
        }
      }
    } else {
      q.args[i].kind = DSPK__WARG_SCALAR;
      switch (a->kind) {
      case DSPK__KARG_I32: q.args[i].size = 4; memcpy(q.args[i].value, &a->v.i32, 4); break;
      case DSPK__KARG_U32: q.args[i].size = 4; memcpy(q.args[i].value, &a->v.u32, 4); break;
      case DSPK__KARG_F32: q.args[i].size = 4; memcpy(q.args[i].value, &a->v.f32, 4); break;
      case DSPK__KARG_I64: q.args[i].size = 8; memcpy(q.args[i].value, &a->v.i64, 8); break;
      default: q.args[i].size = 8; memcpy(q.args[i].value, &a->v.f64, 8); break;
      }
    }
  }
  if (dev->worker_pid <= 0 && (rc = start(dev, ctx)))
    goto out;
  if (dspk__worker_write(dev->worker_fd, &q, sizeof(q)) != 0 ||
      dspk__worker_write(dev->worker_fd, cubin, cubin_len) != 0)
    goto died;
  for (uint32_t i = 0; i < q.nargs; i++)
    if (q.args[i].kind == DSPK__WARG_DATA &&
        dspk__worker_write(dev->worker_fd, host[i], q.args[i].bytes) != 0)
      goto died;
  if (dspk__worker_read(dev->worker_fd, &rep, sizeof(rep)) != 0 || rep.magic != DSPK__WORKER_MAGIC)
    goto died;
  rep.msg[sizeof(rep.msg) - 1] = 0;
  if (rep.status != 0) {
    if (rep.ipc_failed) {
      *ipc_failed = 1;
      rc = DSPK_ENOTSUP;
      goto out;
    }
    if (rep.fatal) {
      reap(dev, NULL, 0);
      dev->faults++;
      rc = dspk__gpurt_msg(ctx, DSPK_EDEVICE,
                          "kernel %s faulted: %s; it ran in an isolated worker process, "
                          "so %s:%d and its other work are unaffected (its tensor "
                          "arguments may hold partial results)",
                          entry, rep.msg, DRV->name, dev->index);
    } else {
      rc = dspk__gpurt_msg(ctx, rep.status, "kernel %s: %s", entry, rep.msg);
    }
    goto out;
  }
  for (uint32_t i = 0; i < q.nargs; i++) {
    if (q.args[i].kind != DSPK__WARG_DATA)
      continue;
    if (dspk__worker_read(dev->worker_fd, host[i], q.args[i].bytes) != 0)
      goto died;
    /* On the device's stream, so later work on it is ordered after. */
    rc = dspk__gpurt_stage_write(dev, dspk__gpurt_ptr(&op->in[op->u.kernel.args[i].v.tensor]),
                                host[i], q.args[i].bytes);
    if (rc) {
      dspk__gpurt_msg(ctx, rc, "kernel: writing a tensor back failed");
      goto out;
    }
  }
  rc = 0;
  goto out;
died:
  reap(dev, how, sizeof(how));
  dev->faults++;
  rc = dspk__gpurt_msg(ctx, DSPK_EDEVICE,
                      "kernel %s: the kernel worker died (%s); %s:%d is unaffected", entry,
                      how, DRV->name, dev->index);
out:
  for (int i = 0; i < DSPK__WORKER_MAX_ARGS; i++)
    free(host[i]);
  return rc;
}

int dspk__gpurt_worker_run(struct dspk__dev *dev, struct dspk__op *op, const void *cubin,
                          size_t cubin_len, struct dspk__opctx *ctx) {
  int ipc_failed = 0, rc;
  int r;
  /* A tensor's allocation is mapped whole into the worker (IPC), and the
   * kernel may read past the tensor (CUDA has no bounds): the bytes of the
   * pool block past what the daemon allocated (an earlier user's) are
   * zeroed, once per block handed out. */
  for (int i = 0; i < op->u.kernel.nargs; i++) {
    const struct dspk__karg *a = &op->u.kernel.args[i];
    struct dspk__mem *m = a->kind == DSPK__KARG_TENSOR ? op->in[a->v.tensor].mem : NULL;
    if (!m || m->tail_clean || !m->blk || m->blk->size <= m->size)
      continue;
    if ((r = DRV->memset_async(m->ptr + m->size, 0, m->blk->size - m->size, dev->stream)))
      return dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r);
    m->tail_clean = 1;
  }
  /* The worker's stream knows nothing of ours: everything enqueued so far
   * (the writes of the kernel's inputs among it) must be done first. */
  if ((r = DRV->stream_sync(dev->stream)) != 0)
    return dspk__gpurt_err(dev, ctx, "cuStreamSynchronize", r);
  /* The worker's context keeps __shared__ memory, registers and local
   * memory from one kernel to the next, and nothing clears them: another
   * user's kernel runs in a fresh worker (a new context), never after this
   * user's in the same one.  That costs a worker's start (a process and a
   * context) at each change of user, and nothing while one user's kernels
   * follow each other. */
  if (dev->worker_pid > 0 && dev->worker_uid != (ctx ? ctx->owner : 0))
    reap(dev, NULL, 0);
  rc = attempt(dev, op, cubin, cubin_len, !dev->ipc_broken, &ipc_failed, ctx);
  if (ipc_failed) {
    dev->ipc_broken = 1;
    rc = attempt(dev, op, cubin, cubin_len, 0, &ipc_failed, ctx);
  }
  return rc;
}
